"""The stage programs a state runs: draft, verify, accept, commit, extend. Each is
``fn(ctx, bufs, *constants)`` over a state's static buffers (:class:`specc.runtime.state.StateBuffers`);
generated state modules call exactly these functions with the constants of
:func:`specc.programs.state_programs`.

Verification follows gpt-fast's position-indexed KV (anchors A1): the verify forward writes the
target KV of each request's verify rows at slots ``seq_len - 1 + i``; for a chain, row i is also
position ``seq_len - 1 + i``, so rows past the accepted prefix are simply overwritten by a later step
and hidden by the causal-by-position mask, and the commit stage has nothing to do. A tree's node i
sits at position ``seq_len - 1 + depth(i)`` but slot ``seq_len - 1 + i``; after acceptance the
commit stage copies the accepted path's KV to the slots of its positions (Medusa's gather-copy,
anchors.md §A2), after which the tree is a chain again for every later step.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from specc.drafters.base import DraftSampling, TreeRequest, VerifyStep, clip_num_valid
from specc.kernels import block_verify, greedy_verify, process_logits, rejection_verify, synthetic_verify
from specc.kernels.tree import TreeMaskMode, tree_attention_mask, tree_greedy_verify, tree_rejection_verify


def draft_none(ctx: Any, bufs: Any) -> None:
    """κ = 0: nothing to propose."""
    bufs.num_valid.zero_()


def draft_chain(ctx: Any, bufs: Any, num_steps: int, draft_sampling: str, every_position: bool = False) -> None:
    """Ask the drafter for κ = ``num_steps`` tokens per row and store them, clipped per row.

    ``every_position`` (the synthetic rule, whose acceptance ignores the tokens): every row verifies
    all its ``max_draft`` positions even where the drafter proposed fewer (an n-gram miss).

    Writes: ``bufs.draft_tokens [B, K]`` (invalid entries 0), ``bufs.num_valid [B]``
    (``min(proposal.num_valid, batch.max_draft)``, 0 for padding rows), ``bufs.confidence [B, K]``
    (the drafter's estimate, 1 where it gives none, 0 past num_valid), ``bufs.draft_probs [B, K, V]``
    for probabilistic drafts, and the drafts into ``bufs.input_ids[:, 1:]``.
    """
    noise = bufs.draft_noise if draft_sampling == "probabilistic" else None  # [B, K, V] Exp(1)
    prop = ctx.drafter.propose(bufs.batch, num_steps, DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_block(bufs, prop, num_steps, every_position)


def _store_tree(ctx: Any, bufs: Any, prop: Any, static: bool) -> None:
    """Write a tree proposal into the state's buffers, clipped per row: a node deeper than the row's
    ``max_draft`` (the request's remaining tokens or room) is marked not proposed (token -1, never
    accepted, nor its subtree); ``num_valid`` is the prefix up to the last proposed node."""
    batch = bufs.batch
    n = bufs.draft_tokens.shape[1]
    dev = bufs.draft_tokens.device
    depths = prop.depths.to(dev)  # [B, N]
    idx = torch.arange(n, device=dev).view(1, n)
    proposed = (depths <= batch.max_draft.view(-1, 1)) & batch.active.view(-1, 1) & (idx < prop.num_valid.to(dev).view(-1, 1))
    num_valid = torch.where(proposed, idx + 1, torch.zeros_like(idx)).amax(dim=1) if n else bufs.num_valid.new_zeros(
        bufs.num_valid.shape)  # [B]
    tokens = prop.tokens.to(dev)
    bufs.draft_tokens.copy_(torch.where(proposed, tokens, torch.full_like(tokens, -1)))
    bufs.input_ids[:, 1:].copy_(torch.where(proposed, tokens, torch.zeros_like(tokens)))
    bufs.num_valid.copy_(num_valid)
    if not static:
        bufs.parents.copy_(prop.parents.to(dev))
        bufs.node_depths[:, 1:].copy_(depths)
        bufs.tree_mask.copy_(tree_attention_mask(bufs.parents, TreeMaskMode.QLEN_ONLY, backend=ctx.kernel_backend))
    bufs.positions.copy_(bufs.positions[:, :1] + bufs.node_depths)  # root position + depth
    # budget scores: the running minimum of the path probabilities, as per-node factors (their running
    # product is that minimum; for a tree in score order it is each node's own path probability)
    if prop.confidence is not None:
        surv = torch.where(proposed, prop.confidence.to(bufs.confidence.dtype).clamp(0.0, 1.0),
                           torch.zeros_like(bufs.confidence))
        run_min = torch.cummin(surv, dim=1).values  # [B, N]
        prev = torch.cat([torch.ones_like(run_min[:, :1]), run_min[:, :-1]], dim=1)
        bufs.confidence.copy_(torch.where(prev > 0, run_min / prev.clamp(min=1e-30), torch.zeros_like(prev)))
    else:
        bufs.confidence.copy_(proposed.to(bufs.confidence.dtype))
    if bufs.draft_probs is not None:
        bufs.draft_probs.copy_(prop.probs)


def draft_parallel(ctx: Any, bufs: Any, num_steps: int, draft_sampling: str, every_position: bool = False) -> None:
    """One draft pass emits the whole block of κ = ``num_steps`` tokens per row
    (``drafter.propose_block``: DFlash/DSpark's non-causal pass over [bonus, MASK × κ], PARD's and
    P-EAGLE's mask-token pass), stored like :func:`draft_chain`'s proposals (same buffers, same
    clipping; ``every_position`` for the synthetic rule)."""
    batch = bufs.batch
    noise = bufs.draft_noise if draft_sampling == "probabilistic" else None  # [B, K, V] Exp(1)
    prop = ctx.drafter.propose_block(batch, num_steps, DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_block(bufs, prop, num_steps, every_position)


def _store_block(bufs: Any, prop: Any, num_steps: int, every_position: bool) -> None:
    """Write a block proposal into the state's buffers: ``draft_tokens [B, K]`` (0 past each row's
    valid drafts), ``num_valid [B]``, ``confidence [B, K]`` (1 where the drafter gives none, 0 past
    num_valid), ``draft_probs [B, K, V]`` for probabilistic drafts, and ``input_ids[:, 1:]``."""
    batch = bufs.batch
    proposed = prop.num_valid.to(bufs.num_valid.device)
    if every_position:
        proposed = torch.full_like(proposed, num_steps)
    valid = clip_num_valid(proposed, batch.max_draft, batch.active)  # [B]
    inside = torch.arange(num_steps, device=valid.device).view(1, -1) < valid.view(-1, 1)  # [B, K]
    tokens = torch.where(inside, prop.tokens.to(bufs.draft_tokens.device), 0)  # [B, K]
    bufs.num_valid.copy_(valid)
    bufs.draft_tokens.copy_(tokens)
    bufs.input_ids[:, 1:].copy_(tokens)
    conf = prop.confidence if prop.confidence is not None else torch.ones_like(bufs.confidence)
    bufs.confidence.copy_(torch.where(inside, conf.to(bufs.confidence.dtype), 0.0))
    if bufs.draft_probs is not None:
        bufs.draft_probs.copy_(prop.probs)


def draft_tree(ctx: Any, bufs: Any, num_steps: int, topk: int, draft_sampling: str) -> None:
    """Ask the drafter for a dynamic draft tree (EAGLE-2/3: topk beams per level, the best
    ``W - 1`` nodes of the candidate pool; ``Drafter.propose_tree``) and store it: draft_tokens,
    parents ``[B, N]``, node_depths ``[B, W]``, positions, the tree mask ``[B, W, W]``
    (``specc.kernels.tree_attention_mask``, QLEN_ONLY), num_valid, confidence."""
    n = bufs.draft_tokens.shape[1]
    noise = bufs.draft_noise if draft_sampling == "probabilistic" else None
    prop = ctx.drafter.propose_tree(bufs.batch, TreeRequest(num_steps=num_steps, topk=topk, num_nodes=n),
                                    DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_tree(ctx, bufs, prop, static=False)


def draft_tree_static(ctx: Any, bufs: Any, num_steps: int, draft_sampling: str) -> None:
    """Ask the drafter for the tokens of the state's compiled static tree (``bufs.static_tree``:
    parents, depths and mask are constants of the state) and store them."""
    tree = bufs.static_tree
    noise = bufs.draft_noise if draft_sampling == "probabilistic" else None
    prop = ctx.drafter.propose_tree(bufs.batch, TreeRequest(num_steps=num_steps, topk=tree.topk,
                                                            num_nodes=tree.num_nodes, static=tree),
                                    DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_tree(ctx, bufs, prop, static=True)


def verify_tree(ctx: Any, bufs: Any) -> None:
    """Target forward over every request's W tree nodes in one pass: node i at position
    ``root + depth(i)``, its KV at slot ``root + i``, attending to the cached prefix (slots before the
    root) and to its own ancestors (``bufs.tree_mask``) through ``LlamaModel.forward``'s explicit
    mask ``[B, W, S]``; ragged on the CPU as :func:`verify_chain`. Writes ``bufs.logits`` and
    ``bufs.hidden``."""
    b, w = bufs.input_ids.shape
    root = bufs.positions[:, 0]  # [B] the root's position = its slot (trash rows: 0)
    span = ctx.max_seq_len if bufs.input_ids.is_cuda else int(root.max()) + w if b else w
    rel = torch.arange(span, device=root.device).view(1, 1, span) - root.view(b, 1, 1)  # [B, 1, S]
    inside = (rel >= 0) & (rel < w)
    tree = bufs.tree_mask.gather(2, rel.clamp(0, w - 1).expand(b, w, span))  # [B, W, S]
    mask = (rel < 0) | (inside & tree)
    logits, hidden = ctx.target.forward(bufs.input_ids, bufs.positions, bufs.cache_slots, mask,
                                        hidden_layers=ctx.hidden_layers,
                                        num_tokens=bufs.num_tokens if bufs.ragged else None)
    bufs.logits = logits
    bufs.hidden = list(hidden)


def accept_tree_greedy(ctx: Any, bufs: Any, max_depth: int) -> None:
    """Greedy tree rule (``specc.kernels.tree_greedy_verify``): from the root, accept the child equal
    to the target argmax while one matches. Writes ``bufs.result``."""
    fn = _kernel(ctx, bufs, tree_greedy_verify)
    bufs.result = fn(bufs.draft_tokens, bufs.parents, bufs.logits, bufs.num_valid, max_depth,
                     backend=ctx.kernel_backend)


def accept_tree_standard(ctx: Any, bufs: Any, probabilistic_q: bool, max_depth: int) -> None:
    """Tree rejection sampling (``specc.kernels.tree_rejection_verify``): multi-candidate recursive
    rejection over each node's children, q one-hot (greedy drafts) or ``bufs.draft_probs``; an eager
    step whose rows are all greedy takes the greedy tree rule (the same result, as for chains).
    Writes ``bufs.result``."""
    if bufs.all_greedy:
        bufs.result = tree_greedy_verify(bufs.draft_tokens, bufs.parents, bufs.logits, bufs.num_valid, max_depth,
                                         backend=ctx.kernel_backend)
        return
    q = bufs.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, bufs, tree_rejection_verify)
    bufs.result = fn(bufs.draft_tokens, bufs.parents, _target_probs(bufs), q, bufs.uniforms, bufs.exp_noise,
                     bufs.num_valid, backend=ctx.kernel_backend)


def commit_none(ctx: Any, bufs: Any) -> None:
    """A chain: the accepted rows' KV already sits at their positions."""


