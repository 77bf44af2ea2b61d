"""The block-drafter training pipeline (specc.blocktrain) on a tiny random target, in seconds:
self-distillation and teacher-forcing records, shards written atomically and read back, the label
rule (block positions valid only while a sequence follows the target's greedy chain), one short
training run per kind with its checkpoint, card and held-out table, and DSpark's calibration."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from specc.blocktrain import data as bdata, fit, kinds
from specc.runtime.testing import tiny_llama


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    t = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    return t.requires_grad_(False)


@pytest.fixture(scope="module")
def shards(target, tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 60, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(30)]
    answers = bdata.greedy_answers(target, prompts, 20, eos=[])
    recs = bdata.record_sequences(target, [p + a for p, a in zip(prompts, answers)], [0, 1])
    for i, (r, p) in enumerate(zip(recs, prompts)):
        r.update(id=f"d{i}", prompt_len=len(p), source="tiny", category="tiny")
    bdata.write_shard(d / "distill-0", recs, [0, 1], {"kind": "distill"})
    text = [torch.randint(0, 60, (30,), generator=g).tolist() for _ in range(6)]
    trecs = bdata.record_sequences(target, text, [0, 1])
    for i, r in enumerate(trecs):
        r.update(id=f"t{i}", prompt_len=3, source="tiny", category="teacher")
    bdata.write_shard(d / "teacher-0", trecs, [0, 1], {"kind": "teacher"})
    return d, prompts, answers


def test_records_and_shards(target, shards):
    d, prompts, answers = shards
    from specc.runtime.testing import reference_greedy

    assert answers[0] == reference_greedy(target, prompts[0], 20)  # batched greedy == plain greedy
    assert [p.name for p in bdata.shard_paths(d)] == ["distill-0", "teacher-0"]
    assert not list(d.glob("*.tmp.*"))
    data = bdata.load_shards(bdata.shard_paths(d), [0, 1])
    assert len(data) == 36 and data.kinds.count("teacher") == 6
    a, b = data.span(0)
    seq = prompts[0] + answers[0]
    assert data.tokens[a:b].tolist() == seq
    # labels are the target's argmax after each prefix: inside the answer they are the next token
    assert data.labels[a + len(prompts[0]) - 1: b - 1].tolist() == answers[0]
    assert data.feats[0].dtype == torch.float16 and data.feats[1].shape == (int(data.offsets[-1]), 32)
    with pytest.raises(ValueError, match="no hidden states of layers \\[5\\]"):
        bdata.load_shards(bdata.shard_paths(d), [5])
    assert bdata.done_ids(d) >= {"d0", "t5"}


def test_block_labels_stop_at_the_first_disagreement():
    tokens = torch.tensor([1, 2, 3, 4, 5, 6])
    labels = torch.tensor([2, 3, 9, 5, 6, 7])  # real text leaves the greedy chain after token 3
    lab, ok = kinds.BlockKind.block_labels(tokens, labels, 0, 4)
    assert lab.tolist()[:3] == [2, 3, 9] and ok.tolist() == [True, True, True, False]
    lab, ok = kinds.BlockKind.block_labels(tokens, labels, 4, 4)
    assert ok.tolist() == [True, True, False, False]  # the sequence ends


@pytest.mark.parametrize("kind", ["dflash", "dspark", "pard"])
def test_short_training_run_writes_a_loadable_drafter_and_card(target, shards, kind, tmp_path):
    d, _, _ = shards
    opts = {"gamma": 3, "mask_token_id": 63, "anchors": 4, "context": 32}
    if kind == "pard":
        opts["draft_layers"] = 1
    else:
        opts["target_layer_ids"] = [0, 1]
    if kind == "dspark":
        opts["markov_rank"] = 4
    recipe = {"name": f"tiny_{kind}", "kind": kind, "lr": 3e-3, "steps": 12, "batch": 4, "val_every": 6,
              "out": str(tmp_path / kind), "options": opts}
    data = bdata.load_shards(bdata.shard_paths(d), [0, 1])
    from specc.models.tokenizer import Tokenizer  # noqa: F401  (PARD writes tokenizer files only when given one)

    rec = fit.train(recipe, {"shard_dir": str(d)}, data=data, target=target, tokenizer=None, log=lambda *a: None)
    assert rec["steps"] == 12 and len(rec["held_out_after"]["agreement"]) == 3
    assert rec["held_out_sequences"] == 3  # every tenth self-distilled sequence
    card = (tmp_path / kind / "TRAINING.md").read_text()
    assert "Held-out table" in card and "Data card" in card
    assert json.loads((tmp_path / kind / "training.json").read_text())["kind"] == kind
    if kind == "pard":
        cfg = json.loads((tmp_path / kind / "config.json").read_text())
        assert cfg["pard_token"] == 63
    else:
        m = kinds.get(kind).load(tmp_path / kind, target)
        assert m.cfg.kind == kind and m.cfg.gamma == 3
    if kind == "dspark":
        assert rec["confidence_calibration"] is not None and len(rec["confidence_calibration"]) == 3


def test_unknown_option_and_kind_are_refused():
    from specc.errors import SpeccError

    with pytest.raises(SpeccError, match="unknown option"):
        kinds.get("dflash").check_options({"gamam": 3}, "recipe.yaml")
    with pytest.raises(SpeccError, match="known: dflash, dspark, pard"):
        kinds.get("medusa")
