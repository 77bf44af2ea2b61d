"""Self-distillation: the target answers prompts and its hidden states and argmax are recorded.

Two ways to positions with labels (the target's argmax, i.e. what it would emit next):

* :func:`generate` -- the target answers a batch of prompts greedily (right-padded batch,
  ``specc.models.llama`` conventions); the prompt is one prefill, every answer token one decode
  step. The answer is exactly what greedy decoding emits, so a drafter trained on it sees the
  contexts it will meet at inference.
* :func:`teacher_force` -- prefill only over a prompt plus a real-text answer: one forward gives the
  features and argmax at every answer position (many positions per second, but the context is real
  text, not the target's own output).

Both return records ``{"tokens" [T+1], "labels" [T], "prompt_len", "feats" {layer: [T, H]},
"finished"}`` for :func:`specc.train.data.write_shard`; :func:`run` drives either over a prompt list
with resumable shards.
"""
from __future__ import annotations

import pathlib
import random
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from specc.train import data as D


def _asked(layers: Sequence[int], L: int):
    """Layers to ask the target for when logits are also wanted (the final-norm output ``L`` is
    computed from layer ``L - 1`` with the target's norm)."""
    return tuple(L - 1 if i == L else i for i in layers)


@torch.inference_mode()
def generate(model, prompts: List[List[int]], max_new: int, eos: Sequence[int], layers: Sequence[int]) -> List[dict]:
    """Greedy answers to ``prompts`` (one batch) with hidden states at ``layers``.

    Returns per prompt a record: ``tokens [T+1]`` int64 (prompt + answer; when the answer was cut at
    ``max_new`` the last token is the target's next token), ``labels [T]`` int64 (``-1`` at prompt
    positions except the last, whose label is the first answer token), ``feats {layer: [T, H] fp16}``,
    ``prompt_len``, ``finished`` (the answer ended with an EOS id).
    """
    from specc.models.llama import pad_prompts

    L = model.config.num_layers
    dev = model.norm.weight.device
    ask = _asked(layers, L)
    B = len(prompts)
    ids, pos, lengths = pad_prompts(prompts, device=dev)
    N = ids.shape[1]
    model.setup_cache(B, N + max_new + 1)
    last_logits, hidden = model(ids, pos, hidden_layers=ask, logits_at=(lengths - 1)[:, None])
    hidden = [model.norm(h) if i == L else h for i, h in zip(layers, hidden)]
    eos_t = torch.tensor(sorted(set(int(e) for e in eos)), device=dev)
    nxt = last_logits[:, 0].argmax(-1)  # [B] first answer token
    first = nxt.clone()
    cur = lengths.clone()
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    gen, step_labels, step_feats = [], [], []
    n_gen = torch.zeros(B, dtype=torch.long, device=dev)  # answer tokens per row (incl. a final EOS)
    n_fwd = torch.zeros(B, dtype=torch.long, device=dev)  # answer positions with a label
    for _ in range(max_new):
        gen.append(nxt.clone())
        n_gen += (~done).long()
        done |= torch.isin(nxt, eos_t)
        if bool(done.all()):
            break
        logits, hid = model(nxt[:, None], cur[:, None], hidden_layers=tuple(layers))  # [B,1,V]
        nxt = logits[:, 0].argmax(-1)
        step_labels.append(nxt.clone())
        step_feats.append([h[:, 0].half() for h in hid])
        n_fwd += (~done).long()
        cur = cur + 1
    gt = torch.stack(gen, 1)  # [B, G]
    sl = torch.stack(step_labels, 1) if step_labels else torch.zeros(B, 0, dtype=torch.long, device=dev)
    out = []
    for b in range(B):
        Lb, g, f = int(lengths[b]), int(n_gen[b]), int(n_fwd[b])
        plab = torch.full((Lb,), -1, dtype=torch.long, device=dev)
        plab[-1] = first[b]
        labels = torch.cat([plab, sl[b, :f]])
        T = labels.shape[0]
        tokens = torch.cat([ids[b, :Lb], gt[b, :g]])
        finished = bool(torch.isin(gt[b, g - 1: g], eos_t).any())
        if tokens.shape[0] < T + 1:  # cut by max_new: the next token is the last label
            tokens = torch.cat([tokens, labels[-1:]])
        feats = {}
        for j, layer in enumerate(layers):
            steps = [sf[j][b] for sf in step_feats[:f]]
            feats[layer] = torch.cat([hidden[j][b, :Lb].half()] + ([torch.stack(steps)] if steps else [])).cpu()
        out.append({"tokens": tokens[: T + 1].cpu(), "labels": labels.cpu(), "prompt_len": Lb, "feats": feats,
                    "finished": finished})
    return out


