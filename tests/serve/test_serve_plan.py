"""``specc serve PLAN [OVERRIDES]`` takes what ``specc run`` takes: a preset name or a YAML plan with
Hydra overrides is compiled into the artifact cache (``specc.commands.compile.artifact_for``, the one
resolver both commands call) and served; an artifact directory is served as it is, and overrides with
it are refused before anything loads. A tiny random target (the runtime tests' checkpoint: a 64-word
tokenizer) keeps each server start to seconds; the server's greedy text equals the runtime's own over
the cached artifact."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.runtime.test_runtime_artifact import V, _write_checkpoint

PROMPT = "w2 w3 w4 w2 w3 w4 w2"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import torch

    from specc.runtime.testing import tiny_llama

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    _write_checkpoint(tiny_llama(seed=0, vocab_size=V), root / "target")
    return root


def _overrides(root):
    return [f"target.path={root / 'target'}", "target.format=hf", f"target.vocab_size={V}", "target.max_model_len=128"]


def _env(cache):
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", SPECC_CACHE_DIR=str(cache))


def _serve(argv, cache, model):
    """Start ``specc serve ARGV``, ask it for 6 greedy tokens of PROMPT, stop it; returns (text, stderr)."""
    from specc.serve.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specc.cli", "serve", *map(str, argv), "--port", str(port),
                             "--log-level", "warning"], env=_env(cache), stdout=subprocess.PIPE,
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
            assert time.time() - t0 < 120, "specc serve did not come up"
            time.sleep(0.3)
        r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 6,
                                                      "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return text, proc.stderr.read()


def _reference(art):
    from specc.runtime.loader import load_runtime
    from specc.runtime.request import Request, SamplingParams

    rt, _ = load_runtime(str(art))
    ids = rt.tokenizer.encode(PROMPT)
    return rt.generate([Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=6))])[0].text


def test_serve_compiles_a_preset_or_yaml_plan_into_the_cache_and_serves_it(ckpt, tmp_path, monkeypatch):
    from specc.commands.compile import artifact_for, cache_dir

    cache = tmp_path / "cache"
    overrides = _overrides(ckpt)
    text, err = _serve(["smollm2_ngram", *overrides], cache, "smollm2_ngram")
    assert "compiled smollm2_ngram" in err, err
    monkeypatch.setenv("SPECC_CACHE_DIR", str(cache))
    arts = sorted(cache_dir().iterdir())
    assert len(arts) == 1 and arts[0].name.startswith("smollm2_ngram-")
    assert artifact_for("smollm2_ngram", overrides) == arts[0]  # what specc run would run: the same artifact
    ref = _reference(arts[0])
    assert text == ref and text.strip()

    # a YAML plan (its own name) with an override, and the artifact directory itself
    plan = tmp_path / "my_ngram.yaml"
    plan.write_text("name: my_ngram\nmethod:\n  name: ngram\n  num_steps: 3\n  ngram:\n    min: 1\n    max: 3\n")
    text, err = _serve([plan, *overrides, "method.num_steps=2"], cache, "my_ngram")
    assert "compiled my_ngram.yaml" in err, err
    mine = [a for a in cache_dir().iterdir() if a.name.startswith("my_ngram-")]
    assert len(mine) == 1 and text == _reference(mine[0])
    text, err = _serve([arts[0]], cache, "smollm2_ngram")
    assert text == ref and "compiled" not in err and "reused" not in err


def test_serve_refuses_overrides_with_an_artifact_and_a_bad_plan_before_loading(ckpt, tmp_path):
    from specc.compiler import build
    from specc.plan.load import load_plan
    from specc.serve.server import free_port

    art = build.compile_plan(load_plan("smollm2_ngram", _overrides(ckpt)).plan, tmp_path / "art").path
    for argv, words in (([art, "method.num_steps=2"], "overrides"),
                        (["smollm2_ngram", *_overrides(ckpt), "method.num_steps=-1"], "num_steps"),
                        (["no_such_plan_anywhere"], "no_such_plan_anywhere")):
        t0 = time.time()
        p = subprocess.run([sys.executable, "-m", "specc.cli", "serve", *map(str, argv), "--port",
                            str(free_port())],
                           capture_output=True, text=True, timeout=60, env=_env(tmp_path / "cache"))
        assert p.returncode != 0 and words in p.stderr, (argv, p.stderr)
        assert "Traceback" not in p.stderr
        assert time.time() - t0 < 30
