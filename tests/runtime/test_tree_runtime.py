"""Tree drafting through the runtime: greedy output equals plain greedy decoding token for token with
EAGLE / EAGLE-3 dynamic trees (topk 2 and 4, depths 3 to 6, batch 1 and 4), static trees of several
shapes, and under every load-aware schedule; the KV-commit stage is what keeps it exact; the EAGLE
drafter's trees equal a cache-free recomputation, and its draft KV after tree steps equals the KV of a
plain forward over the committed history."""
from __future__ import annotations

import pytest
import torch

from specc.methods.base import BatchView, DraftSampling, PrefillChunk, StaticTree, TreeRequest
from specc.methods.eagle.drafter import EagleDrafter
from specc.compiler.lower import state_name
from specc.plan.schema import BucketConfig, MethodConfig, Plan, ScheduleConfig, VerifyConfig
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import (CopyTreeDrafter, perturbed_copy, quantized_copy, reference_greedy,
                                   runtime_for_plan, tiny_llama)
from specc.compiler.trees import compile_tree, normalize_choices

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, naive_greedy, oracle_eagle_head, random_head, tiny_target

STATIC_TREES = {
    "star": ((0,), (1,), (2,)),
    "chain": ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)),
    "binary3": ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (0, 0, 1), (1, 0, 0)),
    "medusa_like": ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (0, 0, 0),
                    (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)),
}


def _prompts(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _spec(kind, k, b, topk, w, tc=None, rule="greedy"):
    return StateSpec(name=state_name(b, k, topk, w, rule, "greedy", False, tc), method=kind, batch_size=b,
                     num_steps=k, topk=topk, num_draft_tokens=w, verify_rule=rule, tree_choices=tc)


def _run(target, drafter, spec, prompts, n_new, b):
    rt = Runtime(target, None, drafter, [spec], max_model_len=128, eos_token_ids=[])
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n_new)) for p in prompts],
                       batch_size=b)
    return outs, rt


# ------------------------------------------------------------------------- EAGLE dynamic trees

@pytest.mark.parametrize("k,topk,w", [(3, 2, 6), (4, 4, 12), (5, 2, 10), (6, 4, 16)])
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_dynamic_tree_greedy_equals_plain_greedy_random_heads(kind, k, topk, w, b):
    target = tiny_target(seed=k)
    head = random_head(kind, target, seed=10 + k, draft_vocab=64)
    prompts = _prompts(5, seed=k)  # 5 prompts at batch 4: a freed row is refilled mid-run
    outs, _ = _run(target, EagleDrafter(head, target.config.num_layers, target.norm), _spec(kind, k, b, topk, w),
                   prompts, 14, b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 14)


@pytest.mark.parametrize("k,topk,w", [(3, 2, 7), (5, 4, 12)])
@pytest.mark.parametrize("b", [1, 4])
def test_dynamic_tree_partial_acceptance_takes_other_children(k, topk, w, b):
    """A near-exact head: its top-1 draft is sometimes wrong while a sibling is right, so accepted
    paths leave the first children (accept_index not 0, 1, 2, ...); output stays exact."""
    target = tiny_target(seed=3, identity_layers=True)
    head = oracle_eagle_head(target)
    with torch.no_grad():
        head.fc.weight[:, head.cfg.hidden_size:].normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    drafter = EagleDrafter(head, target.config.num_layers, target.norm)
    seen = []
    commit = drafter.commit

    def spy(batch, step):
        seen.append(step.accept_index.clone())
        commit(batch, step)

    drafter.commit = spy
    prompts = _prompts(4, seed=11)
    outs, rt = _run(target, drafter, _spec("eagle", k, b, topk, w), prompts, 24, b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 24)
    idx = torch.cat([s[:, 1] for s in seen if s.shape[1] > 1])
    assert (idx > 1).any()  # a first-level node other than node 1 was accepted
    assert 0 < rt.metrics.num_accepted_tokens


# ------------------------------------------------------------------------- static trees

@pytest.mark.parametrize("tree", sorted(STATIC_TREES))
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_static_tree_greedy_equals_plain_greedy(kind, tree, b):
    tc = normalize_choices(STATIC_TREES[tree])
    target = tiny_target(seed=4)
    head = random_head(kind, target, seed=21, draft_vocab=64)
    k = max(len(p) for p in tc)
    topk = max(max(p) for p in tc) + 1
    prompts = _prompts(5, seed=4)
    outs, _ = _run(target, EagleDrafter(head, target.config.num_layers, target.norm),
                   _spec(kind, k, b, topk, len(tc) + 1, tc), prompts, 13, b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 13)


