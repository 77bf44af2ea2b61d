"""Medusa heads: its row; the drafter (:mod:`.drafter`), the heads (:mod:`.model`) and the training kind (:mod:`.recipe`).

The row is registered through the ``specc.methods`` entry points (pyproject.toml), as a third
party's method is; this package imports nothing heavy."""
from specc.methods.facts import Method, RuntimeSupport, SCHEDULES

MEDUSA = Method("medusa", "κ residual heads over the target's last hidden state, one pass, static tree", "heads",
       needs_draft_checkpoint=True, has_draft_kv=False, target_hidden="last", default_c=0.01,
       seed="target_hidden", always_parallel=True, static_tree=True,
       runtime=RuntimeSupport(drafter="specc.methods.medusa.drafter:build_drafter", verify_rules=("greedy", "standard"),
                              draft_sampling=("greedy", "probabilistic"), schedules=SCHEDULES,
                              confidence="draft_probability", shapes=("plain", "parallel", "tree")),
       train_kinds=(("medusa", "specc.methods.medusa.recipe:MedusaKind"),),
       example_draft="smollm2_135m_medusa")
