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

from tests.cli.test_bad_input import ckpt, ngram_art, run_cli, specc_proc, tiny_overrides  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]


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

    from tests.train.test_train_pipeline import V, _naive_greedy, tiny_target
    from tests.train_support import TinyTokenizer

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


# ------------------------------------------------------------------------------------------------
# launch commands: specc's options are specc's, prefixes and required flags as the engine decides


LAUNCH = "python -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3 --speculative-num-steps 70\n"


def test_check_file_is_specc_s_option_not_an_sglang_prefix(capsys, tmp_path):
    """``--file`` is a prefix of SGLang's ``--file-storage-path``: argparse alone would take it so, say
    "ok" and never read the file. It is specc's option, on either side of the engine flag."""
    launch = tmp_path / "launch.sh"
    launch.write_text(LAUNCH)
    for argv in (["--sglang-args", "--file", launch], ["--file", launch, "--sglang-args"],
                 ["--sglang-args", f"--file={launch}", "--format", "json"]):
        rc, out, err = run_cli(capsys, "check", *argv)
        assert rc == 1, (argv, out, err)  # the file was read: num_steps 70 is over the range
        assert "num_steps" in out and "file-storage-path" not in out, out
    assert json.loads(out)[0]["plan"] == str(launch)
    rc, out, err = run_cli(capsys, "check", "--sglang-args", "--model-path", "m", "--file", launch)
    assert rc == 2 and "not both" in out
    rc, out, err = run_cli(capsys, "check", "--file", launch)
    assert rc == 2 and "--sglang-args --file" in err


def test_own_options_are_no_engine_flags():
    """Taking specc's own option spellings out of an engine command is safe only while no engine
    table has an option of that exact spelling: a new table that adds one fails here."""
    from specc.commands import check as C, import_ as I
    from specc.importer.parse import available, load_table

    own = set(C.OWN_OPTIONS) | set(I.OWN_OPTIONS) | {"--sglang-args", "--vllm-args"}
    for engine in ("sglang", "vllm"):
        for version in available(engine):
            clash = own & set(load_table(engine, version).options)
            assert not clash, (engine, version, clash)


def test_import_takes_its_own_options_after_the_double_dash(tmp_path):
    out = tmp_path / "p.yaml"
    res = specc_proc("import", "sglang", "--", "python", "-m", "sglang.launch_server", "--model-path", "m",
                     "--speculative-algorithm", "NGRAM", "-o", out, "--name", "mine")
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "name: mine" in text and "error" not in text


def test_prefix_is_reported_as_the_engine_resolves_it(capsys):
    rc, out, err = run_cli(capsys, "check", "--format", "json", "--sglang-args", "--model-path", "m",
                           "--speculative-alg", "NGRAM", "--file-s", "/tmp/x")
    assert rc == 0, out
    vs = {v["message"].split(" ")[0]: v for v in json.loads(out)[0]["violations"] if v["rule"] == "sglang.argv-prefix"}
    assert set(vs) == {"--speculative-alg", "--file-s"}
    assert vs["--speculative-alg"]["severity"] == "warning"
    assert "read by sglang==0.5.23 as --speculative-algorithm" in vs["--speculative-alg"]["message"]
    assert "as --file-storage-path" in vs["--file-s"]["message"]
    res = specc_proc("import", "sglang", "--", "--model-path", "m", "--speculative-alg", "NGRAM")
    assert res.returncode == 0 and "--speculative-alg is read by sglang==0.5.23 as --speculative-algorithm" in res.stdout


