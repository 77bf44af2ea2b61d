"""EAGLE and EAGLE-3 heads: their rows; the drafter (:mod:`.drafter`), the head model (:mod:`.model`), the checkpoint loader (:mod:`.loader`) and the training kinds (:mod:`.recipe`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, TREE_RUNTIME

EAGLE = Method("eagle", "EAGLE head: one decoder layer over [token embedding; target's last hidden state]", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="last", default_c=0.042,
       seed="hidden_topk", parallel_capable=True, dynamic_tree=True, static_tree=True, draft_from_extend=True,
       runtime=RuntimeSupport(drafter="specc.methods.eagle.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **TREE_RUNTIME),
       sglang_algorithm="EAGLE", vllm_method="eagle", train_kinds=(("eagle", "specc.methods.eagle.recipe:EagleKind"),),
       example_draft="smollm2_135m_eagle")

EAGLE3 = Method("eagle3", "EAGLE-3 head: fused low/mid/high target layers, reduced draft vocabulary", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="fused", default_c=0.042,
       seed="hidden_topk", parallel_capable=True, dynamic_tree=True, static_tree=True, draft_from_extend=True,
       runtime=RuntimeSupport(drafter="specc.methods.eagle.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **TREE_RUNTIME),
       sglang_algorithm="EAGLE3", vllm_method="eagle3", train_kinds=(("eagle3", "specc.methods.eagle.recipe:Eagle3Kind"),),
       example_draft="smollm2_135m_eagle3")
