"""Sampled output of parallel (block) drafting follows the target distribution under the standard and
the block verify rule. Marked slow.

Same harness as tests/runtime/test_distribution_runtime.py: on a 16-token random target, the empirical
distribution of each of the first four generated tokens (prefill, then steps with a γ = 3 block
that is accepted, cut and resampled) must be within total variation 0.01 of the exact distribution
of plain sampling (enumerated), at temperature 0.5 and 1.0 with top-p 0.9. The drafter is a random
DSpark draft (one non-causal pass + a vanilla Markov head walked left to right) drawing its tokens
from q = the processed distribution of its corrected logits, and a DFlash draft with greedy
(one-hot) drafts.
"""
import pytest
import torch

from specc.methods.dflash.drafter import BlockDrafter
from specc.methods.dflash.model import random_block_drafter
from specc.runtime.engine import Runtime
from specc.runtime.state import StateSpec

from tests.runtime.test_distribution_runtime import K, ROWS, V, empirical_marginals, exact_marginals, tv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    from specc.runtime.testing import tiny_llama

    torch.set_num_threads(1)
    return tiny_llama(seed=3, vocab_size=V, num_layers=1, hidden_size=32, max_model_len=32, std=0.5)


def _runtime(target, kind, rule, sampling, seed):
    model = random_block_drafter(target, kind=kind, block_size=K + 1, target_layer_ids=[0], mask_token_id=V - 1,
                                 markov_rank=4 if kind == "dspark" else 0, seed=5, std=0.4)
    spec = StateSpec(f"b{ROWS}_k{K}_{rule}_parallel", kind, ROWS, K, num_draft_tokens=K + 1, verify_rule=rule,
                     draft_sampling=sampling, parallel=True)
    return Runtime(target, None, BlockDrafter(model), [spec], max_model_len=16, seed=seed, prefill_chunk=1 << 15)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
@pytest.mark.parametrize("rule", ["standard", "block"])
def test_block_drafts_sampled_match_target(target, rule, temperature):
    exact = exact_marginals(target, temperature, 0.9)
    rt = _runtime(target, "dspark", rule, "probabilistic", seed=21)
    emp = empirical_marginals(rt, temperature, 0.9)
    m = rt.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # accept, cut and resample paths all taken
    assert tv(emp, exact).max() < 0.01, (tv(emp, exact), m.acceptance_rate)


def test_block_rule_with_one_hot_block_drafts_matches_target(target):
    exact = exact_marginals(target, 1.0, 0.9)
    rt = _runtime(target, "dflash", "block", "greedy", seed=22)
    emp = empirical_marginals(rt, 1.0, 0.9)
    assert 0 < rt.metrics.num_accepted_tokens < rt.metrics.num_draft_tokens
    assert tv(emp, exact).max() < 0.01, tv(emp, exact)
