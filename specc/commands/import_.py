"""``specc import``: an SGLang or vLLM launch command -> plan YAML.

    specc import sglang -- python -m sglang.launch_server --model-path X --speculative-algorithm EAGLE3 ...
    specc import vllm -- vllm serve X --speculative-config '{"method": "eagle3", ...}'
    specc import vllm --speculative-config '{"method": "ngram", "num_speculative_tokens": 5}' --model X
    specc import sglang==0.5.23 --file launch.sh -o my_plan.yaml

The command is read as the engine version's own parser reads it (bare engine name: the newest
table; a pinned version must be one ``specc check --engine`` knows). specc's own options (``--file``
/ ``-f``, ``-o`` / ``--output``, ``--name``) are specc's wherever they appear, after ``--`` too, never an
engine flag. Flags with no plan key are listed as comments at the top of the YAML, with anything the
engine's parser would refuse. Exit codes: 0 plan written, 1 plan written but the engine would refuse
the command (the refusals head the plan, and go to stderr unless the plan is on the terminal already:
each is shown once), 2 unusable input. Does not import torch.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from specc.console import plural

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``specc import``'s arguments on ``parser``."""
    parser.add_argument("engine", help="sglang or vllm (or an engine plugin that reads launch commands), optionally "
                                       "pinned (sglang==0.5.23); bare = newest")
    parser.add_argument("--file", "-f", dest="file", default=None,
                        help="a file holding the command (shell script, Kubernetes/compose YAML, or a vLLM "
                             "speculative-config JSON)")
    parser.add_argument("--speculative-config", dest="spec_json", default=None, metavar="JSON",
                        help="vLLM only: a --speculative-config JSON object (with --model for the target)")
    parser.add_argument("--model", default=None, help="with --speculative-config: the target model")
    parser.add_argument("-o", "--output", default=None, help="write the plan here (default: stdout)")
    parser.add_argument("--name", default=None,
                        help="the plan's name (default: the output file's stem, else 'imported')")
    parser.add_argument("launch", nargs="*", metavar="COMMAND",
                        help="after `--`: the launch command (or just its flags)")


#: specc import's own options that may appear among the command's words: option -> (attribute, takes a value)
OWN_OPTIONS = {"--file": ("file", True), "-f": ("file", True), "-o": ("output", True), "--output": ("output", True),
               "--name": ("name", True)}


def _engine(text: str):
    """(engine, version or None) of ``sglang`` / ``vllm==0.33.0`` (or a plugin engine that reads launch
    commands, :func:`specc.engines.importers`). Raises ValueError for an engine or a version specc has
    no tables for, naming the known ones (as ``specc check --engine``)."""
    from specc.importer import importable, known_versions

    name, _, version = text.partition("==")
    if name not in importable():
        raise ValueError(f"engine {text!r}: specc imports {' or '.join(importable())} launch commands")
    if version and text not in known_versions(name):
        raise ValueError(f"unknown engine {text!r}; known: {', '.join(known_versions(name))}")
    return name, version or None


