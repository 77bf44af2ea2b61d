"""Load and save EAGLE / EAGLE-3 heads in the published SafeAILab layouts.

Layouts (facts from the SafeAILab EAGLE repository: `eagle/model/cnets1.py`, `eagle/model/cnets.py`,
`eagle/train/EAGLE-LLaMA3-Instruct-8B.json`, `eagle/traineagle3/config.json`, `eagle/model/ea_model.py`):

* A directory with ``config.json`` (HF Llama fields: ``hidden_size``, ``intermediate_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``num_hidden_layers`` = 1, ``rms_norm_eps``,
  ``rope_theta`` (HF default 10000 when absent), ``rope_scaling``, ``vocab_size`` = the target's, plus
  ``bias`` (EAGLE's ``fc`` bias, default true as in ``ea_model.py``), ``draft_vocab_size`` and
  optional ``target_hidden_size`` (EAGLE-3)) and the weights as ``model.safetensors`` or
  ``pytorch_model.bin`` (read with ``torch.load(weights_only=True)``).
* EAGLE keys: ``fc.weight [H, 2H]`` (+ ``fc.bias``), ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``, ``layers.0.post_attention_layernorm.weight``
  (layer 0 has no ``input_layernorm``), optionally ``embed_tokens.weight`` (a copy of the target's).
* EAGLE-3 keys: ``fc.weight [H, 3·H_t]``, ``midlayer.{input_layernorm,hidden_norm,
  post_attention_layernorm}.weight``, ``midlayer.self_attn.{q,k,v}_proj.weight [., 2H]``,
  ``midlayer.self_attn.o_proj.weight``, ``midlayer.mlp.*``, ``norm.weight``, ``lm_head.weight
  [Vd, H]``, ``d2t [Vd]`` int64 (target id = draft id + ``d2t``), ``t2d [V]`` bool; ``d2t``/``t2d``
  may be absent only when ``draft_vocab_size == vocab_size``.
* EAGLE-3 capture layers: ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang/vLLM field,
  target layer *output* ids) when present, else SafeAILab's fixed ``{2, N//2, N-3}`` inputs.

Every mismatch raises :class:`specc.errors.CheckpointError` naming the file, the field and the fix.
"""
from __future__ import annotations

import json
import pathlib
from typing import Callable, Dict, Optional

import torch

from specc.errors import CheckpointError
from specc.methods.eagle.model import KINDS, EagleConfig, EagleModel, default_aux_layer_ids

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
EAGLE3_ARCH = "LlamaForCausalLMEagle3"
EAGLE_ARCH = "LlamaForCausalLMEagle"  # SGLang's class name for EAGLE heads (conf/draft presets); SafeAILab writes LlamaForCausalLM

# our parameter name -> published key, per kind (the layer is `layers.0` in EAGLE, `midlayer` in EAGLE-3)
_LAYER_KEYS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "mlp.down_proj.weight", "post_attention_layernorm.weight")
_EAGLE3_ONLY = ("input_layernorm.weight", "hidden_norm.weight")


def published_key_map(kind: str, fc_bias: bool) -> Dict[str, str]:
    """``{our state_dict name: published key}`` for ``kind`` in ``("eagle", "eagle3")``."""
    prefix = "midlayer." if kind == "eagle3" else "layers.0."
    keys = _LAYER_KEYS + (_EAGLE3_ONLY if kind == "eagle3" else ())
    m = {f"layer.{k}": prefix + k for k in keys}
    m["fc.weight"] = "fc.weight"
    if fc_bias:
        m["fc.bias"] = "fc.bias"
    if kind == "eagle3":
        m.update({"norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight"})
    return m


def _detect_kind(cfg: dict, keys, source: str) -> str:
    has_mid = any(k.startswith("midlayer.") for k in keys)
    has_layers = any(k.startswith("layers.0.") for k in keys)
    if has_mid and not has_layers:
        return "eagle3"
    if has_layers and not has_mid:
        return "eagle"
    if EAGLE3_ARCH in (cfg.get("architectures") or []) or "draft_vocab_size" in cfg:
        return "eagle3"
    raise CheckpointError(
        f"{source}: cannot tell EAGLE from EAGLE-3: expected tensors under 'layers.0.' (EAGLE) or "
        f"'midlayer.' (EAGLE-3); is this an EAGLE head?")


