"""Tree verification: the tree attention mask in SGLang's three packings, tree greedy verification and
tree rejection sampling, as torch references and a dispatcher to their Triton kernels
(`specc.kernels.tree_triton`), each with the same signature (`backend="torch" | "triton" | "auto"`).

A draft tree of verify width W = N + 1 per request: node 0 is the root (the pending token), node
j + 1 is draft ``draft_tokens[b, j]`` whose parent node is ``parents[b, j]`` (in 0..j: nodes are
numbered in a topological order, so the first n drafts always form a tree). A chain is
``parents[b, j] = j``. Row n of the target's distribution (``[B, W, V]``) is the target at node n,
i.e. its prediction of the token after the path root → n. Drafts past ``num_valid[b]`` and draft
tokens outside [0, V) are never accepted (nor, then, their subtrees).

Both rules return :class:`VerifyOutput` with ``accept_index`` [B, W], the accepted path's nodes
(root first), and ``output_tokens`` [B, W] = the path's draft tokens, then the bonus token.
Nothing here reads tensor values on the host (loops have static trip counts), so the torch
references can be captured in a CUDA graph too.
"""
from __future__ import annotations

from typing import Optional

import torch

from specc.kernels.tree_common import (TreeMaskMode, _check_parents, _check_tree_rejection, _path_outputs,
                                      _prefix_lens, _tree_target_argmax, bitpack_dtype)
from specc.kernels.verify_common import VerifyOutput, _num_valid, _valid_drafts, resolve_backend

