"""Each compiled state's accept program dispatches to its own specialized kernel.

Compiles shipped presets with several states (chains of κ = 0..4, a dynamic tree, the standard rule)
into a temporary directory, loads the artifact, and runs every state's accept program
(:func:`specc.compiler.programs.state_programs` → ``specc.runtime.stages.<fn>``) on tiny random inputs with
the Triton backend (the interpreter on a CPU). Every launch is recorded
(:func:`specc.kernels.verify_triton.record_launches`): the kernel must be the one of the state's
kernel variant, compiled for the state's own κ (``K``) or tree size (``N``, ``STEPS``), and the
function the program called must be the artifact module's ``verify``, not the generic dispatcher.
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

V = 8  # vocabulary of the random scores (the kernels read V at run time)

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
            variant = entry["kernels"]["verify"]
            module = art.kernels[variant]
            inp = _inputs(spec, entry["kernels"], gen)
            inp.all_greedy = call.fn in stages.GREEDY_RULE_ACCEPTS  # a greedy rule samples when a row does
            logits = torch.randn(1, spec.num_draft_tokens, V, generator=gen)
            if spec.num_steps == 0:
                # a κ = 0 state samples its token through the generic rule (the _kernel docstring says why)
                continue
            called = []
            real = module.verify
            module.verify = lambda *a, **kw: called.append(variant) or real(*a, **kw)
            try:
                with record_launches() as log:
                    out = getattr(stages, call.fn)(ctx, inp, logits, *call.args)
            finally:
                module.verify = real
            assert called == [variant], f"{entry['name']}: {call.fn} did not call {variant}.verify"
            assert len(log) == 1, (entry["name"], log)
            launch = log[0]
            assert launch.kernel == FAMILY_KERNEL[module.FAMILY], (entry["name"], launch)
            if module.FAMILY.startswith("tree"):
                assert launch.constexprs["N"] == spec.num_draft_tokens - 1 == module.NUM_NODES
                if "STEPS" in launch.constexprs:
                    assert launch.constexprs["STEPS"] == programs.tree_max_depth(spec)
            else:
                assert launch.constexprs["K"] == spec.num_steps == module.NUM_STEPS
            assert 0 <= int(out.accepted_len[0]) <= spec.num_draft_tokens - 1
            seen.add((launch.kernel, tuple(sorted((k, v) for k, v in launch.constexprs.items()
                                                   if k in ("K", "N", "STEPS")))))
    # several specializations of the chain kernels (κ = 1..4) and both tree kernels ran
    assert {c for k, c in seen if k == "greedy_kernel"} >= {(("K", 1),), (("K", 2),), (("K", 3),), (("K", 4),)}
    assert {k for k, _ in seen} >= {"greedy_kernel", "rejection_kernel", "tree_greedy_kernel", "tree_rejection_kernel"}


@needs_triton
def test_a_specialized_module_refuses_other_sizes(artifacts):
    art = artifacts[0]
    module = art.kernels["greedy_verify_w3"]
    with pytest.raises(ValueError, match="greedy_verify_w3"):
        module.verify(torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 4, V), backend="triton")
    from specc.kernels.verify_triton import greedy_verify_triton

    with pytest.raises(ValueError, match="K = 2"):
        greedy_verify_triton(torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 4, V), num_steps=2)


test_in_fresh_process = fresh_process_test(__file__, timeout=900)
