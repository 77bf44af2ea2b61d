"""Types, checks and helpers shared by the tree rules' torch references (:mod:`specc.kernels.tree`) and
their Triton kernels (:mod:`specc.kernels.tree_triton`); both import from here, neither from the
other. The tree layout (``parents`` ``[B, N]`` int64, W = N + 1 nodes, root = node 0) is described
in :mod:`specc.kernels.tree`.
"""
from __future__ import annotations

import enum
from typing import Optional

import torch

from specc.kernels.verify_common import VerifyOutput, values_trusted


class TreeMaskMode(enum.IntEnum):
    """SGLang's ``TreeMaskMode`` (kernels/ops/speculative/spec_tree.py:46-49)."""

    FULL_MASK = 0             # bool, per request [W, prefix + W] row-major, requests concatenated
    QLEN_ONLY = 1             # bool [B, W, W], the tree part only
    QLEN_ONLY_BITPACKING = 2  # one word per node: bit j set iff node j is visible


def bitpack_dtype(width: int) -> torch.dtype:
    """The word type of the bit-packed mask for W nodes: uint8 / uint16 / uint32 as
    ``(W + 7) // 8`` is 1 / 2 / 3-4 bytes (SGLang: ``ceil(log2((N + 7) // 8))``). Raises
    ValueError for W > 32."""
    if width > 32:
        raise ValueError(f"the bit-packed tree mask holds at most 32 nodes per row, got W = {width}")
    nbytes = (width + 7) // 8
    return torch.uint8 if nbytes <= 1 else torch.uint16 if nbytes == 2 else torch.uint32


def _check_parents(parents: torch.Tensor, draft_tokens: Optional[torch.Tensor] = None) -> tuple[int, int]:
    if parents.dim() != 2 or parents.dtype != torch.int64:
        raise ValueError(f"parents must be [B, N] int64, got {tuple(parents.shape)} {parents.dtype}")
    if draft_tokens is not None:
        if draft_tokens.dim() != 2 or draft_tokens.dtype != torch.int64 or draft_tokens.shape != parents.shape:
            raise ValueError(f"draft_tokens must be [B, N] int64 like parents {tuple(parents.shape)}, got "
                             f"{tuple(draft_tokens.shape)} {draft_tokens.dtype}")
    batch, n = parents.shape
    if (parents.is_cuda and torch.cuda.is_current_stream_capturing()) or values_trusted():
        return batch, n  # the value check reads the device (checked where the tree was built)
    if n and bool(((parents < 0) | (parents > torch.arange(n, device=parents.device).view(1, n))).any()):
        raise ValueError("parents[b, j] must lie in [0, j] (nodes in topological order, root = 0)")
    return batch, n

def _prefix_lens(prefix_lens: Optional[torch.Tensor], batch: int, device) -> torch.Tensor:
    if prefix_lens is None:
        raise ValueError("TreeMaskMode.FULL_MASK needs prefix_lens [B] (cached tokens before each tree)")
    if tuple(prefix_lens.shape) != (batch,) or prefix_lens.dtype.is_floating_point:
        raise ValueError(f"prefix_lens must be [B] = [{batch}] integers, got {tuple(prefix_lens.shape)}")
    return prefix_lens.to(device=device, dtype=torch.int64)

def _tree_target_argmax(target: torch.Tensor, batch: int, n: int) -> torch.Tensor:
    if target.dim() == 3 and target.dtype.is_floating_point:
        if tuple(target.shape[:2]) != (batch, n + 1):
            raise ValueError(f"target logits must be [B, W, V] = [{batch}, {n + 1}, V], got {tuple(target.shape)}")
        return target.argmax(dim=-1)  # [B, W], first index on ties
    if target.dim() == 2 and target.dtype == torch.int64:
        if tuple(target.shape) != (batch, n + 1):
            raise ValueError(f"target argmax must be [B, W] = [{batch}, {n + 1}], got {tuple(target.shape)}")
        return target
    raise ValueError(f"target must be logits [B, W, V] float or argmax tokens [B, W] int64, got "
                     f"{tuple(target.shape)} {target.dtype}")


def _path_outputs(path: torch.Tensor, accepted: torch.Tensor, draft_tokens: torch.Tensor,
                  bonus: torch.Tensor) -> VerifyOutput:
    """path [B, W] (root, accepted nodes, -1), accepted [B] int64, bonus [B] -> VerifyOutput."""
    batch, w = path.shape
    pos = torch.arange(w, device=path.device).view(1, w)
    nxt = torch.cat([path[:, 1:], torch.full_like(path[:, :1], -1)], dim=1)  # node accepted at step i
    toks = draft_tokens.gather(1, (nxt - 1).clamp(min=0)) if draft_tokens.shape[1] else torch.zeros_like(nxt)
    out = torch.where(pos < accepted.view(batch, 1), toks, torch.full_like(toks, -1))
    out = torch.where(pos == accepted.view(batch, 1), bonus.view(batch, 1), out)
    return VerifyOutput(accepted.to(torch.int32), out, bonus, path)

def _check_tree_rejection(draft_tokens, parents, target_probs, draft_probs, uniforms, exp_noise) -> tuple[int, int, int]:
    batch, n = _check_parents(parents, draft_tokens)
    if target_probs.dim() != 3 or target_probs.dtype != torch.float32 or tuple(target_probs.shape[:2]) != (batch, n + 1):
        raise ValueError(f"target_probs must be [B, W, V] = [{batch}, {n + 1}, V] fp32, got "
                         f"{tuple(target_probs.shape)} {target_probs.dtype}")
    vocab = target_probs.shape[2]
    if draft_probs is not None and (draft_probs.dtype != torch.float32 or tuple(draft_probs.shape) != (batch, n, vocab)):
        raise ValueError(f"draft_probs must be None (one-hot q) or [B, N, V] = [{batch}, {n}, {vocab}] fp32 "
                         f"(q at each parent node), got {tuple(draft_probs.shape)} {draft_probs.dtype}")
    if uniforms.dtype != torch.float32 or tuple(uniforms.shape) != (batch, n):
        raise ValueError(f"uniforms must be [B, N] = [{batch}, {n}] fp32, got {tuple(uniforms.shape)} {uniforms.dtype}")
    if exp_noise.dtype != torch.float32 or tuple(exp_noise.shape) != (batch, vocab):
        raise ValueError(f"exp_noise must be [B, V] = [{batch}, {vocab}] fp32, got {tuple(exp_noise.shape)} {exp_noise.dtype}")
    return batch, n, vocab
