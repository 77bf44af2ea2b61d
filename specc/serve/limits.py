"""The request-body limit of ``specc serve``: an ASGI middleware that answers a body over the limit
with a 413 in OpenAI's error format before any handler runs, so no JSON parser, pydantic model or
tokenizer ever sees it.

A ``Content-Length`` over the limit is refused from the header alone; a body without one (chunked)
is counted as it arrives and refused at the first byte past the limit. Either way the rest of the
body is read and thrown away, up to :data:`DRAIN_BYTES` and :data:`DRAIN_SECONDS`, before the answer
goes out with ``Connection: close``: a client that writes its whole body before it reads (httpx,
requests, the ``openai`` client) then reads the 413 instead of a reset connection (the "lingering
close" of HTTP/1.1 servers, RFC 9112 §9.6). A client that sent ``Expect: 100-continue`` gets the 413
without sending its body at all. Bodies within the limit are buffered (at most ``limit`` bytes) and
handed to the application unchanged.
"""
from __future__ import annotations

import asyncio
import json
from typing import Callable, Optional

from specc.io import human_size
from specc.serve.protocol import error_body

DEFAULT_MAX_REQUEST_BYTES = 4 << 20
"""``specc serve --max-request-bytes`` default: 4 MiB. A prompt as long as a 128k-token context is
well under 1 MiB of JSON; the limit only has to keep a careless or hostile client from making the
server parse, hold or tokenize megabytes it will refuse anyway."""
DRAIN_BYTES = 256 << 20
"""Most bytes of a refused body read and discarded so its client can read the 413."""
DRAIN_SECONDS = 30.0
"""Longest time spent discarding a refused body."""


class BodyLimit:
    """ASGI middleware refusing request bodies over ``limit`` bytes (module docstring).

    Args:
        app: the ASGI application. limit: the most body bytes accepted (>= 1).
        on_refuse: called once per refused request (a metrics counter).
    """

    def __init__(self, app, limit: int, on_refuse: Optional[Callable[[], None]] = None) -> None:
        self.app = app
        self.limit = int(limit)
        self.on_refuse = on_refuse

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = _content_length(headers.get(b"content-length"))
        if declared is not None and declared > self.limit:
            expect = headers.get(b"expect", b"").lower() == b"100-continue"
            await self._refuse(receive, send, declared, declared=True, drain=not expect)
            return
        chunks, total, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            total += len(body)
            if total > self.limit:
                await self._refuse(receive, send, total, declared=False, drain=msg.get("more_body", False))
                return
            chunks.append(body)
            more = msg.get("more_body", False)
        data = b"".join(chunks)
        chunks.clear()
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()  # after the body: the disconnect, as the server reports it

        await self.app(scope, replay, send)

    async def _refuse(self, receive, send, size: int, declared: bool, drain: bool) -> None:
        if self.on_refuse is not None:
            self.on_refuse()
        if drain:
            await _discard(receive, size)
        what = f"is {human_size(size)}" if declared else f"exceeds {human_size(self.limit)} (more than {size} bytes seen)"
        body = json.dumps(error_body(
            f"the request body {what}, over this server's limit of {human_size(self.limit)} "
            f"({self.limit} bytes, `specc serve --max-request-bytes`); send a shorter prompt, or restart the "
            f"server with a larger --max-request-bytes", "invalid_request_error", None, "request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_length(value: Optional[bytes]) -> Optional[int]:
    """The declared body size, or None when absent or not a number (the HTTP parser refuses the
    latter itself)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


async def _discard(receive, seen: int) -> None:
    """Read and drop the rest of a body: until its end, :data:`DRAIN_BYTES` or :data:`DRAIN_SECONDS`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    total = 0
    while total <= DRAIN_BYTES:
        left = deadline - loop.time()
        if left <= 0:
            return
        try:
            msg = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if msg["type"] != "http.request":
            return
        total += len(msg.get("body", b""))
        if not msg.get("more_body", False):
            return


def parse_size(text: str) -> int:
    """A byte count for ``--max-request-bytes``: ``4194304``, ``512KiB``, ``4MiB``, ``1GiB`` (also
    ``K``/``M``/``G``, powers of 1024). Raises ``ValueError`` for anything else or a count < 1."""
    t = str(text).strip()
    units = {"kib": 1 << 10, "k": 1 << 10, "mib": 1 << 20, "m": 1 << 20, "gib": 1 << 30, "g": 1 << 30, "b": 1, "": 1}
    num = t.rstrip("bBkKmMgGiI")
    unit = t[len(num):].lower()
    if unit not in units or not num.strip().isdigit():
        raise ValueError(f"expected a byte count such as 4194304, 512KiB or 4MiB, got {text!r}")
    n = int(num) * units[unit]
    if n < 1:
        raise ValueError(f"must be at least 1 byte, got {text!r}")
    return n
