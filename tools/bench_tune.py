#!/usr/bin/env python
"""Does `specc tune` pick well, fast? Run it, then run every candidate side by side and compare.

1. ``specc tune PROMPTS`` in a fresh process, timed against its budget (``--budget-min``).
2. The exhaustive side-by-side run: at each concurrency, plain decoding, every shipped drafter at
   every κ in ``--kappas`` that it covers (a tree at its own shape), and the plan tune emitted, through
   the runtime's concurrency benchmark (:func:`specc.tune.confirm.side_by_side`: the same requests for
   all, continuous batching, each configuration once per round, rounds in alternating order, best
   round kept; every greedy output compared with plain decoding's).
3. Per concurrency: the tuned plan's decode tokens/s against the best configuration's (best rounds);
   the goal is ≥ 0.95×. Beside it, plain decoding's range over the rounds (how far identical work
   moves on this machine) and the median over rounds of the same-round ratio (each round runs every
   configuration, so slow drifts of the machine's load fall on both).

    OMP_NUM_THREADS=1 python tools/bench_tune.py --kappas 2 4 --rounds 5 --high-from 16 --high-kappas 2 \
        --requests 1:8 4:16 16:32 64:64 --out docs/results/data/bench_tune.json
    python tools/render_results.py    # refresh docs/results/tune.md from the record

(``--requests``: runs of several seconds at every concurrency, so that identical work measures within
a few per cent on a shared machine; ``--high-from``: only κ = 2 beside plain and the trees from C = 16,
where wider verifies measured slower in every earlier run.)

Prints the table (Markdown, for the README) and writes the JSON (every configuration at every
concurrency, tune's wall time, the CPU).
"""
from __future__ import annotations

import argparse
import json
import runpy
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def spread(values) -> str:
    """``min–max`` of a configuration's per-round throughputs (tokens/s)."""
    return f"{min(values):.1f}–{max(values):.1f}" if values else "-"


