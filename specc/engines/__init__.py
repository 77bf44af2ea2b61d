"""Engines: one package per serving engine that specc checks plans against or exports plans to.

Each package ``specc/engines/<name>/`` holds everything specc knows about that engine: its rule
tables (one module per pinned release, ``rules_<version>.py``), and where the engine is an external
one, its launch-flag tables (``flags/<version>.json``), its launch-command importer (``importer.py``)
and its exporter (``exporter.py``). ``specc`` is specc's own runtime: it has rules only (its plans
are compiled, not exported).

An engine package (or module) exposes ``rule_tables()``: the :class:`specc.check.base.Profile` of
every release it knows; an engine that plans export to also exposes ``export(plan)``, returning a
launch object with ``command() -> str`` (a dataclass, so ``specc export --format json`` can print
it); an engine whose launch commands specc reads back (``specc import``) also exposes ``LAUNCHERS``
(the word sequences that start its launch command), ``to_plan(values, env, out, base_dir=None,
config_only=False)`` (flag values -> plan keys, :class:`specc.importer.base.Imported`) and its
launch-flag tables in ``flags/<version>.json`` beside it (or ``FLAGS_DIR``). The engines are the packages under ``specc/engines/`` plus the ``specc.engines`` entry points
(``name = "module"``), so a third engine (llama.cpp's ``--spec-type`` flags, say) is one new
package, inside specc or outside it, and nothing else. Importing this package imports no engine;
they load on first use.
"""
from __future__ import annotations

import importlib
import pkgutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Dict, Tuple

#: entry-point group through which an engine outside specc registers: ``name = "module"``
ENGINE_ENTRY_POINT_GROUP = "specc.engines"
#: the engines whose launch commands ``specc check --<engine>-args`` reads (its ``--sglang-args`` and
#: ``--vllm-args``); a plugin engine's are read by ``specc import`` only
LAUNCH_CHECKED: Tuple[str, ...] = ("sglang", "vllm")

_TABLES: Dict[str, Dict[str, object]] = {}
_MODULES: Dict[str, str] = {}


def engine_packages() -> Tuple[str, ...]:
    """The names of the engine packages under ``specc/engines/`` (``specc`` first, then sorted)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)
    return tuple(sorted(names, key=lambda n: (n != "specc", n)))


def _modules() -> Dict[str, str]:
    """Engine name -> module path: the packages here, then the entry points (a plugin may not take
    a built-in's name; a broken or clashing entry point is skipped with a warning naming it)."""
    if not _MODULES:
        from importlib.metadata import entry_points

        found = {name: f"{__name__}.{name}" for name in engine_packages()}
        for ep in sorted(entry_points(group=ENGINE_ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in found:
                if found[ep.name] != ep.value:
                    warnings.warn(f"engine entry point {ep.name} = {ep.value!r} skipped: {ep.name!r} is "
                                  f"already an engine ({found[ep.name]})", stacklevel=2)
                continue
            found[ep.name] = ep.value
        _MODULES.update(found)
    return _MODULES


def engine_names() -> Tuple[str, ...]:
    """Every engine a plan's ``engine`` key, ``specc check --engine`` and ``specc export --engine``
    may name: specc's packages, then the entry points'."""
    return tuple(_modules())


def get(name: str) -> ModuleType:
    """The engine's module. Raises KeyError naming the known engines for an unknown name."""
    mods = _modules()
    if name not in mods:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(mods)}")
    return importlib.import_module(mods[name])


def exporters() -> Tuple[str, ...]:
    """The engines plans export to (their module has ``export``); ``specc`` plans are compiled."""
    return tuple(n for n in engine_names() if callable(getattr(get(n), "export", None)))


def rule_tables() -> Dict[str, Dict[str, object]]:
    """Engine name -> {pinned version string (``"sglang==0.5.23"``) -> rule table}, built once from
    every engine's ``rule_tables()``; the same dict object on every call, so a test may add a
    release to it."""
    if not _TABLES:
        for name in engine_names():
            _TABLES[name] = {p.version: p for p in get(name).rule_tables()}
    return _TABLES


def importers() -> Tuple[str, ...]:
    """The engines whose launch commands ``specc import`` reads: their module has ``to_plan`` and
    ``LAUNCHERS`` (``specc check`` reads those of :data:`LAUNCH_CHECKED` only)."""
    return tuple(n for n in engine_names()
                 if callable(getattr(get(n), "to_plan", None)) and getattr(get(n), "LAUNCHERS", None))


def flags_dir(name: str) -> Path:
    """Where engine ``name`` keeps its launch-flag tables (``<version>.json``): the module's
    ``FLAGS_DIR``, else ``flags/`` beside the module. Raises KeyError for an unknown engine."""
    mod = get(name)
    given = getattr(mod, "FLAGS_DIR", None)
    return Path(given) if given else Path(mod.__file__).resolve().parent / "flags"
