"""Lowering: a plan becomes its candidate states.

A candidate state is one (captured batch size, κ, tree shape, verify width, verify rule) the schedule
can select at run time; codegen emits one program per state and the runtime swaps between them
atomically (SGLang's ``SpecRuntimeState``, sglang-0.5.23.md §4 "Runtime state and switching").

Pruning follows SGLang's ``cuda_graph_bs_for_step`` (adaptive_spec_params.py:328-340): a captured batch
size b gets a state for step κ only if the schedule slot that b routes to lists κ. Routing is SGLang's
(adaptive_spec_params.py:342-358): the slot is the largest bucket key ≤ b, clamped to the first slot.

``schedule.kind``:

* ``static`` — one κ (``method.num_steps``) for every captured size.
* ``batch_buckets`` — vLLM's per-batch-size K: each bucket's ``candidates`` (usually one κ).
* ``adaptive`` — SGLang's controller: each bucket's candidate steps; with no buckets, SGLang's
  ``DEFAULT_ADAPTIVE_CONFIG`` (adaptive_spec_params.py:28-53: 1→[1,3,5,7], 8→[0,1,3], 32→[0,1], 64→[0]).
* ``budget`` — adaptive verification (vLLM AV / DSpark budget): one full-width state per captured size;
  the per-request verify length is chosen at run time inside that state.
* ``auto`` — each bucket's candidates derived from the cost model (:mod:`specc.cost`) and
  ``schedule.hardware`` or ``schedule.cost_table``, with a reason per bucket (:func:`derive_auto_buckets`).

Nothing here imports torch.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import importlib.util
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from specc import cost
from specc.errors import PlanError
from specc.plan.schema import Plan

# Methods whose draft is proposed in one forward pass for the whole block (zoo seed lines 42-60;
# vLLM method table: dflash and dspark default parallel_drafting True, SP:1581-1582; Medusa's heads
# all read the same last hidden state, so its κ tokens come from one pass too).
ALWAYS_PARALLEL = ("dflash", "dspark", "medusa")
# Methods with no draft model forward (CPU/GPU lookup): vLLM ngram/suffix, SGLang NGRAM (no draft KV,
# spec_info.py:174-178).
MODEL_FREE = ("ngram", "suffix")
# Methods whose drafter can run in parallel-drafting mode when ``method.parallel_drafting`` is set
# (vLLM: PARD for draft_model, P-EAGLE for eagle/eagle3; vllm-0.33.0.md §2).
PARALLEL_CAPABLE = ("draft_model", "eagle", "eagle3")

# SGLang's default adaptive config (adaptive_spec_params.py:28-53; sglang-0.5.23.md §4).
SGLANG_DEFAULT_ADAPTIVE = {1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}

# Fallback κ when the plan leaves method.num_steps unset and no bucket names candidates:
# SGLang's EG12 default (speculative_hook.py:1164-1174: "anything else -> (3, 1, 4)"), DFlash's
# block 16 (DF13, speculative_hook.py:389-425, κ = 15) and DSpark's γ = 7 (DS13, dspark_config.py:21).
DEFAULT_NUM_STEPS = {"dflash": 15, "dspark": 7}  # γ (DFlash block 16 = γ + 1)
DEFAULT_NUM_STEPS_OTHER = 3

# Default draft cost ratio c = t_draft / t_target when nothing better is known (used by `auto` and
# `explain`): §6.2's 1B-for-8B draft (0.165) for draft_model; the second seed's one-layer head
# (T_DRAFT 0.25 ms over a 5.97 ms memory floor = 0.042) for heads and block drafters; 0 for lookups.
DEFAULT_DRAFT_COST_RATIO = {
    "none": 0.0, "ngram": 0.0, "suffix": 0.0, "draft_model": 0.165, "custom": 0.165,
    "eagle": 0.042, "eagle3": 0.042, "mtp": 0.042, "frozen_kv_mtp": 0.042,
    "multi_layer_eagle": 0.042, "medusa": 0.01, "dflash": 0.042, "dspark": 0.042,
}

# Default per-position acceptance when the plan gives none: §6.2's configuration (zoo seed line 38).
DEFAULT_ALPHA = 0.70


@dataclass(frozen=True)
class CandidateState:
    """One program the runtime may switch to (shared interface, notes/TEAM.md).

    Fields:
        name: valid Python identifier built from every parameter, e.g. ``b4_k3_topk1_w4_greedy_chain``
            (see :func:`state_name`).
        method: ``plan.method.name``.
        batch_size: the captured batch bucket B.
        num_steps: κ, draft tokens proposed per step (0 = plain decode).
        topk: branching factor per draft level (1 = chain or parallel block).
        num_draft_tokens: W, verify width per request incl. the bonus/root (chain/parallel: κ + 1).
        verify_rule: ``greedy`` | ``standard`` | ``block`` | ``synthetic``.
        draft_sampling: ``greedy`` | ``probabilistic``.
        parallel: True when one draft pass emits the whole block.
        tree_choices: static tree (paths of child ranks from the root) or None.
    """

    name: str
    method: str
    batch_size: int
    num_steps: int
    topk: int
    num_draft_tokens: int
    verify_rule: str
    draft_sampling: str
    parallel: bool
    tree_choices: Optional[Tuple[Tuple[int, ...], ...]] = None

    @property
    def kind(self) -> str:
        """``plain`` (κ = 0), ``parallel``, ``tree`` or ``chain``."""
        return state_kind(self.num_steps, self.topk, self.parallel, self.tree_choices)


def state_kind(num_steps: int, topk: int, parallel: bool,
               tree_choices: Optional[Tuple[Tuple[int, ...], ...]]) -> str:
    if num_steps == 0:
        return "plain"
    if tree_choices is not None or topk > 1:
        return "tree"
    return "parallel" if parallel else "chain"


def tree_digest(tree_choices: Tuple[Tuple[int, ...], ...]) -> str:
    """First 8 hex digits of the SHA-256 of the canonical tree_choices JSON (names a tree shape)."""
    blob = json.dumps([list(p) for p in tree_choices], separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:8]


def state_name(batch_size: int, num_steps: int, topk: int, num_draft_tokens: int, verify_rule: str,
               draft_sampling: str, parallel: bool,
               tree_choices: Optional[Tuple[Tuple[int, ...], ...]] = None) -> str:
    """``b{B}_k{κ}_topk{topk}_w{W}_{rule}[_qprob]_{plain|chain|parallel|tree}[_t{digest}]``.

    Every parameter appears: ``_qprob`` marks probabilistic draft sampling (greedy drafts are the
    default and add nothing), ``_t<8 hex>`` the static tree shape. Always a valid identifier."""
    kind = state_kind(num_steps, topk, parallel, tree_choices)
    name = f"b{batch_size}_k{num_steps}_topk{topk}_w{num_draft_tokens}_{verify_rule}"
    if draft_sampling != "greedy":
        name += "_qprob"
    name += f"_{kind}"
    if tree_choices is not None and num_steps > 0:
        name += f"_t{tree_digest(tree_choices)}"
    assert name.isidentifier(), name
    return name


@dataclass(frozen=True)
class Lowering:
    """Everything lowering decided: the states, the capture sizes, the bucket table actually used
    (key → κ candidates), a reason per bucket (for ``auto``: why these κ) and notes on defaults."""

    states: Tuple[CandidateState, ...]
    capture_sizes: Tuple[int, ...]
    buckets: Dict[int, Tuple[int, ...]]
    reasons: Dict[int, str] = field(default_factory=dict)
    notes: Tuple[str, ...] = ()
    alpha: float = DEFAULT_ALPHA
    alpha_source: str = ""


# ----------------------------------------------------------------------------------------------------
# Method facts
# ----------------------------------------------------------------------------------------------------


def is_parallel(plan: Plan) -> bool:
    """True when one draft pass emits the whole block (dflash, dspark; or PARD / P-EAGLE when
    ``method.parallel_drafting`` is set)."""
    m = plan.method
    return m.name in ALWAYS_PARALLEL or (bool(m.parallel_drafting) and m.name in PARALLEL_CAPABLE)


def plan_tree_choices(plan: Plan) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """``method.tree_choices`` as a tuple of tuples, validated (non-empty paths of ranks ≥ 0 whose
    parents are present). Raises PlanError naming ``method.tree_choices``."""
    tc = plan.method.tree_choices
    if not tc:
        return None
    paths = tuple(tuple(int(r) for r in p) for p in tc)
    seen = set(paths)
    for p in paths:
        if not p or min(p) < 0:
            raise PlanError(f"method.tree_choices: path {list(p)} must be a non-empty list of ranks >= 0")
        if len(p) > 1 and p[:-1] not in seen:
            raise PlanError(f"method.tree_choices: path {list(p)} has no parent {list(p[:-1])}; "
                            "list every prefix of a path")
    if len(seen) != len(paths):
        raise PlanError("method.tree_choices: duplicate paths")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def base_num_steps(plan: Plan) -> Tuple[int, Optional[str]]:
    """κ of a static plan: ``method.num_steps``; for parallel drafters ``num_draft_tokens − 1`` or
    ``block_size`` when num_steps is unset (DSpark γ = num_draft_tokens − 1, sglang-0.5.23.md §5);
    else the engine default. Returns (κ, note or None)."""
    m = plan.method
    if m.name == "none":
        return 0, None
    tc = plan_tree_choices(plan)
    if tc is not None:
        return max(len(p) for p in tc), None
    if m.num_steps is not None and not (m.name in ("dflash", "dspark") and m.num_steps == 1
                                        and (m.num_draft_tokens or m.block_size)):
        # SGLang pins DFlash/DSpark num_steps to 1 (DF8, DS11); then the block comes from the width.
        return int(m.num_steps), None
    if is_parallel(plan):
        if m.num_draft_tokens is not None:
            return int(m.num_draft_tokens) - 1, None
        if m.block_size is not None:
            # method.block_size is γ, the draft tokens of the block (the plan schema's meaning, as
            # the SGLang rule table maps it: num_draft_tokens = γ + 1, DF11/DS15).
            return int(m.block_size), None
    if m.topk is not None and m.topk == 1 and m.num_draft_tokens is not None:
        return int(m.num_draft_tokens) - 1, None
    k = DEFAULT_NUM_STEPS.get(m.name, DEFAULT_NUM_STEPS_OTHER)
    return k, (f"method.num_steps unset: using κ = {k} (engine default: SGLang "
               "speculative_hook.py:1164-1174 (3,1,4); DFlash block 16, DSpark γ 7)")


def verify_width(plan: Plan, num_steps: int) -> int:
    """W, the verify width per request incl. the bonus/root, for κ = ``num_steps``.

    chain / parallel / plain: κ + 1 (SGLang EG20 and AD11). Static tree: len(tree_choices) + 1.
    Dynamic tree (topk > 1): ``method.num_draft_tokens`` when set, else the whole candidate pool + 1
    (topk + (κ − 1)·topk² nodes, sglang-0.5.23.md §5). Raises PlanError when num_draft_tokens − 1
    exceeds the pool (a case SGLang does not check at startup)."""
    if num_steps == 0:
        return 1
    tc = plan_tree_choices(plan)
    if tc is not None:
        return len(tc) + 1
    topk = plan_topk(plan)
    if topk <= 1:
        return num_steps + 1
    pool = cost.tree_pool_size(num_steps, topk)
    w = plan.method.num_draft_tokens
    if w is None:
        return pool + 1
    if w - 1 > pool:
        raise PlanError(f"method.num_draft_tokens = {w} exceeds the draft tree: κ = {num_steps}, "
                        f"topk = {topk} has only {pool} candidates (+1 root); lower "
                        f"num_draft_tokens to <= {pool + 1} or raise num_steps/topk")
    return int(w)


def plan_topk(plan: Plan) -> int:
    """topk: ``method.topk`` (default 1); for tree_choices, the largest rank + 1."""
    tc = plan_tree_choices(plan)
    if tc is not None:
        return max(max(p) for p in tc) + 1
    return int(plan.method.topk or 1)


def capture_sizes(plan: Plan) -> Tuple[int, ...]:
    """Captured batch sizes: ``schedule.capture_batch_sizes`` if set, else powers of two up to
    ``runtime.max_batch_size`` plus max_batch_size itself. Raises PlanError for sizes < 1."""
    sizes = plan.schedule.capture_batch_sizes
    if sizes:
        bad = [s for s in sizes if int(s) < 1]
        if bad:
            raise PlanError(f"schedule.capture_batch_sizes: sizes must be >= 1, got {bad}")
        return tuple(sorted({int(s) for s in sizes}))
    top = int(plan.runtime.max_batch_size)
    if top < 1:
        raise PlanError(f"runtime.max_batch_size must be >= 1, got {top}")
    out, b = set(), 1
    while b <= top:
        out.add(b)
        b *= 2
    out.add(top)
    return tuple(sorted(out))


def route_slot(keys: Sequence[int], batch_size: int) -> int:
    """SGLang's floor lookup (adaptive_spec_params.py:342-358): the largest key ≤ batch_size,
    clamped to the first key. ``keys`` sorted ascending, non-empty."""
    i = bisect.bisect_right(list(keys), batch_size) - 1
    return keys[max(i, 0)]


def plan_alpha(plan: Plan, override: Optional[float] = None) -> Tuple[float, str]:
    """The α the cost model assumes, and where it came from: ``override`` (``--alpha``), else the
    plan's synthetic acceptance (``verify.synthetic.acceptance_rates`` — unconditional, so
    E = 1 + Σ r_i — or ``acceptance_length`` = E, each inverted through E(α, κ)), else
    :data:`DEFAULT_ALPHA` (§6.2)."""
    if override is not None:
        if not 0.0 <= override <= 1.0:
            raise PlanError(f"--alpha must lie in [0, 1], got {override}")
        return float(override), "--alpha"
    syn = plan.verify.synthetic
    if syn.acceptance_rates:
        # vLLM's rates are unconditional: r_i = P(first i+1 drafts accepted), so E = 1 + Σ r_i
        # (vllm-0.33.0.md §5 "Synthetic"); α is the constant per-position rate with the same E.
        rates = [min(max(float(r), 0.0), 1.0) for r in syn.acceptance_rates]
        e = 1.0 + sum(rates)
        return cost.alpha_for_expected_tokens(min(e, len(rates) + 1.0), len(rates)), (
            f"verify.synthetic.acceptance_rates (E = {e:.3f} over {len(rates)} positions)")
    if syn.acceptance_length is not None:
        k, _ = base_num_steps(plan)
        k = max(k, 1)
        e = min(max(float(syn.acceptance_length), 1.0), k + 1.0)
        return cost.alpha_for_expected_tokens(e, k), (
            f"verify.synthetic.acceptance_length = {syn.acceptance_length} inverted at κ = {k}")
    return DEFAULT_ALPHA, "default (§6.2's α = 0.70)"


# ----------------------------------------------------------------------------------------------------
# schedule.kind: auto
# ----------------------------------------------------------------------------------------------------


def _resolve_path(path: str) -> Optional[Path]:
    """Map a plan model path to a file; ``pkg://`` through specc.models.resolve when available."""
    if path.startswith("pkg://"):
        try:
            from specc.models.resolve import resolve_model_path  # no torch (TEAM.md)

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
    return {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}.get(dtype, 2.0), dtype