@torch.inference_mode()
def teacher_force(model, prompts: List[List[int]], answers: List[List[int]], layers: Sequence[int],
                  chunk: int = 64) -> List[dict]:
    """One prefill over each ``prompt + answer`` (one right-padded batch): records as :func:`generate`,
    where ``tokens`` is the real text and ``labels`` the target's argmax at every answer position
    (computed from the final-norm output in chunks of ``chunk`` positions; ``-1`` before the last
    prompt position). ``finished`` is True (the answer is whole)."""
    from specc.models.llama import pad_prompts

    L = model.config.num_layers
    dev = model.norm.weight.device
    seqs = [list(p) + list(a) for p, a in zip(prompts, answers)]
    ask = tuple(sorted(set(_asked(layers, L)) | {L - 1}))
    ids, pos, lengths = pad_prompts(seqs, device=dev)
    B, N = ids.shape
    model.setup_cache(B, N + 1)
    _, hidden = model(ids, pos, hidden_layers=ask, logits_at=torch.zeros(B, 1, dtype=torch.long, device=dev))
    by = dict(zip(ask, hidden))
    final = model.norm(by[L - 1])  # [B, N, H]
    out = []
    for b in range(B):
        P, T = len(prompts[b]), int(lengths[b]) - 1  # positions 0..T-1 predict tokens 1..T
        labels = torch.full((T,), -1, dtype=torch.long, device=dev)
        for s in range(P - 1, T, chunk):
            e = min(T, s + chunk)
            labels[s:e] = model.lm_head(final[b, s:e]).argmax(-1)
        feats = {layer: (final[b, :T] if layer == L else by[layer][b, :T]).half().cpu() for layer in layers}
        out.append({"tokens": ids[b, : T + 1].cpu(), "labels": labels.cpu(), "prompt_len": P, "feats": feats,
                    "finished": True})
    return out


