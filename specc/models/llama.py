"""Our Llama-family decoder (Llama 2/3.x, Mistral without sliding window, Qwen2, SmolLM2) in plain PyTorch.

Layout follows gpt-fast (meta-pytorch/gpt-fast ``model.py:97-113``, ``KVCache``): one static KV
cache per layer, ``[max_batch, kv_heads,
max_seq, head_dim]``, written at *slots* given by the caller. Rejected draft tokens need no rollback:
the next step writes over their slots and the mask hides what was not overwritten.

Conventions (the public contract other modules rely on):

* ``forward(input_ids [B, N], positions [B, N], cache_slots [B, N] | None, attn_mask [B, N, S] | None,
  hidden_layers)``. ``positions`` drive RoPE; ``cache_slots`` say where each new token's K/V go
  (default: the position). With ``attn_mask=None`` the mask is causal *by position*: query ``(b, n)``
  sees cache slot ``j`` of row ``b`` iff ``j <= positions[b, n]`` (so it needs the slots ``0..p`` to
  hold the sequence's own tokens). An explicit mask is ``[B, N, S]`` bool, ``True`` = may attend, over
  cache slots ``0..S-1`` of row ``b`` (``S <= max_seq``; tree verify passes one).
* ``hidden_layers`` index ``i`` in ``0..num_layers-1`` returns the output of decoder layer ``i``
  (the residual stream after that layer, *before* the final norm; HF's ``hidden_states[i + 1]`` for
  every layer but the last). Index ``num_layers`` returns the final-norm output, the exact input of
  ``lm_head`` (HF's ``last_hidden_state``; EAGLE-1 reads this one; EAGLE-3 reads low/mid/high
  layers such as ``(2, L // 2, L - 3)``).
* Batches of prompts of different lengths are *right-padded* (``pad_prompts``): every row has
  positions ``0..N-1``; a row's pad tokens sit at slots ``>= its length``, see only real tokens and
  themselves, and are overwritten when that row decodes its next tokens at those positions. Read a
  row's next-token logits at index ``length - 1``. Pad rows' logits are garbage by design.
* Batch rows ``0..B-1`` of the cache are used by a forward over ``B`` rows.

CPU speed: torch's fp32 GEMM is slow here for the few-row matmuls of decoding; ``Linear`` stores its
weight transposed (``[in, out]`` contiguous; the ``weight`` parameter is a view of it) and calls
numpy's BLAS (OpenBLAS, threads set by ``configure_cpu_threads``) for inference on
CPU. Attention is eager (one ``baddbmm`` for scale + mask, softmax, ``bmm``; GQA by grouping query
heads, no K/V repeat), RoPE is applied to q and k in one ``addcmul``. tools/bench_decode.py
measures batch-1 decode of SmolLM2-135M against transformers. CUDA and autograd use ``F.linear``;
the forward never calls ``.item()`` on CUDA (the attended cache length is then the full
``max_seq``), so a decode or verify step can be captured in a CUDA graph.
"""
from __future__ import annotations

import ctypes
import math
import os
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specc.errors import CheckpointError, PromptError
from specc.models.config import LlamaConfig
from specc.kernels.cpu_gemm import skinny_matmul
from specc.models.cpu_matmul import path_table

if TYPE_CHECKING:
    from collections import Counter


# ----------------------------------------------------------------------------------- BLAS threads
def set_blas_threads(n: Optional[int] = None) -> bool:
    """Set numpy's OpenBLAS thread count for the whole process (default: ``torch.get_num_threads()``)
    with threadpoolctl. Idle OpenBLAS workers spin, so a pool larger than the cores left free slows a
    decode step several-fold (see :func:`configure_cpu_threads`). Returns False when numpy does not use
    OpenBLAS (nothing is changed)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    n = int(n or torch.get_num_threads())
    if not any(info.get("internal_api") == "openblas" for info in threadpool_info()):
        return False
    threadpool_limits(limits=n, user_api="blas")  # not used as a context manager: stays in force
    return True


def default_cpu_threads() -> int:
    """The CPU thread count used when nobody chose one: ``OMP_NUM_THREADS`` when set, else 1. One
    thread is the fastest setting measured on this project's shared 2-core machines, for every
    forward shape decoding uses (``python tools/bench_threads.py`` prints the table; the README
    keeps the numbers): a second thread only pays on a machine nobody else is using."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else 1


def configure_cpu_threads(n: Optional[int] = None) -> None:
    """Give numpy's OpenBLAS ``n`` threads (default: the count of the previous call, else
    :func:`default_cpu_threads`) and torch's own OpenMP pool one thread. On the CPU fast path the matmuls run in OpenBLAS and torch only runs the
    small element-wise ops; when both pools have several threads their idle workers spin against each
    other. Measured on SmolLM2-135M, batch-1 decode on a 2-core machine with nothing else running
    (torch threads / OpenBLAS threads): 1/1 18.4 tok/s, 1/2 19.4, 2/1 15.5, 2/2 2.6. The skinny GEMM
    of the 2..16-row products (``specc.kernels.cpu_gemm``) gets ``n`` threads too. Global process
    state, like ``torch.set_num_threads``: call it again after changing torch's thread count."""
    from specc.kernels import cpu_gemm, qgemm

    global _cpu_threads
    n = int(n or _cpu_threads or default_cpu_threads())
    set_blas_threads(n)
    cpu_gemm.set_threads(n)
    qgemm.set_threads(n)
    torch.set_num_threads(1)
    _cpu_threads = n


_cpu_threads = 0  # the last configure_cpu_threads count (0 = never called); torch's own is 1 after it


