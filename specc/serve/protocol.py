"""OpenAI-compatible request bodies (pydantic, unknown fields refused), their translation into runtime
requests, and OpenAI-style error bodies.

Bodies follow OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (and vLLM's ``top_k`` and
``seed`` extensions). Fields this server cannot honour are refused with a 400 naming the field rather
than silently ignored: ``n > 1``, ``best_of > 1``, ``echo``, ``logprobs``, ``suffix``, non-zero
presence/frequency penalties and ``logit_bias`` (they would change the output distribution, which
speculative verification must reproduce exactly), and any unknown field.
"""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "max_model_len": "length"}
"""Runtime finish reasons → OpenAI's ``finish_reason``."""


class ApiError(Exception):
    """An error answered with an OpenAI-style body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 type: str = "invalid_request_error", code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> Dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> Dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Body):
    """Fields shared by both endpoints."""

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=-1)
    seed: Optional[int] = Field(None, ge=0, lt=2 ** 63)
    stop: Optional[Union[str, List[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: Optional[Dict[str, float]] = None
    user: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if v is None:
            return v
        items = [v] if isinstance(v, str) else v
        if len(items) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in items):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    def stop_list(self) -> List[str]:
        return [] if self.stop is None else ([self.stop] if isinstance(self.stop, str) else list(self.stop))

    def refuse_unsupported(self) -> None:
        """Raise ApiError(400) naming a field whose value this server cannot honour."""
        if self.n != 1:
            raise ApiError(400, f"n={self.n}: one choice per request only; send n separate requests", "n")
        if self.presence_penalty or self.frequency_penalty:
            field = "presence_penalty" if self.presence_penalty else "frequency_penalty"
            raise ApiError(400, f"{field} is not supported (penalties change the target distribution that "
                                f"speculative verification reproduces); leave it 0", field)
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported; leave it unset", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options needs stream=true", "stream_options")


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` is text or token ids (one prompt per request)."""

    prompt: Union[str, List[int], List[str], List[List[int]]]
    echo: bool = False
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise ApiError(400, "echo=true is not supported", "echo")
        if self.logprobs is not None:
            raise ApiError(400, "logprobs is not supported", "logprobs")
        if self.best_of not in (None, 1):
            raise ApiError(400, f"best_of={self.best_of} is not supported (one sample per request)", "best_of")
        if self.suffix:
            raise ApiError(400, "suffix (insertion) is not supported", "suffix")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: Union[str, List[TextPart]]
    name: Optional[str] = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: the chat template of the target's tokenizer is applied."""

    messages: List[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs or self.top_logprobs is not None:
            raise ApiError(400, "logprobs is not supported", "logprobs")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not two different values",
                           "max_completion_tokens")

    def chat(self) -> List[Dict[str, str]]:
        """The messages as ``[{"role", "content"}]`` (``developer`` is OpenAI's new name of ``system``)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


MAX_DOCUMENT_BYTES = 8 << 20
"""The largest document text one ``POST /v1/suffix/documents`` takes (UTF-8 bytes; the tokens it may
add are bounded by the plan's ``method.suffix.max_corpus_tokens``)."""


class DocumentRequest(_Body):
    """A document for suffix decoding's global tree (corpus drafting): ``text`` (tokenized with the
    target's tokenizer, no special tokens added) or ``token_ids``, and an optional ``id`` for logs."""

    text: Optional[str] = None
    token_ids: Optional[List[int]] = None
    id: Optional[str] = Field(None, max_length=200)

    def check(self, vocab_size: int) -> None:
        """Raise ApiError naming the field: neither or both of text / token_ids, an empty document, text
        past :data:`MAX_DOCUMENT_BYTES`, a token id outside the vocabulary."""
        if (self.text is None) == (self.token_ids is None):
            raise ApiError(400, "give the document as exactly one of 'text' or 'token_ids'", "text")
        if self.text is not None:
            n = len(self.text.encode("utf-8"))
            if n > MAX_DOCUMENT_BYTES:
                raise ApiError(413, f"text: {n} bytes exceed the server's limit of {MAX_DOCUMENT_BYTES} bytes per "
                                    f"document; split it into several documents", "text", code="document_too_large")
            if not self.text.strip():
                raise ApiError(400, "text: the document is empty", "text")
        else:
            if not self.token_ids:
                raise ApiError(400, "token_ids: the document is empty", "token_ids")
            bad = [t for t in self.token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ApiError(400, f"token_ids: {bad[0]} is outside the vocabulary [0, {vocab_size})", "token_ids")


def validation_error_to_api(errors: List[Dict[str, Any]]) -> ApiError:
    """FastAPI's ``RequestValidationError.errors()`` as one 400 naming the first bad field."""
    if not errors:
        return ApiError(400, "invalid request body")
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    # pydantic names union members in the location (e.g. stop.str); keep the field path
    param = ".".join(x for x in loc if not x.startswith(("str", "list[", "function-"))) or None
    if first.get("type") == "extra_forbidden":
        msg = f"unknown field {param!r}; this server takes OpenAI's fields (see /docs)"
    elif first.get("type") == "missing":
        msg = f"field {param!r} is required"
    elif first.get("type") in ("json_invalid", "model_attributes_type"):
        msg = f"the body is not a JSON object ({first.get('msg')})"
        param = None
    else:
        msg = f"{param}: {first.get('msg')} (got {first.get('input')!r})" if param else str(first.get("msg"))
    more = len(errors) - 1
    if more:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ApiError(400, msg, param)
