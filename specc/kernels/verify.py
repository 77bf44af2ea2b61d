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

from typing import NamedTuple

import torch

__all__ = ["VerifyOutput", "greedy_verify", "rejection_verify", "resolve_backend"]


class VerifyOutput(NamedTuple):
    """Result of one verify step for B requests with K draft positions.

    accepted_len: `[B]` int32 in [0, K], number of draft tokens accepted.
    output_tokens: `[B, K+1]` int64: the accepted drafts at [0, accepted_len), the bonus at
        accepted_len, -1 after it. The tokens to append are `output_tokens[b, :accepted_len[b] + 1]`.
    bonus: `[B]` int64, the bonus token (`output_tokens[b, accepted_len[b]]`).
    """

    accepted_len: torch.Tensor
    output_tokens: torch.Tensor
    bonus: torch.Tensor


def resolve_backend(backend: str, device: torch.device) -> str:
    """Pick the implementation: "auto" is "triton" on CUDA tensors (when triton imports) and "torch"
    elsewhere; "torch" and "triton" are taken as given.

    Raises:
        ValueError: on an unknown backend name.
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend != "auto":
        return backend
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch"
        return "triton"
    return "torch"


def _num_valid(num_valid: torch.Tensor | None, batch: int, num_steps: int, device) -> torch.Tensor:
    if num_valid is None:
        return torch.full((batch,), num_steps, dtype=torch.int32, device=device)
    if tuple(num_valid.shape) != (batch,):
        raise ValueError(f"num_valid must have shape [B] = [{batch}], got {tuple(num_valid.shape)}")
    if num_valid.dtype.is_floating_point:
        raise ValueError(f"num_valid must be an integer tensor, got {num_valid.dtype}")
    return num_valid.to(device=device, dtype=torch.int32).contiguous()


def _check_drafts(draft_tokens: torch.Tensor) -> tuple[int, int]:
    if draft_tokens.dim() != 2 or draft_tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens must be [B, K] int64, got {tuple(draft_tokens.shape)} {draft_tokens.dtype}")
    return draft_tokens.shape[0], draft_tokens.shape[1]


def _finish(accepted: torch.Tensor, draft_tokens: torch.Tensor, bonus: torch.Tensor) -> VerifyOutput:
    """accepted [B] int64, draft_tokens [B, K], bonus [B] int64 -> VerifyOutput."""
    batch, num_steps = draft_tokens.shape
    pos = torch.arange(num_steps + 1, device=draft_tokens.device).view(1, -1)  # [1, K+1]
    padded = torch.cat([draft_tokens, bonus.view(batch, 1)], dim=1)  # [B, K+1]
    out = torch.where(pos < accepted.view(batch, 1), padded, torch.full_like(padded, -1))
    out = torch.where(pos == accepted.view(batch, 1), bonus.view(batch, 1), out)  # [B, K+1]
    return VerifyOutput(accepted.to(torch.int32), out, bonus)


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """accept [B, K] bool -> [B] int64, length of the all-True prefix (stop at the first False)."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _valid_drafts(draft_tokens: torch.Tensor, num_valid: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, K] bool: the draft at i was proposed (i < num_valid, token id inside [0, V))."""
    num_steps = draft_tokens.shape[1]
    pos = torch.arange(num_steps, device=draft_tokens.device).view(1, -1)  # [1, K]
    return (pos < num_valid.view(-1, 1).to(torch.int64)) & (draft_tokens >= 0) & (draft_tokens < vocab)


def greedy_verify_torch(
    draft_tokens: torch.Tensor, target: torch.Tensor, num_valid: torch.Tensor | None = None
) -> VerifyOutput:
    """Torch reference of `greedy_verify` (same arguments, same result)."""
    batch, num_steps = _check_drafts(draft_tokens)
    target_argmax = _target_argmax(target, batch, num_steps)  # [B, K+1]
    valid = _num_valid(num_valid, batch, num_steps, draft_tokens.device)
    match = (draft_tokens == target_argmax[:, :num_steps]) & _valid_drafts(draft_tokens, valid, 2**62)  # [B, K]
    accepted = _accepted_prefix(match)  # [B]
    bonus = target_argmax.gather(1, accepted.view(batch, 1)).view(batch)  # [B]
    return _finish(accepted, draft_tokens, bonus)


