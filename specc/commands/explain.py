"""``specc explain PLAN [PLAN ...] [OVERRIDE ...]``: the plan's candidate states, what each costs and yields;
several plans side by side.

α comes from ``--alpha``, ``--acceptance`` (a ``specc run --json`` output or an acceptance record),
``schedule.alpha``, the plan's synthetic acceptance, or the drafter's acceptance record
(:mod:`specc.predict.acceptance`), and the header says which. With none of them no α is assumed: the table
gives each state's α to pay (the α at which it ties plain decoding, at batch 1 and at its bucket)
instead of E and the speedups, and the JSON has ``alpha: null`` and ``alpha_to_pay`` per state.

Per state: bucket, κ, verify width, draft and target forward passes per step, target tokens per step,
predicted E and speedup at α, speedup at the bucket's batch, break-even batch, draft KV bytes per
token, programs (CUDA graphs) to capture and their static-buffer memory. Every state's stage graph is
built and validated. ``--plot FILE.png`` draws speedup against batch per κ and the break-even curve on
the (cost, acceptance) plane; ``--format json`` prints the same data as JSON; ``--graphs DIR`` writes
each state's stage graph as JSON (networkx node_link_data) and DOT. The options are validated
before anything is computed (:func:`validate_outputs`): a ``--plot`` extension matplotlib cannot
write, an unwritable ``--plot`` path, a ``--graphs`` path that is an existing file, a negative or
non-finite ``--c`` are ``SpeccError`` (``specc explain: error: ...``, exit 2). Break-even ``<1``
means speculation pays at no batch size (E < 1 + draft cost; JSON ``0.0``), ``never`` that the
state is plain decode (JSON ``null``).

Formulas: :mod:`specc.predict.cost` (speculative decoding's yield and speedup, Leviathan et al. 2023,
arXiv:2211.17192, over a roofline step model). Torch is never imported.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from specc.errors import SpeccError
from specc.console import plural
from specc.io import check_output_dir, check_output_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan arguments of ``specc check`` plus explain's own options."""
    parser.add_argument("plan", metavar="PLAN", help="plan YAML file or preset name (conf/plan/<name>.yaml); "
                        "several plans are printed side by side")
    parser.add_argument("overrides", nargs="*", metavar="PLAN|OVERRIDE",
                        help="more plans, and Hydra overrides (group=option or dotted.key=value) applied to every plan")
    parser.add_argument("--engine", default=None, metavar="ENGINE",
                        help="explain the plan as this engine runs it: specc, sglang, vllm, an engine package's "
                             "name, or a pinned release such as sglang==0.5.23 (default: the plan's `engine` "
                             "key); its rules are checked first, as `specc check` does")
    alpha = parser.add_mutually_exclusive_group()
    alpha.add_argument("--alpha", type=float, default=None,
                       help="per-position acceptance α for the predictions (default: schedule.alpha, the plan's "
                            "verify.synthetic acceptance, else the drafter's acceptance record; without any, "
                            "no α is assumed and the α each state needs is printed)")
    alpha.add_argument("--acceptance", metavar="RUN.json", default=None,
                       help="predict from measured acceptance: the output of `specc run ... --json` (per-position "
                            "accepted counts of its summary line) or an acceptance record (`specc tune`'s "
                            "PLAN.acceptance.json, a drafter's acceptance.json)")
    parser.add_argument("--c", dest="draft_cost", type=float, default=None,
                        help="draft cost ratio c = t_draft/t_target (default: from the checkpoints, "
                             "else the method's default)")
    parser.add_argument("--hardware", default=None, metavar="NAME|FILE",
                        help="the device for T* and the deployment lines: a shipped profile (cpu, h100, h200), a "
                             "hardware profile YAML, or a cost table JSON from `specc profile` (its device's "
                             "profile), as `specc check --hardware` takes it (default: schedule.hardware, else "
                             "cpu/h100 by runtime.device)")
    parser.add_argument("--target", default=None, metavar="PATH",
                        help="explain the plans for this model instead of their target: a Hugging Face model "
                             "directory (config.json, *.safetensors) or a .gguf file (nothing is downloaded)")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="write speedup vs batch per κ and the break-even curve (cost, α)")
    parser.add_argument("--graphs", metavar="DIR", default=None,
                        help="write each state's stage graph as DIR/<state>.json and .dot")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def _fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "n/a"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _fmt_be(x: float) -> str:
    """``never`` (κ = 0: plain decode never loses to itself), ``<1`` (speculation does not pay even at
    batch 1, see :func:`specc.predict.cost.break_even_batch`), else the batch size to one decimal."""
    return "never" if math.isinf(x) else ("<1" if x < 1 else f"{x:.1f}")


_PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def plot_formats() -> Dict[str, str]:
    """File extensions (without dot) → description for ``--plot``: matplotlib's writable formats
    (``FigureCanvasBase.get_supported_filetypes``) minus those needing more than matplotlib + Pillow
    (pgf needs LaTeX) or that are not images (raw/rgba)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return {k: v for k, v in FigureCanvasBase.get_supported_filetypes().items() if k in _PLOT_FORMATS}


def validate_outputs(args: argparse.Namespace) -> None:
    """Check ``--plot``, ``--graphs``, ``--alpha`` and ``--c`` before anything is computed.

    Raises SpeccError (exit 2) for: a ``--plot`` extension matplotlib cannot write, a ``--plot`` path
    that cannot be created, a ``--graphs`` path that exists and is not a directory (or cannot be
    created), a non-finite or negative ``--c`` (c = t_draft / t_target ≥ 0; 0 is a free drafter),
    a non-finite ``--alpha`` (the range [0, 1] is checked by :func:`specc.compiler.lower.plan_alpha`)."""
    c = getattr(args, "draft_cost", None)
    if c is not None and not (math.isfinite(c) and c >= 0):
        raise SpeccError(f"--c must be a finite number >= 0 (c = t_draft / t_target, 0 = a free drafter), "
                         f"got {c}")
    a = getattr(args, "alpha", None)
    if a is not None and not math.isfinite(a):
        raise SpeccError(f"--alpha must lie in [0, 1], got {a}")
    if getattr(args, "acceptance", None):
        from specc.predict.acceptance import AcceptanceError, is_record_file, read_record
        from specc.io import RUN_JSON_LIMIT, read_bounded

        text = str(read_bounded(args.acceptance, RUN_JSON_LIMIT, "--acceptance file"))
        if is_record_file(text):
            try:
                args.record_entries = read_record(args.acceptance)
            except AcceptanceError as exc:
                raise SpeccError(f"--acceptance {exc}") from None
        else:
            args.measured = read_acceptance(args.acceptance)
    if getattr(args, "plot", None):
        path = Path(args.plot)
        ext = path.suffix.lower().lstrip(".")
        formats = plot_formats()
        if ext not in formats:
            raise SpeccError(f"--plot {args.plot}: unsupported file extension {path.suffix or '(none)'!r}; "
                             f"use one of {', '.join('.' + f for f in sorted(formats))} (e.g. explain.png)")
        check_output_file(path, "--plot")
    if getattr(args, "graphs", None):
        check_output_dir(args.graphs, "--graphs", parents=False)


COLUMNS = ("state", "B", "κ", "W", "draft fwd", "extend fwd", "target fwd", "target tok", "E", "speedup",
           "speedup@B", "break-even B", "draft KV/tok", "graphs", "graph mem")


def table_rows(preds) -> List[List[str]]:
    """One row of strings per :class:`specc.predict.cost.Prediction`, in :data:`COLUMNS` order."""
    rows = []
    for p in preds:
        rows.append([p.state, str(p.batch_size), str(p.num_steps), str(p.num_draft_tokens),
                     str(p.draft_forward_passes), str(p.extend_forward_passes), str(p.target_forward_passes),
                     str(p.target_tokens_per_step), f"{p.expected_tokens:.3f}", f"{p.speedup:.2f}x",
                     f"{p.speedup_at_batch:.2f}x", _fmt_be(p.break_even_batch),
                     "n/a" if p.draft_kv_bytes_per_token is None else _fmt_bytes(p.draft_kv_bytes_per_token),
                     str(p.graphs_to_capture), _fmt_bytes(p.graph_buffer_bytes)])
    return rows


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str] = COLUMNS) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


#: the PNG text key holding the plotted numbers (JSON; read back with PIL ``Image.open(path).text``)
PLOT_SERIES_KEY = "specc:series"


def plot_series(preds, story: Optional[dict], assumed: bool) -> dict:
    """The numbers :func:`plot` draws, as JSON: exactly the table's and the JSON output's.

    ``speedup_at_batch``: ``{"κ=k (W=w)": [[B, speedup@B], ...]}`` per κ over the states' buckets B
    (:attr:`specc.predict.cost.Prediction.speedup_at_batch`); ``speedup``: ``{state: speedup at batch 1}``;
    ``plan_at_concurrency``: ``[[C, predicted speedup, measured speedup or None], ...]``
    (:func:`specc.tune.predict.plan_predictions`); ``alpha_unknown``: True when no α was measured or
    given (then no speedup is plotted and the other series are empty)."""
    if assumed:
        return {"alpha_unknown": True, "speedup_at_batch": {}, "speedup": {}, "plan_at_concurrency": []}
    curves: Dict[str, List[List[float]]] = {}
    for p in sorted((p for p in preds if p.num_steps > 0), key=lambda p: (p.num_steps, p.num_draft_tokens,
                                                                          p.batch_size)):
        curves.setdefault(f"κ={p.num_steps} (W={p.num_draft_tokens})", []).append(
            [int(p.batch_size), float(p.speedup_at_batch)])
    rows = (story or {}).get("rows") or []
    return {"alpha_unknown": False, "speedup_at_batch": curves,
            "speedup": {p.state: float(p.speedup) for p in preds},
            "plan_at_concurrency": [[int(r["concurrency"]), float(r["speedup"]),
                                     None if r.get("measured_speedup") is None else float(r["measured_speedup"])]
                                    for r in rows]}


def plot(path: str, plan, preds, title: str, story: Optional[dict] = None, assumed: bool = False) -> dict:
    """Two panels: (left) the predicted speedup@B of each κ at the buckets' batch sizes, as the table
    gives it, and the plan at each concurrency (predicted; measured where ``specc tune`` ran it); with
    no α measured or given, no speedup at all but the words "α unknown"; (right) the (step cost, α)
    plane with each κ's break-even curve E(α, κ) = cost (speculation pays above it) and the plan's
    states. The plotted numbers (:func:`plot_series`) go into the PNG's text under
    :data:`PLOT_SERIES_KEY`, and are returned. Raises SpeccError when the file cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from specc.predict import cost

    series = plot_series(preds, story, assumed)
    spec = [p for p in preds if p.num_steps > 0]
    by_k: Dict[tuple, object] = {}
    for p in spec:
        by_k.setdefault((p.num_steps, p.num_draft_tokens), p)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    if assumed:
        ax1.text(0.5, 0.5, "α unknown: no speedup predicted\n(`specc tune PROMPTS`, --acceptance or --alpha)",
                 ha="center", va="center", transform=ax1.transAxes)
    for label, pts in series["speedup_at_batch"].items():
        ax1.plot([b for b, _ in pts], [s for _, s in pts], "o-", label=label)
    story_pts = series["plan_at_concurrency"]
    if story_pts:
        ax1.plot([c for c, _, _ in story_pts], [s for _, s, _ in story_pts], "k*--", ms=10,
                 label="the plan at each concurrency (tune's predictor)")
        meas = [(c, m) for c, _, m in story_pts if m is not None]
        if meas:
            ax1.plot([c for c, _ in meas], [m for _, m in meas], "rx", ms=10, mew=2, label="measured by specc tune")
    for b in sorted({p.batch_size for p in preds}):
        ax1.axvline(b, color="0.85", lw=0.8, zorder=0)
    ax1.axhline(1.0, color="k", lw=1, ls="--")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("batch size (vertical lines: buckets)")
    ax1.set_ylabel("predicted speedup over plain decode" + ("" if assumed else f" (α={preds[0].alpha:.2f})"))
    ax1.set_title(f"speedup@B as in the table ({preds[0].hardware})")
    if series["speedup_at_batch"] or story_pts:
        ax1.legend(fontsize=8)
    costs = np.linspace(1.0, 2.5, 120)
    ks = sorted({k for k, _ in by_k}) or [1, 3, 5, 7]
    colors = {}
    for k in ks:
        alphas = [cost.bisect_increasing(lambda a: cost.expected_tokens(a, k), c) if c <= k + 1 else np.nan
                  for c in costs]
        colors[k] = ax2.plot(costs, alphas, label=f"break-even κ={k}")[0].get_color()
    if not assumed:
        for (k, w), p in sorted(by_k.items()):
            ax2.plot([p.step_cost], [p.alpha], "o", color=colors.get(k, "k"))
            ax2.annotate(f"κ={k}", (p.step_cost, p.alpha), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax2.set_xlabel("step cost in target steps (chain 1+κc, parallel 1+c)")
    ax2.set_ylabel("acceptance α")
    ax2.set_ylim(0, 1)
    ax2.set_title("speculation pays above the curve (batch 1)")
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, metadata={PLOT_SERIES_KEY: json.dumps(series)}
                    if str(path).lower().endswith(".png") else None)
    except OSError as exc:
        raise SpeccError(f"--plot {path}: cannot write the plot ({exc.strerror or exc}); "
                         f"give a path in a writable folder") from None
    finally:
        plt.close(fig)
    return series


