"""One ``specc tune`` run: the four steps (:mod:`specc.tune`) under one wall-clock budget, with progress
bars, and the report. ``specc.commands.tune`` validates the options and builds it."""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from specc.errors import SpeccError

MEASURE_SHARE = 0.55
CONFIRM_SHARE = 0.9
RECONFIRM_SHARE = 0.95  # a plan the confirming runs changed is run in passes that end by this share of the budget
CONFIRM_PASSES = 3  # confirming passes at most: the first, then one per changed plan while time is left
MISS = 0.15
PLAN_RUN_SHARE = 0.75  # the tuned plan's confirming run counts as one κ's when that κ ran this share of its steps
SPOT_REPEATS = 3  # timed rounds over the verify shapes in the spot check (after one warm-up round)
SPOT_RETIMES = 2  # passes over suspect shapes (specc.tune.predict.suspect_shapes), the lower median kept
SPOT_TOLERANCE = 0.1  # how far a spot timing may be off its neighbours before it is timed again
SPOT_RAGGED_MAX_W = 9  # the widest row of the ragged verify the spot check times (a lookup's κ + 1, at most this)
SPOT_MIN_S = 20.0  # the spot check may take a tenth of the budget, and at least this many seconds


def plain_plan(base, capture):
    """Plain decoding (κ = 0, no drafter) of ``base``'s target with ``capture`` batch sizes."""
    from specc.plan.schema import MethodConfig, ScheduleConfig, VerifyConfig
    from specc.check import resolve

    p = dataclasses.replace(base, name="plain", method=MethodConfig(name="none", num_steps=0), draft=None,
                            verify=VerifyConfig(rule="greedy"),
                            schedule=ScheduleConfig(kind="static", capture_batch_sizes=list(capture)),
                            runtime=dataclasses.replace(base.runtime, max_batch_size=int(max(capture))))
    return resolve(p, "specc")[0]


