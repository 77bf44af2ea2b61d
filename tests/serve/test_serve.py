"""`specc serve` over loopback with the official `openai` client and httpx: completions and chat
completions, streamed and not, equal the runtime's own output; OpenAI-style 400/404/429/500 bodies
naming the field; a client that disconnects frees its row; one request's internal failure leaves the
others exact; /metrics counts match the responses (per adapter too); LoRA adapters by model name;
disaggregated prefill + decode servers with a corrupted payload failing its request alone; a short
bounded load test mixing all of it. Tiny random targets with the real SmolLM2 tokenizer."""
from __future__ import annotations

import asyncio
import json
import random
import re
import time

import httpx
import openai
import pytest
import torch

from specc.methods.ngram.drafter import NgramDrafter
from specc.runtime.request import Request, SamplingParams
from specc.serve.server import BackgroundServer, state_from_runtime

from tests.serve_support import load_smollm2, tiny_runtime
from tests.runtime.test_engine_incremental import PoisonDrafter
from tests.runtime.test_lora import write_adapter, merged

CHATS = ["What is the capital of France?", "Write a haiku about rain.", "Summarize: the cat sat on the mat.",
         "Translate 'good morning' to German.", "List three prime numbers.", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def tok():
    return load_smollm2()[1]


def _client(srv, retries=0):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=retries, timeout=120)


def _reference(rt, tok, prompt, n, adapter=None, chat=True, **kw):
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    out = rt.generate([Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=n, **kw), adapter=adapter)])[0]
    return out


def _metric(text, name, **labels):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_openai_client_matches_runtime_output(tok):
    rt = tiny_runtime(tok)
    refs = [_reference(rt, tok, p, 16) for p in CHATS[:3]]
    raw = _reference(rt, tok, "The capital of France is", 12, chat=False)
    samp = _reference(rt, tok, CHATS[3], 12, temperature=0.9, top_p=0.9, top_k=50, seed=7)
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:  # the engine thread owns rt now
        c = _client(srv)
        assert [m.id for m in c.models.list().data] == ["tiny"]
        for p, ref in zip(CHATS[:3], refs):
            r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}], max_tokens=16,
                                          temperature=0)
            assert r.choices[0].message.content == ref.text
            assert r.usage.completion_tokens == len(ref.token_ids)
            assert r.choices[0].finish_reason == "length"
            chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}],
                                                    max_tokens=16, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}))
            assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ref.text
            assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
            assert chunks[-1].usage.completion_tokens == len(ref.token_ids)
        r = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=12, temperature=0)
        assert r.choices[0].text == raw.text
        s = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=12, temperature=0,
                                 stream=True)
        assert "".join(ch.choices[0].text for ch in s) == raw.text
        # token ids as the prompt (the chat-templated ids of CHATS[0])
        ids = tok.apply_chat_template([{"role": "user", "content": CHATS[0]}])
        r = c.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0)
        assert r.choices[0].text == refs[0].text
        # seeded sampling is reproducible whatever else runs (the request's own generator)
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": CHATS[3]}], max_tokens=12,
                                      temperature=0.9, top_p=0.9, seed=7, extra_body={"top_k": 50})
        assert r.choices[0].message.content == samp.text
        # stop strings: the text is cut before the stop string, streamed and not
        stop = refs[1].text[5:8]
        cut = refs[1].text[:refs[1].text.find(stop)]
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": CHATS[1]}], max_tokens=16,
                                      temperature=0, stop=[stop])
        assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
        s = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": CHATS[1]}], max_tokens=16,
                                      temperature=0, stop=[stop], stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == cut
        h = httpx.get(srv.url + "/health").json()
        assert h["status"] == "ok" and h["running"] == 0


