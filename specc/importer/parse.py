"""Read a launch command as the engine's own parser reads it.

``specc/engines/<engine>/flags/<version>.json`` is the engine's flag table, written from its real
parser by ``tools/engine_flags.py`` (SGLang 0.5.23: ``argparse.ArgumentParser`` +
``ServerArgs.add_cli_args``; vLLM 0.33.0: ``FlexibleArgumentParser`` + ``make_arg_parser``).
:func:`parse_flags` rebuilds an ``argparse`` parser from that table (every value kept as a string,
arity and switches as the engine declares them, ``allow_abbrev`` as the engine has it), so prefixes,
ambiguity and arity follow Python's argparse exactly as they do in the engine: SGLang and vLLM both
accept an unambiguous prefix (``--speculative-alg``) and refuse an ambiguous one. vLLM's own
preprocessing runs first (``vllm/utils/argparse_utils.py`` ``FlexibleArgumentParser.parse_args``):
``_`` becomes ``-`` in flag names, ``--json-arg.key value`` becomes ``--json-arg '{"key": value}'``,
and ``--model X`` after ``serve`` becomes the positional model.

Unknown flags get "did you mean" suggestions from the same table (``difflib``; the first
:data:`SUGGEST_MAX` distinct unknown flags, so a command of thousands of them is read in linear time).
A flag given by an unambiguous prefix is recorded with the flag it resolves to (``Parsed.prefixes``),
and a flag the engine requires (``"required": true`` in the table, e.g. SGLang's ``--model-path``)
that is missing is the engine's own argparse error. Nothing here runs or imports an engine.
"""
from __future__ import annotations

import argparse
import bisect
import difflib
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from specc.engines.releases import release_key

SUGGEST_MAX = 64
"""Distinct unknown flags that get "did you mean" suggestions (each costs a ``difflib`` pass over the
table); the rest are reported without."""


@dataclass(frozen=True, eq=False)
class FlagTable:
    """One engine version's launch flags (see ``tools/engine_flags.py``)."""

    engine: str
    version: str
    prog: str
    allow_abbrev: bool
    actions: Tuple[Dict[str, Any], ...]
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def options(self) -> List[str]:
        return [o for a in self.actions for o in a["options"]]

    def by_dest(self, dest: str) -> Optional[Dict[str, Any]]:
        return next((a for a in self.actions if a["dest"] == dest), None)

    def spelling(self, dest: str) -> str:
        """The first (canonical) option string of ``dest``."""
        a = self.by_dest(dest)
        return a["options"][0] if a and a["options"] else dest


def available(engine: str) -> List[str]:
    """Versions of ``engine`` with a flag table, oldest first."""
    from specc import engines

    try:
        where = engines.flags_dir(engine)
    except KeyError:
        return []
    return sorted((p.stem for p in where.glob("*.json")), key=release_key)


@functools.lru_cache(maxsize=8)
def load_table(engine: str, version: Optional[str] = None) -> FlagTable:
    """The flag table of ``engine`` at ``version`` (None: the newest table at or below the newest
    rule table's release, so a release that only changed rules inherits the last flag table).

    Raises:
        KeyError: no table for that engine or version.
    """
    versions = available(engine)
    if not versions:
        raise KeyError(f"no launch-flag table for engine {engine!r}")
    if version is None:
        version = versions[-1]
    elif version not in versions:
        older = [v for v in versions if release_key(v) <= release_key(version)]
        if not older:
            raise KeyError(f"no launch-flag table for {engine}=={version} (have {', '.join(versions)})")
        version = older[-1]
    from specc import engines

    data = json.loads((engines.flags_dir(engine) / f"{version}.json").read_text())
    extra = {k: v for k, v in data.items() if k not in ("engine", "version", "prog", "allow_abbrev", "actions")}
    return FlagTable(engine=engine, version=version, prog=data["prog"], allow_abbrev=data["allow_abbrev"],
                     actions=tuple(data["actions"]), extra=extra)


