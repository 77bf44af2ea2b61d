"""Plan -> vLLM 0.33.0 launch settings (``vllm serve <model> --speculative-config '{...}' ...``).

The mapping is the one the ``vllm`` rule table assumes (see :mod:`specc.engines.vllm.rules_0_33_0`): fields of
``SpeculativeConfig`` (``vllm/config/speculative.py:410-659``).
K (``num_speculative_tokens``) is ``method.block_size`` for dspark, else ``method.num_steps`` (dflash too).
A ``batch_buckets`` schedule becomes ``num_speculative_tokens_per_batch_size``: inclusive batch-size
ranges ``[start, end, K]``, each bucket running to the next bucket's start − 1, the last one to the
largest batch (``deploy.max_running_requests`` or ``runtime.max_batch_size``), as the format of
``v1/spec_decode/dynamic/utils.py:7-74`` requires; ``--max-num-seqs`` is then that largest batch, so
vLLM admits no batch the table does not cover. Never imports torch.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from specc.errors import PlanError
from specc.plan.schema import Plan
from specc.engines.vllm.rules_0_33_0 import k, vllm_method



@dataclass
class VLLMLaunch:
    """``model`` and extra ``args`` for ``vllm serve``; ``speculative_config`` is passed as JSON."""

    model: Optional[str] = None
    args: List[str] = field(default_factory=list)
    speculative_config: Optional[Dict[str, Any]] = None

    def command(self) -> str:
        parts = ["vllm", "serve", self.model or "<target>", *self.args]
        if self.speculative_config is not None:
            parts += ["--speculative-config", json.dumps(self.speculative_config, separators=(",", ":"))]
        return " ".join(shlex.quote(p) for p in parts)


def dynamic_k(plan: Plan) -> List[List[int]]:
    """``num_speculative_tokens_per_batch_size`` ranges from ``schedule.buckets`` (one candidate each).

    Raises:
        PlanError: a bucket with other than one κ candidate (vLLM picks one K per range).
    """
    buckets = plan.schedule.buckets or {}
    starts = sorted(buckets)
    last = max([starts[-1]] + [x for x in (plan.deploy.max_running_requests, plan.runtime.max_batch_size) if x])
    out = []
    for i, start in enumerate(starts):
        cands = buckets[start].candidates
        if len(cands) != 1:
            raise PlanError(f"schedule.buckets.{start}.candidates={list(cands)}: vLLM dynamic K needs exactly one K "
                            f"per bucket")
        end = starts[i + 1] - 1 if i + 1 < len(starts) else last
        out.append([start, end, cands[0]])
    return out


def to_vllm(plan: Plan) -> VLLMLaunch:
    """vLLM launch settings for ``plan``.

    Raises:
        PlanError: the method does not exist in vLLM 0.33.0 (medusa, frozen_kv_mtp, multi_layer_eagle)
            or a batch-bucket schedule vLLM cannot express; ``specc check --engine vllm`` explains.
    """
    m, v, s, d = plan.method, plan.verify, plan.schedule, plan.deploy
    method = vllm_method(m.name)
    if method == "?":
        raise PlanError(f"method.name={m.name} has no vLLM 0.33.0 method; see `specc check --engine vllm`")
    out = VLLMLaunch(model=plan.target.path)
    a = out.args
    if plan.target.max_model_len:
        a += ["--max-model-len", str(plan.target.max_model_len)]
    if plan.target.dtype not in (None, "auto"):
        a += ["--dtype", plan.target.dtype]
    p = d.parallel
    for flag, value in (("--tensor-parallel-size", p.tp), ("--data-parallel-size", p.dp),
                        ("--pipeline-parallel-size", p.pp)):
        if value and value != 1:
            a += [flag, str(value)]
    if d.max_running_requests is not None:
        a += ["--max-num-seqs", str(d.max_running_requests)]
    if d.page_size is not None:
        a += ["--block-size", str(d.page_size)]
    if d.cuda_graphs is False:
        a += ["--enforce-eager"]
    if d.overlap_scheduler:
        a += ["--async-scheduling"]  # false/None: vLLM's own default
    if d.lora.adapters:
        a += ["--enable-lora", "--lora-modules", *d.lora.adapters]
        if d.lora.max_loras_per_batch is not None:
            a += ["--max-loras", str(d.lora.max_loras_per_batch)]
    a += serving_args(plan)
    if method is None:
        return out
    sc: Dict[str, Any] = {"method": method}
    if method == "custom_class":
        sc["model"] = m.plugin
    elif plan.draft is not None and plan.draft.path and method not in ("ngram", "suffix"):
        sc["model"] = plan.draft.path
    if k(plan) is not None:
        sc["num_speculative_tokens"] = k(plan)
    if plan.draft is not None and plan.draft.max_model_len and method not in ("ngram", "suffix"):
        sc["max_model_len"] = plan.draft.max_model_len
    if method == "ngram":
        if m.ngram.min is not None:
            sc["prompt_lookup_min"] = m.ngram.min
        if m.ngram.max is not None:
            sc["prompt_lookup_max"] = m.ngram.max
    if method == "suffix":  # corpora have no vLLM counterpart (rule K3 says so)
        for key in ("max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob"):
            if getattr(m.suffix, key) is not None:
                sc[f"suffix_decoding_{key}"] = getattr(m.suffix, key)
    if m.parallel_drafting:
        sc["parallel_drafting"] = True
    if v.rule in ("standard", "block", "synthetic"):
        sc["rejection_sample_method"] = v.rule
    sc["draft_sample_method"] = v.draft_sampling
    if v.rule == "synthetic":
        if v.synthetic.acceptance_rates is not None:
            sc["synthetic_acceptance_rates"] = list(v.synthetic.acceptance_rates)
        if v.synthetic.acceptance_length is not None:
            sc["synthetic_acceptance_length"] = v.synthetic.acceptance_length
    if s.kind == "batch_buckets":
        ranges = dynamic_k(plan)
        sc["num_speculative_tokens_per_batch_size"] = ranges
        if d.max_running_requests is None:
            # The last range ends at the plan's largest batch; without --max-num-seqs vLLM would admit its
            # default (1024 running requests on a >= 70 GiB GPU) and stretch the last K over them.
            a += ["--max-num-seqs", str(ranges[-1][1])]
    if s.kind == "budget":
        sc["enable_adaptive_verification"] = True
    if d.parallel.draft_tp is not None:
        sc["draft_tensor_parallel_size"] = d.parallel.draft_tp
    out.speculative_config = sc
    return out


def query_len(plan: Plan) -> int:
    """vLLM's uniform decode query length: K + 1 tokens per request with speculation, else 1
    (``vllm/config/vllm.py:2462-2470``): CUDA-graph capture sizes count tokens, not requests."""
    kk = k(plan) if vllm_method(plan.method.name) is not None else None
    return kk + 1 if isinstance(kk, int) and kk > 0 else 1


def serving_args(plan: Plan) -> List[str]:
    """The launch flags of the deployment keys vLLM 0.33.0 has a flag for: structured-output backend,
    reasoning parser, CUDA-graph capture sizes (requests × (K + 1) tokens:
    ``--max-cudagraph-capture-size``, ``--cudagraph-capture-sizes``), ``--gpu-memory-utilization``,
    prefix caching. ``deploy.parallel.draft_tp`` goes into ``--speculative-config``
    (``draft_tensor_parallel_size``).

    Raises:
        PlanError: a draft pipeline or data-parallel size vLLM cannot express (its draft runs with
            pipeline size 1, ``vllm/config/speculative.py:1890-1912``, inside each DP replica).
    """
    d = plan.deploy
    p = d.parallel
    for key, value, same in (("draft_pp", p.draft_pp, 1), ("draft_dp", p.draft_dp, p.dp)):
        if value is not None and value != same:
            raise PlanError(f"deploy.parallel.{key}={value}: vLLM 0.33.0 runs the draft with pipeline size 1 in each "
                            f"data-parallel replica; see `specc check --engine vllm`")
    a: List[str] = []
    if d.structured_output.backend is not None:
        a += ["--structured-outputs-config", json.dumps({"backend": d.structured_output.backend}, separators=(",", ":"))]
    if d.reasoning_parser is not None:
        a += ["--reasoning-parser", d.reasoning_parser]
    q = query_len(plan)
    if d.cuda_graph_max_bs is not None:
        a += ["--max-cudagraph-capture-size", str(d.cuda_graph_max_bs * q)]
    if d.cuda_graph_batch_sizes:
        a += ["--cudagraph-capture-sizes", *[str(b * q) for b in d.cuda_graph_batch_sizes]]
    if d.memory_fraction is not None:
        a += ["--gpu-memory-utilization", repr(float(d.memory_fraction))]
    if d.prefix_caching is not None:
        a += ["--enable-prefix-caching" if d.prefix_caching else "--disable-prefix-caching"]
    return a
