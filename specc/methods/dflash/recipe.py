"""The block drafter kinds of the training tool (:mod:`specc.train.kinds`): ``dflash``, ``dspark`` and
``pard``. One draft pass emits a whole block of γ drafts (DFlash, arXiv 2602.06036; DSpark; PARD,
arXiv 2504.18583): the mask-token objective is scored over every block position.

Objective (all kinds): for an anchor ``s`` of a sequence, block position ``j = 1..γ`` is labelled
with the target's greedy token ``labels[s + j - 1]``, valid while the sequence follows the target's
greedy chain (``tokens[s + m] == labels[s + m - 1]`` for every ``m < j``): always inside a
self-distilled answer, up to the first disagreement in a teacher-forced real-text passage. Loss:
cross-entropy over valid positions, position ``j`` weighted ``decay^(j-1)`` (later positions are
reached less often, DFlash's position-decayed loss). Agreement ``j`` = top-1 of position ``j`` equals
its label, over valid positions (what greedy verification accepts given the earlier drafts matched).

* ``dflash`` — :class:`specc.methods.dflash.model.BlockDraftModel` without heads: blocks ``[x_s, MASK × γ]``
  attend to the target context before ``s`` (many blocks per sequence in one pass, one mask).
* ``dspark`` — the same backbone plus a vanilla Markov head (teacher-forced: the bias at ``j`` comes
  from the true token at ``j - 1``) and a confidence head trained with binary cross-entropy on
  whether the corrected top-1 equals the label; an auxiliary cross-entropy on the base logits keeps
  the backbone a DFlash draft of its own (the "without the Markov head" ablation).
* ``pard`` — a shallow copy of the target (first ``layers`` decoder layers, final norm, tied
  head; the embedding and head frozen) reading ``[x_0..x_s, MASK × (γ - 1)]``: real tokens are causal,
  the masks of anchor ``s`` see the real tokens up to ``s`` and the earlier masks of their group.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from specc.train.kinds import DrafterKind


@dataclass
class BlockSeqs:
    """The block objective's view of a :class:`specc.train.data.SeqSet`: per sequence its first ``T``
    tokens and its ``T`` labels aligned (``tokens``/``labels`` int64 ``[P]``), ``offsets [n + 1]``,
    ``prompt_len [n]``, ``kinds`` (``distill`` / ``teacher``), ``feats {layer: fp16 [P, H]}``."""

    tokens: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    prompt_len: torch.Tensor
    kinds: List[str]
    feats: Dict[int, torch.Tensor]
    meta: List[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])

    def span(self, i: int):
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def subset(self, idx: Sequence[int]) -> "BlockSeqs":
        idx = list(idx)
        spans = [self.span(i) for i in idx]
        cat = lambda t: torch.cat([t[a:b] for a, b in spans]) if spans else t[:0]  # noqa: E731
        lengths = torch.tensor([b - a for a, b in spans], dtype=torch.int64)
        offsets = torch.zeros(len(idx) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        return BlockSeqs(cat(self.tokens), cat(self.labels), offsets, self.prompt_len[idx].clone(),
                         [self.kinds[i] for i in idx], {k: cat(v) for k, v in self.feats.items()},
                         [self.meta[i] for i in idx] if self.meta else [])

    @classmethod
    def of(cls, data) -> "BlockSeqs":
        """The view of ``data`` (cached on it): ``T + 1`` tokens per sequence become the first ``T``."""
        got = getattr(data, "_block_seqs", None)
        if got is not None:
            return got
        toks, labs, feats, lengths = [], [], {k: [] for k in data.feats}, []
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
        out = cls(torch.cat(toks) if toks else torch.zeros(0, dtype=torch.long),
                  torch.cat(labs) if labs else torch.zeros(0, dtype=torch.long), offsets, data.prompt_len.clone(),
                  [m.get("kind", "distill") for m in data.meta], {k: torch.cat(v) for k, v in feats.items()},
                  [dict(m) for m in data.meta])
        data._block_seqs = out
        return out


class BlockKind(DrafterKind):
    """Common part of the three kinds (see the module docstring). The objective's own methods take a
    :class:`BlockSeqs` (``_collate``); the protocol's ``collate`` converts the fit's ``SeqSet``.
    Anchors are drawn from torch's global generator, which :func:`specc.train.fit.fit` seeds."""

    name = ""
    title = ""
    options: Dict[str, object] = {}

    def unroll_steps(self, options: dict) -> int:
        return int(options["gamma"])

    def build(self, target, options, data, idx):
        target.requires_grad_(False)
        return self._build(target, options, BlockSeqs.of(data).subset(idx) if data is not None else None)

    def collate(self, model, data, idx: Sequence[int], options: dict, device) -> dict:
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,))))
        return self._collate(BlockSeqs.of(data), list(idx), options, device, gen)

    # ---- training vocabulary ------------------------------------------------------------------
    @staticmethod
    def train_vocab(data, size: int, vocab_size: int) -> torch.Tensor:
        """The ``size`` most frequent label tokens of ``data`` (sorted ids): training computes the
        softmax over these only (EAGLE-3's reduced draft vocabulary, used here for training cost
        alone: the shipped draft keeps the target's full LM head, and held-out agreement is measured
        over the full vocabulary). ``size`` 0: the full vocabulary."""
        if size <= 0 or size >= vocab_size:
            return torch.arange(vocab_size)
        counts = torch.bincount(data.labels, minlength=vocab_size)
        return torch.sort(torch.topk(counts, size).indices).values

    @staticmethod
    def restrict(batch: dict, vocab: torch.Tensor, vocab_size: int) -> dict:
        """``batch`` with labels mapped into ``vocab`` (positions whose label is outside it dropped)."""
        lut = torch.full((vocab_size,), -1, dtype=torch.int64, device=batch["labels"].device)
        lut[vocab] = torch.arange(len(vocab), device=lut.device)
        idx = lut[batch["labels"]]
        out = dict(batch)
        out["valid"] = batch["valid"] & (idx >= 0)
        out["labels"] = idx.clamp(min=0)
        return out

    # ---- anchors and labels -------------------------------------------------------------------
    @staticmethod
    def anchors(data, i: int, count: int, gamma: int, gen: torch.Generator, context: int):
        """``count`` anchor positions of sequence ``i`` (local indices, sorted) and the sequence's
        window start (the last ``context`` positions before the latest anchor are kept)."""
        a, b = data.span(i)
        T = b - a
        lo = max(1, int(data.prompt_len[i]) - 1)
        if lo >= T:
            lo = max(0, T - 1)
        n = T - lo
        pick = torch.randperm(n, generator=gen)[: min(count, n)] + lo
        pick = torch.sort(pick).values
        start = max(0, int(pick[-1]) - context + 1) if len(pick) else 0
        pick = pick[pick >= start]
        return pick, start

    @staticmethod
    def block_labels(tokens: torch.Tensor, labels: torch.Tensor, s: int, gamma: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Labels ``[γ]`` and validity ``[γ]`` of the block anchored at ``s`` (module docstring)."""
        T = tokens.shape[0]
        lab = torch.zeros(gamma, dtype=torch.int64)
        ok = torch.zeros(gamma, dtype=torch.bool)
        good = True
        for j in range(1, gamma + 1):
            t = s + j - 1
            if t >= T or not good or int(labels[t]) < 0:  # -1: the target's argmax was not recorded there
                break
            lab[j - 1] = labels[t]
            ok[j - 1] = True
            good = t + 1 < T and int(tokens[t + 1]) == int(labels[t])
        return lab, ok


class _BlockBackboneKind(BlockKind):
    """DFlash / DSpark (shared collate and backbone loss)."""

    def layers(self, target_config, options: dict) -> Tuple[int, ...]:
        return tuple(int(i) for i in options["target_layer_ids"])

    def _build(self, target, options: dict, train):
        from specc.methods.dflash.model import random_block_drafter

        rank = int(options.get("markov_rank", 0)) if self.name == "dspark" else 0
        model = random_block_drafter(
            target, kind=self.name, block_size=int(options["gamma"]) + 1, num_layers=int(options["num_layers"]),
            target_layer_ids=self.layers(target.config, options), mask_token_id=int(options["mask_token_id"]),
            markov_rank=rank, markov_head_type="vanilla" if rank else None,
            confidence_head=self.name == "dspark" and bool(options.get("confidence_head", True)),
            seed=int(options.get("init_seed", 0)), std=0.02)
        with torch.no_grad():
            if model.markov is not None:
                model.markov.w2.weight.zero_()  # start as a plain DFlash draft
        vocab = self.train_vocab(train, int(options.get("train_vocab", 0)), target.config.vocab_size)
        model._train_vocab = vocab
        model._head_weight = target.output.weight
        cover = float(torch.isin(train.labels, vocab).float().mean()) if train is not None else 1.0
        return model.train(), {"train_vocab": len(vocab), "train_vocab_label_coverage": round(cover, 4)}

    def _collate(self, data, idx: Sequence[int], options: dict, device, gen: torch.Generator) -> dict:
        gamma, A, ctx_len = int(options["gamma"]), int(options["anchors"]), int(options["context"])
        layers = [int(i) for i in options["target_layer_ids"]]
        rows = []
        for i in idx:
            a, b = data.span(i)
            pick, start = self.anchors(data, i, A, gamma, gen, ctx_len)
            tokens, labels = data.tokens[a:b], data.labels[a:b]
            blocks = []
            for s in pick.tolist():
                lab, ok = self.block_labels(tokens, labels, s, gamma)
                blocks.append((s, lab, ok))
            rows.append((a, start, b - a, blocks))
        B = len(rows)
        T = max(r[2] - r[1] for r in rows)
        Q = A * (gamma + 1)
        feats = torch.zeros(B, T, len(layers) * data.feats[layers[0]].shape[1])
        ctx_pos = torch.zeros(B, T, dtype=torch.int64)
        blk_ids = torch.full((B, Q), int(options["mask_token_id"]), dtype=torch.int64)
        blk_pos = torch.zeros(B, Q, dtype=torch.int64)
        mask = torch.zeros(B, Q, T + Q, dtype=torch.bool)
        mask[:, :, T:] = False
        lab = torch.zeros(B, A, gamma, dtype=torch.int64)
        ok = torch.zeros(B, A, gamma, dtype=torch.bool)
        prev = torch.zeros(B, A, gamma, dtype=torch.int64)  # token before each position (Markov input)
        for r, (a, start, T_i, blocks) in enumerate(rows):
            n = T_i - start
            feats[r, :n] = torch.cat([data.feats[k][a + start: a + T_i].float() for k in layers], dim=-1)
            ctx_pos[r, :n] = torch.arange(start, T_i)
            for bi, (s, lb, okb) in enumerate(blocks):
                q0 = bi * (gamma + 1)
                blk_ids[r, q0] = data.tokens[a + s]
                blk_pos[r, q0: q0 + gamma + 1] = torch.arange(s, s + gamma + 1)
                mask[r, q0: q0 + gamma + 1, : max(0, s - start)] = True  # context before the anchor
                mask[r, q0: q0 + gamma + 1, T + q0: T + q0 + gamma + 1] = True  # the whole block
                lab[r, bi], ok[r, bi] = lb, okb
                prev[r, bi, 0] = data.tokens[a + s]
                prev[r, bi, 1:] = lb[:-1]
            for bi in range(len(blocks), A):  # unused block slots: see themselves only
                q0 = bi * (gamma + 1)
                mask[r, q0: q0 + gamma + 1, T + q0: T + q0 + gamma + 1] = True
        return {k: v.to(device) for k, v in dict(feats=feats, ctx_pos=ctx_pos, blk_ids=blk_ids, blk_pos=blk_pos,
                                                    mask=mask, labels=lab, valid=ok, prev=prev).items()}

    def _hidden(self, model, batch: dict, gamma: int) -> torch.Tensor:
        ctx = model.context([batch["feats"]])
        h = model.forward_train(ctx, batch["ctx_pos"], batch["blk_ids"], batch["blk_pos"], batch["mask"])
        B, Q, H = h.shape
        return h.view(B, Q // (gamma + 1), gamma + 1, H)[:, :, 1:]  # [B, A, γ, H]

    @staticmethod
    def _weights(gamma: int, decay: float, device) -> torch.Tensor:
        return torch.tensor([decay ** j for j in range(gamma)], device=device)

    @staticmethod
    def _score(logits: torch.Tensor, batch: dict, w: torch.Tensor):
        """Weighted CE over valid positions, top-1 hits and counts per position."""
        valid = batch["valid"]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), reduction="none")
        ce = ce.view(valid.shape)
        wv = w.view(1, 1, -1) * valid
        loss = (ce * wv).sum() / wv.sum().clamp_min(1.0)
        hit = (logits.argmax(-1) == batch["labels"]) & valid
        return loss, hit.sum(dim=(0, 1)).float().tolist(), valid.sum(dim=(0, 1)).tolist(), hit

    def save(self, model, directory, target, extra_config=None) -> None:
        from specc.methods.dflash.model import save_block_drafter

        save_block_drafter(model, directory, dtype=torch.float16, target_config=target.config, extra_config=extra_config)

    def load(self, directory, target):
        from specc.methods.dflash.model import load_block_drafter

        return load_block_drafter(directory, target, expect_kind=self.name)


class DFlashKind(_BlockBackboneKind):
    name = "dflash"
    title = "DFlash block draft"
    options = {"gamma": 7, "num_layers": 1, "target_layer_ids": [1, 14, 27], "mask_token_id": 4, "anchors": 8,
               "context": 320, "decay": 0.8, "init_seed": 0, "train_vocab": 0}

    def loss(self, model, batch: dict, options: dict, train: bool):
        gamma = int(options["gamma"])
        h = self._hidden(model, batch, gamma)
        vocab = getattr(model, "_train_vocab", None) if train else None
        if vocab is not None and len(vocab) < model.cfg.vocab_size:
            batch = self.restrict(batch, vocab, model.cfg.vocab_size)
            logits = F.linear(h, model._head_weight[vocab])  # [B, A, γ, V_train]
        else:
            logits = model.logits(h)  # [B, A, γ, V]
        loss, hits, counts, _ = self._score(logits, batch, self._weights(gamma, float(options["decay"]), h.device))
        return loss, hits, counts


class DSparkKind(_BlockBackboneKind):
    name = "dspark"
    title = "DSpark block draft (vanilla Markov head, confidence head)"
    options = dict(DFlashKind.options, markov_rank=32, confidence_head=True, base_weight=0.5, confidence_weight=0.2)

    def loss(self, model, batch: dict, options: dict, train: bool):
        gamma = int(options["gamma"])
        h = self._hidden(model, batch, gamma)  # [B, A, γ, H]
        w = self._weights(gamma, float(options["decay"]), h.device)
        m = model.markov
        vocab = getattr(model, "_train_vocab", None) if train else None
        if vocab is not None and len(vocab) < model.cfg.vocab_size:
            batch = self.restrict(batch, vocab, model.cfg.vocab_size)
            base = F.linear(h, model._head_weight[vocab])
            bias = F.linear(m.w1(batch["prev"]), m.w2.weight[vocab])  # [B, A, γ, V_train]
        else:
            base = model.logits(h)
            bias = m.w2(m.w1(batch["prev"]))  # [B, A, γ, V] teacher-forced vanilla bias
        corrected = base + bias
        loss, hits, counts, hit = self._score(corrected, batch, w)
        if float(options["base_weight"]) > 0:
            base_loss = self._score(base, batch, w)[0]
            loss = loss + float(options["base_weight"]) * base_loss
        if model.confidence is not None:
            z = model.confidence.logit(h, m.feature(batch["prev"]))  # [B, A, γ]
            target = hit.float().detach()
            valid = batch["valid"]
            bce = F.binary_cross_entropy_with_logits(z, target, reduction="none")
            loss = loss + float(options["confidence_weight"]) * (bce * valid).sum() / valid.sum().clamp_min(1)
        return loss, hits, counts

    def confidence_pairs(self, model, batch: dict, options: dict):
        """Held-out ``(logit [N], accepted [N], position [N])`` of the confidence head at valid positions
        (for the per-position calibration)."""
        gamma = int(options["gamma"])
        h = self._hidden(model, batch, gamma)
        m = model.markov
        corrected = model.logits(h) + m.w2(m.w1(batch["prev"]))
        hit = (corrected.argmax(-1) == batch["labels"])
        z = model.confidence.logit(h, m.feature(batch["prev"]))
        pos = torch.arange(gamma, device=z.device).view(1, 1, -1).expand_as(z)
        v = batch["valid"]
        return z[v], hit[v].float(), pos[v]


    def finish(self, model, target, held_out, options: dict) -> dict:
        """Calibrate the confidence head per block position on held-out (logit, accepted) pairs."""
        if model.confidence is None or held_out is None:
            return {}
        return {"confidence_calibration": calibrate_confidence(self, model, BlockSeqs.of(held_out), options)}


@torch.no_grad()
def calibrate_confidence(kind: DSparkKind, model, data: BlockSeqs, options: dict, seed: int = 7) -> List[List[float]]:
    """Fit ``sigmoid(a_j * z + b_j)`` per block position ``j`` on the confidence head's logits ``z`` and
    whether that position's corrected top-1 matched its label (Platt scaling, 1999: LBFGS on the
    log-loss, at least 20 pairs per position, else the identity ``(1, 0)``); writes the ``[γ, 2]``
    table into ``model.confidence.calibration`` and returns it. DSpark's confidence head is
    calibrated against acceptance so the budget schedule can rank draft slots by survival."""
    was = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    zs, ys, ps = [], [], []
    for b0 in range(0, len(data), 8):
        bt = kind._collate(data, list(range(b0, min(len(data), b0 + 8))), options, "cpu", gen)
        z, y, p = kind.confidence_pairs(model, bt, options)
        zs.append(z)
        ys.append(y)
        ps.append(p)
    z, y, p = torch.cat(zs).float(), torch.cat(ys).float(), torch.cat(ps)
    out = []
    for j in range(int(options["gamma"])):
        sel = p == j
        a = torch.tensor(1.0, requires_grad=True)
        b = torch.tensor(0.0, requires_grad=True)
        if int(sel.sum()) >= 20:
            with torch.enable_grad():
                opt = torch.optim.LBFGS([a, b], lr=0.5, max_iter=200)

                def closure():
                    opt.zero_grad()
                    loss = F.binary_cross_entropy_with_logits(a * z[sel] + b, y[sel])
                    loss.backward()
                    return loss
                opt.step(closure)
        out.append([float(a), float(b)])
    model.confidence.calibration.copy_(torch.tensor(out))
    model.train(was)
    return out


class PardKind(BlockKind):
    name = "pard"
    title = "PARD parallel draft model (shallow SmolLM2 trained for mask tokens)"
    options = {"gamma": 7, "draft_layers": 4, "mask_token_id": 4, "anchors": 8, "context": 320, "decay": 0.8,
               "train_vocab": 0}

    def layers(self, target_config, options: dict) -> Tuple[int, ...]:
        return ()

    def _build(self, target, options: dict, train):
        from specc.runtime.testing import shallow_copy

        draft = shallow_copy(target, int(options["draft_layers"]))
        for name, p in draft.named_parameters():
            p.requires_grad_(not (name.startswith("output.") or name == "embed_tokens"))
        vocab = self.train_vocab(train, int(options.get("train_vocab", 0)), target.config.vocab_size)
        draft._train_vocab = vocab
        draft._mask_token_id = int(options["mask_token_id"])
        cover = float(torch.isin(train.labels, vocab).float().mean()) if train is not None else 1.0
        return draft.train(), {"train_vocab": len(vocab), "train_vocab_label_coverage": round(cover, 4)}

    def _collate(self, data, idx: Sequence[int], options: dict, device, gen: torch.Generator) -> dict:
        gamma, A, ctx_len = int(options["gamma"]), int(options["anchors"]), int(options["context"])
        mask_id = int(options["mask_token_id"])
        rows = []
        for i in idx:
            a, b = data.span(i)
            pick, start = self.anchors(data, i, A, gamma, gen, ctx_len)
            tokens, labels = data.tokens[a:b], data.labels[a:b]
            rows.append((a, start, b - a, [(s,) + self.block_labels(tokens, labels, s, gamma) for s in pick.tolist()]))
        B = len(rows)
        T = max(r[2] - r[1] for r in rows)
        M = A * (gamma - 1)
        N = T + M
        ids = torch.full((B, N), mask_id, dtype=torch.int64)
        pos = torch.zeros(B, N, dtype=torch.int64)
        mask = torch.zeros(B, N, N, dtype=torch.bool)
        out_idx = torch.zeros(B, A, gamma, dtype=torch.int64)  # column whose output predicts block position j
        lab = torch.zeros(B, A, gamma, dtype=torch.int64)
        ok = torch.zeros(B, A, gamma, dtype=torch.bool)
        for r, (a, start, T_i, blocks) in enumerate(rows):
            n = T_i - start
            ids[r, :n] = data.tokens[a + start: a + T_i]
            pos[r, :n] = torch.arange(start, T_i)
            mask[r, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
            mask[r, n:T, n:T] = torch.eye(T - n, dtype=torch.bool)
            for bi, (s, lb, okb) in enumerate(blocks):
                c0 = T + bi * (gamma - 1)
                ls = s - start  # local column of the anchor
                out_idx[r, bi, 0] = ls
                for m in range(gamma - 1):
                    c = c0 + m
                    pos[r, c] = s + 1 + m
                    mask[r, c, : ls + 1] = True
                    mask[r, c, c0: c + 1] = True
                    out_idx[r, bi, m + 1] = c
                lab[r, bi], ok[r, bi] = lb, okb
            for bi in range(len(blocks), A):
                c0 = T + bi * (gamma - 1)
                for m in range(gamma - 1):
                    mask[r, c0 + m, c0 + m] = True
        return {k: v.to(device) for k, v in dict(ids=ids, pos=pos, mask=mask, out_idx=out_idx, labels=lab,
                                                    valid=ok).items()}

    def loss(self, model, batch: dict, options: dict, train: bool):
        gamma = int(options["gamma"])
        h = train_forward(model, batch["ids"], batch["pos"], batch["mask"])  # [B, N, H] final-norm
        B, A, G = batch["out_idx"].shape
        sel = h.gather(1, batch["out_idx"].view(B, A * G, 1).expand(B, A * G, h.shape[-1])).view(B, A, G, -1)
        vocab = getattr(model, "_train_vocab", None) if train else None
        if vocab is not None and len(vocab) < model.config.vocab_size:
            batch = self.restrict(batch, vocab, model.config.vocab_size)
            logits = F.linear(sel, model.output.weight[vocab])
        else:
            logits = model.lm_head(sel)
        loss, hits, counts, _ = _BlockBackboneKind._score(logits, batch, _BlockBackboneKind._weights(gamma, float(options["decay"]), h.device))
        return loss, hits, counts

    def save(self, model, directory, target, extra_config=None) -> None:
        """The HF layout of a shallow draft (fp16) with the PARD mask token in ``config.json``
        (``pard_token``) and the target's tokenizer (``target.tokenizer`` when the fit attached it);
        the trained tensors also go to ``layers.safetensors``, the committed part
        (:mod:`specc.methods.dflash.pard_assets`: the frozen embedding is the target's own)."""
        from specc.methods.draft_model.shallow import write_shallow
        from specc.methods.dflash import pard_assets
        import json
        import pathlib

        m = copy.deepcopy(model).eval()
        write_shallow(m, getattr(target, "tokenizer", None), m.config.num_layers, pathlib.Path(directory),
                      source="specc train (pard)")
        cfg_path = pathlib.Path(directory) / "config.json"
        cfg = json.loads(cfg_path.read_text())
        extra_config = dict(extra_config or {})
        cfg["pard_token"] = int(extra_config.pop("mask_token_id", getattr(model, "_mask_token_id", 4)))
        cfg.update(extra_config or {})
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        pard_assets.split(pathlib.Path(directory), keep=True)

    def load(self, directory, target):
        from specc.models import load_target

        return load_target(str(directory), "hf")[0]


def train_forward(model, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Differentiable forward of a :class:`specc.models.llama.LlamaModel`'s weights over ``ids [B, N]``
    at ``positions [B, N]`` under ``mask [B, N, N]`` (True = attend, among the N inputs; no cache).
    Returns the final-norm hidden states ``[B, N, H]`` (the same maths as ``LlamaModel.forward``)."""
    from specc.models.llama import rope_inv_freq

    c = model.config
    B, N = ids.shape
    x = model.embed(ids)
    inv = rope_inv_freq(c).to(x.device)
    ang = positions.float()[:, :, None] * inv[None, None, :]  # [B, N, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]  # [B, 1, N, D]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    g = c.num_heads // c.num_kv_heads
    D = c.head_dim

    def rope(t):
        half = D // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

    for layer in model.layers:
        h = layer.attn_norm(x)
        qkv = F.linear(h, layer.attn.wqkv.weight, layer.attn.wqkv.bias)
        q, k, v = qkv.split((c.q_size, c.kv_size, c.kv_size), dim=-1)
        q = rope(q.view(B, N, c.num_heads, D).transpose(1, 2))
        k = rope(k.view(B, N, c.num_kv_heads, D).transpose(1, 2)).repeat_interleave(g, dim=1)
        v = v.view(B, N, c.num_kv_heads, D).transpose(1, 2).repeat_interleave(g, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        x = x + F.linear(o.transpose(1, 2).reshape(B, N, c.q_size), layer.attn.wo.weight)
        h = layer.ffn_norm(x)
        gate, up = F.linear(h, layer.ffn.w13.weight).split(c.intermediate_size, dim=-1)
        x = x + F.linear(F.silu(gate) * up, layer.ffn.w2.weight)
    return model.norm(x)
