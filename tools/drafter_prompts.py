"""Training prompts for the EAGLE heads that are not templates: written by the target itself.

Two rounds, both offline and seeded (``tools/train_drafter.py prompts`` / ``derive`` call these):

1. ``sampled_prompts``: the target writes user turns. Each starts from an opening stem (``STEMS``: the
   ways people open a request, across Spec-Bench's categories) after the chat template's
   ``<|im_start|>user`` header, and the target continues it by temperature/top-p sampling until it
   closes the turn (``<|im_end|>``); turns that do not close within the budget are dropped.
2. ``derived_prompts``: from the target's greedy answers to round 1, the prompt shapes that carry a
   passage or a history: summarise / answer-from-context over an answer (summarization, RAG), a
   follow-up turn after the answer (multi-turn) and translation of one of its sentences.

Neither round reads the shipped evaluation set ``specc/data/prompts.jsonl``.
"""
from __future__ import annotations

import random
import re
from typing import List, Sequence

import torch

STEMS = [
    "How do I", "How can I", "What is the difference between", "Can you explain", "Explain how",
    "Why do", "Why is", "What are the benefits of", "What are some", "Describe", "Tell me about",
    "Give me tips for", "Give me three ideas for", "List five", "Suggest", "Help me plan",
    "I need advice on", "What should I", "Is it true that", "Compare", "What happens when",
    "Write a short story about", "Write a poem about", "Write an email to", "Write a short message",
    "Write a paragraph about", "Write a product description for", "Create a recipe for",
    "Create a workout plan", "Draft a letter", "Summarize the main ideas of", "What is the history of",
    "Who was", "Where can I", "When should I", "How many", "How much", "Calculate", "If I have",
    "A store sells", "Solve", "What is the best way to", "Can you recommend", "What does it mean when",
    "Translate into Spanish:", "Translate into French:", "Translate into German:", "How would you say",
    "Rewrite this sentence", "Correct the grammar:", "What are the pros and cons of", "Define",
    "Outline the steps to", "What causes", "How does", "I am learning", "My friend says", "I want to",
]

FOLLOW_UPS = [
    "Can you make that shorter?", "Thanks! Can you give me an example?", "Explain it to a ten-year-old.",
    "What is the most important point?", "Can you put that in a list?", "Why is that?",
    "Can you say more about the first point?", "Now write it more formally.", "What should I do first?",
    "Is there anything I should avoid?", "Can you summarise your answer in one sentence?",
    "Thanks. What else should I know?",
]

# Instruction wordings are our own: tests/test_train_prompts_held_out.py checks that no 8-word span of
# a training prompt occurs in the shipped evaluation set.
SUMMARY_ASKS = [
    "Condense this passage into two sentences.\n\n{d}", "Give a short summary of this passage:\n\n{d}",
    "What is the main idea of the passage below?\n\n{d}", "Boil this article down to three sentences:\n\n{d}",
    "Write a one-line summary of this passage.\n\n{d}",
]

RAG_ASKS = [
    "Using nothing but the passage below, reply to the question.\n\nPassage: {d}\n\nQuestion: {q}",
    "Read the passage and answer the question.\n\nPassage: {d}\n\nQuestion: {q}",
    "Use the context to answer.\nContext: {d}\nQuestion: {q}",
]

TRANSLATE_ASKS = [
    "Put this sentence into French: {s}", "Please give me the German for: {s}", "In Spanish, how do you write: {s}",
    "Translate into Italian: {s}",
]


