"""Draft methods behind one protocol (:mod:`specc.drafters.base`): ``ngram``, ``draft_model``, and
the EAGLE family (``specc.drafters.eagle``, issue 5)."""
from __future__ import annotations

from typing import Any, Optional

from specc.errors import PlanError

DEFAULT_NGRAM = (1, 3)  # method.ngram.min/max when the plan leaves them unset


def build_drafter(plan: Any, target: Any, target_tokenizer: Any, device: Any,
                  max_seq_len: Optional[int] = None) -> Optional[Any]:
    """The drafter a plan's ``method`` asks for, or None for ``method.name: none``.

    Args:
        plan: ``specc.plan.schema.Plan``. target: the loaded target ``LlamaModel``.
        target_tokenizer: its ``Tokenizer`` (draft_model checks the draft's token map against it).
        device: where the drafter's weights and caches go.
        max_seq_len: the runtime's cache length (a draft model is loaded to allow at least this).
    Raises:
        PlanError: a method this runtime does not run, or draft_model without ``draft.path``.
        CheckpointError: a draft checkpoint that is missing or does not match the target.
    """
    name = plan.method.name
    if name == "none":
        return None
    if name == "ngram":
        from specc.drafters.ngram import NgramDrafter

        lo = plan.method.ngram.min if plan.method.ngram.min is not None else DEFAULT_NGRAM[0]
        hi = plan.method.ngram.max if plan.method.ngram.max is not None else max(lo, DEFAULT_NGRAM[1])
        return NgramDrafter(lo, hi)
    if name == "draft_model":
        return _build_draft_model(plan, target, target_tokenizer, device, max_seq_len)
    if name in ("eagle", "eagle3"):
        try:
            from specc.drafters import eagle
            factory = eagle.build_drafter
        except (ImportError, AttributeError):
            raise PlanError(f"method.name={name!r}: this installation has no EAGLE runtime "
                            f"(specc.drafters.eagle.build_drafter)") from None
        return factory(plan, target, device)
    raise PlanError(f"method.name={name!r} is not run by the specc runtime (it runs none, ngram, draft_model, "
                    f"eagle, eagle3); export the plan to an engine that supports it (`specc export`)")


def _build_draft_model(plan: Any, target: Any, target_tokenizer: Any, device: Any, max_seq_len: Optional[int]) -> Any:
    from specc.drafters.draft_model import DraftModelDrafter, check_same_token_map
    from specc.models import load_target

    draft = plan.draft
    if draft is None or not draft.path:
        raise PlanError("method.name=draft_model needs draft.path (e.g. the draft preset smollm2_135m_shallow)")
    model, tokenizer = load_target(draft.path, draft.format or "hf", max_model_len=max_seq_len, device=str(device))
    if tokenizer is not None and target_tokenizer is not None:
        check_same_token_map(tokenizer, target_tokenizer, str(draft.path))
    return DraftModelDrafter(model, target.config.vocab_size, source=str(draft.path))
