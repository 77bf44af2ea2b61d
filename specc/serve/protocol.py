"""OpenAI-compatible request bodies (pydantic, unknown fields refused, strict types), reading them from
the raw body (:func:`parse_body`), and OpenAI-style error bodies.

Bodies follow OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (and vLLM's ``top_k`` and
``seed`` extensions). Fields this server cannot honour are refused with a 400 naming the field rather
than silently ignored: ``n > 1``, ``best_of > 1``, ``echo``, ``logprobs``, ``suffix``, non-zero
presence/frequency penalties and ``logit_bias`` (they would change the output distribution, which
speculative verification must reproduce exactly), a ``response_format`` other than ``{"type":
"text"}`` (JSON mode and JSON schemas need constrained decoding, a grammar backend such as vLLM's
xgrammar, which specc serve does not have), chat ``tools`` and a ``tool_choice`` other than
``"none"`` (no tool-call parser), and any unknown field. Types are strict, as
OpenAI's API checks them: ``max_tokens: true`` or ``"4"`` and ``stream: "yes"`` are 400s naming the
field, never converted (pydantic's strict mode; an integer is still a valid number).
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Optional, Tuple, Type, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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
    model_config = ConfigDict(extra="forbid", strict=True)


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
    response_format: Optional[Dict[str, Any]] = None

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
        if self.response_format is not None:
            kind = self.response_format.get("type")
            if kind in ("json_object", "json_schema"):
                raise ApiError(400, f"response_format type {kind!r} needs constrained decoding (a grammar backend, as "
                                    f"vLLM's xgrammar), and specc serve has no grammar backend; drop response_format "
                                    f"or send {{\"type\": \"text\"}}", "response_format")
            if kind != "text":
                raise ApiError(400, f"response_format.type must be 'text' (got {_preview(kind)}); specc serve "
                                    f"answers plain text only", "response_format.type")


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
    tools: Optional[List[Any]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools:
            raise ApiError(400, "tools: specc serve has no tool calling (no tool-call parser, no grammar backend); "
                                "drop tools", "tools")
        if self.tool_choice is not None and self.tool_choice != "none":
            raise ApiError(400, f"tool_choice={_preview(self.tool_choice)}: specc serve has no tool calling; drop "
                                f"tool_choice or send \"none\"", "tool_choice")
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


def _preview(value: Any, width: int = 60) -> str:
    """``value`` as the JSON the client sent, cut to ``width`` characters (error messages never echo
    a whole prompt back)."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= width else text[:width] + f"... ({len(text)} characters)"


#: pydantic's names of the members of ``prompt``'s union, as a user would say them
_FORMS = {"str": "a string", "list[int]": "a list of token ids", "list[str]": "a list of strings",
          "list[list[int]]": "a list of token-id lists", "list[TextPart]": "a list of text parts"}


_SCALARS = ("str", "int", "float", "bool", "none")


def _member(part: str) -> bool:
    """Whether a location element is pydantic's tag of a union member (``str``, ``list[int]``), not a field."""
    return part in _FORMS or part in _SCALARS or part.startswith(("list[", "dict[", "function-", "literal["))


def _split_loc(err: Dict[str, Any]) -> Tuple[str, Optional[str]]:
    """(the field's dotted path, the union member tried or None) of one pydantic error."""
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    at = next((i for i, x in enumerate(loc) if _member(x)), None)
    return ".".join(loc if at is None else loc[:at]), (None if at is None else loc[at])


