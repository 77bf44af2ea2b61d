"""The method registry: every fact about a draft method that the rest of specc asks, one row each.

One :class:`Method` row per ``method.name``. Lowering, stage graphs, the cost model, the engine
profiles' rules (``specc``, ``sglang``, ``vllm``), the exporters, the training tool's drafter kinds,
codegen and the runtime's drafter construction read the row's facts instead of comparing method
names, so a new method is one drafter module plus one row (SGLang keeps the same facts on its
``SpeculativeAlgorithm`` enum: ``has_draft_kv``, ``carries_draft_hidden_states``, ``create_worker``;
``sglang/srt/speculative/spec_info.py:174-178``). Where an engine's own code branches on its
algorithm or method string, the rules compare that engine's name, read from the row
(``sglang_algorithm``, ``vllm_method``), never ``method.name``.

Rows register through the ``specc.methods`` entry-point group (``name = "module:attr"`` naming a
row); the built-ins are declared in ``pyproject.toml`` the same way, and :data:`BUILTIN` keeps them
available when the installed metadata is stale. :data:`METHODS` reads the entry points on first use.

Torch-free and import-free (only :mod:`specc.errors`; a plugin row's module is imported when the
registry is first read): ``specc check`` and ``specc explain`` read it.
"""
from __future__ import annotations

import importlib
import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from specc.errors import PlanError

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


_CHAIN_RUNTIME = dict(verify_rules=("greedy", "standard", "block", "synthetic"), schedules=SCHEDULES,
                      shapes=("plain", "chain"))
# chain drafters that also emit the block in one pass with method.parallel_drafting (PARD, P-EAGLE)
_PARALLEL_CAPABLE_RUNTIME = dict(_CHAIN_RUNTIME, shapes=("plain", "chain", "parallel"))
# block drafters: one non-causal pass over [bonus, MASK × γ] (DFlash, DSpark)
_BLOCK_RUNTIME = dict(verify_rules=("greedy", "standard", "block", "synthetic"), schedules=SCHEDULES,
                      draft_sampling=("greedy", "probabilistic"), shapes=("plain", "parallel"))
# EAGLE heads also grow trees: dynamic (topk > 1) and static (tree_choices), verified in one target
# forward with the tree mask (specc.runtime.stages.verify_tree; SGLang eagle_utils.py:138-234); the block rule
# stays a chain rule (refused on trees by the S-VERIFY rule)
_TREE_RUNTIME = dict(_PARALLEL_CAPABLE_RUNTIME, shapes=("plain", "chain", "parallel", "tree"))

# The built-in rows. Each is declared in pyproject.toml under [project.entry-points."specc.methods"]
# (``none = "specc.methods:NONE"``...) exactly as a third-party method is; :data:`BUILTIN` is the
# fallback when the installed package metadata predates that table (an editable install not re-run).
NONE = Method("none", "plain decoding: κ = 0, every step emits the target's own token", "none",
       needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0, seed="none",
       runtime=RuntimeSupport(drafter="", verify_rules=("greedy", "standard"),
                              draft_sampling=("greedy", "probabilistic"), schedules=("static",),
                              shapes=("plain",)))
NGRAM = Method("ngram", "prompt lookup: continue the longest earlier match of the last tokens (no model)", "lookup",
       needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0, seed="none",
       runtime=RuntimeSupport(drafter="specc.methods.ngram.drafter:build_drafter", confidence="online",
                              **_CHAIN_RUNTIME),
       option_sections=("ngram",), sglang_algorithm="NGRAM", vllm_method="ngram")
SUFFIX = Method("suffix", "suffix decoding: suffix trees over the prompt, earlier outputs and corpora (no model)",
       "lookup", needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0,
       seed="none", dynamic_tree=True, default_num_steps=24,
       runtime=RuntimeSupport(drafter="specc.methods.suffix.drafter:build_drafter", confidence="frequency",
                              verify_rules=("greedy", "standard"), schedules=SCHEDULES,
                              shapes=("plain", "chain", "tree")),
       option_sections=("suffix",), vllm_method="suffix")
