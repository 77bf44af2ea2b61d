"""`specc check` end to end: the shipped presets against every engine, output formats, exit codes
and file:line locations."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specc.cli import main

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted(p.stem for p in (REPO / "conf" / "plan").glob("*.yaml"))
SPECC_PRESETS = ["smollm2_draft_model", "smollm2_eagle", "smollm2_eagle3", "smollm2_ngram", "smollm2_plain"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["specc"])


def _run(capsys, *args):
    rc = main(["check", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def all_presets_json():
    """`specc check conf/plan/ --engine all --format json` through the installed console script."""
    exe = shutil.which("specc")
    cmd = [exe] if exe else [sys.executable, "-m", "specc.cli"]
    proc = subprocess.run(cmd + ["check", "conf/plan/", "--engine", "all", "--format", "json", "--show-resolved"],
                          capture_output=True, text=True, cwd=REPO)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _own_engine(objs):
    """preset -> its resolved plan under its own engine (the plan's `engine` key)."""
    out = {}
    for o in objs:
        if o["resolved"]["engine"] == o["engine"].split("==")[0]:
            out[Path(o["plan"]).stem] = o
    return out


def test_presets_cover_every_method_and_scenario(all_presets_json):
    methods = {"none", "ngram", "draft_model", "eagle", "eagle3", "mtp", "frozen_kv_mtp", "multi_layer_eagle",
               "medusa", "suffix", "dflash", "dspark", "custom"}
    own = _own_engine(all_presets_json[1])
    assert sorted(own) == PRESETS
    seen = {o["resolved"]["method"]["name"] for o in own.values()}
    assert methods <= seen, methods - seen
    for name in ("sglang_eagle3_adaptive", "sglang_eagle_tree", "sglang_dflash", "sglang_dspark_budget", "vllm_pard",
                 "vllm_p_eagle", "vllm_medusa", "sglang_mtp", "sglang_frozen_kv_mtp", "smollm2_ngram",
                 "sglang_lora_eagle3", "sglang_disagg_decode", "vllm_batch_buckets"):
        assert name in PRESETS
    for p in PRESETS:
        assert (REPO / "conf" / "plan" / f"{p}.yaml").read_text().startswith("# "), f"{p} lacks its comment"


def test_all_presets_against_all_engines(all_presets_json):
    rc, objs, err = all_presets_json
    assert err == ""
    assert rc == 1  # cross-engine errors exist (a tree plan on vLLM, ...)
    assert len(objs) == 3 * len(PRESETS)
    by = {(Path(o["plan"]).stem, o["engine"].split("==")[0]): o for o in objs}
    for o in objs:
        assert set(o) >= {"plan", "engine", "violations"}
        for v in o["violations"]:
            assert set(v) >= {"rule", "severity", "keys", "message", "source"}
            assert v["severity"] in ("error", "warning", "fallback", "filled", "undecided")
            assert v["source"].startswith(o["engine"] if not v["rule"].startswith("checkpoint.") else "specc==")
            assert (REPO / v["location"]["file"]).is_file()

    def errors(plan, engine):
        return sorted(v["rule"] for v in by[(plan, engine)]["violations"] if v["severity"] == "error")

    # Each preset is valid for its own engine; Medusa is the one method no pinned engine runs.
    own = _own_engine(objs)
    for p in PRESETS:
        eng = own[p]["engine"].split("==")[0]
        assert errors(p, eng) == (["vllm.M1"] if p == "vllm_medusa" else []), (p, errors(p, eng))
    for p in SPECC_PRESETS:
        assert errors(p, "specc") == []
    # Cross-engine outcomes worked out from the engines' rules (the file:line each rule cites):
    assert errors("sglang_eagle_tree", "vllm") == ["vllm.T1"]          # no tree speculation in vLLM 0.33
    assert errors("sglang_eagle_tree", "specc") == []                  # specc runs EAGLE trees
    assert errors("sglang_eagle3_adaptive", "vllm") == ["vllm.A1"]     # no κ controller
    assert errors("sglang_eagle3_adaptive", "specc") == []              # specc runs SGLang's controller
    assert errors("vllm_batch_buckets", "sglang") == ["sglang.BB1"]    # no per-batch static κ in SGLang
    # PARD leaves topk unset with num_steps set: SGLang's `topk > 1` comparison raises a TypeError (EG21T)
    assert errors("vllm_pard", "sglang") == ["sglang.EG21T", "sglang.PAR1"]
    assert errors("vllm_suffix", "sglang") == ["sglang.N5"]
    assert errors("sglang_frozen_kv_mtp", "vllm") == ["vllm.M1"]
    assert errors("sglang_lora_eagle3", "specc") == []                 # specc serve runs LoRA + EAGLE-3
    assert errors("sglang_disagg_decode", "specc") == []               # and the decode role
    # SGLang fills max_running_requests = 48 for EAGLE-family plans (EG3), and says so:
    eg3 = [v for v in by[("smollm2_eagle3", "sglang")]["violations"] if v["rule"] == "sglang.EG3"]
    assert eg3 and eg3[0]["severity"] == "filled" and eg3[0]["sets"] == {"deploy.max_running_requests": 48}


def test_text_output_points_to_the_yaml_line(capsys):
    rc, out, _ = _run(capsys, "smollm2_eagle3", "method=p_eagle")
    assert rc == 1
    lines = (REPO / "conf/method/p_eagle.yaml").read_text().splitlines()
    par_line = next(i for i, ln in enumerate(lines, 1) if ln.startswith("parallel_drafting:"))
    assert f"conf/method/p_eagle.yaml:{par_line}: error: [specc.S-PARALLEL-MASK] method.parallel_drafting" in out
    assert "source: specc==0.1.0" in out
    assert out.rstrip().splitlines()[-1].startswith("checked 1 plan: 1 error,")


def test_exit_codes(capsys, tmp_path):
    assert _run(capsys, "smollm2_eagle3")[0] == 0
    rc, out, _ = _run(capsys, "smollm2_ngram", "--engine", "sglang")  # warnings and filled values only
    assert rc == 0 and "warning: [sglang.NGW]" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmethod:\n  nmae: eagle3\n")
    rc, out, _ = _run(capsys, str(bad), "smollm2_eagle3", "method.num_steps=2")
    assert rc == 2  # unusable input wins, but the other plan is still checked
    assert f"{bad}:3: method.nmae: unknown key; did you mean 'method.name'?" in out
    assert "conf/plan/smollm2_eagle3.yaml (smollm2_eagle3) against specc==0.1.0" in out
    assert _run(capsys, str(tmp_path / "missing.yaml"))[0] == 2
    assert _run(capsys, str(tmp_path / "*.nothing"))[0] == 2


def test_globs_and_directories(capsys, tmp_path):
    for name, steps in (("a", 3), ("b", 2)):
        (tmp_path / f"{name}.yaml").write_text(
            f"defaults:\n  - target: smollm2_135m\n  - _self_\nname: {name}\nmethod:\n  name: ngram\n"
            f"  num_steps: {steps}\n")
    rc, out, _ = _run(capsys, str(tmp_path / "*.yaml"), "--format", "json")
    objs = json.loads(out)
    assert rc == 0 and [o["name"] for o in objs] == ["a", "b"]
    rc, out, _ = _run(capsys, str(tmp_path), "--format", "json")
    assert [o["name"] for o in json.loads(out)] == ["a", "b"]


def test_github_annotations(capsys):
    rc, out, _ = _run(capsys, "smollm2_eagle3", "method=p_eagle", "--format", "github")
    assert rc == 1
    first = next(ln for ln in out.splitlines() if ln.startswith("::error"))
    assert first.startswith("::error file=conf/method/p_eagle.yaml,line=")
    assert "title=specc.S-PARALLEL-MASK (specc==0.1.0)::method.parallel_drafting" in first


def test_sarif(capsys):
    rc, out, _ = _run(capsys, "smollm2_eagle3", "method=p_eagle", "--format", "sarif")
    doc = json.loads(out)
    assert doc["version"] == "2.1.0"
    (result,) = [r for r in doc["runs"][0]["results"] if r["ruleId"] == "specc.S-PARALLEL-MASK"]
    assert result["level"] == "error"
    loc = result["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "conf/method/p_eagle.yaml" and loc["region"]["startLine"] > 1
    assert "specc.S-PARALLEL-MASK" in {r["id"] for r in doc["runs"][0]["tool"]["driver"]["rules"]}


def test_show_resolved_marks_filled_and_overridden_values(capsys):
    rc, out, _ = _run(capsys, "smollm2_ngram", "--show-resolved")
    assert rc == 0
    assert "num_draft_tokens: 5  # filled by specc.S-WIDTH-FILL" in out
    rc, out, _ = _run(capsys, "smollm2_eagle3", "method.num_draft_tokens=7", "--engine", "sglang", "--show-resolved")
    assert "num_draft_tokens: 4  # fallback by sglang.EG20" in out
    assert "max_running_requests: 48  # filled by sglang.EG3" in out
    rc, out, _ = _run(capsys, "smollm2_ngram", "--format", "json", "--show-resolved")
    assert json.loads(out)[0]["resolved"]["method"]["num_draft_tokens"] == 5


def test_no_arguments_is_a_usage_error(capsys):
    assert _run(capsys)[0] == 2


@pytest.mark.parametrize("preset", ["smollm2_draft_model", "smollm2_eagle", "smollm2_eagle3", "smollm2_ngram",
                                    "sglang_eagle3_adaptive", "sglang_lora_eagle3", "sglang_disagg_decode",
                                    "sglang_mtp", "sglang_frozen_kv_mtp", "sglang_multi_layer_eagle",
                                    "vllm_batch_buckets", "vllm_p_eagle", "vllm_pard"])
def test_changing_num_steps_on_a_chain_preset_stays_valid(capsys, preset):
    for k in (1, 5):
        if preset == "sglang_eagle3_adaptive" and k == 1:
            continue
        if preset == "sglang_eagle3_adaptive":
            k = 5  # must be a bucket candidate
        rc, out, _ = _run(capsys, preset, f"method.num_steps={k}")
        assert rc == 0, out
        assert "S-WIDTH]" not in out and "ML4" not in out


def test_width_error_gives_the_override_that_unsets_it(capsys):
    rc, out, _ = _run(capsys, "smollm2_eagle3", "method.num_steps=5", "method.num_draft_tokens=4")
    assert rc == 1 and "[specc.S-WIDTH]" in out and "`method.num_draft_tokens=null`" in out
    rc, out, _ = _run(capsys, "smollm2_eagle3", "method.num_steps=5", "method.num_draft_tokens=null")
    assert rc == 0 and "method.num_draft_tokens = κ + 1 = 6" in out


@pytest.mark.parametrize("name", ["my-plan", "class", "3x"])
def test_a_name_compile_refuses_is_an_error(capsys, tmp_path, name):
    f = tmp_path / "p.yaml"
    f.write_text("defaults:\n  - /target: smollm2_135m\n  - /method: ngram\n  - _self_\n"
                 f"name: {json.dumps(name)}\nengine: specc\n")
    rc, out, _ = _run(capsys, str(f))
    assert rc == 1 and "[specc.S-NAME] name=" in out, out
    assert f"{f}:5: error" in out and "letters, digits and underscores" in out
    assert "specc codegen: artifact directory and module names" in out


@pytest.mark.parametrize("name", ["my plan", "a'b", "two\nlines", "plän", "../../etc/passwd", ".hidden", "n" * 129])
def test_a_name_unsafe_as_a_file_name_is_unusable_input(capsys, tmp_path, name):
    # names are file and directory names whatever the engine: refused while the plan loads (exit 2)
    f = tmp_path / "p.yaml"
    f.write_text("defaults:\n  - /target: smollm2_135m\n  - /method: ngram\n  - _self_\n"
                 f"name: {json.dumps(name)}\nengine: sglang\n")
    rc, out, _ = _run(capsys, str(f))
    assert rc == 2 and f"{f}:5: name: " in out, out
    assert ("characters, over the 128" in out) if len(name) > 100 else ("not safe as a file name" in out)


def test_identifier_name_passes_and_compile_agrees(capsys, tmp_path):
    from specc.compiler.codegen import check_identifier
    from specc.errors import PlanError
    from specc.engines.specc.rules import bad_name

    for name in ("my_plan", "_x1", "smollm2_eagle3"):
        assert not bad_name(name) and check_identifier(name) == name
    for name in ("my-plan", "my plan", "plän", "class", "3x", ""):
        assert bad_name(name)
        with pytest.raises(PlanError):
            check_identifier(name)
    rc, out, _ = _run(capsys, "smollm2_ngram", "name=my_plan")
    assert rc == 0 and "S-NAME" not in out


def test_verify_width_must_fit_max_model_len(capsys):
    # κ is bounded at load (method.num_steps <= 64), so a short context is what leaves no room
    rc, out, _ = _run(capsys, "smollm2_ngram", "method.num_steps=60", "target.max_model_len=60")
    assert rc == 1 and "[specc.S-MAXLEN] method.num_draft_tokens=61" in out and "target.max_model_len=60" in out
    rc, out, _ = _run(capsys, "smollm2_ngram", "method.num_steps=57", "target.max_model_len=60")
    assert rc == 0 and "S-MAXLEN" not in out


def test_machine_formats_keep_the_location_of_unusable_plans(capsys, tmp_path):
    f = tmp_path / "my plan.yaml"
    f.write_text("defaults:\n  - /target: smollm2_135m\n  - _self_\nname: p\nmethod: ngram\n")
    rc, out, _ = _run(capsys, str(f), "--format", "github")
    assert rc == 2 and out.startswith(f"::error file={f},line=5,title=unusable plan::")
    rc, out, _ = _run(capsys, str(f), "--format", "sarif")
    (res,) = json.loads(out)["runs"][0]["results"]
    loc = res["locations"][0]["physicalLocation"]
    assert loc["region"]["startLine"] == 5
    assert loc["artifactLocation"]["uri"] == f.as_uri() and "%20" in loc["artifactLocation"]["uri"]


def test_sarif_relative_uris_are_percent_encoded():
    from specc.commands.check import sarif_uri

    assert sarif_uri("plans/my plan#1.yaml") == "plans/my%20plan%231.yaml"
    assert sarif_uri("conf/method/eagle3.yaml") == "conf/method/eagle3.yaml"


def test_rule_sources_cite_files_not_issues():
    from specc.check import PROFILES

    for prof in PROFILES.values():
        for rule in prof.rules:
            assert "issue" not in rule.source, (prof.name, rule.id, rule.source)
    for rule in PROFILES["specc"].rules:  # specc's own sources name a file of this repository
        path = rule.source.split(" (")[0].split(":")[0].split()[0]
        if path == "specc" and "codegen" in rule.source:
            path = "specc/compiler/codegen.py"
        assert (REPO / path).exists(), (rule.id, rule.source)


SGL_CMD = ["python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"]


def _error_lines(out):
    return [ln for ln in out.splitlines() if ": error: [" in ln]


def test_a_misspelt_algorithm_is_reported_once_in_text(capsys):
    rc, out, _ = _run(capsys, "--sglang-args", *SGL_CMD, "--speculative-algorithm", "EAGEL3",
                      "--speculative-draft-model-path", "d")
    assert rc == 1
    (err,) = _error_lines(out)
    assert "EAGEL3: not a builtin sglang==0.5.23 algorithm; did you mean EAGLE3?" in err
    assert "[sglang.N11]" not in out and ": warning: [" not in out  # the plugin warning follows from the typo
    assert "keys: method.name, method.plugin; source:" in out
    assert "checked 1 plan: 1 error, 0 warnings," in out


def test_an_unknown_flag_with_a_value_is_reported_once_in_text(capsys):
    rc, out, _ = _run(capsys, "--sglang-args", *SGL_CMD, "--foo", "3")
    assert rc == 1
    (err,) = _error_lines(out)
    assert err.endswith("[sglang.argv] --foo 3: not a sglang==0.5.23 flag")
    assert "keys: ;" not in out and "keys: \n" not in out  # a violation without keys prints its source alone
    assert "      source: sglang==0.5.23 argparse (sglang serve)" in out.splitlines()
    assert "1 errors" not in out and "1 warnings" not in out


def test_summary_counts_agree_in_number(capsys):
    rc, out, _ = _run(capsys, "conf/plan/smollm2_ngram.yaml", "--engine", "specc")
    last = out.splitlines()[-1]
    assert last.startswith("checked 1 plan: ") and "1 plans" not in last
    for word in ("error", "warning", "fallback"):
        n = int(re.search(rf"(\d+) {word}", last).group(1))
        assert f"{n} {word}{'' if n == 1 else 's'}" in last, last


def test_rule_messages_write_counts_in_the_right_number(capsys):
    from specc.check.base import MESSAGE_FORMAT

    assert MESSAGE_FORMAT.format("{n:~token}, {m:~request}, {x:.2f}", n=1, m=4, x=0.5) == "1 token, 4 requests, 0.50"
    rc, out, _ = _run(capsys, "conf/plan/sglang_eagle_tree.yaml", "deploy.max_running_requests=1", "--engine", "all")
    assert "graphs up to 1 request (" in out and "batches up to 1 request (" in out, out
    assert not re.search(r"(?<![\d.,+] )(?<![\d.,])\b1 (tokens|requests|nodes|layers|levels|modules)\b", out), out
