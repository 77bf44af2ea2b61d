"""`specc explain`: table, JSON, plot, graphs export, errors; and it never imports torch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specc.predict import cost
from specc.cli import main

pytest.importorskip("specc.plan.load")

PRESET = "smollm2_eagle3"
# SGLang's default adaptive buckets on the eagle3 preset, explained as SGLang runs it (the specc
# runtime refuses adaptive schedules, and explain refuses what check refuses)
ADAPTIVE = ["schedule=sglang_adaptive", "engine=sglang"]


def run_cli(capsys, *argv):
    rc = main(["explain", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_lists_every_state(capsys):
    rc, out, _ = run_cli(capsys, PRESET, *ADAPTIVE)
    assert rc == 0
    for col in ("state", "κ", "W", "draft fwd", "extend fwd", "target fwd", "target tok", "E", "speedup",
                "break-even B", "draft KV/tok", "graphs", "graph mem"):
        assert col in out
    assert "b1_k7_topk1_w8_greedy_chain" in out and "b8_k0_topk1_w1_greedy_plain" in out
    assert "stage graphs: all valid" in out
    assert "bucket 8: κ ∈ [0, 1, 3]" in out


def test_json_matches_the_cost_model(capsys):
    rc, out, _ = run_cli(capsys, PRESET, *ADAPTIVE, "--alpha", "0.7", "--c", "0.165",
                         "--hardware", "h100", "--format", "json")
    assert rc == 0
    data = json.loads(out)
    assert data["alpha"] == 0.7 and data["c"] == 0.165 and data["hardware"] == "h100"
    states = {s["state"]: s for s in data["states"]}
    s = states["b1_k3_topk1_w4_greedy_chain"]
    # the worked example (c = 0.165, κ = 3, α = 0.70): E = 2.533, chain speedup 1.69
    assert s["expected_tokens"] == pytest.approx(2.533, abs=5e-4)
    assert round(s["speedup"], 2) == 1.69
    # EAGLE-3 at κ = 3: two recurrent passes and the draft-extend (which drafts token 1), counted at one
    # iteration boundary
    assert (s["draft_forward_passes"], s["extend_forward_passes"], s["target_forward_passes"]) == (2, 1, 1)
    assert s["target_tokens_per_step"] == 4 and s["graph_issues"] == []
    # break-even on the h100 profile uses its effective T* (not the 295 peak-ratio T*)
    t_star = cost.saturation_tokens(cost.load_hardware_profile("h100"), 2.0)
    assert s["break_even_batch"] == pytest.approx(cost.break_even_batch(0.7, 3, 0.165, t_star))
    assert states["b8_k0_topk1_w1_greedy_plain"]["break_even_batch"] is None  # never (inf)


def test_alpha_changes_predictions(capsys):
    _, lo, _ = run_cli(capsys, PRESET, "--alpha", "0.3", "--format", "json")
    _, hi, _ = run_cli(capsys, PRESET, "--alpha", "0.9", "--format", "json")
    e_lo = json.loads(lo)["states"][0]["expected_tokens"]
    e_hi = json.loads(hi)["states"][0]["expected_tokens"]
    assert e_lo == pytest.approx(cost.expected_tokens(0.3, 3)) and e_hi == pytest.approx(cost.expected_tokens(0.9, 3))


def test_plot_and_graphs_are_written(capsys, tmp_path):
    png, gdir = tmp_path / "explain.png", tmp_path / "graphs"
    rc, out, _ = run_cli(capsys, PRESET, *ADAPTIVE, "--plot", str(png), "--graphs", str(gdir))
    assert rc == 0 and f"plot written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    js = sorted(gdir.glob("*.json"))
    assert len(js) == 15 and len(list(gdir.glob("*.dot"))) == 15
    assert json.loads(js[0].read_text())["directed"] is True


def test_bad_input_is_a_clean_error(capsys):
    rc, _, err = run_cli(capsys, PRESET, "--alpha", "1.5")
    assert rc == 2 and "--alpha" in err and "Traceback" not in err
    rc, _, err = run_cli(capsys, PRESET, "--hardware", "abacus")
    assert rc == 2 and "abacus" in err
    rc, _, err = run_cli(capsys, "no_such_preset_xyz")
    assert rc == 2 and "no_such_preset_xyz" in err


def test_explain_does_not_import_torch(tmp_path):
    code = ("import sys; from specc.cli import main; "
            f"rc = main(['explain', {PRESET!r}, '--format', 'json']); "
            "assert rc == 0; assert 'torch' not in sys.modules, 'torch was imported'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("argv, words", [
    (("--plot", "out.txt"), ("--plot", "'.txt'", ".png")),
    (("--plot", "out"), ("--plot", ".png")),
    (("--plot", "/proc/specc_no_such_dir/x.png"), ("--plot", "/proc/specc_no_such_dir/x.png", "does not exist")),
    (("--c", "-1"), ("--c", ">= 0")),
    (("--c", "nan"), ("--c", "finite")),
    (("--c", "inf"), ("--c", "finite")),
    (("--alpha", "nan"), ("--alpha",)),
])
def test_bad_flags_are_clean_errors(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, PRESET, *argv)
    assert rc == 2 and out == "" and err.startswith("specc explain: error: ")
    for w in words:
        assert w in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_plot_extension_is_checked_before_computing(capsys, tmp_path, monkeypatch):
    import specc.commands.explain as ex

    def boom(*a, **k):
        raise AssertionError("explain() ran before --plot was validated")

    monkeypatch.setattr(ex, "explain", boom)
    rc, _, err = run_cli(capsys, PRESET, "--plot", str(tmp_path / "out.txt"))
    assert rc == 2 and "--plot" in err


def test_graphs_onto_an_existing_file_is_a_clean_error(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    rc, _, err = run_cli(capsys, PRESET, "--graphs", str(afile))
    assert rc == 2 and "--graphs" in err and "not a directory" in err
    assert afile.read_text() == "keep me"


def test_zero_c_is_accepted(capsys):
    rc, out, _ = run_cli(capsys, PRESET, "--c", "0", "--alpha", "0.7", "--format", "json")
    assert rc == 0
    s = json.loads(out)["states"][0]
    assert s["c"] == 0.0 and s["speedup"] == pytest.approx(s["expected_tokens"])


def test_break_even_agrees_with_speedup(capsys):
    # α = 0: E = 1 < 1 + κc, so speculation pays at no batch size: break-even must say so (<1),
    # not a batch size above 1 (the bare formula T*(E − κc)/(κ + 1) would give one).
    rc, out, _ = run_cli(capsys, PRESET, "--alpha", "0", "--format", "json")
    assert rc == 0
    for s in json.loads(out)["states"]:
        if s["num_steps"] > 0:
            assert s["speedup"] < 1 and s["break_even_batch"] == 0.0
    rc, out, _ = run_cli(capsys, PRESET, "--alpha", "0")
    rows = [ln for ln in out.splitlines() if "_chain" in ln and len(ln.split()) >= 15]  # the main table's rows
    assert rows and all(ln.split()[11] == "<1" for ln in rows)
    rc, out, _ = run_cli(capsys, PRESET, "--alpha", "0.9", "--format", "json")
    for s in json.loads(out)["states"]:
        if s["num_steps"] > 0:
            assert (s["speedup"] >= 1) == (s["break_even_batch"] >= 1)
