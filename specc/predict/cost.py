"""The speculation cost model: what a candidate state costs per step and what it yields.

Every function here is small, pure and torch-free (``specc explain`` and ``specc check`` import it).
Sources, cited per function:

* **Speculative decoding's yield and speedup** (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", arXiv:2211.17192,
  eq. 1 and Theorem 3.8): yield E(α, κ) = (1 − α^(κ+1)) / (1 − α), step cost t_T(1 + κc) for chain
  drafting and t_T(1 + c) for parallel drafting, speedup S = E / cost; derived here from them, with
  the roofline step below: the break-even batch B = T*(E − κc)/(κ + 1) and S∞ = E / ((κ + 1) + c).
* **The roofline step model** (Williams, Waterman and Patterson 2009, "Roofline: an insightful
  visual performance model for multicore architectures", CACM 52(4)): step = max(weights /
  bandwidth, tokens · FLOPs / peak) + draft time, and from it the best κ per batch.
* **vLLM 0.33.0 adaptive verification** (``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``:
  the survival-probability budget, ``get_num_tokens`` at 305-373 and ``_assign_draft_token_budget``
  at 46-72; the profiled cost table, a step function over CUDA-graph capture sizes, at 80-128).

Units: times in seconds unless a name ends in ``_ms``; costs without a unit are in target-steps (one
plain batch-1 target forward = 1.0); bandwidth in bytes/s; compute in FLOP/s.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from specc.errors import PlanError, SpeccError
from specc.io import load_json
from specc.kernels.variants import VARIANTS

# ----------------------------------------------------------------------------------------------------
# Yield, step cost, speedup, break-even (Leviathan et al. 2023, arXiv:2211.17192)
# ----------------------------------------------------------------------------------------------------


def expected_tokens(alpha: float, num_steps: int) -> float:
    """E(α, κ): expected tokens emitted per step, bonus included (Leviathan et al. 2023, arXiv:2211.17192, eq. 1).

    E = Σ_{i=0..κ} α^i = (1 − α^(κ+1)) / (1 − α); E(1, κ) = κ + 1; E(α, 0) = 1 (plain decode).

    Args:
        alpha: per-position acceptance probability in [0, 1].
        num_steps: κ ≥ 0, the draft tokens proposed per step.
    Raises:
        ValueError: α outside [0, 1] or κ < 0.
    """
    if not 0.0 <= alpha <= 1.0 or math.isnan(alpha):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if num_steps < 0:
        raise ValueError(f"num_steps (κ) must be >= 0, got {num_steps}")
    return float(sum(alpha ** i for i in range(num_steps + 1)))


def alpha_for_expected_tokens(target_e: float, num_steps: int) -> float:
    """Invert E(α, κ) = target_e for α by bisection (E is increasing in α on [0, 1]).

    Used to turn a mean acceptance length (vLLM's synthetic ``acceptance_length``, Spec-Bench's τ)
    into a per-position α. Raises ValueError if target_e is outside [1, κ + 1].
    """
    if not 1.0 <= target_e <= num_steps + 1:
        raise ValueError(f"E must lie in [1, κ+1] = [1, {num_steps + 1}], got {target_e}")
    return bisect_increasing(lambda a: expected_tokens(a, num_steps), target_e)


def step_cost_chain(num_steps: int, c: float) -> float:
    """Chain drafting step cost in target-steps: 1 + κc (e.g. 1 + 3·0.165 = 1.495).

    κ sequential draft passes, each costing c = t_draft / t_target, then one target verify.
    """
    return 1.0 + num_steps * c


def step_cost_modules(costs: Sequence[float]) -> float:
    """Step cost of one distinct draft module per draft step (multi-layer EAGLE): 1 + Σ c_i over the
    modules the step runs: one invocation per step, so the traffic is the sum over the steps, Σ c_i
    (κc for equal per-call cost), not a second factor of κ hidden inside c.
    ``costs``: c_i = t_module_i / t_target per module run."""
    return 1.0 + float(sum(costs))


def draft_kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_value: float) -> int:
    """Draft KV bytes per token: 2 (K and V) · layers · kv_heads · head_dim · bytes (e.g.
    h_kv = 8, d_h = 128, bf16 gives 2 × 8 × 128 × 2 = 4 KiB per token per layer;
    SmolLM2-135M's h_kv = 3, d_h = 64 in fp32 gives 1,536 B)."""
    return int(2 * layers * kv_heads * head_dim * bytes_per_value)


def step_cost_parallel(num_steps: int, c: float) -> float:
    """Parallel (block) drafting step cost: 1 + c — one draft pass emits all κ tokens (DFlash, DSpark,
    PARD, P-EAGLE; e.g. 1 + 0.165 = 1.165). κ = 0 drafts nothing: cost 1."""
    return 1.0 if num_steps == 0 else 1.0 + c


def tree_pool_size(num_steps: int, topk: int) -> int:
    """Draft-tree candidate pool of SGLang's EAGLE tree: topk + (κ − 1)·topk² nodes
    (SGLang 0.5.23 sglang/srt/speculative/eagle_worker_v2.py:742-919). κ = 0 → 0."""
    if num_steps <= 0:
        return 0
    return topk + (num_steps - 1) * topk * topk


def tree_level_inputs(num_steps: int, topk: int) -> List[int]:
    """Tokens fed to the draft model per tree level (per request): level 0 expands the root (1 input),
    every later level expands the topk kept beams (SGLang 0.5.23
    sglang/srt/speculative/eagle_worker_v2.py:742-919, ``_select_top_k_tokens_later``)."""
    return [1 if level == 0 else topk for level in range(num_steps)]


def step_cost_tree(num_steps: int, topk: int, c: float, verify_width: int,
                   saturation_tokens: Optional[float] = None) -> float:
    """Tree drafting step cost in target-steps.

    One draft pass per level (each level batches its topk beams into one pass) and one target verify
    over ``verify_width`` tokens (bonus/root included). In the memory-bound model
    (``saturation_tokens`` None) a pass costs the same whatever its width, so the cost is 1 + κc, as a
    chain. With ``saturation_tokens`` = T* (tokens per forward at which the model turns compute-bound,
    the roofline's ridge point) a pass over n tokens costs max(1, n / T*) of its memory-bound time: the
    verify costs max(1, W / T*) and level i costs c·max(1, inputs_i / T*).
    """
    if saturation_tokens is None:
        return 1.0 + num_steps * c
    verify = max(1.0, verify_width / saturation_tokens)
    draft = sum(c * max(1.0, n / saturation_tokens) for n in tree_level_inputs(num_steps, topk))
    return verify + draft


def tree_expected_tokens(tree_choices: Sequence[Sequence[int]], alpha: float) -> float:
    """Expected emitted tokens of a static draft tree (Medusa-style ``tree_choices``: each node is the
    path of child ranks from the root), bonus included.

    Model (an assumption, stated): the rank-r candidate at a position is the accepted one with
    probability α·(1 − α)^r — the top candidate with α, and each lower rank only when all higher ranks
    missed. A node is on the accepted path iff every node on its path is; E = 1 + Σ_nodes P(path).
    With ranks all 0 (a chain of depth κ) this is exactly E(α, κ).
    """
    total = 1.0
    for path in tree_choices:
        p = 1.0
        for rank in path:
            p *= alpha * (1.0 - alpha) ** rank
        total += p
    return total


def speedup(expected: float, cost: float) -> float:
    """S = E / cost (Leviathan et al. 2023, arXiv:2211.17192, Theorem 3.8): tokens per step over the step's cost in plain-decode target-steps."""
    return expected / cost


def speedup_chain(alpha: float, num_steps: int, c: float) -> float:
    """Chain speedup E(α, κ) / (1 + κc) (e.g. α = 0.70, κ = 3, c = 0.165: 2.533 / 1.495 = 1.69)."""
    return expected_tokens(alpha, num_steps) / step_cost_chain(num_steps, c)


def speedup_parallel(alpha: float, num_steps: int, c: float) -> float:
    """Parallel speedup E(α, κ) / (1 + c) (e.g. α = 0.70, κ = 3, c = 0.165: 2.533 / 1.165 = 2.17)."""
    return expected_tokens(alpha, num_steps) / step_cost_parallel(num_steps, c)


def break_even_batch(alpha: float, num_steps: int, c: float, saturation_tokens: float,
                     parallel: bool = False) -> float:
    """Batch size above which speculation stops paying: B = T*(E − κc)/(κ + 1) for chain drafting,
    B = T*(E − c)/(κ + 1) for parallel drafting (≈150 and ≈175 with T* = 295, E = 2.533, κ = 3,
    c = 0.165: Llama-3-8B with a 1B-class draft on an H100).

    Derivation (costs in batch-1 target-steps, d = κc chain or c parallel): a target pass over n
    tokens costs max(1, n/T*). Per step at batch B ≤ T*, plain decode costs 1 and yields B tokens;
    speculation costs max(1, B(κ + 1)/T*) + d and yields B·E. In the compute-bound branch
    (B(κ + 1)/T* ≥ 1) the two tie at B(κ + 1)/T* + d = E, i.e. the formula above. That root lies in
    the branch — so the formula is meaningful — iff E − d ≥ 1, i.e. iff speculation pays at batch 1
    (E / (1 + d) ≥ 1). If E − d < 1 speculation costs 1 + d > E in the memory-bound branch and more
    past it: it pays at no batch size, and the formula's value (some B < T*/(κ + 1), possibly > 1)
    would be meaningless, so **0.0** is returned ("pays below batch 1", i.e. never; ``specc explain``
    prints ``<1``). The root never exceeds T* because E ≤ κ + 1, so plain decode's memory-bound
    assumption holds there.

    Args:
        alpha: per-position acceptance α in [0, 1].
        num_steps: κ ≥ 0. κ = 0 returns +inf (plain decode never loses to itself).
        c: draft cost ratio t_draft / t_target, finite and ≥ 0.
        saturation_tokens: T*, tokens per target pass at which it turns compute-bound (> 0).
        parallel: one draft pass per step (d = c) instead of κ (d = κc).
    Returns: the break-even batch (requests, float), 0.0 if speculation never pays, +inf for κ = 0.
    Raises: ValueError for c < 0 or non-finite, T* ≤ 0, or a bad α / κ (:func:`expected_tokens`).
    """
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"draft cost ratio c must be finite and >= 0, got {c}")
    if not saturation_tokens > 0:
        raise ValueError(f"saturation_tokens (T*) must be > 0, got {saturation_tokens}")
    if num_steps == 0:
        return math.inf
    e = expected_tokens(alpha, num_steps)
    draft = c if parallel else num_steps * c
    return break_even_from(e, draft, num_steps + 1, saturation_tokens)


