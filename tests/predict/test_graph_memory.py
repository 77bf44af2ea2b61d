"""The graph-memory formula ``specc explain`` prints for the specc runtime
(:func:`specc.predict.deploy_cost.graph_memory`, engine ``specc``) against what a state's verify program
really allocates, traced on the CPU by the profiler (:func:`specc.runtime.memory.program_peak_bytes`:
the working set a CUDA-graph capture records into the state's pool). Each regime is covered: the
attention-bound (long cache), MLP-bound (wide intermediate), logits-bound (large vocabulary) and
sampling-bound (standard rule) states, in fp32 (eager attention) and bf16 (tiled attention). On a GPU,
``tools/graph_memory.py`` (run by ``tools/gpu_check``) compares the same formula with the pools the
captures take.
"""
from __future__ import annotations

import pytest
import torch

from specc.predict.deploy_cost import ModelShape, graph_memory
from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.models.config import LlamaConfig
from specc.models.llama import LlamaModel
from specc.runtime.engine import Runtime
from specc.runtime.memory import program_peak_bytes
from specc.runtime.state import StateSpec


def _model(V, H, L, nh, nkv, I, max_len, dtype):
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=L, num_heads=nh,
                      num_kv_heads=nkv, head_dim=H // nh, max_model_len=max_len, max_position_embeddings=max_len)
    gen = torch.Generator().manual_seed(0)
    m = LlamaModel(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return m.eval().requires_grad_(False).to(dtype)


# (what dominates, V, H, layers, heads, kv heads, I, max_model_len, dtype, B, κ, rule)
CASES = [
    ("fp32 attention", 64, 64, 2, 4, 2, 128, 2048, torch.float32, 4, 3, "greedy"),
    ("bf16 attention", 64, 64, 2, 4, 2, 128, 2048, torch.bfloat16, 4, 3, "greedy"),
    ("bf16 attention, head dim 64", 256, 256, 2, 4, 4, 512, 1024, torch.bfloat16, 8, 7, "greedy"),
    ("fp32 MLP", 1000, 256, 2, 8, 2, 2048, 64, torch.float32, 16, 3, "greedy"),
    ("bf16 MLP", 1000, 256, 2, 8, 2, 2048, 64, torch.bfloat16, 16, 3, "greedy"),
    ("fp32 logits", 20000, 64, 2, 4, 2, 128, 64, torch.float32, 4, 3, "greedy"),
    ("fp32 sampling", 20000, 64, 2, 4, 2, 128, 64, torch.float32, 4, 3, "standard"),
    ("bf16 sampling", 20000, 64, 2, 4, 2, 128, 64, torch.bfloat16, 4, 3, "standard"),
    ("bf16 block rule", 20000, 64, 2, 4, 2, 128, 64, torch.bfloat16, 4, 3, "block"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_predicted_graph_memory_matches_the_programs_allocations(case):
    torch.set_num_threads(1)
    _, V, H, L, nh, nkv, I, max_len, dtype, B, k, rule = case
    target = _model(V, H, L, nh, nkv, I, max_len, dtype)
    draft = _model(V, H, 1, nh, nkv, I, max_len, dtype)
    spec = StateSpec(f"b{B}_k{k}", "draft_model", B, k, num_draft_tokens=k + 1, verify_rule=rule)
    rt = Runtime(target, None, DraftModelDrafter(draft, V), [spec], max_model_len=max_len - 16, eos_token_ids=[])
    measured = program_peak_bytes(rt.states[0])
    shape = ModelShape(hidden=H, layers=L, heads=nh, kv_heads=nkv, head_dim=H // nh, intermediate=I, vocab=V,
                       embed_vocab=V)
    g = graph_memory("specc", spec, shape, None, torch.empty((), dtype=dtype).element_size(), rt.cache_len)
    print(f"{case[0]}: measured {measured} B, predicted {g.bytes} B, ratio {g.bytes / measured:.3f}, terms {g.terms}")
    assert abs(g.bytes - measured) <= 0.10 * measured, (g.terms, measured)


def test_the_dominant_term_moves_with_the_shape():
    """Each regime is priced by the term it is named after (the formula is not one constant)."""
    shape = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=64,
                       embed_vocab=64)
    big_v = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=50000,
                       embed_vocab=50000)
    greedy = StateSpec("b4_k3", "draft_model", 4, 3, num_draft_tokens=4)
    standard = StateSpec("b4_k3", "draft_model", 4, 3, num_draft_tokens=4, verify_rule="standard")

    def top(g):
        return max(g.terms, key=g.terms.get)

    assert top(graph_memory("specc", greedy, shape, None, 4, 2053)) == "attention"
    assert top(graph_memory("specc", greedy, big_v, None, 4, 64)) == "head"
    g = graph_memory("specc", standard, big_v, None, 4, 64)
    assert top(g) == "accept" and g.bytes == 16 * 50000 * 42  # T·V·(4 + 38), the sampling working set


def test_runtime_reports_each_states_graph_memory():
    """Runtime.describe carries the pool a capture took (0 where nothing is captured, as on a CPU)."""
    target = _model(64, 32, 1, 4, 2, 64, 64, torch.float32)
    rt = Runtime(target, None, None, [StateSpec("b1_k0", "none", 1, 0, num_draft_tokens=1)], max_model_len=32,
                 eos_token_ids=[])
    row = rt.describe()[0]
    assert row["graph_pool_bytes"] == 0 and row["graph_peak_bytes"] == 0 and not row["captured"]