def explain(plan, alpha: Optional[float] = None, draft_cost: Optional[float] = None,
            hardware: Optional[str] = None, acceptance=None) -> dict:
    """Lower, graph, validate and predict every state of ``plan`` (:func:`specc.predict.analyze.analyze`).
    Returns a dict with ``inputs`` (:class:`specc.predict.sizing.CostInputs`), ``lowering``
    (:class:`specc.compiler.lower.Lowering`), ``predictions`` (list of :class:`specc.predict.cost.Prediction`),
    ``graphs`` (state name → DiGraph) and ``issues`` (state name → list of GraphIssue)."""
    from specc.predict import analyze
    from specc.compiler import graph

    res = analyze.analyze(plan, alpha=alpha, c=draft_cost, hardware=hardware, acceptance=acceptance)
    low = res.lowering
    preds = [res.predictions[s.name] for s in low.states]
    issues = {name: graph.validate_graph(g) for name, g in res.graphs.items()}
    return {"inputs": res.inputs, "lowering": low, "predictions": preds, "graphs": res.graphs,
            "issues": issues}


@dataclass(frozen=True)
class MeasuredAcceptance:
    """Acceptance measured by a ``specc run --json`` run (its summary line).

    ``rates[i]`` = accepted tokens at draft position i / verify steps (vLLM's per-position counts
    over steps, so 1 + Σ rates = τ, the run's tokens per step); ``alpha`` the constant
    per-position α with E(α, κ) = τ at the run's κ = len(rates) (:func:`specc.predict.cost.alpha_for_expected_tokens`,
    the inversion ``verify.synthetic.acceptance_rates`` uses)."""

    alpha: float
    rates: Tuple[float, ...]
    tau: float
    num_steps: int
    num_drafts: int
    artifact: str
    path: str
    drafts_per_step: Optional[float] = None  # verified draft tokens per request and step (num_draft_tokens / num_steps)

    @property
    def source(self) -> str:
        rates = ", ".join(f"{r:.3f}" for r in self.rates)
        art = f" of {self.artifact}" if self.artifact else ""
        return (f"measured: {self.path}{art}, accepted per position per step [{rates}], τ = {self.tau:.3f} "
                f"at κ = {len(self.rates)} over {plural(self.num_steps, 'step')}; α fitted so E(α, {len(self.rates)}) = τ")


def _summary_object(text: str, where: str) -> dict:
    """The summary object of ``specc run --json`` output: the last line ``{"summary": {...}}``
    (JSONL), or a whole-file JSON object holding ``summary`` or being one."""
    from specc.io import load_json

    try:
        whole = load_json(text, f"--acceptance {where}")
    except ValueError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("summary"), dict):
        return whole["summary"]
    if isinstance(whole, dict) and "num_accepted_tokens_per_pos" in whole:
        return whole
    found = None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = load_json(line, f"--acceptance {where}:{i}")
        except ValueError as exc:
            raise SpeccError(f"--acceptance {where}:{i}: not JSON ({exc}); give the output of "
                             f"`specc run ARTIFACT --json > RUN.json`") from None
        if isinstance(obj, dict) and isinstance(obj.get("summary"), dict):
            found = obj["summary"]
    if found is None:
        raise SpeccError(f"--acceptance {where}: no {{\"summary\": ...}} line; give the output of "
                         f"`specc run ARTIFACT --json > RUN.json`")
    return found


def read_acceptance(path: str) -> MeasuredAcceptance:
    """Read the acceptance a ``specc run --json`` run measured (see :class:`MeasuredAcceptance`).

    The file is read with :func:`specc.io.read_bounded` (a regular file of at most
    :data:`specc.io.RUN_JSON_LIMIT` bytes).

    Raises:
        SpeccError: unreadable, not the output of ``specc run --json``, counters that are not
            non-negative integers or do not fit together (more accepted at a position than steps,
            or more at a later position than an earlier one), or a run that drafted nothing.
    """
    from specc.predict import cost
    from specc.io import RUN_JSON_LIMIT, read_bounded

    text = str(read_bounded(path, RUN_JSON_LIMIT, "--acceptance file"))
    summary = _summary_object(text, path)
    per_pos = summary.get("num_accepted_tokens_per_pos")
    steps = summary.get("num_steps", summary.get("num_drafts"))
    drafts = summary.get("num_drafts", steps)

    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(per_pos, list) or not all(count(n) for n in per_pos) or not count(steps) or not count(drafts):
        raise SpeccError(f"--acceptance {path}: the summary needs integer counters num_steps, num_drafts and "
                         f"num_accepted_tokens_per_pos (a list); give the output of `specc run ARTIFACT --json`")
    if not per_pos or not steps or not drafts:
        raise SpeccError(f"--acceptance {path}: the run drafted nothing (κ = 0, or no draft was proposed), so "
                         f"it measured no acceptance; run a speculative artifact")
    if any(n > steps for n in per_pos) or any(b > a for a, b in zip(per_pos, per_pos[1:])):
        raise SpeccError(f"--acceptance {path}: num_accepted_tokens_per_pos {per_pos[:8]} does not fit "
                         f"num_steps {steps} (a position cannot accept more often than the one before it); "
                         f"the file was edited or is not from specc run")
    rates = tuple(n / steps for n in per_pos)
    tau = 1.0 + sum(rates)
    alpha = cost.alpha_for_expected_tokens(min(tau, len(rates) + 1.0), len(rates))
    art = summary.get("artifact")
    verified = summary.get("num_draft_tokens")
    return MeasuredAcceptance(alpha=alpha, rates=rates, tau=tau, num_steps=int(steps), num_drafts=int(drafts),
                              artifact=str(art) if isinstance(art, str) else "", path=str(path),
                              drafts_per_step=verified / steps if count(verified) else None)


def measured_width_speedups(preds, measured: Optional[MeasuredAcceptance], inputs, lookup: bool) -> Dict[str, float]:
    """For a lookup drafter (n-gram, suffix: each request verifies only the drafts its match gave, not
    the state's width W), each state's speedup at its batch B from the run itself: τ tokens per
    request and step for a verify over B·(1 + d̄) tokens (d̄ = the run's verified drafts per request and
    step), against plain decoding's B tokens: τ · t(B) / (t_lookup(B) + t(B·(1 + d̄))), with t and
    t_lookup the profiled cost table's step and draft-stage times when the plan has one
    (:func:`specc.predict.cost.batch_throughput`), else the T* roofline max(1, n / T*). Empty when the run
    did not record its drafts or the method is not a lookup."""
    if measured is None or measured.drafts_per_step is None or not lookup:
        return {}
    from specc.predict import cost

    model = getattr(inputs, "batch_model", None)
    out = {}
    for p in preds:
        if p.num_steps == 0:
            continue
        b = p.batch_size
        if model is not None:  # the cost model's pricing of a measured lookup (cost.predict's, one lookup a step)
            out[p.state] = (cost.batch_throughput(b, p.num_steps, 0.0, model, expected=measured.tau,
                                                  drafts=measured.drafts_per_step, lookup=True)
                            / cost.batch_throughput(b, 0, 0.0, model))
        else:
            n = max(1, round(b * (1.0 + measured.drafts_per_step)))
            out[p.state] = measured.tau * max(1.0, b / p.saturation_tokens) / max(1.0, n / p.saturation_tokens)
    return out


