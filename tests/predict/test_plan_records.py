"""explain, bench and serve read the records a plan carries: the acceptance record (``schedule.acceptance``)
and the cost table with ``specc tune``'s ``tune`` block (``schedule.cost_table``). The plan's predicted
speedup per concurrency comes from tune's own predictor rebuilt from those records, the plot draws the
numbers of the JSON (and stores them in the PNG's text), and without a measured α nothing is plotted."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from specc.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "specc" / "data" / "acceptance" / "ngram.json"
TABLE = REPO / "specc" / "data" / "cost_tables" / "smollm2_135m_cpu.json"


def run_cli(capsys, *argv):
    rc = cli_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _predictor(plan_name: str):
    """A tune-like predictor over the shipped table and the n-gram record: one candidate named like the plan."""
    from specc.predict import acceptance, cost
    from specc.tune.predict import Linear, Predictor, StageCosts, VerifyGrid

    entry = acceptance.read_record(RECORD)[0]
    cand = SimpleNamespace(name=plan_name, kappas=(1, 2, 3, 4), measure_steps=4, shape="chain",
                           plan=SimpleNamespace(method=SimpleNamespace(name="ngram", parallel_drafting=False, topk=1,
                                                                       tree_choices=None)))
    grid = VerifyGrid({(1, 1): 6.0, (1, 5): 7.5, (4, 1): 8.0, (4, 5): 20.0})
    return Predictor(table=cost.load_cost_table(str(TABLE)), candidates={plan_name: cand},
                     entries={plan_name: entry},
                     costs={None: StageCosts(other=Linear(0.3, 0.02)),
                            plan_name: StageCosts(draft=Linear(0.05, 0.01), other=Linear(0.4, 0.03))},
                     load=1.1, load_rows={1: 0.9, 4: 1.2}, grid=grid, pad_ms=0.2)


def _tuned_folder(tmp_path: Path, measured=None) -> Path:
    """A plan as `specc tune` leaves it: tuned.yaml pointing at tuned.acceptance.json and tuned.cost_table.json."""
    from specc.tune import emit
    from specc.tune.predict import record_block

    shutil.copy(RECORD, tmp_path / "tuned.acceptance.json")
    block = record_block(_predictor("tuned"), "tuned", [1, 4], measured or {}, "tuned.json")
    emit.write_cost_record(tmp_path / "tuned.cost_table.json", str(TABLE), block)
    text = (REPO / "conf" / "plan" / "smollm2_ngram.yaml").read_text().replace("  - /schedule: static\n", "")
    text = text.replace("name: smollm2_ngram", "name: tuned")
    text += ("runtime: {max_batch_size: 4}\nschedule:\n  kind: batch_buckets\n  buckets:\n    1: {candidates: [4]}\n"
             "    4: {candidates: [1]}\n  capture_batch_sizes: [1, 2, 4]\n  acceptance: tuned.acceptance.json\n"
             "  cost_table: tuned.cost_table.json\n")
    (tmp_path / "tuned.yaml").write_text(text)
    return tmp_path / "tuned.yaml"


def test_the_record_rebuilds_tunes_own_predictor(tmp_path):
    """plan_predictions over the records gives what tune's Predictor gave for the plan's κ at each
    concurrency: the same function over the same numbers."""
    from specc.check import resolve
    from specc.plan.load import load_plan
    from specc.tune.predict import Config, plan_predictions

    path = _tuned_folder(tmp_path, {1: {"plan": 210.0, "plain": 174.0}})
    plan, _ = resolve(load_plan(str(path)).plan, "specc")
    story = plan_predictions(plan)
    pred = _predictor("tuned")
    assert story["tuned"] and story["concurrency"] == [1, 4]
    want = {1: Config("tuned", 4), 4: Config("tuned", 1)}
    for r in story["rows"]:
        c = r["concurrency"]
        assert r["num_steps"] == want[c].num_steps
        assert r["tok_s"] == pytest.approx(pred.tok_s(want[c], c))
        assert r["plain_tok_s"] == pytest.approx(pred.tok_s(Config(None, 0), c))
    r1 = story["rows"][0]
    assert r1["measured_speedup"] == pytest.approx(210.0 / 174.0) and story["rows"][1]["measured_speedup"] is None
    assert story["measured_source"] == str(tmp_path / "tuned.json")


def test_a_broken_tune_block_is_refused_naming_the_key(tmp_path):
    from specc.check import resolve
    from specc.errors import PlanError
    from specc.plan.load import load_plan
    from specc.tune.predict import plan_predictions

    path = _tuned_folder(tmp_path)
    data = json.loads((tmp_path / "tuned.cost_table.json").read_text())
    data["tune"]["costs"]["plain"] = {"draft": "fast"}
    (tmp_path / "tuned.cost_table.json").write_text(json.dumps(data))
    plan, _ = resolve(load_plan(str(path)).plan, "specc")
    with pytest.raises(PlanError, match=r"^schedule.cost_table: .*tuned.cost_table.json.*tune"):
        plan_predictions(plan)


def test_explain_states_the_plan_per_concurrency_and_plots_the_same_numbers(capsys, tmp_path):
    from PIL import Image

    from specc.commands.explain import PLOT_SERIES_KEY

    path = _tuned_folder(tmp_path, {1: {"plan": 210.0, "plain": 174.0}, 4: {"plan": 300.0, "plain": 270.0}})
    png = tmp_path / "ex.png"
    rc, out, err = run_cli(capsys, "explain", path, "--format", "json", "--plot", png)
    assert rc == 0, err
    data = json.loads(out)
    assert data["alpha_source"].startswith("schedule.acceptance: ")
    story = data["plan_at_concurrency"]
    assert story["tuned"] and [r["concurrency"] for r in story["rows"]] == [1, 4]
    assert story["rows"][1]["measured_speedup"] == pytest.approx(300.0 / 270.0)
    series = json.loads(Image.open(png).text[PLOT_SERIES_KEY])
    assert series["alpha_unknown"] is False
    assert series["plan_at_concurrency"] == [[r["concurrency"], r["speedup"], r["measured_speedup"]]
                                             for r in story["rows"]]
    plotted = {(b, s) for pts in series["speedup_at_batch"].values() for b, s in pts}
    assert plotted == {(st["batch_size"], st["speedup_at_batch"]) for st in data["states"] if st["num_steps"] > 0}
    assert series["speedup"] == {st["state"]: st["speedup"] for st in data["states"]}
    rc, out, _ = run_cli(capsys, "explain", path)
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("concurrency 1:"))
    r1 = story["rows"][0]
    assert f"predicted {r1['tok_s']:.1f} tok/s vs plain {r1['plain_tok_s']:.1f} = {r1['speedup']:.2f}x" in line
    assert f"measured by specc tune 210.0 vs 174.0 = 1.21x ({tmp_path / 'tuned.json'})" in line


def test_no_alpha_plots_no_speedup(capsys, tmp_path):
    from PIL import Image

    from specc.commands.explain import PLOT_SERIES_KEY

    png = tmp_path / "ex.png"
    rc, out, err = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu", "--format", "json",
                           "--plot", png)
    assert rc == 0, err
    data = json.loads(out)
    series = json.loads(Image.open(png).text[PLOT_SERIES_KEY])
    assert data["alpha_assumed"] and series == {"alpha_unknown": True, "speedup_at_batch": {}, "speedup": {},
                                                "plan_at_concurrency": []}
    assert data["plan_at_concurrency"]["rows"] == [] and "α unknown" in data["plan_at_concurrency"]["unknown"]


def test_serve_names_the_records_and_the_batch_1_prediction(tmp_path):
    from specc.commands.explain import plan_story
    from specc.commands.serve import records_line

    path = _tuned_folder(tmp_path)
    line = records_line(str(path))
    r = plan_story(str(path), (), [1])["rows"][0]
    assert "\n" not in line and str(tmp_path / "tuned.acceptance.json") in line
    assert str(tmp_path / "tuned.cost_table.json") in line and f"= {r['speedup']:.2f}x" in line
    assert "predicted at batch 1: none (α unknown" in records_line("sglang_eagle3_adaptive")


def test_the_compiled_artifact_tells_the_plans_story(tmp_path):
    """serve and bench predict from the artifact they run (its plan.yaml holds the records' absolute
    paths and any --target), so the line is the plan's own."""
    from specc.commands.serve import records_line
    from specc.compiler import build
    from specc.plan.load import load_plan

    path = _tuned_folder(tmp_path)
    art = build.compile_plan(load_plan(str(path)).plan, tmp_path / "artifacts").path
    assert records_line(str(art)) == records_line(str(path))


