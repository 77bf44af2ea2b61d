"""Run configurations side by side at each concurrency through the runtime's concurrency benchmark
(:func:`specc.runtime.benchmark.run_concurrency`: continuous batching, at most C requests in flight,
a finished request's row refilled at once) — the confirmation step of ``specc tune`` and the
exhaustive benchmark ``tools/bench_tune.py``.

At each concurrency every configuration runs once per round, in an order reversed every other round,
and each keeps its best round: load from other jobs on a shared machine then falls on all
configurations alike. Every greedy output is compared with plain decoding's (they must be equal).
Per run it records the decode throughput and, per decode step, the measured time of each stage, so a
prediction that misses can be explained term by term (:func:`explain_miss`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from specc.tune.measure import DECODE_STAGES


@dataclass(frozen=True)
class Entry:
    """One configuration to run: ``label``, its candidate (None: plain decoding) and a function
    building its plan for a concurrency (``plan_for(C)``)."""

    label: str
    candidate: Any
    plan_for: Callable[[int], Any]
    config: Any = None  # the predictor's Config (static) or None (the chosen bucket plan)


@dataclass
class Result:
    """The kept (best) run of one configuration at one concurrency; ``round_tok_s`` holds every
    round's decode throughput (tokens/s) in the order the rounds ran, the kept one included (empty
    for a run outside :func:`side_by_side`)."""

    label: str
    concurrency: int
    decode_tok_s: float
    output_tok_s: float
    tau: float
    mean_batch: float
    steps: int
    decode_s: float
    stage_ms_per_step: Dict[str, float]
    kappa_steps: Dict[int, int]
    exact: Optional[bool] = None
    tpot_ms_p50: float = 0.0
    round_tok_s: List[float] = field(default_factory=list)
    outputs: List[List[int]] = field(default_factory=list, repr=False)

    @property
    def rounds(self) -> int:
        """Rounds run of this configuration at this concurrency."""
        return len(self.round_tok_s)


def requests_for(prompt_ids: Sequence[List[int]], concurrency: int, per_slot: int, minimum: int,
                 max_new_tokens: int) -> List[Any]:
    """``max(minimum, per_slot · C)`` requests cycling over ``prompt_ids``."""
    from specc.runtime.request import Request, SamplingParams

    n = max(minimum, per_slot * concurrency)
    return [Request(prompt_ids=list(prompt_ids[i % len(prompt_ids)]), request_id=f"r{i}",
                    params=SamplingParams(max_new_tokens=max_new_tokens)) for i in range(n)]


def run_one(models, entry: Entry, concurrency: int, requests: Sequence[Any]) -> Result:
    """Build ``entry``'s runtime for ``concurrency`` over the shared models and run ``requests``."""
    from specc.runtime.benchmark import run_concurrency

    rt = models.runtime(entry.plan_for(concurrency), entry.candidate)
    res = run_concurrency(rt, requests, concurrency)
    steps = sum(res.kappa_steps.values())
    decode_s = max(1e-9, res.wall_s - res.prefill_s)
    stages = {s: rt.metrics.stage_time_s.get(s, 0.0) * 1e3 / max(1, steps) for s in DECODE_STAGES}
    stages["step"] = decode_s * 1e3 / max(1, steps)
    return Result(label=entry.label, concurrency=concurrency, decode_tok_s=res.decode_tok_s,
                  output_tok_s=res.output_tok_s, tau=res.tau, mean_batch=res.mean_batch, steps=steps,
                  decode_s=decode_s, stage_ms_per_step=stages, kappa_steps=dict(res.kappa_steps),
                  tpot_ms_p50=res.tpot_ms_p50, outputs=res.outputs)


