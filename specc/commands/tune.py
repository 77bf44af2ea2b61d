"""``specc tune PROMPTS``: which plan is fastest for these prompts on this device.

1. **Measure** — each candidate drafter that fits the target (:mod:`specc.tune.candidates`; every
   shipped one by default) decodes a sample of the prompts; acceptance per draft position and the
   drafter's stage costs are recorded, each run stopping when τ's 95 % interval is within
   ``--tolerance`` or its share of ``--budget-min`` is spent (:mod:`specc.tune.measure`). Plain
   decoding runs briefly too (the baseline's host costs).
2. **Predict** — every (drafter, κ or tree) at every concurrency with the cost model and the device's
   cost table (``--cost-table``; else a shipped or cached table profiled on this CPU model with this
   many threads; else one is profiled now and cached): :mod:`specc.tune.predict`.
3. **Confirm** — the chosen bucket plan, the top ``--confirm-top`` static configurations at each
   concurrency and plain decoding run side by side through the concurrency benchmark
   (:mod:`specc.tune.confirm`); a prediction more than 15 % off is reported with its cause.
4. **Emit** — the plan, its SGLang / vLLM settings, its acceptance record, a report and a plot
   (:mod:`specc.tune.emit`).

Bad input — no prompts, an unreadable prompt file, a method that does not fit the target, a budget of
0 — is refused before any model loads, naming the option (exit 2).
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import List, Optional, Tuple

from specc.errors import SpeccError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import positive_int, thread_count

    parser.add_argument("prompts", metavar="PROMPTS",
                        help="the workload: JSONL (prompt or messages per line) or plain text (one prompt per "
                             "line); - = stdin")
    parser.add_argument("--target", default=None, metavar="T",
                        help="target model: a conf/target option or a model path (default smollm2_135m)")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--methods", default=None, metavar="M[,M...]",
                     help="only these methods' shipped drafters (default: every shipped drafter)")
    who.add_argument("--plans", nargs="+", default=None, metavar="PLAN",
                     help="candidate plans (files or preset names) instead of the shipped presets")
    parser.add_argument("--concurrency", default="1,4,16,64", metavar="C[,C...]",
                        help="concurrencies to plan for (default 1,4,16,64)")
    parser.add_argument("--budget-min", type=float, default=10.0, metavar="M",
                        help="wall-clock minutes for the whole tune, loading included (default 10)")
    parser.add_argument("--engine", choices=("specc", "sglang", "vllm"), default="specc",
                        help="engine the plan is for: sglang / vllm keep the drafters that engine runs "
                             "(the measurements always run on specc's runtime)")
    parser.add_argument("--out", default="tuned.yaml", metavar="PLAN.yaml",
                        help="the plan to write; its settings, record, report and plot go next to it")
    parser.add_argument("--cost-table", default=None, metavar="FILE",
                        help="this device's cost table (`specc profile`); default: a shipped or cached table "
                             "for this CPU and thread count, else profiled now")
    parser.add_argument("--hardware", default=None, metavar="NAME|FILE",
                        help="the device the SGLang / vLLM settings are for: a shipped profile (cpu, h100, h200) "
                             "or a profile YAML, written as their schedule.hardware; or a cost table JSON from "
                             "`specc profile`, used as --cost-table (default: the measured table for this CPU, "
                             "else one profiled now; the output says which)")
    parser.add_argument("--schedule", choices=("batch_buckets", "adaptive"), default="batch_buckets",
                        help="the emitted schedule: one κ per batch bucket, or SGLang's controller with "
                             "the κ candidates predicted within 3%% of the best per bucket")
    parser.add_argument("--max-new-tokens", type=positive_int, default=48, metavar="N")
    parser.add_argument("--tolerance", type=float, default=0.03, metavar="R",
                        help="stop measuring a drafter when τ's 95%% interval is within ±R·τ (default 0.03)")
    parser.add_argument("--measure-batch", type=positive_int, default=8, metavar="B",
                        help="requests decoded together while measuring (default 8)")
    parser.add_argument("--max-steps", type=positive_int, default=4, metavar="K",
                        help="κ measured for chains and lookups at least (block drafters keep their block)")
    parser.add_argument("--confirm-top", type=int, default=2, metavar="N",
                        help="static configurations confirmed per concurrency besides the plan and plain (default 2)")
    parser.add_argument("--threads", type=thread_count, default=None, metavar="N",
                        help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


#: Most static configurations ``--confirm-top`` confirms per concurrency.
MAX_CONFIRM_TOP = 16


def _fail(option: str, message: str) -> SpeccError:
    return SpeccError(f"{option}: {message}")


def validate(args) -> Tuple[list, List[int], Path]:
    """Check every option before anything loads. Returns ``(prompt records, concurrencies, out path)``.
    Raises SpeccError naming the option."""
    from specc.errors import PromptError
    from specc.io import check_output_file
    from specc.runtime.prompts import read_prompts

    if not (isinstance(args.budget_min, float) and math.isfinite(args.budget_min) and args.budget_min > 0):
        raise _fail("--budget-min", f"must be a number of minutes > 0, got {args.budget_min}")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise _fail("--tolerance", f"must be >= 0 (0: never stop early), got {args.tolerance}")
    if args.confirm_top < 0:
        raise _fail("--confirm-top", f"must be >= 0, got {args.confirm_top}")
    from specc.commands.bench import concurrency_list
    from specc.plan.load import MAX_NUM_STEPS

    conc = sorted(set(concurrency_list(str(args.concurrency))))
    if args.max_steps > MAX_NUM_STEPS:
        raise _fail("--max-steps", f"{args.max_steps}: κ is at most {MAX_NUM_STEPS} in any plan (method.num_steps)")
    if args.confirm_top > MAX_CONFIRM_TOP:
        raise _fail("--confirm-top", f"{args.confirm_top}: at most {MAX_CONFIRM_TOP} configurations per concurrency "
                                     f"(each is a benchmark run within --budget-min)")
    try:
        records = read_prompts(args.prompts)
    except PromptError as exc:
        raise _fail("PROMPTS", str(exc)) from None
    if not records:
        raise _fail("PROMPTS", f"{args.prompts}: no prompts")
    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise _fail("--out", f"{out}: the plan file must end in .yaml")
    check_output_file(out, "--out")
    args.hardware_choice = None
    if getattr(args, "hardware", None) is not None:
        from specc.predict.hardware import parse_hardware

        args.hardware_choice = parse_hardware(args.hardware)
        if args.hardware_choice.cost_table and args.cost_table is not None:
            raise _fail("--hardware", f"{args.hardware} is a cost table and --cost-table {args.cost_table} is given "
                                      f"too; pass one of them")
    if args.cost_table is not None:
        from specc.predict import cost
        from specc.errors import PlanError

        try:
            cost.load_cost_table(args.cost_table)
        except PlanError as exc:
            raise _fail("--cost-table", str(exc).replace("schedule.cost_table: ", "")) from None
    return records, conc, out


def check_target_room(args, path: Optional[str], fmt: Optional[str], max_model_len: Optional[int],
                      conc: List[int]) -> None:
    """``--max-new-tokens`` against the target's ``max_model_len`` (2048 when unset, as tune loads it)
    and ``--measure-batch`` and the largest ``--concurrency`` against this machine's memory
    (:func:`specc.limits.check_runtime_rows`: weights and a KV cache of ``max_model_len`` positions per
    row), before any model loads. ``path`` / ``fmt``: the target checkpoint. Raises SpeccError
    naming the option."""
    from specc.predict.deploy_cost import checkpoint_shape
    from specc.limits import check_runtime_rows

    max_len = int(max_model_len or 2048)
    if args.max_new_tokens >= max_len:
        raise _fail("--max-new-tokens", f"{args.max_new_tokens}: the target holds at most {max_len} tokens, prompt and "
                                        f"answer together (target.max_model_len); pass at most {max_len - 1}")
    shape = checkpoint_shape(path, fmt or "hf") if path else None
    if shape is not None:
        check_runtime_rows("--measure-batch", args.measure_batch, shape, max_len)
        check_runtime_rows("--concurrency", max(conc), shape, max_len)


def run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    records, conc, out = validate(args)
    from specc.tune.candidates import DEFAULT_TARGET, discover, target_conf, target_path

    methods_list = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    if args.methods is not None and not methods_list:
        raise _fail("--methods", "give method names separated by commas, e.g. ngram,eagle3")
    target = args.target or DEFAULT_TARGET
    if not args.plans:  # the target is --target's: checked before the candidates load
        conf = target_conf(target)[1]
        check_target_room(args, conf.get("path"), conf.get("format"), conf.get("max_model_len"), conc)
    cands, left_out = discover(target, methods_list, args.plans, args.engine, args.max_steps)
    if cands and args.plans:
        t = cands[0].plan.target
        check_target_room(args, t.path, t.format, t.max_model_len, conc)
    tname, tpath = target_path(target)
    budget = 60.0 * args.budget_min
    from specc.tune.session import Session

    session = Session(args, records, conc, out, cands, left_out, tname, tpath, t_start, budget)
    return session.run()
