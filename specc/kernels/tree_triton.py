"""Triton kernels of the tree rules; `specc.kernels.tree` holds their torch references and the rules'
documentation, `specc.kernels.tree_common` the checks and helpers both share. One program per
request (per node for the mask) walks the tree with scalar loops over its N draft nodes (N is small)
and scans the vocabulary in BLOCK_V-wide blocks, as the chain kernels of
`specc.kernels.verify_triton` do (same interpreter rules on the CPU: TRITON_INTERPRET=1 must be set
before triton is first imported; launches pass ``enable_fp_fusion=False``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from specc.kernels.tree_common import (TreeMaskMode, _check_parents, _check_tree_rejection, _path_outputs, _prefix_lens,
                                      _tree_target_argmax, bitpack_dtype)
from specc.kernels.verify_common import VerifyOutput, _num_valid
from specc.kernels.verify_triton import BLOCK_V, _check_device, _triton, check_specialization, launch

__all__ = ["tree_attention_mask_triton", "tree_greedy_verify_triton", "tree_rejection_verify_triton"]

BLOCK_MASK = 128  # prefix columns written per inner iteration of the FULL_MASK kernel


@functools.cache
def _kernels():
    """Jit the three kernels once per process (lazily, see `specc.kernels.verify_triton`)."""
    triton, tl = _triton()

    @triton.jit
    def mask_kernel(parents_ptr, prefix_ptr, offset_ptr, out_ptr, N: tl.constexpr, MODE: tl.constexpr,
                    BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1).to(tl.int64)
        W = N + 1
        if MODE == 0:  # FULL_MASK: row i of request b's [W, prefix + W] block
            p = tl.load(prefix_ptr + b)
            row = tl.load(offset_ptr + b) + i * (p + W)
            for start in range(0, p, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                tl.store(out_ptr + row + offs, tl.full((BLOCK,), 1, tl.int8), mask=offs < p)
            base = row + p
        else:
            base = (b * W + i) * W
        word = tl.zeros((), tl.int64)
        node = i
        for _ in range(0, W):  # walk up to the root: node, its parent, ...
            if node >= 0:
                if MODE == 2:
                    word = word | (tl.full((), 1, tl.int64) << node)
                else:
                    tl.store(out_ptr + base + node, tl.full((), 1, tl.int8))
                if node == 0:
                    node = node - 1
                else:
                    node = tl.load(parents_ptr + b * N + node - 1)
        if MODE == 2:
            tl.store(out_ptr + b * W + i, word)

    @triton.jit
    def greedy_kernel(draft_ptr, parents_ptr, target_ptr, nvalid_ptr, acc_ptr, path_ptr, bonus_ptr,
                      V: tl.constexpr, N: tl.constexpr, STEPS: tl.constexpr, FROM_LOGITS: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        W = N + 1
        n_valid = tl.load(nvalid_ptr + b).to(tl.int64)
        cur = tl.zeros((), tl.int64)
        acc = tl.zeros((), tl.int64)
        going = tl.full((), 1, tl.int32)
        bonus = tl.zeros((), tl.int64)
        tl.store(path_ptr + b * W, tl.zeros((), tl.int64))
        for step in range(0, STEPS + 1):
            if going == 1:
                row = b * W + cur
                if FROM_LOGITS:
                    best = tl.full((), float("-inf"), tl.float32)
                    best_idx = tl.zeros((), tl.int64)
                    for start in range(0, V, BLOCK):
                        offs = start + tl.arange(0, BLOCK)
                        vals = tl.load(target_ptr + row * V + offs, mask=offs < V, other=float("-inf"))
                        m = tl.max(vals, axis=0)
                        idx = tl.argmax(vals, axis=0).to(tl.int64) + start
                        best_idx = tl.where(m > best, idx, best_idx)
                        best = tl.maximum(best, m)
                    tgt = best_idx
                else:
                    tgt = tl.load(target_ptr + row)
                nxt = tl.full((), -1, tl.int64)
                if step < STEPS:
                    for j in range(0, N):
                        if nxt < 0:
                            par = tl.load(parents_ptr + b * N + j)
                            x = tl.load(draft_ptr + b * N + j)
                            if (par == cur) & (j < n_valid) & (x >= 0) & (x < V) & (x == tgt):
                                nxt = cur * 0 + j + 1  # int64, as nxt starts (a loop index is int32)
                if nxt >= 0:
                    cur = nxt
                    acc += 1
                    tl.store(path_ptr + b * W + acc, cur)
                else:
                    bonus = tgt
                    going = 0
        tl.store(acc_ptr + b, acc)
        tl.store(bonus_ptr + b, bonus)

    @triton.jit
    def rejection_kernel(draft_ptr, parents_ptr, target_ptr, dprob_ptr, unif_ptr, noise_ptr, nvalid_ptr,
                         resid_ptr, qw_ptr, acc_ptr, path_ptr, bonus_ptr,
                         V: tl.constexpr, N: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        W = N + 1
        n_valid = tl.load(nvalid_ptr + b).to(tl.int64)
        cur = tl.zeros((), tl.int64)
        acc = tl.zeros((), tl.int64)
        last = tl.full((), -1, tl.int64)  # the last child of cur that was tried
        finished = tl.zeros((), tl.int32)
        used = tl.zeros((), tl.int32)  # a sibling was rejected at cur (the residual is in use)
        rsum = tl.full((), 1.0, tl.float64)
        qsum = tl.full((), 1.0, tl.float64)
        r_row = resid_ptr + b * V
        q_row = qw_ptr + b * V
        tl.store(path_ptr + b * W, tl.zeros((), tl.int64))
        for _ in range(0, N + 1):
            if finished == 0:
                j = tl.full((), -1, tl.int64)
                for c in range(0, N):
                    if j < 0:
                        if c > last:
                            par = tl.load(parents_ptr + b * N + c)
                            xc = tl.load(draft_ptr + b * N + c)
                            if (par == cur) & (c < n_valid) & (xc >= 0) & (xc < V):
                                j = cur * 0 + c  # int64, as j starts (a loop index is int32)
                if j < 0:
                    finished = 1
                else:
                    x = tl.load(draft_ptr + b * N + j)
                    u = tl.load(unif_ptr + b * N + j).to(tl.float64)
                    p_row = target_ptr + (b * W + cur) * V
                    rx = tl.load(p_row + x).to(tl.float64)
                    if HAS_DRAFT_PROBS:
                        if used == 1:
                            rx = tl.load(r_row + x).to(tl.float64)
                    if HAS_DRAFT_PROBS:
                        if used == 1:
                            qx = tl.load(q_row + x).to(tl.float64)
                        else:
                            qx = tl.load(dprob_ptr + (b * N + cur) * V + x).to(tl.float64)
                        ok = (u * qx) * rsum < rx * qsum
                        if qsum <= 0:
                            ok = rx > 0
                    else:
                        # a token already rejected at this node has residual mass 0
                        for c in range(0, N):
                            if c < j:
                                par = tl.load(parents_ptr + b * N + c)
                                xc = tl.load(draft_ptr + b * N + c)
                                if (par == cur) & (c < n_valid) & (xc == x):
                                    rx = tl.zeros((), tl.float64)
                        ok = u * rsum < rx
                    if ok:
                        cur = j + 1
                        acc += 1
                        tl.store(path_ptr + b * W + acc, cur)
                        last = tl.full((), -1, tl.int64)
                        used = 0
                        rsum = tl.full((), 1.0, tl.float64)
                        qsum = tl.full((), 1.0, tl.float64)
                    else:
                        if HAS_DRAFT_PROBS:
                            q_src = dprob_ptr + (b * N + cur) * V
                            rs = tl.where(rsum > 0, rsum, 1.0)
                            qs = tl.where(qsum > 0, qsum, 1.0)
                            total = tl.zeros((), tl.float64)
                            for start in range(0, V, BLOCK):
                                offs = start + tl.arange(0, BLOCK)
                                m = offs < V
                                if used == 1:
                                    pv = tl.load(r_row + offs, mask=m, other=0.0)
                                    qv = tl.load(q_row + offs, mask=m, other=0.0)
                                else:
                                    pv = tl.load(p_row + offs, mask=m, other=0.0)
                                    qv = tl.load(q_src + offs, mask=m, other=0.0)
                                new = tl.maximum(pv.to(tl.float64) / rs - qv.to(tl.float64) / qs, 0.0).to(tl.float32)
                                new = tl.where(rsum > 0, new, 0.0)
                                tl.store(r_row + offs, new, mask=m)
                                tl.store(q_row + offs, tl.where(offs == x, 0.0, qv), mask=m)
                                total += tl.sum(tl.where(m, new, 0.0).to(tl.float64), axis=0)
                            rsum = total
                            qsum = qsum - qx
                        else:
                            rsum = rsum - rx
                        used = 1
                        last = j
        # bonus: the residual at cur (unless empty), else p at cur; exponential race
        p_row = target_ptr + (b * W + cur) * V
        use_resid = tl.zeros((), tl.int32)
        if used == 1:
            rmax = tl.zeros((), tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                m = offs < V
                if HAS_DRAFT_PROBS:
                    w = tl.load(r_row + offs, mask=m, other=0.0)
                else:
                    w = tl.load(p_row + offs, mask=m, other=0.0)
                    for c in range(0, N):
                        if c <= last:
                            par = tl.load(parents_ptr + b * N + c)
                            xc = tl.load(draft_ptr + b * N + c)
                            if (par == cur) & (c < n_valid) & (xc >= 0) & (xc < V):
                                w = tl.where(offs == xc, 0.0, w)
                rmax = tl.maximum(rmax, tl.max(w, axis=0))
            if rmax > 0.0:
                use_resid = 1
        best = tl.full((), -1.0, tl.float32)
        best_idx = tl.zeros((), tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < V
            w = tl.load(p_row + offs, mask=m, other=0.0)
            if use_resid == 1:
                if HAS_DRAFT_PROBS:
                    w = tl.load(r_row + offs, mask=m, other=0.0)
                else:
                    for c in range(0, N):
                        if c <= last:
                            par = tl.load(parents_ptr + b * N + c)
                            xc = tl.load(draft_ptr + b * N + c)
                            if (par == cur) & (c < n_valid) & (xc >= 0) & (xc < V):
                                w = tl.where(offs == xc, 0.0, w)
            noise = tl.load(noise_ptr + b * V + offs, mask=m, other=1.0)
            score = tl.where(m, tl.math.div_rn(w, noise), -1.0)
            mx = tl.max(score, axis=0)
            idx = tl.argmax(score, axis=0).to(tl.int64) + start
            best_idx = tl.where(mx > best, idx, best_idx)
            best = tl.maximum(best, mx)
        tl.store(acc_ptr + b, acc)
        tl.store(bonus_ptr + b, best_idx)

    return mask_kernel, greedy_kernel, rejection_kernel


def tree_attention_mask_triton(parents: torch.Tensor, mode: int = TreeMaskMode.QLEN_ONLY,
                               prefix_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Triton kernel of `specc.kernels.tree.tree_attention_mask` (same arguments, same result)."""
    batch, n = _check_parents(parents)
    _check_device(parents)
    w = n + 1
    mode = TreeMaskMode(int(mode))
    dev = parents.device
    par = parents.contiguous() if n else torch.zeros(1, dtype=torch.int64, device=dev)
    dummy = torch.zeros(1, dtype=torch.int64, device=dev)
    if mode == TreeMaskMode.FULL_MASK:
        prefix = _prefix_lens(prefix_lens, batch, dev).contiguous()
        sizes = w * (prefix + w)  # [B]
        offsets = (torch.cumsum(sizes, 0) - sizes).contiguous()
        out = torch.zeros(int(sizes.sum()) if batch else 0, dtype=torch.int8, device=dev)
    elif mode == TreeMaskMode.QLEN_ONLY:
        prefix = offsets = dummy
        out = torch.zeros(batch, w, w, dtype=torch.int8, device=dev)
    else:
        bitpack_dtype(w)
        prefix = offsets = dummy
        out = torch.zeros(batch, w, dtype=torch.int64, device=dev)
    if batch:
        mask_kernel, _, _ = _kernels()
        launch("tree_mask_kernel", mask_kernel, (batch, w), (par, prefix, offsets, out),
               {"N": n, "MODE": int(mode), "BLOCK": BLOCK_MASK})
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        return out.to(bitpack_dtype(w))
    return out.bool()


