"""Schedules as policies (specc.runtime.schedule): the adaptive controller against an independent
implementation written here from SGLang 0.5.23's ``update`` / ``_recompute_params``
(sglang/srt/speculative/adaptive_spec_params.py:187-261), the budget
selection against a brute force, vLLM's dynamic-K lookup, load-time checks, and exactness of greedy
output under every schedule while κ changes mid-request and verification is ragged."""
import itertools
import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from specc.predict import cost
from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.errors import ArtifactError
from specc.plan.schema import BucketConfig, MethodConfig, Plan, ScheduleConfig, SyntheticConfig, VerifyConfig
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.schedule import AdaptiveSlot, BudgetSchedule, make_schedule
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, reference_greedy, runtime_for_plan, tiny_llama


# ------------------------------------------------------------------ the reference controller
def reference_steps(candidates, start, trace, down_h=-0.25, up_h=0.0, ceiling=0.0, alpha=0.2, warmup=10,
                    interval=5):
    """κ after each verify, written from sglang/srt/speculative/adaptive_spec_params.py:187-261 as plain arithmetic on one slot.

    ``trace`` holds, per verify, the list of accepted drafts per request (bonus excluded)."""
    cands = sorted(set(candidates))
    k = start if start in cands else cands[len(cands) // 2]
    ema = k - 1.0
    out = []
    n = 0
    for accepted in trace:
        if not accepted:          # an empty batch changes nothing (no count either)
            out.append(k)
            continue
        n += 1
        if k > 0:
            ema = (1 - alpha) * ema + alpha * sum(accepted) / len(accepted)
        decide = n > warmup and (n - warmup) % interval == 0
        if decide:
            i = cands.index(k)
            if k == 0:
                j = min(i + 1, len(cands) - 1)
                if cands[j] > 0 and ema < 0:
                    ema = cands[j] - 1.0
                k = cands[j]
            else:
                thresholds_down = [(0.5 if c == 0 else c - 0.5) + down_h for c in cands]
                j = i
                while j > 0 and ema <= thresholds_down[j - 1]:
                    j -= 1
                if j == i:
                    while j < len(cands) - 1 and ema > cands[j] - 0.5 + up_h:
                        j += 1
                new = cands[j]
                if ceiling > 0:
                    cap = max(1, math.ceil(ema * ceiling))
                    if cap < new <= k:
                        while j > 0 and cands[j] > cap:
                            j -= 1
                        new = cands[j]
                k = new
        out.append(k)
    return out


def controller_steps(candidates, start, trace, down_h=-0.25, up_h=0.0, ceiling=0.0, alpha=0.2, warmup=10,
                     interval=5):
    slot = AdaptiveSlot(1, candidates, start, {"down_hysteresis": down_h, "up_hysteresis": up_h,
                                               "ceiling_coeff": ceiling}, alpha, warmup, interval)
    out = []
    for accepted in trace:
        slot.update(accepted)
        out.append(slot.current)
    return out


def test_worked_example_of_the_reference():
    """SGLang's default adaptive config (sglang/srt/speculative/adaptive_spec_params.py:28-53) worked through: BS1 goes 3 → 5 at batch 15, stays at 20, drops to 3 at 25;
    BS8 drops 3 → 0 at 15, probes 0 → 1 at 20, falls back 1 → 0 at 25."""
    bs1 = controller_steps([1, 3, 5, 7], 3, [[3]] * 15 + [[3, 3, 4, 3, 3]] * 5 + [[0, 1]] * 5)
    assert bs1[13] == 3 and bs1[14] == 5 and bs1[19] == 5 and bs1[24] == 3
    bs8 = controller_steps([0, 1, 3], 3, [[0, 0, 0, 0, 1]] * 25, down_h=0.0)
    assert bs8[13] == 3 and bs8[14] == 0 and bs8[19] == 1 and bs8[24] == 0


def _adversarial_traces():
    rng = random.Random(7)
    traces = []
    for _ in range(60):
        kind = rng.choice(["uniform", "threshold", "burst", "empty", "zeros", "max"])
        steps = rng.randint(1, 120)
        if kind == "uniform":
            tr = [[rng.randint(0, 7) for _ in range(rng.randint(1, 9))] for _ in range(steps)]
        elif kind == "threshold":  # means sitting on the decision thresholds (x.5 ± tiny, x.25, 0.5)
            tr = [[int(v)] * 2 + [int(v) + 1] * 2 for v in (rng.choice([0.5, 1.5, 2.25, 2.5, 4.5]) for _ in range(steps))]
        elif kind == "burst":
            tr = [[7] * 4 if (i // 10) % 2 else [0] * 4 for i in range(steps)]
        elif kind == "empty":
            tr = [[] if i % 3 == 0 else [rng.randint(0, 3)] for i in range(steps)]
        elif kind == "zeros":
            tr = [[0]] * steps
        else:
            tr = [[7]] * steps
        traces.append(tr)
    return traces


@pytest.mark.parametrize("cands,start,down,up,ceil", [
    ([1, 3, 5, 7], 3, -0.25, 0.0, 0.0), ([0, 1, 3], 3, 0.0, 0.0, 0.0), ([0, 1], 1, 0.0, 0.0, 0.0),
    ([0], 0, 0.0, 0.0, 0.0), ([0, 2, 4, 6], 5, -0.5, 0.3, 1.5), ([1, 2, 3, 4], 4, 0.0, -0.2, 0.8)])
def test_controller_equals_the_reference_on_adversarial_traces(cands, start, down, up, ceil):
    for i, trace in enumerate(_adversarial_traces()):
        for warmup, interval in ((10, 5), (0, 1), (3, 2)):
            want = reference_steps(cands, start, trace, down, up, ceil, warmup=warmup, interval=interval)
            got = controller_steps(cands, start, trace, down, up, ceil, warmup=warmup, interval=interval)
            assert got == want, (i, warmup, interval)


def test_controller_equals_the_reference_on_a_recorded_trace():
    """Accepted-draft counts recorded from a real decode (tiny target, perturbed draft, κ = 7)."""
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    draft = perturbed_copy(target, noise=0.05, seed=1)
    plan = Plan(method=MethodConfig(name="draft_model", num_steps=7),
                schedule=ScheduleConfig(capture_batch_sizes=[4]))
    rt = runtime_for_plan(plan, target, DraftModelDrafter(draft, 64))
    trace = []
    rt.schedule.observe = lambda bucket, accepted: trace.append(list(accepted))
    rt.generate([Request(prompt_ids=[i + 1, 5, 9], params=SamplingParams(max_new_tokens=80)) for i in range(4)],
                batch_size=4)
    assert len(trace) > 20 and len({a for t in trace for a in t}) > 3  # varied acceptance
    for cands, start in (([1, 3, 5, 7], 3), ([0, 1, 3], 3), ([0, 2, 7], 2)):
        assert controller_steps(cands, start, trace, warmup=2, interval=2) == \
            reference_steps(cands, start, trace, warmup=2, interval=2)


# ------------------------------------------------------------------ vLLM dynamic K and routing
def test_batch_buckets_look_k_up_by_running_requests():
    spec = {"kind": "batch_buckets", "buckets": {"1": {"candidates": [4]}, "8": {"candidates": [2]},
                                                 "32": {"candidates": [1]}}, "num_steps_cap": 3}
    states = [(b, k) for b in (1, 4, 8, 16, 64) for k in (1, 2, 3)]
    pol = make_schedule(spec, states)
    # κ by requests (floor lookup, capped at 3); the bucket by rows in use (pad up to a captured size)
    assert [pol.select(n, n) for n in (1, 3, 7, 8, 20, 33, 64)] == [
        (1, 3), (4, 3), (8, 3), (8, 2), (64, 2), (64, 1), (64, 1)]
    assert pol.select(2, 9) == (16, 3)  # two requests left in rows 0 and 8: bucket 16, κ of 2 requests


def test_missing_state_is_an_error_at_load():
    target = tiny_llama(seed=0, vocab_size=64, num_layers=1)
    spec = {"kind": "adaptive", "buckets": {"1": {"candidates": [1, 3]}}, "start_steps": 3}
    specs = [StateSpec("b1_k3", "ngram", 1, 3, num_draft_tokens=4)]  # κ = 1 is missing
    with pytest.raises(ArtifactError, match="bucket 1, κ 1"):
        Runtime(target, None, NgramDrafter(1, 3), specs, max_model_len=64, schedule=spec)


def test_budget_without_a_cost_table_is_refused():
    with pytest.raises(ArtifactError, match="cost table"):
        make_schedule({"kind": "budget", "buckets": {"1": {"candidates": [3]}}}, [(1, 3)])


# ------------------------------------------------------------------ budget: brute force
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3), cols=st.integers(1, 3), data=st.data(),
       floor=st.floats(1.0, 5.0), per_token=st.floats(0.0, 2.0), step=st.integers(1, 4))
def test_budget_equals_a_brute_force_argmax(rows, cols, data, floor, per_token, step):
    """On small cases b* equals the best of every prefix admission (a_1..a_R), the smallest b among
    equals, with a step-function verify cost as a profiled table gives."""
    grid = st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.9, 1.0])
    conf = np.array(data.draw(st.lists(st.lists(grid, min_size=cols, max_size=cols), min_size=rows, max_size=rows)))
    verify = lambda n: floor + per_token * math.ceil(n / step)  # noqa: E731
    sel = cost.select_verify_budget(conf, verify, draft_time=0.5)
    surv = np.cumprod(conf, axis=1)
    best = {}
    for adm in itertools.product(range(cols + 1), repeat=rows):
        b = sum(adm)
        gain = sum(surv[r, :a].sum() for r, a in enumerate(adm))
        rate = (rows + gain) / (0.5 + verify(rows + b))
        best[b] = max(best.get(b, -1.0), rate)
    top = max(best.values())
    want_b = min(b for b, r in best.items() if r >= top - 1e-12)
    assert sel.budget == want_b
    assert sel.rate == pytest.approx(top, rel=1e-9)


