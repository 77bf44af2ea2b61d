"""The MTP-family drafter kinds of the training tool (see :mod:`specc.train.kinds`): ``mtp`` (one
DeepSeek-style MTP layer run recurrently), ``multi_layer_eagle`` (one MTP module per draft step) and
``frozen_kv_mtp`` (the assistant that reads the target's KV).

Objectives (our own code; facts from the papers and engines cited per kind):

* **mtp** — DeepSeek-V3's MTP layer (DeepSeek-V3 Technical Report, arXiv:2412.19437, §2.2), trained on a frozen
target by self-distillation and unrolled
  as EAGLE-3's training-time test (Li et al. 2025, arXiv 2503.01840): step ``k`` of the chain started
  after position ``p`` is the layer at position ``p + k`` over (the previous step's output, the token at
  ``p + k + 1``), attending to step-0 keys at positions ``<= p`` and to its own chain's keys — what draft
  step ``k`` sees at run time (:func:`mtp_unroll`). Cross-entropy per step, weights ``step_decay^k``.
* **multi_layer_eagle** — each module ``k`` over (target feature at ``j``, token at ``j + k + 1``) for every
  position, causal over its own pairs (teacher forcing equals run time whenever the earlier drafts were
  right: SGLang's non-chain multi-layer EAGLE, :mod:`specc.methods.multi_layer_eagle.model`); module ``k``'s
  cross-entropy against the token at ``j + k + 2``, weights ``step_decay^k``.
* **frozen_kv_mtp** — the assistant's queries at position ``p`` attend to the target's own K/V of layer
  ``kv_layer`` at slots ``<= p`` (computed here from the recorded input of that layer with the target's
  frozen ``attn_norm`` and K/V projections and RoPE: what its cache holds at run time), every draft step
  at the same position with the previous step's output as its hidden (:func:`frozen_unroll`).

All three predict through the target's (frozen) LM head, optionally over a reduced draft vocabulary
(``draft_vocab``: the most frequent answer labels; EAGLE-3's ``d2t``), where labels outside it are left
out of the loss. Labels are the target's argmax (self-distillation data, :mod:`specc.train.features`);
with ``prompt_labels`` the prompt positions in the drafter's context are scored too, labelled with the
target's argmax there (its LM head over the final-norm hidden state the fit computed anyway), so one
target forward yields several times the training positions. Agreement (the card's validation curve)
is counted at answer positions only.
"""
from __future__ import annotations

