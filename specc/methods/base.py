"""The drafter protocol: what the runtime asks of every draft method.

A drafter proposes up to κ tokens per request each decode step; the runtime verifies them with the
target and tells the drafter what was accepted. Every cache a drafter keeps is written **by position**
(gpt-fast's ``KVCache``, pytorch-labs/gpt-fast model.py): a rejected draft's entries are simply overwritten by a later
step and hidden by the causal-by-position mask, so there is never an explicit rollback.

Call order, per batch of rows (one row = one request; rows are the runtime's batch slots, fixed for
a request's lifetime, and are also the rows of every KV cache):

1. ``setup(max_batch_size, max_seq_len, device)`` once, at load.
2. ``prefill(batch, chunk)`` once per newly admitted set of rows, *after* the target's prefill and
   after the first generated token was sampled (so ``batch.tokens`` already holds it: EAGLE needs the
   token at position i+1 next to the target hidden state at position i).
3. Per decode step: ``propose(batch, num_steps, sampling)`` -> :class:`Proposal` (a chain), or
   ``propose_tree(batch, tree, sampling)`` -> a tree-shaped :class:`Proposal` (tokens, parents, depths)
   for tree states (``supports_tree``); the target verifies; ``commit(batch, step)`` with the verify
   forward's hidden states and the accepted lengths. For a tree the runtime first moves the accepted
   path's target KV into place (the KV-commit stage) and hands ``commit`` the path as a chain
   (``VerifyStep.accept_index`` says which tree nodes it came from).
4. ``release(row)`` when a row's request leaves the batch (optional; default nothing).

Conventions shared by all methods:

- ``batch.tokens[b, :batch.seq_lens[b]]`` is row b's token history: prompt, then generated tokens.
  The last one (position ``seq_lens[b] - 1``) is the *pending* token: emitted, but its KV is not yet
  in the target cache; the next verify forward starts with it.
- ``max_seq_len`` passed to ``setup`` includes slack for κ + 1 verify rows past ``max_model_len``;
  slot ``max_seq_len - 1`` is the **trash slot**: padding rows/columns write their KV there and no
  real query ever sees it (every real position is smaller).
- Inactive rows (``batch.active[b] == False``) are padding: whatever a drafter proposes for them is
  ignored, and their cache writes must go to the trash slot or to positions nobody reads.
- Tensors are on the runtime's device; token ids are int64, probabilities fp32.

Methods: ``ngram`` (specc.methods.ngram.drafter), ``suffix`` (specc.methods.suffix.drafter: suffix trees, chains or
trees, ``release`` moving a finished request's output into its global tree), ``draft_model`` (specc.methods.draft_model.drafter; PARD in its
parallel mode), the block drafters ``dflash`` / ``dspark`` (specc.methods.dflash.drafter: ``propose_block``,
context K/V written in ``commit``), and the EAGLE family (P-EAGLE in its parallel mode), which implements this same class in ``specc.methods.eagle.drafter``: it sets
``hidden_layers`` to the target layers it fuses, keeps its own KV cache written by position, runs its
layer over the accepted tokens in ``commit`` (``step.target_hidden`` holds the target's hidden states
for all κ + 1 verify rows; rows past ``step.accepted[b]`` are rejected and must be ignored or
overwritten later), and proposes from the last accepted row's output. MTP (``specc.methods.mtp.drafter``) runs
one DeepSeek-style MTP layer on the same machinery; multi-layer EAGLE
(``specc.methods.multi_layer_eagle.drafter``) one module per draft step; frozen-KV MTP
(``specc.methods.frozen_kv_mtp.drafter``) keeps no KV at all and attends over the target's cache.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch


@dataclass
class BatchView:
    """The runtime's per-row decode state, shared read-only with drafters.

    Attributes:
        tokens: ``[B, S]`` int64, each row's history (prompt + generated); entries at or past
            ``seq_lens[b]`` are garbage.
        seq_lens: ``[B]`` int64, history length including the pending token (its position is
            ``seq_lens - 1``).
        active: ``[B]`` bool, rows holding a live request.
        prompt_lens: ``[B]`` int64, prompt length of each row's request.
        max_draft: ``[B]`` int64, the most draft tokens row b may use this step (clipped so the
            request cannot pass ``max_new_tokens`` or ``max_model_len``); the runtime applies it
            after ``propose`` as well, so a drafter may ignore it (it is there to save work).
        temperature, top_p: ``[B]`` fp32; top_k: ``[B]`` int64 (0 = off). Per-request sampling
            parameters, for probabilistic drafts (temperature 0 = greedy).
            trash_slot: the cache slot padding writes go to (``max_seq_len - 1``).
        host: the same rows' integers already on the host (:class:`HostBatch`), set by the runtime's
            decode step (None elsewhere, e.g. a drafter driven directly): lookup drafters read their
            histories from it instead of reading the device tensors above.
    """

    tokens: torch.Tensor
    seq_lens: torch.Tensor
    active: torch.Tensor
    prompt_lens: torch.Tensor
    max_draft: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    trash_slot: int
    host: Optional["HostBatch"] = None

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class HostBatch:
    """The host copy of a :class:`BatchView`'s integers, kept by the runtime as it writes them (no
    device read): ``tokens`` ``[B, S]`` int64 numpy array (each row's history; entries at or past
    ``seq_lens[b]`` are garbage), and per-row Python lists ``seq_lens``, ``active``, ``prompt_lens``,
    ``max_draft`` (the same values as the view's tensors)."""

    tokens: Any
    seq_lens: List[int]
    active: List[bool]
    prompt_lens: List[int]
    max_draft: List[int]


@dataclass
class HostVerify:
    """The host copy of a :class:`VerifyStep`'s integers, from the decode step's one device-to-host
    read of its results: per-row lists ``accepted`` and ``num_valid``, and for a tree ``accept_index``
    (``[B][W]``, -1 past ``accepted``; None for a chain); ``roots``: each row's pending-token position
    this step (``positions[b, 0]``: its sequence length before the step minus 1, 0 for rows without a
    live request), from the host's sequence lengths."""

    accepted: List[int]
    num_valid: List[int]
    accept_index: Optional[List[List[int]]] = None
    roots: Optional[List[int]] = None


@dataclass
class PrefillChunk:
    """What the target saw at prefill, handed to the drafter (padding columns go to the trash slot).

    Attributes:
        input_ids: ``[B, N]`` int64, prompt tokens (padding: any id).
        positions: ``[B, N]`` int64, absolute positions (row b's prompt is positions
            ``0 .. prompt_lens[b]-1``).
        cache_slots: ``[B, N]`` int64, KV slot of each column (``= positions`` for real columns,
            the trash slot for padding columns and for rows not being prefilled).
        rows: ``[B]`` bool, rows prefilled by this call (others: leave their state untouched).
        target_hidden: list of ``[B, N, H]`` fp32, the target's hidden states at the drafter's
            ``hidden_layers`` (empty when it asked for none).
        row_index: ``[B]`` int64 or None. None: chunk row b is batch row b. Set only for drafters
            whose ``prefill_row_index`` is True: the chunk then holds just the new requests, chunk row
            i being batch (and cache) row ``row_index[i]`` (``rows`` is then all True).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cache_slots: torch.Tensor
    rows: torch.Tensor
    target_hidden: List[torch.Tensor]
    row_index: Optional[torch.Tensor] = None


@dataclass
class DraftSampling:
    """How drafts are drawn. ``greedy``: argmax, ``Proposal.probs`` is None (the verifier uses a
    one-hot q). ``probabilistic``: tokens sampled from the processed draft distribution q (same
    temperature/top-k/top-p as the target, ``specc.kernels.process_logits`` with ``batch``'s
    rows), returned in ``Proposal.probs``.

    Attributes:
        mode: ``"greedy"`` or ``"probabilistic"``.
        exp_noise: ``[B, K, V]`` fp32 i.i.d. Exp(1) (> 0) for probabilistic drafts, drawn by the
            runtime from each request's generator; draft i of row b is
            ``argmax_v q_i[b, v] / exp_noise[b, i, v]`` (exponential race = a draw from q_i; it never
            picks a token with q = 0). None for greedy drafts. A drafter with a reduced vocabulary
            uses the first V_draft columns.
    """

    mode: str = "greedy"
    exp_noise: Optional[torch.Tensor] = None


@dataclass
class Proposal:
    """Draft tokens for one step: a chain of K = κ tokens, or a tree of N = W - 1 nodes.

    Attributes:
        tokens: ``[B, K]`` int64, K = num_steps (κ); entries past ``num_valid[b]`` are ignored. A
            tree: ``[B, N]``, draft node j + 1 of the tree (node 0 is the root, the pending token).
        num_valid: ``[B]`` int64 in ``[0, K]``, draft tokens row b really proposes (n-gram lookup may
            find fewer than κ, or none). A tree: a prefix of the nodes (itself a tree).
        probs: ``[B, K, V]`` fp32 processed draft distribution q for probabilistic drafts, else None.
            A tree: ``[B, N, V]``, row n = the q node n's children were drawn from (without
            replacement, in node order; ``specc.kernels.tree_rejection_verify``); rows of leaves are
            unused.
        confidence: ``[B, K]`` fp32 in [0, 1], the drafter's estimate that draft i is accepted given
            that drafts ``0..i-1`` were (the ``budget`` schedule's survival probability is their running
            product; vLLM vllm/v1/worker/gpu/spec_decode/adaptive_verification.py:55-64). It must not depend on the
            token drafted at i itself (for model drafters: the top probability of the draft
            distribution at i, not the probability of a sampled token), so verifying a prefix chosen
            from it keeps rejection sampling exact. None: no estimate (the schedule then treats every
            position as certain). A tree: ``[B, N]``, each node's path probability under the
            drafter (the runtime turns it into per-node factors for the budget).
        parents: None for a chain; a tree: ``[B, N]`` int64, the parent node (0..j) of node j + 1
            (nodes in a topological order: every prefix of the nodes is a tree).
        depths: None for a chain; a tree: ``[B, N]`` int64 in [1, κ], each node's depth (its
            position is the root's position + depth).
    """

    tokens: torch.Tensor
    num_valid: torch.Tensor
    probs: Optional[torch.Tensor] = None
    confidence: Optional[torch.Tensor] = None
    parents: Optional[torch.Tensor] = None
    depths: Optional[torch.Tensor] = None


@dataclass
class StaticTree:
    """A static draft tree (``method.tree_choices``) as device tensors, compiled once per state
    (:func:`specc.compiler.trees.compile_tree`; W = N + 1 nodes, root = 0).

    Attributes:
        parents: ``[N]`` int64, parent node of node j + 1. depths: ``[W]`` int64 (root 0).
        ranks: ``[N]`` int64, the child rank that picks node j + 1's token among its parent's ranked
            candidates (greedy: the parent's top-k; probabilistic: its draws without replacement).
        expand: per depth d < κ, ``[F_d]`` int64, the nodes at depth d with children (depth 0: the root).
        mask: ``[W, W]`` bool, node i sees node j iff j is i or an ancestor.
        topk: candidates a parent needs (largest rank + 1).
        host_parents, host_depths: the same ``parents`` / ``depths`` as Python lists (the compiled
            tree's own lists; None when built from tensors): drafters read them, not the device.
    """

    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    expand: Tuple[torch.Tensor, ...]
    mask: torch.Tensor
    topk: int
    host_parents: Optional[List[int]] = None
    host_depths: Optional[List[int]] = None

    @property
    def max_depth(self) -> int:
        """The deepest node's depth (κ of the tree), from the host lists when present."""
        return max(self.host_depths) if self.host_depths is not None else int(self.depths.max())

    @property
    def num_nodes(self) -> int:
        """N, draft nodes (the root excluded)."""
        return int(self.parents.shape[0])

    @classmethod
    def from_buffers(cls, tree: dict, device) -> "StaticTree":
        """From :func:`specc.compiler.trees.compile_tree`'s plain lists (a generated module's ``TREE``)."""
        i64 = dict(dtype=torch.int64, device=device)
        return cls(parents=torch.tensor(tree["parents"], **i64), depths=torch.tensor(tree["depths"], **i64),
                   ranks=torch.tensor(tree["ranks"], **i64),
                   expand=tuple(torch.tensor(e, **i64) for e in tree["expand"]),
                   mask=torch.tensor(tree["attn_mask"], dtype=torch.bool, device=device), topk=int(tree["topk"]),
                   host_parents=[int(p) for p in tree["parents"]], host_depths=[int(d) for d in tree["depths"]])


@dataclass
class TreeRequest:
    """The tree a tree state asks its drafter for.

    Attributes:
        num_steps: κ, the deepest level. topk: branching factor of a dynamic tree (SGLang's
            ``speculative_eagle_topk``). num_nodes: N = num_draft_tokens - 1 nodes to return.
        static: the compiled static tree, or None for a dynamic (EAGLE-2 style) tree.
    """

    num_steps: int
    topk: int
    num_nodes: int
    static: Optional[StaticTree] = None


@dataclass
class VerifyStep:
    """The outcome of one verify + accept, handed to ``commit``.

    Attributes:
        input_ids: ``[B, K+1]`` int64, the verify input (pending token, then the drafts).
        positions: ``[B, K+1]`` int64, their positions.
        cache_slots: ``[B, K+1]`` int64 (trash slot for padding rows).
        accepted: ``[B]`` int64, accepted draft tokens per row (0..num_valid); rows
            ``0 .. accepted[b]`` of this step's input are now committed history, and the bonus token
            (``bonus[b]``) is the new pending token at position ``positions[b, 0] + accepted[b] + 1``.
        bonus: ``[B]`` int64.
        target_hidden: list of ``[B, K+1, H]`` fp32 at the drafter's ``hidden_layers``.
        num_valid: ``[B]`` int64, drafts verified per row this step (0 at κ = 0 and for rows whose
            drafts were all trimmed); None when unknown.
        num_steps: κ of the state that ran this step (0: nothing was proposed; the drafter's
            ``propose`` was not called).
        accept_index: None for a chain; after a tree step ``[B, W]`` int64, the tree nodes the
            (chain-shaped) rows of this step came from (root first, -1 past ``accepted``): the
            fields above then hold the accepted path, not the tree.
        host: the integers above already read on the host by the decode step (:class:`HostVerify`),
            None when the caller did not read them (drafters then read the tensors).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cache_slots: torch.Tensor
    accepted: torch.Tensor
    bonus: torch.Tensor
    target_hidden: List[torch.Tensor]
    num_valid: Optional[torch.Tensor] = None
    num_steps: int = 0
    accept_index: Optional[torch.Tensor] = None
    host: Optional[HostVerify] = None


class Drafter(abc.ABC):
    """Base class of every draft method. Subclasses set ``name`` and override the abstract methods.

    Class attributes:
        name: the plan's ``method.name`` this drafter implements.
        hidden_layers: target layer indices whose hidden states the drafter needs (``()`` for ngram
            and draft_model; EAGLE: e.g. the last layer; EAGLE-3: low/mid/high layers). The runtime
            asks the target for exactly these in prefill and verify forwards.
        supports_probabilistic: whether ``propose`` can return a draft distribution q.
        capturable: whether ``propose``/``commit`` run on device tensors only with static shapes
            (no host syncs), so the runtime may capture them as CUDA graphs.
        prefill_row_index: whether ``prefill`` takes a compact chunk of the new requests only
            (``PrefillChunk.row_index``); otherwise it gets rows ``0..n-1`` with ``rows`` marking the new.
        supports_tree: whether ``propose_tree`` grows draft trees (dynamic and/or static).
        forward_passes: a running count of the draft model's forward passes (instance attribute once
            counted; each drafter adds one per pass over a batch, in every stage).
    """

    name: str = "drafter"
    hidden_layers: Tuple[int, ...] = ()
    supports_probabilistic: bool = False
    capturable: bool = False
    prefill_row_index: bool = False
    supports_tree: bool = False
    #: draft-model forward passes run so far (a pass over every row of a batch counts once); the runtime
    #: reads its change across the draft and the extend stages (``SpecMetrics.num_draft_passes``,
    #: ``num_draft_extend_passes``), which ``specc explain`` predicts from the method table
    forward_passes: int = 0

    def draft_kv_bytes(self) -> int:
        """Bytes of KV cache the drafter allocated in :meth:`setup` (reported at load). Default 0."""
        return 0

    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        """Allocate caches for ``max_batch_size`` rows of ``max_seq_len`` slots (trash slot
        included) on ``device``. Default: nothing to allocate."""

    @abc.abstractmethod
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Absorb the prompts of the rows in ``chunk.rows`` (write their draft KV, by position)."""

    @abc.abstractmethod
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """Propose ``num_steps`` (κ ≥ 1) tokens per row continuing each row's history.

        Returns: :class:`Proposal` with ``tokens [B, κ]``; ``probs [B, κ, V]`` only for
        ``sampling.mode == "probabilistic"``. Must not change the target's state.
        """

    def propose_tree(self, batch: BatchView, tree: TreeRequest, sampling: DraftSampling) -> Proposal:
        """Propose a draft tree of ``tree.num_nodes`` nodes per row (``supports_tree`` drafters).

        Returns: :class:`Proposal` with ``tokens``, ``parents``, ``depths``, ``confidence`` ``[B, N]``
        and, for probabilistic drafts, ``probs [B, N, V]``; ``sampling.exp_noise`` is then
        ``[B, N, V]``, row n for drawing node n's children. A static tree's parents/depths are
        ``tree.static``'s. Must not change the target's state. Default: NotImplementedError.
        """
        raise NotImplementedError(f"{type(self).__name__} does not draft trees")

    def propose_block(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """Propose the whole block of ``num_steps`` (κ ≥ 1) tokens per row in **one** draft pass (a
        parallel state's draft program, ``specc.runtime.stages.draft_parallel``): DFlash/DSpark's
        non-causal pass over [bonus, MASK × κ], PARD's and P-EAGLE's pass over mask tokens for the
        positions the draft has not seen. Same return value as :meth:`propose`. Default: the drafter
        has no parallel mode (the method table does not list ``parallel`` for it).

        Raises: NotImplementedError.
        """
        raise NotImplementedError(f"drafter {self.name!r} has no parallel (one-pass block) mode")

    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Update the drafter after verification (the *extend* stage): EAGLE refreshes its KV over
        the accepted tokens here. Called after every decode step, κ = 0 steps included (then
        ``step.num_steps == 0`` and ``propose`` was not called), so a schedule may switch κ between
        any two steps. ``batch`` already reflects the new history. Default: nothing."""

    def release(self, row: int) -> None:
        """Row ``row``'s request left the batch (finished, cancelled or failed); its row may take a new
        request (whose ``prefill`` follows). Suffix decoding moves the request's output into its global
        tree here. Default: nothing."""

    @classmethod
    def from_spec(cls, spec, target, tokenizer, device, max_seq_len) -> "Drafter":
        """Build the drafter from an artifact's runtime section ``spec`` (``manifest.json`` ``runtime``:
        ``method``, ``draft``) over the loaded ``target`` and ``tokenizer``, for caches of
        ``max_seq_len`` slots on ``device``. How ``method.name: custom`` plugins are built
        (:func:`specc.methods.build_plugin_drafter`). Default: ``cls()``."""
        return cls()


def check_same_vocab(draft_vocab_size: int, target_vocab_size: int, what: str) -> None:
    """Raise CheckpointError unless the draft and target vocabularies have the same size."""
    from specc.errors import CheckpointError

    if int(draft_vocab_size) != int(target_vocab_size):
        raise CheckpointError(
            f"{what}: the draft vocabulary has {draft_vocab_size} tokens but the target's has "
            f"{target_vocab_size}; draft_model speculation needs the same tokenizer. Point "
            f"draft.path at a drafter built for this target (e.g. `python -m specc.methods.draft_model.shallow`).")


def clip_num_valid(proposal_valid: torch.Tensor, max_draft: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Per-row valid draft length: ``min(proposal_valid, max_draft)``, 0 for inactive rows.

    Args: proposal_valid, max_draft: ``[B]`` int64; active: ``[B]`` bool. Returns ``[B]`` int64.
    """
    return torch.where(active, torch.minimum(proposal_valid, max_draft), torch.zeros_like(max_draft))


__all__: Sequence[str] = (
    "BatchView", "PrefillChunk", "DraftSampling", "Proposal", "StaticTree", "TreeRequest", "VerifyStep", "Drafter",
    "check_same_vocab", "clip_num_valid",
)


def host_batch(batch: BatchView) -> HostBatch:
    """``batch.host`` when the decode step attached it (no device read), else a host copy read from
    the view's tensors (a drafter driven directly: five device reads)."""
    if batch.host is not None:
        return batch.host
    return HostBatch(tokens=batch.tokens.cpu().numpy(), seq_lens=batch.seq_lens.tolist(),
                     active=batch.active.tolist(), prompt_lens=batch.prompt_lens.tolist(),
                     max_draft=batch.max_draft.tolist())


def host_verify(step: VerifyStep) -> HostVerify:
    """``step.host`` when the decode step attached it (no device read), else a host copy read from
    the step's tensors (``num_valid`` must be set)."""
    if step.host is not None:
        return step.host
    return HostVerify(accepted=step.accepted.tolist(), num_valid=step.num_valid.tolist(),
                      accept_index=step.accept_index.tolist() if step.accept_index is not None else None)