def read_weights(directory: pathlib.Path) -> Dict[str, torch.Tensor]:
    """The head's tensors from ``model.safetensors``, the shards named by
    ``model.safetensors.index.json`` (Hugging Face's sharded layout), or ``pytorch_model.bin`` in
    ``directory``.

    Raises ``CheckpointError`` if none exists or a file cannot be read."""
    directory = pathlib.Path(directory)
    from specc.models.hf_loader import INDEX_NAME, read_safetensors, safetensors_files

    if not (directory / WEIGHT_FILES[0]).is_file() and (directory / INDEX_NAME).is_file():
        return read_safetensors(safetensors_files(directory))
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file
                return dict(load_file(str(path)))
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt / truncated / pickled code
            raise CheckpointError(f"{path}: cannot read the weights ({type(exc).__name__}: {exc})") from None
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise CheckpointError(f"{path}: expected a flat dict of tensors (a state_dict)")
        return dict(sd)
    raise CheckpointError(f"{directory}: no {' or '.join(WEIGHT_FILES)}; an EAGLE head directory needs "
                          f"config.json and one of them")


def read_config_json(directory: pathlib.Path) -> dict:
    """``directory/config.json`` as a dict; ``CheckpointError`` if missing or not JSON."""
    path = pathlib.Path(directory) / "config.json"
    if not path.exists():  # a FIFO or device is refused by read_bounded
        raise CheckpointError(f"{directory}: no config.json (an EAGLE head directory needs config.json "
                              f"and model.safetensors or pytorch_model.bin)")
    from specc.io import CONFIG_JSON_LIMIT, read_bounded

    text = read_bounded(path, CONFIG_JSON_LIMIT, "checkpoint config", error=CheckpointError)
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: not a JSON object; config.json maps keys to values")
    return d


def parse_eagle_config(cfg: dict, kind: str, target, source: str) -> EagleConfig:
    """Build an :class:`EagleConfig` from a published ``config.json`` dict, checked against the
    target's :class:`specc.models.config.LlamaConfig`.

    Raises ``CheckpointError`` for a missing field, a hidden-size or vocabulary mismatch, or capture
    layers outside the target."""
    def need(key):
        if key not in cfg:
            raise CheckpointError(f"{source}: config.json lacks {key!r}")
        return cfg[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    vocab = int(need("vocab_size"))
    if vocab != target.vocab_size:
        raise CheckpointError(
            f"{source}: vocab_size={vocab} but the target's vocabulary has {target.vocab_size} tokens; "
            f"this head was trained for another target (tokenizer). Use a head built for this target.")
    t_hidden = int(cfg.get("target_hidden_size") or hidden)
    if t_hidden != target.hidden_size or (kind == "eagle" and hidden != target.hidden_size):
        field = "target_hidden_size" if "target_hidden_size" in cfg else "hidden_size"
        raise CheckpointError(
            f"{source}: {field}={t_hidden if kind == 'eagle3' else hidden} but the target's hidden size is "
            f"{target.hidden_size}; this head was trained for another target model.")
    draft_vocab = int(cfg.get("draft_vocab_size") or vocab) if kind == "eagle3" else vocab
    if not 0 < draft_vocab <= vocab:
        raise CheckpointError(f"{source}: draft_vocab_size={draft_vocab} must be in 1..vocab_size={vocab}")
    aux = ()
    if kind == "eagle3":
        ec = cfg.get("eagle_config") or {}
        ids = ec.get("eagle_aux_hidden_state_layer_ids")
        aux = tuple(int(i) for i in ids) if ids else default_aux_layer_ids(target.num_layers)
        if len(aux) != 3 or not all(0 <= i < target.num_layers for i in aux):
            raise CheckpointError(
                f"{source}: eagle_config.eagle_aux_hidden_state_layer_ids={list(aux)} must be 3 target layer "
                f"ids in 0..{target.num_layers - 1} (the target has {target.num_layers} layers)")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise CheckpointError(f"{source}: hidden_act={cfg.get('hidden_act')!r} is not supported (silu only)")
    scaling = cfg.get("rope_scaling") or None
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default", "linear", "llama3"):
        raise CheckpointError(f"{source}: rope_scaling={scaling} is not supported (linear, llama3)")
    return EagleConfig(
        kind=kind, hidden_size=hidden, intermediate_size=int(need("intermediate_size")),
        num_attention_heads=heads, num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads), vocab_size=vocab,
        draft_vocab_size=draft_vocab, target_hidden_size=t_hidden,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rope_scaling=scaling, max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        fc_bias=bool(cfg.get("bias", True)) if kind == "eagle" else False, aux_layer_ids=aux,
    )


