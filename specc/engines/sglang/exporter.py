"""Plan -> SGLang 0.5.23 launch settings (``python -m sglang.launch_server ...``).

The mapping is the one the ``sglang`` rule table assumes (see :mod:`specc.engines.sglang.rules_0_5_23`):
flags from ``sglang/srt/arg_groups/fields/spec.py``,
environment variables from ``sglang/srt/environ.py`` and the adaptive config format of
``speculative/adaptive_spec_params.py:103-139``. Only keys the plan sets are exported; SGLang fills
the rest (run ``specc check --engine sglang --show-resolved`` to see its values). Never imports torch.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from specc import methods
from specc.errors import PlanError
from specc.plan.schema import Plan
from specc.engines.sglang.rules_0_5_23 import EAGLE_FAMILY, multi_layer, sglang_algorithm

RAGGED_ENV = {"static": "static", "cap_accept": "cap-accept", "compact": "compact"}
#: algorithms that draft in one pass: SGLang pins num_steps and topk to 1 (DF8/DF9, DS11)
ONE_PASS = ("DFLASH", "DSPARK")


@dataclass
class SGLangLaunch:
    """``args`` for ``sglang.launch_server``, ``env`` to export, and the adaptive config JSON (to be
    written to ``adaptive_config_path``) when the schedule is adaptive."""

    args: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    adaptive_config: Optional[Dict[str, Any]] = None
    adaptive_config_path: str = "adaptive_config.json"

    def command(self) -> str:
        """One shell line: env assignments, then the launch command."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in ["python", "-m", "sglang.launch_server", *self.args])
        return f"{env} {cmd}".strip()


def adaptive_config(plan: Plan) -> Optional[Dict[str, Any]]:
    """The ``--speculative-adaptive-config`` JSON for an adaptive plan: integer-string slot keys with
    ``candidate_steps`` and hysteresis per bucket, controller knobs as top-level defaults
    (adaptive_spec_params.py:103-139, 171-176). None when the plan writes no buckets (SGLang then
    uses DEFAULT_ADAPTIVE_CONFIG)."""
    s = plan.schedule
    if not s.buckets:
        return None
    cfg: Dict[str, Any] = {}
    for key, name in (("ema_alpha", "ema_alpha"), ("update_interval", "update_interval"),
                      ("warmup_batches", "warmup_batches")):
        if getattr(s, key) is not None:
            cfg[name] = getattr(s, key)
    for bs in sorted(s.buckets):
        b = s.buckets[bs]
        slot: Dict[str, Any] = {"candidate_steps": list(b.candidates)}
        for k in ("up_hysteresis", "down_hysteresis", "ceiling_coeff"):
            if getattr(b, k) is not None:
                slot[k] = getattr(b, k)
        cfg[str(bs)] = slot
    return cfg


