"""``specc run PLAN|ARTIFACT [OVERRIDES]``: decode prompts with a compiled artifact, printing outputs and
metrics. A plan (a file or a preset name, with overrides) is compiled on the fly into the artifact cache
(``specc.commands.compile.artifact_for``: ``~/.cache/specc/artifacts/<plan>-<hash>``, reused while the
plan and specc are unchanged).

Inputs: ``--prompt TEXT``, ``--prompts FILE`` (JSONL with ``prompt``/``messages`` per line, or plain
text with one prompt per line; ``-`` reads stdin), or prompts piped/redirected into stdin (same
formats); otherwise the shipped prompt set (``specc/data/prompts.jsonl``). Numeric flags are checked
while parsing (``specc.runtime.args``) and ``--batch-size`` against the artifact's largest bucket,
all before the models load. Progress bars go to stderr (reading a large prompts file, tokenizing,
decoding).

Each request's result is written to stdout as soon as it finishes (in finish order, which with
``--batch-size`` above 1 need not be the input order; each names its prompt id): a text block, or
with ``--json`` one JSON object per line; then the run's summary (``{"summary": ...}`` last with
``--json``). On SIGINT (Ctrl-C) the results written so far stay, the summary of the finished
requests follows (``"interrupted": true`` with ``--json``) and the exit status is 130.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from typing import List

from specc.console import plural


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import (non_negative_float, non_negative_int, positive_int, seed_int, thread_count,
                                    unit_interval)

    parser.add_argument("artifact", metavar="PLAN|ARTIFACT",
                        help="a plan (YAML file or preset name: compiled on the fly into the cache) or a compiled "
                             "artifact directory (from specc compile)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides of the plan: group=option or dotted.key=value")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", metavar="TEXT", help="one prompt (the chat template is applied)")
    src.add_argument("--prompts", metavar="FILE", help="JSONL (prompt or messages per line) or plain text file; "
                     "- = stdin")
    parser.add_argument("--limit", type=positive_int, default=None, metavar="N", help="use the first N prompts "
                        "(for the shipped set: round-robin over its categories)")
    parser.add_argument("--category", action="append", default=None, help="only prompts of this category")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, metavar="N")
    parser.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=unit_interval, default=1.0, help="in (0, 1]; 1 = off")
    parser.add_argument("--top-k", type=non_negative_int, default=0, help="0 = off")
    parser.add_argument("--seed", type=seed_int, default=None, help="seed request i with SEED + i (reproducible "
                        "whatever the batch); default: one shared generator seeded 0")
    parser.add_argument("--stop", action="append", default=[], metavar="STRING", help="stop string (repeatable)")
    parser.add_argument("--batch-size", type=positive_int, default=1, metavar="N",
                        help="requests decoded together (<= the artifact's largest bucket)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override runtime.device")
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N",
                        help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1, the fastest measured here)")
    parser.add_argument("--target", default=None, metavar="PATH",
                        help="run this model instead of the plan's target: a Hugging Face model directory "
                             "(config.json, *.safetensors, tokenizer files) or a .gguf file (nothing is downloaded)")
    parser.add_argument("--json", action="store_true", help="one JSON object per request, then a summary")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _records(args) -> list:
    from specc.errors import PromptError
    from specc.runtime.prompts import (PROGRESS_BYTES, PromptRecord, check_text, parse_prompts, read_prompts,
                                       read_stdin, select, shipped_prompts_path)

    if args.limit is not None and args.limit < 1:
        raise PromptError(f"--limit must be >= 1, got {args.limit}")
    if args.prompt is not None:
        if not args.prompt.strip():
            raise PromptError("--prompt is empty")
        check_text(args.prompt, "--prompt")
        recs = [PromptRecord(id="prompt", prompt=args.prompt)]
    elif args.prompts is not None:
        recs = read_prompts(args.prompts, progress=not args.no_progress)
    else:
        piped = read_stdin()
        if piped is not None and piped.strip():
            recs = parse_prompts(piped.splitlines(), "<stdin>", not args.no_progress and len(piped) >= PROGRESS_BYTES)
        else:
            recs = read_prompts(shipped_prompts_path())
    recs = select(recs, args.limit, args.category)
    if not recs:
        raise PromptError(f"no prompts left after --category {args.category}")
    return recs


def check_batch_size(batch_size: int, art) -> None:
    """Refuse ``--batch-size`` above the artifact's largest batch bucket (``SpeccError``)."""
    from specc.errors import SpeccError
    from specc.runtime.loader import largest_bucket

    limit = largest_bucket(art)
    if batch_size > limit:
        raise SpeccError(f"--batch-size {batch_size} exceeds the largest batch bucket of {art.name} "
                         f"({limit}); pass --batch-size {limit} or less, or compile a plan with larger "
                         f"deploy batch sizes")


def _encode_all(records, tokenizer, no_progress: bool) -> list:
    """Token ids of every record (a progress bar on stderr for more than a few hundred prompts)."""
    from specc.console import progress
    from specc.runtime.prompts import encode_prompt

    show = not no_progress and len(records) > 200
    return [encode_prompt(rec, tokenizer) for rec in progress(records, desc="tokenizing prompts", unit="prompt",
                                                              disable=not show, mininterval=0.5)]


