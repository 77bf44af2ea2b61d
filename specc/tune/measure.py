"""Measure a candidate drafter on the user's prompts: acceptance per draft position (an acceptance
record entry, :mod:`specc.predict.acceptance`) and what each decode step cost, stage by stage, at the live
batch of that step.

The candidate decodes the prompts through the runtime (continuous batching, at most ``batch_size``
requests in flight, greedy, κ = the candidate's ``measure_steps``). Each finished request adds its
counters; the run stops as soon as the 95 % interval of τ (:func:`specc.predict.acceptance.ratio_ci`, requests
as clusters) is within ``tolerance`` of τ on either side (and at least ``min_requests`` finished), when
its time share is spent (once at least one decode step ran), or when the prompts run out. Requests
still decoding then are cancelled and their partial counters kept (every verify step they took is a
valid observation).

Per decode step a :class:`StepSample` records the live rows, κ and the seconds each stage took
(``draft``, ``verify``, ``accept``, ``commit``, ``emit``, ``extend``; :mod:`specc.runtime.metrics`), so
the predictions charge a drafter what it measurably costs at a batch size
(:func:`specc.tune.predict.fit_stage_costs`).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

DECODE_STAGES = ("draft", "verify", "accept", "commit", "emit", "extend")
#: decode steps a measuring run takes at each ramp level before the next: enough for a load factor of
#: its own at that live-row count (``specc.tune.predict.LOAD_MIN_SAMPLES``), so a prediction at one or
#: two requests is not scaled by the λ of the measuring batch
RAMP_STEPS = 5


@dataclass(frozen=True)
class StepSample:
    """One decode step: ``rows`` live requests at κ = ``num_steps``; ``stage_ms`` per stage and
    ``wall_ms`` for the whole step (milliseconds)."""

    rows: int
    num_steps: int
    wall_ms: float
    stage_ms: Dict[str, float]


@dataclass
class Measurement:
    """What :func:`measure` found for one candidate: the acceptance ``entry``, per-step ``samples``,
    ``seconds`` spent, why it stopped, and the decode tokens/s of the measuring run itself."""

    name: str
    entry: Any
    samples: List[StepSample]
    seconds: float
    stop_reason: str
    requests: int
    decode_tok_s: float = 0.0
    load_s: float = 0.0
    notes: List[str] = field(default_factory=list)


class Models:
    """The target (loaded once) and each candidate's drafter (loaded on first use), shared by every
    runtime tune builds from a compiled artifact (:meth:`runtime`). ``dtype``: the target's dtype; None
    (default) takes the runtime's rule for this target and ``choice`` (a cost table's ``choice``, the
    device profile's measured dtype and kernel variant), loaded as ``specc run`` loads it
    (:func:`specc.runtime.loader.load_spec_target`), so tune and a benchmark of its plans measure the
    kernels the runtime would run. ``artifact_dir``: where candidates are compiled (default
    ``$SPECC_CACHE_DIR/artifacts``)."""

    def __init__(self, target_spec: Dict[str, Any], dtype: Optional[str] = None, max_model_len: int = 512,
                 device: str = "cpu", artifact_dir: Optional[Path] = None,
                 choice: Optional[Dict[str, Any]] = None) -> None:
        import torch

        from specc.runtime.loader import load_spec_target

        self.artifact_dir = None if artifact_dir is None else Path(artifact_dir)
        self.artifacts: List[Path] = []  # every artifact a runtime was built from, in order

        self.max_model_len = int(max_model_len)
        spec = {"target": dict(target_spec, dtype=dtype or target_spec.get("dtype")),
                "schedule": {"cost_table": {"choice": dict(choice or {})}}}
        self.target, self.tokenizer, dtype, self.why = load_spec_target(spec, torch.device(device),
                                                                        self.max_model_len + 64)
        self.device = self.target.norm.weight.device
        self.dtype = dtype
        self._drafters: Dict[str, Any] = {}

    def drafter(self, candidate) -> Any:
        """The candidate's drafter through the method table's factory: a model drafter is built once and
        shared; a lookup drafter (n-gram, suffix decoding) is built anew for every call, because it is
        cheap to build and may keep state across requests (suffix decoding's global tree of earlier
        outputs): no run drafts from the outputs of another configuration's run over the same prompts."""
        from specc import methods
        from specc.compiler.build import plan_ir

        def build():
            plan = candidate.plan
            spec = plan_ir(plan).runtime.to_dict()  # the execution plan's runtime section, as compiled
            return methods.build_drafter(plan.method.name, spec, self.target, self.tokenizer, self.device,
                                         max_seq_len=self.target.config.max_model_len)

        if methods.get(candidate.plan.method.name).lookup:
            return build()
        if candidate.name not in self._drafters:
            self._drafters[candidate.name] = build()
        return self._drafters[candidate.name]

    def runtime(self, plan, candidate=None):
        """The runtime of ``plan`` (``candidate`` None: plain decoding) over the shared models, built
        from its compiled artifact: the plan is compiled into the content-addressed cache
        (``$SPECC_CACHE_DIR/artifacts``, ``specc.compiler.build.artifact_cache_dir``; an identical artifact
        already there is reused), loaded and verified (``specc.runtime.artifact.load_artifact``), and
        run with its specialized kernels and the compile backend ``specc run`` would pick
        (``specc.runtime.loader.choose_settings``) — what tune measures is what was compiled.

        Raises:
            PlanError: a plan the ``specc`` profile refuses. ArtifactError: an unwritable cache.
        """
        from specc.compiler import build
        from specc.compiler.build import artifact_cache_dir as cache_dir
        from specc.runtime.artifact import load_artifact
        from specc.runtime.loader import artifact_runtime, choose_settings, runtime_spec

        out = self.artifact_dir or cache_dir()
        out.mkdir(parents=True, exist_ok=True)
        art = load_artifact(build.compile_plan(plan, out).path)
        self.artifacts.append(art.path)
        drafter = self.drafter(candidate) if candidate is not None else None
        _, backend, _ = choose_settings(runtime_spec(art), self.device)
        return artifact_runtime(art, self.target, self.tokenizer, drafter, self.device, compile_backend=backend,
                                max_model_len=self.max_model_len)


