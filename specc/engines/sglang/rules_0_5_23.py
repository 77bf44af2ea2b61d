"""SGLang 0.5.23: every speculative-decoding compatibility rule of its argument resolution
(``sglang/srt/arg_groups/*_hook.py``, ``overrides.py``, ``pipeline.py``; the adaptive controller,
tree and disaggregation facts of ``sglang/srt/speculative/``) whose condition can be written in
plan keys, in the order SGLang resolves its arguments.

Plan -> SGLang mapping used by the predicates (the exporter uses the same one), read from the method
registry's rows (``Method.sglang_algorithm``, ``sglang_flag``, ``sglang_multi_layer``):
``method.name`` draft_model->STANDALONE, eagle->EAGLE, eagle3->EAGLE3, mtp->NEXTN (becomes EAGLE),
multi_layer_eagle->EAGLE + ``--enable-multi-layer-eagle``, frozen_kv_mtp->FROZEN_KV_MTP,
ngram->NGRAM (``method.topk`` -> ``--speculative-ngram-max-bfs-breadth``), dflash->DFLASH
(``--speculative-dflash-block-size`` = γ + 1), dspark->DSPARK (``--speculative-dspark-block-size`` = γ),
custom->a registered plugin named by ``method.plugin``; medusa and suffix have no SGLang algorithm.
``verify.rule=standard`` + ``draft_sampling=probabilistic`` -> ``--speculative-use-rejection-sampling``;
``verify.rule=block`` -> ``--speculative-use-block-verification``; ``verify.rule=synthetic`` ->
``SGLANG_SIMULATE_ACC_LEN``; ``schedule.kind=adaptive`` -> ``--speculative-adaptive`` (buckets ->
``--speculative-adaptive-config``); ``schedule.ragged_verify`` -> ``SGLANG_RAGGED_VERIFY_MODE``;
``schedule.cost_table`` -> ``--speculative-dspark-sps-table-path``; ``deploy.parallel.dp_attention``
-> ``--enable-dp-attention``; ``runtime.device`` cpu -> ``--device cpu`` (auto/cuda -> cuda).

Sources are ``file:line`` under ``sglang/srt/`` of the sglang 0.5.23 wheel.
"""
from __future__ import annotations

import functools

from specc.check.base import (Profile, Rule, bucket_candidates, gt, lora, ne, ngram_window_set,
                              rejection_sampling, thresholds_set)



def sglang_algorithm(name: str):
    """The SGLang algorithm method ``name`` runs as, after aliasing, from the method registry's row
    (``Method.sglang_algorithm``): None for plain decoding (a method that drafts nothing), ``"?"`` when
    SGLang has no such algorithm or the registry no such method."""
    from specc import methods

    m = methods.METHODS.get(name)
    if m is None:
        return "?"
    if not m.drafts:
        return None
    return m.sglang_algorithm or "?"


def __getattr__(name):
    if name == "ALGO":  # method name -> algorithm (see sglang_algorithm), over the registry when asked
        from specc import methods

        return {n: sglang_algorithm(n) for n in methods.METHODS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")  # _handle_eagle_family (speculative_hook.py:1062-1282)
GEMMA4_ASSISTANTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
MTP_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
             "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "MistralLarge3ForCausalLM",
             "PixtralForConditionalGeneration", "HYV3ForCausalLM", "HYV4ForCausalLM", "Qwen4ExpForCausalLM")
DEFAULT_MAX_RUNNING = 48
DEFAULT_ADAPTIVE_BUCKETS = {  # adaptive_spec_params.py:28-53
    1: {"candidates": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0.0},
    8: {"candidates": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0.0},
    32: {"candidates": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0.0},
    64: {"candidates": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0.0},
}


def _plan_method(algorithm: str) -> str:
    """The registered plan method SGLang's ``algorithm`` runs (the first in registry order; the method
    row's ``sglang_algorithm``, not a name map here)."""
    from specc import methods

    found = [n for n, m in methods.METHODS.items() if m.sglang_algorithm == algorithm and not m.sglang_multi_layer]
    return found[0] if found else algorithm.lower()


def algo(p):
    """SGLang ``--speculative-algorithm`` after aliasing (None = no speculation, '?' = no such algorithm)."""
    return sglang_algorithm(p.method.name)


def spec(p) -> bool:
    return algo(p) is not None


def cpu(p) -> bool:
    return p.runtime.device == "cpu"


def adaptive(p) -> bool:
    """``--speculative-adaptive`` on a speculative plan (without an algorithm the hook never runs)."""
    return spec(p) and p.schedule.kind == "adaptive"


def multi_layer(p) -> bool:
    """``--enable-multi-layer-eagle`` (``Method.sglang_multi_layer``): one MTP module per draft step."""
    from specc import methods

    m = methods.METHODS.get(p.method.name)
    return m is not None and m.sglang_multi_layer


def is_eagle(p) -> bool:
    """``SpeculativeAlgorithm.is_eagle()``: EAGLE, EAGLE3, FROZEN_KV_MTP (spec_info.py:102-109)."""
    return algo(p) in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP")


def rs(p) -> bool:
    """Rejection sampling is on (block verification turns it on for EAGLE/EAGLE3, G6)."""
    return rejection_sampling(p) or (p.verify.rule == "block" and algo(p) in ("EAGLE", "EAGLE3"))


def eagle_default(p):
    """EG12 auto (steps, topk, draft tokens) by target architecture (speculative_hook.py:1430-1461)."""
    arch = (p.target.architecture or "").lower()
    if algo(p) != "STANDALONE" and (arch in ("llama", "llamaforcausalm", "llamaforcausallm")
                                    or arch.startswith("grok1")):
        return 5, 4, 8
    return 3, 1, 4


def gamma(p):
    return p.method.block_size


def _sets_eg12(p):
    steps, topk, ndt = eagle_default(p)
    return {"method.num_steps": steps, "method.topk": topk, "method.num_draft_tokens": ndt}


def _middle(p):
    cands = bucket_candidates(p) or [0, 1, 3, 5, 7]
    return cands[len(cands) // 2]


def _bucket_bad(p) -> bool:
    b = p.schedule.buckets or {}
    return any(not bucket.candidates or any((not isinstance(c, int)) or c < 0 for c in bucket.candidates)
               for bucket in b.values())


def pp_spec_env(f) -> bool:
    """``SGLANG_ENABLE_PP_SPEC`` set in the launch environment (a launch fact; a plan checked on its
    own assumes it unset, SGLang's default, environ.py:1557)."""
    return str(f.flag("SGLANG_ENABLE_PP_SPEC", "0")).strip().lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=8)
def _hw_memory_mib(name: str):
    from specc.predict import cost
    from specc.errors import PlanError

    try:
        mem = cost.load_hardware_profile(name).memory_bytes
    except PlanError:
        return None
    return mem / (1 << 20) if mem else None


def gpu_mem_mib(p):
    """The GPU memory SGLang sizes its defaults from (MiB, ``get_device_memory_capacity``): the plan's
    hardware profile (``schedule.hardware``, else h100 on CUDA); None on a CPU or without a figure."""
    from specc.predict.sizing import default_hardware

    if cpu(p):
        return None
    return _hw_memory_mib(default_hardware(p))


def _hw_name(p) -> str:
    """The hardware profile's own name (``name:`` of a profile file given by path), for messages."""
    from specc.predict import cost
    from specc.predict.sizing import default_hardware
    from specc.errors import PlanError

    name = default_hardware(p)
    try:
        return cost.load_hardware_profile(name).name
    except PlanError:
        return name


def memory_tier(p):
    """(chunked_prefill_size, decode CUDA-graph max batch) SGLang picks from the GPU memory and TP size
    (arg_groups/memory_hook.py:85-180; 4096 and 160 when the memory is unknown)."""
    mem, tp = gpu_mem_mib(p), p.deploy.parallel.tp or 1
    if mem is None:
        return 4096, 160
    for limit, chunk, small, large in ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160),
                                       (60 * 1024, 4096, 32, 160), (90 * 1024, 8192, 256, 512),
                                       (160 * 1024, 8192, 256, 512)):
        if mem < limit:
            return chunk, small if tp < 4 else large
    return 16384, 512


