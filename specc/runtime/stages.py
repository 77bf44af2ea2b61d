"""The stage programs a state runs: draft, verify, accept, commit, extend, over a step's inputs
(:class:`specc.runtime.state.StepInputs`), bound to the constants of
:func:`specc.compiler.programs.state_programs`:

* ``draft_*(ctx, inp, *constants)`` writes the drafts into ``inp``;
* ``verify_*(ctx, inp) -> (logits [B, W, V] fp32, hidden [list of [B, W, H]])``;
* ``accept_*(ctx, inp, logits, *constants) -> VerifyOutput``;
* ``commit_*(ctx, inp, result, hidden) -> path | None`` (a tree's accepted path as chain rows);
* ``extend_*(ctx, inp, outputs, batch_view)``.

Verify, accept and commit make up the state's verify program (``SpecRuntimeState.program``), the one
function that runs eager, captured or compiled; they read only ``inp`` and return their results.

Verification follows gpt-fast's position-indexed KV (pytorch-labs/gpt-fast model.py): the verify forward writes the
target KV of each request's verify rows at slots ``seq_len - 1 + i``; for a chain, row i is also
position ``seq_len - 1 + i``, so rows past the accepted prefix are simply overwritten by a later step
and hidden by the causal-by-position mask, and the commit stage has nothing to do. A tree's node i
sits at position ``seq_len - 1 + depth(i)`` but slot ``seq_len - 1 + i``; after acceptance the
commit stage copies the accepted path's KV to the slots of its positions (Medusa's gather-copy,
FasterDecoding/Medusa medusa/model/utils.py), after which the tree is a chain again for every later step.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from specc.methods.base import DraftSampling, TreeRequest, VerifyStep, clip_num_valid
from specc.kernels import block_verify, greedy_verify, process_logits, rejection_verify, synthetic_verify
from specc.kernels.tree import TreeMaskMode, tree_attention_mask, tree_greedy_verify, tree_rejection_verify


def draft_none(ctx: Any, inp: Any) -> None:
    """κ = 0: nothing to propose."""
    inp.num_valid.zero_()


def draft_chain(ctx: Any, inp: Any, num_steps: int, draft_sampling: str, every_position: bool = False) -> None:
    """Ask the drafter for κ = ``num_steps`` tokens per row and store them, clipped per row.

    ``every_position`` (the synthetic rule, whose acceptance ignores the tokens): every row verifies
    all its ``max_draft`` positions even where the drafter proposed fewer (an n-gram miss).

    Writes: ``inp.draft_tokens [B, K]`` (invalid entries 0), ``inp.num_valid [B]``
    (``min(proposal.num_valid, batch.max_draft)``, 0 for padding rows), ``inp.confidence [B, K]``
    (the drafter's estimate, 1 where it gives none, 0 past num_valid), ``inp.draft_probs [B, K, V]``
    for probabilistic drafts, and the drafts into ``inp.input_ids[:, 1:]``.
    """
    noise = inp.draft_noise if draft_sampling == "probabilistic" else None  # [B, K, V] Exp(1)
    prop = ctx.drafter.propose(inp.batch, num_steps, DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_block(inp, prop, num_steps, every_position)


def _store_tree(ctx: Any, inp: Any, prop: Any, static: bool) -> None:
    """Write a tree proposal into the state's buffers, clipped per row: a node deeper than the row's
    ``max_draft`` (the request's remaining tokens or room) is marked not proposed (token -1, never
    accepted, nor its subtree); ``num_valid`` is the prefix up to the last proposed node."""
    batch = inp.batch
    n = inp.draft_tokens.shape[1]
    dev = inp.draft_tokens.device
    depths = prop.depths.to(dev)  # [B, N]
    idx = torch.arange(n, device=dev).view(1, n)
    proposed = (depths <= batch.max_draft.view(-1, 1)) & batch.active.view(-1, 1) & (idx < prop.num_valid.to(dev).view(-1, 1))
    num_valid = torch.where(proposed, idx + 1, torch.zeros_like(idx)).amax(dim=1) if n else inp.num_valid.new_zeros(
        inp.num_valid.shape)  # [B]
    tokens = prop.tokens.to(dev)
    inp.draft_tokens.copy_(torch.where(proposed, tokens, torch.full_like(tokens, -1)))
    inp.input_ids[:, 1:].copy_(torch.where(proposed, tokens, torch.zeros_like(tokens)))
    inp.num_valid.copy_(num_valid)
    if not static:
        inp.parents.copy_(prop.parents.to(dev))
        inp.node_depths[:, 1:].copy_(depths)
        inp.tree_mask.copy_(tree_attention_mask(inp.parents, TreeMaskMode.QLEN_ONLY, backend=ctx.kernel_backend))
    inp.positions.copy_(inp.positions[:, :1] + inp.node_depths)  # root position + depth
    # budget scores: the running minimum of the path probabilities, as per-node factors (their running
    # product is that minimum; for a tree in score order it is each node's own path probability)
    if prop.confidence is not None:
        surv = torch.where(proposed, prop.confidence.to(inp.confidence.dtype).clamp(0.0, 1.0),
                           torch.zeros_like(inp.confidence))
        run_min = torch.cummin(surv, dim=1).values  # [B, N]
        prev = torch.cat([torch.ones_like(run_min[:, :1]), run_min[:, :-1]], dim=1)
        inp.confidence.copy_(torch.where(prev > 0, run_min / prev.clamp(min=1e-30), torch.zeros_like(prev)))
    else:
        inp.confidence.copy_(proposed.to(inp.confidence.dtype))
    if inp.draft_probs is not None:
        inp.draft_probs.copy_(prop.probs)


def draft_parallel(ctx: Any, inp: Any, num_steps: int, draft_sampling: str, every_position: bool = False) -> None:
    """One draft pass emits the whole block of κ = ``num_steps`` tokens per row
    (``drafter.propose_block``: DFlash/DSpark's non-causal pass over [bonus, MASK × κ], PARD's and
    P-EAGLE's mask-token pass), stored like :func:`draft_chain`'s proposals (same buffers, same
    clipping; ``every_position`` for the synthetic rule)."""
    batch = inp.batch
    noise = inp.draft_noise if draft_sampling == "probabilistic" else None  # [B, K, V] Exp(1)
    prop = ctx.drafter.propose_block(batch, num_steps, DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_block(inp, prop, num_steps, every_position)


def _store_block(inp: Any, prop: Any, num_steps: int, every_position: bool) -> None:
    """Write a block proposal into the state's buffers: ``draft_tokens [B, K]`` (0 past each row's
    valid drafts), ``num_valid [B]``, ``confidence [B, K]`` (1 where the drafter gives none, 0 past
    num_valid), ``draft_probs [B, K, V]`` for probabilistic drafts, and ``input_ids[:, 1:]``."""
    batch = inp.batch
    proposed = prop.num_valid.to(inp.num_valid.device)
    if every_position:
        proposed = torch.full_like(proposed, num_steps)
    valid = clip_num_valid(proposed, batch.max_draft, batch.active)  # [B]
    inside = torch.arange(num_steps, device=valid.device).view(1, -1) < valid.view(-1, 1)  # [B, K]
    tokens = torch.where(inside, prop.tokens.to(inp.draft_tokens.device), 0)  # [B, K]
    inp.num_valid.copy_(valid)
    inp.draft_tokens.copy_(tokens)
    inp.input_ids[:, 1:].copy_(tokens)
    conf = prop.confidence if prop.confidence is not None else torch.ones_like(inp.confidence)
    inp.confidence.copy_(torch.where(inside, conf.to(inp.confidence.dtype), 0.0))
    if inp.draft_probs is not None:
        inp.draft_probs.copy_(prop.probs)


def draft_tree(ctx: Any, inp: Any, num_steps: int, topk: int, draft_sampling: str) -> None:
    """Ask the drafter for a dynamic draft tree (EAGLE-2/3: topk beams per level, the best
    ``W - 1`` nodes of the candidate pool; ``Drafter.propose_tree``) and store it: draft_tokens,
    parents ``[B, N]``, node_depths ``[B, W]``, positions, the tree mask ``[B, W, W]``
    (``specc.kernels.tree_attention_mask``, QLEN_ONLY), num_valid, confidence."""
    n = inp.draft_tokens.shape[1]
    noise = inp.draft_noise if draft_sampling == "probabilistic" else None
    prop = ctx.drafter.propose_tree(inp.batch, TreeRequest(num_steps=num_steps, topk=topk, num_nodes=n),
                                    DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_tree(ctx, inp, prop, static=False)


def draft_tree_static(ctx: Any, inp: Any, num_steps: int, draft_sampling: str) -> None:
    """Ask the drafter for the tokens of the state's compiled static tree (``inp.static_tree``:
    parents, depths and mask are constants of the state) and store them."""
    tree = inp.static_tree
    noise = inp.draft_noise if draft_sampling == "probabilistic" else None
    prop = ctx.drafter.propose_tree(inp.batch, TreeRequest(num_steps=num_steps, topk=tree.topk,
                                                            num_nodes=tree.num_nodes, static=tree),
                                    DraftSampling(mode=draft_sampling, exp_noise=noise))
    _store_tree(ctx, inp, prop, static=True)


def verify_tree(ctx: Any, inp: Any):
    """Target forward over every request's W tree nodes in one pass: node i at position
    ``root + depth(i)``, its KV at slot ``root + i``, attending to the cached prefix (slots before the
    root) and to its own ancestors (``inp.tree_mask``) through ``LlamaModel.forward``'s explicit
    mask ``[B, W, S]``; ragged on the CPU as :func:`verify_chain`. Returns ``(logits [B, W, V],
    hidden)``."""
    b, w = inp.input_ids.shape
    root = inp.positions[:, 0]  # [B] the root's position = its slot (trash rows: 0)
    # ragged (CPU eager): attend up to the highest root + W, known on the host (no read)
    span = ctx.max_seq_len if not inp.ragged else inp.max_root + w if b else w
    rel = torch.arange(span, device=root.device).view(1, 1, span) - root.view(b, 1, 1)  # [B, 1, S]
    inside = (rel >= 0) & (rel < w)
    tree = inp.tree_mask.gather(2, rel.clamp(0, w - 1).expand(b, w, span))  # [B, W, S]
    mask = (rel < 0) | (inside & tree)
    logits, hidden = ctx.target.forward(inp.input_ids, inp.positions, inp.cache_slots, mask,
                                        hidden_layers=ctx.hidden_layers,
                                        num_tokens=inp.num_tokens if inp.ragged else None)
    return logits, list(hidden)


def accept_tree_greedy(ctx: Any, inp: Any, logits: torch.Tensor, max_depth: int):
    """Greedy tree rule (``specc.kernels.tree_greedy_verify``): from the root, accept the child equal
    to the target argmax while one matches. A step with a sampled row (``inp.all_greedy`` False)
    verifies by tree rejection sampling instead (:func:`accept_tree_standard`, q = ``inp.draft_probs``
    or one-hot), exact at every row's temperature / top-k / top-p, so a greedy plan serves sampled
    requests as vLLM and SGLang choose the rule per request (SGLang's EAGLE verify: a batch whose
    ``sampling_info.is_all_greedy`` takes the greedy tree kernel, any other
    ``tree_speculative_sampling_target_only``).
    Returns the VerifyOutput."""
    if not inp.all_greedy:
        return accept_tree_standard(ctx, inp, logits, inp.draft_probs is not None, max_depth)
    fn = _kernel(ctx, inp, tree_greedy_verify)
    return fn(inp.draft_tokens, inp.parents, logits, inp.num_valid, max_depth, backend=ctx.kernel_backend)


def accept_tree_standard(ctx: Any, inp: Any, logits: torch.Tensor, probabilistic_q: bool, max_depth: int):
    """Tree rejection sampling (``specc.kernels.tree_rejection_verify``): multi-candidate recursive
    rejection over each node's children, q one-hot (greedy drafts) or ``inp.draft_probs``; an eager
    step whose rows are all greedy takes the greedy tree rule (the same result, as for chains).
    Returns the VerifyOutput."""
    if inp.all_greedy:
        return _kernel(ctx, inp, tree_greedy_verify)(inp.draft_tokens, inp.parents, logits, inp.num_valid, max_depth,
                                                     backend=ctx.kernel_backend)
    q = inp.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, inp, tree_rejection_verify)
    return fn(inp.draft_tokens, inp.parents, _target_probs(inp, logits), q, inp.uniforms, inp.exp_noise,
              inp.num_valid, backend=ctx.kernel_backend)


GREEDY_RULE_ACCEPTS = ("accept_greedy", "accept_tree_greedy")
"""Accept programs that run the greedy kernel only when every row of the step is greedy
(``inp.all_greedy``) and the standard rule otherwise; a captured or compiled state with one of them
is captured for its all-greedy steps and runs a step with sampled rows eagerly
(``specc.runtime.state.SpecRuntimeState.run``)."""


def commit_none(ctx: Any, inp: Any, result: Any, hidden: Any) -> None:
    """A chain: the accepted rows' KV already sits at their positions."""
    return None


