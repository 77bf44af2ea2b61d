"""Target model family (our Llama-family decoder), checkpoint loaders and tokenizers.

``load_target(path, format, dtype="float32", max_model_len=None) -> (LlamaModel, Tokenizer)`` is the
entry point; ``path`` may be ``pkg://<package>/<file>`` (see ``specc.models.resolve``).
"""
from __future__ import annotations

import pathlib
from typing import Optional, Tuple

from specc.errors import CheckpointError

FORMATS = ("gguf", "hf", "auto")


def _dtype(name):
    import torch
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if isinstance(name, torch.dtype) or name == "native":
        return name
    if name not in table:
        raise CheckpointError(f"dtype {name!r} is not supported (one of {', '.join(table)})")
    return table[name]


def torch_device_type(device) -> str:
    """``"cpu"``, ``"cuda"``, … of a device name or ``torch.device``."""
    return str(device).split(":", 1)[0]


def load_target(path: str | pathlib.Path, format: str = "auto", dtype="float32",
                max_model_len: Optional[int] = None, device: str = "cpu") -> Tuple["LlamaModel", "Tokenizer"]:
    """Load a target model and its tokenizer.

    Args:
      path: a GGUF file, an HF checkpoint directory, or ``pkg://<package>/<relpath>``.
      format: ``"gguf"``, ``"hf"`` or ``"auto"`` (a ``.gguf`` file vs a directory).
      dtype: weight/compute dtype name (``"float32"`` on CPU), or ``"native"``: the checkpoint's own
        bytes with fp32 activations on the CPU (``specc.models.qweights``): a GGUF's linear weights in
        its quantized codes, an HF checkpoint's float16 / bfloat16 linear weights as they are (its
        fp32 tensors stay fp32; off the CPU an HF checkpoint loads as ``float32``).
      max_model_len: KV-cache length limit; default the checkpoint's context length.
    Returns ``(LlamaModel, Tokenizer)``; the model is in eval mode, without a cache (call
    ``setup_cache``). Raises ``CheckpointError`` for missing/malformed/unsupported checkpoints and a
    tokenizer that does not fit the vocabulary.
    """
    from specc.models.resolve import resolve_model_path

    p = resolve_model_path(path)
    if format not in FORMATS:
        raise CheckpointError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if format == "auto":
        format = "hf" if p.is_dir() else "gguf"
    dt = _dtype(dtype)
    if format == "gguf":
        from specc.models.gguf_loader import load_gguf
        if p.is_dir():
            raise CheckpointError(f"{p}: is a directory; format gguf needs a .gguf file (or use format hf)")
        return load_gguf(p, dtype=dt, max_model_len=max_model_len, device=device)
    from specc.models.hf_loader import load_hf
    from specc.models.tokenizer import check_vocab, load_tokenizer
    if not p.is_dir():
        raise CheckpointError(f"{p}: format hf needs a checkpoint directory (config.json + *.safetensors)")
    if dt == "native" and torch_device_type(device) == "cpu":
        from specc.models.hf_loader import load_hf_native
        model = load_hf_native(p, max_model_len=max_model_len)
    else:
        model = load_hf(p, dtype=_dtype("float32") if dt == "native" else dt, max_model_len=max_model_len,
                        device=device)
    tok = load_tokenizer(p, extra_eos_ids=model.config.eos_token_ids)
    check_vocab(tok, model.config.vocab_size, str(p))
    return model, tok


def __getattr__(name):  # lazy re-exports keep `import specc.models` free of torch
    if name in ("LlamaModel", "prefill", "pad_prompts"):
        from specc.models import llama
        return getattr(llama, name)
    if name == "LlamaConfig":
        from specc.models.config import LlamaConfig
        return LlamaConfig
    if name == "Tokenizer":
        from specc.models.tokenizer import Tokenizer
        return Tokenizer
    if name == "resolve_model_path":
        from specc.models.resolve import resolve_model_path
        return resolve_model_path
    raise AttributeError(name)
