"""The ``specc`` profile: what specc's own runtime (``specc/runtime/engine.py``) runs.

What the runtime runs per method — which methods, state shapes (chain), verify rules, draft
sampling, schedules — comes from the method table (:mod:`specc.methods`, ``Method.runtime``); this
table turns it into rules with messages. One device, llama-family targets (the model team's
``LlamaModel``). Everything else is an error saying "not supported by the specc runtime" with the
fix "target sglang or vllm". Server settings the runtime does not implement (parallelism, page size,
attention backend) are errors or warnings because it would silently ignore them; LoRA adapters and
the disaggregation role are run by ``specc serve`` (LoRA with the schedules that keep each
request's verify width, as SGLang and vLLM require).

Sources name the specc module that implements (or would implement) the capability.
"""
from __future__ import annotations

import functools
from typing import Optional

import keyword
import re

from specc import methods
from specc.compiler import trees
from specc.errors import PlanError
from specc.check.base import Profile, Rule, gt, ne, ngram_window_set, rejection_sampling, thresholds_set

#: name lists over the method registry, computed on first use (module ``__getattr__``), never at
#: import: a method registered through the ``specc.methods`` entry points is in them. The rules
#: themselves ask the row's facts (:func:`_row`), not these lists.
_NAME_LISTS = {
    # methods the specc runtime runs
    "SUPPORTED": lambda m: m.runtime is not None,
    "NEEDS_DRAFT": lambda m: m.runtime is not None and m.needs_draft_checkpoint,
    # methods the runtime drafts in parallel (one pass emits the block)
    "PARALLEL": lambda m: m.runtime is not None and "parallel" in m.runtime.shapes,
    # chain methods whose parallel mode (PARD, P-EAGLE) needs a draft trained with a mask token
    "PARALLEL_CAPABLE": lambda m: m.runtime is not None and "parallel" in m.runtime.shapes and m.parallel_capable,
    "BLOCK": lambda m: m.runtime is not None and m.draft_shape == "block",
}


def __getattr__(name):
    if name in _NAME_LISTS:
        return tuple(n for n, m in methods.METHODS.items() if _NAME_LISTS[name](m))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _row(p):
    """The plan's method row (None for a name the registry lacks: the loader refuses it)."""
    return methods.METHODS.get(p.method.name)


def _supported(p) -> bool:
    """The specc runtime runs the plan's method."""
    m = _row(p)
    return m is not None and m.runtime is not None


def _fact(p, fact: str):
    """``fact`` of the plan's method row when the specc runtime runs the method, else None."""
    return getattr(_row(p), fact) if _supported(p) else None


def _plain(p) -> bool:
    """The plan's method drafts nothing (plain decoding, ``Method.drafts`` False)."""
    m = _row(p)
    return m is not None and not m.drafts


def _one_hot(p) -> bool:
    """The runtime's drafter for the method proposes tokens without a distribution (a lookup: its
    ``RuntimeSupport.draft_sampling`` lacks ``probabilistic``), so verify sees one-hot q."""
    return drafting(p) and "probabilistic" not in _rt(p).draft_sampling


def _block(p) -> bool:
    return _fact(p, "draft_shape") == "block"


def _needs_draft(p) -> bool:
    return bool(_fact(p, "needs_draft_checkpoint"))


def _reads(p, section: str) -> bool:
    """The plan's method reads ``method.<section>`` (``Method.option_sections``)."""
    m = _row(p)
    return m is not None and section in m.option_sections
DRAFTERS_SRC = "specc/methods/dflash/drafter.py (block drafters; PARD: draft_model.py, P-EAGLE: eagle.py)"
SCHED = "specc/runtime/schedule.py"
#: schedules that change κ between steps or per request: refused with LoRA (uniform verify width)
LORA_REFUSED_SCHEDULES = ("adaptive", "auto", "budget")


def _rt(p):
    """The method's runtime support row (None when the runtime does not run it)."""
    m = _row(p)
    return m.runtime if m is not None else None


def _bucket_not_single(p) -> bool:
    return p.schedule.kind == "batch_buckets" and any(
        len(getattr(b, "candidates", None) or []) != 1 for b in p.schedule.buckets.values())
LLAMA_ARCHS = ("llama", "llamaforcausallm")
NGRAM_DEFAULT = (1, 3)  # min, max suffix length tried by specc/methods/ngram/drafter.py
RT = "specc/runtime/engine.py"
#: The runtime's cache keeps κ + 2 slots of slack per row (κ + 1 verify rows + the trash slot) and
#: caps the cache at the target's max_model_len, so prompt + output get max_model_len - κ - 2 tokens.
RT_CACHE = "specc/runtime/engine.py:9-11, 75-78 (cache_len = max_model_len + κ + 2, capped)"
#: The plan's ``name`` becomes the artifact directory and a Python module name.
CODEGEN_NAMES = "specc codegen: artifact directory and module names (specc/compiler/codegen.py check_identifier)"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def bad_name(name) -> bool:
    """True unless ``name`` is an ASCII Python identifier that is not a keyword (what
    ``specc.compiler.codegen.check_identifier`` accepts for the plan name: also at most
    ``specc.plan.schema.MAX_NAME_LEN`` characters)."""
    from specc.plan.schema import MAX_NAME_LEN

    return (not isinstance(name, str) or len(name) > MAX_NAME_LEN or not _IDENT.match(name)
            or keyword.iskeyword(name))


def usable_len(p):
    """Tokens (prompt + output) a request may hold in the runtime: max_model_len minus the cache
    slack of the plan's widest step (:func:`specc.compiler.trees.cache_slack`: κ + 2 for a chain), or None
    when either is unknown."""
    m, k = p.target.max_model_len, p.method.num_steps
    if not isinstance(m, int) or not isinstance(k, int):
        return None
    w = p.method.num_draft_tokens if isinstance(p.method.num_draft_tokens, int) else k + 1
    topk = p.method.topk if isinstance(p.method.topk, int) else 1
    return m - trees.cache_slack(k, topk, w, static=bool(p.method.tree_choices))


TREE_SRC = ("specc/runtime/stages.py (draft_tree, verify_tree); SGLang 0.5.23 "
            "sglang/srt/speculative/eagle_worker_v2.py:742-919, eagle_utils.py:138-234")
U7 = "specc/compiler/trees.py (SGLang's tree-shape limits: arg_groups/speculative_hook.py:494-559, U7)"


def _tree_plan(p) -> bool:
    """A tree plan the runtime runs (the method has trees): topk > 1 or tree_choices."""
    rt = _rt(p)
    return (drafting(p) and rt is not None and "tree" in rt.shapes
            and (gt(p.method.topk, 1) or bool(p.method.tree_choices)))


def _choices(p):
    """The plan's tree_choices normalized, None when unset or malformed (S-TREE-CHOICES reports it)."""
    try:
        return trees.normalize_choices(p.method.tree_choices)
    except PlanError:
        return None


def _bad_choices(p) -> bool:
    if not p.method.tree_choices:
        return False
    try:
        trees.normalize_choices(p.method.tree_choices)
    except PlanError:
        return True
    return False


def _dynamic(p) -> bool:
    return _tree_plan(p) and not p.method.tree_choices


def _pool(p):
    k, t = p.method.num_steps, p.method.topk
    return trees.pool_size(k, t) if isinstance(k, int) and isinstance(t, int) else None


def _fill_width(p):
    k = p.method.num_steps
    tc = _choices(p)
    if tc is not None:
        return {"method.num_draft_tokens": len(tc) + 1}
    if isinstance(p.method.topk, int) and p.method.topk > 1:
        return {"method.num_draft_tokens": trees.pool_size(k, p.method.topk) + 1}
    return {"method.num_draft_tokens": k + 1}


def _mask_token(f):
    from specc.models.checkpoints import mask_token

    return mask_token(f.config("draft"))


