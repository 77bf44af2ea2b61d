"""Triton kernels of the chain verify rules; `specc.kernels.verify` holds their torch references and
the rules' documentation. One program per request walks its K drafts in order (K is small), then
scans the vocabulary in BLOCK_V-wide blocks for the bonus token (first index of the maximum, as
`torch.argmax`), the layout of vLLM 0.33.0's `_rejection_kernel` + `_resample_kernel`
(RSU:502-765, 803-1015) folded into one launch per rule.

CPU tensors run under the Triton interpreter, which triton 3.9 selects per function when `triton.jit`
runs, reading `TRITON_INTERPRET` from the environment (`triton/knobs.py:473`, `runtime/jit.py:998`).
Triton's own standard library (`tl.max`, `tl.argmax`, ...) is jitted when `triton` is first imported,
so `TRITON_INTERPRET=1` must be in the environment before the process first imports triton; our two
kernels are jitted lazily on first use. `interpreter_ready()` tells whether that holds, and a call on
CPU tensors that cannot be interpreted raises a SpeccError saying so.

Launches pass `enable_fp_fusion=False` so no multiply-add is contracted into an FMA, and the bonus
score uses the IEEE-rounded `div_rn`: every fp32 decision rounds exactly as in the torch reference.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

import torch

from specc.errors import SpeccError
from specc.kernels.verify_common import (
    VerifyOutput,
    chain_accept_index,
    _check_drafts,
    _check_rejection_inputs,
    _num_valid,
    _target_argmax,
)

__all__ = ["greedy_verify_triton", "rejection_verify_triton", "interpreter_ready", "record_launches", "Launch",
           "BLOCK_V"]

BLOCK_V = 1024  # vocabulary block per inner iteration (vLLM's resample block, RSU:768-800)


def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:  # pragma: no cover - triton is a Linux dependency
        raise SpeccError(f"backend='triton' needs the triton package ({exc}); use backend='torch'") from exc
    return triton, tl


def interpreter_ready() -> bool:
    """True if Triton kernels can run on CPU tensors in this process: TRITON_INTERPRET=1 is set and
    triton was either not imported yet or imported with it set (its standard library is interpreted)."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    if "triton" not in sys.modules:
        return True
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.max, InterpretedFunction)


@dataclass(frozen=True)
class Launch:
    """One Triton kernel launch: the kernel's name (``greedy_kernel``, ``tree_rejection_kernel``, ...)
    and the compile-time constants (``tl.constexpr`` values) it was specialized to."""

    kernel: str
    constexprs: Dict[str, Any]


_RECORDERS: List[List[Launch]] = []


@contextlib.contextmanager
def record_launches() -> Iterator[List[Launch]]:
    """Collect every Triton launch of specc's verify/tree kernels made inside the ``with`` block (in
    this thread or any other) as :class:`Launch` records: which kernel ran and which constexprs
    (e.g. ``K``, ``N``, ``STEPS``) Triton compiled it for."""
    log: List[Launch] = []
    _RECORDERS.append(log)
    try:
        yield log
    finally:
        _RECORDERS.remove(log)


def launch(name: str, kernel: Any, grid: tuple, args: tuple, constexprs: Dict[str, Any], **options: Any) -> None:
    """Launch ``kernel[grid](*args, **constexprs, **options)`` and record it (:func:`record_launches`).
    Every value in ``constexprs`` is a ``tl.constexpr`` of the kernel: Triton compiles (and caches)
    one binary per distinct tuple of them."""
    for log in _RECORDERS:
        log.append(Launch(name, dict(constexprs)))
    kernel[grid](*args, **constexprs, **options)


def check_specialization(name: str, expected: Optional[int], actual: int) -> int:
    """The compile-time constant ``name`` of a launch: ``actual`` (read from the tensor shapes), which
    must equal ``expected`` when a specialized program baked one in. Raises ValueError otherwise."""
    if expected is not None and int(expected) != int(actual):
        raise ValueError(f"kernel specialized to {name} = {int(expected)} called with inputs of {name} = {int(actual)}")
    return int(actual)


