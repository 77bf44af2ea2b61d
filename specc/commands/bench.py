"""``specc bench ARTIFACT``: the artifact's runtime against plain decoding (κ = 0 through the same
runtime and target) over the shipped prompts (or ``--prompts``), with a check that greedy outputs
are identical:

* default: batch 1, per category: decode tokens/s (prefill excluded) next to end-to-end tokens/s
  (prefill included), τ, the speedup on each, and ``explain``'s predicted speedup at batch 1;
* ``--concurrency 1,4,16,64``: continuous batching with at most C requests in flight (the prompts
  cycled to ``--requests-per-slot`` × C requests): output and decode tokens/s, τ, time per output
  token p50/p99, the κ the schedule chose, speedup over plain — and, when the artifact carries a
  profiled cost table, the cost model's predicted decode speedup over the steps the run took, and
  ``explain``'s prediction of the plan at that concurrency (:func:`specc.commands.explain.plan_story`:
  the plan's cost table and acceptance record, ``specc tune``'s predictor) with measured / predicted.
"""
from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import positive_int, thread_count

    parser.add_argument("artifact", metavar="PLAN|ARTIFACT",
                        help="a compiled artifact directory, or a plan (file or preset name) compiled on the fly "
                             "into the cache as `specc run PLAN` does")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides of the plan")
    parser.add_argument("--prompts", metavar="FILE", default=None,
                        help="prompts file, - = stdin (default: shipped set)")
    parser.add_argument("--limit", type=positive_int, default=12, metavar="N",
                        help="prompts (round-robin over categories)")
    parser.add_argument("--category", action="append", default=None)
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N")
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N", help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--concurrency", metavar="C[,C...]", default=None,
                        help="continuous batching at these concurrencies instead of batch 1 (e.g. 1,4,16,64)")
    parser.add_argument("--requests-per-slot", type=positive_int, default=2, metavar="N",
                        help="with --concurrency: N x C requests per run (default 2)")
    parser.add_argument("--target", default=None, metavar="PATH",
                        help="bench this model instead of the plan's target: a Hugging Face model directory "
                             "(config.json, *.safetensors, tokenizer files) or a .gguf file (nothing is downloaded)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")


def run(args) -> int:
    from specc.console import progress
    from specc.errors import PromptError
    from specc.runtime.benchmark import format_table, plain_runtime, summarize, time_requests
    from specc.runtime.loader import load_runtime
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams

    concurrency = concurrency_list(args.concurrency) if args.concurrency else None
    if args.threads is not None:
        from specc.models.llama import configure_cpu_threads

        configure_cpu_threads(args.threads)
    from specc.commands.compile import artifact_for

    records = select(read_prompts(args.prompts or shipped_prompts_path(), progress=True), args.limit,
                     args.category)
    if not records:
        raise PromptError(f"no prompts left after --category {args.category}")
    args.artifact = str(artifact_for(args.artifact, args.overrides,
                                     say=None if args.json else (lambda m: print(m, file=sys.stderr)),
                                     target=args.target))
    if concurrency:  # from the manifest alone: the full check of the artifact comes with the runtime
        from specc.runtime.artifact import read_manifest

        check_requests(args.requests_per_slot, max(concurrency), read_manifest(args.artifact))
    runtime, art = load_runtime(args.artifact, device=args.device)
    print(f"loaded: {runtime.load_report()}", file=sys.stderr)
    if concurrency:
        from specc.commands.explain import plan_story

        story = plan_story(args.artifact, (), concurrency)
        return _run_concurrency(args, runtime, art, records, concurrency, story)
    plain = plain_runtime(runtime, [1])
    reqs = [Request(prompt_ids=encode_prompt(r, runtime.tokenizer),
                    params=SamplingParams(max_new_tokens=args.max_new_tokens), request_id=r.id) for r in records]
    cats = [r.category or "-" for r in records]
    bar = progress(total=2 * len(reqs), desc="specc bench", unit="req")
    try:
        base = time_requests(plain, reqs, cats, bar.update)
        spec = time_requests(runtime, reqs, cats, bar.update)
    finally:
        bar.close()  # ends the bar's line, so an error message starts on a line of its own
    results = {"plain": summarize(base), art.manifest["plan_name"]: summarize(spec)}
    exact = sum(a.tokens == b.tokens for a, b in zip(base, spec))
    if args.json:
        print(json.dumps({"artifact": art.name, "exact": f"{exact}/{len(reqs)}",
                          "results": {m: {c: vars(s) for c, s in per.items()} for m, per in results.items()}}))
    else:
        print(f"{art.name} vs plain decoding, batch 1, {len(reqs)} prompts, max_new_tokens {args.max_new_tokens}")
        print("decode tok/s: tokens after the first per second of decode (prefill excluded); e2e tok/s: all "
              "output tokens per second of wall time (prefill included); x: over plain decoding")
        print(format_table(results))
        from specc.commands.explain import plan_story

        told = plan_story(args.artifact, (), [1])
        if told.get("rows"):
            r = told["rows"][0]
            print(f"explain predicted at batch 1: κ = {r['num_steps']}, {r['speedup']:.2f}x decode over plain "
                  f"(`specc explain`, from {told.get('cost_table')} and the plan's acceptance)")
        else:
            print(f"explain's prediction: {told.get('unknown')}")
        print(f"greedy outputs identical to plain: {exact}/{len(reqs)}")
    return 0 if exact == len(reqs) else 1


