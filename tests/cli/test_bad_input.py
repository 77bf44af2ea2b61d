"""Bad input never hurts and numbers never mislead: one test (or more) per finding of the
adversarial review, each of which failed on the code before the fix.

Anything that used to hang or read without bound runs in a subprocess with a timeout and an
address-space limit, so on broken code the test fails instead of hanging the suite or the machine.
"""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from specc.compiler import build
from specc.compiler import codegen
from specc.predict import cost
from specc.cli import main as cli_main
from specc.errors import ArtifactError, PlanError, PromptError
from specc.runtime.prompts import read_prompts

ROOT = Path(__file__).resolve().parents[2]
V = 64

# The example plan of docs/guide/check.md (section "Checking a plan before anything starts").
README_PLAN = """\
defaults:
  - /target: smollm2_135m
  - /draft: smollm2_135m_eagle3
  - _self_

name: my_eagle3_tree
engine: sglang
method:
  name: eagle3
  num_steps: 5
  topk: 4
  num_draft_tokens: 8
verify:
  rule: standard
  draft_sampling: probabilistic
schedule:
  kind: adaptive
"""


def _limit_memory():  # runs in the child before exec: 4 GiB of address space at most
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def specc_proc(*argv, timeout=90, stdin=None, cwd=None):
    """``specc ARGV`` in a fresh interpreter, bounded in time and memory."""
    return subprocess.run([sys.executable, "-m", "specc.cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                          preexec_fn=_limit_memory, cwd=cwd or ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))


def run_cli(capsys, *argv):
    capsys.readouterr()
    rc = cli_main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Tiny target and draft checkpoints on disk (the runtime tests' helper)."""
    import torch

    from specc.runtime.testing import perturbed_copy, tiny_llama
    from tests.runtime.test_runtime_artifact import _write_checkpoint

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    target = tiny_llama(seed=0, vocab_size=V)
    _write_checkpoint(target, root / "target")
    _write_checkpoint(perturbed_copy(target, noise=0.02, seed=1), root / "draft")
    return root


def tiny_overrides(root, draft=False):
    out = [f"target.path={root / 'target'}", "target.format=hf", f"target.vocab_size={V}", "target.max_model_len=128"]
    if draft:
        out += [f"draft.path={root / 'draft'}", f"draft.vocab_size={V}", "draft.max_model_len=128"]
    return out


@pytest.fixture(scope="module")
def ngram_art(ckpt, tmp_path_factory):
    """A compiled n-gram artifact over the tiny target (compiling does not import torch)."""
    from specc.plan.load import load_plan

    out = tmp_path_factory.mktemp("art")
    return build.compile_plan(load_plan("smollm2_ngram", tiny_overrides(ckpt)).plan, out).path


def _copy(art: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(art, dest)
    return dest


# ------------------------------------------------------------------------------------------------
# 1. `specc run ART --prompts /dev/zero` read until the machine ran out of memory


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "stdin_dev_zero", "huge_file"])
def test_prompts_are_read_bounded_and_only_from_regular_files(ngram_art, tmp_path, kind):
    stdin = None
    if kind == "dev_zero":
        argv, words = ("--prompts", "/dev/zero"), ("/dev/zero", "character device")
    elif kind == "fifo":
        fifo = tmp_path / "prompts.jsonl"
        os.mkfifo(fifo)
        argv, words = ("--prompts", fifo), (str(fifo), "FIFO", "--prompts -")
    elif kind == "stdin_dev_zero":
        stdin = open("/dev/zero", "rb")
        argv, words = ("--prompts", "-"), ("standard input", "64 MiB")
    else:
        big = tmp_path / "big.txt"
        with open(big, "wb") as fh:  # sparse: 65 MiB of nothing, never written out
            fh.truncate(65 << 20)
        argv, words = ("--prompts", big), (str(big), "65 MiB", "64 MiB limit")
    try:
        res = specc_proc("run", ngram_art, *argv, "--max-new-tokens", "2", stdin=stdin)
    finally:
        if stdin is not None:
            stdin.close()
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.startswith("specc run: error: ") and "Traceback" not in res.stderr
    for w in words:
        assert w in res.stderr


def test_read_prompts_refuses_devices_and_directories(tmp_path):
    with pytest.raises(PromptError, match="character device"):
        read_prompts("/dev/null")
    with pytest.raises(PromptError, match="directory"):
        read_prompts(tmp_path)


# ------------------------------------------------------------------------------------------------
# 2. an artifact file replaced by a symlink to /dev/zero: MemoryError; a symlink to a FIFO: hang


@pytest.mark.parametrize("tamper", ["link_dev_zero", "link_fifo", "fifo", "link_outside", "dir_link",
                                    "manifest_link"])
def test_artifact_files_must_be_regular_files_inside_the_artifact(ngram_art, tmp_path, tamper):
    art = _copy(ngram_art, tmp_path / "art")
    target = art / "report.md"
    if tamper == "link_dev_zero":
        target.unlink()
        target.symlink_to("/dev/zero")
    elif tamper == "link_fifo":
        os.mkfifo(tmp_path / "pipe")
        target.unlink()
        target.symlink_to(tmp_path / "pipe")
    elif tamper == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif tamper == "link_outside":  # same bytes, but living outside the artifact
        outside = tmp_path / "report.md"
        outside.write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(outside)
    elif tamper == "dir_link":
        (art / "kernels").rename(tmp_path / "kernels")
        (art / "kernels").symlink_to(tmp_path / "kernels")
    else:
        outside = tmp_path / "manifest.json"
        outside.write_bytes((art / "manifest.json").read_bytes())
        (art / "manifest.json").unlink()
        (art / "manifest.json").symlink_to(outside)
    res = specc_proc("run", art, "--prompt", "w5 w6", "--max-new-tokens", "2", timeout=60)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr
    assert re.search(r"(symbolic link|FIFO)", res.stderr), res.stderr
    assert "specc compile" in res.stderr  # the fix


def test_verify_files_reads_no_more_than_the_limit(ngram_art, tmp_path, monkeypatch):
    from specc.runtime import artifact

    art = _copy(ngram_art, tmp_path / "art")
    with open(art / "report.md", "ab") as fh:
        fh.truncate(2 << 20)
    monkeypatch.setattr(artifact, "ARTIFACT_FILE_LIMIT", 1 << 20)
    with pytest.raises(ArtifactError, match=r"report.md: is 2 MiB, over the 1 MiB limit"):
        artifact.verify_files(art, artifact.read_manifest(art))


# ------------------------------------------------------------------------------------------------
# 3. explain with method.num_steps: 1000000 ran 3 minutes; explain never ran the plan's checks


@pytest.mark.parametrize("override, words", [
    ("method.num_steps=1000000", ("method.num_steps: 1000000 is out of range", "[0, 64]")),
    ("method.num_draft_tokens=99999999", ("method.num_draft_tokens", "[1, 1024]")),
    ("runtime.max_batch_size=100000000", ("runtime.max_batch_size", "[1, 65536]")),
    ("schedule.capture_batch_sizes=[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,"
     "29,30,31,32,33,34,35,36,37,38,39,40]", None),
])
def test_absurd_values_are_refused_quickly_before_any_work(tmp_path, override, words):
    if words is None:  # 40 captured sizes × 65 κ candidates = 2600 states: each would be graphed
        plan = tmp_path / "p.yaml"
        plan.write_text("defaults: [/target: smollm2_135m, /draft: smollm2_135m_eagle3, /method: eagle3, _self_]\n"
                        "name: many\nengine: sglang\nschedule:\n  kind: adaptive\n  buckets:\n"
                        f"    1: {{candidates: {list(range(65))}}}\n")
        res = specc_proc("explain", plan, override, timeout=60)
        words = ("2600 candidate states", "at most 512")
    else:
        res = specc_proc("explain", "smollm2_eagle3", override, timeout=60)
    assert res.returncode == 2, res.stdout[-1000:] + res.stderr[-1000:]
    assert "<override>" in res.stderr or "candidate states" in res.stderr
    for w in words:
        assert w in res.stderr


def _error_lines(text):
    return [ln.strip() for ln in text.splitlines() if ": error: [" in ln]


def test_explain_refuses_what_check_refuses_with_the_same_messages(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("plan.yaml").write_text(README_PLAN)
    rc_check, out_check, _ = run_cli(capsys, "check", "plan.yaml")
    rc, out, err = run_cli(capsys, "explain", "plan.yaml")
    assert rc_check == 1 and rc == 1 and out == ""
    assert _error_lines(err) == _error_lines(out_check) != []
    assert "[sglang.EG16]" in err and "exceeds the draft tree" not in err
    # the specc profile's rules too: compile refuses block verification of a draft tree, so does explain
    rc, _, err = run_cli(capsys, "explain", "smollm2_eagle3", "method.topk=4", "verify.rule=block")
    assert rc == 1 and "<override> verify.rule=block: error: [specc.S-VERIFY]" in err


# ------------------------------------------------------------------------------------------------
# 4. explain on the README's plan failed with "κ = 1" from adaptive buckets SGLang drops for topk > 1


def test_readme_plan_is_explained_as_the_engine_runs_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("plan.yaml").write_text(README_PLAN)
    # with the EG16 error fixed as check suggests, the adaptive schedule falls back to static (AD3)
    rc, out, err = run_cli(capsys, "explain", "plan.yaml", "verify.draft_sampling=greedy", "--format", "json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["schedule"] == "static" and data["engine"] == "sglang"
    assert {v["rule"] for v in data["violations"]} >= {"sglang.AD3"}
    assert {(s["num_steps"], s["num_draft_tokens"]) for s in data["states"]} == {(5, 8)}
    rc, out, _ = run_cli(capsys, "explain", "plan.yaml", "verify.draft_sampling=greedy")
    assert rc == 0 and "fallback: [sglang.AD3]" in out and "b1_k5_topk4_w8_standard_tree" in out


# ------------------------------------------------------------------------------------------------
# 6. numbers that mislead: α's origin, measured acceptance, decode tok/s, the two speedup columns


def test_prediction_says_where_alpha_comes_from(capsys):
    rc, out, _ = run_cli(capsys, "explain", "smollm2_eagle3")  # the head's shipped acceptance record
    assert rc == 0 and "acceptance.json" in out
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu")  # no record: none assumed
    assert rc == 0 and "no α was measured or given" in out and "--acceptance" in out
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu", "--format", "json")
    data = json.loads(out)
    assert data["alpha_measured"] is False and data["alpha"] is None and "no α was measured" in data["alpha_note"]
    rc, out, _ = run_cli(capsys, "explain", "smollm2_eagle3", "--alpha", "0.3")
    assert rc == 0 and "(--alpha)" in out


def _run_json(capsys, art, tmp_path, *extra):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w9 w8 w7 w9 w8 w7 w9 w8\nw20 w21 w22 w23 w20 w21 w22\nw5 w6 w7\n")
    rc, out, err = run_cli(capsys, "run", art, "--prompts", prompts, "--max-new-tokens", "24", "--json",
                           "--no-progress", *extra)
    assert rc == 0, err
    return out


def test_explain_predicts_from_the_acceptance_a_run_measured(ckpt, capsys, tmp_path):
    over = tiny_overrides(ckpt, draft=True)
    rc, out, err = run_cli(capsys, "compile", "smollm2_draft_model", *over, "--out", tmp_path / "art",
                           "--print-path")
    assert rc == 0, err
    art = out.strip().splitlines()[-1]
    run_out = _run_json(capsys, art, tmp_path)
    (tmp_path / "run.jsonl").write_text(run_out)
    summary = json.loads(run_out.strip().splitlines()[-1])["summary"]
    kappa = len(summary["num_accepted_tokens_per_pos"])
    assert summary["num_drafts"] > 0 and kappa >= 1
    rc, out, err = run_cli(capsys, "explain", "smollm2_draft_model", *over, "--acceptance", tmp_path / "run.jsonl",
                           "--format", "json")
    assert rc == 0, err
    data = json.loads(out)
    tau = 1 + sum(summary["num_accepted_tokens_per_pos"]) / summary["num_steps"]
    assert data["alpha_measured"] is True and data["alpha_source"].startswith("measured: ")
    assert data["measured_acceptance"]["tau"] == pytest.approx(tau)
    assert data["alpha"] == pytest.approx(cost.alpha_for_expected_tokens(tau, kappa))
    at_kappa = [s for s in data["states"] if s["num_steps"] == kappa]
    assert at_kappa and all(s["expected_tokens"] == pytest.approx(tau, abs=1e-6) for s in at_kappa)
    assert all(s["alpha_source"] == data["alpha_source"] for s in data["states"])
    rc, out, _ = run_cli(capsys, "explain", "smollm2_draft_model", *over, "--acceptance", tmp_path / "run.jsonl")
    assert rc == 0 and "α = " in out and "measured: " in out and "not a measurement" not in out


@pytest.mark.parametrize("content, words", [
    (None, ("no such file",)),
    ("not json\n", ("not JSON", "specc run ARTIFACT --json")),
    ('{"id": "a", "text": "x"}\n', ("no {\"summary\"",)),
    ('{"summary": {"num_steps": 5, "num_drafts": 0, "num_accepted_tokens_per_pos": []}}\n', ("drafted nothing",)),
    ('{"summary": {"num_steps": 5, "num_drafts": 5, "num_accepted_tokens_per_pos": [2, 3]}}\n', ("does not fit",)),
    ('{"summary": {"num_steps": "5", "num_drafts": 5, "num_accepted_tokens_per_pos": [2]}}\n', ("integer counters",)),
    ("FIFO", ("FIFO",)),
])
def test_bad_acceptance_files_are_clean_errors(capsys, tmp_path, content, words):
    path = tmp_path / "run.jsonl"
    if content == "FIFO":
        os.mkfifo(path)
    elif content is not None:
        path.write_text(content)
    rc, out, err = run_cli(capsys, "explain", "smollm2_eagle3", "--acceptance", path)
    assert rc == 2 and out == "" and err.startswith("specc explain: error: --acceptance")
    for w in words:
        assert w in err


def test_acceptance_and_alpha_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["explain", "smollm2_eagle3", "--alpha", "0.5", "--acceptance", "x.json"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_run_prints_decode_rate_with_prefill_excluded(ngram_art, capsys, tmp_path):
    summary = json.loads(_run_json(capsys, ngram_art, tmp_path).strip().splitlines()[-1])["summary"]
    prefill = summary["stage_time_s"]["prefill"]
    assert prefill > 0 and summary["decode_time_s"] == pytest.approx(summary["wall_time_s"] - prefill, abs=2e-4)
    span = summary["wall_time_s"] - prefill
    decode = (summary["num_output_tokens"] - summary["num_requests"]) / span
    # the summary rounds times to 1e-4 s: on a fast run (a few ms of decode) that alone moves the rate
    assert summary["decode_tokens_per_s"] == pytest.approx(decode, rel=1e-3 + 2e-4 / span)
    assert summary["decode_time_s"] < summary["wall_time_s"]  # prefill no longer counted
    prompts = tmp_path / "p.txt"
    rc, out, _ = run_cli(capsys, "run", ngram_art, "--prompts", prompts, "--max-new-tokens", "8", "--no-progress")
    assert rc == 0
    assert re.search(r"decode [\d.]+ tok/s \(prefill excluded\), end-to-end [\d.]+ tok/s \(prefill [\d.]+s of "
                     r"[\d.]+s\)", out), out


def test_bench_prints_decode_and_end_to_end_rates(ngram_art, capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "qa", "prompt": "w5 w6 w7"}\n')
    rc, out, _ = run_cli(capsys, "bench", ngram_art, "--prompts", prompts, "--max-new-tokens", "6")
    assert rc == 0
    header = next(ln for ln in out.splitlines() if ln.startswith("category"))
    assert "decode tok/s" in header and "e2e tok/s" in header
    assert "prefill excluded" in out and "prefill included" in out
    # explain's prediction stands beside the measurement, or why there is none (no records for this target)
    assert "explain's prediction: " in out or "explain predicted at batch 1: " in out
    rc, out, _ = run_cli(capsys, "bench", ngram_art, "--prompts", prompts, "--max-new-tokens", "6",
                         "--concurrency", "1", "--json")
    data = json.loads(out.strip().splitlines()[-1])
    assert rc == 0 and set(data["explain"]) == {"cost_table", "acceptance", "tuned", "unknown"}
    row = data["results"][0]
    assert {"explain_speedup", "explain_tok_s", "measured_over_explain"} <= set(row)
    assert (row["explain_speedup"] is None) == bool(data["explain"]["unknown"])


def test_speedup_columns_are_explained_where_they_differ_at_batch_1(capsys):
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu", "--alpha", "0.7")
    assert rc == 0
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()
            if ln.startswith("b1_") and len(ln.split()) >= 15}  # the prediction table, not the deployment one
    differ = [name for name, r in rows.items() if r[9] != r[10]]  # speedup, speedup@B
    assert "b1_k5_topk1_w6_greedy_chain" in differ
    legend = next(ln for ln in out.splitlines() if "at batch 1 they differ" in ln)
    assert all(name in legend for name in differ) and "T*" in legend
    assert "speedup: E / (1 + draft cost)" in out and "speedup@B: at the bucket's batch B" in out
    rc, out, _ = run_cli(capsys, "explain", "sglang_eagle3_adaptive", "--hardware", "cpu", "--alpha", "0.7",
                         "--format", "json")
    assert "max(1, n / T*)" in json.loads(out)["speedup_columns"]


# ------------------------------------------------------------------------------------------------
# 7. messages that point the wrong way


def test_cost_table_errors_name_the_format_not_a_missing_command(tmp_path):
    import importlib.util

    has_profile = importlib.util.find_spec("specc.commands.profile") is not None
    for path, words in ((tmp_path / "missing.json", "file not found"), ("/dev/zero", "character device")):
        with pytest.raises(PlanError) as exc:
            cost.load_cost_table(str(path))
        msg = str(exc.value)
        assert msg.startswith("schedule.cost_table: ") and words in msg
        assert "verify_ms" in msg or "character device" in msg
        assert has_profile or "specc profile" not in msg
    bad = tmp_path / "nan.json"
    bad.write_text('{"verify_ms": {"1": "NaN"}}')
    with pytest.raises(PlanError, match="finite"):
        cost.load_cost_table(str(bad))


def test_override_typo_is_named_as_an_override(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("plan.yaml").write_text(README_PLAN)
    for cmd in ("check", "explain", "compile"):
        rc, out, err = run_cli(capsys, cmd, "plan.yaml", "method.num_step=5")
        text = out + err
        assert rc == 2
        assert "<override> method.num_step=5: method.num_step: unknown key; did you mean 'method.num_steps'?" in text
        assert "plan.yaml:8" not in text and "plan.yaml:14" not in text


def test_plot_into_a_missing_folder_is_an_error_and_creates_nothing(capsys, tmp_path):
    target = tmp_path / "nonexistent_dir" / "x.png"
    rc, out, err = run_cli(capsys, "explain", "smollm2_eagle3", "--plot", target)
    assert rc == 2 and out == "" and "does not exist" in err and str(target.parent) in err
    assert not target.parent.exists()
    rc, _, err = run_cli(capsys, "explain", "smollm2_eagle3", "--graphs", tmp_path / "nope" / "graphs")
    assert rc == 2 and "does not exist" in err and not (tmp_path / "nope").exists()


# ------------------------------------------------------------------------------------------------
# 8. SIGTERM during compile leaves .tmp-*; concurrent compiles say "replaced"; an alias bomb expands


WRITER = textwrap.dedent("""
    import os, signal, sys, time
    from specc.compiler import build, codegen
    from specc.plan.load import load_plan
    name, files = codegen.render(build.lower_to_ir(load_plan("smollm2_ngram").plan))
    calls = []
    def on_file(rel):
        calls.append(rel)
        if len(calls) == 3:
            print("ready", flush=True)
            if sys.argv[2] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
    codegen.write_artifact(sys.argv[1], name, files, on_file=on_file)
    print("finished", flush=True)
""")


def _writer(out, mode):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out), mode], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    line = proc.stdout.readline().strip()
    assert line == "ready", line
    return proc


def test_sigterm_during_compile_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    proc = _writer(out, "wait")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # cleaned up, then ended by the signal as usual
    assert list(out.iterdir()) == []


def test_stale_temp_dirs_of_dead_compiles_are_removed_and_live_ones_kept(tmp_path):
    out = tmp_path / "out"
    dead = _writer(out, "kill")
    assert dead.wait(timeout=30) == -signal.SIGKILL
    (stale,) = [p for p in out.iterdir() if ".tmp-" in p.name]
    live = _writer(out, "wait")
    try:
        (live_tmp,) = [p for p in out.iterdir() if ".tmp-" in p.name and p != stale]
        res = build.compile_plan(__import__("specc.plan.load", fromlist=["x"]).load_plan("smollm2_ngram").plan, out)
        assert res.status == "created"
        assert not stale.exists() and live_tmp.is_dir()  # the live compile's directory is untouched
    finally:
        live.kill()
        live.wait(timeout=30)
    again = build.compile_plan(__import__("specc.plan.load", fromlist=["x"]).load_plan("smollm2_ngram").plan, out)
    assert again.status == "unchanged"
    assert sorted(p.name for p in out.iterdir()) == [res.path.name]


def test_concurrent_compiles_of_one_plan_report_honestly(tmp_path):
    from specc.plan.load import load_plan

    name, files = codegen.render(build.lower_to_ir(load_plan("smollm2_ngram").plan))
    out = tmp_path / "out"
    first_writing = threading.Event()
    second_done = threading.Event()
    results = {}

    def slow(rel):
        first_writing.set()
        assert second_done.wait(60)

    def first():
        results["first"] = codegen.write_artifact(out, name, files, on_file=slow)

    t = threading.Thread(target=first)
    t.start()
    assert first_writing.wait(60)
    results["second"] = codegen.write_artifact(out, name, files)
    second_done.set()
    t.join(60)
    assert results["second"].status == "created"
    assert results["first"].status == "unchanged"  # identical content was already there: not "replaced"
    assert sorted(p.name for p in out.iterdir()) == [name]
    out_other = dict(files, **{"report.md": b"other\n"})
    assert codegen.write_artifact(out, name, out_other).status == "replaced"


def test_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["defaults: [/target: smollm2_135m, _self_]", "name: bomb", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    plan = tmp_path / "bomb.yaml"
    plan.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    res = specc_proc("check", plan, timeout=60)
    assert res.returncode == 2, res.stdout[-2000:]
    assert "alias" in res.stdout and "100,000" in res.stdout
    # a group file next to the plan is checked before Hydra reads it, and a FIFO there does not hang
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "evil.yaml").write_text("\n".join(lines[2:]) + "\n")
    os.mkfifo(tmp_path / "method" / "pipe.yaml")
    for option, word in (("evil", "alias"), ("pipe", "FIFO")):
        user = tmp_path / f"uses_{option}.yaml"
        user.write_text(f"defaults:\n  - /target: smollm2_135m\n  - method: {option}\n  - _self_\nname: u\n")
        res = specc_proc("check", user, timeout=60)
        assert res.returncode == 2 and word in res.stdout, res.stdout[-2000:]
    assert time.perf_counter() - t0 < 120  # three commands, not minutes of expansion each


def test_suffix_run_reports_host_work_and_explain_uses_its_acceptance(ckpt, capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w9 w8 w7 w9 w8 w7 w9 w8 w20 w21 w22 w23\n")
    over = tiny_overrides(ckpt) + [f"method.suffix.corpora=[{corpus}]"]
    rc, out, err = run_cli(capsys, "compile", "smollm2_suffix", *over, "--out", tmp_path / "art", "--print-path")
    assert rc == 0, err
    art = out.strip().splitlines()[-1]
    run_out = _run_json(capsys, art, tmp_path)
    (tmp_path / "run.jsonl").write_text(run_out)
    summary = json.loads(run_out.strip().splitlines()[-1])["summary"]
    assert summary["drafter"]["corpus_tokens"] > 0 and summary["drafter"]["documents"] == 1
    assert summary["stage_ms_per_step"]["draft"] > 0 and summary["stage_ms_per_step"]["verify"] > 0
    rc, out, err = run_cli(capsys, "explain", "smollm2_suffix", *over, "--acceptance", tmp_path / "run.jsonl",
                           "--format", "json")
    assert rc == 0, err
    m = json.loads(out)["measured_acceptance"]
    assert m["drafts_per_step"] == pytest.approx(summary["num_draft_tokens"] / summary["num_steps"])
    assert m["speedup_at_batch_measured_width"] and all(v > 0 for v in m["speedup_at_batch_measured_width"].values())
    # a corpus that is gone by load time, or too large for its bound: clean errors naming the key
    corpus.unlink()
    rc, out, err = run_cli(capsys, "run", art, "--max-new-tokens", "4", "--no-progress")
    assert rc != 0 and "method.suffix.corpora[0]" in err and "Traceback" not in err
    corpus.write_text("w9 " * 50)
    rc, out, err = run_cli(capsys, "compile", "smollm2_suffix", *over, "method.suffix.max_corpus_tokens=10",
                           "--out", tmp_path / "art2", "--print-path")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "run", out.strip().splitlines()[-1], "--max-new-tokens", "4", "--no-progress")
    assert rc != 0 and "method.suffix.max_corpus_tokens=10" in err and "Traceback" not in err
    rc, out, err = run_cli(capsys, "check", "smollm2_suffix", "method.suffix.corpora=[/no/such/file.txt]")
    assert rc == 1 and "method.suffix.corpora[0]=/no/such/file.txt: no such file" in out + err
