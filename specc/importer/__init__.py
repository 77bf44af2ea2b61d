"""Launch command -> plan: read an SGLang or vLLM launch command (or a vLLM ``--speculative-config``
JSON, or a file holding either) back into plan keys.

    imp = import_command("sglang", text="python -m sglang.launch_server --model-path X ...")
    print(plan_yaml(imp, name="my_plan"))

Flags are read as the engine version's own parser reads them (:mod:`specc.importer.parse`), mapped
to plan keys with the inverse of :mod:`specc.export` (:mod:`specc.engines.sglang.importer`,
:mod:`specc.engines.vllm.importer`); flags without a plan key are listed in the written YAML and kept as
launch facts for the rules (``specc check --sglang-args/--vllm-args``). Never imports torch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from specc.engines import LAUNCH_CHECKED
from specc.importer.base import Imported
from specc.importer.command import CommandError, Launch, find_launch, from_words  # noqa: F401
from specc.importer.parse import load_table, parse_flags



def importable() -> tuple:
    """The engines whose launch commands are read here (:func:`specc.engines.importers`: SGLang, vLLM
    and any engine package that brings ``LAUNCHERS``, ``to_plan`` and flag tables)."""
    from specc import engines

    return engines.importers()


def known_versions(engine: str) -> List[str]:
    """``engine`` and its pinned releases with a rule table (``sglang``, ``sglang==0.5.23``), as
    ``specc check --engine`` accepts them."""
    from specc.check import known_engines

    return [e for e in known_engines() if e.split("==", 1)[0] == engine]


def import_command(engine: str, text: Optional[str] = None, argv: Optional[Sequence[str]] = None,
                   version: Optional[str] = None, base_dir: Optional[Path] = None,
                   config_only: bool = False) -> Imported:
    """Read one launch command into plan keys.

    Args:
        engine: ``sglang`` or ``vllm``.
        text: command text (a command line, a script, YAML, or vLLM ``--speculative-config`` JSON).
        argv: the command already split into words (instead of ``text``).
        version: the engine release whose flags and rules read it (None: the newest); it must be one
            ``specc check --engine`` knows (a release with a rule table).
        base_dir: where relative files named by the command live (``--speculative-adaptive-config``).
        config_only: the words are only a vLLM ``--speculative-config`` (no launch command), so a
            missing model is not filled with vLLM's default.

    Returns:
        :class:`Imported`; ``errors`` lists what the engine's parser would refuse. Raises
        :class:`CommandError` when no launch command of ``engine`` is found, KeyError for an unknown
        engine or version (naming the known ones, as ``specc check --engine`` does).
    """
    from specc import engines

    if engine not in importable():
        raise KeyError(f"unknown engine {engine!r} (launch commands are read for {', '.join(importable())})")
    if version is not None and f"{engine}=={version}" not in known_versions(engine):
        raise KeyError(f"unknown engine '{engine}=={version}'; known: {', '.join(known_versions(engine))}")
    table = load_table(engine, version)
    launch: Launch = find_launch(text, engine) if text is not None else from_words(list(argv or ()), engine)
    config_only = config_only or launch.config_only
    parsed = parse_flags(table, launch.args)
    # environment assignments of the command (SGLANG_ENABLE_PP_SPEC=1 ...) are launch facts too
    out = Imported(engine=engine, version=table.version, flags={**launch.env, **parsed.values},
                   errors=list(parsed.errors), spelled=parsed.spelled, table=table, prefixes=list(parsed.prefixes))
    for written, flag in parsed.prefixes:
        out.notes.append(f"{written} is read by {engine}=={table.version} as {flag} (argparse takes an unambiguous "
                         f"prefix); write {flag} in full: a release that adds a flag starting with {written} "
                         f"makes it ambiguous")
    out.plan["engine"] = engine
    engines.get(engine).to_plan(parsed.values, launch.env, out, base_dir=base_dir, config_only=config_only)
    return out


def plan_yaml(imp: Imported, name: str = "imported", source: str = "") -> str:
    """The imported plan as YAML, headed by comments naming the source, every flag that has no plan
    key, the notes and the errors (``specc import`` writes this)."""
    lines: List[str] = [f"# Imported by `specc import {imp.engine}` ({imp.engine}=={imp.version} flags)"
                        + (f" from {source}" if source else "")]
    if imp.unmapped:
        reader = (f"`specc check --{imp.engine}-args` reads them" if imp.engine in LAUNCH_CHECKED
                  else f"`specc check` reads launch commands of {' and '.join(LAUNCH_CHECKED)} only")
        lines.append(f"# Flags with no plan key (not exported; {reader}):")
        lines += [f"#   {u}" for u in imp.unmapped]
    for n in imp.notes:
        lines.append(f"# note: {n}")
    for e in imp.errors:
        lines.append(f"# error: {e}")
    data: Dict[str, Any] = {"name": name}
    data.update(imp.plan)
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    return "\n".join(lines) + "\n" + body


def imported_plan(imp: Imported, name: str = "imported"):
    """The imported keys as a typed :class:`specc.plan.schema.Plan` (schema defaults elsewhere).

    Raises:
        PlanError: a value the plan schema refuses (named with its key).
    """
    from specc.plan.load import plan_from_dict

    data: Dict[str, Any] = {"name": name}
    data.update(imp.plan)
    return plan_from_dict(data)
