"""End to end on small checkpoints the test writes: `specc compile` renders templates/state.py.j2
into an artifact, `load_runtime` verifies and imports it and builds each state with the generated
`build(ctx)`, and decoding through the generated programs is exactly plain greedy decoding.
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
def test_compiled_artifact_decodes_exactly(models, tmp_path, capsys, preset, extra):
    target, root = models
    extra = [e.format(draft=root / "draft") for e in extra]
    path = _compile(preset, root, tmp_path, capsys, extra)
    rt, art = load_runtime(path, device="cpu")
    # every state was built by the generated module's build()
    assert {s.spec.name for s in rt.states} == set(art.states)
    assert all(s.programs.draft.__module__ == art.states[s.spec.name].__name__ for s in rt.states)
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
