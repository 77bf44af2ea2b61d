"""Bad drafter and data recipes (`specc train`): each is one RecipeError naming the file, the field,
the value and an example, raised when the recipe is read (before any data or model is loaded), and
`specc train fit BAD.yaml` prints it on one line and exits 2. Shipped recipes still load."""
from __future__ import annotations

import dataclasses
import pathlib
import sys

import pytest

from specc.errors import SpeccError
from specc.train import recipe as R

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = "name: x\nkind: eagle3\ndata: smollm2_specbench\nout: /tmp/specc_never_written\n"


def _fit(tmp_path, text: str, base: str = BASE) -> pathlib.Path:
    path = tmp_path / "bad.yaml"
    path.write_text(base + text)
    return path


def _fit_error(tmp_path, text: str, base: str = BASE) -> str:
    path = _fit(tmp_path, text, base)
    with pytest.raises(R.RecipeError) as info:
        R.load_fit_recipe(str(path))
    msg = str(info.value)
    assert msg.startswith(f"recipe {path}: ") and "\n" not in msg, msg
    assert msg.count(str(path)) == 1, msg  # the file is named once, not once per layer of wrapping
    return msg


# ------------------------------------------------------------------------------------ values out of range
@pytest.mark.parametrize("line, expect", [
    ("lr: -1", "lr=-1.0 must be a finite number > 0"),
    ("lr: 0", "lr=0.0 must be a finite number > 0"),
    ("lr: .nan", "lr=nan must be"),
    ("lr: .inf", "lr=inf must be"),
    ("batch: -4", "batch=-4 must be an integer >= 1"),
    ("batch: 0", "batch=0 must be an integer >= 1"),
    ("epochs: 0", "epochs=0 must be an integer >= 1"),
    ("warmup: 1", "warmup=1.0 must be a number in [0, 1)"),
    ("warmup: -0.1", "warmup=-0.1 must be a number in [0, 1)"),
    ("min_lr_ratio: 1.5", "min_lr_ratio=1.5 must be a number in [0, 1]"),
    ("min_lr_ratio: -0.5", "min_lr_ratio=-0.5 must be a number in [0, 1]"),
    ("clip: 0", "clip=0.0 must be a finite number > 0"),
    ("clip: -1", "clip=-1.0 must be a finite number > 0"),
    ("clip: null", "clip=null must be a finite number > 0"),
    ("weight_decay: -0.1", "weight_decay=-0.1 must be a finite number >= 0"),
    ("val_every: 0", "val_every=0 must be an integer >= 2"),
    ("val_every: 1", "val_every=1 must be an integer >= 2"),  # every sequence held out: nothing to train on
    ("time_budget_min: 0", "time_budget_min=0.0 must be a finite number > 0"),
    ("time_budget_min: -5", "time_budget_min=-5.0 must be a finite number > 0"),
    ("max_steps: 0", "max_steps=0 must be an integer >= 1, or null"),
    ("prompt_context: 0", "prompt_context=0 must be an integer >= 1"),
    ("threads: 0", "threads=0 must be an integer >= 1"),
    ("seed: -3", "seed=-3 must be an integer in [0, 2**62]"),
    ("seed: 99999999999999999999999", "seed=99999999999999999999999 must be an integer in [0, 2**62]"),
    ("amp: fp16", "amp='fp16' must be one of auto, bf16, none"),
    ("amp: null", "amp=null must be one of auto, bf16, none"),
    ("parts: []", "parts=[] must be a non-empty list"),
    ("parts: [round1, round1]", "parts=['round1', 'round1'] must be a non-empty list of distinct parts"),
    ("parts: [round9]", "parts=['round9'] must be"),
    ("max_shards: {round1: 0}", "max_shards={'round1': 0} must be a mapping of parts"),
    ("max_shards: {round9: 2}", "max_shards={'round9': 2} must be a mapping of parts"),
    ("name: ''", "name='' must be a non-empty string"),
    ("out: null", "out=null must be a non-empty directory path"),
])
def test_fit_value_out_of_range_names_field_value_and_example(tmp_path, line, expect):
    field = line.split(":")[0]
    msg = _fit_error(tmp_path, line + "\n", BASE.replace(f"{field}:", f"#{field}:"))
    assert expect in msg and (f"(e.g. {field}: " in msg or f"; e.g. {field}: " in msg), msg