def auto_batch_model(plan: Plan) -> Tuple[cost.BatchModel, str]:
    """The :class:`specc.cost.BatchModel` behind ``schedule.kind: auto`` and a one-line description.

    From ``schedule.cost_table`` when set (profiled step function), else from
    ``schedule.hardware`` (roofline) with the target's parameter count read from its checkpoint and
    the draft pass time from the draft checkpoint (memory-bound) or the method's default ratio
    (:data:`DEFAULT_DRAFT_COST_RATIO`). Raises PlanError when neither is usable."""
    ratio = DEFAULT_DRAFT_COST_RATIO.get(plan.method.name, 0.165)
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
    if plan.method.name in MODEL_FREE or plan.method.name == "none":
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


def draft_kv_bytes_per_token(plan: Plan) -> Optional[int]:
    """Draft KV-cache bytes per token: 2 (K and V) · layers · kv_heads · head_dim · bytes, from the
    draft's config.json. 0 for methods without a draft KV (none, ngram, suffix, medusa; frozen-KV MTP
    reads the target's KV — SGLang FROZEN_KV_MTP); None when the draft config is unavailable."""
    if plan.method.name in ("none", "ngram", "suffix", "medusa", "frozen_kv_mtp"):
        return 0
    cfg = draft_config(plan)
    if not cfg:
        return None
    try:
        layers = int(cfg.get("num_hidden_layers", 1))
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads", heads))
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return None
    hw = cost.load_hardware_profile(default_hardware(plan))
    bpp, _ = bytes_per_param(plan, hw)
    return int(2 * layers * kv_heads * head_dim * bpp)


