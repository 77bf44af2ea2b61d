"""Runtimes of every drafter configuration the runtime tests build cheaply (no tests here), for the
host-read checks of ``tests/runtime/test_step_io.py``: each builder returns ``(runtime, requests)`` on small
random models (``specc.runtime.testing.tiny_llama``, ``test_eagle_support.tiny_target``) with a
mix of prompts; ``SAMPLED`` marks the ones whose requests sample (temperature > 0, seeded)."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch

from specc.compiler.lower import state_name
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, tiny_llama

PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [1, 2, 3, 1, 2, 3, 1, 2]]
NEW = [9, 12, 14, 10]
BATCH = 2
"""Rows per step (two buckets below: 1 and 2)."""


def requests(vocab: int = 64, temperature: float = 0.0) -> List[Request]:
    return [Request(prompt_ids=[t % vocab for t in p],
                    params=SamplingParams(max_new_tokens=n, temperature=temperature, seed=i if temperature else None),
                    request_id=f"r{i}") for i, (p, n) in enumerate(zip(PROMPTS, NEW))]


def _chain_specs(method: str, k: int, rule: str = "greedy", sampling: str = "greedy", parallel: bool = False):
    return [StateSpec(f"b{b}_k{k}_{rule}_{sampling}{'_parallel' if parallel else ''}", method, b, k,
                      num_draft_tokens=k + 1, verify_rule=rule, draft_sampling=sampling, parallel=parallel)
            for b in (1, BATCH)]


def _tree_spec(method: str, k: int, topk: int, w: int, tc=None, rule: str = "greedy", parallel: bool = False):
    return [StateSpec(name=state_name(b, k, topk, w, rule, "greedy", parallel, tc), method=method, batch_size=b,
                      num_steps=k, topk=topk, num_draft_tokens=w, verify_rule=rule, tree_choices=tc,
                      parallel=parallel) for b in (1, BATCH)]


def _rt(target, drafter, specs) -> Runtime:
    return Runtime(target, None, drafter, specs, max_model_len=128, eos_token_ids=[])


def plain():
    t = tiny_llama(seed=0)
    return _rt(t, None, [StateSpec(f"b{b}_k0", "none", b, 0, num_draft_tokens=1) for b in (1, BATCH)]), requests()


def ngram():
    from specc.methods.ngram.drafter import NgramDrafter
    return _rt(tiny_llama(seed=0), NgramDrafter(1, 3), _chain_specs("ngram", 3)), requests()


def suffix():
    from specc.methods.suffix.drafter import SuffixDrafter
    d = SuffixDrafter(max_tree_depth=8, max_cached_requests=64, max_spec_factor=2.0, min_token_prob=0.05)
    return _rt(tiny_llama(seed=0), d, _chain_specs("suffix", 3)), requests()


def draft_model_greedy():
    from specc.methods.draft_model.drafter import DraftModelDrafter
    t = tiny_llama(seed=0)
    return _rt(t, DraftModelDrafter(perturbed_copy(t, 0.03, seed=1), 64), _chain_specs("draft_model", 3)), requests()


def draft_model_sampled():
    from specc.methods.draft_model.drafter import DraftModelDrafter
    t = tiny_llama(seed=0)
    specs = _chain_specs("draft_model", 3, rule="standard", sampling="probabilistic")
    return _rt(t, DraftModelDrafter(perturbed_copy(t, 0.03, seed=1), 64), specs), requests(temperature=1.0)


def ngram_sampled():
    from specc.methods.ngram.drafter import NgramDrafter
    return (_rt(tiny_llama(seed=0), NgramDrafter(1, 3), _chain_specs("ngram", 3, rule="standard")),
            requests(temperature=0.8))


def _eagle(kind: str):
    from specc.methods.eagle.drafter import EagleDrafter
    from tests.test_eagle_support import random_head, tiny_target
    t = tiny_target(seed=3)
    return t, EagleDrafter(random_head(kind, t, seed=4), t.config.num_layers, t.norm)


def eagle_chain():
    t, d = _eagle("eagle")
    return _rt(t, d, _chain_specs("eagle", 3)), requests(t.config.vocab_size)


def eagle3_tree():
    t, d = _eagle("eagle3")
    return _rt(t, d, _tree_spec("eagle3", 3, 2, 6)), requests(t.config.vocab_size)


def eagle_static_tree():
    from specc.compiler.trees import normalize_choices
    t, d = _eagle("eagle")
    tc = normalize_choices(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    return _rt(t, d, _tree_spec("eagle", 3, 2, len(tc) + 1, tc)), requests(t.config.vocab_size)


def medusa_chain():
    from specc.methods.medusa.drafter import MedusaDrafter
    from tests.test_eagle_support import tiny_target
    from tests.methods.test_medusa import random_heads
    t = tiny_target(seed=7)
    d = MedusaDrafter(random_heads(t, 4, 1, seed=8, scale=0.1), t.config.num_layers, t.norm)
    return _rt(t, d, _tree_spec("medusa", 3, 1, 4, None, parallel=True)), requests(t.config.vocab_size)


def medusa_tree():
    from specc.methods.medusa.drafter import MedusaDrafter
    from specc.compiler.trees import normalize_choices
    from tests.test_eagle_support import tiny_target
    from tests.methods.test_medusa import random_heads
    t = tiny_target(seed=7)
    d = MedusaDrafter(random_heads(t, 4, 1, seed=8, scale=0.1), t.config.num_layers, t.norm)
    tc = normalize_choices(((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)))
    return _rt(t, d, _tree_spec("medusa", 2, 2, len(tc) + 1, tc)), requests(t.config.vocab_size)


def _mtp(method: str):
    from tests.mtp_family_support import drafter_for, random_model
    from tests.test_eagle_support import tiny_target
    t = tiny_target(seed=5)
    d = drafter_for(method, random_model(method, t, 3, seed=6), t, 3)
    specs = [StateSpec(f"b{b}_k3_topk1_w4_greedy_chain", method, b, 3, topk=1, num_draft_tokens=4)
             for b in (1, BATCH)]
    return _rt(t, d, specs), requests(t.config.vocab_size)


def mtp():
    return _mtp("mtp")


def multi_layer_eagle():
    return _mtp("multi_layer_eagle")


def frozen_kv_mtp():
    return _mtp("frozen_kv_mtp")


def dflash():
    from specc.methods.dflash.drafter import BlockDrafter
    from specc.methods.dflash.model import random_block_drafter
    t = tiny_llama(seed=0)
    model = random_block_drafter(t, kind="dflash", block_size=8, mask_token_id=63, seed=1)
    return _rt(t, BlockDrafter(model), _chain_specs("dflash", 3, parallel=True)), requests()


def eagle_tree_budget():
    """An EAGLE dynamic tree under the budget schedule (the verify budget chosen on the device)."""
    from specc.plan.schema import MethodConfig, Plan, ScheduleConfig
    from specc.runtime.testing import runtime_for_plan
    t, d = _eagle("eagle")
    table = {"verify_ms": {str(n): 10.0 + 3.0 * n for n in range(1, 257)}, "draft_ms": {"1": 2.0, "16": 4.0},
             "capture_limit": 256}
    plan = Plan(method=MethodConfig(name="eagle", num_steps=3, topk=2, num_draft_tokens=6),
                schedule=ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="cpu.json",
                                        capture_batch_sizes=[1, 2]))
    return runtime_for_plan(plan, t, d, cost_table=table), requests(t.config.vocab_size)


CONFIGS: Dict[str, Callable[[], Tuple[Runtime, List[Request]]]] = {
    "plain": plain, "ngram": ngram, "suffix": suffix, "draft_model": draft_model_greedy,
    "draft_model_sampled": draft_model_sampled, "ngram_sampled": ngram_sampled, "eagle_chain": eagle_chain,
    "eagle3_tree": eagle3_tree, "eagle_static_tree": eagle_static_tree, "medusa_chain": medusa_chain,
    "medusa_tree": medusa_tree, "mtp": mtp, "multi_layer_eagle": multi_layer_eagle,
    "frozen_kv_mtp": frozen_kv_mtp, "dflash": dflash, "eagle_tree_budget": eagle_tree_budget,
}
