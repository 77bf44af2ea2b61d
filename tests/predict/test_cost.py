"""specc.predict.cost reproduces the numbers of two textbook worked examples, from the formulas.

The chain/parallel example: Llama-3-8B target with a 1B-class draft on an H100 (c = 0.165, κ = 3,
α = 0.70; E and S from Leviathan et al. 2023, arXiv:2211.17192). The batch example: the roofline
step of an 8B bf16 target on an H100 at 0.8 of its bandwidth and 0.5 of its compute with a
0.25 ms draft head. Expected values are the examples' printed numbers, with the tolerance their
rounding implies; nothing here is copied from specc's own output.
"""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specc.predict import cost
from specc.errors import PlanError

# the chain/parallel worked example: c = 0.165, κ = 3, α = 0.70.
C, K, ALPHA = 0.165, 3, 0.70


# ---------------------------------------------------------------- the chain/parallel example

def test_expected_tokens_section_6_2():
    assert cost.expected_tokens(ALPHA, K) == pytest.approx(2.533, abs=5e-4)
    assert cost.expected_tokens(0.35, K) == pytest.approx(1.515375, abs=1e-9)  # line 44
    assert cost.expected_tokens(1.0, K) == K + 1
    assert cost.expected_tokens(0.5, 0) == 1.0
    closed = (1 - ALPHA ** (K + 1)) / (1 - ALPHA)
    assert cost.expected_tokens(ALPHA, K) == pytest.approx(closed)


def test_chain_and_parallel_speedups():
    assert cost.step_cost_chain(K, C) == pytest.approx(1.495)
    assert cost.step_cost_parallel(K, C) == pytest.approx(1.165)
    assert round(cost.speedup_chain(ALPHA, K, C), 2) == 1.69
    assert round(cost.speedup_chain(ALPHA, K, C), 3) == 1.694  # "the chain's 1.694", line 44
    assert round(cost.speedup_parallel(ALPHA, K, C), 2) == 2.17


def test_thresholds_and_half_acceptance():
    # Beating no speculation: E(α, 3) > 1.165 gives α ≈ 0.142.
    assert cost.alpha_to_beat_plain(K, C, parallel=True) == pytest.approx(0.142, abs=1e-3)
    # Beating the chain: E(α,3)/1.165 > 2.533/1.495 gives α ≈ 0.536 (by bisection,
    # 0.53 < α < 0.54).
    chain = cost.speedup_chain(ALPHA, K, C)
    a = cost.alpha_to_beat(chain, K, C, parallel=True)
    assert 0.53 < a < 0.54 and a == pytest.approx(0.536, abs=2e-3)
    assert cost.speedup_parallel(a, K, C) == pytest.approx(chain, abs=1e-12)
    # At α = 0.35 the parallel speedup is 1.515375/1.165 ≈ 1.301, below the chain.
    assert round(cost.speedup_parallel(0.35, K, C), 3) == 1.301
    assert cost.speedup_parallel(0.35, K, C) < chain


def test_break_even_and_s_infinity():
    t_star = 295
    assert cost.break_even_batch(ALPHA, K, C, t_star) == pytest.approx(150, abs=1)
    assert cost.break_even_batch(ALPHA, K, C, t_star, parallel=True) == pytest.approx(175, abs=1)
    assert round(cost.s_infinity(ALPHA, K, C, parallel=True), 2) == 0.61
    assert cost.break_even_batch(ALPHA, 0, C, t_star) == math.inf
    # S∞ < 1 for every κ ≥ 1 and α < 1 (the theorem, line 46)
    for k in range(1, 9):
        for a in (0.1, 0.5, 0.9, 0.99):
            assert cost.s_infinity(a, k, C) < 1 and cost.s_infinity(a, k, C, parallel=True) < 1


def _saturating_speedup(batch, e, width, draft, t_star):
    """The saturating model written out independently: per step plain decode costs
    max(1, B/T*) and yields B; speculation costs max(1, B·W/T*) + draft and yields B·E."""
    return (batch * e / (max(1.0, batch * width / t_star) + draft)) / (batch / max(1.0, batch / t_star))


