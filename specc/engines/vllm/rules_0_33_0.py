"""vLLM 0.33.0: the rules of ``SpeculativeConfig`` (``vllm/config/speculative.py``), ``VllmConfig``
(``vllm/config/vllm.py``) and the speculators and adaptive verification whose condition can
be written in plan keys, in ``SpeculativeConfig.__post_init__`` / ``_verify_args`` / ``VllmConfig`` order.

Plan -> vLLM mapping used by the predicates (the exporter uses the same one): ``method.name`` ->
``speculative_config.method`` (custom -> ``custom_class`` with ``model = method.plugin``);
K = ``num_speculative_tokens`` = ``method.block_size`` (γ) for dspark, else ``method.num_steps`` (DFlash
too: vLLM's K for dflash is ``num_speculative_tokens``, the block size is the draft checkpoint's);
``draft.path`` -> ``model``; ``draft.max_model_len`` -> ``max_model_len``; ``method.ngram.min/max`` ->
``prompt_lookup_min/max``; ``method.suffix.*`` -> ``suffix_decoding_*``; ``verify.rule``
standard/block/synthetic -> ``rejection_sample_method`` (greedy = temperature-0 requests, standard rule);
``verify.draft_sampling`` -> ``draft_sample_method``;
``schedule.kind=batch_buckets`` -> ``num_speculative_tokens_per_batch_size`` (bucket key = range start,
its single candidate = K); ``schedule.kind=budget`` -> ``enable_adaptive_verification``;
``deploy.overlap_scheduler`` -> async scheduling; ``deploy.parallel.two_batch_overlap`` -> DBO.

Sources are ``file:line`` under ``vllm/`` of the vllm 0.33.0 wheel (SP = config/speculative.py,
VC = config/vllm.py).
"""
from __future__ import annotations

from specc.check.base import Profile, Rule, gt, lora, ne, ngram_window_set, thresholds_set

SP = "config/speculative.py:"
VC = "config/vllm.py:"
#: vLLM ``SpeculativeConfig.method`` values of model-based proposers (vLLM's own names)
MODEL_BASED = ("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark", "custom_class")
NEEDS_MODEL = ("eagle", "eagle3", "dflash", "draft_model")


def vllm_method(name: str):
    """vLLM 0.33.0's ``SpeculativeConfig.method`` value of method ``name``, from the method registry's
    row (``Method.vllm_method``): None for plain decoding (a method that drafts nothing), ``"?"`` when
    vLLM has no such method or the registry no such method. The predicates below compare these values,
    vLLM's own names (its code branches on them), never ``method.name``."""
    from specc import methods

    m = methods.METHODS.get(name)
    if m is None:
        return "?"
    if not m.drafts:
        return None
    return m.vllm_method or "?"


def _plan_method(method: str) -> str:
    """The registered plan method vLLM's ``method`` value runs as (the row whose ``vllm_method`` it is)."""
    from specc import methods

    found = methods.for_engine_name("vllm", method)
    return found[0] if found else method


def vm(p):
    """:func:`vllm_method` of the plan's method."""
    return vllm_method(p.method.name)


def __getattr__(name):
    if name == "METHODS":  # the plan method names vLLM runs (plain decoding included), when asked
        from specc import methods

        return {n for n in methods.METHODS if vllm_method(n) != "?"}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec(p) -> bool:
    return vm(p) is not None


def k(p):
    """num_speculative_tokens: ``method.block_size`` (γ) for dspark, ``method.num_steps`` otherwise."""
    return p.method.block_size if vm(p) == "dspark" else p.method.num_steps


def _suffix_depth(p) -> int:
    d = p.method.suffix.max_tree_depth
    return d if isinstance(d, int) else 24


def _suffix_bounds(p) -> list:
    """vLLM's ``_validate_suffix_decoding`` (SP:1741-1760): each key outside its bound."""
    sx, out = p.method.suffix, []
    if sx.max_tree_depth is not None and sx.max_tree_depth < 1:
        out.append(f"method.suffix.max_tree_depth={sx.max_tree_depth} (suffix_decoding_max_tree_depth) must be >= 1")
    if sx.max_cached_requests is not None and sx.max_cached_requests < 0:
        out.append(f"method.suffix.max_cached_requests={sx.max_cached_requests} "
                   f"(suffix_decoding_max_cached_requests) must be >= 0")
    if sx.max_spec_factor is not None and sx.max_spec_factor < 0:
        out.append(f"method.suffix.max_spec_factor={sx.max_spec_factor} (suffix_decoding_max_spec_factor) must be >= 0")
    if sx.min_token_prob is not None and not 0 <= sx.min_token_prob <= 1:
        out.append(f"method.suffix.min_token_prob={sx.min_token_prob} (suffix_decoding_min_token_prob) must be "
                   f"in [0, 1]")
    return out


