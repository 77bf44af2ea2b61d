"""Triton kernel of block verification; `specc.kernels.block_verify` holds the torch reference and the
rule's documentation. One program per request walks its K drafts in order, carrying the joint ratio
w and computing the residual mass one position ahead (a scan of the vocabulary in BLOCK_V-wide blocks
for probabilistic q, the closed form for one-hot q), keeps the last passing position, then draws the
resample by an exponential race over the vocabulary: vLLM 0.33.0's `_compute_cumulative_log_p_kernel`,
`_compute_local_residual_mass_kernel`, the block branch of `_rejection_kernel` and `_resample_kernel`
(RSU:321-499, 627-659, 803-1015) folded into one launch, in linear rather than log space so every
decision matches the torch reference's fp32 operations.

CPU tensors run under the Triton interpreter (see `specc.kernels.verify_triton` for why
``TRITON_INTERPRET=1`` must be set before triton is imported). Launches pass
``enable_fp_fusion=False`` and divide with ``div_rn`` so no multiply-add is contracted and every
quotient is IEEE-rounded, as in torch.
"""
from __future__ import annotations

import functools

import torch

from specc.kernels.verify_common import VerifyOutput, _check_rejection_inputs, _num_valid, chain_accept_index
from specc.kernels.verify_triton import BLOCK_V, _check_device, _nonempty, _outputs, _triton, check_specialization, launch

__all__ = ["block_verify_triton"]


