"""Prefill/decode disaggregation at the runtime level: a prefill runtime exports each request's
prompt KV, first token and method seed; a second runtime (its own caches) checks the payload on
arrival and decodes from it; greedy output is token-identical to one process for every method the
runtime runs (plain, n-gram, draft model, EAGLE, EAGLE-3, trees, Medusa, DFlash, DSpark, MTP, multi-layer
EAGLE, frozen-KV MTP); seeded sampling continues identically;
corrupted, truncated and mismatched payloads are refused with a clear error; bytes per part match the
arithmetic of tools/bench_disagg.py."""
from __future__ import annotations

import copy

import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.eagle.drafter import EagleDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.runtime import disagg
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, naive_greedy, random_head, tiny_target

PROMPTS = [[5, 6, 7], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8], [3, 3, 3, 20, 21, 22, 23, 40], [11]]
METHODS = ["none", "ngram", "draft_model", "eagle", "eagle3", "eagle3_tree", "medusa", "dflash", "dspark", "mtp",
           "multi_layer_eagle", "frozen_kv_mtp"]


def _clone(model):
    m = copy.deepcopy(model)
    m.max_batch_size = m.max_seq_len = 0
    return m.use_cpu_fast()


def _drafter(method, target, seed=3):
    if method == "none":
        return None
    if method == "ngram":
        return NgramDrafter(1, 3)
    if method == "draft_model":
        return DraftModelDrafter(perturbed_copy(target, 0.02, seed), target.config.vocab_size)
    if method == "medusa":
        from tests.methods.test_medusa import random_heads

        from specc.methods.medusa.drafter import MedusaDrafter
        return MedusaDrafter(random_heads(target, 3, 1, seed=seed), target.config.num_layers, target.norm)
    if method in ("mtp", "multi_layer_eagle", "frozen_kv_mtp"):
        from tests.mtp_family_support import drafter_for, random_model
        return drafter_for(method, random_model(method, target, draft_vocab=64, seed=seed), target, 3)
    if method in ("dflash", "dspark"):
        from specc.methods.dflash.drafter import BlockDrafter
        from specc.methods.dflash.model import random_block_drafter
        return BlockDrafter(random_block_drafter(target, kind=method, block_size=4, markov_rank=4 if method == "dspark"
                                                 else 0, markov_head_type="vanilla" if method == "dspark" else None,
                                                 confidence_head=method == "dspark", seed=seed))
    kind = "eagle3" if method.startswith("eagle3") else method
    head = random_head(kind, target, seed=seed, draft_vocab=64 if kind == "eagle3" else None)
    return EagleDrafter(head, target.config.num_layers, target.norm)


def _runtime(method, target, drafter, rule="greedy"):
    k = 0 if method == "none" else 3
    if method == "eagle3_tree":  # a dynamic tree: topk 2, 6 verified nodes
        specs = [StateSpec(f"b{b}_k3_topk2_w6_{rule}_tree", "eagle3", b, 3, topk=2, num_draft_tokens=6,
                           verify_rule=rule) for b in (1, 4)]
    else:
        par = method in ("medusa", "dflash", "dspark")
        specs = [StateSpec(f"b{b}_k{k}_{rule}", method, b, k, num_draft_tokens=k + 1 if k else 0, verify_rule=rule,
                           parallel=par) for b in (1, 4)]
    return Runtime(target, None, drafter, specs, max_model_len=96, eos_token_ids=[])


def _pair(method, rule="greedy"):
    """(prefill runtime, decode runtime): the same weights, separate models and caches."""
    target = tiny_target(seed=1)
    drafter = _drafter(method, target)
    other_target = _clone(target)
    if method == "draft_model":
        other = DraftModelDrafter(_clone(drafter.model), other_target.config.vocab_size)
    else:
        other = _drafter(method, other_target)
    return _runtime(method, target, drafter, rule), _runtime(method, other_target, other, rule)


def _reqs(n_new=12, **kw):
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n_new, **kw)) for p in PROMPTS]


def _prefill(rt, reqs):
    """Prefill-only pass: the payloads' wire bytes, in request order."""
    rt.reset(4)
    handles = [rt.submit(r, prefill_only=True) for r in reqs]
    blobs = {}
    while rt.has_work():
        for ev in rt.step():
            if ev.output is not None:
                assert ev.output.finish_reason == "prefilled"
                blobs[ev.handle] = disagg.encode_payload(ev.payload)
    return [blobs[h] for h in handles]


