"""Lowering: a plan becomes its candidate states.

A candidate state is one (captured batch size, κ, tree shape, verify width, verify rule) the schedule
can select at run time; codegen emits one program per state and the runtime swaps between them
atomically (SGLang's ``SpecRuntimeState``).

Pruning follows SGLang's ``cuda_graph_bs_for_step`` (adaptive_spec_params.py:328-340): a captured batch
size b gets a state for step κ only if the schedule slot that b routes to lists κ. Routing is SGLang's
(adaptive_spec_params.py:342-358): the slot is the largest bucket key ≤ b, clamped to the first slot.

``schedule.kind``:

* ``static`` — one κ (``method.num_steps``) for every captured size.
* ``batch_buckets`` — vLLM's per-batch-size K: each bucket's ``candidates`` (usually one κ).
* ``adaptive`` — SGLang's controller: each bucket's candidate steps; with no buckets, SGLang's
  ``DEFAULT_ADAPTIVE_CONFIG`` (adaptive_spec_params.py:28-53: 1→[1,3,5,7], 8→[0,1,3], 32→[0,1], 64→[0]).
* ``budget`` — adaptive verification (vLLM AV / DSpark budget): one full-width state per captured size;
  the per-request verify length is chosen at run time inside that state.
* ``auto`` — each bucket's candidates derived from the cost model (:mod:`specc.predict.cost`) and
  ``schedule.hardware`` or ``schedule.cost_table``, with a reason per bucket (:func:`derive_auto_buckets`).

Nothing here imports torch.
"""
from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specc import methods
from specc.predict import cost
from specc.compiler import trees
from specc.errors import PlanError
from specc.plan.schema import Plan

# SGLang's default adaptive config (adaptive_spec_params.py:28-53).
SGLANG_DEFAULT_ADAPTIVE = {1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}

@dataclass(frozen=True)
class CandidateState:
    """One program the runtime may switch to (the interface codegen and the runtime share).

    Fields:
        name: valid Python identifier built from every parameter, e.g. ``b4_k3_topk1_w4_greedy_chain``
            (see :func:`state_name`).
        method: ``plan.method.name``.
        batch_size: the captured batch bucket B.
        num_steps: κ, draft tokens proposed per step (0 = plain decode).
        topk: branching factor per draft level (1 = chain or parallel block).
        num_draft_tokens: W, verify width per request incl. the bonus/root (chain/parallel: κ + 1).
        verify_rule: ``greedy`` | ``standard`` | ``block`` | ``synthetic``.
        draft_sampling: ``greedy`` | ``probabilistic``.
        parallel: True when one draft pass emits the whole block.
        tree_choices: static tree (paths of child ranks from the root) or None.
    """

    name: str
    method: str
    batch_size: int
    num_steps: int
    topk: int
    num_draft_tokens: int
    verify_rule: str
    draft_sampling: str
    parallel: bool
    tree_choices: Optional[Tuple[Tuple[int, ...], ...]] = None

    @property
    def kind(self) -> str:
        """``plain`` (κ = 0), ``parallel``, ``tree`` or ``chain``."""
        return state_kind(self.num_steps, self.topk, self.parallel, self.tree_choices)


state_kind = methods.state_kind


def tree_digest(tree_choices: Tuple[Tuple[int, ...], ...]) -> str:
    """First 8 hex digits of the SHA-256 of the canonical tree_choices JSON (names a tree shape)."""
    blob = json.dumps([list(p) for p in tree_choices], separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:8]


def state_name(batch_size: int, num_steps: int, topk: int, num_draft_tokens: int, verify_rule: str,
               draft_sampling: str, parallel: bool,
               tree_choices: Optional[Tuple[Tuple[int, ...], ...]] = None) -> str:
    """``b{B}_k{κ}_topk{topk}_w{W}_{rule}[_qprob]_{plain|chain|parallel|tree}[_t{digest}]``.

    Every parameter appears: ``_qprob`` marks probabilistic draft sampling (greedy drafts are the
    default and add nothing), ``_t<8 hex>`` the static tree shape. Always a valid identifier."""
    kind = state_kind(num_steps, topk, parallel, tree_choices)
    name = f"b{batch_size}_k{num_steps}_topk{topk}_w{num_draft_tokens}_{verify_rule}"
    if draft_sampling != "greedy":
        name += "_qprob"
    name += f"_{kind}"
    if tree_choices is not None and num_steps > 0:
        name += f"_t{tree_digest(tree_choices)}"
    assert name.isidentifier(), name
    return name


