"""The execution plan: the one lowered object between a plan and a runtime.

``specc.compiler.build.compile_ir`` resolves and checks a plan once and ``specc.compiler.build.lower_to_ir`` lowers the
resolved plan into an :class:`ExecutionPlan`;
codegen serializes it as the artifact's manifest (:meth:`ExecutionPlan.to_dict`) next to the
programs it generates, and the runtime reads it back (:meth:`ExecutionPlan.from_dict`) without ever
seeing the plan. Everything a caller needs — the captured batch sizes, each state's κ, tree,
verify rule, programs and specialized kernels, the schedule, the checkpoints and their formats — is
a field here, so nobody re-derives it from the raw plan.

Plain frozen dataclasses of JSON data: no torch, no Hydra/OmegaConf, no ``specc.plan`` import (the
runtime imports this module). Mapping fields (method options, serving settings, a profiled cost
table, tree buffers) hold plain JSON data as written by codegen.

Errors: :meth:`ExecutionPlan.from_dict` raises :class:`specc.errors.ArtifactError` naming the key
and the fix when a manifest does not have the shape of this version.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from specc.errors import ArtifactError

STAGES = ("draft", "verify", "accept", "commit", "extend")
"""The five stage programs of a state, in order (``specc.compiler.programs``)."""

_FIX = "recompile the plan with `specc compile PLAN`"


def _get(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, Mapping) or key not in d:
        raise ArtifactError(f"{where}: missing key {key!r}; {_FIX}")
    return d[key]


def _tuple_tree(choices: Any) -> Optional[Tuple[Tuple[int, ...], ...]]:
    return None if choices is None else tuple(tuple(int(x) for x in p) for p in choices)


@dataclass(frozen=True)
class ModelIR:
    """A checkpoint the runtime loads: ``path`` (``pkg://`` allowed), ``format`` (``gguf``, ``hf``,
    ``auto``...), ``dtype`` (target only; None for a drafter) and ``max_model_len`` in tokens."""

    path: str
    format: Optional[str]
    max_model_len: Optional[int]
    dtype: Optional[str] = None

    def to_dict(self, with_dtype: bool) -> Dict[str, Any]:
        out = {"path": self.path, "format": self.format, "max_model_len": self.max_model_len}
        if with_dtype:
            out["dtype"] = self.dtype
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "ModelIR":
        return cls(path=_get(d, "path", where), format=d.get("format"), max_model_len=d.get("max_model_len"),
                   dtype=d.get("dtype"))


@dataclass(frozen=True)
class VerifyIR:
    """The verify rule (``greedy`` | ``standard`` | ``block`` | ``synthetic``), the draft sampling
    (``greedy`` | ``probabilistic``) and, for ``synthetic``, the κ conditional acceptance rates."""

    rule: str
    draft_sampling: str
    synthetic_rates: Optional[Tuple[float, ...]] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"rule": self.rule, "draft_sampling": self.draft_sampling,
                "synthetic_rates": None if self.synthetic_rates is None else list(self.synthetic_rates)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "VerifyIR":
        rates = d.get("synthetic_rates")
        return cls(rule=_get(d, "rule", where), draft_sampling=_get(d, "draft_sampling", where),
                   synthetic_rates=None if rates is None else tuple(float(r) for r in rates))


@dataclass(frozen=True)
class BucketIR:
    """One slot of the schedule's table (``specc.compiler.lower.BucketSpec``): floor key in requests, the κ
    candidates, the adaptive controller's hysteresis and ceiling coefficient."""

    key: int
    candidates: Tuple[int, ...]
    up_hysteresis: float = 0.0
    down_hysteresis: float = -0.25
    ceiling_coeff: float = 0.0


