"""Frozen-KV MTP (an assistant over the target's KV): its row; the drafter (:mod:`.drafter`) and the model (:mod:`.model`); trained by :mod:`specc.methods.mtp.recipe`.

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, CHAIN_RUNTIME

FROZEN_KV_MTP = Method("frozen_kv_mtp", "an assistant drafter attending over the target's KV (keeps none of its own)",
       "chain", needs_draft_checkpoint=True, has_draft_kv=False, frozen_kv=True, target_hidden="last",
       default_c=0.042, seed="hidden_topk",
       runtime=RuntimeSupport(drafter="specc.methods.frozen_kv_mtp.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **CHAIN_RUNTIME),
       shares_target_head=True, sglang_algorithm="FROZEN_KV_MTP", train_kinds=(("frozen_kv_mtp", "specc.methods.mtp.recipe:FrozenKVMTPKind"),),
       example_draft="smollm2_135m_frozen_kv_mtp")
