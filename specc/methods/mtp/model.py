"""Multi-token-prediction (MTP / NEXTN) layers in DeepSeek-V3's published layout, for a Llama-family
target: the model of ``method.name: mtp`` and the modules of ``multi_layer_eagle``.

One MTP layer (DeepSeek-V3 Technical Report, arXiv:2412.19437, §2.2; facts from vLLM ``deepseek_mtp.py``
``DeepSeekMultiTokenPredictorLayer`` and SGLang ``deepseek_nextn.py``; our own code):

    x   = eh_proj([enorm(embed(t)); hnorm(h)])          eh_proj: 2H -> H, no bias
    y   = x + self_attn(input_layernorm(x))             one decoder block with its own KV cache
    y   = y + mlp(post_attention_layernorm(y))
    out = shared_head.norm(y)                           logits = shared_head.head(out)

``embed`` and ``shared_head.head`` are the target's embedding and LM head (shared, as DeepSeek-V3
does; the shipped checkpoints store neither). ``h`` is the target's final-norm hidden state at the
position before the token (step 0) or the layer's own previous ``out`` (later steps): the recycled
hidden is the post-norm output, matching what the target hands step 0 (vLLM's newer MTP layers apply
the output norm before recycling for the same reason).

Checkpoint layout: the ``n`` MTP layers are ``model.layers.{L + i}.*`` with ``L`` the target's layer
count (``first_layer``), ``num_nextn_predict_layers = n`` in ``config.json``, keys ``enorm.weight``,
``hnorm.weight``, ``eh_proj.weight``, ``input_layernorm.weight``, ``self_attn.{q,k,v,o}_proj.weight``,
``post_attention_layernorm.weight``, ``mlp.{gate,up,down}_proj.weight``, ``shared_head.norm.weight``
(DeepSeek-V3's Hugging Face names; ``shared_head.head.weight`` and ``embed_tokens.weight`` are
accepted when present and must equal the target's shape). Our extension: an optional reduced draft
vocabulary borrowed from EAGLE-3 (``draft_vocab_size`` in ``config.json``, ``d2t [Vd]`` int64 and
``t2d [V]`` bool tensors): the shared head is then evaluated on its rows ``d + d2t[d]`` only, which cuts
the per-token projection from ``V·H`` to ``Vd·H`` multiply-adds.

Draft positions and the KV cache follow :mod:`specc.methods.eagle.model`: the pair (hidden at ``p``, token
at ``p + 1``) sits at position ``p`` and predicts the token at ``p + 2``; KV is written by position.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from specc.errors import CheckpointError
from specc.methods.eagle.model import DraftKVCache, EagleAttention, EagleMLP, RMSNorm, _cache_weights, _lin

MTP_ARCH = "LlamaForCausalLMNextN"
"""``architectures`` of the shipped MTP checkpoints (SGLang names DeepSeek's ``DeepseekV3ForCausalLMNextN``;
ours carries the Llama-family target's name)."""

LAYER_KEYS = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "input_layernorm.weight",
              "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
              "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
              "mlp.up_proj.weight", "mlp.down_proj.weight", "shared_head.norm.weight")
"""The published keys of one MTP layer below ``model.layers.{L + i}.`` (our parameter names too)."""

SHARED_KEYS = ("shared_head.head.weight", "embed_tokens.weight")
"""Per-layer copies of the target's LM head and embedding DeepSeek-V3 stores; accepted, not required."""


@dataclass(frozen=True)
class MTPConfig:
    """Shape and numerics of ``num_layers`` MTP layers for one target.

    ``first_layer`` is the index of the first MTP layer in the published checkpoint (the target's
    decoder-layer count); ``draft_vocab_size`` is ``vocab_size`` unless the checkpoint keeps a reduced
    draft vocabulary (``d2t``). ``kind``: ``"mtp"`` (one layer run recurrently) or
    ``"multi_layer_eagle"`` (one layer per draft step). The attention fields carry the names
    :class:`specc.methods.eagle.model.EagleAttention` reads.
    """

    kind: str
    num_layers: int
    first_layer: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048


