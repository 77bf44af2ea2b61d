"""The step as data and the ways its verify program runs.

* One copy of verify → accept → commit (``SpecRuntimeState.program``), counted in the source.
* Host reads per decode step: counted (``SpecMetrics.num_host_reads``), printed, at most one.
* Half precision on the CPU, row-invariant: every row of a forward gets the same bits whatever the
  number of rows and the attended span, so speculative greedy output equals plain greedy output at
  bf16, at batch 1 and in mixed batches (a perturbed draft model, a chain and a tree).
* ``compile_backend: inductor``: the compiled verify program's outputs equal eager's.
"""
from __future__ import annotations

import pathlib
import re

import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], list(range(20, 61)), [7, 7]]
NEW = [30, 5, 26, 41, 17]


def _requests():
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n), request_id=f"r{i}")
            for i, (p, n) in enumerate(zip(PROMPTS, NEW))]


def test_verify_accept_commit_is_written_once():
    """The verify program's three stages are called in one place of the runtime."""
    calls = {}
    for f in (ROOT / "specc" / "runtime").glob("*.py"):
        text = f.read_text()
        for stage in ("verify", "accept", "commit"):
            n = len(re.findall(rf"programs\.{stage}\(", text))
            if n:
                calls.setdefault(stage, []).append((f.name, n))
    assert calls == {s: [("state.py", 1)] for s in ("verify", "accept", "commit")}, calls


def test_one_host_read_per_decode_step():
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    draft = perturbed_copy(target, noise=0.03, seed=1)
    specs = [StateSpec(f"b{b}_k3", "draft_model", b, 3, num_draft_tokens=4) for b in (1, 4)]
    rt = Runtime(target, None, DraftModelDrafter(draft, 64), specs, max_model_len=128, eos_token_ids=[])
    rt.generate(_requests(), batch_size=4)
    steps = sum(rt.metrics.kappa_steps.values())
    by_tokens = rt.metrics.verify_ms_by_tokens
    print(f"decode steps {steps}, host reads {rt.metrics.num_host_reads} "
          f"({rt.metrics.num_host_reads / steps:.2f} per step); verify program ms by verified tokens: "
          + ", ".join(f"{n}: {ms:.2f}" for n, ms in by_tokens.items()))
    assert steps > 0 and rt.metrics.num_host_reads == steps
    # every step's verify program timed once, keyed by the tokens its ragged forward ran (1..4 rows x 1..4)
    assert sum(c for c, _, _ in rt.metrics.verify_by_tokens.values()) == steps
    assert set(by_tokens) <= set(range(1, 17)) and all(ms > 0 for ms in by_tokens.values())


@pytest.fixture(scope="module")
def bf16_models():
    torch.set_num_threads(1)
    target = tiny_llama(seed=3, vocab_size=64, hidden_size=64, num_layers=2, std=0.25)
    draft = perturbed_copy(target, noise=0.02, seed=2)
    return target.to(torch.bfloat16).set_row_invariant(), draft


@pytest.mark.parametrize("k", [2, 4])
def test_bf16_speculative_greedy_equals_plain_bf16_greedy(bf16_models, k):
    """At bf16 the argmax of a one-token step and of a row of a wider verify agree only if the two
    compute the row with the same bits: the row-invariant forward makes them, at batch 1 and 4."""
    target, draft = bf16_models
    reference = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, NEW)]
    specs = [StateSpec(f"b{b}_k{k}", "draft_model", b, k, num_draft_tokens=k + 1) for b in (1, 4)]
    rt = Runtime(target, None, DraftModelDrafter(draft, 64), specs, max_model_len=128, eos_token_ids=[])
    for bs in (1, 4):
        out = rt.generate(_requests(), batch_size=bs)
        assert [o.token_ids for o in out] == reference, bs
    assert rt.metrics.num_accepted_tokens > 0


def test_runtime_keeps_the_row_invariant_path_at_half_precision(bf16_models):
    """A target left on the bulk attention (``set_fast_attention``, drafter-training features) or
    without fixed GEMM chunks is switched back to the row-invariant forward by the runtime, so
    speculative greedy still equals plain greedy at bf16."""
    target, draft = bf16_models
    reference = [reference_greedy(target, p, n) for p, n in zip(PROMPTS, NEW)]
    target.set_fast_attention(True).set_row_invariant(False)
    try:
        specs = [StateSpec("b4_k3", "draft_model", 4, 3, num_draft_tokens=4)]
        rt = Runtime(target, None, DraftModelDrafter(draft, 64), specs, max_model_len=128, eos_token_ids=[])
        assert not any(layer.attn.fast_half for layer in target.layers)
        assert all(m.row_chunk == 16 for m in target.modules() if hasattr(m, "row_chunk") and hasattr(m, "in_features"))
        assert [o.token_ids for o in rt.generate(_requests(), batch_size=4)] == reference
    finally:
        target.set_fast_attention(False).set_row_invariant()