#: Bytes a request's token ids take per token in Python lists (an 8-byte pointer and a 28-byte int).
BYTES_PER_TOKEN = 36


def check_requests(per_slot: int, concurrency: int, manifest) -> None:
    """``--requests-per-slot`` times the largest ``--concurrency`` requests are built up front, each
    with room for the artifact's ``max_model_len`` token ids (prompt and output; ``manifest``: its
    ``manifest.json``): refused when they would not fit in this machine's memory
    (:func:`specc.limits.check_fits`). Raises SpeccError."""
    from specc.limits import check_fits

    value = ((manifest.get("runtime") or {}).get("target") or {}).get("max_model_len")
    tokens = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 2048
    check_fits("--requests-per-slot", per_slot, lambda n: n * concurrency * tokens * BYTES_PER_TOKEN,
               f"{concurrency} x that many requests of up to {tokens} token ids each")


#: Most requests in flight ``--concurrency`` takes (bench and tune): far beyond the batch rows of any
#: CPU-sized artifact; the requests past the rows only wait.
MAX_CONCURRENCY = 4096


def concurrency_list(text: str) -> list:
    """``--concurrency C[,C...]``: integers in ``[1, MAX_CONCURRENCY]``, in the order given.
    Raises SpeccError naming the option."""
    from specc.errors import SpeccError

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(not 1 <= v <= MAX_CONCURRENCY for v in vals):
        shown = text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
        raise SpeccError(f"--concurrency {shown!r}: give integers in 1..{MAX_CONCURRENCY} separated by commas, "
                         f"e.g. 1,4,16,64")
    return vals


