"""Our Llama-family decoder against transformers (the oracle) on small random HF checkpoints the tests
write: logits, hidden states, the KV cache by position, batching, masks and checkpoint errors."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from specc.errors import CheckpointError, PromptError  # noqa: E402
from specc.models.hf_loader import load_hf  # noqa: E402
from specc.models.llama import LlamaModel, pad_prompts, prefill  # noqa: E402

VOCAB = 320

CASES = {
    # name: (hf model class, config kwargs)
    "llama_tied_gqa": ("LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama_untied_mha_llama3rope": ("LlamaForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "llama_linear_rope_mqa": ("LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=1,
                                                       rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2_bias_gqa_tied": ("Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                     tie_word_embeddings=True)),
    "qwen2_bias_untied": ("Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2,
                                                   tie_word_embeddings=False)),
    "mistral_gqa": ("MistralForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
}


def make_hf(tmp_path, case: str, seed: int = 0, shard: bool = False, layers: int = 3):
    """A random HF checkpoint directory for ``case``; returns (dir, transformers model)."""
    cls_name, kw = CASES[case]
    cls = getattr(transformers, cls_name)
    cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    kw = dict(kw)
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0, **kw)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # random init is tiny; widen it so that errors are not hidden by small weights
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    d = tmp_path / case
    model.save_pretrained(d, max_shard_size="100KB" if shard else "5GB")
    return d, model


def hf_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(tmp_path, case):
    d, ref = make_hf(tmp_path, case)
    ours = load_hf(d)
    ours.setup_cache(2, 64)
    ids = torch.randint(3, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        logits, _ = ours(ids, torch.arange(40)[None].expand(2, 40))
    assert logits.shape == (2, 40, VOCAB) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, hf_logits(ref, ids), atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
    d, ref = make_hf(tmp_path, "llama_untied_mha_llama3rope", shard=True)
    assert (d / "model.safetensors.index.json").is_file()
    assert len(list(d.glob("*.safetensors"))) > 1
    ours = load_hf(d)
    ours.setup_cache(1, 64)
    ids = torch.randint(3, VOCAB, (1, 17), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        logits, _ = ours(ids, torch.arange(17)[None])
    torch.testing.assert_close(logits, hf_logits(ref, ids), atol=1e-4, rtol=0)


def test_hidden_layers_convention(tmp_path):
    d, ref = make_hf(tmp_path, "llama_tied_gqa", layers=4)
    ours = load_hf(d)
    ours.setup_cache(1, 64)
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    with torch.inference_mode():
        logits, hidden = ours(ids, torch.arange(12)[None], hidden_layers=(0, 2, 4, 1))
    assert [tuple(h.shape) for h in hidden] == [(1, 12, 64)] * 4
    # HF hidden_states[i + 1] is decoder layer i's output (pre-norm) for i < L - 1; [L] is the final-norm output
    torch.testing.assert_close(hidden[0], out.hidden_states[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden[1], out.hidden_states[3], atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden[3], out.hidden_states[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden[2], out.hidden_states[4], atol=1e-5, rtol=0)
    # lm_head is the bare projection: lm_head(final-norm output) == logits; norm(last layer) == final-norm output
    torch.testing.assert_close(ours.lm_head(hidden[2]), logits, atol=1e-5, rtol=0)
    with torch.inference_mode():
        _, (h3,) = ours(ids, torch.arange(12)[None], hidden_layers=(3,))
    torch.testing.assert_close(ours.norm(h3), hidden[2], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="hidden_layers"):
        ours(ids, torch.arange(12)[None], hidden_layers=(5,))


def test_incremental_decode_matches_full_forward(tmp_path):
    d, ref = make_hf(tmp_path, "qwen2_bias_gqa_tied")
    ours = load_hf(d)
    ours.setup_cache(2, 64)
    ids = torch.randint(3, VOCAB, (2, 30), generator=torch.Generator().manual_seed(4))
    expect = hf_logits(ref, ids)
    pos = torch.arange(30)[None].expand(2, 30)
    with torch.inference_mode():
        first, _ = ours(ids[:, :20], pos[:, :20])
        steps = [ours(ids[:, t:t + 1], pos[:, t:t + 1])[0] for t in range(20, 25)]
        chunk, _ = ours(ids[:, 25:], pos[:, 25:])  # a verify-like 5-token step
    got = torch.cat([first] + steps + [chunk], dim=1)
    torch.testing.assert_close(got, expect, atol=1e-4, rtol=0)


def test_rejected_tokens_are_overwritten_by_position(tmp_path):
    """Roll back by position: write wrong tokens at 10..13, then the right ones at 10..; logits are
    those of the right sequence (the stale slots beyond the position are masked)."""
    d, ref = make_hf(tmp_path, "llama_tied_gqa")
    ours = load_hf(d)
    ours.setup_cache(1, 64)
    ids = torch.randint(3, VOCAB, (1, 16), generator=torch.Generator().manual_seed(5))
    wrong = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(6))
    pos = torch.arange(16)[None]
    with torch.inference_mode():
        ours(ids[:, :10], pos[:, :10])
        ours(wrong, pos[:, 10:14])
        got, _ = ours(ids[:, 10:12], pos[:, 10:12])  # only two of the four stale slots overwritten
    torch.testing.assert_close(got, hf_logits(ref, ids[:, :12])[:, 10:12], atol=1e-4, rtol=0)


def test_tree_mask_matches_each_branch(tmp_path):
    """A tree verify: root r at position p, children a, b both at p+1 written to different slots,
    with an explicit [B, N, S] mask. Each node's logits equal those of its own branch run alone."""
    d, ref = make_hf(tmp_path, "llama_untied_mha_llama3rope")
    ours = load_hf(d)
    ours.setup_cache(1, 64)
    prompt = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(7))
    r, a, b = 11, 22, 33
    with torch.inference_mode():
        ours(prompt, torch.arange(8)[None])
        tree = torch.tensor([[r, a, b]])
        positions = torch.tensor([[8, 9, 9]])
        slots = torch.tensor([[8, 9, 10]])
        S = 11
        mask = torch.zeros(1, 3, S, dtype=torch.bool)
        mask[0, :, :8] = True       # the prompt
        mask[0, :, 8] = True        # the root
        mask[0, 1, 9] = True        # a sees itself
        mask[0, 2, 10] = True       # b sees itself, not a
        got, _ = ours(tree, positions, cache_slots=slots, attn_mask=mask)
    branch_a = hf_logits(ref, torch.cat([prompt, torch.tensor([[r, a]])], 1))
    branch_b = hf_logits(ref, torch.cat([prompt, torch.tensor([[r, b]])], 1))
    torch.testing.assert_close(got[:, 0], branch_a[:, 8], atol=1e-4, rtol=0)
    torch.testing.assert_close(got[:, 1], branch_a[:, 9], atol=1e-4, rtol=0)
    torch.testing.assert_close(got[:, 2], branch_b[:, 9], atol=1e-4, rtol=0)


