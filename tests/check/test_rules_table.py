"""Every rule of every engine profile: a plan that triggers it (with the severity the engine's
source gives) and a nearby plan that does not; plus the table's own hygiene and resolved values."""
from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from specc.plan.load import plan_from_dict
from specc.plan.schema import Plan
from specc.check import PROFILES, check, resolve
from specc.check.base import SEVERITIES, get

from tests.rule_cases import CASES, S_E3, SGL_ADAPT, SGL_E3, build

def _plan(data):
    return plan_from_dict(data, validate=False)


ALL_RULES = {f"{name}.{r.id}": (name, r) for name, prof in PROFILES.items() for r in prof.rules}


def _schema_keys(cls=Plan, prefix=""):
    """Every dotted key of the schema (``method``, ``method.ngram``, ``method.ngram.min``, ...)."""
    out = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        out.add(key)
        t = hints[f.name]
        if typing.get_origin(t) is typing.Union:
            t = [a for a in typing.get_args(t) if a is not type(None)][0]
        if dataclasses.is_dataclass(t):
            out |= _schema_keys(t, key + ".")
    return out


SCHEMA_KEYS = _schema_keys()


#: rules no built-in method can trigger, each with the test that triggers it from a registered row instead
ROW_CASES = {"specc.S-RUNTIME": "tests/methods/test_method_plugin.py::test_specc_check_refuses_a_method_the_runtime_does_not_run"}


def test_every_rule_has_a_case_and_every_case_a_rule():
    covered = set(CASES) | set(ROW_CASES)
    assert covered == set(ALL_RULES), (sorted(set(ALL_RULES) - covered), sorted(covered - set(ALL_RULES)))
    assert not set(CASES) & set(ROW_CASES)


@pytest.mark.parametrize("rule_id", sorted(ALL_RULES))
def test_rule_table_entry_is_well_formed(rule_id):
    name, rule = ALL_RULES[rule_id]
    assert rule.outcome in SEVERITIES
    assert rule.keys and all(k in SCHEMA_KEYS for k in rule.keys), rule.keys
    assert (rule.sets is not None) == (rule.outcome in ("filled", "fallback"))
    if name != "specc":
        assert re.search(r"\.py:\d+", rule.source), rule.source
    ids = [r.id for r in PROFILES[name].rules]
    assert ids.count(rule.id) == 1


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_triggers_and_near_plan_does_not(rule_id):
    base, trigger, near, severity, *facts = CASES[rule_id]
    flags = facts[0] if facts else None
    engine = rule_id.split(".")[0]
    hit = check(_plan(build(base, trigger)), engine, flags)
    found = [v for v in hit if v.rule == rule_id]
    assert found, f"{rule_id} did not fire; got {[v.rule for v in hit]}"
    assert found[0].severity == severity
    assert any(k in found[0].message for k in SCHEMA_KEYS if "." in k) \
        or any(found[0].message.startswith(f"{k}=") for k in SCHEMA_KEYS), "message names no plan key"
    assert not any(v.rule.endswith(".internal") for v in hit)
    miss = check(_plan(build(base, trigger, near)), engine, flags)
    assert rule_id not in [v.rule for v in miss], f"{rule_id} fired on the near plan"


def test_messages_cite_engine_version_and_keys():
    plan = _plan(build(SGL_E3, {"method.topk": 4, "method.num_steps": 5, "method.num_draft_tokens": 8,
                                          "verify.rule": "standard", "verify.draft_sampling": "probabilistic"}))
    (v,) = [v for v in check(plan, "sglang") if v.rule == "sglang.EG16"]
    assert v.source == "sglang==0.5.23 sglang/srt/arg_groups/speculative_hook.py:1221-1224"
    assert "method.topk" in v.message and "topk 1" in v.message
    assert v.keys == ("verify.rule", "verify.draft_sampling", "method.topk")


def test_eg12_auto_values_follow_the_target_architecture():
    # speculative_hook.py:1430-1461: Llama -> (5, 4, 8); STANDALONE -> (3, 1, 4)
    unset = {"method.num_steps": None, "method.topk": None, "method.num_draft_tokens": None}
    resolved, _ = resolve(_plan(build(SGL_E3, unset)), "sglang")
    assert (resolved.method.num_steps, resolved.method.topk, resolved.method.num_draft_tokens) == (5, 4, 8)
    resolved, _ = resolve(_plan(build(SGL_E3, unset, {"method.name": "draft_model"})), "sglang")
    assert (resolved.method.num_steps, resolved.method.topk, resolved.method.num_draft_tokens) == (3, 1, 4)
    resolved, _ = resolve(_plan(build(SGL_E3, unset, {"target.architecture": "Qwen3ForCausalLM"})), "sglang")
    assert (resolved.method.num_steps, resolved.method.topk, resolved.method.num_draft_tokens) == (3, 1, 4)


def test_adaptive_defaults_are_sglangs():
    # adaptive_spec_params.py:28-53 and speculative_hook.py:1409-1427: union [0,1,3,5,7] -> start at 3
    plan = _plan(build(SGL_ADAPT, {"schedule.buckets": {}, "method.num_steps": None, "method.topk": None,
                                            "method.num_draft_tokens": None}))
    resolved, vs = resolve(plan, "sglang")
    assert {b: list(c.candidates) for b, c in resolved.schedule.buckets.items()} == \
        {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
    assert resolved.schedule.buckets[1].down_hysteresis == -0.25
    assert (resolved.method.num_steps, resolved.method.topk, resolved.method.num_draft_tokens) == (3, 1, 4)
    assert [v.rule for v in vs if v.severity == "error"] == []


def test_fallback_stops_later_rules_from_seeing_the_old_value():
    # AD1 turns adaptive off for draft_model, so AD8-AD11 (which need adaptive) must not fire.
    plan = _plan(build(SGL_ADAPT, {"method.name": "draft_model", "method.num_steps": 4}))
    rules = [v.rule for v in check(plan, "sglang")]
    assert "sglang.AD1" in rules and "sglang.AD10" not in rules


def test_resolve_does_not_modify_the_input_plan():
    plan = _plan(build(S_E3, {"method.num_draft_tokens": None}))
    resolved, _ = resolve(plan, "specc")
    assert plan.method.num_draft_tokens is None and resolved.method.num_draft_tokens == 4
    assert get(resolved, "method.num_draft_tokens") == 4


def test_all_violations_are_reported_at_once():
    plan = _plan(build(S_E3, {"method.topk": 2, "method.num_draft_tokens": 12, "verify.rule": "block",
                              "schedule.kind": "budget", "deploy.lora.adapters": ["a=/x"]}))
    errors = {v.rule for v in check(plan, "specc") if v.severity == "error"}
    assert {"specc.S-TREE-POOL", "specc.S-VERIFY", "specc.S-BUDGET-TABLE", "specc.S-LORA"} <= errors


def test_unknown_engine_is_a_key_error():
    with pytest.raises(KeyError):
        check(Plan(), "trtllm")
    assert check(Plan(engine="vllm"), "vllm==0.33.0") == check(Plan(engine="vllm"), "vllm")