def commit_tree(ctx: Any, inp: Any, result: Any, hidden: Any):
    """The KV-commit stage of a tree: the accepted path's nodes ``accept_index[b, j]`` (slot
    ``root + node``) hold the target KV of positions ``root + j``; copy each to slot ``root + j``
    (``LlamaModel.copy_kv``; nothing to copy where the path already is ``0, 1, 2, ...``). Then hand
    the drafter the path as chain-shaped rows (``inp.path``: input ids, positions, slots and hidden
    states along the path), so its own KV is refreshed over the accepted tokens by the extend stage.
    Returns that path."""
    res = result
    b, w = inp.input_ids.shape
    dev = inp.input_ids.device
    trash = ctx.trash_slot
    idx = res.accept_index  # [B, W] root, accepted nodes, -1
    acc = res.accepted_len.to(torch.int64)  # [B]
    col = torch.arange(w, device=dev).view(1, w)
    node = idx.clamp(min=0)
    root = inp.positions[:, 0].view(b, 1)
    live = (inp.num_tokens > 0).view(b, 1)
    on_path = (col <= acc.view(b, 1)) & live  # [B, W]
    moved = on_path & (node != col)
    # copied unconditionally (no host branch, no read): rows off the moved path copy trash to trash
    src = torch.where(moved, root + node, torch.full_like(node, trash))
    dst = torch.where(moved, root + col, torch.full_like(node, trash))
    ctx.target.copy_kv(src, dst)
    slots = torch.where(on_path, root + col, torch.full_like(node, trash))
    hidden = [h.gather(1, node.view(b, w, 1).expand(b, w, h.shape[-1])) for h in hidden]
    return (inp.input_ids.gather(1, node), root + col, slots, hidden)


