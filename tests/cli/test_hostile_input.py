"""Input of a hostile user, one test (or more) per finding, each of which failed before the fix:
every command refuses it before doing any work, with exit 2 and a message naming the option or field,
the bound and the fix, never a traceback.

* ``train distill --gen-batch 100000`` grew past 20 GB: the batch is checked against this machine's
  memory first (the largest that fits is named);
* plans, group files, overrides and recipes nested 80+ levels ended in a ``RecursionError``; a YAML
  alias bomb in a training recipe ran for a minute; a 5,000-character plan name passed ``check``;
* ``train fit --init-from /nonexistent`` / ``--out /proc/...`` failed after a minute of work;
* a ``defaults:`` entry climbing out of ``conf/`` was composed, ``${oc.env:HOME}`` resolved;
* ``serve --prefill-url file:///etc/passwd`` was accepted;
* an artifact renamed by hand was reported under its directory's name (now: its content's);
* deep JSON (prompts, run files, cost tables, launch configs) ended in a ``RecursionError``.

Anything that used to run long or allocate without bound runs in a subprocess bounded in time and
address space (``test_bad_input.specc_proc``).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.cli.test_bad_input import ckpt, ngram_art, run_cli, specc_proc  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
NGRAM = "defaults:\n  - /target: smollm2_135m\n  - /method: ngram\n  - _self_\n"


def _deep_block(levels: int) -> str:
    return "name: deep\nmethod:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(levels)) + \
        "  " * (levels + 1) + "v: 1\n"


def _alias_bomb(head: str) -> str:
    lines = [head, "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


def _refused(rc, out, err, *words):
    text = out + err
    assert rc == 2, text[-2000:]
    assert "Traceback" not in text
    for w in words:
        assert w in text, (w, text[-2000:])


# ------------------------------------------------------------------------------------------------
# memory: a distillation batch larger than this machine


def test_gen_batch_larger_than_memory_is_refused_before_anything_allocates():
    t0 = time.perf_counter()
    p = specc_proc("train", "distill", "smollm2_specbench", "--gen-batch", "100000", "--part", "round1",
                   "--limit", "1", timeout=60)
    _refused(p.returncode, p.stdout, p.stderr, "--gen-batch 100000: needs about", "GiB", "of memory available",
             "pass --gen-batch")
    assert time.perf_counter() - t0 < 15
    best = int(p.stderr.rsplit("pass --gen-batch ", 1)[1].split()[0])
    assert 1 <= best < 100000


def test_the_batch_estimate_counts_the_probe_and_the_cache():
    from specc.predict.deploy_cost import ModelShape
    from specc.train.preflight import distill_bytes

    s = ModelShape(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152,
                   embed_vocab=49152, tied=True, params=134515008)
    need, words = distill_bytes(s, 100000, 1217)
    kv = 2 * 30 * 3 * 64 * 4 * 1217 * 100000  # K and V of every layer, per position, per row, fp32
    assert need >= kv and "KV cache" in words and "dtype probe" in words
    probe_only = 100000 * 49152 * 4  # the (batch, vocab) product the old probe allocated unbounded
    assert distill_bytes(s, 100000, 1)[0] >= probe_only


# ------------------------------------------------------------------------------------------------
# structure: depth, aliases, lengths


@pytest.mark.parametrize("cmd", ["check", "explain", "compile"])
def test_a_plan_nested_100_deep_is_refused_at_its_line(capsys, tmp_path, cmd):
    f = tmp_path / "deep.yaml"
    f.write_text(_deep_block(100))
    rc, out, err = run_cli(capsys, cmd, f, "--out" if cmd == "compile" else "--engine", tmp_path / "o"
                           if cmd == "compile" else "specc")
    _refused(rc, out, err, "deep.yaml:", "nest more than 32 levels")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("override, words", [
    ("method." + ".".join(["a"] * 100) + "=1", "the key nests 101 levels"),
    ("method.tree_choices=" + "[" * 2000 + "]" * 2000, "nests 2000 brackets deep"),
    ("target.path=/" + "a" * 5000, "over the 4,096 a plan value may have"),
    ("name=" + "n" * 200, "over the 128 a plan name may have"),
])
def test_overrides_are_bounded_before_hydra_parses_them(capsys, override, words):
    for cmd in ("check", "explain"):
        rc, out, err = run_cli(capsys, cmd, "smollm2_ngram", override)
        _refused(rc, out, err, words)


def test_a_flow_list_10000_deep_is_refused_before_the_composer_recurses(capsys, tmp_path):
    f = tmp_path / "flow.yaml"
    f.write_text("name: deep\nmethod:\n  suffix:\n    corpora: " + "[" * 10000 + "]" * 10000 + "\n")
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "flow.yaml:4:", "nest")  # libyaml's own parser stops it first


def test_a_plan_name_of_5000_characters_fails_check_and_compile_writes_nothing(capsys, tmp_path):
    f = tmp_path / "long.yaml"
    f.write_text(NGRAM + "name: " + "n" * 4000 + "\n")
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "long.yaml:5: name: 4,000 characters, over the 128 a plan name may have")
    rc, out, err = run_cli(capsys, "compile", f, "--out", tmp_path / "out")
    _refused(rc, out, err, "name: 4,000 characters")
    assert not (tmp_path / "out").exists()
    f.write_text(NGRAM + "name: " + "n" * 5000 + "\n")  # over PATH_MAX: refused as a value
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "long.yaml:5: a value of 5,000 characters, over the 4,096")


def test_a_path_component_over_name_max_is_a_plan_error_not_an_oserror(capsys):
    rc, out, err = run_cli(capsys, "explain", "smollm2_ngram", "target.path=/" + "a" * 300)
    _refused(rc, out, err, "target.path: the path has a component of 300 bytes, over this machine's NAME_MAX")


def test_recipe_alias_bomb_and_depth_are_refused_at_once(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb("name: bomb\nkind: eagle3\ndata: smollm2_specbench\nout: x"))
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: d\nkind: eagle3\ndata: smollm2_specbench\nout: x\noptions:\n"
                    + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(90)) + "  " * 91 + "v: 1\n")
    for f, words in ((bomb, "alias bomb"), (deep, "nest more than 32 levels")):
        t0 = time.perf_counter()
        p = specc_proc("train", "fit", f, timeout=30)
        _refused(p.returncode, p.stdout, p.stderr, f"recipe {f}", words)
        assert time.perf_counter() - t0 < 15


# ------------------------------------------------------------------------------------------------
# paths: inputs exist, outputs writable, before the work


@pytest.mark.parametrize("argv, words", [
    (("--init-from", "/nonexistent"), "--init-from /nonexistent: no such directory"),
    (("--init-from", "/dev/zero"), "--init-from /dev/zero: is a character device, not a directory"),
    (("--out", "/proc/specc_out"), "--out /proc/specc_out: cannot write into /proc"),
])
def test_fit_paths_are_checked_before_any_work(argv, words):
    t0 = time.perf_counter()
    p = specc_proc("train", "fit", "smollm2_135m_eagle3", *argv, timeout=30)
    _refused(p.returncode, p.stdout, p.stderr, words)
    assert time.perf_counter() - t0 < 15


def test_init_from_needs_a_checkpoint_and_render_an_existing_drafter(tmp_path):
    (tmp_path / "empty").mkdir()
    p = specc_proc("train", "fit", "smollm2_135m_eagle3", "--init-from", tmp_path / "empty", timeout=30)
    _refused(p.returncode, p.stdout, p.stderr, "config.json: no such file")
    p = specc_proc("train", "render", "smollm2_135m_eagle3", "--out", tmp_path / "nope", timeout=30)
    _refused(p.returncode, p.stdout, p.stderr, "--out", "no such directory")


def test_an_unwritable_import_output_is_refused_before_the_work(capsys, tmp_path):
    rc, out, err = run_cli(capsys, "import", "vllm", "-o", "/proc/specc_out/p.yaml", "--", "vllm", "serve", "m")
    _refused(rc, out, err, "-o /proc/specc_out: cannot write")
    rc, out, err = run_cli(capsys, "import", "vllm", "-o", tmp_path, "--", "vllm", "serve", "m")
    _refused(rc, out, err, f"-o {tmp_path}: is a directory")


# ------------------------------------------------------------------------------------------------
# composition confined to conf/, no resolvers


def test_defaults_cannot_climb_out_of_the_config_search_path(capsys, tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "x.yaml").write_text("path: /etc\nformat: hf\n")
    rel = os.path.relpath(evil / "x", ROOT / "conf" / "target")
    plans = tmp_path / "plans"
    plans.mkdir()
    f = plans / "p.yaml"
    f.write_text(f"defaults:\n  - /target: {rel}\n  - _self_\nname: escape\n")
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "defaults entry /target:", "compose only from the config search path")
    rc, out, err = run_cli(capsys, "check", "smollm2_ngram", f"target={rel}")
    _refused(rc, out, err, "override 'target=", "compose only from the config search path")
    # a link inside the plan's folder leading outside is refused too
    (plans / "target").mkdir()
    (plans / "target" / "linked.yaml").symlink_to(evil / "x.yaml")
    f.write_text("defaults:\n  - target: linked\n  - _self_\nname: escape\n")
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "leads to", "outside")


def test_resolvers_and_hydra_sections_are_refused_in_plans_and_recipes(capsys, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(NGRAM + "name: envplan\ntarget:\n  path: ${oc.env:HOME}\n")
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "p.yaml:7:", "calls the resolver oc.env")
    rc, out, err = run_cli(capsys, "check", "smollm2_ngram", "target.path=${oc.decode:'[1]'}")
    _refused(rc, out, err, "calls the resolver oc.decode")
    f.write_text(NGRAM + "name: h\nhydra:\n  searchpath: [file:///etc]\n")
    rc, out, err = run_cli(capsys, "check", f)
    _refused(rc, out, err, "p.yaml:6: a `hydra:` section")
    f.write_text(NGRAM + "name: refs\nmethod:\n  ngram:\n    min: 2\n    max: ${method.ngram.min}\n")
    rc, out, err = run_cli(capsys, "check", f)  # a reference to another key is allowed
    assert rc == 0, out + err
    r = tmp_path / "r.yaml"
    r.write_text("name: env\nkind: eagle3\ndata: smollm2_specbench\nout: ${oc.env:HOME}\n")
    rc, out, err = run_cli(capsys, "train", "fit", r)
    _refused(rc, out, err, "r.yaml:4:", "calls the resolver oc.env")


# ------------------------------------------------------------------------------------------------
# URLs, artifacts, JSON


def test_a_file_url_for_the_prefill_instance_is_refused_at_startup(ngram_art):
    t0 = time.perf_counter()
    p = specc_proc("serve", ngram_art, "--role", "decode", "--prefill-url", "file:///etc/passwd", timeout=30)
    _refused(p.returncode, p.stdout, p.stderr, "--prefill-url", "scheme must be http or https")
    p = specc_proc("serve", ngram_art, "--role", "decode", timeout=30)
    _refused(p.returncode, p.stdout, p.stderr, "--role decode needs --prefill-url")
    assert time.perf_counter() - t0 < 20


def test_a_renamed_artifact_is_identified_by_its_content(capsys, ngram_art, tmp_path):
    from specc.runtime.artifact import load_artifact

    renamed = tmp_path / "whatever_its_name"
    shutil.copytree(ngram_art, renamed)
    art = load_artifact(renamed)
    assert art.name == ngram_art.name != renamed.name
    rc, out, err = run_cli(capsys, "run", renamed, "--prompt", "w2 w3 w4", "--max-new-tokens", "4", "--json")
    assert rc == 0, err
    assert json.loads(out.splitlines()[-1])["summary"]["artifact"] == ngram_art.name
    manifest = json.loads((renamed / "manifest.json").read_text())
    manifest["name"] = renamed.name  # renaming it in the manifest too is an edit: refused by its hash
    (renamed / "manifest.json").write_text(json.dumps(manifest))
    rc, out, err = run_cli(capsys, "run", renamed, "--prompt", "w2")
    _refused(rc, out, err, "is not the hash of the manifest's content")


@pytest.mark.parametrize("where", ["prompts", "acceptance", "cost_table", "spec_config"])
def test_deep_json_is_an_error_not_a_recursion(capsys, ngram_art, tmp_path, where):
    deep = "[" * 100000 + "]" * 100000
    f = tmp_path / "deep.json"
    f.write_text('{"prompt": ' + deep + "}\n" if where == "prompts" else deep)
    argv = {"prompts": ("run", ngram_art, "--prompts", f),
            "acceptance": ("explain", "smollm2_ngram", "--acceptance", f),
            "cost_table": ("tune", "specc/data/prompts.jsonl", "--cost-table", f, "--out", tmp_path / "t.yaml"),
            "spec_config": ("import", "vllm", "--speculative-config", deep[:20000] + deep[-20000:], "--model", "m")}[where]
    rc, out, err = run_cli(capsys, *argv)
    _refused(rc, out, err, "nest deeper than")


@pytest.mark.parametrize("argv, words", [
    (("tune", "specc/data/prompts.jsonl", "--max-steps", "1000000000"), "--max-steps: 1000000000: κ is at most 64"),
    (("tune", "specc/data/prompts.jsonl", "--measure-batch", "1000000000"), "--measure-batch 1000000000: needs about"),
    (("tune", "specc/data/prompts.jsonl", "--max-new-tokens", "1000000000000"), "--max-new-tokens: 1000000000000"),
    (("tune", "specc/data/prompts.jsonl", "--confirm-top", "1000000000"), "--confirm-top: 1000000000: at most 16"),
    (("bench", "smollm2_ngram", "--concurrency", "1000000000"), "--concurrency '1000000000': give integers in 1..4096"),
    (("bench", "smollm2_ngram", "--concurrency", "4", "--requests-per-slot", "1000000000"),
     "--requests-per-slot 1000000000: needs about"),
])
def test_numbers_no_machine_can_honour_are_refused_first(tmp_path, argv, words):
    # in a child bounded in memory: before the fix these allocated until the machine ran out
    p = specc_proc(*argv, *(("--out", tmp_path / "t.yaml") if argv[0] == "tune" else ()), timeout=60)
    _refused(p.returncode, p.stdout, p.stderr, words)
