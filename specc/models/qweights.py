"""Linear weights kept in the checkpoint's own block-quantized codes, and the linear layer that runs them.

A GGUF tensor of a supported type becomes a :class:`QuantWeight` in one of two layouts, holding exactly
the checkpoint's values (``w = d * code + m`` per block, with ``d`` and ``m`` widened to fp32, which is
exact for the fp16 scales and the fp16 x 6/8-bit products of the K-quants):

==========  ======  =====  ============================================================================
GGML type   layout  group  values (ggml-common.h ``block_*``; gguf-py ``quants.py`` dequantizers)
==========  ======  =====  ============================================================================
Q4_0        q4      32     ``d * (code - 8)``: m = -8 d
Q4_1        q4      32     ``d * code + m``
Q4_K        q4      32     super-block of 256: ``d * sc_j * code - dmin * min_j`` per 32-sub-block j
Q8_0        q8      32     ``d * code`` (code int8)
Q6_K        q8      16     super-block of 256: ``d * sc_j * (code6 - 32)`` per 16-sub-block j
==========  ======  =====  ============================================================================

Layouts (``specc/kernels/qgemm.c``): ``q4``: ``qs`` uint8 ``[N, K/32, 16]`` (byte j: low nibble element j,
high nibble element j + 16), ``d``, ``m`` fp32 ``[N, K/32]``; ``q8``: ``qs`` int8 ``[N, K/G, G]``, ``d``
fp32 ``[N, K/G]``; ``f16`` / ``bf16``: ``qs`` the checkpoint's own fp16 / bf16 ``[N, K]`` (a safetensors
F16 / BF16 linear weight, K a multiple of 16), no scales: each value widens to fp32 exactly. Products run in ``specc.kernels.qgemm`` (fp32 activations, weights decoded in
registers; without a C compiler, through ``torch`` on the weight dequantized per call).
Other GGML types (Q5_*, Q2_K, Q3_K, Q5_K, IQ*) are refused by name with the supported list; ``dtype:
float32`` runs them dequantized.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specc.errors import CheckpointError
from specc.models.llama import Linear

#: GGML types kept quantized, with the layout each becomes
SUPPORTED = {"Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4", "Q8_0": "q8", "Q6_K": "q8"}
#: GGML types read as dense fp32 (norms, biases; a GGUF's F16 / BF16 linear weights are widened)
DENSE = ("F32", "F16", "BF16")
#: 16-bit weight dtypes kept in their own bytes (a safetensors checkpoint's F16 / BF16), by layout name
HALF_KINDS = {torch.float16: "f16", torch.bfloat16: "bf16"}
QK = 32
QK_K = 256


def _f16(a: np.ndarray) -> np.ndarray:
    """Little-endian fp16 bytes ``[..., 2]`` -> fp32 ``[...]`` (exact)."""
    return np.ascontiguousarray(a).view(np.float16)[..., 0].astype(np.float32)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes ``[..., 32]`` (0..15) -> the q4 layout's bytes ``[..., 16]`` (low nibble j, high j + 16)."""
    c = codes.astype(np.uint8)
    return (c[..., :16] & 15) | ((c[..., 16:] & 15) << 4)


