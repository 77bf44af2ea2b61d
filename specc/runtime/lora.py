"""Multi-adapter LoRA on the target: adapters in PEFT's layout, several loaded at once, each request's
adapter applied to its own rows of every target forward (prefill and verify), never to the drafter.

An adapter is a directory with ``adapter_config.json`` and ``adapter_model.safetensors`` as
``peft``'s ``save_pretrained`` writes them (keys ``base_model.model.model.layers.{i}.self_attn.q_proj
.lora_A.weight`` ``[r, in]`` and ``...lora_B.weight`` ``[out, r]``). A LoRA-adapted linear computes
``y = x Wᵀ + s · (x Aᵀ) Bᵀ`` with ``s = lora_alpha / r`` (``lora_alpha / √r`` with ``use_rslora``;
Hu et al. 2021, PEFT ``LoraLayer``). Our target fuses q/k/v (``wqkv``) and gate/up (``w13``): an
adapter's q/k/v (gate/up) deltas land in their column slices of the fused output.

How rows get their adapter: the runtime assigns each cache row the adapter of the request it holds
(:meth:`LoraSet.assign_row`). A forward pre-hook on the target's first decoder layer reads that
forward's cache rows (``batch_index``, packed like the tokens for a ragged forward) and groups the
tokens by adapter; forward hooks on the target's decoder-layer linears add each group's delta
(SGLang's segmented LoRA GEMM, one segment per adapter; a speculative verify gives every request a
uniform width of its own κ + 1 tokens). The target's embeddings and LM head carry no adapter, and
the drafter calls them directly (``LlamaModel.embed`` / ``lm_head``), so it never sees adapter
deltas (SGLang peels the LoRA wrapper off the shared LM head for drafts: ``unwrap_lora_layer`` in
sglang/srt/speculative/eagle_worker_v2.py). Adapters that target the embeddings or the LM head are refused.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from specc.errors import CheckpointError, PlanError

#: PEFT module names of a Llama layer -> (our fused module, which slice of its output)
_SLICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_REFUSED = ("embed_tokens", "lm_head")
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass
class LoraAdapter:
    """One loaded adapter.

    Attributes:
        name: the name requests use (the API's ``model``).
        path: its directory. rank: r. scale: s (``lora_alpha / r``, or ``/ √r`` with rsLoRA).
        weights: ``{(layer, peft module name): (A [r, in] fp32, B [out, r] fp32)}``.
        fingerprint: sha256 of ``adapter_model.safetensors`` and ``adapter_config.json`` (disaggregated
            payloads name the adapter they were prefilled with by it).
        target_modules: the PEFT module names it adapts.
    """

    name: str
    path: Path
    rank: int
    scale: float
    weights: Dict[Tuple[int, str], Tuple[torch.Tensor, torch.Tensor]]
    fingerprint: str
    target_modules: Tuple[str, ...] = ()


def parse_adapter_specs(entries: Sequence[str]) -> List[Tuple[str, str]]:
    """``deploy.lora.adapters`` entries ``name=path`` as ``[(name, path)]``.

    Raises:
        PlanError: an entry without ``=``, an empty or duplicate name, or a name with characters
            other than letters, digits, ``_ . -``.
    """
    out: List[Tuple[str, str]] = []
    for e in entries:
        name, sep, path = str(e).partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise PlanError(f"deploy.lora.adapters: entry {e!r} must be NAME=PATH (e.g. chat=/path/to/adapter)")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise PlanError(f"deploy.lora.adapters: adapter name {name!r} may use letters, digits, '_', '.', '-'")
        if name in {n for n, _ in out}:
            raise PlanError(f"deploy.lora.adapters: adapter name {name!r} is listed twice")
        out.append((name, path))
    return out


def load_adapter(name: str, path: str | Path, config) -> LoraAdapter:
    """Read a PEFT LoRA adapter for a target with ``config`` (``specc.models.config.LlamaConfig``).

    Raises:
        CheckpointError: a missing directory or file, an unreadable config, a PEFT option the
            runtime does not apply (DoRA, ``modules_to_save``, biases, per-module rank/alpha
            patterns, ``fan_in_fan_out``), an adapted module other than the decoder-layer projections
            (embeddings, LM head), or tensors whose shapes do not fit the target.
    """
    from safetensors.torch import load_file

    from specc.models.resolve import resolve_model_path

    where = f"LoRA adapter {name!r} ({path})"
    try:
        d = resolve_model_path(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{where}: {exc}; expected a PEFT adapter directory (adapter_config.json + "
                              f"adapter_model.safetensors)") from None
    cfg_path, w_path = d / "adapter_config.json", d / "adapter_model.safetensors"
    if not d.is_dir() or not cfg_path.is_file() or not w_path.is_file():
        raise CheckpointError(f"{where}: expected a PEFT adapter directory with adapter_config.json and "
                              f"adapter_model.safetensors (peft's save_pretrained)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{where}: adapter_config.json is unreadable ({exc})") from None
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise CheckpointError(f"{where}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, bad in (("use_dora", True), ("fan_in_fan_out", True)):
        if cfg.get(key) is bad:
            raise CheckpointError(f"{where}: {key}=true is not supported by the specc runtime; train with {key}=false")
    if cfg.get("modules_to_save"):
        raise CheckpointError(f"{where}: modules_to_save={cfg['modules_to_save']} (fully trained copies of "
                              f"modules) is not supported; LoRA deltas only")
    if cfg.get("bias", "none") != "none":
        raise CheckpointError(f"{where}: bias={cfg['bias']!r} is not supported; train with bias='none'")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise CheckpointError(f"{where}: rank_pattern/alpha_pattern are not supported; one rank and alpha")
    r = int(cfg.get("r", 8))
    alpha = float(cfg.get("lora_alpha", r))
    scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
    try:
        tensors = load_file(str(w_path))
    except Exception as exc:  # safetensors raises its own error type for a corrupt file
        raise CheckpointError(f"{where}: adapter_model.safetensors is unreadable ({exc})") from None
    c = config
    out_dims = {"q_proj": c.q_size, "k_proj": c.kv_size, "v_proj": c.kv_size, "o_proj": c.hidden_size,
                "gate_proj": c.intermediate_size, "up_proj": c.intermediate_size, "down_proj": c.hidden_size}
    in_dims = {"q_proj": c.hidden_size, "k_proj": c.hidden_size, "v_proj": c.hidden_size, "o_proj": c.q_size,
               "gate_proj": c.hidden_size, "up_proj": c.hidden_size, "down_proj": c.intermediate_size}
    parts: Dict[Tuple[int, str], Dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        if any(part in _REFUSED for part in key.split(".")):
            raise CheckpointError(f"{where}: it adapts {key.split('.lora_')[0]}; LoRA on the embeddings or the "
                                  f"LM head is not supported (the drafter shares them unadapted)")
        m = _KEY.match(key)
        if m is None or m.group(3) not in _SLICES:
            raise CheckpointError(f"{where}: unexpected tensor {key!r}; only LoRA A/B of the decoder layers' "
                                  f"{', '.join(_SLICES)} are applied")
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        if not 0 <= layer < c.num_layers:
            raise CheckpointError(f"{where}: tensor {key!r} names layer {layer}, the target has {c.num_layers}")
        parts.setdefault((layer, module), {})[ab] = t.float()
    weights: Dict[Tuple[int, str], Tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise CheckpointError(f"{where}: layer {layer} {module} has lora_{'A' if 'A' in ab else 'B'} only")
        A, B = ab["A"], ab["B"]
        want_a, want_b = (r, in_dims[module]), (out_dims[module], r)
        if tuple(A.shape) != want_a or tuple(B.shape) != want_b:
            raise CheckpointError(f"{where}: layer {layer} {module}: lora_A {tuple(A.shape)} / lora_B "
                                  f"{tuple(B.shape)} do not fit the target (expected {want_a} / {want_b}; "
                                  f"an adapter for another model, or r differs from adapter_config.json)")
        weights[(layer, module)] = (A.contiguous(), B.contiguous())
    if not weights:
        raise CheckpointError(f"{where}: adapter_model.safetensors holds no LoRA weights")
    h = hashlib.sha256(w_path.read_bytes())
    h.update(cfg_path.read_bytes())
    return LoraAdapter(name=name, path=d, rank=r, scale=scale, weights=weights, fingerprint=h.hexdigest()[:16],
                       target_modules=tuple(sorted({m for _, m in weights})))


@dataclass
class _Context:
    """The current target forward's tokens grouped by adapter slot."""

    active: List[int] = field(default_factory=list)
    index: Dict[int, torch.Tensor] = field(default_factory=dict)


class LoraSet:
    """The adapters a server loads, and which one each cache row's request uses.

    Args:
        adapters: loaded adapters (slot = position in this list).
        max_rows: cache rows of the runtime. max_loras_per_batch: distinct adapters among live rows at
            most (SGLang ``--max-loras-per-batch``; default: all of them).
    Raises:
        PlanError: ``max_loras_per_batch < 1``.
    """

    def __init__(self, adapters: Sequence[LoraAdapter], max_rows: int,
                 max_loras_per_batch: Optional[int] = None) -> None:
        self.adapters = list(adapters)
        self.by_name = {a.name: i for i, a in enumerate(self.adapters)}
        self.max_loras_per_batch = int(max_loras_per_batch or max(1, len(self.adapters)))
        if self.max_loras_per_batch < 1:
            raise PlanError(f"deploy.lora.max_loras_per_batch must be >= 1, got {max_loras_per_batch}")
        self.row_slot = torch.full((max_rows,), -1, dtype=torch.int64)
        self._ctx = _Context()
        self._handles: list = []
        self._target = None

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(a.name for a in self.adapters)

    def get(self, name: str) -> LoraAdapter:
        return self.adapters[self.by_name[name]]

    def assign_row(self, row: int, name: Optional[str]) -> None:
        """Row ``row`` now holds a request using adapter ``name`` (None: the base model)."""
        self.row_slot[row] = -1 if name is None else self.by_name[name]

    # ------------------------------------------------------------------ hooks
    def attach(self, target) -> "LoraSet":
        """Hook the adapters into ``target`` (a ``LlamaModel``; its decoder-layer linears). Returns self.
        Raises PlanError when called twice."""
        if self._target is not None:
            raise PlanError("LoraSet.attach: already attached to a target")
        self._target = target
        c = target.config
        dev = target.norm.weight.device
        q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
        where = {"q_proj": ("attn", "wqkv", 0, q), "k_proj": ("attn", "wqkv", q, q + kv),
                 "v_proj": ("attn", "wqkv", q + kv, q + 2 * kv), "o_proj": ("attn", "wo", 0, c.hidden_size),
                 "gate_proj": ("ffn", "w13", 0, inter), "up_proj": ("ffn", "w13", inter, 2 * inter),
                 "down_proj": ("ffn", "w2", 0, c.hidden_size)}
        # (layer, fused module) -> slot -> [(o0, o1, A [r, in], s*B [out, r])]
        plan: Dict[Tuple[int, str, str], Dict[int, list]] = {}
        for slot, a in enumerate(self.adapters):
            for (layer, module), (A, B) in a.weights.items():
                block, lin, o0, o1 = where[module]
                plan.setdefault((layer, block, lin), {}).setdefault(slot, []).append(
                    (o0, o1, A.to(dev), (B * a.scale).to(dev)))
        for (layer, block, lin), per_slot in plan.items():
            module = getattr(getattr(target.layers[layer], block), lin)
            self._handles.append(module.register_forward_hook(self._delta_hook(module, per_slot)))
        first = target.layers[0]
        sig = inspect.signature(type(first).forward)
        self._handles.append(first.register_forward_pre_hook(self._context_hook(first, sig), with_kwargs=True))
        return self

    def detach(self) -> None:
        """Remove the hooks (the target computes the base model again)."""
        for h in self._handles:
            h.remove()
        self._handles, self._target = [], None

    def _context_hook(self, layer, sig):
        def hook(module, args, kwargs):
            if module is not layer:  # a deep copy of the target (a drafter made from it) gets no adapter
                self._ctx = _Context()
                return None
            bound = sig.bind(module, *args, **kwargs)
            rows = bound.arguments["batch_index"]  # [B, N] cache row of every token
            packing = bound.arguments.get("packing")
            flat = rows.reshape(-1)
            if packing is not None:
                flat = flat.index_select(0, packing.index)  # the packed tokens' rows, in token order
            slots = self.row_slot.to(flat.device)[flat]  # [T]
            ctx = _Context()
            for s in sorted(set(slots.tolist()) - {-1}):
                ctx.active.append(s)
                ctx.index[s] = (slots == s).nonzero().view(-1)
            self._ctx = ctx
            return None
        return hook

    def _delta_hook(self, linear, per_slot):
        def hook(module, args, output):
            ctx = self._ctx
            if module is not linear or not ctx.active:
                return None
            x = args[0].reshape(-1, args[0].shape[-1])  # [T, in]
            y = output.view(-1, output.shape[-1])  # [T, out], a view: updated in place
            for s in ctx.active:
                parts = per_slot.get(s)
                if not parts:
                    continue
                idx = ctx.index[s]
                xa = x.index_select(0, idx)  # [n, in]
                for o0, o1, A, sB in parts:
                    y[idx, o0:o1] += (xa @ A.t()) @ sB.t()  # [n, o1 - o0]
            return output
        return hook


def load_lora_set(entries: Sequence[str], target, max_rows: int,
                  max_loras_per_batch: Optional[int] = None) -> LoraSet:
    """Load ``deploy.lora.adapters`` (``name=path`` entries) for ``target`` and hook them in.

    Raises:
        PlanError: a malformed entry. CheckpointError: an adapter that cannot be read or applied.
    """
    adapters = [load_adapter(n, p, target.config) for n, p in parse_adapter_specs(entries)]
    return LoraSet(adapters, max_rows, max_loras_per_batch).attach(target)
