"""Admission: queued requests into free rows, their prefill (or a disaggregated prefill's payload),
the first token, the drafter's prefill.

Rows are the runtime's batch slots: a request keeps its row from admission to finish; the runtime
admits at most ``max(bucket)`` requests at a time and refills freed rows from the queue (continuous
batching; a refill prefill runs over the new rows only, every other row's writes sent to the trash
slot).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, List

import torch

from specc import methods
from specc.methods.base import PrefillChunk
from specc.kernels import process_logits
from specc.runtime.batch import DecodeBatch, RowState
from specc.runtime.request import Request, RequestCounters
from specc.runtime.step import emit_tokens, exp_noise


@dataclass
class Queued:
    """A submitted request waiting for a row."""

    handle: int
    request: Request
    prefilled: Any = None
    prefill_only: bool = False


class Admission:
    """The queue and the admission of its requests into rows of ``runtime``'s batch.

    Concerns: the FIFO queue (within the session's batch limit and the LoRA adapter limit), the
    target prefill of new rows (chunked, over those rows only), the first token, the drafter's
    prefill, the installation of disaggregated payloads, and per-request isolation of prefill
    failures (a server)."""

    def __init__(self, runtime: Any, limit: int) -> None:
        self.rt = runtime
        self.limit = int(limit)
        self.queue: Deque[Queued] = deque()

    # ------------------------------------------------------------------ queue -> rows
    def admit_queued(self, batch: DecodeBatch) -> List[int]:
        """Move queued requests into free rows (below the session's batch limit), FIFO; with LoRA, a
        request whose adapter would exceed ``max_loras_per_batch`` distinct adapters among the live
        rows waits and later ones that fit go first (SGLang's LoRA-aware admission). Returns the new
        rows."""
        rt = self.rt
        free = [r for r in batch.free_rows() if r < self.limit]
        new_rows, new_states, prompts = [], [], []
        adapters = None
        if rt.lora is not None:
            adapters = {batch.rows[r].request.adapter for r in batch.live_rows()} - {None}
        skipped: List[Queued] = []
        while free and self.queue:
            item = self.queue.popleft()
            req = item.request
            if adapters is not None and req.adapter is not None and req.adapter not in adapters:
                if len(adapters) >= rt.lora.max_loras_per_batch:
                    skipped.append(item)
                    continue
                adapters.add(req.adapter)
            gen = None
            if req.params.seed is not None:
                gen = torch.Generator(device=rt.device)
                gen.manual_seed(int(req.params.seed))
            row = free.pop(0)
            new_rows.append(row)
            new_states.append(RowState(index=item.handle, request=req, generator=gen, start_time=time.perf_counter(),
                                       counters=RequestCounters.for_steps(rt.k_max), prefill_only=item.prefill_only,
                                       prefilled=item.prefilled))
            prompts.append(list(req.prompt_ids))
            if rt.lora is not None:
                rt.lora.assign_row(row, req.adapter)
        self.queue.extendleft(reversed(skipped))
        batch.assign_many(new_rows, new_states, prompts)
        return new_rows

    def prefill_new(self, batch: DecodeBatch, new_rows: List[int]) -> None:
        """Prefill the new rows (one chunked forward over all of them), or install the ones that
        arrived with a disaggregated payload; then export the seed of prefill-only rows. With failure
        isolation, a failing prompt is retried alone from a clean row and fails alone."""
        from specc.runtime import disagg

        rt = self.rt
        local = [r for r in new_rows if batch.rows[r].prefilled is None]
        remote = [r for r in new_rows if r not in local]
        if local:
            try:
                self.prefill(batch, local)
            except Exception:
                if not rt.isolate_failures:
                    raise
                for r in local:  # one at a time from a clean row: a failing prompt fails alone
                    self.restart_row(batch, r)
                    rt.guard(batch.rows[r], lambda r=r: self.prefill(batch, [r]))
        for r in remote:
            st = batch.rows[r]
            payload, st.prefilled = st.prefilled, None
            if rt.isolate_failures:
                rt.guard(st, lambda: self.install(batch, r, payload))
            else:
                self.install(batch, r, payload)
        for r in local:
            st = batch.rows[r]
            if st.prefill_only and st.finish_reason != "error":
                st.payload = disagg.export(rt, batch, r)
                st.finish_reason = "prefilled"

    def restart_row(self, batch: DecodeBatch, row: int) -> None:
        """Put a row back to its just-admitted state (prompt only, no output, fresh seeded generator)."""
        st = batch.rows[row]
        st.generated.clear()
        st.finish_reason, st.stop_text, st.first_token_time = None, None, 0.0
        if st.request.params.seed is not None:
            st.generator = torch.Generator(device=self.rt.device)
            st.generator.manual_seed(int(st.request.params.seed))
        batch.assign_many([row], [st], [list(st.request.prompt_ids)])

    # ------------------------------------------------------------------ prefill
    def prefill(self, batch: DecodeBatch, new_rows: List[int]) -> None:
        """Target prefill of the new rows' prompts (chunked, over those rows only: the other live
        rows cost nothing), the first token, the drafter's prefill."""
        rt = self.rt
        dev = rt.device
        rows_t = torch.tensor(new_rows, dtype=torch.int64, device=dev)  # [R] cache rows
        R = len(new_rows)
        lens = [batch.host_seq_lens[r] for r in new_rows]
        width = max(lens)
        ids = batch.tokens[rows_t, :width].clone()  # [R, P]
        positions = torch.arange(width, device=dev).expand(R, width).contiguous()  # [R, P]
        real = positions < torch.tensor(lens, device=dev).view(R, 1)
        slots = torch.where(real, positions, torch.full_like(positions, rt.trash_slot))
        last_idx = torch.tensor(lens, dtype=torch.int64, device=dev) - 1  # [R]
        last_logits = torch.zeros(R, rt.vocab_size, dtype=torch.float32, device=dev)
        hidden_parts: List[List[torch.Tensor]] = []
        chunk = max(16, rt.prefill_chunk // R)
        for c0 in range(0, width, chunk):
            c1 = min(width, c0 + chunk)
            at = (last_idx - c0).clamp(0, c1 - c0 - 1).view(R, 1)  # [R, 1]
            real_here = (last_idx + 1 - c0).clamp(0, c1 - c0)  # [R] prompt tokens of each row in this chunk
            logits, hidden = rt.target.forward(ids[:, c0:c1], positions[:, c0:c1], slots[:, c0:c1], None,
                                               hidden_layers=rt.ctx.hidden_layers, logits_at=at, rows=rows_t,
                                               num_tokens=real_here if dev.type == "cpu" else None)
            here = (last_idx >= c0) & (last_idx < c1)  # [R]
            last_logits = torch.where(here.view(-1, 1), logits[:, 0], last_logits)
            hidden_parts.append(list(hidden))
        # first token: argmax_v p(v) / Exp(1) noise (exponential race), one-hot p for greedy rows
        probs = process_logits(last_logits.view(R, 1, -1), batch.temperature[rows_t], batch.top_k[rows_t],
                               batch.top_p[rows_t])[:, 0]  # [R, V]
        noise = torch.ones(batch.max_rows, rt.vocab_size, dtype=torch.float32, device=dev)
        rt.fill_noise(batch, new_rows, lambda gen, n: exp_noise(gen, n * rt.vocab_size).view(n, -1), noise)
        first = torch.div(probs, noise[rows_t]).argmax(dim=-1).tolist()  # [R]
        batch.append_many(new_rows, [emit_tokens(rt, batch, r, [first[i]]) for i, r in enumerate(new_rows)])
        if rt.drafter is not None:
            hidden = [torch.cat([part[i] for part in hidden_parts], dim=1) for i in range(len(rt.ctx.hidden_layers))]
            self.drafter_prefill(batch, new_rows, ids, positions, slots, hidden)
            keep = bool(hidden) and methods.get(rt.states[0].spec.method).seed == "target_hidden"
            for i, r in enumerate(new_rows):  # kept for a target_hidden disaggregation seed (disagg.export)
                if keep and batch.rows[r].prefill_only:
                    batch.rows[r].prompt_hidden = [h[i, :lens[i]].clone() for h in hidden]

    def drafter_prefill(self, batch: DecodeBatch, new_rows: List[int], ids: torch.Tensor, positions: torch.Tensor,
                        slots: torch.Tensor, hidden: List[torch.Tensor]) -> None:
        """The drafter's prefill of the new rows (``ids``, ``positions``, ``slots``: ``[R, P]``;
        ``hidden``: ``[R, P, H]`` per drafter layer): compact (``PrefillChunk.row_index``) when the
        drafter takes it, else scattered into the layout of rows ``0..n-1`` with the other rows masked
        out."""
        rt = self.rt
        dev = rt.device
        rows_t = torch.tensor(new_rows, dtype=torch.int64, device=dev)
        if getattr(rt.drafter, "prefill_row_index", False):
            n = max(new_rows) + 1
            view = batch.view(n, torch.zeros(n, dtype=torch.int64, device=dev), rt.trash_slot)
            rt.drafter.prefill(view, PrefillChunk(input_ids=ids, positions=positions, cache_slots=slots,
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
        view = batch.view(n, torch.zeros(n, dtype=torch.int64, device=dev), rt.trash_slot)
        rt.drafter.prefill(view, PrefillChunk(
            input_ids=full(ids, 0), positions=torch.arange(width, device=dev).expand(n, width).contiguous(),
            cache_slots=full(slots, rt.trash_slot), rows=mask, target_hidden=[full(h, 0.0) for h in hidden]))

    # ------------------------------------------------------------------ disaggregation
    def install(self, batch: DecodeBatch, row: int, payload: Any) -> None:
        """Install a checked disaggregated prefill (:class:`specc.runtime.disagg.Prefilled`) into a
        just-admitted row: the prompt's KV into the target cache, the first token (emitted, with its
        stop checks), the generator state, and the method's seed (EAGLE: the head's KV and state; a
        drafter that prefills: its prefill over the prompt, on the shipped target hidden states when
        the seed carries them). The row then speculates on its first decode step.

        Raises:
            PayloadError: the payload does not fit this row's request or this drafter.
        """
        from specc.runtime.disagg import PayloadError, method_of, seed_kind

        rt = self.rt
        st = batch.rows[row]
        P = len(st.request.prompt_ids)
        if list(payload.prompt_ids) != list(st.request.prompt_ids):
            raise PayloadError("disaggregation payload: its prompt is not the request's")
        for layer, (k, v) in zip(rt.target.layers, payload.kv):
            layer.attn.k_cache[row, :, :P] = k.to(layer.attn.k_cache.device, layer.attn.k_cache.dtype)
            layer.attn.v_cache[row, :, :P] = v.to(layer.attn.v_cache.device, layer.attn.v_cache.dtype)
        if st.generator is not None and payload.generator_state is not None:
            st.generator.set_state(payload.generator_state)
        batch.append_many([row], [emit_tokens(rt, batch, row, [int(payload.first_token)])])
        drafter = rt.drafter
        if drafter is None:
            return
        kind = seed_kind(rt)
        if kind == "hidden_topk":
            drafter.import_seed(row, payload.seed, P, first_token=int(payload.first_token))
            return
        hidden = []
        if kind == "target_hidden":
            hidden = [payload.seed[f"hidden.{j}"].to(rt.device).unsqueeze(0) for j in range(len(rt.ctx.hidden_layers))]
        elif tuple(getattr(drafter, "hidden_layers", ()) or ()):
            raise PayloadError(f"method {method_of(rt)}: the drafter needs the target's hidden states over the "
                               f"prompt, which a {kind!r} seed does not ship")
        ids = batch.tokens[row:row + 1, :P].clone()  # [1, P]
        positions = torch.arange(P, device=rt.device).view(1, P)
        self.drafter_prefill(batch, [row], ids, positions, positions.clone(), hidden)


