"""EAGLE / EAGLE-3 heads: the forward against a from-scratch reference over the published keys, the KV
cache by position, the training-time-test unroll against the inference chain, and the loaders on
checkpoints written here in the SafeAILab layouts (safetensors and pytorch_model.bin), with every
checkpoint error."""
from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest
import torch
import torch.nn.functional as F

from specc.errors import CheckpointError
from specc.methods.eagle.model import EagleModel, default_aux_layer_ids
from specc.methods.eagle.loader import load_eagle_head, published_key_map, save_eagle_head

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, random_head, tiny_target

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _published_sd(model: EagleModel) -> dict:
    """The head's tensors under the published keys (what a SafeAILab checkpoint holds)."""
    own = model.state_dict()
    sd = {key: own[ours].clone() for ours, key in published_key_map(model.cfg.kind, model.cfg.fc_bias).items()}
    if model.cfg.kind == "eagle3" and model.cfg.draft_vocab_size < model.cfg.vocab_size:
        sd["d2t"], sd["t2d"] = model.d2t.clone(), model.t2d.clone()
    return sd


# ------------------------------------------------------------------------------- reference forward
def _rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x, pos, theta):  # x [N, h, d]; HF rotate-half layout
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos.float()[:, None] * inv[None]  # [N, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_forward(sd: dict, cfg, emb_w, tokens, feats):
    """One sequence, no cache, straight from the published tensors (SafeAILab cnets1.py / cnets.py
    semantics re-derived by hand): tokens [N], feats [N, F] -> layer output [N, H]."""
    N = tokens.shape[0]
    e = emb_w[tokens]
    if cfg.kind == "eagle":
        pre, lay = "layers.0.", "layers.0."
        x = torch.cat([e, feats], -1) @ sd["fc.weight"].t() + sd.get("fc.bias", 0)
        residual, attn_in = x, x
    else:
        pre = "midlayer."
        residual = feats @ sd["fc.weight"].t()
        attn_in = torch.cat([_rms(e, sd[pre + "input_layernorm.weight"], cfg.rms_norm_eps),
                             _rms(residual, sd[pre + "hidden_norm.weight"], cfg.rms_norm_eps)], -1)
    h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = (attn_in @ sd[pre + "self_attn.q_proj.weight"].t()).view(N, h, d)
    k = (attn_in @ sd[pre + "self_attn.k_proj.weight"].t()).view(N, kv, d)
    v = (attn_in @ sd[pre + "self_attn.v_proj.weight"].t()).view(N, kv, d)
    pos = torch.arange(N)
    q, k = _rope(q, pos, cfg.rope_theta), _rope(k, pos, cfg.rope_theta)
    out = torch.zeros(N, h, d)
    for head in range(h):
        kh = head // (h // kv)
        s = q[:, head] @ k[:, kh].t() / math.sqrt(d)
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        out[:, head] = s.softmax(-1) @ v[:, kh]
    x = residual + out.reshape(N, h * d) @ sd[pre + "self_attn.o_proj.weight"].t()
    y = _rms(x, sd[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    mlp = (F.silu(y @ sd[pre + "mlp.gate_proj.weight"].t()) * (y @ sd[pre + "mlp.up_proj.weight"].t()))
    return x + mlp @ sd[pre + "mlp.down_proj.weight"].t()


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_forward_matches_reference_on_published_keys(kind):
    target = tiny_target()
    head = random_head(kind, target, draft_vocab=40)
    sd = _published_sd(head)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V, (2, 12), generator=g)
    feats = torch.randn(2, 12, head.cfg.feature_size, generator=g)
    with torch.no_grad():
        ours = head(tokens, feats, torch.arange(12)[None].expand(2, 12))
        for b in range(2):
            ref = reference_forward(sd, head.cfg, target.embed_weight.detach(), tokens[b], feats[b])
            torch.testing.assert_close(ours[b], ref, atol=2e-5, rtol=1e-5)
        if kind == "eagle3":  # own norm + head over the draft vocabulary, then d2t to target ids
            logits = head.draft_logits(ours)
            ref_logits = _rms(ours, sd["norm.weight"], head.cfg.rms_norm_eps) @ sd["lm_head.weight"].t()
            torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-5)
            d = logits.argmax(-1)
            assert torch.equal(head.draft_to_target(d), d + sd["d2t"][d])
            assert bool(sd["t2d"][head.draft_to_target(d)].all())
        else:  # EAGLE: the target's LM head on g, no extra norm
            torch.testing.assert_close(head.draft_logits(ours), target.lm_head(ours))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_cache_by_position_matches_full_forward_and_overwrites(kind):
    """Extend then single steps through the KV cache equals the no-cache forward; a rejected branch
    written at later positions is harmless once those positions are rewritten."""
    target = tiny_target()
    head = random_head(kind, target, draft_vocab=50).prepare_inference()
    g = torch.Generator().manual_seed(4)
    B, N = 3, 14
    tokens = torch.randint(0, V, (B, N), generator=g)
    feats = torch.randn(B, N, head.cfg.feature_size, generator=g)
    pos = torch.arange(N)[None].expand(B, N)
    with torch.inference_mode():
        full = head(tokens, feats, pos)
        cache = head.new_cache(B, 32)
        # a wrong branch first: garbage at positions 8..13
        head(torch.randint(0, V, (B, 6), generator=g), torch.randn(B, 6, head.cfg.feature_size, generator=g),
             pos[:, 8:], cache=cache)
        parts = [head(tokens[:, :8], feats[:, :8], pos[:, :8], cache=cache)]
        for i in range(8, N):
            parts.append(head(tokens[:, i:i + 1], feats[:, i:i + 1], pos[:, i:i + 1], cache=cache))
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def _load_trainer():
    import specc.methods.eagle.recipe
    return specc.methods.eagle.recipe


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_time_test_unroll_equals_inference_chain(kind):
    """specc.methods.eagle.recipe's unrolled forward, step k at index p, equals what inference computes:
    extend over pairs 0..p, then k recurrent steps on the head's own outputs fed the true tokens."""
    trainer = _load_trainer()
    target = tiny_target()
    head = random_head(kind, target, draft_vocab=50)
    g = torch.Generator().manual_seed(5)
    T, steps = 10, 3
    tokens = torch.randint(0, V, (1, T + 1), generator=g)
    feats = torch.randn(1, T, head.cfg.feature_size, generator=g)
    with torch.no_grad():
        outs = trainer.ttt_forward(head, tokens, feats, steps)
        for p in (0, 3, 6):
            cache = head.new_cache(1, 32)
            pos = torch.arange(p + 1)[None]
            gx = head(tokens[:, 1: p + 2], feats[:, : p + 1], pos, cache=cache)[:, -1:]
            torch.testing.assert_close(outs[0][:, p], gx[:, 0], atol=1e-5, rtol=1e-5)
            for k in range(1, steps):
                gx = head(tokens[:, p + k + 1: p + k + 2], gx, torch.tensor([[p + k]]), cache=cache, from_target=False)
                torch.testing.assert_close(outs[k][:, p], gx[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_unroll_on_selected_chain_starts_equals_full_unroll(kind):
    """Unrolling only the chains with a loss (``sel``) gives those chains' outputs of the full unroll;
    ``loss_positions`` picks each row's answer range from the labels."""
    trainer = _load_trainer()
    target = tiny_target()
    head = random_head(kind, target, draft_vocab=50)
    g = torch.Generator().manual_seed(9)
    B, T, steps = 2, 12, 3
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    feats = torch.randn(B, T, head.cfg.feature_size, generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :5] = -100  # row 0: prompt labels 0..4 -> chains 4..10 carry a loss
    labels[1, :8] = -100
    labels[1, 10:] = -100  # row 1: right padding too -> chains 7..8
    sel, valid = trainer.loss_positions(labels)
    assert sel[0].tolist() == list(range(4, 11)) and valid[0].all()
    assert sel[1, :2].tolist() == [7, 8] and valid[1].tolist() == [True, True] + [False] * 5
    with torch.no_grad():
        full = trainer.ttt_forward(head, tokens, feats, steps)
        part = trainer.ttt_forward(head, tokens, feats, steps, sel=sel)
    for k in range(steps):
        for b in range(B):
            for j in range(sel.shape[1]):
                if valid[b, j]:
                    torch.testing.assert_close(part[k][b, j], full[k][b, sel[b, j]], atol=1e-5, rtol=1e-5)


def test_default_aux_layers_follow_safeailab_capture_points():
    # SafeAILab appends the hidden state *entering* layers {2, N//2, N-3}: outputs of {1, N//2-1, N-4}
    assert default_aux_layer_ids(32) == (1, 15, 28)
    assert default_aux_layer_ids(30) == (1, 14, 26)


# ------------------------------------------------------------------------------- loaders
def _write(tmp_path, head, fmt: str, name="head", mutate=None, config_mutate=None):
    d = tmp_path / name
    save_eagle_head(head, d, dtype=torch.float32,
                    weights_file="model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")
    if mutate or config_mutate:
        sd = _published_sd(head)
        if mutate:
            mutate(sd)
        (d / "model.safetensors").unlink(missing_ok=True)
        (d / "pytorch_model.bin").unlink(missing_ok=True)
        torch.save(sd, d / "pytorch_model.bin")
        if config_mutate:
            cfg = json.loads((d / "config.json").read_text())
            config_mutate(cfg)
            (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_published_layout_round_trip(tmp_path, kind, fmt):
    target = tiny_target()
    head = random_head(kind, target, draft_vocab=40)
    d = _write(tmp_path, head, fmt)
    if fmt == "safetensors":
        from safetensors.torch import load_file
        keys = set(load_file(str(d / "model.safetensors")))
    else:
        keys = set(torch.load(d / "pytorch_model.bin", weights_only=True))
    layer = "midlayer." if kind == "eagle3" else "layers.0."
    expected = {layer + k for k in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                    "mlp.down_proj.weight", "post_attention_layernorm.weight")} | {"fc.weight"}
    if kind == "eagle3":
        expected |= {"midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "norm.weight",
                     "lm_head.weight", "d2t", "t2d"}
    else:
        expected |= {"fc.bias"}
    assert keys == expected
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == V
    if kind == "eagle3":
        assert cfg["draft_vocab_size"] == 40 and cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    else:
        assert cfg["bias"] is True
    loaded = load_eagle_head(d, target.config, target.embed, target.lm_head, expect_kind=kind)
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, V, (2, 7), generator=g)
    feats = torch.randn(2, 7, head.cfg.feature_size, generator=g)
    pos = torch.arange(7)[None].expand(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, feats, pos), head(tokens, feats, pos))
        torch.testing.assert_close(loaded.draft_logits(head(tokens, feats, pos)), head.draft_logits(head(tokens, feats, pos)))
    if kind == "eagle3":
        assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)


