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
  each only when that engine's rules accept the plan and ``specc check`` accepts the command read back
  (:func:`launch_section`; else the refusal is written instead), under a header saying which target
  the commands are for (:func:`launch_header`). With a :class:`Deployment` (``--deploy-target`` …) the
  engine plans (``S.sglang.yaml``, ``S.vllm.yaml``) are for it (:func:`deploy_document`), and only its
  ``--deploy-engine`` engines are written;
* ``S.acceptance.json`` — the acceptance record of every measured drafter (:mod:`specc.predict.acceptance`);
* ``S.report.md``, ``S.json``, ``S.png`` — predicted against measured, and the plot.

Torch-free; the YAML is checked by loading it back (:func:`specc.plan.load.load_plan`) before it is
written.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
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
                  hardware: Optional[str] = None, acceptance: Optional[str] = None) -> Dict[str, Any]:
    """The plan as a YAML mapping: the candidate's source file (its ``defaults`` list and keys, the
    ``/schedule`` default dropped) with ``name``, ``engine``, κ (the largest bucket's; a block drafter's
    ``block_size`` with it), ``runtime.max_batch_size`` and the schedule (``kind`` with one candidate
    list per bucket, or ``static`` at the single κ when ``buckets`` has one entry and ``kind`` is
    static). A candidate moved to ``--target``'s model carries that target's keys (``target``),
    ``hardware`` (``--hardware``'s profile) becomes ``schedule.hardware`` and ``acceptance`` (the
    record) ``schedule.acceptance``."""
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
    t = candidate.plan.target
    if t.path != (src.get("target") or {}).get("path", t.path) or _moved(src, t.path):
        doc["target"] = {"path": t.path, "format": t.format, "vocab_size": t.vocab_size,
                         "max_model_len": t.max_model_len, "architecture": t.architecture}
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
    if hardware:
        schedule["hardware"] = hardware
    doc["schedule"] = schedule
    return doc


def _moved(src: Dict[str, Any], path: str) -> bool:
    """Whether a preset's ``/target`` default names another model than ``path`` (the candidate was
    moved to ``--target``'s)."""
    from specc.plan.load import conf_dir

    for d in src.get("defaults") or []:
        if isinstance(d, dict):
            for k, v in d.items():
                if str(k).lstrip("/") == "target":
                    f = conf_dir() / "target" / f"{v}.yaml"
                    data = yaml.safe_load(f.read_text()) if f.is_file() else None
                    return isinstance(data, dict) and data.get("path") != path
    return False


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


def export_text(path: Path, engine: str, adaptive_path: Optional[Path] = None,
                base_dir: Optional[Path] = None) -> Tuple[bool, str]:
    """``specc export PATH --engine ENGINE`` as text: ``(accepted, text)`` — the launch command (and the
    adaptive config written to ``adaptive_path``; the command names it relative to ``base_dir``, the
    launch file's folder, when given), or the engine's refusals as comment lines. Every rule message is
    kept as a comment above the command, which is the text's last line when accepted."""
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
        named = os.path.relpath(adaptive_path, base_dir) if base_dir is not None else str(adaptive_path)
        launch.adaptive_config_path = named
        # the exporter wrote its default name into the arguments: the command names the file written here
        flag = "--speculative-adaptive-config"
        if flag in launch.args[:-1]:
            launch.args[launch.args.index(flag) + 1] = named
        _atomic_write(adaptive_path, json.dumps(extra, indent=2) + "\n")
        lines.append(f"# adaptive config: {named}" + (" (a path from the launch file's folder)" if base_dir is not None else ""))
    lines.append(launch.command())
    return True, "\n".join(lines) + "\n"


