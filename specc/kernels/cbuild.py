"""Compile one C source of ``specc/kernels`` into a shared library in the cache and load it (ctypes).

The library goes to ``$SPECC_CACHE_DIR`` (default ``~/.cache/specc``) ``/kernels/<stem>-<hash>.so``; the
hash covers the source, the flags and the compiler's version (``$CC``, else ``cc``). It is compiled to
a temporary name and renamed, so concurrent first uses never load a half-written library.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shlex
import subprocess
import tempfile
from typing import Sequence


def cache_dir() -> pathlib.Path:
    """``$SPECC_CACHE_DIR/kernels`` (default ``~/.cache/specc/kernels``)."""
    return pathlib.Path(os.environ.get("SPECC_CACHE_DIR", pathlib.Path.home() / ".cache" / "specc")) / "kernels"


def build(source: pathlib.Path, flag_sets: Sequence[Sequence[str]], libs: Sequence[str] = ()) -> ctypes.CDLL:
    """Compile ``source`` with the first of ``flag_sets`` that builds (cached) and load it; ``libs``
    (e.g. ``["-lm"]``) follow the source on the command line.

    Raises ``RuntimeError`` naming the compiler and each failure when none builds or no compiler runs."""
    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    try:
        version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"no C compiler ({' '.join(cc)}): {e}") from None
    src = source.read_bytes()
    errors = []
    for flags in flag_sets:
        key = hashlib.sha256(src + " ".join([*flags, *libs]).encode() + version.encode()).hexdigest()[:16]
        out = cache_dir() / f"{source.stem}-{key}.so"
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so.tmp", dir=out.parent)
            os.close(fd)
            try:
                r = subprocess.run([*cc, *flags, str(source), "-o", tmp, *libs], capture_output=True, text=True, timeout=300)
                if r.returncode != 0:
                    errors.append(f"{' '.join(cc)} {' '.join(flags)} failed on {source.name}: {r.stderr.strip()[-400:]}")
                    continue
                os.replace(tmp, out)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return ctypes.CDLL(str(out))
    raise RuntimeError("; ".join(errors))
