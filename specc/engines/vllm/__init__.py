"""vLLM: rule tables per release, flag tables, launch-command importer, exporter."""
from __future__ import annotations

from typing import Tuple


def rule_tables() -> Tuple[object, ...]:
    """The rule table (:class:`specc.check.base.Profile`) of every release of this engine that specc
    checks; a new release is one more module here, listed below."""
    from specc.engines.vllm import rules_0_33_0

    return (rules_0_33_0.PROFILE,)


def export(plan):
    """The plan as this engine's launch settings (:func:`specc.engines.vllm.exporter.to_vllm`; raises
    PlanError when the plan has no equivalent here)."""
    from specc.engines.vllm.exporter import to_vllm

    return to_vllm(plan)