# ---- checkpoint facts (specc.models.checkpoints) ----------------------------------------------------------
#: target model_types that SpeculativeConfig.hf_config_override turns into an MTP draft (SP:711-1170)
MTP_TARGET_TYPES = {
    "deepseek_v3", "deepseek_v32", "glm_moe_dsa", "deepseek_v4", "deepseek_v41", "dots3_note", "pangu_ultra_moe",
    "kimi_k3", "mimo", "mimo_v2", "mimo_v2_flash", "glm4_moe", "glm4_moe_lite", "glm_ocr", "ernie4_5_moe",
    "nemotron_h", "nemotron_h_puzzle", "qwen3_next", "qwen4_exp", "qwen4_exp_text", "bailing_hybrid",
    "exaone_moe", "exaone4_5", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "intern_s2_preview",
    "interns2_mobius", "longcat_flash", "step3p5", "step3p7", "step5", "step5_vl", "hy_v3", "hy_v4",
    "inkling_mm_model", "inkling_model", "gemma4_assistant", "gemma4_unified_assistant", "minimax_m3_vl",
    "glm5_next", "muse_glimmer_assistant",
}
#: target architectures whose plan key alone decides rule MTP1 (no config.json needed)
NON_MTP_ARCHS = {"llama": "llama", "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                 "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "qwen2": "qwen2", "mistral": "mistral"}
MTP_ARCHS = {"DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV32ForCausalLM": "deepseek_v32",
             "Glm4MoeForCausalLM": "glm4_moe", "MiMoForCausalLM": "mimo", "Qwen3NextForCausalLM": "qwen3_next"}
MODEL_BASED_K = ("draft_model", "eagle", "eagle3", "dflash")
DEFAULT_MAX_NUM_SEQS = 1024          # vllm serve on a >= 70 GiB GPU (engine/arg_utils.py:2975-2985)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # same tier, OpenAI server usage context


def _draft_side(p) -> str:
    """Whose config.json is vLLM's draft config: the draft's, or the target's for mtp/dspark without one."""
    return "draft" if draft_path(p) else "target"


def _cfg(p, which):
    from specc.models.checkpoints import read_checkpoint

    sect = getattr(p, which)
    ck = read_checkpoint(f"{which}.path", sect.path, sect.format or "hf") if sect is not None else None
    return ck.config if ck is not None else None


def _n_predict(p):
    from specc.models.checkpoints import n_predict

    return n_predict(_cfg(p, _draft_side(p)))


def _target_type(p, f=None):
    """The target's model_type: config.json's, else from the plan's target.architecture."""
    cfg = _cfg(p, "target") if p.target.path else None
    if cfg and cfg.get("model_type"):
        return cfg["model_type"]
    arch = p.target.architecture or ""
    return NON_MTP_ARCHS.get(arch) or MTP_ARCHS.get(arch)


def _mtp_needs(p):
    arch = p.target.architecture or ""
    return () if (arch in NON_MTP_ARCHS or arch in MTP_ARCHS) and not _cfg(p, "target") else ("target",)


def _mtp_capable(t) -> bool:
    return bool(t) and (t in MTP_TARGET_TYPES or t.endswith("_mtp"))


def _lora_budget(p, f):
    """(max_num_batched_tokens, max_num_seqs, where they came from) for rule R61."""
    from specc.importer.base import human_int

    mnbt = human_int(f.flag("max_num_batched_tokens")) if f.flag("max_num_batched_tokens") is not None else None
    mns = p.deploy.max_running_requests
    src = []
    if mnbt is None:
        mnbt = DEFAULT_MAX_NUM_BATCHED_TOKENS
        src.append(f"max_num_batched_tokens={mnbt} (vLLM's default on a >= 70 GiB GPU; no plan key, set it with "
                   f"--max-num-batched-tokens)")
    if mns is None:
        mns = DEFAULT_MAX_NUM_SEQS
        src.append(f"max_num_seqs={mns} (vLLM's default on a >= 70 GiB GPU; deploy.max_running_requests)")
    return mnbt, mns, "; ".join(src)


def mrv1(p) -> bool:
    """Features Model Runner V2 lacks force MRV1 (VC:3066-3082; DBO: VC:3241-3242)."""
    return spec(p) and (vm(p) in ("suffix", "custom_class")
                        or (p.method.parallel_drafting and vm(p) not in ("dflash", "dspark"))
                        or p.deploy.parallel.two_batch_overlap)


def budget(p) -> bool:
    return p.schedule.kind == "budget"


def buckets_on(p) -> bool:
    return spec(p) and p.schedule.kind == "batch_buckets"


def draft_path(p):
    return p.draft.path if p.draft is not None else None


def heuristic_method(p):
    """Draft-name heuristics of SP:1430-1473 (first match wins)."""
    name = (draft_path(p) or "").lower()
    arch = (p.draft.architecture or "") if p.draft is not None else ""
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    if "dflash" in name or arch == "MuseGlimmerAssistantModel":
        return "dflash"
    if "dspark" in name or arch in ("Qwen3DSparkModel", "Qwen3OmniDSparkModel", "MuseSparkDSparkModel",
                                    "Gemma4DSparkModel"):
        return "dspark"
    return None


def _mask_token(p):
    from specc.models.checkpoints import mask_token

    return mask_token(_cfg(p, "draft"))


def _rates_bad(p) -> bool:
    r = p.verify.synthetic.acceptance_rates
    if r is None:
        return False
    return (ne(len(r), k(p)) if k(p) is not None else False) or any(not (0 <= x <= 1) for x in r) \
        or any(b > a for a, b in zip(r, r[1:]))


def _buckets_bad(p) -> bool:
    b = p.schedule.buckets or {}
    return (not b) or min(b) != 1 or any(len(x.candidates or []) != 1 for x in b.values()) \
        or any(c < 0 for x in b.values() for c in (x.candidates or []))


def _names(kind: str):
    from specc.engines import names as engine_names

    return engine_names.grammar_backends("vllm") if kind == "backend" else engine_names.reasoning_parsers("vllm")


def _hint(name, kind: str) -> str:
    from specc.engines import names as engine_names

    return engine_names.did_you_mean(name, _names(kind))


