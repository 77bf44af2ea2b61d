"""`specc profile`: the cost table it measures (on a tiny model here) is a table the cost model reads,
with every profiled size, and the command refuses an unusable --out before loading anything."""
import json

import pytest
import torch

from specc import cost
from specc.cli import main as cli_main
from specc.drafters.draft_model import DraftModelDrafter
from specc.runtime.profile import FORMAT, cost_table, profile_costs, token_grid
from specc.runtime.testing import perturbed_copy, tiny_llama


def test_token_grid_covers_every_small_size_and_the_top():
    g = token_grid(100)
    assert g[:64] == list(range(1, 65)) and g[-1] == 100 and g == sorted(set(g))
    assert token_grid(5) == [1, 2, 3, 4, 5]


def test_profile_of_a_tiny_model_loads_as_a_cost_table(tmp_path):
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=1, max_model_len=64)
    drafter = DraftModelDrafter(perturbed_copy(target, noise=0.02), 64)
    measured = profile_costs(target, drafter, max_batch=4, max_width=3, context=16, repeats=2)
    assert sorted(int(n) for n in measured["verify_ms"]) == list(range(1, 13))
    assert sorted(int(b) for b in measured["draft_ms"]) == [1, 2, 3, 4]
    for n, v in measured["verify_ms"].items():
        assert v == pytest.approx(measured["forward_ms"][n] + measured["accept_ms"][n], abs=1e-3) and v > 0
    table = cost_table(measured, device=torch.device("cpu"), plan="tiny", method="draft_model", context=16,
                       repeats=2, threads=1)
    assert table["format"] == FORMAT and table["versions"]["torch"] == torch.__version__
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    loaded = cost.load_cost_table(str(path))
    assert loaded.step_ms(12) >= loaded.step_ms(1) > 0 and loaded.draft_pass_ms(4) is not None


def test_profile_refuses_an_unwritable_out_before_loading(tmp_path, capsys):
    rc = cli_main(["profile", "smollm2_ngram", "--out", str(tmp_path / "no_such_dir" / "t.json")])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err
