"""The training loop of the block drafters, their held-out table and their card.

One loop for every kind (:mod:`specc.blocktrain.kinds`): AdamW, linear warm-up then cosine decay to
``min_lr_ratio``, gradient clipping, a wall-clock budget, seeds fixed. Held out: every tenth
self-distilled sequence (by position in the shard order, fixed) is never trained on; its per-position
agreement is measured before training, every ``val_every`` steps and at the end. DSpark's confidence
head is then calibrated per block position (Platt scaling fitted on the held-out pairs, written into
the checkpoint as ``confidence_calibration``). The card (``TRAINING.md`` + ``training.json`` + a curve
plot) records the recipe, the data (sources, licences, counts), the curves and the tables.
"""
from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Dict, List

import torch

from specc.blocktrain import kinds as kinds_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _abs(p) -> pathlib.Path:
    q = pathlib.Path(p)
    return q if q.is_absolute() else ROOT / q


def split(data, every: int = 10):
    """``(train indices, held-out indices)``: every ``every``-th self-distilled sequence is held out."""
    distill = [i for i, k in enumerate(data.kinds) if k == "distill"]
    held = set(distill[::every])
    return [i for i in range(len(data)) if i not in held], sorted(held)


@torch.no_grad()
def agreement(kind, model, data, idx: List[int], options: dict, batch: int = 8, seed: int = 123) -> Dict[str, list]:
    """Per-position top-1 agreement on sequences ``idx`` (fixed anchors from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    hits = [0.0] * int(options["gamma"])
    counts = [0] * int(options["gamma"])
    loss_sum, n = 0.0, 0
    was = model.training
    model.eval()
    for b0 in range(0, len(idx), batch):
        bt = kind.collate(data, idx[b0: b0 + batch], options, "cpu", gen)
        loss, h, c = kind.loss(model, bt, options, train=False)
        loss_sum += float(loss)
        n += 1
        hits = [a + b for a, b in zip(hits, h)]
        counts = [a + b for a, b in zip(counts, c)]
    model.train(was)
    return {"agreement": [h / max(c, 1) for h, c in zip(hits, counts)], "counts": counts,
            "loss": loss_sum / max(n, 1)}


def expected_tau(agree: List[float]) -> float:
    """τ if position j's conditional acceptance were its agreement: 1 + Σ_j Π_{m≤j} a_m."""
    tau, run = 1.0, 1.0
    for a in agree:
        run *= a
        tau += run
    return tau


@torch.no_grad()
def calibrate_confidence(kind, model, data, idx: List[int], options: dict) -> List[List[float]]:
    """Fit ``sigmoid(a_j · z + b_j)`` per position on held-out (logit, accepted) pairs (Platt scaling,
    a few hundred steps of LBFGS on the log-loss); returns ``[[a_j, b_j], ...]`` and writes it into
    the model's ``confidence.calibration``."""
    gen = torch.Generator().manual_seed(7)
    zs, ys, ps = [], [], []
    for b0 in range(0, len(idx), 8):
        bt = kind.collate(data, idx[b0: b0 + 8], options, "cpu", gen)
        z, y, p = kind.confidence_pairs(model, bt, options)
        zs.append(z)
        ys.append(y)
        ps.append(p)
    z, y, p = torch.cat(zs), torch.cat(ys), torch.cat(ps)
    out = []
    for j in range(int(options["gamma"])):
        sel = p == j
        a = torch.tensor(1.0, requires_grad=True)
        b = torch.tensor(0.0, requires_grad=True)
        if int(sel.sum()) >= 20:
            with torch.enable_grad():
                opt = torch.optim.LBFGS([a, b], lr=0.5, max_iter=200)

                def closure():
                    opt.zero_grad()
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(a * z[sel] + b, y[sel])
                    loss.backward()
                    return loss
                opt.step(closure)
        out.append([float(a), float(b)])
    model.confidence.calibration.copy_(torch.tensor(out))
    return out


