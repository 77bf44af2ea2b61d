"""The frozen-KV MTP assistant: a drafter that owns no KV cache and reads the target's, for a
Llama-family target.

The mechanism is the Gemma-4 assistant's (``Gemma4AssistantForCausalLM``; facts from vLLM
``vllm/model_executor/models/gemma4_mtp.py`` and ``vllm/v1/spec_decode/gemma4.py``, and SGLang
``python/sglang/srt/speculative/frozen_kv_mtp_utils.py``; our own code):

* every assistant layer's attention is **Q-only**: it has ``q_proj``, ``q_norm`` and ``o_proj`` and no
  K/V projections; it attends over the KV the target already wrote, read-only, of one target layer
  (vLLM ``_setup_gemma4_kv_sharing``: "each draft decoder layer is mapped to the last non-KV-shared
  target layer of the same attention type"; a Llama target has one type, full attention, so every
  assistant layer reads the target's last layer);
* every draft step sits at the **same position**, the last slot the target wrote (SGLang
  ``set_frozen_kv_positions``: "Rope phase = last written target slot, not advanced per draft step";
  vLLM ``constant_draft_positions``): all steps attend over the same committed prefix, only the
  recurrent hidden state moves, so no draft KV is ever written and no draft-extend forward runs;
* the input is ``pre_projection([embed(token); hidden])`` (``2·H_t -> H``); the output, after the
  layers and ``model.norm``, is projected back by ``post_projection`` (``H -> H_t``) and fed to the next
  step as its ``hidden`` (vLLM's ``backbone_hidden_states``); step 0's ``hidden`` is the target's
  final-norm hidden state at the last written position.

Decoder layer (Gemma-4 layout): ``input_layernorm`` -> attention -> ``post_attention_layernorm`` ->
residual add; ``pre_feedforward_layernorm`` -> GeGLU MLP (tanh GELU) -> ``post_feedforward_layernorm``
-> residual add; times ``layer_scalar``. Adapting it to a Llama target: the target's keys carry no
``k_norm``, so attention is scaled by ``1/sqrt(head_dim)`` (Llama's) where Gemma-4 uses 1.0 after
``q_norm``/``k_norm``; the query uses the target's RoPE (rotate-half, its ``rope_theta`` and scaling) so
it lines up with the cached keys; norm weights multiply (Llama convention) rather than ``1 + w``
(Gemma's); embeddings are not scaled by ``sqrt(H)`` (Llama's are not). The logits come from the
target's LM head over the post-projected state (Gemma-4 keeps its own draft-width head; the shipped
SmolLM2 assistant has the target's width, where an own head would add ``V·H`` parameters), with the
same optional reduced draft vocabulary as :class:`specc.methods.mtp.model.SharedHead`.

Checkpoint keys: ``pre_projection.weight [H, 2·H_t]``, ``post_projection.weight [H_t, H]``,
``model.norm.weight``, and per layer ``model.layers.{i}.self_attn.{q_proj,o_proj}.weight``,
``model.layers.{i}.self_attn.q_norm.weight [head_dim]``, ``model.layers.{i}.{input_layernorm,
post_attention_layernorm,pre_feedforward_layernorm,post_feedforward_layernorm}.weight``,
``model.layers.{i}.mlp.{gate,up,down}_proj.weight``, ``model.layers.{i}.layer_scalar [1]``; ``d2t``/``t2d``
for a draft vocabulary.
"""
from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from specc.errors import CheckpointError
from specc.methods.eagle.model import RMSNorm, _cache_weights, _lin, apply_rope
from specc.methods.mtp.model import SharedHead

ASSISTANT_ARCH = "LlamaAssistantForCausalLM"
"""``architectures`` of the shipped assistant (the Gemma-4 assistant's layout for a Llama-family target)."""


@dataclass(frozen=True)
class FrozenKVConfig:
    """Shape of an assistant. ``hidden_size`` is the assistant's width H, ``backbone_hidden_size`` the
    target's H_t; ``num_key_value_heads``/``head_dim`` are the target's (its cache is read);
    ``kv_layer`` is the target layer whose KV every assistant layer reads; ``rope_theta`` /
    ``rope_scaling`` are the target's."""

    hidden_size: int
    backbone_hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    kv_layer: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    kind: str = "frozen_kv_mtp"


