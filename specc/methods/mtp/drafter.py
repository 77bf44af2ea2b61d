"""MTP (DeepSeek-style NEXTN) drafting behind the runtime's drafter protocol: one MTP layer
(:mod:`specc.methods.mtp.model`) run recurrently, as SGLang runs ``--speculative-algorithm NEXTN`` (it becomes
EAGLE) and vLLM runs single-layer MTP with K > 1 (the same layer rerun).

The run-time contract is the EAGLE head's (:class:`specc.methods.eagle.drafter.EagleDrafter`, whose
extend / propose / tree / seed code this drafter uses unchanged): the layer keeps its own KV cache,
written by position; the extend stage runs it over the accepted pairs (target final-norm hidden at
``p``, token at ``p + 1``), whose last output gives draft 1 (the seed's "one draft extension ... also
seeds the next iteration"); each further draft is one recurrent pass over (its previous output, the
previous draft). Per step: ``κ - 1`` draft passes and one draft-extend pass. Chains and dynamic trees
(``method.topk > 1``, SGLang's NEXTN trees).
"""
from __future__ import annotations

from typing import Any, Optional

from specc.methods.eagle.drafter import EagleDrafter
from specc.errors import CheckpointError, PlanError
from specc.methods.mtp.model import MTPModel


class MTPDrafter(EagleDrafter):
    """``method.name: mtp`` with a loaded one-layer :class:`specc.methods.mtp.model.MTPModel`.

    Args:
        model: the MTP layer bound to the target's embedding and LM head.
        target_num_layers: the target's decoder layers. target_norm: its final RMSNorm (the layer
            reads the final-norm hidden state).
    Raises:
        CheckpointError: a checkpoint with more than one MTP layer (the runtime reruns one layer; a
            checkpoint of several, one per step, is ``method.name: multi_layer_eagle``).
    """

    def __init__(self, model: MTPModel, target_num_layers: int, target_norm) -> None:
        if model.cfg.num_layers != 1:
            raise CheckpointError(
                f"the MTP checkpoint has num_nextn_predict_layers={model.cfg.num_layers}; method.name=mtp reruns one "
                f"layer for every draft step; run a checkpoint with one layer per step as "
                f"method.name=multi_layer_eagle")
        super().__init__(model, target_num_layers, target_norm)
        self.name = "mtp"


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> MTPDrafter:
    """Runtime factory of method ``mtp`` (``specc.methods``): loads the MTP layer of ``draft.path``
    (``pkg://`` allowed), or of ``target.path`` when the plan names no draft (SGLang points NEXTN's
    draft at the target), bound to ``target``.

    Raises ``CheckpointError`` for a path that is not an MTP checkpoint directory (a target without
    MTP layers), a checkpoint for another target, or one with several MTP layers."""
    from specc.methods.mtp.model import load_mtp
    from specc.models.resolve import resolve_model_path

    draft = spec.get("draft") or {}
    ref = draft.get("path") or (spec.get("target") or {}).get("path")
    if not ref:
        raise PlanError("method.name=mtp needs draft.path (the MTP checkpoint, e.g. the draft preset smollm2_135m_mtp) "
                        "or a target checkpoint that ships its MTP layers")
    path = resolve_model_path(ref)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise CheckpointError(f"{ref}: no MTP layers here (an MTP checkpoint is a directory with config.json and "
                              f"model.layers.{target.config.num_layers}.* tensors); set draft.path to the MTP head "
                              f"(e.g. pkg://specc/assets/drafters/smollm2_135m_mtp)")
    model = load_mtp(path, target, "mtp")
    model.to(device)
    return MTPDrafter(model, target.config.num_layers, target.norm)
