"""Deployment costs of a plan's candidate states, the lines ``specc explain`` prints per state:

* **CUDA-graph memory** of each captured state, and the KV-cache budget the memory fraction leaves on
  the hardware profile (:func:`graph_memory`, :func:`memory_budget`);
* **tensor-parallel communication**: the all-reduces of one verify forward and of one draft pass
  from the profile's interconnect (:func:`tp_comm`);
* **prefix caching**: the extra prefill speculation adds to a request whose prompt hits the cache
  (:func:`prefix_prefill`).

Inputs are plain numbers: the models' shapes (:class:`ModelShape`, from ``config.json`` or the
shipped table ``specc/data/model_shapes.json``), a candidate state's constants and the hardware
profile (:class:`specc.predict.cost.HardwareProfile`). Every formula names its source (engine ``file:line``,
paper, or the specc module whose allocations it counts). Nothing here imports torch.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specc.console import plural
from specc import methods

SHAPES_FILE = Path(__file__).resolve().parents[1] / "data" / "model_shapes.json"
GIB = float(1 << 30)
MIB = float(1 << 20)

#: specc's half-precision attention: query rows per matmul and KV slots per tile
#: (``specc/models/llama.py``: ``Attention.row_chunk``, ``KV_TILE``)
ROW_CHUNK = 16
KV_TILE = 64
#: bytes per (verified token × vocabulary entry) the standard / block / synthetic rules allocate on
#: top of the fp32 logits in a captured step (``specc.kernels.sampling.process_logits`` with top-k and
#: top-p on, as capture records them): temperature-scaled copy 4, top-k sort values + int64 indices
#: 12, masks 2, masked logits 4, softmax 4, top-p sort 12, cumulative sum 4, masks 2, renormalised and
#: selected probabilities 8 — 38 at the peak (tests/predict/test_graph_memory.py measures it)
SAMPLING_BYTES_PER_TOKEN_VOCAB = 38
#: SGLang's vLLM's default tokens per prefill chunk on >= 60 GiB GPUs (the activation working set of a
#: prefill is sized by it): SGLang ``arg_groups/memory_hook.py:138-160``, vLLM
#: ``engine/arg_utils.py:2975-2985``
PREFILL_CHUNK_TOKENS = 8192
#: vLLM's KV block (scheduler block) size when ``--block-size`` is unset (``vllm/config/cache.py``)
VLLM_BLOCK_SIZE = 16


# ------------------------------------------------------------------------------------------------
# Model shapes


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-family decoder that the costs need (HF ``config.json`` names in brackets).

    hidden [hidden_size] H; layers [num_hidden_layers] L; heads / kv_heads / head_dim (GQA);
    intermediate [intermediate_size] I; vocab V (the LM head's output: ``draft_vocab_size`` for an
    EAGLE-3 head); params: parameter count (None: from the shape, :meth:`param_count`); source: where
    the numbers came from.
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    embed_vocab: int
    tied: bool = False
    params: Optional[int] = None
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """K and V of every layer for one token: 2 · L · kv_heads · head_dim · bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def param_count(self) -> int:
        """``params`` when known, else a Llama decoder's count: embeddings V·H (and an untied head V·H),
        per layer H·(qkv) + q·H + 3·H·I + 2·H, final norm H."""
        if self.params:
            return int(self.params)
        per_layer = self.hidden * self.qkv_dim + self.q_dim * self.hidden + 3 * self.hidden * self.intermediate \
            + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.embed_vocab * self.hidden + head + self.layers * per_layer + self.hidden


#: tokens per request the deployment is sized for when the plan sets no ``target.max_model_len``
DEFAULT_CONTEXT = 2048


