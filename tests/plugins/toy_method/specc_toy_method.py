"""A third-party draft method for the tests: ``method.name: repeat``.

The whole method is this module plus its ``specc.methods`` entry point (the ``*.dist-info`` next to
it; a real package declares it in its ``pyproject.toml`` under
``[project.entry-points."specc.methods"]``): one :class:`specc.methods.Method` row, :data:`REPEAT`,
whose runtime factory builds :class:`RepeatDrafter`. Nothing in specc names it.

The drafter is a host lookup, no model: when a row's history ends in a block of ``n`` tokens that
repeats the ``n`` before it (the smallest such ``n`` in ``1..max_period``, 16 by default), it proposes that block
again, cyclically, for up to κ tokens; otherwise it proposes nothing. Drafts are one-hot (greedy
verification, or rejection sampling with q = 1 on the proposal, exact either way).
"""
from __future__ import annotations

import numpy as np
import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep
from specc.methods import Method, RuntimeSupport


def repeat_continuation(history: np.ndarray, k: int, max_period: int = 16) -> list:
    """Up to ``k`` tokens continuing ``history [L]`` (int) by repeating its last period: the smallest
    ``n <= max_period`` with ``history[-n:] == history[-2n:-n]``; ``[]`` when there is none."""
    L = len(history)
    for n in range(1, max_period + 1):
        if 2 * n <= L and np.array_equal(history[L - n:], history[L - 2 * n:L - n]):
            block = [int(t) for t in history[L - n:]]
            return [block[i % n] for i in range(k)]
    return []


class RepeatDrafter(Drafter):
    """The runtime drafter of ``method.name: repeat`` (the drafter protocol of specc.methods.base)."""

    name = "repeat"
    prefill_row_index = True

    def __init__(self, max_period: int = 16) -> None:
        self.max_period = int(max_period)

    @classmethod
    def from_spec(cls, spec, target, tokenizer, device, max_seq_len) -> "RepeatDrafter":
        return cls()

    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Nothing to absorb: ``propose`` reads the history from ``batch.tokens``."""

    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """``tokens [B, num_steps]`` int64 and ``num_valid [B]`` int64 on the batch's device."""
        B = batch.batch_size
        tokens = np.zeros((B, num_steps), dtype=np.int64)
        valid = np.zeros(B, dtype=np.int64)
        seq, active, cap = batch.seq_lens.tolist(), batch.active.tolist(), batch.max_draft.tolist()
        hist = batch.tokens.cpu().numpy()
        for b in range(B):
            if active[b] and cap[b] > 0:
                cont = repeat_continuation(hist[b, :seq[b]], min(num_steps, cap[b]), self.max_period)
                tokens[b, :len(cont)] = cont
                valid[b] = len(cont)
        dev = batch.tokens.device
        return Proposal(tokens=torch.from_numpy(tokens).to(dev), num_valid=torch.from_numpy(valid).to(dev))

    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Nothing to update: the next ``propose`` sees the new history."""


def build_drafter(spec, target, tokenizer, device, max_seq_len) -> RepeatDrafter:
    """The runtime factory :attr:`REPEAT.runtime.drafter` names."""
    return RepeatDrafter.from_spec(spec, target, tokenizer, device, max_seq_len)


#: The method's row: a lookup (no draft model, no KV, no hidden states), run by specc's runtime as a
#: chain; neither SGLang nor vLLM has it (``sglang_algorithm`` / ``vllm_method`` None).
REPEAT = Method(
    "repeat", "repeat the history's last period (a test plugin method; no model)", "lookup",
    needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0, seed="none",
    default_num_steps=4,
    runtime=RuntimeSupport(drafter="specc_toy_method:build_drafter", verify_rules=("greedy", "standard"),
                           schedules=("static",), confidence="online", shapes=("plain", "chain")))
