"""Prompt lookup (n-gram) drafting: continue the longest suffix n-gram that occurred earlier in the
request's own tokens (prompt + generated).

Rule (Saxena's prompt lookup decoding; vLLM ``NgramProposer`` with ``prompt_lookup_min/max``,
vllm/config/speculative.py:1302-1305): for n = ``max_n`` down to ``min_n``, take the last n tokens of the history and
find their most recent earlier occurrence; propose the (up to κ) tokens that followed it. The first
n with a match wins; no match at any n proposes nothing (``num_valid = 0``: that step is plain
decoding). Drafts are one-hot (q = δ), so with the standard rule they are verified as greedy drafts.
Runs on the host (numpy), like vLLM's CPU n-gram proposer.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from specc.methods.base import (BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep, host_batch,
                                 host_verify)


def ngram_lookup(history: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The continuation of the longest, most recent earlier match of a suffix n-gram.

    Args:
        history: ``[L]`` int64 tokens (prompt + generated; the last one is the pending token).
        min_n, max_n: n-gram sizes tried, longest first (1 <= min_n <= max_n).
        k: tokens wanted (κ, or fewer when the request is near its limits).
    Returns:
        ``[m]`` int64, 0 <= m <= k (shorter when the match sits near the end of the history).
    """
    return ngram_match(history, min_n, max_n, k)[0]


def ngram_match(history: np.ndarray, min_n: int, max_n: int, k: int):
    """:func:`ngram_lookup` and the n-gram size n that matched (0 when nothing matched)."""
    L = int(history.shape[0])
    if k <= 0:
        return history[:0], 0
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = history[L - n:]
        # windows starting at 0 .. L-n-1 (the suffix's own position L-n is excluded)
        windows = np.lib.stride_tricks.sliding_window_view(history[:L - 1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # most recent match; its continuation starts here (<= L-1)
            return history[start:start + k], n
    return history[:0], 0


class AcceptanceEstimate:
    """Per-position acceptance learned online, for drafts without a distribution (vLLM falls back to
    an online estimator there too: ``OnlineAcceptanceEstimator``). Keyed by
    (matched n-gram size, draft position i): the fraction of steps that reached position i (drafts
    ``0..i-1`` accepted) in which draft i was accepted, with a Beta(1, 1) prior (0.5 before any
    observation). Depends only on earlier steps' outcomes, never on the current draft tokens."""

    def __init__(self, max_n: int) -> None:
        self.trials = np.zeros((max_n + 1, 0), dtype=np.float64)  # [n, i]; n = 0: no match
        self.accepts = np.zeros((max_n + 1, 0), dtype=np.float64)

    def _grow(self, k: int) -> None:
        if self.trials.shape[1] < k:
            pad = k - self.trials.shape[1]
            self.trials = np.pad(self.trials, ((0, 0), (0, pad)))
            self.accepts = np.pad(self.accepts, ((0, 0), (0, pad)))

    def confidence(self, n: int, k: int) -> np.ndarray:
        """``[k]`` fp64 estimates for a match of size ``n`` (posterior means)."""
        self._grow(k)
        return (self.accepts[n, :k] + 1.0) / (self.trials[n, :k] + 2.0)

    def observe(self, n: int, num_valid: int, accepted: int) -> None:
        """One step of a row: ``num_valid`` drafts from a size-``n`` match, ``accepted`` of them."""
        if num_valid <= 0:
            return
        self._grow(num_valid)
        reached = min(accepted + 1, num_valid)  # positions 0..reached-1 were tested
        self.trials[n, :reached] += 1.0
        self.accepts[n, :accepted] += 1.0


class NgramDrafter(Drafter):
    """``method.name: ngram``. Args: min_n, max_n: ``method.ngram.min/max`` (n-gram sizes)."""

    name = "ngram"
    supports_probabilistic = False
    capturable = False
    prefill_row_index = True

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= int(min_n) <= int(max_n):
            from specc.errors import PlanError
            raise PlanError(f"method.ngram: need 1 <= min <= max, got min={min_n}, max={max_n}")
        self.min_n, self.max_n = int(min_n), int(max_n)
        self.estimate = AcceptanceEstimate(self.max_n)
        self._matched: list = []  # n-gram size matched per row at the last propose (0 = none)

    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Nothing to absorb: the lookup reads ``batch.tokens`` directly."""

    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """Look up each active row's history; returns tokens ``[B, κ]`` (0-padded), num_valid ``[B]``
        and the online per-position confidence ``[B, κ]`` (:class:`AcceptanceEstimate`)."""
        B = batch.batch_size
        tokens = np.zeros((B, num_steps), dtype=np.int64)
        valid = np.zeros(B, dtype=np.int64)
        conf = np.zeros((B, num_steps), dtype=np.float32)
        matched = [0] * B
        host = host_batch(batch)  # the step's host copy of the rows: no device read
        seq, active, cap = host.seq_lens, host.active, host.max_draft
        need = [b for b in range(B) if active[b] and cap[b] > 0]
        if need:
            hist_all = host.tokens  # [B, S]
            for b in need:
                cont, n = ngram_match(hist_all[b, :seq[b]], self.min_n, self.max_n, min(num_steps, cap[b]))
                tokens[b, :cont.shape[0]] = cont
                valid[b] = cont.shape[0]
                matched[b] = n
                # no match (n = 0): positions nobody proposed, verified only under the synthetic rule,
                # which accepts whatever the tokens; key 0 of the estimate learns that case
                width = cont.shape[0] if n else min(num_steps, cap[b])
                conf[b, :width] = self.estimate.confidence(n, width)
        self._matched = matched
        dev = batch.tokens.device
        return Proposal(tokens=_to(tokens, dev), num_valid=_to(valid, dev),
                        confidence=_to(conf, dev))

    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Learn the acceptance estimate from this step's outcome (rows that drafted)."""
        if step.num_steps == 0 or step.num_valid is None or not self._matched:
            return
        host = host_verify(step)  # the step's one read of its results: no device read here
        valid, accepted = host.num_valid, host.accepted
        for b, n in enumerate(self._matched[:len(valid)]):
            if valid[b] > 0:
                self.estimate.observe(n, int(valid[b]), int(accepted[b]))
        self._matched = []


DEFAULT_WINDOW = (1, 3)  # method.ngram.min/max when the plan leaves them unset (vLLM's docstring min 1)


def build_drafter(spec, target=None, tokenizer=None, device=None, max_seq_len=None) -> NgramDrafter:
    """Runtime factory of ``method.name: ngram`` from the artifact's runtime section ``spec``
    (``spec["method"]["ngram"]`` = ``{"min", "max"}``, unset values take :data:`DEFAULT_WINDOW`).
    Raises PlanError for min > max."""
    window = (spec.get("method") or {}).get("ngram") or {}
    lo = window.get("min") if window.get("min") is not None else DEFAULT_WINDOW[0]
    hi = window.get("max") if window.get("max") is not None else max(lo, DEFAULT_WINDOW[1])
    return NgramDrafter(lo, hi)


def _to(a, device) -> torch.Tensor:
    """A host numpy array on ``device`` (on CUDA a non-blocking copy: staged from pageable memory
    before the call returns, no stream synchronisation)."""
    t = torch.from_numpy(a)
    return t.to(device, non_blocking=True) if torch.device(device).type == "cuda" else t.to(device)