DRAFT_MODEL = Method("draft_model", "a separate small causal LM drafts κ tokens one by one", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="none", default_c=0.165,
       seed="draft_prefill", parallel_capable=True, extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods.draft_model.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **_PARALLEL_CAPABLE_RUNTIME),
       sglang_algorithm="STANDALONE", vllm_method="draft_model",
       train_kinds=(("pard", "specc.methods.dflash.recipe:PardKind"),),
       example_draft="smollm2_135m_shallow")
EAGLE = Method("eagle", "EAGLE head: one decoder layer over [token embedding; target's last hidden state]", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="last", default_c=0.042,
       seed="hidden_topk", parallel_capable=True, dynamic_tree=True, static_tree=True, draft_from_extend=True,
       runtime=RuntimeSupport(drafter="specc.methods.eagle.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **_TREE_RUNTIME),
       sglang_algorithm="EAGLE", vllm_method="eagle", train_kinds=(("eagle", "specc.methods.eagle.recipe:EagleKind"),),
       example_draft="smollm2_135m_eagle")
EAGLE3 = Method("eagle3", "EAGLE-3 head: fused low/mid/high target layers, reduced draft vocabulary", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="fused", default_c=0.042,
       seed="hidden_topk", parallel_capable=True, dynamic_tree=True, static_tree=True, draft_from_extend=True,
       runtime=RuntimeSupport(drafter="specc.methods.eagle.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **_TREE_RUNTIME),
       sglang_algorithm="EAGLE3", vllm_method="eagle3", train_kinds=(("eagle3", "specc.methods.eagle.recipe:Eagle3Kind"),),
       example_draft="smollm2_135m_eagle3")
MTP = Method("mtp", "DeepSeek-style MTP (NEXTN) layer over [norm(embedding); norm(hidden)], run recurrently", "chain",
       needs_draft_checkpoint=False, has_draft_kv=True, target_hidden="last", default_c=0.042,
       seed="hidden_topk", dynamic_tree=True, draft_from_extend=True, target_ships_draft=True,
       runtime=RuntimeSupport(drafter="specc.methods.mtp.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **dict(_CHAIN_RUNTIME, shapes=("plain", "chain", "tree"))),
       shares_target_head=True, sglang_algorithm="EAGLE", sglang_flag="NEXTN", vllm_method="mtp",
       train_kinds=(("mtp", "specc.methods.mtp.recipe:MTPKind"),),
       example_draft="smollm2_135m_mtp")
MULTI_LAYER_EAGLE = Method("multi_layer_eagle", "one MTP module per draft step (SGLang's draft_runners)", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="last", default_c=0.042,
       seed="hidden_topk", draft_from_extend=True,
       runtime=RuntimeSupport(drafter="specc.methods.multi_layer_eagle.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **dict(_CHAIN_RUNTIME, schedules=("static", "batch_buckets", "budget"))),
       one_module_per_step=True, shares_target_head=True, sglang_algorithm="EAGLE", sglang_multi_layer=True,
       train_kinds=(("multi_layer_eagle", "specc.methods.mtp.recipe:MultiLayerEagleKind"),),
       example_draft="smollm2_135m_multi_layer_eagle")
FROZEN_KV_MTP = Method("frozen_kv_mtp", "an assistant drafter attending over the target's KV (keeps none of its own)",
       "chain", needs_draft_checkpoint=True, has_draft_kv=False, frozen_kv=True, target_hidden="last",
       default_c=0.042, seed="hidden_topk",
       runtime=RuntimeSupport(drafter="specc.methods.frozen_kv_mtp.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **_CHAIN_RUNTIME),
       shares_target_head=True, sglang_algorithm="FROZEN_KV_MTP", train_kinds=(("frozen_kv_mtp", "specc.methods.mtp.recipe:FrozenKVMTPKind"),),
       example_draft="smollm2_135m_frozen_kv_mtp")
MEDUSA = Method("medusa", "κ residual heads over the target's last hidden state, one pass, static tree", "heads",
       needs_draft_checkpoint=True, has_draft_kv=False, target_hidden="last", default_c=0.01,
       seed="target_hidden", always_parallel=True, static_tree=True,
       runtime=RuntimeSupport(drafter="specc.methods.medusa.drafter:build_drafter", verify_rules=("greedy", "standard"),
                              draft_sampling=("greedy", "probabilistic"), schedules=SCHEDULES,
                              confidence="draft_probability", shapes=("plain", "parallel", "tree")),
       train_kinds=(("medusa", "specc.methods.medusa.recipe:MedusaKind"),),
       example_draft="smollm2_135m_medusa")
DFLASH = Method("dflash", "block diffusion draft: [bonus, MASK × γ] in one non-causal pass over target context",
       "block", needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="layers", default_c=0.042,
       seed="target_hidden", always_parallel=True, default_num_steps=15, extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods.dflash.drafter:build_drafter", confidence="draft_probability",
                              **_BLOCK_RUNTIME),
       sglang_algorithm="DFLASH", vllm_method="dflash", train_kinds=(("dflash", "specc.methods.dflash.recipe:DFlashKind"),),
       example_draft="smollm2_135m_dflash")
DSPARK = Method("dspark", "DFlash backbone + low-rank Markov head + confidence head", "block",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="layers", default_c=0.042,
       seed="target_hidden", always_parallel=True, default_num_steps=7, extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods.dflash.drafter:build_drafter", confidence="head",
                              **_BLOCK_RUNTIME),
       option_sections=("markov", "confidence_head"), sglang_algorithm="DSPARK", vllm_method="dspark",
       train_kinds=(("dspark", "specc.methods.dflash.recipe:DSparkKind"),),
       example_draft="smollm2_135m_dspark")
CUSTOM = Method("custom", "a user drafter plugin (method.plugin)", "chain",
       needs_draft_checkpoint=False, has_draft_kv=True, target_hidden="none", default_c=0.165,
       seed="draft_prefill", extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods:build_plugin_drafter",
                              verify_rules=("greedy", "standard"), draft_sampling=("greedy", "probabilistic"),
                              schedules=SCHEDULES, shapes=("plain", "chain")),
       option_sections=("plugin",), sglang_algorithm="PLUGIN", vllm_method="custom_class")

#: The built-in rows, in table order (the registry lists them first).
BUILTIN: Tuple[Method, ...] = (NONE, NGRAM, SUFFIX, DRAFT_MODEL, EAGLE, EAGLE3, MTP, MULTI_LAYER_EAGLE, FROZEN_KV_MTP, MEDUSA, DFLASH, DSPARK, CUSTOM)


#: Entry-point group through which a method registers: ``name = "module:attr"`` naming a
#: :class:`Method` row whose ``name`` is the entry point's name (the built-ins declare theirs in
#: pyproject.toml the same way).
METHOD_ENTRY_POINT_GROUP = "specc.methods"


class MethodRegistry(MutableMapping):
    """``method.name`` -> :class:`Method`: the built-in rows, then every row of the ``specc.methods``
    entry points (sorted by name), read on first use (nothing reads package metadata at import).

    The built-in rows come from :data:`BUILTIN` whatever the installed metadata says, so stale
    metadata (an editable install from before the entry-point table) loses nothing. An entry point
    that cannot be loaded, names no :class:`Method`, has a row named differently, or takes a
    built-in's name with another row is skipped with a warning, and :func:`get` lists it when its
    name is asked for. Mutable so a test can add a row (``monkeypatch.setitem``); :meth:`reload`
    reads the entry points again (after ``sys.path`` changes).
    """

    def __init__(self) -> None:
        self._rows: Optional[Dict[str, Method]] = None
        self.problems: Dict[str, str] = {}

    def _table(self) -> Dict[str, Method]:
        if self._rows is None:
            self._rows, self.problems = _discover()
            for name, why in self.problems.items():
                warnings.warn(f"{METHOD_ENTRY_POINT_GROUP} entry point {name!r} skipped: {why}", stacklevel=3)
        return self._rows

    def reload(self) -> None:
        """Forget the table; the next lookup reads the entry points again."""
        self._rows = None
        self.problems = {}

    def __getitem__(self, name: str) -> Method:
        return self._table()[name]

    def __setitem__(self, name: str, row: Method) -> None:
        if not isinstance(row, Method) or row.name != name:
            raise PlanError(f"method registry: {name!r} must map to a Method row named {name!r}")
        self._table()[name] = row

    def __delitem__(self, name: str) -> None:
        del self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __repr__(self) -> str:
        return f"MethodRegistry({list(self._table())})"


def _discover() -> Tuple[Dict[str, Method], Dict[str, str]]:
    """The rows of :data:`BUILTIN` and of the ``specc.methods`` entry points, and why each skipped
    entry point was skipped (by entry-point name)."""
    from importlib.metadata import entry_points

    rows: Dict[str, Method] = {m.name: m for m in BUILTIN}
    problems: Dict[str, str] = {}
    try:
        eps = list(entry_points(group=METHOD_ENTRY_POINT_GROUP))
    except Exception as exc:  # unreadable metadata of some installed distribution
        return rows, {"*": f"the entry points cannot be read ({type(exc).__name__}: {exc})"}
    extra: Dict[str, Method] = {}
    for ep in sorted(eps, key=lambda e: e.name):
        try:
            row = ep.load()
        except Exception as exc:  # an import error inside the plugin, or a missing attribute
            problems[ep.name] = f"{ep.value!r} cannot be loaded ({type(exc).__name__}: {exc})"
            continue
        if ep.name in rows:
            if row != rows[ep.name]:
                problems[ep.name] = f"{ep.value!r} takes the built-in method name {ep.name!r} (reserved)"
        elif not isinstance(row, Method):
            problems[ep.name] = f"{ep.value!r} is a {type(row).__name__}, not a specc.methods.Method row"
        elif row.name != ep.name:
            problems[ep.name] = f"{ep.value!r} is the row of method {row.name!r}; name the entry point {row.name!r}"
        elif ep.name in extra and extra[ep.name] != row:
            problems[ep.name] = f"{ep.value!r}: two distributions register method {ep.name!r}"
        else:
            extra[ep.name] = row
    rows.update(extra)
    return rows, problems


METHODS = MethodRegistry()


def get(name: str) -> Method:
    """The row of ``method.name`` ``name``.

    Raises:
        PlanError: no such method, naming the known methods (and why an entry point of that name was
            skipped, if one was).
    """
    try:
        return METHODS[name]
    except KeyError:
        pass
    why = METHODS.problems.get(name)
    hint = (f" (its {METHOD_ENTRY_POINT_GROUP!r} entry point was skipped: {why})" if why else
            f"; a third-party method registers a Method row through the {METHOD_ENTRY_POINT_GROUP!r} entry-point group")
    raise PlanError(f"method.name: unknown method {name!r}; known: {', '.join(METHODS)}{hint}") from None


def method_names() -> Tuple[str, ...]:
    """Every registered method name: the built-ins in table order, then registered ones by name."""
    return tuple(METHODS)


def for_engine_name(engine: str, engine_name: str) -> Tuple[str, ...]:
    """The methods ``engine`` (``sglang`` / ``vllm``) runs under ``engine_name`` (its algorithm or
    method value), in registry order: the inverse of :attr:`Method.engine_names`."""
    return tuple(n for n, m in METHODS.items() if m.engine_names.get(engine) == engine_name)


def runtime_methods() -> Tuple[str, ...]:
    """Names of the methods specc's runtime runs, in table order."""
    return tuple(n for n, m in METHODS.items() if m.runtime is not None)


def is_parallel(name: str, parallel_drafting: bool) -> bool:
    """True when one draft pass emits the whole block: always for DFlash, DSpark and Medusa; for
    parallel-capable methods when ``method.parallel_drafting`` is set (PARD, P-EAGLE)."""
    m = get(name)
    return m.always_parallel or (bool(parallel_drafting) and m.parallel_capable)


def state_kind(num_steps: int, topk: int, parallel: bool, tree_choices: Any) -> str:
    """``plain`` (κ = 0), ``tree`` (topk > 1 or a static tree), ``parallel`` or ``chain``."""
    if num_steps == 0:
        return "plain"
    if tree_choices is not None or topk > 1:
        return "tree"
    return "parallel" if parallel else "chain"


def proposal_passes(name: str, num_steps: int, topk: int = 1, parallel: bool = False,
                    tree_choices: Any = None) -> int:
    """Draft forward passes of the draft stage in one step (each pass costs c target-steps),
    counted at a common iteration boundary (the extend pass is :func:`extend_passes`):

    * lookups, plain decoding: 0; block drafters (DFlash, DSpark) and Medusa's heads: 1;
    * a chain or tree (one pass per level, SGLang sglang/srt/speculative/eagle_worker_v2.py:742-919; a static
    tree is κ levels deep): κ,
      or κ − 1 when the extend pass drafts the first token (``draft_from_extend``: EAGLE, EAGLE-3,
      MTP, multi-layer EAGLE);
    * a parallel block (PARD, P-EAGLE): 1, or none for P-EAGLE at κ = 1 (draft 1 comes from the extend).
    """
    m = get(name)
    if num_steps == 0 or not m.drafts or m.lookup:
        return 0
    if m.draft_shape in ("block", "heads"):
        return 1
    if parallel:
        return 1 if (num_steps > 1 or not m.draft_from_extend) else 0
    return int(num_steps) - (1 if m.draft_from_extend else 0)


def extend_passes(name: str) -> int:
    """Draft-extend passes per step: 1 when the method's extend stage runs a draft forward over the
    accepted tokens (``Method.extend_forward``; at κ = 0 too, as SGLang runs draft-extend at steps = 0,
    sglang/srt/speculative/eagle_worker_v2.py:1490-1494), else 0 (frozen-KV MTP: "no forward"; the draft model's
    catch-up is its next
    first proposal pass)."""
    return 1 if get(name).extend_forward else 0


def build_drafter(name: str, spec: Dict[str, Any], target: Any, tokenizer: Any, device: Any,
                  max_seq_len: Optional[int]) -> Any:
    """The runtime drafter of method ``name`` (None for plain decoding), through the factory the
    method's :class:`RuntimeSupport` names.

    Args:
        spec: the artifact's runtime section (``manifest.json`` ``"runtime"``: ``draft``, ``method``).
        target, tokenizer: the loaded target model and its tokenizer. device: torch device.
        max_seq_len: the runtime's cache length per row.
    Raises:
        PlanError: a method specc's runtime does not run. Factories raise PlanError / CheckpointError.
    """
    m = get(name)
    if m.runtime is None:
        raise PlanError(f"method.name={name!r} is not run by the specc runtime (it runs "
                        f"{', '.join(runtime_methods())}); export the plan to an engine that supports it "
                        f"(`specc export`)")
    if not m.runtime.drafter:
        return None
    factory = resolve_factory(m.runtime.drafter)
    return factory(spec, target, tokenizer, device, max_seq_len)


def resolve_factory(ref: str) -> Callable[..., Any]:
    """Import ``"module:function"``. Raises PlanError when the module or attribute is missing."""
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise PlanError(f"drafter factory {ref!r} cannot be imported ({exc})") from None


# ------------------------------------------------------------------------------------ drafter plugins
#: The drafter protocol the runtime calls (``specc/methods/base.py``): methods with the number of
#: positional arguments each is called with (``self`` excluded), and attributes with their types.
#: A plugin class must answer all of it; :func:`check_drafter_protocol` says what it lacks (SGLang
#: refuses a plugin missing its duck-typed methods at registration, spec_registry.py:199-231, N8).
DRAFTER_METHODS: Dict[str, Tuple[int, str]] = {
    "from_spec": (5, "from_spec(spec, target, tokenizer, device, max_seq_len) (a classmethod building the drafter)"),
    "setup": (3, "setup(max_batch_size, max_seq_len, device)"),
    "prefill": (2, "prefill(batch, chunk)"),
    "propose": (3, "propose(batch, num_steps, sampling)"),
    "commit": (2, "commit(batch, step)"),
}
DRAFTER_ATTRIBUTES: Dict[str, type] = {"name": str, "hidden_layers": tuple, "supports_probabilistic": bool,
                                       "capturable": bool, "prefill_row_index": bool}
ENTRY_POINT_GROUP = "specc.methods"
_PLUGINS: Dict[str, Any] = {}


def reserved_names() -> Tuple[str, ...]:
    """Names a plugin may not take: the builtin methods (SGLang N6, spec_registry.py:246-250)."""
    return tuple(METHODS)


def _arity_problem(fn: Any, n: int, skip: int = 0) -> Optional[str]:
    """Why ``fn`` cannot be called with ``n`` positional arguments after its first ``skip`` ones
    (``self`` of a plain function on a class), or None when it can."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins without a signature: trust them
    params = list(sig.parameters.values())
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][skip:]
    required = [p for p in pos if p.default is p.empty]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None if len(required) <= n else f"needs {len(required)} positional arguments"
    if len(required) > n or len(pos) < n:
        if len(required) != len(pos):
            return f"takes {len(required)} to {len(pos)} positional arguments"
        return f"takes {len(pos)} positional argument{'s' if len(pos) != 1 else ''}"
    return None


def check_drafter_protocol(obj: Any) -> List[str]:
    """What a drafter class (or instance) lacks of the protocol the runtime calls: each missing or
    wrongly shaped method (:data:`DRAFTER_METHODS`, arity checked on the bound method) and each
    missing or mistyped attribute (:data:`DRAFTER_ATTRIBUTES`). Empty when it answers all of it."""
    import inspect

    problems: List[str] = []
    for name, (n, shape) in DRAFTER_METHODS.items():
        fn = getattr(obj, name, None)
        if fn is None or not callable(fn):
            problems.append(f"method {shape} is missing")
            continue
        unbound = isinstance(obj, type) and inspect.isfunction(fn) and not isinstance(
            inspect.getattr_static(obj, name, None), staticmethod)
        why = _arity_problem(fn, n, skip=1 if unbound else 0)  # a plain function on the class: skip self
        if why:
            problems.append(f"method {shape} {why}")
        if getattr(fn, "__isabstractmethod__", False):
            problems.append(f"method {shape} is abstract (not implemented)")
    for name, typ in DRAFTER_ATTRIBUTES.items():
        if not hasattr(obj, name):
            problems.append(f"attribute {name} ({typ.__name__}) is missing")
            continue
        value = getattr(obj, name)
        if isinstance(value, property) or callable(value) and not isinstance(value, (str, tuple, bool)):
            continue  # a property on the class: checked on the instance
        if typ is tuple and isinstance(value, list):
            continue
        if not isinstance(value, typ):
            problems.append(f"attribute {name} must be a {typ.__name__}, got {type(value).__name__}")
    return problems


def register_plugin(name: str, cls: Any) -> Any:
    """Register a drafter plugin class under ``name`` (then ``method.plugin: NAME`` finds it).

    Raises:
        PlanError: ``name`` is a builtin method name (reserved), already registered to another class,
            or the class misses part of the drafter protocol (listing every missing piece).
    """
    if name in reserved_names():
        raise PlanError(f"drafter plugin name {name!r} is reserved for the builtin method; pick another name")
    if name in _PLUGINS and _PLUGINS[name] is not cls:
        raise PlanError(f"drafter plugin {name!r} is already registered ({_qualname(_PLUGINS[name])})")
    _check_plugin_class(cls, name)
    _PLUGINS[name] = cls
    return cls


def _qualname(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', cls)}"


def _check_plugin_class(cls: Any, ref: str) -> None:
    if not isinstance(cls, type):
        raise PlanError(f"method.plugin {ref!r} names {type(cls).__name__} {cls!r}, not a class")
    missing = check_drafter_protocol(cls)
    if missing:
        raise PlanError(f"method.plugin {ref!r} ({_qualname(cls)}) does not implement the drafter protocol "
                        f"(specc/methods/base.py): " + "; ".join(missing))
    plugin_name = getattr(cls, "name", None)
    if plugin_name in reserved_names():
        raise PlanError(f"method.plugin {ref!r} ({_qualname(cls)}) calls itself {plugin_name!r}, a builtin method's "
                        f"name; builtin names are reserved (set the class attribute name to your own)")


def resolve_plugin(ref: str) -> Any:
    """The drafter class ``method.plugin`` names, checked against the protocol.

    ``ref`` is ``package.module:Class``, ``package.module.Class`` (vLLM's ``custom_class`` style), a
    name registered with :func:`register_plugin`, or the name of a Python entry point in the
    ``specc.methods`` group.

    Raises:
        PlanError: an empty or reserved name, an import that fails, no such entry point, or a class
            missing part of the protocol.
    """
    ref = (ref or "").strip()
    if not ref:
        raise PlanError("method.name=custom needs method.plugin: 'package.module:Class' or the name of a "
                        f"'{ENTRY_POINT_GROUP}' entry point")
    if ref in reserved_names():
        raise PlanError(f"method.plugin {ref!r} is a builtin method's name (reserved); use method.name={ref}")
    if ":" in ref or "." in ref:
        module, _, attr = ref.partition(":") if ":" in ref else ref.rpartition(".")
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except Exception as exc:  # an import error inside the plugin, or a missing attribute
            raise PlanError(f"method.plugin {ref!r} cannot be imported ({type(exc).__name__}: {exc}); check the "
                            f"module is installed and the class name") from None
        _check_plugin_class(obj, ref)
        return obj
    if ref in _PLUGINS:
        return _PLUGINS[ref]
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ref]
    if not found:
        known = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} | set(_PLUGINS))
        raise PlanError(f"method.plugin {ref!r}: no drafter plugin of that name (registered or entry points in "
                        f"group {ENTRY_POINT_GROUP!r}: {', '.join(known) or 'none'}); or give package.module:Class")
    try:
        cls = found[0].load()
    except Exception as exc:
        raise PlanError(f"method.plugin {ref!r}: entry point {found[0].value!r} cannot be loaded "
                        f"({type(exc).__name__}: {exc})") from None
    _check_plugin_class(cls, ref)
    return cls


def build_plugin_drafter(spec: Dict[str, Any], target: Any, tokenizer: Any, device: Any,
                         max_seq_len: Optional[int]) -> Any:
    """Runtime factory of ``method.name: custom``: resolves ``spec["method"]["plugin"]``
    (:func:`resolve_plugin`) and builds the drafter with ``Class.from_spec(spec, target, tokenizer,
    device, max_seq_len)``, then checks the instance answers the protocol too.

    Raises:
        PlanError: see :func:`resolve_plugin`, or an instance missing part of the protocol.
    """
    ref = (spec.get("method") or {}).get("plugin") or ""
    cls = resolve_plugin(ref)
    drafter = cls.from_spec(spec, target, tokenizer, device, max_seq_len)
    missing = [p for p in check_drafter_protocol(drafter) if not p.startswith("method from_spec")]
    if missing:
        raise PlanError(f"method.plugin {ref!r}: the drafter {_qualname(cls)}.from_spec built does not implement the "
                        f"drafter protocol: " + "; ".join(missing))
    return drafter
