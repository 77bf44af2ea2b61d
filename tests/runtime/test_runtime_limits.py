"""The runtime honours per-request limits — EOS, stop strings, max_new_tokens, max_model_len — while
speculating, routes batches to states by bucket, and refuses bad input with clear errors."""
import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter, ngram_lookup
from specc.errors import ArtifactError, PromptError
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

PROMPT = [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12]


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=0, vocab_size=64)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, noise=0.02, seed=1)


class LetterTokenizer:
    """Token t decodes to one letter (t mod 26); enough to test stop strings."""

    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + int(t) % 26) for t in ids)


def _rt(target, draft, k, buckets=(1, 4), max_model_len=128, tokenizer=None, method="draft_model", **kw):
    drafter = DraftModelDrafter(draft, 64) if (k and method == "draft_model") else (NgramDrafter(1, 3) if k else None)
    specs = [StateSpec(f"b{b}_k{k}", method if k else "none", b, k, num_draft_tokens=k + 1) for b in buckets]
    return Runtime(target, tokenizer, drafter, specs, max_model_len=max_model_len, **kw)


@pytest.mark.parametrize("k", [0, 5])
def test_max_model_len_clips_drafts(target, draft, k):
    limit = 40
    prompt = PROMPT + list(range(30, 48))  # 30 tokens: room for 10
    rt = _rt(target, draft, k, max_model_len=limit)
    assert rt.max_model_len == limit
    out = rt.generate([Request(prompt_ids=prompt, params=SamplingParams(max_new_tokens=50))])[0]
    assert out.finish_reason == "max_model_len"
    assert len(prompt) + len(out.token_ids) == limit
    assert out.token_ids == reference_greedy(target, prompt, 50, max_model_len=limit)


def test_prompt_that_fills_the_context_is_refused(target, draft):
    rt = _rt(target, draft, 3, max_model_len=20)
    with pytest.raises(PromptError, match="max_model_len=20"):
        rt.generate([Request(prompt_ids=list(range(20)))])


@pytest.mark.parametrize("k", [0, 3])
def test_eos_ends_request_mid_step(target, draft, k):
    ref = reference_greedy(target, PROMPT, 30)
    eos = ref[7]
    first = ref.index(eos)
    rt = _rt(target, draft, k, eos_token_ids=[eos])
    out = rt.generate([Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=30))])[0]
    assert out.finish_reason == "eos"
    assert out.token_ids == ref[:first + 1]
    ignore = rt.generate([Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=30, ignore_eos=True))])[0]
    assert ignore.token_ids == ref


@pytest.mark.parametrize("k", [0, 5])
def test_stop_string_cuts_text_and_tokens(target, draft, k):
    tok = LetterTokenizer()
    ref = reference_greedy(target, PROMPT, 30)
    text = tok.decode(ref)
    stop = text[9:12]
    end = next(j for j in range(1, 31) if stop in tok.decode(ref[:j]))
    rt = _rt(target, draft, k, tokenizer=tok)
    out = rt.generate([Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=30, stop=(stop,)))])[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == ref[:end]
    assert out.text == text[:text.index(stop)]


def test_max_new_tokens_one_and_two(target, draft):
    rt = _rt(target, draft, 5)
    ref = reference_greedy(target, PROMPT, 2)
    outs = rt.generate([Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=n)) for n in (1, 2)],
                       batch_size=4)
    assert [o.token_ids for o in outs] == [ref[:1], ref]
    # the 2-token request had one verify step with no room for drafts: nothing was proposed
    assert outs[1].counters.num_steps == 1 and outs[1].counters.num_draft_tokens == 0


def test_routing_picks_smallest_bucket_that_fits(target, draft):
    rt = _rt(target, draft, 3, buckets=(1, 2, 4))
    assert [rt.route(n).spec.batch_size for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(RuntimeError):
        rt.route(5)
    # more requests than the largest bucket: admitted 4 at a time, outputs in order and exact
    prompts = [PROMPT[:n] for n in (1, 3, 5, 7, 9, 12)]
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=9)) for p in prompts],
                       batch_size=16)
    assert [o.token_ids for o in outs] == [reference_greedy(target, p, 9) for p in prompts]


