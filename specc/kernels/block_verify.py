"""Block verification (Sun et al. 2024, "Block Verification Accelerates Speculative Decoding",
arXiv 2403.10444, Algorithm 2): a torch reference and a dispatcher to its Triton kernel
(`specc.kernels.block_verify_triton`), with the signature of the standard rule
(`specc.kernels.rejection_verify`).

The standard rule accepts draft i only while every earlier draft passed its own token-level test.
Block verification judges the drafted block jointly: it carries the running joint ratio

    w_0 = 1,   w_i = min(w_{i-1} · p_i(x_i) / q_i(x_i), 1)            (p = target, q = draft)

and, at every draft i, the residual mass one position ahead,

    r_{i+1} = Σ_x max(w_i · p_{i+1}(x) − q_{i+1}(x), 0)       (one-hot q: w_i · (1 − p_{i+1}(x_{i+1}))),

and accepts the **longest** prefix i whose test u_i < h_i passes, scanning every position (not
stopping at a failure), with h_i = r_{i+1} / (r_{i+1} + 1 − w_i) (h_i = 1 when that denominator is 0)
and h_i = w_i at the last proposed draft. The token after the accepted prefix τ comes from
normalize(max(w_τ · p_τ − q_τ, 0)) when τ stopped before the last proposed draft (one-hot q: p_τ with
the draft x_{τ+1} removed, w_τ cancels), else from p at position τ. The emitted tokens follow the
target distribution exactly (Sun et al., Theorem 2), and the expected accepted length is at least the
standard rule's on the same drafts (their Theorem 3, "the comparison theorem"). Layout and formulas:
vLLM 0.33.0 ``rejection_sampler_utils.py`` RSU:321-499 (running ratio, residual mass), RSU:627-659
(threshold, longest passing prefix), RSU:925-961 (resample).

Indexing: drafts ``[B, K]``; target row i (``target_probs[:, i]``) is the distribution of draft i
(row 0 follows the pending token) and row K that of the bonus after K accepted drafts; draft row i
(``draft_probs[:, i]``) is q of draft i. Drafts are clipped per request by ``num_valid`` exactly as
in the standard rule: a request verifies its leading drafts ``i < num_valid[b]`` whose ids lie in
``[0, V)``; the first unproposed position ends its block.

Temperature-0 rows (a one-hot p, as `process_logits` gives them) with one-hot q reduce to the greedy
rule exactly (w_i is 1 while the drafts match the argmax and 0 after, so h selects the matching
prefix and the resample is the argmax), so a greedy request inside a block-verified batch decodes
greedily token for token (vLLM does the same by keeping the argmax rule for greedy rows, RSU:599).

Every decision uses the same fp32 operations in the reference and the kernel (a compare of
``w·p(x) ≥ q(x)`` before an IEEE division, ``max(w·p − q, 0)``, a divide-then-compare for h, the
exponential race for the resample); the residual mass r is a sum over the vocabulary whose order
may differ between the two (blocks of 1024), which can move h by an ulp.
"""
from __future__ import annotations

import torch

from specc.kernels.verify_common import (
    VerifyOutput,
    _check_rejection_inputs,
    _finish,
    _num_valid,
    _valid_drafts,
    resolve_backend,
)

__all__ = ["block_verify", "block_verify_torch"]