def to_sglang(plan: Plan) -> SGLangLaunch:
    """SGLang launch settings for ``plan``.

    Raises:
        PlanError: the plan has no SGLang equivalent (method medusa/suffix, custom without a plugin
            name); ``specc check --engine sglang`` explains why.
    """
    m, v, s, d = plan.method, plan.verify, plan.schedule, plan.deploy
    algo = sglang_algorithm(m.name)
    if algo == "?":
        raise PlanError(f"method.name={m.name} has no SGLang 0.5.23 algorithm; see `specc check --engine sglang`")
    out = SGLangLaunch()
    a = out.args
    if plan.target.path:
        a += ["--model-path", plan.target.path]
    if plan.target.dtype not in (None, "auto"):
        a += ["--dtype", plan.target.dtype]
    if plan.target.max_model_len:
        a += ["--context-length", str(plan.target.max_model_len)]
    if algo is not None:
        if algo == "PLUGIN":
            if not m.plugin:
                raise PlanError("method.name=custom needs method.plugin (the registered algorithm name)")
            name = m.plugin.rsplit(".", 1)[-1].upper()
        else:
            name = methods.get(m.name).sglang_flag or algo
        a += ["--speculative-algorithm", name]
        if multi_layer(plan):
            a += ["--enable-multi-layer-eagle"]
        if plan.draft is not None and plan.draft.path:
            a += ["--speculative-draft-model-path", plan.draft.path]
        steps, topk = m.num_steps, m.topk
        if algo in ONE_PASS:
            # DFlash / DSpark draft a whole block in one pass: SGLang takes num_steps and topk as 1 and
            # overrides any other value to 1 with a warning (DF8/DF9:
            # sglang/srt/arg_groups/speculative_hook.py:334-366; DS11: speculative_hook.py:757-789). Emit the
            # value SGLang runs, so the command agrees with the DF8/DF9/DS11 fallback note `specc export`
            # prints for such a plan (the plan's num_steps is κ for specc's own runtime, not an SGLang flag).
            steps = 1 if steps is not None else None
            topk = 1 if topk is not None else None
        if steps is not None:
            a += ["--speculative-num-steps", str(steps)]
        if topk is not None:
            a += (["--speculative-ngram-max-bfs-breadth"] if algo == "NGRAM" else ["--speculative-eagle-topk"]) \
                + [str(topk)]
        ndt = m.num_draft_tokens
        if m.topk == 1 and isinstance(m.num_steps, int) and algo in EAGLE_FAMILY:
            # A chain verifies κ + 1 tokens: SGLang sets that itself, logging a warning for an unset value and
            # overriding any other one (EG20,
            # sglang/srt/arg_groups/speculative_hook.py:1255-1266), so pass κ + 1 explicitly, as the EG20
            # fallback note says.
            ndt = m.num_steps + 1
        if ndt is not None:
            a += ["--speculative-num-draft-tokens", str(ndt)]
        if m.block_size is not None and algo == "DFLASH":
            a += ["--speculative-dflash-block-size", str(m.block_size + 1)]  # block includes the bonus slot
        if m.block_size is not None and algo == "DSPARK":
            a += ["--speculative-dspark-block-size", str(m.block_size)]  # γ
        if v.rule == "standard" and v.draft_sampling == "probabilistic":
            a += ["--speculative-use-rejection-sampling"]
        if v.rule == "block":
            a += ["--speculative-use-block-verification"]
        if v.accept_threshold.single is not None:
            a += ["--speculative-accept-threshold-single", str(v.accept_threshold.single)]
        if v.accept_threshold.acc is not None:
            a += ["--speculative-accept-threshold-acc", str(v.accept_threshold.acc)]
        if v.rule == "synthetic" and v.synthetic.acceptance_length is not None:
            out.env["SGLANG_SIMULATE_ACC_LEN"] = str(v.synthetic.acceptance_length)
        if s.kind == "adaptive":
            a += ["--speculative-adaptive"]
            out.adaptive_config = adaptive_config(plan)
            if out.adaptive_config is not None:
                a += ["--speculative-adaptive-config", out.adaptive_config_path]
        if s.ragged_verify != "static":
            out.env["SGLANG_RAGGED_VERIFY_MODE"] = RAGGED_ENV.get(s.ragged_verify, s.ragged_verify)
        if s.cost_table and algo == "DSPARK":
            a += ["--speculative-dspark-sps-table-path", s.cost_table]
    p = d.parallel
    for flag, value in (("--tp-size", p.tp), ("--dp-size", p.dp), ("--pp-size", p.pp)):
        if value and value != 1:
            a += [flag, str(value)]
    if p.dp_attention:
        a += ["--enable-dp-attention"]
    if p.two_batch_overlap:
        a += ["--enable-two-batch-overlap"]
    if d.overlap_scheduler is False:
        a += ["--disable-overlap-schedule"]
    if d.page_size is not None:
        a += ["--page-size", str(d.page_size)]
    if d.attention_backend:
        a += ["--attention-backend", d.attention_backend]
    if d.cuda_graphs is False:
        a += ["--disable-cuda-graph"]
    if d.max_running_requests is not None:
        a += ["--max-running-requests", str(d.max_running_requests)]
    if d.lora.adapters:
        a += ["--enable-lora", "--lora-paths", *d.lora.adapters]
        if d.lora.max_loras_per_batch is not None:
            a += ["--max-loras-per-batch", str(d.lora.max_loras_per_batch)]
    if d.disagg.role != "none":
        a += ["--disaggregation-mode", d.disagg.role]
    a += serving_args(plan)
    if plan.runtime.device == "cpu":
        a += ["--device", "cpu"]
    return out


def serving_args(plan: Plan) -> List[str]:
    """The launch flags of the deployment keys SGLang 0.5.23 has a flag for: grammar backend,
    reasoning parser, decode CUDA-graph batch sizes, ``--mem-fraction-static``, the radix (prefix)
    cache; ``deploy.structured_output.requests`` is a property of the traffic, not a flag.

    Raises:
        PlanError: a draft parallel size SGLang cannot express (it runs the draft on the target's
            TP group, one pipeline stage, in every DP replica: no draft TP/PP/DP flag exists in
            ``arg_groups/fields/spec.py:31-283``).
    """
    d = plan.deploy
    p = d.parallel
    for key, value, same in (("draft_tp", p.draft_tp, p.tp), ("draft_pp", p.draft_pp, 1), ("draft_dp", p.draft_dp, p.dp)):
        if value is not None and value != same:
            raise PlanError(f"deploy.parallel.{key}={value}: SGLang 0.5.23 runs the draft at the target's sizes "
                            f"(draft TP = tp, PP 1, DP = dp) and has no flag for another; see `specc check --engine sglang`")
    a: List[str] = []
    if d.structured_output.backend is not None:
        a += ["--grammar-backend", d.structured_output.backend]
    if d.reasoning_parser is not None:
        a += ["--reasoning-parser", d.reasoning_parser]
    if d.cuda_graph_max_bs is not None:
        a += ["--cuda-graph-max-bs-decode", str(d.cuda_graph_max_bs)]
    if d.cuda_graph_batch_sizes:
        a += ["--cuda-graph-bs-decode", *[str(b) for b in d.cuda_graph_batch_sizes]]
    if d.memory_fraction is not None:
        a += ["--mem-fraction-static", repr(float(d.memory_fraction))]
    if d.prefix_caching is False and d.disagg.role != "decode":
        a += ["--disable-radix-cache"]
    if d.prefix_caching is True and d.disagg.role == "decode":
        a += ["--disaggregation-decode-enable-radix-cache"]  # a decode node has no radix cache by default
    return a


def adaptive_config_json(launch: SGLangLaunch) -> str:
    """The adaptive config file's text (empty string when there is none)."""
    return json.dumps(launch.adaptive_config, indent=2) + "\n" if launch.adaptive_config else ""
