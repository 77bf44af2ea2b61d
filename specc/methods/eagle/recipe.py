"""EAGLE and EAGLE-3 drafter kinds for the training tool (see :mod:`specc.train.kinds`).

Objectives (facts from the papers; our own code):

* **EAGLE** (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"):
  regression of the next target feature (smooth-L1) plus ``ce_weight`` x token cross-entropy through
  the target's LM head, with uniform feature noise; here the softmax runs over the ``train_vocab``
  most frequent answer labels (the full LM head at inference).
* **EAGLE-3** (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
  via Training-Time Test"): token cross-entropy only, over a reduced draft vocabulary (``d2t`` /
  ``t2d``), with the *training-time test*: the head is unrolled ``ttt_steps`` times on its own
  outputs and every step is scored, weights ``step_decay^k``.

Both kinds unroll as :func:`ttt_forward` does: step ``k`` of the chain that starts after position
``p`` attends to the step-0 keys of positions ``<= p`` and to its own chain's keys, exactly what draft
step ``k`` sees at inference (``tests/methods/test_eagle.py`` checks the equality against the runtime head).
The label of every step is the target's argmax (self-distillation data, :mod:`specc.train.distill`).
"""
from __future__ import annotations

import math
import pathlib
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from specc.methods.eagle.model import EagleConfig, EagleModel, default_aux_layer_ids
from specc.train.kinds import DrafterKind
from specc.train.vocab import label_counts, top_vocab


# ------------------------------------------------------------------------------------ shared maths
def ttt_forward(model: EagleModel, tokens: torch.Tensor, feats: torch.Tensor, steps: int,
                noise: float = 0.0, sel: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """Unrolled training forward (training-time test). ``tokens [B, T+1]`` int64, ``feats [B, T, F]`` fp32.

    Step ``k`` at index ``p`` is the chain started after position ``p``: draft position ``p + k``, token
    ``x[p+k+1]``, feature = step ``k-1``'s output at ``p`` (the target feature for ``k = 0``). Its query
    sees step-0 keys at indices ``<= p`` and the keys of steps ``1..k`` at ``p``: what a query of draft
    step ``k`` sees at inference (extend keys up to the chain start, then its own chain).

    ``sel [B, A]`` int64 (default: every index, ``A = T``) are the chain starts to compute: step-0
    keys/values are computed at every index (every chain attends to them), everything else (queries,
    attention output, MLP, later steps) only at ``sel``. Returns the step outputs ``g_k [B, A, H]``.
    """
    cfg = model.cfg
    layer = model.layer
    attn = layer.self_attn
    B, T, _ = feats.shape
    dev = feats.device
    h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = h // kvh
    if sel is None:
        sel = torch.arange(T, device=dev)[None].expand(B, T)
    A = sel.shape[1]

    def take(x, idx):  # x [B, T, ...] at idx [B, A] -> [B, A, ...]
        return torch.gather(x, 1, idx.view(B, A, *([1] * (x.dim() - 2))).expand(B, A, *x.shape[2:]))

    hidden = feats
    if noise > 0:
        hidden = hidden + (torch.rand_like(hidden) - 0.5) * 2 * noise
    emb0 = model._embed(tokens[:, 1: T + 1]).float()  # [B,T,H]
    if cfg.kind == "eagle":
        residual0 = attn_in0 = model.fc(torch.cat([emb0, hidden], -1))  # [B,T,H]
    else:
        residual0 = model.fc(hidden)  # [B,T,H]
        attn_in0 = torch.cat([layer.input_layernorm(emb0), layer.hidden_norm(residual0)], -1)  # [B,T,2H]
    _, k0, v0 = attn.project(attn_in0, torch.arange(T, device=dev)[None].expand(B, T))  # [B,kv,T,d]
    k0 = k0.repeat_interleave(rep, 1)  # [B,h,T,d]
    v0 = v0.repeat_interleave(rep, 1)
    visible = torch.arange(T, device=dev)[None, None, :] <= sel[:, :, None]  # [B,A,T]
    scale = 1.0 / math.sqrt(d)
    chain_k, chain_v, outs = [], [], []
    g_prev = None
    for k in range(steps):
        if k == 0:
            attn_in, residual = take(attn_in0, sel), take(residual0, sel)  # [B,A,*]
        else:
            tok = torch.gather(tokens, 1, (sel + k + 1).clamp(max=tokens.shape[1] - 1))  # [B,A]
            emb = model._embed(tok).float()
            if cfg.kind == "eagle":
                residual = attn_in = model.fc(torch.cat([emb, g_prev], -1))
            else:
                residual = g_prev
                attn_in = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(residual)], -1)
        q, kk, vv = attn.project(attn_in, sel + k)  # q [B,h,A,d], kk/vv [B,kv,A,d]
        if k > 0:
            chain_k.append(kk.repeat_interleave(rep, 1))
            chain_v.append(vv.repeat_interleave(rep, 1))
        s0 = (q @ k0.transpose(-1, -2)) * scale  # [B,h,A,T]
        s0 = s0.masked_fill(~visible[:, None], float("-inf"))
        diag = [((q * ck).sum(-1) * scale)[..., None] for ck in chain_k]  # [B,h,A,1] each
        scores = torch.cat([s0] + diag, -1).float().softmax(-1)  # fp32 softmax under autocast
        o = scores[..., :T] @ v0  # [B,h,A,d]
        for i, cv in enumerate(chain_v):
            o = o + scores[..., T + i: T + i + 1] * cv
        o = attn.o_proj(o.transpose(1, 2).reshape(B, A, h * d))
        hmid = residual + o
        g = hmid + layer.mlp(layer.post_attention_layernorm(hmid))  # [B,A,H]
        outs.append(g)
        g_prev = g
    return outs


