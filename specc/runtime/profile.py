"""``specc profile``: measure this device's cost table — what one decode step costs by the number of
target tokens it verifies, what one draft pass costs by the number of requests, and what the accept
kernel costs — for the cost model (``explain``), ``schedule.kind: auto`` and ``budget``.

Layout of a measurement of n target tokens: ``rows = min(n, max_batch)`` requests, each with a
``context``-token history already in the KV cache, verifying ``n`` tokens in all (a ragged verify:
``ceil(n / rows)`` or one fewer per request), exactly as the runtime's verify stage runs them. Each
size is timed ``repeats`` times after one warm-up run and the median kept, every size once per round,
each timed call after untimed calls of the same size worth ``WARM_MS`` (:func:`steady_rounds`): the
runtime runs steps of one shape back to back, and on a CPU the first few calls after a different,
heavier shape run markedly slower than that steady state (timed right after the largest size, the small
sizes' table overstated the runtime's step); the accept kernel (the
plan's verify rule over the same logits) is timed the same way; ``verify_ms = forward_ms +
accept_ms``. A draft pass is one ``propose`` of κ = 1 over b requests.

Cost-table JSON (``format: specc-cost-table/1``), read by :func:`specc.predict.cost.load_cost_table`:

====================  ======================================================================
key                   meaning
====================  ======================================================================
``format``            ``"specc-cost-table/1"``
``device``            ``"cpu"`` or ``"cuda"``; ``device_name``: CPU model / GPU name
``threads``           CPU threads the matmuls used; ``versions``: specc, torch, numpy, python
``plan``, ``method``  the profiled plan and method; ``context_tokens``: history per request
``capture_sizes``     sizes the step pads to (CUDA graphs); ``[1]`` on the CPU, which runs eagerly
                      and pads nothing, so lookups interpolate between profiled sizes
``verify_ms``         ``{tokens: ms}``: target forward + accept kernel over that many tokens
``forward_ms``        ``{tokens: ms}``: the target forward alone; ``accept_ms``: the accept kernel
``draft_ms``          ``{requests: ms}``: one draft pass (absent for plain decoding)
``repeats``           timed runs per size (median kept)
``settings``          every (dtype, compile backend) measured: ``{"float32/eager": {"forward_ms":
                      {...}, "state_ms": {"BxW": ms}}, "bfloat16/eager": ..., "bfloat16/inductor":
                      {"state_ms": ...}}`` (``state_ms``: the forward at each candidate state's shape,
                      B requests x W verify tokens)
``choice``            ``{"dtype", "compile_backend", "why"}``: the setting whose mean ``state_ms`` is
                      lowest (``runtime.dtype: auto`` and ``compile_backend: auto`` read it; the top-level
                      ``verify_ms`` / ``forward_ms`` are that dtype's eager tables)
``cpu``               ``specc.device.cpu_facts``: model, torch's capability, oneDNN's ISA line and
                      bf16 kernel, AMX, threads
``qgemm``             the native dtype's kernel variants (``specc.kernels.qgemm``) timed at the same
                      state shapes: ``{"state_ms": {variant: {"BxW": ms}}, "chosen": variant, "why"}``;
                      the chosen one (lowest mean) is ``choice["qgemm_variant"]``, which a runtime
                      loading the native target sets before it loads (:func:`choose_variant`)
====================  ======================================================================

Half precision on the CPU is timed as the runtime runs it: row-invariant
(``LlamaModel.set_row_invariant``), so that its speculative output equals its plain output.
"""
from __future__ import annotations

import math
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from specc.device import cpu_name

FORMAT = "specc-cost-table/1"


def check_sizes(max_tokens: Optional[int], max_batch: int, max_width: int, context: int, max_model_len: int) -> int:
    """The verify width per request the profile needs, ``ceil(top / max_batch)`` with ``top`` =
    ``max_tokens`` or ``max_batch * max_width``, after checking that ``context + width + 2`` cache
    slots fit ``max_model_len``.

    Raises:
        ValueError: naming the option to lower: ``--max-tokens`` (with the largest value that fits)
            when it asks for more than the plan's own sizes would, else ``--context``.
    """
    top = int(max_tokens or max_batch * max_width)
    width = max(1, math.ceil(top / max_batch))
    if context + width + 2 <= max_model_len:
        return width
    room = max_model_len - context - 2  # verify tokens per request that fit after the context
    if max_tokens is not None and width > max_width:
        fix = (f"lower --max-tokens to at most {room * max_batch}" if room >= 1 else
               f"lower --context below {max_model_len - 2} and --max-tokens")
        raise ValueError(f"--max-tokens {max_tokens} is {width} verified tokens per request over the largest bucket "
                         f"({max_batch} requests); after --context {context} that does not fit max_model_len "
                         f"{max_model_len}; {fix} (the plan's own largest step is {max_batch * max_width} tokens)")
    raise ValueError(f"--context {context} + verify width {width} does not fit max_model_len {max_model_len}; lower "
                     f"--context to at most {max_model_len - width - 2}")


