"""EAGLE / EAGLE-3 drafting behind the runtime's drafter protocol: chains (topk = 1), dynamic trees
(EAGLE-2 style, topk > 1) and static trees (``method.tree_choices``).

Per decode step (SGLang's EAGLE worker call pattern; one draft
extension and ``num_steps - 1`` recurrent calls):

* ``propose``: the head's output ``g`` at the last committed pair gives draft 1; each further draft
  runs the head once on (its own previous output, the previous draft) at the next draft position.
* ``commit`` (the *extend* stage): the head runs over the committed verify rows, pairing the target
  feature at position ``s + j`` with the token at ``s + j + 1`` (the accepted drafts, then the bonus
  token), which overwrites the draft KV the rejected drafts left (roll back by position).

Draft position ``p`` holds the pair (target feature at ``p``, token at ``p + 1``); its KV lives in the
head's own cache at slot ``p``; padding and inactive rows write to the runtime's trash slot, which no
real query sees (every real position is smaller).

Trees (``propose_tree``): level by level, the head runs once over the level's frontier nodes (the
topk beams of a dynamic tree, the nodes with children of a static one), each at the draft position of
its depth, with its KV in a scratch slot past the row's last committed draft position and an explicit
mask (the committed prefix plus the node's own ancestors' scratch slots). The draft-extend over the
accepted path (``commit``, which the runtime hands the path as a chain) overwrites the scratch slots
it reaches; the rest lie past every later query's position or mask.

* Dynamic tree (SGLang's EAGLE worker, eagle_worker_v2.py:742-919; EAGLE-2's
  ``topK_genrate``, SafeAILab/EAGLE eagle/model/cnets.py): the root's topk children; then per level each of the topk beams
  expands into its topk children scored by cumulative draft log-probability, all topk² join the
  candidate pool and the best topk become the next beams; finally the best ``num_draft_tokens - 1``
  pool nodes are kept. They are numbered in score order (ties: pool order), a topological order
  since a child never outscores its parent (log-probabilities are ≤ 0), so every prefix is the best
  subtree (the budget schedule admits prefixes). Greedy drafts only (the tree is then a deterministic
  function of the context, which one-hot tree rejection sampling needs).
* Static tree: node ``[.., r]`` takes its parent's rank-r candidate: the r-th largest draft
  probability (greedy) or the r-th draw without replacement (probabilistic: ``argmax q / Exp(1)``
  ranked, the exponential race of the parent's own noise row).
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, TreeRequest, VerifyStep
from specc.errors import CheckpointError, PlanError
from specc.methods.eagle.model import DraftKVCache, EagleModel


class EagleDrafter(Drafter):
    """``method.name: eagle`` / ``eagle3`` with a loaded :class:`EagleModel` (and ``mtp`` with an
    :class:`specc.methods.mtp.model.MTPModel`, which answers the same model contract and reads the target's
    final-norm hidden state: ``reads_final_norm``).

    Args:
        model: the head (weights loaded, bound to the target's embedding / LM head).
        target_num_layers: the target's decoder layer count. target_norm: the target's final RMSNorm
            (EAGLE's feature is the final-norm output; EAGLE-3 reads ``model.cfg.aux_layer_ids``).
    """

    supports_probabilistic = True
    capturable = False
    supports_tree = True

    def __init__(self, model: EagleModel, target_num_layers: int, target_norm=None,
                 mask_token_id: Optional[int] = None):
        self.model = model.prepare_inference()
        self.mask_token_id = None if mask_token_id is None else int(mask_token_id)
        self.name = model.cfg.kind
        self._final_norm = None
        self.forward_passes = 0
        if getattr(model, "reads_final_norm", model.cfg.kind == "eagle"):  # EAGLE, MTP layers
            # EAGLE reads the final-norm output; the runtime's prefill asks for logits at one column
            # only, which the target cannot combine with layer ``num_layers``, so we take the last
            # layer's output and apply the target's final norm here (the same computation).
            if target_norm is None:
                raise ValueError(f"a {model.cfg.kind} drafter needs the target's final norm (target_norm)")
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
        #: host mirror of ``last_pos`` (from the step's host copies; None: unknown, read the device)
        self.host_last_pos: Optional[List[int]] = [0] * max_batch_size

    def _causal_mask(self, positions: torch.Tensor, highest: Optional[int]) -> Optional[torch.Tensor]:
        """The head's default cache mask ``[B, N, S]`` (slot ``j`` visible iff ``j <= position``) over
        ``S = highest + 1`` slots, ``highest`` the largest of ``positions`` known on the host; None
        when it is not known (the head then reads ``positions.max()``, one device read)."""
        if highest is None:
            return None
        keys = torch.arange(highest + 1, device=positions.device)
        return keys.view(1, 1, -1) <= positions.unsqueeze(-1)

    def _highest(self, B: int, ahead: int, trash: int) -> Optional[int]:
        """max over rows ``b < B`` of ``min(last_pos[b] + ahead, trash)`` from the host mirror (None
        when unknown)."""
        if self.host_last_pos is None:
            return None
        return max(min(p + ahead, trash) for p in self.host_last_pos[:B]) if B else 0

    def draft_kv_bytes(self) -> int:
        """Bytes of the head's own KV cache (K and V, every row and slot)."""
        return 0 if self.cache is None else self.cache.k.nbytes + self.cache.v.nbytes

    def _features(self, hidden) -> torch.Tensor:
        """The head's input feature ``[B, N, F]`` from the target's hidden states at ``hidden_layers``
        (EAGLE: the final-norm output; EAGLE-3: low/mid/high concatenated)."""
        if self._final_norm is not None:
            return self._final_norm(hidden[0]).float()
        return hidden[0] if len(hidden) == 1 else torch.cat(list(hidden), dim=-1)

    @torch.inference_mode()
    def _extend(self, tokens, features, positions, slots, last_index, rows, batch_size: int,
                attn_mask: Optional[torch.Tensor] = None) -> None:
        """Run the head over pairs ``[B, N]`` and store, for ``rows`` only, the output and position at
        ``last_index [B]`` (``attn_mask``: the cache mask when the caller knows its span)."""
        B = tokens.shape[0]
        g = self.model(tokens, features, positions, cache=self.cache, cache_slots=slots,
                       attn_mask=attn_mask)  # [B, N, H]
        self.forward_passes += 1
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
        if self.host_last_pos is not None:  # prefill reads its rows' positions back (not a decode step)
            self.host_last_pos = self.last_pos.tolist()

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
            at = pos.clamp(max=batch.trash_slot)
            g = m(t.view(B, 1), g, at, cache=self.cache, cache_slots=slots, from_target=False,
                  attn_mask=self._causal_mask(at, self._highest(B, i + 1, batch.trash_slot)))  # [B, 1, H]
            self.forward_passes += 1
        tokens = torch.stack(toks, dim=1) if toks else torch.zeros(B, 0, dtype=torch.int64, device=dev)
        return Proposal(tokens=tokens, num_valid=torch.full((B,), num_steps, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None,
                        confidence=torch.stack(conf, dim=1) if conf else None)

    # ------------------------------------------------------------------ trees
    def _run_level(self, batch: BatchView, tokens: torch.Tensor, feats: torch.Tensor, depth: int,
                   scratch: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        """One head pass over F frontier nodes per row: ``tokens [B, F]`` target ids at tree depth
        ``depth`` (draft position ``last_pos + depth``), ``feats [B, F, H]`` their parents' head
        outputs, KV at scratch slots ``last_pos + 1 + scratch [F]``, each seeing the committed prefix
        and the scratch slots flagged in ``ancestors [B, F, Sc]`` (itself included). Returns the
        outputs ``[B, F, H]``."""
        B, F = tokens.shape
        trash = batch.trash_slot
        last = self.last_pos[:B].view(B, 1)  # [B, 1]
        sc = ancestors.shape[-1]
        slot = last + 1 + scratch.view(1, F)  # [B, F]
        active = batch.active[:B].view(B, 1)
        slots = torch.where(active & (slot < trash), slot, torch.full_like(slot, trash))
        hi = self._highest(B, 0, 1 << 62)
        span = (int(last.max()) if hi is None else hi) + 1 + sc
        rel = torch.arange(span, device=tokens.device).view(1, 1, span) - (last + 1).view(B, 1, 1)  # [B, 1, S]
        anc = ancestors.gather(2, rel.clamp(0, sc - 1).expand(B, F, span))
        mask = (rel < 0) | ((rel < sc) & anc)  # [B, F, S]
        pos = (last + depth).expand(B, F).clamp(max=trash)
        self.forward_passes += 1
        return self.model(tokens, feats, pos, cache=self.cache, cache_slots=slots, attn_mask=mask, from_target=False)

    @torch.inference_mode()
    def propose_tree(self, batch: BatchView, tree: TreeRequest, sampling: DraftSampling) -> Proposal:
        """A draft tree of ``tree.num_nodes`` nodes per row (see the module docstring): tokens,
        parents, depths, confidence (path probabilities) ``[B, N]``; for a static tree with
        probabilistic drafts also ``probs [B, N, V]`` (q at every parent node, zero rows for leaves).
        Raises ValueError for probabilistic drafts on a dynamic tree (its node selection uses the
        drafted scores)."""
        if tree.static is not None:
            return self._static_tree(batch, tree, sampling)
        if sampling.mode == "probabilistic":
            raise ValueError("a dynamic EAGLE tree drafts greedily (one-hot q); use a static tree "
                             "(method.tree_choices) for probabilistic drafts")
        return self._dynamic_tree(batch, tree)

    def _dynamic_tree(self, batch: BatchView, tree: TreeRequest) -> Proposal:
        m = self.model
        B = batch.batch_size
        dev = batch.tokens.device
        k, steps, n = int(tree.topk), int(tree.num_steps), int(tree.num_nodes)
        g0 = self.g_last[:B]  # [B, H]
        logp = torch.log_softmax(m.draft_logits(g0.unsqueeze(1))[:, 0].float(), dim=-1)  # [B, Vd]
        score, ids = logp.topk(k, dim=-1)  # [B, k], descending
        tok = m.draft_to_target(ids)
        pool_score, pool_tok = [score], [tok]
        pool_parent = [torch.full((B, k), -1, dtype=torch.int64, device=dev)]
        pool_depth = [torch.ones(B, k, dtype=torch.int64, device=dev)]
        beam_tok, beam_score = tok, score
        beam_feat = g0.unsqueeze(1).expand(B, k, g0.shape[-1])
        beam_pool = torch.arange(k, device=dev).expand(B, k)
        sc = max(1, (steps - 1) * k)
        beam_anc = torch.zeros(B, k, sc, dtype=torch.bool, device=dev)
        offset = k
        rk = torch.arange(k, device=dev)
        for i in range(1, steps):
            scratch = (i - 1) * k + rk  # [k]
            anc = beam_anc.clone()
            anc[:, rk, scratch] = True
            g = self._run_level(batch, beam_tok, beam_feat, i, scratch, anc)  # [B, k, H]
            lp = torch.log_softmax(m.draft_logits(g).float(), dim=-1)  # [B, k, Vd]
            csc, cid = lp.topk(k, dim=-1)  # [B, k, k]
            cum = (beam_score.unsqueeze(-1) + csc).reshape(B, k * k)
            ctok = m.draft_to_target(cid).reshape(B, k * k)
            pool_score.append(cum)
            pool_tok.append(ctok)
            pool_parent.append(beam_pool.unsqueeze(-1).expand(B, k, k).reshape(B, k * k))
            pool_depth.append(torch.full((B, k * k), i + 1, dtype=torch.int64, device=dev))
            beam_score, top = cum.topk(k, dim=-1)  # [B, k] the next beams
            parent_r = top // k
            beam_tok = ctok.gather(1, top)
            beam_feat = g.gather(1, parent_r.unsqueeze(-1).expand(B, k, g.shape[-1]))
            beam_anc = anc.gather(1, parent_r.unsqueeze(-1).expand(B, k, sc))
            beam_pool = offset + top
            offset += k * k
        scores = torch.cat(pool_score, dim=1)  # [B, P]
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]  # [B, N]
        parent_pool = torch.cat(pool_parent, dim=1).gather(1, order)  # [B, N]
        rank_of = torch.full_like(scores, -1, dtype=torch.int64)
        rank_of.scatter_(1, order, torch.arange(n, device=dev).expand(B, n).contiguous())
        parents = torch.where(parent_pool < 0, torch.zeros_like(parent_pool),
                              rank_of.gather(1, parent_pool.clamp(min=0)) + 1)
        return Proposal(tokens=torch.cat(pool_tok, dim=1).gather(1, order),
                        num_valid=torch.full((B,), n, dtype=torch.int64, device=dev),
                        confidence=scores.gather(1, order).exp(), parents=parents,
                        depths=torch.cat(pool_depth, dim=1).gather(1, order))

    def _static_tree(self, batch: BatchView, tree: TreeRequest, sampling: DraftSampling) -> Proposal:
        from specc.kernels import process_logits

        m = self.model
        st = tree.static
        B = batch.batch_size
        dev = batch.tokens.device
        n, kmax = st.num_nodes, st.topk
        probabilistic = sampling.mode == "probabilistic"
        g0 = self.g_last[:B]
        hsize = g0.shape[-1]
        out = g0.new_zeros(B, n + 1, hsize)  # head output of each node (root: the last committed pair's)
        out[:, 0] = g0
        tokens = torch.zeros(B, n + 1, dtype=torch.int64, device=dev)
        path_p = torch.ones(B, n + 1, dtype=torch.float32, device=dev)
        probs = torch.zeros(B, n, self.model.cfg.vocab_size, device=dev) if probabilistic else None
        run_nodes = torch.cat(list(st.expand[1:])) if len(st.expand) > 1 else torch.zeros(0, dtype=torch.int64, device=dev)
        scratch_of = torch.full((n + 1,), -1, dtype=torch.int64, device=dev)
        scratch_of[run_nodes] = torch.arange(run_nodes.numel(), device=dev)
        sc = max(1, int(run_nodes.numel()))
        anc_all = st.mask[:, run_nodes] if run_nodes.numel() else torch.zeros(n + 1, 1, dtype=torch.bool, device=dev)
        parent_of = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), st.parents])  # [W]
        rank_of = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), st.ranks])
        depth_of = st.depths
        for d, frontier in enumerate(st.expand):  # frontier: [F] nodes at depth d with children
            if d > 0:
                out[:, frontier] = self._run_level(
                    batch, tokens[:, frontier], out[:, parent_of[frontier]], d, scratch_of[frontier],
                    anc_all[frontier].unsqueeze(0).expand(B, -1, -1))
            logits = m.draft_logits(out[:, frontier])  # [B, F, Vd]
            if probabilistic:
                f = frontier.numel()
                temp = batch.temperature[:B].repeat_interleave(f)
                q = process_logits(logits.reshape(B * f, 1, -1), temp, batch.top_k[:B].repeat_interleave(f),
                                   batch.top_p[:B].repeat_interleave(f))[:, 0].view(B, f, -1)  # [B, F, Vd]
                noise = sampling.exp_noise[:B][:, frontier, : q.shape[-1]]
                cand = torch.div(q, noise).topk(kmax, dim=-1).indices  # [B, F, kmax] draws without replacement
                probs[:, frontier] = m.target_probs(q)
            else:
                q = torch.softmax(logits.float(), dim=-1)
                cand = logits.topk(kmax, dim=-1).indices  # [B, F, kmax]
            slot = torch.full((n + 1,), -1, dtype=torch.int64, device=dev)
            slot[frontier] = torch.arange(frontier.numel(), device=dev)
            children = torch.nonzero(depth_of == d + 1).view(-1)  # [C] nodes at depth d + 1
            if children.numel() == 0:
                continue
            par_slot = slot[parent_of[children]]  # [C]
            picked = cand[:, par_slot, rank_of[children]]  # [B, C] draft-vocab ids
            tokens[:, children] = m.draft_to_target(picked)
            qp = q[:, par_slot].gather(2, picked.unsqueeze(-1)).squeeze(-1)  # [B, C]
            path_p[:, children] = path_p[:, parent_of[children]] * qp
        return Proposal(tokens=tokens[:, 1:], num_valid=torch.full((B,), n, dtype=torch.int64, device=dev),
                        probs=probs, confidence=path_p[:, 1:],
                        parents=st.parents.expand(B, n), depths=st.depths[1:].expand(B, n))

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
            at = pos.clamp(max=batch.trash_slot)
            g = m(toks, g0.expand(B, k - 1, g0.shape[-1]), at, cache=self.cache, cache_slots=slots,
                  from_target=False, attn_mask=self._causal_mask(at, self._highest(B, k - 1, batch.trash_slot)))
            self.forward_passes += 1
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
        trash = batch.trash_slot
        host, hv = batch.host, step.host
        if self.host_last_pos is None or host is None or hv is None or hv.roots is None:
            self.host_last_pos = None  # not handed the host values: read the device from here on
            self._extend(nxt, self._features(step.target_hidden), positions, slots, acc, active, B)
            return
        # positions[b, j] = min(root_b + j, trash): the span and each row's new last position on the host
        highest = max(min(r + W - 1, trash) for r in hv.roots[:B]) if B else 0
        self._extend(nxt, self._features(step.target_hidden), positions, slots, acc, active, B,
                     attn_mask=self._causal_mask(positions, highest))
        for b in range(B):
            if host.active[b]:
                self.host_last_pos[b] = min(hv.roots[b] + min(int(hv.accepted[b]), W - 1), trash)

    # ------------------------------------------------------------------ disaggregation seed
    @torch.inference_mode()
    def export_seed(self, row: int, prompt_len: int) -> dict:
        """The seed a prefill instance ships for row ``row`` after its prefill (SGLang's
        ``EagleDraftInput``): ``draft_k``/``draft_v`` ``[kv_heads, P, head_dim]``
        (the head's KV over the prompt pairs, positions ``0 .. P-1``), ``hidden`` ``[H]`` (the head's
        output at the last pair, which the first draft reads), ``last_pos`` ``[1]`` int64 (= P - 1),
        and the draft's top-1 at that state: ``topk_p`` ``[1]`` fp32, ``topk_index`` ``[1]`` int64
        (target ids; chain drafting, topk = 1)."""
        g = self.g_last[row].clone()
        logits = self.model.draft_logits(g.view(1, 1, -1))[0, 0].float()  # [Vd]
        p, d = torch.softmax(logits, dim=-1).max(dim=-1)
        return {"draft_k": self.cache.k[row, :, :prompt_len].clone(),
                "draft_v": self.cache.v[row, :, :prompt_len].clone(),
                "hidden": g, "last_pos": self.last_pos[row].view(1).clone(),
                "topk_p": p.view(1), "topk_index": self.model.draft_to_target(d.view(1))}

    def check_seed(self, seed: dict, prompt_len: int) -> str:
        """Why ``seed`` cannot seed this head for a ``prompt_len``-token prompt ('' when it can):
        missing tensors, wrong shapes or dtypes, a position that is not ``P - 1``."""
        kv, d = self.cache.k.shape[1], self.cache.k.shape[3]
        want = {"draft_k": ((kv, prompt_len, d), self.cache.k.dtype), "draft_v": ((kv, prompt_len, d), self.cache.v.dtype),
                "hidden": ((self.g_last.shape[1],), self.g_last.dtype), "last_pos": ((1,), torch.int64),
                "topk_p": ((1,), torch.float32), "topk_index": ((1,), torch.int64)}
        for name, (shape, dtype) in want.items():
            t = seed.get(name)
            if t is None:
                return f"EAGLE seed tensor {name!r} is missing"
            if tuple(t.shape) != shape or t.dtype != dtype:
                return f"EAGLE seed {name} is {tuple(t.shape)} {t.dtype}, this head needs {shape} {dtype}"
        extra = sorted(set(seed) - set(want))
        if extra:
            return f"unexpected EAGLE seed tensors {extra}"
        if int(seed["last_pos"][0]) != prompt_len - 1:
            return f"EAGLE seed position {int(seed['last_pos'][0])} is not the prompt's last ({prompt_len - 1})"
        return ""

    @torch.inference_mode()
    def import_seed(self, row: int, seed: dict, prompt_len: int, first_token: Optional[int] = None) -> None:
        """Install a shipped seed (:meth:`export_seed`) into row ``row`` of the decode instance, so its
        first ``propose`` drafts from it (``first_token``, the payload's, is already in the head's
        state). Raises ValueError when the shipped top-1 is not the head's own top-1 at the shipped
        hidden state (the seed is inconsistent)."""
        dev = self.g_last.device
        self.cache.k[row, :, :prompt_len] = seed["draft_k"].to(dev)
        self.cache.v[row, :, :prompt_len] = seed["draft_v"].to(dev)
        self.g_last[row] = seed["hidden"].to(dev)
        self.last_pos[row] = int(seed["last_pos"][0])
        if self.host_last_pos is not None:
            self.host_last_pos[row] = int(seed["last_pos"][0])
        logits = self.model.draft_logits(self.g_last[row].view(1, 1, -1))[0, 0]
        top = self.model.draft_to_target(logits.argmax(dim=-1).view(1))
        if int(top[0]) != int(seed["topk_index"][0]):
            raise ValueError(f"EAGLE seed: shipped top-1 {int(seed['topk_index'][0])} is not the head's top-1 "
                             f"{int(top[0])} at the shipped hidden state")


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> EagleDrafter:
    """Runtime factory of methods ``eagle`` / ``eagle3`` (``specc.methods``): loads ``draft.path``
    (``pkg://`` allowed) of the artifact's runtime section ``spec`` (``{"method": {"name"}, "draft":
    {"path"}}``) as a published-layout head bound to ``target``'s embedding and LM head.

    Raises ``PlanError`` without ``draft.path``; ``CheckpointError`` for a head that does not match
    the target or the method (see :func:`specc.methods.eagle.loader.load_eagle_head`)."""
    from specc.methods.eagle.loader import load_eagle_head
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
        from specc.methods.draft_model.drafter import parallel_mask_token

        mask = parallel_mask_token(draft["path"], draft.get("format") or "hf", "P-EAGLE")
    return EagleDrafter(model, target.config.num_layers, target.norm, mask_token_id=mask)
