"""Sizing: what a plan's checkpoints, hardware profile and cost table say — the inputs of the cost
model (α, the draft cost ratio c, bytes per weight, T*, draft KV bytes, the batch model of
``schedule.kind: auto``). This is the only front-end module that reads checkpoint files (headers and
``config.json`` only) or cost tables; lowering, stage graphs and the cost model take its results as
arguments. Nothing here imports torch.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from specc import methods
from specc.predict import cost
from specc.errors import PlanError
from specc.console import plural
from specc.plan.schema import Plan

# The per-position acceptance the cost model falls back on when nothing measured or given applies:
# a textbook value (Llama-3-8B with a 1B-class draft). It is a placeholder, never a prediction: its source starts
# with NO_ACCEPTANCE and `specc explain` then prints the α each state needs instead of a speedup.
DEFAULT_ALPHA = 0.70
NO_ACCEPTANCE = "none"


def alpha_is_assumed(source: str) -> bool:
    """True when an α source (:func:`plan_alpha`) says nothing measured or given applies, so α is
    :data:`DEFAULT_ALPHA`'s placeholder."""
    return str(source).startswith(NO_ACCEPTANCE)


def plan_acceptance(plan: Plan, override: Optional[float] = None):
    """The α the cost model uses, where it came from, and the drafter's acceptance record entry
    (:class:`specc.predict.acceptance.Entry`, or None), in this order:

    1. ``override`` (``--alpha``);
    2. ``schedule.acceptance``: the entry for this plan in that record (written by ``specc tune``), its
       per-position rates giving E at each κ (:func:`specc.predict.acceptance.entry_for`);
    3. ``schedule.alpha``;
    4. the plan's synthetic acceptance (``verify.synthetic.acceptance_rates`` — unconditional, so
       E = 1 + Σ r_i — or ``acceptance_length`` = E, each inverted through E(α, κ));
    5. the drafter's acceptance record (:func:`specc.predict.acceptance.find`: measured on held-out prompts;
       its per-position rates give E at each κ, its fitted α the tail; a record whose drafter was
       retrained since is used and its source says STALE);
    6. none: :data:`DEFAULT_ALPHA` as a placeholder, the source starting with :data:`NO_ACCEPTANCE`
       and saying which record is missing.

    Returns ``(alpha, source, entry)``. Raises PlanError for α outside [0, 1], and naming
    ``schedule.acceptance`` for a record that does not read or has no entry for this plan."""
    if override is not None:
        if not 0.0 <= override <= 1.0:
            raise PlanError(f"--alpha must lie in [0, 1], got {override}")
        return float(override), "--alpha", None
    if plan.schedule.acceptance and methods.get(plan.method.name).drafts:
        entry = schedule_acceptance(plan)
        return entry.alpha, f"schedule.acceptance: {entry.describe}", entry
    if plan.schedule.alpha is not None:
        if not 0.0 <= float(plan.schedule.alpha) <= 1.0:
            raise PlanError(f"schedule.alpha must lie in [0, 1] (a per-position acceptance), got {plan.schedule.alpha}")
        return float(plan.schedule.alpha), "schedule.alpha", None
    syn = plan.verify.synthetic
    if syn.acceptance_rates:
        # vLLM's rates are unconditional: r_i = P(first i+1 drafts accepted), so E = 1 + Σ r_i
        # (vLLM 0.33.0 vllm/v1/spec_decode/utils.py:848-851); α is the constant per-position rate with the same E.
        rates = [min(max(float(r), 0.0), 1.0) for r in syn.acceptance_rates]
        e = 1.0 + sum(rates)
        return cost.alpha_for_expected_tokens(min(e, len(rates) + 1.0), len(rates)), (
            f"verify.synthetic.acceptance_rates (E = {e:.3f} over {plural(len(rates), 'position')})"), None
    if syn.acceptance_length is not None:
        from specc.compiler.lower import base_num_steps

        k, _ = base_num_steps(plan)
        k = max(k, 1)
        e = min(max(float(syn.acceptance_length), 1.0), k + 1.0)
        return cost.alpha_for_expected_tokens(e, k), (
            f"verify.synthetic.acceptance_length = {syn.acceptance_length} inverted at κ = {k}"), None
    if not methods.get(plan.method.name).drafts:
        return DEFAULT_ALPHA, "n/a: plain decoding drafts nothing", None
    from specc.predict import acceptance

    found = acceptance.find(plan)
    if found.entry is not None:
        src = found.entry.describe
        if found.stale:
            src = f"{src}; {found.reason}"
        return found.entry.alpha, src, found.entry
    return DEFAULT_ALPHA, (f"{NO_ACCEPTANCE}: {found.reason}; measure it (`specc tune PROMPTS`, or `specc run "
                           f"--json` and --acceptance), or pass --alpha"), None