def loss_positions(labels: torch.Tensor):
    """Chain starts with a loss: per row the contiguous answer range of ``labels [B, T]`` (``-100`` =
    none), as ``sel [B, A]`` int64 (step 0 at ``p`` predicts ``labels[p + 1]``) and ``valid [B, A]`` bool."""
    B, T = labels.shape
    dev = labels.device
    has = torch.zeros(B, T, dtype=torch.bool, device=dev)
    has[:, : T - 1] = labels[:, 1:] >= 0
    first = torch.where(has.any(1), has.float().argmax(1), torch.zeros(B, dtype=torch.long, device=dev))  # [B]
    count = has.sum(1)  # [B]
    A = max(1, int(count.max()))
    j = torch.arange(A, device=dev)[None]
    sel = (first[:, None] + j).clamp(max=T - 1)
    return sel, j < count[:, None]


class _EagleBase(DrafterKind):
    """What EAGLE and EAGLE-3 share: collate, the unrolled loss, checkpoint I/O."""

    def check_options(self, options: dict, source: str) -> dict:
        """Defaults filled in and ranges checked; ``SpeccError`` naming the option and its allowed range."""
        from specc.errors import SpeccError

        out = super().check_options(options, source)
        checks = {"ttt_steps": lambda v: isinstance(v, int) and v >= 1,
                  "step_decay": lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
                  "noise": lambda v: isinstance(v, (int, float)) and v >= 0,
                  "draft_vocab": lambda v: isinstance(v, int) and v >= 1,
                  "train_vocab": lambda v: isinstance(v, int) and v >= 1,
                  "ce_weight": lambda v: isinstance(v, (int, float)) and v >= 0,
                  "soft_labels": lambda v: isinstance(v, bool),
                  "aux_layers": lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) == 3
                                                        and all(isinstance(i, int) and i >= 0 for i in v))}
        allowed = {"ttt_steps": "an integer >= 1", "step_decay": "in (0, 1]", "noise": ">= 0",
                   "draft_vocab": "an integer >= 1 (at most the target's vocabulary)", "train_vocab": "an integer >= 1",
                   "ce_weight": ">= 0", "soft_labels": "true or false",
                   "aux_layers": "null or three target layer ids, low to high"}
        for k, ok in checks.items():
            if k in out and not ok(out[k]):
                raise SpeccError(f"{source}: options.{k}={out[k]!r} for drafter kind {self.name!r} must be {allowed[k]}")
        return out

    def unroll_steps(self, options):
        return int(options["ttt_steps"])

    def collate(self, model, data, idx: Sequence[int], options: dict, device) -> dict:
        """Right-padded batch of sequences ``idx``: ``tokens [B, T+1]``, ``labels [B, T]`` (``-100`` = no
        loss: prompt positions and padding), ``feats [B, T, F]`` fp32, on ``device``. Data sets loaded
        with a context limit already hold only the last prompt positions."""
        tr = model.train_state
        layers = tr["layers"]
        lens = [data.length(i) for i in idx]
        T, B = max(lens), len(idx)
        F_ = sum(data.feats[k].shape[-1] for k in layers)
        tokens = torch.zeros(B, T + 1, dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        feats = torch.zeros(B, T, F_, dtype=torch.float16)
        fl = tr.get("final_layer")
        final = torch.zeros(B, T, data.feats[fl].shape[-1], dtype=torch.float16) if fl is not None else None
        for b, i in enumerate(idx):
            t, lab, f = data.seq(i)
            n = lens[b]
            tokens[b, : n + 1] = t
            lab = lab.clone()
            lab[: int(data.prompt_len[i]) - 1] = -100
            lab[lab < 0] = -100
            labels[b, :n] = lab
            feats[b, :n] = torch.cat([f[k] for k in layers], -1)
            if final is not None:
                final[b, :n] = f[fl]
        feats = feats.to(device).float()
        out = {"tokens": tokens.to(device), "labels": labels.to(device)}
        if final is not None:
            x = final.to(device).float()
            out["final"] = tr["final_norm_w"].to(device) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + tr["eps"]))
        if "norm_w" in tr:  # EAGLE reads the final-norm output of the last layer
            w = tr["norm_w"].to(device)
            feats = w * (feats * torch.rsqrt(feats.pow(2).mean(-1, keepdim=True) + tr["eps"]))
        out["feats"] = feats
        return out

    def loss(self, model, batch, options, train: bool):
        tokens, labels, feats = batch["tokens"], batch["labels"], batch["feats"]
        steps = int(options["ttt_steps"])
        sel, valid = loss_positions(labels)
        outs = ttt_forward(model, tokens, feats, steps, noise=float(options["noise"]) if train else 0.0, sel=sel)
        T = labels.shape[1]
        total = 0.0
        hits, counts = [], []
        for k, g in enumerate(outs):
            at = sel + k + 1  # step k at p predicts the target's token after position p+k+1
            lab = torch.gather(labels, 1, at.clamp(max=T - 1))
            lab = torch.where(valid & (at < T), lab, torch.full_like(lab, -100))  # [B, A]
            loss_k, pred = self._step_loss(model, g, lab, batch, at, options, train)
            total = total + float(options["step_decay"]) ** k * loss_k
            with torch.no_grad():
                ok = lab >= 0
                hits.append(int(((pred == lab) & ok).sum()))
                counts.append(int(ok.sum()))
        return total, hits, counts

    def load(self, directory, target):
        from specc.methods.eagle.loader import load_eagle_head
        return load_eagle_head(pathlib.Path(directory), target.config, target.embed, target.lm_head, expect_kind=self.name)

    def save(self, model, directory, target):
        from specc.methods.eagle.loader import save_eagle_head
        save_eagle_head(model, directory, dtype=torch.float16, target_config=target.config)

    def _config(self, target, kind: str, draft_vocab: int, aux=()):
        t = target.config
        return EagleConfig(
            kind=kind, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
            num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim,
            vocab_size=t.vocab_size, draft_vocab_size=draft_vocab, target_hidden_size=t.hidden_size,
            rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta, max_position_embeddings=t.max_model_len,
            fc_bias=(kind == "eagle"), aux_layer_ids=tuple(aux))

    @staticmethod
    def _init(model: EagleModel) -> None:
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    torch.nn.init.normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        m.bias.zero_()
            model.layer.self_attn.o_proj.weight.mul_(0.1)
            model.layer.mlp.down_proj.weight.mul_(0.1)