def commit_tree(ctx: Any, bufs: Any) -> None:
    """The KV-commit stage of a tree: the accepted path's nodes ``accept_index[b, j]`` (slot
    ``root + node``) hold the target KV of positions ``root + j``; copy each to slot ``root + j``
    (``LlamaModel.copy_kv``; nothing to copy where the path already is ``0, 1, 2, ...``). Then hand
    the drafter the path as chain-shaped rows (``bufs.path``: input ids, positions, slots and hidden
    states along the path), so its own KV is refreshed over the accepted tokens by the extend stage."""
    res = bufs.result
    b, w = bufs.input_ids.shape
    dev = bufs.input_ids.device
    trash = ctx.trash_slot
    idx = res.accept_index  # [B, W] root, accepted nodes, -1
    acc = res.accepted_len.to(torch.int64)  # [B]
    col = torch.arange(w, device=dev).view(1, w)
    node = idx.clamp(min=0)
    root = bufs.positions[:, 0].view(b, 1)
    live = (bufs.num_tokens > 0).view(b, 1)
    on_path = (col <= acc.view(b, 1)) & live  # [B, W]
    moved = on_path & (node != col)
    if bufs.input_ids.is_cuda or bool(moved.any()):
        src = torch.where(moved, root + node, torch.full_like(node, trash))
        dst = torch.where(moved, root + col, torch.full_like(node, trash))
        ctx.target.copy_kv(src, dst)
    slots = torch.where(on_path, root + col, torch.full_like(node, trash))
    hidden = [h.gather(1, node.view(b, w, 1).expand(b, w, h.shape[-1])) for h in bufs.hidden]
    bufs.path = (bufs.input_ids.gather(1, node), root + col, slots, hidden)

