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
    """Per category and ``"all"``: decode tok/s = tokens / (wall − prefill), e2e tok/s, τ."""
    cats = sorted({t.category for t in timings}) + ["all"]
    stats = {}
    for c in cats:
        sel = [t for t in timings if c == "all" or t.category == c]
        n = sum(len(t.tokens) for t in sel)
        dec = sum(t.total_s - t.prefill_s for t in sel)
        tot = sum(t.total_s for t in sel)
        steps = sum(t.steps for t in sel)
        stats[c] = CategoryStats(n / dec if dec > 0 else 0.0, n / tot if tot > 0 else 0.0,
                                 sum(t.emitted for t in sel) / steps if steps else 0.0, n)
    return stats


def format_table(results: Dict[str, Dict[str, CategoryStats]], baseline: str = "plain") -> str:
    """Rows = methods; per category ``decode tok/s | τ | speedup``."""
    cats = list(next(iter(results.values())).keys())
    lines = [f"{'method':14s}" + "".join(f"{c[:16]:>22s}" for c in cats)]
    base = results.get(baseline)
    for name, per in results.items():
        row = f"{name:14s}"
        for c in cats:
            s = per[c]
            sp = s.decode_tok_s / base[c].decode_tok_s if base and base[c].decode_tok_s else float("nan")
            row += f"{s.decode_tok_s:8.1f} t/s {s.tau:4.2f} {sp:4.2f}x".rjust(22)
        lines.append(row)
    return "\n".join(lines)
