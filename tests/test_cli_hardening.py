"""Findings of a newcomer's adversarial trial of the CLI, one test (or more) each:

* an interrupted ``specc run`` keeps what it finished (written as each request finishes, the
  summary of those on SIGINT, exit 130), and ``specc train distill`` keeps every finished answer;
* ``specc train`` overrides are checked like the recipe fields they override, with the same message;
* ``specc check --sglang-args --file X`` reads X (specc's own options are never engine flags), a
  prefix is reported as the engine resolves it, a command without the engine's required model flag
  gets the engine's verdict, and ``specc import`` refuses an engine version it has no table for;
* 10,000 unknown flags: each error once, fast; shell lines in hints are quoted; ``profile
  --max-tokens`` too large names itself; a large prompts file shows progress while it is read.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specc.cli import main as cli_main

from test_bad_input import ckpt, ngram_art, run_cli, specc_proc, tiny_overrides  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# an interrupted run keeps its answers


def _interrupted_run(art, tmp_path, json_mode: bool):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"w{2 + i % 60} w{3 + i % 50} w{4 + i % 40}\n" for i in range(60)))
    argv = [sys.executable, "-m", "specc.cli", "run", str(art), "--prompts", str(prompts), "--max-new-tokens", "120",
            "--no-progress"] + (["--json"] if json_mode else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    lines = []
    t0 = time.time()
    marker = "{" if json_mode else "---"
    try:
        while sum(l.startswith(marker) for l in lines) < 5:  # five results are out while the run goes on
            line = proc.stdout.readline()
            assert line, f"specc run ended early: {proc.stderr.read()[-2000:]}"
            lines.append(line)
            assert time.time() - t0 < 120
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(lines) + out, err


def test_interrupted_run_keeps_its_json_results_and_prints_their_summary(ngram_art, tmp_path):
    rc, out, err = _interrupted_run(ngram_art, tmp_path, json_mode=True)
    assert rc == 130, err[-2000:]
    objs = [json.loads(l) for l in out.splitlines()]  # every line whole
    results, summary = objs[:-1], objs[-1]["summary"]
    assert all("id" in o and "text" in o for o in results) and len(results) >= 5
    assert len({o["id"] for o in results}) == len(results) < 60
    assert summary["interrupted"] is True and summary["finished"] == len(results) == summary["num_requests"]
    assert summary["requests"] == 60
    assert summary["num_output_tokens"] == sum(o["num_tokens"] for o in results)
    assert "interrupted after" in err and "Traceback" not in err


def test_interrupted_run_keeps_its_text_results(ngram_art, tmp_path):
    rc, out, err = _interrupted_run(ngram_art, tmp_path, json_mode=False)
    assert rc == 130, err[-2000:]
    n = out.count("\n--- ")  + out.startswith("--- ")
    assert n >= 5 and out.count("=== [line-") == n
    assert f"interrupted after {n} of 60" in out and f"requests {n}," in out


# ------------------------------------------------------------------------------------------------
# an interrupted distillation keeps every finished answer


class _Interrupting:
    """A target whose ``after``-th forward raises KeyboardInterrupt (SIGINT mid-chunk)."""

    def __init__(self, model, after: int) -> None:
        self.model, self.after, self.calls = model, after, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kw):
        self.calls += 1
        if self.calls == self.after:
            raise KeyboardInterrupt
        return self.model(*args, **kw)


def test_interrupted_distill_keeps_every_finished_answer_and_resumes(tmp_path):
    from specc.train import distill, shards as S

    from test_train_pipeline import V, _naive_greedy, tiny_target
    from train_support import TinyTokenizer

    target = tiny_target(seed=4)
    tok = TinyTokenizer(V)
    rows = [{"id": f"p{i:02d}", "category": "qa", "source": "wordnet",
             "messages": [{"role": "user", "content": f"question {i} " * (1 + i % 3)}]} for i in range(12)]
    logs = []
    with pytest.raises(KeyboardInterrupt):  # one chunk of 12 prompts, 2 rows: interrupted mid-chunk
        distill.run_tokens(_Interrupting(target, after=20), tok, rows, tmp_path, max_new=5, batch=2,
                           shard_size=12, log=logs.append)
    kept = S.done_ids(tmp_path)
    assert 2 <= len(kept) < 12, logs  # the prompts answered before the interrupt are on disk
    assert any("interrupted" in l for l in logs)
    distill.run_tokens(target, tok, rows, tmp_path, max_new=5, batch=2, shard_size=12, log=logs.append)
    tokens = S.load([tmp_path])
    ids = [m["id"] for m in tokens.meta]
    assert sorted(ids) == [r["id"] for r in rows]  # each prompt once: resumed after the kept ones
    for seq, P, m in zip(tokens.seqs, tokens.prompt_len, tokens.meta):
        prompt = tok.apply_chat_template(rows[int(m["id"][1:])]["messages"])
        assert seq[:P].tolist() == prompt and seq[P:].tolist() == _naive_greedy(target, prompt, 5, tok.eos_token_ids)


# ------------------------------------------------------------------------------------------------
# specc train overrides are checked like recipe fields


@pytest.mark.parametrize("argv, expect", [
    (["fit", "smollm2_135m_eagle3", "--time-budget-min", "-5"],
     "--time-budget-min -5.0: time_budget_min=-5.0 must be a finite number > 0 (minutes; e.g. time_budget_min: 60)"),
    (["fit", "smollm2_135m_eagle3", "--time-budget-min", "0"], "time_budget_min=0.0 must be a finite number > 0"),
    (["fit", "smollm2_135m_eagle3", "--time-budget-min", "nan"], "time_budget_min=nan must be a finite number > 0"),
    (["distill", "smollm2_specbench", "--time-budget-min", "inf"], "time_budget_min=inf must be a finite number"),
    (["fit", "smollm2_135m_eagle3", "--threads", "0"], "threads=0 must be an integer in [1, "),
    (["fit", "smollm2_135m_eagle3", "--threads", "-1"], "threads=-1 must be an integer in [1, "),
    (["fit", "smollm2_135m_eagle3", "--threads", "100000"], "threads=100000 must be an integer in [1, "),
    (["distill", "smollm2_specbench", "--limit", "0"], "--limit 0: limit=0 must be an integer >= 1"),
    (["distill", "smollm2_specbench", "--gen-batch", "0"], "gen_batch=0 must be an integer >= 1 (e.g. gen_batch: 48)"),
    (["distill", "smollm2_specbench", "--max-prompts", "0"], "max_prompts=0 must be an integer >= 1"),
    (["fit", "smollm2_135m_eagle3", "--limit", "5"], "--limit: `specc train fit` does not read it"),
])
def test_train_overrides_are_checked_like_recipe_fields(capsys, monkeypatch, argv, expect):
    from specc.train import pipeline

    def never(*a, **k):
        raise AssertionError("the stage ran")

    monkeypatch.setattr(pipeline, "run_stage", never)
    rc, out, err = run_cli(capsys, "train", *argv)
    assert rc == 2 and expect in err and "Traceback" not in err, err
    assert err.count("\n") == 1  # one line


def test_the_recipe_field_and_its_override_share_the_message(tmp_path):
    from specc.train import recipe as R

    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nkind: eagle3\ndata: smollm2_specbench\nout: /tmp/x\ntime_budget_min: -5\n")
    with pytest.raises(R.RecipeError) as from_file:
        R.load_fit_recipe(str(path))
    with pytest.raises(R.RecipeError) as from_flag:
        R.check_overrides("fit", {"--time-budget-min": -5.0})
    tail = "time_budget_min=-5.0 must be a finite number > 0 (minutes; e.g. time_budget_min: 60)"
    assert str(from_file.value).endswith(tail) and str(from_flag.value).endswith(tail)


def test_fit_records_the_override_it_ran_with(monkeypatch, tmp_path):
    """``--time-budget-min 7`` reaches the recipe the fit records (training.json), not only the loop."""
    import argparse

    from specc.train import fit as F, pipeline

    seen = {}
    monkeypatch.setattr(F, "fit", lambda fit, cache, args: seen.update(budget=fit.time_budget_min, threads=fit.threads))
    args = argparse.Namespace(time_budget_min=7.0, threads=1, out=None)
    assert pipeline.run_stage("fit", "smollm2_135m_eagle3", tmp_path, args) == 0
    assert seen == {"budget": 7.0, "threads": 1}
