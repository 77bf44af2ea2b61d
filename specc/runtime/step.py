"""One decode step as data: ``prepare(batch) -> StepInputs``, the draft program, ``admit`` (the
schedule's verify budget), the state's verify program ``StepInputs -> StepOutputs`` (eager,
captured or compiled: :meth:`specc.runtime.state.SpecRuntimeState.run`), ``emit(StepOutputs)``, the
extend program.

KV is committed by position (gpt-fast, anchors A1): the verify forward of a step writes the target
KV of rows ``seq_len-1 .. seq_len-1+κ`` of each request; the accepted prefix is kept simply by
advancing ``seq_len``; rejected entries are overwritten by the next step and hidden meanwhile by the
causal-by-position mask. Padding (inactive rows) writes to the trash slot.

Host reads: a step reads device values on the host once, in :func:`emit` (:func:`to_host`: the
accepted lengths, the verified draft counts and the output tokens, one transfer), counted in
``SpecMetrics.num_host_reads``. The budget schedule admits on the device
(:meth:`specc.runtime.schedule.BudgetSchedule.admit`). On the CPU the eager step also reads its own
ragged shape from its inputs (CPU tensors: no device synchronisation): the widest row's verify
tokens (the step verifies only those columns) and each row's count (the target forward packs them).
"""
from __future__ import annotations

import time
from typing import Any, List, Sequence, Tuple

import torch

from specc.runtime.batch import DecodeBatch
from specc.runtime.state import SpecRuntimeState, StepInputs, StepOutputs


def to_host(runtime: Any, t: torch.Tensor) -> List:
    """``t.tolist()``, counted as one host read of the step (``runtime.metrics.num_host_reads``)."""
    runtime.metrics.num_host_reads += 1
    return t.tolist()


def decode_step(runtime: Any, batch: DecodeBatch) -> None:
    """One decode step over the live rows: the schedule's state, then prepare → draft → admit →
    verify program → emit → extend. Concerns: which state (schedule), the step's data (prepare,
    admit, emit), the timing of each stage and of the verify program by the tokens it ran (metrics)."""
    live_rows = [r for r in batch.live_rows() if batch.rows[r].finish_reason is None]
    rows = batch.num_rows_in_use()
    key = runtime.schedule.select(len(live_rows), rows)
    state = runtime.by_key[key]
    runtime.switch_to(key)
    sync = runtime.sync if runtime.device.type == "cuda" else None
    metrics = runtime.metrics
    inp, live = prepare(runtime, batch, state, rows)
    passes = forward_passes(runtime)
    with metrics.stage("draft", sync):
        state.draft(inp)
    drafted = forward_passes(runtime)
    metrics.num_draft_passes += drafted - passes
    admit(runtime, state, inp, live)
    if inp.ragged:  # eager on the CPU: verify up to the widest row only (a CPU tensor read, no device sync)
        width = max(1, int(inp.num_tokens.max()))
        if width < inp.input_ids.shape[1]:
            inp = inp.view(inp.input_ids.shape[0], width)
    t_program, c_program = time.perf_counter(), time.process_time()
    if state.static:
        with metrics.stage("verify", sync):
            out = state.run(inp)
    else:
        out = state.run(inp, timer=lambda name: metrics.stage(name, sync))
    program_s = time.perf_counter() - t_program  # the stages synchronised CUDA before reading the clock
    program_cpu_s = time.process_time() - c_program
    with metrics.stage("emit"):
        accepted, view, verified = emit(runtime, batch, inp, out, live)
    # tokens the target forward ran: every row at the static width when captured or compiled, else the
    # verified tokens of the live rows (the CPU's ragged forward) or the rows in use at width W
    ran = inp.input_ids.numel() if state.static or not inp.ragged else verified
    metrics.record_verify(ran, program_s, program_cpu_s)
    with metrics.stage("extend", sync):
        state.extend(inp, out, view)
    metrics.num_draft_extend_passes += forward_passes(runtime) - drafted
    runtime.schedule.observe(key[0], accepted)
    metrics.record_step(key[1], len(live_rows), sum(accepted))


