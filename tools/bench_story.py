#!/usr/bin/env python
"""Do tune, explain and bench tell the same story? One run, on this machine:

1. ``specc tune PROMPTS --concurrency 1,4 --out DIR/tuned.yaml`` (a small budget): the plan, its
   acceptance record and the cost table it predicted with, beside it;
2. ``specc explain DIR/tuned.yaml --format json``: the plan's predicted speedup at each concurrency
   (``plan_at_concurrency``: tune's own predictor over those records);
3. ``specc bench DIR/tuned.yaml --concurrency 1,4 --json``, ``--rounds`` times: each call runs plain
   decoding and the plan on the same requests through the same runtime, plain then the plan at each
   concurrency, so the two are interleaved; the measured speedup at a concurrency is the median over
   the rounds of each round's plan / plain decode tokens/s;
4. prints, per concurrency, explain's predicted speedup against bench's measured one and the error
   (predicted / measured − 1; the goal: within 15 %), tune's own confirming measurement beside them,
   and the CPU.

    OMP_NUM_THREADS=1 python tools/bench_story.py --budget-min 4 --rounds 3 --out docs/results/data/bench_story.json
    OMP_NUM_THREADS=1 python tools/bench_story.py --plan /tmp/t1/tuned.yaml   # explain + bench only

Writes the whole record as JSON with ``--out FILE`` (under ``docs/results/`` it refreshes
``docs/results/story.md``). Run it on a quiet machine: every figure is a
timing.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def specc(*argv: str) -> str:
    """Run ``python -m specc.cli ARGV`` from the repository root; its stdout. Exits on failure."""
    cmd = [sys.executable, "-m", "specc.cli", *argv]
    print("$ specc " + " ".join(argv), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(f"  ({time.perf_counter() - t0:.0f} s, exit {proc.returncode})", file=sys.stderr, flush=True)
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"specc {argv[0]} failed (exit {proc.returncode})")
    return proc.stdout


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return ""
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="specc/data/prompts.jsonl")
    ap.add_argument("--plan", default=None, help="an existing tune output (its .yaml): skip step 1")
    ap.add_argument("--dir", default=None, help="folder for tune's files (default: a new one under /tmp)")
    ap.add_argument("--budget-min", type=float, default=4.0)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=3, help="bench calls (each: plain and the plan, interleaved)")
    ap.add_argument("--requests-per-slot", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=24, help="prompts bench cycles through")
    ap.add_argument("--out", default=None, help="write the record as JSON here")
    args = ap.parse_args()
    from specc.device import cpu_name

    conc = [int(c) for c in args.concurrency.split(",")]
    t_start = time.perf_counter()
    if args.plan:
        plan = Path(args.plan).resolve()
        tune_s = None
    else:
        folder = Path(args.dir or f"/tmp/bench_story-{os.getpid()}")
        folder.mkdir(parents=True, exist_ok=True)
        plan = (folder / "tuned.yaml").resolve()
        t0 = time.perf_counter()
        specc("tune", args.prompts, "--budget-min", str(args.budget_min), "--concurrency", args.concurrency,
              "--out", str(plan), "--no-progress")
        tune_s = time.perf_counter() - t0
    explained = json.loads(specc("explain", str(plan), "--format", "json"))
    story = explained.get("plan_at_concurrency") or {}
    predicted = {int(r["concurrency"]): r for r in story.get("rows") or []}
    rounds = []
    for _ in range(max(1, args.rounds)):
        out = specc("bench", str(plan), "--concurrency", args.concurrency, "--json", "--limit", str(args.limit),
                    "--requests-per-slot", str(args.requests_per_slot), "--max-new-tokens", str(args.max_new_tokens))
        rounds.append(json.loads(out.strip().splitlines()[-1])["results"])
    rows = []
    for c in conc:
        per = [r for rs in rounds for r in rs if r["concurrency"] == c]
        measured = statistics.median(r["speedup"] for r in per)
        p = predicted.get(c)
        rows.append({"concurrency": c, "measured_speedup": measured,
                     "measured_rounds": [r["speedup"] for r in per],
                     "plain_decode_tok_s": statistics.median(r["plain_decode_tok_s"] for r in per),
                     "decode_tok_s": statistics.median(r["decode_tok_s"] for r in per),
                     "exact": all(r["exact"] == r["n"] for r in per),
                     "predicted_speedup": p["speedup"] if p else None,
                     "predicted_tok_s": p["tok_s"] if p else None, "predicted_plain_tok_s": p["plain_tok_s"] if p else None,
                     "error": (p["speedup"] / measured - 1.0) if p and measured else None,
                     "tune_measured_speedup": p.get("measured_speedup") if p else None})
    record = {"command": "python tools/bench_story.py " + " ".join(sys.argv[1:]), "plan": str(plan),
              "cpu": cpu_name(), "lscpu": lscpu_model(), "threads": os.environ.get("OMP_NUM_THREADS", ""),
              "env": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")},
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "date": time.strftime("%Y-%m-%d"), "tune_seconds": tune_s, "seconds": time.perf_counter() - t_start,
              "cost_table": story.get("cost_table"), "acceptance": story.get("acceptance_path"),
              "tuned": story.get("tuned"), "explain_unknown": story.get("unknown"), "rows": rows}
    print(f"CPU: {record['cpu']} (lscpu: {record['lscpu']}), OMP_NUM_THREADS={record['threads'] or 'unset'}")
    print(f"plan {plan}: cost table {record['cost_table']}, acceptance {record['acceptance']}")
    if record["explain_unknown"]:
        print(f"explain predicts nothing: {record['explain_unknown']}")
    print(f"{'C':>3s} {'explain predicted':>17s} {'bench measured':>14s} {'error':>7s}  {'rounds':<24s} "
          f"{'tune measured':>13s}  plain / plan decode tok/s (median)")
    for r in rows:
        pred = f"{r['predicted_speedup']:.3f}x" if r["predicted_speedup"] else "-"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        tune_m = f"{r['tune_measured_speedup']:.3f}x" if r["tune_measured_speedup"] else "-"
        print(f"{r['concurrency']:3d} {pred:>17s} {r['measured_speedup']:13.3f}x {err:>7s}  "
              f"{', '.join(f'{x:.3f}' for x in r['measured_rounds']):<24s} {tune_m:>13s}  "
              f"{r['plain_decode_tok_s']:.1f} / {r['decode_tok_s']:.1f}" + ("" if r["exact"] else "  NOT EXACT"))
    ok = all(r["error"] is not None and abs(r["error"]) <= 0.15 for r in rows)
    print(f"goal (|error| <= 15% at every concurrency): {'met' if ok else 'NOT met'}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
