"""DFlash and DSpark block drafters: one non-causal pass over [bonus, MASK × γ] proposes a whole block.

Architecture (facts from z-lab's DFlash, ``dflash/model.py`` and ``model/dflash.py``; SGLang 0.5.23's
DSpark, ``sglang/srt/models/dspark.py``; our own code):

* **No embedding table or LM head of its own.** The block's input is the *target's* embedding of
  ``[anchor, MASK, ..., MASK]`` (the anchor is the pending token, the mask a token id of the target's
  vocabulary, ``mask_token_id``); the block's output goes through the target's LM head.
* **Context from the target.** The target's hidden states at ``target_layer_ids`` (outputs of those
  decoder layers, pre-norm) are concatenated and projected, ``ctx = hidden_norm(fc([h_a; h_b; ...]))``;
  every draft layer turns ``ctx`` into keys and values with its own ``k_proj``/``v_proj`` (then
  ``k_norm`` and RoPE at the context's positions). These are written into the drafter's KV cache by
  position as the target commits tokens, so a step only projects the new committed rows.
* **Queries from the block only.** Each layer (Qwen3-style: per-head ``q_norm``/``k_norm``) attends
  from the block's ``γ + 1`` positions to the committed context (positions before the anchor) and to
  the whole block, **non-causally** within the block; the hidden state at block position ``j ≥ 1``
  predicts the token *at* position ``j`` (fill-in layout: output ``j`` ↔ draft ``j``).
* **DSpark** adds, over the block's base logits ``z_j`` (no further transformer pass):
  a Markov head that adds a transition bias from the previously chosen token, applied left to
  right — ``vanilla`` ``w2(w1[x_{j-1}])`` (a rank-r bigram bias ``V×r``, ``r×V``), ``gated`` the same
  times ``sigmoid(gate_proj([h_j; e(x_{j-1})]))``, ``rnn`` a GRU state over ``[w1[x_{j-1}]; hproj(h_j)]``
  whose ``tanh`` feeds ``w2`` (SGLang 0.5.23 sglang/srt/models/dspark.py:186-382) — and a
  confidence head ``sigmoid(a_j·(c · [h_j; w1[x_{j-1}]] + b) + b_j)`` estimating that draft ``j`` is
  accepted given that the earlier ones were (per-position Platt calibration ``a_j, b_j``). Neither
  reads the token drafted at ``j`` itself.

Checkpoint layout (z-lab's, loaded by :func:`load_block_drafter`): ``config.json`` of a Qwen3 draft
with ``dflash_config: {block_size, target_layer_ids, mask_token_id}`` (each also accepted at the top
level; z-lab's ``block_size`` is the verify width, γ + 1) plus, for DSpark, ``dspark_config:
{markov_rank, markov_head_type, confidence_head}``; tensors ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.self_attn.{q,k}_norm``, ``layers.{i}.mlp.{gate,up,down}_proj``,
``layers.{i}.{input,post_attention}_layernorm``, ``norm``, ``fc``, ``hidden_norm`` (a ``model.``
prefix is accepted), and DSpark's ``markov_w1``, ``markov_w2``, ``markov_gate_proj``,
``markov_rnn``/``markov_hproj``, ``confidence_head``, ``confidence_calibration``.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from specc.errors import CheckpointError
from specc.methods.eagle.model import RMSNorm, _cache_weights, _lin, apply_rope, rope_inv_freq

KINDS = ("dflash", "dspark")
MARKOV_KINDS = ("vanilla", "gated", "rnn")
DFLASH_ARCH = "DFlashDraftModel"
DSPARK_ARCH = "DSparkDraftModel"


@dataclass(frozen=True)
class BlockDraftConfig:
    """Shape of one DFlash / DSpark draft.

    ``block_size`` is z-lab's: the verify width the draft was trained for, anchor included (γ + 1).
    ``target_layer_ids`` are target decoder-layer outputs (0-based, pre-norm; z-lab's
    ``hidden_states[id + 1]``). ``markov_rank`` 0 means no Markov head (DFlash)."""

    kind: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_layer_ids: Tuple[int, ...]
    block_size: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    qk_norm: bool = True
    output_multiplier: float = 1.0
    logit_softcap: Optional[float] = None
    num_target_layers: Optional[int] = None
    markov_rank: int = 0
    markov_head_type: Optional[str] = None
    confidence_head: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def gamma(self) -> int:
        """Draft tokens of the trained block (``block_size - 1``)."""
        return self.block_size - 1


# ----------------------------------------------------------------------------------------------- layers
class BlockAttention(nn.Module):
    """Qwen3-style GQA attention of a DFlash layer: queries from the block, keys/values from the
    committed context (cache) and the block itself."""

    def __init__(self, cfg: BlockDraftConfig):
        super().__init__()
        self.cfg = cfg
        h, kv, d, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(H, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(H, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(H, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, H, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling), persistent=False)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``x [B, N, H]`` -> roped ``k [B, kv, N, d]`` and ``v [B, kv, N, d]``."""
        B, N, _ = x.shape
        kv, d = self.cfg.num_key_value_heads, self.cfg.head_dim
        k = _lin(self.k_proj, x).view(B, N, kv, d)
        if self.cfg.qk_norm:
            k = self.k_norm(k)
        v = _lin(self.v_proj, x).view(B, N, kv, d).transpose(1, 2)
        return apply_rope(k.transpose(1, 2), positions, self.inv_freq), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """``x [B, Q, H]`` (normed) at ``positions [B, Q]``; ``ctx_k, ctx_v [B, kv, S, d]``; ``mask
        [B, Q, S + Q]`` bool (True = attend) over context then block keys. Returns ``[B, Q, H]``."""
        B, Q, _ = x.shape
        h, kv, d = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        q = _lin(self.q_proj, x).view(B, Q, h, d)
        if self.cfg.qk_norm:
            q = self.q_norm(q)
        q = apply_rope(q.transpose(1, 2), positions, self.inv_freq)  # [B, h, Q, d]
        k_blk, v_blk = self.kv(x, positions)
        keys = torch.cat([ctx_k, k_blk], dim=2)
        vals = torch.cat([ctx_v, v_blk], dim=2)
        rep = h // kv
        if rep > 1:
            keys = keys.repeat_interleave(rep, dim=1)
            vals = vals.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask[:, None])  # [B, h, Q, d]
        return _lin(self.o_proj, o.transpose(1, 2).reshape(B, Q, h * d))


