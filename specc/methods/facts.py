"""The facts a method row states (:class:`Method`, :class:`RuntimeSupport`) and their vocabularies.

Each method package (``specc/methods/<name>/__init__.py``) declares its row with these types; the
registry (:mod:`specc.methods`) collects the rows. Torch-free and import-free (only
:mod:`specc.errors`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# How a method proposes its draft tokens (the draft shape of one step):
#   "none"   - no drafts (plain decoding)
#   "lookup" - a host lookup in the request's own tokens, no model forward (n-gram, suffix)
#   "chain"  - κ sequential draft forwards, one token each (draft model, EAGLE heads, MTP)
#   "block"  - one draft forward emits the whole block of κ tokens (DFlash, DSpark)
#   "heads"  - one pass of κ heads over the target's last hidden state (Medusa)
DRAFT_SHAPES = ("none", "lookup", "chain", "block", "heads")

# Which target hidden states a drafter consumes:
#   "none"   - tokens only
#   "last"   - the target's final-norm hidden state (EAGLE-1, Medusa, MTP)
#   "fused"  - several layers fused into one feature (EAGLE-3: low / mid / high layers)
#   "layers" - K/V context projected from chosen target layers (DFlash/DSpark ``target_layer_ids``)
HIDDEN_KINDS = ("none", "last", "fused", "layers")

# What the prefill instance ships to the decode instance beyond the prompt's KV, so the decode side
# speculates on its first step (SGLang 0.5.23: the draft KV rides the KV transfer,
# sglang/srt/disaggregation/prefill.py:301-317; the draft hidden state and top-k in the metadata
# buffer, disaggregation/utils.py:466-476):
#   "none"         - nothing (plain decoding, lookups: they read the token history)
#   "draft_prefill"- nothing, but the decode side must prefill the draft model's own KV
#   "hidden_topk"  - the draft hidden state and the draft's top-k (SGLang ``EagleDraftInput``)
#   "lengths"      - nothing beyond the last token and the sequence lengths (DFlash/DSpark)
SEED_KINDS = ("none", "draft_prefill", "hidden_topk", "target_hidden", "lengths")

VERIFY_RULES = ("greedy", "standard", "block", "synthetic")
SCHEDULES = ("static", "batch_buckets", "adaptive", "budget", "auto")


@dataclass(frozen=True)
class RuntimeSupport:
    """What specc's own runtime runs for a method.

    Attributes:
        drafter: ``"module:function"`` of the runtime drafter factory, called as
            ``factory(spec, target, tokenizer, device, max_seq_len)`` with the artifact's runtime
            section (:func:`build_drafter`); empty for plain decoding.
        verify_rules: verify rules the runtime runs for the method.
        draft_sampling: ``verify.draft_sampling`` values the drafter can honour.
        schedules: ``schedule.kind`` values the runtime runs for the method.
        confidence: where the ``budget`` schedule's per-position confidence comes from:
            ``"draft_probability"`` (the drafter's probability of its proposal), ``"online"``
            (a per-position acceptance estimate learned online, vLLM's fallback for drafts without
            a distribution), ``"head"`` (a trained confidence head), ``"frequency"`` (the empirical
            frequency of the drafted continuation: suffix decoding), ``""`` (none).
        shapes: state kinds (:func:`state_kind`) the runtime runs: ``plain``, ``chain``, ``parallel``,
            ``tree``.
    """

    drafter: str
    verify_rules: Tuple[str, ...] = ("greedy", "standard", "synthetic")
    draft_sampling: Tuple[str, ...] = ("greedy",)
    schedules: Tuple[str, ...] = SCHEDULES
    confidence: str = ""
    shapes: Tuple[str, ...] = ("plain", "chain")


@dataclass(frozen=True)
class Method:
    """Every fact about one draft method.

    Attributes:
        name: the plan's ``method.name``.
        summary: one line for messages and docs.
        draft_shape: one of :data:`DRAFT_SHAPES`.
        needs_draft_checkpoint: ``draft.path`` must name a checkpoint (a draft model or head).
        has_draft_kv: the drafter keeps its own KV cache (SGLang ``has_draft_kv``;
            spec_info.py:174-178). Frozen-KV MTP reads the target's KV instead (``frozen_kv``).
        frozen_kv: the drafter attends over the target's KV and keeps none (SGLang FROZEN_KV_MTP,
            sglang/srt/speculative/frozen_kv_mtp_*.py).
        target_hidden: one of :data:`HIDDEN_KINDS`.
        parallel_capable: ``method.parallel_drafting: true`` makes one pass emit the block (vLLM
            PARD for draft_model, P-EAGLE for eagle/eagle3; vLLM config/speculative.py:511).
        always_parallel: one pass emits the block whatever the plan says (vLLM config/speculative.py:1581-1582 sets
            ``parallel_drafting`` for dflash/dspark).
        dynamic_tree: ``method.topk > 1`` builds an EAGLE-2 style tree per step (SGLang
            sglang/srt/speculative/eagle_worker_v2.py:742-919).
        static_tree: ``method.tree_choices`` (Medusa-style paths) is meaningful.
        default_num_steps: κ when the plan leaves ``method.num_steps`` unset: SGLang's EG12 default
            (speculative_hook.py:1164-1174: "anything else -> (3, 1, 4)"), DFlash's block 16
            (DF13, speculative_hook.py:389-425: γ = 15), DSpark's γ = 7 (DS13, dspark_config.py:21)
            and suffix decoding's K = ``suffix_decoding_max_tree_depth`` = 24 (vLLM config/speculative.py:1732-1739).
        default_c: draft cost ratio c = t_draft / t_target of one draft pass when nothing better is
            known: a 1B-class draft for an 8B target (0.165) for separate draft models; a one-layer
            head (0.25 ms over an 8B bf16 target's 5.97 ms memory floor on an H100 = 0.042) for heads and block
            drafters; 0.01 for Medusa's residual heads; 0 for lookups.
        seed: one of :data:`SEED_KINDS`: what ``specc serve``'s prefill instance ships for the drafter
            (``specc.runtime.disagg``): ``hidden_topk`` the head's KV (if it keeps one) and state,
            ``draft_prefill`` nothing (the decode side prefills the draft model), ``target_hidden`` the
            target's hidden states at the drafter's layers over the prompt (Medusa, DFlash, DSpark),
            ``none`` nothing.
        extend_pass: the extend stage runs a draft forward over the accepted tokens (SGLang's
            draft-extend); None: the same as ``has_draft_kv``. False for the draft model (its KV catches
            up inside its next first proposal pass) and DFlash/DSpark (their context K/V is projected
            from the target's hidden states, no draft forward: SGLang's DFlash has "no draft/draft-extend
            split"); frozen-KV MTP has no draft KV to extend.
        draft_from_extend: the extend pass's last output gives draft 1, so κ drafts take κ − 1
            proposal passes (the EAGLE family: SGLang's EAGLE worker runs num_steps − 1 recurrent
            calls and one draft extension per iteration, and the extension's output starts the next
            iteration, sglang/srt/speculative/eagle_worker_v2.py:742-919).
        target_ships_draft: the draft layers usually ship inside the target checkpoint (MTP/NEXTN);
            ``draft.path`` is optional and defaults to the target's (SGLang EG6).
        runtime: :class:`RuntimeSupport`, or None when specc's runtime does not run the method
            (``specc check --engine specc`` refuses it; export it to SGLang/vLLM).
        option_sections: the ``method.*`` sub-sections the method reads (``"ngram"``, ``"suffix"``,
            ``"markov"``, ``"confidence_head"``, ``"plugin"``); the rules fill and check these and warn
            when a plan sets one the method ignores.
        one_module_per_step: the draft checkpoint holds one module per draft step (κ ≤ its module
            count; no adaptive κ: SGLang's ``MultiLayerEagleWorkerV2`` has no adaptive support).
        shares_target_head: the drafter projects through the target's LM head and its checkpoint stores
            none (the MTP family), so a draft pass streams the target's head too (:mod:`specc.predict.sizing`).
        sglang_algorithm: the ``SpeculativeAlgorithm`` SGLang 0.5.23 runs the method as, after its
            aliasing (``sglang/srt/speculative/spec_info.py:174-178``; NEXTN becomes EAGLE,
            ``speculative_hook.py:1062-1082``); None when SGLang lacks the method (or for plain decoding).
        sglang_flag: the ``--speculative-algorithm`` value ``specc export`` writes; None: the same as
            ``sglang_algorithm`` (``mtp`` is written NEXTN).
        sglang_multi_layer: SGLang runs it with ``--enable-multi-layer-eagle`` (one MTP module per step,
            ``speculative_hook.py:1203-1215``).
        vllm_method: vLLM 0.33.0's ``SpeculativeConfig.method`` value (``vllm/config/speculative.py``
            ``SpeculativeMethod``); None when vLLM lacks the method (or for plain decoding).
        train_kinds: ``(kind, "module:Class")`` of the training tool's drafter kinds that train a
            checkpoint for the method (:mod:`specc.train.kinds`); empty when nothing is trained.
        example_draft: a ``conf/draft`` preset holding a checkpoint for the method, named in messages
            (``defaults: - /draft: NAME``); None when there is none.
    """

    name: str
    summary: str
    draft_shape: str
    needs_draft_checkpoint: bool
    has_draft_kv: bool
    target_hidden: str
    default_c: float
    seed: str
    frozen_kv: bool = False
    extend_pass: Optional[bool] = None
    draft_from_extend: bool = False
    target_ships_draft: bool = False
    default_num_steps: int = 3
    parallel_capable: bool = False
    always_parallel: bool = False
    dynamic_tree: bool = False
    static_tree: bool = False
    runtime: Optional[RuntimeSupport] = None
    option_sections: Tuple[str, ...] = ()
    one_module_per_step: bool = False
    shares_target_head: bool = False
    sglang_algorithm: Optional[str] = None
    sglang_flag: Optional[str] = None
    sglang_multi_layer: bool = False
    vllm_method: Optional[str] = None
    train_kinds: Tuple[Tuple[str, str], ...] = ()
    example_draft: Optional[str] = None

    @property
    def trains(self) -> bool:
        """``specc train`` trains a checkpoint for the method (it has a drafter kind)."""
        return bool(self.train_kinds)

    @property
    def engine_names(self) -> Dict[str, Optional[str]]:
        """The name each engine runs the method as (``specc`` its own, ``sglang`` the algorithm,
        ``vllm`` the method value); None where that engine lacks it."""
        return {"specc": self.name if self.runtime is not None else None, "sglang": self.sglang_algorithm,
                "vllm": self.vllm_method}

    @property
    def lookup(self) -> bool:
        """Drafts come from a lookup, no draft forward pass."""
        return self.draft_shape == "lookup"

    @property
    def drafts(self) -> bool:
        """The method proposes draft tokens at all (False for plain decoding)."""
        return self.draft_shape != "none"

    @property
    def consumes_hidden(self) -> bool:
        """The drafter reads target hidden states (EAGLE family, MTP, DFlash/DSpark, Medusa)."""
        return self.target_hidden != "none"

    @property
    def extend_forward(self) -> bool:
        """The extend stage runs a draft forward (see ``extend_pass``)."""
        return self.has_draft_kv if self.extend_pass is None else bool(self.extend_pass)

    @property
    def seed_carries_hidden(self) -> bool:
        """The disaggregation seed carries the draft hidden state (SGLang
        ``carries_draft_hidden_states``, sglang/srt/speculative/spec_info.py)."""
        return self.seed == "hidden_topk"


CHAIN_RUNTIME = dict(verify_rules=("greedy", "standard", "block", "synthetic"), schedules=SCHEDULES,
                      shapes=("plain", "chain"))
# chain drafters that also emit the block in one pass with method.parallel_drafting (PARD, P-EAGLE)
PARALLEL_CAPABLE_RUNTIME = dict(CHAIN_RUNTIME, shapes=("plain", "chain", "parallel"))
# block drafters: one non-causal pass over [bonus, MASK × γ] (DFlash, DSpark)
BLOCK_RUNTIME = dict(verify_rules=("greedy", "standard", "block", "synthetic"), schedules=SCHEDULES,
                      draft_sampling=("greedy", "probabilistic"), shapes=("plain", "parallel"))
# EAGLE heads also grow trees: dynamic (topk > 1) and static (tree_choices), verified in one target
# forward with the tree mask (specc.runtime.stages.verify_tree; SGLang eagle_utils.py:138-234); the block rule
# stays a chain rule (refused on trees by the S-VERIFY rule)
TREE_RUNTIME = dict(PARALLEL_CAPABLE_RUNTIME, shapes=("plain", "chain", "parallel", "tree"))
