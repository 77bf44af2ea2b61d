"""DFlash / DSpark block drafting behind the runtime's drafter protocol (one draft pass per step).

Per decode step (z-lab's ``dflash_generate``; SGLang's DFlash/DSpark workers):

* ``propose_block``: one non-causal pass over ``[pending token, MASK × κ]`` at positions
  ``s .. s + κ`` (``s`` = the pending token's position) attending to the committed context
  (positions ``< s``) in the drafter's own cache; the outputs at block positions ``1..κ`` go through
  the target's LM head. DSpark then walks the block left to right adding its Markov head's bias from
  the token chosen at the previous position (no further transformer pass) and scores each position
  with its confidence head. A draft is the argmax (greedy) or a draw from q = the processed
  distribution of the (corrected) logits at the request's temperature / top-k / top-p (the
  distribution it was drawn from, for standard and block verification).
* ``commit`` (the *extend* stage): the verify forward's target hidden states of the committed rows
  (the pending token and the accepted drafts) become context K/V at their positions; rejected rows
  are never written (roll back by position). At κ = 0 steps the one committed row is written too.

Disaggregation (``specc.runtime.disagg``, seed kind ``target_hidden``): the prefill instance ships the
target's hidden states at ``target_layer_ids`` over the prompt and the decode instance runs this
drafter's prefill on them, writing the same context K/V (SGLang ships the draft KV pool itself,
prefill.py:301-317; the hidden states are larger but need no drafter-specific
export).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep
from specc.errors import CheckpointError, PlanError
from specc.methods.dflash.model import BlockDraftCache, BlockDraftModel, markov_walk


class BlockDrafter(Drafter):
    """``method.name: dflash`` / ``dspark`` over a loaded :class:`BlockDraftModel`.

    Args:
        model: the draft (weights loaded, bound to the target's embedding and LM head).
        use_markov: apply DSpark's Markov head (False: the backbone's base logits alone, the
            "without the Markov head" ablation). Ignored for a draft without one.
        use_confidence_head: report the confidence head's estimate as ``Proposal.confidence`` (False,
            or a draft without one: the top probability of each position's distribution).
    """

    supports_probabilistic = True
    capturable = False
    prefill_row_index = True

    def __init__(self, model: BlockDraftModel, use_markov: bool = True, use_confidence_head: bool = True):
        self.model = model.prepare_inference()
        self.name = model.cfg.kind
        self.hidden_layers = tuple(int(i) for i in model.cfg.target_layer_ids)
        self.use_markov = bool(use_markov) and model.markov is not None
        self.use_confidence_head = bool(use_confidence_head) and model.confidence is not None
        self.cache: Optional[BlockDraftCache] = None
        self.last_base_logits: Optional[torch.Tensor] = None  # [B, κ, V] of the last block (tests, benchmarks)
        self.forward_passes = 0

    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        """Allocate the context cache (per layer ``[B, kv, max_seq_len, d]``)."""
        self.model.to(device)
        self.cache = self.model.new_cache(max_batch_size, max_seq_len, device=device)

    def draft_kv_bytes(self) -> int:
        """Bytes of the context KV cache (every layer, K and V)."""
        return 0 if self.cache is None else sum(t.nbytes for t in self.cache.k + self.cache.v)

    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Context K/V of the new rows' prompts (``chunk.target_hidden`` at ``hidden_layers``), at their
        positions; padding columns write the trash slot."""
        B, N = chunk.input_ids.shape
        slots = torch.where(chunk.rows.view(B, 1), chunk.cache_slots, torch.full_like(chunk.cache_slots, batch.trash_slot))
        ctx = self.model.context(chunk.target_hidden)  # [B, N, H]
        self.model.write_context(self.cache, ctx, chunk.positions.clamp(max=batch.trash_slot), slots, rows=chunk.row_index)

    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """A block drafter has no chain mode: the one pass is :meth:`propose_block`."""
        return self.propose_block(batch, num_steps, sampling)

    @torch.inference_mode()
    def propose_block(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """The block of κ = ``num_steps`` drafts per row in one pass (see the module docstring).

        Returns ``tokens [B, κ]`` int64, ``num_valid [B]`` (= κ), ``probs [B, κ, V]`` fp32 for
        probabilistic drafts, ``confidence [B, κ]`` fp32 (confidence head, or top probability)."""
        from specc.kernels import process_logits

        m = self.model
        B = batch.batch_size
        dev = batch.tokens.device
        k = int(num_steps)
        s = (batch.seq_lens[:B] - 1).clamp(min=0)  # [B] the pending token's position
        anchor = batch.tokens[:B].gather(1, s.view(B, 1)).view(B)  # [B]
        ids = torch.full((B, k + 1), m.cfg.mask_token_id, dtype=torch.int64, device=dev)
        ids[:, 0] = anchor
        pos = (s.view(B, 1) + torch.arange(k + 1, device=dev).view(1, -1)).clamp(max=batch.trash_slot)  # [B, κ+1]
        visible = torch.where(batch.active[:B], s, torch.zeros_like(s))  # context slots < s
        host = batch.host  # the step's host copy of the rows: the widest context without a device read
        widest = (max((max(n - 1, 0) for n, on in zip(host.seq_lens[:B], host.active[:B]) if on), default=0)
                  if host is not None else None)
        hidden = m.block_hidden(ids, pos, self.cache, visible, max_visible=widest)[:, 1:]  # [B, κ, H]
        self.forward_passes += 1
        base = m.logits(hidden)  # [B, κ, V]
        self.last_base_logits = base
        probabilistic = sampling.mode == "probabilistic"
        probs = []

        def choose(z: torch.Tensor, j: int) -> torch.Tensor:
            if not probabilistic:
                return z.argmax(dim=-1)
            q = process_logits(z.view(B, 1, -1), batch.temperature[:B], batch.top_k[:B], batch.top_p[:B])[:, 0]
            probs.append(q)
            return torch.div(q, sampling.exp_noise[:B, j, : q.shape[-1]]).argmax(dim=-1)  # exponential race

        tokens, zs, prevs = markov_walk(base, hidden, anchor, m.markov if self.use_markov else None, choose, m.embed)
        conf = []
        for j, (z, prev) in enumerate(zip(zs, prevs)):
            if self.use_confidence_head:
                feat = m.markov.feature(prev) if m.markov is not None else None
                conf.append(m.confidence.prob(m.confidence.logit(hidden[:, j], feat), j))
            else:
                conf.append(torch.softmax(z, dim=-1).amax(dim=-1))  # top draft probability
        return Proposal(tokens=tokens, num_valid=torch.full((B,), k, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None,
                        confidence=torch.stack(conf, dim=1).float() if conf else None)

    @torch.inference_mode()
    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Context K/V of the committed verify rows ``0 .. accepted`` (pending token, accepted drafts)
        from ``step.target_hidden``; other rows and inactive requests write the trash slot."""
        B, W = step.input_ids.shape
        dev = step.input_ids.device
        acc = step.accepted.to(dev).view(B, 1)
        col = torch.arange(W, device=dev).view(1, W)
        keep = batch.active[:B].view(B, 1) & (col <= acc) & (step.cache_slots != batch.trash_slot)
        slots = torch.where(keep, step.positions, torch.full_like(step.positions, batch.trash_slot))
        ctx = self.model.context(step.target_hidden)  # [B, W, H]
        self.model.write_context(self.cache, ctx, step.positions.clamp(max=batch.trash_slot), slots)


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> BlockDrafter:
    """Runtime factory of methods ``dflash`` / ``dspark``: loads ``draft.path`` (``pkg://`` allowed) of
    the artifact's runtime section as a published-layout draft bound to ``target``'s embedding and LM
    head.

    Raises:
        PlanError: no ``draft.path``.
        CheckpointError: a draft that does not fit the target or the method
            (:func:`specc.methods.dflash.model.load_block_drafter`), or a DSpark draft without a confidence
            head under ``ragged_verify`` cap_accept / compact.
    """
    from specc.methods.dflash.model import load_block_drafter
    from specc.models.resolve import resolve_model_path

    method = spec.get("method") or {}
    kind = method["name"]
    draft = spec.get("draft") or {}
    if not draft.get("path"):
        raise PlanError(f"method.name={kind} needs draft.path (e.g. the draft preset smollm2_135m_{kind})")
    path = resolve_model_path(draft["path"])
    model = load_block_drafter(path, target, expect_kind=kind)
    sched = spec.get("schedule") or {}
    if (kind == "dspark" and sched.get("kind") == "budget" and sched.get("ragged_verify") in ("cap_accept", "compact")
            and model.confidence is None):
        raise CheckpointError(f"{draft['path']}: schedule.ragged_verify={sched.get('ragged_verify')} needs DSpark's trained "
                              f"confidence head (SGLang DS21) and this draft has none; use a draft with one or "
                              f"schedule.ragged_verify=static")
    model.to(device)
    return BlockDrafter(model)
