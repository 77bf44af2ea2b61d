#!/usr/bin/env python
"""Load-aware speculation on this CPU: throughput against concurrency for every schedule, side by side.

Continuous batching of the shipped prompts (cycled to ``--requests-per-slot`` × C requests, at most C
in flight) on SmolLM2-135M, at each concurrency C, for: plain decoding; each static κ in
``--kappas``; ``batch_buckets`` with one κ per bucket from ``schedule.kind: auto`` (the cost model
over the profiled table, at the α measured by the static κ = 4 run at C = 1); the shipped
``smollm2_adaptive`` preset (SGLang's controller) and ``smollm2_budget`` preset (survival budget); with
``--schedules ... auto``, also ``schedule.kind: auto`` itself (the adaptive controller over the
candidates the cost model derives at that α). The drafters (``--drafters``): the n-gram drafter (real
acceptance), suffix decoding (``smollm2_suffix``'s settings, a fresh drafter per run: its global tree
fills with the run's finished outputs; the prompts repeat once the run has more requests than the 60
prompts) and the synthetic rule at mean acceptance lengths ``--synthetic`` (acceptance by a curve,
whatever the tokens: isolates what acceptance buys).

Each concurrency runs every configuration once per round for ``--rounds`` rounds, interleaved, and
keeps each configuration's best round (load from other jobs then falls on all alike).

Per row: decode tokens/s (prefill excluded) and output tokens/s (all), speedup over plain at the
same C, the cost model's predicted decode speedup from the profiled table (with the run's own τ and
drafts per request: a check of the step-cost side), τ, time per output token p50/p99, and the κ
chosen (steps per κ); for suffix decoding also its host work per step (draft + extend stages) next to
the verify stage. Every greedy n-gram and suffix output is checked against plain decoding. Writes
JSON and a plot (throughput against concurrency, one panel per drafter) and prints whether the goals
hold: adaptive and budget ≥ 0.95× the best static κ at every C and ≥ 0.98× plain at the largest C;
the prediction within 15 % of the measured speedup for each static κ; suffix decoding under auto and
budget ≥ 0.98× plain at every C.

    OMP_NUM_THREADS=1 python tools/bench_concurrency.py --drafters suffix --schedules auto budget \
        --concurrency 16 64 --rounds 1 --max-new-tokens 32

    OMP_NUM_THREADS=1 python tools/bench_concurrency.py --concurrency 1 4 16 64 \\
        --out docs/results/data/bench_concurrency.json --plot docs/results/data/bench_concurrency.png
    python tools/render_results.py    # refresh docs/results/concurrency.md from the record
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TABLE = "pkg://specc/data/cost_tables/smollm2_135m_cpu.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--kappas", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--synthetic", type=float, nargs="*", default=[1.5, 2.5, 3.5])
    ap.add_argument("--drafters", nargs="+", default=None,
                    help="ngram, suffix and/or synL (synthetic, mean acceptance length L); default: ngram and "
                         "the --synthetic lengths")
    ap.add_argument("--schedules", nargs="+", default=["static", "batch_buckets", "adaptive", "budget"],
                    choices=["static", "batch_buckets", "adaptive", "budget", "auto"],
                    help="schedules run per drafter (plain decoding always runs)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=12)
    ap.add_argument("--max-requests", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all configurations per concurrency (best kept)")
    ap.add_argument("--cost-table", default=TABLE)
    ap.add_argument("--max-model-len", type=int, default=512,
                    help="cache slots per request (the shipped prompts take at most 298 tokens); the KV cache "
                         "is 64 rows of this many slots")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--plot", default=None, help="PNG: throughput against concurrency per schedule")
    args = ap.parse_args(argv)

    import torch

    from specc import methods
    from specc.predict import cost
    from specc.compiler import lower
    from specc.methods.suffix import drafter as suffix_drafter
    from specc.methods.ngram.drafter import NgramDrafter
    from specc.models import load_target
    from specc.plan.load import load_plan
    from specc.plan.schema import BucketConfig, MethodConfig, ScheduleConfig, SyntheticConfig, VerifyConfig
    from specc.check import resolve
    from specc.runtime.benchmark import predicted_decode_tok_s, run_concurrency
    from specc.compiler.build import plan_runtime
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams

    table = cost.load_cost_table(args.cost_table)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    adaptive_preset = load_plan("smollm2_adaptive").plan
    budget_preset = load_plan("smollm2_budget").plan
    base_plan = load_plan("smollm2_ngram").plan
    base_plan = dataclasses.replace(base_plan, runtime=dataclasses.replace(base_plan.runtime, max_batch_size=max(sizes)),
                                    schedule=ScheduleConfig(capture_batch_sizes=sizes))
    suffix_plan = load_plan("smollm2_suffix").plan
    suffix_plan = dataclasses.replace(suffix_plan, runtime=dataclasses.replace(suffix_plan.runtime,
                                                                               max_batch_size=max(sizes)))
    suffix_spec = {"method": {"suffix": dataclasses.asdict(suffix_plan.method.suffix)}}
    target, tok = load_target(base_plan.target.path, base_plan.target.format, max_model_len=args.max_model_len + 8)
    records = read_prompts(shipped_prompts_path())
    encoded = [encode_prompt(r, tok) for r in records]
    window = (base_plan.method.ngram.min, base_plan.method.ngram.max)

    def requests(c):
        n = min(args.max_requests, max(args.min_requests, args.requests_per_slot * c))
        return [Request(prompt_ids=encoded[i % len(encoded)], request_id=f"r{i}",
                        params=SamplingParams(max_new_tokens=args.max_new_tokens)) for i in range(n)]

    def plan_for(drafter, schedule, k=4):
        verify = VerifyConfig() if drafter in ("ngram", "suffix") else VerifyConfig(
            rule="synthetic", synthetic=SyntheticConfig(acceptance_length=float(drafter[3:])))
        base = suffix_plan if drafter == "suffix" else base_plan
        p = dataclasses.replace(base, method=dataclasses.replace(base.method, num_steps=k), verify=verify,
                                schedule=dataclasses.replace(schedule, capture_batch_sizes=sizes))
        return resolve(p, "specc")[0]

    def run(plan, c, with_drafter=True):
        drafter = None
        if with_drafter:
            drafter = suffix_drafter.build_drafter(suffix_spec) if plan.method.name == "suffix" else NgramDrafter(*window)
        rt = plan_runtime(plan, target, tok, drafter, cost_table=None if plan.schedule.kind != "budget" else
                          _table_dict(table), max_model_len=args.max_model_len)
        return run_concurrency(rt, requests(c), c)

    t_start = time.perf_counter()
    none_plan = dataclasses.replace(base_plan, method=MethodConfig(name="none", num_steps=0))
    drafters = args.drafters or (["ngram"] + [f"syn{L:g}" for L in args.synthetic])
    configs = [("plain", None, none_plan)]
    autos = {}
    for d in drafters:
        # batch_buckets from auto: the cost model's best κ per captured size, at α measured by a static
        # κ = 4 pilot run at the smallest concurrency (n-gram, suffix) or given by the synthetic curve
        if d in ("ngram", "suffix"):
            pilot = run(plan_for(d, ScheduleConfig(kind="static"), 4), min(args.concurrency))
            alpha = cost.alpha_for_expected_tokens(min(max(pilot.tau, 1.0), 5.0), 4)
        else:
            from specc.predict.sizing import plan_alpha

            alpha = plan_alpha(plan_for(d, ScheduleConfig(kind="static"), 4))[0]
        probe = plan_for(d, ScheduleConfig(kind="auto", cost_table=args.cost_table, alpha=alpha))
        auto, _ = lower.derive_auto_buckets(probe, sizes, alpha, cost.batch_model_from_table(table), spread=0.0)
        autos[d] = {"alpha": alpha, "buckets": {k: list(v) for k, v in auto.items()}}
        top_k = (suffix_plan.method.num_steps or 8) if d == "suffix" else 4  # κ of the load-aware schedules' states
        if "static" in args.schedules:
            for k in args.kappas:
                configs.append((f"static k={k}", d, plan_for(d, ScheduleConfig(kind="static"), k)))
        if "batch_buckets" in args.schedules:
            bb = ScheduleConfig(kind="batch_buckets", buckets={k: BucketConfig([v[0]]) for k, v in auto.items()})
            configs.append(("batch_buckets (auto)", d, plan_for(d, bb, max(max(v) for v in auto.values()) or 1)))
        if "auto" in args.schedules:
            configs.append(("auto", d, plan_for(d, ScheduleConfig(kind="auto", cost_table=args.cost_table, alpha=alpha),
                                                top_k)))
        for name, preset in (("adaptive", adaptive_preset), ("budget", budget_preset)):
            if name in args.schedules:
                k = top_k if d == "suffix" and name == "budget" else preset.method.num_steps or 4
                configs.append((name, d, plan_for(d, dataclasses.replace(preset.schedule), k)))
        print(f"[{time.perf_counter() - t_start:6.0f}s] {d}: auto α={alpha:.3f} buckets {auto}", flush=True)
    # every configuration at a concurrency runs once per round, round after round (order reversed on
    # odd rounds), and the best round is kept: load from other jobs on this shared machine falls on
    # all configurations alike instead of on whichever ran during a busy minute
    results = {d: {"_auto": autos[d]} for d in drafters}
    plain = {}
    for c in args.concurrency:
        best = {}
        for rnd in range(args.rounds):
            order = configs if rnd % 2 == 0 else configs[::-1]
            for name, d, plan in order:
                res = run(plan, c, with_drafter=d is not None)
                key = (name, d)
                if key not in best or res.decode_tok_s > best[key].decode_tok_s:
                    best[key] = res
            print(f"[{time.perf_counter() - t_start:6.0f}s] C={c} round {rnd + 1}/{args.rounds}: plain "
                  f"{best[('plain', None)].decode_tok_s:.1f} tok/s", flush=True)
        plain[c] = best[("plain", None)]
        for (name, d), res in best.items():
            if d is not None:
                results[d].setdefault(name, {})[c] = res
        if args.out:  # keep what is measured so far
            done = [x for x in args.concurrency if x in plain]
            part = _report(_Args(args, done), results, plain, table, methods)
            Path(args.out + ".partial").write_text(json.dumps(part["json"], indent=1, default=str) + "\n")

    report = _report(args, results, plain, table, methods)
    print(report["text"])
    if args.out:
        Path(args.out).write_text(json.dumps(report["json"], indent=1, default=str) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    if args.plot:
        _plot(args.plot, results, plain, args.concurrency)
    return 0


class _Args:
    """``args`` with only the concurrencies measured so far (for the partial report)."""

    def __init__(self, args, concurrency):
        self.__dict__.update(vars(args))
        self.concurrency = concurrency


def _table_dict(t):
    return {"device": t.device, "capture_limit": t.capture_limit,
            "verify_ms": {str(x): y for x, y in zip(t.verify_x, t.verify_ms)},
            "draft_ms": {str(x): y for x, y in zip(t.draft_x, t.draft_ms)}}


def _report(args, results, plain, table, methods):
    from specc.runtime.benchmark import predicted_decode_tok_s

    cs = args.concurrency
    lines = []
    data = {"concurrency": cs, "max_new_tokens": args.max_new_tokens, "plain": {}, "drafters": {}}
    for c in cs:
        data["plain"][c] = _row(plain[c], None, None)
    goals = []
    for d, rows in results.items():
        data["drafters"][d] = {"auto": rows.get("_auto")}
        lines.append(f"\n== {d} ==  (per C: decode tok/s | speedup over plain | predicted | tau | TPOT p50/p99 ms | kappa steps)")
        lines.append(f"{'schedule':22s}" + "".join(f"{'C=' + str(c):>58s}" for c in cs))
        lines.append(f"{'plain':22s}" + "".join(f"{plain[c].decode_tok_s:8.1f} {'1.00x':>7s} {'':>7s} {1.0:5.2f} "
                                                 f"{plain[c].tpot_ms_p50:7.1f}/{plain[c].tpot_ms_p99:<7.1f} {'k0':>10s}"
                                                 for c in cs))
        for name, per in rows.items():
            if name.startswith("_"):
                continue
            cells = ""
            data["drafters"][d][name] = {}
            for c in cs:
                r = per[c]
                sp = r.decode_tok_s / plain[c].decode_tok_s
                drafting = any(k > 0 for k in r.kappa_steps)
                pred = predicted_decode_tok_s(r, table, 1 if drafting else 0) / predicted_decode_tok_s(plain[c], table, 0)
                exact = None
                if d in ("ngram", "suffix"):
                    exact = sum(a == b for a, b in zip(plain[c].outputs, r.outputs)) / len(r.outputs)
                data["drafters"][d][name][c] = _row(r, sp, pred, exact)
                ks = ",".join(f"{k}:{v}" for k, v in sorted(r.kappa_steps.items()))
                cells += (f"{r.decode_tok_s:8.1f} {sp:6.2f}x {pred:6.2f}x {r.tau:5.2f} "
                          f"{r.tpot_ms_p50:7.1f}/{r.tpot_ms_p99:<7.1f} {ks:>10s}")
            lines.append(f"{name:22s}{cells}")
        if d == "suffix":
            for n, per in rows.items():
                if n.startswith("_"):
                    continue
                lines.append(f"  {n}: host (draft + extend) ms/step vs verify ms/step: " + ", ".join(
                    f"C={c} {_host_ms(per[c]):.2f} vs {per[c].stage_ms_per_step.get('verify', 0.0):.1f}" for c in cs))
                if n in ("auto", "budget"):
                    for c in cs:
                        goals.append((d, c, f"{n} / plain", per[c].decode_tok_s / plain[c].decode_tok_s, 0.98))
        static = {n: p for n, p in rows.items() if n.startswith("static")}
        for c in cs:
            if not static:
                continue
            best_name, best = max(((n, p[c].decode_tok_s) for n, p in static.items()), key=lambda x: x[1])
            for n in ("adaptive", "budget"):
                if n not in rows:
                    continue
                v = rows[n][c].decode_tok_s
                goals.append((d, c, f"{n} / best static ({best_name})", v / best, 0.95))
            if c == max(cs) and d != "suffix":
                for n in ("adaptive", "budget"):
                    if n in rows:
                        goals.append((d, c, f"{n} / plain", rows[n][c].decode_tok_s / plain[c].decode_tok_s, 0.98))
        for n, per in static.items():
            for c in cs:
                r = per[c]
                meas = r.decode_tok_s / plain[c].decode_tok_s
                pred = predicted_decode_tok_s(r, table, 1) / predicted_decode_tok_s(plain[c], table, 0)
                goals.append((d, c, f"{n} prediction error", abs(pred - meas) / meas, -0.15))
    lines.append("\n== goals ==")
    met = 0
    for d, c, what, v, bound in goals:
        ok = v >= bound if bound > 0 else v <= -bound
        met += ok
        lines.append(f"{'ok  ' if ok else 'MISS'} {d:7s} C={c:<3d} {what}: {v:.3f} (goal {'>=' if bound > 0 else '<='} {abs(bound)})")
    lines.append(f"{met}/{len(goals)} goals met")
    for d in ("ngram", "suffix"):
        if d not in results:
            continue
        inexact = [(n, c, v["exact"]) for n, per in data["drafters"][d].items() if isinstance(per, dict)
                   for c, v in per.items() if isinstance(v, dict) and v.get("exact") not in (None, 1.0)]
        lines.append(f"{d} greedy outputs identical to plain decoding: " + ("all" if not inexact else f"NOT {inexact}"))
    data["goals"] = [{"drafter": d, "concurrency": c, "what": w, "value": v, "goal": b} for d, c, w, v, b in goals]
    return {"text": "\n".join(lines), "json": data}


def _host_ms(r):
    """The drafter's host work per decode step (draft + extend stages), milliseconds."""
    return r.stage_ms_per_step.get("draft", 0.0) + r.stage_ms_per_step.get("extend", 0.0)


