"""``specc bench ARTIFACT``: the artifact's runtime against plain decoding (κ = 0 through the same
runtime and target) at batch 1 over the shipped prompts (or ``--prompts``), per category: decode
tokens/s (prefill excluded) next to end-to-end tokens/s (prefill included), τ, the speedup on each,
and a check that greedy outputs are identical."""
from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import positive_int

    parser.add_argument("artifact", metavar="ARTIFACT", help="compiled artifact directory")
    parser.add_argument("--prompts", metavar="FILE", default=None,
                        help="prompts file, - = stdin (default: shipped set)")
    parser.add_argument("--limit", type=positive_int, default=12, metavar="N",
                        help="prompts (round-robin over categories)")
    parser.add_argument("--category", action="append", default=None)
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N")
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N", help="torch CPU threads")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from specc.errors import PromptError
    from specc.runtime.benchmark import format_table, summarize, time_requests
    from specc.runtime.engine import Runtime
    from specc.runtime.loader import load_runtime
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams
    from specc.runtime.state import StateSpec

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    records = select(read_prompts(args.prompts or shipped_prompts_path()), args.limit, args.category)
    if not records:
        raise PromptError(f"no prompts left after --category {args.category}")
    runtime, art = load_runtime(args.artifact, device=args.device)
    plain = Runtime(runtime.target, runtime.tokenizer, None, [StateSpec("b1_k0_plain", "none", 1, 0)],
                    max_model_len=runtime.max_model_len, device=runtime.device)
    reqs = [Request(prompt_ids=encode_prompt(r, runtime.tokenizer),
                    params=SamplingParams(max_new_tokens=args.max_new_tokens), request_id=r.id) for r in records]
    cats = [r.category or "-" for r in records]
    bar = tqdm(total=2 * len(reqs), desc="specc bench", unit="req", file=sys.stderr)
    try:
        base = time_requests(plain, reqs, cats, bar.update)
        spec = time_requests(runtime, reqs, cats, bar.update)
    finally:
        bar.close()  # ends the bar's line, so an error message starts on a line of its own
    results = {"plain": summarize(base), art.manifest["plan_name"]: summarize(spec)}
    exact = sum(a.tokens == b.tokens for a, b in zip(base, spec))
    if args.json:
        print(json.dumps({"artifact": art.path.name, "exact": f"{exact}/{len(reqs)}",
                          "results": {m: {c: vars(s) for c, s in per.items()} for m, per in results.items()}}))
    else:
        print(f"{art.path.name} vs plain decoding, batch 1, {len(reqs)} prompts, max_new_tokens {args.max_new_tokens}")
        print("decode tok/s: tokens after the first per second of decode (prefill excluded); e2e tok/s: all "
              "output tokens per second of wall time (prefill included); x: over plain decoding")
        print(format_table(results))
        print(f"greedy outputs identical to plain: {exact}/{len(reqs)}")
    return 0 if exact == len(reqs) else 1
