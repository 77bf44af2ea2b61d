"""Codegen: render a checked plan's candidate states into an artifact directory, atomically.

``plan ──build──▶ ExecutionPlan ──codegen──▶ generated/<plan>-<hash>/``. The artifact holds

- ``manifest.json`` — the execution plan (:class:`specc.ir.ExecutionPlan`, built once by
  :func:`specc.compiler.build.lower_to_ir`): plan name, the runtime section (checkpoints and their formats,
  method, verify rule, dtype, compile backend, max κ, schedule), each candidate state once (its
  parameters, programs, specialization constants, the kernel of each role, its static tree by key),
  the static trees compiled once (:func:`specc.compiler.trees.compile_tree`) and the kernels; plus the
  format and specc versions, the plan and template digests, and the sha256 of every other file;
- ``predictions.json`` — the cost model's prediction per state (read by people and reports, not
  by the runtime; not part of the name);
- ``plan.yaml`` — the resolved plan in canonical form (the bytes the plan hash is taken of; for
  people and for the hash: the runtime never parses it);
- ``kernels/<variant>.py`` — the verify-kernel variants the states use, from
  ``templates/kernels/<family>.py.j2``: each bakes in its constants (verify width, one-hot or full
  q), checks shapes against them, and calls the kernel body in ``specc.kernels`` (Triton kernel and
  torch reference of one signature): generated code exists only where constants specialise it;
- ``report.md`` — a human-readable summary; ``graph.json`` — every state's stage graph, only when
  asked for (``specc compile --emit-graph``; nothing at run time reads it).

What a state runs is written down: its programs (:func:`specc.compiler.programs.state_programs`, the one
table the runtime also builds its states with) are part of the execution plan.

Design follows FlashInfer's JIT: templates hold only the
specialization, every generated name is built from all specializing parameters
(``get_single_decode_uri``, ``flashinfer/jit/attention/modules.py:47-66``), and one table
(:data:`KERNEL_ROLES`) says which variant a state needs. Values from the plan only reach generated
code through the ``pyliteral`` filter (``repr`` of validated plain data) and names only through the
``identifier`` filter, so no plan string is ever spliced into Python source.

Determinism: the same plan, specc version and templates give byte-identical files (sorted keys, no
timestamps; computed floats — predictions, graphs — rounded to :data:`FLOAT_DIGITS` significant
digits, plan values kept exactly). The directory name's hash (:func:`specc.ir.artifact_hash`) covers
the format and specc versions, the execution plan and the bytes of every generated program, so an
edit of any of them — the manifest included — no longer matches the name; predictions, the report
and the graph describe the artifact and are not covered. Codegen never runs a model and never imports
torch.
"""
from __future__ import annotations

import hashlib
import json
import keyword
import math
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jinja2

import specc
from specc.compiler import programs
from specc.compiler import trees
from specc.errors import ArtifactError, PlanError
from specc.plan.schema import MAX_NAME_LEN, Plan, plan_to_dict

FORMAT_VERSION = 4
"""Version of the artifact layout; bump when manifest keys or the directory layout change. 4: the
manifest is the execution plan (:mod:`specc.ir`), predictions live in ``predictions.json`` and the
name hashes the execution plan and the generated programs only."""

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
"""The shipped templates (repository top level, next to the ``specc`` package)."""

DEFAULT_OUT_DIR = Path("generated")
MANIFEST = "manifest.json"
PLAN_FILE = "plan.yaml"
GRAPH_FILE = "graph.json"
REPORT_FILE = "report.md"
PREDICTIONS_FILE = "predictions.json"
REPORT_TEMPLATE = "report.md.j2"
HASH_CHARS = 12
"""Hex characters of the tree keys (``tree_key``); the artifact name keeps as many (``specc.ir.NAME_HASH_CHARS``)."""
FLOAT_DIGITS = 6
"""Significant digits kept of every float written to the manifest, graph and report, so that the
last-bit differences of another libm cannot change an artifact's bytes."""

REPORT_PREDICTION_KEYS = ("alpha", "c", "expected_tokens", "step_cost", "speedup", "speedup_at_batch",
                          "break_even_batch", "s_infinity", "graphs_to_capture", "graph_buffer_bytes")
"""The cost-model fields ``report.md`` tabulates (``manifest.json`` keeps every field)."""

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --------------------------------------------------------------------------------------------------
# Literal and name validation (the only two ways data reaches generated code)


