"""Runtime states: one per candidate state, each with its static buffers and its four programs.

A :class:`SpecRuntimeState` bundles every buffer sized by its constants (bucket B, κ, verify width
W = κ + 1, vocabulary V) and the state's programs (draft, verify, accept, extend), so switching
states is a pointer swap (SGLang's ``SpecRuntimeState``, DESIGN.md "Swap states atomically"). The
programs come from the generated module ``states/<name>.py`` (``build(ctx)``; contract in
``specc/runtime/README.md``) or, without an artifact, from :func:`build_state` (same choices).

On CUDA, verify + accept are captured as one CUDA graph at load (static inputs: ``input_ids``,
``positions``, ``cache_slots``, ``draft_tokens``, ``num_valid``, the sampling-parameter rows and the
randomness buffers); the host fills those buffers and replays. On the CPU they run eagerly.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from specc.errors import ArtifactError

SUPPORTED_RULES = ("greedy", "standard")


@dataclass(frozen=True)
class StateSpec:
    """The constants of one candidate state (the fields of ``specc.lower.CandidateState``)."""

    name: str
    method: str
    batch_size: int
    num_steps: int
    topk: int = 1
    num_draft_tokens: int = 0
    verify_rule: str = "greedy"
    draft_sampling: str = "greedy"
    parallel: bool = False
    tree_choices: Optional[Tuple[Tuple[int, ...], ...]] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StateSpec":
        """From a generated module's ``STATE`` dict or a CandidateState's fields."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in dict(d).items() if k in names}
        if kw.get("tree_choices") is not None:
            kw["tree_choices"] = tuple(tuple(p) for p in kw["tree_choices"])
        return cls(**kw)

    @classmethod
    def from_candidate(cls, state: Any) -> "StateSpec":
        return cls.from_dict({f.name: getattr(state, f.name) for f in fields(cls)})

    @property
    def width(self) -> int:
        """W, verify rows per request (κ + 1 for a chain)."""
        return self.num_steps + 1

    def check_supported(self) -> None:
        """Raise ArtifactError naming the field when this runtime cannot run the state."""
        where = f"candidate state {self.name}"
        if self.verify_rule not in SUPPORTED_RULES:
            raise ArtifactError(f"{where}: verify rule {self.verify_rule!r} is not implemented by the specc "
                                f"runtime (it runs {', '.join(SUPPORTED_RULES)}); set verify.rule to one of them")
        if self.num_steps > 0 and (self.topk != 1 or self.tree_choices is not None):
            raise ArtifactError(f"{where}: tree drafting (topk={self.topk}) is not implemented by the specc "
                                f"runtime; use a chain (method.topk=1, no tree_choices)")
        if self.parallel:
            raise ArtifactError(f"{where}: parallel drafting is not implemented by the specc runtime; "
                                f"set method.parallel_drafting=false")
        if self.num_steps > 0 and self.num_draft_tokens not in (0, self.num_steps + 1):
            raise ArtifactError(f"{where}: a chain verifies num_draft_tokens = κ + 1 = {self.num_steps + 1} "
                                f"rows, the state says {self.num_draft_tokens}")
        if self.num_steps < 0 or self.batch_size < 1:
            raise ArtifactError(f"{where}: batch_size must be >= 1 and num_steps >= 0")


@dataclass
class StateContext:
    """What a state's programs may use. Built once by the runtime, shared by all states.

    target: the target ``LlamaModel`` (cache already set up for ``max_batch_size`` x ``max_seq_len``).
    drafter: a ``specc.drafters.base.Drafter`` or None (κ = 0 only).
    device: where every buffer lives. vocab_size: V of the target.
    max_seq_len: cache slots per row, slack for κ + 1 rows past max_model_len and the trash slot
        (``max_seq_len - 1``) included.
    kernel_backend: ``specc.kernels`` backend ("auto" | "torch" | "triton").
    hidden_layers: target layers whose hidden states the drafter needs.
    method_options: the generated module's ``METHOD_OPTIONS`` (ngram window ...).
    use_cuda_graphs: capture verify + accept on CUDA.
    kernel_modules: the artifact's specialized kernel modules by variant name (empty without one).
    """

    target: Any
    drafter: Any
    device: torch.device
    vocab_size: int
    max_seq_len: int
    kernel_backend: str = "auto"
    hidden_layers: Tuple[int, ...] = ()
    method_options: Dict[str, Any] = field(default_factory=dict)
    use_cuda_graphs: bool = False
    kernel_modules: Dict[str, Any] = field(default_factory=dict)

    @property
    def trash_slot(self) -> int:
        return self.max_seq_len - 1


