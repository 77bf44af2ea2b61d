"""``specc check`` against the engines' own verdicts on the deployment keys.

``tests/fixtures/engine_verdicts/<engine>-<version>.json`` was written by ``tools/engine_verdicts.py``,
which ran each plan of ``cases.json`` through the engine's own code on a CPU: SGLang 0.5.23's argument
parser, resolution pipeline and server-argument check (told the GPU memory of the case's hardware
profile), vLLM 0.33.0's parser, serve-argument validation and ``VllmConfig``. For every case:

* the command the fixture recorded is the one specc's exporter writes today (else the verdict is stale:
  re-run the tool);
* an engine refusal is an error of ``specc check``, from the rule the case names, quoting the engine's
  words where the rule says so; a refusal the engine makes per request (``request_refusal``) too;
* an accepted plan has no error, and every deployment key the engine resolved equals the value
  ``specc check --show-resolved`` reports for it (filled or kept).
"""
from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from specc.plan.load import plan_from_dict
from specc.check import resolve
from specc.check.base import get

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "engine_verdicts"
SPEC = json.loads((FIX / "cases.json").read_text())
RECORDED = {e: {c["id"]: c for c in json.loads((FIX / f"{e}.json").read_text())["cases"]}
            for e in ("sglang-0.5.23", "vllm-0.33.0")}
ENGINE = {"sgl_": "sglang-0.5.23", "vllm_": "vllm-0.33.0"}


def _tool():
    spec = importlib.util.spec_from_file_location("engine_verdicts", REPO / "tools" / "engine_verdicts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TOOL = _tool()


def _case(case_id):
    case = next(c for c in SPEC["cases"] if c["id"] == case_id)
    fixture = ENGINE["sgl_" if case_id.startswith("sgl_") else "vllm_"]
    return case, RECORDED[fixture][case_id], fixture.split("-")[0]


def _plan(case, engine):
    data = TOOL.build_plan(case, SPEC["bases"])
    if case.get("hardware"):
        data.setdefault("schedule", {})["hardware"] = case["hardware"]
    return data


IDS = [c["id"] for c in SPEC["cases"]]


def test_every_case_was_recorded():
    recorded = set(RECORDED["sglang-0.5.23"]) | set(RECORDED["vllm-0.33.0"])
    assert recorded == set(IDS), sorted(recorded ^ set(IDS))


@pytest.mark.parametrize("case_id", IDS)
def test_recorded_command_is_todays_export(case_id, tmp_path):
    case, rec, engine = _case(case_id)
    argv, env = TOOL.launch(TOOL.build_plan(case, SPEC["bases"]), engine, tmp_path)
    shown = " ".join(shlex.quote(a.replace(str(tmp_path), "<configs>")) for a in argv)
    assert shown == rec["command"], "the exporter changed: re-run tools/engine_verdicts.py"
    assert {**env, **case.get("env", {})} == rec["env"]


@pytest.mark.parametrize("case_id", IDS)
def test_specc_check_gives_the_engines_verdict(case_id):
    case, rec, engine = _case(case_id)
    plan = plan_from_dict(_plan(case, engine), validate=False)
    resolved, violations = resolve(plan, engine, flags=case.get("env") or None)
    errors = [v for v in violations if v.severity == "error" and not v.rule.startswith("checkpoint.")]
    assert not [v for v in violations if v.rule.endswith(".internal")]
    if rec["verdict"] == "error" or case.get("request_refusal"):
        assert case.get("rule"), f"{case_id}: the engine refuses ({rec.get('error')}); the case must name the rule"
        assert case["rule"] in [v.rule for v in errors], (rec.get("error"), [(v.rule, v.message) for v in violations])
        return
    assert errors == [], [(v.rule, v.message) for v in errors]
    for key, value in rec["resolved"].items():
        if value is None:
            continue
        mine = get(resolved, key)
        if key == "deploy.overlap_scheduler" and mine is None:
            mine = True  # unset: the engine's default, the overlap scheduler on
        assert mine == value, f"{key}: engine {value!r}, specc {mine!r}"


def test_engine_words_reach_the_user():
    """Where a rule quotes the engine's refusal, the recorded message contains those words."""
    pairs = {"sgl_pp2_eagle3": "only supports EAGLE (non-multi-layer)",
             "sgl_pp2_eagle_pp_spec_prefill": "SGLANG_ENABLE_PP_SPEC",
             "sgl_decode_radix_standalone": "incompatible with speculative decoding",
             "vllm_tp4_draft_tp2": "draft_tensor_parallel_size"}
    for case_id, words in pairs.items():
        case, rec, engine = _case(case_id)
        assert words in rec["error"], rec["error"]
        _, violations = resolve(plan_from_dict(_plan(case, engine), validate=False), engine,
                                flags=case.get("env") or None)
        rule = next(v for v in violations if v.rule == case["rule"])
        assert words in rule.message, rule.message
