"""``specc profile PLAN [overrides] --out FILE``: measure this device's cost table for a plan — target
forward + accept time by verified token count (1 … the plan's largest bucket × verify width), one
draft pass by request count — under every dtype (``--dtypes``) and compile backend (``--backends``)
asked, pick the fastest setting, and write it as JSON (schema: :mod:`specc.runtime.profile`) with
the CPU's facts (torch's capability, oneDNN's ISA line). Point ``schedule.cost_table`` at the file for
``explain``, ``schedule.kind: auto`` and ``budget``, and for ``runtime.dtype: auto``.

Exit codes: 0 written, 1 the plan has rule errors for the specc runtime, 2 unusable input.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import positive_int, thread_count

    parser.add_argument("plan", metavar="PLAN", help="plan YAML file or preset name (conf/plan/<name>.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides (dotted.key=value)")
    parser.add_argument("--out", metavar="FILE", required=True, help="cost-table JSON to write")
    parser.add_argument("--context", type=positive_int, default=256, metavar="N",
                        help="history tokens per request before the measured step (default 256)")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N", help="timed runs per size (median)")
    parser.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                        help="largest verified token count (default: largest bucket × widest verify)")
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N",
                        help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override runtime.device")
    parser.add_argument("--dtypes", default="auto", metavar="LIST",
                        help="target dtypes to time, comma-separated, of native (a GGUF's own quantized weights, "
                             "CPU), float32, bfloat16, float16; default auto: native,float32 for a GGUF target on "
                             "the CPU, else float32,bfloat16. The fastest becomes the table's choice")
    parser.add_argument("--qgemm-variants", default="auto", metavar="LIST",
                        help="quantized-kernel variants to time for the native dtype (specc.kernels.qgemm: "
                             "avx512vnni, avx2int8, avx512, avx2, portable); default auto: every variant this CPU "
                             "runs but portable. The fastest at the plan's state shapes becomes the table's choice")
    parser.add_argument("--backends", default="eager", metavar="LIST",
                        help="compile backends to time at the plan's state shapes: eager, inductor (compiling each "
                             "shape takes tens of seconds); default eager")


def _cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def run(args: argparse.Namespace) -> int:
    from specc.compiler import codegen
    from specc.console import progress
    from specc.io import check_output_file
    from specc.plan.load import load_plan

    out = Path(args.out)
    check_output_file(out, "--out")
    loaded = load_plan(args.plan, list(args.overrides))  # checked before torch is imported
    from specc.predict.analyze import lower_plan
    from specc.runtime.loader import load_models
    from specc.runtime.profile import (check_sizes, choose, cost_table, profile_costs, time_state_shapes,
                                       token_grid)

    # the table is what a budget / auto plan needs: profile it without one
    plan = dataclasses.replace(loaded.plan, schedule=dataclasses.replace(loaded.plan.schedule, cost_table=None,
                                                                         kind="static"))
    resolved, violations = codegen.resolve_plan(plan)
    errors = [v for v in violations if codegen._severity(v) == "error"]
    if errors:
        print(f"specc profile: plan {plan.name!r} ({loaded.path}) has {len(errors)} error(s) for the specc "
              f"runtime; nothing was measured:", file=sys.stderr)
        for v in errors:
            print(f"  {codegen.format_violation(v, loaded.where)}", file=sys.stderr)
        return 1
    low = lower_plan(dataclasses.replace(loaded.plan, schedule=dataclasses.replace(
        resolved.schedule, cost_table=None, kind="static" if loaded.plan.schedule.kind in ("budget", "auto")
        else loaded.plan.schedule.kind), method=resolved.method))
    max_batch = max(low.capture_sizes)
    max_width = max(s.num_draft_tokens for s in low.states)
    spec = codegen.runtime_section(resolved, low.schedule.as_dict(), max(s.num_steps for s in low.states))
    if args.threads is not None:
        from specc.models.llama import configure_cpu_threads

        configure_cpu_threads(args.threads)
    gguf_cpu = (resolved.target.format == "gguf" or str(resolved.target.path or "").endswith(".gguf")) and \
        (args.device or resolved.runtime.device) in ("cpu", "auto", None) and not _cuda_available()
    if args.dtypes == "auto":
        dtypes = ["native", "float32"] if gguf_cpu else ["float32", "bfloat16"]
    else:
        dtypes = _choices(args.dtypes, ("native", "float32", "bfloat16", "float16"), "--dtypes")
        if "native" in dtypes and not gguf_cpu:
            from specc.errors import SpeccError

            raise SpeccError("--dtypes native: the native path runs a GGUF target on the CPU; this plan's target "
                             f"is {resolved.target.path} on {args.device or resolved.runtime.device}; drop native")
    backends = _choices(args.backends, ("eager", "inductor"), "--backends")
    if args.qgemm_variants != "auto" and "native" not in dtypes:
        from specc.errors import SpeccError

        raise SpeccError(f"--qgemm-variants {args.qgemm_variants}: the kernel variants are timed for the native "
                         f"dtype only, and --dtypes is {','.join(dtypes)}; drop --qgemm-variants")
    variants = _qgemm_variants(args.qgemm_variants) if "native" in dtypes else []
    top = args.max_tokens or max_batch * max_width
    if resolved.target.max_model_len:  # refused before any model loads (profile_costs checks the loaded one too)
        try:
            check_sizes(args.max_tokens, max_batch, max_width, args.context, int(resolved.target.max_model_len))
        except ValueError as exc:
            from specc.errors import SpeccError

            raise SpeccError(str(exc)) from None
    shapes = sorted({(int(s.batch_size), int(s.num_draft_tokens)) for s in low.states} | {(1, 1)})
    settings: dict = {}
    tables: dict = {}
    measured = None
    from specc import device as DV
    from specc.models.llama import default_cpu_threads

    threads = args.threads or default_cpu_threads()
    qgemm_block = None
    if len(variants) > 1:
        qgemm_block = _time_variants(spec, args, variants, shapes)
    elif variants and args.qgemm_variants != "auto":  # one variant named: profiled under it, nothing to time
        qgemm_block = {"state_ms": {}, "chosen": variants[0], "why": f"--qgemm-variants named only {variants[0]}"}
    if qgemm_block is not None:  # the native loads below run the chosen variant (load_models sets it)
        from specc.runtime.loader import with_kernel_variant

        spec = with_kernel_variant(spec, qgemm_block["chosen"])
    for i, dtype in enumerate(dtypes):
        spec_d = dict(spec, dtype=dtype)
        target, _, drafter, dev = load_models(spec_d, args.device, max(s.num_steps for s in low.states))
        total = args.repeats + 1 + (len(token_grid(max_batch)) if drafter is not None and i == 0 else 0)
        bar = progress(total=total, desc=f"specc profile {dtype}", unit="size")
        try:
            m = profile_costs(target, drafter if i == 0 else None, max_batch=max_batch, max_width=max_width,
                              verify_rule=resolved.verify.rule, context=args.context, repeats=args.repeats,
                              max_tokens=top, on_progress=lambda _: bar.update(1))
        except ValueError as exc:
            from specc.errors import SpeccError

            raise SpeccError(str(exc)) from None
        finally:
            bar.close()
        if measured is None:
            measured = m
        tables[dtype] = m
        for backend in backends:
            if dtype == "native" and backend == "inductor":
                continue  # the native kernels are C calls: inductor would only graph-break around them
            st = time_state_shapes(target, shapes, context=args.context, repeats=args.repeats,
                                   compiled=backend == "inductor")
            settings[f"{dtype}/{backend}"] = {"state_ms": st} | ({"forward_ms": m["forward_ms"]} if backend == "eager" else {})
        del target
    facts = DV.cpu_facts(threads) if dev.type == "cpu" else None
    choice = choose(settings, facts)
    if qgemm_block is not None:
        choice["qgemm_variant"] = qgemm_block["chosen"]
    chosen = tables[choice["dtype"]]
    measured = dict(measured, verify_ms=chosen["verify_ms"], forward_ms=chosen["forward_ms"],
                    accept_ms=chosen["accept_ms"])
    table = cost_table(measured, device=dev, plan=plan.name, method=plan.method.name, context=args.context,
                       repeats=args.repeats, threads=threads,
                       capture_sizes=low.capture_sizes if dev.type == "cuda" else (1,))
    table.update(settings=settings, choice=choice, cpu=facts)
    if qgemm_block is not None:
        table["qgemm"] = qgemm_block
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    v = measured["verify_ms"]
    print(f"cost table for {plan.name} on {table['device_name']} ({table['threads']} thread(s)): "
          f"{len(v)} verify sizes, 1 token {v['1']:.1f} ms, {top} tokens {v[str(top)]:.1f} ms"
          + (f"; draft pass at 1 request {measured['draft_ms']['1']:.1f} ms" if "draft_ms" in measured else "")
          + f" -> {out}")
    if dev.type == "cpu":
        print(f"CPU: {DV.describe(table['cpu'])}")
    print(f"chosen: runtime.dtype {choice['dtype']}, compile backend {choice['compile_backend']} ({choice['why']})")
    if qgemm_block is not None:
        print(f"chosen: qgemm variant {qgemm_block['chosen']} ({qgemm_block['why']})")
    return 0


def _qgemm_variants(text: str) -> list:
    """``--qgemm-variants``: ``auto`` (every variant this CPU runs, none without the C kernels) or a list,
    each checked against what this CPU runs. Raises SpeccError naming the option."""
    from specc.errors import SpeccError
    from specc.kernels import qgemm

    runnable = qgemm.supported()
    if text == "auto":  # the portable C only where nothing else runs: it is never the fastest beside them
        return [v for v in runnable if v != "portable"] or runnable
    want = _choices(text, qgemm.VARIANTS, "--qgemm-variants")
    bad = [v for v in want if v not in runnable]
    if bad:
        raise SpeccError(f"--qgemm-variants: this CPU does not run {', '.join(bad)} (it runs "
                         f"{', '.join(runnable) or 'none: the C kernels are unavailable'}); drop them")
    return want


def _time_variants(spec: dict, args: argparse.Namespace, variants: list, shapes: list) -> dict:
    """The native target's forward at the plan's state shapes under each qgemm variant (one load per
    variant: the int8 variants pack the weights at load), every shape once per round
    (``time_state_shapes(interleave=True, fill=False)``: the attention reads zero K/V, the same work
    without a prefill per variant); each load takes its variant from the spec (``with_kernel_variant``:
    :func:`specc.runtime.loader.load_models` sets the variant a spec's table chose). Returns the table's
    ``qgemm`` block."""
    from specc.console import progress
    from specc.runtime.loader import load_models, with_kernel_variant
    from specc.runtime.profile import choose_variant, time_state_shapes

    state_ms = {}
    bar = progress(total=len(variants), desc="specc profile kernel variants", unit="variant")
    try:
        for v in variants:
            target, _, _, _ = load_models(with_kernel_variant(dict(spec, dtype="native"), v), args.device, 0)
            state_ms[v] = time_state_shapes(target, shapes, context=args.context, repeats=args.repeats,
                                            interleave=True, fill=False)
            del target
            bar.update(1)
    finally:
        bar.close()
    return {"state_ms": state_ms, **choose_variant(state_ms)}


def _choices(text: str, allowed, option: str) -> list:
    """A comma-separated option's values, each checked. Raises SpeccError naming the option."""
    from specc.errors import SpeccError

    vals = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in vals if x not in allowed]
    if not vals or bad:
        raise SpeccError(f"{option} {text!r}: give a comma-separated list of {', '.join(allowed)}")
    return list(dict.fromkeys(vals))
