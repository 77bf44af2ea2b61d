"""Builders for the MTP-family tests (no tests here): random and exact MTP layers, multi-layer EAGLE
modules and frozen-KV assistants bound to a tiny random target (``test_eagle_support.tiny_target``)."""
from __future__ import annotations

from typing import Optional

import torch

from specc.methods.frozen_kv_mtp.model import FrozenKVConfig, FrozenKVAssistant, bind
from specc.methods.mtp.model import MTPConfig, MTPModel
from specc.methods.multi_layer_eagle.model import MultiLayerEagleModel

METHODS = ("mtp", "multi_layer_eagle", "frozen_kv_mtp")


def _randomize(model, seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def _draft_vocab(model, vocab: int, size: Optional[int], seed: int) -> None:
    if size is not None and size < vocab:
        g = torch.Generator().manual_seed(seed + 100)
        ids = torch.randperm(vocab, generator=g)[:size].sort().values
        model.d2t.copy_(ids - torch.arange(size))
    model.bind_head()


def mtp_config(target, kind: str, layers: int, draft_vocab: Optional[int] = None) -> MTPConfig:
    t = target.config
    return MTPConfig(kind=kind, num_layers=layers, first_layer=t.num_layers, hidden_size=t.hidden_size,
                     intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=t.hidden_size // 4,
                     vocab_size=t.vocab_size, draft_vocab_size=draft_vocab or t.vocab_size, rms_norm_eps=1e-6,
                     rope_theta=10000.0, max_position_embeddings=256)


def assistant_config(target, draft_vocab: Optional[int] = None, layers: int = 1) -> FrozenKVConfig:
    t = target.config
    return FrozenKVConfig(hidden_size=t.hidden_size, backbone_hidden_size=t.hidden_size, intermediate_size=48,
                          num_layers=layers, num_attention_heads=t.num_heads, num_key_value_heads=t.num_kv_heads,
                          head_dim=t.head_dim, vocab_size=t.vocab_size, draft_vocab_size=draft_vocab or t.vocab_size,
                          kv_layer=t.num_layers - 1, rms_norm_eps=1e-6, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling)


def random_model(method: str, target, layers: int = 3, draft_vocab: Optional[int] = None, seed: int = 1,
                 scale: float = 0.2):
    """A random head of ``method`` bound to ``target`` (``layers``: multi-layer EAGLE's modules)."""
    if method == "frozen_kv_mtp":
        model = bind(assistant_config(target, draft_vocab), target)
    else:
        n = layers if method == "multi_layer_eagle" else 1
        cls = MultiLayerEagleModel if method == "multi_layer_eagle" else MTPModel
        model = cls(mtp_config(target, method, n, draft_vocab), target.embed, target.lm_head, lambda: target.output.weight)
    _randomize(model, seed, scale)
    _draft_vocab(model, target.config.vocab_size, draft_vocab, seed)
    return model.eval()


def exact_model(method: str, target, layers: int = 3):
    """For an ``identity_layers`` target (the next token a fixed function g of the current one, final
    norm 1): a head whose every draft is the target's greedy token. Its output is norm(embed(t)) of the
    token it reads (the projections pass the embedding through, every block adds zero), and the
    target's head maps that to g(t)."""
    model = random_model(method, target, layers, seed=0, scale=0.0)
    H = target.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.zero_()
        projections = [model.pre_projection] if method == "frozen_kv_mtp" else [layer.eh_proj for layer in model.layers]
        for proj in projections:
            proj.weight[:, :H].copy_(torch.eye(H))  # [embedding | hidden] -> embedding
        if method == "frozen_kv_mtp":
            model.post_projection.weight.copy_(torch.eye(H))
    return model.eval()


def drafter_for(method: str, model, target, num_steps: int = 3):
    """The runtime drafter of ``method`` over ``model``."""
    if method == "mtp":
        from specc.methods.mtp.drafter import MTPDrafter
        return MTPDrafter(model, target.config.num_layers, target.norm)
    if method == "multi_layer_eagle":
        from specc.methods.multi_layer_eagle.drafter import MultiLayerEagleDrafter
        return MultiLayerEagleDrafter(model, target.config.num_layers, target.norm, num_steps)
    from specc.methods.frozen_kv_mtp.drafter import FrozenKVDrafter
    return FrozenKVDrafter(model, target)
