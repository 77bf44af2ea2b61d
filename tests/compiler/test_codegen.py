"""specc.compiler.codegen and `specc compile`: literals, names, determinism, atomic write, refusal of bad plans."""
from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specc.compiler import build
from specc.compiler import codegen
from specc.errors import ArtifactError, PlanError
from tests.test_codegen_support import compile_preset, load_preset, resolved_preset

# ------------------------------------------------------------------------------------------------
# pyliteral / identifier

_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=40) | \
    st.floats(allow_nan=False, allow_infinity=False)
_data = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.tuples(c, c)
                     | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(_data)
def test_pyliteral_round_trips_through_literal_eval(value):
    text = codegen.pyliteral(value)
    assert ast.literal_eval(text) == value
    # A literal is one expression: nothing in it can start a statement.
    assert isinstance(ast.parse(text, mode="eval").body, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.UnaryOp))


@pytest.mark.parametrize("evil", ['x"; import os; os.system("echo pwned") #', "a\nb", "'''", '\\" + __import__("os")'])
def test_pyliteral_escapes_hostile_strings(evil):
    text = codegen.pyliteral(evil)
    assert "\n" not in text
    assert ast.literal_eval(text) == evil


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), object(), {1.5: 2}, {True: 1}, b"bytes"])
def test_pyliteral_refuses_non_plain_data(bad):
    with pytest.raises(ArtifactError):
        codegen.pyliteral(bad)


def test_pyliteral_sorts_dict_keys_and_keeps_floats_exact():
    assert codegen.pyliteral({"b": 1, "a": 2}) == "{'a': 2, 'b': 1}"
    assert ast.literal_eval(codegen.pyliteral(0.1 + 0.2)) == 0.1 + 0.2
    assert codegen.pyliteral((3,)) == "(3,)"
    assert codegen.plain_data({"x": [1 / 3]}, digits=codegen.FLOAT_DIGITS) == {"x": [0.333333]}


@pytest.mark.parametrize("name", ['plan"x', "a\nb", "class", "", "1abc", "a-b", "é", "a b", None, 3])
def test_check_identifier_refuses(name):
    with pytest.raises(PlanError, match="not a valid identifier"):
        codegen.check_identifier(name, "plan name")


def test_check_identifier_accepts():
    assert codegen.check_identifier("smollm2_ngram") == "smollm2_ngram"


COMPILER_VALUES = {"specc_version", "format_version"}  # never from the plan


def test_py_templates_only_emit_filtered_values():
    """Every `{{ ... }}` in a Python template goes through `pyliteral`, `identifier` or `int`
    (templates/README.md), so no plan string reaches generated code unescaped."""
    for path in sorted(codegen.TEMPLATES_DIR.rglob("*.py.j2")):
        text = path.read_text()
        for expr in re.findall(r"{{(.*?)}}", text, flags=re.S):
            expr = expr.strip()
            assert expr in COMPILER_VALUES or re.search(r"\|\s*(pyliteral|identifier|int)\s*$", expr), \
                f"{path.name}: '{{{{ {expr} }}}}' is not passed through pyliteral, identifier or int"


# ------------------------------------------------------------------------------------------------
# tree buffers (hand-worked example: root 0; [0]=1, [1]=2, [0,0]=3, [0,1]=4)


def test_tree_buffers_hand_example():
    tb = codegen.tree_buffers([[0, 1], [1], [0], [0, 0]])
    assert tb["nodes"] == [[0], [1], [0, 0], [0, 1]]
    assert tb["parents"] == [0, 0, 1, 1]
    assert tb["depths"] == [0, 1, 1, 2, 2]
    assert tb["attn_mask"] == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    assert tb["retrieve_indices"] == [[0, 2, -1], [0, 1, 3], [0, 1, 4]]
    assert codegen.tree_buffers(None) is None


@pytest.mark.parametrize("bad", [[[0, 0]], [[0], [0]], [[]], [[-1]]])
def test_tree_buffers_refuses_malformed(bad):
    with pytest.raises(PlanError, match="tree_choices"):
        codegen.tree_buffers(bad)


# ------------------------------------------------------------------------------------------------
# kernel variants


