"""``specc serve ARTIFACT``: an OpenAI-compatible server (FastAPI + uvicorn) over a compiled artifact.

``/v1/completions``, ``/v1/chat/completions`` (streaming or not), ``/v1/models``, ``/health``,
``/metrics`` (Prometheus). Binds 127.0.0.1 unless ``--host`` says otherwise. ``--role prefill`` /
``--role decode --prefill-url URL`` split prefill and decode over two processes (the artifact's
``deploy.disagg.role`` is the default). LoRA adapters come from the artifact's ``deploy.lora``; a
request picks one with its ``model`` field. ``--max-request-bytes`` bounds a request body (413 beyond,
before anything parses it; :mod:`specc.serve.limits`). Flags are checked while parsing, before models
load.
"""
from __future__ import annotations

import argparse
import sys


def _size(text: str) -> int:
    from specc.serve.limits import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import port_int, positive_int, thread_count
    from specc.serve.limits import DEFAULT_MAX_REQUEST_BYTES

    parser.add_argument("artifact", metavar="ARTIFACT", help="compiled artifact directory (from specc compile)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=port_int, default=8000)
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the base model's name in the API (default: the plan's name)")
    parser.add_argument("--role", choices=("none", "prefill", "decode"), default=None,
                        help="disaggregated serving role (default: the artifact's deploy.disagg.role)")
    parser.add_argument("--prefill-url", default=None, metavar="URL",
                        help="decode role: the prefill instance, e.g. http://127.0.0.1:8001")
    parser.add_argument("--max-waiting", type=int, default=256, metavar="N",
                        help="requests queued beyond the batch rows before new ones get 429 (default 256)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                        help="requests decoded together (default and cap: the artifact's largest bucket)")
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N",
                        help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override runtime.device")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator requests without a seed share")
    parser.add_argument("--max-request-bytes", type=_size, default=DEFAULT_MAX_REQUEST_BYTES, metavar="BYTES",
                        help="largest request body accepted, e.g. 4194304, 512KiB, 16MiB; larger bodies are answered "
                             "413 before they are parsed (default 4 MiB)")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def run(args) -> int:
    import uvicorn

    from specc.errors import SpeccError
    from specc.io import human_size
    from specc.runtime.artifact import load_artifact
    from specc.serve.app import build_app
    from specc.serve.server import load_server_state

    if args.max_waiting < 0:
        raise SpeccError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if args.batch_size is not None:
        from specc.commands.run import check_batch_size

        check_batch_size(args.batch_size, load_artifact(args.artifact))
    state = load_server_state(args.artifact, role=args.role, prefill_url=args.prefill_url,
                              served_model_name=args.served_model_name, max_waiting=args.max_waiting,
                              batch_size=args.batch_size, threads=args.threads, device=args.device, seed=args.seed,
                              max_request_bytes=args.max_request_bytes)
    rt = state.runtime
    print(f"specc serve: {state.info.get('artifact')} as {state.model_name!r} (role {state.role}), "
          f"{len(rt.states)} state(s), max_model_len {rt.max_model_len}, adapters {state.adapters or 'none'}, "
          f"request bodies up to {human_size(state.max_request_bytes)}; http://{args.host}:{args.port}",
          file=sys.stderr)
    print(f"loaded: {rt.load_report()}", file=sys.stderr)
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level=args.log_level)
    return 0