def encode(records: Sequence[Any], tokenizer) -> List[List[int]]:
    """Token ids of each prompt record (chat template applied; :func:`specc.runtime.prompts.encode_prompt`)."""
    from specc.runtime.prompts import encode_prompt

    return [encode_prompt(r, tokenizer) for r in records]


def prompts_info(records: Sequence[Any], used: Sequence[Any], source: str) -> Dict[str, Any]:
    """The ``prompts`` block of an acceptance entry: source, the sha256 of every prompt of the file in
    file order (:func:`prompts_sha256`: a record measured on the same prompts is recognised by it), how
    many were used and of which category, and the held-out statement for the shipped set."""
    from specc.predict.acceptance import HELD_OUT
    from specc.runtime.prompts import shipped_prompts_path

    cats: Dict[str, int] = {}
    for r in used:
        cats[r.category or "-"] = cats.get(r.category or "-", 0) + 1
    shipped = source not in ("-", "") and Path(source).resolve() == shipped_prompts_path().resolve()
    info = {"source": "specc/data/prompts.jsonl" if shipped else source, "sha256": prompts_sha256(records),
            "used": len(used), "available": len(records), "categories": cats}
    if shipped:
        info["held_out"] = HELD_OUT
    return info


def prompts_sha256(records: Sequence[Any]) -> str:
    """sha256 over the prompts' texts (the last user message of a chat), in order, NUL-separated."""
    h = hashlib.sha256()
    for r in records:
        h.update((r.text + "\0").encode())
    return h.hexdigest()


def reusable_entry(candidate, records: Sequence[Any], max_new_tokens: int):
    """The drafter's shipped acceptance entry when it was measured on exactly these prompts (same
    texts in the same order, every one used), with the same new-token count, on this target and on
    these drafter weights — a measurement of this very workload — else None."""
    from specc.predict import acceptance

    found = acceptance.find(candidate.plan)
    e = found.entry
    if e is None or found.stale or e.num_steps < candidate.measure_steps:
        return None
    p = e.prompts or {}
    if p.get("sha256") != prompts_sha256(records) or p.get("used") != len(records):
        return None
    if int((e.decode or {}).get("max_new_tokens") or -1) != int(max_new_tokens):
        return None
    return e