def token_grid(max_tokens: int) -> List[int]:
    """Sizes to profile: every count up to 64, every 8th to 256, every 32nd beyond (and the top)."""
    grid = [n for n in range(1, min(64, max_tokens) + 1)]
    grid += list(range(72, min(256, max_tokens) + 1, 8))
    grid += list(range(288, max_tokens + 1, 32))
    if grid[-1] != max_tokens:
        grid.append(max_tokens)
    return sorted(set(grid))


#: untimed work (ms) at a size right before each timed call at it (see :func:`steady_rounds`)
WARM_MS = 60.0


def steady_rounds(calls: Sequence[tuple], repeats: int, sync: Optional[Callable[[], None]] = None, *,
                  warm_ms: float = WARM_MS, clock: Callable[[], float] = time.perf_counter,
                  on_round: Optional[Callable[[int], None]] = None) -> Dict[Any, List[float]]:
    """Time every ``(key, fn)`` of ``calls`` once per round for ``repeats`` rounds (at least one) after
    one untimed round, each timed call right after untimed calls of the same ``fn`` that took at least
    ``warm_ms`` ms together (one call at least): the steady state of the runtime, which runs one shape's
    steps back to back, while a burst of load from other jobs still falls on all sizes alike.

    Args:
        calls: ``(key, fn)`` pairs; ``fn()`` runs one forward (its result is dropped).
        repeats: timed rounds; sync: called after each call (CUDA), or None.
        warm_ms: untimed work before each timed call, in ms; clock: seconds (``time.perf_counter``).
        on_round: called with the round's index after each round (0 is the untimed one).
    Returns:
        ``{key: [ms per timed round]}``.
    """
    times: Dict[Any, List[float]] = {key: [] for key, _ in calls}
    for rnd in range(max(1, repeats) + 1):
        for key, fn in calls:
            spent = 0.0
            while True:  # untimed calls of this size first: what the runtime's previous steps did
                t0 = clock()
                fn()
                if sync:
                    sync()
                spent += (clock() - t0) * 1e3
                if rnd == 0 or spent >= warm_ms:
                    break
            if rnd == 0:
                continue
            t0 = clock()
            fn()
            if sync:
                sync()
            times[key].append((clock() - t0) * 1e3)
        if on_round:
            on_round(rnd)
    return times


def _time_once(fn: Callable[[], Any], sync: Optional[Callable[[], None]]) -> float:
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) * 1e3


def _median_ms(fn: Callable[[], Any], repeats: int, sync: Optional[Callable[[], None]]) -> float:
    """One warm-up call, then the median of ``repeats`` timed calls (0 repeats: the warm-up's time)."""
    t_first = _time_once(fn, sync)
    if repeats == 0:
        return t_first
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


