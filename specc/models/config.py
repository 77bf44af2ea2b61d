"""The Llama-family model configuration: plain data, kept apart from the module code (gpt-fast's
``ModelArgs``, meta-pytorch/gpt-fast ``model.py:34-55``). Parsed from a Hugging Face ``config.json``
(transformers 4.x keys
``rope_theta``/``rope_scaling`` or 5.x ``rope_parameters``) or from GGUF metadata, and written back in
HF layout so that a cached or derived checkpoint (the dequantized-GGUF cache, the shallow drafter)
loads through the ordinary HF loader.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from specc.errors import CheckpointError

#: HF ``architectures`` entries we implement, mapped to our ``architecture`` name.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
#: model_type -> HF architecture class name (for writing config.json back).
_HF_CLASS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
#: rope types whose inverse frequencies we compute (transformers' ``modeling_rope_utils``; ``gguf_factors``
#: is llama.cpp's per-frequency divisor tensor ``rope_freqs.weight``).
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "gguf_factors")


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and numerics of a Llama-family decoder.

    Fields follow HF names where one exists. ``num_layers`` is HF's ``num_hidden_layers``;
    ``num_kv_heads`` is ``num_key_value_heads`` (GQA when smaller than ``num_heads``);
    ``attention_bias`` adds a bias to q/k/v (Qwen2 has it, ``o_proj`` never does);
    ``rope_scaling`` is ``None`` or a dict with ``rope_type`` in ``SUPPORTED_ROPE_TYPES`` and that
    type's parameters; ``max_model_len`` is the KV-cache length the runtime may allocate
    (defaults to ``max_position_embeddings``).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    max_position_embeddings: int = 2048
    max_model_len: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    architecture: str = "llama"
    bos_token_id: Optional[int] = None
    eos_token_ids: Tuple[int, ...] = ()
    pad_token_id: Optional[int] = None
    name: str = ""
    extra: Dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads="
                f"{self.num_kv_heads}; the checkpoint's config is inconsistent")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise CheckpointError(
                f"head_dim={self.head_dim} (hidden_size / num_attention_heads unless the config sets "
                f"head_dim): rotary embeddings rotate pairs of dimensions, so it must be a positive even "
                f"number; the checkpoint's config is inconsistent")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(
                f"rope_scaling type {rope_type!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ROPE_TYPES)})")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> "LlamaConfig":
        """A copy with ``changes`` applied (e.g. ``num_layers`` for a shallow drafter)."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- HF config.json
    @classmethod
    def from_hf_dict(cls, d: Dict[str, Any], source: str = "config.json",
                     max_model_len: Optional[int] = None) -> "LlamaConfig":
        """Parse an HF ``config.json`` dict. Raises ``CheckpointError`` naming ``source`` on an
        unsupported architecture, a missing key or an unsupported rope type."""
        archs = d.get("architectures") or []
        model_type = d.get("model_type")
        arch = None
        for a in archs:
            if a in SUPPORTED_ARCHITECTURES:
                arch = SUPPORTED_ARCHITECTURES[a]
        if arch is None and not archs and model_type in _HF_CLASS:
            arch = model_type
        if arch is None:
            raise CheckpointError(
                f"{source}: architecture {archs or model_type!r} is not supported; specc runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)} checkpoints")
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            layers = int(d["num_hidden_layers"])
            inter = int(d["intermediate_size"])
            vocab = int(d["vocab_size"])
        except KeyError as exc:
            raise CheckpointError(f"{source}: missing required key {exc.args[0]!r}") from None
        if d.get("hidden_act", "silu") not in ("silu", "swish"):
            raise CheckpointError(f"{source}: hidden_act={d.get('hidden_act')!r} is not supported (silu only)")
        if d.get("mlp_bias"):
            raise CheckpointError(f"{source}: mlp_bias=true is not supported")
        kv_heads = int(d.get("num_key_value_heads") or heads)
        head_dim = int(d.get("head_dim") or hidden // heads)
        rope = dict(d.get("rope_parameters") or {})
        theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = d.get("rope_scaling") or None
        if scaling is None and rope:
            scaling = rope
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.pop("type", "default"))
            scaling.pop("rope_theta", None)
            if scaling["rope_type"] == "default":
                scaling = None
        max_pos = int(d.get("max_position_embeddings", 2048))
        sliding = d.get("sliding_window") if d.get("use_sliding_window", arch == "mistral") else None
        limit = max_model_len or max_pos
        if sliding is not None and int(sliding) < limit:
            raise CheckpointError(
                f"{source}: sliding_window={sliding} is shorter than max_model_len={limit}; sliding-window "
                f"attention is not supported (set max_model_len <= {sliding})")
        eos = d.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None)
        attention_bias = bool(d.get("attention_bias", arch == "qwen2"))
        try:
            return cls(
                vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
                max_position_embeddings=max_pos, max_model_len=int(limit),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=attention_bias, architecture=arch,
                bos_token_id=d.get("bos_token_id"), eos_token_ids=eos_ids, pad_token_id=d.get("pad_token_id"),
                name=str(d.get("_name_or_path", "")),
            )
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None

    def to_hf_dict(self) -> Dict[str, Any]:
        """An HF ``config.json`` dict (transformers 4.x keys, which 5.x also reads)."""
        d: Dict[str, Any] = {
            "architectures": [_HF_CLASS[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float32",
        }
        if self.architecture == "qwen2":
            d["use_sliding_window"] = False
        if self.architecture == "mistral":
            d["sliding_window"] = None
        return d


def read_hf_config(directory: pathlib.Path, max_model_len: Optional[int] = None) -> LlamaConfig:
    """Read ``directory/config.json``. Raises ``CheckpointError`` if it is missing or not JSON."""
    path = pathlib.Path(directory) / "config.json"
    if not path.exists():  # a FIFO or device is refused by read_bounded
        raise CheckpointError(f"{directory}: no config.json; an HF checkpoint directory needs config.json "
                              f"and *.safetensors")
    from specc.io import CONFIG_JSON_LIMIT, read_bounded

    text = read_bounded(path, CONFIG_JSON_LIMIT, "checkpoint config", error=CheckpointError)
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: not a JSON object; an HF config.json maps keys to values")
    return LlamaConfig.from_hf_dict(d, source=str(path), max_model_len=max_model_len)