@dataclass(frozen=True)
class BucketSpec:
    """One slot of the schedule's table, keyed by batch size (floor lookup).

    ``candidates``: the κ values allowed (ascending); ``up_hysteresis`` / ``down_hysteresis`` /
    ``ceiling_coeff``: the adaptive controller's per-slot parameters (SGLang's per-slot defaults
    0.0 / −0.25 / 0 when the plan leaves them unset, adaptive_spec_params.py:171-176)."""

    key: int
    candidates: Tuple[int, ...]
    up_hysteresis: float = 0.0
    down_hysteresis: float = -0.25
    ceiling_coeff: float = 0.0


@dataclass(frozen=True)
class ScheduleSpec:
    """What the runtime's schedule policy needs (written to the artifact's manifest, read by
    ``specc.runtime.schedule``): the kind, the captured batch sizes, the bucket table, the startup
    κ, the adaptive controller's constants (SGLang defaults: EMA α 0.2, 10 warm-up batches, a
    decision every 5th; adaptive_spec_params.py:171-176), for ``batch_buckets`` the cap
    ``num_steps_cap`` (vLLM looks up ``min(K_entry, K)``, DYN:77-148), and for ``budget`` the
    ``ragged_verify`` mode (SGLang's: ``compact`` verifies only the admitted tokens, ``cap_accept``
    verifies every draft and caps acceptance at the admitted ones, ``static`` admits everything;
    SGLang 0.5.23 sglang/srt/speculative/eagle_worker_v2.py:742-919). ``auto`` runs as the adaptive controller over its derived candidates."""

    kind: str
    capture_sizes: Tuple[int, ...]
    buckets: Tuple[BucketSpec, ...]
    start_steps: int
    ema_alpha: float = 0.2
    warmup_batches: int = 10
    update_interval: int = 5
    num_steps_cap: Optional[int] = None
    ragged_verify: str = "static"

    def as_dict(self) -> Dict[str, Any]:
        """Plain data (JSON-safe; bucket keys as strings)."""
        return {"kind": self.kind, "capture_sizes": list(self.capture_sizes),
                "buckets": {str(b.key): {"candidates": list(b.candidates), "up_hysteresis": b.up_hysteresis,
                                         "down_hysteresis": b.down_hysteresis, "ceiling_coeff": b.ceiling_coeff}
                            for b in self.buckets},
                "start_steps": self.start_steps, "ema_alpha": self.ema_alpha,
                "warmup_batches": self.warmup_batches, "update_interval": self.update_interval,
                "num_steps_cap": self.num_steps_cap, "ragged_verify": self.ragged_verify}


@dataclass(frozen=True)
class Lowering:
    """Everything lowering decided: the states, the capture sizes, the bucket table actually used
    (key → κ candidates), a reason per bucket (for ``auto``: why these κ), notes on defaults, and
    the :class:`ScheduleSpec` the runtime's schedule policy reads."""

    states: Tuple[CandidateState, ...]
    capture_sizes: Tuple[int, ...]
    buckets: Dict[int, Tuple[int, ...]]
    schedule: ScheduleSpec
    reasons: Dict[int, str] = field(default_factory=dict)
    notes: Tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------------
# Method facts
# ----------------------------------------------------------------------------------------------------


def is_parallel(plan: Plan) -> bool:
    """True when one draft pass emits the whole block (dflash, dspark, medusa; or PARD / P-EAGLE when
    ``method.parallel_drafting`` is set): :func:`specc.methods.is_parallel`."""
    return methods.is_parallel(plan.method.name, plan.method.parallel_drafting)