def _row(r, speedup, predicted, exact=None):
    return {"decode_tok_s": r.decode_tok_s, "output_tok_s": r.output_tok_s, "speedup": speedup,
            "predicted_speedup": predicted, "tau": r.tau, "tpot_ms_p50": r.tpot_ms_p50, "tpot_ms_p99": r.tpot_ms_p99,
            "ttft_ms_p50": r.ttft_ms_p50, "ttft_ms_p99": r.ttft_ms_p99, "mean_batch": r.mean_batch,
            "drafts_per_req": r.drafts_per_req, "kappa_steps": r.kappa_steps, "kappa_switches": r.kappa_switches,
            "kappa_trace": r.kappa_trace, "requests": r.num_requests, "output_tokens": r.output_tokens,
            "exact": exact, "stage_ms_per_step": r.stage_ms_per_step}


def _plot(path, results, plain, cs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4.2), squeeze=False)
    for ax, (d, rows) in zip(axes[0], results.items()):
        ax.plot(cs, [plain[c].decode_tok_s for c in cs], "k--o", label="plain")
        for name, per in rows.items():
            if name.startswith("_"):
                continue
            style = "-o" if name in ("adaptive", "budget", "batch_buckets (auto)") else ":"
            ax.plot(cs, [per[c].decode_tok_s for c in cs], style, label=name, lw=2 if style == "-o" else 1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs)
        ax.set_xticklabels([str(c) for c in cs])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(d if d in ("ngram", "suffix") else f"synthetic, mean acceptance length {d[3:]}")
        ax.legend(fontsize=7)
    fig.suptitle("SmolLM2-135M on this CPU: throughput by schedule (tools/bench_concurrency.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
