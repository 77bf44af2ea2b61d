#!/usr/bin/env python
"""Regenerate the shipped drafters' acceptance records: one command after a drafter is retrained.

For every drafter configuration ``specc tune`` would measure (each shipped ``specc`` preset that
drafts, merged by proposals: :func:`specc.tune.candidates.discover`), decode the shipped prompts
(``specc/data/prompts.jsonl``, held out from every training stage) greedily with the runtime at the
candidate's κ — the target at the dtype and kernel variant the runtime loads for it
(:class:`specc.tune.measure.Models`: on a CPU the GGUF's own codes, so the records follow the CPU's
int8 kernels; the records written before that default say ``"dtype": "float32"``) — and write
acceptance per draft position, τ and their 95 % intervals into the drafter's
record (``<drafter dir>/acceptance.json``, or ``specc/data/acceptance/<name>.json`` for a drafter
built at install and for methods without a drafter checkpoint; :func:`specc.predict.acceptance.record_path`).
Other entries of a record file are kept. ``specc explain`` and ``specc compile`` read these records,
so afterwards recompile the shipped artifacts (``generated/README.md``) and run
``tests/compiler/test_generated_drift.py``.

    OMP_NUM_THREADS=1 python tools/acceptance_records.py                       # every drafter
    OMP_NUM_THREADS=1 python tools/acceptance_records.py smollm2_135m_eagle3   # one drafter (all its presets)
    OMP_NUM_THREADS=1 python tools/acceptance_records.py smollm2_eagle3_tree   # one preset
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("only", nargs="*", metavar="NAME",
                    help="preset names (smollm2_eagle3) or drafter directory names (smollm2_135m_eagle3); default all")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8, help="requests decoded together (acceptance does not depend on it)")
    ap.add_argument("--limit", type=int, default=None, help="shipped prompts used (default all, round-robin over categories)")
    ap.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    args = ap.parse_args(argv)

    from specc.predict import acceptance
    from specc.runtime.prompts import read_prompts, select, shipped_prompts_path
    from specc.tune.candidates import discover
    from specc.tune.measure import Models, encode, measure

    cands, _ = discover()
    if args.only:
        def wanted(c):
            names = {c.name, *c.also}
            draft = Path(str(c.plan.draft.path)).name if c.plan.draft is not None and c.plan.draft.path else c.method
            return bool(names & set(args.only)) or draft in args.only
        unknown = [n for n in args.only if not any(n in {c.name, *c.also} or
                   (c.plan.draft is not None and c.plan.draft.path and Path(str(c.plan.draft.path)).name == n)
                   or c.method == n for c in cands)]
        if unknown:
            print(f"acceptance_records: unknown preset or drafter {unknown}; known: "
                  f"{sorted({c.name for c in cands})}", file=sys.stderr)
            return 2
        cands = [c for c in cands if wanted(c)]
    records = select(read_prompts(shipped_prompts_path()), args.limit)
    models = Models(dict(path=cands[0].plan.target.path, format=cands[0].plan.target.format), max_model_len=512)
    ids = encode(records, models.tokenizer)
    command = "python tools/acceptance_records.py" + (" " + " ".join(args.only) if args.only else "")
    print(f"{len(cands)} drafter configuration(s), {len(records)} shipped prompts, {args.max_new_tokens} new tokens, "
          f"batch {args.batch_size}", flush=True)
    t0 = time.perf_counter()
    for c in cands:
        m = measure(models, c, ids, records, str(shipped_prompts_path()), sample=records, batch_size=args.batch_size,
                    max_new_tokens=args.max_new_tokens, seconds=1e9, tolerance=0.0, min_requests=len(ids),
                    command=command)
        e = m.entry
        path = acceptance.record_path(c.plan)
        rates = ", ".join(f"{r:.3f}" for r in e.rates)
        print(f"[{time.perf_counter() - t0:6.0f}s] {c.name:22s} {c.shape:8s} κ={e.num_steps} τ={e.tau:.3f} "
              f"[{e.tau_ci95[0]:.3f}, {e.tau_ci95[1]:.3f}] per position [{rates}] ({m.requests} requests, "
              f"{m.seconds:.0f}s) -> {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
        if not args.dry_run:
            acceptance.write_record(path, [e])
    if not args.dry_run:
        print("records written; recompile the shipped artifacts (generated/README.md) and run "
              "tests/compiler/test_generated_drift.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