def _stage_snapshot(metrics) -> Dict[str, float]:
    return {s: metrics.stage_time_s.get(s, 0.0) for s in DECODE_STAGES}


def _tau_half_width(per_request: Sequence[Dict[str, Any]]) -> Tuple[float, float]:
    """(τ, half-width of its 95 % interval) over the finished requests."""
    from specc.predict.acceptance import ratio_ci

    rows = [r for r in per_request if r["num_steps"] > 0]
    if len(rows) < 2:
        return 1.0, float("inf")
    r, lo, hi = ratio_ci([sum(x["num_accepted_tokens_per_pos"]) for x in rows], [x["num_steps"] for x in rows])
    return 1.0 + r, (hi - lo) / 2.0


def run_sampled(runtime, prompt_ids: Sequence[List[int]], *, batch_size: int, max_new_tokens: int,
                deadline: float, tolerance: float, min_requests: int, max_steps: Optional[int] = None,
                ramp: Sequence[int] = (1, 2, 4), ramp_steps: int = RAMP_STEPS,
                on_request: Optional[Callable[[int, float, float], None]] = None) -> Tuple[List[Dict[str, Any]], List[StepSample], str, float]:
    """Decode ``prompt_ids`` in order with at most ``batch_size`` in flight until the stop rule (module
    docstring) holds. ``deadline``: ``time.monotonic()`` value after which no request is started and
    the live ones are cancelled. ``tolerance``: relative half-width of τ's 95 % interval; 0 never
    stops early. ``max_steps``: stop after this many decode steps (a run that measures costs only).
    ``ramp``: the run starts with ``ramp[0]`` requests in flight and rises through ``ramp`` to
    ``batch_size``, ``ramp_steps`` decode steps at each level, so the step samples span batch sizes
    (the stage-cost fits need more than one). ``on_request(done, τ, half_width)`` after each finished
    request (progress bars).

    Returns ``(per-request counters, step samples, stop reason, decode tokens/s)``; the counters are
    ``RequestCounters.as_dict()`` plus ``num_emitted`` and ``num_output_tokens``."""
    from specc.runtime.metrics import decode_tokens_per_s
    from specc.runtime.request import Request, SamplingParams

    runtime.metrics = runtime.new_metrics()
    runtime.reset(batch_size)
    queue = list(range(len(prompt_ids)))
    done: List[Dict[str, Any]] = []
    samples: List[StepSample] = []
    reason = "prompts exhausted"
    params = SamplingParams(max_new_tokens=max_new_tokens)

    def submit_next() -> None:
        i = queue.pop(0)
        runtime.submit(Request(prompt_ids=list(prompt_ids[i]), params=params, request_id=f"t{i}"), handle=i)

    def record(out) -> None:
        c = out.counters
        done.append(dict(c.as_dict(), num_emitted=c.num_emitted, num_output_tokens=len(out.token_ids)))

    levels = [int(x) for x in ramp if 0 < int(x) < batch_size] + [int(batch_size)]
    level = 0

    def fill() -> None:
        while queue and runtime.num_running + runtime.num_waiting < levels[level]:
            submit_next()

    fill()
    at_level = 0
    stopping = False
    t0 = time.perf_counter()
    n_out = 0
    while runtime.has_work():
        rows = runtime.num_running
        before = _stage_snapshot(runtime.metrics)
        n_trace = len(runtime.metrics.trace)
        ts = time.perf_counter()
        events = runtime.step()
        wall = (time.perf_counter() - ts) * 1e3
        if len(runtime.metrics.trace) > n_trace:
            after = _stage_snapshot(runtime.metrics)
            k = runtime.metrics.trace[-1][2]
            samples.append(StepSample(rows=rows, num_steps=int(k), wall_ms=wall,
                                      stage_ms={s: (after[s] - before[s]) * 1e3 for s in DECODE_STAGES}))
            at_level += 1
            if level < len(levels) - 1 and at_level >= ramp_steps and not stopping:
                level, at_level = level + 1, 0
                fill()
        for ev in events:
            if ev.output is None:
                continue
            record(ev.output)
            n_out += len(ev.output.token_ids)
            tau, half = _tau_half_width(done)
            if on_request is not None:
                on_request(len(done), tau, half)
            if not stopping:
                if tolerance > 0 and len(done) >= min_requests and half <= tolerance * tau:
                    stopping, reason = True, f"τ known to ±{half:.3f} (95% CI) after {len(done)} requests"
            if not stopping:
                fill()
        if not stopping and time.monotonic() >= deadline and len(samples) > 0:
            stopping, reason = True, f"time share spent after {len(done)} finished requests"
        if not stopping and max_steps is not None and len(samples) >= max_steps:
            stopping, reason = True, f"{len(samples)} decode steps timed"
        if stopping and runtime.num_running:
            for row in list(runtime.batch.live_rows()):
                out = runtime.cancel(runtime.batch.rows[row].index)
                if out is not None and out.counters.num_steps > 0:
                    record(out)
                    n_out += len(out.token_ids)
            runtime.admission.queue.clear()
    wall = time.perf_counter() - t0
    tok_s = decode_tokens_per_s(n_out, len(done), wall, runtime.metrics.stage_time_s.get("prefill", 0.0))
    return done, samples, reason, tok_s


