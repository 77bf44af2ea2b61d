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
import re
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
    add_deploy_arguments(parser)


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    """The deployment the SGLang / vLLM launch commands are written for (:func:`deployment`)."""
    from specc.tune.emit import DEPLOY_ENGINES

    group = parser.add_argument_group(
        "deployment", "the SGLang / vLLM settings and launch commands tune writes are for this deployment "
                      "(default: the model tune measured on)")
    group.add_argument("--deploy-engine", choices=tuple(DEPLOY_ENGINES), default="both",
                       help="the engines whose settings and launch commands are written (default both)")
    group.add_argument("--deploy-target", default=None, metavar="MODEL",
                       help="the model the engine serves: a local checkpoint, a Hugging Face id (ORG/NAME; the "
                            "engine downloads it) or a conf/target option")
    group.add_argument("--deploy-draft", default=None, metavar="DRAFTER",
                       help="the deployment's drafter checkpoint (path or Hugging Face id), trained for "
                            "--deploy-target; needed for a method that drafts with a checkpoint, refused for lookups")
    group.add_argument("--context-length", type=int, default=None, metavar="N",
                       help="tokens per sequence, prompt and answer, the engine serves (target.max_model_len)")
    group.add_argument("--tp", type=int, default=None, metavar="N",
                       help="tensor-parallel GPUs of the target (deploy.parallel.tp)")
    group.add_argument("--draft-tp", type=int, default=None, metavar="N",
                       help="tensor-parallel GPUs of the draft: 1 or --tp (vLLM); SGLang runs it at --tp")


