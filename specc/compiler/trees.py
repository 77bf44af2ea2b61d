"""Draft-tree shapes, torch-free: static trees compiled once into buffers, and the sizes of SGLang's
dynamic EAGLE tree.

A draft tree of verify width W has W nodes: node 0 is the root (the request's pending token, the
bonus of the previous step) and nodes 1..W-1 are draft tokens. Nodes are numbered in a topological
order (every node's parent has a smaller number), so any prefix of the nodes is itself a tree; a
chain is the tree whose node i has parent i - 1.

* **Static trees** (``method.tree_choices``, Medusa's format: ``[0, 1]`` is the second-ranked child
  of the root's first-ranked child) compile once into plain lists (:func:`compile_tree`): parent and
  depth of every node, the child rank that picks its token, the tree-only attention mask, the
  retrieve indices of every root-to-leaf path and, per depth, the nodes a drafter expands (Medusa's
  ``generate_medusa_buffers``, FasterDecoding/Medusa ``medusa/model/utils.py:32-125``; here sorted by (depth,
  path), so siblings come in
  rank order). Codegen bakes them into the state's generated module.
* **Dynamic trees** (EAGLE-2/3, ``method.topk > 1``): a candidate pool of ``topk + (κ - 1)·topk²``
  nodes per step, the best ``num_draft_tokens - 1`` kept (SGLang 0.5.23
  sglang/srt/speculative/eagle_worker_v2.py:742-919); :func:`pool_size`.

:func:`cache_slack` says how many KV slots past ``max_model_len`` a row needs for a state's verify
rows and the drafter's tree scratch (runtime and ``specc`` profile rules share it).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from specc.errors import PlanError

Paths = Tuple[Tuple[int, ...], ...]


def normalize_choices(tree_choices: Optional[Sequence[Sequence[int]]], field: str = "method.tree_choices"
                      ) -> Optional[Paths]:
    """``tree_choices`` as a tuple of paths sorted by (depth, path), validated: every path non-empty
    with ranks >= 0, no duplicates, every prefix present. None/empty -> None.

    Raises:
        PlanError: naming ``field`` and the offending path.
    """
    if not tree_choices:
        return None
    paths = []
    for p in tree_choices:
        try:
            path = tuple(int(r) for r in p)
        except (TypeError, ValueError):
            raise PlanError(f"{field}: {p!r} is not a list of integer ranks (e.g. [0, 1])") from None
        if not path or min(path) < 0:
            raise PlanError(f"{field}: path {list(path)} must be a non-empty list of ranks >= 0")
        paths.append(path)
    seen = set()
    for p in paths:
        if p in seen:
            raise PlanError(f"{field}: path {list(p)} is listed twice")
        seen.add(p)
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise PlanError(f"{field}: path {list(p)} has no parent {list(p[:-1])}; list every prefix of a path")
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


def truncate(tree_choices: Optional[Paths], depth: int) -> Optional[Paths]:
    """The paths of at most ``depth`` ranks (a state that drafts κ = ``depth`` levels of a deeper
    static tree); None when nothing is left or no tree was given."""
    if tree_choices is None:
        return None
    kept = tuple(p for p in tree_choices if len(p) <= depth)
    return kept or None


def max_depth(tree_choices: Paths) -> int:
    """Depth of the deepest node (the κ a static tree drafts)."""
    return max(len(p) for p in tree_choices)


def tree_topk(tree_choices: Paths) -> int:
    """Largest child rank + 1: how many ranked candidates a drafter needs per node."""
    return max(max(p) for p in tree_choices) + 1


def rank_gaps(tree_choices: Paths) -> List[Tuple[int, ...]]:
    """Parents (as paths, ``()`` the root) whose children's ranks are not ``0..m-1``. Probabilistic
    drafts need none: children are draws without replacement, taken in draw order, so a node may
    only keep a prefix of them (recursive rejection, Jeon et al. 2024)."""
    children: Dict[Tuple[int, ...], List[int]] = {}
    for p in tree_choices:
        children.setdefault(p[:-1], []).append(p[-1])
    return sorted(parent for parent, ranks in children.items() if sorted(ranks) != list(range(len(ranks))))


def compile_tree(tree_choices: Optional[Sequence[Sequence[int]]]) -> Optional[Dict[str, Any]]:
    """Static buffers of a draft tree, as plain lists (no torch at compile time).

    Returns None for no tree, else with W = len(tree_choices) + 1 nodes (root first, then the paths
    sorted by (depth, path)):

    * ``nodes`` [W-1]: the paths; ``num_nodes``: W; ``max_depth``; ``topk``: largest rank + 1;
    * ``parents`` [W-1]: the parent node of nodes 1..W-1 (root = 0; always smaller than the node);
    * ``depths`` [W]: root 0 (the RoPE offset of each node from the root's position);
    * ``ranks`` [W-1]: the child rank that picks each node's token among its parent's candidates;
    * ``attn_mask`` [W][W] of 0/1: node i sees node j iff j is i or an ancestor of i (the tree-only
      part of the verify mask, SGLang's ``QLEN_ONLY`` packing);
    * ``retrieve_indices`` [L][max_depth+1]: node indices along each root-to-leaf path, -1 padded;
    * ``expand`` [max_depth]: per depth d, the nodes at depth d that have children (the nodes a
      drafter runs on at level d; depth 0 is ``[0]``, the root).

    Raises:
        PlanError: a malformed tree (see :func:`normalize_choices`).
    """
    nodes = normalize_choices(tree_choices)
    if nodes is None:
        return None
    index = {(): 0}
    for i, p in enumerate(nodes, start=1):
        index[p] = i
    n = len(nodes) + 1
    mask = [[0] * n for _ in range(n)]
    for p, i in index.items():
        for d in range(len(p) + 1):
            mask[i][index[p[:d]]] = 1
    parents = [index[p[:-1]] for p in nodes]
    depths = [0] + [len(p) for p in nodes]
    has_child = {p[:-1] for p in nodes}
    leaves = [p for p in nodes if p not in has_child]
    deepest = max(len(p) for p in nodes)
    retrieve = [[index[p[:d]] for d in range(len(p) + 1)] + [-1] * (deepest - len(p)) for p in leaves]
    expand = [[index[p] for p in ((),) + nodes if len(p) == d and p in has_child] for d in range(deepest)]
    return {"nodes": [list(p) for p in nodes], "num_nodes": n, "max_depth": deepest, "topk": tree_topk(nodes),
            "parents": parents, "depths": depths, "ranks": [p[-1] for p in nodes], "attn_mask": mask,
            "retrieve_indices": retrieve, "expand": expand}


def chain_choices(num_steps: int) -> Paths:
    """The chain of κ = ``num_steps`` nodes as tree_choices (``[0], [0, 0], ...``)."""
    return tuple((0,) * d for d in range(1, int(num_steps) + 1))


def pool_size(num_steps: int, topk: int) -> int:
    """Candidate pool of SGLang's EAGLE draft tree: topk + (κ − 1)·topk² nodes (SGLang 0.5.23
    sglang/srt/speculative/eagle_worker_v2.py:742-919); κ = 0 → 0."""
    if num_steps <= 0:
        return 0
    return topk + (num_steps - 1) * topk * topk


def draft_scratch_slots(num_steps: int, topk: int, num_draft_tokens: int, static: bool) -> int:
    """KV slots past a row's last committed draft position that a drafter with its own KV (EAGLE)
    writes while it grows a tree: one per node it runs its layer on after the root — (κ − 1)·topk
    beams for a dynamic tree, at most W − 1 nodes for a static tree, κ − 1 for a chain."""
    if num_steps <= 0:
        return 0
    if static:
        return max(0, int(num_draft_tokens) - 1)
    return (int(num_steps) - 1) * max(1, int(topk))


def cache_slack(num_steps: int, topk: int, num_draft_tokens: int, static: bool = False) -> int:
    """KV slots per row past ``max_model_len``: the verify rows of the widest step (W, written at
    ``seq_len - 1 + node``), the drafter's tree scratch (:func:`draft_scratch_slots`), and the trash
    slot. A chain gets κ + 2 (W = κ + 1), the runtime's rule before trees."""
    w = int(num_draft_tokens) or int(num_steps) + 1
    return max(w, draft_scratch_slots(num_steps, topk, w, static)) + 1
