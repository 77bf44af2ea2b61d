"""One decode step as data: ``prepare(batch) -> StepInputs``, the draft program, ``admit`` (the
schedule's verify budget), the state's verify program ``StepInputs -> StepOutputs`` (eager,
captured or compiled: :meth:`specc.runtime.state.SpecRuntimeState.run`), ``emit(StepOutputs)``, the
extend program. :class:`Step` names the data that flows (``StepInputs -> program -> StepOutputs``,
then the host copy :class:`HostOutputs`); :class:`StepRuntime` names exactly what a step uses of
its runtime (``specc.runtime.engine.Runtime`` implements it).

KV is committed by position (as gpt-fast, pytorch-labs/gpt-fast model.py KVCache): the verify forward of a step writes the target
KV of rows ``seq_len-1 .. seq_len-1+κ`` of each request; the accepted prefix is kept simply by
advancing ``seq_len``; rejected entries are overwritten by the next step and hidden meanwhile by the
causal-by-position mask. Padding (inactive rows) writes to the trash slot.

Step I/O (:class:`StepIO`, one per runtime): the step's host-side integers (each row's draft cap and
liveness) go to the device in one non-blocking copy from a (pinned, on CUDA) host buffer; its
results (accepted lengths, verified draft counts, output tokens, and a tree's accepted path) come
back in one device-to-host copy, in :func:`emit`, counted in ``SpecMetrics.num_host_reads``. The
drafters that need host data (n-gram and suffix lookups) read the batch's host mirrors
(``BatchView.host``) and this one copy of the results (``VerifyStep.host``), not the device. The
budget schedule admits on the device (:meth:`specc.runtime.schedule.BudgetSchedule.admit`); stage
timing does not synchronise unless asked (:func:`specc.runtime.metrics.make_timer`).

Host reads of a step, then: one on CUDA, the runtime's own read of its results. On the CPU the eager
step also reads its own ragged shape from its (CPU) inputs: the widest row's verify tokens (the step
verifies only those columns), a second read. The drafters add none: lookups read the host mirrors,
and the drafters whose forwards are sized by their own state (the draft model's catch-up width,
EAGLE/MTP heads' attended span and tree levels, multi-layer EAGLE's windows, the frozen-KV
assistant's span, DFlash's visible context) keep host mirrors of that state, updated from the step's
host copies (``BatchView.host``, ``VerifyStep.host``) and read back once per prefill. The kernels'
value checks are skipped inside the step
(:func:`specc.kernels.verify_common.trusted_values`). ``tests/runtime/test_step_io.py`` counts the reads
per drafter configuration (:func:`specc.runtime.testing.count_host_reads`);
``tools/step_sync_check.py`` runs steps under ``torch.cuda.set_sync_debug_mode("error")`` on CUDA.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Protocol, Sequence, Tuple

import torch

from specc.methods.base import HostVerify
from specc.kernels.verify_common import trusted_values
from specc.runtime.batch import DecodeBatch
from specc.runtime.metrics import SpecMetrics
from specc.runtime.state import SpecRuntimeState, StepInputs, StepOutputs


class StepIO:
    """A runtime's host<->device buffers of a decode step, allocated once (pinned host memory on CUDA,
    so the copies are asynchronous DMA).

    * In: ``upload(max_draft, live) -> (max_draft [n] int64, active [n] bool)`` on the device, from
      one host buffer ``[2, R]`` int64 copied with ``non_blocking=True``. The host buffer is reused by
      the next step only after that step's :meth:`download`, which waits for the stream, so a pending
      copy is never overwritten.
    * Out: ``download(t [n, C] int64) -> List[List[int]]``, one device-to-host copy into a host buffer
      ``[R, C]`` then a wait on that copy alone (a CUDA event), the step's one host read. On the CPU
      it is ``t.tolist()``.

    Args: ``max_rows`` R (the runtime's rows), ``max_cols`` the widest result row ``2 + 2 W``
    (accepted, verified, W output tokens, W accepted-path nodes), ``device``.
    """

    def __init__(self, max_rows: int, max_width: int, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        cols = 2 + 2 * max_width
        self._in_host = torch.zeros(2, max_rows, dtype=torch.int64, pin_memory=self.cuda)
        self._in_dev = torch.zeros(2, max_rows, dtype=torch.int64, device=self.device)
        self._out_host = torch.zeros(max_rows, cols, dtype=torch.int64, pin_memory=self.cuda)
        self._event = torch.cuda.Event() if self.cuda else None

    def upload(self, max_draft: Sequence[int], live: Sequence[bool]) -> Tuple[torch.Tensor, torch.Tensor]:
        """The step's per-row draft caps ``[n]`` int64 and liveness ``[n]`` bool on the device (one
        host-to-device copy, non-blocking). Raises ValueError when the two lengths differ or exceed
        the rows the buffers hold."""
        n = len(max_draft)
        if len(live) != n or n > self._in_host.shape[1]:
            raise ValueError(f"StepIO.upload: max_draft ({n}) and live ({len(live)}) must have one entry per row "
                             f"(at most {self._in_host.shape[1]})")
        if not self.cuda:  # the host is the device: build the tensors directly (no copy to wait for)
            return (torch.tensor(list(max_draft), dtype=torch.int64),
                    torch.tensor(list(live), dtype=torch.bool))
        host = self._in_host[:, :n]
        host[0] = torch.tensor(list(max_draft), dtype=torch.int64)
        host[1] = torch.tensor([int(x) for x in live], dtype=torch.int64)
        dev = self._in_dev[:, :n]
        dev.copy_(host, non_blocking=True)
        return dev[0], dev[1] != 0

    def download(self, t: torch.Tensor) -> List[List[int]]:
        """``t`` (``[n, C]`` int64 on the device) as nested lists: one device-to-host copy, then a wait
        for it (the step's host read)."""
        if not self.cuda:
            return t.tolist()
        n, c = t.shape
        host = self._out_host[:n, :c]
        host.copy_(t, non_blocking=True)
        self._event.record()
        self._event.synchronize()
        return host.tolist()


class StepRuntime(Protocol):
    """What a decode step uses of its runtime (``specc.runtime.engine.Runtime``), and nothing more.

    Attributes:
        device: where the step's tensors live.
        drafter: the :class:`specc.methods.base.Drafter` (or None); read for ``forward_passes``.
        schedule: the :class:`specc.runtime.schedule.Schedule` (``select``, ``admit``, ``observe``,
            ``verify_all``).
        by_key: ``(bucket, κ) ->`` :class:`SpecRuntimeState`.
        metrics: the run's :class:`SpecMetrics`.
        io: the runtime's :class:`StepIO`.
        max_model_len: tokens a request may reach (prompt + output).
        trash_slot: the KV slot padding writes go to.
        vocab_size: V of the target (noise shapes).
        eos_token_ids: ids that end a request.
        tokenizer: decodes stop strings (None: stop strings are not checked).
        stale_confidence: ``[R, N]`` fp32, the previous step's confidences (probabilistic budget).
    """

    device: torch.device
    drafter: Any
    schedule: Any
    by_key: Dict[Tuple[int, int], SpecRuntimeState]
    metrics: SpecMetrics
    io: StepIO
    max_model_len: int
    trash_slot: int
    vocab_size: int
    eos_token_ids: FrozenSet[int]
    tokenizer: Any
    stale_confidence: torch.Tensor

    def switch_to(self, key: Tuple[int, int]) -> None:
        """Make state ``key`` the active one (counts κ switches)."""

    def fill_noise(self, batch: DecodeBatch, rows: List[int], draw: Callable[[Any, int], torch.Tensor],
                   out: torch.Tensor) -> None:
        """Fill ``out[rows]`` with ``draw(generator, n)`` per the rows' generators."""


@dataclass
class HostOutputs:
    """The host copy of a step's :class:`StepOutputs` (the one device-to-host read), per row of the
    step: ``accepted`` drafts, ``num_valid`` (drafts verified), ``tokens`` (the row's output tokens,
    ``W`` entries, -1 past the bonus), for a tree ``accept_index`` (``W`` nodes, -1 past the path;
    None for a chain), and ``roots`` (each row's pending-token position, from the host)."""

    accepted: List[int]
    num_valid: List[int]
    tokens: List[List[int]]
    accept_index: Optional[List[List[int]]] = None
    roots: Optional[List[int]] = None

    def verify(self) -> HostVerify:
        """The drafter-facing host copy (``VerifyStep.host``)."""
        return HostVerify(accepted=self.accepted, num_valid=self.num_valid, accept_index=self.accept_index,
                          roots=self.roots)


@dataclass
class Step:
    """One decode step's data: ``inputs`` (filled by :func:`prepare`, the draft program and
    :func:`admit`) -> the state's verify program -> ``outputs`` (:class:`StepOutputs`, on the device)
    -> ``host`` (:class:`HostOutputs`, the one read). ``live[r]``: row r holds a live request."""

    state: SpecRuntimeState
    inputs: StepInputs
    live: List[bool]
    outputs: Optional[StepOutputs] = None
    host: Optional[HostOutputs] = None


def to_host(runtime: StepRuntime, t: torch.Tensor) -> List:
    """``t`` (``[n, C]`` int64) on the host through the runtime's :class:`StepIO`, counted as one host
    read of the step (``runtime.metrics.num_host_reads``)."""
    runtime.metrics.num_host_reads += 1
    return runtime.io.download(t)


def decode_step(runtime: StepRuntime, batch: DecodeBatch) -> Step:
    """One decode step (:func:`run_step`) with the kernels' value checks off
    (:func:`specc.kernels.verify_common.trusted_values`: the requests' sampling parameters were
    checked at submission, the trees by the drafters that built them). Returns the :class:`Step`."""
    with trusted_values():
        return run_step(runtime, batch)


def run_step(runtime: StepRuntime, batch: DecodeBatch) -> Step:
    """One decode step over the live rows: the schedule's state, then prepare → draft → admit →
    verify program → emit → extend. Concerns: which state (schedule), the step's data (prepare,
    admit, emit), the timing of each stage (the metrics' injected timer: no synchronisation by
    default) and of the verify program by the tokens it ran (metrics). Returns the :class:`Step`."""
    live_rows = [r for r in batch.live_rows() if batch.rows[r].finish_reason is None]
    rows = batch.num_rows_in_use()
    key = runtime.schedule.select(len(live_rows), rows)
    state = runtime.by_key[key]
    runtime.switch_to(key)
    metrics = runtime.metrics
    inp, live = prepare(runtime, batch, state, rows)
    step = Step(state=state, inputs=inp, live=live)
    passes = forward_passes(runtime)
    with metrics.stage("draft"):
        state.draft(inp)
    drafted = forward_passes(runtime)
    metrics.num_draft_passes += drafted - passes
    admit(runtime, state, inp, live)
    if inp.ragged:  # eager on the CPU: verify up to the widest row only (a CPU tensor read, no device sync)
        width = max(1, int(inp.num_tokens.max()))
        if width < inp.input_ids.shape[1]:
            inp = inp.view(inp.input_ids.shape[0], width)
            step.inputs = inp
    t_program, c_program = time.perf_counter(), time.process_time()
    if state.static:
        with metrics.stage("verify"):
            out = state.run(inp)
    else:
        out = state.run(inp, timer=metrics.stage)
    # host time of the program: on CUDA its launch time unless the timer synchronises ("sync")
    program_s = time.perf_counter() - t_program
    program_cpu_s = time.process_time() - c_program
    step.outputs = out
    with metrics.stage("emit"):
        accepted, view, verified, step.host = emit(runtime, batch, inp, out, live)
    # tokens the target forward ran: every row at the static width when captured or compiled, else the
    # verified tokens of the live rows (the CPU's ragged forward) or the rows in use at width W
    ran = inp.input_ids.numel() if state.static or not inp.ragged else verified
    metrics.record_verify(ran, program_s, program_cpu_s)
    with metrics.stage("extend"):
        state.extend(inp, out, view)
    metrics.num_draft_extend_passes += forward_passes(runtime) - drafted
    runtime.schedule.observe(key[0], accepted)
    metrics.record_step(key[1], len(live_rows), sum(accepted))
    return step


def forward_passes(runtime: StepRuntime) -> int:
    """The drafter's running count of draft-model forward passes (``Drafter.forward_passes``; 0
    without a drafter or for a plugin that does not count)."""
    return int(getattr(runtime.drafter, "forward_passes", 0) or 0)


def prepare(runtime: StepRuntime, batch: DecodeBatch, state: SpecRuntimeState, rows: int) -> Tuple[StepInputs, List[bool]]:
    """Fill the state's step inputs for its rows (eager: the rows in use; captured or compiled: the
    whole bucket): per-row draft caps, the pending token, positions and KV slots, sampling
    parameters and randomness. The per-row caps and liveness go to the device in the step's one
    host-to-device copy (:meth:`StepIO.upload`); the drafter's view carries the batch's host mirrors
    (``BatchView.host``). Returns ``(inputs, live)``: which of the rows hold a live request.
    Concerns: the step's inputs only (nothing runs a model)."""
    spec = state.spec
    inp = state.begin(rows)
    n, K, dev = inp.input_ids.shape[0], spec.num_steps, runtime.device  # K: κ, the deepest draft
    W = inp.input_ids.shape[1]
    N = W - 1  # draft positions (chain) or nodes (tree)
    live = [batch.rows[r] is not None and batch.rows[r].finish_reason is None for r in range(n)]
    max_draft = []
    for r in range(n):
        st = batch.rows[r]
        if not live[r]:
            max_draft.append(0)
            continue
        remaining = st.request.params.max_new_tokens - len(st.generated)
        room = runtime.max_model_len - batch.host_seq_lens[r]
        max_draft.append(max(0, min(K, remaining - 1, room - 1)))
    max_draft_t, active = runtime.io.upload(max_draft, live)  # [n] int64, [n] bool: the one copy in
    inp.batch = batch.view(n, max_draft_t, runtime.trash_slot, host=batch.host_view(n, max_draft))
    inp.active = active
    inp.max_root = max((batch.host_seq_lens[r] - 1 for r in range(n) if live[r]), default=0)
    inp.temperature.copy_(batch.temperature[:n])
    inp.top_k.copy_(batch.top_k[:n])
    inp.top_p.copy_(batch.top_p[:n])
    params = [batch.rows[r].request.params if live[r] else None for r in range(n)]
    inp.use_top_k = state.static or any(p is not None and p.top_k > 0 and p.temperature > 0 for p in params)
    inp.use_top_p = state.static or any(p is not None and p.top_p < 1 and p.temperature > 0 for p in params)
    # a captured / compiled program takes one path: the general one, or a greedy-rule state's greedy
    # kernel (a step with a sampled row then runs that state eagerly, SpecRuntimeState.run)
    inp.all_greedy = (not state.static or state.greedy_rule) and all(p is None or p.temperature == 0 for p in params)
    sampled = [r for r in range(n) if params[r] is not None and params[r].temperature > 0]
    # the synthetic rule draws acceptance uniforms for greedy rows too (vLLM accepts by the curve for all)
    drawn = [r for r in range(n) if live[r]] if spec.verify_rule == "synthetic" else sampled
    if N and drawn:
        runtime.fill_noise(batch, drawn, lambda g, m: torch.rand(m, N, generator=g, device=dev), inp.uniforms)
    if sampled:  # randomness (sampled rows only): draft noise, bonus noise
        V = runtime.vocab_size
        if inp.draft_noise is not None:
            runtime.fill_noise(batch, sampled, lambda g, m: exp_noise(g, m * N * V).view(m, N, V), inp.draft_noise)
        runtime.fill_noise(batch, sampled, lambda g, m: exp_noise(g, m * V).view(m, V), inp.exp_noise)
    seq = batch.seq_lens[:n]
    start = torch.where(active, seq - 1, torch.zeros_like(seq))  # [n] position of the pending token
    inp.input_ids[:, 0] = batch.tokens[:n].gather(1, start.view(n, 1)).view(n)
    inp.positions.copy_(start.view(n, 1) + torch.arange(W, device=dev).view(1, W))  # [n, W]
    inp.cache_slots.copy_(torch.where(active.view(n, 1), inp.positions,
                                      torch.full_like(inp.positions, runtime.trash_slot)))
    return inp, live


def admit(runtime: StepRuntime, state: SpecRuntimeState, inp: StepInputs, live: Sequence[bool]) -> None:
    """Let the schedule cut each live request's drafts to a prefix (``budget``, on the device), then
    size the step: ``num_tokens`` per row (what the ragged verify costs; 0 for rows without a live
    request)."""
    K = state.spec.num_steps
    N = inp.confidence.shape[1]  # draft positions (chain: κ) or tree nodes
    n = inp.input_ids.shape[0]
    verified = inp.num_valid.clone() if runtime.schedule.verify_all else None
    num_live = sum(1 for x in live if x)
    if K > 0 and num_live:
        conf = inp.confidence
        if state.spec.draft_sampling == "probabilistic":
            # budget from the previous step's confidences: a prefix chosen from the current sampled
            # drafts' own scores would bias rejection sampling (see drafters.base.Proposal)
            stale = runtime.stale_confidence[:n, :N]
            conf, stale[:] = stale.clone(), conf
        admitted = runtime.schedule.admit(conf, inp.num_valid, num_live)
        if admitted is not None:
            inp.num_valid.copy_(admitted)
    verified = inp.num_valid if verified is None else verified  # cap_accept: verify all, accept admitted
    inp.num_tokens.copy_(torch.where(inp.active, verified + 1, torch.zeros_like(verified)))


def emit(runtime: StepRuntime, batch: DecodeBatch, inp: StepInputs, out: StepOutputs,
         live: Sequence[bool]) -> Tuple[List[int], Any, int, HostOutputs]:
    """Give each live request its accepted drafts and bonus token (the step's one host read of its
    results, :func:`to_host`: accepted lengths, verified draft counts, output tokens and, for a tree,
    the accepted path), update its counters. Returns ``(accepted drafts of each live request, bonus
    excluded, for the schedule; the drafter's batch view after the append, with its host mirrors;
    the tokens verified over the live rows, Σ (num_valid + 1); the :class:`HostOutputs`)``.
    Concerns: the host read, the requests' tokens and counters."""
    res = out.result
    w = res.output_tokens.shape[1]
    parts = [res.accepted_len.to(torch.int64).view(-1, 1), inp.num_valid.to(torch.int64).view(-1, 1),
             res.output_tokens.to(torch.int64)]
    tree = out.path is not None and res.accept_index is not None
    if tree:
        parts.append(res.accept_index.to(torch.int64))
    host = to_host(runtime, torch.cat(parts, dim=1))
    outputs = HostOutputs(accepted=[row[0] for row in host], num_valid=[row[1] for row in host],
                          tokens=[row[2:2 + w] for row in host],
                          accept_index=[row[2 + w:] for row in host] if tree else None,
                          roots=[batch.host_seq_lens[r] - 1 if on else 0 for r, on in enumerate(live)])
    out.host = outputs.verify()
    rows, kept, observed = [], [], []
    verified = 0
    for r, on in enumerate(live):
        if not on:
            continue
        a, valid = outputs.accepted[r], outputs.num_valid[r]
        verified += valid + 1
        batch.rows[r].counters.observe(valid, a)
        rows.append(r)
        kept.append(emit_tokens(runtime, batch, r, outputs.tokens[r][:1 + a]))
        observed.append(a)
    batch.append_many(rows, kept)
    n = inp.input_ids.shape[0]
    view = batch.view(n, inp.batch.max_draft, runtime.trash_slot, host=batch.host_view(n, inp.batch.host.max_draft))
    return observed, view, verified, outputs


def emit_tokens(runtime: StepRuntime, batch: DecodeBatch, row: int, tokens: Sequence[int]) -> List[int]:
    """Give a step's tokens to a request, stopping at EOS, a stop string, max_new_tokens or
    max_model_len (later tokens of the step are dropped; vLLM's finish reasons). Returns the tokens
    kept, which the caller appends to the row's history."""
    st = batch.rows[row]
    p = st.request.params
    if not st.generated and tokens:
        st.first_token_time = time.perf_counter()
    kept: List[int] = []
    for t in tokens:
        kept.append(int(t))
        st.generated.append(int(t))
        if not p.ignore_eos and int(t) in runtime.eos_token_ids:
            st.finish_reason = "eos"
            break
        if p.stop and runtime.tokenizer is not None:
            text = runtime.tokenizer.decode(st.generated)
            cut = min((i for i in (text.find(s) for s in p.stop) if i >= 0), default=-1)
            if cut >= 0:
                st.finish_reason, st.stop_text = "stop", text[:cut]
                break
        if len(st.generated) >= p.max_new_tokens:
            st.finish_reason = "length"
            break
        if batch.host_seq_lens[row] + len(kept) >= runtime.max_model_len:
            st.finish_reason = "max_model_len"
            break
    return kept


def exp_noise(gen: torch.Generator, n: int) -> torch.Tensor:
    """``[n]`` fp32 i.i.d. Exp(1) draws > 0 from ``gen`` (the exponential race of sampling)."""
    e = torch.empty(n, dtype=torch.float32, device=gen.device).exponential_(generator=gen)
    return e.clamp_(min=torch.finfo(torch.float32).tiny)