def verify_chain(ctx: Any, inp: Any):
    """Target forward over the W = κ + 1 verify rows of every request; in eager CPU mode a ragged
    forward in which row b costs ``inp.num_tokens[b]`` tokens (``LlamaModel.forward(num_tokens=)``).

    Reads ``inp.input_ids/positions/cache_slots [B, W]``; returns ``(logits [B, W, V] fp32, hidden)``
    (a list of ``[B, W, H]`` at ``ctx.hidden_layers``).
    """
    logits, hidden = ctx.target.forward(inp.input_ids, inp.positions, inp.cache_slots, None,
                                        hidden_layers=ctx.hidden_layers,
                                        num_tokens=inp.num_tokens if inp.ragged else None)
    return logits, list(hidden)


def _kernel(ctx: Any, inp: Any, default: Callable) -> Callable:
    """The artifact's specialized kernel module of ``default``'s family (``FAMILY``, e.g.
    ``rejection_verify``) among the state's kernels (``inp.kernels``: role → module name; a state
    carries its own rule's kernel, ``verify``, and the other rule's at its width for the rows that
    differ: ``verify_sampled_rows`` on a greedy-rule state, ``verify_greedy_rows`` on a standard or
    block one), compiled for the state's width and the target's vocabulary. The generic ``default``
    runs only for a runtime built without an artifact's kernel modules (unit tests of the stages)."""
    if inp.kernels:
        family = default.__name__
        for name in inp.kernels.values():
            module = ctx.kernel_modules.get(name)
            if module is not None and getattr(module, "FAMILY", None) == family:
                return module.verify
    return default