def verify_chain(ctx: Any, bufs: Any) -> None:
    """Target forward over the W = κ + 1 verify rows of every request; in eager mode a ragged
    forward in which row b costs ``bufs.num_tokens[b]`` tokens (``LlamaModel.forward(num_tokens=)``).

    Reads ``bufs.input_ids/positions/cache_slots [B, W]``; writes ``bufs.logits [B, W, V]`` fp32 and
    ``bufs.hidden`` (list of ``[B, W, H]`` at ``ctx.hidden_layers``).
    """
    logits, hidden = ctx.target.forward(bufs.input_ids, bufs.positions, bufs.cache_slots, None,
                                        hidden_layers=ctx.hidden_layers,
                                        num_tokens=bufs.num_tokens if bufs.ragged else None)
    bufs.logits = logits
    bufs.hidden = list(hidden)


def _kernel(ctx: Any, bufs: Any, default: Callable) -> Callable:
    """The artifact's specialized verify kernel (``bufs.kernels["verify"]``) when loaded and
    specialized to this step's verify width, else the generic ``default`` (a width-trimmed step)."""
    name = bufs.kernels.get("verify") if bufs.kernels else None
    module = ctx.kernel_modules.get(name) if name else None
    if module is None or getattr(module, "NUM_DRAFT_TOKENS", None) != bufs.input_ids.shape[1]:
        return default
    return module.verify


