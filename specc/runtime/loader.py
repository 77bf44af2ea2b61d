"""Artifact → Runtime: verify and import the artifact (``specc.runtime.artifact.load_artifact``),
load the target and the drafter the artifact's plan names, and build one runtime state per
generated state module (``build(ctx)``)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

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
    """The largest batch bucket among an artifact's states (``STATE["batch_size"]``): the most
    requests its runtime decodes together. Raises ArtifactError for a state module without ``STATE``."""
    sizes = []
    for name, module in art.states.items():
        if not hasattr(module, "STATE"):
            raise ArtifactError(f"{art.path}/states/{name}.py defines no STATE; re-run specc compile")
        sizes.append(int(module.STATE["batch_size"]))
    return max(sizes)


def load_runtime(path: str | Path, *, device: Optional[str] = None, seed: int = 0,
                 kernel_backend: Optional[str] = None, artifact: Optional["Artifact"] = None,
                 ) -> Tuple["Runtime", "Artifact"]:
    """Load the artifact at ``path`` and build its runtime.

    Args:
        path: an artifact directory (``generated/<plan>-<hash>``).
        device: override of the plan's ``runtime.device`` (``auto``/``cpu``/``cuda``).
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
    from specc.drafters import build_drafter
    from specc.models import load_target
    from specc.runtime.artifact import load_artifact
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    art = artifact if artifact is not None else load_artifact(path)
    plan = art.plan
    dev = resolve_device(device or plan.runtime.device)
    specs = []
    for name, module in art.states.items():
        for attr in ("STATE", "build"):
            if not hasattr(module, attr):
                raise ArtifactError(f"{art.path}/states/{name}.py defines no {attr}; re-run specc compile")
        specs.append(StateSpec.from_dict(module.STATE))
    k_max = max(s.num_steps for s in specs)
    dtype = plan.runtime.dtype if plan.runtime.dtype not in (None, "auto") else (
        plan.target.dtype if plan.target.dtype not in (None, "auto") else "float32")
    if dev.type == "cpu":
        dtype = "float32"  # bf16/fp16 matmuls are orders of magnitude slower on this CPU
    want_len = plan.target.max_model_len
    cache_len = (want_len + k_max + 2) if want_len else None
    target, tokenizer = load_target(plan.target.path, plan.target.format or "auto", dtype=dtype,
                                    max_model_len=cache_len, device=str(dev))
    drafter = build_drafter(plan, target, tokenizer, dev, max_seq_len=target.config.max_model_len)
    first = next(iter(art.states.values()))
    backend = kernel_backend or plan.runtime.kernel_backend or "auto"
    use_graphs = dev.type == "cuda" and plan.deploy.cuda_graphs is not False
    runtime = Runtime(target, tokenizer, drafter, specs,
                      builders={name: m.build for name, m in art.states.items()},
                      max_model_len=want_len, device=dev, kernel_backend=backend, use_cuda_graphs=use_graphs,
                      method_options=dict(getattr(first, "METHOD_OPTIONS", {})), seed=seed,
                      kernel_modules=art.kernels)
    return runtime, art
