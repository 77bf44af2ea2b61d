"""Draft and training vocabularies from label counts (EAGLE-3's reduced draft vocabulary with its
``d2t`` / ``t2d`` maps, Li et al. 2025, arXiv 2503.01840; the training softmax over the most frequent
labels that the EAGLE and Medusa kinds use). Shared by every drafter kind that needs one.
"""
from __future__ import annotations

import torch


def label_counts(data, V: int, idx=None) -> torch.Tensor:
    """How often each target id is an answer label in sequences ``idx`` (default all) of ``data`` (a
    ``SeqSet``): ``[V]`` int64."""
    counts = torch.zeros(V, dtype=torch.long)
    for i in (range(len(data)) if idx is None else idx):
        _, lab, _ = data.seq(i, int(data.prompt_len[i]) - 1)
        lab = lab[lab >= 0]
        counts += torch.bincount(lab, minlength=V)
    return counts


def top_vocab(counts: torch.Tensor, size: int):
    """The ``size`` most frequent ids (sorted) -> ``ids [Vd]``, ``d2t [Vd]`` (target = draft + d2t),
    ``t2d [V]`` bool and the fraction of ``counts`` they cover."""
    top = torch.topk(counts, size).indices.sort().values
    t2d = torch.zeros(counts.shape[0], dtype=torch.bool)
    t2d[top] = True
    return top, top - torch.arange(size), t2d, float(counts[top].sum()) / max(1.0, float(counts.sum()))
