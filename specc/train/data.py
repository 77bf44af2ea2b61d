"""Sequences in memory with the target's labels and features: what a drafter kind collates from.

A :class:`SeqSet` holds ``n`` sequences with lengths ``T_i`` (positions with a label), ``P = sum
T_i``: ``tokens`` int64 ``[P + n]`` (sequence ``i`` is ``T_i + 1`` tokens: prompt, answer, and the
token after the last labelled position), ``labels`` int64 ``[P]`` (the target's argmax at each
position, what it emits next; ``-1`` where there is none: prompt positions before the last one),
``offsets`` int64 ``[n + 1]`` (sequence ``i`` holds positions ``offsets[i]:offsets[i+1]`` of
``labels`` and the features, and ``offsets[i] + i`` onwards of ``tokens``), ``prompt_len`` int64
``[n]`` and ``feats {layer: fp16 [P, H]}``: target hidden states, ``layer < L`` the output of decoder
layer ``layer``, ``layer == L`` the final-norm output (``specc.models.llama``).

Sets are made by :mod:`specc.train.features` from token shards (:mod:`specc.train.shards`): the
features online, one batch at a time, never stored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import torch


@dataclass
class SeqSet:
    """Sequences of one or more shards in memory, only the feature layers asked for.

    ``tokens`` int64 ``[P + n]``, ``labels`` int64 ``[P]``, ``offsets`` int64 ``[n + 1]``,
    ``prompt_len`` int64 ``[n]``, ``feats {layer: fp16 [P, H]}``, ``meta``: per sequence ``{id,
    category, source, kind, finished}``; ``parts``: the shards' sidecars (without the per-sequence lists).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    prompt_len: torch.Tensor
    feats: Dict[int, torch.Tensor]
    meta: List[dict]
    parts: List[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])

    def length(self, i: int) -> int:
        """Labelled positions ``T_i`` of sequence ``i``."""
        return int(self.offsets[i + 1] - self.offsets[i])

    def seq(self, i: int, start: int = 0):
        """Sequence ``i`` from position ``start``: ``tokens [T-start+1]``, ``labels [T-start]``,
        ``feats {layer: [T-start, H]}`` (views)."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return (self.tokens[a + i + start: b + i + 1], self.labels[a + start: b],
                {k: v[a + start: b] for k, v in self.feats.items()})

    def answer_positions(self) -> int:
        return int(sum(self.length(i) - int(self.prompt_len[i]) + 1 for i in range(len(self))))

    def subset(self, idx: Sequence[int]) -> "SeqSet":
        """A new set of sequences ``idx`` (copies)."""
        idx = list(idx)
        lengths = [self.length(i) for i in idx]
        offsets = torch.zeros(len(idx) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        toks, labs = [], []
        feats = {k: [] for k in self.feats}
        for i in idx:
            t, lab, f = self.seq(i)
            toks.append(t)
            labs.append(lab)
            for k in feats:
                feats[k].append(f[k])
        return SeqSet(torch.cat(toks) if toks else self.tokens[:0], torch.cat(labs) if labs else self.labels[:0],
                      offsets, self.prompt_len[idx].clone(),
                      {k: (torch.cat(v) if v else self.feats[k][:0]) for k, v in feats.items()},
                      [self.meta[i] for i in idx], self.parts)
