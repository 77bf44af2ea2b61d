"""Stage graphs: one networkx DiGraph per candidate state, and their validation.

Nodes are the stages one decode step runs (draft passes or the parallel block, tree expansion levels,
the target verify forward, the acceptance kernel, bonus sampling, draft extend or its frozen
replacement, KV commit, the disaggregation seed, the LoRA segment layout). Each node declares the
tensors it ``produces`` and ``consumes`` with symbolic shapes over the state's dims:

    B  batch bucket          K  κ (draft tokens per step)      W  verify width (bonus/root incl.)
    T  topk                  V  target vocab                   H  hidden size    S  max sequence length

Shapes are lists of dim expressions (``"B"``, ``"K+1"``, ``"B*W"``, ints). An edge u → v carries, per
tensor, the shape and dtype the *consumer* expects; validation checks them against what the producer
declares. Stage order follows SGLang 0.5.23's EAGLE worker (draft → verify → extend,
``sglang/srt/speculative/eagle_worker_v2.py``) and gpt-fast's roll-back-by-position KV
(meta-pytorch/gpt-fast ``model.py:97-113``, ``KVCache``). Nothing here imports torch.
"""
from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import networkx as nx

from specc import methods
from specc.errors import SpeccError
from specc.compiler.lower import CandidateState

def expected_forward_passes(state: CandidateState) -> Dict[str, int]:
    """Forward passes one step of ``state`` is known to run, from the methods' definitions (not from
    the graph), counted at a common iteration boundary: ``{"draft": n, "extend": e,
    "target": 1}``.

    Target: one verify forward (plain decode included). Draft stage (:func:`specc.methods.proposal_passes`):
    a chain or tree κ passes (one per token or level, SGLang
    ``sglang/srt/speculative/eagle_worker_v2.py:742-919``), κ − 1 when the extend pass drafts the
    first token (EAGLE, EAGLE-3, MTP, multi-layer EAGLE: num_steps − 1 recurrent calls and one draft
    extension, whose output starts the next iteration), a parallel block or Medusa's heads
    1, lookups and plain 0. Extend stage (:func:`specc.methods.extend_passes`): one draft-extend pass for
    the methods whose extend runs a draft forward, at κ = 0 too (SGLang runs draft-extend at steps = 0
    unless SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND); none for frozen-KV MTP ("no forward").
    """
    draft = methods.proposal_passes(state.method, state.num_steps, state.topk, state.parallel,
                                    state.tree_choices)
    return {"draft": draft, "extend": methods.extend_passes(state.method), "target": 1}


@dataclass(frozen=True)
class GraphContext:
    """Plan-level facts a graph needs beyond the state: vocab/hidden sizes (None = symbolic),
    activation dtype, LoRA, disaggregation role, confidence head, schedule kind."""

    vocab_size: Optional[int] = None
    hidden_size: Optional[int] = None
    max_seq_len: Optional[int] = None
    act_dtype: str = "float32"
    lora: bool = False
    disagg_role: str = "none"
    confidence_head: bool = False
    budget: bool = False


def context_from_plan(plan, draft_hidden_size: Optional[int] = None) -> GraphContext:
    """A :class:`GraphContext` from a :class:`specc.plan.schema.Plan`; ``draft_hidden_size`` (H of the
    draft, for methods that read target hidden states) comes from ``specc.predict.sizing.CostInputs``."""
    dtype = plan.runtime.dtype if plan.runtime.dtype != "auto" else plan.target.dtype
    if dtype == "auto":
        dtype = "float32" if plan.runtime.device in ("cpu", "auto") else "bfloat16"
    hidden = draft_hidden_size if methods.get(plan.method.name).consumes_hidden else None
    return GraphContext(
        vocab_size=plan.target.vocab_size, hidden_size=int(hidden) if hidden else None, max_seq_len=plan.target.max_model_len,
        act_dtype=dtype, lora=bool(plan.deploy.lora.adapters), disagg_role=plan.deploy.disagg.role,
        confidence_head=bool(plan.method.confidence_head) or plan.schedule.kind == "budget",
        budget=plan.schedule.kind == "budget")


# ----------------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------------


