"""The serving names each engine release accepts for the deployment keys that take a name:
``deploy.structured_output.backend`` and ``deploy.reasoning_parser``.

The lists come from the engines' own code through their launch-flag tables
(``specc/engines/<engine>/flags/<version>.json``, written by ``tools/engine_flags.py``): SGLang's
argparse ``choices`` of ``--grammar-backend`` (``sglang/srt/arg_groups/choices.py:131``) and
``--reasoning-parser`` (``sglang/srt/server_args.py:367-372``); vLLM's ``StructuredOutputsBackend``
literal (``vllm/config/structured_outputs.py:14-16``) and its reasoning-parser registry
(``vllm/reasoning/__init__.py``, checked at launch by ``vllm/entrypoints/common/cli_args.py:625-632``).
Nothing here imports torch.
"""
from __future__ import annotations

import difflib
from typing import List, Optional, Sequence

#: the profile name of each engine's flag table
ENGINES = ("sglang", "vllm")


def _table(engine: str, version: Optional[str] = None):
    from specc.importer.parse import load_table

    return load_table(engine, version)


def grammar_backends(engine: str, version: Optional[str] = None) -> List[str]:
    """The structured-output backend names ``engine`` accepts (its flag table)."""
    table = _table(engine, version)
    row = table.by_dest("grammar_backend")
    if row is not None and row.get("choices"):
        return list(row["choices"])
    return list(table.extra.get("structured_outputs_backends", ()))


def reasoning_parsers(engine: str, version: Optional[str] = None) -> List[str]:
    """The reasoning-parser names ``engine`` accepts (its flag table), ``auto`` included where the
    engine has it (SGLang)."""
    table = _table(engine, version)
    row = table.by_dest("reasoning_parser")
    if row is not None and row.get("choices"):
        return list(row["choices"])
    return list(table.extra.get("reasoning_parsers", ()))


def all_reasoning_parsers() -> List[str]:
    """Every name some engine profile accepts as ``deploy.reasoning_parser`` (sorted, no duplicates):
    what the plan loader allows before an engine is chosen."""
    from specc.importer.parse import available

    names = set()
    for engine in ENGINES:
        for version in available(engine):
            names.update(reasoning_parsers(engine, version))
    return sorted(names)


def _norm(name: str) -> str:
    return str(name).lower().replace("-", "_")


def suggest(name: str, names: Sequence[str], n: int = 2) -> List[str]:
    """Names of ``names`` close to ``name`` (case, ``-``/``_`` and spelling slips), best first: the
    same name in the engine's spelling (``deepseek_r1`` -> ``deepseek-r1``) comes first, then
    ``difflib`` matches, then names one is a prefix of the other (``qwen3-thinking`` -> ``qwen3``)."""
    key = _norm(name)
    exact = [x for x in names if _norm(x) == key]
    by_norm = {_norm(x): x for x in names}
    close = [by_norm[c] for c in difflib.get_close_matches(key, list(by_norm), n=n, cutoff=0.6)]
    # a variant of a name (qwen3-thinking for qwen3, deepseek_r1_distill for deepseek_r1)
    stems = sorted((x for k, x in by_norm.items() if len(k) >= 3 and (key.startswith(k) or k.startswith(key))),
                   key=lambda x: -len(x))
    out = []
    for x in exact + close + stems:
        if x not in out:
            out.append(x)
    return out[:n]


def did_you_mean(name: str, names: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` (or ``"x' or 'y"``), empty when nothing is close."""
    close = suggest(name, names)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