@dataclass(frozen=True)
class ScheduleIR:
    """How the runtime picks a state (``specc.compiler.lower.ScheduleSpec`` plus the profiled cost table,
    ``verify_ms`` by tokens and ``draft_ms`` by requests, and the budget's confidence source)."""

    kind: str
    capture_sizes: Tuple[int, ...]
    buckets: Tuple[BucketIR, ...]
    start_steps: int
    ema_alpha: float = 0.2
    warmup_batches: int = 10
    update_interval: int = 5
    num_steps_cap: Optional[int] = None
    ragged_verify: str = "static"
    cost_table: Optional[Mapping[str, Any]] = None
    confidence: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """The runtime's schedule mapping (``specc.runtime.schedule`` reads it; bucket keys as strings)."""
        return {"kind": self.kind, "capture_sizes": list(self.capture_sizes),
                "buckets": {str(b.key): {"candidates": list(b.candidates), "up_hysteresis": b.up_hysteresis,
                                         "down_hysteresis": b.down_hysteresis, "ceiling_coeff": b.ceiling_coeff}
                            for b in self.buckets},
                "start_steps": self.start_steps, "ema_alpha": self.ema_alpha, "warmup_batches": self.warmup_batches,
                "update_interval": self.update_interval, "num_steps_cap": self.num_steps_cap,
                "ragged_verify": self.ragged_verify, "cost_table": self.cost_table, "confidence": self.confidence}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "schedule") -> "ScheduleIR":
        buckets = tuple(BucketIR(key=int(k), candidates=tuple(int(c) for c in v["candidates"]),
                                 up_hysteresis=float(v.get("up_hysteresis", 0.0)),
                                 down_hysteresis=float(v.get("down_hysteresis", -0.25)),
                                 ceiling_coeff=float(v.get("ceiling_coeff", 0.0)))
                        for k, v in sorted(_get(d, "buckets", where).items(), key=lambda kv: int(kv[0])))
        return cls(kind=_get(d, "kind", where), capture_sizes=tuple(int(s) for s in _get(d, "capture_sizes", where)),
                   buckets=buckets, start_steps=int(_get(d, "start_steps", where)),
                   ema_alpha=float(d.get("ema_alpha", 0.2)), warmup_batches=int(d.get("warmup_batches", 10)),
                   update_interval=int(d.get("update_interval", 5)), num_steps_cap=d.get("num_steps_cap"),
                   ragged_verify=d.get("ragged_verify", "static"), cost_table=d.get("cost_table"),
                   confidence=d.get("confidence", ""))


@dataclass(frozen=True)
class RuntimeIR:
    """What the runtime loads and how it runs: the target and drafter checkpoints (formats, lengths),
    the method's drafter options (``name``, ``num_steps``, ``parallel_drafting``, ``ngram``, and
    ``plugin`` / ``suffix`` when set), the verify rule, device settings (``device``, ``dtype``,
    ``kernel_backend``, ``compile_backend``, ``cuda_graphs``), the largest κ of any state
    (``max_steps``: the extra KV slots a request needs), serving settings (``deploy``) and the
    schedule."""

    target: ModelIR
    draft: Optional[ModelIR]
    method: Mapping[str, Any]
    verify: VerifyIR
    device: str
    dtype: str
    kernel_backend: str
    compile_backend: str
    cuda_graphs: Optional[bool]
    schedule: ScheduleIR
    max_steps: int = 0
    deploy: Optional[Mapping[str, Any]] = None

    def to_dict(self) -> Dict[str, Any]:
        """The manifest's ``runtime`` section (``specc.runtime.loader.runtime_spec`` reads it)."""
        out = {"target": self.target.to_dict(True),
               "draft": None if self.draft is None else self.draft.to_dict(False),
               "method": dict(self.method), "verify": self.verify.to_dict(), "device": self.device,
               "dtype": self.dtype, "kernel_backend": self.kernel_backend, "compile_backend": self.compile_backend,
               "cuda_graphs": self.cuda_graphs, "max_steps": self.max_steps, "schedule": self.schedule.to_dict()}
        if self.deploy:
            out["deploy"] = dict(self.deploy)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "runtime") -> "RuntimeIR":
        draft = d.get("draft")
        return cls(target=ModelIR.from_dict(_get(d, "target", where), f"{where}.target"),
                   draft=None if draft is None else ModelIR.from_dict(draft, f"{where}.draft"),
                   method=dict(_get(d, "method", where)), verify=VerifyIR.from_dict(_get(d, "verify", where), f"{where}.verify"),
                   device=d.get("device", "auto"), dtype=d.get("dtype", "auto"),
                   kernel_backend=d.get("kernel_backend", "auto"), compile_backend=d.get("compile_backend", "eager"),
                   cuda_graphs=d.get("cuda_graphs"), max_steps=int(d.get("max_steps", 0)),
                   schedule=ScheduleIR.from_dict(_get(d, "schedule", where), f"{where}.schedule"), deploy=d.get("deploy"))


