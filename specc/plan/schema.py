"""The plan schema: typed dataclasses registered in Hydra's ConfigStore.

The user-facing keys are a public contract. A value of ``None`` means "not written by the
user": an engine profile's ``filled`` rules report the value the engine would put there, and
``fallback`` rules report values it overrides. The dataclasses are plain data; nothing here imports
torch.

Sources for field meanings: SGLang 0.5.23 ``sglang/srt/arg_groups/fields/spec.py`` and vLLM 0.33.0
``SpeculativeConfig`` (``vllm/config/speculative.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional



def __getattr__(name):
    """``METHOD_NAMES``: every ``method.name`` the method registry knows (:mod:`specc.methods`: the
    built-ins and the ``specc.methods`` entry points), read when first asked, not at import."""
    if name == "METHOD_NAMES":
        from specc import methods

        return methods.method_names()
    if name == "ENGINES":  # the engine packages and the specc.engines entry points (specc.engines)
        from specc import engines

        return engines.engine_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Longest plan name (characters): it becomes the artifact's directory ``<name>-<hash>`` and the
#: compile's temporary ``.<name>-<hash>.tmp-<random>``, which must stay within a file name's 255
#: bytes (Linux NAME_MAX) with room to spare.
MAX_NAME_LEN = 128
MODEL_FORMATS = ("hf", "gguf")
VERIFY_RULES = ("greedy", "standard", "block", "synthetic")
DRAFT_SAMPLING = ("greedy", "probabilistic")
SCHEDULE_KINDS = ("static", "batch_buckets", "adaptive", "budget", "auto")
RAGGED_VERIFY = ("static", "cap_accept", "compact")
MARKOV_KINDS = ("vanilla", "gated", "rnn")
DISAGG_ROLES = ("none", "prefill", "decode")
DEVICES = ("auto", "cpu", "cuda")
KERNEL_BACKENDS = ("auto", "triton", "torch")
COMPILE_BACKENDS = ("eager", "inductor", "auto", "tensorrt")
DTYPES = ("auto", "native", "float32", "float16", "bfloat16")  # native: a GGUF's own quantized weights (CPU)
#: grammar / structured-output backends either engine accepts: SGLang ``--grammar-backend``
#: (``sglang/srt/arg_groups/choices.py:131``), vLLM ``StructuredOutputsConfig.backend``
#: (``vllm/config/structured_outputs.py:14-16``); each engine's rules refuse the other's names
STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance", "llguidance", "outlines", "lm-format-enforcer", "none")


@dataclass
class TargetConfig:
    """The target model: checkpoint location, format, dtype and limits."""

    path: Optional[str] = None
    format: str = "hf"
    dtype: str = "auto"
    max_model_len: Optional[int] = None
    architecture: Optional[str] = None
    vocab_size: Optional[int] = None


@dataclass
class DraftConfig:
    """The draft model (absent for ngram, suffix and mtp, which need no separate checkpoint)."""

    path: Optional[str] = None
    format: str = "hf"
    architecture: Optional[str] = None
    vocab_size: Optional[int] = None
    max_model_len: Optional[int] = None


@dataclass
class NgramConfig:
    """Prompt-lookup window: the suffix n-gram sizes tried, longest first."""

    min: Optional[int] = None
    max: Optional[int] = None


@dataclass
class SuffixConfig:
    """Suffix decoding (vLLM's ``suffix_decoding_*`` keys, SpeculativeConfig; Arctic Inference's
    SuffixDecodingCache) and corpus drafting. ``None`` takes vLLM's defaults (24, 10000, 1.0, 0.1).

    ``max_tree_depth``: tokens a suffix tree keeps per suffix (the matched length plus the drafted
    length fit in it). ``max_cached_requests``: finished requests' outputs kept in the global tree
    (FIFO eviction; 0: none). ``max_spec_factor``: at most ``factor × matched length`` drafts.
    ``min_token_prob``: the floor of a draft's estimated probability (its empirical frequency).
    ``corpora``: text files, directories of ``.txt`` files or installable corpus names tokenized into
    the global tree at load. ``max_corpus_tokens``: the tokens corpora and documents added at run time
    (``specc serve``'s ``POST /v1/suffix/documents``) may take in all."""

    max_tree_depth: Optional[int] = None
    max_cached_requests: Optional[int] = None
    max_spec_factor: Optional[float] = None
    min_token_prob: Optional[float] = None
    corpora: List[str] = field(default_factory=list)
    max_corpus_tokens: Optional[int] = None


@dataclass
class MarkovConfig:
    """DSpark's Markov correction head (SGLang ``sglang/srt/speculative/dspark_components``;
    ``sglang/srt/models/dspark.py:186-382``)."""

    kind: Optional[str] = None
    rank: Optional[int] = None


@dataclass
class MethodConfig:
    """How drafts are proposed. ``num_steps`` is κ; ``num_draft_tokens`` is the verify width with
    the bonus/root included (SGLang's meaning: chain = κ + 1)."""

    name: str = "none"
    num_steps: Optional[int] = None
    topk: Optional[int] = None
    num_draft_tokens: Optional[int] = None
    parallel_drafting: bool = False
    block_size: Optional[int] = None
    ngram: NgramConfig = field(default_factory=NgramConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    markov: MarkovConfig = field(default_factory=MarkovConfig)
    confidence_head: Optional[bool] = None
    tree_choices: Optional[List[List[int]]] = None
    plugin: Optional[str] = None


@dataclass
class SyntheticConfig:
    """Synthetic acceptance (vLLM's benchmarking aid): a mean acceptance length or per-position rates."""

    acceptance_length: Optional[float] = None
    acceptance_rates: Optional[List[float]] = None


@dataclass
class AcceptThresholdConfig:
    """SGLang's ``--speculative-accept-threshold-single`` / ``-acc`` (spec.py:109-116)."""

    single: Optional[float] = None
    acc: Optional[float] = None


@dataclass
class VerifyConfig:
    """The verify rule and how draft tokens were sampled."""

    rule: str = "greedy"
    draft_sampling: str = "greedy"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    accept_threshold: AcceptThresholdConfig = field(default_factory=AcceptThresholdConfig)


@dataclass
class BucketConfig:
    """One batch bucket of the schedule: the κ candidates allowed at this batch size."""

    candidates: List[int] = field(default_factory=list)
    up_hysteresis: Optional[float] = None
    down_hysteresis: Optional[float] = None
    ceiling_coeff: Optional[float] = None


@dataclass
class ScheduleConfig:
    """When the runtime uses which κ. ``buckets`` is keyed by batch size (floor lookup).
    ``alpha``: the per-position acceptance the cost model assumes (``auto``, ``explain``), e.g.
    measured by ``specc run --json``; default 0.7 (a textbook value, never a prediction).
    ``acceptance``: an acceptance record file (``specc tune``'s ``S.acceptance.json``, format in
    :mod:`specc.predict.acceptance`) whose entry for this plan's drafter gives the per-position rates the
    cost model uses (ahead of ``alpha``); ``cost_table`` and ``acceptance``, when relative and written
    in a plan file, resolve against that file's folder."""

    kind: str = "static"
    buckets: Dict[int, BucketConfig] = field(default_factory=dict)
    ema_alpha: Optional[float] = None
    warmup_batches: Optional[int] = None
    update_interval: Optional[int] = None
    capture_batch_sizes: Optional[List[int]] = None
    ragged_verify: str = "static"
    cost_table: Optional[str] = None
    hardware: Optional[str] = None
    alpha: Optional[float] = None
    acceptance: Optional[str] = None


@dataclass
class LoraConfig:
    adapters: List[str] = field(default_factory=list)
    max_loras_per_batch: Optional[int] = None


@dataclass
class DisaggConfig:
    role: str = "none"


@dataclass
class ParallelConfig:
    """Parallel sizes of the target and of the draft. ``draft_tp``: vLLM's
    ``draft_tensor_parallel_size`` (1 or ``tp``; unset = ``tp``); ``draft_pp`` / ``draft_dp``: the
    draft's pipeline and data-parallel sizes (both engines run the draft with pipeline size 1 inside
    each data-parallel replica of the target; unset = what the engine does)."""

    tp: int = 1
    dp: int = 1
    pp: int = 1
    dp_attention: bool = False
    two_batch_overlap: bool = False
    draft_tp: Optional[int] = None
    draft_pp: Optional[int] = None
    draft_dp: Optional[int] = None


@dataclass
class StructuredOutputConfig:
    """Grammar-constrained decoding (JSON schema, regex, EBNF): the engine's backend (SGLang
    ``--grammar-backend``, vLLM ``--structured-outputs-config.backend``) and whether the deployment's
    requests carry a grammar (``requests: true``), which is what decides most of the interactions
    with speculation. Unset = the engine's default backend; requests unknown."""

    backend: Optional[str] = None
    requests: Optional[bool] = None


@dataclass
class DeployConfig:
    """Serving-side settings that interact with speculation (LoRA, disaggregation, parallelism,
    structured output, CUDA graphs, memory, prefix caching).

    ``cuda_graph_max_bs``: the largest batch (requests) the engine captures a decode/verify CUDA
    graph for (SGLang ``--cuda-graph-max-bs-decode``; vLLM ``--max-cudagraph-capture-size`` counts
    tokens, so it is exported as ``cuda_graph_max_bs · (K + 1)``); ``cuda_graph_batch_sizes``: the
    captured batch sizes themselves. ``memory_fraction``: the share of GPU memory the engine takes up
    front (SGLang ``--mem-fraction-static``: weights + KV-cache pool, CUDA graphs and activations live
    in the rest; vLLM ``--gpu-memory-utilization``: everything vLLM allocates). ``prefix_caching``:
    reuse the KV of a shared prompt prefix (SGLang's radix cache, vLLM ``--enable-prefix-caching``).
    ``reasoning_parser``: the parser that splits reasoning from the answer (a grammar applies after
    the reasoning ends)."""

    lora: LoraConfig = field(default_factory=LoraConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    overlap_scheduler: Optional[bool] = None
    page_size: Optional[int] = None
    attention_backend: Optional[str] = None
    cuda_graphs: Optional[bool] = None
    max_running_requests: Optional[int] = None
    structured_output: StructuredOutputConfig = field(default_factory=StructuredOutputConfig)
    reasoning_parser: Optional[str] = None
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_batch_sizes: Optional[List[int]] = None
    memory_fraction: Optional[float] = None
    prefix_caching: Optional[bool] = None


@dataclass
class RuntimeConfig:
    """specc's own runtime: where and how the compiled programs run."""

    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 8
    kernel_backend: str = "auto"
    compile_backend: str = "eager"


@dataclass
class Plan:
    """A whole speculation plan. ``engine`` names the profile it targets."""

    name: str = "plan"
    engine: str = "specc"
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: Optional[DraftConfig] = None
    method: MethodConfig = field(default_factory=MethodConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    deploy: DeployConfig = field(default_factory=DeployConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)


def register_configs() -> None:
    """Register the schema in Hydra's ConfigStore (``plan_schema`` plus one ``<group>/schema``
    per group), so YAML files can name it first in their ``defaults`` list."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="plan_schema", node=Plan)
    for group, node in (("target", TargetConfig), ("draft", DraftConfig), ("method", MethodConfig),
                        ("verify", VerifyConfig), ("schedule", ScheduleConfig),
                        ("deploy", DeployConfig), ("runtime", RuntimeConfig)):
        cs.store(group=group, name="schema", node=node)


def plan_to_dict(plan: Plan) -> Dict[str, Any]:
    """The plan as plain nested dicts/lists (JSON- and YAML-safe), keys in schema order."""
    from dataclasses import asdict

    return asdict(plan)
