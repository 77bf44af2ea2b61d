"""Medusa heads: κ residual heads over the target's last hidden state, and their published layouts.

Architecture (Cai et al. 2024, "Medusa"; facts from FasterDecoding/Medusa ``medusa/model/medusa_model.py``
and vLLM's ``model_executor/models/medusa.py``; our own code): head k (0-based) maps the target's
final-norm hidden state ``h_t`` at position t through ``num_layers`` residual blocks
``x <- x + SiLU(W x + b)`` and an LM head to logits for the token at position ``t + k + 2`` (the
target's own LM head predicts ``t + 1``). Medusa-1 trains the heads on a frozen target; its LM heads
start as copies of the target's.

Layouts read by :func:`load_medusa_heads` (a directory):

* **FasterDecoding** (``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt``, ``config.json`` with
  ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``): the state dict of the
  ``medusa_head`` module list, keys ``{k}.{j}.linear.weight|bias`` (residual blocks) and ``{k}.{L}.weight``
  (LM head ``[V, H]``), optionally prefixed ``medusa_head.``.
* **vLLM** (``model.safetensors`` or ``pytorch_model.bin``, ``config.json`` with ``num_heads``,
  ``num_hidden_layers``, ``hidden_size``, ``vocab_size``, ``medusa_fc_bias``, ``original_lm_head``,
  ``truncated_vocab_size``; vLLM's config also maps ``medusa_num_heads``/``medusa_num_layers``): keys
  ``blocks.{k}.layers.{j}.weight|bias`` and ``lm_heads.{k}.weight``, or with ``original_lm_head: true``
  one ``lm_head.weight`` (vLLM also reads it as ``lm_heads.0.weight``) shared by every head, optionally
  prefixed ``medusa_heads.``.

specc writes the vLLM layout (:func:`save_medusa_heads`). With ``original_lm_head: true`` and no LM
head tensor in the file, the heads share the **target's** LM head, bound at load: SmolLM2-135M's is
49152 x 576 (113 MB in fp32), which a shipped drafter does not need to copy. A reduced draft
vocabulary (``truncated_vocab_size`` < ``vocab_size`` with a ``token_map``) is refused.
"""
from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from specc.errors import CheckpointError

FASTERDECODING_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
VLLM_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class MedusaConfig:
    """Shape of a set of Medusa heads: ``num_heads`` heads of ``num_layers`` residual blocks over
    ``hidden_size``; ``vocab_size`` the target's; ``fc_bias`` (the blocks' bias; FasterDecoding always
    has one, vLLM's ``medusa_fc_bias``); ``shared_lm_head`` (vLLM ``original_lm_head``: one LM head for
    every head, the target's when the checkpoint holds none)."""

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    fc_bias: bool = True
    shared_lm_head: bool = True


