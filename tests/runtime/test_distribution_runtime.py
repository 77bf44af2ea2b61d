"""Sampled speculative output follows the target distribution. Marked slow (~4 min here).

On a 16-token random model, the empirical distribution of each of the first four generated tokens
(the first from prefill, the rest from speculative steps with κ = 3, where drafts are accepted,
rejected and resampled) must be within total variation 0.01 of the exact distribution of plain
sampling, computed by enumerating every context (16³ of them) through the target: at temperature
0.5 and 1.0 with top-p 0.9, for one-hot q (greedy drafts) and probabilistic q.
"""
import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.kernels import process_logits
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, tiny_llama

pytestmark = pytest.mark.slow

V = 16
PROMPT = [3, 7, 1]
NEW = 4            # generated tokens per request whose marginals are checked
K = 3              # κ
N = 1 << 16        # requests per configuration
ROWS = 8192        # batch bucket


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=3, vocab_size=V, num_layers=1, hidden_size=32, max_model_len=32, std=0.5)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, noise=0.25, seed=4)


@torch.inference_mode()
def exact_marginals(model, temperature, top_p, steps=NEW):
    """Exact distribution ``[steps, V]`` of each generated token under plain sampling, by enumeration
    of all ``V**j`` contexts (joint probability carried along)."""
    model.setup_cache(V ** (steps - 1), 16)
    joint = torch.ones(1)                         # [V^j] probability of each generated prefix
    contexts = torch.tensor([PROMPT])             # [V^j, P + j]
    out = []
    for _ in range(steps):
        n, length = contexts.shape
        pos = torch.arange(length).expand(n, length)
        logits, _ = model.forward(contexts, pos, logits_at=torch.full((n, 1), length - 1))
        probs = process_logits(logits, torch.full((n,), temperature), None, torch.full((n,), top_p))[:, 0]  # [n, V]
        out.append((joint[:, None] * probs).sum(0))
        joint = (joint[:, None] * probs).reshape(-1)
        contexts = torch.cat([contexts.repeat_interleave(V, 0), torch.arange(V).repeat(n)[:, None]], dim=1)
    return torch.stack(out)                       # [steps, V]


def empirical_marginals(runtime, temperature, top_p, n=N):
    reqs = [Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=NEW, temperature=temperature, top_p=top_p))
            for _ in range(n)]
    outs = runtime.generate(reqs, batch_size=ROWS)
    toks = torch.tensor([o.token_ids for o in outs])  # [n, NEW]
    assert toks.shape == (n, NEW)
    return torch.stack([torch.bincount(toks[:, j], minlength=V).float() / n for j in range(NEW)])  # [NEW, V]


def tv(p, q):
    return 0.5 * (p - q).abs().sum(-1)  # [steps]


def _runtime(target, draft, k, sampling, seed):
    spec = StateSpec(f"b{ROWS}_k{k}", "draft_model" if k else "none", ROWS, k, num_draft_tokens=k + 1,
                     verify_rule="standard", draft_sampling=sampling)
    drafter = DraftModelDrafter(draft, V) if k else None
    return Runtime(target, None, drafter, [spec], max_model_len=16, seed=seed, prefill_chunk=1 << 15)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_speculative_sampling_matches_target(target, draft, temperature, sampling):
    exact = exact_marginals(target, temperature, 0.9)
    # the draft really differs from the target, so copying drafts through would fail this test
    assert tv(exact, exact_marginals(draft, temperature, 0.9)).max() > 0.05
    rt = _runtime(target, draft, K, sampling, seed=11)
    emp = empirical_marginals(rt, temperature, 0.9)
    m = rt.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # both accept and reject paths taken
    assert tv(emp, exact).max() < 0.01, (tv(emp, exact), m.acceptance_rate)


def test_plain_sampling_matches_target(target):
    exact = exact_marginals(target, 1.0, 0.9)
    rt = _runtime(target, None, 0, "greedy", seed=5)
    emp = empirical_marginals(rt, 1.0, 0.9)
    assert tv(emp, exact).max() < 0.01


