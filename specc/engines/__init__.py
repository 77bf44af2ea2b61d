"""Engines: one package per serving engine that specc checks plans against or exports plans to.

Each package ``specc/engines/<name>/`` holds everything specc knows about that engine: its rule
tables (one module per pinned release, ``rules_<version>.py``), and where the engine is an external
one, its launch-flag tables (``flags/<version>.json``), its launch-command importer (``importer.py``)
and its exporter (``exporter.py``). ``specc`` is specc's own runtime: it has rules only.

A package's ``__init__`` exposes ``rule_tables()``: the :class:`specc.check.base.Profile` of every
release it knows. :func:`rule_tables` here discovers the packages, so a third engine (llama.cpp's
``--spec-type`` flags, say) is one new package and nothing else. Importing this package never imports
torch or any engine's rules; they load on first use.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Dict, Tuple

_TABLES: Dict[str, Dict[str, object]] = {}


def engine_packages() -> Tuple[str, ...]:
    """The names of the engine packages under ``specc/engines/`` (``specc`` first, then sorted)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)
    return tuple(sorted(names, key=lambda n: (n != "specc", n)))


def rule_tables() -> Dict[str, Dict[str, object]]:
    """Engine name -> {pinned version string (``"sglang==0.5.23"``) -> rule table}, built once from
    every engine package's ``rule_tables()``; the same dict object on every call, so a test may add a
    release to it."""
    if not _TABLES:
        for name in engine_packages():
            pkg = importlib.import_module(f"{__name__}.{name}")
            _TABLES[name] = {p.version: p for p in pkg.rule_tables()}
    return _TABLES