def draft_cost_ratio(plan: Plan) -> Tuple[float, str]:
    """c = t_draft / t_target for one draft pass, and its source: 0 for lookups and plain decode;
    draft/target parameter ratio when both checkpoints are readable (both passes memory-bound, §6.2;
    the draft's input embeddings are left out, a pass gathers only a few rows of them);
    else :data:`DEFAULT_DRAFT_COST_RATIO` for the method."""
    m = plan.method.name
    if m in MODEL_FREE or m == "none":
        return 0.0, f"{m}: no draft model"
    if plan.draft is not None and plan.draft.path:
        dp = count_params(plan.draft.path, skip_embeddings=True)
        tp = count_params(plan.target.path) if dp else None
        if dp and tp:
            return dp / tp, f"draft/target params {dp / 1e6:.1f}M/{tp / 1e6:.1f}M"
    ratio = DEFAULT_DRAFT_COST_RATIO.get(m, 0.165)
    return ratio, f"method default for {m}"


def derive_auto_buckets(plan: Plan, sizes: Sequence[int], alpha: float,
                        max_steps: Optional[int] = None, spread: float = 0.1
                        ) -> Tuple[Dict[int, Tuple[int, ...]], Dict[int, str], str]:
    """``schedule.kind: auto``: each captured size's κ candidates from the batch model.

    For every captured batch b the best κ (max tokens/s, second seed's search over 0..max_steps;
    default 0..max(8, method.num_steps) for chains, 0..γ for block drafters) is
    found at α − spread, α and α + spread; the candidates are those (deduplicated), so an adaptive
    controller can follow acceptance within that band. Consecutive sizes with equal candidates merge
    into one bucket keyed by the smallest size. Returns (buckets, reason per bucket, model line).
    """
    model, desc = auto_batch_model(plan)
    par = is_parallel(plan)
    if max_steps is None:
        if par:  # a block drafter emits γ tokens; verifying a prefix of the block is the only knob
            max_steps = base_num_steps(plan)[0]
        else:  # the second seed's search range 0..8, widened to a larger method.num_steps
            max_steps = max(8, int(plan.method.num_steps or 0))
    per_size: List[Tuple[int, Tuple[int, ...], str]] = []
    for b in sizes:
        picks = {}
        for a in (max(0.0, alpha - spread), alpha, min(1.0, alpha + spread)):
            picks[a] = cost.best_num_steps(b, a, model, par, max_steps)
        cands = tuple(sorted({k for k, _ in picks.values()}))
        k_mid, tput = picks[alpha]
        base = cost.batch_throughput(b, 0, alpha, model, par)
        step = model.step_time(b * (k_mid + 1))
        if model.step_time_fn is not None:
            regime = "profiled"
        elif b * (k_mid + 1) <= model.saturation_tokens:
            regime = "memory-bound"
        else:
            regime = "compute-bound"
        band = ", ".join(f"α={a:.2f}→κ={k}" for a, (k, _) in picks.items())
        reason = (f"batch {b}: best κ={k_mid} at α={alpha:.2f} ({tput / base:.2f}× plain, "
                  f"{tput:.0f} tok/s; verify {b * (k_mid + 1)} tokens in {step * 1e3:.3f} ms"
                  f", {regime}); {band}")
        per_size.append((b, cands, reason))
    buckets: Dict[int, Tuple[int, ...]] = {}
    reasons: Dict[int, str] = {}
    last_size: Dict[int, int] = {}
    for b, cands, reason in per_size:
        if buckets and buckets[max(buckets)] == cands:
            last_size[max(buckets)] = b
            continue
        buckets[b], reasons[b], last_size[b] = cands, reason, b
    for key, end in last_size.items():
        if end != key:
            reasons[key] += f" (same candidates up to batch {end})"
    return buckets, reasons, desc


