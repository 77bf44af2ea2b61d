"""What an import produces, and the small helpers the engine mappings share."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


@dataclass
class Imported:
    """A launch command read back into plan keys.

    Attributes:
        engine, version: the engine and the flag table's release that read the command.
        plan: nested plan dict (only the keys the command sets, plus ``engine`` and ``runtime.device``).
        flags: every flag the command gave, ``dest -> value``, and its environment assignments
            (``SGLANG_ENABLE_PP_SPEC -> "1"``): the rules' launch facts.
        unmapped: the flags with no plan key, as written (``--mem-fraction-static 0.7``).
        errors: what the engine's own parser or config validation would refuse (unknown or ambiguous
            flags, bad values, unknown ``--speculative-config`` keys, a misspelt algorithm name), with
            suggestions, and counts below their minimum (a negative draft depth), which no plan holds:
            such a value is named with its fix and left out of ``plan``.
        notes: things read but not carried over (an adaptive config file that is not on disk), and each
            flag given by a prefix with the flag the engine reads it as.
        spelled: ``dest -> the option string the command used``.
        filled: ``(plan key, value, message, source)`` for each value the engine fills in because the
            command leaves it out (vLLM serving its default model); ``specc check`` reports them as
            ``filled``.
        prefixes: ``(as written, the flag it resolves to)`` for each flag given by an argparse prefix.
        stand_ins: error message -> the plan keys whose values were put in for the refused value (a
            misspelt algorithm imported as ``method.name=custom``, ``method.plugin=EAGEL3``); ``specc
            check`` reports the error with those keys and not the violations that follow only from them
            (:func:`specc.check.base.drop_dependent`).
    """

    engine: str
    version: str
    plan: Dict[str, Any] = field(default_factory=dict)
    flags: Dict[str, Any] = field(default_factory=dict)
    unmapped: List[str] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    spelled: Dict[str, str] = field(default_factory=dict)
    table: Any = None
    filled: List[Tuple[str, Any, str, str]] = field(default_factory=list)
    prefixes: List[Tuple[str, str]] = field(default_factory=list)
    stand_ins: Dict[str, Tuple[str, ...]] = field(default_factory=dict)

    def refuse(self, message: str, stands_in: Tuple[str, ...] = ()) -> None:
        """Record an error the engine would raise; ``stands_in``: the plan keys whose values are put in
        for the refused value (see ``stand_ins``)."""
        self.errors.append(message)
        if stands_in:
            self.stand_ins[message] = tuple(stands_in)

    def spell(self, dest: str, values: Dict[str, Any]) -> str:
        """A flag and its value as a shell fragment (canonical spelling)."""
        flag = self.table.spelling(dest) if self.table is not None else f"--{dest.replace('_', '-')}"
        value = values.get(dest)
        a = self.table.by_dest(dest) if self.table is not None else None
        if a is not None and a.get("positional"):
            return shlex.quote(str(value))
        if value is True:
            return flag
        if value is False and a is not None and a["kind"] == "bool_pair":
            neg = [o for o in a["options"][1:] if o.startswith(("--no-", "--disable-"))]
            return neg[0] if neg else f"{flag}=false"
        if isinstance(value, list):
            return " ".join([flag] + [shlex.quote(str(x)) for x in value])
        return f"{flag} {shlex.quote(str(value))}"


def put(plan: Dict[str, Any], dotted: str, value: Any) -> None:
    """Set a dotted key in a nested dict (None values are not written)."""
    if value is None:
        return
    parts = dotted.split(".")
    cur = plan
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def get(plan: Dict[str, Any], dotted: str) -> Any:
    cur: Any = plan
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def as_int(values: Dict[str, Any], dest: str, out: Imported) -> Optional[int]:
    """``values[dest]`` as an int (``1k``-style suffixes are not accepted by SGLang's int flags);
    a bad value is an error the engine's argparse would raise too."""
    raw = values.get(dest)
    try:
        return int(str(raw).strip())
    except ValueError:
        out.errors.append(f"{out.spell(dest, values)}: expects an integer")
        return None


def below(out: Imported, flag: str, value: Any, lo: int, why: str, fix: str) -> bool:
    """Report ``flag``'s ``value`` when it is an int below ``lo`` (an error naming the flag, why the
    value cannot run and the fix); True when reported. The value is then left out of the plan, as an
    unparsable one is: the plan written stays one that ``specc`` loads (its ranges,
    ``specc/plan/load.py`` ``RANGES``, refuse it too)."""
    if not isinstance(value, int) or isinstance(value, bool) or value >= lo:
        return False
    sep = "" if flag.endswith("=") else " "
    out.errors.append(f"{flag}{sep}{value}: {why}; {fix} (left out of the plan)")
    return True


def as_count(values: Dict[str, Any], dest: str, out: Imported, lo: int = 1, why: str = "",
             fix: str = "") -> Optional[int]:
    """``values[dest]`` as an int of at least ``lo`` (a count: steps, a width, a size). An integer
    below ``lo`` is an error naming the flag (see :func:`below`) and gives None."""
    n = as_int(values, dest, out)
    flag = out.table.spelling(dest) if out.table is not None else f"--{dest.replace('_', '-')}"
    if below(out, flag, n, lo, why or f"must be an integer >= {lo}", fix or f"write an integer >= {lo}"):
        return None
    return n


def as_float(values: Dict[str, Any], dest: str, out: Imported) -> Optional[float]:
    raw = values.get(dest)
    try:
        return float(str(raw).strip())
    except ValueError:
        out.errors.append(f"{out.spell(dest, values)}: expects a number")
        return None


def human_int(text: Any) -> Optional[int]:
    """vLLM's human-readable integers: ``8k`` = 8000, ``8K`` = 8192, ``25.6k`` = 25600 (decimals only
    with decimal suffixes), else a plain int; None when vLLM would refuse it
    (``vllm/utils/argparse_utils.py:30-74``)."""
    import re

    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", s)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        if "." in number:
            return None
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    try:
        return int(s)
    except ValueError:
        return None
