"""Build a server from a compiled artifact, and run it with uvicorn (``specc serve``), or in a thread
(tests, benchmarks: :class:`BackgroundServer`)."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from specc.errors import SpeccError
from specc.serve.app import ROLES, ServerState, build_app
from specc.serve.limits import DEFAULT_MAX_REQUEST_BYTES


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
                       info: Optional[dict] = None,
                       max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> ServerState:
    """A :class:`ServerState` over a built runtime (its LoRA set, if any, already attached).
    ``max_request_bytes``: the largest request body accepted (bytes; larger ones are answered 413).

    Raises:
        SpeccError: an unknown role, a decode role without ``prefill_url``, a ``max_request_bytes``
            below 1, or a runtime whose states use the synthetic verify rule (an ablation harness
            whose output is not the model's).
    """
    from specc.serve.loop import EngineLoop
    from specc.serve.metrics import ServeMetrics

    if role not in ROLES:
        raise SpeccError(f"--role {role!r}: choose one of {', '.join(ROLES)}")
    if role == "decode" and not prefill_url:
        raise SpeccError("--role decode needs --prefill-url http://127.0.0.1:PORT of the prefill instance")
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
                        role=role, greedy_only="greedy" in rules, info=dict(info or {}),
                        max_request_bytes=int(max_request_bytes))
    if role == "decode":
        from specc.serve.disagg_client import PrefillClient

        state.prefill = PrefillClient(prefill_url, runtime, metrics)
    return state


def load_server_state(artifact: str | Path, *, role: Optional[str] = None, prefill_url: Optional[str] = None,
                      served_model_name: Optional[str] = None, max_waiting: int = 256,
                      batch_size: Optional[int] = None, threads: Optional[int] = None,
                      device: Optional[str] = None, seed: int = 0,
                      max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> ServerState:
    """Load an artifact's runtime (``specc.runtime.loader.load_runtime``), its LoRA adapters
    (``deploy.lora`` of the manifest's runtime section) and build the server state. ``role`` None
    takes the artifact's ``deploy.disagg.role``.

    Raises:
        ArtifactError / CheckpointError / PlanError: as ``load_runtime`` and the adapter loader.
        SpeccError: see :func:`state_from_runtime`.
    """
    from specc.runtime import disagg
    from specc.runtime.artifact import load_artifact
    from specc.runtime.loader import load_runtime, runtime_spec

    art = load_artifact(artifact)
    spec = runtime_spec(art)
    deploy = deploy_section(spec)
    runtime, art = load_runtime(artifact, device=device, seed=seed, artifact=art)
    lora = deploy.get("lora") or {}
    if lora.get("adapters"):
        from specc.runtime.lora import load_lora_set

        runtime.attach_lora(load_lora_set(lora["adapters"], runtime.target, runtime.max_rows,
                                          lora.get("max_loras_per_batch")))
    runtime.plan_hash = disagg.section_hash(spec)
    role = role or (deploy.get("disagg") or {}).get("role") or "none"
    info = {"artifact": art.path.name, "plan": art.manifest.get("plan_name"), "plan_hash": runtime.plan_hash,
            "states": [s.spec.name for s in runtime.states]}
    return state_from_runtime(runtime, model_name=served_model_name or str(art.manifest.get("plan_name")),
                              role=role, prefill_url=prefill_url, max_waiting=max_waiting, batch_size=batch_size,
                              threads=threads, info=info, max_request_bytes=max_request_bytes)


class BackgroundServer:
    """uvicorn serving an app in a thread on 127.0.0.1 (tests and benchmarks); a context manager that
    waits until the server listens (at most ``start_timeout_s``) and stops it on exit."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: Optional[int] = None,
                 start_timeout_s: float = 60.0) -> None:
        import uvicorn

        self.state = state
        self.host, self.port = host, port or free_port(host)
        self.app = build_app(state)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning",
                                                    access_log=False, lifespan="on"))
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
