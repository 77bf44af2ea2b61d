"""``specc train``: train a drafter for a target from text that installs offline.

Stages (each records the command that ran it; the shipped heads' ``TRAINING.md`` list them):

* ``corpora [DATA]``: fetch the data recipe's corpora with pip / apt-get into the cache.
* ``prompts DATA [--round 2]``: build the training prompts (round 1 and the teacher-forcing set;
  ``--round 2``: multi-turn follow-ups over the target's round-1 answers) into the recipe's
  ``prompt_dir`` (small gzipped JSONL files, committed for the shipped heads).
* ``distill DATA [--part round1|round2|teacher]``: the target answers the prompts (or is teacher-forced
  over the references); hidden states at the layers the recipe's kinds read and the target's argmax
  are written as resumable shards under ``CACHE/data/<name>/<part>/``.
* ``fit RECIPE``: train the drafter of a drafter recipe (``conf/train/<name>.yaml``) and write it
  in its published layout with ``TRAINING.md``, ``training.json`` and the curve.
* ``vocab RECIPE``: draft-vocabulary coverage and LM-head cost per size (EAGLE-3).
* ``render RECIPE``: rewrite ``TRAINING.md`` and the curve from ``training.json``.
* ``all RECIPE``: corpora, prompts (both rounds), distill (all parts) and fit, in order.

``--device cuda`` runs the target and the training on a GPU; ``--threads`` sets the CPU threads.
Every option that overrides a recipe field (``--time-budget-min``, ``--threads``, ``--gen-batch``,
``--max-prompts``) is checked like that field, with the same message, and ``--limit`` likewise, before
anything runs (``specc.train.recipe.check_overrides``); an option the stage does not read is refused.
Then every path the stage reads or writes and the distillation batch against this machine's memory
are checked, still before any model or data loads (``specc.train.preflight``).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys

STAGES = ("corpora", "prompts", "distill", "fit", "vocab", "render", "all")


def default_cache() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SPECC_TRAIN_CACHE") or pathlib.Path.home() / ".cache" / "specc" / "train")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n", 1)[1]
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("stage", choices=STAGES, help="pipeline stage (described above)")
    p.add_argument("recipe", nargs="?", default=None,
                   help="data recipe (corpora/prompts/distill) or drafter recipe (fit/vocab/render/all): "
                        "a name under conf/train/ or a .yaml path")
    p.add_argument("--cache-dir", default=None, help=f"corpora and data cache (default $SPECC_TRAIN_CACHE or ~/.cache/specc/train)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the target and training run")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: 1 for data, the recipe's for fit)")
    p.add_argument("--round", type=int, default=1, choices=[1, 2, 3],
                   help="prompts: round 1 (and teacher), round 2 (follow-ups over round-1 answers) or round 3 "
                        "(more round-1-style prompts, another seed)")
    p.add_argument("--part", default=None, choices=["round1", "round2", "round3", "teacher"],
                   help="distill: which prompt set (default: all three in order)")
    p.add_argument("--shard-of", default=None, metavar="K/N",
                   help="distill: do only prompts K, K+N, K+2N, ... (run N processes side by side)")
    p.add_argument("--limit", type=int, default=None, help="distill: only the first N prompts of the file (a quick run)")
    p.add_argument("--gen-batch", type=int, default=None,
                   help="distill: prompts per batch (default: the recipe's gen_batch / teacher_batch; larger on a GPU)")
    p.add_argument("--max-prompts", type=int, default=None,
                   help="distill: only the first N prompts of the seeded order (default: the recipe's max_prompts)")
    p.add_argument("--time-budget-min", type=float, default=None, help="distill: stop after this many minutes; "
                   "fit: override the recipe's budget")
    p.add_argument("--out", default=None, help="fit: write the drafter here instead of the recipe's `out`")
    p.add_argument("--init-from", default=None, help="fit: start from this checkpoint directory (same kind)")


def run(args) -> int:
    from specc.train.preflight import check_stage
    from specc.train.recipe import check_overrides

    check_overrides(args.stage, {"--time-budget-min": args.time_budget_min, "--threads": args.threads,
                                 "--gen-batch": args.gen_batch, "--max-prompts": args.max_prompts,
                                 "--limit": args.limit, "--part": args.part, "--shard-of": args.shard_of,
                                 "--init-from": args.init_from, "--out": args.out})
    cache = pathlib.Path(args.cache_dir) if args.cache_dir else default_cache()
    check_stage(args.stage, args.recipe, cache, args)
    from specc.train import pipeline

    return pipeline.run_stage(args.stage, args.recipe, cache, args)
