"""Training data of the block drafters: sequences with the target's hidden states and argmax.

Two ways to a sequence (both over :class:`specc.models.llama.LlamaModel`, fp32, on the CPU):

* **self-distillation** (``kind="distill"``): the target answers a chat prompt greedily; every block
  anchored inside its answer has exact labels (the answer *is* the target's greedy continuation);
* **teacher forcing** (``kind="teacher"``): one prefill over real text; the label at every position
  is the target's argmax there, and a block anchored at ``s`` has exact labels only up to the first
  position where the real text leaves the target's argmax (the kinds mask the rest out).

A record holds ``tokens [T]`` int64, ``labels [T]`` int64 (``labels[t]`` = the target's argmax after
``tokens[: t + 1]``), ``prompt_len``, and ``feats {layer: [T, H] fp16}`` — outputs of target decoder
layers (pre-norm). Shards are ``<name>.safetensors`` + ``<name>.json`` written atomically
(temporary file, then rename), so a stopped run resumes after its last whole shard.
"""
from __future__ import annotations

import json
import os
import pathlib
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch


@torch.inference_mode()
def record_sequences(target, seqs: Sequence[Sequence[int]], layers: Sequence[int], chunk: int = 4096) -> List[dict]:
    """One teacher-forced forward over each sequence: hidden states at ``layers`` and the argmax at
    every position. Returns per sequence ``{"tokens", "labels", "feats"}`` (fp16 features)."""
    from specc.models.llama import pad_prompts

    L = target.config.num_layers
    want = sorted(set(int(i) for i in layers) | {L - 1})
    ids, pos, lengths = pad_prompts(seqs)
    B, N = ids.shape
    target.setup_cache(B, max(N + 1, 16))
    at = torch.zeros(B, 1, dtype=torch.int64)
    _, hidden = target.forward(ids, pos, hidden_layers=want, logits_at=at, num_tokens=lengths)
    by_layer = dict(zip(want, hidden))
    last = target.norm(by_layer[L - 1])  # [B, N, H] final-norm output
    labels = torch.empty(B, N, dtype=torch.int64)
    flat = last.reshape(B * N, -1)
    for c0 in range(0, B * N, chunk):
        labels.view(-1)[c0: c0 + chunk] = target.lm_head(flat[c0: c0 + chunk]).argmax(-1)
    out = []
    for b in range(B):
        n = int(lengths[b])
        out.append({"tokens": ids[b, :n].clone(), "labels": labels[b, :n].clone(),
                    "feats": {k: by_layer[k][b, :n].to(torch.float16).clone() for k in layers}})
    return out


@torch.inference_mode()
def greedy_answers(target, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos: Sequence[int]) -> List[List[int]]:
    """Batched greedy decoding of right-padded prompts (rows stop at an EOS, kept). Returns the
    answers."""
    from specc.models.llama import pad_prompts

    ids, pos, lengths = pad_prompts(prompts)
    B, N = ids.shape
    target.setup_cache(B, N + max_new_tokens + 2)
    logits, _ = target.forward(ids, pos, logits_at=(lengths - 1).view(B, 1), num_tokens=lengths)
    nxt = logits[:, 0].argmax(-1)  # [B]
    answers: List[List[int]] = [[] for _ in range(B)]
    done = [False] * B
    cur = lengths.clone()  # position of the next token
    eos = set(int(e) for e in eos)
    for _ in range(max_new_tokens):
        for b in range(B):
            if not done[b]:
                answers[b].append(int(nxt[b]))
                done[b] = int(nxt[b]) in eos
        if all(done):
            break
        logits, _ = target.forward(nxt.view(B, 1), cur.view(B, 1))
        nxt = logits[:, 0].argmax(-1)
        cur = cur + 1
    return answers


