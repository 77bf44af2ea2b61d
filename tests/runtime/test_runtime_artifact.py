"""End to end on small checkpoints the test writes: `specc compile` writes an artifact (the manifest
and its kernel variants), `load_runtime` verifies it and builds each state from the manifest's
parameters, and decoding through the artifact's programs is exactly plain greedy decoding.
Also `specc run` (text and --json output, prompt files, bad input)."""
import json

import pytest
import torch

from specc.cli import main as cli_main
from specc.runtime.loader import load_runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

V = 64


def _write_checkpoint(model, directory):
    import tokenizers
    import transformers
    from safetensors.torch import save_file
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    directory.mkdir(parents=True)
    save_file({k: v.clone() for k, v in model.hf_state_dict().items()}, str(directory / "model.safetensors"))
    cfg = model.config.replace(eos_token_ids=(1,)).to_hf_dict()
    (directory / "config.json").write_text(json.dumps(cfg))
    tk = tokenizers.Tokenizer(WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    tk.pre_tokenizer = WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="w1", unk_token="w0").save_pretrained(
        str(directory))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    target = tiny_llama(seed=0, vocab_size=V)
    draft = perturbed_copy(target, noise=0.02, seed=1)
    _write_checkpoint(target, root / "target")
    _write_checkpoint(draft, root / "draft")
    return target, root


def _compile(preset, root, out, capsys, extra=()):
    overrides = [f"target.path={root / 'target'}", "target.format=hf", f"target.vocab_size={V}",
                 "target.max_model_len=128", *extra]
    capsys.readouterr()
    assert cli_main(["compile", preset, *overrides, "--out", str(out), "--print-path"]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


PROMPTS = [[5], [9, 8, 7, 9, 8, 7, 10], list(range(20, 41))]


@pytest.mark.parametrize("preset,extra", [
    ("smollm2_plain", ()),
    ("smollm2_ngram", ()),
    ("smollm2_draft_model", ("draft.path={draft}", "draft.vocab_size=64", "draft.max_model_len=128")),
    ("smollm2_draft_model", ("draft.path={draft}", "draft.vocab_size=64", "draft.max_model_len=128",
                             "verify=standard", "verify.draft_sampling=probabilistic")),
])
def test_compiled_artifact_decodes_exactly(models, tmp_path, capsys, preset, extra, monkeypatch):
    from specc.runtime import state as runtime_state

    target, root = models
    extra = [e.format(draft=root / "draft") for e in extra]
    path = _compile(preset, root, tmp_path, capsys, extra)

    def rederived(*a, **k):
        raise AssertionError("a state's programs were re-derived instead of read from the execution plan")

    monkeypatch.setattr(runtime_state, "select_programs", rederived)  # the IR's programs only
    rt, art = load_runtime(path, device="cpu")
    # every state was built from its manifest entry, with the artifact's kernel variant
    assert [s.spec.name for s in sorted(rt.states, key=lambda s: s.spec.name)] == sorted(e["name"] for e in art.states)
    assert all(s.inputs.kernels == next(e["kernels"] for e in art.states if e["name"] == s.spec.name) for s in rt.states)
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=16, ignore_eos=True)) for p in PROMPTS]
    for bs in (1, 3):
        outs = rt.generate(reqs, batch_size=bs)
        assert [o.token_ids for o in outs] == [reference_greedy(target, p, 16) for p in PROMPTS]


