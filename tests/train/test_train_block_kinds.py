"""The block drafter kinds (dflash, dspark, pard) train through the drafter training tool's loop
(`specc.train.fit`) on its distillation shards: registered, options checked, the checkpoint written
in its published layout and read back by the runtime's loaders, the card rendered."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from specc.train import fit as FIT, kinds as K

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, tiny_target
from tests.train.test_train_pipeline import _distilled, _recipes


@pytest.mark.parametrize("kind,options", [
    ("dflash", {"gamma": 3, "target_layer_ids": [1, 3], "mask_token_id": V - 1, "anchors": 4, "context": 32}),
    ("dspark", {"gamma": 3, "target_layer_ids": [1, 3], "mask_token_id": V - 1, "anchors": 4, "context": 32,
                "markov_rank": 4}),
    ("pard", {"gamma": 3, "draft_layers": 1, "mask_token_id": V - 1, "anchors": 4, "context": 32}),
])
def test_block_kinds_train_through_the_tool(tmp_path, kind, options):
    assert {"dflash", "dspark", "pard"} <= set(K.KINDS) or K.get(kind)
    target = tiny_target(seed=5)
    data_recipe, fit = _recipes(tmp_path, kind, **options)
    fit.parts = ["round1"]
    cache = _distilled(tmp_path, target, data_recipe, options=fit.options)
    args = argparse.Namespace(device="cpu", threads=1, out=None, init_from=None, time_budget_min=None)
    out = FIT.fit(fit, cache, args, target=target, data_recipe=data_recipe)
    rec = json.loads((out / "training.json").read_text())
    assert rec["steps"] > 0 and len(rec["validation"][-1]["all"]) == 3
    assert (out / "TRAINING.md").is_file()
    if kind == "pard":
        assert json.loads((out / "config.json").read_text())["pard_token"] == V - 1
    else:
        m = K.get(kind).load(out, target)
        assert m.cfg.kind == kind and m.cfg.gamma == 3 and m.cfg.target_layer_ids == (1, 3)


def test_block_kind_options_are_checked():
    from specc.errors import SpeccError

    with pytest.raises(SpeccError, match="unknown option"):
        K.get("dspark").check_options({"markov": 3}, "recipe.yaml")
