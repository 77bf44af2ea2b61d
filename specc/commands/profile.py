"""``specc profile PLAN [overrides] --out FILE``: measure this device's cost table for a plan — target
forward + accept time by verified token count (1 … the plan's largest bucket × verify width), one
draft pass by request count — and write it as JSON (schema: :mod:`specc.runtime.profile`). Point
``schedule.cost_table`` at the file for ``explain``, ``schedule.kind: auto`` and ``budget``.

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
    from specc.runtime.args import positive_int

    parser.add_argument("plan", metavar="PLAN", help="plan YAML file or preset name (conf/plan/<name>.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="Hydra overrides (dotted.key=value)")
    parser.add_argument("--out", metavar="FILE", required=True, help="cost-table JSON to write")
    parser.add_argument("--context", type=positive_int, default=256, metavar="N",
                        help="history tokens per request before the measured step (default 256)")
    parser.add_argument("--repeats", type=positive_int, default=5, metavar="N", help="timed runs per size (median)")
    parser.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                        help="largest verified token count (default: largest bucket × widest verify)")
    parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="override runtime.device")


def _check_out(path: Path) -> None:
    from specc.errors import SpeccError

    if path.exists() and not path.is_file():
        raise SpeccError(f"--out {path}: exists and is not a regular file; give a file path")
    if not path.parent.is_dir():
        raise SpeccError(f"--out {path}: the folder {path.parent} does not exist; create it or give another path")
    if not os.access(path.parent, os.W_OK):
        raise SpeccError(f"--out {path}: the folder {path.parent} is not writable")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specc import codegen
    from specc.analyze import lower_plan
    from specc.plan.load import load_plan
    from specc.runtime.loader import load_models
    from specc.runtime.profile import cost_table, profile_costs, token_grid

    out = Path(args.out)
    _check_out(out)
    loaded = load_plan(args.plan, list(args.overrides))
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
    target, _, drafter, dev = load_models(spec, args.device, max(s.num_steps for s in low.states))
    from specc.models.llama import default_cpu_threads

    top = args.max_tokens or max_batch * max_width
    total = args.repeats + 1 + (len(token_grid(max_batch)) if drafter is not None else 0)
    bar = tqdm(total=total, desc="specc profile", unit="size", file=sys.stderr)
    try:
        measured = profile_costs(target, drafter, max_batch=max_batch, max_width=max_width,
                                 verify_rule=resolved.verify.rule, context=args.context, repeats=args.repeats,
                                 max_tokens=top, on_progress=lambda _: bar.update(1))
    except ValueError as exc:
        from specc.errors import SpeccError

        raise SpeccError(str(exc)) from None
    finally:
        bar.close()
    table = cost_table(measured, device=dev, plan=plan.name, method=plan.method.name, context=args.context,
                       repeats=args.repeats, threads=args.threads or default_cpu_threads(),
                       capture_sizes=low.capture_sizes if dev.type == "cuda" else (1,))
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
    return 0
