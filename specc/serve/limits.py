"""What one request may cost ``specc serve`` in bytes and in time.

**Bytes.** An ASGI middleware answers a body over the limit with a 413 in OpenAI's error format
before any handler runs, so no JSON parser, pydantic model or tokenizer ever sees it.

A ``Content-Length`` over the limit is refused from the header alone; a body without one (chunked)
is counted as it arrives and refused at the first byte past the limit. Either way the rest of the
body is read and thrown away, up to :data:`DRAIN_BYTES` and :data:`DRAIN_SECONDS`, before the answer
goes out with ``Connection: close``: a client that writes its whole body before it reads (httpx,
requests, the ``openai`` client) then reads the 413 instead of a reset connection (the "lingering
close" of HTTP/1.1 servers, RFC 9112 §9.6). A client that sent ``Expect: 100-continue`` gets the 413
without sending its body at all. Bodies within the limit are buffered (at most ``limit`` bytes) and
handed to the application unchanged. The request head (request line and headers) is bounded by h11's
own limit on an incomplete event (16 KiB, uvicorn's default ``h11_max_incomplete_event_size``).

**Time.** uvicorn bounds the idle time between requests on a kept-alive connection
(``timeout_keep_alive``) and nothing else, so a client that connects and sends its head or its body
a byte at a time would hold a connection forever. :class:`HeaderTimeoutProtocol` (uvicorn's h11
protocol) closes a connection whose request head has not arrived within ``header_timeout`` seconds
of its first byte (of the connection, for a new one), answering 408; :class:`BodyLimit` answers 408
when a body has not arrived within ``body_timeout`` seconds plus one second per
:data:`MIN_BODY_RATE` bytes received, the rule of Apache's ``mod_reqtimeout``
(``body=20,MinRate=500``). Both answer with ``Connection: close``; other connections never wait on
them (everything here is asynchronous).
"""
from __future__ import annotations

import asyncio
import json
import socket
import urllib.parse
from typing import Callable, Optional

from specc.errors import SpeccError
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
DEFAULT_HEADER_TIMEOUT = 20.0
"""``specc serve --header-timeout`` default (seconds): Apache ``mod_reqtimeout``'s first header timeout."""
DEFAULT_BODY_TIMEOUT = 20.0
"""``specc serve --body-timeout`` default (seconds, extended by :data:`MIN_BODY_RATE`): Apache's ``body=20``."""
MIN_BODY_RATE = 500
"""Bytes per second a body must keep arriving at to extend its deadline (Apache's ``MinRate=500``)."""
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
"""``specc serve --shutdown-timeout`` default (seconds): how long SIGTERM waits for requests in flight."""
DEFAULT_KEEP_ALIVE_TIMEOUT = 5
"""``specc serve --keep-alive-timeout`` default (seconds): uvicorn's own ``timeout_keep_alive`` default."""


class BodyLimit:
    """ASGI middleware refusing request bodies over ``limit`` bytes, and bodies that arrive slower
    than ``body_timeout`` seconds plus one per :data:`MIN_BODY_RATE` bytes (module docstring).

    Args:
        app: the ASGI application. limit: the most body bytes accepted (>= 1).
        on_refuse: called once per request refused for its size (a metrics counter).
        body_timeout: seconds (> 0). on_timeout: called once per request refused for its time.
    """

    def __init__(self, app, limit: int, on_refuse: Optional[Callable[[], None]] = None,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT, on_timeout: Optional[Callable[[], None]] = None) -> None:
        self.app = app
        self.limit = int(limit)
        self.on_refuse = on_refuse
        self.body_timeout = float(body_timeout)
        self.on_timeout = on_timeout

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
        loop = asyncio.get_running_loop()
        start = loop.time()
        chunks, total, more = [], 0, True
        while more:
            left = start + self.body_timeout + total / MIN_BODY_RATE - loop.time()
            try:
                msg = await asyncio.wait_for(receive(), max(left, 0.0))
            except asyncio.TimeoutError:
                await self._too_slow(send, total)
                return
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


    async def _too_slow(self, send, received: int) -> None:
        if self.on_timeout is not None:
            self.on_timeout()
        body = json.dumps(error_body(
            f"the request body did not arrive in time ({received} bytes in {self.body_timeout:g} s plus 1 s per "
            f"{MIN_BODY_RATE} bytes, `specc serve --body-timeout`); send the whole body at once",
            "invalid_request_error", None, "request_timeout")).encode()
        await send({"type": "http.response.start", "status": 408,
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


def check_http_url(url: str, flag: str = "--prefill-url") -> str:
    """``url`` if it is an ``http`` or ``https`` URL with a host (and a valid port, no user info,
    query or fragment: it is a base the server appends paths to). Raises SpeccError naming ``flag``."""
    shown = url if len(url) <= 100 else f"{url[:80]}... ({len(url)} characters)"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SpeccError(f"{flag} {shown!r}: not a URL ({exc}); give http://HOST:PORT, e.g. http://127.0.0.1:8001") \
            from None
    if parts.scheme not in ("http", "https"):
        raise SpeccError(f"{flag} {shown!r}: the scheme must be http or https, not {parts.scheme or 'none'!r}; give "
                         f"http://HOST:PORT, e.g. http://127.0.0.1:8001")
    if not parts.hostname:
        raise SpeccError(f"{flag} {shown!r}: no host; give http://HOST:PORT, e.g. http://127.0.0.1:8001")
    if parts.username is not None or parts.query or parts.fragment:
        raise SpeccError(f"{flag} {shown!r}: user info, a query or a fragment has no place in a server's base URL; "
                         f"give http://HOST:PORT")
    if port == 0:
        raise SpeccError(f"{flag} {shown!r}: port 0 is no server's port")
    return url


def check_listen(host: str, port: int) -> None:
    """Refuse ``--host`` / ``--port`` this process cannot listen on, before any model loads: a host
    that does not resolve, an address that is not this machine's, a port in use or reserved. The
    test socket is closed at once (uvicorn binds with ``SO_REUSEADDR`` too). Raises SpeccError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise SpeccError(f"--host {host!r}: does not resolve to an address ({exc}); give an address of this machine, "
                         f"e.g. 127.0.0.1") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise SpeccError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); pick a free "
                             f"port (or an address of this machine)") from None


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


def header_timeout_protocol(seconds: float) -> type:
    """:class:`HeaderTimeoutProtocol` with ``header_timeout = seconds``, for ``uvicorn.Config(http=...)``."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": float(seconds)})


def _h11_protocol() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


class HeaderTimeoutProtocol(_h11_protocol()):
    """uvicorn's h11 protocol whose connections must deliver each request head (request line and
    headers) within ``header_timeout`` seconds of its first byte, or of connecting for the first
    request; otherwise the server answers 408 and closes the connection. Idle time between requests
    stays uvicorn's ``timeout_keep_alive``."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    _RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                 b"content-length: %d\r\n\r\n%s")

    def connection_made(self, transport) -> None:  # noqa: D102 - asyncio.Protocol
        self._head_timer = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:  # noqa: D102
        super().data_received(data)
        import h11

        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._head_timer is None:
                self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc) -> None:  # noqa: D102
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        import h11

        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        body = json.dumps(error_body(f"the request head did not arrive within {self.header_timeout:g} s "
                                     f"(`specc serve --header-timeout`)", "invalid_request_error", None,
                                     "request_timeout")).encode()
        self.transport.write(self._RESPONSE % (len(body), body))
        self.transport.close()