def check_identifier(name: Any, what: str = "name") -> str:
    """Return ``name`` if it is an ASCII Python identifier that is not a keyword, of at most
    :data:`specc.plan.schema.MAX_NAME_LEN` characters.

    Used for everything that becomes a Python name, a file name or a directory name.

    Raises:
        PlanError: naming ``what`` and the offending value (shown with ``repr``, so quotes or
            newlines are visible), with the fix.
    """
    if isinstance(name, str) and len(name) > MAX_NAME_LEN:
        raise PlanError(f"{what} of {len(name):,} characters is longer than the {MAX_NAME_LEN} a name may have "
                        f"(it becomes a directory name); shorten it")
    if not isinstance(name, str) or not _IDENT_RE.match(name) or keyword.iskeyword(name):
        raise PlanError(
            f"{what} {name!r} is not a valid identifier: use letters, digits and underscores only, "
            f"starting with a letter or underscore (it becomes a Python name and a file name)"
        )
    return name


def plain_data(value: Any, where: str = "value", digits: Optional[int] = None) -> Any:
    """Validate and normalize ``value`` to plain data: ``None``/``bool``/``int``/finite ``float``/
    ``str``, and lists/tuples/dicts of those (dict keys must be ``str`` or ``int``). Tuples stay
    tuples. With ``digits``, floats are rounded to that many significant digits (used for computed
    numbers — predictions, graphs — never for plan values, which are kept exactly).

    Raises:
        ArtifactError: for any other type, a non-finite float, or a bad dict key, naming ``where``.
            (This is a codegen bug or a corrupted state, not user input: plans are typed.)
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArtifactError(f"{where}: non-finite float {value!r} cannot be written as a literal")
        return float(f"{value:.{digits}g}") if digits else float(value)
    if isinstance(value, tuple):
        return tuple(plain_data(v, f"{where}[{i}]", digits) for i, v in enumerate(value))
    if isinstance(value, list):
        return [plain_data(v, f"{where}[{i}]", digits) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k in value:
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise ArtifactError(f"{where}: dict key {k!r} is not a str or int")
            out[k] = plain_data(value[k], f"{where}[{k!r}]", digits)
        return out
    raise ArtifactError(f"{where}: {type(value).__name__} is not plain data and cannot be a literal")


def pyliteral(value: Any) -> str:
    """The Jinja2 ``pyliteral`` filter: a Python literal that evaluates back to ``value``.

    Strings are emitted with ``repr`` (quotes, backslashes and newlines escaped), dicts with sorted
    keys, floats with ``repr`` (shortest exact form). ``ast.literal_eval(pyliteral(v)) == v`` for
    all accepted values.

    Raises:
        ArtifactError: for values that are not plain data (see :func:`plain_data`).
    """
    return _literal(plain_data(value, "pyliteral"))


def _literal(v: Any) -> str:
    if isinstance(v, tuple):
        inner = ", ".join(_literal(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, list):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: (isinstance(k, str), k))
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v[k])}" for k in keys) + "}"
    return repr(v)


def make_environment(templates_dir: Path = TEMPLATES_DIR) -> jinja2.Environment:
    """The one Jinja2 environment of codegen: ``StrictUndefined`` (a missing variable is an error),
    no autoescape (the outputs are Python and Markdown, never HTML), filters ``pyliteral`` and
    ``identifier``; trailing newlines kept so output bytes match the template exactly."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["pyliteral"] = pyliteral
    env.filters["identifier"] = lambda s: check_identifier(s, "template name")
    env.filters["json"] = lambda v: json.dumps(plain_data(v, "json"), sort_keys=True)
    return env


# --------------------------------------------------------------------------------------------------
# Hashing


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_plan_yaml(plan: Plan) -> str:
    """The resolved plan as canonical YAML (``specc.plan.dump.dump_resolved``: schema key order,
    bucket keys sorted, block style). Its sha256 is the plan hash (the runtime reads the manifest,
    never these bytes)."""
    from specc.plan.dump import dump_resolved

    return dump_resolved(plan)


def template_hash(templates_dir: Path = TEMPLATES_DIR) -> str:
    """sha256 over every ``*.j2`` template under ``templates_dir`` (relative path and bytes, in
    sorted order). Any template edit changes it, and so the artifact name."""
    h = hashlib.sha256()
    for p in sorted(templates_dir.rglob("*.j2")):
        rel = p.relative_to(templates_dir).as_posix().encode()
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "little") + rel + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def tree_key(tree_choices: Optional[Sequence[Sequence[int]]]) -> Optional[str]:
    """The manifest key of a static tree: ``t<12 hex of its canonical paths>`` (states sharing a
    tree share one compiled entry), None for no static tree."""
    if tree_choices is None:
        return None
    canon = json.dumps([list(p) for p in trees.normalize_choices(tree_choices)], separators=(",", ":"))
    return "t" + sha256_hex(canon.encode())[:HASH_CHARS]


# --------------------------------------------------------------------------------------------------
# Kernel variants: one table says which specialized kernels a state needs.


