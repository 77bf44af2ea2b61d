"""`specc tune`: bad input named by option before any model loads; candidates from the method table and the
presets (a new method row is picked up as is); the cost model's predictions and the choice; the emitted
plan and its engine settings pass the engines' rules; and one whole run on a tiny model."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specc.predict import acceptance
from specc.predict import cost
from specc.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
V = 64


def run_cli(capsys, *argv):
    capsys.readouterr()
    rc = cli_main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _proc(*argv, env=None, timeout=120):
    return subprocess.run([sys.executable, "-c", "import sys; from specc.cli import main; rc = main(sys.argv[1:]); "
                           "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


# ------------------------------------------------------------------------------------------------ bad input


@pytest.fixture()
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "Say hello."}\n')
    return p


@pytest.mark.parametrize("case, argv, words", [
    ("no prompts", ["EMPTY"], ["PROMPTS", "no prompts"]),
    ("missing file", ["/nonexistent/prompts.jsonl"], ["PROMPTS", "/nonexistent/prompts.jsonl"]),
    ("directory", ["DIR"], ["PROMPTS"]),
    ("budget 0", ["OK", "--budget-min", "0"], ["--budget-min", "> 0"]),
    ("budget nan", ["OK", "--budget-min", "nan"], ["--budget-min"]),
    ("budget negative", ["OK", "--budget-min", "-3"], ["--budget-min"]),
    ("concurrency", ["OK", "--concurrency", "1,x"], ["--concurrency"]),
    ("out folder", ["OK", "--out", "/nonexistent/dir/plan.yaml"], ["--out", "does not exist"]),
    ("out suffix", ["OK", "--out", "OUTDIR/plan.txt"], ["--out", ".yaml"]),
    ("cost table", ["OK", "--cost-table", "/nonexistent/table.json"], ["--cost-table", "file not found"]),
    ("unknown method", ["OK", "--methods", "egale3"], ["--methods", "egale3", "did you mean", "eagle3"]),
    ("method with no drafter", ["OK", "--methods", "custom"], ["--methods custom", "does not fit --target smollm2_135m",
                                                                "no shipped drafter or preset uses it"]),
    ("engine refuses", ["OK", "--methods", "medusa", "--engine", "vllm"], ["--methods medusa", "--engine vllm"]),
    ("unknown target", ["OK", "--target", "llama99"], ["--target", "llama99"]),
    ("plan for another target", ["OK", "--plans", "vllm_pard"], ["--plans vllm_pard", "--target"]),
])
def test_bad_input_names_the_option(capsys, tmp_path, prompts, case, argv, words):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    (tmp_path / "d").mkdir()
    subst = {"EMPTY": empty, "DIR": tmp_path / "d", "OK": prompts, "OUTDIR/plan.txt": tmp_path / "plan.txt"}
    args = [subst.get(a, a) for a in argv]
    if "--out" not in argv:
        args += ["--out", tmp_path / "tuned.yaml"]
    rc, out, err = run_cli(capsys, "tune", *args)
    assert rc == 2, (case, out, err)
    assert err.startswith("specc tune: error: ") and "Traceback" not in err
    for w in words:
        assert w in err, (case, err)
    assert not list(tmp_path.glob("tuned*")), "nothing is written for bad input"


def test_bad_input_is_refused_before_torch_loads(tmp_path):
    res = _proc("tune", tmp_path / "missing.jsonl", "--out", tmp_path / "t.yaml")
    assert res.returncode == 2 and "PROMPTS" in res.stderr
    assert res.stdout.strip().endswith("NO-TORCH")
    res = _proc("tune", ROOT / "specc/data/prompts.jsonl", "--budget-min", "0", "--out", tmp_path / "t.yaml")
    assert res.returncode == 2 and "--budget-min" in res.stderr and res.stdout.strip().endswith("NO-TORCH")


def test_missing_prompts_argument_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["tune"])
    assert exc.value.code == 2 and "PROMPTS" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ candidates


def test_every_shipped_drafter_is_a_candidate():
    from specc.tune.candidates import discover

    cands, notes = discover()
    by = {c.name: c for c in cands}
    drafters = {Path(str(c.plan.draft.path)).name for c in cands if c.plan.draft is not None and c.plan.draft.path}
    shipped = {p.name for p in (ROOT / "specc/assets/drafters").iterdir() if p.is_dir()}
    assert shipped <= drafters, shipped - drafters
    assert "smollm2_ngram" in by and {"smollm2_adaptive", "smollm2_budget"} <= set(by["smollm2_ngram"].also)
    assert by["smollm2_eagle3_tree"].shape == "tree" and by["smollm2_eagle3_tree"].kappas == (4,)
    assert by["smollm2_dflash"].shape == "parallel" and by["smollm2_dflash"].kappas == tuple(range(1, 8))
    assert by["smollm2_eagle3"].kappas == (1, 2, 3, 4)  # measured at κ = 4 at least
    assert by["smollm2_multi_layer_eagle"].kappas == (1, 2, 3)  # one module per step, three shipped
    assert any("smollm2_serve" in n for n in notes) and any("smollm2_plain" in n for n in notes)
    # every variant the predictions cover is one the runtime's rules accept
    for c in cands:
        for k in c.kappas:
            assert c.variant(k, capture=[4]).method.num_steps == k


def test_a_new_method_row_with_a_preset_is_picked_up(tmp_path, monkeypatch):
    """One drafter module, one row of the method table, one preset: tune measures it unchanged."""
    import dataclasses
    import shutil

    from specc import methods
    from specc.tune.candidates import discover

    from specc.plan import load as plan_load

    row = dataclasses.replace(methods.METHODS["ngram"], name="ngram_twin", summary="a test twin of ngram")
    monkeypatch.setitem(methods.METHODS, "ngram_twin", row)  # the method table's row
    monkeypatch.setitem(plan_load.CHOICES, "method.name", plan_load.CHOICES["method.name"] + ("ngram_twin",))
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "method" / "ngram_twin.yaml").write_text("name: ngram_twin\nnum_steps: 3\n")
    text = (conf / "plan" / "smollm2_ngram.yaml").read_text()
    (conf / "plan" / "smollm2_ngram_twin.yaml").write_text(
        text.replace("/method: ngram", "/method: ngram_twin").replace("name: smollm2_ngram", "name: smollm2_ngram_twin"))
    monkeypatch.setenv("SPECC_CONF_DIR", str(conf))
    cands, _ = discover(method_names=["ngram_twin"])
    assert [c.method for c in cands] == ["ngram_twin"] and cands[0].name == "smollm2_ngram_twin"


# ------------------------------------------------------------------------------------------------ predictions


def _table(tmp_path):
    t = tmp_path / "table.json"
    # flat to 4 tokens, then linear (a CPU-like table): speculation pays at batch 1, not at 16
    t.write_text(json.dumps({"format": "specc-cost-table/1", "device": "cpu",
                             "verify_ms": {str(n): 30.0 * max(1.0, n / 4) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)}}))
    return cost.load_cost_table(str(t))


def _entry(rates, k, drafts=None, shape="chain"):
    steps = 1000
    per = [int(round(r * steps)) for r in rates]
    return acceptance.Entry(target="t", draft=None, key={"method": "ngram"}, shape=shape, num_steps=k, topk=1,
                            num_draft_tokens=k + 1,
                            counters={"num_steps": steps, "num_accepted_tokens_per_pos": per,
                                      "num_draft_tokens_per_pos": [int(d * steps) for d in (drafts or [1.0] * k)]},
                            rates=tuple(p / steps for p in per), rates_ci95=tuple((r, r) for r in rates),
                            tau=1 + sum(per) / steps, tau_ci95=(1, 1),
                            alpha=cost.alpha_for_expected_tokens(1 + sum(per) / steps, k))


def test_expected_tokens_from_rates_is_e_of_alpha_for_geometric_rates():
    for a in (0.2, 0.5, 0.8):
        rates = [a ** (i + 1) for i in range(6)]
        for k in range(7):
            assert cost.expected_tokens_from_rates(rates, k) == pytest.approx(cost.expected_tokens(a, k))
        # past the measured positions the tail continues geometrically
        assert cost.expected_tokens_from_rates(rates[:3], 6, a) == pytest.approx(cost.expected_tokens(a, 6))


def test_fit_linear_is_least_squares_and_non_negative():
    from specc.tune.predict import fit_linear

    f = fit_linear([1, 2, 4, 8], [3 + 2 * x for x in (1, 2, 4, 8)])
    assert (f.a, f.b) == pytest.approx((3.0, 2.0))
    assert fit_linear([4, 4], [8, 8])(8) == pytest.approx(16.0)  # one batch size: proportional
    assert fit_linear([1, 8], [10, 2]).b == 0.0  # never a negative slope
    assert fit_linear([], [])(5) == 0.0


def test_choice_follows_the_measured_acceptance(tmp_path):
    """A good drafter wins at batch 1 with a deep κ and drops to κ = 0 where the verify saturates; the
    plan's κ per bucket comes from the measurement, not a default."""
    from types import SimpleNamespace

    from specc.tune.predict import Config, Predictor, StageCosts, choose, Linear

    table = _table(tmp_path)
    cand = lambda name, ks: SimpleNamespace(name=name, kappas=ks, measure_steps=max(ks), shape="chain",  # noqa: E731
                                            plan=SimpleNamespace(method=SimpleNamespace(
                                                name="ngram", parallel_drafting=False, topk=1, tree_choices=None)))
    good = _entry([0.8, 0.64, 0.51, 0.41], 4)
    poor = _entry([0.1, 0.01, 0.0, 0.0], 4)
    costs = {None: StageCosts(), "good": StageCosts(draft=Linear(0.1, 0.05)), "poor": StageCosts(draft=Linear(0.1, 0.05))}
    pred = Predictor(table=table, candidates={"good": cand("good", (1, 2, 3, 4)), "poor": cand("poor", (1, 2, 3, 4))},
                     entries={"good": good, "poor": poor}, costs=costs)
    ch = choose(pred, [1, 4, 16, 64])
    assert ch.candidate == "good"
    assert ch.buckets[1] == 3  # 4 tokens verify at the one-token price: κ = 3 fills them
    assert ch.buckets[max(ch.buckets)] == 0  # compute-bound: nothing pays
    # the prediction is the roofline throughput B·E / step with the measured E
    bd = pred.breakdown(Config("good", 3), 1)
    assert bd["expected_tokens"] == pytest.approx(1 + 0.8 + 0.64 + 0.51)
    assert bd["tok_s"] == pytest.approx(1 * bd["expected_tokens"] / bd["step_ms"] * 1e3)
    assert bd["verify_ms"] == pytest.approx(table.step_ms(4))
    # measured throughput overrides a prediction where a run measured it
    worse = {("good", ch.buckets[1], 1): 1.0}
    assert choose(pred, [1, 4, 16, 64], measured=worse).buckets[1] != ch.buckets[1]


