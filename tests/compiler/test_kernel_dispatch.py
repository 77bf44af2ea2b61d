"""Each compiled state's accept program dispatches to its own specialized kernel.

Compiles shipped presets with several states (chains of κ = 0..4, a dynamic tree, the standard rule)
into a temporary directory, loads the artifact, and runs every state's accept program
(:func:`specc.compiler.programs.state_programs` → ``specc.runtime.stages.<fn>``) on tiny random inputs with
the Triton backend (the interpreter on a CPU). Every launch is recorded
(:func:`specc.kernels.verify_triton.record_launches`): the kernel must be the one of the state's
kernel variant, compiled for the state's own κ (``K``) or tree size (``N``, ``STEPS``) and the
target's vocabulary (``V``), and the function the program called must be the artifact module's
``verify``, not the generic dispatcher — for the state's own rule and for the rows that differ (a
sampled row on a greedy-rule state, an all-greedy step on a standard-rule state), κ = 0 states
included.
"""
from __future__ import annotations

import tests.triton_support  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)

import types

import pytest
import torch

from specc.compiler import build
from specc.compiler import programs
from specc.kernels.verify_triton import record_launches
from specc.plan.load import load_plan
from specc.runtime import stages
from specc.runtime.artifact import load_artifact
from specc.runtime.state import StateSpec

from tests.triton_support import IN_PROCESS, fresh_process_test, needs_triton

V = 49152  # SmolLM2's vocabulary: every kernel module of its artifacts is compiled for it

FAMILY_KERNEL = {"greedy_verify": "greedy_kernel", "rejection_verify": "rejection_kernel",
                 "block_verify": "block_kernel", "tree_greedy_verify": "tree_greedy_kernel",
                 "tree_rejection_verify": "tree_rejection_kernel"}

CASES = [("smollm2_adaptive", ()), ("smollm2_adaptive", ("verify.rule=standard",)),
         ("smollm2_eagle3_tree", ()), ("smollm2_eagle3_tree", ("verify.rule=standard",))]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("art")
    return [load_artifact(build.compile_plan(load_plan(p, list(o)).plan, out / str(i)).path)
            for i, (p, o) in enumerate(CASES)]


def _inputs(spec: StateSpec, entry_kernels, gen: torch.Generator):
    """The step inputs an accept program reads, for one request of ``spec``'s width."""
    w, k = spec.num_draft_tokens, spec.num_draft_tokens - 1
    parents = torch.tensor([[max(0, (j - 1) // 2) if j else 0 for j in range(k)]], dtype=torch.int64)
    return types.SimpleNamespace(
        kernels=dict(entry_kernels), input_ids=torch.zeros(1, w, dtype=torch.int64),
        draft_tokens=torch.randint(0, V, (1, k), generator=gen), num_valid=torch.tensor([k], dtype=torch.int32),
        parents=parents, all_greedy=False, draft_probs=None,
        uniforms=torch.rand(1, k, generator=gen), exp_noise=torch.empty(1, V).exponential_(generator=gen),
        temperature=torch.ones(1), top_k=None, top_p=None, use_top_k=False, use_top_p=False)


def _run(ctx, art, entry, spec, call, inp, logits):
    """Run the state's accept program once; returns ``(modules called, launches, output)``."""
    called = []
    real = {}
    for name in set(entry["kernels"].values()):
        module = art.kernels[name]
        real[name] = module.verify
        module.verify = (lambda n, f: lambda *a, **kw: called.append(n) or f(*a, **kw))(name, module.verify)
    try:
        with record_launches() as log:
            out = getattr(stages, call.fn)(ctx, inp, logits, *call.args)
    finally:
        for name, fn in real.items():
            art.kernels[name].verify = fn
    return called, log, out


@needs_triton
def test_every_state_launches_its_specialized_kernel(artifacts):
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for art in artifacts:
        ctx = types.SimpleNamespace(kernel_modules=art.kernels, kernel_backend="triton")
        rates = art.manifest["runtime"]["verify"]["synthetic_rates"]
        for entry in art.states:
            spec = StateSpec.from_dict(entry["parameters"])
            call = programs.state_programs(spec, rates).accept
            # both kinds of step: every row greedy, and one sampled row
            for all_greedy in (True, False):
                inp = _inputs(spec, entry["kernels"], gen)
                inp.all_greedy = all_greedy
                logits = torch.randn(1, spec.num_draft_tokens, V, generator=gen)
                called, log, out = _run(ctx, art, entry, spec, call, inp, logits)
                assert len(called) == 1 and len(log) == 1, (entry["name"], all_greedy, called, log)
                module = art.kernels[called[0]]
                launch = log[0]
                greedy_family = module.FAMILY in ("greedy_verify", "tree_greedy_verify")
                assert greedy_family == all_greedy, (entry["name"], all_greedy, module.FAMILY)
                assert launch.kernel == FAMILY_KERNEL[module.FAMILY], (entry["name"], launch)
                assert launch.constexprs["V"] == V == module.VOCAB_SIZE
                if module.FAMILY.startswith("tree"):
                    assert launch.constexprs["N"] == spec.num_draft_tokens - 1 == module.NUM_NODES
                    if "STEPS" in launch.constexprs:
                        assert launch.constexprs["STEPS"] == programs.tree_max_depth(spec)
                else:
                    assert launch.constexprs["K"] == spec.num_steps == module.NUM_STEPS
                assert 0 <= int(out.accepted_len[0]) <= spec.num_draft_tokens - 1
                seen.add((launch.kernel, tuple(sorted((k, v) for k, v in launch.constexprs.items()
                                                       if k in ("K", "N", "STEPS")))))
    # several specializations of the chain kernels (κ = 0..4) and both tree kernels ran
    assert {c for k, c in seen if k == "greedy_kernel"} >= {(("K", k),) for k in range(5)}
    assert {c for k, c in seen if k == "rejection_kernel"} >= {(("K", k),) for k in range(5)}
    assert {k for k, _ in seen} >= {"greedy_kernel", "rejection_kernel", "tree_greedy_kernel", "tree_rejection_kernel"}


@needs_triton
def test_a_narrower_ragged_step_runs_the_module_at_its_width(artifacts):
    """The CPU's ragged eager step verifies only up to its widest row: the state's module runs the
    kernel compiled for that narrower κ (no generic path)."""
    art = artifacts[0]
    module = art.kernels["greedy_verify_w4_v49152"]
    with record_launches() as log:
        out = module.verify(torch.zeros(2, 1, dtype=torch.int64), torch.randn(2, 2, V), backend="triton")
    assert [(x.kernel, x.constexprs["K"], x.constexprs["V"]) for x in log] == [("greedy_kernel", 1, V)]
    assert out.output_tokens.shape == (2, 2)


@needs_triton
def test_a_specialized_module_refuses_other_sizes(artifacts):
    art = artifacts[0]
    module = art.kernels["greedy_verify_w3_v49152"]
    with pytest.raises(ValueError, match="greedy_verify_w3_v49152: draft_tokens"):
        module.verify(torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 4, V), backend="triton")
    with pytest.raises(ValueError, match="vocabulary of 49152 entries, got scores over 8"):
        module.verify(torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 3, 8), backend="triton")
    from specc.kernels.verify_triton import greedy_verify_triton

    with pytest.raises(ValueError, match="K = 2"):
        greedy_verify_triton(torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 4, V), num_steps=2)
    with pytest.raises(ValueError, match="V = 8"):
        greedy_verify_triton(torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 3, V), num_steps=2, vocab_size=8)


test_in_fresh_process = fresh_process_test(__file__, timeout=900)
