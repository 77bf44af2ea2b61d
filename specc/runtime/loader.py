"""Artifact → Runtime: verify the artifact (``specc.runtime.artifact.load_artifact``), load the
target and the drafter its manifest's runtime section names, and build one runtime state per
manifest state entry (its parameters, kernels and static tree; its programs from the one table,
:func:`specc.programs.state_programs`) under the manifest's schedule. The runtime reads the
manifest, never ``plan.yaml`` (DESIGN.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from specc.errors import ArtifactError


def resolve_device(requested: str) -> "torch.device":
    """``auto`` → CUDA when available, else CPU. Raises ArtifactError for ``cuda`` without CUDA."""
    import torch

    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ArtifactError("the plan asks runtime.device=cuda but no CUDA device is available; "
                            "override with --device cpu (or compile with runtime=cpu)")
    return torch.device(requested)


def largest_bucket(art: "Artifact") -> int:
    """The largest batch bucket among an artifact's states (``parameters.batch_size``): the most
    requests its runtime decodes together."""
    return max(int(e["parameters"]["batch_size"]) for e in art.states)


def state_specs(art: "Artifact") -> List["StateSpec"]:
    """The artifact's states as runtime specs (the manifest's ``parameters``). Raises ArtifactError
    naming the entry when its parameters do not fit :class:`specc.runtime.state.StateSpec`."""
    return [state_spec(art, e) for e in art.states]


def state_spec(art: "Artifact", entry: Dict[str, Any]) -> "StateSpec":
    """One manifest state entry as a runtime spec. Raises ArtifactError naming the entry when its
    parameters do not fit :class:`specc.runtime.state.StateSpec`."""
    from specc.runtime.state import StateSpec

    try:
        return StateSpec.from_dict(entry["parameters"])
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{art.path}/manifest.json: state {entry['name']}: parameters do not fit this "
                            f"runtime ({exc}); re-run specc compile") from None


def runtime_spec(art: "Artifact") -> Dict[str, Any]:
    """The manifest's ``runtime`` section (checkpoints, method options, verify rule, device settings,
    schedule). Raises ArtifactError when it is missing or malformed."""
    spec = art.manifest.get("runtime")
    if not isinstance(spec, dict) or not isinstance(spec.get("target"), dict) or "method" not in spec:
        raise ArtifactError(f"{art.path}/manifest.json has no usable 'runtime' section; re-run specc compile")
    return spec


def default_dtype(target: Dict[str, Any], dev: "torch.device") -> Tuple[str, str]:
    """The target dtype when nothing chose one, and why: ``native`` (the checkpoint's own quantized
    weights, fp32 activations: ``specc.models.qweights``) for a GGUF target on the CPU, else ``float32``."""
    path = str(target.get("path") or "")
    gguf = (target.get("format") or "auto") == "gguf" or path.endswith(".gguf")
    if dev.type == "cpu" and gguf:
        return "native", ("dtype native (the GGUF's own quantized weights, run by specc.kernels.qgemm; target.dtype: float32 "
                          "runs them dequantized)")
    return "float32", ("dtype float32 (runtime.dtype auto and no device profile: `specc profile` measures the "
                       "dtypes, schedule.cost_table points at its table)")


def choose_settings(spec: Dict[str, Any], dev: "torch.device") -> Tuple[str, str, str]:
    """The target's dtype and the verify programs' compile backend for a runtime section, and why:
    ``(dtype, compile_backend, reason)``. An explicit ``runtime.dtype`` / ``compile_backend`` (or
    ``target.dtype``) is used as given; ``auto`` takes the device profile's measured choice (the
    cost table of ``schedule.cost_table``, written by ``specc profile``: ``choice``), and without one
    ``float32`` and ``eager`` — nothing assumes a dtype is fast or slow on a device it was not
    measured on."""
    tgt = spec["target"]
    choice = ((spec.get("schedule") or {}).get("cost_table") or {}).get("choice") or {}
    dtype = spec.get("dtype") if spec.get("dtype") not in (None, "auto") else tgt.get("dtype")
    backend = spec.get("compile_backend") or "eager"
    why = []
    if dtype in (None, "auto"):
        if choice.get("dtype"):
            dtype = choice["dtype"]
            why.append(f"dtype {dtype} (the device profile measured it fastest)")
        else:
            dtype, reason = default_dtype(tgt, dev)
            why.append(reason)
    if backend == "auto":
        backend = choice.get("compile_backend") or "eager"
        why.append(f"compile backend {backend} ({'the device profile measured it fastest' if choice else 'no device profile'})")
    if backend == "inductor" and dev.type == "cuda":
        backend = "eager"  # CUDA graphs are the captured form there
        why.append("compile backend eager on CUDA (states are captured as CUDA graphs)")
    return str(dtype), str(backend), "; ".join(why)


def load_models(spec: Dict[str, Any], device: Optional[str] = None, max_steps: int = 0):
    """The target, its tokenizer and the drafter a runtime section names (``manifest.json``
    ``runtime``, or :func:`specc.codegen.runtime_section` of a plan): ``(target, tokenizer, drafter,
    device)``. The target's cache is sized for ``target.max_model_len + max_steps + 2`` slots.

    Raises:
        ArtifactError: ``cuda`` asked without CUDA. CheckpointError: a checkpoint missing or
            mismatched. PlanError: a method the runtime does not run.
    """
    from specc import methods
    from specc.models import load_target

    dev = resolve_device(device or spec.get("device") or "auto")
    tgt = spec["target"]
    dtype, _, _ = choose_settings(spec, dev)
    want_len = tgt.get("max_model_len")
    cache_len = (want_len + max_steps + 2) if want_len else None
    target, tokenizer = load_target(tgt["path"], tgt.get("format") or "auto", dtype=dtype,
                                    max_model_len=cache_len, device=str(dev))
    if dev.type == "cpu" and dtype not in ("float32", "native"):
        target.set_row_invariant()  # speculative greedy == plain greedy at this dtype
    drafter = methods.build_drafter(spec["method"]["name"], spec, target, tokenizer, dev,
                                    max_seq_len=target.config.max_model_len)
    return target, tokenizer, drafter, dev


def load_runtime(path: str | Path, *, device: Optional[str] = None, seed: int = 0,
                 kernel_backend: Optional[str] = None, artifact: Optional["Artifact"] = None,
                 ) -> Tuple["Runtime", "Artifact"]:
    """Load the artifact at ``path`` and build its runtime.

    Args:
        path: an artifact directory (``generated/<plan>-<hash>``).
        device: override of the manifest's ``runtime.device`` (``auto``/``cpu``/``cuda``).
        seed: base seed for requests without their own.
        kernel_backend: override of ``runtime.kernel_backend``.
        artifact: the artifact at ``path`` already loaded by ``load_artifact`` (so a command can
            check its flags against it before the models load); loaded here when None.
    Returns:
        ``(Runtime, Artifact)``.
    Raises:
        ArtifactError: tampered/incomplete artifact, or a state this runtime cannot run.
        CheckpointError: target or draft checkpoint missing or mismatched.
        PlanError: a method this runtime does not run.
    """
    from specc.runtime.artifact import load_artifact

    art = artifact if artifact is not None else load_artifact(path)
    spec = runtime_spec(art)
    specs = state_specs(art)
    target, tokenizer, drafter, dev = load_models(spec, device, max(s.num_steps for s in specs))
    dtype, compile_backend, why = choose_settings(spec, dev)
    runtime = artifact_runtime(art, target, tokenizer, drafter, dev, compile_backend=compile_backend,
                               kernel_backend=kernel_backend, seed=seed)
    runtime.settings = {"dtype": dtype, "compile_backend": compile_backend, "why": why}
    return runtime, art


def artifact_runtime(art: "Artifact", target, tokenizer, drafter, dev: "torch.device", *, compile_backend: str,
                     kernel_backend: Optional[str] = None, seed: int = 0, max_model_len: Optional[int] = None,
                     buckets: Optional[List[int]] = None) -> "Runtime":
    """The runtime of an artifact's states over models already loaded (:func:`load_models`): each
    state's parameters, kernel variants and static tree from the manifest, its schedule, the verify
    programs run by ``compile_backend``.

    Args:
        max_model_len: tokens per request (default the manifest's ``target.max_model_len``).
        buckets: build only the states of these batch buckets (a benchmark at one batch size; the
            schedule then pads every step to them). Default: every state.
    Raises:
        ArtifactError: no state in ``buckets``, a state this runtime cannot run, or one the schedule
            can select that is not built.
    """
    from specc.runtime.engine import Runtime

    spec = runtime_spec(art)
    entries = [e for e in art.states if buckets is None or int(e["parameters"]["batch_size"]) in buckets]
    if not entries:
        have = sorted({int(e["parameters"]["batch_size"]) for e in art.states})
        raise ArtifactError(f"{art.path.name}: no state with batch bucket in {buckets} (it has {have})")
    specs = [state_spec(art, e) for e in entries]
    use_graphs = dev.type == "cuda" and spec.get("cuda_graphs") is not False
    return Runtime(target, tokenizer, drafter, specs,
                   state_kernels={e["name"]: dict(e["kernels"]) for e in entries},
                   trees={e["name"]: art.tree_of(e) for e in entries if e.get("tree") is not None},
                   synthetic_rates=(spec.get("verify") or {}).get("synthetic_rates"),
                   max_model_len=max_model_len or spec["target"].get("max_model_len"), device=dev,
                   kernel_backend=kernel_backend or spec.get("kernel_backend") or "auto",
                   use_cuda_graphs=use_graphs, seed=seed, kernel_modules=art.kernels,
                   schedule=spec.get("schedule"), compile_backend=compile_backend)


def runtime_from_plan(plan, target, tokenizer, drafter, *, cost_table: Optional[dict] = None,
                      max_model_len: Optional[int] = None, seed: int = 0, prefill_chunk: int = 512,
                      device: Optional[Any] = None, use_cuda_graphs: bool = False) -> "Runtime":
    """A runtime for ``plan``'s candidate states and schedule over models already loaded — the same
    lowering (:func:`specc.analyze.lower_plan`) and schedule spec ``specc compile`` writes, without
    an artifact. Benchmarks that compare many schedules on one target use it; tests of schedules too.

    Args:
        plan: a resolved ``Plan``. target, tokenizer, drafter: loaded models (drafter None for κ = 0).
        cost_table: the manifest's ``runtime.schedule.cost_table`` mapping (``verify_ms`` by tokens,
            ``draft_ms`` by requests, ``capture_limit``) for ``budget``; default: read from
            ``schedule.cost_table`` when the plan names one.
        use_cuda_graphs: capture each state's verify program on CUDA (as ``load_runtime`` does).
    Raises:
        PlanError: a plan that does not lower. ArtifactError: a state the runtime cannot run.
    """
    from specc import programs
    from specc.analyze import lower_plan
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    low = lower_plan(plan)
    if cost_table is None and plan.schedule.cost_table:
        from specc.codegen import runtime_section

        cost_table = runtime_section(plan, low.schedule.as_dict(), 0)["schedule"]["cost_table"]
    schedule = dict(low.schedule.as_dict(), cost_table=cost_table)
    rates = None
    if plan.verify.rule == "synthetic":
        syn = plan.verify.synthetic
        rates = programs.synthetic_conditional_rates(syn.acceptance_rates, syn.acceptance_length,
                                                     max(s.num_steps for s in low.states))
    specs = [StateSpec.from_candidate(s) for s in low.states]
    return Runtime(target, tokenizer, drafter, specs, max_model_len=max_model_len, seed=seed, schedule=schedule,
                   synthetic_rates=rates, prefill_chunk=prefill_chunk, device=device, use_cuda_graphs=use_cuda_graphs)
