"""Helpers shared by tests/test_codegen*.py and tests/test_artifact*.py (no tests here)."""
from __future__ import annotations

from pathlib import Path

from specc.compiler import build
from specc.compiler import codegen


def load_preset(name: str, overrides=()):
    """A shipped preset's typed Plan, as loaded (before the engine fills defaults)."""
    from specc.plan.load import load_plan

    return load_plan(name, list(overrides)).plan


def resolved_preset(name: str, overrides=()):
    """A shipped preset as the `specc` engine runs it (what an artifact's plan.yaml holds)."""
    return codegen.resolve_plan(load_preset(name, overrides))[0]


def compile_preset(name: str, out: Path, overrides=(), on_file=None):
    """Compile a shipped preset into ``out`` with the shipped templates; returns the CompileResult."""
    return build.compile_plan(load_preset(name, overrides), out, on_file=on_file)
