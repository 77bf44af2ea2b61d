"""The runtime's front: load-time state building, and the decode loop's public API.

``Runtime`` builds one :class:`specc.runtime.state.SpecRuntimeState` per candidate state at load
(captured on CUDA, compiled with inductor when the manifest asks), and drives the loop: admit
queued requests into free rows and prefill them (:mod:`specc.runtime.admission`), else run one
decode step (:mod:`specc.runtime.step`: the step as data); then report each request's new tokens
and finish the ones that ended.

Cache geometry: every cache has ``cache_len = max_model_len + slack`` slots per row, slack the
largest :attr:`StateSpec.cache_slack` (κ + 2 for a chain: κ + 1 verify rows and the trash slot
``cache_len - 1``; a tree's W rows and its drafter's scratch); when the target's config allows fewer
slots, the runtime's usable ``max_model_len`` shrinks to ``cache_len - slack`` (reported).

States are keyed by ``(batch bucket, κ)`` and all built at load; the schedule policy
(:mod:`specc.runtime.schedule`) picks one per step (a pointer swap) and learns from each step's
accepted drafts.

Two front ends share one loop: the incremental API (``reset`` → ``submit`` … → ``step`` → token
events, ``cancel``), which a server drives from its engine thread while requests arrive and leave,
and ``generate``, a batch call on top of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from specc.errors import ArtifactError, PromptError
from specc.runtime import step as S
from specc.runtime.admission import Admission, Queued
from specc.runtime.batch import DecodeBatch, RowState, host_to_device
from specc.runtime.metrics import SpecMetrics, make_timer
from specc.runtime.request import Request, RequestCounters, RequestOutput, check_prompts
from specc.runtime.schedule import Schedule, make_schedule
from specc.runtime.step import StepIO
from specc.runtime.state import SpecRuntimeState, StateContext, StateSpec, build_state


@dataclass
class TokenEvent:
    """What one :meth:`Runtime.step` did for one request.

    Attributes:
        handle: the request's handle (:meth:`Runtime.submit`).
        token_ids: tokens emitted to it since its previous event (accepted drafts and bonus, cut at
            EOS / stop / limits); may be empty in its last event.
        output: the finished request (its last event), else None.
        counters: the request's running speculation counters (vLLM's names).
        payload: a prefill-only request's exported disaggregation payload
            (:class:`specc.runtime.disagg.Prefilled`), else None.
    """

    handle: int
    token_ids: List[int]
    output: Optional[RequestOutput] = None
    counters: Optional[RequestCounters] = None
    payload: Any = None

    @property
    def finished(self) -> bool:
        return self.output is not None


def methods_frozen(runtime: "Runtime") -> bool:
    """Whether the runtime's method reads the target's KV instead of keeping its own (frozen-KV MTP)."""
    from specc import methods

    return methods.get(runtime.states[0].spec.method).frozen_kv


class Runtime:
    """Decodes requests with a set of runtime states over one target model and one drafter.

    Args:
        target: ``specc.models.llama.LlamaModel`` (weights loaded; its cache is set up here).
        tokenizer: ``specc.models.tokenizer.Tokenizer`` or None (then no stop strings / text).
        drafter: ``specc.methods.base.Drafter`` or None (κ = 0 states only).
        specs: the states' constants (``StateSpec``; from an artifact's manifest or built directly).
        state_kernels: optional ``{state name: {role: kernel variant name}}`` (an artifact's
            specialized kernels, modules in ``kernel_modules``).
        state_programs: optional ``{state name: ((stage, fn, args), ...)}``, the stage programs the
            execution plan lists (``specc.ir.StateIR.programs``); a state without them takes its
            programs from the one table (``specc.compiler.programs.state_programs``).
        trees: optional ``{state name: compiled static tree}`` (the manifest's ``trees``); compiled
            from ``spec.tree_choices`` when absent.
        max_model_len: tokens per request (prompt + output) at most.
        device: torch device of the models.
        kernel_backend: ``specc.kernels`` backend. use_cuda_graphs: capture each state's verify
            program on CUDA. compile_backend: ``eager`` or ``inductor`` (``torch.compile`` each state's
            verify program at load, the CPU counterpart of capture).
        schedule: the manifest's ``runtime.schedule`` (``None``: static, the bucket's one κ).
        synthetic_rates: conditional acceptance rates of the synthetic rule (states built without an
            artifact; generated modules carry their own).
        seed: seed of the runtime's generator (re-seeded at each ``generate``), which requests
            without their own ``seed`` share.
        eos_token_ids: override of the tokenizer's / config's EOS ids.
        prefill_chunk: prompt columns per prefill forward (times rows in use: about this many tokens).
        timing: how the metrics time each stage (:func:`specc.runtime.metrics.make_timer`): ``"none"``
            (host wall clock, no synchronisation; the default), ``"sync"`` (``torch.cuda.synchronize``
            around each stage) or ``"events"`` (CUDA events, read when they have completed).
        kernel_modules: an artifact's specialized kernel modules by variant name.
    Concerns of ``__init__`` (load): the cache geometry, the EOS set, the shared state context, one
    runtime state per spec (captured on CUDA, compiled with inductor when asked), the schedule.

    Half precision on the CPU: the target is switched to its row-invariant forward
    (``LlamaModel.set_row_invariant``, and off ``set_fast_attention``), whatever it was set to before.

    Raises:
        ArtifactError: a state the runtime cannot run, two states with one ``(bucket, κ)``, or a state
            the schedule can select that is missing.
    """

    def __init__(self, target, tokenizer, drafter, specs: Sequence[StateSpec], *,
                 state_kernels: Optional[Dict[str, Dict[str, str]]] = None,
                 state_programs: Optional[Dict[str, Sequence[Tuple[str, str, Tuple[Any, ...]]]]] = None,
                 trees: Optional[Dict[str, Any]] = None, max_model_len: Optional[int] = None,
                 device: Optional[torch.device] = None, kernel_backend: str = "auto",
                 use_cuda_graphs: bool = False, seed: int = 0,
                 eos_token_ids: Optional[Sequence[int]] = None, prefill_chunk: int = 512,
                 kernel_modules: Optional[dict] = None, schedule: Optional[dict] = None,
                 synthetic_rates: Optional[Sequence[float]] = None, compile_backend: str = "eager",
                 timing: str = "none") -> None:
        if not specs:
            raise ValueError("Runtime needs at least one state")
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        cfg = target.config
        self.device = torch.device(device) if device is not None else target.norm.weight.device
        self.vocab_size = int(cfg.vocab_size)
        k_max = max(s.num_steps for s in specs)
        slack = max(s.cache_slack for s in specs)
        want = int(max_model_len or cfg.max_model_len)
        self.cache_len = min(int(cfg.max_model_len), want + slack)
        self.max_model_len = self.cache_len - slack
        self.trash_slot = self.cache_len - 1
        self.max_rows = max(s.batch_size for s in specs)
        self.k_max = k_max  # draft positions of per-request / run counters (κ of the deepest state)
        self.seed = int(seed)
        self.prefill_chunk = int(prefill_chunk)
        if eos_token_ids is None:
            eos = list(tokenizer.eos_token_ids) if tokenizer is not None else []
            eos += [e for e in cfg.eos_token_ids if e not in eos]
        else:
            eos = list(eos_token_ids)
        self.eos_token_ids = frozenset(int(e) for e in eos)

        target.setup_cache(self.max_rows, self.cache_len)
        if self.device.type == "cpu" and target.norm.weight.dtype != torch.float32:
            # half precision on the CPU: every row computed as a one-token step computes it, so
            # speculative greedy equals plain greedy at this dtype (never the bulk SDPA attention)
            target.set_fast_attention(False).set_row_invariant()
        hidden_layers = tuple(getattr(drafter, "hidden_layers", ()) or ())
        if drafter is not None:
            drafter.setup(self.max_rows, self.cache_len, self.device)
        #: bytes of KV cache the drafter allocated (reported at load; 0 for frozen-KV MTP, which reads the target's)
        self.draft_kv_bytes = int(getattr(drafter, "draft_kv_bytes", lambda: 0)() or 0) if drafter is not None else 0
        self.ctx = StateContext(
            target=target, drafter=drafter, device=self.device, vocab_size=self.vocab_size,
            max_seq_len=self.cache_len, kernel_backend=kernel_backend, hidden_layers=hidden_layers,
            use_cuda_graphs=use_cuda_graphs, kernel_modules=dict(kernel_modules or {}),
            compile_backend=compile_backend)
        by_key: Dict[Tuple[int, int], SpecRuntimeState] = {}
        for spec in specs:
            st = build_state(spec, self.ctx, synthetic_rates, kernels=(state_kernels or {}).get(spec.name),
                             tree=(trees or {}).get(spec.name), programs=(state_programs or {}).get(spec.name))
            if st.spec.key in by_key:
                raise ArtifactError(f"states {by_key[st.spec.key].spec.name} and {st.spec.name} share bucket "
                                    f"{st.spec.batch_size} and κ = {st.spec.num_steps}; re-run specc compile")
            by_key[st.spec.key] = st
        self.by_key = dict(sorted(by_key.items()))
        self.states: List[SpecRuntimeState] = list(self.by_key.values())
        self.schedule: Schedule = make_schedule(schedule, self.by_key.keys())
        self.num_captured = sum(1 for s in self.states if s.capture())
        self.num_compiled = sum(1 for s in self.states if s.compile())
        #: the previous step's confidences per row (probabilistic drafts' budget; vLLM starts a request at 1.0)
        self.stale_confidence = torch.ones(self.max_rows, max(s.width - 1 for s in specs), dtype=torch.float32,
                                           device=self.device)
        self._active_key: Optional[Tuple[int, int]] = None
        make_timer(timing, self.device)  # refuse an unknown kind at load
        self.timing = timing
        #: the step's host buffers: one host-to-device copy in, one device-to-host copy out per step
        self.io = StepIO(self.max_rows, max(s.width for s in specs), self.device)
        self.metrics = self.new_metrics()
        self.lora = None  # specc.runtime.lora.LoraSet once adapters are attached (attach_lora)
        self.plan_hash: Optional[str] = None  # the manifest runtime section's hash (disaggregation checks)
        self.batch: Optional[DecodeBatch] = None
        #: how the target runs (dtype, compile backend, why), set by the loader for its load report
        self.settings: Dict[str, str] = {"dtype": str(target.norm.weight.dtype).replace("torch.", ""),
                                         "compile_backend": compile_backend, "why": ""}

    def attach_lora(self, lora) -> None:
        """Serve LoRA adapters (:class:`specc.runtime.lora.LoraSet`, already hooked into the target):
        requests name theirs in ``Request.adapter``; admission keeps at most
        ``lora.max_loras_per_batch`` distinct adapters among the live rows.

        Raises:
            ArtifactError: a state was captured as a CUDA graph (a graph replays the deltas of the
                rows it was captured with; serve LoRA with ``deploy.cuda_graphs: false``)."""
        if lora is not None and self.num_captured:
            raise ArtifactError("LoRA adapters cannot run with CUDA-graph-captured states (a graph would replay "
                                "the adapter grouping it was captured with); set deploy.cuda_graphs=false")
        self.lora = lora

    def new_metrics(self) -> SpecMetrics:
        """Empty run metrics whose ``num_accepted_tokens_per_pos`` has one zero per draft position
        (κ_max entries), as vLLM's ``SpecDecodingStats`` (`vllm/v1/spec_decode/metrics.py`)."""
        return SpecMetrics(num_accepted_tokens_per_pos=[0] * self.k_max, num_draft_tokens_per_pos=[0] * self.k_max,
                           draft_kv_bytes=self.draft_kv_bytes, timer=make_timer(self.timing, self.device))

    # ------------------------------------------------------------------ routing
    def route(self, num_rows: int, num_requests: Optional[int] = None) -> SpecRuntimeState:
        """The state the schedule selects for a batch using rows ``0..num_rows-1`` with
        ``num_requests`` live requests (default ``num_rows``)."""
        return self.by_key[self.schedule.select(num_requests or num_rows, num_rows)]

    def describe(self) -> List[dict]:
        """One line of facts per state: name, bucket, κ, rule, static-buffer bytes, how its verify program
        runs (``program``), whether its verify + accept is a captured CUDA graph, the seconds its capture took and the device memory the
        capture took (its graph pool, and the peak of the tensors allocated in it), and on a CPU with a native
        target the ``qgemm.c`` tiles a verify of every row of the state runs (``verify_tiles``:
        ``"product/isa rows x streams"`` → row chunks over the forward's products, for ``B·W`` rows; a step
        of fewer rows, as ragged verifies are, runs the tiles of its own row count)."""
        from specc.models.llama import forward_tiles, layer_program

        eager = f"eager, decoder layers {layer_program(self.target)}"
        cpu = self.device.type == "cpu"

        def tiles(s):
            counts = forward_tiles(self.target, s.spec.batch_size * s.spec.num_draft_tokens) if cpu else {}
            return {t.label: n for t, n in sorted(counts.items())}
        return [{"name": s.spec.name, "batch_size": s.spec.batch_size, "num_steps": s.spec.num_steps,
                 "verify_rule": s.spec.verify_rule, "buffer_bytes": s.inputs.nbytes(), "captured": s.captured,
                 "program": "cuda graph" if s.captured else "inductor" if s.compiled else eager,
                 "compiled": s.compiled, "capture_s": round(s.capture_s, 4), "graph_breaks": s.graph_breaks,
                 "graph_pool_bytes": s.graph_pool_bytes, "graph_peak_bytes": s.graph_peak_bytes,
                 "verify_tiles": tiles(s)} for s in self.states]

    def load_report(self) -> str:
        """One line for the log at load: states, schedule, static-buffer memory, captured graphs."""
        from specc.console import plural

        mib = sum(s.inputs.nbytes() for s in self.states) / (1 << 20)
        cap = sum(s.capture_s for s in self.states)
        if self.num_captured:
            pool = sum(s.graph_pool_bytes for s in self.states) / (1 << 20)
            graphs = f"{plural(self.num_captured, 'CUDA graph')} captured in {cap:.2f}s, graph pools {pool:.1f} MiB"
        elif self.num_compiled:
            breaks = sum(s.graph_breaks for s in self.states)
            graphs = (f"{plural(self.num_compiled, 'verify program')} compiled with inductor in {cap:.1f}s "
                      f"({plural(breaks, 'graph break')})")
        else:
            graphs = "eager verify programs"
        why = f" ({self.settings['why']})" if self.settings.get("why") else ""
        draft = ""
        from specc.models.llama import LlamaModel, kv_bytes, resident_bytes, weights_report

        if self.drafter is not None:
            draft = (f"; draft KV {self.draft_kv_bytes / (1 << 20):.1f} MiB" if self.draft_kv_bytes else
                     "; draft KV: none allocated" + (" (it reads the target's)" if methods_frozen(self) else ""))
            if isinstance(getattr(self.drafter, "model", None), LlamaModel):
                draft += f"; draft model {weights_report(self.drafter.model)}"

        kv = kv_bytes(self.target) / (1 << 20)
        rss = resident_bytes()
        mem = (f"; target {weights_report(self.target)}; target KV {kv:.1f} MiB reserved "
               f"({self.max_rows} rows x {self.cache_len} slots{', committed as slots are written' if self.device.type == 'cpu' else ''})"
               + (f"; resident memory now {rss / (1 << 20):.0f} MiB" if rss else ""))
        return (f"{plural(len(self.states), 'state')} under schedule {self.schedule.kind}, static buffers {mib:.1f} MiB, "
                f"{graphs}; target {self.settings['dtype']}{why}{draft}{mem}")

    def states_of(self, names: Iterable[str]) -> List[SpecRuntimeState]:
        """The states named ``names`` (in that order)."""
        by_name = {s.spec.name: s for s in self.states}
        return [by_name[n] for n in names]

    def sync(self) -> None:
        """Wait for the device (CUDA) before reading the clock; nothing on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def generate(self, requests: Sequence[Request], batch_size: Optional[int] = None,
                 on_finish: Optional[Callable[[RequestOutput], None]] = None) -> List[RequestOutput]:
        """Decode every request; returns outputs in the order of ``requests``. A batch front end over
        the incremental API (:meth:`reset`, :meth:`submit`, :meth:`step`). Concerns: validation of
        every request first, the loop until no work is left, the outputs in request order, wall time.

        Args:
            requests: prompts (token ids) with their sampling parameters.
            batch_size: live requests at most (default and cap: the largest bucket).
            on_finish: called with each output as its request finishes (progress bars).
        Raises:
            PromptError: an empty prompt, one that leaves no room under ``max_model_len``, bad
                sampling parameters, or temperature > 0 with a greedy-rule speculative state.
        """
        check_prompts(requests, self.max_model_len, self.vocab_size)
        for i, r in enumerate(requests):
            self._check_rule(r, i)
        self.reset(batch_size)
        for i, r in enumerate(requests):
            self.submit(r, handle=i, checked=True)
        outputs: List[Optional[RequestOutput]] = [None] * len(requests)
        t_start = time.perf_counter()
        try:
            while self.has_work():
                for ev in self.step():
                    if ev.output is not None:
                        outputs[ev.handle] = ev.output
                        if on_finish is not None:
                            on_finish(ev.output)
        finally:  # an interrupted run still reports the time of what it finished
            self.metrics.timer.flush()  # CUDA-event timings still pending (nothing for the default timer)
            self.metrics.wall_time_s += time.perf_counter() - t_start
        return outputs  # type: ignore[return-value]

    # ------------------------------------------------------------------ incremental API
    def check_request(self, request: Request, index: int = 0) -> None:
        """Validate one request as :meth:`generate` does (prompt length and ids, sampling
        parameters, the verify rule's sampling support, a known LoRA adapter).

        Raises:
            PromptError: naming the request (``request_id`` or ``index``) and the bad field.
        """
        check_prompts([request], self.max_model_len, self.vocab_size)
        self._check_rule(request, index)

    def _check_rule(self, r: Request, i: int) -> None:
        # a greedy-rule state samples a temperature > 0 row by the standard rule (stages.accept_greedy),
        # exact for one-hot q; a tree's probabilistic drafts are kept by score or without the child
        # ranks the tree rule needs (specc.compiler.programs refuses them under verify.rule=standard)
        if r.params.temperature > 0 and any(s.greedy_rule and s.spec.is_tree and s.spec.draft_sampling == "probabilistic"
                                            and s.spec.num_steps > 0 for s in self.states):
            raise PromptError(
                f"prompt {r.request_id or i}: temperature {r.params.temperature}: this artifact verifies a draft "
                f"tree greedily from probabilistic drafts (verify.draft_sampling=probabilistic), which cannot be "
                f"sampled exactly; pass temperature 0 or compile the plan with verify.draft_sampling=greedy")
        if r.adapter is not None and (self.lora is None or r.adapter not in self.lora.names):
            known = ", ".join(self.lora.names) if self.lora is not None else "none loaded"
            raise PromptError(f"prompt {r.request_id or i}: LoRA adapter {r.adapter!r} is not loaded ({known}); "
                              f"list it in deploy.lora.adapters")

    def reset(self, batch_size: Optional[int] = None, isolate_failures: bool = False) -> None:
        """Start a new decoding session: an empty batch and queue, the shared generator re-seeded.
        Concerns: the session's batch, queue (:class:`Admission`), generator and failure policy.

        Args:
            batch_size: live requests at most (default and cap: the largest bucket).
            isolate_failures: when a prefill or decode step raises, find the request(s) it fails
                for by re-running the step per request, finish those alone with ``finish_reason
                "error"`` and keep decoding the others (a server); False re-raises (``generate``).
        Raises:
            PromptError: ``batch_size < 1``.
        """
        if batch_size is not None and int(batch_size) < 1:
            raise PromptError(f"batch size must be >= 1 (None = the largest bucket), got {batch_size}")
        limit = min(int(batch_size or self.max_rows), self.max_rows)  # the CLI refuses more than the cap
        self.batch = DecodeBatch(self.max_rows, self.cache_len, self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.seed)
        self.admission = Admission(self, limit)
        self._next_handle = 0
        self.isolate_failures = bool(isolate_failures)

    def submit(self, request: Request, handle: Optional[int] = None, *, prefilled: Any = None,
               prefill_only: bool = False, checked: bool = False) -> int:
        """Queue a request; it is admitted into a free row by a later :meth:`step` (FIFO, within the
        LoRA adapter limit). Starts a session (:meth:`reset`) when none is open. The one public way a
        request enters a runtime, a disaggregated prefill's payload included (``prefilled``: the decode
        role of ``specc serve``). Concerns: validation, the handle, the queue.

        Args:
            request: the prompt and its sampling parameters.
            handle: the request's id in token events (default: the next free integer).
            prefilled: a disaggregated prefill's payload (:class:`specc.runtime.disagg.Prefilled`):
                admission installs its KV and seed instead of running the prompt.
            prefill_only: run the prompt only and finish with ``finish_reason "prefilled"``, the
                event carrying the exported payload (the prefill role of disaggregation).
            checked: the request was validated already (:meth:`check_request`).
        Returns: the handle.
        Raises:
            PromptError: the request is invalid (see :meth:`check_request`).
        """
        if not checked:
            self.check_request(request, self._next_handle if getattr(self, "batch", None) is not None else 0)
        if getattr(self, "batch", None) is None:
            self.reset()
        h = self._next_handle if handle is None else int(handle)
        self._next_handle = max(self._next_handle, h + 1)
        self.admission.queue.append(Queued(h, request, prefilled, prefill_only))
        return h

    def has_work(self) -> bool:
        """Requests are queued or decoding."""
        return getattr(self, "batch", None) is not None and bool(self.admission.queue or self.batch.live_rows())

    @property
    def num_waiting(self) -> int:
        """Queued requests not yet admitted."""
        return len(self.admission.queue) if getattr(self, "batch", None) is not None else 0

    @property
    def num_running(self) -> int:
        """Requests holding a row."""
        return len(self.batch.live_rows()) if getattr(self, "batch", None) is not None else 0

    @property
    def active_state(self) -> Optional[SpecRuntimeState]:
        """The state the last decode step ran (None before the first)."""
        return self.by_key.get(self._active_key) if self._active_key is not None else None

    def cancel(self, handle: int) -> Optional[RequestOutput]:
        """Drop a queued request or free the row of a decoding one (a client went away). Returns its
        output with ``finish_reason "abort"`` (tokens emitted so far), or None for an unknown or
        already finished handle. Call between steps (the engine loop's thread). Concerns: the queue,
        the row's release, the aborted output."""
        if getattr(self, "batch", None) is None:
            return None
        for item in list(self.admission.queue):
            if item.handle == handle:
                self.admission.queue.remove(item)
                return RequestOutput(request=item.request, token_ids=[], text="", finish_reason="abort",
                                     counters=RequestCounters.for_steps(self.k_max))
        for row in self.batch.live_rows():
            st = self.batch.rows[row]
            if st.index == handle:
                st.finish_reason = st.finish_reason or "abort"
                out = self._finish(st)
                self.batch.release(row)
                self._release_drafter(row)
                return out
        return None

    @torch.inference_mode()
    def step(self) -> List[TokenEvent]:
        """One iteration of the decode loop: admit queued requests into free rows and prefill them
        (or install their disaggregated payloads), else run one decode step over the live rows; then
        report, per request that advanced, its new tokens, and finish the requests that ended.
        Concerns: which phase runs (admission and prefill, or a decode step), token events.

        Returns: :class:`TokenEvent` per request with new tokens or finished, in row order.
        Raises: whatever a prefill or decode step raises, unless the session isolates failures
            (:meth:`reset`).
        """
        batch = self.batch
        new_rows = self.admission.admit_queued(batch)
        if new_rows:
            self.stale_confidence[new_rows] = 1.0  # vLLM: a new request starts with confidence 1.0
            with self.metrics.stage("prefill"):
                self.admission.prefill_new(batch, new_rows)
        elif batch.live_rows():
            self._decode_step(batch)
        return self._collect(batch)

    # ------------------------------------------------------------------ loop control flow
    def guard(self, st: RowState, fn: Callable[[], Any]) -> bool:
        """Run ``fn``; on an exception finish ``st`` with ``finish_reason "error"`` (its message kept).
        Returns whether ``fn`` succeeded."""
        try:
            fn()
            return True
        except Exception as exc:  # one request's failure must not end the others
            st.finish_reason = "error"
            st.error = f"{type(exc).__name__}: {exc}"
            return False

    def _decode_step(self, batch: DecodeBatch) -> None:
        """One decode step (:meth:`_step`) over the live rows. When it raises and the session isolates
        failures, the rows' emitted-but-unappended tokens are rolled back and the step is re-run for
        each live request alone (the others parked), so only the request(s) it fails for finish
        with ``"error"``. KV is written by position, so a failed step leaves nothing to undo.
        Concerns: failure isolation only (the step itself is :func:`specc.runtime.step.decode_step`)."""
        live = [r for r in batch.live_rows() if batch.rows[r].finish_reason is None]
        marks = {r: (len(batch.rows[r].generated), batch.host_seq_lens[r], batch.rows[r].finish_reason,
                     batch.rows[r].stop_text) for r in live}
        try:
            S.decode_step(self, batch)
            return
        except Exception:
            if not self.isolate_failures:
                raise
        for r, (n, seq, reason, stop) in marks.items():  # tokens emitted but not appended: undo
            st = batch.rows[r]
            if batch.host_seq_lens[r] == seq and len(st.generated) > n:
                del st.generated[n:]
                st.finish_reason, st.stop_text = reason, stop
        for r in live:
            st = batch.rows[r]
            if st.finish_reason is not None:
                continue
            parked = {x: batch.rows[x] for x in batch.live_rows() if x != r}
            for x in parked:
                batch.rows[x] = None
                batch.set_active(x, False)
            n, seq = len(st.generated), batch.host_seq_lens[r]
            try:
                ok = self.guard(st, lambda: S.decode_step(self, batch))
                if not ok and batch.host_seq_lens[r] == seq:
                    del st.generated[n:]
            finally:
                for x, other in parked.items():
                    batch.rows[x] = other
                    batch.set_active(x, True)

    def _collect(self, batch: DecodeBatch) -> List[TokenEvent]:
        """Token events of the rows that advanced; finished rows are released (in row order).
        Concerns: the events, the release of finished rows and their LoRA assignment."""
        events: List[TokenEvent] = []
        for row in batch.live_rows():
            st = batch.rows[row]
            new = st.generated[st.num_reported:]
            st.num_reported = len(st.generated)
            if st.finish_reason is not None:
                out = self._finish(st)
                payload, st.payload = st.payload, None
                batch.release(row)
                self._release_drafter(row)
                if self.lora is not None:
                    self.lora.assign_row(row, None)
                events.append(TokenEvent(st.index, list(new), out, st.counters, payload))
            elif new:
                events.append(TokenEvent(st.index, list(new), None, st.counters))
        return events

    # ------------------------------------------------------------------ helpers
    def switch_to(self, key: Tuple[int, int]) -> None:
        """Make ``key`` the active state, counting a κ switch (``num_kappa_switches``)."""
        if self._active_key is not None and key[1] != self._active_key[1]:
            self.metrics.num_kappa_switches += 1
        self._active_key = key

    def fill_noise(self, batch: DecodeBatch, rows: List[int], draw, out: torch.Tensor) -> None:
        """Fill ``out[rows]`` with random draws: ``draw(generator, n) -> [n, ...]``. Requests with a
        seed draw from their own generator (reproducible whatever the batch); the others share the
        runtime's generator in one vectorized draw (reproducible for the same batch and seed)."""
        shared = [r for r in rows if batch.rows[r].generator is None]
        if shared:
            out[host_to_device(shared, torch.int64, out.device)] = draw(self.generator, len(shared))
        for r in rows:
            gen = batch.rows[r].generator
            if gen is not None:
                out[r] = draw(gen, 1)[0]

    def _release_drafter(self, row: int) -> None:
        """Tell the drafter that ``row``'s request left (``Drafter.release``; drafters without it keep
        nothing per request)."""
        release = getattr(self.drafter, "release", None)
        if release is not None:
            release(row)

    def _finish(self, st: RowState) -> RequestOutput:
        """The output of a finished row (text cut at a stop string, EOS left out of the text), counted
        into the run metrics. Concerns: the output's text, the run counters."""
        ids = list(st.generated)
        if st.stop_text is not None:
            text = st.stop_text
        elif self.tokenizer is not None:
            body = ids[:-1] if st.finish_reason == "eos" else ids
            text = self.tokenizer.decode(body)
        else:
            text = ""
        self.metrics.add_request(st.counters, len(st.request.prompt_ids), len(ids))
        return RequestOutput(request=st.request, token_ids=ids, text=text, finish_reason=st.finish_reason or "",
                             counters=st.counters, time_s=time.perf_counter() - st.start_time,
                             ttft_s=(st.first_token_time or st.start_time) - st.start_time, error=st.error)
