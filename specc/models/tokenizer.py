"""The tokenizer and chat template of a checkpoint, served by transformers (``AutoTokenizer``);
we only wrap it with the few calls the runtime needs. Nothing here tokenizes by hand."""
from __future__ import annotations

import pathlib
from typing import Dict, List, Optional, Sequence

from specc.errors import CheckpointError, PromptError


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

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: List[Dict[str, str]], add_generation_prompt: bool = True) -> List[int]:
        """Token ids of ``messages`` (``[{"role", "content"}, ...]``) under the checkpoint's chat template.
        Raises ``PromptError`` when the checkpoint has no chat template or a message is malformed."""
        if not self.has_chat_template:
            raise PromptError("this checkpoint's tokenizer has no chat template; pass a raw prompt instead")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise PromptError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
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
