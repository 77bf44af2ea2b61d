"""``specc compile PLAN [overrides] [--out DIR] [--target PATH]``: check a plan against the ``specc`` profile, lower
it, and write its artifact ``DIR/<plan>-<hash>/`` (see ``specc.compiler.codegen``).

Exit codes: 0 compiled (or already up to date), 1 the plan has rule errors (all printed),
2 unusable input (a plan that does not load, an unwritable DIR: printed by ``specc.cli``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``specc compile``."""
    parser.add_argument("plan", metavar="PLAN", help="plan YAML file or preset name (conf/plan/<name>.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra-style overrides: group=option or dotted.key=value")
    parser.add_argument("--out", metavar="DIR", default="generated",
                        help="directory the artifact <plan>-<hash>/ is written into (default: generated/)")
    parser.add_argument("--emit-graph", action="store_true",
                        help="also write graph.json: every state's stage graph (tensors and shapes between "
                             "stages); nothing at run time reads it")
    parser.add_argument("--print-path", action="store_true",
                        help="print only the artifact's path on stdout (for scripts)")
    parser.add_argument("--target", default=None, metavar="PATH",
                        help="compile the plan for this model instead of its target: a Hugging Face model "
                             "directory (config.json, *.safetensors, tokenizer files) or a .gguf file "
                             "(nothing is downloaded)")


def run(args: argparse.Namespace) -> int:
    """Compile ``args.plan``. Returns the exit code; raises ``SpeccError`` for unusable input."""
    from specc.compiler import build
    from specc.compiler import codegen
    from specc.models.target import check_drafter_fits, check_local_target, read_target_arg, target_overrides
    from specc.plan.load import load_plan

    overrides = list(args.overrides)
    if getattr(args, "target", None) is not None:  # checked before the plan loads; the user's overrides win
        overrides = target_overrides(read_target_arg(args.target)) + overrides
    loaded = load_plan(args.plan, overrides)
    plan = loaded.plan
    check_local_target(plan.target.path)
    check_drafter_fits(plan, "--target" if getattr(args, "target", None) is not None else "target.path")
    codegen.check_identifier(plan.name, "plan name (the plan's `name` key)")
    resolved, violations = codegen.resolve_plan(plan)
    errors = [v for v in violations if codegen._severity(v) == "error"]
    if errors:
        print(f"specc compile: plan {plan.name!r} ({loaded.path}) has {len(errors)} error(s) for "
              f"engine 'specc'; nothing was written:", file=sys.stderr)
        for v in errors:
            print(f"  {codegen.format_violation(v, loaded.where)}", file=sys.stderr)
        return 1
    for v in violations:  # warnings, fallbacks and filled defaults: compiled as resolved, but said
        print(f"  {codegen.format_violation(v, loaded.where)}", file=sys.stderr)
    if plan.engine != "specc":
        print(f"  note: plan {plan.name!r} targets engine {plan.engine!r}; compiling it for the specc "
              f"runtime (use `specc export` for {plan.engine})", file=sys.stderr)
    result = build.compile_resolved(resolved, Path(args.out), emit_graph=args.emit_graph)
    if args.print_path:
        print(result.path)
        return 0
    verb = {"created": "wrote", "unchanged": "up to date (identical content already there):",
            "replaced": "replaced (content differed)"}[result.status]
    print(f"{verb} {result.path} ({len(result.files)} files)")
    for name in _states(result.path):
        print(f"  state {name}")
    return 0


def cache_dir() -> Path:
    """Where ``specc run PLAN`` compiles plans (:func:`specc.compiler.build.artifact_cache_dir`)."""
    from specc.compiler.build import artifact_cache_dir

    return artifact_cache_dir()


def is_artifact(source: str) -> bool:
    """True when ``source`` is a compiled artifact directory (it holds ``manifest.json``)."""
    p = Path(str(source))
    return p.is_dir() and (p / "manifest.json").is_file()


def artifact_for(source: str, overrides=(), say=None, target=None) -> Path:
    """The artifact to run for ``source``: itself when it is an artifact directory, else the plan it
    names (a file or a preset, with ``overrides``) compiled on the fly into :func:`cache_dir`
    (``specc.compiler.build.compile_plan``: checked against the ``specc`` profile, written atomically; an
    identical artifact already there is reused). ``say`` gets one line about what happened.
    ``target``: ``--target PATH`` (:mod:`specc.models.target`), replacing the plan's target before
    ``overrides``; checked, with the drafter's fit to it, before anything compiles.

    Raises:
        SpeccError: overrides or ``--target`` given with an artifact directory, a bad ``--target``, a
            drafter trained for another target, a ``target.path`` that is a hub id; PlanError: a plan
            that does not load or that the ``specc`` profile refuses (every error listed).
    """
    from specc.compiler import build
    from specc.compiler import codegen
    from specc.errors import SpeccError
    from specc.models.target import check_drafter_fits, check_local_target, read_target_arg, target_overrides
    from specc.plan.load import load_plan

    if is_artifact(source):
        if target is not None:
            raise SpeccError(f"--target applies to plans; {source} is a compiled artifact with its target built in: "
                             f"pass the plan (file or preset name) instead")
        if overrides:
            raise SpeccError(f"{source} is a compiled artifact; overrides ({' '.join(overrides)}) apply to plans: "
                             f"pass the plan (file or preset name) instead")
        return Path(source)
    if target is not None:
        overrides = target_overrides(read_target_arg(target)) + list(overrides)
    loaded = load_plan(str(source), list(overrides))
    plan = loaded.plan
    check_local_target(plan.target.path)
    check_drafter_fits(plan, "--target" if target is not None else "target.path")
    codegen.check_identifier(plan.name, "plan name (the plan's `name` key)")
    out = cache_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpeccError(f"cannot create the artifact cache {out} ({exc.strerror or exc}); set SPECC_CACHE_DIR "
                         f"to a writable folder") from None
    result = build.compile_plan(plan, out)
    if say is not None:
        verb = "reused" if result.status == "unchanged" else "compiled"
        say(f"{verb} {loaded.path.name if hasattr(loaded.path, 'name') else source} -> {result.path}")
    return result.path


def _states(path: Path) -> list:
    import json

    try:
        return [s["name"] for s in json.loads((path / "manifest.json").read_text())["states"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