def test_safeailab_extras_are_accepted(tmp_path):
    """SafeAILab's EAGLE checkpoints also carry ``embed_tokens.weight`` and older configs lack ``bias``;
    an EAGLE-3 head with the full vocabulary needs no d2t/t2d."""
    target = tiny_target()
    head = random_head("eagle", target)
    d = _write(tmp_path, head, "bin", mutate=lambda sd: sd.update({"embed_tokens.weight": target.embed_weight.detach().clone()}),
               config_mutate=lambda c: c.pop("bias"))
    load_eagle_head(d, target.config, target.embed, target.lm_head)
    full = random_head("eagle3", target)  # draft_vocab_size == vocab_size
    d3 = _write(tmp_path, full, "bin", name="full3", config_mutate=lambda c: c.pop("eagle_config"))
    m = load_eagle_head(d3, target.config, target.embed, target.lm_head)
    assert m.cfg.aux_layer_ids == default_aux_layer_ids(target.config.num_layers)
    ids = torch.arange(V)
    assert torch.equal(m.draft_to_target(ids), ids)


def _error(tmp_path, kind, match, mutate=None, config_mutate=None, target=None, expect_kind=None, draft_vocab=40):
    base = tiny_target()
    head = random_head(kind, base, draft_vocab=draft_vocab)
    d = _write(tmp_path, head, "bin", mutate=mutate, config_mutate=config_mutate)
    target = target or base
    with pytest.raises(CheckpointError, match=match):
        load_eagle_head(d, target.config, target.embed, target.lm_head, expect_kind=expect_kind)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_hidden_size_mismatch(tmp_path, kind):
    other = tiny_target(hidden=48)
    _error(tmp_path, kind, "hidden size is 48", target=other)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_vocabulary_mismatch(tmp_path, kind):
    other = tiny_target(vocab=V + 8)
    _error(tmp_path, kind, f"vocab_size={V} but the target's vocabulary has {V + 8}", target=other)


