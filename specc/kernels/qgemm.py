"""Products of fp32 activations with block-quantized weights (``qgemm.c``), built on first use, called by ctypes.

``q4_matmul(x, qs, d, m)`` and ``q8_matmul(x, qs, d)`` compute ``x @ W.T`` for ``x [R, K]`` fp32 with the
weight ``W [N, K]`` kept in the checkpoint's own 4- or 8-bit codes (layouts in ``qgemm.c`` and
``specc.models.qweights``). Every output element is the same fp32 operation sequence for any row count
``R`` and thread count (within one instruction-set variant), so a k-row verify gives each row the bits of
the one-row step.

Variants: ``"avx512vnni"`` (q4 and Q8_0 weights repacked 16 outputs at a time and multiplied with
activations quantized per 32-block to int8 by ``vpdpbusd``, as llama.cpp does; everything else as
``"avx512"``), ``"avx2int8"`` (the same packed products on AVX2 by ``vpmaddubsw`` / ``vpmaddwd``, as
llama.cpp does on AVX2: the same bits as ``avx512vnni``; everything else as ``"avx2"``), ``"avx512"``
(AVX-512F), ``"avx2"`` (AVX2 + FMA), ``"portable"`` (plain C); the last three multiply the checkpoint's
weights with fp32 activations. The process uses one variant for every product: the first of
:data:`PREFERENCE` the CPU runs, or ``$SPECC_QGEMM_VARIANT`` when set (a variant the CPU lacks is an
error; ``$SPECC_QGEMM_ISA=avx2`` keeps the process on the variants an AVX2-only CPU runs, for measuring them
on a larger one: the products, the attention and variant 4's fp32 parts, :data:`ISA_CEILINGS`); ``specc.runtime.loader.load_models`` sets the device profile's measured choice (the cost table's
``choice.qgemm_variant``) unless ``$SPECC_QGEMM_VARIANT`` is set. Build: ``specc.kernels.cbuild`` with the
system C compiler (OpenMP when it can); without a compiler :func:`available` is False and :func:`status` says why (the quantized
weights then run through ``torch``, dequantized block by block; see ``specc.models.qweights``).
"""
from __future__ import annotations

import ctypes
import math
import os
import pathlib
import platform
import subprocess
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Iterator, NamedTuple, Optional

import torch

from specc.errors import SpeccError
from specc.kernels import cbuild
from specc.kernels.variants import ISA_CEILINGS, PACKED_VARIANTS, PREFERENCE, VARIANTS

SOURCE = pathlib.Path(__file__).with_name("qgemm.c")
#: -ffp-contract=off: a * b + c is never fused unless written as an FMA, so every function cloned per
#: instruction set (target_clones) computes the same bits on every CPU
FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off"]
OPENMP = ["-fopenmp"]


class KernelSettingError(SpeccError, ValueError):
    """A ``$SPECC_QGEMM_ISA`` / ``$SPECC_QGEMM_VARIANT`` this process cannot take: the user's input, so
    the CLI prints it without a traceback (exit 2); a ValueError as before for callers that catch one."""


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_status: Optional[str] = None
_variant = -1
_threads = 1