def _decode(rt, reqs, blobs):
    rt.reset(4)
    handles = [rt.submit(r, prefilled=disagg.decode_payload(b, rt, r.prompt_ids, r.adapter))
               for r, b in zip(reqs, blobs)]
    outs = {}
    while rt.has_work():
        for ev in rt.step():
            if ev.output is not None:
                outs[ev.handle] = ev.output
    return [outs[h] for h in handles]


@pytest.mark.parametrize("method", METHODS)
def test_disaggregated_greedy_equals_one_process(method):
    pre, dec = _pair(method)
    reqs = _reqs()
    one = [o.token_ids for o in _runtime(method, pre.target, pre.drafter).generate(reqs, batch_size=4)]
    assert one == [naive_greedy(pre.target, p, 12) for p in PROMPTS]
    blobs = _prefill(pre, reqs)
    outs = _decode(dec, reqs, blobs)
    assert [o.token_ids for o in outs] == one
    if method != "none":  # it speculated from its first decode step
        assert dec.metrics.num_drafts > 0
    sizes = disagg.decode_payload(blobs[1], dec, PROMPTS[1]).nbytes()
    c = dec.target.config
    assert sizes["kv"] == 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4 * len(PROMPTS[1])
    if method.startswith("eagle") or method == "mtp":  # draft KV (1 layer) + hidden state + top-1 prob/index + position
        head = dec.drafter.model.cfg
        draft_kv = 2 * head.num_key_value_heads * head.head_dim * 4 * len(PROMPTS[1])
        assert sizes["seed"] == draft_kv + head.hidden_size * 4 + 4 + 8 + 8
    elif method == "multi_layer_eagle":  # every module's KV, module 0's hidden, the prompt's features, positions
        head, n, P = dec.drafter.model.cfg, dec.drafter.num_modules, len(PROMPTS[1])
        draft_kv = n * 2 * head.num_key_value_heads * head.head_dim * 4 * P
        assert sizes["seed"] == draft_kv + head.hidden_size * 4 + min(P, dec.drafter.ring) * head.hidden_size * 4 \
            + 8 * n + 8 + 4 + 8
    elif method == "frozen_kv_mtp":  # no draft KV: the target's hidden state, its position, the first draft's top-1
        assert sizes["seed"] == c.hidden_size * 4 + 8 + 4 + 8
    elif method in ("medusa", "dflash", "dspark"):  # the target's hidden states at the drafter's layers
        layers = len(dec.ctx.hidden_layers)
        assert layers >= 1 and sizes["seed"] == layers * len(PROMPTS[1]) * c.hidden_size * 4
    else:
        assert sizes["seed"] == 0


def test_seeded_sampling_continues_identically():
    pre, dec = _pair("draft_model", rule="standard")
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=10, temperature=0.8, top_k=20, seed=100 + i))
            for i, p in enumerate(PROMPTS)]
    one = [o.token_ids for o in _runtime("draft_model", pre.target, pre.drafter, "standard").generate(reqs, 4)]
    outs = _decode(dec, reqs, _prefill(pre, reqs))
    assert [o.token_ids for o in outs] == one