def plan_tree_choices(plan: Plan) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """``method.tree_choices`` as a tuple of tuples sorted by (depth, path), validated (non-empty
    paths of ranks ≥ 0 whose parents are present, no duplicates; :func:`specc.compiler.trees.normalize_choices`).
    Raises PlanError naming ``method.tree_choices``."""
    return trees.normalize_choices(plan.method.tree_choices)


def base_num_steps(plan: Plan) -> Tuple[int, Optional[str]]:
    """κ of a static plan: ``method.num_steps``; for parallel drafters ``num_draft_tokens − 1`` or
    ``block_size`` when num_steps is unset (DSpark γ = num_draft_tokens − 1);
    else the engine default. Returns (κ, note or None)."""
    m = plan.method
    if not methods.get(m.name).drafts:
        return 0, None
    tc = plan_tree_choices(plan)
    if tc is not None:
        return max(len(p) for p in tc), None
    if m.num_steps is not None and not (methods.get(m.name).draft_shape == "block" and m.num_steps == 1
                                        and (m.num_draft_tokens or m.block_size)):
        # SGLang pins DFlash/DSpark num_steps to 1 (DF8, DS11); then the block comes from the width.
        return int(m.num_steps), None
    if is_parallel(plan):
        if m.num_draft_tokens is not None:
            return int(m.num_draft_tokens) - 1, None
        if m.block_size is not None:
            # method.block_size is γ, the draft tokens of the block (the plan schema's meaning, as
            # the SGLang rule table maps it: num_draft_tokens = γ + 1, DF11/DS15).
            return int(m.block_size), None
    if m.topk is not None and m.topk == 1 and m.num_draft_tokens is not None:
        return int(m.num_draft_tokens) - 1, None
    k = methods.get(m.name).default_num_steps
    return k, (f"method.num_steps unset: using κ = {k} (engine default: SGLang "
               "speculative_hook.py:1164-1174 (3,1,4); DFlash block 16, DSpark γ 7)")


def verify_width(plan: Plan, num_steps: int) -> int:
    """W, the verify width per request incl. the bonus/root, for κ = ``num_steps``.

    chain / parallel / plain: κ + 1 (SGLang EG20 and AD11). Static tree: the nodes of its first κ
    levels + 1 (:func:`state_tree_choices`). Dynamic tree (topk > 1): ``method.num_draft_tokens`` when
    set, else the whole candidate pool + 1 (topk + (κ − 1)·topk² nodes); a
    smaller κ of an adaptive schedule caps it at its own pool + 1. Raises PlanError when
    num_draft_tokens − 1 exceeds the pool of the plan's own κ (a case SGLang does not check at
    startup)."""
    if num_steps == 0:
        return 1
    tc = state_tree_choices(plan, num_steps)
    if tc is not None:
        return len(tc) + 1
    topk = plan_topk(plan)
    if topk <= 1:
        return num_steps + 1
    pool = trees.pool_size(num_steps, topk)
    w = plan.method.num_draft_tokens
    if w is None:
        return pool + 1
    if w - 1 > pool:
        if plan.method.num_steps is None or int(plan.method.num_steps) == num_steps:
            raise PlanError(f"method.num_draft_tokens = {w} exceeds the draft tree: κ = {num_steps}, "
                            f"topk = {topk} has only {pool} candidates (+1 root); lower "
                            f"num_draft_tokens to <= {pool + 1} or raise num_steps/topk")
        return pool + 1
    return int(w)


def state_tree_choices(plan: Plan, num_steps: int) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """The static tree a state of κ = ``num_steps`` verifies: the plan's ``tree_choices`` cut to its
    first κ levels (an adaptive schedule's smaller κ drafts a shallower tree); None without one."""
    return trees.truncate(plan_tree_choices(plan), num_steps)


def plan_topk(plan: Plan) -> int:
    """topk: ``method.topk`` (default 1); for tree_choices, the largest rank + 1."""
    tc = plan_tree_choices(plan)
    if tc is not None:
        return max(max(p) for p in tc) + 1
    return int(plan.method.topk or 1)


