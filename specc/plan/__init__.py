"""Plan schema and loading. Importing this package never imports torch.

- ``Plan`` and the group dataclasses: :mod:`specc.plan.schema`
- ``load_plan(source, overrides) -> LoadedPlan``: :mod:`specc.plan.load` (Hydra compose + typing)
- ``dump_resolved(plan) -> str`` / ``plan_hash(plan)``: :mod:`specc.plan.dump` (canonical YAML)
"""

from specc.plan.schema import Plan  # noqa: F401
from specc.plan.dump import dump_resolved, plan_hash  # noqa: F401
from specc.plan.load import LoadedPlan, list_presets, load_plan, plan_from_dict  # noqa: F401
