"""Small models and a reference decoder for tests and benchmarks of the runtime (no downloads).

``tiny_llama`` builds a random Llama-family model quickly; ``perturbed_copy`` a draft that agrees
with it often but not always; ``reference_greedy`` decodes one prompt token by token with
``LlamaModel.forward`` only — an oracle independent of the runtime's batching, routing, drafting
and verification.
"""
from __future__ import annotations

import copy
from typing import List, Optional, Sequence

import torch

from specc.models.config import LlamaConfig
from specc.models.llama import LlamaModel


def tiny_llama(seed: int = 0, vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2,
               max_model_len: int = 256, std: float = 0.3) -> LlamaModel:
    """A random ``LlamaModel`` (4 heads, 2 KV heads, head_dim 8), weights ~ N(0, std²), norms 1.

    ``std`` sets how peaked its next-token distributions are (0.3: varied, not uniform).
    Returns an eval-mode fp32 CPU model with the numpy fast path on, no cache set up.
    """
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=hidden_size // 4,
                      max_model_len=max_model_len, max_position_embeddings=max_model_len)
    gen = torch.Generator().manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.eval().requires_grad_(False)
    return model.use_cpu_fast()


def perturbed_copy(model: LlamaModel, noise: float, seed: int = 1) -> LlamaModel:
    """A deep copy of ``model`` with N(0, noise²) added to every weight: a draft model with the same
    vocabulary whose proposals the target accepts often but not always."""
    gen = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    draft.max_batch_size = draft.max_seq_len = 0
    return draft.use_cpu_fast()


@torch.inference_mode()
def reference_greedy(model: LlamaModel, prompt: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int] = (), max_model_len: Optional[int] = None) -> List[int]:
    """Plain greedy decoding of one prompt: prefill, then one forward per token (batch 1, row 0).

    Stops after ``max_new_tokens`` tokens, after an EOS token (included), or when prompt + output
    reach ``max_model_len``. Returns the generated ids. Uses (and overwrites) cache row 0.
    """
    limit = int(max_model_len or model.config.max_model_len)
    model.setup_cache(1, limit)
    ids = torch.tensor([list(prompt)], dtype=torch.int64)
    pos = torch.arange(ids.shape[1]).view(1, -1)
    logits, _ = model.forward(ids, pos)
    out: List[int] = []
    n = ids.shape[1]
    while True:
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        n += 1
        if len(out) >= max_new_tokens or tok in eos_token_ids or n >= limit:
            return out
        logits, _ = model.forward(torch.tensor([[tok]]), torch.tensor([[n - 1]]))


def shallow_copy(model: LlamaModel, num_layers: int) -> LlamaModel:
    """A draft made from a target without training: its first ``num_layers`` decoder layers, final
    norm, embeddings and head (the recipe of ``specc.models.shallow``), as a separate in-memory model
    with its own KV cache."""
    draft = copy.deepcopy(model)
    draft.layers = torch.nn.ModuleList(list(draft.layers)[:num_layers])
    draft.config = draft.config.replace(num_layers=num_layers)
    draft.max_batch_size = draft.max_seq_len = 0
    return draft


def runtime_for_plan(plan, target, drafter, *, cost_table: Optional[dict] = None, max_model_len: int = 128,
                     seed: int = 0, tokenizer=None, prefill_chunk: int = 512):
    """:func:`specc.runtime.loader.runtime_from_plan` with test defaults (no tokenizer, 128 tokens)."""
    from specc.runtime.loader import runtime_from_plan

    return runtime_from_plan(plan, target, tokenizer, drafter, cost_table=cost_table, max_model_len=max_model_len,
                             seed=seed, prefill_chunk=prefill_chunk)
