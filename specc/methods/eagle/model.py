"""EAGLE and EAGLE-3 draft heads: one decoder layer over target features, with its own KV cache.

Architecture (facts from the SafeAILab EAGLE repository, `eagle/model/cnets1.py` = EAGLE-1 and
`eagle/model/cnets.py` = EAGLE-3; our own code):

* **EAGLE** (`kind="eagle"`): ``x = fc([embed(token); f])`` with ``fc: 2H -> H`` (bias optional,
  config field ``bias``), then one Llama decoder layer *without* an input norm (layer 0 of
  `cnets1.py` skips ``input_layernorm``). Its output ``g`` is fed straight into the **target's** LM
  head (no extra norm) and, at the next draft step, back in as the feature ``f``. The target feature
  is the target's final hidden state *after* its final RMSNorm (EAGLE reads ``outputs[0]`` of the HF
  ``LlamaModel``). Embedding and LM head are shared with the target.
* **EAGLE-3** (`kind="eagle3"`): the target feature is the concatenation of three target hidden
  states (low / middle / high layer, ``3·H_t``), fused by ``fc: 3·H_t -> H`` (no bias). The decoder
  layer (``midlayer``) normalises the token embedding (``input_layernorm``) and the fused feature
  (``hidden_norm``) separately, attends over their concatenation (``q/k/v_proj: 2H -> ...``) and
  adds the *fused feature* as the residual. The head has its own ``norm`` and ``lm_head`` over a
  reduced draft vocabulary of ``draft_vocab_size`` tokens; draft id ``d`` is target id
  ``d + d2t[d]`` (`cnets.py` ``topK_genrate``). At later draft steps the feature is the layer's own
  output ``g`` (pre-norm), which bypasses ``fc``.

Draft positions: the pair (target feature at position ``p``, token at ``p+1``) sits at draft
position ``p`` and predicts the token at ``p+2``. The KV cache is written by position (gpt-fast's
rule, meta-pytorch/gpt-fast ``model.py:110``: roll back by position): a rejected draft's entries are overwritten
by the next
draft-extend and hidden meanwhile by the causal-by-position mask.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from specc.kernels import cpu_gemm

KINDS = ("eagle", "eagle3")


@dataclass(frozen=True)
class EagleConfig:
    """Shape and numerics of one EAGLE / EAGLE-3 head.

    ``vocab_size`` is the target vocabulary; ``draft_vocab_size`` the head's own output vocabulary
    (EAGLE-3 only; equals ``vocab_size`` for EAGLE). ``aux_layer_ids`` (EAGLE-3) are the target
    decoder layers (0-based) whose *outputs* are concatenated low -> high (SGLang/vLLM's
    ``eagle_aux_hidden_state_layer_ids``); SafeAILab's default capture "input of layers
    {2, N//2, N-3}" is outputs ``(1, N//2 - 1, N - 4)``.
    """

    kind: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048
    fc_bias: bool = False
    aux_layer_ids: tuple = ()
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def feature_size(self) -> int:
        """Width of the target feature the head consumes: ``H_t`` (EAGLE) or ``3·H_t`` (EAGLE-3)."""
        return self.target_hidden_size * (3 if self.kind == "eagle3" else 1)


def default_aux_layer_ids(num_target_layers: int) -> tuple:
    """SafeAILab EAGLE-3's capture points as target-layer *output* ids.

    `eagle/model/modeling_llama_kv.py` appends the hidden state entering layers
    ``{2, N//2, N-3}``, i.e. the outputs of layers ``{1, N//2 - 1, N - 4}`` (SGLang's
    ``layers_to_capture = [val + 1 for val in layer_ids]`` uses the same output convention).
    """
    n = num_target_layers
    return (1, n // 2 - 1, n - 4)


class RMSNorm(nn.Module):
    """Llama RMSNorm in fp32: ``w * x / sqrt(mean(x^2) + eps)``; ``x [..., H]``."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[dict]) -> torch.Tensor:
    """RoPE inverse frequencies ``[head_dim/2]`` fp32, with HF's ``linear`` and ``llama3`` scaling.

    Formulas: Su et al. (RoFormer); ``llama3`` scaling as in HF transformers
    ``_compute_llama3_parameters``. Raises ``ValueError`` for another scaling type.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = float(scaling.get("factor", 1.0))
        if kind in ("linear",):
            inv = inv / factor
        elif kind == "llama3":
            lo = float(scaling.get("low_freq_factor", 1.0))
            hi = float(scaling.get("high_freq_factor", 4.0))
            old = float(scaling.get("original_max_position_embeddings", 8192))
            wavelen = 2 * math.pi / inv
            smooth = (old / wavelen - lo) / (hi - lo)
            scaled = torch.where(wavelen > old / lo, inv / factor, inv)
            mid = (1 - smooth) * scaled / factor + smooth * scaled
            is_mid = (wavelen <= old / lo) & (wavelen >= old / hi)
            inv = torch.where(is_mid, mid, scaled)
        elif kind in (None, "default"):
            pass
        else:
            raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3)")
    return inv.float()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. ``x [B, h, N, d]``, ``positions [B, N]`` int64 -> ``[B, h, N, d]``."""
    ang = positions.float()[:, None, :, None] * inv_freq[None, None, None, :]  # [B,1,N,d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


class DraftKVCache:
    """The head's own KV cache, written at absolute positions.

    ``k, v [B, n_kv, S, d]`` fp32. Nothing is ever copied back on rejection: the next draft-extend
    overwrites the rejected slots, and the causal-by-position mask hides them until then.
    """

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype=torch.float32, device=None):
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v [B, n_kv, N, d]`` of cache rows ``0..B-1`` at ``slots [B, N]`` (int64, < max_len)."""
        B = slots.shape[0]  # rows 0..B-1 of the cache
        idx = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        self.k[:B].scatter_(2, idx, k.to(self.k.dtype))
        self.v[:B].scatter_(2, idx, v.to(self.v.dtype))


class EagleAttention(nn.Module):
    """GQA self-attention whose q/k/v projections read ``in_size`` (H for EAGLE, 2H for EAGLE-3)."""

    def __init__(self, cfg: EagleConfig, in_size: int):
        super().__init__()
        self.cfg = cfg
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_size, h * d, bias=False)
        self.k_proj = nn.Linear(in_size, kv * d, bias=False)
        self.v_proj = nn.Linear(in_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(d, cfg.rope_theta, cfg.rope_scaling),
                             persistent=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """``x [B, N, in]`` -> roped ``q [B, h, N, d]``, ``k, v [B, n_kv, N, d]``."""
        B, N, _ = x.shape
        h, kv, d = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        q = _lin(self.q_proj, x).view(B, N, h, d).transpose(1, 2)
        k = _lin(self.k_proj, x).view(B, N, kv, d).transpose(1, 2)
        v = _lin(self.v_proj, x).view(B, N, kv, d).transpose(1, 2)
        return apply_rope(q, positions, self.inv_freq), apply_rope(k, positions, self.inv_freq), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: Optional[DraftKVCache],
                cache_slots: Optional[torch.Tensor], attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """``x [B, N, in]`` -> ``[B, N, H]``.

        With a cache: k/v are written at ``cache_slots`` (default ``positions``) and the query
        attends to cache slots ``[0, S)`` under ``attn_mask [B, N, S]`` bool (default: slot ``j``
        visible iff ``j <= position``). Without a cache: causal attention within ``x``.
        """
        q, k, v = self.project(x, positions)
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if cache is None:
            k_all, v_all = k, v
            n = x.shape[1]
            if attn_mask is None:
                mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[None, None]
            else:
                mask = attn_mask[:, None]
        else:
            slots = positions if cache_slots is None else cache_slots
            cache.write(slots, k, v)
            if attn_mask is None:
                s_used = int(positions.max().item()) + 1  # slots beyond the latest position are hidden
                keys = torch.arange(s_used, device=x.device)
                mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # [B,1,N,S]
            else:
                s_used = attn_mask.shape[-1]
                mask = attn_mask[:, None]
            B = x.shape[0]
            k_all, v_all = cache.k[:B, :, :s_used], cache.v[:B, :, :s_used]  # [B, n_kv, S, d]
        if rep > 1:
            k_all = k_all.repeat_interleave(rep, dim=1)
            v_all = v_all.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)  # [B,h,N,d]
        B, _, N, _ = o.shape
        return _lin(self.o_proj, o.transpose(1, 2).reshape(B, N, -1))


class EagleMLP(nn.Module):
    """SwiGLU MLP ``down(silu(gate(x)) * up(x))``; ``[..., H] -> [..., H]``."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _lin(self.down_proj, F.silu(_lin(self.gate_proj, x)) * _lin(self.up_proj, x))