def validation_error_to_api(errors: List[Dict[str, Any]]) -> ApiError:
    """pydantic's ``ValidationError.errors()`` (or FastAPI's ``RequestValidationError.errors()``) as
    one 400 naming the first bad field: ``param`` is its dotted path (``messages.0.content``), the
    message says what it must be and shows what was sent (cut short); a value matching no member of
    a union (``prompt``) names the forms it may take."""
    if not errors:
        return ApiError(400, "invalid request body")
    first = errors[0]
    param, member = _split_loc(first)
    param = param or None
    kind = first.get("type")
    union = [e for e in errors if _split_loc(e)[0] == (param or "") and _split_loc(e)[1] is not None] \
        if member is not None else []
    forms = [_split_loc(e)[1] for e in union]
    if kind == "extra_forbidden":
        msg = f"unknown field {param!r}; this server takes OpenAI's fields (see /docs)"
    elif kind == "missing":
        msg = f"field {param!r} is required"
    elif kind in ("json_invalid", "model_attributes_type", "model_type", "dict_type") and not param:
        msg = f"the body must be a JSON object with the request's fields, got {_preview(first.get('input'))}"
    elif len(union) > 1 and all(f in _FORMS for f in forms):
        want = " or ".join(dict.fromkeys(_FORMS[f] for f in forms))
        msg = f"{param} must be {want} (got {_preview(first.get('input'))})"
    else:
        msg = f"{param}: {first.get('msg')} (got {_preview(first.get('input'))})" if param else str(first.get("msg"))
    more = len(errors) - max(1, len(union))
    if more > 0:
        msg += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ApiError(400, msg, param)


# ------------------------------------------------------------------------------------ reading a body
def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (RFC 8259); send a finite number")


def _lone_surrogate(obj: Any) -> Optional[Tuple[Optional[str], int, str, str]]:
    """The first string or object key of parsed JSON holding a lone UTF-16 surrogate (``"\\ud800"``
    without its pair): ``(dotted path or None at the top, character index, the surrogate as \\uXXXX,
    "a string" or "a field name")``, else None. Python's JSON parser accepts such escapes; no
    tokenizer or UTF-8 encoder can take them."""
    stack: List[Tuple[Any, Tuple[str, ...]]] = [(obj, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            at = _surrogate_at(value)
            if at is not None:
                return ".".join(path) or None, at, f"\\u{ord(value[at]):04x}", "the string"
        elif isinstance(value, dict):
            for k, v in reversed(list(value.items())):
                at = _surrogate_at(k)
                if at is not None:
                    return ".".join(path) or None, at, f"\\u{ord(k[at]):04x}", "a field name"
                stack.append((v, path + (k,)))
        elif isinstance(value, list):
            stack.extend((v, path + (str(i),)) for i, v in reversed(list(enumerate(value))) if not isinstance(v, int))
    return None


def _surrogate_at(text: str) -> Optional[int]:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def parse_body(raw: bytes, model: Type[BaseModel]) -> BaseModel:
    """The request ``model`` read from a raw HTTP body (run off the event loop: parsing a body of
    megabytes takes tens of milliseconds).

    Raises:
        ApiError(400): an empty body, bytes that are not UTF-8, text that is not JSON (the line,
            column and character say where; ``NaN``/``Infinity`` and nesting deeper than Python's
            recursion limit included), a string holding a lone UTF-16 surrogate (the field and the
            character), a value of the wrong type (strict: no ``"4"`` for an integer, no ``1`` for a
            boolean), out of range or unknown (:func:`validation_error_to_api`).
    """
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object with the request's fields, e.g. "
                            '{"model": "...", "prompt": "..."}', None, code="empty_body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not UTF-8 text (byte {exc.start}: {exc.reason}); send JSON encoded as "
                            f"UTF-8", None, code="invalid_json") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
                            f"(character {exc.pos})", None, code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the body's JSON nests arrays or objects too deeply to read (a request nests a few "
                            "levels: messages[i].content[j].text)", None, code="invalid_json") from None
    except ValueError as exc:  # NaN / Infinity, or an integer of more than 4300 digits
        raise ApiError(400, f"the body is not valid JSON: {exc}", None, code="invalid_json") from None
    hit = _lone_surrogate(obj)
    if hit is not None:
        where, at, char, what = hit
        raise ApiError(400, f"{where or 'the body'}: {what} holds a lone UTF-16 surrogate ({char}) at character {at}, "
                            f"which is not valid Unicode text; surrogates come in pairs (\\ud83d\\ude00 is one "
                            f"emoji): fix how the client encodes the string", where, code="invalid_unicode")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise validation_error_to_api(exc.errors(include_url=False)) from None
