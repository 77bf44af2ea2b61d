"""Parallel drafting in the runtime: DFlash, DSpark (Markov heads vanilla / gated / rnn, confidence
head), PARD and P-EAGLE.

* Greedy output equals plain greedy decoding token for token for every parallel method at
  γ ∈ {2, 4, 7}, batch 1 and 4, with mixed prompt lengths (a 1-token prompt, a request whose
  max_new_tokens < γ + 1), under the greedy, standard and block rules.
* Drafts that a trained draft gets right are accepted through the runtime: a DFlash and a DSpark
  draft fitted (by ``specc train``'s loop) to the test prompts' greedy continuations reach a high τ,
  which needs the runtime's context positions to match the training layout.
* The published-layout loader: round trip, and the clear errors (mask id outside the vocabulary,
  target layer ids out of range, hidden size mismatch, the other kind, a missing tensor, a bad Markov
  head); PARD / P-EAGLE refused for a checkpoint without a mask token.
"""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

from specc.methods.dflash.drafter import BlockDrafter
from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.eagle.drafter import EagleDrafter
from specc.errors import CheckpointError
from specc.methods.dflash.model import load_block_drafter, random_block_drafter, save_block_drafter
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39)),
           [40, 41, 42, 43, 44]]
MAX_NEW = [14, 2, 24, 17, 30]  # 2 < γ + 1 for every γ here
GAMMAS = [2, 4, 7]
MASK = 63


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=0, vocab_size=64, num_layers=2)


@pytest.fixture(scope="module")
def reference(target):
    return [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_NEW)]


def _requests():
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n), request_id=f"r{i}")
            for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]


def _runtime(target, drafter, method, k, rule="greedy", sampling="greedy"):
    specs = [StateSpec(f"b{b}_k{k}_{rule}_parallel", method, b, k, num_draft_tokens=k + 1, verify_rule=rule,
                       draft_sampling=sampling, parallel=True) for b in (1, 4)]
    return Runtime(target, None, drafter, specs, max_model_len=128, eos_token_ids=[])


def _train(target, steps=260):
    return _trained_impl(target, steps)


@pytest.fixture(scope="module")
def trained(target):
    return _trained_impl(target, 300)


def _trained_impl(target, steps):
    """DFlash and DSpark drafts fitted to the greedy continuations of PROMPTS by ``specc train``'s loop
    (:func:`specc.train.fit.fit`, online target features) on a tiny random target: the same code path
    as the shipped drafters' training. Returns ``{kind: model read back from its published layout}``."""
    import argparse
    import tempfile

    import numpy as np

    from specc.train import fit as FIT, kinds as K, recipe as R
    from specc.train.shards import TokenSet

    target.requires_grad_(False)
    seqs = [np.asarray(p + reference_greedy(target, p, 40), dtype=np.int64) for p in PROMPTS]
    meta = [{"id": f"p{i}", "category": "test", "source": "test", "finished": False, "kind": "distill", "shard": "s"}
            for i in range(len(PROMPTS))]
    # every sequence twice: validation (every val_every-th distilled one: the first) then holds a copy
    tokens = TokenSet(seqs + seqs, [len(p) for p in PROMPTS] * 2, meta + [dict(m, id=m["id"] + "b") for m in meta])
    out = {}
    tmp = pathlib.Path(tempfile.mkdtemp())
    for kind in ("dflash", "dspark"):
        opts = {"gamma": 7, "target_layer_ids": [0, 1], "mask_token_id": MASK, "anchors": 8, "context": 64}
        if kind == "dspark":
            opts["markov_rank"] = 16
        fit = R.FitRecipe(name=f"t_{kind}", kind=kind, data="t", out=str(tmp / kind), lr=1e-2, batch=5,
                          epochs=10 ** 6, max_steps=steps, time_budget_min=30, val_every=10 ** 6, threads=1,
                          amp="none", eval_tokens=10 ** 12, options=K.get(kind).check_options(opts, "test"))
        args = argparse.Namespace(device="cpu", threads=1, out=None, init_from=None, time_budget_min=None)
        d = FIT.fit(fit, None, args, target=target, data_recipe=R.DataRecipe(name="t", target="tiny",
                                                                             prompt_dir=str(tmp / "prompts")),
                    tokens=tokens)
        out[kind] = K.get(kind).load(d, target)
    return out


