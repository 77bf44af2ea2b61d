"""Multi-layer EAGLE (one MTP module per draft step): its row; the drafter (:mod:`.drafter`) and the modules (:mod:`.model`); trained by :mod:`specc.methods.mtp.recipe`.

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, CHAIN_RUNTIME

MULTI_LAYER_EAGLE = Method("multi_layer_eagle", "one MTP module per draft step (SGLang's draft_runners)", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="last", default_c=0.042,
       seed="hidden_topk", draft_from_extend=True,
       runtime=RuntimeSupport(drafter="specc.methods.multi_layer_eagle.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **dict(CHAIN_RUNTIME, schedules=("static", "batch_buckets", "budget"))),
       one_module_per_step=True, shares_target_head=True, sglang_algorithm="EAGLE", sglang_multi_layer=True,
       train_kinds=(("multi_layer_eagle", "specc.methods.mtp.recipe:MultiLayerEagleKind"),),
       example_draft="smollm2_135m_multi_layer_eagle")
