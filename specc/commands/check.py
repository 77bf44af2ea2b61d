"""``specc check``: validate plans against engine profiles, all violations of all plans at once.

    specc check conf/plan/ --engine all
    specc check my_plan.yaml method=eagle3 method.num_steps=5 --engine sglang --show-resolved
    specc check 'plans/*.yaml' --format github
    specc check --engine sglang==0.5.23 conf/plan/
    specc check --sglang-args python -m sglang.launch_server --model-path X --speculative-algorithm EAGLE3 ...
    specc check --vllm-args launch.sh
    specc check --sglang-args --file launch.sh --format json

Arguments are plan files, directories (their ``*.yaml``), globs or preset names, mixed with
Hydra-style overrides (``group=option``, ``key=value``) applied to every plan. Without ``--engine``
each plan is checked against the profile its ``engine`` key names. A launch command is read as the
engine's parser reads it; specc's own options (``--file``, ``--format``, ``--engine``,
``--show-resolved``, ``--sglang-args``, ``--vllm-args``) are specc's wherever they appear on the line,
never an engine flag (none of them is one, and argparse would otherwise take ``--file`` as a prefix
of SGLang's ``--file-storage-path``). Exit codes: 0 no errors (warnings allowed), 1 at least one
error, 2 unusable input (a plan that does not load, a bad argument). Does not import torch.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Tuple

from specc.check.results import Result, check_command, check_inputs, exit_code
from specc.console import plural
from specc.engines import LAUNCH_CHECKED
from specc.errors import SpeccError

FORMATS = ("text", "json", "github", "sarif")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``specc check``'s arguments on ``parser``."""
    parser.add_argument("inputs", nargs="*", metavar="PLAN|OVERRIDE",
                        help="plan files, directories, globs or preset names; group=option / key=value "
                             "overrides apply to every plan")
    parser.add_argument("--engine", default=None, metavar="ENGINE",
                        help="specc, sglang, vllm (newest release), a pinned release (sglang==0.5.23, "
                             "vllm==0.33.0) or all (default: each plan's own `engine` key)")
    parser.add_argument("--sglang-args", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                        help="check an SGLang launch command instead of a plan: the rest of the line (or one "
                             "quoted string, or a file holding the command)")
    parser.add_argument("--vllm-args", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                        help="check a vLLM serve command instead of a plan (as --sglang-args)")
    parser.add_argument("--file", default=None, metavar="PATH",
                        help="with --sglang-args / --vllm-args: a file holding the command (shell script, "
                             "Kubernetes/compose YAML, or a vLLM speculative-config JSON)")
    parser.add_argument("--format", choices=FORMATS, default="text", dest="fmt",
                        help="text (default), json (one object per plan and engine), github (workflow "
                             "annotations) or sarif")
    parser.add_argument("--show-resolved", action="store_true",
                        help="print each plan as the engine would run it, marking filled/overridden values")
    parser.add_argument("--hardware", default=None, metavar="NAME|FILE",
                        help="the device the engine's defaults are sized for (CUDA-graph batch sizes, memory "
                             "fraction): a shipped profile (cpu, h100, h200), a hardware profile YAML or a cost "
                             "table JSON from `specc profile` (default: the plan's schedule.hardware, else the GPU "
                             "of a CUDA cost table measured here, else h100; said on an `assumed:` line)")




# ------------------------------------------------------------------------------------------
# Inputs


def _is_override(arg: str) -> bool:
    return "=" in arg.split("/")[0] or arg.startswith("~")


def split_inputs(inputs: List[str]) -> Tuple[List[str], List[str], List[str]]:
    """(plan sources in order, overrides, problems). Directories expand to their ``*.yaml``/``*.yml``
    files, globs to their matches; anything else is kept as a file path or preset name."""
    sources: List[str] = []
    overrides: List[str] = []
    problems: List[str] = []
    for arg in inputs:
        if _is_override(arg) and not os.path.exists(arg):
            overrides.append(arg)
        elif os.path.isdir(arg):
            files = sorted(str(p) for ext in ("*.yaml", "*.yml") for p in Path(arg).glob(ext))
            if not files:
                problems.append(f"{arg}: directory has no .yaml plans")
            sources.extend(files)
        elif any(c in arg for c in "*?[") and not os.path.exists(arg):
            files = sorted(glob.glob(arg, recursive=True))
            files = [f for f in files if f.endswith((".yaml", ".yml")) and os.path.isfile(f)]
            if not files:
                problems.append(f"{arg}: glob matches no .yaml files")
            sources.extend(files)
        else:
            sources.append(arg)
    return sources, overrides, problems
















# ------------------------------------------------------------------------------------------
# Output


