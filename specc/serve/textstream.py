"""Incremental detokenization for streaming: text deltas whose concatenation is exactly the final
output text (``RequestOutput.text``: EOS dropped, cut before the first stop string).

Two things hold text back until it is certain: a trailing incomplete UTF-8 sequence (the byte-level
tokenizer decodes it as U+FFFD until its last byte arrives), and the last ``max(len(stop)) - 1``
characters while stop strings are set (a stop string completed by a later token cuts the text
before it; the runtime ends a request as soon as one is complete, so any later match starts in that
tail). vLLM's detokenizer holds back the same tail (``vllm/v1/engine/detokenizer.py``).
"""
from __future__ import annotations

from typing import Iterable, List, Sequence


class TextStream:
    """Args: tokenizer (``specc.models.tokenizer.Tokenizer``), eos_token_ids, stop strings."""

    def __init__(self, tokenizer, eos_token_ids: Iterable[int], stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.eos = frozenset(int(e) for e in eos_token_ids)
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: List[int] = []
        self.sent = ""

    def push(self, token_ids: Sequence[int]) -> str:
        """Add new tokens; returns the text that is now certain (may be empty)."""
        self.ids.extend(int(t) for t in token_ids)
        body = self.ids[:-1] if self.ids and self.ids[-1] in self.eos else self.ids
        text = self.tokenizer.decode(body).rstrip("\ufffd")
        safe = text[:len(text) - self.hold] if self.hold else text
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            delta, self.sent = safe[len(self.sent):], safe
            return delta
        return ""

    def finish(self, final_text: str) -> str:
        """The rest of ``final_text`` (the request's output text) after what was sent. Raises
        ValueError if what was sent is not a prefix of it (a detokenizer defect, never expected)."""
        if not final_text.startswith(self.sent):
            raise ValueError(f"streamed text {self.sent[-40:]!r} is not a prefix of the final text")
        delta, self.sent = final_text[len(self.sent):], final_text
        return delta