import math
import pathlib
import sys
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from specc.errors import SpeccError
from specc.methods.eagle.recipe import loss_positions
from specc.train.kinds import DrafterKind
from specc.train.vocab import label_counts, top_vocab


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x [B, T, ...]`` at ``idx [B, A]`` -> ``[B, A, ...]``."""
    B, A = idx.shape
    return torch.gather(x, 1, idx.view(B, A, *([1] * (x.dim() - 2))).expand(B, A, *x.shape[2:]))


# ------------------------------------------------------------------------------------ unrolls
def mtp_unroll(model, tokens: torch.Tensor, feats: torch.Tensor, steps: int, sel: torch.Tensor,
               layer_index: int = 0) -> List[torch.Tensor]:
    """Training-time-test unroll of one MTP layer (see the module docstring).

    Args:
        model: :class:`specc.methods.mtp.model.MTPModel`. tokens: ``[B, T+1]`` int64. feats: ``[B, T, H]`` fp32,
            the target's final-norm hidden states. steps: draft steps unrolled. sel: ``[B, A]`` int64
            chain starts (step-0 keys/values are computed at every position).
    Returns: per step the layer outputs ``[B, A, H]`` (post-norm; step ``k`` predicts the token at
    ``sel + k + 2``).
    """
    layer = model.layers[layer_index]
    attn = layer.self_attn
    cfg = model.cfg
    B, T, _ = feats.shape
    dev = feats.device
    h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = h // kvh
    A = sel.shape[1]
    x0 = layer.project(model._embed(tokens[:, 1: T + 1]).float(), feats)  # [B, T, H]
    a0 = layer.input_layernorm(x0)
    _, k0, v0 = attn.project(a0, torch.arange(T, device=dev)[None].expand(B, T))  # [B, kv, T, d]
    k0, v0 = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)  # [B, h, T, d]
    visible = torch.arange(T, device=dev)[None, None, :] <= sel[:, :, None]  # [B, A, T]
    scale = 1.0 / math.sqrt(d)
    chain_k, chain_v, outs = [], [], []
    prev = None
    for k in range(steps):
        if k == 0:
            x, a = _take(x0, sel), _take(a0, sel)  # [B, A, H]
        else:
            tok = torch.gather(tokens, 1, (sel + k + 1).clamp(max=tokens.shape[1] - 1))  # [B, A]
            x = layer.project(model._embed(tok).float(), prev)
            a = layer.input_layernorm(x)
        q, kk, vv = attn.project(a, sel + k)  # q [B, h, A, d]; kk, vv [B, kv, A, d]
        if k > 0:
            chain_k.append(kk.repeat_interleave(rep, 1))
            chain_v.append(vv.repeat_interleave(rep, 1))
        s0 = ((q @ k0.transpose(-1, -2)) * scale).masked_fill(~visible[:, None], float("-inf"))  # [B, h, A, T]
        diag = [((q * ck).sum(-1) * scale)[..., None] for ck in chain_k]  # [B, h, A, 1] each
        p = torch.cat([s0] + diag, -1).float().softmax(-1)
        o = p[..., :T] @ v0
        for i, cv in enumerate(chain_v):
            o = o + p[..., T + i: T + i + 1] * cv
        y = x + attn.o_proj(o.transpose(1, 2).reshape(B, A, h * d))
        y = y + layer.mlp(layer.post_attention_layernorm(y))
        prev = layer.shared_head.norm(y)  # [B, A, H], recycled as the next step's hidden
        outs.append(prev)
    return outs


def module_unroll(model, tokens: torch.Tensor, feats: torch.Tensor, modules: int, sel: torch.Tensor
                  ) -> List[torch.Tensor]:
    """Multi-layer EAGLE: module ``k`` over (feature at ``j``, token at ``j + k + 1``) for every position
    ``j`` (causal over its own pairs), taken at the chain starts ``sel [B, A]``. ``tokens [B, T+1]``,
    ``feats [B, T, H]``. Returns per module ``[B, A, H]`` (module ``k`` predicts the token at ``sel + k + 2``)."""
    B, T, _ = feats.shape
    dev = feats.device
    pos = torch.arange(T, device=dev)[None].expand(B, T)
    outs = []
    for k in range(modules):
        tok = tokens[:, (torch.arange(T, device=dev) + k + 1).clamp(max=tokens.shape[1] - 1)]  # [B, T]
        out = model.module(k, tok, feats, pos)  # no cache: causal within the sequence
        outs.append(_take(out, sel))
    return outs


def frozen_unroll(model, tokens: torch.Tensor, feats: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  steps: int, sel: torch.Tensor) -> List[torch.Tensor]:
    """Frozen-KV assistant: every step's query sits at the chain start ``sel [B, A]`` and reads the
    target's ``keys, values [B, n_kv, T, d]`` at slots ``<= sel``; step 0's hidden is the target's
    final-norm feature ``feats [B, T, H]`` at ``sel``, step ``k``'s the previous output, its token the one at
    ``sel + k + 1`` (``tokens [B, T+1]``). Returns per step ``[B, A, H]`` (step ``k`` predicts ``sel + k + 2``)."""
    T = feats.shape[1]
    visible = torch.arange(T, device=feats.device)[None, None, :] <= sel[:, :, None]
    hidden = _take(feats, sel)
    outs = []
    for k in range(steps):
        tok = torch.gather(tokens, 1, (sel + k + 1).clamp(max=tokens.shape[1] - 1))
        hidden = model(tok, hidden, sel, keys, values, visible)
        outs.append(hidden)
    return outs


# ------------------------------------------------------------------------------------ shared
class _MTPFamily(DrafterKind):
    """What the three kinds share: the draft vocabulary, collate, the per-step loss, option checks."""

    def check_options(self, options: dict, source: str) -> dict:
        """Defaults filled in and ranges checked; ``SpeccError`` naming the option and its range."""
        out = super().check_options(options, source)
        checks = {"ttt_steps": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
                  "num_modules": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
                  "num_layers": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
                  "step_decay": (lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "in (0, 1]"),
                  "draft_vocab": (lambda v: v is None or (isinstance(v, int) and v >= 1),
                                  "null (the full shared head) or an integer >= 1"),
                  "prompt_labels": (lambda v: isinstance(v, bool), "true or false"),
                  "intermediate_size": (lambda v: v is None or (isinstance(v, int) and v >= 1),
                                        "null (the target's) or an integer >= 1"),
                  "warm_start": (lambda v: v is None or (isinstance(v, str) and bool(v)),
                                 "null or the path of an EAGLE (v1) head directory (pkg:// allowed)")}
        for k, (ok, what) in checks.items():
            if k in out and not ok(out[k]):
                raise SpeccError(f"{source}: options.{k}={out[k]!r} for drafter kind {self.name!r} must be {what}")
        return out

    def layers(self, target_config, options):
        return (target_config.num_layers,)  # the final-norm output

    @torch.no_grad()
    def warm_start(self, model, target, options, sample, rows: int = 2048) -> dict:
        """Copy an EAGLE (v1) head into every MTP layer of ``model`` (``options.warm_start``: its directory).

        Both read the target's final-norm hidden ``f`` and the next token's embedding ``e`` and run one
        Llama decoder block; they differ in the norms (our mapping, not a published recipe):

            EAGLE:  x = fc([e; f]) + b            h = x + attn(x)             logits = head(g)
            MTP:    x = eh_proj([enorm(e); hnorm(f)])   y = x + attn(input_layernorm(x))
                    logits = head(shared_head.norm(y))

        ``eh_proj = fc.weight`` with ``enorm``/``hnorm``/``input_layernorm`` set to the mean RMS of
        ``e``/``f``/``x`` over ``sample`` (so each norm returns its input at the typical scale) and
        ``shared_head.norm`` to the mean RMS of the head's output ``g`` (argmax is unchanged by it). The
        attention, MLP and post-attention norm are copied as they are; ``fc``'s bias has no place
        (``eh_proj`` has none) and is dropped. Returns the scales and the dropped bias's RMS for the card.

        Raises ``SpeccError`` when the head is not an EAGLE (v1) head of this target's shape, or no
        sample sequences are given.
        """
        path = options.get("warm_start")
        if not path:
            return {}
        from specc.methods.eagle.loader import load_eagle_head
        from specc.models.resolve import resolve_model_path
        from specc.errors import CheckpointError

        try:
            head = load_eagle_head(resolve_model_path(path), target.config, target.embed, target.lm_head,
                                   expect_kind="eagle")
        except CheckpointError as exc:
            raise SpeccError(f"options.warm_start={path!r}: {exc}") from None
        if head.cfg.intermediate_size != model.cfg.intermediate_size or head.cfg.hidden_size != model.cfg.hidden_size:
            raise SpeccError(f"options.warm_start={path!r}: the head's sizes (hidden {head.cfg.hidden_size}, "
                             f"intermediate {head.cfg.intermediate_size}) differ from the MTP layer's "
                             f"({model.cfg.hidden_size}, {model.cfg.intermediate_size}); set options.intermediate_size")
        if sample is None or len(sample) == 0:
            raise SpeccError("options.warm_start needs validation sequences for its scale estimates; set val_every")
        layer_key = max(sample.feats)
        toks, feats, n = [], [], 0
        for i in range(len(sample)):
            t, _, f = sample.seq(i)
            toks.append(t[1:]), feats.append(f[layer_key].float())
            n += feats[-1].shape[0]
            if n >= rows:
                break
        e = torch.cat([target.embed(t).float() for t in toks])[:rows]  # [N, H]
        f = torch.cat(feats)[:rows]  # [N, H]
        rms = lambda x: float(x.pow(2).mean(-1).sqrt().mean())  # noqa: E731
        x = F.linear(torch.cat([e, f], -1), head.fc.weight.float(), head.fc.bias)  # [N, H]
        g = torch.cat([head(t[None], fe[None].float(), torch.arange(fe.shape[0])[None])[0]
                       for t, fe in zip(toks[:4], feats[:4])])
        scales = {"embedding": rms(e), "hidden": rms(f), "x": rms(x), "head_output": rms(g)}
        src = head.layer
        for layer in model.layers:
            layer.eh_proj.weight.copy_(head.fc.weight.float())
            layer.enorm.weight.fill_(scales["embedding"])
            layer.hnorm.weight.fill_(scales["hidden"])
            layer.input_layernorm.weight.fill_(scales["x"])
            layer.shared_head.norm.weight.fill_(scales["head_output"])
            layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight.float())
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight.float())
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(layer.mlp, name).weight.copy_(getattr(src.mlp, name).weight.float())
        bias = 0.0 if head.fc.bias is None else float(head.fc.bias.float().pow(2).mean().sqrt())
        print(f"[fit] warm start from the EAGLE head {path}: RMS of embedding {scales['embedding']:.3f}, "
              f"hidden {scales['hidden']:.3f}, x {scales['x']:.3f}, head output {scales['head_output']:.3f}; "
              f"dropped fc bias RMS {bias:.4f}", file=sys.stderr, flush=True)
        return {"warm_start": {"from": str(path), "scales": {k: round(v, 4) for k, v in scales.items()},
                               "dropped_fc_bias_rms": round(bias, 5)}}

    def unroll_steps(self, options):
        return int(options.get("ttt_steps") or options.get("num_modules"))

    def _vocab(self, target, options, data, idx):
        """``(d2t or None, facts for the card)`` of the draft vocabulary the options ask for."""
        V = target.config.vocab_size
        size = options.get("draft_vocab")
        if size is None or int(size) >= V:
            return None, {"draft_vocab": V}
        ids, d2t, _, coverage = top_vocab(label_counts(data, V, idx), int(size))
        return d2t, {"draft_vocab": int(size), "train_label_coverage": round(coverage, 4)}

    def _attach(self, model, target) -> None:
        """Training tensors: the label -> draft-id map of the model's draft vocabulary."""
        V = target.config.vocab_size
        ids = model.head.ids
        to_draft = torch.full((V,), -100, dtype=torch.long)
        if ids is None:
            to_draft = torch.arange(V)
        else:
            to_draft[ids.cpu()] = torch.arange(ids.numel())
        model.train_state = {"to_draft": to_draft, "head_w": target.output.weight.detach()}

    def adopt(self, model, target, options):
        """Continue a loaded checkpoint (``--init-from``): its draft vocabulary is kept."""
        self._attach(model, target)

    def collate(self, model, data, idx: Sequence[int], options: dict, device) -> dict:
        """Right-padded batch of sequences ``idx``: ``tokens [B, T+1]``, ``labels [B, T]`` (``-100`` =
        no loss: padding, and prompt positions unless ``prompt_labels``), ``answer [B, T]`` bool (the
        answer positions, where agreement is counted) and ``feats {layer: [B, T, H]}`` fp32 on ``device``."""
        lens = [data.length(i) for i in idx]
        T, B = max(lens), len(idx)
        tokens = torch.zeros(B, T + 1, dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        answer = torch.zeros(B, T, dtype=torch.bool)
        feats = {k: torch.zeros(B, T, v.shape[-1], dtype=torch.float16) for k, v in data.feats.items()}
        for b, i in enumerate(idx):
            t, lab, f = data.seq(i)
            n = lens[b]
            tokens[b, : n + 1] = t
            lab = lab.clone()
            lab[: int(data.prompt_len[i]) - 1] = -100
            lab[lab < 0] = -100
            labels[b, :n] = lab
            answer[b, :n] = lab >= 0
            for k in feats:
                feats[k][b, :n] = f[k]
        out = {"tokens": tokens.to(device), "labels": labels.to(device), "answer": answer.to(device),
               "feats": {k: v.to(device).float() for k, v in feats.items()}}
        if options.get("prompt_labels"):
            out["labels"] = self._prompt_labels(model, out, torch.tensor(lens, device=device))
        return out

    @staticmethod
    @torch.no_grad()
    def _prompt_labels(model, batch: dict, lens: torch.Tensor, rows: int = 512) -> torch.Tensor:
        """``labels [B, T]`` with the unlabelled prompt positions (inside each sequence) set to the
        target's argmax there: its LM head over the final-norm hidden state, in chunks of ``rows``."""
        labels = batch["labels"].clone()
        final = batch["feats"][max(batch["feats"])]  # [B, T, H] final-norm output
        B, T, H = final.shape
        w = model.train_state["head_w"].to(final.device).float()
        need = (labels < 0) & (torch.arange(T, device=final.device).view(1, T) < lens.view(B, 1))
        pos = need.nonzero(as_tuple=True)
        flat = final[pos]  # [N, H]
        best = torch.cat([(flat[i: i + rows] @ w.t()).argmax(-1) for i in range(0, flat.shape[0], rows)]) \
            if flat.shape[0] else flat.new_zeros(0, dtype=torch.long)
        labels[pos] = best
        return labels

    def _outputs(self, model, batch, options, sel) -> List[torch.Tensor]:
        raise NotImplementedError

    def loss(self, model, batch, options, train: bool):
        """Σ_k step_decay^k · cross-entropy of step ``k`` over the draft vocabulary; hits and counts of
        top-1 agreement per step (labels outside the draft vocabulary count as misses)."""
        labels = batch["labels"]
        sel, valid = loss_positions(labels)
        outs = self._outputs(model, batch, options, sel)
        T = labels.shape[1]
        to_draft = model.train_state["to_draft"].to(labels.device)
        total = 0.0
        hits, counts = [], []
        answer = batch.get("answer")
        for k, out in enumerate(outs):
            at = sel + k + 1
            lab = torch.gather(labels, 1, at.clamp(max=T - 1))
            lab = torch.where(valid & (at < T), lab, torch.full_like(lab, -100))  # [B, A]
            dl = torch.where(lab >= 0, to_draft[lab.clamp(min=0)], torch.full_like(lab, -100))
            logits = model.draft_logits(out).float()  # [B, A, Vd]
            if bool((dl >= 0).any()):
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), dl.reshape(-1), ignore_index=-100)
                total = total + float(options["step_decay"]) ** k * ce
            with torch.no_grad():
                pred = model.draft_to_target(logits.argmax(-1))
                ok = lab >= 0
                if answer is not None:  # agreement at answer positions (prompt labels only train)
                    ok = ok & torch.gather(answer, 1, at.clamp(max=T - 1))
                hits.append(int(((pred == lab) & ok).sum()))
                counts.append(int(ok.sum()))
        if not torch.is_tensor(total):
            total = sum(p.sum() for p in model.parameters()) * 0.0
        return total, hits, counts