class Session:
    """State of one tune run (see :mod:`specc.commands.tune`)."""

    def __init__(self, args, records, concurrency, out: Path, candidates, left_out, target_name: str,
                 target_path: str, t_start: float, budget_s: float) -> None:
        self.args, self.records, self.conc, self.out = args, records, list(concurrency), out
        self.cands = {c.name: c for c in candidates}
        self.left_out = list(left_out)
        self.tname, self.tpath = target_name, target_path
        self.t_start, self.budget = t_start, budget_s
        self.notes: List[str] = []
        self.pad_ms = 0.0  # ms per padded token slot of a ragged verify (the spot check times it)
        self.log_lines: List[str] = []

    # ------------------------------------------------------------------ helpers
    def elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def deadline(self, share: float) -> float:
        return self.t_start + share * self.budget

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def bar(self, total: int, desc: str):
        from specc.console import progress

        return progress(total=total, desc=desc, unit="run", disable=self.args.no_progress, dynamic_ncols=True)

    # ------------------------------------------------------------------ steps
    def cost_table(self, threads: int):
        """The cost table: ``--cost-table``, else a shipped or cached one for this CPU, else profiled
        now (and cached). Returns ``(CostTable, path for plans, how)``."""
        from specc.predict import cost
        from specc.tune.tables import find_table

        if self.args.cost_table:
            return cost.load_cost_table(self.args.cost_table), self.args.cost_table, "given (--cost-table)"
        hw = getattr(self.args, "hardware_choice", None)
        if hw is not None and hw.cost_table:
            return cost.load_cost_table(hw.cost_table), hw.cost_table, f"given (--hardware {hw.value})"
        found = find_table(self.tpath, threads)
        if found:
            shipped = Path(found).resolve().parent == (Path(__file__).resolve().parent.parent / "data" / "cost_tables")
            ref = f"pkg://specc/data/cost_tables/{Path(found).name}" if shipped else found
            return cost.load_cost_table(found), ref, f"{'shipped' if shipped else 'cached'} table for this CPU ({found})"
        return None, None, ""

    def profile_table(self, models, threads: int, max_width: int):
        """Profile this device now (a coarse grid, 2 repeats) and cache it; returns ``(CostTable, path, how)``."""
        import os

        from specc.predict import cost
        from specc.tune.tables import cpu_name, table_dirs
        from specc.runtime.profile import cost_table, profile_costs

        top = max(self.conc) * max_width
        sizes = list(range(1, 17)) + [24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, top]
        bar = self.bar(3, "specc tune: profiling this device")
        try:
            m = profile_costs(models.target, None, max_batch=max(self.conc), max_width=max_width, context=128,
                              repeats=2, max_tokens=top, sizes=sizes, on_progress=lambda _: bar.update(1))
        finally:
            bar.close()
        table = cost_table(m, device=models.device, plan="", method="", context=128, repeats=2, threads=threads)
        table["target"] = self.tpath
        d = table_dirs()[1]
        d.mkdir(parents=True, exist_ok=True)
        safe = "".join(ch if ch.isalnum() else "_" for ch in cpu_name())[:40]
        path = d / f"{Path(self.tpath).stem.replace('.', '_')}-{safe}-{threads}t.json"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return cost.load_cost_table(str(path)), str(path), f"profiled now ({path})"

    def promise(self, cand) -> float:
        """How promising a drafter looks before measuring: the batch-1 speedup E / (1 + passes·c) at
        its best κ, with E from its shipped acceptance record (on the shipped prompts) and c from
        :func:`specc.predict.sizing.draft_cost_ratio`; +inf without a record (unknown: measured first)."""
        from specc import methods
        from specc.predict import acceptance
        from specc.predict import sizing

        found = acceptance.find(cand.plan)
        if found.entry is None:
            return float("inf")
        c, _ = sizing.draft_cost_ratio(cand.plan)
        m = cand.plan.method
        par = methods.is_parallel(m.name, m.parallel_drafting)
        return max(found.entry.expected_tokens(k) / (1.0 + methods.proposal_passes(m.name, k, int(m.topk or 1), par,
                                                                                   m.tree_choices) * c)
                   for k in cand.kappas)

    def measure_all(self, models, prompt_ids, sample) -> Tuple[Dict[str, Any], Any]:
        """Measure plain decoding's costs, then the candidates in order of :meth:`promise`, within the
        measuring share: each gets an equal part of what is left; a candidate whose acceptance was
        measured on exactly these prompts (:func:`specc.tune.measure.reusable_entry`) only has its
        step costs timed; when the time left would not cover one prefill and a step, the remaining
        candidates are left out (and said to be)."""
        from specc.tune.measure import Measurement, measure, reusable_entry, run_sampled

        args = self.args
        end = self.deadline(MEASURE_SHARE)
        names = sorted(self.cands, key=lambda n: -self.promise(self.cands[n]))
        results: Dict[str, Any] = {}
        bar = self.bar(len(names) + 1, "specc tune: measuring")
        try:
            base = next(iter(self.cands.values())).plan
            share = max(5.0, (end - time.monotonic()) / (2 * len(names) + 1))
            t0 = time.monotonic()
            rt = models.runtime(plain_plan(base, [args.measure_batch]))
            per, samples, reason, tok_s = run_sampled(rt, prompt_ids, batch_size=args.measure_batch,
                                                      max_new_tokens=args.max_new_tokens,
                                                      deadline=time.monotonic() + share, tolerance=0.0, min_requests=2)
            plain = Measurement(name="plain", entry=None, samples=samples, seconds=time.monotonic() - t0,
                                stop_reason=reason, requests=len(per), decode_tok_s=tok_s)
            plain.prefill_s = rt.metrics.stage_time_s.get("prefill", 0.0) / max(1, min(len(per), args.measure_batch))
            # the least a candidate costs: the first prefill of a batch and a few steps
            step_s = (sum(x.wall_ms for x in samples) / len(samples) / 1e3) if samples else 1.0
            least = plain.prefill_s * min(args.measure_batch, len(prompt_ids)) + 4 * step_s
            bar.update(1)
            for i, name in enumerate(names):
                cand = self.cands[name]
                left = end - time.monotonic()
                if left < least:
                    skipped = names[i:]
                    self.notes.append(f"not measured (the measuring share of the budget was spent; each needs about "
                                      f"{least:.0f} s here): {', '.join(skipped)} — left out of the choice")
                    for n in skipped:
                        del self.cands[n]
                    break
                share = max(least, left / (len(names) - i))
                reuse = reusable_entry(cand, self.records, args.max_new_tokens)
                bar.set_description(f"specc tune: measuring {name}" + (" (costs)" if reuse else ""))

                def progress(done, tau, half, bar=bar):
                    bar.set_postfix_str(f"{done} req, τ {tau:.3f} ± {half:.3f}")

                m = measure(models, cand, prompt_ids, self.records, self.source, sample=sample,
                            batch_size=args.measure_batch, max_new_tokens=args.max_new_tokens, seconds=share,
                            tolerance=args.tolerance, min_requests=min(len(prompt_ids), max(6, 2 * args.measure_batch)),
                            command=self.command, on_request=progress, reuse=reuse)
                results[name] = m
                bar.update(1)
        finally:
            bar.close()
        if not results:
            raise SpeccError(f"--budget-min {self.args.budget_min:g}: no drafter could be measured in the time "
                             f"(each needs about {least:.0f} s on this machine now); give a larger budget")
        return results, plain

    def spot_check(self, models, table, measurements, prompt_ids, plain):
        """Time the target forward now at the shapes the predictions use — R requests x W tokens for R
        in the concurrencies (and 1 and the measuring batch), W from 1 to the widest verify any measured
        configuration makes — and compare with the cost table (:func:`specc.tune.predict.table_fits`).
        Bounded: the time it would take (estimated from plain decoding's measured steps, linear in the
        tokens) must fit a tenth of the budget (at least ``SPOT_MIN_S``); the largest R are dropped
        until it does (R = 1 and the measuring batch stay), else the check is skipped. Shapes whose time
        is off their neighbours' are timed again (:func:`retime_suspects`). Returns the
        :class:`specc.tune.predict.VerifyGrid` when the table's shape does not fit (the predictions
        then use the grid), else None; either way the report says what was done."""
        import math

        from specc.runtime.profile import time_state_shapes
        from specc.tune.predict import VerifyGrid, fit_linear, pad_cost, table_fits

        widest = 1
        for name, m in measurements.items():
            for k in self.cands[name].kappas:
                widest = max(widest, math.ceil(1.0 + m.entry.drafts_per_step(k) - 1e-9))
        keep = {1, self.args.measure_batch}
        rows = sorted(set(self.conc) | keep)

        def widths(r):  # a finer width grid where a request's verify is small, a coarser one for wide batches
            steps = (1, 2, 3, 4, 6) if r <= 8 else (1, 2, 4)
            return sorted({w for w in steps if w <= widest} | {widest})

        per_token = fit_linear([float(x.rows) for x in plain.samples], [x.wall_ms for x in plain.samples])
        allowance = max(SPOT_MIN_S, 0.1 * self.budget)

        def estimate(rs) -> float:
            return timing_seconds(per_token, [(r, w) for r in rs for w in widths(r)])

        dropped = []
        while estimate(rows) > allowance and any(r not in keep for r in rows):
            dropped.append(max(r for r in rows if r not in keep))
            rows.remove(dropped[-1])
        if estimate(rows) > allowance:
            self.notes.append(f"cost table not spot-checked: timing even R = {rows} would take about "
                              f"{estimate(rows):.0f} s, more than {allowance:.0f} s of the budget; the predictions "
                              f"use the table x λ")
            return None
        shapes = [(r, w) for r in rows for w in widths(r)]
        # a ragged verify (one row at the widest lookup draft, the rest at one token) prices the padding
        ragged_w = max([1] + [min(SPOT_RAGGED_MAX_W, 1 + max(self.cands[n].kappas)) for n, m in measurements.items()
                              if m.entry.shape != "tree" and min(m.entry.draft_rates or (1.0,)) < 0.99])
        r_pad = self.args.measure_batch
        ragged = [(r_pad, ragged_w, 1)] if ragged_w > 1 and r_pad > 1 and (r_pad, 2) in shapes else []
        mean_prompt = sum(len(p) for p in prompt_ids) / max(1, len(prompt_ids))
        context = int(mean_prompt + self.args.max_new_tokens / 2)
        t0 = time.monotonic()
        bar = self.bar(SPOT_REPEATS + 1, "specc tune: timing the verify shapes")
        try:
            ms = time_state_shapes(models.target, shapes + ragged, context=context, repeats=SPOT_REPEATS,
                                   fill=False, interleave=True, on_progress=lambda _: bar.update(1))
        finally:
            bar.close()
        timed = {(r, w): ms[f"{r}x{w}"] for r, w in shapes}
        retimed = retime_suspects(models.target, timed, plain.samples, context, 0.5 * allowance, per_token)
        grid = VerifyGrid(timed)
        if ragged:
            r, w, _ = ragged[0]
            self.pad_ms = pad_cost(grid, r, w, ms[f"{r}x{w}r1"])
            retimed += (f"; a ragged verify ({r} requests, one at {w} tokens) {ms[f'{r}x{w}r1']:.0f} ms against "
                        f"{grid(r, r - 1 + w):.0f} ms for its real tokens: {self.pad_ms:.2f} ms per padded token slot "
                        f"(charged to drafters whose requests draft different lengths)")
        fits, lo, hi = table_fits(grid, table, MISS)
        groups: Dict[Tuple[int, ...], List[int]] = {}
        for r in rows:
            groups.setdefault(tuple(widths(r)), []).append(r)
        layout = "; ".join(f"R {rs} x W {list(ws)}" for ws, rs in groups.items())
        span = (f"{len(shapes)} shapes ({layout}; {context}-token context) in {time.monotonic() - t0:.0f} s"
                + (f"; R {sorted(dropped)} not timed (the check's share of the budget), read from the largest "
                   f"timed R" if dropped else "") + retimed)
        if fits:
            self.notes.append(f"cost table spot-checked at {span}: the forward timed now is {lo:.2f}-{hi:.2f}x the "
                              f"table's, one factor within {MISS:.0%}: the table's shape fits and λ scales it")
            return None
        self.notes.append(f"cost table spot-checked at {span}: the forward timed now is {lo:.2f}-{hi:.2f}x the "
                          f"table's verify, a spread no single load factor covers (the machine, its load, or the "
                          f"layout the table was profiled in — n tokens as min(n, its batch) requests — differ "
                          f"from these shapes now): the predictions use the shapes timed now, scaled by λ; "
                          f"`specc profile` refreshes the table")
        return grid

    def predictor(self, table, measurements, plain, grid=None):
        """The :class:`specc.tune.predict.Predictor` over the measuring runs: each run's stage costs
        fitted against the verify base (``grid`` when the spot check gave one, else the cost table)
        with the padding price the spot check timed (:func:`specc.tune.predict.step_verify_ms`); λ the
        median of the runs' load factors, and per live-row count the median over the runs that have it."""
        import statistics

        from specc.tune.predict import Predictor, fit_stage_costs, step_verify_ms, table_verify

        base = grid if grid is not None else table_verify(table)
        pad = self.pad_ms
        costs = {None: fit_stage_costs(plain.samples, lambda rows, k: step_verify_ms(base, pad, None, 0, rows))}
        entries = {}
        for name, m in measurements.items():
            entries[name] = m.entry
            ks = self.cands[name].measure_steps
            costs[name] = fit_stage_costs(m.samples, lambda rows, k, e=m.entry, ks=ks:
                                          step_verify_ms(base, pad, e, ks if k > 0 else 0, rows))
        loads = [c.load for c in costs.values() if c.samples]
        load = statistics.median(loads) if loads else 1.0
        per_rows: Dict[int, List[float]] = {}
        for c in costs.values():
            for r, v in c.load_by_rows.items():
                per_rows.setdefault(r, []).append(v)
        load_rows = {r: statistics.median(v) for r, v in per_rows.items()}
        return Predictor(table=table, candidates=dict(self.cands), entries=entries, costs=costs, load=load, grid=grid,
                         load_rows=load_rows, pad_ms=pad)

    def confirm(self, models, pred, choice, prompt_ids, *, label: Optional[str] = None, first: bool = True,
                concurrency: Optional[List[int]] = None):
        """The chosen plan, the top static configurations and plain decoding, side by side per
        concurrency, within the confirming share. With ``first`` False (a later pass: the confirming
        runs changed the plan), only the plan ``choice``, labelled ``label``, at ``concurrency``
        (default: every one), within :data:`RECONFIRM_SHARE` (plain decoding and the static
        configurations ran in the first pass).
        Returns ``({(label, C): Result}, {label: Config}, plan label)``."""
        from specc.tune.confirm import Entry, side_by_side
        from specc.tune.predict import Config, bucket_sizes, top_configs

        args = self.args
        win = self.cands[choice.candidate]
        sizes = bucket_sizes(self.conc)
        base = win.plan
        plan_label = label or f"tuned plan ({win.name})"
        plan_entry = Entry(plan_label, win, lambda c: win.variant(0, kind="batch_buckets", buckets=choice.buckets,
                                                               capture=sizes, name="tuned"))
        plain_entry = Entry("plain", None, lambda c: plain_plan(base, [c]), Config(None, 0))
        end = self.deadline(CONFIRM_SHARE if first else RECONFIRM_SHARE)
        head = [plain_entry, plan_entry] if first else [plan_entry]
        fixed = len(head)  # entries every concurrency runs before its static configurations
        per_c = {}
        for c in concurrency or self.conc:
            statics = []
            for cfg in top_configs(pred, c, args.confirm_top + 1) if first else []:
                if cfg.candidate == win.name and cfg.num_steps == choice.per_drafter[win.name][c][0]:
                    continue  # the plan runs it already
                cand = self.cands[cfg.candidate]
                statics.append(Entry(cfg.label, cand, (lambda cc, cand=cand, k=cfg.num_steps: cand.variant(k, capture=[cc])), cfg))
            per_c[c] = head + statics[: args.confirm_top]
        # size the runs to the time left: per run n requests of max_new tokens at the predicted rate
        prefill = getattr(self, "prefill_per_request", 0.2)

        def run_seconds(e, c, n) -> float:
            cfg = e.config or Config(win.name, choice.per_drafter[win.name][c][0])
            rate = max(1e-3, pred.tok_s(cfg, c))
            return n * (args.max_new_tokens - 1) / rate + n * prefill + 1.0

        def estimate(per_slot: int, minimum: int, top: int) -> float:
            return sum(run_seconds(e, c, max(minimum, per_slot * c)) for c, entries in per_c.items()
                       for e in entries[: fixed + top])

        top0 = args.confirm_top if first else 0
        per_slot, minimum, top = 2, 4, top0
        left = end - time.monotonic()
        while estimate(per_slot, minimum, top) > left and (top > 0 or per_slot > 1 or minimum > 2):
            if top > 0:
                top -= 1
            elif per_slot > 1:
                per_slot = 1
            else:
                minimum = 2
        if (top, per_slot, minimum) != (top0, 2, 4):
            what = f"{top} static configuration(s) per concurrency, " if first else f"{plan_label}: "
            self.notes.append(f"confirmation trimmed to the time left ({left:.0f} s): {what}{per_slot} request(s) "
                              f"per slot, at least {minimum}")
        results: Dict[Tuple[str, int], Any] = {}
        configs: Dict[str, Any] = {}
        total_runs = sum(len(v[: fixed + top]) for v in per_c.values())
        bar = self.bar(total_runs, "specc tune: confirming" if first else f"specc tune: confirming {plan_label}")
        try:
            for c, entries in per_c.items():
                entries = entries[: fixed + top]
                for e in entries:
                    configs[e.label] = e.config
                res, notes = side_by_side(models, entries, [c], prompt_ids, max_new_tokens=args.max_new_tokens,
                                          per_slot=per_slot, minimum=minimum, rounds=1, deadline=end,
                                          estimate=run_seconds, on_run=lambda label, cc, rnd: (bar.set_postfix_str(f"C={cc} {label}"),
                                                                         bar.update(1)))
                results.update(res)
                self.notes += notes
        finally:
            bar.close()
        return results, configs, plan_label

    def confirm_passes(self, models, pred, choice, prompt_ids):
        """Confirm ``choice``, choose again with what was measured, and while the choice changes to a
        plan not yet run (and the time and :data:`CONFIRM_PASSES` allow) run that plan too and choose
        again, so the plan emitted has been run wherever the budget allowed. Sets ``self.plans``
        (``{plan label: the Choice its run ran}``) and ``self.confirmed`` (``(measured, scale)`` of
        :func:`measured_values` over every pass). Returns ``(results, configs, final Choice)``."""
        from specc.tune.predict import choose

        results, configs, label = self.confirm(models, pred, choice, prompt_ids)
        self.plans = {label: choice}
        current = choice
        while True:
            measured, scale = measured_values(pred, results, configs, self.plans, self.conc)
            self.confirmed = (measured, scale)  # for the engine choices (_engine_choice)
            final = choose(pred, self.conc, measured=measured, scale=scale)
            if (final.candidate, final.buckets) != (current.candidate, current.buckets):
                self.notes.append(f"the confirming runs changed the choice: {current.candidate} {current.buckets} -> "
                                  f"{final.candidate} {final.buckets} (measured throughput replaces the prediction "
                                  f"where it was run)")
            if any((p.candidate, p.buckets) == (final.candidate, final.buckets) for p in self.plans.values()):
                return results, configs, final
            if len(self.plans) >= CONFIRM_PASSES or time.monotonic() >= self.deadline(RECONFIRM_SHARE):
                self.notes.append(f"the plan {final.candidate} {final.buckets} was not run (confirming passes: "
                                  f"{len(self.plans)}, {max(0.0, self.deadline(RECONFIRM_SHARE) - time.monotonic()):.0f} s "
                                  f"left for them); its throughput is predicted, scaled by the runs")
                return results, configs, final
            # run it where its κ differs from every run plan's (κ = 0 is plain decoding whatever the drafter)
            new_at = [c for c in self.conc if step_config(final, c) not in {step_config(p, c) for p in self.plans.values()}]
            if not new_at:
                self.notes.append(f"the plan {final.candidate} {final.buckets} runs the κ of a plan already run at every "
                                  f"concurrency (it differs in buckets the batch passes only while draining); not run again")
                return results, configs, final
            label = f"tuned plan ({final.candidate}, pass {len(self.plans) + 1})"
            res, cfgs, _ = self.confirm(models, pred, final, prompt_ids, label=label, first=False, concurrency=new_at)
            if not any(lab == label for lab, _ in res):
                return results, configs, final  # nothing fitted the time: the note of side_by_side says so
            results.update(res)
            configs.update(cfgs)
            self.plans[label] = current = final

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        from specc.models.llama import configure_cpu_threads, default_cpu_threads
        from specc.tune.measure import Models, encode
        from specc.tune.predict import choose

        args = self.args
        if args.threads is not None:
            configure_cpu_threads(args.threads)
        threads = args.threads or default_cpu_threads()
        self.source = str(args.prompts)
        self.command = "specc tune " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "specc tune"
        table, table_ref, how = self.cost_table(threads)
        first = next(iter(self.cands.values())).plan
        self.say(f"specc tune: {len(self.records)} prompts from {self.source}; target {self.tname}; "
                 f"{len(self.cands)} candidate drafter(s): {', '.join(self.cands)}; concurrency {self.conc}; "
                 f"budget {args.budget_min:g} min")
        # the target at the dtype and kernels the runtime will load under this table (load_models' rule)
        models = Models({"path": first.target.path, "format": first.target.format},
                        max_model_len=first.target.max_model_len or 2048,
                        choice=(table.choice or {}) if table is not None else None)
        sample = sample_records(self.records)
        prompt_ids = encode(sample, models.tokenizer)
        longest = max(len(p) for p in prompt_ids)
        models.max_model_len = min(int(first.target.max_model_len or 2048), longest + args.max_new_tokens + 8)
        if table is None:
            widest = max(c.measure_steps for c in self.cands.values()) + 1
            widest = max(widest, max(int(c.plan.method.num_draft_tokens or 0) for c in self.cands.values()))
            table, table_ref, how = self.profile_table(models, threads, widest)
        self.say(f"cost table: {how}")
        hw = getattr(args, "hardware_choice", None)
        if hw is not None and not hw.cost_table:
            self.say(f"hardware: {hw.name} (--hardware) for the SGLang / vLLM settings (their schedule.hardware); "
                     f"the measurements and predictions run on this machine with the cost table above")
        measurements, plain = self.measure_all(models, prompt_ids, sample)
        self.prefill_per_request = getattr(plain, "prefill_s", 0.2)
        grid = self.spot_check(models, table, measurements, prompt_ids, plain)
        pred = self.predictor(table, measurements, plain, grid)
        choice = choose(pred, self.conc)
        self.say(f"predicted: {choice.candidate} with κ per bucket {choice.buckets} (worst ratio to the best "
                 f"prediction over C={self.conc}: {choice.scores[choice.candidate]:.3f}); load factor λ = {pred.load:.2f}")
        results, configs, final = self.confirm_passes(models, pred, choice, prompt_ids)
        files = self.emit(pred, choice, final, measurements, plain, results, configs, table_ref, how)
        self.say(f"done in {self.elapsed() / 60:.1f} min (budget {args.budget_min:g} min)")
        for f in files:
            print(f"wrote {f}")
        return 0

    # ------------------------------------------------------------------ emit
    def emit(self, pred, choice, final, measurements, plain, results, configs, table_ref, how) -> List[str]:
        from specc.predict import acceptance
        from specc.tune import emit
        from specc.tune.confirm import explain_miss
        from specc.tune.predict import Config, adaptive_candidates, bucket_sizes

        args = self.args
        out = self.out
        stem = out.with_suffix("")
        win = self.cands[final.candidate]
        sizes = bucket_sizes(self.conc)
        entry = measurements[final.candidate].entry
        files: List[str] = []
        # the acceptance record: every drafter measured on these prompts
        rec_path = Path(f"{stem}.acceptance.json")
        acceptance.write_record(rec_path, [m.entry for m in measurements.values()], merge=False)
        files.append(str(rec_path))
        # the cost table the predictions used, with the rest of the predictor: the plan points at both
        from specc.tune.predict import record_block

        # what the confirming runs measured for the plan at each concurrency: the run of the emitted plan, else
        # of a plan that runs the same κ there (as the confirming passes judge it, step_config)
        measured_at: Dict[int, Dict[str, float]] = {}
        for (label, c), r in sorted(results.items(), key=lambda kv: self.plans.get(kv[0][0]) is not None and (
                self.plans[kv[0][0]].candidate, self.plans[kv[0][0]].buckets) == (final.candidate, final.buckets)):
            if label == "plain":
                measured_at.setdefault(int(c), {})["plain"] = r.decode_tok_s
            elif label in self.plans and step_config(self.plans[label], c) == step_config(final, c):
                measured_at.setdefault(int(c), {})["plan"] = r.decode_tok_s  # the emitted plan's run sorts last
        table_path = Path(f"{stem}.cost_table.json")
        emit.write_cost_record(table_path, pred.table.path or table_ref,
                               record_block(pred, final.candidate, self.conc, measured_at, f"{stem.name}.json"))
        files.append(str(table_path))
        if args.schedule == "adaptive" or args.engine == "sglang":
            buckets = {b: adaptive_candidates(pred, win.name, b) for b in final.buckets}
            kind = "adaptive"
        else:
            buckets = {b: [k] for b, k in final.buckets.items()}
            kind = "batch_buckets"
        header = [f"Written by `specc tune` ({time.strftime('%Y-%m-%d')}): {len(self.records)} prompts from {self.source},",
                  f"concurrency {self.conc}, target {self.tname}. κ per batch bucket from the predictions over the",
                  f"acceptance measured on those prompts ({rec_path.name}: {entry.describe.split(': ', 1)[1][:90]}...).",
                  f"Predicted speedup per concurrency, per-position acceptance: specc explain {out.name}",
                  f"Cost table: {how}."]
        doc = emit.plan_document(win, buckets, kind=kind, engine=args.engine, name=_identifier(out.stem),
                                 alpha=entry.alpha, cost_table=table_path.name, capture=sizes,
                                 hardware=self._engine_hardware() if args.engine != "specc" else None,
                                 acceptance=rec_path.name)
        text = emit.dump_plan(doc, header)
        emit._atomic_write(out, text)
        _, errors = emit.check_loads(out, args.engine)
        if errors:
            self.notes.append(f"{out}: {args.engine} rules report " + "; ".join(f"[{v.rule}] {v.message}" for v in errors))
        files.append(str(out))
        # engine settings: the chosen drafter where the engine runs it, else the best one it runs; each
        # for the deployment (--deploy-*) when one is given, each command checked before it is written
        dep = getattr(args, "deployment", None) or emit.Deployment()
        launch_path = Path(f"{stem}.launch.sh")
        sections: List[str] = []
        self.exports = {}
        if "vllm" in dep.engines:
            vllm_plan, _ = self._vllm_plan(pred, final, measurements, table_ref, sizes, out, header)
            unused = ""
            if dep.given:
                vllm_plan, unused = self._deployment_file(vllm_plan, Path(f"{stem}.vllm.yaml"), dep,
                                                          header[:1] + [f"vLLM settings of {out.name}."], "vLLM")
            if vllm_plan != out:
                files.append(str(vllm_plan))
            self.exports["vllm"], text_v = self._launch_section(vllm_plan, "vllm", None, launch_path)
            sections.append(f"# {unused}\n{text_v}" if unused else text_v)
        else:
            Path(f"{stem}.vllm.yaml").unlink(missing_ok=True)  # an earlier run's settings are not this deployment's
        if "sglang" not in dep.engines:
            for stale in (Path(f"{stem}.sglang.yaml"), Path(f"{stem}.sglang_adaptive.json")):
                stale.unlink(missing_ok=True)
        else:
            sg_path = Path(f"{stem}.sglang.yaml")
            s_final, s_why = self._engine_choice(pred, final, "sglang")
            s_win = self.cands[s_final.candidate]
            sg_doc = self._sglang_document(pred, s_win, s_final, measurements[s_win.name].entry, table_ref, sizes, out)
            why = f" {s_why}." if s_final.candidate != final.candidate else ""
            sg_header = header[:1] + [f"SGLang variant of {out.name} (SGLang has no batch_buckets).{why}"]
            unused = ""
            if dep.given:
                sg_doc = emit.deploy_document(sg_doc, dep, s_win.method)
                sg_header.append(f"For the deployment: {dep.describe()}.")
                unused = self._unused_draft(dep, s_win.method, "SGLang")
            emit._atomic_write(sg_path, emit.dump_plan(sg_doc, sg_header))
            files.append(str(sg_path))
            adaptive = Path(f"{stem}.sglang_adaptive.json")
            self.exports["sglang"], text_s = self._launch_section(sg_path, "sglang", adaptive, launch_path)
            sections.append(f"# {unused}\n{text_s}" if unused else text_s)
            if adaptive.exists():
                files.append(str(adaptive))
        launch = emit.launch_header(out.name, dep, self.tname, self.tpath, launch_path.name,
                                    [e for e, ok in self.exports.items() if ok])
        emit._atomic_write(launch_path, "\n".join(launch + sections))
        files.append(str(launch_path))
        # the report
        rows, data_rows, misses = self._report_rows(pred, measurements, plain, results, configs, explain_miss)
        notes = self._report_notes(pred, choice, final, measurements, how, misses)
        md = emit.report_markdown(f"specc tune: {len(self.records)} prompts, target {self.tname}",
                                  ["run", "C", "mean batch", "predicted tok/s", "measured tok/s", "error", "τ pred / meas",
                                   "exact", "note"], rows, notes)
        rep = Path(f"{stem}.report.md")
        emit._atomic_write(rep, md)
        files.append(str(rep))
        self._print_report(rows, notes)
        predicted_lines = {"plain": {c: pred.tok_s(Config(None, 0), c) for c in self.conc}}
        for name in self.cands:  # each drafter's predicted bucket schedule
            predicted_lines[f"{name} (best κ per C)"] = {c: choice.per_drafter[name][c][1] for c in self.conc}
        measured_lines: Dict[str, Dict[int, float]] = {}
        for (label, c), r in results.items():
            measured_lines.setdefault(label, {})[c] = r.decode_tok_s
        for label, cfg in configs.items():
            if cfg is not None and label not in predicted_lines:
                predicted_lines[label] = {c: pred.tok_s(cfg, c) for c in self.conc if (label, c) in results}
        for label, ch in self.plans.items():
            predicted_lines[label] = {c: ch.predicted[c] for c in self.conc}
        emitted = [lab for lab, ch in self.plans.items() if (ch.candidate, ch.buckets) == (final.candidate, final.buckets)]
        png = Path(f"{stem}.png")
        plotted = emit.plot(png, self.conc, predicted_lines, measured_lines,
                  f"specc tune: decode tok/s by concurrency ({self.tname}, {Path(self.source).name})",
                  highlight=(emitted or list(self.plans))[0])
        files.append(str(png))
        data = {"target": self.tpath, "prompts": self.source, "concurrency": self.conc, "budget_min": args.budget_min,
                "seconds": round(self.elapsed(), 1), "cost_table": how, "load_factor": pred.load,
                "load_by_rows": {str(r): v for r, v in sorted(pred.load_rows.items())},
                "verify_grid": ({f"{r}x{w}": v for (r, w), v in sorted(pred.grid.ms.items())}
                                if pred.grid is not None else None),
                "choice": {"candidate": final.candidate, "buckets": final.buckets, "scores": final.scores,
                           "predicted_first": {"candidate": choice.candidate, "buckets": choice.buckets}},
                "candidates": {n: {"source": c.source, "also": list(c.also), "shape": c.shape, "kappas": list(c.kappas),
                                   "acceptance": measurements[n].entry.as_json(),
                                   "measure": {"seconds": round(measurements[n].seconds, 1),
                                               "stop": measurements[n].stop_reason,
                                               "requests": measurements[n].requests},
                                   "costs": dataclasses.asdict(pred.costs[n])}
                               for n, c in self.cands.items()},
                "predicted": {f"{cfg.label}": {c: pred.tok_s(cfg, c) for c in self.conc} for cfg in pred.all_configs()},
                "runs": data_rows, "exports": self.exports, "notes": notes, "left_out": self.left_out,
                "plot": plotted}
        js = Path(f"{stem}.json")
        emit._atomic_write(js, json.dumps(data, indent=1, default=str) + "\n")
        files.append(str(js))
        return files

    def _launch_section(self, path: Path, engine: str, adaptive: Optional[Path], launch_path: Path):
        """:func:`specc.tune.emit.launch_section` of the plan at ``path`` (``adaptive``: where SGLang's
        adaptive config goes); a refusal is said on stderr, and a refused re-check in the report too.
        Returns ``(accepted, text)``."""
        from specc.tune import emit

        ok, text, problems = emit.launch_section(path, engine, adaptive, launch_path.parent)
        label = emit.ENGINE_LABELS[engine]
        if problems:
            msg = (f"{label} launch command not written: `specc check --{engine}-args` refuses the command exported "
                   f"from {path.name}: " + "; ".join(problems) + f" (the refusal is in {launch_path.name})")
            self.say(msg)
            self.notes.append(msg)
        elif not ok:
            self.say(f"{label} launch command not written: {engine}'s rules refuse {path.name} (see {launch_path.name})")
        return ok, text

    def _deployment_file(self, src: Path, dst: Path, dep, header: List[str], label: str) -> Tuple[Path, str]:
        """The engine plan at ``src`` (``--out`` itself or its engine variant) for the deployment ``dep``
        (:func:`specc.tune.emit.deploy_document`), written to ``dst``: headed by ``header`` when ``src`` is
        another file, else by its own comment lines; then a line naming the deployment. ``label``: the
        engine's name for notes. Returns ``(dst, the note of an unused --deploy-draft or "")``."""
        import yaml

        from specc.plan.load import load_plan
        from specc.tune import emit

        text = src.read_text()
        if src == dst:  # the variant's own header (its lines up to the first that is not a comment)
            header = []
            for line in text.splitlines():
                if not line.startswith("#"):
                    break
                header.append(line[1:].strip())
        method = load_plan(str(src)).plan.method.name
        doc = emit.deploy_document(yaml.safe_load(text) or {}, dep, method)
        emit._atomic_write(dst, emit.dump_plan(doc, list(header) + [f"For the deployment: {dep.describe()}."]))
        return dst, self._unused_draft(dep, method, label)

    def _unused_draft(self, dep, method: str, label: str) -> str:
        """The note (said on stderr and in the report; returned for the launch file) when ``--deploy-draft``
        is given but ``label``'s settings use a method that takes no drafter checkpoint (a lookup that won
        the choice over the drafters that needed it); "" otherwise."""
        from specc import methods

        row = methods.get(method)
        if dep.draft is not None and not (row.needs_draft_checkpoint or row.target_ships_draft):
            note = f"{label}'s settings use {method}, which drafts with no checkpoint: --deploy-draft {dep.draft} is not used"
            self.say(note)
            self.notes.append(note)
            return note
        return ""

    def _engine_choice(self, pred, final, engine: str):
        """The choice whose settings tune writes for ``engine``: ``final`` when the engine's rules accept
        its drafter, else the same choice (:func:`specc.tune.predict.choose`, with what the confirming
        runs measured) among the drafters the engine accepts. Returns ``(Choice, why)``; ``why`` names
        the refusal (and goes into the report). When the engine accepts none, ``final`` (its export then
        shows the refusal)."""
        from specc.tune import emit
        from specc.tune.predict import choose

        def refusal(cand):
            return next(iter(emit.verdict(cand.plan, engine)[0]), None)

        first = refusal(self.cands[final.candidate])
        if first is None:
            return final, ""
        refused = [n for n, c in self.cands.items() if refusal(c) is not None]
        if len(refused) == len(self.cands):
            return final, ""
        measured, scale = getattr(self, "confirmed", (None, None))
        alt = choose(pred, self.conc, exclude=refused, measured=measured, scale=scale)
        label = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
        why = (f"{label} refuses {final.candidate} ([{first.rule}]): its settings use {alt.candidate} with κ per "
               f"bucket {alt.buckets}, the best by the same choice among the drafters {label} runs "
               f"(worst ratio {alt.scores[alt.candidate]:.3f} against {final.scores[final.candidate]:.3f})")
        self.notes.append(why)
        return alt, why

    def _sglang_document(self, pred, win, final, entry, table_ref, sizes, out):
        """The SGLang variant: its adaptive controller with the κ predicted within 3 % of the best per
        bucket as candidates; where SGLang's rules say it falls back to a static schedule for this
        method, the static κ whose worst ratio over the concurrencies is best."""
        from specc.tune import emit
        from specc.tune.predict import adaptive_candidates

        name = _identifier(out.stem) + "_sglang"
        buckets = {b: adaptive_candidates(pred, win.name, b) for b in final.buckets}
        doc = emit.plan_document(win, buckets, kind="adaptive", engine="sglang", name=name, alpha=entry.alpha,
                                 cost_table=None, capture=sizes, hardware=self._engine_hardware())
        _, falls = emit.verdict(doc, "sglang", out.parent)
        if not falls:
            return doc
        k, _ = self._static_fallback(pred, win, f"SGLang falls back to a static schedule for {win.method} "
                                               f"([{falls[0].rule}])")
        return emit.plan_document(win, {1: [k]}, kind="static", engine="sglang", name=name, alpha=entry.alpha,
                                  cost_table=None, capture=sizes, hardware=self._engine_hardware())

    def _engine_hardware(self) -> Optional[str]:
        """``--hardware``'s profile for the SGLang / vLLM plans (their ``schedule.hardware``), or None."""
        hw = getattr(getattr(self, "args", None), "hardware_choice", None)
        return hw.profile if hw is not None and not hw.cost_table else None

    def _static_fallback(self, pred, win, cause: str) -> Tuple[int, str]:
        """For an engine that falls back to one κ at every batch size (``cause`` says which and by which
        rule): :meth:`_static_kappa`, and the report's note on it (appended). Returns ``(κ, note)``."""
        k, worst = self._static_kappa(pred, win)
        note = (f"{cause}: its settings use the static κ = {k}, the best worst case over the concurrencies "
                f"({worst:.2f}x the best predicted there)")
        self.notes.append(note)
        return k, note

    def _static_kappa(self, pred, win):
        """For an engine that runs one κ at every batch size: the κ ≥ 1 of ``win`` whose worst ratio
        over the concurrencies (predicted throughput / the best any configuration reaches there) is
        highest. Returns ``(κ, that ratio)``."""
        from specc.tune.predict import Config

        best = {c: max(pred.tok_s(cfg, c) for cfg in pred.all_configs()) for c in self.conc}

        def worst(kk):
            return min(pred.tok_s(Config(win.name, kk), c) / best[c] for c in self.conc)

        k = max(win.kappas, key=worst)
        return k, worst(k)

    def _vllm_plan(self, pred, final, measurements, table_ref, sizes, out, header) -> Tuple[Path, str]:
        """The plan whose vLLM settings tune writes: ``out`` when vLLM's rules accept it as written, with
        no fallback of its schedule; else ``PLAN.vllm.yaml`` — the best drafter vLLM accepts
        (:meth:`_engine_choice`) with κ per batch bucket, or a static κ (:meth:`_static_kappa`) where
        vLLM's rules say it falls back to one for that method (Model Runner V1 has no per-batch-size κ
        for some methods). ``out`` may be refused as written when it carries an adaptive schedule
        (``--schedule adaptive``, ``--engine sglang``). Returns ``(path, why)``; ``why`` is empty for
        ``out`` (a ``PLAN.vllm.yaml`` an earlier run left is then removed)."""
        from specc.plan.load import load_plan
        from specc.tune import emit

        path = Path(f"{out.with_suffix('')}.vllm.yaml")
        choice, why = self._engine_choice(pred, final, "vllm")
        if choice is final:
            errors, falls = emit.verdict(load_plan(str(out)).plan, "vllm")
            if not errors and not falls:
                path.unlink(missing_ok=True)  # a variant an earlier run wrote next to --out no longer applies
                return out, ""
            if errors:
                why = (f"vLLM refuses {out.name} as written ([{errors[0].rule}]): its settings use κ per batch "
                       f"bucket {choice.buckets}")
        v_win = self.cands[choice.candidate]
        alpha = measurements[v_win.name].entry.alpha
        name = _identifier(out.stem) + "_vllm"
        doc = emit.plan_document(v_win, {b: [k] for b, k in choice.buckets.items()}, kind="batch_buckets",
                                 engine="vllm", name=name, alpha=alpha, cost_table=table_ref, capture=sizes,
                                 hardware=self._engine_hardware())
        _, falls = emit.verdict(doc, "vllm", out.parent)
        if falls:
            k, fall = self._static_fallback(pred, v_win, f"vLLM falls back to a static κ for {v_win.method} "
                                                         f"([{falls[0].rule}])")
            why = f"{why}; {fall}" if why else fall
            doc = emit.plan_document(v_win, {1: [k]}, kind="static", engine="vllm", name=name, alpha=alpha,
                                     cost_table=table_ref, capture=sizes, hardware=self._engine_hardware())
        elif why and choice is final:
            self.notes.append(why)
        emit._atomic_write(path, emit.dump_plan(doc, header[:1] + [f"vLLM variant of {out.name}: {why}."]))
        return path, why

    def _report_rows(self, pred, measurements, plain, results, configs, explain_miss):
        from specc.tune.predict import Config

        rows, data, misses = [], [], []

        def add(run, c, batch, predicted, meas, tau_pred, tau_meas, exact, breakdown, result=None):
            err = (predicted - meas) / meas if meas else float("nan")
            note = ""
            if meas and abs(err) > MISS and breakdown is not None and result is not None:
                note = "MISS: " + explain_miss(breakdown, result)
                misses.append(f"{run} at C={c}: predicted {predicted:.1f}, measured {meas:.1f} tok/s ({err:+.0%}); {note[6:]}")
            rows.append([run, c, f"{batch:.1f}", f"{predicted:.1f}", f"{meas:.1f}", f"{err:+.1%}",
                         f"{tau_pred:.3f} / {tau_meas:.3f}", {True: "yes", False: "NO", None: "-"}[exact], note])
            data.append({"run": run, "concurrency": c, "mean_batch": batch, "predicted_tok_s": predicted,
                         "measured_tok_s": meas, "error": err, "tau_predicted": tau_pred, "tau_measured": tau_meas,
                         "exact": exact, "note": note})

        from specc.tune.confirm import Result
        from specc.tune.measure import DECODE_STAGES

        for name, m in measurements.items():
            if not m.samples:
                continue
            n = len(m.samples)
            b = sum(s.rows for s in m.samples) / n
            cfg = Config(name, self.cands[name].measure_steps)
            bd = dict(pred.breakdown(cfg, b), batch=b)
            stages = {st: sum(s.stage_ms.get(st, 0.0) for s in m.samples) / n for st in DECODE_STAGES}
            stages["step"] = sum(s.wall_ms for s in m.samples) / n
            res = Result(label=name, concurrency=self.args.measure_batch, decode_tok_s=m.decode_tok_s,
                         output_tok_s=0.0, tau=m.entry.tau, mean_batch=b, steps=n, decode_s=0.0,
                         stage_ms_per_step=stages, kappa_steps={cfg.num_steps: n})
            add(f"measure {name} κ={cfg.num_steps} (fit)", self.args.measure_batch, b, bd["tok_s"], m.decode_tok_s,
                bd["expected_tokens"], m.entry.tau, None, bd, res)
        for (label, c), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0] != "plain", kv[0][0])):
            cfg = configs.get(label)
            if label in self.plans:
                ch = self.plans[label]
                cfg = Config(ch.candidate, bucket_kappa(ch, r.mean_batch))
            bd = dict(pred.breakdown(cfg, r.mean_batch), batch=r.mean_batch)
            add(label, c, r.mean_batch, bd["tok_s"], r.decode_tok_s, bd["expected_tokens"], r.tau, r.exact, bd, r)
        self.misses = misses
        return rows, data, misses

    def _report_notes(self, pred, choice, final, measurements, how, misses) -> List[str]:
        base = "the verify shapes timed now" if pred.grid is not None else "the table's"
        by_rows = ", ".join(f"{r}: {v:.2f}" for r, v in sorted(pred.load_rows.items()))
        notes = [f"cost table: {how}; load factor λ = {pred.load:.2f} (measured verify time / {base}, "
                 f"median over the measuring runs' steps)" + (f"; by live rows {{{by_rows}}}, the one used at each "
                                                             f"batch (held beyond)" if by_rows else "")]
        for name, m in measurements.items():
            e = m.entry
            notes.append(f"{name}: τ {e.tau:.3f} (95% CI {e.tau_ci95[0]:.3f}–{e.tau_ci95[1]:.3f}) at κ={e.num_steps}, "
                         f"{m.requests} requests in {m.seconds:.0f} s ({m.stop_reason}); per position "
                         f"[{', '.join(f'{r:.3f}' for r in e.rates)}]")
        notes.append("choice: " + ", ".join(f"{n} {s:.3f}" for n, s in sorted(final.scores.items(), key=lambda kv: -kv[1]))
                     + " (worst ratio over the concurrencies of each drafter's bucket schedule to the best there)")
        notes.append(f"plan: {final.candidate}, κ per batch bucket {final.buckets}")
        labels = {"sglang": "SGLang", "vllm": "vLLM"}
        notes.append("exports: " + ", ".join(f"{labels[e]} {'accepted' if self.exports[e] else 'REFUSED'}"
                                             for e in ("sglang", "vllm") if e in self.exports)
                     + " by their rules and by `specc check` of the launch command (see the launch file)")
        notes += self.notes
        if misses:
            notes.append(f"{len(misses)} prediction(s) off by more than {MISS:.0%}:")
            notes += [f"  {m}" for m in misses]
        else:
            notes.append(f"every prediction within {MISS:.0%} of the measurement")
        if self.left_out:
            notes.append("not candidates: " + "; ".join(self.left_out))
        return notes

    def _print_report(self, rows, notes) -> None:
        header = ["run", "C", "batch", "predicted", "measured", "error", "τ pred/meas", "exact"]
        table = [header] + [[str(x) for x in r[:8]] for r in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        print("predicted against measured decode tokens/s:")
        for i, r in enumerate(table):
            print("  " + "  ".join(v.ljust(w) if j == 0 else v.rjust(w) for j, (v, w) in enumerate(zip(r, widths))))
            if i == 0:
                print("  " + "  ".join("-" * w for w in widths))
        for r in rows:
            if r[8]:
                print(f"  {r[0]} at C={r[1]}: {r[8]}")
        for n in notes:
            print(n)


def timing_seconds(per_token, shapes) -> float:
    """Seconds one interleaved timing of ``shapes`` (``(R, W)``) takes: a warm-up round and
    ``SPOT_REPEATS`` timed rounds, each shape priced at ``per_token(R·W)`` ms (plain decoding's
    measured step time by rows, :func:`specc.tune.predict.fit_linear`)."""
    return (SPOT_REPEATS + 1) * sum(per_token(r * w) for r, w in shapes) / 1e3


def retime_suspects(target, timed, samples, context, allowance, per_token) -> str:
    """Time again the shapes :func:`specc.tune.predict.suspect_shapes` flags in ``timed`` (``{(R, W):
    ms}``, updated in place with the lower of the two medians: load only ever adds time), checked
    against the one-token verify plain decoding's measuring run saw at each R; up to
    ``SPOT_RETIMES`` passes, stopping when nothing is suspect, a pass changed nothing (the shape
    really costs that) or the next pass would not fit what is left of ``allowance`` seconds
    (:func:`timing_seconds`). ``samples``: plain decoding's measuring steps
    (:class:`specc.tune.measure.StepSample`). Returns what was done, for the report ("" when nothing
    was suspect)."""
    import statistics

    from specc.runtime.profile import time_state_shapes
    from specc.tune.predict import suspect_shapes

    by_rows: Dict[int, List[float]] = {}
    for x in samples:
        by_rows.setdefault(int(x.rows), []).append(x.stage_ms.get("verify", 0.0) + x.stage_ms.get("accept", 0.0))
    observed = {r: statistics.median(v) for r, v in by_rows.items() if len(v) >= 3}
    done: List[str] = []
    for _ in range(SPOT_RETIMES):
        again = suspect_shapes(timed, observed, SPOT_TOLERANCE)
        if not again:
            break
        need = timing_seconds(per_token, again)
        if need > allowance:
            done.append(f"{len(again)} suspect shape(s) not timed again (about {need:.0f} s, {allowance:.0f} s left)")
            break
        t0 = time.monotonic()
        ms = time_state_shapes(target, again, context=context, repeats=SPOT_REPEATS, fill=False,
                               interleave=True)
        changed = [f"{r}x{w} {timed[(r, w)]:.0f}->{ms[f'{r}x{w}']:.0f} ms" for r, w in again
                   if ms[f"{r}x{w}"] < timed[(r, w)] / (1.0 + SPOT_TOLERANCE)]
        for r, w in again:
            timed[(r, w)] = min(timed[(r, w)], ms[f"{r}x{w}"])
        allowance -= time.monotonic() - t0
        done.append(f"timed {len(again)} suspect shape(s) again"
                    + (f" ({', '.join(changed)})" if changed else " (none changed by more than "
                       f"{SPOT_TOLERANCE:.0%})"))
        if not changed:
            break
    return "; " + "; ".join(done) if done else ""


def _identifier(text: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)
    return out if out and not out[0].isdigit() else f"plan_{out}"


def sample_records(records: list, seed: int = 0) -> list:
    """The prompts in measuring order: round-robin over categories (so an early stop still covers
    them), each category shuffled with a fixed seed."""
    import random

    rng = random.Random(seed)
    by_cat: Dict[str, list] = {}
    for r in records:
        by_cat.setdefault(r.category or "-", []).append(r)
    for v in by_cat.values():
        rng.shuffle(v)
    out = []
    queues = list(by_cat.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def bucket_kappa(choice, rows: float) -> int:
    """κ a bucket plan (``choice.buckets``: ``{batch bucket: κ}``) runs at ``rows`` live requests,
    rounded to a whole request: SGLang's floor lookup of the buckets (:func:`specc.compiler.lower.route_slot`,
    adaptive_spec_params.py:342-358)."""
    from specc.compiler.lower import route_slot

    return int(choice.buckets[route_slot(sorted(choice.buckets), max(1, int(round(rows))))])


def step_config(choice, c: int) -> Tuple[Optional[str], int]:
    """``(drafter, κ)`` a bucket plan runs at ``c`` live requests (:func:`bucket_kappa`); ``(None, 0)``
    where that κ is 0 (plain decoding, the drafter idle)."""
    k = bucket_kappa(choice, c)
    return (choice.candidate, k) if k > 0 else (None, 0)


def measured_values(pred, results, configs, plans, concurrency):
    """What the confirming runs measured, for the second choice: ``({(candidate, κ, batch): tok/s},
    {(candidate, C): factor})``. ``plans``: ``{label: Choice}``, each tuned plan's run label and the
    bucket plan it ran (one per confirming pass). A tuned plan's run counts as its bucket's κ when that κ ran at least
    ``PLAN_RUN_SHARE`` of its steps (the rest: the batch draining at the end), so a bucket whose run
    lost to plain decoding is demoted; otherwise it only informs the factors. A run's throughput is
    brought from its mean batch to C, and to the bucket its mean batch falls in
    (:func:`specc.tune.predict.bucket_sizes`; a run whose batch drained spent its steps there), with
    the model's own batch dependence (× prediction there / prediction at the mean batch). The factor
    of a candidate at C (None: plain decoding) is the median of its runs' measured over predicted
    throughput at their mean batches, applied to its configurations that were not run
    (:func:`specc.tune.predict.choose`); a run at κ = 0 (the tuned plan's bucket at plain decoding)
    counts toward plain decoding's factor, since its drafter idled."""
    import statistics

    from specc.compiler.lower import route_slot
    from specc.tune.predict import Config, bucket_sizes

    sizes = bucket_sizes(concurrency)
    out: Dict[Tuple[Optional[str], int, int], float] = {}
    ratios: Dict[Tuple[Optional[str], int], List[float]] = {}
    for (label, c), r in sorted(results.items(), key=lambda kv: kv[0][1]):
        cfg = configs.get(label)
        choice = plans.get(label)
        if choice is not None:
            total = sum(r.kappa_steps.values())
            ks = [k for k, n in r.kappa_steps.items() if n >= PLAN_RUN_SHARE * max(1, total)]
            if len(ks) != 1:
                k = bucket_kappa(choice, r.mean_batch)
                ratios.setdefault((choice.candidate if k > 0 else None, c), []).append(
                    r.decode_tok_s / max(1e-9, pred.tok_s(Config(choice.candidate, k), r.mean_batch)))
                continue
            cfg = Config(choice.candidate, ks[0])
        if cfg is None or r.mean_batch <= 0:
            continue
        at_b = max(1e-9, pred.tok_s(cfg, r.mean_batch))
        # a run at κ = 0 is plain decoding (the drafter idles): it measures plain's factor, not the drafter's
        ratios.setdefault((cfg.candidate if cfg.num_steps > 0 else None, c), []).append(r.decode_tok_s / at_b)
        out[(cfg.candidate, cfg.num_steps, c)] = r.decode_tok_s * pred.tok_s(cfg, c) / at_b
        bucket = route_slot(sizes, max(1, int(r.mean_batch)))
        if bucket != c and (cfg.candidate, cfg.num_steps, bucket) not in out:
            out[(cfg.candidate, cfg.num_steps, bucket)] = r.decode_tok_s * pred.tok_s(cfg, bucket) / at_b
    return out, {key: statistics.median(v) for key, v in ratios.items() if v}
