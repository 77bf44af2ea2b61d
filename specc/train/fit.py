"""The training loop shared by every drafter kind, and the draft-vocabulary report.

:func:`fit` reads a drafter recipe, loads the token shards its ``parts`` name
(:mod:`specc.train.shards`), holds out every ``val_every``-th self-distilled sequence for validation,
builds the model with the kind's adapter and trains it with AdamW (linear warm-up, cosine decay to
``min_lr_ratio``; progress is the larger of the step and the time-budget fractions, so a run cut by
the budget still ends at the low learning rate), seeded. The target's features are computed
**online** (:mod:`specc.train.features`), one batch at a time, at the dtype this CPU runs fastest
(measured at start on the training shapes, :func:`specc.device.pick_dtype`; the same choice sets
the autocast of the drafter's own forward and backward). Every ``eval_tokens`` answer tokens trained
on (and at the end) it scores top-1 agreement with the target per draft step on the validation
split (overall, per category, per data kind): the agreement-versus-data curve of the card. It writes
the checkpoint in the kind's published layout and ``training.json``; :mod:`specc.train.card`
renders ``TRAINING.md`` and the curves from it.
"""
from __future__ import annotations

import json
import math
import pathlib
import random
import sys
import time
from typing import Dict, List, Optional

import torch

from specc.errors import SpeccError
from specc.train import data as D
from specc.train import features as FE
from specc.train import kinds as K
from specc.train import recipe as R
from specc.train import shards as S


def load_tokens(fit: R.FitRecipe, data: R.DataRecipe) -> S.TokenSet:
    """The recipe's token shards; ``max_shards[part]`` keeps only the first N shards of each writer
    (an experiment's subset)."""
    tokens = S.load(R.token_dirs(fit, data))
    if not fit.max_shards:
        return tokens
    keep, seen = [], {}
    allowed = {}
    for p in tokens.parts:
        part, tag = p.get("part", p["dir"]), p["shard"].rsplit("-", 1)[0]
        limit = fit.max_shards.get(part)
        seen[(part, tag)] = seen.get((part, tag), 0) + 1
        allowed[p["shard"]] = limit is None or seen[(part, tag)] <= int(limit)
    keep = [i for i, m in enumerate(tokens.meta) if allowed.get(m["shard"], True)]
    return tokens.subset(keep)


def split(tokens: S.TokenSet, every: int, limit: Optional[int] = None):
    """Validation = every ``every``-th self-distilled sequence (at most ``limit`` of them), training =
    the rest (index lists). Fixed by the shard order, so a continued fit holds out the same ones."""
    distill = [i for i, m in enumerate(tokens.meta) if m["kind"] == "distill"]
    val = distill[::every][: limit] if limit else distill[::every]
    held = set(val)
    return [i for i in range(len(tokens)) if i not in held], val


def evaluate(kind, model, data: D.SeqSet, options: dict, batch: int, device) -> dict:
    """Top-1 agreement per draft step over every sequence of ``data`` (no noise, no grad):
    ``{"all": [a_k], "by_category": {c: [a_k]}, "by_kind": {k: [a_k]}, "positions": n}``."""
    steps = kind.unroll_steps(options)
    groups: Dict[str, list] = {}

    def add(key, h, c):
        g = groups.setdefault(key, [[0] * steps, [0] * steps])
        for k in range(steps):
            g[0][k] += h[k]
            g[1][k] += c[k]

    model.eval()
    by_group: Dict[tuple, List[int]] = {}
    for i in range(len(data)):  # batches within one (category, data kind): per-group tallies
        by_group.setdefault((data.meta[i]["category"], data.meta[i]["kind"]), []).append(i)
    gen_state = torch.get_rng_state()
    torch.manual_seed(1234)  # kinds that draw (block anchors) draw the same ones every evaluation
    with torch.no_grad():
        for (cat, knd), members in sorted(by_group.items()):
            members = sorted(members, key=data.length)
            for s in range(0, len(members), batch):
                b = kind.collate(model, data, members[s: s + batch], options, device)
                _, h, c = kind.loss(model, b, options, train=False)
                add("all", h, c)
                add("cat:" + cat, h, c)
                add("kind:" + knd, h, c)
    torch.set_rng_state(gen_state)
    model.train()

    def rate(g):
        return [round(g[0][k] / max(1, g[1][k]), 4) for k in range(steps)]
    return {"all": rate(groups["all"]), "positions": groups["all"][1][0],
            "by_category": {k[4:]: rate(v) for k, v in sorted(groups.items()) if k.startswith("cat:")},
            "by_kind": {k[5:]: rate(v) for k, v in sorted(groups.items()) if k.startswith("kind:")}}


