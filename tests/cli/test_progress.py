"""Progress output goes to standard error, and only when standard error is a terminal: the standard
output of `specc run --json`, `specc bench --json` and `specc tune` is the result alone, redirected or
not, and a captured standard error (a log, CI) holds no progress bar either."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_bad_input import ckpt, ngram_art, run_cli  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
#: What a tqdm bar prints: its rate / bar characters, and the bar names of the commands.
BAR_TEXT = ("it/s", "req/s", "run/s", "%|", "specc run", "specc bench", "tokenizing prompts", "reading ")


def _no_bar(text: str) -> bool:
    return not any(b in text for b in BAR_TEXT)


def test_progress_is_shown_on_a_terminal_stderr_only(capsys, monkeypatch):
    from specc.console import on_terminal, progress

    capsys.readouterr()
    bar = progress(total=3, desc="work", unit="step", mininterval=0)
    bar.update(3)
    bar.close()
    assert capsys.readouterr() == ("", "")  # stderr is captured, not a terminal: nothing at all
    assert not on_terminal()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert on_terminal()
    for i in progress(range(3), desc="work", unit="step", mininterval=0):
        pass
    out, err = capsys.readouterr()
    assert out == "" and "work" in err and "3/3" in err
    bar = progress(total=3, desc="work", disable=True)  # --no-progress wins on a terminal too
    bar.update(3)
    bar.close()
    assert capsys.readouterr() == ("", "")


def test_tune_bars_follow_the_terminal_rule(capsys, monkeypatch, tmp_path):
    import argparse

    from specc.tune.session import Session

    args = argparse.Namespace(no_progress=False)
    s = Session(args, [], [1], tmp_path / "t.yaml", [], [], "t", "t", 0.0, 60.0)
    capsys.readouterr()
    bar = s.bar(2, "specc tune: measuring")
    bar.set_postfix_str("3 req, τ 1.500 ± 0.100")
    bar.update(2)
    bar.close()
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = s.bar(2, "specc tune: measuring")
    bar.update(2)
    bar.close()
    out, err = capsys.readouterr()
    assert out == "" and "specc tune: measuring" in err


def test_tune_refusal_leaves_stdout_empty(capsys, monkeypatch, tmp_path):
    """tune's paths that stop before any model runs print nothing on stdout, terminal or not."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    rc, out, err = run_cli(capsys, "tune", prompts, "--budget-min", "0", "--out", tmp_path / "t.yaml")
    assert rc == 2 and out == "" and "--budget-min" in err


def _prompts(tmp_path) -> Path:
    p = tmp_path / "p.txt"
    p.write_text("w9 w8 w7 w9 w8 w7 w9 w8\nw20 w21 w22 w23 w20 w21 w22\nw5 w6 w7\n")
    return p


def test_run_json_stdout_holds_results_only_even_on_a_terminal(ngram_art, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    rc, out, err = run_cli(capsys, "run", ngram_art, "--prompts", _prompts(tmp_path), "--max-new-tokens", "8",
                           "--json")
    assert rc == 0, err
    assert "specc run" in err  # the bar is shown, on stderr
    lines = out.splitlines()
    assert lines and all(isinstance(json.loads(ln), dict) for ln in lines) and _no_bar(out)


def test_bench_json_stdout_holds_results_only_even_on_a_terminal(ngram_art, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    rc, out, err = run_cli(capsys, "bench", ngram_art, "--prompts", _prompts(tmp_path), "--max-new-tokens", "4",
                           "--json")
    assert rc == 0, err
    assert "specc bench" in err
    assert isinstance(json.loads(out), dict)
    assert _no_bar(out)


def test_run_json_redirected_has_no_progress_anywhere(ngram_art, tmp_path):
    """`specc run ... --json > out.txt 2> log`: both streams are files; neither holds a bar."""
    r = subprocess.run([sys.executable, "-m", "specc.cli", "run", str(ngram_art), "--prompts",
                        str(_prompts(tmp_path)), "--max-new-tokens", "8", "--json"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert all(isinstance(json.loads(ln), dict) for ln in r.stdout.splitlines())
    assert _no_bar(r.stdout) and "specc run" not in r.stderr and "\r" not in r.stderr
