"""Tree rejection sampling follows the target distribution (marked slow, like test_distribution_runtime).

On the same 16-token random model, the empirical distribution of each of the first four generated
tokens under tree speculation (accepted paths, rejected siblings, bonus tokens from residuals) must be
within total variation 0.01 of the exact distribution of plain sampling (enumeration of all contexts),
at temperature 0.5 and 1.0 with top-p 0.9:

* a dynamic EAGLE-2 style tree (topk 3, κ = 3) of greedy drafts (one-hot q), and
* a static tree with probabilistic drafts (children drawn without replacement from q),

while the shortcut rule "accept each sibling with min(1, p(x)/q(x)) against the node's original p,
bonus from p without the tried siblings" (``specc.runtime.testing.shortcut_tree_rejection``) run
through the same runtime on the same trees is measurably off (TV > 0.02).
"""
import pytest
import torch

from specc.plan.schema import MethodConfig, Plan, ScheduleConfig, VerifyConfig
from specc.runtime import stages
from specc.compiler.build import plan_runtime
from specc.runtime.testing import CopyTreeDrafter, perturbed_copy, shortcut_tree_rejection

from tests.runtime.test_distribution_runtime import ROWS, empirical_marginals, exact_marginals, target, tv  # noqa: F401

pytestmark = pytest.mark.slow

TREES = {
    "dynamic_greedy_q": (MethodConfig(name="eagle", num_steps=3, topk=3, num_draft_tokens=8), "greedy"),
    "static_full_q": (MethodConfig(name="eagle", tree_choices=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
                      "probabilistic"),
}


@pytest.fixture(scope="module")
def tree_draft(target):
    """A closer draft than the chain test's (noise 0.05): depth-2 paths get accepted often."""
    return perturbed_copy(target, noise=0.05, seed=4)


def _runtime(target, draft, tree, seed):
    method, sampling = TREES[tree]
    plan = Plan(method=method, verify=VerifyConfig(rule="standard", draft_sampling=sampling),
                schedule=ScheduleConfig(capture_batch_sizes=[ROWS]))
    return plan_runtime(plan, target, None, CopyTreeDrafter(draft, max_rows=ROWS * 3), max_model_len=16,
                        seed=seed, prefill_chunk=1 << 15)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_tree_sampling_matches_target_and_the_shortcut_does_not(target, tree_draft, tree, temperature, monkeypatch):
    exact = exact_marginals(target, temperature, 0.9)
    rt = _runtime(target, tree_draft, tree, seed=17)
    emp = empirical_marginals(rt, temperature, 0.9)
    m = rt.metrics
    assert m.acceptance_per_pos[1] > 0.1  # paths of depth 2 are accepted: the tree takes part
    assert tv(emp, exact).max() < 0.01, (tv(emp, exact), m.acceptance_per_pos)
    monkeypatch.setattr(stages, "tree_rejection_verify", shortcut_tree_rejection)
    bad = empirical_marginals(_runtime(target, tree_draft, tree, seed=17), temperature, 0.9, n=1 << 14)
    assert tv(bad, exact).max() > 0.02, tv(bad, exact)
