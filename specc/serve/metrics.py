"""The server's Prometheus metrics (``prometheus_client``, one registry per server, text format at
``/metrics``).

Speculation counters use vLLM's names under the ``specc:`` prefix (vLLM 0.33.0
vllm/v1/spec_decode/metrics.py:228-264),
labelled by ``model_name`` (the base model or the LoRA adapter a request chose), so acceptance is
reported per adapter:

* ``specc:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total{position}``;
* ``specc:spec_decode_num_steps_total`` and ``..._num_emitted_tokens_total`` (verify steps and the
  tokens they emitted, bonus included), whose ratio is τ, also exported as the gauge
  ``specc:spec_decode_tau``;
* ``specc:active_state_info{state}`` (1 for the state of the last decode step), ``specc:active_num_steps``
  (its κ), ``specc:num_kappa_switches_total``.

Requests (vLLM's names): ``specc:request_success_total{model_name, finished_reason}`` (``stop``,
``length``, ``abort``, ``error``), ``specc:prompt_tokens_total``, ``specc:generation_tokens_total``,
``specc:request_generation_tokens_total{finished_reason}`` (tokens of requests that finished, by
reason), ``specc:time_to_first_token_seconds``, ``specc:time_per_output_token_seconds``,
``specc:e2e_request_latency_seconds``, ``specc:num_requests_running``, ``specc:num_requests_waiting``,
``specc:requests_rejected_total{reason}`` (``queue_full``, ``invalid``, ``too_large``, ``disagg``), and
``specc:disagg_payload_bytes_total{part}`` (bytes shipped or received).

Updated from the engine thread after every step (counter deltas of the requests that advanced) and
from the request handlers (latencies, rejections); prometheus_client's metrics are thread-safe.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()  # no *_created samples: one series per counter, as vLLM exports them

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
P = "specc:"


class ServeMetrics:
    """Args: base model name, κ of the deepest state (per-position counters), state names."""

    def __init__(self, base_model: str, k_max: int, state_names=()) -> None:
        self.registry = CollectorRegistry()
        r, lab = self.registry, ["model_name"]
        self.base_model = base_model
        self.k_max = int(k_max)
        self.num_drafts = Counter(P + "spec_decode_num_drafts", "Verify steps with >= 1 draft token", lab, registry=r)
        self.num_draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens proposed", lab, registry=r)
        self.num_accepted = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted", lab, registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position", lab + ["position"], registry=r)
        self.num_steps = Counter(P + "spec_decode_num_steps", "Verify steps a request took part in", lab, registry=r)
        self.num_emitted = Counter(P + "spec_decode_num_emitted_tokens",
                                   "Tokens emitted by verify steps (accepted + bonus)", lab, registry=r)
        self.tau = Gauge(P + "spec_decode_tau", "Mean tokens per verify step, bonus included (tau)", lab, registry=r)
        self.state = Gauge(P + "active_state_info", "1 for the state the last decode step ran", ["state"], registry=r)
        self.kappa = Gauge(P + "active_num_steps", "kappa of the state the last decode step ran", registry=r)
        self.switches = Counter(P + "num_kappa_switches", "Steps whose kappa differs from the previous step's",
                                registry=r)
        self.success = Counter(P + "request_success", "Finished requests", lab + ["finished_reason"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of admitted requests", lab, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens", lab, registry=r)
        self.request_generation_tokens = Counter(P + "request_generation_tokens",
                                                 "Generated tokens of finished requests by finish reason",
                                                 lab + ["finished_reason"], registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first token", lab,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "Mean time per output token after the first",
                              lab, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to last token", lab,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge(P + "num_requests_running", "Requests holding a batch row", registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests queued for a row", registry=r)
        self.rejected = Counter(P + "requests_rejected", "Requests refused before decoding", ["reason"], registry=r)
        self.disagg_bytes = Counter(P + "disagg_payload_bytes", "Disaggregation payload bytes by part", ["part"],
                                    registry=r)
        self.documents = Counter(P + "suffix_documents_added", "Documents added to suffix decoding's global tree",
                                 registry=r)
        for name in state_names:
            self.state.labels(state=name).set(0)
        self._last: Dict[int, Tuple[int, int, int, int, int, Tuple[int, ...], int]] = {}
        self._totals: Dict[str, Tuple[int, int]] = {}
        self._active: Optional[str] = None
        self._switches = 0
        self._lock = threading.Lock()

    def model(self, adapter: Optional[str]) -> str:
        return adapter or self.base_model

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ from the engine thread
    def observe_event(self, handle: int, adapter: Optional[str], ev) -> None:
        """Add the counter deltas of one token event (``specc.runtime.engine.TokenEvent``)."""
        m = self.model(adapter)
        c = ev.counters
        if c is not None:
            now = (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.num_steps, c.num_emitted,
                   tuple(c.num_accepted_tokens_per_pos), 0)
            with self._lock:
                last = self._last.get(handle, (0, 0, 0, 0, 0, (), 0))
                self._last[handle] = now
            for counter, i in ((self.num_drafts, 0), (self.num_draft_tokens, 1), (self.num_accepted, 2),
                               (self.num_steps, 3), (self.num_emitted, 4)):
                if now[i] > last[i]:
                    counter.labels(model_name=m).inc(now[i] - last[i])
            for pos, n in enumerate(now[5]):
                prev = last[5][pos] if pos < len(last[5]) else 0
                if n > prev:
                    self.accepted_per_pos.labels(model_name=m, position=str(pos)).inc(n - prev)
            with self._lock:
                steps, emitted = self._totals.get(m, (0, 0))
                steps += now[3] - last[3]
                emitted += now[4] - last[4]
                self._totals[m] = (steps, emitted)
            if steps:
                self.tau.labels(model_name=m).set(emitted / steps)
        if ev.token_ids:
            self.generation_tokens.labels(model_name=m).inc(len(ev.token_ids))
        if ev.output is not None:
            reason = FINISHED.get(ev.output.finish_reason, ev.output.finish_reason)
            self.success.labels(model_name=m, finished_reason=reason).inc()
            self.request_generation_tokens.labels(model_name=m, finished_reason=reason).inc(len(ev.output.token_ids))
            with self._lock:
                self._last.pop(handle, None)

    def observe_step(self, runtime) -> None:
        """The active state, κ and switches after a step; running / waiting requests."""
        st = runtime.active_state
        if st is not None and st.spec.name != self._active:
            if self._active is not None:
                self.state.labels(state=self._active).set(0)
            self._active = st.spec.name
            self.state.labels(state=self._active).set(1)
            self.kappa.set(st.spec.num_steps)
        sw = runtime.metrics.num_kappa_switches
        if sw > self._switches:
            self.switches.inc(sw - self._switches)
        self._switches = sw
        self.running.set(runtime.num_running)
        self.waiting.set(runtime.num_waiting)


FINISHED = {"eos": "stop", "stop": "stop", "length": "length", "max_model_len": "length", "abort": "abort",
            "error": "error", "prefilled": "prefilled"}
"""Runtime finish reasons → the ``finished_reason`` label (OpenAI's words; vLLM's ``abort``)."""