def test_verify_grid_interpolates_by_rows_and_width():
    """The spot grid reads R requests x W tokens: linear in width (end slope beyond the widest), linear
    in rows between measured R, proportional to rows beyond the largest."""
    from specc.tune.predict import VerifyGrid

    g = VerifyGrid({(1, 1): 10.0, (1, 3): 20.0, (4, 1): 30.0, (4, 3): 60.0})
    assert g(1, 1) == pytest.approx(10.0)
    assert g(1, 2) == pytest.approx(15.0)
    assert g(1, 5) == pytest.approx(30.0)  # past the widest: the last slope
    assert g(4, 8) == pytest.approx(45.0)  # 4 rows of width 2
    assert g(2, 4) == pytest.approx(15.0 + (45.0 - 15.0) / 3)  # between 1 and 4 rows, width 2
    assert g(8, 8) == pytest.approx(60.0)  # past the largest R: proportional to rows
    assert g(0.5, 0.5) == pytest.approx(10.0)
    # a wider verify never costs less: timing noise that says so is pooled (pool-adjacent-violators)
    noisy = VerifyGrid({(1, 1): 48.7, (1, 2): 59.7, (1, 3): 63.5, (1, 4): 55.2, (1, 6): 73.2})
    pooled = (59.7 + 63.5 + 55.2) / 3
    assert [noisy(1, w) for w in (1, 2, 3, 4, 6)] == pytest.approx([48.7, pooled, pooled, pooled, 73.2])
    assert noisy(1, 8) == pytest.approx(73.2 + 2 * (73.2 - pooled) / 2)
    flat = VerifyGrid({(1, 1): 10.0, (1, 2): 9.0})
    assert flat(1, 12) == pytest.approx(9.5) and flat(1, 1.5) == pytest.approx(9.5)
    with pytest.raises(ValueError, match="at least one"):
        VerifyGrid({})


