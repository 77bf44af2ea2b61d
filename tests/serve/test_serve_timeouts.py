"""`specc serve` against clients that take their time, and its shutdown: a connection that sends
nothing, a request head sent a byte at a time and a body that trickles are each answered 408 and
closed within their timeout while another client's stream goes on undisturbed; on shutdown, requests
still in flight when the deadline passes end (a stream with a final error event, a one-shot request
with a 503) and the server stops within the deadline plus uvicorn's grace. Before these bounds the
slow clients held their connections for as long as they liked and the drain had no end. Tiny random
targets with the real SmolLM2 tokenizer; a paced drafter makes a stream outlive the deadlines."""
from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from specc.errors import SpeccError
from specc.serve.limits import check_http_url
from specc.serve.server import FINAL_GRACE, BackgroundServer, state_from_runtime

from tests.serve_support import load_smollm2, tiny_runtime
from tests.serve.test_serve import PacedDrafter

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
_spec = importlib.util.spec_from_file_location("hostile_sweep", Path(__file__).resolve().parents[2] / "tools"
                                               / "hostile_sweep.py")
SWEEP = sys.modules.setdefault("hostile_sweep", importlib.util.module_from_spec(_spec))  # dataclasses look it up
_spec.loader.exec_module(SWEEP)


@pytest.fixture(scope="module")
def tok():
    return load_smollm2()[1]


def _trickle(url: str, first: bytes, rest: bytes, interval: float, limit_s: float):
    """Send ``first`` at once, then ``rest`` a byte every ``interval`` s (the hostile sweep's slow
    client); return (seconds until the server closed the connection, what it answered)."""
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(first)
    res = SWEEP.slow_client(s, rest, interval, limit_s)
    return res["closed_after"] or limit_s, res["raw"]


def _stream(url: str, out: dict, max_tokens: int = 60) -> None:
    body = {"model": "tiny", "prompt": "Tell a long story.", "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    events, gaps, last = [], [], None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if line.startswith("data: "):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                events.append(line[6:])
    out.update(events=events, gaps=gaps, ended=time.perf_counter())


@pytest.mark.parametrize("kind", ["idle", "slow_head", "slow_body"])
def test_slow_clients_get_408_within_their_timeout_and_others_stream_on(tok, kind):
    rt = tiny_runtime(tok, method="ngram", rule="greedy", buckets=(1, 2), drafter=PacedDrafter(1, 3))
    state = state_from_runtime(rt, model_name="tiny", body_timeout=1.0)
    with BackgroundServer(state, header_timeout=1.0) as srv:
        out: dict = {}
        streamer = threading.Thread(target=_stream, args=(srv.url, out))
        streamer.start()
        time.sleep(0.3)
        if kind == "idle":
            took, answer = _trickle(srv.url, b"", b"", 0.1, 10)
        elif kind == "slow_head":
            took, answer = _trickle(srv.url, b"", HEAD + b"Content-Length: 2\r\n\r\n{}", 0.2, 10)
        else:  # 1 s plus 1 s per 500 bytes: cut after about 1 s at a byte per 0.2 s
            took, answer = _trickle(srv.url, HEAD + b"Content-Length: 1000\r\n\r\n", b"{" + b" " * 998 + b"}", 0.2, 10)
        streamer.join(60)
        assert took < 2.5, (kind, took, answer[:200])
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        err = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["code"] == "request_timeout" and ("--header-timeout" in err["message"]
                                                     or "--body-timeout" in err["message"])
        assert out["status"] == 200 and out["events"][-1] == "[DONE]"
        assert max(out["gaps"]) < 1.0, max(out["gaps"])  # the other client never waited on the slow one
        if kind == "slow_body":
            assert 'reason="timeout"' in httpx.get(srv.url + "/metrics").text


def test_shutdown_ends_requests_in_flight_at_its_deadline(tok):
    rt = tiny_runtime(tok, method="ngram", rule="greedy", buckets=(1, 2), drafter=PacedDrafter(1, 3))
    srv = BackgroundServer(state_from_runtime(rt, model_name="tiny"), shutdown_timeout=1.0)
    with srv:
        out: dict = {}
        streamer = threading.Thread(target=_stream, args=(srv.url, out, 150))  # 150 paced steps: 7.5 s at least
        streamer.start()
        one_shot: dict = {}

        def ask():
            r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": "Hello there", "max_tokens": 150,
                                                              "temperature": 0}, timeout=60)
            one_shot.update(status=r.status_code, body=r.json())

        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(1.0)
        t0 = time.perf_counter()
        srv.server.should_exit = True  # what SIGTERM does
        srv.thread.join(1.0 + FINAL_GRACE + 5)
        stopped = time.perf_counter() - t0
        streamer.join(10)
        asker.join(10)
    assert not srv.thread.is_alive() and stopped < 1.0 + FINAL_GRACE, stopped
    assert out["ended"] - t0 < 2.5, out["ended"] - t0
    assert out["events"][-1] == "[DONE]"
    last = json.loads(out["events"][-2])
    assert last["error"]["code"] == "server_shutdown" and "--shutdown-timeout" in last["error"]["message"]
    assert one_shot["status"] == 503 and one_shot["body"]["error"]["code"] == "server_shutdown"


@pytest.mark.parametrize("url, words", [("file:///etc/passwd", "scheme must be http or https"),
                                        ("http://", "no host"), ("ftp://127.0.0.1/x", "scheme"),
                                        ("127.0.0.1:8001", "scheme"), ("http://[::1", "not a URL"),
                                        ("http://u:p@127.0.0.1:8001", "user info"),
                                        ("http://127.0.0.1:99999", "not a URL")])
def test_prefill_urls_must_be_http_with_a_host(url, words):
    with pytest.raises(SpeccError, match=words):
        check_http_url(url)
    assert check_http_url("https://prefill.internal:8443/base") == "https://prefill.internal:8443/base"
