"""CI integrations: SARIF output validated against the SARIF 2.1.0 JSON schema (shipped in
tests/schemas/, from the OASIS sarif-spec repository), the pre-commit hooks of .pre-commit-hooks.yaml
and the composite action's script (scripts/specc-action) run locally as pre-commit and GitHub would."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "tests" / "schemas" / "sarif-schema-2.1.0.json").read_text())
BIN = Path(sys.executable).parent
FIX = REPO / "tests" / "fixtures" / "launch"


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _specc(*args, cwd=REPO):
    exe = shutil.which("specc", path=str(BIN)) or shutil.which("specc")
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, env=_env())


def _validate(doc):
    jsonschema.Draft7Validator(SCHEMA).validate(doc)


def test_schema_is_the_sarif_2_1_0_schema():
    assert SCHEMA["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    with pytest.raises(jsonschema.ValidationError):  # the validator is not vacuous
        _validate({"version": "2.1.0", "runs": [{"tool": {"driver": {}}}]})


@pytest.mark.parametrize("args", [
    ["conf/plan/", "--engine", "all"],                               # errors, warnings, fallbacks, undecided
    ["smollm2_eagle3", "method=p_eagle"],
    ["--sglang-args", str(FIX / "sglang_eagle3.sh")],                # a launch command with a parser error
    ["--vllm-args", "vllm", "serve", "m", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'],
])
def test_sarif_output_is_valid_sarif_2_1_0(args, tmp_path):
    r = _specc("check", "--format", "sarif", *args)  # --sglang-args takes the rest of the line
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    _validate(doc)
    assert doc["runs"][0]["results"]


def test_sarif_for_an_unusable_plan_is_valid(tmp_path):
    bad = tmp_path / "bad plan.yaml"
    bad.write_text("name: bad\nmethod:\n  nmae: eagle3\n")
    r = _specc("check", str(bad), "--format", "sarif")
    assert r.returncode == 2
    _validate(json.loads(r.stdout))


def test_pre_commit_hooks_run_as_pre_commit_would(tmp_path):
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"specc-check", "specc-check-sglang-launch", "specc-check-vllm-launch"}
    for h in hooks.values():
        assert {"id", "name", "entry", "language", "files"} <= set(h) and h["language"] == "python"
    # plans: pre-commit passes the staged files matching `files` to `entry`
    plans = [p for p in ("conf/plan/smollm2_eagle3.yaml", "conf/plan/smollm2_ngram.yaml", "README.md")
             if re.search(hooks["specc-check"]["files"], p)]
    assert plans == ["conf/plan/smollm2_eagle3.yaml", "conf/plan/smollm2_ngram.yaml"]
    r = subprocess.run(hooks["specc-check"]["entry"].split() + plans, capture_output=True, text=True, cwd=REPO,
                       env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "plans" / "tree.yaml"
    bad.parent.mkdir()
    bad.write_text("defaults:\n  - /target: smollm2_135m\n  - /method: ngram\n  - _self_\nname: tree\n"
                   "engine: specc\nmethod:\n  topk: 2\n")
    r = subprocess.run(hooks["specc-check"]["entry"].split() + [str(bad)], capture_output=True, text=True,
                       cwd=REPO, env=_env())
    assert r.returncode == 1 and "specc.S-TREE" in r.stdout
    # launch scripts
    good = tmp_path / "serve.sglang.sh"
    good.write_text((FIX / "sglang_adaptive.sh").read_text())
    broken = tmp_path / "docs.sglang.sh"
    broken.write_text((FIX / "sglang_eagle3.sh").read_text())
    entry = hooks["specc-check-sglang-launch"]["entry"].split()
    assert re.search(hooks["specc-check-sglang-launch"]["files"], good.name)
    r = subprocess.run(entry + [str(good)], capture_output=True, text=True, cwd=REPO, env=_env())
    assert r.returncode == 0, r.stdout
    r = subprocess.run(entry + [str(good), str(broken)], capture_output=True, text=True, cwd=REPO, env=_env())
    assert r.returncode == 1 and "--cuda-graph-max-bs: ambiguous prefix" in r.stdout


def test_action_script_annotates_and_writes_sarif(tmp_path):
    action = yaml.safe_load((REPO / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    assert any("specc-action" in s.get("run", "") for s in steps)
    assert any(s.get("uses", "").startswith("github/codeql-action/upload-sarif") for s in steps)
    out = tmp_path / "gh_output"
    env = _env()
    env.update({"SPECC_PLANS": "conf/plan/smollm2_eagle3.yaml conf/plan/sglang_eagle_tree.yaml",
                "SPECC_ENGINE": "vllm", "SPECC_SARIF": str(tmp_path / "r.sarif"), "GITHUB_OUTPUT": str(out),
                "SPECC_SGLANG_ARGS_FILE": str(FIX / "sglang_eagle3.sh")})
    env.pop("SPECC_ENGINE")
    r = subprocess.run(["bash", str(REPO / "scripts" / "specc-action")], capture_output=True, text=True, cwd=REPO,
                       env=env)
    assert r.returncode == 1, r.stderr
    assert "::error file=" in r.stdout and "::error file=tests/fixtures/launch/sglang_eagle3.sh" not in r.stderr
    assert "title=sglang.argv" in r.stdout
    _validate(json.loads((tmp_path / "r.sarif").read_text()))
    _validate(json.loads((tmp_path / "r.sglang.sarif").read_text()))
    assert out.read_text().strip() == f"sarif-file={tmp_path / 'r.sarif'}"
    env["SPECC_PLANS"] = "conf/plan/smollm2_eagle3.yaml"
    env.pop("SPECC_SGLANG_ARGS_FILE")
    r = subprocess.run(["bash", str(REPO / "scripts" / "specc-action")], capture_output=True, text=True, cwd=REPO,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
