"""``specc serve``: an OpenAI-compatible HTTP server over one runtime (FastAPI + uvicorn), its
Prometheus metrics, and the prefill / decode roles of disaggregated serving.

Modules: :mod:`protocol` (request bodies, errors, response shapes), :mod:`textstream` (incremental
detokenization with stop strings), :mod:`loop` (the engine thread), :mod:`metrics` (Prometheus),
:mod:`app` (the FastAPI application), :mod:`disagg_client` (the decode role's fetch of prefills).
"""