# ------------------------------------------------------------------------------------ wrong types and shapes
@pytest.mark.parametrize("line, expect", [
    ("lr: abc", "lr='abc' must be a finite number > 0"),
    ("lr: [1]", "lr=[1] must be a finite number > 0"),
    ("lr: {a: 1}", "lr={'a': 1} must be a finite number > 0"),
    ("batch: 2.5", "batch=2.5 must be an integer >= 1"),
    ("batch: true", "batch=True must be an integer >= 1"),
    ("epochs: many", "epochs='many' must be an integer >= 1"),
    ("seed: 1.5", "seed=1.5 must be an integer"),
    ("max_steps: 1.5", "max_steps=1.5 must be an integer >= 1, or null"),
    ("parts: round1", "parts='round1' must be a non-empty list"),
    ("parts: {round1: 1}", "parts={'round1': 1} must be a non-empty list"),
    ("options: [1]", "options=[1] must be a mapping"),
    ("max_shards: [1]", "max_shards=[1] must be a mapping"),
    ("max_shards: {round1: x}", "max_shards.round1='x' is not valid: max_shards must be a mapping"),
])
def test_fit_wrong_type_names_field(tmp_path, line, expect):
    field = line.split(":")[0]
    msg = _fit_error(tmp_path, line + "\n", BASE.replace(f"{field}:", f"#{field}:"))
    assert expect in msg, msg
    assert "could not be converted" not in msg and "Cannot merge" not in msg, msg


def test_recipe_structure_errors_are_one_line_recipe_errors(tmp_path):
    path = tmp_path / "bad.yaml"
    cases = {
        "- a\n- b\n": "the top level is a list; a recipe is a mapping of fields",
        "42\n": "the top level is a single int value",
        "": "required fields name, kind, data, out missing (e.g. name: ",
        "name: x\nkind: eagle3\n": "required fields data, out missing",
        "name: [unclosed\nkind: eagle3\n": "not valid YAML at line 2",
        "name: a\nname: b\n": "duplicate key name",
        BASE + "lrr: 1\n": "unknown field 'lrr'; did you mean 'lr'?",
        BASE + "learning_rate: 1\n": "unknown field 'learning_rate'; known fields: name, kind",
    }
    for text, expect in cases.items():
        path.write_text(text)
        with pytest.raises(R.RecipeError) as info:
            R.load_fit_recipe(str(path))
        msg = str(info.value)
        assert msg.startswith(f"recipe {path}: ") and expect in msg and "\n" not in msg, (text, msg)
        assert "DictConfig" not in msg and "ListConfig" not in msg, msg
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(R.RecipeError, match="not UTF-8 text"):
        R.load_fit_recipe(str(path))


def test_names_the_recipe_once_for_kind_options_and_data(tmp_path):
    assert "kind: unknown drafter kind 'nosuch'" in _fit_error(tmp_path, "kind: nosuch\n",
                                                               BASE.replace("kind:", "#kind:"))
    assert "options.ttt_steps=0 for drafter kind 'eagle3' must be" in _fit_error(tmp_path, "options: {ttt_steps: 0}\n")
    assert "unknown option(s) ['foo']" in _fit_error(tmp_path, "options: {foo: 1}\n")
    msg = _fit_error(tmp_path, "data: no_such_data\n", BASE.replace("data:", "#data:"))
    assert "data='no_such_data': no recipe 'no_such_data'" in msg


def test_errors_are_speccerrors():
    assert issubclass(R.RecipeError, SpeccError)


