#!/usr/bin/env python
"""Time `specc check` on one plan from the shell and confirm it does not import torch.

    python tools/bench_check.py [PLAN] [--runs 5]

Prints the wall time of each run of the `specc` console script (a fresh process each time, as a
user or CI sees it), the best and the median, and whether torch was imported (it must not be).
The target is < 1.5 s per run. On a loaded shared machine the wall time includes waiting
for a CPU, so the CPU time (user + sys) is printed too.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan", nargs="?", default="smollm2_eagle3", help="plan file or preset name")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    exe = shutil.which("specc") or f"{sys.executable} -m specc.cli"
    cmd = exe.split() + ["check", args.plan]
    walls, cpus = [], []
    for i in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        walls.append(wall)
        cpus.append(cpu)
        print(f"run {i + 1}: wall {wall:.3f} s, cpu {cpu:.3f} s, exit {proc.returncode}")
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from specc.cli import main; sys.argv=['specc','check',%r]; rc=main();"
         "print('torch' in sys.modules)" % args.plan],
        capture_output=True, text=True)
    torch_loaded = probe.stdout.strip().splitlines()[-1:] == ["True"]
    print(f"specc check {args.plan}: best {min(walls):.3f} s, median {statistics.median(walls):.3f} s wall; "
          f"median cpu {statistics.median(cpus):.3f} s; load average {os.getloadavg()[0]:.2f}")
    print(f"torch imported: {torch_loaded}")
    ok = min(walls) < 1.5 and not torch_loaded
    print("OK" if ok else "FAIL (target: < 1.5 s, no torch)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
