"""The `specc` dispatcher: overrides may follow options; unknown options are refused by the subcommand."""
import subprocess
import sys


def _specc(*argv):
    return subprocess.run([sys.executable, "-m", "specc.cli", *argv], capture_output=True, text=True)


def test_overrides_after_options_are_applied():
    plain = _specc("check", "smollm2_ngram", "--engine", "specc", "--format", "json")
    before = _specc("check", "smollm2_ngram", "method.num_steps=2", "--engine", "specc", "--format", "json")
    after = _specc("check", "smollm2_ngram", "--engine", "specc", "--format", "json", "method.num_steps=2")
    assert after.returncode == before.returncode == 0
    assert after.stdout == before.stdout
    assert after.stdout != plain.stdout  # the override took effect (the filled verify width is 3, not 5)


def test_unknown_option_names_the_subcommand():
    r = _specc("check", "smollm2_ngram", "--bogus")
    assert r.returncode == 2
    assert "specc check: error: unrecognized arguments: --bogus" in r.stderr