def _on_screen(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def run(args: argparse.Namespace) -> int:
    """Import one command; print or write the plan; return the exit code."""
    from specc.importer import CommandError, import_command, imported_plan, plan_yaml
    from specc.errors import SpeccError
    from specc.io import check_output_file, load_json
    from specc.plan.schema import MAX_NAME_LEN

    try:
        engine, version = _engine(args.engine)
    except ValueError as exc:
        print(f"specc import: error: {exc}", file=sys.stderr)
        return 2
    from specc.commands.check import split_own_options

    words = list(args.launch or [])
    if words and words[0] == "--":
        words = words[1:]
    words, found, problems = split_own_options(words, OWN_OPTIONS)
    if problems:
        print(f"specc import: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    for attr, value in found.items():
        if getattr(args, attr) is not None and getattr(args, attr) != value:
            print(f"specc import: error: {attr} given twice ({getattr(args, attr)!r} and {value!r})", file=sys.stderr)
            return 2
        setattr(args, attr, value)
    sources = [bool(words), args.file is not None, args.spec_json is not None]
    if sum(sources) != 1:
        given = [n for n, g in zip(("a command after `--`", "--file", "--speculative-config"), sources) if g]
        print("specc import: error: give the command after `--`, or --file PATH, or (vLLM) --speculative-config "
              f"JSON{' (one of them, not ' + ' and '.join(given) + ')' if len(given) > 1 else ''}", file=sys.stderr)
        return 2
    if args.output:
        try:
            check_output_file(args.output, "-o", parents=True)
        except SpeccError as exc:
            print(f"specc import: error: {exc}", file=sys.stderr)
            return 2
    if args.name is not None and len(args.name) > MAX_NAME_LEN:
        print(f"specc import: error: --name: {len(args.name):,} characters, over the {MAX_NAME_LEN} a plan name may "
              f"have", file=sys.stderr)
        return 2
    base_dir = None
    text = None
    source = "the command line"
    if args.file is not None:
        from specc.errors import SpeccError
        from specc.io import LAUNCH_FILE_LIMIT, read_bounded

        try:  # a regular file of bounded size: a FIFO or /dev/zero never hangs or fills memory
            text = str(read_bounded(args.file, LAUNCH_FILE_LIMIT, "launch file"))
        except SpeccError as exc:
            print(f"specc import: error: --file {args.file}: {exc}", file=sys.stderr)
            return 2
        base_dir, source = Path(args.file).resolve().parent, args.file
    elif args.spec_json is not None:
        from specc.importer.command import bare_config_flag

        if bare_config_flag(engine) != "--speculative-config":
            print(f"specc import: error: --speculative-config is vLLM's; for {engine} pass the command after `--`",
                  file=sys.stderr)
            return 2
        try:
            load_json(args.spec_json, "--speculative-config")
        except ValueError as exc:
            print(f"specc import: error: --speculative-config is not JSON ({exc})", file=sys.stderr)
            return 2
        words = ([args.model] if args.model else []) + ["--speculative-config", args.spec_json]
        source = "--speculative-config"
    elif len(words) == 1 and " " in words[0]:
        text, words = words[0], []
    name = args.name or (Path(args.output).stem if args.output else "imported")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        name = re.sub(r"\W", "_", name)
        name = name if re.match(r"[A-Za-z_]", name) else f"p_{name}"
    try:
        imp = import_command(engine, text=text, argv=None if text is not None else words, version=version,
                             base_dir=base_dir or Path.cwd(), config_only=args.spec_json is not None)
    except CommandError as exc:
        print(f"specc import: error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"specc import: error: {str(exc).strip(chr(39))}", file=sys.stderr)
        return 2
    try:
        imported_plan(imp, name)
    except SpeccError as exc:
        print(f"specc import: error: the command's settings do not form a plan:\n  {exc}", file=sys.stderr)
        return 2
    out = plan_yaml(imp, name=name, source=source)
    if args.output:
        _write_atomic(Path(args.output), out)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(out)
    if imp.unmapped:
        print(f"{plural(len(imp.unmapped), 'flag')} {'has' if len(imp.unmapped) == 1 else 'have'} no plan key "
              f"(listed at the top of the plan)", file=sys.stderr)
    if args.output or not _on_screen(sys.stdout):  # the plan is not on screen: show its notes and refusals
        for n in imp.notes:
            print(f"note: {n}", file=sys.stderr)
        for e in imp.errors:
            print(f"error: {e}", file=sys.stderr)
    elif imp.errors or imp.notes:  # they head the plan on the screen already: say so, once
        parts = [f"{plural(len(imp.errors), 'error')}: {imp.engine}=={imp.version} would refuse this command"] \
            if imp.errors else []
        parts += [plural(len(imp.notes), "note")] if imp.notes else []
        print(f"{'; '.join(parts)} (listed at the top of the plan)", file=sys.stderr)
    return 1 if imp.errors else 0