def test_kernel_variant_names_follow_parameters():
    from specc.compiler.lower import lower

    plan = load_preset("smollm2_ngram")
    states = lower(plan)
    names = {codegen.kernel_variants_for(s)["verify"].name for s in states}
    k = plan.method.num_steps
    assert names == {f"greedy_verify_w{k + 1}"}
    s = replace(states[0], verify_rule="standard", draft_sampling="probabilistic")
    assert codegen.kernel_variants_for(s)["verify"].name == f"rejection_verify_w{k + 1}_qprobs"
    s = replace(states[0], verify_rule="standard")
    assert codegen.kernel_variants_for(s)["verify"].name == f"rejection_verify_w{k + 1}_qonehot"
    s = replace(states[0], verify_rule="block", draft_sampling="probabilistic")
    assert codegen.kernel_variants_for(s)["verify"].name == f"block_verify_w{k + 1}_qprobs"
    assert codegen.kernel_variants_for(replace(states[0], verify_rule="block"))["verify"].name == \
        f"block_verify_w{k + 1}_qonehot"
    # a tree state gets the tree kernels, specialized by its verify width
    tree = replace(states[0], topk=2, num_draft_tokens=7)
    assert codegen.kernel_variants_for(tree)["verify"].name == "tree_greedy_verify_w7"
    assert codegen.kernel_variants_for(replace(tree, verify_rule="standard"))["verify"].name == \
        "tree_rejection_verify_w7_qonehot"
    with pytest.raises(PlanError, match="tree kernel"):
        codegen.kernel_variants_for(replace(tree, verify_rule="block"))
    # the other rule at the same width for the rows that differ, and the vocabulary when known
    roles = codegen.kernel_variants_for(states[0], 49152)
    assert {r: v.name for r, v in roles.items()} == {"verify": f"greedy_verify_w{k + 1}_v49152",
                                                     "verify_sampled_rows": f"rejection_verify_w{k + 1}_qonehot_v49152"}
    roles = codegen.kernel_variants_for(replace(tree, verify_rule="standard", draft_sampling="probabilistic"), 7)
    assert {r: v.name for r, v in roles.items()} == {"verify": "tree_rejection_verify_w7_qprobs_v7",
                                                     "verify_greedy_rows": "tree_greedy_verify_w7_v7"}
    plain = replace(states[0], num_steps=0, num_draft_tokens=1, verify_rule="standard", draft_sampling="probabilistic")
    assert codegen.kernel_variants_for(plain)["verify"].name == "rejection_verify_w1_qonehot"  # κ = 0: no q


# ------------------------------------------------------------------------------------------------
# compile: layout, manifest, determinism, atomicity