def test_a_command_without_the_model_flag_gets_the_engines_verdict(capsys):
    """SGLang's ``--model-path`` has no default, so its argparse requires it (arg_groups/fields/model.py:51-57,
    arg_utils.py:411-416); ``vllm serve`` without a model serves its default (cli/serve.py:54-57)."""
    rc, out, err = run_cli(capsys, "check", "--sglang-args", "--speculative-algorithm", "EAGLE3")
    assert rc == 1
    assert "sglang==0.5.23 refuses the command: the following arguments are required: --model-path/--model" in out
    rc, out, err = run_cli(capsys, "check", "--format", "json", "--vllm-args", "vllm", "serve",
                           "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')
    res = json.loads(out)[0]
    filled = [v for v in res["violations"] if v["rule"] == "vllm.argv-default"]
    assert rc == 0 and len(filled) == 1 and filled[0]["sets"] == {"target.path": "Qwen/Qwen3-0.6B"}
    assert "serves its default model Qwen/Qwen3-0.6B" in filled[0]["message"]
    from specc.importer import import_command

    # a bare speculative config is no launch command: no model is made up for it
    assert "target" not in import_command("vllm", text='{"method": "ngram", "num_speculative_tokens": 3}').plan


def test_import_refuses_an_unknown_engine_version_like_check(capsys):
    rc, out, err = run_cli(capsys, "import", "sglang==9.9.9", "--", "--model-path", "m")
    assert rc == 2 and out == ""
    assert "unknown engine 'sglang==9.9.9'; known: sglang, sglang==0.5.23" in err
    rc, out2, err2 = run_cli(capsys, "check", "--engine", "sglang==9.9.9", "--sglang-args", "--model-path", "m")
    assert rc == 2 and "unknown engine 'sglang==9.9.9'" in out2


def test_ten_thousand_unknown_flags_each_error_once_and_fast(capsys, monkeypatch):
    flags = [w for i in range(10_000) for w in (f"--bogus-flag-{i}", str(i))]
    t0 = time.perf_counter()
    rc, out, err = run_cli(capsys, "check", "--sglang-args", "--model-path", "m", *flags)
    took = time.perf_counter() - t0
    assert rc == 1 and took < 10, took  # was quadratic (argparse) plus a difflib pass per flag: minutes
    assert out.count("--bogus-flag-4321 4321: not a sglang==0.5.23 flag") == 1  # the flag and its value: one error
    assert "unexpected argument" not in out
    # import with the plan on the terminal: the errors head the plan, stderr only counts them
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    rc, out, err = run_cli(capsys, "import", "sglang", "--", "--model-path", "m", *flags[:200])
    assert rc == 1 and out.count("--bogus-flag-7 7: not a") == 1 and "--bogus-flag-7" not in err
    assert "100 errors" in err


def test_setting_unknown_flags_aside_reads_every_command_as_argparse_does():
    """parse_flags sets unknown flags aside before argparse (linear time); on random commands mixing
    known flags of every arity, prefixes, ambiguous prefixes, unknown flags and values, it reads
    exactly what argparse reads with nothing set aside."""
    import random

    from specc.importer import parse as P

    rng = random.Random(0)
    for engine in ("sglang", "vllm"):
        table = P.load_table(engine)
        opts = [a for a in table.actions if a["options"] and a["kind"] != "help"]
        for _ in range(300):
            words = [] if engine == "sglang" or rng.random() < 0.5 else ["model-x"]
            for _ in range(rng.randrange(1, 12)):
                r = rng.random()
                if r < 0.4:
                    a = rng.choice(opts)
                    words.append(rng.choice(a["options"]))
                elif r < 0.5:
                    words.append(rng.choice(opts)["options"][0][:rng.randrange(3, 12)])  # a prefix
                elif r < 0.8:
                    words.append(f"--unknown-{rng.randrange(99)}" + ("=v" if rng.random() < 0.2 else ""))
                words += [str(rng.randrange(100)) for _ in range(rng.choice([0, 0, 1, 2]))]
            fast = P.parse_flags(table, words)
            orig = P._set_aside_unknown
            P._set_aside_unknown = lambda parser, table, args: (args, [])
            try:
                slow = P.parse_flags(table, words)
            finally:
                P._set_aside_unknown = orig
            assert fast.values == slow.values and sorted(fast.errors) == sorted(slow.errors), words


def test_undecided_hint_quotes_the_shell_line():
    import shlex

    from tests.check.test_engine_cases import MTP_V, _rules, build

    evil = "$(touch /tmp/pwned)/x; rm -rf ~"
    u = _rules(build(MTP_V, {"method.num_steps": 3, "target.path": evil}), "vllm")["vllm.R25"]
    assert u.severity == "undecided"
    line = u.message.split("`")[1]
    assert shlex.split(line) == ["huggingface-cli", "download", evil, "config.json"]


def test_profile_max_tokens_too_large_names_max_tokens(capsys, tmp_path):
    t0 = time.perf_counter()
    rc, out, err = run_cli(capsys, "profile", "smollm2_ngram", "--out", tmp_path / "t.json", "--max-tokens", "1000000")
    assert rc == 2 and "--max-tokens 1000000" in err and "lower --max-tokens to at most" in err, err
    assert "lower --context" not in err and time.perf_counter() - t0 < 60  # refused before any model loads
    rc, out, err = run_cli(capsys, "profile", "smollm2_ngram", "--out", tmp_path / "t.json", "--context", "4000")
    assert rc == 2 and "lower --context" in err


def test_large_prompts_file_shows_progress_while_read(tmp_path, capsys, monkeypatch):
    from specc.runtime.prompts import PROGRESS_BYTES, read_prompts

    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        i = 0
        while f.tell() <= PROGRESS_BYTES:
            f.write(json.dumps({"id": f"p{i}", "prompt": "Tell me about topic number 12345, please."}) + "\n")
            i += 1
    capsys.readouterr()
    recs = read_prompts(path, progress=True)  # stderr is not a terminal here: no bar
    assert len(recs) > 50_000 and capsys.readouterr() == ("", "")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    read_prompts(path, progress=True)
    out, err = capsys.readouterr()
    assert f"reading {path}" in err and "lines" in err and out == ""  # on stderr only, never stdout
    read_prompts(path)  # no bar unless asked
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------
# found by the adversarial pass after the fixes


def test_prompts_that_are_not_unicode_are_errors_not_tracebacks(ngram_art, tmp_path):
    """A command-line argument in another encoding reaches Python as lone surrogates (PEP 383); a
    JSONL prompt may carry a ``\\ud800`` escape. Each is a one-line error naming where."""
    res = subprocess.run([sys.executable.encode(), b"-m", b"specc.cli", b"run", str(ngram_art).encode(), b"--prompt",
                          b"w5 \xff w6", b"--max-new-tokens", b"2"], capture_output=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    err = res.stderr.decode()
    assert res.returncode == 2 and "Traceback" not in err
    assert "--prompt: character 3 is byte 0xff, which is not UTF-8" in err
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "x", "prompt": "w5 \\ud800"}\n')
    res = specc_proc("run", ngram_art, "--prompts", bad, "--max-new-tokens", "2")
    assert res.returncode == 2 and "prompt x: character 3 is a lone UTF-16 surrogate" in res.stderr


def test_serve_and_run_flags_refused_while_parsing(capsys, tmp_path):
    for argv, words in ((["serve", tmp_path, "--port", "70000"], "port number in [1, 65535]"),
                        (["serve", tmp_path, "--max-request-bytes", "0"], "at least 1 byte"),
                        (["serve", tmp_path, "--max-request-bytes", "1e6"], "512KiB"),
                        (["serve", tmp_path, "--threads", "100000"], "this machine's CPUs")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            cli_main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and "Traceback" not in err, err


def test_engine_that_contradicts_the_command_is_refused(capsys):
    rc, out, err = run_cli(capsys, "check", "--engine", "vllm", "--sglang-args", "--model-path", "m")
    assert rc == 2 and "--engine vllm does not match --sglang-args" in out