def _embedding(target):
    """The target's embedding matrix ``[V, H]`` fp32 (also its tied LM head) and an ``embed`` callable."""
    w = target.embed_weight.detach().float()
    return w, (lambda ids: F.embedding(ids, w))


class Eagle3Kind(_EagleBase):
    name = "eagle3"
    title = "EAGLE-3"
    options = {"aux_layers": None, "draft_vocab": 8192, "ttt_steps": 4, "step_decay": 0.8, "noise": 0.0,
               "soft_labels": False}

    def layers(self, target_config, options):
        """The capture layers (SafeAILab's default unless ``aux_layers``), plus the last layer when the
        loss uses the target's distribution (``soft_labels``)."""
        aux = self._aux(target_config, options)
        return aux + ((target_config.num_layers - 1,) if options.get("soft_labels") else ())

    @staticmethod
    def _aux(target_config, options):
        aux = options.get("aux_layers")
        return tuple(int(i) for i in aux) if aux else default_aux_layer_ids(target_config.num_layers)

    def build(self, target, options, data, idx):
        aux = self._aux(target.config, options)
        V = target.config.vocab_size
        counts = label_counts(data, V, idx)
        size = int(options["draft_vocab"])
        if size > V:
            from specc.errors import SpeccError
            raise SpeccError(f"options.draft_vocab={size} exceeds the target's vocabulary ({V} tokens)")
        ids, d2t, t2d, coverage = top_vocab(counts, size)
        emb_w, embed = _embedding(target)
        model = EagleModel(self._config(target, "eagle3", size, aux), embed, None)
        self._init(model)
        with torch.no_grad():
            model.lm_head.weight.copy_(emb_w[ids])  # the target's (tied) head rows
            model.norm.weight.copy_(target.norm.weight.detach().float())
            model.d2t.copy_(d2t)
            model.t2d.copy_(t2d)
        self.adopt(model, target, options)
        return model, {"draft_vocab": size, "train_label_coverage": round(coverage, 4)}

    def adopt(self, model, target, options):
        """Attach what training needs to a built or loaded head (``--init-from``: its draft vocabulary and
        capture layers are kept). With ``soft_labels`` the target's final norm and its LM-head rows of
        the draft vocabulary give the target distribution at each labelled position."""
        V = target.config.vocab_size
        ids = torch.arange(model.cfg.draft_vocab_size) + model.d2t
        to_draft = torch.full((V,), -100, dtype=torch.long)
        to_draft[ids] = torch.arange(model.cfg.draft_vocab_size)
        model.train_state = {"layers": tuple(model.cfg.aux_layer_ids), "to_draft": to_draft}
        if options.get("soft_labels"):
            emb_w, _ = _embedding(target)
            model.train_state.update({"final_layer": target.config.num_layers - 1, "vocab_head": emb_w[ids],
                                      "final_norm_w": target.norm.weight.detach().float().cpu(),
                                      "eps": float(target.config.rms_norm_eps)})

    def _step_loss(self, model, g, lab, batch, at, options, train):
        """Cross-entropy against the target's argmax over the draft vocabulary, or (``soft_labels``)
        against the target's distribution restricted to the draft vocabulary (EAGLE-3's training
        objective as in SpecForge: target logits over the draft vocabulary, renormalised)."""
        tr = model.train_state
        to_draft = tr["to_draft"].to(lab.device)
        dl = torch.where(lab >= 0, to_draft[lab.clamp(min=0)], torch.full_like(lab, -100))
        logits = model.draft_logits(g).float()  # [B, A, Vd]; fp32 losses under autocast
        pred = model.draft_to_target(logits.argmax(-1))
        if "final" not in batch:
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), dl.reshape(-1), ignore_index=-100)
            return ce, pred
        with torch.no_grad():
            T = batch["final"].shape[1]
            fin = torch.gather(batch["final"], 1, at.clamp(max=T - 1)[..., None].expand(-1, -1, batch["final"].shape[-1]))
            p = torch.softmax(fin @ tr["vocab_head"].to(fin.device).t(), -1)  # [B, A, Vd]
        m = (lab >= 0).float()
        ce = -(p * torch.log_softmax(logits, -1)).sum(-1)
        return (ce * m).sum() / m.sum().clamp(min=1), pred


