"""The shipped prompt set (`prompts.jsonl`) and its reader.

`prompts.jsonl` holds 60 prompts written for this project, 10 in each of Spec-Bench's six categories
(anchors.md §B1): multi_turn (a `messages` chat list with earlier turns), translation, summarization
(the source article is inside the prompt), qa, math_reasoning and rag (a context passage plus a
question). Summarization and rag prompts carry their source text so prompt lookup (n-gram drafting)
has something to copy. One JSON object per line: `{"id", "category", "prompt"}` or
`{"id", "category", "messages"}`.
"""

from __future__ import annotations

import json
from pathlib import Path

from specc.errors import PromptError

__all__ = ["CATEGORIES", "PROMPTS_FILE", "load_prompt_set"]

PROMPTS_FILE = Path(__file__).with_name("prompts.jsonl")
CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
_ROLES = ("system", "user", "assistant")


def _check_record(rec, where: str) -> dict:
    if not isinstance(rec, dict):
        raise PromptError(f"{where}: each line must be a JSON object, got {type(rec).__name__}")
    for key in ("id", "category"):
        if not isinstance(rec.get(key), str) or not rec[key]:
            raise PromptError(f"{where}: field '{key}' must be a non-empty string")
    has_prompt, has_messages = "prompt" in rec, "messages" in rec
    if has_prompt == has_messages:
        raise PromptError(f"{where}: give exactly one of 'prompt' (a string) or 'messages' (a chat list)")
    if has_prompt and (not isinstance(rec["prompt"], str) or not rec["prompt"].strip()):
        raise PromptError(f"{where}: field 'prompt' must be a non-empty string")
    if has_messages:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise PromptError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
                raise PromptError(
                    f"{where}: messages[{j}] must be {{\"role\": one of {list(_ROLES)}, \"content\": string}}"
                )
        if msgs[-1]["role"] != "user":
            raise PromptError(f"{where}: the last message must have role 'user' (the turn to answer)")
    return rec


def load_prompt_set(path: str | Path | None = None, categories: tuple[str, ...] | list[str] | None = None) -> list[dict]:
    """Read a prompt set in the shipped JSONL format.

    Args:
        path: a JSONL file; None means the shipped `specc/data/prompts.jsonl`.
        categories: keep only records of these categories (None keeps all).
    Returns:
        list of dicts with `id`, `category` and `prompt` (str) or `messages` (list of
        `{"role", "content"}`), in file order.
    Raises:
        PromptError: missing/unreadable file, a line that is not a JSON object, a missing or mistyped
        field (message names file, line and field), a duplicate id, or an unknown category in
        `categories`.
    """
    path = Path(path) if path is not None else PROMPTS_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PromptError(f"cannot read prompt file {path}: {exc.strerror or exc}") from exc
    if categories is not None:
        unknown = sorted(set(categories) - set(CATEGORIES))
        if unknown:
            raise PromptError(f"unknown prompt categories {unknown}; choose from {list(CATEGORIES)}")
    records, seen = [], set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{where}: not valid JSON ({exc.msg}, column {exc.colno})") from exc
        rec = _check_record(rec, where)
        if rec["id"] in seen:
            raise PromptError(f"{where}: duplicate id {rec['id']!r}")
        seen.add(rec["id"])
        if categories is None or rec["category"] in categories:
            records.append(rec)
    if not records:
        raise PromptError(f"{path}: no prompts" + (f" in categories {list(categories)}" if categories else ""))
    return records