def test_bad_payloads_are_refused_with_a_clear_error():
    pre, dec = _pair("eagle3")
    reqs = _reqs()
    blob = _prefill(pre, reqs[:1])[0]
    ok = disagg.decode_payload(blob, dec, PROMPTS[0])
    assert ok.first_token == naive_greedy(pre.target, PROMPTS[0], 1)[0]
    cases = {
        "truncated": (blob[: len(blob) // 2], "not a readable safetensors"),
        "corrupted": (blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]), "sha256"),
        "empty": (b"", "not a readable safetensors"),
    }
    for name, (data, msg) in cases.items():
        with pytest.raises(disagg.PayloadError, match=msg):
            disagg.decode_payload(data, dec, PROMPTS[0])
    with pytest.raises(disagg.PayloadError, match="prompt"):
        disagg.decode_payload(blob, dec, PROMPTS[1])
    with pytest.raises(disagg.PayloadError, match="adapter"):
        disagg.decode_payload(blob, dec, PROMPTS[0], adapter="chat")
    # made for another model: a decode runtime over different weights
    stranger = _runtime("eagle3", tiny_target(seed=9), _drafter("eagle3", tiny_target(seed=9)))
    with pytest.raises(disagg.PayloadError, match="another target model"):
        disagg.decode_payload(blob, stranger, PROMPTS[0])
    # made for another plan (method), or another wire version
    p = disagg.decode_payload(blob, dec, PROMPTS[0])
    p.meta["method"] = "eagle"
    with pytest.raises(disagg.PayloadError, match="another method"):
        disagg.decode_payload(disagg.encode_payload(p), dec, PROMPTS[0])
    p = disagg.decode_payload(blob, dec, PROMPTS[0])
    p.meta["runtime_hash"] = "0" * 16
    with pytest.raises(disagg.PayloadError, match="another plan"):
        disagg.decode_payload(disagg.encode_payload(p), dec, PROMPTS[0])
    from safetensors.torch import load, save
    meta = disagg._metadata(blob)
    tensors = load(blob)
    with pytest.raises(disagg.PayloadError, match="version"):
        disagg.decode_payload(save(tensors, metadata=dict(meta, version="99")), dec, PROMPTS[0])
    # wrong shapes / dtypes with a consistent checksum (a different producer, not transfer damage)
    bad = dict(tensors)
    bad["kv.0.k"] = bad["kv.0.k"][:, :2].contiguous()
    with pytest.raises(disagg.PayloadError, match="kv.0.k"):
        disagg.decode_payload(save(bad, metadata=dict(meta, sha256=disagg._digest(bad))), dec, PROMPTS[0])
    bad = dict(tensors)
    bad["seed.hidden"] = bad["seed.hidden"].double()
    with pytest.raises(disagg.PayloadError, match="hidden"):
        disagg.decode_payload(save(bad, metadata=dict(meta, sha256=disagg._digest(bad))), dec, PROMPTS[0])


def test_bad_target_hidden_seeds_are_refused():
    """A ``target_hidden`` seed (DFlash here) of the wrong shape, dtype, layer count or with NaNs is
    refused on arrival, naming the tensor."""
    from safetensors.torch import load, save

    pre, dec = _pair("dflash")
    blob = _prefill(pre, _reqs()[:1])[0]
    assert disagg.decode_payload(blob, dec, PROMPTS[0]).seed  # the good one passes
    meta, tensors = disagg._metadata(blob), load(blob)

    def refused(bad, msg):
        with pytest.raises(disagg.PayloadError, match=msg):
            disagg.decode_payload(save(bad, metadata=dict(meta, sha256=disagg._digest(bad))), dec, PROMPTS[0])

    refused(dict(tensors, **{"seed.hidden.0": tensors["seed.hidden.0"][:1].contiguous()}), "seed.hidden.0")
    refused(dict(tensors, **{"seed.hidden.0": tensors["seed.hidden.0"].double()}), "seed.hidden.0")
    nan = tensors["seed.hidden.0"].clone()
    nan[0, 0] = float("nan")
    refused(dict(tensors, **{"seed.hidden.0": nan}), "finite")
    refused({k: v for k, v in tensors.items() if k != "seed.hidden.0"}, "seed.hidden.0 is missing")
    refused(dict(tensors, **{"seed.hidden.99": tensors["seed.hidden.0"].clone()}), "seed tensors")


def test_a_payload_that_fails_to_install_fails_its_request_alone():
    pre, dec = _pair("eagle")
    reqs = _reqs()
    blobs = _prefill(pre, reqs)
    payloads = [disagg.decode_payload(b, dec, r.prompt_ids) for r, b in zip(reqs, blobs)]
    payloads[2].seed["topk_index"] = payloads[2].seed["topk_index"] + 1  # inconsistent with the hidden state
    dec.reset(4, isolate_failures=True)
    handles = [dec.submit(r, prefilled=p) for r, p in zip(reqs, payloads)]
    outs = {}
    while dec.has_work():
        for ev in dec.step():
            if ev.output is not None:
                outs[ev.handle] = ev.output
    assert outs[handles[2]].finish_reason == "error" and "top-1" in outs[handles[2]].error
    for i in (0, 1, 3, 4):
        assert outs[handles[i]].token_ids == naive_greedy(pre.target, PROMPTS[i], 12)