class _Builder:
    def __init__(self, state: CandidateState, ctx: GraphContext):
        self.g = nx.DiGraph()
        self.state, self.ctx = state, ctx

    def stage(self, name: str, op: str, forward: Optional[str] = None,
              produces: Optional[Dict[str, Tuple[list, str]]] = None,
              consumes: Optional[Dict[str, Tuple[list, str]]] = None, note: str = "", passes: int = 1) -> None:
        def enc(d):
            return {t: {"shape": list(s), "dtype": dt} for t, (s, dt) in (d or {}).items()}

        attrs = {"passes": int(passes)} if forward and passes != 1 else {}
        self.g.add_node(name, op=op, forward=forward or "", produces=enc(produces),
                        consumes=enc(consumes), note=note, **attrs)

    def connect(self) -> None:
        """Add an edge producer → consumer for every consumed tensor, carrying the consumer's
        expected shape/dtype. Consumed tensors nobody produces are left for validation to report."""
        producers: Dict[str, str] = {}
        for n, data in self.g.nodes(data=True):
            for t in data["produces"]:
                producers.setdefault(t, n)
        for n, data in list(self.g.nodes(data=True)):
            for t, spec in data["consumes"].items():
                src = producers.get(t)
                if src is None or src == n:
                    continue
                if not self.g.has_edge(src, n):
                    self.g.add_edge(src, n, tensors={})
                self.g.edges[src, n]["tensors"][t] = dict(spec)


def build_graph(plan, state: CandidateState, draft_hidden_size: Optional[int] = None) -> nx.DiGraph:
    """The stage graph of one decode step of ``state`` lowered from ``plan`` (the plan supplies
    vocab size, dtype, LoRA, disaggregation role and the confidence head; see
    :func:`build_state_graph`)."""
    return build_state_graph(state, context_from_plan(plan, draft_hidden_size))