def _init_linears(model, small=()) -> None:
    """N(0, 0.02²) for every linear, the ``small`` ones (residual-branch outputs) scaled by 0.1."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=0.02)
        for m in small:
            m.weight.mul_(0.1)


def _mtp_config(target, kind: str, layers: int, draft_vocab: Optional[int], intermediate: Optional[int]):
    from specc.methods.mtp.model import MTPConfig

    t = target.config
    return MTPConfig(kind=kind, num_layers=layers, first_layer=t.num_layers, hidden_size=t.hidden_size,
                     intermediate_size=int(intermediate or t.intermediate_size), num_attention_heads=t.num_heads,
                     num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim, vocab_size=t.vocab_size,
                     draft_vocab_size=int(draft_vocab or t.vocab_size), rms_norm_eps=t.rms_norm_eps,
                     rope_theta=t.rope_theta, rope_scaling=t.rope_scaling, max_position_embeddings=t.max_model_len)


def _init_nextn(model, target) -> None:
    """Each MTP layer starts as "the hidden passes through": ``eh_proj = [0.1·N(0, 0.02²) | I]``, small
    residual branches, ``shared_head.norm`` = the target's final norm."""
    H = model.cfg.hidden_size
    _init_linears(model, [m for layer in model.layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)])
    with torch.no_grad():
        for layer in model.layers:
            layer.eh_proj.weight[:, H:].copy_(torch.eye(H))
            layer.eh_proj.weight[:, :H].mul_(0.1)
            layer.shared_head.norm.weight.copy_(target.norm.weight.detach().float())