@dataclass(frozen=True)
class KernelVariant:
    """One specialized kernel module ``kernels/<name>.py``, rendered from
    ``templates/kernels/<family>.py.j2`` with ``constants`` baked in as module constants.

    The name is built from every constant (FlashInfer's URI rule, flashinfer-ai/flashinfer flashinfer/jit), so two states that
    need the same specialization share one module and two different ones never collide."""

    family: str
    constants: Tuple[Tuple[str, Any], ...]

    @property
    def name(self) -> str:
        parts = [self.family]
        for key, value in self.constants:
            if key == "NUM_DRAFT_TOKENS":
                parts.append(f"w{value}")
            elif key == "DRAFT_PROBS":
                parts.append("qprobs" if value else "qonehot")
            elif key == "VOCAB_SIZE":
                parts.append(f"v{value}")
            else:
                parts.append(f"{key.lower()}{value}")
        return check_identifier("_".join(parts), "kernel variant name")

    @property
    def module(self) -> str:
        return f"kernels/{self.name}.py"

    def as_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "family": self.family, "module": self.module,
                "constants": dict(self.constants)}


def _is_tree(state: Any) -> bool:
    from specc import methods

    return methods.state_kind(int(state.num_steps), int(state.topk), bool(state.parallel),
                              state.tree_choices) == "tree"


def _greedy_variant(state: Any) -> KernelVariant:
    """The greedy kernel at the state's width: ``tree_greedy_verify`` over a tree's
    ``num_draft_tokens`` nodes, else ``greedy_verify`` over ``[B, num_draft_tokens - 1]`` drafts."""
    width = int(state.num_draft_tokens)
    return KernelVariant("tree_greedy_verify" if _is_tree(state) else "greedy_verify", (("NUM_DRAFT_TOKENS", width),))


def _sampled_variant(state: Any, family: str) -> KernelVariant:
    """A probabilistic rule's kernel (``rejection_verify``, ``block_verify``, ``tree_rejection_verify``)
    at the state's width, with full q when the state drafts probabilistically (and drafts at all: a
    κ = 0 state has no q), else one-hot q (the step buffers hold q on the same condition,
    ``specc.runtime.state.StepInputs``)."""
    probabilistic = state.draft_sampling == "probabilistic" and int(state.num_steps) > 0
    return KernelVariant(family, (("NUM_DRAFT_TOKENS", int(state.num_draft_tokens)), ("DRAFT_PROBS", probabilistic)))


def _verify_variant(state: Any) -> KernelVariant:
    """The verify kernel of a state's own rule: for a chain or parallel block ``greedy_verify``
    (verify.rule=greedy), ``rejection_verify`` (verify.rule=standard, one-hot or full q by
    ``draft_sampling``) or ``block_verify`` (verify.rule=block, the same two specializations), taking
    ``[B, num_draft_tokens - 1]`` drafts and ``[B, num_draft_tokens, V]`` target scores
    (``specc.kernels.verify``); for a tree ``tree_greedy_verify`` or ``tree_rejection_verify``
    (``specc.kernels.tree``) over ``num_draft_tokens`` nodes.

    Raises: PlanError for a rule with no kernel of the state's shape."""
    width = int(state.num_draft_tokens)
    if _is_tree(state):
        if state.verify_rule == "greedy":
            return _greedy_variant(state)
        if state.verify_rule == "standard":
            return _sampled_variant(state, "tree_rejection_verify")
        raise PlanError(f"state {state.name}: verify.rule {state.verify_rule!r} has no tree kernel in specc's "
                        f"runtime; use verify.rule=greedy or verify.rule=standard")
    if width != int(state.num_steps) + 1:
        raise PlanError(f"state {state.name}: a chain verifies num_draft_tokens = num_steps + 1 = "
                        f"{int(state.num_steps) + 1} tokens, not {width}")
    if state.verify_rule == "greedy" or (state.verify_rule == "synthetic" and int(state.num_steps) == 0):
        return _greedy_variant(state)
    if state.verify_rule == "standard":
        return _sampled_variant(state, "rejection_verify")
    if state.verify_rule == "block":
        return _sampled_variant(state, "block_verify")
    raise PlanError(f"state {state.name}: verify.rule {state.verify_rule!r} has no kernel in specc's "
                    f"runtime; use verify.rule=greedy, standard or block")


def _sampled_rows_variant(state: Any) -> Optional[KernelVariant]:
    """The kernel a greedy-rule state runs for a step with a sampled row (the exact rejection rule per
    request, as vLLM and SGLang choose it: ``specc.runtime.stages.accept_greedy``):
    ``rejection_verify`` / ``tree_rejection_verify`` at the state's width. None for other rules."""
    if state.verify_rule != "greedy":
        return None
    return _sampled_variant(state, "tree_rejection_verify" if _is_tree(state) else "rejection_verify")