def schedule_acceptance(plan: Plan):
    """The entry of the record ``schedule.acceptance`` names for this plan's drafter
    (:class:`specc.predict.acceptance.Entry`). Raises PlanError naming ``schedule.acceptance``: the
    file does not read as a record, or it holds no entry for this plan's target, drafter and proposals."""
    from specc.predict import acceptance

    path = str(plan.schedule.acceptance)
    try:
        entries = acceptance.read_record(path)
    except acceptance.AcceptanceError as exc:
        raise PlanError(f"schedule.acceptance: {exc}") from None
    entry = acceptance.entry_for(entries, plan)
    if entry is None:
        have = "; ".join(f"{e.key} (draft {e.draft})" for e in entries) or "none"
        raise PlanError(f"schedule.acceptance: {path} has no entry for this plan's drafter and proposals "
                        f"({acceptance.proposal_key(plan)}, draft {plan.draft.path if plan.draft else None}); it has: "
                        f"{have}; point the key at the record measured for this drafter (`specc tune` writes one)")
    return entry


def plan_alpha(plan: Plan, override: Optional[float] = None) -> Tuple[float, str]:
    """``(α, source)`` of :func:`plan_acceptance`."""
    a, src, _ = plan_acceptance(plan, override)
    return a, src


# ----------------------------------------------------------------------------------------------------
# schedule.kind: auto
# ----------------------------------------------------------------------------------------------------


def _resolve_path(path: str) -> Optional[Path]:
    """Map a plan model path to a file; ``pkg://`` through specc.models.resolve when available."""
    if path.startswith("pkg://"):
        try:
            from specc.models.resolve import resolve_model_path  # imports no torch

            return Path(resolve_model_path(path))
        except Exception:
            pkg, _, rel = path[len("pkg://"):].partition("/")
            spec = importlib.util.find_spec(pkg)
            if spec is None or not spec.submodule_search_locations:
                return None
            return Path(list(spec.submodule_search_locations)[0]) / rel
    return Path(path)


EMBEDDING_NAMES = ("embed_tokens", "token_embd", "wte")

_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_tensor_shapes(path: str) -> Dict[str, Tuple[int, ...]]:
    """Tensor name → shape from a GGUF file's header (GGUF v2/v3 layout: magic, version, tensor and
    metadata counts, metadata key/values, then tensor infos), without reading tensor data. Much faster
    than ``gguf.GGUFReader``, which maps every tensor. Raises ValueError on a malformed header."""
    with open(path, "rb") as fh:
        def read(fmt):
            size = struct.calcsize(fmt)
            data = fh.read(size)
            if len(data) != size:
                raise ValueError("truncated GGUF header")
            return struct.unpack(fmt, data)

        def read_str():
            (n,) = read("<Q")
            return fh.read(n).decode("utf-8", "replace")

        def skip_value(vtype):
            if vtype in _GGUF_SCALAR:
                fh.seek(_GGUF_SCALAR[vtype], 1)
            elif vtype == 8:
                (n,) = read("<Q")
                fh.seek(n, 1)
            elif vtype == 9:
                etype, count = read("<IQ")
                if etype in _GGUF_SCALAR:
                    fh.seek(_GGUF_SCALAR[etype] * count, 1)
                else:
                    for _ in range(count):
                        skip_value(etype)
            else:
                raise ValueError(f"unknown GGUF value type {vtype}")

        if fh.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        (version,) = read("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} not supported")
        n_tensors, n_kv = read("<QQ")
        for _ in range(n_kv):
            read_str()
            (vtype,) = read("<I")
            skip_value(vtype)
        shapes = {}
        for _ in range(n_tensors):
            name = read_str()
            (n_dims,) = read("<I")
            dims = read(f"<{n_dims}Q")
            read("<IQ")  # type, offset
            shapes[name] = tuple(int(d) for d in dims)
        return shapes


