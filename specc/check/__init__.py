"""Engine profiles as rule tables, and ``check(plan, engine)``.

One table per engine version: ``specc`` (our runtime), ``sglang==0.5.23``, ``vllm==0.33.0``. Engine
versions are data: release N+1 is a new module whose table is usually
``derive(<release N>.PROFILE, "sglang==N+1", replace=..., drop=..., add=...)`` (see
:func:`specc.check.base.derive`), listed by its engine package's ``rule_tables()`` (:mod:`specc.engines`). ``profile("sglang")`` (a bare name)
is the newest release; ``profile("sglang==0.5.23")`` pins one.

Every check also runs the profile-independent checkpoint rules of :mod:`specc.check.checkpoints` (a local
``target.path`` / ``draft.path`` must be a loadable checkpoint), reported as ``checkpoint.<id>``.
Importing this package never imports torch.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from specc.plan.schema import Plan
from specc.engines.releases import release_key
from specc.check.base import Facts, Profile, Rule, Violation, derive, run_profile  # noqa: F401


def versions() -> Dict[str, Dict[str, Profile]]:
    """Engine name -> {pinned version string -> rule table}: every engine package's tables
    (:func:`specc.engines.rule_tables`), loaded on first use."""
    from specc.engines import rule_tables

    return rule_tables()


def __getattr__(name: str) -> Any:
    # VERSIONS / PROFILES / ALIASES are computed from the engine packages on first use, so importing
    # this package (which every engine's rules do, through specc.check.base) loads no engine.
    if name == "VERSIONS":
        return versions()
    if name == "PROFILES":
        return {n: newest(n) for n in versions()}
    if name == "ALIASES":
        return {v: n for n, tables in versions().items() for v in tables}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def newest(name: str) -> Profile:
    """The newest release's table of engine ``name``."""
    tables = versions()[name]
    return tables[max(tables, key=release_key)]


def known_engines() -> List[str]:
    """Every accepted ``--engine`` value: bare names, then pinned versions."""
    vs = versions()
    return list(vs) + [v for tables in vs.values() for v in tables]


def profile(engine: str) -> Profile:
    """The table for ``engine``: ``specc``, ``sglang``, ``vllm`` (newest release) or a pinned
    ``name==version``.

    Raises:
        KeyError: unknown engine or version (the CLI turns it into a usage error naming the known ones).
    """
    vs = versions()
    name, _, version = engine.partition("==")
    if name in vs and not version:
        return newest(name)
    if name in vs and engine in vs[name]:
        return vs[name][engine]
    raise KeyError(f"unknown engine {engine!r}; known: {', '.join(known_engines())}")


def resolve(plan: Plan, engine: str, flags: Optional[Dict[str, Any]] = None,
            checkpoints: bool = False) -> Tuple[Plan, List[Violation]]:
    """The plan as ``engine`` would run it (every ``filled``/``fallback`` value applied) and the
    engine table's violations, then (``checkpoints=True``) the checkpoint rules' of
    :mod:`specc.check.checkpoints`. ``flags`` are a launch command's engine flags without a plan key
    (``dest -> value``; None when a plan is checked on its own). ``plan`` itself is not modified.
    Never raises on a plan; KeyError for an unknown engine."""
    prof = profile(engine)
    work, out = run_profile(prof, plan, Facts(plan, flags))
    if checkpoints:
        from specc.check import checkpoints as ck

        out = out + run_profile(ck.PROFILE, work, Facts(work, flags), work=work)[1]
    return work, out


def check(plan: Plan, engine: str, flags: Optional[Dict[str, Any]] = None,
          checkpoints: bool = True) -> List[Violation]:
    """Every rule of ``engine``'s table and (by default) the checkpoint rules that apply to ``plan``,
    in table order. Never raises on a plan; raises KeyError only for an unknown engine name."""
    return resolve(plan, engine, flags, checkpoints)[1]