def test_seeded_requests_reproducible_across_batches(target, draft):
    """A request with its own seed samples the same tokens alone or inside a batch."""
    rt = _runtime(target, draft, K, "probabilistic", seed=0)
    reqs = [Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=8, temperature=1.0, seed=100 + i))
            for i in range(6)]
    together = [o.token_ids for o in rt.generate(reqs, batch_size=6)]
    alone = [rt.generate([r])[0].token_ids for r in reqs]
    assert together == alone
    assert len({tuple(t) for t in together}) > 1


# ------------------------------------------------------------------ under the load-aware schedules
def _schedule_runtime(target, draft, schedule, cost_table=None, sampling="probabilistic", seed=13):
    from specc.plan.schema import MethodConfig, Plan, VerifyConfig
    from specc.compiler.build import plan_runtime

    plan = Plan(method=MethodConfig(name="draft_model", num_steps=K),
                verify=VerifyConfig(rule="standard", draft_sampling=sampling), schedule=schedule)
    return plan_runtime(plan, target, None, DraftModelDrafter(draft, V), cost_table=cost_table,
                        max_model_len=16, seed=seed, prefill_chunk=1 << 15)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_sampling_under_the_adaptive_controller_matches_target(target, draft, temperature):
    """κ switches between 0, 1 and 3 after every verify (warm-up 0, interval 1) while requests are
    mid-sequence; the sampled tokens still follow the target's distribution."""
    from specc.plan.schema import BucketConfig, ScheduleConfig

    sched = ScheduleConfig(kind="adaptive", warmup_batches=0, update_interval=1, capture_batch_sizes=[ROWS],
                           buckets={1: BucketConfig([0, 1, 3], down_hysteresis=0.3, up_hysteresis=-0.3)})
    rt = _schedule_runtime(target, draft, sched)
    emp = empirical_marginals(rt, temperature, 0.9)
    m = rt.metrics
    assert m.num_kappa_switches >= 2 and len(m.kappa_steps) >= 2, m.kappa_steps
    assert tv(emp, exact_marginals(target, temperature, 0.9)).max() < 0.01


@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_sampling_under_budgeted_verification_matches_target(target, draft, sampling):
    """A verify cost linear in tokens makes the budget admit only part of the drafts (ragged verify);
    the sampled tokens still follow the target's distribution (probabilistic drafts are admitted from
    the previous step's confidences, greedy drafts from their own)."""
    from specc.plan.schema import ScheduleConfig

    table = {"verify_ms": {"1": 0.01, "40000": 400.0}, "capture_limit": 1}
    sched = ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="t.json", capture_batch_sizes=[ROWS])
    rt = _schedule_runtime(target, draft, sched, cost_table=table, sampling=sampling)
    emp = empirical_marginals(rt, 1.0, 0.9)
    m = rt.metrics
    drafts_per_step = m.num_draft_tokens / max(1, m.num_steps)
    assert 0.2 * K < drafts_per_step < 0.9 * K, drafts_per_step  # really trimmed, not all or nothing
    assert tv(emp, exact_marginals(target, 1.0, 0.9)).max() < 0.01


# ------------------------------------------------------------------ the MTP family
@pytest.mark.parametrize("method", ["mtp", "multi_layer_eagle", "frozen_kv_mtp"])
def test_mtp_family_sampling_matches_target(target, method):
    """MTP (one layer, recurrent), multi-layer EAGLE (one module per step) and frozen-KV MTP (the
    assistant over the target's KV), each with probabilistic drafts over a 12-token draft vocabulary
    (q scattered into the target's 16 ids): the sampled tokens follow the target's distribution."""
    from tests.mtp_family_support import drafter_for, random_model

    model = random_model(method, target, layers=K, draft_vocab=12, seed=7, scale=0.3)
    spec = StateSpec(f"b{ROWS}_k{K}", method, ROWS, K, num_draft_tokens=K + 1, verify_rule="standard",
                     draft_sampling="probabilistic")
    rt = Runtime(target, None, drafter_for(method, model, target, K), [spec], max_model_len=16, seed=17,
                 prefill_chunk=1 << 15)
    emp = empirical_marginals(rt, 1.0, 0.9)
    m = rt.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # both accept and reject paths taken
    assert tv(emp, exact_marginals(target, 1.0, 0.9)).max() < 0.01, (tv(emp, exact_marginals(target, 1.0, 0.9)),
                                                                     m.acceptance_rate)
