"""``TRAINING.md`` (model and data card) and ``training_curve.png`` of a trained drafter directory.

Rendered only from files in the directory and the committed prompt card, so ``specc train render``
reproduces it: ``training.json`` (written by :func:`specc.train.fit.fit`), ``vocab.json`` (``specc
train vocab``), ``transfer.json`` (``tools/eagle_transfer.py --json``: teacher-forced agreement on
the shipped prompts) and ``bench_eagle.json`` (``tools/bench_eagle.py --json``: the runtime on the
shipped prompts).
"""
from __future__ import annotations

import json
import pathlib
from typing import List


def _load(path: pathlib.Path):
    return json.loads(path.read_text()) if path.is_file() else None


def plot_curve(record: dict, path: pathlib.Path) -> None:
    """Training loss per step, and validation agreement per draft step against the answer tokens
    trained on (the agreement-versus-data curve: still rising at the end means more data would help;
    epoch boundaries are marked, past the first the data repeat)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = record["curve"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(c["step"], c["loss"], lw=0.6)
    ax[0].set_xlabel("optimizer step")
    ax[0].set_ylabel("training loss")
    ax[0].set_title(f"{record['title']}: loss")
    vals = ([record["validation_before"]] if record.get("validation_before") else []) + (record.get("validation") or [])
    for k in range(record["unroll_steps"]):
        ax[1].plot([v.get("tokens", 0) / 1e3 for v in vals], [v["all"][k] for v in vals], marker="o",
                   label=f"draft step {k + 1}")
    per_epoch = record["data"].get("train_answer_tokens")
    if per_epoch:
        for e in range(1, int(record.get("epochs_run", 1)) + 1):
            if e * per_epoch <= (vals[-1].get("tokens", 0) if vals else 0):
                ax[1].axvline(e * per_epoch / 1e3, color="grey", lw=0.6, ls="--")
    ax[1].set_xlabel("answer tokens trained on (thousands; dashed: end of an epoch)")
    ax[1].set_ylabel("top-1 agreement with the target")
    ax[1].legend(fontsize=7)
    ax[1].set_title("validation split (held-out training prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _compute_line(c: dict) -> str:
    """The card's line on the compute dtype and the CPU it was measured on."""
    from specc.device import describe

    cpu = describe(c["cpu"]) if "model" in c.get("cpu", {}) else c.get("cpu", {}).get("device", "?")
    if c.get("measured"):
        rates = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in c["rates_gflops"].items())
        return (f"- Compute dtype {c['dtype']} (target features and the drafter's autocast), chosen by measuring "
                f"the fit's matrix shapes at its start ({rates}) on {cpu}.")
    return f"- Compute dtype {c['dtype']} (the recipe's `amp: {c['amp']}`) on {cpu}."