@pytest.fixture(scope="module")
def ngram_artifact(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ngram")
    return compile_preset("smollm2_ngram", tmp / "out")


def test_layout_and_manifest(ngram_artifact):
    res = ngram_artifact
    assert res.status == "created"
    root = res.path
    assert re.fullmatch(r"smollm2_ngram-[0-9a-f]{12}", root.name)
    manifest = json.loads((root / "manifest.json").read_text())
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    for rel, digest in manifest["files"].items():
        assert digest == "sha256:" + hashlib.sha256((root / rel).read_bytes()).hexdigest()
    assert manifest["plan_hash"] == manifest["files"]["plan.yaml"]
    assert manifest["format_version"] == codegen.FORMAT_VERSION
    import specc

    assert manifest["specc_version"] == specc.__version__
    from specc.compiler.lower import lower

    predictions = json.loads((root / "predictions.json").read_text())
    assert predictions["artifact_name"] == root.name
    states = lower(resolved_preset("smollm2_ngram"))
    assert [s["name"] for s in manifest["states"]] == [s.name for s in states]
    for entry, s in zip(manifest["states"], states):
        assert set(entry) == {"name", "parameters", "kernels", "tree", "programs", "constants"} and entry["tree"] is None
        assert entry["parameters"]["num_steps"] == s.num_steps
        assert entry["parameters"]["batch_size"] == s.batch_size
        assert entry["constants"] == {"B": s.batch_size, "K": s.num_steps, "W": s.num_draft_tokens}
        assert entry["programs"][0] == {"stage": "draft", "fn": "draft_chain", "args": [s.num_steps, "greedy"]}
        # predictions are not part of the execution plan: they sit in predictions.json
        assert predictions["states"][s.name], f"no cost prediction for {s.name}"
        assert entry["kernels"]["verify"] in {k["name"] for k in manifest["kernels"]}
    for k in manifest["kernels"]:
        assert (root / k["module"]).is_file()
    assert not (root / "graph.json").exists() and not (root / "states").exists()
    report = (root / "report.md").read_text()
    for s in states:
        assert s.name in report
    assert "`draft_chain[4, \"greedy\"]`" in report  # the programs, derived from the parameters
    # plan.yaml is the resolved plan: it rebuilds an equal Plan.
    assert _plan_of(root) == resolved_preset("smollm2_ngram")


def _plan_of(root):
    import yaml

    from specc.plan.load import plan_from_dict

    return plan_from_dict(yaml.safe_load((root / "plan.yaml").read_text()))


def test_emit_graph_writes_every_state_graph(tmp_path):
    res = build.compile_plan(load_preset("smollm2_ngram"), tmp_path / "out", emit_graph=True)
    graph = json.loads((res.path / "graph.json").read_text())
    states = json.loads((res.path / "manifest.json").read_text())["states"]
    assert set(graph["states"]) == {s["name"] for s in states} and all(graph["states"].values())
    plain = compile_preset("smollm2_ngram", tmp_path / "plain")
    assert plain.path.name == res.path.name  # the graph is not part of what the name covers
    from specc.runtime.artifact import load_artifact

    assert load_artifact(res.path).states


def test_generated_python_parses_and_names_its_constants(ngram_artifact):
    root = ngram_artifact.path
    for p in sorted(root.rglob("*.py")):
        ast.parse(p.read_text(), filename=str(p))
    manifest = json.loads((root / "manifest.json").read_text())
    for k in manifest["kernels"]:
        src = (root / k["module"]).read_text()
        assert f"NUM_DRAFT_TOKENS = {k['constants']['NUM_DRAFT_TOKENS']}" in src


def test_compile_is_deterministic(tmp_path):
    a = compile_preset("smollm2_ngram", tmp_path / "a")
    b = compile_preset("smollm2_ngram", tmp_path / "b")
    assert a.path.name == b.path.name
    assert codegen.read_tree(a.path) == codegen.read_tree(b.path)
    again = compile_preset("smollm2_ngram", tmp_path / "a")
    assert again.status == "unchanged" and again.path == a.path
    assert codegen.read_tree(again.path) == codegen.read_tree(b.path)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [a.path.name]


def test_changed_plan_or_template_gives_a_new_name(tmp_path):
    a = compile_preset("smollm2_ngram", tmp_path / "a")
    b = compile_preset("smollm2_ngram", tmp_path / "a", overrides=["method.num_steps=2"])
    assert a.path.name != b.path.name
    tdir = tmp_path / "templates_edited"
    shutil.copytree(codegen.TEMPLATES_DIR, tdir)
    # the name hashes the execution plan and the generated programs: a program template edit renames,
    # a report template edit does not (the report is rewritten under the same name)
    (tdir / "report.md.j2").write_text((tdir / "report.md.j2").read_text() + "\n<!-- edited -->\n")
    c = build.compile_plan(load_preset("smollm2_ngram"), tmp_path / "c", templates_dir=tdir)
    assert c.path.name == a.path.name and "<!-- edited -->" in (c.path / "report.md").read_text()
    kernel = tdir / "kernels" / "greedy_verify.py.j2"
    kernel.write_text(kernel.read_text() + "\n# edited\n")
    d = build.compile_plan(load_preset("smollm2_ngram"), tmp_path / "d", templates_dir=tdir)
    assert d.path.name != a.path.name


def test_existing_different_content_is_replaced(tmp_path):
    a = compile_preset("smollm2_ngram", tmp_path / "a")
    (a.path / "report.md").write_text("stale\n")
    again = compile_preset("smollm2_ngram", tmp_path / "a")
    assert again.status == "replaced"
    b = compile_preset("smollm2_ngram", tmp_path / "b")
    assert codegen.read_tree(again.path) == codegen.read_tree(b.path)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [a.path.name]


class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("fraction", [0.0, 0.4, 0.6, 0.9, 1.0])
def test_interrupted_compile_leaves_nothing(tmp_path, fraction):
    """`on_file` is called once per file rendered, then once per file written: failing at call
    ceil(fraction * 2n) interrupts rendering (fraction < 0.5) or writing (>= 0.5) midway; 1.0 fails
    just before the last file is written."""
    n = len(codegen.render(build.lower_to_ir(load_preset("smollm2_ngram")))[1])
    fail_at = max(1, math.ceil(fraction * 2 * n))
    calls = []

    def on_file(rel):
        calls.append(rel)
        if len(calls) == fail_at:
            raise _Boom(rel)

    out = tmp_path / "out"
    with pytest.raises(_Boom):
        compile_preset("smollm2_ngram", out, on_file=on_file)
    assert len(calls) == fail_at
    assert not out.exists() or list(out.iterdir()) == []


def test_interrupted_write_leaves_nothing(tmp_path):
    plan = load_preset("smollm2_ngram")
    name, files = codegen.render(build.lower_to_ir(plan))
    n = len(files)
    assert n >= 4
    calls = []

    def on_file(rel):
        calls.append(rel)
        if len(calls) == n - 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        codegen.write_artifact(tmp_path / "out", name, files, on_file=on_file)
    assert list((tmp_path / "out").iterdir()) == []


def test_template_missing_variable_is_an_error(tmp_path):
    tdir = tmp_path / "t"
    shutil.copytree(codegen.TEMPLATES_DIR, tdir)
    (tdir / "report.md.j2").write_text("{{ no_such_variable }}\n")
    with pytest.raises(ArtifactError, match="report.md.j2"):
        build.compile_plan(load_preset("smollm2_ngram"), tmp_path / "out", templates_dir=tdir)
    assert list((tmp_path / "out").iterdir()) == [] if (tmp_path / "out").exists() else True


# ------------------------------------------------------------------------------------------------
# hostile plan strings


@pytest.mark.parametrize("name", ['evil"plan', "two\nlines", "x'; import os #"])
def test_plan_name_must_be_identifier(tmp_path, name):
    plan = replace(load_preset("smollm2_ngram"), name=name)
    with pytest.raises(PlanError, match="not a valid identifier"):
        build.compile_plan(plan, tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_plan_strings_appear_only_as_literals(tmp_path):
    """A target path full of quotes, newlines and code never shows up raw in generated Python."""
    evil = '/tmp/x"; import os; os.system("echo pwned") #\nprint("owned")'
    base = load_preset("smollm2_ngram")
    plan = replace(base, target=replace(base.target, path=evil))
    res = build.compile_plan(plan, tmp_path / "out")
    for p in sorted(res.path.rglob("*.py")):
        src = p.read_text()
        assert evil not in src and 'print("owned")' not in src.replace(repr(evil), "")
        tree = ast.parse(src)
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "os.system" not in calls and "print" not in calls
    assert _plan_of(res.path).target.path == evil


# ------------------------------------------------------------------------------------------------
# the CLI


def _specc(*argv):
    from specc.cli import main

    return main(list(argv))


def test_cli_compile_prints_path(tmp_path, capsys):
    rc = _specc("compile", "smollm2_ngram", "--out", str(tmp_path / "out"), "--print-path")
    out = capsys.readouterr().out.strip()
    assert rc == 0
    assert Path(out).parent == tmp_path / "out" and (Path(out) / "manifest.json").is_file()
    rc = _specc("compile", "smollm2_ngram", "--out", str(tmp_path / "out"))
    assert rc == 0 and "up to date" in capsys.readouterr().out


def test_cli_compile_refuses_plan_with_errors(tmp_path, capsys):
    """A plan that loads but breaks a `specc` rule: exit 1, every error printed, nothing written."""
    from specc.check import check

    plan = load_preset("smollm2_ngram", ["verify.accept_threshold.acc=0.8"])
    errors = [v for v in check(plan, "specc") if codegen._severity(v) == "error"]
    assert errors, "expected a lossy accept threshold to be an error on the specc engine"
    out = tmp_path / "out"
    rc = _specc("compile", "smollm2_ngram", "verify.accept_threshold.acc=0.8", "--out", str(out))
    err = capsys.readouterr().err
    assert rc == 1
    assert "error" in err and "verify.accept_threshold" in err
    for v in errors:
        assert codegen.format_violation(v).splitlines()[0] in err
    assert not out.exists() or list(out.iterdir()) == []


def test_cli_compile_bad_plan_file_is_usage_error(tmp_path, capsys):
    rc = _specc("compile", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "out"))
    assert rc == 2
    assert "missing.yaml" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# every shipped specc preset that passes check compiles


def _specc_presets():
    """Every shipped preset that targets the `specc` engine (the others are for `specc export`)."""
    from specc.plan.load import list_presets

    return [p for p in sorted(list_presets()) if load_preset(p).engine == "specc"]


@pytest.mark.parametrize("preset", _specc_presets())
def test_shipped_presets_compile(preset, tmp_path):
    """A specc preset that passes `check` compiles; one that does not is refused naming its errors."""
    plan = load_preset(preset)
    errors = codegen.check_errors(plan)
    if errors:
        with pytest.raises(PlanError, match=re.escape(errors[0].message[:40])):
            build.compile_plan(plan, tmp_path / "out")
        return
    res = build.compile_plan(plan, tmp_path / "out")
    assert (res.path / "manifest.json").is_file()


def test_cli_compile_refuses_non_identifier_name(tmp_path, capsys):
    plan = tmp_path / "quoted.yaml"
    plan.write_text('defaults:\n  - /target: smollm2_135m\n  - /method: ngram\n  - _self_\n'
                    'name: "bad\\"name\\nimport os"\nengine: specc\nmethod:\n  num_steps: 2\n')
    rc = _specc("compile", str(plan), "--out", str(tmp_path / "out"))
    assert rc == 2  # refused while the plan loads: not a file name (specc.plan.load.name_problem)
    assert "name: 'bad\"name\\nimport os' is not safe as a file name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_drift_check_flags_an_artifact_of_an_older_preset(tmp_path, monkeypatch):
    """The CI drift test (tests/compiler/test_generated_drift.py) against a generated/ holding the artifact of
    an older version of smollm2_ngram (ngram.min 1 instead of today's value): the committed
    artifact for today's preset is reported missing and the old directory is reported stale."""
    import tests.compiler.test_generated_drift as drift

    today = resolved_preset("smollm2_ngram").method.ngram.min
    old_min = 1 if today != 1 else 2
    generated = tmp_path / "generated"
    old = compile_preset("smollm2_ngram", generated, overrides=[f"method.ngram.min={old_min}"])
    fresh = {"smollm2_ngram": compile_preset("smollm2_ngram", tmp_path / "fresh").path}
    assert old.path.name != fresh["smollm2_ngram"].name  # the plan change renamed the directory
    monkeypatch.setattr(drift, "GENERATED", generated)
    with pytest.raises(AssertionError, match=re.escape(f"generated/{fresh['smollm2_ngram'].name}/ is missing")):
        drift.test_committed_artifact_matches_a_fresh_compile("smollm2_ngram", fresh)
    with pytest.raises(AssertionError, match=re.escape(old.path.name)):
        drift.test_no_stale_artifacts(fresh)
    # once regenerated (and the stale directory deleted) both checks pass
    shutil.rmtree(old.path)
    shutil.copytree(fresh["smollm2_ngram"], generated / fresh["smollm2_ngram"].name)
    drift.test_committed_artifact_matches_a_fresh_compile("smollm2_ngram", fresh)
    drift.test_no_stale_artifacts(fresh)


def test_drift_check_flags_an_edited_committed_file(tmp_path, monkeypatch):
    """Same name, different bytes (a hand edit of a generated file) is drift too."""
    import tests.compiler.test_generated_drift as drift

    fresh = {"smollm2_ngram": compile_preset("smollm2_ngram", tmp_path / "fresh").path}
    generated = tmp_path / "generated"
    committed = generated / fresh["smollm2_ngram"].name
    shutil.copytree(fresh["smollm2_ngram"], committed)
    (committed / "report.md").write_text((committed / "report.md").read_text() + "edited\n")
    monkeypatch.setattr(drift, "GENERATED", generated)
    with pytest.raises(AssertionError, match=r"drifted in \['report.md'\]"):
        drift.test_committed_artifact_matches_a_fresh_compile("smollm2_ngram", fresh)
