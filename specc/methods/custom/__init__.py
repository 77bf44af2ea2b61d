"""A user drafter plugin (``method.name: custom``, ``method.plugin``): its row; the plugin machinery lives in the registry (:func:`specc.methods.build_plugin_drafter`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, SCHEDULES

CUSTOM = Method("custom", "a user drafter plugin (method.plugin)", "chain",
       needs_draft_checkpoint=False, has_draft_kv=True, target_hidden="none", default_c=0.165,
       seed="draft_prefill", extend_pass=False,
       runtime=RuntimeSupport(drafter="specc.methods:build_plugin_drafter",
                              verify_rules=("greedy", "standard"), draft_sampling=("greedy", "probabilistic"),
                              schedules=SCHEDULES, shapes=("plain", "chain")),
       option_sections=("plugin",), sglang_algorithm="PLUGIN", vllm_method="custom_class")
