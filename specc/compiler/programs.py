"""The programs a candidate state runs: one table, read by codegen (which renders each state's module
from it) and by the runtime (which builds states without an artifact from the same table).

A state runs five stage programs, each a function of :mod:`specc.runtime.stages` called as
``fn(ctx, bufs, *args)`` with the state's constants as ``args``:

* **draft** — ``draft_none`` (κ = 0), ``draft_chain(κ, draft_sampling[, every_position])`` (κ draft
  passes), ``draft_parallel(κ, draft_sampling[, every_position])`` (one pass emits the block: DFlash,
  DSpark, PARD, P-EAGLE), ``draft_tree(κ, topk, draft_sampling)`` (a dynamic EAGLE tree) or
  ``draft_tree_static(κ, draft_sampling)`` (the state's compiled static tree);
* **verify** — ``verify_chain``: one target forward over each request's pending token and drafts;
  ``verify_tree``: one target forward over each request's tree with the tree mask over its cached
  prefix;
* **accept** — ``accept_greedy`` (greedy rule), ``accept_standard(probabilistic_q)`` (rejection
  sampling; also κ = 0, where it is plain sampling), ``accept_block(probabilistic_q)`` (block
  verification, Sun et al. 2024), ``accept_synthetic(conditional_rates)``; for trees
  ``accept_tree_greedy(max_depth)`` and ``accept_tree_standard(probabilistic_q, max_depth)``
  (multi-candidate recursive rejection over siblings);
* **commit** — ``commit_none`` (a chain's KV is in place by position) or ``commit_tree`` (moves the
  accepted path's target KV into place and hands the drafter the path);
* **extend** — ``extend_drafter`` whenever the plan has a drafter (at κ = 0 too, as SGLang runs
  draft-extend at steps = 0: a state switch must find the drafter in sync),
  else ``extend_none``.

:func:`unsupported_reason` says why the runtime cannot run a state (and codegen refuses to compile
it). Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from specc import methods
from specc.compiler import trees

STAGES = ("draft", "verify", "accept", "commit", "extend")

PROGRAM_DOCS = {
    "draft_none": "κ = 0: nothing to propose (plain decoding through the same runtime).",
    "draft_chain": "Ask the drafter for κ tokens per request, clipped per request (draft_tokens [B, κ], "
                   "num_valid [B], confidence [B, κ]).",
    "draft_tree": "Ask the drafter for a dynamic tree (topk beams per level, the best num_draft_tokens - 1 "
                  "nodes of the candidate pool): draft_tokens, parents, depths [B, W-1], the tree mask.",
    "draft_tree_static": "Ask the drafter for the tokens of the state's compiled static tree (parents, depths "
                         "and mask are this state's constant buffers).",
    "draft_parallel": "Ask the drafter for the whole block of κ tokens in one draft pass (draft_tokens [B, κ], "
                      "num_valid [B], confidence [B, κ]), clipped per request.",
    "verify_chain": "One target forward over each request's pending token and its drafts (KV written by "
                    "position; rows past a request's drafts cost nothing on the CPU).",
    "verify_tree": "One target forward over each request's draft tree: node i at position root + depth, KV at "
                   "slot root + i, attending to the cached prefix and its own ancestors (the tree mask).",
    "accept_tree_greedy": "Greedy tree rule: walk from the root, accepting the child equal to the target argmax; "
                          "bonus = argmax where no child matches.",
    "accept_tree_standard": "Tree rejection sampling: multi-candidate recursive rejection over siblings "
                            "(one-hot q unless the first argument is True); exact for the target distribution.",
    "commit_none": "Nothing to move: a chain's accepted KV is already in place by position.",
    "commit_tree": "Move the accepted path's target KV from its tree slots to consecutive positions and hand "
                   "the drafter the path as a chain.",
    "accept_greedy": "Greedy rule: accept drafts equal to the target argmax; bonus = argmax at the first miss.",
    "accept_standard": "Standard rule (rejection sampling; one-hot q unless the first argument is True); "
                       "with κ = 0 it samples the bonus token alone from the processed target distribution.",
    "accept_block": "Block verification (Sun et al. 2024): accept the longest prefix whose joint test passes, "
                    "resample from the joint residual (one-hot q unless the first argument is True).",
    "accept_synthetic": "Synthetic rule (an ablation harness, not the target's distribution): accept draft i "
                        "with the given conditional rate, whatever the tokens (vLLM SYNTHETIC_MODE).",
    "extend_none": "No drafter to extend.",
    "extend_drafter": "Hand the verify outcome (accepted tokens, target hidden states) to the drafter, at "
                      "κ = 0 too, so a switch of state finds the drafter in sync.",
}
"""One line per stage program (rendered as the generated functions' docstrings)."""


@dataclass(frozen=True)
class Call:
    """One program: ``specc.runtime.stages.<fn>(ctx, bufs, *args)``; ``args`` are plain literals."""

    fn: str
    args: Tuple[Any, ...] = ()


@dataclass(frozen=True)
class StatePrograms:
    """The five programs of a state (see the module docstring)."""

    draft: Call
    verify: Call
    accept: Call
    commit: Call
    extend: Call

    def items(self) -> Tuple[Tuple[str, Call], ...]:
        return tuple((s, getattr(self, s)) for s in STAGES)


def synthetic_conditional_rates(rates: Optional[Sequence[float]], length: Optional[float],
                                num_steps: int) -> Tuple[float, ...]:
    """vLLM's synthetic acceptance as conditional per-position rates c_0..c_{κ-1}
    (vllm/config/speculative.py:589-597): ``length`` L becomes the minimum-variance staircase of unconditional rates
    (``floor(L − 1)`` ones, then ``L − 1 − floor(L − 1)``, then zeros; SP:589-597), then
    c_i = r_i / r_{i−1} with r_{−1} = 1 and c_i = 0 where the denominator is 0
    (``v1/spec_decode/utils.py:848-851``). ``rates`` (unconditional, non-increasing) are used as given,
    truncated or zero-padded to κ. Returns κ floats in [0, 1]. Raises ValueError when both or
    neither are given."""
    if (rates is None) == (length is None):
        raise ValueError("give exactly one of verify.synthetic.acceptance_rates / acceptance_length")
    if rates is None:
        a = float(length) - 1.0
        whole = int(a)
        rates = [1.0] * whole + [a - whole]
    r = [min(max(float(x), 0.0), 1.0) for x in list(rates)[:num_steps]]
    r += [0.0] * (num_steps - len(r))
    out, prev = [], 1.0
    for x in r:
        out.append(0.0 if prev == 0 else min(1.0, x / prev))
        prev = x
    return tuple(round(c, 9) for c in out)


def unsupported_reason(state: Any) -> Optional[str]:
    """Why specc's runtime cannot run ``state`` (a CandidateState or runtime StateSpec), naming the
    field and the fix, or None when it can."""
    m = methods.get(state.method)
    where = f"candidate state {state.name}"
    rt = m.runtime
    if rt is None:
        return (f"{where}: method.name={state.method} is not run by the specc runtime (it runs "
                f"{', '.join(methods.runtime_methods())}); target sglang or vllm")
    kind = methods.state_kind(state.num_steps, state.topk, state.parallel, state.tree_choices)
    if kind not in rt.shapes:
        what = {"tree": f"tree drafting (topk={state.topk}, tree_choices)",
                "parallel": "parallel drafting"}.get(kind, kind)
        return (f"{where}: {what} is not implemented by the specc runtime for {state.method} "
                f"(it runs {', '.join(rt.shapes)}); use a chain (method.topk=1, no tree_choices, "
                f"method.parallel_drafting=false)")
    if state.num_steps > 0 and state.verify_rule not in rt.verify_rules:
        return (f"{where}: verify rule {state.verify_rule!r} is not implemented by the specc runtime for "
                f"{state.method} (it runs {', '.join(rt.verify_rules)}); set verify.rule to one of them")
    if state.num_steps > 0 and state.draft_sampling not in rt.draft_sampling:
        return (f"{where}: {state.method} cannot draw {state.draft_sampling} drafts; set "
                f"verify.draft_sampling={rt.draft_sampling[0]}")
    if kind in ("chain", "parallel") and state.num_draft_tokens not in (0, state.num_steps + 1):
        shape = "chain" if kind == "chain" else "parallel block"
        return (f"{where}: a {shape} verifies num_draft_tokens = κ + 1 = {state.num_steps + 1} rows, the state "
                f"says {state.num_draft_tokens}")
    if kind == "tree":
        reason = _tree_reason(state, m, where)
        if reason:
            return reason
    if state.num_steps < 0 or state.batch_size < 1:
        return f"{where}: batch_size must be >= 1 and num_steps >= 0"
    return None


def _tree_reason(state: Any, m: Any, where: str) -> Optional[str]:
    """Why a tree state cannot run, or None (the shapes the runtime's tree programs handle)."""
    static = state.tree_choices is not None
    if static and not m.static_tree:
        return f"{where}: method {state.method} has no static trees (method.tree_choices); drop tree_choices"
    if not static and not m.dynamic_tree:
        return f"{where}: method {state.method} has no dynamic trees (method.topk > 1); use method.topk=1"
    if state.verify_rule in ("synthetic", "block"):
        return (f"{where}: verify.rule={state.verify_rule} runs chains and parallel blocks only; use "
                f"verify.rule=greedy or standard on trees")
    if state.verify_rule == "standard" and state.draft_sampling == "probabilistic":
        if not static:
            return (f"{where}: a dynamic tree (topk={state.topk}) keeps nodes by their drafted scores, so "
                    f"probabilistic drafts would bias rejection sampling (SGLang refuses rejection sampling with "
                    f"topk > 1, EG16); set verify.draft_sampling=greedy (one-hot q) or use method.tree_choices")
        gaps = trees.rank_gaps(trees.normalize_choices(state.tree_choices))
        if gaps:
            return (f"{where}: probabilistic drafts take a node's children as its first draws without replacement, "
                    f"so each node's child ranks must be 0..m-1; method.tree_choices misses ranks under "
                    f"{[list(g) for g in gaps[:3]]}; add them or set verify.draft_sampling=greedy")
    width = int(state.num_draft_tokens)
    if static and width != len(state.tree_choices) + 1:
        return (f"{where}: a static tree of {len(state.tree_choices)} nodes verifies {len(state.tree_choices) + 1} "
                f"rows, the state says num_draft_tokens={width}")
    if not static and not 2 <= width <= trees.pool_size(state.num_steps, state.topk) + 1:
        return (f"{where}: num_draft_tokens={width} must lie in [2, pool + 1 = "
                f"{trees.pool_size(state.num_steps, state.topk) + 1}] for κ={state.num_steps}, topk={state.topk}")
    return None


def tree_max_depth(state: Any) -> int:
    """The deepest node a tree state can verify: the static tree's depth, else min(κ, W - 1)."""
    if state.tree_choices is not None:
        return trees.max_depth(trees.normalize_choices(state.tree_choices))
    return min(int(state.num_steps), int(state.num_draft_tokens) - 1)


def state_programs(state: Any, synthetic_rates: Optional[Sequence[float]] = None) -> StatePrograms:
    """The programs ``state`` runs (see the module docstring).

    Args:
        state: a CandidateState or StateSpec (``method``, ``num_steps``, ``verify_rule``,
            ``draft_sampling``, ...).
        synthetic_rates: conditional acceptance rates (:func:`synthetic_conditional_rates`) for
            ``verify_rule == "synthetic"``; at least κ of them.
    Raises:
        ValueError: the state is not runnable (:func:`unsupported_reason`), or a synthetic state
            without rates.
    """
    reason = unsupported_reason(state)
    if reason:
        raise ValueError(reason)
    k, sampling = int(state.num_steps), state.draft_sampling
    has_drafter = methods.get(state.method).drafts
    extend = Call("extend_drafter") if has_drafter else Call("extend_none")
    if k > 0 and methods.state_kind(k, state.topk, state.parallel, state.tree_choices) == "tree":
        depth = tree_max_depth(state)
        if state.tree_choices is not None:
            draft = Call("draft_tree_static", (k, sampling))
        else:
            draft = Call("draft_tree", (k, int(state.topk), sampling))
        if state.verify_rule == "greedy":
            accept = Call("accept_tree_greedy", (depth,))
        else:
            accept = Call("accept_tree_standard", (sampling == "probabilistic", depth))
        return StatePrograms(draft=draft, verify=Call("verify_tree"), accept=accept, commit=Call("commit_tree"),
                             extend=extend)
    parallel = methods.state_kind(k, state.topk, state.parallel, state.tree_choices) == "parallel"
    draft_fn = "draft_parallel" if parallel else "draft_chain"
    if k == 0:
        draft = Call("draft_none")
    elif state.verify_rule == "synthetic":
        draft = Call(draft_fn, (k, sampling, True))
    else:
        draft = Call(draft_fn, (k, sampling))
    if k == 0:
        accept = Call("accept_standard", (False,))
    elif state.verify_rule == "greedy":
        accept = Call("accept_greedy")
    elif state.verify_rule == "synthetic":
        if synthetic_rates is None or len(synthetic_rates) < k:
            raise ValueError(f"candidate state {state.name}: verify.rule=synthetic needs κ = {k} "
                             f"acceptance rates (verify.synthetic)")
        accept = Call("accept_synthetic", (tuple(float(r) for r in synthetic_rates[:k]),))
    elif state.verify_rule == "block":
        accept = Call("accept_block", (sampling == "probabilistic",))
    else:
        accept = Call("accept_standard", (sampling == "probabilistic",))
    return StatePrograms(draft=draft, verify=Call("verify_chain"), accept=accept, commit=Call("commit_none"),
                         extend=extend)