def test_bad_requests_answer_openai_errors_naming_the_field(tok):
    greedy = tiny_runtime(tok, rule="greedy")
    with BackgroundServer(state_from_runtime(greedy, model_name="tiny")) as srv:
        c = _client(srv)
        msgs = [{"role": "user", "content": "hi"}]

        def bad(status, param, **kw):
            with pytest.raises(openai.APIStatusError) as e:
                c.chat.completions.create(model=kw.pop("model", "tiny"), messages=kw.pop("messages", msgs), **kw)
            assert e.value.status_code == status, e.value.body
            assert e.value.body["param"] == param, e.value.body
            assert e.value.body["message"]
            return e.value.body

        assert "unknown field" in bad(400, "foo", extra_body={"foo": 1})["message"]
        bad(400, "temperature", temperature=3.0)
        for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}):
            body = bad(400, "response_format", response_format=fmt)
            assert fmt["type"] in body["message"] and "no grammar backend" in body["message"]
        bad(400, "response_format.type", response_format={"type": "xml"})
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        assert "tools" in bad(400, "tools", tools=[tool])["message"]
        assert "tool_choice" in bad(400, "tool_choice", tool_choice="auto")["message"]
        bad(400, "tool_choice", tool_choice={"type": "function", "function": {"name": "get_weather"}})
        bad(400, "top_p", top_p=0)
        bad(400, "n", n=2)
        bad(400, "max_tokens", max_tokens=0)
        bad(400, "presence_penalty", presence_penalty=0.5)
        bad(400, "logprobs", logprobs=True)
        bad(400, "max_tokens", max_tokens=10_000)
        body = bad(400, "messages", messages=[{"role": "user", "content": "word " * 300}])
        assert "max_model_len" in body["message"]
        bad(404, "model", model="gpt-4")
        bad(400, "messages", messages=[])
        r = httpx.post(srv.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": ["a", "b"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        # nothing reached the engine
        m = httpx.get(srv.url + "/metrics").text
        assert _metric(m, "specc:request_success_total") == 0
        assert _metric(m, "specc:requests_rejected_total", reason="invalid") >= 13


def test_greedy_plan_samples_and_takes_the_fields_openai_clients_send(tok):
    """A greedy-verify plan answers a sampled request (the standard rule for that step) with the
    runtime's own seeded sample; an omitted temperature means 0 there; ``response_format: text`` and
    ``tool_choice: none`` are accepted and change nothing."""
    rt = tiny_runtime(tok, rule="greedy")
    greedy = _reference(rt, tok, CHATS[0], 12)
    samp = _reference(rt, tok, CHATS[3], 12, temperature=0.8, top_p=0.95, seed=3)
    assert samp.token_ids != _reference(rt, tok, CHATS[3], 12).token_ids  # the sample is not the greedy output
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        c = _client(srv)
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": CHATS[3]}], max_tokens=12,
                                      temperature=0.8, top_p=0.95, seed=3)
        assert r.choices[0].message.content == samp.text
        for kw in ({}, {"response_format": {"type": "text"}}, {"tool_choice": "none"}, {"tools": []}):
            r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": CHATS[0]}],
                                          max_tokens=12, **kw)
            assert r.choices[0].message.content == greedy.text, kw
        r = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=4, temperature=0,
                                 extra_body={"response_format": {"type": "text"}})
        assert r.usage.completion_tokens == 4


class PacedDrafter(NgramDrafter):
    """An n-gram drafter that sleeps in every step, so a 150-token request outlives a short client
    timeout on any machine (the tiny target alone decodes 150 tokens in well under a second)."""

    def propose(self, batch, num_steps, sampling):
        time.sleep(0.05)
        return super().propose(batch, num_steps, sampling)