def shape_from_config(cfg: Optional[Dict[str, Any]], source: str, params: Optional[int] = None) -> Optional[ModelShape]:
    """A :class:`ModelShape` from HF ``config.json`` keys (``text_config`` is read when present);
    None when a size is missing."""
    if not isinstance(cfg, dict):
        return None
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        vocab = int(cfg["vocab_size"])
        return ModelShape(hidden=hidden, layers=int(cfg.get("num_hidden_layers") or 1), heads=heads, kv_heads=kv,
                          head_dim=head_dim, intermediate=int(cfg.get("intermediate_size") or 4 * hidden),
                          vocab=int(cfg.get("draft_vocab_size") or vocab), embed_vocab=vocab,
                          tied=bool(cfg.get("tie_word_embeddings", False)), params=params, source=source)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _shipped(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path:
        return None
    try:
        table = json.loads(SHAPES_FILE.read_text())
    except (OSError, ValueError):
        return None
    entry = table.get(str(path))
    return entry if isinstance(entry, dict) else None


def model_shape(plan, which: str) -> Optional[ModelShape]:
    """The shape of the plan's ``target`` or ``draft``: its local ``config.json`` (parameters counted
    from the weight headers, :func:`specc.predict.sizing.count_params`), else the shipped table's entry for
    its Hugging Face id. The draft of ``mtp`` / ``frozen_kv_mtp`` without a draft path is one decoder
    layer of the target (the MTP module). None when unknown or for methods without a draft model."""
    sect = getattr(plan, which, None)
    path = sect.path if sect is not None else None
    if which == "draft":
        m = methods.get(plan.method.name)
        if not m.drafts or m.lookup:
            return None
        if not path and (m.target_ships_draft or m.frozen_kv):
            t = model_shape(plan, "target")
            if t is None:
                return None
            return ModelShape(hidden=t.hidden, layers=1, heads=t.heads, kv_heads=t.kv_heads, head_dim=t.head_dim,
                              intermediate=t.intermediate, vocab=t.vocab, embed_vocab=t.embed_vocab, tied=True,
                              params=None, source=f"one decoder layer of the target ({t.source})")
    if not path:
        return None
    return checkpoint_shape(path, getattr(sect, "format", None) or "hf", f"{which}.path")


def checkpoint_shape(path: str, fmt: str = "hf", key: str = "target.path") -> Optional[ModelShape]:
    """The shape of the checkpoint at ``path`` (a plan path: local, ``pkg://`` or a cached Hugging
    Face id; ``fmt`` ``hf`` or ``gguf``), read without loading weights: its ``config.json`` or GGUF
    header (parameters counted from the weight headers), else the shipped table's entry. ``key``
    names it in the source. None when unknown."""
    from specc.predict import sizing
    from specc.models.checkpoints import read_checkpoint

    ck = read_checkpoint(key, path, fmt)
    if ck is not None and ck.config:
        return shape_from_config(ck.config, f"{key} config.json", sizing.count_params(path))
    if ck is not None and ck.fmt == "gguf":
        return shape_from_config(sizing.gguf_config(path), f"{key} GGUF metadata", sizing.count_params(path))
    entry = _shipped(path)
    if entry is not None:
        return shape_from_config(entry, f"specc/data/model_shapes.json ({entry.get('source', path)})")
    return None


# ------------------------------------------------------------------------------------------------
# CUDA-graph memory of one captured state


@dataclass(frozen=True)
class GraphMemory:
    """Bytes a state's captured programs hold in their graph memory pool, with the terms that make it
    up (``terms``: name -> bytes) and the formula in words (``formula``) and its ``source``."""

    bytes: int
    terms: Dict[str, int]
    formula: str
    source: str


def _specc_graph(state, t: ModelShape, dtype_bytes: float, cache_len: int, hidden_outputs: int) -> GraphMemory:
    """specc's captured verify program (verify forward -> accept -> commit, ``SpecRuntimeState.capture``)
    over T = B·W tokens: the peak of the tensors it allocates, counted from the code that runs."""
    b = dtype_bytes
    B, W = int(state.batch_size), int(state.num_draft_tokens)
    T = B * W
    S = int(cache_len)
    V = t.vocab
    if b >= 4:  # fp32 eager attention (Attention.forward): an expanded additive mask kept by every layer,
        persistent = B * t.heads * W * S * 4  # [B·nkv, g·W, S] fp32, built once per forward
        attn = 2 * B * t.heads * W * S * 4  # scores and softmax probabilities [B·nkv, g·W, S] fp32
        attn_src = "fp32 attention: mask, scores, probabilities 3·B·nh·W·S·4"
    else:  # half precision: row-invariant tiled attention (Attention._half)
        s_t = -(-S // KV_TILE) * KV_TILE
        g = t.heads // max(t.kv_heads, 1)
        rows = -(-(g * W) // ROW_CHUNK) * ROW_CHUNK
        persistent = B * W * S * 4  # [B, 1, W, S] fp32 additive mask
        # the mask repeated over the query heads and padded to whole chunks [B, 1, ⌈g·W⌉₁₆, S] fp32, and
        # per chunk of 16 query rows over all slots: bf16 scores 2 + fp32 copy 4 + reshaped copy 4 +
        # mask-added 4 + softmax 4 + its bf16 cast 2, of which 10 bytes live at once; or, when the
        # head dim reaches the tile, the probabilities 6 + the bf16 product and its fp32 copy 6·D/64
        per_slot = max(10.0, 6.0 + 6.0 * t.head_dim / KV_TILE)
        attn = B * rows * s_t * 4 + B * t.kv_heads * ROW_CHUNK * s_t * per_slot
        attn_src = ("half-precision tiled attention: B·⌈g·W⌉₁₆·S·4 + B·nkv·16·S·max(10, 6 + 6·D/64), "
                    "mask B·W·S·4")
    # residual, attention output, normed input, gate|up [2I], silu(gate) [I], silu·up [I]
    mlp = int(T * b * (3 * t.hidden + 4 * t.intermediate))
    head = int(T * V * (4 + (b if b < 4 else 0)))  # LM-head output (model dtype) and its fp32 copy
    # the accept stage runs after the forward returned (its mask freed): greedy takes an argmax; the
    # standard / block / synthetic rules turn the logits into probabilities (process_logits)
    sampling = state.verify_rule != "greedy" and state.num_steps > 0
    accept = int(T * V * (4 + SAMPLING_BYTES_PER_TOKEN_VOCAB)) if sampling else 0
    outputs = int(hidden_outputs * T * t.hidden * b)  # hidden states handed to the drafter
    peak = int(max(persistent + max(attn, mlp, head), accept) + outputs)
    acc_src = f"; accept T·V·(4 + {SAMPLING_BYTES_PER_TOKEN_VOCAB})" if sampling else ""
    return GraphMemory(
        bytes=peak,
        terms={"mask": int(persistent), "attention": int(attn), "mlp": mlp, "head": head, "accept": accept,
               "hidden_out": outputs},
        formula=f"max(mask + max(attention, MLP, logits), accept) over T = B·W = {plural(T, 'token')}, S = {plural(S, 'slot')} "
                f"({attn_src}; MLP T·dtype·(3H + 4I); logits T·V·(4 + dtype){acc_src})",
        source="specc/models/llama.py (LlamaModel.forward, Attention), specc/kernels/sampling.py (process_logits)")


def _engine_graph(engine: str, state, t: ModelShape, d: Optional[ModelShape], dtype_bytes: float,
                  tp: int) -> GraphMemory:
    """SGLang / vLLM: a verify graph over T = B·W tokens with fused attention (no S-long score
    matrix): the largest per-layer working set, per GPU (TP shards the heads and the MLP).
    SGLang also captures the draft's decode (κ passes over B·topk tokens) and draft-extend (B·W
    tokens) graphs into the same pool (``model_executor/runner_utils/pool.py:101-105``); vLLM captures
    the model forward only, its logits are computed outside the graph."""
    b = dtype_bytes
    B, W = int(state.batch_size), int(state.num_draft_tokens)
    T = B * W
    tp = max(int(tp), 1)

    def working_set(shape: ModelShape, tokens: int) -> int:
        return int(tokens * b * (2 * shape.hidden + max((shape.qkv_dim + shape.q_dim) / tp,
                                                          3 * shape.intermediate / tp)))

    verify = working_set(t, T)
    terms = {"target_verify": verify}
    if engine == "sglang" and d is not None and state.num_steps > 0:
        terms["draft_decode"] = working_set(d, B * max(int(state.topk), 1))
        terms["draft_extend"] = working_set(d, T)
    peak = max(terms.values())
    where = ("sglang/srt/model_executor/runner_utils/pool.py:101-105 (one pool for target and draft graphs)"
             if engine == "sglang" else "vllm/compilation/cuda_graph.py:200 (the global graph pool)")
    return GraphMemory(bytes=peak, terms=terms,
                       formula=f"largest per-layer working set T·dtype·(2H + max(qkv+q, 3I)/tp) over T = B·W = {T} "
                               f"tokens" + (" and the draft's decode/extend graphs" if len(terms) > 1 else ""),
                       source=where)


#: the graph-memory formula of each engine, in words, with its source (``specc explain`` prints it once)
GRAPH_FORMULA = {
    "specc": ("peak allocation of the captured verify program over T = B·W tokens and S cache slots: "
              "max(mask + max(attention, MLP T·dtype·(3H + 4I), logits T·V·(4 + dtype)), accept) + hidden outputs; "
              "fp32 attention 3·B·nh·W·S·4, half precision B·⌈g·W⌉₁₆·S·4 + B·nkv·16·S·max(10, 6 + 6·D/64) + mask "
              "B·W·S·4; accept T·V·(4 + 38) for standard/block/synthetic rules; one pool per state "
              "[specc/models/llama.py, specc/kernels/sampling.py; measured by tests/predict/test_graph_memory.py]"),
    "sglang": ("largest per-layer working set T·dtype·(2H + max(qkv + q, 3I)/tp) of the verify graph over T = B·W "
               "tokens and of the draft's decode (B·topk) and extend (B·W) graphs; one pool for all, plus a persistent "
               "fp32 logits buffer of max-batch × W rows "
               "[sglang/srt/model_executor/runner_utils/pool.py:101-105, graph_shared_output.py:11-63]"),
    "vllm": ("largest per-layer working set T·dtype·(2H + max(qkv + q, 3I)/tp) of the model forward over T = B·W "
             "tokens (logits are computed outside the graph); one shared pool "
             "[vllm/compilation/cuda_graph.py:200, v1/worker/gpu_worker.py:707-757]"),
}


def graph_memory(engine: str, state, target: ModelShape, draft: Optional[ModelShape], dtype_bytes: float,
                 cache_len: int, tp: int = 1, hidden_outputs: int = 0) -> GraphMemory:
    """CUDA-graph memory of one candidate state on ``engine`` (``specc``, ``sglang``, ``vllm``).

    Args:
        state: a candidate state (``batch_size`` B, ``num_draft_tokens`` W, ``num_steps`` κ, ``topk``,
            ``verify_rule``). target / draft: the models' shapes. dtype_bytes: bytes per activation
            (2 for bf16). cache_len: KV slots per row the specc runtime attends over (its captured
            programs attend over the whole cache). tp: tensor-parallel size (engines).
            hidden_outputs: target layers whose hidden states the specc runtime hands to the drafter.
    Returns:
        :class:`GraphMemory` (bytes per GPU).
    """
    if engine == "specc":
        return _specc_graph(state, target, dtype_bytes, cache_len, hidden_outputs)
    return _engine_graph(engine, state, target, draft, dtype_bytes, tp)


def engine_graph_pool(engine: str, per_state: Sequence[GraphMemory], rows_max: int, vocab: int) -> Tuple[int, str]:
    """The graph memory the whole deployment holds, per GPU, and how it adds up: the specc runtime gives
    each state its own pool (``SpecRuntimeState.capture`` records into a fresh ``torch.cuda.graph``
    pool), so the states' bytes add; SGLang and vLLM capture every batch size into one shared pool,
    so the largest graph sets it, and SGLang keeps one persistent fp32 logits buffer of ``rows_max``
    rows beside it (``model_executor/graph_shared_output.py:11-63``)."""
    if not per_state:
        return 0, "no captured state"
    if engine == "specc":
        return int(sum(g.bytes for g in per_state)), "Σ over states (one pool per captured state)"
    peak = max(g.bytes for g in per_state)
    if engine == "sglang":
        logits = int(rows_max * vocab * 4)
        return peak + logits, f"largest graph + shared logits buffer {plural(rows_max, 'row')} × V·4"
    return peak, "largest graph (one shared pool)"


# ------------------------------------------------------------------------------------------------
# KV-cache budget


@dataclass(frozen=True)
class MemoryBudget:
    """Per-GPU memory of a deployment on a hardware profile (bytes).

    ``kv_budget``: the KV cache the memory fraction leaves after weights, activations and CUDA graphs;
    ``kv_needed``: the plan's batch × context × KV bytes per token (target and draft); ``refusal``:
    why the deployment cannot start, or why capturing its CUDA graphs leaves less KV than its batch
    needs (None when it fits); ``shortfall``: the batch does not fit at full context even without
    graphs (a note, not a refusal: the engines queue or preempt); ``lines``: the accounting in words,
    with sources.
    """

    memory: float
    weights: float
    graphs: float
    activations: float
    kv_budget: float
    kv_needed: float
    refusal: Optional[str]
    lines: List[str] = field(default_factory=list)
    shortfall: Optional[str] = None


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def memory_budget(engine: str, hw, fraction: Optional[float], weights: float, graphs: float,
                  activations: float, kv_per_token: float, batch: int, context: int,
                  static_buffers: float = 0.0) -> Optional[MemoryBudget]:
    """The KV-cache budget the memory fraction leaves, and a refusal when it cannot hold the plan's batch.

    * SGLang: ``--mem-fraction-static`` covers weights and the KV pool; CUDA graphs and activations
      live in the rest (``arg_groups/fields/schedule.py:27-30``, ``memory_hook.py:59-67``). The pool
      is fraction·M − weights (``model_executor/pool_configurator.py:94-98`` refuses a pool <= 0);
      capture runs out of memory when the graphs exceed (1 − fraction)·M − activations (the refusal's
      message names the SGLang pull request that documents it).
    * vLLM: ``--gpu-memory-utilization`` covers everything; KV = fraction·M − weights − peak
      activations − CUDA-graph estimate (``v1/worker/gpu_worker.py:753-757``).
    * specc: the runtime allocates the KV of ``batch`` rows × ``context`` up front, plus its static
      buffers and one graph pool per state; all of it must fit in M.

    Args: hw: :class:`specc.predict.cost.HardwareProfile` (``memory_bytes`` None: returns None). fraction: the
        resolved memory fraction (None for specc). weights / graphs / activations / static_buffers:
        bytes per GPU. kv_per_token: KV bytes per token per GPU (target + draft). batch, context: the
        plan's concurrent requests and tokens per request.
    """
    M = getattr(hw, "memory_bytes", None)
    if not M:
        return None
    need = float(batch) * float(context) * kv_per_token
    lines: List[str] = []
    refusal = None
    if engine == "sglang":
        frac = float(fraction if fraction is not None else 0.9)
        kv = frac * M - weights
        headroom = (1.0 - frac) * M
        lines.append(f"SGLang: static {frac:.3f} × {_gib(M)} = {_gib(frac * M)} − weights {_gib(weights)} = KV pool "
                     f"{_gib(kv)}; outside it {_gib(headroom)} for CUDA graphs {_gib(graphs)} and prefill "
                     f"activations {_gib(activations)} (memory_hook.py:59-67, pool_configurator.py:94-98)")
        if kv <= 0:
            refusal = (f"the static share {frac:.3f} × {_gib(M)} does not hold the weights ({_gib(weights)}): SGLang "
                       f"refuses (\"Not enough memory. Please try to increase --mem-fraction-static\"); raise "
                       f"deploy.memory_fraction or use more tensor parallelism")
        elif graphs + activations > headroom:
            refusal = (f"CUDA graphs ({_gib(graphs)}) and prefill activations ({_gib(activations)}) exceed the "
                       f"{_gib(headroom)} left outside the static share: capture runs out of memory (SGLang PR #3430); "
                       f"lower deploy.cuda_graph_max_bs or deploy.memory_fraction")
    elif engine == "vllm":
        frac = float(fraction if fraction is not None else 0.92)
        kv = frac * M - weights - activations - graphs
        lines.append(f"vLLM: {frac:.3f} × {_gib(M)} = {_gib(frac * M)} − weights {_gib(weights)} − activations "
                     f"{_gib(activations)} − CUDA graphs {_gib(graphs)} = KV {_gib(kv)} (gpu_worker.py:753-757)")
        if kv < kv_per_token * context:
            refusal = (f"the KV cache left ({_gib(kv)}) does not hold one request of {plural(context, 'token')} "
                       f"({_gib(kv_per_token * context)}): vLLM refuses at startup (\"To serve at least one request "
                       f"with the model's max seq len ...\", v1/core/kv_cache_planning.py:55-87); raise "
                       f"deploy.memory_fraction, lower deploy.cuda_graph_max_bs or target.max_model_len, or use more "
                       f"tensor parallelism")
    else:
        kv = need
        total = weights + need + graphs + static_buffers
        lines.append(f"specc: weights {_gib(weights)} + KV {plural(batch, 'row')} × {plural(context, 'slot')} = {_gib(need)} + graph pools "
                     f"{_gib(graphs)} + static buffers {_gib(static_buffers)} = {_gib(total)} of {_gib(M)}")
        if total > M:
            refusal = (f"weights, KV cache, graph pools and buffers need {_gib(total)} but the device has {_gib(M)}; "
                       f"lower runtime.max_batch_size or target.max_model_len")
        kv = M - weights - graphs - static_buffers
    fits = int(max(kv, 0) // max(kv_per_token * context, 1))
    shortfall = None
    if refusal is None and engine == "vllm" and kv < need <= kv + graphs:
        # the graphs are what pushes the batch out (vLLM reserves their memory from the KV budget)
        refusal = (f"capturing CUDA graphs ({_gib(graphs)}) leaves {_gib(kv)} of KV, {plural(fits, 'request')} of "
                   f"{plural(context, 'token')}, fewer than the plan's batch of {batch} ({_gib(need)}; vLLM PR #54418): lower "
                   f"deploy.cuda_graph_max_bs or raise deploy.memory_fraction")
    elif refusal is None and engine != "specc" and kv < need:
        shortfall = (f"the KV cache ({_gib(kv)}) holds {plural(fits, 'request')} of {plural(context, 'token')}, fewer than the plan's batch "
                     f"of {batch} ({_gib(need)}) even without CUDA graphs: longer requests queue or are preempted; "
                     f"lower deploy.max_running_requests or target.max_model_len, or add tensor parallelism")
    lines.append(f"the plan's batch: {plural(batch, 'request')} × {plural(context, 'token')} × {kv_per_token / 1024:.1f} KiB/token = "
                 f"{_gib(need)} of KV")
    if shortfall:
        lines.append(f"note: {shortfall}")
    return MemoryBudget(memory=M, weights=weights, graphs=graphs, activations=activations, kv_budget=kv,
                        kv_needed=need, refusal=refusal, lines=lines, shortfall=shortfall)


# ------------------------------------------------------------------------------------------------
# Tensor-parallel communication


def ring_allreduce_s(nbytes: float, n: int, hw) -> float:
    """Seconds for one all-reduce of ``nbytes`` over ``n`` GPUs: α + 2(n−1)/n · bytes / B, the ring
    algorithm's cost (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms"; NCCL's bus
    bandwidth is algBw · 2(n−1)/n, nccl-tests ``doc/PERFORMANCE.md``), B the profile's per-direction
    interconnect bandwidth after its efficiency, α its per-collective latency. 0 for n = 1."""
    if n <= 1:
        return 0.0
    bw = hw.effective_interconnect
    return hw.interconnect_latency_s + 2.0 * (n - 1) / n * nbytes / bw


def ring_allgather_s(nbytes: float, n: int, hw) -> float:
    """Seconds for an all-gather whose result is ``nbytes``: α + (n−1)/n · bytes / B (same sources)."""
    if n <= 1:
        return 0.0
    return hw.interconnect_latency_s + (n - 1) / n * nbytes / hw.effective_interconnect


@dataclass(frozen=True)
class TPComm:
    """Tensor-parallel communication of one state (seconds, bytes per GPU).

    ``verify_s`` / ``verify_bytes``: one verify forward (2 all-reduces per layer over its B·W tokens'
    hidden states, Megatron-LM's tensor parallelism (Shoeybi et al. 2019, §3), and the all-gather of
    the vocabulary-parallel logits); ``draft_pass_s``: one draft pass over B·topk tokens at the draft's
    TP size; ``step_s``: a whole step (verify + the method's draft passes); ``line``: words."""

    tp: int
    draft_tp: int
    verify_s: float
    verify_bytes: float
    draft_pass_s: float
    step_s: float
    line: str


def tp_comm(state, t: ModelShape, d: Optional[ModelShape], hw, tp: int, draft_tp: int, dtype_bytes: float,
            draft_passes: int, step_floor_s: Optional[float] = None) -> Optional[TPComm]:
    """The TP all-reduce cost of one step of ``state`` (None without an interconnect figure on ``hw``
    when tp > 1). ``draft_passes``: draft forwards per step, the proposal passes
    (:func:`specc.methods.proposal_passes`) and the draft-extend pass (:func:`specc.methods.extend_passes`);
    ``step_floor_s``: the state's memory-bound step time, to say what share the communication takes."""
    tp, draft_tp = max(int(tp), 1), max(int(draft_tp), 1)
    B, W = int(state.batch_size), int(state.num_draft_tokens)
    T = B * W
    if tp == 1 and draft_tp == 1:
        return TPComm(tp=1, draft_tp=1, verify_s=0.0, verify_bytes=0.0, draft_pass_s=0.0, step_s=0.0,
                      line="tp 1: no all-reduce")
    if hw.effective_interconnect is None:
        return None
    act = T * t.hidden * dtype_bytes
    verify_s = 2 * t.layers * ring_allreduce_s(act, tp, hw) + ring_allgather_s(T * t.vocab * dtype_bytes, tp, hw)
    verify_bytes = 2 * t.layers * act + T * t.vocab * dtype_bytes
    draft_s = 0.0
    if d is not None and state.num_steps > 0 and draft_passes > 0:
        tok = B * max(int(state.topk), 1)
        if getattr(state, "parallel", False):
            tok = T
        draft_s = 2 * d.layers * ring_allreduce_s(tok * d.hidden * dtype_bytes, draft_tp, hw) \
            + ring_allgather_s(tok * d.vocab * dtype_bytes, draft_tp, hw)
    step_s = verify_s + draft_passes * draft_s
    share = f" = {100 * step_s / step_floor_s:.0f}% of the step's {step_floor_s * 1e6:.0f} µs memory floor" \
        if step_floor_s else ""
    line = (f"tp {tp}: verify {2 * t.layers} all-reduces × {act / 1024:.0f} KiB + logits all-gather = "
            f"{verify_s * 1e6:.0f} µs; draft pass (tp {draft_tp}) {draft_s * 1e6:.0f} µs × {draft_passes}; "
            f"step {step_s * 1e6:.0f} µs{share}")
    return TPComm(tp=tp, draft_tp=draft_tp, verify_s=verify_s, verify_bytes=verify_bytes, draft_pass_s=draft_s,
                  step_s=step_s, line=line)


# ------------------------------------------------------------------------------------------------
# Prefix caching


def prefill_s(tokens: int, params: float, dtype_bytes: float, hw, tp: int = 1) -> float:
    """Roofline seconds of a prefill over ``tokens`` (per GPU of a TP group): max(weights / bandwidth,
    2·params·tokens / FLOPs) / tp — the roofline step model (Williams et al. 2009)."""
    tp = max(int(tp), 1)
    return max(params * dtype_bytes / hw.effective_bandwidth, 2.0 * params * tokens / hw.effective_flops) / tp


@dataclass(frozen=True)
class PrefixPrefill:
    """The extra prefill of speculation for a request whose prompt hits the prefix cache.

    ``recompute_tokens``: prompt tokens the target recomputes on a hit beyond plain decoding (vLLM drops
    the last cached block for drafts whose KV needs the next token); ``extra_s``: their target and draft
    prefill plus the draft's prefill of ``uncached`` new tokens; ``line``: words with the source."""

    recompute_tokens: int
    extra_s: float
    line: str


def prefix_prefill(engine: str, method: str, c: float, t_params: float, dtype_bytes: float, hw, tp: int,
                   block: int, uncached: int = 512, step_s: Optional[float] = None) -> PrefixPrefill:
    """Extra prefill per prefix-cache hit on ``engine`` for ``method`` (draft cost ratio ``c``).

    vLLM: EAGLE, EAGLE-3 and MTP drafts build a position's KV from the next token, so a cache hit
    resumes one scheduler block earlier (``v1/core/kv_cache_coordinator.py:65-86``,
    ``config/speculative.py:2122-2149``): ``block`` more prompt tokens go through the target and the
    draft (the prefix line's text names the vLLM tracker report that measured its cost).
    Every drafting method with a draft model also prefills its draft over the uncached prompt tokens:
    c target-steps' worth per token. ``uncached``: new prompt tokens after the hit."""
    # keyed on vLLM's own method string for the row (its EAGLE-style proposers), not on the plan's name
    vm = methods.get(method).vllm_method if method in methods.method_names() else None
    eagle_drop = engine == "vllm" and vm in ("eagle", "eagle3", "mtp")
    recompute = block if eagle_drop else 0
    t_target = prefill_s(recompute, t_params, dtype_bytes, hw, tp) if recompute else 0.0
    t_draft = c * prefill_s(recompute + uncached, t_params, dtype_bytes, hw, tp)
    extra = t_target + t_draft
    steps = f" ≈ {extra / step_s:.1f} decode steps of this state" if step_s else ""
    if eagle_drop:
        line = (f"+{recompute} recomputed prompt tokens per hit (block drop, kv_cache_coordinator.py:65-86) "
                f"+ draft prefill of {uncached} new tokens at c = {c:.3f}: {extra * 1e3:.2f} ms{steps}")
    else:
        line = (f"draft prefill of {uncached} new tokens at c = {c:.3f}: {extra * 1e3:.2f} ms{steps}")
    return PrefixPrefill(recompute_tokens=recompute, extra_s=extra, line=line)


# ------------------------------------------------------------------------------------------------
# A plan's deployment report (what `specc explain` prints)


@dataclass(frozen=True)
class StateDeployment:
    """One state's deployment lines: its graph memory, TP communication (None: no interconnect
    figure) and prefix-cache prefill (None when prefix caching is off or there is no draft model)."""

    graph: GraphMemory
    tp: Optional[TPComm]
    prefix: Optional[PrefixPrefill]


@dataclass(frozen=True)
class DeploymentReport:
    """Deployment costs of a plan on a hardware profile, per GPU (:func:`deployment_report`).

    ``states``: state name -> :class:`StateDeployment`; ``pool``: the graph memory the deployment
    holds and how it adds up; ``budget``: :class:`MemoryBudget` (None without a device-memory
    figure); ``notes``: what could not be priced and why; ``formulas``: the formula of each line
    with its source."""

    engine: str
    hardware: str
    tp: int
    draft_tp: int
    states: Dict[str, StateDeployment]
    pool: int
    pool_how: str
    budget: Optional[MemoryBudget]
    notes: List[str]
    formulas: Dict[str, str]

    @property
    def refusal(self) -> Optional[str]:
        return self.budget.refusal if self.budget is not None else None


def _hidden_outputs(method: str) -> int:
    """Target layers whose hidden states the specc runtime hands to the drafter: EAGLE-3 three,
    other methods that read hidden states one (``specc/methods/eagle/drafter.py``)."""
    m = methods.get(method)
    if not m.consumes_hidden:
        return 0
    return 3 if m.target_hidden == "fused" else 1


def deployment_report(plan, engine: str, states: Sequence[Any], hw, dtype_bytes: float, c: float,
                      static_buffers: float = 0.0, uncached_prompt: int = 512) -> Optional[DeploymentReport]:
    """The deployment lines of ``plan`` (resolved for ``engine``) over its candidate ``states`` on
    hardware ``hw``; None when the target's shape is unknown (no ``config.json`` and not in the
    shipped table: ``notes`` of the caller say so).

    Args: dtype_bytes: bytes per weight / activation; c: the draft cost ratio; static_buffers: the
        specc runtime's static step buffers (bytes, all states); uncached_prompt: new prompt tokens
        after a prefix-cache hit, for the prefill line.
    """
    t = model_shape(plan, "target")
    if t is None or not states:
        return None
    d = model_shape(plan, "draft")
    notes: List[str] = []
    if d is None and methods.get(plan.method.name).drafts and not methods.get(plan.method.name).lookup:
        notes.append(f"draft shape unknown (draft.path = {plan.draft.path if plan.draft else None!r} has no readable "
                     f"config.json): draft graphs and draft all-reduces are left out")
    par = plan.deploy.parallel
    tp = 1 if engine == "specc" else max(int(par.tp or 1), 1)
    pp = 1 if engine == "specc" else max(int(par.pp or 1), 1)
    draft_tp = 1 if engine == "specc" else max(int(par.draft_tp or tp), 1)
    b = float(dtype_bytes)
    slack = max((int(s.num_draft_tokens) + 1 for s in states), default=2)
    context = int(plan.target.max_model_len or DEFAULT_CONTEXT)
    cache_len = context + slack
    hid = _hidden_outputs(plan.method.name)
    t_params = float(t.param_count())
    weights = t_params * b / (tp * pp) + (float(d.param_count()) * b / draft_tp if d is not None else 0.0)
    floor = weights / hw.effective_bandwidth
    per: Dict[str, StateDeployment] = {}
    prefix_on = engine != "specc" and plan.deploy.prefix_caching is True
    block = int(plan.deploy.page_size or VLLM_BLOCK_SIZE)
    for s in states:
        g = graph_memory(engine, s, t, d, b, cache_len, tp, hid)
        # the draft stage's proposal passes and the extend stage's draft forward all-reduce alike
        passes = (methods.proposal_passes(s.method, s.num_steps, s.topk, s.parallel, s.tree_choices)
                  + methods.extend_passes(s.method)) if s.num_steps else 0
        comm = tp_comm(s, t, d, hw, tp, draft_tp, b, passes, step_floor_s=floor)
        step_s = floor * (1.0 + passes * c)
        pre = None
        if prefix_on and s.num_steps > 0 and methods.get(s.method).drafts and not methods.get(s.method).lookup:
            pre = prefix_prefill(engine, s.method, c, t_params, b, hw, tp, block, uncached_prompt, step_s)
        per[s.name] = StateDeployment(graph=g, tp=comm, prefix=pre)
    # the engine's pool: specc one per state; SGLang / vLLM one shared, set by the largest capture
    graphs = [p.graph for p in per.values()]
    if engine != "specc":
        top = max(states, key=lambda s: (s.batch_size, s.num_draft_tokens))
        max_bs = int(plan.deploy.cuda_graph_max_bs or top.batch_size)
        w_max = max(int(s.num_draft_tokens) for s in states)
        k_max = max(int(s.num_steps) for s in states)
        widest = _Capture(batch_size=max_bs, num_draft_tokens=w_max, num_steps=k_max,
                          topk=max(int(s.topk) for s in states), verify_rule=top.verify_rule)
        if plan.deploy.cuda_graphs is not False:
            graphs = graphs + [graph_memory(engine, widest, t, d, b, cache_len, tp, hid)]
        else:
            graphs = []
        rows = max_bs * w_max
    else:
        rows = 0
    pool, how = engine_graph_pool(engine, graphs, rows, t.vocab if engine != "sglang" else t.vocab)
    kv_tok = t.kv_bytes_per_token(b) * (math.ceil(t.kv_heads / tp) / t.kv_heads) / pp
    if d is not None and methods.get(plan.method.name).has_draft_kv:
        kv_tok += d.kv_bytes_per_token(b) * (math.ceil(d.kv_heads / draft_tp) / d.kv_heads)
    batch = int(plan.deploy.max_running_requests or max(s.batch_size for s in states)) if engine != "specc" \
        else int(max(s.batch_size for s in states))
    acts = float(PREFILL_CHUNK_TOKENS * b * (3 * t.hidden + 4 * t.intermediate / tp)) if engine != "specc" else 0.0
    budget = memory_budget(engine, hw, plan.deploy.memory_fraction, weights, float(pool), acts, kv_tok, batch,
                           context, static_buffers)
    if budget is None:
        notes.append(f"hardware {hw.name} gives no device memory: the KV-cache budget is not priced")
    formulas = {
        "graph": (GRAPH_FORMULA[engine if engine in GRAPH_FORMULA else "vllm"] if graphs
                  else "no CUDA graphs (deploy.cuda_graphs=false)"),
        "tp": "ring all-reduce α + 2(n−1)/n·bytes/B (Patarasuk & Yuan 2009; nccl-tests PERFORMANCE.md), 2 per "
              "layer (Megatron-LM, Shoeybi et al. 2019 §3) + the logits all-gather, per verify forward and per draft "
              "pass; share of the step's memory floor weights/(tp·bandwidth)",
        "prefix": "vLLM: EAGLE/EAGLE-3/MTP cache hits resume one block earlier (v1/core/kv_cache_coordinator.py:65-86, "
                  "issue #19996); every draft model prefills the uncached tokens at c per token (the "
                  "roofline: max(weights/bandwidth, 2·params·tokens/FLOPs)/tp)",
    }
    return DeploymentReport(engine=engine, hardware=hw.name, tp=tp, draft_tp=draft_tp, states=per, pool=int(pool),
                            pool_how=how, budget=budget, notes=notes, formulas=formulas)


@dataclass(frozen=True)
class _Capture:
    """The engine's widest captured graph (its largest batch at the plan's widest verify)."""

    batch_size: int
    num_draft_tokens: int
    num_steps: int
    topk: int
    verify_rule: str