def check_vocab_maps(d2t: Optional[torch.Tensor], t2d: Optional[torch.Tensor], cfg: EagleConfig,
                     source: str) -> None:
    """Validate EAGLE-3's ``d2t [Vd]`` / ``t2d [V]`` against ``cfg``.

    Raises ``CheckpointError`` when a reduced vocabulary has no mappings, when ``d + d2t[d]`` leaves
    ``[0, V)`` or repeats, or when ``t2d`` disagrees with ``d2t``."""
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    if d2t is None or t2d is None:
        if Vd == V:
            return
        missing = [n for n, t in (("d2t", d2t), ("t2d", t2d)) if t is None]
        raise CheckpointError(
            f"{source}: draft_vocab_size={Vd} < vocab_size={V} but the weights lack {' and '.join(missing)}; "
            f"a reduced draft vocabulary needs the d2t/t2d mappings (re-export the head with them)")
    if tuple(d2t.shape) != (Vd,) or tuple(t2d.shape) != (V,):
        raise CheckpointError(f"{source}: d2t has shape {tuple(d2t.shape)} (expected ({Vd},)) and t2d "
                              f"{tuple(t2d.shape)} (expected ({V},)); they do not match the config")
    target_ids = torch.arange(Vd, dtype=torch.long) + d2t.long()
    bad = (target_ids < 0) | (target_ids >= V)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise CheckpointError(
            f"{source}: d2t maps draft token {i} to target id {int(target_ids[i])}, outside [0, {V}); "
            f"the mapping belongs to another vocabulary")
    if int(torch.unique(target_ids).numel()) != Vd:
        raise CheckpointError(f"{source}: d2t maps two draft tokens to the same target id")
    t2d_b = t2d.bool()
    if int(t2d_b.sum()) != Vd or not bool(t2d_b[target_ids].all()):
        raise CheckpointError(f"{source}: t2d marks {int(t2d_b.sum())} target ids but d2t reaches {Vd} "
                              f"others; the two mappings disagree")


