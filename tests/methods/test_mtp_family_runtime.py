"""MTP, multi-layer EAGLE and frozen-KV MTP in the runtime, on small random targets: greedy output
equals plain greedy decoding token for token (κ ∈ {1, 3}, batch 1 and 4, greedy and standard rules,
random heads that are mostly rejected and exact heads that are always accepted, a κ that changes
between steps); the drafter's forward passes per step by stage; frozen-KV MTP allocates no draft KV
and runs no draft-extend forward; the published checkpoint layouts round-trip."""
from __future__ import annotations

import pytest
import torch

from specc.errors import CheckpointError
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec

from tests.mtp_family_support import METHODS, drafter_for, exact_model, random_model
from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, naive_greedy, tiny_target


def _spec(method: str, k: int, b: int, rule: str = "greedy") -> StateSpec:
    return StateSpec(name=f"b{b}_k{k}_topk1_w{k + 1}_{rule}_chain", method=method, batch_size=b, num_steps=k,
                     topk=1, num_draft_tokens=k + 1, verify_rule=rule)


def _prompts(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _run(method, target, model, specs, prompts, n_new, batch_size, modules=3, temperature=0.0):
    drafter = drafter_for(method, model, target, modules)
    rt = Runtime(target, None, drafter, specs, max_model_len=128, eos_token_ids=[])
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n_new, temperature=temperature)) for p in prompts]
    return rt.generate(reqs, batch_size=batch_size), rt


@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_plain_greedy_random_heads(method, k, b):
    target = tiny_target(seed=k + 1)
    model = random_model(method, target, draft_vocab=64 if k == 3 else None, seed=10 + k)
    prompts = _prompts(5, seed=k)  # 5 prompts at batch 4: a freed row is refilled mid-run
    outs, rt = _run(method, target, model, [_spec(method, k, b)], prompts, 14, b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 14)
    assert rt.metrics.num_draft_tokens > 0


@pytest.mark.parametrize("rule", ["greedy", "standard"])
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("method", METHODS)
def test_exact_heads_accept_every_draft(method, b, rule):
    target = tiny_target(seed=2, identity_layers=True)
    prompts = _prompts(4, seed=7)
    outs, rt = _run(method, target, exact_model(method, target), [_spec(method, 3, b, rule)], prompts, 17, b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 17)
        c = o.counters
        assert c.num_accepted_tokens == c.num_draft_tokens > 0  # every valid draft accepted
    assert rt.metrics.tau > 3.0


@pytest.mark.parametrize("method", METHODS)
def test_partial_acceptance_paths(method):
    """An exact head with a perturbed input projection accepts some drafts and rejects others; output
    still equals plain greedy (accepted lengths 0..κ, rows refilled)."""
    target = tiny_target(seed=3, identity_layers=True)
    model = exact_model(method, target, layers=4)
    H = target.config.hidden_size
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        proj = [model.pre_projection] if method == "frozen_kv_mtp" else [layer.eh_proj for layer in model.layers]
        for p in proj:
            p.weight[:, :H].add_(0.25 * torch.randn(H, H, generator=g))
    prompts = _prompts(5, seed=11)
    outs, rt = _run(method, target, model, [_spec(method, 4, 4)], prompts, 24, 4, modules=4)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 24)
    m = rt.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens


def test_multi_layer_modules_each_draft_their_step():
    """Multi-layer EAGLE with only module 1 perturbed: draft 1 is always accepted (module 0 exact),
    draft 2 sometimes rejected; output equals plain greedy."""
    target = tiny_target(seed=4, identity_layers=True)
    model = exact_model("multi_layer_eagle", target, layers=3)
    H = target.config.hidden_size
    with torch.no_grad():
        model.layers[1].eh_proj.weight[:, :H].add_(0.3 * torch.randn(H, H, generator=torch.Generator().manual_seed(1)))
    prompts = _prompts(4, seed=12)
    outs, rt = _run("multi_layer_eagle", target, model, [_spec("multi_layer_eagle", 3, 4)], prompts, 20, 4)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 20)
    per_pos = rt.metrics.num_accepted_tokens_per_pos
    steps = rt.metrics.num_drafts
    assert per_pos[0] == steps  # module 0 exact: position 1 always accepted (drafts were never clipped here)
    assert per_pos[1] < per_pos[0]


@pytest.mark.parametrize("method", METHODS)
def test_standard_rule_at_temperature_zero_is_greedy(method):
    target = tiny_target(seed=5)
    model = random_model(method, target, draft_vocab=48, seed=6)
    prompts = _prompts(4, seed=5)
    outs, _ = _run(method, target, model, [_spec(method, 3, 4, "standard")], prompts, 12, 4)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 12)