def refuse_rule_errors(args: argparse.Namespace, engine: str) -> int:
    """Print the plan's rule errors exactly as ``specc check PLAN [OVERRIDES] --engine ENGINE``
    prints them (its own renderer), to stderr, and return check's exit code for errors (1)."""
    from specc.check.results import check_inputs, exit_code
    from specc.commands.check import render_text

    results = check_inputs([args.plan], list(args.overrides or ()), engine)
    sys.stderr.write(render_text(results, False))
    n = sum(v.severity == "error" for r in results for v in r.violations)
    print(f"specc explain: error: the plan has {plural(n, 'error')} for engine {engine!r} (listed above, as "
          f"`specc check` reports them); nothing to explain until they are fixed", file=sys.stderr)
    return exit_code(results) or 1


def _violation_line(v, where) -> str:
    """``file:line: severity: [rule] message`` as ``specc check`` prints it (location of the first
    of the rule's keys, or of the values it sets, that the plan or an override wrote)."""
    loc = ""
    for key in [k for k, _ in v.sets] + list(v.keys):
        src = where(key)
        if src:
            loc = f"{src[0]}:{src[1]}: " if src[1] else f"{src[0]}: "
            break
    return f"{loc}{v.severity}: [{v.rule}] {v.message}"


def planning_only(plan, violations) -> list:
    """The errors that only say the engine does not *run* ``schedule.kind: auto`` (SGLang's BB1,
    vLLM's A1: they name the key ``schedule.kind`` alone). For those engines ``auto`` is a planning
    mode: explain derives the κ candidates per batch bucket from the cost model, which the user then
    writes into ``schedule.buckets`` of an adaptive or batch-bucket schedule; explain reports these
    errors as notes instead of refusing."""
    if plan.schedule.kind != "auto":
        return []
    return [v for v in violations if v.severity == "error" and tuple(v.keys) == ("schedule.kind",)]


def _legend(preds, inputs=None) -> List[str]:
    """What the two speedup columns mean, and which batch-1 rows differ and why (``inputs``: the
    plan's :class:`specc.predict.sizing.CostInputs`; with a profiled cost table, speedup@B of chain,
    parallel and plain states comes from its measured step times)."""
    t_star = preds[0].saturation_tokens
    table = getattr(inputs, "batch_model", None) is not None
    lines = [f"speedup: E / (1 + draft cost) at batch 1, every verify costing one target step whatever "
             f"its width W; speedup@B: at the bucket's batch B, "
             + ("from the profiled cost table's step times (the batch throughput model; tree states: "
                f"a pass over n tokens costing max(1, n / T*), T* = {t_star:.1f})" if table else
                f"a pass over n tokens costing max(1, n / T*) (T* = {t_star:.1f} tokens on {preds[0].hardware})")]
    differ = [p.state for p in preds if p.batch_size == 1 and abs(p.speedup - p.speedup_at_batch) > 5e-3]
    if differ and table:
        lines.append(f"  at batch 1 they differ for {', '.join(differ)}: the measured cost of the verify and "
                     f"draft passes replaces the model's one step per verify and c per draft pass")
    elif differ:
        lines.append(f"  at batch 1 they differ where W > T*: the verify of {', '.join(differ)} is compute-bound, "
                     f"so speedup@B is the lower, saturating-model figure")
    return lines


def _pass_notes(plan, preds, inputs) -> List[str]:
    """What the pass columns count for this method, and frozen-KV MTP's KV saving (4 KiB per token
    per layer at h_kv = 8, d_h = 128, bf16, scaled to the draft's shape) or multi-layer EAGLE's per-module costs."""
    from specc import methods

    m = methods.get(plan.method.name)
    out = []
    if m.drafts and not m.lookup:
        out.append("draft fwd / extend fwd: the drafter's forward passes per step in the draft and the extend "
                   "stages, counted at one iteration boundary" + (
                       " (the extend's output drafts token 1: κ − 1 draft passes)" if m.draft_from_extend else ""))
    saved = getattr(inputs, "draft_kv_bytes_saved_per_token", None)
    if m.frozen_kv:
        text = ("frozen-KV: no draft-extend pass and no draft KV pool (the assistant reads the target's KV "
                "read-only at the last written position)")
        if saved:
            text += (f"; the same assistant with a pool of its own would hold {_fmt_bytes(saved)} per token "
                     f"(4 KiB per layer at h_kv = 8, d_h = 128, bf16, scaled to this draft's shape), "
                     f"{saved * 64 * 8192 / 1e6:.0f} MB at 64 sequences of 8k context")
        out.append(text)
    modules = getattr(inputs, "c_modules", None)
    if modules:
        out.append("multi-layer EAGLE: a step of κ costs 1 + Σ_{i<κ} c_i over its modules (c_i = "
                   + ", ".join(f"{c:.4f}" for c in modules) + "), not κ·c with the whole checkpoint's c")
    return out


def split_plans(args: argparse.Namespace) -> Tuple[List[str], List[str]]:
    """The plans and the overrides among the positional words: an override has ``=`` (``key=value``,
    ``group=option``), a plan does not (a file or a preset name)."""
    words = [str(w) for w in (args.overrides or ())]
    return [args.plan] + [w for w in words if "=" not in w], [w for w in words if "=" in w]


def alpha_to_pay(state, inputs, stats, at_batch: bool) -> Optional[float]:
    """The per-position α at which ``state`` ties plain decoding — at batch 1 (E / (1 + draft cost)) or at its
    bucket (``speedup@B``) — by bisection over α (the speedups grow with α); +inf when even α = 1 does
    not pay, 0.0 when α = 0 already does, None for a plain state (κ = 0)."""
    from dataclasses import replace

    from specc.predict import cost

    base = replace(inputs, acceptance=None)

    def speed(a: float) -> float:
        p = cost.predict(state, replace(base, alpha=a), stats)
        return p.speedup_at_batch if at_batch else p.speedup

    if state.num_steps == 0:
        return None  # plain decoding: nothing to pay for
    if speed(1.0) < 1.0:
        return math.inf
    if speed(0.0) >= 1.0:
        return 0.0
    return cost.bisect_increasing(speed, 1.0, iterations=30)


def _fmt_alpha(a: Optional[float]) -> str:
    if a is None:
        return "–"
    return "never" if math.isinf(a) else f"{a:.2f}"