def capture_sizes(plan: Plan) -> Tuple[int, ...]:
    """Captured batch sizes: ``schedule.capture_batch_sizes`` if set, else powers of two up to
    ``runtime.max_batch_size`` plus max_batch_size itself. Raises PlanError for sizes < 1."""
    sizes = plan.schedule.capture_batch_sizes
    if sizes:
        bad = [s for s in sizes if int(s) < 1]
        if bad:
            raise PlanError(f"schedule.capture_batch_sizes: sizes must be >= 1, got {bad}")
        return tuple(sorted({int(s) for s in sizes}))
    top = int(plan.runtime.max_batch_size)
    if top < 1:
        raise PlanError(f"runtime.max_batch_size must be >= 1, got {top}")
    out, b = set(), 1
    while b <= top:
        out.add(b)
        b *= 2
    out.add(top)
    return tuple(sorted(out))


def route_slot(keys: Sequence[int], batch_size: int) -> int:
    """SGLang's floor lookup (adaptive_spec_params.py:342-358): the largest key ≤ batch_size,
    clamped to the first key. ``keys`` sorted ascending, non-empty."""
    i = bisect.bisect_right(list(keys), batch_size) - 1
    return keys[max(i, 0)]


def derive_auto_buckets(plan: Plan, sizes: Sequence[int], alpha: float, model: cost.BatchModel,
                        max_steps: Optional[int] = None, spread: float = 0.1
                        ) -> Tuple[Dict[int, Tuple[int, ...]], Dict[int, str]]:
    """``schedule.kind: auto``: each captured size's κ candidates from the batch model.

    For every captured batch b the best κ (max tokens/s, a search over 0..max_steps;
    default 0..max(8, method.num_steps) for chains, 0..γ for block drafters) is found at α − spread,
    α and α + spread; the candidates are those (deduplicated), so an adaptive controller can follow
    acceptance within that band (``spread`` 0 gives one κ per bucket). Consecutive sizes with equal
    candidates merge into one bucket keyed by the smallest size.

    Args:
        model: the :class:`specc.predict.cost.BatchModel` (``specc.predict.sizing.auto_batch_model``: a profiled cost
            table or a hardware roofline).
    Returns: (buckets, reason per bucket).
    """
    par = is_parallel(plan)
    if max_steps is None:
        if par:  # a block drafter emits γ tokens; verifying a prefix of the block is the only knob
            max_steps = base_num_steps(plan)[0]
        else:  # search range 0..8, widened to a larger method.num_steps
            max_steps = max(8, int(plan.method.num_steps or 0))
    per_size: List[Tuple[int, Tuple[int, ...], str]] = []
    for b in sizes:
        picks = {}
        for a in (max(0.0, alpha - spread), alpha, min(1.0, alpha + spread)):
            picks[a] = cost.best_num_steps(b, a, model, par, max_steps)
        cands = tuple(sorted({k for k, _ in picks.values()}))
        k_mid, tput = picks[alpha]
        base = cost.batch_throughput(b, 0, alpha, model, par)
        step = model.step_time(b * (k_mid + 1))
        if model.step_time_fn is not None:
            regime = "profiled"
        elif b * (k_mid + 1) <= model.saturation_tokens:
            regime = "memory-bound"
        else:
            regime = "compute-bound"
        band = ", ".join(f"α={a:.2f}→κ={k}" for a, (k, _) in picks.items())
        reason = (f"batch {b}: best κ={k_mid} at α={alpha:.2f} ({tput / base:.2f}× plain, "
                  f"{tput:.0f} tok/s; verify {b * (k_mid + 1)} tokens in {step * 1e3:.3f} ms"
                  f", {regime}); {band}")
        per_size.append((b, cands, reason))
    buckets: Dict[int, Tuple[int, ...]] = {}
    reasons: Dict[int, str] = {}
    last_size: Dict[int, int] = {}
    for b, cands, reason in per_size:
        if buckets and buckets[max(buckets)] == cands:
            last_size[max(buckets)] = b
            continue
        buckets[b], reasons[b], last_size[b] = cands, reason, b
    for key, end in last_size.items():
        if end != key:
            reasons[key] += f" (same candidates up to batch {end})"
    return buckets, reasons


# ----------------------------------------------------------------------------------------------------
# lower
# ----------------------------------------------------------------------------------------------------


