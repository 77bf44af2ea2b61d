"""Bounds of command-line options that depend on this machine, checked before anything is
allocated: how many cache rows of a model fit in the memory available now.

A runtime (``specc run``/``bench``/``serve``/``tune``/``generate``) holds the target's weights and,
per row, a KV cache of every position up to ``max_model_len`` and a step's logits;
:func:`runtime_bytes` counts them in fp32 (the widest dtype the runtime computes in) from the
model's shape, read from its checkpoint header (:func:`specc.predict.deploy_cost.checkpoint_shape`), so an
option asking for more rows or positions than fit is refused with the largest value that does
(:func:`check_fits`), instead of the allocation failing minutes later or the machine swapping.

Nothing here imports torch.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

from specc.errors import SpeccError
from specc.io import human_size

#: Share of the memory available now that one command may plan to use (the rest: the interpreter,
#: torch's own buffers, whatever else the machine runs meanwhile).
MEMORY_SHARE = 0.9
#: Bytes per value the estimates count: fp32.
FP32 = 4


def memory_budget() -> Tuple[int, int]:
    """``(budget, available)`` bytes: :data:`MEMORY_SHARE` of :func:`specc.device.available_memory`,
    and that memory."""
    from specc.device import available_memory

    avail = available_memory()
    return int(MEMORY_SHARE * avail), avail


def runtime_bytes(shape, rows: int, positions: int) -> int:
    """Bytes a runtime over a target of ``shape`` (:class:`specc.predict.deploy_cost.ModelShape`) holds with
    ``rows`` cache rows of ``positions`` positions: the weights, every row's KV cache
    (``2 · layers · kv_heads · head_dim`` values per position) and a step's logits per row, in fp32."""
    return (shape.param_count() * FP32 + int(shape.kv_bytes_per_token(FP32)) * positions * rows
            + rows * shape.vocab * FP32)


def largest_within(need: Callable[[int], int], budget: int, upto: int) -> int:
    """The largest ``n`` in ``[0, upto]`` with ``need(n) <= budget`` (``need`` grows with ``n``)."""
    lo, hi = 0, upto
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(flag: str, value: int, need: Callable[[int], int], what: str, *,
               error=SpeccError, budget: Optional[Tuple[int, int]] = None) -> None:
    """Refuse ``flag value`` when ``need(value)`` bytes exceed the memory budget
    (:func:`memory_budget`, or ``budget``), naming the estimate, the memory and the largest value that
    fits. ``what`` says what the bytes are (``"the KV cache of 8 rows of 2048 positions"``).
    Raises ``error``."""
    bytes_needed = need(value)
    limit, avail = budget or memory_budget()
    if bytes_needed <= limit:
        return
    best = largest_within(need, limit, value)
    fix = f"pass {flag} {best} or less" if best >= 1 else "not even 1 fits: free memory or use a smaller model"
    raise error(f"{flag} {value}: needs about {human_size(bytes_needed)} ({what}), over {MEMORY_SHARE:.0%} of the "
                f"{human_size(avail)} of memory available on this machine now; {fix}")


def check_runtime_rows(flag: str, rows: int, shape, positions: int) -> None:
    """:func:`check_fits` for ``rows`` cache rows of ``positions`` positions over ``shape``."""
    check_fits(flag, rows, lambda n: runtime_bytes(shape, n, positions),
               f"the target's fp32 weights and a KV cache of {positions} positions per row")


def check_runtime_positions(flag: str, positions: int, shape, rows: int = 1) -> None:
    """:func:`check_fits` for ``positions`` cache positions per row (``rows`` rows) over ``shape``."""
    check_fits(flag, positions, lambda n: runtime_bytes(shape, rows, n),
               f"the target's fp32 weights and a KV cache of {rows} row(s) of that many positions")
