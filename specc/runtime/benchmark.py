"""Measure a runtime against plain decoding (κ = 0 through the same runtime and target) over a
prompt set: at batch 1 per category (decode tokens/s with prefill excluded, end-to-end tokens/s, τ,
speedup, and whether greedy outputs are identical — they must be), and under continuous batching at
a given concurrency (:func:`run_concurrency`: throughput, τ, time per output token, the κ the
schedule chose over time) next to the cost model's prediction from a profiled cost table
(:func:`predicted_decode_tok_s`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence


@dataclass
class RequestTiming:
    """One request: its category, output tokens, wall time, prefill time, verify steps, emitted."""

    category: str
    tokens: List[int]
    total_s: float
    prefill_s: float
    steps: int
    emitted: int


@dataclass
class CategoryStats:
    decode_tok_s: float
    e2e_tok_s: float
    tau: float
    num_tokens: int


def plain_runtime(runtime, batch_sizes: Sequence[int]):
    """Plain decoding (κ = 0 states, no drafter) over ``runtime``'s loaded target, run the way the
    artifact's runtime runs: same device, compile backend and CUDA-graph capture (a baseline without the
    captures the artifact gets would count launch overhead as speculation's gain).

    Args:
        runtime: a loaded :class:`specc.runtime.engine.Runtime` (its target, tokenizer, device,
            ``max_model_len`` and ``settings["compile_backend"]`` are shared, not copied).
        batch_sizes: one plain state per batch size (rows), e.g. ``[1]`` or the artifact's buckets.
    Returns:
        A new ``Runtime`` whose states verify one token per request (``[B, 1]`` verify inputs).
    Raises:
        nothing of its own; ``Runtime``'s errors for the states pass through."""
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    return Runtime(runtime.target, runtime.tokenizer, None,
                   [StateSpec(f"b{b}_k0_plain", "none", int(b), 0) for b in batch_sizes],
                   max_model_len=runtime.max_model_len, device=runtime.device,
                   compile_backend=runtime.settings.get("compile_backend", "eager"),
                   use_cuda_graphs=runtime.ctx.use_cuda_graphs)


def time_requests(runtime, requests: Sequence, categories: Sequence[str], on_done=None) -> List[RequestTiming]:
    """Run each request alone (batch 1), fresh metrics per request; returns one timing per request."""
    out = []
    for req, cat in zip(requests, categories):
        runtime.metrics = runtime.new_metrics()
        t0 = time.perf_counter()
        res = runtime.generate([req])[0]
        total = time.perf_counter() - t0
        m = runtime.metrics
        out.append(RequestTiming(cat, list(res.token_ids), total, m.stage_time_s["prefill"], m.num_steps, m.num_emitted))
        if on_done is not None:
            on_done()
    return out


def summarize(timings: Sequence[RequestTiming]) -> Dict[str, CategoryStats]:
    """Per category and ``"all"``: decode tok/s (prefill excluded, the first token — which the
    prefill yields — not counted: :func:`specc.runtime.metrics.decode_tokens_per_s`), end-to-end
    tok/s (all output tokens over wall time, prefill included), τ."""
    from specc.runtime.metrics import decode_tokens_per_s

    cats = sorted({t.category for t in timings}) + ["all"]
    stats = {}
    for c in cats:
        sel = [t for t in timings if c == "all" or t.category == c]
        n = sum(len(t.tokens) for t in sel)
        tot = sum(t.total_s for t in sel)
        pre = sum(t.prefill_s for t in sel)
        steps = sum(t.steps for t in sel)
        stats[c] = CategoryStats(decode_tokens_per_s(n, len(sel), tot, pre), n / tot if tot > 0 else 0.0,
                                 sum(t.emitted for t in sel) / steps if steps else 0.0, n)
    return stats