_GGUF_READ = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_config(path: str) -> Optional[Dict[str, object]]:
    """HF ``config.json`` keys of a Llama-family GGUF file, read from its header metadata
    (``<arch>.embedding_length``, ``.block_count``, ``.attention.head_count[_kv]``,
    ``.feed_forward_length``, ``.attention.key_length``, ``.context_length`` as
    ``max_position_embeddings`` when present) and the vocabulary from the ``token_embd.weight`` tensor's shape; None when the file is not a readable GGUF or a key is missing.
    Reads the header only (GGUF v2/v3 layout, as :func:`gguf_tensor_shapes`)."""
    p = _resolve_path(path) if isinstance(path, str) else Path(path)
    if p is None or not p.is_file():
        return None
    meta: Dict[str, object] = {}
    try:
        with open(p, "rb") as fh:
            def read(fmt):
                size = struct.calcsize(fmt)
                data = fh.read(size)
                if len(data) != size:
                    raise ValueError("truncated GGUF header")
                return struct.unpack(fmt, data)

            def read_str():
                (n,) = read("<Q")
                return fh.read(n).decode("utf-8", "replace")

            def value(vtype):
                """A scalar or string value; arrays are skipped (None)."""
                if vtype in _GGUF_READ:
                    (v,) = read(_GGUF_READ[vtype])
                    return v
                if vtype == 8:
                    return read_str()
                if vtype == 9:
                    etype, count = read("<IQ")
                    if etype in _GGUF_SCALAR:
                        fh.seek(_GGUF_SCALAR[etype] * count, 1)
                    else:
                        for _ in range(count):
                            value(etype)
                    return None
                raise ValueError(f"unknown GGUF value type {vtype}")

            if fh.read(4) != b"GGUF":
                return None
            (version,) = read("<I")
            if version < 2:
                return None
            n_tensors, n_kv = read("<QQ")
            for _ in range(n_kv):
                key = read_str()
                (vtype,) = read("<I")
                v = value(vtype)
                if v is not None:
                    meta[key] = v
        shapes = gguf_tensor_shapes(str(p))
    except (OSError, ValueError, struct.error):
        return None
    arch = meta.get("general.architecture")
    emb = shapes.get("token_embd.weight")
    try:
        heads = int(meta[f"{arch}.attention.head_count"])
        hidden = int(meta[f"{arch}.embedding_length"])
        return {"architectures": [str(arch)], "hidden_size": hidden, "num_hidden_layers": int(meta[f"{arch}.block_count"]),
                "num_attention_heads": heads,
                "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
                "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
                "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
                "vocab_size": int(emb[1]) if emb and len(emb) == 2 else int(meta.get(f"{arch}.vocab_size", 0)),
                "tie_word_embeddings": "output.weight" not in shapes,
                **({"max_position_embeddings": int(meta[f"{arch}.context_length"])}
                   if f"{arch}.context_length" in meta else {})}
    except (KeyError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=16)
def _count_params_cached(path: str, mtime: float, skip_embeddings: bool = False) -> int:
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors")) or sorted(p.glob("*.gguf"))
    else:
        files = [p]
    files = [f for f in files if f.is_file()]  # never open a FIFO or device (it would block or never end)
    total = 0
    for f in files:
        if f.suffix == ".gguf":
            for name, shape in gguf_tensor_shapes(str(f)).items():
                if not (skip_embeddings and any(e in name for e in EMBEDDING_NAMES)):
                    count = 1
                    for d in shape:
                        count *= d
                    total += count
        elif f.suffix == ".safetensors":
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100_000_000:  # safetensors' own header limit
                    raise ValueError(f"{f}: safetensors header of {n} bytes")
                header = json.loads(fh.read(n))
            for key, meta in header.items():
                if key != "__metadata__" and not (skip_embeddings and any(e in key for e in EMBEDDING_NAMES)):
                    count = 1
                    for d in meta["shape"]:
                        count *= int(d)
                    total += count
    return total


