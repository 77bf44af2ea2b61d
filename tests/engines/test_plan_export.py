"""Plan -> SGLang / vLLM launch settings: expected flags written from the engines' flag tables
(SGLang sglang/srt/arg_groups/fields/spec.py, vLLM vllm/config/speculative.py), not from the
exporter's output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specc.errors import PlanError
from specc.export import export, to_sglang, to_vllm
from specc.plan import load_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _pairs(args):
    """flag -> value (None for switches)."""
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = None
            i += 1
    return out


def test_sglang_eagle3_adaptive():
    launch = to_sglang(load_plan("sglang_eagle3_adaptive").plan)
    f = _pairs(launch.args)
    assert f["--model-path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert f["--speculative-algorithm"] == "EAGLE3"
    assert f["--speculative-draft-model-path"] == "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
    assert (f["--speculative-num-steps"], f["--speculative-eagle-topk"], f["--speculative-num-draft-tokens"]) == \
        ("3", "1", "4")
    assert "--speculative-adaptive" in f and f["--speculative-adaptive-config"] == "adaptive_config.json"
    cfg = launch.adaptive_config
    assert cfg["1"]["candidate_steps"] == [1, 3, 5, 7] and cfg["1"]["down_hysteresis"] == -0.25
    assert cfg["64"]["candidate_steps"] == [0] and cfg["ema_alpha"] == 0.2 and cfg["update_interval"] == 5
    assert "--speculative-use-rejection-sampling" not in f


def test_sglang_block_methods_and_env():
    f = _pairs(to_sglang(load_plan("sglang_dflash").plan).args)
    assert f["--speculative-algorithm"] == "DFLASH" and f["--speculative-dflash-block-size"] == "16"  # γ 15 + bonus
    launch = to_sglang(load_plan("sglang_dspark_budget").plan)
    f = _pairs(launch.args)
    assert f["--speculative-dspark-block-size"] == "7"
    assert f["--speculative-dspark-sps-table-path"] == "tables/sps_qwen3_8b_h200.json"
    assert launch.env == {"SGLANG_RAGGED_VERIFY_MODE": "compact"}
    f = _pairs(to_sglang(load_plan("sglang_mtp").plan).args)
    assert f["--speculative-algorithm"] == "NEXTN" and f["--tp-size"] == "8"
    f = _pairs(to_sglang(load_plan("sglang_lora_eagle3").plan).args)
    assert "--enable-lora" in f and "my_adapter=/path/to/lora_adapter" in to_sglang(
        load_plan("sglang_lora_eagle3").plan).args and f["--max-loras-per-batch"] == "4"
    assert _pairs(to_sglang(load_plan("sglang_disagg_decode").plan).args)["--disaggregation-mode"] == "decode"
    f = _pairs(to_sglang(load_plan("smollm2_eagle3", ["verify=standard"]).plan).args)
    assert "--speculative-use-rejection-sampling" in f


def test_vllm_batch_buckets_and_methods():
    launch = to_vllm(load_plan("vllm_batch_buckets").plan)
    sc = launch.speculative_config
    assert launch.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert sc["method"] == "eagle3" and sc["num_speculative_tokens"] == 4
    # buckets 1/8/32 with K 4/2/1; the last range runs to runtime.max_batch_size = 64 (runtime/cuda.yaml)
    assert sc["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 31, 2], [32, 64, 1]]
    sc = to_vllm(load_plan("vllm_ngram").plan).speculative_config
    assert (sc["method"], sc["num_speculative_tokens"], sc["prompt_lookup_min"], sc["prompt_lookup_max"]) == \
        ("ngram", 4, 2, 5) and "model" not in sc
    sc = to_vllm(load_plan("vllm_dspark_budget").plan).speculative_config
    assert (sc["method"], sc["num_speculative_tokens"], sc["enable_adaptive_verification"]) == ("dspark", 7, True)
    sc = to_vllm(load_plan("vllm_custom").plan).speculative_config
    assert (sc["method"], sc["model"]) == ("custom_class", "my_package.proposers.MyProposer")
    sc = to_vllm(load_plan("vllm_pard").plan).speculative_config
    assert sc["parallel_drafting"] is True and sc["model"] == "amd/PARD-Llama-3.2-1B"
    cmd = to_vllm(load_plan("vllm_ngram").plan).command()
    assert cmd.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct") and '"method":"ngram"' in cmd


def test_plans_without_an_engine_equivalent_are_refused():
    with pytest.raises(PlanError, match="medusa"):
        to_vllm(load_plan("vllm_medusa").plan)
    with pytest.raises(PlanError, match="suffix"):
        to_sglang(load_plan("vllm_suffix").plan)
    with pytest.raises(KeyError):
        export(load_plan("smollm2_eagle3").plan, "specc")
    bad = load_plan("vllm_batch_buckets", ["schedule.buckets.8.candidates=[1,2]"]).plan
    with pytest.raises(PlanError, match="exactly one K"):
        to_vllm(bad)
    assert json.loads(to_vllm(load_plan("vllm_pard").plan).command().split("--speculative-config ")[1].strip("'"))


def test_sglang_chain_with_unset_width_exports_k_plus_1():
    # The eagle3 group leaves num_draft_tokens unset (so num_steps can change); SGLang would fill κ + 1
    # but warn (EG20), so the export passes it explicitly, following num_steps.
    for steps in (3, 6):
        plan = load_plan("sglang_lora_eagle3", [f"method.num_steps={steps}"]).plan
        assert plan.method.num_draft_tokens is None
        f = _pairs(to_sglang(plan).args)
        assert f["--speculative-num-draft-tokens"] == str(steps + 1)
    # A tree keeps its own width (topk 4, 8 draft tokens), not κ + 1.
    f = _pairs(to_sglang(load_plan("sglang_eagle_tree").plan).args)
    assert f["--speculative-num-draft-tokens"] == "8"
