"""``specc export PLAN [OVERRIDES] --engine sglang|vllm``: the plan as engine launch settings.

Checks the plan against the chosen engine's profile first and refuses on errors (exit 1), so what
it prints is a launch the engine accepts; warnings and fallbacks are printed to stderr. The
checkpoint rules (``checkpoint.*``: a local path that is not a loadable checkpoint on *this* machine)
are printed as warnings: the command runs where the engine's checkpoints are. ``pkg://``
model paths are resolved to filesystem paths (engines cannot open them); one that cannot be resolved
is kept and named in a warning on stderr. Does not import torch.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict

from specc.plan.load import load_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``specc export``'s arguments on ``parser``."""
    parser.add_argument("plan", help="plan file or preset name")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides: group=option or dotted.key=value")
    parser.add_argument("--engine", default=None, metavar="ENGINE",
                        help="engine to launch: sglang, vllm or another engine with an exporter "
                             "(specc.engines; default: the plan's `engine` key)")
    parser.add_argument("--format", choices=("shell", "json"), default="shell", dest="fmt")


def run(args: argparse.Namespace) -> int:
    """Print the launch command (or JSON settings). Exit 0, 1 on rule errors, 2 on unusable input."""
    from specc.export import export, resolve_pkg_paths
    from specc.check import check

    from specc import engines

    targets = engines.exporters()
    if args.engine is not None and args.engine not in targets:
        print(f"specc export: error: --engine {args.engine!r}: plans export to {', '.join(targets)} "
              "(specc plans are compiled: `specc compile`)", file=sys.stderr)
        return 2
    loaded = load_plan(args.plan, list(args.overrides))
    engine = args.engine or loaded.plan.engine
    if engine not in targets:
        print(f"specc export: error: plan {loaded.plan.name!r} targets engine {engine!r}; "
              "specc plans are compiled (`specc compile`), pass " + " or ".join(f"--engine {t}" for t in targets),
              file=sys.stderr)
        return 2
    violations = check(loaded.plan, engine)
    for v in violations:
        # the launch runs on the engine's machine: a checkpoint unreadable here is a warning, not a refusal
        sev = "warning" if v.rule.startswith("checkpoint.") and v.severity == "error" else v.severity
        print(f"{sev}: {v.rule}: {v.message}", file=sys.stderr)
    if any(v.severity == "error" and not v.rule.startswith("checkpoint.") for v in violations):
        print(f"specc export: the plan has errors for {engine}; see `specc check {shlex.quote(args.plan)} "
              f"--engine {shlex.quote(engine)}`", file=sys.stderr)
        return 1
    plan, path_warnings = resolve_pkg_paths(loaded.plan)
    for w in path_warnings:
        print(f"warning: {w}", file=sys.stderr)
    launch = export(plan, engine)
    if args.fmt == "json":
        print(json.dumps(asdict(launch), indent=2, sort_keys=True))
    else:
        print(launch.command())
        extra = getattr(launch, "adaptive_config", None)
        if extra:
            print(f"# write to {launch.adaptive_config_path}:")
            print(json.dumps(extra, indent=2))
    return 0
