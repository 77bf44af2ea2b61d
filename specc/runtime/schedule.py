"""Schedules as policies: which candidate state the next decode step runs, and (for ``budget``) how
many drafts of each request it verifies.

A policy answers three calls, each with a do-nothing default so the decode loop never branches on
the kind of schedule (vLLM's draft-length policy protocol):

* ``select(num_requests, rows_in_use) -> (bucket, κ)`` before a step. The bucket is the smallest
  captured batch size ≥ the rows in use (padding to the next captured size, as SGLang and vLLM pad
  to their CUDA-graph sizes); the state ``(bucket, κ)`` was built at load.
* ``admit(confidence, num_valid, num_live) -> admitted [n] | None`` after drafting, on the device
  (tensors of the step's rows): the number of drafts of each request the step verifies (``None``:
  all of them).
* ``observe(bucket, accepted)`` after verification, with the accepted drafts of each live request
  (bonus excluded).

Kinds (``manifest.json`` ``runtime.schedule``, written by codegen from ``specc.compiler.lower.ScheduleSpec``):

* ``static`` — one κ per bucket: the runtime's earlier routing.
* ``batch_buckets`` — vLLM's ``num_speculative_tokens_per_batch_size``: κ looked up by the number of
  running requests (floor lookup, gaps and the tail carry the previous K,
  DYN:77-148, SCH:1711-1714), capped at ``num_steps_cap``.
* ``adaptive`` (and ``auto``, whose candidates the cost model derived) — SGLang 0.5.23's controller
  (adaptive_spec_params.py:171-261): per slot an EMA (α = 0.2) of the mean
  accepted drafts per request, 10 warm-up batches, then a decision every 5th; from κ = 0 it probes the
  next candidate up; otherwise it drops while ``ema ≤ prev − 0.5 + down_h`` (``0.5 + down_h`` when
  prev is 0), and only if it did not drop, rises while ``ema > cur − 0.5 + up_h``; an optional ceiling.
* ``budget`` — vLLM's adaptive verification / DSpark's budget (vLLM
  vllm/v1/worker/gpu/spec_decode/adaptive_verification.py:46-72, 305-373): every (request, position) scored by its survival
  probability, b* = argmax_b (R + Σ top-b scores) / (draft(R) + verify(R + b)) from the profiled
  cost table, admitted as a global top-b with earlier positions first (``specc.predict.cost``), so each
  request verifies a prefix of its drafts.

Every state a policy can select must exist at load: :func:`make_schedule` checks and raises
ArtifactError naming the missing ``(bucket, κ)``, never during decode.
"""
from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from specc.errors import ArtifactError

log = logging.getLogger("specc.schedule")

StateKey = Tuple[int, int]  # (batch bucket, κ)


def pad_to_capture(sizes: Sequence[int], n: int) -> int:
    """The smallest captured size ≥ n (``bisect_left``, adaptive_spec_params.py:342-358); n itself
    when it is past the largest."""
    i = bisect.bisect_left(list(sizes), n)
    return sizes[i] if i < len(sizes) else n


def floor_slot(keys: Sequence[int], n: int) -> int:
    """The largest key ≤ n, clamped to the first key (SGLang's slot routing, vLLM's dynamic-K lookup)."""
    i = bisect.bisect_right(list(keys), n) - 1
    return keys[max(i, 0)]


@dataclass
class Switch:
    """One change of κ by the adaptive controller: at decision ``step`` of slot ``slot``."""

    step: int
    slot: int
    old: int
    new: int
    ema: float