class NextNLayer(nn.Module):
    """One MTP layer (the module docstring's equations). Parameters carry the published names."""

    def __init__(self, cfg: MTPConfig):
        super().__init__()
        H = cfg.hidden_size
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = EagleAttention(cfg, H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = EagleMLP(cfg)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(H, cfg.rms_norm_eps)

    def project(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``eh_proj([enorm(emb); hnorm(hidden)])``: ``[B, N, H]`` each -> ``[B, N, H]`` fp32."""
        return _lin(self.eh_proj, torch.cat([self.enorm(emb.float()), self.hnorm(hidden.float())], -1))

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: Optional[DraftKVCache] = None, cache_slots: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``emb, hidden [B, N, H]``, ``positions [B, N]`` int64 -> ``out [B, N, H]`` fp32 (post-norm).

        Attention as :meth:`specc.methods.eagle.model.EagleAttention.forward` (cache written at
        ``cache_slots``; mask default: slot ``j`` visible iff ``j <= position``)."""
        x = self.project(emb, hidden)
        y = x + self.self_attn(self.input_layernorm(x), positions, cache, cache_slots, attn_mask)
        y = y + self.mlp(self.post_attention_layernorm(y))
        return self.shared_head.norm(y)


class SharedHead:
    """The target's LM head as a draft head, optionally restricted to a draft vocabulary.

    Args:
        target_lm_head: ``[..., H] -> [..., V]`` fp32 (the target's, used when no draft vocabulary).
        target_head_weight: ``() -> [V, H]`` the target's LM-head weight (rows gathered once for a
            draft vocabulary).
        d2t: ``[Vd]`` int64 offsets (target id = draft id + ``d2t``), or None for the full vocabulary.
    """

    def __init__(self, target_lm_head: Callable, target_head_weight: Callable, d2t: Optional[torch.Tensor]):
        self._lm_head = target_lm_head
        self._weight = target_head_weight
        self.d2t = None if d2t is None else d2t.long()
        self._sub: Optional[nn.Linear] = None

    @property
    def ids(self) -> Optional[torch.Tensor]:
        """``[Vd]`` int64 target ids of the draft vocabulary, or None (the full vocabulary)."""
        return None if self.d2t is None else torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def sub_head(self) -> nn.Linear:
        """The ``[Vd, H]`` rows of the target's LM head as a frozen ``nn.Linear`` (built on first use)."""
        if self._sub is None or self._sub.weight.device != self.d2t.device:
            with torch.inference_mode(False):  # a plain tensor (its version counter marks weight updates)
                w = self._weight().detach().float()
                rows = w[self.ids.to(w.device)].clone().contiguous()
                lin = nn.Linear(rows.shape[1], rows.shape[0], bias=False)
                lin.weight = nn.Parameter(rows, requires_grad=False)
                _cache_weights(lin)
            self._sub = lin
        return self._sub

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[..., Vd]`` fp32 of ``out [..., H]``."""
        if self.d2t is None:
            return self._lm_head(out).float()
        return _lin(self.sub_head(), out.float()) if not torch.is_grad_enabled() else F.linear(
            out.float(), self.sub_head().weight)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (identity for the full vocabulary)."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t.to(draft_ids.device)[draft_ids]

    def target_probs(self, draft_probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Scatter ``[..., Vd]`` probabilities into the target vocabulary ``[..., V]`` (zero outside)."""
        if self.d2t is None:
            return draft_probs
        out = draft_probs.new_zeros(*draft_probs.shape[:-1], vocab_size)
        out[..., self.ids.to(draft_probs.device)] = draft_probs
        return out


class MTPModel(nn.Module):
    """``cfg.num_layers`` MTP layers bound to the target's embedding and LM head.

    The EAGLE drafter's model contract (:class:`specc.methods.eagle.drafter.EagleDrafter`): ``forward``
    returns the recycled hidden, ``draft_logits``, ``draft_to_target``, ``target_probs``,
    ``new_cache``, ``prepare_inference``; ``reads_final_norm`` (the drafter feeds the target's
    final-norm output). ``embed``: ids ``[B, N]`` -> ``[B, N, H]``; ``target_lm_head``: ``[..., H] ->
    [..., V]``; ``target_head_weight``: ``() -> [V, H]``.
    """

    reads_final_norm = True

    def __init__(self, cfg: MTPConfig, embed: Callable, target_lm_head: Callable, target_head_weight: Callable):
        super().__init__()
        if cfg.num_layers < 1:
            raise ValueError(f"MTPConfig.num_layers must be >= 1, got {cfg.num_layers}")
        self.cfg = cfg
        self._embed = embed
        self.layers = nn.ModuleList(NextNLayer(cfg) for _ in range(cfg.num_layers))
        if cfg.draft_vocab_size != cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.d2t = None
        self.head = SharedHead(target_lm_head, target_head_weight, None)

    def bind_head(self) -> None:
        """Point the shared head at the current ``d2t`` (after loading or setting it)."""
        self.head = SharedHead(self.head._lm_head, self.head._weight, self.d2t)

    def new_cache(self, batch: int, max_len: int, device=None) -> DraftKVCache:
        """A zeroed KV cache of one layer for ``batch`` rows of ``max_len`` positions."""
        c = self.cfg
        return DraftKVCache(batch, c.num_key_value_heads, max_len, c.head_dim, device=device)

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: Optional[DraftKVCache] = None, cache_slots: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None, from_target: bool = True, layer: int = 0) -> torch.Tensor:
        """MTP layer ``layer`` over ``N`` pairs: ``tokens [B, N]`` int64 (the token after each hidden's
        position), ``features [B, N, H]`` (target final-norm hidden or a recycled output; the layer
        norms it with ``hnorm`` either way, so ``from_target`` changes nothing), ``positions [B, N]``.
        Returns ``out [B, N, H]`` fp32: the recycled hidden and the input of :meth:`draft_logits`."""
        emb = self._embed(tokens).float()
        return self.layers[layer](emb, features, positions, cache, cache_slots, attn_mask)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """``[..., Vd]`` fp32 logits of the shared head over ``out [..., H]``."""
        return self.head.logits(out)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.head.to_target(draft_ids)

    def target_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        return self.head.target_probs(draft_probs, self.cfg.vocab_size)

    def prepare_inference(self) -> "MTPModel":
        """Eval mode and CPU weight copies for the small-row matmuls (see ``EagleModel.prepare_inference``)."""
        self.eval()
        for m in self.modules():
            if isinstance(m, nn.Linear):
                _cache_weights(m)
        return self


# ------------------------------------------------------------------------------------ checkpoints
def parse_mtp_config(cfg: dict, target_config, kind: str, source: str) -> MTPConfig:
    """An :class:`MTPConfig` from a ``config.json`` dict, checked against the target's config.

    Raises ``CheckpointError`` for a missing field, a hidden-size or vocabulary mismatch, an
    unsupported activation or RoPE scaling, or ``num_nextn_predict_layers < 1``."""
    def need(key):
        if key not in cfg:
            raise CheckpointError(f"{source}: config.json lacks {key!r}")
        return cfg[key]

    hidden, vocab = int(need("hidden_size")), int(need("vocab_size"))
    if vocab != target_config.vocab_size:
        raise CheckpointError(f"{source}: vocab_size={vocab} but the target's vocabulary has "
                              f"{target_config.vocab_size} tokens; this head was trained for another target")
    if hidden != target_config.hidden_size:
        raise CheckpointError(f"{source}: hidden_size={hidden} but the target's is {target_config.hidden_size}; "
                              f"MTP layers share the target's embedding and head (same width)")
    n = int(cfg.get("num_nextn_predict_layers", 1))
    if n < 1:
        raise CheckpointError(f"{source}: num_nextn_predict_layers={n}: the checkpoint has no MTP layer")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise CheckpointError(f"{source}: hidden_act={cfg.get('hidden_act')!r} is not supported (silu only)")
    scaling = cfg.get("rope_scaling") or None
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default", "linear", "llama3"):
        raise CheckpointError(f"{source}: rope_scaling={scaling} is not supported (linear, llama3)")
    heads = int(need("num_attention_heads"))
    draft_vocab = int(cfg.get("draft_vocab_size") or vocab)
    if not 0 < draft_vocab <= vocab:
        raise CheckpointError(f"{source}: draft_vocab_size={draft_vocab} must be in 1..vocab_size={vocab}")
    return MTPConfig(kind=kind, num_layers=n, first_layer=int(cfg.get("first_mtp_layer", target_config.num_layers)),
                     hidden_size=hidden, intermediate_size=int(need("intermediate_size")), num_attention_heads=heads,
                     num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                     head_dim=int(cfg.get("head_dim") or hidden // heads), vocab_size=vocab,
                     draft_vocab_size=draft_vocab, rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                     rope_theta=float(cfg.get("rope_theta", 10000.0)), rope_scaling=scaling,
                     max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)))