def kv_zeros(shape: Tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A zero KV-cache tensor. On the CPU it lives in an anonymous memory map: the kernel hands out
    zero pages and commits each only when it is first written, so a cache sized for a plan's largest
    bucket x the context costs resident memory only for the slots requests actually fill
    (``torch.zeros`` writes, and so commits, every page at once). Elsewhere ``torch.zeros``."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import mmap

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < (1 << 20):
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


def kv_bytes(model: "LlamaModel") -> int:
    """Bytes the model's KV caches span (reserved; on the CPU committed only as slots are written)."""
    return sum(t.numel() * t.element_size() for layer in model.layers
               for t in (layer.attn.k_cache, layer.attn.v_cache) if t is not None)


def resident_bytes() -> Optional[int]:
    """This process's resident memory now (``VmRSS`` of ``/proc/self/status``), or None off Linux."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def layer_program(model: "LlamaModel") -> str:
    """How a forward of ``model`` runs its decoder layers on the CPU: ``"in one C call per forward"``
    (``qgemm.decoder_stack``), ``"one C layer at a time"`` (``DecoderLayer._fused``) or ``"torch eager"``."""
    if not model.c_layers:
        return "torch eager"
    if model.c_stack and model.max_seq_len and model._c_stack() is not None:
        return "in one C call per forward"
    return "one C layer at a time"


def forward_tiles(model: "nn.Module", rows: int) -> "Counter":
    """The compiled ``qgemm.c`` tiles one CPU forward of ``model`` over ``rows`` packed token rows runs:
    ``specc.kernels.qgemm.Tile`` → row chunks, summed over every product of its native linears (each part of
    each ``QuantLinear``: four per decoder layer and the head, when they are whole). What
    ``qgemm.tile_trace`` records around that forward; empty for a model without native weights or without
    the kernels. Raises ``ValueError`` for ``rows < 1``."""
    from collections import Counter

    from specc.kernels import qgemm

    out: Counter = Counter()
    if not qgemm.available():
        return out
    for m in model.modules():
        for part in getattr(m, "parts", ()):
            out.update(qgemm.walk(qgemm.product_of(part), rows))
    return out


def runs_native(model: "nn.Module") -> bool:
    """Whether ``model``'s linear weights are held in the checkpoint's own bytes (``QuantLinear`` s of
    ``specc.models.qweights``: GGML codes or fp16 / bf16 values) rather than as dense torch parameters."""
    return any(hasattr(m, "parts") for m in model.modules())


def weights_report(model: "LlamaModel") -> str:
    """One phrase on how the target's linear weights are held: their GGML types and bytes, the 16-bit
    tensors a native HF load had to widen (``model.widened``) and the kernel variant for the native
    path (``specc.models.qweights``), else the dense dtype and bytes."""
    quant = [m for m in model.modules() if hasattr(m, "parts")]
    if quant:
        from specc.kernels import qgemm
        types = sorted({p.source for m in quant for p in m.parts})
        held = sum(m.nbytes for m in quant)
        dense = sum(p.numel() * p.element_size() for p in model.parameters())
        kern = f"qgemm {qgemm.variant()}" if qgemm.available() else f"torch fallback ({qgemm.status()})"
        widened = model.widened
        note = (f"; {len(widened)} 16-bit tensor(s) widened to fp32, rows not a multiple of 16 long "
                f"(e.g. {widened[0]})" if widened else "")
        return (f"weights in the checkpoint's own codes ({', '.join(types)}; {held / (1 << 20):.1f} MiB + "
                f"{dense / (1 << 20):.1f} MiB dense{note}), kernels {kern}, decoder layers {layer_program(model)}")
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    return f"weights {model.norm.weight.dtype} ({dense / (1 << 20):.1f} MiB)"


# ----------------------------------------------------------------------------------- building blocks
class RMSNorm(nn.Module):
    """``y = w * x / sqrt(mean(x^2) + eps)`` over the last dim, computed in fp32 (Zhang & Sennrich
    2019; HF ``LlamaRMSNorm``). x: ``[..., H]`` -> ``[..., H]`` in x's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        #: inference on CPU fp32 through ``specc.kernels.qgemm.rms_norm`` (one C call instead of six
        #: torch ops; set for the native-precision models of ``specc.models.qweights``)
        self.c_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.c_kernel and x.dtype == torch.float32 and x.device.type == "cpu"
                and not torch.is_grad_enabled() and not torch.compiler.is_compiling()):
            from specc.kernels.qgemm import rms_norm
            return rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:  # one fused op (same formula) instead of six
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W: [out, in]``. After ``use_cpu_fast()`` the weight is stored as a
    contiguous ``[in, out]`` tensor (``weight`` stays a ``[out, in]`` view of it) and inference on CPU
    fp32 goes through numpy's BLAS, several times faster than torch's GEMM for 1..16 rows here
    (one row: numpy's GEMV, memory-bound, the fastest one-row path measured on one and two threads).
    For 2..16 rows (a verify forward over κ+1 tokens) it uses the skinny GEMM of
    ``specc.kernels.cpu_gemm`` on a second, ``[out, in]`` copy of the weight, which streams the weight
    once for all rows (``python tools/bench_matmul.py --model``: 1.3-1.6x numpy's SGEMM paths for a
    whole forward); where that kernel is unavailable the product is split per
    ``specc.models.cpu_matmul.pick_path``. Autograd, CUDA and
    other dtypes keep ``F.linear``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._wt_np: Optional[np.ndarray] = None  # [in, out] fp32, shares storage with weight
        self._w_np: Optional[np.ndarray] = None  # [out, in] fp32 copy for the skinny GEMM (2..16 rows)
        self._w_version = -1  # weight._version when _w_np was copied
        self._paths = path_table(in_features, out_features)  # [r] -> fn(x [r, in], wt [in, out]) for r <= 16
        #: half precision, inference: multiply in chunks of exactly this many rows, zero-padded (None:
        #: one call). oneDNN picks its bf16 GEMM kernel and blocking by the row count (a one-row call
        #: takes another kernel than sixteen rows, and 33..128 rows another again for some shapes), so
        #: fixed chunks make a row's result independent of the batch (``LlamaModel.set_row_invariant``)
        self.row_chunk: Optional[int] = None

    def use_cpu_fast(self) -> None:
        """Re-store the weight as ``[in, out]`` contiguous and enable the numpy path (CPU fp32 only)."""
        from specc.kernels import cpu_gemm

        w = self.weight.detach()
        if w.device.type != "cpu" or w.dtype != torch.float32:
            self._wt_np = self._w_np = None
            return
        wt = w.t().contiguous()  # [in, out]
        self.weight = nn.Parameter(wt.t(), requires_grad=False)
        self._wt_np = wt.numpy()
        self._w_np = np.ascontiguousarray(self._wt_np.T) if cpu_gemm.available() else None  # [out, in]
        self._w_version = self.weight._version  # in-place updates (load_state_dict, copy_) bump it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (self._wt_np is not None and x.device.type == "cpu" and x.dtype == torch.float32
                and not torch.compiler.is_compiling()
                and w.device.type == "cpu" and w.dtype == torch.float32 and not torch.is_grad_enabled()
                and self._wt_np.ctypes.data == w.data_ptr()):
            x2 = x.reshape(-1, self.in_features)  # [R, in]
            if not x2.is_contiguous():
                x2 = x2.contiguous()
            xn = x2.numpy()
            rows = xn.shape[0]
            if self._w_np is not None and 2 <= rows <= 16:
                if self._w_version != w._version:  # the weight changed in place: refresh the copy
                    self._w_np = np.ascontiguousarray(self._wt_np.T)
                    self._w_version = w._version
                y = torch.from_numpy(skinny_matmul(xn, self._w_np))  # [R, out]
            else:
                mm = self._paths[rows] if rows < len(self._paths) else np.matmul
                y = torch.from_numpy(mm(xn, self._wt_np))  # [R, out] C-contiguous
            if self.bias is not None:
                y += self.bias
            return y.view(*x.shape[:-1], self.out_features)
        chunk = self.row_chunk
        if chunk and x.dtype != torch.float32 and not torch.is_grad_enabled():
            # every GEMM call sees exactly `chunk` rows (the last chunk zero-padded): one kernel, one
            # blocking, so each row's bits are independent of how many rows the forward runs
            x2 = x.reshape(-1, self.in_features)
            rows = x2.shape[0]
            pad = (-rows) % chunk
            if pad:
                x2 = torch.cat([x2, x2.new_zeros(pad, self.in_features)])
            y = torch.cat([F.linear(x2[i: i + chunk], w, self.bias) for i in range(0, rows + pad, chunk)])
            return y[:rows].view(*x.shape[:-1], self.out_features)
        return F.linear(x, w, self.bias)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse RoPE frequencies ``[head_dim // 2]`` fp32 with the checkpoint's scaling.

    Default: ``theta^(-2i/d)`` (Su et al. 2021, RoFormer). ``linear``: divided by ``factor`` (position
    interpolation, Chen et al. 2023). ``llama3``: the wavelength-banded rule of Llama 3.1, as in
    transformers ``modeling_rope_utils._compute_llama3_parameters``. ``gguf_factors`` (from a GGUF's
    ``rope_freqs.weight``): divided elementwise by the stored factors, as llama.cpp does.
    Computed in fp32 exactly as transformers does so logits agree to ~1e-6.
    """
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = config.rope_scaling or {}
    kind = sc.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        factor = float(sc["factor"])
        low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old_len = float(sc["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, inv_l)
    elif kind == "gguf_factors":
        inv = inv / torch.tensor(sc["factors"], dtype=torch.float32)
    return inv


# ----------------------------------------------------------------------------------- ragged rows
class TokenPacking:
    """The real tokens of a ``[B, N]`` batch whose row ``b`` holds ``num_tokens[b]`` leading real
    tokens (the rest is padding): the linear layers run on the ``T = Σ num_tokens`` packed rows only,
    so padding costs no GEMM work (a ragged verify, each request its own number of tokens; vLLM's
    ``cu_num_logits`` layout, vllm/v1/worker/gpu/spec_decode/adaptive_verification.py:415-488).
    Attention still runs on the padded ``[B, N]`` layout.

    Args: num_tokens ``[B]`` int64 in ``[0, N]``; B, N: the padded shape."""

    def __init__(self, num_tokens: torch.Tensor, batch: int, width: int) -> None:
        valid = torch.arange(width, device=num_tokens.device).view(1, width) < num_tokens.view(batch, 1)  # [B, N]
        self.index = valid.reshape(-1).nonzero().view(-1)  # [T] flat indices b * N + n
        self.batch, self.width = batch, width

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N, ...]`` -> ``[T, ...]``."""
        return x.reshape(self.batch * self.width, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """``[T, ...]`` -> ``[B, N, ...]``, zeros at padding tokens."""
        out = y.new_zeros(self.batch * self.width, *y.shape[1:])
        out.index_copy_(0, self.index, y)
        return out.view(self.batch, self.width, *y.shape[1:])


# ----------------------------------------------------------------------------------- the layers
KV_TILE = 64
"""KV slots per tile of the half-precision attention (:meth:`Attention._half`)."""


class Attention(nn.Module):
    """GQA self-attention with a static KV cache written at given slots."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.q_size, c.kv_size
        self.wqkv = Linear(c.hidden_size, c.q_size + 2 * c.kv_size, bias=c.attention_bias)
        self.wo = Linear(c.q_size, c.hidden_size, bias=False)
        self.scale = self.head_dim ** -0.5
        self.row_chunk = 16  # query rows per matmul of the half-precision attention (see _half)
        #: half precision: attend with ``F.scaled_dot_product_attention`` (fast, but a row's bits depend
        #: on the number of query rows) instead of the row-invariant tiles of :meth:`_half`
        self.fast_half = False
        self.k_cache: Optional[torch.Tensor] = None  # [max_batch, kv_heads, max_seq, head_dim]
        self.v_cache: Optional[torch.Tensor] = None

    def forward(self, x: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, batch_index: torch.Tensor,
                slots: torch.Tensor, mask_bias: torch.Tensor, kv_len: int,
                packing: Optional[TokenPacking] = None, rows: Optional[torch.Tensor] = None,
                qkv: Optional[torch.Tensor] = None, project: bool = True) -> torch.Tensor:
        """x: [B, N, H] (or [T, H] packed by ``packing``); cos/sin: [B, N, 1, D] (sin with the first
        half negated); batch_index, slots: [B, N] int64; mask_bias: [B * nkv, g * N, kv_len] additive fp32
        (or [B, 1, N, kv_len] fp32 in half precision, see ``_half``)
        (0 = attend, dtype-min = masked; g = heads per kv head, row order (b, kv head, query head in
        group, n)); rows: [B] int64 cache rows of the batch rows (None: rows 0..B-1, the
        batch_index rows); qkv: the ``wqkv`` product of x when the caller computed it (x is then unused);
        returns [B, N, H] (or [T, H]), or with ``project=False`` the [B, N, q] (or [T, q]) input of ``wo``.
        Eager softmax attention (Vaswani et al. 2017) in fp32 softmax, as HF's eager path."""
        B, N = slots.shape
        if qkv is None:
            qkv = self.wqkv(x)  # [B, N, q + 2kv]
        if packing is not None:
            qkv = packing.unpack(qkv)  # [T, q + 2kv] -> [B, N, q + 2kv]
        qk, v = qkv.split((self.q_size + self.kv_size, self.kv_size), dim=-1)
        qk = qk.view(B, N, self.num_heads + self.num_kv_heads, 2, self.head_dim // 2)  # q and k heads, halves
        # RoPE on q and k at once, HF's half-split layout: x*cos + rotate_half(x)*sin, where
        # rotate_half(x)*sin == flip(halves)*sin_signed (sin_signed = [-sin, sin] over the halves)
        qk = torch.addcmul(qk.view(B, N, -1, self.head_dim) * cos,
                           qk.flip(-2).view(B, N, -1, self.head_dim), sin)  # [B, N, nh + nkv, D]
        q, k = qk.split((self.num_heads, self.num_kv_heads), dim=2)
        v = v.view(B, N, self.num_kv_heads, self.head_dim)
        # write K/V at their slots: cache viewed as [max_batch, max_seq, nkv, D], indexed by (b, slot)
        self.k_cache.transpose(1, 2).index_put_((batch_index, slots), k.to(self.k_cache.dtype))
        self.v_cache.transpose(1, 2).index_put_((batch_index, slots), v.to(self.v_cache.dtype))
        nkv, g, D = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        if mask_bias.dim() == 4:  # [B, 1, N, S]: fused attention (half precision; see LlamaModel.forward)
            if self.fast_half:
                out = self._sdpa(q, B, N, mask_bias, kv_len, packing, rows)
            else:
                out = self._half(q, B, N, mask_bias, kv_len, packing, rows)
            return self.wo(out) if project else out
        if rows is None:
            keys = self.k_cache[:B, :, :kv_len].reshape(B * nkv, kv_len, D)  # a view: [B*nkv, S, D]
            values = self.v_cache[:B, :, :kv_len].reshape(B * nkv, kv_len, D)
        else:  # cache rows given: gather their first kv_len slots (a copy of the attended span only)
            keys = self.k_cache[:, :, :kv_len].index_select(0, rows).reshape(B * nkv, kv_len, D)
            values = self.v_cache[:, :, :kv_len].index_select(0, rows).reshape(B * nkv, kv_len, D)
        # GQA without repeating K/V: query head h uses kv head h // g (HF repeat_kv order)
        qg = q.reshape(B, N, nkv, g, D).permute(0, 2, 3, 1, 4).reshape(B * nkv, g * N, D)  # [B*nkv, g*N, D]
        # scores = mask + scale * q @ k^T in one call (baddbmm), softmax over slots, @ v
        scores = torch.baddbmm(mask_bias, qg, keys.transpose(1, 2), alpha=self.scale)  # [B*nkv, g*N, S]
        if scores.dtype == torch.float32:
            probs = torch.softmax(scores, dim=-1)
        else:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        out = torch.bmm(probs, values)  # [B*nkv, g*N, D]
        out = out.view(B, nkv, g, N, D).permute(0, 3, 1, 2, 4).reshape(B, N, self.q_size)  # [B, N, q]
        if packing is not None:
            out = packing.pack(out)  # [T, q]
        return self.wo(out) if project else out

    def _sdpa(self, q: torch.Tensor, B: int, N: int, mask_bias: torch.Tensor, kv_len: int,
              packing: Optional[TokenPacking], rows: Optional[torch.Tensor]) -> torch.Tensor:
        """Half-precision attention of ``q`` ``[B, N, nh, D]`` over the first ``kv_len`` cache slots by
        ``F.scaled_dot_product_attention`` (GQA by ``enable_gqa``; mask ``[B, 1, N, S]`` fp32 additive,
        0 = attend). Not row-invariant: for bulk forwards whose bits need not match a one-token step
        (training features, distillation prefill). Returns the ``wo`` input ``[B, N, q]`` (``[T, q]`` packed)."""
        if rows is None:
            keys, values = self.k_cache[:B, :, :kv_len], self.v_cache[:B, :, :kv_len]  # [B, nkv, S, D]
        else:
            keys = self.k_cache[:, :, :kv_len].index_select(0, rows)
            values = self.v_cache[:, :, :kv_len].index_select(0, rows)
        visible = mask_bias[:, :, :, :kv_len] == 0  # [B, 1, N, S] bool
        out = F.scaled_dot_product_attention(q.to(keys.dtype).transpose(1, 2), keys, values, attn_mask=visible,
                                             scale=self.scale, enable_gqa=True)  # [B, nh, N, D]
        out = out.transpose(1, 2).reshape(B, N, self.q_size)
        if packing is not None:
            out = packing.pack(out)  # [T, q]
        return out

    def _half(self, q: torch.Tensor, B: int, N: int, mask_bias: torch.Tensor, kv_len: int,
              packing: Optional[TokenPacking], rows: Optional[torch.Tensor]) -> torch.Tensor:
        """Half-precision attention of ``q`` ``[B, N, nh, D]`` over the first ``kv_len`` cache slots,
        computed so that every query row's result is the same bits whatever the number of query rows
        ``N``, the attended span and the other rows of the batch (*row-invariant*): scores by one
        matmul per (row, kv head) over the cache view (oneDNN's bf16 GEMM is invariant in its row
        count when the count is fixed: every call gets exactly :attr:`row_chunk` query rows,
        zero-padded), the mask added and the softmax taken in fp32 row by row (masked slots
        contribute exact zeros), the weighted sum by a second matmul. Speculative greedy output then equals plain
        greedy output at the same dtype (a verify row computes what the one-token step computes);
        ``F.scaled_dot_product_attention`` is not row-invariant on the CPU. GQA by grouping query
        heads (query head h reads kv head h // g, HF's repeat_kv order), no K/V copy. mask_bias:
        ``[B, 1, N, S]`` fp32 additive (0 = attend, fp32-min = masked: a fully masked row stays
        finite). Returns the ``wo`` input ``[B, N, q]`` (``[T, q]`` packed)."""
        nkv, g, D = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        T = KV_TILE
        S = -(-kv_len // T) * T  # whole tiles; slots past kv_len are masked (exact zeros)
        if rows is None:
            keys, values = self.k_cache[:B, :, :S], self.v_cache[:B, :, :S]  # [B, nkv, S, D] views
        else:
            keys = self.k_cache[:, :, :S].index_select(0, rows)
            values = self.v_cache[:, :, :S].index_select(0, rows)
        nb = S // T
        kt = keys.reshape(B, nkv, nb, T, D).transpose(-1, -2)  # [B, nkv, nb, D, T]
        vb = values.reshape(B, nkv, nb, T, D)  # [B, nkv, nb, T, D]
        qg = q.to(keys.dtype).view(B, N, nkv, g, D).permute(0, 2, 3, 1, 4).reshape(B, nkv, g * N, D)
        bias = mask_bias.repeat(1, 1, g, 1)  # [B, 1, g*N, kv_len]
        if S > kv_len:
            bias = torch.cat([bias, bias.new_full((B, 1, g * N, S - kv_len), torch.finfo(bias.dtype).min)], dim=-1)
        rows_q, C = g * N, self.row_chunk
        pad = (-rows_q) % C
        if pad:  # every tile product sees exactly C query rows (zero rows, then dropped)
            qg = torch.cat([qg, qg.new_zeros(B, nkv, pad, D)], dim=2)
            bias = torch.cat([bias, bias.new_zeros(B, 1, pad, S)], dim=2)
        outs = []
        for c in range(0, rows_q + pad, C):
            # [B, nkv, 1, C, D] @ [B, nkv, nb, D, T]: one fixed [C, D] x [D, T] GEMM per tile
            sc = torch.matmul(qg[:, :, None, c: c + C], kt).float()  # [B, nkv, nb, C, T]
            sc = sc.permute(0, 1, 3, 2, 4).reshape(B, nkv, C, S)
            sc = torch.addcmul(bias[:, :, c: c + C], sc, torch.tensor(self.scale))  # scale + mask, fp32
            pr = torch.softmax(sc, dim=-1).to(values.dtype).view(B, nkv, C, nb, T).transpose(2, 3)  # [B,nkv,nb,C,T]
            # per tile a fixed [C, T] x [T, D] GEMM, then the tiles summed in fp32 in order (masked tiles
            # add exact zeros)
            outs.append(torch.matmul(pr, vb).float().sum(dim=2).to(values.dtype))  # [B, nkv, C, D]
        out = torch.cat(outs, dim=2)[:, :, :rows_q]  # [B, nkv, g*N, D]
        out = out.view(B, nkv, g, N, D).permute(0, 3, 1, 2, 4).reshape(B, N, self.q_size)  # [B, N, q]
        if packing is not None:
            out = packing.pack(out)  # [T, q]
        return out


class FeedForward(nn.Module):
    """SwiGLU MLP (Shazeer 2020): ``down(silu(gate(x)) * up(x))``; gate and up fused as ``w13``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.w13 = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.w2 = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.intermediate_size, dim=-1)  # [B, N, I] each
        return self.w2(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn = FeedForward(config)
        #: inference through the fused C layer parts (:meth:`_fused`; set by ``specc.models.qweights``)
        self.fused = False

    def forward(self, x, cos, sin, batch_index, slots, mask, kv_len, packing=None, rows=None):
        if self.fused and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            return self._fused(x, cos, sin, batch_index, slots, mask, kv_len, packing, rows)
        h = x + self.attn(self.attn_norm(x), cos, sin, batch_index, slots, mask, kv_len, packing, rows)
        return h + self.ffn(self.ffn_norm(h))

    def _fused(self, x, cos, sin, batch_index, slots, step, kv_len, packing, rows):
        """The same layer in three C calls (``specc.kernels.qgemm``): ``norm_linear`` (input norm and
        q/k/v), ``attn_f32`` (RoPE, the K/V write and fp32 softmax attention over ``step``'s ``[B, N, S]``
        additive mask) and ``ffn_block`` (``wo``, both residuals, the FFN norm and the MLP); a linear of
        several parts (types) runs part by part through ``QuantLinear`` instead. ``step``: the
        :class:`CStep` ``LlamaModel.forward`` builds once for all layers. For models whose linears are all
        ``QuantLinear`` s (set by ``specc.models.qweights``; every layer of such a model runs this way)."""
        from specc.kernels import qgemm
        H = x.shape[-1]
        xf = x.reshape(-1, H).contiguous()
        R = xf.shape[0]
        args = self._c_args()
        lib = qgemm._lib
        if args is not None:
            (n1, e1, lq, nq, lo, l13, l2, n2, e2, Q, I, kc, vc, smax, nh, nkv, D, scale) = args
            qkv = torch.empty(R, nq)
            rc = lib.norm_linear(xf.data_ptr(), R, H, n1, e1, *lq, nq, qkv.data_ptr(), qgemm._variant, qgemm._threads)
            ragged = packing is not None and R != step.B * step.N
            if ragged:  # [T, .] -> [B * N, .], zeros at padding tokens
                qkv = qkv.new_zeros(step.B * step.N, nq).index_copy_(0, packing.index, qkv)
            a = torch.empty(step.B * step.N, Q)
            rc = rc or lib.attn_f32(qkv.data_ptr(), step.B, step.N, nh, nkv, D, step.cos, step.sin, kc, vc, smax,
                                    step.rows, step.slots, step.mask, step.S, scale, a.data_ptr(),
                                    qgemm._threads)
            if ragged:
                a = a.index_select(0, packing.index)  # [T, q]
            out = torch.empty(R, H)
            rc = rc or lib.ffn_block(a.data_ptr(), xf.data_ptr(), R, H, Q, I, *lo, *l13, *l2, n2, e2, out.data_ptr(),
                                     qgemm._variant, qgemm._threads)
            if rc:
                raise ValueError(f"the C layer rejected R={R}, B={step.B}, N={step.N}, S={step.S} (code {rc})")
            return out.view(x.shape)
        wqkv = self.attn.wqkv
        if len(wqkv.parts) == 1:
            qkv = qgemm.norm_linear(xf, self.attn_norm.weight, self.attn_norm.eps, wqkv.parts[0])
            if wqkv.bias is not None:
                qkv = qkv + wqkv.bias
        else:  # parts of different types (a fused q/k/v of Q4_K and Q6_K): one product per part
            qkv = wqkv(self.attn_norm(xf))
        at = self.attn
        B, N = slots.shape
        if packing is not None:
            qkv = packing.unpack(qkv)  # [T, .] -> [B, N, .], zeros at padding tokens
        a = qgemm.attention(qkv.view(B, N, -1), step.cos_t, step.sin_t, at.k_cache, at.v_cache, step.rows_t,
                            step.slots_t, step.mask_t, at.num_heads, at.scale)  # [B, N, q]
        if packing is not None:
            a = packing.pack(a)  # [T, q]
        a = a.reshape(R, -1)
        lins = (self.attn.wo, self.ffn.w13, self.ffn.w2)
        if all(len(lin.parts) == 1 and lin.bias is None for lin in lins):
            out = qgemm.ffn_block(a, xf, self.attn.wo.parts[0], self.ffn.w13.parts[0], self.ffn.w2.parts[0],
                                  self.ffn_norm.weight, self.ffn_norm.eps)
        else:
            h = xf + self.attn.wo(a)
            out = h + self.ffn(self.ffn_norm(h))
        return out.view(x.shape)

    def _c_args(self):
        """The ctypes arguments of this layer's three C calls (pointers of its weights and caches), built
        once and rebuilt when the caches move; None when a linear has several parts or a bias the C calls
        do not take."""
        from specc.kernels import qgemm
        at, ffn = self.attn, self.ffn
        lins = (at.wqkv, at.wo, ffn.w13, ffn.w2)
        key = (at.k_cache.data_ptr(), at.v_cache.data_ptr(), qgemm._variant)
        cached = self.__dict__.get("_c_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        args = None
        if all(len(lin.parts) == 1 for lin in lins) and all(lin.bias is None for lin in lins):
            lq = qgemm._lin_args(at.wqkv.parts[0])
            args = (self.attn_norm.weight.data_ptr(), self.attn_norm.eps, lq, at.wqkv.out_features,
                    qgemm._lin_args(at.wo.parts[0]), qgemm._lin_args(ffn.w13.parts[0]),
                    qgemm._lin_args(ffn.w2.parts[0]), self.ffn_norm.weight.data_ptr(), self.ffn_norm.eps,
                    at.q_size, ffn.intermediate_size, at.k_cache.data_ptr(), at.v_cache.data_ptr(),
                    at.k_cache.shape[2], at.num_heads, at.num_kv_heads, at.head_dim, at.scale)
        self.__dict__["_c_cache"] = (key, args)
        return args


class _PointerCache:
    """A value holding raw pointers into a model's tensors, valid for ``key``: copying or pickling the
    model drops it (the copy's tensors live elsewhere; it is rebuilt on first use)."""

    __slots__ = ("key", "value")

    def __init__(self, key=None, value=None) -> None:
        self.key, self.value = key, value

    def __deepcopy__(self, memo) -> "_PointerCache":
        return _PointerCache()

    def __reduce__(self):
        return _PointerCache, ()


class CStep:
    """What every layer's C attention reads in one forward, made contiguous once: cos, sin ``[B, N, D]``,
    cache rows ``[B]``, slots ``[B, N]`` int64 and the ``[B, N, S]`` additive mask, with their pointers."""

    __slots__ = ("B", "N", "S", "cos_t", "sin_t", "rows_t", "slots_t", "mask_t", "cos", "sin", "rows", "slots",
                 "mask")

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, batch_index: torch.Tensor, slots: torch.Tensor,
                 mask: torch.Tensor) -> None:
        self.B, self.N = slots.shape
        self.S = mask.shape[-1]
        self.cos_t = cos.reshape(self.B, self.N, -1).contiguous()
        self.sin_t = sin.reshape(self.B, self.N, -1).contiguous()
        self.rows_t = batch_index[:, 0].contiguous()
        self.slots_t = slots.contiguous()
        self.mask_t = mask.contiguous()
        self.cos, self.sin = self.cos_t.data_ptr(), self.sin_t.data_ptr()
        self.rows, self.slots, self.mask = self.rows_t.data_ptr(), self.slots_t.data_ptr(), self.mask_t.data_ptr()


# ----------------------------------------------------------------------------------- the model
class LlamaModel(nn.Module):
    """Llama-family causal LM with a static, position-indexed KV cache.

    Build with ``LlamaModel(config)``, fill weights with ``load_hf_state_dict``, then
    ``setup_cache(max_batch_size, max_seq_len)`` before ``forward``. Inference only (call under
    ``torch.inference_mode()`` or ``no_grad`` for the fast CPU path).
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        c = config
        self.output = Linear(c.hidden_size, c.vocab_size)  # lm_head, weight [V, H]
        if not c.tie_word_embeddings:
            self.embed_tokens = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size))  # [V, H]
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.max_batch_size = 0
        self.max_seq_len = 0
        #: on CPU the attended cache length is trimmed to max(position) + 1 (needs one .item());
        #: a CUDA forward always attends over all max_seq slots (static shapes for graph capture).
        self.check_inputs = True
        #: every decoder layer runs through the C layer parts (``DecoderLayer._fused``; set by
        #: ``specc.models.qweights``): the forward then hands the layers the ``[B, N, S]`` additive mask
        self.c_layers = False
        #: with ``c_layers``, every layer in one C call (:meth:`_stack_forward`); False runs them one by one
        #: (the same bits; tests compare the two)
        self.c_stack = True
        #: names of the 16-bit checkpoint tensors a native load had to widen to fp32 (rows not a multiple
        #: of 16 long: ``specc.models.hf_loader.load_hf_native``); the load line counts them
        self.widened: Tuple[str, ...] = ()
        #: the token embedding kept in the checkpoint's own codes (``specc.models.qweights.QuantWeight``,
        #: set by the GGUF loader's native path): ``embed`` dequantizes only the rows it looks up
        self.embed_table = None

    # -------------------------------------------------------------- weights
    @property
    def embed_weight(self) -> torch.Tensor:
        """The token embedding table ``[V, H]`` fp32 (the lm_head weight when embeddings are tied;
        dequantized anew on each access when the model keeps it quantized)."""
        if self.embed_table is not None:
            return self.embed_table.dequantize()
        return self.output.weight if self.config.tie_word_embeddings else self.embed_tokens

    def load_hf_state_dict(self, sd: Dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Copy an HF-named Llama state dict (``model.layers.{i}.self_attn.q_proj.weight``, ...) into
        this model, fusing q/k/v and gate/up. Missing, unexpected or mis-shaped tensors raise
        ``CheckpointError`` naming ``source`` and the tensor."""
        c = self.config
        sd = dict(sd)
        used = set()

        def take(name: str, shape: Tuple[int, ...]) -> torch.Tensor:
            if name not in sd:
                raise CheckpointError(f"{source}: tensor {name!r} is missing")
            t = sd[name]
            if tuple(t.shape) != tuple(shape):
                raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(t.shape)}, the config "
                                      f"implies {tuple(shape)} (vocab/hidden sizes do not match config.json?)")
            used.add(name)
            return t.float() if t.dtype != torch.float32 else t

        H, V = c.hidden_size, c.vocab_size
        with torch.no_grad():
            emb = take("model.embed_tokens.weight", (V, H))
            if c.tie_word_embeddings:
                self.output.weight.copy_(emb)
                if "lm_head.weight" in sd:  # some tied checkpoints store it anyway
                    used.add("lm_head.weight")
            else:
                self.embed_tokens.copy_(emb)
                self.output.weight.copy_(take("lm_head.weight", (V, H)))
            self.norm.weight.copy_(take("model.norm.weight", (H,)))
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                layer.attn_norm.weight.copy_(take(p + "input_layernorm.weight", (H,)))
                layer.ffn_norm.weight.copy_(take(p + "post_attention_layernorm.weight", (H,)))
                q = take(p + "self_attn.q_proj.weight", (c.q_size, H))
                k = take(p + "self_attn.k_proj.weight", (c.kv_size, H))
                v = take(p + "self_attn.v_proj.weight", (c.kv_size, H))
                layer.attn.wqkv.weight.copy_(torch.cat([q, k, v], 0))
                if c.attention_bias:
                    layer.attn.wqkv.bias.copy_(torch.cat([
                        take(p + "self_attn.q_proj.bias", (c.q_size,)),
                        take(p + "self_attn.k_proj.bias", (c.kv_size,)),
                        take(p + "self_attn.v_proj.bias", (c.kv_size,))], 0))
                layer.attn.wo.weight.copy_(take(p + "self_attn.o_proj.weight", (H, c.q_size)))
                gate = take(p + "mlp.gate_proj.weight", (c.intermediate_size, H))
                up = take(p + "mlp.up_proj.weight", (c.intermediate_size, H))
                layer.ffn.w13.weight.copy_(torch.cat([gate, up], 0))
                layer.ffn.w2.weight.copy_(take(p + "mlp.down_proj.weight", (H, c.intermediate_size)))
        extra = sorted(k for k in sd if k not in used and not k.endswith("rotary_emb.inv_freq"))
        if extra:
            raise CheckpointError(f"{source}: unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''}; "
                                  f"the checkpoint has more layers or parts than config.json says")

    def hf_state_dict(self) -> Dict[str, torch.Tensor]:
        """The inverse of ``load_hf_state_dict``: HF-named, unfused, contiguous tensors."""
        c = self.config
        sd = {"model.embed_tokens.weight": self.embed_weight, "model.norm.weight": self.norm.weight}
        if not c.tie_word_embeddings:
            sd["lm_head.weight"] = self.output.weight
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            q, k, v = layer.attn.wqkv.weight.split((c.q_size, c.kv_size, c.kv_size), 0)
            sd.update({p + "input_layernorm.weight": layer.attn_norm.weight,
                       p + "post_attention_layernorm.weight": layer.ffn_norm.weight,
                       p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                       p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": layer.attn.wo.weight,
                       p + "mlp.down_proj.weight": layer.ffn.w2.weight})
            if c.attention_bias:
                qb, kb, vb = layer.attn.wqkv.bias.split((c.q_size, c.kv_size, c.kv_size), 0)
                sd.update({p + "self_attn.q_proj.bias": qb, p + "self_attn.k_proj.bias": kb,
                           p + "self_attn.v_proj.bias": vb})
            gate, up = layer.ffn.w13.weight.split(c.intermediate_size, 0)
            sd.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up})
        return {k: v.detach().contiguous() for k, v in sd.items()}

    def native_state_dict(self) -> Dict[str, torch.Tensor]:
        """This model's tensors in its own fused layout, for a fast-loading cache: each ``Linear`` as
        ``<module>.weight_t`` ``[in, out]`` (plus ``.bias``), each norm's ``.weight``, and
        ``embed_tokens`` ``[V, H]`` when untied. Free of copies once ``use_cpu_fast`` ran."""
        out: Dict[str, torch.Tensor] = {}
        for name, mod in self.named_modules():
            if isinstance(mod, Linear):
                out[f"{name}.weight_t"] = mod.weight.detach().t().contiguous()
                if mod.bias is not None:
                    out[f"{name}.bias"] = mod.bias.detach()
            elif isinstance(mod, RMSNorm):
                out[f"{name}.weight"] = mod.weight.detach()
        if not self.config.tie_word_embeddings:
            out["embed_tokens"] = self.embed_tokens.detach()
        return out

    @classmethod
    def from_native_state_dict(cls, config: LlamaConfig, sd: Dict[str, torch.Tensor],
                               source: str = "cache") -> "LlamaModel":
        """Build a model around the tensors of ``native_state_dict`` without copying them (the modules
        are created on the meta device and their parameters assigned). Raises ``CheckpointError`` for a
        missing or mis-shaped tensor."""
        sd = dict(sd)
        with torch.device("meta"):
            model = cls(config)

        def take(key: str, shape: Tuple[int, ...]) -> torch.Tensor:
            t = sd.pop(key, None)
            if t is None or tuple(t.shape) != tuple(shape):
                raise CheckpointError(f"{source}: tensor {key!r} is missing or has shape "
                                      f"{None if t is None else tuple(t.shape)}, expected {tuple(shape)}")
            return t

        for name, mod in model.named_modules():
            if isinstance(mod, Linear):
                wt = take(f"{name}.weight_t", (mod.in_features, mod.out_features))
                mod.weight = nn.Parameter(wt.t(), requires_grad=False)
                if mod.bias is not None:
                    mod.bias = nn.Parameter(take(f"{name}.bias", (mod.out_features,)), requires_grad=False)
            elif isinstance(mod, RMSNorm):
                mod.weight = nn.Parameter(take(f"{name}.weight", tuple(mod.weight.shape)), requires_grad=False)
        if not config.tie_word_embeddings:
            model.embed_tokens = nn.Parameter(take("embed_tokens", (config.vocab_size, config.hidden_size)),
                                              requires_grad=False)
        if sd:
            raise CheckpointError(f"{source}: unexpected tensors {sorted(sd)[:5]}")
        return model.eval()

    def to(self, *args, **kwargs) -> "LlamaModel":
        """``nn.Module.to``; a move off the CPU or to another dtype drops the numpy views of the CPU
        fast path (they would keep the old CPU weights alive)."""
        out = super().to(*args, **kwargs)
        for m in out.modules():
            if isinstance(m, Linear) and getattr(m, "_wt_np", None) is not None and m._wt_np.ctypes.data != m.weight.data_ptr():
                m._wt_np = m._w_np = None
        return out

    def set_row_invariant(self, on: bool = True, chunk: int = 16) -> "LlamaModel":
        """Half precision on the CPU: make every row's result independent of how many rows a forward
        runs (a verify over W tokens computes each row as a one-token step does), so speculative
        greedy decoding equals plain greedy decoding at this dtype. The linears multiply in chunks of
        exactly ``chunk`` rows (:attr:`Linear.row_chunk`; on CPUs with AMX a 16-row bf16 GEMM costs
        about what a one-row one does); attention is row-invariant already
        (:meth:`Attention._half`). fp32 keeps its own paths (their rounding differs by row count, by
        ~1e-7 relative, which flips no greedy choice in practice). Returns self."""
        for m in self.modules():
            if isinstance(m, Linear):
                m.row_chunk = int(chunk) if on else None
        return self

    def set_fast_attention(self, on: bool = True) -> "LlamaModel":
        """Half precision: attend with ``F.scaled_dot_product_attention`` (:meth:`Attention._sdpa`)
        instead of the row-invariant tiles (:meth:`Attention._half`). Several times faster over long
        sequences, but a row's bits then depend on the number of rows in the forward, so speculative
        greedy decoding no longer equals plain greedy decoding bit for bit: for bulk forwards only
        (drafter-training features, distillation). fp32 is unaffected. Returns self."""
        for layer in self.layers:
            layer.attn.fast_half = bool(on)
        return self

    def use_cpu_fast(self) -> "LlamaModel":
        """Switch every CPU fp32 linear to the numpy BLAS path (see ``Linear``) and split the CPU
        threads with :func:`configure_cpu_threads` (OpenBLAS and the skinny GEMM get the chosen
        count, :func:`default_cpu_threads` unless one was chosen; torch keeps one). Returns self."""
        configure_cpu_threads()
        for m in self.modules():
            if isinstance(m, Linear):
                m.use_cpu_fast()
        return self

    # -------------------------------------------------------------- cache
    def setup_cache(self, max_batch_size: int, max_seq_len: Optional[int] = None,
                    dtype: Optional[torch.dtype] = None) -> None:
        """Allocate the static KV caches, ``[max_batch_size, kv_heads, max_seq_len, head_dim]`` per layer
        (default length ``config.max_model_len``; dtype of the weights unless given). Reallocates only
        when the requested size is larger than the current one. Raises ``ValueError`` when
        ``max_seq_len`` exceeds ``config.max_model_len``."""
        c = self.config
        max_seq_len = int(max_seq_len or c.max_model_len)
        if max_seq_len > c.max_model_len:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds max_model_len={c.max_model_len}")
        if max_batch_size <= self.max_batch_size and max_seq_len <= self.max_seq_len:
            return
        max_batch_size = max(max_batch_size, self.max_batch_size)
        max_seq_len = max(max_seq_len, self.max_seq_len)
        dev = self.norm.weight.device
        dtype = dtype or self.norm.weight.dtype
        # half precision attends in tiles of KV_TILE slots (Attention._half): room for a whole last tile
        alloc = max_seq_len if dtype == torch.float32 else -(-max_seq_len // KV_TILE) * KV_TILE
        for layer in self.layers:
            shape = (max_batch_size, c.num_kv_heads, alloc, c.head_dim)
            layer.attn.k_cache = kv_zeros(shape, dtype, dev)
            layer.attn.v_cache = kv_zeros(shape, dtype, dev)
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        pos = torch.arange(max_seq_len, device=dev).float()
        freqs = pos[:, None] * rope_inv_freq(c).to(dev)[None, :]  # [S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, D]
        self._cos = emb.cos().to(dtype)
        sin = emb.sin()
        sin[:, : c.head_dim // 2] *= -1  # sign of rotate_half folded in: [-sin, sin]
        self._sin = sin.to(dtype)
        self._slot_ids = torch.arange(max_seq_len, device=dev)  # [S]
        self._batch_ids = torch.arange(max_batch_size, device=dev)[:, None]  # [Bmax, 1]

    def release_cache(self) -> None:
        """Drop the KV caches (``setup_cache`` allocates anew). Bulk forwards over batches of varying
        shape call it first, so the cache is sized for the batch at hand instead of growing to the
        largest rows x the longest sequence ever seen."""
        for layer in self.layers:
            layer.attn.k_cache = layer.attn.v_cache = None
        self.max_batch_size = self.max_seq_len = 0

    def copy_kv(self, src_slots: torch.Tensor, dst_slots: torch.Tensor, rows: Optional[torch.Tensor] = None) -> None:
        """Copy every layer's cached K and V of batch row b from slot ``src_slots[b, m]`` to slot
        ``dst_slots[b, m]`` (all reads happen before any write, so the two may overlap): the KV commit
        of a tree verify (Medusa's gather-copy of the accepted path, FasterDecoding/Medusa
        ``medusa/model/utils.py:564-583``). Entries that
        should do nothing point both at the trash slot.

        Args: src_slots, dst_slots: ``[B, M]`` int64 slots ``< max_seq_len``; rows: ``[B]`` int64
        cache rows (default ``0..B-1``). Raises RuntimeError before ``setup_cache``."""
        if self.max_seq_len == 0:
            raise RuntimeError("LlamaModel.setup_cache(max_batch_size, max_seq_len) must be called before copy_kv")
        b, m = src_slots.shape
        bi = (self._batch_ids[:b] if rows is None else rows.view(b, 1)).expand(b, m)  # [B, M] cache rows
        for layer in self.layers:
            for cache in (layer.attn.k_cache, layer.attn.v_cache):
                view = cache.transpose(1, 2)  # [max_batch, max_seq, kv_heads, head_dim]
                view.index_put_((bi, dst_slots), view[bi, src_slots])  # the gather is a copy

    # -------------------------------------------------------------- forward
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ids ``[...]`` int64 -> ``[..., H]`` in the weights' dtype (fp32 when quantized)."""
        if self.embed_table is not None:
            return self.embed_table.rows(ids)
        return F.embedding(ids, self.embed_weight)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        """The output projection only (no final norm): h ``[..., H]`` -> logits ``[..., V]`` fp32.
        Apply ``self.norm`` first to a layer output; ``hidden_layers=(num_layers,)`` is already normed."""
        return self.output(h).float()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                cache_slots: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
                hidden_layers: Sequence[int] = (), logits_at: Optional[torch.Tensor] = None,
                num_tokens: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None,
                ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Run ``N`` new tokens per row through the model, writing their K/V into the cache.

        Args:
          input_ids: ``[B, N]`` int64, ``B <= max_batch_size``.
          positions: ``[B, N]`` int64 RoPE positions, ``< max_seq_len``.
          cache_slots: ``[B, N]`` int64 cache slots to write (default: ``positions``).
          attn_mask: ``[B, N, S]`` bool, True = attend to cache slot ``j < S`` of the row; ``None`` =
            causal by position (slot ``j`` visible iff ``j <= positions[b, n]``).
          hidden_layers: layer outputs to return (see the module docstring: ``i < num_layers`` is
            decoder layer ``i``'s output before the final norm, ``num_layers`` the final-norm output).
          logits_at: optional ``[B, M]`` int64 indices into ``N``; only those rows get logits
            (prefill asks for the last real token of each row).
          num_tokens: optional ``[B]`` int64: row ``b``'s first ``num_tokens[b]`` tokens are real, the
            rest padding (a ragged verify or prefill). Padding tokens cost no GEMM work
            (:class:`TokenPacking`) and, where the C attention runs, no attention (their mask rows
            are masked whole there; the other paths attend as before and drop them); they write no
            K/V and get zero logits and hidden states.
          rows: optional ``[B]`` int64, the cache row of each batch row (default ``0..B-1``): a prefill
            of a few new requests among many runs over their rows only.

        Returns:
          logits ``[B, N, V]`` fp32 (``[B, M, V]`` with ``logits_at``) and a list of ``[B, N, H]``
          hidden states in ``hidden_layers`` order.

        Raises ``PromptError`` (CPU only, where checks cost nothing) when a position or slot is
        outside the cache, and ``RuntimeError`` when ``setup_cache`` was not called.
        """
        if self.max_seq_len == 0:
            raise RuntimeError("LlamaModel.setup_cache(max_batch_size, max_seq_len) must be called before forward")
        B, N = input_ids.shape
        if cache_slots is None:
            cache_slots = positions
        L = self.config.num_layers
        for i in hidden_layers:
            if not 0 <= i <= L:
                raise ValueError(f"hidden_layers index {i} outside 0..{L} (num_layers={L})")
        if logits_at is not None and L in hidden_layers:
            raise ValueError("hidden_layers may not include num_layers together with logits_at")
        on_cpu = input_ids.device.type == "cpu"
        if attn_mask is not None:
            kv_len = attn_mask.shape[-1]
            if kv_len > self.max_seq_len:
                raise ValueError(f"attn_mask width {kv_len} exceeds the cache length {self.max_seq_len}")
        elif on_cpu and not torch.compiler.is_compiling():  # compiled: attend over every slot (static shape)
            kv_len = min(int(positions.max()) + 1, self.max_seq_len)
        else:
            kv_len = self.max_seq_len
        if on_cpu and self.check_inputs and not torch.compiler.is_compiling():
            self._check(input_ids, positions, cache_slots, rows)
        if num_tokens is not None and on_cpu and not torch.compiler.is_compiling() and bool((num_tokens == N).all()):
            num_tokens = None  # no padding (a CPU read, no device sync): packing would be the identity
        packing = TokenPacking(num_tokens, B, N) if num_tokens is not None else None
        if packing is not None:
            # padding tokens write their (unused) K/V to the trash slot: nothing real is overwritten
            real = torch.arange(N, device=input_ids.device).view(1, N) < num_tokens.view(B, 1)
            cache_slots = torch.where(real, cache_slots, torch.full_like(cache_slots, self.max_seq_len - 1))
            x = self.embed(packing.pack(input_ids.unsqueeze(-1)).view(-1))  # [T, H]
        else:
            x = self.embed(input_ids)  # [B, N, H]
        cos = self._cos[positions].unsqueeze(2)  # [B, N, 1, D]
        sin = self._sin[positions].unsqueeze(2)
        batch_index = (self._batch_ids[:B] if rows is None else rows.view(B, 1)).expand(B, N)  # [B, N] cache rows
        if attn_mask is None:
            mask = self._slot_ids[:kv_len][None, None, :] <= positions[:, :, None]  # [B, N, S]
        else:
            mask = attn_mask
        c_attention = self.c_layers and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        if packing is not None and c_attention:  # a padding position attends nothing: the C attention skips it
            mask = mask & real[:, :, None]
        # additive mask shared by all layers; a fully masked row stays finite (HF eager uses dtype-min too)
        c = self.config
        g = c.num_heads // c.num_kv_heads
        fill = torch.float32 if x.dtype != torch.float32 else x.dtype
        mask = torch.zeros(mask.shape, dtype=fill, device=x.device).masked_fill_(~mask, torch.finfo(fill).min)
        if c_attention:  # [B, N, S]: the layers' C attention reads each query's row as it is
            mask = CStep(cos, sin, batch_index, cache_slots, mask)
        elif x.dtype == torch.float32:
            mask = mask[:, None, None].expand(B, c.num_kv_heads, g, N, kv_len).reshape(
                B * c.num_kv_heads, g * N, kv_len)  # [B*nkv, g*N, S]: the eager fp32 attention
        else:
            mask = mask[:, None]  # [B, 1, N, S] fp32: row-invariant attention in half precision (Attention._half)
        stack = self._c_stack() if self.c_stack and isinstance(mask, CStep) else None
        if stack is not None:
            x, hidden = self._stack_forward(stack, x, mask, packing, hidden_layers)
        else:
            wanted = {i: k for k, i in enumerate(hidden_layers)}
            hidden: List[Optional[torch.Tensor]] = [None] * len(hidden_layers)
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, batch_index, cache_slots, mask, kv_len, packing, rows)
                if i in wanted:
                    for k, j in enumerate(hidden_layers):
                        if j == i:
                            hidden[k] = x
        if packing is not None and logits_at is not None:  # a ragged prefill: back to [B, N, ...] first
            x = packing.unpack(x)
            hidden = [packing.unpack(h) if h is not None else h for h in hidden]
            packing = None
        if logits_at is not None:
            x = torch.gather(x, 1, logits_at[:, :, None].expand(-1, -1, x.shape[-1]))  # [B, M, H]
        x = self.norm(x)
        for k, j in enumerate(hidden_layers):
            if j == L:
                hidden[k] = x
        logits = self.lm_head(x)  # [B, N, V] fp32 (or [T, V] packed)
        if packing is not None:
            return packing.unpack(logits), [packing.unpack(h) for h in hidden]
        return logits, hidden

    def _c_stack(self):
        """(ctypes array of ``qgemm.LayerArgs``, dims) for running every decoder layer in one C call, built
        once per cache placement and kernel variant; None when a layer cannot (a linear of several parts
        or with a bias: those layers run :meth:`DecoderLayer._fused` one by one)."""
        from specc.kernels import qgemm
        first, last = self.layers[0].attn, self.layers[-1].attn
        key = (first.k_cache.data_ptr(), last.v_cache.data_ptr(), qgemm._variant)
        cached = self.__dict__.get("_stack_cache")
        if cached is not None and cached.key == key:
            return cached.value
        stack = None
        per_layer = [layer._c_args() for layer in self.layers]  # the pointers the per-layer calls take
        if all(a is not None for a in per_layer):
            arr = (qgemm.LayerArgs * len(per_layer))(*(
                qgemm.layer_args(n1, e1, lq, lo, l13, l2, n2, e2, kc, vc)
                for (n1, e1, lq, _, lo, l13, l2, n2, e2, _, _, kc, vc, *_) in per_layer))
            _, _, _, _, _, _, _, _, _, Q, I, _, _, smax, nh, nkv, D, scale = per_layer[0]
            stack = (arr, (self.config.hidden_size, Q, I, nh, nkv, D, smax, scale))
        self.__dict__["_stack_cache"] = _PointerCache(key, stack)
        return stack

    def _stack_forward(self, stack, x: torch.Tensor, step: "CStep", packing: Optional[TokenPacking],
                       hidden_layers: Sequence[int]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        """Every decoder layer in one C call (``qgemm.decoder_stack``; the bits of the per-layer path):
        x ``[B, N, H]`` or packed ``[T, H]`` fp32 -> the last layer's output of the same shape, and the
        outputs of the decoder layers in ``hidden_layers`` (``num_layers`` itself is left None for the
        caller's final norm)."""
        from specc.kernels import qgemm
        arr, dims = stack
        shape = x.shape
        xf = x.reshape(-1, shape[-1]).clone()
        outs = {i: torch.empty_like(xf) for i in hidden_layers if i < len(self.layers)}
        ptrs = None
        if outs:
            ptrs = (ctypes.c_void_p * len(self.layers))(*(outs[i].data_ptr() if i in outs else None
                                                          for i in range(len(self.layers))))
        qgemm.decoder_stack(arr, xf, dims, step, None if packing is None else packing.index, ptrs)
        return xf.view(shape), [outs[i].view(shape) if i in outs else None for i in hidden_layers]

    def _check(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               rows: Optional[torch.Tensor] = None) -> None:
        B, N = input_ids.shape
        if B > self.max_batch_size:
            raise PromptError(f"batch of {B} rows exceeds the cache's max_batch_size={self.max_batch_size}")
        if rows is not None and (rows.shape != (B,) or (B and (int(rows.min()) < 0 or int(rows.max()) >= self.max_batch_size))):
            raise ValueError(f"rows must be [B] = [{B}] cache rows in [0, {self.max_batch_size}), got {rows.tolist()}")
        if positions.shape != (B, N) or slots.shape != (B, N):
            raise ValueError(f"positions {tuple(positions.shape)} and cache_slots {tuple(slots.shape)} "
                             f"must match input_ids {(B, N)}")
        hi = int(torch.maximum(positions.max(), slots.max())) if N else 0
        lo = int(torch.minimum(positions.min(), slots.min())) if N else 0
        if hi >= self.max_seq_len or lo < 0:
            raise PromptError(f"sequence position {hi if hi >= self.max_seq_len else lo} is outside the KV cache "
                              f"(length {self.max_seq_len}, max_model_len {self.config.max_model_len}); "
                              f"shorten the prompt or max_new_tokens")
        ids_hi = int(input_ids.max()) if N else 0
        if ids_hi >= self.config.vocab_size or (N and int(input_ids.min()) < 0):
            raise PromptError(f"token id {ids_hi} is outside the vocabulary (size {self.config.vocab_size})")


# ----------------------------------------------------------------------------------- helpers
def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0, device: str | torch.device = "cpu",
                max_len: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad token lists for one batched prefill (the convention of this module's docstring).

    Returns ``input_ids [B, N]`` int64, ``positions [B, N]`` int64 (``0..N-1`` in every row) and
    ``lengths [B]`` int64. Raises ``PromptError`` for an empty prompt or one of ``max_len`` tokens or
    more (no room left to generate)."""
    lengths = [len(p) for p in prompts]
    if not prompts or min(lengths) == 0:
        raise PromptError("every prompt needs at least one token")
    if max_len is not None and max(lengths) >= max_len:
        i = lengths.index(max(lengths))
        raise PromptError(f"prompt {i} has {lengths[i]} tokens; max_model_len is {max_len}, which leaves no room "
                          f"to generate (shorten the prompt or raise max_model_len)")
    N = max(lengths)
    ids = torch.full((len(prompts), N), pad_id, dtype=torch.int64)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.as_tensor(list(p), dtype=torch.int64)
    positions = torch.arange(N, dtype=torch.int64)[None, :].expand(len(prompts), N).contiguous()
    return ids.to(device), positions.to(device), torch.tensor(lengths, dtype=torch.int64, device=device)


@torch.inference_mode()
def prefill(model: LlamaModel, prompts: Sequence[Sequence[int]],
            hidden_layers: Sequence[int] = ()) -> Tuple[torch.Tensor, torch.Tensor, List[torch.Tensor]]:
    """Batched prefill of right-padded prompts into cache rows ``0..B-1``.

    Returns ``(last_logits [B, V] fp32, lengths [B] int64, hidden list of [B, N, H])``; the next
    token of row ``b`` goes to position ``lengths[b]``. Raises ``PromptError`` if a prompt is empty or
    leaves no room in the cache."""
    dev = model.norm.weight.device
    ids, pos, lengths = pad_prompts(prompts, device=dev, max_len=model.max_seq_len)
    logits, hidden = model(ids, pos, hidden_layers=hidden_layers, logits_at=(lengths - 1)[:, None])
    return logits[:, 0], lengths, hidden