@pytest.mark.parametrize("k", GAMMAS)
@pytest.mark.parametrize("kind,markov", [("dflash", None), ("dspark", "vanilla"), ("dspark", "gated"), ("dspark", "rnn")])
def test_random_block_drafts_greedy_exact(target, reference, kind, markov, k):
    model = random_block_drafter(target, kind=kind, block_size=8, mask_token_id=MASK, markov_rank=8 if markov else 0,
                                 markov_head_type=markov, confidence_head=kind == "dspark", seed=k)
    drafter = BlockDrafter(model)
    for rule in ("greedy", "standard", "block"):
        rt = _runtime(target, drafter, kind, k, rule)
        for bs in (1, 4):
            out = rt.generate(_requests(), batch_size=bs)
            assert [o.token_ids for o in out] == reference, (rule, bs)
        assert rt.metrics.num_drafts > 0


@pytest.mark.parametrize("k", GAMMAS)
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_trained_block_drafts_accepted_and_exact(target, reference, trained, kind, k, tmp_path):
    """A draft fitted to these prompts' continuations is accepted often (the runtime's context KV,
    positions and mask match training), greedy output stays exact, and a save/load round trip in the
    published layout drafts the same tokens."""
    from specc.train.kinds import get

    directory = tmp_path / kind
    model = trained[kind]
    get(kind).save(model, directory, target)
    loaded = load_block_drafter(directory, target, expect_kind=kind)
    for m in (model, loaded):
        drafter = BlockDrafter(m)
        for rule in ("greedy", "block"):
            rt = _runtime(target, drafter, kind, k, rule)
            for bs in (1, 4):
                out = rt.generate(_requests(), batch_size=bs)
                assert [o.token_ids for o in out] == reference
            pos = rt.metrics.num_accepted_tokens_per_pos
            assert rt.metrics.tau > 1 + 0.5 * k, (rt.metrics.tau, pos)  # most drafts accepted
            assert pos[k - 1] > 0  # the last block position too


def test_markov_head_and_confidence_head(target, trained):
    """The trained DSpark's Markov head moves the logits it drafts from (no second transformer pass:
    the base logits are the same), and its confidence head gives probabilities in [0, 1] that are not
    the draft's top probability."""
    from specc.methods.base import DraftSampling

    model = trained["dspark"]
    with_m, without = BlockDrafter(model), BlockDrafter(model, use_markov=False, use_confidence_head=False)
    rt = _runtime(target, with_m, "dspark", 7)
    rt.generate(_requests()[:2], batch_size=4)
    from dataclasses import replace

    view = rt.batch.view(2, torch.zeros(2, dtype=torch.int64), rt.trash_slot)
    batch = replace(view, active=torch.ones(2, dtype=torch.bool), seq_lens=torch.tensor([6, 9]))
    without.cache = with_m.cache  # same model, same context
    a = with_m.propose_block(batch, 7, DraftSampling())
    base_a = with_m.last_base_logits.clone()
    b = without.propose_block(batch, 7, DraftSampling())
    assert torch.equal(base_a, without.last_base_logits)
    assert ((a.confidence >= 0) & (a.confidence <= 1)).all()
    assert not torch.allclose(a.confidence, b.confidence)
    assert model.markov.w2.weight.abs().sum() > 0  # the head was trained (it starts at zero)
    assert model.confidence.calibration.shape == (7, 2)


@pytest.mark.parametrize("k", GAMMAS)
def test_pard_greedy_exact(target, reference, k):
    draft = perturbed_copy(target, noise=0.02, seed=1)
    drafter = DraftModelDrafter(draft, 64, mask_token_id=MASK)
    for rule in ("greedy", "standard", "block"):
        rt = _runtime(target, drafter, "draft_model", k, rule)
        for bs in (1, 4):
            out = rt.generate(_requests(), batch_size=bs)
            assert [o.token_ids for o in out] == reference
        assert rt.metrics.num_accepted_tokens > 0  # the close draft's first block position is accepted


@pytest.mark.parametrize("k", GAMMAS)
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_p_eagle_greedy_exact(kind, k):
    from tests.test_eagle_support import V, naive_greedy, random_head, tiny_target

    tt = tiny_target(seed=3)
    head = random_head(kind, tt, seed=13, draft_vocab=64)
    drafter = EagleDrafter(head, tt.config.num_layers, tt.norm, mask_token_id=V - 1)
    g = torch.Generator().manual_seed(k)
    prompts = [torch.randint(0, V, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(5)]
    specs = [StateSpec(f"b{b}_k{k}", kind, b, k, num_draft_tokens=k + 1, verify_rule="greedy", parallel=True)
             for b in (1, 4)]
    rt = Runtime(tt, None, drafter, specs, max_model_len=128, eos_token_ids=[])
    for bs in (1, 4):
        out = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=14)) for p in prompts], batch_size=bs)
        assert [o.token_ids for o in out] == [naive_greedy(tt, p, 14) for p in prompts]