def break_even_from(expected: float, draft_cost: float, width: int, saturation_tokens: float) -> float:
    """Break-even batch T*(E − d)/W for a step yielding ``expected`` tokens (E) with draft cost ``d``
    (target-steps) and a verify of ``width`` tokens per request (W, κ + 1 for a chain); 0.0 when
    E − d < 1, where speculation pays at no batch size (see :func:`break_even_batch` for the
    derivation and why the formula only holds for E − d ≥ 1)."""
    if expected - draft_cost < 1.0:
        return 0.0
    return saturation_tokens * (expected - draft_cost) / width


def s_infinity(alpha: float, num_steps: int, c: float, parallel: bool = False) -> float:
    """Large-batch speedup limit S∞ = E / ((κ + 1) + c) for parallel drafting (e.g.
    2.533 / 4.165 = 0.61) and E / ((κ + 1) + κc) for chain drafting. Always < 1 for κ ≥ 1 and α < 1
    because E ≤ κ + 1: at high batch speculation never pays."""
    e = expected_tokens(alpha, num_steps)
    draft = c if parallel else num_steps * c
    return e / ((num_steps + 1) + draft)


def bisect_increasing(fn: Callable[[float], float], target: float, lo: float = 0.0,
                      hi: float = 1.0, iterations: int = 60) -> float:
    """Smallest x in [lo, hi] with fn(x) ≥ target, for fn non-decreasing, by bisection
    (``iterations`` halvings). Returns hi if fn(hi) < target."""
    for _ in range(iterations):
        mid = (lo + hi) / 2.0
        if fn(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def alpha_to_beat_plain(num_steps: int, c: float, parallel: bool = False) -> float:
    """Acceptance α at which speculation ties plain decode: E(α, κ) = cost (e.g.
    E(α, 3) > 1.165 gives α ≈ 0.142 for parallel drafting with c = 0.165)."""
    cost = step_cost_parallel(num_steps, c) if parallel else step_cost_chain(num_steps, c)
    return bisect_increasing(lambda a: expected_tokens(a, num_steps), cost)


def alpha_to_beat(target_speedup: float, num_steps: int, c: float, parallel: bool = True) -> float:
    """Acceptance α at which a proposal with (κ, c, chain|parallel) reaches ``target_speedup`` — e.g.
    a given chain's speedup (by bisection: a parallel κ = 3,
    c = 0.165 proposal needs α ≈ 0.536 to beat the α = 0.70 chain's 1.694×)."""
    cost = step_cost_parallel(num_steps, c) if parallel else step_cost_chain(num_steps, c)
    return bisect_increasing(lambda a: expected_tokens(a, num_steps) / cost, target_speedup)


# ----------------------------------------------------------------------------------------------------
# "The higher the load, the smaller K should be": the batch model
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator's roofline numbers (conf/hardware/<name>.yaml).

    ``bandwidth`` bytes/s and ``peak_flops`` FLOP/s are datasheet peaks; the efficiencies turn them
    into effective numbers (e.g. 0.8 of bandwidth, 0.5 of compute).
    ``memory_bytes``: device memory as the driver reports it (None: unknown, e.g. a CPU);
    ``interconnect_bytes_per_s``: GPU-to-GPU bandwidth per direction (NVLink), derated by
    ``interconnect_efficiency``; ``interconnect_latency_s``: the fixed cost of one collective
    (small-message all-reduce). Used by :mod:`specc.predict.deploy_cost`.
    """

    name: str
    bandwidth: float
    peak_flops: float
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.5
    dtype: str = "bfloat16"
    source: str = ""
    memory_bytes: Optional[float] = None
    interconnect_bytes_per_s: Optional[float] = None
    interconnect_efficiency: float = 0.8
    interconnect_latency_s: float = 0.0

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.bandwidth_efficiency

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.flops_efficiency

    @property
    def effective_interconnect(self) -> Optional[float]:
        """Bytes/s per direction a ring collective moves (None without an interconnect figure)."""
        if not self.interconnect_bytes_per_s:
            return None
        return self.interconnect_bytes_per_s * self.interconnect_efficiency


@dataclass(frozen=True)
class BatchModel:
    """The roofline step model (Williams et al. 2009, CACM 52(4)): a target step over n tokens takes
    max(weight_bytes / bandwidth, n · flops_per_token / flops) seconds; a draft pass takes
    ``draft_time`` seconds (memory-bound, independent of batch). ``step_time_fn`` (tokens → seconds)
    replaces the roofline when a profiled cost table is used.
    """

    weight_bytes: float = 0.0
    bandwidth: float = 1.0
    flops_per_token: float = 0.0
    flops: float = 1.0
    draft_time: float = 0.0
    step_time_fn: Optional[Callable[[int], float]] = field(default=None, compare=False)
    draft_time_fn: Optional[Callable[[int], float]] = field(default=None, compare=False)

    def step_time(self, tokens: int) -> float:
        """Target forward time in seconds for ``tokens`` tokens in the batch."""
        if self.step_time_fn is not None:
            return self.step_time_fn(tokens)
        return target_step_time(tokens, self.weight_bytes, self.bandwidth, self.flops_per_token,
                                self.flops)

    def draft_pass_time(self, batch: int) -> float:
        """One draft forward pass over ``batch`` requests, seconds."""
        if self.draft_time_fn is not None:
            return self.draft_time_fn(batch)
        return self.draft_time

    @property
    def saturation_tokens(self) -> float:
        """T*: tokens per forward at which the roofline turns compute-bound
        (weight_bytes / bandwidth) / (flops_per_token / flops)."""
        return (self.weight_bytes / self.bandwidth) / (self.flops_per_token / self.flops)


def target_step_time(tokens: int, weight_bytes: float, bandwidth: float, flops_per_token: float,
                     flops: float) -> float:
    """max(weights / bandwidth, tokens · FLOPs / peak), seconds (the roofline): each
    step reads the weights once (the memory floor) and with many tokens becomes compute-bound."""
    return max(weight_bytes / bandwidth, tokens * flops_per_token / flops)


def batch_step_time(batch: int, num_steps: int, model: BatchModel, parallel: bool = False,
                    drafts: Optional[float] = None, lookup: bool = False) -> float:
    """Seconds per speculative step at ``batch`` requests: draft (κ passes, or one block pass, or one
    lookup) plus one verify over batch·(1 + d) tokens, d = ``drafts`` per
    request and step when measured (a lookup drafts only what its match gives), else κ. κ = 0 has no
    draft."""
    if num_steps == 0:
        draft = 0.0
    else:
        draft = model.draft_pass_time(batch) * (1 if parallel or lookup else num_steps)
    d = num_steps if drafts is None else float(drafts)
    return draft + model.step_time(max(1, int(round(batch * (1 + d)))))


def batch_throughput(batch: int, num_steps: int, alpha: float, model: BatchModel,
                     parallel: bool = False, expected: Optional[float] = None,
                     drafts: Optional[float] = None, lookup: bool = False) -> float:
    """Tokens/s at ``batch`` requests: batch · E / step seconds, with
    E = E(α, κ), or ``expected`` when given (a measured E, e.g. from per-position rates), and the
    verify's ``drafts`` and the ``lookup`` draft as :func:`batch_step_time` takes them."""
    e = expected_tokens(alpha, num_steps) if expected is None else float(expected)
    return batch * e / batch_step_time(batch, num_steps, model, parallel, drafts, lookup)


def expected_tokens_from_rates(rates: Sequence[float], num_steps: int, tail_alpha: float = 0.0) -> float:
    """E at κ = ``num_steps`` from measured per-position rates: 1 + Σ_{i<κ} r_i, where r_i is vLLM's
    accepted-at-position-i count over verify steps (so at the measured κ, E is the run's τ). Past the
    measured positions each further one keeps the last rate times ``tail_alpha`` per step (the
    geometric tail of E(α, κ) = Σ α^i). With r_i = α^(i+1) this is exactly E(α, κ)."""
    if num_steps <= 0:
        return 1.0
    rs = [float(r) for r in rates[:num_steps]]
    last = float(rates[-1]) if len(rates) else 0.0
    for j in range(1, num_steps - len(rs) + 1):
        rs.append(last * tail_alpha ** j)
    return 1.0 + sum(rs)


def decode_step_ms(batch: int, verify_tokens: float, verify_ms: Callable[[int], float], draft_passes: int,
                   draft_pass_ms: float, extend_ms: float = 0.0, other_ms: float = 0.0) -> float:
    """Milliseconds of one continuous-batching decode step at ``batch`` requests: ``draft_passes``
    draft passes of ``draft_pass_ms`` each, one verify over ``verify_tokens`` target tokens (the
    profiled table's ``verify_ms``: forward + accept), the drafter's extend (``extend_ms``) and the
    step's host work (``other_ms``: emit, commit, scheduling). The roofline step = draft +
    verify(tokens), with the two terms a profiled table leaves out added as measured."""
    tokens = max(1, int(round(verify_tokens)))
    return draft_passes * draft_pass_ms + verify_ms(tokens) + extend_ms + other_ms


def decode_throughput(batch: float, expected: float, step_ms: float) -> float:
    """Decode tokens/s = batch · E / step seconds."""
    return batch * expected / step_ms * 1e3 if step_ms > 0 else 0.0


def best_num_steps(batch: int, alpha: float, model: BatchModel, parallel: bool = False,
                   max_steps: int = 8, candidates: Optional[Sequence[int]] = None) -> Tuple[int, float]:
    """The κ in ``candidates`` (default 0..max_steps) that maximises
    throughput at ``batch``; ties go to the smaller κ (the first maximum over an ascending range).
    Returns (κ, tokens/s)."""
    ks = list(range(max_steps + 1)) if candidates is None else sorted(set(candidates))
    best_k = max(ks, key=lambda k: batch_throughput(batch, k, alpha, model, parallel))
    return best_k, batch_throughput(batch, best_k, alpha, model, parallel)


# ----------------------------------------------------------------------------------------------------
# Budgeted verification (vLLM 0.33.0 vllm/v1/worker/gpu/spec_decode/adaptive_verification.py:46-72, 305-373)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetSelection:
    """Result of :func:`select_verify_budget`.

    ``budget``: draft positions admitted in total (b*); ``admitted``: positions admitted per request
    (a prefix of each request: positions 0..admitted[r]-1); ``rate``: predicted tokens/s at b*;
    ``rates``: predicted tokens/s for every b in 0..B; ``scores``: sorted survival scores (descending).
    """

    budget: int
    admitted: Tuple[int, ...]
    rate: float
    rates: Tuple[float, ...]
    scores: Tuple[float, ...]


def log_survival(confidences: Sequence[Sequence[float]]) -> np.ndarray:
    """Log survival probabilities: log ∏_{j≤k} conf[r, j], as a cumulative sum of logs, so products of
    many small confidences do not underflow to 0.

    Args:
        confidences: [R, K] per-(request, position) acceptance confidences in [0, 1].
    Returns:
        [R, K] float64, non-increasing along each row; −inf where a zero confidence was met.
    Raises:
        ValueError: NaN, or values outside [0, 1], or not a 2-D array.
    """
    conf = np.asarray(confidences, dtype=np.float64)
    if conf.ndim != 2:
        raise ValueError(f"confidences must be [requests, positions], got shape {conf.shape}")
    if np.isnan(conf).any() or (conf < 0).any() or (conf > 1).any():
        raise ValueError("confidences must lie in [0, 1] (no NaN)")
    with np.errstate(divide="ignore"):
        logs = np.log(conf)  # [R, K], −inf at zeros
    return np.cumsum(logs, axis=1)


def admission_order(log_surv: np.ndarray) -> np.ndarray:
    """Flat slot indices (r·K + k) in admission order: highest survival first; ties go to the earlier
    position, then the earlier request (a deterministic "earlier-position-first" rule, instead of
    ``torch.topk``'s unspecified tie
    order).

    Because log survival is non-increasing along a row and ties prefer earlier positions, every prefix
    of this order admits a prefix of each request. Input [R, K]; output [R·K] int64.
    """
    rows, cols = log_surv.shape
    req = np.repeat(np.arange(rows), cols)
    pos = np.tile(np.arange(cols), rows)
    neg = -log_surv.reshape(-1)  # +inf for zero-survival slots: they sort last
    return np.lexsort((req, pos, neg))


def select_verify_budget(confidences: Sequence[Sequence[float]], step_time: Callable[[int], float],
                         draft_time: float = 0.0, num_non_draft_tokens: Optional[int] = None,
                         num_emitting_requests: Optional[int] = None,
                         max_budget: Optional[int] = None) -> BudgetSelection:
    """Budgeted verification: admit the globally best draft slots by survival probability, with the
    number admitted b* = argmax_b (S + Σ_{j<b} score_j) / (draft_time + step_time(N_nd + b)).

    vLLM 0.33.0 vllm/v1/worker/gpu/spec_decode/adaptive_verification.py:305-373 (budget,
    ``get_num_tokens``) and :46-72 (slot assignment, ``_assign_draft_token_budget``). ``np.argmax`` returns the
    first maximum, so the smallest budget wins
    ties (vLLM's tie rule). Slot order is :func:`admission_order`, so the admitted set is always a
    prefix of each request, also under ties, zero confidences and underflow.

    Args:
        confidences: [R, K] per-position confidences in [0, 1] (R requests, K draft positions).
        step_time: verify time in seconds for a given total token count.
        draft_time: seconds of drafting this step (paid whatever the budget).
        num_non_draft_tokens: N_nd, tokens verified regardless (default R: one bonus per request).
        num_emitting_requests: S, requests that emit ≥ 1 token regardless (default R).
        max_budget: B, the largest budget considered (default R·K).
    Raises:
        ValueError: bad confidences (see :func:`log_survival`).
    """
    ls = log_survival(confidences)  # [R, K]
    rows, cols = ls.shape
    n_nd = rows if num_non_draft_tokens is None else num_non_draft_tokens
    s = rows if num_emitting_requests is None else num_emitting_requests
    big_b = rows * cols if max_budget is None else max(0, min(max_budget, rows * cols))
    order = admission_order(ls)  # [R·K]
    scores = np.exp(ls.reshape(-1)[order])  # [R·K], descending; underflow → 0.0 (harmless here)
    gain = np.concatenate(([0.0], np.cumsum(scores[:big_b])))  # [B+1]
    rates = np.array([(s + gain[b]) / (draft_time + step_time(n_nd + b)) for b in range(big_b + 1)])
    b_star = int(np.argmax(rates))
    admitted = np.zeros(rows, dtype=np.int64)
    np.add.at(admitted, order[:b_star] // cols, 1)
    return BudgetSelection(budget=b_star, admitted=tuple(int(a) for a in admitted),
                           rate=float(rates[b_star]), rates=tuple(float(r) for r in rates),
                           scores=tuple(float(x) for x in scores))


def admitted_mask(order: np.ndarray, budget: int, shape: Tuple[int, int]) -> np.ndarray:
    """[R, K] bool mask of the slots admitted by the first ``budget`` entries of ``order``."""
    mask = np.zeros(shape[0] * shape[1], dtype=bool)
    mask[order[:budget]] = True
    return mask.reshape(shape)


def is_prefix_admission(mask: np.ndarray) -> bool:
    """True iff every row of an [R, K] bool mask is a prefix (True…True False…False)."""
    mask = np.asarray(mask, dtype=bool)
    counts = mask.sum(axis=1)
    expect = np.arange(mask.shape[1])[None, :] < counts[:, None]
    return bool((mask == expect).all())


# ----------------------------------------------------------------------------------------------------
# Hardware profiles and profiled cost tables
# ----------------------------------------------------------------------------------------------------

HARDWARE_DIR = Path(__file__).resolve().parents[2] / "conf" / "hardware"


def load_hardware_profile(name_or_path: str) -> HardwareProfile:
    """Load ``conf/hardware/<name>.yaml`` (or a YAML file path) into a :class:`HardwareProfile`.

    Required keys: ``bandwidth_bytes_per_s``, ``peak_flops``; optional ``bandwidth_efficiency``,
    ``flops_efficiency``, ``dtype``, ``source``. Raises PlanError naming ``schedule.hardware`` and the
    available profiles when the profile is missing or malformed.
    """
    import yaml

    path = Path(name_or_path)
    if not path.suffix:
        path = HARDWARE_DIR / f"{name_or_path}.yaml"
    available = sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))
    if not path.is_file():
        raise PlanError(f"schedule.hardware: no hardware profile '{name_or_path}' ({path}); "
                        f"use one of {available} or a YAML file path")
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return HardwareProfile(
            name=str(data.get("name", path.stem)),
            bandwidth=float(data["bandwidth_bytes_per_s"]),
            peak_flops=float(data["peak_flops"]),
            bandwidth_efficiency=float(data.get("bandwidth_efficiency", 0.8)),
            flops_efficiency=float(data.get("flops_efficiency", 0.5)),
            dtype=str(data.get("dtype", "bfloat16")),
            source=str(data.get("source", "")),
            memory_bytes=_opt_float(data.get("memory_bytes")),
            interconnect_bytes_per_s=_opt_float(data.get("interconnect_bytes_per_s")),
            interconnect_efficiency=float(data.get("interconnect_efficiency", 0.8)),
            interconnect_latency_s=float(data.get("interconnect_latency_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise PlanError(f"{path}: malformed hardware profile ({exc!r}); it needs numeric "
                        "bandwidth_bytes_per_s and peak_flops") from None


def _opt_float(v) -> Optional[float]:
    return None if v is None else float(v)


def _monotone_table(points: Dict[int, float]) -> Tuple[np.ndarray, np.ndarray]:
    xs = np.array(sorted(points), dtype=np.int64)
    ys = np.maximum.accumulate(np.array([points[int(x)] for x in xs], dtype=np.float64))
    return xs, ys


def _step_lookup(xs: np.ndarray, ys: np.ndarray, limit: int, v: float) -> float:
    """vLLM's ``build_table`` lookup (adaptive_verification.py:80-128): at or below the capture limit, the cost of the first
    profiled size ≥ v (padding to the next captured size: a step function); above it, linear
    interpolation over profiled points above the limit; beyond the last point, linear extrapolation
    from the last two points."""
    if v <= limit:
        i = int(np.searchsorted(xs, v, side="left"))
        return float(ys[min(i, len(xs) - 1)])
    above = xs > limit
    ax, ay = xs[above], ys[above]
    if len(ax) == 0:  # nothing profiled past the limit: extrapolate from the last two points
        ax, ay = xs[-2:], ys[-2:]
    if len(ax) == 1:
        return float(ay[0])
    if v <= ax[-1]:
        return float(np.interp(v, ax, ay))
    slope = (ay[-1] - ay[-2]) / (ax[-1] - ax[-2])
    return float(ay[-1] + slope * (v - ax[-1]))


@dataclass(frozen=True)
class CostTable:
    """A profiled cost table: verify (target forward) milliseconds by token count and, optionally,
    draft-pass milliseconds by number of requests.

    JSON format (written by ``specc profile``)::

        {"format": "specc-cost-table/1", "device": "cpu",
         "capture_sizes": [1, 2, 4, 8, 16, 32],          # optional; default: the verify keys
         "verify_ms": {"1": 7.9, "2": 8.1, ...},          # tokens -> ms
         "draft_ms": {"1": 0.9, "4": 1.0, ...},           # requests -> ms (optional)
         "method": "ngram",                               # the drafter draft_ms timed (optional)
         "choice": {"dtype": "bfloat16", "compile_backend": "eager"},  # fastest setting measured (optional;
                                                          # with "qgemm_variant" for a native target)
         "settings": {"float32/eager": {"forward_ms": {...}}, ...},     # every setting measured (optional)
         "cpu": {"model": ..., "capability": "AVX512", "onednn_isa": ..., "amx": true}}  # (optional)

    ``draft_ms`` times one pass of the profiled plan's drafter: it stands for another method's draft
    pass only when the table names no method (:meth:`draft_applies`).

    Lookups follow vLLM's ``build_table`` (vLLM 0.33.0
    vllm/v1/worker/gpu/spec_decode/adaptive_verification.py:80-128): values made monotone,
    a step function up to the capture limit, linear beyond it.
    """

    verify_x: Tuple[int, ...]
    verify_ms: Tuple[float, ...]
    capture_limit: int
    draft_x: Tuple[int, ...] = ()
    draft_ms: Tuple[float, ...] = ()
    device: str = ""
    path: str = ""
    method: str = ""
    choice: Optional[Dict[str, str]] = None  # {"dtype", "compile_backend"[, "qgemm_variant"]} measured fastest
    settings: Optional[Dict[str, Dict[str, float]]] = None  # setting -> {tokens: forward ms}
    choice_why: str = ""  # why the profile chose ``choice`` (``specc.runtime.profile.choose``)

    def draft_applies(self, method: str) -> bool:
        """True when ``draft_ms`` is profiled and times ``method``'s drafter (or names no method)."""
        return bool(self.draft_x) and self.method in ("", method)

    def step_ms(self, tokens: int) -> float:
        """Verify milliseconds for ``tokens`` target tokens; floored at 1e-6 like vLLM's table."""
        return max(1e-6, _step_lookup(np.array(self.verify_x), np.array(self.verify_ms),
                                      self.capture_limit, tokens))

    def draft_pass_ms(self, num_requests: int) -> Optional[float]:
        """Draft-pass milliseconds for ``num_requests`` requests, or None if not profiled."""
        if not self.draft_x:
            return None
        xs = np.array(self.draft_x)
        return max(0.0, _step_lookup(xs, np.array(self.draft_ms), int(xs[-1]), num_requests))


def _setting_forward_ms(name: Any, value: Any, table: Callable[[Any, str], Dict[int, float]]) -> Dict[int, float]:
    """One ``settings`` entry of a cost table as ``{tokens: forward ms}``: its ``forward_ms`` table (an
    eager setting, every profiled token count), else the one-request shapes of its ``state_ms``
    (``"1xW"`` → W tokens; a compiled setting is timed at the plan's state shapes only). Raises
    ValueError naming the entry when it has neither."""
    if not isinstance(value, dict):
        raise ValueError(f"settings.{name} must be an object with 'forward_ms' or 'state_ms'")
    if value.get("forward_ms") is not None:
        return table(value["forward_ms"], f"settings.{name}.forward_ms")
    state = value.get("state_ms")
    if not isinstance(state, dict) or not state:
        raise ValueError(f"settings.{name} has neither 'forward_ms' nor 'state_ms'")
    ones = {}
    for shape, ms in state.items():
        b, _, w = str(shape).partition("x")
        if not (b.isdigit() and w.isdigit()):
            raise ValueError(f"settings.{name}.state_ms[{shape!r}]: keys are 'BxW' (requests x verify tokens)")
        if int(b) == 1:
            ones[w] = ms
    return table(ones, f"settings.{name}.state_ms") if ones else {}


COST_TABLE_HINT = ('give a cost table JSON (see `specc profile`: `specc profile PLAN --out FILE` writes one; '
                   'format {"format": "specc-cost-table/1", "verify_ms": {"1": 7.9, "2": 8.1, ...}}, '
                   'token count -> milliseconds, as specc.predict.cost.CostTable documents)')


def load_cost_table(path: str) -> CostTable:
    """Read a cost-table JSON (format in :class:`CostTable`): a regular file of at most
    :data:`specc.io.COST_TABLE_LIMIT` bytes (:func:`specc.io.read_bounded`) whose ``verify_ms``
    (and optional ``draft_ms``) map positive integer counts to finite milliseconds >= 0.
    ``pkg://<package>/<file>`` paths are resolved first.

    Raises:
        PlanError: naming ``schedule.cost_table``, the file and how to get a table, when the file is
            missing, not a regular file, too large, not JSON, or its tables are malformed.
    """
    from specc.io import COST_TABLE_LIMIT, read_bounded

    if str(path).startswith("pkg://"):
        from specc.models.resolve import resolve_model_path

        try:
            path = str(resolve_model_path(str(path)))
        except SpeccError as exc:
            raise PlanError(f"schedule.cost_table: {exc}") from None
    p = Path(path)
    if not os.path.lexists(p):
        raise PlanError(f"schedule.cost_table: file not found: {p}; {COST_TABLE_HINT}")
    try:
        text = read_bounded(p, COST_TABLE_LIMIT, "cost table", error=PlanError)
    except PlanError as exc:
        raise PlanError(f"schedule.cost_table: {exc}") from None

    def table(obj, key: str) -> Dict[int, float]:
        if not isinstance(obj, dict):
            raise ValueError(f"{key!r} must be an object mapping counts to milliseconds")
        out = {}
        for k, v in obj.items():
            n, ms = int(k), float(v)
            if n < 1 or not math.isfinite(ms) or ms < 0:
                raise ValueError(f"{key}[{k!r}] = {v!r}: counts must be integers >= 1 and times finite ms >= 0")
            out[n] = ms
        return out

    try:
        data = load_json(text, "the file", error=ValueError)
        if not isinstance(data, dict):
            raise ValueError("the file must hold a JSON object")
        if "verify_ms" not in data:
            raise ValueError("no 'verify_ms' key")
        verify = table(data["verify_ms"], "verify_ms")
        draft = table(data.get("draft_ms") or {}, "draft_ms")
        if len(verify) < 1:
            raise ValueError("verify_ms is empty")
        captures = data.get("capture_sizes") or list(verify)
        if not isinstance(captures, list) or not all(isinstance(c, int) and c >= 1 for c in captures):
            raise ValueError("capture_sizes must be a list of integers >= 1")
        choice = data.get("choice")
        why = ""
        if choice is not None:
            if (not isinstance(choice, dict) or choice.get("dtype") not in ("native", "float32", "bfloat16", "float16")
                    or choice.get("compile_backend") not in ("eager", "inductor")):
                raise ValueError("choice must be {dtype: native|float32|bfloat16|float16, compile_backend: eager|inductor}")
            why = str(choice.get("why") or "")
            variant = choice.get("qgemm_variant")
            if variant is not None and variant not in VARIANTS:
                raise ValueError(f"choice.qgemm_variant {variant!r} is not a CPU kernel variant; use one of "
                                 f"{', '.join(VARIANTS)} (or re-run `specc profile`)")
            choice = {"dtype": choice["dtype"], "compile_backend": choice["compile_backend"]} | (
                {"qgemm_variant": variant} if variant else {})
        settings = data.get("settings")
        if settings is not None:
            if not isinstance(settings, dict):
                raise ValueError("settings must map a setting name to its tables")
            settings = {str(k): _setting_forward_ms(k, v, table) for k, v in settings.items()}
    except (ValueError, TypeError, OverflowError) as exc:
        raise PlanError(f"schedule.cost_table: {p} is not a cost table ({exc}); {COST_TABLE_HINT}") from None
    vx, vy = _monotone_table(verify)
    dx, dy = _monotone_table(draft) if draft else (np.array([], dtype=np.int64), np.array([]))
    return CostTable(verify_x=tuple(int(x) for x in vx), verify_ms=tuple(float(y) for y in vy),
                     capture_limit=int(max(captures)), draft_x=tuple(int(x) for x in dx),
                     draft_ms=tuple(float(y) for y in dy), device=str(data.get("device", "")),
                     path=str(p), method=str(data.get("method") or ""), choice=choice, settings=settings,
                     choice_why=why)


def batch_model_from_table(table: CostTable, fallback_draft_ratio: float = 0.0,
                           method: Optional[str] = None) -> BatchModel:
    """A :class:`BatchModel` whose step time comes from a profiled table (ms → s). Draft passes use
    the table's ``draft_ms`` when profiled for ``method``'s drafter (:meth:`CostTable.draft_applies`;
    ``method`` None: whenever profiled), else ``fallback_draft_ratio`` × the one-token step."""
    if table.draft_x if method is None else table.draft_applies(method):
        draft_fn = lambda b: (table.draft_pass_ms(b) or 0.0) / 1e3  # noqa: E731
    else:
        draft_fn = lambda b: fallback_draft_ratio * table.step_ms(1) / 1e3  # noqa: E731
    return BatchModel(step_time_fn=lambda n: table.step_ms(n) / 1e3, draft_time_fn=draft_fn)


def batch_model_from_hardware(hw: HardwareProfile, num_params: float, bytes_per_param: float,
                              draft_time: float) -> BatchModel:
    """The roofline :class:`BatchModel` for a dense model of ``num_params`` parameters stored with
    ``bytes_per_param`` bytes each on ``hw``: weights = params·bytes, FLOPs/token = 2·params (e.g.
    16e9 bytes and 2·8e9 FLOPs per token for an 8B model in bf16)."""
    if num_params <= 0:
        raise SpeccError("num_params must be positive")
    return BatchModel(weight_bytes=num_params * bytes_per_param, bandwidth=hw.effective_bandwidth,
                      flops_per_token=2.0 * num_params, flops=hw.effective_flops, draft_time=draft_time)


# ----------------------------------------------------------------------------------------------------
# Per-state prediction (what `specc explain` prints and codegen records)
# ----------------------------------------------------------------------------------------------------


def saturation_tokens(hw: HardwareProfile, bytes_per_param: float, effective: bool = True) -> float:
    """T*, the tokens per forward at which a dense model turns compute-bound on ``hw``:
    (bytes_per_param / bandwidth) / (2 / flops). With datasheet peaks (``effective=False``) and bf16
    (2 bytes) on an H100 (SXM datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s) this is 989e12 / 3.35e12 ≈ 295."""
    bw = hw.effective_bandwidth if effective else hw.bandwidth
    fl = hw.effective_flops if effective else hw.peak_flops
    return (bytes_per_param / bw) / (2.0 / fl)


def dynamic_tree_expected_tokens(alpha: float, num_steps: int, topk: int, verify_width: int) -> float:
    """E for a dynamic draft tree verifying the best ``verify_width − 1`` nodes (SGLang's
    ``organize_draft_results`` keeps the top nodes by cumulative score; SGLang 0.5.23
    sglang/srt/speculative/eagle_worker_v2.py:742-919), under the
    rank model of :func:`tree_expected_tokens`. Nodes are taken best-first over the full topk-ary tree
    of depth κ (an upper bound on SGLang's beam-limited pool). Bonus included."""
    import heapq

    total, taken = 1.0, 0
    heap = [(-alpha * (1.0 - alpha) ** r, 1, (r,)) for r in range(topk)]
    heapq.heapify(heap)
    while heap and taken < verify_width - 1:
        neg_p, depth, path = heapq.heappop(heap)
        total += -neg_p
        taken += 1
        if depth < num_steps:
            for r in range(topk):
                heapq.heappush(heap, (neg_p * alpha * (1.0 - alpha) ** r, depth + 1, path + (r,)))
    return total


@dataclass(frozen=True)
class Prediction:
    """The cost model's prediction for one candidate state.

    ``step_cost`` is in batch-1 target-steps: 1 + c per draft-model pass the step runs, draft stage
    and draft-extend alike (t_verify + Σ t_recurrent + t_extend + t_projection, counted at one iteration
    boundary: an EAGLE-family chain's κ − 1 recurrent passes plus its extend give
    1 + κc; frozen-KV MTP's κ passes and no extend give 1 + κc too — it saves the extend pass's width
    and the draft KV, not a pass; multi-layer EAGLE's 1 + Σ c_i over its modules,
    :func:`step_cost_modules`); parallel 1 + c;
    ``speedup`` = E / step_cost at batch 1; ``speedup_at_batch`` at the state's bucket B in the
    saturating model (a pass over n tokens costs max(1, n/T*)), or, with a profiled cost table, the
    roofline batch throughput over the table's step times (:func:`batch_throughput`; a chain with the
    drafter's acceptance record verifies the drafts it measured per request and step,
    :meth:`specc.predict.acceptance.Entry.drafts_per_step`, not κ: a lookup drafts only on a match); ``break_even_batch`` = T*(E − draft
    cost)/W, which is T*(E − κc)/(κ + 1) for a chain and T*(E − c)/(κ + 1) for a parallel
    block, and 0.0 when E − draft cost < 1 (speculation pays at no batch size: ``speedup`` < 1; see
    :func:`break_even_batch`), +inf for plain decode; ``s_infinity`` = E / (W + draft cost).
    ``draft_forward_passes`` / ``extend_forward_passes`` count the draft model's forward passes of the
    draft stage and of the extend stage (from the state's stage graph; the runtime counts the same,
    ``SpecMetrics.draft_passes_per_step`` / ``extend_passes_per_step``). ``draft_kv_bytes_per_token``
    is the draft KV the method allocates (0 for frozen-KV MTP); ``draft_kv_bytes_saved_per_token`` what
    a frozen-KV assistant would hold with its own pool (None for other methods). Byte counts may be
    None when a size is unknown (e.g. a checkpoint that is not on disk).
    """

    state: str
    kind: str
    batch_size: int
    num_steps: int
    num_draft_tokens: int
    alpha: float
    alpha_source: str
    c: float
    c_source: str
    hardware: str
    saturation_tokens: float
    draft_forward_passes: int
    extend_forward_passes: int
    target_forward_passes: int
    target_tokens_per_step: int
    expected_tokens: float
    step_cost: float
    speedup: float
    speedup_at_batch: float
    break_even_batch: float
    s_infinity: float
    draft_kv_bytes_per_token: Optional[int]
    graphs_to_capture: int
    graph_buffer_bytes: Optional[int]
    draft_kv_bytes_saved_per_token: Optional[int] = None

    def as_dict(self) -> Dict[str, object]:
        from dataclasses import asdict

        return asdict(self)


def state_expected_tokens(state, alpha: float) -> float:
    """E for a candidate state: chain/parallel E(α, κ); static tree :func:`tree_expected_tokens`;
    dynamic tree :func:`dynamic_tree_expected_tokens`; plain 1."""
    if state.num_steps == 0:
        return 1.0
    if state.tree_choices is not None:
        return tree_expected_tokens(state.tree_choices, alpha)
    if state.topk > 1:
        return dynamic_tree_expected_tokens(alpha, state.num_steps, state.topk, state.num_draft_tokens)
    return expected_tokens(alpha, state.num_steps)


def predict(state, inputs, graph_stats: Dict[str, Optional[int]]) -> Prediction:
    """Predict one candidate state (see :class:`Prediction` for every field's formula).

    Args:
        state: a candidate state (``name``, ``method``, ``batch_size``, ``num_steps``, ``topk``,
            ``num_draft_tokens``, ``parallel``, ``tree_choices``, ``kind``).
        inputs: the plan's cost inputs (``specc.predict.sizing.CostInputs``: α, c, hardware, T*, draft KV bytes).
        graph_stats: from the state's stage graph: ``draft_passes``, ``extend_passes``, ``target_passes``,
            ``graphs_to_capture``, ``graph_buffer_bytes`` (``specc.predict.analyze`` builds it).
    The passes charged come from the method table (:func:`specc.methods.proposal_passes`,
    :func:`specc.methods.extend_passes`), c each; with per-module costs (``inputs.c_modules``,
    multi-layer EAGLE) the step charges Σ c_i over its κ modules (:func:`step_cost_modules`).
    When ``inputs.acceptance`` holds the drafter's measured record (:class:`specc.predict.acceptance.Entry`), E of
    a chain or block state is :func:`expected_tokens_from_rates` over its per-position rates, and a
    tree state of the measured shape takes the measured τ; other states use E(α, κ).
    """
    from specc import methods

    a, c_val, t_star = inputs.alpha, inputs.c, inputs.saturation_tokens
    e = state_expected_tokens(state, a)
    measured = getattr(inputs, "acceptance", None)
    drafts = None  # verified drafts per request and step: κ unless the record measured them
    if measured is not None and state.num_steps > 0 and (
            (measured.shape == "tree") == (state.kind == "tree")
            and (state.kind != "tree" or (measured.num_steps, measured.num_draft_tokens)
                 == (state.num_steps, state.num_draft_tokens))):
        e = measured.expected_tokens(state.num_steps)  # the record's per-position rates (its τ for a tree)
        if state.kind == "chain":
            drafts = measured.drafts_per_step(state.num_steps)
    p = methods.proposal_passes(state.method, state.num_steps, state.topk, state.parallel, state.tree_choices)
    x = methods.extend_passes(state.method)
    modules = getattr(inputs, "c_modules", None)
    if modules and state.num_steps > 0:  # one module per draft step: the extend runs module 0
        draft_cost = step_cost_modules(list(modules)[: state.num_steps]) - 1.0
    elif modules:
        draft_cost = x * float(modules[0])
    else:
        draft_cost = (p + x) * c_val
    step_cost = 1.0 + draft_cost
    w, bsz = state.num_draft_tokens, state.batch_size
    plain_b = max(1.0, bsz / t_star)
    spec_b = max(1.0, bsz * w / t_star) + draft_cost
    # chain: W = κ + 1, draft cost κc, so this is break_even_batch(); it also charges lookup drafters
    # (0 proposal passes) the same draft cost as `step_cost`, keeping break-even and speedup consistent
    be = math.inf if state.num_steps == 0 else break_even_from(e, draft_cost, w, t_star)
    speedup_b = e * plain_b / spec_b
    model = getattr(inputs, "batch_model", None)
    if model is not None and state.kind in ("plain", "chain", "parallel"):
        # a profiled cost table: the batch throughput model at the bucket (measured step times)
        speedup_b = (batch_throughput(bsz, state.num_steps, a, model, state.parallel, expected=e, drafts=drafts,
                                      lookup=methods.get(state.method).lookup)
                     / batch_throughput(bsz, 0, a, model, state.parallel))
    return Prediction(
        state=state.name, kind=state.kind, batch_size=bsz, num_steps=state.num_steps,
        num_draft_tokens=w, alpha=a, alpha_source=inputs.alpha_source, c=c_val, c_source=inputs.c_source,
        hardware=inputs.hardware, saturation_tokens=t_star, draft_forward_passes=int(graph_stats["draft_passes"]),
        extend_forward_passes=int(graph_stats.get("extend_passes", 0)),
        draft_kv_bytes_saved_per_token=getattr(inputs, "draft_kv_bytes_saved_per_token", None),
        target_forward_passes=int(graph_stats["target_passes"]), target_tokens_per_step=bsz * w, expected_tokens=e,
        step_cost=step_cost, speedup=e / step_cost, speedup_at_batch=speedup_b,
        break_even_batch=be, s_infinity=e / (w + draft_cost),
        draft_kv_bytes_per_token=inputs.draft_kv_bytes_per_token,
        graphs_to_capture=int(graph_stats["graphs_to_capture"]), graph_buffer_bytes=graph_stats["graph_buffer_bytes"])