def _path_result(acc: torch.Tensor, path: torch.Tensor, bonus: torch.Tensor, draft_tokens: torch.Tensor) -> VerifyOutput:
    return _path_outputs(path, acc, draft_tokens, bonus)


def tree_greedy_verify_triton(draft_tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                              num_valid: Optional[torch.Tensor] = None, max_depth: Optional[int] = None, *,
                              num_nodes: Optional[int] = None, vocab_size: Optional[int] = None) -> VerifyOutput:
    """Triton kernel of `specc.kernels.tree.tree_greedy_verify` (same arguments, same result), compiled
    per tree size, depth and vocabulary size (``N`` draft nodes, ``STEPS`` levels and ``V`` are
    ``tl.constexpr``). ``num_nodes`` / ``vocab_size``: the N and V a specialized program baked in;
    ValueError when the drafts are not ``[B, N]`` or the logits not ``[B, N + 1, V]``."""
    batch, n = _check_parents(parents, draft_tokens)
    n = check_specialization("N", num_nodes, n)
    _check_device(draft_tokens)
    dev = draft_tokens.device
    from_logits = target.dim() == 3
    if from_logits:
        _tree_target_argmax(target[:, :, :1], batch, n)  # shape check only
        target_arg, vocab = target.float().contiguous(), check_specialization("V", vocab_size, target.shape[2])
    else:
        target_arg, vocab = _tree_target_argmax(target, batch, n).contiguous(), 2 ** 62
    valid = _num_valid(num_valid, batch, n, dev)
    acc = torch.zeros(batch, dtype=torch.int64, device=dev)
    path = torch.full((batch, n + 1), -1, dtype=torch.int64, device=dev)
    bonus = torch.zeros(batch, dtype=torch.int64, device=dev)
    steps = n if max_depth is None else min(n, int(max_depth))
    if batch:
        _, greedy_kernel, _ = _kernels()
        dummy = torch.zeros(1, dtype=torch.int64, device=dev)
        launch("tree_greedy_kernel", greedy_kernel, (batch,),
               (draft_tokens.contiguous() if n else dummy, parents.contiguous() if n else dummy,
                target_arg, valid, acc, path, bonus),
               {"V": vocab, "N": n, "STEPS": steps, "FROM_LOGITS": from_logits, "BLOCK": 1024}, enable_fp_fusion=False)
    return _path_result(acc, path, bonus, draft_tokens)


