"""Engine profiles as rule tables, and ``check(plan, engine)``.

One table per engine version: ``specc`` (our runtime), ``sglang==0.5.23``, ``vllm==0.33.0``. Engine
versions are data: release N+1 is a new module whose table is usually
``derive(<release N>.PROFILE, "sglang==N+1", replace=..., drop=..., add=...)`` (see
:func:`specc.rules.base.derive`), registered in :data:`VERSIONS`. ``profile("sglang")`` (a bare name)
is the newest release; ``profile("sglang==0.5.23")`` pins one.

Every check also runs the profile-independent checkpoint rules of :mod:`specc.rules.checkpoints` (a local
``target.path`` / ``draft.path`` must be a loadable checkpoint), reported as ``checkpoint.<id>``.
Importing this package never imports torch.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from specc.plan.schema import Plan
from specc.releases import release_key
from specc.rules.base import Facts, Profile, Rule, Violation, derive, run_profile  # noqa: F401
from specc.rules import sglang_0_5_23, specc_profile, vllm_0_33_0


#: engine name -> {pinned version string -> rule table}; add a release by adding its table here.
VERSIONS: Dict[str, Dict[str, Profile]] = {
    "specc": {specc_profile.PROFILE.version: specc_profile.PROFILE},
    "sglang": {sglang_0_5_23.PROFILE.version: sglang_0_5_23.PROFILE},
    "vllm": {vllm_0_33_0.PROFILE.version: vllm_0_33_0.PROFILE},
}


def newest(name: str) -> Profile:
    """The newest release's table of engine ``name``."""
    tables = VERSIONS[name]
    return tables[max(tables, key=release_key)]


#: engine name -> its newest table (what a bare ``--engine sglang`` checks against)
PROFILES: Dict[str, Profile] = {name: newest(name) for name in VERSIONS}
ALIASES = {v: name for name, tables in VERSIONS.items() for v in tables}


def known_engines() -> List[str]:
    """Every accepted ``--engine`` value: bare names, then pinned versions."""
    return list(VERSIONS) + [v for tables in VERSIONS.values() for v in tables]


def profile(engine: str) -> Profile:
    """The table for ``engine``: ``specc``, ``sglang``, ``vllm`` (newest release) or a pinned
    ``name==version``.

    Raises:
        KeyError: unknown engine or version (the CLI turns it into a usage error naming the known ones).
    """
    name, _, version = engine.partition("==")
    if name in VERSIONS and not version:
        return newest(name)
    if name in VERSIONS and engine in VERSIONS[name]:
        return VERSIONS[name][engine]
    raise KeyError(f"unknown engine {engine!r}; known: {', '.join(known_engines())}")


def resolve(plan: Plan, engine: str, flags: Optional[Dict[str, Any]] = None,
            checkpoints: bool = False) -> Tuple[Plan, List[Violation]]:
    """The plan as ``engine`` would run it (every ``filled``/``fallback`` value applied) and the
    engine table's violations, then (``checkpoints=True``) the checkpoint rules' of
    :mod:`specc.rules.checkpoints`. ``flags`` are a launch command's engine flags without a plan key
    (``dest -> value``; None when a plan is checked on its own). ``plan`` itself is not modified.
    Never raises on a plan; KeyError for an unknown engine."""
    prof = profile(engine)
    work, out = run_profile(prof, plan, Facts(plan, flags))
    if checkpoints:
        from specc.rules import checkpoints as ck

        out = out + run_profile(ck.PROFILE, work, Facts(work, flags), work=work)[1]
    return work, out


def check(plan: Plan, engine: str, flags: Optional[Dict[str, Any]] = None,
          checkpoints: bool = True) -> List[Violation]:
    """Every rule of ``engine``'s table and (by default) the checkpoint rules that apply to ``plan``,
    in table order. Never raises on a plan; raises KeyError only for an unknown engine name."""
    return resolve(plan, engine, flags, checkpoints)[1]
