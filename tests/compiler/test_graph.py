"""Stage graphs: built for every kind of state, validated, broken on purpose, exported."""
import json

import networkx as nx
import pytest

from specc.predict import cost
from specc.compiler import graph
from specc.predict.analyze import analyze
from specc.compiler.lower import lower
from specc.plan.schema import (DeployConfig, DisaggConfig, LoraConfig, MethodConfig, Plan,
                               ScheduleConfig, TargetConfig, VerifyConfig)

PLANS = {
    "eagle3_adaptive": Plan(method=MethodConfig(name="eagle3", num_steps=3),
                            schedule=ScheduleConfig(kind="adaptive", capture_batch_sizes=[1, 8, 64])),
    "eagle_tree_lora_decode": Plan(method=MethodConfig(name="eagle", num_steps=5, topk=4, num_draft_tokens=8),
                                   deploy=DeployConfig(lora=LoraConfig(adapters=["a"]),
                                                       disagg=DisaggConfig(role="decode"))),
    "dspark_budget": Plan(method=MethodConfig(name="dspark", num_steps=1, topk=1, block_size=7,
                                              confidence_head=True),
                          verify=VerifyConfig(rule="standard", draft_sampling="probabilistic"),
                          schedule=ScheduleConfig(kind="budget")),
    "dflash": Plan(method=MethodConfig(name="dflash", num_steps=1, block_size=15)),
    "p_eagle": Plan(method=MethodConfig(name="eagle3", num_steps=4, parallel_drafting=True)),
    "medusa_tree": Plan(method=MethodConfig(name="medusa", tree_choices=[[0], [1], [0, 0], [0, 1], [0, 0, 0]])),
    "medusa_chain": Plan(method=MethodConfig(name="medusa", num_steps=3)),
    "ngram": Plan(method=MethodConfig(name="ngram", num_steps=4)),
    "suffix": Plan(method=MethodConfig(name="suffix", num_steps=6)),
    "frozen_kv_prefill": Plan(method=MethodConfig(name="frozen_kv_mtp", num_steps=2),
                              deploy=DeployConfig(disagg=DisaggConfig(role="prefill"))),
    "mtp_standard_onehot": Plan(method=MethodConfig(name="mtp", num_steps=2), verify=VerifyConfig(rule="standard")),
    "draft_model_block": Plan(method=MethodConfig(name="draft_model", num_steps=4), verify=VerifyConfig(rule="block")),
    "multi_layer_eagle": Plan(method=MethodConfig(name="multi_layer_eagle", num_steps=3)),
    "synthetic": Plan(method=MethodConfig(name="eagle", num_steps=3), verify=VerifyConfig(rule="synthetic")),
    "plain": Plan(method=MethodConfig(name="none")),
}

# Forward passes per step (draft stage, draft-extend, target) the methods are known to run — written from
# the methods' definitions, independently of graph.expected_forward_passes, counted at a
# common iteration boundary: an EAGLE-family head's extend pass drafts token 1 (κ − 1 draft passes + 1
# extend), a draft model catches its KV up inside its first proposal pass, DFlash/DSpark project their
# context K/V without a draft forward, frozen-KV MTP runs κ passes and no extend.
KNOWN_PASSES = {
    ("eagle3_adaptive", 0): (0, 1, 1), ("eagle3_adaptive", 1): (0, 1, 1), ("eagle3_adaptive", 3): (2, 1, 1),
    ("eagle3_adaptive", 5): (4, 1, 1), ("eagle3_adaptive", 7): (6, 1, 1),
    ("eagle_tree_lora_decode", 5): (4, 1, 1),  # levels 2..5 + extend (level 1 from the extend)
    ("dspark_budget", 7): (1, 0, 1), ("dflash", 15): (1, 0, 1), ("p_eagle", 4): (1, 1, 1),
    ("medusa_tree", 3): (1, 0, 1), ("medusa_chain", 3): (1, 0, 1),  # heads, no draft KV
    ("ngram", 4): (0, 0, 1), ("suffix", 6): (0, 0, 1),
    ("frozen_kv_prefill", 2): (2, 0, 1),  # no extend: frozen hand-off
    ("mtp_standard_onehot", 2): (1, 1, 1), ("draft_model_block", 4): (4, 0, 1),
    ("multi_layer_eagle", 3): (2, 1, 1), ("synthetic", 3): (2, 1, 1), ("plain", 0): (0, 0, 1),
}


@pytest.mark.parametrize("key", sorted(PLANS))
def test_every_state_graph_validates(key):
    plan = PLANS[key]
    for s in lower(plan):
        g = graph.build_graph(plan, s)
        assert nx.is_directed_acyclic_graph(g)
        assert graph.validate_graph(g) == [], s.name
        passes = graph.count_forward_passes(g)
        assert (passes["draft"], passes["extend"], passes["target"]) == KNOWN_PASSES[(key, s.num_steps)], s.name
        assert graph.target_tokens_per_step(g) == s.batch_size * s.num_draft_tokens