def test_bf16_rows_are_invariant_to_row_count_and_span(bf16_models):
    """The same (position, token, history) row, computed in a 1-token step and inside 5- and 9-token
    forwards, has identical logits and hidden states (bitwise)."""
    target, _ = bf16_models
    seq = list(range(3, 43))
    target.setup_cache(1, 128)
    with torch.inference_mode():
        target(torch.tensor([seq[:30]]), torch.arange(30)[None])
        one, h1 = target(torch.tensor([[seq[30]]]), torch.tensor([[30]]), hidden_layers=(0, 1))
        for width in (5, 9):
            target(torch.tensor([seq[:30]]), torch.arange(30)[None])
            wide, hw = target(torch.tensor([seq[30:30 + width]]), (30 + torch.arange(width))[None], hidden_layers=(0, 1))
            assert torch.equal(wide[0, 0], one[0, 0]), width
            assert all(torch.equal(a[0, 0], b[0, 0]) for a, b in zip(hw, h1))


def test_inductor_verify_program_equals_eager():
    """``compile_backend: inductor`` compiles each state's verify program at load (full static
    inputs: every row, the static width, attention over every slot); decoding equals eager decoding
    token for token, and the load report says it compiled."""
    pytest.importorskip("torch._inductor")
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    draft = perturbed_copy(target, noise=0.03, seed=1)
    reference = [reference_greedy(target, p, n) for p, n in zip(PROMPTS[:3], NEW[:3])]
    specs = [StateSpec("b2_k3", "draft_model", 2, 3, num_draft_tokens=4)]
    try:
        rt = Runtime(target, None, DraftModelDrafter(draft, 64), specs, max_model_len=128, eos_token_ids=[],
                     compile_backend="inductor")
    except Exception as exc:  # no C++ toolchain for inductor on this machine
        if "compile_backend=inductor failed" in str(exc) and "compiler" in str(exc).lower():
            pytest.skip(str(exc))
        raise
    print(rt.load_report())
    assert rt.num_compiled == 1 and "compiled with inductor" in rt.load_report()
    assert rt.states[0].graph_breaks == 0  # one graph: verify forward, greedy accept and commit
    out = rt.generate(_requests()[:3], batch_size=2)
    assert [o.token_ids for o in out] == reference
    assert rt.metrics.num_accepted_tokens > 0


def test_static_plain_step_takes_the_kernel_of_its_own_family():
    """A κ = 0 state of a greedy artifact carries a ``greedy_verify`` kernel variant, but its accept
    program samples through ``rejection_verify`` when captured or compiled (every row at the static
    width, no all-greedy shortcut): the variant of another family is not called in its place."""
    import types

    from specc import kernels

    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=1)
    variant = types.SimpleNamespace(FAMILY="greedy_verify", NUM_DRAFT_TOKENS=1, verify=kernels.greedy_verify)
    spec = StateSpec("b2_k0_topk1_w1_greedy_plain", "none", 2, 0, num_draft_tokens=1)
    rt = Runtime(target, None, None, [spec], max_model_len=64, eos_token_ids=[],
                 state_kernels={spec.name: {"verify": "greedy_verify_w1"}},
                 kernel_modules={"greedy_verify_w1": variant})
    st = rt.states[0]
    with torch.inference_mode():
        out = st.program(st._static_inputs())  # what a CUDA graph captures and inductor compiles
    assert out.result.output_tokens.shape == (2, 1)


def test_each_compiled_program_gets_its_own_dynamo_cache():
    """Dynamo keys compiled entries by code object: twelve programs made by one ``def`` in a loop are
    recompilations of one function, and past ``recompile_limit`` the rest run eagerly; with
    :func:`specc.runtime.compile.own_code` (what each state's verify program gets) each compiles."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from specc.runtime.compile import own_code

    class Program:
        def __init__(self, k):
            self.lin, self.k = torch.nn.Linear(2, 2), k

        def program(self, x):
            return self.lin(x) * self.k

    def compiled_graphs(own):
        torch._dynamo.reset()
        counters.clear()
        fns = []
        for k in range(12):
            def run(x, p=Program(k)):
                return p.program(x)
            fns.append(torch.compile(own_code(run, f"program_{k}") if own else run, backend="eager", dynamic=False))
        with torch.inference_mode(), torch._dynamo.config.patch(recompile_limit=8):
            for fn in fns:
                fn(torch.ones(2))
        return counters["stats"]["unique_graphs"]

    assert compiled_graphs(own=False) == 8
    assert compiled_graphs(own=True) == 12