def load_mtp(path, target, kind: str, model_cls=None):
    """Read an MTP checkpoint directory (``config.json`` + ``model.safetensors`` or its shards) into ``model_cls``
    (default :class:`MTPModel`) bound to ``target`` (a :class:`specc.models.llama.LlamaModel`).

    Raises ``CheckpointError``: missing/unreadable files, a head for another target, missing or
    mis-shaped tensors, unexpected tensors, invalid ``d2t``/``t2d`` (see
    :func:`specc.methods.eagle.loader.check_vocab_maps`)."""
    from specc.methods.eagle.loader import check_vocab_maps, read_config_json, read_weights

    directory = pathlib.Path(path)
    source = str(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{source}: not a directory; draft.path must point at an MTP checkpoint directory "
                              f"(config.json + model.safetensors)")
    cfg = parse_mtp_config(read_config_json(directory), target.config, kind, source)
    sd = read_weights(directory)
    model_cls = model_cls or MTPModel
    model = model_cls(cfg, target.embed, target.lm_head, lambda: target.output.weight)
    own = model.state_dict()
    used = set()
    V, H = cfg.vocab_size, cfg.hidden_size
    with torch.no_grad():
        for i in range(cfg.num_layers):
            prefix = f"model.layers.{cfg.first_layer + i}."
            for key in LAYER_KEYS:
                name = prefix + key
                if name not in sd:
                    raise CheckpointError(f"{source}: tensor {name!r} is missing (num_nextn_predict_layers="
                                          f"{cfg.num_layers}, first MTP layer {cfg.first_layer})")
                t = sd[name]
                if tuple(t.shape) != tuple(own[f"layers.{i}.{key}"].shape):
                    raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(t.shape)}, config.json "
                                          f"implies {tuple(own[f'layers.{i}.{key}'].shape)}")
                own[f"layers.{i}.{key}"].copy_(t.float())
                used.add(name)
            for key in SHARED_KEYS:
                t = sd.get(prefix + key)
                if t is not None:
                    if tuple(t.shape) != (V, H):
                        raise CheckpointError(f"{source}: tensor {prefix + key!r} has shape {tuple(t.shape)}, the "
                                              f"target's is {(V, H)}")
                    used.add(prefix + key)
        d2t, t2d = sd.get("d2t"), sd.get("t2d")
        check_vocab_maps(d2t, t2d, cfg, source)
        if d2t is not None and cfg.draft_vocab_size != V:
            model.d2t.copy_(d2t.long())
        used |= {"d2t", "t2d"}
    extra = sorted(k for k in sd if k not in used)
    if extra:
        raise CheckpointError(f"{source}: unexpected tensors {extra[:4]}; an MTP checkpoint holds "
                              f"num_nextn_predict_layers={cfg.num_layers} layers from model.layers.{cfg.first_layer}")
    model.bind_head()
    return model.eval()