class QOnlyAttention(nn.Module):
    """Attention with a query projection only, over a target layer's cached K/V."""

    def __init__(self, cfg: FrozenKVConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.num_attention_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                visible: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        """``x [B, N, H]``; ``positions [B, N]`` int64 (every query's RoPE position);
        ``keys, values [B, n_kv, S, d]`` (the target's cached, roped keys); ``visible [B, N, S]`` bool.
        Returns ``[B, N, H]``. GQA: query head ``j`` reads KV head ``j // (heads / n_kv)`` (HF's
        ``repeat_kv`` order)."""
        B, N, _ = x.shape
        h, kv, d = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        q = self.q_norm(_lin(self.q_proj, x).view(B, N, h, d)).transpose(1, 2)  # [B, h, N, d]
        q = apply_rope(q, positions, inv_freq)
        g = h // kv
        qg = q.reshape(B, kv, g * N, d)  # query heads grouped under their KV head
        scores = (qg @ keys.float().transpose(-1, -2)) / math.sqrt(d)  # [B, kv, g*N, S]
        mask = visible[:, None].expand(B, g, N, -1).reshape(B, 1, g * N, -1)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        o = torch.softmax(scores.float(), dim=-1) @ values.float()  # [B, kv, g*N, d]
        o = o.view(B, h, N, d).transpose(1, 2).reshape(B, N, h * d)
        return _lin(self.o_proj, o)


class GeGLU(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))`` (Gemma's ``gelu_pytorch_tanh`` MLP)."""

    def __init__(self, cfg: FrozenKVConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _lin(self.down_proj, F.gelu(_lin(self.gate_proj, x), approximate="tanh") * _lin(self.up_proj, x))


class AssistantLayer(nn.Module):
    """One assistant decoder layer (the module docstring's Gemma-4 layout)."""

    def __init__(self, cfg: FrozenKVConfig):
        super().__init__()
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = QOnlyAttention(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = GeGLU(cfg)
        self.post_feedforward_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x, positions, keys, values, visible, inv_freq):
        """``x [B, N, H]`` -> ``[B, N, H]`` (see :meth:`QOnlyAttention.forward` for the rest)."""
        a = self.self_attn(self.input_layernorm(x), positions, keys, values, visible, inv_freq)
        x = x + self.post_attention_layernorm(a)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar


class FrozenKVAssistant(nn.Module):
    """The assistant bound to the target's embedding and LM head (held as callables, so
    ``state_dict()`` holds only the assistant's own weights).

    Args:
        cfg: its shape. embed: ids ``[B, N]`` -> ``[B, N, H_t]``. target_lm_head: ``[..., H_t] -> [..., V]``.
        target_head_weight: ``() -> [V, H_t]`` (for a draft vocabulary's rows).
        inv_freq: ``[head_dim / 2]`` fp32, the target's RoPE inverse frequencies
            (:func:`specc.models.llama.rope_inv_freq`), so the query lines up with the cached keys.
    """

    def __init__(self, cfg: FrozenKVConfig, embed: Callable, target_lm_head: Callable,
                 target_head_weight: Callable, inv_freq: torch.Tensor):
        super().__init__()
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ValueError(f"num_attention_heads={cfg.num_attention_heads} is not a multiple of the target's "
                             f"num_key_value_heads={cfg.num_key_value_heads}")
        self.cfg = cfg
        self._embed = embed
        self.pre_projection = nn.Linear(2 * cfg.backbone_hidden_size, cfg.hidden_size, bias=False)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(AssistantLayer(cfg) for _ in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_projection = nn.Linear(cfg.hidden_size, cfg.backbone_hidden_size, bias=False)
        self.register_buffer("inv_freq", inv_freq.float().clone(), persistent=False)
        if cfg.draft_vocab_size != cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.d2t = None
        self.head = SharedHead(target_lm_head, target_head_weight, None)

    def bind_head(self) -> None:
        """Point the shared head at the current ``d2t`` (after loading or setting it)."""
        self.head = SharedHead(self.head._lm_head, self.head._weight, self.d2t)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, visible: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One draft step for ``N`` queries per row.

        Args:
            tokens: ``[B, N]`` int64, the token after the position each query predicts from.
            hidden: ``[B, N, H_t]``, the target's final-norm hidden state (step 0) or the previous
                step's output.
            positions: ``[B, N]`` int64, each query's (fixed) position: the last written target slot.
            keys, values: ``[B, n_kv, S, d]``, the target layer ``cfg.kv_layer``'s cached K/V (read only).
            visible: ``[B, N, S]`` bool, which slots each query reads; default slot ``j <= position``.
        Returns: ``[B, N, H_t]`` fp32, the next step's ``hidden`` and the input of :meth:`draft_logits`.
        """
        x = _lin(self.pre_projection, torch.cat([self._embed(tokens).float(), hidden.float()], -1))
        if visible is None:
            slots = torch.arange(keys.shape[2], device=keys.device)
            visible = slots.view(1, 1, -1) <= positions.unsqueeze(-1)
        for layer in self.model.layers:
            x = layer(x, positions, keys, values, visible, self.inv_freq)
        return _lin(self.post_projection, self.model.norm(x))

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """``[..., Vd]`` fp32 logits of the shared head over ``out [..., H_t]``."""
        return self.head.logits(out)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.head.to_target(draft_ids)

    def target_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        return self.head.target_probs(draft_probs, self.cfg.vocab_size)

    def prepare_inference(self) -> "FrozenKVAssistant":
        """Eval mode and CPU weight copies for the small-row matmuls."""
        self.eval()
        for m in self.modules():
            if isinstance(m, nn.Linear):
                _cache_weights(m)
        return self


# ------------------------------------------------------------------------------------ checkpoints
_LAYER_KEYS = ("self_attn.q_proj.weight", "self_attn.q_norm.weight", "self_attn.o_proj.weight",
               "input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
               "post_feedforward_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "mlp.down_proj.weight", "layer_scalar")


def published_keys(cfg: FrozenKVConfig):
    """Every key of the assistant's own weights (the state_dict names equal the published ones)."""
    keys = ["pre_projection.weight", "post_projection.weight", "model.norm.weight"]
    keys += [f"model.layers.{i}.{k}" for i in range(cfg.num_layers) for k in _LAYER_KEYS]
    return keys


def parse_config(cfg: dict, target_config, source: str) -> FrozenKVConfig:
    """A :class:`FrozenKVConfig` from ``config.json``, checked against the target's config: the
    backbone width, vocabulary, the target's KV geometry and RoPE (the assistant reads its cache).

    Raises ``CheckpointError`` naming the field and the fix."""
    def need(key):
        if key not in cfg:
            raise CheckpointError(f"{source}: config.json lacks {key!r}")
        return cfg[key]

    t = target_config
    if int(need("vocab_size")) != t.vocab_size:
        raise CheckpointError(f"{source}: vocab_size={cfg['vocab_size']} but the target's vocabulary has "
                              f"{t.vocab_size} tokens; this assistant was trained for another target")
    if int(need("backbone_hidden_size")) != t.hidden_size:
        raise CheckpointError(f"{source}: backbone_hidden_size={cfg['backbone_hidden_size']} but the target's "
                              f"hidden size is {t.hidden_size}")
    for key, want in (("num_key_value_heads", t.num_kv_heads), ("head_dim", t.head_dim)):
        if int(cfg.get(key, want)) != want:
            raise CheckpointError(f"{source}: {key}={cfg[key]} but the target's KV cache has {want}; the assistant "
                                  f"reads the target's cache and must match its geometry")
    kv_layer = int(cfg.get("kv_source_layer", t.num_layers - 1))
    if not 0 <= kv_layer < t.num_layers:
        raise CheckpointError(f"{source}: kv_source_layer={kv_layer} is outside the target's layers 0..{t.num_layers - 1}")
    heads = int(need("num_attention_heads"))
    if heads % t.num_kv_heads:
        raise CheckpointError(f"{source}: num_attention_heads={heads} is not a multiple of the target's "
                              f"{t.num_kv_heads} KV heads")
    if cfg.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"{source}: hidden_activation={cfg.get('hidden_activation')!r} is not supported "
                              f"(gelu_pytorch_tanh)")
    vocab = int(cfg["vocab_size"])
    draft_vocab = int(cfg.get("draft_vocab_size") or vocab)
    if not 0 < draft_vocab <= vocab:
        raise CheckpointError(f"{source}: draft_vocab_size={draft_vocab} must be in 1..vocab_size={vocab}")
    return FrozenKVConfig(hidden_size=int(need("hidden_size")), backbone_hidden_size=t.hidden_size,
                          intermediate_size=int(need("intermediate_size")), num_layers=int(need("num_hidden_layers")),
                          num_attention_heads=heads, num_key_value_heads=t.num_kv_heads, head_dim=t.head_dim,
                          vocab_size=vocab, draft_vocab_size=draft_vocab, kv_layer=kv_layer,
                          rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)), rope_theta=t.rope_theta,
                          rope_scaling=t.rope_scaling)


