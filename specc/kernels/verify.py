"""Chain verification: the greedy rule and standard rejection sampling, as torch references and a
dispatcher to their Triton kernels (`specc.kernels.verify_triton`).

Both rules take κ = K draft tokens per request and the target's distribution at the K + 1 verify
positions (position i predicts the token after draft i - 1; position 0 follows the last committed
token) and return, per request, how many drafts were accepted and the bonus token: the target's own
token at the first rejected position, or at position K when every draft was accepted. Every step thus
emits accepted_len + 1 tokens (bonus included).

Drafts are clipped per request by `num_valid` [B]: positions i >= num_valid[b] are never accepted,
and a draft token outside [0, V) (e.g. the placeholder -1) ends the valid drafts the same way. Values
of num_valid outside [0, K] act as if clamped. Nothing here reads tensor values on the host, so both
rules can be captured in a CUDA graph.

The torch references and the Triton kernels compute every decision with the same fp32 operations
(a compare of u * q(x) against p(x), an elementwise max(p - q, 0), an IEEE-rounded division by the
exponential noise, a first-index argmax), so they return identical tokens from identical inputs.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specc.kernels.verify_common import (  # noqa: F401  (re-exported)
    VerifyOutput,
    _accepted_prefix,
    _check_drafts,
    _check_rejection_inputs,
    _finish,
    _num_valid,
    _target_argmax,
    _valid_drafts,
    resolve_backend,
)

__all__ = ["VerifyOutput", "greedy_verify", "rejection_verify", "synthetic_verify", "resolve_backend"]


def greedy_verify_torch(
    draft_tokens: torch.Tensor, target: torch.Tensor, num_valid: torch.Tensor | None = None
) -> VerifyOutput:
    """Torch reference of `greedy_verify` (same arguments, same result)."""
    batch, num_steps = _check_drafts(draft_tokens)
    target_argmax = _target_argmax(target, batch, num_steps)  # [B, K+1]
    if num_steps == 0:  # plain decoding: nothing to accept, the bonus is the argmax
        none = torch.zeros(batch, dtype=torch.int32, device=draft_tokens.device)
        return VerifyOutput(none, target_argmax.clone(), target_argmax[:, 0].clone(), torch.zeros_like(target_argmax))
    valid = _num_valid(num_valid, batch, num_steps, draft_tokens.device)
    match = (draft_tokens == target_argmax[:, :num_steps]) & _valid_drafts(draft_tokens, valid, 2**62)  # [B, K]
    accepted = _accepted_prefix(match)  # [B]
    bonus = target_argmax.gather(1, accepted.view(batch, 1)).view(batch)  # [B]
    return _finish(accepted, draft_tokens, bonus)


def greedy_verify(
    draft_tokens: torch.Tensor,
    target: torch.Tensor,
    num_valid: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> VerifyOutput:
    """Greedy chain verification: accept drafts while they equal the target's argmax.

    Rule: accept draft i iff i < num_valid, every earlier draft was accepted, and draft_tokens[b, i]
    == argmax target[b, i]; the bonus is the target argmax at the first non-accepted position (vLLM
    0.33.0 RSU:599-617, 727-733; SGLang `verify_tree_greedy` for a chain, eagle_utils.py:521-800).
    No randomness. Greedy speculative output therefore equals plain greedy decoding token for token.

    Args:
        draft_tokens: `[B, K]` int64 draft tokens (K = κ, may be 0).
        target: `[B, K+1, V]` float target logits (or probabilities), or `[B, K+1]` int64 target argmax.
            From logits the argmax takes the first index on ties (as `torch.argmax`).
        num_valid: `[B]` int (any integer dtype) drafts proposed per request, or None for all K.
        backend: "auto" (Triton on CUDA, torch elsewhere), "torch" or "triton" (on CPU tensors the
            Triton kernel needs `TRITON_INTERPRET=1` in the environment before its first call).
    Returns:
        `VerifyOutput(accepted_len [B] int32, output_tokens [B, K+1] int64, bonus [B] int64,
        accept_index [B, K+1] int64)` (a chain: rows 0..accepted_len).
    Raises:
        ValueError: on wrong shapes/dtypes or an unknown backend. SpeccError: backend="triton" on CPU
        without TRITON_INTERPRET=1, or triton missing.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return greedy_verify_torch(draft_tokens, target, num_valid)
    from specc.kernels import verify_triton

    return verify_triton.greedy_verify_triton(draft_tokens, target, num_valid)


