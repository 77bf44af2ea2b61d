"""DeepSeek-style MTP (NEXTN): its row; the drafter (:mod:`.drafter`), the MTP layer (:mod:`.model`) and the MTP-family training kinds (:mod:`.recipe`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, CHAIN_RUNTIME

MTP = Method("mtp", "DeepSeek-style MTP (NEXTN) layer over [norm(embedding); norm(hidden)], run recurrently", "chain",
       needs_draft_checkpoint=False, has_draft_kv=True, target_hidden="last", default_c=0.042,
       seed="hidden_topk", dynamic_tree=True, draft_from_extend=True, target_ships_draft=True,
       runtime=RuntimeSupport(drafter="specc.methods.mtp.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **dict(CHAIN_RUNTIME, shapes=("plain", "chain", "tree"))),
       shares_target_head=True, sglang_algorithm="EAGLE", sglang_flag="NEXTN", vllm_method="mtp",
       train_kinds=(("mtp", "specc.methods.mtp.recipe:MTPKind"),),
       example_draft="smollm2_135m_mtp")