class ParseError(Exception):
    """The engine's parser refuses the command (argparse would exit with status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this, then exits; we raise instead
        raise ParseError(message)


_PARSERS: Dict[Tuple[str, str], argparse.ArgumentParser] = {}


def _parser(table: FlagTable) -> argparse.ArgumentParser:
    key = (table.engine, table.version)
    if key not in _PARSERS:
        _PARSERS[key] = _build_parser(table)
    return _PARSERS[key]


def _build_parser(table: FlagTable) -> argparse.ArgumentParser:
    p = _Parser(prog=table.prog, allow_abbrev=table.allow_abbrev, add_help=False)
    for a in table.actions:
        kind, opts = a["kind"], a["options"]
        if kind == "help":
            continue
        if a.get("positional"):
            p.add_argument(a["dest"], nargs=a.get("nargs") or None, default=None)
            continue
        # "required" is not passed on: parse_flags reports a missing required flag after reading the
        # rest, in argparse's words, instead of stopping there
        kw: Dict[str, Any] = {"dest": a["dest"], "default": argparse.SUPPRESS}
        if kind == "switch":
            kw.update(action="store_const", const=True)
        elif kind == "count":
            kw.update(action="count")
        elif kind == "bool_pair":
            # --x / --no-x (or --enable-x / --disable-x): each spelling is a store_const of its own
            pos = [o for o in opts if not _is_negative(o, opts)]
            neg = [o for o in opts if _is_negative(o, opts)]
            p.add_argument(*pos, dest=a["dest"], action="store_const", const=True, default=argparse.SUPPRESS)
            if neg:
                p.add_argument(*neg, dest=a["dest"], action="store_const", const=False,
                               default=argparse.SUPPRESS)
            continue
        else:
            kw["action"] = "append" if kind == "append" else "store"
            if a.get("nargs") is not None:
                kw["nargs"] = a["nargs"]
            if a.get("choices"):
                kw["choices"] = a["choices"]
        p.add_argument(*opts, **kw)
    return p


def _is_negative(opt: str, opts: List[str]) -> bool:
    return opt.startswith(("--no-", "--disable-")) and len(opts) > 1 and opt != opts[0]


def suggest(table: FlagTable, flag: str, n: int = 3) -> List[str]:
    """Close spellings of ``flag`` among the version's options (``difflib`` ratio >= 0.6)."""
    name = flag.split("=", 1)[0]
    return difflib.get_close_matches(name, table.options, n=n, cutoff=0.6)


# ------------------------------------------------------------------------------------------
# vLLM's FlexibleArgumentParser preprocessing (vllm/utils/argparse_utils.py:313-502)

_DASH = re.compile(r"(?<=--)[^\.]*")


def _vllm_preprocess(args: List[str]) -> List[str]:
    # --model X moves to the positional model (only for `serve`; we always parse `serve` args)
    for i, a in enumerate(args):
        if re.match(r"^--model(=.+|$)", a):
            tag, rest = (args[i + 1], i + 2) if a == "--model" and i + 1 < len(args) else (a.split("=", 1)[1], i + 1)
            args = [tag] + args[:i] + args[rest:]
            break
    out: List[str] = []
    for a in args:
        if a.startswith("--"):
            if "=" in a:
                key, value = a.split("=", 1)
                out.append(_DASH.sub(lambda m: m.group(0).replace("_", "-"), key, count=1) + "=" + value)
            else:
                out.append(_DASH.sub(lambda m: m.group(0).replace("_", "-"), a, count=1))
        else:
            out.append(a)
    # --json-arg.key value  ->  --json-arg '{"key": value}' (values parsed as JSON when they are)
    dict_args: Dict[str, Dict[str, Any]] = {}
    skip = set()
    kept: List[str] = []
    for i, a in enumerate(out):
        if i in skip:
            continue
        if a.startswith("-") and "." in a.split("=", 1)[0]:
            if "=" in a:
                key, value = a.split("=", 1)
            else:
                if i + 1 >= len(out):
                    kept.append(a)
                    continue
                key, value = a, out[i + 1]
                skip.add(i + 1)
            append = key.endswith("+")
            key = key[:-1] if append else key
            head, *path = key.split(".")
            try:
                val: Any = json.loads(value) if not append else value.split(",")
            except ValueError:
                val = value
            cur = dict_args.setdefault(head, {})
            for part in path[:-1]:
                cur = cur.setdefault(part, {})
            if append and isinstance(cur.get(path[-1]), list):
                cur[path[-1]] += val
            else:
                cur[path[-1]] = val
            continue
        kept.append(a)
    for head, value in dict_args.items():
        kept += [head, json.dumps(value)]
    return kept