#: ``specc tune --deploy-engine`` values: the engines whose settings tune writes, in the launch file's order.
DEPLOY_ENGINES = {"both": ("vllm", "sglang"), "sglang": ("sglang",), "vllm": ("vllm",)}
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True)
class Deployment:
    """The deployment tune's engine settings are written for (``specc tune --deploy-engine``,
    ``--deploy-target``, ``--deploy-draft``, ``--context-length``, ``--tp``, ``--draft-tp``;
    validated by :func:`specc.commands.tune.deployment`).

    ``engines``: the engines whose files and launch commands are written. ``target`` / ``draft``: the
    model the engine serves and its drafter, each an absolute local path or a Hugging Face id the engine
    downloads; None keeps the measuring model (and its drafter). ``context_length``: tokens per
    sequence, prompt and answer (``target.max_model_len``). ``tp`` / ``draft_tp``: tensor-parallel GPUs
    of the target and of the draft (``deploy.parallel.tp`` / ``draft_tp``)."""

    engines: Tuple[str, ...] = DEPLOY_ENGINES["both"]
    target: Optional[str] = None
    draft: Optional[str] = None
    context_length: Optional[int] = None
    tp: Optional[int] = None
    draft_tp: Optional[int] = None

    @property
    def given(self) -> bool:
        """A deployment key is set: the engine files are written for it, not for the measuring model."""
        return any(v is not None for v in (self.target, self.draft, self.context_length, self.tp, self.draft_tp))

    def describe(self) -> str:
        """The deployment in words, with the flag of each part."""
        parts = [f"serving {self.target} (--deploy-target)" if self.target else "serving the measuring model"]
        for value, what, flag in ((self.draft, "drafter", "--deploy-draft"),
                                  (self.context_length, "context", "--context-length"),
                                  (self.tp, "tensor parallel", "--tp"), (self.draft_tp, "draft tensor parallel", "--draft-tp")):
            if value is not None:
                parts.append(f"{what} {value} ({flag})")
        return " and ".join(ENGINE_LABELS[e] for e in self.engines) + " " + ", ".join(parts)


def deploy_document(doc: Dict[str, Any], dep: Deployment, method: str) -> Dict[str, Any]:
    """A copy of ``doc`` (an engine's plan document, :func:`plan_document`; ``method`` its
    ``method.name``) for the deployment ``dep``:

    * ``--deploy-target`` replaces the target (the ``/target`` default and the ``target`` keys):
      ``target.path``, ``target.format`` ``gguf`` for a ``.gguf`` file else ``hf``; architecture, vocabulary
      and dtype are left to the engine, which reads them from the checkpoint. The drafter (``/draft``
      default, ``draft`` keys) goes with it: ``--deploy-draft`` becomes ``draft.path`` for a method whose
      draft is a checkpoint (:attr:`specc.methods.facts.Method.needs_draft_checkpoint`, or MTP's
      ``target_ships_draft``: optional there, the engines then read the target's own layers); a lookup
      takes none. ``schedule.cost_table`` is dropped: it timed the measuring model on this machine;
    * ``--context-length`` is ``target.max_model_len`` (SGLang ``--context-length``, vLLM ``--max-model-len``);
    * ``--tp`` / ``--draft-tp`` are ``deploy.parallel.tp`` / ``deploy.parallel.draft_tp``;
    * ``runtime.device`` is ``cuda``: the launch commands carry no ``--device cpu``, so the engines run them
      on a GPU, and ``specc check --sglang-args / --vllm-args`` reads them so.
    """
    import copy

    from specc import methods

    out = copy.deepcopy(doc)
    if not dep.given:
        return out
    row = methods.get(method)
    if dep.target is not None:
        out["defaults"] = [d for d in (out.get("defaults") or [])
                           if not (isinstance(d, dict) and any(str(k).lstrip("/") in ("target", "draft") for k in d))]
        out["target"] = {"path": dep.target, "format": "gguf" if dep.target.lower().endswith(".gguf") else "hf"}
        out.pop("draft", None)
        if dep.draft is not None and (row.needs_draft_checkpoint or row.target_ships_draft):
            out["draft"] = {"path": dep.draft, "format": "hf"}
        schedule = dict(out.get("schedule") or {})
        schedule.pop("cost_table", None)
        out["schedule"] = schedule
    elif dep.draft is not None and out.get("draft") is not None:
        out["draft"] = dict(out["draft"], path=dep.draft)
    if dep.context_length is not None:
        out["target"] = dict(out.get("target") or {}, max_model_len=int(dep.context_length))
    if dep.tp is not None or dep.draft_tp is not None:
        deploy = dict(out.get("deploy") or {})
        parallel = dict(deploy.get("parallel") or {})
        if dep.tp is not None:
            parallel["tp"] = int(dep.tp)
        if dep.draft_tp is not None:
            parallel["draft_tp"] = int(dep.draft_tp)
        deploy["parallel"] = parallel
        out["deploy"] = deploy
    out["runtime"] = dict(out.get("runtime") or {}, device="cuda")
    return out


