"""Engine profiles as rule tables, and ``check(plan, engine)``.

One table per engine version: ``specc`` (our runtime), ``sglang`` (``sglang==0.5.23``), ``vllm``
(``vllm==0.33.0``). A new engine version is a new table module, registered in ``PROFILES``.
Importing this package never imports torch.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from specc.plan.schema import Plan
from specc.rules.base import Profile, Rule, Violation, run_profile  # noqa: F401
from specc.rules import sglang_0_5_23, specc_profile, vllm_0_33_0

PROFILES: Dict[str, Profile] = {
    "specc": specc_profile.PROFILE,
    "sglang": sglang_0_5_23.PROFILE,
    "vllm": vllm_0_33_0.PROFILE,
}
ALIASES = {p.version: name for name, p in PROFILES.items()}


def profile(engine: str) -> Profile:
    """The profile for ``engine`` (``specc``, ``sglang``, ``vllm`` or a pinned ``name==version``).

    Raises:
        KeyError: unknown engine (the CLI turns it into a usage error).
    """
    name = ALIASES.get(engine, engine)
    if name not in PROFILES:
        raise KeyError(f"unknown engine {engine!r}; known: {', '.join(PROFILES)} "
                       f"({', '.join(p.version for p in PROFILES.values())})")
    return PROFILES[name]


def check(plan: Plan, engine: str) -> List[Violation]:
    """Every rule of ``engine``'s profile that applies to ``plan``, in table order.

    Never raises on a plan (see :func:`specc.rules.base.run_profile`); raises KeyError only for an
    unknown engine name.
    """
    return run_profile(profile(engine), plan)[1]


def resolve(plan: Plan, engine: str) -> Tuple[Plan, List[Violation]]:
    """The plan as ``engine`` would run it (every ``filled``/``fallback`` value applied) and the
    violations. ``plan`` itself is not modified."""
    return run_profile(profile(engine), plan)