ASSUMED_COLUMNS = ("state", "B", "κ", "W", "draft fwd", "extend fwd", "target fwd", "target tok", "α to pay",
                   "α to pay@B", "draft KV/tok", "graphs", "graph mem")


def assumed_rows(preds, pays) -> List[List[str]]:
    """Rows of :data:`ASSUMED_COLUMNS`: without a measured or given α, each state's α to break even
    (``pays``: state → (at batch 1, at its bucket)) replaces E and the speedups."""
    rows = []
    for p, full in zip(preds, table_rows(preds)):
        a1, ab = pays[p.state]
        rows.append(full[:8] + [_fmt_alpha(a1), _fmt_alpha(ab)] + full[12:])
    return rows


def match_record(entries, plan, path: str):
    """The entry of an acceptance record file (``--acceptance RECORD.json``) measured for ``plan``'s
    target, drafter and proposals. Raises SpeccError naming ``--acceptance`` and the entries it has."""
    from specc.predict.acceptance import entry_for, proposal_key

    key = proposal_key(plan)
    draft = str(plan.draft.path) if plan.draft is not None and plan.draft.path else None
    found = entry_for(entries, plan)
    if found is not None:
        return found
    have = "; ".join(f"{e.key} (draft {e.draft})" for e in entries) or "none"
    raise SpeccError(f"--acceptance {path}: no entry for this plan's drafter and proposals ({key}, draft {draft}); "
                     f"the record has: {have}")


def analyze_one(args: argparse.Namespace, source: str, overrides: List[str]):
    """Load, resolve, refuse (rule errors) and explain one plan. Returns ``(rc, context)``: rc 1 and
    None when the plan has rule errors for its engine (printed as ``check`` prints them)."""
    from dataclasses import replace

    from specc.plan.load import load_plan
    from specc.check import resolve
    from specc.predict import sizing

    loaded = load_plan(source, overrides)
    if getattr(args, "target", None) is not None:
        from specc.models.target import check_drafter_fits

        check_drafter_fits(loaded.plan)
    engine = args.engine or loaded.plan.engine
    resolved, violations = resolve(loaded.plan, engine)
    planning = planning_only(loaded.plan, violations)
    if any(v.severity == "error" and v not in planning for v in violations):
        sub = argparse.Namespace(**vars(args))
        sub.plan, sub.overrides = source, overrides
        return refuse_rule_errors(sub, engine), None
    plan = resolved  # as the engine runs it: filled defaults and fallbacks applied, as check reports
    measured: Optional[MeasuredAcceptance] = getattr(args, "measured", None)
    record = getattr(args, "record_entries", None)
    entry = match_record(record, plan, args.acceptance) if record is not None else None
    alpha = measured.alpha if measured is not None else args.alpha
    res = explain(plan, alpha, args.draft_cost, args.hardware, entry)
    preds = res["predictions"]
    alpha_used, alpha_source = res["inputs"].alpha, res["inputs"].alpha_source
    if measured is not None:
        alpha_source = measured.source
        preds = [replace(p, alpha_source=measured.source) for p in preds]
    if not preds:
        raise SpeccError(f"plan {plan.name!r} lowers to no candidate state")
    assumed = sizing.alpha_is_assumed(alpha_source)
    alpha_note = None
    if assumed:
        alpha_note = (f"no α was measured or given for this drafter, so none is assumed: the table gives the α each "
                      f"state needs to beat plain decoding (at batch 1, and at its bucket) instead of a speedup. "
                      f"Measure it: `specc tune PROMPTS` (or `specc run PLAN --json > run.jsonl` and --acceptance "
                      f"run.jsonl), or pass --alpha")
    elif measured is not None and any(p.num_steps > len(measured.rates) for p in preds):
        alpha_note = (f"states with κ > {len(measured.rates)} (the measured run's κ) extrapolate the fitted α "
                      f"to positions that run never drafted")
    elif res["inputs"].acceptance is not None and any(
            p.num_steps > res["inputs"].acceptance.num_steps for p in preds):
        alpha_note = (f"states with κ > {res['inputs'].acceptance.num_steps} (the record's κ) extrapolate the last "
                      f"measured rate with the fitted α")
    pays = {}
    if assumed:
        from specc.predict.analyze import graph_stats

        for st in res["lowering"].states:
            stats = graph_stats(res["graphs"][st.name])
            pays[st.name] = (alpha_to_pay(st, res["inputs"], stats, False), alpha_to_pay(st, res["inputs"], stats, True))
    from specc.tune.predict import plan_predictions

    story = plan_predictions(plan, buckets={int(k): list(v) for k, v in res["lowering"].buckets.items()})
    ctx = dict(loaded=loaded, engine=engine, plan=plan, violations=violations, planning=planning, res=res,
               preds=preds, alpha=alpha_used, alpha_source=alpha_source, alpha_note=alpha_note, assumed=assumed,
               measured=measured, pays=pays, story=story)
    return 0, ctx


def plan_story(source: str, overrides: Sequence[str] = (), concurrency: Optional[Sequence[int]] = None) -> dict:
    """:func:`specc.tune.predict.plan_predictions` of a plan (file or preset name, with ``overrides``) or
    of a compiled artifact directory (its ``plan.yaml``), as the specc runtime runs it: what ``explain``
    prints per concurrency, for ``bench`` and ``serve`` to print beside what they measure. A plan that
    does not load or records that do not read give ``{"unknown": why, "rows": []}`` (the command goes on)."""
    from specc.check import resolve
    from specc.errors import SpeccError
    from specc.plan.load import load_plan
    from specc.tune.predict import plan_predictions

    path = Path(source)
    if path.is_dir() and (path / "manifest.json").is_file():
        source, overrides = str(path / "plan.yaml"), ()
    try:
        plan, _ = resolve(load_plan(source, list(overrides)).plan, "specc")
        return plan_predictions(plan, concurrency=concurrency)
    except SpeccError as exc:
        return {"unknown": str(exc).splitlines()[0], "rows": [], "cost_table": None, "acceptance": None,
                "tuned": False, "concurrency": [], "measured_source": None}