def test_batched_prefill_of_different_lengths_equals_each_alone(tmp_path):
    d, ref = make_hf(tmp_path, "qwen2_bias_untied")
    ours = load_hf(d)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (1, 9, 4)]

    def greedy(batch, steps=6):
        ours.setup_cache(len(batch), 64)
        with torch.inference_mode():
            last, lengths, _ = prefill(ours, batch)
            out = [[int(t)] for t in last.argmax(-1)]
            pos = lengths.clone()
            for _ in range(steps - 1):
                tok = torch.tensor([[o[-1]] for o in out])
                logits, _ = ours(tok, pos[:, None])
                pos += 1
                for o, t in zip(out, logits[:, 0].argmax(-1)):
                    o.append(int(t))
        return out

    together = greedy(prompts)
    alone = [greedy([p])[0] for p in prompts]
    assert together == alone
    for p, toks in zip(prompts, alone):  # and transformers agrees
        with torch.no_grad():
            hf = ref.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, min_new_tokens=6,
                              attention_mask=torch.ones(1, len(p), dtype=torch.long))
        assert hf[0, len(p):].tolist() == toks


def test_one_token_prompt(tmp_path):
    d, ref = make_hf(tmp_path, "llama_tied_gqa")
    ours = load_hf(d)
    ours.setup_cache(1, 64)
    with torch.inference_mode():
        last, lengths, _ = prefill(ours, [[5]])
    assert lengths.tolist() == [1]
    torch.testing.assert_close(last, hf_logits(ref, torch.tensor([[5]]))[:, 0], atol=1e-4, rtol=0)


def test_prompt_reaching_max_model_len_is_a_clear_error(tmp_path):
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    ours = load_hf(d, max_model_len=32)
    assert ours.config.max_model_len == 32
    ours.setup_cache(1)
    assert ours.max_seq_len == 32
    with pytest.raises(PromptError, match="max_model_len is 32"):
        prefill(ours, [list(range(3, 35))])
    with pytest.raises(PromptError, match="outside the KV cache"):
        ours(torch.tensor([[3]]), torch.tensor([[32]]))
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        ours.setup_cache(1, 33)
    last, lengths, _ = prefill(ours, [list(range(3, 34))])  # 31 tokens: one slot left, fine
    assert lengths.tolist() == [31]


