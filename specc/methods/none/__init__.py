"""Plain decoding (κ = 0): the row every plan without a draft method resolves to.

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport

NONE = Method("none", "plain decoding: κ = 0, every step emits the target's own token", "none",
       needs_draft_checkpoint=False, has_draft_kv=False, target_hidden="none", default_c=0.0, seed="none",
       runtime=RuntimeSupport(drafter="", verify_rules=("greedy", "standard"),
                              draft_sampling=("greedy", "probabilistic"), schedules=("static",),
                              shapes=("plain",)))
