"""Disaggregated serving over loopback HTTP: the prefill role's endpoint and the decode role's client.

The decode instance takes the OpenAI requests. For each one it posts the prompt's token ids, its
sampling parameters and adapter to the prefill instance's ``POST /disagg/v1/prefill``; the prefill
instance runs the prompt through its own engine loop (batched with other prefills), exports the
payload (:mod:`specc.runtime.disagg`: prompt KV, first token, the method's seed) and answers it as
one safetensors body. The decode instance checks it on arrival (:func:`decode_payload`) and submits
the request with it, so admission installs the KV and seed instead of running the prompt and the
first decode step already speculates. A payload that fails a check fails that request alone (502).
"""
from __future__ import annotations

import asyncio
from typing import Dict, List, Optional

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from specc.runtime import disagg
from specc.runtime.request import Request, SamplingParams
from specc.serve.loop import Interrupted
from specc.serve.protocol import ApiError, error_body

PATH = "/disagg/v1/prefill"


class PrefillBody(BaseModel):
    """What the decode instance asks the prefill instance to run."""

    model_config = ConfigDict(extra="forbid")
    version: int = disagg.VERSION
    request_id: str = ""
    prompt_token_ids: List[int] = Field(..., min_length=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: Optional[int] = None
    max_tokens: int = Field(1, ge=1)
    stop: List[str] = Field(default_factory=list)
    adapter: Optional[str] = None


def add_prefill_route(app: FastAPI, state) -> None:
    """Add ``POST /disagg/v1/prefill`` to the prefill instance's app."""

    @app.post(PATH)
    async def prefill(body: PrefillBody):
        if body.version not in disagg.SUPPORTED_VERSIONS:
            raise ApiError(400, f"disaggregation version {body.version} is not one this prefill instance speaks "
                                f"{disagg.SUPPORTED_VERSIONS}", "version")
        if body.adapter is not None and body.adapter not in state.adapters:
            raise ApiError(404, f"adapter {body.adapter!r} is not loaded on the prefill instance", "adapter",
                           type="not_found_error")
        params = SamplingParams(max_new_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                                top_k=body.top_k, seed=body.seed, stop=tuple(body.stop))
        req = Request(prompt_ids=list(body.prompt_token_ids), params=params, adapter=body.adapter,
                      request_id=body.request_id)
        try:
            state.runtime.check_request(req)
        except Exception as exc:
            raise ApiError(400, str(exc), "prompt_token_ids") from None
        if state.loop.full():
            state.metrics.rejected.labels(reason="queue_full").inc()
            raise ApiError(429, "the prefill instance's queue is full", None, type="rate_limit_error")
        handle, events = state.loop.submit(req, prefill_only=True)
        try:
            while True:
                ev = await events.get()
                if isinstance(ev, Interrupted):
                    state.loop.cancel(handle)
                    raise ApiError(503, ev.message, None, type="server_error", code="server_shutdown")
                if ev.output is not None:
                    break
        except asyncio.CancelledError:
            state.loop.cancel(handle)
            raise
        if ev.payload is None:
            raise ApiError(500, f"prefill failed: {ev.output.error or ev.output.finish_reason}", None,
                           type="server_error")
        data = disagg.encode_payload(ev.payload)
        for part, n in ev.payload.nbytes().items():
            if part != "total":
                state.metrics.disagg_bytes.labels(part=part).inc(n)
        return Response(data, media_type="application/octet-stream",
                        headers={"x-specc-disagg-version": str(disagg.VERSION)})


class PrefillClient:
    """The decode role's connection to its prefill instance (``httpx.AsyncClient`` over loopback).

    Args: url (``http://127.0.0.1:PORT``), runtime (for the checks on arrival), metrics, timeout_s.
    """

    def __init__(self, url: str, runtime, metrics, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.runtime = runtime
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.client = None
        self.last_bytes: Dict[str, int] = {}

    async def start(self) -> None:
        import httpx

        self.client = httpx.AsyncClient(timeout=self.timeout_s)
        disagg.model_fingerprint(self.runtime.target)  # computed once, before requests arrive

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def fetch_bytes(self, req: Request) -> bytes:
        """The prefill instance's payload for ``req``. Raises ApiError(502) when it cannot be had."""
        import httpx

        p = req.params
        body = {"version": disagg.VERSION, "request_id": req.request_id, "prompt_token_ids": list(req.prompt_ids),
                "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "seed": p.seed,
                "max_tokens": p.max_new_tokens, "stop": list(p.stop), "adapter": req.adapter}
        try:
            r = await self.client.post(self.url + PATH, json=body)
        except httpx.HTTPError as exc:
            self.metrics.rejected.labels(reason="disagg").inc()
            raise ApiError(502, f"the prefill instance at {self.url} is unreachable ({type(exc).__name__}: {exc})",
                           None, type="disaggregation_error") from None
        if r.status_code != 200:
            self.metrics.rejected.labels(reason="disagg").inc()
            try:
                detail = r.json()["error"]["message"]
            except Exception:
                detail = r.text[:200]
            raise ApiError(502 if r.status_code >= 500 else r.status_code,
                           f"the prefill instance refused the request ({r.status_code}: {detail})", None,
                           type="disaggregation_error")
        return r.content

    async def fetch(self, req: Request) -> disagg.Prefilled:
        """Fetch and check ``req``'s payload (:func:`specc.runtime.disagg.decode_payload`).
        Raises ApiError(502) naming the failed check."""
        data = await self.fetch_bytes(req)
        return await self.check(data, req)

    async def check(self, data: bytes, req: Request) -> disagg.Prefilled:
        try:
            payload = await asyncio.to_thread(disagg.decode_payload, data, self.runtime, list(req.prompt_ids),
                                              req.adapter)
        except disagg.PayloadError as exc:
            self.metrics.rejected.labels(reason="disagg").inc()
            raise ApiError(502, str(exc), None, type="disaggregation_error", code="bad_payload") from None
        sizes = payload.nbytes()
        self.last_bytes = sizes
        for part, n in sizes.items():
            if part != "total":
                self.metrics.disagg_bytes.labels(part=part).inc(n)
        return payload