def test_break_even_is_the_root_of_the_saturating_model():
    t_star = 295
    for a, k, c in ((0.7, 3, 0.165), (0.5, 5, 0.05), (0.9, 7, 0.02)):
        e = cost.expected_tokens(a, k)
        be = cost.break_even_batch(a, k, c, t_star)
        assert e - k * c >= 1 and be >= 1
        # speculation pays just below the break-even batch and stops paying just above it
        assert _saturating_speedup(be * 0.99, e, k + 1, k * c, t_star) > 1
        assert _saturating_speedup(be * 1.01, e, k + 1, k * c, t_star) < 1


def test_break_even_is_zero_when_speculation_never_pays():
    t_star = 295
    # α = 0: E = 1, chain cost 1 + 3·0.165 = 1.495 → speedup 0.67 < 1 at batch 1. The bare formula
    # would give 295·(1 − 0.495)/4 ≈ 37 (> 1) although speculation pays at no batch size.
    for a, k, c, parallel in ((0.0, 3, C, False), (0.0, 3, C, True), (0.3, 3, 0.5, False), (0.9, 3, 1e9, False)):
        e = cost.expected_tokens(a, k)
        d = c if parallel else k * c
        assert e - d < 1
        assert cost.break_even_batch(a, k, c, t_star, parallel=parallel) == 0.0
        assert all(_saturating_speedup(b, e, k + 1, d, t_star) < 1 for b in (1, 2, 10, 37, 100, 295, 5000))
    # c = 0 is fine (a free drafter); negative or non-finite c is rejected
    assert cost.break_even_batch(0.7, 3, 0.0, t_star) == pytest.approx(295 * 2.533 / 4, rel=1e-3)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="c must be finite"):
            cost.break_even_batch(0.7, 3, bad, t_star)


def test_predict_break_even_agrees_with_speedup():
    from specc.predict.analyze import analyze
    from specc.plan.schema import MethodConfig, Plan, ScheduleConfig

    plan = Plan(method=MethodConfig(name="eagle3", num_steps=3, topk=1),
                schedule=ScheduleConfig(capture_batch_sizes=[1]))
    for a, c in ((0.0, C), (0.7, C), (0.7, 1e9), (0.2, 0.3), (1.0, 0.0)):
        (p,) = analyze(plan, alpha=a, c=c, hardware="h100").predictions.values()
        assert (p.speedup >= 1) == (p.break_even_batch >= 1), (a, c, p.speedup, p.break_even_batch)
    with pytest.raises(PlanError, match="--c"):
        analyze(plan, alpha=0.7, c=-1.0, hardware="h100")


def test_h100_profile_gives_t_star_295():
    hw = cost.load_hardware_profile("h100")
    # bf16: 2 bytes and 2 FLOPs per parameter -> T* = peak FLOPs / bandwidth ≈ 295 (zoo line 46)
    assert cost.saturation_tokens(hw, 2.0, effective=False) == pytest.approx(295, abs=1)


def test_alpha_for_expected_tokens_inverts_e():
    for a in (0.1, 0.42, 0.8):
        assert cost.alpha_for_expected_tokens(cost.expected_tokens(a, 4), 4) == pytest.approx(a, abs=1e-9)
    with pytest.raises(ValueError):
        cost.alpha_for_expected_tokens(9.0, 3)


