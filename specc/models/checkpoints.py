"""Torch-free reading of the checkpoints a plan names (``target.path``, ``draft.path``) for
``specc check``: where a path lives on this machine, its ``config.json``, and whether it is a
loadable checkpoint at all.

A plan path is one of:

* ``pkg://<package>/<relpath>`` inside an installed Python package (resolved by
  :func:`specc.models.resolve.resolve_model_path`, which imports neither the package nor torch);
* a local file or directory (absolute, ``./``/``../``/``~`` relative, or any existing path);
* a Hugging Face repo id (``org/name``), readable only when it is already in the local Hugging Face
  cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``; nothing is downloaded).

:func:`read_checkpoint` returns a :class:`Checkpoint`: ``config`` is the parsed ``config.json`` (or
None with ``unreadable`` saying why: not local, not in the cache, a GGUF file); ``problems`` lists
why a *local* path is not a loadable checkpoint (missing, a text file, a directory without
``config.json``, no weights, shards missing from the index, an embedding whose row count disagrees
with ``vocab_size``). A Hugging Face id that is not cached is not a problem, only unreadable: the
engine downloads it at launch.

The rules that use this module are in :mod:`specc.check.checkpoints` (run by
:func:`specc.check.check` for every engine, after the engine's own table) and in the engine tables
(rules with ``needs``, through :class:`specc.check.base.Facts`). Nothing here
imports torch; safetensors headers are read with ``safetensors.safe_open(framework="numpy")``, which
maps the file and reads no tensor data.
"""
from __future__ import annotations

import functools
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from specc.errors import SpeccError
from specc.io import CONFIG_JSON_LIMIT, read_bounded

#: Shipped drafters that ``tools/install`` builds (not committed): directory name under
#: ``specc/assets/drafters/`` -> the command that builds it.
BUILT_AT_INSTALL = {"smollm2_135m_shallow": "python -m specc.methods.draft_model.shallow"}
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
EMBEDDING_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight",
                   "model.embed_tokens.embed_tokens.weight")
GGUF_MAGIC = b"GGUF"


@dataclass
class Checkpoint:
    """What ``specc check`` learned about one plan path.

    Attributes:
        key: the plan key (``target.path`` / ``draft.path``).
        text: the path as written in the plan.
        local: the filesystem path it resolved to (None when it is not on this machine).
        config: the parsed ``config.json`` (None when it could not be read; ``unreadable`` says why).
        unreadable: why ``config`` is None (empty when it was read).
        problems: why a local path is not a loadable checkpoint (empty when it is).
        fmt: ``hf`` (a directory with ``config.json``) or ``gguf`` (a single GGUF file).
    """

    key: str
    text: str
    local: Optional[Path] = None
    config: Optional[Dict[str, Any]] = None
    unreadable: str = ""
    problems: List[str] = field(default_factory=list)
    fmt: str = "hf"

    @property
    def readable(self) -> bool:
        return self.config is not None


def looks_local(text: str) -> bool:
    """True for paths that can only mean this machine's filesystem (``/``, ``./``, ``../``, ``~``,
    ``pkg://``) or that exist here; a bare ``org/name`` is a Hugging Face repo id."""
    return text.startswith(("/", "./", "../", "~", "pkg://")) or os.path.exists(text)


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``), the layout ``huggingface_hub`` writes."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _from_hf_cache(repo_id: str) -> Optional[Path]:
    """The cached snapshot directory of ``repo_id`` holding ``config.json``, or None. Imports
    ``huggingface_hub`` only when the repo's cache folder exists (the import costs ~0.2 s)."""
    folder = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    if not folder.is_dir():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(hf_cache_dir()))
    return Path(found).parent if isinstance(found, str) else None


