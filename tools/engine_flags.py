#!/usr/bin/env python
"""Write an engine version's launch-flag table (``specc/engines/<engine>/flags/<version>.json``)
from the engine's own argument parser.

    python tools/engine_flags.py sglang 0.5.23 --source /path/to/unpacked/sglang/wheel
    python tools/engine_flags.py vllm 0.33.0 --source /path/to/unpacked/vllm/wheel

The engine is not a dependency of specc: unpack its wheel (``pip download --no-deps sglang==0.5.23``
then ``unzip``) into a scratch environment that has the packages its argument module imports, and
run this script with that environment's Python. It builds the parser exactly as the engine's launcher
does (SGLang: ``argparse.ArgumentParser`` + ``ServerArgs.add_cli_args``, ``sglang/srt/server_args.py``;
vLLM: ``FlexibleArgumentParser`` + ``make_arg_parser``, ``vllm/entrypoints/common/cli_args.py``) and
records, for every action, its option strings, ``dest``, arity (``nargs``), kind (value, switch,
``--x/--no-x`` pair, count, help), choices and whether the engine requires it (SGLang's
``--model-path``: a field without a default is ``required``, ``arg_groups/arg_utils.py:411-416``). Help texts are not copied. specc never imports an
engine at run time; ``specc import`` and ``specc check --sglang-args/--vllm-args`` rebuild an
argparse parser from this table (``specc/importer/parse.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "specc" / "engines"


def _kind(action) -> str:
    name = type(action).__name__
    if isinstance(action, argparse.BooleanOptionalAction) or "BooleanOptional" in name or "EnableDisable" in name:
        return "bool_pair"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
        return "switch"
    if isinstance(action, argparse._CountAction):
        return "count"
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return "help"
    if isinstance(action, argparse._AppendAction):
        return "append"
    if action.nargs == 0:
        return "switch"
    return "value"


def _jsonable(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


def table(parser: argparse.ArgumentParser) -> dict:
    rows = []
    for a in parser._actions:
        kind = _kind(a)
        row = {"options": list(a.option_strings), "dest": a.dest, "kind": kind}
        if kind in ("value", "append"):
            nargs = a.nargs
            row["nargs"] = nargs if nargs is None or isinstance(nargs, (int, str)) else str(nargs)
        if kind == "switch":
            row["const"] = _jsonable(getattr(a, "const", None))
        if a.choices is not None and not isinstance(a.choices, dict):
            row["choices"] = [str(c) for c in a.choices]
        row["default"] = _jsonable(a.default) if a.default is not argparse.SUPPRESS else None
        if not a.option_strings:
            row["positional"] = True
        elif a.required:
            row["required"] = True
        rows.append(row)
    return {"prog": parser.prog, "allow_abbrev": parser.allow_abbrev, "actions": rows}


def vllm_speculative_config() -> dict:
    """The keys ``--speculative-config`` accepts (``SpeculativeConfig`` fields; extra keys are
    refused, ``vllm/config/utils.py``) and the ``method`` literals (``SpeculativeMethod``)."""
    import dataclasses
    import typing

    from vllm.config import speculative as sp

    fields = [f.name for f in dataclasses.fields(sp.SpeculativeConfig) if f.init]
    methods = sorted(typing.get_args(sp.SpeculativeMethod))
    return {"speculative_config_fields": fields, "speculative_methods": methods}


def vllm_serving_names() -> dict:
    """The names ``--reasoning-parser`` and ``--structured-outputs-config.backend`` accept, which
    argparse does not list: the reasoning-parser registry (``ReasoningParserManager.list_registered``,
    checked by ``vllm/entrypoints/common/cli_args.py:625-632``) and the ``StructuredOutputsBackend``
    literal (``vllm/config/structured_outputs.py:14-16``)."""
    import typing

    from vllm.config import structured_outputs as so
    from vllm.reasoning import ReasoningParserManager

    return {"reasoning_parsers": list(ReasoningParserManager.list_registered()),
            "structured_outputs_backends": list(typing.get_args(so.StructuredOutputsBackend))}


def build(engine: str):
    if engine == "sglang":
        from sglang.srt.server_args import ServerArgs

        p = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(p)
        return p
    if engine == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        p = FlexibleArgumentParser(prog="vllm serve")
        return make_arg_parser(p)
    raise SystemExit(f"unknown engine {engine!r} (sglang or vllm)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=("sglang", "vllm"))
    ap.add_argument("version")
    ap.add_argument("--source", required=True, help="directory holding the unpacked engine package")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.source).resolve()))
    data = table(build(args.engine))
    if args.engine == "vllm":
        data.update(vllm_speculative_config())
        data.update(vllm_serving_names())
    data = {"engine": args.engine, "version": args.version,
            "generated_by": "tools/engine_flags.py from the engine's own parser", **data}
    (OUT / args.engine / "flags").mkdir(parents=True, exist_ok=True)
    out = OUT / args.engine / "flags" / f"{args.version}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {out} ({len(data['actions'])} actions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
