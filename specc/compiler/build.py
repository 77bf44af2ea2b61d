"""Plan → :class:`specc.ir.ExecutionPlan`, once.

:func:`resolve_checked` resolves a plan against the ``specc`` profile (every filled / fallback value
applied, ``specc.check.resolve``) and refuses its errors; :func:`lower_to_ir` lowers the resolved
plan (``specc.predict.analyze.analyze``: states, schedule, stage graphs, cost predictions) and assembles the
execution plan: each state's programs (``specc.compiler.programs.state_programs``), its specialized kernels
(``specc.compiler.codegen.kernel_variants_for``) and constants, the static trees compiled once, and the
runtime section (``specc.compiler.codegen.runtime_section``). Codegen renders that object; nothing
downstream reads the plan again. Torch-free.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from specc import ir
from specc.compiler import codegen
from specc.compiler import programs
from specc.errors import PlanError, SpeccError


@dataclass
class Lowered:
    """What lowering produced: the execution plan (``ir``), the resolved plan it came from (for
    ``plan.yaml`` and the report only), each state's cost prediction and stage graph (plain data,
    by state name; not part of the execution plan) and a short graph summary per state."""

    ir: ir.ExecutionPlan
    plan: Any
    predictions: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    graphs: Dict[str, Any] = field(default_factory=dict)
    graph_summaries: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def resolve_checked(plan: Any, engine: str = "specc") -> Tuple[Any, List[Any]]:
    """``(resolved plan, violations)``; raises PlanError listing every error-severity violation."""

    codegen.check_identifier(plan.name, "plan name (the plan's `name` key)")
    resolved, violations = codegen.resolve_plan(plan, engine)
    errors = [v for v in violations if codegen._severity(v) == "error"]
    if errors:
        lines = "\n".join(f"  - {codegen.format_violation(v)}" for v in errors)
        raise PlanError(f"plan {plan.name!r} has {len(errors)} error(s) for engine '{engine}':\n{lines}")
    return resolved, violations


def state_constants(state: Any) -> Tuple[Tuple[str, Any], ...]:
    """The specialization constants a state's programs bake in: ``B`` (batch bucket), ``K`` (κ),
    ``W`` (verify rows per request), and for a tree ``N`` (draft nodes, W − 1) and ``MAX_DEPTH``."""
    out = {"B": int(state.batch_size), "K": int(state.num_steps), "W": int(state.num_draft_tokens)}
    if state.num_steps > 0 and state.kind == "tree":
        out["N"] = int(state.num_draft_tokens) - 1
        out["MAX_DEPTH"] = int(programs.tree_max_depth(state))
    return tuple(sorted(out.items()))


def artifact_cache_dir() -> Path:
    """Where plans named to ``specc run`` / ``serve`` / ``bench`` and tune's candidates are compiled:
    ``$SPECC_CACHE_DIR/artifacts`` (default ``~/.cache/specc/artifacts``). An artifact's directory
    name carries the hash of its content, so the cache is keyed by it: an unchanged plan is compiled
    once."""
    import os

    return Path(os.environ.get("SPECC_CACHE_DIR") or Path.home() / ".cache" / "specc") / "artifacts"


def target_vocab(plan: Any) -> Optional[int]:
    """The target's vocabulary V (rows of its LM head, the width of the logits the verify kernels
    read), from its checkpoint's ``config.json`` or GGUF header (``specc.predict.deploy_cost.checkpoint_shape``),
    or None when the checkpoint is not readable here (an exported-only plan naming a hub id)."""
    from specc.predict.deploy_cost import checkpoint_shape

    path = getattr(plan.target, "path", None)
    if not path:
        return None
    try:
        shape = checkpoint_shape(str(path), plan.target.format or "hf")
    except (OSError, ValueError, SpeccError):
        return None
    return int(shape.vocab) if shape is not None and shape.vocab else None


def build_ir(plan_name: str, states: Sequence[Any], runtime: Dict[str, Any],
             vocab_size: Optional[int] = None) -> ir.ExecutionPlan:
    """Assemble the execution plan of lowered ``states`` (``specc.compiler.lower.CandidateState``) under the
    runtime section ``runtime`` (:func:`specc.compiler.codegen.runtime_section`); ``vocab_size``: the
    target's vocabulary, baked into every verify kernel (``VOCAB_SIZE``) when known.

    Raises:
        PlanError: a state the runtime cannot run, or one with no kernel for its verify rule.
    """

    rates = runtime["verify"]["synthetic_rates"]
    kernels: Dict[str, ir.KernelSpec] = {}
    tree_table: Dict[str, Any] = {}
    out = []
    for s in states:
        params = codegen.state_parameters(s)
        try:
            progs = programs.state_programs(s, rates)
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        used = codegen.kernel_variants_for(s, vocab_size)
        for v in used.values():
            kernels[v.name] = ir.KernelSpec(name=v.name, family=v.family, constants=tuple(sorted(v.constants)))
        key = codegen.tree_key(params.get("tree_choices"))
        if key is not None and key not in tree_table:
            tree_table[key] = codegen.plain_data(codegen.tree_buffers(params["tree_choices"]), f"tree of {s.name}")
        out.append(ir.StateIR(
            name=s.name, method=s.method, batch_size=int(s.batch_size), num_steps=int(s.num_steps), topk=int(s.topk),
            num_draft_tokens=int(s.num_draft_tokens), verify_rule=s.verify_rule, draft_sampling=s.draft_sampling,
            parallel=bool(s.parallel), tree_choices=params.get("tree_choices"), tree=key,
            programs=tuple(ir.ProgramIR(stage, c.fn, tuple(c.args)) for stage, c in progs.items()),
            kernels=tuple(sorted((role, v.name) for role, v in used.items())), constants=state_constants(s)))
    runtime = dict(runtime, max_steps=max(s.num_steps for s in out))
    return ir.ExecutionPlan(plan_name=plan_name, runtime=ir.RuntimeIR.from_dict(runtime), states=tuple(out),
                            trees=tree_table, kernels=tuple(kernels[k] for k in sorted(kernels)))


def lower_to_ir(resolved: Any) -> Lowered:
    """Lower a resolved, checked plan (:func:`resolve_checked`) to its :class:`Lowered`: size, lower
    and analyse it once (``specc.predict.analyze.analyze``), check each state's stage graph, and build the
    execution plan (:func:`build_ir`).

    Raises:
        PlanError: a plan that lowers to no state, a state name that is not an identifier or is
            repeated, a state the runtime cannot run. SpeccError: an invalid stage graph.
    """
    from specc.predict import analyze
    from specc.compiler import codegen
    from specc.compiler import graph as graph_mod

    plan_name = codegen.check_identifier(resolved.name, "plan name (the plan's `name` key)")
    res = analyze.analyze(resolved)
    states = list(res.lowering.states)
    if not states:
        raise PlanError(f"plan {resolved.name!r} lowers to no candidate state; check schedule.buckets "
                        f"and method.num_steps")
    seen = set()
    for s in states:
        codegen.check_identifier(s.name, "candidate state name")
        if s.name in seen:
            raise PlanError(f"two candidate states are both named {s.name!r}; lowering must name "
                            f"each state by all its parameters")
        seen.add(s.name)
    graphs, summaries, predictions = {}, {}, {}
    for s in states:
        g = res.graphs[s.name]
        graph_mod.check_graph(g)
        stats = analyze.graph_stats(g)
        summaries[s.name] = {"stages": g.number_of_nodes(), "edges": g.number_of_edges(),
                             "draft_passes": stats["draft_passes"], "extend_passes": stats["extend_passes"],
                             "target_passes": stats["target_passes"],
                             "target_tokens_per_step": graph_mod.target_tokens_per_step(g)}
        graphs[s.name] = codegen.plain_data(codegen._finite_or_none(graph_mod.to_json(g)), f"graph of {s.name}",
                                            codegen.FLOAT_DIGITS)
        predictions[s.name] = codegen.prediction_data(res.predictions[s.name])
    runtime = codegen.runtime_section(resolved, res.lowering.schedule.as_dict(), max(s.num_steps for s in states))
    return Lowered(ir=build_ir(plan_name, states, runtime, target_vocab(resolved)), plan=resolved, predictions=predictions,
                   graphs=graphs, graph_summaries=summaries)


def compile_ir(plan: Any) -> Lowered:
    """Resolve, check and lower ``plan`` once: :func:`resolve_checked` then :func:`lower_to_ir`."""
    resolved, _ = resolve_checked(plan)
    return lower_to_ir(resolved)



def plan_ir(plan: Any, cost_table: Any = None) -> ir.ExecutionPlan:
    """The execution plan of ``plan`` as given (not resolved, no cost predictions): its lowering
    (:func:`specc.predict.analyze.lower_plan`) and runtime section, for benchmarks and tests that build a
    runtime over models already in memory from hand-made plans. ``cost_table``: the schedule's
    profiled table mapping (``verify_ms`` by tokens, ``draft_ms`` by requests, ``capture_limit``),
    replacing the one ``schedule.cost_table`` names.

    Raises:
        PlanError: a plan that does not lower, or a state the runtime cannot run.
    """
    from specc.predict.analyze import lower_plan

    low = lower_plan(plan)
    named = plan
    if cost_table is not None and plan.schedule.cost_table:  # the table is given: its file is not read
        named = dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, cost_table=None))
    runtime = codegen.runtime_section(named, low.schedule.as_dict(), max(s.num_steps for s in low.states))
    if cost_table is not None:
        runtime["schedule"] = dict(runtime["schedule"], cost_table=cost_table)
    return build_ir(codegen.check_identifier(plan.name, "plan name (the plan's `name` key)"), low.states, runtime)


def plan_runtime(plan: Any, target: Any, tokenizer: Any, drafter: Any, *, cost_table: Any = None,
                 max_model_len: Any = None, seed: int = 0, prefill_chunk: int = 512, device: Any = None,
                 use_cuda_graphs: bool = False) -> Any:
    """A runtime for ``plan``'s execution plan (:func:`plan_ir`) over models already loaded, with the
    generic kernels (no artifact): :func:`specc.runtime.loader.ir_runtime`. For tests and benchmark
    tools comparing hand-made plans on one target; ``specc tune``, ``run``, ``bench`` and ``serve``
    load compiled artifacts instead.

    Raises:
        PlanError: a plan that does not lower. ArtifactError: a state the runtime cannot run.
    """
    from specc.runtime.loader import ir_runtime

    return ir_runtime(plan_ir(plan, cost_table), target, tokenizer, drafter, device, seed=seed,
                      max_model_len=max_model_len, prefill_chunk=prefill_chunk, use_cuda_graphs=use_cuda_graphs,
                      compile_backend="eager", kernel_backend="auto", where=f"plan {plan.name}")


def compile_plan(plan: Any, out_dir: Path = codegen.DEFAULT_OUT_DIR,
                 templates_dir: Optional[Path] = None,
                 on_file: Optional[Callable[[str], None]] = None, emit_graph: bool = False) -> codegen.CompileResult:
    """Resolve and check ``plan`` against the ``specc`` profile, lower it, render and atomically
    write its artifact under ``out_dir`` (``templates_dir`` defaults to :data:`specc.compiler.codegen.TEMPLATES_DIR`;
    ``emit_graph``: also ``graph.json``).

    Raises:
        PlanError: a name that is not an identifier, rule errors against the ``specc`` profile (all
            listed), or a plan that lowers to no state.
        ArtifactError: template problems or an unwritable ``out_dir``.
        SpeccError: an invalid stage graph (``specc.compiler.graph.check_graph``).
    """
    resolved, _ = resolve_checked(plan)
    return compile_resolved(resolved, out_dir, templates_dir, on_file, emit_graph)


def compile_resolved(resolved: Any, out_dir: Path = codegen.DEFAULT_OUT_DIR, templates_dir: Optional[Path] = None,
                     on_file: Optional[Callable[[str], None]] = None, emit_graph: bool = False) -> codegen.CompileResult:
    """Lower a plan already resolved and checked (``specc.compiler.build.resolve_checked``) to its execution
    plan, render and atomically write its artifact under ``out_dir`` (raises as :func:`compile_plan`); returns the :class:`specc.compiler.codegen.CompileResult`."""
    name, files = codegen.render(lower_to_ir(resolved), templates_dir=templates_dir, on_file=on_file, emit_graph=emit_graph)
    return codegen.write_artifact(Path(out_dir), name, files, on_file=on_file)