def config_dict(cfg: MTPConfig, target_config=None, dtype: str = "float16") -> Dict:
    """The ``config.json`` of an MTP checkpoint (DeepSeek's NEXTN fields on a Llama-family config)."""
    d = {"architectures": [MTP_ARCH], "model_type": "llama", "specc_kind": cfg.kind, "hidden_act": "silu",
         "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
         "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
         "head_dim": cfg.head_dim, "num_hidden_layers": cfg.first_layer,
         "num_nextn_predict_layers": cfg.num_layers, "first_mtp_layer": cfg.first_layer,
         "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
         "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
         "tie_word_embeddings": False, "torch_dtype": dtype}
    if cfg.draft_vocab_size != cfg.vocab_size:
        d["draft_vocab_size"] = cfg.draft_vocab_size
    if target_config is not None:
        d.update({"bos_token_id": target_config.bos_token_id, "eos_token_id": list(target_config.eos_token_ids)})
    return d


SHARD_BYTES = 16 * 2**20  # a module per shard at SmolLM2's size; keeps each file small enough to commit


def _write_shards(tensors: Dict[str, torch.Tensor], directory: pathlib.Path, groups, max_bytes: int) -> None:
    """``tensors`` as ``model.safetensors``, or, past ``max_bytes``, as shards of whole ``groups``
    (name prefixes; tensors of no group go to the first shard) with the index Hugging Face writes."""
    from safetensors.torch import save_file

    from specc.models.hf_loader import INDEX_NAME

    size = lambda names: sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    for stale in list(directory.glob("model*.safetensors")) + [directory / INDEX_NAME]:
        stale.unlink(missing_ok=True)
    if size(tensors) <= max_bytes:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    shards = [[n for n in tensors if not any(n.startswith(g) for g in groups)]]
    for j, g in enumerate(groups):
        names = [n for n in tensors if n.startswith(g)]
        if j > 0 and size(shards[-1] + names) > max_bytes:
            shards.append([])
        shards[-1] += names
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
    (directory / INDEX_NAME).write_text(json.dumps(
        {"metadata": {"total_size": size(tensors)}, "weight_map": weight_map}, indent=2) + "\n")