def assumptions(args: argparse.Namespace, plan, ctx) -> List[str]:
    """One "assumed:" sentence per input explain took by default rather than from the plan, a record or a
    flag, each with the flag or key that sets it: the context length of the deployment
    (:data:`specc.predict.deploy_cost.DEFAULT_CONTEXT` without ``target.max_model_len``), the hardware
    profile (by ``runtime.device`` without ``--hardware`` or ``schedule.hardware``) and α (none measured
    or given; one α for every position; acceptance measured on the shipped prompts, not yours)."""
    from specc.predict import deploy_cost, sizing

    out = []
    if not plan.target.max_model_len:
        out.append(f"context length {deploy_cost.DEFAULT_CONTEXT} tokens per request (KV and graph memory); "
                   f"set target.max_model_len=N")
    if not args.hardware and not plan.schedule.hardware:
        out.append(f"hardware profile {sizing.default_hardware(plan)} (by runtime.device = {plan.runtime.device}); "
                   f"--hardware NAME or schedule.hardware (conf/hardware/*.yaml) sets it")
    src = str(ctx["alpha_source"])
    if ctx["assumed"]:
        out.append("α: none measured or given, so no speedup is predicted; `specc tune PROMPTS`, --acceptance RECORD "
                   "or --alpha sets it")
    elif src == "schedule.alpha" or src == "--alpha":
        out.append(f"α = {ctx['alpha']:.3f} at every draft position ({src}); per-position rates come from a record: "
                   f"--acceptance RECORD or schedule.acceptance (`specc tune` writes both)")
    elif src.startswith("acceptance record "):
        out.append("acceptance measured on the shipped prompts (the drafter's record), not on yours; "
                   "`specc tune YOUR_PROMPTS` or --acceptance RECORD sets it")
    return out


def story_lines(story: dict) -> List[str]:
    """The lines of :func:`specc.tune.predict.plan_predictions`: the plan at each concurrency, predicted
    (and measured, where ``specc tune`` ran it) against plain decoding."""
    if story["unknown"]:
        return [f"plan at each concurrency: {story['unknown']}"]
    how = ("specc tune's predictor: the cost table and stage costs it wrote" if story["tuned"]
           else "the cost table alone (no stage costs from `specc tune`: host work not counted)")
    out = [f"plan at each concurrency ({how}, {story['cost_table']}):"]
    for r in story["rows"]:
        line = (f"  concurrency {r['concurrency']}: bucket {r['bucket']}, κ = {r['num_steps']}: predicted "
                f"{r['tok_s']:.1f} tok/s vs plain {r['plain_tok_s']:.1f} = {r['speedup']:.2f}x")
        if r.get("measured_speedup"):
            line += (f"; measured by specc tune {r['measured_tok_s']:.1f} vs {r['measured_plain_tok_s']:.1f} = "
                     f"{r['measured_speedup']:.2f}x ({story['measured_source']})")
        out.append(line)
    return out


def context_json(args: argparse.Namespace, ctx) -> dict:
    """The ``--format json`` object of one explained plan. Without a measured or given α, ``alpha``
    and every state's E and speedups are null and ``alpha_to_pay`` / ``alpha_to_pay_at_batch`` say
    what α each state needs."""
    plan, low, preds, issues = ctx["plan"], ctx["res"]["lowering"], ctx["preds"], ctx["res"]["issues"]
    measured, p0 = ctx["measured"], ctx["preds"][0]
    states = []
    for p in preds:
        d = dict(p.as_dict(), graph_issues=[str(i) for i in issues[p.state]])
        if ctx["assumed"]:
            a1, ab = ctx["pays"][p.state]
            d.update(alpha=None, expected_tokens=None, speedup=None, speedup_at_batch=None, break_even_batch=None,
                     s_infinity=None, alpha_to_pay=a1, alpha_to_pay_at_batch=ab)
        states.append(d)
    entry = ctx["res"]["inputs"].acceptance
    return {
        "plan": plan.name, "path": str(ctx["loaded"].path), "engine": ctx["engine"], "method": plan.method.name,
        "schedule": plan.schedule.kind, "alpha": None if ctx["assumed"] else ctx["alpha"],
        "alpha_source": ctx["alpha_source"], "alpha_assumed": ctx["assumed"],
        "alpha_measured": measured is not None or entry is not None, "alpha_note": ctx["alpha_note"],
        "measured_acceptance": ({"path": measured.path, "artifact": measured.artifact,
                                 "rates_per_step": list(measured.rates), "tau": measured.tau,
                                 "num_steps": measured.num_steps, "num_drafts": measured.num_drafts}
                                if measured is not None else
                                {"path": entry.path, "rates_per_step": list(entry.rates), "tau": entry.tau,
                                 "tau_ci95": list(entry.tau_ci95), "num_steps": entry.num_steps,
                                 "requests": entry.counters.get("num_requests"), "prompts": entry.prompts}
                                if entry is not None else None),
        "c": p0.c, "c_source": p0.c_source, "hardware": p0.hardware,
        "saturation_tokens": p0.saturation_tokens, "capture_sizes": list(low.capture_sizes),
        "buckets": {str(k): list(v) for k, v in low.buckets.items()},
        "reasons": {str(k): v for k, v in low.reasons.items()}, "notes": list(low.notes),
        "violations": [v.to_json() for v in ctx["violations"]],
        "speedup_columns": " ".join(_legend(preds, ctx["res"]["inputs"])),
        "states": states, "plot": args.plot,
    }


def run(args: argparse.Namespace) -> int:
    validate_outputs(args)
    if args.engine is not None:  # checked before any plan loads
        from specc.check import profile

        try:
            profile(args.engine)
        except KeyError as exc:
            why = str(exc).strip("'\"")
            raise SpeccError(f"--engine {args.engine}: {why}") from None
    if args.hardware is not None:  # checked before any plan loads, as `specc check --hardware` checks it
        from specc.predict.hardware import parse_hardware

        args.hardware = parse_hardware(args.hardware).profile
    plans, overrides = split_plans(args)
    if getattr(args, "target", None) is not None:  # checked before any plan loads; the user's overrides win
        from specc.models.target import read_target_arg, target_overrides

        overrides = target_overrides(read_target_arg(args.target, need_tokenizer=False)) + list(overrides)
    if len(plans) > 1:
        if args.plot or args.graphs:
            raise SpeccError("--plot and --graphs take one plan; explain the plans one by one to draw them")
        return run_side_by_side(args, plans, overrides)
    rc, ctx = analyze_one(args, plans[0], overrides)
    if ctx is None:
        return rc
    return print_one(args, ctx)