def test_static_tree_with_an_exact_head_accepts_its_deepest_path():
    tc = normalize_choices(STATIC_TREES["medusa_like"])
    target = tiny_target(seed=2, identity_layers=True)
    head = oracle_eagle_head(target)
    prompts = _prompts(3, seed=2)
    outs, rt = _run(target, EagleDrafter(head, target.config.num_layers, target.norm),
                    _spec("eagle", 5, 3, 4, len(tc) + 1, tc), prompts, 25, 3)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 25)
    assert rt.metrics.acceptance_per_pos[4] > 0.5  # the depth-5 node of the first-rank path


# ------------------------------------------------------------------------- a context-dependent target, every schedule

PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39)),
           [7, 7, 8, 7, 7, 8], list(range(40, 52)), [2, 3], [11, 12, 13, 11, 12, 13, 11]]
NEW = [30, 5, 26, 19, 33, 12, 40, 21]
CPU_TABLE = {"verify_ms": {str(n): 10.0 + 3.0 * n for n in range(1, 257)}, "draft_ms": {"1": 2.0, "16": 4.0},
             "capture_limit": 256}
SCHEDULES = {
    "static": ScheduleConfig(capture_batch_sizes=[1, 2, 4]),
    "adaptive": ScheduleConfig(kind="adaptive", warmup_batches=0, update_interval=1, capture_batch_sizes=[1, 2, 4],
                               buckets={1: BucketConfig([0, 2, 4], down_hysteresis=0.0),
                                        4: BucketConfig([0, 1, 3])}),
    "batch_buckets": ScheduleConfig(kind="batch_buckets", capture_batch_sizes=[1, 2, 4],
                                    buckets={1: BucketConfig([4]), 2: BucketConfig([2]), 3: BucketConfig([1])}),
    "budget": ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="cpu.json",
                             capture_batch_sizes=[1, 2, 4]),
    "budget_cap_accept": ScheduleConfig(kind="budget", ragged_verify="cap_accept", cost_table="cpu.json",
                                        capture_batch_sizes=[1, 2, 4]),
}
TREES = {"dynamic": MethodConfig(name="eagle", num_steps=4, topk=2, num_draft_tokens=9),
         "static": MethodConfig(name="eagle", tree_choices=[list(p) for p in STATIC_TREES["binary3"]] + [[0, 0, 0, 0]])}


@pytest.fixture(scope="module", params=["fp32", "native", "native-f16"])
def copy_models(request):
    """fp32, the target in GGML codes (Q4_1 / Q8_0) and in fp16 bytes, through the C layer parts: tree
    verify with its explicit masks must be exact for each."""
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    draft = perturbed_copy(target, noise=0.03, seed=1)
    if request.param == "native":
        return quantized_copy(target), quantized_copy(draft)
    if request.param == "native-f16":
        return (quantized_copy(target, type_name="F16", head_type="F16"),
                quantized_copy(draft, type_name="F16", head_type="F16"))
    return target, draft


@pytest.fixture(scope="module")
def copy_refs(copy_models):
    return [reference_greedy(copy_models[0], p, n) for p, n in zip(PROMPTS, NEW)]


def _requests():
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n)) for p, n in zip(PROMPTS, NEW)]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("kind", sorted(SCHEDULES))
@pytest.mark.parametrize("tree", sorted(TREES))
def test_tree_is_exact_under_every_schedule(copy_models, copy_refs, tree, kind, batch_size):
    target, draft = copy_models
    plan = Plan(method=TREES[tree], schedule=SCHEDULES[kind])
    rt = runtime_for_plan(plan, target, CopyTreeDrafter(draft), cost_table=CPU_TABLE)
    out = rt.generate(_requests(), batch_size=batch_size)  # 8 requests: refills below batch 8
    assert [o.token_ids for o in out] == copy_refs
    assert rt.metrics.num_accepted_tokens > 0
    if kind == "adaptive":
        assert rt.metrics.num_kappa_switches > 0


def test_the_kv_commit_is_what_keeps_trees_exact(copy_models, copy_refs, monkeypatch):
    """The accepted path's KV is moved (the copies happen), and without the move the output drifts."""
    target, draft = copy_models
    plan = Plan(method=TREES["dynamic"], schedule=SCHEDULES["static"])
    moved = []
    real = target.copy_kv

    def count(src, dst, rows=None):
        moved.append(int((src != dst).sum()))
        real(src, dst, rows)

    monkeypatch.setattr(target, "copy_kv", count)
    out = runtime_for_plan(plan, target, CopyTreeDrafter(draft)).generate(_requests(), batch_size=4)
    assert [o.token_ids for o in out] == copy_refs and sum(moved) > 10
    monkeypatch.setattr(target, "copy_kv", lambda src, dst, rows=None: None)
    out = runtime_for_plan(plan, target, CopyTreeDrafter(draft)).generate(_requests(), batch_size=4)
    assert [o.token_ids for o in out] != copy_refs