# ----------------------------------------------------------------------------------------------------
# lower
# ----------------------------------------------------------------------------------------------------


def _bucket_table(plan: Plan, sizes: Sequence[int], alpha: float
                  ) -> Tuple[Dict[int, Tuple[int, ...]], Dict[int, str], List[str]]:
    s = plan.schedule
    notes: List[str] = []
    kind = s.kind
    if plan.method.name == "none":
        return {min(sizes): (0,)}, {min(sizes): "method none: plain decode only"}, notes
    if kind == "auto":
        buckets, reasons, desc = derive_auto_buckets(plan, sizes, alpha)
        notes.append(f"auto schedule from {desc}")
        return buckets, reasons, notes
    if kind in ("adaptive", "batch_buckets") and s.buckets:
        table = {}
        for key, bucket in s.buckets.items():
            cands = bucket.candidates if hasattr(bucket, "candidates") else bucket["candidates"]
            if not cands:
                raise PlanError(f"schedule.buckets.{key}.candidates is empty; list the κ values "
                                "allowed at this batch size (0 = plain decode)")
            bad = [c for c in cands if int(c) < 0]
            if bad:
                raise PlanError(f"schedule.buckets.{key}.candidates: κ must be >= 0, got {bad}")
            table[int(key)] = tuple(sorted({int(c) for c in cands}))
        return table, {k: f"schedule.buckets.{k}" for k in table}, notes
    if kind == "adaptive":
        notes.append("schedule.buckets empty: SGLang DEFAULT_ADAPTIVE_CONFIG "
                     "(adaptive_spec_params.py:28-53)")
        return dict(SGLANG_DEFAULT_ADAPTIVE), {k: "SGLang default" for k in SGLANG_DEFAULT_ADAPTIVE}, notes
    k, note = base_num_steps(plan)
    if note:
        notes.append(note)
    return {min(sizes): (k,)}, {min(sizes): f"{kind}: method.num_steps = {k}"}, notes