@functools.cache
def _kernel():
    triton, tl = _triton()

    @triton.jit
    def block_kernel(
        draft_ptr, target_ptr, dprob_ptr, unif_ptr, noise_ptr, nvalid_ptr, acc_ptr, out_ptr, bonus_ptr, V: tl.constexpr, K: tl.constexpr,
        HAS_DRAFT_PROBS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        n = tl.load(nvalid_ptr + b).to(tl.int64)
        tiny = 1.1754943508222875e-38
        # 1. leading proposed drafts
        n_eff = tl.zeros((), tl.int64)
        going = tl.full((), 1, tl.int32)
        for i in range(0, K):
            x = tl.load(draft_ptr + b * K + i)
            if going == 1:
                if (i < n) & (x >= 0) & (x < V):
                    n_eff += 1
                else:
                    going = 0
        # 2. running joint ratio, residual mass one ahead, last passing position
        w = tl.full((), 1.0, tl.float32)
        tau = tl.zeros((), tl.int64)
        w_tau = tl.full((), 1.0, tl.float32)
        for i in range(0, K):
            if i < n_eff:
                x = tl.load(draft_ptr + b * K + i)
                p_x = tl.load(target_ptr + (b * (K + 1) + i) * V + x)
                q_x = 1.0
                if HAS_DRAFT_PROBS:
                    q_x = tl.load(dprob_ptr + (b * K + i) * V + x)
                num = w * p_x
                if num >= q_x:
                    w = tl.full((), 1.0, tl.float32)
                else:
                    w = tl.math.div_rn(num, tl.maximum(q_x, tiny))
                h = w
                if i + 1 < n_eff:
                    x1 = tl.load(draft_ptr + b * K + i + 1)
                    if HAS_DRAFT_PROBS:
                        r = tl.zeros((), tl.float32)
                        p_next = target_ptr + (b * (K + 1) + i + 1) * V
                        q_next = dprob_ptr + (b * K + i + 1) * V
                        for start in range(0, V, BLOCK):
                            offs = start + tl.arange(0, BLOCK)
                            mask = offs < V
                            pv = tl.load(p_next + offs, mask=mask, other=0.0)
                            qv = tl.load(q_next + offs, mask=mask, other=0.0)
                            r += tl.sum(tl.maximum(w * pv - qv, 0.0), axis=0)
                    else:
                        p1 = tl.load(target_ptr + (b * (K + 1) + i + 1) * V + x1)
                        r = w * (1.0 - p1)
                    den = r + (1.0 - w)
                    if den > 0.0:
                        h = tl.math.div_rn(r, den)
                    else:
                        h = tl.full((), 1.0, tl.float32)
                u = tl.load(unif_ptr + b * K + i)
                if u < h:
                    tau = tau * 0 + i + 1  # int64, as tau starts (a loop index is int32)
                    w_tau = w
        # 3. resample weights: residual at a stop before the last proposed draft, else p
        p_row = target_ptr + (b * (K + 1) + tau) * V
        q_row = dprob_ptr + (b * K + tau) * V
        x_rej = tl.load(draft_ptr + b * K + tau, mask=tau < K, other=-1)
        use_resid = tl.zeros((), tl.int32)
        if tau < n_eff:
            rmax = tl.zeros((), tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < V
                p = tl.load(p_row + offs, mask=mask, other=0.0)
                if HAS_DRAFT_PROBS:
                    q = tl.load(q_row + offs, mask=mask, other=0.0)
                    rr = tl.maximum(w_tau * p - q, 0.0)
                else:
                    rr = tl.where(offs == x_rej, 0.0, p)
                rmax = tl.maximum(rmax, tl.max(rr, axis=0))
            if rmax > 0.0:
                use_resid = 1
        best = tl.full((), -1.0, tl.float32)
        best_idx = tl.zeros((), tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            wgt = tl.load(p_row + offs, mask=mask, other=0.0)
            if use_resid == 1:
                if HAS_DRAFT_PROBS:
                    q = tl.load(q_row + offs, mask=mask, other=0.0)
                    wgt = tl.maximum(w_tau * wgt - q, 0.0)
                else:
                    wgt = tl.where(offs == x_rej, 0.0, wgt)
            noise = tl.load(noise_ptr + b * V + offs, mask=mask, other=1.0)
            score = tl.where(mask, tl.math.div_rn(wgt, noise), -1.0)
            m = tl.max(score, axis=0)
            idx = tl.argmax(score, axis=0).to(tl.int64) + start
            best_idx = tl.where(m > best, idx, best_idx)
            best = tl.maximum(best, m)
        # 4. outputs
        for j in range(0, K + 1):
            tok = tl.full((), -1, tl.int64)
            if j < tau:
                tok = tl.load(draft_ptr + b * K + j)
            if j == tau:
                tok = best_idx
            tl.store(out_ptr + b * (K + 1) + j, tok)
        tl.store(acc_ptr + b, tau.to(tl.int32))
        tl.store(bonus_ptr + b, best_idx)

    return block_kernel


def block_verify_triton(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
    *,
    num_steps: int | None = None, vocab_size: int | None = None,
) -> VerifyOutput:
    """Triton kernel of `specc.kernels.block_verify.block_verify` (same arguments, same result), compiled
    per κ and vocabulary size (``K`` and ``V`` are ``tl.constexpr``). ``num_steps`` / ``vocab_size``:
    the κ and V a specialized program baked in; ValueError when the drafts are not ``[B, κ]`` or the
    probabilities not ``[B, κ + 1, V]``."""
    batch, k, vocab = _check_rejection_inputs(draft_tokens, target_probs, draft_probs, uniforms, exp_noise)
    num_steps = check_specialization("K", num_steps, k)
    vocab = check_specialization("V", vocab_size, vocab)
    _check_device(draft_tokens)
    valid = _num_valid(num_valid, batch, num_steps, draft_tokens.device)
    acc, out, bonus = _outputs(batch, num_steps, draft_tokens.device)
    if batch == 0:
        return VerifyOutput(acc, out, bonus, chain_accept_index(acc, num_steps + 1))
    has_q = draft_probs is not None
    launch("block_kernel", _kernel(), (batch,),
           (_nonempty(draft_tokens, draft_tokens), target_probs.contiguous(),
            _nonempty(draft_probs, target_probs) if has_q else target_probs,
            _nonempty(uniforms, target_probs), exp_noise.contiguous(), valid, acc, out, bonus),
           {"V": vocab, "K": num_steps, "HAS_DRAFT_PROBS": has_q, "BLOCK": BLOCK_V}, enable_fp_fusion=False)
    return VerifyOutput(acc, out, bonus, chain_accept_index(acc, num_steps + 1))