def test_standard_rule_at_temperature_zero_is_greedy_on_trees(copy_models, copy_refs):
    target, draft = copy_models
    for tree in TREES.values():
        plan = Plan(method=tree, verify=VerifyConfig(rule="standard"), schedule=SCHEDULES["static"])
        out = runtime_for_plan(plan, target, CopyTreeDrafter(draft)).generate(_requests(), batch_size=4)
        assert [o.token_ids for o in out] == copy_refs


# ------------------------------------------------------------------------- EAGLE trees vs a cache-free recomputation

def _prefilled(kind, seed=5, b=2):
    """A target, an EAGLE drafter prefilled on ``b`` prompts, and the batch view after the first token."""
    target = tiny_target(seed=seed)
    head = random_head(kind, target, seed=seed + 1, draft_vocab=64, scale=0.5)
    drafter = EagleDrafter(head, target.config.num_layers, target.norm)
    prompts = [p[:6] + [1] * (6 - len(p[:6])) for p in _prompts(b, seed=seed)]
    L = len(prompts[0])
    target.setup_cache(b, 64)
    drafter.setup(b, 64, torch.device("cpu"))
    ids = torch.tensor(prompts)
    pos = torch.arange(L).expand(b, L)
    with torch.no_grad():
        logits, hidden = target.forward(ids, pos, hidden_layers=drafter.hidden_layers)
    first = logits[:, -1].argmax(-1)
    tokens = torch.zeros(b, 64, dtype=torch.int64)
    tokens[:, :L] = ids
    tokens[:, L] = first
    batch = BatchView(tokens=tokens, seq_lens=torch.full((b,), L + 1), active=torch.ones(b, dtype=torch.bool),
                      prompt_lens=torch.full((b,), L), max_draft=torch.full((b,), 8),
                      temperature=torch.zeros(b), top_p=torch.ones(b), top_k=torch.zeros(b, dtype=torch.int64),
                      trash_slot=63)
    drafter.prefill(batch, PrefillChunk(input_ids=ids, positions=pos, cache_slots=pos.clone(),
                                        rows=torch.ones(b, dtype=torch.bool), target_hidden=hidden))
    return target, head, drafter, batch, hidden, tokens[:, 1:L + 1]