def print_one(args: argparse.Namespace, ctx) -> int:
    """Write the graphs and plot, and print one explained plan (table or JSON)."""
    from specc.compiler import graph

    plan, res, preds, loaded = ctx["plan"], ctx["res"], ctx["preds"], ctx["loaded"]
    low, issues = res["lowering"], res["issues"]
    bad = {k: v for k, v in issues.items() if v}
    deployment = deployment_lines(plan, ctx["engine"], low.states, preds, res["inputs"], args.hardware)
    refusal = deployment.refusal if deployment is not None else None
    if args.graphs:
        out = Path(args.graphs)
        try:
            out.mkdir(exist_ok=True)
            for name, g in res["graphs"].items():
                (out / f"{name}.json").write_text(json.dumps(graph.to_json(g), indent=1))
                (out / f"{name}.dot").write_text(graph.to_dot(g))
        except OSError as exc:
            raise SpeccError(f"--graphs {out}: cannot write the stage graphs ({exc.strerror or exc}); "
                             f"give a writable directory") from None
    if args.plot:
        plot(args.plot, plan, preds, f"{plan.name}: {plan.method.name}, schedule {plan.schedule.kind}"
             + (" (α unknown: no acceptance record)" if ctx["assumed"] else ""), ctx["story"], ctx["assumed"])
    p0 = preds[0]
    from specc import methods

    measured = ctx["measured"]
    by_width = measured_width_speedups(preds, measured, res["inputs"], methods.get(plan.method.name).lookup)
    notes = [_violation_line(v, loaded.where) for v in ctx["violations"] if v not in ctx["planning"]]
    notes += [f"note: {_violation_line(v, loaded.where)} — schedule.kind=auto is a planning mode: the "
              f"buckets below are what to write into schedule.buckets (kind adaptive or batch_buckets) "
              f"to run it" for v in ctx["planning"]]
    if args.format == "json":
        data = context_json(args, ctx)
        if measured is not None:
            data["measured_acceptance"].update(drafts_per_step=measured.drafts_per_step,
                                               speedup_at_batch_measured_width=by_width)
        data.update(deployment=deployment_json(deployment), refusal=refusal, plan_at_concurrency=ctx["story"],
                    assumed=assumptions(args, plan, ctx))
        print(json.dumps(_json_safe(data), indent=2, ensure_ascii=False))
        return 1 if bad or refusal else 0
    print(f"plan {plan.name} ({loaded.path}): method {plan.method.name}, verify {plan.verify.rule}, "
          f"schedule {plan.schedule.kind}, as {ctx['engine']} runs it")
    for line in notes:
        print(f"  {line}")
    unused = ctx["assumed"] or str(ctx["alpha_source"]).startswith("n/a")
    alpha_text = f"α: {ctx['alpha_source']}" if unused else f"α = {ctx['alpha']:.3f} ({ctx['alpha_source']})"
    print(f"{alpha_text}; c = {p0.c:.4f} ({p0.c_source}); "
          f"hardware {p0.hardware}: T* = {p0.saturation_tokens:.1f} tokens")
    measured_on = _cost_table_origin(plan.schedule.cost_table)
    if measured_on:
        print(f"  {measured_on}")
    for line in assumptions(args, plan, ctx):
        print(f"assumed: {line}")
    if ctx["alpha_note"]:
        print(f"  note: {ctx['alpha_note']}")
    print(f"captured batch sizes: {list(low.capture_sizes)}")
    from specc.compiler.lower import route_slot

    keys = sorted(low.buckets)
    used = {route_slot(keys, b) for b in low.capture_sizes}
    for key in keys:
        unused = "" if key in used else "  (no captured batch size routes here)"
        print(f"  bucket {key}: κ ∈ {list(low.buckets[key])}  — {low.reasons.get(key, '')}{unused}")
    for note in low.notes:
        print(f"  note: {note}")
    if any(p.draft_kv_bytes_per_token is None for p in preds):
        print(f"  note: draft KV/tok n/a: no readable config.json for draft.path = "
              f"{plan.draft.path if plan.draft else None!r}")
    for line in _pass_notes(plan, preds, res["inputs"]):
        print(f"  note: {line}")
    print()
    if ctx["assumed"]:
        print(format_table(assumed_rows(preds, ctx["pays"]), ASSUMED_COLUMNS))
        print()
        print("α to pay: the per-position acceptance at which the state ties plain decoding at batch 1 ("
              "E(α, κ) = 1 + draft cost); α to pay@B: the same at the bucket's batch B (the speedup@B model); "
              "never: no α ≤ 1 pays")
    else:
        print(format_table(table_rows(preds)))
        print()
        for line in _legend(preds, res["inputs"]):
            print(line)
    for line in story_lines(ctx["story"]):
        print(line)
    if by_width:
        print(f"measured width ({plan.method.name} drafts only what its match gives; the run verified "
              f"{measured.drafts_per_step:.2f} drafts per request and step, τ = {measured.tau:.2f}): speedup@B = "
              + ", ".join(f"{k} {v:.2f}x" for k, v in by_width.items()))
    print(f"{plural(len(preds), 'state')}; stage graphs: "
          + ("all valid" if not bad else f"{len(bad)} INVALID"))
    for name, found in bad.items():
        for i in found:
            print(f"  {name}: {i}")
    if args.plot:
        print(f"plot written to {args.plot}")
    print()
    for line in deployment_text(deployment, plan):
        print(line)
    if refusal:
        print(f"specc explain: error: {refusal}", file=sys.stderr)
    return 1 if bad or refusal else 0


def deployment_lines(plan, engine: str, states, preds, inputs, hardware: Optional[str]):
    """The plan's :class:`specc.predict.deploy_cost.DeploymentReport` on the hardware profile (``--hardware``,
    else ``schedule.hardware``, else by ``runtime.device``), or None when the target's shape is not
    known (no readable config.json or GGUF header, and not in ``specc/data/model_shapes.json``)."""
    from specc.predict import cost
    from specc.predict import deploy_cost
    from specc.predict import sizing

    hw = cost.load_hardware_profile(hardware or sizing.default_hardware(plan))
    static = float(sum(p.graph_buffer_bytes or 0 for p in preds))
    return deploy_cost.deployment_report(plan, engine.split("==")[0], states, hw, inputs.bytes_per_param, inputs.c,
                                         static_buffers=static)


DEPLOY_COLUMNS = ("state", "graph mem", "TP verify", "TP draft pass", "TP step", "of floor", "prefix prefill/hit")


def _us(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x * 1e6:.0f} µs"


def deployment_text(rep, plan) -> List[str]:
    """The deployment section of the table output: memory accounting, a row per state (graph memory,
    TP all-reduce per verify forward, per draft pass and per step, prefix-cache prefill per hit) and
    the formulas with their sources."""
    if rep is None:
        return [f"deployment: not priced: no shape for target.path = {plan.target.path!r} (no readable config.json "
                f"or GGUF header, and not in specc/data/model_shapes.json)"]
    out = [f"deployment on {rep.hardware}, engine {rep.engine}, tp {rep.tp} (draft tp {rep.draft_tp}), per GPU:"]
    if rep.budget is not None:
        out += [f"  {line}" for line in rep.budget.lines]
    out.append(f"  CUDA-graph memory of the deployment: {_fmt_bytes(rep.pool)} ({rep.pool_how})")
    for note in rep.notes:
        out.append(f"  note: {note}")
    if rep.engine == "specc":
        out.append("  note: the specc runtime runs target and draft on one device (no tensor parallelism, so no "
                   "all-reduce); on a CPU it captures no CUDA graph and 'graph mem' is the verify program's "
                   "transient peak")
    rows = []
    for name, st in rep.states.items():
        comm = st.tp if (rep.tp > 1 or rep.draft_tp > 1) else None
        floor = None
        if comm is not None and comm.step_s and "% of the step" in comm.line:
            floor = comm.line.rsplit("= ", 1)[-1].split("%")[0] + "%"
        if comm is None and (rep.tp > 1 or rep.draft_tp > 1):
            tp_cols = ["n/a"] * 3  # no interconnect figure on the hardware profile
        elif comm is None:
            tp_cols = ["-"] * 3
        else:
            tp_cols = [_us(comm.verify_s), _us(comm.draft_pass_s), _us(comm.step_s)]
        rows.append([name, _fmt_bytes(st.graph.bytes), *tp_cols, floor or "-",
                     "-" if st.prefix is None else f"{st.prefix.extra_s * 1e3:.2f} ms"
                     + (f" (+{st.prefix.recompute_tokens} tok)" if st.prefix.recompute_tokens else "")])
    out.append("")
    out += format_table(rows, DEPLOY_COLUMNS).splitlines()
    out.append("")
    out.append("formulas:")
    out += [f"  {k}: {v}" for k, v in rep.formulas.items()]
    if rep.refusal:
        out.append(f"REFUSED: {rep.refusal}")
    return out


