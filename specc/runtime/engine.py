"""The decode loop: admit requests into rows, prefill, then per step select a state (the schedule) →
draft → admit (budget) → verify → accept → emit → extend, until every request finishes.

KV is committed by position (gpt-fast, anchors A1): the verify forward of a step writes the target
KV of rows ``seq_len-1 .. seq_len-1+κ`` of each request; the accepted prefix is kept simply by
advancing ``seq_len``; rejected entries are overwritten by the next step and hidden meanwhile by the
causal-by-position mask. Padding (inactive rows, prompt padding) writes to the trash slot.

Cache geometry: every cache has ``cache_len = max_model_len + κ_max + 2`` slots per row (verify rows
past a request's limit and the trash slot ``cache_len - 1``); when the target's config allows fewer
slots, the runtime's usable ``max_model_len`` shrinks to ``cache_len - κ_max - 2`` (reported).

States are keyed by ``(batch bucket, κ)`` and all built at load; the schedule policy
(:mod:`specc.runtime.schedule`) picks one per step (a pointer swap) and learns from each step's
accepted drafts. A captured (CUDA) state verifies its static shape; an eager (CPU) state runs on the
rows in use only, trims the step to its widest verify, and runs the target forward ragged (each
request costs its own number of verify tokens), so an n-gram miss or a trimmed budget costs nothing.

Rows are the runtime's batch slots: a request keeps its row from admission to finish; the runtime
admits at most ``max(bucket)`` requests at a time and refills freed rows from the queue (continuous
batching; a refill prefill runs over the rows in use with every other row's writes sent to the trash
slot).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from specc.errors import PromptError
from specc.kernels import process_logits
from specc.drafters.base import PrefillChunk
from specc.runtime.batch import DecodeBatch, RowState
from specc.runtime.metrics import SpecMetrics
from specc.runtime.request import Request, RequestCounters, RequestOutput, check_prompts
from specc.errors import ArtifactError
from specc.runtime.schedule import Schedule, make_schedule
from specc.runtime.state import SpecRuntimeState, StateContext, StateSpec, build_state

StateBuilder = Callable[[StateContext], SpecRuntimeState]


class Runtime:
    """Decodes requests with a set of runtime states over one target model and one drafter.

    Args:
        target: ``specc.models.llama.LlamaModel`` (weights loaded; its cache is set up here).
        tokenizer: ``specc.models.tokenizer.Tokenizer`` or None (then no stop strings / text).
        drafter: ``specc.drafters.base.Drafter`` or None (κ = 0 states only).
        specs: the states' constants (``StateSpec``; from an artifact's modules or built directly).
        builders: optional ``{state name: build(ctx)}`` from generated modules; default
            :func:`specc.runtime.state.build_state`.
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
                 builders: Optional[Dict[str, StateBuilder]] = None, max_model_len: Optional[int] = None,
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
        slack = k_max + 2
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
        builders = builders or {}
        by_key: Dict[Tuple[int, int], SpecRuntimeState] = {}
        for spec in specs:
            build = builders.get(spec.name)
            st = build(self.ctx) if build is not None else build_state(spec, self.ctx, synthetic_rates)
            if st.spec.key in by_key:
                raise ArtifactError(f"states {by_key[st.spec.key].spec.name} and {st.spec.name} share bucket "
                                    f"{st.spec.batch_size} and κ = {st.spec.num_steps}; re-run specc compile")
            by_key[st.spec.key] = st
        self.by_key = dict(sorted(by_key.items()))
        self.states: List[SpecRuntimeState] = list(self.by_key.values())
        self.schedule: Schedule = make_schedule(schedule, self.by_key.keys())
        self.num_captured = sum(1 for s in self.states if s.capture())
        self._stale_conf = torch.ones(self.max_rows, k_max, dtype=torch.float32, device=self.device)
        self._active_key: Optional[Tuple[int, int]] = None
        self.metrics = self.new_metrics()

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
        """Decode every request; returns outputs in the order of ``requests``.

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
            if r.params.temperature > 0 and any(s.spec.verify_rule == "greedy" and s.spec.num_steps > 0
                                                for s in self.states):
                raise PromptError(
                    f"prompt {r.request_id or i}: temperature {r.params.temperature} needs the standard verify "
                    f"rule, but this artifact verifies greedily (verify.rule=greedy); pass temperature 0 or "
                    f"compile the plan with verify.rule=standard")
        if batch_size is not None and int(batch_size) < 1:
            raise PromptError(f"batch size must be >= 1 (None = the largest bucket), got {batch_size}")
        limit = min(int(batch_size or self.max_rows), self.max_rows)  # the CLI refuses more than the cap
        batch = DecodeBatch(self.max_rows, self.cache_len, self.device)
        self.batch = batch
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.seed)
        queue = deque(enumerate(requests))
        outputs: List[Optional[RequestOutput]] = [None] * len(requests)
        t_start = time.perf_counter()
        while queue or batch.live_rows():
            free = [r for r in batch.free_rows() if r < limit]
            new_rows, new_states = [], []
            while free and queue:
                idx, req = queue.popleft()
                gen = None
                if req.params.seed is not None:
                    gen = torch.Generator(device=self.device)
                    gen.manual_seed(int(req.params.seed))
                new_rows.append(free.pop(0))
                new_states.append(RowState(index=idx, request=req, generator=gen, start_time=time.perf_counter(),
                                           counters=RequestCounters.for_steps(self.k_max)))
            batch.assign_many(new_rows, new_states, [list(s.request.prompt_ids) for s in new_states])
            if new_rows:
                self._stale_conf[new_rows] = 1.0  # vLLM: a new request starts with confidence 1.0
                with self.metrics.stage("prefill"):
                    self._prefill(batch, new_rows)
            else:
                self._step(batch)
            for row in batch.live_rows():
                st = batch.rows[row]
                if st.finish_reason is not None:
                    out = self._finish(st)
                    outputs[st.index] = out
                    batch.release(row)
                    if on_finish is not None:
                        on_finish(out)
        self.metrics.wall_time_s += time.perf_counter() - t_start
        return outputs  # type: ignore[return-value]

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
        n, K, dev = bufs.input_ids.shape[0], spec.num_steps, self.device
        W = bufs.input_ids.shape[1]
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
        if K and drawn:
            self._fill_noise(batch, drawn, lambda g, m: torch.rand(m, K, generator=g, device=dev), bufs.uniforms)
        if sampled:  # randomness (sampled rows only): draft noise, bonus noise
            V = self.vocab_size
            if bufs.draft_noise is not None:
                self._fill_noise(batch, sampled, lambda g, m: self._exp_noise(g, m * K * V).view(m, K, V),
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
        verified = bufs.num_valid.clone() if self.schedule.verify_all else None
        if K > 0:
            rows = [r for r, on in enumerate(live) if on]
            if rows:
                idx = torch.tensor(rows, dtype=torch.int64, device=self.device)
                conf = bufs.confidence[idx]
                if state.spec.draft_sampling == "probabilistic":
                    # budget from the previous step's confidences: a prefix chosen from the current
                    # sampled drafts' own scores would bias rejection sampling (see drafters.base.Proposal)
                    conf, self._stale_conf[idx, :K] = self._stale_conf[idx, :K].clone(), conf
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
                             ttft_s=(st.first_token_time or st.start_time) - st.start_time)