# ------------------------------------------------------------------------------------ the kinds
class MTPKind(_MTPFamily):
    name = "mtp"
    title = "MTP (DeepSeek-style NEXTN layer)"
    options = {"ttt_steps": 3, "step_decay": 0.8, "draft_vocab": 8192, "intermediate_size": None,
               "prompt_labels": False,
               "warm_start": None}

    def build(self, target, options, data, idx):
        from specc.methods.mtp.model import MTPModel

        d2t, info = self._vocab(target, options, data, idx)
        cfg = _mtp_config(target, "mtp", 1, info["draft_vocab"], options.get("intermediate_size"))
        model = MTPModel(cfg, target.embed, target.lm_head, lambda: target.output.weight)
        _init_nextn(model, target)
        if d2t is not None:
            model.d2t.copy_(d2t)
        model.bind_head()
        self._attach(model, target)
        return model, info

    def _outputs(self, model, batch, options, sel):
        L = max(batch["feats"])
        return mtp_unroll(model, batch["tokens"], batch["feats"][L], int(options["ttt_steps"]), sel)

    def save(self, model, directory, target):
        from specc.methods.mtp.model import save_mtp

        save_mtp(model, directory, target_config=target.config)

    def load(self, directory, target):
        from specc.methods.mtp.model import load_mtp

        return load_mtp(pathlib.Path(directory), target, "mtp")


