"""Plan schema and loading. Importing this package never imports torch."""

from specc.plan.schema import Plan  # noqa: F401