def test_explain_prints_each_default_it_assumed_with_the_flag_that_sets_it(capsys, tmp_path):
    path = _tuned_folder(tmp_path)
    rc, out, _ = run_cli(capsys, "explain", path, "target.max_model_len=null")
    assumed = [ln for ln in out.splitlines() if ln.startswith("assumed: ")]
    assert rc == 0 and len(assumed) == 2
    assert "context length 2048 tokens" in assumed[0] and "target.max_model_len=N" in assumed[0]
    assert "hardware profile cpu" in assumed[1] and "--hardware NAME" in assumed[1]
    # given: nothing assumed about them; the per-position record of the plan: nothing about α
    rc, out, _ = run_cli(capsys, "explain", path, "--hardware", "cpu", "--format", "json")
    assert json.loads(out)["assumed"] == []
    rc, out, _ = run_cli(capsys, "explain", path, "--hardware", "cpu", "--alpha", "0.5", "--format", "json")
    assert [a for a in json.loads(out)["assumed"] if a.startswith("α = 0.500 at every draft position (--alpha)")]
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--format", "json")
    assumed = json.loads(out)["assumed"]
    assert any(a.startswith("hardware profile h100") for a in assumed)
    assert any(a.startswith("α: none measured or given") and "--alpha" in a for a in assumed)
