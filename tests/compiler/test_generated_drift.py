"""CI drift check: the artifacts committed under generated/ are exactly what `specc compile` produces
from the shipped presets with this source tree.

Every preset in conf/plan/ that targets the `specc` engine and passes `check` must have its artifact
in generated/ byte for byte; every directory in generated/ must belong to such a preset (a template or
plan change gives a new name, so the old directory becomes stale). The fix printed on failure:
`specc compile conf/plan/<preset>.yaml` (and delete the stale directory).
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from specc.compiler import build
from specc.compiler import codegen
from specc.plan.load import list_presets, load_plan

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "generated"


@functools.lru_cache(maxsize=1)
def shipped_presets():
    """Names of the presets whose artifacts are committed: engine `specc`, no `check` errors."""
    out = []
    for name in sorted(list_presets()):
        plan = load_plan(name).plan
        if plan.engine == "specc" and not codegen.check_errors(plan):
            out.append(name)
    return tuple(out)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Every shipped preset compiled once, from this source tree, into a temporary directory."""
    out = tmp_path_factory.mktemp("fresh")
    return {p: build.compile_plan(load_plan(p).plan, out).path for p in shipped_presets()}


@pytest.mark.parametrize("preset", shipped_presets())
def test_committed_artifact_matches_a_fresh_compile(preset, fresh):
    path = fresh[preset]
    committed = GENERATED / path.name
    fix = (f"run `specc compile conf/plan/{preset}.yaml` and commit generated/{path.name}/ (cost "
           f"predictions read the drafter checkpoints: run tools/install first so they exist)")
    assert committed.is_dir(), f"generated/{path.name}/ is missing: {fix}"
    new, old = codegen.read_tree(path), codegen.read_tree(committed)
    changed = sorted(p for p in set(new) | set(old) if new.get(p) != old.get(p))
    assert not changed, f"generated/{path.name}/ drifted in {changed}: {fix}"


def test_no_stale_artifacts(fresh):
    expected = {path.name for path in fresh.values()}
    present = {p.name for p in GENERATED.iterdir() if p.is_dir() and not p.name.startswith(".")} if GENERATED.is_dir() else set()
    stale = sorted(present - expected)
    assert not stale, f"generated/ holds artifacts no shipped preset compiles to: {stale}; delete them"
