"""Find an engine launch command in what users have: a command line, a shell script, a Kubernetes
manifest or compose file (YAML ``command:``/``args:`` lists or strings), or a bare vLLM
``--speculative-config`` JSON.

:func:`find_launch` returns the environment assignments before the launcher and the words after it
(``python -m sglang.launch_server ARGS``, ``sglang serve ARGS``, ``vllm serve ARGS``,
``python -m vllm.entrypoints.openai.api_server ARGS``). Shell text is split with ``shlex`` after
joining ``\\``-continued lines and dropping comment lines.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from specc.errors import SpeccError
from specc.console import plural
from specc.io import load_json

def launchers(engine: str) -> Tuple[Tuple[str, ...], ...]:
    """The word sequences that start ``engine``'s launch command (its package's ``LAUNCHERS``, e.g.
    ``("-m", "sglang.launch_server")``, ``("vllm", "serve")``). Raises KeyError for an unknown engine."""
    from specc import engines

    return tuple(tuple(p) for p in getattr(engines.get(engine), "LAUNCHERS", ()) or ())


def bare_config_flag(engine: str) -> Optional[str]:
    """The flag whose JSON value may stand alone as the whole text (vLLM's ``--speculative-config``:
    its package's ``BARE_CONFIG_FLAG``), or None."""
    from specc import engines

    return getattr(engines.get(engine), "BARE_CONFIG_FLAG", None)


_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class CommandError(SpeccError):
    """No launch command of the engine could be found, or the text cannot be split into words."""


@dataclass
class Launch:
    """One launch command: ``env`` assignments written before it and ``args`` after the launcher
    (``config_only``: the text was a bare vLLM ``--speculative-config`` JSON, no command)."""

    args: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    text: str = ""
    config_only: bool = False  # a bare vLLM --speculative-config JSON, not a launch command


def _words(text: str) -> List[str]:
    lines = [ln for ln in text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()
             if not ln.lstrip().startswith("#")]
    try:
        return shlex.split("\n".join(lines), comments=False)
    except ValueError as exc:
        raise CommandError(f"cannot split the command into words ({exc}); check its quotes") from None


def _logical_lines(text: str) -> List[Tuple[List[Tuple[int, int]], str]]:
    """Each line once ``\\``-continued lines are joined (as the shell joins them), with where its
    pieces start: ``([(offset in the joined line, physical line number), ...], joined line)``."""
    out: List[Tuple[List[Tuple[int, int]], str]] = []
    segs: List[Tuple[int, int]] = []
    joined = ""
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        segs.append((len(joined), no))
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        out.append((segs, joined + line))
        segs, joined = [], ""
    if segs:
        out.append((segs, joined))
    return out


def _open_quote(line: str) -> Optional[Tuple[int, str]]:
    """Where the quote that is never closed opens in ``line`` (0-based column, the quote character),
    following POSIX shell quoting as ``shlex`` does; None when every quote is closed."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "'\"":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if c == '"' and line[j] == "\\" else 1
            if j >= n:
                return i, c
            i = j + 1
            continue
        i += 1
    return None


def _split_problem(segs: List[Tuple[int, int]], line: str, exc: Exception) -> str:
    """A message for a line ``shlex`` cannot split: the line number, what is wrong and where."""
    shown = line.strip()
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    where = _open_quote(line)
    if where is None:
        return (f"line {segs[0][1]}: cannot split the command into words ({exc}): {shown!r}; check its quotes "
                f"and backslashes")
    col, q = where
    offset, no = max(sg for sg in segs if sg[0] <= col)  # the physical line the quote is on
    kind = "double" if q == '"' else "single"
    return (f"line {no}: the {kind} quote ({q}) at column {col - offset + 1} is never closed ({exc}): {shown!r}; "
            f"close it, or escape it as \\{q} if it is part of a value")


def _match(words: Sequence[str], engine: str) -> Optional[int]:
    """Index just past the launcher in ``words`` (None if absent)."""
    for pat in launchers(engine):
        n = len(pat)
        for i in range(len(words) - n + 1):
            if tuple(w.rsplit("/", 1)[-1] if j == 0 and pat[0] != "-m" else w
                     for j, w in enumerate(words[i:i + n])) == pat:
                return i + n
    return None


def _cut_at_shell_end(words: List[str]) -> List[str]:
    for i, w in enumerate(words):
        if w in ("&&", "||", ";", "|", "&", ">", ">>", "2>&1", "2>"):
            return words[:i]
    return words


def from_words(words: Sequence[str], engine: str) -> Launch:
    """The launch inside ``words`` (a command already split). Without a launcher the words are taken
    as the engine's arguments themselves (``specc import sglang -- --model-path X ...``)."""
    words = list(words)
    at = _match(words, engine)
    env: Dict[str, str] = {}
    if at is None:
        return Launch(args=_cut_at_shell_end(words))
    for w in words[:at]:
        if _ENV.match(w):
            k, v = w.split("=", 1)
            env[k] = v
    # docker/kubectl `-e NAME=value` pairs before the launcher
    for i, w in enumerate(words[:at]):
        if w in ("-e", "--env") and i + 1 < at and _ENV.match(words[i + 1]):
            k, v = words[i + 1].split("=", 1)
            env[k] = v
    return Launch(args=_cut_at_shell_end(words[at:]), env=env)


def _yaml_commands(text: str) -> List[List[str]]:
    """``command``/``args`` word lists from a YAML document (Kubernetes, compose)."""
    import yaml

    from specc.errors import SpeccError
    from specc.io import YAML_MAX_NODES, expanded_size

    try:
        for node in yaml.compose_all(text, Loader=yaml.SafeLoader):
            if node is not None and expanded_size(node) > YAML_MAX_NODES:  # an alias bomb: walk() would expand it
                raise SpeccError(f"YAML aliases expand to more than {YAML_MAX_NODES:,} nodes (an alias bomb?); "
                                 f"write the values out")
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return []
    found: List[List[str]] = []

    def walk(node):
        if isinstance(node, dict):
            cmd, args = node.get("command"), node.get("args")
            words: List[str] = []
            for part in (cmd, args):
                if isinstance(part, list) and all(isinstance(x, (str, int, float)) for x in part):
                    words += [str(x) for x in part]
                elif isinstance(part, str):
                    words += _words(part)
            if words:
                found.append(words)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for d in docs:
        walk(d)
    # a shell wrapper (`sh -c "python -m ..."`) holds the real command in one word
    out = []
    for words in found:
        out.append(words)
        for w in words:
            if " " in w:
                out.append(_words(w))
    return out


def find_launch(text: str, engine: str) -> Launch:
    """The first ``engine`` launch command in ``text`` (a command line, a shell script, YAML, or for
    vLLM a bare ``--speculative-config`` JSON object, returned as ``--speculative-config <json>``).

    Raises:
        CommandError: no launch command of that engine is in ``text``.
    """
    stripped = text.strip()
    config_flag = bare_config_flag(engine)
    if config_flag and stripped.startswith("{"):
        try:
            obj = load_json(stripped, "the launch file", error=CommandError)
        except ValueError as exc:
            raise CommandError(f"the text starts with '{{' but is not JSON ({exc})") from None
        return Launch(args=[config_flag, json.dumps(obj)], text=stripped, config_only=True)
    candidates: List[List[str]] = []
    if re.search(r"^\s*[\w-]+:\s", text, re.M) and ("command" in text or "args" in text):
        candidates += _yaml_commands(text)
    # shell text: each logical line (after joining continuations) is a candidate
    unsplit: List[str] = []  # lines shlex refuses (an unterminated quote), reported if nothing else matches
    for segs, line in _logical_lines(text):
        if line.lstrip().startswith("#") or not line.strip():
            continue
        try:
            candidates.append(shlex.split(line, comments=False))
        except ValueError as exc:
            problem = _split_problem(segs, line, exc)
            # a line naming the launcher is the likeliest culprit: report it first
            unsplit.insert(0, problem) if _names_launcher(line, engine) else unsplit.append(problem)
    try:  # a quoted argument may span lines (a multi-line JSON): the whole text as one command
        candidates.append(_words(text))
    except CommandError:
        pass
    for words in candidates:
        if _match(words, engine) is not None:
            launch = from_words(words, engine)
            launch.text = shlex.join(words)
            return launch
    if unsplit:
        more = f" (and {plural(len(unsplit) - 1, 'more line')} like it)" if len(unsplit) > 1 else ""
        raise CommandError(f"cannot read the {engine} command: {unsplit[0]}{more}")
    names = ", ".join(" ".join(p) for p in launchers(engine))
    raise CommandError(f"no {engine} launch command found (looked for: {names}); pass the command after `--`")


def _names_launcher(line: str, engine: str) -> bool:
    """Whether the text of ``line`` holds one of ``engine``'s launchers (read word by word, no quoting)."""
    return _match([w.strip("'\"") for w in line.split()], engine) is not None
