"""Suffix decoding: its row; the drafter (:mod:`.drafter`) and the corpus reader (:mod:`.corpus`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, SCHEDULES

SUFFIX = Method("suffix", "suffix decoding: suffix trees over the prompt, earlier outputs and corpora (no model)",
       "lookup", needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0,
       seed="none", dynamic_tree=True, default_num_steps=24,
       runtime=RuntimeSupport(drafter="specc.methods.suffix.drafter:build_drafter", confidence="frequency",
                              verify_rules=("greedy", "standard"), schedules=SCHEDULES,
                              shapes=("plain", "chain", "tree")),
       option_sections=("suffix",), vllm_method="suffix")
