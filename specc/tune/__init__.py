"""``specc tune``: which plan is fastest for these prompts on this device — measured where it matters,
predicted everywhere else, confirmed side by side, exported to the engines.

One arrow of the pipeline (``prompts + drafters ──tune─▶ plan``), in four steps, each its own module:

* :mod:`specc.tune.candidates` — the drafters that fit the target: every shipped ``specc`` preset that
  drafts with a method the runtime runs (a new method row of :mod:`specc.methods` with a preset and
  its drafter is picked up as is), or the plans the user names; torch-free.
* :mod:`specc.tune.measure` — acceptance per draft position on a sample of the prompts, stopped when
  the 95 % interval of τ is tight or the time share is spent, plus the drafter's measured step costs.
* :mod:`specc.tune.predict` — every (drafter, κ or tree) at every concurrency with the cost model
  (:mod:`specc.predict.cost`) and the device's cost table; the plan with per-bucket κ; torch-free.
* :mod:`specc.tune.confirm` — the top predictions and the chosen plan run side by side through the
  runtime's concurrency benchmark (:func:`specc.runtime.benchmark.run_concurrency`), interleaved.
* :mod:`specc.tune.emit` — the plan YAML, its SGLang / vLLM settings (``specc export``), its
  acceptance record, the predicted-against-measured table and plot.
"""