def build_state_graph(state: CandidateState, ctx: Optional[GraphContext] = None) -> nx.DiGraph:
    """The stage graph of one decode step of ``state``.

    Graph attributes: ``state`` (name), ``method``, ``kind``, ``dims`` (symbol → int or None),
    ``expected_forward_passes``. Node attributes: ``op``, ``forward`` (``"draft"``, ``"target"`` or
    ``""``), ``passes`` (forward passes the node stands for when not one: an EAGLE static tree's
    levels), ``produces``/``consumes`` (tensor → {shape, dtype}). Edge attribute ``tensors``.
    """
    ctx = ctx or GraphContext()
    s = state
    b = _Builder(s, ctx)
    act, i64, f32 = ctx.act_dtype, "int64", "float32"
    k, kind, m = s.num_steps, s.kind, s.method
    sampled = s.verify_rule in ("standard", "block", "synthetic")
    q_probs = sampled and s.draft_sampling == "probabilistic" and s.verify_rule != "synthetic"
    info = methods.get(m)
    hidden_fed = info.consumes_hidden

    # -- step inputs (state carried from the previous step) and optional seed / LoRA layout --------
    inputs = {"last_tokens": (["B"], i64), "seq_lens": (["B"], i64), "kv_cache": (["B", "S"], act)}
    hidden_from_seed = ctx.disagg_role == "decode" and info.seed_carries_hidden
    if hidden_fed and not hidden_from_seed:
        inputs["draft_hidden"] = (["B", "H"], act)
    if info.lookup:
        inputs["token_history"] = (["B", "S"], i64)
    b.stage("step_inputs", "input", produces=inputs,
            note="bonus token, lengths and caches from the previous step (KV rolled back by position)")
    if hidden_from_seed:
        b.stage("disagg_seed", "disagg_seed",
                produces={"draft_hidden": (["B", "H"], act), "seed_topk_p": (["B", "T"], f32),
                          "seed_topk_index": (["B", "T"], i64)},
                note="prefill→decode seed: draft hidden + top-k (SGLang EagleDraftInput; disaggregation/utils.py:466-476)")
    if ctx.lora:
        b.stage("lora_segments", "lora_layout", produces={"lora_segment_ids": (["B*W"], "int32")},
                note="per-token adapter ids of the verify batch; the draft is not adapted")
    tree_state = k > 0 and kind == "tree" and not info.lookup
    nodes = "W-1" if tree_state else "K"  # draft positions: κ for a chain, W - 1 nodes for a tree
    if sampled:
        rng = {"bonus_uniforms": (["B"], f32)}
        if k > 0:
            rng["accept_uniforms"] = (["B", nodes], f32)
        b.stage("rng", "input", produces=rng, note="randomness passed in as tensors")

    # -- drafting ------------------------------------------------------------------------------------
    draft_out: Dict[str, Tuple[list, str]] = {}
    if k > 0 and kind == "chain":
        prev_tok, prev_hid = "last_tokens", "draft_hidden" if hidden_fed else None
        for i in range(k):
            cons = {prev_tok: (["B"], i64)}
            if prev_hid:
                cons[prev_hid] = (["B", "H"], act)
            prod = {f"draft_token_{i}": (["B"], i64)}
            if hidden_fed or info.draft_shape == "chain":
                prod[f"draft_hidden_{i}"] = (["B", "H"], act)
            if q_probs:
                prod[f"draft_probs_{i}"] = (["B", "V"], f32)
            if i == 0 and info.draft_from_extend:  # the extend's last output drafts token 1
                b.stage("draft_step_0", "draft_logits", None, prod, cons,
                        note="draft 1 from the draft-extend's last output (the head's logits, no pass)")
            else:
                b.stage(f"draft_step_{i}", "draft_forward", "draft", prod, cons,
                        note=f"chain draft pass {i + (0 if info.draft_from_extend else 1)}/"
                             f"{k - (1 if info.draft_from_extend else 0)}")
            prev_tok = f"draft_token_{i}"
            prev_hid = f"draft_hidden_{i}" if hidden_fed else None
        cons = {f"draft_token_{i}": (["B"], i64) for i in range(k)}
        prod = {"draft_tokens": (["B", "K"], i64)}
        if q_probs:
            cons.update({f"draft_probs_{i}": (["B", "V"], f32) for i in range(k)})
            prod["draft_probs"] = (["B", "K", "V"], f32)
        b.stage("draft_stack", "assemble", None, prod, cons)
    elif k > 0 and kind == "parallel":
        cons = {"last_tokens": (["B"], i64)}
        if hidden_fed:
            cons["draft_hidden"] = (["B", "H"], act)
        if "markov" in methods.get(m).option_sections:  # a block drafter with a Markov head (DSpark)
            b.stage("draft_block", "draft_block_forward", "draft",
                    {"block_logits": (["B", "K", "V"], f32)}, cons,
                    note="[bonus | MASK x K] block through one forward (DFlash/DSpark)")
            prod = {"draft_tokens": (["B", "K"], i64)}
            if q_probs:
                prod["draft_probs"] = (["B", "K", "V"], f32)
            if ctx.confidence_head:
                prod["draft_confidence"] = (["B", "K"], f32)
            b.stage("markov_head", "markov_correct", None, prod,
                    {"block_logits": (["B", "K", "V"], f32)},
                    note="low-rank transition bias, left to right (not a model forward)")
        else:
            prod = {"draft_tokens": (["B", "K"], i64)}
            if q_probs:
                prod["draft_probs"] = (["B", "K", "V"], f32)
            b.stage("draft_block", "draft_block_forward", "draft", prod, cons,
                    note="one pass emits the whole block (PARD / P-EAGLE / DFlash)")
    elif k > 0 and kind == "tree" and s.tree_choices is None:
        for i in range(k):
            if i == 0:
                cons = {"last_tokens": (["B"], i64)}
                if hidden_fed:
                    cons["draft_hidden"] = (["B", "H"], act)
            else:
                cons = {f"tree_tokens_{i - 1}": (["B", "T"], i64),
                        f"tree_hidden_{i - 1}": (["B", "T", "H"], act)}
            prod = {f"tree_tokens_{i}": (["B", "T"], i64), f"tree_scores_{i}": (["B", "T"], f32),
                    f"tree_parents_{i}": (["B", "T"], i64), f"tree_hidden_{i}": (["B", "T", "H"], act)}
            first_free = i == 0 and info.draft_from_extend  # level 0: the extend's output, no pass
            b.stage(f"tree_level_{i}", "tree_expand", None if first_free else "draft", prod, cons,
                    note=("expand root to topk" + (" (from the draft-extend's output, no pass)" if first_free else "")
                          if i == 0 else "expand topk beams to topk² and keep topk"))
        cons = {}
        for i in range(k):
            cons.update({f"tree_tokens_{i}": (["B", "T"], i64), f"tree_scores_{i}": (["B", "T"], f32),
                         f"tree_parents_{i}": (["B", "T"], i64)})
        b.stage("tree_build", "tree_build", None,
                {"draft_tokens": (["B", "W-1"], i64), "tree_mask": (["B", "W", "W"], "bool"),
                 "tree_positions": (["B", "W"], i64), "retrieve_index": (["B", "W"], i64),
                 "retrieve_next_token": (["B", "W"], i64), "retrieve_next_sibling": (["B", "W"], i64)},
                cons, note="top W-1 of the topk + (K-1)·topk² pool (organize_draft_results)")
    elif k > 0 and kind == "tree":
        b.stage("tree_buffers", "static_buffers", None,
                {"tree_mask": (["B", "W", "W"], "bool"), "tree_positions": (["B", "W"], i64),
                 "retrieve_index": (["B", "W"], i64), "retrieve_next_token": (["B", "W"], i64),
                 "retrieve_next_sibling": (["B", "W"], i64)},
                note="tree shape compiled to static buffers (Medusa tree buffers)")
        heads = {"head_topk": (["B", "K", "T"], i64)}
        gather = {"draft_tokens": (["B", "W-1"], i64)}
        if q_probs:  # children drawn without replacement from each node's q
            heads["head_probs"] = (["B", "K", "V"], f32)
            gather["draft_probs"] = (["B", "W-1", "V"], f32)
        levels = 1 if info.draft_shape == "heads" else k - (1 if info.draft_from_extend else 0)
        b.stage("draft_heads", "draft_heads_forward", "draft" if levels else None, heads,
                {"draft_hidden": (["B", "H"], act)} if hidden_fed else {"last_tokens": (["B"], i64)},
                note="one pass of the draft heads over the last hidden state" if info.draft_shape == "heads"
                else f"{levels} head pass(es), one per tree level below the first (drafted by the extend)",
                passes=max(levels, 1))
        b.stage("tree_gather", "tree_build", None, gather,
                dict({"head_topk": (["B", "K", "T"], i64), "retrieve_index": (["B", "W"], i64)},
                     **({"head_probs": (["B", "K", "V"], f32)} if q_probs else {})))
    if k > 0 and info.lookup:
        # lookups replace whatever model drafting was built above
        for n in [n for n, d in b.g.nodes(data=True) if d["forward"] == "draft"]:
            b.g.remove_node(n)
        for n in ("draft_stack", "markov_head", "tree_gather", "tree_build"):
            if n in b.g:
                b.g.remove_node(n)
        b.stage("ngram_lookup", "lookup", None, {"draft_tokens": (["B", "K"], i64)},
                {"token_history": (["B", "S"], i64), "last_tokens": (["B"], i64)},
                note="suffix n-gram match in the context (no model forward)")

    tree = k > 0 and kind == "tree" and not info.lookup
    if k > 0 and ctx.budget and "draft_confidence" in {t for _, d in b.g.nodes(data=True) for t in d["produces"]}:
        b.stage("budget_select", "budget", None, {"verify_lens": (["B"], i64)},
                {"draft_confidence": (["B", "K"], f32)},
                note="survival-probability budget: verify a prefix of each request (cost.select_verify_budget)")

    # -- verify ----------------------------------------------------------------------------------------
    cons = {"last_tokens": (["B"], i64), "seq_lens": (["B"], i64), "kv_cache": (["B", "S"], act)}
    if k > 0:
        cons["draft_tokens"] = (["B", "W-1"], i64) if tree else (["B", "K"], i64)
    if tree:
        cons["tree_mask"] = (["B", "W", "W"], "bool")
        cons["tree_positions"] = (["B", "W"], i64)
    if ctx.lora:
        cons["lora_segment_ids"] = (["B*W"], "int32")
    b.stage("target_verify", "target_forward", "target",
            {"target_logits": (["B", "W", "V"], f32), "target_hidden": (["B", "W", "H"], act),
             "kv_written": (["B", "W"], i64)}, cons,
            note=f"one target forward over B·W = {s.batch_size}·{s.num_draft_tokens} tokens")

    # -- accept + bonus --------------------------------------------------------------------------------
    if k > 0:
        cons = {"target_logits": (["B", "W", "V"], f32),
                "draft_tokens": (["B", "W-1"], i64) if tree else (["B", "K"], i64)}
        if tree:
            cons.update({"retrieve_index": (["B", "W"], i64), "retrieve_next_token": (["B", "W"], i64),
                         "retrieve_next_sibling": (["B", "W"], i64)})
        if sampled:
            cons["accept_uniforms"] = (["B", nodes], f32)
        if q_probs:
            cons["draft_probs"] = (["B", nodes, "V"], f32)
        if "budget_select" in b.g:
            cons["verify_lens"] = (["B"], i64)
        b.stage("accept", "accept_kernel", None,
                {"accepted_len": (["B"], i64), "accept_index": (["B", "K+1"], i64)}, cons,
                note=f"{s.verify_rule} verify" + (" (tree: recursive rejection over siblings)" if tree else ""))
    cons = {"target_logits": (["B", "W", "V"], f32)}
    if k > 0:
        cons["accepted_len"] = (["B"], i64)
    if sampled:
        cons["bonus_uniforms"] = (["B"], f32)
    b.stage("bonus_sample", "bonus_sample", None, {"bonus_tokens": (["B"], i64)}, cons,
            note="target token at the first rejected (or last) position")

    # -- KV commit and draft state for the next step ---------------------------------------------------
    cons = {"kv_written": (["B", "W"], i64), "seq_lens": (["B"], i64)}
    if k > 0:
        cons.update({"accepted_len": (["B"], i64), "accept_index": (["B", "K+1"], i64)})
    b.stage("kv_commit", "kv_commit", None, {"new_seq_lens": (["B"], i64)}, cons,
            note=("copy the accepted path's KV to its positions' slots (tree), advance lengths"
                  if tree else "advance lengths by accepted+1; rejected slots are overwritten next step"))
    ext_cons = {"target_hidden": (["B", "W", "H"], act), "bonus_tokens": (["B"], i64)}
    if k > 0:
        ext_cons["accept_index"] = (["B", "K+1"], i64)
    next_state = {}
    if info.extend_forward:
        b.stage("draft_extend", "draft_extend", "draft", {"next_draft_hidden": (["B", "H"], act)},
                ext_cons, note="draft forward over accepted tokens: refreshes draft KV / hidden")
        next_state["next_draft_hidden"] = (["B", "H"], act)
    elif info.has_draft_kv:
        b.stage("draft_kv_update", "draft_kv_update", None, {"next_draft_hidden": (["B", "H"], act)}, ext_cons,
                note="context K/V projected from the target's hidden states, no draft forward"
                if info.draft_shape == "block" else "the draft's KV catches up inside its next first proposal pass")
        next_state["next_draft_hidden"] = (["B", "H"], act)
    elif info.frozen_kv or info.draft_shape == "heads":
        b.stage("draft_handoff", "frozen_extend", None, {"next_draft_hidden": (["B", "H"], act)},
                ext_cons, note="no draft KV: hand the accepted target hidden state to the next step")
        next_state["next_draft_hidden"] = (["B", "H"], act)
    out = {"bonus_tokens": (["B"], i64), "new_seq_lens": (["B"], i64)}
    if k > 0:
        out.update({"accepted_len": (["B"], i64), "accept_index": (["B", "K+1"], i64)})
    out.update(next_state)
    b.stage("step_outputs", "output", None, None, out, note="emitted tokens and next-step state")
    if ctx.disagg_role == "prefill":
        seed = {"bonus_tokens": (["B"], i64)}
        seed.update(next_state)
        b.stage("disagg_seed_export", "disagg_seed", None, None, seed,
                note="prefill side: ship the draft seed with the KV (SGLang disaggregation/prefill.py:301-317)")

    b.connect()
    g = b.g
    g.graph.update({
        "state": s.name, "method": m, "kind": kind, "verify_rule": s.verify_rule,
        "dims": {"B": s.batch_size, "K": k, "W": s.num_draft_tokens, "T": s.topk,
                 "V": ctx.vocab_size, "H": ctx.hidden_size, "S": ctx.max_seq_len},
        "expected_forward_passes": expected_forward_passes(s),
    })
    return g


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def eval_dim(expr, dims: Dict[str, Optional[int]]):
    """Evaluate a dim expression (int, symbol, or +,-,* of them) with ``dims``; a symbol whose value
    is None stays symbolic and the result is the normalised expression string. Raises SpeccError on
    anything else."""
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(str(expr), mode="eval").body
    except SyntaxError:
        raise SpeccError(f"bad dim expression {expr!r}") from None

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            v = dims.get(node.id)
            if node.id not in dims:
                raise SpeccError(f"unknown dim {node.id!r} in {expr!r}")
            return node.id if v is None else int(v)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(left, int) and isinstance(right, int):
                return _OPS[type(node.op)](left, right)
            sym = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}[type(node.op)]
            return f"({left}{sym}{right})"
        raise SpeccError(f"bad dim expression {expr!r}")

    return ev(tree)


