"""Online target features: the target's forward runs inside the fit loop (SpecForge's "online"
mode), so the committed data are token ids (:mod:`specc.train.shards`) and no hidden-state files
are ever written.

:class:`OnlineFeatures` turns sequences of a :class:`specc.train.shards.TokenSet` into the in-memory
:class:`specc.train.data.SeqSet` the drafter kinds collate from: per sequence ``tokens [T+1]``,
``labels [T]`` and ``feats {layer: [T, H] fp16}`` for the layers the kind reads (``layer <
num_layers``: that decoder layer's output before the final norm; ``num_layers``: the final-norm
output, ``specc.models.llama``'s convention).

Labels: in a self-distilled sequence (``kind: distill``) every answer token *is* the target's argmax
after the tokens before it (greedy decoding emitted it), so the label of position ``t >= P - 1`` is
token ``t + 1`` and no LM head runs; in a teacher-forced real-text sequence (``kind: teacher``) the
label is the target's argmax at that position, computed here from the final-norm output. Prompt
positions before the last one are ``-1`` (no label).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

from specc.train import data as D
from specc.train.shards import TokenSet


def label_seqset(tokens: TokenSet, idx: Sequence[int]) -> D.SeqSet:
    """Sequences ``idx`` without features (``feats`` empty): what a kind's ``build`` needs to count
    labels (a draft vocabulary). Teacher-forced sequences get no labels (``-1``): their argmax is only
    known after a target forward."""
    toks, labs, lengths, plen, meta = [], [], [], [], []
    for i in idx:
        s = torch.from_numpy(np.asarray(tokens.seqs[i], dtype=np.int64))
        P, T = tokens.prompt_len[i], len(tokens.seqs[i]) - 1
        lab = torch.full((T,), -1, dtype=torch.long)
        if tokens.meta[i]["kind"] == "distill":
            lab[P - 1:] = s[P:]
        toks.append(s)
        labs.append(lab)
        lengths.append(T)
        plen.append(P)
        meta.append(tokens.meta[i])
    return _assemble(toks, labs, lengths, plen, {}, meta)


def _assemble(toks, labs, lengths, plen, feats, meta) -> D.SeqSet:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return D.SeqSet(torch.cat(toks) if toks else torch.zeros(0, dtype=torch.long),
                    torch.cat(labs) if labs else torch.zeros(0, dtype=torch.long), offsets,
                    torch.tensor(plen, dtype=torch.int64), feats, list(meta))


class OnlineFeatures:
    """The target's hidden states at ``layers`` over token sequences, computed on demand.

    Args:
        target: a :class:`specc.models.llama.LlamaModel` (its dtype is the features' compute dtype:
            load it in the dtype :func:`specc.device.pick_dtype` chose).
        layers: target layers to record (``0..num_layers``, see the module docstring).
        max_batch_tokens: at most this many padded tokens (rows x longest row) per target forward.
    """

    def __init__(self, target, layers: Sequence[int], max_batch_tokens: int = 8192):
        self.target = target
        if hasattr(target, "set_fast_attention"):  # bulk forwards: no row invariance needed (faster)
            target.set_fast_attention(True)
        self.layers = tuple(int(x) for x in layers)
        self.max_batch_tokens = int(max_batch_tokens)
        self.positions = 0  # target positions run so far (cost accounting)

    @torch.inference_mode()
    def seqset(self, tokens: TokenSet, idx: Sequence[int], context: Optional[int] = None) -> D.SeqSet:
        """Sequences ``idx`` of ``tokens`` with labels and features (fp16, on the CPU).
        ``context``: keep only the last ``context`` prompt positions of each sequence (the attention
        context a drafter is trained with; the target itself always reads the whole sequence)."""
        from specc.models.llama import pad_prompts

        model = self.target
        L = model.config.num_layers
        need_final = L in self.layers or any(tokens.meta[i]["kind"] != "distill" for i in idx)
        ask = tuple(sorted({L - 1 if x == L else x for x in self.layers} | ({L - 1} if need_final else set())))
        dev = model.norm.weight.device
        order = sorted(idx, key=lambda i: len(tokens.seqs[i]))
        groups: List[List[int]] = []
        for i in order:
            if groups and (len(groups[-1]) + 1) * len(tokens.seqs[i]) <= self.max_batch_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
        rec = {}
        for g in groups:
            seqs = [tokens.seqs[i].tolist() for i in g]
            ids, pos, lengths = pad_prompts(seqs, device=dev)
            B, N = ids.shape
            model.release_cache()  # a cache of exactly this batch's shape (not the largest ever seen)
            model.setup_cache(B, N)
            _, hidden = model(ids, pos, hidden_layers=ask, logits_at=torch.zeros(B, 1, dtype=torch.long, device=dev))
            self.positions += int(lengths.sum())
            by = dict(zip(ask, hidden))
            final = model.norm(by[L - 1]) if need_final else None  # [B, N, H]
            for b, i in enumerate(g):
                T = int(lengths[b]) - 1  # positions 0..T-1 predict tokens 1..T
                P = tokens.prompt_len[i]
                s = ids[b, : T + 1].cpu()
                lab = torch.full((T,), -1, dtype=torch.long)
                if tokens.meta[i]["kind"] == "distill":
                    lab[P - 1:] = s[P:]
                else:
                    lab[P - 1:] = model.lm_head(final[b, P - 1: T]).argmax(-1).cpu()
                f = {x: (final[b, :T] if x == L else by[x][b, :T]).to(torch.float16).cpu() for x in self.layers}
                rec[i] = (s, lab, T, P, f)
        toks, labs, lengths_, plen, meta = [], [], [], [], []
        feats = {x: [] for x in self.layers}
        for i in idx:
            s, lab, T, P, f = rec[i]
            cut = max(0, P - int(context)) if context is not None else 0
            toks.append(s[cut:])
            labs.append(lab[cut:])
            lengths_.append(T - cut)
            plen.append(P - cut)
            meta.append(tokens.meta[i])
            for x in self.layers:
                feats[x].append(f[x][cut:])
        return _assemble(toks, labs, lengths_, plen, {x: torch.cat(v) for x, v in feats.items()}, meta)