def test_specc_run_json_and_text(models, tmp_path, capsys):
    target, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "category": "qa", "prompt": "w5 w6 w7"}\n{"prompt": "w9 w8 w7 w9 w8"}\n')
    capsys.readouterr()
    assert cli_main(["run", path, "--prompts", str(prompts), "--max-new-tokens", "12", "--json", "--no-progress"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.strip().splitlines()]
    assert len(lines) == 3 and "summary" in lines[-1]
    assert lines[0]["id"] == "a" and lines[0]["category"] == "qa"
    for obj in lines[:2]:
        for key in ("prompt", "text", "num_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                    "num_accepted_tokens_per_pos"):
            assert key in obj
    expect = reference_greedy(target, [5, 6, 7], 12, eos_token_ids=[1])
    assert lines[0]["num_tokens"] == len(expect)
    assert lines[-1]["summary"]["num_output_tokens"] == sum(o["num_tokens"] for o in lines[:2])
    # plain text file: one prompt per line; text output with a metrics summary
    plain = tmp_path / "p.txt"
    plain.write_text("w5 w6 w7\n\nw3 w4\n")
    assert cli_main(["run", path, "--prompts", str(plain), "--max-new-tokens", "5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("=== [line-") == 2 and "=== metrics" in out and "tau" in out


@pytest.mark.parametrize("content,message", [
    ('{"prompt": "w1"}\n{"prompt": 3}\n', "p.jsonl:2: 'prompt' must be a non-empty string"),
    ('{"prompt": "w1"}\nnot json\n', "p.jsonl:2: not valid JSON"),
    ('{"text": "w1"}\n', "exactly one of 'prompt'"),
    ('{"messages": [{"role": "user"}]}\n', "messages[0]"),
    ("\n\n", "no prompts"),
    ('["w1", "w2"]\n', "JSON array; prompts are JSONL (one JSON object per line"),
    ('\n  [\n  "w1"\n]\n', "JSON array"),
])
def test_bad_prompt_files_are_refused(models, tmp_path, capsys, content, message):
    _, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(content)
    capsys.readouterr()
    assert cli_main(["run", path, "--prompts", str(prompts), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_specc_bench_reports_table_and_exactness(models, tmp_path, capsys):
    _, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "qa", "prompt": "w5 w6 w7"}\n{"category": "rag", "prompt": "w9 w8 w7 w9 w8"}\n')
    assert cli_main(["bench", path, "--prompts", str(prompts), "--max-new-tokens", "10", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["exact"] == "2/2"
    assert set(res["results"]["plain"]) == {"qa", "rag", "all"}
    assert res["results"]["plain"]["all"]["tau"] == 1.0


# ---------------------------------------------------------------- flags, stdin, progress bar, counters

BAD_FLAGS = [
    ("--threads", "-2", "in [1, "), ("--threads", "0", "in [1, "), ("--threads", "100000", "this machine's CPUs"),
    ("--max-new-tokens", "0", ">= 1"),
    ("--temperature", "-1", ">= 0"), ("--top-p", "0", "(0, 1]"), ("--top-p", "1.5", "(0, 1]"),
    ("--top-k", "-1", ">= 0"), ("--batch-size", "0", ">= 1"), ("--limit", "0", ">= 1"), ("--threads", "x", "integer"),
]


def _usage_error(argv, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("flag,value,rule", BAD_FLAGS)
def test_run_refuses_bad_numeric_flags_while_parsing(tmp_path, capsys, flag, value, rule):
    # the artifact does not exist: the flag is refused first, before anything is loaded
    err = _usage_error(["run", str(tmp_path / "missing"), "--prompt", "hi", f"{flag}={value}"], capsys)
    assert f"argument {flag}: " in err and repr(value) in err and rule in err
    assert "Traceback" not in err and err.count("error:") == 1


@pytest.mark.parametrize("flag,argv", [
    ("--threads", ["bench", "ART", "--threads", "-1", "--limit", "1"]),
    ("--max-new-tokens", ["bench", "ART", "--max-new-tokens", "0"]),
    ("--limit", ["bench", "ART", "--limit=-3"]),
    ("--threads", ["generate", "--threads", "-1", "--prompt", "hi"]),
    ("--threads", ["generate", "--threads", "0", "--prompt", "hi"]),
    ("--max-new-tokens", ["generate", "--max-new-tokens", "0", "--prompt", "hi"]),
    ("--max-model-len", ["generate", "--max-model-len", "0", "--prompt", "hi"]),
    ("--max-model-len", ["generate", "--max-model-len=-5", "--prompt", "hi"]),
    ("--top-p", ["generate", "--top-p", "0", "--prompt", "hi"]),
    ("--temperature", ["generate", "--temperature=-0.5", "--prompt", "hi"]),
    ("--top-k", ["generate", "--top-k=-2", "--prompt", "hi"]),
])
def test_bench_and_generate_refuse_bad_numeric_flags_while_parsing(tmp_path, capsys, flag, argv):
    argv = [str(tmp_path / "missing") if a == "ART" else a for a in argv]
    err = _usage_error(argv, capsys)
    assert f"argument {flag}: " in err and "Traceback" not in err and err.count("error:") == 1


def test_batch_size_above_the_largest_bucket_is_refused_before_loading(models, tmp_path, capsys, monkeypatch):
    import specc.models
    from specc.runtime.artifact import load_artifact
    from specc.runtime.loader import largest_bucket

    _, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    top = largest_bucket(load_artifact(path))

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --batch-size was checked")

    monkeypatch.setattr(specc.models, "load_target", no_load)
    capsys.readouterr()
    assert cli_main(["run", path, "--prompt", "w5", "--batch-size", str(top + 1), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--batch-size {top + 1} exceeds" in err and f"({top})" in err


def test_errors_do_not_share_the_progress_bar_line(models, tmp_path, capsys, monkeypatch):
    """On a terminal (the bar is drawn only there), an error starts its own line after the bar's."""
    import sys

    _, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    prompts = tmp_path / "p.txt"
    prompts.write_text("w5 w6\n" + "w7 " * 200 + "\n")  # the second prompt exceeds max_model_len=128
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)  # capsys's stderr, as a terminal
    for argv, name in ((["bench", path, "--prompts", str(prompts), "--max-new-tokens", "2"], "bench"),
                       (["run", path, "--prompts", str(prompts), "--max-new-tokens", "2"], "run")):
        capsys.readouterr()
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert f"specc {name}: error:" in err and "max_model_len=128" in err
        assert f"\nspecc {name}: error:" in err  # starts its own line, after the bar's
        assert f"specc {name}:   " in err  # the bar was drawn (this is the case being tested)


def test_run_reads_prompts_from_stdin_dash(models, tmp_path, capsys, monkeypatch):
    import io

    _, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO('{"id": "s1", "prompt": "w5 w6 w7"}\n{"id": "s2", "prompt": "w3"}\n'))
    capsys.readouterr()
    assert cli_main(["run", path, "--prompts", "-", "--max-new-tokens", "3", "--json", "--no-progress"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.strip().splitlines()]
    assert [l["id"] for l in lines[:-1]] == ["s1", "s2"]
    monkeypatch.setattr("sys.stdin", io.StringIO('["w5"]\n'))
    assert cli_main(["run", path, "--prompts", "-", "--no-progress"]) == 2
    assert "<stdin>: looks like a JSON array" in capsys.readouterr().err


def test_run_json_counts_every_draft_position(models, tmp_path, capsys):
    from specc.runtime.artifact import load_artifact

    _, root = models
    path = _compile("smollm2_ngram", root, tmp_path / "art", capsys)
    kappa = max(e["parameters"]["num_steps"] for e in load_artifact(path).states)
    assert kappa >= 1
    prompts = tmp_path / "p.txt"
    prompts.write_text("w9 w8 w7 w9 w8 w7 w9 w8\nw5\nw20 w21 w22\n")
    capsys.readouterr()
    assert cli_main(["run", path, "--prompts", str(prompts), "--max-new-tokens", "1", "--json", "--no-progress"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.strip().splitlines()]
    # max_new_tokens 1: no verify step, yet each request reports κ zeros (was [])
    assert [l["num_accepted_tokens_per_pos"] for l in lines[:-1]] == [[0] * kappa] * 3
    assert lines[-1]["summary"]["num_accepted_tokens_per_pos"] == [0] * kappa
    assert cli_main(["run", path, "--prompts", str(prompts), "--max-new-tokens", "12", "--json", "--no-progress"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.strip().splitlines()]
    assert all(len(l["num_accepted_tokens_per_pos"]) == kappa for l in lines[:-1])
    assert all(sum(l["num_accepted_tokens_per_pos"]) == l["num_accepted_tokens"] for l in lines[:-1])


def test_generate_reads_stdin_rejects_empty_and_stops_at_max_model_len(models, tmp_path, capsys, monkeypatch):
    target, root = models
    base = ["generate", "--path", str(root / "target"), "--format", "hf", "--no-chat", "--ignore-eos"]
    capsys.readouterr()
    assert cli_main(base + ["--prompt", ""]) == 2
    assert "--prompt number 1 is empty" in capsys.readouterr().err
    # prompts from stdin (a redirected file), one per line
    stdin = tmp_path / "in.txt"
    stdin.write_text("w5 w6 w7\n\nw9 w8\n")
    with stdin.open() as fh:
        monkeypatch.setattr("sys.stdin", fh)
        assert cli_main(base + ["--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- prompt") == 2
    words = out.split("--- prompt 1")[0].split("\n", 1)[1].split()
    assert words == [f"w{t}" for t in reference_greedy(target, [5, 6, 7], 4)]
    # a prompt that fits but leaves less room than --max-new-tokens: stops at max_model_len, as specc run
    prompt = " ".join(f"w{20 + i}" for i in range(28))  # 28 tokens (no w1x: "w1" is the EOS token)
    assert cli_main(base + ["--max-model-len", "32", "--max-new-tokens", "16", "--prompt", prompt]) == 0
    res = capsys.readouterr()
    assert len(res.out.split()) == 4 and "finish_reason max_model_len" in res.err
    # a prompt that itself fills max_model_len: refused, as specc run
    assert cli_main(base + ["--max-model-len", "28", "--prompt", prompt]) == 2
    assert "leave no room to generate within max_model_len=28" in capsys.readouterr().err
