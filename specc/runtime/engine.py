"""The decode loop: admit requests into rows, prefill, then route → draft → verify → accept → emit
→ extend until every request finishes.

KV is committed by position (gpt-fast, anchors A1): the verify forward of a step writes the target
KV of rows ``seq_len-1 .. seq_len-1+κ`` of each request; the accepted prefix is kept simply by
advancing ``seq_len``; rejected entries are overwritten by the next step and hidden meanwhile by the
causal-by-position mask. Padding (inactive rows, prompt padding) writes to the trash slot.

Cache geometry: every cache has ``cache_len = max_model_len + κ_max + 2`` slots per row (verify rows
past a request's limit and the trash slot ``cache_len - 1``); when the target's config allows fewer
slots, the runtime's usable ``max_model_len`` shrinks to ``cache_len - κ_max - 2`` (reported).

Verify width: a captured (CUDA) state always verifies its static κ + 1 rows per request; an eager
state trims the step to the longest valid draft in the batch + 1 (``SpecRuntimeState.set_width``),
so a step where no request drafted anything (an n-gram miss) costs a single-row forward.

Routing (static schedule): a batch using rows ``0..n-1`` runs in the state with the smallest batch
bucket ``>= n`` (vLLM/SGLang pad to the next captured size); if a bucket has several states, the
one with the largest κ. The runtime admits at most ``max(bucket)`` requests at a time and refills
freed rows from the queue (continuous batching; a refill prefill runs over the rows in use with
every other row's writes sent to the trash slot).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Dict, List, Optional, Sequence

import torch

from specc.errors import PromptError
from specc.kernels import process_logits
from specc.drafters.base import PrefillChunk
from specc.runtime.batch import DecodeBatch, RowState
from specc.runtime.metrics import SpecMetrics
from specc.runtime.request import Request, RequestCounters, RequestOutput, check_prompts
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
        method_options: e.g. ``{"ngram_min": 1, "ngram_max": 4}`` (passed on in the state context).
        seed: seed of the runtime's generator (re-seeded at each ``generate``), which requests
            without their own ``seed`` share.
        eos_token_ids: override of the tokenizer's / config's EOS ids.
        prefill_chunk: prompt columns per prefill forward (times rows in use: about this many tokens).
        kernel_modules: an artifact's specialized kernel modules by variant name.
    Raises:
        ArtifactError: a state the runtime cannot run.
    """

    def __init__(self, target, tokenizer, drafter, specs: Sequence[StateSpec], *,
                 builders: Optional[Dict[str, StateBuilder]] = None, max_model_len: Optional[int] = None,
                 device: Optional[torch.device] = None, kernel_backend: str = "auto",
                 use_cuda_graphs: bool = False, method_options: Optional[dict] = None, seed: int = 0,
                 eos_token_ids: Optional[Sequence[int]] = None, prefill_chunk: int = 512,
                 kernel_modules: Optional[dict] = None) -> None:
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
            method_options=dict(method_options or {}), use_cuda_graphs=use_cuda_graphs,
            kernel_modules=dict(kernel_modules or {}))
        builders = builders or {}
        states = []
        for spec in specs:
            build = builders.get(spec.name)
            states.append(build(self.ctx) if build is not None else build_state(spec, self.ctx))
        states.sort(key=lambda s: (s.spec.batch_size, s.spec.num_steps))
        self.states: List[SpecRuntimeState] = states
        self.num_captured = sum(1 for s in states if s.capture())
        self.metrics = self.new_metrics()

    def new_metrics(self) -> SpecMetrics:
        """Empty run metrics whose ``num_accepted_tokens_per_pos`` has one zero per draft position
        (κ_max entries), as vLLM's ``SpecDecodingStats`` (`vllm/v1/spec_decode/metrics.py`)."""
        return SpecMetrics(num_accepted_tokens_per_pos=[0] * self.k_max)

    # ------------------------------------------------------------------ routing
    def route(self, num_rows: int) -> SpecRuntimeState:
        """The state for a batch using rows ``0..num_rows-1`` (smallest bucket >= num_rows, largest κ)."""
        fits = [s for s in self.states if s.spec.batch_size >= num_rows]
        if not fits:
            raise RuntimeError(f"no state fits {num_rows} rows (largest bucket {self.max_rows})")
        bucket = fits[0].spec.batch_size
        return [s for s in fits if s.spec.batch_size == bucket][-1]

    def describe(self) -> List[dict]:
        """One line of facts per state: name, bucket, κ, rule, buffer bytes, captured."""
        return [{"name": s.spec.name, "batch_size": s.spec.batch_size, "num_steps": s.spec.num_steps,
                 "verify_rule": s.spec.verify_rule, "buffer_bytes": s.bufs.nbytes(), "captured": s.captured}
                for s in self.states]

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
                with self.metrics.stage("prefill"):
                    self._prefill(batch, new_rows)
            else:
                self._step(batch, self.route(batch.num_rows_in_use()))
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
        """Target prefill of the new rows' prompts (chunked), the first token, the drafter's prefill."""
        n_rows = max(max(new_rows) + 1, batch.num_rows_in_use())
        dev = self.device
        lens = {r: batch.host_seq_lens[r] for r in new_rows}
        width = max(lens.values())
        ids = torch.zeros(n_rows, width, dtype=torch.int64, device=dev)
        positions = torch.arange(width, device=dev).expand(n_rows, width).contiguous()  # [B, P]
        slots = torch.full((n_rows, width), self.trash_slot, dtype=torch.int64, device=dev)
        rows_mask = torch.zeros(n_rows, dtype=torch.bool, device=dev)
        for r, n in lens.items():
            ids[r, :n] = batch.tokens[r, :n]
            slots[r, :n] = positions[r, :n]
            rows_mask[r] = True
        last_idx = torch.tensor([lens.get(r, 1) - 1 for r in range(n_rows)], dtype=torch.int64, device=dev)  # [B]
        last_logits = torch.zeros(n_rows, self.vocab_size, dtype=torch.float32, device=dev)
        hidden_parts: List[List[torch.Tensor]] = []
        chunk = max(16, self.prefill_chunk // n_rows)
        for c0 in range(0, width, chunk):
            c1 = min(width, c0 + chunk)
            at = (last_idx - c0).clamp(0, c1 - c0 - 1).view(n_rows, 1)  # [B, 1]
            logits, hidden = self.target.forward(ids[:, c0:c1], positions[:, c0:c1], slots[:, c0:c1], None,
                                                 hidden_layers=self.ctx.hidden_layers, logits_at=at)
            here = (last_idx >= c0) & (last_idx < c1) & rows_mask  # [B]
            last_logits = torch.where(here.view(-1, 1), logits[:, 0], last_logits)
            hidden_parts.append(list(hidden))
        # first token: argmax_v p(v) / Exp(1) noise (exponential race), one-hot p for greedy rows
        temp, top_k, top_p = batch.temperature[:n_rows], batch.top_k[:n_rows], batch.top_p[:n_rows]
        probs = process_logits(last_logits.view(n_rows, 1, -1), temp, top_k, top_p)[:, 0]  # [B, V]
        noise = torch.ones(n_rows, self.vocab_size, dtype=torch.float32, device=dev)
        self._fill_noise(batch, new_rows, lambda gen, n: self._exp_noise(gen, n * self.vocab_size).view(n, -1), noise)
        first = torch.div(probs, noise).argmax(dim=-1).tolist()  # [B]
        batch.append_many(new_rows, [self._emit(batch, r, [first[r]]) for r in new_rows])
        if self.drafter is not None:
            hidden = [torch.cat([part[i] for part in hidden_parts], dim=1) for i in range(len(self.ctx.hidden_layers))]
            view = batch.view(n_rows, torch.zeros(n_rows, dtype=torch.int64, device=dev), self.trash_slot)
            self.drafter.prefill(view, PrefillChunk(input_ids=ids, positions=positions, cache_slots=slots,
                                                    rows=rows_mask, target_hidden=hidden))

    # ------------------------------------------------------------------ one decode step
    def _step(self, batch: DecodeBatch, state: SpecRuntimeState) -> None:
        spec, bufs = state.spec, state.bufs
        B, K, W, dev = spec.batch_size, spec.num_steps, spec.width, self.device
        sync = self._sync if dev.type == "cuda" else None
        live = [batch.rows[r] is not None and batch.rows[r].finish_reason is None for r in range(B)]
        max_draft = []
        for r in range(B):
            st = batch.rows[r]
            if not live[r]:
                max_draft.append(0)
                continue
            remaining = st.request.params.max_new_tokens - len(st.generated)
            room = self.max_model_len - batch.host_seq_lens[r]
            max_draft.append(max(0, min(K, remaining - 1, room - 1)))
        max_draft_t = torch.tensor(max_draft, dtype=torch.int64, device=dev)  # [B]
        bufs.batch = batch.view(B, max_draft_t, self.trash_slot)
        bufs.temperature.copy_(batch.temperature[:B])
        bufs.top_k.copy_(batch.top_k[:B])
        bufs.top_p.copy_(batch.top_p[:B])
        params = [batch.rows[r].request.params if live[r] else None for r in range(B)]
        bufs.use_top_k = any(p is not None and p.top_k > 0 and p.temperature > 0 for p in params)
        bufs.use_top_p = any(p is not None and p.top_p < 1 and p.temperature > 0 for p in params)
        bufs.all_greedy = not state.captured and all(p is None or p.temperature == 0 for p in params)
        # randomness (sampled rows only): draft noise, acceptance uniforms, bonus noise
        sampled = [r for r in range(B) if params[r] is not None and params[r].temperature > 0]
        if sampled:
            V = self.vocab_size
            if bufs.draft_noise is not None:
                self._fill_noise(batch, sampled, lambda g, n: self._exp_noise(g, n * K * V).view(n, K, V),
                                 bufs.draft_noise)
            if K:
                self._fill_noise(batch, sampled, lambda g, n: torch.rand(n, K, generator=g, device=dev), bufs.uniforms)
            self._fill_noise(batch, sampled, lambda g, n: self._exp_noise(g, n * V).view(n, V), bufs.exp_noise)

        with self.metrics.stage("draft", sync):
            state.draft()
        active = torch.tensor(live, dtype=torch.bool, device=dev)  # [B] rows decoding this step
        seq = batch.seq_lens[:B]
        start = torch.where(active, seq - 1, torch.zeros_like(seq))  # [B] position of the pending token
        bufs.input_ids[:, 0] = batch.tokens[:B].gather(1, start.view(B, 1)).view(B)
        bufs.positions.copy_(start.view(B, 1) + torch.arange(W, device=dev).view(1, W))  # [B, W]
        bufs.cache_slots.copy_(torch.where(active.view(B, 1), bufs.positions,
                                           torch.full_like(bufs.positions, self.trash_slot)))
        if state.captured:
            with self.metrics.stage("verify", sync):
                result = state.verify_accept()
        else:
            state.set_width(int(bufs.num_valid.max()) + 1 if K else 1)
            with self.metrics.stage("verify", sync):
                state.verify()
            with self.metrics.stage("accept", sync):
                result = state.accept()
        with self.metrics.stage("emit"):
            accepted = result.accepted_len.tolist()
            out_tokens = result.output_tokens.tolist()
            valid = bufs.num_valid.tolist()
            rows, kept = [], []
            for r in range(B):
                if not live[r]:
                    continue
                n = int(accepted[r])
                batch.rows[r].counters.observe(int(valid[r]), n)
                rows.append(r)
                kept.append(self._emit(batch, r, out_tokens[r][:n + 1]))
            batch.append_many(rows, kept)
        bufs.batch = batch.view(B, max_draft_t, self.trash_slot)
        with self.metrics.stage("extend", sync):
            state.extend()

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
                             counters=st.counters, time_s=time.perf_counter() - st.start_time)
