"""The step owns its I/O and reads the host once.

* Host reads per decode step (:func:`specc.runtime.testing.count_host_reads`: ``item``, ``tolist``,
  ``cpu``, ``numpy``, ``int()/float()/bool()`` of a tensor, ``to(cpu)`` from a device,
  ``torch.cuda.synchronize``; the models' CPU-only fast paths excluded) for every drafter
  configuration the runtime tests build: at most 2 on the CPU (the step's one read of its results,
  and the CPU's ragged-shape read of its own inputs). Configurations whose drafter still reads more
  are marked xfail with the count measured and where the reads are.
* Greedy outputs equal plain greedy decoding (``reference_greedy``) under the counter.
* :class:`specc.runtime.step.StepIO`: one copy in, one copy out; ``SpecMetrics.num_host_reads`` one
  per step.
* Stage timing: the default timer never synchronises; ``make_timer`` kinds and its error.
"""
from __future__ import annotations

import pytest
import torch

from specc.errors import PlanError
from specc.runtime import step as S
from specc.runtime.metrics import EventTimer, SpecMetrics, SyncTimer, WallTimer, make_timer
from specc.runtime.step import StepIO
from specc.runtime.testing import CPU_FAST_PATHS, count_host_reads, reference_greedy

from tests.step_io_support import CONFIGS

MAX_READS = 2
# configurations whose drafter's own forward still reads the device: (reads per step measured, where)
STILL_READING: dict = {}


def _run_counted(name):
    rt, reqs = CONFIGS[name]()
    per_step, sites = [], {}
    orig = S.decode_step

    def counted(runtime, batch):
        with count_host_reads(ignore=CPU_FAST_PATHS) as reads:
            orig(runtime, batch)
        per_step.append(reads.count)
        for k, v in reads.by_site().items():
            sites[k] = sites.get(k, 0) + v
    S.decode_step = counted
    try:
        out = rt.generate(reqs, batch_size=2)
    finally:
        S.decode_step = orig
    return rt, reqs, out, per_step, sites


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    reason=f"{STILL_READING[n][0]} host reads per step: {STILL_READING[n][1]}", strict=True))
    if n in STILL_READING else n for n in CONFIGS])
def test_host_reads_per_step(name):
    rt, reqs, out, per_step, sites = _run_counted(name)
    steps = sum(rt.metrics.kappa_steps.values())
    print(f"{name}: {steps} steps, host reads per step max {max(per_step)}, "
          f"mean {sum(per_step) / len(per_step):.2f}; " + "; ".join(f"{k} x{v}" for k, v in sites.items()))
    assert steps == len(per_step) > 0
    assert rt.metrics.num_host_reads == steps  # the step's own read of its results, once per step
    if reqs[0].params.temperature == 0:
        target = rt.target
        for r, o in zip(reqs, out):
            assert o.token_ids == reference_greedy(target, r.prompt_ids, r.params.max_new_tokens), name
    assert max(per_step) <= MAX_READS, sites
    # the drafter's host mirrors were kept through the run and equal its device state
    for mirror, device in (("host_last_pos", "last_pos"), ("host_synced", "synced"), ("host_final", "final")):
        if hasattr(rt.drafter, mirror):
            assert getattr(rt.drafter, mirror) is not None, f"{name}: {mirror} lost"
            assert getattr(rt.drafter, mirror) == getattr(rt.drafter, device).tolist(), f"{name}: {mirror}"


def test_count_host_reads_counts_each_kind():
    t = torch.arange(4)
    with count_host_reads() as reads:
        pass
    assert reads.count == 0
    import specc.runtime.state as st_mod  # a specc frame makes the calls below count

    code = compile("t.tolist(); t[0].item(); t.numpy(); t.cpu(); int(t[1]); bool(t[2]); float(t[3])",
                   st_mod.__file__, "exec")
    with count_host_reads() as reads:
        exec(code, {"t": t})
    assert [m for m, _ in reads.calls] == ["tolist", "item", "numpy", "cpu", "__int__", "__bool__", "__float__"]
    with count_host_reads(ignore=("specc/runtime/state.py",)) as reads:
        exec(code, {"t": t})
    assert reads.count == 0


def test_step_io_one_copy_each_way():
    io = StepIO(4, 3, torch.device("cpu"))
    cap, active = io.upload([2, 0, 1], [True, False, True])
    assert cap.tolist() == [2, 0, 1] and active.tolist() == [True, False, True] and active.dtype == torch.bool
    assert io.download(torch.tensor([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="max_draft"):
        io.upload([1, 2], [True])


def test_default_timer_never_synchronizes(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append(a))
    m = SpecMetrics()
    with m.stage("draft"):
        sum(range(1000))
    assert calls == [] and m.stage_time_s["draft"] > 0
    sync = SyncTimer(torch.device("cuda"))  # its synchronize is the patched one: no device needed
    with sync.stage("verify", m.add_stage_time):
        pass
    assert len(calls) == 2 and m.stage_time_s["verify"] >= 0


def test_make_timer_kinds():
    assert isinstance(make_timer("none", "cpu"), WallTimer)
    assert isinstance(make_timer("sync", "cpu"), WallTimer)  # the host is the device
    assert isinstance(make_timer("events", "cpu"), WallTimer)
    if torch.cuda.is_available():
        assert isinstance(make_timer("events", "cuda"), EventTimer)
    with pytest.raises(PlanError, match="timing"):
        make_timer("always", "cpu")


def test_runtime_provides_what_the_step_uses():
    """``StepRuntime`` names what a step reads of its runtime; the engine's Runtime has each of them,
    and the step's functions take a StepRuntime (no untyped runtime)."""
    import inspect

    from specc.runtime.step import StepRuntime

    rt, _ = CONFIGS["plain"]()
    names = set(StepRuntime.__annotations__) | {"switch_to", "fill_noise"}
    assert all(hasattr(rt, n) for n in names), sorted(n for n in names if not hasattr(rt, n))
    for fn in (S.decode_step, S.prepare, S.admit, S.emit, S.emit_tokens, S.to_host, S.forward_passes):
        assert inspect.signature(fn).parameters["runtime"].annotation == "StepRuntime", fn.__name__