def grammar_requests(p) -> bool:
    return p.deploy.structured_output.requests is True


def graphs_on(p) -> bool:
    return p.runtime.device != "cpu" and p.deploy.cuda_graphs is not False


def query_len(p) -> int:
    """Tokens per request of a uniform decode step: K + 1 with speculation (VC:2462-2470)."""
    kk = k(p) if spec(p) else None
    return kk + 1 if isinstance(kk, int) and kk > 0 else 1


def _request_counts(max_reqs: int):
    """vLLM's request-count grid of the decode capture sizes: 1, 2, 4, multiples of 8 below 256, of 16
    from 256, and max_reqs itself, at most 512 (VC:2487-2494)."""
    max_reqs = min(max_reqs, 512)
    counts = [n for n in (1, 2, 4) if n <= max_reqs] + list(range(8, min(max_reqs + 1, 256), 8)) \
        + list(range(256, max_reqs + 1, 16))
    return sorted(set(counts + [max_reqs]))


def default_max_bs(p) -> int:
    """The largest uniform decode batch vLLM captures when --max-cudagraph-capture-size is unset:
    tokens up to min(max_num_seqs · q · 2, 512, max_num_batched_tokens) (VC:2460-2552), requests n of the
    grid with n · q within it."""
    q = query_len(p)
    mns = p.deploy.max_running_requests or DEFAULT_MAX_NUM_SEQS
    cap = min(mns * q * 2, 512, DEFAULT_MAX_NUM_BATCHED_TOKENS)
    fits = [n for n in _request_counts(mns) if n * q <= cap]
    return max(fits) if fits else 1


#: target architectures whose decoder carries EAGLE-3 auxiliary hidden states across pipeline stages
#: (``supports_aux_hidden_states_over_pp = True``: model_executor/models/llama.py:358, qwen2.py:335,
#: sarvam.py:466, and the classes derived from LlamaModel / Qwen2Model: Mistral, Glm4, Qwen3, TeleChat2)
AUX_OVER_PP = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Glm4ForCausalLM",
               "TeleChat2ForCausalLM", "SarvamForCausalLM", "llama", "qwen2", "qwen3", "mistral")


def _target_arch(p, f=None):
    cfg = _cfg(p, "target") if p.target.path else None
    archs = (cfg or {}).get("architectures") if isinstance(cfg, dict) else None
    return (archs[0] if archs else None) or p.target.architecture


def _arch_needs(p):
    return () if p.target.architecture else ("target",)