def _result_text(rec, out, as_json: bool) -> str:
    """One finished request as written to stdout: a JSON line, or a text block."""
    if as_json:
        obj = {"id": rec.id, "category": rec.category, "prompt": rec.text, "text": out.text,
               "num_tokens": len(out.token_ids), "finish_reason": out.finish_reason, "time_s": round(out.time_s, 4)}
        obj.update(out.counters.as_dict())
        return json.dumps(obj, ensure_ascii=False) + "\n"
    head = f"[{rec.id}]" + (f" ({rec.category})" if rec.category else "")
    return (f"=== {head} {rec.text[:100]!r}\n{out.text.strip()}\n"
            f"--- {len(out.token_ids)} tokens, {out.finish_reason}, tau {out.counters.tau:.2f}\n")


class _WholeWrites:
    """SIGINT handling for a run that writes results as they finish: Ctrl-C raises
    ``KeyboardInterrupt`` at once, except while a result is being written, where it waits until the
    result is whole (so stdout never ends in half a JSON line and the count of results is exact)."""

    def __init__(self) -> None:
        self.busy = False
        self.pending = False

    def handler(self, signum, frame) -> None:
        if self.busy:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def writing(self):
        self.busy = True
        try:
            yield
        finally:
            self.busy = False
            if self.pending:
                raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self.handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def _print_summary(runtime, art, as_json: bool, finished: int, total: int, interrupted: bool) -> None:
    m = runtime.metrics
    if as_json:
        summary = dict(m.as_dict(), artifact=art.name, states=[s.spec.name for s in runtime.states])
        if interrupted:
            summary.update(interrupted=True, finished=finished, requests=total)
        if hasattr(runtime.drafter, "host_report"):  # the drafter's own host work and sizes (suffix decoding)
            summary["drafter"] = runtime.drafter.host_report()
        print(json.dumps({"summary": summary}), flush=True)
        return
    print("=== metrics" + (f" of the {plural(finished, 'finished request')}; interrupted after {finished} of {total}"
                            if interrupted else ""))
    print(m.summary(), flush=True)
    if hasattr(runtime.drafter, "host_report"):
        print("drafter: " + ", ".join(f"{k} {v}" for k, v in runtime.drafter.host_report().items()), flush=True)


def run(args) -> int:
    from specc.console import progress
    from specc.runtime.artifact import load_artifact
    from specc.runtime.loader import load_runtime
    from specc.runtime.request import Request, SamplingParams

    if args.threads is not None:
        from specc.models.llama import configure_cpu_threads

        configure_cpu_threads(args.threads)
    from specc.commands.compile import artifact_for

    records = _records(args)
    args.artifact = str(artifact_for(args.artifact, args.overrides,
                                     say=None if args.json else (lambda m: print(m, file=sys.stderr)),
                                     target=args.target))
    art = load_artifact(args.artifact)
    check_batch_size(args.batch_size, art)
    runtime, art = load_runtime(args.artifact, device=args.device, artifact=art)
    ids = _encode_all(records, runtime.tokenizer, args.no_progress)
    requests: List[Request] = []
    for i, (rec, prompt_ids) in enumerate(zip(records, ids)):
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k,
                                seed=None if args.seed is None else args.seed + i, stop=tuple(args.stop))
        requests.append(Request(prompt_ids=prompt_ids, params=params, prompt=rec.text, request_id=rec.id))
    if not args.json:
        print(f"artifact {art.name}: {plural(len(runtime.states), 'state')} "
              f"[{', '.join(s.spec.name for s in runtime.states)}] on {runtime.device}; "
              f"{plural(len(requests), 'prompt')}", file=sys.stderr)
        print(f"loaded: {runtime.load_report()}", file=sys.stderr)
    by_id = {rec.id: rec for rec in records}
    bar = progress(total=len(requests), desc="specc run", unit="req", disable=args.no_progress)
    finished = 0
    guard = _WholeWrites()

    def done(out):
        nonlocal finished
        text = _result_text(by_id[out.request.request_id], out, args.json)
        with guard.writing():
            bar.clear()  # the result's lines go above the bar
            sys.stdout.write(text)
            sys.stdout.flush()
            finished += 1
            bar.update(1)
            bar.set_postfix(tau=f"{runtime.metrics.tau:.2f}")

    try:
        with guard.installed():
            runtime.generate(requests, batch_size=args.batch_size, on_finish=done)
    except KeyboardInterrupt:
        bar.close()
        print(f"specc run: interrupted after {finished} of {plural(len(requests), 'request')}", file=sys.stderr)
        _print_summary(runtime, art, args.json, finished, len(requests), interrupted=True)
        return 130
    finally:
        bar.close()  # ends the bar's line, so an error message starts on a line of its own
    _print_summary(runtime, art, args.json, finished, len(requests), interrupted=False)
    return 0
