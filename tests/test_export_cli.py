"""`specc export` prints launch settings only for plans the engine accepts."""
import json
import subprocess
import sys


def _export(*argv):
    return subprocess.run([sys.executable, "-m", "specc.cli", "export", *argv],
                          capture_output=True, text=True)


def test_sglang_adaptive_plan_exports_launch_and_config():
    r = _export("conf/plan/sglang_eagle3_adaptive.yaml")
    assert r.returncode == 0, r.stderr
    assert "--speculative-algorithm EAGLE3" in r.stdout
    assert "--speculative-adaptive" in r.stdout
    assert '"candidate_steps"' in r.stdout


def test_vllm_json_has_speculative_config():
    r = _export("conf/plan/vllm_pard.yaml", "--format", "json")
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)["speculative_config"]
    assert cfg["method"] == "draft_model" and cfg["parallel_drafting"] is True


def test_plan_with_engine_errors_is_refused():
    r = _export("conf/plan/sglang_eagle_tree.yaml", "--engine", "vllm")
    assert r.returncode == 1
    assert "has errors for vllm" in r.stderr


def test_specc_plan_needs_an_engine():
    r = _export("smollm2_ngram")
    assert r.returncode == 2 and "--engine sglang" in r.stderr