def test_tree_costs_and_yield():
    # a chain written as a static tree has exactly E(α, κ)
    chain = [(0,) * d for d in range(1, K + 1)]
    assert cost.tree_expected_tokens(chain, ALPHA) == pytest.approx(cost.expected_tokens(ALPHA, K))
    # adding siblings can only add expected tokens
    assert cost.tree_expected_tokens(chain + [(1,)], ALPHA) > cost.expected_tokens(ALPHA, K)
    assert cost.tree_pool_size(5, 4) == 4 + 4 * 16  # topk + (κ-1)·topk², SGLang eagle_worker_v2.py:742-919
    assert cost.step_cost_tree(K, 4, C, 8) == pytest.approx(cost.step_cost_chain(K, C))
    # with a saturation point a wide verify costs more than one memory-bound pass
    assert cost.step_cost_tree(K, 4, C, 64, saturation_tokens=16) == pytest.approx(4 + C * (1 + 1 + 1))
    # dynamic tree with width κ+1 and topk 1 is the chain
    assert cost.dynamic_tree_expected_tokens(ALPHA, K, 1, K + 1) == pytest.approx(cost.expected_tokens(ALPHA, K))


# ---------------------------------------------------------------- the batch (roofline) example

SEED_TABLE = {  # batch: (plain tok/s, best κ chain, chain ×, best κ block, block ×)
    1: (168, 8, 3.24, 8, 4.15),
    32: (5360, 5, 2.95, 5, 3.41),
    128: (21440, 1, 1.26, 1, 1.26),
    512: (30906, 0, 1.00, 0, 1.00),
}


def seed_model():
    """The batch example's constants: 8B bf16 on an H100 at 0.8 / 0.5 efficiency, T_DRAFT 0.25 ms."""
    return cost.BatchModel(weight_bytes=16e9, bandwidth=3.35e12 * 0.8, flops_per_token=2 * 8e9,
                           flops=989e12 * 0.5, draft_time=0.25e-3)


@pytest.mark.parametrize("model_fn", [
    seed_model,
    lambda: cost.batch_model_from_hardware(cost.load_hardware_profile("h100"), 8e9, 2.0, 0.25e-3),
], ids=["seed-constants", "h100-profile"])
def test_batch_table(model_fn):
    model = model_fn()
    for batch, (plain, k_chain, x_chain, k_block, x_block) in SEED_TABLE.items():
        base = cost.batch_throughput(batch, 0, 0.8, model)
        assert round(base) == plain
        kc, tc = cost.best_num_steps(batch, 0.8, model, parallel=False, max_steps=8)
        kb, tb = cost.best_num_steps(batch, 0.8, model, parallel=True, max_steps=8)
        assert (kc, kb) == (k_chain, k_block)
        assert f"{tc / base:.2f}" == f"{x_chain:.2f}"
        assert f"{tb / base:.2f}" == f"{x_block:.2f}"


