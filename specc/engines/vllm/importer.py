"""vLLM ``serve`` flags and ``--speculative-config`` -> plan keys: the inverse of
:mod:`specc.engines.vllm.exporter`, using the rule table's mapping (:mod:`specc.engines.vllm.rules_0_33_0`): K
(``num_speculative_tokens``) is ``method.block_size`` for dspark and ``method.num_steps`` otherwise.

``--speculative-config`` keys are checked against ``SpeculativeConfig``'s fields of the version
(vLLM forbids extra keys, ``vllm/config/utils.py:70-71``); ``--spec-method/--spec-model/--spec-tokens``
merge into it and may not repeat a key it has (``vllm/engine/arg_utils.py:2108-2121``).
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, Optional

from specc.importer.base import Imported, as_count, below, human_int, put
from specc.io import load_json
from specc.console import plural

DTYPES = {"auto": "auto", "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
          "float32": "float32"}
#: vLLM's default max_num_seqs for `vllm serve` on a >= 70 GiB GPU (H100/H200 tier), used when a dynamic-K
#: table is imported without --max-num-seqs (vllm/engine/arg_utils.py:2975-2985)
DEFAULT_MAX_NUM_SEQS = 1024
MAPPED = {"model_tag", "max_model_len", "dtype", "tensor_parallel_size", "data_parallel_size",
          "pipeline_parallel_size", "max_num_seqs", "block_size", "enforce_eager", "async_scheduling",
          "enable_lora", "lora_modules", "max_loras", "enable_dbo", "speculative_config", "spec_method",
          "spec_model", "spec_tokens", "structured_outputs_config", "reasoning_parser", "max_cudagraph_capture_size",
          "cudagraph_capture_sizes", "gpu_memory_utilization", "enable_prefix_caching"}
SC_MAPPED = {"method", "model", "num_speculative_tokens", "max_model_len", "prompt_lookup_min", "prompt_lookup_max",
             "parallel_drafting", "rejection_sample_method", "draft_sample_method", "synthetic_acceptance_rates",
             "synthetic_acceptance_length", "num_speculative_tokens_per_batch_size", "enable_adaptive_verification",
             "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
             "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob",
             "draft_tensor_parallel_size"}
#: suffix_decoding_* keys: (plan key, integer?, lower bound, upper bound or None) (vLLM
#: config/speculative.py:1741-1760)
SUFFIX_KEYS = {"suffix_decoding_max_tree_depth": ("method.suffix.max_tree_depth", True, 1, None),
               "suffix_decoding_max_cached_requests": ("method.suffix.max_cached_requests", True, 0, None),
               "suffix_decoding_max_spec_factor": ("method.suffix.max_spec_factor", False, 0, None),
               "suffix_decoding_min_token_prob": ("method.suffix.min_token_prob", False, 0, 1)}
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def speculative_config(values: Dict[str, Any], out: Imported) -> Dict[str, Any]:
    """The merged ``--speculative-config`` dict (JSON flag plus the ``--spec-*`` shorthands)."""
    sc: Dict[str, Any] = {}
    raw = values.get("speculative_config")
    if raw is not None:
        try:
            sc = load_json(raw, "--speculative-config", error=ValueError) if isinstance(raw, str) else dict(raw)
            if not isinstance(sc, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            out.errors.append(f"--speculative-config {raw!r} is not a JSON object ({exc})")
            sc = {}
    for dest, key in (("spec_method", "method"), ("spec_model", "model"), ("spec_tokens", "num_speculative_tokens")):
        if dest in values:
            if key in sc:
                out.errors.append(f"--{dest.replace('_', '-')} and --speculative-config {key!r} are mutually "
                                  f"exclusive (vllm/engine/arg_utils.py:2108-2121)")
            sc[key] = values[dest] if key != "num_speculative_tokens" else human_int(values[dest])
            if key == "num_speculative_tokens" and sc[key] is None:
                out.errors.append(f"--spec-tokens {values[dest]!r}: expects an integer")
                del sc[key]
    fields = set(out.table.extra.get("speculative_config_fields", ())) if out.table is not None else set()
    for key in sc:
        if fields and key not in fields:
            import difflib

            hint = difflib.get_close_matches(key, sorted(fields), n=2, cutoff=0.6)
            out.errors.append(f"--speculative-config key {key!r} is not a vllm=={out.version} SpeculativeConfig "
                              f"field (extra keys are refused)" + (f"; did you mean {' or '.join(map(repr, hint))}?"
                                                                  if hint else ""))
    return sc


def _method(sc: Dict[str, Any], out: Imported) -> str:
    method, model = sc.get("method"), sc.get("model")
    known = set(out.table.extra.get("speculative_methods", ())) if out.table is not None else set()
    if method is None:  # vLLM config/speculative.py:1214-1244: dotted class path -> custom_class, "ngram" -> ngram, else draft_model
        if model in ("ngram", "[ngram]"):
            return "ngram"
        if isinstance(model, str) and _DOTTED.match(model) and "/" not in model:
            return "custom"
        return "draft_model" if model else "none"
    if not isinstance(method, str):
        out.errors.append(f"--speculative-config method={json.dumps(method)} must be a string (a method name)")
        return "none"
    if known and method not in known:
        import difflib

        # vLLM's method is a Literal (config/speculative.py:74-82): case matters and a near miss is refused like
        # any other name
        hint = difflib.get_close_matches(str(method).lower(), sorted(known), n=2, cutoff=0.6)
        # imported as method.name=custom (its model as method.plugin): the rules about those values follow
        # from this error, not from the command
        out.refuse(f"--speculative-config method {method!r} is not a vllm=={out.version} method "
                   + (f"(did you mean {' or '.join(map(repr, hint))}?) " if hint else "")
                   + f"({', '.join(m for m in sorted(known) if not m.endswith('_mtp'))} or a *_mtp alias)",
                   stands_in=("method.name", "method.plugin"))
        return "custom"
    if method.endswith("_mtp"):
        return "mtp"  # deprecated aliases become mtp (config/speculative.py:1246-1250)
    if method == "custom_class":
        return "custom"
    if method == "ngram_gpu":
        out.notes.append("method ngram_gpu is imported as method.name=ngram (specc has one n-gram method)")
        return "ngram"
    if method == "extract_hidden_states":
        out.errors.append("method extract_hidden_states captures hidden states; it is not speculation and has "
                          "no plan method")
        return "none"
    return method


def _default_model(out: Imported) -> None:
    """``vllm serve`` without a model serves the ``--model`` default (the flag table records it from the
    real parser): vllm/entrypoints/cli/serve.py:54-57 takes the positional model only when given, and
    ``EngineArgs.model`` defaults to ``ModelConfig.model`` (vllm/engine/arg_utils.py:492)."""
    a = out.table.by_dest("model") if out.table is not None else None
    model = a.get("default") if a else None
    if not model:
        return
    put(out.plan, "target.path", model)
    msg = (f"no model given: vllm=={out.version} serves its default model {model}; name the model to serve "
           f"(`vllm serve MODEL`)")
    out.notes.append(msg)
    out.filled.append(("target.path", model, msg, "vllm/entrypoints/cli/serve.py:54-57, vllm/engine/arg_utils.py:492"))


def _suffix_keys(sc: Dict[str, Any], out: Imported) -> None:
    """``suffix_decoding_*`` -> ``method.suffix.*``; a wrong type or a value vLLM refuses at startup
    (``_validate_suffix_decoding``, vLLM config/speculative.py:1741-1760) is an error naming the key."""
    for key, (dest, integer, lo, hi) in SUFFIX_KEYS.items():
        if key not in sc:
            continue
        v = sc[key]
        ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok_type:
            out.errors.append(f"--speculative-config {key}={v!r} must be {'an integer' if integer else 'a number'}")
            continue
        if v < lo or (hi is not None and v > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            out.errors.append(f"--speculative-config {key}={v!r}: vLLM refuses it at startup (must be {bound}, "
                              f"vllm/config/speculative.py:1741-1760); write a value {bound} or drop the key")
            continue
        put(out.plan, dest, float(v) if not integer else int(v))


def to_plan(values: Dict[str, Any], env: Dict[str, str], out: Imported, default_model: bool = True) -> None:
    """Fill ``out.plan`` from vLLM flag values (``dest -> str``). A command that names no model is
    what vLLM runs with its default ``--model`` (``default_model``; off for a bare speculative config)."""
    v, p = values, out.plan
    if "model_tag" in v:
        put(p, "target.path", v["model_tag"])
    elif default_model:
        _default_model(out)
    if "max_model_len" in v:
        n = human_int(v["max_model_len"])
        if n is None and str(v["max_model_len"]).lower() != "auto":
            out.errors.append(f"--max-model-len {v['max_model_len']!r}: expects an integer (or 1k-style)")
        elif n == -1:  # vLLM reads -1 as `auto` (fit the length to GPU memory), as `auto` is left unset
            n = None
        elif below(out, "--max-model-len", n, 1, "a context holds at least one token",
                   "write a positive length, or `auto` (-1) to fit it to GPU memory"):
            n = None
        put(p, "target.max_model_len", n)
    if v.get("dtype") not in (None, "auto"):
        put(p, "target.dtype", DTYPES.get(v["dtype"], v["dtype"]))
    for dest, key in (("tensor_parallel_size", "deploy.parallel.tp"), ("data_parallel_size", "deploy.parallel.dp"),
                      ("pipeline_parallel_size", "deploy.parallel.pp"), ("block_size", "deploy.page_size")):
        if dest in v:
            put(p, key, as_count(v, dest, out, 1, "a parallel size must be >= 1" if dest != "block_size"
                                 else "a KV block holds at least one token"))
    if "max_num_seqs" in v:
        n = human_int(v["max_num_seqs"])
        if n is None:
            out.errors.append(f"--max-num-seqs {v['max_num_seqs']!r}: expects an integer (or 1k-style)")
        elif below(out, "--max-num-seqs", n, 1, "at least one sequence must run", "write a positive integer"):
            n = None
        put(p, "deploy.max_running_requests", n)
    if v.get("enforce_eager"):
        put(p, "deploy.cuda_graphs", False)
    if "async_scheduling" in v:
        put(p, "deploy.overlap_scheduler", bool(v["async_scheduling"]))
    if v.get("enable_dbo"):
        put(p, "deploy.parallel.two_batch_overlap", True)
    if v.get("lora_modules"):
        put(p, "deploy.lora.adapters", list(v["lora_modules"]))
    if "max_loras" in v:
        put(p, "deploy.lora.max_loras_per_batch", as_count(v, "max_loras", out, 1, "a batch holds at least one LoRA"))
    sc = speculative_config(v, out)
    method = _method(sc, out) if sc else "none"
    put(p, "method.name", method)
    if sc:
        model = sc.get("model")
        if method == "custom":
            put(p, "method.plugin", model)
        elif model and method not in ("ngram", "suffix"):
            put(p, "draft.path", model)
        k = sc.get("num_speculative_tokens")
        if k is not None:
            if not isinstance(k, int) or isinstance(k, bool):
                out.errors.append(f"--speculative-config num_speculative_tokens={k!r} must be an integer")
            elif not below(out, "--spec-tokens" if "spec_tokens" in v
                           else "--speculative-config num_speculative_tokens=", k, 1,
                           "vLLM refuses K <= 0 at startup (SpeculativeConfig field `gt=0`, "
                           "vllm/config/speculative.py:413)",
                           "write the number of tokens to draft per step (>= 1), or drop the key to take the "
                           "draft's n_predict"):
                put(p, "method.block_size" if method == "dspark" else "method.num_steps", k)
        # the other counts the plan holds: pydantic `ge=1` on the field (vllm/config/speculative.py:452, 503, 506)
        for key, dest, line in (("max_model_len", "draft.max_model_len", 452),
                                ("prompt_lookup_min", "method.ngram.min", 506),
                                ("prompt_lookup_max", "method.ngram.max", 503)):
            n = sc.get(key)
            if n is None:
                continue
            if isinstance(n, str) and n.strip().lstrip("-").isdigit():  # pydantic's lax mode takes "2048"
                n = int(n)
            if not isinstance(n, int) or isinstance(n, bool):
                out.errors.append(f"--speculative-config {key}={n!r} must be an integer")
            elif not below(out, f"--speculative-config {key}=", n, 1, f"vLLM refuses {key} < 1 at startup "
                           f"(SpeculativeConfig field `ge=1`, vllm/config/speculative.py:{line})",
                           "write a positive integer or drop the key"):
                put(p, dest, n)
        if sc.get("parallel_drafting"):
            put(p, "method.parallel_drafting", True)
        rule = sc.get("rejection_sample_method")
        if rule in ("standard", "block", "synthetic"):
            put(p, "verify.rule", rule)
        if sc.get("draft_sample_method") in ("greedy", "probabilistic"):
            put(p, "verify.draft_sampling", sc["draft_sample_method"])
        put(p, "verify.synthetic.acceptance_rates", sc.get("synthetic_acceptance_rates"))
        put(p, "verify.synthetic.acceptance_length", sc.get("synthetic_acceptance_length"))
        table = sc.get("num_speculative_tokens_per_batch_size")
        if table is not None:
            buckets, ok = {}, isinstance(table, list)
            for row in table if ok else []:
                if not (isinstance(row, (list, tuple)) and len(row) == 3 and all(isinstance(x, int) for x in row)):
                    ok = False
                    break
                buckets[row[0]] = {"candidates": [row[2]]}
            if not ok:
                out.errors.append(f"--speculative-config num_speculative_tokens_per_batch_size={table!r}: each entry "
                                  f"must be [start, end, K] (v1/spec_decode/dynamic/utils.py:7-74)")
            else:
                put(p, "schedule.kind", "batch_buckets")
                put(p, "schedule.buckets", buckets)
                if "max_num_seqs" not in v:
                    put(p, "deploy.max_running_requests", DEFAULT_MAX_NUM_SEQS)
                    out.notes.append(f"deploy.max_running_requests={DEFAULT_MAX_NUM_SEQS}: the command leaves "
                                     f"--max-num-seqs at vLLM's default (1024 on a >= 70 GiB GPU), and the last "
                                     f"dynamic-K range holds up to it; set it to your GPU's value")
        if sc.get("enable_adaptive_verification"):
            put(p, "schedule.kind", "budget")
        _suffix_keys(sc, out)
        dtp = sc.get("draft_tensor_parallel_size")
        if dtp is not None:
            if not isinstance(dtp, int) or isinstance(dtp, bool):
                out.errors.append(f"--speculative-config draft_tensor_parallel_size={dtp!r} must be an integer")
            elif not below(out, "--speculative-config draft_tensor_parallel_size=", dtp, 1,
                           "vLLM refuses it at startup (field `ge=1`, vllm/config/speculative.py:427)",
                           "write 1 or the target's --tensor-parallel-size"):
                put(p, "deploy.parallel.draft_tp", dtp)
        for key, value in sc.items():
            if key not in SC_MAPPED:
                out.unmapped.append(f"speculative_config.{key}={json.dumps(value)}")
        if rule not in (None, "standard", "block", "synthetic"):
            out.unmapped.append(f"speculative_config.rejection_sample_method={json.dumps(rule)}")
    serving(v, out)
    put(p, "runtime.device", "cuda")
    for dest in values:
        if dest not in MAPPED:
            out.unmapped.append(out.spell(dest, values))
    for name, value in env.items():
        out.unmapped.append(f"{name}={value} (environment)")


def serving(v: Dict[str, Any], out: Imported) -> None:
    """The deployment flags with plan keys (the inverse of :func:`specc.engines.vllm.exporter.serving_args`):
    ``--structured-outputs-config`` (its ``backend``), ``--reasoning-parser``,
    ``--max-cudagraph-capture-size`` / ``--cudagraph-capture-sizes`` (tokens, divided by the decode
    query length K + 1 into requests), ``--gpu-memory-utilization``, ``--[en|dis]able-prefix-caching``.
    Runs after the speculative config (K must be known)."""
    from specc.engines.vllm.exporter import query_len
    from specc.plan.load import plan_from_dict

    p = out.plan
    raw = v.get("structured_outputs_config")
    if raw is not None:
        try:
            cfg = load_json(raw, "--structured-outputs-config", error=ValueError) if isinstance(raw, str) else dict(raw)
            if not isinstance(cfg, dict):
                raise ValueError("not a JSON object")
        except (ValueError, TypeError) as exc:
            out.errors.append(f"--structured-outputs-config {raw!r} is not a JSON object ({exc})")
            cfg = {}
        if cfg.get("backend") is not None:
            put(p, "deploy.structured_output.backend", cfg["backend"])
        for key, value in cfg.items():
            if key != "backend":
                out.unmapped.append(f"structured_outputs_config.{key}={json.dumps(value)}")
    if v.get("reasoning_parser"):
        name = str(v["reasoning_parser"])
        if name.lower() != "none":  # vLLM reads `none` as unset (engine/arg_utils.py:188-190)
            put(p, "deploy.reasoning_parser", name)
    try:
        q = query_len(plan_from_dict({k: x for k, x in p.items() if k in ("method",)}, validate=False))
    except Exception:  # noqa: BLE001 - a malformed method section is reported elsewhere
        q = 1

    def requests(tokens: Any, flag: str) -> Optional[int]:
        n = human_int(tokens)
        if n is None:
            out.errors.append(f"{flag} {tokens!r}: expects an integer")
            return None
        if n < 1:
            out.errors.append(f"{flag} {n}: a CUDA graph captures at least one token (left out of the plan)")
            return None
        if n % q:
            out.notes.append(f"{flag} {n}: not a multiple of the decode query length K + 1 = {q}; a uniform decode "
                             f"batch of {plural(n // q, 'request')} is the largest it covers (taken as the plan's value)")
        return max(n // q, 1)

    if "max_cudagraph_capture_size" in v:
        put(p, "deploy.cuda_graph_max_bs", requests(v["max_cudagraph_capture_size"], "--max-cudagraph-capture-size"))
    if v.get("cudagraph_capture_sizes"):
        sizes = [requests(t, "--cudagraph-capture-sizes") for t in v["cudagraph_capture_sizes"]]
        put(p, "deploy.cuda_graph_batch_sizes", sorted({s for s in sizes if s is not None}) or None)
    if "gpu_memory_utilization" in v:
        try:
            frac = float(str(v["gpu_memory_utilization"]).strip())
        except ValueError:
            out.errors.append(f"--gpu-memory-utilization {v['gpu_memory_utilization']!r}: expects a number")
            frac = None
        if frac is not None and not 0.0 < frac <= 1.0:
            out.errors.append(f"--gpu-memory-utilization {frac}: vLLM refuses it at startup (field `gt=0, le=1`, "
                              f"vllm/config/cache.py:215); write e.g. 0.9 (left out of the plan)")
            frac = None
        put(p, "deploy.memory_fraction", frac)
    if v.get("enable_prefix_caching") is not None:
        put(p, "deploy.prefix_caching", bool(v["enable_prefix_caching"]))
