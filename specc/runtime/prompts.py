"""Reading prompts for ``specc run`` / ``specc bench``: JSONL (``prompt`` or ``messages`` per line),
plain text (one prompt per line), and the shipped prompt set ``specc/data/prompts.jsonl``.

Nothing here imports torch; tokenization happens in :func:`encode_prompt` with the target's
tokenizer (chat template applied through transformers).
"""
from __future__ import annotations

import importlib.resources
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from specc.errors import PromptError
from specc.io import load_json


@dataclass(frozen=True)
class PromptRecord:
    """One input: ``prompt`` (a user message, the chat template is applied) or ``messages`` (a chat
    list of ``{"role", "content"}``), with an ``id`` and a ``category`` (Spec-Bench's names)."""

    id: str
    category: str = ""
    prompt: Optional[str] = None
    messages: Optional[List[Dict[str, str]]] = None
    raw: bool = False  # plain text to encode without the chat template

    @property
    def text(self) -> str:
        """A one-line display form of the input (the last user message for chats)."""
        if self.prompt is not None:
            return self.prompt
        users = [m["content"] for m in self.messages or [] if m.get("role") == "user"]
        return users[-1] if users else ""


def shipped_prompts_path() -> Path:
    """The shipped prompt set (~60 prompts in Spec-Bench's six categories)."""
    return Path(str(importlib.resources.files("specc.data").joinpath("prompts.jsonl")))


ROLES = ("system", "user", "assistant")


def _check_messages(messages, where: str) -> List[Dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise PromptError(f"{where}: messages[{i}] must be {{\"role\": one of {list(ROLES)}, \"content\": "
                              f"string}}, got {json.dumps(m)[:80]}")
    if messages[-1]["role"] != "user":
        raise PromptError(f"{where}: the last message must have role 'user' (the turn to answer)")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


PROGRESS_BYTES = 4 << 20
"""Prompt input of at least this many bytes is read with a progress bar on stderr (``progress=True``)."""


def parse_prompts(lines: Iterable[str], source: str, progress: bool = False) -> List[PromptRecord]:
    """Parse prompt lines. JSONL when the first non-blank line starts with ``{``: each line an
    object with ``prompt`` (string) or ``messages`` (chat list), optional ``id`` and ``category``.
    Otherwise plain text: each non-blank line is one prompt. ``progress``: a progress bar on stderr
    counting the lines (for large inputs; the caller decides).

    Raises:
        PromptError: naming ``source`` and the line: bad JSON, neither/both keys, wrong types, no
            prompt at all, or a JSON array (first non-blank character ``[``), which is neither format.
    """
    lines = list(lines)
    first = next((l for l in lines if l.strip()), None)
    if first is None:
        raise PromptError(f"{source}: no prompts (the input is empty)")
    if first.lstrip().startswith("["):
        raise PromptError(f"{source}: looks like a JSON array; prompts are JSONL (one JSON object per line, "
                          f"e.g. {{\"prompt\": \"...\"}}) or plain text (one prompt per line)")
    records: List[PromptRecord] = []
    seen: set = set()
    if progress:
        from specc.console import progress as bar

        lines = bar(lines, desc=f"reading {source}", unit=" lines", unit_scale=True, mininterval=0.5, leave=False)
    if not first.lstrip().startswith("{"):
        for i, line in enumerate(lines, 1):
            text = line.rstrip("\n")
            if text.strip():
                records.append(PromptRecord(id=f"line-{i}", prompt=text))
        return records
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{i}"
        try:
            obj = load_json(line, where, error=PromptError)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); a JSONL prompts file "
                              f"has one object per line, e.g. {{\"prompt\": \"...\"}}") from None
        if not isinstance(obj, dict):
            raise PromptError(f"{where}: each line must be a JSON object with 'prompt' or 'messages'")
        has_p, has_m = "prompt" in obj, "messages" in obj
        if has_p == has_m:
            raise PromptError(f"{where}: give exactly one of 'prompt' (a string) or 'messages' (a chat list)")
        pid = obj.get("id", f"line-{i}")
        cat = obj.get("category", "")
        if not isinstance(pid, str) or not pid or not isinstance(cat, str):
            raise PromptError(f"{where}: field 'id' must be a non-empty string and 'category' a string")
        if pid in seen:
            raise PromptError(f"{where}: duplicate id {pid!r}")
        seen.add(pid)
        if has_p:
            if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
                raise PromptError(f"{where}: 'prompt' must be a non-empty string")
            records.append(PromptRecord(id=pid, category=cat, prompt=obj["prompt"]))
        else:
            records.append(PromptRecord(id=pid, category=cat, messages=_check_messages(obj["messages"], where)))
    return records


