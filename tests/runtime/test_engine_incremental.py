"""The runtime's incremental API (reset / submit / step / cancel, token events) that `specc serve`
drives: events add up to each request's output, requests admitted while others decode stay exact, a
cancelled request frees its row, and one request's internal failure (in its prefill or in a decode
step) finishes that request alone with "error" while the others stay exact."""
from __future__ import annotations

import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.errors import PromptError
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, quantized_copy, reference_greedy, tiny_llama

PROMPTS = [[5, 6, 7], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8], [3, 3, 3, 20, 21, 22, 23], [11], [4, 5, 4, 5]]
POISON = 63


@pytest.fixture(scope="module", params=["fp32", "native"])
def target(request):
    """fp32, and the same model in GGML codes (Q4_1 / Q8_0) through the C layer parts."""
    torch.set_num_threads(1)
    model = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    return model if request.param == "fp32" else quantized_copy(model)


@pytest.fixture(scope="module")
def reference(target):
    return [reference_greedy(target, p, 12) for p in PROMPTS]


def _runtime(target, drafter=None, method="draft_model", k=3):
    specs = [StateSpec(f"b{b}_k{k}", method, b, k, num_draft_tokens=k + 1) for b in (1, 2, 4)]
    return Runtime(target, None, drafter, specs, max_model_len=96, eos_token_ids=[])


def _req(p, n=12, **kw):
    return Request(prompt_ids=list(p), params=SamplingParams(max_new_tokens=n, **kw))


def _drain(rt, handles):
    """Step until every handle finished; returns {handle: (concatenated event tokens, output)}."""
    got = {h: [] for h in handles}
    outs = {}
    for _ in range(10_000):
        if not rt.has_work():
            break
        for ev in rt.step():
            got[ev.handle].extend(ev.token_ids)
            if ev.output is not None:
                assert ev.handle not in outs, "a request finished twice"
                outs[ev.handle] = ev.output
    return {h: (got[h], outs.get(h)) for h in handles}


def test_events_add_up_to_generate(target, reference):
    draft = perturbed_copy(target, noise=0.02, seed=1)
    rt = _runtime(target, DraftModelDrafter(draft, 64))
    batch = rt.generate([_req(p) for p in PROMPTS], batch_size=4)
    rt.reset(4)
    handles = [rt.submit(_req(p)) for p in PROMPTS]
    res = _drain(rt, handles)
    for i, h in enumerate(handles):
        tokens, out = res[h]
        assert tokens == out.token_ids == batch[i].token_ids == reference[i]
        assert out.finish_reason == "length"


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_requests_admitted_while_others_decode_are_exact(target, reference, method):
    drafter = NgramDrafter(1, 3) if method == "ngram" else DraftModelDrafter(perturbed_copy(target, 0.02, 1), 64)
    rt = _runtime(target, drafter, method)
    rt.reset(4)
    res, outs = {}, {}
    h0 = rt.submit(_req(PROMPTS[0]))
    order = {h0: 0}
    for step in range(200):
        if step in (2, 3, 5, 9, 12):  # arrivals while others decode
            i = len(order)
            order[rt.submit(_req(PROMPTS[i]))] = i
        if not rt.has_work() and len(order) == 6:
            break
        for ev in rt.step():
            res.setdefault(ev.handle, []).extend(ev.token_ids)
            if ev.output is not None:
                outs[ev.handle] = ev.output
    assert len(outs) == 6
    for h, i in order.items():
        assert res[h] == outs[h].token_ids == reference[i], i


def test_cancel_frees_the_row_and_others_stay_exact(target, reference):
    rt = _runtime(target, DraftModelDrafter(perturbed_copy(target, 0.02, 1), 64))
    rt.reset(2)
    a = rt.submit(_req(PROMPTS[0], 40))
    b = rt.submit(_req(PROMPTS[1]))
    queued = rt.submit(_req(PROMPTS[2]))
    c = rt.submit(_req(PROMPTS[3]))
    for _ in range(3):
        rt.step()
    assert rt.num_running == 2 and rt.num_waiting == 2
    out = rt.cancel(queued)
    assert out.finish_reason == "abort" and out.token_ids == [] and rt.num_waiting == 1
    out = rt.cancel(a)
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 40
    assert rt.cancel(a) is None  # already gone
    res = _drain(rt, [b, c])
    assert res[b][1].token_ids == reference[1] and res[c][1].token_ids == reference[3]
    assert rt.num_running == 0


class PoisonDrafter(NgramDrafter):
    """An n-gram drafter that fails for rows whose history holds the poison token: in propose (a
    decode-step failure) or, when ``at_prefill``, in its prefill."""

    prefill_row_index = True

    def __init__(self, at_prefill=False):
        super().__init__(1, 3)
        self.at_prefill = at_prefill

    def prefill(self, batch, chunk):
        if self.at_prefill and bool((chunk.input_ids == POISON).any()):
            raise RuntimeError("poisoned prompt")

    def propose(self, batch, num_steps, sampling):
        hist = batch.tokens
        for b in range(batch.batch_size):
            if bool(batch.active[b]) and bool((hist[b, :int(batch.seq_lens[b])] == POISON).any()):
                raise RuntimeError("poisoned row")
        return super().propose(batch, num_steps, sampling)


@pytest.mark.parametrize("at_prefill", [False, True])
def test_one_failing_request_fails_alone(target, reference, at_prefill):
    rt = _runtime(target, PoisonDrafter(at_prefill), "ngram")
    prompts = [PROMPTS[0], [1, 2, POISON, 4], PROMPTS[2], PROMPTS[3]]
    rt.reset(4, isolate_failures=True)
    handles = [rt.submit(_req(p)) for p in prompts]
    res = _drain(rt, handles)
    bad = res[handles[1]][1]
    assert bad.finish_reason == "error" and "poisoned" in bad.error
    for h, i in zip((handles[0], handles[2], handles[3]), (0, 2, 3)):
        tokens, out = res[h]
        assert out.finish_reason == "length" and tokens == out.token_ids == reference[i]
    # without isolation (generate) the failure propagates, as before
    with pytest.raises(RuntimeError, match="poisoned"):
        rt.generate([_req(p) for p in prompts], batch_size=4)


def test_submit_checks_the_request(target):
    rt = _runtime(target, NgramDrafter(1, 3), "ngram")
    with pytest.raises(PromptError, match="top_p"):
        rt.submit(_req(PROMPTS[0], temperature=0.5, top_p=0.0))
    rt.check_request(_req(PROMPTS[0], temperature=0.5))  # the greedy verify rule samples it (standard rule)
    with pytest.raises(PromptError, match="max_model_len"):
        rt.submit(_req(list(range(1, 60)) * 2))
    with pytest.raises(PromptError, match="adapter"):
        rt.submit(Request(prompt_ids=[1, 2], adapter="nope"))