def _build() -> ctypes.CDLL:
    lib = cbuild.build(SOURCE, (FLAGS + OPENMP, FLAGS), libs=["-lm"])
    lib.qgemm_variants.restype = ctypes.c_int
    lib.qgemm_limit.restype = None
    lib.qgemm_limit.argtypes = [ctypes.c_int]
    lib.qgemm_set_streams.restype = ctypes.c_int
    lib.qgemm_set_streams.argtypes = [ctypes.c_int]
    lib.q4_gemm.restype = lib.q8_gemm.restype = ctypes.c_int
    p, L, I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.q4_gemm.argtypes = [p, L, L, p, p, p, p, L, I, I]
    lib.q4v_gemm.restype = ctypes.c_int
    lib.q4v_gemm.argtypes = [p, L, L, p, I, p, L, I, I]
    lib.q4v_bytes.restype = lib.q8v_bytes.restype = L
    lib.q4v_bytes.argtypes = lib.q8v_bytes.argtypes = [L, L, I]
    lib.q8v_gemm.restype = ctypes.c_int
    lib.q8v_gemm.argtypes = [p, L, L, p, I, p, L, I, I]
    lib.q8v_pack.restype = lib.q8v_unpack.restype = lib.q8v_rows.restype = lib.q4v_rows.restype = None
    lib.q8v_pack.argtypes = [p, p, L, L, I, p]
    lib.q8v_unpack.argtypes = [p, I, L, L, p, p]
    lib.q8v_rows.argtypes = lib.q4v_rows.argtypes = [p, I, L, L, p, L, p]
    lib.q4v_pack.restype = lib.q4v_unpack.restype = None
    lib.q4v_pack.argtypes = [p, p, p, L, L, I, p]
    lib.q4v_unpack.argtypes = [p, L, L, I, p, p, p]
    lib.q8_gemm.argtypes = [p, L, L, L, p, p, p, L, I, I]
    lib.h16_gemm.restype = ctypes.c_int
    lib.h16_gemm.argtypes = [p, L, L, p, I, p, L, I, I]
    lib.norm_linear.restype = lib.ffn_block.restype = ctypes.c_int
    F = ctypes.c_float
    lib.norm_linear.argtypes = [p, L, L, p, F, I, L, p, p, p, L, p, I, I]
    lib.ffn_block.argtypes = [p, p, L, L, L, L] + [I, L, p, p, p] * 3 + [p, F, p, I, I]
    lib.attn_f32.restype = ctypes.c_int
    lib.attn_f32.argtypes = [p, L, L, L, L, L, p, p, p, p, L, p, p, p, L, F, p, I]
    lib.rms_norm_f32.restype = None
    lib.rms_norm_f32.argtypes = [p, L, L, p, ctypes.c_float, p]
    lib.qgemm_trace.restype = None
    lib.qgemm_trace.argtypes = [I]
    lib.qgemm_trace_size.restype = L
    lib.qgemm_trace_read.restype = None
    lib.qgemm_trace_read.argtypes = [p]
    lib.qgemm_walk.restype = I
    lib.qgemm_walk.argtypes = [I, I, L, p]
    lib.decoder_stack.restype = ctypes.c_int
    lib.decoder_stack.argtypes = [p, L, p, L, L, L, L, L, L, L, L, F, L, L, p, p, p, p, p, L, p, p, I, I]
    if lib.qgemm_trace_size() != math.prod(_TRACE_SHAPE):  # the trace buffers are sized from _TRACE_SHAPE
        raise RuntimeError(f"qgemm.c's trace holds {lib.qgemm_trace_size()} counts, qgemm.py expects {_TRACE_SHAPE}")
    return lib


class LayerArgs(ctypes.Structure):
    """One decoder layer's weights and caches for ``decoder_stack`` (``layer_args`` of ``qgemm.c``): the
    two RMSNorm weights and epsilons, (kind, group, codes, d, m) of the q/k/v, wo, w13 and w2 linears as
    :func:`_lin_args` gives them, and the layer's K and V caches."""

    _fields_ = ([("n1", ctypes.c_void_p), ("n2", ctypes.c_void_p), ("e1", ctypes.c_float), ("e2", ctypes.c_float)]
                + [(f"k{n}", ctypes.c_int) for n in ("q", "o", "13", "2")]
                + [(f"g{n}", ctypes.c_long) for n in ("q", "o", "13", "2")]
                + [(f"{f}{n}", ctypes.c_void_p) for f in ("q", "d", "m") for n in ("q", "o", "13", "2")]
                + [("kc", ctypes.c_void_p), ("vc", ctypes.c_void_p)])


