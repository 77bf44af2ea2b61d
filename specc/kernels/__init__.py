"""Sampling and verification kernels: each rule has a plain-torch reference and a Triton kernel of the
same signature (`backend="torch" | "triton" | "auto"`); randomness comes in as tensors
(`draw_randomness`) so both give identical tokens from identical inputs.

Triton kernels live in `specc.kernels.verify_triton` (greedy, standard) and
`specc.kernels.block_verify_triton` (block verification) and are imported only when used. The names
below are imported from their submodules on first use; ``specc.kernels.variants`` (the CPU kernel
variants' names) imports no torch.
"""

import importlib
import sys
import types
from typing import Any

#: the names this package exports, by the submodule that defines them (imported on first use, so that a
#: torch-free submodule such as ``specc.kernels.variants`` can be imported without torch)
_EXPORTS = {"VerifyRandomness": "sampling", "draw_randomness": "sampling", "greedy_rows": "sampling",
            "process_logits": "sampling", "block_verify": "block_verify", "VerifyOutput": "verify",
            "greedy_verify": "verify", "rejection_verify": "verify", "resolve_backend": "verify",
            "synthetic_verify": "verify"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"specc.kernels.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'specc.kernels' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """``block_verify`` names both a submodule and the function exported from it: the import system binds a
    submodule to its package's attribute when it is first loaded, which would leave ``specc.kernels.block_verify``
    the module (and the runtime's block-rule stage calling it) wherever the submodule is imported before the name
    is read (a compiled artifact's generated block kernel imports it). An exported name keeps its function."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return  # the exported name, not the submodule: __getattr__ (or the value already read) answers it
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "VerifyOutput",
    "VerifyRandomness",
    "block_verify",
    "draw_randomness",
    "greedy_rows",
    "greedy_verify",
    "process_logits",
    "rejection_verify",
    "resolve_backend",
    "synthetic_verify",
]
