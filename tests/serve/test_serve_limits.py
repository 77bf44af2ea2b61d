"""`specc serve` under hostile bodies: a body over `--max-request-bytes` is a 413 before anything
parses it, a huge prompt is refused from its length without being tokenized, and neither stalls the
streams of other clients; a lone UTF-16 surrogate is a 400 naming the field and the position on
both endpoints; strict types; every 4xx the server sends (404, 405, an empty or non-JSON body,
100k-deep JSON, 413) is OpenAI's error object. The tokenizer's bytes-per-token bound is sound.
Tiny random targets with the real SmolLM2 tokenizer."""
from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from specc.runtime.request import Request, SamplingParams
from specc.serve.server import BackgroundServer, state_from_runtime

from tests.serve_support import load_smollm2, tiny_runtime
from tests.serve.test_serve import PacedDrafter, _metric


@pytest.fixture(scope="module")
def tok():
    return load_smollm2()[1]


def _error(r: httpx.Response, status: int, param=None, code=None) -> str:
    """The OpenAI error object of ``r`` (asserting its shape); returns the message."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["message"] and err["type"] in ("invalid_request_error", "not_found_error"), err
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err["message"]


def test_streams_keep_flowing_while_oversized_requests_arrive(tok):
    """Two clients stream 120 tokens each while others send a body over the limit (declared and
    chunked), prompts of megabytes just under it (text and chat) and deep JSON. The oversized ones
    are refused (413 / 400 context_length_exceeded) within a second each, no gap between two chunks
    of a stream exceeds 1.5 s (tokenizing a 3.5 MB prompt on the event loop stalls every stream for
    seconds), and both streams end with the text they would have had alone."""
    rt = tiny_runtime(tok, method="ngram", rule="greedy", buckets=(1, 2), drafter=PacedDrafter(1, 3))
    msgs = [[{"role": "user", "content": p}] for p in ("Tell a long story.", "Describe the sea at night.")]
    outs = rt.generate([Request(prompt_ids=tok.apply_chat_template(m), params=SamplingParams(max_new_tokens=120))
                        for m in msgs], batch_size=2)
    refs = [tok.decode(o.token_ids) for o in outs]
    big_text = "word " * (700 << 10)  # 3.5 MiB: under the default 4 MiB limit
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv:
        gaps, texts, ends = [[], []], [None, None], [0.0, 0.0]

        def stream(i):
            body = {"model": "tiny", "messages": msgs[i], "max_tokens": 120, "temperature": 0, "stream": True}
            parts, last = [], None
            with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    now = time.perf_counter()
                    if last is not None:
                        gaps[i].append(now - last)
                    last = now
                    if line.startswith("data: {"):
                        ch = json.loads(line[6:])
                        parts.append(ch["choices"][0]["delta"].get("content") or "")
            texts[i], ends[i] = "".join(parts), time.perf_counter()

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # both streams are running
        took, got = [], []
        with httpx.Client(timeout=120) as c:
            def timed(kind, *args, **kw):
                t0 = time.perf_counter()
                got.append(c.post(srv.url + "/v1/" + kind, *args, **kw))
                took.append(time.perf_counter() - t0)

            def chunks():
                for _ in range(80):
                    yield b"x" * (64 << 10)  # 5 MiB without a Content-Length

            timed("completions", json={"model": "tiny", "prompt": big_text + "x" * (1 << 20)})
            timed("completions", json={"model": "tiny", "prompt": big_text, "max_tokens": 4})
            timed("chat/completions", json={"model": "tiny", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": big_text}]})
            timed("completions", content=chunks(), headers={"content-type": "application/json"})
            timed("completions", content=b"[" * 100_000 + b"]" * 100_000)
            h0 = time.perf_counter()
            assert c.get(srv.url + "/health").status_code == 200
            health_s = time.perf_counter() - h0
            hostile_done = time.perf_counter()
        for t in threads:
            t.join(120)
        m = httpx.get(srv.url + "/metrics").text
    worst = max(max(g) for g in gaps)
    assert worst < 1.5, f"a stream stalled for {worst:.2f} s while oversized requests arrived"
    assert max(took) < 5.0, took  # each refusal is quick (loaded shared machine: generous)
    assert health_s < 1.0, health_s
    _error(got[0], 413, code="request_too_large")
    msg = _error(got[1], 400, "prompt", "context_length_exceeded")
    assert "at least" in msg and "max_model_len is 200" in msg
    _error(got[2], 400, "messages", "context_length_exceeded")
    _error(got[3], 413, code="request_too_large")
    _error(got[4], 400, code="invalid_json")
    assert texts == refs
    assert min(ends) > hostile_done, "the streams ended before the oversized requests did: nothing was measured"
    assert _metric(m, "specc:requests_rejected_total", reason="too_large") == 2
    assert _metric(m, "specc:request_success_total", finished_reason="length") == 2


def test_max_request_bytes_is_configurable_and_refuses_before_reading(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy")
    with BackgroundServer(state_from_runtime(rt, model_name="tiny", max_request_bytes=1024)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        with pytest.raises(openai.APIStatusError) as e:
            c.completions.create(model="tiny", prompt="word " * 300, max_tokens=2)
        assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"
        assert "1 KiB" in e.value.body["message"] and "--max-request-bytes" in e.value.body["message"]
        # a client that asks first (Expect: 100-continue) is refused from the header alone
        r = httpx.post(srv.url + "/v1/completions", content=b"x" * 4096,
                       headers={"content-type": "application/json", "expect": "100-continue"})
        _error(r, 413, code="request_too_large")
        # under the limit all is as before
        ok = c.completions.create(model="tiny", prompt="hello", max_tokens=2, temperature=0)
        assert ok.usage.completion_tokens == 2
    with pytest.raises(Exception, match="max-request-bytes"):
        state_from_runtime(tiny_runtime(tok, method="ngram", rule="greedy"), model_name="tiny", max_request_bytes=0)


def test_lone_surrogate_and_strict_types_are_400s_naming_the_field(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy")
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv, httpx.Client(timeout=60) as c:
        def post(path, raw):
            return c.post(srv.url + path, content=raw, headers={"content-type": "application/json"})

        msg = _error(post("/v1/completions", b'{"model": "tiny", "prompt": "ab\\ud800c", "max_tokens": 2}'),
                     400, "prompt", "invalid_unicode")
        assert "\\ud800" in msg and "character 2" in msg
        msg = _error(post("/v1/chat/completions", b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", '
                                                  b'"content": "hi"}, {"role": "assistant", "content": "x"}, '
                                                  b'{"role": "user", "content": "\\udc00"}]}'),
                     400, "messages.2.content", "invalid_unicode")
        assert "character 0" in msg
        _error(post("/v1/completions", b'{"model": "tiny", "prompt": "hi", "stop": ["a\\ud83d"]}'), 400, "stop.0")
        # a surrogate pair is one character, not an error
        ok = post("/v1/completions", b'{"model": "tiny", "prompt": "hi \\ud83d\\ude00", "max_tokens": 2}')
        assert ok.status_code == 200, ok.text
        # the connection survives: the next request on it is answered
        assert c.get(srv.url + "/health").status_code == 200
        for field, value in (("max_tokens", True), ("max_tokens", "4"), ("max_tokens", 4.0), ("stream", "yes"),
                             ("stream", 1), ("temperature", "0"), ("seed", True), ("n", "1")):
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, field: value}
            msg = _error(c.post(srv.url + "/v1/completions", json=body), 400, field)
            assert field in msg, msg
        _error(c.post(srv.url + "/v1/chat/completions", json={"model": "tiny", "messages": [
            {"role": "user", "content": "hi"}], "stream": "true"}), 400, "stream")
        msg = _error(c.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": [1, True]}), 400, "prompt")
        assert "list of token ids" in msg
        # an integer is still a number
        ok = c.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                       "temperature": 0, "top_p": 1})
        assert ok.status_code == 200, ok.text
        m = c.get(srv.url + "/metrics").text
    assert _metric(m, "specc:request_success_total") == 2  # nothing else reached the engine


def test_every_4xx_is_an_openai_error_object(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy")
    with BackgroundServer(state_from_runtime(rt, model_name="tiny")) as srv, httpx.Client(timeout=60) as c:
        u = srv.url
        assert "/v1/completions" in _error(c.get(u + "/v1/nothing"), 404, code="not_found")
        r = c.get(u + "/v1/completions")
        assert "POST" in _error(r, 405, code="method_not_allowed") and r.headers["allow"] == "POST"
        _error(c.post(u + "/v1/models"), 405)
        for raw, code in ((b"", "empty_body"), (b"  \n", "empty_body"), (b"{not json", "invalid_json"),
                          (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
                          (b'{"model": "tiny", "prompt": "x", "temperature": NaN}', "invalid_json"),
                          (b"\xff\xfe{}", "invalid_json")):
            for path in ("/v1/completions", "/v1/chat/completions"):
                _error(c.post(u + path, content=raw, headers={"content-type": "application/json"}), 400, code=code)
        for raw in (b"[]", b'"prompt"', b"42", b"null"):
            assert "JSON object" in _error(c.post(u + "/v1/completions", content=raw), 400)
        assert "line 1, column 2" in _error(c.post(u + "/v1/completions", content=b"{not json"), 400)
        msg = _error(c.post(u + "/v1/completions", json={"model": "m" * 100_000, "prompt": "hi"}), 404, "model",
                     "model_not_found")
        assert len(msg) < 300  # an error never echoes a megabyte back
        doc = c.get(u + "/openapi.json").json()  # /docs still shows the body fields
        schema = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert "prompt" in schema["properties"] and "StreamOptions" in doc["components"]["schemas"]


def test_tokenizer_bytes_per_token_bound_is_sound(tok):
    """Every text has at least ceil(bytes / L) tokens, L = :attr:`Tokenizer.max_bytes_per_token`,
    for the texts that pack the most bytes into a token (runs of spaces and newlines, long words,
    multi-byte characters, special tokens); a text over the bound is refused without tokenizing."""
    from specc.errors import PromptTooLongError

    per = tok.max_bytes_per_token
    assert per is not None and 16 <= per <= 256
    texts = ["\n" + " " * 5000, " " * 10_000, "a" * 10_000, "\u00e9" * 3000 + "\u4e2d\u6587" * 2000,
             "<|im_start|>" * 500, "\U0001F600" * 1000, "word " * 2000, "\t\n\r " * 2000]
    for t in texts:
        n = len(t.encode("utf-8"))
        assert len(tok.encode(t)) >= -(-n // per), t[:20]
    with pytest.raises(PromptTooLongError) as e:
        tok.encode_within("x" * (per * 101), 100)
    assert e.value.min_tokens >= 101
    assert tok.encode_within("hello world", 100) == tok.encode("hello world")


def test_tokenizers_without_a_byte_bound_get_none():
    """A normalizer that may delete input (Strip) or a model whose unknown token can swallow a word
    (WordPiece) gives no bound; NFKC multiplies it by 3 (composition folds up to 3 bytes into 1)."""
    from tokenizers import Tokenizer as HFTokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from specc.models.tokenizer import Tokenizer

    def wrap(t):
        return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=t))

    def bpe():
        t = HFTokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "abab": 3}, merges=[("a", "b"), ("ab", "ab")]))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return t

    assert wrap(bpe()).max_bytes_per_token == 4
    t = bpe()
    t.normalizer = normalizers.NFKC()
    assert wrap(t).max_bytes_per_token == 12
    t = bpe()
    t.normalizer = normalizers.Strip()
    assert wrap(t).max_bytes_per_token is None
    wp = HFTokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    assert wrap(wp).max_bytes_per_token is None
