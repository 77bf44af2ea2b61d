"""The block drafter kinds (``dflash``, ``dspark``, ``pard``) in the drafter training tool's registry.

Each adapter is the matching kind of :mod:`specc.blocktrain.kinds` (objective, masks, layouts: see
there) behind this tool's protocol: ``collate(model, data, idx, options, device)`` reads this tool's
:class:`specc.train.data.SeqSet` (``T + 1`` tokens and ``T`` labels per sequence, ``-1`` labels where
the target's argmax was not recorded), converted once per data set into the block trainer's layout
(``T`` tokens and ``T`` labels; a ``-1`` label ends every block that reaches it). Anchors are drawn
from torch's global generator, which :func:`specc.train.fit.fit` seeds.

So ``specc train fit smollm2_135m_dflash`` trains a DFlash draft on the tool's distillation data
(its recipe names target layers the data records: EAGLE-3's low/middle/high layers 1, 14, 26).
"""
from __future__ import annotations

from typing import Sequence

import torch

from specc.blocktrain import data as bdata
from specc.blocktrain import kinds as bkinds
from specc.train.kinds import DrafterKind, register

def block_seqset(data) -> bdata.SeqSet:
    """This tool's SeqSet as the block trainer's (cached per data set): per sequence the first ``T``
    tokens, the ``T`` labels and features, ``prompt_len`` and its kind."""
    got = getattr(data, "_block_seqset", None)
    if got is not None:
        return got
    toks, labs, feats = [], [], {k: [] for k in data.feats}
    lengths = []
    for i in range(len(data)):
        t, lab, f = data.seq(i)
        T = int(lab.shape[0])
        toks.append(t[:T].long())
        labs.append(lab.long())
        for k in feats:
            feats[k].append(f[k])
        lengths.append(T)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    out = bdata.SeqSet(torch.cat(toks), torch.cat(labs), offsets, data.prompt_len.clone(),
                       [m.get("kind", "distill") for m in data.meta], {k: torch.cat(v) for k, v in feats.items()},
                       [dict(m) for m in data.meta])
    data._block_seqset = out
    return out


class _Block(DrafterKind):
    impl: bkinds.BlockKind

    def __init__(self):
        self.options = dict(self.impl.options)

    def layers(self, target_config, options):
        return tuple(self.impl.layers(target_config, options))

    def unroll_steps(self, options):
        return int(options["gamma"])

    def build(self, target, options, data, idx):
        target.requires_grad_(False)
        train = block_seqset(data).subset(idx) if data is not None else None
        return self.impl.build(target, options, train)

    def collate(self, model, data, idx: Sequence[int], options: dict, device) -> dict:
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,))))
        return self.impl.collate(block_seqset(data), list(idx), options, device, gen)

    def loss(self, model, batch, options, train: bool):
        return self.impl.loss(model, batch, options, train)

    def save(self, model, directory, target):
        self.impl.save(model, directory, target)

    def load(self, directory, target):
        return self.impl.load(directory, target)


@register
class DFlash(_Block):
    name = "dflash"
    title = "DFlash block draft"
    impl = bkinds.get("dflash")


@register
class DSpark(_Block):
    name = "dspark"
    title = "DSpark block draft (Markov head, confidence head)"
    impl = bkinds.get("dspark")


@register
class Pard(_Block):
    name = "pard"
    title = "PARD parallel draft model"
    impl = bkinds.get("pard")