def accept_greedy(ctx: Any, bufs: Any) -> None:
    """Greedy rule (``specc.kernels.greedy_verify``, or the artifact's variant): accept drafts equal
    to the target argmax. Writes ``bufs.result`` (VerifyOutput)."""
    fn = _kernel(ctx, bufs, greedy_verify)
    bufs.result = fn(bufs.draft_tokens, bufs.logits, bufs.num_valid, backend=ctx.kernel_backend)


def _target_probs(bufs: Any) -> torch.Tensor:
    """p = processed target logits ``[B, W, V]`` at each row's temperature / top-k / top-p."""
    return process_logits(bufs.logits, bufs.temperature, bufs.top_k if bufs.use_top_k else None,
                          bufs.top_p if bufs.use_top_p else None)


def accept_standard(ctx: Any, bufs: Any, probabilistic_q: bool) -> None:
    """Standard rule (``specc.kernels.rejection_verify``, or the artifact's variant):
    p = processed target logits ``[B, W, V]``; q one-hot (greedy drafts) or ``bufs.draft_probs``
    (probabilistic drafts). Temperature-0 rows reduce to greedy exactly (``process_logits`` gives
    them a one-hot p), so an eager step whose rows are all greedy (``bufs.all_greedy``) takes
    ``greedy_verify`` directly and skips the softmax over the vocabulary. Writes ``bufs.result``."""
    if bufs.all_greedy:  # eager step with only temperature-0 rows: the standard rule is the greedy rule
        bufs.result = greedy_verify(bufs.draft_tokens, bufs.logits, bufs.num_valid, backend=ctx.kernel_backend)
        return
    q = bufs.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, bufs, rejection_verify)
    bufs.result = fn(bufs.draft_tokens, _target_probs(bufs), q, bufs.uniforms, bufs.exp_noise, bufs.num_valid,
                     backend=ctx.kernel_backend)


