"""The MTP-family drafter kinds through the training tool (``specc train fit``) on a tiny random target:
each trains, saves in its published layout, reads back through the runtime's loader and scores on
validation as it did; and each kind's training unroll computes what its runtime drafter computes
(MTP: the training-time-test chain against the drafter's extend and recurrent passes; multi-layer
EAGLE: each module's KV after decode steps against the module over the committed history; frozen-KV
MTP: the assistant over K/V recomputed from the recorded layer input against the target's own cache)."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from specc.methods.base import BatchView, PrefillChunk
from specc.train import data as D
from specc.train import fit as FIT, kinds as K

from tests.mtp_family_support import drafter_for, random_model
from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, naive_greedy, tiny_target
from tests.train.test_train_pipeline import _distilled, _recipes, _validation


@pytest.mark.parametrize("kind,options", [("mtp", {"ttt_steps": 3, "draft_vocab": 48}),
                                          ("multi_layer_eagle", {"num_modules": 3, "draft_vocab": None}),
                                          ("frozen_kv_mtp", {"ttt_steps": 2, "draft_vocab": 48, "prompt_labels": True})])
def test_kind_trains_saves_and_reloads_in_the_published_layout(tmp_path, kind, options):
    target = tiny_target(seed=5)
    data_recipe, fit = _recipes(tmp_path, kind, **options)
    fit.parts = ["round1"]
    cache = _distilled(tmp_path, target, data_recipe, options=fit.options)
    args = argparse.Namespace(device="cpu", threads=1, out=None, init_from=None, time_budget_min=None)
    out = FIT.fit(fit, cache, args, target=target, data_recipe=data_recipe)
    rec = json.loads((out / "training.json").read_text())
    assert rec["steps"] == 2 * 4 and rec["curve"]["loss"][-1] < rec["curve"]["loss"][0]
    assert len(rec["validation"][-1]["all"]) == K.get(kind).unroll_steps(fit.options)
    L = target.config.num_layers
    assert rec["layers"] == ([L - 2, L] if kind == "frozen_kv_mtp" else [L])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["specc_kind"] == kind and cfg["vocab_size"] == V
    model = K.get(kind).load(out, target)  # the runtime's loader
    assert model.cfg.draft_vocab_size == (options["draft_vocab"] or V)
    K.get(kind).adopt(model, target, fit.options)
    val = _validation(fit, data_recipe, target, rec["layers"])
    again = FIT.evaluate(K.get(kind), model, val, fit.options, 4, torch.device("cpu"))
    assert again["positions"] == rec["validation"][-1]["positions"]
    for a, b in zip(again["all"], rec["validation"][-1]["all"]):
        assert abs(a - b) <= 0.05  # fp16 weights
    assert "## Training" in (out / "TRAINING.md").read_text()


def test_kind_options_are_checked():
    from specc.errors import SpeccError

    with pytest.raises(SpeccError, match="options.num_modules=0"):
        K.get("multi_layer_eagle").check_options({"num_modules": 0}, "r.yaml")
    with pytest.raises(SpeccError, match="unknown option"):
        K.get("frozen_kv_mtp").check_options({"num_modules": 2}, "r.yaml")
    with pytest.raises(SpeccError, match="options.prompt_labels"):
        K.get("mtp").check_options({"prompt_labels": "yes"}, "r.yaml")


# ------------------------------------------------------------------------------- training == runtime
def _sequence(target, n=24, seed=0):
    """A sequence and the target's hidden states over it: ``(tokens [n+1], {layer: [n, H]})``."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, V, (n + 1,), generator=g)
    L = target.config.num_layers
    target.setup_cache(1, 64)
    with torch.inference_mode():
        _, hid = target(toks[None, :n], torch.arange(n)[None], hidden_layers=(L - 2, L - 1))
    return toks, {L - 2: hid[0][0], L: target.norm(hid[1][0])}


def _prefill(drafter, target, toks, P):
    """The drafter's prefill of prompt ``toks[:P]`` with ``toks[P]`` as the first generated token
    (the target's cache row 0 filled over the prompt)."""
    L = target.config.num_layers
    target.setup_cache(1, 64)
    with torch.inference_mode():
        _, hid = target(toks[None, :P], torch.arange(P)[None], hidden_layers=(L - 1,))
    drafter.setup(1, 64, torch.device("cpu"))
    view = BatchView(tokens=toks[None].clone(), seq_lens=torch.tensor([P + 1]), active=torch.tensor([True]),
                     prompt_lens=torch.tensor([P]), max_draft=torch.tensor([3]), temperature=torch.zeros(1),
                     top_p=torch.ones(1), top_k=torch.zeros(1, dtype=torch.long), trash_slot=63)
    pos = torch.arange(P)[None]
    drafter.prefill(view, PrefillChunk(input_ids=toks[None, :P], positions=pos, cache_slots=pos.clone(),
                                       rows=torch.tensor([True]), target_hidden=list(hid)))
    return view


