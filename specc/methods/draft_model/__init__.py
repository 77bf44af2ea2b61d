"""A separate small causal LM as the draft: its row; the drafter (:mod:`.drafter`) and the shallow-copy draft builder (:mod:`.shallow`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, PARALLEL_CAPABLE_RUNTIME

DRAFT_MODEL = Method("draft_model", "a separate small causal LM drafts κ tokens one by one", "chain",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="none", default_c=0.165,
       seed="draft_prefill", parallel_capable=True, extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods.draft_model.drafter:build_drafter",
                              draft_sampling=("greedy", "probabilistic"), confidence="draft_probability",
                              **PARALLEL_CAPABLE_RUNTIME),
       sglang_algorithm="STANDALONE", vllm_method="draft_model",
       train_kinds=(("pard", "specc.methods.dflash.recipe:PardKind"),),
       example_draft="smollm2_135m_shallow")