@dataclass
class StateBuffers:
    """Static buffers of one state (B = bucket, K = κ, W = K + 1, V = vocabulary), allocated once.

    Inputs (filled by the runtime before each step):
        input_ids ``[B, W]`` int64 (pending token, then drafts), positions ``[B, W]`` int64,
        cache_slots ``[B, W]`` int64, draft_tokens ``[B, K]`` int64, num_valid ``[B]`` int64,
        draft_probs ``[B, K, V]`` fp32 (probabilistic drafts only), temperature ``[B]`` fp32,
        top_k ``[B]`` int64, top_p ``[B]`` fp32, uniforms ``[B, K]`` fp32, exp_noise ``[B, V]`` fp32,
        draft_noise ``[B, K, V]`` fp32 (probabilistic drafts only).
    Set per step: ``batch`` (the BatchView), ``use_top_k``/``use_top_p`` (eager mode: skip the sort
        when no row filters), ``all_greedy`` (eager mode: every live row has temperature 0).
    Outputs (written by the programs): logits ``[B, W, V]`` fp32, hidden (list of ``[B, W, H]``),
        result (``specc.kernels.VerifyOutput``).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cache_slots: torch.Tensor
    draft_tokens: torch.Tensor
    num_valid: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    uniforms: torch.Tensor
    exp_noise: torch.Tensor
    draft_probs: Optional[torch.Tensor] = None
    draft_noise: Optional[torch.Tensor] = None
    batch: Any = None
    use_top_k: bool = True
    use_top_p: bool = True
    all_greedy: bool = False
    logits: Optional[torch.Tensor] = None
    hidden: List[torch.Tensor] = field(default_factory=list)
    result: Any = None

    @classmethod
    def allocate(cls, spec: StateSpec, ctx: StateContext) -> "StateBuffers":
        b, k, v, dev = spec.batch_size, spec.num_steps, ctx.vocab_size, ctx.device
        probabilistic = spec.draft_sampling == "probabilistic" and k > 0
        i64 = dict(dtype=torch.int64, device=dev)
        f32 = dict(dtype=torch.float32, device=dev)
        return cls(
            input_ids=torch.zeros(b, k + 1, **i64),
            positions=torch.zeros(b, k + 1, **i64),
            cache_slots=torch.full((b, k + 1), ctx.trash_slot, **i64),
            draft_tokens=torch.zeros(b, k, **i64),
            num_valid=torch.zeros(b, **i64),
            temperature=torch.zeros(b, **f32),
            top_k=torch.zeros(b, **i64),
            top_p=torch.ones(b, **f32),
            uniforms=torch.full((b, k), 0.5, **f32),
            exp_noise=torch.ones(b, v, **f32),
            draft_probs=torch.zeros(b, k, v, **f32) if probabilistic else None,
            draft_noise=torch.ones(b, k, v, **f32) if probabilistic else None,
        )

    def nbytes(self) -> int:
        """Bytes held by the static buffers (reported at load)."""
        total = 0
        for t in (self.input_ids, self.positions, self.cache_slots, self.draft_tokens, self.num_valid,
                  self.temperature, self.top_k, self.top_p, self.uniforms, self.exp_noise,
                  self.draft_probs, self.draft_noise):
            if t is not None:
                total += t.numel() * t.element_size()
        return total


Program = Callable[[StateContext, StateBuffers], Any]


@dataclass(frozen=True)
class StatePrograms:
    """The four stage programs of a state (each ``fn(ctx, bufs)``)."""

    draft: Program
    verify: Program
    accept: Program
    extend: Program


class SpecRuntimeState:
    """One candidate state ready to run: spec, buffers, programs and (on CUDA) the captured graph.

    Args:
        spec: the state's constants. ctx: shared context. programs: its stage programs.
    Raises:
        ArtifactError: the state uses something this runtime does not implement.
    """

    def __init__(self, spec: StateSpec, ctx: StateContext, programs: StatePrograms) -> None:
        spec.check_supported()
        if spec.num_steps > 0 and ctx.drafter is None:
            raise ArtifactError(f"candidate state {spec.name}: κ = {spec.num_steps} needs a drafter, "
                                f"but method {spec.method!r} built none")
        if spec.draft_sampling == "probabilistic" and spec.num_steps > 0 and not getattr(
                ctx.drafter, "supports_probabilistic", False):
            raise ArtifactError(f"candidate state {spec.name}: method {spec.method!r} cannot draw "
                                f"probabilistic drafts; set verify.draft_sampling=greedy")
        self.spec = spec
        self.ctx = ctx
        self.programs = programs
        self.bufs = StateBuffers.allocate(spec, ctx)
        self._graph = None
        self._view = self.bufs  # the buffers verify/accept/extend run on this step (see set_width)

    # ------------------------------------------------------------------ stages
    def draft(self) -> None:
        """Run the draft program (fills draft_tokens, num_valid, draft_probs). Eager always: the
        n-gram lookup is host work; model drafters are cheap to launch relative to verify."""
        self.programs.draft(self.ctx, self.bufs)

    def set_width(self, width: int) -> int:
        """Eager mode only: verify just the first ``width`` rows of every request this step
        (``width`` = the longest valid draft in the batch + 1; rows past a request's valid drafts
        are never accepted, so dropping columns nobody in the batch uses changes no output). A step
        where no request has a draft then costs one single-row target forward, not κ + 1 rows — on
        a CPU, whose GEMMs cost far more for several rows than for one, this is what keeps n-gram
        steps without a match at plain-decoding cost. Captured states keep their static width.
        Returns the width used. Views share storage with the full buffers."""
        b = self.bufs
        width = max(1, min(int(width), self.spec.width))
        if self._graph is not None or width == self.spec.width:
            self._view = b
            return self.spec.width
        k = width - 1
        self._view = replace(
            b, input_ids=b.input_ids[:, :width], positions=b.positions[:, :width],
            cache_slots=b.cache_slots[:, :width], draft_tokens=b.draft_tokens[:, :k],
            uniforms=b.uniforms[:, :k],
            draft_probs=None if b.draft_probs is None else b.draft_probs[:, :k],
            logits=None, hidden=[], result=None)
        return width

    def verify_accept(self) -> Any:
        """Target forward over ``[B, W]`` then the verify rule; returns the VerifyOutput."""
        if self._graph is not None:
            self._graph.replay()
            return self.bufs.result
        self.verify()
        return self.accept()

    def verify(self) -> None:
        self.programs.verify(self.ctx, self._view)

    def accept(self) -> Any:
        self.programs.accept(self.ctx, self._view)
        return self._view.result

    def extend(self) -> None:
        """Run the extend program (the drafter's commit over the accepted tokens)."""
        self._view.batch = self.bufs.batch
        self.programs.extend(self.ctx, self._view)
        self._view = self.bufs

    @property
    def captured(self) -> bool:
        return self._graph is not None

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self) -> bool:
        """Capture verify + accept as one CUDA graph (CUDA only; returns whether it captured).

        Warm-up runs on a side stream first (PyTorch's documented recipe), with every row pointing
        its KV writes at the trash slot so capture leaves the caches' real entries untouched.
        """
        if not (self.ctx.use_cuda_graphs and self.ctx.device.type == "cuda" and torch.cuda.is_available()):
            return False
        b = self.bufs
        b.cache_slots.fill_(self.ctx.trash_slot)
        b.positions.copy_(torch.arange(self.spec.width, device=b.positions.device).expand_as(b.positions))
        b.use_top_k = b.use_top_p = True  # graphs take the general path (no host-side branching)
        b.all_greedy = False
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.programs.verify(self.ctx, b)
                self.programs.accept(self.ctx, b)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.programs.verify(self.ctx, b)
            self.programs.accept(self.ctx, b)
        self._graph = graph
        return True