def lower_report(plan: Plan, alpha: Optional[float] = None) -> Lowering:
    """Lower ``plan`` to its candidate states and report every decision (see module docstring).

    States are sorted by (batch size, κ). Raises PlanError for a plan that cannot be lowered (empty
    bucket, bad widths, auto schedule without hardware/cost table), naming the field.
    """
    if plan.verify.rule not in ("greedy", "standard", "block", "synthetic"):
        raise PlanError(f"verify.rule: unknown rule {plan.verify.rule!r}")
    sizes = capture_sizes(plan)
    a, a_src = plan_alpha(plan, alpha)
    buckets, reasons, notes = _bucket_table(plan, sizes, a)
    keys = sorted(buckets)
    par = is_parallel(plan)
    tc = plan_tree_choices(plan)
    topk = plan_topk(plan)
    states: Dict[str, CandidateState] = {}
    for b in sizes:
        for k in buckets[route_slot(keys, b)]:
            plain = k == 0
            st_topk = 1 if plain else topk
            st_tc = None if plain else tc
            st_par = False if plain else par
            w = verify_width(plan, k)
            name = state_name(b, k, st_topk, w, plan.verify.rule, plan.verify.draft_sampling,
                              st_par, st_tc)
            states[name] = CandidateState(
                name=name, method=plan.method.name, batch_size=b, num_steps=k, topk=st_topk,
                num_draft_tokens=w, verify_rule=plan.verify.rule,
                draft_sampling=plan.verify.draft_sampling, parallel=st_par, tree_choices=st_tc)
    ordered = tuple(sorted(states.values(), key=lambda s: (s.batch_size, s.num_steps, s.name)))
    return Lowering(states=ordered, capture_sizes=tuple(sizes), buckets=buckets, reasons=reasons,
                    notes=tuple(notes), alpha=a, alpha_source=a_src)


def lower(plan: Plan) -> List[CandidateState]:
    """Plan → its candidate states, one per (captured batch size, κ, tree shape, verify width,
    verify rule) the schedule can select, pruned as SGLang prunes graph sizes per step
    (``cuda_graph_bs_for_step``, adaptive_spec_params.py:328-340). Sorted by (batch size, κ).
    Raises PlanError naming the offending field."""
    return list(lower_report(plan).states)