def load_eagle_head(path, target_config, embed: Callable, target_lm_head: Optional[Callable] = None,
                    expect_kind: Optional[str] = None) -> EagleModel:
    """Read an EAGLE / EAGLE-3 head directory into an :class:`EagleModel` (fp32, eval mode).

    Args:
      path: directory with ``config.json`` and the weights.
      target_config: the target's ``LlamaConfig`` (hidden size, vocabulary, layer count).
      embed, target_lm_head: the target's embedding and LM head callables (see ``EagleModel``).
      expect_kind: ``"eagle"`` or ``"eagle3"`` (the plan's method); a different head raises.

    Raises ``CheckpointError`` for a missing/unreadable file, a head of the other kind, a size or
    vocabulary mismatch, missing or out-of-range vocabulary mappings, or missing/mis-shaped tensors.
    """
    directory = pathlib.Path(path)
    source = str(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{source}: not a directory; draft.path must point at an EAGLE head directory "
                              f"(config.json + model.safetensors / pytorch_model.bin)")
    cfg_dict = read_config_json(directory)
    sd = read_weights(directory)
    kind = _detect_kind(cfg_dict, sd.keys(), source)
    if expect_kind is not None and kind != expect_kind:
        raise CheckpointError(f"{source}: this is an {kind.upper().replace('EAGLE3', 'EAGLE-3')} head but the "
                              f"plan's method is {expect_kind!r}; set method.name: {kind}")
    cfg = parse_eagle_config(cfg_dict, kind, target_config, source)
    if kind == "eagle" and "fc.bias" in sd and not cfg.fc_bias:
        cfg = EagleConfig(**{**cfg.__dict__, "fc_bias": True})
    if kind == "eagle" and "fc.bias" not in sd and cfg.fc_bias:
        cfg = EagleConfig(**{**cfg.__dict__, "fc_bias": False})  # `bias` absent from older configs
    emb = sd.get("embed_tokens.weight")
    if emb is not None and tuple(emb.shape) != (target_config.vocab_size, target_config.hidden_size):
        raise CheckpointError(
            f"{source}: embed_tokens.weight has shape {tuple(emb.shape)} but the target's embedding is "
            f"{(target_config.vocab_size, target_config.hidden_size)}; vocabulary or hidden size mismatch")
    if kind == "eagle3":
        check_vocab_maps(sd.get("d2t"), sd.get("t2d"), cfg, source)
    model = EagleModel(cfg, embed, target_lm_head)
    own = model.state_dict()
    with torch.no_grad():
        for ours, key in published_key_map(kind, cfg.fc_bias).items():
            if key not in sd:
                raise CheckpointError(f"{source}: tensor {key!r} is missing (an incomplete {kind} head?)")
            t = sd[key]
            if tuple(t.shape) != tuple(own[ours].shape):
                raise CheckpointError(f"{source}: tensor {key!r} has shape {tuple(t.shape)}, config.json implies "
                                      f"{tuple(own[ours].shape)}; hidden/intermediate/vocab sizes disagree")
            own[ours].copy_(t.float())
        if kind == "eagle3" and sd.get("d2t") is not None:
            model.d2t.copy_(sd["d2t"].long())
            model.t2d.copy_(sd["t2d"].bool())
    known = set(published_key_map(kind, cfg.fc_bias).values()) | {"embed_tokens.weight", "d2t", "t2d"}
    extra = sorted(k for k in sd if k not in known and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise CheckpointError(f"{source}: unexpected tensors {extra[:4]}; specc reads one-layer EAGLE/EAGLE-3 "
                              f"heads (num_hidden_layers=1)")
    return model.eval()


def config_dict(cfg: EagleConfig, target_config=None, dtype: str = "float16") -> dict:
    """The published ``config.json`` for ``cfg`` (EAGLE: SafeAILab EAGLE-1 fields; EAGLE-3: adds
    ``draft_vocab_size``, ``target_hidden_size`` and ``eagle_config``)."""
    d = {
        "architectures": [EAGLE3_ARCH if cfg.kind == "eagle3" else EAGLE_ARCH],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    if target_config is not None:
        d.update({"bos_token_id": target_config.bos_token_id, "pad_token_id": target_config.pad_token_id,
                  "eos_token_id": list(target_config.eos_token_ids)})
    if cfg.kind == "eagle":
        d["bias"] = cfg.fc_bias
    else:
        d["draft_vocab_size"] = cfg.draft_vocab_size
        d["target_hidden_size"] = cfg.target_hidden_size
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    return d


def save_eagle_head(model: EagleModel, directory, dtype: torch.dtype = torch.float16,
                    target_config=None, weights_file: str = "model.safetensors",
                    extra_config: Optional[dict] = None) -> pathlib.Path:
    """Write ``model`` as a published-layout head: ``config.json`` + ``weights_file``
    (``model.safetensors`` or ``pytorch_model.bin``), float tensors in ``dtype``, ``d2t`` int64,
    ``t2d`` bool. Returns the directory."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    own = model.state_dict()
    out = {key: own[ours].detach().to(dtype).contiguous()
           for ours, key in published_key_map(cfg.kind, cfg.fc_bias).items()}
    if cfg.kind == "eagle3" and cfg.draft_vocab_size != cfg.vocab_size:
        out["d2t"] = model.d2t.detach().long().contiguous()
        out["t2d"] = model.t2d.detach().bool().contiguous()
    if weights_file.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file(out, str(directory / weights_file), metadata={"format": "pt"})
    else:
        torch.save(out, str(directory / weights_file))
    d = config_dict(cfg, target_config, dtype=str(dtype).replace("torch.", ""))
    if extra_config:
        d.update(extra_config)
    (directory / "config.json").write_text(json.dumps(d, indent=2) + "\n")
    return directory