def run(model, tok, rows: List[dict], out_dir, layers: Sequence[int], *, mode: str = "distill",
        max_new: int = 96, batch: int = 32, seed: int = 0, shard_batches: int = 4, max_prompt_tokens: int = 1024,
        meta: Optional[dict] = None, log: Callable = print, time_budget_s: Optional[float] = None,
        tag: Optional[str] = None, max_batches: Optional[int] = None) -> dict:
    """Answer (``mode="distill"``) or teacher-force (``mode="teacher"``, rows carry ``reference``) the
    prompt ``rows`` into shards under ``out_dir``, resuming after prompts already there.

    All prompts are grouped by token length into batches of ``batch`` (less padding) and the batch
    order is shuffled with ``seed``, so a run cut short still covers every length and category, and
    ``max_batches`` (the first batches of that order) names a reproducible subset. Prompts already in
    a shard are skipped; a shard is written every ``shard_batches`` batches. Prompts longer than
    ``max_prompt_tokens`` are skipped. Stops after ``time_budget_s`` seconds (at a shard boundary) if
    given. Shards are named ``<tag>-NNNN`` (default tag: ``mode``). Returns a summary dict."""
    t0 = time.time()
    done = D.done_ids(out_dir)
    eos = sorted(set(tok.eos_token_ids) | set(model.config.eos_token_ids))
    enc, skipped = [], 0
    for r in rows:
        p = tok.apply_chat_template(r["messages"])
        if len(p) > max_prompt_tokens:
            skipped += 1
            continue
        a = None
        if mode == "teacher":
            a = _reference_ids(tok, r, p, eos)
            if a is None:
                skipped += 1
                continue
        enc.append((r, p, a))
    order = sorted(range(len(enc)), key=lambda i: len(enc[i][1]) + (len(enc[i][2]) if enc[i][2] else 0))
    batches = [order[s: s + batch] for s in range(0, len(order), batch)]
    random.Random(seed).shuffle(batches)
    if max_batches is not None:
        batches = batches[: int(max_batches)]
    batches = [[i for i in idx if enc[i][0]["id"] not in done] for idx in batches]
    n_done = sum(1 for idx in batches if not idx)
    batches = [idx for idx in batches if idx]
    tag = tag or mode
    existing = sum(1 for p in D.shard_paths(out_dir) if p.name.startswith(tag + "-"))
    log(f"[{mode}] {len(done)} prompts already in shards ({n_done} whole batches), {sum(map(len, batches))} to do "
        f"in {len(batches)} batches ({skipped} skipped: longer than {max_prompt_tokens} tokens)")
    pending, n_shards, positions, answer_tok = [], 0, 0, 0
    shard_t0, shard_c0 = time.time(), time.process_time()
    for s, idx in enumerate(batches):
        tb = time.time()
        if mode == "distill":
            recs = generate(model, [enc[i][1] for i in idx], max_new, eos, layers)
        else:
            recs = teacher_force(model, [enc[i][1] for i in idx], [enc[i][2] for i in idx], layers)
        for i, rec in zip(idx, recs):
            rec.update({"id": enc[i][0]["id"], "category": enc[i][0]["category"], "source": enc[i][0].get("source", "")})
        pending += recs
        npos = sum(int(r["labels"].shape[0]) for r in recs)
        nans = sum(int(r["labels"].shape[0]) - r["prompt_len"] + 1 for r in recs)
        positions += npos
        answer_tok += nans
        log(f"[{mode}] batch {s + 1}/{len(batches)}: {len(idx)} prompts, {npos} positions, {nans} answer "
            f"positions, {time.time() - tb:.1f}s")
        last = s + 1 == len(batches)
        over = time_budget_s is not None and time.time() - t0 > time_budget_s
        if len(pending) and ((s + 1) % shard_batches == 0 or last or over):
            m = dict(meta or {})
            m.update({"kind": mode, "max_new_tokens": max_new if mode == "distill" else None,
                      "seconds": round(time.time() - shard_t0, 1),
                      "cpu_seconds": round(time.process_time() - shard_c0, 1), "batch": batch})
            D.write_shard(pathlib.Path(out_dir) / f"{tag}-{existing + n_shards:04d}", pending, layers, m)
            n_shards += 1
            pending = []
            shard_t0, shard_c0 = time.time(), time.process_time()
        if over:
            log(f"[{mode}] time budget reached after {s + 1} batches")
            break
    return {"prompts": sum(map(len, batches)), "shards": n_shards, "positions": positions, "answer_positions": answer_tok,
            "seconds": round(time.time() - t0, 1), "skipped_long": skipped}


def _reference_ids(tok, row: dict, prompt_ids: List[int], eos: Sequence[int]) -> Optional[List[int]]:
    """The reference answer's ids as the chat template writes an assistant turn after the prompt,
    up to and including its end-of-turn id; None if the template does not extend the prompt."""
    full = tok.apply_chat_template(list(row["messages"]) + [{"role": "assistant", "content": row["reference"]}],
                                   add_generation_prompt=False)
    if full[: len(prompt_ids)] != list(prompt_ids):
        return None
    ans = full[len(prompt_ids):]
    for j, t in enumerate(ans):
        if t in eos:
            return ans[: j + 1]
    return ans or None