def graphs_on(p) -> bool:
    return not cpu(p) and p.deploy.cuda_graphs is not False


def _fill_max_bs(p):
    """memory_hook.py:99-188, 200-207: the tier's max batch, capped by an explicit
    --max-running-requests; an explicit batch-size list sets it to its largest entry."""
    if p.deploy.cuda_graph_batch_sizes:
        return {"deploy.cuda_graph_max_bs": max(p.deploy.cuda_graph_batch_sizes)}
    bs = memory_tier(p)[1]
    if isinstance(p.deploy.max_running_requests, int) and bs > p.deploy.max_running_requests:
        bs = p.deploy.max_running_requests
    return {"deploy.cuda_graph_max_bs": bs}


def reserved_mib(p) -> float:
    """SGLang's reserve for activations and CUDA graphs when it picks --mem-fraction-static
    (memory_hook.py:281-322): 512 + 1.5 MiB per activation token + tp·pp/8 GiB + 2 MiB per decode
    graph batch, at least 10 GiB on GPUs above 60 GiB."""
    mem = gpu_mem_mib(p)
    chunk = memory_tier(p)[0]
    par = p.deploy.parallel
    max_bs = p.deploy.cuda_graph_max_bs or 0
    if p.deploy.disagg.role == "decode":
        running = p.deploy.max_running_requests or max_bs or 1
        tokens = max(running * (p.method.num_draft_tokens or 1), 2048)
    else:
        tokens = max(chunk, 2048)
    reserved = 512 + tokens * 1.5 + (par.tp or 1) * (par.pp or 1) / 8 * 1024
    if p.deploy.disagg.role != "prefill" and graphs_on(p):
        reserved += max_bs * 2
        if par.dp_attention:
            reserved += max_bs * (par.dp or 1) * 3 + (max_bs * (par.dp or 1) * 1.5 if max_bs > 300 else 0)
    if mem is not None and mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def _fill_fraction(p):
    mem = gpu_mem_mib(p)
    return {"deploy.memory_fraction": round((mem - reserved_mib(p)) / mem, 3)}


def _norm(name) -> str:
    return str(name).lower().replace("-", "_")


def _names(kind: str):
    from specc.engines import names as engine_names

    return engine_names.grammar_backends("sglang") if kind == "backend" else engine_names.reasoning_parsers("sglang")


def _hint(name, kind: str) -> str:
    from specc.engines import names as engine_names

    return engine_names.did_you_mean(name, _names(kind))


def grammar_requests(p) -> bool:
    return p.deploy.structured_output.requests is True


