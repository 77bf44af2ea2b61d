#!/usr/bin/env python
"""How well an EAGLE / EAGLE-3 head's training transfers to the shipped prompts, without the runtime.

The target answers shipped prompts greedily (the same self-distillation as ``tools/train_drafter.py
data``), then the head is run teacher-forced over each answer with the training-time unroll
(``ttt_forward``): per draft step k, the fraction of answer positions where the head's top-1 equals the
target's token (the quantity training maximises), per category; and, for EAGLE-3, the fraction of
the target's answer tokens inside the head's draft vocabulary (a token outside it can never be
drafted). With ``--data-file`` (the training command's list, in its order) the same agreement is
printed for the training run's validation split (every 20th record, as ``train``), for comparison.

Usage: ``OMP_NUM_THREADS=1 python tools/eagle_transfer.py --head specc/assets/drafters/smollm2_135m_eagle3
[--per-category 2] [--max-new 64] [--steps 4] [--data-file .cache/eagle_data/...pt ...]``
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _trainer():
    spec = importlib.util.spec_from_file_location("train_drafter", ROOT / "tools" / "train_drafter.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "tools"))
    spec.loader.exec_module(mod)
    return mod


def agreement(td, head, kind: str, records, steps: int):
    """Teacher-forced top-1 agreement per draft step over ``records`` (train_drafter's data records):
    ``(hits [steps], counts [steps])``, answer positions only."""
    hits, counts = [0] * steps, [0] * steps
    V = head.cfg.vocab_size
    with torch.inference_mode():
        for rec in records:
            tokens, labels, feats = td.collate([rec], [0], kind)
            sel, valid = td.loss_positions(labels)  # [1, A]
            outs = td.ttt_forward(head, tokens, feats, steps, sel=sel)
            T = labels.shape[1]
            for k, g in enumerate(outs):
                at = sel + k + 1
                lab = torch.gather(labels, 1, at.clamp(max=T - 1))
                ok = valid & (at < T) & (lab >= 0)
                pred = head.draft_to_target(head.draft_logits(g).argmax(-1)).clamp(max=V - 1)
                hits[k] += int(((pred == lab) & ok).sum())
                counts[k] += int(ok.sum())
    return hits, counts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", required=True, help="head directory (SafeAILab layout)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4, help="draft steps to unroll")
    ap.add_argument("--data-file", nargs="*", default=[], help="training data files: also score their validation split")
    args = ap.parse_args(argv)
    td = _trainer()
    from specc.models.eagle import default_aux_layer_ids
    from specc.models.eagle_loader import load_eagle_head
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path

    target, tok = td.load_target()
    config = json.loads((pathlib.Path(args.head) / "config.json").read_text())
    kind = "eagle3" if "draft_vocab_size" in config else "eagle"
    head = load_eagle_head(pathlib.Path(args.head), target.config, target.embed, target.lm_head, expect_kind=kind)
    head.eval()
    layers = (target.config.num_layers,) + default_aux_layer_ids(target.config.num_layers)
    seen, chosen = {}, []
    for r in read_prompts(shipped_prompts_path()):
        if seen.get(r.category, 0) < args.per_category:
            seen[r.category] = seen.get(r.category, 0) + 1
            chosen.append(r)
    eos = set(tok.eos_token_ids) | set(target.config.eos_token_ids)
    by_cat = {}
    for r in chosen:  # one at a time: no padding effects, and the categories stay separate
        rec = td.generate_batch(target, [encode_prompt(r, tok)], args.max_new, eos, layers)[0]
        by_cat.setdefault(r.category, []).append(rec)
    print(f"head {args.head} ({kind}); {len(chosen)} shipped prompts, {args.max_new} greedy tokens each")
    print("teacher-forced top-1 agreement per draft step (answer positions):")
    total_h, total_n = [0] * args.steps, [0] * args.steps
    for cat, recs in by_cat.items():
        h, n = agreement(td, head, kind, recs, args.steps)
        total_h = [a + b for a, b in zip(total_h, h)]
        total_n = [a + b for a, b in zip(total_n, n)]
        print(f"  {cat:15s} " + " ".join(f"{a / max(1, b):.3f}" for a, b in zip(h, n)))
    print(f"  {'shipped (all)':15s} " + " ".join(f"{a / max(1, b):.3f}" for a, b in zip(total_h, total_n)))
    if kind == "eagle3":
        inside = total = 0
        for recs in by_cat.values():
            for rec in recs:
                lab = rec["labels"][max(0, rec["prompt_len"] - 1):]
                inside += int(head.t2d[lab].sum())
                total += lab.numel()
        print(f"draft vocabulary ({head.cfg.draft_vocab_size} tokens) covers {inside / max(1, total):.3f} of the "
              f"target's answer tokens on these prompts")
    if args.data_file:
        records = td.load_data(args.data_file)["records"]
        records = records[::20][: max(4, len(records) // 20)]  # train_head's validation split
        h, n = agreement(td, head, kind, records, args.steps)
        print(f"  {'train val split':15s} " + " ".join(f"{a / max(1, b):.3f}" for a, b in zip(h, n))
              + f" ({len(records)} validation records)")


if __name__ == "__main__":
    main()
