"""Bad input to `specc import` / `specc check --<engine>-args` and an export that must agree with its own
notes: a misspelt SGLang algorithm, counts the engine refuses (or no plan can hold), an unterminated
quote in a launch file, and DFlash/DSpark exports whose num_steps/topk SGLang pins to 1."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specc.export import to_sglang
from specc.importer import CommandError, import_command, imported_plan, plan_yaml
from specc.plan.load import load_plan

REPO = Path(__file__).resolve().parents[2]
SGL = ["python3", "-m", "sglang.launch_server", "--model", "m"]


def _specc(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "specc.cli", *args], capture_output=True, text=True, cwd=cwd)


# ---- 1. a near miss of a builtin algorithm name ---------------------------------------------------------

@pytest.mark.parametrize("typo,want", [("EAGEL3", "EAGLE3"), ("eagel3", "EAGLE3"), ("NGRAMS", "NGRAM"),
                                       ("EAGLE-3", "EAGLE3"), ("DSPRK", "DSPARK"), ("STANDALON", "STANDALONE")])
def test_sglang_algorithm_typo_is_an_error_with_the_suggestion(typo, want):
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", typo])
    assert len(imp.errors) == 1, imp.errors
    e = imp.errors[0]
    assert e.startswith(f"--speculative-algorithm {typo}: not a builtin sglang==0.5.23 algorithm; "
                        f"did you mean {want}")
    assert "spec_info.py:65" in e
    # still imported faithfully as what SGLang would look up: a plugin of that name
    assert imp.plan["method"] == {"name": "custom", "plugin": typo}


@pytest.mark.parametrize("name", ["BIGRAM", "my_eagle", "EAGLE3_TREE", "lookahead"])
def test_sglang_plugin_names_not_close_to_a_builtin_stay_plugins(name):
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", name])
    assert imp.errors == []
    assert imp.plan["method"] == {"name": "custom", "plugin": name}
    assert any("imported as a plugin" in n and name.upper() in n for n in imp.notes), imp.notes


@pytest.mark.parametrize("name,method", [("eagle3", "eagle3"), ("NextN", "mtp"), ("dflash", "dflash"),
                                         ("UNO", "custom")])
def test_sglang_builtin_names_any_case_are_not_flagged(name, method):
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", name])
    assert imp.errors == [] and imp.plan["method"]["name"] == method


def test_sglang_algorithm_typo_cli_and_check():
    r = _specc("import", "sglang", "--", *SGL, "--speculative-algorithm", "EAGEL3")
    assert r.returncode == 1, r.stderr  # plan written, the refusal reported
    assert "did you mean EAGLE3?" in r.stderr and "# error: --speculative-algorithm EAGEL3" in r.stdout
    r = _specc("check", "--format", "json", "--sglang-args", " ".join(SGL + ["--speculative-algorithm", "EAGEL3"]))
    assert r.returncode == 1
    assert '"sglang.argv"' in r.stdout and "did you mean EAGLE3?" in r.stdout


def test_vllm_method_typo_gets_a_suggestion():
    imp = import_command("vllm", argv=["m", "--speculative-config",
                                       '{"method": "EAGEL3", "model": "d", "num_speculative_tokens": 3}'])
    assert any("'EAGEL3' is not a vllm==0.33.0 method (did you mean 'eagle3'" in e for e in imp.errors), imp.errors
    imp = import_command("vllm", argv=["m", "--speculative-config", '{"method": ["eagle3"], "model": "d"}'])
    assert any("method=[\"eagle3\"] must be a string" in e for e in imp.errors), imp.errors


# ---- one root error per mistake ------------------------------------------------------------------------

def _check_json(*words):
    import json

    r = _specc("check", "--format", "json", *words)
    assert r.returncode == 1, r.stdout + r.stderr
    [obj] = json.loads(r.stdout)
    return obj["violations"]


def test_a_misspelt_sglang_algorithm_is_one_error_without_the_plugin_warning():
    vs = _check_json("--sglang-args", *SGL, "--speculative-algorithm", "EAGEL3", "--speculative-draft-model-path", "d")
    errors = [v for v in vs if v["severity"] == "error"]
    assert len(errors) == 1 and "did you mean EAGLE3?" in errors[0]["message"], errors
    # the error names the keys it put in for the misspelling; the plugin rule (N11) that reads only them is
    # a consequence of the same mistake and is not reported
    assert errors[0]["keys"] == ["method.name", "method.plugin"]
    assert not any(v["rule"] == "sglang.N11" for v in vs), [v["rule"] for v in vs]
    assert not any(v["severity"] == "warning" for v in vs), vs
    # a real plugin name (not close to a builtin) is not an error: its plugin warning stays
    vs = _check_json("--sglang-args", *SGL, "--speculative-algorithm", "MYPLUGIN", "--foo", "1")
    assert any(v["rule"] == "sglang.N11" for v in vs), [v["rule"] for v in vs]


def test_a_misspelt_vllm_method_is_one_error_without_the_custom_class_rules():
    vs = _check_json("--vllm-args", "vllm", "serve", "m", "--speculative-config",
                     '{"method": "eagel3", "model": "d", "num_speculative_tokens": 3}')
    errors = [v for v in vs if v["severity"] == "error"]
    assert len(errors) == 1 and "did you mean 'eagle3'" in errors[0]["message"], errors
    assert not any(v["keys"] and set(v["keys"]) <= {"method.name", "method.plugin"} for v in vs[1:]), vs


def test_drop_dependent_keeps_what_reads_a_key_the_user_set():
    from specc.check.base import Violation, drop_dependent

    root = Violation("e.argv", "error", ("method.name",), "typo", "s", stands_in=("method.name",))
    only = Violation("e.A", "warning", ("method.name",), "about the stand-in", "s")
    unset = Violation("e.B", "error", ("method.name", "deploy.x"), "stand-in and an unset key", "s")
    mixed = Violation("e.C", "error", ("method.name", "method.num_steps"), "reads what the user set", "s")
    other = Violation("e.D", "warning", ("deploy.x",), "unrelated", "s")
    given = ["method.name", "method.num_steps"]
    assert drop_dependent([root, only, unset, mixed, other], given) == [root, mixed, other]
    assert drop_dependent([only, root], given) == [only, root]  # only what follows an earlier root
    plain = Violation("e.argv", "error", (), "no stand-in", "s")
    assert drop_dependent([plain, only, other], given) == [plain, only, other]


@pytest.mark.parametrize("engine,words", [("sglang", SGL), ("vllm", ["vllm", "serve", "m"])])
def test_an_unknown_flag_with_a_value_is_one_error_naming_both(engine, words):
    vs = _check_json(f"--{engine}-args", *words, "--foo", "3")
    errors = [v for v in vs if v["severity"] == "error"]
    assert len(errors) == 1, errors
    assert errors[0]["message"].startswith(f"--foo 3: not a {engine}==") and "flag" in errors[0]["message"]
    imp = import_command(engine, argv=words + ["--foo", "3", "--bar=4", "--speculative-num-stepz", "3"])
    assert imp.errors[:2] == [f"--foo 3: not a {imp.engine}=={imp.version} flag",
                              f"--bar=4: not a {imp.engine}=={imp.version} flag"], imp.errors
    assert imp.errors[2].startswith("--speculative-num-stepz 3: not a"), imp.errors
    assert len(imp.errors) == 3, imp.errors


def test_a_value_after_a_switch_is_still_its_own_error():
    imp = import_command("sglang", argv=SGL + ["--enable-torch-compile", "5"])
    assert len(imp.errors) == 1 and imp.errors[0].startswith("'5': unexpected argument"), imp.errors
    # a known flag between an unknown one and a word: the word is not the unknown flag's value
    imp = import_command("sglang", argv=SGL + ["--foo", "--enable-torch-compile", "5"])
    assert sorted(imp.errors) == sorted(["--foo: not a sglang==0.5.23 flag",
                                         "'5': unexpected argument for sglang==0.5.23 (a value for a flag that "
                                         "takes none, or the value of an unknown flag)"]), imp.errors
    # a negative number is a value (argparse reads it as one); a value after --flag=value stands alone
    imp = import_command("sglang", argv=SGL + ["--foo", "-1", "--bar=1", "2"])
    assert imp.errors[:2] == ["--foo -1: not a sglang==0.5.23 flag", "--bar=1: not a sglang==0.5.23 flag"], imp.errors
    assert len(imp.errors) == 3 and imp.errors[2].startswith("'2': unexpected argument"), imp.errors


def test_no_empty_keys_field_in_a_violation_line():
    r = _specc("check", "--sglang-args", *SGL, "--foo", "3")
    assert r.returncode == 1
    assert "keys: ;" not in r.stdout and "keys: -" not in r.stdout
    line = next(i for i, ln in enumerate(r.stdout.splitlines()) if "[sglang.argv]" in ln)
    assert r.stdout.splitlines()[line + 1].strip().startswith("source: sglang==0.5.23 argparse")
    from specc.check.base import Violation
    from specc.compiler.codegen import format_violation

    v = Violation("e.argv", "error", (), "bad", "src")
    assert format_violation(v) == "error: [e.argv] bad (source: src)"
    assert format_violation(Violation("e.A", "error", ("a.b",), "bad", "src")) == "error: [e.A] bad (keys: a.b; source: src)"


def test_counts_agree_in_number():
    from specc.console import plural

    assert [plural(n, "token") for n in (0, 1, 2, "1", 1.5)] == ["0 tokens", "1 token", "2 tokens", "1 token",
                                                                  "1.5 tokens"]
    assert plural(1, "batch") == "1 batch" and plural(3, "batch") == "3 batches"
    r = _specc("import", "sglang", "--", *SGL, "--foo", "3", "--log-level", "warning")
    assert r.returncode == 1
    assert "1 flag has no plan key" in r.stderr and "flag(s)" not in r.stderr, r.stderr
    assert "error: --foo 3: not a sglang==0.5.23 flag" in r.stderr and "error(s)" not in r.stderr
    r = _specc("check", "--sglang-args", *SGL, "--foo", "3")
    assert "1 error," in r.stdout and "1 errors" not in r.stdout


# ---- 2. counts the engine refuses ---------------------------------------------------------------------

@pytest.mark.parametrize("k", [-3, 0])
def test_vllm_non_positive_k_is_refused_and_left_out(k):
    imp = import_command("vllm", argv=["m", "--speculative-config",
                                       f'{{"method": "eagle3", "model": "d", "num_speculative_tokens": {k}}}'])
    assert imp.errors == [f"--speculative-config num_speculative_tokens={k}: vLLM refuses K <= 0 at startup "
                          f"(SpeculativeConfig field `gt=0`, vllm/config/speculative.py:413); write the number of "
                          f"tokens to draft per step (>= 1), or drop the key to take the draft's n_predict (left out "
                          f"of the plan)"]
    assert "num_steps" not in imp.plan["method"]
    imported_plan(imp, "p")  # what is written still forms a plan


def test_vllm_other_counts():
    imp = import_command("vllm", argv=["m", "--spec-method", "ngram", "--spec-tokens", "-2",
                                       "--speculative-config.prompt_lookup_max", "0", "--max-num-seqs", "0",
                                       "-tp", "0", "--max-model-len", "-1"])
    text = "\n".join(imp.errors)
    assert "--spec-tokens -2: vLLM refuses K <= 0" in text
    assert "--speculative-config prompt_lookup_max=0: vLLM refuses prompt_lookup_max < 1" in text
    assert "--max-num-seqs 0:" in text and "--tensor-parallel-size 0:" in text
    assert "max-model-len" not in text and "max_model_len" not in imp.plan.get("target", {})  # -1 is vLLM's `auto`
    assert imp.plan["method"] == {"name": "ngram"}
    assert "deploy" not in imp.plan


def test_vllm_negative_k_cli_exit_code_and_written_plan_loads(tmp_path):
    r = _specc("import", "vllm", "--", "vllm", "serve", "m", "--speculative-config",
               '{"method":"eagle3","num_speculative_tokens":-3}')
    assert r.returncode == 1 and "num_speculative_tokens=-3: vLLM refuses K <= 0" in r.stderr
    assert "num_steps" not in r.stdout
    out = tmp_path / "p.yaml"
    out.write_text(r.stdout)
    assert load_plan(str(out)).plan.method.name == "eagle3"  # specc loads what import wrote


def test_sglang_non_positive_counts():
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "-3",
                                               "--speculative-eagle-topk", "0", "--speculative-num-draft-tokens",
                                               "-1", "--tp-size", "0", "--page-size", "0"])
    flags = sorted(e.split(":", 1)[0] for e in imp.errors)
    assert flags == ["--page-size 0", "--speculative-eagle-topk 0", "--speculative-num-draft-tokens -1",
                     "--speculative-num-steps -3", "--tp-size 0"], imp.errors
    assert all("left out of the plan" in e for e in imp.errors)
    assert imp.plan["method"] == {"name": "eagle3"} and "deploy" not in imp.plan
    imported_plan(imp, "p")


def test_sglang_block_sizes_and_pinned_steps():
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", "DFLASH", "--speculative-num-steps", "-3",
                                               "--speculative-dflash-block-size", "0"])
    assert len(imp.errors) == 1 and imp.errors[0].startswith("--speculative-dflash-block-size 0: the DFlash block")
    assert "speculative_hook.py:368-373" in imp.errors[0]
    # DFLASH pins num_steps to 1 (a warning, not a refusal): a note, and the value is not carried over
    assert any(n.startswith("--speculative-num-steps -3: SGLang sets it to 1 for DFLASH") for n in imp.notes)
    assert imp.plan["method"] == {"name": "dflash"}
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", "DSPARK", "--speculative-dspark-block-size",
                                               "-1", "--speculative-num-draft-tokens", "1"])
    assert sorted(e.split(":", 1)[0] for e in imp.errors) == ["--speculative-dspark-block-size -1",
                                                              "--speculative-num-draft-tokens 1"]
    assert any("speculative_hook.py:846-850" in e for e in imp.errors)


def test_valid_counts_import_unchanged():
    imp = import_command("sglang", argv=SGL + ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                                               "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"])
    assert imp.errors == [] and imp.plan["method"] == {"name": "eagle3", "num_steps": 3, "num_draft_tokens": 4,
                                                       "topk": 1}


# ---- 3. an unterminated quote in a launch file ------------------------------------------------------------

def test_unterminated_quote_is_reported_with_its_line(tmp_path):
    bad = tmp_path / "bad_launch.sh"
    bad.write_text('python -m sglang.launch_server --model m "unterminated\n')
    with pytest.raises(CommandError) as exc:
        import_command("sglang", text=bad.read_text())
    msg = str(exc.value)
    assert "line 1: the double quote (\") at column 42 is never closed" in msg and "no sglang launch" not in msg
    r = _specc("import", "sglang", "--file", str(bad))
    assert r.returncode == 2 and "line 1: the double quote" in r.stderr and "no sglang launch command" not in r.stderr
    r = _specc("check", "--sglang-args", str(bad))
    assert r.returncode != 0 and "line 1: the double quote" in r.stdout


def test_unterminated_quote_in_a_continued_command_names_its_physical_line():
    script = ("#!/bin/sh\nset -e\npython -m sglang.launch_server \\\n  --model-path m \\\n"
              "  --speculative-algorithm 'EAGLE3 \\\n  --tp-size 2\n")
    with pytest.raises(CommandError, match=r"line 5: the single quote \(\'\) at column 27 is never closed"):
        import_command("sglang", text=script)


def test_quotes_spanning_lines_still_read():
    text = "vllm serve m --speculative-config '{\n  \"method\": \"ngram\",\n  \"num_speculative_tokens\": 3}'\n"
    imp = import_command("vllm", text=text)
    assert imp.errors == [] and imp.plan["method"] == {"name": "ngram", "num_steps": 3}
    # a broken line elsewhere does not hide a good command
    imp = import_command("sglang", text="echo \"oops\npython -m sglang.launch_server --model-path m\n")
    assert imp.plan["target"] == {"path": "m"}


def test_no_launcher_and_no_quote_problem_keeps_the_old_message():
    with pytest.raises(CommandError, match="no sglang launch command found"):
        import_command("sglang", text="echo hello\n")


# ---- 4. DFlash / DSpark exports agree with the DF8/DF9/DS11 notes ---------------------------------------

def _pairs(args):
    return {a: b for a, b in zip(args, args[1:]) if a.startswith("--")}


@pytest.mark.parametrize("preset", ["smollm2_dflash", "smollm2_dspark"])
def test_one_pass_exports_pin_steps_and_topk_to_one(preset):
    plan = load_plan(preset).plan
    assert plan.method.num_steps == 7  # specc's κ; SGLang runs the block in one pass
    f = _pairs(to_sglang(plan).args)
    assert (f["--speculative-num-steps"], f["--speculative-eagle-topk"]) == ("1", "1")
    r = _specc("export", preset, "--engine", "sglang")
    assert r.returncode == 0, r.stderr
    assert "method.num_steps becomes 1" in r.stderr  # the note agrees with the command
    assert "--speculative-num-steps 1 " in r.stdout and "--speculative-num-steps 7" not in r.stdout


def test_one_pass_export_topk_and_eagle_chain_width_follow_the_notes():
    f = _pairs(to_sglang(load_plan("smollm2_dflash", ["method.topk=2"]).plan).args)
    assert f["--speculative-eagle-topk"] == "1"  # DF9
    plan = load_plan("smollm2_eagle3", ["method.topk=1", "method.num_steps=3", "method.num_draft_tokens=8"]).plan
    assert _pairs(to_sglang(plan).args)["--speculative-num-draft-tokens"] == "4"  # EG20: κ + 1


def test_one_pass_export_round_trips():
    launch = to_sglang(load_plan("smollm2_dflash").plan)
    imp = import_command("sglang", text=launch.command())
    assert imp.errors == []
    assert to_sglang(imported_plan(imp, "p")).command() == launch.command()
    assert "num_steps: 1" in plan_yaml(imp)


def test_output_option_before_the_launch_command(tmp_path):
    """`-o FILE -- COMMAND`: the command after `--` is read even though an option came first."""
    out = tmp_path / "p.yaml"
    r = _specc("import", "vllm", "-o", str(out), "--", "vllm", "serve", "m", "--speculative-config",
               '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert r.returncode == 0, r.stderr
    plan = load_plan(str(out)).plan
    assert plan.method.name == "ngram" and plan.method.num_steps == 3
