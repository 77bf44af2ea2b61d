"""vLLM: rule tables per release, flag tables, launch-command importer, exporter."""
from __future__ import annotations

from typing import Tuple

#: the word sequences that start a vLLM launch command (the CLI and the server modules)
LAUNCHERS = (("vllm", "serve"), ("-m", "vllm.entrypoints.openai.api_server"),
             ("-m", "vllm.entrypoints.cli.main", "serve"))
#: a bare ``--speculative-config`` JSON object is read as the whole command (no model)
BARE_CONFIG_FLAG = "--speculative-config"


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


def to_plan(values, env, out, base_dir=None, config_only=False) -> None:
    """vLLM flag values -> plan keys in ``out`` (:func:`specc.engines.vllm.importer.to_plan`); a bare
    ``--speculative-config`` (``config_only``) names no model, so vLLM's default model is not filled."""
    from specc.engines.vllm import importer

    importer.to_plan(values, env, out, default_model=not config_only)
