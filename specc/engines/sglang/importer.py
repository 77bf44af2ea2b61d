"""SGLang launch flags -> plan keys: the inverse of :mod:`specc.engines.sglang.exporter`, using the same
plan <-> SGLang mapping as the rule table (:mod:`specc.engines.sglang.rules_0_5_23`).

Flags with a plan key are moved into the plan; every other flag the command gave is kept in
``Imported.unmapped`` (and as a comment in the written YAML) and passed to the rules as launch facts
(``--enable-dp-lm-head``, ``--moe-a2a-backend`` decide rules that have no plan key).
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Dict, Optional

from specc.importer.base import Imported, as_count, as_float, as_int, put

ALGO_TO_METHOD = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "draft_model",
                  "NGRAM": "ngram", "DFLASH": "dflash", "DSPARK": "dspark", "FROZEN_KV_MTP": "frozen_kv_mtp"}
#: every builtin ``--speculative-algorithm`` spelling of SGLang 0.5.23: the enum's members
#: (speculative/spec_info.py:39-47) and the reserved alias NEXTN (spec_registry.py:183). UNO has no plan
#: method and is imported as ``method.name=custom``, as before.
BUILTIN_ALGOS = tuple(ALGO_TO_METHOD) + ("UNO",)
#: ``difflib`` ratio at or above which a non-builtin name is taken for a misspelt builtin (an error with the
#: suggestion). 0.8 catches one slip in a short name (EAGEL3, EGALE, NGRAMS, EAGLE-3, DSPRK, STANDALON) and
#: leaves plugin-style names alone (BIGRAM 0.73 to NGRAM, MY_EAGLE 0.77, EAGLE3_TREE 0.71, NGRAM_GPU 0.71).
NEAR_MISS = 0.8
#: algorithms whose draft is one pass: SGLang pins num_steps and topk to 1 (a warning and an override,
#: never a refusal): DF8/DF9 speculative_hook.py:334-366, DS11 speculative_hook.py:757-789
PINNED_TO_ONE = {"dflash": "arg_groups/speculative_hook.py:334-366", "dspark": "arg_groups/speculative_hook.py:757-789"}
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
    "max_loras_per_batch", "disaggregation_mode", "device", "grammar_backend", "reasoning_parser",
    "cuda_graph_max_bs_decode", "cuda_graph_bs_decode", "mem_fraction_static", "disable_radix_cache",
    "disaggregation_decode_enable_radix_cache",
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


def algorithm(raw: Optional[str], out: Imported) -> str:
    """The plan method of ``--speculative-algorithm raw``. SGLang upper-cases the name (N1,
    arg_groups/speculative_hook.py:138-143) and accepts a builtin or a name a plugin registers on import;
    any other name is refused at startup (N5, speculative/spec_info.py:65). A name that is not builtin is
    imported as a plugin (``method.name=custom``), but one that is close to a builtin (``EAGEL3``) is also
    an error suggesting the builtin: a misspelt builtin is what such a name nearly always is, and SGLang
    would refuse it unless a plugin registered exactly that misspelling."""
    if not raw:
        return "none"
    algo = raw.upper()
    if algo in ALGO_TO_METHOD:
        return ALGO_TO_METHOD[algo]
    if algo in BUILTIN_ALGOS:
        return "custom"
    flag = out.table.spelling("speculative_algorithm") if out.table is not None else "--speculative-algorithm"
    close = difflib.get_close_matches(algo, BUILTIN_ALGOS, n=2, cutoff=NEAR_MISS)
    if close:
        out.refuse(f"{flag} {raw}: not a builtin sglang=={out.version} algorithm; did you mean "
                   f"{' or '.join(close)}? SGLang refuses a name no plugin registers at startup "
                   f"(speculative/spec_info.py:65); imported as a plugin (method.name=custom, "
                   f"method.plugin={raw}) in case yours registers exactly this name",
                   stands_in=("method.name", "method.plugin"))
    else:
        out.notes.append(f"{flag} {raw}: not a builtin sglang=={out.version} algorithm (builtins: "
                         f"{', '.join(BUILTIN_ALGOS)}); imported as a plugin (method.name=custom): SGLang runs it "
                         f"only if a plugin registers {algo} on import (speculative/spec_info.py:65)")
    return "custom"


def to_plan(values: Dict[str, Any], env: Dict[str, str], out: Imported, base_dir: Optional[Path]) -> None:
    """Fill ``out.plan`` from SGLang flag values (``dest -> str``) and environment assignments."""
    v, p = values, out.plan
    if "model_path" in v:
        put(p, "target.path", v["model_path"])
    if v.get("dtype") not in (None, "auto"):
        put(p, "target.dtype", DTYPES.get(v["dtype"], v["dtype"]))
    if "context_length" in v:
        put(p, "target.max_model_len", as_count(v, "context_length", out, 1, "a context holds at least one token"))
    method = algorithm(v.get("speculative_algorithm"), out)
    if method == "eagle" and v.get("enable_multi_layer_eagle"):
        method = "multi_layer_eagle"
    if method == "custom":
        put(p, "method.plugin", v["speculative_algorithm"])
    put(p, "method.name", method)
    if "speculative_draft_model_path" in v:
        put(p, "draft.path", v["speculative_draft_model_path"])
    topk_dest = "speculative_ngram_max_bfs_breadth" if method == "ngram" else "speculative_eagle_topk"
    for dest, key in (("speculative_num_steps", "method.num_steps"), (topk_dest, "method.topk")):
        if dest not in v:
            continue
        if method in PINNED_TO_ONE:  # any value runs: SGLang overrides it to 1 with a warning
            n = as_int(v, dest, out)
            if isinstance(n, int) and n < 1:
                out.notes.append(f"{out.table.spelling(dest)} {n}: SGLang sets it to 1 for "
                                 f"{v['speculative_algorithm'].upper()} ({PINNED_TO_ONE[method]}); left out of "
                                 f"the plan (write 1 or drop the flag)")
                n = None
            put(p, key, n)
            continue
        what = {"speculative_num_steps": "the draft depth (draft passes per verify)",
                "speculative_eagle_topk": "the branching per draft step",
                "speculative_ngram_max_bfs_breadth": "the n-gram tree's breadth"}[dest]
        put(p, key, as_count(v, dest, out, 1, f"{what} must be >= 1",
                             "write a positive integer, or drop the flag and SGLang picks it"))
    if "speculative_num_draft_tokens" in v:
        lo, why = 1, "the verify width (bonus token included) must be >= 1"
        if method == "dspark":  # DS17
            lo, why = 2, ("DSPARK needs a verify width >= 2 (γ + 1); SGLang refuses it at startup "
                          "(arg_groups/speculative_hook.py:846-850)")
        put(p, "method.num_draft_tokens",
            as_count(v, "speculative_num_draft_tokens", out, lo, why,
                     "write a larger integer, or drop the flag and SGLang derives it"))
    if method != "ngram" and "speculative_ngram_max_bfs_breadth" in v:
        out.unmapped.append(out.spell("speculative_ngram_max_bfs_breadth", v))
    if method == "ngram" and "speculative_eagle_topk" in v:
        out.unmapped.append(out.spell("speculative_eagle_topk", v))
    if "speculative_dflash_block_size" in v:  # the DFlash block includes the bonus slot: γ = block - 1
        block = as_count(v, "speculative_dflash_block_size", out, 2,
                         "the DFlash block holds the bonus token plus the drafts, so it must be >= 2 (SGLang "
                         "refuses a block <= 0 at startup, arg_groups/speculative_hook.py:368-373; a block of 1 "
                         "drafts nothing)", "write γ + 1 (e.g. 16 for 15 drafts), or drop the flag and SGLang "
                         "reads the draft config's block_size")
        put(p, "method.block_size", block - 1 if isinstance(block, int) else None)
    if "speculative_dspark_block_size" in v:
        put(p, "method.block_size",
            as_count(v, "speculative_dspark_block_size", out, 1,
                     "γ (the drafts per block) must be >= 1; SGLang refuses it at startup "
                     "(arg_groups/speculative_hook.py:807-812)",
                     "write a positive γ, or drop the flag and SGLang reads it from the checkpoint"))
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
            put(p, key, as_count(v, dest, out, 1, "a parallel size must be >= 1"))
    attn_dp = as_count(v, "attn_dp_size", out, 1, "a parallel size must be >= 1") if "attn_dp_size" in v else None
    if v.get("enable_dp_attention") or (isinstance(attn_dp, int) and attn_dp > 1):
        put(p, "deploy.parallel.dp_attention", True)
        if isinstance(attn_dp, int) and attn_dp > 1:  # `--attn-dp-size N` = the old `--dp-size N --enable-dp-attention`
            put(p, "deploy.parallel.dp", attn_dp)
    if v.get("enable_two_batch_overlap"):
        put(p, "deploy.parallel.two_batch_overlap", True)
    if v.get("disable_overlap_schedule"):
        put(p, "deploy.overlap_scheduler", False)
    if "page_size" in v:
        put(p, "deploy.page_size", as_count(v, "page_size", out, 1, "a page holds at least one token"))
    if "attention_backend" in v:
        put(p, "deploy.attention_backend", v["attention_backend"])
    if v.get("disable_cuda_graph"):
        put(p, "deploy.cuda_graphs", False)
    if "max_running_requests" in v:
        put(p, "deploy.max_running_requests",
            as_count(v, "max_running_requests", out, 1, "at least one request must run"))
    if v.get("lora_paths"):
        put(p, "deploy.lora.adapters", list(v["lora_paths"]))
    if "max_loras_per_batch" in v:
        put(p, "deploy.lora.max_loras_per_batch",
            as_count(v, "max_loras_per_batch", out, 1, "a batch holds at least one LoRA"))
    if v.get("disaggregation_mode") not in (None, "null"):
        put(p, "deploy.disagg.role", v["disaggregation_mode"])
    serving(v, out)
    put(p, "runtime.device", "cpu" if v.get("device") == "cpu" else "cuda")
    for dest in values:
        if dest not in MAPPED:
            out.unmapped.append(out.spell(dest, values))
    for name, value in env.items():
        if name not in ENV_MAPPED:
            out.unmapped.append(f"{name}={value} (environment)")


def serving(v: Dict[str, Any], out: Imported) -> None:
    """The deployment flags with plan keys (the inverse of :func:`specc.engines.sglang.exporter.serving_args`):
    ``--grammar-backend``, ``--reasoning-parser``, ``--cuda-graph-max-bs-decode``,
    ``--cuda-graph-bs-decode``, ``--mem-fraction-static``, ``--disable-radix-cache`` and, on a decode
    node, ``--disaggregation-decode-enable-radix-cache``."""
    p = out.plan
    if v.get("grammar_backend") is not None:
        put(p, "deploy.structured_output.backend", v["grammar_backend"])
    if v.get("reasoning_parser") is not None:
        put(p, "deploy.reasoning_parser", v["reasoning_parser"])
    if "cuda_graph_max_bs_decode" in v:
        put(p, "deploy.cuda_graph_max_bs", as_count(v, "cuda_graph_max_bs_decode", out, 1,
                                                    "a captured batch holds at least one request"))
    if v.get("cuda_graph_bs_decode"):
        sizes = []
        for raw in v["cuda_graph_bs_decode"]:
            try:
                n = int(str(raw).strip())
            except ValueError:
                out.errors.append(f"--cuda-graph-bs-decode {raw!r}: expects integers")
                continue
            if n < 1:
                out.errors.append(f"--cuda-graph-bs-decode {n}: a captured batch holds at least one request "
                                  f"(left out of the plan)")
                continue
            sizes.append(n)
        put(p, "deploy.cuda_graph_batch_sizes", sizes or None)
    if "mem_fraction_static" in v:
        frac = as_float(v, "mem_fraction_static", out)
        if frac is not None and not 0.0 < frac <= 1.0:
            out.errors.append(f"--mem-fraction-static {frac}: SGLang takes it without a check, but a share of GPU "
                              f"memory outside (0, 1] cannot start (weights + KV pool sized from it, "
                              f"model_executor/pool_configurator.py:94-98); write e.g. 0.85 (left out of the plan)")
            frac = None
        put(p, "deploy.memory_fraction", frac)
    if v.get("disable_radix_cache"):
        put(p, "deploy.prefix_caching", False)
    if v.get("disaggregation_decode_enable_radix_cache"):
        put(p, "deploy.prefix_caching", True)