def count_params(path: Optional[str], skip_embeddings: bool = False) -> Optional[int]:
    """Parameter count of a checkpoint (GGUF tensor table or safetensors headers), or None when the
    path is unset or unreadable. ``skip_embeddings`` leaves out input-embedding tables (a step gathers
    a few rows of them; it does not stream them), used for a draft's per-pass cost. Reads headers
    only; no torch."""
    if not path:
        return None
    p = _resolve_path(path)
    if p is None or not p.exists():
        return None
    try:
        n = _count_params_cached(str(p), p.stat().st_mtime, skip_embeddings)
    except Exception:
        return None
    return n or None



def bytes_per_param(plan: Plan, hw: cost.HardwareProfile) -> Tuple[float, str]:
    """Bytes per weight as the runtime holds it and the dtype name: ``target.dtype``, else
    ``runtime.dtype``, else the hardware's native dtype (fp32 on the CPU profile, bf16 on GPUs)."""
    dtype = plan.target.dtype if plan.target.dtype != "auto" else plan.runtime.dtype
    if dtype == "auto":
        dtype = hw.dtype
    # native: the checkpoint's own codes (q4 layout 24 bytes / 32 weights, q8 36 / 32; ~0.75 on average)
    return {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "native": 0.75}.get(dtype, 2.0), dtype


def auto_batch_model(plan: Plan) -> Tuple[cost.BatchModel, str]:
    """The :class:`specc.predict.cost.BatchModel` behind ``schedule.kind: auto`` and a one-line description.

    From ``schedule.cost_table`` when set (profiled step function), else from
    ``schedule.hardware`` (roofline) with the target's parameter count read from its checkpoint and
    the draft pass time from the draft checkpoint (memory-bound) or the method's default ratio
    (``specc.methods.Method.default_c``). Raises PlanError when neither is usable."""
    method = methods.get(plan.method.name)
    ratio = method.default_c
    if plan.schedule.cost_table:
        table = cost.load_cost_table(plan.schedule.cost_table)
        model = cost.batch_model_from_table(table, fallback_draft_ratio=ratio)
        return model, f"cost table {table.path} ({table.device or 'unknown device'})"
    if not plan.schedule.hardware:
        raise PlanError("schedule.kind = auto needs schedule.hardware (one of conf/hardware/*.yaml, "
                        "e.g. h100, h200, cpu) or schedule.cost_table (a `specc profile` JSON)")
    hw = cost.load_hardware_profile(plan.schedule.hardware)
    params = count_params(plan.target.path)
    if params is None:
        raise PlanError(f"schedule.kind = auto with schedule.hardware = {plan.schedule.hardware} "
                        f"needs the target's size, but target.path = {plan.target.path!r} is not a "
                        "readable checkpoint; fix target.path or set schedule.cost_table")
    bpp, dtype = bytes_per_param(plan, hw)
    floor = params * bpp / hw.effective_bandwidth
    draft_params = count_params(plan.draft.path, skip_embeddings=True) if plan.draft is not None else None
    if not method.drafts or method.lookup:
        draft_time, how = 0.0, "no draft model"
    elif draft_params:
        draft_time = draft_params * bpp / hw.effective_bandwidth
        how = f"draft {draft_params / 1e6:.1f}M params memory-bound"
    else:
        draft_time = ratio * floor
        how = f"draft c = {ratio} (method default)"
    model = cost.batch_model_from_hardware(hw, params, bpp, draft_time)
    desc = (f"{hw.name} roofline: target {params / 1e6:.1f}M params {dtype}, memory floor "
            f"{floor * 1e3:.3f} ms, compute-bound past {model.saturation_tokens:.0f} tokens; {how} "
            f"({draft_time * 1e3:.3f} ms/pass)")
    return model, desc


def default_hardware(plan: Plan) -> str:
    """The hardware profile the cost model assumes: ``schedule.hardware``, else ``h100`` when
    ``runtime.device`` is cuda, else ``cpu``."""
    if plan.schedule.hardware:
        return plan.schedule.hardware
    return "h100" if plan.runtime.device == "cuda" else "cpu"