def accept_greedy(ctx: Any, inp: Any, logits: torch.Tensor):
    """Greedy rule (``specc.kernels.greedy_verify``, or the artifact's variant): accept drafts equal
    to the target argmax. A step with a sampled row (``inp.all_greedy`` False) verifies by the
    standard rule instead (:func:`accept_standard`: rejection sampling with q = ``inp.draft_probs``,
    or one-hot q for greedy drafts, which is exact for any draft), so a greedy plan serves sampled
    requests exactly and its temperature-0 rows keep the greedy result; vLLM and SGLang choose the
    rule per request the same way (vllm/v1/sample/rejection_sampler.py ``rejection_sample``:
    ``all_greedy`` / ``is_greedy`` rows by argmax, the rest by rejection sampling). Returns the
    VerifyOutput."""
    if not inp.all_greedy:
        return accept_standard(ctx, inp, logits, inp.draft_probs is not None)
    fn = _kernel(ctx, inp, greedy_verify)
    return fn(inp.draft_tokens, logits, inp.num_valid, backend=ctx.kernel_backend)


def _target_probs(inp: Any, logits: torch.Tensor) -> torch.Tensor:
    """p = processed target logits ``[B, W, V]`` at each row's temperature / top-k / top-p."""
    return process_logits(logits, inp.temperature, inp.top_k if inp.use_top_k else None,
                          inp.top_p if inp.use_top_p else None)


