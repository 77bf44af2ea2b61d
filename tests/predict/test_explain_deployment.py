"""``specc explain``'s deployment section: per state the CUDA-graph memory and the tensor-parallel
all-reduce per verify forward and per draft pass (with the formulas' sources), the prefix-cache extra
prefill, the KV-cache budget the memory fraction leaves on the hardware profile, and the refusal when
capture leaves less than the plan's batch needs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specc.predict import cost
from specc.predict import deploy_cost
from specc.cli import main

REPO = Path(__file__).resolve().parents[2]
ADAPTIVE = "sglang_eagle3_adaptive"  # Llama-3.1-8B + the EAGLE-3 head, SGLang's adaptive buckets


def explain(capsys, *argv):
    rc = main(["explain", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_state_gets_a_graph_memory_and_a_tp_line_with_sources(capsys):
    rc, out, _ = explain(capsys, ADAPTIVE, "deploy.parallel.tp=4")
    assert rc == 0
    section = out[out.index("deployment on h100"):]
    rows = {ln.split()[0]: ln.split() for ln in section.splitlines() if ln.startswith("b")}
    assert len(rows) == 21  # every candidate state
    for name, cols in rows.items():
        assert cols[2] in ("KiB", "MiB", "GiB") and cols[3].isdigit() and cols[4] == "µs", (name, cols)
    assert "runner_utils/pool.py:101-105" in section and "graph_shared_output.py:11-63" in section
    assert "Patarasuk & Yuan 2009" in section and "Megatron-LM" in section
    assert "memory_hook.py:59-67" in section  # the budget's source
    assert "draft tp 4" in section


def test_tp_communication_is_the_ring_all_reduce_formula(capsys):
    rc, out, _ = explain(capsys, ADAPTIVE, "deploy.parallel.tp=4", "--format", "json")
    data = json.loads(out)
    st = data["deployment"]["states"]["b8_k3_topk1_w4_greedy_chain"]
    hw = cost.load_hardware_profile("h100")
    bw, a = hw.interconnect_bytes_per_s * hw.interconnect_efficiency, hw.interconnect_latency_s
    T, H, L, V, b, n = 8 * 4, 4096, 32, 128256, 2, 4  # Llama-3.1-8B (specc/data/model_shapes.json), bf16
    want = 2 * L * (a + 2 * (n - 1) / n * T * H * b / bw) + (a + (n - 1) / n * T * V * b / bw)
    assert st["tp_verify_s"] == pytest.approx(want)
    # the EAGLE-3 head: one layer, its 32000-token vocabulary, B·topk = 8 tokens per pass
    want_draft = 2 * 1 * (a + 2 * (n - 1) / n * 8 * H * b / bw) + (a + (n - 1) / n * 8 * 32000 * b / bw)
    assert st["tp_draft_pass_s"] == pytest.approx(want_draft)
    assert st["tp_step_s"] == pytest.approx(want + 3 * want_draft)  # κ = 3 chain passes
    # more GPUs, more latency-bound collectives per step: the step's communication grows with tp
    rc, out8, _ = explain(capsys, ADAPTIVE, "deploy.parallel.tp=8", "--format", "json")
    assert json.loads(out8)["deployment"]["states"]["b8_k3_topk1_w4_greedy_chain"]["tp_step_s"] > st["tp_step_s"]


def test_a_draft_on_one_gpu_has_no_draft_all_reduce(capsys):
    rc, out, _ = explain(capsys, "vllm_ngram", "method=eagle3", "+draft=llama31_8b_eagle3", "deploy.parallel.tp=4",
                         "deploy.parallel.draft_tp=1", "--format", "json")
    assert rc == 0, out
    dep = json.loads(out)["deployment"]
    assert dep["draft_tp"] == 1
    assert all(s["tp_draft_pass_s"] == 0 and s["tp_verify_s"] > 0 for s in dep["states"].values())


def test_the_specc_runtime_says_it_has_no_tensor_parallelism(capsys):
    rc, out, _ = explain(capsys, "smollm2_eagle3")
    assert rc == 0 and "no tensor parallelism, so no all-reduce" in out


def test_prefix_caching_prices_the_eagle_block_drop_on_vllm(capsys):
    rc, out, _ = explain(capsys, "vllm_ngram", "method=eagle3", "+draft=llama31_8b_eagle3", "--format", "json")
    data = json.loads(out)
    states = data["deployment"]["states"]
    assert all(s["prefix_recompute_tokens"] == 16 for s in states.values())  # one 16-token block per hit
    assert any(v["rule"] == "vllm.PC2" and "#19996" in v["message"] for v in data["violations"])
    rc, out, _ = explain(capsys, "vllm_ngram", "method=eagle3", "+draft=llama31_8b_eagle3",
                         "deploy.prefix_caching=false", "--format", "json")
    assert all(s["prefix_extra_s"] is None for s in json.loads(out)["deployment"]["states"].values())


def test_sglang_capture_beyond_the_headroom_is_refused(capsys):
    rc, out, err = explain(capsys, ADAPTIVE, "deploy.cuda_graph_max_bs=4096", "deploy.memory_fraction=0.95")
    assert rc == 1
    assert "specc explain: error: CUDA graphs" in err and "PR #3430" in err and "deploy.cuda_graph_max_bs" in err
    assert "REFUSED" in out
    rc, _, _ = explain(capsys, ADAPTIVE, "deploy.cuda_graph_max_bs=64", "deploy.memory_fraction=0.85")
    assert rc == 0


def test_vllm_refuses_when_graphs_push_the_batch_out_and_notes_when_it_never_fit():
    hw = cost.load_hardware_profile("h100")
    M = hw.memory_bytes
    kv_tok, ctx = 128 * 1024, 8192  # Llama-3.1-8B, bf16
    base = dict(engine="vllm", hw=hw, fraction=0.9, weights=16e9, activations=1e9, kv_per_token=kv_tok, context=ctx)
    kv_no_graphs = 0.9 * M - 16e9 - 1e9
    batch = int(kv_no_graphs // (kv_tok * ctx))  # fits without graphs
    b = deploy_cost.memory_budget(graphs=0.0, batch=batch, **base)
    assert b.refusal is None and b.shortfall is None
    b = deploy_cost.memory_budget(graphs=6e9, batch=batch, **base)  # the graphs push it out
    assert b.refusal and "capturing CUDA graphs" in b.refusal and "#54418" in b.refusal
    b = deploy_cost.memory_budget(graphs=6e9, batch=batch + 40, **base)  # never fit: a note, not a refusal
    assert b.refusal is None and "even without CUDA graphs" in b.shortfall
    b = deploy_cost.memory_budget(graphs=0.0, batch=1, **dict(base, fraction=0.2))
    assert b.refusal and "To serve at least one request" in b.refusal  # vLLM's own startup refusal


def test_explain_stays_torch_free_on_an_engine_plan():
    code = ("import sys; from specc.cli import main; main(['explain', 'sglang_eagle3_adaptive', "
            "'deploy.parallel.tp=4']); assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