def rejection_verify_torch(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
) -> VerifyOutput:
    """Torch reference of `rejection_verify` (same arguments, same result)."""
    batch, num_steps, vocab = _check_rejection_inputs(draft_tokens, target_probs, draft_probs, uniforms, exp_noise)
    valid = _num_valid(num_valid, batch, num_steps, draft_tokens.device)
    rows = torch.arange(batch, device=draft_tokens.device)
    proposed = _valid_drafts(draft_tokens, valid, vocab)  # [B, K]
    x = torch.where(proposed, draft_tokens, torch.zeros_like(draft_tokens))  # [B, K], safe index
    p_x = target_probs[:, :num_steps].gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)  # one-hot q: q(x) = 1
    else:
        q_x = draft_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, K]
    accept = proposed & (uniforms * q_x < p_x)  # [B, K]; u < p/q without a division
    accepted = _accepted_prefix(accept)  # [B] int64
    bonus = _bonus(accepted, proposed, x, target_probs, draft_probs, exp_noise)
    return _finish(accepted, draft_tokens, bonus)


def _bonus(accepted: torch.Tensor, proposed: torch.Tensor, x: torch.Tensor, target_probs: torch.Tensor,
           draft_probs: torch.Tensor | None, exp_noise: torch.Tensor) -> torch.Tensor:
    """The bonus token ``[B]`` int64 after ``accepted [B]`` drafts: from the residual
    normalize(max(p − q, 0)) at a rejected proposed draft (one-hot q when ``draft_probs`` is None),
    else from p at position ``accepted`` (exponential race with ``exp_noise [B, V]``)."""
    batch, num_steps = x.shape
    vocab = target_probs.shape[2]
    rows = torch.arange(batch, device=x.device)
    p_a = target_probs[rows, accepted]  # [B, V], target at the bonus position
    if num_steps == 0:
        bonus_weights = p_a
    else:
        stop = accepted.clamp(max=num_steps - 1)  # [B]
        rejected = (accepted < num_steps) & proposed[rows, stop]  # [B], stopped on a proposed draft
        if draft_probs is None:
            vocab_ids = torch.arange(vocab, device=x.device).view(1, vocab)
            residual = torch.where(vocab_ids == x[rows, stop].view(batch, 1), torch.zeros_like(p_a), p_a)  # [B, V]
        else:
            residual = torch.clamp_min(p_a - draft_probs[rows, stop], 0.0)  # [B, V]
        use_residual = rejected & (residual.amax(dim=-1) > 0)  # [B]; empty residual -> p (see rejection_verify)
        bonus_weights = torch.where(use_residual.view(batch, 1), residual, p_a)  # [B, V]
    return torch.div(bonus_weights, exp_noise).argmax(dim=-1)  # [B] int64, exponential race