def _table(header: List[str], rows: List[List]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return out


def render(out: pathlib.Path) -> pathlib.Path:
    """Write ``out/TRAINING.md`` and ``out/training_curve.png`` from the JSON files there."""
    from specc.train.recipe import repo_root

    out = pathlib.Path(out)
    rec = _load(out / "training.json")
    if rec is None:
        raise FileNotFoundError(f"{out}/training.json missing: train with `specc train fit` first")
    cfg = _load(out / "config.json") or {}
    plot_curve(rec, out / "training_curve.png")
    dr = rec["data_recipe"]
    card = _load(repo_root() / dr["prompt_dir"] / "card.json") or {}
    weights = [f for f in out.glob("model*") if f.suffix in (".safetensors", ".bin")]
    size = sum(f.stat().st_size for f in weights)
    from specc.models.hf_loader import INDEX_NAME

    files = f"`{INDEX_NAME}` and its shards" if (out / INDEX_NAME).is_file() else "`model.safetensors`"
    L: List[str] = []
    L.append(f"# {out.name}: {rec['title']} drafter for `{dr['target']}`")
    L.append("")
    L.append(f"Trained on this machine by `specc train` from the recipe `{rec['recipe_file']}` (data: "
             f"`{rec['data_recipe_file']}`). Layout: the published {rec['title']} layout (`config.json` + "
             f"{files}, fp16), {rec['params']:,} parameters, {size / 2 ** 20:.1f} MB. Target layers read: "
             f"{rec['layers']}" + (" (final-norm output computed from the last)" if rec["kind"] == "eagle" else "") + ".")
    if cfg.get("draft_vocab_size"):
        L.append(f"Draft vocabulary: {cfg['draft_vocab_size']} tokens (`d2t`/`t2d`), the most frequent answer labels "
                 f"of the training split, covering {100 * rec['info'].get('train_label_coverage', 0):.1f} % of them.")
    ws = rec["info"].get("warm_start")
    if ws:
        sc = ws["scales"]
        L.append(f"Warm start: every layer began as the EAGLE (v1) head `{ws['from']}` (its `fc` as `eh_proj`, its "
                 f"decoder block copied; `enorm`/`hnorm`/`input_layernorm`/`shared_head.norm` set to the RMS of the "
                 f"embedding {sc['embedding']}, hidden {sc['hidden']}, projection {sc['x']} and head output "
                 f"{sc['head_output']} on validation sequences; `fc`'s bias, RMS {ws['dropped_fc_bias_rms']}, dropped).")
    elif rec["info"].get("init_from"):
        L.append(f"Continued from the checkpoint `{rec['info']['init_from']}` (`--init-from`).")
    L += ["", "## Data card", "",
          "Every prompt is built from text in installable packages (below); the shipped evaluation prompts "
          "`specc/data/prompts.jsonl` are never read by any stage, and `tests/train/test_train_prompts_held_out.py` "
          "checks that no committed training prompt shares an 8-word span with them.", ""]
    corp = card.get("corpora") or {}
    if corp:
        L += _table(["source", "package", "registry", "version", "licence", "what", "file (sha256)"],
                    [[k, v["package"], v["registry"], v["version"], v["licence"], v["what"],
                      f"`{v['files'][0]['file']}` ({v['files'][0]['sha256'][:12]}…)" if v.get("files") else ""]
                     for k, v in corp.items()])
        L.append("")
    for part in ("round1", "round2", "teacher"):
        info = card.get(part)
        if not info or part not in rec["recipe"]["parts"]:
            continue
        L.append(f"Prompts `{dr['prompt_dir']}/{part}.jsonl.gz`: {info['count']} "
                 + {"round1": "round-1 prompts (the target answers them greedily)",
                    "round2": f"multi-turn follow-ups over the target's own round-1 answers (from {info.get('from_answered', '?')} answers)",
                    "teacher": "prompts with a real-text answer (teacher forcing, prefill only)"}[part] + ":")
        L.append("")
        L += _table(["category", "sources (prompts)"],
                    [[c, ", ".join(f"{s} {n}" for s, n in v.items())] for c, v in info["by_category_source"].items()])
        L.append("")
    d = rec["data"]
    by_part = {}
    for sh in d["shards"]:
        p = by_part.setdefault(sh.get("part", sh.get("dir", "?")), {"shards": 0, "sequences": 0, "answer": 0, "tokens": 0,
                                                                  "seconds": 0.0, "cpu": 0.0, "commands": [], "dtypes": set()})
        p["shards"] += 1
        p["sequences"] += sh["sequences"]
        p["answer"] += sh.get("answer_tokens", 0)
        p["tokens"] += sh.get("tokens", 0)
        p["seconds"] += sh.get("seconds", 0.0)
        p["cpu"] += sh.get("cpu_seconds", 0.0)
        if sh.get("dtype"):
            p["dtypes"].add(sh["dtype"])
        if sh.get("command") and sh["command"] not in p["commands"]:
            p["commands"].append(sh["command"])
    L.append(f"Token shards (`{dr['prompt_dir']}/<part>/*.npz`, committed): prompts and the target's greedy answers "
             f"(at most {dr['max_new_tokens']} new tokens, target dtype per part below) as token ids; the fit "
             "computes the target's features from them online. Teacher-forced parts hold real-text answers, "
             "labelled by the target during the fit.")
    L.append("")
    L += _table(["part", "shards", "sequences", "tokens", "answer tokens", "target dtype", "wall time (s)", "CPU time (s)"],
                [[k, v["shards"], v["sequences"], v["tokens"], v["answer"], ", ".join(sorted(v["dtypes"])) or "–",
                  round(v["seconds"]), round(v["cpu"])] for k, v in by_part.items()])
    L.append("")
    if d.get("shard_cpu"):
        from specc.device import describe
        L.append(f"Answered on: {describe(d['shard_cpu'])}.")
        L.append("")
    L.append(f"Used here: {d['sequences']} sequences ({d['train_sequences']} training with {d['train_answer_tokens']:,} "
             f"answer tokens; {d['val_sequences']} validation: every {rec['recipe']['val_every']}th self-distilled one, "
             f"{d['val_answer_tokens']:,} answer tokens), the last {rec['recipe']['prompt_context']} prompt positions "
             f"of each kept as context. Per category (sequences / answer tokens): "
             + ", ".join(f"{c} {v['sequences']} / {v['answer_tokens']:,}" for c, v in d["by_category"].items()) + ".")
    r = rec["recipe"]
    opts = ", ".join(f"{k}={v}" for k, v in r["options"].items())
    L += ["", "## Training", "",
          f"- Kind `{rec['kind']}` ({opts}); AdamW lr {r['lr']} (warm-up {r['warmup']}, cosine to {r['min_lr_ratio']}x), "
          f"batch {r['batch']} sequences, grad-clip {r['clip']}, weight decay {r['weight_decay']}, seed {r['seed']}.",
          f"- {rec['steps']} steps, {rec['epochs_run']} epoch(s){' (stopped by the time budget)' if rec['stopped_by_time_budget'] else ''}, "
          f"{rec['answer_tokens_trained']:,} answer tokens trained on ({rec['answer_tokens_per_s']:.0f} per second), "
          f"{rec['seconds']:.0f} s wall on {rec['threads']} {rec['device']} thread(s) (torch {rec['torch']}), "
          f"{rec.get('cpu_seconds', rec['seconds'] * rec['threads']) / 3600:.2f} CPU-hours (process CPU time); "
          f"the target's online features took {rec['target_feature_seconds']:.0f} s of it "
          f"({rec['target_positions']:,} target positions).",
          _compute_line(rec["compute"]),
          "", "Validation agreement (top-1 equal to the target's token) per draft step:", ""]
    steps = rec["unroll_steps"]
    rows = []
    if rec.get("validation_before"):
        rows.append(["before training", 0, 0] + rec["validation_before"]["all"])
    rows += [[f"epoch {v['epoch']}", v["step"], f"{v.get('tokens', 0):,}"] + v["all"] for v in rec.get("validation", [])]
    L += _table(["", "step", "answer tokens trained on"] + [f"step {k + 1}" for k in range(steps)], rows)
    if (rec.get("finish") or {}).get("confidence_calibration"):
        L += ["", "Confidence head calibration (Platt `sigmoid(a·z + b)` per block position, fitted on the "
              "validation split's (logit, accepted) pairs): " + ", ".join(
                  f"({a:.2f}, {b:.2f})" for a, b in rec["finish"]["confidence_calibration"])]
    if rec.get("validation"):
        last = rec["validation"][-1]
        L += ["", "After training, per category and per data kind:", ""]
        L += _table(["split"] + [f"step {k + 1}" for k in range(steps)],
                    [[c] + a for c, a in last["by_category"].items()] + [[f"({k} data)"] + a for k, a in last["by_kind"].items()])
    L += ["", "Curves: `training.json` (every step), `training_curve.png`."]
    voc = _load(out / "vocab.json")
    tr = _load(out / "transfer.json")
    if voc:
        held = ((tr or {}).get("vocab_coverage") or {}).get("coverage") or {}
        L += ["", "## Draft vocabulary: coverage and LM-head cost", "",
              f"`{voc['command']}`: answer labels covered by the n most frequent training labels, and the draft "
              f"LM head's cost per draft token (one row, fp32, {voc['threads']} thread(s), median; the machine was "
              f"shared)" + (f"; held-out: the shipped prompts' answer tokens covered (`{tr['command']}`)" if held else "")
              + ":", ""]
        L += _table(["draft vocabulary", "training coverage", "validation coverage"] + (["shipped (held-out) coverage"] if held else [])
                    + ["LM-head params", "ms per draft token"],
                    [[x["size"], f"{x['train_coverage']:.3f}", f"{x['val_coverage']:.3f}"]
                     + ([f"{held[str(x['size'])]:.3f}" if str(x["size"]) in held else "–"] if held else [])
                     + [f"{x['params'] / 1e6:.1f} M", f"{x['ms_per_row']:.3f}"] for x in voc["rows"]])
    if tr:
        L += ["", "## Held out: teacher-forced agreement on the shipped prompts", "",
              f"`{tr['command']}` ({tr['prompts']} shipped prompts, {tr['max_new']} greedy tokens each; "
              f"the draft's top-1 at each answer position, unrolled on its own outputs):", ""]
        hdr = ["head", "category"] + [f"step {k + 1}" for k in range(tr["steps"])]
        rows = []
        for h in tr["heads"]:
            for c, a in h["by_category"].items():
                rows.append([h["label"], c] + [f"{x:.3f}" for x in a])
            if h.get("coverage") is not None:
                rows.append([h["label"], "draft vocabulary coverage", f"{h['coverage']:.3f}"] + [""] * (tr["steps"] - 1))
        L += _table(hdr, rows)
    b = _load(out / "bench_eagle.json")
    if b:
        L += ["", "## Held out: the runtime on the shipped prompts", "",
              f"`{b.get('command', '')}`: batch 1, greedy verification, {b['max_new']} new tokens, tokens/s over wall "
              f"time with prefill, speed-ups against the faster plain run.", ""]
        L += _table(["method", "κ", "threads", "τ", "acceptance per position", "tok/s", "× plain", "output == plain"],
                    [[x["method"], x["k"], x.get("threads", 1), f"{x['tau']:.2f}", x["acceptance_per_pos"],
                      f"{x['tokens_per_s']:.2f}", f"{x['speedup']:.2f}", "yes" if x["exact"] else "NO"]
                     for x in b["rows"] if x["method"] == "plain" or x["method"].split(":")[0] == rec["kind"]])
        if b.get("per_category"):
            L += ["", "τ per category:", ""]
            cats = sorted({c for x in b["per_category"] for c in x["tau"]})
            L += _table(["method", "κ"] + cats, [[x["method"], x["k"]] + [f"{x['tau'].get(c, 0):.2f}" for c in cats]
                                                 for x in b["per_category"] if x["method"].split(":")[0] == rec["kind"]])
    cmds = [card.get("corpora_command")] + [(card.get(p) or {}).get("command") for p in ("round1",)]
    cmds += by_part.get("round1", {}).get("commands", [])
    cmds += [(card.get("round2") or {}).get("command")] + by_part.get("round2", {}).get("commands", [])
    cmds += by_part.get("teacher", {}).get("commands", [])
    cmds += [rec["command"], (voc or {}).get("command"), (tr or {}).get("command"), (b or {}).get("command")]
    L += ["", "## Commands run (as recorded)", "", "```"] + [c for c in dict.fromkeys(cmds) if c] + ["```", ""]
    (out / "TRAINING.md").write_text("\n".join(L))
    return out / "TRAINING.md"
