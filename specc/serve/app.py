"""The FastAPI application of ``specc serve``: OpenAI's completions and chat completions (streaming
over server-sent events, or one JSON body), ``/v1/models``, ``/health``, ``/metrics``, the
prefill endpoint of disaggregated serving, and (suffix decoding) ``/v1/suffix/documents``.

Status codes: 400 for a bad request (a body that is empty or not JSON, a lone UTF-16 surrogate in a
string, an unknown field, a value of the wrong type or out of range, a prompt longer than
``max_model_len``, a sampling parameter the plan's verify rule cannot honour exactly), 404 for an
unknown model name or path, 405 for a method a path does not take, 408 for a request head or body
that arrives too slowly (:mod:`specc.serve.limits`), 413 for a body over
``--max-request-bytes`` (:mod:`specc.serve.limits`, before anything parses it) or a suffix
document past its bound, 429 when the engine's
queue is full, 500 for an internal failure of that request alone, 502 when the decode role cannot get
or install its prefill, 503 while the engine is down or when the shutdown deadline ends a request
(a stream then ends with an error event of code ``server_shutdown``: :class:`specc.serve.server.Server`). Every error body is OpenAI's
``{"error": {"message", "type", "param", "code"}}``.

The event loop only moves bytes: a body is parsed and validated (:func:`specc.serve.protocol.parse_body`)
and its prompt rendered and tokenized in a worker thread, and a text prompt is refused as too long
from its byte length alone when the tokenizer bounds the bytes per token
(:meth:`specc.models.tokenizer.Tokenizer.encode_within`), so a huge prompt costs neither a tokenizer
pass nor the time of other clients' streams.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specc.errors import PromptError, PromptTooLongError
from specc.runtime.request import Request, SamplingParams
from specc.serve.limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, BodyLimit
from specc.serve.loop import Interrupted
from specc.serve.protocol import (FINISH_REASONS, ApiError, ChatCompletionRequest, CompletionRequest,
                                  DocumentRequest, error_body, parse_body, validation_error_to_api)
from specc.serve.textstream import TextStream

ROLES = ("none", "prefill", "decode")


@dataclass
class ServerState:
    """Everything the handlers use.

    Attributes:
        runtime: the ``Runtime`` (read-only from handlers: tokenizer, limits, checks).
        loop: the ``EngineLoop``. metrics: ``ServeMetrics``.
        model_name: the served base model name; adapters: LoRA adapter names (also model names).
        role: ``none`` | ``prefill`` | ``decode``. prefill: the decode role's ``PrefillClient``.
        default_temperature: the temperature of a request that omits it: 0 for a plan that verifies
            greedily (the rule it was tuned for), else OpenAI's default, 1. Any request's temperature
            is served exactly: a greedy plan verifies a step with sampled rows by the standard rule
            (``specc.runtime.stages.accept_greedy``).
        info: facts for ``/v1/models`` and logs (artifact, plan hash, states).
        max_request_bytes: the largest request body accepted (bytes; larger ones get 413).
        body_timeout: seconds a body may take to arrive (plus 1 s per 500 bytes; slower: 408).
    """

    runtime: Any
    loop: Any
    metrics: Any
    model_name: str
    adapters: List[str] = field(default_factory=list)
    role: str = "none"
    prefill: Any = None
    default_temperature: float = 1.0
    info: Dict[str, Any] = field(default_factory=dict)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    created: int = field(default_factory=lambda: int(time.time()))


def _json_error(err: ApiError, headers: Optional[Dict[str, str]] = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def build_app(state: ServerState) -> FastAPI:
    """The application over ``state`` (its engine loop starts and stops with the app's lifespan)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.loop.start()
        if state.prefill is not None:
            await state.prefill.start()
        try:
            yield
        finally:
            if state.prefill is not None:
                await state.prefill.close()
            state.loop.stop()

    app = FastAPI(title="specc serve", lifespan=lifespan)
    app.state.specc = state
    app.add_middleware(BodyLimit, limit=state.max_request_bytes,
                       on_refuse=state.metrics.rejected.labels(reason="too_large").inc,
                       body_timeout=state.body_timeout, on_timeout=state.metrics.rejected.labels(reason="timeout").inc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        state.metrics.rejected.labels(reason="invalid").inc()
        return _json_error(validation_error_to_api(list(exc.errors())))

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        if exc.status in (400, 404):
            state.metrics.rejected.labels(reason="invalid").inc()
        return _json_error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return _json_error(_routing_error(app, request, exc), headers=exc.headers)

    def openapi() -> Dict[str, Any]:  # the bodies' own models (see _body_schema) into components
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for ops in schema.get("paths", {}).values():
                for op in ops.values():
                    comps.update(op.pop("x-components", None) or {})
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/health")
    async def health():
        if not state.loop.alive:
            return JSONResponse(error_body("the engine loop is not running", "server_error"), status_code=503)
        return {"status": "ok", "role": state.role, "running": state.runtime.num_running,
                "waiting": state.runtime.num_waiting}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        base = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specc",
                "root": state.model_name, "parent": None, "max_model_len": state.runtime.max_model_len}
        data = [base] + [{"id": a, "object": "model", "created": state.created, "owned_by": "specc", "root": a,
                          "parent": state.model_name, "max_model_len": state.runtime.max_model_len}
                         for a in state.adapters]
        return {"object": "list", "data": data}

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(http: HttpRequest):
        _serving_role(state)
        body = await asyncio.to_thread(parse_body, await http.body(), CompletionRequest)
        body.refuse_unsupported()
        adapter = _adapter(state, body.model)
        prompt_ids = await asyncio.to_thread(_completion_prompt, state, body)
        req = _request(state, body, prompt_ids, adapter, "prompt")
        return await _run(state, http, body, req, chat=False)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(http: HttpRequest):
        _serving_role(state)
        body = await asyncio.to_thread(parse_body, await http.body(), ChatCompletionRequest)
        body.refuse_unsupported()
        adapter = _adapter(state, body.model)
        prompt_ids = await asyncio.to_thread(_chat_prompt, state, body)
        req = _request(state, body, prompt_ids, adapter, "messages")
        return await _run(state, http, body, req, chat=True)

    if hasattr(state.runtime.drafter, "add_document"):
        add_document_route(app, state)
    if state.role == "prefill":
        from specc.serve.disagg_client import add_prefill_route

        add_prefill_route(app, state)
    return app


def _body_schema(model) -> Dict[str, Any]:
    """The OpenAPI request body of an endpoint that reads its body itself (``/docs`` shows the fields)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "x-components": defs}


def _routing_error(app: FastAPI, request, exc) -> ApiError:
    """404 / 405 (and any other HTTP error the router raises) as OpenAI's error object."""
    if exc.status_code == 404:
        paths = sorted({r.path for r in app.routes if getattr(r, "include_in_schema", False)})
        return ApiError(404, f"no such path: {request.method} {request.url.path}; this server serves "
                             f"{', '.join(paths)}", None, type="not_found_error", code="not_found")
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow") or "another method"
        return ApiError(405, f"{request.method} is not allowed on {request.url.path}; use {allowed}", None,
                        code="method_not_allowed")
    return ApiError(exc.status_code, str(exc.detail), None,
                    type="invalid_request_error" if exc.status_code < 500 else "server_error")


def add_document_route(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/suffix/documents``: add a document to suffix decoding's global tree while the server
    decodes (corpus drafting). Tokenizing and inserting run in a worker thread; the drafter inserts
    under its lock, a bounded chunk at a time, so decoding steps go on between chunks. 400 for a bad
    body, 413 past ``MAX_DOCUMENT_BYTES`` or past the plan's ``method.suffix.max_corpus_tokens`` (the
    message names the bound), 200 with the tokens added and the corpus size."""
    from specc.methods.suffix.corpus import CorpusTooLarge

    @app.post("/v1/suffix/documents", openapi_extra=_body_schema(DocumentRequest))
    async def add_document(http: HttpRequest):
        rt = state.runtime
        body = await asyncio.to_thread(parse_body, await http.body(), DocumentRequest)
        body.check(rt.vocab_size)

        def work():
            ids = list(body.token_ids) if body.token_ids is not None else rt.tokenizer.encode(body.text)
            return rt.drafter.add_document(ids, what=f"document {body.id or ''}".strip())

        try:
            info = await asyncio.to_thread(work)
        except CorpusTooLarge as exc:
            raise ApiError(413, str(exc), "text" if body.text is not None else "token_ids",
                           code="corpus_full") from None
        state.metrics.documents.inc()
        return {"object": "suffix.document", "id": body.id, **info}


# ------------------------------------------------------------------------------------ request building
def _serving_role(state: ServerState) -> None:
    if state.role == "prefill":
        raise ApiError(400, "this is a prefill instance (--role prefill); send completions to the decode "
                            "instance", None, code="wrong_role")


def _adapter(state: ServerState, model: str) -> Optional[str]:
    if model == state.model_name:
        return None
    if model in state.adapters:
        return model
    known = ", ".join([state.model_name] + list(state.adapters))
    shown = repr(model) if len(model) <= 80 else f"{model[:60]!r}... ({len(model)} characters)"
    raise ApiError(404, f"the model {shown} does not exist; this server serves {known}", "model",
                   type="not_found_error", code="model_not_found")


def _completion_prompt(state: ServerState, body: CompletionRequest) -> List[int]:
    """The prompt's token ids (a worker thread runs this: tokenizing takes time). A text prompt that
    provably has ``max_model_len`` tokens or more is refused without being tokenized."""
    p = body.prompt
    if isinstance(p, list) and p and isinstance(p[0], (list, str)):
        if len(p) != 1:
            raise ApiError(400, f"{len(p)} prompts in one request: send one prompt per request", "prompt")
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise ApiError(400, "prompt is empty", "prompt")
        tok = state.runtime.tokenizer
        if not hasattr(tok, "encode_within"):
            return tok.encode(p)
        try:
            return tok.encode_within(p, state.runtime.max_model_len - 1)
        except PromptTooLongError as exc:
            raise _too_long("prompt", exc, state.runtime.max_model_len) from None
    if not p:
        raise ApiError(400, "prompt is empty", "prompt")
    return [int(t) for t in p]


def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> List[int]:
    """The conversation's token ids under the chat template (in a worker thread, bounded as
    :func:`_completion_prompt`)."""
    tok = state.runtime.tokenizer
    try:
        if hasattr(tok, "chat_within"):
            return tok.chat_within(body.chat(), state.runtime.max_model_len - 1)
        return tok.apply_chat_template(body.chat())
    except PromptTooLongError as exc:
        raise _too_long("messages", exc, state.runtime.max_model_len) from None
    except PromptError as exc:
        raise ApiError(400, str(exc), "messages") from None
    except Exception as exc:  # the template itself refused the conversation (e.g. role order)
        raise ApiError(400, f"the chat template rejects these messages ({type(exc).__name__}: {exc})",
                       "messages") from None


def _too_long(field_name: str, exc: "PromptTooLongError", max_model_len: int) -> ApiError:
    return ApiError(400, f"{field_name} has {exc}, max_model_len is {max_model_len}: no room to generate; "
                         f"shorten it", field_name, code="context_length_exceeded")


def _request(state: ServerState, body, prompt_ids: List[int], adapter: Optional[str], prompt_field: str) -> Request:
    rt = state.runtime
    n = len(prompt_ids)
    if n == 0:
        raise ApiError(400, f"{prompt_field} encodes to no tokens", prompt_field)
    if n >= rt.max_model_len:
        raise ApiError(400, f"{prompt_field} has {n} tokens, max_model_len is {rt.max_model_len}: no room to "
                            f"generate; shorten it", prompt_field, code="context_length_exceeded")
    bad = [t for t in prompt_ids if not 0 <= t < rt.vocab_size]
    if bad:
        raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary [0, {rt.vocab_size})", prompt_field)
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
    field_name = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
    room = rt.max_model_len - n
    if max_tokens is None:
        max_tokens = room
    elif max_tokens > room:
        raise ApiError(400, f"{field_name}={max_tokens} plus the {n} prompt tokens exceeds max_model_len="
                            f"{rt.max_model_len}; ask for at most {room}", field_name, code="context_length_exceeded")
    temperature = body.temperature
    if temperature is None:
        temperature = state.default_temperature
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    params = SamplingParams(max_new_tokens=int(max_tokens), temperature=float(temperature),
                            top_p=float(body.top_p) if body.top_p is not None else 1.0, top_k=int(top_k),
                            seed=body.seed, stop=tuple(body.stop_list()))
    req = Request(prompt_ids=list(prompt_ids), params=params, adapter=adapter,
                  request_id=f"{'chatcmpl' if prompt_field == 'messages' else 'cmpl'}-{uuid.uuid4().hex[:24]}")
    try:
        rt.check_request(req)
    except PromptError as exc:
        raise ApiError(400, str(exc), None) from None
    return req


# ------------------------------------------------------------------------------------ running a request
async def _run(state: ServerState, http: HttpRequest, body, req: Request, chat: bool):
    t_arrival = time.perf_counter()
    if state.loop.full():
        state.metrics.rejected.labels(reason="queue_full").inc()
        raise ApiError(429, f"the server's queue is full ({state.loop.capacity} requests in flight); retry later",
                       None, type="rate_limit_error", code="queue_full")
    prefilled = None
    if state.role == "decode":
        prefilled = await state.prefill.fetch(req)
    handle, events = state.loop.submit(req, prefilled=prefilled)
    model = req.adapter or state.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(state, handle, events, req, model, chat, include_usage, t_arrival),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    out, first = await _wait(state, http, handle, events)
    if out is None:  # the client went away: nothing to answer
        return Response(status_code=499)
    if isinstance(out, Interrupted):
        raise ApiError(503, out.message, None, type="server_error", code="server_shutdown")
    _observe_latency(state, model, t_arrival, first, out)
    if out.finish_reason == "error":
        raise ApiError(500, f"this request failed inside the engine ({out.error}); other requests are unaffected",
                       None, type="server_error", code="internal_error")
    text = out.text
    reason = FINISH_REASONS.get(out.finish_reason, out.finish_reason)
    usage = {"prompt_tokens": len(req.prompt_ids), "completion_tokens": len(out.token_ids),
             "total_tokens": len(req.prompt_ids) + len(out.token_ids)}
    spec = dict(out.counters.as_dict())
    created = int(time.time())
    if chat:
        return {"id": req.request_id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": reason}], "usage": usage, "spec_decode": spec}
    return {"id": req.request_id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
            "usage": usage, "spec_decode": spec}


async def _wait(state: ServerState, http: HttpRequest, handle: int, events: "asyncio.Queue"):
    """The final output of a non-streamed request, None when the client disconnected first (its
    row is then freed), or the :class:`Interrupted` event that ended it. Also returns the time of
    its first token."""
    first = None

    async def result():
        nonlocal first
        while True:
            ev = await events.get()
            if isinstance(ev, Interrupted):
                state.loop.cancel(handle)
                return ev
            if ev.token_ids and first is None:
                first = time.perf_counter()
            if ev.output is not None:
                return ev.output

    async def disconnected():
        while True:
            msg = await http.receive()
            if msg.get("type") == "http.disconnect":
                return None

    waiter = asyncio.ensure_future(result())
    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        waiter.cancel()
        watcher.cancel()
        state.loop.cancel(handle)
        raise
    watcher.cancel()
    if waiter in done:
        return waiter.result(), first
    waiter.cancel()
    state.loop.cancel(handle)
    return None, first


def _observe_latency(state: ServerState, model: str, t_arrival: float, first: Optional[float], out) -> None:
    now = time.perf_counter()
    m = state.metrics
    if first is not None:
        m.ttft.labels(model_name=model).observe(first - t_arrival)
        n = len(out.token_ids)
        if n > 1:
            m.tpot.labels(model_name=model).observe((now - first) / (n - 1))
    m.e2e.labels(model_name=model).observe(now - t_arrival)


def _sse(obj: Dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _stream(state: ServerState, handle: int, events: "asyncio.Queue", req: Request, model: str, chat: bool,
                  include_usage: bool, t_arrival: float) -> AsyncIterator[str]:
    """Server-sent events of one request: a chunk per step with new text, a last chunk with the
    finish reason, an optional usage chunk, then ``[DONE]``; interrupted by the shutdown deadline,
    an error event (code ``server_shutdown``) and ``[DONE]``. Cancelled (client gone) or interrupted:
    frees the row."""
    rt = state.runtime
    text = TextStream(rt.tokenizer, rt.eos_token_ids, req.params.stop)
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    finished = False
    first = None

    def chunk(delta: Optional[str], reason: Optional[str], role: bool = False) -> Dict[str, Any]:
        if chat:
            d: Dict[str, Any] = {}
            if role:
                d["role"] = "assistant"
            if delta is not None:
                d["content"] = delta
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": reason}
        return {"id": req.request_id, "object": obj, "created": created, "model": model, "choices": [choice]}

    try:
        if chat:
            yield _sse(chunk("", None, role=True))
        while True:
            ev = await events.get()
            if isinstance(ev, Interrupted):  # the shutdown deadline: a final error event (finally frees the row)
                yield _sse(error_body(ev.message, "server_error", None, "server_shutdown"))
                yield "data: [DONE]\n\n"
                return
            if ev.token_ids and first is None:
                first = time.perf_counter()
            if ev.output is None:
                delta = text.push(ev.token_ids)
                if delta:
                    yield _sse(chunk(delta, None))
                continue
            finished = True
            out = ev.output
            _observe_latency(state, model, t_arrival, first, out)
            if out.finish_reason == "error":
                yield _sse(error_body(f"this request failed inside the engine ({out.error}); other requests are "
                                      f"unaffected", "server_error", None, "internal_error"))
                yield "data: [DONE]\n\n"
                return
            rest = text.finish(out.text)  # the final text (cut at a stop string) is known now
            reason = FINISH_REASONS.get(out.finish_reason, out.finish_reason)
            if rest:
                yield _sse(chunk(rest, None))
            yield _sse(chunk(None if chat else "", reason))
            if include_usage:
                n = len(out.token_ids)
                yield _sse({"id": req.request_id, "object": obj, "created": created, "model": model, "choices": [],
                            "usage": {"prompt_tokens": len(req.prompt_ids), "completion_tokens": n,
                                      "total_tokens": len(req.prompt_ids) + n}})
            yield "data: [DONE]\n\n"
            return
    finally:
        if not finished:  # the client disconnected (or the response was cancelled): free the row
            state.loop.cancel(handle)
