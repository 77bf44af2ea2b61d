"""The ``specc`` command: one subcommand per pipeline stage.

Each subcommand lives in its own module ``specc.commands.<name>`` exposing ``add_arguments(parser)``
and ``run(args) -> int``; this file only dispatches, and imports a subcommand's module (and so
torch, for the model-running ones) only when that subcommand is used. Exit codes: 0 success,
1 the command ran and found errors (for ``check``: plan errors), 2 unusable input.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from specc.errors import SpeccError

SUBCOMMANDS = {
    "check": "validate plans against an engine profile's rules",
    "explain": "candidate states, their cost-model predictions and stage graphs",
    "compile": "compile a plan into an artifact of per-state programs",
    "run": "run a compiled artifact on prompts",
    "generate": "plain decoding with the target model alone (no speculation)",
    "bench": "benchmark a compiled artifact against plain decoding",
    "export": "lower a plan to SGLang or vLLM launch settings",
    "profile": "measure a cost table (step time by verify token count) on this machine",
    "tune": "which plan is fastest for these prompts here: measure, predict, confirm, emit",
    "import": "read an SGLang or vLLM launch command back into a plan",
    "serve": "serve a plan or compiled artifact over an OpenAI-compatible HTTP API",
    "train": "build training data from installable corpora and train a drafter for a target",
}
#: subcommands whose module name differs from the command (``import`` is a Python keyword)
MODULES = {"import": "import_"}


def _module(name: str) -> str:
    return f"specc.commands.{MODULES.get(name, name)}"


class UsageError(Exception):
    """Bad input the user can fix; printed as ``specc: error: ...`` with exit code 2."""


def _available() -> List[str]:
    names = []
    for name in SUBCOMMANDS:
        try:
            spec = importlib.util.find_spec(_module(name))
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            names.append(name)
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specc", description="Plan, check, compile and run speculative decoding.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    argv = sys.argv[1:]
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name in _available():
        p = sub.add_parser(name, help=SUBCOMMANDS[name], description=SUBCOMMANDS[name])
        if name == wanted:
            importlib.import_module(_module(name)).add_arguments(p)
            p.set_defaults(_subparser=p)
        else:
            p.set_defaults(_lazy=name)
    return parser


def _take_trailing_positionals(parser: argparse.ArgumentParser, args: argparse.Namespace,
                               extra: List[str]) -> None:
    """Let plan arguments and Hydra overrides follow options (``specc check PLAN --engine all
    method.num_steps=5``): argparse stops filling a ``nargs="*"`` positional at the first option, so
    leftover non-option words are appended to the subcommand's ``overrides`` (or ``inputs``) list,
    and a leftover ``-- COMMAND ...`` to ``launch`` (``specc import``). Anything else left over is an error, reported by the subcommand's own parser."""
    if not extra:
        return
    if extra[0] == "--" and isinstance(getattr(args, "launch", None), list):
        # `specc import vllm -o p.yaml -- vllm serve ...`: the launch command follows an option, so
        # argparse closed the `launch` positional (empty) before reaching `--`
        args.launch.extend(extra[1:])
        return
    target = next((name for name in ("overrides", "inputs") if isinstance(getattr(args, name, None), list)), None)
    if target is None or any(word.startswith("-") for word in extra):
        sub = getattr(args, "_subparser", None) or parser
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    getattr(args, target).extend(extra)


def main(argv: Optional[List[str]] = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(sys.argv[1:])
    _take_trailing_positionals(parser, args, extra)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(_module(args.command))
    try:
        return int(module.run(args) or 0)
    except (UsageError, SpeccError) as exc:
        print(f"specc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