def _seed_confidences(rng_raw, batch, k=7):
    """The batch example's confidences, bit for bit: torch.manual_seed(0); torch.rand(batch, K) is MT19937
    (seeded like numpy's legacy RandomState) with float = (word & 2^24-1) · 2^-24, in float32."""
    u = ((rng_raw.random_raw(batch * k) & ((1 << 24) - 1)).astype(np.float64) * 2.0 ** -24).astype(np.float32)
    u = u.reshape(batch, k)
    base = np.concatenate([np.full((batch // 2, k), 0.9, np.float32),
                           np.full((batch - batch // 2, k), 0.55, np.float32)])
    conf = base * (u * np.float32(0.2) + np.float32(0.9))
    return np.minimum(conf, np.float32(0.99))


def test_budgeted_verification_table():
    """The batch example's budgeted verification (vLLM's survival-probability budget,
    adaptive_verification.py:305-373): 112, 57 and 7 positions admitted at batch 16, 128 and 512,
    with the example's throughputs."""
    model = seed_model()
    bitgen = np.random.MT19937()
    bitgen._legacy_seeding(0)
    expected = {  # batch: (admitted, accurate mean, inaccurate mean, none, verify-all, adaptive)
        16: (112, 7.0, 7.0, 2680, 10104, 10104),
        128: (57, 0.9, 0.0, 21440, 15182, 29053),
        512: (7, 0.0, 0.0, 30906, 15146, 30448),
    }
    for batch, (n, acc, inacc, none, fixed, adaptive) in expected.items():
        conf = _seed_confidences(bitgen, batch)
        sel = cost.select_verify_budget(conf, model.step_time, draft_time=model.draft_time)
        assert sel.budget == n
        adm = np.array(sel.admitted)
        assert f"{adm[:batch // 2].mean():.1f}" == f"{acc:.1f}"
        assert f"{adm[batch // 2:].mean():.1f}" == f"{inacc:.1f}"
        assert round(sel.rate) == pytest.approx(adaptive, abs=1)
        survival = np.cumprod(conf.astype(np.float64), axis=1)
        assert round(batch / model.step_time(batch)) == none
        verify_all = (batch + survival.sum()) / (model.draft_time + model.step_time(batch * 8))
        assert round(verify_all) == pytest.approx(fixed, abs=1)


def test_budget_ties_prefer_earlier_position():
    # scores [0.5, 0.5]: a plain top-1 may pick position 1 without position 0 (zoo line 405)
    ls = cost.log_survival([[0.5, 1.0]])
    order = cost.admission_order(ls)
    assert list(order) == [0, 1]
    # zero confidence: nothing after it can outrank the prefix
    ls = cost.log_survival([[0.0, 1.0, 1.0], [0.3, 0.0, 1.0]])
    mask = cost.admitted_mask(cost.admission_order(ls), 4, ls.shape)
    assert cost.is_prefix_admission(mask)


def test_log_survival_does_not_underflow():
    conf = np.full((2, 400), 1e-3)  # linear product underflows to 0 after ~108 positions
    ls = cost.log_survival(conf)
    assert np.isfinite(ls).all()
    assert (np.diff(ls, axis=1) < 0).all()


def test_log_survival_rejects_bad_input():
    with pytest.raises(ValueError):
        cost.log_survival([[0.5, float("nan")]])
    with pytest.raises(ValueError):
        cost.log_survival([[1.5]])
    with pytest.raises(ValueError):
        cost.log_survival([0.5, 0.5])


confidence_value = st.one_of(st.sampled_from([0.0, 1.0, 0.5, 1e-300, 5e-324, 0.9999999999]),
                             st.floats(min_value=0.0, max_value=1.0, allow_nan=False))


@settings(max_examples=100, deadline=None)
@given(data=st.data(), rows=st.integers(1, 6), cols=st.integers(1, 8),
       per_token=st.floats(0.0, 2.0), floor=st.floats(1e-3, 10.0), draft=st.floats(0.0, 5.0))
def test_survival_budget_always_admits_a_prefix(data, rows, cols, per_token, floor, draft):
    """Every budget — the chosen one and every other — admits a prefix of each request, under ties,
    zeros, ones and underflow."""
    conf = np.array(data.draw(st.lists(st.lists(confidence_value, min_size=cols, max_size=cols),
                                       min_size=rows, max_size=rows)))
    sel = cost.select_verify_budget(conf, lambda n: floor + per_token * n, draft_time=draft)
    assert 0 <= sel.budget <= rows * cols
    assert sum(sel.admitted) == sel.budget
    order = cost.admission_order(cost.log_survival(conf))
    for b in range(rows * cols + 1):
        assert cost.is_prefix_admission(cost.admitted_mask(order, b, conf.shape))
    mask = np.arange(cols)[None, :] < np.array(sel.admitted)[:, None]
    assert (mask == cost.admitted_mask(order, sel.budget, conf.shape)).all()


# ---------------------------------------------------------------- profiles and cost tables

def test_hardware_profiles_load():
    for name in ("h100", "h200", "cpu"):
        hw = cost.load_hardware_profile(name)
        assert hw.bandwidth > 0 and hw.peak_flops > 0 and hw.source
    cpu = cost.load_hardware_profile("cpu")
    assert cpu.effective_bandwidth == pytest.approx(35e9) and cpu.effective_flops == pytest.approx(150e9)
    with pytest.raises(PlanError, match="schedule.hardware.*h100"):
        cost.load_hardware_profile("tpu9000")


def test_cost_table_step_function(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"format": "specc-cost-table/1", "device": "cpu",
                                "capture_sizes": [1, 2, 4, 8],
                                "verify_ms": {"1": 10, "2": 11, "4": 10.5, "8": 14, "16": 20, "32": 30},
                                "draft_ms": {"1": 1.0, "8": 2.0}}))
    t = cost.load_cost_table(str(path))
    assert t.step_ms(1) == 10
    assert t.step_ms(3) == 11  # pads up to the captured size 4, whose cost was made monotone (11)
    assert t.step_ms(5) == 14 and t.step_ms(8) == 14  # step function up to the capture limit
    assert t.step_ms(24) == pytest.approx(25)  # linear between 16 and 32 (above the limit)
    assert t.step_ms(64) == pytest.approx(50)  # extrapolated from the last two points
    assert t.draft_pass_ms(4) == 2.0
    m = cost.batch_model_from_table(t)
    assert m.step_time(3) == pytest.approx(0.011)


def test_cost_table_errors_name_the_field(tmp_path):
    with pytest.raises(PlanError, match="schedule.cost_table.*not found"):
        cost.load_cost_table(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"step": 1}')
    with pytest.raises(PlanError, match="schedule.cost_table.*verify_ms"):
        cost.load_cost_table(str(bad))


def test_predict_parallel_and_plain_states():
    from specc.predict.analyze import analyze
    from specc.plan.schema import MethodConfig, Plan, ScheduleConfig

    plan = Plan(method=MethodConfig(name="dspark", num_steps=1, topk=1, block_size=3),
                schedule=ScheduleConfig(capture_batch_sizes=[1]))
    (p,) = analyze(plan, alpha=ALPHA, c=C, hardware="h100").predictions.values()
    # a κ = 3 parallel block in the worked example: 2.17x
    assert round(p.speedup, 2) == 2.17 and p.step_cost == pytest.approx(1.165)
    t_star = cost.saturation_tokens(cost.load_hardware_profile("h100"), 2.0)
    assert p.break_even_batch == pytest.approx(t_star * (2.533 - 0.165) / 4, rel=1e-3)
    assert p.s_infinity == pytest.approx(2.533 / 4.165, rel=1e-3)
    # the block pass; its context K/V is projected from the target's hidden states, no draft-extend forward
    assert (p.draft_forward_passes, p.extend_forward_passes, p.target_forward_passes) == (1, 0, 1)
    plain = Plan(method=MethodConfig(name="none"), schedule=ScheduleConfig(capture_batch_sizes=[4]))
    (p0,) = analyze(plain, hardware="cpu").predictions.values()
    assert (p0.expected_tokens, p0.speedup, p0.break_even_batch) == (1.0, 1.0, math.inf)


def test_lookup_chain_is_priced_at_the_drafts_its_record_measured():
    """A lookup drafts only on a match: with a profiled table, a chain state's speedup@B prices a verify
    over B·(1 + d) tokens (d: the record's drafts per request and step), not B·(κ + 1)."""
    from specc.commands.explain import explain
    from specc.plan.load import load_plan
    from specc.check import resolve

    plan, _ = resolve(load_plan("smollm2_ngram", ["schedule.cost_table=specc/data/cost_tables/smollm2_135m_cpu.json"]).plan,
                      "specc")
    res = explain(plan)
    entry, model = res["inputs"].acceptance, res["inputs"].batch_model
    d = entry.drafts_per_step(4)
    assert 0.0 < d < 4.0  # the n-gram record drafted on some steps only
    for p in res["predictions"]:
        b = p.batch_size
        # one lookup per step (the table's draft stage), then the verify of the drafts it found
        want = entry.expected_tokens(4) * model.step_time(b) / (model.draft_pass_time(b)
                                                                + model.step_time(max(1, round(b * (1 + d)))))
        assert p.speedup_at_batch == pytest.approx(want, rel=1e-9)
        assert p.speedup_at_batch > entry.expected_tokens(4) * model.step_time(b) / model.step_time(b * 5)
