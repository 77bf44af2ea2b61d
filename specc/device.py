"""What this machine's CPU can do, measured, not assumed: its ISA as torch and oneDNN report it, and
which dtype runs a given set of matrix products fastest.

Machines of the same kind differ: an Intel part with AMX runs bf16 GEMMs through oneDNN's
``brg_matmul:avx10_1_512_amx`` kernels several times faster than fp32, an AMD part without bf16 units
emulates bf16 and runs it slower than fp32. Training (:mod:`specc.train`) and ``specc profile`` call
:func:`cpu_facts` and :func:`pick_dtype` and record what they found; nothing in specc hard-codes
either answer. Importing this module does not import torch.
"""
from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
import sys
import time
from typing import Dict, Optional, Sequence, Tuple

# A few bf16 GEMMs under oneDNN's verbose mode: its "isa" info line names the instruction set it
# dispatches to (e.g. "Intel AVX-512 with AVX512BW, AVX512VL, AVX512DQ, AVX512_BF16 and Intel AMX
# with bfloat16 and 8-bit integer support") and each exec line the kernel (``brg_matmul:...``).
_ONEDNN_SNIPPET = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(16, 64).bfloat16(); b = torch.nn.Linear(64, 64).bfloat16()\n"
    "with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):\n"
    "    with torch.no_grad():\n"
    "        b(a)\n"
)


def cpu_name() -> str:
    """This CPU's model name (``model name`` of ``/proc/cpuinfo``; else :func:`platform.processor`,
    else the machine type): the ``device_name`` a CPU cost table is matched on."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def onednn_info() -> Dict[str, str]:
    """oneDNN's own report of this CPU, read from its verbose output in a child process (a few
    seconds at most): ``{"isa": the info line's ISA text, "kernel": the implementation name of a
    bf16 matmul (e.g. ``brg_matmul:avx10_1_512_amx``)}``; empty strings when oneDNN printed nothing
    (a torch build without mkldnn). Never raises."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", OMP_NUM_THREADS="1")
    try:
        out = subprocess.run([sys.executable, "-c", _ONEDNN_SNIPPET], capture_output=True, text=True,
                             timeout=120, env=env).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    isa = kernel = ""
    for line in out.splitlines():
        if ",info,cpu,isa:" in line and not isa:
            isa = line.split(",info,cpu,isa:", 1)[1].strip()
        elif ",exec,cpu," in line and not kernel:
            parts = line.split(",")
            # onednn_verbose,<time?>,exec,cpu,<primitive>,<implementation>,...
            i = parts.index("cpu") if "cpu" in parts else -1
            if 0 <= i < len(parts) - 2:
                kernel = f"{parts[i + 1]}:{parts[i + 2]}"
    return {"isa": isa, "kernel": kernel}


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_facts(threads: Optional[int] = None) -> Dict[str, object]:
    """The facts recorded beside every CPU measurement: ``model`` (``/proc/cpuinfo``),
    ``capability`` (``torch.backends.cpu.get_cpu_capability()``: ``AVX512``, ``AVX2``, ...),
    ``onednn_isa`` and ``onednn_bf16_kernel`` (:func:`onednn_info`), ``amx`` (the kernel or ISA line
    names AMX), ``threads`` (torch's, or the count given), ``torch`` (version), ``quantized_kernels`` (the
    ``specc.kernels.qgemm`` variant the native-precision weights run on here, and the variants this CPU runs)."""
    import torch

    from specc.kernels import qgemm

    info = onednn_info()
    kernels = (f"qgemm {qgemm.variant()} (of {', '.join(qgemm.supported())})" if qgemm.available()
               else f"qgemm unavailable: {qgemm.status()}")
    return {"model": cpu_model(), "capability": torch.backends.cpu.get_cpu_capability(), "quantized_kernels": kernels,
            "onednn_isa": info["isa"], "onednn_bf16_kernel": info["kernel"],
            "amx": bool(re.search(r"amx", info["kernel"] + " " + info["isa"], re.I)),
            "threads": int(threads or torch.get_num_threads()), "torch": torch.__version__}


def time_matmuls(shapes: Sequence[Tuple[int, int, int]], dtype, rounds: int = 5) -> float:
    """Seconds for one pass over ``shapes`` (each ``(M, K, N)``: ``[M, K] @ [K, N]``) in ``dtype``,
    the minimum over ``rounds`` passes after one warm-up (min, not mean: other jobs only add time)."""
    import torch

    mats = [(torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)) for m, k, n in shapes]
    best = float("inf")
    with torch.no_grad():
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            for a, b in mats:
                a @ b
            dt = time.perf_counter() - t0
            if r:
                best = min(best, dt)
    return best


def pick_dtype(shapes: Sequence[Tuple[int, int, int]], candidates: Sequence[str] = ("float32", "bfloat16"),
               rounds: int = 5) -> Tuple[str, Dict[str, float]]:
    """The fastest of ``candidates`` for the matrix products ``shapes`` on this CPU, by measurement:
    ``(name, {name: GFLOP/s})``. Seconds, not minutes: a few passes over the shapes per dtype.
    Candidates are interleaved (fp32, bf16, fp32, ...) so load drift hits both alike."""
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    for c in candidates:
        if c not in table:
            raise ValueError(f"dtype {c!r} is not one of {', '.join(table)}")
    flops = sum(2.0 * m * k * n for m, k, n in shapes)
    best: Dict[str, float] = {c: float("inf") for c in candidates}
    for _ in range(2):
        for c in candidates:
            best[c] = min(best[c], time_matmuls(shapes, table[c], rounds=max(1, rounds // 2)))
    rate = {c: flops / s / 1e9 for c, s in best.items()}
    return max(rate, key=rate.get), rate


def available_memory() -> int:
    """Bytes of memory this process can still take, now: the kernel's ``MemAvailable`` estimate
    (``/proc/meminfo``; else free physical pages), lowered to what is left under the cgroup's
    ``memory.max`` (cgroup v2: a container's limit) and under ``RLIMIT_AS``. Never raises."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            avail = 1 << 62
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - current))
    except (OSError, ValueError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            avail = min(avail, max(0, soft - used))
    except (OSError, ValueError, ImportError):
        pass
    return int(avail)


def describe(facts: Dict[str, object]) -> str:
    """One line for logs and cards: model, capability, oneDNN ISA, threads."""
    isa = facts.get("onednn_isa") or "oneDNN printed no ISA line"
    return (f"{facts.get('model')} ({facts.get('capability')}; oneDNN: {isa}; bf16 matmul kernel "
            f"{facts.get('onednn_bf16_kernel') or 'unknown'}; {facts.get('threads')} thread(s))")
