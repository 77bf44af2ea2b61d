"""Tree plans end to end on small checkpoints the test writes: `specc compile` bakes a static tree into
each state module's `TREE` (and dynamic trees into their programs' constants), `load_runtime` builds
the states from the generated modules, and greedy decoding through them equals plain greedy decoding.
Also the shipped presets `smollm2_eagle3_tree` and `smollm2_medusa` on the real SmolLM2 (slow)."""
from __future__ import annotations

import json

import pytest
import torch

from specc.cli import main as cli_main
from specc.methods.eagle.loader import save_eagle_head
from specc.methods.medusa.model import save_medusa_heads
from specc.runtime.artifact import load_artifact
from specc.runtime.loader import load_runtime
from specc.runtime.request import Request, SamplingParams
from specc.compiler.trees import compile_tree, normalize_choices

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, naive_greedy, random_head, tiny_target
from tests.methods.test_medusa import random_heads

MEDUSA_TREE = [[0], [1], [2], [0, 0], [1, 0], [0, 1], [0, 0, 0]]


def _write_target(model, directory):
    import tokenizers
    import transformers
    from safetensors.torch import save_file
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    directory.mkdir(parents=True)
    save_file({k: v.clone() for k, v in model.hf_state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(model.config.replace(eos_token_ids=(1,)).to_hf_dict()))
    tk = tokenizers.Tokenizer(WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    tk.pre_tokenizer = WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="w1", unk_token="w0").save_pretrained(
        str(directory))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tree_ckpt")
    target = tiny_target(seed=3)
    _write_target(target, root / "target")
    save_eagle_head(random_head("eagle3", target, seed=4, draft_vocab=64), root / "eagle3")
    save_medusa_heads(random_heads(target, 4, 1, seed=5, scale=0.1), root / "medusa")
    return target, root


def _compile(preset, root, out, capsys, draft, extra=()):
    overrides = [f"target.path={root / 'target'}", "target.format=hf", f"target.vocab_size={V}",
                 "target.max_model_len=128", f"draft.path={root / draft}", f"draft.vocab_size={V}",
                 "draft.max_model_len=128", "draft.architecture=null", *extra]
    capsys.readouterr()
    assert cli_main(["compile", preset, *overrides, "--out", str(out), "--print-path"]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


PROMPTS = [[5], [9, 8, 7, 9, 8, 7, 10], list(range(20, 41))]


@pytest.mark.parametrize("preset,draft,extra", [
    ("smollm2_eagle3_tree", "eagle3", ()),
    ("smollm2_eagle3_tree", "eagle3", ("verify=standard_onehot",)),
    ("smollm2_medusa", "medusa", ("verify=standard",)),
    ("smollm2_medusa", "medusa", ()),
    ("smollm2_eagle3_tree", "eagle3", ("method.num_steps=null", "method.topk=null", "method.num_draft_tokens=null",
                                       f"method.tree_choices={json.dumps(MEDUSA_TREE).replace(' ', '')}")),
])
def test_compiled_tree_artifact_decodes_exactly(ckpts, tmp_path, capsys, preset, draft, extra):
    target, root = ckpts
    path = _compile(preset, root, tmp_path, capsys, draft, extra)
    art = load_artifact(path)
    from specc.compiler.programs import state_programs
    from specc.runtime.state import StateSpec

    for entry in art.states:
        st = entry["parameters"]
        progs = state_programs(StateSpec.from_dict(st), art.manifest["runtime"]["verify"]["synthetic_rates"])
        if st["num_steps"] and st["tree_choices"] is not None:  # the static tree, compiled once
            assert art.tree_of(entry) == json.loads(json.dumps(compile_tree(normalize_choices(st["tree_choices"]))))
            assert progs.draft.fn == "draft_tree_static"
        elif st["num_steps"]:
            assert entry["tree"] is None and progs.draft.fn == "draft_tree"
        assert progs.commit.fn == ("commit_tree" if st["num_steps"] else "commit_none")
    rt, art = load_runtime(path, device="cpu", artifact=art)
    for s in rt.states:
        if s.spec.tree_choices is not None and s.spec.num_steps:
            assert s.inputs.static_tree is not None
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=16, ignore_eos=True)) for p in PROMPTS]
    for bs in (1, 3):
        outs = rt.generate(reqs, batch_size=bs)
        assert [o.token_ids for o in outs] == [naive_greedy(target, p, 16) for p in PROMPTS]
    kinds = {k["family"] for k in art.manifest["kernels"]}
    assert kinds <= {"tree_greedy_verify", "tree_rejection_verify", "greedy_verify"}


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["smollm2_eagle3_tree", "smollm2_medusa"])
def test_shipped_tree_presets_on_smollm2_are_exact(preset):
    """The committed artifacts of the shipped tree presets, on the real SmolLM2: output equals plain
    greedy decoding on two shipped prompts, and drafts are accepted."""
    import pathlib

    from specc.errors import CheckpointError
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path

    root = pathlib.Path(__file__).resolve().parents[2] / "generated"
    arts = sorted(p for p in root.iterdir() if p.name.startswith(preset + "-"))
    assert len(arts) == 1, arts
    try:
        rt, art = load_runtime(arts[0], device="cpu")
    except CheckpointError as exc:
        pytest.skip(f"SmolLM2 not installed: {exc}")
    prompts = [encode_prompt(r, rt.tokenizer) for r in read_prompts(shipped_prompts_path())[:2]]
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=20)) for p in prompts], batch_size=1)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(rt.target, p, 20)
    assert rt.metrics.num_accepted_tokens > 0