def _joint_ratio(p_x: torch.Tensor, q_x: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
    """Running joint ratio ``w [B, K+1]`` fp32 (w_0 = 1): ``w_i = 1`` if ``w_{i-1}·p(x_i) ≥ q(x_i)``
    else ``w_{i-1}·p(x_i) / q(x_i)``; frozen past the proposed drafts."""
    batch, k = p_x.shape
    w = torch.ones(batch, k + 1, dtype=torch.float32, device=p_x.device)
    for i in range(k):
        num = w[:, i] * p_x[:, i]  # [B]
        step = torch.where(num >= q_x[:, i], torch.ones_like(num), num / q_x[:, i].clamp_min(torch.finfo(torch.float32).tiny))
        w[:, i + 1] = torch.where(proposed[:, i], step, w[:, i])
    return w


def block_verify_torch(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
) -> VerifyOutput:
    """Torch reference of `block_verify` (same arguments, same result)."""
    batch, num_steps, vocab = _check_rejection_inputs(draft_tokens, target_probs, draft_probs, uniforms, exp_noise)
    dev = draft_tokens.device
    valid = _num_valid(num_valid, batch, num_steps, dev)
    rows = torch.arange(batch, device=dev)
    proposed = _valid_drafts(draft_tokens, valid, vocab).to(torch.int64).cumprod(dim=1).bool()  # [B, K] leading
    n_eff = proposed.sum(dim=1)  # [B]
    x = torch.where(proposed, draft_tokens, torch.zeros_like(draft_tokens))  # [B, K] safe index
    p_x = target_probs[:, :num_steps].gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, K]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    w = _joint_ratio(p_x, q_x, proposed)  # [B, K+1]
    tau = torch.zeros(batch, dtype=torch.int64, device=dev)
    for i in range(num_steps):
        wi = w[:, i + 1]  # [B] joint ratio after draft i
        if i + 1 < num_steps:
            if draft_probs is None:
                r = wi * (1.0 - p_x[:, i + 1])  # closed form, one-hot q
            else:
                r = torch.clamp_min(wi.view(batch, 1) * target_probs[:, i + 1] - draft_probs[:, i + 1], 0.0).sum(-1)
            den = r + (1.0 - wi)
            h = torch.where(den > 0, r / torch.where(den > 0, den, torch.ones_like(den)), torch.ones_like(den))
        else:
            h = wi
        last = n_eff == i + 1  # draft i is the last proposed one
        h = torch.where(last, wi, h)
        passed = proposed[:, i] & (uniforms[:, i] < h)
        tau = torch.where(passed, torch.full_like(tau, i + 1), tau)
    # resample after the accepted prefix
    p_t = target_probs[rows, tau]  # [B, V]
    w_t = w[rows, tau]  # [B]
    stopped = tau < n_eff  # [B] the block ended before its last proposed draft
    if num_steps == 0:
        weights = p_t
    else:
        stop = tau.clamp(max=num_steps - 1)
        if draft_probs is None:
            vocab_ids = torch.arange(vocab, device=dev).view(1, vocab)
            residual = torch.where(vocab_ids == x[rows, stop].view(batch, 1), torch.zeros_like(p_t), p_t)
        else:
            residual = torch.clamp_min(w_t.view(batch, 1) * p_t - draft_probs[rows, stop], 0.0)
        use = stopped & (residual.amax(dim=-1) > 0)  # empty residual (rounding only): draw from p
        weights = torch.where(use.view(batch, 1), residual, p_t)
    bonus = torch.div(weights, exp_noise).argmax(dim=-1)  # [B] exponential race
    return _finish(tau, draft_tokens, bonus)


def block_verify(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> VerifyOutput:
    """Block verification of a drafted block (see the module docstring for the rule and its source).

    Args:
        draft_tokens: ``[B, K]`` int64 (K = κ, may be 0).
        target_probs: ``[B, K+1, V]`` fp32 target probabilities p after ``process_logits``.
        draft_probs: ``[B, K, V]`` fp32 q the drafts were sampled from, or None for one-hot q
            (greedy drafts).
        uniforms: ``[B, K]`` fp32 in [0, 1), one test draw per position (all are used: the rule
            scans every position).
        exp_noise: ``[B, V]`` fp32 i.i.d. Exp(1) > 0 for the resample (exponential race).
        num_valid: ``[B]`` int drafts proposed per request, or None for all K.
        backend: "auto" (Triton on CUDA, torch elsewhere), "torch" or "triton" (CPU tensors need
            ``TRITON_INTERPRET=1`` before triton is first imported).
    Returns:
        ``VerifyOutput(accepted_len [B] int32, output_tokens [B, K+1] int64, bonus [B] int64,
        accept_index [B, K+1] int64)`` (a chain: rows 0..accepted_len).
    Raises:
        ValueError: wrong shapes/dtypes or an unknown backend. SpeccError: backend="triton" on CPU
        tensors without the interpreter, or triton missing.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return block_verify_torch(draft_tokens, target_probs, draft_probs, uniforms, exp_noise, num_valid)
    from specc.kernels import block_verify_triton

    return block_verify_triton.block_verify_triton(draft_tokens, target_probs, draft_probs, uniforms, exp_noise,
                                                   num_valid)
