"""SGLang launch flags -> plan keys: the inverse of :mod:`specc.export.sglang`, using the same
plan <-> SGLang mapping as the rule table (:mod:`specc.rules.sglang_0_5_23`).

Flags with a plan key are moved into the plan; every other flag the command gave is kept in
``Imported.unmapped`` (and as a comment in the written YAML) and passed to the rules as launch facts
(``--enable-dp-lm-head``, ``--moe-a2a-backend`` decide rules that have no plan key).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

from specc.importer.base import Imported, as_float, as_int, put

ALGO_TO_METHOD = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "draft_model",
                  "NGRAM": "ngram", "DFLASH": "dflash", "DSPARK": "dspark", "FROZEN_KV_MTP": "frozen_kv_mtp"}
DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
          "float32": "float32"}
RAGGED = {"static": "static", "cap-accept": "cap_accept", "compact": "compact"}
#: dests this module turns into plan keys (everything else given is reported as unmapped)
MAPPED = {
    "model_path", "dtype", "context_length", "speculative_algorithm", "enable_multi_layer_eagle",
    "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_ngram_max_bfs_breadth", "speculative_num_draft_tokens", "speculative_dflash_block_size",
    "speculative_dspark_block_size", "speculative_use_rejection_sampling", "speculative_use_block_verification",
    "speculative_accept_threshold_single", "speculative_accept_threshold_acc", "speculative_adaptive",
    "speculative_adaptive_config", "speculative_dspark_sps_table_path", "tp_size", "dp_size", "pp_size",
    "attn_dp_size", "enable_dp_attention", "enable_two_batch_overlap", "disable_overlap_schedule", "page_size",
    "attention_backend", "disable_cuda_graph", "max_running_requests", "enable_lora", "lora_paths",
    "max_loras_per_batch", "disaggregation_mode", "device",
}
ENV_MAPPED = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_RAGGED_VERIFY_MODE")


def adaptive_buckets(cfg: Dict[str, Any], out: Imported, where: str) -> Dict[int, Dict[str, Any]]:
    """``schedule.buckets`` from an adaptive config (integer-string batch-size keys, each with
    ``candidate_steps`` and hysteresis; ``adaptive_spec_params.py:103-139``)."""
    buckets: Dict[int, Dict[str, Any]] = {}
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue
        if not isinstance(entry, dict):
            out.errors.append(f"{where}: entry {key!r} is not an object")
            continue
        b: Dict[str, Any] = {"candidates": entry.get("candidate_steps")}
        for k in ("up_hysteresis", "down_hysteresis", "ceiling_coeff"):
            if k in entry:
                b[k] = entry[k]
        buckets[int(key)] = b
    if not buckets:
        out.errors.append(f"{where}: SGLang 0.5.23 needs at least one integer-string batch-size key, e.g. "
                          f'{{"1": {{"candidate_steps": [1, 3, 7]}}}} (got keys {sorted(cfg)}; a flat '
                          f'"candidate_steps" is the older format); adaptive_spec_params.py:130-135')
    return buckets


def to_plan(values: Dict[str, Any], env: Dict[str, str], out: Imported, base_dir: Optional[Path]) -> None:
    """Fill ``out.plan`` from SGLang flag values (``dest -> str``) and environment assignments."""
    v, p = values, out.plan
    if "model_path" in v:
        put(p, "target.path", v["model_path"])
    if v.get("dtype") not in (None, "auto"):
        put(p, "target.dtype", DTYPES.get(v["dtype"], v["dtype"]))
    if "context_length" in v:
        put(p, "target.max_model_len", as_int(v, "context_length", out))
    algo = (v.get("speculative_algorithm") or "").upper() or None  # upper-cased at resolution (N1)
    method = "none"
    if algo:
        method = ALGO_TO_METHOD.get(algo, "custom")
        if method == "eagle" and v.get("enable_multi_layer_eagle"):
            method = "multi_layer_eagle"
        if method == "custom":
            put(p, "method.plugin", v["speculative_algorithm"])
    put(p, "method.name", method)
    if "speculative_draft_model_path" in v:
        put(p, "draft.path", v["speculative_draft_model_path"])
    for dest, key in (("speculative_num_steps", "method.num_steps"),
                      ("speculative_num_draft_tokens", "method.num_draft_tokens")):
        if dest in v:
            put(p, key, as_int(v, dest, out))
    topk_dest = "speculative_ngram_max_bfs_breadth" if method == "ngram" else "speculative_eagle_topk"
    if topk_dest in v:
        put(p, "method.topk", as_int(v, topk_dest, out))
    if method != "ngram" and "speculative_ngram_max_bfs_breadth" in v:
        out.unmapped.append(out.spell("speculative_ngram_max_bfs_breadth", v))
    if method == "ngram" and "speculative_eagle_topk" in v:
        out.unmapped.append(out.spell("speculative_eagle_topk", v))
    if "speculative_dflash_block_size" in v:  # the DFlash block includes the bonus slot: γ = block - 1
        block = as_int(v, "speculative_dflash_block_size", out)
        put(p, "method.block_size", block - 1 if isinstance(block, int) else None)
    if "speculative_dspark_block_size" in v:
        put(p, "method.block_size", as_int(v, "speculative_dspark_block_size", out))
    if v.get("speculative_use_block_verification"):
        put(p, "verify.rule", "block")
        put(p, "verify.draft_sampling", "probabilistic")  # block verify reads sampled draft distributions
    elif v.get("speculative_use_rejection_sampling"):
        put(p, "verify.rule", "standard")
        put(p, "verify.draft_sampling", "probabilistic")
    for dest, key in (("speculative_accept_threshold_single", "verify.accept_threshold.single"),
                      ("speculative_accept_threshold_acc", "verify.accept_threshold.acc")):
        if dest in v:
            put(p, key, as_float(v, dest, out))
    if "SGLANG_SIMULATE_ACC_LEN" in env:
        try:
            acc = float(env["SGLANG_SIMULATE_ACC_LEN"])
        except ValueError:
            out.errors.append(f"SGLANG_SIMULATE_ACC_LEN={env['SGLANG_SIMULATE_ACC_LEN']!r} is not a number")
            acc = -1.0
        if acc > 0:
            put(p, "verify.rule", "synthetic")
            put(p, "verify.synthetic.acceptance_length", acc)
    ragged = env.get("SGLANG_RAGGED_VERIFY_MODE")
    if ragged is not None:
        put(p, "schedule.ragged_verify", RAGGED.get(ragged, ragged))
    if v.get("speculative_adaptive"):
        put(p, "schedule.kind", "adaptive")
    if "speculative_adaptive_config" in v:
        path = Path(v["speculative_adaptive_config"])
        full = path if path.is_absolute() or base_dir is None else base_dir / path
        try:
            from specc.errors import SpeccError
            from specc.io import CONFIG_JSON_LIMIT, read_bounded

            cfg = json.loads(read_bounded(full, CONFIG_JSON_LIMIT, "adaptive config"))
            if not isinstance(cfg, dict):
                raise ValueError("top level is not an object")
        except (OSError, ValueError, SpeccError) as exc:
            out.notes.append(f"--speculative-adaptive-config {path}: not read ({exc}); schedule.buckets left "
                             f"unset (SGLang reads the file at launch)")
            out.unmapped.append(out.spell("speculative_adaptive_config", v))
        else:
            buckets = adaptive_buckets(cfg, out, f"--speculative-adaptive-config {path}")
            if buckets:
                put(p, "schedule.buckets", buckets)
            for k in ("ema_alpha", "update_interval", "warmup_batches"):
                if k in cfg:
                    put(p, f"schedule.{k}", cfg[k])
    if "speculative_dspark_sps_table_path" in v:
        put(p, "schedule.cost_table", v["speculative_dspark_sps_table_path"])
    if method == "dspark" and RAGGED.get(ragged or "static", ragged) != "static":
        put(p, "schedule.kind", "budget")  # ragged verify is SGLang's verify budget (DSPARK only)
    for dest, key in (("tp_size", "deploy.parallel.tp"), ("dp_size", "deploy.parallel.dp"),
                      ("pp_size", "deploy.parallel.pp")):
        if dest in v:
            put(p, key, as_int(v, dest, out))
    attn_dp = as_int(v, "attn_dp_size", out) if "attn_dp_size" in v else None
    if v.get("enable_dp_attention") or (isinstance(attn_dp, int) and attn_dp > 1):
        put(p, "deploy.parallel.dp_attention", True)
        if isinstance(attn_dp, int) and attn_dp > 1:  # `--attn-dp-size N` = the old `--dp-size N --enable-dp-attention`
            put(p, "deploy.parallel.dp", attn_dp)
    if v.get("enable_two_batch_overlap"):
        put(p, "deploy.parallel.two_batch_overlap", True)
    if v.get("disable_overlap_schedule"):
        put(p, "deploy.overlap_scheduler", False)
    if "page_size" in v:
        put(p, "deploy.page_size", as_int(v, "page_size", out))
    if "attention_backend" in v:
        put(p, "deploy.attention_backend", v["attention_backend"])
    if v.get("disable_cuda_graph"):
        put(p, "deploy.cuda_graphs", False)
    if "max_running_requests" in v:
        put(p, "deploy.max_running_requests", as_int(v, "max_running_requests", out))
    if v.get("lora_paths"):
        put(p, "deploy.lora.adapters", list(v["lora_paths"]))
    if "max_loras_per_batch" in v:
        put(p, "deploy.lora.max_loras_per_batch", as_int(v, "max_loras_per_batch", out))
    if v.get("disaggregation_mode") not in (None, "null"):
        put(p, "deploy.disagg.role", v["disaggregation_mode"])
    put(p, "runtime.device", "cpu" if v.get("device") == "cpu" else "cuda")
    for dest in values:
        if dest not in MAPPED:
            out.unmapped.append(out.spell(dest, values))
    for name, value in env.items():
        if name not in ENV_MAPPED:
            out.unmapped.append(f"{name}={value} (environment)")