def rejection_verify(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> VerifyOutput:
    """Standard speculative (rejection) sampling for a chain (Leviathan et al. 2023, Chen et al. 2023).

    For i = 0, 1, ... while drafts are accepted: accept draft x_i with probability min(1, p_i(x_i) /
    q_i(x_i)), decided as `u[b, i] * q_i(x_i) < p_i(x_i)`. At the first rejected draft i the bonus is
    drawn from normalize(max(p_i - q_i, 0)); for a one-hot q (draft_probs None, greedy drafts) that is
    p_i with x_i removed. If every proposed draft was accepted (or none was proposed: K = 0, num_valid
    = 0, a placeholder draft) the bonus is drawn from p at the next position. The emitted tokens are
    then distributed exactly as sampling from p one token at a time. Sources: vLLM 0.33.0 RSU:660-697
    (acceptance), RSU:905-961 (resample), RS1:937-951 (u against p/q).

    Empty residual: if max(p_i - q_i, 0) is zero everywhere then p_i <= q_i and, both summing to 1,
    p_i = q_i wherever either is positive, so acceptance had probability min(1, p/q) = 1 and a
    rejection has probability zero in exact arithmetic; it can only come from rounding. The bonus is
    then drawn from p_i (any choice keeps the output distribution; p is the natural one).

    Temperature-0 rows: pass a one-hot p (`process_logits` does) and the rule reduces to greedy.

    Args:
        draft_tokens: `[B, K]` int64 (K = κ, may be 0).
        target_probs: `[B, K+1, V]` fp32 target probabilities p after `process_logits`.
        draft_probs: `[B, K, V]` fp32 draft probabilities q the drafts were sampled from (after the
            same `process_logits`), or None for one-hot q (greedy drafts; q(x) = 1).
        uniforms: `[B, K]` fp32 in [0, 1), the acceptance draws.
        exp_noise: `[B, V]` fp32, i.i.d. Exp(1) samples > 0; bonus = argmax_v w(v) / exp_noise(v) with
            w the (unnormalized) bonus weights, a draw from w / sum(w) (no normalization needed).
            `draw_randomness` makes both tensors.
        num_valid: `[B]` int drafts proposed per request, or None for all K.
        backend: "auto" (Triton on CUDA, torch elsewhere), "torch" or "triton" (on CPU tensors the
            Triton kernel needs `TRITON_INTERPRET=1` in the environment before its first call).
    Returns:
        `VerifyOutput(accepted_len [B] int32, output_tokens [B, K+1] int64, bonus [B] int64,
        accept_index [B, K+1] int64)` (a chain: rows 0..accepted_len).
    Raises:
        ValueError: on wrong shapes/dtypes or an unknown backend. SpeccError: backend="triton" on CPU
        without TRITON_INTERPRET=1, or triton missing.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return rejection_verify_torch(draft_tokens, target_probs, draft_probs, uniforms, exp_noise, num_valid)
    from specc.kernels import verify_triton

    return verify_triton.rejection_verify_triton(draft_tokens, target_probs, draft_probs, uniforms, exp_noise, num_valid)


def synthetic_verify(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    conditional_rates: Sequence[float] | torch.Tensor,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
) -> VerifyOutput:
    """Synthetic acceptance, an ablation harness with vLLM's semantics
    (vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py:612-614, 691-693): draft i is accepted iff ``u[b, i] < c_i`` for every draft up to
    it, whatever the tokens and for greedy and sampled requests alike, so P(first i+1 drafts
    accepted) = Π c_j, the unconditional rate r_i. The token at the first rejection comes from the
    normal resample path (p with the rejected draft removed, one-hot q); after all accepted drafts it
    is drawn from p. **The output is not the target's distribution** (nor, for greedy requests, plain
    greedy decoding): it measures what acceptance would buy.

    Args:
        draft_tokens: ``[B, K]`` int64. target_probs: ``[B, K+1, V]`` fp32 after ``process_logits``.
        conditional_rates: K conditional rates c_i in [0, 1] (``specc.compiler.programs.synthetic_conditional_rates``).
        uniforms: ``[B, K]`` fp32 in [0, 1). exp_noise: ``[B, V]`` fp32 Exp(1) draws > 0.
        num_valid: ``[B]`` int positions that may be accepted (None: all K).
    Returns: ``VerifyOutput`` as :func:`rejection_verify`.
    Raises: ValueError on wrong shapes or fewer than K rates.
    """
    batch, num_steps, vocab = _check_rejection_inputs(draft_tokens, target_probs, None, uniforms, exp_noise)
    rates = torch.as_tensor(conditional_rates, dtype=torch.float32, device=draft_tokens.device).view(-1)
    if rates.numel() < num_steps:
        raise ValueError(f"synthetic_verify needs K = {num_steps} conditional rates, got {rates.numel()}")
    valid = _num_valid(num_valid, batch, num_steps, draft_tokens.device)
    pos = torch.arange(num_steps, device=draft_tokens.device).view(1, -1)  # [1, K]
    proposed = pos < valid.view(-1, 1).to(torch.int64)  # [B, K]: tokens do not matter
    x = draft_tokens.clamp(0, vocab - 1)  # [B, K], safe index
    accept = proposed & (uniforms < rates[:num_steps].view(1, -1))  # [B, K]
    accepted = _accepted_prefix(accept)  # [B] int64
    bonus = _bonus(accepted, proposed, x, target_probs, None, exp_noise)
    return _finish(accepted, draft_tokens, bonus)