def test_a_table_whose_shape_changed_is_replaced_by_the_spot_grid(tmp_path):
    """One factor over every shape is load (λ scales the table); a factor that varies by shape is not,
    and the predictions then use the grid — the C = 1 κ choice follows the slope measured now."""
    from types import SimpleNamespace

    from specc.tune.predict import Predictor, StageCosts, VerifyGrid, choose, table_fits

    table = _table(tmp_path)  # flat to 4 tokens
    shapes = [(r, w) for r in (1, 4, 16, 64) for w in (1, 2, 3, 4, 6, 9)]
    scaled = VerifyGrid({(r, w): 1.6 * table.step_ms(r * w) for r, w in shapes})
    fits, lo, hi = table_fits(scaled, table, 0.15)
    assert fits and lo == pytest.approx(1.6) and hi == pytest.approx(1.6)
    # the same machine now grows 12 ms per verified token from one token: flat no more
    steep = VerifyGrid({(r, w): 30.0 + 12.0 * (r * w - 1) for r, w in shapes})
    assert not table_fits(steep, table, 0.15)[0]
    cand = SimpleNamespace(name="d", kappas=(1, 2, 3, 4, 6, 8), measure_steps=8, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    entry = _entry([0.5, 0.3, 0.1, 0.05, 0.03, 0.02, 0.01, 0.01], 8)
    kw = dict(table=table, candidates={"d": cand}, entries={"d": entry}, costs={None: StageCosts(), "d": StageCosts()})
    on_table = choose(Predictor(**kw), [1])
    on_grid = choose(Predictor(grid=steep, **kw), [1])
    assert on_table.buckets[1] == 3  # the flat table fills its free tokens
    assert on_grid.buckets[1] < on_table.buckets[1]  # each token costs now: a shorter draft wins
    assert Predictor(grid=steep, **kw).breakdown(SimpleNamespace(candidate=None, num_steps=0), 4)["verify_ms"] == \
        pytest.approx(steep(4, 4))


def test_a_deeper_kappa_must_pay_by_the_margin(tmp_path):
    """Per bucket the shallowest κ within KAPPA_MARGIN of the fastest: a near tie (timing noise) keeps
    the shallower draft, κ = 0 included; a clear gain still takes the deeper one."""
    from specc.tune.predict import KAPPA_MARGIN, shallowest_within

    vals = {0: 100.0, 1: 100.5, 2: 101.0, 7: 102.9}
    assert shallowest_within(list(vals), vals.get) == 0  # 2.9 % over plain: within the margin
    vals[7] = 101.0 * (1 + KAPPA_MARGIN) * 1.01
    assert shallowest_within(list(vals), vals.get) == 7
    vals[2] = vals[7] * 0.99
    assert shallowest_within(list(vals), vals.get) == 2  # within the margin of κ = 7: the shallower
    assert shallowest_within([0, 3], {0: 1.0, 3: 1.0}.get) == 0


def test_a_bucket_kappa_must_pay_over_every_request_count_it_serves(tmp_path):
    """Under floor lookup bucket 8 sets κ for 8..15 running requests (reached while a batch of 16 fills
    or drains): a κ that pays at 8 requests but loses at 15 is not chosen there."""
    from types import SimpleNamespace

    from specc.tune.predict import Config, Predictor, StageCosts, VerifyGrid, choose, served_requests

    assert served_requests([1, 2, 4, 8, 16], 8) == [8, 15]
    assert served_requests([1, 2, 4, 8, 16], 1) == [1] and served_requests([1, 2, 4, 8, 16], 16) == [16]
    # each verified token costs 2.4 ms over a 30 ms floor: κ = 1 (τ 1.5) pays 6 % at 8 requests, loses at 15
    grid = VerifyGrid({(r, w): 30.0 + 2.4 * (r * w - 1) for r in (1, 2, 4, 8, 15, 16) for w in (1, 2, 3)})
    cand = SimpleNamespace(name="d", kappas=(1,), measure_steps=1, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    pred = Predictor(table=_table(tmp_path), grid=grid, candidates={"d": cand}, entries={"d": _entry([0.5], 1)},
                     costs={None: StageCosts(), "d": StageCosts()})
    assert pred.tok_s(Config("d", 1), 8) > 1.05 * pred.tok_s(Config(None, 0), 8)
    assert pred.tok_s(Config("d", 1), 15) < pred.tok_s(Config(None, 0), 15)
    ch = choose(pred, [1, 16])
    assert ch.per_drafter["d"][8][0] == 0
    assert ch.per_drafter["d"][1][0] == 1  # one request: the draft pays, and bucket 1 serves only it


def test_noise_between_two_plain_runs_does_not_become_a_drafters_gain(tmp_path):
    """At C = 4 the tuned plan's bucket is κ = 0: its confirming run is plain decoding with the drafter
    idle (plus a few drain steps), and measured 10 % above plain's own run (the machine's noise).
    That run informs plain decoding's factor, and a drafter's factor is taken relative to plain's
    where both ran, so κ = 1 (predicted 4 % slower at 4 requests) is not chosen on that noise; it was,
    when the run counted as the drafter's own factor."""
    from types import SimpleNamespace

    from specc.tune.confirm import Result
    from specc.tune.predict import Config, Predictor, StageCosts, VerifyGrid, choose
    from specc.tune.session import measured_values

    grid = VerifyGrid({(r, w): 30.0 + 7.3 * (r * w - 1) for r in (1, 2, 4) for w in (1, 2, 3)})
    cand = SimpleNamespace(name="d", kappas=(1,), measure_steps=1, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    pred = Predictor(table=_table(tmp_path), grid=grid, candidates={"d": cand}, entries={"d": _entry([0.5], 1)},
                     costs={None: StageCosts(), "d": StageCosts()})
    p0, p1 = pred.tok_s(Config(None, 0), 4), pred.tok_s(Config("d", 1), 4)
    assert 0.94 < p1 / p0 < 0.98
    first = choose(pred, [1, 4])
    assert first.buckets == {1: 1, 4: 0}

    def result(label, c, tok_s, steps):
        return Result(label=label, concurrency=c, decode_tok_s=tok_s, output_tok_s=tok_s, tau=1.0, mean_batch=float(c),
                      steps=sum(steps.values()), decode_s=1.0, stage_ms_per_step={}, kappa_steps=steps)

    p1_at_1 = pred.tok_s(Config(None, 0), 1)
    results = {("plain", 1): result("plain", 1, p1_at_1, {0: 50}),
               ("tuned", 1): result("tuned", 1, pred.tok_s(Config("d", 1), 1), {1: 50}),
               ("plain", 4): result("plain", 4, 0.80 * p0, {0: 50}),
               ("tuned", 4): result("tuned", 4, 0.88 * p0, {0: 30, 1: 20})}  # κ = 0 with drain steps
    measured, scale = measured_values(pred, results, {"plain": Config(None, 0)}, {"tuned": first}, [1, 4])
    assert ("d", 4) not in scale and scale[(None, 4)] == pytest.approx(0.84)
    final = choose(pred, [1, 4], measured=measured, scale=scale)
    assert final.buckets == {1: 1, 4: 0}


def test_the_confirming_runs_demote_a_bucket_that_lost(tmp_path):
    """The tuned plan's run counts as its bucket's κ when that κ ran most of its steps: a bucket whose
    run measured below plain decoding drops to κ = 0; a run whose batch drained also counts at the
    bucket its mean batch fell in; each candidate's predictions that were not run take its own
    measured over predicted factor at the nearest concurrency run."""
    from types import SimpleNamespace

    from specc.tune.confirm import Result
    from specc.tune.predict import Config, Predictor, StageCosts, choose
    from specc.tune.session import measured_values

    table = _table(tmp_path)
    cand = SimpleNamespace(name="good", kappas=(1, 2, 3, 4), measure_steps=4, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    pred = Predictor(table=table, candidates={"good": cand}, entries={"good": _entry([0.8, 0.64, 0.51, 0.41], 4)},
                     costs={None: StageCosts(), "good": StageCosts()})
    ch = choose(pred, [1, 2])
    k2 = ch.buckets[max(b for b in ch.buckets if b <= 2)]
    assert k2 > 0  # 2 rows x 2 tokens verify at the one-token price

    def result(label, tok_s, steps, batch=2.0, c=2):
        return Result(label=label, concurrency=c, decode_tok_s=tok_s, output_tok_s=tok_s, tau=1.0, mean_batch=batch,
                      steps=sum(steps.values()), decode_s=1.0, stage_ms_per_step={}, kappa_steps=steps)

    plain_at_2 = pred.tok_s(Config(None, 0), 2)
    results = {("plain", 2): result("plain", plain_at_2, {0: 100}),
               ("tuned", 2): result("tuned", 0.8 * plain_at_2, {k2: 90, 4: 10})}
    measured, scale = measured_values(pred, results, {"plain": Config(None, 0)}, {"tuned": ch}, [1, 2])
    assert measured[("good", k2, 2)] == pytest.approx(0.8 * plain_at_2)
    assert scale[(None, 2)] == pytest.approx(1.0) and scale[("good", 2)] < 1.0  # each candidate its own
    after = choose(pred, [1, 2], measured=measured, scale=scale)
    assert after.per_drafter["good"][2][0] != k2  # the measured loss replaces the prediction
    # a mixed run (no κ ran most steps) only informs the factor
    results[("tuned", 2)] = result("tuned", 0.8 * plain_at_2, {k2: 50, 4: 50})
    measured, scale = measured_values(pred, results, {"plain": Config(None, 0)}, {"tuned": ch}, [1, 2])
    assert ("good", k2, 2) not in measured and ("good", 2) in scale
    # a run whose batch drained counts at the bucket its mean batch fell in, too (brought there by the model)
    drained = {("plain", 16): result("plain", 100.0, {0: 50}, batch=12.0, c=16),
               ("good κ=1", 16): result("good κ=1", 90.0, {1: 50}, batch=12.0, c=16)}
    measured, _ = measured_values(pred, drained, {"plain": Config(None, 0), "good κ=1": Config("good", 1)}, {"tuned": ch},
                                  [1, 16])
    one = Config("good", 1)
    assert measured[("good", 1, 8)] == pytest.approx(90.0 * pred.tok_s(one, 8) / pred.tok_s(one, 12.0))
    assert measured[("good", 1, 16)] == pytest.approx(90.0 * pred.tok_s(one, 16) / pred.tok_s(one, 12.0))
    # a bucket not run takes the factor of the nearest concurrency run (log2; a tie to the smaller); κ = 0
    # (the drafter idle) and a candidate that ran nowhere take plain decoding's
    scaled = choose(pred, [1, 8], scale={("good", 1): 1.0, ("good", 8): 0.5, (None, 1): 0.9, (None, 8): 0.8})
    for b, f in ((1, 1.0), (2, 1.0), (4, 0.5), (8, 0.5)):
        k, v = scaled.per_drafter["good"][b]
        assert v == pytest.approx(pred.tok_s(Config("good", k), b) * (f if k else {1: 0.9, 2: 0.9}.get(b, 0.8)))
    plain_only = choose(pred, [1, 8], scale={(None, 1): 0.9, (None, 8): 0.8})
    k, v = plain_only.per_drafter["good"][8]
    assert v == pytest.approx(pred.tok_s(Config("good", k), 8) * 0.8)


def test_a_plan_the_confirming_runs_changed_is_run_before_it_is_emitted(tmp_path):
    """The first confirming pass measures the bucket of 2 requests losing to plain decoding, so the
    choice changes; the changed plan is run in a second pass (the plan alone: plain decoding and the
    static configurations ran in the first) and the choice made over both passes' runs. Without time
    left for a pass, the plan is emitted as predicted and the report says it was not run."""
    import time as _time
    from types import SimpleNamespace

    from specc.tune.confirm import Result
    from specc.tune.predict import Config, Predictor, StageCosts, choose
    from specc.tune.session import Session

    cand = SimpleNamespace(name="good", kappas=(1, 2, 3, 4), measure_steps=4, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    pred = Predictor(table=_table(tmp_path), candidates={"good": cand}, entries={"good": _entry([0.8, 0.64, 0.51, 0.41], 4)},
                     costs={None: StageCosts(), "good": StageCosts()})
    ch = choose(pred, [1, 2])
    k2 = ch.buckets[max(b for b in ch.buckets if b <= 2)]
    plain_at_2 = pred.tok_s(Config(None, 0), 2)

    def result(label, tok_s, steps):
        return Result(label=label, concurrency=2, decode_tok_s=tok_s, output_tok_s=tok_s, tau=1.0, mean_batch=2.0,
                      steps=sum(steps.values()), decode_s=1.0, stage_ms_per_step={}, kappa_steps=steps)

    calls = []

    def fake_confirm(models, pred_, choice, prompt_ids, *, label=None, first=True, concurrency=None):
        calls.append((label, first, dict(choice.buckets), concurrency))
        k = choice.buckets[max(b for b in choice.buckets if b <= 2)]
        if first:  # the plan's bucket of 2 measured 0.8x plain decoding
            lab = "tuned plan (good)"
            return ({("plain", 2): result("plain", plain_at_2, {0: 100}), (lab, 2): result(lab, 0.8 * plain_at_2, {k: 100})},
                    {"plain": Config(None, 0), lab: None}, lab)
        return {(label, 2): result(label, 1.1 * plain_at_2, {k: 100})}, {label: None}, label

    session = Session.__new__(Session)
    session.conc, session.notes, session.t_start, session.budget = [1, 2], [], _time.monotonic(), 600.0
    session.confirm = fake_confirm
    results, configs, final = session.confirm_passes(None, pred, ch, None)
    assert [c[1] for c in calls] == [True, False] and calls[1][0] == "tuned plan (good, pass 2)"
    assert calls[1][3] == [2]  # only where its κ differs from the first plan's (one request: the same κ)
    second = calls[1][2]
    assert second[max(b for b in second if b <= 2)] != k2  # the changed plan, run in the second pass
    assert list(session.plans) == ["tuned plan (good)", "tuned plan (good, pass 2)"]
    assert final.buckets == second and ("tuned plan (good, pass 2)", 2) in results
    assert any("changed the choice" in n for n in session.notes)
    # no time left for a second pass: the changed plan is emitted as predicted, and the report says so
    calls.clear()
    session.notes, session.t_start = [], _time.monotonic() - 600.0
    _, _, final = session.confirm_passes(None, pred, ch, None)
    assert len(calls) == 1 and final.buckets == second
    assert any(n.startswith(f"the plan good {second} was not run") for n in session.notes), session.notes


def test_suspect_spot_timings_are_flagged_for_a_second_pass():
    """A shape slower than a wider one of the same R, or a one-token shape off the measuring runs'
    ratio, is timed again together with its R's other widths; a clean grid has no suspects."""
    from specc.tune.predict import suspect_shapes

    clean = {(1, 1): 37.0, (1, 2): 37.5, (1, 4): 44.0, (4, 1): 47.0, (4, 2): 75.0, (4, 4): 106.0}
    observed = {1: 40.0, 2: 48.0, 4: 50.0}
    assert suspect_shapes(clean, observed) == []
    bumped = {**clean, (4, 1): 90.0}  # slower than 4 x 2: a burst of load
    assert suspect_shapes(bumped) == [(4, 1), (4, 2), (4, 4)]
    # monotone in W but 1.65x the one-token verify plain decoding's run saw at 4 rows (0.93x at 1 and 2)
    assert suspect_shapes({**clean, (2, 1): 44.6, (4, 1): 77.6}, observed) == [(4, 1), (4, 2), (4, 4)]
    off = {**clean, (2, 1): 70.0, (2, 2): 80.0}  # monotone, but 1.46x what plain decoding saw at 2 rows
    assert suspect_shapes(off, observed) == [(2, 1), (2, 2)]
    assert suspect_shapes(off, {1: 40.0}) == []  # too few rows observed to judge a ratio


def test_suspect_shapes_are_timed_again_and_the_lower_time_kept(monkeypatch):
    """The spot check's second pass: a suspect shape timed again keeps the lower median; a pass that
    changes nothing ends the retiming (the shape really costs that); the report says which changed."""
    from types import SimpleNamespace

    import specc.runtime.profile as profile
    from specc.tune.predict import Linear
    from specc.tune.session import retime_suspects

    calls = []
    now = {"4x1": 48.0, "4x2": 74.0, "4x4": 104.0}

    def fake(target, shapes, **kw):
        calls.append(sorted(shapes))
        return {f"{r}x{w}": now[f"{r}x{w}"] for r, w in shapes}

    monkeypatch.setattr(profile, "time_state_shapes", fake)
    samples = [SimpleNamespace(rows=r, stage_ms={"verify": v, "accept": 0.0}) for r, v in ((1, 40.0), (2, 48.0), (4, 50.0))
               for _ in range(3)]
    timed = {(1, 1): 37.0, (1, 2): 37.5, (2, 1): 44.6, (2, 2): 50.0, (4, 1): 77.6, (4, 2): 75.0, (4, 4): 106.0}
    said = retime_suspects(None, timed, samples, 100, 60.0, Linear(10.0, 5.0))
    assert calls == [[(4, 1), (4, 2), (4, 4)]]  # clean after one pass
    assert timed[(4, 1)] == 48.0 and timed[(4, 2)] == 74.0 and timed[(2, 1)] == 44.6
    assert "4x1 78->48 ms" in said and "4x2" not in said
    # a shape that stays slow is timed once more only if the pass changed something
    calls.clear()
    now["4x1"] = 90.0
    timed = {(4, 1): 90.0, (4, 2): 75.0, (4, 4): 106.0}
    said = retime_suspects(None, timed, [], 100, 60.0, Linear(10.0, 5.0))
    assert len(calls) == 1 and "none changed" in said and timed[(4, 1)] == 90.0
    # no time left: nothing timed, and the report says so
    calls.clear()
    assert "not timed again" in retime_suspects(None, timed, [], 100, 0.1, Linear(10.0, 5.0)) and not calls


def test_load_factor_by_live_rows(tmp_path):
    """λ per live-row count where the measuring run saw enough steps, linear between, held beyond; one
    factor where no row count has enough."""
    from types import SimpleNamespace

    from specc.tune.predict import LOAD_MIN_SAMPLES, Config, Predictor, StageCosts, fit_stage_costs

    table = _table(tmp_path)
    base = lambda rows, tokens: 10.0 * rows  # noqa: E731
    steps = [SimpleNamespace(rows=r, num_steps=0, wall_ms=f * 10.0 * r, stage_ms={"verify": f * 10.0 * r})
             for r, f in ((1, 0.8), (8, 1.2)) for _ in range(LOAD_MIN_SAMPLES)] + \
            [SimpleNamespace(rows=4, num_steps=0, wall_ms=50.0, stage_ms={"verify": 50.0})]  # too few at 4 rows
    costs = fit_stage_costs(steps, lambda rows, k: base(rows, rows))
    assert costs.load_by_rows == pytest.approx({1: 0.8, 8: 1.2})
    pred = Predictor(table=table, candidates={}, entries={}, costs={None: costs}, load=1.0, load_rows=costs.load_by_rows)
    assert [pred.load_at(b) for b in (1, 4.5, 8, 64)] == pytest.approx([0.8, 1.0, 1.2, 1.2])
    assert pred.breakdown(Config(None, 0), 1)["verify_ms"] == pytest.approx(0.8 * table.step_ms(1))
    assert Predictor(table=table, candidates={}, entries={}, costs={}, load=1.3).load_at(1) == 1.3
    # a measuring run's ramp stays at each level long enough for that level's own λ
    from specc.tune.measure import RAMP_STEPS

    assert RAMP_STEPS >= LOAD_MIN_SAMPLES


def test_a_ragged_verify_pays_for_its_padding(tmp_path):
    """A lookup's requests draft different lengths; the eager CPU verify pads every row to the widest,
    so at batch its verify costs the real tokens plus the padded slots at the spot-timed price per
    slot — a drafter that always drafts κ pads nothing; one request pads nothing."""
    from specc.tune.predict import Config, Predictor, StageCosts, VerifyGrid, pad_cost, step_verify_ms

    lookup = _entry([0.2, 0.1], 2, drafts=[0.5, 0.3])
    chain = _entry([0.5, 0.3], 2)
    assert lookup.widest_drafts(2, 1) == pytest.approx(0.8)  # one request: its own drafts
    assert lookup.widest_drafts(2, 8) == pytest.approx((1 - 0.5 ** 8) + (1 - 0.7 ** 8))
    assert chain.widest_drafts(2, 8) == pytest.approx(2.0) and lookup.widest_drafts(0, 8) == 0.0
    grid = VerifyGrid({(8, 1): 80.0, (8, 2): 120.0, (8, 3): 160.0})
    # 8 requests, one at 3 tokens: 10 real tokens (80 + 40 * 2 / 8 = 90 ms), 14 padded slots
    assert pad_cost(grid, 8, 3, 97.0) == pytest.approx(0.5)
    assert pad_cost(grid, 8, 3, 80.0) == 0.0 and pad_cost(grid, 8, 1, 99.0) == 0.0
    d, w = lookup.drafts_per_step(2), lookup.widest_drafts(2, 8)
    assert step_verify_ms(grid, 0.5, lookup, 2, 8) == pytest.approx(grid(8, 8 * (1 + d)) + 0.5 * 8 * (w - d))
    assert step_verify_ms(grid, 0.5, chain, 2, 8) == pytest.approx(grid(8, 24))
    assert step_verify_ms(grid, 0.5, None, 0, 8) == pytest.approx(80.0)
    cand = SimpleNamespace(name="ngram", kappas=(1, 2), measure_steps=2, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    kw = dict(table=_table(tmp_path), candidates={"ngram": cand}, entries={"ngram": lookup},
              costs={None: StageCosts(), "ngram": StageCosts()}, grid=grid)
    free, padded = Predictor(**kw), Predictor(pad_ms=0.5, **kw)
    assert padded.breakdown(Config("ngram", 2), 8)["verify_ms"] > free.breakdown(Config("ngram", 2), 8)["verify_ms"]
    assert padded.breakdown(Config("ngram", 2), 1)["verify_ms"] == pytest.approx(free.breakdown(Config("ngram", 2), 1)["verify_ms"])


def test_lookup_drafts_fewer_tokens_than_kappa(tmp_path):
    """An n-gram drafter proposes at a position only when it matches: its verify carries the measured
    drafts per step, not κ."""
    e = _entry([0.2, 0.1], 2, drafts=[0.5, 0.3])
    assert e.drafts_per_step(2) == pytest.approx(0.8) and e.drafts_per_step(1) == pytest.approx(0.5)
    assert e.expected_tokens(2) == pytest.approx(1.3)


# ------------------------------------------------------------------------------------------------ acceptance


def test_ratio_ci_is_the_cluster_ratio_estimator():
    a, n = [3, 5, 0, 4], [10, 12, 8, 10]
    r, lo, hi = acceptance.ratio_ci(a, n)
    assert r == pytest.approx(12 / 40)
    var = 4 / 3 * sum((x - r * y) ** 2 for x, y in zip(a, n)) / 40 ** 2
    assert (hi - lo) / 2 == pytest.approx(acceptance.Z95 * math.sqrt(var))
    assert acceptance.ratio_ci([1], [5])[2] == math.inf


def test_every_shipped_drafter_has_a_current_record():
    from specc.tune.candidates import discover

    for c in discover()[0]:
        found = acceptance.find(c.plan)
        assert found.entry is not None, found.reason
        assert not found.stale, found.reason
        e = found.entry
        assert e.prompts["source"] == "specc/data/prompts.jsonl" and "held_out" in e.prompts
        assert e.counters["num_requests"] >= 30 and 1.0 <= e.tau_ci95[0] <= e.tau <= e.tau_ci95[1]
        assert e.measured["command"].startswith("python tools/acceptance_records.py")


def test_record_round_trip_and_stale_detection(tmp_path, monkeypatch):
    from specc.plan.load import load_plan
    from specc.check import resolve

    plan = resolve(load_plan("smollm2_eagle3").plan, "specc")[0]
    found = acceptance.find(plan)
    path = acceptance.write_record(tmp_path / "acceptance.json", [found.entry])
    again = acceptance.read_record(path)[0]
    assert again.rates == found.entry.rates and again.key == found.entry.key and again.tau == pytest.approx(found.entry.tau)
    monkeypatch.setattr(acceptance, "drafter_fingerprint", lambda p: "0" * 64)
    stale = acceptance.find(plan)
    assert stale.stale and "STALE" in stale.reason and acceptance.REGENERATE in stale.reason
    (tmp_path / "bad.json").write_text('{"format": "specc-acceptance/1", "entries": [{"counters": {"num_steps": 4, '
                                       '"num_accepted_tokens_per_pos": [1, 3]}}]}')
    with pytest.raises(acceptance.AcceptanceError, match="must not grow"):
        acceptance.read_record(tmp_path / "bad.json")


def test_record_paths():
    from specc.plan.load import load_plan

    assert acceptance.record_path(load_plan("smollm2_ngram").plan) == acceptance.DATA_DIR / "ngram.json"
    assert acceptance.record_path(load_plan("smollm2_draft_model").plan) == \
        acceptance.DATA_DIR / "smollm2_135m_shallow.json"  # built at install: not committed in its folder
    assert acceptance.record_path(load_plan("smollm2_eagle3").plan).name == "acceptance.json"
    # MTP layers may ship inside the target; a plan that names a separate head keeps the record by that head
    mtp = load_plan("smollm2_mtp").plan
    assert acceptance.record_path(mtp) == ROOT / "specc/assets/drafters/smollm2_135m_mtp/acceptance.json"
    assert acceptance.drafter_fingerprint(mtp) is not None
    import dataclasses
    inside = dataclasses.replace(mtp, draft=None)
    assert acceptance.record_path(inside) == acceptance.DATA_DIR / "mtp.json"
    assert acceptance.drafter_fingerprint(inside) is None


# ------------------------------------------------------------------------------------------------ explain


def test_explain_uses_the_record_and_says_so(capsys):
    rc, out, _ = run_cli(capsys, "explain", "smollm2_eagle3", "--format", "json")
    data = json.loads(out)
    assert rc == 0 and data["alpha_measured"] and data["alpha_source"].startswith("acceptance record ")
    entry = acceptance.find(__import__("specc.check", fromlist=["resolve"]).resolve(
        __import__("specc.plan.load", fromlist=["load_plan"]).load_plan("smollm2_eagle3").plan, "specc")[0]).entry
    s = {x["num_steps"]: x for x in data["states"]}
    assert s[3]["expected_tokens"] == pytest.approx(entry.expected_tokens(3))
    rc, out, _ = run_cli(capsys, "explain", "smollm2_ngram", "--hardware", "cpu")
    assert rc == 0 and "acceptance record specc/data/acceptance/ngram.json" in out
    assert "2.77x" not in out  # the old headline from α = 0.70


def test_explain_without_a_record_assumes_nothing(capsys):
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu")
    header = next(ln for ln in out.splitlines() if ln.startswith("state "))
    assert rc == 0 and "α: none: no acceptance record" in out and "α to pay" in header and "speedup" not in header
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu", "--format", "json")
    data = json.loads(out)
    assert data["alpha"] is None and data["alpha_assumed"] is True
    chain = [s for s in data["states"] if s["num_steps"] > 0]
    assert all(s["speedup"] is None and s["expected_tokens"] is None for s in data["states"])
    assert all(0.0 <= s["alpha_to_pay"] <= 1.0 for s in chain if s["alpha_to_pay"] is not None)
    b1 = {s["num_steps"]: s for s in chain if s["batch_size"] == 1}
    # at α_to_pay the batch-1 speedup is 1: E(α, κ) = 1 + κc
    k = 3
    assert cost.expected_tokens(b1[k]["alpha_to_pay"], k) == pytest.approx(1 + k * data["c"], rel=1e-3)


def test_explain_prints_several_plans_side_by_side(capsys):
    rc, out, _ = run_cli(capsys, "explain", "smollm2_ngram", "smollm2_eagle3", "sglang_eagle3_adaptive",
                         "--hardware", "cpu")
    assert rc == 0 and "3 plans side by side" in out
    header = out.splitlines()[1]
    assert header.split() == ["smollm2_ngram", "smollm2_eagle3", "sglang_eagle3_adaptive"]
    assert any(ln.startswith("B=1 ") for ln in out.splitlines())
    assert "needs α≥" in out  # the plan without a record
    rc, out, _ = run_cli(capsys, "explain", "smollm2_ngram", "smollm2_eagle3", "method.num_steps=2", "--format", "json")
    plans = json.loads(out)["plans"]
    assert [p["plan"] for p in plans] == ["smollm2_ngram", "smollm2_eagle3"]
    assert all({s["num_steps"] for s in p["states"]} == {2} for p in plans)  # the override applies to both


def test_explain_reads_a_record_file_as_acceptance(capsys, tmp_path):
    from specc.plan.load import load_plan
    from specc.check import resolve

    plan = resolve(load_plan("smollm2_eagle3").plan, "specc")[0]
    entry = acceptance.find(plan).entry
    import dataclasses

    rates = (0.5, 0.25, 0.125, 0.0625)
    steps = 1000
    fake = dataclasses.replace(entry, counters=dict(entry.counters, num_steps=steps,
                                                    num_accepted_tokens_per_pos=[int(r * steps) for r in rates]))
    path = acceptance.write_record(tmp_path / "rec.json", [fake])
    rc, out, err = run_cli(capsys, "explain", "smollm2_eagle3", "--acceptance", path, "--format", "json")
    assert rc == 0, err
    s = {x["num_steps"]: x for x in json.loads(out)["states"]}
    assert s[3]["expected_tokens"] == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    rc, _, err = run_cli(capsys, "explain", "smollm2_ngram", "--acceptance", path)
    assert rc == 2 and "--acceptance" in err and "no entry for this plan" in err


# ------------------------------------------------------------------------------------------------ emit


@pytest.mark.parametrize("name", ["smollm2_ngram", "smollm2_eagle3", "smollm2_dflash", "smollm2_draft_model",
                                  "smollm2_eagle3_tree"])
def test_emitted_plans_pass_the_engines_rules(tmp_path, name):
    """The tuned plan loads back, compiles for specc, and its vLLM / SGLang settings pass those engines'
    own rules as `specc export` checks them (a tree has no vLLM equivalent: the refusal is written)."""
    from specc.tune import emit
    from specc.tune.candidates import discover
    from specc.compiler import build

    cand = next(c for c in discover()[0] if c.name == name)
    k = max(cand.kappas)
    buckets = {1: [k], 4: [1 if cand.shape != "tree" else k], 16: [0]}
    doc = emit.plan_document(cand, buckets, kind="batch_buckets", engine="specc", name="tuned", alpha=0.3,
                             cost_table="pkg://specc/data/cost_tables/smollm2_135m_cpu.json", capture=[1, 2, 4, 8, 16])
    out = tmp_path / "tuned.yaml"
    out.write_text(emit.dump_plan(doc, ["test"]))
    plan, errors = emit.check_loads(out, "specc")
    assert errors == [] and plan.schedule.kind == "batch_buckets" and plan.schedule.buckets[1].candidates == [k]
    assert build.compile_plan(plan, tmp_path / "art").path.is_dir()
    ok, text = emit.export_text(out, "vllm")
    assert ok == (cand.shape != "tree"), text
    if ok:
        assert "num_speculative_tokens_per_batch_size" in text and text.strip().splitlines()[-1].startswith("vllm serve")
        assert subprocess.run([sys.executable, "-m", "specc.cli", "export", str(out), "--engine", "vllm"],
                              capture_output=True, text=True, cwd=ROOT).returncode == 0
    sg = dict(doc, engine="sglang", schedule={"kind": "adaptive", "capture_batch_sizes": [1, 2, 4, 8, 16],
                                              "buckets": {b: {"candidates": v} for b, v in buckets.items()}})
    sg_path = tmp_path / "tuned.sglang.yaml"
    sg_path.write_text(emit.dump_plan(sg, []))
    ok, text = emit.export_text(sg_path, "sglang", tmp_path / "adaptive.json")
    assert ok, text
    assert text.strip().splitlines()[-1].startswith("python -m sglang.launch_server")


def test_an_engine_that_refuses_the_choice_gets_the_best_drafter_it_runs(tmp_path):
    """SGLang has no suffix decoding and vLLM no trees: each engine's settings use the best drafter by
    the same choice among those its rules accept, and the report says why."""
    from types import SimpleNamespace

    from specc.tune.candidates import discover
    from specc.tune.predict import Predictor, StageCosts, choose
    from specc.tune.session import Session

    cands = {c.name: c for c in discover()[0] if c.name in ("smollm2_suffix", "smollm2_ngram", "smollm2_eagle3_tree")}
    entries = {"smollm2_suffix": _entry([0.6, 0.4, 0.2, 0.1], 4), "smollm2_ngram": _entry([0.3, 0.1, 0.05, 0.0], 4),
               "smollm2_eagle3_tree": _entry([0.5, 0.3, 0.1, 0.05], 4)}
    pred = Predictor(table=_table(tmp_path), candidates=cands, entries=entries,
                     costs={n: StageCosts() for n in [None, *cands]})
    final = choose(pred, [1, 4])
    assert final.candidate == "smollm2_suffix"
    session = SimpleNamespace(cands=cands, conc=[1, 4], notes=[])
    sg, why = Session._engine_choice(session, pred, final, "sglang")
    assert sg.candidate == choose(pred, [1, 4], exclude=["smollm2_suffix"]).candidate
    assert f"SGLang refuses smollm2_suffix ([sglang.N5]): its settings use {sg.candidate}" in why
    vl, why = Session._engine_choice(session, pred, final, "vllm")
    assert vl is final and why == ""  # vLLM runs suffix decoding
    assert len(session.notes) == 1 and session.notes[0].startswith("SGLang refuses")
    # a choice vLLM refuses (a tree) falls to the best chain vLLM runs
    tree_first = choose(pred, [1, 4], exclude=["smollm2_suffix", "smollm2_ngram"])
    vl, why = Session._engine_choice(session, pred, tree_first, "vllm")
    assert tree_first.candidate == "smollm2_eagle3_tree" and vl.candidate != "smollm2_eagle3_tree"
    assert "vLLM refuses smollm2_eagle3_tree ([vllm.T1])" in why
    # vLLM runs suffix decoding with one κ at every batch size (Model Runner V1): a static plan, exported
    real = Session.__new__(Session)
    real.cands, real.conc, real.notes = cands, [1, 4], []
    out = tmp_path / "tuned.yaml"
    entries_m = {n: SimpleNamespace(entry=e) for n, e in entries.items()}
    from specc.tune import emit

    out.write_text(emit.dump_plan(emit.plan_document(cands["smollm2_suffix"], {b: [k] for b, k in final.buckets.items()},
                                                     kind="batch_buckets", engine="specc", name="tuned", alpha=0.3,
                                                     cost_table=None, capture=[1, 2, 4]), []))
    path, why = real._vllm_plan(pred, final, entries_m, None, [1, 2, 4], out, ["test"])
    assert path == tmp_path / "tuned.vllm.yaml" and "[vllm.R65]" in why and real.notes == [why]
    from specc.plan.load import load_plan

    plan = load_plan(str(path)).plan
    assert plan.method.name == "suffix" and plan.schedule.kind == "static"
    assert plan.method.num_steps == real._static_kappa(pred, cands["smollm2_suffix"])[0]
    ok, text = emit.export_text(path, "vllm")
    assert ok and '"method":"suffix"' in text and "num_speculative_tokens_per_batch_size" not in text, text
    # n-gram runs per-batch-size κ on vLLM: the plan itself is exported
    ngram_first = choose(pred, [1, 4], exclude=["smollm2_suffix", "smollm2_eagle3_tree"])
    ngram = cands["smollm2_ngram"]
    buckets = {b: [k] for b, k in ngram_first.buckets.items()}
    out.write_text(emit.dump_plan(emit.plan_document(ngram, buckets, kind="batch_buckets", engine="specc",
                                                     name="tuned", alpha=0.3, cost_table=None, capture=[1, 2, 4]), []))
    assert real._vllm_plan(pred, ngram_first, entries_m, None, [1, 2, 4], out, ["test"]) == (out, "")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["table.json", "tuned.yaml"]  # the old variant removed
    # an adaptive plan (--schedule adaptive): vLLM has no adaptive controller, so a batch_buckets variant
    out.write_text(emit.dump_plan(emit.plan_document(ngram, buckets, kind="adaptive", engine="specc", name="tuned",
                                                     alpha=0.3, cost_table=None, capture=[1, 2, 4]), []))
    assert not emit.export_text(out, "vllm")[0]
    path, why = real._vllm_plan(pred, ngram_first, entries_m, None, [1, 2, 4], out, ["test"])
    assert path == tmp_path / "tuned.vllm.yaml" and why.startswith("vLLM refuses tuned.yaml as written")
    assert load_plan(str(path)).plan.schedule.kind == "batch_buckets"
    ok, text = emit.export_text(path, "vllm")
    assert ok and "num_speculative_tokens_per_batch_size" in text, text
    assert sorted(f.name for f in tmp_path.iterdir()) == ["table.json", "tuned.vllm.yaml", "tuned.yaml"]  # no temp


# ------------------------------------------------------------------------------------------------ run PLAN


def test_run_compiles_a_plan_into_the_cache(tmp_path, monkeypatch):
    from specc.commands.compile import artifact_for, cache_dir
    from specc.errors import SpeccError

    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path))
    said = []
    first = artifact_for("smollm2_ngram", ["method.num_steps=2"], say=said.append)
    assert first.parent == cache_dir() == tmp_path / "artifacts" and (first / "manifest.json").is_file()
    again = artifact_for("smollm2_ngram", ["method.num_steps=2"], say=said.append)
    assert again == first and said[0].startswith("compiled") and said[1].startswith("reused")
    assert artifact_for("smollm2_ngram", ["method.num_steps=3"]) != first  # keyed by the content's hash
    assert artifact_for(str(first)) == first
    with pytest.raises(SpeccError, match="overrides"):
        artifact_for(str(first), ["method.num_steps=3"])


# ------------------------------------------------------------------------------------------------ a whole run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch

    from specc.runtime.testing import perturbed_copy, tiny_llama
    from tests.runtime.test_runtime_artifact import _write_checkpoint

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny")
    target = tiny_llama(seed=0, vocab_size=V)
    _write_checkpoint(target, root / "target")
    _write_checkpoint(perturbed_copy(target, noise=0.02, seed=1), root / "draft")
    tgt = f"target: {{path: {root / 'target'}, format: hf, vocab_size: {V}, max_model_len: 128}}\n"
    (root / "ngram.yaml").write_text("defaults:\n  - /method: ngram\n  - /verify: greedy\n  - _self_\nname: tiny_ngram\n"
                                     "engine: specc\n" + tgt + "method: {num_steps: 3, ngram: {min: 1, max: 2}}\n")
    (root / "draft.yaml").write_text("defaults:\n  - /method: draft_model\n  - /verify: greedy\n  - _self_\n"
                                     "name: tiny_draft\nengine: specc\n" + tgt +
                                     f"draft: {{path: {root / 'draft'}, format: hf, vocab_size: {V}, max_model_len: 128}}\n"
                                     "method: {num_steps: 2}\n")
    lines = [" ".join(f"w{(i * 7 + j) % 40 + 4}" for j in range(12)) for i in range(10)]
    (root / "prompts.txt").write_text("\n".join(f"{ln} {ln}" for ln in lines) + "\n")
    return root


def test_tune_end_to_end_on_a_tiny_model(tiny, tmp_path, monkeypatch, capsys):
    """Measure, predict (a cost table profiled on the spot: none exists for this model), confirm,
    emit: the plan, its engine settings and record, a report with predicted against measured, a plot."""
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "tuned.yaml"
    rc, stdout, err = run_cli(capsys, "tune", tiny / "prompts.txt", "--plans", tiny / "ngram.yaml", tiny / "draft.yaml",
                              "--target", tiny / "target", "--concurrency", "1,4", "--budget-min", "1.5",
                              "--max-new-tokens", "12", "--measure-batch", "4", "--out", out, "--no-progress")
    assert rc == 0, err
    for suffix in (".yaml", ".sglang.yaml", ".launch.sh", ".acceptance.json", ".cost_table.json", ".report.md",
                   ".png", ".json"):
        assert Path(f"{tmp_path / 'tuned'}{suffix}").is_file(), suffix
    assert "profiled now" in err and list((tmp_path / "cache" / "cost_tables").glob("*.json"))
    data = json.loads((tmp_path / "tuned.json").read_text())
    assert data["seconds"] <= 1.5 * 60 * 1.1
    assert set(data["candidates"]) == {"ngram", "draft"}
    assert data["choice"]["candidate"] in ("ngram", "draft")
    runs = [r for r in data["runs"] if not r["run"].startswith("measure")]
    assert {r["run"] for r in runs} >= {"plain"} and all(r["exact"] for r in runs)
    assert "predicted against measured" in stdout
    from PIL import Image

    assert json.loads(Image.open(tmp_path / "tuned.png").text["specc:series"]) == data["plot"]  # drawn = recorded
    assert data["plot"]["measured"]["plain"] and data["plot"]["predicted"]["plain"]
    # the table was checked against the forward timed now at the shapes the predictions use
    spot = [n for n in data["notes"] if n.startswith("cost table spot-checked at")]
    assert len(spot) == 1 and "R [1, 4] x W [1, 2, 3" in spot[0]
    assert (data["verify_grid"] is None) == ("the table's shape fits" in spot[0])
    from specc.plan.load import load_plan

    plan = load_plan(str(out)).plan
    assert plan.schedule.kind == "batch_buckets" and plan.schedule.alpha is None
    # the plan points at the records written beside it (relative in the file, resolved against its folder)
    assert "acceptance: tuned.acceptance.json" in out.read_text() and "cost_table: tuned.cost_table.json" in out.read_text()
    assert Path(plan.schedule.acceptance) == tmp_path / "tuned.acceptance.json"
    assert Path(plan.schedule.cost_table) == tmp_path / "tuned.cost_table.json"
    entries = acceptance.read_record(tmp_path / "tuned.acceptance.json")
    assert {e.key["method"] for e in entries} == {"ngram", "draft_model"}
    # explain predicts the plan at each concurrency tune planned for with tune's own predictor, and puts
    # what tune measured for the plan beside it
    from specc.check import resolve
    from specc.tune.predict import plan_predictions

    story = plan_predictions(resolve(plan, "specc")[0])
    assert story["tuned"] and story["unknown"] is None and story["concurrency"] == [1, 4]
    assert all(r["tok_s"] > 0 and r["speedup"] == pytest.approx(r["tok_s"] / r["plain_tok_s"]) for r in story["rows"])
    block = json.loads((tmp_path / "tuned.cost_table.json").read_text())["tune"]
    assert block["candidate"] == data["choice"]["candidate"] and block["measured_source"] == "tuned.json"
    assert all("plain" in block["measured"][str(c)] for c in (1, 4))
    assert any("plan" in m for m in block["measured"].values())  # the confirming runs of the plan's κ
    for r in story["rows"]:
        m = block["measured"].get(str(r["concurrency"]))
        if m and "plan" in m and "plain" in m:
            assert r["measured_speedup"] == pytest.approx(m["plan"] / m["plain"])


def test_tune_runs_the_plan_its_confirming_runs_changed(tiny, tmp_path, monkeypatch, capsys):
    """When the choice made after the confirming runs differs from the plan they ran, tune runs the
    new plan in a second pass (the real runtime, at the concurrencies where its κ differs) before it
    is emitted, and reports both runs. The second choice is forced here (every bucket's κ flipped)."""
    import dataclasses

    from specc.tune import predict

    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "cache"))
    real_choose, calls = predict.choose, []

    def choose(*a, **kw):
        ch = real_choose(*a, **kw)
        calls.append(ch)
        if len(calls) == 1:
            return ch
        first = calls[0]
        return dataclasses.replace(first, buckets={b: (0 if k else 1) for b, k in first.buckets.items()})

    monkeypatch.setattr(predict, "choose", choose)
    out = tmp_path / "tuned.yaml"
    rc, stdout, err = run_cli(capsys, "tune", tiny / "prompts.txt", "--plans", tiny / "ngram.yaml",
                              "--target", tiny / "target", "--concurrency", "1,4", "--budget-min", "1.5",
                              "--max-new-tokens", "12", "--measure-batch", "4", "--out", out, "--no-progress")
    assert rc == 0, err
    data = json.loads((tmp_path / "tuned.json").read_text())
    flipped = {int(b): k for b, k in data["choice"]["buckets"].items()}
    assert flipped == {b: (0 if k else 1) for b, k in calls[0].buckets.items()}
    runs = {(r["run"], r["concurrency"]): r for r in data["runs"]}
    assert ("tuned plan (ngram)", 1) in runs and ("tuned plan (ngram)", 4) in runs
    second = [key for key in runs if key[0] == "tuned plan (ngram, pass 2)"]
    assert second and all(runs[key]["exact"] for key in second)
    assert any("changed the choice" in n for n in data["notes"])
    assert data["seconds"] <= 1.5 * 60 * 1.1


def test_run_takes_a_plan_file(tiny, tmp_path, monkeypatch, capsys):
    """`specc run PLAN`: compiled on the fly into the cache, then run (a second run reuses it)."""
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path))
    argv = ["run", tiny / "ngram.yaml", "--prompts", tiny / "prompts.txt", "--limit", "2", "--max-new-tokens", "4",
            "--no-progress"]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    assert "compiled ngram.yaml -> " in err and "=== metrics" in out
    arts = list((tmp_path / "artifacts").iterdir())
    assert len(arts) == 1 and arts[0].name.startswith("tiny_ngram-")
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0 and "reused ngram.yaml -> " in err and len(list((tmp_path / "artifacts").iterdir())) == 1