class MultiLayerEagleKind(_MTPFamily):
    name = "multi_layer_eagle"
    title = "Multi-layer EAGLE (one MTP module per draft step)"
    options = {"num_modules": 3, "step_decay": 0.8, "draft_vocab": 8192, "intermediate_size": None,
               "prompt_labels": False,
               "warm_start": None}

    def build(self, target, options, data, idx):
        from specc.methods.multi_layer_eagle.model import MultiLayerEagleModel

        d2t, info = self._vocab(target, options, data, idx)
        cfg = _mtp_config(target, "multi_layer_eagle", int(options["num_modules"]), info["draft_vocab"],
                          options.get("intermediate_size"))
        model = MultiLayerEagleModel(cfg, target.embed, target.lm_head, lambda: target.output.weight)
        _init_nextn(model, target)
        if d2t is not None:
            model.d2t.copy_(d2t)
        model.bind_head()
        self._attach(model, target)
        return model, info

    def _outputs(self, model, batch, options, sel):
        L = max(batch["feats"])
        return module_unroll(model, batch["tokens"], batch["feats"][L], int(options["num_modules"]), sel)

    def save(self, model, directory, target):
        from specc.methods.multi_layer_eagle.model import save_multi_layer_eagle

        save_multi_layer_eagle(model, directory, target_config=target.config)

    def load(self, directory, target):
        from specc.methods.multi_layer_eagle.model import load_multi_layer_eagle

        return load_multi_layer_eagle(pathlib.Path(directory), target)


