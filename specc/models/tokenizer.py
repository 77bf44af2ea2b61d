"""The tokenizer and chat template of a checkpoint, served by transformers (``AutoTokenizer``);
we only wrap it with the few calls the runtime needs. Nothing here tokenizes by hand.

:meth:`Tokenizer.encode_within` refuses a text that provably has more tokens than a limit without
tokenizing it: when every token of the tokenizer covers at most ``L`` bytes of the input
(:attr:`Tokenizer.max_bytes_per_token`), a text of ``n`` UTF-8 bytes has at least ``ceil(n / L)``
tokens. The bound holds for byte-level BPE (GPT-2's byte alphabet: every input byte is in exactly one
token) and BPE with byte fallback, behind normalizers that never delete input (NFC/NFKC compose at
most three bytes into one, counted) and pre-tokenizers that keep every byte; for anything else
(WordPiece, an ``[UNK]`` that swallows a word, a normalizer that strips) there is no bound and the
text is tokenized in full.
"""
from __future__ import annotations

import functools
import json
import pathlib
from typing import Dict, List, Optional, Sequence

from specc.errors import CheckpointError, PromptError, PromptTooLongError


#: normalizers that never delete input, with how many bytes of input they may turn into one byte
#: (canonical/compatibility composition: a Hangul L+V+T jamo triple, 9 bytes, becomes one 3-byte syllable)
_NORMALIZER_SHRINK = {"NFC": 3, "NFKC": 3, "NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1}
#: pre-tokenizers that keep every input byte (they split, or map bytes one to one)
_KEEPING_PRE_TOKENIZERS = ("ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts")


def _shrink(spec: Optional[dict]) -> Optional[int]:
    """How many input bytes a normalizer may fold into one (1 = never fewer), None when it may delete."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for sub in spec.get("normalizers") or []:
            f = _shrink(sub)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":
        pattern, content = spec.get("pattern") or {}, spec.get("content") or ""
        if "String" not in pattern or not content:
            return None  # a regex, or replacing with nothing: may delete
        return max(1, -(-len(pattern["String"].encode("utf-8")) // len(content.encode("utf-8"))))
    return _NORMALIZER_SHRINK.get(kind)


def _keeps_bytes(spec: Optional[dict]) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_keeps_bytes(s) for s in spec.get("pretokenizers") or [])
    if kind == "Split":
        return spec.get("behavior") != "Removed"
    return kind in _KEEPING_PRE_TOKENIZERS


def _byte_level(spec: Optional[dict]) -> bool:
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        return any(_byte_level(s) for s in spec.get("pretokenizers") or [])
    return spec.get("type") == "ByteLevel"


class Tokenizer:
    """Wraps a transformers tokenizer.

    ``encode(text) -> list[int]`` (no special tokens added beyond what the tokenizer's own
    post-processor adds), ``decode(ids) -> str``, ``apply_chat_template(messages) -> list[int]``
    (with the generation prompt), ``eos_token_ids`` (tokenizer EOS plus the model config's EOS ids).
    """

    def __init__(self, hf_tokenizer, extra_eos_ids: Sequence[int] = ()):
        self.hf = hf_tokenizer
        eos = []
        if hf_tokenizer.eos_token_id is not None:
            eos.append(int(hf_tokenizer.eos_token_id))
        eos += [int(e) for e in extra_eos_ids if int(e) not in eos]
        self.eos_token_ids: tuple = tuple(eos)
        self.pad_token_id: int = int(hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None
                                     else (eos[0] if eos else 0))

    def __len__(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> List[int]:
        return list(self.hf.encode(text))

    @functools.cached_property
    def max_bytes_per_token(self) -> Optional[int]:
        """The most bytes of UTF-8 input text one token can stand for (module docstring), or None when
        the tokenizer gives no such bound. Computed once from ``tokenizer.json``'s normalizer,
        pre-tokenizer and model, and the longest entry of the vocabulary (added tokens included): a
        byte-level token string has one character per input byte, any other string counts its UTF-8
        bytes (an overestimate, which keeps the bound safe)."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            spec = json.loads(backend.to_str())
        except Exception:  # noqa: BLE001 - a tokenizer that cannot describe itself gets no bound
            return None
        model = spec.get("model") or {}
        pre = spec.get("pre_tokenizer")
        byte_level = _byte_level(pre)
        if model.get("type") != "BPE" or not (byte_level or model.get("byte_fallback")):
            return None
        shrink = _shrink(spec.get("normalizer"))
        if shrink is None or not _keeps_bytes(pre):
            return None
        added = {t.get("content", "") for t in spec.get("added_tokens") or []}
        longest = 1
        for text in self.hf.get_vocab():
            n = len(text) if byte_level and text not in added else len(text.encode("utf-8", "replace"))
            longest = max(longest, n)
        return longest * shrink

    def encode_within(self, text: str, max_tokens: int) -> List[int]:
        """``encode(text)``, unless the text's length alone proves it has more than ``max_tokens``
        tokens (then nothing is tokenized).

        Raises:
            PromptTooLongError: ``ceil(bytes / max_bytes_per_token) > max_tokens``.
        """
        self._refuse_longer(text, max_tokens, "bytes of text")
        return self.encode(text)

    def _refuse_longer(self, text: str, max_tokens: int, what: str) -> None:
        """Raise :class:`PromptTooLongError` when ``text`` has provably more than ``max_tokens`` tokens."""
        per = self.max_bytes_per_token
        if per is None:
            return
        n = len(text.encode("utf-8", "surrogatepass"))
        least = -(-n // per)
        if least > max_tokens:
            raise PromptTooLongError(f"at least {least} tokens ({n} {what}, at most {per} bytes per token for "
                                     f"this tokenizer)", least, n, per)

    def render_chat(self, messages: List[Dict[str, str]], add_generation_prompt: bool = True) -> str:
        """``messages`` as the text the chat template writes (not tokenized). Raises ``PromptError``
        as :meth:`apply_chat_template`."""
        if not self.has_chat_template:
            raise PromptError("this checkpoint's tokenizer has no chat template; pass a raw prompt instead")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise PromptError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def chat_within(self, messages: List[Dict[str, str]], max_tokens: int) -> List[int]:
        """:meth:`apply_chat_template` with :meth:`encode_within`'s bound on the rendered text.
        Raises ``PromptError`` (``PromptTooLongError`` from the bound)."""
        text = self.render_chat(messages)
        self._refuse_longer(text, max_tokens, "bytes after the chat template")
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: List[Dict[str, str]], add_generation_prompt: bool = True) -> List[int]:
        """Token ids of ``messages`` (``[{"role", "content"}, ...]``) under the checkpoint's chat template.
        Raises ``PromptError`` when the checkpoint has no chat template or a message is malformed."""
        text = self.render_chat(messages, add_generation_prompt)
        return list(self.hf.encode(text, add_special_tokens=False))

    def save(self, directory: str | pathlib.Path) -> None:
        """Write tokenizer files (tokenizer.json, tokenizer_config.json, ...) into ``directory``."""
        self.hf.save_pretrained(str(directory))


def _quiet_transformers():
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def load_tokenizer(directory: str | pathlib.Path, gguf_file: Optional[str] = None,
                   extra_eos_ids: Sequence[int] = (), fast_class: bool = False) -> Tokenizer:
    """``AutoTokenizer.from_pretrained(directory[, gguf_file=...])`` wrapped. ``fast_class=True`` loads
    a tokenizer.json that transformers itself saved (our GGUF cache) with ``PreTrainedTokenizerFast``
    directly, skipping AutoTokenizer's config resolution (which imports transformers' model stack,
    seconds here). Raises ``CheckpointError`` when transformers cannot build a tokenizer from the files."""
    transformers = _quiet_transformers()
    if not fast_class and gguf_file is None:
        fast_class = _is_plain_fast_tokenizer(pathlib.Path(directory))
    try:
        if fast_class:
            tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(directory))
        elif gguf_file is not None:
            tok = transformers.AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)
        else:
            tok = transformers.AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError)
        where = pathlib.Path(directory) / gguf_file if gguf_file else directory
        raise CheckpointError(f"{where}: cannot load the tokenizer ({type(exc).__name__}: {exc}); an HF "
                              f"directory needs tokenizer.json or tokenizer_config.json") from None
    return Tokenizer(tok, extra_eos_ids)


