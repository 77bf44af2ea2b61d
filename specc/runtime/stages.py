"""The stage programs a state runs: draft, verify, accept, extend. Each is ``fn(ctx, bufs, *constants)``
over a state's static buffers (:class:`specc.runtime.state.StateBuffers`); generated state modules
call exactly these functions with the constants of :func:`specc.programs.state_programs`.

Verification follows gpt-fast's position-indexed KV (anchors A1): the verify forward writes the
target KV of each request's verify rows at positions ``seq_len - 1 + i``; rows past the accepted
prefix are simply overwritten by a later step and hidden by the causal-by-position mask.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from specc.drafters.base import DraftSampling, VerifyStep, clip_num_valid
from specc.kernels import block_verify, greedy_verify, process_logits, rejection_verify, synthetic_verify


def draft_none(ctx: Any, bufs: Any) -> None:
    """κ = 0: nothing to propose."""
    bufs.num_valid.zero_()


def draft_chain(ctx: Any, bufs: Any, num_steps: int, draft_sampling: str, every_position: bool = False) -> None:
    """Ask the drafter for κ = ``num_steps`` tokens per row and store them, clipped per row.

    ``every_position`` (the synthetic rule, whose acceptance ignores the tokens): every row verifies
    all its ``max_draft`` positions even where the drafter proposed fewer (an n-gram miss).

    Writes: ``bufs.draft_tokens [B, K]`` (invalid entries 0), ``bufs.num_valid [B]``
    (``min(proposal.num_valid, batch.max_draft)``, 0 for padding rows), ``bufs.confidence [B, K]``
    (the drafter's estimate, 1 where it gives none, 0 past num_valid), ``bufs.draft_probs [B, K, V]``
    for probabilistic drafts, and the drafts into ``bufs.input_ids[:, 1:]``.
    """
    batch = bufs.batch
    noise = bufs.draft_noise if draft_sampling == "probabilistic" else None  # [B, K, V] Exp(1)
    sampling = DraftSampling(mode=draft_sampling, exp_noise=noise)
    prop = ctx.drafter.propose(batch, num_steps, sampling)
    proposed = prop.num_valid.to(bufs.num_valid.device)
    if every_position:
        proposed = torch.full_like(proposed, num_steps)
    valid = clip_num_valid(proposed, batch.max_draft, batch.active)  # [B]
    pos = torch.arange(num_steps, device=valid.device).view(1, -1)  # [1, K]
    inside = pos < valid.view(-1, 1)  # [B, K]
    tokens = torch.where(inside, prop.tokens.to(bufs.draft_tokens.device), 0)  # [B, K]
    bufs.num_valid.copy_(valid)
    bufs.draft_tokens.copy_(tokens)
    bufs.input_ids[:, 1:].copy_(tokens)
    conf = prop.confidence if prop.confidence is not None else torch.ones_like(bufs.confidence)
    bufs.confidence.copy_(torch.where(inside, conf.to(bufs.confidence.dtype), 0.0))
    if bufs.draft_probs is not None:
        bufs.draft_probs.copy_(prop.probs)


def draft_parallel(ctx: Any, bufs: Any, num_steps: int, draft_sampling: str, every_position: bool = False) -> None:
    """One draft pass emits the whole block of κ = ``num_steps`` tokens per row
    (``drafter.propose_block``: DFlash/DSpark's non-causal pass over [bonus, MASK × κ], PARD's and
    P-EAGLE's mask-token pass), stored like :func:`draft_chain`'s proposals (same buffers, same
    clipping; ``every_position`` for the synthetic rule)."""
    batch = bufs.batch
    noise = bufs.draft_noise if draft_sampling == "probabilistic" else None  # [B, K, V] Exp(1)
    prop = ctx.drafter.propose_block(batch, num_steps, DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_block(bufs, prop, num_steps, every_position)


def _store_block(bufs: Any, prop: Any, num_steps: int, every_position: bool) -> None:
    """Write a block proposal into the state's buffers: ``draft_tokens [B, K]`` (0 past each row's
    valid drafts), ``num_valid [B]``, ``confidence [B, K]`` (1 where the drafter gives none, 0 past
    num_valid), ``draft_probs [B, K, V]`` for probabilistic drafts, and ``input_ids[:, 1:]``."""
    batch = bufs.batch
    proposed = prop.num_valid.to(bufs.num_valid.device)
    if every_position:
        proposed = torch.full_like(proposed, num_steps)
    valid = clip_num_valid(proposed, batch.max_draft, batch.active)  # [B]
    inside = torch.arange(num_steps, device=valid.device).view(1, -1) < valid.view(-1, 1)  # [B, K]
    tokens = torch.where(inside, prop.tokens.to(bufs.draft_tokens.device), 0)  # [B, K]
    bufs.num_valid.copy_(valid)
    bufs.draft_tokens.copy_(tokens)
    bufs.input_ids[:, 1:].copy_(tokens)
    conf = prop.confidence if prop.confidence is not None else torch.ones_like(bufs.confidence)
    bufs.confidence.copy_(torch.where(inside, conf.to(bufs.confidence.dtype), 0.0))
    if bufs.draft_probs is not None:
        bufs.draft_probs.copy_(prop.probs)


def verify_chain(ctx: Any, bufs: Any) -> None:
    """Target forward over the W = κ + 1 verify rows of every request; in eager mode a ragged
    forward in which row b costs ``bufs.num_tokens[b]`` tokens (``LlamaModel.forward(num_tokens=)``).

    Reads ``bufs.input_ids/positions/cache_slots [B, W]``; writes ``bufs.logits [B, W, V]`` fp32 and
    ``bufs.hidden`` (list of ``[B, W, H]`` at ``ctx.hidden_layers``).
    """
    logits, hidden = ctx.target.forward(bufs.input_ids, bufs.positions, bufs.cache_slots, None,
                                        hidden_layers=ctx.hidden_layers,
                                        num_tokens=bufs.num_tokens if bufs.ragged else None)
    bufs.logits = logits
    bufs.hidden = list(hidden)


def _kernel(ctx: Any, bufs: Any, default: Callable) -> Callable:
    """The artifact's specialized verify kernel (``bufs.kernels["verify"]``) when loaded and
    specialized to this step's verify width, else the generic ``default`` (a width-trimmed step)."""
    name = bufs.kernels.get("verify") if bufs.kernels else None
    module = ctx.kernel_modules.get(name) if name else None
    if module is None or getattr(module, "NUM_DRAFT_TOKENS", None) != bufs.input_ids.shape[1]:
        return default
    return module.verify


def accept_greedy(ctx: Any, bufs: Any) -> None:
    """Greedy rule (``specc.kernels.greedy_verify``, or the artifact's variant): accept drafts equal
    to the target argmax. Writes ``bufs.result`` (VerifyOutput)."""
    fn = _kernel(ctx, bufs, greedy_verify)
    bufs.result = fn(bufs.draft_tokens, bufs.logits, bufs.num_valid, backend=ctx.kernel_backend)


def _target_probs(bufs: Any) -> torch.Tensor:
    """p = processed target logits ``[B, W, V]`` at each row's temperature / top-k / top-p."""
    return process_logits(bufs.logits, bufs.temperature, bufs.top_k if bufs.use_top_k else None,
                          bufs.top_p if bufs.use_top_p else None)


def accept_standard(ctx: Any, bufs: Any, probabilistic_q: bool) -> None:
    """Standard rule (``specc.kernels.rejection_verify``, or the artifact's variant):
    p = processed target logits ``[B, W, V]``; q one-hot (greedy drafts) or ``bufs.draft_probs``
    (probabilistic drafts). Temperature-0 rows reduce to greedy exactly (``process_logits`` gives
    them a one-hot p), so an eager step whose rows are all greedy (``bufs.all_greedy``) takes
    ``greedy_verify`` directly and skips the softmax over the vocabulary. Writes ``bufs.result``."""
    if bufs.all_greedy:  # eager step with only temperature-0 rows: the standard rule is the greedy rule
        bufs.result = greedy_verify(bufs.draft_tokens, bufs.logits, bufs.num_valid, backend=ctx.kernel_backend)
        return
    q = bufs.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, bufs, rejection_verify)
    bufs.result = fn(bufs.draft_tokens, _target_probs(bufs), q, bufs.uniforms, bufs.exp_noise, bufs.num_valid,
                     backend=ctx.kernel_backend)