@dataclass
class Parsed:
    """The flags a command gave, as the engine's parser reads them.

    ``values``: dest -> value (strings, lists of strings for ``nargs``, True/False for switches),
    only for flags the command gave; ``spelled``: dest -> the option string the command used;
    ``errors``: why the engine's parser would refuse the command (unknown or ambiguous flags,
    missing values, a missing required flag), each with suggestions from the version's flag table;
    ``prefixes``: ``(as written, the flag it resolves to)`` for each flag given by a prefix, in order.
    """

    values: Dict[str, Any] = field(default_factory=dict)
    spelled: Dict[str, str] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    prefixes: List[Tuple[str, str]] = field(default_factory=list)


def parse_flags(table: FlagTable, argv: List[str]) -> Parsed:
    """Parse ``argv`` (the words after the launcher) with ``table``'s parser. Never raises: what the
    engine would refuse is listed in ``Parsed.errors``. argparse stops at the first ambiguous flag;
    we find every ambiguous one first (argparse's own test, run only on words that prefix some
    option), drop each with its value and parse the rest once, so one run lists every problem.
    Unknown ``--flags`` with their values are set aside before argparse runs where that cannot change
    its reading (:func:`_set_aside_unknown`): argparse's parse is quadratic in the option words, so
    a command of 10,000 unknown flags is read in linear time."""
    args = _vllm_preprocess(list(argv)) if table.engine == "vllm" else list(argv)
    out = Parsed()
    parser = _parser(table)
    name = f"{table.engine}=={table.version}"
    args = _drop_ambiguous(parser, args, name, out)
    args, aside = _set_aside_unknown(parser, table, args)
    try:
        ns, unknown = parser.parse_known_args(args)
    except ParseError as exc:
        out.errors.append(f"{name} refuses the command: {exc}")
        return out
    value = functools.partial(_is_value, parser)
    groups = _with_values(unknown, args, value) + _with_values(aside, aside, value)
    out.values = {k: v for k, v in vars(ns).items() if not (_positional(table, k) and v is None)}
    for a in _option_words(args):
        flag = a.split("=", 1)[0]
        dest = _dest_of(parser, flag)
        if dest:
            out.spelled.setdefault(dest, flag)
            if flag.startswith("--") and flag not in parser._option_string_actions:
                out.prefixes.append((flag, _resolved(parser, flag)))
    missing = [a for a in table.actions if a.get("required") and a["dest"] not in out.values]
    if missing:
        out.errors.append(f"{name} refuses the command: the following arguments are required: "
                          f"{', '.join('/'.join(a['options']) for a in missing)}")
    hints: Dict[str, List[str]] = {}  # distinct unknown flag -> its suggestions (the first SUGGEST_MAX)
    for word, given in groups:
        if not value(word):
            flag = word.split("=", 1)[0]
            if flag not in hints:
                hints[flag] = suggest(table, flag) if len(hints) < SUGGEST_MAX else []
            hint = hints[flag]
            # one error per unknown flag, naming the values written after it (argparse lists them as extras too)
            shown = " ".join([word] + [repr(v) if " " in v or not v else v for v in given])
            out.errors.append(f"{shown}: not a {name} flag" + (f"; did you mean {' or '.join(hint)}?" if hint else ""))
        else:
            out.errors.append(f"{word!r}: unexpected argument for {name} (a value for a flag that takes none, or "
                              f"the value of an unknown flag)")
    return out


def _is_value(parser: argparse.ArgumentParser, word: str) -> bool:
    """A word argparse reads as a value, not an option: no leading ``-``, or a negative number."""
    return not word.startswith("-") or word == "-" or _looks_negative(parser, word)


def _with_values(extras: List[str], args: List[str], is_value) -> List[Tuple[str, List[str]]]:
    """``extras`` (words argparse did not take, in ``args`` order) as ``(word, values)``: the values
    (``is_value``) that directly follow an unknown ``--flag`` (written without ``=``) in ``args`` are its
    values, so ``--foo 3`` is one mistake; any other value stands alone (a value for a switch). Each word
    is found in ``args`` after the previous one, so a repeated word keeps its own position."""
    out: List[Tuple[str, List[str]]] = []
    pos, last = 0, -2  # where to look next in args; args index of the current group's last word
    for word in extras:
        try:
            at = args.index(word, pos)
        except ValueError:
            at = -2
        pos = at + 1 if at >= 0 else pos
        group = out[-1] if out else None
        if (group is not None and is_value(word) and not is_value(group[0])
                and "=" not in group[0] and at >= 0 and at == last + 1):
            group[1].append(word)
        else:
            out.append((word, []))
        last = at
    return out


