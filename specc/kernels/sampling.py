"""Turn logits into the sampling distribution of one request: temperature, then top-k, then top-p.

The same function is applied to the target logits (giving p) and to the draft logits (giving q), so
the two distributions the verify rule compares were shaped by the same per-request parameters
vLLM 0.33.0 shapes the draft with temperature only
(vllm/v1/worker/gpu/spec_decode/speculator.py:536-540); standard rejection sampling is exact for any q with q(x) > 0 at the drafted token,
so shaping q the same way as p only raises acceptance, never breaks the output distribution.

Also here: `draw_randomness`, the one place the random tensors that the verify kernels consume are
drawn, so a Triton kernel and its torch reference can be fed identical randomness.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specc.kernels.verify_common import values_trusted

__all__ = ["process_logits", "greedy_rows", "draw_randomness", "VerifyRandomness"]


def _check_params(logits: torch.Tensor, temperature: torch.Tensor, top_k, top_p) -> None:
    if logits.dim() != 3:
        raise ValueError(f"process_logits: logits must be [B, N, V], got shape {tuple(logits.shape)}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"process_logits: logits must be floating point, got {logits.dtype}")
    batch = logits.shape[0]
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if t is not None and tuple(t.shape) != (batch,):
            raise ValueError(f"process_logits: {name} must have shape [B] = [{batch}], got {tuple(t.shape)}")
    if (logits.is_cuda and torch.cuda.is_current_stream_capturing()) or torch.compiler.is_compiling() or values_trusted():
        return  # value checks read the device (a captured or compiled program, or the runtime's step: checked at entry)
    if bool((temperature < 0).any()):
        raise ValueError("process_logits: temperature must be >= 0 (0 means greedy)")
    if top_p is not None and bool(((top_p <= 0) | (top_p > 1)).any()):
        raise ValueError("process_logits: top_p must lie in (0, 1] (1 disables it)")
    if top_k is not None and bool((top_k < 0).any()):
        raise ValueError("process_logits: top_k must be >= 0 (0 disables it)")


def greedy_rows(temperature: torch.Tensor) -> torch.Tensor:
    """Which requests decode greedily.

    Args:
        temperature: `[B]` float, per-request temperature.
    Returns:
        `[B]` bool, True where temperature == 0 (the OpenAI/vLLM convention for greedy decoding).
    """
    return temperature == 0


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Probabilities after per-request temperature, top-k and top-p.

    Args:
        logits: `[B, N, V]` float (fp32 expected; computed in fp32), N positions per request (the verify
            width for target logits, κ for draft logits).
        temperature: `[B]` float, >= 0. Rows with temperature == 0 are greedy: their distribution is the
            one-hot of `argmax(logits)` (first index on ties, as `torch.argmax`). Callers that only need
            the greedy token should call `argmax` / `greedy_verify` directly; the one-hot makes the
            standard verify rule reduce exactly to the greedy rule for such rows (u < p(x) is then
            "x is the argmax", and the residual max(p - q, 0) is the argmax), so a mixed batch can go
            through `rejection_verify` in one call.
        top_k: `[B]` int or None. Keep the tokens whose logit is >= the k-th largest (ties at the
            boundary are all kept, as vLLM's `apply_top_k_top_p`); 0 or k >= V disables it.
        top_p: `[B]` float in (0, 1] or None. After top-k, keep the smallest set of most probable tokens
            whose mass reaches top_p: sort ascending, drop tokens whose inclusive cumulative mass is
            <= 1 - top_p, always keep the most probable one (vLLM's `apply_top_k_top_p`,
            v1/sample/ops/topk_topp_sampler.py; Holtzman et al. 2020). 1 disables it.
        backend: "auto" or "torch". There is no Triton variant: this is a handful of fused torch ops
            plus one sort, and its outputs are probabilities, not token decisions, so nothing needs to
            match a kernel bit for bit.
    Returns:
        `[B, N, V]` fp32 probabilities; each row sums to 1 (up to rounding), filtered tokens are exactly 0.
    Raises:
        ValueError: on a wrong shape, temperature < 0, top_p outside (0, 1], top_k < 0, or an unknown backend.
    """
    if backend not in ("auto", "torch"):
        raise ValueError(f"process_logits: backend must be 'auto' or 'torch', got {backend!r}")
    _check_params(logits, temperature, top_k, top_p)
    batch, n_pos, vocab = logits.shape
    logits = logits.float()
    # No data-dependent branches below (they would sync the device and break CUDA graph capture):
    # whether top-k / top-p run is decided by passing the tensor or None.
    greedy = greedy_rows(temperature)  # [B]
    # Greedy rows are divided by 1 here and replaced by a one-hot below.
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / temp.view(batch, 1, 1)  # [B, N, V]

    if top_k is not None:
        k = top_k.to(torch.int64).view(batch, 1, 1)
        active = (k > 0) & (k < vocab)  # [B, 1, 1]
        sorted_desc = scaled.sort(dim=-1, descending=True).values  # [B, N, V]
        kth = sorted_desc.gather(-1, (k.clamp(1, vocab) - 1).expand(batch, n_pos, 1))  # [B, N, 1]
        scaled = scaled.masked_fill(active & (scaled < kth), float("-inf"))

    probs = torch.softmax(scaled, dim=-1)  # [B, N, V]

    if top_p is not None:
        tp = top_p.float().view(batch, 1, 1)
        sorted_p, order = probs.sort(dim=-1, descending=False)  # ascending, [B, N, V]
        cum = sorted_p.cumsum(dim=-1)  # [B, N, V]
        drop_sorted = (cum <= 1 - tp) & (tp < 1)
        drop_sorted[..., -1] = False  # the most probable token always stays
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocab order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)

    onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)  # [B, N, V]
    probs = torch.where(greedy.view(batch, 1, 1), onehot, probs)
    return probs


class VerifyRandomness(NamedTuple):
    """The random inputs of `rejection_verify`.

    uniforms: `[B, K]` fp32 in [0, 1), one acceptance draw per draft position.
    exp_noise: `[B, V]` fp32, i.i.d. Exp(1) and > 0; the bonus token is argmax_v w(v) / exp_noise(v)
        for the (unnormalized) bonus weights w, which samples v with probability w(v) / sum(w)
        (the exponential race, equivalent to Gumbel-max; vLLM's `random_sample` does the same).
    """

    uniforms: torch.Tensor
    exp_noise: torch.Tensor


def draw_randomness(
    batch: int, num_steps: int, vocab: int, *, generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> VerifyRandomness:
    """Draw the random tensors one standard verify step consumes.

    Args:
        batch: B requests. num_steps: κ draft positions (may be 0). vocab: V.
        generator: optional `torch.Generator` on `device` for reproducible draws (per-request seeds
            are the caller's business: draw rows with separate generators and `torch.stack` them).
    Returns:
        `VerifyRandomness(uniforms [B, κ] fp32 in [0, 1), exp_noise [B, V] fp32 >= tiny)`.
    """
    uniforms = torch.rand(batch, num_steps, generator=generator, device=device, dtype=torch.float32)
    exp_noise = torch.empty(batch, vocab, device=device, dtype=torch.float32).exponential_(generator=generator)
    # exponential_ can return exactly 0, which would turn w / noise into inf or nan.
    exp_noise.clamp_(min=torch.finfo(torch.float32).tiny)
    return VerifyRandomness(uniforms, exp_noise)