def _plan_buckets(plan: Plan) -> Dict[int, Tuple[int, ...]]:
    table = {}
    for key, bucket in plan.schedule.buckets.items():
        cands = bucket.candidates if hasattr(bucket, "candidates") else bucket["candidates"]
        if not cands:
            raise PlanError(f"schedule.buckets.{key}.candidates is empty; list the κ values "
                            "allowed at this batch size (0 = plain decode)")
        bad = [c for c in cands if int(c) < 0]
        if bad:
            raise PlanError(f"schedule.buckets.{key}.candidates: κ must be >= 0, got {bad}")
        table[int(key)] = tuple(sorted({int(c) for c in cands}))
    return table


def _bucket_table(plan: Plan, sizes: Sequence[int], alpha: Optional[float],
                  auto_model: Optional[Tuple[cost.BatchModel, str]]
                  ) -> Tuple[Dict[int, Tuple[int, ...]], Dict[int, str], List[str]]:
    s = plan.schedule
    notes: List[str] = []
    kind = s.kind
    if not methods.get(plan.method.name).drafts:
        return {min(sizes): (0,)}, {min(sizes): f"method {plan.method.name}: plain decode only"}, notes
    if kind == "auto":
        if auto_model is None or alpha is None:
            raise PlanError("schedule.kind = auto is lowered with the cost model's inputs; call "
                            "specc.predict.analyze.lower_plan (explain, compile) rather than lower() alone")
        buckets, reasons = derive_auto_buckets(plan, sizes, alpha, auto_model[0])
        notes.append(f"auto schedule from {auto_model[1]}")
        return buckets, reasons, notes
    if kind in ("adaptive", "batch_buckets") and s.buckets:
        table = _plan_buckets(plan)
        if kind == "batch_buckets" and plan.method.num_steps is not None:
            cap = int(plan.method.num_steps)
            table = {k: tuple(sorted({min(c, cap) for c in v})) for k, v in table.items()}
        return table, {k: f"schedule.buckets.{k}" for k in table}, notes
    if kind == "adaptive":
        notes.append("schedule.buckets empty: SGLang DEFAULT_ADAPTIVE_CONFIG "
                     "(adaptive_spec_params.py:28-53)")
        return dict(SGLANG_DEFAULT_ADAPTIVE), {k: "SGLang default" for k in SGLANG_DEFAULT_ADAPTIVE}, notes
    k, note = base_num_steps(plan)
    if note:
        notes.append(note)
    return {min(sizes): (k,)}, {min(sizes): f"{kind}: method.num_steps = {k}"}, notes


def reachable_steps(kind: str, keys: Sequence[int], buckets: Dict[int, Tuple[int, ...]],
                    sizes: Sequence[int], size: int) -> Tuple[int, ...]:
    """The κ values a schedule can select while running in captured size ``size`` — the states that
    size needs. ``batch_buckets`` looks κ up by the number of running requests n (vLLM, SCH:1711-1714),
    and every n in (previous captured size, size] pads to ``size``: the union of their slots. The other
    kinds look up the slot of the padded size itself (SGLang's ``cuda_graph_bs_for_step``,
    adaptive_spec_params.py:328-340)."""
    if kind != "batch_buckets":
        return buckets[route_slot(keys, size)]
    out = set()
    for n in range(1, size + 1):
        out.update(buckets[route_slot(keys, n)])
    return tuple(sorted(out))