def _option_words(args: List[str]) -> List[str]:
    """The words argparse reads as options: those starting with ``-``, up to a ``--`` separator."""
    out = []
    for a in args:
        if a == "--":
            break
        if a.startswith("-") and a != "-":
            out.append(a)
    return out


def _drop_ambiguous(parser: argparse.ArgumentParser, args: List[str], name: str, out: Parsed) -> List[str]:
    """``args`` without the flags argparse finds ambiguous (each dropped with its value), each one
    reported. Only a word that prefixes some option string can be ambiguous: the sorted option
    strings answer that in O(log n), and argparse's own ``_parse_optional`` decides those words."""
    options = _sorted_options(parser)
    keep: List[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--":
            keep.extend(args[i:])
            break
        prefix = a.split("=", 1)[0]
        if a.startswith("--") and prefix not in parser._option_string_actions and _prefixes_any(options, prefix):
            try:
                parser._parse_optional(a)
            except ParseError as exc:
                m = re.search(r"could match (.*)", str(exc))
                out.errors.append(f"{prefix}: ambiguous prefix for {name}: could be {m.group(1) if m else exc}; "
                                  f"write the flag in full")
                skip = "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("-")
                continue
        keep.append(a)
    return keep


def _set_aside_unknown(parser: argparse.ArgumentParser, table: FlagTable,
                       args: List[str]) -> Tuple[List[str], List[str]]:
    """``(args without the unknown --flags and the values after them, those words in order)``.

    A ``--word`` that neither is nor prefixes an option string (and holds no space) is one argparse
    reads as an unknown option: it goes to the extras, and so do the plain words after it up to
    the next option, unless a positional is still unfilled (then one of them may fill it). With no
    positional left to fill (SGLang has none; vLLM's model is filled by the words before the first
    option) taking such a group out changes nothing else argparse reads: the option before it still
    stops where the group began. Otherwise nothing is set aside."""
    positional = any(a.get("positional") for a in table.actions)
    if positional and (not args or args[0].startswith("-")):
        return args, []
    options = _sorted_options(parser)
    keep: List[str] = []
    aside: List[str] = []
    in_group = False
    for i, a in enumerate(args):
        if a == "--":
            keep.extend(args[i:])
            break
        if a.startswith("-") and a != "-" and not _looks_negative(parser, a):
            flag = a.split("=", 1)[0]
            in_group = (a.startswith("--") and " " not in a and flag not in parser._option_string_actions
                        and not _prefixes_any(options, flag))
        (aside if in_group else keep).append(a)
    return keep, aside


def _looks_negative(parser: argparse.ArgumentParser, word: str) -> bool:
    """argparse reads ``-1`` / ``-2.5`` as a plain word when no option looks like a negative number."""
    return bool(parser._negative_number_matcher.match(word)) and not parser._has_negative_number_optionals


def _sorted_options(parser: argparse.ArgumentParser) -> List[str]:
    key = id(parser)
    if key not in _SORTED:
        _SORTED[key] = sorted(parser._option_string_actions)
    return _SORTED[key]


_SORTED: Dict[int, List[str]] = {}


def _prefixes_any(options: List[str], prefix: str) -> bool:
    i = bisect.bisect_left(options, prefix)
    return i < len(options) and options[i].startswith(prefix)


def _resolved(parser: argparse.ArgumentParser, prefix: str) -> str:
    """The option string a unique prefix stands for (the action's first spelling it prefixes)."""
    hits = [o for o in _sorted_options(parser) if o.startswith(prefix)]
    action = parser._option_string_actions[hits[0]]
    return next((o for o in action.option_strings if o.startswith(prefix)), hits[0])


def _positional(table: FlagTable, dest: str) -> bool:
    a = table.by_dest(dest)
    return bool(a and a.get("positional"))


def _dest_of(parser: argparse.ArgumentParser, name: str) -> Optional[str]:
    if name in parser._option_string_actions:
        return parser._option_string_actions[name].dest
    options = _sorted_options(parser)
    i = bisect.bisect_left(options, name)
    dests = set()
    while i < len(options) and options[i].startswith(name):
        dests.add(parser._option_string_actions[options[i]].dest)
        i += 1
    return dests.pop() if len(dests) == 1 else None