def tree_rejection_verify_triton(draft_tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor,
                                 draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor, exp_noise: torch.Tensor,
                                 num_valid: Optional[torch.Tensor] = None, *,
                                 num_nodes: Optional[int] = None, vocab_size: Optional[int] = None) -> VerifyOutput:
    """Triton kernel of `specc.kernels.tree.tree_rejection_verify` (same arguments, same result),
    compiled per tree size and vocabulary size (``N`` draft nodes and ``V`` are ``tl.constexpr``;
    ``vocab_size``: the V a specialized program baked in, checked against the probabilities). Full q needs two ``[B, V]`` fp32
    scratch rows (the residual and q without the rejected siblings). ``num_nodes``: the N a
    specialized program baked in; ValueError when the drafts are not ``[B, N]``."""
    batch, n, vocab = _check_tree_rejection(draft_tokens, parents, target_probs, draft_probs, uniforms, exp_noise)
    n = check_specialization("N", num_nodes, n)
    vocab = check_specialization("V", vocab_size, vocab)
    _check_device(draft_tokens)
    dev = draft_tokens.device
    valid = _num_valid(num_valid, batch, n, dev)
    acc = torch.zeros(batch, dtype=torch.int64, device=dev)
    path = torch.full((batch, n + 1), -1, dtype=torch.int64, device=dev)
    bonus = torch.zeros(batch, dtype=torch.int64, device=dev)
    has_q = draft_probs is not None and n > 0
    scratch = torch.zeros(2, batch, vocab, dtype=torch.float32, device=dev) if has_q else \
        torch.zeros(2, 1, 1, dtype=torch.float32, device=dev)
    if batch:
        _, _, rejection_kernel = _kernels()
        d64 = torch.zeros(1, dtype=torch.int64, device=dev)
        d32 = torch.zeros(1, dtype=torch.float32, device=dev)
        launch("tree_rejection_kernel", rejection_kernel, (batch,),
               (draft_tokens.contiguous() if n else d64, parents.contiguous() if n else d64, target_probs.contiguous(),
                draft_probs.contiguous() if has_q else d32, uniforms.contiguous() if n else d32, exp_noise.contiguous(),
                valid, scratch[0], scratch[1], acc, path, bonus),
               {"V": vocab, "N": n, "HAS_DRAFT_PROBS": has_q, "BLOCK": BLOCK_V}, enable_fp_fusion=False)
    return _path_result(acc, path, bonus, draft_tokens)