def write_shard(path: pathlib.Path, records: Sequence[dict], layers: Sequence[int], meta: dict) -> None:
    """Write ``records`` as one shard at ``path`` (no suffix), atomically (see the module docstring)."""
    from safetensors.torch import save_file

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = [int(r["tokens"].shape[0]) for r in records]
    offsets = torch.zeros(len(records) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    tensors = {"tokens": torch.cat([r["tokens"] for r in records]).to(torch.int32),
               "labels": torch.cat([r["labels"] for r in records]).to(torch.int32), "offsets": offsets,
               "prompt_len": torch.tensor([int(r["prompt_len"]) for r in records], dtype=torch.int64)}
    for k in layers:
        tensors[f"h{k}"] = torch.cat([r["feats"][k] for r in records]).contiguous()
    side = dict(meta, ids=[r["id"] for r in records], sources=[r.get("source", "") for r in records],
                categories=[r.get("category", "") for r in records], layers=list(layers), positions=int(offsets[-1]))
    tmp = path.with_name(path.name + ".tmp.safetensors")
    save_file(tensors, str(tmp))
    tmp_json = path.with_name(path.name + ".tmp.json")
    tmp_json.write_text(json.dumps(side) + "\n")
    os.replace(tmp, path.with_suffix(".safetensors"))
    os.replace(tmp_json, path.with_suffix(".json"))


def shard_paths(directory: pathlib.Path) -> List[pathlib.Path]:
    d = pathlib.Path(directory)
    return sorted(p.with_suffix("") for p in d.glob("*.json")
                  if not p.name.endswith(".tmp.json") and p.with_suffix(".safetensors").is_file())


def done_ids(directory: pathlib.Path) -> set:
    return {i for p in shard_paths(directory) for i in json.loads(p.with_suffix(".json").read_text())["ids"]}


@dataclass
class SeqSet:
    """Sequences in memory: ``tokens``/``labels`` int64 ``[P]``, ``offsets [n + 1]``, ``prompt_len [n]``,
    ``kinds`` (``distill`` / ``teacher`` per sequence), ``feats {layer: fp16 [P, H]}``, ``meta``."""

    tokens: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    prompt_len: torch.Tensor
    kinds: List[str]
    feats: Dict[int, torch.Tensor]
    meta: List[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])

    def span(self, i: int):
        return int(self.offsets[i]), int(self.offsets[i + 1])

    def subset(self, idx: Sequence[int]) -> "SeqSet":
        idx = list(idx)
        spans = [self.span(i) for i in idx]
        cat = lambda t: torch.cat([t[a:b] for a, b in spans]) if spans else t[:0]  # noqa: E731
        lengths = torch.tensor([b - a for a, b in spans], dtype=torch.int64)
        offsets = torch.zeros(len(idx) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        return SeqSet(cat(self.tokens), cat(self.labels), offsets, self.prompt_len[idx].clone(),
                      [self.kinds[i] for i in idx], {k: cat(v) for k, v in self.feats.items()},
                      [self.meta[i] for i in idx] if self.meta else [])


def load_shards(paths: Sequence[pathlib.Path], layers: Sequence[int]) -> SeqSet:
    """Concatenate shards, reading only ``h<layer>`` for ``layers``. Raises ValueError naming a shard
    that lacks a layer."""
    from safetensors import safe_open

    toks, labs, plen, kinds, meta = [], [], [], [], []
    feats: Dict[int, list] = {int(k): [] for k in layers}
    lengths = []
    for p in paths:
        side = json.loads(pathlib.Path(p).with_suffix(".json").read_text())
        missing = [k for k in layers if k not in side["layers"]]
        if missing:
            raise ValueError(f"{p}: shard has no hidden states of layers {missing} (it holds {side['layers']})")
        with safe_open(str(pathlib.Path(p).with_suffix(".safetensors")), "pt") as f:
            off = f.get_tensor("offsets")
            toks.append(f.get_tensor("tokens").long())
            labs.append(f.get_tensor("labels").long())
            plen.append(f.get_tensor("prompt_len"))
            for k in feats:
                feats[k].append(f.get_tensor(f"h{k}"))
        lengths += (off[1:] - off[:-1]).tolist()
        kinds += [side["kind"]] * (len(off) - 1)
        meta += [{"id": i, "source": s, "category": c} for i, s, c in
                 zip(side["ids"], side["sources"], side.get("categories") or [""] * len(side["ids"]))]
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return SeqSet(torch.cat(toks), torch.cat(labs), offsets, torch.cat(plen), kinds,
                  {k: torch.cat(v) for k, v in feats.items()}, meta)


def build(target, tokenizer, prompts: Sequence[dict], passages: Sequence[dict], out_dir: pathlib.Path,
          layers: Sequence[int], max_new_tokens: int = 96, gen_batch: int = 16, teacher_batch: int = 8,
          max_prompt_tokens: int = 768, max_passage_tokens: int = 384, log=print) -> dict:
    """Self-distil ``prompts`` and teacher-force ``passages`` into shards under ``out_dir``
    (``distill-*`` / ``teacher-*``), skipping ids already in a whole shard. Returns timings."""
    out_dir = pathlib.Path(out_dir)
    have = done_ids(out_dir) if out_dir.is_dir() else set()
    eos = list(tokenizer.eos_token_ids) + list(target.config.eos_token_ids)
    stats = {"distill_s": 0.0, "teacher_s": 0.0, "distill_tokens": 0, "teacher_tokens": 0}
    todo = [p for p in prompts if p["id"] not in have]
    for b0 in range(0, len(todo), gen_batch):
        t0 = time.perf_counter()
        rows = todo[b0: b0 + gen_batch]
        enc = [tokenizer.apply_chat_template(r["messages"])[-max_prompt_tokens:] for r in rows]
        answers = greedy_answers(target, enc, max_new_tokens, eos)
        recs = record_sequences(target, [e + a for e, a in zip(enc, answers)], layers)
        for r, e, rec in zip(rows, enc, recs):
            rec.update(id=r["id"], source=r.get("source", ""), category=r.get("category", ""), prompt_len=len(e))
        write_shard(out_dir / f"distill-{b0 // gen_batch:05d}-{rows[0]['id']}", recs, layers, {"kind": "distill"})
        stats["distill_s"] += time.perf_counter() - t0
        stats["distill_tokens"] += sum(len(a) for a in answers)
        log(f"distill {b0 + len(rows)}/{len(todo)} ({stats['distill_tokens']} answer tokens, {stats['distill_s']:.0f} s)")
    todo = [p for p in passages if p["id"] not in have]
    for b0 in range(0, len(todo), teacher_batch):
        t0 = time.perf_counter()
        rows = todo[b0: b0 + teacher_batch]
        enc = []
        for r in rows:
            ids = tokenizer.apply_chat_template(r["messages"], add_generation_prompt=False)
            enc.append(ids[:max_passage_tokens])
        recs = record_sequences(target, enc, layers)
        for r, e, rec in zip(rows, enc, recs):
            first = tokenizer.apply_chat_template(r["messages"][:1], add_generation_prompt=True)
            rec.update(id=r["id"], source=r.get("source", ""), category="teacher", prompt_len=min(len(first), len(e) - 1))
        write_shard(out_dir / f"teacher-{b0 // teacher_batch:05d}-{rows[0]['id']}", recs, layers, {"kind": "teacher"})
        stats["teacher_s"] += time.perf_counter() - t0
        stats["teacher_tokens"] += sum(len(e) for e in enc)
        log(f"teacher {b0 + len(rows)}/{len(todo)} ({stats['teacher_tokens']} tokens, {stats['teacher_s']:.0f} s)")
    return stats
