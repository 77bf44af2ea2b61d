"""A third engine is one package: ``tests/plugins/toy_engine`` (a module plus a ``*.dist-info`` whose
``entry_points.txt`` names it in the ``specc.engines`` group) adds ``toyserve`` with no edit in specc.
Plans may name it, ``specc check --engine toyserve`` runs its rule table (its fallback applied, its
error refused), ``--engine all`` includes it, ``specc export --engine toyserve`` prints its launch and
``specc import toyserve`` reads one back through the plugin's own flag table, ``specc explain --engine
toyserve`` explains a plan as it runs it; without the package the name is refused as unknown."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "plugins" / "toy_engine"


def _cli(*args, toy=True):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(([str(TOY)] if toy else []) + [str(ROOT)])
    return subprocess.run([sys.executable, "-m", "specc.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_check_runs_the_plugin_engines_rules():
    r = _cli("check", "smollm2_ngram", "method.num_steps=7", "--engine", "toyserve", "--format", "json")
    assert r.returncode == 0, r.stderr
    (obj,) = json.loads(r.stdout)
    assert obj["engine"] == "toyserve==1.0"
    (t2,) = [v for v in obj["violations"] if v["rule"] == "toyserve.T2"]
    assert "caps method.num_steps at 4" in t2["message"]
    bad = _cli("check", "smollm2_eagle3", "--engine", "toyserve", "--format", "json")
    assert bad.returncode == 1
    assert any(v["rule"] == "toyserve.T1" and v["severity"] == "error" for v in json.loads(bad.stdout)[0]["violations"])


def test_explain_takes_the_plugin_engine():
    """``specc explain --engine toyserve`` explains the plan as the plugin engine runs it (its fallback
    applied); an unknown engine is refused before the plan loads, naming the known ones."""
    r = _cli("explain", "smollm2_ngram", "method.num_steps=7", "--engine", "toyserve")
    assert r.returncode == 0, r.stderr
    assert "as toyserve runs it" in r.stdout and "[toyserve.T2] toyserve caps method.num_steps at 4" in r.stdout
    bad = _cli("explain", "smollm2_ngram", "--engine", "toyserve", toy=False)
    assert bad.returncode == 2 and "--engine toyserve: unknown engine" in bad.stderr and "Traceback" not in bad.stderr


def test_engine_all_and_plan_engine_key_include_it():
    r = _cli("check", "smollm2_ngram", "--engine", "all", "--format", "json")
    engines = [obj["engine"] for obj in json.loads(r.stdout)]
    assert "toyserve==1.0" in engines and "sglang==0.5.23" in engines
    r = _cli("check", "smollm2_ngram", "engine=toyserve", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["engine"] == "toyserve==1.0"


def test_export_uses_the_plugin_exporter():
    r = _cli("export", "smollm2_ngram", "method.num_steps=3", "--engine", "toyserve")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("toyserve --model ") and "--lookahead 3" in r.stdout
    refused = _cli("export", "smollm2_eagle3", "--engine", "toyserve")
    assert refused.returncode == 1 and "toyserve" in refused.stderr


def test_without_the_package_the_name_is_unknown():
    r = _cli("check", "smollm2_ngram", "--engine", "toyserve", toy=False)
    assert r.returncode == 2 and "unknown engine 'toyserve'" in r.stdout and "sglang==0.5.23" in r.stdout
    r = _cli("export", "smollm2_ngram", "--engine", "toyserve", toy=False)
    assert r.returncode == 2 and "plans export to sglang, vllm" in r.stderr


def test_import_reads_the_plugin_engines_launch_command(tmp_path):
    out = tmp_path / "toy.yaml"
    r = _cli("import", "toyserve", "-o", str(out), "--", "env", "A=1", "toyserve", "--model", "/m/x.gguf",
             "--lookahead", "3", "--port", "9001")
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "path: /m/x.gguf" in text and "num_steps: 3" in text and "name: ngram" in text
    assert "--port" in text  # a flag without a plan key is listed at the top of the plan
    assert "`specc check` reads launch commands of sglang and vllm only" in text  # no --toyserve-args to name
    # the round trip: the imported plan exports to the same launch line
    back = _cli("export", str(out), "--engine", "toyserve")
    assert back.returncode == 0, back.stderr
    assert back.stdout.strip().splitlines()[-1] == "toyserve --model /m/x.gguf --lookahead 3"
    # its own parser's refusals: an unknown flag with a suggestion-free message, a bad count
    bad = _cli("import", "toyserve", "--", "toyserve", "--model", "m", "--lookahead", "0", "--colour", "red")
    assert bad.returncode == 1
    assert "--lookahead" in bad.stderr + bad.stdout and "--colour" in bad.stderr + bad.stdout
    other = tmp_path / "launch.sh"
    other.write_text("python -m sglang.launch_server --model-path m\n")
    none = _cli("import", "toyserve", "--file", str(other))
    assert none.returncode == 2 and "no toyserve launch command found (looked for: toyserve)" in none.stderr


def test_import_of_the_plugin_engine_without_the_package():
    r = _cli("import", "toyserve", "--", "toyserve", "--model", "m", toy=False)
    assert r.returncode == 2 and "specc imports sglang or vllm launch commands" in r.stderr
