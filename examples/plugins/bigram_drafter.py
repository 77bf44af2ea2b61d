"""An example specc drafter plugin: bigram lookup over the request's own tokens.

``BigramDrafter`` continues the history by following, from the last token, the most frequent
successor each token has had so far in this request (ties: the most recent one). It is a real, if
small, drafter in the spirit of prompt lookup (vLLM's n-gram proposer with n = 1, but by frequency
rather than recency): host code, no model, drafts one-hot.

Use it from a plan::

    method:
      name: custom
      plugin: bigram_drafter:BigramDrafter   # this file importable (on PYTHONPATH), or:
      plugin: bigram                          # the entry point ``pyproject.toml`` here declares
      num_steps: 3

It subclasses ``specc.methods.base.Drafter``, so it inherits the attributes and ``setup``; it
implements ``prefill``, ``propose`` and ``commit`` and overrides ``from_spec`` to read options.
"""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep


def bigram_continuation(history: np.ndarray, k: int) -> list:
    """Up to ``k`` tokens continuing ``history [L]`` by most frequent successors (ties: most recent)."""
    succ = defaultdict(Counter)
    last_seen = {}
    for i in range(len(history) - 1):
        a, b = int(history[i]), int(history[i + 1])
        succ[a][b] += 1
        last_seen[(a, b)] = i
    out, cur = [], int(history[-1])
    for _ in range(k):
        if cur not in succ:
            break
        nxt = max(succ[cur], key=lambda b: (succ[cur][b], last_seen[(cur, b)]))
        out.append(nxt)
        cur = nxt
    return out


class BigramDrafter(Drafter):
    """``method.name: custom`` with ``method.plugin`` naming this class."""

    name = "bigram"
    prefill_row_index = True

    def __init__(self, min_count: int = 1) -> None:
        self.min_count = int(min_count)

    @classmethod
    def from_spec(cls, spec, target, tokenizer, device, max_seq_len) -> "BigramDrafter":
        return cls()

    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Nothing to absorb: ``propose`` reads the history from ``batch.tokens``."""

    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        B = batch.batch_size
        tokens = np.zeros((B, num_steps), dtype=np.int64)
        valid = np.zeros(B, dtype=np.int64)
        seq = batch.seq_lens.tolist()
        active = batch.active.tolist()
        cap = batch.max_draft.tolist()
        hist = batch.tokens.cpu().numpy()
        for b in range(B):
            if active[b] and cap[b] > 0:
                cont = bigram_continuation(hist[b, :seq[b]], min(num_steps, cap[b]))
                tokens[b, :len(cont)] = cont
                valid[b] = len(cont)
        dev = batch.tokens.device
        return Proposal(tokens=torch.from_numpy(tokens).to(dev), num_valid=torch.from_numpy(valid).to(dev))

    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Nothing to update: the next ``propose`` sees the new history."""
