"""Ordering of engine release strings (``0.5.23``, ``sglang==0.5.23``, ``0.33.0rc1``), shared by the
rule tables (:mod:`specc.check`: the newest release of an engine) and the launch-flag tables
(:mod:`specc.importer.parse`: the newest flag table at or below a release). Imports nothing of specc.
"""
from __future__ import annotations

from typing import Tuple


def release_key(version: str) -> Tuple:
    """A sort key for ``version`` (an optional ``name==`` prefix is dropped): its ``.``/``-``
    separated parts, numbers compared as numbers and ordered before text parts."""
    out = []
    for part in version.split("==", 1)[-1].replace("-", ".").split("."):
        out.append((0, int(part), "") if part.isdigit() else (1, 0, part))
    return tuple(out)
