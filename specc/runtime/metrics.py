"""Run-level speculation metrics: vLLM's counters, τ, per-position acceptance, throughput, the
time spent in each stage (draft / verify / accept / extend / prefill / emit), and the drafter's
forward passes per decode step by stage (draft, draft-extend) with the draft KV it allocated."""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Deque, Dict, Iterator, List, Optional, Protocol, Tuple

import torch

from specc.runtime.request import RequestCounters

TIMER_KINDS = ("none", "sync", "events")
"""How stages are timed (:func:`make_timer`)."""


class StageTimer(Protocol):
    """Times one stage: ``timer.stage(name, add)`` is a context manager around the stage's work that
    calls ``add(name, wall_seconds, cpu_seconds)`` once the stage's time is known (at its end, or,
    for CUDA events, once the device has run past it)."""

    kind: str

    def stage(self, name: str, add: Callable[[str, float, float], None]) -> ContextManager[None]: ...

    def flush(self) -> None: ...


class WallTimer:
    """``kind "none"``: host wall clock (``time.perf_counter``) and process CPU time, no device
    synchronisation. On CUDA a stage's time is then the host time to *launch* its work (kernels run
    asynchronously), not the device time: the default, since it adds no host read to the step."""

    kind = "none"

    def __init__(self, sync: Optional[Callable[[], None]] = None) -> None:
        self._sync = sync

    @contextmanager
    def stage(self, name: str, add: Callable[[str, float, float], None]) -> Iterator[None]:
        if self._sync is not None:
            self._sync()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            add(name, time.perf_counter() - t0, time.process_time() - c0)

    def flush(self) -> None:
        """Nothing pending."""


class SyncTimer(WallTimer):
    """``kind "sync"``: ``torch.cuda.synchronize(device)`` before and after each stage, so the wall
    time covers the device work (two synchronisations per stage: for profiling, not serving)."""

    kind = "sync"

    def __init__(self, device: torch.device) -> None:
        super().__init__(lambda: torch.cuda.synchronize(device))


class EventTimer:
    """``kind "events"``: a pair of CUDA events (``enable_timing``) around each stage, read without
    synchronising: a stage's device milliseconds (``Event.elapsed_time``) are added once its end event
    has completed (``Event.query``), at a later stage's end or at :meth:`flush` (which waits for the
    pending ones: call it off the hot path, e.g. when a run ends). CPU seconds are the host's.
    Source: ``torch.cuda.Event`` (``elapsed_time`` is in milliseconds)."""

    kind = "events"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: List[Tuple[str, Any, Any, Callable[[str, float, float], None]]] = []

    @contextmanager
    def stage(self, name: str, add: Callable[[str, float, float], None]) -> Iterator[None]:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        c0 = time.process_time()
        start.record()
        try:
            yield
        finally:
            end.record()
            add(name, 0.0, time.process_time() - c0)
            self._pending.append((name, start, end, add))
            self._drain(wait=False)

    def _drain(self, wait: bool) -> None:
        keep = []
        for name, start, end, add in self._pending:
            if wait:
                end.synchronize()
            if wait or end.query():
                add(name, start.elapsed_time(end) / 1e3, 0.0)
            else:
                keep.append((name, start, end, add))
        self._pending = keep

    def flush(self) -> None:
        """Wait for the pending stages' end events and add their device times."""
        self._drain(wait=True)


def make_timer(kind: str = "none", device: Any = "cpu") -> StageTimer:
    """The stage timer ``kind`` for ``device``: ``"none"`` (:class:`WallTimer`, the default: no
    synchronisation), ``"sync"`` (:class:`SyncTimer`) or ``"events"`` (:class:`EventTimer`). On a
    non-CUDA device ``"sync"`` and ``"events"`` fall back to the wall clock (the host is the device).

    Raises: PlanError naming ``timing`` and the accepted values when ``kind`` is unknown."""
    if kind not in TIMER_KINDS:
        from specc.errors import PlanError

        raise PlanError(f"timing: unknown timer kind {kind!r}; use one of {', '.join(TIMER_KINDS)}")
    dev = torch.device(device)
    if dev.type != "cuda" or kind == "none":
        return WallTimer()
    return SyncTimer(dev) if kind == "sync" else EventTimer(dev)


