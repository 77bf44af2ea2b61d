"""Artifact → Runtime: verify the artifact (``specc.runtime.artifact.load_artifact``), load the
target and the drafter its manifest's runtime section names, and build one runtime state per
state of its execution plan (:class:`specc.ir.ExecutionPlan`: parameters, stage programs, kernels, static tree) under its
schedule. The runtime
reads the execution plan, never ``plan.yaml``, and never imports ``specc.plan``: a runtime is built
from an artifact (:func:`load_runtime`, :func:`artifact_runtime`) or an execution plan
(:func:`ir_runtime`) only."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from specc.errors import ArtifactError

if TYPE_CHECKING:
    from specc.ir import ExecutionPlan  # noqa: F401


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


def half_checkpoint_dtype(path: str) -> Optional[str]:
    """``"float16"`` / ``"bfloat16"`` when ``path`` is a Hugging Face directory (``pkg://`` allowed)
    whose 2-D tensors are mostly stored in that dtype
    (:func:`specc.models.hf_loader.stored_half_dtype`: the safetensors headers, not ``config.json``),
    else ``None`` (a file, a directory without weights, a corrupt header: the loader reports those)."""
    from safetensors import SafetensorError

    from specc.errors import CheckpointError
    from specc.models.hf_loader import stored_half_dtype
    from specc.models.resolve import resolve_model_path

    try:
        p = resolve_model_path(path)
        return stored_half_dtype(p) if p.is_dir() else None
    except (CheckpointError, OSError, ValueError, SafetensorError):
        return None


def default_dtype(target: Dict[str, Any], dev: "torch.device") -> Tuple[str, str]:
    """The target dtype when nothing chose one, and why: ``native`` on the CPU (fp32 activations,
    ``specc.models.qweights``) for a GGUF target (its quantized codes) and for a Hugging Face checkpoint
    stored in float16 / bfloat16 (its 16-bit values; only where the C kernels build, since without
    them each product would widen the whole weight), else ``float32``. Both native forms read half or
    less of the fp32 weight bytes per step; ``tools/bench_matmul.py`` and ``specc bench`` with
    ``target.dtype=float32`` measure the alternative."""
    path = str(target.get("path") or "")
    gguf = (target.get("format") or "auto") == "gguf" or path.endswith(".gguf")
    if dev.type == "cpu" and gguf:
        return "native", ("dtype native (the GGUF's own quantized weights, run by specc.kernels.qgemm; target.dtype: float32 "
                          "runs them dequantized)")
    half = half_checkpoint_dtype(path) if dev.type == "cpu" and not gguf and path else None
    if half:
        from specc.kernels import qgemm

        if not qgemm.available():
            return "float32", (f"dtype float32 (the checkpoint's {half} weights widened: specc.kernels.qgemm, "
                               f"which runs them as they are, is unavailable here: {qgemm.status()})")
        return "native", (f"dtype native (the checkpoint's own {half} weights, run by specc.kernels.qgemm; "
                          "target.dtype: float32 runs them widened)")
    return "float32", ("dtype float32 (runtime.dtype auto and no device profile: `specc profile` measures the "
                       "dtypes, schedule.cost_table points at its table)")


def table_choice(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The device profile's measured choice a runtime section carries (``schedule.cost_table.choice``:
    ``dtype``, ``compile_backend``, ``qgemm_variant``, written by ``specc profile``); ``{}`` without one."""
    return dict(((spec.get("schedule") or {}).get("cost_table") or {}).get("choice") or {})


def choose_settings(spec: Dict[str, Any], dev: "torch.device") -> Tuple[str, str, str]:
    """The target's dtype and the verify programs' compile backend for a runtime section, and why:
    ``(dtype, compile_backend, reason)``. An explicit ``runtime.dtype`` / ``compile_backend`` (or
    ``target.dtype``) is used as given; ``auto`` takes the device profile's measured choice (the
    cost table of ``schedule.cost_table``, written by ``specc profile``: ``choice``), and without one
    ``float32`` and ``eager`` — nothing assumes a dtype is fast or slow on a device it was not
    measured on."""
    tgt = spec["target"]
    choice = table_choice(spec)
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
    if dtype == "native" and dev.type == "cpu":
        why.append(kernel_variant(spec)[1])
    return str(dtype), str(backend), "; ".join(why)


def kernel_variant(spec: Dict[str, Any]) -> Tuple[Optional[str], str]:
    """The quantized-kernel variant (``specc.kernels.qgemm``) a native CPU target should run, and why:
    ``$SPECC_QGEMM_VARIANT`` when set (None: the process keeps it); else the device profile's measured
    choice (the cost table's ``choice["qgemm_variant"]``, written by ``specc profile``) when this CPU runs
    it; else this CPU's default (``qgemm.default_variant``: the first of ``qgemm.PREFERENCE`` it runs), so
    the variant depends on the spec and the CPU only, not on what an earlier load in the process set.
    Reads the spec, the environment and the CPU; :func:`load_models` sets it before the target loads
    (the int8 variants pack the weights at load). None without the C kernels."""
    import os

    from specc.kernels import qgemm

    if not qgemm.available():
        return None, f"no quantized kernels ({qgemm.status()})"
    if os.environ.get("SPECC_QGEMM_VARIANT", "").strip():
        return None, f"qgemm variant {qgemm.variant()} (SPECC_QGEMM_VARIANT)"
    want = table_choice(spec).get("qgemm_variant")
    if want and want in qgemm.supported():
        return want, f"qgemm variant {want} (the device profile measured it fastest)"
    default = qgemm.default_variant()
    if want:
        return default, (f"qgemm variant {default} (the device profile chose {want}, which this CPU does not "
                         f"run; the default for this CPU)")
    return default, f"qgemm variant {default} (no device profile: the default for this CPU)"


def use_kernel_variant(spec: Dict[str, Any]) -> str:
    """Set the process-wide qgemm variant :func:`kernel_variant` picks for ``spec`` (nothing when it picks
    None) and return why. Call it before a native target loads (the int8 variants pack at load)."""
    variant, why = kernel_variant(spec)
    if variant is not None:
        from specc.kernels import qgemm

        qgemm.set_variant(variant)
    return why


def with_kernel_variant(spec: Dict[str, Any], variant: str) -> Dict[str, Any]:
    """``spec`` whose cost table chooses qgemm ``variant`` (and nothing else), for loading a native target
    under a given variant through :func:`load_models` (``specc profile`` times each variant this way)."""
    schedule = dict(spec.get("schedule") or {})
    table = dict(schedule.get("cost_table") or {})
    schedule["cost_table"] = dict(table, choice=dict(table.get("choice") or {}, qgemm_variant=variant))
    return dict(spec, schedule=schedule)


def load_spec_target(spec: Dict[str, Any], dev: "torch.device", max_model_len: Optional[int]):
    """The target a runtime section names, loaded as the runtime runs it: at :func:`choose_settings`'
    dtype, a native CPU target after the process-wide qgemm variant is set (:func:`use_kernel_variant`:
    the int8 variants pack the weights at load), a half-precision CPU target row-invariant (speculative
    greedy equals plain greedy at that dtype). ``max_model_len``: its cache length in tokens (None: the
    checkpoint's). Returns ``(target, tokenizer, dtype, why)``. Raises as ``specc.models.load_target``
    (CheckpointError for a missing or mismatched checkpoint)."""
    from specc.models import load_target

    tgt = spec["target"]
    dtype, _, why = choose_settings(spec, dev)
    if dtype == "native" and dev.type == "cpu":
        use_kernel_variant(spec)
    target, tokenizer = load_target(tgt["path"], tgt.get("format") or "auto", dtype=dtype,
                                    max_model_len=max_model_len, device=str(dev))
    if dev.type == "cpu" and dtype not in ("float32", "native"):
        target.set_row_invariant()
    return target, tokenizer, dtype, why


def load_models(spec: Dict[str, Any], device: Optional[str] = None, max_steps: int = 0):
    """The target, its tokenizer and the drafter a runtime section names (``manifest.json``
    ``runtime``, or :func:`specc.compiler.codegen.runtime_section` of a plan): ``(target, tokenizer, drafter,
    device)``. The target's cache is sized for ``target.max_model_len + max_steps + 2`` slots. A native CPU
    target first sets the process-wide qgemm variant (:func:`kernel_variant`); a target loaded earlier in
    the process keeps its packed weights packed (``qgemm.set_variant``).

    Raises:
        ArtifactError: ``cuda`` asked without CUDA. CheckpointError: a checkpoint missing or
            mismatched. PlanError: a method the runtime does not run.
    """
    from specc import methods

    dev = resolve_device(device or spec.get("device") or "auto")
    want_len = spec["target"].get("max_model_len")
    target, tokenizer, _, _ = load_spec_target(spec, dev, (want_len + max_steps + 2) if want_len else None)
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
    return ir_runtime(art.ir, target, tokenizer, drafter, dev, kernel_modules=art.kernels,
                      compile_backend=compile_backend, kernel_backend=kernel_backend, seed=seed,
                      max_model_len=max_model_len, buckets=buckets, use_cuda_graphs=None, where=art.path.name)


def ir_runtime(eplan: "ExecutionPlan", target, tokenizer, drafter, dev: Optional["torch.device"] = None, *,
               kernel_modules: Optional[Dict[str, Any]] = None, compile_backend: Optional[str] = None,
               kernel_backend: Optional[str] = None, seed: int = 0, max_model_len: Optional[int] = None,
               buckets: Optional[List[int]] = None, use_cuda_graphs: Optional[bool] = None,
               prefill_chunk: int = 512, where: str = "execution plan") -> "Runtime":
    """The runtime of an execution plan (:class:`specc.ir.ExecutionPlan`) over models already loaded:
    each state's parameters, kernels (``kernel_modules``: the artifact's specialized modules by
    name; None runs the generic kernels) and static tree, the schedule, the synthetic rates.

    Args:
        dev: the device (None: the Runtime's default, the target's). compile_backend / kernel_backend: default the
            execution plan's. max_model_len: tokens per request (default the target section's).
        buckets: build only the states of these batch buckets (a benchmark at one batch size).
        use_cuda_graphs: capture states on CUDA (default: when ``dev`` is CUDA, unless the plan says
            ``cuda_graphs: false``).
    Raises:
        ArtifactError: no state in ``buckets``, a state this runtime cannot run.
    """
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    rt = eplan.runtime
    states = [s for s in eplan.states if buckets is None or s.batch_size in buckets]
    if not states:
        have = sorted({s.batch_size for s in eplan.states})
        raise ArtifactError(f"{where}: no state with batch bucket in {buckets} (it has {have})")
    try:
        specs = [StateSpec.from_dict(s.parameters) for s in states]
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: a state's parameters do not fit this runtime ({exc}); re-run specc compile") from None
    if use_cuda_graphs is None:
        use_cuda_graphs = dev is not None and dev.type == "cuda" and rt.cuda_graphs is not False
    return Runtime(target, tokenizer, drafter, specs,
                   state_kernels={s.name: dict(s.kernels) for s in states} if kernel_modules else None,
                   state_programs={s.name: tuple((p.stage, p.fn, p.args) for p in s.programs) for s in states},
                   trees={s.name: eplan.trees[s.tree] for s in states if s.tree is not None},
                   synthetic_rates=list(rt.verify.synthetic_rates) if rt.verify.synthetic_rates is not None else None,
                   max_model_len=max_model_len or rt.target.max_model_len, device=dev,
                   kernel_backend=kernel_backend or rt.kernel_backend or "auto",
                   use_cuda_graphs=use_cuda_graphs, seed=seed, kernel_modules=kernel_modules,
                   schedule=rt.schedule.to_dict(), compile_backend=compile_backend or rt.compile_backend or "eager",
                   prefill_chunk=prefill_chunk)