def _lr(step: int, total: int, lr: float, warmup: float, min_ratio: float) -> float:
    w = max(1, int(total * warmup))
    if step < w:
        return lr * (step + 1) / w
    t = (step - w) / max(1, total - w)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(recipe: dict, data_recipe: dict, data=None, target=None, tokenizer=None, log=print) -> dict:
    """Train the drafter of ``recipe`` on the shards of ``data_recipe`` (or on ``data`` / ``target``
    given directly, as the tests do), write its checkpoint and card under ``recipe["out"]``. Returns
    the training record."""
    from specc.blocktrain import data as bdata

    kind = kinds_mod.get(recipe["kind"])
    opts = kind.check_options(dict(recipe.get("options") or {}), recipe.get("_path", recipe["name"]))
    torch.manual_seed(int(recipe.get("seed", 0)))
    torch.set_num_threads(int(recipe.get("threads", 1)))
    if target is None:
        from specc.models import load_target

        target, tokenizer = load_target(data_recipe["target"], data_recipe.get("target_format", "auto"))
    target.requires_grad_(False)
    layers = list(kind.layers(target.config, opts))
    if data is None:
        data = bdata.load_shards(bdata.shard_paths(_abs(data_recipe["shard_dir"])), layers or [])
    tr, ho = split(data)
    ho = ho[: int(recipe.get("held_out_max", 120))]
    model, facts = kind.build(target, opts, data)
    if recipe.get("init_from"):  # continue from a checkpoint of this kind (same shapes)
        start = kind.load(_abs(recipe["init_from"]), target)
        own = model.state_dict()
        with torch.no_grad():
            for k, v in start.state_dict().items():
                if k in own and own[k].shape == v.shape:
                    own[k].copy_(v.to(own[k].dtype))
        facts["init_from"] = str(recipe["init_from"])
        prior = _abs(recipe["init_from"]) / "training.json"
        if prior.is_file():
            facts["prior_steps"] = json.loads(prior.read_text()).get("steps")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(recipe["lr"]), weight_decay=float(recipe.get("weight_decay", 0.0)),
                            betas=(0.9, 0.95))
    steps = int(recipe["steps"])
    budget = float(recipe.get("time_budget_min", 1e9)) * 60
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)))
    before = agreement(kind, model, data, ho, opts)
    log(f"{recipe['name']}: {len(tr)} train / {len(ho)} held-out sequences; before: {before['agreement']}")
    curve, val_curve = [], [{"step": 0, **before}]
    t0 = time.perf_counter()
    B = int(recipe["batch"])
    step = 0
    for step in range(steps):
        if time.perf_counter() - t0 > budget:
            log(f"time budget reached at step {step}")
            break
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, float(recipe["lr"]), float(recipe.get("warmup", 0.05)),
                          float(recipe.get("min_lr_ratio", 0.1)))
        pick = torch.randint(0, len(tr), (B,), generator=gen).tolist()
        batch = kind.collate(data, [tr[i] for i in pick], opts, "cpu", gen)
        loss, hits, counts = kind.loss(model, batch, opts, train=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, float(recipe.get("clip", 1.0)))
        opt.step()
        curve.append({"step": step + 1, "loss": float(loss.detach()), "acc1": hits[0] / max(counts[0], 1),
                      "s": time.perf_counter() - t0})
        if (step + 1) % int(recipe.get("log_every", 10)) == 0:
            log(f"step {step + 1} loss {float(loss.detach()):.3f} acc@1 {curve[-1]['acc1']:.3f} ({curve[-1]['s']:.0f} s)")
        if (step + 1) % int(recipe.get("val_every", 100)) == 0:
            v = agreement(kind, model, data, ho, opts)
            val_curve.append({"step": step + 1, **v})
            log(f"held-out step {step + 1}: loss {v['loss']:.3f} agreement {[round(a, 3) for a in v['agreement']]}")
    train_s = time.perf_counter() - t0
    after = agreement(kind, model, data, ho, opts)
    val_curve.append({"step": len(curve), **after})
    calib = None
    if recipe["kind"] == "dspark" and model.confidence is not None and ho:
        calib = calibrate_confidence(kind, model, data, ho, opts)
    model.eval()
    record = {"name": recipe["name"], "kind": recipe["kind"], "recipe": {k: v for k, v in recipe.items() if not k.startswith("_")},
              "recipe_file": recipe.get("_path"), "options": opts, "train_sequences": len(tr), "held_out_sequences": len(ho),
              "steps": len(curve), "train_s": round(train_s, 1), "curve": curve, "val_curve": val_curve,
              "held_out_before": before, "held_out_after": after,
              "expected_tau_before": expected_tau(before["agreement"]), "expected_tau_after": expected_tau(after["agreement"]),
              "confidence_calibration": calib, "facts": facts,
              "data": _data_card(data_recipe, data, tr, ho)}
    out = recipe.get("out")
    if out:
        out = _abs(out)
        extra = {"mask_token_id": int(opts["mask_token_id"])} if recipe["kind"] == "pard" else None
        if recipe["kind"] == "pard":
            kind.save(model, out, target, extra_config=extra, tokenizer=tokenizer)
        else:
            kind.save(model, out, target)
        (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
        write_card(record, out)
    record["model"] = model  # the trained model itself (not written to training.json)
    return record


def _data_card(data_recipe: dict, data, tr, ho) -> dict:
    from specc.blocktrain.corpora import SOURCES

    by_source: Dict[str, int] = {}
    for m in data.meta or []:
        by_source[m.get("source", "")] = by_source.get(m.get("source", ""), 0) + 1
    stats_path = _abs(data_recipe.get("shard_dir", ".")) / "stats.json"
    return {"recipe": data_recipe.get("_path"), "target": data_recipe.get("target"),
            "sequences": len(data), "positions": int(data.offsets[-1]),
            "distill_sequences": sum(1 for k in data.kinds if k == "distill"),
            "teacher_sequences": sum(1 for k in data.kinds if k == "teacher"),
            "sequences_by_source": by_source,
            "sources": {k: {"package": v["package"], "licence": v["licence"]} for k, v in SOURCES.items()},
            "build_stats": json.loads(stats_path.read_text()) if stats_path.is_file() else None,
            "prompt_file": data_recipe.get("prompt_file"), "passage_file": data_recipe.get("passage_file")}


def write_card(record: dict, out: pathlib.Path) -> None:
    """``TRAINING.md`` (recipe, data card, held-out table) and ``training_curve.png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
        c = record["curve"]
        ax[0].plot([r["step"] for r in c], [r["loss"] for r in c], lw=0.6)
        ax[0].set_xlabel("step")
        ax[0].set_ylabel("training loss")
        for j in range(len(record["held_out_after"]["agreement"])):
            ax[1].plot([v["step"] for v in record["val_curve"]], [v["agreement"][j] for v in record["val_curve"]],
                       label=f"pos {j + 1}")
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("held-out agreement")
        ax[1].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "training_curve.png", dpi=80)
        plt.close(fig)
    except Exception as exc:  # pragma: no cover - plotting is a nicety
        print(f"no curve plot: {exc}")
    d = record["data"]
    lines = [f"# {record['name']} — {kinds_mod.get(record['kind']).title}", "",
             f"Rebuild: `python -m specc.blocktrain train {record['name']}` (recipe `{record['recipe_file']}`; data "
             f"`{d['recipe']}`, rebuilt by `python -m specc.blocktrain fetch|prompts|data {pathlib.Path(d['recipe'] or '').stem}`).", "",
             "## Recipe", "", "```json", json.dumps(record["recipe"], indent=1), "```", "",
             "## Data card", "",
             f"Target `{d['target']}`. {d['sequences']} sequences ({d['distill_sequences']} self-distilled answers to prompts "
             f"built from the corpora below, {d['teacher_sequences']} teacher-forced real-text passages), {d['positions']} positions. "
             f"Prompts: `{d['prompt_file']}`; passages: `{d['passage_file']}`. The shipped evaluation prompts "
             "(`specc/data/prompts.jsonl`) were never read (8-word-span test: `tests/test_train_prompts_held_out.py`).", "",
             "| source | package | licence | sequences |", "|---|---|---|---|"]
    for k, v in d["sources"].items():
        lines.append(f"| {k} | {v['package']} | {v['licence']} | {d['sequences_by_source'].get(k, 0)} |")
    if d.get("build_stats"):
        bs = d["build_stats"]
        lines += ["", f"Data build on this CPU: distillation {bs.get('distill_s', 0) / 60:.1f} min "
                      f"({bs.get('distill_tokens', 0)} answer tokens), teacher forcing {bs.get('teacher_s', 0) / 60:.1f} min "
                      f"({bs.get('teacher_tokens', 0)} tokens)."]
    b, a = record["held_out_before"], record["held_out_after"]
    lines += ["", "## Held-out table", "",
              f"{record['held_out_sequences']} held-out self-distilled sequences (never trained on); top-1 agreement of block "
              f"position j with the target's greedy token given the earlier positions matched. Training: {record['steps']} steps, "
              f"{record['train_s'] / 60:.1f} min on one thread"
              + (f", continued from `{record['facts']['init_from']}` ({record['facts'].get('prior_steps')} earlier steps; "
                 f"\"before\" is that checkpoint)" if record.get("facts", {}).get("init_from") else "")
              + (f"; training softmax over the {record['facts']['train_vocab']} most frequent label tokens "
                 f"({record['facts'].get('train_vocab_label_coverage', 0):.1%} of the labels)" if record.get("facts", {}).get("train_vocab") else "")
              + ".", "",
              "| | " + " | ".join(f"pos {j + 1}" for j in range(len(a["agreement"]))) + " | loss | τ if independent |",
              "|---|" + "---|" * (len(a["agreement"]) + 2)]
    for name, v, tau in (("before", b, record["expected_tau_before"]), ("after", a, record["expected_tau_after"])):
        lines.append(f"| {name} | " + " | ".join(f"{x:.3f}" for x in v["agreement"]) + f" | {v['loss']:.3f} | {tau:.2f} |")
    if record.get("confidence_calibration"):
        lines += ["", "Confidence head calibration (Platt `sigmoid(a·z + b)` per position, fitted on the held-out pairs): "
                  + ", ".join(f"({a_:.2f}, {b_:.2f})" for a_, b_ in record["confidence_calibration"])]
    lines += ["", "Runtime measurement on the shipped prompts: `python tools/bench_block.py` (README, \"Block drafters\").",
              "", "![curves](training_curve.png)", ""]
    (out / "TRAINING.md").write_text("\n".join(lines))


def evaluate_recipe(recipe: dict, data_recipe: dict) -> None:
    """Print the held-out agreement of the trained drafter at ``recipe["out"]``."""
    from specc.blocktrain import data as bdata
    from specc.models import load_target

    kind = kinds_mod.get(recipe["kind"])
    opts = kind.check_options(dict(recipe.get("options") or {}), recipe["name"])
    target, _ = load_target(data_recipe["target"], data_recipe.get("target_format", "auto"))
    data = bdata.load_shards(bdata.shard_paths(_abs(data_recipe["shard_dir"])), list(kind.layers(target.config, opts)))
    _, ho = split(data)
    model = kind.load(_abs(recipe["out"]), target)
    print(json.dumps(agreement(kind, model, data, ho[: int(recipe.get("held_out_max", 120))], opts)))