def test_reduced_vocab_without_mappings(tmp_path):
    _error(tmp_path, "eagle3", "lack d2t and t2d", mutate=lambda sd: (sd.pop("d2t"), sd.pop("t2d")))
    _error(tmp_path, "eagle3", "lack t2d", mutate=lambda sd: sd.pop("t2d"))


def test_mappings_outside_target_vocabulary(tmp_path):
    def push_out(sd):
        sd["d2t"][-1] = V  # draft id 39 -> 39 + V, outside [0, V)

    _error(tmp_path, "eagle3", r"outside \[0, 96\)", mutate=push_out)

    def negative(sd):
        sd["d2t"][0] = -5

    _error(tmp_path, "eagle3", r"to target id -5, outside", mutate=negative)

    def disagree(sd):
        t2d = sd["t2d"].clone()
        on = t2d.nonzero()[0, 0]
        off = (~t2d).nonzero()[0, 0]
        t2d[on], t2d[off] = False, True
        sd["t2d"] = t2d

    _error(tmp_path, "eagle3", "disagree", mutate=disagree)


def test_kind_and_shape_errors(tmp_path):
    _error(tmp_path, "eagle3", "plan's method is 'eagle'", expect_kind="eagle")
    _error(tmp_path, "eagle", "midlayer|layers.0.self_attn.q_proj.weight' is missing",
           mutate=lambda sd: sd.pop("layers.0.self_attn.q_proj.weight"))
    _error(tmp_path, "eagle3", "has shape", mutate=lambda sd: sd.update({"fc.weight": torch.zeros(32, 64)}))
    _error(tmp_path, "eagle3", "unexpected tensors", mutate=lambda sd: sd.update({"midlayer2.x": torch.zeros(1)}))
    _error(tmp_path, "eagle3", "eagle_aux_hidden_state_layer_ids",
           config_mutate=lambda c: c.update({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 99]}}))


def test_missing_files_and_bad_json(tmp_path):
    target = tiny_target()
    with pytest.raises(CheckpointError, match="not a directory"):
        load_eagle_head(tmp_path / "nope", target.config, target.embed)
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_eagle_head(d, target.config, target.embed)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_eagle_head(d, target.config, target.embed)
    (d / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="model.safetensors or pytorch_model.bin"):
        load_eagle_head(d, target.config, target.embed)
    (d / "pytorch_model.bin").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read the weights"):
        load_eagle_head(d, target.config, target.embed)
