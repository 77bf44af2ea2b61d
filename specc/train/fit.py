"""The training loop shared by every drafter kind, and the draft-vocabulary report.

:func:`fit` reads a drafter recipe, loads the distillation shards its ``parts`` name (only the target
layers its kind reads, the last ``prompt_context`` prompt positions of each sequence), holds out every
``val_every``-th sequence for validation, builds the model with the kind's adapter and trains it with
AdamW (linear warm-up, cosine decay to ``min_lr_ratio``; progress is the larger of the step and the
time-budget fractions, so a run cut by the budget still ends at the low learning rate), seeded.
After each epoch it scores top-1 agreement with the target per draft step on the validation split
(overall, per category, per data kind). It writes the checkpoint in the kind's published layout
and ``training.json``; :mod:`specc.train.card` renders ``TRAINING.md`` and the curve from it.
"""
from __future__ import annotations

import json
import math
import pathlib
import random
import time
from typing import Dict, List

import torch

from specc.errors import SpeccError
from specc.train import data as D
from specc.train import kinds as K
from specc.train import recipe as R


def _data_files(fit: R.FitRecipe, data: R.DataRecipe, cache) -> List[pathlib.Path]:
    from specc.train.pipeline import data_dir

    files = []
    for part in fit.parts:
        got = D.shard_paths(data_dir(data, cache, part))
        if fit.max_shards.get(part) is not None:  # the first N shards of each writer (tag), an experiment's subset
            per_tag: Dict[str, int] = {}
            keep = []
            for p in got:
                tag = p.name.rsplit("-", 1)[0]
                per_tag[tag] = per_tag.get(tag, 0) + 1
                if per_tag[tag] <= int(fit.max_shards[part]):
                    keep.append(p)
            got = keep
        if not got:
            raise SpeccError(f"no {part} data for {data.name} in {data_dir(data, cache, part)}; run "
                             f"`specc train distill {data.name} --part {part}` first")
        files += got
    return files


def split(data: D.SeqSet, every: int):
    """Validation = every ``every``-th sequence, training = the rest (index lists)."""
    val = [i for i in range(len(data)) if i % every == 0]
    train = [i for i in range(len(data)) if i % every != 0]
    return train, val


def evaluate(kind, model, data: D.SeqSet, idx: List[int], options: dict, batch: int, device) -> dict:
    """Top-1 agreement per draft step over sequences ``idx`` (no noise, no grad): ``{"all": [a_k],
    "by_category": {c: [a_k]}, "by_kind": {k: [a_k]}, "positions": n}``."""
    steps = kind.unroll_steps(options)
    groups: Dict[str, list] = {}

    def add(key, h, c):
        g = groups.setdefault(key, [[0] * steps, [0] * steps])
        for k in range(steps):
            g[0][k] += h[k]
            g[1][k] += c[k]

    model.eval()
    with torch.no_grad():
        for s in range(0, len(idx), batch):
            for i in idx[s: s + batch]:  # one sequence at a time: per-category tallies, no padding effects
                b = kind.collate(model, data, [i], options, device)
                _, h, c = kind.loss(model, b, options, train=False)
                add("all", h, c)
                add("cat:" + data.meta[i]["category"], h, c)
                add("kind:" + data.meta[i]["kind"], h, c)
    model.train()

    def rate(g):
        return [round(g[0][k] / max(1, g[1][k]), 4) for k in range(steps)]
    return {"all": rate(groups["all"]), "positions": groups["all"][1][0],
            "by_category": {k[4:]: rate(v) for k, v in sorted(groups.items()) if k.startswith("cat:")},
            "by_kind": {k[5:]: rate(v) for k, v in sorted(groups.items()) if k.startswith("kind:")}}