R = Rule
RULES = (
    # ---- 3.1 naming -----------------------------------------------------------------------------
    R("N5", "error", ("method.name",), lambda p: algo(p) == "?",
      "method.name={p.method.name}: SGLang 0.5.23 has no such speculative algorithm (builtins: EAGLE, EAGLE3, "
      "NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, FROZEN_KV_MTP, UNO, or a registered plugin); pick another "
      "method or set engine=vllm (suffix) / engine=specc", "speculative/spec_info.py:65"),
    R("N5b", "error", ("method.name", "method.plugin"), lambda p: algo(p) == "PLUGIN" and not p.method.plugin,
      "method.name=custom needs method.plugin (the module that registers the algorithm with "
      "sglang.srt.speculative.spec_registry); an unregistered name is rejected", "speculative/spec_info.py:65"),
    R("N11", "warning", ("method.plugin",), lambda p: algo(p) == "PLUGIN" and bool(p.method.plugin),
      "method.plugin={p.method.plugin}: a plugin algorithm must call spec_registry.register() on import and "
      "runs its own validate_server_args; specc cannot check its rules", "arg_groups/speculative_hook.py:245-250"),
    R("N4", "error", ("method.name", "draft.architecture"),
      lambda p: algo(p) == "EAGLE3" and p.draft is not None and p.draft.architecture in GEMMA4_ASSISTANTS,
      "draft.architecture={p.draft.architecture} is a Gemma4 assistant, which needs method.name=eagle or mtp "
      "(promoted to FROZEN_KV_MTP), not eagle3", "arg_groups/speculative_hook.py:102-107"),
    R("N2", "fallback", ("method.name", "draft.architecture"),
      lambda p: algo(p) == "EAGLE" and not multi_layer(p) and p.draft is not None
      and p.draft.architecture in GEMMA4_ASSISTANTS,
      "method.name={p.method.name} with a Gemma4 assistant draft ({p.draft.architecture}) is promoted to "
      "FROZEN_KV_MTP; write method.name={new[method.name]} to say so", "arg_groups/speculative_hook.py:97-115",
      lambda p: {"method.name": _plan_method("FROZEN_KV_MTP")}),
    R("N18", "error", ("schedule.ragged_verify",),
      lambda p: p.schedule.ragged_verify not in ("static", "cap_accept", "compact"),
      "schedule.ragged_verify={p.schedule.ragged_verify}: SGLANG_RAGGED_VERIFY_MODE must be static, cap-accept "
      "or compact (checked for every algorithm)", "speculative/ragged_verify.py:19-27"),
    # ---- deployment settings resolved before the speculative hook (pipeline.py:218, 259, 302) ----
    R("SO1", "error", ("deploy.structured_output.backend",),
      lambda p: p.deploy.structured_output.backend is not None
      and p.deploy.structured_output.backend not in _names("backend"),
      "deploy.structured_output.backend={p.deploy.structured_output.backend}: SGLang's --grammar-backend takes "
      "{names}{hint} (argparse refuses other names at launch)",
      "arg_groups/choices.py:131; arg_groups/fields/exec_.py:266-272",
      message_args=lambda p: {"names": ", ".join(_names("backend")),
                              "hint": _hint(p.deploy.structured_output.backend, "backend")}),
    R("RP1", "error", ("deploy.reasoning_parser",),
      lambda p: p.deploy.reasoning_parser is not None and p.deploy.reasoning_parser not in _names("parser"),
      "deploy.reasoning_parser={p.deploy.reasoning_parser} is not one of SGLang 0.5.23's --reasoning-parser "
      "choices{hint} (argparse refuses it at launch)", "server_args.py:367-372",
      message_args=lambda p: {"hint": _hint(p.deploy.reasoning_parser, "parser")}),
    R("CG1", "filled", ("deploy.cuda_graph_max_bs", "deploy.max_running_requests", "deploy.parallel.tp"),
      lambda p: graphs_on(p) and p.deploy.cuda_graph_max_bs is None,
      "deploy.cuda_graph_max_bs unset: SGLang captures decode/verify graphs up to "
      "{new[deploy.cuda_graph_max_bs]:~request} ({why})", "arg_groups/memory_hook.py:99-188, 200-207", _fill_max_bs,
      message_args=lambda p: {"why": "the largest of deploy.cuda_graph_batch_sizes" if p.deploy.cuda_graph_batch_sizes
                              else (f"capped by deploy.max_running_requests" if isinstance(p.deploy.max_running_requests, int)
                                    and p.deploy.max_running_requests < memory_tier(p)[1]
                                    else f"its default for {_hw_name(p)}'s memory at tp {p.deploy.parallel.tp}")}),
    R("CG2", "fallback", ("deploy.cuda_graph_max_bs", "deploy.cuda_graph_batch_sizes"),
      lambda p: graphs_on(p) and bool(p.deploy.cuda_graph_batch_sizes) and p.deploy.cuda_graph_max_bs is not None
      and p.deploy.cuda_graph_max_bs != max(p.deploy.cuda_graph_batch_sizes),
      "deploy.cuda_graph_batch_sizes is given: SGLang sets the decode max batch to its largest entry, "
      "deploy.cuda_graph_max_bs={p.deploy.cuda_graph_max_bs} becomes {new[deploy.cuda_graph_max_bs]}",
      "arg_groups/memory_hook.py:200-207",
      lambda p: {"deploy.cuda_graph_max_bs": max(p.deploy.cuda_graph_batch_sizes)}),
    R("MEM1", "filled", ("deploy.memory_fraction",),
      lambda p: p.deploy.memory_fraction is None and gpu_mem_mib(p) is not None,
      "deploy.memory_fraction unset: SGLang takes (GPU memory − reserve) / GPU memory = "
      "{new[deploy.memory_fraction]} of {hw}'s {mem:.0f} MiB for weights + KV pool, reserving {res:.0f} MiB "
      "for activations and CUDA graphs", "arg_groups/memory_hook.py:281-333", _fill_fraction,
      message_args=lambda p: {"hw": _hw_name(p), "mem": gpu_mem_mib(p), "res": reserved_mib(p)}),
    R("SO2", "filled", ("deploy.structured_output.backend",),
      lambda p: p.deploy.structured_output.backend is None,
      "deploy.structured_output.backend unset: SGLang compiles grammars with xgrammar",
      "arg_groups/serving_hook.py:239-244", lambda p: {"deploy.structured_output.backend": "xgrammar"}),
    R("SO3", "error", ("deploy.structured_output.backend", "deploy.structured_output.requests"),
      lambda p: p.deploy.structured_output.backend == "none" and grammar_requests(p),
      "deploy.structured_output.backend=none with requests that carry a grammar: SGLang aborts each of them "
      "(\"Grammar-based generation ... is not supported when the server is launched with --grammar-backend "
      "none\"); pick xgrammar, outlines or llguidance", "constrained/grammar_manager.py:148-159"),
    R("PC1", "filled", ("deploy.prefix_caching", "deploy.disagg.role"),
      lambda p: p.deploy.prefix_caching is None,
      "deploy.prefix_caching unset: {why}",
      "arg_groups/fields/memory.py:64-70; arg_groups/fields/disagg.py:88-91",
      lambda p: {"deploy.prefix_caching": p.deploy.disagg.role != "decode"},
      message_args=lambda p: {"why": "a decode node runs without a radix cache unless "
                              "--disaggregation-decode-enable-radix-cache" if p.deploy.disagg.role == "decode"
                              else "SGLang's radix cache reuses shared prompt prefixes (on by default)"}),
    R("PPO", "fallback", ("deploy.overlap_scheduler", "deploy.parallel.pp"),
      lambda p: gt(p.deploy.parallel.pp, 1) and p.deploy.overlap_scheduler is not False,
      "deploy.parallel.pp={p.deploy.parallel.pp}: SGLang turns the overlap scheduler off (\"Pipeline parallelism "
      "is incompatible with overlap schedule\")", "arg_groups/overrides.py:1623-1627",
      lambda p: {"deploy.overlap_scheduler": False}),
    # ---- 3.2 generic ----------------------------------------------------------------------------
    R("G4", "error", ("verify.rule", "method.name"),
      lambda p: spec(p) and p.verify.rule == "block" and algo(p) not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK"),
      "verify.rule=block: SGLang block verification supports only eagle, eagle3, mtp, dflash and dspark, not "
      "method.name={p.method.name}; use verify.rule=standard", "arg_groups/speculative_hook.py:175-180"),
    R("G5", "error", ("verify.rule", "runtime.device"), lambda p: spec(p) and p.verify.rule == "block" and cpu(p),
      "verify.rule=block needs CUDA or ROCm, but runtime.device=cpu; use verify.rule=standard or a GPU",
      "arg_groups/speculative_hook.py:181-184"),
    R("G6", "fallback", ("verify.rule", "verify.draft_sampling"),
      lambda p: p.verify.rule == "block" and algo(p) in ("EAGLE", "EAGLE3")
      and p.verify.draft_sampling != "probabilistic",
      "verify.rule=block with {p.method.name} turns on rejection sampling, which reads the draft's "
      "probabilities: verify.draft_sampling becomes probabilistic", "arg_groups/speculative_hook.py:187-195",
      lambda p: {"verify.draft_sampling": "probabilistic"}),
    R("G13", "fallback", ("deploy.overlap_scheduler", "runtime.device"),
      lambda p: cpu(p) and (is_eagle(p) or algo(p) in ("STANDALONE", "NGRAM")) and p.deploy.overlap_scheduler
      is not False,
      "runtime.device=cpu: the overlap scheduler is not implemented on CPU for {p.method.name}; "
      "deploy.overlap_scheduler becomes false", "arg_groups/speculative_hook.py:66-78",
      lambda p: {"deploy.overlap_scheduler": False}),
    # ---- 3.3 adaptive: resolved before the per-algorithm handler (speculative_hook.py:261-264) ---
    R("AD1", "fallback", ("schedule.kind", "method.name"),
      lambda p: adaptive(p) and algo(p) not in ("EAGLE", "EAGLE3"),
      "schedule.kind=adaptive supports only eagle/eagle3 (got {p.method.name}); SGLang warns and runs a "
      "static schedule", "speculative/adaptive_spec_params.py:61-65", lambda p: {"schedule.kind": "static"}),
    R("AD3", "fallback", ("schedule.kind", "method.topk"), lambda p: adaptive(p) and ne(p.method.topk, 1),
      "schedule.kind=adaptive needs method.topk=1 (got {p.method.topk}); SGLang falls back to static",
      "speculative/adaptive_spec_params.py:75-79", lambda p: {"schedule.kind": "static"}),
    R("AD4", "fallback", ("schedule.kind", "deploy.parallel.dp_attention"),
      lambda p: adaptive(p) and p.deploy.parallel.dp_attention,
      "schedule.kind=adaptive with deploy.parallel.dp_attention: κ decisions are not synchronized across DP "
      "ranks, so SGLang falls back to static", "speculative/adaptive_spec_params.py:80-84",
      lambda p: {"schedule.kind": "static"}),
    R("AD5", "fallback", ("schedule.kind", "method.name"), lambda p: adaptive(p) and multi_layer(p),
      "schedule.kind=adaptive: the multi-layer EAGLE worker has no adaptive support; static schedule used",
      "speculative/adaptive_spec_params.py:85-89", lambda p: {"schedule.kind": "static"}),
    R("AD6", "fallback", ("schedule.kind", "deploy.parallel.two_batch_overlap"),
      lambda p: adaptive(p) and p.deploy.parallel.two_batch_overlap,
      "schedule.kind=adaptive with deploy.parallel.two_batch_overlap: the state swap would drop the TBO "
      "wrapper; static schedule used", "speculative/adaptive_spec_params.py:90-94",
      lambda p: {"schedule.kind": "static"}),
    R("AD12", "error", ("schedule.buckets",), lambda p: adaptive(p) and _bucket_bad(p),
      "schedule.buckets: every bucket needs a non-empty list of candidates >= 0 (adaptive config)",
      "speculative/adaptive_spec_params.py:117-138"),
    R("AD0", "filled", ("schedule.buckets",), lambda p: adaptive(p) and not p.schedule.buckets,
      "schedule.buckets unset: SGLang uses DEFAULT_ADAPTIVE_CONFIG (BS1 [1,3,5,7], BS8 [0,1,3], BS32 [0,1], "
      "BS64 [0])", "speculative/adaptive_spec_params.py:28-53",
      lambda p: {"schedule.buckets": _default_buckets()}),
    R("AD0b", "filled", ("schedule.ema_alpha", "schedule.update_interval", "schedule.warmup_batches"),
      lambda p: adaptive(p) and (p.schedule.ema_alpha is None or p.schedule.update_interval is None
                                 or p.schedule.warmup_batches is None),
      "adaptive controller defaults: schedule.ema_alpha={new[schedule.ema_alpha]}, schedule.update_interval="
      "{new[schedule.update_interval]}, schedule.warmup_batches={new[schedule.warmup_batches]}",
      "speculative/adaptive_spec_params.py:171-176",
      lambda p: {"schedule.ema_alpha": 0.2 if p.schedule.ema_alpha is None else p.schedule.ema_alpha,
                 "schedule.update_interval": 5 if p.schedule.update_interval is None else p.schedule.update_interval,
                 "schedule.warmup_batches": 10 if p.schedule.warmup_batches is None else p.schedule.warmup_batches}),
    R("AD8", "filled", ("method.topk",), lambda p: adaptive(p) and p.method.topk is None,
      "schedule.kind=adaptive: method.topk is set to 1", "arg_groups/speculative_hook.py:1402-1407",
      lambda p: {"method.topk": 1}),
    R("AD9", "filled", ("method.num_steps",), lambda p: adaptive(p) and p.method.num_steps is None,
      "schedule.kind=adaptive: method.num_steps starts at the middle of the candidate union, "
      "{new[method.num_steps]}", "arg_groups/speculative_hook.py:1409-1414",
      lambda p: {"method.num_steps": _middle(p)}),
    R("AD10", "error", ("method.num_steps", "schedule.buckets"),
      lambda p: adaptive(p) and isinstance(p.method.num_steps, int) and bool(bucket_candidates(p))
      and p.method.num_steps not in bucket_candidates(p),
      "method.num_steps={p.method.num_steps} is not among the adaptive candidates; pick one of the "
      "schedule.buckets candidates", "arg_groups/speculative_hook.py:1416-1421"),
    R("AD11", "fallback", ("method.num_draft_tokens",),
      lambda p: adaptive(p) and isinstance(p.method.num_steps, int)
      and p.method.num_draft_tokens != p.method.num_steps + 1,
      "schedule.kind=adaptive: method.num_draft_tokens is forced to num_steps + 1 = "
      "{new[method.num_draft_tokens]}", "arg_groups/speculative_hook.py:1423-1427",
      lambda p: {"method.num_draft_tokens": p.method.num_steps + 1}),
    # ---- 3.4 EAGLE family (and the shared max_running_requests defaults) ------------------------
    R("EG2", "error", ("method.name", "deploy.parallel.dp_attention"),
      lambda p: algo(p) == "STANDALONE" and p.deploy.parallel.dp_attention,
      "method.name=draft_model (STANDALONE) does not support deploy.parallel.dp_attention=true; turn DP "
      "attention off or use eagle3", "arg_groups/speculative_hook.py:1078-1084"),
    R("EG3", "fallback", ("deploy.max_running_requests",),
      lambda p: algo(p) in EAGLE_FAMILY and p.deploy.max_running_requests is None,
      "deploy.max_running_requests is unset: SGLang sets it to 48 for speculative decoding; set it to size "
      "the batch yourself", "arg_groups/speculative_hook.py:1086-1094",
      lambda p: {"deploy.max_running_requests": DEFAULT_MAX_RUNNING}),
    R("EG4", "warning", ("deploy.overlap_scheduler",),
      lambda p: algo(p) in EAGLE_FAMILY and p.deploy.overlap_scheduler is False,
      "deploy.overlap_scheduler=false: SGLang runs the slower non-overlap spec-v2 worker for {p.method.name}",
      "arg_groups/speculative_hook.py:1098-1102"),
    R("EG6", "filled", ("draft.path", "target.architecture"),
      lambda p: algo(p) == "EAGLE" and p.target.architecture in MTP_ARCHS and (p.draft is None or not p.draft.path),
      "target.architecture={p.target.architecture} carries MTP layers: draft.path is set to target.path",
      "arg_groups/speculative_hook.py:1120-1148", lambda p: {"draft.path": p.target.path}),
    R("EG7", "warning", ("draft.path", "target.architecture"),
      lambda p: algo(p) == "EAGLE" and p.target.architecture in MTP_ARCHS and p.target.architecture not in
      ("MistralLarge3ForCausalLM", "PixtralForConditionalGeneration") and p.draft is not None
      and bool(p.draft.path) and p.draft.path != p.target.path,
      "draft.path={p.draft.path}: target {p.target.architecture} has MTP layers and does not need a separate "
      "draft; drop draft.path", "arg_groups/speculative_hook.py:1149-1156"),
    R("EG11", "error", ("method.num_steps", "method.topk", "method.num_draft_tokens"),
      lambda p: algo(p) in EAGLE_FAMILY and not adaptive(p) and p.method.num_steps is None
      and (p.method.topk is not None or p.method.num_draft_tokens is not None),
      "method.num_steps is unset while method.topk/num_draft_tokens are set: SGLang fails `assert "
      "speculative_eagle_topk is None and speculative_num_draft_tokens is None` (also when an adaptive "
      "schedule was just turned off); set method.num_steps too (or none of the three)",
      "arg_groups/speculative_hook.py:1159-1163"),
    R("EG12", "filled", ("method.num_steps", "method.topk", "method.num_draft_tokens"),
      lambda p: algo(p) in EAGLE_FAMILY and not adaptive(p) and p.method.num_steps is None
      and p.method.topk is None and p.method.num_draft_tokens is None,
      "method.num_steps/topk/num_draft_tokens unset: SGLang picks {new[method.num_steps]}/{new[method.topk]}/"
      "{new[method.num_draft_tokens]} for this target", "arg_groups/speculative_hook.py:1164-1174, 1430-1461",
      _sets_eg12),
    R("EG13", "error", ("deploy.attention_backend", "method.topk"),
      lambda p: algo(p) in EAGLE_FAMILY and p.deploy.attention_backend == "trtllm_mha" and gt(p.method.topk, 1),
      "deploy.attention_backend=trtllm_mha supports only method.topk=1 (got {p.method.topk}); use topk 1 or "
      "another backend", "arg_groups/speculative_hook.py:1176-1180"),
    R("EG15", "error", ("verify.rule", "verify.draft_sampling", "method.name"),
      lambda p: algo(p) == "STANDALONE" and rejection_sampling(p),
      "verify.rule=standard with draft_sampling=probabilistic (rejection sampling) is not implemented for "
      "method.name=draft_model; use verify.draft_sampling=greedy or eagle/eagle3",
      "arg_groups/speculative_hook.py:1210-1220"),
    R("EG16", "error", ("verify.rule", "verify.draft_sampling", "method.topk"),
      lambda p: algo(p) in ("EAGLE", "EAGLE3") and rs(p) and ne(p.method.topk, 1),
      "rejection sampling (verify.rule={p.verify.rule}, draft_sampling={p.verify.draft_sampling}) needs "
      "method.topk=1, got {p.method.topk}; set topk 1 or verify.draft_sampling=greedy",
      "arg_groups/speculative_hook.py:1221-1224"),
    R("EG18", "error", ("verify.accept_threshold.single", "verify.accept_threshold.acc"),
      lambda p: algo(p) in ("EAGLE", "EAGLE3") and rs(p) and thresholds_set(p),
      "verify.accept_threshold.single/acc must stay 1.0 with rejection sampling; drop them or use "
      "verify.draft_sampling=greedy", "arg_groups/speculative_hook.py:1231-1240"),
    R("EG19", "error", ("method.name", "method.topk"),
      lambda p: multi_layer(p) and rs(p) and ne(p.method.topk, 1),
      "method.name=multi_layer_eagle with rejection sampling is chain-only: set method.topk=1",
      "arg_groups/speculative_hook.py:1241-1249"),
    R("EG20", "fallback", ("method.topk", "method.num_steps", "method.num_draft_tokens"),
      lambda p: algo(p) in EAGLE_FAMILY and p.method.topk == 1 and isinstance(p.method.num_steps, int)
      and p.method.num_draft_tokens != p.method.num_steps + 1,
      "method.topk=1 is a chain: method.num_draft_tokens becomes num_steps + 1 = {new[method.num_draft_tokens]}",
      "arg_groups/speculative_hook.py:1255-1266",
      lambda p: {"method.num_draft_tokens": p.method.num_steps + 1}),
    R("EG21T", "error", ("method.topk", "method.num_steps"),
      lambda p: algo(p) in EAGLE_FAMILY and p.method.topk is None and p.method.num_steps is not None,
      "method.topk is unset while method.num_steps={p.method.num_steps} is set: SGLang compares "
      "`speculative_eagle_topk > 1` and crashes with a TypeError ('>' not supported between 'NoneType' and "
      "'int'); set method.topk (1 for a chain) or leave num_steps/topk/num_draft_tokens all unset",
      "arg_groups/speculative_hook.py:1271-1275"),
    R("EG21", "error", ("method.topk", "deploy.page_size", "deploy.attention_backend"),
      lambda p: algo(p) in EAGLE_FAMILY and gt(p.method.topk, 1) and gt(p.deploy.page_size, 1)
      and p.deploy.attention_backend is not None and p.deploy.attention_backend not in ("flashinfer", "fa3", "triton"),
      "method.topk>1 with deploy.page_size={p.deploy.page_size} needs deploy.attention_backend flashinfer, fa3 "
      "or triton (got {p.deploy.attention_backend})", "arg_groups/speculative_hook.py:1271-1282"),
    R("RS1", "warning", ("verify.rule", "verify.draft_sampling", "method.name"),
      lambda p: algo(p) in ("DSPARK", "DFLASH", "NGRAM", "FROZEN_KV_MTP") and rejection_sampling(p),
      "verify.draft_sampling=probabilistic (rejection sampling) is silently ignored for "
      "method.name={p.method.name}: SGLang never reads the flag there; use verify.draft_sampling=greedy",
      "speculative/spec_info.py:255-266"),
    R("RS4", "error", ("draft.vocab_size", "target.vocab_size", "verify.draft_sampling"),
      lambda p: rs(p) and p.draft is not None and ne(p.draft.vocab_size, p.target.vocab_size)
      and p.target.vocab_size is not None and algo(p) != "EAGLE3",
      "rejection sampling needs draft probabilities over the target vocabulary, but draft.vocab_size="
      "{p.draft.vocab_size} != target.vocab_size={p.target.vocab_size}; use verify.draft_sampling=greedy",
      "speculative/eagle_utils.py:739-748"),
    R("AD15", "error", ("schedule.kind", "deploy.parallel.pp"), lambda p: adaptive(p) and gt(p.deploy.parallel.pp, 1),
      "schedule.kind=adaptive is not compatible with deploy.parallel.pp={p.deploy.parallel.pp} under "
      "SGLANG_ENABLE_PP_SPEC (assertion); use pp 1 or a static schedule", "arg_groups/validation_hook.py:150-152",
      decide=lambda p, f: pp_spec_env(f)),
    R("ML4", "error", ("method.name", "method.num_draft_tokens", "method.num_steps"),
      lambda p: multi_layer(p) and isinstance(p.method.num_steps, int)
      and ne(p.method.num_draft_tokens, p.method.num_steps + 1),
      "method.name=multi_layer_eagle asserts method.num_draft_tokens == num_steps + 1",
      "speculative/multi_layer_eagle_worker_v2.py:150"),
    # ---- 3.6 DFLASH -------------------------------------------------------------------------------
    R("DF1", "error", ("method.name", "runtime.device"), lambda p: algo(p) == "DFLASH" and cpu(p),
      "method.name=dflash is not supported on runtime.device=cpu (cuda, npu or xpu only)",
      "arg_groups/speculative_hook.py:290-301"),
    R("DF3", "error", ("method.name", "deploy.parallel.dp_attention"),
      lambda p: algo(p) == "DFLASH" and p.deploy.parallel.dp_attention and not cpu(p),
      "method.name=dflash with deploy.parallel.dp_attention=true: SGLang refuses (\"DFLASH with dp attention "
      "requires --enable-dp-lm-head.\"); launch with --enable-dp-lm-head (it has no plan key; "
      "`specc check --sglang-args` sees it) or turn dp_attention off", "arg_groups/speculative_hook.py:303-308",
      decide=lambda p, f: not f.flag("enable_dp_lm_head")),
    R("DF6", "error", ("deploy.parallel.pp",), lambda p: algo(p) == "DFLASH" and gt(p.deploy.parallel.pp, 1),
      "method.name=dflash supports only deploy.parallel.pp=1", "arg_groups/speculative_hook.py:319-322"),
    R("DF7", "error", ("draft.path",), lambda p: algo(p) == "DFLASH" and (p.draft is None or not p.draft.path),
      "method.name=dflash needs draft.path (the DFlash draft checkpoint)", "arg_groups/speculative_hook.py:324-327"),
    R("DF8", "fallback", ("method.num_steps",), lambda p: algo(p) == "DFLASH" and p.method.num_steps != 1,
      "method.name=dflash drafts a whole block in one pass: method.num_steps becomes 1",
      "arg_groups/speculative_hook.py:334-349", lambda p: {"method.num_steps": 1}),
    R("DF9", "fallback", ("method.topk",), lambda p: algo(p) == "DFLASH" and p.method.topk != 1,
      "method.name=dflash is a chain: method.topk becomes 1", "arg_groups/speculative_hook.py:351-366",
      lambda p: {"method.topk": 1}),
    R("DF10", "error", ("method.block_size",),
      lambda p: algo(p) == "DFLASH" and isinstance(gamma(p), int) and gamma(p) + 1 <= 0,
      "method.block_size must be positive", "arg_groups/speculative_hook.py:368-373"),
    R("DF11", "error", ("method.block_size", "method.num_draft_tokens"),
      lambda p: algo(p) == "DFLASH" and isinstance(gamma(p), int) and ne(p.method.num_draft_tokens, gamma(p) + 1),
      "method.block_size={p.method.block_size} (γ; block = γ + 1) and method.num_draft_tokens="
      "{p.method.num_draft_tokens} disagree; drop num_draft_tokens or set it to block_size + 1",
      "arg_groups/speculative_hook.py:374-382"),
    R("DF12", "filled", ("method.num_draft_tokens",),
      lambda p: algo(p) == "DFLASH" and isinstance(gamma(p), int) and p.method.num_draft_tokens is None,
      "method.num_draft_tokens = method.block_size + 1 = {new[method.num_draft_tokens]} (the DFlash block)",
      "arg_groups/speculative_hook.py:383-387", lambda p: {"method.num_draft_tokens": gamma(p) + 1}),
    R("DF13", "fallback", ("method.block_size", "method.num_draft_tokens"),
      lambda p: algo(p) == "DFLASH" and p.method.num_draft_tokens is None and gamma(p) is None,
      "method.block_size unset: SGLang reads block_size from the draft config and falls back to 16 if it "
      "cannot; set method.block_size to pin it", "arg_groups/speculative_hook.py:389-425",
      lambda p: {"method.num_draft_tokens": 16}),
    R("DF17", "fallback", ("deploy.max_running_requests",),
      lambda p: algo(p) == "DFLASH" and p.deploy.max_running_requests is None,
      "deploy.max_running_requests unset: SGLang sets 48 for dflash", "arg_groups/speculative_hook.py:438-446",
      lambda p: {"deploy.max_running_requests": DEFAULT_MAX_RUNNING}),
    # ---- 3.7 DSPARK ------------------------------------------------------------------------------
    R("DS1", "error", ("method.name", "runtime.device"), lambda p: algo(p) == "DSPARK" and cpu(p),
      "method.name=dspark is not supported on runtime.device=cpu (cuda, npu or xpu only)",
      "arg_groups/speculative_hook.py:669-672"),
    R("DS2", "error", ("method.name", "deploy.parallel.dp_attention"),
      lambda p: algo(p) == "DSPARK" and p.deploy.parallel.dp_attention,
      "method.name=dspark with deploy.parallel.dp_attention=true: SGLang refuses (\"DSpark with dp attention "
      "requires --enable-dp-lm-head.\"); launch with --enable-dp-lm-head (it has no plan key; "
      "`specc check --sglang-args` sees it) or turn dp_attention off", "arg_groups/speculative_hook.py:674-676",
      decide=lambda p, f: not f.flag("enable_dp_lm_head")),
    R("DS7", "error", ("deploy.parallel.pp", "deploy.disagg.role"),
      lambda p: algo(p) == "DSPARK" and gt(p.deploy.parallel.pp, 1) and p.deploy.disagg.role != "prefill",
      "method.name=dspark with deploy.parallel.pp>1 runs only on a PD prefill server "
      "(deploy.disagg.role=prefill)", "arg_groups/speculative_hook.py:713-718"),
    R("DS10", "warning", ("draft.path",), lambda p: algo(p) == "DSPARK" and (p.draft is None or not p.draft.path),
      "draft.path unset for dspark: SGLang uses the target only if it bundles DSpark weights (dspark_* config "
      "keys or a dspark/ subfolder), otherwise it fails; set draft.path", "arg_groups/speculative_hook.py:720-755"),
    R("DS11", "fallback", ("method.num_steps",), lambda p: algo(p) == "DSPARK" and p.method.num_steps != 1,
      "method.name=dspark drafts a block in one pass: method.num_steps becomes 1",
      "arg_groups/speculative_hook.py:757-789", lambda p: {"method.num_steps": 1}),
    R("DS11b", "fallback", ("method.topk",), lambda p: algo(p) == "DSPARK" and p.method.topk != 1,
      "method.name=dspark is a chain: method.topk becomes 1", "arg_groups/speculative_hook.py:757-789",
      lambda p: {"method.topk": 1}),
    R("DS12", "error", ("method.block_size",),
      lambda p: algo(p) == "DSPARK" and isinstance(gamma(p), int) and gamma(p) <= 0,
      "method.block_size (γ) must be positive", "arg_groups/speculative_hook.py:807-812"),
    R("DS13", "fallback", ("method.block_size",),
      lambda p: algo(p) == "DSPARK" and gamma(p) is None and p.method.num_draft_tokens is None,
      "method.block_size (γ) unset: SGLang takes γ from the draft checkpoint, else 7 with a warning; set "
      "method.block_size to pin it", "arg_groups/speculative_hook.py:796-822; speculative/dspark_config.py:21",
      lambda p: {"method.block_size": 7}),
    R("DS14", "error", ("method.block_size", "method.num_draft_tokens"),
      lambda p: algo(p) == "DSPARK" and isinstance(gamma(p), int) and ne(p.method.num_draft_tokens, gamma(p) + 1),
      "method.num_draft_tokens={p.method.num_draft_tokens} must equal method.block_size + 1 = "
      "{p.method.block_size} + 1 for dspark; drop num_draft_tokens", "arg_groups/speculative_hook.py:824-834"),
    R("DS15", "filled", ("method.num_draft_tokens",),
      lambda p: algo(p) == "DSPARK" and isinstance(gamma(p), int) and p.method.num_draft_tokens is None,
      "method.num_draft_tokens = γ + 1 = {new[method.num_draft_tokens]}", "arg_groups/speculative_hook.py:835-839",
      lambda p: {"method.num_draft_tokens": gamma(p) + 1}),
    R("DS17", "error", ("method.num_draft_tokens",),
      lambda p: algo(p) == "DSPARK" and isinstance(p.method.num_draft_tokens, int) and p.method.num_draft_tokens < 2,
      "method.num_draft_tokens must be >= 2 for dspark (γ >= 1)", "arg_groups/speculative_hook.py:846-850"),
    R("DS18", "fallback", ("deploy.max_running_requests",),
      lambda p: algo(p) == "DSPARK" and p.deploy.max_running_requests is None,
      "deploy.max_running_requests unset: SGLang sets 48 for dspark", "arg_groups/speculative_hook.py:852-860",
      lambda p: {"deploy.max_running_requests": DEFAULT_MAX_RUNNING}),
    R("DS20", "warning", ("schedule.cost_table", "schedule.ragged_verify"),
      lambda p: algo(p) == "DSPARK" and bool(p.schedule.cost_table) and p.schedule.ragged_verify == "static",
      "schedule.cost_table is unused with schedule.ragged_verify=static (the budget planner is off); use "
      "cap_accept or compact, or drop cost_table", "arg_groups/speculative_hook.py:878-883"),
    R("DS21", "error", ("schedule.ragged_verify", "method.confidence_head"),
      lambda p: algo(p) == "DSPARK" and p.schedule.ragged_verify != "static" and p.method.confidence_head is False,
      "schedule.ragged_verify={p.schedule.ragged_verify} needs a draft with a confidence head "
      "(method.confidence_head=false); use ragged_verify=static", "speculative/dspark_planner.py:137-147"),
    R("DS22", "warning", ("schedule.ragged_verify", "schedule.cost_table"),
      lambda p: algo(p) == "DSPARK" and p.schedule.ragged_verify != "static" and not p.schedule.cost_table,
      "schedule.ragged_verify={p.schedule.ragged_verify} without schedule.cost_table: a flat SPS table makes "
      "the budget verify every token; profile one (specc profile) and set cost_table",
      "speculative/dspark_planner.py:194-204"),
    R("DS28", "error", ("verify.rule", "schedule.ragged_verify"),
      lambda p: algo(p) == "DSPARK" and p.verify.rule == "synthetic" and p.schedule.ragged_verify != "static",
      "verify.rule=synthetic (SGLANG_SIMULATE_ACC_LEN) with dspark needs schedule.ragged_verify=static",
      "speculative/dspark_components/dspark_worker_v2.py:472-488"),
    R("DS29", "error", ("method.markov.kind",),
      lambda p: algo(p) == "DSPARK" and p.method.markov.kind is not None
      and p.method.markov.kind not in ("vanilla", "gated", "rnn"),
      "method.markov.kind={p.method.markov.kind}: DSpark heads are vanilla, gated or rnn",
      "speculative/dspark_config.py:22, 250-306"),
    R("DS32", "error", ("method.markov.rank",),
      lambda p: algo(p) == "DSPARK" and isinstance(p.method.markov.rank, int) and p.method.markov.rank <= 0,
      "method.markov.rank={p.method.markov.rank}: the Markov head needs rank > 0",
      "models/dspark.py:385-405; speculative/dspark_config.py:94-128"),
    R("RV1", "warning", ("schedule.ragged_verify", "method.name"),
      lambda p: spec(p) and algo(p) != "DSPARK" and p.schedule.ragged_verify in ("cap_accept", "compact"),
      "schedule.ragged_verify={p.schedule.ragged_verify} is ignored for method.name={p.method.name} (ragged "
      "verify is DSPARK only); drop it", "speculative/spec_info.py:160-164"),
    R("BUD1", "error", ("schedule.kind", "method.name"),
      lambda p: spec(p) and p.schedule.kind == "budget" and algo(p) != "DSPARK",
      "schedule.kind=budget: SGLang budgets verify tokens only for dspark (ragged verify); use dspark, or "
      "engine=vllm (adaptive verification)", "speculative/spec_info.py:160-164"),
    R("BUD2", "warning", ("schedule.kind", "schedule.ragged_verify"),
      lambda p: p.schedule.kind == "budget" and algo(p) == "DSPARK" and p.schedule.ragged_verify == "static",
      "schedule.kind=budget with schedule.ragged_verify=static verifies every token (no budget); set "
      "ragged_verify=cap_accept or compact", "speculative/dspark_planner.py:379-380"),
    R("BB1", "error", ("schedule.kind",), lambda p: spec(p) and p.schedule.kind in ("batch_buckets", "auto"),
      "schedule.kind={p.schedule.kind}: SGLang 0.5.23 has no per-batch-size static κ table; use "
      "schedule.kind=adaptive (per-bucket candidates) or static", "arg_groups/fields/spec.py:31-283"),
    R("PAR1", "error", ("method.parallel_drafting", "method.name"),
      lambda p: spec(p) and p.method.parallel_drafting and algo(p) not in ("DFLASH", "DSPARK"),
      "method.parallel_drafting=true (PARD / P-EAGLE) has no SGLang 0.5.23 worker for {p.method.name}; use "
      "engine=vllm", "arg_groups/fields/spec.py:31-283"),
    R("TC1", "warning", ("method.tree_choices",), lambda p: spec(p) and bool(p.method.tree_choices),
      "method.tree_choices is ignored: SGLang grows its draft tree dynamically from method.topk, num_steps "
      "and num_draft_tokens", "speculative/eagle_worker_v2.py:742-919"),
    # ---- 3.8 FROZEN_KV_MTP, NGRAM ----------------------------------------------------------------
    R("FK1", "fallback", ("deploy.max_running_requests",),
      lambda p: algo(p) == "FROZEN_KV_MTP" and p.deploy.max_running_requests is None,
      "deploy.max_running_requests unset: SGLang sets 48 for frozen_kv_mtp",
      "arg_groups/speculative_hook.py:992-1000", lambda p: {"deploy.max_running_requests": DEFAULT_MAX_RUNNING}),
    R("NG2", "fallback", ("deploy.max_running_requests",),
      lambda p: algo(p) == "NGRAM" and p.deploy.max_running_requests is None,
      "deploy.max_running_requests unset: SGLang sets 48 for ngram", "arg_groups/speculative_hook.py:1294-1302",
      lambda p: {"deploy.max_running_requests": DEFAULT_MAX_RUNNING}),
    R("NG4", "filled", ("method.topk",), lambda p: algo(p) == "NGRAM" and p.method.topk is None,
      "method.topk (--speculative-ngram-max-bfs-breadth) defaults to 10", "arg_groups/fields/spec.py:256-259; "
      "arg_groups/speculative_hook.py:1309-1313", lambda p: {"method.topk": 10}),
    R("NG5", "fallback", ("method.num_draft_tokens",),
      lambda p: algo(p) == "NGRAM" and p.method.num_draft_tokens is None,
      "method.num_draft_tokens unset for ngram: SGLang uses 12", "arg_groups/speculative_hook.py:1314-1323",
      lambda p: {"method.num_draft_tokens": 12}),
    R("NG6", "filled", ("method.num_steps",),
      lambda p: algo(p) == "NGRAM" and p.method.num_steps is None and isinstance(p.method.topk, int)
      and p.method.topk > 0 and isinstance(p.method.num_draft_tokens, int),
      "method.num_steps = num_draft_tokens // topk = {new[method.num_steps]}",
      "arg_groups/speculative_hook.py:1324-1330",
      lambda p: {"method.num_steps": p.method.num_draft_tokens // p.method.topk}),
    R("NG8", "error", ("method.topk", "deploy.page_size", "deploy.attention_backend"),
      lambda p: algo(p) == "NGRAM" and gt(p.method.topk, 1) and gt(p.deploy.page_size, 1)
      and p.deploy.attention_backend is not None and p.deploy.attention_backend != "flashinfer",
      "ngram with method.topk>1 and deploy.page_size>1 is only stable on deploy.attention_backend=flashinfer",
      "arg_groups/speculative_hook.py:1355-1366"),
    R("NG9", "error", ("method.name", "deploy.parallel.dp_attention"),
      lambda p: algo(p) == "NGRAM" and p.deploy.parallel.dp_attention,
      "method.name=ngram does not support deploy.parallel.dp_attention", "arg_groups/speculative_hook.py:1367-1371"),
    R("NGW", "warning", ("method.ngram.min", "method.ngram.max"),
      lambda p: algo(p) == "NGRAM" and ngram_window_set(p),
      "method.ngram.min/max are ignored: SGLang's NGRAM matches a trie (depth 18, BFS breadth = method.topk) "
      "and has no prompt-lookup window", "arg_groups/fields/spec.py:252-283"),
    # ---- 3.10 LoRA ---------------------------------------------------------------------------------
    R("L2", "error", ("deploy.lora.adapters", "method.name"),
      lambda p: lora(p) and algo(p) in ("STANDALONE", "FROZEN_KV_MTP", "PLUGIN"),
      "deploy.lora.adapters with method.name={p.method.name}: LoRA works only with ngram, eagle, mtp, eagle3, "
      "dflash and dspark", "arg_groups/lora_hook.py:252-264"),
    R("L3", "error", ("deploy.lora.adapters", "schedule.ragged_verify"),
      lambda p: lora(p) and algo(p) == "DSPARK" and p.schedule.ragged_verify != "static",
      "deploy.lora.adapters with dspark needs schedule.ragged_verify=static (ragged verify breaks the LoRA "
      "segment layout)", "arg_groups/lora_hook.py:266-276"),
    R("L4", "error", ("deploy.lora.adapters", "schedule.kind"),
      lambda p: lora(p) and spec(p) and algo(p) != "NGRAM" and adaptive(p),
      "deploy.lora.adapters with schedule.kind=adaptive: the state swap does not rebuild LoRA metadata; use "
      "schedule.kind=static", "arg_groups/lora_hook.py:277-282"),
    # ---- 3.11 cross-feature, disaggregation ----------------------------------------------------------
    R("X3", "error", ("deploy.parallel.pp", "method.name"),
      lambda p: spec(p) and gt(p.deploy.parallel.pp, 1) and algo(p) != "DSPARK"
      and not (algo(p) == "EAGLE" and not multi_layer(p)),
      "deploy.parallel.pp={p.deploy.parallel.pp} with method.name={p.method.name}: SGLang asserts \"Pipeline "
      "parallelism currently only supports EAGLE (non-multi-layer) speculative decoding\" (EAGLE3 included); "
      "use method eagle or mtp, or pp 1", "arg_groups/validation_hook.py:131-138"),
    R("X3b", "error", ("deploy.parallel.pp", "deploy.disagg.role"),
      lambda p: spec(p) and gt(p.deploy.parallel.pp, 1) and algo(p) == "EAGLE" and not multi_layer(p)
      and p.deploy.disagg.role != "prefill",
      "deploy.parallel.pp={p.deploy.parallel.pp} with speculation runs only on a PD prefill node "
      "(deploy.disagg.role=prefill) unless the launch sets SGLANG_ENABLE_PP_SPEC=1 (experimental, no plan key: "
      "`specc check --sglang-args` sees it)", "arg_groups/validation_hook.py:160-164",
      decide=lambda p, f: not pp_spec_env(f)),
    R("X3c", "error", ("deploy.parallel.pp", "deploy.disagg.role", "deploy.parallel.dp_attention"),
      lambda p: spec(p) and gt(p.deploy.parallel.pp, 1) and algo(p) == "EAGLE" and not multi_layer(p)
      and (p.deploy.disagg.role != "none" or p.deploy.parallel.dp_attention),
      "SGLANG_ENABLE_PP_SPEC=1 (pipeline-parallel speculation) is not compatible with deploy.disagg.role="
      "{p.deploy.disagg.role} or deploy.parallel.dp_attention={p.deploy.parallel.dp_attention}",
      "arg_groups/validation_hook.py:139-159", decide=lambda p, f: pp_spec_env(f)),
    R("TBO1", "error", ("deploy.parallel.two_batch_overlap", "deploy.parallel.dp_attention"),
      lambda p: p.deploy.parallel.two_batch_overlap and not p.deploy.parallel.dp_attention,
      "deploy.parallel.two_batch_overlap=true without deploy.parallel.dp_attention: SGLang refuses (\"When "
      "enabling two batch overlap without an EP a2a backend (moe_a2a_backend='none'), attention DP "
      "(--attn-dp-size) is required\"); turn dp_attention on, or launch with an EP --moe-a2a-backend (no plan "
      "key; `specc check --sglang-args` sees it)", "arg_groups/validation_hook.py:756-772",
      decide=lambda p, f: f.flag("moe_a2a_backend", "none") == "none"),
    R("PD1", "error", ("deploy.disagg.role", "method.topk"),
      lambda p: p.deploy.disagg.role in ("prefill", "decode") and is_eagle(p) and gt(p.method.topk, 16),
      "deploy.disagg.role={p.deploy.disagg.role}: the PD metadata buffer carries at most 16 top-k draft "
      "entries; method.topk={p.method.topk} must be <= 16", "disaggregation/utils.py:466-476"),
    R("SY1", "error", ("verify.rule", "verify.synthetic.acceptance_rates"),
      lambda p: spec(p) and p.verify.rule == "synthetic" and p.verify.synthetic.acceptance_rates is not None,
      "verify.synthetic.acceptance_rates: SGLang simulates only a mean acceptance length "
      "(SGLANG_SIMULATE_ACC_LEN); set verify.synthetic.acceptance_length instead", "environ.py:527-532"),
    R("SY2", "error", ("verify.rule", "verify.synthetic.acceptance_length"),
      lambda p: spec(p) and p.verify.rule == "synthetic" and p.verify.synthetic.acceptance_length is None
      and p.verify.synthetic.acceptance_rates is None,
      "verify.rule=synthetic needs verify.synthetic.acceptance_length (SGLANG_SIMULATE_ACC_LEN)",
      "environ.py:527-532"),
    # ---- deployment: parallel sizes of the draft, grammars, prefix cache, graph sizes ---------------
    R("DP0", "filled", ("deploy.parallel.draft_tp", "deploy.parallel.draft_pp", "deploy.parallel.draft_dp"),
      lambda p: spec(p) and algo(p) != "NGRAM" and (p.deploy.parallel.draft_tp is None or p.deploy.parallel.draft_pp
                                                    is None or p.deploy.parallel.draft_dp is None),
      "the draft runs in the target's tensor-parallel group, one pipeline stage, in every data-parallel replica: "
      "deploy.parallel.draft_tp={new[deploy.parallel.draft_tp]}, draft_pp=1, draft_dp={new[deploy.parallel.draft_dp]}",
      "speculative/eagle_worker_v2.py:217-230",
      lambda p: {"deploy.parallel.draft_tp": p.deploy.parallel.tp if p.deploy.parallel.draft_tp is None
                 else p.deploy.parallel.draft_tp,
                 "deploy.parallel.draft_pp": 1 if p.deploy.parallel.draft_pp is None else p.deploy.parallel.draft_pp,
                 "deploy.parallel.draft_dp": p.deploy.parallel.dp if p.deploy.parallel.draft_dp is None
                 else p.deploy.parallel.draft_dp}),
    R("DP1", "error", ("deploy.parallel.draft_tp", "deploy.parallel.draft_pp", "deploy.parallel.draft_dp"),
      lambda p: spec(p) and (ne(p.deploy.parallel.draft_tp, p.deploy.parallel.tp) or ne(p.deploy.parallel.draft_pp, 1)
                             or ne(p.deploy.parallel.draft_dp, p.deploy.parallel.dp)),
      "deploy.parallel.draft_tp/pp/dp={p.deploy.parallel.draft_tp}/{p.deploy.parallel.draft_pp}/"
      "{p.deploy.parallel.draft_dp}: SGLang 0.5.23 has no flag for a draft parallel layout of its own (it builds the "
      "draft worker in the target's TP group, one stage, per DP replica); drop them or use engine=vllm "
      "(draft_tensor_parallel_size 1)", "speculative/eagle_worker_v2.py:217-230; arg_groups/fields/spec.py:31-283"),
    R("GR1", "fallback", ("deploy.structured_output.requests", "deploy.overlap_scheduler", "method.name"),
      lambda p: algo(p) == "NGRAM" and grammar_requests(p) and p.deploy.overlap_scheduler is not False,
      "method.name=ngram with requests that carry a grammar: every batch holding one runs synchronously (no grammar "
      "overlap for host-side n-gram drafts), so the overlap scheduler is off for them (SGLang issue #13425)",
      "speculative/spec_info.py:166-172; managers/schedule_batch.py:2721-2724",
      lambda p: {"deploy.overlap_scheduler": False}),
    R("GR2", "warning", ("deploy.structured_output.requests", "method.name"),
      lambda p: is_eagle(p) and grammar_requests(p),
      "method.name={p.method.name} with requests that carry a grammar: SGLang issue #9187 (EAGLE with structured "
      "outputs stopping at the first token the grammar rejects) is open in the tracker; this release masks every "
      "draft position with the grammar during verify (speculative/spec_utils.py:584-700), so check schema outputs "
      "on a smoke test before serving", "speculative/spec_utils.py:584-700"),
    R("PC2", "error", ("deploy.prefix_caching", "deploy.disagg.role", "method.name"),
      lambda p: p.deploy.disagg.role == "decode" and p.deploy.prefix_caching is True and spec(p)
      and algo(p) not in ("DSPARK", "EAGLE", "EAGLE3"),
      "deploy.prefix_caching=true on a decode node (--disaggregation-decode-enable-radix-cache) with "
      "method.name={p.method.name}: SGLang refuses (\"incompatible with speculative decoding\"); only eagle, eagle3, "
      "mtp and dspark keep a decode-side radix cache", "arg_groups/speculative_hook.py:164-173"),
    R("CG3", "warning", ("deploy.cuda_graph_max_bs", "deploy.max_running_requests"),
      lambda p: graphs_on(p) and isinstance(p.deploy.cuda_graph_max_bs, int)
      and isinstance(p.deploy.max_running_requests, int) and p.deploy.cuda_graph_max_bs > p.deploy.max_running_requests,
      "deploy.cuda_graph_max_bs={p.deploy.cuda_graph_max_bs} > deploy.max_running_requests="
      "{p.deploy.max_running_requests}: SGLang captures graphs for batches that never run (the cap is applied only "
      "to an explicit --max-running-requests, before the speculative hook sets 48), and their memory comes out of "
      "the KV budget (`specc explain` prices it); set deploy.cuda_graph_max_bs to the batch you serve",
      "arg_groups/memory_hook.py:183-188; arg_groups/speculative_hook.py:1086-1094"),
    # ---- settings SGLang silently ignores (silence is what burns users) ------------------------------
    R("IG1", "warning", ("verify.rule", "verify.draft_sampling"),
      lambda p: spec(p) and p.verify.rule == "greedy" and p.verify.draft_sampling == "probabilistic",
      "verify.draft_sampling=probabilistic is ignored by greedy verify (argmax match); use "
      "verify.rule=standard to use the draft's probabilities, or draft_sampling=greedy",
      "speculative/eagle_utils.py:485-500"),
    R("IG2", "warning", ("verify.synthetic",),
      lambda p: p.verify.rule != "synthetic" and (p.verify.synthetic.acceptance_length is not None
                                                  or p.verify.synthetic.acceptance_rates is not None),
      "verify.synthetic.* is ignored unless verify.rule=synthetic", "environ.py:527-532"),
    R("IG3", "warning", ("method.block_size", "method.markov", "method.confidence_head"),
      lambda p: spec(p) and algo(p) not in ("DFLASH", "DSPARK") and (
          p.method.block_size is not None or p.method.markov.kind is not None
          or p.method.markov.rank is not None or p.method.confidence_head is not None),
      "method.block_size/markov/confidence_head are read only for dflash/dspark and are ignored for "
      "method.name={p.method.name}; drop them", "arg_groups/fields/spec.py:70-97"),
    R("IG4", "warning", ("schedule.buckets", "schedule.ema_alpha", "schedule.update_interval",
                         "schedule.warmup_batches"),
      lambda p: p.schedule.kind == "static" and (bool(p.schedule.buckets) or p.schedule.ema_alpha is not None
                                                 or p.schedule.update_interval is not None
                                                 or p.schedule.warmup_batches is not None),
      "schedule.buckets/ema_alpha/update_interval/warmup_batches are ignored with schedule.kind=static; set "
      "kind=adaptive or drop them", "arg_groups/fields/spec.py:237-244"),
    R("IG5", "warning", ("draft.path",),
      lambda p: algo(p) in (None, "NGRAM") and p.draft is not None and bool(p.draft.path),
      "draft.path is ignored for method.name={p.method.name} (no draft model); drop the draft section",
      "speculative/spec_info.py:174-178"),
)


def _default_buckets():
    from specc.plan.schema import BucketConfig

    return {bs: BucketConfig(**cfg) for bs, cfg in DEFAULT_ADAPTIVE_BUCKETS.items()}


PROFILE = Profile(name="sglang", version="sglang==0.5.23", root="sglang/srt/", rules=RULES)