def save_mtp(model: MTPModel, directory, dtype: torch.dtype = torch.float16, target_config=None,
             max_shard_bytes: int = SHARD_BYTES) -> pathlib.Path:
    """Write ``model`` in the published layout: ``config.json`` + ``model.safetensors`` (float
    tensors in ``dtype``; ``d2t`` int64 and ``t2d`` bool for a draft vocabulary). Past
    ``max_shard_bytes`` (bytes) the layers go to Hugging Face's sharded layout instead, whole layers
    per shard: ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``
    (``weight_map``: tensor name → shard file), which :func:`load_mtp` reads back. Returns the directory."""

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    own = model.state_dict()
    out = {f"model.layers.{cfg.first_layer + i}.{key}": own[f"layers.{i}.{key}"].detach().to(dtype).contiguous()
           for i in range(cfg.num_layers) for key in LAYER_KEYS}
    if cfg.draft_vocab_size != cfg.vocab_size:
        ids = torch.arange(cfg.draft_vocab_size) + model.d2t.cpu()
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        out["d2t"] = model.d2t.detach().cpu().long().contiguous()
        out["t2d"] = t2d
    _write_shards(out, directory, [f"model.layers.{cfg.first_layer + i}." for i in range(cfg.num_layers)],
                  max_shard_bytes)
    (directory / "config.json").write_text(json.dumps(config_dict(cfg, target_config, str(dtype).replace(
        "torch.", "")), indent=2) + "\n")
    return directory