def layer_args(n1: int, e1: float, lq: tuple, lo: tuple, l13: tuple, l2: tuple, n2: int, e2: float, kc: int,
               vc: int) -> LayerArgs:
    """A :class:`LayerArgs` for one layer from raw pointers: the input and FFN RMSNorm weights ``[H]`` fp32
    (``n1``, ``n2``) and their epsilons, the (kind, group, codes, d, m) tuples :func:`_lin_args` gives for
    ``wqkv [nq, H]``, ``wo [H, Q]``, ``w13 [2I, H]`` and ``w2 [H, I]``, and the K / V caches
    ``[rows, nkv, Smax, D]`` fp32 contiguous (``kc``, ``vc``). The tensors must outlive its use."""
    a = LayerArgs(n1=n1, n2=n2, e1=e1, e2=e2, kc=kc, vc=vc)
    for n, lin in zip(("q", "o", "13", "2"), (lq, lo, l13, l2)):
        for field, value in zip(("k", "g", "q", "d", "m"), lin):
            setattr(a, f"{field}{n}", value)
    return a


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _status, _variant
    if _status is None:
        with _lock:
            if _status is None:
                if platform.machine().lower() not in ("x86_64", "amd64"):
                    _status = f"qgemm.c is written for x86-64 (this machine: {platform.machine()})"
                    return None
                try:
                    lib = _build()
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    _status = str(e)
                    return None
                isa = os.environ.get("SPECC_QGEMM_ISA", "").strip()
                if isa:
                    if isa not in ISA_CEILINGS:
                        raise KernelSettingError(f"SPECC_QGEMM_ISA={isa!r}: choose one of {', '.join(ISA_CEILINGS)} "
                                                 f"(or unset it to run every path this CPU has)")
                    lib.qgemm_limit(sum(1 << VARIANTS.index(v) for v in ISA_CEILINGS[isa]))
                mask = lib.qgemm_variants()
                want = os.environ.get("SPECC_QGEMM_VARIANT", "").strip()
                if want:
                    if want not in VARIANTS:
                        raise KernelSettingError(f"SPECC_QGEMM_VARIANT={want!r}: choose one of {', '.join(VARIANTS)}")
                    if not mask & (1 << VARIANTS.index(want)):
                        why = (f"SPECC_QGEMM_ISA={isa} leaves only" if isa else "this CPU cannot run it (it runs")
                        raise KernelSettingError(f"SPECC_QGEMM_VARIANT={want}: {why} "
                                                 f"{', '.join(supported_from(mask))}{'' if isa else ')'}; unset it")
                    _variant = VARIANTS.index(want)
                else:
                    _variant = VARIANTS.index(_preferred(supported_from(mask)))
                _lib, _status = lib, "ok"
    return _lib


def supported_from(mask: int) -> list:
    """Variant names in a ``qgemm_variants`` bit mask."""
    return [v for i, v in enumerate(VARIANTS) if mask & (1 << i)]


def available() -> bool:
    """Whether the kernels run here (builds the library on the first call)."""
    return _load() is not None


def status() -> str:
    """``"ok"`` or why the kernels are unavailable."""
    _load()
    return _status or "not built"


def variant() -> str:
    """The variant every product of this process uses (one of :data:`VARIANTS`).
    Raises ``RuntimeError`` when the library is unavailable."""
    if _load() is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    return VARIANTS[_variant]


def _preferred(runnable) -> str:
    """The first of :data:`PREFERENCE` in ``runnable`` (variant names)."""
    return next(v for v in PREFERENCE if v in runnable)


def default_variant() -> str:
    """The first of :data:`PREFERENCE` this CPU runs (what a process starts with without
    ``$SPECC_QGEMM_VARIANT``). Raises ``RuntimeError`` when the library is unavailable."""
    if _load() is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    return _preferred(supported())


def supported() -> list:
    """The variants this CPU runs (empty when the library is unavailable)."""
    lib = _load()
    return supported_from(lib.qgemm_variants()) if lib is not None else []


def set_variant(name: str) -> None:
    """Use variant ``name`` for every later product (``specc.runtime.loader.load_models`` sets the device
    profile's choice; tests compare variants). Weights already packed (loaded under an int8 variant) keep
    running the packed products, which give the same bits on either int8 ISA; weights in the plain
    layout run the new variant's products (an int8 variant packs them on first use).
    Raises ``ValueError`` for a name this CPU cannot run."""
    global _variant
    if name not in supported():
        raise ValueError(f"qgemm variant {name!r} is not runnable here (runnable: {', '.join(supported())})")
    _variant = VARIANTS.index(name)


def set_streams(n: int) -> None:
    """Cap the weight streams the packed products (``avx512vnni`` and ``avx2int8``) read side by side
    (``qgemm_set_streams``): a row count whose tile reads more than ``n`` streams reads one (so 2 or 3
    leave only the two-stream tiles on); 1 = one stream everywhere, the walk without the multi-stream
    tiles; the default 4 = every tile of the tables. For measuring the walk against one stream: results
    do not depend on it. Raises ``ValueError`` for ``n < 1`` and ``RuntimeError`` when the kernels are
    unavailable."""
    if n < 1:
        raise ValueError(f"set_streams: n must be >= 1, got {n}")
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    lib.qgemm_set_streams(int(n))


def set_threads(n: int) -> None:
    """OpenMP threads per product (results do not depend on it). Raises ``ValueError`` for ``n < 1``."""
    global _threads
    if int(n) < 1:
        raise ValueError(f"qgemm threads must be >= 1, got {n}")
    _threads = int(n)


