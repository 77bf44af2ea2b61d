"""``--target PATH``: the user's own target model in place of a plan's, checked before any work.

``specc run``, ``specc serve``, ``specc tune`` and ``specc explain`` take ``--target PATH``: a local
Hugging Face directory (``config.json``, ``*.safetensors`` weights, tokenizer files) or a ``.gguf``
file. :func:`read_target_arg` checks it without loading any weight (the config, or the GGUF header
through :func:`specc.predict.sizing.gguf_config`) and :func:`target_overrides` turns it into the plan
overrides that replace the plan's ``target`` section (``target.path``, ``target.format``, the
checkpoint's ``vocab_size``, and ``max_model_len`` = the checkpoint's context capped at
:data:`DEFAULT_CONTEXT`, which a later ``target.max_model_len=N`` override replaces).

specc never downloads a model: a Hugging Face hub id (``org/name`` that is not a path here) is
refused with :func:`hub_id_message`, for ``--target`` and for a plan's ``target.path`` run by specc's
own runtime (:func:`check_local_target`). Torch-free.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from specc.errors import SpeccError

#: Tokens of context ``--target`` gives the plan when the checkpoint allows more (the runtime
#: allocates the KV cache of every row for this many positions up front).
DEFAULT_CONTEXT = 2048
#: Tokenizer files one of which an HF directory needs to be run (``specc.models.tokenizer.load_tokenizer``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_hub_id(text: str) -> bool:
    """True for ``org/name`` (one slash, hub-legal characters) that is not a path on this machine."""
    return bool(_HUB_ID.match(text or "")) and not os.path.exists(os.path.expanduser(text))


def hub_id_message(text: str, flag: str = "--target") -> str:
    """The refusal for a hub id where specc needs a local model. ``flag``: ``--target`` or the plan key
    (``target.path``), named in the fix."""
    fix = f"pass {flag} DIR" if flag.startswith("--") else f"set {flag}=DIR (or pass --target DIR)"
    return (f"{flag} {text} looks like a Hugging Face hub id; specc does not download models. Download it first "
            f"(e.g. `huggingface-cli download {text} --local-dir DIR`) and {fix}")


@dataclass(frozen=True)
class TargetArg:
    """A checked ``--target``: ``path`` (absolute), ``fmt`` (``hf`` or ``gguf``), the checkpoint's
    ``vocab_size``, ``hidden_size`` and context length (``context``: ``max_position_embeddings`` or the
    GGUF's ``<arch>.context_length``; None where the checkpoint does not say)."""

    path: str
    fmt: str
    vocab_size: Optional[int]
    hidden_size: Optional[int]
    context: Optional[int]


def read_target_arg(value: str, flag: str = "--target", need_tokenizer: bool = True) -> TargetArg:
    """Check ``--target VALUE`` and read what the plan needs from it.

    Accepts a directory holding ``config.json`` and ``*.safetensors`` (and, with ``need_tokenizer``, one
    of :data:`TOKENIZER_FILES`), or a ``.gguf`` file whose header reads.

    Raises:
        SpeccError naming ``flag``: a hub id (:func:`hub_id_message`), a path that does not exist, a file
        that is not a GGUF, a GGUF whose header does not read, a directory without ``config.json``,
        with an unreadable ``config.json``, without safetensors weights or tokenizer files.
    """
    text = str(value).strip()
    if not text:
        raise SpeccError(f"{flag}: empty; give a Hugging Face model directory or a .gguf file")
    if looks_like_hub_id(text):
        raise SpeccError(hub_id_message(text, flag))
    p = Path(text).expanduser()
    if not p.exists():
        raise SpeccError(f"{flag} {text}: no such file or directory; give a Hugging Face model directory "
                         f"(config.json + *.safetensors + tokenizer files) or a .gguf file")
    p = p.resolve()
    if p.is_file():
        return _gguf(p, text, flag)
    if not p.is_dir():
        raise SpeccError(f"{flag} {text}: not a regular file or directory")
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        ggufs = sorted(p.glob("*.gguf"))
        hint = f"; to run its GGUF, pass {flag} {ggufs[0]}" if ggufs else ""
        raise SpeccError(f"{flag} {text}: the directory has no config.json, so it is not a Hugging Face model "
                         f"directory{hint}")
    from specc.io import CONFIG_JSON_LIMIT, read_bounded

    try:
        cfg = json.loads(read_bounded(cfg_path, CONFIG_JSON_LIMIT, "config.json"))
        if not isinstance(cfg, dict):
            raise ValueError("the top level is not a JSON object")
    except (OSError, UnicodeDecodeError, ValueError, SpeccError) as exc:
        raise SpeccError(f"{flag} {text}: {cfg_path} does not read as JSON ({exc})") from None
    if not sorted(p.glob("*.safetensors")):
        raise SpeccError(f"{flag} {text}: no *.safetensors weights in the directory (specc loads safetensors "
                         f"or GGUF checkpoints)")
    if need_tokenizer and not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise SpeccError(f"{flag} {text}: no tokenizer files in the directory (one of {', '.join(TOKENIZER_FILES)}); "
                         f"copy them from the model's repository")
    from specc.models.checkpoints import cfg_get

    return TargetArg(path=str(p), fmt="hf", vocab_size=_int(cfg_get(cfg, "vocab_size")),
                     hidden_size=_int(cfg_get(cfg, "hidden_size")),
                     context=_int(cfg_get(cfg, "max_position_embeddings")))


def _gguf(p: Path, text: str, flag: str) -> TargetArg:
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise SpeccError(f"{flag} {text}: not a GGUF file (no GGUF magic bytes) and not a directory; give a "
                         f"Hugging Face model directory or a .gguf file")
    from specc.predict.sizing import gguf_config

    cfg = gguf_config(str(p))
    if not cfg:
        raise SpeccError(f"{flag} {text}: the GGUF header does not read (truncated, an unsupported GGUF version, "
                         f"or not a Llama-family model)")
    return TargetArg(path=str(p), fmt="gguf", vocab_size=_int(cfg.get("vocab_size")),
                     hidden_size=_int(cfg.get("hidden_size")),
                     context=_int(cfg.get("max_position_embeddings")))


def _int(v) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def target_overrides(t: TargetArg) -> List[str]:
    """Hydra overrides replacing a plan's target with ``t``: path, format, vocabulary and a context of
    ``min(checkpoint context, DEFAULT_CONTEXT)`` tokens; ``target.architecture`` is cleared (the
    checkpoint says it). Apply them before the user's own overrides so those win."""
    ctx = min(t.context, DEFAULT_CONTEXT) if t.context else DEFAULT_CONTEXT
    return [f"target.path={_quote(canonical_path(t.path))}", f"target.format={t.fmt}",
            f"target.vocab_size={t.vocab_size if t.vocab_size else 'null'}", f"target.max_model_len={ctx}",
            "target.architecture=null"]


def _local(text: str) -> Optional[Path]:
    """The file a plan path names here (``pkg://`` resolved), or None."""
    try:
        if text.startswith("pkg://"):
            from specc.models.resolve import resolve_model_path

            return resolve_model_path(text).resolve()
        p = Path(text).expanduser()
        return p.resolve() if p.exists() else None
    except (SpeccError, OSError):
        return None


def same_model(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two plan paths name the same checkpoint here (equal text, or the same file once
    ``pkg://`` and relative paths are resolved)."""
    if not a or not b:
        return False
    if a == b:
        return True
    la, lb = _local(str(a)), _local(str(b))
    return la is not None and la == lb


def canonical_path(path: str) -> str:
    """``path``, or the ``pkg://`` path of the shipped target option (``conf/target/*.yaml``) naming the
    same file, so acceptance records and cost tables keyed by the shipped path still match."""
    import yaml

    from specc.plan.load import conf_dir

    for f in sorted((conf_dir() / "target").glob("*.yaml")):
        try:
            text = (yaml.safe_load(f.read_text()) or {}).get("path")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(text, str) and text.startswith("pkg://") and same_model(text, path):
            return text
    return path


def _quote(path: str) -> str:
    """A path as a Hydra override value: quoted when it holds characters the override grammar reads."""
    if re.fullmatch(r"[A-Za-z0-9_./~+-]+", path):
        return path
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def check_local_target(path: Optional[str], key: str = "target.path") -> None:
    """For specc's own runtime, which loads the target from this machine: refuse a ``target.path``
    that is a hub id with :func:`hub_id_message` (SpeccError), before the plan compiles."""
    if path and looks_like_hub_id(str(path)):
        raise SpeccError(hub_id_message(str(path), key))


def check_drafter_fits(plan, flag: str = "--target") -> None:
    """Refuse a plan whose draft checkpoint was trained for another target than the plan's (after
    ``--target`` replaced it): the rule ``checkpoint.CK-DRAFT-TARGET``
    (:func:`specc.check.checkpoints.draft_target_mismatch`), run here before anything loads so the
    message names ``flag``. Raises SpeccError naming the mismatch (vocab size or hidden size)."""
    from specc.check.checkpoints import draft_target_mismatch

    why = draft_target_mismatch(plan)
    if why:
        raise SpeccError(f"{flag} {plan.target.path}: plan {plan.name!r} drafts with {plan.draft.path}, trained for "
                         f"another target ({why}); use a method that needs no trained drafter (e.g. the "
                         f"smollm2_ngram or smollm2_suffix plan, or method=ngram) or a drafter trained for this target")
