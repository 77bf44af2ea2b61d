"""Shapes, checks and result type shared by the verify rules' torch references
(:mod:`specc.kernels.verify`) and their Triton kernels (:mod:`specc.kernels.verify_triton`); both
import from here, neither from the other."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, NamedTuple

import torch

_TRUST = threading.local()


@contextlib.contextmanager
def trusted_values() -> Iterator[None]:
    """Within this context (on this thread) the kernels skip their *value* checks, the ones that read
    a tensor's values on the host (``temperature >= 0``, ``top_p`` in (0, 1], ``top_k >= 0``, tree
    parents in ``[0, j]``); shape and dtype checks still run. The runtime's decode step runs inside
    it: its sampling parameters were checked when each request entered
    (``specc.runtime.request.SamplingParams.validate``) and its trees are built by the drafters
    (``specc.compiler.trees.compile_tree`` for static trees), so the per-step reads would only repeat those
    checks, each a device synchronisation on CUDA (as under CUDA graph capture or ``torch.compile``,
    where the kernels skip them already)."""
    prev = getattr(_TRUST, "on", False)
    _TRUST.on = True
    try:
        yield
    finally:
        _TRUST.on = prev


def values_trusted() -> bool:
    """Whether the caller is inside :func:`trusted_values` (value checks skipped)."""
    return getattr(_TRUST, "on", False)


class VerifyOutput(NamedTuple):
    """Result of one verify step for B requests with K draft positions (a chain) or N = W - 1 draft
    nodes (a tree of verify width W; then read K as N below).

    accepted_len: `[B]` int32 in [0, K], number of draft tokens accepted (the accepted path's depth).
    output_tokens: `[B, K+1]` int64: the accepted drafts at [0, accepted_len), the bonus at
        accepted_len, -1 after it. The tokens to append are `output_tokens[b, :accepted_len[b] + 1]`.
    bonus: `[B]` int64, the bonus token (`output_tokens[b, accepted_len[b]]`).
    accept_index: `[B, K+1]` int64, the verify rows (tree nodes, root = 0) of the accepted path:
        entries [0, accepted_len] hold the root and the accepted nodes, -1 after. A chain's is
        0, 1, ..., accepted_len. The KV-commit stage moves the target KV of these rows into place.
        None only from code written before trees (use :func:`chain_accept_index`).
    """

    accepted_len: torch.Tensor
    output_tokens: torch.Tensor
    bonus: torch.Tensor
    accept_index: torch.Tensor | None = None


def chain_accept_index(accepted: torch.Tensor, width: int) -> torch.Tensor:
    """A chain's accepted rows: ``[B, width]`` int64, ``0..accepted[b]`` then -1."""
    pos = torch.arange(width, device=accepted.device).view(1, -1)  # [1, W]
    return torch.where(pos <= accepted.view(-1, 1).to(torch.int64), pos, torch.full_like(pos, -1))


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
    return VerifyOutput(accepted.to(torch.int32), out, bonus, chain_accept_index(accepted, num_steps + 1))


def _accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """accept [B, K] bool -> [B] int64, length of the all-True prefix (stop at the first False)."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _valid_drafts(draft_tokens: torch.Tensor, num_valid: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, K] bool: the draft at i was proposed (i < num_valid, token id inside [0, V))."""
    num_steps = draft_tokens.shape[1]
    pos = torch.arange(num_steps, device=draft_tokens.device).view(1, -1)  # [1, K]
    return (pos < num_valid.view(-1, 1).to(torch.int64)) & (draft_tokens >= 0) & (draft_tokens < vocab)


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


def check_specialized_inputs(name: str, num_draft_tokens: int, vocab_size: int | None, draft_tokens: torch.Tensor,
                             target: torch.Tensor, *, narrower: bool) -> int:
    """The draft count of one call of a specialized verify module (``specc compile``'s ``kernels/<name>.py``)
    compiled for ``num_draft_tokens`` verify rows and, when ``vocab_size`` is set, that vocabulary.

    ``draft_tokens`` is ``[B, n]`` int64, ``target`` ``[B, n + 1, V]`` scores or ``[B, n + 1]`` argmax
    ids. With ``narrower``, ``n <= num_draft_tokens - 1`` is accepted: the CPU's ragged eager step
    verifies only up to its widest row (a chain's longest draft, a tree's last proposed node), and the
    module launches the kernel compiled for that width; without it ``n`` must be
    ``num_draft_tokens - 1`` exactly. Returns n.

    Raises:
        ValueError: naming the module, when a shape or the vocabulary does not fit the specialization.
    """
    limit = int(num_draft_tokens) - 1
    if draft_tokens.dim() != 2 or draft_tokens.shape[1] > limit or (not narrower and draft_tokens.shape[1] != limit):
        want = f"[B, n <= {limit}]" if narrower else f"[B, {limit}]"
        raise ValueError(f"{name}: draft_tokens must be {want}, got {tuple(draft_tokens.shape)}")
    n = int(draft_tokens.shape[1])
    if target.dim() < 2 or target.shape[1] != n + 1:
        raise ValueError(f"{name}: target must have {n + 1} positions (the drafts and the bonus), got "
                         f"{tuple(target.shape)}")
    if vocab_size is not None and target.dim() == 3 and target.shape[2] != int(vocab_size):
        raise ValueError(f"{name}: compiled for a vocabulary of {int(vocab_size)} entries, got scores over "
                         f"{target.shape[2]}")
    return n
