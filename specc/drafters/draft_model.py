"""Draft-model speculation: an independent small causal LM (its own embeddings, layers, head and KV
cache) proposes κ tokens autoregressively (Leviathan et al. 2023; vLLM ``draft_model``).

The draft KV cache is written by position like the target's. Each ``propose`` starts by running the
last two history tokens (positions ``seq_len-2``, ``seq_len-1``): after any verify outcome every
draft position before ``seq_len-2`` already holds the right KV (an accepted draft was fed at its
position; re-writing the token at ``seq_len-2`` is idempotent), and the one or two new tokens
(bonus, or last accepted draft + bonus when all were accepted — gpt-fast's "fill last token",
anchors A1) are absorbed in the same forward. So ``commit`` has nothing to do and the extend stage is
folded into the first draft step.
"""
from __future__ import annotations

from typing import Optional

import torch

from specc.drafters.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, check_same_vocab
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

    def __init__(self, model, target_vocab_size: int, source: str = "draft model", prefill_chunk: int = 512) -> None:
        check_same_vocab(model.config.vocab_size, target_vocab_size, source)
        self.model = model
        self.source = source
        self.prefill_chunk = int(prefill_chunk)

    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        if self.model.config.max_model_len < max_seq_len:
            raise CheckpointError(
                f"{self.source}: the draft model's max_model_len {self.model.config.max_model_len} is shorter "
                f"than the runtime's cache ({max_seq_len} slots); lower target.max_model_len")
        self.model.setup_cache(max_batch_size, max_seq_len)

    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Write the draft KV of the prompts of ``chunk.rows`` (others write to the trash slot)."""
        B, N = chunk.input_ids.shape
        slots = torch.where(chunk.rows.view(B, 1), chunk.cache_slots, torch.full_like(chunk.cache_slots, batch.trash_slot))
        step = max(16, self.prefill_chunk // B)
        at = torch.zeros(B, 1, dtype=torch.int64, device=chunk.input_ids.device)  # logits of one column only
        for c0 in range(0, N, step):
            c1 = min(N, c0 + step)
            self.model.forward(chunk.input_ids[:, c0:c1], chunk.positions[:, c0:c1], slots[:, c0:c1], None,
                               logits_at=at)

    @torch.inference_mode()
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """κ = ``num_steps`` autoregressive draft steps for every row.

        Returns tokens ``[B, κ]`` int64, num_valid ``[B]`` (= κ; the runtime clips per row), and for
        probabilistic sampling probs ``[B, κ, V]`` fp32 (q after the rows' temperature/top-k/top-p).
        """
        B = batch.batch_size
        dev = batch.tokens.device
        act = batch.active
        start = torch.where(act, batch.seq_lens - 2, torch.zeros_like(batch.seq_lens)).clamp(min=0)  # [B]
        pos = start.view(B, 1) + torch.arange(2, device=dev).view(1, 2)  # [B, 2]
        ids = batch.tokens.gather(1, pos)  # [B, 2] last committed token, pending token
        trash = torch.full_like(pos, batch.trash_slot)
        slots = torch.where(act.view(B, 1), pos, trash)
        at = torch.ones(B, 1, dtype=torch.int64, device=dev)
        logits, _ = self.model.forward(ids, pos, slots, None, logits_at=at)  # [B, 1, V]
        probabilistic = sampling.mode == "probabilistic"
        toks, probs = [], []
        cur_pos = pos[:, 1:]  # [B, 1], position of the pending token
        for i in range(num_steps):
            if i > 0:
                cur_pos = cur_pos + 1
                slots = torch.where(act.view(B, 1), cur_pos, trash[:, :1])
                logits, _ = self.model.forward(toks[-1].view(B, 1), cur_pos, slots, None)  # [B, 1, V]
            if probabilistic:
                q = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)[:, 0]  # [B, V]
                tok = torch.div(q, sampling.exp_noise[:, i]).argmax(dim=-1)  # [B], exponential race
                probs.append(q)
            else:
                tok = logits[:, 0].argmax(dim=-1)  # [B]
            toks.append(tok)
        tokens = torch.stack(toks, dim=1) if toks else torch.zeros(B, 0, dtype=torch.int64, device=dev)
        return Proposal(tokens=tokens, num_valid=torch.full((B,), num_steps, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None)


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
