"""The execution plan (specc.ir): built once from a plan, JSON round-trip, what the artifact holds,
and the loader's refusal of older artifact formats."""
from __future__ import annotations

import json

import pytest

from specc import ir
from specc.compiler import build
from specc.compiler import codegen
from specc.errors import ArtifactError
from specc.plan.load import load_plan
from specc.runtime.artifact import load_artifact


@pytest.mark.parametrize("preset", ["smollm2_adaptive", "smollm2_medusa", "smollm2_budget"])
def test_execution_plan_round_trips_through_json(preset):
    low = build.compile_ir(load_plan(preset).plan)
    eplan = low.ir
    text = json.dumps(eplan.to_dict(), sort_keys=True)
    again = ir.ExecutionPlan.from_dict(json.loads(text))
    assert again == eplan
    assert again.to_dict() == eplan.to_dict()
    # one object answers what callers used to re-derive from the plan
    assert eplan.capture_sizes == eplan.runtime.schedule.capture_sizes
    assert eplan.max_steps == max(s.num_steps for s in eplan.states) == eplan.runtime.max_steps
    for s in eplan.states:
        assert dict(s.constants)["K"] == s.num_steps and dict(s.constants)["W"] == s.num_draft_tokens
        assert [p.stage for p in s.programs] == list(ir.STAGES)
        for _, kname in s.kernels:
            assert eplan.kernel(kname).constants  # every kernel a state names is in the plan
        if s.tree_choices is not None:
            assert s.tree in eplan.trees and dict(s.constants)["N"] == s.num_draft_tokens - 1


def test_artifact_manifest_is_the_execution_plan(tmp_path):
    low = build.compile_ir(load_plan("smollm2_adaptive").plan)
    res = build.compile_plan(load_plan("smollm2_adaptive").plan, tmp_path)
    art = load_artifact(res.path)
    assert art.ir == low.ir
    manifest = json.loads((res.path / "manifest.json").read_text())
    assert {k: manifest[k] for k in ir.IR_KEYS} == json.loads(json.dumps(low.ir.to_dict()))
    assert "prediction" not in json.dumps(manifest["states"])
    preds = json.loads((res.path / "predictions.json").read_text())
    assert set(preds["states"]) == {s.name for s in low.ir.states}


def test_ir_module_imports_no_plan_or_torch():
    import subprocess
    import sys

    code = ("import sys, specc.ir; bad = [m for m in sys.modules if m.startswith(('specc.plan', 'hydra', "
            "'omegaconf', 'torch'))]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_old_format_artifact_is_refused_with_the_fix(tmp_path):
    res = build.compile_plan(load_plan("smollm2_ngram").plan, tmp_path)
    mpath = res.path / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["format_version"] = 3
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="recompile with specc compile") as exc:
        load_artifact(res.path)
    assert "format 3" in str(exc.value) or "3" in str(exc.value)


def test_from_dict_names_a_missing_key():
    with pytest.raises(ArtifactError, match="'runtime'"):
        ir.ExecutionPlan.from_dict({"plan_name": "p", "states": [], "trees": {}, "kernels": []})


def test_runtime_binds_the_programs_the_execution_plan_lists():
    """A state's stage programs are read from the IR (``StateIR.programs``), not re-derived: each
    bound program is the one the IR names, and an IR naming something that is not a stage program
    is refused with the state's name."""
    from specc.runtime import state as S

    eplan = build.plan_ir(load_plan("smollm2_eagle3_tree").plan)
    for s in eplan.states:
        calls = [(p.stage, p.fn, p.args) for p in s.programs]
        bound = S.bind_programs(calls, f"state {s.name}")
        assert [getattr(bound, stage).__name__ for stage, _, _ in calls] == [fn for _, fn, _ in calls]
    s = eplan.states[-1]
    bad = [(p.stage, "check_supported" if p.stage == "accept" else p.fn, p.args) for p in s.programs]
    with pytest.raises(ArtifactError, match=f"state {s.name}: program accept=check_supported"):
        S.bind_programs(bad, f"state {s.name}")
    with pytest.raises(ArtifactError, match="no program for stage"):
        S.bind_programs([(p.stage, p.fn, p.args) for p in s.programs if p.stage != "extend"], "state x")
