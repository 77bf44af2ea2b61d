"""What specc writes for people rather than programs: counts in words and progress bars.

:func:`plural` writes a count with its unit in the right number (``1 token``, ``2 tokens``), so a
message never says "1 tokens" or falls back on "token(s)".

:func:`progress` is the one way a command shows progress: a ``tqdm`` bar on standard error, and only
when standard error is a terminal. Standard output stays the command's result (a plan, JSON lines, a
table) whether or not it is redirected, and a log that captures standard error (``2> log``, a CI
job) gets no carriage-return redraws. With the bar off, ``update`` / ``set_postfix`` / ``close`` are
no-ops, so callers need no branches. Nothing here imports torch.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Optional

#: Plurals that are not the word + "s".
IRREGULAR = {"batch": "batches", "prefix": "prefixes", "is": "are", "was": "were", "has": "have",
             "entry": "entries", "query": "queries", "child": "children", "index": "indices"}


def plural(n: Any, word: str, many: Optional[str] = None) -> str:
    """``"<n> <word>"`` with ``word`` in the number ``n`` asks for: singular when ``n`` prints as ``1``
    (or ``-1``), plural otherwise (``0 tokens``, ``2 tokens``, ``1.5 tokens``, ``1.0 tokens``). ``many``:
    the plural form when it is not ``word + "s"`` (or in :data:`IRREGULAR`). ``n`` is printed as given
    (``f"{n}"``); pass a formatted string (``plural(f"{x:,}", "row")``) to choose the digits."""
    text = f"{n}"
    return f"{text} {word if text.lstrip('+-') == '1' else (many or IRREGULAR.get(word) or word + 's')}"


def on_terminal(stream=None) -> bool:
    """True when ``stream`` (default: standard error) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def progress(iterable: Optional[Iterable] = None, *, total: Optional[int] = None, desc: str = "",
             unit: str = "it", disable: bool = False, **kwargs: Any):
    """A ``tqdm`` progress bar on standard error, shown only when standard error is a terminal and
    ``disable`` (``--no-progress``) is False; never written to standard output. Takes ``tqdm``'s
    arguments (``iterable``, ``total``, ``desc``, ``unit``, ``mininterval``, ``leave``,
    ``dynamic_ncols``, ...); ``file`` is always ``sys.stderr``. Returns the bar (iterate it, or call
    ``update(n)`` / ``close()``)."""
    from tqdm import tqdm

    kwargs.pop("file", None)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=disable or not on_terminal(sys.stderr), **kwargs)
