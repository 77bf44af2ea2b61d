"""``runtime.compile_backend: inductor``: a state's verify program compiled with ``torch.compile``.

The CPU counterpart of CUDA-graph capture (:meth:`specc.runtime.state.SpecRuntimeState.compile`):
the same function the eager path calls (:meth:`SpecRuntimeState.program`: verify forward → accept →
KV commit) over the state's full static inputs (every row of the bucket, the static verify width, the
attention over the whole cache: no shape read from the data), compiled by inductor with
``fullgraph=False`` and no dynamic dimensions; ``freezing`` folds the target's weights into the
graph as constants, so oneDNN packs them once (its prepacked linear) instead of at every call
(PyTorch's inductor CPU guide). The KV cache is written in place through the compiled graph
(gpt-fast's static cache, anchors A1).

The target's numpy fast path (fp32 ``Linear`` through OpenBLAS and the skinny GEMM) is not
traceable; while compiling, ``Linear`` takes ``F.linear`` (``torch.compiler.is_compiling``).
Whether the compiled program is faster than eager on a device is measured by ``specc profile``
(``tools/bench_backends.py`` prints the comparison), never assumed.
"""
from __future__ import annotations

from typing import Any, Callable

import torch


def compile_program(state: Any, inputs: Any) -> Callable[[Any], Any]:
    """Compile ``state.program`` for its static ``inputs`` and run it once (the compilation happens
    there, at load). Returns the compiled callable ``(inputs) -> StepOutputs``.

    Raises:
        ArtifactError: torch.compile is unavailable or fails for this state (naming it and the fix,
            ``runtime.compile_backend=eager``).
    """
    from specc.errors import ArtifactError

    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    fn = torch.compile(lambda inp: state.program(inp), dynamic=False, fullgraph=False)
    try:
        with torch.inference_mode():
            fn(inputs)
    except Exception as exc:  # inductor needs a C++ compiler; say so instead of a deep traceback
        raise ArtifactError(f"candidate state {state.spec.name}: runtime.compile_backend=inductor failed to "
                            f"compile its verify program ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                            f"set runtime.compile_backend=eager") from None
    return fn