def _is_plain_fast_tokenizer(directory: pathlib.Path) -> bool:
    """True when ``directory`` holds a tokenizer.json whose tokenizer_config names the generic fast
    class (what transformers itself writes for GGUF-converted tokenizers): then
    ``PreTrainedTokenizerFast`` is exactly what AutoTokenizer would build."""
    import json
    cfg = directory / "tokenizer_config.json"
    if not (directory / "tokenizer.json").is_file() or not cfg.is_file():
        return False
    from specc.errors import SpeccError
    from specc.io import CONFIG_JSON_LIMIT, read_bounded

    try:
        cls = json.loads(read_bounded(cfg, CONFIG_JSON_LIMIT, "tokenizer config")).get("tokenizer_class")
    except (SpeccError, ValueError, AttributeError):
        return False
    return cls in ("PreTrainedTokenizerFast", "TokenizersBackend")


def check_vocab(tokenizer: Tokenizer, vocab_size: int, source: str) -> None:
    """Raise ``CheckpointError`` when the tokenizer can produce ids the model has no embedding for
    (the embedding table may be padded larger than the tokenizer; never smaller)."""
    n = len(tokenizer)
    if n > vocab_size:
        raise CheckpointError(f"{source}: the tokenizer has {n} tokens but the model's vocab_size is {vocab_size}; "
                              f"tokenizer and weights belong to different models")