def choose_dtype(fit: R.FitRecipe, target, device: torch.device, threads: int) -> dict:
    """The compute dtype of the fit: ``amp: bf16`` / ``none`` as the recipe says, ``auto`` measured
    here on the fit's own matrix shapes (the target forward over a batch and the drafter's head):
    ``{"dtype", "amp", "rates_gflops", "cpu"}``."""
    from specc import device as DV

    facts = DV.cpu_facts(threads) if device.type == "cpu" else {"device": torch.cuda.get_device_name()}
    if fit.amp != "auto":
        dtype = "bfloat16" if fit.amp == "bf16" else "float32"
        return {"dtype": dtype, "amp": fit.amp, "rates_gflops": {}, "cpu": facts, "measured": False}
    if device.type != "cpu":
        return {"dtype": "bfloat16", "amp": "bf16", "rates_gflops": {}, "cpu": facts, "measured": False}
    c = target.config
    rows = fit.batch * 256
    shapes = [(rows, c.hidden_size, c.q_size + 2 * c.kv_size), (rows, c.hidden_size, 2 * c.intermediate_size),
              (rows, c.intermediate_size, c.hidden_size), (rows // 4, c.hidden_size, 8192)]
    dtype, rates = DV.pick_dtype(shapes)
    return {"dtype": dtype, "amp": "bf16" if dtype == "bfloat16" else "none",
            "rates_gflops": {k: round(v, 1) for k, v in rates.items()}, "cpu": facts, "measured": True}


def fit(fit: R.FitRecipe, cache, args, target=None, data_recipe: R.DataRecipe = None,
        tokens: Optional[S.TokenSet] = None) -> pathlib.Path:
    """Train the drafter of ``fit`` and write it (see the module docstring). Returns its directory.

    ``target`` / ``data_recipe`` / ``tokens`` (tests) replace the target loaded from, the data recipe
    named by, and the token shards of the recipe. Raises ``SpeccError`` when the data are missing or
    CUDA is asked for and absent."""
    from specc.models import load_target
    from specc.train import card
    from specc.train.provenance import command_line

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
    compute = choose_dtype(fit, target, device, threads)
    print(f"[fit] compute dtype {compute['dtype']}" + (f" (measured GFLOP/s on the training shapes: "
          f"{', '.join(f'{k} {v:.0f}' for k, v in compute['rates_gflops'].items())})" if compute["measured"] else
          f" (recipe amp: {fit.amp})"), file=sys.stderr, flush=True)
    feat_target = target
    if compute["dtype"] != str(target.norm.weight.dtype).replace("torch.", ""):
        import copy
        feat_target = copy.deepcopy(target).to(getattr(torch, compute["dtype"]))
    layers = kind.layers(target.config, options)
    t_load = time.time()
    if tokens is None:
        tokens = load_tokens(fit, data_recipe)
    train_idx, val_idx = split(tokens, fit.val_every, fit.val_max)
    online = FE.OnlineFeatures(feat_target, layers)
    val = online.seqset(tokens, val_idx, fit.prompt_context) if val_idx else None
    print(f"[fit] {fit.name}: {len(tokens)} sequences ({len(train_idx)} train, {len(val_idx)} validation), "
          f"{tokens.answer_tokens(train_idx)} training answer tokens, layers {list(layers)} "
          f"({time.time() - t_load:.0f}s to load and run the validation features)", file=sys.stderr, flush=True)
    init_from = getattr(args, "init_from", None)
    if init_from:
        model = kind.load(init_from, target)
        kind.adopt(model, target, options)
        info = {"init_from": str(init_from)}
    else:
        labels = FE.label_seqset(tokens, train_idx)
        model, info = kind.build(target, options, labels, list(range(len(train_idx))))
        info.update(kind.warm_start(model, target, options, val))
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
    train_tokens = tokens.answer_tokens(train_idx)
    eval_tokens = fit.eval_tokens or max(1, train_tokens // 4)
    t0, c0 = time.time(), time.process_time()

    def lr_at(s: int) -> float:
        if s < warm:
            return fit.lr * (s + 1) / warm
        frac = max((s - warm) / max(1, steps_total - warm), (time.time() - t0) / budget)
        return fit.lr * (fit.min_lr_ratio + (1 - fit.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    order = sorted(train_idx, key=lambda i: len(tokens.seqs[i]))
    chunks = [order[i: i + fit.batch] for i in range(0, len(order), fit.batch)]
    curve = {"step": [], "loss": [], "acc": [], "lr": [], "seconds": [], "tokens": []}
    vals = []
    step, stopped, seen, next_eval, epoch = 0, False, 0, eval_tokens, 0
    t_feat = 0.0
    before = evaluate(kind, model, val, options, fit.batch, device) if val is not None else None
    if before is not None:
        before.update({"step": 0, "tokens": 0, "seconds": 0.0, "epoch": 0})

    def validate(ep: int) -> None:
        v = evaluate(kind, model, val, options, fit.batch, device)
        v.update({"epoch": ep, "step": step, "tokens": seen, "seconds": round(time.time() - t0, 1)})
        vals.append(v)
        print(f"[fit] validation after {seen} answer tokens (epoch {ep}, step {step}): agreement per draft step "
              f"{v['all']} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)

    for epoch in range(fit.epochs):
        rng.shuffle(chunks)
        for idx in chunks:
            lr = lr_at(step)
            for g in opt.param_groups:
                g["lr"] = lr
            tf = time.time()
            sset = online.seqset(tokens, idx, fit.prompt_context)
            t_feat += time.time() - tf
            batch = kind.collate(model, sset, list(range(len(idx))), options, device)
            with _autocast(compute["amp"], device):
                loss, hits, counts = kind.loss(model, batch, options, train=True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, fit.clip)
            opt.step()
            seen += tokens.answer_tokens(idx)
            acc = [round(h / max(1, c), 4) for h, c in zip(hits, counts)]
            curve["step"].append(step)
            curve["loss"].append(round(float(loss.detach()), 5))
            curve["acc"].append(acc)
            curve["lr"].append(lr)
            curve["seconds"].append(round(time.time() - t0, 1))
            curve["tokens"].append(seen)
            if step % 20 == 0:
                el = time.time() - t0
                print(f"[fit] epoch {epoch} step {step}/{steps_total} loss {float(loss.detach()):.4f} acc {acc} "
                      f"lr {lr:.2e} {el:.0f}s ({seen / max(el, 1e-9):.0f} answer tokens/s, target features "
                      f"{100 * t_feat / max(el, 1e-9):.0f}% of the time)", file=sys.stderr, flush=True)
            step += 1
            if val is not None and seen >= next_eval:
                validate(epoch)
                next_eval += eval_tokens
            if step >= steps_total:
                break
            if time.time() - t0 > budget:
                stopped = True
                break
        if stopped or step >= steps_total:
            break
    if val is not None and (not vals or vals[-1]["step"] != step):
        validate(epoch)
    if stopped:
        print(f"[fit] time budget of {budget_min} min reached", file=sys.stderr, flush=True)
    finish = kind.finish(model, target, val, options) if val is not None else {}
    out = R.out_dir(fit, args)
    out.mkdir(parents=True, exist_ok=True)
    model.cpu()
    kind.save(model, out, target)
    seconds = time.time() - t0
    record = {
        "recipe": {k: v for k, v in vars(fit).items() if not k.startswith("_")},
        "recipe_file": _rel(getattr(fit, "_path", "")), "kind": fit.kind, "title": kind.title,
        "data_recipe": {k: v for k, v in vars(data_recipe).items() if not k.startswith("_")},
        "data_recipe_file": _rel(getattr(data_recipe, "_path", "")),
        "data": {"sequences": len(tokens), "train_sequences": len(train_idx), "val_sequences": len(val_idx),
                 "train_answer_tokens": train_tokens, "val_answer_tokens": tokens.answer_tokens(val_idx),
                 "val_positions": int(val.offsets[-1]) if val is not None else 0,
                 "by_kind": _count(tokens, "kind"), "by_category": tokens.counts(),
                 "shards": [{k: v for k, v in p.items() if k not in ("cpu",)} for p in tokens.parts],
                 "shard_cpu": next((p.get("cpu") for p in tokens.parts if p.get("cpu")), None)},
        "info": info, "finish": finish, "unroll_steps": kind.unroll_steps(options), "layers": list(layers),
        "compute": compute, "steps": step, "epochs_run": epoch + 1, "stopped_by_time_budget": stopped,
        "answer_tokens_trained": seen, "answer_tokens_per_s": round(seen / max(seconds, 1e-9), 1),
        "target_feature_seconds": round(t_feat, 1), "target_positions": online.positions,
        "seconds": round(seconds, 1), "cpu_seconds": round(time.process_time() - c0, 1), "threads": threads,
        "device": str(device), "torch": torch.__version__, "command": command_line(), "curve": curve,
        "validation_before": before, "validation": vals,
        "params": int(sum(p.numel() for p in model.parameters())),
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    card.render(out)
    print(f"[fit] wrote {out}", flush=True)
    return out


def _autocast(amp: str, device: torch.device):
    """Mixed precision for the training forward/backward: ``"bf16"`` (matmuls in bfloat16, weights,
    optimizer and losses in fp32; on CPUs with AVX512-BF16 the training step runs several times faster)
    or ``"none"`` (fp32)."""
    if amp not in ("bf16", "none"):
        raise SpeccError(f"amp={amp!r}: expected bf16 or none")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=(amp == "bf16"))


def _count(data, key: str) -> Dict[str, int]:
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
    from specc.train.vocab import label_counts

    device = torch.device(args.device)
    threads = int(getattr(args, "threads", None) or 1)
    torch.set_num_threads(threads)
    data_recipe = R.load_data_recipe(fit.data)
    target, _ = load_target(data_recipe.target, data_recipe.target_format)
    V, H = target.config.vocab_size, target.config.hidden_size
    tokens = load_tokens(fit, data_recipe)
    train_idx, val_idx = split(tokens, fit.val_every)
    data = FE.label_seqset(tokens, range(len(tokens)))
    tc, vc = label_counts(data, V, train_idx), label_counts(data, V, val_idx)
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
    out = R.out_dir(fit, args)
    out.mkdir(parents=True, exist_ok=True)
    from specc.train.provenance import command_line
    report["command"] = command_line()
    (out / "vocab.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
