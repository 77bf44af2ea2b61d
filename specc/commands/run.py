"""``specc run ARTIFACT``: decode prompts with a compiled artifact, printing outputs and metrics.

Inputs: ``--prompt TEXT``, ``--prompts FILE`` (JSONL with ``prompt``/``messages`` per line, or plain
text with one prompt per line), or prompts piped/redirected into stdin (same formats); otherwise the
shipped prompt set (``specc/data/prompts.jsonl``). A progress bar goes to stderr; with ``--json`` stdout carries one
JSON object per request and a last ``{"summary": ...}`` object.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ARTIFACT", help="compiled artifact directory (from specc compile)")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", metavar="TEXT", help="one prompt (the chat template is applied)")
    src.add_argument("--prompts", metavar="FILE", help="JSONL (prompt or messages per line) or plain text file")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="use the first N prompts "
                        "(for the shipped set: round-robin over its categories)")
    parser.add_argument("--category", action="append", default=None, help="only prompts of this category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="seed request i with SEED + i (reproducible "
                        "whatever the batch); default: one shared generator seeded 0")
    parser.add_argument("--stop", action="append", default=[], metavar="STRING", help="stop string (repeatable)")
    parser.add_argument("--batch-size", type=int, default=1, help="requests decoded together (<= largest bucket)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override runtime.device")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="one JSON object per request, then a summary")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _records(args) -> list:
    from specc.errors import PromptError
    from specc.runtime.prompts import PromptRecord, parse_prompts, read_prompts, select, shipped_prompts_path

    if args.limit is not None and args.limit < 1:
        raise PromptError(f"--limit must be >= 1, got {args.limit}")
    if args.prompt is not None:
        if not args.prompt.strip():
            raise PromptError("--prompt is empty")
        recs = [PromptRecord(id="prompt", prompt=args.prompt)]
    elif args.prompts is not None:
        recs = read_prompts(args.prompts)
    else:
        piped = _read_stdin()
        if piped is not None and piped.strip():
            recs = parse_prompts(piped.splitlines(), "<stdin>")
        else:
            recs = read_prompts(shipped_prompts_path())
    recs = select(recs, args.limit, args.category)
    if not recs:
        raise PromptError(f"no prompts left after --category {args.category}")
    return recs


def _read_stdin(wait_s: float = 1.0):
    """Prompts piped or redirected into stdin, or None when stdin is a terminal, /dev/null, or a
    pipe that stays silent for ``wait_s`` seconds (so an inherited, idle pipe never hangs the run)."""
    import os
    import select as _select
    import stat

    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    if sys.stdin.isatty():
        return None
    if stat.S_ISREG(mode):
        return sys.stdin.read()
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        ready, _, _ = _select.select([sys.stdin], [], [], wait_s)
        return sys.stdin.read() if ready else None
    return None


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from specc.runtime.loader import load_runtime
    from specc.runtime.prompts import encode_prompt
    from specc.runtime.request import Request, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    records = _records(args)
    runtime, art = load_runtime(args.artifact, device=args.device)
    requests: List[Request] = []
    for i, rec in enumerate(records):
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k,
                                seed=None if args.seed is None else args.seed + i, stop=tuple(args.stop))
        requests.append(Request(prompt_ids=encode_prompt(rec, runtime.tokenizer), params=params,
                                prompt=rec.text, request_id=rec.id))
    if not args.json:
        print(f"artifact {art.path.name}: {len(runtime.states)} state(s) "
              f"[{', '.join(s.spec.name for s in runtime.states)}] on {runtime.device}; "
              f"{len(requests)} prompt(s)", file=sys.stderr)
    bar = tqdm(total=len(requests), desc="specc run", unit="req", file=sys.stderr,
               disable=args.no_progress)

    def done(out):
        bar.update(1)
        bar.set_postfix(tau=f"{runtime.metrics.tau:.2f}")

    outputs = runtime.generate(requests, batch_size=args.batch_size, on_finish=done)
    bar.close()
    m = runtime.metrics
    if args.json:
        for rec, out in zip(records, outputs):
            obj = {"id": rec.id, "category": rec.category, "prompt": rec.text, "text": out.text,
                   "num_tokens": len(out.token_ids), "finish_reason": out.finish_reason,
                   "time_s": round(out.time_s, 4)}
            obj.update(out.counters.as_dict())
            print(json.dumps(obj, ensure_ascii=False))
        print(json.dumps({"summary": dict(m.as_dict(), artifact=art.path.name,
                                           states=[s.spec.name for s in runtime.states])}))
    else:
        for rec, out in zip(records, outputs):
            head = f"[{rec.id}]" + (f" ({rec.category})" if rec.category else "")
            print(f"=== {head} {rec.text[:100]!r}")
            print(out.text.strip())
            print(f"--- {len(out.token_ids)} tokens, {out.finish_reason}, tau {out.counters.tau:.2f}")
        print("=== metrics")
        print(m.summary())
    return 0
