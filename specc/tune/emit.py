"""Write what ``specc tune`` decided: the plan, its engine settings, its acceptance record, the report.

Files, next to ``--out PLAN.yaml`` (stem S):

* ``S.yaml`` — the plan: the chosen drafter's preset (its ``defaults`` and keys) with a
  ``batch_buckets`` (or ``adaptive``) schedule whose κ per bucket came from the predictions over the
  measured acceptance, ``schedule.acceptance`` the record below (its entry for the drafter: the
  per-position rates), ``schedule.cost_table`` the table below (both relative to the plan's folder);
* ``S.cost_table.json`` — the cost table the predictions used, with a ``tune`` block holding the rest of
  what the predictor read (:func:`specc.tune.predict.record_block`: stage costs, λ, the spot-timed
  verify, the confirming runs' measurements), so ``explain``, ``bench`` and ``serve`` predict the plan
  as tune did (:func:`specc.tune.predict.plan_predictor`);
* ``S.sglang.yaml`` — the same drafter for SGLang, whose rules refuse ``batch_buckets``: its adaptive
  controller with those buckets' κ as candidates, or a static κ where SGLang runs no adaptive
  schedule for the method;
* ``S.launch.sh`` — ``specc export`` of both (SGLang's adaptive config in ``S.sglang_adaptive.json``),
  each only when that engine's rules accept the plan (else the refusal is written instead);
* ``S.acceptance.json`` — the acceptance record of every measured drafter (:mod:`specc.predict.acceptance`);
* ``S.report.md``, ``S.json``, ``S.png`` — predicted against measured, and the plot.

Torch-free; the YAML is checked by loading it back (:func:`specc.plan.load.load_plan`) before it is
written.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from specc.errors import SpeccError


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise SpeccError(f"--out {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def plan_document(candidate, buckets: Dict[int, List[int]], *, kind: str, engine: str, name: str,
                  alpha: Optional[float], cost_table: Optional[str], capture: Sequence[int],
                  acceptance: Optional[str] = None) -> Dict[str, Any]:
    """The plan as a YAML mapping: the candidate's source file (its ``defaults`` list and keys, the
    ``/schedule`` default dropped) with ``name``, ``engine``, κ (the largest bucket's; a block drafter's
    ``block_size`` with it), ``runtime.max_batch_size`` and the schedule (``kind`` with one candidate
    list per bucket, or ``static`` at the single κ when ``buckets`` has one entry and ``kind`` is
    static); ``acceptance``: the record for ``schedule.acceptance``."""
    src = yaml.safe_load(Path(candidate.source).read_text()) or {}
    doc: Dict[str, Any] = {}
    defaults = [d for d in (src.get("defaults") or [])
                if not (isinstance(d, dict) and any(str(k).lstrip("/") == "schedule" for k in d))]
    if defaults:
        doc["defaults"] = defaults
    doc["name"] = name
    doc["engine"] = engine
    for key, value in src.items():
        if key not in ("defaults", "name", "engine", "schedule"):
            doc[key] = value
    method = dict(doc.get("method") or {})
    top = max(1, max(k for ks in buckets.values() for k in ks))
    if candidate.shape != "tree":
        method["num_steps"] = top
        if candidate.plan.method.block_size is not None:
            method["block_size"] = top
        method.pop("num_draft_tokens", None)
    doc["method"] = method
    runtime = dict(doc.get("runtime") or {})
    runtime["max_batch_size"] = int(max(capture))
    doc["runtime"] = runtime
    schedule: Dict[str, Any] = {"kind": kind}
    if kind != "static":
        schedule["buckets"] = {int(b): {"candidates": [int(k) for k in ks]} for b, ks in sorted(buckets.items())}
    schedule["capture_batch_sizes"] = [int(c) for c in capture]
    if acceptance:
        schedule["acceptance"] = acceptance
    elif alpha is not None:
        schedule["alpha"] = round(float(alpha), 4)
    if cost_table:
        schedule["cost_table"] = cost_table
    doc["schedule"] = schedule
    return doc


def write_cost_record(path: Path, table_path: str, block: Dict[str, Any]) -> None:
    """Write the cost table at ``table_path`` (a ``specc profile`` JSON, ``pkg://`` resolved) with
    ``block`` under its ``tune`` key (:data:`specc.tune.predict.RECORD_KEY`) to ``path``. Raises
    SpeccError when the table does not read."""
    from specc.io import COST_TABLE_LIMIT, load_json, read_bounded
    from specc.tune.predict import RECORD_KEY

    src = str(table_path)
    if src.startswith("pkg://"):
        from specc.models.resolve import resolve_model_path

        src = str(resolve_model_path(src))
    data = load_json(str(read_bounded(Path(src), COST_TABLE_LIMIT, "cost table")), src)
    if not isinstance(data, dict):
        raise SpeccError(f"{src}: a cost table is a JSON object; run `specc profile` again")
    data[RECORD_KEY] = block
    data["tuned_from"] = str(table_path)
    _atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def dump_plan(doc: Dict[str, Any], header: Sequence[str]) -> str:
    """YAML text of a plan document with ``header`` comment lines."""
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, allow_unicode=True, width=110)
    return "".join(f"# {h}\n" if h else "#\n" for h in header) + body


def check_loads(path: Path, engine: str) -> Tuple[Any, List[Any]]:
    """Load a written plan back and check it against ``engine``'s rules: ``(plan, errors)`` (errors
    other than the checkpoint rules, which depend on the machine that launches). Raises PlanError
    when it does not load."""
    from specc.plan.load import load_plan

    plan = load_plan(str(path)).plan
    return plan, verdict(plan, engine)[0]


def verdict(plan_or_doc: Any, engine: str, where: Optional[Path] = None) -> Tuple[List[Any], List[Any]]:
    """``engine``'s rules on a loaded plan or a plan document (a mapping, loaded through a temporary
    file in ``where``, removed whatever happens): ``(errors, schedule fallbacks)`` — errors other than
    the checkpoint rules (they depend on the machine that launches), and fallbacks that replace
    ``schedule.kind``. Raises PlanError when a document does not load."""
    import tempfile

    from specc.plan.load import load_plan
    from specc.check import check

    plan = plan_or_doc
    if isinstance(plan_or_doc, dict):
        text = dump_plan(plan_or_doc, [])
        fd, name = tempfile.mkstemp(suffix=".yaml", dir=str(where) if where else None)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            plan = load_plan(name).plan
        finally:
            Path(name).unlink(missing_ok=True)
    violations = check(plan, engine)
    errors = [v for v in violations if v.severity == "error" and not v.rule.startswith("checkpoint.")]
    falls = [v for v in violations if v.severity == "fallback" and "schedule.kind" in v.keys]
    return errors, falls


def export_text(path: Path, engine: str, adaptive_path: Optional[Path] = None) -> Tuple[bool, str]:
    """``specc export PATH --engine ENGINE`` as text: ``(accepted, text)`` — the launch command (and the
    adaptive config written to ``adaptive_path``), or the engine's refusals as comment lines. Every
    rule message is kept as a comment above the command."""
    from specc.export import export, resolve_pkg_paths
    from specc.plan.load import load_plan
    from specc.check import check

    plan = load_plan(str(path)).plan
    lines = [f"# {engine}: specc export {path.name} --engine {engine}"]
    violations = check(plan, engine)
    for v in violations:
        sev = "warning" if v.rule.startswith("checkpoint.") and v.severity == "error" else v.severity
        lines.append(f"#   {sev}: [{v.rule}] {v.message}")
    if any(v.severity == "error" and not v.rule.startswith("checkpoint.") for v in violations):
        lines.append(f"# {engine} refuses this plan (errors above); no launch command")
        return False, "\n".join(lines) + "\n"
    resolved, warnings = resolve_pkg_paths(plan)
    lines += [f"#   warning: {w}" for w in warnings]
    launch = export(resolved, engine)
    extra = getattr(launch, "adaptive_config", None)
    if extra and adaptive_path is not None:
        launch.adaptive_config_path = str(adaptive_path)
        _atomic_write(adaptive_path, json.dumps(extra, indent=2) + "\n")
        lines.append(f"# adaptive config: {adaptive_path}")
    lines.append(launch.command())
    return True, "\n".join(lines) + "\n"


def report_markdown(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]) -> str:
    """A Markdown report: title, a table, notes."""
    out = [f"# {title}", ""]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join("---" for _ in header) + "|")
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    out.append("")
    out += [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def plot(path: Path, concurrency: Sequence[int], predicted: Dict[str, Dict[int, float]],
         measured: Dict[str, Dict[int, float]], title: str, highlight: str = "") -> Dict[str, Any]:
    """Throughput against concurrency: per series its predicted line (dashed) and measured points
    (solid, markers); ``highlight`` drawn thicker (the chosen plan). The plotted numbers,
    ``{"predicted": {series: {C: tok/s}}, "measured": {...}}`` (C as a string), go into the PNG's text
    under ``specc:series`` (as ``specc explain --plot`` does) and are returned, for ``S.json``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {kind: {name: {str(c): float(v[c]) for c in concurrency if c in v} for name, v in lines.items() if v}
              for kind, lines in (("predicted", predicted), ("measured", measured))}
    fig, ax = plt.subplots(figsize=(9, 5.2))
    names = list(dict.fromkeys(list(predicted) + list(measured)))
    for i, name in enumerate(names):
        color = f"C{i % 10}"
        lw = 2.6 if name == highlight else 1.2
        p = predicted.get(name, {})
        if p:
            cs = [c for c in concurrency if c in p]
            ax.plot(cs, [p[c] for c in cs], "--", color=color, lw=lw, alpha=0.8)
        m = measured.get(name, {})
        if m:
            cs = [c for c in concurrency if c in m]
            ax.plot(cs, [m[c] for c in cs], "-o", color=color, lw=lw, label=name)
        elif p:
            ax.plot([], [], "--", color=color, label=f"{name} (predicted only)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(concurrency))
    ax.set_xticklabels([str(c) for c in concurrency])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("decode tokens/s (dashed: predicted, solid: measured)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, metadata={"specc:series": json.dumps(series)})
    except OSError as exc:
        raise SpeccError(f"--out: cannot write the plot {path} ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
    return series
