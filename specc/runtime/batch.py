"""The decode batch: per-row token histories and sampling parameters, and per-request randomness.

Rows are the runtime's batch slots (and the rows of every KV cache); a request keeps its row from
admission to finish. All tensors live on the runtime's device; host mirrors of what the step and
the lookup drafters read (token histories, ``seq_lens``, ``prompt_lens``, ``active``) are written
alongside them from the host values (never read back from the device), so a decode step reads the
device once (:class:`specc.runtime.step.StepIO`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import torch

from specc.methods.base import BatchView, HostBatch
from specc.runtime.request import Request, RequestCounters


def host_to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype)`` on ``device``: on CUDA copied with ``non_blocking=True`` (from
    pageable memory the copy is staged before the call returns, so no stream synchronisation; a
    blocking copy would synchronise the stream)."""
    t = torch.tensor(values, dtype=dtype)
    return t.to(device, non_blocking=True) if torch.device(device).type == "cuda" else t


@dataclass
class RowState:
    """Host-side state of one live request."""

    index: int                       # position of the request in the caller's list
    request: Request
    generator: Optional[torch.Generator]  # own generator for seeded requests, else None (shared)
    generated: List[int] = field(default_factory=list)
    counters: RequestCounters = field(default_factory=RequestCounters)
    finish_reason: Optional[str] = None
    stop_text: Optional[str] = None  # output text cut before a stop string
    start_time: float = 0.0          # admission (perf_counter seconds)
    first_token_time: float = 0.0    # when its first token was emitted
    num_reported: int = 0            # generated tokens already handed out in token events
    error: str = ""                  # why the request failed (finish_reason "error")
    prefill_only: bool = False       # disaggregated prefill: export the seed after prefill, then finish
    prefilled: Any = None            # a disaggregated prefill's payload to install at admission
    payload: Any = None              # the payload a prefill-only row exported
    prompt_hidden: Any = None        # prefill-only rows of a target_hidden seed: [P, H] per drafter layer


