"""``specc explain`` predicts, per candidate state, the drafter's forward passes per decode step in the
draft stage and in the extend stage (from the stage graph, counted at one iteration
boundary); the runtime counts them as it decodes (``SpecMetrics.draft_passes_per_step`` /
``extend_passes_per_step``). For every method and draft shape the runtime runs, the two agree."""
from __future__ import annotations

import pytest
import torch

from specc.commands.explain import explain
from specc.plan.schema import DraftConfig, MethodConfig, Plan, ScheduleConfig, VerifyConfig
from specc.check import resolve
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec

from tests.mtp_family_support import drafter_for, random_model
from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, random_head, tiny_target

MASK = V - 1  # the mask token of the parallel (PARD / P-EAGLE) drafters here

# (case, method config, the drafter)
CASES = {
    "plain": dict(name="none", num_steps=0),
    "ngram": dict(name="ngram", num_steps=3),
    "draft_model": dict(name="draft_model", num_steps=3),
    "pard": dict(name="draft_model", num_steps=3, parallel_drafting=True),
    "eagle": dict(name="eagle", num_steps=3),
    "eagle_k1": dict(name="eagle", num_steps=1),
    "eagle3": dict(name="eagle3", num_steps=4),
    "p_eagle": dict(name="eagle", num_steps=3, parallel_drafting=True),
    "eagle3_dynamic_tree": dict(name="eagle3", num_steps=3, topk=2, num_draft_tokens=6),
    "eagle_static_tree": dict(name="eagle", tree_choices=[[0], [1], [0, 0], [0, 0, 0]]),
    "medusa_chain": dict(name="medusa", num_steps=3),
    "medusa_tree": dict(name="medusa", tree_choices=[[0], [1], [0, 0]]),
    "dflash": dict(name="dflash", num_steps=3, block_size=3),
    "dspark": dict(name="dspark", num_steps=3, block_size=3),
    "mtp": dict(name="mtp", num_steps=3),
    "mtp_tree": dict(name="mtp", num_steps=3, topk=2, num_draft_tokens=6),
    "multi_layer_eagle": dict(name="multi_layer_eagle", num_steps=3),
    "frozen_kv_mtp": dict(name="frozen_kv_mtp", num_steps=3),
}


def _drafter(case: str, method: str, target):
    from specc.methods.dflash.drafter import BlockDrafter
    from specc.methods.draft_model.drafter import DraftModelDrafter
    from specc.methods.eagle.drafter import EagleDrafter
    from specc.methods.medusa.drafter import MedusaDrafter
    from specc.methods.ngram.drafter import NgramDrafter
    from specc.methods.dflash.model import random_block_drafter
    from specc.runtime.testing import perturbed_copy

    if method == "none":
        return None
    if method == "ngram":
        return NgramDrafter(1, 3)
    if method == "draft_model":
        return DraftModelDrafter(perturbed_copy(target, 0.02), V, mask_token_id=MASK)
    if method in ("eagle", "eagle3"):
        head = random_head(method, target, seed=2, draft_vocab=64 if method == "eagle3" else None)
        return EagleDrafter(head, target.config.num_layers, target.norm, mask_token_id=MASK)
    if method == "medusa":
        from tests.methods.test_medusa import random_heads
        return MedusaDrafter(random_heads(target, 3, 1, seed=1), target.config.num_layers, target.norm)
    if method in ("dflash", "dspark"):
        return BlockDrafter(random_block_drafter(target, kind=method, block_size=4, markov_rank=4 if method == "dspark"
                                                 else 0, markov_head_type="vanilla" if method == "dspark" else None,
                                                 confidence_head=method == "dspark", seed=1))
    return drafter_for(method, random_model(method, target, seed=4), target, 3)


@pytest.mark.parametrize("case", sorted(CASES))
def test_explain_predicts_the_passes_the_runtime_runs(case):
    cfg = CASES[case]
    draft = None if cfg["name"] in ("none", "ngram", "mtp") else DraftConfig(path="/nonexistent/draft")
    if cfg["name"] == "mtp":
        draft = DraftConfig(path="/nonexistent/mtp")
    plan = Plan(method=MethodConfig(**cfg), draft=draft, schedule=ScheduleConfig(capture_batch_sizes=[1]),
                verify=VerifyConfig(rule="greedy"))
    plan, violations = resolve(plan, "specc")
    res = explain(plan)
    (pred,) = [p for p in res["predictions"] if p.batch_size == 1]
    (state,) = [s for s in res["lowering"].states if s.batch_size == 1]
    target = tiny_target(seed=11)
    rt = Runtime(target, None, _drafter(case, cfg["name"], target), [StateSpec.from_candidate(state)],
                 max_model_len=96, eos_token_ids=[])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, V - 1, (n,), generator=g).tolist() for n in (5, 9)]
    rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=10)) for p in prompts], batch_size=1)
    m = rt.metrics
    assert m.decode_steps > 0
    assert (m.draft_passes_per_step, m.extend_passes_per_step) == (pred.draft_forward_passes,
                                                                   pred.extend_forward_passes), state.name
    assert pred.target_forward_passes == 1