class FrozenKVMTPKind(_MTPFamily):
    name = "frozen_kv_mtp"
    title = "Frozen-KV MTP (assistant over the target's KV)"
    options = {"ttt_steps": 3, "step_decay": 0.8, "draft_vocab": 8192, "num_layers": 1, "intermediate_size": None,
               "prompt_labels": False}

    def layers(self, target_config, options):
        """The input of the last target layer (its K/V are recomputed from it) and the final-norm output."""
        return (target_config.num_layers - 2, target_config.num_layers)

    def build(self, target, options, data, idx):
        from specc.methods.frozen_kv_mtp.model import FrozenKVConfig, bind

        d2t, info = self._vocab(target, options, data, idx)
        t = target.config
        cfg = FrozenKVConfig(hidden_size=t.hidden_size, backbone_hidden_size=t.hidden_size,
                             intermediate_size=int(options.get("intermediate_size") or t.intermediate_size),
                             num_layers=int(options["num_layers"]), num_attention_heads=t.num_heads,
                             num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim, vocab_size=t.vocab_size,
                             draft_vocab_size=int(info["draft_vocab"]), kv_layer=t.num_layers - 1,
                             rms_norm_eps=t.rms_norm_eps, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling)
        model = bind(cfg, target)
        H = t.hidden_size
        _init_linears(model, [m for layer in model.model.layers for m in (layer.self_attn.o_proj, layer.mlp.down_proj)])
        with torch.no_grad():  # start as "the hidden passes through": pre = [0.1·noise | I], post = I
            model.pre_projection.weight[:, H:].copy_(torch.eye(H))
            model.pre_projection.weight[:, :H].mul_(0.1)
            model.post_projection.weight.copy_(torch.eye(H))
            model.model.norm.weight.copy_(target.norm.weight.detach().float())
        if d2t is not None:
            model.d2t.copy_(d2t)
        model.bind_head()
        self._attach(model, target)
        return model, info

    def _attach(self, model, target):
        super()._attach(model, target)
        layer = target.layers[model.cfg.kv_layer]
        c = target.config
        w = layer.attn.wqkv.weight.detach().float()
        b = layer.attn.wqkv.bias.detach().float() if layer.attn.wqkv.bias is not None else None
        q, kv = c.q_size, c.kv_size
        model.train_state.update({
            "kv_norm_w": layer.attn_norm.weight.detach().float(), "eps": float(c.rms_norm_eps),
            "wk": w[q: q + kv].clone(), "wv": w[q + kv:].clone(),
            "bk": None if b is None else b[q: q + kv].clone(), "bv": None if b is None else b[q + kv:].clone()})

    def collate(self, model, data, idx, options, device):
        """:meth:`_MTPFamily.collate` plus the target's ``keys, values [B, n_kv, T, d]`` of layer
        ``kv_layer`` (RoPE applied as the target's cache holds them), recomputed from the layer's input."""
        from specc.methods.eagle.model import apply_rope

        out = super().collate(model, data, idx, options, device)
        tr, cfg = model.train_state, model.cfg
        x = out["feats"][cfg.kv_layer - 1]  # [B, T, H]: the output of the layer before, its input
        with torch.no_grad():
            xn = tr["kv_norm_w"].to(device) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + tr["eps"]))
            k = F.linear(xn, tr["wk"].to(device), None if tr["bk"] is None else tr["bk"].to(device))
            v = F.linear(xn, tr["wv"].to(device), None if tr["bv"] is None else tr["bv"].to(device))
            B, T, _ = x.shape
            kvh, d = cfg.num_key_value_heads, cfg.head_dim
            k = k.view(B, T, kvh, d).transpose(1, 2)
            v = v.view(B, T, kvh, d).transpose(1, 2)
            k = apply_rope(k, torch.arange(T, device=device)[None].expand(B, T), model.inv_freq.to(device))
        out["keys"], out["values"] = k.contiguous(), v.contiguous()
        return out

    def _outputs(self, model, batch, options, sel):
        L = max(batch["feats"])
        return frozen_unroll(model, batch["tokens"], batch["feats"][L], batch["keys"], batch["values"],
                             int(options["ttt_steps"]), sel)

    def save(self, model, directory, target):
        from specc.methods.frozen_kv_mtp.model import save_assistant

        save_assistant(model, directory, target_config=target.config)

    def load(self, directory, target):
        from specc.methods.frozen_kv_mtp.model import load_assistant

        return load_assistant(pathlib.Path(directory), target)