_ERR_LOC = re.compile(r"(?m)^\s*(?:<override>[^:]*|([^\s:][^:\n]*?\.ya?ml))(?::(\d+))?(?::\d+)?: ")


def error_location(result: Result) -> Tuple[str, int]:
    """(file, line) of the first problem named in an unusable plan's message (``file:line: ...``), so
    machine formats keep the location text output shows; ``(plan_path, 0)`` if it names none."""
    for m in _ERR_LOC.finditer(result.error or ""):
        if m.group(1):
            return m.group(1), int(m.group(2) or 0)
    return result.plan_path, 0


def sarif_uri(path: str) -> str:
    """A SARIF ``artifactLocation.uri`` (RFC 3986): absolute paths as ``file://`` URIs, relative
    paths percent-encoded with ``/`` separators (SARIF 2.1.0 §3.10)."""
    if os.path.isabs(path):
        return Path(path).as_uri()
    return urllib.parse.quote(path.replace(os.sep, "/"), safe="/")


def _loc_text(loc: Tuple[str, int]) -> str:
    return f"{loc[0]}:{loc[1]}" if loc[1] else loc[0]


def _counts(results: List[Result]) -> Dict[str, int]:
    out = {"error": 0, "warning": 0, "fallback": 0, "filled": 0, "undecided": 0}
    for r in results:
        for v in r.violations:
            out[v.severity] = out.get(v.severity, 0) + 1
    return out


def resolved_yaml(result: Result) -> str:
    """The resolved plan as YAML, each value a rule filled or overrode marked ``# <severity> by <rule>``."""
    from specc.plan.dump import dump_resolved

    marks: Dict[str, str] = {}
    for v in result.violations:
        for key, _ in v.sets:
            marks[key] = f"{v.severity} by {v.rule}"
    lines = dump_resolved(result.resolved).splitlines()
    out: List[str] = []
    stack: List[Tuple[int, str]] = []
    for line in lines:
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if stripped.startswith("- ") or ":" not in stripped:
            out.append(line)
            continue
        key = stripped.split(":", 1)[0].strip().strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        out.append(f"{line}  # {marks[dotted]}" if dotted in marks else line)
    return "\n".join(out) + "\n"


def _count(n: int, severity: str) -> str:
    """``1 error``, ``2 warnings``, ``3 filled`` (filled and undecided are adjectives: no plural)."""
    return f"{n} {severity}" if severity in ("filled", "undecided") else plural(n, severity)


def _keys_source(v) -> str:
    """``keys: a, b; source: ...``; a violation with no keys prints its source alone (never an empty field)."""
    return (f"keys: {', '.join(v.keys)}; " if v.keys else "") + f"source: {v.source}"


def render_text(results: List[Result], show_resolved: bool) -> str:
    out: List[str] = []
    for r in results:
        if r.error:
            out.append(f"{r.plan_path}: unusable plan:\n  " + r.error.replace("\n", "\n  "))
            continue
        head = f"{r.plan_path} ({r.name}) against {r.engine}"
        if not r.violations:
            out.append(f"{head}: ok")
        else:
            c = {s: sum(v.severity == s for v in r.violations)
                 for s in ("error", "warning", "fallback", "filled", "undecided")}
            out.append(f"{head}: " + ", ".join(_count(n, s) for s, n in c.items() if n))
            for v, loc in zip(r.violations, r.locations):
                out.append(f"  {_loc_text(loc)}: {v.severity}: [{v.rule}] {v.message}")
                out.append(f"      {_keys_source(v)}")
        out.extend(f"  assumed: {assumed_text(a)}" for a in r.assumed)
        if show_resolved:
            out.append(f"  resolved for {r.engine}:")
            out.extend("    " + ln for ln in resolved_yaml(r).splitlines())
    c = _counts(results)
    n_plans = len({r.plan_path for r in results})
    bad = sum(1 for r in results if r.error)
    out.append(f"checked {plural(n_plans, 'plan')}: {_count(c['error'], 'error')}, "
               f"{_count(c['warning'], 'warning')}, {_count(c['fallback'], 'fallback')}, {c['filled']} filled"
               + (f", {c['undecided']} undecided" if c["undecided"] else "")
               + (f", {bad} unusable" if bad else ""))
    return "\n".join(out) + "\n"


def assumed_text(a: Dict[str, Any]) -> str:
    """One assumption of :func:`assumptions` as a sentence: what, the value taken, why, the flag or key
    that sets it."""
    value = a["value"] if a["value"] is not None else "the checkpoint's own"
    return f"{a['what'].replace('_', ' ')} {value} ({a['why']}; set it with {a['set_with']})"


