"""``runtime.compile_backend: inductor``: a state's verify program compiled with ``torch.compile``.

The CPU counterpart of CUDA-graph capture (:meth:`specc.runtime.state.SpecRuntimeState.compile`):
the same function the eager path calls (:meth:`SpecRuntimeState.program`: verify forward → accept →
KV commit) over the state's full static inputs (every row of the bucket, the static verify width, the
attention over every cache slot: no shape read from the data), compiled by inductor with no dynamic
dimensions; ``freezing`` folds the target's weights into the graph as constants, so oneDNN packs
them once (its prepacked linear) instead of at every call (PyTorch's inductor CPU guide). The KV
cache is written in place through the compiled graph (gpt-fast's static cache, pytorch-labs/gpt-fast model.py).

Each state gets a function with its own code object (named after the state), so dynamo keeps one
cache entry per state: states sharing one code object would count as recompilations of it, and past
``torch._dynamo.config.recompile_limit`` (8) dynamo silently runs the rest eagerly.

The target's numpy fast path (fp32 ``Linear`` through OpenBLAS and the skinny GEMM) is not
traceable; while compiling, ``Linear`` takes ``F.linear`` (``torch.compiler.is_compiling``). The
attention spans every cache slot, so the compiled program's attention cost grows with the cache
length (``target.max_model_len``), where the eager program attends over the filled slots only.
Whether the compiled program is faster than eager on a device is measured by ``specc profile`` (and
``tools/bench_backends.py`` prints the comparison), never assumed.
"""
from __future__ import annotations

from typing import Any, Callable, Tuple

import torch


def own_code(fn: Callable, name: str) -> Callable:
    """``fn`` with a code object of its own, named ``name`` (letters, digits, underscores kept): dynamo
    keys its compiled entries by code object, so functions made from one ``def`` or ``lambda`` in a
    loop would count as recompilations of one function (see the module docstring). Returns ``fn``."""
    fn.__code__ = fn.__code__.replace(co_name="".join(c if c.isalnum() else "_" for c in name))
    return fn


def compile_program(state: Any, inputs: Any) -> Tuple[Callable[[Any], Any], int]:
    """Compile ``state.program`` for its static ``inputs`` and run it once (the compilation happens
    there, at load). Returns ``(the compiled callable (inputs) -> StepOutputs, graph breaks)``: the
    number of places dynamo split the program (0: one graph).

    Raises:
        ArtifactError: torch.compile is unavailable or fails for this state (naming it and the fix,
            ``runtime.compile_backend=eager``).
    """
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    from specc.errors import ArtifactError

    def verify_program(inp):
        return state.program(inp)

    fn = torch.compile(own_code(verify_program, f"verify_program_{state.spec.name}"), dynamic=False,
                       fullgraph=False)
    breaks = sum(counters["graph_break"].values())
    try:
        with inductor_config.patch(freezing=True), torch.inference_mode():
            fn(inputs)
    except Exception as exc:  # inductor needs a C++ compiler; say so instead of a deep traceback
        raise ArtifactError(f"candidate state {state.spec.name}: runtime.compile_backend=inductor failed to "
                            f"compile its verify program ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                            f"set runtime.compile_backend=eager") from None
    return fn, sum(counters["graph_break"].values()) - breaks