def accept_block(ctx: Any, bufs: Any, probabilistic_q: bool) -> None:
    """Block verification (``specc.kernels.block_verify``, or the artifact's variant; Sun et al. 2024):
    p = processed target logits ``[B, W, V]``, q one-hot or ``bufs.draft_probs``; accepts the longest
    prefix whose joint test passes. Temperature-0 rows reduce to greedy exactly, so an eager step whose
    rows are all greedy takes ``greedy_verify``. Writes ``bufs.result``."""
    if bufs.all_greedy:
        bufs.result = greedy_verify(bufs.draft_tokens, bufs.logits, bufs.num_valid, backend=ctx.kernel_backend)
        return
    q = bufs.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, bufs, block_verify)
    bufs.result = fn(bufs.draft_tokens, _target_probs(bufs), q, bufs.uniforms, bufs.exp_noise, bufs.num_valid,
                     backend=ctx.kernel_backend)


def accept_synthetic(ctx: Any, bufs: Any, conditional_rates: Sequence[float]) -> None:
    """Synthetic rule (``specc.kernels.synthetic_verify``): draft i accepted with the conditional rate
    c_i whatever the tokens (its draft program verifies every position, ``draft_chain(...,
    every_position=True)``, so a lookup miss does not cut the curve short). An ablation harness: the
    output is not the target's distribution. Writes ``bufs.result``."""
    k = bufs.draft_tokens.shape[1]
    bufs.result = synthetic_verify(bufs.draft_tokens, _target_probs(bufs), conditional_rates[:k], bufs.uniforms,
                                   bufs.exp_noise, bufs.num_valid)


def extend_none(ctx: Any, bufs: Any) -> None:
    """No drafter to extend."""


def extend_drafter(ctx: Any, bufs: Any) -> None:
    """Hand the verify outcome to the drafter (EAGLE refreshes its KV over accepted tokens here; the
    n-gram drafter learns its acceptance estimate). Runs at κ = 0 too."""
    res = bufs.result
    ctx.drafter.commit(bufs.batch, VerifyStep(
        input_ids=bufs.input_ids, positions=bufs.positions, cache_slots=bufs.cache_slots,
        accepted=res.accepted_len.to(torch.int64), bonus=res.bonus, target_hidden=bufs.hidden,
        num_valid=bufs.num_valid, num_steps=bufs.draft_tokens.shape[1]))