def bind(cfg: FrozenKVConfig, target) -> FrozenKVAssistant:
    """A fresh assistant bound to ``target`` (a :class:`specc.models.llama.LlamaModel`): its
    embedding, LM head and RoPE frequencies."""
    from specc.models.llama import rope_inv_freq

    return FrozenKVAssistant(cfg, target.embed, target.lm_head, lambda: target.output.weight,
                             rope_inv_freq(target.config))


def load_assistant(path, target) -> FrozenKVAssistant:
    """Read an assistant checkpoint directory into a :class:`FrozenKVAssistant` bound to ``target``.

    Raises ``CheckpointError`` for missing/unreadable files, a config that does not fit the target,
    missing, mis-shaped or unexpected tensors, or invalid ``d2t``/``t2d``."""
    from specc.methods.eagle.loader import check_vocab_maps, read_config_json, read_weights

    directory = pathlib.Path(path)
    source = str(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{source}: not a directory; draft.path must point at an assistant checkpoint "
                              f"directory (config.json + model.safetensors)")
    raw = read_config_json(directory)
    sd = read_weights(directory)
    if any("k_proj" in k or "v_proj" in k for k in sd):
        raise CheckpointError(f"{source}: the checkpoint has K/V projections; a frozen-KV assistant attends over "
                              f"the target's KV with Q-only layers (for a drafter with its own KV use method.name: mtp)")
    cfg = parse_config(raw, target.config, source)
    model = bind(cfg, target)
    own = model.state_dict()
    with torch.no_grad():
        for key in published_keys(cfg):
            if key not in sd:
                raise CheckpointError(f"{source}: tensor {key!r} is missing (num_hidden_layers={cfg.num_layers})")
            if tuple(sd[key].shape) != tuple(own[key].shape):
                raise CheckpointError(f"{source}: tensor {key!r} has shape {tuple(sd[key].shape)}, config.json "
                                      f"implies {tuple(own[key].shape)}")
            own[key].copy_(sd[key].float())
        check_vocab_maps(sd.get("d2t"), sd.get("t2d"), cfg, source)
        if cfg.draft_vocab_size != cfg.vocab_size:
            model.d2t.copy_(sd["d2t"].long())
    extra = sorted(set(sd) - set(published_keys(cfg)) - {"d2t", "t2d"})
    if extra:
        raise CheckpointError(f"{source}: unexpected tensors {extra[:4]} for a {cfg.num_layers}-layer assistant")
    model.bind_head()
    return model.eval()