def render_json(results: List[Result], show_resolved: bool) -> str:
    from specc.plan.schema import plan_to_dict

    objs = []
    for r in results:
        if r.error:
            objs.append({"plan": r.plan_path, "engine": None, "error": r.error, "violations": []})
            continue
        vs = []
        for v, loc in zip(r.violations, r.locations):
            d = v.to_json()
            d["location"] = {"file": loc[0], "line": loc[1] or None}
            vs.append(d)
        obj = {"plan": r.plan_path, "name": r.name, "engine": r.engine, "violations": vs, "assumed": r.assumed}
        if show_resolved:
            obj["resolved"] = plan_to_dict(r.resolved)
        objs.append(obj)
    return json.dumps(objs, indent=2, default=str) + "\n"


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def render_github(results: List[Result], show_resolved: bool) -> str:
    """GitHub workflow commands (``::error file=...,line=...,title=...::message``)."""
    level = {"error": "error", "warning": "warning", "fallback": "notice", "filled": "notice", "undecided": "notice"}
    out: List[str] = []
    for r in results:
        if r.error:
            file, ln = error_location(r)
            line = f",line={ln}" if ln else ""
            out.append(f"::error file={_gh_escape(file, True)}{line},title=unusable plan::{_gh_escape(r.error)}")
            continue
        for v, loc in zip(r.violations, r.locations):
            line = f",line={loc[1]}" if loc[1] else ""
            file = loc[0] if loc[1] else r.plan_path
            title = _gh_escape(f"{v.rule} ({r.engine})", True)
            out.append(f"::{level[v.severity]} file={_gh_escape(file, True)}{line},title={title}::"
                       f"{_gh_escape(v.message + ' [' + v.source + ']')}")
        for a in r.assumed:
            out.append(f"::notice file={_gh_escape(r.plan_path, True)},title={_gh_escape(f'assumed ({r.engine})', True)}"
                       f"::{_gh_escape(assumed_text(a))}")
    return "\n".join(out) + ("\n" if out else "")


def render_sarif(results: List[Result], show_resolved: bool) -> str:
    """SARIF 2.1.0 (one run, rules from the violations seen). Each default the check assumed is an
    informational result (``kind`` ``informational``, ``level`` ``none``, rule ``specc.assumed``)."""
    from specc import __version__

    level = {"error": "error", "warning": "warning", "fallback": "note", "filled": "note", "undecided": "note"}
    rules: Dict[str, Dict[str, Any]] = {}
    res = []
    for r in results:
        if r.error:
            rules.setdefault("specc.unusable", {"id": "specc.unusable",
                                                "shortDescription": {"text": "plan cannot be loaded"}})
            file, ln = error_location(r)
            phys_err: Dict[str, Any] = {"artifactLocation": {"uri": sarif_uri(file)}}
            if ln:
                phys_err["region"] = {"startLine": ln}
            res.append({"ruleId": "specc.unusable", "level": "error", "message": {"text": r.error},
                        "locations": [{"physicalLocation": phys_err}]})
            continue
        for v, loc in zip(r.violations, r.locations):
            rules.setdefault(v.rule, {"id": v.rule, "shortDescription": {"text": v.rule},
                                      "helpUri": None, "properties": {"source": v.source}})
            phys: Dict[str, Any] = {"artifactLocation": {"uri": sarif_uri(loc[0] if loc[1] else r.plan_path)}}
            if loc[1]:
                phys["region"] = {"startLine": loc[1]}
            res.append({"ruleId": v.rule, "level": level[v.severity],
                        "message": {"text": f"{v.message} [{r.engine}; {v.source}]"},
                        "locations": [{"physicalLocation": phys}],
                        "properties": {"severity": v.severity, "keys": list(v.keys), "engine": r.engine,
                                       "plan": r.plan_path}})
        for a in r.assumed:
            rules.setdefault("specc.assumed", {"id": "specc.assumed", "shortDescription": {
                "text": "a default the check assumed; the flag or key named sets it"}})
            res.append({"ruleId": "specc.assumed", "kind": "informational", "level": "none",
                        "message": {"text": f"assumed: {assumed_text(a)} [{r.engine}]"},
                        "locations": [{"physicalLocation": {"artifactLocation": {"uri": sarif_uri(r.plan_path)}}}],
                        "properties": {"engine": r.engine, "plan": r.plan_path, **a}})
    for rule in rules.values():
        rule.pop("helpUri", None)
    doc = {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
           "runs": [{"tool": {"driver": {"name": "specc", "version": __version__,
                                         "informationUri": "https://github.com/", "rules": list(rules.values())}},
                     "results": res}]}
    doc["runs"][0]["tool"]["driver"].pop("informationUri")
    return json.dumps(doc, indent=2) + "\n"


