"""Rules as data: a ``Rule`` is one row of an engine profile's table; ``run_profile`` applies a
table to a plan and returns every ``Violation`` at once, never raising.

A rule's ``when`` is a small predicate over the (partly resolved) plan; ``sets`` (for ``filled``
and ``fallback`` rules) returns the dotted keys the engine fills in or overrides and their new
values. Rules run in table order, which mirrors the order the engine resolves its arguments, and
each ``sets`` is applied before the next rule runs, so later rules see the engine's values — as
SGLang's ``handle_speculative_decoding`` does (sglang 0.5.23 ``arg_groups/pipeline.py:20``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from specc.plan.schema import Plan

SEVERITIES = ("error", "warning", "fallback", "filled")


@dataclass(frozen=True)
class Rule:
    """One compatibility rule of an engine profile.

    Attributes:
        id: short id from the reference table (``EG16``, ``R12``) or the profile's own (``S-METHOD``).
        outcome: ``error`` | ``warning`` | ``fallback`` (the engine overrides a value or disables a
            feature) | ``filled`` (a default the engine fills in). A ``fallback`` whose overridden
            keys were all unset (None) is reported as ``filled``.
        keys: the dotted plan keys the condition reads (reported to the user).
        when: predicate over the plan; True means the rule applies.
        message: ``str.format`` template; fields: ``p`` (the plan as resolved so far), ``new``
            (dict of values ``sets`` returned). It names the keys and the fix.
        source: ``file:line`` in the engine (relative to the profile's package root) or in specc.
        sets: for filled/fallback rules, plan -> {dotted_key: new value}.
    """

    id: str
    outcome: str
    keys: Tuple[str, ...]
    when: Callable[[Plan], bool]
    message: str
    source: str
    sets: Optional[Callable[[Plan], Dict[str, Any]]] = None


@dataclass(frozen=True)
class Profile:
    """A rule table for one engine version (``sglang==0.5.23``, ``vllm==0.33.0``, ``specc``)."""

    name: str  # "sglang" | "vllm" | "specc"
    version: str  # "sglang==0.5.23"
    root: str  # path prefix of the sources, e.g. "sglang/srt/"
    rules: Tuple[Rule, ...]


@dataclass(frozen=True)
class Violation:
    """One rule that applies to a plan.

    ``rule`` is ``<profile>.<id>``; ``keys`` the dotted plan keys involved; ``source`` the engine
    version and ``file:line``; ``sets`` the values the engine fills in or overrides (dotted key ->
    value) for ``filled``/``fallback``.
    """

    rule: str
    severity: str
    keys: Tuple[str, ...]
    message: str
    source: str
    sets: Tuple[Tuple[str, Any], ...] = field(default=())

    def to_json(self) -> Dict[str, Any]:
        out = {"rule": self.rule, "severity": self.severity, "keys": list(self.keys),
               "message": self.message, "source": self.source}
        if self.sets:
            out["sets"] = {k: v for k, v in self.sets}
        return out


# ------------------------------------------------------------------------------------------
# Plan access


def get(plan: Any, dotted: str) -> Any:
    """Value at a dotted key (None when a parent is None)."""
    obj = plan
    for part in dotted.split("."):
        if obj is None:
            return None
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj


def clone(obj: Any) -> Any:
    """Deep copy of a plan (dataclasses, lists, dicts of plain values); ~5x faster than copy.deepcopy."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj)(**{f.name: clone(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, list):
        return [clone(x) for x in obj]
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


def set_key(plan: Plan, dotted: str, value: Any) -> None:
    """Set a dotted key in place; creates an absent ``draft`` section."""
    parts = dotted.split(".")
    obj: Any = plan
    for part in parts[:-1]:
        nxt = getattr(obj, part, None)
        if nxt is None and part == "draft":
            from specc.plan.schema import DraftConfig

            nxt = DraftConfig()
            setattr(obj, part, nxt)
        obj = nxt
    setattr(obj, parts[-1], clone(value))


# ------------------------------------------------------------------------------------------
# Running a table


def run_profile(profile: Profile, plan: Plan) -> Tuple[Plan, List[Violation]]:
    """Apply every rule of ``profile`` to ``plan`` in table order.

    Returns (resolved plan — a deep copy with every filled/fallback value applied, violations in
    rule order). Never raises for any plan: a predicate that fails on an odd value is reported as
    an ``error`` violation ``<profile>.internal`` naming the rule, so a bug cannot hide a plan's
    problems (tests assert it never appears).
    """
    work = clone(plan)
    out: List[Violation] = []
    for rule in profile.rules:
        src = f"{profile.version} {profile.root}{rule.source}" if not rule.source.startswith("specc") \
            else f"{profile.version} {rule.source}"
        try:
            if not rule.when(work):
                continue
            new = dict(rule.sets(work)) if rule.sets else {}
            severity = rule.outcome
            if severity == "fallback" and new and all(get(work, k) is None for k in new):
                severity = "filled"
            message = rule.message.format(p=work, new=new)
            for k, v in new.items():
                set_key(work, k, v)
        except Exception as exc:  # noqa: BLE001 - check() must never raise on a plan
            out.append(Violation(rule=f"{profile.name}.internal", severity="error", keys=rule.keys,
                                 message=f"rule {rule.id} could not be evaluated ({type(exc).__name__}: {exc})",
                                 source=src))
            continue
        out.append(Violation(rule=f"{profile.name}.{rule.id}", severity=severity, keys=tuple(rule.keys),
                             message=message, source=src, sets=tuple(new.items())))
    return work, out


# ------------------------------------------------------------------------------------------
# Small predicates shared by the tables (None-safe)


def gt(v: Any, n: float) -> bool:
    return isinstance(v, (int, float)) and v > n


def ne(v: Any, n: Any) -> bool:
    """v was set (not None) and differs from n."""
    return v is not None and v != n


def lora(p: Plan) -> bool:
    return bool(p.deploy.lora.adapters)


def rejection_sampling(p: Plan) -> bool:
    """Standard verify with the draft's own probabilities (SGLang ``--speculative-use-rejection-sampling``)."""
    return p.verify.rule == "standard" and p.verify.draft_sampling == "probabilistic"


def thresholds_set(p: Plan) -> bool:
    t = p.verify.accept_threshold
    return any(v is not None and v != 1.0 for v in (t.single, t.acc))


def ngram_window_set(p: Plan) -> bool:
    return p.method.ngram.min is not None or p.method.ngram.max is not None


def bucket_candidates(p: Plan) -> List[int]:
    """Sorted union of all buckets' κ candidates."""
    out = set()
    for b in (p.schedule.buckets or {}).values():
        out.update(c for c in (b.candidates or []) if isinstance(c, int))
    return sorted(out)