class Schedule:
    """Base policy (and the ``static`` kind): the bucket's one κ, verify every draft, learn nothing.

    Args:
        spec: the manifest's ``runtime.schedule`` mapping (``kind``, ``capture_sizes``, ``buckets``
            ``{key: {candidates, up_hysteresis, down_hysteresis, ceiling_coeff}}``, ``start_steps``,
            controller constants, ``cost_table``).
        states: the ``(bucket, κ)`` keys built at load.
    """

    kind = "static"

    def __init__(self, spec: Mapping[str, Any], states: Iterable[StateKey]) -> None:
        self.spec = dict(spec)
        self.states: Set[StateKey] = set(states)
        self.capture_sizes: Tuple[int, ...] = tuple(sorted({b for b, _ in self.states}))
        buckets = {int(k): v for k, v in (spec.get("buckets") or {}).items()}
        self.keys: Tuple[int, ...] = tuple(sorted(buckets))
        self.candidates: Dict[int, Tuple[int, ...]] = {
            k: tuple(sorted(int(c) for c in v["candidates"])) for k, v in buckets.items()}
        self.bucket_params: Dict[int, Mapping[str, Any]] = buckets
        self.switches: List[Switch] = []

    # -------------------------------------------------------------- protocol
    def bucket(self, rows_in_use: int) -> int:
        """The captured size a step over ``rows_in_use`` rows runs in. Raises RuntimeError past the
        largest bucket (the runtime never admits that many requests)."""
        if rows_in_use > self.capture_sizes[-1]:
            raise RuntimeError(f"no state fits {rows_in_use} rows (largest bucket {self.capture_sizes[-1]})")
        return pad_to_capture(self.capture_sizes, max(1, rows_in_use))

    def select(self, num_requests: int, rows_in_use: int) -> StateKey:
        """``(bucket, κ)`` of the next step (static: the bucket's largest κ)."""
        b = self.bucket(rows_in_use)
        return b, max(k for bb, k in self.states if bb == b)

    def admit(self, confidence, num_valid, num_live: int):
        """Drafts to verify per row (``[n]`` int64 tensor, ≤ ``num_valid``), or None to verify all.
        ``confidence [n, K]`` fp32 and ``num_valid [n]`` int64 (0 for rows without a live request)
        are the step's tensors on the runtime's device; ``num_live`` the live requests among them."""
        return None

    @property
    def verify_all(self) -> bool:
        """Whether the target forward still covers every draft when ``admit`` cut some."""
        return False

    def observe(self, bucket: int, accepted: Sequence[int]) -> None:
        """Accepted drafts (bonus excluded) of each live request of the step that ran in ``bucket``."""

    # -------------------------------------------------------------- load-time check
    def reachable(self) -> Set[StateKey]:
        """Every ``(bucket, κ)`` this policy can select."""
        return {(b, max(k for bb, k in self.states if bb == b)) for b in self.capture_sizes}

    def check_states(self) -> None:
        """Raise ArtifactError naming every ``(bucket, κ)`` the policy can select but the artifact
        does not have (a missing state is an error at load, never during decode)."""
        missing = sorted(self.reachable() - self.states)
        if missing:
            have = ", ".join(f"b{b}/κ{k}" for b, k in sorted(self.states))
            raise ArtifactError(f"schedule {self.kind}: the artifact has no state for "
                                f"{', '.join(f'bucket {b}, κ {k}' for b, k in missing)} (it has {have}); "
                                f"re-run specc compile")


class BatchBucketsSchedule(Schedule):
    """vLLM's dynamic K: κ by the number of running requests (floor lookup), capped at
    ``num_steps_cap`` (vLLM's ``min(K_entry, K)``)."""

    kind = "batch_buckets"

    def _k(self, num_requests: int) -> int:
        k = max(self.candidates[floor_slot(self.keys, max(1, num_requests))])
        cap = self.spec.get("num_steps_cap")
        return min(k, int(cap)) if cap is not None else k

    def select(self, num_requests: int, rows_in_use: int) -> StateKey:
        return self.bucket(rows_in_use), self._k(num_requests)

    def reachable(self) -> Set[StateKey]:
        # any number of requests up to the bucket's rows may run in it (rows are fixed per request)
        return {(b, self._k(n)) for b in self.capture_sizes for n in range(1, b + 1)}