# ------------------------------------------------------------------------------------ data recipes
@pytest.mark.parametrize("line, expect", [
    ("gen_batch: 0", "gen_batch=0 must be an integer >= 1"),
    ("teacher_batch: -1", "teacher_batch=-1 must be an integer >= 1"),
    ("max_new_tokens: 0", "max_new_tokens=0 must be an integer >= 1"),
    ("max_prompt_tokens: abc", "max_prompt_tokens='abc' must be an integer >= 1"),
    ("tasks: -1", "tasks=-1 must be an integer >= 0"),
    ("teacher: 1.5", "teacher=1.5 must be an integer >= 0"),
    ("seed: -1", "seed=-1 must be an integer in [0, 2**62]"),
    ("round1: {qa: -1}", "round1={'qa': -1} must be a mapping of prompt categories to counts >= 0"),
    ("max_prompts: {round1: 0}", "max_prompts={'round1': 0} must be a mapping of parts"),
    ("split: {round9: 2}", "split={'round9': 2} must be a mapping of parts"),
    ("layers: [-1]", "layers=[-1] must be a list of target layer ids >= 0"),
    ("target_format: onnx", "target_format='onnx' must be one of gguf, hf, auto"),
    ("kinds: [nope]", "kinds: unknown drafter kind 'nope'"),
])
def test_data_recipe_bad_values(tmp_path, line, expect):
    path = tmp_path / "data.yaml"
    path.write_text("name: d\n" + line + "\n")
    with pytest.raises(R.RecipeError) as info:
        R.load_data_recipe(str(path))
    msg = str(info.value)
    assert msg.startswith(f"recipe {path}: ") and expect in msg, msg


# ------------------------------------------------------------------------------------ the command
def test_specc_train_fit_bad_recipe_exits_2_before_loading_anything(tmp_path, monkeypatch, capsys):
    """The tester's recipe (lr: -1): one line on stderr, exit 2, and the training loop never starts."""
    from specc.cli import main
    from specc.train import fit as F

    def never(*a, **k):
        pytest.fail("the training loop ran on a bad recipe")
    monkeypatch.setattr(F, "fit", never)
    monkeypatch.setattr(R, "load_data_recipe", never)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    for text, expect in [("parts: [round1]\nlr: -1\n", "lr=-1.0 must be a finite number > 0 "),
                         ("batch: -4\nepochs: 0\n", "batch=-4 must be an integer >= 1"),
                         ("lr: abc\n", "lr='abc' must be")]:
        path = _fit(tmp_path, text)
        assert main(["train", "fit", str(path), "--out", str(tmp_path / "x")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"specc train: error: recipe {path}: "), lines
        assert expect in lines[0], lines
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert main(["train", "fit", str(tmp_path / "list.yaml")]) == 2
    assert "the top level is a list" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------ valid recipes
def test_every_field_has_a_rule_and_the_defaults_pass():
    for cls, rules in ((R.FitRecipe, R._FIT_RULES), (R.DataRecipe, R._DATA_RULES)):
        assert list(rules) == [f.name for f in dataclasses.fields(cls)], cls
        obj = cls()
        for f in ("name", "kind", "data", "out"):
            if getattr(obj, f, None) == "???":
                setattr(obj, f, "x")
        R._check("defaults", obj, rules)


def test_shipped_recipes_still_load():
    fit = R.load_fit_recipe(str(ROOT / "conf/train/smollm2_135m_eagle3.yaml"))
    assert (fit.kind, fit.lr, fit.batch, fit.epochs, fit.warmup) == ("eagle3", 1.5e-3, 16, 1, 0.03)
    assert fit.options["draft_vocab"] == 8192 and list(fit.parts) == ["round1", "round2", "round3"]
    for path in sorted((ROOT / "conf/train").glob("*.yaml")) + sorted((ROOT / "conf/train/experiments").glob("*.yaml")):
        assert R.load_fit_recipe(str(path)).name
    for path in sorted((ROOT / "conf/train/data").glob("*.yaml")):
        assert R.load_data_recipe(str(path)).name
    assert R.load_fit_recipe("smollm2_135m_eagle3").lr == 1.5e-3  # by name


def test_valid_edge_values_load(tmp_path):
    path = _fit(tmp_path, "max_steps: null\namp: none\nwarmup: 0\nmin_lr_ratio: 1\nweight_decay: 0\nval_every: 2\n"
                          "lr: 1\nmax_shards: {round1: 1}\n")
    r = R.load_fit_recipe(str(path))
    assert (r.max_steps, r.amp, r.warmup, r.min_lr_ratio, r.val_every, r.lr) == (None, "none", 0.0, 1.0, 2, 1.0)
    assert isinstance(r.lr, float) and r.max_shards == {"round1": 1}