def _dspark_cfg(f) -> dict:
    cfg = f.config("draft") or {}
    sub = cfg.get("dspark_config") if isinstance(cfg.get("dspark_config"), dict) else {}
    return {k: sub.get(k, cfg.get(k)) for k in ("markov_rank", "markov_head_type", "confidence_head")}


def _has_confidence_head(f) -> bool:
    return bool(_dspark_cfg(f).get("confidence_head"))


def _block_ck(f) -> dict:
    """A block draft's config facts: target_layer_ids and block_size (dflash_config or top level)."""
    cfg = f.config("draft") or {}
    sub = cfg.get("dflash_config") if isinstance(cfg.get("dflash_config"), dict) else {}
    return {k: sub.get(k, cfg.get(k)) for k in ("target_layer_ids", "block_size")}


def _medusa_heads(f):
    n = (f.config("draft") or {}).get("medusa_num_heads")
    return n if isinstance(n, int) else None


def _markov_differs(p, f) -> bool:
    c = _dspark_cfg(f)
    m = p.method.markov
    return (m.kind is not None and m.kind != c.get("markov_head_type")) or (
        m.rank is not None and m.rank != c.get("markov_rank"))


def _markov_text(f) -> str:
    c = _dspark_cfg(f)
    return f"kind {c.get('markov_head_type')}, rank {c.get('markov_rank')}"


#: a shipped draft preset (conf/draft/) per method that needs one, for the S-DRAFT message
#: adaptive schedules refuse multi-layer EAGLE (SGLang: MultiLayerEagleWorkerV2 has no adaptive support)
ML_ADAPTIVE = ("specc/methods/multi_layer_eagle/drafter.py (SGLang 0.5.23 "
               "speculative/adaptive_spec_params.py:85-89, sglang.AD5)")
#: vLLM: "num_speculative_tokens must be divisible by n_predict" (vllm/config/speculative.py:1604-1612)
MTP_N_PREDICT = "specc/methods/mtp/drafter.py (vLLM config/speculative.py:1604-1612)"


def _nextn_layers(cfg) -> Optional[int]:
    """MTP layers of a checkpoint config (``num_nextn_predict_layers``, vLLM's ``n_predict``), or None."""
    cfg = cfg or {}
    n = cfg.get("num_nextn_predict_layers", cfg.get("n_predict"))
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _mtp_source(p) -> str:
    """Where an MTP plan's layers come from: ``draft`` when draft.path is set, else the target's."""
    return "draft" if p.draft is not None and bool(p.draft.path) else "target"


def _gguf_target(p) -> bool:
    """The target is a GGUF file (its metadata has no MTP layers for specc's MTP loader)."""
    return (p.target.format or "") == "gguf" or str(p.target.path or "").endswith(".gguf")


def _ships_draft(p) -> bool:
    """The method's draft layers usually ship inside the target checkpoint (``Method.target_ships_draft``:
    MTP/NEXTN)."""
    return bool(_fact(p, "target_ships_draft"))


def _mtp_readable(p) -> bool:
    """An MTP plan whose layer source can hold MTP layers (a draft.path, or a non-GGUF target)."""
    return _ships_draft(p) and (_mtp_source(p) == "draft" or not _gguf_target(p))


def _mtp_kappa_bad(k: int, n: Optional[int]) -> bool:
    """vLLM's n_predict rule: κ larger than the layer count must be a multiple of it."""
    return n is not None and k > n and k % n != 0


def _verify_rule_help(p) -> dict:
    """The rules a plan's draft shape can use, and why block verification is not one of them on trees."""
    tree = gt(p.method.topk, 1) or bool(p.method.tree_choices)
    rules = [r for r in _rt(p).verify_rules if not (tree and r in ("block", "synthetic"))]
    why = (" (block verification judges one drafted path: chains and parallel blocks only, Sun et al. 2024; "
           "SGLang's block_verification is topk = 1 only)") if tree and p.verify.rule == "block" else ""
    return {"rules": " or ".join(rules), "why": why}


@functools.lru_cache(maxsize=16)
def _load_table(path: str, stamp: tuple):
    """(exists, the loaded table or None, error text or None) for a cost-table path; ``stamp`` (the
    file's mtime and size) keys the cache, so the rules below read each file once per check."""
    from specc.predict import cost
    from specc.errors import PlanError

    if stamp is None:
        return False, None, None
    try:
        return True, cost.load_cost_table(path), None
    except PlanError as exc:
        return True, None, str(exc)


def _table_state(p):
    import os

    path = str(p.schedule.cost_table)
    if path.startswith("pkg://"):
        return _load_table(path, ("pkg",))
    try:
        st = os.stat(path)
    except OSError:
        return _load_table(path, None) if not os.path.lexists(path) else _load_table(path, ("unreadable",))
    return _load_table(path, (st.st_mtime_ns, st.st_size))


def _cost_table_reach(p):
    """The largest verified-token count the plan's cost table profiled, or None when it does not load."""
    table = _table_state(p)[1]
    return None if table is None else max(table.verify_x)


def _cost_table_problem(p):
    """(exists, error text) for the plan's schedule.cost_table; error None when it loads."""
    exists, _, err = _table_state(p)
    return exists, err


def _half_not_measured_faster(p) -> bool:
    """runtime.dtype half precision on the CPU, and no device profile showing it faster than fp32."""
    if p.runtime.device != "cpu" or p.runtime.dtype not in ("float16", "bfloat16"):
        return False
    table = _table_state(p)[1] if p.schedule.cost_table else None
    return table is None or not table.choice or table.choice.get("dtype") != p.runtime.dtype


def _dtype_message(p) -> str:
    table = _table_state(p)[1] if p.schedule.cost_table else None
    if table is None or not table.settings:
        return (f"runtime.dtype={p.runtime.dtype} on runtime.device=cpu: no device profile measured it; on CPUs "
                f"without bf16 units it is emulated and far slower than float32, on CPUs with AMX it can be "
                f"faster. Measure this machine with `specc profile PLAN --out FILE` (it times float32 and "
                f"bfloat16) and set schedule.cost_table=FILE, or use runtime.dtype=auto")
    rates = ", ".join(f"{k} {v.get(1, float('nan')):.1f} ms" for k, v in sorted(table.settings.items()))
    return (f"runtime.dtype={p.runtime.dtype} on runtime.device=cpu: the device profile {table.path} measured "
            f"{table.choice['dtype'] if table.choice else 'another dtype'} faster (1-token forward: {rates}"
            f"{'; ' + table.choice_why if table.choice_why else ''}); use runtime.dtype=auto")


def _serving_ignored(p):
    """(key, why) for each deployment key set that the specc runtime has no use for."""
    d = p.deploy
    out = []
    if d.structured_output.backend is not None:
        out.append(("structured_output.backend", "it has no grammar backend"))
    if d.reasoning_parser is not None:
        out.append(("reasoning_parser", "specc serve returns the text without splitting out the reasoning"))
    if d.cuda_graph_max_bs is not None or d.cuda_graph_batch_sizes:
        out.append(("cuda_graph_max_bs/cuda_graph_batch_sizes", "it captures one graph per candidate state, at "
                    "schedule.capture_batch_sizes (else powers of two up to runtime.max_batch_size)"))
    if d.memory_fraction is not None:
        out.append(("memory_fraction", "it allocates what its states need up front (`specc explain` prints it)"))
    if d.prefix_caching:
        out.append(("prefix_caching", "it has no prefix cache: every prompt is prefilled in full"))
    return out


def drafting(p) -> bool:
    return _supported(p) and _row(p).drafts


def _fill_ngram(p):
    lo = p.method.ngram.min if p.method.ngram.min is not None else min(NGRAM_DEFAULT[0], p.method.ngram.max or 99)
    hi = p.method.ngram.max if p.method.ngram.max is not None else max(NGRAM_DEFAULT[1], lo)
    return {"method.ngram.min": lo, "method.ngram.max": hi}