def measure(models: Models, candidate, prompt_ids: Sequence[List[int]], records: Sequence[Any], source: str, *,
            batch_size: int, max_new_tokens: int, seconds: float, tolerance: float, min_requests: int,
            command: str = "", on_request=None, sample: Optional[Sequence[Any]] = None, reuse=None,
            cost_steps: int = 10) -> Measurement:
    """Measure ``candidate`` (see the module docstring) within ``seconds`` (wall time from now, model
    loading included). ``records``: every prompt in file order (the record's prompt hash);
    ``sample``: the records behind ``prompt_ids``, in that order (default ``records``). ``reuse``: an
    acceptance entry already measured on exactly these prompts with this drafter
    (:func:`reusable_entry`): then only the step costs are timed (``cost_steps`` decode steps) and the
    entry is kept. Returns a :class:`Measurement` whose ``entry`` is the acceptance record entry.

    Raises: AcceptanceError when not one verify step ran (a time share too small to decode anything)."""
    import datetime
    import platform

    import specc
    from specc.predict import acceptance
    from specc.device import cpu_name

    t_start = time.monotonic()
    deadline = t_start + seconds
    models.drafter(candidate)
    load_s = time.monotonic() - t_start
    plan = candidate.variant(candidate.measure_steps, capture=[batch_size])
    rt = models.runtime(plan, candidate)
    per, samples, reason, tok_s = run_sampled(rt, prompt_ids, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                              deadline=deadline, tolerance=0.0 if reuse else tolerance,
                                              min_requests=min_requests, max_steps=cost_steps if reuse else None,
                                              on_request=on_request)
    if reuse is not None:
        return Measurement(name=candidate.name, entry=reuse, samples=samples, seconds=time.monotonic() - t_start,
                           stop_reason=f"acceptance reused from {reuse.path} (the same prompts and drafter); costs: "
                                       f"{reason}", requests=int(reuse.counters.get("num_requests") or 0),
                           decode_tok_s=tok_s, load_s=load_s)
    m = plan.method
    shape = candidate.shape
    entry = acceptance.entry_from_requests(
        per, plan=plan, shape=shape, num_steps=candidate.measure_steps, topk=int(m.topk or 1),
        num_draft_tokens=int(m.num_draft_tokens or candidate.measure_steps + 1),
        prompts=prompts_info(records, list(sample if sample is not None else records)[:len(per)], source),
        decode={"max_new_tokens": max_new_tokens, "batch_size": batch_size, "verify": "greedy", "temperature": 0.0,
                "dtype": models.dtype},
        measured={"date": datetime.date.today().isoformat(), "specc": specc.__version__, "command": command,
                  "cpu": cpu_name() if models.device.type == "cpu" else str(models.device),
                  "python": platform.python_version(), "seconds": round(time.monotonic() - t_start, 1),
                  "stop": reason})
    return Measurement(name=candidate.name, entry=entry, samples=samples, seconds=time.monotonic() - t_start,
                       stop_reason=reason, requests=len(per), decode_tok_s=tok_s, load_s=load_s)