@pytest.mark.parametrize("method", METHODS)
def test_kappa_changes_between_steps(method):
    """Bucket 1 drafts κ = 3, bucket 4 κ = 1: as requests finish and the batch shrinks the state
    switches, the drafter's caches (multi-layer EAGLE: each module's window) stay in sync."""
    target = tiny_target(seed=6, identity_layers=True)
    model = exact_model(method, target)
    H = target.config.hidden_size
    with torch.no_grad():  # not exact: some rejections
        proj = [model.pre_projection] if method == "frozen_kv_mtp" else [layer.eh_proj for layer in model.layers]
        for p in proj:
            p.weight[:, :H].add_(0.2 * torch.randn(H, H, generator=torch.Generator().manual_seed(2)))
    prompts = _prompts(6, seed=3)
    lengths = [6, 30, 9, 14, 25, 18]
    drafter = drafter_for(method, model, target, 3)
    rt = Runtime(target, None, drafter, [_spec(method, 3, 1), _spec(method, 1, 4)], max_model_len=128,
                 eos_token_ids=[])
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, lengths)],
                       batch_size=4)
    for p, n, o in zip(prompts, lengths, outs):
        assert o.token_ids == naive_greedy(target, p, n)
    assert rt.metrics.num_kappa_switches >= 1 and set(rt.metrics.kappa_steps) == {1, 3}


# ------------------------------------------------------------------------------- accounting
PASSES = {"mtp": lambda k: (k - 1, 1), "multi_layer_eagle": lambda k: (k - 1, 1), "frozen_kv_mtp": lambda k: (k, 0)}


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("method", METHODS)
def test_forward_passes_per_step_and_draft_kv(method, k):
    """Counted at run time: MTP and multi-layer EAGLE run κ − 1 draft passes and one draft-extend (it
    drafts token 1), frozen-KV MTP κ draft passes and no extend; the draft KV allocated is one
    [rows, kv_heads, cache_len, head_dim] fp32 K and V per layer the drafter keeps (none for frozen-KV)."""
    target = tiny_target(seed=7)
    model = random_model(method, target, layers=4, seed=3)
    outs, rt = _run(method, target, model, [_spec(method, k, 2)], _prompts(3, seed=9), 10, 2, modules=4)
    m = rt.metrics
    assert (m.draft_passes_per_step, m.extend_passes_per_step) == PASSES[method](k)
    assert m.num_draft_passes + m.num_draft_extend_passes == m.decode_steps * (PASSES[method](k)[0] + PASSES[method](k)[1])
    c = target.config
    layers = {"mtp": 1, "multi_layer_eagle": 4, "frozen_kv_mtp": 0}[method]
    per_token = 2 * layers * 2 * (c.hidden_size // 4) * 4  # the heads' 2 KV heads of hidden/4
    assert rt.draft_kv_bytes == m.draft_kv_bytes == per_token * rt.max_rows * rt.cache_len
    report = rt.load_report()
    if method == "frozen_kv_mtp":
        assert "draft KV: none allocated (it reads the target's)" in report
        assert m.num_draft_extend_passes == 0
    else:
        assert "draft KV" in report and "none allocated" not in report


def test_frozen_kv_reads_the_target_cache_at_the_last_written_position():
    """The assistant's drafts are a function of the target's cached KV: overwrite the cache slots the
    query may see and the next draft changes; overwrite slots past the last written position (the
    rejected drafts' KV, which the mask hides) and it does not."""
    from specc.methods.base import BatchView, DraftSampling

    target = tiny_target(seed=8)
    model = random_model("frozen_kv_mtp", target, seed=4, scale=0.5)
    drafter = drafter_for("frozen_kv_mtp", model, target)
    prompt = _prompts(1, seed=4)[0]
    rt = Runtime(target, None, drafter, [_spec("frozen_kv_mtp", 2, 1)], max_model_len=64, eos_token_ids=[])
    rt.reset(1)
    rt.submit(Request(prompt_ids=prompt, params=SamplingParams(max_new_tokens=8)))
    rt.step()  # prefill: the first token is pending, the target wrote slots 0 .. P-1
    batch = rt.batch
    view = batch.view(1, torch.tensor([2]), rt.trash_slot)
    P = len(prompt)
    assert int(drafter.last_pos[0]) == P - 1
    base = drafter.propose(view, 2, DraftSampling()).tokens.clone()
    attn = target.layers[-1].attn
    saved = attn.k_cache.clone()
    attn.k_cache[0, :, P:P + 8] = 100.0  # past the last written slot: masked
    assert torch.equal(drafter.propose(view, 2, DraftSampling()).tokens, base)
    logits0 = drafter.model.draft_logits(drafter.model(
        batch.tokens[:1, P:P + 1], drafter.h_last[:1, None], drafter.last_pos[:1, None],
        attn.k_cache[:1, :, :P], attn.v_cache[:1, :, :P]))
    attn.k_cache[0, :, :P] = torch.randn_like(attn.k_cache[0, :, :P]) * 5  # the prefix it reads
    logits1 = drafter.model.draft_logits(drafter.model(
        batch.tokens[:1, P:P + 1], drafter.h_last[:1, None], drafter.last_pos[:1, None],
        attn.k_cache[:1, :, :P], attn.v_cache[:1, :, :P]))
    assert not torch.allclose(logits0, logits1)
    attn.k_cache.copy_(saved)


# ------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("method", METHODS)
def test_published_layout_round_trips(method, tmp_path):
    from specc.methods.frozen_kv_mtp.model import load_assistant, save_assistant
    from specc.methods.mtp.model import load_mtp, save_mtp
    from specc.methods.multi_layer_eagle.model import load_multi_layer_eagle

    target = tiny_target(seed=9)
    model = random_model(method, target, draft_vocab=40, seed=5)
    if method == "frozen_kv_mtp":
        save_assistant(model, tmp_path, dtype=torch.float32, target_config=target.config)
        back = load_assistant(tmp_path, target)
        keys = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "model.safetensors")))
        assert "pre_projection.weight" in keys and "model.layers.0.self_attn.q_norm.weight" in keys
        assert not any("k_proj" in k or "v_proj" in k for k in keys)  # Q-only: it reads the target's KV
    else:
        save_mtp(model, tmp_path, dtype=torch.float32, target_config=target.config)
        back = load_mtp(tmp_path, target, "mtp") if method == "mtp" else load_multi_layer_eagle(tmp_path, target)
        keys = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(str(tmp_path / "model.safetensors")))
        L = target.config.num_layers
        assert {f"model.layers.{L}.{k}" for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                                  "shared_head.norm.weight")} <= keys  # DeepSeek-V3's names
    assert {"d2t", "t2d"} <= keys
    sd0, sd1 = model.state_dict(), back.state_dict()
    assert set(sd0) == set(sd1) and all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    x = torch.randn(1, 3, target.config.hidden_size)
    assert torch.equal(model.draft_logits(x), back.draft_logits(x))


