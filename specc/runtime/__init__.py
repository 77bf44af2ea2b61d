"""specc's runtime: load a compiled artifact, build one runtime state per candidate state, and
decode batches of requests with route → draft → verify → accept → extend (see README.md here).

Entry points: ``specc.runtime.loader.load_runtime(artifact_dir)`` and
``specc.runtime.engine.Runtime``. Importing this package imports nothing heavy."""