def start_steps(plan: Plan, buckets: Dict[int, Tuple[int, ...]]) -> int:
    """The startup κ of the schedule: ``method.num_steps`` when set, else the middle of the union of
    every slot's candidates (SGLang, speculative_hook.py:1409-1414)."""
    if plan.method.num_steps is not None:
        return int(plan.method.num_steps)
    union = sorted({k for v in buckets.values() for k in v})
    return union[len(union) // 2]


def schedule_spec(plan: Plan, sizes: Sequence[int], buckets: Dict[int, Tuple[int, ...]]) -> ScheduleSpec:
    """The :class:`ScheduleSpec` of a plan whose bucket table lowering has decided."""
    s = plan.schedule
    kind = s.kind if methods.get(plan.method.name).drafts else "static"
    rows = []
    for key in sorted(buckets):
        src = s.buckets.get(key) if kind in ("adaptive", "batch_buckets") else None
        get = (lambda name, default: default if src is None or getattr(src, name, None) is None
               else float(getattr(src, name)))
        down_default = -0.25 if kind in ("adaptive", "auto") else 0.0
        rows.append(BucketSpec(key=int(key), candidates=tuple(buckets[key]),
                               up_hysteresis=get("up_hysteresis", 0.0),
                               down_hysteresis=get("down_hysteresis", down_default),
                               ceiling_coeff=get("ceiling_coeff", 0.0)))
    cap = int(plan.method.num_steps) if kind == "batch_buckets" and plan.method.num_steps is not None else None
    return ScheduleSpec(
        kind=kind, capture_sizes=tuple(sizes), buckets=tuple(rows), start_steps=start_steps(plan, buckets),
        ema_alpha=float(s.ema_alpha) if s.ema_alpha is not None else 0.2,
        warmup_batches=int(s.warmup_batches) if s.warmup_batches is not None else 10,
        update_interval=int(s.update_interval) if s.update_interval is not None else 5,
        num_steps_cap=cap, ragged_verify=s.ragged_verify if kind == "budget" else "static")


def lower_report(plan: Plan, alpha: Optional[float] = None,
                 auto_model: Optional[Tuple[cost.BatchModel, str]] = None) -> Lowering:
    """Lower ``plan`` to its candidate states and report every decision (see module docstring).

    Args:
        alpha, auto_model: the cost model's α and ``(BatchModel, description)``
            (``specc.predict.sizing.plan_alpha`` / ``auto_batch_model``); needed only by ``schedule.kind:
            auto`` (:func:`specc.predict.analyze.lower_plan` passes them). Lowering reads no files.
    States are sorted by (batch size, κ). Raises PlanError for a plan that cannot be lowered (empty
    bucket, bad widths, auto schedule without its cost inputs), naming the field.
    """
    if plan.verify.rule not in methods.VERIFY_RULES:
        raise PlanError(f"verify.rule: unknown rule {plan.verify.rule!r}")
    methods.get(plan.method.name)
    sizes = capture_sizes(plan)
    buckets, reasons, notes = _bucket_table(plan, sizes, alpha, auto_model)
    keys = sorted(buckets)
    spec = schedule_spec(plan, sizes, buckets)
    par = is_parallel(plan)
    topk = plan_topk(plan)
    states: Dict[str, CandidateState] = {}
    for b in sizes:
        for k in reachable_steps(spec.kind, keys, buckets, sizes, b):
            plain = k == 0
            st_topk = 1 if plain else topk
            st_tc = None if plain else state_tree_choices(plan, k)
            st_par = False if plain else par
            w = verify_width(plan, k)
            name = state_name(b, k, st_topk, w, plan.verify.rule, plan.verify.draft_sampling,
                              st_par, st_tc)
            states[name] = CandidateState(
                name=name, method=plan.method.name, batch_size=b, num_steps=k, topk=st_topk,
                num_draft_tokens=w, verify_rule=plan.verify.rule,
                draft_sampling=plan.verify.draft_sampling, parallel=st_par, tree_choices=st_tc)
    ordered = tuple(sorted(states.values(), key=lambda s: (s.batch_size, s.num_steps, s.name)))
    return Lowering(states=ordered, capture_sizes=tuple(sizes), buckets=buckets, schedule=spec,
                    reasons=reasons, notes=tuple(notes))


def lower(plan: Plan, alpha: Optional[float] = None,
          auto_model: Optional[Tuple[cost.BatchModel, str]] = None) -> List[CandidateState]:
    """Plan → its candidate states, one per (captured batch size, κ, tree shape, verify width,
    verify rule) the schedule can select, pruned as SGLang prunes graph sizes per step
    (``cuda_graph_bs_for_step``, adaptive_spec_params.py:328-340). Sorted by (batch size, κ).
    Raises PlanError naming the offending field (see :func:`lower_report` for ``alpha`` and
    ``auto_model``)."""
    return list(lower_report(plan, alpha, auto_model).states)