def test_mtp_unroll_is_the_drafters_extend_and_recurrent_passes():
    from specc.methods.mtp.recipe import mtp_unroll

    target = tiny_target(seed=6)
    model = random_model("mtp", target, seed=3)
    toks, feats = _sequence(target)
    L, p = target.config.num_layers, 15
    with torch.no_grad():
        outs = mtp_unroll(model, toks[None], feats[L][None].float(), 3, torch.tensor([[p]]))
    drafter = drafter_for("mtp", model, target)
    _prefill(drafter, target, toks, p + 1)  # pairs 0..p: the extend over the prompt
    g = drafter.g_last[:1].view(1, 1, -1)
    assert torch.allclose(g[0, 0], outs[0][0, 0], atol=1e-4)
    with torch.inference_mode():  # the recurrent passes, fed the sequence's own tokens
        for k in (1, 2):
            pos = torch.tensor([[p + k]])
            g = drafter.model(toks[p + k + 1].view(1, 1), g, pos, cache=drafter.cache, cache_slots=pos, from_target=False)
            assert torch.allclose(g[0, 0], outs[k][0, 0], atol=1e-4), k


def test_multi_layer_module_caches_equal_the_modules_over_the_committed_history():
    """After decode steps (drafts accepted and rejected), each module's KV at its final positions is
    the module's own pass over the committed history (target hidden at j, token at j + k + 1): what
    the training unroll computes."""
    from specc.methods.eagle.model import DraftKVCache
    from specc.runtime.engine import Runtime
    from specc.runtime.request import Request, SamplingParams
    from specc.runtime.state import StateSpec

    target = tiny_target(seed=7)
    model = random_model("multi_layer_eagle", target, seed=4, scale=0.3)
    drafter = drafter_for("multi_layer_eagle", model, target, 3)
    rt = Runtime(target, None, drafter, [StateSpec("b1_k3", "multi_layer_eagle", 1, 3, num_draft_tokens=4)],
                 max_model_len=96, eos_token_ids=[])
    prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    out = rt.generate([Request(prompt_ids=prompt, params=SamplingParams(max_new_tokens=20))], batch_size=1)[0]
    assert out.token_ids == naive_greedy(target, prompt, 20)
    hist = torch.tensor(prompt + out.token_ids)
    n = len(hist) - 1  # committed positions with a hidden state (the last token was never verified)
    L = target.config.num_layers
    target.setup_cache(1, 128)
    with torch.inference_mode():
        _, hid = target(hist[None, :n], torch.arange(n)[None], hidden_layers=(L - 1,))
        feats = target.norm(hid[0])
        for k in range(3):
            ref = DraftKVCache(1, 2, 128, model.cfg.head_dim)
            idx = (torch.arange(n) + k + 1).clamp(max=n)
            model.module(k, hist[idx][None], feats, torch.arange(n)[None], cache=ref)
            final = int(drafter.final[k, 0]) if k else int(drafter.last_pos[0])
            assert final >= n - 1 - k - 1
            assert torch.allclose(drafter.caches[k].k[0, :, : final + 1], ref.k[0, :, : final + 1], atol=1e-4), k
            assert torch.allclose(drafter.caches[k].v[0, :, : final + 1], ref.v[0, :, : final + 1], atol=1e-4), k


def test_frozen_unroll_is_the_assistant_over_the_targets_cache():
    from specc.methods.mtp.recipe import FrozenKVMTPKind, frozen_unroll

    target = tiny_target(seed=8)
    toks, feats = _sequence(target)
    n = toks.shape[0] - 1
    L, p = target.config.num_layers, 14
    labels = torch.full((n,), -1)
    labels[5:] = toks[6:]
    data = D.SeqSet(toks, labels, torch.tensor([0, n]), torch.tensor([6]),
                    {k: v.half() for k, v in feats.items()}, [{}])
    kind = FrozenKVMTPKind()
    opts = kind.check_options({"draft_vocab": None}, "t")
    model, _ = kind.build(target, opts, data, [0])
    with torch.no_grad():  # a trained-looking assistant: random weights, attention on
        for name, prm in model.named_parameters():
            prm.add_(0.2 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(len(name))))
    model.eval()
    batch = kind.collate(model, data, [0], opts, torch.device("cpu"))
    with torch.no_grad():
        outs = frozen_unroll(model, batch["tokens"], batch["feats"][L], batch["keys"], batch["values"], 2,
                             torch.tensor([[p]]))
    drafter = drafter_for("frozen_kv_mtp", model, target)
    _prefill(drafter, target, toks, p + 1)  # the target wrote slots 0..p; no drafter forward
    assert drafter.forward_passes == 0 and int(drafter.last_pos[0]) == p
    attn = target.layers[model.cfg.kv_layer].attn
    hidden = drafter.h_last[:1].view(1, 1, -1)
    with torch.inference_mode():
        for k in range(2):  # every step at position p over the target's own cache
            hidden = model(toks[p + k + 1].view(1, 1), hidden, torch.tensor([[p]]),
                           attn.k_cache[:1, :, : p + 1], attn.v_cache[:1, :, : p + 1])
            assert torch.allclose(hidden[0, 0], outs[k][0, 0], atol=5e-2, rtol=5e-2), k  # fp16 training features