PRODUCTS = ("q4", "q8", "h16", "q4v", "q8v")
"""The products of ``qgemm.c`` (index = its ``PRODUCT_*`` number): q4 / q8 codes and 16-bit values with fp32
activations, and q4 / q8 codes packed for the int8 tiles."""
_TRACE_SHAPE = (len(PRODUCTS), len(VARIANTS), 9, 5)  # qgemm.c: PRODUCTS x TRACE_ISAS x TRACE_ROWS x TRACE_STREAMS


class Tile(NamedTuple):
    """One row chunk of a ``qgemm.c`` product, as :func:`tile_trace` and :func:`walk` count it: ``product`` (one
    of :data:`PRODUCTS`), the ``isa`` it runs (one of :data:`VARIANTS`), the activation ``rows`` of the chunk
    (1..8: a product over R rows walks chunks of 8 on AVX-512 and the packed tiles, of 4 on AVX2 and portable;
    the portable products run one generic tile that takes the row count as an argument) and the weight
    ``streams`` the walk reads side by side for that row count (packed products, ``walk_streams``; 1 for the
    others). ``streams`` is the walk's setting, not a count of tile calls: within the chunk the packed walk
    also runs one-stream tiles, for the groups left over where a thread's part does not split into
    ``streams`` equal ranges, and for all of them where a part has fewer than ``streams`` groups (a weight of
    at most ``16 * (streams - 1)`` outputs per thread never runs a multi-stream tile)."""

    product: str
    isa: str
    rows: int
    streams: int

    @property
    def label(self) -> str:
        """``"product/isa rows x streams"``, e.g. ``"q4v/avx512vnni 5x2"``."""
        return f"{self.product}/{self.isa} {self.rows}x{self.streams}"


def _tiles(counts: torch.Tensor) -> Counter:
    c = counts.view(_TRACE_SHAPE)
    return Counter({Tile(PRODUCTS[p], VARIANTS[i], r, s): int(c[p, i, r, s])
                    for p, i, r, s in torch.nonzero(c).tolist()})


