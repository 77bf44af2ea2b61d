"""fp32 ``y = x @ Wt`` on the CPU for the 1..16-row products of decoding and speculative verification.

Why: on this machine's AMD CPU (OpenBLAS ``Haswell`` kernels, 1 thread) a single-row product is a
memory-bound GEMV (~23 GB/s), but OpenBLAS's SGEMM for 2..16 rows is compute-bound at a poor rate
(in-cache 576x256 block: ~12 GFLOP/s at 2 rows, ~36 at 4, ~52 at 8; see ``tools/bench_matmul.py``),
and torch's MKL GEMM is worse for 4..16 rows. The paths here use the same ``[in, out]`` weight (no
extra copy, nothing prepacked) and only change how the product is split:

* ``"gemm"``: one ``numpy.matmul(x, Wt)`` (GEMV for one row).
* ``"gemm4"``: the same on ``x`` zero-padded to a multiple of 4 rows (OpenBLAS's SGEMM micro-kernel
  covers 4 rows of ``x`` at once; its 1-3-row edge kernels are slow), then the padding rows dropped.
* ``"rows"``: one GEMV per row (``x[i] @ Wt``); cheaper than OpenBLAS's 2-row SGEMM.
* ``"torch"``: ``torch.mm`` (MKL), good for 2 rows on small weights.
* ``"cols<B>"``: output columns in blocks of ``B`` (padded ``x @ Wt[:, k:k+B]``, a strided view,
  written into one preallocated output) so each weight block is reused while cache-hot. Measured, never
  clearly faster than ``"gemm"`` (kept for ``tools/bench_matmul.py``; not picked).

Every path computes each output element as the same K-long fp32 dot product (BLAS summation order
may differ between paths: results agree to ~1e-6 relative, not bit-for-bit).
``pick_path(in_features, out_features, rows)`` is a static table measured on this machine with
``tools/bench_matmul.py`` (median of interleaved repeats under the usual shared load).
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch


def _rows(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    out = np.empty((x.shape[0], wt.shape[1]), dtype=np.float32)  # [R, out]
    for i in range(x.shape[0]):
        np.matmul(x[i], wt, out=out[i])  # GEMV [in] @ [in, out] -> [out]
    return out


def _torch(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    return torch.mm(torch.from_numpy(x), torch.from_numpy(wt)).numpy()  # [R, out]


def _pad4(x: np.ndarray) -> np.ndarray:
    """``x [R, in]`` zero-padded to ``[ceil(R/4)*4, in]`` (OpenBLAS's SGEMM kernel works on 4 columns of
    C at a time; its 1/2-column edge kernels are 1.5-2x slower than a full 4-column block)."""
    r = x.shape[0]
    r4 = -(-r // 4) * 4
    if r4 == r:
        return x
    xp = np.zeros((r4, x.shape[1]), dtype=np.float32)  # [R4, in]
    xp[:r] = x
    return xp


def _gemm4(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
    return np.matmul(_pad4(x), wt)[: x.shape[0]]  # [R4, out] -> leading [R, out] (still C-contiguous)


def _cols(block: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        xp = _pad4(x)  # [R4, in]
        n_out = wt.shape[1]
        out = np.empty((xp.shape[0], n_out), dtype=np.float32)  # [R4, out]
        for k in range(0, n_out, block):
            out[:, k:k + block] = xp @ wt[:, k:k + block]  # [R4, in] @ [in, B] -> [R4, B]
        return out[: x.shape[0]]
    run.__name__ = f"cols{block}"
    return run


#: every path by name: ``fn(x [R, in] fp32 C-contiguous, wt [in, out] fp32 C-contiguous) -> [R, out] fp32``
PATHS: Dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "gemm": np.matmul, "gemm4": _gemm4, "rows": _rows, "torch": _torch,
    "cols2048": _cols(2048), "cols4096": _cols(4096), "cols8192": _cols(8192),
}


#: weights with at least this many elements (in * out) use the LM-head rules of ``pick_path``
LARGE_WEIGHT = 8 * 1024 * 1024


def pick_path(in_features: int, out_features: int, rows: int) -> str:
    """The fastest measured path name (a key of ``PATHS``) for ``[rows, in] @ [in, out]`` fp32 on one
    thread here (``tools/bench_matmul.py``, load average ~3 on 2 cores, medians of interleaved rounds):

    * 1 row: ``"gemm"`` (numpy's GEMV; memory-bound).
    * weights below ``LARGE_WEIGHT`` (576x960 .. 1536x576, cache-resident): 2-3 rows ``"rows"``
      (e.g. w13 576x3072, n=2: 296 us vs 649 us), 4+ rows ``"gemm4"`` unless ``rows % 4 == 0``
      (n=7: 915 us vs 1165 us; n=5, 6: 0.94-1.17x, within the noise of a shared machine).
    * larger weights (the LM head, streamed from DRAM and compute-bound in SGEMM): 2 rows ``"torch"``
      (MKL; 576x49152: 11.3 ms vs 15.0 ms), ``rows % 4 == 3`` ``"gemm4"`` (n=3: 13.4 vs 20.0 ms),
      otherwise ``"gemm"`` (padding 1-2 rows costs more than it saves there).
    """
    if rows <= 1:
        return "gemm"
    if in_features * out_features >= LARGE_WEIGHT:  # an LM head (576x49152: ~16x the L3 share)
        if rows == 2:
            return "torch"  # 11 ms vs 15.8 ms for numpy's SGEMM
        return "gemm4" if rows % 4 == 3 else "gemm"  # compute-bound: pad only one row
    if rows <= 3:
        return "rows"  # 2-3 GEMVs: ~2x faster than OpenBLAS's 2/3-row SGEMM
    return "gemm" if rows % 4 == 0 else "gemm4"  # gemm4 pads to a multiple of 4 rows


def cpu_matmul(x: np.ndarray, wt: np.ndarray, path: str | None = None) -> np.ndarray:
    """``x @ wt`` for ``x [R, in]`` and ``wt [in, out]`` (both fp32, C-contiguous numpy arrays), returning
    a new C-contiguous ``[R, out]`` fp32 array, through ``path`` (default ``pick_path``).
    Raises ``KeyError`` for an unknown path name."""
    if path is None:
        path = pick_path(wt.shape[0], wt.shape[1], x.shape[0])
    return PATHS[path](x, wt)


def path_table(in_features: int, out_features: int, max_rows: int = 16) -> tuple:
    """``table[r]`` = the path function ``pick_path`` picks for ``r`` rows, ``1 <= r <= max_rows``
    (``table[0]`` is ``numpy.matmul``); built once per ``Linear`` so that a forward only indexes it.
    Callers use ``numpy.matmul`` for ``r > max_rows`` (prefill: plain SGEMM is efficient there)."""
    return (np.matmul,) + tuple(PATHS[pick_path(in_features, out_features, r)] for r in range(1, max_rows + 1))
