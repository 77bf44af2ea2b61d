"""Prefill/decode disaggregation: what the prefill instance ships so the decode instance speculates on
its first step, the wire format, and the checks on arrival.

What ships per request (SGLang 0.5.23 sglang/srt/disaggregation/prefill.py:301-317):

* always: the prompt's token ids, the first generated token, and the target's KV of the prompt
  (positions ``0 .. P-1``: the first token is the pending token, its KV is written by the first
  verify), plus the request's own generator state when it has a seed (so seeded sampling continues
  where the prefill left it);
* the method's seed, by its kind in the method table (:data:`specc.methods.SEED_KINDS`):
  ``hidden_topk`` (EAGLE, EAGLE-3): the draft head's KV over the prompt (SGLang ships the draft KV
  pool of every ``has_draft_kv`` method, prefill.py:301-317), its hidden state at the last prompt
  pair, its position, and the draft's top-k at that state (``EagleDraftInput(topk_p, topk_index,
  hidden_states)``, eagle_disaggregation.py); ``draft_prefill`` (draft model, plugins): nothing —
  the decode instance runs the draft model's prefill over the prompt tokens itself;
  ``target_hidden`` (Medusa, DFlash, DSpark): the target's hidden states at the drafter's layers over
  the prompt (``seed.hidden.{j}`` ``[P, hidden_size]`` fp32, one per layer the drafter reads), on which
  the decode instance runs the drafter's prefill; ``none`` (plain, n-gram): nothing.

Wire format: one safetensors blob (tensors ``prompt_ids``, ``first_token``, ``kv.{i}.k``/``kv.{i}.v``
``[kv_heads, P, head_dim]``, ``seed.{name}``, ``generator_state``) whose metadata carries
``format = "specc-disagg"``, ``version``, the method and seed kind, the target's fingerprint, the
runtime hash (the manifest's runtime section without deployment keys), the adapter and its
fingerprint, and the sha256 of the tensor bytes. :func:`decode_payload` refuses a blob that does
not parse, is truncated or corrupted, or was made for another model, plan, adapter or version.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from specc.errors import SpeccError

FORMAT = "specc-disagg"
VERSION = 1
SUPPORTED_VERSIONS = (1,)


class PayloadError(SpeccError):
    """A disaggregation payload that cannot be installed (malformed, corrupted, or for another model,
    plan or adapter). Fails that request only."""


@dataclass
class Prefilled:
    """One request's prefill as the decode instance installs it.

    Attributes:
        prompt_ids: ``P`` prompt token ids. first_token: the first generated token.
        kv: per target layer ``(k, v)``, each ``[kv_heads, P, head_dim]`` in the cache dtype.
        seed: the method's seed tensors (names by seed kind; see the module docstring).
        generator_state: ``torch.Generator.get_state()`` of a seeded request, else None.
        meta: ``method``, ``seed_kind``, ``model``, ``runtime_hash``, ``adapter``, ``adapter_hash``.
    """

    prompt_ids: List[int]
    first_token: int
    kv: List[Tuple[torch.Tensor, torch.Tensor]]
    seed: Dict[str, torch.Tensor] = field(default_factory=dict)
    generator_state: Optional[torch.Tensor] = None
    meta: Dict[str, str] = field(default_factory=dict)

    def nbytes(self) -> Dict[str, int]:
        """Bytes of the tensors by part: ``kv`` (target KV), ``seed`` (the method's seed), ``tokens``
        (prompt ids + first token), ``generator``, ``total``."""
        kv = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)
        seed = sum(t.numel() * t.element_size() for t in self.seed.values())
        tokens = 8 * (len(self.prompt_ids) + 1)
        gen = 0 if self.generator_state is None else self.generator_state.numel()
        return {"kv": kv, "seed": seed, "tokens": tokens, "generator": gen, "total": kv + seed + tokens + gen}


# ---------------------------------------------------------------------------------------- identity
def model_fingerprint(target) -> str:
    """A short sha256 of the target's config and of its embedding table and final norm (both sides
    must hold the same weights for shipped KV to mean anything). Cached on the model."""
    fp = getattr(target, "_specc_fingerprint", None)
    if fp is None:
        h = hashlib.sha256(json.dumps(target.config.to_hf_dict(), sort_keys=True, default=str).encode())
        for t in (target.embed_weight, target.norm.weight):
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
        fp = h.hexdigest()[:16]
        target._specc_fingerprint = fp
    return fp


def runtime_hash(runtime) -> str:
    """The hash that both instances must share: ``runtime.plan_hash`` when a loader set it (the
    manifest's runtime section without deployment keys, :func:`section_hash`), else a hash of the
    runtime's states (tests, benchmarks)."""
    h = getattr(runtime, "plan_hash", None)
    if h:
        return h
    specs = [s.spec for s in runtime.states]
    return hashlib.sha256(repr([(s.name, s.method, s.verify_rule, s.draft_sampling) for s in specs]).encode()
                          ).hexdigest()[:16]


def section_hash(section: Dict[str, Any]) -> str:
    """sha256 (16 hex digits) of a manifest runtime section without its deployment keys (``deploy``:
    the role and the adapter list differ between a prefill and a decode instance of one plan)."""
    core = {k: v for k, v in section.items() if k != "deploy"}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()[:16]


def method_of(runtime) -> str:
    return runtime.states[0].spec.method


def seed_kind(runtime) -> str:
    from specc import methods

    return methods.get(method_of(runtime)).seed


# ---------------------------------------------------------------------------------------- export
def export(runtime, batch, row: int) -> Prefilled:
    """The payload of a row the prefill instance just prefilled (its prompt KV, first token, the
    method's seed). Raises PayloadError when the row has no first token or the drafter cannot
    export the seed its method needs."""
    st = batch.rows[row]
    P = len(st.request.prompt_ids)
    if not st.generated:
        raise PayloadError(f"request {st.index}: nothing was generated at prefill")
    kv = [(layer.attn.k_cache[row, :, :P].clone(), layer.attn.v_cache[row, :, :P].clone())
          for layer in runtime.target.layers]
    kind = seed_kind(runtime)
    seed: Dict[str, torch.Tensor] = {}
    if kind == "hidden_topk":
        exporter = getattr(runtime.drafter, "export_seed", None)
        if exporter is None:
            raise PayloadError(f"method {method_of(runtime)}: its drafter cannot export the disaggregation seed")
        seed = exporter(row, P)
    elif kind == "target_hidden" and runtime.drafter is not None:
        if st.prompt_hidden is None:
            raise PayloadError(f"request {st.index}: the target's hidden states over the prompt were not kept")
        seed = {f"hidden.{j}": h.to(torch.float32).cpu() for j, h in enumerate(st.prompt_hidden)}
        st.prompt_hidden = None
    meta = {"method": method_of(runtime), "seed_kind": kind, "model": model_fingerprint(runtime.target),
            "runtime_hash": runtime_hash(runtime), "adapter": st.request.adapter or "",
            "adapter_hash": runtime.lora.get(st.request.adapter).fingerprint
            if st.request.adapter and runtime.lora is not None else ""}
    gen = st.generator.get_state() if st.generator is not None else None
    return Prefilled(prompt_ids=list(st.request.prompt_ids), first_token=int(st.generated[0]), kv=kv, seed=seed,
                     generator_state=gen, meta=meta)


# ---------------------------------------------------------------------------------------- wire format
def _tensors(p: Prefilled) -> Dict[str, torch.Tensor]:
    out = {"prompt_ids": torch.tensor(p.prompt_ids, dtype=torch.int64),
           "first_token": torch.tensor([p.first_token], dtype=torch.int64)}
    for i, (k, v) in enumerate(p.kv):
        out[f"kv.{i}.k"] = k.contiguous().cpu()
        out[f"kv.{i}.v"] = v.contiguous().cpu()
    for name, t in p.seed.items():
        out[f"seed.{name}"] = t.contiguous().cpu()
    if p.generator_state is not None:
        out["generator_state"] = p.generator_state.contiguous().cpu()
    return out


def _digest(tensors: Dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def encode_payload(p: Prefilled) -> bytes:
    """The wire bytes of a payload (safetensors; metadata as in the module docstring)."""
    from safetensors.torch import save

    tensors = _tensors(p)
    meta = dict(p.meta, format=FORMAT, version=str(VERSION), sha256=_digest(tensors))
    return save(tensors, metadata=meta)


def decode_payload(data: bytes, runtime, prompt_ids: List[int], adapter: Optional[str] = None) -> Prefilled:
    """Parse and check a payload on arrival at the decode instance.

    Checks: safetensors parses; ``format`` and ``version``; the sha256 of the tensors (corruption);
    the target fingerprint, the runtime hash and the method equal this instance's; the adapter (and
    its fingerprint) equals the request's; the prompt equals the request's prompt; every tensor has
    the shape and dtype this instance's caches and drafter need.

    Raises:
        PayloadError: naming the first check that failed and the fix.
    """
    from safetensors.torch import load

    try:
        tensors = load(bytes(data))
    except Exception as exc:  # safetensors raises SafetensorError / ValueError on bad bytes
        raise PayloadError(f"disaggregation payload: not a readable safetensors blob ({len(data)} bytes; "
                           f"{type(exc).__name__}: {exc}); truncated or corrupted in transfer") from None
    meta = _metadata(data)
    if meta.get("format") != FORMAT:
        raise PayloadError(f"disaggregation payload: format {meta.get('format')!r} is not {FORMAT!r}")
    try:
        version = int(meta.get("version", ""))
    except ValueError:
        version = -1
    if version not in SUPPORTED_VERSIONS:
        raise PayloadError(f"disaggregation payload: version {meta.get('version')!r} is not one this specc reads "
                           f"{SUPPORTED_VERSIONS}; run the same specc on both instances")
    if _digest(tensors) != meta.get("sha256"):
        raise PayloadError("disaggregation payload: the tensors do not match their sha256 (corrupted in transfer)")
    mine = {"model": model_fingerprint(runtime.target), "runtime_hash": runtime_hash(runtime),
            "method": method_of(runtime)}
    for key, what in (("model", "target model"), ("runtime_hash", "plan (manifest runtime section)"),
                      ("method", "method")):
        if meta.get(key) != mine[key]:
            raise PayloadError(f"disaggregation payload: made for another {what} ({key} {meta.get(key)!r}, this "
                               f"instance has {mine[key]!r}); serve the same artifact on the prefill and decode "
                               f"instances")
    want_adapter = adapter or ""
    if meta.get("adapter", "") != want_adapter:
        raise PayloadError(f"disaggregation payload: prefilled with adapter {meta.get('adapter')!r}, the request "
                           f"asks for {want_adapter!r}")
    if want_adapter:
        have = runtime.lora.get(want_adapter).fingerprint if runtime.lora is not None and \
            want_adapter in runtime.lora.names else None
        if meta.get("adapter_hash") != have:
            raise PayloadError(f"disaggregation payload: adapter {want_adapter!r} differs between the instances "
                               f"({meta.get('adapter_hash')!r} vs {have!r}); load the same adapter files on both")
    ids = tensors.get("prompt_ids")
    first = tensors.get("first_token")
    if ids is None or first is None or ids.dtype != torch.int64 or first.shape != (1,):
        raise PayloadError("disaggregation payload: prompt_ids / first_token missing or malformed")
    if ids.tolist() != list(prompt_ids):
        raise PayloadError(f"disaggregation payload: its prompt ({ids.numel()} tokens) is not the request's "
                           f"({len(prompt_ids)} tokens)")
    P = len(prompt_ids)
    c = runtime.target.config
    cache = runtime.target.layers[0].attn.k_cache
    kv = []
    for i in range(c.num_layers):
        k, v = tensors.get(f"kv.{i}.k"), tensors.get(f"kv.{i}.v")
        want = (c.num_kv_heads, P, c.head_dim)
        for name, t in ((f"kv.{i}.k", k), (f"kv.{i}.v", v)):
            if t is None:
                raise PayloadError(f"disaggregation payload: tensor {name} is missing")
            if tuple(t.shape) != want or t.dtype != cache.dtype:
                raise PayloadError(f"disaggregation payload: {name} is {tuple(t.shape)} {t.dtype}, this instance "
                                   f"needs {want} {cache.dtype}")
        kv.append((k, v))
    if f"kv.{c.num_layers}.k" in tensors:
        raise PayloadError(f"disaggregation payload: more KV layers than the target's {c.num_layers}")
    tok = int(first[0])
    if not 0 <= tok < c.vocab_size:
        raise PayloadError(f"disaggregation payload: first token {tok} is outside the vocabulary")
    seed = {name[5:]: t for name, t in tensors.items() if name.startswith("seed.")}
    kind = seed_kind(runtime)
    if meta.get("seed_kind") != kind:
        raise PayloadError(f"disaggregation payload: seed kind {meta.get('seed_kind')!r}, method "
                           f"{method_of(runtime)} needs {kind!r}")
    if kind == "hidden_topk":
        checker = getattr(runtime.drafter, "check_seed", None)
        if checker is not None:
            problem = checker(seed, P)
            if problem:
                raise PayloadError(f"disaggregation payload: {problem}")
    elif kind == "target_hidden" and runtime.drafter is not None:
        layers = len(runtime.ctx.hidden_layers)
        want = (P, c.hidden_size)
        for j in range(layers):
            t = seed.get(f"hidden.{j}")
            if t is None:
                raise PayloadError(f"disaggregation payload: seed.hidden.{j} is missing (the drafter reads {layers} "
                                   f"target layers)")
            if tuple(t.shape) != want or t.dtype != torch.float32 or not bool(torch.isfinite(t).all()):
                raise PayloadError(f"disaggregation payload: seed.hidden.{j} is {tuple(t.shape)} {t.dtype}, this "
                                   f"instance needs finite {want} torch.float32")
        if len(seed) != layers:
            raise PayloadError(f"disaggregation payload: {len(seed)} seed tensors, the drafter reads {layers} layers")
    elif seed:
        raise PayloadError(f"disaggregation payload: method {method_of(runtime)} ships no seed, got {sorted(seed)}")
    gen = tensors.get("generator_state")
    return Prefilled(prompt_ids=list(prompt_ids), first_token=tok, kv=kv, seed=seed, generator_state=gen,
                     meta={k: v for k, v in meta.items() if k not in ("format", "version", "sha256")})


def _metadata(data: bytes) -> Dict[str, str]:
    """The safetensors header's ``__metadata__`` (the blob already parsed)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
    meta = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}
