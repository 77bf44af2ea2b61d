"""Sampled output under suffix decoding follows the target distribution (marked slow, like
test_distribution_runtime and test_tree_distribution).

On the same 16-token random model, the empirical distribution of each of the first four generated
tokens must be within total variation 0.01 of the exact distribution of plain sampling (enumeration
of all contexts), at temperature 0.5 and 1.0 with top-p 0.9, with suffix drafts verified by the
standard rule (one-hot q: multi-candidate recursive rejection on trees), for a chain (κ = 3) and a
tree (topk 3, 8 nodes). The requests share one drafter, so its global tree fills with earlier
requests' sampled outputs (FIFO-evicted past ``max_cached_requests``) and drafts the most frequent
continuations: drafts are accepted often, rejected often, and the output must not care.
"""
import pytest

from specc.methods.suffix.drafter import SuffixDrafter
from specc.plan.schema import MethodConfig, Plan, ScheduleConfig, VerifyConfig
from specc.compiler.build import plan_runtime

from tests.runtime.test_distribution_runtime import ROWS, empirical_marginals, exact_marginals, target, tv  # noqa: F401

pytestmark = pytest.mark.slow

SHAPES = {"chain": MethodConfig(name="suffix", num_steps=3),
          "tree": MethodConfig(name="suffix", num_steps=3, topk=3, num_draft_tokens=9)}


@pytest.mark.parametrize("temperature", [0.5, 1.0])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_suffix_sampling_matches_target(target, shape, temperature):
    exact = exact_marginals(target, temperature, 0.9)
    drafter = SuffixDrafter(max_tree_depth=8, max_cached_requests=4096, max_spec_factor=4.0, min_token_prob=0.05)
    plan = Plan(method=SHAPES[shape], verify=VerifyConfig(rule="standard"),
                schedule=ScheduleConfig(capture_batch_sizes=[ROWS]))
    rt = plan_runtime(plan, target, None, drafter, max_model_len=16, seed=23, prefill_chunk=1 << 15)
    emp = empirical_marginals(rt, temperature, 0.9)
    m = rt.metrics
    assert 0.2 * m.num_draft_tokens < m.num_accepted_tokens < 0.9 * m.num_draft_tokens, m.acceptance_rate
    assert drafter.cache.evicted > 0 and drafter.num_global > 0  # the global tree drafts, and evicts
    assert tv(emp, exact).max() < 0.01, (tv(emp, exact), m.acceptance_per_pos)
