"""The engine thread: one loop drives the runtime's incremental API (``specc.runtime.engine``) while
HTTP handlers submit and cancel requests from the event loop.

Handlers call :meth:`EngineLoop.submit` (returns an ``asyncio.Queue`` of token events) and
:meth:`EngineLoop.cancel`; both only post to the loop's inbox. The thread takes inbox messages
between steps (so requests are admitted while others decode: continuous batching under the plan's
schedule), runs one :meth:`Runtime.step`, updates the metrics, and hands each event to its
request's queue through ``loop.call_soon_threadsafe``. The runtime isolates per-request failures
(``reset(isolate_failures=True)``): a request whose prefill or step raises finishes alone with
``finish_reason "error"``. Should the step itself fail outside that (a defect), every request in
flight gets an error event and the runtime starts a fresh session, so the server keeps serving.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch

from specc.runtime.request import Request, RequestOutput

log = logging.getLogger("specc.serve")


@dataclass(frozen=True)
class Interrupted:
    """Put into every in-flight request's event queue by :meth:`EngineLoop.interrupt_all` (the
    server's shutdown deadline passed): not an engine event; the handler ends its response with
    ``message`` and cancels the request."""

    message: str


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: "asyncio.Queue"
    adapter: Optional[str]
    request: Request


class EngineLoop:
    """Args: runtime (``specc.runtime.engine.Runtime``), metrics (``specc.serve.metrics.ServeMetrics``),
    max_waiting (queued requests beyond the batch rows before :meth:`submit` refuses), batch_size."""

    def __init__(self, runtime, metrics, max_waiting: int = 256, batch_size: Optional[int] = None,
                 threads: Optional[int] = None) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.batch_size = batch_size
        self.capacity = min(int(batch_size or runtime.max_rows), runtime.max_rows) + int(max_waiting)
        self.threads = threads
        self._inbox: "queue.Queue" = queue.Queue()
        self._sinks: Dict[int, _Sink] = {}
        self._handles = itertools.count()
        self._outstanding = 0
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self.steps = 0
        self.failure: Optional[str] = None

    # ------------------------------------------------------------------ from the event loop
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specc-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def outstanding(self) -> int:
        """Requests submitted and not yet finished."""
        return self._outstanding

    def full(self) -> bool:
        return self._outstanding >= self.capacity

    def submit(self, request: Request, *, prefilled: Any = None, prefill_only: bool = False) -> tuple:
        """Queue a checked request. Returns ``(handle, asyncio.Queue of TokenEvent)``; the last event has
        ``output`` set. Call from the event loop's thread."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        h = next(self._handles)
        with self._lock:
            self._outstanding += 1
            self._sinks[h] = _Sink(loop, q, request.adapter, request)
        self._inbox.put(("submit", h, request, prefilled, prefill_only))
        return h, q

    def cancel(self, handle: int) -> None:
        """Free the request's row (or drop it from the queue); its last event still arrives."""
        self._inbox.put(("cancel", handle))

    def interrupt_all(self, message: str) -> int:
        """Hand every request in flight an :class:`Interrupted` event (from any thread; the engine
        thread is not involved, so this works while it is in the middle of a step). Returns how many."""
        with self._lock:
            sinks = list(self._sinks.values())
        for sink in sinks:
            try:
                sink.loop.call_soon_threadsafe(sink.queue.put_nowait, Interrupted(message))
            except RuntimeError:  # the event loop is closed
                pass
        return len(sinks)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        if self.threads:
            from specc.models.llama import configure_cpu_threads
            configure_cpu_threads(self.threads)
        rt = self.runtime
        rt.reset(self.batch_size, isolate_failures=True)
        with torch.inference_mode():
            while not self._stop.is_set():
                self._drain(block=not rt.has_work())
                if self._stop.is_set():
                    break
                if not rt.has_work():
                    continue
                try:
                    events = rt.step()
                except Exception as exc:  # a defect outside per-request isolation: fail the flight, go on
                    log.exception("engine step failed")
                    self._fail_all(f"{type(exc).__name__}: {exc}")
                    continue
                self.steps += 1
                for ev in events:
                    self._deliver(ev)
                self.metrics.observe_step(rt)

    def _drain(self, block: bool) -> None:
        rt = self.runtime
        try:
            msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind = msg[0]
            if kind == "submit":
                _, h, request, prefilled, prefill_only = msg
                sink = self._sinks.get(h)
                if sink is not None:
                    self.metrics.prompt_tokens.labels(model_name=self.metrics.model(request.adapter)).inc(
                        len(request.prompt_ids))
                    rt.submit(request, handle=h, prefilled=prefilled, prefill_only=prefill_only, checked=True)
            elif kind == "cancel":
                out = rt.cancel(msg[1])
                if out is not None:
                    from specc.runtime.engine import TokenEvent
                    self._deliver(TokenEvent(msg[1], [], out, out.counters))
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                break
        self.metrics.running.set(rt.num_running)
        self.metrics.waiting.set(rt.num_waiting)

    def _deliver(self, ev) -> None:
        with self._lock:
            sink = self._sinks.get(ev.handle)
            if ev.output is not None and sink is not None:
                del self._sinks[ev.handle]
                self._outstanding -= 1
        if sink is None:
            return
        self.metrics.observe_event(ev.handle, sink.adapter, ev)
        try:
            sink.loop.call_soon_threadsafe(sink.queue.put_nowait, ev)
        except RuntimeError:  # the event loop is closed (shutdown)
            pass

    def _fail_all(self, message: str) -> None:
        from specc.runtime.engine import TokenEvent
        from specc.runtime.request import RequestCounters

        with self._lock:
            handles = list(self._sinks)
        for h in handles:
            sink = self._sinks.get(h)
            if sink is None:
                continue
            out = RequestOutput(request=sink.request, token_ids=[], text="", finish_reason="error",
                                counters=RequestCounters.for_steps(self.runtime.k_max), error=message)
            self._deliver(TokenEvent(h, [], out, out.counters))
        self.failure = message
        self.runtime.reset(self.batch_size, isolate_failures=True)