def test_budget_policy_caps_by_num_valid_and_reads_the_table():
    table = {"verify_ms": {"1": 10.0, "2": 10.0, "4": 10.0, "8": 40.0}, "draft_ms": {"1": 0.0}, "capture_limit": 8}
    pol = BudgetSchedule({"kind": "budget", "buckets": {"1": {"candidates": [3]}}, "cost_table": table,
                          "ragged_verify": "compact"}, [(1, 3), (2, 3)])
    conf = torch.tensor([[0.9, 0.9, 0.9], [0.9, 0.1, 0.9]])
    adm = pol.admit(conf, torch.tensor([3, 1]), 2)
    # 2 requests: flat cost up to 4 tokens, so 2 drafts are free; the 9th token would cost 4x
    assert adm.tolist() == [2, 0] or adm.tolist() == [1, 1]
    assert (adm <= torch.tensor([3, 1])).all()
    assert int(pol.last_budget) == 2


@pytest.mark.parametrize("seed", range(40))
def test_budget_admission_on_the_device_equals_the_cost_model(seed):
    """The runtime's device-side admission (one tensor program, no host read) admits exactly what
    ``specc.predict.cost.select_verify_budget`` selects: same b*, same prefix per request, ties and zero
    confidences included; rows without a live request (num_valid 0) get nothing."""
    from specc.predict import cost

    rng = np.random.default_rng(seed)
    rows, k = int(rng.integers(1, 7)), int(rng.integers(1, 6))
    verify = {str(n): float(x) for n, x in zip([1, 2, 4, 8, 16, 32],
                                               np.cumsum(rng.uniform(0, 6, 6)) + 10)}
    table = {"verify_ms": verify, "draft_ms": {"1": float(rng.uniform(0, 3))}, "capture_limit": 32}
    pol = BudgetSchedule({"kind": "budget", "buckets": {"1": {"candidates": [k]}}, "cost_table": table,
                          "ragged_verify": "compact"}, [(1, k), (8, k)])
    conf = rng.choice([0.0, 0.3, 0.5, 0.5, 0.9, 1.0], size=(rows, k)) if seed % 2 else rng.uniform(0, 1, (rows, k))
    num_valid = rng.integers(0, k + 1, rows)
    live = num_valid > 0
    got = pol.admit(torch.tensor(conf, dtype=torch.float32), torch.tensor(num_valid), int(live.sum()))
    conf32 = torch.tensor(conf, dtype=torch.float32).double().numpy()  # what the device sees
    sel_rows = np.flatnonzero(live)
    pos = np.arange(k)[None, :]
    c = np.where(pos < num_valid[:, None], conf32, 0.0)[sel_rows]
    want = np.zeros(rows, dtype=np.int64)
    if len(sel_rows):
        sel = cost.select_verify_budget(c, lambda n: pol.table.step_ms(n) / 1e3,
                                        draft_time=(pol.table.draft_pass_ms(len(sel_rows)) or 0) / 1e3,
                                        num_non_draft_tokens=len(sel_rows), num_emitting_requests=len(sel_rows),
                                        max_budget=int(num_valid.sum()))
        want[sel_rows] = np.minimum(sel.admitted, num_valid[sel_rows])
    assert got.tolist() == want.tolist()


