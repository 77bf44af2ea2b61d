"""Prompt lookup (n-gram): its row; the drafter in :mod:`.drafter`.

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, CHAIN_RUNTIME

NGRAM = Method("ngram", "prompt lookup: continue the longest earlier match of the last tokens (no model)", "lookup",
       needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0, seed="none",
       runtime=RuntimeSupport(drafter="specc.methods.ngram.drafter:build_drafter", confidence="online",
                              **CHAIN_RUNTIME),
       option_sections=("ngram",), sglang_algorithm="NGRAM", vllm_method="ngram")
