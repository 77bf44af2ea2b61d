"""Measure a runtime against plain decoding (κ = 0 through the same runtime and target) over a
prompt set, per category: decode tokens/s (prefill excluded), end-to-end tokens/s, τ, speedup, and
whether greedy outputs are identical (they must be)."""
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