def format_table(results: Dict[str, Dict[str, CategoryStats]], baseline: str = "plain") -> str:
    """One row per (category, method): decode tok/s (prefill excluded), end-to-end tok/s (prefill
    included), τ, and the speedup over ``baseline`` on each of the two rates."""
    cats = list(next(iter(results.values())).keys())
    base = results.get(baseline)
    header = ("category", "method", "decode tok/s", "e2e tok/s", "tau", "decode x", "e2e x")
    rows = []
    for c in cats:
        for name, per in results.items():
            s = per[c]
            b = base[c] if base else None
            sp = s.decode_tok_s / b.decode_tok_s if b and b.decode_tok_s else float("nan")
            se = s.e2e_tok_s / b.e2e_tok_s if b and b.e2e_tok_s else float("nan")
            rows.append((c, name, f"{s.decode_tok_s:.1f}", f"{s.e2e_tok_s:.1f}", f"{s.tau:.2f}",
                         f"{sp:.2f}x", f"{se:.2f}x"))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(v).ljust(w) if i < 2 else str(v).rjust(w)  # noqa: E731
                              for i, (v, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


# ------------------------------------------------------------------ continuous batching at a concurrency
@dataclass
class ConcurrencyResult:
    """One run of ``requests`` with at most ``concurrency`` in flight (continuous batching).

    Throughputs are output tokens per second: ``output_tok_s`` over the whole run (prefills included),
    ``decode_tok_s`` the tokens after each request's first over its decode steps (wall time minus
    prefill; :func:`specc.runtime.metrics.decode_tokens_per_s`). ``tpot_ms_p50/p99``: per-request
    mean time per output token after the first, percentiles over requests; ``ttft_ms_p50/p99``: time
    to first token from admission. ``mean_batch``: live requests per decode step; ``drafts_per_req``:
    drafts verified per request and step; ``kappa_steps``: decode steps run at each κ;
    ``kappa_trace``: ``[(seconds, requests, κ), ...]`` subsampled to at most 200 points;
    ``stage_ms_per_step``: milliseconds per decode step in each stage (the drafter's host work in
    ``draft`` and ``extend``, the target in ``verify``)."""

    concurrency: int
    num_requests: int
    output_tokens: int
    wall_s: float
    prefill_s: float
    output_tok_s: float
    decode_tok_s: float
    tau: float
    acceptance_per_pos: List[float]
    tpot_ms_p50: float
    tpot_ms_p99: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    mean_batch: float
    drafts_per_req: float
    kappa_steps: Dict[int, int]
    kappa_switches: int
    kappa_trace: List[tuple]
    outputs: List[List[int]] = field(default_factory=list, repr=False)
    stage_ms_per_step: Dict[str, float] = field(default_factory=dict)


def _pct(xs: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else 0.0


def run_concurrency(runtime, requests: Sequence, concurrency: int) -> ConcurrencyResult:
    """Decode ``requests`` with at most ``concurrency`` live (``Runtime.generate(batch_size=...)``:
    a finished request's row is refilled from the queue at once), on fresh metrics."""
    from specc.runtime.metrics import decode_tokens_per_s

    runtime.metrics = runtime.new_metrics()
    t0 = time.perf_counter()
    outs = runtime.generate(list(requests), batch_size=concurrency)
    wall = time.perf_counter() - t0
    m = runtime.metrics
    n_out = sum(len(o.token_ids) for o in outs)
    prefill = m.stage_time_s.get("prefill", 0.0)
    trace = list(m.trace)
    req_steps = sum(t[1] for t in trace)
    stride = max(1, len(trace) // 200)
    return ConcurrencyResult(
        concurrency=concurrency, num_requests=len(outs), output_tokens=n_out, wall_s=wall, prefill_s=prefill,
        output_tok_s=n_out / wall if wall > 0 else 0.0,
        decode_tok_s=decode_tokens_per_s(n_out, len(outs), wall, prefill),
        tau=m.tau, acceptance_per_pos=m.acceptance_per_pos,
        tpot_ms_p50=_pct([o.tpot_s * 1e3 for o in outs if len(o.token_ids) > 1], 50),
        tpot_ms_p99=_pct([o.tpot_s * 1e3 for o in outs if len(o.token_ids) > 1], 99),
        ttft_ms_p50=_pct([o.ttft_s * 1e3 for o in outs], 50), ttft_ms_p99=_pct([o.ttft_s * 1e3 for o in outs], 99),
        mean_batch=req_steps / len(trace) if trace else 0.0,
        drafts_per_req=m.num_draft_tokens / req_steps if req_steps else 0.0,
        kappa_steps=dict(m.kappa_steps), kappa_switches=m.num_kappa_switches,
        kappa_trace=[(round(t, 3), n, k) for t, n, k, _ in trace[::stride]],
        outputs=[list(o.token_ids) for o in outs], stage_ms_per_step=dict(m.stage_ms_per_step))


def predicted_decode_tok_s(res: ConcurrencyResult, table, draft_passes: int) -> float:
    """The cost model's decode throughput for a measured run, from a profiled cost table
    (:class:`specc.predict.cost.CostTable`): at the run's mean batch B, each step emits B·τ tokens and costs
    ``draft_passes`` draft passes over B requests plus a verify of B·(1 + drafts per request) tokens
    (the roofline throughput model, ``batch · E / step time``, with E and the verified drafts
    taken from the run's own acceptance). A check of the cost side of the model, not of α."""
    b = max(res.mean_batch, 1e-9)
    d = table.draft_pass_ms(max(1, round(b))) or 0.0
    step_ms = draft_passes * d + table.step_ms(max(1, round(b * (1.0 + res.drafts_per_req))))
    return b * res.tau / step_ms * 1e3