@torch.inference_mode()
def sample_continuations(model, prefixes: List[List[int]], max_new: int, stop_ids: set, temperature: float,
                         top_p: float, generator: torch.Generator) -> List[List[int] | None]:
    """Sample up to ``max_new`` tokens after each prefix (one right-padded batch, ``specc.models.llama``
    conventions); temperature then nucleus (top-p) filtering (Holtzman et al. 2020).

    Returns per prefix the sampled ids *before* the first stop id, or ``None`` when no stop id came
    within ``max_new`` tokens.
    """
    from specc.models.llama import pad_prompts

    B = len(prefixes)
    ids, pos, lengths = pad_prompts(prefixes)
    model.setup_cache(B, ids.shape[1] + max_new + 1)
    logits, _ = model(ids, pos, logits_at=(lengths - 1)[:, None])  # [B, 1, V]
    logits = logits[:, 0]
    cur = lengths.clone()
    out: List[List[int]] = [[] for _ in range(B)]
    done = [False] * B
    for _ in range(max_new):
        probs = torch.softmax(logits / temperature, dim=-1)  # [B, V]
        sp, si = probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p  # nucleus: smallest prefix with mass >= top_p
        sp = sp * keep
        nxt = si.gather(1, torch.multinomial(sp / sp.sum(-1, keepdim=True), 1, generator=generator))[:, 0]  # [B]
        for b in range(B):
            if not done[b]:
                if int(nxt[b]) in stop_ids:
                    done[b] = True
                else:
                    out[b].append(int(nxt[b]))
        if all(done):
            break
        logits, _ = model(nxt[:, None], cur[:, None])
        logits = logits[:, 0]
        cur = cur + 1
    return [o if d else None for o, d in zip(out, done)]


def _user_header(tok) -> List[int]:
    """Token ids of the chat template up to the start of a user turn's text (system prompt included)."""
    marker = "\u0000MARK\u0000"
    text = tok.hf.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                      add_generation_prompt=False)
    return tok.encode(text[: text.index(marker)])


def sampled_prompts(model, tok, n: int, seed: int, batch: int = 64, max_new: int = 40,
                    temperature: float = 0.8, top_p: float = 0.95, log=print, save=None) -> List[dict]:
    """``n`` user turns written by the target (see the module docstring): ``{"id", "category":
    "sampled", "messages"}``. Duplicates, turns under 4 words and unclosed turns are dropped.
    ``save(rows)`` (optional) is called after every batch with the turns kept so far."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    header = _user_header(tok)
    stop = set(tok.eos_token_ids)  # SmolLM2-Instruct's EOS is <|im_end|>, which closes the turn
    out, seen = [], set()
    rounds = 0
    while len(out) < n and rounds < 4 * (n // batch + 1):
        rounds += 1
        stems = [rng.choice(STEMS) for _ in range(batch)]
        conts = sample_continuations(model, [header + tok.encode(s) for s in stems], max_new, stop,
                                     temperature, top_p, gen)
        for s, c in zip(stems, conts):
            if c is None:
                continue
            text = (s + tok.decode(c)).strip()
            if len(text.split()) < 4 or text in seen or "<|" in text:
                continue
            seen.add(text)
            out.append({"id": f"sampled-{len(out):04d}", "category": "sampled",
                        "messages": [{"role": "user", "content": text}]})
        log(f"[prompts] sampled round {rounds}: {len(out)}/{n} kept")
        if save is not None:
            save(out[:n])
    return out[:n]


def _sentences(text: str) -> List[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 6 <= len(s.split()) <= 30]


def derived_prompts(answered: Sequence[dict], seed: int) -> List[dict]:
    """Round 2 from ``answered`` = ``[{"id", "messages", "answer"}]`` (round-1 prompts with the target's
    greedy answer text): for each answer of at least 40 words, one summarization or RAG prompt over it,
    and for the others (and some long ones) a follow-up turn or a translation of one of its sentences."""
    rng = random.Random(seed)
    out = []
    for r in answered:
        ans = r["answer"].strip()
        words = len(ans.split())
        if words < 8:
            continue
        sents = _sentences(ans)
        if words >= 40 and rng.random() < 0.7:
            if rng.random() < 0.5 or not sents:
                cat, text = "summarization", rng.choice(SUMMARY_ASKS).format(d=ans)
            else:
                q = rng.choice(["What is the main point of the text?", "What does the text recommend?",
                                "Which example does the text give?", "According to the text, why does this matter?",
                                f"What does the text say about {' '.join(rng.choice(sents).split()[:4])}...?"])
                cat, text = "rag", rng.choice(RAG_ASKS).format(d=ans, q=q)
            messages = [{"role": "user", "content": text}]
        elif sents and rng.random() < 0.35:
            cat = "translation"
            messages = [{"role": "user", "content": rng.choice(TRANSLATE_ASKS).format(s=rng.choice(sents))}]
        else:
            cat = "multi_turn"
            messages = list(r["messages"]) + [{"role": "assistant", "content": ans},
                                               {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
        out.append({"id": f"derived-{len(out):04d}", "category": cat, "from": r["id"], "messages": messages})
    return out