def accept_block(ctx: Any, bufs: Any, probabilistic_q: bool) -> None:
    """Block verification (``specc.kernels.block_verify``, or the artifact's variant; Sun et al. 2024):
    p = processed target logits ``[B, W, V]``, q one-hot or ``bufs.draft_probs``; accepts the longest
    prefix whose joint test passes. Temperature-0 rows reduce to greedy exactly, so an eager step whose
    rows are all greedy takes ``greedy_verify``. Writes ``bufs.result``."""
    if bufs.all_greedy:
        bufs.result = greedy_verify(bufs.draft_tokens, bufs.logits, bufs.num_valid, backend=ctx.kernel_backend)
        return
    q = bufs.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, bufs, block_verify)
    bufs.result = fn(bufs.draft_tokens, _target_probs(bufs), q, bufs.uniforms, bufs.exp_noise, bufs.num_valid,
                     backend=ctx.kernel_backend)


def accept_synthetic(ctx: Any, bufs: Any, conditional_rates: Sequence[float]) -> None:
    """Synthetic rule (``specc.kernels.synthetic_verify``): draft i accepted with the conditional rate
    c_i whatever the tokens (its draft program verifies every position, ``draft_chain(...,
    every_position=True)``, so a lookup miss does not cut the curve short). An ablation harness: the
    output is not the target's distribution. Writes ``bufs.result``."""
    k = bufs.draft_tokens.shape[1]
    bufs.result = synthetic_verify(bufs.draft_tokens, _target_probs(bufs), conditional_rates[:k], bufs.uniforms,
                                   bufs.exp_noise, bufs.num_valid)


def extend_none(ctx: Any, bufs: Any) -> None:
    """No drafter to extend."""


def extend_drafter(ctx: Any, bufs: Any) -> None:
    """Hand the verify outcome to the drafter (EAGLE refreshes its KV over accepted tokens here; the
    n-gram drafter learns its acceptance estimate). Runs at κ = 0 too."""
    res = bufs.result
    if bufs.path is not None:  # a tree: the accepted path, as chain rows (commit_tree)
        ids, positions, slots, hidden = bufs.path
        accept_index = res.accept_index
    else:
        ids, positions, slots, hidden, accept_index = bufs.input_ids, bufs.positions, bufs.cache_slots, bufs.hidden, None
    ctx.drafter.commit(bufs.batch, VerifyStep(
        input_ids=ids, positions=positions, cache_slots=slots,
        accepted=res.accepted_len.to(torch.int64), bonus=res.bonus, target_hidden=hidden,
        num_valid=bufs.num_valid, num_steps=bufs.draft_tokens.shape[1], accept_index=accept_index))
