"""Load a GGUF file (llama.cpp's format) into ``LlamaModel``.

Tensors are dequantized to fp32 with ``gguf.quants.dequantize`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1 and the K-quants the ``gguf`` package implements). llama.cpp's converter permutes the
rows of ``attn_q``/``attn_k`` of ``llama`` checkpoints from HF's half-split RoPE layout to GGML's
interleaved one (``convert_hf_to_gguf.py``, ``LlamaModel.permute``); we undo it as transformers'
GGUF loader does (``integrations/ggml.py``, ``reverse_permute_weights``). The tokenizer and chat
template come from the GGUF metadata through ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``.

Reading the GGUF metadata and building the tokenizer take several seconds (the ``gguf`` reader parses
the 49k-entry vocabulary field by field), so the first load writes a copy — ``config.json``, the
dequantized fp32 weights in our own fused layout and the tokenizer files — into a cache directory keyed
by the file's path, size, mtime and a hash of its first and last MiB; later loads read that copy
without copying a tensor (SmolLM2-135M: ~1 s instead of ~20 s). ``SPECC_CACHE_DIR`` sets the cache root (default ``~/.cache/specc``).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from specc.errors import CheckpointError
from specc.models.config import LlamaConfig

CACHE_VERSION = 2
CACHE_MARKER = "specc_cache.json"
NATIVE_WEIGHTS = "specc_native.safetensors"
NATIVE_QWEIGHTS = "specc_qweights.safetensors"
NATIVE_VERSION = 1  # bump when the native cache's layout changes
#: models whose dequantized fp32 weights exceed this are not cached (bytes)
CACHE_LIMIT_BYTES = 4 << 30
SUPPORTED_GGUF_ARCHS = ("llama", "qwen2")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("SPECC_CACHE_DIR") or pathlib.Path.home() / ".cache" / "specc")


def cache_dir_for(path: pathlib.Path, native: bool = False) -> pathlib.Path:
    """The cache directory of a GGUF file: ``<cache_root>/gguf/<stem>-<key>`` (``-native`` added for the
    native path's copy) where the key hashes the absolute path, size, mtime and the first and last MiB
    of the file."""
    st = path.stat()
    tag = f"|native{NATIVE_VERSION}" if native else ""
    h = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v{CACHE_VERSION}{tag}".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
        if st.st_size > 2 << 20:
            fh.seek(-(1 << 20), os.SEEK_END)
            h.update(fh.read(1 << 20))
    return cache_root() / "gguf" / f"{path.stem}-{h.hexdigest()[:16]}{'-native' if native else ''}"


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: ``[n_head * 2 * d, ...]`` interleaved rope pairs ->
    HF's half-split layout. Inverse of ``convert_hf_to_gguf.py`` ``permute`` (reshape
    ``(n_head, 2, d, ...)`` then swap axes 1 and 2)."""
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def config_from_gguf(reader, source: str, max_model_len: Optional[int] = None) -> LlamaConfig:
    """A ``LlamaConfig`` from GGUF metadata (``<arch>.block_count``, ``.embedding_length``, ...).
    Raises ``CheckpointError`` for an unsupported architecture or a missing key."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise CheckpointError(f"{source}: GGUF architecture {arch!r} is not supported "
                              f"(supported: {', '.join(SUPPORTED_GGUF_ARCHS)})")

    def need(key):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise CheckpointError(f"{source}: GGUF metadata key {arch}.{key} is missing")
        return v

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", _field(reader, f"{arch}.rope.dimension_count",
                                                                           hidden // heads)))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _field(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None)
    if vocab is None:
        raise CheckpointError(f"{source}: GGUF has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    scaling = None
    stype = _field(reader, f"{arch}.rope.scaling.type")
    if stype == "linear":
        scaling = {"rope_type": "linear", "factor": float(_field(reader, f"{arch}.rope.scaling.factor"))}
    elif stype not in (None, "none"):
        raise CheckpointError(f"{source}: GGUF rope scaling {stype!r} is not supported (linear only, or "
                              f"llama3 factors in rope_freqs.weight)")
    ctx = int(_field(reader, f"{arch}.context_length", 2048))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return LlamaConfig(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)), rope_scaling=scaling,
        max_position_embeddings=ctx, max_model_len=int(max_model_len or ctx),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        attention_bias=any(t.name.endswith("attn_q.bias") for t in reader.tensors),
        architecture=arch, bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        name=str(_field(reader, "general.name", "")))


def dequantize_tensor(t, source: str) -> np.ndarray:
    """One GGUF tensor as fp32 numpy ``[out, in]`` (GGML lists dims innermost first)."""
    import gguf
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    qtype = t.tensor_type
    try:
        if qtype == gguf.GGMLQuantizationType.F32:
            arr = np.array(t.data, dtype=np.float32)  # a copy: the reader's memmap is read-only
        elif qtype == gguf.GGMLQuantizationType.F16:
            arr = np.asarray(t.data).astype(np.float32)
        else:
            arr = gguf.quants.dequantize(t.data, qtype)
    except NotImplementedError:
        raise CheckpointError(f"{source}: tensor {t.name!r} uses quantization {qtype.name}, which the gguf "
                              f"package cannot dequantize; re-quantize to Q8_0/Q4_0/Q4_1 or F16") from None
    return np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)


def _open_reader(path: pathlib.Path):
    import gguf
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/struct.error/... on foreign files
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def _check_sizes(reader, path: pathlib.Path) -> None:
    """Refuse a truncated GGUF before any tensor is read: every tensor's bytes must lie inside the file
    (gguf-py maps them lazily and would fail later, mid-load)."""
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise CheckpointError(f"{path}: truncated GGUF: tensor {t.name!r} ends at byte {end} but the file has "
                                  f"{size} bytes; download or copy the file again")


def read_gguf(path: pathlib.Path, max_model_len: Optional[int] = None, native: bool = False
              ) -> Tuple[LlamaConfig, Dict[str, "torch.Tensor | QuantWeight"]]:
    """Config and an HF-named state dict from a GGUF file: fp32 tensors, or with ``native`` the linear
    weights of the types in ``specc.models.qweights.SUPPORTED`` as ``QuantWeight`` (the checkpoint's
    codes; norms and dense types stay fp32). Raises ``CheckpointError`` when the file is not GGUF or is
    truncated, its architecture or a tensor's quantization is unsupported, or tensors are unknown."""
    from specc.models.qweights import DENSE, QuantWeight

    reader = _open_reader(path)
    _check_sizes(reader, path)
    src = str(path)
    config = config_from_gguf(reader, src, max_model_len)
    state: Dict[str, torch.Tensor] = {}
    rope_factors = None
    for t in reader.tensors:
        name = t.name
        if native and t.tensor_type.name not in DENSE and name.endswith(".weight") and len(t.shape) == 2:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            try:
                qw = QuantWeight.from_gguf(name, t.tensor_type.name, np.asarray(t.data), shape)
            except CheckpointError as exc:
                raise CheckpointError(f"{src}: {exc}") from None
            parts = name.split(".", 2)
            if name in _GLOBAL_NAMES:
                state[_GLOBAL_NAMES[name]] = qw
                continue
            if parts[0] != "blk" or len(parts) != 3 or parts[2] not in _LAYER_NAMES:
                raise CheckpointError(f"{src}: unexpected GGUF tensor {name!r} (not a Llama/Qwen2 decoder tensor)")
            heads = {"attn_q.weight": config.num_heads, "attn_k.weight": config.num_kv_heads}.get(parts[2])
            if config.architecture == "llama" and heads:
                qw = qw.take_rows(torch.from_numpy(reverse_permute(np.arange(shape[0]), heads).copy()))
            state[f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"] = qw
            continue
        arr = dequantize_tensor(t, src)
        if name == "rope_freqs.weight":
            rope_factors = arr.reshape(-1)
            continue
        if name in _GLOBAL_NAMES:
            state[_GLOBAL_NAMES[name]] = torch.from_numpy(arr)
            continue
        parts = name.split(".", 2)
        if parts[0] != "blk" or len(parts) != 3 or parts[2] not in _LAYER_NAMES:
            raise CheckpointError(f"{src}: unexpected GGUF tensor {name!r} (not a Llama/Qwen2 decoder tensor)")
        if config.architecture == "llama" and parts[2] in ("attn_q.weight", "attn_q.bias"):
            arr = reverse_permute(arr, config.num_heads)
        elif config.architecture == "llama" and parts[2] in ("attn_k.weight", "attn_k.bias"):
            arr = reverse_permute(arr, config.num_kv_heads)
        state[f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"] = torch.from_numpy(np.ascontiguousarray(arr))
    if rope_factors is not None:
        config = config.replace(rope_scaling={"rope_type": "gguf_factors",
                                              "factors": [float(x) for x in rope_factors]})
    return config, state


def _write_cache(cache: pathlib.Path, model, tokenizer, source: pathlib.Path) -> None:
    """Write the cache directory atomically (temp dir + rename; a failure leaves no partial cache):
    ``config.json`` (HF layout), ``specc_native.safetensors`` (``LlamaModel.native_state_dict``: the
    fused, transposed fp32 tensors the CPU path computes with, so loading copies nothing) and the
    tokenizer files."""
    from safetensors.torch import save_file

    def weights(tmp: pathlib.Path) -> None:
        save_file(model.native_state_dict(), str(tmp / NATIVE_WEIGHTS))
    _write_cache_dir(cache, weights, model, tokenizer, {"source": str(source), "version": CACHE_VERSION})


def _write_cache_dir(cache: pathlib.Path, write_weights, model, tokenizer, marker: dict) -> None:
    """Write a cache directory atomically: ``write_weights(tmp)``, ``config.json``, the tokenizer files and
    the marker, in a temporary directory renamed into place (a failure removes it: no partial cache; a
    process that lost the race to another discards its copy)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
    try:
        write_weights(tmp)
        (tmp / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=1))
        tokenizer.save(tmp)
        (tmp / CACHE_MARKER).write_text(json.dumps(marker))
        try:
            os.rename(tmp, cache)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_cache(cache: pathlib.Path, max_model_len: Optional[int], dtype: torch.dtype, device):
    from safetensors.torch import load_file

    from specc.models.config import read_hf_config
    from specc.models.llama import LlamaModel
    from specc.models.tokenizer import load_tokenizer
    config = read_hf_config(cache)
    config = config.replace(max_model_len=int(max_model_len or config.max_position_embeddings))
    model = LlamaModel.from_native_state_dict(config, load_file(str(cache / NATIVE_WEIGHTS)), str(cache))
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        model = model.to(device=device, dtype=dtype)
    else:
        model.use_cpu_fast()
    tok = load_tokenizer(cache, extra_eos_ids=config.eos_token_ids, fast_class=True)
    return model, tok


def _write_native_cache(cache: pathlib.Path, model, tokenizer, source: pathlib.Path) -> None:
    """The native path's cache directory, written atomically like :func:`_write_cache`: ``config.json``,
    ``specc_qweights.safetensors`` (``qweights.native_tensors``: the repacked codes and fp32 scales, with
    each linear's layout in the file's metadata) and the tokenizer files."""
    from safetensors.torch import save_file

    from specc.models.qweights import native_tensors

    def weights(tmp: pathlib.Path) -> None:
        tensors, meta = native_tensors(model)
        save_file(tensors, str(tmp / NATIVE_QWEIGHTS), metadata=meta)
    _write_cache_dir(cache, weights, model, tokenizer, {"source": str(source), "version": CACHE_VERSION, "native": True})


_ST_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64}


def mapped_safetensors(path: pathlib.Path) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file as views of a private memory map of it (no copy: pages are read
    as they are touched and leave the process with the last view, so repacking the weights never holds
    two copies in memory). The format: an 8-byte little-endian header length, a JSON header of
    ``name -> {dtype, shape, data_offsets}``, then the data (huggingface/safetensors' format spec).
    Raises ``CheckpointError`` for a malformed file or an unsupported dtype."""
    import mmap
    import struct

    try:
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, struct.error) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    data = torch.frombuffer(mm, dtype=torch.uint8) if len(mm) else torch.empty(0, dtype=torch.uint8)
    out: Dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES.get(info.get("dtype"))
        lo, hi = info["data_offsets"]
        if dt is None or 8 + n + hi > len(mm):
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {info.get('dtype')} or lies past the file's end")
        out[name] = data[8 + n + lo: 8 + n + hi].view(dt).view(info["shape"])
    return out


def _load_native_cache(cache: pathlib.Path, max_model_len: Optional[int]):
    from safetensors import safe_open

    from specc.models.config import read_hf_config
    from specc.models.llama import configure_cpu_threads
    from specc.models.qweights import model_from_native_tensors
    from specc.models.tokenizer import load_tokenizer
    config = read_hf_config(cache)
    config = config.replace(max_model_len=int(max_model_len or config.max_position_embeddings))
    with safe_open(str(cache / NATIVE_QWEIGHTS), "pt") as fh:
        meta = fh.metadata() or {}
    model = model_from_native_tensors(config, mapped_safetensors(cache / NATIVE_QWEIGHTS), meta, str(cache))
    configure_cpu_threads()
    tok = load_tokenizer(cache, extra_eos_ids=config.eos_token_ids, fast_class=True)
    release_free_memory()
    return model, tok


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; nothing elsewhere): loading
    frees its temporaries in pieces the allocator would otherwise keep resident."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load_gguf_native(path: pathlib.Path, max_model_len: Optional[int] = None, use_cache: bool = True):
    """``(LlamaModel, Tokenizer)`` with the linear weights in the checkpoint's own codes (``QuantLinear``,
    ``specc.models.qweights``), on the CPU, fp32 activations. Cached like the fp32 path (its own
    directory: ``cache_dir_for(path, native=True)``). Raises ``CheckpointError`` as :func:`load_gguf`,
    and for a tensor type outside ``qweights.SUPPORTED`` (naming the type, the tensor and the types)."""
    from specc.models.llama import configure_cpu_threads
    from specc.models.qweights import build_native_model
    from specc.models.tokenizer import check_vocab, load_tokenizer

    cache = cache_dir_for(path, native=True) if use_cache else None
    if cache is not None and (cache / CACHE_MARKER).is_file():
        try:
            return _load_native_cache(cache, max_model_len)
        except (CheckpointError, OSError, ValueError):
            shutil.rmtree(cache, ignore_errors=True)  # a damaged cache is rebuilt from the GGUF
    config, state = read_gguf(path, max_model_len, native=True)
    tok = load_tokenizer(path.parent, gguf_file=path.name, extra_eos_ids=config.eos_token_ids)
    check_vocab(tok, config.vocab_size, str(path))
    model = build_native_model(config, state, str(path))
    del state
    configure_cpu_threads()
    if cache is not None:
        try:
            _write_native_cache(cache, model, tok, path)
        except OSError:
            pass  # a read-only home is no reason to fail the load
    release_free_memory()
    return model, tok


def load_gguf(path: str | pathlib.Path, dtype: "torch.dtype | str" = torch.float32, max_model_len: Optional[int] = None,
              device: str | torch.device = "cpu", use_cache: bool = True):
    """``(LlamaModel, Tokenizer)`` from a GGUF file (see the module docstring for the cache).
    ``dtype="native"`` keeps the linear weights in the file's own codes (:func:`load_gguf_native`; CPU
    only); a torch dtype dequantizes them to it.

    Raises ``CheckpointError`` for a missing/foreign/truncated file, unsupported architecture or
    quantization, ``native`` off the CPU, or a tokenizer whose vocabulary does not fit the embedding table."""
    from specc.models.hf_loader import build_model
    from specc.models.tokenizer import check_vocab, load_tokenizer

    path = pathlib.Path(path)
    if not path.is_file():
        if path.exists():
            from specc.io import file_kind

            raise CheckpointError(f"{path}: is {file_kind(path.stat().st_mode)}, not a GGUF file; set target.path "
                                  f"to a .gguf file or an HF checkpoint directory")
        raise CheckpointError(f"{path}: GGUF file not found")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise CheckpointError(f"{path}: not a GGUF file (no GGUF magic); pass --format hf for a directory")
    if dtype == "native":
        if torch.device(device).type != "cpu":
            raise CheckpointError(f"{path}: dtype native (the file's own quantized weights) runs on the CPU; "
                                  f"set target dtype: bfloat16 or float16 for {device}")
        return load_gguf_native(path, max_model_len, use_cache)
    cache = cache_dir_for(path) if use_cache else None
    if cache is not None and (cache / CACHE_MARKER).is_file():
        try:
            return _load_cache(cache, max_model_len, dtype, device)
        except CheckpointError:
            shutil.rmtree(cache, ignore_errors=True)  # a damaged cache is rebuilt from the GGUF
    config, state = read_gguf(path, max_model_len)
    tok = load_tokenizer(path.parent, gguf_file=path.name, extra_eos_ids=config.eos_token_ids)
    check_vocab(tok, config.vocab_size, str(path))
    model = build_model(config, state, str(path))  # fp32 CPU
    del state
    if cache is not None and sum(p.numel() * 4 for p in model.parameters()) <= CACHE_LIMIT_BYTES:
        try:
            _write_cache(cache, model, tok, path)
        except OSError:
            pass  # a read-only home is no reason to fail the load
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        model = model.to(device=device, dtype=dtype)
    return model, tok