def _weights(directory: Path) -> Tuple[List[Path], List[str]]:
    """(weight files, problems) of an HF checkpoint directory; an index's shards must all exist."""
    problems: List[str] = []
    for name in INDEX_FILES:
        index = directory / name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(read_bounded(index, CONFIG_JSON_LIMIT, "weight index"))
                                    ["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError, SpeccError) as exc:
                return [], [f"{index} is not a readable weight index ({type(exc).__name__}: {exc})"]
            missing = [s for s in shards if not (directory / s).is_file()]
            if missing:
                problems.append(f"{index.name} lists {len(missing)} shard(s) that are missing: "
                                f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
            return [directory / s for s in shards if (directory / s).is_file()], problems
    files = sorted(p for g in WEIGHT_GLOBS for p in directory.glob(g) if p.is_file())
    return files, problems


def _embedding_rows(files: List[Path]) -> Optional[Tuple[str, int]]:
    """(tensor name, rows) of the input embedding found in safetensors headers, or None."""
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    for path in files:
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="numpy") as f:
                names = set(f.keys())
                for name in EMBEDDING_NAMES:
                    if name in names:
                        return name, int(f.get_slice(name).get_shape()[0])
        except Exception:  # noqa: BLE001 - a corrupt file is reported by the loader, not here
            continue
    return None


def _read_local(ck: Checkpoint, path: Path, fmt_hint: str) -> None:
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(4)
        if head == GGUF_MAGIC:
            ck.fmt = "gguf"
            ck.unreadable = f"{path.name} is a GGUF file (metadata, no config.json)"
            return
        if fmt_hint == "gguf" or path.suffix == ".gguf":
            ck.problems.append(f"{path} is not a GGUF file (no GGUF magic bytes)")
        else:
            ck.problems.append(f"{path} is a file, not a checkpoint directory (expected a directory with "
                               f"config.json and weights, or a .gguf file)")
        ck.unreadable = "not a checkpoint"
        return
    config = path / "config.json"
    if not config.is_file():
        ck.problems.append(f"{path} has no config.json: not a Hugging Face checkpoint directory")
        ck.unreadable = "no config.json"
        return
    try:
        data = json.loads(read_bounded(config, CONFIG_JSON_LIMIT, "checkpoint config"))
        if not isinstance(data, dict):
            raise ValueError("top level is not an object")
    except (OSError, UnicodeDecodeError, ValueError, SpeccError) as exc:
        ck.problems.append(f"{config} is not valid JSON ({exc})")
        ck.unreadable = "config.json unreadable"
        return
    ck.config = data
    files, problems = _weights(path)
    ck.problems.extend(problems)
    if not files and not problems:
        ck.problems.append(f"{path} has config.json but no weights (*.safetensors, pytorch_model*.bin)")
    vocab = data.get("vocab_size")
    emb = _embedding_rows(files) if files and isinstance(vocab, int) else None
    if emb is not None and emb[1] != vocab:
        ck.problems.append(f"{path}: config.json vocab_size={vocab} but {emb[0]} has {emb[1]} rows")


def _shipped_hint(text: str) -> str:
    for name, command in BUILT_AT_INSTALL.items():
        if text.rstrip("/").endswith("/" + name) and "assets/drafters" in text:
            return f"; this drafter is built at install time: run `{command}` (or `bash tools/install`)"
    return ""


@functools.lru_cache(maxsize=64)
def _read_cached(key: str, text: str, fmt_hint: str, stamp: float) -> Checkpoint:
    ck = Checkpoint(key=key, text=text)
    if text.startswith("pkg://"):
        from specc.errors import SpeccError
        from specc.models.resolve import resolve_model_path

        try:
            path = resolve_model_path(text)
        except SpeccError as exc:
            ck.problems.append(f"{exc}{_shipped_hint(text)}")
            ck.unreadable = "cannot be resolved"
            return ck
    elif looks_local(text):
        path = Path(text).expanduser()
        if not path.exists():
            ck.problems.append(f"{path} does not exist{_shipped_hint(text)}")
            ck.unreadable = "does not exist"
            return ck
    else:
        path = _from_hf_cache(text) if text.count("/") == 1 else None
        if path is None:
            ck.unreadable = (f"not on this machine: a Hugging Face id not in the local cache ({hf_cache_dir()}); "
                             f"download it (`huggingface-cli download {shlex.quote(text)} config.json`) or use a "
                             f"local path")
            return ck
    ck.local = path
    _read_local(ck, path, fmt_hint)
    return ck


def read_checkpoint(key: str, text: Optional[str], fmt_hint: str = "hf") -> Optional[Checkpoint]:
    """The :class:`Checkpoint` for a plan path (None when the plan sets no path). Never raises;
    results are cached per (key, path, modification time)."""
    if not text:
        return None
    try:
        stamp = os.stat(os.path.expanduser(text)).st_mtime if not text.startswith("pkg://") else 0.0
    except OSError:
        stamp = -1.0
    return _read_cached(key, text, fmt_hint, stamp)


# ------------------------------------------------------------------------------------------
# Facts from a checkpoint's config.json (None when the config does not say)


def cfg_get(config: Optional[Dict[str, Any]], *names: str) -> Any:
    """The first of ``names`` present in ``config`` (dotted names look into sub-dicts; a
    ``text_config`` is searched too, for multimodal wrappers)."""
    if not config:
        return None
    for cfg in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else None):
        if not cfg:
            continue
        for name in names:
            cur: Any = cfg
            for part in name.split("."):
                cur = cur.get(part) if isinstance(cur, dict) else None
            if cur is not None:
                return cur
    return None


def architecture(config: Optional[Dict[str, Any]]) -> Optional[str]:
    archs = cfg_get(config, "architectures")
    return archs[0] if isinstance(archs, list) and archs else None


#: vLLM 0.33.0 looks for a parallel-drafting mask token under these config keys, in this order
#: (``vllm/v1/spec_decode/llm_base_proposer.py:355-379``; ``v1/worker/gpu/spec_decode/utils.py:92-113``).
MASK_TOKEN_KEYS = ("dflash_config.mask_token_id", "mask_token_id", "dspark_noise_token_id", "pard_token",
                   "ptd_token_id")


def mask_token(config: Optional[Dict[str, Any]]) -> Any:
    return cfg_get(config, *MASK_TOKEN_KEYS)


def n_predict(config: Optional[Dict[str, Any]]) -> Optional[int]:
    """vLLM's ``n_predict`` of a draft config (``n_predict``; MTP checkpoints carry it as
    ``num_nextn_predict_layers``, converted by ``SpeculativeConfig.hf_config_override``)."""
    v = cfg_get(config, "n_predict", "num_nextn_predict_layers")
    return v if isinstance(v, int) and v > 0 else None