def _head_out(head, drafter, hidden, next_tokens, path_g, path_tokens):
    """The head's output at the last of (prefix pairs, path pairs), computed without a cache."""
    feats = drafter._features(hidden)  # [B, L, F]
    with torch.no_grad():
        if head.cfg.kind == "eagle3":
            pre = head.fc(feats)
        else:
            pre = feats
        seq_f = torch.cat([pre, path_g], dim=1) if path_g is not None else pre
        seq_t = torch.cat([next_tokens, path_tokens], dim=1) if path_tokens is not None else next_tokens
        pos = torch.arange(seq_t.shape[1]).expand(seq_t.shape[0], -1)
        return head(seq_t, seq_f, pos, cache=None, from_target=head.cfg.kind == "eagle")[:, -1]


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@torch.no_grad()
def test_eagle_dynamic_tree_equals_a_cache_free_recomputation(kind):
    target, head, drafter, batch, hidden, nxt = _prefilled(kind)
    k, topk, n = 4, 3, 12
    prop = drafter.propose_tree(batch, TreeRequest(k, topk, n), DraftSampling())
    b = batch.batch_size
    for r in range(b):
        # SGLang's tree, every node's output from a full forward over its path
        h, nt = hidden_row = [x[r:r + 1] for x in hidden], nxt[r:r + 1]
        g_root = _head_out(head, drafter, h, nt, None, None)  # [1, H]
        lp = torch.log_softmax(head.draft_logits(g_root).float(), -1)[0]
        sc, ids = lp.topk(topk)
        pool = [(float(sc[i]), int(head.draft_to_target(ids[i])), -1, 1) for i in range(topk)]
        beams = [(float(sc[i]), i, [int(head.draft_to_target(ids[i]))], [g_root[0]]) for i in range(topk)]
        for level in range(1, k):
            cands = []
            for score, pidx, path, gs in beams:
                g = _head_out(head, drafter, h, nt, torch.stack(gs).unsqueeze(0), torch.tensor([path]))
                lp = torch.log_softmax(head.draft_logits(g).float(), -1)[0]
                csc, cid = lp.topk(topk)
                for j in range(topk):
                    tok = int(head.draft_to_target(cid[j]))
                    pool.append((score + float(csc[j]), tok, pidx, level + 1))
                    cands.append((score + float(csc[j]), len(pool) - 1, path + [tok], gs + [g[0]]))
            cands.sort(key=lambda c: -c[0])
            beams = cands[:topk]
        order = sorted(range(len(pool)), key=lambda i: (-pool[i][0], i))[:n]
        rank = {p: i for i, p in enumerate(order)}
        assert prop.tokens[r].tolist() == [pool[i][1] for i in order]
        assert prop.depths[r].tolist() == [pool[i][3] for i in order]
        assert prop.parents[r].tolist() == [0 if pool[i][2] < 0 else rank[pool[i][2]] + 1 for i in order]
        torch.testing.assert_close(prop.confidence[r], torch.tensor([pool[i][0] for i in order]).exp(),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@torch.no_grad()
def test_eagle_static_tree_equals_a_cache_free_recomputation(kind):
    target, head, drafter, batch, hidden, nxt = _prefilled(kind, seed=8)
    tc = normalize_choices(STATIC_TREES["binary3"])
    st = StaticTree.from_buffers(compile_tree(tc), torch.device("cpu"))
    prop = drafter.propose_tree(batch, TreeRequest(3, 2, st.num_nodes, st), DraftSampling())
    index = {(): 0, **{p: i + 1 for i, p in enumerate(tc)}}
    for r in range(batch.batch_size):
        h, nt = [x[r:r + 1] for x in hidden], nxt[r:r + 1]
        tok = {(): None}
        gs = {(): _head_out(head, drafter, h, nt, None, None)[0]}
        for p in tc:  # depth order: the parent's output is known
            parent = p[:-1]
            ranked = head.draft_logits(gs[parent].view(1, 1, -1))[0, 0].topk(st.topk).indices
            tok[p] = int(head.draft_to_target(ranked[p[-1]]))
            path = [p[:d] for d in range(1, len(p) + 1)]
            gs[p] = _head_out(head, drafter, h, nt, torch.stack([gs[q[:-1]] for q in path]).unsqueeze(0),
                              torch.tensor([[tok[q] for q in path]]))[0]
            assert int(prop.tokens[r, index[p] - 1]) == tok[p], (r, p)


@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_eagle_draft_kv_after_tree_steps_equals_a_plain_forward(tree):
    """After decoding with trees, the head's KV at every committed draft position equals the KV of one
    cache-free pass over the whole committed history (target features from one plain forward): the
    KV commit hands the drafter the right path (tokens and the tree verify's hidden states)."""
    target = tiny_target(seed=6)
    head = random_head("eagle3", target, seed=7, draft_vocab=64, scale=0.3)
    drafter = EagleDrafter(head, target.config.num_layers, target.norm)
    tc = normalize_choices(STATIC_TREES["binary3"]) if tree == "static" else None
    spec = _spec("eagle3", 3, 3, 2, len(tc) + 1 if tc else 8, tc)
    prompts = _prompts(3, seed=6)
    rt = Runtime(target, None, drafter, [spec], max_model_len=128, eos_token_ids=[])
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=20)) for p in prompts], batch_size=3)
    for row, (p, o) in enumerate(zip(prompts, outs)):
        full = p + o.token_ids
        committed = min(int(drafter.last_pos[row]) + 1, len(full) - 1)  # pairs 0..committed-1
        ids = torch.tensor([full])
        pos = torch.arange(len(full)).view(1, -1)
        target.setup_cache(4, 160)
        with torch.no_grad():
            _, hidden = target.forward(ids, pos, hidden_layers=drafter.hidden_layers)
            cache = head.new_cache(1, 160)
            head(ids[:, 1:committed + 1], drafter._features([h[:, :committed] for h in hidden]),
                 pos[:, :committed], cache=cache)
        torch.testing.assert_close(drafter.cache.k[row, :, :committed], cache.k[0, :, :committed], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(drafter.cache.v[row, :, :committed], cache.v[0, :, :committed], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["adaptive", "budget"])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_eagle_trees_under_load_aware_schedules(tree, kind):
    """The EAGLE drafter's own KV stays in sync when the adaptive controller switches κ (and tree)
    every step, or the budget trims the tree to a prefix: output equals plain greedy."""
    target = tiny_target(seed=9, identity_layers=True)
    head = oracle_eagle_head(target)
    with torch.no_grad():
        head.fc.weight[:, head.cfg.hidden_size:].normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    prompts = _prompts(6, seed=9)
    plan = Plan(method=TREES[tree], schedule=SCHEDULES[kind])
    rt = runtime_for_plan(plan, target, EagleDrafter(head, target.config.num_layers, target.norm),
                          cost_table=CPU_TABLE)
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=18)) for p in prompts],
                       batch_size=4)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 18)
    assert rt.metrics.num_accepted_tokens > 0
    if kind == "adaptive":
        assert rt.metrics.num_kappa_switches > 0