def test_full_queue_answers_429_and_disconnects_free_rows(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy", buckets=(1,), drafter=PacedDrafter(1, 3))
    with BackgroundServer(state_from_runtime(rt, model_name="tiny", max_waiting=0)) as srv:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 150,
                "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                got = [next(lines) for _ in range(4)]  # the row is now busy decoding
                assert any(l.startswith("data: ") for l in got)
                with pytest.raises(openai.RateLimitError) as e:
                    _client(srv).chat.completions.create(model="tiny", messages=body["messages"], max_tokens=4)
                assert e.value.body["code"] == "queue_full"
            # the stream was closed midway: the row must be freed
            _wait(lambda: client.get(srv.url + "/health").json()["running"] == 0)
            # a non-streamed request whose client gives up
            with pytest.raises(httpx.ReadTimeout):
                client.post(srv.url + "/v1/chat/completions", json=dict(body, stream=False), timeout=1.0)
            _wait(lambda: client.get(srv.url + "/health").json()["running"] == 0)
            m = client.get(srv.url + "/metrics").text
            assert _metric(m, "specc:request_success_total", finished_reason="abort") == 2
            assert _metric(m, "specc:requests_rejected_total", reason="queue_full") == 1
            # and the server still serves
            ok = _client(srv).chat.completions.create(model="tiny", messages=body["messages"], max_tokens=4,
                                                      temperature=0)
            assert ok.usage.completion_tokens == 4


def _wait(cond, timeout=60.0):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "condition not reached"
        time.sleep(0.1)


def test_one_request_failing_inside_the_engine_leaves_others_exact(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy", drafter=PoisonDrafter())
    poison = 63  # token id 63 in a prompt makes the drafter raise for that request
    good = [tok.encode(p) for p in CHATS[:3]]
    refs = [rt.generate([Request(prompt_ids=g, params=SamplingParams(max_new_tokens=12))])[0].token_ids for g in good]

    async def go(url):
        async with httpx.AsyncClient(timeout=120) as c:
            jobs = [c.post(url + "/v1/completions", json={"model": "tiny", "prompt": g, "max_tokens": 12})
                    for g in good]
            jobs.append(c.post(url + "/v1/completions", json={"model": "tiny", "prompt": [1, 2, poison, 4],
                                                               "max_tokens": 12}))
            return await asyncio.gather(*jobs)

    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        res = asyncio.run(go(srv.url))
        bad = res[-1]
        assert bad.status_code == 500 and "poisoned" in bad.json()["error"]["message"]
        for r, ref in zip(res[:-1], refs):
            assert r.status_code == 200
            assert r.json()["usage"]["completion_tokens"] == len(ref)
            assert r.json()["choices"][0]["text"] == tok.decode(ref)
        m = httpx.get(srv.url + "/metrics").text
        assert _metric(m, "specc:request_success_total", finished_reason="error") == 1
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"


def test_lora_adapters_by_model_name_and_metrics_per_adapter(tok, tmp_path):
    from specc.runtime.lora import load_adapter, load_lora_set
    from specc.runtime.testing import reference_greedy, tiny_llama

    torch.set_num_threads(1)
    base = tiny_llama(seed=0, vocab_size=len(tok), hidden_size=32, num_layers=2, max_model_len=256, std=0.5)
    path = write_adapter(tmp_path / "chat", 11, std=0.5)
    prompt = tok.apply_chat_template([{"role": "user", "content": CHATS[0]}])
    want = reference_greedy(merged(base, load_adapter("chat", path, base.config)), prompt, 12)
    plain = reference_greedy(base, prompt, 12)
    assert want != plain
    rt = tiny_runtime(tok, method="ngram", rule="greedy", target=base)
    rt.attach_lora(load_lora_set([f"chat={path}"], base, rt.max_rows))
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        c = _client(srv)
        models = {m.id: m for m in c.models.list().data}
        assert set(models) == {"tiny", "chat"} and models["chat"].model_extra["parent"] == "tiny"
        msgs = [{"role": "user", "content": CHATS[0]}]
        r = c.chat.completions.create(model="chat", messages=msgs, max_tokens=12)
        assert r.model == "chat" and r.choices[0].message.content == tok.decode(want)
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices) == tok.decode(plain)
        m = httpx.get(srv.url + "/metrics").text
        for name in ("tiny", "chat"):
            assert _metric(m, "specc:request_success_total", model_name=name) == 1
            assert _metric(m, "specc:spec_decode_num_steps_total", model_name=name) > 0
            assert f'specc:spec_decode_tau{{model_name="{name}"}}' in m


def test_disaggregated_servers_match_one_process_and_refuse_bad_payloads(tok):
    import copy

    from specc.methods.draft_model.drafter import DraftModelDrafter
    from specc.runtime.testing import perturbed_copy, tiny_llama

    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=len(tok), hidden_size=32, num_layers=2, max_model_len=256, std=0.5)
    draft = perturbed_copy(target, 0.01, 1)

    def clone(m):
        m = copy.deepcopy(m)
        m.max_batch_size = m.max_seq_len = 0
        return m.use_cpu_fast()

    one = tiny_runtime(tok, target=target, drafter=DraftModelDrafter(draft, len(tok)))
    refs = [_reference(one, tok, p, 14) for p in CHATS[:4]]
    pre = tiny_runtime(tok, target=clone(target), drafter=DraftModelDrafter(clone(draft), len(tok)))
    dec = tiny_runtime(tok, target=clone(target), drafter=DraftModelDrafter(clone(draft), len(tok)))
    with BackgroundServer(state_from_runtime(pre, model_name="tiny", role="prefill")) as p_srv, \
            BackgroundServer(state_from_runtime(dec, model_name="tiny", role="decode", prefill_url=p_srv.url)) as d_srv:
        client = d_srv.state.prefill
        real = client.fetch_bytes

        async def tampered(req):  # corrupt the payload of one request in transfer
            data = await real(req)
            if "haiku" in tok.decode(req.prompt_ids):
                return data[:-7] + b"\x00" * 7
            return data

        client.fetch_bytes = tampered

        async def go():
            c = openai.AsyncOpenAI(base_url=d_srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            jobs = [c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}], max_tokens=14,
                                              temperature=0) for p in CHATS[:4]]
            return await asyncio.gather(*jobs, return_exceptions=True)

        res = asyncio.run(go())
        assert isinstance(res[1], openai.APIStatusError) and res[1].status_code == 502
        assert "sha256" in res[1].body["message"] or "safetensors" in res[1].body["message"]
        for i in (0, 2, 3):
            assert res[i].choices[0].message.content == refs[i].text
        # the prefill instance does not serve completions
        r = httpx.post(p_srv.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_role"
        dm = httpx.get(d_srv.url + "/metrics").text
        assert _metric(dm, "specc:disagg_payload_bytes_total", part="kv") > 0
        assert _metric(dm, "specc:requests_rejected_total", reason="disagg") == 1
        assert dec.metrics.num_drafts > 0


def test_short_load_test_every_completed_request_exact(tok):
    """16 concurrent clients, 48 requests: streamed and not, greedy and seeded-sampled, two adapters
    and none, some clients disconnecting midway. Every completed request equals the same request run
    alone; none lost or duplicated; /metrics agrees with the responses."""
    from specc.runtime.lora import load_lora_set
    from specc.runtime.testing import tiny_llama
    import tempfile
    from pathlib import Path

    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=len(tok), hidden_size=32, num_layers=2, max_model_len=256, std=0.5)
    rt = tiny_runtime(tok, target=target)
    tmp = Path(tempfile.mkdtemp())
    rt.attach_lora(load_lora_set([f"a={write_adapter(tmp / 'a', 1, std=0.5)}",
                                  f"b={write_adapter(tmp / 'b', 2, std=0.5)}"], target, rt.max_rows))
    rng = random.Random(0)
    jobs = []
    for i in range(48):
        jobs.append({"i": i, "prompt": CHATS[i % len(CHATS)], "stream": rng.random() < 0.5,
                     "sampled": rng.random() < 0.4, "adapter": rng.choice([None, "a", "b"]),
                     "disconnect": rng.random() < 0.15, "max_tokens": rng.choice([6, 10, 14])})
    refs = {}
    for j in jobs:
        kw = dict(temperature=0.8, top_k=40, seed=1000 + j["i"]) if j["sampled"] else {}
        refs[j["i"]] = _reference(rt, tok, j["prompt"], j["max_tokens"], adapter=j["adapter"], **kw).text

    async def one(c, j):
        kw = dict(temperature=0.8, seed=1000 + j["i"], extra_body={"top_k": 40}) if j["sampled"] else \
            dict(temperature=0)
        model = j["adapter"] or "tiny"
        msgs = [{"role": "user", "content": j["prompt"]}]
        if j["disconnect"]:
            stream = await c.chat.completions.create(model=model, messages=msgs, max_tokens=120, stream=True, **kw)
            async for _ in stream:
                break
            await stream.close()
            return ("gone", None)
        if j["stream"]:
            stream = await c.chat.completions.create(model=model, messages=msgs, max_tokens=j["max_tokens"],
                                                     stream=True, **kw)
            text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
            return ("done", text)
        r = await c.chat.completions.create(model=model, messages=msgs, max_tokens=j["max_tokens"], **kw)
        return ("done", r.choices[0].message.content)

    async def go(url):
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        sem = asyncio.Semaphore(16)

        async def limited(j):
            async with sem:
                return await one(c, j)
        return await asyncio.wait_for(asyncio.gather(*(limited(j) for j in jobs)), 300)

    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        res = asyncio.run(go(srv.url))
        _wait(lambda: httpx.get(srv.url + "/health").json()["running"] == 0)
        m = httpx.get(srv.url + "/metrics").text
    done = [(j, r) for j, r in zip(jobs, res) if r[0] == "done"]
    gone = [j for j, r in zip(jobs, res) if r[0] == "gone"]
    assert len(done) + len(gone) == len(jobs) and gone
    for j, (_, text) in done:
        assert text == refs[j["i"]], j
    success = _metric(m, "specc:request_success_total")
    aborted = _metric(m, "specc:request_success_total", finished_reason="abort")
    assert success == len(jobs)  # every request finished exactly once (stop/length/abort)
    assert len(done) <= success - aborted <= len(done) + len(gone)
    assert _metric(m, "specc:request_success_total", finished_reason="error") == 0
