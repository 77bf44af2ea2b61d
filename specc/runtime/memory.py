"""What a state's verify program allocates: the working set a CUDA-graph capture records into the
state's memory pool, measured on the CPU by tracing allocations (``torch.profiler`` with
``profile_memory``), for checking the graph-memory formula of :mod:`specc.predict.deploy_cost` without a GPU.
On CUDA the capture itself records the pool (``SpecRuntimeState.graph_pool_bytes``).
"""
from __future__ import annotations

from unittest import mock

import torch


def program_peak_bytes(state) -> int:
    """Peak bytes of tensors alive at once while ``state``'s verify program (verify forward, accept,
    commit) runs over its full static inputs, as capture runs it: every KV write to the trash slot,
    the general sampling path, attention over the whole cache (a captured or compiled program attends
    over every slot: ``LlamaModel.forward`` reads ``torch.compiler.is_compiling()`` for that choice,
    answered True here). One warm-up call first (lazily built buffers are not the program's).

    Args: state: a :class:`specc.runtime.state.SpecRuntimeState` on the CPU.
    Returns: bytes (int). Raises: ValueError for a state on another device.
    """
    from torch.profiler import ProfilerActivity, profile

    if state.ctx.device.type != "cpu":
        raise ValueError("program_peak_bytes traces CPU allocations; on CUDA read the state's graph_pool_bytes")
    inputs = state._static_inputs()
    with torch.no_grad(), mock.patch("torch.compiler.is_compiling", return_value=True):
        state.program(inputs)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            state.program(inputs)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        # an op's own allocations (minus its frees), and "[memory]" events for frees outside ops
        live += event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        peak = max(peak, live)
    return int(peak)
