"""`specc import`: launch commands from SGLang's and vLLM's own docs read back into plans, the engines'
argparse behaviour (prefixes, ambiguity, did-you-mean), and export -> import round trips of every preset.

Expected settings are written from the commands themselves (and, for errors, from what SGLang 0.5.23's
real parser answered: `--cuda-graph-max-bs` is ambiguous there, the n-gram window flags are gone)."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specc.export import export, resolve_pkg_paths
from specc.importer import import_command, imported_plan, plan_yaml
from specc.plan.load import list_presets, load_plan
from specc.check import check

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "launch"
AMBIG = "--cuda-graph-max-bs: ambiguous prefix for sglang==0.5.23"


def _imp(engine, name):
    return import_command(engine, text=(FIX / name).read_text(), base_dir=FIX)


def _m(imp):
    return imported_plan(imp, "doc")


# (fixture, engine, expected plan keys, expected parser errors (prefixes))
DOCS = [
    ("sglang_eagle3.sh", "sglang", {"method.name": "eagle3", "method.num_steps": 3, "method.topk": 4,
                                    "method.num_draft_tokens": 16, "target.dtype": "float16",
                                    "draft.path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"}, [AMBIG]),
    ("sglang_eagle2_tree.sh", "sglang", {"method.name": "eagle", "method.topk": 4, "method.num_draft_tokens": 16,
                                         "target.path": "meta-llama/Llama-2-7b-chat-hf"}, [AMBIG]),
    ("sglang_mtp.sh", "sglang", {"method.name": "eagle", "method.num_steps": 1, "method.topk": 1,
                                 "method.num_draft_tokens": 2, "target.path": "XiaomiMiMo/MiMo-7B-RL"}, [AMBIG]),
    ("sglang_standalone.sh", "sglang", {"method.name": "draft_model", "method.num_steps": 4, "method.topk": 2,
                                        "draft.path": "Qwen/Qwen2.5-1.5B-Instruct"}, [AMBIG]),
    ("sglang_ngram.sh", "sglang", {"method.name": "ngram", "method.num_draft_tokens": 16, "method.topk": 10},
     ["--speculative-ngram-max-match-window-size 12: not a sglang==0.5.23 flag", AMBIG]),
    ("sglang_adaptive.sh", "sglang", {"method.name": "eagle", "schedule.kind": "adaptive", "method.num_steps": 3,
                                      "method.topk": 1}, []),
    ("vllm_dflash.sh", "vllm", {"method.name": "dflash", "method.num_steps": 16,
                                "draft.path": "your-username/Qwen3-8B-Domino-b16", "target.path": "Qwen/Qwen3-8B"}, []),
    ("vllm_mtp.sh", "vllm", {"method.name": "mtp", "method.num_steps": 1, "deploy.parallel.tp": 1}, []),
    ("vllm_draft_model.sh", "vllm", {"method.name": "draft_model", "method.num_steps": 5, "draft.path": "Qwen/Qwen3-0.6B",
                                     "target.max_model_len": 2048}, []),
    ("vllm_dynamic_k_eagle3.sh", "vllm", {"method.name": "eagle3", "method.num_steps": 5,
                                          "schedule.kind": "batch_buckets", "deploy.max_running_requests": 1024}, []),
]


def _get(plan, dotted):
    obj = plan
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("fixture,engine,expected,errors", DOCS, ids=[d[0] for d in DOCS])
def test_docs_commands_import_check_and_export_back(fixture, engine, expected, errors):
    assert (FIX / fixture).read_text().startswith("# Source: https://github.com/")
    imp = _imp(engine, fixture)
    plan = _m(imp)
    for key, value in expected.items():
        assert _get(plan, key) == value, (key, _get(plan, key))
    assert len(imp.errors) == len(errors), imp.errors
    for e, want in zip(sorted(imp.errors), sorted(errors)):
        assert e.startswith(want), (e, want)
    assert "internal" not in " ".join(v.rule for v in check(plan, engine))
    # the plan exports back to the same settings: importing the export gives the same plan
    launch = export(plan, engine)
    again = import_command(engine, text=launch.command())
    assert again.errors == []
    assert imported_plan(again, "doc") == plan, (again.plan, imp.plan)


def test_vllm_speculative_config_json_and_cli(tmp_path):
    imp = import_command("vllm", argv=["Qwen/Qwen3-8B", "--speculative-config", (FIX / "vllm_ngram.json").read_text()])
    plan = _m(imp)
    assert (plan.method.name, plan.method.num_steps, plan.method.ngram.max) == ("ngram", 5, 4)
    out = tmp_path / "ngram_plan.yaml"
    r = subprocess.run([sys.executable, "-m", "specc.cli", "import", "vllm", "--speculative-config",
                        (FIX / "vllm_ngram.json").read_text(), "--model", "Qwen/Qwen3-8B", "-o", str(out)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    loaded = load_plan(str(out)).plan
    assert loaded.name == "ngram_plan" and loaded.method.ngram.max == 4 and loaded.engine == "vllm"
    r = subprocess.run([sys.executable, "-m", "specc.cli", "import", "sglang", "--file", str(FIX / "sglang_eagle3.sh")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and AMBIG in r.stderr  # the plan is written, the refusal reported
    assert "  memory_fraction: 0.7\n" in r.stdout and "#   --log-level warning" in r.stdout
    assert "torch" not in r.stderr


def test_sglang_prefixes_and_did_you_mean():
    imp = import_command("sglang", argv=["--model", "m", "--speculative-algo", "EAGLE3", "--speculative-num-stepz", "3"])
    assert imp.plan["target"]["path"] == "m" and imp.plan["method"]["name"] == "eagle3"  # unambiguous prefix accepted
    # one error for the unknown flag and the value written after it
    assert imp.errors == ["--speculative-num-stepz 3: not a sglang==0.5.23 flag; did you mean --speculative-num-steps or "
                          "--speculative-num-draft-tokens or --speculative-token-map?"]
    imp = import_command("sglang", argv=["--model-path", "m", "--speculative-a", "EAGLE"])
    assert imp.errors[0].startswith("--speculative-a: ambiguous prefix for sglang==0.5.23: could be "
                                    "--speculative-algorithm, --speculative-accept-threshold-single")


def test_vllm_parser_quirks():
    imp = import_command("vllm", argv=["--model", "m", "--max_model_len", "8k", "-tp", "2",
                                       "--speculative_config.method", "ngram",
                                       "--speculative-config.num_speculative_tokens", "3",
                                       "--spec-model", "x"])
    assert imp.plan["target"] == {"path": "m", "max_model_len": 8000}
    assert imp.plan["deploy"]["parallel"]["tp"] == 2
    assert imp.plan["method"] == {"name": "ngram", "num_steps": 3}
    imp = import_command("vllm", argv=["m", "--speculative-config", '{"method": "eagle3", "model": "d", '
                                       '"num_speculative_tokens": 2, "adaptive_verification": true}'])
    assert any("'adaptive_verification' is not a vllm==0.33.0 SpeculativeConfig field" in e and
               "enable_adaptive_verification" in e for e in imp.errors)
    imp = import_command("vllm", argv=["m", "--spec-method", "ngram", "--speculative-config", '{"method": "ngram"}'])
    assert any("mutually exclusive" in e for e in imp.errors)


def test_commands_in_scripts_and_manifests(tmp_path):
    k8s = tmp_path / "deploy.yaml"
    k8s.write_text("apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n"
                   "      - name: sglang\n        command: [python3, -m, sglang.launch_server]\n"
                   "        args: [--model-path, Qwen/Qwen3-8B, --speculative-algorithm, NGRAM, --tp-size, '2']\n")
    imp = import_command("sglang", text=k8s.read_text())
    assert imp.plan["method"]["name"] == "ngram" and imp.plan["deploy"]["parallel"]["tp"] == 2
    script = "#!/bin/sh\nset -e\nexport X=1\nSGLANG_RAGGED_VERIFY_MODE=compact python -m sglang.launch_server " \
             "--model-path q --speculative-algorithm DSPARK --speculative-draft-model-path d && echo done\n"
    imp = import_command("sglang", text=script)
    assert imp.plan["schedule"] == {"ragged_verify": "compact", "kind": "budget"}


def _preset_engines():
    out = []
    for name in sorted(list_presets()):
        for engine in ("sglang", "vllm"):
            plan = load_plan(name).plan
            if any(v.severity == "error" and not v.rule.startswith("checkpoint.") for v in check(plan, engine)):
                continue
            out.append((name, engine))
    return out


def _dense_k(ranges, max_seqs):
    """vLLM's dynamic-K lookup over 1..max_num_seqs: the range holding bs, else the previous K carried
    forward (v1/spec_decode/dynamic/utils.py:77-148)."""
    out, last = {}, None
    for bs in range(1, max_seqs + 1):
        hit = [k for s, e, k in ranges if s <= bs <= e]
        last = hit[0] if hit else last
        out[bs] = last
    return out


@pytest.mark.parametrize("preset,engine", _preset_engines())
def test_every_preset_round_trips_export_import(preset, engine, tmp_path):
    plan, _ = resolve_pkg_paths(load_plan(preset).plan)
    launch = export(plan, engine)
    cfg = getattr(launch, "adaptive_config", None)
    if cfg:
        (tmp_path / launch.adaptive_config_path).write_text(json.dumps(cfg))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in getattr(launch, "env", {}).items())
    imp = import_command(engine, text=f"{env} {launch.command()}", base_dir=tmp_path)
    assert imp.errors == [] and imp.unmapped == [], (imp.errors, imp.unmapped)
    back = export(imported_plan(imp, preset), engine)
    assert back.command() == launch.command()
    if engine == "vllm" and plan.schedule.kind == "batch_buckets":
        # the exported command runs the plan's schedule: K per batch size up to the largest batch
        sc = launch.speculative_config
        args = launch.args
        max_seqs = int(args[args.index("--max-num-seqs") + 1])
        starts = sorted(plan.schedule.buckets)
        want = {bs: plan.schedule.buckets[max(s for s in starts if s <= bs)].candidates[0]
                for bs in range(1, max_seqs + 1)}
        assert _dense_k(sc["num_speculative_tokens_per_batch_size"], max_seqs) == want
        assert max_seqs == max(plan.runtime.max_batch_size, starts[-1])


def test_plan_yaml_lists_flags_without_plan_keys():
    imp = import_command("sglang", argv=["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--port", "8000",
                                         "--enable-dp-lm-head"])
    text = plan_yaml(imp, "p")
    assert "#   --port 8000\n" in text and "#   --enable-dp-lm-head\n" in text
    assert "name: p\nengine: sglang\n" in text