def test_loaders_refuse_what_does_not_fit(tmp_path):
    from specc.methods.mtp.drafter import MTPDrafter
    from specc.methods.multi_layer_eagle.drafter import MultiLayerEagleDrafter
    from specc.methods.frozen_kv_mtp.model import load_assistant
    from specc.methods.mtp.model import load_mtp, save_mtp

    target = tiny_target(seed=10)
    other = tiny_target(seed=10, hidden=48)
    two = random_model("multi_layer_eagle", target, layers=2)
    with pytest.raises(CheckpointError, match="multi_layer_eagle"):
        MTPDrafter(two, target.config.num_layers, target.norm)
    with pytest.raises(CheckpointError, match="needs 3 modules"):
        MultiLayerEagleDrafter(two, target.config.num_layers, target.norm, 3)
    save_mtp(random_model("mtp", target), tmp_path / "m", target_config=target.config)
    with pytest.raises(CheckpointError, match="hidden_size"):
        load_mtp(tmp_path / "m", other, "mtp")
    with pytest.raises(CheckpointError, match="K/V projections"):
        load_assistant(tmp_path / "m", target)


def test_a_head_past_the_shard_size_is_written_in_shards_and_read_back(tmp_path):
    """Whole modules per shard with Hugging Face's index; the loader reads the same tensors back."""
    import json

    from specc.methods.multi_layer_eagle.model import load_multi_layer_eagle
    from specc.methods.mtp.model import save_mtp

    target = tiny_target(seed=9)
    model = random_model("multi_layer_eagle", target, draft_vocab=40, seed=5)
    save_mtp(model, tmp_path, dtype=torch.float32, target_config=target.config, max_shard_bytes=1)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert not (tmp_path / "model.safetensors").exists() and len(set(index["weight_map"].values())) == 3
    L = target.config.num_layers
    for i in range(3):  # a module never straddles two shards
        assert len({f for k, f in index["weight_map"].items() if k.startswith(f"model.layers.{L + i}.")}) == 1
    back = load_multi_layer_eagle(tmp_path, target)
    sd0, sd1 = model.state_dict(), back.state_dict()
    assert set(sd0) == set(sd1) and all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    save_mtp(model, tmp_path, dtype=torch.float32, target_config=target.config)  # small enough: one file again
    assert (tmp_path / "model.safetensors").is_file() and not list(tmp_path.glob("model-*"))
    assert not (tmp_path / "model.safetensors.index.json").exists()


@pytest.mark.parametrize("b", [1, 4])
def test_mtp_dynamic_trees_equal_plain_greedy(b):
    """MTP drafts EAGLE-2 style dynamic trees (SGLang's NEXTN with topk > 1) through the EAGLE drafter's
    tree code: output equals plain greedy, and a perturbed exact layer gets some of its nodes accepted."""
    target = tiny_target(seed=12, identity_layers=True)
    model = exact_model("mtp", target)
    H = target.config.hidden_size
    with torch.no_grad():
        model.layers[0].eh_proj.weight[:, :H].add_(0.3 * torch.randn(H, H, generator=torch.Generator().manual_seed(3)))
    spec = StateSpec(name=f"b{b}_k3_topk2_w6_greedy_tree", method="mtp", batch_size=b, num_steps=3, topk=2,
                     num_draft_tokens=6, verify_rule="greedy")
    prompts = _prompts(5, seed=13)
    outs, rt = _run("mtp", target, model, [spec], prompts, 18, b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 18)
    assert rt.metrics.num_accepted_tokens > 0
