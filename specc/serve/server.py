"""Build a server from a compiled artifact, and run it with uvicorn (``specc serve``), or in a thread
(tests, benchmarks: :class:`BackgroundServer`).

:class:`Server` is uvicorn's server with a bounded drain: on SIGTERM or SIGINT uvicorn stops
accepting connections and waits for the open ones; ``shutdown_timeout`` seconds later every request
still in flight is interrupted (:meth:`specc.serve.loop.EngineLoop.interrupt_all`: a stream ends with
an error event of code ``server_shutdown`` and ``[DONE]``, a one-shot request gets a 503), and
uvicorn's own ``timeout_graceful_shutdown``, :data:`FINAL_GRACE` seconds later, cancels whatever
still runs (a client that does not read its last event), so the process exits.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from specc.errors import SpeccError
from specc.serve.app import ROLES, ServerState, build_app
from specc.serve.limits import (DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_KEEP_ALIVE_TIMEOUT,
                                DEFAULT_MAX_REQUEST_BYTES, DEFAULT_SHUTDOWN_TIMEOUT, check_http_url,
                                header_timeout_protocol)

FINAL_GRACE = 5.0
"""Seconds after the shutdown deadline before uvicorn cancels what still runs."""


class Server:
    """uvicorn serving ``state``'s app with the timeouts of :mod:`specc.serve.limits` and the bounded
    drain of the module docstring. ``run()`` blocks (signals handled by uvicorn);
    :attr:`uvicorn` is the ``uvicorn.Server``."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: int = 8000, *,
                 header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                 keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT, log_level: str = "info",
                 access_log: bool = True) -> None:
        import uvicorn

        self.state = state
        self.shutdown_timeout = float(shutdown_timeout)
        config = uvicorn.Config(build_app(state), host=host, port=port, log_level=log_level, access_log=access_log,
                                lifespan="on", http=header_timeout_protocol(header_timeout),
                                timeout_keep_alive=keep_alive_timeout,  # used as a float (call_later)
                                timeout_graceful_shutdown=int(self.shutdown_timeout + FINAL_GRACE + 0.999))
        outer = self

        class _Uvicorn(uvicorn.Server):
            async def shutdown(self, sockets=None) -> None:
                timer = asyncio.get_running_loop().call_later(outer.shutdown_timeout, outer.interrupt)
                try:
                    await super().shutdown(sockets)
                finally:
                    timer.cancel()

        self.uvicorn = _Uvicorn(config)

    def interrupt(self) -> int:
        """End every request in flight (the shutdown deadline passed). Returns how many."""
        return self.state.loop.interrupt_all(
            f"the server is shutting down: the {self.shutdown_timeout:g} s it waits for requests in flight "
            f"(`specc serve --shutdown-timeout`) have passed; retry the request")

    def run(self) -> None:
        """Serve until SIGINT / SIGTERM, as ``uvicorn.run`` does: the SIGINT uvicorn raises again after
        its graceful shutdown ends the call quietly (SIGTERM's default action then ends the process).
        Raises SpeccError when the server never started (uvicorn logged why)."""
        try:
            self.uvicorn.run()
        except KeyboardInterrupt:
            pass
        if not self.uvicorn.started:
            raise SpeccError("the server did not start (uvicorn's message above says why)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def deploy_section(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The manifest runtime section's ``deploy`` part (``lora``, ``disagg``), empty when absent."""
    d = spec.get("deploy") or {}
    return d if isinstance(d, dict) else {}


def state_from_runtime(runtime, *, model_name: str, role: str = "none", prefill_url: Optional[str] = None,
                       max_waiting: int = 256, batch_size: Optional[int] = None, threads: Optional[int] = None,
                       info: Optional[dict] = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                       body_timeout: float = DEFAULT_BODY_TIMEOUT) -> ServerState:
    """A :class:`ServerState` over a built runtime (its LoRA set, if any, already attached).
    ``max_request_bytes``: the largest request body accepted (bytes; larger ones are answered 413);
    ``body_timeout``: seconds a body may take (plus 1 s per 500 bytes; slower ones are answered 408).

    Raises:
        SpeccError: an unknown role, a decode role without ``prefill_url`` or with one that is not
            an http(s) URL with a host (:func:`check_http_url`), a ``max_request_bytes`` below 1, or a
            runtime whose states use the synthetic verify rule (an ablation harness whose output is
            not the model's).
    """
    from specc.serve.loop import EngineLoop
    from specc.serve.metrics import ServeMetrics

    if role not in ROLES:
        raise SpeccError(f"--role {role!r}: choose one of {', '.join(ROLES)}")
    check_role(role, prefill_url)
    rules = {s.spec.verify_rule for s in runtime.states if s.spec.num_steps > 0}
    if "synthetic" in rules:
        raise SpeccError("this artifact verifies with verify.rule=synthetic, an ablation harness whose output is not "
                         "the target model's; serve a plan with verify.rule greedy or standard")
    if runtime.tokenizer is None:
        raise SpeccError("serving needs the target's tokenizer (text in, text out)")
    if int(max_request_bytes) < 1:
        raise SpeccError(f"--max-request-bytes must be at least 1 byte, got {max_request_bytes}")
    getattr(runtime.tokenizer, "max_bytes_per_token", None)  # computed once now, not on the first request
    metrics = ServeMetrics(model_name, runtime.k_max, [s.spec.name for s in runtime.states])
    loop = EngineLoop(runtime, metrics, max_waiting=max_waiting, batch_size=batch_size, threads=threads)
    adapters = list(runtime.lora.names) if runtime.lora is not None else []
    state = ServerState(runtime=runtime, loop=loop, metrics=metrics, model_name=model_name, adapters=adapters,
                        role=role, default_temperature=0.0 if "greedy" in rules else 1.0, info=dict(info or {}),
                        max_request_bytes=int(max_request_bytes), body_timeout=float(body_timeout))
    if role == "decode":
        from specc.serve.disagg_client import PrefillClient

        state.prefill = PrefillClient(prefill_url, runtime, metrics)
    return state


def check_role(role: str, prefill_url: Optional[str]) -> None:
    """A decode role needs ``--prefill-url``, an http(s) URL with a host; the other roles take none.
    Raises SpeccError."""
    if role == "decode" and not prefill_url:
        raise SpeccError("--role decode needs --prefill-url http://127.0.0.1:PORT of the prefill instance")
    if prefill_url is not None:
        check_http_url(prefill_url)


def artifact_role(art) -> str:
    """The serving role an artifact's plan names (``deploy.disagg.role``; ``none`` without one)."""
    from specc.runtime.loader import runtime_spec

    return (deploy_section(runtime_spec(art)).get("disagg") or {}).get("role") or "none"


def load_server_state(artifact: str | Path, *, role: Optional[str] = None, prefill_url: Optional[str] = None,
                      served_model_name: Optional[str] = None, max_waiting: int = 256,
                      batch_size: Optional[int] = None, threads: Optional[int] = None,
                      device: Optional[str] = None, seed: int = 0,
                      max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, body_timeout: float = DEFAULT_BODY_TIMEOUT,
                      art=None) -> ServerState:
    """Load an artifact's runtime (``specc.runtime.loader.load_runtime``), its LoRA adapters
    (``deploy.lora`` of the manifest's runtime section) and build the server state. ``role`` None
    takes the artifact's ``deploy.disagg.role``; ``art``: the artifact already verified
    (``load_artifact``), else it is loaded here.

    Raises:
        ArtifactError / CheckpointError / PlanError: as ``load_runtime`` and the adapter loader.
        SpeccError: see :func:`state_from_runtime`.
    """
    from specc.runtime import disagg
    from specc.runtime.artifact import load_artifact
    from specc.runtime.loader import load_runtime, runtime_spec

    art = art if art is not None else load_artifact(artifact)
    spec = runtime_spec(art)
    deploy = deploy_section(spec)
    runtime, art = load_runtime(artifact, device=device, seed=seed, artifact=art)
    lora = deploy.get("lora") or {}
    if lora.get("adapters"):
        from specc.runtime.lora import load_lora_set

        runtime.attach_lora(load_lora_set(lora["adapters"], runtime.target, runtime.max_rows,
                                          lora.get("max_loras_per_batch")))
    runtime.plan_hash = disagg.section_hash(spec)
    role = role or artifact_role(art)
    info = {"artifact": art.name, "plan": art.manifest.get("plan_name"), "plan_hash": runtime.plan_hash,
            "states": [s.spec.name for s in runtime.states]}
    return state_from_runtime(runtime, model_name=served_model_name or str(art.manifest.get("plan_name")),
                              role=role, prefill_url=prefill_url, max_waiting=max_waiting, batch_size=batch_size,
                              threads=threads, info=info, max_request_bytes=max_request_bytes,
                              body_timeout=body_timeout)


class BackgroundServer:
    """:class:`Server` in a thread on 127.0.0.1 (tests and benchmarks); a context manager that
    waits until the server listens (at most ``start_timeout_s``) and stops it on exit. ``timeouts``:
    :class:`Server`'s ``header_timeout``, ``keep_alive_timeout``, ``shutdown_timeout``."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: Optional[int] = None,
                 start_timeout_s: float = 60.0, **timeouts: float) -> None:
        self.state = state
        self.host, self.port = host, port or free_port(host)
        self.specc = Server(state, self.host, self.port, log_level="warning", access_log=False, **timeouts)
        self.server = self.specc.uvicorn
        self.app = self.server.config.app
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)
        self.start_timeout_s = start_timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            if not self.thread.is_alive() or time.time() - t0 > self.start_timeout_s:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