@dataclass(frozen=True)
class KernelSpec:
    """One specialized kernel module ``kernels/<name>.py`` rendered from ``templates/kernels/<family>.py.j2``
    with ``constants`` baked in (e.g. ``NUM_DRAFT_TOKENS``, ``DRAFT_PROBS``); the name is built from
    every constant (``specc.compiler.codegen.KernelVariant``)."""

    name: str
    family: str
    constants: Tuple[Tuple[str, Any], ...]

    @property
    def module(self) -> str:
        return f"kernels/{self.name}.py"

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "family": self.family, "module": self.module, "constants": dict(self.constants)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "kernel") -> "KernelSpec":
        return cls(name=_get(d, "name", where), family=_get(d, "family", where),
                   constants=tuple(sorted(dict(_get(d, "constants", where)).items())))


@dataclass(frozen=True)
class ProgramIR:
    """One stage program: ``specc.runtime.stages.<fn>(ctx, inputs, *args)`` with the state's
    constants as ``args`` (plain literals; ``specc.compiler.programs.Call``)."""

    stage: str
    fn: str
    args: Tuple[Any, ...] = ()


@dataclass(frozen=True)
class StateIR:
    """One candidate state (``specc.compiler.lower.CandidateState``) with everything it runs.

    Fields: ``batch_size`` B (requests), ``num_steps`` κ, ``topk``, ``num_draft_tokens`` W (verify
    rows per request incl. the bonus/root), ``verify_rule``, ``draft_sampling``, ``parallel``,
    ``tree_choices`` (static tree paths) and ``tree`` (its key in :attr:`ExecutionPlan.trees`),
    ``programs`` (the five stage programs and their constants), ``kernels`` (role → kernel name in
    :attr:`ExecutionPlan.kernels`) and ``constants`` (the specialization constants baked into its
    programs: ``K`` = κ, ``W``, ``B``, and for trees ``N`` draft nodes and ``MAX_DEPTH``)."""

    name: str
    method: str
    batch_size: int
    num_steps: int
    topk: int
    num_draft_tokens: int
    verify_rule: str
    draft_sampling: str
    parallel: bool
    tree_choices: Optional[Tuple[Tuple[int, ...], ...]] = None
    tree: Optional[str] = None
    programs: Tuple[ProgramIR, ...] = ()
    kernels: Tuple[Tuple[str, str], ...] = ()
    constants: Tuple[Tuple[str, Any], ...] = ()

    PARAMETERS = ("name", "method", "batch_size", "num_steps", "topk", "num_draft_tokens", "verify_rule",
                  "draft_sampling", "parallel", "tree_choices")

    @property
    def parameters(self) -> Dict[str, Any]:
        """The candidate state's fields (``specc.runtime.state.StateSpec.from_dict`` reads them)."""
        out = {k: getattr(self, k) for k in self.PARAMETERS}
        if out["tree_choices"] is not None:
            out["tree_choices"] = [list(p) for p in out["tree_choices"]]
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "parameters": self.parameters, "tree": self.tree,
                "kernels": dict(self.kernels), "constants": dict(self.constants),
                "programs": [{"stage": p.stage, "fn": p.fn, "args": list(p.args)} for p in self.programs]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "state") -> "StateIR":
        p = _get(d, "parameters", where)
        try:
            kw = {k: p[k] for k in cls.PARAMETERS}
        except (KeyError, TypeError):
            raise ArtifactError(f"{where}: parameters lack one of {', '.join(cls.PARAMETERS)}; {_FIX}") from None
        kw["tree_choices"] = _tuple_tree(kw["tree_choices"])
        progs = tuple(ProgramIR(stage=c["stage"], fn=c["fn"], args=tuple(_freeze(a) for a in c.get("args", ())))
                      for c in d.get("programs", ()))
        return cls(**kw, tree=d.get("tree"), programs=progs, kernels=tuple(sorted(dict(d.get("kernels", {})).items())),
                   constants=tuple(sorted(dict(d.get("constants", {})).items())))


