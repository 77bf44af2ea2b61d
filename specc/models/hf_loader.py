"""Load a Hugging Face checkpoint directory (config.json + single or sharded safetensors) into
``LlamaModel``. Only safetensors are read (``safetensors`` library); pickled ``*.bin`` weights are
refused because loading them runs arbitrary code."""
from __future__ import annotations

import json
import pathlib
from typing import Dict, List, Optional

import torch
from safetensors import safe_open

from specc.errors import CheckpointError
from specc.models.config import LlamaConfig, read_hf_config
from specc.models.llama import LlamaModel

INDEX_NAME = "model.safetensors.index.json"


def safetensors_files(directory: pathlib.Path) -> List[pathlib.Path]:
    """The weight files of ``directory``: the shards named by ``model.safetensors.index.json`` if it
    exists, else ``model.safetensors``, else every ``*.safetensors``. Raises ``CheckpointError`` when
    there are none or a shard named by the index is missing."""
    directory = pathlib.Path(directory)
    index = directory / INDEX_NAME
    if index.is_file():
        from specc.io import CONFIG_JSON_LIMIT, read_bounded

        text = read_bounded(index, CONFIG_JSON_LIMIT, "safetensors index", error=CheckpointError)
        try:
            weight_map = json.loads(text)["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise KeyError("weight_map must map tensor names to shard file names")
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index ({exc!r})") from None
        bad = [f for f in set(weight_map.values()) if "/" in f or "\\" in f or f in ("", ".", "..")]
        if bad:
            raise CheckpointError(f"{index} names shard(s) {sorted(bad)[:3]} outside {directory}; shards are "
                                  f"file names in the checkpoint directory")
        files = [directory / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) {missing} that are not in {directory}")
        return files
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    if list(directory.glob("*.bin")) or list(directory.glob("*.pt")):
        raise CheckpointError(f"{directory}: only pickled *.bin/*.pt weights found; specc reads safetensors only "
                              f"(convert with transformers: model.save_pretrained(dir, safe_serialization=True))")
    raise CheckpointError(f"{directory}: no *.safetensors weights found")


def read_safetensors(files: List[pathlib.Path]) -> Dict[str, torch.Tensor]:
    """All tensors of ``files`` by name. Raises ``CheckpointError`` for an unreadable file or a
    tensor that appears in two shards."""
    out: Dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    if name in out:
                        raise CheckpointError(f"{f}: tensor {name!r} also appears in another shard")
                    out[name] = fh.get_tensor(name)
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own error types for truncated/corrupt files
            raise CheckpointError(f"{f}: not a readable safetensors file ({exc})") from None
    return out


def load_hf(directory: str | pathlib.Path, dtype: torch.dtype = torch.float32,
            max_model_len: Optional[int] = None, device: str | torch.device = "cpu",
            config: Optional[LlamaConfig] = None) -> LlamaModel:
    """Build a ``LlamaModel`` from an HF checkpoint directory.

    ``dtype`` is the compute/storage dtype of the weights (fp32 on CPU). On CPU fp32 the numpy
    fast path is enabled. Raises ``CheckpointError`` for a missing directory, config or weights, an
    unsupported architecture, or tensors that do not match the config."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (an HF checkpoint is a directory with config.json "
                              f"and *.safetensors)")
    config = config or read_hf_config(directory, max_model_len=max_model_len)
    state = read_safetensors(safetensors_files(directory))
    return build_model(config, state, str(directory), dtype=dtype, device=device)


def stored_half_dtype(directory: str | pathlib.Path) -> Optional[str]:
    """``"float16"`` / ``"bfloat16"`` when that dtype holds most elements of the 2-D tensors of the
    checkpoint's safetensors files (read from their headers: nothing is loaded), else ``None``. The
    tensors decide, not ``config.json``'s ``torch_dtype``, which may say otherwise.

    Raises ``CheckpointError`` (no weight files, a bad index) and ``safetensors.SafetensorError``
    (a corrupt header)."""

    counts: Dict[str, int] = {}
    for f in safetensors_files(pathlib.Path(directory)):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                sl = st.get_slice(name)
                shape = sl.get_shape()
                if len(shape) == 2:
                    counts[sl.get_dtype()] = counts.get(sl.get_dtype(), 0) + shape[0] * shape[1]
    top = max(counts, key=counts.get) if counts else None
    return {"F16": "float16", "BF16": "bfloat16"}.get(top)


def load_hf_native(directory: str | pathlib.Path, max_model_len: Optional[int] = None) -> LlamaModel:
    """A CPU ``LlamaModel`` from an HF checkpoint directory with its float16 / bfloat16 linear weights kept
    in their own bytes (``specc.models.qweights.QuantWeight.from_half``, multiplied by
    ``specc.kernels.qgemm.h16_matmul``: fp32 activations, each weight widened to fp32 exactly) and the
    token embedding looked up from the same values; fp32 weights, norms and biases load as fp32, and so
    do 16-bit weights whose rows are not a multiple of 16 long (the kernel's block; their names are
    kept in ``model.widened`` and the load line counts them). The model's outputs are those of the fp32
    model of the same values up to summation order.

    Raises ``CheckpointError`` as :func:`load_hf`."""
    from specc.models.qweights import HALF_KINDS, QuantWeight, build_native_model

    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (an HF checkpoint is a directory with config.json "
                              f"and *.safetensors)")
    config = read_hf_config(directory, max_model_len=max_model_len)
    state: Dict[str, object] = {}
    widened = []
    for name, t in read_safetensors(safetensors_files(directory)).items():
        half = t.dtype in HALF_KINDS and t.dim() == 2
        if half and t.shape[1] % 16:
            widened.append(name)
            half = False
        state[name] = QuantWeight.from_half(name, t) if half else t
    model = build_native_model(config, state, str(directory))
    model.widened = tuple(widened)
    return model


def build_model(config: LlamaConfig, hf_state: Dict[str, torch.Tensor], source: str,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> LlamaModel:
    """``LlamaModel(config)`` filled from an HF-named state dict, moved to ``device``/``dtype``;
    CPU fp32 models get the numpy fast path."""
    model = LlamaModel(config)  # parameters are torch.empty: no init cost
    model.load_hf_state_dict(hf_state, source=source)
    model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        model.use_cpu_fast()
    return model


def to_transformers(model: LlamaModel):
    """Our ``LlamaModel`` as a transformers ``LlamaForCausalLM`` with the same fp32 weights (the
    inverse of :func:`build_model`, through ``LlamaModel.hf_state_dict``): the reference that LoRA
    adapters are trained on and checked against with ``peft``. Raises ``CheckpointError`` when
    transformers' model does not take exactly our tensors."""
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in model.config.to_hf_dict().items()
                                      if k not in ("architectures", "model_type", "torch_dtype")})
    hf = transformers.LlamaForCausalLM(cfg)
    state = {k: v.detach().clone().float() for k, v in model.hf_state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" or not cfg.tie_word_embeddings]
    if missing or unexpected:
        raise CheckpointError(f"transformers' LlamaForCausalLM does not take this model's tensors "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()
