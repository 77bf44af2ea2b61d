"""Shared builders for the EAGLE tests (no tests here): a tiny random target (our LlamaModel) and random heads written
in the published SafeAILab layouts."""
from __future__ import annotations

import pytest
import torch

from specc.models.config import LlamaConfig
from specc.methods.eagle.model import EagleConfig, EagleModel, default_aux_layer_ids
from specc.models.llama import LlamaModel

V, H, LAYERS = 96, 32, 6


def tiny_target(seed: int = 0, vocab: int = V, hidden: int = H, layers: int = LAYERS, scale: float = 0.4,
                max_len: int = 256, identity_layers: bool = False) -> LlamaModel:
    """A random untied Llama target (GQA 4/2 heads). ``identity_layers`` zeroes every layer's output projections,
    so the next token is a fixed function of the current one (drafts can then be made exact)."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                      num_heads=4, num_kv_heads=2, head_dim=hidden // 4, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=max_len, max_model_len=max_len, tie_word_embeddings=False,
                      eos_token_ids=(), name="tiny")
    g = torch.Generator().manual_seed(seed)
    m = LlamaModel(cfg)
    sd = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g),
          "lm_head.weight": torch.randn(vocab, hidden, generator=g),
          "model.norm.weight": torch.ones(hidden)}
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    shapes = {"self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
              "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
              "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
              "mlp.down_proj.weight": (hidden, inter)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in shapes.items():
            sd[p + name] = scale * torch.randn(*shape, generator=g)
        if identity_layers:
            sd[p + "self_attn.o_proj.weight"].zero_()
            sd[p + "mlp.down_proj.weight"].zero_()
        sd[p + "input_layernorm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=g)
        sd[p + "post_attention_layernorm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=g)
    m.load_hf_state_dict(sd, source="tiny")
    return m.eval()


def head_config(kind: str, target: LlamaModel, draft_vocab: int | None = None, fc_bias: bool = True) -> EagleConfig:
    tc = target.config
    return EagleConfig(
        kind=kind, hidden_size=tc.hidden_size, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=tc.hidden_size // 4, vocab_size=tc.vocab_size,
        draft_vocab_size=(draft_vocab or tc.vocab_size) if kind == "eagle3" else tc.vocab_size,
        target_hidden_size=tc.hidden_size, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
        fc_bias=fc_bias and kind == "eagle", aux_layer_ids=default_aux_layer_ids(tc.num_layers) if kind == "eagle3" else ())


def random_head(kind: str, target: LlamaModel, seed: int = 1, draft_vocab: int | None = None,
                scale: float = 0.2) -> EagleModel:
    """A random head bound to ``target``; an EAGLE-3 reduced vocabulary keeps a random subset of ids."""
    cfg = head_config(kind, target, draft_vocab)
    m = EagleModel(cfg, target.embed, target.lm_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
        if kind == "eagle3" and cfg.draft_vocab_size < cfg.vocab_size:
            ids = torch.randperm(cfg.vocab_size, generator=g)[: cfg.draft_vocab_size].sort().values
            m.d2t.copy_(ids - torch.arange(cfg.draft_vocab_size))
            m.t2d.zero_()
            m.t2d[ids] = True
    return m.eval()


def oracle_eagle_head(target: LlamaModel) -> EagleModel:
    """For an ``identity_layers`` target (final-norm weight 1): an EAGLE head whose every draft equals
    the target's greedy token. ``fc([emb(t); f]) = emb(t)`` and a zero layer give ``g = emb(t)``; the
    LM head's argmax of ``W emb(t)`` equals the target's argmax of ``W norm(emb(t))``."""
    cfg = head_config("eagle", target)
    m = EagleModel(cfg, target.embed, target.lm_head)
    Hh = cfg.hidden_size
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.fc.weight[:, :Hh].copy_(torch.eye(Hh))
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.fill_(1.0)
    return m.eval()


def naive_greedy(target: LlamaModel, prompt, n: int) -> list:
    """Plain greedy decoding, one token per forward (the oracle for exactness tests)."""
    target.setup_cache(1, len(prompt) + n + 2)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        logits, _ = target(ids, torch.arange(len(prompt))[None])
        out = [int(logits[0, -1].argmax())]
        for i in range(n - 1):
            pos = len(prompt) + i
            logits, _ = target(torch.tensor([[out[-1]]]), torch.tensor([[pos]]))
            out.append(int(logits[0, -1].argmax()))
    return out


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest single-threaded; on the shared 2-core machine, OpenMP threads spinning
    against other jobs made these tests ~50x slower. Restores the previous setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