def save_assistant(model: FrozenKVAssistant, directory, dtype: torch.dtype = torch.float16,
                   target_config=None) -> pathlib.Path:
    """Write ``model``: ``config.json`` + ``model.safetensors`` (float tensors in ``dtype``; ``d2t``
    int64, ``t2d`` bool for a draft vocabulary). Returns the directory."""
    from safetensors.torch import save_file

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    own = model.state_dict()
    out = {k: own[k].detach().to(dtype).contiguous() for k in published_keys(cfg)}
    if cfg.draft_vocab_size != cfg.vocab_size:
        ids = torch.arange(cfg.draft_vocab_size) + model.d2t.cpu()
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        out["d2t"] = model.d2t.detach().cpu().long().contiguous()
        out["t2d"] = t2d
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    d = {"architectures": [ASSISTANT_ARCH], "model_type": "llama_assistant", "specc_kind": cfg.kind,
         "hidden_size": cfg.hidden_size, "backbone_hidden_size": cfg.backbone_hidden_size,
         "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
         "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
         "head_dim": cfg.head_dim, "kv_source_layer": cfg.kv_layer, "hidden_activation": "gelu_pytorch_tanh",
         "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": cfg.vocab_size, "torch_dtype": str(dtype).replace("torch.", "")}
    if cfg.draft_vocab_size != cfg.vocab_size:
        d["draft_vocab_size"] = cfg.draft_vocab_size
    if target_config is not None:
        d.update({"bos_token_id": target_config.bos_token_id, "eos_token_id": list(target_config.eos_token_ids)})
    (directory / "config.json").write_text(json.dumps(d, indent=2) + "\n")
    return directory