STAGES = ("prefill", "draft", "verify", "accept", "commit", "emit", "extend")
TRACE_STEPS = 100_000
"""Decode steps kept in :attr:`SpecMetrics.trace` (a bounded window, for long-running servers)."""


@dataclass
class SpecMetrics:
    """Counters summed over requests (vLLM `SpecDecodingStats` names) plus timings.

    ``stage_time_s`` maps each of :data:`STAGES` to seconds, as measured by :attr:`timer`
    (:func:`make_timer`): by default the host wall clock without synchronising (on CUDA the launch
    time of a stage's kernels), device time with ``"sync"`` or ``"events"``.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: List[int] = field(default_factory=list)
    num_draft_tokens_per_pos: List[int] = field(default_factory=list)
    num_steps: int = 0
    num_emitted: int = 0
    num_requests: int = 0
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    wall_time_s: float = 0.0
    stage_time_s: Dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    #: CPU seconds of this process per stage (``time.process_time``): on a machine shared with other
    #: jobs, what the stage cost rather than how long it waited for a core
    stage_cpu_s: Dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    num_kappa_switches: int = 0
    num_host_reads: int = 0  # device values read on the host by the decode steps (one per step)
    #: target tokens a step's verify program ran -> [steps, its wall seconds, its CPU seconds, in all]
    verify_by_tokens: Dict[int, List[float]] = field(default_factory=dict)
    num_draft_passes: int = 0  # draft-model forward passes in the draft stage of the decode steps
    num_draft_extend_passes: int = 0  # draft-model forward passes in the extend stage of the decode steps
    draft_kv_bytes: int = 0  # KV cache the drafter allocated at load (0: none, e.g. frozen-KV MTP)
    kappa_steps: Dict[int, int] = field(default_factory=dict)
    trace: Deque[Tuple[float, int, int, int]] = field(default_factory=lambda: deque(maxlen=TRACE_STEPS))
    _t0: float = field(default_factory=time.perf_counter, repr=False)
    #: how stages are timed (:func:`make_timer`; default: wall clock, no synchronisation)
    timer: Any = field(default_factory=WallTimer, repr=False, compare=False)

    def record_step(self, num_steps: int, num_requests: int, accepted: int) -> None:
        """One decode step ran at κ = ``num_steps`` over ``num_requests`` live requests, accepting
        ``accepted`` drafts in all: counts steps per κ and appends ``(seconds since these metrics
        began, requests, κ, accepted)`` to :attr:`trace` (the last :data:`TRACE_STEPS` steps)."""
        self.kappa_steps[num_steps] = self.kappa_steps.get(num_steps, 0) + 1
        self.trace.append((time.perf_counter() - self._t0, num_requests, num_steps, accepted))

    def record_verify(self, tokens: int, seconds: float, cpu_seconds: float = 0.0) -> None:
        """One step's verify program (verify forward → accept → commit) ran ``tokens`` target tokens
        in ``seconds`` of wall time and ``cpu_seconds`` of this process's CPU time
        (:attr:`verify_by_tokens`)."""
        slot = self.verify_by_tokens.setdefault(int(tokens), [0, 0.0, 0.0])
        slot[0] += 1
        slot[1] += seconds
        slot[2] += cpu_seconds

    @property
    def verify_ms_by_tokens(self) -> Dict[int, float]:
        """Mean wall milliseconds of a step's verify program by the target tokens it ran."""
        return {n: s / c * 1e3 for n, (c, s, _) in sorted(self.verify_by_tokens.items()) if c}

    def add_stage_time(self, name: str, seconds: float, cpu_seconds: float) -> None:
        """Add ``seconds`` of wall (or device) time and ``cpu_seconds`` of CPU time to stage ``name``."""
        self.stage_time_s[name] = self.stage_time_s.get(name, 0.0) + seconds
        self.stage_cpu_s[name] = self.stage_cpu_s.get(name, 0.0) + cpu_seconds

    def stage(self, name: str, sync: Optional[Callable[[], None]] = None) -> ContextManager[None]:
        """Time a block as stage ``name`` with :attr:`timer` (no device synchronisation unless the
        timer is ``"sync"``); ``sync`` (a callable, kept for callers that ask for it explicitly) runs
        before and after the block instead."""
        timer = self.timer if sync is None else WallTimer(sync)
        return timer.stage(name, self.add_stage_time)

    def add_request(self, counters: RequestCounters, num_prompt: int, num_output: int) -> None:
        self.num_requests += 1
        self.num_prompt_tokens += num_prompt
        self.num_output_tokens += num_output
        self.num_drafts += counters.num_drafts
        self.num_draft_tokens += counters.num_draft_tokens
        self.num_accepted_tokens += counters.num_accepted_tokens
        self.num_steps += counters.num_steps
        self.num_emitted += counters.num_emitted
        per = counters.num_accepted_tokens_per_pos
        if len(self.num_accepted_tokens_per_pos) < len(per):
            self.num_accepted_tokens_per_pos.extend([0] * (len(per) - len(self.num_accepted_tokens_per_pos)))
        for i, n in enumerate(per):
            self.num_accepted_tokens_per_pos[i] += n
        drafted = counters.num_draft_tokens_per_pos
        if len(self.num_draft_tokens_per_pos) < len(drafted):
            self.num_draft_tokens_per_pos.extend([0] * (len(drafted) - len(self.num_draft_tokens_per_pos)))
        for i, n in enumerate(drafted):
            self.num_draft_tokens_per_pos[i] += n

    @property
    def tau(self) -> float:
        """Mean emitted tokens per verify step incl. the bonus (Spec-Bench's τ, Xia et al. 2024, arXiv:2401.07851)."""
        return self.num_emitted / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """num_accepted_tokens / num_draft_tokens (vLLM's draft acceptance rate)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_per_pos(self) -> List[float]:
        """Fraction of drafts whose i-th token was accepted (vLLM: per_pos / num_drafts)."""
        return [n / self.num_drafts for n in self.num_accepted_tokens_per_pos] if self.num_drafts else []

    @property
    def stage_ms_per_step(self) -> Dict[str, float]:
        """Milliseconds per decode step in each decode stage (prefill excluded): the drafter's host
        work (``draft``, ``extend``) next to the target's ``verify``."""
        steps = sum(self.kappa_steps.values())
        return {k: 1e3 * v / steps for k, v in self.stage_time_s.items() if k != "prefill"} if steps else {}

    @property
    def decode_steps(self) -> int:
        """Decode steps run (every κ, κ = 0 included)."""
        return sum(self.kappa_steps.values())

    @property
    def draft_passes_per_step(self) -> float:
        """Draft-stage forward passes of the drafter per decode step (what ``specc explain`` predicts
        as "draft fwd")."""
        return self.num_draft_passes / self.decode_steps if self.decode_steps else 0.0

    @property
    def extend_passes_per_step(self) -> float:
        """Extend-stage (draft-extend) forward passes per decode step ("extend fwd" in ``explain``)."""
        return self.num_draft_extend_passes / self.decode_steps if self.decode_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """End-to-end output tokens per second of wall time (prefill included)."""
        return self.num_output_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def decode_time_s(self) -> float:
        """Wall time not spent in prefill (seconds): the decode steps."""
        return max(0.0, self.wall_time_s - self.stage_time_s.get("prefill", 0.0))

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode tokens per second, prefill excluded: :func:`decode_tokens_per_s` of this run."""
        return decode_tokens_per_s(self.num_output_tokens, self.num_requests, self.wall_time_s,
                                   self.stage_time_s.get("prefill", 0.0))

    def as_dict(self) -> Dict[str, object]:
        return {
            "num_requests": self.num_requests, "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "num_draft_tokens_per_pos": list(self.num_draft_tokens_per_pos),
            "num_steps": self.num_steps, "tau": round(self.tau, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_per_pos": [round(a, 4) for a in self.acceptance_per_pos],
            "wall_time_s": round(self.wall_time_s, 4), "tokens_per_s": round(self.tokens_per_s, 3),
            "decode_time_s": round(self.decode_time_s, 4),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "stage_time_s": {k: round(v, 4) for k, v in self.stage_time_s.items()},
            "stage_ms_per_step": {k: round(v, 4) for k, v in self.stage_ms_per_step.items()},
            "num_kappa_switches": self.num_kappa_switches,
            "num_host_reads": self.num_host_reads,
            "verify_ms_by_tokens": {str(n): round(ms, 3) for n, ms in self.verify_ms_by_tokens.items()},
            "decode_steps": self.decode_steps,
            "num_draft_passes": self.num_draft_passes, "num_draft_extend_passes": self.num_draft_extend_passes,
            "draft_passes_per_step": round(self.draft_passes_per_step, 4),
            "extend_passes_per_step": round(self.extend_passes_per_step, 4),
            "draft_kv_bytes": self.draft_kv_bytes,
            "kappa_steps": {str(k): v for k, v in sorted(self.kappa_steps.items())},
        }

    def summary(self) -> str:
        """A few human-readable lines."""
        acc = ", ".join(f"{a:.2f}" for a in self.acceptance_per_pos) or "-"
        per = self.stage_ms_per_step
        stages = ", ".join(f"{k} {v:.2f}s" + (f" ({per[k]:.2f} ms/step)" if k in per else "")
                           for k, v in self.stage_time_s.items() if v > 0)
        kappas = ""
        if len(self.kappa_steps) > 1 or self.num_kappa_switches:
            mix = ", ".join(f"κ={k}: {n}" for k, n in sorted(self.kappa_steps.items()))
            kappas = f"\nsteps per κ: {mix} ({self.num_kappa_switches} switches)"
        prefill = self.stage_time_s.get("prefill", 0.0)
        passes = (f"\ndraft forward passes per step: {self.draft_passes_per_step:.2f} draft, "
                  f"{self.extend_passes_per_step:.2f} draft-extend; draft KV allocated "
                  f"{self.draft_kv_bytes / (1 << 20):.1f} MiB" if self.decode_steps else "")
        return (f"requests {self.num_requests}, output tokens {self.num_output_tokens}, tau {self.tau:.2f}\n"
                f"decode {self.decode_tokens_per_s:.1f} tok/s (prefill excluded), end-to-end "
                f"{self.tokens_per_s:.1f} tok/s (prefill {prefill:.2f}s of {self.wall_time_s:.2f}s)\n"
                f"num_drafts {self.num_drafts}, num_draft_tokens {self.num_draft_tokens}, "
                f"num_accepted_tokens {self.num_accepted_tokens}, acceptance {self.acceptance_rate:.2f}, "
                f"per position [{acc}]\n"
                f"time: {stages}{kappas}{passes}")


def decode_tokens_per_s(num_output_tokens: int, num_requests: int, wall_time_s: float, prefill_time_s: float) -> float:
    """Tokens the decode steps produced per second of decode time: (output tokens − one per request,
    the first token, which the prefill forward yields) / (wall time − prefill time). 0.0 when no
    decode step ran. ``specc run`` and ``specc bench`` both report it next to end-to-end tokens/s
    (output tokens / wall time)."""
    tokens = num_output_tokens - num_requests
    decode = wall_time_s - prefill_time_s
    return tokens / decode if tokens > 0 and decode > 0 else 0.0