def paired_ratio(tuned, best):
    """Median over rounds of the tuned plan's throughput over the best configuration's in the same
    round (both lists in round order; rounds interleave every configuration, so a round's load falls
    on both). None when a round is missing."""
    import statistics

    if not tuned or len(tuned) != len(best):
        return None
    return statistics.median(t / b for t, b in zip(tuned, best))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=None, help="prompts file (default: the shipped set)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--budget-min", type=float, default=10.0, help="tune's budget")
    ap.add_argument("--kappas", type=int, nargs="+", default=[1, 2, 4], help="κ of every drafter run side by side")
    ap.add_argument("--high-from", type=int, default=None,
                    help="from this concurrency up, run only --high-kappas (bounds the run where wide verifies are slow)")
    ap.add_argument("--high-kappas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--per-slot", type=int, default=1, help="requests per concurrency slot")
    ap.add_argument("--minimum", type=int, default=4, help="requests per run at least")
    ap.add_argument("--requests", nargs="+", default=[], metavar="C:N",
                    help="requests per run at concurrency C (in place of --per-slot/--minimum there): long enough "
                         "runs that noise on a shared machine stays under the 5%% the goal allows, e.g. 1:8 4:16 16:32")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per concurrency (best kept)")
    ap.add_argument("--tuned", default="/tmp/specc_bench_tune/tuned.yaml", help="where tune writes its plan")
    ap.add_argument("--skip-tune", action="store_true", help="reuse the plan at --tuned (and its JSON) instead")
    ap.add_argument("--drafters", nargs="+", default=None, metavar="PRESET",
                    help="run only these candidates (preset names) beside plain and the tuned plan; the left-out "
                         "candidates are named in the output (default: every candidate)")
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args(argv)

    requests = {}
    for item in args.requests:
        c, sep, n = item.partition(":")
        if not sep or not c.isdigit() or not n.isdigit() or int(n) < 1 or int(c) < 1:
            ap.error(f"--requests {item}: expected C:N with positive integers, e.g. 4:16")
        if int(c) not in args.concurrency:
            ap.error(f"--requests {item}: {c} is not one of --concurrency {' '.join(map(str, args.concurrency))}")
        requests[int(c)] = int(n)

    from specc.runtime.prompts import read_prompts, shipped_prompts_path

    prompts = args.prompts or str(shipped_prompts_path())
    tuned = Path(args.tuned)
    tuned.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.skip_tune:
        cmd = [sys.executable, "-m", "specc.cli", "tune", prompts, "--out", str(tuned), "--budget-min",
               str(args.budget_min), "--concurrency", ",".join(map(str, args.concurrency)), "--no-progress"]
        print("$ " + " ".join(cmd[1:]), flush=True)
        res = subprocess.run(cmd, cwd=ROOT)
        if res.returncode != 0:
            print(f"specc tune failed (exit {res.returncode})", file=sys.stderr)
            return 1
    tune_s = time.perf_counter() - t0 if not args.skip_tune else json.loads(tuned.with_suffix(".json").read_text())["seconds"]
    tune_data = json.loads(tuned.with_suffix(".json").read_text())
    budget = tune_data.get("budget_min", args.budget_min)
    print(f"specc tune took {tune_s / 60:.1f} min (budget {budget:g} min)", flush=True)

    from specc.plan.load import load_plan
    from specc.check import resolve
    from specc.tune.candidates import discover, identity
    from specc.tune.confirm import Entry, side_by_side
    from specc.tune.measure import Models, encode
    from specc.tune.session import plain_plan, sample_records

    cands, _ = discover()
    plan = resolve(load_plan(str(tuned)).plan, "specc")[0]
    win = next((c for c in cands if identity(c.plan) == identity(plan)), None)
    if win is None:
        print(f"{tuned}: its drafter is none of the shipped candidates", file=sys.stderr)
        return 1
    base = cands[0].plan
    from specc.compiler.build import plan_ir
    from specc.runtime.loader import table_choice

    # the target at the dtype and kernels the tuned plan runs under (its cost table's choice), as tune measured
    models = Models({"path": base.target.path, "format": base.target.format}, max_model_len=base.target.max_model_len,
                    choice=table_choice(plan_ir(plan).runtime.to_dict()))
    print(f"target: {models.why}", flush=True)
    sample = sample_records(read_prompts(prompts))
    ids = encode(sample, models.tokenizer)
    models.max_model_len = max(len(p) for p in ids) + args.max_new_tokens + 8
    entries = [Entry("plain", None, lambda c: plain_plan(base, [c])),
               Entry(f"tuned ({win.name})", win, lambda c: plan)]
    if args.drafters:
        unknown = sorted(set(args.drafters) - {c.name for c in cands})
        if unknown:
            print(f"--drafters {' '.join(unknown)}: not a candidate (candidates: {', '.join(c.name for c in cands)})",
                  file=sys.stderr)
            return 2
        left = [c.name for c in cands if c.name not in args.drafters]
        print(f"exhaustive run restricted by --drafters; left out: {', '.join(left) or 'none'}", flush=True)
    for c in cands:
        if args.drafters and c.name not in args.drafters:
            continue
        ks = c.kappas if c.shape == "tree" else [k for k in c.kappas if k in args.kappas]
        for k in ks:
            entries.append(Entry(f"{c.name} κ={k}", c, (lambda cc, c=c, k=k: c.variant(k, capture=[cc]))))
    sized = ", ".join(f"{n} at C={c}" for c, n in sorted(requests.items()))
    print(f"{len(entries)} configurations x concurrency {args.concurrency}, {args.rounds} round(s), "
          f"{args.max_new_tokens} new tokens, max({args.minimum}, {args.per_slot}·C) requests"
          + (f" ({sized}, at least C)" if sized else ""), flush=True)
    t1 = time.perf_counter()

    def progress(label, c, rnd):
        print(f"[{time.perf_counter() - t1:7.0f}s] C={c} round {rnd + 1}: {label}", flush=True)

    results, notes = {}, []
    for c in args.concurrency:
        here = entries
        if args.high_from is not None and c >= args.high_from:
            here = [e for e in entries if e.candidate is None or e.label.startswith("tuned") or e.candidate.shape == "tree"
                    or int(e.label.rsplit("=", 1)[1]) in args.high_kappas]
        per_slot, minimum = (1, requests[c]) if c in requests else (args.per_slot, args.minimum)
        res, nts = side_by_side(models, here, [c], ids, max_new_tokens=args.max_new_tokens, per_slot=per_slot,
                                minimum=minimum, rounds=args.rounds, on_run=progress)
        results.update(res)
        notes += nts
    bench_s = time.perf_counter() - t1
    from specc.device import cpu_name
    import torch

    rows, goals = [], []
    for c in args.concurrency:
        tuned_r = results[(entries[1].label, c)]
        best_label, best = max(((e.label, results[(e.label, c)]) for e in entries
                                if e.label != entries[1].label and (e.label, c) in results),
                               key=lambda kv: kv[1].decode_tok_s)
        ratio = tuned_r.decode_tok_s / best.decode_tok_s
        plain_r = results[("plain", c)]
        goals.append(ratio >= 0.95)
        k_used = ",".join(f"κ{k}:{n}" for k, n in sorted(tuned_r.kappa_steps.items()))
        paired = paired_ratio(tuned_r.round_tok_s, best.round_tok_s)
        rows.append([c, f"{plain_r.decode_tok_s:.1f} ({spread(plain_r.round_tok_s)})", f"{best_label}",
                     f"{best.decode_tok_s:.1f}", f"{tuned_r.decode_tok_s:.1f} ({k_used})", f"{ratio:.2f}",
                     "yes" if ratio >= 0.95 else "NO", f"{paired:.2f}" if paired is not None else "-"])
    print()
    print("| C | plain tok/s (rounds' range) | best configuration | its tok/s | tuned plan tok/s (steps per κ) "
          "| tuned / best | ≥ 0.95 | tuned / best, median of rounds |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    inexact = [(l, c) for (l, c), r in results.items() if r.exact is False]
    print(f"\ntune: {tune_s / 60:.1f} min (budget {budget:g}); plan {tune_data['choice']['candidate']} "
          f"buckets {tune_data['choice']['buckets']}; exhaustive run {bench_s / 60:.1f} min; "
          f"{sum(goals)}/{len(goals)} concurrencies at >= 0.95x the best; greedy outputs identical to plain: "
          + ("all" if not inexact else f"NOT {inexact}"))
    for n in notes:
        print(n)
    if args.out:
        data = {"cpu": cpu_name(), "torch_capability": torch.backends.cpu.get_cpu_capability(),
                "tune_seconds": tune_s, "budget_min": args.budget_min, "bench_seconds": bench_s,
                "target": {"dtype": models.dtype, "why": models.why},
                "tuned": {"plan": str(tuned), "choice": tune_data["choice"], "report": tune_data.get("runs")},
                "settings": vars(args),
                "results": {f"{l} @C={c}": {"decode_tok_s": r.decode_tok_s, "tau": r.tau, "mean_batch": r.mean_batch,
                                            "exact": r.exact, "kappa_steps": r.kappa_steps, "rounds": r.rounds,
                                            "round_tok_s": r.round_tok_s, "stage_ms_per_step": r.stage_ms_per_step}
                            for (l, c), r in results.items()},
                "left_out": [c.name for c in cands if args.drafters and c.name not in args.drafters],
                "table": rows, "goals_met": sum(goals), "goals": len(goals)}
        Path(args.out).write_text(json.dumps(data, indent=1, default=str) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    return 0 if all(goals) else 1


if __name__ == "__main__":
    sys.exit(main())