class AdaptiveSlot:
    """SGLang's ``AdaptiveStepSlot`` (adaptive_spec_params.py:171-261): one batch-size slot's EMA of
    accepted drafts per request and its current κ."""

    def __init__(self, key: int, candidates: Sequence[int], start_steps: int, params: Mapping[str, Any],
                 ema_alpha: float, warmup: int, interval: int) -> None:
        self.key = key
        self.candidates = sorted(set(int(c) for c in candidates))
        self.up = float(params.get("up_hysteresis", 0.0) or 0.0)
        self.down = float(params.get("down_hysteresis", -0.25) if params.get("down_hysteresis") is not None
                          else -0.25)
        self.ceiling = float(params.get("ceiling_coeff", 0.0) or 0.0)
        self.ema_alpha, self.warmup, self.interval = float(ema_alpha), int(warmup), int(interval)
        self.current = start_steps if start_steps in self.candidates else self.candidates[len(self.candidates) // 2]
        self.ema = float(self.current - 1)
        self.count = 0

    def update(self, accepted: Sequence[int]) -> Optional[Tuple[int, int]]:
        """Feed one verify's accepted drafts per request; returns (old, new) when κ changes."""
        if not accepted:
            return None
        if self.current > 0:
            self.ema = (1 - self.ema_alpha) * self.ema + self.ema_alpha * (sum(accepted) / len(accepted))
        self.count += 1
        if self.count <= self.warmup or (self.count - self.warmup) % self.interval != 0:
            return None
        old = self.current
        new = self._decide()
        if new == old:
            return None
        self.current = new
        return old, new

    def _decide(self) -> int:
        c = self.candidates
        idx = c.index(self.current)
        if self.current == 0:  # probe the next step up after a κ = 0 interval
            idx = min(idx + 1, len(c) - 1)
            if c[idx] > 0 and self.ema < 0:
                self.ema = float(c[idx] - 1)
            return c[idx]
        start = idx
        while idx > 0:
            prev = c[idx - 1]
            threshold = (0.5 if prev == 0 else prev - 0.5) + self.down
            if self.ema <= threshold:
                idx -= 1
            else:
                break
        if idx == start:
            while idx < len(c) - 1 and self.ema > c[idx] - 0.5 + self.up:
                idx += 1
        target = c[idx]
        if self.ceiling > 0:
            ceil = max(1, math.ceil(self.ema * self.ceiling))
            if ceil < target <= self.current:
                while idx > 0 and c[idx] > ceil:
                    idx -= 1
                target = c[idx]
        return target


class AdaptiveSchedule(Schedule):
    """SGLang's adaptive controller (see the module docstring); ``auto`` plans run it over the
    candidates the cost model derived. One log line per change of κ (old, new, the EMA)."""

    kind = "adaptive"

    def __init__(self, spec: Mapping[str, Any], states: Iterable[StateKey]) -> None:
        super().__init__(spec, states)
        start = int(spec.get("start_steps", 0))
        self.slots: Dict[int, AdaptiveSlot] = {
            k: AdaptiveSlot(k, self.candidates[k], start, self.bucket_params[k], spec.get("ema_alpha", 0.2),
                            spec.get("warmup_batches", 10), spec.get("update_interval", 5))
            for k in self.keys}

    def select(self, num_requests: int, rows_in_use: int) -> StateKey:
        b = self.bucket(rows_in_use)
        return b, self.slots[floor_slot(self.keys, b)].current

    def observe(self, bucket: int, accepted: Sequence[int]) -> None:
        slot = self.slots[floor_slot(self.keys, bucket)]
        change = slot.update(accepted)
        if change is not None:
            self.switches.append(Switch(slot.count, slot.key, change[0], change[1], slot.ema))
            log.info("adaptive schedule: slot %d steps %d -> %d (ema_accept_len=%.2f)",
                     slot.key, change[0], change[1], slot.ema)

    def reachable(self) -> Set[StateKey]:
        return {(b, k) for b in self.capture_sizes for k in self.candidates[floor_slot(self.keys, b)]}


class BudgetSchedule(Schedule):
    """Budgeted verification over one full-width state per bucket (see the module docstring).

    The profiled cost table comes from the manifest (``runtime.schedule.cost_table``: ``verify_ms``
    by target tokens, ``draft_ms`` by requests); lookups follow vLLM's ``build_table``
    (:class:`specc.predict.cost.CostTable`)."""

    kind = "budget"

    def __init__(self, spec: Mapping[str, Any], states: Iterable[StateKey]) -> None:
        super().__init__(spec, states)
        from specc.predict import cost

        table = spec.get("cost_table")
        if not table or not table.get("verify_ms"):
            raise ArtifactError("schedule budget: the artifact carries no profiled cost table "
                                "(runtime.schedule.cost_table); compile the plan with schedule.cost_table set "
                                "to a `specc profile` JSON")
        vx = sorted(int(k) for k in table["verify_ms"])
        dx = sorted(int(k) for k in (table.get("draft_ms") or {}))
        self.table = cost.CostTable(
            verify_x=tuple(vx), verify_ms=tuple(float(table["verify_ms"][str(x)]) for x in vx),
            capture_limit=int(table.get("capture_limit") or max(vx)), draft_x=tuple(dx),
            draft_ms=tuple(float(table["draft_ms"][str(x)]) for x in dx), device=str(table.get("device", "")))
        self.last_budget: Optional[Any] = None  # b* of the last step (a 0-d tensor; tests and metrics)

    @property
    def verify_all(self) -> bool:
        """``ragged_verify: cap_accept``: the target verifies every draft, acceptance stops at the
        admitted ones (SGLang's non-compact mode)."""
        return self.spec.get("ragged_verify") == "cap_accept"

    def admit(self, confidence, num_valid, num_live: int):
        """b* and the admitted prefix per row, computed on the device (no host read): confidences
        ``[n, K]`` in [0, 1], positions past ``num_valid`` scored 0 (rows without a live request have
        ``num_valid`` 0). The same selection as :func:`specc.predict.cost.select_verify_budget` (vLLM adaptive_verification.py:305-373,
        "Deciding how much to verify by load"; vLLM 0.33.0 AV:305-373): survival = running product of
        the confidences (as a cumulative sum of logs), slots ranked highest survival first with ties to
        the earlier position then the earlier request (:func:`specc.predict.cost.admission_order`), b* =
        argmax_b (S + Σ_{j<b} score_j) / (draft + step(N_nd + b)) with S = N_nd = the live requests,
        the first maximum winning ties, b ≤ Σ num_valid. ``ragged_verify: static`` admits
        everything (None). Returns ``[n]`` int64."""
        import torch

        rows, k = confidence.shape
        if rows == 0 or k == 0 or self.spec.get("ragged_verify", "compact") == "static":
            return None
        dev = confidence.device
        pos = torch.arange(k, device=dev).view(1, k)
        conf = torch.where(pos < num_valid.view(-1, 1), confidence.clamp(0.0, 1.0), torch.zeros_like(confidence))
        ls = torch.cumsum(torch.log(conf.double()), dim=1)  # [n, K] log survival, -inf after a zero
        # admission order: position-major flat order, then a stable sort by descending survival
        flat = ls.t().reshape(-1)  # index i = pos * n + row
        order_pm = torch.sort(-flat, stable=True).indices  # [n*K]
        slot = (order_pm % rows) * k + order_pm // rows  # back to row-major slot ids r*K + pos
        scores = torch.exp(flat[order_pm])  # descending; exp(-inf) = 0
        big_b = num_valid.sum()  # a 0-d tensor: the budget never exceeds the drafts proposed
        gain = torch.cat([torch.zeros(1, dtype=scores.dtype, device=dev), torch.cumsum(scores, 0)])  # [n*K+1]
        b = torch.arange(rows * k + 1, device=dev)
        step_s = self._step_seconds(num_live + b, num_live + rows * k + 1)  # [n*K+1]
        draft = self.table.draft_pass_ms(num_live)
        rates = (num_live + gain) / ((draft or 0.0) / 1e3 + step_s)
        rates = torch.where(b <= big_b, rates, torch.full_like(rates, -1.0))
        b_star = torch.argmax(rates)  # the first maximum (torch.argmax returns the first index)
        rank = torch.empty_like(slot)
        rank[slot] = torch.arange(rows * k, device=dev)
        taken = (rank < b_star).view(rows, k)
        self.last_budget = b_star
        return torch.minimum(taken.sum(dim=1), num_valid)

    def _step_seconds(self, tokens, bound=None):
        """Verify seconds by token count, as a tensor lookup of the cost table (``CostTable.step_ms``,
        vLLM's ``build_table``), tabulated once per device up to the largest count a step can ask.
        ``bound``: a host-known bound > ``tokens.max()`` (None: read it from ``tokens``, a device
        read)."""
        import torch

        hi = int(tokens.max()) + 1 if bound is None else int(bound)
        cached = getattr(self, "_step_cache", None)
        if cached is None or cached.shape[0] < hi or cached.device != tokens.device:
            n = max(hi, 2 * (cached.shape[0] if cached is not None else 64))
            cached = torch.tensor([self.table.step_ms(i) / 1e3 for i in range(n)], dtype=torch.float64,
                                  device=tokens.device)
            self._step_cache = cached
        return cached[tokens]


SCHEDULES = {"static": Schedule, "batch_buckets": BatchBucketsSchedule, "adaptive": AdaptiveSchedule,
             "auto": AdaptiveSchedule, "budget": BudgetSchedule}


def make_schedule(spec: Optional[Mapping[str, Any]], states: Iterable[StateKey]) -> Schedule:
    """The policy of a manifest's ``runtime.schedule`` (``None``: static over ``states``), checked
    against the states built at load.

    Raises:
        ArtifactError: an unknown kind, a state the policy can select that the artifact lacks, or a
            budget schedule without its cost table.
    """
    states = list(states)
    if spec is None or not spec.get("buckets") and spec.get("kind", "static") == "static":
        spec = dict(spec or {}, kind="static")
    kind = spec.get("kind", "static")
    cls = SCHEDULES.get(kind)
    if cls is None:
        raise ArtifactError(f"runtime.schedule.kind {kind!r} is not a schedule this runtime knows "
                            f"({', '.join(SCHEDULES)}); re-run specc compile")
    policy = cls(spec, states)
    policy.check_states()
    return policy
