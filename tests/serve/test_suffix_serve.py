"""``specc serve`` with suffix decoding: ``POST /v1/suffix/documents`` adds a document to the running
server's global suffix tree while it decodes (completions stay equal to the runtime's own output),
refuses a document past ``method.suffix.max_corpus_tokens`` with a 413 naming the bound (nothing is
added), and bad bodies with a 400 naming the field; servers of other methods have no such endpoint.
A tiny random target with the real SmolLM2 tokenizer."""
from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from specc.methods.suffix.drafter import SuffixDrafter
from specc.runtime.request import Request, SamplingParams
from specc.serve.server import BackgroundServer, state_from_runtime

from tests.serve_support import load_smollm2, tiny_runtime

CHATS = ["What is the capital of France?", "Write a haiku about rain.", "List three prime numbers.",
         "Why is the sky blue?"]
DOC = ("The Harbour Museum is open from Tuesday to Sunday, 10:00 to 17:00, and is closed on Mondays. "
       "Entry costs 8 dollars for adults and 4 dollars for children under 12.")


@pytest.fixture(scope="module")
def tok():
    return load_smollm2()[1]


def test_documents_endpoint_adds_bounded_documents_while_decoding(tok):
    drafter = SuffixDrafter(max_tree_depth=16, max_corpus_tokens=400)
    rt = tiny_runtime(tok, method="suffix", rule="greedy", k=4, drafter=drafter)
    refs = [rt.generate([Request(prompt_ids=tok.apply_chat_template([{"role": "user", "content": c}]),
                                 params=SamplingParams(max_new_tokens=24))])[0].text for c in CHATS]
    before = drafter.cache.corpus_tokens
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        url = srv.url

        def chat(c):
            r = httpx.post(url + "/v1/chat/completions", timeout=120,
                           json={"model": "tiny", "messages": [{"role": "user", "content": c}], "max_tokens": 24,
                                 "temperature": 0})
            return r.json()["choices"][0]["message"]["content"]

        def add(i):
            return httpx.post(url + "/v1/suffix/documents", json={"text": f"{DOC} ({i})", "id": f"d{i}"}, timeout=60)

        with cf.ThreadPoolExecutor(8) as pool:  # documents arrive while requests decode
            texts = pool.map(chat, CHATS * 2)
            added = [f.result() for f in [pool.submit(add, i) for i in range(3)]]
            assert list(texts) == refs * 2
        assert all(a.status_code == 200 for a in added), [a.text for a in added]
        body = added[-1].json()
        assert body["object"] == "suffix.document" and body["tokens"] > 10 and body["max_corpus_tokens"] == 400
        held = drafter.cache.corpus_tokens
        assert held == before + sum(a.json()["tokens"] for a in added)

        r = httpx.post(url + "/v1/suffix/documents", json={"token_ids": [5] * 400})
        assert r.status_code == 413
        err = r.json()["error"]
        assert "method.suffix.max_corpus_tokens=400" in err["message"] and err["param"] == "token_ids"
        assert drafter.cache.corpus_tokens == held  # nothing added
        for body, param in (({"text": "a", "token_ids": [1]}, "text"), ({}, "text"), ({"text": "  "}, "text"),
                            ({"token_ids": [10 ** 9]}, "token_ids"), ({"text": "a", "colour": "red"}, "colour")):
            r = httpx.post(url + "/v1/suffix/documents", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        metrics = httpx.get(url + "/metrics").text
        assert "specc:suffix_documents_added_total 3.0" in metrics
        assert chat(CHATS[0]) == refs[0]


def test_other_methods_have_no_documents_endpoint(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy", k=3)
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        assert httpx.post(srv.url + "/v1/suffix/documents", json={"text": DOC}).status_code == 404