def select_programs(spec: StateSpec) -> StatePrograms:
    """The stage programs a state's constants select (what ``templates/state.py.j2`` renders).

    κ = 0 states always accept with the standard rule: with no drafts it is plain sampling from the
    processed p (argmax for temperature-0 rows), so plain decoding serves any request."""
    from specc.runtime import stages

    k, sampling = spec.num_steps, spec.draft_sampling
    if k == 0:
        draft = stages.draft_none
    else:
        def draft(ctx, bufs, _k=k, _s=sampling):
            return stages.draft_chain(ctx, bufs, _k, _s)
    if spec.verify_rule == "greedy" and k > 0:
        accept = stages.accept_greedy
    else:
        prob_q = sampling == "probabilistic" and k > 0
        def accept(ctx, bufs, _q=prob_q):
            return stages.accept_standard(ctx, bufs, _q, None)
    extend = stages.extend_none if k == 0 else stages.extend_drafter
    return StatePrograms(draft=draft, verify=stages.verify_chain, accept=accept, extend=extend)


def build_state(spec: StateSpec, ctx: StateContext) -> SpecRuntimeState:
    """Build a runtime state without an artifact (tests, benchmarks): same programs as the template."""
    spec.check_supported()
    return SpecRuntimeState(spec, ctx, select_programs(spec))
