"""The front half of the pipeline in one call: plan → cost inputs (:mod:`specc.predict.sizing`) → candidate
states (:mod:`specc.compiler.lower`) → stage graphs (:mod:`specc.compiler.graph`) → predictions (:mod:`specc.predict.cost`).

``specc explain`` and codegen (``specc compile``) both run it, so each arrow stays in its own module
and none of those modules imports another arrow's module. Nothing here imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import networkx as nx

from specc import methods
from specc.predict import cost
from specc.compiler import graph
from specc.compiler import lower
from specc.predict import sizing
from specc.plan.schema import Plan


@dataclass(frozen=True)
class Analysis:
    """What :func:`analyze` computed: ``inputs`` (α, c, T*, ...), ``lowering`` (states, buckets,
    schedule), per state name its stage ``graphs`` and ``predictions``."""

    inputs: sizing.CostInputs
    lowering: lower.Lowering
    graphs: Dict[str, nx.DiGraph]
    predictions: Dict[str, cost.Prediction]


def lower_plan(plan: Plan, inputs: Optional[sizing.CostInputs] = None) -> lower.Lowering:
    """Lower ``plan``; a ``schedule.kind: auto`` plan gets its batch model
    (:func:`specc.predict.sizing.auto_batch_model`) and α (``inputs.alpha``, else :func:`specc.predict.sizing.plan_alpha`).
    Raises PlanError as :func:`specc.compiler.lower.lower_report` and :func:`specc.predict.sizing.auto_batch_model`."""
    if plan.schedule.kind != "auto" or not methods.get(plan.method.name).drafts:
        return lower.lower_report(plan)
    alpha = inputs.alpha if inputs is not None else sizing.plan_alpha(plan)[0]
    return lower.lower_report(plan, alpha, sizing.auto_batch_model(plan))


def graph_stats(g: nx.DiGraph) -> Dict[str, Optional[int]]:
    """The numbers :func:`specc.predict.cost.predict` takes from a state's stage graph."""
    passes = graph.count_forward_passes(g)
    return {"draft_passes": passes["draft"], "extend_passes": passes["extend"], "target_passes": passes["target"],
            "graphs_to_capture": graph.graphs_to_capture(g), "graph_buffer_bytes": graph.buffer_bytes(g)}


def analyze(plan: Plan, alpha: Optional[float] = None, c: Optional[float] = None,
            hardware: Optional[str] = None, acceptance=None) -> Analysis:
    """Cost inputs, lowering, one stage graph and one prediction per candidate state.

    Args: ``alpha`` / ``c`` / ``hardware`` override the plan's (``--alpha``, ``--c``, ``--hardware``);
        ``acceptance`` (a :class:`specc.predict.acceptance.Entry`, ``--acceptance RECORD.json``) replaces the
        drafter's own record.
    Raises:
        PlanError: a plan that cannot be lowered or sized (bad α, unknown hardware profile, ...).
    """
    inputs = sizing.cost_inputs(plan, alpha=alpha, c=c, hardware=hardware, acceptance=acceptance)
    low = lower_plan(plan, inputs)
    graphs, predictions = {}, {}
    for s in low.states:
        g = graph.build_graph(plan, s, inputs.draft_hidden_size)
        graphs[s.name] = g
        predictions[s.name] = cost.predict(s, inputs, graph_stats(g))
    return Analysis(inputs=inputs, lowering=low, graphs=graphs, predictions=predictions)
