"""Block drafters, DFlash and DSpark: their rows; the drafter (:mod:`.drafter`), the block model (:mod:`.model`), the training kinds (:mod:`.recipe`, also PARD's) and the shipped PARD draft's assembly (:mod:`.pard_assets`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, BLOCK_RUNTIME

DFLASH = Method("dflash", "block diffusion draft: [bonus, MASK × γ] in one non-causal pass over target context",
       "block", needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="layers", default_c=0.042,
       seed="target_hidden", always_parallel=True, default_num_steps=15, extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods.dflash.drafter:build_drafter", confidence="draft_probability",
                              **BLOCK_RUNTIME),
       sglang_algorithm="DFLASH", vllm_method="dflash", train_kinds=(("dflash", "specc.methods.dflash.recipe:DFlashKind"),),
       example_draft="smollm2_135m_dflash")

DSPARK = Method("dspark", "DFlash backbone + low-rank Markov head + confidence head", "block",
       needs_draft_checkpoint=True, has_draft_kv=True, target_hidden="layers", default_c=0.042,
       seed="target_hidden", always_parallel=True, default_num_steps=7, extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods.dflash.drafter:build_drafter", confidence="head",
                              **BLOCK_RUNTIME),
       option_sections=("markov", "confidence_head"), sglang_algorithm="DSPARK", vllm_method="dspark",
       train_kinds=(("dspark", "specc.methods.dflash.recipe:DSparkKind"),),
       example_draft="smollm2_135m_dspark")