def draft_config(plan: Plan) -> Optional[dict]:
    """The draft checkpoint's HF ``config.json`` as a dict, or None (no draft, GGUF, not on disk)."""
    if plan.draft is None or not plan.draft.path:
        return None
    p = _resolve_path(plan.draft.path)
    if p is None:
        return None
    cfg = p / "config.json" if p.is_dir() else p.with_name("config.json")
    from specc.errors import SpeccError
    from specc.io import CONFIG_JSON_LIMIT, read_bounded

    try:
        data = json.loads(read_bounded(cfg, CONFIG_JSON_LIMIT, "draft config"))
    except (SpeccError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _draft_kv_layers(plan: Plan, cfg: dict) -> int:
    """Layers of draft KV per token: MTP checkpoints keep one per NEXTN layer run
    (``num_nextn_predict_layers``; multi-layer EAGLE: its first κ), others ``num_hidden_layers``."""
    n = cfg.get("num_nextn_predict_layers")
    if n is None:
        return int(cfg.get("num_hidden_layers", 1))
    n = int(n)
    m = methods.get(plan.method.name)
    if m.one_module_per_step and isinstance(plan.method.num_steps, int):
        return min(n, max(plan.method.num_steps, 1))
    return 1 if m.target_ships_draft else n  # MTP reruns its one NEXTN layer for every step


def _kv_geometry(plan: Plan, cfg: dict):
    """``(kv_heads, head_dim)`` of a draft config, or None when it lacks them."""
    try:
        heads = int(cfg["num_attention_heads"])
        return int(cfg.get("num_key_value_heads", heads)), int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return None


def draft_kv_bytes_per_token(plan: Plan) -> Optional[int]:
    """Draft KV-cache bytes per token: 2 (K and V) · layers · kv_heads · head_dim · bytes, from the
    draft's config.json (:func:`specc.predict.cost.draft_kv_bytes_per_token`). 0 for methods without a draft
    KV (none, ngram, suffix, medusa; frozen-KV MTP reads the target's KV — SGLang FROZEN_KV_MTP);
    None when the draft config is unavailable."""
    if not methods.get(plan.method.name).has_draft_kv:
        return 0
    cfg = draft_config(plan)
    geo = _kv_geometry(plan, cfg) if cfg else None
    if geo is None:
        return None
    hw = cost.load_hardware_profile(default_hardware(plan))
    bpp, _ = bytes_per_param(plan, hw)
    return cost.draft_kv_bytes_per_token(_draft_kv_layers(plan, cfg), geo[0], geo[1], bpp)


def frozen_kv_bytes_saved_per_token(plan: Plan) -> Optional[int]:
    """For frozen-KV MTP: the draft KV per token the same assistant would allocate with a pool of its
    own (2 · its layers · the target's kv_heads · head_dim · bytes: 4 KiB per token and layer
    at h_kv = 8, d_h = 128, bf16); None for other methods or without a readable config."""
    if not methods.get(plan.method.name).frozen_kv:
        return None
    cfg = draft_config(plan)
    geo = _kv_geometry(plan, cfg) if cfg else None
    if geo is None:
        return None
    hw = cost.load_hardware_profile(default_hardware(plan))
    bpp, _ = bytes_per_param(plan, hw)
    return cost.draft_kv_bytes_per_token(int(cfg.get("num_hidden_layers", 1)), geo[0], geo[1], bpp)


def shared_head_params(plan: Plan) -> int:
    """Weights of the target's LM head a draft pass streams for the MTP family (their checkpoints share
    the target's head and store none): ``draft_vocab_size`` (else ``vocab_size``) × the target's
    hidden size from the draft config; 0 for other methods or without a config."""
    if not methods.get(plan.method.name).shares_target_head:
        return 0
    cfg = draft_config(plan) or {}
    hidden = cfg.get("backbone_hidden_size") or cfg.get("hidden_size")
    rows = cfg.get("draft_vocab_size") or cfg.get("vocab_size")
    return int(rows) * int(hidden) if isinstance(rows, int) and isinstance(hidden, int) else 0


def module_params(plan: Plan) -> Optional[List[int]]:
    """Parameters of each MTP module of a multi-layer checkpoint (``model.layers.{L + i}.*`` tensors,
    from the safetensors header), or None when unreadable."""
    cfg = draft_config(plan)
    if plan.draft is None or not plan.draft.path or not cfg or "num_nextn_predict_layers" not in cfg:
        return None
    p = _resolve_path(plan.draft.path)
    f = (p / "model.safetensors") if p is not None and p.is_dir() else p
    if f is None or not f.is_file():
        return None
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > 100_000_000:
                return None
            header = json.loads(fh.read(n))
    except (OSError, ValueError, struct.error):
        return None
    first = int(cfg.get("first_mtp_layer", cfg.get("num_hidden_layers", 0)))
    counts = [0] * int(cfg["num_nextn_predict_layers"])
    for key, meta in header.items():
        parts = key.split(".")
        if key == "__metadata__" or len(parts) < 3 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
            continue
        i = int(parts[2]) - first
        if 0 <= i < len(counts):
            size = 1
            for d in meta["shape"]:
                size *= int(d)
            counts[i] += size
    return counts


def _plan_cost_table(plan: Plan) -> Optional[cost.CostTable]:
    """The plan's ``schedule.cost_table`` as a specc cost table, or None when unset. For an
    SGLang/vLLM plan an unreadable table is skipped (an engine's own table, e.g. SGLang's SPS table,
    is not a specc cost table); for the specc engine it is an error.

    Raises: PlanError for an unreadable table of a ``specc`` plan (:func:`specc.predict.cost.load_cost_table`).
    """
    if not plan.schedule.cost_table:
        return None
    try:
        return cost.load_cost_table(plan.schedule.cost_table)
    except PlanError:
        if plan.engine == "specc":
            raise
        return None


def draft_cost_ratio(plan: Plan) -> Tuple[float, str]:
    """c = t_draft / t_target for one draft pass, and its source: 0 for lookups and plain decode;
    the profiled draft pass over the profiled one-token target step when ``schedule.cost_table``
    has both and its draft pass timed this method's drafter; else the draft/target parameter ratio when both checkpoints are readable (both passes
    memory-bound; the draft's input embeddings are left out, a pass gathers only a few rows of
    them; a block drafter's pass adds the target's LM head it reads); else the method's default (``specc.methods.Method.default_c``)."""
    m = plan.method.name
    method = methods.get(m)
    if not method.drafts or method.lookup:
        return 0.0, f"{m}: no draft model"
    table = _plan_cost_table(plan)
    if table is not None and table.draft_applies(m):
        d1 = table.draft_pass_ms(1)
        return d1 / table.step_ms(1), f"cost table {table.path} (draft pass / one-token step)"
    modules = module_costs(plan)
    if modules:
        return sum(modules) / len(modules), (f"mean of {len(modules)} modules' params (+ the shared head rows) "
                                             f"over the target's")
    if plan.draft is not None and plan.draft.path:
        dp = count_params(plan.draft.path, skip_embeddings=True)
        tp = count_params(plan.target.path) if dp else None
        if dp and tp:
            head = shared_head_params(plan)
            if head:
                dp += head
                return dp / tp, f"draft/target params {dp / 1e6:.1f}M/{tp / 1e6:.1f}M incl. the shared head's rows"
            note = ""
            cfg = draft_config(plan) if method.draft_shape == "block" else None
            if cfg and isinstance(cfg.get("vocab_size"), int) and isinstance(cfg.get("hidden_size"), int):
                # a DFlash/DSpark pass also streams the target's LM head (it has none of its own)
                dp += int(cfg["vocab_size"]) * int(cfg["hidden_size"])
                note = " incl. the target's LM head"
            return dp / tp, f"draft/target params {dp / 1e6:.1f}M/{tp / 1e6:.1f}M{note}"
    return method.default_c, f"method default for {m}"




def module_costs(plan: Plan) -> Optional[Tuple[float, ...]]:
    """Multi-layer EAGLE: c_i per module, (module i's params + the shared head's rows) / the target's
    params (each pass memory-bound), from the checkpoint headers; None for other methods or
    when unreadable. Module i drafts step i + 1, so a κ step costs Σ_{i<κ} c_i."""
    if not methods.get(plan.method.name).one_module_per_step:
        return None
    counts = module_params(plan)
    tp = count_params(plan.target.path) if counts else None
    if not counts or not tp:
        return None
    head = shared_head_params(plan)
    return tuple((n + head) / tp for n in counts)


@dataclass(frozen=True)
class CostInputs:
    """What the cost model needs about a plan beyond its candidate states (:func:`cost_inputs`).

    Attributes:
        alpha, alpha_source: per-position acceptance α and where it came from (:func:`plan_alpha`).
        c, c_source: draft cost ratio t_draft / t_target of one draft pass (:func:`draft_cost_ratio`).
        hardware: the hardware profile's name; bytes_per_param: bytes per target weight.
        saturation_tokens: T*, tokens per forward at which the target turns compute-bound
            (:func:`specc.predict.cost.saturation_tokens`).
        draft_kv_bytes_per_token: draft KV bytes per token (None when unknown).
        draft_hidden_size: the draft's ``hidden_size`` for methods that read target hidden states
            (None when unknown), for stage-graph shapes.
        batch_model: the profiled :class:`specc.predict.cost.BatchModel` of ``schedule.cost_table`` (None
            without a readable specc cost table); predictions at a batch size then use it instead of
            the hardware roofline.
        c_modules: multi-layer EAGLE's c_i per module (:func:`module_costs`; None otherwise): a step
            costs Σ c_i over its κ modules.
        draft_kv_bytes_saved_per_token: frozen-KV MTP's saving (:func:`frozen_kv_bytes_saved_per_token`).
        acceptance: the drafter's measured acceptance (:class:`specc.predict.acceptance.Entry`) when α came
            from its record: E per state from its per-position rates (:func:`specc.predict.cost.predict`).
    """

    alpha: float
    alpha_source: str
    c: float
    c_source: str
    hardware: str
    bytes_per_param: float
    saturation_tokens: float
    draft_kv_bytes_per_token: Optional[int]
    draft_hidden_size: Optional[int]
    batch_model: Optional[cost.BatchModel] = None
    c_modules: Optional[Tuple[float, ...]] = None
    draft_kv_bytes_saved_per_token: Optional[int] = None
    acceptance: Optional[object] = None


def cost_inputs(plan: Plan, alpha: Optional[float] = None, c: Optional[float] = None,
                hardware: Optional[str] = None, acceptance=None) -> CostInputs:
    """Collect :class:`CostInputs` for ``plan``.

    Args:
        alpha: override of α (``--alpha``); c: override of c (``--c``); hardware: override of the
            hardware profile (``--hardware``; default :func:`default_hardware`); acceptance: a measured
            :class:`specc.predict.acceptance.Entry` to use instead of the drafter's own record.
    Raises:
        PlanError: α outside [0, 1], a negative or non-finite c, an unknown hardware profile, an
            unreadable cost table.
    """
    import math

    if acceptance is not None and alpha is None:
        a, a_src, entry = acceptance.alpha, acceptance.describe, acceptance
    else:
        a, a_src, entry = plan_acceptance(plan, alpha)
    if c is not None:
        c_val, c_src = float(c), "--c"
        if not (math.isfinite(c_val) and c_val >= 0):
            raise PlanError(f"--c must be a finite number >= 0 (c = t_draft / t_target), got {c}")
    else:
        c_val, c_src = draft_cost_ratio(plan)
    modules = module_costs(plan) if c is None else None
    hw = cost.load_hardware_profile(hardware or default_hardware(plan))
    bpp, _ = bytes_per_param(plan, hw)
    hidden = None
    if methods.get(plan.method.name).consumes_hidden:
        h = (draft_config(plan) or {}).get("hidden_size")
        hidden = int(h) if isinstance(h, int) else None
    table = _plan_cost_table(plan)
    model = None if table is None else cost.batch_model_from_table(table, fallback_draft_ratio=c_val,
                                                                    method=plan.method.name)
    return CostInputs(alpha=a, alpha_source=a_src, c=c_val, c_source=c_src, hardware=hw.name,
                      bytes_per_param=bpp, saturation_tokens=cost.saturation_tokens(hw, bpp),
                      draft_kv_bytes_per_token=draft_kv_bytes_per_token(plan), draft_hidden_size=hidden,
                      batch_model=model, c_modules=modules,
                      draft_kv_bytes_saved_per_token=frozen_kv_bytes_saved_per_token(plan), acceptance=entry)