class EagleKind(_EagleBase):
    name = "eagle"
    title = "EAGLE"
    options = {"ttt_steps": 2, "step_decay": 0.8, "noise": 0.05, "ce_weight": 0.1, "train_vocab": 8192}

    def layers(self, target_config, options):
        return (target_config.num_layers - 1,)  # the final-norm output is computed from it

    def build(self, target, options, data, idx):
        V, H = target.config.vocab_size, target.config.hidden_size
        emb_w, embed = _embedding(target)
        ids, _, _, coverage = top_vocab(label_counts(data, V, idx), int(options["train_vocab"]))
        model = EagleModel(self._config(target, "eagle", V), embed, lambda h: F.linear(h, emb_w))
        self._init(model)
        with torch.no_grad():  # start as "the feature passes through": fc([emb; f]) = f
            model.fc.weight[:, H:].copy_(torch.eye(H))
            model.fc.weight[:, :H].mul_(0.1)
        self._attach(model, target, ids)
        return model, {"train_vocab": int(options["train_vocab"]), "train_label_coverage": round(coverage, 4)}

    def adopt(self, model, target, options):
        """Continue a loaded head: the training softmax runs over the full vocabulary."""
        self._attach(model, target, torch.arange(target.config.vocab_size))

    def _attach(self, model, target, ids):
        V = target.config.vocab_size
        emb_w, _ = _embedding(target)
        to_sub = torch.full((V,), -100, dtype=torch.long)
        to_sub[ids] = torch.arange(ids.shape[0])
        model.train_state = {"layers": self.layers(target.config, {}), "norm_w": target.norm.weight.detach().float().cpu(),
                             "eps": float(target.config.rms_norm_eps), "sub_ids": ids, "sub_head": emb_w[ids],
                             "to_sub": to_sub, "emb_w": emb_w}

    def _step_loss(self, model, g, lab, batch, at, options, train):
        tr = model.train_state
        feats = batch["feats"]
        dev = lab.device
        dl = torch.where(lab >= 0, tr["to_sub"].to(dev)[lab.clamp(min=0)], torch.full_like(lab, -100))
        logits = (g @ tr["sub_head"].to(dev).t()).float()  # [B, A, Vsub]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), dl.reshape(-1), ignore_index=-100)
        T = feats.shape[1]
        nf = torch.gather(feats, 1, at.clamp(max=T - 1)[..., None].expand(-1, -1, feats.shape[-1]))
        m = (lab >= 0).float()[..., None]
        reg = (F.smooth_l1_loss(g.float(), nf, reduction="none") * m).sum() / (m.sum() * g.shape[-1]).clamp(min=1)
        with torch.no_grad():  # agreement as at inference: argmax of the full target LM head
            pred = (g @ tr["emb_w"].to(dev).t()).argmax(-1) if not train else tr["sub_ids"].to(dev)[logits.argmax(-1)]
        return reg + float(options["ce_weight"]) * ce, pred