def forward_passes(runtime: Any) -> int:
    """The drafter's running count of draft-model forward passes (``Drafter.forward_passes``; 0
    without a drafter or for a plugin that does not count)."""
    return int(getattr(runtime.drafter, "forward_passes", 0) or 0)


def prepare(runtime: Any, batch: DecodeBatch, state: SpecRuntimeState, rows: int) -> Tuple[StepInputs, List[bool]]:
    """Fill the state's step inputs for its rows (eager: the rows in use; captured or compiled: the
    whole bucket): per-row draft caps, the pending token, positions and KV slots, sampling
    parameters and randomness. Returns ``(inputs, live)``: which of the rows hold a live request.
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
    max_draft_t = torch.tensor(max_draft, dtype=torch.int64, device=dev)  # [n]
    inp.batch = batch.view(n, max_draft_t, runtime.trash_slot)
    inp.temperature.copy_(batch.temperature[:n])
    inp.top_k.copy_(batch.top_k[:n])
    inp.top_p.copy_(batch.top_p[:n])
    params = [batch.rows[r].request.params if live[r] else None for r in range(n)]
    inp.use_top_k = state.static or any(p is not None and p.top_k > 0 and p.temperature > 0 for p in params)
    inp.use_top_p = state.static or any(p is not None and p.top_p < 1 and p.temperature > 0 for p in params)
    inp.all_greedy = not state.static and all(p is None or p.temperature == 0 for p in params)
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
    active = torch.tensor(live, dtype=torch.bool, device=dev)  # [n]
    seq = batch.seq_lens[:n]
    start = torch.where(active, seq - 1, torch.zeros_like(seq))  # [n] position of the pending token
    inp.input_ids[:, 0] = batch.tokens[:n].gather(1, start.view(n, 1)).view(n)
    inp.positions.copy_(start.view(n, 1) + torch.arange(W, device=dev).view(1, W))  # [n, W]
    inp.cache_slots.copy_(torch.where(active.view(n, 1), inp.positions,
                                      torch.full_like(inp.positions, runtime.trash_slot)))
    return inp, live


def admit(runtime: Any, state: SpecRuntimeState, inp: StepInputs, live: Sequence[bool]) -> None:
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
    active = torch.tensor(list(live), dtype=torch.bool, device=runtime.device)
    inp.num_tokens.copy_(torch.where(active, verified + 1, torch.zeros_like(verified)))


def emit(runtime: Any, batch: DecodeBatch, inp: StepInputs, out: StepOutputs,
         live: Sequence[bool]) -> Tuple[List[int], Any]:
    """Give each live request its accepted drafts and bonus token (one host read of the step's
    results, :func:`to_host`), update its counters. Returns ``(accepted drafts of each live request,
    bonus excluded, for the schedule; the drafter's batch view after the append; the tokens verified
    over the live rows, Σ (num_valid + 1))``. Concerns: the host read, the requests' tokens and
    counters."""
    res = out.result
    host = to_host(runtime, torch.cat([res.accepted_len.to(torch.int64).view(-1, 1),
                                       inp.num_valid.to(torch.int64).view(-1, 1),
                                       res.output_tokens.to(torch.int64)], dim=1))
    rows, kept, observed = [], [], []
    verified = 0
    for r, on in enumerate(live):
        if not on:
            continue
        a, valid = int(host[r][0]), int(host[r][1])
        verified += valid + 1
        batch.rows[r].counters.observe(valid, a)
        rows.append(r)
        kept.append(emit_tokens(runtime, batch, r, host[r][2: 3 + a]))
        observed.append(a)
    batch.append_many(rows, kept)
    return observed, batch.view(inp.input_ids.shape[0], inp.batch.max_draft, runtime.trash_slot), verified


def emit_tokens(runtime: Any, batch: DecodeBatch, row: int, tokens: Sequence[int]) -> List[int]:
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