def _run_concurrency(args, runtime, art, records, concurrency, story=None) -> int:
    from specc import methods
    from specc.console import progress
    from specc.errors import SpeccError
    from specc.runtime.benchmark import plain_runtime, predicted_decode_tok_s, run_concurrency
    from specc.runtime.prompts import encode_prompt
    from specc.runtime.request import Request, SamplingParams
    from specc.runtime.schedule import BudgetSchedule

    if max(concurrency) > runtime.max_rows:
        raise SpeccError(f"--concurrency {max(concurrency)} exceeds the artifact's largest batch bucket "
                         f"({runtime.max_rows}); compile the plan with runtime.max_batch_size={max(concurrency)}")
    sizes = sorted({s.spec.batch_size for s in runtime.states})
    plain = plain_runtime(runtime, sizes)
    encoded = [encode_prompt(r, runtime.tokenizer) for r in records]
    spec = art.manifest["runtime"]
    table = None
    if (spec.get("schedule") or {}).get("cost_table"):
        table = BudgetSchedule({"cost_table": spec["schedule"]["cost_table"], "buckets": {}}, [(1, 0)]).table
    method = methods.get(spec["method"]["name"])
    rows = []
    bar = progress(total=2 * len(concurrency), desc="specc bench", unit="run")
    try:
        for c in concurrency:
            n = args.requests_per_slot * c
            reqs = [Request(prompt_ids=encoded[i % len(encoded)], request_id=f"r{i}",
                            params=SamplingParams(max_new_tokens=args.max_new_tokens)) for i in range(n)]
            base = run_concurrency(plain, reqs, c)
            bar.update(1)
            res = run_concurrency(runtime, reqs, c)
            bar.update(1)
            k_mean = sum(k * v for k, v in res.kappa_steps.items()) / max(1, sum(res.kappa_steps.values()))
            # every draft-model pass of a step, draft stage and draft-extend alike (counted at one iteration boundary)
            passes = (methods.proposal_passes(method.name, max(1, round(k_mean))) if k_mean > 0 else 0) \
                + methods.extend_passes(method.name)
            pred = None
            if table is not None:
                pred = predicted_decode_tok_s(res, table, passes) / predicted_decode_tok_s(base, table, 0)
            told = next((r for r in (story or {}).get("rows") or [] if r["concurrency"] == c), None)
            speedup = res.decode_tok_s / base.decode_tok_s if base.decode_tok_s else 0.0
            rows.append({"concurrency": c, "requests": n, "plain_decode_tok_s": base.decode_tok_s,
                         "explain_speedup": told["speedup"] if told else None,
                         "explain_tok_s": told["tok_s"] if told else None,
                         "measured_over_explain": speedup / told["speedup"] if told and told["speedup"] else None,
                         "decode_tok_s": res.decode_tok_s, "output_tok_s": res.output_tok_s,
                         "speedup": speedup,
                         "predicted_speedup": pred, "tau": res.tau, "tpot_ms_p50": res.tpot_ms_p50,
                         "tpot_ms_p99": res.tpot_ms_p99, "kappa_steps": res.kappa_steps,
                         "exact": sum(a == b for a, b in zip(base.outputs, res.outputs)), "n": n})
    finally:
        bar.close()
    if args.json:
        print(json.dumps({"artifact": art.name, "results": rows,
                          "explain": {k: (story or {}).get(k) for k in ("cost_table", "acceptance", "tuned", "unknown")}}))
    else:
        print(f"{art.name} vs plain decoding, continuous batching, max_new_tokens {args.max_new_tokens}")
        print("decode tok/s: tokens after each request's first per second of decode (prefill excluded); e2e "
              "tok/s: all output tokens per second of wall time (prefill included); speedup: on decode tok/s")
        print(f"{'C':>4s} {'plain decode':>12s} {'decode tok/s':>12s} {'e2e tok/s':>9s} {'speedup':>8s} "
              f"{'predicted':>9s} {'tau':>5s} {'TPOT p50/p99 ms':>16s}  kappa steps")
        for r in rows:
            pred = f"{r['predicted_speedup']:.2f}x" if r["predicted_speedup"] is not None else "-"
            print(f"{r['concurrency']:4d} {r['plain_decode_tok_s']:12.1f} {r['decode_tok_s']:12.1f} "
                  f"{r['output_tok_s']:9.1f} {r['speedup']:7.2f}x {pred:>9s} {r['tau']:5.2f} "
                  f"{r['tpot_ms_p50']:7.1f}/{r['tpot_ms_p99']:<8.1f}  "
                  + " ".join(f"k{k}:{v}" for k, v in sorted(r["kappa_steps"].items())))
        for r in rows:
            if r["explain_speedup"] is not None:
                print(f"C={r['concurrency']}: measured {r['speedup']:.2f}x, explain predicted {r['explain_speedup']:.2f}x "
                      f"(measured / predicted {r['measured_over_explain']:.2f}; `specc explain`, from "
                      f"{(story or {}).get('cost_table')} and the plan's acceptance)")
        if story is not None and story.get("unknown"):
            print(f"explain's prediction: {story['unknown']}")
        print("greedy outputs identical to plain: " + ", ".join(f"C={r['concurrency']} {r['exact']}/{r['n']}" for r in rows))
    return 0 if all(r["exact"] == r["n"] for r in rows) else 1