def test_pad_prompts_convention():
    ids, pos, lengths = pad_prompts([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert pos.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert lengths.tolist() == [3, 1]
    with pytest.raises(PromptError):
        pad_prompts([[1], []])


def test_forward_before_setup_cache_raises(tmp_path):
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    ours = load_hf(d)
    with pytest.raises(RuntimeError, match="setup_cache"):
        ours(torch.tensor([[3]]), torch.tensor([[0]]))


def test_cpu_fast_path_equals_plain_linear(tmp_path):
    """The numpy BLAS path and F.linear agree (for 1, 5 and 17 rows)."""
    d, _ = make_hf(tmp_path, "qwen2_bias_gqa_tied")
    fast = load_hf(d)
    plain = load_hf(d)
    for m in plain.modules():
        if hasattr(m, "_wt_np"):
            m._wt_np = None
    assert any(getattr(m, "_wt_np", None) is not None for m in fast.modules())
    for n in (1, 5, 17):
        fast.setup_cache(1, 64)
        plain.setup_cache(1, 64)
        ids = torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.inference_mode():
            a, _ = fast(ids, torch.arange(n)[None])
            b, _ = plain(ids, torch.arange(n)[None])
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------ bad checkpoints
def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_hf(tmp_path / "nope")


def test_missing_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf(tmp_path)


def test_unsupported_architecture(tmp_path):
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel.*not supported"):
        load_hf(d)


def test_unsupported_rope_type(tmp_path):
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'yarn' is not supported"):
        load_hf(d)


@pytest.mark.parametrize("head_dim", [9, 0])
def test_an_odd_head_dim_is_refused_before_a_forward(tmp_path, head_dim):
    """Rotary embeddings rotate pairs: an odd head_dim is a config error at load, not a shape error
    in the first forward."""
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    cfg = json.loads((d / "config.json").read_text())
    cfg["head_dim"] = head_dim
    if head_dim == 0:  # then derived: hidden_size / num_attention_heads
        cfg["num_attention_heads"] = cfg["hidden_size"] + 1
        cfg["num_key_value_heads"] = cfg["hidden_size"] + 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"head_dim={head_dim} .*positive even number"):
        load_hf(d)


def test_config_weight_mismatch(tmp_path):
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = VOCAB + 8
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="embed_tokens.weight.*shape"):
        load_hf(d)
    cfg["vocab_size"] = VOCAB
    cfg["num_hidden_layers"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="layers.3.*missing"):
        load_hf(d)
    cfg["num_hidden_layers"] = 2
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unexpected tensors"):
        load_hf(d)


def test_corrupt_and_missing_weights(tmp_path):
    d, _ = make_hf(tmp_path, "llama_tied_gqa")
    (d / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_hf(d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="safetensors only"):
        load_hf(d)


def test_sharded_index_names_missing_shard(tmp_path):
    d, _ = make_hf(tmp_path, "llama_untied_mha_llama3rope", shard=True)
    shard = sorted(d.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match="not in"):
        load_hf(d)


def test_state_dict_roundtrip(tmp_path):
    d, _ = make_hf(tmp_path, "qwen2_bias_untied")
    a = load_hf(d)
    b = LlamaModel(a.config)
    b.load_hf_state_dict(a.hf_state_dict())
    for (ka, va), (kb, vb) in zip(a.hf_state_dict().items(), b.hf_state_dict().items()):
        assert ka == kb and torch.equal(va, vb)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_forward_matches_and_captures_in_a_graph(tmp_path):
    """On CUDA the forward has static shapes and no host syncs: a captured decode step replays to
    the same logits as eager, and both match transformers."""
    d, ref = make_hf(tmp_path, "qwen2_bias_gqa_tied")
    ours = load_hf(d, device="cuda")
    ours.setup_cache(2, 64)
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        logits, _ = ours(ids.cuda(), torch.arange(12)[None].expand(2, 12).cuda())
    torch.testing.assert_close(logits.cpu(), hf_logits(ref, ids), atol=1e-4, rtol=0)
    tok = torch.full((2, 1), 7, dtype=torch.int64, device="cuda")
    pos = torch.full((2, 1), 12, dtype=torch.int64, device="cuda")
    with torch.inference_mode():
        eager, _ = ours(tok, pos)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ours(tok, pos)  # warm-up on the side stream
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits, _ = ours(tok, pos)
        graph.replay()
    torch.testing.assert_close(static_logits, eager, atol=1e-5, rtol=0)
