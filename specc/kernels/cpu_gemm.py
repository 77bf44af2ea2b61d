"""The skinny fp32 GEMM of ``skinny_gemm.c`` (AVX2 + FMA), built on first use and called through ctypes.

``skinny_matmul(x [R, K], w [O, K]) -> [R, O]`` streams each weight row once for all ``R`` rows (BLAS
SGEMM is compute-bound at a poor rate for 2..16 rows on this project's CPU; see ``skinny_gemm.c``):
a SmolLM2 forward over 5 tokens costs 1.4-1.6 one-token steps with it against 2-2.5 with numpy
(``tools/bench_matmul.py --model``). Within this kernel a row's outputs do not depend on ``R`` or on
the thread count, bit for bit.

Build: the C file is compiled with the system C compiler (``$CC``, else ``cc``; with OpenMP when it
can, else single-threaded) into
``$SPECC_CACHE_DIR`` (default ``~/.cache/specc``) ``/kernels/skinny_gemm-<hash>.so`` — the hash covers the
source, the flags and the compiler's version — written to a temporary name and renamed, so concurrent
first uses never load a half-written library. :func:`available` is ``False`` (and callers keep their
numpy paths) when the CPU lacks AVX2/FMA, no compiler is found or the build fails; :func:`status` says why.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import platform
import subprocess
import threading
from typing import Optional

import numpy as np

from specc.kernels import cbuild

SOURCE = pathlib.Path(__file__).with_name("skinny_gemm.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fPIC", "-shared"]
OPENMP = ["-fopenmp"]  # dropped (one thread) when the compiler cannot build with it

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_status: Optional[str] = None  # None = not tried yet; "ok" or the reason it is unavailable
_threads = 1


def _cpu_has_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next((ln for ln in pathlib.Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return False
    tokens = set(flags.split())
    return "avx2" in tokens and "fma" in tokens


def _build() -> ctypes.CDLL:
    """Compile (if not cached) and load the library. Raises ``RuntimeError`` with the reason."""
    lib = cbuild.build(SOURCE, (FLAGS + OPENMP, FLAGS))
    f = lib.skinny_gemm
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                  ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_int]
    return lib


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _status
    if _status is None:
        with _lock:
            if _status is None:
                if os.environ.get("SPECC_SKINNY_GEMM", "1") == "0":
                    _status = "disabled by SPECC_SKINNY_GEMM=0"
                elif not _cpu_has_avx2_fma():
                    _status = "the CPU lacks AVX2/FMA"
                else:
                    try:
                        _lib = _build()
                        _status = "ok"
                    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                        _status = str(e)
    return _lib


def available() -> bool:
    """Whether :func:`skinny_matmul` can run here (builds the library on the first call)."""
    return _load() is not None


def status() -> str:
    """``"ok"`` or why the kernel is unavailable (builds the library on the first call)."""
    _load()
    return _status or "not built"


def set_threads(n: int) -> None:
    """Run each product on ``n`` OpenMP threads (output blocks split between them; results do not
    depend on ``n``). Default 1. Raises ``ValueError`` for ``n < 1``."""
    global _threads
    if int(n) < 1:
        raise ValueError(f"skinny_gemm threads must be >= 1, got {n}")
    _threads = int(n)


def get_threads() -> int:
    """The thread count :func:`skinny_matmul` uses."""
    return _threads


def skinny_matmul(x: np.ndarray, w: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """``x @ w.T`` for ``x [R, K]`` and ``w [O, K]`` (fp32, C-contiguous), into ``out [R, O]`` fp32
    (allocated when ``None``). Best for ``R <= 16``; any ``R >= 1`` is correct.

    Raises ``RuntimeError`` when the kernel is unavailable (check :func:`available`) and ``ValueError``
    for wrong dtypes, layouts or shapes."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"skinny_gemm is unavailable: {_status}")
    if x.dtype != np.float32 or w.dtype != np.float32 or x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"skinny_matmul needs fp32 x [R, K] and w [O, K]; got {x.dtype}{list(x.shape)}, "
                         f"{w.dtype}{list(w.shape)}")
    if not (x.flags.c_contiguous and w.flags.c_contiguous):
        raise ValueError("skinny_matmul needs C-contiguous x and w")
    R, K = x.shape
    O = w.shape[0]
    if out is None:
        out = np.empty((R, O), dtype=np.float32)
    elif out.shape != (R, O) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous fp32 [{R}, {O}] array")
    if np.shares_memory(out, x) or np.shares_memory(out, w):
        raise ValueError("out must not overlap x or w")
    if R == 0 or O == 0:
        return out
    if K == 0:
        out.fill(0.0)
        return out
    rc = lib.skinny_gemm(x.ctypes.data, K, w.ctypes.data, K, out.ctypes.data, O, R, 0, O, _threads)
    if rc != 0:
        raise RuntimeError(f"skinny_gemm rejected R={R}, K={K}, O={O}, threads={_threads} (code {rc})")
    return out
