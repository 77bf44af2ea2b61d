"""The deployment keys (``deploy.structured_output``, ``deploy.reasoning_parser``, draft parallel sizes,
``deploy.cuda_graph_max_bs`` / ``cuda_graph_batch_sizes``, ``deploy.memory_fraction``,
``deploy.prefix_caching``): composed from ``conf/deploy/`` sub-groups like every other group, refused
with the key, the value and a fix when wrong (type, range, unknown name with "did you mean"), resolved
and reported by ``--show-resolved``, and carried through export and import for both engines."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specc.errors import PlanError
from specc.export import export
from specc.importer import import_command, imported_plan
from specc.plan.load import load_plan, plan_from_dict
from specc.check import check, resolve

REPO = Path(__file__).resolve().parents[2]

PLAN = """\
defaults:
  - /target: llama31_8b
  - /draft: llama31_8b_eagle3
  - /method: eagle3
  - /runtime: cuda
  - /deploy: single
  - /deploy/parallel: tp4
  - /deploy/structured_output: json
  - /deploy/cuda_graph: bs64
  - _self_
name: deploy_plan
engine: sglang
"""


@pytest.fixture
def plan_file(tmp_path):
    f = tmp_path / "deploy_plan.yaml"
    f.write_text(PLAN)
    return f


def test_sub_groups_compose_and_later_groups_win(plan_file):
    lp = load_plan(str(plan_file), ["+deploy/memory=frac85", "+deploy/prefix_cache=off", "deploy/parallel=tp8",
                                    "+deploy/reasoning=qwen3"])
    d = lp.plan.deploy
    assert (d.parallel.tp, d.structured_output.requests, d.cuda_graph_max_bs, d.memory_fraction, d.prefix_caching,
            d.reasoning_parser) == (8, True, 64, 0.85, False, "qwen3")
    # /deploy: single sets parallel too; the sub-group listed after it wins, and sources say so
    assert lp.where("deploy.parallel.tp")[0].endswith("conf/deploy/parallel/tp8.yaml")
    assert lp.where("deploy.memory_fraction")[0].endswith("conf/deploy/memory/frac85.yaml")


BAD = [
    # wrong type
    ("deploy.memory_fraction=high", "deploy.memory_fraction: wrong type"),
    ("deploy.structured_output.requests=maybe", "deploy.structured_output.requests: wrong type"),
    ("deploy.cuda_graph_max_bs=1.5", "deploy.cuda_graph_max_bs: wrong type"),
    ("deploy.parallel.draft_tp=two", "deploy.parallel.draft_tp: wrong type"),
    ("deploy.prefix_caching=sometimes", "deploy.prefix_caching: wrong type"),
    ("deploy.cuda_graph_batch_sizes=8", "deploy.cuda_graph_batch_sizes: wrong type: expected a list"),
    # out of range
    ("deploy.memory_fraction=1.5", "deploy.memory_fraction: 1.5 is out of range; must be in (0, 1]"),
    ("deploy.memory_fraction=0", "deploy.memory_fraction: 0.0 is out of range"),
    ("deploy.cuda_graph_max_bs=0", "deploy.cuda_graph_max_bs: 0 is out of range; must be in [1, 65536]"),
    ("deploy.parallel.draft_tp=0", "deploy.parallel.draft_tp: 0 is out of range"),
    ("deploy.parallel.draft_pp=-1", "deploy.parallel.draft_pp: -1 is out of range"),
    ("deploy.parallel.draft_dp=0", "deploy.parallel.draft_dp: 0 is out of range"),
    ("deploy.cuda_graph_batch_sizes=[0,4]", "deploy.cuda_graph_batch_sizes: [0, 4]: batch sizes must be in [1, 65536]"),
    # unknown names, with a suggestion
    ("deploy.structured_output.backend=xgramar", "'xgramar' is not one of auto, xgrammar, guidance, llguidance, "
                                                 "outlines, lm-format-enforcer, none; did you mean 'xgrammar'?"),
    ("deploy.reasoning_parser=deepseek_r2", "'deepseek_r2' is not a reasoning parser of any engine profile; did you "
                                            "mean 'deepseek_r1'"),
    ("deploy.reasoning_parser=qwen", "did you mean 'qwen3'"),
    ("deploy.structured_outputs.backend=xgrammar", "unknown key; did you mean 'deploy.structured_output'?"),
    ("deploy.cuda_graph_max_batch=8", "unknown key; did you mean 'deploy.cuda_graph_max_bs'?"),
]


@pytest.mark.parametrize("override, words", BAD, ids=[b[0] for b in BAD])
def test_bad_values_name_the_key_and_the_fix(plan_file, override, words):
    with pytest.raises(PlanError) as err:
        load_plan(str(plan_file), [override])
    assert words in str(err.value), str(err.value)


ENGINE_NAMES = [
    # (engine, key, value, the engine's spelling suggested)
    ("sglang", "deploy.structured_output.backend", "guidance", "llguidance"),
    ("sglang", "deploy.structured_output.backend", "auto", None),
    ("vllm", "deploy.structured_output.backend", "llguidance", "guidance"),
    ("vllm", "deploy.structured_output.backend", "none", None),
    ("sglang", "deploy.reasoning_parser", "deepseek_r1", "deepseek-r1"),
    ("vllm", "deploy.reasoning_parser", "deepseek-r1", "deepseek_r1"),
    ("vllm", "deploy.reasoning_parser", "qwen3-thinking", "qwen3"),
]


@pytest.mark.parametrize("engine, key, value, hint", ENGINE_NAMES)
def test_a_name_the_other_engine_spells_is_refused_with_this_engines_spelling(engine, key, value, hint):
    lp = load_plan("sglang_eagle3_adaptive", [f"engine={engine}", f"{key}={value}", "schedule=static",
                                              "method.num_steps=3", "method.topk=1"])
    errs = [v for v in check(lp.plan, engine) if v.severity == "error" and key in v.keys]
    assert errs, [(v.rule, v.message) for v in check(lp.plan, engine)]
    msg = errs[0].message
    assert msg.startswith(f"{key}={value}") or f"{key}={value}" in msg
    if hint:
        assert f"did you mean '{hint}'" in msg, msg


def test_show_resolved_reports_every_deployment_key(plan_file):
    r = subprocess.run([sys.executable, "-m", "specc.cli", "check", str(plan_file), "--show-resolved"],
                       capture_output=True, text=True, cwd=REPO)
    out = r.stdout
    for line in ("memory_fraction: 0.835  # filled by sglang.MEM1", "backend: xgrammar  # filled by sglang.SO2",
                 "prefix_caching: true  # filled by sglang.PC1", "draft_tp: 4  # filled by sglang.DP0",
                 "cuda_graph_max_bs: 64", "requests: true", "reasoning_parser: null"):
        assert line in out, out
    r = subprocess.run([sys.executable, "-m", "specc.cli", "check", str(plan_file), "--show-resolved", "engine=vllm"],
                       capture_output=True, text=True, cwd=REPO)
    for line in ("memory_fraction: 0.92  # filled by vllm.MEM1", "backend: auto  # filled by vllm.SO2",
                 "draft_tp: 4  # filled by vllm.DTP0", "prefix_caching: true  # filled by vllm.PC1"):
        assert line in r.stdout, r.stdout


def test_sglang_fills_follow_the_gpu_memory_of_the_hardware_profile():
    """SGLang picks the decode graph batch and --mem-fraction-static from the GPU memory
    (memory_hook.py:99-188, 281-333): the H200's 143771 MiB and the H100's 81559 MiB give the values
    SGLang 0.5.23's own resolution gave (tests/fixtures/engine_verdicts/sglang-0.5.23.json)."""
    base = load_plan("sglang_eagle3_adaptive", ["schedule=static", "method.num_steps=3", "method.topk=1"]).plan
    for hw, tp, frac, max_bs in (("h200", 1, 0.907, 256), ("h100", 4, 0.824, 512)):
        p = plan_from_dict({"engine": "sglang", "target": vars(base.target), "draft": vars(base.draft),
                            "method": {"name": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
                            "schedule": {"hardware": hw}, "deploy": {"parallel": {"tp": tp}},
                            "runtime": {"device": "cuda", "dtype": "bfloat16"}}, validate=False)
        resolved, _ = resolve(p, "sglang")
        assert (resolved.deploy.memory_fraction, resolved.deploy.cuda_graph_max_bs) == (frac, max_bs)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_export_import_round_trip_of_the_deployment_keys(plan_file, engine):
    over = ["+deploy/memory=frac85", "+deploy/prefix_cache=off", "deploy.reasoning_parser=qwen3",
            "deploy.structured_output.backend=xgrammar", "deploy.cuda_graph_batch_sizes=[1,2,4,8]",
            f"engine={engine}"]
    plan = load_plan(str(plan_file), over).plan
    launch = export(plan, engine)
    imp = import_command(engine, text=launch.command())
    assert imp.errors == [] and imp.unmapped == [], (imp.errors, imp.unmapped)
    back = imported_plan(imp, "back").deploy
    d = plan.deploy
    assert (back.structured_output.backend, back.reasoning_parser, back.memory_fraction, back.prefix_caching,
            back.cuda_graph_max_bs, back.cuda_graph_batch_sizes, back.parallel.tp) == \
        ("xgrammar", "qwen3", 0.85, False, d.cuda_graph_max_bs, [1, 2, 4, 8], 4)
    assert export(imported_plan(imp, "back"), engine).command() == launch.command()


def test_vllm_capture_sizes_count_tokens():
    """vLLM captures by tokens: K + 1 per request of a uniform decode batch (vllm/config/vllm.py:2462-2470)."""
    plan = load_plan("vllm_ngram", ["deploy.cuda_graph_max_bs=32", "deploy.cuda_graph_batch_sizes=[1,8,32]"]).plan
    args = export(plan, "vllm").args
    k1 = plan.method.num_steps + 1
    assert args[args.index("--max-cudagraph-capture-size") + 1] == str(32 * k1)
    i = args.index("--cudagraph-capture-sizes")
    assert args[i + 1: i + 4] == [str(1 * k1), str(8 * k1), str(32 * k1)]
    imp = import_command("vllm", argv=["m", "--max-cudagraph-capture-size", "100", "--speculative-config",
                                       '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert imp.plan["deploy"]["cuda_graph_max_bs"] == 20
    imp = import_command("vllm", argv=["m", "--max-cudagraph-capture-size", "103", "--speculative-config",
                                       '{"method": "ngram", "num_speculative_tokens": 4}'])
    assert imp.plan["deploy"]["cuda_graph_max_bs"] == 20 and any("not a multiple" in n for n in imp.notes)


def test_imported_values_out_of_range_are_named():
    imp = import_command("sglang", argv=["--model-path", "m", "--mem-fraction-static", "1.4"])
    assert any("--mem-fraction-static 1.4" in e and "(0, 1]" in e for e in imp.errors)
    imp = import_command("vllm", argv=["m", "--gpu-memory-utilization", "0"])
    assert any("--gpu-memory-utilization 0.0" in e and "gt=0, le=1" in e for e in imp.errors)
    imp = import_command("vllm", argv=["m", "--speculative-config",
                                       '{"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 0}'])
    assert any("draft_tensor_parallel_size=0" in e for e in imp.errors)


def test_draft_layout_an_engine_cannot_express_is_refused_by_export_and_check():
    plan = load_plan("sglang_eagle3_adaptive", ["schedule=static", "method.num_steps=3", "method.topk=1",
                                                "deploy.parallel.tp=4", "deploy.parallel.draft_tp=1"]).plan
    assert "sglang.DP1" in [v.rule for v in check(plan, "sglang") if v.severity == "error"]
    with pytest.raises(PlanError, match="draft_tp=1"):
        export(plan, "sglang")
    vplan = load_plan("vllm_ngram", ["method=eagle3", "+draft=llama31_8b_eagle3", "deploy.parallel.tp=4",
                                     "deploy.parallel.draft_tp=1"]).plan
    assert [v for v in check(vplan, "vllm") if v.rule == "vllm.DTP1"] == []
    assert '"draft_tensor_parallel_size":1' in export(vplan, "vllm").command()