def recheck_command(engine: str, command: str, base_dir: Optional[Path] = None) -> Tuple[bool, List[str]]:
    """The launch command read back as ``specc check --<engine>-args`` reads it: the engine release's own
    parser (:mod:`specc.importer`), then its rules on the plan the command amounts to
    (:func:`specc.check.results.check_command`; files the command names, such as SGLang's adaptive
    config, are read relative to ``base_dir``). Returns ``(accepted, problems)``: accepted when nothing
    is an error (``specc check`` would exit 0); ``problems``: ``error: [rule] message`` per error (or why
    the command could not be read)."""
    from specc.check.results import check_command

    problems: List[str] = []
    for result in check_command(engine, [command], None, base_dir=base_dir):
        if result.error:
            problems.append(f"error: {result.error}")
        problems += [f"error: [{v.rule}] {v.message}" for v in result.violations if v.severity == "error"]
    return not problems, problems


def launch_section(path: Path, engine: str, adaptive_path: Optional[Path] = None,
                   base_dir: Optional[Path] = None) -> Tuple[bool, str, List[str]]:
    """One engine's part of the launch file: :func:`export_text` of the plan at ``path``, then its launch
    command checked by :func:`recheck_command` before it is written. Returns ``(accepted, text,
    problems)``: the command (last line) under its rule messages and a line saying `specc check` accepted
    it; or, when the plan's rules or the re-check refuse it, the refusal as comment lines (the refused
    command itself commented out, so `specc check --file` never reads it) and ``problems`` naming the
    errors of the re-check (empty when the plan's rules already refused: ``text`` names those)."""
    ok, text = export_text(path, engine, adaptive_path, base_dir)
    if not ok:
        return False, text, []
    lines = text.rstrip("\n").split("\n")
    command = lines.pop()
    accepted, problems = recheck_command(engine, command, base_dir)
    if accepted:
        lines += [f"#   checked: `specc check --{engine}-args` accepts this command", command]
        return True, "\n".join(lines) + "\n", []
    lines += [f"#   refused command: {command}"] + [f"#   {p}" for p in problems]
    lines.append(f"# `specc check --{engine}-args` refuses the command `specc export` wrote for {path.name} "
                 f"(errors above); no launch command")
    return False, "\n".join(lines) + "\n", problems


def launch_header(out_name: str, dep: Deployment, measured_name: str, measured_path: str,
                  launch_name: str, accepted: Sequence[str]) -> List[str]:
    """The launch file's comment header: what the commands are for. Without a deployment, the first line
    after the title says the target is the model tune measured on and which flags write the commands
    for a real deployment; with one, the deployment, and when ``--deploy-target`` is another model than
    the measured one, that κ and α were measured on the measuring model and do not carry to it. Then
    the ``specc check`` command that re-checks each command in ``accepted`` (engine names)."""
    lines = [f"# Launch settings of {out_name} (`specc export`), written by specc tune"]
    if not dep.given:
        lines.append(f"# Target: {measured_path}, the model tune measured on ({measured_name}), not a deployment: pass "
                     f"--deploy-target MODEL (a path or a Hugging Face id), --deploy-draft DRAFTER (for a method "
                     f"that drafts with a checkpoint), --context-length N, --tp N and --deploy-engine "
                     f"sglang|vllm|both to write these commands for your deployment")
    else:
        lines.append(f"# Deployment: {dep.describe()}")
        if dep.target is not None and dep.target not in (measured_name, measured_path):
            lines.append(f"# Not measured on {dep.target}: tune measured {measured_name} ({measured_path}) with its own "
                         f"drafters on this machine, so κ per batch size and α (schedule.alpha) come from those runs "
                         f"and do not carry to {dep.target} (acceptance depends on the model, its text and its "
                         f"drafter; step costs on the model and the GPU): measure them on {dep.target} before trusting "
                         f"them. A drafter must be {dep.target}'s own (--deploy-draft), trained for it")
    for engine in accepted:
        lines.append(f"# {ENGINE_LABELS[engine]} command checked by `specc check` before it was written; re-check "
                     f"it in this folder: specc check --{engine}-args --file {launch_name}")
    return lines + [""]


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
