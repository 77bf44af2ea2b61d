"""EAGLE / EAGLE-3 chain drafting (topk = 1) behind the runtime's drafter protocol.

Per decode step (SGLang's EAGLE worker call pattern; seeds, speculative-decoding-zoo: one draft
extension and ``num_steps - 1`` recurrent calls):

* ``propose``: the head's output ``g`` at the last committed pair gives draft 1; each further draft
  runs the head once on (its own previous output, the previous draft) at the next draft position.
* ``commit`` (the *extend* stage): the head runs over the committed verify rows, pairing the target
  feature at position ``s + j`` with the token at ``s + j + 1`` (the accepted drafts, then the bonus
  token), which overwrites the draft KV the rejected drafts left (roll back by position).

Draft position ``p`` holds the pair (target feature at ``p``, token at ``p + 1``); its KV lives in the
head's own cache at slot ``p``; padding and inactive rows write to the runtime's trash slot, which no
real query sees (every real position is smaller).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from specc.drafters.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep
from specc.errors import CheckpointError, PlanError
from specc.models.eagle import DraftKVCache, EagleModel


class EagleDrafter(Drafter):
    """``method.name: eagle`` / ``eagle3`` with a loaded :class:`EagleModel`.

    Args:
        model: the head (weights loaded, bound to the target's embedding / LM head).
        target_num_layers: the target's decoder layer count. target_norm: the target's final RMSNorm
            (EAGLE's feature is the final-norm output; EAGLE-3 reads ``model.cfg.aux_layer_ids``).
    """

    supports_probabilistic = True
    capturable = False

    def __init__(self, model: EagleModel, target_num_layers: int, target_norm=None,
                 mask_token_id: Optional[int] = None):
        self.model = model.prepare_inference()
        self.mask_token_id = None if mask_token_id is None else int(mask_token_id)
        self.name = model.cfg.kind
        self._final_norm = None
        if model.cfg.kind == "eagle":
            # EAGLE reads the final-norm output; the runtime's prefill asks for logits at one column
            # only, which the target cannot combine with layer ``num_layers``, so we take the last
            # layer's output and apply the target's final norm here (the same computation).
            if target_norm is None:
                raise ValueError("an EAGLE drafter needs the target's final norm (target_norm)")
            self._final_norm = target_norm
            self.hidden_layers = (int(target_num_layers) - 1,)
        else:
            self.hidden_layers = tuple(int(i) for i in model.cfg.aux_layer_ids)
        self.cache: Optional[DraftKVCache] = None
        self.g_last: Optional[torch.Tensor] = None  # [B, H] head output at each row's last committed pair
        self.last_pos: Optional[torch.Tensor] = None  # [B] int64 draft position of that pair

    # ------------------------------------------------------------------ protocol
    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        """Allocate the head's KV cache ``[B, kv_heads, max_seq_len, head_dim]`` and per-row state."""
        self.model.to(device)
        self.cache = self.model.new_cache(max_batch_size, max_seq_len, device=device)
        self.g_last = torch.zeros(max_batch_size, self.model.cfg.hidden_size, device=device)
        self.last_pos = torch.zeros(max_batch_size, dtype=torch.int64, device=device)

    def _features(self, hidden) -> torch.Tensor:
        """The head's input feature ``[B, N, F]`` from the target's hidden states at ``hidden_layers``
        (EAGLE: the final-norm output; EAGLE-3: low/mid/high concatenated)."""
        if self._final_norm is not None:
            return self._final_norm(hidden[0]).float()
        return hidden[0] if len(hidden) == 1 else torch.cat(list(hidden), dim=-1)

    @torch.inference_mode()
    def _extend(self, tokens, features, positions, slots, last_index, rows, batch_size: int) -> None:
        """Run the head over pairs ``[B, N]`` and store, for ``rows`` only, the output and position at
        ``last_index [B]``."""
        B = tokens.shape[0]
        g = self.model(tokens, features, positions, cache=self.cache, cache_slots=slots)  # [B, N, H]
        idx = torch.arange(B, device=tokens.device)
        last_index = last_index.clamp(0, tokens.shape[1] - 1)  # rows outside ``rows`` may point past N
        g_sel = g[idx, last_index]  # [B, H]
        p_sel = positions[idx, last_index]  # [B]
        self.g_last[:B] = torch.where(rows.view(B, 1), g_sel, self.g_last[:B])
        self.last_pos[:B] = torch.where(rows, p_sel, self.last_pos[:B])

    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Draft-extend over each new row's prompt: pairs (feature at ``p``, token at ``p + 1``) for
        ``p = 0 .. prompt_len - 1`` (the last pair holds the first generated token)."""
        B, N = chunk.input_ids.shape
        dev = chunk.input_ids.device
        plen = batch.prompt_lens[:B]  # [B]
        nxt = torch.zeros_like(chunk.input_ids)
        width = min(N, batch.tokens.shape[1] - 1)
        nxt[:, :width] = batch.tokens[:B, 1: width + 1]  # token at p + 1
        col = torch.arange(N, device=dev).view(1, N)
        valid = chunk.rows.view(B, 1) & (col < plen.view(B, 1))  # [B, N]
        slots = torch.where(valid, chunk.positions, torch.full_like(chunk.positions, batch.trash_slot))
        last = (plen - 1).clamp(min=0)
        self._extend(nxt, self._features(chunk.target_hidden), chunk.positions, slots, last, chunk.rows, B)

    @torch.inference_mode()
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """κ = ``num_steps`` chain drafts per row: ``tokens [B, κ]`` int64 target ids and, for
        probabilistic drafts, ``probs [B, κ, V]`` fp32 (the head's processed distribution, zero outside
        an EAGLE-3 draft vocabulary). Sampling: argmax of ``q / exp_noise`` (exponential race)."""
        from specc.kernels import process_logits

        m = self.model
        B = batch.batch_size
        dev = batch.tokens.device
        active = batch.active[:B]
        g = self.g_last[:B].unsqueeze(1)  # [B, 1, H]
        pos = self.last_pos[:B].view(B, 1)  # [B, 1]
        trash = torch.full_like(pos, batch.trash_slot)
        probabilistic = sampling.mode == "probabilistic"
        toks, probs, conf = [], [], []
        for i in range(num_steps):
            logits = m.draft_logits(g)  # [B, 1, Vd]
            conf.append(torch.softmax(logits[:, 0].float(), dim=-1).amax(dim=-1))  # [B] top draft probability
            if probabilistic:
                q = process_logits(logits, batch.temperature[:B], batch.top_k[:B], batch.top_p[:B])[:, 0]  # [B, Vd]
                noise = sampling.exp_noise[:B, i, : q.shape[-1]]
                d = torch.div(q, noise).argmax(dim=-1)  # [B] draft-vocab ids
                probs.append(m.target_probs(q))  # [B, V]
            else:
                d = logits[:, 0].argmax(dim=-1)
            t = m.draft_to_target(d)  # [B]
            toks.append(t)
            if i + 1 == num_steps:
                break
            pos = pos + 1
            slots = torch.where(active.view(B, 1) & (pos < batch.trash_slot), pos, trash)
            g = m(t.view(B, 1), g, pos.clamp(max=batch.trash_slot), cache=self.cache, cache_slots=slots,
                  from_target=False)  # [B, 1, H]
        tokens = torch.stack(toks, dim=1) if toks else torch.zeros(B, 0, dtype=torch.int64, device=dev)
        return Proposal(tokens=tokens, num_valid=torch.full((B,), num_steps, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None,
                        confidence=torch.stack(conf, dim=1) if conf else None)

    @torch.inference_mode()
    def propose_block(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """P-EAGLE (vLLM ``eagle``/``eagle3`` with ``parallel_drafting``): draft 1 from the head's output
        at the last committed pair, as in the chain; drafts 2..κ from **one** head pass over κ − 1 pairs
        at draft positions ``last + 1 .. last + κ − 1`` whose tokens are the mask token (the drafts not
        yet known) and whose feature is the last committed output (vLLM's K − 1 extra slots per
        request). The pairs' KV is overwritten by the next extend (roll back by position). Same return
        value as :meth:`propose`.

        Raises: CheckpointError when the head has no mask token (not trained for parallel drafting).
        """
        from specc.kernels import process_logits

        if self.mask_token_id is None:
            raise CheckpointError("parallel drafting (P-EAGLE) needs a mask token in the head's config.json "
                                  "(mask_token_id / ptd_token_id); this head has none")
        m = self.model
        B = batch.batch_size
        dev = batch.tokens.device
        k = int(num_steps)
        active = batch.active[:B]
        g0 = self.g_last[:B].unsqueeze(1)  # [B, 1, H]
        logits = [m.draft_logits(g0)]  # [B, 1, Vd]
        if k > 1:
            pos = (self.last_pos[:B].view(B, 1) + torch.arange(1, k, device=dev).view(1, -1))  # [B, κ-1]
            slots = torch.where(active.view(B, 1) & (pos < batch.trash_slot), pos, torch.full_like(pos, batch.trash_slot))
            toks = torch.full((B, k - 1), self.mask_token_id, dtype=torch.int64, device=dev)
            g = m(toks, g0.expand(B, k - 1, g0.shape[-1]), pos.clamp(max=batch.trash_slot), cache=self.cache,
                  cache_slots=slots, from_target=False)  # [B, κ-1, H]
            logits.append(m.draft_logits(g))
        logits = torch.cat(logits, dim=1)  # [B, κ, Vd]
        conf = torch.softmax(logits.float(), dim=-1).amax(dim=-1)  # [B, κ]
        probs = None
        if sampling.mode == "probabilistic":
            q = process_logits(logits, batch.temperature[:B], batch.top_k[:B], batch.top_p[:B])  # [B, κ, Vd]
            d = torch.div(q, sampling.exp_noise[:B, :k, : q.shape[-1]]).argmax(dim=-1)
            probs = m.target_probs(q)
        else:
            d = logits.argmax(dim=-1)
        return Proposal(tokens=m.draft_to_target(d), num_valid=torch.full((B,), k, dtype=torch.int64, device=dev),
                        probs=probs, confidence=conf)

    @torch.inference_mode()
    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Draft-extend over the committed verify rows: pairs ``j = 0 .. accepted`` = (target feature at
        ``s + j``, draft ``j + 1`` for ``j < accepted``, the bonus token for ``j = accepted``)."""
        B, W = step.input_ids.shape
        dev = step.input_ids.device
        acc = step.accepted.to(dev)  # [B]
        col = torch.arange(W, device=dev).view(1, W)
        nxt = torch.zeros_like(step.input_ids)
        nxt[:, : W - 1] = step.input_ids[:, 1:]
        nxt = torch.where(col == acc.view(B, 1), step.bonus.view(B, 1).to(nxt.dtype), nxt)  # [B, W]
        active = batch.active[:B]
        valid = active.view(B, 1) & (col <= acc.view(B, 1)) & (step.cache_slots != batch.trash_slot)
        slots = torch.where(valid, step.positions, torch.full_like(step.positions, batch.trash_slot))
        positions = step.positions.clamp(max=batch.trash_slot)
        self._extend(nxt, self._features(step.target_hidden), positions, slots, acc, active, B)


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> EagleDrafter:
    """Runtime factory of methods ``eagle`` / ``eagle3`` (``specc.methods``): loads ``draft.path``
    (``pkg://`` allowed) of the artifact's runtime section ``spec`` (``{"method": {"name"}, "draft":
    {"path"}}``) as a published-layout head bound to ``target``'s embedding and LM head.

    Raises ``PlanError`` without ``draft.path``; ``CheckpointError`` for a head that does not match
    the target or the method (see :func:`specc.models.eagle_loader.load_eagle_head`)."""
    from specc.models.eagle_loader import load_eagle_head
    from specc.models.resolve import resolve_model_path

    kind = spec["method"]["name"]
    draft = spec.get("draft") or {}
    if not draft.get("path"):
        raise PlanError(f"method.name={kind} needs draft.path (e.g. the draft preset smollm2_135m_{kind})")
    path = resolve_model_path(draft["path"])
    if not path.is_dir():
        raise CheckpointError(f"{draft['path']}: an EAGLE head is a directory (config.json + weights), got {path}")
    model = load_eagle_head(path, target.config, target.embed, target.lm_head, expect_kind=kind)
    model.to(device)
    mask = None
    if (spec.get("method") or {}).get("parallel_drafting"):
        from specc.drafters.draft_model import parallel_mask_token

        mask = parallel_mask_token(draft["path"], draft.get("format") or "hf", "P-EAGLE")
    return EagleDrafter(model, target.config.num_layers, target.norm, mask_token_id=mask)