def deployment_json(rep) -> Optional[dict]:
    """The deployment report as JSON (None when not priced)."""
    if rep is None:
        return None
    b = rep.budget
    return {
        "hardware": rep.hardware, "engine": rep.engine, "tp": rep.tp, "draft_tp": rep.draft_tp,
        "graph_pool_bytes": rep.pool, "graph_pool": rep.pool_how, "notes": list(rep.notes), "formulas": rep.formulas,
        "budget": None if b is None else {"memory": b.memory, "weights": b.weights, "graphs": b.graphs,
                                          "activations": b.activations, "kv_budget": b.kv_budget,
                                          "kv_needed": b.kv_needed, "refusal": b.refusal, "shortfall": b.shortfall,
                                          "lines": list(b.lines)},
        "states": {name: {"graph_bytes": st.graph.bytes, "graph_terms": st.graph.terms, "graph_formula": st.graph.formula,
                          "tp_verify_s": st.tp.verify_s if st.tp else None,
                          "tp_draft_pass_s": st.tp.draft_pass_s if st.tp else None,
                          "tp_step_s": st.tp.step_s if st.tp else None, "tp_line": st.tp.line if st.tp else None,
                          "prefix_extra_s": st.prefix.extra_s if st.prefix else None,
                          "prefix_recompute_tokens": st.prefix.recompute_tokens if st.prefix else None,
                          "prefix_line": st.prefix.line if st.prefix else None}
                   for name, st in rep.states.items()},
    }


def run_side_by_side(args: argparse.Namespace, plans: List[str], overrides: List[str]) -> int:
    """Explain several plans and print them side by side: per plan its method, schedule and α (with
    its source), then per captured batch size the state the plan runs there with the best predicted
    ``speedup@B`` (its κ and that speedup; without a measured or given α, the α it needs)."""
    from specc.compiler.lower import route_slot

    ctxs, rc = [], 0
    for src in plans:
        r, ctx = analyze_one(args, src, overrides)
        rc = max(rc, r)
        if ctx is not None:
            ctxs.append(ctx)
    if not ctxs:
        return rc or 1
    if args.format == "json":
        print(json.dumps(_json_safe({"plans": [context_json(args, c) for c in ctxs]}), indent=2, ensure_ascii=False))
        return rc
    sizes = sorted({b for c in ctxs for b in c["res"]["lowering"].capture_sizes})

    def at(ctx, b: int) -> str:
        low = ctx["res"]["lowering"]
        if b not in low.capture_sizes:
            return "–"
        bucket = route_slot(sorted(low.buckets), b) if low.buckets else None
        ks = list(low.buckets[bucket]) if bucket is not None else None
        here = [p for p in ctx["preds"] if p.batch_size == b and (ks is None or p.num_steps in ks)]
        if not here:
            return "–"
        if ctx["assumed"]:
            pays = {p.state: ctx["pays"][p.state][1] for p in here if p.num_steps > 0}
            if not pays:
                return "κ=0"
            p = min((q for q in here if q.state in pays), key=lambda q: (pays[q.state], q.num_steps))
            need = pays[p.state]
            return f"κ={p.num_steps} never pays" if math.isinf(need) else f"κ={p.num_steps} needs α≥{need:.2f}"
        p = max(here, key=lambda q: (q.speedup_at_batch, -q.num_steps))
        return f"κ={p.num_steps} {p.speedup_at_batch:.2f}x"

    header = ["", *[c["plan"].name for c in ctxs]]
    rows = [["engine", *[c["engine"] for c in ctxs]],
            ["method", *[c["plan"].method.name for c in ctxs]],
            ["draft", *[Path(str(c["plan"].draft.path)).name if c["plan"].draft is not None and c["plan"].draft.path
                        else "–" for c in ctxs]],
            ["schedule", *[c["plan"].schedule.kind for c in ctxs]],
            ["α", *["none" if c["assumed"] else f"{c['alpha']:.3f}" for c in ctxs]],
            ["hardware", *[c["preds"][0].hardware for c in ctxs]]]
    rows += [[f"B={b}", *[at(c, b) for c in ctxs]] for b in sizes]
    print(f"{len(ctxs)} plans side by side; per batch size: the κ each plan runs there with the best predicted "
          f"speedup@B (over plain decoding at that batch)")
    print(format_table(rows, header))
    print()
    for c in ctxs:
        print(f"{c['plan'].name}: α from {c['alpha_source']}")
        if c["alpha_note"] and c["assumed"]:
            print(f"  note: {c['alpha_note']}")
    return rc


def _cost_table_origin(path) -> str:
    """One line on where the plan's cost table was measured: CPU, threads, the target dtype it chose and
    the quantized-weight kernels it ran (``specc profile`` records them); empty without a table or facts."""
    if not path:
        return ""
    from specc.models.resolve import resolve_model_path
    try:
        data = json.loads(Path(resolve_model_path(str(path))).read_text())
    except Exception:  # the table itself is checked (and refused with a reason) where it is loaded
        return ""
    cpu = data.get("cpu") or {}
    choice = data.get("choice") or {}
    parts = [f"measured on {data.get('device_name') or data.get('device', '?')}",
             f"{plural(data.get('threads', '?'), 'thread')}"]
    if choice.get("dtype"):
        parts.append(f"target dtype {choice['dtype']}/{choice.get('compile_backend', 'eager')}")
    if choice.get("qgemm_variant"):
        why = (data.get("qgemm") or {}).get("why")
        parts.append(f"quantized kernels {choice['qgemm_variant']} chosen" + (f" ({why})" if why else ""))
    elif cpu.get("quantized_kernels"):
        parts.append(str(cpu["quantized_kernels"]))
    return f"cost table {path}: " + ", ".join(parts)
