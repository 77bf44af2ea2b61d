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
}


class UsageError(Exception):
    """Bad input the user can fix; printed as ``specc: error: ...`` with exit code 2."""


def _available() -> List[str]:
    names = []
    for name in SUBCOMMANDS:
        try:
            spec = importlib.util.find_spec(f"specc.commands.{name}")
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
            importlib.import_module(f"specc.commands.{name}").add_arguments(p)
        else:
            p.set_defaults(_lazy=name)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:])
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(f"specc.commands.{args.command}")
    try:
        return int(module.run(args) or 0)
    except (UsageError, SpeccError) as exc:
        print(f"specc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