def test_bad_requests_are_refused(target, draft):
    rt = _rt(target, draft, 3)
    with pytest.raises(PromptError, match="no tokens"):
        rt.generate([Request(prompt_ids=[])])
    with pytest.raises(PromptError, match="top_p"):
        rt.generate([Request(prompt_ids=[1], params=SamplingParams(top_p=0.0))])
    with pytest.raises(PromptError, match="outside the vocabulary"):
        rt.generate([Request(prompt_ids=[64])])
    # a greedy-verify plan samples a temperature > 0 request (by the standard rule) instead of refusing it
    out = rt.generate([Request(prompt_ids=[1], params=SamplingParams(max_new_tokens=4, temperature=0.7, seed=1))])
    assert len(out[0].token_ids) == 4


def test_unsupported_states_are_refused_at_build(target, draft):
    d = DraftModelDrafter(draft, 64)
    for spec, field, drafter in [
            (StateSpec("t", "draft_model", 1, 3, topk=2, num_draft_tokens=7), "topk", d),
            (StateSpec("b", "draft_model", 1, 3, topk=2, num_draft_tokens=7, verify_rule="block"), "tree", d),
            (StateSpec("w", "draft_model", 1, 3, num_draft_tokens=6, parallel=True), "parallel block verifies", d),
            (StateSpec("p", "ngram", 1, 3, num_draft_tokens=4, parallel=True), "parallel", NgramDrafter())]:
        with pytest.raises(ArtifactError, match=field):
            Runtime(target, None, drafter, [spec])
    with pytest.raises(ArtifactError, match="probabilistic"):
        Runtime(target, None, NgramDrafter(), [StateSpec("q", "ngram", 1, 3, num_draft_tokens=4,
                                                         verify_rule="standard", draft_sampling="probabilistic")])


def test_ngram_lookup_rule():
    import numpy as np

    h = np.array([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3], dtype=np.int64)
    # suffix [2, 3]: longest n (3: [5,2,3]) has no match; n = 2 matches at 1 and 5; the most recent wins
    assert ngram_lookup(h, 1, 3, 3).tolist() == [7, 5, 2]
    # the continuation is clipped by k and by the end of the history
    assert ngram_lookup(h, 1, 3, 1).tolist() == [7]
    assert ngram_lookup(np.array([4, 4], dtype=np.int64), 1, 3, 5).tolist() == [4]
    # longest first: [1,2,3] -> both [9 ...] (n=3 match at 0) rather than the n=1 match of 3
    h2 = np.array([1, 2, 3, 9, 8, 3, 6, 1, 2, 3], dtype=np.int64)
    assert ngram_lookup(h2, 1, 3, 2).tolist() == [9, 8]
    assert ngram_lookup(h2, 1, 1, 2).tolist() == [6, 1]
    assert ngram_lookup(np.array([5, 6, 7], dtype=np.int64), 1, 3, 4).tolist() == []


def test_metrics_report_stages_and_counters(target, draft):
    rt = _rt(target, draft, 3)
    rt.generate([Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=20))])
    d = rt.metrics.as_dict()
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos", "tau",
                "tokens_per_s"):
        assert key in d
    assert d["num_draft_tokens"] == 3 * d["num_drafts"] or d["num_draft_tokens"] < 3 * d["num_drafts"]
    assert all(d["stage_time_s"][s] > 0 for s in ("prefill", "draft", "verify", "accept"))
    assert d["num_output_tokens"] == 20
    per = rt.metrics.acceptance_per_pos
    assert all(a >= b for a, b in zip(per, per[1:]))  # a later position is accepted only after earlier ones


