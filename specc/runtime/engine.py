"""The decode loop: admit requests into rows, prefill, then per step select a state (the schedule) →
draft → admit (budget) → verify → accept → emit → extend, until every request finishes.

KV is committed by position (gpt-fast, anchors A1): the verify forward of a step writes the target
KV of rows ``seq_len-1 .. seq_len-1+κ`` of each request; the accepted prefix is kept simply by
advancing ``seq_len``; rejected entries are overwritten by the next step and hidden meanwhile by the
causal-by-position mask. Padding (inactive rows, prompt padding) writes to the trash slot. A tree
state verifies W nodes at slots ``seq_len-1 .. seq_len-2+W`` (positions by depth) and its commit
stage copies the accepted path's KV to the slots of its positions, so the cache is a chain again.

Cache geometry: every cache has ``cache_len = max_model_len + slack`` slots per row, slack the
largest :attr:`StateSpec.cache_slack` (κ + 2 for a chain: κ + 1 verify rows and the trash slot
``cache_len - 1``; a tree's W rows and its drafter's scratch); when the target's config allows fewer
slots, the runtime's usable ``max_model_len`` shrinks to ``cache_len - slack`` (reported).

States are keyed by ``(batch bucket, κ)`` and all built at load; the schedule policy
(:mod:`specc.runtime.schedule`) picks one per step (a pointer swap) and learns from each step's
accepted drafts. A captured (CUDA) state verifies its static shape; an eager (CPU) state runs on the
rows in use only, trims the step to its widest verify, and runs the target forward ragged (each
request costs its own number of verify tokens), so an n-gram miss or a trimmed budget costs nothing.

Rows are the runtime's batch slots: a request keeps its row from admission to finish; the runtime
admits at most ``max(bucket)`` requests at a time and refills freed rows from the queue (continuous
batching; a refill prefill runs over the rows in use with every other row's writes sent to the trash
slot).

Two front ends share one loop: the incremental API (``reset`` → ``submit`` … → ``step`` → token
events, ``cancel``), which a server drives from its engine thread while requests arrive and leave,
and ``generate``, a batch call on top of it. An iteration of the loop admits queued requests into
free rows and prefills them (or installs a disaggregated prefill's payload), else runs one decode
step; then it reports each request's new tokens and finishes the ones that ended.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from specc import methods
from specc.errors import PromptError
from specc.kernels import process_logits
from specc.drafters.base import PrefillChunk
from specc.runtime.batch import DecodeBatch, RowState
from specc.runtime.metrics import SpecMetrics
from specc.runtime.request import Request, RequestCounters, RequestOutput, check_prompts
from specc.errors import ArtifactError
from specc.runtime.schedule import Schedule, make_schedule
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


@dataclass
class _Queued:
    handle: int
    request: Request
    prefilled: Any = None
    prefill_only: bool = False


class Runtime:
    """Decodes requests with a set of runtime states over one target model and one drafter.

    Args:
        target: ``specc.models.llama.LlamaModel`` (weights loaded; its cache is set up here).
        tokenizer: ``specc.models.tokenizer.Tokenizer`` or None (then no stop strings / text).
        drafter: ``specc.drafters.base.Drafter`` or None (κ = 0 states only).
        specs: the states' constants (``StateSpec``; from an artifact's manifest or built directly).
        state_kernels: optional ``{state name: {role: kernel variant name}}`` (an artifact's
            specialized kernels, modules in ``kernel_modules``).
        trees: optional ``{state name: compiled static tree}`` (the manifest's ``trees``); compiled
            from ``spec.tree_choices`` when absent.
        max_model_len: tokens per request (prompt + output) at most.
        device: torch device of the models.
        kernel_backend: ``specc.kernels`` backend. use_cuda_graphs: capture verify + accept on CUDA.
        schedule: the manifest's ``runtime.schedule`` (``None``: static, the bucket's one κ).
        synthetic_rates: conditional acceptance rates of the synthetic rule (states built without an
            artifact; generated modules carry their own).
        seed: seed of the runtime's generator (re-seeded at each ``generate``), which requests
            without their own ``seed`` share.
        eos_token_ids: override of the tokenizer's / config's EOS ids.
        prefill_chunk: prompt columns per prefill forward (times rows in use: about this many tokens).
        kernel_modules: an artifact's specialized kernel modules by variant name.
    Raises:
        ArtifactError: a state the runtime cannot run, two states with one ``(bucket, κ)``, or a state
            the schedule can select that is missing.
    """

    def __init__(self, target, tokenizer, drafter, specs: Sequence[StateSpec], *,
                 state_kernels: Optional[Dict[str, Dict[str, str]]] = None,
                 trees: Optional[Dict[str, Any]] = None, max_model_len: Optional[int] = None,
                 device: Optional[torch.device] = None, kernel_backend: str = "auto",
                 use_cuda_graphs: bool = False, seed: int = 0,
                 eos_token_ids: Optional[Sequence[int]] = None, prefill_chunk: int = 512,
                 kernel_modules: Optional[dict] = None, schedule: Optional[dict] = None,
                 synthetic_rates: Optional[Sequence[float]] = None) -> None:
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
        hidden_layers = tuple(getattr(drafter, "hidden_layers", ()) or ())
        if drafter is not None:
            drafter.setup(self.max_rows, self.cache_len, self.device)
        self.ctx = StateContext(
            target=target, drafter=drafter, device=self.device, vocab_size=self.vocab_size,
            max_seq_len=self.cache_len, kernel_backend=kernel_backend, hidden_layers=hidden_layers,
            use_cuda_graphs=use_cuda_graphs, kernel_modules=dict(kernel_modules or {}))
        by_key: Dict[Tuple[int, int], SpecRuntimeState] = {}
        for spec in specs:
            st = build_state(spec, self.ctx, synthetic_rates, kernels=(state_kernels or {}).get(spec.name),
                             tree=(trees or {}).get(spec.name))
            if st.spec.key in by_key:
                raise ArtifactError(f"states {by_key[st.spec.key].spec.name} and {st.spec.name} share bucket "
                                    f"{st.spec.batch_size} and κ = {st.spec.num_steps}; re-run specc compile")
            by_key[st.spec.key] = st
        self.by_key = dict(sorted(by_key.items()))
        self.states: List[SpecRuntimeState] = list(self.by_key.values())
        self.schedule: Schedule = make_schedule(schedule, self.by_key.keys())
        self.num_captured = sum(1 for s in self.states if s.capture())
        self._stale_conf = torch.ones(self.max_rows, max(s.width - 1 for s in specs), dtype=torch.float32,
                                      device=self.device)
        self._active_key: Optional[Tuple[int, int]] = None
        self.metrics = self.new_metrics()
        self.lora = None  # specc.runtime.lora.LoraSet once adapters are attached (attach_lora)
        self.plan_hash: Optional[str] = None  # the manifest runtime section's hash (disaggregation checks)
        self.batch: Optional[DecodeBatch] = None

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
        return SpecMetrics(num_accepted_tokens_per_pos=[0] * self.k_max)

    # ------------------------------------------------------------------ routing
    def route(self, num_rows: int, num_requests: Optional[int] = None) -> SpecRuntimeState:
        """The state the schedule selects for a batch using rows ``0..num_rows-1`` with
        ``num_requests`` live requests (default ``num_rows``)."""
        return self.by_key[self.schedule.select(num_requests or num_rows, num_rows)]

    def describe(self) -> List[dict]:
        """One line of facts per state: name, bucket, κ, rule, static-buffer bytes, whether its verify
        + accept is a captured CUDA graph and the seconds its capture took."""
        return [{"name": s.spec.name, "batch_size": s.spec.batch_size, "num_steps": s.spec.num_steps,
                 "verify_rule": s.spec.verify_rule, "buffer_bytes": s.bufs.nbytes(), "captured": s.captured,
                 "capture_s": round(s.capture_s, 4)} for s in self.states]

    def load_report(self) -> str:
        """One line for the log at load: states, schedule, static-buffer memory, captured graphs."""
        mib = sum(s.bufs.nbytes() for s in self.states) / (1 << 20)
        cap = sum(s.capture_s for s in self.states)
        graphs = (f"{self.num_captured} CUDA graph(s) captured in {cap:.2f}s" if self.num_captured
                  else "no CUDA graphs (eager)")
        return (f"{len(self.states)} state(s) under schedule {self.schedule.kind}, static buffers {mib:.1f} MiB, "
                f"{graphs}")

    def states_of(self, names: Iterable[str]) -> List[SpecRuntimeState]:
        """The states named ``names`` (in that order)."""
        by_name = {s.spec.name: s for s in self.states}
        return [by_name[n] for n in names]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def generate(self, requests: Sequence[Request], batch_size: Optional[int] = None,
                 on_finish: Optional[Callable[[RequestOutput], None]] = None) -> List[RequestOutput]:
        """Decode every request; returns outputs in the order of ``requests``. A batch front end over
        the incremental API (:meth:`reset`, :meth:`submit`, :meth:`step`).

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
        while self.has_work():
            for ev in self.step():
                if ev.output is not None:
                    outputs[ev.handle] = ev.output
                    if on_finish is not None:
                        on_finish(ev.output)
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
        if r.params.temperature > 0 and any(s.spec.verify_rule == "greedy" and s.spec.num_steps > 0
                                            for s in self.states):
            raise PromptError(
                f"prompt {r.request_id or i}: temperature {r.params.temperature} needs the standard verify "
                f"rule, but this artifact verifies greedily (verify.rule=greedy); pass temperature 0 or "
                f"compile the plan with verify.rule=standard")
        if r.adapter is not None and (self.lora is None or r.adapter not in self.lora.names):
            known = ", ".join(self.lora.names) if self.lora is not None else "none loaded"
            raise PromptError(f"prompt {r.request_id or i}: LoRA adapter {r.adapter!r} is not loaded ({known}); "
                              f"list it in deploy.lora.adapters")

    def reset(self, batch_size: Optional[int] = None, isolate_failures: bool = False) -> None:
        """Start a new decoding session: an empty batch and queue, the shared generator re-seeded.

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
        self._limit = min(int(batch_size or self.max_rows), self.max_rows)  # the CLI refuses more than the cap
        self.batch = DecodeBatch(self.max_rows, self.cache_len, self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.seed)
        self._queue: Deque[_Queued] = deque()
        self._next_handle = 0
        self.isolate_failures = bool(isolate_failures)

    def submit(self, request: Request, handle: Optional[int] = None, *, prefilled: Any = None,
               prefill_only: bool = False, checked: bool = False) -> int:
        """Queue a request; it is admitted into a free row by a later :meth:`step` (FIFO, within the
        LoRA adapter limit). Starts a session (:meth:`reset`) when none is open.

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
        self._queue.append(_Queued(h, request, prefilled, prefill_only))
        return h

    def has_work(self) -> bool:
        """Requests are queued or decoding."""
        return getattr(self, "batch", None) is not None and bool(self._queue or self.batch.live_rows())

    @property
    def num_waiting(self) -> int:
        """Queued requests not yet admitted."""
        return len(self._queue) if getattr(self, "batch", None) is not None else 0

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
        already finished handle. Call between steps (the engine loop's thread)."""
        if getattr(self, "batch", None) is None:
            return None
        for item in list(self._queue):
            if item.handle == handle:
                self._queue.remove(item)
                return RequestOutput(request=item.request, token_ids=[], text="", finish_reason="abort",
                                     counters=RequestCounters.for_steps(self.k_max))
        for row in self.batch.live_rows():
            st = self.batch.rows[row]
            if st.index == handle:
                st.finish_reason = st.finish_reason or "abort"
                out = self._finish(st)
                self.batch.release(row)
                return out
        return None

    @torch.inference_mode()
    def step(self) -> List[TokenEvent]:
        """One iteration of the decode loop: admit queued requests into free rows and prefill them
        (or install their disaggregated payloads), else run one decode step over the live rows; then
        report, per request that advanced, its new tokens, and finish the requests that ended.

        Returns: :class:`TokenEvent` per request with new tokens or finished, in row order.
        Raises: whatever a prefill or decode step raises, unless the session isolates failures
            (:meth:`reset`).
        """
        batch = self.batch
        new_rows = self._admit_queued(batch)
        if new_rows:
            self._stale_conf[new_rows] = 1.0  # vLLM: a new request starts with confidence 1.0
            with self.metrics.stage("prefill"):
                self._prefill_new(batch, new_rows)
        elif batch.live_rows():
            self._decode_step(batch)
        return self._collect(batch)

    # ------------------------------------------------------------------ loop control flow
    def _admit_queued(self, batch: DecodeBatch) -> List[int]:
        """Move queued requests into free rows (below the session's batch limit), FIFO; with LoRA, a
        request whose adapter would exceed ``max_loras_per_batch`` distinct adapters among the live
        rows waits and later ones that fit go first (SGLang's LoRA-aware admission)."""
        free = [r for r in batch.free_rows() if r < self._limit]
        new_rows, new_states, prompts = [], [], []
        adapters = None
        if self.lora is not None:
            adapters = {batch.rows[r].request.adapter for r in batch.live_rows()} - {None}
        skipped: List[_Queued] = []
        while free and self._queue:
            item = self._queue.popleft()
            req = item.request
            if adapters is not None and req.adapter is not None and req.adapter not in adapters:
                if len(adapters) >= self.lora.max_loras_per_batch:
                    skipped.append(item)
                    continue
                adapters.add(req.adapter)
            gen = None
            if req.params.seed is not None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(int(req.params.seed))
            row = free.pop(0)
            new_rows.append(row)
            st = RowState(index=item.handle, request=req, generator=gen, start_time=time.perf_counter(),
                          counters=RequestCounters.for_steps(self.k_max), prefill_only=item.prefill_only,
                          prefilled=item.prefilled)
            new_states.append(st)
            prompts.append(list(req.prompt_ids))
            if self.lora is not None:
                self.lora.assign_row(row, req.adapter)
        self._queue.extendleft(reversed(skipped))
        batch.assign_many(new_rows, new_states, prompts)
        return new_rows

    def _prefill_new(self, batch: DecodeBatch, new_rows: List[int]) -> None:
        """Prefill the new rows (one chunked forward over all of them), or install the ones that
        arrived with a disaggregated payload; then export the seed of prefill-only rows."""
        from specc.runtime import disagg

        local = [r for r in new_rows if batch.rows[r].prefilled is None]
        remote = [r for r in new_rows if r not in local]
        if local:
            try:
                self._prefill(batch, local)
            except Exception:
                if not self.isolate_failures:
                    raise
                for r in local:  # one at a time from a clean row: a failing prompt fails alone
                    self._restart_row(batch, r)
                    self._guard(batch.rows[r], lambda r=r: self._prefill(batch, [r]))
        for r in remote:
            st = batch.rows[r]
            payload, st.prefilled = st.prefilled, None
            if self.isolate_failures:
                self._guard(st, lambda: disagg.install(self, batch, r, payload))
            else:
                disagg.install(self, batch, r, payload)
        for r in local:
            st = batch.rows[r]
            if st.prefill_only and st.finish_reason != "error":
                st.payload = disagg.export(self, batch, r)
                st.finish_reason = "prefilled"

    def _restart_row(self, batch: DecodeBatch, row: int) -> None:
        """Put a row back to its just-admitted state (prompt only, no output, fresh seeded generator)."""
        st = batch.rows[row]
        st.generated.clear()
        st.finish_reason, st.stop_text, st.first_token_time = None, None, 0.0
        if st.request.params.seed is not None:
            st.generator = torch.Generator(device=self.device)
            st.generator.manual_seed(int(st.request.params.seed))
        batch.assign_many([row], [st], [list(st.request.prompt_ids)])

    def _guard(self, st: RowState, fn: Callable[[], Any]) -> bool:
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
        with ``"error"``. KV is written by position, so a failed step leaves nothing to undo."""
        live = [r for r in batch.live_rows() if batch.rows[r].finish_reason is None]
        marks = {r: (len(batch.rows[r].generated), batch.host_seq_lens[r], batch.rows[r].finish_reason,
                     batch.rows[r].stop_text) for r in live}
        try:
            self._step(batch)
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
                batch.active[x] = False
            n, seq = len(st.generated), batch.host_seq_lens[r]
            try:
                ok = self._guard(st, lambda: self._step(batch))
                if not ok and batch.host_seq_lens[r] == seq:
                    del st.generated[n:]
            finally:
                for x, other in parked.items():
                    batch.rows[x] = other
                    batch.active[x] = True

    def _collect(self, batch: DecodeBatch) -> List[TokenEvent]:
        """Token events of the rows that advanced; finished rows are released (in row order)."""
        events: List[TokenEvent] = []
        for row in batch.live_rows():
            st = batch.rows[row]
            new = st.generated[st.num_reported:]
            st.num_reported = len(st.generated)
            if st.finish_reason is not None:
                out = self._finish(st)
                payload, st.payload = st.payload, None
                batch.release(row)
                if self.lora is not None:
                    self.lora.assign_row(row, None)
                events.append(TokenEvent(st.index, list(new), out, st.counters, payload))
            elif new:
                events.append(TokenEvent(st.index, list(new), None, st.counters))
        return events

    # ------------------------------------------------------------------ prefill
    def _prefill(self, batch: DecodeBatch, new_rows: List[int]) -> None:
        """Target prefill of the new rows' prompts (chunked, over those rows only: the other live
        rows cost nothing), the first token, the drafter's prefill."""
        dev = self.device
        rows_t = torch.tensor(new_rows, dtype=torch.int64, device=dev)  # [R] cache rows
        R = len(new_rows)
        lens = [batch.host_seq_lens[r] for r in new_rows]
        width = max(lens)
        ids = batch.tokens[rows_t, :width].clone()  # [R, P]
        positions = torch.arange(width, device=dev).expand(R, width).contiguous()  # [R, P]
        real = positions < torch.tensor(lens, device=dev).view(R, 1)
        slots = torch.where(real, positions, torch.full_like(positions, self.trash_slot))
        last_idx = torch.tensor(lens, dtype=torch.int64, device=dev) - 1  # [R]
        last_logits = torch.zeros(R, self.vocab_size, dtype=torch.float32, device=dev)
        hidden_parts: List[List[torch.Tensor]] = []
        chunk = max(16, self.prefill_chunk // R)
        for c0 in range(0, width, chunk):
            c1 = min(width, c0 + chunk)
            at = (last_idx - c0).clamp(0, c1 - c0 - 1).view(R, 1)  # [R, 1]
            real_here = (last_idx + 1 - c0).clamp(0, c1 - c0)  # [R] prompt tokens of each row in this chunk
            logits, hidden = self.target.forward(ids[:, c0:c1], positions[:, c0:c1], slots[:, c0:c1], None,
                                                 hidden_layers=self.ctx.hidden_layers, logits_at=at, rows=rows_t,
                                                 num_tokens=real_here if dev.type == "cpu" else None)
            here = (last_idx >= c0) & (last_idx < c1)  # [R]
            last_logits = torch.where(here.view(-1, 1), logits[:, 0], last_logits)
            hidden_parts.append(list(hidden))
        # first token: argmax_v p(v) / Exp(1) noise (exponential race), one-hot p for greedy rows
        probs = process_logits(last_logits.view(R, 1, -1), batch.temperature[rows_t], batch.top_k[rows_t],
                               batch.top_p[rows_t])[:, 0]  # [R, V]
        noise = torch.ones(batch.max_rows, self.vocab_size, dtype=torch.float32, device=dev)
        self._fill_noise(batch, new_rows, lambda gen, n: self._exp_noise(gen, n * self.vocab_size).view(n, -1), noise)
        first = torch.div(probs, noise[rows_t]).argmax(dim=-1).tolist()  # [R]
        batch.append_many(new_rows, [self._emit(batch, r, [first[i]]) for i, r in enumerate(new_rows)])
        if self.drafter is not None:
            hidden = [torch.cat([part[i] for part in hidden_parts], dim=1) for i in range(len(self.ctx.hidden_layers))]
            self._drafter_prefill(batch, new_rows, ids, positions, slots, hidden)
            keep = bool(hidden) and methods.get(self.states[0].spec.method).seed == "target_hidden"
            for i, r in enumerate(new_rows):  # kept for a target_hidden disaggregation seed (disagg.export)
                if keep and batch.rows[r].prefill_only:
                    batch.rows[r].prompt_hidden = [h[i, :lens[i]].clone() for h in hidden]

    def _drafter_prefill(self, batch: DecodeBatch, new_rows: List[int], ids, positions, slots, hidden) -> None:
        """The drafter's prefill of the new rows: compact (``PrefillChunk.row_index``) when the drafter
        takes it, else scattered into the layout of rows ``0..n-1`` with the other rows masked out."""
        dev = self.device
        rows_t = torch.tensor(new_rows, dtype=torch.int64, device=dev)
        if getattr(self.drafter, "prefill_row_index", False):
            n = max(new_rows) + 1
            view = batch.view(n, torch.zeros(n, dtype=torch.int64, device=dev), self.trash_slot)
            self.drafter.prefill(view, PrefillChunk(input_ids=ids, positions=positions, cache_slots=slots,
                                                    rows=torch.ones(len(new_rows), dtype=torch.bool, device=dev),
                                                    target_hidden=hidden, row_index=rows_t))
            return
        n = max(max(new_rows) + 1, batch.num_rows_in_use())
        width = ids.shape[1]

        def full(x, fill):
            out = torch.full((n,) + tuple(x.shape[1:]), fill, dtype=x.dtype, device=dev)
            out[rows_t] = x
            return out

        mask = torch.zeros(n, dtype=torch.bool, device=dev)
        mask[rows_t] = True
        view = batch.view(n, torch.zeros(n, dtype=torch.int64, device=dev), self.trash_slot)
        self.drafter.prefill(view, PrefillChunk(
            input_ids=full(ids, 0), positions=torch.arange(width, device=dev).expand(n, width).contiguous(),
            cache_slots=full(slots, self.trash_slot), rows=mask, target_hidden=[full(h, 0.0) for h in hidden]))

    # ------------------------------------------------------------------ one decode step
    def _step(self, batch: DecodeBatch) -> None:
        """One decode step: the schedule's state, then draft → admit → verify → accept → emit → extend."""
        live_rows = [r for r in batch.live_rows() if batch.rows[r].finish_reason is None]
        rows = batch.num_rows_in_use()
        key = self.schedule.select(len(live_rows), rows)
        state = self.by_key[key]
        self._switch_to(key)
        sync = self._sync if self.device.type == "cuda" else None
        live = self._prepare(batch, state, rows)
        with self.metrics.stage("draft", sync):
            state.draft()
        self._admit(state, live)
        if state.captured:
            with self.metrics.stage("verify", sync):
                result = state.verify_accept()
        else:
            with self.metrics.stage("verify", sync):
                state.programs.verify(state.ctx, state.cur)
            with self.metrics.stage("accept", sync):
                state.programs.accept(state.ctx, state.cur)
                result = state.cur.result
            with self.metrics.stage("commit", sync):
                state.programs.commit(state.ctx, state.cur)
        with self.metrics.stage("emit"):
            accepted = self._emit_step(batch, state, result, live)
        with self.metrics.stage("extend", sync):
            state.extend()
        self.schedule.observe(key[0], accepted)
        self.metrics.record_step(key[1], len(live_rows), sum(accepted))

    def _switch_to(self, key: Tuple[int, int]) -> None:
        if self._active_key is not None and key[1] != self._active_key[1]:
            self.metrics.num_kappa_switches += 1
        self._active_key = key

    def _prepare(self, batch: DecodeBatch, state: SpecRuntimeState, rows: int) -> List[bool]:
        """Fill the state's step inputs for rows ``0..n-1`` (eager: the rows in use; captured: the whole
        bucket): per-row draft caps, the pending token, positions and KV slots, sampling parameters
        and randomness. Returns which of the n rows hold a live request."""
        spec = state.spec
        bufs = state.begin(rows)
        n, K, dev = bufs.input_ids.shape[0], spec.num_steps, self.device  # K: κ, the deepest draft
        W = bufs.input_ids.shape[1]
        N = W - 1  # draft positions (chain) or nodes (tree)
        live = [batch.rows[r] is not None and batch.rows[r].finish_reason is None for r in range(n)]
        max_draft = []
        for r in range(n):
            st = batch.rows[r]
            if not live[r]:
                max_draft.append(0)
                continue
            remaining = st.request.params.max_new_tokens - len(st.generated)
            room = self.max_model_len - batch.host_seq_lens[r]
            max_draft.append(max(0, min(K, remaining - 1, room - 1)))
        max_draft_t = torch.tensor(max_draft, dtype=torch.int64, device=dev)  # [n]
        bufs.batch = batch.view(n, max_draft_t, self.trash_slot)
        bufs.temperature.copy_(batch.temperature[:n])
        bufs.top_k.copy_(batch.top_k[:n])
        bufs.top_p.copy_(batch.top_p[:n])
        params = [batch.rows[r].request.params if live[r] else None for r in range(n)]
        bufs.use_top_k = state.captured or any(p is not None and p.top_k > 0 and p.temperature > 0 for p in params)
        bufs.use_top_p = state.captured or any(p is not None and p.top_p < 1 and p.temperature > 0 for p in params)
        bufs.all_greedy = not state.captured and all(p is None or p.temperature == 0 for p in params)
        sampled = [r for r in range(n) if params[r] is not None and params[r].temperature > 0]
        # the synthetic rule draws acceptance uniforms for greedy rows too (vLLM accepts by the curve for all)
        drawn = [r for r in range(n) if live[r]] if spec.verify_rule == "synthetic" else sampled
        if N and drawn:
            self._fill_noise(batch, drawn, lambda g, m: torch.rand(m, N, generator=g, device=dev), bufs.uniforms)
        if sampled:  # randomness (sampled rows only): draft noise, bonus noise
            V = self.vocab_size
            if bufs.draft_noise is not None:
                self._fill_noise(batch, sampled, lambda g, m: self._exp_noise(g, m * N * V).view(m, N, V),
                                 bufs.draft_noise)
            self._fill_noise(batch, sampled, lambda g, m: self._exp_noise(g, m * V).view(m, V), bufs.exp_noise)
        active = torch.tensor(live, dtype=torch.bool, device=dev)  # [n]
        seq = batch.seq_lens[:n]
        start = torch.where(active, seq - 1, torch.zeros_like(seq))  # [n] position of the pending token
        bufs.input_ids[:, 0] = batch.tokens[:n].gather(1, start.view(n, 1)).view(n)
        bufs.positions.copy_(start.view(n, 1) + torch.arange(W, device=dev).view(1, W))  # [n, W]
        bufs.cache_slots.copy_(torch.where(active.view(n, 1), bufs.positions,
                                           torch.full_like(bufs.positions, self.trash_slot)))
        return live

    def _admit(self, state: SpecRuntimeState, live: List[bool]) -> None:
        """Let the schedule cut each live request's drafts to a prefix (``budget``), then size the
        step: ``num_tokens`` per row (ragged verify) and, eager, the widest row's width."""
        bufs = state.cur
        K = state.spec.num_steps
        N = bufs.confidence.shape[1]  # draft positions (chain: κ) or tree nodes
        verified = bufs.num_valid.clone() if self.schedule.verify_all else None
        if K > 0:
            rows = [r for r, on in enumerate(live) if on]
            if rows:
                idx = torch.tensor(rows, dtype=torch.int64, device=self.device)
                conf = bufs.confidence[idx]
                if state.spec.draft_sampling == "probabilistic":
                    # budget from the previous step's confidences: a prefix chosen from the current
                    # sampled drafts' own scores would bias rejection sampling (see drafters.base.Proposal)
                    conf, self._stale_conf[idx, :N] = self._stale_conf[idx, :N].clone(), conf
                admitted = self.schedule.admit(conf.cpu().numpy(), bufs.num_valid[idx].cpu().numpy())
                if admitted is not None:
                    bufs.num_valid[idx] = torch.as_tensor(admitted, dtype=torch.int64, device=self.device)
        verified = bufs.num_valid if verified is None else verified  # cap_accept: verify all, accept admitted
        active = torch.tensor(live, dtype=torch.bool, device=self.device)
        bufs.num_tokens.copy_(torch.where(active, verified + 1, torch.zeros_like(verified)))
        if not state.captured:
            state.trim(int(verified.max()) + 1 if K and len(live) else 1)

    def _emit_step(self, batch: DecodeBatch, state: SpecRuntimeState, result, live: List[bool]) -> List[int]:
        """Give each live request its accepted drafts and bonus token; update its counters. Returns
        the accepted drafts (bonus excluded) of each live request, for the schedule."""
        bufs = state.cur
        accepted = result.accepted_len.tolist()
        out_tokens = result.output_tokens.tolist()
        valid = bufs.num_valid.tolist()
        rows, kept, observed = [], [], []
        for r, on in enumerate(live):
            if not on:
                continue
            a = int(accepted[r])
            batch.rows[r].counters.observe(int(valid[r]), a)
            rows.append(r)
            kept.append(self._emit(batch, r, out_tokens[r][:a + 1]))
            observed.append(a)
        batch.append_many(rows, kept)
        bufs.batch = batch.view(bufs.input_ids.shape[0], bufs.batch.max_draft, self.trash_slot)
        return observed

    # ------------------------------------------------------------------ helpers
    def _fill_noise(self, batch: DecodeBatch, rows: List[int], draw, out: torch.Tensor) -> None:
        """Fill ``out[rows]`` with random draws: ``draw(generator, n) -> [n, ...]``. Requests with a
        seed draw from their own generator (reproducible whatever the batch); the others share the
        runtime's generator in one vectorized draw (reproducible for the same batch and seed)."""
        shared = [r for r in rows if batch.rows[r].generator is None]
        if shared:
            out[torch.tensor(shared, device=out.device)] = draw(self.generator, len(shared))
        for r in rows:
            gen = batch.rows[r].generator
            if gen is not None:
                out[r] = draw(gen, 1)[0]

    @staticmethod
    def _exp_noise(gen: torch.Generator, n: int) -> torch.Tensor:
        """``[n]`` fp32 i.i.d. Exp(1) draws > 0 from ``gen``."""
        e = torch.empty(n, dtype=torch.float32, device=gen.device).exponential_(generator=gen)
        return e.clamp_(min=torch.finfo(torch.float32).tiny)

    def _emit(self, batch: DecodeBatch, row: int, tokens: List[int]) -> List[int]:
        """Give a step's tokens to a request, stopping at EOS, a stop string, max_new_tokens or
        max_model_len (later tokens of the step are dropped). Returns the tokens kept, which the
        caller appends to the row's history."""
        st = batch.rows[row]
        p = st.request.params
        if not st.generated and tokens:
            st.first_token_time = time.perf_counter()
        kept: List[int] = []
        for t in tokens:
            kept.append(int(t))
            st.generated.append(int(t))
            if not p.ignore_eos and int(t) in self.eos_token_ids:
                st.finish_reason = "eos"
                break
            if p.stop and self.tokenizer is not None:
                text = self.tokenizer.decode(st.generated)
                cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
                if cut >= 0:
                    st.finish_reason, st.stop_text = "stop", text[:cut]
                    break
            if len(st.generated) >= p.max_new_tokens:
                st.finish_reason = "length"
                break
            if batch.host_seq_lens[row] + len(kept) >= self.max_model_len:
                st.finish_reason = "max_model_len"
                break
        return kept

    def _finish(self, st: RowState) -> RequestOutput:
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
