"""Draft-model speculation: an independent small causal LM (its own embeddings, layers, head and KV
cache) proposes κ tokens autoregressively (Leviathan et al. 2023; vLLM ``draft_model``).

The draft KV cache is written by position like the target's (gpt-fast's ``KVCache``, pytorch-labs/gpt-fast model.py).
The drafter remembers per row how many leading positions of its cache hold the right KV
(``synced``): each ``propose`` first feeds the history from there up to the pending token in one
forward (normally one or two tokens: the bonus, or the last accepted draft and the bonus —
gpt-fast's "fill last token"; after κ = 0 steps of an adaptive schedule, every token those steps
emitted), then drafts κ tokens; ``commit`` records how many of the fed drafts were accepted, so the
extend stage costs no forward of its own.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from specc.methods.base import (BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep,
                                 check_same_vocab)
from specc.errors import CheckpointError
from specc.kernels import process_logits


class DraftModelDrafter(Drafter):
    """``method.name: draft_model``.

    Args:
        model: a ``specc.models.llama.LlamaModel`` (weights loaded) with the target's vocabulary.
        target_vocab_size: V of the target. source: checkpoint path for messages.
        prefill_chunk: prompt tokens per prefill forward.
    Raises:
        CheckpointError: vocabulary sizes differ.
    """

    name = "draft_model"
    supports_probabilistic = True
    capturable = False
    prefill_row_index = True

    def __init__(self, model, target_vocab_size: int, source: str = "draft model", prefill_chunk: int = 512,
                 mask_token_id: Optional[int] = None) -> None:
        check_same_vocab(model.config.vocab_size, target_vocab_size, source)
        self.model = model
        self.source = source
        self.prefill_chunk = int(prefill_chunk)
        if mask_token_id is not None and not 0 <= int(mask_token_id) < model.config.vocab_size:
            raise CheckpointError(f"{source}: mask token {mask_token_id} is outside the vocabulary "
                                  f"(0..{model.config.vocab_size - 1})")
        self.mask_token_id = None if mask_token_id is None else int(mask_token_id)
        self._fed_drafts = True  # the last propose fed its drafts (chain) rather than mask tokens (PARD)
        self.forward_passes = 0

    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        if self.model.config.max_model_len < max_seq_len:
            raise CheckpointError(
                f"{self.source}: the draft model's max_model_len {self.model.config.max_model_len} is shorter "
                f"than the runtime's cache ({max_seq_len} slots); lower target.max_model_len")
        self.model.setup_cache(max_batch_size, max_seq_len)
        self.synced = torch.zeros(max_batch_size, dtype=torch.int64, device=device)  # [R] KV right below this
        #: host mirror of ``synced`` (kept from the host values the runtime hands over; None: unknown)
        self.host_synced: Optional[List[int]] = [0] * max_batch_size
        self._proposed_at: Optional[torch.Tensor] = None  # [B] seq_len at the last propose
        self._host_proposed_at: Optional[List[int]] = None

    def draft_kv_bytes(self) -> int:
        """Bytes of the draft model's KV caches (every layer, K and V)."""
        return sum(layer.attn.k_cache.nbytes + layer.attn.v_cache.nbytes for layer in self.model.layers
                   if layer.attn.k_cache is not None)

    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Write the draft KV of the prompts of ``chunk.rows`` (others write to the trash slot); a
        compact chunk (``row_index``) runs over the new requests' cache rows only."""
        B, N = chunk.input_ids.shape
        slots = torch.where(chunk.rows.view(B, 1), chunk.cache_slots, torch.full_like(chunk.cache_slots, batch.trash_slot))
        step = max(16, self.prefill_chunk // B)
        at = torch.zeros(B, 1, dtype=torch.int64, device=chunk.input_ids.device)  # logits of one column only
        for c0 in range(0, N, step):
            c1 = min(N, c0 + step)
            self.model.forward(chunk.input_ids[:, c0:c1], chunk.positions[:, c0:c1], slots[:, c0:c1], None,
                               logits_at=at, rows=chunk.row_index)
        if chunk.row_index is not None:
            self.synced[chunk.row_index] = batch.prompt_lens[chunk.row_index]
        else:
            self.synced[:B] = torch.where(chunk.rows, batch.prompt_lens[:B], self.synced[:B])
        if self.host_synced is not None:  # prefill reads its rows on the host (not a decode step)
            rows = chunk.row_index.tolist() if chunk.row_index is not None else \
                [r for r, on in enumerate(chunk.rows.tolist()) if on]
            plen = batch.prompt_lens.tolist()
            for r in rows:
                self.host_synced[r] = int(plen[r])

    @torch.inference_mode()
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """κ = ``num_steps`` autoregressive draft steps for every row.

        Returns tokens ``[B, κ]`` int64, num_valid ``[B]`` (= κ; the runtime clips per row), and for
        probabilistic sampling probs ``[B, κ, V]`` fp32 (q after the rows' temperature/top-k/top-p).
        """
        B = batch.batch_size
        dev = batch.tokens.device
        act = batch.active
        seq = batch.seq_lens
        # feed the history from the first position without the right draft KV up to the pending token
        start = torch.minimum(self.synced[:B], seq - 1).clamp(min=0)  # [B]
        count = torch.where(act, seq - start, torch.ones_like(seq))  # [B] tokens to feed, >= 1
        width = self._widest(batch, count)
        col = torch.arange(width, device=dev).view(1, width)
        pos = (start.view(B, 1) + col).clamp(max=batch.tokens.shape[1] - 1)  # [B, w]
        ids = batch.tokens.gather(1, pos)  # [B, w]
        real = act.view(B, 1) & (col < count.view(B, 1))
        trash = torch.full_like(pos, batch.trash_slot)
        at = (count - 1).view(B, 1)  # [B, 1] the pending token's column
        logits, _ = self.model.forward(ids, torch.where(real, pos, pos[:, :1]), torch.where(real, pos, trash),
                                       None, logits_at=at)  # [B, 1, V]; the KV catch-up is this first pass
        self.forward_passes += 1
        self.synced[:B] = torch.where(act, seq, self.synced[:B])
        self._proposed_at = seq.clone()
        self._mirror_propose(batch)
        self._fed_drafts = True
        trash = trash[:, :1]
        probabilistic = sampling.mode == "probabilistic"
        toks, probs, conf = [], [], []
        cur_pos = (seq - 1).clamp(min=0).view(B, 1)  # [B, 1], position of the pending token
        for i in range(num_steps):
            if i > 0:
                cur_pos = cur_pos + 1
                slots = torch.where(act.view(B, 1), cur_pos, trash)
                logits, _ = self.model.forward(toks[-1].view(B, 1), cur_pos, slots, None)  # [B, 1, V]
                self.forward_passes += 1
            conf.append(torch.softmax(logits[:, 0], dim=-1).amax(dim=-1))  # [B] top draft probability
            if probabilistic:
                q = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)[:, 0]  # [B, V]
                tok = torch.div(q, sampling.exp_noise[:, i]).argmax(dim=-1)  # [B], exponential race
                probs.append(q)
            else:
                tok = logits[:, 0].argmax(dim=-1)  # [B]
            toks.append(tok)
        tokens = torch.stack(toks, dim=1) if toks else torch.zeros(B, 0, dtype=torch.int64, device=dev)
        return Proposal(tokens=tokens, num_valid=torch.full((B,), num_steps, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None,
                        confidence=torch.stack(conf, dim=1) if conf else None)

    @torch.inference_mode()
    def propose_block(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """PARD (Parallel Draft Model; vLLM ``draft_model`` with ``parallel_drafting``): one forward over
        the history not yet in the draft KV up to the pending token, followed by κ − 1 mask tokens at
        positions ``seq_len .. seq_len + κ − 2``; the pending token's output is draft 1 and mask m's
        output draft m + 1 (causal attention). The masks' KV is wrong history, so ``synced`` stops at
        the pending token and the next step re-feeds the accepted drafts (vLLM's K extra slots per
        request). Same return value as :meth:`propose`.

        Raises: CheckpointError when the draft has no mask token (not trained for parallel drafting).
        """
        if self.mask_token_id is None:
            raise CheckpointError(f"{self.source}: parallel drafting (PARD) needs a mask token in the draft's "
                                  f"config.json (pard_token / mask_token_id); this draft has none")
        B = batch.batch_size
        dev = batch.tokens.device
        act = batch.active
        seq = batch.seq_lens
        k = int(num_steps)
        start = torch.minimum(self.synced[:B], seq - 1).clamp(min=0)  # [B]
        count = torch.where(act, seq - start, torch.ones_like(seq))  # [B] history tokens to feed, >= 1
        hist = self._widest(batch, count)
        width = hist + k - 1
        col = torch.arange(width, device=dev).view(1, width)
        # history columns 0..count-1, then the κ-1 masks right after the pending token (per row)
        is_mask = (col >= count.view(B, 1)) & (col < (count + k - 1).view(B, 1))
        pos = (start.view(B, 1) + col).clamp(max=batch.trash_slot)  # [B, w]
        ids = batch.tokens.gather(1, pos.clamp(max=batch.tokens.shape[1] - 1))
        ids = torch.where(is_mask, torch.full_like(ids, self.mask_token_id), ids)
        real = act.view(B, 1) & (col < (count + k - 1).view(B, 1))
        trash = torch.full_like(pos, batch.trash_slot)
        at = ((count - 1).view(B, 1) + torch.arange(k, device=dev).view(1, k))  # [B, κ]
        logits, _ = self.model.forward(ids, torch.where(real, pos, pos[:, :1]), torch.where(real, pos, trash),
                                       None, logits_at=at)  # [B, κ, V]
        self.forward_passes += 1
        self.synced[:B] = torch.where(act, seq, self.synced[:B])
        self._proposed_at = seq.clone()
        self._mirror_propose(batch)
        self._fed_drafts = False
        conf = torch.softmax(logits, dim=-1).amax(dim=-1)  # [B, κ] top draft probability
        probs = None
        if sampling.mode == "probabilistic":
            from specc.kernels import process_logits

            probs = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)  # [B, κ, V]
            tokens = torch.div(probs, sampling.exp_noise[:B, :k]).argmax(dim=-1)
        else:
            tokens = logits.argmax(dim=-1)
        return Proposal(tokens=tokens, num_valid=torch.full((B,), k, dtype=torch.int64, device=dev),
                        probs=probs, confidence=conf)

    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """Drafts ``1 .. κ-1`` were fed at positions ``seq_len .. seq_len+κ-2`` during ``propose``; the
        accepted ones among them already hold the right KV: advance ``synced`` past them. After a
        PARD ``propose_block`` the fed positions held masks: ``synced`` stays at the pending token."""
        if step.num_steps == 0 or self._proposed_at is None:
            return
        B = step.accepted.shape[0]
        fed = torch.clamp(step.accepted.to(torch.int64), max=max(step.num_steps - 1, 0))  # [B]
        if not self._fed_drafts:
            fed = torch.zeros_like(fed)
        act = batch.active[:B]
        self.synced[:B] = torch.where(act, self._proposed_at[:B] + fed, self.synced[:B])
        self._proposed_at = None
        if batch.host is None or step.host is None or self._host_proposed_at is None or self.host_synced is None:
            self.host_synced = None  # not handed the host values: the mirror is unknown from here on
            return
        cap = max(step.num_steps - 1, 0) if self._fed_drafts else 0
        for b in range(B):
            if batch.host.active[b]:
                self.host_synced[b] = self._host_proposed_at[b] + min(int(step.host.accepted[b]), cap)
        self._host_proposed_at = None

    def _widest(self, batch: BatchView, count: torch.Tensor) -> int:
        """max(count): the history tokens the widest row feeds, from the host mirrors when both are
        known (no device read), else read from ``count`` ``[B]``."""
        host = batch.host
        if host is None or self.host_synced is None:
            return int(count.max())
        widest = 1
        for b, (on, seq) in enumerate(zip(host.active, host.seq_lens)):
            if on:
                widest = max(widest, seq - max(0, min(self.host_synced[b], seq - 1)))
        return widest

    def _mirror_propose(self, batch: BatchView) -> None:
        """The host side of a propose's ``synced`` update (live rows: their sequence length)."""
        host = batch.host
        if host is None or self.host_synced is None:
            self.host_synced = None
            self._host_proposed_at = None
            return
        for b, (on, seq) in enumerate(zip(host.active, host.seq_lens)):
            if on:
                self.host_synced[b] = seq
        self._host_proposed_at = list(host.seq_lens)


def check_same_token_map(draft_tokenizer, target_tokenizer, source: str) -> None:
    """Raise CheckpointError unless both tokenizers map every token string to the same id.

    Args: the two ``specc.models.tokenizer.Tokenizer`` objects; source: the draft's path for messages.
    """
    dv = draft_tokenizer.hf.get_vocab()
    tv = target_tokenizer.hf.get_vocab()
    if dv != tv:
        diff = sorted(set(dv.items()) ^ set(tv.items()))[:3]
        raise CheckpointError(
            f"{source}: the draft tokenizer's token map differs from the target's ({len(dv)} vs {len(tv)} "
            f"tokens; e.g. {diff}); draft_model speculation needs the same tokenizer")


def draft_dtype(target, device) -> str:
    """The draft model's dtype: ``native`` (its checkpoint's own bytes: a GGUF's codes, a safetensors
    checkpoint's fp16 / bf16 values, fp32 activations; ``specc.models.load_target``) on the CPU when the
    target runs in its own bytes too and the C kernels build here (``specc.kernels.qgemm.available``),
    else ``float32``. Greedy exactness does not depend on it: the drafter only proposes, the target
    verifies. ``target``: the loaded target ``LlamaModel``; ``device``: a device name or ``torch.device``."""
    from specc.kernels import qgemm
    from specc.models import torch_device_type
    from specc.models.llama import runs_native

    cpu = torch_device_type(device) == "cpu"
    return "native" if cpu and runs_native(target) and qgemm.available() else "float32"


def build_drafter(spec, target, tokenizer, device, max_seq_len=None) -> DraftModelDrafter:
    """Runtime factory of ``method.name: draft_model``: loads ``spec["draft"]["path"]`` (HF directory
    or GGUF; ``pkg://`` allowed) for at least ``max_seq_len`` cache slots, in :func:`draft_dtype`, and
    checks that its token map equals the target tokenizer's.

    Raises:
        PlanError: no ``draft.path``. CheckpointError: a missing checkpoint or one that does not match.
    """
    from specc.errors import PlanError
    from specc.models import load_target

    draft = spec.get("draft") or {}
    if not draft.get("path"):
        raise PlanError("method.name=draft_model needs draft.path (e.g. the draft preset smollm2_135m_shallow)")
    model, draft_tok = load_target(draft["path"], draft.get("format") or "hf", dtype=draft_dtype(target, device),
                                   max_model_len=max_seq_len, device=str(device))
    if draft_tok is not None and tokenizer is not None:
        check_same_token_map(draft_tok, tokenizer, str(draft["path"]))
    mask = None
    if (spec.get("method") or {}).get("parallel_drafting"):
        mask = parallel_mask_token(draft["path"], draft.get("format") or "hf", "PARD")
    return DraftModelDrafter(model, target.config.vocab_size, source=str(draft["path"]), mask_token_id=mask)


def parallel_mask_token(path: str, fmt: str, what: str) -> int:
    """The parallel-drafting mask token of a draft checkpoint's ``config.json`` (the keys vLLM 0.33.0
    reads: ``dflash_config.mask_token_id``, ``mask_token_id``, ``dspark_noise_token_id``, ``pard_token``,
    ``ptd_token_id``; ``llm_base_proposer.py:355-379``).

    Raises: CheckpointError when the config has none (vLLM refuses the same draft)."""
    from specc.models.checkpoints import MASK_TOKEN_KEYS, mask_token, read_checkpoint

    ck = read_checkpoint("draft.path", path, fmt)
    tok = mask_token(ck.config if ck is not None else None)
    if not isinstance(tok, int):
        raise CheckpointError(f"{path}: method.parallel_drafting ({what}) needs a draft trained for parallel drafting, "
                              f"with a mask token in its config.json ({', '.join(MASK_TOKEN_KEYS)}); this draft has "
                              f"none. Use such a draft (e.g. the draft preset smollm2_135m_pard) or set "
                              f"method.parallel_drafting=false")
    return tok
