"""Predict decode throughput for every (drafter, κ or tree) at every batch size, and choose the plan.

The model is the one the rest of specc uses (:mod:`specc.predict.cost`), the roofline throughput (tokens/s =
B · E / step time) with

* **E** from the measured acceptance (:meth:`specc.predict.acceptance.Entry.expected_tokens`: 1 + Σ_{i<κ} r_i,
  E(α, κ) (Leviathan et al. 2023, arXiv:2211.17192) with per-position rates; a tree's measured τ), :func:`specc.predict.cost.expected_tokens_from_rates`;
* **step time** (:func:`specc.predict.cost.decode_step_ms`) = the verify time of the step's B requests and
  B · (1 + drafts per request) target tokens — the profiled cost table's (vLLM's ``build_table`` lookup,
  :meth:`specc.predict.cost.CostTable.step_ms`), or, when a spot check shows the table's shape no longer fits
  this machine, the forward timed now at B requests x W tokens (:class:`VerifyGrid`, :func:`table_fits`)
  — times the load factor λ (the verify time the measuring runs saw over that base for the same
  steps: the machine's load now against when the base was timed),
  plus the drafter's draft passes, its extend pass and the step's host work, each a linear fit
  a + b·B to the per-step stage times the measuring runs recorded (:func:`fit_stage_costs`; a draft
  pass scaled by the passes κ needs, :func:`specc.methods.proposal_passes`).

The plan (:func:`choose`): per drafter, at each batch bucket the shallowest κ predicted within
:data:`KAPPA_MARGIN` of the fastest (κ = 0 keeps the drafter's extend pass); the drafter whose bucket schedule has the best worst case over
the asked concurrencies, throughput over the best any configuration reaches there (plain decoding
included). Torch-free.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from specc import methods
from specc.predict import cost

VerifyMs = Callable[[float, float], float]  # (requests, verified target tokens) -> ms


@dataclass(frozen=True)
class Linear:
    """ms = a + b · rows, fitted to step samples (a, b ≥ 0)."""

    a: float = 0.0
    b: float = 0.0

    def __call__(self, rows: float) -> float:
        return self.a + self.b * rows


def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> Linear:
    """Least-squares a + b·x with a, b ≥ 0 (a negative intercept refits through the origin, a negative
    slope fits a constant). Empty input → zero cost."""
    if not xs:
        return Linear()
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:  # one batch size only: proportional to rows
        return Linear(0.0, my / mx if mx > 0 else 0.0)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    if b < 0:
        return Linear(max(0.0, my), 0.0)
    if a < 0:
        return Linear(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return Linear(a, b)


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through sorted ``xs``; before the first point the first segment's line,
    past the last the last segment's slope if it rises (a falling end — noise — holds the last value;
    a single point: constant). Never negative."""
    if len(xs) == 1:
        return max(0.0, ys[0])
    if x > xs[-1]:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        return max(0.0, ys[-1] + slope * (x - xs[-1]))
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def _interp_flat(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through sorted ``xs``, held at the end values outside them."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    return _interp(xs, ys, x)


def non_decreasing(ys: Sequence[float]) -> List[float]:
    """The least-squares non-decreasing fit to ``ys`` (pool-adjacent-violators: each run of values that
    falls is replaced by its mean). A verify of more tokens never costs less than one of fewer; timing
    noise that says otherwise would make a deeper draft look free."""
    blocks: List[List[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([float(y), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    out: List[float] = []
    for total, n in blocks:
        out += [total / n] * int(n)
    return out


@dataclass(frozen=True)
class VerifyGrid:
    """The target forward timed on the spot (:func:`specc.runtime.profile.time_state_shapes`) at
    shapes ``(R, W)``: R requests verifying W tokens each; ``ms[(R, W)]`` in milliseconds. Called as
    ``grid(rows, tokens)``: linear in the width ``tokens / rows`` at each measured R through the
    times made non-decreasing in W (:func:`non_decreasing`; the end slope beyond the widest), linear
    in rows between measured R, proportional to rows beyond the largest (smaller than the smallest:
    the smallest's time). The layout matters on the CPU: one request of
    W tokens and W one-token requests do not cost the same, which one token count cannot say.
    ``rows`` and ``tokens`` may be fractional (a run's mean batch). Raises ValueError when ``ms`` is
    empty or holds a non-positive R or W."""

    ms: Dict[Tuple[int, int], float]

    def __post_init__(self) -> None:
        if not self.ms or any(int(r) < 1 or int(w) < 1 for r, w in self.ms):
            raise ValueError(f"VerifyGrid needs at least one (R, W) shape with R, W >= 1, got {sorted(self.ms)}")

    def rows(self) -> List[int]:
        """The timed request counts R, ascending."""
        return sorted({r for r, _ in self.ms})

    def _at(self, r: int, width: float) -> float:
        ws = sorted(w for rr, w in self.ms if rr == r)
        return _interp(ws, non_decreasing([self.ms[(r, w)] for w in ws]), width)

    def __call__(self, rows: float, tokens: float) -> float:
        rows = max(1.0, float(rows))
        width = max(1.0, float(tokens) / rows)
        rs = self.rows()
        if rows <= rs[0]:
            return self._at(rs[0], width)
        if rows >= rs[-1]:
            return self._at(rs[-1], width) * rows / rs[-1]
        hi = next(r for r in rs if r >= rows)
        lo = max(r for r in rs if r < rows)
        y0, y1 = self._at(lo, width), self._at(hi, width)
        return y0 + (y1 - y0) * (rows - lo) / (hi - lo)


def suspect_shapes(ms: Dict[Tuple[int, int], float], observed: Optional[Dict[int, float]] = None,
                   tolerance: float = 0.1) -> List[Tuple[int, int]]:
    """Spot timings to time again: a shape ``(R, W)`` that took longer than a wider shape of the same
    R by more than ``tolerance`` (a verify of more tokens does not cost less: a burst of load fell on
    it), and a one-token shape ``(R, 1)`` whose ratio to ``observed[R]`` — the one-token verify the
    measuring runs saw at R live requests, ms — is off the median ratio over the R both have by more
    than twice ``tolerance``. Each suspect comes with the other widths of its R (so the retimed row
    is compared within one pass). ``ms``: ``{(R, W): ms}``. Returns the shapes, sorted."""
    out = set()
    rows = sorted({r for r, _ in ms})
    for r in rows:
        ws = sorted(w for rr, w in ms if rr == r)
        for i, w in enumerate(ws):
            if any(ms[(r, w)] > (1.0 + tolerance) * ms[(r, v)] for v in ws[i + 1:]):
                out.update((r, v) for v in ws)
    ratios = {r: ms[(r, 1)] / observed[r] for r in rows if (r, 1) in ms and observed and observed.get(r, 0) > 0}
    if len(ratios) >= 3:
        mid = statistics.median(ratios.values())
        for r, q in ratios.items():
            if abs(q / mid - 1.0) > 2 * tolerance:
                out.update((r, w) for rr, w in ms if rr == r)
    return sorted(out)


def table_fits(grid: VerifyGrid, table: cost.CostTable, tolerance: float) -> Tuple[bool, float, float]:
    """Whether the cost table's shape fits the spot timings: the ratio spot / table over every measured
    shape (R x W against the table's R·W tokens) varies by at most ``1 + tolerance`` (a common factor is
    the load, which λ covers; a varying one is a shape λ cannot fix). Returns ``(fits, lowest ratio,
    highest ratio)``. The table holds its token counts' verify (forward and accept) in its own layout
    (n tokens as ``min(n, max_batch)`` requests, :mod:`specc.runtime.profile`), the grid the forward at
    R x W: layout and the accept kernel are part of what it checks."""
    ratios = [ms / max(1e-9, table.step_ms(r * w)) for (r, w), ms in grid.ms.items()]
    lo, hi = min(ratios), max(ratios)
    return hi <= (1.0 + tolerance) * lo, lo, hi


def pad_cost(grid: VerifyMs, rows: int, width: int, ragged_ms: float) -> float:
    """ms per padded token slot of a ragged verify: ``ragged_ms``, the forward of ``rows`` requests of
    which one verifies ``width`` tokens and the others one (:func:`specc.runtime.profile.time_state_shapes`
    shape ``(rows, width, 1)``), less ``grid``'s time for its ``rows − 1 + width`` real tokens, over
    the ``(rows − 1)(width − 1)`` slots it pads. Never negative; 0 when nothing is padded."""
    real = rows - 1 + width
    slots = rows * width - real
    if slots <= 0:
        return 0.0
    return max(0.0, (ragged_ms - grid(rows, real)) / slots)


def table_verify(table: cost.CostTable) -> VerifyMs:
    """The cost table as a :data:`VerifyMs`: the time of the step's token count, whatever the rows."""
    return lambda rows, tokens: table.step_ms(max(1, int(round(tokens))))


@dataclass(frozen=True)
class StageCosts:
    """A drafter's measured per-step costs (ms) by live rows: ``draft`` at the measured κ, ``extend``,
    ``other`` (host work: commit, emit, scheduling), and ``load`` λ: the measured verify + accept time
    over the verify base's (the cost table or the spot grid) for the same steps (median over steps);
    ``load_by_rows``: the same median per live-row count that has at least ``LOAD_MIN_SAMPLES`` steps."""

    draft: Linear = Linear()
    extend: Linear = Linear()
    other: Linear = Linear()
    load: float = 1.0
    samples: int = 0
    load_by_rows: Dict[int, float] = field(default_factory=dict)


#: steps a live-row count needs in a measuring run before it gets its own load factor
LOAD_MIN_SAMPLES = 5


def step_verify_ms(verify: VerifyMs, pad_ms: float, entry, num_steps: int, rows: float) -> float:
    """The base verify time (before λ) of one step of ``rows`` requests at κ = ``num_steps`` (0 or
    ``entry`` None: plain decoding): ``verify(rows, rows · (1 + d))`` for the d drafts per request
    (:meth:`specc.predict.acceptance.Entry.drafts_per_step`) plus ``pad_ms`` per token slot the ragged
    verify pads — every row to the widest row's drafts (:meth:`specc.predict.acceptance.Entry.widest_drafts`),
    so ``rows · (widest − d)`` slots. A drafter whose requests draft different lengths (a lookup:
    n-gram, suffix) pays for the padding at batch; one that always drafts κ pays none."""
    if entry is None or num_steps <= 0:
        return verify(rows, max(1.0, rows))
    d = entry.drafts_per_step(num_steps)
    pad = max(0.0, entry.widest_drafts(num_steps, rows) - d) * max(1.0, rows) * pad_ms
    return verify(rows, max(1.0, rows * (1.0 + d))) + pad


def fit_stage_costs(samples: Sequence, verify_at: Callable[[float, int], float]) -> StageCosts:
    """Fit :class:`StageCosts` to a measuring run's step samples (:class:`specc.tune.measure.StepSample`).
    ``verify_at(rows, κ)``: the base verify time (ms) of a step of the run at that many rows and the
    step's κ (:func:`step_verify_ms` over :func:`table_verify` or a :class:`VerifyGrid`)."""
    rows = [float(s.rows) for s in samples if s.rows > 0]
    ss = [s for s in samples if s.rows > 0]
    if not ss:
        return StageCosts()
    draft = fit_linear(rows, [s.stage_ms.get("draft", 0.0) for s in ss])
    extend = fit_linear(rows, [s.stage_ms.get("extend", 0.0) for s in ss])
    known = ("draft", "verify", "accept", "extend")
    other = fit_linear(rows, [max(0.0, s.wall_ms - sum(s.stage_ms.get(k, 0.0) for k in known)) for s in ss])
    ratios: Dict[int, List[float]] = {}
    for s in ss:
        ratios.setdefault(int(s.rows), []).append(
            (s.stage_ms.get("verify", 0.0) + s.stage_ms.get("accept", 0.0)) / max(1e-9, verify_at(s.rows, s.num_steps)))
    by_rows = {r: statistics.median(v) for r, v in ratios.items() if len(v) >= LOAD_MIN_SAMPLES}
    return StageCosts(draft=draft, extend=extend, other=other, samples=len(ss), load_by_rows=by_rows,
                      load=statistics.median([x for v in ratios.values() for x in v]))


@dataclass(frozen=True)
class Config:
    """One configuration: ``candidate`` name (None: plain decoding) at κ = ``num_steps``."""

    candidate: Optional[str]
    num_steps: int

    @property
    def label(self) -> str:
        if self.candidate is None:
            return "plain"
        return f"{self.candidate} κ={self.num_steps}"


@dataclass
class Predictor:
    """Predicted decode tokens/s of configurations (module docstring). ``candidates``: name →
    :class:`specc.tune.candidates.Candidate`; ``entries``: name → acceptance entry; ``costs``: name →
    :class:`StageCosts` (``None`` key: plain decoding's run); ``load``: λ used for every prediction;
    ``grid``: the spot-timed verify (:class:`VerifyGrid`) used in place of the table's, or None;
    ``load_rows``: λ per live-row count where the measuring runs saw enough steps at it
    (:meth:`load_at`), empty to use ``load`` everywhere; ``pad_ms``: the time of one padded token slot
    of a ragged verify (:func:`step_verify_ms`, :func:`pad_cost`)."""

    table: cost.CostTable
    candidates: Dict[str, object]
    entries: Dict[str, object]
    costs: Dict[Optional[str], StageCosts]
    load: float = 1.0
    grid: Optional[VerifyGrid] = None
    load_rows: Dict[int, float] = field(default_factory=dict)
    pad_ms: float = 0.0

    def load_at(self, rows: float) -> float:
        """λ at ``rows`` live requests: linear between the row counts of ``load_rows``, the nearest
        one's beyond them (the measuring runs see at most the measuring batch), ``load`` without any.
        The runtime's verify at one request need not be the bare forward's times the λ of eight: the
        per-row ratio carries what the single factor cannot."""
        if not self.load_rows:
            return self.load
        rs = sorted(self.load_rows)
        return _interp_flat(rs, [self.load_rows[r] for r in rs], float(rows))

    def base_verify_ms(self, rows: float, tokens: float) -> float:
        """The verify base before λ: the spot grid where one is used, else the cost table."""
        return (self.grid or table_verify(self.table))(rows, tokens)

    def breakdown(self, config: Config, batch: float) -> Dict[str, float]:
        """The predicted step of ``config`` at ``batch`` live requests: E, verify tokens, and ms per
        term (``verify``, ``draft``, ``extend``, ``other``, ``step``) and ``tok_s``."""
        b = max(1e-9, float(batch))
        entry, k = None, 0
        if config.candidate is None:
            c = self.costs.get(None) or StageCosts()
            e, d, draft, extend = 1.0, 0.0, 0.0, 0.0
        else:
            cand = self.candidates[config.candidate]
            entry = self.entries[config.candidate]
            c = self.costs.get(config.candidate) or StageCosts()
            k = config.num_steps
            e = entry.expected_tokens(k)
            d = entry.drafts_per_step(k)
            m = cand.plan.method
            parallel = methods.is_parallel(m.name, m.parallel_drafting)
            passes = methods.proposal_passes(m.name, k, int(m.topk or 1), parallel, m.tree_choices)
            passes_meas = methods.proposal_passes(m.name, cand.measure_steps, int(m.topk or 1), parallel,
                                                  m.tree_choices)
            if k == 0:
                draft = 0.0
            elif passes_meas:
                draft = c.draft(b) * passes / passes_meas
            else:  # a lookup: host work per row, whatever κ
                draft = c.draft(b)
            extend = c.extend(b)
        tokens = b * (1.0 + d)
        verify = self.load_at(b) * step_verify_ms(self.base_verify_ms, self.pad_ms, entry, k, b)
        other = c.other(b)
        step = cost.decode_step_ms(int(round(b)), tokens, lambda n: verify, 1, draft, extend, other)
        return {"expected_tokens": e, "verify_tokens": tokens, "verify_ms": verify, "draft_ms": draft,
                "extend_ms": extend, "other_ms": other, "step_ms": step,
                "tok_s": cost.decode_throughput(b, e, step)}

    def tok_s(self, config: Config, batch: float) -> float:
        return self.breakdown(config, batch)["tok_s"]

    def configs(self, name: str) -> List[Config]:
        """Every static configuration of candidate ``name``: each κ it covers."""
        return [Config(name, k) for k in self.candidates[name].kappas]

    def all_configs(self) -> List[Config]:
        out = [Config(None, 0)]
        for name in self.candidates:
            out += self.configs(name)
        return out


@dataclass
class Choice:
    """The chosen drafter, its κ per bucket, its predicted throughput per concurrency, and each
    drafter's score (worst ratio over the concurrencies, throughput over the best predicted there)."""

    candidate: str
    buckets: Dict[int, int]
    predicted: Dict[int, float]
    best: Dict[int, Tuple[str, float]]
    scores: Dict[str, float] = field(default_factory=dict)
    per_drafter: Dict[str, Dict[int, Tuple[int, float]]] = field(default_factory=dict)


def bucket_sizes(concurrency: Sequence[int]) -> List[int]:
    """Batch buckets the plan captures: powers of two up to the largest concurrency, and each
    concurrency asked."""
    top = max(concurrency)
    sizes = {1 << i for i in range(0, int(math.log2(top)) + 1)} | set(int(c) for c in concurrency)
    return sorted(s for s in sizes if s <= top)


def merge_buckets(kappas: Dict[int, int]) -> Dict[int, int]:
    """Drop buckets that repeat the κ of the one below (floor lookup keeps them)."""
    out: Dict[int, int] = {}
    prev = None
    for b in sorted(kappas):
        if kappas[b] != prev:
            out[b] = kappas[b]
            prev = kappas[b]
    return out


def served_requests(sizes: Sequence[int], b: int) -> List[int]:
    """The ends of the range of running-request counts whose κ the bucket ``b`` sets under floor
    lookup (vLLM's dynamic K, ``specc.runtime.schedule.floor_slot``): from ``b`` to one below the next
    bucket. A bucket between the concurrencies asked is reached while a batch fills or drains; at
    its top end each request's draft costs more verify than at ``b``, so a κ that pays only at ``b``
    would cost throughput over most of its range."""
    later = [s for s in sizes if s > b]
    return [b] if not later else sorted({b, later[0] - 1})


#: a deeper κ must be predicted this much faster than a shallower one to be chosen (κ = 0 included)
KAPPA_MARGIN = 0.03


def shallowest_within(kappas: Sequence[int], value: Callable[[int], float], margin: float = KAPPA_MARGIN) -> int:
    """The smallest κ whose ``value`` (tokens/s) is within ``margin`` of the best: a deeper draft must
    pay by more than the predictions' noise. The deeper the draft, the more its payoff rests on
    acceptance far down the chain and on the verify slope, the two least certain terms; a near tie
    decided by timing noise swung a bucket between κ = 0 and κ = 7 from one run to the next."""
    vals = {k: value(k) for k in kappas}
    top = max(vals.values())
    return min(k for k, v in vals.items() if v >= top / (1.0 + margin))


def choose(pred: Predictor, concurrency: Sequence[int], exclude: Sequence[str] = (),
           measured: Optional[Dict[Tuple[Optional[str], int, int], float]] = None,
           scale: Optional[Dict[Tuple[Optional[str], int], float]] = None) -> Choice:
    """The plan: per drafter its best κ at each bucket (:func:`bucket_sizes`; the shallowest within
    :data:`KAPPA_MARGIN` of the best, :func:`shallowest_within`, judged by its worst ratio to the best
    κ over the request counts the bucket serves, :func:`served_requests`); the drafter whose
    worst ratio over ``concurrency`` (its throughput / the best of every configuration and plain
    decoding there) is highest, ties to the higher mean ratio. ``exclude``: drafters not to pick.
    ``measured``: ``{(candidate, κ, C): tok/s}`` from side-by-side runs (brought to batch C), used in
    place of the prediction where present (at a concurrency or a bucket); ``scale``: ``{(candidate,
    C): factor}`` (None: plain decoding), the measured over predicted throughput of that candidate's
    runs at C, applied to its predictions that were not run (κ = 0 takes plain decoding's: the drafter
    idles), so measured and predicted compare; at a bucket that was not run, the factor of the
    concurrency nearest it (log2), a candidate's taken relative to plain decoding's in the same
    side-by-side (so two identical runs' noise does not become a drafter's gain), and a candidate
    that ran nowhere takes plain decoding's."""
    sizes = bucket_sizes(concurrency)

    def nearest(who: Optional[str], c: int) -> Optional[int]:
        runs = [cc for n, cc in (scale or {}) if n == who]
        return min(runs, key=lambda s: (abs(math.log2(s) - math.log2(max(1, c))), s)) if runs else None

    def factor(name: Optional[str], c: int) -> float:
        """Plain decoding's factor at the concurrency nearest c (log2; a tie to the smaller) among those
        it ran, times the candidate's own factor relative to plain's where both ran side by side,
        at the concurrency nearest c among the candidate's: the machine's load at c is carried by
        plain decoding, the model's error for the drafter by the ratio. A candidate that ran where
        plain decoding did not keeps its own factor; one that ran nowhere takes plain's."""
        base_c = nearest(None, c)
        base = scale[(None, base_c)] if base_c is not None else 1.0
        if name is None:
            return base
        own = nearest(name, c)
        if own is None:
            return base
        if (None, own) in scale:
            return base * scale[(name, own)] / max(1e-9, scale[(None, own)])
        return scale[(name, own)]

    def value(name: Optional[str], k: int, c: int) -> float:
        if measured and (name, k, c) in measured:
            return measured[(name, k, c)]
        return pred.tok_s(Config(name, k), c) * factor(name if k > 0 else None, c)

    per: Dict[str, Dict[int, Tuple[int, float]]] = {}
    for name in pred.candidates:
        per[name] = {}
        ks = [0] + list(pred.candidates[name].kappas)
        for b in sizes:
            rows = served_requests(sizes, b)
            vals = {(kk, r): value(name, kk, r) for kk in ks for r in rows}
            tops = {r: max(vals[(kk, r)] for kk in ks) for r in rows}
            k = shallowest_within(ks, lambda kk: min(vals[(kk, r)] / tops[r] for r in rows))
            per[name][b] = (k, value(name, k, b))
    best: Dict[int, Tuple[str, float]] = {}
    for c in concurrency:
        options = [("plain", value(None, 0, c))]
        for name in pred.candidates:
            for k in pred.candidates[name].kappas:
                options.append((Config(name, k).label, value(name, k, c)))
            options.append((f"{name} buckets", per[name][c][1]))
        best[c] = max(options, key=lambda o: o[1])
    scores: Dict[str, float] = {}
    means: Dict[str, float] = {}
    for name in pred.candidates:
        ratios = [per[name][c][1] / best[c][1] for c in concurrency]
        scores[name] = min(ratios)
        means[name] = sum(ratios) / len(ratios)
    pick = max((n for n in pred.candidates if n not in exclude), key=lambda n: (scores[n], means[n]))
    return Choice(candidate=pick, buckets=merge_buckets({b: per[pick][b][0] for b in sizes}),
                  predicted={c: per[pick][c][1] for c in concurrency}, best=best, scores=scores, per_drafter=per)


def top_configs(pred: Predictor, batch: int, n: int) -> List[Config]:
    """The ``n`` static drafter configurations with the highest predicted throughput at ``batch``."""
    cfgs = [c for c in pred.all_configs() if c.candidate is not None]
    return sorted(cfgs, key=lambda c: -pred.tok_s(c, batch))[:n]


def adaptive_candidates(pred: Predictor, name: str, batch: int, within: float = 0.03) -> List[int]:
    """κ candidates of an adaptive bucket: every κ predicted within ``within`` of the best at ``batch``."""
    ks = [0] + list(pred.candidates[name].kappas)
    vals = {k: pred.tok_s(Config(name, k), batch) for k in ks}
    top = max(vals.values())
    return sorted(k for k, v in vals.items() if v >= (1 - within) * top)


# ----------------------------------------------------------------------------------------------------
# the record a tuned plan carries: what this predictor needs, beside the cost table it read
# ----------------------------------------------------------------------------------------------------

#: the key of the block ``specc tune`` adds to the cost table it writes beside the plan (``S.cost_table.json``)
RECORD_KEY = "tune"


def _costs_json(c: StageCosts) -> Dict[str, object]:
    return {"draft": [c.draft.a, c.draft.b], "extend": [c.extend.a, c.extend.b], "other": [c.other.a, c.other.b],
            "load": c.load, "samples": c.samples, "load_by_rows": {str(r): v for r, v in sorted(c.load_by_rows.items())}}


def _costs_from(obj: object, where: str) -> StageCosts:
    """A :class:`StageCosts` from its JSON (:func:`_costs_json`). Raises ValueError naming ``where``."""
    try:
        lin = {k: Linear(float(obj[k][0]), float(obj[k][1])) for k in ("draft", "extend", "other")}  # type: ignore[index]
        rows = {int(r): float(v) for r, v in (obj.get("load_by_rows") or {}).items()}  # type: ignore[union-attr]
        return StageCosts(load=float(obj.get("load", 1.0)), samples=int(obj.get("samples", 0)),  # type: ignore[union-attr]
                          load_by_rows=rows, **lin)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise ValueError(f"{where}: expected {{\"draft\": [a, b], \"extend\": [a, b], \"other\": [a, b], ...}} "
                         f"(ms = a + b · rows)") from None


def record_block(pred: Predictor, candidate: str, concurrency: Sequence[int],
                 measured: Optional[Dict[int, Dict[str, float]]] = None, measured_source: str = "") -> Dict[str, object]:
    """The ``tune`` block of the cost table ``specc tune`` writes beside the plan: everything
    :class:`Predictor` read besides the table and the acceptance record, for the chosen ``candidate``
    and plain decoding: the stage costs (ms = a + b · rows), λ (``load``, ``load_rows``), the spot-timed
    verify grid (``"RxW": ms``, or None), ``pad_ms``, the measured κ, the concurrencies planned for, and
    what the confirming runs measured there (``measured``: ``{C: {"plan": tok/s, "plain": tok/s}}``,
    from ``measured_source``)."""
    cand = pred.candidates[candidate]
    return {"candidate": candidate, "measure_steps": int(getattr(cand, "measure_steps", 0)),
            "concurrency": [int(c) for c in concurrency], "load": pred.load,
            "load_rows": {str(r): v for r, v in sorted(pred.load_rows.items())},
            "grid": ({f"{r}x{w}": v for (r, w), v in sorted(pred.grid.ms.items())} if pred.grid is not None else None),
            "pad_ms": pred.pad_ms,
            "costs": {"plain": _costs_json(pred.costs.get(None) or StageCosts()),
                      "candidate": _costs_json(pred.costs.get(candidate) or StageCosts())},
            "measured": {str(c): dict(v) for c, v in sorted((measured or {}).items())},
            "measured_source": measured_source}


@dataclass(frozen=True)
class PlanCandidate:
    """What :meth:`Predictor.breakdown` reads of a candidate, for a plan outside a tune session: the
    plan (its ``method``) and the κ its stage costs were measured at."""

    plan: object
    measure_steps: int
    kappas: Tuple[int, ...] = ()


def plan_predictor(plan, table: cost.CostTable, raw: Dict[str, object], entry, where: str) -> Predictor:
    """The :class:`Predictor` of ``plan`` (its drafter named ``plan.name``) over ``table`` (loaded from
    ``where``; ``raw``: its JSON) and the acceptance ``entry`` (None for plain decoding): with the
    ``tune`` block (:func:`record_block`) ``specc tune`` wrote, exactly the predictor tune chose the
    plan with; without it, the table alone (its draft pass by rows, no host work, λ = 1). Raises
    ValueError naming ``where`` for a malformed block."""
    block = raw.get(RECORD_KEY)
    name = str(plan.name)
    k_top = max([int(plan.method.num_steps or 0)] + [int(k) for b in (plan.schedule.buckets or {}).values()
                                                      for k in (getattr(b, "candidates", None) or [])])
    if not isinstance(block, dict):
        draft = Linear()
        if table.draft_x and table.draft_applies(plan.method.name):
            draft = fit_linear([float(x) for x in table.draft_x], list(table.draft_ms))
        return Predictor(table=table, candidates={name: PlanCandidate(plan, max(1, k_top))},
                         entries={name: entry}, costs={None: StageCosts(), name: StageCosts(draft=draft)})
    try:
        grid = block.get("grid")
        grid = VerifyGrid({(int(k.split("x")[0]), int(k.split("x")[1])): float(v) for k, v in grid.items()}) \
            if grid else None
        costs = block["costs"]
        return Predictor(table=table, candidates={name: PlanCandidate(plan, int(block["measure_steps"]) or max(1, k_top))},
                         entries={name: entry},
                         costs={None: _costs_from(costs["plain"], f"{where}: tune.costs.plain"),
                                name: _costs_from(costs["candidate"], f"{where}: tune.costs.candidate")},
                         load=float(block.get("load", 1.0)),
                         load_rows={int(r): float(v) for r, v in (block.get("load_rows") or {}).items()},
                         grid=grid, pad_ms=float(block.get("pad_ms", 0.0)))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise ValueError(f"{where}: the {RECORD_KEY!r} block does not read ({exc}); run `specc tune` again") from None


def plan_at(pred: Predictor, name: str, buckets: Dict[int, Sequence[int]], concurrency: int) -> Dict[str, object]:
    """The plan at ``concurrency`` live requests as ``specc tune`` predicts it: the bucket the runtime's
    floor lookup routes to (:func:`specc.compiler.lower.route_slot`), its κ (of several candidates, the
    fastest predicted), and ``{"concurrency", "bucket", "num_steps", "tok_s", "plain_tok_s", "speedup",
    "expected_tokens", "step_ms"}`` (tok/s: decode tokens per second over the batch)."""
    from specc.compiler.lower import route_slot

    keys = sorted(int(b) for b in buckets)
    slot = route_slot(keys, max(1, int(concurrency))) if keys else None
    ks = [int(k) for k in (buckets.get(slot) if slot is not None else None) or [0]]
    cfgs = [Config(name, k) if k > 0 else Config(None, 0) for k in ks]
    best = max(cfgs, key=lambda c: pred.tok_s(c, concurrency))
    b = pred.breakdown(best, concurrency)
    plain = pred.tok_s(Config(None, 0), concurrency)
    return {"concurrency": int(concurrency), "bucket": slot, "num_steps": best.num_steps, "tok_s": b["tok_s"],
            "plain_tok_s": plain, "speedup": b["tok_s"] / plain if plain > 0 else None,
            "expected_tokens": b["expected_tokens"], "step_ms": b["step_ms"]}


def plan_predictions(plan, buckets: Optional[Dict[int, Sequence[int]]] = None,
                     concurrency: Optional[Sequence[int]] = None) -> Dict[str, object]:
    """What ``explain``, ``bench`` and ``serve`` say a plan does at each concurrency, from the records the
    plan carries: ``schedule.cost_table`` (with its ``tune`` block when ``specc tune`` wrote it:
    :func:`plan_predictor`) and the acceptance ``plan_acceptance`` finds (``schedule.acceptance`` first).

    Args:
        plan: a resolved :class:`specc.plan.schema.Plan`.
        buckets: ``{batch bucket: [κ, ...]}`` as the engine runs the plan (default: the plan's
            ``schedule.buckets``, else ``{1: [method.num_steps]}``).
        concurrency: the concurrencies to predict (default: those ``specc tune`` planned for, else the buckets).
    Returns:
        ``{"cost_table", "acceptance" (the α source), "acceptance_path" (the record file, or None), "tuned",
        "concurrency", "rows", "measured_source", "unknown"}``:
        ``rows`` one :func:`plan_at` dict per concurrency, with ``measured_tok_s`` / ``measured_plain_tok_s``
        / ``measured_speedup`` where tune's confirming runs measured the plan there (else None);
        ``unknown`` says why there are no rows (no cost table, α unknown), else None.
    Raises:
        PlanError: naming ``schedule.cost_table`` or ``schedule.acceptance`` when a record does not read.
    """
    from pathlib import Path

    from specc.errors import PlanError
    from specc.io import COST_TABLE_LIMIT, load_json, read_bounded
    from specc.predict import sizing

    out: Dict[str, object] = {"cost_table": plan.schedule.cost_table, "acceptance": None, "tuned": False,
                              "concurrency": [], "rows": [], "measured_source": None, "unknown": None}
    drafts = methods.get(plan.method.name).drafts
    alpha, source, entry = sizing.plan_acceptance(plan)
    out["acceptance"] = source
    out["acceptance_path"] = getattr(entry, "path", None) if entry is not None else None
    if drafts and (sizing.alpha_is_assumed(source) or entry is None):
        out["unknown"] = ("α unknown: no acceptance record applies to this plan (`specc tune PROMPTS` measures one), "
                          "so no speedup is predicted" if sizing.alpha_is_assumed(source) else
                          f"no per-position acceptance ({source}): the per-concurrency prediction reads an acceptance "
                          f"record (schedule.acceptance, or the drafter's record)")
        return out
    if not plan.schedule.cost_table:
        out["unknown"] = ("no cost table: set schedule.cost_table (`specc profile PLAN --out FILE`, or the one "
                          "`specc tune` writes beside its plan)")
        return out
    table = cost.load_cost_table(str(plan.schedule.cost_table))
    try:
        raw = load_json(str(read_bounded(Path(table.path), COST_TABLE_LIMIT, "cost table")), table.path)
    except Exception as exc:  # read once already by load_cost_table: only a race gets here
        raise PlanError(f"schedule.cost_table: {exc}") from None
    try:
        pred = plan_predictor(plan, table, raw if isinstance(raw, dict) else {}, entry if drafts else None, table.path)
    except ValueError as exc:
        raise PlanError(f"schedule.cost_table: {exc}") from None
    block = raw.get(RECORD_KEY) if isinstance(raw, dict) else None
    out["tuned"] = isinstance(block, dict)
    if buckets is None:
        if plan.schedule.kind in ("batch_buckets", "adaptive") and plan.schedule.buckets:
            buckets = {int(b): list(v.candidates or []) for b, v in plan.schedule.buckets.items()}
        else:
            buckets = {1: [int(plan.method.num_steps or 0)]}
    if not drafts:
        buckets = {1: [0]}
    if concurrency is None:
        concurrency = (block or {}).get("concurrency") or sorted(buckets)
    measured = (block or {}).get("measured") or {}
    if measured and (block or {}).get("measured_source"):
        out["measured_source"] = str(Path(table.path).parent / str(block["measured_source"]))
    rows = []
    for c in concurrency:
        row = plan_at(pred, str(plan.name), buckets, int(c))
        m = measured.get(str(int(c))) or {}
        mp, mb = m.get("plan"), m.get("plain")
        row.update(measured_tok_s=mp, measured_plain_tok_s=mb,
                   measured_speedup=(mp / mb) if mp and mb else None)
        rows.append(row)
    out["concurrency"] = [int(c) for c in concurrency]
    out["rows"] = rows
    return out