__all__ = ["TreeMaskMode", "tree_attention_mask", "tree_greedy_verify", "tree_rejection_verify",
           "bitpack_dtype", "tree_depths", "ancestor_mask"]


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """``[B, W, W]`` bool, entry (i, j) True iff node j is node i or one of its ancestors, from
    ``parents [B, N]`` (W = N + 1). Pointer doubling: ceil(log2 W) boolean matrix products."""
    batch, n = parents.shape
    w = n + 1
    eye = torch.eye(w, dtype=torch.float32, device=parents.device).expand(batch, w, w)
    adj = torch.zeros(batch, w, w, dtype=torch.float32, device=parents.device)
    if n:
        adj[:, 1:].scatter_(2, parents.view(batch, n, 1), 1.0)  # node j+1 -> its parent
    reach = ((eye + adj) > 0).float()  # [B, W, W] self or parent
    span = 1
    while span < w:
        reach = (torch.bmm(reach, reach) > 0).float()
        span *= 2
    return reach > 0


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` int64 depth of every node (root 0) from ``parents [B, N]``."""
    return ancestor_mask(parents).sum(dim=-1).to(torch.int64) - 1


def tree_attention_mask_torch(parents: torch.Tensor, mode: int = TreeMaskMode.QLEN_ONLY,
                              prefix_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Torch reference of :func:`tree_attention_mask` (same arguments, same result)."""
    batch, n = _check_parents(parents)
    w = n + 1
    anc = ancestor_mask(parents)  # [B, W, W]
    mode = TreeMaskMode(int(mode))
    if mode == TreeMaskMode.QLEN_ONLY:
        return anc
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        dtype = bitpack_dtype(w)
        bits = (torch.ones(w, dtype=torch.int64, device=parents.device) << torch.arange(w, device=parents.device))
        return (anc.to(torch.int64) * bits.view(1, 1, w)).sum(-1).to(dtype)  # [B, W]
    prefix = _prefix_lens(prefix_lens, batch, parents.device)
    blocks = []
    for b in range(batch):  # FULL_MASK: [W, prefix + W] per request, row-major, concatenated
        p = int(prefix[b])
        blk = torch.cat([torch.ones(w, p, dtype=torch.bool, device=parents.device), anc[b]], dim=1)
        blocks.append(blk.reshape(-1))
    return torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool, device=parents.device)


def tree_attention_mask(parents: torch.Tensor, mode: int = TreeMaskMode.QLEN_ONLY,
                        prefix_lens: Optional[torch.Tensor] = None, *, backend: str = "auto") -> torch.Tensor:
    """The tree attention mask of a batch of draft trees, in one of SGLang's three packings
    (``TreeMaskMode``, kernels/ops/speculative/spec_tree.py:46-49; built by
    ``build_tree_kernel_efficient``, eagle_utils.py:138-234).

    Node i attends to node j iff j is i or an ancestor of i (the root included), and to the whole
    cached prefix before the tree.

    Args:
        parents: ``[B, N]`` int64, parent node (0..j) of draft node j + 1; W = N + 1 nodes.
        mode: ``FULL_MASK`` → 1-D bool of ``Σ_b W·(prefix_lens[b] + W)`` cells, request b's block
            ``[W, prefix_lens[b] + W]`` row-major (prefix columns all True, then the tree part);
            ``QLEN_ONLY`` → ``[B, W, W]`` bool; ``QLEN_ONLY_BITPACKING`` → ``[B, W]`` words
            (:func:`bitpack_dtype`: uint8 / uint16 / uint32), bit j of word i set iff i sees j
            (W ≤ 32).
        prefix_lens: ``[B]`` int, cached tokens before each tree (FULL_MASK only).
        backend: "auto" (Triton on CUDA, torch elsewhere), "torch" or "triton".
    Raises:
        ValueError: bad shapes, parents outside [0, j], W > 32 for bit packing, FULL_MASK without
            prefix_lens, an unknown backend. SpeccError: backend="triton" on CPU without
            TRITON_INTERPRET=1.
    """
    if resolve_backend(backend, parents.device) == "torch":
        return tree_attention_mask_torch(parents, mode, prefix_lens)
    from specc.kernels import tree_triton

    return tree_triton.tree_attention_mask_triton(parents, mode, prefix_lens)


# ------------------------------------------------------------------------------------------------ greedy

def tree_greedy_verify_torch(draft_tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                             num_valid: Optional[torch.Tensor] = None, max_depth: Optional[int] = None,
                             ) -> VerifyOutput:
    """Torch reference of :func:`tree_greedy_verify` (same arguments, same result)."""
    batch, n = _check_parents(parents, draft_tokens)
    tgt = _tree_target_argmax(target, batch, n)  # [B, W]
    vocab = target.shape[2] if target.dim() == 3 else 2 ** 62
    valid = _valid_drafts(draft_tokens, _num_valid(num_valid, batch, n, draft_tokens.device), vocab)  # [B, N]
    dev = draft_tokens.device
    rows = torch.arange(batch, device=dev)
    cur = torch.zeros(batch, dtype=torch.int64, device=dev)
    accepted = torch.zeros(batch, dtype=torch.int64, device=dev)
    path = torch.full((batch, n + 1), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    going = torch.ones(batch, dtype=torch.bool, device=dev)
    for _ in range(n if max_depth is None else min(n, int(max_depth))):
        a = tgt[rows, cur]  # [B] target argmax at the last accepted node
        match = (parents == cur.view(batch, 1)) & valid & (draft_tokens == a.view(batch, 1)) & going.view(batch, 1)
        found = match.any(dim=1)  # [B]
        j = match.to(torch.int32).argmax(dim=1).to(torch.int64)  # first matching child
        cur = torch.where(found, j + 1, cur)
        accepted = accepted + found.to(torch.int64)
        path[rows, accepted] = torch.where(found, cur, path[rows, accepted])
        going = found
    bonus = tgt[rows, cur]
    return _path_outputs(path, accepted, draft_tokens, bonus)


def tree_greedy_verify(draft_tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor,
                       num_valid: Optional[torch.Tensor] = None, max_depth: Optional[int] = None, *,
                       backend: str = "auto") -> VerifyOutput:
    """Greedy tree verification: from the root, repeatedly accept the child (lowest node first) whose
    token equals the target's argmax at the last accepted node; the bonus is the argmax at the node
    where no child matches (SGLang ``verify_tree_greedy``, kernels/ops/speculative/tree.py:61 and
    spec_tree.py:211). The emitted tokens equal plain greedy decoding.

    Args:
        draft_tokens: ``[B, N]`` int64 draft nodes. parents: ``[B, N]`` int64 (module docstring).
        target: ``[B, W, V]`` float logits or ``[B, W]`` int64 argmax at every node (W = N + 1).
        num_valid: ``[B]`` int nodes proposed per request (a prefix), or None for all N.
        max_depth: deepest node of any tree (bounds the walk; default N).
        backend: "auto", "torch" or "triton".
    Returns:
        ``VerifyOutput(accepted_len [B] int32, output_tokens [B, W] int64, bonus [B] int64,
        accept_index [B, W] int64)``.
    Raises:
        ValueError: bad shapes or dtypes, parents outside [0, j], an unknown backend.
        SpeccError: backend="triton" on CPU without TRITON_INTERPRET=1.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return tree_greedy_verify_torch(draft_tokens, parents, target, num_valid, max_depth)
    from specc.kernels import tree_triton

    return tree_triton.tree_greedy_verify_triton(draft_tokens, parents, target, num_valid, max_depth)


# ------------------------------------------------------------------------------------------------ sampling

def tree_rejection_verify_torch(draft_tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor,
                                draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor, exp_noise: torch.Tensor,
                                num_valid: Optional[torch.Tensor] = None) -> VerifyOutput:
    """Torch reference of :func:`tree_rejection_verify` (same arguments, same result)."""
    batch, n, vocab = _check_tree_rejection(draft_tokens, parents, target_probs, draft_probs, uniforms, exp_noise)
    dev = draft_tokens.device
    rows = torch.arange(batch, device=dev)
    valid = _valid_drafts(draft_tokens, _num_valid(num_valid, batch, n, dev), vocab)  # [B, N]
    cur = torch.zeros(batch, dtype=torch.int64, device=dev)
    accepted = torch.zeros(batch, dtype=torch.int64, device=dev)
    path = torch.full((batch, n + 1), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    finished = torch.zeros(batch, dtype=torch.bool, device=dev)
    tried = torch.zeros(batch, n, dtype=torch.bool, device=dev)
    resid = target_probs[:, 0].clone()  # [B, V] unnormalized residual at the current node
    rsum = torch.ones(batch, dtype=torch.float64, device=dev)  # its mass (p is normalized)
    used = torch.zeros(batch, dtype=torch.bool, device=dev)  # a sibling was rejected at cur
    probabilistic = draft_probs is not None
    if probabilistic:
        qw = draft_probs[:, 0].clone() if n else None  # [B, V] q at cur without the rejected siblings
        qsum = torch.ones(batch, dtype=torch.float64, device=dev)
    for _ in range(n + 1 if n else 0):  # each round: one untried child per unfinished row, or it finishes
        cand = (parents == cur.view(batch, 1)) & valid & ~tried  # [B, N]
        has = cand.any(dim=1) & ~finished
        finished = finished | ~has
        j = cand.to(torch.int32).argmax(dim=1).to(torch.int64)  # [B] first untried child
        x = draft_tokens[rows, j].clamp(0, vocab - 1)
        u = uniforms[rows, j].double()
        rx = resid[rows, x].double()
        if probabilistic:
            qx = qw[rows, x].double()
            # u < p_i(x) / q_i(x) cross-multiplied; q_i empty (its mass all rejected): q_i(x) = 0, accept if p_i(x) > 0
            accept = has & torch.where(qsum > 0, (u * qx) * rsum < rx * qsum, rx > 0)
        else:
            accept = has & (u * rsum < rx)
        reject = has & ~accept
        tried[rows, j] = tried[rows, j] | has
        # a rejected sibling: residual p_{i+1} = normalize(max(p_i - q_i, 0)), q_{i+1} = q_i without x
        if probabilistic:
            rs = torch.where(rsum > 0, rsum, torch.ones_like(rsum)).view(batch, 1)  # an empty residual stays 0
            qs = torch.where(qsum > 0, qsum, torch.ones_like(qsum)).view(batch, 1)
            new = torch.clamp_min(resid.double() / rs - qw.double() / qs, 0.0).float()  # [B, V]
            new = torch.where((rsum > 0).view(batch, 1), new, torch.zeros_like(new))
            resid = torch.where(reject.view(batch, 1), new, resid)
            rsum = torch.where(reject, new.double().sum(dim=1), rsum)
            qsum = torch.where(reject, qsum - qx, qsum)
            qw[rows, x] = torch.where(reject, torch.zeros_like(qx).float(), qw[rows, x])
        else:
            rsum = torch.where(reject, rsum - rx, rsum)
            resid[rows, x] = torch.where(reject, torch.zeros_like(rx).float(), resid[rows, x])
        used = used | reject
        # an accepted child: move to it, its target row is the new residual
        cur = torch.where(accept, j + 1, cur)
        accepted = accepted + accept.to(torch.int64)
        path[rows, accepted] = torch.where(accept, cur, path[rows, accepted])
        resid = torch.where(accept.view(batch, 1), target_probs[rows, cur], resid)
        rsum = torch.where(accept, torch.ones_like(rsum), rsum)
        used = used & ~accept
        if probabilistic:
            qw = torch.where(accept.view(batch, 1), draft_probs[rows, cur.clamp(max=n - 1)], qw)
            qsum = torch.where(accept, torch.ones_like(qsum), qsum)
    p_cur = target_probs[rows, cur]  # [B, V]
    use_resid = used & (resid.amax(dim=1) > 0)  # empty residual (rounding) -> p, as the chain rule
    weights = torch.where(use_resid.view(batch, 1), resid, p_cur)
    bonus = torch.div(weights, exp_noise).argmax(dim=-1)  # exponential race
    return _path_outputs(path, accepted, draft_tokens, bonus)


def tree_rejection_verify(draft_tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor,
                          draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor, exp_noise: torch.Tensor,
                          num_valid: Optional[torch.Tensor] = None, *, backend: str = "auto") -> VerifyOutput:
    """Tree rejection sampling, exact for the target distribution with several children per node:
    multi-candidate recursive rejection over siblings (SpecInfer's multi-step speculative sampling,
    Miao et al. 2024; without replacement, Jeon et al. 2024 "Recursive Speculative Decoding").

    At the current node (the root first) with target distribution p_1 = p and the children x_1, x_2,
    ... (node order), drawn without replacement from q (``draft_probs`` at that node), so that x_i ~
    q_i = q with x_1..x_{i-1} removed, renormalized: accept x_i with probability min(1, p_i(x_i) /
    q_i(x_i)), decided as ``u * q_i(x_i) < p_i(x_i)`` with the child's own uniform; after a rejection
    p_{i+1} = normalize(max(p_i - q_i, 0)). An accepted child becomes the current node; when every
    child is rejected (or there is none) the bonus is drawn from the last residual (from p when no
    child was tried, or when the residual is empty through rounding). By induction each step's
    emitted token is distributed exactly as p.

    One-hot q (``draft_probs`` None: greedy drafts, a tree that is a deterministic function of the
    context, e.g. EAGLE's top-k tree; SGLang's target-only path without thresholds,
    ``tree_speculative_sampling_target_only``, eagle_utils.py:712-785): q_i is the point mass at x_i,
    so x_i is accepted with probability p_i(x_i) = p(x_i) / (1 - Σ_{rejected} p), and the residual is
    p with the rejected siblings removed.

    Normalization: p and q rows are taken as normalized (``process_logits`` output); the residual's
    mass is carried in fp64 (one-hot q: 1 minus the rejected siblings' p; full q: an fp64 sum over
    the vocabulary, whose rounding may differ in the last bit between backends, so the two can only
    disagree when a uniform lies within that rounding of its threshold).

    Args:
        draft_tokens: ``[B, N]`` int64. parents: ``[B, N]`` int64 (module docstring).
        target_probs: ``[B, W, V]`` fp32, p at every node after ``process_logits``.
        draft_probs: ``[B, N, V]`` fp32, q at every node that may be a parent (nodes 0..N-1; row n is
            the distribution node n's children were drawn from), or None for one-hot q.
        uniforms: ``[B, N]`` fp32 in [0, 1), one acceptance draw per draft node.
        exp_noise: ``[B, V]`` fp32 Exp(1) draws > 0 for the bonus (exponential race).
        num_valid: ``[B]`` int nodes proposed per request (a prefix), or None for all N.
        backend: "auto", "torch" or "triton".
    Returns:
        ``VerifyOutput(accepted_len [B] int32, output_tokens [B, W] int64, bonus [B] int64,
        accept_index [B, W] int64)``.
    Raises:
        ValueError: bad shapes or dtypes, parents outside [0, j], an unknown backend.
        SpeccError: backend="triton" on CPU without TRITON_INTERPRET=1.
    """
    if resolve_backend(backend, draft_tokens.device) == "torch":
        return tree_rejection_verify_torch(draft_tokens, parents, target_probs, draft_probs, uniforms, exp_noise,
                                           num_valid)
    from specc.kernels import tree_triton

    return tree_triton.tree_rejection_verify_triton(draft_tokens, parents, target_probs, draft_probs, uniforms,
                                                    exp_noise, num_valid)