class EagleLayer(nn.Module):
    """The head's decoder layer. EAGLE: no input norm, attention over ``fc`` output (H).
    EAGLE-3: ``attn([input_layernorm(emb); hidden_norm(f)])`` (2H) with ``f`` as residual."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.kind = cfg.kind
        in_size = cfg.hidden_size * (2 if cfg.kind == "eagle3" else 1)
        self.self_attn = EagleAttention(cfg, in_size)
        self.mlp = EagleMLP(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.kind == "eagle3":
            self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, emb, hidden, positions, cache, cache_slots, attn_mask):
        """``emb [B,N,H]`` (EAGLE-3 only; None for EAGLE), ``hidden [B,N,H]`` -> ``[B,N,H]``."""
        residual = hidden
        if self.kind == "eagle3":
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)  # [B,N,2H]
        else:
            x = hidden
        h = residual + self.self_attn(x, positions, cache, cache_slots, attn_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleModel(nn.Module):
    """One EAGLE / EAGLE-3 head. Parameter names follow the published layouts after the loader's
    renaming (`specc.methods.eagle.loader`): ``fc``, ``layer`` (= ``layers.0`` / ``midlayer``),
    ``norm``, ``lm_head`` and the buffers ``d2t`` [Vd] int64, ``t2d`` [V] bool.

    ``embed`` (ids [B,N] int64 -> [B,N,H] fp32) is the target's embedding; ``target_lm_head``
    ([..., H] -> [..., V] fp32) is the target's LM head, required for EAGLE, unused by EAGLE-3.
    They are held as plain callables so that ``state_dict()`` holds only the head's own weights.
    """

    def __init__(self, cfg: EagleConfig, embed: Callable, target_lm_head: Optional[Callable] = None):
        super().__init__()
        if cfg.kind not in KINDS:
            raise ValueError(f"EagleConfig.kind must be one of {KINDS}, got {cfg.kind!r}")
        self.cfg = cfg
        self._embed = embed
        self._target_lm_head = target_lm_head
        self.fc = nn.Linear(cfg.feature_size + (cfg.hidden_size if cfg.kind == "eagle" else 0),
                            cfg.hidden_size, bias=cfg.fc_bias)
        self.layer = EagleLayer(cfg)
        if cfg.kind == "eagle3":
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
            if cfg.draft_vocab_size == cfg.vocab_size:
                t2d = torch.ones(cfg.vocab_size, dtype=torch.bool)
            else:
                t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
            self.register_buffer("d2t", d2t)
            self.register_buffer("t2d", t2d)

    # ---- the head ---------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int, device=None) -> DraftKVCache:
        """A zeroed cache for ``batch`` rows of ``max_len`` draft positions."""
        c = self.cfg
        return DraftKVCache(batch, c.num_key_value_heads, max_len, c.head_dim, device=device)

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: Optional[DraftKVCache] = None, cache_slots: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None, from_target: bool = True) -> torch.Tensor:
        """One pass of the head over ``N`` (feature, token) pairs.

        ``tokens [B,N]`` int64 target ids (the token *after* each feature's position);
        ``features [B,N,F]`` fp32: target features (``F = feature_size``, ``from_target=True``) or the
        head's own previous outputs (``F = H``, ``from_target=False``); ``positions [B,N]`` int64
        draft positions. Returns the layer output ``g [B,N,H]`` (pre-norm), which is both the next
        step's feature and the input of :meth:`logits`.
        """
        emb = self._embed(tokens).float()  # [B,N,H]
        if self.cfg.kind == "eagle":
            x = _lin(self.fc, torch.cat([emb, features.float()], -1))  # [B,N,H]
            return self.layer(None, x, positions, cache, cache_slots, attn_mask)
        hidden = _lin(self.fc, features.float()) if from_target else features.float()  # [B,N,H]
        return self.layer(emb, hidden, positions, cache, cache_slots, attn_mask)

    def draft_logits(self, g: torch.Tensor) -> torch.Tensor:
        """Head logits ``[..., Vd]`` fp32 from layer output ``g [..., H]`` (EAGLE: ``Vd = V``, through
        the target's LM head; EAGLE-3: own ``norm`` + ``lm_head`` over the draft vocabulary)."""
        if self.cfg.kind == "eagle":
            if self._target_lm_head is None:
                raise ValueError("an EAGLE head needs the target's LM head (target_lm_head=None)")
            return self._target_lm_head(g).float()
        return _lin(self.lm_head, self.norm(g))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids: ``d + d2t[d]`` (identity for EAGLE / full vocab)."""
        if self.cfg.kind == "eagle" or self.cfg.draft_vocab_size == self.cfg.vocab_size:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    def target_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """Scatter draft-vocabulary probabilities ``[..., Vd]`` into the target vocabulary
        ``[..., V]`` (zero outside the draft vocabulary), so standard verification sees a ``q``
        over the target's ids (SGLang eagle_utils.py:739-748 refuses a vocab-mismatched ``q``)."""
        if draft_probs.shape[-1] == self.cfg.vocab_size:
            return draft_probs
        out = draft_probs.new_zeros(*draft_probs.shape[:-1], self.cfg.vocab_size)
        idx = (torch.arange(self.cfg.draft_vocab_size, device=draft_probs.device) + self.d2t)
        out[..., idx] = draft_probs
        return out

    # ---- inference speed-up -----------------------------------------------------------------
    def prepare_inference(self) -> "EagleModel":
        """Cache CPU copies of the weights for small-row matmuls (torch's fp32 GEMM is slow for 2-16
        rows here): ``[out, in]`` for the skinny GEMM of ``specc.kernels.cpu_gemm`` (1..16 rows) and
        ``[in, out]`` for numpy's BLAS (17..64 rows). Call after loading weights."""
        self.eval()
        for m in self.modules():
            if isinstance(m, nn.Linear):
                _cache_weights(m)
        return self


def _cache_weights(m: nn.Linear) -> None:
    w = m.weight.detach().float()
    m._w = w.contiguous()  # [out, in]
    m._wt = w.t().contiguous()  # [in, out]
    m._wver = m.weight._version  # in-place updates (load_state_dict, copy_) bump it


def _lin(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``m(x)``; on CPU without grad and with :meth:`EagleModel.prepare_inference` done, the skinny
    GEMM (1..16 rows, where available) or a numpy matmul (up to 64 rows) on the cached weights:
    identical maths, several times faster than ``F.linear`` for few rows on this CPU."""
    wt = getattr(m, "_wt", None)
    if (wt is None or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32
            or m.weight.device.type != "cpu"):
        return m(x)
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n > 64:
        return m(x)
    if m._wver != m.weight._version or m._w.device != m.weight.device:  # weights changed since cached
        _cache_weights(m)
    xn = rows.contiguous().numpy()
    if n <= 16 and cpu_gemm.available():
        y = torch.from_numpy(cpu_gemm.skinny_matmul(xn, m._w.numpy()))  # [n, out]
    else:
        y = torch.from_numpy(xn @ m._wt.numpy())
    if m.bias is not None:
        y = y + m.bias
    return y.view(*x.shape[:-1], -1)
