"""Canonical YAML of a resolved plan and its hash (the key codegen uses for an artifact).

The dump is schema-ordered (dataclass field order), bucket keys sorted, block style, so two equal
plans always dump to the same bytes whatever order their YAML was written in.
"""
from __future__ import annotations

import hashlib
from typing import Any

import yaml

from specc.plan.schema import Plan, plan_to_dict


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        if keys and all(isinstance(k, int) for k in keys):
            keys = sorted(keys)
        return {k: _canonical(value[k]) for k in keys}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def dump_resolved(plan: Plan) -> str:
    """The plan as canonical YAML text (UTF-8 safe, stable ordering, ends with a newline).

    Args:
        plan: a typed Plan (normally ``load_plan(...).plan``, or the engine-resolved plan of
            ``specc.check.resolve``).
    Returns:
        YAML text; ``yaml.safe_load`` of it gives back the same nested values.
    """
    return yaml.safe_dump(_canonical(plan_to_dict(plan)), sort_keys=False, default_flow_style=False,
                          allow_unicode=True, width=100)


def plan_hash(plan: Plan, length: int = 12) -> str:
    """First ``length`` hex digits of the SHA-256 of :func:`dump_resolved` (the artifact key)."""
    return hashlib.sha256(dump_resolved(plan).encode("utf-8")).hexdigest()[:length]