def _greedy_rows_variant(state: Any) -> Optional[KernelVariant]:
    """The kernel a standard- or block-rule state runs for a step whose rows are all greedy (the
    standard rule at temperature 0 is the greedy rule: ``specc.runtime.stages.accept_standard``): the
    greedy kernel at the state's width. None for other rules."""
    if state.verify_rule not in ("standard", "block"):
        return None
    return _greedy_variant(state)


KERNEL_ROLES: Dict[str, Callable[[Any], Optional[KernelVariant]]] = {
    "verify": _verify_variant,
    "verify_sampled_rows": _sampled_rows_variant,
    "verify_greedy_rows": _greedy_rows_variant,
}
"""The one table of kernel specializations: role → function(state) -> the variant that role needs
(None: the role does not apply to the state)."""


def kernel_variants_for(state: Any, vocab_size: Optional[int] = None) -> Dict[str, KernelVariant]:
    """Role → kernel variant for every role ``state`` needs (roles in sorted order), each specialized
    to ``vocab_size`` (the target's vocabulary, ``VOCAB_SIZE``) when it is known. The synthetic rule
    accepts by its curve in the accept program itself and needs no verify kernel.

    Raises:
        PlanError: if the state needs a kernel specc does not have (an unsupported verify rule).
    """
    if state.verify_rule == "synthetic" and int(state.num_steps) > 0:
        return {}
    out = {}
    for role in sorted(KERNEL_ROLES):
        v = KERNEL_ROLES[role](state)
        if v is None:
            continue
        if vocab_size:
            v = KernelVariant(v.family, tuple(v.constants) + (("VOCAB_SIZE", int(vocab_size)),))
        out[role] = v
    return out


# --------------------------------------------------------------------------------------------------
# Tree buffers (compile once; Medusa's generate_medusa_buffers, FasterDecoding/Medusa medusa/model/utils.py:32-125)


def tree_buffers(tree_choices: Optional[Sequence[Sequence[int]]]) -> Optional[Dict[str, Any]]:
    """Static buffers of a draft tree, as plain lists (no torch at compile time): see
    :func:`specc.compiler.trees.compile_tree` (nodes, parents, depths, ranks, the tree-only attention mask,
    retrieve indices, the nodes a drafter expands per depth). None for a chain.

    Raises:
        PlanError: if a path is empty, has a negative entry, repeats, or its parent path is missing.
    """
    return trees.compile_tree(tree_choices)


# --------------------------------------------------------------------------------------------------
# Collecting what the templates need from lower / graph / cost


def state_parameters(state: Any) -> Dict[str, Any]:
    """A ``CandidateState`` as plain data (its public fields, ``tree_choices`` as a tuple of tuples)."""
    from dataclasses import asdict, is_dataclass

    if not is_dataclass(state):
        raise ArtifactError(f"lower() returned {type(state).__name__}, not a CandidateState dataclass")
    params = asdict(state)
    if params.get("tree_choices") is not None:
        params["tree_choices"] = tuple(tuple(p) for p in params["tree_choices"])
    return plain_data(params, f"state {getattr(state, 'name', '?')}")


