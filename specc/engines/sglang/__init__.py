"""SGLang: rule tables per release, flag tables, launch-command importer, exporter."""
from __future__ import annotations

from typing import Tuple

#: the word sequences that start an SGLang launch command (the launcher modules and the CLI)
LAUNCHERS = (("-m", "sglang.launch_server"), ("sglang", "serve"), ("-m", "sglang.srt.server"))


def rule_tables() -> Tuple[object, ...]:
    """The rule table (:class:`specc.check.base.Profile`) of every release of this engine that specc
    checks; a new release is one more module here, listed below."""
    from specc.engines.sglang import rules_0_5_23

    return (rules_0_5_23.PROFILE,)


def export(plan):
    """The plan as this engine's launch settings (:func:`specc.engines.sglang.exporter.to_sglang`; raises
    PlanError when the plan has no equivalent here)."""
    from specc.engines.sglang.exporter import to_sglang

    return to_sglang(plan)


def to_plan(values, env, out, base_dir=None, config_only=False) -> None:
    """SGLang flag values and environment assignments -> plan keys in ``out``
    (:func:`specc.engines.sglang.importer.to_plan`)."""
    from specc.engines.sglang import importer

    importer.to_plan(values, env, out, base_dir)