# ------------------------------------------------------------------------------- warm start
class _Sample:
    """The two things ``warm_start`` reads of a validation SeqSet: ``feats`` keys and ``seq(i)``."""

    def __init__(self, seqs):
        self.seqs = seqs
        self.feats = seqs[0][1]

    def __len__(self):
        return len(self.seqs)

    def seq(self, i):
        toks, feats = self.seqs[i]
        return toks, None, feats


@pytest.mark.parametrize("kind,layers", [("mtp", 1), ("multi_layer_eagle", 3)])
def test_warm_start_from_an_eagle_head_keeps_its_predictions(tmp_path, kind, layers):
    """Every MTP layer warm-started from an EAGLE (v1) head holds the head's block, and its step-0 argmax
    agrees with the head's on most positions (chance is 1/V; the mapping differs from the head only by the norms' scale
    estimates; the head's fc bias is zeroed here, as the mapping drops it)."""
    from specc.methods.eagle.loader import load_eagle_head, save_eagle_head
    from specc.methods.mtp.model import MTPModel
    from tests.test_eagle_support import random_head
    from tests.mtp_family_support import mtp_config

    target = tiny_target(seed=5)
    head = random_head("eagle", target, seed=3)
    with torch.no_grad():
        head.fc.bias.zero_()
    save_eagle_head(head, tmp_path / "eagle", target_config=target.config)
    head = load_eagle_head(tmp_path / "eagle", target.config, target.embed, target.lm_head)  # fp16 round trip
    seqs = [_sequence(target, n=24, seed=s) for s in range(4)]
    model = MTPModel(mtp_config(target, kind, layers), target.embed, target.lm_head, lambda: target.output.weight)
    facts = K.get(kind).warm_start(model, target, {"warm_start": str(tmp_path / "eagle")}, _Sample(seqs))
    assert set(facts["warm_start"]["scales"]) == {"embedding", "hidden", "x", "head_output"}
    L = target.config.num_layers
    agree, total = 0, 0
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            torch.testing.assert_close(layer.self_attn.q_proj.weight, head.layer.self_attn.q_proj.weight.float())
            torch.testing.assert_close(layer.mlp.down_proj.weight, head.layer.mlp.down_proj.weight.float())
            for toks, feats in seqs:
                n = feats[L].shape[0]
                pos = torch.arange(n)[None]
                want = head.draft_logits(head(toks[None, 1:], feats[L][None], pos)).argmax(-1)
                got = model.draft_logits(model(toks[None, 1:], feats[L][None], pos, layer=i)).argmax(-1)
                agree += int((want == got).sum())
                total += n
    assert agree / total >= 0.6, agree / total  # chance: 1 / 96


def test_warm_start_refuses_a_head_of_another_kind(tmp_path):
    from specc.errors import SpeccError
    from specc.methods.eagle.loader import save_eagle_head
    from specc.methods.mtp.model import MTPModel
    from tests.test_eagle_support import random_head
    from tests.mtp_family_support import mtp_config

    target = tiny_target(seed=5)
    save_eagle_head(random_head("eagle3", target, seed=3, draft_vocab=48), tmp_path / "e3", target_config=target.config)
    model = MTPModel(mtp_config(target, "mtp", 1), target.embed, target.lm_head, lambda: target.output.weight)
    with pytest.raises(SpeccError, match="options.warm_start"):
        K.get("mtp").warm_start(model, target, {"warm_start": str(tmp_path / "e3")}, _Sample([_sequence(target)]))
    with pytest.raises(SpeccError, match="options.warm_start"):
        K.get("mtp").check_options({"warm_start": 3}, "r.yaml")
    with pytest.raises(SpeccError, match="unknown option"):
        K.get("frozen_kv_mtp").check_options({"warm_start": "x"}, "r.yaml")