def prediction_data(prediction: Any) -> Dict[str, Any]:
    """The cost model's prediction (``specc.predict.cost.Prediction``, a dataclass, or a mapping) as plain
    data. Non-finite floats become ``None`` (e.g. an undefined break-even batch), so the manifest
    stays valid JSON.

    Raises:
        ArtifactError: for any other type."""
    from dataclasses import asdict, is_dataclass

    if is_dataclass(prediction) and not isinstance(prediction, type):
        data = asdict(prediction)
    elif isinstance(prediction, Mapping):
        data = dict(prediction)
    else:
        raise ArtifactError(f"cannot record a cost prediction of type {type(prediction).__name__}")
    return plain_data(_finite_or_none(data), "prediction", FLOAT_DIGITS)


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {k: _finite_or_none(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_finite_or_none(x) for x in v)
    return v


def runtime_section(plan: Plan, schedule: Dict[str, Any], max_steps: int) -> Dict[str, Any]:
    """The manifest's ``runtime`` section: everything the runtime reads (it never reads ``plan.yaml``):
    target and draft checkpoints, the method's drafter options (``method.plugin`` for a custom
    drafter, ``method.suffix`` for suffix decoding), the verify rule (with the synthetic rule's
    conditional rates), device settings, the serving settings (``deploy``: LoRA adapters, the
    disaggregation role; only when the plan sets them), and the schedule
    (:class:`specc.compiler.lower.ScheduleSpec` plus the profiled cost table of ``schedule.cost_table``,
    embedded, and the budget's confidence source from the method table).

    Raises:
        PlanError: an unreadable cost table (``specc.predict.cost.load_cost_table``).
    """
    from specc import methods
    from specc.predict import cost
    from specc.compiler import programs

    m, v = plan.method, plan.verify
    rates = None
    if v.rule == "synthetic" and max_steps > 0:
        rates = list(programs.synthetic_conditional_rates(v.synthetic.acceptance_rates,
                                                          v.synthetic.acceptance_length, max_steps))
    table = None
    if plan.schedule.cost_table:
        t = cost.load_cost_table(plan.schedule.cost_table)
        # a draft pass timed for another method's drafter is left out: the runtime then charges the
        # draft time it measures itself
        draft_ms = {str(x): y for x, y in zip(t.draft_x, t.draft_ms)} if t.draft_applies(m.name) else {}
        table = {"device": t.device, "capture_limit": t.capture_limit,
                 "verify_ms": {str(x): y for x, y in zip(t.verify_x, t.verify_ms)}, "draft_ms": draft_ms}
        if t.choice is not None:  # the device profile's fastest dtype / backend (runtime.dtype: auto)
            table["choice"] = dict(t.choice)
    info = methods.get(m.name)
    draft = None if plan.draft is None else {"path": plan.draft.path, "format": plan.draft.format,
                                             "max_model_len": plan.draft.max_model_len}
    section = {
        "target": {"path": plan.target.path, "format": plan.target.format, "dtype": plan.target.dtype,
                   "max_model_len": plan.target.max_model_len},
        "draft": draft,
        "method": {"name": m.name, "num_steps": m.num_steps, "parallel_drafting": bool(m.parallel_drafting),
                   "ngram": {"min": m.ngram.min, "max": m.ngram.max}},
        "verify": {"rule": v.rule, "draft_sampling": v.draft_sampling, "synthetic_rates": rates},
        "device": plan.runtime.device, "dtype": plan.runtime.dtype,
        "kernel_backend": plan.runtime.kernel_backend, "compile_backend": plan.runtime.compile_backend,
        "cuda_graphs": plan.deploy.cuda_graphs,
        "schedule": dict(schedule, cost_table=table,
                         confidence=info.runtime.confidence if info.runtime is not None else ""),
    }
    if m.plugin:
        section["method"]["plugin"] = m.plugin
    if "suffix" in methods.get(m.name).option_sections:  # suffix decoding's settings and corpora (read at load; absent for other methods)
        sx = m.suffix
        section["method"]["suffix"] = {"max_tree_depth": sx.max_tree_depth, "max_cached_requests": sx.max_cached_requests,
                                       "max_spec_factor": sx.max_spec_factor, "min_token_prob": sx.min_token_prob,
                                       "corpora": list(sx.corpora or []), "max_corpus_tokens": sx.max_corpus_tokens}
    deploy = {}
    if plan.deploy.lora.adapters:  # name=path entries; paths as the plan gives them (pkg:// allowed)
        deploy["lora"] = {"adapters": list(plan.deploy.lora.adapters),
                          "max_loras_per_batch": plan.deploy.lora.max_loras_per_batch}
    if plan.deploy.disagg.role != "none":
        deploy["disagg"] = {"role": plan.deploy.disagg.role}
    if deploy:  # serving settings (specc serve); absent for plans without them, so their hashes stay
        section["deploy"] = deploy
    return plain_data(_finite_or_none(section), "runtime section", FLOAT_DIGITS)


# --------------------------------------------------------------------------------------------------
# Rendering


def render(lowered: "Lowered", env: Optional[jinja2.Environment] = None,
           templates_dir: Optional[Path] = None,
           on_file: Optional[Callable[[str], None]] = None, emit_graph: bool = False) -> Tuple[str, Dict[str, bytes]]:
    """Render the artifact of a lowered plan (:func:`specc.compiler.build.lower_to_ir`) in memory.

    The manifest is the execution plan (:meth:`specc.ir.ExecutionPlan.to_dict`) plus the format and
    specc versions, the plan and template digests, the name and the sha256 of every file; the name
    ``<plan>-<hash>`` hashes the execution plan and the generated programs only
    (:func:`specc.ir.artifact_hash`). The cost predictions go to ``predictions.json`` (listed and
    checked, not part of the name), the human summary to ``report.md``.

    Returns ``(dir_name, files)``: ``files`` maps each artifact-relative POSIX path (``manifest.json``
    included) to its bytes. ``on_file(path)`` is called before each file is rendered (tests use it
    to make rendering fail midway). ``emit_graph``: also write ``graph.json``.

    Raises:
        PlanError: bad names. ArtifactError: a missing template, or a template error (with its name).
    """
    from specc import ir as ir_mod

    templates_dir = Path(templates_dir or TEMPLATES_DIR)
    env = env or make_environment(templates_dir)
    plan, eplan = lowered.plan, lowered.ir
    plan_name = check_identifier(eplan.plan_name, "plan name (the plan's `name` key)")
    plan_yaml = canonical_plan_yaml(plan)
    plan_hash = "sha256:" + sha256_hex(plan_yaml.encode())
    digest = template_hash(templates_dir)
    plan_data = plain_data(plan_to_dict(plan), "plan")
    ir_data = plain_data(eplan.to_dict(), "execution plan")

    files: Dict[str, bytes] = {}

    def emit(path: str, text: str) -> None:
        files[path] = text.encode("utf-8")

    def step(path: str) -> None:
        if on_file is not None:
            on_file(path)

    step(PLAN_FILE)
    emit(PLAN_FILE, plan_yaml)

    for k in eplan.kernels:
        step(k.module)
        emit(k.module, _render(env, f"kernels/{k.family}.py.j2",
                               {"variant": k.to_dict(), "constants": dict(k.constants),
                                "specc_version": specc.__version__}))
    sources = {p: b for p, b in files.items() if p.startswith("kernels/")}
    name = f"{plan_name}-{ir_mod.artifact_hash(ir_data, sources, FORMAT_VERSION, specc.__version__)}"

    predictions = {s.name: lowered.predictions.get(s.name, {}) for s in eplan.states}
    step(PREDICTIONS_FILE)
    emit(PREDICTIONS_FILE, _json({"artifact_name": name, "states": predictions}))

    if emit_graph:
        step(GRAPH_FILE)
        emit(GRAPH_FILE, _json({"format_version": FORMAT_VERSION, "plan_name": plan_name,
                                "states": {s.name: lowered.graphs.get(s.name) for s in eplan.states}}))

    report_states = [dict(e, prediction=predictions[e["name"]]) for e in ir_data["states"]]
    step(REPORT_FILE)
    emit(REPORT_FILE, _render(env, REPORT_TEMPLATE, {
        "plan_name": plan_name, "plan_hash": plan_hash, "artifact_name": name,
        "specc_version": specc.__version__, "plan": plan_data, "states": report_states,
        "kernels": ir_data["kernels"], "graph_summaries": lowered.graph_summaries,
        "prediction_keys": [k for k in REPORT_PREDICTION_KEYS if any(k in p for p in predictions.values())],
    }))

    step(MANIFEST)
    manifest = dict(ir_data, format_version=FORMAT_VERSION, specc_version=specc.__version__, name=name,
                    plan_hash=plan_hash, template_hash="sha256:" + digest,
                    files={p: "sha256:" + sha256_hex(b) for p, b in sorted(files.items())})
    emit(MANIFEST, _json(manifest))
    return name, files


def _json(data: Any) -> str:
    return json.dumps(plain_data(data, "json"), sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def _render(env: jinja2.Environment, template: str, context: Dict[str, Any]) -> str:
    try:
        return env.get_template(template).render(**context)
    except jinja2.TemplateNotFound as exc:
        raise ArtifactError(f"template {exc.name!r} not found under {env.loader.searchpath}; "  # type: ignore[union-attr]
                            f"reinstall specc or restore templates/") from None
    except jinja2.UndefinedError as exc:
        raise ArtifactError(f"template {template}: {exc} (the template uses a variable codegen "
                            f"does not provide; see templates/README.md)") from None


# --------------------------------------------------------------------------------------------------
# Atomic write


@dataclass(frozen=True)
class CompileResult:
    """Outcome of :func:`write_artifact`: the artifact's path and what happened —
    ``"created"``, ``"unchanged"`` (identical content was already there) or ``"replaced"``."""

    path: Path
    status: str
    files: Tuple[str, ...]


def read_tree(path: Path) -> Dict[str, bytes]:
    """Every regular file under ``path`` (``__pycache__`` excluded) as relative POSIX path → bytes.
    Symbolic links are not followed (a link is neither read nor listed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            p = Path(dirpath) / name
            if stat.S_ISREG(os.lstat(p).st_mode):
                out[p.relative_to(path).as_posix()] = p.read_bytes()
    return dict(sorted(out.items()))


def same_tree(path: Path, files: Mapping[str, bytes]) -> bool:
    """True iff ``path`` is a real directory holding exactly ``files`` (relative POSIX path →
    bytes; ``__pycache__`` ignored) as regular files. Symbolic links, devices, FIFOs and extra
    files make it differ; only files whose size matches are read, so nothing unbounded is read."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    seen = set()
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in dirnames:
            if stat.S_ISLNK(os.lstat(Path(dirpath) / name).st_mode):
                return False
        for name in filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(path).as_posix()
            st = os.lstat(p)
            if rel not in files or not stat.S_ISREG(st.st_mode) or st.st_size != len(files[rel]):
                return False
            try:
                fd = os.open(str(p), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                return False
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fd).st_mode) or fh.read(len(files[rel]) + 1) != files[rel]:
                    return False
            seen.add(rel)
    return seen == set(files)


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Temporary directories of a write: ``.<name>.tmp-<random>`` (the new files) and
# ``.<name>.old-<random>`` (the artifact being replaced, kept until the new one is in place).
_TEMP_RE = re.compile(r"^\.(?P<name>[A-Za-z_][A-Za-z0-9_]*-[0-9a-f]+)\.(?P<kind>tmp|old)-[A-Za-z0-9_]+$")


class _Locked:
    """An exclusive ``flock`` on a directory, held while the ``with`` block runs (blocking, or
    ``None`` from ``__enter__`` if ``wait`` is False and another process holds it). The kernel
    drops the lock when the holder exits, however it exits (SIGKILL included)."""

    def __init__(self, path: Path, wait: bool = True) -> None:
        self.path, self.wait, self.fd = path, wait, None

    def __enter__(self):
        import fcntl

        fd = os.open(str(self.path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = None


def _owned_temp(out_dir: Path, name: str, kind: str) -> Tuple[Path, int]:
    """Create ``out_dir/.<name>.<kind>-<random>`` and lock it for this process (fd returned); the
    caller holds ``out_dir``'s lock, so no sweep can see it unlocked in between."""
    import fcntl

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.{kind}-", dir=str(out_dir)))
    fd = os.open(str(tmp), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return tmp, fd


def remove_stale_temps(out_dir: Path) -> List[Path]:
    """Remove the temporary directories that crashed or killed compiles left in ``out_dir``.

    A write locks its ``.<name>.tmp-*`` / ``.<name>.old-*`` directories (``flock``) for as long as
    it runs, and the kernel releases the lock when its process ends, so a directory whose lock
    can be taken belongs to no running compile (whatever its age; a live compile's directories are
    never touched). A stale ``.old-*`` holds the previous artifact moved aside: it is renamed back
    into place when the artifact itself is missing, else removed. Call with ``out_dir``'s lock held.
    Returns the directories removed or restored."""
    done: List[Path] = []
    try:
        entries = sorted(os.listdir(out_dir))
    except OSError:
        return done
    for entry in entries:
        m = _TEMP_RE.match(entry)
        if not m:
            continue
        p = out_dir / entry
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                continue
        except OSError:
            continue
        with _Locked(p, wait=False) as held:
            if held is None:
                continue  # a running compile owns it
            final = out_dir / m.group("name")
            if m.group("kind") == "old" and (p / "artifact").is_dir() and not os.path.lexists(final):
                os.rename(p / "artifact", final)
            shutil.rmtree(p, ignore_errors=True)
        done.append(p)
    return done


class _SigtermAsInterrupt:
    """While active (main thread only), SIGTERM raises :class:`CompileTerminated` instead of ending
    the process at once, so a write's cleanup runs; on leaving, the previous handler is restored
    and, if SIGTERM arrived, re-delivered (the process then ends as a SIGTERM would end it)."""

    def __enter__(self):
        import signal
        import threading

        self.prev = None
        if threading.current_thread() is threading.main_thread():
            def handler(signum, frame):
                raise CompileTerminated("terminated by SIGTERM")

            try:
                self.prev = signal.signal(signal.SIGTERM, handler)
            except (ValueError, OSError):
                self.prev = None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        import signal

        if self.prev is not None:
            signal.signal(signal.SIGTERM, self.prev)
            if exc_type is CompileTerminated:
                signal.raise_signal(signal.SIGTERM)


class CompileTerminated(BaseException):
    """SIGTERM arrived while an artifact was being written (see :class:`_SigtermAsInterrupt`)."""


def write_artifact(out_dir: Path, name: str, files: Mapping[str, bytes],
                   on_file: Optional[Callable[[str], None]] = None) -> CompileResult:
    """Write ``files`` as ``out_dir/name/`` atomically.

    Files go to a hidden temporary directory ``.<name>.tmp-*`` inside ``out_dir`` (same
    filesystem), each fsynced, then the directory is renamed into place and ``out_dir`` fsynced.
    On any exception, SIGINT (KeyboardInterrupt) or SIGTERM the temporary directory is removed, so an
    interrupted compile leaves no partial artifact and no temporary directory (after cleaning up,
    SIGTERM is re-delivered). Temporary directories of earlier compiles that were killed outright
    (SIGKILL, power loss) are removed first when their owner is gone (:func:`remove_stale_temps`).

    Status: ``"unchanged"`` if ``out_dir/name`` already holds exactly these files (also when a
    concurrent compile of the same plan put them there first: the compare and the rename run under
    an exclusive lock on ``out_dir``), ``"replaced"`` if it held something else (e.g. built by
    older specc code of the same version), else ``"created"``. ``on_file(path)`` is called before
    each file is written (tests use it to fail or pause midway).

    Raises:
        ArtifactError: if ``out_dir`` cannot be created or written (naming it).
    """
    out_dir = Path(out_dir)
    final = out_dir / check_identifier_path(name)
    if os.path.exists(out_dir) and not out_dir.is_dir():
        raise ArtifactError(f"output directory {out_dir} exists and is not a directory; pass a directory as "
                            f"--out DIR (it is created if missing)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArtifactError(f"cannot create output directory {out_dir}: {exc.strerror}; "
                            f"pass a writable --out DIR") from None
    if not out_dir.is_dir():
        raise ArtifactError(f"output directory {out_dir} is not a directory; pass a directory as --out DIR")
    names = tuple(sorted(files))
    tmp: Optional[Path] = None
    old: Optional[Path] = None
    fds: List[int] = []
    with _SigtermAsInterrupt():
        try:
            with _Locked(out_dir):
                remove_stale_temps(out_dir)
                if same_tree(final, files):
                    return CompileResult(final, "unchanged", names)
                try:
                    tmp, fd = _owned_temp(out_dir, name, "tmp")
                except OSError as exc:
                    raise ArtifactError(f"cannot write into {out_dir}: {exc.strerror}; "
                                        f"pass a writable --out DIR") from None
                fds.append(fd)
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; an artifact is readable like any other output
            for rel in names:
                if on_file is not None:
                    on_file(rel)
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as fh:
                    fh.write(files[rel])
                    fh.flush()
                    os.fsync(fh.fileno())
            for d in sorted({(tmp / r).parent for r in files}, key=lambda p: -len(p.parts)):
                _fsync_dir(d)
            with _Locked(out_dir):
                if same_tree(final, files):  # a concurrent compile of the same plan was first
                    return CompileResult(final, "unchanged", names)
                status = "created"
                if os.path.lexists(final):
                    old, fd = _owned_temp(out_dir, name, "old")
                    fds.append(fd)
                    os.rename(final, old / "artifact")
                    status = "replaced"
                os.rename(tmp, final)
                tmp = None
                _fsync_dir(out_dir)
            return CompileResult(final, status, names)
        except OSError as exc:
            raise ArtifactError(f"cannot write the artifact into {out_dir}: {exc.strerror or exc}; "
                                f"pass a writable --out DIR") from None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                if not os.path.lexists(final) and (old / "artifact").exists():
                    os.rename(old / "artifact", final)
                shutil.rmtree(old, ignore_errors=True)
            for fd in fds:
                os.close(fd)


def check_identifier_path(name: str) -> str:
    """``<plan_name>-<hex hash>``: the only directory names codegen writes.

    Raises:
        ArtifactError: for anything else (a guard against path injection)."""
    plan_name, sep, digest = name.rpartition("-")
    if not sep or not _IDENT_RE.match(plan_name) or not re.fullmatch(r"[0-9a-f]+", digest):
        raise ArtifactError(f"refusing to write artifact directory named {name!r}")
    return name


# --------------------------------------------------------------------------------------------------
# The whole step


def resolve_plan(plan: Plan, engine: str = "specc") -> Tuple[Plan, List[Any]]:
    """The plan as ``engine`` runs it (every ``filled``/``fallback`` value applied) and all its
    violations: ``specc.check.resolve``. Codegen compiles the resolved plan, so ``plan.yaml`` and
    the states carry every value the runtime needs without re-reading the user's YAML."""
    from specc.check import resolve

    return resolve(plan, engine)


def check_errors(plan: Plan, engine: str = "specc") -> List[Any]:
    """The violations of severity ``error`` that ``specc.check.check(plan, engine)`` reports."""
    from specc.check import check

    return [v for v in check(plan, engine) if _severity(v) == "error"]


def _severity(v: Any) -> str:
    sev = getattr(v, "severity", None)
    return str(getattr(sev, "value", sev)).lower()


def format_violation(v: Any, where: Optional[Callable[[str], Any]] = None) -> str:
    """One line for a rule violation: ``[file:line: ]severity: [rule] message ([keys: ...; ]source: ...)``.

    ``where`` maps a dotted key to ``(file, line)`` (``LoadedPlan.where``) to point at the YAML. A
    violation with no keys has no ``keys:`` field (an empty field is never printed)."""
    keys = tuple(getattr(v, "keys", ()) or ())
    loc = ""
    if where is not None:
        for k in keys:
            src = where(k)
            if src:
                loc = f"{src[0]}:{src[1]}: " if src[1] else f"{src[0]}: "
                break
    return (f"{loc}{_severity(v)}: [{getattr(v, 'rule', '?')}] {getattr(v, 'message', v)} "
            f"({'keys: ' + ', '.join(keys) + '; ' if keys else ''}source: {getattr(v, 'source', '-')})")