class ResidualBlock(nn.Module):
    """``x + SiLU(W x + b)``; ``[..., H] -> [..., H]`` (Medusa's ``ResBlock``)."""

    def __init__(self, hidden: int, bias: bool = True):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaModel(nn.Module):
    """The heads. ``target_lm_head`` (``[..., H] -> [..., V]``) is used by every head when
    ``cfg.shared_lm_head`` and the checkpoint holds no LM head; held as a plain callable, so
    ``state_dict()`` holds the heads' own weights only.

    ``blocks[k]`` is head k's residual stack; ``lm_heads`` (own LM heads, ``[V, H]`` each) is empty
    when they are shared; ``lm_head`` is a shared head of the checkpoint's own (vLLM
    ``original_lm_head`` with its tensor), else None.
    """

    def __init__(self, cfg: MedusaConfig, target_lm_head: Optional[Callable] = None, own_lm_heads: bool = False,
                 own_shared_lm_head: bool = False):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(nn.Sequential(*[ResidualBlock(cfg.hidden_size, cfg.fc_bias)
                                                    for _ in range(cfg.num_layers)])
                                    for _ in range(cfg.num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
                                      for _ in range(cfg.num_heads if own_lm_heads else 0))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if own_shared_lm_head else None
        self._target_lm_head = target_lm_head

    def hidden(self, h: torch.Tensor, num_heads: Optional[int] = None) -> torch.Tensor:
        """Each head's residual output: ``h [..., H]`` -> ``[..., K, H]`` for the first ``num_heads``
        heads (default all)."""
        k = self.cfg.num_heads if num_heads is None else int(num_heads)
        return torch.stack([self.blocks[i](h) for i in range(k)], dim=-2)

    def logits(self, h: torch.Tensor, num_heads: Optional[int] = None) -> torch.Tensor:
        """Head logits ``[..., K, V]`` fp32 from the target's final-norm hidden state ``h [..., H]``."""
        x = self.hidden(h, num_heads)  # [..., K, H]
        if len(self.lm_heads):
            return torch.stack([self.lm_heads[i](x[..., i, :]) for i in range(x.shape[-2])], dim=-2).float()
        if self.lm_head is not None:
            return self.lm_head(x).float()
        if self._target_lm_head is None:
            raise ValueError("these Medusa heads share the target's LM head: build them with target_lm_head")
        return self._target_lm_head(x).float()

    def init_identity(self, lm_weight: Optional[torch.Tensor] = None) -> "MedusaModel":
        """Medusa's initialisation: residual blocks start as the identity (zero weights and biases) and
        own LM heads as copies of ``lm_weight`` ``[V, H]`` (the target's)."""
        with torch.no_grad():
            for stack in self.blocks:
                for blk in stack:
                    blk.linear.weight.zero_()
                    if blk.linear.bias is not None:
                        blk.linear.bias.zero_()
            for lin in list(self.lm_heads) + ([self.lm_head] if self.lm_head is not None else []):
                if lm_weight is not None:
                    lin.weight.copy_(lm_weight)
        return self


# ------------------------------------------------------------------------------------------ layouts

def _read(path: pathlib.Path) -> Dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            sd = dict(load_file(str(path)))
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated, pickled code
        raise CheckpointError(f"{path}: cannot read the weights ({type(exc).__name__}: {exc})") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: expected a flat dict of tensors (a state_dict)")
    return sd


def _config(directory: pathlib.Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json (Medusa heads need config.json with medusa_num_heads "
                              f"or num_heads, and the weights)")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return cfg


def _int(cfg: dict, keys, source: str, default=None) -> int:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            try:
                return int(cfg[k])
            except (TypeError, ValueError):
                raise CheckpointError(f"{source}: config.json {k}={cfg[k]!r} is not an integer") from None
    if default is not None:
        return default
    raise CheckpointError(f"{source}: config.json lacks {' or '.join(keys)}")


def load_medusa_heads(path, target_config, target_lm_head: Optional[Callable] = None) -> MedusaModel:
    """Load Medusa heads in the FasterDecoding or vLLM layout (module docstring) for a target.

    Args:
        path: the heads' directory. target_config: the target's ``LlamaConfig`` (hidden size, vocabulary).
        target_lm_head: the target's LM head (``[..., H] -> [..., V]``), used when the heads share it.
    Returns: an eval-mode :class:`MedusaModel`.
    Raises:
        CheckpointError: a missing or unreadable file, a missing config field, a hidden size or
            vocabulary that differs from the target's, a reduced draft vocabulary, missing or
            mis-shaped tensors, or tensors no head uses (naming the file and the fix).
    """
    directory = pathlib.Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: Medusa heads are a directory (config.json + weights)")
    cfg = _config(directory)
    src = str(directory)
    fd = next((directory / f for f in FASTERDECODING_FILES if (directory / f).is_file()), None)
    vl = next((directory / f for f in VLLM_FILES if (directory / f).is_file()), None)
    if fd is None and vl is None:
        raise CheckpointError(f"{directory}: no weights ({', '.join(FASTERDECODING_FILES + VLLM_FILES)})")
    hidden, vocab = int(target_config.hidden_size), int(target_config.vocab_size)
    heads = _int(cfg, ("num_heads", "medusa_num_heads"), src)
    layers = _int(cfg, ("num_hidden_layers", "medusa_num_layers"), src, default=1)
    if heads < 1 or layers < 0:
        raise CheckpointError(f"{src}: config.json num_heads={heads}, num_hidden_layers={layers}: need >= 1 head")
    for key, want in (("hidden_size", hidden), ("vocab_size", vocab)):
        if key in cfg and cfg[key] is not None and int(cfg[key]) != want:
            raise CheckpointError(f"{src}: config.json {key}={cfg[key]} but the target has {want}; these heads were "
                                  f"trained for another model")
    trunc = cfg.get("truncated_vocab_size")
    if trunc is not None and int(trunc) < vocab:
        raise CheckpointError(f"{src}: truncated_vocab_size={trunc} < vocab_size={vocab}: reduced Medusa draft "
                              f"vocabularies (token_map) are not supported by specc; use full-vocabulary heads")
    if fd is not None:
        sd = {re.sub(r"^medusa_head\.", "", k): v for k, v in _read(fd).items()}
        mapped: Dict[str, torch.Tensor] = {}
        for k, v in sd.items():
            m = re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", k)
            if m:
                mapped[f"blocks.{m[1]}.{m[2]}.linear.{m[3]}"] = v
                continue
            m = re.fullmatch(r"(\d+)\.(\d+)\.weight", k)
            if m and int(m[2]) == layers:
                mapped[f"lm_heads.{m[1]}.weight"] = v
                continue
            mapped[k] = v  # reported as unexpected below
        bias = any(k.endswith(".bias") for k in mapped)
        shared, own, own_shared, where = False, True, False, fd
    else:
        sd = {re.sub(r"^medusa_heads\.", "", k): v for k, v in _read(vl).items()}
        sd.pop("token_map", None)
        mapped = {}
        for k, v in sd.items():
            m = re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", k)
            mapped[f"blocks.{m[1]}.{m[2]}.linear.{m[3]}" if m else k] = v
        bias = bool(cfg.get("medusa_fc_bias", False))
        shared = bool(cfg.get("original_lm_head", False))
        if shared and "lm_heads.0.weight" in mapped and "lm_head.weight" not in mapped:
            mapped["lm_head.weight"] = mapped.pop("lm_heads.0.weight")
        own = not shared
        own_shared = shared and "lm_head.weight" in mapped
        where = vl
    mcfg = MedusaConfig(num_heads=heads, num_layers=layers, hidden_size=hidden, vocab_size=vocab, fc_bias=bias,
                        shared_lm_head=shared)
    model = MedusaModel(mcfg, target_lm_head, own_lm_heads=own, own_shared_lm_head=own_shared)
    if shared and not own_shared and target_lm_head is None:
        raise CheckpointError(f"{src}: the heads share the target's LM head (original_lm_head, none stored); "
                              f"pass the target's LM head")
    want = model.state_dict()
    missing = sorted(set(want) - set(mapped))
    extra = sorted(set(mapped) - set(want))
    if missing or extra:
        raise CheckpointError(f"{where}: tensors do not match {heads} heads x {layers} blocks "
                              f"(missing {missing[:4]}, unexpected {extra[:4]}); check medusa_num_heads / "
                              f"num_hidden_layers in config.json")
    for k, t in want.items():
        if tuple(mapped[k].shape) != tuple(t.shape):
            raise CheckpointError(f"{where}: tensor {k} has shape {tuple(mapped[k].shape)}, expected {tuple(t.shape)} "
                                  f"(target hidden {hidden}, vocabulary {vocab})")
    model.load_state_dict({k: v.float() for k, v in mapped.items()})
    return model.eval()


def config_dict(model: MedusaModel) -> dict:
    """vLLM's Medusa ``config.json`` for ``model`` (``MedusaConfig``: ``model_type`` medusa)."""
    c = model.cfg
    return {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.num_layers,
            "medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers, "medusa_fc_bias": c.fc_bias,
            "original_lm_head": c.shared_lm_head, "truncated_vocab_size": c.vocab_size}


def save_medusa_heads(model: MedusaModel, directory, dtype: torch.dtype = torch.float32,
                      extra_config: Optional[dict] = None) -> List[str]:
    """Write ``model`` in vLLM's layout (``config.json`` + ``model.safetensors``: ``blocks.{k}.layers.{j}``,
    own ``lm_heads.{k}`` or shared ``lm_head`` when the model has them; a head sharing the target's
    LM head stores none). Returns the written file names."""
    from safetensors.torch import save_file

    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, t in model.state_dict().items():
        m = re.fullmatch(r"blocks\.(\d+)\.(\d+)\.linear\.(weight|bias)", k)
        sd[f"blocks.{m[1]}.layers.{m[2]}.{m[3]}" if m else k] = t.detach().to(dtype).contiguous()
    save_file(sd, str(out / "model.safetensors"))
    cfg = config_dict(model)
    cfg.update(extra_config or {})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return ["config.json", "model.safetensors"]
