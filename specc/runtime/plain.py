"""Plain decoding with the target model alone (no speculation): the reference every speculative output is
compared with, ``specc generate``'s decoder (:mod:`specc.commands.generate`), and a drafter recipe's measure
of its own target (``specc.methods.draft_model.shallow``).

:func:`generate_outputs` decodes a batch of prompts (right-padded prefill, ``specc.models.llama.prefill``,
then one forward per token) greedily or by sampling (:func:`sample_next`: temperature, then top-k, then
top-p, the order of transformers' logits processors), under ``specc run``'s limits and finish reasons;
:func:`generate_tokens` returns the ids only.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple


def sample_next(logits, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, generator=None):
    """Next tokens ``[B]`` int64 from logits ``[B, V]`` fp32. ``temperature <= 0``: argmax (greedy).
    Else softmax(logits / temperature) restricted to the ``top_k`` most likely tokens (0 = all), then
    to the smallest set whose probability reaches ``top_p`` (Holtzman et al. 2020, nucleus sampling;
    the most likely token always stays), renormalized and sampled with ``generator``."""
    import torch
    if temperature <= 0:
        return logits.argmax(-1)
    scores = logits / temperature
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum - sorted_scores.softmax(-1) >= top_p  # mass before this token already reaches top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def generate_tokens(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    eos_token_ids: Sequence[int] = (), temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, seed: Optional[int] = None,
                    on_token: Optional[Callable[[int, int], None]] = None) -> List[List[int]]:
    """Plain decoding of a batch of prompts (token id lists) with ``model`` (a ``LlamaModel``).

    Returns the generated ids per prompt; see :func:`generate_outputs` (same arguments) for the
    stopping rules, the errors raised, and the finish reasons."""
    return generate_outputs(model, prompts, max_new_tokens, eos_token_ids, temperature, top_k, top_p, seed,
                            on_token)[0]


def generate_outputs(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                     eos_token_ids: Sequence[int] = (), temperature: float = 0.0, top_k: int = 0,
                     top_p: float = 1.0, seed: Optional[int] = None,
                     on_token: Optional[Callable[[int, int], None]] = None) -> Tuple[List[List[int]], List[str]]:
    """Plain decoding of a batch of prompts (token id lists) with ``model`` (a ``LlamaModel``).

    A row stops after emitting one of ``eos_token_ids`` (included; reason ``"eos"``), after
    ``max_new_tokens`` tokens (``"length"``), or when prompt + output reach the model's
    ``max_model_len`` (``"max_model_len"``) — the rules, order and names of ``specc run``
    (``specc.runtime.step.emit_tokens``; vLLM's finish reasons). ``on_token(row, token)`` is
    called per emitted token.

    Returns:
        ``(ids, finish_reasons)``: generated ids per prompt and each prompt's finish reason.
    Raises:
        PromptError: bad sampling parameters, an empty prompt, or a prompt of ``max_model_len``
            tokens or more (no room to generate) — checked by ``specc.runtime.request.check_prompts``,
            the check ``specc run`` applies.
    """
    import torch

    from specc.models.llama import prefill
    from specc.runtime.request import Request, SamplingParams, check_prompts

    limit = int(model.config.max_model_len)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k)
    check_prompts([Request(prompt_ids=list(p), params=params, request_id=str(i)) for i, p in enumerate(prompts)],
                  limit, int(model.config.vocab_size))
    model.setup_cache(len(prompts), limit)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    eos = set(int(e) for e in eos_token_ids)
    out: List[List[int]] = [[] for _ in prompts]
    reasons: List[str] = [""] * len(prompts)
    with torch.inference_mode():
        last, lengths, _ = prefill(model, prompts)  # [B, V], [B]
        pos = lengths.clone()[:, None]  # [B, 1] position of the next token to feed
        for _ in range(max_new_tokens):
            nxt = sample_next(last, temperature, top_k, top_p, gen)  # [B]
            for b, t in enumerate(nxt.tolist()):
                if reasons[b]:
                    continue
                out[b].append(t)
                if on_token is not None:
                    on_token(b, t)
                if t in eos:
                    reasons[b] = "eos"
                elif len(out[b]) >= max_new_tokens:
                    reasons[b] = "length"
                elif len(prompts[b]) + len(out[b]) >= limit:
                    reasons[b] = "max_model_len"
            if all(reasons):
                break
            logits, _ = model(nxt[:, None], pos)  # [B, 1, V]
            last = logits[:, 0]
            live = torch.tensor([not r for r in reasons], dtype=torch.int64).view(-1, 1)  # [B, 1]
            pos = pos + live  # finished rows stay at their last slot (< max_model_len); their output is unused
    return out, reasons
