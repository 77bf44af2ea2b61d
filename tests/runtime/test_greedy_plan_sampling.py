"""A greedy-verify plan serves sampled requests exactly: a step with a temperature > 0 row verifies
by the standard rule (rejection sampling with one-hot q for greedy drafts), a step whose rows are all
greedy keeps the greedy kernel (``specc.runtime.stages.accept_greedy`` / ``accept_tree_greedy``).

On the 16-token random model of ``test_distribution_runtime``, the first four sampled tokens of a
greedy-verify plan (κ = 3) follow the exact distribution of plain sampling (total variation within
sampling noise of 2^14 requests), eager and with the verify program "compiled" (a stand-in for
inductor / CUDA-graph capture that records which steps it ran: the all-greedy ones only), while
temperature-0 requests in the same batches keep the greedy output token for token.
"""
import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

from tests.runtime.test_distribution_runtime import PROMPT, V, empirical_marginals, exact_marginals, tv

K = 3
ROWS = 4096
N = 1 << 14  # requests: TV noise of 16 bins is about 0.5 * 16 * sqrt(2 p (1 - p) / (pi N)) ≈ 0.01


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=3, vocab_size=V, num_layers=1, hidden_size=32, max_model_len=32, std=0.5)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, noise=0.25, seed=4)


def _greedy_plan(target, draft, seed):
    spec = StateSpec(f"b{ROWS}_k{K}_greedy", "draft_model", ROWS, K, num_draft_tokens=K + 1, verify_rule="greedy")
    rt = Runtime(target, None, DraftModelDrafter(draft, V), [spec], max_model_len=16, seed=seed,
                 prefill_chunk=1 << 15)
    assert rt.states[0].greedy_rule and rt.states[0].spec.verify_rule == "greedy"
    return rt


def _fake_compiled(state):
    """Make ``state`` run as a compiled one (static inputs, one program path) and record the
    ``all_greedy`` flag of every step the compiled program ran."""
    seen = []

    def compiled(inp):
        seen.append(inp.all_greedy)
        return state.program(inp)

    state._compiled = compiled
    return seen


@pytest.mark.parametrize("compiled", [False, True])
def test_greedy_plan_samples_the_target_distribution(target, draft, compiled):
    exact = exact_marginals(target, 1.0, 0.9)
    assert tv(exact, exact_marginals(draft, 1.0, 0.9)).max() > 0.05  # the draft really differs
    rt = _greedy_plan(target, draft, seed=21)
    seen = _fake_compiled(rt.states[0]) if compiled else None
    emp = empirical_marginals(rt, 1.0, 0.9, n=N)
    m = rt.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # drafts accepted and rejected
    assert tv(emp, exact).max() < 0.03, tv(emp, exact)
    if compiled:
        assert seen == []  # every step sampled: none ran the captured (greedy-kernel) program


@pytest.mark.parametrize("compiled", [False, True])
def test_greedy_rows_keep_the_greedy_output_beside_sampled_rows(target, draft, compiled):
    rt = _greedy_plan(target, draft, seed=0)
    seen = _fake_compiled(rt.states[0]) if compiled else None
    prompts = [PROMPT, [5, 2], [1, 1, 4, 9], [7]]
    greedy = [reference_greedy(target, p, 8) for p in prompts]
    alone = [o.token_ids for o in rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=8))
                                               for p in prompts], batch_size=4)]
    assert alone == greedy
    if compiled:
        assert seen and all(seen)  # all-greedy steps ran the compiled program
    mixed = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=8, temperature=t, seed=i))
             for i, p in enumerate(prompts) for t in (0.0, 1.0)]
    outs = [o.token_ids for o in rt.generate(mixed, batch_size=8)]
    assert outs[0::2] == greedy
    assert outs[1::2] != greedy  # the sampled rows really sampled


def test_greedy_tree_plan_samples_the_target_distribution(target):
    """A dynamic tree (topk 3, κ = 3) verified greedily samples by tree rejection sampling."""
    from specc.compiler.build import plan_runtime
    from specc.plan.schema import MethodConfig, Plan, ScheduleConfig, VerifyConfig
    from specc.runtime.testing import CopyTreeDrafter

    exact = exact_marginals(target, 1.0, 0.9)
    plan = Plan(method=MethodConfig(name="eagle", num_steps=3, topk=3, num_draft_tokens=8),
                verify=VerifyConfig(rule="greedy"), schedule=ScheduleConfig(capture_batch_sizes=[ROWS]))
    rt = plan_runtime(plan, target, None, CopyTreeDrafter(perturbed_copy(target, noise=0.05, seed=4),
                                                          max_rows=ROWS * 3),
                      max_model_len=16, seed=5, prefill_chunk=1 << 15)
    assert rt.states[-1].greedy_rule and rt.states[-1].spec.is_tree
    emp = empirical_marginals(rt, 1.0, 0.9, n=N)
    assert rt.metrics.acceptance_per_pos[1] > 0.1  # depth-2 paths accepted: the tree takes part
    assert tv(emp, exact).max() < 0.03, tv(emp, exact)