# ------------------------------------------------------------------ exactness under every schedule
PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39)),
           [7, 7, 8, 7, 7, 8], list(range(40, 52)), [2, 3], [11, 12, 13, 11, 12, 13, 11]]
NEW = [30, 5, 26, 19, 33, 12, 40, 21]


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    return target, perturbed_copy(target, noise=0.03, seed=1)


@pytest.fixture(scope="module")
def references(models):
    target, _ = models
    return [reference_greedy(target, p, n) for p, n in zip(PROMPTS * 2, NEW * 2)]


def _requests():
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n), request_id=f"r{i}")
            for i, (p, n) in enumerate(zip(PROMPTS * 2, NEW * 2))]


CPU_TABLE = {"verify_ms": {str(n): 10.0 + 3.0 * n for n in range(1, 129)}, "draft_ms": {"1": 2.0, "16": 4.0},
             "capture_limit": 128}
SCHEDULES = {
    "adaptive": ScheduleConfig(kind="adaptive", warmup_batches=0, update_interval=1, capture_batch_sizes=[1, 2, 4, 16],
                               buckets={1: BucketConfig([0, 1, 3, 5], down_hysteresis=0.0),
                                        4: BucketConfig([0, 2, 4], down_hysteresis=0.0),
                                        16: BucketConfig([0, 1, 2])}),
    "batch_buckets": ScheduleConfig(kind="batch_buckets", capture_batch_sizes=[1, 2, 4, 16],
                                    buckets={1: BucketConfig([5]), 3: BucketConfig([2]), 8: BucketConfig([1])}),
    "budget": ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="cpu.json",
                             capture_batch_sizes=[1, 2, 4, 16]),
    "budget_cap_accept": ScheduleConfig(kind="budget", ragged_verify="cap_accept", cost_table="cpu.json",
                                        capture_batch_sizes=[1, 2, 4, 16]),
}