def _target_argmax(target: torch.Tensor, batch: int, num_steps: int) -> torch.Tensor:
    if target.dim() == 3 and target.dtype.is_floating_point:
        expect = (batch, num_steps + 1)
        if tuple(target.shape[:2]) != expect:
            raise ValueError(f"target logits must be [B, K+1, V] = [{batch}, {num_steps + 1}, V], got {tuple(target.shape)}")
        return target.argmax(dim=-1)  # [B, K+1], first index on ties
    if target.dim() == 2 and target.dtype == torch.int64:
        if tuple(target.shape) != (batch, num_steps + 1):
            raise ValueError(f"target argmax must be [B, K+1] = [{batch}, {num_steps + 1}], got {tuple(target.shape)}")
        return target
    raise ValueError(
        f"target must be logits [B, K+1, V] float or argmax tokens [B, K+1] int64, got {tuple(target.shape)} {target.dtype}"
    )


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
        `VerifyOutput(accepted_len [B] int32, output_tokens [B, K+1] int64, bonus [B] int64)`.
    Raises:
        ValueError: on wrong shapes/dtypes or an unknown backend. SpeccError: backend="triton" on CPU
        without TRITON_INTERPRET=1, or triton missing.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return greedy_verify_torch(draft_tokens, target, num_valid)
    from specc.kernels import verify_triton

    return verify_triton.greedy_verify_triton(draft_tokens, target, num_valid)


def _check_rejection_inputs(draft_tokens, target_probs, draft_probs, uniforms, exp_noise) -> tuple[int, int, int]:
    batch, num_steps = _check_drafts(draft_tokens)
    if target_probs.dim() != 3 or target_probs.dtype != torch.float32 or tuple(target_probs.shape[:2]) != (batch, num_steps + 1):
        raise ValueError(
            f"target_probs must be [B, K+1, V] = [{batch}, {num_steps + 1}, V] fp32, "
            f"got {tuple(target_probs.shape)} {target_probs.dtype}"
        )
    vocab = target_probs.shape[2]
    if draft_probs is not None and (draft_probs.dtype != torch.float32 or tuple(draft_probs.shape) != (batch, num_steps, vocab)):
        raise ValueError(
            f"draft_probs must be None (one-hot q) or [B, K, V] = [{batch}, {num_steps}, {vocab}] fp32 "
            f"(same V as the target; slice both to the shared vocabulary), got {tuple(draft_probs.shape)} {draft_probs.dtype}"
        )
    if uniforms.dtype != torch.float32 or tuple(uniforms.shape) != (batch, num_steps):
        raise ValueError(f"uniforms must be [B, K] = [{batch}, {num_steps}] fp32, got {tuple(uniforms.shape)} {uniforms.dtype}")
    if exp_noise.dtype != torch.float32 or tuple(exp_noise.shape) != (batch, vocab):
        raise ValueError(f"exp_noise must be [B, V] = [{batch}, {vocab}] fp32, got {tuple(exp_noise.shape)} {exp_noise.dtype}")
    return batch, num_steps, vocab


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
    p_a = target_probs[rows, accepted]  # [B, V], target at the bonus position
    if num_steps == 0:
        bonus_weights = p_a
    else:
        stop = accepted.clamp(max=num_steps - 1)  # [B]
        rejected = (accepted < num_steps) & proposed[rows, stop]  # [B], stopped on a proposed draft
        if draft_probs is None:
            vocab_ids = torch.arange(vocab, device=draft_tokens.device).view(1, vocab)
            residual = torch.where(vocab_ids == x[rows, stop].view(batch, 1), torch.zeros_like(p_a), p_a)  # [B, V]
        else:
            residual = torch.clamp_min(p_a - draft_probs[rows, stop], 0.0)  # [B, V]
        use_residual = rejected & (residual.amax(dim=-1) > 0)  # [B]; empty residual -> p (see rejection_verify)
        bonus_weights = torch.where(use_residual.view(batch, 1), residual, p_a)  # [B, V]
    bonus = torch.div(bonus_weights, exp_noise).argmax(dim=-1)  # [B] int64, exponential race
    return _finish(accepted, draft_tokens, bonus)


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
    (acceptance), RSU:905-961 (resample), RS1:937-951 (u against p/q); vllm-0.33.0.md §5.

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
        `VerifyOutput(accepted_len [B] int32, output_tokens [B, K+1] int64, bonus [B] int64)`.
    Raises:
        ValueError: on wrong shapes/dtypes or an unknown backend. SpeccError: backend="triton" on CPU
        without TRITON_INTERPRET=1, or triton missing.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return rejection_verify_torch(draft_tokens, target_probs, draft_probs, uniforms, exp_noise, num_valid)
    from specc.kernels import verify_triton

    return verify_triton.rejection_verify_triton(draft_tokens, target_probs, draft_probs, uniforms, exp_noise, num_valid)