class BlockMLP(nn.Module):
    """SwiGLU ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: BlockDraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _lin(self.down_proj, F.silu(_lin(self.gate_proj, x)) * _lin(self.up_proj, x))


class BlockLayer(nn.Module):
    """One DFlash decoder layer (pre-norm residual attention + MLP)."""

    def __init__(self, cfg: BlockDraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = BlockMLP(cfg)

    def forward(self, x, positions, ctx_k, ctx_v, mask):
        h = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class MarkovHead(nn.Module):
    """DSpark's transition bias from the previously chosen token (see the module docstring).

    ``bias(prev [B], hidden [B, H], prev_emb [B, H], state)`` -> ``(bias [B, V] fp32, state)``.
    ``w1`` is an embedding ``[V, r]``; ``w2`` maps ``r -> V``."""

    def __init__(self, kind: str, rank: int, vocab_size: int, hidden_size: int):
        super().__init__()
        if kind not in MARKOV_KINDS:
            raise ValueError(f"markov head type must be one of {MARKOV_KINDS}, got {kind!r}")
        if rank <= 0:
            raise ValueError(f"markov rank must be > 0, got {rank}")
        self.kind, self.rank = kind, rank
        self.w1 = nn.Embedding(vocab_size, rank)
        self.w2 = nn.Linear(rank, vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(2 * hidden_size, 1)
        if kind == "rnn":
            self.hproj = nn.Linear(hidden_size, rank, bias=False)
            self.rnn = nn.GRUCell(2 * rank, rank)

    def init_state(self, batch: int, device) -> Optional[torch.Tensor]:
        return torch.zeros(batch, self.rank, device=device) if self.kind == "rnn" else None

    def feature(self, prev: torch.Tensor) -> torch.Tensor:
        """``w1[prev]``: ``[...] -> [..., r]`` (also the confidence head's transition input)."""
        return self.w1(prev).float()

    def bias(self, prev: torch.Tensor, hidden: torch.Tensor, prev_emb: Optional[torch.Tensor],
             state: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        m = self.feature(prev)  # [B, r]
        if self.kind == "rnn":
            state = self.rnn(torch.cat([m, _lin(self.hproj, hidden)], dim=-1), state)
            return _lin(self.w2, torch.tanh(state)), state
        b = _lin(self.w2, m)  # [B, V]
        if self.kind == "gated":
            b = b * torch.sigmoid(_lin(self.gate_proj, torch.cat([hidden, prev_emb.float()], dim=-1)))
        return b, state


def markov_walk(base: torch.Tensor, hidden: Optional[torch.Tensor], anchor: torch.Tensor,
                markov: Optional[MarkovHead], choose: Callable[[torch.Tensor, int], torch.Tensor],
                embed: Optional[Callable] = None) -> Tuple[torch.Tensor, List[torch.Tensor], List[torch.Tensor]]:
    """DSpark's left-to-right pass over a block's base logits (no transformer forward).

    Position j's logits are ``base[:, j] + bias(x_{j-1})`` (``x_{-1}`` = the anchor) when ``markov`` is
    given, else ``base[:, j]``; ``choose(logits [B, V], j) -> [B]`` picks x_j (argmax, or a draw).

    Args: base ``[B, K, V]`` fp32; hidden ``[B, K, H]`` (gated/rnn heads read it; may be None for
    vanilla); anchor ``[B]`` int64; embed: token embedding for the gated head.
    Returns: ``(tokens [B, K] int64, logits per position (list of [B, V]), previous token per position
    (list of [B]))``.
    """
    B, K = base.shape[:2]
    state = markov.init_state(B, base.device) if markov is not None else None
    prev = anchor
    toks, zs, prevs = [], [], []
    for j in range(K):
        z = base[:, j]
        if markov is not None:
            h = hidden[:, j] if hidden is not None else None
            prev_emb = embed(prev) if markov.kind == "gated" else None
            bias, state = markov.bias(prev, h, prev_emb, state)
            z = z + bias
        prevs.append(prev)
        zs.append(z)
        prev = choose(z, j)
        toks.append(prev)
    tokens = torch.stack(toks, dim=1) if toks else torch.zeros(B, 0, dtype=torch.int64, device=base.device)
    return tokens, zs, prevs


class ConfidenceHead(nn.Module):
    """``sigmoid(a_j · (w · [h_j; m_j] + b) + b_j)``: the estimate that draft j is accepted given the
    earlier drafts were. ``m_j`` is the Markov head's ``w1[x_{j-1}]`` (empty without one);
    ``calibration [γ, 2]`` holds the per-position Platt pair ``(a_j, b_j)`` (identity by default)."""

    def __init__(self, hidden_size: int, markov_rank: int, gamma: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size + markov_rank, 1)
        self.register_buffer("calibration", torch.tensor([[1.0, 0.0]] * max(gamma, 1)))

    def logit(self, hidden: torch.Tensor, markov_feature: Optional[torch.Tensor]) -> torch.Tensor:
        """Uncalibrated logit ``[...]`` from ``hidden [..., H]`` and ``markov_feature [..., r]``."""
        x = hidden if markov_feature is None else torch.cat([hidden, markov_feature], dim=-1)
        return _lin(self.linear, x).squeeze(-1)

    def prob(self, logit: torch.Tensor, position: int) -> torch.Tensor:
        j = min(position, self.calibration.shape[0] - 1)
        a, b = self.calibration[j, 0], self.calibration[j, 1]
        return torch.sigmoid(a * logit + b)


class BlockDraftCache:
    """The drafter's context KV, per layer ``k, v [B, kv, S, d]`` fp32, written at absolute positions
    (roll back by position: rows past an accepted prefix are never written)."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, device=None):
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device) for _ in range(num_layers)]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]


# ----------------------------------------------------------------------------------------------- model
class BlockDraftModel(nn.Module):
    """A DFlash / DSpark draft bound to its target's embedding and LM head.

    Args:
        cfg: the draft's shape. embed: the target's embedding (ids ``[...]`` -> ``[..., H]``).
        target_lm_head: the target's output projection (``[..., H]`` -> ``[..., V]`` fp32).
    Both callables are held outside ``state_dict`` (the draft owns neither)."""

    def __init__(self, cfg: BlockDraftConfig, embed: Callable, target_lm_head: Callable):
        super().__init__()
        if cfg.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {cfg.kind!r}")
        self.cfg = cfg
        self._embed = embed
        self._lm_head = target_lm_head
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.markov = (MarkovHead(cfg.markov_head_type or "vanilla", cfg.markov_rank, cfg.vocab_size, cfg.hidden_size)
                       if cfg.markov_rank > 0 else None)
        self.confidence = (ConfidenceHead(cfg.hidden_size, cfg.markov_rank, cfg.gamma)
                           if cfg.confidence_head else None)

    # ---- pieces -------------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, device=None) -> BlockDraftCache:
        c = self.cfg
        return BlockDraftCache(c.num_layers, batch, c.num_key_value_heads, max_len, c.head_dim, device=device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self._embed(ids).float()

    def context(self, target_hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """``hidden_norm(fc(cat(target_hidden)))``: list of ``[B, N, H_t]`` -> ``[B, N, H]``."""
        x = target_hidden[0] if len(target_hidden) == 1 else torch.cat(list(target_hidden), dim=-1)
        return self.hidden_norm(_lin(self.fc, x.float()))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(k, v)`` ``[B, kv, N, d]`` of the projected context ``ctx [B, N, H]``."""
        return [layer.self_attn.kv(ctx, positions) for layer in self.layers]

    def write_context(self, cache: BlockDraftCache, ctx: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor, rows: Optional[torch.Tensor] = None) -> None:
        """Write the context K/V of ``ctx [B, N, H]`` at ``positions [B, N]`` into cache ``slots
        [B, N]`` of cache rows ``rows [B]`` (default ``0..B-1``)."""
        B, N = slots.shape
        rows_t = torch.arange(B, device=slots.device) if rows is None else rows
        bi = rows_t.view(B, 1).expand(B, N)
        for (k, v), ck, cv in zip(self.context_kv(ctx, positions), cache.k, cache.v):
            ck.transpose(1, 2).index_put_((bi, slots), k.transpose(1, 2).to(ck.dtype))
            cv.transpose(1, 2).index_put_((bi, slots), v.transpose(1, 2).to(cv.dtype))

    def block_hidden(self, block_ids: torch.Tensor, positions: torch.Tensor, cache: BlockDraftCache,
                     visible: torch.Tensor, max_visible: Optional[int] = None) -> torch.Tensor:
        """One pass over the block ``block_ids [B, Q]`` at ``positions [B, Q]``: context slots
        ``j < visible[b]`` of cache row b plus the whole block (non-causal). ``max_visible``: the
        caller's host copy of ``visible.max()`` (None: read it from ``visible``, one device read).
        Returns the final-norm hidden states ``[B, Q, H]``."""
        B, Q = block_ids.shape
        widest = int(visible.max()) if max_visible is None and B else (max_visible or 0)
        S = max(widest, 1) if B else 1
        ctx_mask = torch.arange(S, device=visible.device).view(1, S) < visible.view(B, 1)  # [B, S]
        mask = torch.cat([ctx_mask.view(B, 1, S).expand(B, Q, S),
                          torch.ones(B, Q, Q, dtype=torch.bool, device=visible.device)], dim=2)
        x = self.embed(block_ids)
        for layer, ck, cv in zip(self.layers, cache.k, cache.v):
            x = layer(x, positions, ck[:B, :, :S], cv[:B, :, :S], mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base logits ``[..., V]`` fp32 through the target's LM head (times ``output_multiplier``,
        optionally soft-capped, as z-lab's ``compute_logits``)."""
        z = self._lm_head(hidden).float()
        if self.cfg.output_multiplier != 1.0:
            z = z * self.cfg.output_multiplier
        if self.cfg.logit_softcap:
            z = torch.tanh(z / self.cfg.logit_softcap) * self.cfg.logit_softcap
        return z

    # ---- training forward ---------------------------------------------------------------------
    def forward_train(self, ctx: torch.Tensor, ctx_positions: torch.Tensor, block_ids: torch.Tensor,
                      block_positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced pass of many blocks at once: ``ctx [B, T, H]`` projected context at
        ``ctx_positions [B, T]``; blocks ``block_ids [B, Q]`` at ``block_positions [B, Q]``; ``mask
        [B, Q, T + Q]`` (a block sees the context before its anchor and itself). Returns ``[B, Q, H]``."""
        x = self.embed(block_ids)
        for layer, (ck, cv) in zip(self.layers, self.context_kv(ctx, ctx_positions)):
            x = layer(x, block_positions, ck, cv, mask)
        return self.norm(x)

    def prepare_inference(self) -> "BlockDraftModel":
        """Cache CPU copies of the weights for small-row matmuls (see ``specc.methods.eagle.model._lin``)."""
        self.eval()
        for m in self.modules():
            if isinstance(m, nn.Linear):
                _cache_weights(m)
        return self


# ----------------------------------------------------------------------------------------------- layout
def published_key_map(cfg: BlockDraftConfig) -> Dict[str, str]:
    """Our ``state_dict`` name -> the published (z-lab / DSpark) tensor name."""
    out: Dict[str, str] = {}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        names = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight"]
        if cfg.qk_norm:
            names += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        if cfg.attention_bias:
            names += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                      "self_attn.o_proj.bias"]
        out.update({p + n: p + n for n in names})
    out.update({"norm.weight": "norm.weight", "fc.weight": "fc.weight", "hidden_norm.weight": "hidden_norm.weight"})
    if cfg.markov_rank > 0:
        out.update({"markov.w1.weight": "markov_w1.weight", "markov.w2.weight": "markov_w2.weight"})
        if cfg.markov_head_type == "gated":
            out.update({"markov.gate_proj.weight": "markov_gate_proj.weight",
                        "markov.gate_proj.bias": "markov_gate_proj.bias"})
        if cfg.markov_head_type == "rnn":
            out.update({"markov.hproj.weight": "markov_hproj.weight"})
            out.update({f"markov.rnn.{n}": f"markov_rnn.{n}" for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
    if cfg.confidence_head:
        out.update({"confidence.linear.weight": "confidence_head.weight", "confidence.linear.bias": "confidence_head.bias",
                    "confidence.calibration": "confidence_calibration"})
    return out


def _get(d: dict, sub: Sequence[str], key: str, default=None):
    """``d[s][key]`` for the first sub-dict ``s`` of ``sub`` holding it, else ``d[key]``, else default."""
    for s in sub:
        v = (d.get(s) or {}).get(key) if isinstance(d.get(s), dict) else None
        if v is not None:
            return v
    v = d.get(key)
    return default if v is None else v


def parse_block_config(d: dict, target, source: str, expect_kind: Optional[str] = None) -> BlockDraftConfig:
    """A :class:`BlockDraftConfig` from a published ``config.json`` dict, checked against the target's
    ``LlamaConfig``.

    Raises:
        CheckpointError: a missing field, a hidden-size or vocabulary mismatch, ``target_layer_ids``
            outside the target's layers, ``mask_token_id`` outside the vocabulary, a bad Markov head
            (rank < 0, rank > 0 without a type, an unknown type: SGLang DS29/DS32), or a DFlash
            checkpoint loaded as DSpark / the other way round.
    """
    sub = ("dspark_config", "dflash_config")

    def need(key):
        v = _get(d, sub, key)
        if v is None:
            raise CheckpointError(f"{source}: config.json lacks {key!r} (a DFlash/DSpark draft needs it, at the "
                                  f"top level or under dflash_config)")
        return v

    rank = int(_get(d, sub, "markov_rank", 0) or 0)
    head = _get(d, sub, "markov_head_type")
    arch = (d.get("architectures") or [""])[0]
    kind = "dspark" if (rank > 0 or isinstance(d.get("dspark_config"), dict) or "DSpark" in arch) else "dflash"
    if expect_kind is not None and kind != expect_kind:
        what = {"dspark": "a DSpark draft (Markov head / dspark_config)", "dflash": "a DFlash draft"}[kind]
        raise CheckpointError(f"{source}: this is {what} but the plan's method is {expect_kind!r}; set "
                              f"method.name: {kind}")
    if rank < 0:
        raise CheckpointError(f"{source}: markov_rank={rank} must be >= 0")
    if kind == "dspark" and rank > 0 and head is None:
        raise CheckpointError(f"{source}: markov_rank={rank} > 0 needs markov_head_type (one of {MARKOV_KINDS})")
    if head is not None and head not in MARKOV_KINDS:
        raise CheckpointError(f"{source}: markov_head_type={head!r} is not one of {MARKOV_KINDS}")
    hidden = int(need("hidden_size"))
    if hidden != target.hidden_size:
        raise CheckpointError(f"{source}: hidden_size={hidden} but the target's hidden size is {target.hidden_size}; "
                              f"a DFlash draft shares the target's embedding and LM head, so the sizes must match "
                              f"(this draft was trained for another target)")
    vocab = int(_get(d, sub, "vocab_size", target.vocab_size))
    if vocab != target.vocab_size:
        raise CheckpointError(f"{source}: vocab_size={vocab} but the target's vocabulary has {target.vocab_size} "
                              f"tokens; use a draft trained for this target")
    ids = need("target_layer_ids")
    if not isinstance(ids, (list, tuple)) or not ids:
        raise CheckpointError(f"{source}: target_layer_ids={ids!r} must be a non-empty list of target layer ids")
    ids = tuple(int(i) for i in ids)
    bad = [i for i in ids if not 0 <= i < target.num_layers]
    if bad:
        raise CheckpointError(f"{source}: target_layer_ids {list(ids)} has ids {bad} outside the target's layers "
                              f"0..{target.num_layers - 1} (the target has {target.num_layers} decoder layers); "
                              f"this draft was trained for a deeper target")
    mask = need("mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < target.vocab_size:
        raise CheckpointError(f"{source}: mask_token_id={mask!r} is outside the target's vocabulary "
                              f"(0..{target.vocab_size - 1}); the block's mask positions embed it with the "
                              f"target's embedding table")
    block = int(_get(d, sub, "block_size", 16))
    if block < 2:
        raise CheckpointError(f"{source}: block_size={block} must be >= 2 (the anchor and at least one draft)")
    heads = int(need("num_attention_heads"))
    rope = d.get("rope_parameters") or {}
    return BlockDraftConfig(
        kind=kind, hidden_size=hidden, intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")), num_attention_heads=heads,
        num_key_value_heads=int(d.get("num_key_value_heads") or heads),
        head_dim=int(d.get("head_dim") or hidden // heads), vocab_size=vocab, target_layer_ids=ids,
        block_size=block, mask_token_id=mask, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(d.get("rope_theta") or rope.get("rope_theta") or 10000.0),
        rope_scaling=d.get("rope_scaling") or None, max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        attention_bias=bool(d.get("attention_bias", False)), qk_norm=bool(_get(d, sub, "qk_norm", True)),
        output_multiplier=float(_get(d, sub, "output_multiplier", 1.0)),
        logit_softcap=(float(_get(d, sub, "final_logit_softcapping")) if _get(d, sub, "final_logit_softcapping") else None),
        num_target_layers=_get(d, sub, "num_target_layers"), markov_rank=rank,
        markov_head_type=head if rank > 0 else None,
        confidence_head=bool(_get(d, ("dspark_config",), "confidence_head", False)))


def config_dict(cfg: BlockDraftConfig, target_config=None, dtype: str = "float32") -> dict:
    """The published ``config.json`` of ``cfg`` (z-lab's field names; DSpark's under ``dspark_config``)."""
    d = {
        "architectures": [DSPARK_ARCH if cfg.kind == "dspark" else DFLASH_ARCH],
        "model_type": "qwen3", "hidden_act": "silu", "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling, "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": cfg.attention_bias, "vocab_size": cfg.vocab_size, "is_causal": False,
        "tie_word_embeddings": False, "torch_dtype": dtype, "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": {"block_size": cfg.block_size, "target_layer_ids": list(cfg.target_layer_ids),
                          "mask_token_id": cfg.mask_token_id},
    }
    if cfg.kind == "dspark":
        d["dspark_config"] = {"markov_rank": cfg.markov_rank, "markov_head_type": cfg.markov_head_type,
                              "confidence_head": cfg.confidence_head, "gamma": cfg.gamma}
    if target_config is not None:
        d["num_target_layers"] = target_config.num_layers
    return d


def save_block_drafter(model: BlockDraftModel, directory, dtype: torch.dtype = torch.float32,
                       target_config=None, extra_config: Optional[dict] = None) -> pathlib.Path:
    """Write ``model`` in the published layout: ``config.json`` + ``model.safetensors``. Returns the
    directory."""
    from safetensors.torch import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    own = model.state_dict()
    out = {key: own[ours].detach().to(dtype).contiguous() for ours, key in published_key_map(model.cfg).items()}
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    d = config_dict(model.cfg, target_config, dtype=str(dtype).replace("torch.", ""))
    if extra_config:
        d.update(extra_config)
    (directory / "config.json").write_text(json.dumps(d, indent=2) + "\n")
    return directory


def load_block_drafter(path, target, expect_kind: Optional[str] = None) -> BlockDraftModel:
    """Read a DFlash / DSpark draft directory (``config.json`` + ``model.safetensors``) into a
    :class:`BlockDraftModel` bound to ``target`` (a ``specc.models.llama.LlamaModel``: its embedding
    and LM head), fp32, eval mode.

    Raises:
        CheckpointError: no such directory, unreadable config/weights, a config that does not fit the
            target (:func:`parse_block_config`), missing / mis-shaped / unexpected tensors.
    """
    from specc.methods.eagle.loader import read_config_json, read_weights

    directory = pathlib.Path(path)
    source = str(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{source}: not a directory; draft.path must point at a DFlash/DSpark draft "
                              f"directory (config.json + model.safetensors)")
    cfg = parse_block_config(read_config_json(directory), target.config, source, expect_kind)
    sd = {k[len("model."):] if k.startswith("model.") else k: v for k, v in read_weights(directory).items()}
    model = BlockDraftModel(cfg, target.embed, target.lm_head)
    own = model.state_dict()
    keys = published_key_map(cfg)
    with torch.no_grad():
        for ours, key in keys.items():
            if key not in sd:
                if key == "confidence_calibration":
                    continue  # optional: identity calibration
                raise CheckpointError(f"{source}: tensor {key!r} is missing (an incomplete {cfg.kind} draft?)")
            t = sd[key]
            if tuple(t.shape) != tuple(own[ours].shape):
                raise CheckpointError(f"{source}: tensor {key!r} has shape {tuple(t.shape)}, config.json implies "
                                      f"{tuple(own[ours].shape)}; hidden/intermediate/vocab sizes or target_layer_ids "
                                      f"disagree with the weights")
            own[ours].copy_(t.float())
    extra = sorted(k for k in sd if k not in set(keys.values()) and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensors {extra[:4]}; config.json says {cfg.num_layers} layers, "
                              f"markov_rank={cfg.markov_rank}, confidence_head={cfg.confidence_head}")
    return model.eval()


def random_block_drafter(target, kind: str = "dflash", block_size: int = 8, num_layers: int = 1,
                         target_layer_ids: Optional[Sequence[int]] = None, mask_token_id: Optional[int] = None,
                         markov_rank: int = 0, markov_head_type: Optional[str] = None,
                         confidence_head: bool = False, seed: int = 0, std: float = 0.1) -> BlockDraftModel:
    """A randomly initialised draft for ``target`` (tests, and the starting point of training): target
    layer ids default to an even spread (z-lab's ``build_target_layer_ids``: from layer 1 to L − 3),
    the mask token to the last id of the vocabulary."""
    c = target.config
    if target_layer_ids is None:
        L = c.num_layers
        n = min(3, L)
        lo, hi = min(1, L - 1), max(min(1, L - 1), L - 3)
        target_layer_ids = sorted({lo + round(i * (hi - lo) / max(n - 1, 1)) for i in range(n)})
    cfg = BlockDraftConfig(
        kind=kind, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_layers=num_layers,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
        vocab_size=c.vocab_size, target_layer_ids=tuple(int(i) for i in target_layer_ids), block_size=block_size,
        mask_token_id=int(c.vocab_size - 1 if mask_token_id is None else mask_token_id), rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, max_position_embeddings=c.max_model_len, num_target_layers=c.num_layers,
        markov_rank=markov_rank, markov_head_type=(markov_head_type or "vanilla") if markov_rank > 0 else None,
        confidence_head=confidence_head)
    model = BlockDraftModel(cfg, target.embed, target.lm_head)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()


def with_kind(cfg: BlockDraftConfig, **changes) -> BlockDraftConfig:
    """``cfg`` with fields replaced (a frozen dataclass)."""
    return replace(cfg, **changes)