#: Most static configurations ``--confirm-top`` confirms per concurrency.
MAX_CONFIRM_TOP = 16
#: A Hugging Face model id: ORG/NAME (huggingface_hub's ``validate_repo_id``: letters, digits, ``-_.``).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def _model_ref(option: str, value: Optional[str]) -> Optional[str]:
    """``--deploy-target`` / ``--deploy-draft`` as the plan's ``target.path`` / ``draft.path``: an existing
    local checkpoint (made absolute; read as the checkpoint rules read it,
    :func:`specc.models.checkpoints.read_checkpoint`: a folder without ``config.json`` is refused), a
    ``conf/target`` option (its ``path``), or a Hugging Face id (ORG/NAME, left for the engine to
    download). None when not given. Raises SpeccError naming the option for anything else."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        raise _fail(option, "empty: give a checkpoint path or a Hugging Face id (ORG/NAME)")
    path = Path(text).expanduser()
    if path.exists():
        from specc.models.checkpoints import read_checkpoint

        full = str(path.resolve())
        key = "target.path" if option == "--deploy-target" else "draft.path"
        found = read_checkpoint(key, full, "gguf" if full.lower().endswith(".gguf") else "hf")
        if found is not None and found.problems:
            raise _fail(option, f"{value}: not a checkpoint the engine can load: {'; '.join(found.problems)}")
        return full
    if option == "--deploy-target" and "/" not in text:
        from specc.plan.load import conf_dir

        preset = Path(conf_dir()) / "target" / f"{text}.yaml"
        if preset.is_file():
            import yaml

            found = (yaml.safe_load(preset.read_text()) or {}).get("path")
            if isinstance(found, str) and found:
                return found
    if HUB_ID.match(text) and ".." not in text:
        return text
    raise _fail(option, f"{value}: no such file or folder here, and not a Hugging Face id (ORG/NAME, e.g. "
                        f"meta-llama/Llama-3.1-8B-Instruct); give the checkpoint's path or its hub id")


def deployment(args):
    """The deployment of ``--deploy-*``, ``--context-length``, ``--tp`` and ``--draft-tp``
    (:class:`specc.tune.emit.Deployment`), checked with the other options, before any model loads; what
    depends on the candidates is checked by :func:`check_deployment`. Raises SpeccError naming the option:

    * ``--context-length`` / ``--tp`` / ``--draft-tp`` outside 1..the plan schema's bound
      (``specc.plan.load.MAX_MODEL_LEN``, ``MAX_PARALLEL``); a context that cannot hold
      ``--max-new-tokens``. The engines take any TP size (not only powers of two); whether it divides the
      model's attention heads is a checkpoint rule, which ``specc check`` runs on the written command;
    * ``--draft-tp`` other than 1 or ``--tp`` (vLLM refuses it, ``vllm/config/speculative.py:1851-1870``),
      or other than ``--tp`` with ``--deploy-engine sglang`` (SGLang builds the draft worker in the
      target's TP group and has no flag for another size, ``speculative/eagle_worker_v2.py:217-230;
      arg_groups/fields/spec.py:31-283``);
    * ``--deploy-target`` / ``--deploy-draft`` neither an existing path, a ``conf/target`` option (target
      only) nor a Hugging Face id; ``--deploy-draft`` without ``--deploy-target`` (a drafter is trained
      for one target).
    """
    from specc.plan.load import MAX_MODEL_LEN, MAX_PARALLEL
    from specc.tune.emit import DEPLOY_ENGINES, Deployment

    for option, value, top in (("--context-length", args.context_length, MAX_MODEL_LEN),
                               ("--tp", args.tp, MAX_PARALLEL), ("--draft-tp", args.draft_tp, MAX_PARALLEL)):
        if value is not None and not 1 <= value <= top:
            raise _fail(option, f"{value}: must be a whole number from 1 to {top}")
    if args.context_length is not None and args.context_length <= args.max_new_tokens:
        raise _fail("--context-length", f"{args.context_length}: the deployment's context holds the prompt and the "
                                        f"answer, and tune plans for answers of --max-new-tokens {args.max_new_tokens}: "
                                        f"pass more than {args.max_new_tokens}")
    if args.draft_tp is not None:
        tp = args.tp or 1
        if args.draft_tp not in (1, tp):
            raise _fail("--draft-tp", f"{args.draft_tp}: vLLM runs the draft at tensor parallel 1 or the target's "
                                      f"(--tp {tp}) and refuses other sizes (vllm/config/speculative.py:1851-1870)")
        if DEPLOY_ENGINES[args.deploy_engine] == ("sglang",) and args.draft_tp != tp:
            raise _fail("--draft-tp", f"{args.draft_tp}: SGLang runs the draft in the target's tensor-parallel group "
                                      f"(--tp {tp}) and has no flag for another size (sglang "
                                      f"speculative/eagle_worker_v2.py:217-230); leave --draft-tp out")
    target = _model_ref("--deploy-target", args.deploy_target)
    draft = _model_ref("--deploy-draft", args.deploy_draft)
    if draft is not None and target is None:
        raise _fail("--deploy-draft", f"{args.deploy_draft}: a drafter is trained for one target; pass --deploy-target "
                                      f"MODEL (the model it drafts for) with it")
    return Deployment(engines=DEPLOY_ENGINES[args.deploy_engine], target=target, draft=draft,
                      context_length=args.context_length, tp=args.tp, draft_tp=args.draft_tp)


def check_deployment(dep, candidates, measured: str, measured_path: Optional[str] = None):
    """The deployment ``dep`` (:func:`deployment`) against the ``candidates`` tune will measure (on
    ``measured``, the ``--target`` name, at ``measured_path``), before any model loads; the drafter facts
    are the method rows' (:attr:`specc.methods.facts.Method.needs_draft_checkpoint`,
    ``target_ships_draft``, ``lookup``). Returns ``dep``, with ``target`` None when ``--deploy-target``
    is the measuring model itself (its drafters fit it). Raises SpeccError naming the option:

    * ``--deploy-draft`` with candidates that all draft by lookup (no checkpoint to take), or with
      candidates of more than one method that drafts with a checkpoint (one checkpoint is one method's
      drafter: narrow ``--methods``);
    * ``--deploy-target`` without ``--deploy-draft`` when a candidate's method needs a drafter checkpoint
      (the drafters tune measures were trained for the measuring target, not this one);
    * ``--draft-tp`` with candidates that all draft by lookup (no draft model runs).
    """
    import dataclasses

    from specc import methods

    if dep.target is not None and measured_path and dep.target in (measured_path, _resolved(measured_path)):
        dep = dataclasses.replace(dep, target=None)
    rows = {c.method: methods.get(c.method) for c in candidates}
    needs = sorted(m for m, r in rows.items() if r.needs_draft_checkpoint)
    takes = sorted(m for m, r in rows.items() if r.needs_draft_checkpoint or r.target_ships_draft)
    named = ", ".join(sorted(rows))
    if dep.draft is not None and not takes:
        raise _fail("--deploy-draft", f"{dep.draft}: the candidates' methods ({named}) draft by lookup and take "
                                      f"no drafter checkpoint; leave --deploy-draft out")
    if dep.draft is not None and len(takes) > 1:
        raise _fail("--deploy-draft", f"{dep.draft}: one drafter checkpoint is the drafter of one method, and the "
                                      f"candidates draft with checkpoints of methods {', '.join(takes)}; pass --methods "
                                      f"with the one it is for (lookups may join it, e.g. --methods {takes[0]},ngram)")
    if dep.target is not None and dep.draft is None and needs:
        raise _fail("--deploy-target", f"{dep.target}: the candidates of methods {', '.join(needs)} draft with a "
                                       f"checkpoint, and the drafters tune measures were trained for {measured}, not for "
                                       f"{dep.target}: pass --deploy-draft DRAFTER (that method's drafter for "
                                       f"{dep.target}, with --methods naming the method), or --methods "
                                       f"ngram,suffix (lookups need no drafter)")
    if dep.draft_tp is not None and all(r.lookup for r in rows.values()):
        raise _fail("--draft-tp", f"{dep.draft_tp}: the candidates' methods ({named}) draft by lookup and run no "
                                  f"draft model; leave --draft-tp out")
    return dep


def _resolved(path: str) -> str:
    """``path`` made absolute (a ``pkg://`` path as it is)."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


def run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    records, conc, out = validate(args)
    dep = deployment(args)
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
    args.deployment = check_deployment(dep, cands, tname, tpath)
    budget = 60.0 * args.budget_min
    from specc.tune.session import Session

    session = Session(args, records, conc, out, cands, left_out, tname, tpath, t_start, budget)
    return session.run()