def accept_standard(ctx: Any, inp: Any, logits: torch.Tensor, probabilistic_q: bool):
    """Standard rule (``specc.kernels.rejection_verify``, or the artifact's variant):
    p = processed target logits ``[B, W, V]``; q one-hot (greedy drafts) or ``inp.draft_probs``
    (probabilistic drafts). Temperature-0 rows reduce to greedy exactly (``process_logits`` gives
    them a one-hot p), so an eager step whose rows are all greedy (``inp.all_greedy``) takes
    ``greedy_verify`` directly and skips the softmax over the vocabulary. Returns the VerifyOutput."""
    if inp.all_greedy:  # eager step with only temperature-0 rows: the standard rule is the greedy rule
        return _kernel(ctx, inp, greedy_verify)(inp.draft_tokens, logits, inp.num_valid, backend=ctx.kernel_backend)
    q = inp.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, inp, rejection_verify)
    return fn(inp.draft_tokens, _target_probs(inp, logits), q, inp.uniforms, inp.exp_noise, inp.num_valid,
              backend=ctx.kernel_backend)


def accept_block(ctx: Any, inp: Any, logits: torch.Tensor, probabilistic_q: bool):
    """Block verification (``specc.kernels.block_verify``, or the artifact's variant; Sun et al. 2024):
    p = processed target logits ``[B, W, V]``, q one-hot or ``inp.draft_probs``; accepts the longest
    prefix whose joint test passes. Temperature-0 rows reduce to greedy exactly, so an eager step whose
    rows are all greedy takes ``greedy_verify``. Returns the VerifyOutput."""
    if inp.all_greedy:
        return _kernel(ctx, inp, greedy_verify)(inp.draft_tokens, logits, inp.num_valid, backend=ctx.kernel_backend)
    q = inp.draft_probs if probabilistic_q else None
    fn = _kernel(ctx, inp, block_verify)
    return fn(inp.draft_tokens, _target_probs(inp, logits), q, inp.uniforms, inp.exp_noise, inp.num_valid,
              backend=ctx.kernel_backend)


def accept_synthetic(ctx: Any, inp: Any, logits: torch.Tensor, conditional_rates: Sequence[float]):
    """Synthetic rule (``specc.kernels.synthetic_verify``): draft i accepted with the conditional rate
    c_i whatever the tokens (its draft program verifies every position, ``draft_chain(...,
    every_position=True)``, so a lookup miss does not cut the curve short). An ablation harness: the
    output is not the target's distribution. Returns the VerifyOutput."""
    k = inp.draft_tokens.shape[1]
    return synthetic_verify(inp.draft_tokens, _target_probs(inp, logits), conditional_rates[:k], inp.uniforms,
                            inp.exp_noise, inp.num_valid)


def extend_none(ctx: Any, inp: Any, out: Any, batch_view: Any) -> None:
    """No drafter to extend."""


def extend_drafter(ctx: Any, inp: Any, out: Any, batch_view: Any) -> None:
    """Hand the verify outcome (``out``: :class:`specc.runtime.state.StepOutputs`) to the drafter
    (EAGLE refreshes its KV over accepted tokens here; the n-gram drafter learns its acceptance
    estimate), with ``batch_view`` the rows after this step's tokens were appended. Runs at κ = 0 too."""
    res = out.result
    if out.path is not None:  # a tree: the accepted path, as chain rows (commit_tree)
        ids, positions, slots, hidden = out.path
        accept_index = res.accept_index
    else:
        ids, positions, slots, hidden, accept_index = inp.input_ids, inp.positions, inp.cache_slots, out.hidden, None
    ctx.drafter.commit(batch_view, VerifyStep(
        input_ids=ids, positions=positions, cache_slots=slots,
        accepted=res.accepted_len.to(torch.int64), bonus=res.bonus, target_hidden=hidden,
        num_valid=inp.num_valid, num_steps=inp.draft_tokens.shape[1], accept_index=accept_index,
        host=out.host))