@contextmanager
def tile_trace() -> Iterator[Counter]:
    """Record which compiled tiles the products run inside the ``with`` block (``qgemm_trace``): yields a
    ``Counter`` of :class:`Tile` → row chunks run, filled when the block ends. One product call over R rows
    counts one chunk per 8 rows (4 on the portable and AVX2 fp32-activation products), recorded from the
    product's arguments before its walk: the row specialization is exact, ``streams`` is the one the walk is
    set to for those rows (see :class:`Tile` for the one-stream tiles it also runs). Process-wide: products
    run by other threads meanwhile count too, and a trace started inside another restarts it (the outer one
    then loses what came before). Raises ``RuntimeError`` when the kernels are unavailable."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    out: Counter = Counter()
    lib.qgemm_trace(1)
    try:
        yield out
    finally:
        lib.qgemm_trace(0)
        buf = torch.zeros(_TRACE_SHAPE, dtype=torch.int64)
        lib.qgemm_trace_read(buf.data_ptr())
        out.update(_tiles(buf))


def walk(product: str, rows: int, variant_name: Optional[str] = None) -> Counter:
    """The tiles one call of ``product`` (one of :data:`PRODUCTS`) over ``rows`` activation rows runs under
    ``variant_name`` (default: the process's variant), as :func:`tile_trace` counts them; read from the
    tables the products use (``qgemm_walk``). Raises ``ValueError`` for an unknown product or variant, a
    variant this CPU cannot run, or ``rows < 1``, and ``RuntimeError`` when the kernels are unavailable."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    if product not in PRODUCTS:
        raise ValueError(f"qgemm product {product!r}: choose one of {', '.join(PRODUCTS)}")
    v = _variant if variant_name is None else VARIANTS.index(variant_name) if variant_name in VARIANTS else -1
    if v < 0:
        raise ValueError(f"qgemm variant {variant_name!r}: choose one of {', '.join(VARIANTS)}")
    buf = torch.zeros(_TRACE_SHAPE, dtype=torch.int64)
    rc = lib.qgemm_walk(PRODUCTS.index(product), v, int(rows), buf.data_ptr())
    if rc == -1:
        raise ValueError(f"qgemm walk: rows must be >= 1, got {rows}")
    if rc:
        raise ValueError(f"qgemm variant {VARIANTS[v]} cannot run {product} here (runnable: {', '.join(supported())})")
    return _tiles(buf)


def product_of(w) -> str:
    """The :data:`PRODUCTS` entry a ``QuantWeight`` runs: ``h16`` for 16-bit values, else its ``q4`` / ``q8``
    codes packed for the int8 tiles (``q4v`` / ``q8v``) where it runs packed, as :func:`_lin_args` passes it.
    Reads the weight only (packs nothing)."""
    if w.half:
        return "h16"
    return ("q4" if w.kind == "q4" else "q8") + ("v" if w.runs_packed else "")


def _check_x(x: torch.Tensor, K: int) -> torch.Tensor:
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != K or x.device.type != "cpu":
        raise ValueError(f"x must be a CPU fp32 [R, {K}] tensor, got {x.dtype} {list(x.shape)} on {x.device}")
    return x.contiguous()


def _out(out: Optional[torch.Tensor], R: int, N: int) -> torch.Tensor:
    """The ``[R, N]`` fp32 result buffer: a new one, or ``out`` when it is a contiguous CPU fp32
    ``[R, N]`` tensor (the kernels write ``R * N`` floats from its first element). Raises ``ValueError``
    for any other ``out``."""
    if out is None:
        return torch.empty(R, N, dtype=torch.float32)
    if out.dtype != torch.float32 or tuple(out.shape) != (R, N) or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(f"out must be a contiguous CPU fp32 [{R}, {N}] tensor, got {out.dtype} {list(out.shape)} "
                         f"(contiguous: {out.is_contiguous()}) on {out.device}")
    return out


def q4_matmul(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
              out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ W.T`` for ``x [R, K]`` fp32 and ``W`` in the q4 layout: ``qs`` uint8 ``[N, K/32, 16]``,
    ``d``, ``m`` fp32 ``[N, K/32]`` (``w = d * code + m``). Returns ``[R, N]`` fp32 (``out`` when given).
    Raises ``RuntimeError`` when the kernels are unavailable and ``ValueError`` for bad shapes/dtypes."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    N, nb = d.shape
    x = _check_x(x, nb * 32)
    R = x.shape[0]
    y = _out(out, R, N)
    if R == 0:
        return y
    rc = lib.q4_gemm(x.data_ptr(), R, nb * 32, qs.data_ptr(), d.data_ptr(), m.data_ptr(), y.data_ptr(), N,
                     _variant, _threads)
    if rc != 0:
        raise ValueError(f"q4_gemm rejected R={R}, K={nb * 32}, N={N} (code {rc})")
    return y


def q8_matmul(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ W.T`` for ``x [R, K]`` fp32 and ``W`` in the q8 layout: ``qs`` int8 ``[N, K/G, G]``, ``d``
    fp32 ``[N, K/G]`` (``w = d * code``; G a multiple of 16). Returns ``[R, N]`` fp32. Raises
    ``RuntimeError`` when the kernels are unavailable and ``ValueError`` for bad shapes/dtypes."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    N, nb, G = qs.shape
    x = _check_x(x, nb * G)
    R = x.shape[0]
    y = _out(out, R, N)
    if R == 0:
        return y
    rc = lib.q8_gemm(x.data_ptr(), R, nb * G, G, qs.data_ptr(), d.data_ptr(), y.data_ptr(), N, _variant, _threads)
    if rc != 0:
        raise ValueError(f"q8_gemm rejected R={R}, K={nb * G}, G={G}, N={N} (code {rc})")
    return y


#: 16-bit weight dtypes ``h16_matmul`` multiplies in their own bytes, with the C kind and bf flag
HALF = {torch.float16: (16, 0), torch.bfloat16: (17, 1)}


def h16_matmul(x: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ W.T`` for ``x [R, K]`` fp32 and ``W [N, K]`` fp16 or bf16 (K a multiple of 16), each weight
    widened to fp32 exactly in registers: the fp32 product of the weight's values, row-invariant.
    Returns ``[R, N]`` fp32 (``out`` when given: a contiguous fp32 ``[R, N]`` tensor). Raises
    ``RuntimeError`` when the kernels are unavailable and ``ValueError`` for bad shapes/dtypes."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    if w.dtype not in HALF or w.dim() != 2 or w.shape[1] % 16 or w.device.type != "cpu":
        raise ValueError(f"w must be a CPU fp16/bf16 [N, K] tensor with K a multiple of 16, got {w.dtype} "
                         f"{list(w.shape)} on {w.device}")
    N, K = w.shape
    x = _check_x(x, K)
    w = w.contiguous()
    R = x.shape[0]
    y = _out(out, R, N)
    if R == 0:
        return y
    rc = lib.h16_gemm(x.data_ptr(), R, K, w.data_ptr(), HALF[w.dtype][1], y.data_ptr(), N, _variant, _threads)
    if rc != 0:
        raise ValueError(f"h16_gemm rejected R={R}, K={K}, N={N} (code {rc})")
    return y


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x [..., H]`` fp32 with weight ``w [H]`` fp32 -> a new ``[..., H]`` fp32 tensor, each row
    computed the same way whatever the row count. Raises ``RuntimeError`` when the library is unavailable."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    xc = x.contiguous()
    y = torch.empty_like(xc)
    H = xc.shape[-1]
    lib.rms_norm_f32(xc.data_ptr(), xc.numel() // H if H else 0, H, w.data_ptr(), eps, y.data_ptr())
    return y


def _lin_args(w) -> tuple:
    """(kind, group, codes, d, m) ctypes arguments of a ``QuantWeight`` (kind 4 = q4, 5 / 6 = q4 packed for
    the int8 kernels (VNNI or AVX2) with fp32 / fp16 scales, 8 = q8, 9 / 10 = q8 packed, 16 / 17 = fp16 / bf16 values)."""
    if w.half:
        return HALF[w.qs.dtype][0], w.group, w.qs.data_ptr(), None, None
    if w.runs_packed:  # once packed, always packed (no temporaries)
        buf, f16 = w.packed()
        kind = (6 if f16 else 5) if w.kind == "q4" else (10 if f16 else 9)
        return kind, w.group, buf.data_ptr(), None, None
    return (4 if w.kind == "q4" else 8, w.group, w.qs.data_ptr(), w.d.data_ptr(),
            w.m.data_ptr() if w.m is not None else None)


def norm_linear(x: torch.Tensor, norm_w: torch.Tensor, eps: float, w) -> torch.Tensor:
    """``rms_norm(x) @ W.T`` in one call: ``x [R, H]`` fp32, ``w`` a ``QuantWeight`` ``[N, H]`` -> ``[R, N]``.
    Bits equal ``rms_norm`` then ``q4_matmul`` / ``q8_matmul``. Raises ``RuntimeError`` when unavailable."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    x = _check_x(x, w.shape[1])
    R, N = x.shape[0], w.shape[0]
    y = torch.empty(R, N, dtype=torch.float32)
    rc = lib.norm_linear(x.data_ptr(), R, w.shape[1], norm_w.data_ptr(), eps, *_lin_args(w), N, y.data_ptr(),
                         _variant, _threads)
    if rc:
        raise ValueError(f"norm_linear rejected R={R}, H={w.shape[1]}, N={N} (code {rc})")
    return y


def ffn_block(a: torch.Tensor, x: torch.Tensor, wo, w13, w2, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """A decoder layer after attention in one call: ``h = x + a @ Wo.T``, then ``h + W2 (silu(g) * u)`` with
    ``(g | u) = W13 rms_norm(h)``. ``a [R, Q]``, ``x [R, H]`` fp32; ``wo [H, Q]``, ``w13 [2I, H]``, ``w2 [H, I]``
    ``QuantWeight`` s. Returns ``[R, H]`` fp32. Raises ``RuntimeError`` when unavailable."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    H, Q = wo.shape
    I = w2.shape[1]
    a = _check_x(a, Q)
    x = _check_x(x, H)
    R = a.shape[0]
    out = torch.empty(R, H, dtype=torch.float32)
    rc = lib.ffn_block(a.data_ptr(), x.data_ptr(), R, H, Q, I, *_lin_args(wo), *_lin_args(w13), *_lin_args(w2),
                       norm_w.data_ptr(), eps, out.data_ptr(), _variant, _threads)
    if rc:
        raise ValueError(f"ffn_block rejected R={R}, H={H}, Q={Q}, I={I} (code {rc})")
    return out


def packs() -> bool:
    """Whether q4 and group-32 q8 weights run repacked for the int8 kernels (the variant is one of
    :data:`PACKED_VARIANTS`)."""
    return _load() is not None and VARIANTS[_variant] in PACKED_VARIANTS




def packable(kind: str, group: int) -> bool:
    """Whether a weight of this layout has a packing for the int8 kernels (q4, and q8 with 32-value groups)."""
    return kind == "q4" or (kind == "q8" and group == 32)


def _f16_exact(d: torch.Tensor, m: Optional[torch.Tensor]) -> int:
    return int(bool(torch.equal(d.half().float(), d) and (m is None or torch.equal(m.half().float(), m))))


def packed_bytes(kind: str, N: int, K: int, f16: int) -> int:
    """Bytes of the VNNI packing of an ``[N, K]`` q4 / q8 weight."""
    lib = _load()
    return lib.q4v_bytes(N, K, f16) if kind == "q4" else lib.q8v_bytes(N, K, f16)


def pack(kind: str, qs: torch.Tensor, d: torch.Tensor, m: Optional[torch.Tensor],
         out: Optional[torch.Tensor] = None):
    """A q4 or group-32 q8 weight repacked for the VNNI kernels: ``(bytes uint8 tensor, f16)`` (fp16 scales
    when every scale is exactly an fp16), written into ``out`` (a uint8 slice of ``packed_bytes``) when
    given."""
    lib = _load()
    N, nb = d.shape
    f16 = _f16_exact(d, m)
    if out is None:
        out = torch.empty(packed_bytes(kind, N, nb * 32, f16), dtype=torch.uint8)
    if kind == "q4":
        lib.q4v_pack(qs.contiguous().data_ptr(), d.contiguous().data_ptr(), m.contiguous().data_ptr(), N, nb * 32,
                     f16, out.data_ptr())
    else:
        lib.q8v_pack(qs.contiguous().data_ptr(), d.contiguous().data_ptr(), N, nb * 32, f16, out.data_ptr())
    return out, f16


def unpack(kind: str, packed, N: int, K: int):
    """The inverse of :func:`pack`: ``(qs, d, m)`` (m None for q8)."""
    if kind == "q4":
        return q4v_unpack(packed, N, K)
    lib = _load()
    buf, f16 = packed
    qs = torch.empty(N, K // 32, 32, dtype=torch.int8)
    d = torch.empty(N, K // 32, dtype=torch.float32)
    lib.q8v_unpack(buf.data_ptr(), f16, N, K, qs.data_ptr(), d.data_ptr())
    return qs, d, None


def packed_rows(kind: str, packed, N: int, K: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` (int64, any shape) of a packed weight dequantized -> ``[*ids.shape, K]`` fp32 (exactly
    the values of the unpacked layout's dequantization)."""
    lib = _load()
    buf, f16 = packed
    flat = ids.reshape(-1).contiguous()
    out = torch.empty(flat.numel(), K, dtype=torch.float32)
    fn = lib.q4v_rows if kind == "q4" else lib.q8v_rows
    fn(buf.data_ptr(), f16, N, K, flat.data_ptr(), flat.numel(), out.data_ptr())
    return out.view(*ids.shape, K)


def packed_matmul(kind: str, x: torch.Tensor, packed, N: int, K: int) -> torch.Tensor:
    """``x [R, K]`` fp32 @ W^T for an ``[N, K]`` q4 / q8 weight packed by :func:`pack`, activations quantized
    per 32-block to int8 (see ``qgemm.c``), on the current variant's tiles (``avx512vnni`` or ``avx2int8``;
    under an fp32-activation variant, the first of those the CPU runs: the same bits). Returns ``[R, N]``
    fp32. Raises ``RuntimeError`` when the kernels are unavailable and ``ValueError`` when the kernel
    rejects the sizes."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    buf, f16 = packed
    x = _check_x(x, K)
    R = x.shape[0]
    y = torch.empty(R, N, dtype=torch.float32)
    if R == 0:
        return y
    fn = lib.q4v_gemm if kind == "q4" else lib.q8v_gemm
    rc = fn(x.data_ptr(), R, K, buf.data_ptr(), f16, y.data_ptr(), N, _variant, _threads)
    if rc != 0:
        raise ValueError(f"{kind}v_gemm rejected R={R}, K={K}, N={N} (code {rc})")
    return y


def q4v_pack(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
    """The q4 layout (``qs`` uint8 ``[N, nb, 16]``, ``d``, ``m`` fp32 ``[N, nb]``) repacked for
    :func:`q4v_matmul`: ``(bytes uint8 tensor, f16)``, the records of ``qgemm.c`` with fp16 scales when
    every scale is exactly an fp16 (Q4_0, Q4_1), else fp32."""
    return pack("q4", qs, d, m)


def q4v_unpack(packed, N: int, K: int):
    """The inverse of :func:`q4v_pack`: ``(qs, d, m)`` in the q4 layout for an ``[N, K]`` weight."""
    lib = _load()
    buf, f16 = packed
    nb = K // 32
    qs = torch.empty(N, nb, 16, dtype=torch.uint8)
    d = torch.empty(N, nb, dtype=torch.float32)
    m = torch.empty(N, nb, dtype=torch.float32)
    lib.q4v_unpack(buf.data_ptr(), N, K, f16, qs.data_ptr(), d.data_ptr(), m.data_ptr())
    return qs, d, m


def q4v_matmul(x: torch.Tensor, packed, N: int, K: int) -> torch.Tensor:
    """``x [R, K]`` fp32 @ W^T for an ``[N, K]`` q4 weight packed by :func:`q4v_pack` (see
    :func:`packed_matmul`)."""
    return packed_matmul("q4", x, packed, N, K)


def attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor, num_heads: int,
              scale: float) -> torch.Tensor:
    """One layer's fp32 attention in C (``attn_f32`` of ``qgemm.c``): RoPE on q and k, K/V written to the
    caches, softmax attention over the first ``S`` slots of each row.

    Args: qkv ``[B, N, (nh + 2 nkv) D]`` fp32; cos, sin ``[B, N, D]`` fp32 (sin with rotate_half's sign);
    k_cache, v_cache ``[rows, nkv, Smax, D]`` fp32 contiguous; rows ``[B]`` int64 cache rows; slots
    ``[B, N]`` int64 cache slots to write; mask ``[B, N, S]`` fp32 additive (0 attend, fp32-min masked).
    Returns ``[B, N, nh D]`` fp32. Raises ``RuntimeError`` when unavailable, ``ValueError`` for bad shapes
    or a slot outside the cache."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    B, N, _ = qkv.shape
    _, nkv, Smax, D = k_cache.shape
    S = mask.shape[-1]
    qkv, cos, sin, mask = qkv.contiguous(), cos.contiguous(), sin.contiguous(), mask.contiguous()
    rows, slots = rows.contiguous(), slots.contiguous()
    out = torch.empty(B, N, num_heads * D, dtype=torch.float32)
    rc = lib.attn_f32(qkv.data_ptr(), B, N, num_heads, nkv, D, cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
                      v_cache.data_ptr(), Smax, rows.data_ptr(), slots.data_ptr(), mask.data_ptr(), S, scale,
                      out.data_ptr(), _threads)
    if rc:
        raise ValueError(f"attn_f32 rejected B={B}, N={N}, heads {num_heads}/{nkv}, D={D}, S={S}/{Smax} (code {rc})")
    return out


def decoder_stack(layers: ctypes.Array, x: torch.Tensor, dims: tuple, step, pack_index: Optional[torch.Tensor] = None,
                  hidden: Optional[ctypes.Array] = None) -> None:
    """Every decoder layer of one forward in one C call (``decoder_stack`` of ``qgemm.c``): per layer the
    bits of :func:`norm_linear`, :func:`attention` and :func:`ffn_block` in turn, no interpreter between.

    Args: layers: a ctypes array of :class:`LayerArgs`, one per layer in order; x ``[R, H]`` fp32
    contiguous, overwritten with the last layer's output; dims ``(H, Q, I, nh, nkv, D, Smax, scale)``;
    step: the forward's attention inputs with pointer attributes ``cos``, ``sin`` (``[B, N, D]``),
    ``rows`` (``[B]`` int64), ``slots`` (``[B, N]`` int64), ``mask`` (``[B, N, S]`` additive fp32) and
    sizes ``B``, ``N``, ``S``; pack_index ``[R]`` int64 grid positions ``b N + n`` of a ragged batch's
    real tokens (None: R = B N); hidden: None or a ctypes array of one pointer per layer, each NULL or a
    ``[R, H]`` fp32 destination for that layer's output. Raises ``RuntimeError`` when unavailable and
    ``ValueError`` when the C side rejects the shapes."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"qgemm is unavailable: {_status}")
    H, Q, I, nh, nkv, D, smax, scale = dims
    R = x.shape[0]
    rc = lib.decoder_stack(ctypes.addressof(layers), len(layers), x.data_ptr(), R, H, Q, I, nh, nkv, D, smax, scale,
                           step.B, step.N, step.cos, step.sin, step.rows, step.slots, step.mask, step.S,
                           None if pack_index is None else pack_index.data_ptr(),
                           None if hidden is None else ctypes.addressof(hidden), _variant, _threads)
    if rc:
        raise ValueError(f"decoder_stack rejected R={R}, B={step.B}, N={step.N}, S={step.S} (code {rc})")