@pytest.mark.parametrize("batch_size", [1, 3, 16])
@pytest.mark.parametrize("kind", sorted(SCHEDULES))
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_greedy_output_is_exact_under_every_schedule(models, references, method, kind, batch_size):
    target, draft = models
    plan = Plan(method=MethodConfig(name=method, num_steps=4), schedule=SCHEDULES[kind])
    drafter = DraftModelDrafter(draft, 64) if method == "draft_model" else NgramDrafter(1, 3)
    rt = runtime_for_plan(plan, target, drafter, cost_table=CPU_TABLE)
    out = rt.generate(_requests(), batch_size=batch_size)  # 16 requests: refills unless batch 16
    assert [o.token_ids for o in out] == references
    m = rt.metrics
    # (the n-gram drafts of a random model rarely pay: the budget may rightly stop verifying them)
    assert m.num_accepted_tokens > 0 or (kind.startswith("budget") and method == "ngram")
    if kind == "adaptive":
        assert m.num_kappa_switches > 0 and len(m.kappa_steps) >= 2, m.kappa_steps  # κ changed mid-request
    if kind.startswith("budget") and method == "draft_model":
        assert rt.schedule.last_budget is not None


def test_budget_trims_verification_and_stays_exact(models, references):
    """A steep per-token verify cost makes the budget admit fewer drafts than were proposed: the
    drafts verified per step fall, outputs stay exact."""
    target, draft = models
    steep = {"verify_ms": {str(n): 1.0 + 50.0 * n for n in range(1, 129)}, "capture_limit": 128}
    plan = Plan(method=MethodConfig(name="draft_model", num_steps=4), schedule=SCHEDULES["budget"])
    full = runtime_for_plan(plan.__class__(method=plan.method, schedule=ScheduleConfig(capture_batch_sizes=[1, 2, 4, 16])),
                            target, DraftModelDrafter(draft, 64))
    budget = runtime_for_plan(plan, target, DraftModelDrafter(draft, 64), cost_table=steep)
    a = full.generate(_requests(), batch_size=4)
    b = budget.generate(_requests(), batch_size=4)
    assert [o.token_ids for o in a] == [o.token_ids for o in b] == references
    per_step = lambda m: m.num_draft_tokens / max(1, m.num_steps)  # noqa: E731
    assert per_step(budget.metrics) < 0.5 * per_step(full.metrics)


def test_synthetic_rule_accepts_by_its_curve(models):
    """vLLM's synthetic acceptance: L = 2.5 at κ = 4 gives unconditional rates [1, 0.5, 0, 0], so every
    step accepts 1 or 2 drafts (τ = L), whatever the tokens, even for a drafter that proposes nothing."""
    target, _ = models
    plan = Plan(method=MethodConfig(name="ngram", num_steps=4),
                verify=VerifyConfig(rule="synthetic", synthetic=SyntheticConfig(acceptance_length=2.5)),
                schedule=ScheduleConfig(capture_batch_sizes=[4]))
    rt = runtime_for_plan(plan, target, NgramDrafter(3, 3))
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=200, ignore_eos=True))
            for p in ([1, 2], [3, 4], [5, 6], [7, 8])]
    rt.generate(reqs, batch_size=4)
    per_pos = rt.metrics.acceptance_per_pos
    assert per_pos[0] > 0.99 and abs(per_pos[1] - 0.5) < 0.08 and per_pos[2] == 0.0
    assert abs(rt.metrics.tau - 2.5) < 0.1
