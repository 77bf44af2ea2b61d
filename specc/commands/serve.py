"""``specc serve PLAN|ARTIFACT [OVERRIDES]``: an OpenAI-compatible server (FastAPI + uvicorn) over a
compiled artifact. A plan (a YAML file or a preset name, with Hydra overrides) is compiled on the fly
into the artifact cache first, as ``specc run`` does (the one resolver,
:func:`specc.commands.compile.artifact_for`: ``~/.cache/specc/artifacts/<plan>-<hash>``, reused while
the plan and specc are unchanged).

``/v1/completions``, ``/v1/chat/completions`` (streaming or not), ``/v1/models``, ``/health``,
``/metrics`` (Prometheus). Binds 127.0.0.1 unless ``--host`` says otherwise. ``--role prefill`` /
``--role decode --prefill-url URL`` split prefill and decode over two processes (the artifact's
``deploy.disagg.role`` is the default). LoRA adapters come from the artifact's ``deploy.lora``; a
request picks one with its ``model`` field. ``--max-request-bytes`` bounds a request body (413 beyond,
before anything parses it; :mod:`specc.serve.limits`); ``--header-timeout`` and ``--body-timeout`` the
time a request head and body may take (408 beyond), ``--keep-alive-timeout`` an idle connection
(uvicorn's own), ``--shutdown-timeout`` the drain after SIGTERM (:class:`specc.serve.server.Server`).
Every flag is checked before the models load: numbers while parsing, ``--prefill-url`` (http or
https with a host), ``--host``/``--port`` (resolved and bound once), ``--max-waiting`` and
``--max-request-bytes`` against this machine's memory (a full queue of bodies as large as the limit
must fit), ``--role`` and ``--batch-size`` against the artifact (``--host``/``--port`` and memory
before a plan is compiled).
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


def _url(text: str) -> str:
    from specc.errors import SpeccError
    from specc.serve.limits import check_http_url

    try:
        return check_http_url(text, "")
    except SpeccError as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from None


#: Longest timeout a flag takes (seconds): a day.
MAX_SECONDS = 86400.0


def _seconds(text: str) -> float:
    """A number of seconds in ``(0, MAX_SECONDS]``."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(f"expected seconds in (0, {MAX_SECONDS:g}], got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import non_negative_int, port_int, positive_int, seed_int, thread_count
    from specc.serve.limits import (DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_KEEP_ALIVE_TIMEOUT,
                                    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_SHUTDOWN_TIMEOUT)

    parser.add_argument("artifact", metavar="PLAN|ARTIFACT",
                        help="a plan (YAML file or preset name: compiled on the fly into the cache) or a compiled "
                             "artifact directory (from specc compile)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides of the plan: group=option or dotted.key=value")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=port_int, default=8000)
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the base model's name in the API (default: the plan's name)")
    parser.add_argument("--role", choices=("none", "prefill", "decode"), default=None,
                        help="disaggregated serving role (default: the artifact's deploy.disagg.role)")
    parser.add_argument("--prefill-url", type=_url, default=None, metavar="URL",
                        help="decode role: the prefill instance, e.g. http://127.0.0.1:8001")
    parser.add_argument("--max-waiting", type=non_negative_int, default=256, metavar="N",
                        help="requests queued beyond the batch rows before new ones get 429 (default 256)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                        help="requests decoded together (default and cap: the artifact's largest bucket)")
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N",
                        help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override runtime.device")
    parser.add_argument("--target", default=None, metavar="PATH",
                        help="serve this model instead of the plan's target: a Hugging Face model directory "
                             "(config.json, *.safetensors, tokenizer files) or a .gguf file (nothing is downloaded)")
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of the generator requests without a seed share")
    parser.add_argument("--max-request-bytes", type=_size, default=DEFAULT_MAX_REQUEST_BYTES, metavar="BYTES",
                        help="largest request body accepted, e.g. 4194304, 512KiB, 16MiB; larger bodies are answered "
                             "413 before they are parsed (default 4 MiB)")
    parser.add_argument("--header-timeout", type=_seconds, default=DEFAULT_HEADER_TIMEOUT, metavar="SECONDS",
                        help="a request's head (request line and headers) must arrive within this time of its first "
                             f"byte, else 408 and the connection closes (default {DEFAULT_HEADER_TIMEOUT:g})")
    parser.add_argument("--body-timeout", type=_seconds, default=DEFAULT_BODY_TIMEOUT, metavar="SECONDS",
                        help="a request body must arrive within this time plus 1 s per 500 bytes, else 408 "
                             f"(default {DEFAULT_BODY_TIMEOUT:g}; Apache mod_reqtimeout's body=20,MinRate=500)")
    parser.add_argument("--keep-alive-timeout", type=_seconds, default=DEFAULT_KEEP_ALIVE_TIMEOUT, metavar="SECONDS",
                        help=f"close a kept-alive connection idle this long (uvicorn's; default {DEFAULT_KEEP_ALIVE_TIMEOUT})")
    parser.add_argument("--shutdown-timeout", type=_seconds, default=DEFAULT_SHUTDOWN_TIMEOUT, metavar="SECONDS",
                        help="on SIGTERM/SIGINT, wait this long for requests in flight, then end them (streams with "
                             f"a final error event) and exit (default {DEFAULT_SHUTDOWN_TIMEOUT:g})")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def check_memory(max_waiting: int, max_request_bytes: int) -> None:
    """``--max-request-bytes`` and ``--max-waiting`` against this machine's memory: a queue full of
    waiting requests, each holding a body as large as the limit, must fit
    (:func:`specc.limits.check_fits`). Raises SpeccError."""
    from specc.limits import check_fits

    check_fits("--max-request-bytes", max_request_bytes, lambda n: n, "one request body held in memory")
    check_fits("--max-waiting", max_waiting, lambda n: n * max_request_bytes,
               f"that many waiting requests, each holding a body of up to --max-request-bytes {max_request_bytes}")


def records_line(source: str, overrides=()) -> str:
    """One startup line: the acceptance record and cost table the plan carries and ``explain``'s
    predicted speedup at batch 1 (:func:`specc.commands.explain.plan_story`), or why none is predicted."""
    from specc.commands.explain import plan_story

    story = plan_story(source, overrides, [1])
    acc = story.get("acceptance_path") or str(story.get("acceptance") or "none").split(":", 1)[0]
    head = f"records: acceptance {acc}; cost table {story.get('cost_table') or 'none'}"
    if story.get("rows"):
        r = story["rows"][0]
        return (f"{head}; predicted at batch 1: κ = {r['num_steps']}, {r['tok_s']:.1f} tok/s vs plain "
                f"{r['plain_tok_s']:.1f} = {r['speedup']:.2f}x (`specc explain`)")
    return f"{head}; predicted at batch 1: none ({story.get('unknown')})"


def run(args) -> int:
    from specc.io import human_size
    from specc.serve.limits import check_listen

    check_listen(args.host, args.port)
    check_memory(args.max_waiting, args.max_request_bytes)
    from specc.commands.compile import artifact_for
    from specc.runtime.artifact import load_artifact
    from specc.serve.server import Server, artifact_role, check_role, load_server_state

    args.artifact = str(artifact_for(args.artifact, args.overrides, say=lambda m: print(m, file=sys.stderr),
                                     target=args.target))
    art = load_artifact(args.artifact)
    check_role(args.role or artifact_role(art), args.prefill_url)
    if args.batch_size is not None:
        from specc.commands.run import check_batch_size

        check_batch_size(args.batch_size, art)
    state = load_server_state(args.artifact, role=args.role, prefill_url=args.prefill_url,
                              served_model_name=args.served_model_name, max_waiting=args.max_waiting,
                              batch_size=args.batch_size, threads=args.threads, device=args.device, seed=args.seed,
                              max_request_bytes=args.max_request_bytes, body_timeout=args.body_timeout, art=art)
    rt = state.runtime
    print(f"specc serve: {state.info.get('artifact')} as {state.model_name!r} (role {state.role}), "
          f"{len(rt.states)} state(s), max_model_len {rt.max_model_len}, adapters {state.adapters or 'none'}, "
          f"request bodies up to {human_size(state.max_request_bytes)}; http://{args.host}:{args.port}",
          file=sys.stderr)
    print(f"loaded: {rt.load_report()}", file=sys.stderr)
    print(records_line(args.artifact), file=sys.stderr)
    Server(state, args.host, args.port, header_timeout=args.header_timeout, keep_alive_timeout=args.keep_alive_timeout,
           shutdown_timeout=args.shutdown_timeout, log_level=args.log_level).run()
    return 0