def unpack_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """The q4 layout's bytes ``[..., 16]`` uint8 -> codes ``[..., 32]`` uint8."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


class QuantWeight:
    """One ``[N, K]`` weight in the q4 or q8 layout (module docstring). ``source``: the GGML type name(s).

    Attributes: kind ``"q4"``/``"q8"``; group (block size); qs, d, m (m is None for q8) CPU tensors."""

    def __init__(self, kind: str, qs: torch.Tensor, d: torch.Tensor, m: Optional[torch.Tensor], source: str):
        self.kind, self.source = kind, source
        self._qs = qs.contiguous()
        self._d = None if d is None else d.contiguous()
        self._m = None if m is None else m.contiguous()
        self._packed = None  # the VNNI kernel's layout (q4 only), which then replaces the q4 layout in memory
        if self.half:
            self.group = 16
            self.shape = (int(qs.shape[0]), int(qs.shape[1]))  # (N, K)
            return
        self.group = QK if kind == "q4" else int(qs.shape[2])
        self.shape = (int(d.shape[0]), int(d.shape[1]) * self.group)  # (N, K)

    @property
    def is_packed(self) -> bool:
        """True once the weight holds the packed int8 layout (:meth:`packed`). A packed weight runs the
        packed products from then on, whatever qgemm variant the process switches to: its plain layout
        is gone (rebuilt only as temporaries), and the packed ISAs give the same bits."""
        return self._packed is not None

    @property
    def runs_packed(self) -> bool:
        """Whether its products run on the packed int8 layout: a packable layout (q4, group-32 q8) that is
        packed already or that the process's qgemm variant packs (``qgemm.packs``); False for 16-bit
        layouts and without the kernels."""
        from specc.kernels import qgemm

        return (not self.half and qgemm.available() and qgemm.packable(self.kind, self.group)
                and (self.is_packed or qgemm.packs()))

    @property
    def half(self) -> bool:
        """True for the 16-bit layouts (``f16``, ``bf16``): the values themselves, no scales."""
        return self.kind in HALF_KINDS.values()

    def _layout(self):
        """``(qs, d, m)`` of the module docstring's layout (unpacked anew when only the packed form is held)."""
        if self._qs is None:
            from specc.kernels import qgemm
            return qgemm.unpack(self.kind, self._packed, *self.shape)
        return self._qs, self._d, self._m

    qs = property(lambda self: self._layout()[0])
    d = property(lambda self: self._layout()[1])
    m = property(lambda self: self._layout()[2])

    def pack_into(self, out: torch.Tensor) -> None:
        """Pack (as :meth:`packed`) into ``out``, a uint8 slice of ``qgemm.packed_bytes`` bytes of an arena."""
        from specc.kernels import qgemm
        self._packed = qgemm.pack(self.kind, self._qs, self._d, self._m, out=out)
        self._qs = self._d = self._m = None

    def packed_size(self) -> int:
        """Bytes :meth:`pack_into` writes."""
        from specc.kernels import qgemm
        return qgemm.packed_bytes(self.kind, *self.shape, qgemm._f16_exact(self._d, self._m))

    def packed(self):
        """The weight in the VNNI kernels' layout (``specc.kernels.qgemm.pack``; q4, and q8 in 32-value
        groups), packed on first use; the plain layout is then dropped (rebuilt on demand by ``qs`` / ``d``
        / ``m``; ``rows`` reads the packed form directly)."""
        if self._packed is None:
            from specc.kernels import qgemm
            self._packed = qgemm.pack(self.kind, self._qs, self._d, self._m)
            self._qs = self._d = self._m = None
        return self._packed

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf(cls, name: str, type_name: str, data: np.ndarray, shape: Tuple[int, int]) -> "QuantWeight":
        """From a GGUF tensor's raw blocks (``data`` uint8 ``[N, bytes per row]`` as gguf-py reads it;
        ``shape`` ``(N, K)``). Raises ``CheckpointError`` for a type outside ``SUPPORTED`` (naming the
        type, the tensor and the supported types) or a row length that is not whole blocks."""
        if type_name not in SUPPORTED:
            raise CheckpointError(
                f"tensor {name!r} is {type_name}, which specc does not run in its own precision (supported: "
                f"{', '.join(SUPPORTED)}; dense: {', '.join(DENSE)}); set target dtype: float32 to run it "
                f"dequantized, or re-quantize the file to one of the supported types")
        N, K = shape
        block = QK_K if type_name in ("Q4_K", "Q6_K") else QK
        if K % block:
            raise CheckpointError(f"tensor {name!r} ({type_name}) has rows of {K} values, not whole blocks of {block}")
        nb = K // block
        raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(N, nb, -1)  # [N, blocks, bytes per block]
        if type_name == "Q4_0":
            d = _f16(raw[..., 0:2])
            return cls.q4(raw[..., 2:18], d, -8.0 * d, type_name)
        if type_name == "Q4_1":
            return cls.q4(raw[..., 4:20], _f16(raw[..., 0:2]), _f16(raw[..., 2:4]), type_name)
        if type_name == "Q8_0":
            return cls.q8(raw[..., 2:34].view(np.int8), _f16(raw[..., 0:2]), type_name)
        if type_name == "Q4_K":  # d, dmin fp16, scales[12] (6-bit sc/min x 8), qs[128]
            from gguf.quants import Q4_K
            d, dmin = _f16(raw[..., 0:2]), _f16(raw[..., 2:4])  # [N, nb]
            sc, mn = Q4_K.get_scale_min(raw[..., 4:16].reshape(-1, 12))  # [N*nb, 8] each
            sc, mn = sc.reshape(N, nb, 8).astype(np.float32), mn.reshape(N, nb, 8).astype(np.float32)
            q = raw[..., 16:144].reshape(N, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
            codes = (q & 15).reshape(N, nb * 8, 32)  # sub-block 2i: low nibbles of chunk i, 2i+1: high
            return cls.q4(pack_nibbles(codes), (d[..., None] * sc).reshape(N, -1),
                          -(dmin[..., None] * mn).reshape(N, -1), type_name)
        # Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d fp16; element order as
        # gguf-py's Q6_K.dequantize_blocks
        qlg = raw[..., 0:128].reshape(N, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        qlg = (qlg & 15).reshape(N, nb, 8, 32)
        qhg = raw[..., 128:192].reshape(N, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
        qhg = (qhg & 3).reshape(N, nb, 8, 32)
        codes = ((qlg | (qhg << 4)).astype(np.int16) - 32).astype(np.int8).reshape(N, nb * 16, 16)
        scales = raw[..., 192:208].view(np.int8).astype(np.float32)  # [N, nb, 16]
        d = _f16(raw[..., 208:210])  # [N, nb]
        return cls.q8(codes, (d[..., None] * scales).reshape(N, -1), type_name)

    @classmethod
    def from_half(cls, name: str, t: torch.Tensor) -> "QuantWeight":
        """A safetensors F16 / BF16 weight ``t [N, K]`` kept in its own bytes. Raises ``CheckpointError``
        for another dtype or a row length that is not a multiple of 16 (the kernel's lanes)."""
        if t.dtype not in HALF_KINDS or t.dim() != 2:
            raise CheckpointError(f"tensor {name!r} is {t.dtype} {list(t.shape)}; the 16-bit layouts take 2-D "
                                  f"float16 / bfloat16 weights")
        if t.shape[1] % 16:
            raise CheckpointError(f"tensor {name!r} has rows of {t.shape[1]} values, not a multiple of 16")
        kind = HALF_KINDS[t.dtype]
        return cls(kind, t, None, None, kind.upper())

    @classmethod
    def q4(cls, qs: np.ndarray, d: np.ndarray, m: np.ndarray, source: str) -> "QuantWeight":
        N = qs.shape[0]
        return cls("q4", torch.from_numpy(np.ascontiguousarray(qs).reshape(N, -1, 16)),
                   torch.from_numpy(np.ascontiguousarray(d, np.float32).reshape(N, -1)),
                   torch.from_numpy(np.ascontiguousarray(m, np.float32).reshape(N, -1)), source)

    @classmethod
    def q8(cls, qs: np.ndarray, d: np.ndarray, source: str) -> "QuantWeight":
        N = qs.shape[0]
        d = np.ascontiguousarray(d, np.float32).reshape(N, -1)
        return cls("q8", torch.from_numpy(np.ascontiguousarray(qs).reshape(N, d.shape[1], -1)),
                   torch.from_numpy(d), None, source)

    def take_rows(self, index: torch.Tensor) -> "QuantWeight":
        """The weight with output rows ``index`` ``[N']`` int64 (a permutation or a selection)."""
        if self.half:
            return QuantWeight(self.kind, self.qs[index], None, None, self.source)
        return QuantWeight(self.kind, self.qs[index], self.d[index], None if self.m is None else self.m[index],
                           self.source)

    @staticmethod
    def cat(parts: Sequence["QuantWeight"]) -> "QuantWeight":
        """Rows of several weights of one layout and group, stacked (``[ΣN, K]``). Raises ``ValueError``
        when the parts differ in layout, group or K."""
        p0 = parts[0]
        if any((p.kind, p.group, p.shape[1]) != (p0.kind, p0.group, p0.shape[1]) for p in parts):
            raise ValueError("QuantWeight.cat needs parts of one layout, group and row length")
        src = "+".join(dict.fromkeys(p.source for p in parts))
        if p0.half:
            if any(p.qs.dtype != p0.qs.dtype for p in parts):
                raise ValueError("QuantWeight.cat needs 16-bit parts of one dtype")
            return QuantWeight(p0.kind, torch.cat([p.qs for p in parts]), None, None, src)
        return QuantWeight(p0.kind, torch.cat([p.qs for p in parts]), torch.cat([p.d for p in parts]),
                           None if p0.m is None else torch.cat([p.m for p in parts]), src)

    # ------------------------------------------------------------------ values
    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows ``ids`` (int64, any shape) -> ``[*ids.shape, K]`` fp32: an embedding lookup."""
        if self._qs is None:
            from specc.kernels import qgemm
            return qgemm.packed_rows(self.kind, self._packed, *self.shape, ids)
        flat = ids.reshape(-1)
        if self.half:
            return self._qs[flat].float().reshape(*ids.shape, self.shape[1])
        qs_all, d_all, m_all = self._layout()
        qs, d = qs_all[flat], d_all[flat]
        if self.kind == "q4":
            codes = unpack_nibbles(qs).float()  # [T, nb, 32]
            w = codes * d[..., None] + m_all[flat][..., None]
        else:
            w = qs.float() * d[..., None]
        return w.reshape(*ids.shape, self.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The whole weight ``[N, K]`` fp32 (the reference the kernels are tested against)."""
        return self.rows(torch.arange(self.shape[0]))

    @property
    def nbytes(self) -> int:
        """Bytes held (codes and fp32 scales, in whichever layout is held)."""
        held = self._packed[:1] if self._qs is None else (self._qs, self._d, self._m)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x [R, K]`` fp32 @ W^T -> ``[R, N]`` fp32 through ``specc.kernels.qgemm`` (row-invariant), or
        ``F.linear`` on the dequantized weight when the kernels are unavailable."""
        from specc.kernels import qgemm
        if self.half:
            return qgemm.h16_matmul(x, self._qs) if qgemm.available() else F.linear(x, self._qs.float())
        if qgemm.available():
            if self.runs_packed:
                return qgemm.packed_matmul(self.kind, x, self.packed(), *self.shape)
            qs, d, m = self._layout()
            return qgemm.q4_matmul(x, qs, d, m) if self.kind == "q4" else qgemm.q8_matmul(x, qs, d)
        return F.linear(x, self.dequantize())

    # ------------------------------------------------------------------ (de)serialization
    def tensors(self, prefix: str) -> Dict[str, torch.Tensor]:
        out = {f"{prefix}.qs": self.qs}
        if self.d is not None:
            out[f"{prefix}.d"] = self.d
        if self.m is not None:
            out[f"{prefix}.m"] = self.m
        return out

    def meta(self) -> str:
        return f"{self.kind}:{self.source}"

    @classmethod
    def from_tensors(cls, prefix: str, meta: str, sd: Dict[str, torch.Tensor]) -> "QuantWeight":
        kind, source = meta.split(":", 1)
        d = None if kind in HALF_KINDS.values() else sd[f"{prefix}.d"]
        return cls(kind, sd[f"{prefix}.qs"], d, sd.get(f"{prefix}.m"), source)


class QuantLinear(Linear):
    """``y = x @ W.T + b`` with ``W`` kept as :class:`QuantWeight` parts stacked along the output (a fused
    q/k/v or gate/up whose parts may differ in type). ``weight`` dequantizes on access (for code that
    reads weights, e.g. training a drafter on the target's head); the forward never does."""

    def __init__(self, parts: List[QuantWeight], bias: Optional[torch.Tensor] = None):
        nn.Module.__init__(self)  # not Linear.__init__: there is no dense weight parameter
        merged: List[QuantWeight] = []
        for p in parts:  # stack neighbours of one layout into one kernel call
            if merged and (merged[-1].kind, merged[-1].group) == (p.kind, p.group):
                merged[-1] = QuantWeight.cat([merged[-1], p])
            else:
                merged.append(p)
        self.parts = merged
        self.in_features = parts[0].shape[1]
        self.out_features = sum(p.shape[0] for p in parts)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.row_chunk = None

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])  # [out, in] fp32

    @property
    def formats(self) -> str:
        return "+".join(p.source for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def use_cpu_fast(self) -> None:  # the quantized path is the fast path
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()
        ys = [p.matmul(x2) for p in self.parts]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def _fused(parts: List["QuantWeight | torch.Tensor"], bias: Optional[torch.Tensor]) -> Linear:
    """One linear over stacked parts: a :class:`QuantLinear` when every part is quantized, else a dense
    fp32 ``Linear`` (a dense part, e.g. an F16 tensor among quantized ones, widens the whole)."""
    if all(isinstance(p, QuantWeight) for p in parts):
        return QuantLinear(list(parts), bias)
    w = torch.cat([p.dequantize() if isinstance(p, QuantWeight) else p.float() for p in parts])  # [out, in]
    lin = Linear(w.shape[1], w.shape[0], bias=bias is not None)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias)
    lin.requires_grad_(False)
    lin.use_cpu_fast()
    return lin


def build_native_model(config, state: Dict[str, "QuantWeight | torch.Tensor"], source: str):
    """A CPU ``LlamaModel`` whose linear layers keep the checkpoint's codes (``QuantLinear``; q/k/v and
    gate/up fused as the dense model fuses them) and whose token embedding is looked up from them
    (``LlamaModel.embed_table``). ``state``: HF names -> ``QuantWeight`` or fp32 tensors (norms, biases,
    dense types). Raises ``CheckpointError`` for a missing or mis-shaped tensor."""
    from specc.models.llama import LlamaModel

    c = config
    H = c.hidden_size
    used = set()

    def take(name: str, shape: Tuple[int, ...]):
        if name not in state:
            raise CheckpointError(f"{source}: tensor {name!r} is missing")
        t = state[name]
        got = t.shape if isinstance(t, QuantWeight) else tuple(t.shape)
        if tuple(got) != tuple(shape):
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(got)}, the config implies {tuple(shape)}")
        used.add(name)
        return t

    def dense(name: str, shape: Tuple[int, ...]) -> nn.Parameter:
        t = take(name, shape)
        t = t.dequantize() if isinstance(t, QuantWeight) else t.float()
        return nn.Parameter(t.contiguous(), requires_grad=False)

    with torch.device("meta"):
        model = LlamaModel(c)
    emb = take("model.embed_tokens.weight", (c.vocab_size, H))
    head = emb if c.tie_word_embeddings else take("lm_head.weight", (c.vocab_size, H))
    model.output = _fused([head], None)
    if isinstance(emb, QuantWeight):
        model.embed_table = emb
        if not c.tie_word_embeddings:
            model.embed_tokens = nn.Parameter(torch.empty(0), requires_grad=False)  # never read: embed_table
    elif not c.tie_word_embeddings:
        model.embed_tokens = nn.Parameter(emb.float().contiguous(), requires_grad=False)
    model.norm.weight = dense("model.norm.weight", (H,))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        layer.attn_norm.weight = dense(p + "input_layernorm.weight", (H,))
        layer.ffn_norm.weight = dense(p + "post_attention_layernorm.weight", (H,))
        qkv = [take(p + "self_attn.q_proj.weight", (c.q_size, H)), take(p + "self_attn.k_proj.weight", (c.kv_size, H)),
               take(p + "self_attn.v_proj.weight", (c.kv_size, H))]
        bias = None
        if c.attention_bias:
            bias = torch.cat([dense(p + f"self_attn.{n}_proj.bias", (s,)).data
                              for n, s in (("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size))])
        layer.attn.wqkv = _fused(qkv, bias)
        layer.attn.wo = _fused([take(p + "self_attn.o_proj.weight", (H, c.q_size))], None)
        layer.ffn.w13 = _fused([take(p + "mlp.gate_proj.weight", (c.intermediate_size, H)),
                                take(p + "mlp.up_proj.weight", (c.intermediate_size, H))], None)
        layer.ffn.w2 = _fused([take(p + "mlp.down_proj.weight", (H, c.intermediate_size))], None)
    extra = sorted(k for k in state if k not in used and k != "lm_head.weight")
    if extra:
        raise CheckpointError(f"{source}: unexpected tensors {extra[:5]}")
    return use_c_norms(model.eval())


def use_c_norms(model):
    """Route the model's RMSNorms through the C kernel, and — when every decoder layer's linears are
    ``QuantLinear`` s — every layer through the C layer parts (``DecoderLayer._fused``: its attention is
    the C one, row- and slot-invariant, which the VNNI variant's int8 activations need for exactness),
    when the kernels are available. Returns model."""
    from specc.kernels import qgemm
    from specc.models.llama import RMSNorm
    on = qgemm.available()
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.c_kernel = on
    fused = on and all(isinstance(lin, QuantLinear) for layer in model.layers
                       for lin in (layer.attn.wqkv, layer.attn.wo, layer.ffn.w13, layer.ffn.w2))
    for layer in model.layers:  # all layers or none: the forward builds one mask layout for all of them
        layer.fused = fused
    model.c_layers = fused
    if on and qgemm.packs():
        pack_in_order(model)
    return model


def pack_in_order(model) -> int:
    """Repack the model's VNNI-packable weights into one buffer in the order a forward reads them (each
    layer's q/k/v, o, gate/up, down, then the head): one sequential stream from the first layer to the
    head, which the CPU's prefetchers follow across weights (measured ~1.4x the rate of separately
    allocated weights). Returns the buffer's size in bytes (0 when nothing was left to pack)."""
    from specc.kernels import qgemm
    order = []
    for layer in model.layers:
        for lin in (layer.attn.wqkv, layer.attn.wo, layer.ffn.w13, layer.ffn.w2):
            order += getattr(lin, "parts", [])
    order += getattr(model.output, "parts", [])
    todo, seen = [], set()
    for w in order:
        if id(w) not in seen and w._packed is None and qgemm.packable(w.kind, w.group):
            seen.add(id(w))
            todo.append(w)
    sizes = [w.packed_size() for w in todo]
    if not todo:
        return 0
    arena = torch.empty(sum(sizes) + 64 * len(sizes), dtype=torch.uint8)
    off = (-arena.data_ptr()) % 64
    for w, n in zip(todo, sizes):
        w.pack_into(arena[off: off + n])
        off += n + (-(arena.data_ptr() + off + n)) % 64  # every weight starts on a cache line
    return int(arena.numel())


def native_tensors(model) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """The tensors and safetensors metadata of a native model (``build_native_model``'s result), for the
    loader's cache: each ``QuantLinear`` part ``<module>.<i>.qs/.d/.m`` with its layout in the metadata,
    dense linears as ``<module>.weight``, norms and biases as they are, and the embedding table when it
    is not the head's own weight."""
    import json
    tensors: Dict[str, torch.Tensor] = {}
    meta: Dict[str, str] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear):
            meta[name] = json.dumps([p.meta() for p in mod.parts])
            for i, part in enumerate(mod.parts):
                tensors.update(part.tensors(f"{name}.{i}"))
            if mod.bias is not None:
                tensors[f"{name}.bias"] = mod.bias.detach()
        elif isinstance(mod, Linear):
            tensors[f"{name}.weight"] = mod.weight.detach().contiguous()
            if mod.bias is not None:
                tensors[f"{name}.bias"] = mod.bias.detach()
        elif hasattr(mod, "eps") and isinstance(getattr(mod, "weight", None), torch.Tensor):  # RMSNorm
            tensors[f"{name}.weight"] = mod.weight.detach()
    table = model.embed_table
    if table is not None and not (isinstance(model.output, QuantLinear) and model.output.parts[0] is table):
        meta["embed_table"] = table.meta()
        tensors.update(table.tensors("embed_table"))
    elif table is None and not model.config.tie_word_embeddings:
        tensors["embed_tokens"] = model.embed_tokens.detach()
    return tensors, meta


def model_from_native_tensors(config, tensors: Dict[str, torch.Tensor], meta: Dict[str, str], source: str):
    """The inverse of :func:`native_tensors` (``tensors`` may be views of a mapped file: everything but the
    codes is copied, so once the codes are repacked no view keeps the file mapped). Raises
    ``CheckpointError`` when a tensor is missing."""
    import json
    from specc.models.llama import LlamaModel, RMSNorm

    try:
        with torch.device("meta"):
            model = LlamaModel(config)
        for name, mod in list(model.named_modules()):
            if isinstance(mod, Linear):
                parent, _, attr = name.rpartition(".")
                owner = model.get_submodule(parent) if parent else model
                bias = tensors.get(f"{name}.bias")
                bias = None if bias is None else bias.clone()  # own memory: no view keeps the file mapped
                if name in meta:
                    parts = [QuantWeight.from_tensors(f"{name}.{i}", m, tensors) for i, m in enumerate(json.loads(meta[name]))]
                    new = QuantLinear(parts, bias)
                else:
                    w = tensors[f"{name}.weight"].clone()
                    new = _fused([w], bias)
                setattr(owner, attr, new)
            elif isinstance(mod, RMSNorm):
                mod.weight = nn.Parameter(tensors[f"{name}.weight"].clone(), requires_grad=False)
        if "embed_table" in meta:
            model.embed_table = QuantWeight.from_tensors("embed_table", meta["embed_table"], tensors)
        elif config.tie_word_embeddings and isinstance(model.output, QuantLinear):
            model.embed_table = model.output.parts[0]
        if not config.tie_word_embeddings:
            emb = tensors.get("embed_tokens")
            model.embed_tokens = nn.Parameter(emb.clone() if emb is not None else torch.empty(0), requires_grad=False)
    except KeyError as exc:
        raise CheckpointError(f"{source}: cached tensor {exc} is missing") from None
    return use_c_norms(model.eval())


@torch.inference_mode()
def agreement(native, reference, prompts: Sequence[Sequence[int]], new_tokens: int = 32) -> Dict[str, float]:
    """How closely a native-precision model follows its fp32-dequantized reference, teacher-forced on the
    reference's greedy continuation of each prompt (both models see the same tokens at every step).

    Args: native, reference: ``LlamaModel`` s of one checkpoint; prompts: token-id lists; new_tokens:
    steps per prompt. Returns ``{"steps", "top1_agreement" (fraction of steps whose argmax agrees),
    "max_abs_logit_diff", "mean_abs_logit_diff"}`` (logit units). Both models' caches are set up here."""
    from specc.models.llama import prefill

    longest = max(len(p) for p in prompts) + new_tokens + 1
    for m in (native, reference):
        m.setup_cache(1, longest)
    steps = agree = 0
    worst = total = 0.0
    for ids in prompts:
        ln, lens, _ = prefill(native, [list(ids)])
        lr, _, _ = prefill(reference, [list(ids)])
        pos = int(lens[0])
        for i in range(new_tokens):
            diff = (ln[0] - lr[0]).abs()
            worst, total = max(worst, float(diff.max())), total + float(diff.mean())
            nxt = int(lr[0].argmax())
            agree += int(int(ln[0].argmax()) == nxt)
            steps += 1
            tok, where = torch.tensor([[nxt]]), torch.tensor([[pos + i]])
            ln = native(tok, where)[0][:, -1]
            lr = reference(tok, where)[0][:, -1]
    return {"steps": steps, "top1_agreement": agree / max(steps, 1), "max_abs_logit_diff": worst,
            "mean_abs_logit_diff": total / max(steps, 1)}