def side_by_side(models, entries: Sequence[Entry], concurrency: Sequence[int], prompt_ids: Sequence[List[int]], *,
                 max_new_tokens: int, per_slot: int = 2, minimum: int = 6, rounds: int = 1,
                 deadline: Optional[float] = None, estimate: Optional[Callable[[Entry, int, int], float]] = None,
                 on_run: Optional[Callable[[str, int, int], None]] = None) -> Tuple[Dict[Tuple[str, int], Result], List[str]]:
    """Run every entry at every concurrency, interleaved (module docstring). The first entry must be
    plain decoding (the reference for exactness). ``deadline``: ``time.monotonic()`` after which
    nothing more starts; with ``estimate(entry, C, requests)`` (seconds) a run that would end past it
    does not start either (what did not run is listed in the returned notes).

    Returns ``({(label, C): Result}, notes)``."""
    results: Dict[Tuple[str, int], Result] = {}
    notes: List[str] = []
    for c in concurrency:
        reqs = requests_for(prompt_ids, c, per_slot, minimum, max_new_tokens)
        for rnd in range(rounds):
            order = list(entries) if rnd % 2 == 0 else list(entries)[::-1]
            for e in order:
                if deadline is not None:
                    need = estimate(e, c, len(reqs)) if estimate is not None else 0.0
                    if time.monotonic() + need >= deadline:
                        if (e.label, c) not in results:
                            notes.append(f"{e.label} at C={c}: not run (time budget: about {need:.0f} s needed, "
                                         f"{max(0.0, deadline - time.monotonic()):.0f} s left)")
                        continue
                r = run_one(models, e, c, reqs)
                old = results.get((e.label, c))
                r.round_tok_s = (old.round_tok_s if old is not None else []) + [r.decode_tok_s]
                if old is None or r.decode_tok_s > old.decode_tok_s:
                    results[(e.label, c)] = r
                else:
                    old.round_tok_s = r.round_tok_s
                if on_run is not None:
                    on_run(e.label, c, rnd)
        ref = results.get((entries[0].label, c))
        for e in entries:
            r = results.get((e.label, c))
            if r is not None and ref is not None:
                r.exact = all(a == b for a, b in zip(ref.outputs, r.outputs))
    return results, notes


def explain_miss(pred_breakdown: Dict[str, float], result: Result) -> str:
    """Why a prediction missed, term by term: measured τ against predicted E, and each stage's
    measured ms per step against the predicted one; the term with the largest share of the error first."""
    e_pred = pred_breakdown["expected_tokens"]
    terms = []
    if e_pred > 0:
        rel = result.tau / e_pred - 1.0
        terms.append((abs(rel), f"τ {result.tau:.3f} measured vs E {e_pred:.3f} predicted "
                                f"({rel:+.0%}: acceptance on these requests differs from the measured sample)"))
    m = result.stage_ms_per_step
    step = max(1e-9, m.get("step", 0.0))
    pairs = (("verify", m.get("verify", 0.0) + m.get("accept", 0.0), pred_breakdown["verify_ms"],
              "the target verify (cost table or spot-timed shapes, × load factor λ measured at the measuring batch; "
              "the machine's load changed since, or λ does not carry to this batch)"),
             ("draft", m.get("draft", 0.0), pred_breakdown["draft_ms"], "the draft passes"),
             ("extend", m.get("extend", 0.0), pred_breakdown["extend_ms"], "the drafter's extend pass"),
             ("other", max(0.0, step - sum(m.get(s, 0.0) for s in ("verify", "accept", "draft", "extend"))),
              pred_breakdown["other_ms"], "host work per step (emit, commit, scheduling)"))
    for name, meas, pred, what in pairs:
        terms.append((abs(meas - pred) / step, f"{name} {meas:.1f} ms/step measured vs {pred:.1f} predicted ({what})"))
    if abs(result.mean_batch - pred_breakdown.get("batch", result.mean_batch)) > 0.5:
        terms.append((0.0, f"mean batch {result.mean_batch:.1f}"))
    terms.sort(key=lambda t: -t[0])
    return "; ".join(t for _, t in terms[:2])