def test_measuring_runs_ramp_the_batch_and_stop_by_rule(tiny, tmp_path, monkeypatch):
    """The step samples span batch sizes (1, 2, then the full batch) so the cost fits have a slope; a
    cost-only run stops after its steps; a deadline in the past stops after the first decode step.
    The measured runtime is the plan's compiled artifact, from the cache (reused when compiled again)."""
    import time as _time

    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path))

    from specc.plan.load import load_plan
    from specc.check import resolve
    from specc.runtime.prompts import read_prompts
    from specc.tune.measure import Models, encode, run_sampled
    from specc.tune.session import plain_plan

    plan = resolve(load_plan(str(tiny / "ngram.yaml")).plan, "specc")[0]
    models = Models({"path": plan.target.path, "format": "hf"}, max_model_len=120)
    ids = encode(read_prompts(tiny / "prompts.txt"), models.tokenizer)
    rt = models.runtime(plain_plan(plan, [4]))
    assert [p.parent for p in models.artifacts] == [tmp_path / "artifacts"]
    assert (models.artifacts[0] / "manifest.json").is_file()
    per, samples, reason, tok_s = run_sampled(rt, ids, batch_size=4, max_new_tokens=8, deadline=_time.monotonic() + 60,
                                              tolerance=0.0, min_requests=2, ramp=(1, 2), ramp_steps=2, max_steps=7)
    rows = [s.rows for s in samples]
    assert rows[:2] == [1, 1] and 2 in rows and 4 in rows and len(samples) == 7 and "7 decode steps" in reason
    assert all(s.wall_ms >= s.stage_ms["verify"] > 0 for s in samples) and tok_s > 0
    assert all(p["num_steps"] > 0 for p in per)  # live requests were cancelled, their steps kept
    per, samples, reason, _ = run_sampled(rt, ids, batch_size=4, max_new_tokens=8, deadline=_time.monotonic() - 1,
                                          tolerance=0.0, min_requests=2)
    assert len(samples) == 1 and "time share spent" in reason
    models.runtime(plain_plan(plan, [4]))
    assert len(set(models.artifacts)) == 1 and len(list((tmp_path / "artifacts").iterdir())) == 1


