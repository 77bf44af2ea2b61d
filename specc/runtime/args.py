"""argparse value types shared by ``specc run``, ``specc bench`` and ``specc generate``: each numeric
flag is checked while the command line is parsed, before anything is loaded, so a bad value gives
one ``argument --flag: ...`` message naming the flag and the value and exit status 2 (argparse's
usage error), never a deep traceback (e.g. ``torch.set_num_threads(-1)`` raises RuntimeError).

Nothing here imports torch.
"""
from __future__ import annotations

import argparse
import math


def _number(kind: type, text: str, what: str):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An ``int >= 1`` (threads, max_new_tokens, batch size, max_model_len, limit).
    Raises ``argparse.ArgumentTypeError`` otherwise."""
    value = _number(int, text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def machine_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_count(text: str) -> int:
    """``--threads``: an ``int`` in ``[1, machine_cpus()]`` (more threads than CPUs only makes the
    BLAS pools spin against each other). Raises ``argparse.ArgumentTypeError`` otherwise."""
    cpus = machine_cpus()
    value = _number(int, text, f"an integer in [1, {cpus}]")
    if not 1 <= value <= cpus:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {cpus}] (this machine's CPUs), got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An ``int >= 0`` (top-k, 0 = off). Raises ``argparse.ArgumentTypeError`` otherwise."""
    value = _number(int, text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (0 = off), got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite ``float >= 0`` (temperature, 0 = greedy). Raises ``argparse.ArgumentTypeError`` otherwise."""
    value = _number(float, text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (0 = greedy), got {text!r}")
    return value


def unit_interval(text: str) -> float:
    """A float in ``(0, 1]`` (top-p, 1 = off; nucleus sampling, Holtzman et al. 2020).
    Raises ``argparse.ArgumentTypeError`` otherwise."""
    value = _number(float, text, "a number in (0, 1]")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1] (1 = off), got {text!r}")
    return value


MAX_SEED = 2 ** 62


def seed_int(text: str) -> int:
    """A seed in ``[0, 2**62]`` (request i of a run is seeded with SEED + i, which must still fit
    the 64-bit seed of ``torch.Generator.manual_seed``). Raises ``argparse.ArgumentTypeError``."""
    value = _number(int, text, f"an integer in [0, {MAX_SEED}]")
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**62], got {text!r}")
    return value


def port_int(text: str) -> int:
    """A TCP port in ``[1, 65535]``. Raises ``argparse.ArgumentTypeError`` otherwise."""
    value = _number(int, text, "a port number in [1, 65535]")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [1, 65535], got {text!r}")
    return value
