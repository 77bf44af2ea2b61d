"""The runtime on CUDA (skipped without it): every state's verify + accept captured as a CUDA graph
at load, and greedy output through the captured programs equal to plain greedy decoding under the
adaptive controller and the budget (run by tools/gpu_check on a lent GPU machine)."""
import pytest
import torch

from specc.drafters.draft_model import DraftModelDrafter
from specc.plan.schema import BucketConfig, MethodConfig, Plan, ScheduleConfig
from specc.runtime.loader import runtime_from_plan
from specc.runtime.request import Request, SamplingParams
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39))]


@pytest.mark.parametrize("schedule", [
    ScheduleConfig(kind="adaptive", warmup_batches=0, update_interval=1, capture_batch_sizes=[1, 2, 4],
                   buckets={1: BucketConfig([0, 1, 3]), 4: BucketConfig([0, 2])}),
    ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="t.json", capture_batch_sizes=[1, 2, 4]),
])
def test_captured_states_decode_exactly(schedule):
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2).to("cuda")
    draft = perturbed_copy(target, noise=0.03, seed=1).to("cuda")
    refs = [reference_greedy(target, p, 24) for p in PROMPTS]
    plan = Plan(method=MethodConfig(name="draft_model", num_steps=3), schedule=schedule)
    table = {"verify_ms": {str(n): 1.0 + 0.2 * n for n in range(1, 64)}, "capture_limit": 1}
    rt = runtime_from_plan(plan, target, None, DraftModelDrafter(draft, 64), cost_table=table, max_model_len=96,
                           device=torch.device("cuda"))
    # use_cuda_graphs is off in runtime_from_plan: switch it on and capture every state, as load does
    rt.ctx.use_cuda_graphs = True
    assert all(s.capture() for s in rt.states)
    out = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=24)) for p in PROMPTS], batch_size=4)
    assert [o.token_ids for o in out] == refs