#: specc check's own options that may appear among --sglang-args / --vllm-args words: option -> (attribute,
#: takes a value). Taken out of the engine's words wherever they appear (none is an engine flag).
OWN_OPTIONS = {"--file": ("file", True), "--format": ("fmt", True), "--engine": ("engine", True),
               "--show-resolved": ("show_resolved", False), "--hardware": ("hardware", True)}


def split_own_options(words: List[str], own=None) -> Tuple[List[str], Dict[str, Any], List[str]]:
    """Take specc's own options out of a launch command's words.

    Returns ``(engine words, {attribute: value}, problems)``: an option is specc's when a word is
    exactly its spelling (or ``--option=value``); ``problems`` names an option left without its value.
    Exact spellings only: an abbreviation is the engine's to read, as the engine would."""
    own = OWN_OPTIONS if own is None else own
    rest: List[str] = []
    found: Dict[str, Any] = {}
    problems: List[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, value = w.partition("=")
        if name in own:
            attr, takes = own[name]
            if not takes:
                found[attr] = True
            elif eq:
                found[attr] = value
            elif i + 1 < len(words):
                found[attr] = words[i + 1]
                i += 1
            else:
                problems.append(f"{name} needs a value")
            i += 1
            continue
        rest.append(w)
        i += 1
    return rest, found, problems


def _launch_commands(args: argparse.Namespace) -> Tuple[List[Tuple[str, List[str]]], List[str]]:
    """The launch commands of ``--sglang-args`` / ``--vllm-args`` (``[(engine, words)]``), with specc's
    own options among their words applied to ``args`` (REMAINDER keeps everything after the flag,
    ``--vllm-args`` inside ``--sglang-args``'s words included). Returns ``(commands, problems)``."""
    pending = [(e, list(getattr(args, f"{e}_args") or [])) for e in LAUNCH_CHECKED
               if getattr(args, f"{e}_args", None) is not None]
    own = dict(OWN_OPTIONS, **{f"--{e}-args": (f"{e}_args", False) for e in LAUNCH_CHECKED})
    commands: List[Tuple[str, List[str]]] = []
    problems: List[str] = []
    while pending:
        engine, words = pending.pop(0)
        switch = next((i for i, w in enumerate(words) if w in ("--sglang-args", "--vllm-args")), None)
        if switch is not None:  # the rest of the line is the other command
            pending.append((words[switch][2:-5], words[switch + 1:]))
            words = words[:switch]
        rest, found, bad = split_own_options(words, own)
        problems += bad
        for attr, value in found.items():
            setattr(args, attr, value)
        commands.append((engine, rest))
    return commands, problems






RENDER = {"text": render_text, "json": render_json, "github": render_github, "sarif": render_sarif}


def run(args: argparse.Namespace) -> int:
    """Check every plan named by ``args.inputs``; print in ``args.fmt``; return the exit code."""
    commands, problems = _launch_commands(args)
    if problems or args.fmt not in FORMATS:
        why = problems or [f"--format {args.fmt!r}: choose one of {', '.join(FORMATS)}"]
        print(f"specc check: error: {'; '.join(why)}", file=sys.stderr)
        return 2
    hardware = None
    if getattr(args, "hardware", None) is not None:  # checked before any plan loads
        from specc.predict.hardware import parse_hardware

        try:
            hardware = parse_hardware(args.hardware)
        except SpeccError as exc:
            print(f"specc check: error: {exc}", file=sys.stderr)
            return 2
    if args.file is not None and not commands:
        print("specc check: error: --file holds a launch command: say whose, with --sglang-args --file PATH or "
              "--vllm-args --file PATH", file=sys.stderr)
        return 2
    if commands:
        if len(commands) > 1 and args.file is not None:
            print("specc check: error: --file with both --sglang-args and --vllm-args: check one command per file",
                  file=sys.stderr)
            return 2
        results = [r for e, words in commands for r in check_command(e, words, args.engine, args.file, hardware)]
        sys.stdout.write(RENDER[args.fmt](results, args.show_resolved))
        return exit_code(results)
    sources, overrides, problems = split_inputs(list(args.inputs or []))
    if not sources and not problems:
        print("specc check: error: no plans given (pass files, directories, globs or preset names)",
              file=sys.stderr)
        return 2
    results = [Result(plan_path=p.split(":", 1)[0], error=p) for p in problems]
    results += check_inputs(sources, overrides, args.engine, hardware)
    sys.stdout.write(RENDER[args.fmt](results, args.show_resolved))
    return exit_code(results)