def test_stage_contents():
    plan = PLANS["eagle_tree_lora_decode"]
    g = graph.build_graph(plan, lower(plan)[0])
    ops = {d["op"] for _, d in g.nodes(data=True)}
    assert {"tree_expand", "tree_build", "target_forward", "accept_kernel", "bonus_sample",
            "kv_commit", "draft_extend", "disagg_seed", "lora_layout"} <= ops
    assert "lora_segment_ids" in g.edges["lora_segments", "target_verify"]["tensors"]
    plan = PLANS["dspark_budget"]
    g = graph.build_graph(plan, lower(plan)[0])
    assert "budget_select" in g and "markov_head" in g
    assert g.edges["draft_block", "markov_head"]["tensors"]["block_logits"]["shape"] == ["B", "K", "V"]
    assert "draft_probs" in g.edges["markov_head", "accept"]["tensors"]
    g = graph.build_graph(PLANS["frozen_kv_prefill"], lower(PLANS["frozen_kv_prefill"])[0])
    assert "draft_handoff" in g and "draft_extend" not in g and "disagg_seed_export" in g


def _chain_graph():
    plan = Plan(method=MethodConfig(name="eagle3", num_steps=3), target=TargetConfig(vocab_size=49152))
    return graph.build_graph(plan, lower(plan)[0])


def test_broken_edge_shape_is_named():
    g = _chain_graph()
    g.edges["draft_stack", "target_verify"]["tensors"]["draft_tokens"]["shape"] = ["B", "K+1"]
    issues = graph.validate_graph(g)
    assert len(issues) == 1
    assert issues[0].where == "draft_stack -> target_verify"
    assert "draft_tokens" in issues[0].message and "[1, 4]" in issues[0].message
    with pytest.raises(Exception, match="draft_stack -> target_verify"):
        graph.check_graph(g)


def test_broken_producer_shape_is_caught_with_concrete_dims():
    g = _chain_graph()
    # the target's logits declared one position short: every consumer edge disagrees
    g.nodes["target_verify"]["produces"]["target_logits"]["shape"] = ["B", "W-1", "V"]
    wheres = {i.where for i in graph.validate_graph(g)}
    assert {"target_verify -> accept", "target_verify -> bonus_sample"} <= wheres


def test_dtype_mismatch_missing_and_duplicate_producers_cycles_and_pass_counts():
    g = _chain_graph()
    g.edges["accept", "bonus_sample"]["tensors"]["accepted_len"]["dtype"] = "int32"
    assert any("dtype" in i.message and i.where == "accept -> bonus_sample" for i in graph.validate_graph(g))

    g = _chain_graph()
    g.nodes["kv_commit"]["consumes"]["phantom"] = {"shape": ["B"], "dtype": "int64"}
    assert [str(i) for i in graph.validate_graph(g)] == ["kv_commit.phantom: consumed but never produced"]

    g = _chain_graph()
    g.nodes["draft_step_1"]["produces"]["bonus_tokens"] = {"shape": ["B"], "dtype": "int64"}
    assert any("produced more than once" in i.message for i in graph.validate_graph(g))

    g = _chain_graph()
    g.add_edge("kv_commit", "draft_step_0", tensors={})
    assert any("cycle" in i.message for i in graph.validate_graph(g))

    g = _chain_graph()
    g.nodes["draft_step_2"]["forward"] = ""  # pretend the second draft pass is not a forward
    msgs = [i.message for i in graph.validate_graph(g)]
    assert msgs == ["1 draft forward pass(es) per step, but method eagle3 (chain) runs 2"]


def test_json_and_dot_export():
    g = _chain_graph()
    data = graph.to_json(g)
    json.dumps(data)
    assert "edges" in data and data["graph"]["state"] == "b1_k3_topk1_w4_greedy_chain"
    g2 = graph.from_json(data)
    assert set(g2.nodes) == set(g.nodes) and set(g2.edges) == set(g.edges)
    assert graph.validate_graph(g2) == []
    dot = graph.to_dot(g)
    assert dot.startswith('digraph "b1_k3_topk1_w4_greedy_chain" {') and dot.rstrip().endswith("}")
    for n in g.nodes:
        assert f'"{n}" [label=' in dot
    assert dot.count(" -> ") == g.number_of_edges()
    assert "draft_tokens [B, K] int64" in dot


def test_buffer_bytes_and_graph_count():
    g = _chain_graph()  # B=1, W=4, V=49152: logits alone are 4·49152·4 bytes
    assert graph.buffer_bytes(g) >= 4 * 49152 * 4
    assert graph.graphs_to_capture(g) == 3  # draft, verify, extend
    plain = Plan(method=MethodConfig(name="none"))
    assert graph.graphs_to_capture(graph.build_graph(plain, lower(plain)[0])) == 1


def test_every_preset_lowers_graphs_and_validates():
    from specc.plan import load

    presets = load.list_presets()
    assert len(presets) >= 20, presets  # every method and scenario has a preset
    for name in presets:
        plan = load.load_plan(name).plan
        res = analyze(plan)
        states = res.lowering.states
        assert states, name
        for s in states:
            issues = graph.validate_graph(res.graphs[s.name])
            assert issues == [], f"{name}/{s.name}: {[str(i) for i in issues]}"
            p = res.predictions[s.name]
            assert p.expected_tokens >= 1.0 and p.target_tokens_per_step == s.batch_size * s.num_draft_tokens