def _freeze(a: Any) -> Any:
    return tuple(_freeze(x) for x in a) if isinstance(a, list) else a


@dataclass(frozen=True)
class ExecutionPlan:
    """The lowered plan (see the module docstring): ``plan_name``, the :class:`RuntimeIR`, the states
    (sorted by batch size, κ), the static trees compiled once by key (``specc.compiler.trees.compile_tree``
    buffers as plain lists), the specialized kernels, and ``notes`` (lowering's notes on defaults)."""

    plan_name: str
    runtime: RuntimeIR
    states: Tuple[StateIR, ...]
    trees: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    kernels: Tuple[KernelSpec, ...] = ()

    @property
    def schedule(self) -> ScheduleIR:
        return self.runtime.schedule

    @property
    def capture_sizes(self) -> Tuple[int, ...]:
        return self.runtime.schedule.capture_sizes

    @property
    def max_steps(self) -> int:
        """The largest κ of any state."""
        return max((s.num_steps for s in self.states), default=0)

    @property
    def max_batch(self) -> int:
        """The largest batch bucket of any state."""
        return max(s.batch_size for s in self.states)

    def state(self, name: str) -> StateIR:
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(name)

    def kernel(self, name: str) -> KernelSpec:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready data (the manifest's ``plan_name``, ``runtime``, ``states``, ``trees``, ``kernels``)."""
        return {"plan_name": self.plan_name, "runtime": self.runtime.to_dict(),
                "states": [s.to_dict() for s in self.states],
                "trees": {k: dict(v) for k, v in sorted(self.trees.items())},
                "kernels": [k.to_dict() for k in self.kernels]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExecutionPlan":
        """Inverse of :meth:`to_dict`. Raises ArtifactError naming a missing key."""
        states = _get(d, "states", "manifest")
        if not isinstance(states, list):
            raise ArtifactError(f"manifest: 'states' must be a list; {_FIX}")
        return cls(plan_name=_get(d, "plan_name", "manifest"),
                   runtime=RuntimeIR.from_dict(_get(d, "runtime", "manifest")),
                   states=tuple(StateIR.from_dict(s, f"states[{i}]") for i, s in enumerate(states)),
                   trees=dict(_get(d, "trees", "manifest")),
                   kernels=tuple(KernelSpec.from_dict(k, f"kernels[{i}]") for i, k in enumerate(_get(d, "kernels", "manifest"))))


IR_KEYS = ("plan_name", "runtime", "states", "trees", "kernels")
"""The manifest keys that hold the :class:`ExecutionPlan` (:meth:`ExecutionPlan.to_dict`)."""

NAME_HASH_CHARS = 12
"""Hex characters of the artifact hash kept in the directory name (48 bits)."""


def artifact_hash(ir_data: Mapping[str, Any], sources: Mapping[str, bytes], format_version: int,
                  specc_version: str) -> str:
    """The hash in an artifact's name ``<plan>-<hash>``: sha256 over the artifact format version, the
    specc version, the execution plan as canonical JSON (``ir_data``: the :data:`IR_KEYS` of a
    manifest) and the bytes of every generated program (``sources``: artifact-relative path →
    bytes), truncated to :data:`NAME_HASH_CHARS` hex characters. Predictions, reports and graphs are
    not covered: they describe an artifact, they are not what runs. The loader recomputes it, so an
    edited manifest or program no longer matches its name."""
    import hashlib
    import json

    h = hashlib.sha256()
    h.update(f"specc-artifact\0{format_version}\0{specc_version}\0".encode())
    h.update(json.dumps({k: ir_data.get(k) for k in IR_KEYS}, sort_keys=True, separators=(",", ":")).encode())
    for rel in sorted(sources):
        data = sources[rel]
        h.update(b"\0" + rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:NAME_HASH_CHARS]
