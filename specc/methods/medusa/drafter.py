"""Medusa heads behind the runtime's drafter protocol: one pass of the heads over the target's final-norm
hidden state at the last committed position proposes the next κ tokens (a chain: each head's top
token; ``method.parallel_drafting`` is implied, one draft pass) or a static tree
(``method.tree_choices``: node ``[.., r]`` at depth d takes head d-1's rank-r candidate; Medusa's
``generate_candidates``, FasterDecoding/Medusa medusa/model/utils.py).

State per row: ``h_last [B, H]``, the target's final-norm hidden state at the position whose logits
gave the pending token (prefill: the prompt's last position; after a step: the last accepted node,
whose logits gave the bonus). Head k then predicts the token ``k + 1`` positions after the pending
token. The heads keep no KV cache, so the extend stage only reads that hidden state.

Probabilistic drafts: head d-1's processed distribution q (the target's temperature / top-k /
top-p) is the q of every node at depth d - 1; a node's children are its first draws without
replacement (``argmax q / Exp(1)`` ranked with the node's own noise row), so tree rejection sampling
stays exact (``specc.kernels.tree_rejection_verify``).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, TreeRequest, VerifyStep
from specc.errors import CheckpointError, PlanError
from specc.methods.medusa.model import MedusaModel


class MedusaDrafter(Drafter):
    """``method.name: medusa`` with loaded :class:`MedusaModel` heads.

    Args:
        model: the heads (bound to the target's LM head when they share it).
        target_num_layers: the target's decoder layer count; target_norm: its final RMSNorm (the
            heads read the final-norm output: the runtime returns the last layer's output, which this
            drafter normalizes, as the EAGLE drafter does).
    """

    name = "medusa"
    supports_probabilistic = True
    supports_tree = True
    capturable = False

    def __init__(self, model: MedusaModel, target_num_layers: int, target_norm) -> None:
        self.model = model.eval()
        self.hidden_layers = (int(target_num_layers) - 1,)
        self._norm = target_norm
        self.h_last: Optional[torch.Tensor] = None
        self.forward_passes = 0

    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        self.model.to(device)
        self.h_last = torch.zeros(max_batch_size, self.model.cfg.hidden_size, device=device)

    def _check_depth(self, num_steps: int) -> None:
        if num_steps > self.model.cfg.num_heads:
            raise PlanError(f"method.num_steps={num_steps}: these Medusa heads draft at most "
                            f"{self.model.cfg.num_heads} tokens (one per head); lower num_steps or the tree's depth")

    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Keep each new row's final-norm hidden state at its prompt's last position."""
        b = chunk.input_ids.shape[0]
        last = (batch.prompt_lens[:b] - 1).clamp(0, chunk.input_ids.shape[1] - 1)  # [B] (rows not prefilled may point past)
        h = chunk.target_hidden[0][torch.arange(b, device=last.device), last]  # [B, H]
        self.h_last[:b] = torch.where(chunk.rows.view(b, 1), self._norm(h).float(), self.h_last[:b])

    @torch.inference_mode()
    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Keep the final-norm hidden state of the last accepted row (whose logits gave the bonus)."""
        b = step.input_ids.shape[0]
        acc = step.accepted.to(torch.int64).clamp(max=step.target_hidden[0].shape[1] - 1)
        h = step.target_hidden[0][torch.arange(b, device=acc.device), acc]  # [B, H]
        active = batch.active[:b].view(b, 1)
        self.h_last[:b] = torch.where(active, self._norm(h).float(), self.h_last[:b])

    def _distributions(self, batch: BatchView, depth: int, sampling: DraftSampling):
        """Head logits ``[B, depth, V]`` and, for probabilistic drafts, the processed q."""
        from specc.kernels import process_logits

        b = batch.batch_size
        logits = self.model.logits(self.h_last[:b], depth)  # [B, depth, V]: one pass of the heads
        self.forward_passes += 1
        if sampling.mode != "probabilistic":
            return logits, None
        q = process_logits(logits, batch.temperature[:b], batch.top_k[:b], batch.top_p[:b])  # [B, depth, V]
        return logits, q

    @torch.inference_mode()
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """κ = ``num_steps`` tokens, one per head: ``tokens [B, κ]``; ``probs [B, κ, V]`` (head i's q)
        for probabilistic drafts (draft i drawn by the exponential race with ``exp_noise[:, i]``);
        confidence = each head's top probability."""
        self._check_depth(num_steps)
        b = batch.batch_size
        logits, q = self._distributions(batch, num_steps, sampling)
        conf = torch.softmax(logits, dim=-1).amax(dim=-1)  # [B, κ]
        if q is None:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = torch.div(q, sampling.exp_noise[:b, :num_steps]).argmax(dim=-1)
        return Proposal(tokens=tokens, num_valid=torch.full((b,), num_steps, dtype=torch.int64, device=tokens.device),
                        probs=q, confidence=conf)

    def propose_block(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """Medusa always drafts in one pass (its heads read one hidden state): the same as :meth:`propose`."""
        return self.propose(batch, num_steps, sampling)

    @torch.inference_mode()
    def propose_tree(self, batch: BatchView, tree: TreeRequest, sampling: DraftSampling) -> Proposal:
        """The static tree's tokens: node ``[.., r]`` at depth d = head d-1's rank-r candidate (greedy:
        top-k; probabilistic: the parent's draws without replacement). ``probs [B, N, V]``: row n = q
        of head depth(n) (the distribution node n's children come from). Raises ValueError for a
        dynamic tree (Medusa's trees are static)."""
        st = tree.static
        if st is None:
            raise ValueError("Medusa heads draft static trees (method.tree_choices), not dynamic ones")
        b = batch.batch_size
        n = st.num_nodes
        depth_max = st.max_depth  # host list of the compiled tree: no device read
        self._check_depth(depth_max)
        logits, q = self._distributions(batch, depth_max, sampling)
        dev = logits.device
        prob = torch.softmax(logits, dim=-1)  # [B, D, V]
        parent_of = st.parents  # [N] parent of node j + 1
        depth_of = st.depths[1:]  # [N]
        if q is None:
            ranked = logits.topk(st.topk, dim=-1).indices  # [B, D, topk]
            tokens = ranked[:, depth_of - 1, st.ranks]  # [B, N]
            probs = None
        else:
            noise = sampling.exp_noise[:b, :n]  # [B, N, V] row = parent node
            pdepth = st.depths[parent_of]  # depth of each node's parent = head depth_of - 1
            keys = torch.div(q[:, pdepth], noise[:, parent_of])  # [B, N, V] the parent's race over its head's q
            draws = keys.topk(st.topk, dim=-1).indices  # [B, N, topk]
            tokens = draws.gather(2, st.ranks.view(1, n, 1).expand(b, n, 1)).squeeze(-1)  # [B, N]
            node_depth = st.depths[:n]  # nodes 0..N-1 as parents: their children come from head node_depth
            probs = q[:, node_depth.clamp(max=depth_max - 1)]  # [B, N, V]
        # path probability of each node: product of its ancestors' head probabilities of their tokens
        tok_p = prob[:, depth_of - 1].gather(2, tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
        path = torch.ones(b, n + 1, device=dev)
        host_parents = st.host_parents if st.host_parents is not None else parent_of.tolist()
        for j in range(n):  # parents precede children
            path[:, j + 1] = path[:, host_parents[j]] * tok_p[:, j]
        return Proposal(tokens=tokens, num_valid=torch.full((b,), n, dtype=torch.int64, device=dev), probs=probs,
                        confidence=path[:, 1:], parents=parent_of.expand(b, n), depths=depth_of.expand(b, n))


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> MedusaDrafter:
    """Runtime factory of method ``medusa`` (``specc.methods``): loads ``draft.path`` (``pkg://``
    allowed) as Medusa heads (:func:`specc.methods.medusa.model.load_medusa_heads`) bound to ``target``'s LM
    head. Raises ``PlanError`` without ``draft.path`` or when the plan drafts deeper than the heads;
    ``CheckpointError`` for heads that do not fit the target."""
    from specc.methods.medusa.model import load_medusa_heads
    from specc.models.resolve import resolve_model_path

    draft = spec.get("draft") or {}
    if not draft.get("path"):
        raise PlanError("method.name=medusa needs draft.path (e.g. the draft preset smollm2_135m_medusa)")
    path = resolve_model_path(draft["path"])
    if not path.is_dir():
        raise CheckpointError(f"{draft['path']}: Medusa heads are a directory (config.json + weights), got {path}")
    model = load_medusa_heads(path, target.config, target.lm_head)
    steps = (spec.get("method") or {}).get("num_steps")
    if isinstance(steps, int) and steps > model.cfg.num_heads:
        raise PlanError(f"method.num_steps={steps}: {draft['path']} has {model.cfg.num_heads} Medusa heads, so it "
                        f"drafts at most {model.cfg.num_heads} levels; lower num_steps or the tree's depth")
    model.to(device)
    return MedusaDrafter(model, target.config.num_layers, target.norm)