def test_side_by_side_keeps_the_best_round_and_records_every_round(monkeypatch):
    """Each configuration keeps its best round; every round's throughput is recorded in round order
    (the benchmark's spread and same-round ratios read it); rounds alternate the order of entries."""
    import specc.tune.confirm as confirm

    speeds = {"plain": iter([50.0, 70.0, 60.0]), "x": iter([40.0, 30.0, 45.0])}
    order = []

    def fake_run(models, entry, c, reqs):
        order.append(entry.label)
        v = next(speeds[entry.label])
        return confirm.Result(label=entry.label, concurrency=c, decode_tok_s=v, output_tok_s=v, tau=1.0,
                              mean_batch=float(c), steps=10, decode_s=1.0, stage_ms_per_step={}, kappa_steps={0: 10},
                              outputs=[[1, 2]])

    monkeypatch.setattr(confirm, "run_one", fake_run)
    entries = [confirm.Entry("plain", None, lambda c: None), confirm.Entry("x", None, lambda c: None)]
    res, notes = confirm.side_by_side(None, entries, [2], [[1, 2, 3]], max_new_tokens=4, rounds=3)
    assert order == ["plain", "x", "x", "plain", "plain", "x"] and notes == []
    assert res[("plain", 2)].decode_tok_s == 70.0 and res[("plain", 2)].round_tok_s == [50.0, 70.0, 60.0]
    assert res[("x", 2)].decode_tok_s == 45.0 and res[("x", 2)].round_tok_s == [40.0, 30.0, 45.0]
    assert res[("x", 2)].rounds == 3 and res[("x", 2)].exact is True


def test_models_load_the_target_as_the_compiled_artifact_runs_it():
    """tune's shared target and a benchmark of its plans load the dtype and kernel variant the runtime
    loads for the candidate's artifact: the GGUF's own codes by default, the cost table's choice when
    given — never a dequantized fp32 target under a native artifact."""
    import torch

    from specc.compiler.build import plan_ir
    from specc.kernels import qgemm
    from specc.runtime.loader import choose_settings, kernel_variant
    from specc.tune.candidates import discover
    from specc.tune.measure import Models

    cand = next(c for c in discover()[0] if c.name == "smollm2_suffix")
    target = {"path": cand.plan.target.path, "format": cand.plan.target.format}
    spec = plan_ir(cand.plan).runtime.to_dict()
    models = Models(target, max_model_len=64)
    assert models.dtype == choose_settings(spec, torch.device("cpu"))[0] == "native"
    if qgemm.available():
        assert qgemm.variant() == kernel_variant(spec)[0]
    assert Models(target, max_model_len=64, choice={"dtype": "float32"}).dtype == "float32"
