"""Self-distillation: the target answers prompts greedily, and the prompt and answer token ids
are kept (:mod:`specc.train.shards`); a fit computes the target's features from them online
(:mod:`specc.train.features`).

* :func:`answer_stream` -- greedy answers with a continuously refilled batch (a finished row takes
  the next prompt), so long and short answers share the batch without waiting for each other. The
  answer is what greedy decoding emits, so a drafter trained on it sees the contexts it meets at
  inference.
* :func:`run_tokens` -- drives it over a prompt list into resumable shards.
* Teacher forcing (:func:`specc.train.pipeline.teacher_shards`): a prompt plus a real-text answer
  (:func:`reference_ids`), labelled by the target online during the fit.
"""
from __future__ import annotations

import pathlib
import random
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch


def reference_ids(tok, row: dict, prompt_ids: List[int], eos: Sequence[int]) -> Optional[List[int]]:
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


# ------------------------------------------------------------------ token shards (online features)
@torch.inference_mode()
def answer_stream(model, prompts: Sequence[Sequence[int]], max_new: int, eos: Sequence[int], *, rows: int = 64,
                  admit_at: Optional[int] = None, max_prefill_tokens: int = 8192,
                  on_answer: Optional[Callable[[int, List[int], bool], None]] = None) -> List[List[int]]:
    """Greedy answers to ``prompts`` with a continuously refilled batch of ``rows`` cache rows.

    A finished row (an id in ``eos`` emitted, or ``max_new`` tokens) frees its cache row and the next
    prompts are prefilled into the free rows (several at once once ``admit_at`` rows are free,
    default a quarter of ``rows``; right-padded, ``specc.models.llama`` conventions, at most
    ``max_prefill_tokens`` rows x padded length per prefill forward). Each decode step is one forward
    over every running row at its own position, so short answers do not keep the batch waiting.
    Per row the answer is exactly what batch-1 greedy decoding of the same model and dtype emits up
    to floating-point ties (rows never read each other's cache). ``on_answer(i, answer, finished)``
    is called as prompt ``i`` finishes. Returns the answers in prompt order (the final EOS id kept).
    Raises ``PromptError`` for a prompt that leaves no room for ``max_new`` tokens in the cache."""
    from collections import deque

    from specc.errors import PromptError
    from specc.models.llama import pad_prompts

    dev = model.norm.weight.device
    longest = max((len(p) for p in prompts), default=0)
    model.setup_cache(rows, min(model.config.max_model_len, longest + max_new + 1))
    if longest + max_new + 1 > model.max_seq_len:
        raise PromptError(f"a prompt of {longest} tokens + {max_new} new tokens exceeds the cache ({model.max_seq_len})")
    eos_set = set(int(e) for e in eos)
    admit_at = max(1, admit_at or rows // 4)
    queue = deque(range(len(prompts)))
    free = list(range(rows - 1, -1, -1))
    run: Dict[int, dict] = {}  # cache row -> {"i", "pos", "next", "out"}
    answers: List[Optional[List[int]]] = [None] * len(prompts)

    def finish(row: int) -> None:
        st = run.pop(row)
        answers[st["i"]] = st["out"]
        free.append(row)
        if on_answer is not None:
            on_answer(st["i"], st["out"], bool(st["out"]) and st["out"][-1] in eos_set)

    while queue or run:
        if queue and (len(free) >= admit_at or not run):
            take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            # groups under the prefill token bound (prompts arrive sorted by length, so little padding)
            groups, cur = [], []
            for i in take:
                if cur and (len(cur) + 1) * max(len(prompts[j]) for j in cur + [i]) > max_prefill_tokens:
                    groups.append(cur)
                    cur = []
                cur.append(i)
            groups += [cur] if cur else []
            for group in groups:
                rws = [free.pop() for _ in group]
                ids, pos, lengths = pad_prompts([prompts[i] for i in group], device=dev)
                logits, _ = model(ids, pos, logits_at=(lengths - 1)[:, None],
                                  rows=torch.tensor(rws, dtype=torch.long, device=dev))
                first = logits[:, 0].argmax(-1).tolist()
                for r, i, n, t in zip(rws, group, lengths.tolist(), first):
                    run[r] = {"i": i, "pos": n, "next": t, "out": [t]}
                    if t in eos_set or max_new <= 1:
                        finish(r)
        if not run:
            continue
        live = sorted(run)
        ids = torch.tensor([[run[r]["next"]] for r in live], dtype=torch.long, device=dev)
        pos = torch.tensor([[run[r]["pos"]] for r in live], dtype=torch.long, device=dev)
        every = live == list(range(len(live)))
        logits, _ = model(ids, pos, rows=None if every else torch.tensor(live, dtype=torch.long, device=dev))
        nxt = logits[:, 0].argmax(-1).tolist()
        for r, t in zip(live, nxt):
            st = run[r]
            st["pos"] += 1
            st["next"] = t
            st["out"].append(t)
            if t in eos_set or len(st["out"]) >= max_new:
                finish(r)
    return answers  # type: ignore[return-value]


def run_tokens(model, tok, rows: List[dict], out_dir, *, max_new: int = 192, batch: int = 64, seed: int = 0,
               shard_size: int = 256, max_prompt_tokens: int = 1024, meta: Optional[dict] = None,
               log: Callable = print, time_budget_s: Optional[float] = None, tag: str = "distill",
               max_prompts: Optional[int] = None) -> dict:
    """Answer the prompt ``rows`` greedily into token shards (:mod:`specc.train.shards`) under
    ``out_dir``, resuming after the prompts already there.

    The prompts are sorted by token length into chunks of ``shard_size`` and the chunk order is
    shuffled with ``seed``, so a run cut short still covers every length and category, and
    ``max_prompts`` names a reproducible subset (the first prompts of that order). Each chunk is
    answered by :func:`answer_stream` with ``batch`` cache rows and written as one shard
    ``<tag>-NNNN``. Prompts longer than ``max_prompt_tokens`` are skipped. Stops after
    ``time_budget_s`` seconds (at a shard boundary) when given. A ``KeyboardInterrupt`` (SIGINT)
    while a chunk is answered writes the prompts of that chunk answered so far as a shard of their
    own before it propagates, so no finished answer is lost and the next run resumes after them.
    Returns a summary dict (prompts, shards, answer tokens, seconds, answer tokens per second)."""
    from specc.train import shards as S

    t0 = time.time()
    done = S.done_ids(out_dir)
    eos = sorted(set(tok.eos_token_ids) | set(model.config.eos_token_ids))
    enc, skipped = [], 0
    for r in rows:
        p = tok.apply_chat_template(r["messages"])
        if len(p) > max_prompt_tokens:
            skipped += 1
            continue
        enc.append((r, p))
    order = sorted(range(len(enc)), key=lambda i: (len(enc[i][1]), enc[i][0]["id"]))
    chunks = [order[s: s + shard_size] for s in range(0, len(order), shard_size)]
    random.Random(seed).shuffle(chunks)
    if max_prompts is not None:
        flat = [i for c in chunks for i in c][: int(max_prompts)]
        keep = set(flat)
        chunks = [[i for i in c if i in keep] for c in chunks]
    chunks = [[i for i in c if enc[i][0]["id"] not in done] for c in chunks]
    chunks = [c for c in chunks if c]
    existing = sum(1 for p in S.paths(out_dir) if p.name.startswith(tag + "-"))
    log(f"[{tag}] {len(done)} prompts already in shards; {sum(map(len, chunks))} to answer in {len(chunks)} shards "
        f"({skipped} skipped: longer than {max_prompt_tokens} tokens)")
    n_shards = n_answer = n_prompts = 0

    def record(i: int, p: List[int], a: List[int]) -> dict:
        return {"id": enc[i][0]["id"], "category": enc[i][0]["category"], "source": enc[i][0].get("source", ""),
                "prompt": p, "answer": a, "finished": bool(a) and a[-1] in eos}

    def write(recs: List[dict], ts: float, cs: float) -> None:
        m = dict(meta or {})
        m.update({"kind": "distill", "max_new_tokens": max_new, "batch": batch, "seconds": round(time.time() - ts, 1),
                  "cpu_seconds": round(time.process_time() - cs, 1)})
        S.write(pathlib.Path(out_dir) / f"{tag}-{existing + n_shards:04d}", recs, m)

    for s, idx in enumerate(chunks):
        ts, cs = time.time(), time.process_time()
        prompts = [enc[i][1] for i in idx]
        finished: Dict[int, dict] = {}  # position in the chunk -> record, as answers finish
        try:
            answers = answer_stream(model, prompts, max_new, eos, rows=batch,
                                    on_answer=lambda j, a, _: finished.__setitem__(j, record(idx[j], prompts[j], a)))
        except KeyboardInterrupt:  # keep every answer finished so far: a resumed run skips them
            if finished:
                write([finished[j] for j in sorted(finished)], ts, cs)
                log(f"[{tag}] interrupted: kept the {len(finished)} prompts answered so far of shard {s + 1} "
                    f"({tag}-{existing + n_shards:04d}); run the same command again to resume")
            raise
        recs = [record(i, p, a) for i, p, a in zip(idx, prompts, answers)]
        n_tok = sum(len(a) for a in answers)
        write(recs, ts, cs)
        n_shards += 1
        n_answer += n_tok
        n_prompts += len(idx)
        log(f"[{tag}] shard {s + 1}/{len(chunks)}: {len(idx)} prompts, {n_tok} answer tokens, "
            f"{time.time() - ts:.0f}s ({n_tok / max(1e-9, time.time() - ts):.0f} tok/s); "
            f"total {n_answer} answer tokens in {time.time() - t0:.0f}s")
        if time_budget_s is not None and time.time() - t0 > time_budget_s:
            log(f"[{tag}] time budget reached after {s + 1} shards")
            break
    secs = time.time() - t0
    return {"prompts": n_prompts, "shards": n_shards, "answer_tokens": n_answer, "seconds": round(secs, 1),
            "answer_tokens_per_s": round(n_answer / max(secs, 1e-9), 1), "skipped_long": skipped}