@torch.inference_mode()
def profile_costs(target: Any, drafter: Any, *, max_batch: int, max_width: int, verify_rule: str = "greedy",
                  context: int = 256, repeats: int = 5, max_tokens: Optional[int] = None,
                  on_progress: Optional[Callable[[str], None]] = None, seed: int = 0,
                  sizes: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Measure the cost table (see the module docstring) on the target's device.

    Args:
        target: a ``LlamaModel``; drafter: the plan's ``Drafter`` or None.
        max_batch: the largest batch bucket; max_width: the widest verify per request (κ + 1).
        verify_rule: the accept kernel timed (``greedy``, ``standard``, ``synthetic``).
        context: history tokens per request before the measured step.
        max_tokens: the largest token count profiled (default ``max_batch * max_width``).
        on_progress: called once per round of the verify sizes and once per draft size (a progress bar).
        sizes: verified token counts to profile (default :func:`token_grid` up to ``max_tokens``); a
            coarser grid profiles faster (``specc tune`` on a device without a table).
    Returns:
        The table's measured part: ``verify_ms``, ``forward_ms``, ``accept_ms``, ``draft_ms`` (str keys).
    Raises:
        ValueError: the sizes do not fit the target's cache (:func:`check_sizes`).
    """
    from specc.methods.base import DraftSampling, PrefillChunk
    from specc.kernels import greedy_verify, process_logits, rejection_verify
    from specc.runtime.batch import DecodeBatch

    dev = target.norm.weight.device
    V = target.config.vocab_size
    top = int(max_tokens or max_batch * max_width)
    width = check_sizes(max_tokens, max_batch, max_width, context, target.config.max_model_len)
    cache_len = context + width + 2
    target.setup_cache(max_batch, cache_len)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    history = torch.randint(0, V, (max_batch, context), generator=gen).to(dev)  # [B, C]
    positions = torch.arange(context, device=dev).expand(max_batch, context).contiguous()
    hidden_layers = tuple(getattr(drafter, "hidden_layers", ()) or ())
    _, hidden = target.forward(history, positions, hidden_layers=hidden_layers,
                               logits_at=torch.full((max_batch, 1), context - 1, device=dev))
    out: Dict[str, Dict[str, float]] = {"verify_ms": {}, "forward_ms": {}, "accept_ms": {}, "draft_ms": {}}
    eager = dev.type == "cpu"
    cases = []  # (n, forward, accept) per profiled size
    grid = sorted({int(n) for n in sizes if 1 <= int(n) <= top}) if sizes else token_grid(top)
    for n in grid:
        rows = min(n, max_batch)
        w = math.ceil(n / rows)
        counts = torch.full((rows,), n // rows, dtype=torch.int64, device=dev)
        counts[: n - int(counts.sum())] += 1  # [rows], summing to n
        ids = torch.randint(0, V, (rows, w), generator=gen).to(dev)
        pos = (context + torch.arange(w, device=dev)).expand(rows, w).contiguous()
        fwd = (lambda ids=ids, pos=pos, counts=counts: target.forward(
            ids, pos, pos, None, hidden_layers=hidden_layers, num_tokens=counts if eager else None))
        drafts = torch.randint(0, V, (rows, w - 1), generator=gen).to(dev)
        cases.append((n, fwd, drafts, counts - 1))
    # every size once per round, round after round (load from other jobs falls on all sizes alike), each
    # timed in the steady state of a run of its own steps (the runtime's), not right after another size
    times = steady_rounds([(n, fwd) for n, fwd, _, _ in cases], repeats, sync,
                          on_round=(lambda r: on_progress(f"round {r} of {repeats}")) if on_progress else None)
    for n, fwd, drafts, valid in cases:
        logits, _ = fwd()
        rows, w = drafts.shape[0], drafts.shape[1] + 1
        if verify_rule == "greedy":
            acc = lambda: greedy_verify(drafts, logits, valid)  # noqa: E731
        else:
            temp = torch.ones(rows, device=dev)
            u = torch.rand(rows, w - 1, generator=gen).to(dev)
            noise = torch.empty(rows, V, device=dev).exponential_()
            acc = lambda: rejection_verify(drafts, process_logits(logits, temp, None, None), None, u,  # noqa: E731
                                           noise, valid)
        a_ms = _median_ms(acc, repeats, sync)
        f_ms = statistics.median(times[n])
        out["forward_ms"][str(n)] = round(f_ms, 4)
        out["accept_ms"][str(n)] = round(a_ms, 4)
        out["verify_ms"][str(n)] = round(f_ms + a_ms, 4)
    if drafter is not None:
        drafter.setup(max_batch, cache_len, dev)
        batch = DecodeBatch(max_batch, cache_len, dev)
        tokens = torch.cat([history, torch.randint(0, V, (max_batch, 1), generator=gen).to(dev)], dim=1)
        batch.tokens[:, : context + 1] = tokens
        batch.seq_lens[:] = context + 1
        batch.prompt_lens[:] = context
        batch.active[:] = True
        batch.host_seq_lens = [context + 1] * max_batch
        rows_all = torch.ones(max_batch, dtype=torch.bool, device=dev)
        view = batch.view(max_batch, torch.ones(max_batch, dtype=torch.int64, device=dev), cache_len - 1)
        drafter.prefill(view, PrefillChunk(input_ids=history, positions=positions, cache_slots=positions,
                                           rows=rows_all, target_hidden=list(hidden)))
        for b in sorted({b for b in token_grid(max_batch)}):
            view = batch.view(b, torch.ones(b, dtype=torch.int64, device=dev), cache_len - 1)
            d_ms = _median_ms(lambda: drafter.propose(view, 1, DraftSampling("greedy")), repeats, sync)
            out["draft_ms"][str(b)] = round(d_ms, 4)
            if on_progress:
                on_progress(f"draft {b} requests")
    else:
        del out["draft_ms"]
    return out


def cost_table(measured: Dict[str, Any], *, device: torch.device, plan: str, method: str, context: int,
               repeats: int, threads: int, capture_sizes: Sequence[int] = (1,)) -> Dict[str, Any]:
    """The whole cost-table JSON object (schema in the module docstring) around ``measured``."""
    import numpy

    import specc

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return dict({"format": FORMAT, "device": device.type, "device_name": name, "threads": threads,
                 "versions": {"specc": specc.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
                              "python": platform.python_version()},
                 "plan": plan, "method": method, "context_tokens": context, "repeats": repeats,
                 "capture_sizes": list(capture_sizes)}, **measured)


@torch.inference_mode()
def time_state_shapes(target: Any, shapes: Sequence[tuple], *, context: int = 256, repeats: int = 5,
                      compiled: bool = False, seed: int = 0, fill: bool = True, interleave: bool = False,
                      on_progress: Optional[Callable[[str], None]] = None) -> Dict[str, float]:
    """The target forward at each candidate state's shape ``(B, W)`` (B requests, W verify tokens each,
    after ``context`` cached tokens): ``{"BxW": median ms}``. A shape ``(B, W, n)`` is a ragged verify
    (the eager CPU's, ``num_tokens``): its first ``n`` rows verify W tokens, the others one, key
    ``"BxWrn"`` (not with ``compiled``, whose verify is never ragged). ``compiled``: the forward is
    ``torch.compile``d for that shape (inductor, no dynamic dimensions, ``freezing``), as
    ``runtime.compile_backend: inductor`` runs a state's verify program; the compile itself is not
    timed (it happens once, at load). ``fill=False`` skips the prefill of the ``context`` history (the
    attention then reads zero K/V: the same work, so the same time, without a B x context prefill —
    what ``specc tune``'s spot check of the cost table uses). ``interleave``: every shape once per
    round, one warm-up round then ``repeats`` rounds (at least one), median per shape, each timed call
    after ``WARM_MS`` of untimed calls of its shape (:func:`steady_rounds`, as :func:`profile_costs`
    does: a burst of load from other jobs falls on all shapes alike, not on one); otherwise each shape's
    warm-up and repeats run back to back. Raises ValueError when ``context`` + the widest W does not fit
    the target's ``max_model_len``."""
    dev = target.norm.weight.device
    V = target.config.vocab_size
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    top_b = max(shape[0] for shape in shapes)
    top_w = max(shape[1] for shape in shapes)
    target.setup_cache(top_b, context + top_w + 2)
    if fill:
        history = torch.randint(0, V, (top_b, context), generator=gen).to(dev)
        target.forward(history, torch.arange(context, device=dev).expand(top_b, context).contiguous(),
                       logits_at=torch.full((top_b, 1), context - 1, device=dev))
    out: Dict[str, float] = {}
    calls = []  # (key, call) per shape, timed round-robin when interleaved
    for shape in shapes:
        b, w = shape[0], shape[1]
        key = f"{b}x{w}" if len(shape) == 2 else f"{b}x{w}r{shape[2]}"
        ids = torch.randint(0, V, (b, w), generator=gen).to(dev)
        pos = (context + torch.arange(w, device=dev)).expand(b, w).contiguous()
        ragged = None
        if len(shape) == 3:  # a ragged verify: the first shape[2] rows at w tokens, the others at one
            ragged = torch.ones(b, dtype=torch.int64, device=dev)
            ragged[: shape[2]] = w
        if compiled and ragged is not None:
            raise ValueError(f"time_state_shapes: the ragged shape {shape} cannot be timed compiled (a compiled "
                             f"verify runs every row at the static width)")
        if compiled:
            import torch._inductor.config as inductor_config

            from specc.runtime.compile import own_code

            def forward(ids, pos):
                return target.forward(ids, pos, pos, None)

            fn = torch.compile(own_code(forward, f"forward_{b}x{w}_{target.norm.weight.dtype}"), dynamic=False)
            with inductor_config.patch(freezing=True):
                fn(ids, pos)  # compiled here (not timed: it happens once, at load)
            call = (lambda fn=fn, ids=ids, pos=pos: fn(ids, pos))
        else:
            call = (lambda ids=ids, pos=pos, ragged=ragged: target.forward(ids, pos, pos, None, num_tokens=ragged))
        if interleave:
            calls.append((key, call))
            continue
        out[key] = round(_median_ms(call, repeats, sync), 4)
        if on_progress:
            on_progress(key)
    if calls:
        rounds = max(1, repeats)
        times = steady_rounds(calls, rounds, sync, on_round=(lambda r: on_progress(f"round {r} of {rounds}"))
                              if on_progress else None)
        out = {key: round(statistics.median(ts), 4) for key, ts in times.items()}
    return out


def choose_variant(state_ms: Dict[str, Dict[str, float]]) -> Dict[str, str]:
    """The quantized-kernel variant (``specc.kernels.qgemm``) with the lowest mean forward over the plan's
    state shapes: ``{"chosen": variant, "why": ranking}`` from ``{variant: {"BxW": ms}}``. Variants give
    different bits from each other (the int8-activation ones equal each other), so one is chosen for the
    whole process, not per shape. Raises ValueError when ``state_ms`` is empty."""
    means = {v: statistics.mean(t.values()) for v, t in state_ms.items() if t}
    if not means:
        raise ValueError("choose_variant: no variant was timed")
    best = min(means, key=means.get)
    ranking = ", ".join(f"{v} {m:.1f} ms" for v, m in sorted(means.items(), key=lambda kv: kv[1]))
    return {"chosen": best, "why": f"lowest mean native forward over the plan's state shapes: {ranking}"}


def choose(settings: Dict[str, Dict[str, Any]], cpu: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    """The setting (``"dtype/backend"``) with the lowest mean forward time over the candidate states'
    shapes (``state_ms``), as ``{"dtype", "compile_backend", "why"}``. ``why`` ranks every setting by
    its mean, says for each half-precision dtype why it was or was not chosen (its time as a multiple
    of float32's, and how its forward grows from 1 verified token to the widest profiled, up to 16:
    a flat curve is what makes speculation pay), and names oneDNN's bf16 matmul kernel and ISA line
    when ``cpu`` (:func:`specc.device.cpu_facts`) is given. Raises ValueError when no setting has
    ``state_ms``. A half-precision inductor setting is never chosen while another was timed (its
    kernels are not row-invariant: exactness first)."""
    means = {k: statistics.mean(v["state_ms"].values()) for k, v in settings.items() if v.get("state_ms")}
    if not means:
        raise ValueError("choose: no setting has state_ms")
    # inductor's half-precision CPU kernels are not row-invariant: a W-token verify can round a row
    # differently from the 1-token step, and speculative greedy output then differs from plain greedy
    # (tools/bench_backends.py); such a setting is timed and ranked but never chosen
    inexact = [k for k in means if k.split("/")[0] in ("bfloat16", "float16") and k.endswith("/inductor")]
    eligible = [k for k in means if k not in inexact] or list(means)
    best = min(eligible, key=means.get)
    dtype, backend = best.split("/")
    shapes = ", ".join(next(v["state_ms"] for v in settings.values() if v.get("state_ms")))
    ranking = ", ".join(f"{k} {m:.1f} ms" for k, m in sorted(means.items(), key=lambda kv: kv[1]))
    notes = [f"lowest mean forward over the plan's state shapes (B x W: {shapes}): {ranking}"]
    if inexact and eligible != list(means):
        notes.append(f"{', '.join(sorted(inexact))} not eligible: inductor's half-precision kernels are not "
                     f"row-invariant on the CPU, so speculative greedy output can differ from plain greedy")
    by_dtype: Dict[str, float] = {}
    for k, m in means.items():
        d = k.split("/")[0]
        by_dtype[d] = min(m, by_dtype.get(d, m))
    fp32 = by_dtype.get("float32")
    for d, m in sorted(by_dtype.items()):
        if d == "float32" or not fp32:
            continue
        ratio = m / fp32
        verdict = "chosen" if d == dtype else "not chosen"
        rel = f"{1 / ratio:.2f}x faster than float32" if ratio < 1 else f"{ratio:.2f}x float32's time"
        notes.append(f"{d} {verdict}: {rel}")
    growth = []
    for k, v in sorted(settings.items()):
        fw = {int(n): ms for n, ms in (v.get("forward_ms") or {}).items()}
        top = max((n for n in fw if n <= 16), default=None)
        if fw.get(1) and top and top > 1:
            growth.append(f"{k} {fw[top] / fw[1]:.2f}x at {top}")
    if growth:
        notes.append(f"forward over W verified tokens / over 1 token: {', '.join(growth)}")
    if cpu:
        notes.append(f"oneDNN bf16 matmul kernel {cpu.get('onednn_bf16_kernel') or 'unknown'} "
                     f"({'AMX' if cpu.get('amx') else 'no AMX'}; ISA: {cpu.get('onednn_isa') or 'not reported'})")
    return {"dtype": dtype, "compile_backend": backend, "why": "; ".join(notes)}
