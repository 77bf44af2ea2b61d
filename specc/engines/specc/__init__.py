"""specc's own runtime: the rule table of what it runs (plans here are compiled, not exported)."""
from __future__ import annotations

from typing import Tuple


def rule_tables() -> Tuple[object, ...]:
    """The rule table (:class:`specc.check.base.Profile`) of every release of this engine that specc
    checks; a new release is one more module here, listed below."""
    from specc.engines.specc import rules

    return (rules.PROFILE,)
