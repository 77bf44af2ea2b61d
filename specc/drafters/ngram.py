"""Prompt lookup (n-gram) drafting: continue the longest suffix n-gram that occurred earlier in the
request's own tokens (prompt + generated).

Rule (Saxena's prompt lookup decoding; vLLM ``NgramProposer`` with ``prompt_lookup_min/max``,
vllm-0.33.0.md §2): for n = ``max_n`` down to ``min_n``, take the last n tokens of the history and
find their most recent earlier occurrence; propose the (up to κ) tokens that followed it. The first
n with a match wins; no match at any n proposes nothing (``num_valid = 0``: that step is plain
decoding). Drafts are one-hot (q = δ), so with the standard rule they are verified as greedy drafts.
Runs on the host (numpy), like vLLM's CPU n-gram proposer.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from specc.drafters.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal


def ngram_lookup(history: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The continuation of the longest, most recent earlier match of a suffix n-gram.

    Args:
        history: ``[L]`` int64 tokens (prompt + generated; the last one is the pending token).
        min_n, max_n: n-gram sizes tried, longest first (1 <= min_n <= max_n).
        k: tokens wanted (κ, or fewer when the request is near its limits).
    Returns:
        ``[m]`` int64, 0 <= m <= k (shorter when the match sits near the end of the history).
    """
    L = int(history.shape[0])
    if k <= 0:
        return history[:0]
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = history[L - n:]
        # windows starting at 0 .. L-n-1 (the suffix's own position L-n is excluded)
        windows = np.lib.stride_tricks.sliding_window_view(history[:L - 1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # most recent match; its continuation starts here (<= L-1)
            return history[start:start + k]
    return history[:0]


class NgramDrafter(Drafter):
    """``method.name: ngram``. Args: min_n, max_n: ``method.ngram.min/max`` (n-gram sizes)."""

    name = "ngram"
    supports_probabilistic = False
    capturable = False

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= int(min_n) <= int(max_n):
            from specc.errors import PlanError
            raise PlanError(f"method.ngram: need 1 <= min <= max, got min={min_n}, max={max_n}")
        self.min_n, self.max_n = int(min_n), int(max_n)

    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Nothing to absorb: the lookup reads ``batch.tokens`` directly."""

    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """Look up each active row's history; returns tokens ``[B, κ]`` (0-padded) and num_valid ``[B]``."""
        B = batch.batch_size
        tokens = np.zeros((B, num_steps), dtype=np.int64)
        valid = np.zeros(B, dtype=np.int64)
        seq = batch.seq_lens.tolist()
        active = batch.active.tolist()
        cap = batch.max_draft.tolist()
        need = [b for b in range(B) if active[b] and cap[b] > 0]
        if need:
            hist_all = batch.tokens.cpu().numpy()  # [B, S]
            for b in need:
                cont = ngram_lookup(hist_all[b, :seq[b]], self.min_n, self.max_n, min(num_steps, cap[b]))
                tokens[b, :cont.shape[0]] = cont
                valid[b] = cont.shape[0]
        dev = batch.tokens.device
        return Proposal(tokens=torch.from_numpy(tokens).to(dev), num_valid=torch.from_numpy(valid).to(dev))