SUFFIX_SRC = "specc/methods/suffix/drafter.py"
#: method.suffix keys with the values the runtime takes when the plan leaves them unset (vLLM's defaults)
SUFFIX_KEYS = ("max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob", "max_corpus_tokens")


def _suffix_defaults() -> dict:
    from specc.methods.suffix.drafter import DEFAULT_MAX_CORPUS_TOKENS, DEFAULTS

    return dict(DEFAULTS, max_corpus_tokens=DEFAULT_MAX_CORPUS_TOKENS)


def _fill_suffix(p):
    d = _suffix_defaults()
    return {f"method.suffix.{k}": d[k] for k in SUFFIX_KEYS if getattr(p.method.suffix, k) is None}


def _suffix_set(p) -> bool:
    sx = p.method.suffix
    return bool(sx.corpora) or any(getattr(sx, k) is not None for k in SUFFIX_KEYS)


def _suffix_range_problems(p) -> list:
    """Each method.suffix key outside its range (vLLM config/speculative.py:1741-1760), as ``key=value (bound)``."""
    sx, out = p.method.suffix, []
    checks = (("max_tree_depth", lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
              ("max_cached_requests", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"),
              ("max_spec_factor", lambda v: isinstance(v, (int, float)) and v == v and v >= 0, "a number >= 0"),
              ("min_token_prob", lambda v: isinstance(v, (int, float)) and 0 <= v <= 1, "a probability in [0, 1]"),
              ("max_corpus_tokens", lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"))
    for key, ok, what in checks:
        v = getattr(sx, key)
        if v is not None and (isinstance(v, bool) or not ok(v)):
            out.append(f"method.suffix.{key}={v!r} must be {what}")
    return out


def _corpus_problems(p) -> list:
    from specc.methods.suffix.corpus import problem

    return [w for w in (problem(e, i) for i, e in enumerate(p.method.suffix.corpora or [])) if w]


R = Rule
RULES = (
    R("S-RUNTIME", "error", ("method.name",), lambda p: _row(p) is not None and _row(p).runtime is None,
      "method.name={p.method.name} is not run by the specc runtime (its method row has no runtime support; the "
      "runtime runs {runs}); export the plan to an engine that runs it (specc export PLAN --engine sglang|vllm) "
      "or pick one of those methods", "specc/methods/facts.py (Method.runtime)",
      message_args=lambda p: {"runs": ", ".join(methods.runtime_methods())}),
    R("S-NAME", "error", ("name",), lambda p: bad_name(p.name),
      "name={p.name!r} is not a valid identifier, and specc compile uses it as the artifact directory and a "
      "Python module name; use letters, digits and underscores only, starting with a letter or underscore "
      "(e.g. name: my_plan)", CODEGEN_NAMES),
    R("S-K0", "error", ("method.name", "method.num_steps"),
      lambda p: _plain(p) and gt(p.method.num_steps, 0),
      "method.name=none is plain decoding (κ = 0) but method.num_steps={p.method.num_steps}; set num_steps 0 "
      "or pick a method", RT),
    R("S-K0-FILL", "filled", ("method.num_steps",), lambda p: _plain(p) and p.method.num_steps is None,
      "method.name=none: method.num_steps = 0 (plain decoding)", RT, lambda p: {"method.num_steps": 0}),
    R("S-TREE-CHOICES", "error", ("method.tree_choices",), lambda p: drafting(p) and _bad_choices(p),
      "method.tree_choices={p.method.tree_choices}: each path must be a non-empty list of ranks >= 0, listed once, "
      "with every prefix of it listed too (e.g. [[0], [1], [0, 0]])", "specc/compiler/trees.py (normalize_choices)"),
    R("S-TREE-STEPS-FILL", "filled", ("method.num_steps",),
      lambda p: _tree_plan(p) and _choices(p) is not None and p.method.num_steps is None,
      "method.num_steps = {new[method.num_steps]}, the depth of method.tree_choices", "specc/compiler/lower.py (base_num_steps)",
      lambda p: {"method.num_steps": trees.max_depth(_choices(p))}),
    R("S-TREE-DEPTH", "error", ("method.num_steps", "method.tree_choices"),
      lambda p: _tree_plan(p) and _choices(p) is not None and isinstance(p.method.num_steps, int)
      and p.method.num_steps != trees.max_depth(_choices(p)),
      "method.num_steps={p.method.num_steps} but method.tree_choices is "
      "{depth:~level} deep; a static tree drafts its own depth: unset num_steps (`method.num_steps=null`) "
      "or change the tree", "specc/compiler/lower.py (base_num_steps)",
      message_args=lambda p: {"depth": trees.max_depth(_choices(p))}),
    R("S-BLOCK-STEPS", "fallback", ("method.num_steps", "method.block_size"),
      lambda p: _block(p) and isinstance(p.method.block_size, int) and p.method.block_size >= 1
      and (p.method.num_steps is None or (p.method.num_steps == 1 and p.method.block_size != 1)),
      "method.num_steps becomes γ = method.block_size = {p.method.block_size}: the specc runtime's κ for "
      "{p.method.name} is the block's draft count (SGLang pins num_steps to 1 and sizes the verify by the block, "
      "DF8/DS11; here one pass still emits the whole block)", DRAFTERS_SRC,
      lambda p: {"method.num_steps": p.method.block_size}),
    R("S-BLOCK-SIZE", "error", ("method.num_steps", "method.block_size"),
      lambda p: _block(p) and isinstance(p.method.block_size, int)
      and isinstance(p.method.num_steps, int) and p.method.num_steps not in (1, p.method.block_size),
      "method.num_steps={p.method.num_steps} and method.block_size={p.method.block_size} disagree: for "
      "{p.method.name} both are γ, the drafts of one block; set one of them (or both equal)", DRAFTERS_SRC),
    R("S-SUFFIX-FILL", "filled", tuple(f"method.suffix.{k}" for k in SUFFIX_KEYS),
      lambda p: _reads(p, "suffix") and any(getattr(p.method.suffix, k) is None for k in SUFFIX_KEYS),
      "{what} (vLLM's defaults)", SUFFIX_SRC + " (DEFAULTS; vLLM config/speculative.py:538-553)",
      _fill_suffix, message_args=lambda p: {"what": ", ".join(f"{k} = {v}" for k, v in _fill_suffix(p).items())}),
    R("S-SUFFIX-RANGE", "error", tuple(f"method.suffix.{k}" for k in SUFFIX_KEYS),
      lambda p: _reads(p, "suffix") and bool(_suffix_range_problems(p)),
      "{what}", SUFFIX_SRC + " (check_settings; vLLM config/speculative.py:1741-1760)",
      message_args=lambda p: {"what": "; ".join(_suffix_range_problems(p))}),
    R("S-SUFFIX-STEPS-FILL", "filled", ("method.num_steps",),
      lambda p: _reads(p, "suffix") and p.method.num_steps is None and not p.method.tree_choices
      and isinstance(p.method.suffix.max_tree_depth, int) and p.method.suffix.max_tree_depth >= 1,
      "method.num_steps = method.suffix.max_tree_depth = {new[method.num_steps]} (vLLM's K for suffix decoding; "
      "each request drafts only as far as its match allows)", "specc/compiler/lower.py (base_num_steps); vLLM config/speculative.py:1732-1739",
      lambda p: {"method.num_steps": p.method.suffix.max_tree_depth}),
    R("S-SUFFIX-PROB", "fallback", ("verify.draft_sampling",),
      lambda p: _one_hot(p) and _row(p).dynamic_tree and p.verify.draft_sampling == "probabilistic",
      "{p.method.name} drafts have no distribution (a deterministic continuation of the history): "
      "verify.draft_sampling becomes greedy (one-hot q)", SUFFIX_SRC, lambda p: {"verify.draft_sampling": "greedy"}),
    R("S-SUFFIX-CORPUS", "error", ("method.suffix.corpora",),
      lambda p: _reads(p, "suffix") and bool(p.method.suffix.corpora) and bool(_corpus_problems(p)),
      "{what}", "specc/methods/suffix/corpus.py (problem)", message_args=lambda p: {"what": "; ".join(_corpus_problems(p))}),
    R("S-SUFFIX-DEEP", "warning", ("method.num_steps", "method.suffix.max_tree_depth"),
      lambda p: _reads(p, "suffix") and isinstance(p.method.num_steps, int)
      and isinstance(p.method.suffix.max_tree_depth, int) and p.method.num_steps > p.method.suffix.max_tree_depth,
      "method.num_steps={p.method.num_steps} > method.suffix.max_tree_depth={p.method.suffix.max_tree_depth}: a "
      "suffix tree holds the matched tokens (at least one) and the draft within max_tree_depth tokens, so no draft "
      "is longer than {d1}; lower method.num_steps or raise max_tree_depth", SUFFIX_SRC,
      message_args=lambda p: {"d1": p.method.suffix.max_tree_depth - 1}),
    R("S-SUFFIX-IGN", "warning", ("method.suffix",), lambda p: not _reads(p, "suffix") and _suffix_set(p),
      "method.suffix.* is ignored for method.name={p.method.name} (suffix decoding and corpus drafting only)", RT),
    R("S-STEPS", "error", ("method.num_steps",),
      lambda p: drafting(p) and p.method.num_steps is None and p.schedule.kind in ("static", "budget")
      and not _bad_choices(p),  # a malformed tree_choices is reported by S-TREE-CHOICES alone
      "method.num_steps (κ) is required for {p.method.name} with schedule.kind={p.schedule.kind} on the specc "
      "runtime; e.g. method.num_steps=3", RT),
    R("S-KZERO", "warning", ("method.num_steps",), lambda p: drafting(p) and p.method.num_steps == 0,
      "method.num_steps=0 never drafts: {p.method.name} decodes plainly; use method.name=none or κ >= 1", RT),
    R("S-TREE", "error", ("method.topk", "method.tree_choices"),
      lambda p: drafting(p) and (gt(p.method.topk, 1) or bool(p.method.tree_choices))
      and "tree" not in _rt(p).shapes,
      "method.topk={p.method.topk} / method.tree_choices: tree drafting is not supported by the specc runtime "
      "for {p.method.name} (chains only, topk 1); use an EAGLE head (eagle, eagle3) or Medusa heads, or target "
      "sglang", RT),
    R("S-TREE-KIND", "error", ("method.topk", "method.tree_choices"),
      lambda p: _tree_plan(p) and (
          (bool(p.method.tree_choices) and not methods.get(p.method.name).static_tree)
          or (not p.method.tree_choices and not methods.get(p.method.name).dynamic_tree)),
      "method.name={p.method.name} drafts {what} trees only (its method row, Method.dynamic_tree / static_tree): "
      "{fix}", "specc/methods/facts.py (Method.dynamic_tree, Method.static_tree)",
      message_args=lambda p: {"what": "static" if methods.get(p.method.name).static_tree else "dynamic",
                              "fix": "set method.tree_choices (paths of child ranks, e.g. [[0], [1], [0, 0]]) "
                                     "and method.topk=null" if methods.get(p.method.name).static_tree
                              else "drop method.tree_choices and set method.topk > 1"}),
    R("S-TREE-TOPK-IGN", "warning", ("method.topk", "method.tree_choices"),
      lambda p: _tree_plan(p) and _choices(p) is not None and isinstance(p.method.topk, int)
      and p.method.topk != trees.tree_topk(_choices(p)),
      "method.topk={p.method.topk} is ignored: method.tree_choices fixes each node's candidates (up to rank "
      "{topk} - 1); drop method.topk", "specc/compiler/lower.py (plan_topk)",
      message_args=lambda p: {"topk": trees.tree_topk(_choices(p))}),
    R("S-TOPK-FILL", "filled", ("method.topk",),
      lambda p: drafting(p) and p.method.topk is None and not _bad_choices(p),
      "method.topk = {new[method.topk]} ({what})", RT,
      lambda p: {"method.topk": trees.tree_topk(_choices(p)) if _choices(p) is not None else 1},
      message_args=lambda p: {"what": "the widest rank of method.tree_choices + 1" if p.method.tree_choices
                              else "chain drafting"}),
    R("S-WIDTH", "error", ("method.num_draft_tokens", "method.num_steps"),
      lambda p: drafting(p) and p.method.topk == 1 and not p.method.tree_choices
      and isinstance(p.method.num_steps, int) and ne(p.method.num_draft_tokens, p.method.num_steps + 1),
      "method.num_draft_tokens={p.method.num_draft_tokens}: a chain verifies κ + 1 = {p.method.num_steps} + 1 "
      "tokens; unset it with the override `method.num_draft_tokens=null` (it is then filled as κ + 1) or set it "
      "to num_steps + 1", RT),
    R("S-TREE-WIDTH", "error", ("method.num_draft_tokens", "method.tree_choices"),
      lambda p: _tree_plan(p) and _choices(p) is not None and isinstance(p.method.num_draft_tokens, int)
      and p.method.num_draft_tokens != len(_choices(p)) + 1,
      "method.num_draft_tokens={p.method.num_draft_tokens}: a static tree of {n:~node} verifies "
      "{n} + 1 tokens (the root included); unset it (`method.num_draft_tokens=null`)", TREE_SRC,
      message_args=lambda p: {"n": len(_choices(p))}),
    R("S-WIDTH-FILL", "filled", ("method.num_draft_tokens",),
      lambda p: drafting(p) and isinstance(p.method.num_steps, int) and p.method.num_draft_tokens is None
      and not _bad_choices(p),
      "method.num_draft_tokens = {what} = {new[method.num_draft_tokens]}", RT, _fill_width,
      message_args=lambda p: {"what": "the static tree's nodes + 1" if p.method.tree_choices else
                              "topk + (κ − 1)·topk² + 1 (the whole candidate pool)" if gt(p.method.topk, 1)
                              else "κ + 1"}),
    R("S-TREE-POOL", "error", ("method.num_draft_tokens", "method.num_steps", "method.topk"),
      lambda p: _dynamic(p) and _pool(p) is not None and isinstance(p.method.num_draft_tokens, int)
      and p.method.num_draft_tokens - 1 > _pool(p),
      "method.num_draft_tokens={p.method.num_draft_tokens} exceeds the draft tree: κ = {p.method.num_steps}, "
      "topk = {p.method.topk} builds a candidate pool of topk + (κ − 1)·topk² = {pool:~node} (+1 root); "
      "lower num_draft_tokens to <= {pool1} or raise num_steps/topk (SGLang does not check this at startup "
      "and keeps only the pool)", "specc/compiler/lower.py (verify_width; SGLang speculative/eagle_worker_v2.py:742-919)",
      message_args=lambda p: {"pool": _pool(p), "pool1": _pool(p) + 1}),
    R("S-TREE-SHAPE", "error", ("method.num_draft_tokens", "method.topk"),
      lambda p: _tree_plan(p) and isinstance(p.method.num_draft_tokens, int) and (
          p.method.num_draft_tokens < 2 or p.method.num_draft_tokens > 128
          or (isinstance(p.method.topk, int) and p.method.num_draft_tokens * p.method.topk > 2048)),
      "method.num_draft_tokens={p.method.num_draft_tokens}, topk={p.method.topk}: a draft tree must verify 2..128 "
      "tokens with num_draft_tokens·topk <= 2048 (SGLang's tree-shape limits); lower num_draft_tokens or topk", U7),
    R("S-TREE-SHALLOW", "warning", ("method.num_draft_tokens", "method.num_steps"),
      lambda p: _dynamic(p) and isinstance(p.method.num_draft_tokens, int) and isinstance(p.method.num_steps, int)
      and p.method.num_draft_tokens < p.method.num_steps + 1,
      "method.num_draft_tokens={p.method.num_draft_tokens} < num_steps + 1 = {p.method.num_steps} + 1: no verified "
      "node can be deeper than num_draft_tokens - 1, so the last draft levels are drafted for nothing (SGLang's "
      "tree mode refuses Q < F); raise num_draft_tokens or lower num_steps", U7),
    R("S-TREE-PROB", "error", ("verify.draft_sampling", "method.topk", "method.tree_choices"),
      lambda p: _tree_plan(p) and rejection_sampling(p) and (
          not p.method.tree_choices or (_choices(p) is not None and bool(trees.rank_gaps(_choices(p))))),
      "verify.draft_sampling=probabilistic with this tree: a dynamic tree (topk={p.method.topk}) keeps nodes by "
      "their drafted scores and a static tree must keep each node's children as its first draws (ranks 0..m-1), "
      "else rejection sampling is biased; set verify.draft_sampling=greedy (one-hot q, exact for any tree built "
      "deterministically; SGLang's target-only tree sampling) or use method.tree_choices with contiguous ranks",
      "specc/kernels/tree.py (tree_rejection_verify); sglang EG16 (speculative_hook.py:1221-1224)"),
    R("S-TREE-SYN", "error", ("verify.rule",), lambda p: _tree_plan(p) and p.verify.rule == "synthetic",
      "verify.rule=synthetic runs chains only in the specc runtime; use verify.rule=greedy or standard with a tree, "
      "or method.topk=1 without tree_choices", "specc/compiler/programs.py (unsupported_reason)"),
    R("S-PARALLEL-DRAFT", "error", ("method.parallel_drafting",),
      lambda p: drafting(p) and bool(p.method.parallel_drafting) and "parallel" not in _rt(p).shapes,
      "method.parallel_drafting is not supported by the specc runtime for {p.method.name} (it drafts a block "
      "in one pass for {parallel}: PARD = draft_model, P-EAGLE = eagle/eagle3, DFlash, "
      "DSpark); set method.parallel_drafting=false", RT,
      message_args=lambda p: {"parallel": ", ".join(__getattr__("PARALLEL"))}),
    R("S-PARALLEL-MASK", "error", ("method.parallel_drafting", "draft.path"),
      lambda p: _supported(p) and "parallel" in _rt(p).shapes and _row(p).parallel_capable and bool(p.method.parallel_drafting) and p.draft is not None
      and bool(p.draft.path),
      "method.parallel_drafting=true ({what}) needs a draft trained for parallel drafting, with a mask token in "
      "its config.json (pard_token, mask_token_id, ptd_token_id, dspark_noise_token_id or dflash_config.mask_token_id); "
      "draft.path={p.draft.path} has none: use such a draft (e.g. defaults: - /draft: smollm2_135m_pard) or set "
      "method.parallel_drafting=false", "specc/methods/draft_model/drafter.py (parallel_mask_token; vLLM "
      "llm_base_proposer.py:355-379)", needs=("draft",),
      decide=lambda p, f: _mask_token(f) is None, about="the draft's parallel-drafting mask token",
      message_args=lambda p: {"what": "P-EAGLE" if _row(p).consumes_hidden else "PARD"}),
    R("S-DRAFT", "error", ("draft.path",),
      lambda p: _needs_draft(p) and (p.draft is None or not p.draft.path),
      "method.name={p.method.name} needs draft.path (e.g. defaults: - /draft: {example})",
      "specc/models/resolve.py", message_args=lambda p: {"example": _row(p).example_draft or "<your draft>"}),
    R("S-DRAFT-IGN", "warning", ("draft.path",),
      lambda p: _supported(p) and not methods.get(p.method.name).needs_draft_checkpoint
      and not methods.get(p.method.name).target_ships_draft
      and not _reads(p, "plugin") and p.draft is not None and bool(p.draft.path),
      "draft.path is ignored for method.name={p.method.name}; drop the draft section", RT),
    R("S-MTP-DRAFT", "error", ("draft.path", "target.path"),
      lambda p: _ships_draft(p) and _mtp_source(p) == "target",
      "method.name=mtp without draft.path reads the MTP layers shipped in target.path={p.target.path} (as SGLang "
      "points NEXTN's draft at the target), but its config has no num_nextn_predict_layers; set draft.path to an "
      "MTP checkpoint (e.g. defaults: - /draft: smollm2_135m_mtp)", "specc/methods/mtp/drafter.py (build_drafter); "
      "SGLang arg_groups/speculative_hook.py:1120-1148 (EG6)", needs=lambda p: () if _gguf_target(p) else ("target",),
      decide=lambda p, f: _gguf_target(p) or _nextn_layers(f.config("target")) is None,
      about="whether the target checkpoint ships MTP layers"),
    R("S-MTP-STEPS", "error", ("method.num_steps", "draft.path"),
      lambda p: _mtp_readable(p) and isinstance(p.method.num_steps, int),
      "method.num_steps={p.method.num_steps} with an MTP checkpoint of {n:~layer} (num_nextn_predict_layers): "
      "κ above the layer count must be a multiple of it (vLLM: \"num_speculative_tokens must be divisible by "
      "n_predict\"); use method.num_steps <= {n} or a multiple of {n}", MTP_N_PREDICT,
      needs=lambda p: (_mtp_source(p),),
      decide=lambda p, f: _mtp_kappa_bad(p.method.num_steps, _nextn_layers(f.config(_mtp_source(p)))),
      about="the MTP checkpoint's layer count",
      message_args=lambda p, f: {"n": _nextn_layers(f.config(_mtp_source(p)))}),
    R("S-MTP-LAYERS", "error", ("method.name", "draft.path"),
      lambda p: _mtp_readable(p),
      "method.name=mtp: the MTP checkpoint has {n:~layer} (num_nextn_predict_layers), and the specc runtime reruns "
      "one layer for every draft step (vLLM's single-layer MTP with K > 1); run a checkpoint with one layer per "
      "draft step as method.name=multi_layer_eagle (SGLang's draft_runners)", "specc/methods/mtp/drafter.py",
      needs=lambda p: (_mtp_source(p),),
      decide=lambda p, f: (_nextn_layers(f.config(_mtp_source(p))) or 1) > 1,
      about="the MTP checkpoint's layer count",
      message_args=lambda p, f: {"n": _nextn_layers(f.config(_mtp_source(p)))}),
    R("S-ML-MODULES", "error", ("method.num_steps", "draft.path"),
      lambda p: _fact(p, "one_module_per_step") and isinstance(p.method.num_steps, int) and p.draft is not None
      and bool(p.draft.path),
      "method.num_steps={p.method.num_steps} needs {p.method.num_steps:~module}, one per draft step, but "
      "draft.path={p.draft.path} has {n} (num_nextn_predict_layers); lower method.num_steps to <= {n}",
      "specc/methods/multi_layer_eagle/drafter.py", needs=("draft",),
      decide=lambda p, f: _nextn_layers(f.config("draft")) is not None
      and p.method.num_steps > _nextn_layers(f.config("draft")),
      about="the checkpoint's module count", message_args=lambda p, f: {"n": _nextn_layers(f.config("draft"))}),
    R("S-ML-ADAPTIVE", "error", ("schedule.kind", "method.name"),
      lambda p: _fact(p, "one_module_per_step") and p.schedule.kind in ("adaptive", "auto"),
      "schedule.kind={p.schedule.kind} with method.name=multi_layer_eagle: adaptive speculation refuses multi-layer "
      "EAGLE (SGLang: \"MultiLayerEagleWorkerV2 has no adaptive support\"); use schedule.kind=static or "
      "batch_buckets (one κ per batch bucket)", ML_ADAPTIVE),
    R("S-VOCAB", "error", ("draft.vocab_size", "target.vocab_size"),
      lambda p: _needs_draft(p) and not _row(p).consumes_hidden and p.draft is not None and p.target.vocab_size is not None
      and ne(p.draft.vocab_size, p.target.vocab_size),
      "draft.vocab_size={p.draft.vocab_size} != target.vocab_size={p.target.vocab_size}: verify compares token "
      "ids, so the draft model must share the target's vocabulary", "specc/kernels (greedy_verify)"),
    R("S-LEN", "fallback", ("target.max_model_len", "draft.max_model_len"),
      lambda p: drafting(p) and _needs_draft(p) and p.draft is not None
      and isinstance(p.draft.max_model_len, int) and isinstance(p.target.max_model_len, int)
      and p.draft.max_model_len < p.target.max_model_len,
      "draft.max_model_len={p.draft.max_model_len} < target.max_model_len: sequences are capped at "
      "{new[target.max_model_len]:~token}", RT, lambda p: {"target.max_model_len": p.draft.max_model_len}),
    R("S-MAXLEN", "error", ("method.num_draft_tokens", "method.num_steps", "target.max_model_len"),
      lambda p: drafting(p) and usable_len(p) is not None and usable_len(p) < 1,
      "method.num_draft_tokens={p.method.num_draft_tokens} with κ = {p.method.num_steps}, topk = {p.method.topk} "
      "leaves no room in target.max_model_len={p.target.max_model_len}: the runtime reserves {slack} cache slots per request "
      "past the context for {what} (a chain: κ + 2); lower method.num_steps{or_topk} or raise "
      "target.max_model_len", RT_CACHE,
      message_args=lambda p: {"slack": p.target.max_model_len - usable_len(p),
                              "what": "the verify rows, the drafter's tree scratch and the trash slot"
                              if gt(p.method.topk, 1) or p.method.tree_choices else "the verify rows and the trash slot",
                              "or_topk": " or method.topk" if gt(p.method.topk, 1) else ""}),
    R("S-ARCH", "error", ("target.architecture",),
      lambda p: p.target.architecture is not None and p.target.architecture.lower() not in LLAMA_ARCHS,
      "target.architecture={p.target.architecture}: the specc runtime runs llama-family targets only; "
      "target sglang or vllm", "specc/models/llama.py"),
    R("S-TARGET", "error", ("target.path",), lambda p: not p.target.path,
      "target.path is required (e.g. defaults: - /target: smollm2_135m)", "specc/models/resolve.py"),
    R("S-NGRAM-FILL", "filled", ("method.ngram.min", "method.ngram.max"),
      lambda p: _reads(p, "ngram") and (p.method.ngram.min is None or p.method.ngram.max is None),
      "method.ngram.min/max = {new[method.ngram.min]}/{new[method.ngram.max]}", "specc/methods/ngram/drafter.py",
      _fill_ngram),
    R("S-NGRAM-ORDER", "error", ("method.ngram.min", "method.ngram.max"),
      lambda p: _reads(p, "ngram") and isinstance(p.method.ngram.min, int)
      and isinstance(p.method.ngram.max, int) and p.method.ngram.min > p.method.ngram.max,
      "method.ngram.min={p.method.ngram.min} must be <= method.ngram.max={p.method.ngram.max}",
      "specc/methods/ngram/drafter.py"),
    R("S-NGRAM-IGN", "warning", ("method.ngram",), lambda p: not _reads(p, "ngram") and ngram_window_set(p),
      "method.ngram.min/max are ignored for method.name={p.method.name}", RT),
    R("S-BLOCK-IGN", "warning", ("method.block_size", "method.markov", "method.confidence_head"),
      lambda p: _supported(p) and (
          (not _block(p) and p.method.block_size is not None)
          or (not _reads(p, "markov") and (p.method.markov.kind is not None or p.method.markov.rank is not None))
          or (not _reads(p, "confidence_head") and p.method.confidence_head is not None)),
      "method.block_size is a DFlash/DSpark setting and method.markov/confidence_head DSpark's; they are ignored "
      "for {p.method.name}", RT),
    R("S-MARKOV", "error", ("method.markov.rank",),
      lambda p: _reads(p, "markov") and isinstance(p.method.markov.rank, int) and p.method.markov.rank <= 0,
      "method.markov.rank={p.method.markov.rank}: a DSpark Markov head needs rank > 0 (SGLang DS32, "
      "models/dspark.py:385-405); set the checkpoint's rank", "specc/methods/dflash/model.py (MarkovHead)"),
    R("S-BLOCK-CKPT", "error", ("draft.path",),
      lambda p: _block(p) and p.draft is not None and bool(p.draft.path),
      "draft.path={p.draft.path} is not a DFlash/DSpark block draft: its config.json has no target_layer_ids "
      "(dflash_config.target_layer_ids); use a block draft (e.g. defaults: - /draft: smollm2_135m_dflash) or "
      "change method.name", "specc/methods/dflash/model.py (parse_block_config)",
      needs=("draft",), decide=lambda p, f: not _block_ck(f).get("target_layer_ids"),
      about="the draft's block configuration"),
    R("S-BLOCK-BEYOND", "warning", ("method.num_steps", "draft.path"),
      lambda p: _block(p) and isinstance(p.method.num_steps, int) and p.draft is not None
      and bool(p.draft.path),
      "method.num_steps={p.method.num_steps} drafts a block of {p.method.num_steps} + 1 positions, longer than the "
      "draft was trained for (block_size {bs} in its config.json): positions past it are drafted blind and almost "
      "never accepted; set method.num_steps <= {bs1}", "specc/methods/dflash/model.py (parse_block_config)",
      needs=("draft",), decide=lambda p, f: isinstance(_block_ck(f).get("block_size"), int)
      and p.method.num_steps + 1 > _block_ck(f)["block_size"], about="the draft's block size",
      message_args=lambda p, f: {"bs": _block_ck(f).get("block_size"), "bs1": (_block_ck(f).get("block_size") or 1) - 1}),
    R("S-MEDUSA-HEADS", "error", ("method.num_steps", "method.tree_choices", "draft.path"),
      lambda p: _fact(p, "draft_shape") == "heads" and isinstance(p.method.num_steps, int) and p.draft is not None
      and bool(p.draft.path),
      "method.num_steps={p.method.num_steps} (the tree's depth) needs {p.method.num_steps} Medusa heads, the draft "
      "has {n} (medusa_num_heads in draft.path={p.draft.path}); use a tree at most {n} deep", "specc/methods/medusa/drafter.py",
      needs=("draft",), decide=lambda p, f: _medusa_heads(f) is not None and p.method.num_steps > _medusa_heads(f),
      about="the draft's Medusa heads", message_args=lambda p, f: {"n": _medusa_heads(f)}),
    R("S-MARKOV-CK", "warning", ("method.markov.kind", "method.markov.rank", "draft.path"),
      lambda p: _reads(p, "markov") and (p.method.markov.kind is not None or p.method.markov.rank is not None)
      and p.draft is not None and bool(p.draft.path),
      "method.markov={{kind: {p.method.markov.kind}, rank: {p.method.markov.rank}}} differs from the draft "
      "checkpoint's Markov head ({ck}); the runtime uses the checkpoint's", "specc/methods/dflash/model.py (parse_block_config)",
      needs=("draft",), decide=lambda p, f: bool(_block_ck(f).get("target_layer_ids")) and _markov_differs(p, f),
      about="the draft's Markov head",
      message_args=lambda p, f: {"ck": _markov_text(f)}),
    R("S-DSPARK-RAGGED", "error", ("schedule.ragged_verify", "method.confidence_head", "draft.path"),
      lambda p: drafting(p) and _rt(p).confidence == "head" and p.schedule.kind == "budget"
      and p.schedule.ragged_verify in ("cap_accept", "compact"),
      "schedule.ragged_verify={p.schedule.ragged_verify} needs DSpark's trained confidence head (SGLang DS21, "
      "dspark_planner.py:137-147) and {why}; use a draft with a confidence head or schedule.ragged_verify=static",
      "specc/runtime/schedule.py (BudgetSchedule); specc/methods/dflash/drafter.py",
      needs=lambda p: () if p.method.confidence_head is False else ("draft",),
      decide=lambda p, f: p.method.confidence_head is False or not _has_confidence_head(f),
      about="whether the DSpark draft has a confidence head",
      message_args=lambda p, f: {"why": "method.confidence_head=false" if p.method.confidence_head is False
                                 else f"draft.path={p.draft.path if p.draft else None} has none"}),
    R("S-VERIFY", "error", ("verify.rule",),
      lambda p: drafting(p) and (p.verify.rule not in _rt(p).verify_rules or (
          p.verify.rule == "block" and (gt(p.method.topk, 1) or bool(p.method.tree_choices)))),
      "verify.rule={p.verify.rule} is not supported by the specc runtime for {p.method.name} with this draft "
      "shape{why}; use verify.rule={rules}", "specc/kernels",
      message_args=lambda p: _verify_rule_help(p)),
    R("S-SYNTHETIC", "warning", ("verify.rule",), lambda p: drafting(p) and p.verify.rule == "synthetic",
      "verify.rule=synthetic accepts drafts by a fixed curve whatever the tokens: an ablation harness whose "
      "output is NOT the target model's distribution (nor plain greedy output); use it to measure what "
      "acceptance would buy, never to serve", "specc/kernels/verify.py (synthetic_verify)"),
    R("S-SYN-RATES", "error", ("verify.synthetic.acceptance_rates", "verify.synthetic.acceptance_length"),
      lambda p: drafting(p) and p.verify.rule == "synthetic"
      and (p.verify.synthetic.acceptance_rates is None) == (p.verify.synthetic.acceptance_length is None),
      "verify.rule=synthetic needs exactly one of verify.synthetic.acceptance_rates (unconditional, "
      "non-increasing, in [0, 1]) or verify.synthetic.acceptance_length (in [1, κ + 1]); e.g. "
      "verify.synthetic.acceptance_length=2.5", "specc/compiler/programs.py (synthetic_conditional_rates; vLLM config/speculative.py:599-631)"),
    R("S-SYN-RANGE", "error", ("verify.synthetic.acceptance_rates", "verify.synthetic.acceptance_length"),
      lambda p: drafting(p) and p.verify.rule == "synthetic" and (
          (p.verify.synthetic.acceptance_length is not None and isinstance(p.method.num_steps, int)
           and not 1 <= p.verify.synthetic.acceptance_length <= p.method.num_steps + 1)
          or (p.verify.synthetic.acceptance_rates is not None and (
              any(not 0 <= r <= 1 for r in p.verify.synthetic.acceptance_rates)
              or any(a < b for a, b in zip(p.verify.synthetic.acceptance_rates,
                                           p.verify.synthetic.acceptance_rates[1:]))))),
      "verify.synthetic: acceptance_length must lie in [1, method.num_steps + 1] and acceptance_rates "
      "must be non-increasing values in [0, 1] (vLLM's rule)",
      "specc/compiler/programs.py (synthetic_conditional_rates; vLLM config/speculative.py:599-631, 1974-1988)"),
    R("S-NGRAM-PROB", "fallback", ("verify.draft_sampling",),
      lambda p: _one_hot(p) and not _row(p).dynamic_tree and rejection_sampling(p),
      "{p.method.name} drafts have no distribution: verify.draft_sampling becomes greedy (one-hot q)",
      "specc/methods/ngram/drafter.py", lambda p: {"verify.draft_sampling": "greedy"}),
    R("S-GREEDY-PROB", "warning", ("verify.rule", "verify.draft_sampling"),
      lambda p: drafting(p) and p.verify.rule == "greedy" and p.verify.draft_sampling == "probabilistic",
      "verify.draft_sampling=probabilistic is ignored by greedy verify; use verify.rule=standard or "
      "draft_sampling=greedy", "specc/kernels (greedy_verify)"),
    R("S-THRESH", "error", ("verify.accept_threshold",), lambda p: drafting(p) and thresholds_set(p),
      "verify.accept_threshold.* (lossy acceptance) is not supported by the specc runtime yet; target sglang",
      "specc/kernels"),
    R("S-SYN-IGN", "warning", ("verify.synthetic",),
      lambda p: p.verify.rule != "synthetic" and (p.verify.synthetic.acceptance_length is not None
                                                  or p.verify.synthetic.acceptance_rates is not None),
      "verify.synthetic.* is ignored unless verify.rule=synthetic", RT),
    R("S-SCHED", "warning", ("schedule.kind",),
      lambda p: _plain(p) and p.schedule.kind != "static",
      "schedule.kind={p.schedule.kind} has nothing to choose with method.name=none (plain decoding, κ = 0); "
      "it runs as static", SCHED),
    R("S-BUCKET-ONE", "error", ("schedule.buckets",), _bucket_not_single,
      "schedule.kind=batch_buckets takes one κ per bucket (vLLM's num_speculative_tokens_per_batch_size); "
      "give each schedule.buckets.<size>.candidates exactly one value, or use schedule.kind=adaptive to "
      "choose among several", SCHED),
    R("S-BUDGET-TABLE", "error", ("schedule.cost_table",),
      lambda p: drafting(p) and p.schedule.kind == "budget" and not p.schedule.cost_table,
      "schedule.kind=budget sizes each step's verify from a profiled cost table; set schedule.cost_table to "
      "the JSON that `specc profile PLAN --out FILE` writes on this machine", SCHED),
    R("S-COST-TABLE", "error", ("schedule.cost_table",),
      lambda p: bool(p.schedule.cost_table) and _cost_table_problem(p)[1] is not None,
      "{err}", "specc/predict/cost.py (load_cost_table)", message_args=lambda p: {"err": _cost_table_problem(p)[1]}),
    R("S-COST-TABLE-SHORT", "warning", ("schedule.cost_table", "runtime.max_batch_size", "method.num_draft_tokens"),
      lambda p: drafting(p) and bool(p.schedule.cost_table) and _cost_table_reach(p) is not None
      and isinstance(p.method.num_draft_tokens, int)
      and _cost_table_reach(p) < p.runtime.max_batch_size * p.method.num_draft_tokens,
      "schedule.cost_table was profiled up to {reach} verified tokens, but this plan verifies up to "
      "runtime.max_batch_size × num_draft_tokens = {p.runtime.max_batch_size} × {p.method.num_draft_tokens} = "
      "{need}: costs past {reach} are extrapolated; re-profile with `specc profile PLAN --out FILE` (it "
      "measures up to the plan's largest verify)", "specc/predict/cost.py (CostTable.step_ms)",
      message_args=lambda p: {"reach": _cost_table_reach(p),
                              "need": p.runtime.max_batch_size * p.method.num_draft_tokens}),
    R("S-COST-TABLE-MISSING", "warning", ("schedule.cost_table",),
      lambda p: bool(p.schedule.cost_table) and not _cost_table_problem(p)[0],
      "schedule.cost_table={p.schedule.cost_table} is not on this machine: explain, compile and run read it "
      "(`specc profile PLAN --out FILE` writes one)", "specc/predict/cost.py (load_cost_table)"),
    R("S-BUCKET-EMPTY", "error", ("schedule.buckets",),
      lambda p: any(not b.candidates for b in (p.schedule.buckets or {}).values()),
      "schedule.buckets.{b}.candidates is empty: list at least one κ for that batch size (e.g. [0] for "
      "plain decoding there) or remove the bucket", SCHED,
      message_args=lambda p: {"b": next(k for k, v in p.schedule.buckets.items() if not v.candidates)}),
    R("S-AUTO-INPUT", "error", ("schedule.cost_table", "schedule.hardware"),
      lambda p: drafting(p) and p.schedule.kind == "auto" and not p.schedule.cost_table and not p.schedule.hardware,
      "schedule.kind=auto derives κ per bucket from the cost model; set schedule.cost_table (a `specc profile` "
      "JSON, best) or schedule.hardware (cpu, h100, h200)", "specc/compiler/lower.py (derive_auto_buckets)"),
    R("S-RAGGED", "warning", ("schedule.ragged_verify",),
      lambda p: drafting(p) and p.schedule.kind == "budget" and p.schedule.ragged_verify == "static",
      "schedule.ragged_verify=static verifies every draft: the budget schedule then never trims; use compact "
      "(verify only the admitted tokens) or cap_accept (verify all, accept only the admitted)", SCHED),
    R("S-RAGGED-IGN", "warning", ("schedule.ragged_verify",),
      lambda p: drafting(p) and p.schedule.kind != "budget" and p.schedule.ragged_verify != "static",
      "schedule.ragged_verify={p.schedule.ragged_verify} only applies to schedule.kind=budget; it is ignored", SCHED),
    R("S-SCHED-IGN", "warning", ("schedule.buckets", "schedule.ema_alpha", "schedule.update_interval",
                                 "schedule.warmup_batches"),
      lambda p: p.schedule.kind in ("static", "budget") and (bool(p.schedule.buckets) or p.schedule.ema_alpha is not None
                                                 or p.schedule.update_interval is not None
                                                 or p.schedule.warmup_batches is not None),
      "schedule.buckets/ema_alpha/update_interval/warmup_batches are ignored with schedule.kind={p.schedule.kind}",
      SCHED),
    R("S-LORA", "error", ("deploy.lora.adapters", "schedule.kind"),
      lambda p: bool(p.deploy.lora.adapters) and drafting(p) and p.schedule.kind in LORA_REFUSED_SCHEDULES,
      "deploy.lora.adapters with schedule.kind={p.schedule.kind}: LoRA needs each request's verify to keep one "
      "width, but this schedule changes κ between steps (adaptive, auto: SGLang refuses LoRA + adaptive, "
      "lora_hook.py:277-282) or per request (budget: vLLM refuses LoRA with adaptive verification, "
      "config/vllm.py:3153-3182); use schedule.kind=static or batch_buckets", "specc/runtime/lora.py"),
    R("S-LORA-IGN", "warning", ("deploy.lora.max_loras_per_batch",),
      lambda p: p.deploy.lora.max_loras_per_batch is not None and not p.deploy.lora.adapters,
      "deploy.lora.max_loras_per_batch is ignored without deploy.lora.adapters", "specc/runtime/lora.py"),
    R("S-DISAGG", "warning", ("deploy.disagg.role",), lambda p: p.deploy.disagg.role != "none",
      "deploy.disagg.role={p.deploy.disagg.role} is a serving role: `specc serve` runs it (the prefill instance "
      "ships the prompt's KV and {p.method.name}'s seed, per the method table's seed kind); `specc run` and "
      "`specc bench` decode prefill and decode in one process", "specc/runtime/disagg.py"),
    R("S-PLUGIN", "error", ("method.plugin",), lambda p: _reads(p, "plugin") and not p.method.plugin,
      "method.name=custom needs method.plugin: 'package.module:Class' (a drafter class) or the name of a "
      "'specc.methods' entry point; see docs/plugins.md", "specc/methods/__init__.py (resolve_plugin)"),
    R("S-PLUGIN-NAME", "error", ("method.plugin",),
      lambda p: _reads(p, "plugin") and bool(p.method.plugin) and p.method.plugin in methods.METHODS,
      "method.plugin={p.method.plugin} is a builtin method's name (reserved); use method.name={p.method.plugin}",
      "specc/methods/__init__.py (reserved_names; SGLang spec_registry.py:246-250)"),
    R("S-PLUGIN-IGN", "warning", ("method.plugin",), lambda p: not _reads(p, "plugin") and bool(p.method.plugin),
      "method.plugin is ignored unless method.name=custom", RT),
    R("S-PAR", "error", ("deploy.parallel",),
      lambda p: any(gt(getattr(p.deploy.parallel, k), 1) for k in ("tp", "dp", "pp", "draft_tp", "draft_pp", "draft_dp"))
      or p.deploy.parallel.dp_attention or p.deploy.parallel.two_batch_overlap,
      "deploy.parallel (tp/dp/pp or draft_tp/draft_pp/draft_dp > 1, dp_attention, two_batch_overlap): the specc "
      "runtime runs target and draft on one device, with no tensor, pipeline or data parallelism; target sglang or "
      "vllm", RT),
    R("S-GRAMMAR", "error", ("deploy.structured_output.requests",),
      lambda p: p.deploy.structured_output.requests is True,
      "deploy.structured_output.requests=true: the specc runtime has no grammar-constrained decoding (no "
      "structured-output backend masks the verify logits), so requests carrying a JSON schema or grammar would be "
      "answered unconstrained; target sglang or vllm", "specc/runtime/stages.py (accept_*: no grammar mask)"),
    R("S-SERVE-IGN", "warning", ("deploy.structured_output.backend", "deploy.reasoning_parser", "deploy.memory_fraction",
                                 "deploy.cuda_graph_max_bs", "deploy.cuda_graph_batch_sizes", "deploy.prefix_caching"),
      lambda p: bool(_serving_ignored(p)),
      "{what} are SGLang/vLLM server settings the specc runtime ignores: {why}", RT,
      message_args=lambda p: {"what": ", ".join(f"deploy.{k}" for k, _ in _serving_ignored(p)),
                              "why": "; ".join(w for _, w in _serving_ignored(p))}),
    R("S-DEPLOY-IGN", "warning", ("deploy.page_size", "deploy.attention_backend", "deploy.max_running_requests",
                                  "deploy.overlap_scheduler"),
      lambda p: any(v is not None for v in (p.deploy.page_size, p.deploy.attention_backend,
                                             p.deploy.max_running_requests, p.deploy.overlap_scheduler)),
      "deploy.page_size/attention_backend/max_running_requests/overlap_scheduler are server settings the "
      "specc runtime ignores (it uses runtime.max_batch_size)", RT),
    R("S-TRT", "error", ("runtime.compile_backend",), lambda p: p.runtime.compile_backend == "tensorrt",
      "runtime.compile_backend=tensorrt needs CUDA and TensorRT (torch_tensorrt), which the specc runtime does not "
      "build on; on CUDA it captures each state as a CUDA graph, on the CPU it compiles with inductor: use "
      "eager, inductor or auto (the device profile's measured choice)", RT),
    R("S-CPU-DTYPE", "warning", ("runtime.dtype", "runtime.device", "schedule.cost_table"),
      _half_not_measured_faster, "{why}", "specc/runtime/profile.py (settings, choice)",
      message_args=lambda p: {"why": _dtype_message(p)}),
    R("S-CPU-HALF-INDUCTOR", "warning", ("runtime.dtype", "runtime.compile_backend", "runtime.device"),
      lambda p: p.runtime.device == "cpu" and p.runtime.dtype in ("bfloat16", "float16")
      and p.runtime.compile_backend == "inductor",
      "runtime.dtype={p.runtime.dtype} with runtime.compile_backend=inductor on the CPU: inductor's half-precision "
      "kernels are not row-invariant, so a verify over W tokens can round a row differently from the 1-token step "
      "and speculative greedy output can differ from plain greedy (measured by tools/bench_backends.py: 8 of 36 "
      "prompt runs differed, docs/bench_backends.json); use compile_backend=eager with {p.runtime.dtype}, or "
      "dtype=float32 with inductor", "tools/bench_backends.py (docs/bench_backends.json)"),
    R("S-TRITON-CPU", "warning", ("runtime.kernel_backend", "runtime.device"),
      lambda p: p.runtime.device == "cpu" and p.runtime.kernel_backend == "triton",
      "runtime.kernel_backend=triton on CPU runs under TRITON_INTERPRET=1 (very slow); use torch or auto",
      "specc/kernels"),
)

PROFILE = Profile(name="specc", version="specc==0.1.0", root="", rules=RULES)
