"""Checking plans and launch commands against engine profiles, into :class:`Result` s: the work of
``specc check`` (which renders the results, :mod:`specc.commands.check`) and of ``specc tune``'s launch
file, which re-checks every command it writes (``specc.tune.emit.recheck_command``).

:func:`check_inputs` loads plan files or presets with overrides and runs each engine's rules;
:func:`check_command` reads a launch command as the engine release's parser does (:mod:`specc.importer`)
and runs the rules on the plan it amounts to; :func:`assumptions` says what a check took because nothing
stated it; :func:`exit_code` is ``specc check``'s exit status. Never raises for bad input: a plan or
command that cannot be read is a :class:`Result` with ``error`` set. Does not import torch.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from specc.errors import SpeccError


@dataclass
class Result:
    """One (plan, engine) check, or a plan that failed to load (``error`` set, ``engine`` None)."""

    plan_path: str
    name: Optional[str] = None
    engine: Optional[str] = None
    violations: list = field(default_factory=list)
    locations: List[Tuple[str, int]] = field(default_factory=list)
    resolved: Any = None
    error: Optional[str] = None
    assumed: List[Dict[str, Any]] = field(default_factory=list)


def _location(loaded, keys) -> Tuple[str, int]:
    for key in keys:
        src = loaded.where(key)
        if src is not None:
            return src
    return (_rel(loaded.path), 0)


def _rel(path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def with_hardware(plan, hardware):
    """``plan`` with ``schedule.hardware`` set to ``--hardware``'s profile
    (:class:`specc.predict.hardware.HardwareChoice`; None: unchanged)."""
    import dataclasses

    if hardware is None:
        return plan
    return dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, hardware=hardware.profile))


def default_hardware_for(plan, engine: str, hardware=None):
    """``--hardware``, else for a GPU plan checked against SGLang without ``schedule.hardware`` the GPU
    measured on this machine (:func:`specc.predict.hardware.local_hardware`), else None (the rules take
    :func:`specc.predict.sizing.default_hardware`)."""
    if hardware is not None:
        return hardware
    if engine == "sglang" and plan.runtime.device != "cpu" and not plan.schedule.hardware:
        from specc.predict.hardware import local_hardware

        return local_hardware()
    return None


def assumptions(plan, engine: str, command: Optional[str] = None, measured=None) -> List[Dict[str, Any]]:
    """What the check assumed because neither the plan (or launch command) nor ``--hardware`` said it:
    one dict per assumption with ``what``, ``value`` (None: left to the engine), ``why`` and ``set_with``
    (the flag or key that states it).

    * ``hardware``: SGLang sizes its CUDA-graph batch sizes and memory fraction from the GPU's memory;
      without ``schedule.hardware`` specc takes :func:`specc.predict.sizing.default_hardware` (h100 on a
      GPU). Only where the engine's rules read it (SGLang, not on the CPU).
    * ``context_length``: no ``target.max_model_len``: the engine takes the checkpoint's own context,
      and specc's memory estimates (:mod:`specc.predict.deploy_cost`) use 2048 tokens.

    ``engine``: the engine's profile name (specc, sglang, vllm); ``command``: the engine of a launch
    command (the flags name the fix), None for a plan; ``measured``: the hardware taken from a cost
    table measured here (:func:`default_hardware_for`), said as the source of the assumption."""
    from specc.predict.hardware import shipped_profiles
    from specc.predict.sizing import default_hardware

    out: List[Dict[str, Any]] = []
    if engine == "sglang" and plan.runtime.device != "cpu" and not plan.schedule.hardware:
        out.append({"what": "hardware", "value": measured.name if measured is not None else default_hardware(plan),
                    "why": "the GPU SGLang sizes its CUDA graphs and memory fraction for"
                           + (f", from the cost table measured here ({measured.cost_table})" if measured is not None
                              else ""),
                    "set_with": f"--hardware ({', '.join(shipped_profiles())} or a profile file)"})
    if plan.target.max_model_len is None:
        flag = {"sglang": "--context-length N", "vllm": "--max-model-len N"}.get(command or "", "target.max_model_len=N")
        who = "the runtime" if engine == "specc" else engine
        out.append({"what": "context_length", "value": None,
                    "why": f"{'the command' if command else 'the plan'} sets none, so {who} reads it from the "
                           f"checkpoint; specc's memory estimates use 2048 tokens",
                    "set_with": flag})
    return out


def check_inputs(sources: List[str], overrides: List[str], engine: Optional[str], hardware=None) -> List[Result]:
    """Load every source and check it; never stops at the first failing plan. ``hardware``:
    ``--hardware`` (:class:`specc.predict.hardware.HardwareChoice`, None: the plans' own)."""
    from specc.check import profile, resolve
    from specc.engines import engine_names
    from specc.plan.load import load_plan

    results: List[Result] = []
    for src in sources:
        try:
            loaded = load_plan(src, overrides)
        except SpeccError as exc:
            results.append(Result(plan_path=src, error=str(exc)))
            continue
        engines = list(engine_names()) if engine == "all" else [engine or loaded.plan.engine]
        for eng in engines:
            try:
                prof = profile(eng)
            except KeyError as exc:
                results.append(Result(plan_path=_rel(loaded.path), name=loaded.plan.name,
                                      error=str(exc).strip("'\"")))
                continue
            hw = default_hardware_for(loaded.plan, prof.name, hardware)
            plan = with_hardware(loaded.plan, hw)
            resolved, violations = resolve(plan, prof.version, checkpoints=True)
            results.append(Result(plan_path=_rel(loaded.path), name=loaded.plan.name, engine=prof.version,
                                  violations=violations,
                                  locations=[_location(loaded, [k for k, _ in v.sets] + list(v.keys))
                                             for v in violations],
                                  resolved=resolved,
                                  assumed=assumptions(loaded.plan if hardware is None else plan, prof.name,
                                                      measured=hw if hardware is None else None)))
    return results


def exit_code(results: List[Result]) -> int:
    """2 if any plan was unusable, else 1 if any error, else 0."""
    if any(r.error for r in results):
        return 2
    if any(v.severity == "error" for r in results for v in r.violations):
        return 1
    return 0


def check_command(engine: str, words: List[str], pinned: Optional[str], file: Optional[str] = None,
                  hardware=None, base_dir: Optional[Path] = None) -> List[Result]:
    """Check a launch command: read it as the engine version's parser does (:mod:`specc.importer`), then
    run the rules on the plan it amounts to, with its flags that have no plan key as launch facts.
    What the engine's parser would refuse is reported as ``<engine>.argv`` errors, a flag given by a
    prefix as an ``<engine>.argv-prefix`` warning naming the flag the engine reads, and a value the
    engine fills in for a missing flag (vLLM's default model) as ``filled``. ``pinned``: ``--engine``
    (``sglang`` or ``sglang==0.5.23``; None: the newest release). ``file``: a file holding the command
    (``--file``). ``hardware``: ``--hardware`` (:class:`specc.predict.hardware.HardwareChoice`).
    ``base_dir``: where files the command names (SGLang's ``--speculative-adaptive-config``) are read
    from when it is not in a ``file`` (default: the current folder; a ``file``'s own folder otherwise)."""
    from specc.importer import CommandError, import_command, imported_plan
    from specc.check import profile, resolve
    from specc.check.base import Violation, drop_dependent

    label = f"<{engine} command>"
    try:
        prof = profile(pinned or engine)
    except KeyError as exc:
        return [Result(plan_path=label, error=str(exc).strip("'\""))]
    if prof.name != engine:
        return [Result(plan_path=label, error=f"--engine {pinned} does not match --{engine}-args; give --engine "
                                              f"{engine} or a pinned {engine}==VERSION, or leave it out")]
    text, argv, base = None, list(words), None
    if file is not None and argv:
        return [Result(plan_path=label, error=f"give the {engine} command after --{engine}-args or --file PATH, "
                                              f"not both (got --file {file} and {shlex.join(argv)})")]
    if file is None and len(argv) == 1 and os.path.isfile(argv[0]):
        file = argv[0]
    if file is not None:
        label, base = file, Path(file).resolve().parent
        from specc.io import LAUNCH_FILE_LIMIT, read_bounded

        try:
            text, argv = str(read_bounded(file, LAUNCH_FILE_LIMIT, "launch file")), None
        except SpeccError as exc:
            return [Result(plan_path=label, error=str(exc))]
    elif len(argv) == 1 and " " in argv[0]:
        text, argv = argv[0], None
    elif not argv:
        return [Result(plan_path=label, error=f"--{engine}-args: no command given; pass the launch command after "
                                              f"it, one quoted string, or --file PATH")]
    try:
        imp = import_command(engine, text=text, argv=argv, version=prof.release, base_dir=base or base_dir or Path.cwd())
        plan = imported_plan(imp, "command")
    except (CommandError, SpeccError) as exc:
        return [Result(plan_path=label, error=str(exc))]
    given = plan
    hw = default_hardware_for(plan, prof.name, hardware)
    plan = with_hardware(plan, hw)
    resolved, violations = resolve(plan, prof.version, flags=imp.flags, checkpoints=True)
    src = f"{prof.version} argparse ({imp.table.prog})"
    argv_errors = [Violation(rule=f"{engine}.argv", severity="error", keys=imp.stand_ins.get(e, ()), message=e,
                             source=src, stands_in=imp.stand_ins.get(e, ())) for e in imp.errors]
    prefixes = [Violation(rule=f"{engine}.argv-prefix", severity="warning", keys=(),
                          message=f"{written} is read by {prof.version} as {flag} (argparse takes an unambiguous "
                                  f"prefix); write {flag} in full: a release that adds a flag starting with "
                                  f"{written} makes it ambiguous", source=src)
                for written, flag in imp.prefixes]
    filled = [Violation(rule=f"{engine}.argv-default", severity="filled", keys=(key,), message=msg,
                        source=f"{prof.version} {source}", sets=((key, value),))
              for key, value, msg, source in imp.filled]
    # one root per mistake: a rule that only reads the values put in for a refused one is not reported
    allv = drop_dependent(argv_errors + prefixes + filled + violations, given=_given_keys(imp.plan))
    return [Result(plan_path=label, name="command", engine=prof.version, violations=allv,
                   locations=[(label, 0)] * len(allv), resolved=resolved,
                   assumed=assumptions(given if hardware is None else plan, prof.name, command=engine,
                                       measured=hw if hardware is None else None))]


def _given_keys(plan: Dict[str, Any], prefix: str = "") -> List[str]:
    """The dotted keys a command set (the leaves of the imported plan dict)."""
    out: List[str] = []
    for k, v in plan.items():
        if isinstance(v, dict) and v:
            out += _given_keys(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}")
    return out
