"""``schedule.acceptance``: the acceptance record a plan carries (``specc tune`` writes it beside the plan).
A relative path written in a plan file resolves against that file's folder; a missing record is refused at
load naming the key; a record without this plan's entry is refused where it is read."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specc.errors import PlanError
from specc.plan import load_plan

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "specc" / "data" / "acceptance" / "ngram.json"  # measured for smollm2_ngram (κ = 4)


def _plan(folder: Path, schedule: str, num_steps: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = (REPO / "conf" / "plan" / "smollm2_ngram.yaml").read_text().replace("num_steps: 4", f"num_steps: {num_steps}")
    path = folder / "tuned.yaml"
    path.write_text(text + f"schedule:\n{schedule}")
    return path


def test_a_relative_record_resolves_against_the_plan_folder(tmp_path, monkeypatch):
    path = _plan(tmp_path / "plans", "  acceptance: tuned.acceptance.json\n")
    shutil.copy(RECORD, tmp_path / "plans" / "tuned.acceptance.json")
    monkeypatch.chdir(tmp_path)  # the working directory is not the plan's folder
    plan = load_plan(str(path)).plan
    assert Path(plan.schedule.acceptance) == (tmp_path / "plans" / "tuned.acceptance.json").resolve()


def test_an_override_stays_relative_to_the_working_directory(tmp_path, monkeypatch):
    path = _plan(tmp_path / "plans", "  kind: static\n")
    shutil.copy(RECORD, tmp_path / "here.json")
    monkeypatch.chdir(tmp_path)
    plan = load_plan(str(path), ["schedule.acceptance=here.json"]).plan
    assert plan.schedule.acceptance == "here.json"
    with pytest.raises(PlanError, match="schedule.acceptance: no acceptance record at there.json"):
        load_plan(str(path), ["schedule.acceptance=there.json"])


def test_a_missing_record_is_refused_naming_the_key_and_the_folder(tmp_path):
    path = _plan(tmp_path, "  acceptance: gone.acceptance.json\n")
    with pytest.raises(PlanError) as err:
        load_plan(str(path))
    text = str(err.value)
    assert "schedule.acceptance" in text and str(tmp_path / "gone.acceptance.json") in text
    assert "plan file's folder" in text and "Traceback" not in text


def test_the_record_entry_gives_the_per_position_rates(tmp_path):
    """E at κ = 2 is 1 + r1 + r2 of the record (not E(α, 2) of the α fitted at κ = 4), and the α source
    names the key."""
    from specc.check import resolve
    from specc.predict import sizing

    path = _plan(tmp_path, "  acceptance: rec.json\n", num_steps=2)
    shutil.copy(RECORD, tmp_path / "rec.json")
    plan, _ = resolve(load_plan(str(path)).plan, "specc")
    alpha, source, entry = sizing.plan_acceptance(plan)
    rates = json.loads(RECORD.read_text())["entries"][0]["rates"]
    assert source.startswith("schedule.acceptance: ") and str(tmp_path / "rec.json") in source
    assert entry.expected_tokens(2) == pytest.approx(1 + rates[0] + rates[1], abs=1e-4)
    from specc.predict import cost

    assert abs(cost.expected_tokens(alpha, 2) - entry.expected_tokens(2)) > 0.05  # the rates, not the fitted α
    # --alpha still wins over the record
    assert sizing.plan_acceptance(plan, 0.5)[1] == "--alpha"


def test_a_record_without_this_plans_entry_or_not_a_record_is_refused(tmp_path):
    from specc.check import resolve
    from specc.predict import sizing

    path = _plan(tmp_path, "  acceptance: rec.json\n")
    shutil.copy(REPO / "specc" / "data" / "acceptance" / "smollm2_135m_shallow.json", tmp_path / "rec.json")
    plan, _ = resolve(load_plan(str(path)).plan, "specc")
    with pytest.raises(PlanError, match=r"schedule.acceptance: .*rec.json has no entry for this plan's drafter"):
        sizing.plan_acceptance(plan)
    (tmp_path / "rec.json").write_text("{not json")
    with pytest.raises(PlanError, match=r"^schedule.acceptance: .*rec.json"):
        sizing.plan_acceptance(plan)