def _check_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda" and not interpreter_ready():
        raise SpeccError(
            "backend='triton' on CPU tensors runs only under the Triton interpreter: set TRITON_INTERPRET=1 "
            "in the environment before the process first imports triton, or use backend='torch'"
        )


@functools.cache
def _kernels():
    """Jit both kernels once per process (see the module docstring for why this is lazy)."""
    triton, tl = _triton()

    @triton.jit
    def greedy_kernel(
        draft_ptr, target_ptr, nvalid_ptr, acc_ptr, out_ptr, bonus_ptr,
        V: tl.constexpr, K: tl.constexpr, FROM_LOGITS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        n = tl.load(nvalid_ptr + b).to(tl.int64)
        acc = tl.zeros((), tl.int64)
        going = tl.full((), 1, tl.int32)
        bonus = tl.zeros((), tl.int64)
        for i in range(0, K + 1):
            if going == 1:
                row = b * (K + 1) + i
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
                in_drafts = (i < K) & (i < n)  # position K is the bonus slot, never a draft
                x = tl.load(draft_ptr + b * K + i, mask=i < K, other=-1)
                if in_drafts & (x == tgt):
                    acc += 1
                else:
                    bonus = tgt
                    going = 0
        for j in range(0, K + 1):
            tok = tl.full((), -1, tl.int64)
            if j < acc:
                tok = tl.load(draft_ptr + b * K + j)
            if j == acc:
                tok = bonus
            tl.store(out_ptr + b * (K + 1) + j, tok)
        tl.store(acc_ptr + b, acc.to(tl.int32))
        tl.store(bonus_ptr + b, bonus)

    @triton.jit
    def rejection_kernel(
        draft_ptr, target_ptr, dprob_ptr, unif_ptr, noise_ptr, nvalid_ptr, acc_ptr, out_ptr, bonus_ptr,
        V: tl.constexpr, K: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        n = tl.load(nvalid_ptr + b).to(tl.int64)
        acc = tl.zeros((), tl.int64)
        going = tl.full((), 1, tl.int32)
        rejected = tl.zeros((), tl.int32)
        x_rej = tl.zeros((), tl.int64)
        # 1. accept / reject drafts in order, stop at the first rejection or unproposed draft.
        for i in range(0, K):
            if going == 1:
                x = tl.load(draft_ptr + b * K + i)
                proposed = (i < n) & (x >= 0) & (x < V)
                if proposed:
                    p_x = tl.load(target_ptr + (b * (K + 1) + i) * V + x)
                    q_x = 1.0
                    if HAS_DRAFT_PROBS:
                        q_x = tl.load(dprob_ptr + (b * K + i) * V + x)
                    u = tl.load(unif_ptr + b * K + i)
                    if u * q_x < p_x:
                        acc += 1
                    else:
                        rejected = 1
                        x_rej = x
                        going = 0
                else:
                    going = 0
        # 2. bonus weights: the residual at a rejection (unless it is empty), else p.
        p_row = target_ptr + (b * (K + 1) + acc) * V
        q_row = dprob_ptr + (b * K + acc) * V
        use_resid = tl.zeros((), tl.int32)
        if rejected == 1:
            rmax = tl.zeros((), tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < V
                p = tl.load(p_row + offs, mask=mask, other=0.0)
                if HAS_DRAFT_PROBS:
                    q = tl.load(q_row + offs, mask=mask, other=0.0)
                    r = tl.maximum(p - q, 0.0)
                else:
                    r = tl.where(offs == x_rej, 0.0, p)
                rmax = tl.maximum(rmax, tl.max(r, axis=0))
            if rmax > 0.0:
                use_resid = 1
        # 3. exponential race: bonus = first argmax of w / noise.
        best = tl.full((), -1.0, tl.float32)
        best_idx = tl.zeros((), tl.int64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            w = tl.load(p_row + offs, mask=mask, other=0.0)
            if use_resid == 1:
                if HAS_DRAFT_PROBS:
                    q = tl.load(q_row + offs, mask=mask, other=0.0)
                    w = tl.maximum(w - q, 0.0)
                else:
                    w = tl.where(offs == x_rej, 0.0, w)
            noise = tl.load(noise_ptr + b * V + offs, mask=mask, other=1.0)
            score = tl.where(mask, tl.math.div_rn(w, noise), -1.0)
            m = tl.max(score, axis=0)
            idx = tl.argmax(score, axis=0).to(tl.int64) + start
            best_idx = tl.where(m > best, idx, best_idx)
            best = tl.maximum(best, m)
        # 4. outputs.
        for j in range(0, K + 1):
            tok = tl.full((), -1, tl.int64)
            if j < acc:
                tok = tl.load(draft_ptr + b * K + j)
            if j == acc:
                tok = best_idx
            tl.store(out_ptr + b * (K + 1) + j, tok)
        tl.store(acc_ptr + b, acc.to(tl.int32))
        tl.store(bonus_ptr + b, best_idx)

    return greedy_kernel, rejection_kernel


def _outputs(batch: int, num_steps: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.empty(batch, dtype=torch.int32, device=device),
        torch.empty(batch, num_steps + 1, dtype=torch.int64, device=device),
        torch.empty(batch, dtype=torch.int64, device=device),
    )


def _nonempty(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A size-0 tensor (K = 0) is replaced by a 1-element dummy: its pointer is never read."""
    return t.contiguous() if t.numel() > 0 else torch.zeros(1, dtype=t.dtype, device=like.device)


def greedy_verify_triton(
    draft_tokens: torch.Tensor, target: torch.Tensor, num_valid: torch.Tensor | None = None, *,
    num_steps: Optional[int] = None, vocab_size: Optional[int] = None,
) -> VerifyOutput:
    """Triton kernel of `specc.kernels.verify.greedy_verify` (same arguments, same result).

    The kernel is compiled per κ and vocabulary size (``K`` and ``V`` are ``tl.constexpr``: its loops
    have constant trip counts). ``num_steps`` / ``vocab_size``: the κ and V a specialized program
    baked in; ValueError when the drafts are not ``[B, κ]`` or the logits not ``[B, κ + 1, V]``."""
    batch, k = _check_drafts(draft_tokens)
    num_steps = check_specialization("K", num_steps, k)
    _check_device(draft_tokens)
    from_logits = target.dim() == 3
    if from_logits:
        _target_argmax(target[:, :, :1], batch, num_steps)  # shape check only
        target_arg = target.float().contiguous()
        vocab = check_specialization("V", vocab_size, target.shape[2])
    else:
        target_arg = _target_argmax(target, batch, num_steps).contiguous()
        vocab = 1
    valid = _num_valid(num_valid, batch, num_steps, draft_tokens.device)
    acc, out, bonus = _outputs(batch, num_steps, draft_tokens.device)
    if batch == 0:
        return VerifyOutput(acc, out, bonus, chain_accept_index(acc, num_steps + 1))
    greedy_kernel, _ = _kernels()
    launch("greedy_kernel", greedy_kernel, (batch,),
           (_nonempty(draft_tokens, draft_tokens), target_arg, valid, acc, out, bonus),
           {"V": vocab, "K": num_steps, "FROM_LOGITS": from_logits, "BLOCK": BLOCK_V}, enable_fp_fusion=False)
    return VerifyOutput(acc, out, bonus, chain_accept_index(acc, num_steps + 1))


def rejection_verify_triton(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    exp_noise: torch.Tensor,
    num_valid: torch.Tensor | None = None,
    *,
    num_steps: Optional[int] = None, vocab_size: Optional[int] = None,
) -> VerifyOutput:
    """Triton kernel of `specc.kernels.verify.rejection_verify` (same arguments, same result), compiled
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
    _, rejection_kernel = _kernels()
    has_q = draft_probs is not None
    launch("rejection_kernel", rejection_kernel, (batch,),
           (_nonempty(draft_tokens, draft_tokens), target_probs.contiguous(),
            _nonempty(draft_probs, target_probs) if has_q else target_probs,
            _nonempty(uniforms, target_probs), exp_noise.contiguous(), valid, acc, out, bonus),
           {"V": vocab, "K": num_steps, "HAS_DRAFT_PROBS": has_q, "BLOCK": BLOCK_V}, enable_fp_fusion=False)
    return VerifyOutput(acc, out, bonus, chain_accept_index(acc, num_steps + 1))