class DecodeBatch:
    """Row-major decode state for up to ``max_rows`` requests with ``max_seq_len`` cache slots.

    Tensors: ``tokens [R, S]`` int64, ``seq_lens [R]`` int64, ``active [R]`` bool,
    ``prompt_lens [R]`` int64, ``temperature [R]`` fp32, ``top_p [R]`` fp32, ``top_k [R]`` int64.
    Host mirrors (written with them): ``host_tokens [R, S]`` int64 numpy array, ``host_seq_lens``,
    ``host_prompt_lens``, ``host_active`` (Python lists of R).
    """

    def __init__(self, max_rows: int, max_seq_len: int, device: torch.device) -> None:
        self.max_rows, self.max_seq_len, self.device = max_rows, max_seq_len, device
        i64 = dict(dtype=torch.int64, device=device)
        self.tokens = torch.zeros(max_rows, max_seq_len, **i64)
        self.seq_lens = torch.zeros(max_rows, **i64)
        self.prompt_lens = torch.zeros(max_rows, **i64)
        self.active = torch.zeros(max_rows, dtype=torch.bool, device=device)
        self.temperature = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.top_p = torch.ones(max_rows, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(max_rows, **i64)
        self.rows: List[Optional[RowState]] = [None] * max_rows
        self.host_seq_lens: List[int] = [0] * max_rows
        self.host_prompt_lens: List[int] = [0] * max_rows
        self.host_active: List[bool] = [False] * max_rows
        self.host_tokens = np.zeros((max_rows, max_seq_len), dtype=np.int64)

    # ------------------------------------------------------------------ rows
    def free_rows(self) -> List[int]:
        return [r for r in range(self.max_rows) if self.rows[r] is None]

    def live_rows(self) -> List[int]:
        return [r for r in range(self.max_rows) if self.rows[r] is not None]

    def num_rows_in_use(self) -> int:
        """Highest live row index + 1 (the smallest bucket the batch fits in), 0 when empty."""
        live = self.live_rows()
        return live[-1] + 1 if live else 0

    def assign_many(self, rows: List[int], states: List[RowState], prompts: List[List[int]]) -> None:
        """Put requests into ``rows`` with histories ``prompts`` (one vectorized write)."""
        if not rows:
            return
        for row, st, prompt in zip(rows, states, prompts):
            self.rows[row] = st
            self.host_seq_lens[row] = self.host_prompt_lens[row] = len(prompt)
            self.host_active[row] = True
        idx = host_to_device(rows, torch.int64, self.device)
        lens = host_to_device([len(p) for p in prompts], torch.int64, self.device)
        self._scatter(rows, prompts, [0] * len(rows))
        self.seq_lens[idx] = lens
        self.prompt_lens[idx] = lens
        self.active[idx] = True
        self.temperature[idx] = host_to_device([float(s.request.params.temperature) for s in states],
                                               torch.float32, self.device)
        self.top_p[idx] = host_to_device([float(s.request.params.top_p) for s in states], torch.float32, self.device)
        self.top_k[idx] = host_to_device([int(s.request.params.top_k) for s in states], torch.int64, self.device)

    def append_many(self, rows: List[int], new_tokens: List[List[int]]) -> None:
        """Append emitted tokens to several rows' histories (one vectorized write)."""
        if not rows:
            return
        starts = [self.host_seq_lens[r] for r in rows]
        self._scatter(rows, new_tokens, starts)
        for r, toks in zip(rows, new_tokens):
            self.host_seq_lens[r] += len(toks)
        idx = host_to_device(rows, torch.int64, self.device)
        self.seq_lens[idx] = host_to_device([self.host_seq_lens[r] for r in rows], torch.int64, self.device)

    def _scatter(self, rows: List[int], seqs: List[List[int]], starts: List[int]) -> None:
        """tokens[row, start + i] = seq[i] for every (row, seq, start)."""
        r_idx, c_idx, vals = [], [], []
        for r, seq, s0 in zip(rows, seqs, starts):
            r_idx.extend([r] * len(seq))
            c_idx.extend(range(s0, s0 + len(seq)))
            vals.extend(seq)
            self.host_tokens[r, s0:s0 + len(seq)] = seq
        if vals:
            dev = self.device
            self.tokens[host_to_device(r_idx, torch.int64, dev), host_to_device(c_idx, torch.int64, dev)] = \
                host_to_device(vals, torch.int64, dev)

    def release(self, row: int) -> None:
        self.rows[row] = None
        self.active[row] = False
        self.host_active[row] = False

    def set_active(self, row: int, on: bool) -> None:
        """Mark ``row`` live or parked (``active`` and its host mirror)."""
        self.active[row] = on
        self.host_active[row] = on

    def host_view(self, num_rows: int, max_draft: List[int]) -> HostBatch:
        """The host mirrors of rows ``0..num_rows-1`` (no device read), with the step's ``max_draft``."""
        return HostBatch(tokens=self.host_tokens[:num_rows], seq_lens=self.host_seq_lens[:num_rows],
                         active=self.host_active[:num_rows], prompt_lens=self.host_prompt_lens[:num_rows],
                         max_draft=list(max_draft))

    def view(self, num_rows: int, max_draft: torch.Tensor, trash_slot: int,
             host: Optional[HostBatch] = None) -> BatchView:
        """The drafter-facing view of rows ``0..num_rows-1`` (``host``: its host copy, or None)."""
        return BatchView(
            tokens=self.tokens[:num_rows], seq_lens=self.seq_lens[:num_rows], active=self.active[:num_rows],
            prompt_lens=self.prompt_lens[:num_rows], max_draft=max_draft,
            temperature=self.temperature[:num_rows], top_p=self.top_p[:num_rows], top_k=self.top_k[:num_rows],
            trash_slot=trash_slot, host=host)