def test_draft_model_vocabulary_is_checked(target):
    from specc.methods.draft_model.drafter import check_same_token_map
    from specc.errors import CheckpointError

    other = tiny_llama(seed=5, vocab_size=48)
    with pytest.raises(CheckpointError, match="48 tokens but the target's has 64"):
        DraftModelDrafter(other, 64, source="draft/x")

    class Tok:
        def __init__(self, vocab):
            self.hf = type("HF", (), {"get_vocab": lambda _self: vocab})()

    check_same_token_map(Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1}), "d")
    with pytest.raises(CheckpointError, match="token map differs"):
        check_same_token_map(Tok({"a": 0, "b": 1}), Tok({"a": 1, "b": 0}), "d")


def test_per_position_counters_have_one_entry_per_draft_position(target, draft):
    # vLLM's num_accepted_tokens_per_pos has κ entries, zeros included, whatever the request did
    k = 3
    rt = _rt(target, draft, k)  # draft model: accepts often, not always
    assert rt.metrics.num_accepted_tokens_per_pos == [0] * k  # before any request
    reqs = [Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=24)),
            Request(prompt_ids=[20], params=SamplingParams(max_new_tokens=1)),  # no verify step at all
            Request(prompt_ids=list(range(20, 31)), params=SamplingParams(max_new_tokens=6))]
    outs = rt.generate(reqs, batch_size=1)
    assert outs[1].counters.num_steps == 0
    for out in outs:
        per = out.counters.num_accepted_tokens_per_pos
        assert len(per) == k and len(out.counters.as_dict()["num_accepted_tokens_per_pos"]) == k
        assert sum(per) == out.counters.num_accepted_tokens
        assert all(n <= out.counters.num_drafts for n in per)
    assert outs[1].counters.num_accepted_tokens_per_pos == [0, 0, 0]
    assert sum(o.counters.num_accepted_tokens for o in outs) > 0
    assert rt.metrics.num_accepted_tokens_per_pos == [sum(c) for c in zip(*(o.counters.num_accepted_tokens_per_pos
                                                                           for o in outs))]
    # plain decoding (κ = 0): no positions
    plain = _rt(target, draft, 0)
    assert plain.generate([Request(prompt_ids=PROMPT, params=SamplingParams(max_new_tokens=3))])[0] \
        .counters.num_accepted_tokens_per_pos == []


def test_generate_and_runtime_agree_on_max_model_len(target):
    """`specc generate` (generate_outputs) and `specc run` (Runtime) apply one rule: a prompt that fits
    stops at max_model_len with that finish reason; a prompt without room is refused by both."""
    from specc.runtime.plain import generate_outputs

    limit = 40
    model = tiny_llama(seed=0, vocab_size=64, max_model_len=limit)  # same weights as `target`, 40 cache slots
    rt = Runtime(target, None, None, [StateSpec("b2_k0", "none", 2, 0)], max_model_len=limit)
    long_prompt = PROMPT + list(range(30, 48))  # 30 tokens: room for 10 of the 16 asked
    prompts = [long_prompt, [5, 6, 7]]
    ids, reasons = generate_outputs(model, prompts, 16)
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=16, ignore_eos=True))
                        for p in prompts])
    assert reasons == [o.finish_reason for o in outs] == ["max_model_len", "length"]
    assert len(long_prompt) + len(ids[0]) == limit
    assert ids == [o.token_ids for o in outs]
    # the short row keeps decoding correctly after the long row stopped (its position stays in the cache)
    assert ids[1] == reference_greedy(target, [5, 6, 7], 16)
    for bad in (list(range(limit)), list(range(limit + 5))):
        with pytest.raises(PromptError, match=f"max_model_len={limit}"):
            generate_outputs(model, [bad], 4)
        with pytest.raises(PromptError, match=f"max_model_len={limit}"):
            rt.generate([Request(prompt_ids=bad, params=SamplingParams(max_new_tokens=4))])
    with pytest.raises(PromptError, match="no tokens"):
        generate_outputs(model, [[]], 4)
    with pytest.raises(PromptError, match="batch size must be >= 1"):
        rt.generate([Request(prompt_ids=[5])], batch_size=0)