def read_prompts(path: str | Path, progress: bool = False) -> List[PromptRecord]:
    """Read a prompts file (see :func:`parse_prompts`); ``-`` reads standard input. ``progress``: show
    a progress bar on stderr while an input of :data:`PROGRESS_BYTES` or more is parsed.

    The file must be a regular file of at most :data:`specc.io.PROMPTS_LIMIT` bytes (a FIFO, device
    or directory is refused without blocking: pipe prompts into ``--prompts -`` instead); standard
    input is read up to the same limit (:func:`specc.io.read_stdin_bounded`).

    Raises:
        PromptError: missing, unreadable, not a regular file, over the limit, not UTF-8, or not
            prompts (:func:`parse_prompts`), naming the file.
    """
    from specc.io import PROMPTS_LIMIT, read_bounded, read_stdin_bounded

    if str(path) == "-":
        text = read_stdin_bounded(PROMPTS_LIMIT, "prompts on standard input", error=PromptError)
        return parse_prompts(text.splitlines(), "<stdin>", progress and len(text) >= PROGRESS_BYTES)
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():
        import os as _os

        from specc.io import file_kind

        kind = file_kind(_os.stat(p).st_mode)
        raise PromptError(f"prompts file {p}: is {kind}, not a regular file; to pipe prompts in, use "
                          f"`--prompts -` and redirect them into standard input")
    text = str(read_bounded(p, PROMPTS_LIMIT, "prompts file", error=PromptError))
    return parse_prompts(text.lstrip("\ufeff").splitlines(), str(p), progress and len(text) >= PROGRESS_BYTES)


def read_stdin(wait_s: float = 1.0) -> Optional[str]:
    """Prompts piped or redirected into stdin, or None when stdin is a terminal, /dev/null (or any
    device), or a pipe that stays silent for ``wait_s`` seconds (so an inherited, idle pipe never
    hangs a run). Read up to :data:`specc.io.PROMPTS_LIMIT` bytes (PromptError beyond)."""
    import os
    import select as _select
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
        if sys.stdin.isatty():
            return None
    except (OSError, ValueError, AttributeError):
        return None
    from specc.io import PROMPTS_LIMIT, read_stdin_bounded

    if stat.S_ISREG(mode):
        return read_stdin_bounded(PROMPTS_LIMIT, "prompts on standard input", error=PromptError)
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        ready, _, _ = _select.select([sys.stdin], [], [], wait_s)
        return read_stdin_bounded(PROMPTS_LIMIT, "prompts on standard input", error=PromptError) if ready else None
    return None


def check_text(text: str, where: str) -> str:
    """``text`` if it is valid Unicode, else PromptError naming ``where`` and the position. A
    command-line argument that is not UTF-8 reaches Python with each bad byte as a lone surrogate
    (U+DC80..U+DCFF, PEP 383), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = (f"byte 0x{code - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= code <= 0xDCFF
                else f"a lone UTF-16 surrogate \\u{code:04x}")
        raise PromptError(f"{where}: character {exc.start} is {what}; give UTF-8 text") from None
    return text


def encode_prompt(record: PromptRecord, tokenizer) -> List[int]:
    """Token ids of a prompt: the chat template applied to ``messages`` or to ``prompt`` as one user
    message (when the tokenizer has a template and the record is not raw), else plain encoding.

    Raises:
        PromptError: the text is not valid Unicode (:func:`check_text`) or encodes to no tokens, or the
            template rejects the messages.
    """
    for m in record.messages or [{"content": record.prompt or ""}]:
        check_text(m["content"], f"prompt {record.id}")
    if record.messages is not None:
        ids = tokenizer.apply_chat_template(record.messages)
    elif tokenizer.has_chat_template and not record.raw:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": record.prompt}])
    else:
        ids = tokenizer.encode(record.prompt)
    if not ids:
        raise PromptError(f"prompt {record.id}: encodes to no tokens")
    return list(ids)


def select(records: Sequence[PromptRecord], limit: Optional[int] = None,
           categories: Optional[Sequence[str]] = None) -> List[PromptRecord]:
    """Filter by category (if given) and keep the first ``limit`` (if given). ``--limit`` on the
    shipped set takes prompts round-robin over categories so a small limit still covers them all."""
    recs = [r for r in records if not categories or r.category in categories]
    if limit is None or limit >= len(recs):
        return list(recs)
    by_cat: Dict[str, List[PromptRecord]] = {}
    for r in recs:
        by_cat.setdefault(r.category, []).append(r)
    if len(by_cat) <= 1:
        return list(recs[:limit])
    out: List[PromptRecord] = []
    queues = [list(v) for v in by_cat.values()]
    while len(out) < limit:
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    return out


def shipped_per_category(tokenizer, per_category: int) -> List[tuple]:
    """The first ``per_category`` shipped evaluation prompts of each category, chat-templated with
    ``tokenizer``: ``[(prompt id, token ids)]`` in file order (the benchmarks' prompt set)."""
    seen: Dict[str, int] = {}
    out = []
    for r in read_prompts(shipped_prompts_path()):
        if seen.get(r.category, 0) >= per_category:
            continue
        seen[r.category] = seen.get(r.category, 0) + 1
        out.append((r.id, encode_prompt(r, tokenizer)))
    return out