R = Rule
RULES = (
    R("M1", "error", ("method.name",), lambda p: vm(p) == "?",
      "method.name={p.method.name} is not a vLLM 0.33.0 speculative method (medusa and mlp_speculator were "
      "removed after 0.32.0; frozen_kv_mtp and multi_layer_eagle are SGLang's); pick another method or "
      "engine=sglang", SP + "74-82"),
    R("R9", "error", ("method.plugin",), lambda p: vm(p) == "custom_class" and not p.method.plugin,
      "method.name=custom needs method.plugin = the dotted path of the proposer class", SP + "1284-1291"),
    R("R96", "error", ("method.plugin",),
      lambda p: vm(p) == "custom_class" and bool(p.method.plugin) and "." not in p.method.plugin,
      "method.plugin={p.method.plugin} must be a dotted path module.Class",
      "v1/spec_decode/custom_class_proposer.py:28-65"),
    R("R10", "error", ("draft.path", "method.name"),
      lambda p: vm(p) in NEEDS_MODEL and not draft_path(p),
      "method.name={p.method.name} needs draft.path (vLLM: 'num_speculative_tokens was provided but without "
      "speculative model')", SP + "1292-1295"),
    R("R10b", "error", ("method.num_steps", "method.name"), lambda p: vm(p) == "mtp" and k(p) is None,
      "method.name=mtp needs method.num_steps (K); vLLM has no default when the draft is the target",
      SP + "1252, 1946-1951"),
    R("R11", "filled", ("method.ngram.min", "method.ngram.max"),
      lambda p: vm(p) == "ngram" and p.method.ngram.min is None and p.method.ngram.max is None,
      "method.ngram.min/max unset: vLLM uses prompt_lookup_min = max = 5", SP + "1302-1305",
      lambda p: {"method.ngram.min": 5, "method.ngram.max": 5}),
    R("R11b", "filled", ("method.ngram.min", "method.ngram.max"),
      lambda p: vm(p) == "ngram" and (p.method.ngram.min is None) != (p.method.ngram.max is None),
      "only one of method.ngram.min/max set: vLLM copies it to the other", SP + "1306-1319",
      lambda p: {"method.ngram.min": p.method.ngram.min if p.method.ngram.min is not None else p.method.ngram.max,
                 "method.ngram.max": p.method.ngram.max if p.method.ngram.max is not None else p.method.ngram.min}),
    R("R12", "error", ("method.ngram.min", "method.ngram.max"),
      lambda p: vm(p) == "ngram" and isinstance(p.method.ngram.min, int)
      and isinstance(p.method.ngram.max, int) and p.method.ngram.min > p.method.ngram.max,
      "method.ngram.min={p.method.ngram.min} must be <= method.ngram.max={p.method.ngram.max}", SP + "1322-1326"),
    R("R12b", "warning", ("draft.path",),
      lambda p: (vm(p) in ("ngram", "suffix") or not spec(p)) and bool(draft_path(p)),
      "draft.path is ignored for method.name={p.method.name}: vLLM uses the target's config; drop the draft",
      SP + "1328-1331"),
    R("R13b", "warning", ("method.name",), lambda p: vm(p) == "custom_class",
      "method.name=custom (custom_class) is experimental in vLLM; its interface may break between releases",
      SP + "1334-1346"),
    R("R13d", "fallback", ("method.ngram.min", "method.ngram.max"),
      lambda p: vm(p) in MODEL_BASED and ngram_window_set(p),
      "method.ngram.min/max are discarded for model-based method {p.method.name}; drop them", SP + "1374-1377",
      lambda p: {"method.ngram.min": None, "method.ngram.max": None}),
    R("R14", "fallback", ("method.name", "draft.path"),
      lambda p: vm(p) in ("draft_model", "mtp") and heuristic_method(p) is not None,
      "draft.path={p.draft.path} looks like a {new[method.name]} checkpoint: vLLM overrides "
      "method.name={p.method.name} with {new[method.name]}; rename the path or set method.name to match",
      SP + "1430-1473", lambda p: {"method.name": _plan_method(heuristic_method(p))}),
    R("R16", "warning", ("method.num_steps",), lambda p: vm(p) == "mtp" and gt(k(p), 1),
      "method.num_steps={p.method.num_steps} > 1 with mtp reruns the same MTP layer: expect lower acceptance",
      SP + "1486-1495"),
    R("R21", "filled", ("method.parallel_drafting",),
      lambda p: vm(p) in ("dflash", "dspark") and not p.method.parallel_drafting,
      "method.parallel_drafting is set to true for {p.method.name}", SP + "1581-1582",
      lambda p: {"method.parallel_drafting": True}),
    R("R23", "warning", ("method.block_size",), lambda p: vm(p) == "dspark" and p.method.block_size is None,
      "method.block_size (K) unset for dspark: vLLM takes it from the draft's block_size; set it to pin K",
      SP + "1592-1599"),
    R("R24", "filled", ("method.num_steps",),
      lambda p: vm(p) in MODEL_BASED_K and k(p) is None and bool(draft_path(p)),
      "method.num_steps unset: vLLM takes K from the draft config's n_predict = {new[method.num_steps]}",
      SP + "1600-1603", lambda p: {"method.num_steps": _n_predict(p)},
      needs=("draft",), decide=lambda p, f: _n_predict(p) is not None, about="K from the draft's n_predict"),
    R("R26", "error", ("method.num_steps", "draft.path"),
      lambda p: vm(p) in MODEL_BASED_K and k(p) is None and bool(draft_path(p)),
      "method.num_steps (K) is unset and the draft config has no n_predict: vLLM refuses (\"A speculative model "
      "was provided, but `num_speculative_tokens` was not provided\"); set method.num_steps",
      SP + "1614-1618", needs=("draft",), decide=lambda p, f: _n_predict(p) is None,
      about="whether the draft config supplies K (n_predict)"),
    R("R25", "error", ("method.num_steps", "draft.path"),
      lambda p: vm(p) in MODEL_BASED_K + ("mtp",) and isinstance(k(p), int)
      and (bool(draft_path(p)) or vm(p) == "mtp"),
      "method.num_steps={p.method.num_steps} with a draft whose n_predict={n}: vLLM refuses "
      "(\"num_speculative_tokens:{p.method.num_steps} must be divisible by n_predict={n}\"); use a multiple of {n} "
      "or at most {n}", SP + "1604-1612", needs=lambda p: (_draft_side(p),),
      decide=lambda p, f: bool(_n_predict(p)) and k(p) > _n_predict(p) and k(p) % _n_predict(p) != 0,
      about="K against the draft's n_predict", message_args=lambda p: {"n": _n_predict(p)}),
    R("MTP1", "error", ("method.name", "target.architecture"),
      lambda p: vm(p) == "mtp" and not draft_path(p),
      "method.name=mtp on a target without MTP layers (model_type {t}): vLLM refuses (NotImplementedError: "
      "\"Unsupported speculative method: 'mtp'\"); use eagle3, draft_model or ngram", SP + "1496-1501",
      needs=_mtp_needs, decide=lambda p, f: not _mtp_capable(_target_type(p)),
      about="whether the target has MTP layers", message_args=lambda p: {"t": _target_type(p)}),
    R("R36", "error", ("method.num_steps", "method.name"), lambda p: vm(p) == "ngram" and k(p) is None,
      "method.name=ngram needs method.num_steps: vLLM refuses (\"num_speculative_tokens must be provided\"); the "
      "ngram window (method.ngram.min/max) is not K", SP + "1946-1951"),
    R("R92", "error", ("method.parallel_drafting", "draft.path"),
      lambda p: p.method.parallel_drafting and vm(p) in ("draft_model", "eagle", "eagle3", "dflash", "dspark")
      and bool(draft_path(p)),
      "method.parallel_drafting=true needs a mask token in the draft config (dflash_config.mask_token_id, "
      "mask_token_id, dspark_noise_token_id, pard_token or ptd_token_id) and {p.draft.path} has none: vLLM refuses; "
      "use a draft trained for parallel drafting", "v1/spec_decode/llm_base_proposer.py:355-379",
      needs=("draft",), decide=lambda p, f: _mask_token(p) is None, about="the draft's parallel-drafting mask token"),
    R("R61", "error", ("deploy.lora.adapters", "method.num_steps", "deploy.max_running_requests"),
      lambda p: spec(p) and lora(p) and isinstance(k(p), int),
      "deploy.lora.adapters with K={k}: vLLM needs max_num_batched_tokens >= max_num_seqs * (K + 1) = {mns} * {k1} "
      "= {need} but has {mnbt} ({why}): it refuses (\"Consider increasing max_num_batched_tokens or decreasing "
      "num_speculative_tokens\"); lower K or deploy.max_running_requests, or raise --max-num-batched-tokens",
      "engine/arg_utils.py:2712-2724",
      decide=lambda p, f: _lora_budget(p, f)[0] < _lora_budget(p, f)[1] * (k(p) + 1),
      message_args=lambda p, f: {"k": k(p), "k1": k(p) + 1, "mnbt": _lora_budget(p, f)[0],
                                 "mns": _lora_budget(p, f)[1], "need": _lora_budget(p, f)[1] * (k(p) + 1),
                                 "why": _lora_budget(p, f)[2] or "from the launch"}),
    R("K1", "warning", ("method.num_steps",),
      lambda p: vm(p) == "dspark" and ne(p.method.num_steps, 1),
      "method.num_steps is not read for dspark: vLLM's K is method.block_size (γ)", SP + "1592-1599"),
    R("K2", "warning", ("method.block_size",),
      lambda p: vm(p) == "dflash" and p.method.block_size is not None,
      "method.block_size={p.method.block_size} is not read for dflash: vLLM's K is method.num_steps "
      "(num_speculative_tokens) and the block size comes from the draft checkpoint", SP + "1600-1618"),
    R("R29c", "error", ("draft.max_model_len", "target.max_model_len"),
      lambda p: p.draft is not None and isinstance(p.draft.max_model_len, int)
      and isinstance(p.target.max_model_len, int) and p.draft.max_model_len > p.target.max_model_len,
      "draft.max_model_len={p.draft.max_model_len} exceeds target.max_model_len={p.target.max_model_len}",
      SP + "1686-1692, 1763-1805"),
    R("R30", "warning", ("method.name",), lambda p: vm(p) == "suffix",
      "method.name=suffix needs the arctic-inference package (pip install arctic-inference==0.1.1)",
      SP + "1727-1732"),
    R("R30b", "fallback", ("method.num_steps",), lambda p: vm(p) == "suffix" and p.method.num_steps is None,
      "method.num_steps unset for suffix: K = suffix_decoding_max_tree_depth = {new[method.num_steps]}",
      SP + "1732-1739", lambda p: {"method.num_steps": _suffix_depth(p)}),
    R("R31", "error", ("method.suffix.max_tree_depth", "method.suffix.max_cached_requests",
                       "method.suffix.max_spec_factor", "method.suffix.min_token_prob"),
      lambda p: vm(p) == "suffix" and bool(_suffix_bounds(p)),
      "{what} (vLLM refuses the speculative config at startup)", SP + "1741-1760",
      message_args=lambda p: {"what": "; ".join(_suffix_bounds(p))}),
    R("K3", "warning", ("method.suffix.corpora", "method.suffix.max_corpus_tokens"),
      lambda p: vm(p) == "suffix" and (bool(p.method.suffix.corpora)
                                               or p.method.suffix.max_corpus_tokens is not None),
      "method.suffix.corpora / max_corpus_tokens: vLLM's suffix decoding has no corpus drafting (its global "
      "tree holds earlier responses only); they are not exported. Run the plan on engine=specc to draft from "
      "corpora", "v1/worker/gpu_model_runner.py:648-649 (SuffixDecodingProposer, no corpus input)"),
    R("R40", "error", ("verify.synthetic.acceptance_length", "verify.synthetic.acceptance_rates"),
      lambda p: spec(p) and p.verify.rule == "synthetic"
      and (p.verify.synthetic.acceptance_length is None) == (p.verify.synthetic.acceptance_rates is None),
      "verify.rule=synthetic needs exactly one of verify.synthetic.acceptance_length / acceptance_rates",
      SP + "1974-1979, 606-611"),
    R("R41", "error", ("verify.synthetic.acceptance_rates",),
      lambda p: spec(p) and p.verify.rule == "synthetic" and _rates_bad(p),
      "verify.synthetic.acceptance_rates must have K={p.method.num_steps} entries in [0, 1], non-increasing",
      SP + "612-626"),
    R("R42", "error", ("verify.synthetic.acceptance_length",),
      lambda p: spec(p) and p.verify.rule == "synthetic" and isinstance(p.verify.synthetic.acceptance_length,
                                                                        (int, float))
      and isinstance(k(p), int) and not (1 <= p.verify.synthetic.acceptance_length <= k(p) + 1),
      "verify.synthetic.acceptance_length={p.verify.synthetic.acceptance_length} must be in [1, K + 1]",
      SP + "628-631"),
    R("R43", "error", ("verify.rule", "verify.synthetic"),
      lambda p: spec(p) and p.verify.rule != "synthetic" and (p.verify.synthetic.acceptance_length is not None
                                                              or p.verify.synthetic.acceptance_rates is not None),
      "verify.synthetic.* is only valid with verify.rule=synthetic; drop it or set the rule", SP + "1981-1988"),
    R("R52", "error", ("draft.vocab_size", "target.vocab_size"),
      lambda p: vm(p) == "draft_model" and p.draft is not None and ne(p.draft.vocab_size, p.target.vocab_size)
      and p.target.vocab_size is not None,
      "draft.vocab_size={p.draft.vocab_size} != target.vocab_size={p.target.vocab_size}: vLLM needs the same "
      "vocabulary for draft_model", SP + "2036-2037, 2040-2056"),
    R("T1", "error", ("method.topk", "method.tree_choices"),
      lambda p: spec(p) and (gt(p.method.topk, 1) or bool(p.method.tree_choices)),
      "method.topk>1 / method.tree_choices: vLLM 0.33.0 has no tree speculation (chain only); use topk 1 or "
      "engine=sglang", "v1/spec_decode/llm_base_proposer.py:1627-1628"),
    R("D1", "fallback", ("method.num_draft_tokens",),
      lambda p: spec(p) and vm(p) != "suffix" and isinstance(k(p), int)
      and p.method.num_draft_tokens != k(p) + 1,
      "vLLM verifies K + 1 tokens per request: method.num_draft_tokens = {new[method.num_draft_tokens]}",
      SP + "413", lambda p: {"method.num_draft_tokens": k(p) + 1}),
    R("A1", "error", ("schedule.kind",), lambda p: spec(p) and p.schedule.kind in ("adaptive", "auto"),
      "schedule.kind={p.schedule.kind}: vLLM 0.33.0 has no runtime κ controller; use schedule.kind="
      "batch_buckets (dynamic K) or budget (adaptive verification)", SP + "524, 585"),
    R("W1", "warning", ("verify.accept_threshold",), lambda p: spec(p) and thresholds_set(p),
      "verify.accept_threshold.* is ignored: vLLM has no acceptance thresholds", SP + "410-659"),
    R("W2", "warning", ("schedule.ragged_verify",), lambda p: spec(p) and p.schedule.ragged_verify != "static",
      "schedule.ragged_verify is SGLang's; vLLM ignores it (use schedule.kind=budget)", SP + "585"),
    R("W3", "warning", ("method.markov", "method.confidence_head"),
      lambda p: spec(p) and (p.method.markov.kind is not None or p.method.markov.rank is not None
                             or p.method.confidence_head is not None),
      "method.markov / confidence_head are read from the draft checkpoint by vLLM; the plan values are ignored",
      "v1/worker/gpu/spec_decode/dspark/speculator.py:106-113"),
    R("R62", "warning", ("method.name", "method.parallel_drafting", "deploy.parallel.two_batch_overlap"),
      mrv1, "method.name={p.method.name}, method.parallel_drafting={p.method.parallel_drafting}, "
      "deploy.parallel.two_batch_overlap={p.deploy.parallel.two_batch_overlap}: vLLM runs this plan on Model "
      "Runner V1 (V2 does not support it); dspark and schedule.kind=budget are then unavailable",
      VC + "3066-3082, 758-765, 3241-3242"),
    R("R63", "error", ("method.name", "schedule.kind"), lambda p: mrv1(p) and (vm(p) == "dspark" or budget(p)),
      "Model Runner V1 (forced by this plan) does not support dspark or schedule.kind=budget (adaptive "
      "verification): the plan is unsatisfiable; drop one side", VC + "3089-3151, 3332-3337"),
    R("R64", "fallback", ("schedule.kind", "deploy.parallel.dp"), lambda p: buckets_on(p) and gt(p.deploy.parallel.dp, 1),
      "schedule.kind=batch_buckets with deploy.parallel.dp>1: DP ranks could pick different K, so vLLM uses a "
      "static K", VC + "1110-1127", lambda p: {"schedule.kind": "static"}),
    R("R65", "fallback", ("schedule.kind", "method.name"),
      lambda p: buckets_on(p) and mrv1(p)
      and vm(p) not in ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash"),
      "schedule.kind=batch_buckets is disabled on Model Runner V1 for method {p.method.name}; static K used",
      VC + "1088-1108", lambda p: {"schedule.kind": "static"}),
    R("R67", "error", ("schedule.buckets",), lambda p: buckets_on(p) and _buckets_bad(p),
      "schedule.buckets for vLLM dynamic K: the first bucket must start at batch size 1 and each bucket needs "
      "exactly one candidate K >= 0", "v1/spec_decode/dynamic/utils.py:7-74"),
    R("R67b", "warning", ("schedule.buckets", "method.num_steps"),
      lambda p: buckets_on(p) and isinstance(k(p), int)
      and any(c > k(p) for b in (p.schedule.buckets or {}).values() for c in (b.candidates or [])),
      "schedule.buckets candidates above K={p.method.num_steps} are clipped to K (lookup is min(K_entry, K))",
      "v1/spec_decode/dynamic/utils.py:77-148"),
    R("R69", "error", ("deploy.overlap_scheduler", "method.name"),
      lambda p: vm(p) in ("suffix", "custom_class") and p.deploy.overlap_scheduler is True,
      "deploy.overlap_scheduler=true (async scheduling) is not supported for {p.method.name} on Model Runner "
      "V1; set it false", VC + "1651-1679, 1711-1717"),
    R("R69b", "fallback", ("deploy.overlap_scheduler",),
      lambda p: vm(p) in ("suffix", "custom_class") and p.deploy.overlap_scheduler is None,
      "deploy.overlap_scheduler (async scheduling) is turned off for method.name={p.method.name} (Model "
      "Runner V1)", VC + "1651-1679, 1711-1717",
      lambda p: {"deploy.overlap_scheduler": False}),
    R("R75", "fallback", ("target.max_model_len", "draft.max_model_len"),
      lambda p: spec(p) and not mrv1(p) and p.draft is not None and isinstance(p.draft.max_model_len, int)
      and isinstance(p.target.max_model_len, int) and p.draft.max_model_len < p.target.max_model_len,
      "draft.max_model_len={p.draft.max_model_len} < target.max_model_len={p.target.max_model_len}: vLLM accepts, "
      "warns and serves target.max_model_len={new[target.max_model_len]} (Model Runner V2 cannot skip "
      "speculation for longer sequences); raise draft.max_model_len to keep the target's length", VC + "3025-3051",
      lambda p: {"target.max_model_len": p.draft.max_model_len}),
    R("R84", "error", ("deploy.attention_backend", "method.num_steps"),
      lambda p: spec(p) and (p.deploy.attention_backend or "").lower() in ("hpc", "hpc_attn") and gt(k(p), 3),
      "deploy.attention_backend={p.deploy.attention_backend} supports K <= 3", "v1/attention/backends/hpc_attn.py:127-137"),
    R("R98", "fallback", ("verify.rule",), lambda p: mrv1(p) and p.verify.rule == "block",
      "verify.rule=block is silently run as standard on Model Runner V1 (forced by this plan)",
      "v1/sample/rejection_sampler.py:80-115", lambda p: {"verify.rule": "standard"}),
    R("R99", "fallback", ("verify.draft_sampling",),
      lambda p: vm(p) == "ngram" and p.verify.draft_sampling == "probabilistic",
      "verify.draft_sampling=probabilistic: ngram drafts have no distribution and are verified one-hot",
      "v1/worker/gpu/spec_decode/ngram/speculator.py:155", lambda p: {"verify.draft_sampling": "greedy"}),
    R("R100", "fallback", ("schedule.kind",), lambda p: vm(p) == "ngram" and budget(p),
      "schedule.kind=budget: adaptive verification is silently off for ngram", "v1/worker/gpu/model_runner.py:703-706",
      lambda p: {"schedule.kind": "static"}),
    R("AV1", "error", ("schedule.kind", "deploy.lora.adapters"), lambda p: spec(p) and budget(p) and lora(p),
      "schedule.kind=budget (adaptive verification) does not support deploy.lora.adapters", VC + "3153-3182"),
    R("AV2", "error", ("schedule.kind", "deploy.cuda_graphs"),
      lambda p: spec(p) and budget(p) and p.deploy.cuda_graphs is False,
      "schedule.kind=budget needs full CUDA graphs; deploy.cuda_graphs=false", VC + "3153-3182"),
    R("AV3", "error", ("schedule.kind", "deploy.parallel.pp"),
      lambda p: spec(p) and budget(p) and gt(p.deploy.parallel.pp, 1),
      "schedule.kind=budget needs deploy.parallel.pp=1 (costs and confidences live on the last PP rank)",
      VC + "3153-3182"),
    # ---- deployment: structured output, reasoning, parallel sizes, CUDA graphs, memory, prefix cache --
    R("SO1", "error", ("deploy.structured_output.backend",),
      lambda p: p.deploy.structured_output.backend is not None
      and p.deploy.structured_output.backend not in _names("backend"),
      "deploy.structured_output.backend={p.deploy.structured_output.backend}: vLLM's structured-outputs backend is "
      "one of {names}{hint} (the config refuses other names)", "config/structured_outputs.py:14-16, 23",
      message_args=lambda p: {"names": ", ".join(_names("backend")),
                              "hint": _hint(p.deploy.structured_output.backend, "backend")}),
    R("SO2", "filled", ("deploy.structured_output.backend",),
      lambda p: p.deploy.structured_output.backend is None,
      "deploy.structured_output.backend unset: vLLM picks per request (auto: xgrammar, else guidance)",
      "config/structured_outputs.py:23-28", lambda p: {"deploy.structured_output.backend": "auto"}),
    R("SO3", "error", ("deploy.structured_output.backend", "deploy.structured_output.requests", "method.num_steps"),
      lambda p: spec(p) and p.deploy.structured_output.backend == "lm-format-enforcer" and grammar_requests(p),
      "deploy.structured_output.backend=lm-format-enforcer with speculation: vLLM refuses every request that carries "
      "a grammar (\"LM Format Enforcer backend does not support speculative tokens\"); use xgrammar or guidance",
      "v1/structured_output/backend_lm_format_enforcer.py:127-136"),
    R("SO4", "warning", ("deploy.structured_output.backend",),
      lambda p: p.deploy.structured_output.backend == "lm-format-enforcer",
      "deploy.structured_output.backend=lm-format-enforcer is deprecated (removed in vLLM 0.35.0) and cannot "
      "constrain speculative tokens (requests with a grammar fail when speculation is on); use auto, xgrammar or "
      "guidance", "config/structured_outputs.py:76-83; v1/structured_output/backend_lm_format_enforcer.py:127-136"),
    R("RP1", "error", ("deploy.reasoning_parser",),
      lambda p: p.deploy.reasoning_parser is not None and p.deploy.reasoning_parser.lower() != "none"
      and p.deploy.reasoning_parser not in _names("parser"),
      "deploy.reasoning_parser={p.deploy.reasoning_parser} is not a registered vLLM 0.33.0 reasoning parser{hint}: "
      "vLLM refuses it at launch (\"invalid reasoning parser\")", "entrypoints/common/cli_args.py:625-632",
      message_args=lambda p: {"hint": _hint(p.deploy.reasoning_parser, "parser")}),
    R("DTP1", "error", ("deploy.parallel.draft_tp", "deploy.parallel.tp"),
      lambda p: spec(p) and p.deploy.parallel.draft_tp is not None
      and p.deploy.parallel.draft_tp not in (1, p.deploy.parallel.tp),
      "deploy.parallel.draft_tp={p.deploy.parallel.draft_tp}: vLLM's draft_tensor_parallel_size must be 1 or the "
      "target's tensor_parallel_size ({p.deploy.parallel.tp}); it refuses other values", SP + "1851-1870"),
    R("DTP0", "filled", ("deploy.parallel.draft_tp",),
      lambda p: vm(p) in MODEL_BASED and p.deploy.parallel.draft_tp is None,
      "deploy.parallel.draft_tp unset: vLLM runs the draft at the target's tensor_parallel_size = "
      "{new[deploy.parallel.draft_tp]}", SP + "1680-1685, 1851-1870",
      lambda p: {"deploy.parallel.draft_tp": p.deploy.parallel.tp}),
    R("DTP2", "error", ("deploy.parallel.draft_tp", "method.name"),
      lambda p: vm(p) == "draft_model" and mrv1(p) and isinstance(p.deploy.parallel.draft_tp, int)
      and p.deploy.parallel.draft_tp != p.deploy.parallel.tp,
      "deploy.parallel.draft_tp={p.deploy.parallel.draft_tp} with method.name=draft_model on Model Runner V1 (forced "
      "by this plan): vLLM requires the draft's TP to equal the target's ({p.deploy.parallel.tp})",
      "v1/spec_decode/draft_model.py:64-80"),
    R("DPP1", "error", ("deploy.parallel.draft_pp", "deploy.parallel.draft_dp"),
      lambda p: spec(p) and (ne(p.deploy.parallel.draft_pp, 1) or ne(p.deploy.parallel.draft_dp, p.deploy.parallel.dp)),
      "deploy.parallel.draft_pp/draft_dp={p.deploy.parallel.draft_pp}/{p.deploy.parallel.draft_dp}: vLLM builds the "
      "draft's parallel config with pipeline size 1 inside each data-parallel replica and has no key for another; "
      "drop them", SP + "1890-1912"),
    R("PP3", "error", ("deploy.parallel.pp", "method.name", "target.architecture"),
      lambda p: vm(p) in ("eagle3", "dflash") and gt(p.deploy.parallel.pp, 1),
      "deploy.parallel.pp={p.deploy.parallel.pp} with method.name={p.method.name}: the drafter reads the target's "
      "auxiliary hidden states, which only some decoders carry across pipeline stages; {arch} does not, so vLLM "
      "refuses at load (\"does not support {p.method.name} with pipeline parallelism\"); use pp 1 or a Llama/Qwen2/"
      "Qwen3-family target", "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:43-64",
      needs=_arch_needs, decide=lambda p, f: _target_arch(p) not in AUX_OVER_PP,
      about="whether the target carries auxiliary hidden states over pipeline stages",
      message_args=lambda p: {"arch": _target_arch(p)}),
    R("CG1", "filled", ("deploy.cuda_graph_max_bs", "deploy.max_running_requests"),
      lambda p: graphs_on(p) and p.deploy.cuda_graph_max_bs is None,
      "deploy.cuda_graph_max_bs unset: vLLM captures uniform decode batches up to "
      "{new[deploy.cuda_graph_max_bs]:~request} ({q:~token} each, at most min(max_num_seqs · {q} · 2, 512) tokens)", VC + "2452-2552",
      lambda p: {"deploy.cuda_graph_max_bs": default_max_bs(p)}, message_args=lambda p: {"q": query_len(p)}),
    R("MEM1", "filled", ("deploy.memory_fraction",), lambda p: p.deploy.memory_fraction is None,
      "deploy.memory_fraction unset: vLLM's --gpu-memory-utilization defaults to 0.92 (weights, activations, CUDA "
      "graphs and the KV cache all come out of it)", "config/cache.py:215",
      lambda p: {"deploy.memory_fraction": 0.92}),
    R("PC1", "filled", ("deploy.prefix_caching",), lambda p: p.deploy.prefix_caching is None,
      "deploy.prefix_caching unset: vLLM enables prefix caching for generative models",
      "engine/arg_utils.py:3075-3076; config/cache.py:257", lambda p: {"deploy.prefix_caching": True}),
    R("PC2", "warning", ("deploy.prefix_caching", "method.name"),
      lambda p: vm(p) in ("eagle", "eagle3", "mtp") and p.deploy.prefix_caching is True,
      "deploy.prefix_caching with method.name={p.method.name}: a cache hit resumes one KV block earlier, because the "
      "draft's KV at a position needs the next token (the block is recomputed through the target and the draft); "
      "vLLM issue #19996 (open) measured +30-40% time-to-first-token on cache-friendly traffic. `specc explain` "
      "prices it; vLLM's speculative_config disable_eagle_block_drop (no plan key) keeps the block",
      "v1/core/kv_cache_coordinator.py:65-86; config/speculative.py:2122-2149"),
    R("IG4", "warning", ("schedule.buckets",), lambda p: p.schedule.kind == "static" and bool(p.schedule.buckets),
      "schedule.buckets is ignored with schedule.kind=static; set kind=batch_buckets or drop it", SP + "524"),
    R("IG6", "warning", ("deploy.disagg.role", "deploy.parallel.dp_attention"),
      lambda p: spec(p) and (p.deploy.disagg.role != "none" or p.deploy.parallel.dp_attention),
      "deploy.disagg.role / dp_attention are SGLang server settings; specc's vLLM export does not map them",
      SP + "410-659"),
)

PROFILE = Profile(name="vllm", version="vllm==0.33.0", root="vllm/", rules=RULES)