def fit(fit: R.FitRecipe, cache, args, target=None, data_recipe: R.DataRecipe = None) -> pathlib.Path:
    """Train the drafter of ``fit`` and write it (see the module docstring). Returns its directory.

    ``target`` / ``data_recipe`` (tests) replace the target loaded from, and the data recipe named
    by, the recipe. Raises ``SpeccError`` when the data are missing or CUDA is asked for and absent."""
    from specc.commands.train import command_line
    from specc.models import load_target
    from specc.train import card
    from specc.train.pipeline import _out_dir

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpeccError("--device cuda: no CUDA device is available (use --device cpu)")
    threads = int(getattr(args, "threads", None) or fit.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(fit.seed)
    rng = random.Random(fit.seed)
    data_recipe = data_recipe or R.load_data_recipe(fit.data)
    kind = K.get(fit.kind)
    options = fit.options
    if target is None:
        target, _ = load_target(data_recipe.target, data_recipe.target_format, device=str(device))
    layers = kind.layers(target.config, options)
    t_load = time.time()
    files = _data_files(fit, data_recipe, cache)
    data = D.load(files, layers, context=fit.prompt_context)
    train_idx, val_idx = split(data, fit.val_every)
    print(f"[fit] {fit.name}: {len(data)} sequences ({len(train_idx)} train, {len(val_idx)} validation), "
          f"{int(data.offsets[-1])} positions, {data.answer_positions()} answer positions, layers {list(layers)} "
          f"({time.time() - t_load:.0f}s to load)", flush=True)
    train_set = data.subset(train_idx) if len(val_idx) else data
    init_from = getattr(args, "init_from", None)
    if init_from:
        model = kind.load(init_from, target)
        kind.adopt(model, target, options)
        info = {"init_from": str(init_from)}
    else:
        model, info = kind.build(target, options, train_set)
    del train_set
    model.to(device).train()
    if isinstance(getattr(model, "train_state", None), dict):  # the kind's training tensors live with the model
        model.train_state = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in model.train_state.items()}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=fit.lr, betas=(0.9, 0.95), weight_decay=fit.weight_decay)
    per_epoch = math.ceil(len(train_idx) / fit.batch)
    steps_total = fit.epochs * per_epoch if fit.max_steps is None else min(fit.epochs * per_epoch, int(fit.max_steps))
    warm = max(1, int(fit.warmup * steps_total))
    budget_min = getattr(args, "time_budget_min", None) or fit.time_budget_min
    budget = budget_min * 60
    t0, c0 = time.time(), time.process_time()

    def lr_at(s: int) -> float:
        if s < warm:
            return fit.lr * (s + 1) / warm
        frac = max((s - warm) / max(1, steps_total - warm), (time.time() - t0) / budget)
        return fit.lr * (fit.min_lr_ratio + (1 - fit.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    order = sorted(train_idx, key=data.length)
    chunks = [order[i: i + fit.batch] for i in range(0, len(order), fit.batch)]
    curve = {"step": [], "loss": [], "acc": [], "lr": [], "seconds": []}
    vals = []
    step, stopped = 0, False
    before = evaluate(kind, model, data, val_idx, options, fit.batch, device) if val_idx else None
    for epoch in range(fit.epochs):
        rng.shuffle(chunks)
        for idx in chunks:
            lr = lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = kind.collate(model, data, idx, options, device)
            loss, hits, counts = kind.loss(model, batch, options, train=True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, fit.clip)
            opt.step()
            acc = [round(h / max(1, c), 4) for h, c in zip(hits, counts)]
            curve["step"].append(step)
            curve["loss"].append(round(float(loss.detach()), 5))
            curve["acc"].append(acc)
            curve["lr"].append(lr)
            curve["seconds"].append(round(time.time() - t0, 1))
            if step % 20 == 0:
                print(f"[fit] epoch {epoch} step {step}/{steps_total} loss {float(loss.detach()):.4f} acc {acc} "
                      f"lr {lr:.2e} {time.time() - t0:.0f}s", flush=True)
            step += 1
            if step >= steps_total:
                break
            if time.time() - t0 > budget:
                stopped = True
                break
        if val_idx:
            v = evaluate(kind, model, data, val_idx, options, fit.batch, device)
            v.update({"epoch": epoch, "step": step, "seconds": round(time.time() - t0, 1)})
            vals.append(v)
            print(f"[fit] epoch {epoch} validation agreement per draft step {v['all']} "
                  f"({time.time() - t0:.0f}s)", flush=True)
        if stopped:
            print(f"[fit] time budget of {budget_min} min reached", flush=True)
            break
        if step >= steps_total:
            break
    out = _out_dir(fit, args)
    out.mkdir(parents=True, exist_ok=True)
    model.cpu()
    kind.save(model, out, target)
    parts_meta = [{k: v for k, v in p.items() if k not in ("layers",)} for p in data.parts]
    record = {
        "recipe": {k: v for k, v in vars(fit).items() if not k.startswith("_")},
        "recipe_file": _rel(getattr(fit, "_path", "")), "kind": fit.kind, "title": kind.title,
        "data_recipe": {k: v for k, v in vars(data_recipe).items() if not k.startswith("_")},
        "data_recipe_file": _rel(getattr(data_recipe, "_path", "")),
        "data": {"sequences": len(data), "train_sequences": len(train_idx), "val_sequences": len(val_idx),
                 "positions": int(data.offsets[-1]), "answer_positions": data.answer_positions(),
                 "by_kind": _count(data, "kind"), "by_category": _count(data, "category"),
                 "shards": parts_meta},
        "info": info, "unroll_steps": kind.unroll_steps(options), "layers": list(layers),
        "steps": step, "epochs_run": len(vals) if val_idx else epoch + 1, "stopped_by_time_budget": stopped,
        "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1), "threads": threads, "device": str(device),
        "torch": torch.__version__, "command": command_line(), "curve": curve,
        "validation_before": before, "validation": vals,
        "params": int(sum(p.numel() for p in model.parameters())),
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    card.render(out)
    print(f"[fit] wrote {out}", flush=True)
    return out


def _count(data: D.SeqSet, key: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for m in data.meta:
        out[m[key]] = out.get(m[key], 0) + 1
    return dict(sorted(out.items()))


def _rel(path: str) -> str:
    if not path:
        return ""
    p = pathlib.Path(path).resolve()
    root = R.repo_root()
    return str(p.relative_to(root)) if p.is_relative_to(root) else str(p)


# ------------------------------------------------------------------------------- draft vocabulary
VOCAB_SIZES = (1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768)


def vocab_report(fit: R.FitRecipe, cache, args, sizes=VOCAB_SIZES, repeats: int = 200) -> dict:
    """Coverage of the answer labels (training split, validation split) by the ``n`` most frequent
    training labels, and the LM-head cost of a draft vocabulary of ``n`` tokens: parameters, MACs per
    draft token, and the measured time of one row's ``[1, H] x [H, n]`` product on this device
    (median of ``repeats``, fp32, ``--threads``). Writes ``vocab.json`` into the drafter's directory."""
    from specc.models import load_target
    from specc.train.eagle import label_counts
    from specc.train.pipeline import _out_dir

    device = torch.device(args.device)
    threads = int(getattr(args, "threads", None) or 1)
    torch.set_num_threads(threads)
    data_recipe = R.load_data_recipe(fit.data)
    target, _ = load_target(data_recipe.target, data_recipe.target_format)
    V, H = target.config.vocab_size, target.config.hidden_size
    data = D.load(_data_files(fit, data_recipe, cache), [], context=0)
    train_idx, val_idx = split(data, fit.val_every)
    tc, vc = label_counts(data.subset(train_idx), V), label_counts(data.subset(val_idx), V)
    order = torch.argsort(tc, descending=True)
    rows = []
    emb = target.embed_weight.detach().float().to(device)
    for n in list(sizes) + [V]:
        n = min(n, V)
        top = order[:n]
        w = emb[top].contiguous()
        x = torch.randn(1, H, device=device)
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            _ = x @ w.t()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        times.sort()
        rows.append({"size": n, "train_coverage": round(float(tc[top].sum()) / float(tc.sum()), 4),
                     "val_coverage": round(float(vc[top].sum()) / max(1.0, float(vc.sum())), 4),
                     "params": n * H, "macs_per_draft_token": n * H,
                     "ms_per_row": round(1000 * times[len(times) // 2], 4)})
    report = {"rows": rows, "threads": threads, "device": str(device), "train_labels": int(tc.sum()),
              "val_labels": int(vc.sum())}
    print("| draft vocabulary | training coverage | validation coverage | LM-head params | ms per draft token |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['train_coverage']:.3f} | {r['val_coverage']:.3f} | {r['params'] / 1e6:.1f} M | {r['ms_per_row']:.3f} |")
    out = _out_dir(fit, args)
    out.mkdir(parents=True, exist_ok=True)
    from specc.commands.train import command_line
    report["command"] = command_line()
    (out / "vocab.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