def test_parallel_drafting_refused_without_mask_token(target, tmp_path):
    """PARD and P-EAGLE need a draft trained for parallel drafting: a checkpoint without a mask token
    is refused at load with a message naming the keys and the fix."""
    from specc.methods.draft_model import drafter as draft_model
    from specc.methods.eagle import drafter as eagle

    draft = perturbed_copy(target, noise=0.02, seed=1)
    with pytest.raises(CheckpointError, match="mask token"):
        DraftModelDrafter(draft, 64).propose_block(None, 2, None)
    ck = tmp_path / "no_mask"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 64}))
    with pytest.raises(CheckpointError, match="pard_token"):
        draft_model.parallel_mask_token(str(ck), "hf", "PARD")
    ck2 = tmp_path / "with_mask"
    ck2.mkdir()
    (ck2 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 64,
                                                 "pard_token": 7}))
    assert draft_model.parallel_mask_token(str(ck2), "hf", "PARD") == 7
    assert eagle.EagleDrafter.propose_block.__doc__ and "P-EAGLE" in eagle.EagleDrafter.propose_block.__doc__


# ----------------------------------------------------------------------------------- the loader
def _saved(target, tmp_path, **kw) -> pathlib.Path:
    model = random_block_drafter(target, mask_token_id=MASK, **kw)
    return save_block_drafter(model, tmp_path / "draft", target_config=target.config)


def _edit(directory: pathlib.Path, fn) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    fn(cfg)
    (directory / "config.json").write_text(json.dumps(cfg))


def test_loader_round_trip(target, tmp_path):
    d = _saved(target, tmp_path, kind="dspark", markov_rank=4, markov_head_type="rnn", confidence_head=True)
    m = load_block_drafter(d, target, expect_kind="dspark")
    assert m.cfg.markov_head_type == "rnn" and m.cfg.confidence_head and m.cfg.gamma == 7
    ref = random_block_drafter(target, kind="dspark", mask_token_id=MASK, markov_rank=4, markov_head_type="rnn",
                               confidence_head=True)
    for (n, a), (_, b) in zip(sorted(ref.state_dict().items()), sorted(m.state_dict().items())):
        assert torch.allclose(a, b), n


@pytest.mark.parametrize("edit,match", [
    (lambda c: c["dflash_config"].update(mask_token_id=64), r"mask_token_id=64 is outside the target's vocabulary"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 5]), r"ids \[5\] outside the target's layers 0\.\.1"),
    (lambda c: c.update(hidden_size=48), r"hidden_size=48 but the target's hidden size is 32"),
    (lambda c: c["dflash_config"].pop("target_layer_ids"), r"lacks 'target_layer_ids'"),
    (lambda c: c.update(vocab_size=100), r"vocab_size=100"),
])
def test_loader_errors_are_clear(target, tmp_path, edit, match):
    d = _saved(target, tmp_path)
    _edit(d, edit)
    with pytest.raises(CheckpointError, match=match):
        load_block_drafter(d, target)


def test_loader_refuses_the_other_kind_and_bad_heads(target, tmp_path):
    d = _saved(target, tmp_path, kind="dspark", markov_rank=4)
    with pytest.raises(CheckpointError, match="set method.name: dspark"):
        load_block_drafter(d, target, expect_kind="dflash")
    _edit(d, lambda c: c["dspark_config"].update(markov_head_type="lstm"))
    with pytest.raises(CheckpointError, match="markov_head_type='lstm'"):
        load_block_drafter(d, target)
    _edit(d, lambda c: c["dspark_config"].update(markov_head_type="vanilla", markov_rank=-1))
    with pytest.raises(CheckpointError, match="markov_rank=-1"):
        load_block_drafter(d, target)
    d2 = _saved(target, tmp_path / "x")
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d2 / "model.safetensors"))
    sd.pop("fc.weight")
    save_file(sd, str(d2 / "model.safetensors"))
    with pytest.raises(CheckpointError, match="'fc.weight' is missing"):
        load_block_drafter(d2, target)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_block_drafter(tmp_path / "nope", target)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_block_clipped_by_max_model_len_inside_the_block(target, trained, kind):
    """A request whose max_model_len falls inside a γ = 7 block: the block is cut there, the output
    equals plain greedy decoding up to the limit, and the cache slack (κ + 2 slots) is never overrun."""
    drafter = BlockDrafter(trained[kind])
    spec = StateSpec("b2_k7_greedy_parallel", kind, 2, 7, num_draft_tokens=8, parallel=True)
    rt = Runtime(target, None, drafter, [spec], max_model_len=24, eos_token_ids=[])
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=100)) for p in (PROMPTS[2], PROMPTS[4])]
    out = rt.generate(reqs, batch_size=2)
    for r, o in zip(reqs, out):
        assert o.finish_reason == "max_model_len"
        assert o.token_ids == reference_greedy(target, r.prompt_ids, 100, max_model_len=24)