def eval_shape(shape: Sequence, dims: Dict[str, Optional[int]]) -> Tuple:
    return tuple(eval_dim(d, dims) for d in shape)


@dataclass(frozen=True)
class GraphIssue:
    """One validation finding: ``where`` names the node, edge (``u -> v``) or tensor."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def count_forward_passes(g: nx.DiGraph) -> Dict[str, int]:
    """Forward passes the graph runs per step, by stage: ``{"draft": n, "extend": e, "target": t}``
    (draft-model passes of the draft stage, draft-extend passes, target passes); a node counts its
    ``passes`` attribute (default 1)."""
    counts = {"draft": 0, "extend": 0, "target": 0}
    for _, d in g.nodes(data=True):
        f = d.get("forward")
        if f == "draft" and d.get("op") == "draft_extend":
            f = "extend"
        if f in counts:
            counts[f] += int(d.get("passes", 1))
    return counts


def validate_graph(g: nx.DiGraph) -> List[GraphIssue]:
    """Check a stage graph; return every issue found (empty = valid).

    Rules: (1) acyclic; (2) every consumed tensor is produced exactly once, by a node with an edge to
    the consumer; (3) along every edge, each tensor's shape and dtype (as the consumer expects them)
    equal the producer's, after substituting the state's dims; (4) forward passes per step equal
    :func:`expected_forward_passes` (stored in ``g.graph``).
    """
    issues: List[GraphIssue] = []
    dims = g.graph.get("dims", {})
    if not nx.is_directed_acyclic_graph(g):
        cyc = nx.find_cycle(g)
        issues.append(GraphIssue(" -> ".join([u for u, _ in cyc] + [cyc[0][0]]), "cycle in stage graph"))
    producers: Dict[str, List[str]] = {}
    for n, d in g.nodes(data=True):
        for t in d.get("produces", {}):
            producers.setdefault(t, []).append(n)
    for n, d in g.nodes(data=True):
        for t, spec in d.get("consumes", {}).items():
            srcs = producers.get(t, [])
            if not srcs:
                issues.append(GraphIssue(f"{n}.{t}", "consumed but never produced"))
                continue
            if len(srcs) > 1:
                issues.append(GraphIssue(f"{n}.{t}", f"produced more than once (by {', '.join(srcs)})"))
                continue
            src = srcs[0]
            if not g.has_edge(src, n) or t not in g.edges[src, n].get("tensors", {}):
                issues.append(GraphIssue(f"{src} -> {n}", f"tensor {t} consumed with no edge carrying it"))
    for u, v, d in g.edges(data=True):
        for t, spec in d.get("tensors", {}).items():
            prod = g.nodes[u].get("produces", {}).get(t)
            if prod is None:
                issues.append(GraphIssue(f"{u} -> {v}", f"edge carries {t}, which {u} does not produce"))
                continue
            try:
                want, have = eval_shape(spec["shape"], dims), eval_shape(prod["shape"], dims)
            except SpeccError as exc:
                issues.append(GraphIssue(f"{u} -> {v}", f"tensor {t}: {exc}"))
                continue
            if want != have:
                issues.append(GraphIssue(
                    f"{u} -> {v}", f"tensor {t}: shape {list(spec['shape'])} = {list(want)} on the edge "
                    f"but {u} produces {list(prod['shape'])} = {list(have)}"))
            if spec["dtype"] != prod["dtype"]:
                issues.append(GraphIssue(f"{u} -> {v}", f"tensor {t}: dtype {spec['dtype']} on the "
                                                        f"edge but {u} produces {prod['dtype']}"))
    expected = g.graph.get("expected_forward_passes")
    if expected:
        have = count_forward_passes(g)
        for model in ("draft", "extend", "target"):
            if have[model] != expected.get(model, 0):
                issues.append(GraphIssue(
                    g.graph.get("state", "graph"),
                    f"{have[model]} {model} forward pass(es) per step, but method "
                    f"{g.graph.get('method')} ({g.graph.get('kind')}) runs {expected.get(model, 0)}"))
    return issues


def check_graph(g: nx.DiGraph) -> None:
    """Raise SpeccError listing every issue if :func:`validate_graph` finds any."""
    issues = validate_graph(g)
    if issues:
        raise SpeccError(f"stage graph {g.graph.get('state')} is invalid:\n  " +
                         "\n  ".join(str(i) for i in issues))


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}
# Caches shared by every state (allocated once, not per captured graph).
SHARED_TENSORS = ("kv_cache", "token_history")


def buffer_bytes(g: nx.DiGraph) -> Optional[int]:
    """Static buffer bytes one state's captured programs hold: Σ over produced tensors (caches
    excluded, :data:`SHARED_TENSORS`) of numel · itemsize, with the state's dims. Tensors with a
    symbolic dim (e.g. H unknown) are skipped; None if no tensor could be sized. A floor on the
    CUDA-graph memory (activations inside a forward are not in the graph)."""
    dims = g.graph.get("dims", {})
    total, sized = 0, False
    for _, d in g.nodes(data=True):
        for t, spec in d.get("produces", {}).items():
            if t in SHARED_TENSORS:
                continue
            shape = eval_shape(spec["shape"], dims)
            if all(isinstance(x, int) for x in shape):
                n = 1
                for x in shape:
                    n *= x
                total += n * DTYPE_BYTES.get(spec["dtype"], 4)
                sized = True
    return total if sized else None


def graphs_to_capture(g: nx.DiGraph) -> int:
    """Captured programs per state, as SGLang's ``SpecRuntimeState`` bundles them (SGLang 0.5.23
    ``sglang/srt/speculative/eagle_worker_v2.py:1390-1414``): a draft graph if the step proposes with
    a model forward, the target verify graph, and a
    draft-extend graph if the method has one. On a CPU they run eagerly; on CUDA each is a graph."""
    ops = {d.get("op") for _, d in g.nodes(data=True)}
    proposal = bool(ops & {"draft_forward", "draft_block_forward", "tree_expand", "draft_heads_forward"})
    return int(proposal) + 1 + int("draft_extend" in ops)


def target_tokens_per_step(g: nx.DiGraph) -> int:
    """Tokens the target verifies per step: B · W."""
    d = g.graph["dims"]
    return int(d["B"]) * int(d["W"])


# ----------------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------------


def to_json(g: nx.DiGraph) -> dict:
    """networkx ``node_link_data`` (edges under ``"edges"``), JSON-safe."""
    return json.loads(json.dumps(nx.node_link_data(g, edges="edges")))


def from_json(data: dict) -> nx.DiGraph:
    """Inverse of :func:`to_json`."""
    return nx.node_link_graph(data, directed=True, edges="edges")


def _dot_quote(s: str) -> str:
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_label(lines: Sequence[str]) -> str:
    """A quoted DOT label with one line per entry (DOT's ``\\n`` line break)."""
    return '"' + "\\n".join(str(x).replace("\\", "\\\\").replace('"', '\\"') for x in lines) + '"'


def to_dot(g: nx.DiGraph) -> str:
    """Graphviz DOT text. networkx's own writers need pydot or pygraphviz, which specc does not
    depend on (neither is installed), so this is a minimal writer: one box per stage (forward passes
    shaded), one edge per producer→consumer pair labelled with its tensors and shapes."""
    lines = [f"digraph {_dot_quote(g.graph.get('state', 'state'))} {{", "  rankdir=TB;",
             "  node [shape=box, fontname=Helvetica, fontsize=10];"]
    for n, d in g.nodes(data=True):
        fill = {"draft": "lightblue", "target": "orange"}.get(d.get("forward"), "white")
        lines.append(f"  {_dot_quote(n)} [label={_dot_label([n, '[' + str(d.get('op')) + ']'])}, "
                     f"style=filled, fillcolor={fill}];")
    for u, v, d in g.edges(data=True):
        label = [f"{t} [{', '.join(str(x) for x in spec['shape'])}] {spec['dtype']}"
                 for t, spec in d.get("tensors", {}).items()]
        lines.append(f"  {_dot_quote(u)} -> {_dot_quote(v)} [label={_dot_label(label)}, fontsize=8];")
    lines.append("}")
    return "\n".join(lines) + "\n"
