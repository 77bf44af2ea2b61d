"""Runtime states: one per candidate state, each with its static step inputs and its programs.

A :class:`SpecRuntimeState` bundles every buffer sized by its constants (bucket B, κ, verify width
W = ``num_draft_tokens``: κ + 1 for a chain, the tree's node count for a tree; vocabulary V) and the
state's programs, so switching states is a pointer swap (SGLang's ``SpecRuntimeState``,
sglang/srt/speculative/adaptive_runtime_state.py:10-34). A static tree's buffers (parents, depths, mask, ranks) are compiled once
(the manifest's ``trees``) and never rewritten. The programs are the ones the execution plan lists for the
state (``specc.ir.StateIR.programs``, :func:`bind_programs`); a state built directly from its
constants (tests, tools) takes them from the same table codegen used
(:func:`specc.compiler.programs.state_programs`).

The step is data: the runtime fills a :class:`StepInputs` (``specc.runtime.step.prepare``), the
draft program writes the drafts into it, and the **verify program** (:meth:`SpecRuntimeState.program`:
verify forward → accept → KV commit, written once) maps it to a :class:`StepOutputs`. That one
program runs in one of three ways, chosen at load:

* **eager** — called directly on a view of the inputs over the rows in use; on the CPU the target
  forward runs ragged (each request's verify costs its own number of tokens, ``num_tokens``);
* **captured** (CUDA) — recorded once as a CUDA graph over the full static inputs; a step fills the
  inputs and replays it;
* **compiled** (``runtime.compile_backend: inductor``) — ``torch.compile`` of the same function over
  the full static inputs (inductor; ``freezing`` so oneDNN prepacks the weights): the CPU
  counterpart of capture.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from specc.methods.base import StaticTree
from specc.errors import ArtifactError


@dataclass(frozen=True)
class StateSpec:
    """The constants of one candidate state (the fields of ``specc.compiler.lower.CandidateState``)."""

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
        """From a manifest state's ``parameters`` or a CandidateState's fields."""
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
        """W, verify rows per request: ``num_draft_tokens`` (κ + 1 for a chain; 0 in older specs
        means κ + 1)."""
        return int(self.num_draft_tokens) or self.num_steps + 1

    @property
    def kind(self) -> str:
        """``plain``, ``chain``, ``parallel`` or ``tree`` (:func:`specc.methods.state_kind`)."""
        from specc.methods import state_kind

        return state_kind(self.num_steps, self.topk, self.parallel, self.tree_choices)

    @property
    def is_tree(self) -> bool:
        return self.kind == "tree"

    @property
    def cache_slack(self) -> int:
        """KV slots per row past ``max_model_len`` this state needs (:func:`specc.compiler.trees.cache_slack`)."""
        from specc.compiler.trees import cache_slack

        return cache_slack(self.num_steps, self.topk, self.width, static=self.tree_choices is not None)

    @property
    def key(self) -> Tuple[int, int]:
        """``(batch bucket, κ)``: how schedules name the state."""
        return self.batch_size, self.num_steps

    def check_supported(self) -> None:
        """Raise ArtifactError naming the field when this runtime cannot run the state
        (:func:`specc.compiler.programs.unsupported_reason`)."""
        from specc.compiler.programs import unsupported_reason

        reason = unsupported_reason(self)
        if reason:
            raise ArtifactError(reason)


@dataclass
class StateContext:
    """What a state's programs may use. Built once by the runtime, shared by all states.

    target: the target ``LlamaModel`` (cache already set up for ``max_batch_size`` x ``max_seq_len``).
    drafter: a ``specc.methods.base.Drafter`` or None (κ = 0 only).
    device: where every buffer lives. vocab_size: V of the target.
    max_seq_len: cache slots per row, slack for κ + 1 rows past max_model_len and the trash slot
        (``max_seq_len - 1``) included.
    kernel_backend: ``specc.kernels`` backend ("auto" | "torch" | "triton").
    hidden_layers: target layers whose hidden states the drafter needs.
    use_cuda_graphs: capture the verify program on CUDA.
    kernel_modules: the artifact's specialized kernel modules by variant name (empty without one).
    compile_backend: ``eager`` or ``inductor`` (``torch.compile`` each state's verify program).
    """

    target: Any
    drafter: Any
    device: torch.device
    vocab_size: int
    max_seq_len: int
    kernel_backend: str = "auto"
    hidden_layers: Tuple[int, ...] = ()
    use_cuda_graphs: bool = False
    kernel_modules: Dict[str, Any] = field(default_factory=dict)
    compile_backend: str = "eager"
    _capture_stream: Any = field(default=None, init=False, repr=False)

    @property
    def trash_slot(self) -> int:
        return self.max_seq_len - 1

    def capture_stream(self) -> "torch.cuda.Stream":
        """The one CUDA stream every state warms up and captures on (created on first use). Sharing it
        keeps per-stream one-time allocations out of the graphs' pools: PyTorch allocates a cuBLAS
        workspace per (handle, stream) on first use (32 MiB on Hopper; ``aten/src/ATen/cuda/
        CublasHandlePool.cpp``, ``getChosenWorkspaceSize``), which the warm-up then takes from the general
        pool instead of the first captured graph."""
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(self.device)
        return self._capture_stream


_WIDTH_FIELDS = ("input_ids", "positions", "cache_slots", "node_depths")  # [B, W]
_DRAFT_FIELDS = ("draft_tokens", "uniforms", "confidence", "draft_probs", "draft_noise", "parents")  # [B, N, ...]
_ROW_FIELDS = ("input_ids", "positions", "cache_slots", "draft_tokens", "num_valid", "num_tokens",
               "temperature", "top_k", "top_p", "uniforms", "exp_noise", "confidence", "draft_probs",
               "draft_noise", "parents", "node_depths", "tree_mask")


@dataclass
class StepInputs:
    """What one decode step of a state reads: the state's static buffers (B = bucket, W = verify
    width, N = W - 1 draft nodes: κ for a chain; V = vocabulary), allocated once, plus the step's
    flags. An eager step works on a view over its rows in use (:meth:`view`); a captured or compiled
    one on the full buffers.

    Filled by the runtime before the draft program (``specc.runtime.step.prepare``):
        input_ids ``[B, W]`` int64 (pending token, then drafts), positions ``[B, W]`` int64 (a tree:
        root position + node depth), cache_slots ``[B, W]`` int64 (root position + node index),
        num_tokens ``[B]`` int64 (verify tokens per row: num_valid + 1, 0 for rows without a live
        request), temperature ``[B]`` fp32, top_k ``[B]`` int64, top_p ``[B]`` fp32, uniforms
        ``[B, N]`` fp32, exp_noise ``[B, V]`` fp32, draft_noise ``[B, N, V]`` fp32 (probabilistic
        drafts only), ``batch`` (the drafter's :class:`specc.methods.base.BatchView` of the rows),
        active ``[B]`` bool (rows holding a live request; from the step's one host-to-device copy),
        ``max_root`` (int, the highest row's pending-token position, from the host's sequence lengths).
    Filled by the draft program:
        draft_tokens ``[B, N]`` int64 (-1: not proposed), num_valid ``[B]`` int64 (drafts verified per
        row, a prefix), confidence ``[B, N]`` fp32 (the drafter's per-position estimate),
        draft_probs ``[B, N, V]`` fp32 (probabilistic drafts only; a tree: q per parent node), and
        the drafts into ``input_ids[:, 1:]``.
    Tree states only (None for chains): parents ``[B, N]`` int64 (parent node of node j + 1),
        node_depths ``[B, W]`` int64, tree_mask ``[B, W, W]`` bool (the tree-only verify mask,
        SGLang's ``QLEN_ONLY``), static_tree (a static tree's compiled buffers, constant).
    Flags of the step (python values; fixed for a captured or compiled program): ``use_top_k`` /
        ``use_top_p`` (skip the sort when no row filters), ``all_greedy`` (every live row has
        temperature 0; a captured or compiled state: False, or True for a greedy-rule state whose
        step has no sampled row), ``ragged`` (the target forward skips padding tokens); ``kernels``: role →
        the artifact's kernel variant name.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cache_slots: torch.Tensor
    draft_tokens: torch.Tensor
    num_valid: torch.Tensor
    num_tokens: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    uniforms: torch.Tensor
    exp_noise: torch.Tensor
    confidence: torch.Tensor
    draft_probs: Optional[torch.Tensor] = None
    draft_noise: Optional[torch.Tensor] = None
    parents: Optional[torch.Tensor] = None
    node_depths: Optional[torch.Tensor] = None
    tree_mask: Optional[torch.Tensor] = None
    static_tree: Optional[StaticTree] = None
    batch: Any = None
    active: Optional[torch.Tensor] = None
    max_root: int = 0
    use_top_k: bool = True
    use_top_p: bool = True
    all_greedy: bool = False
    ragged: bool = False
    kernels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def allocate(cls, spec: StateSpec, ctx: StateContext, tree: Optional[Mapping[str, Any]] = None,
                 ) -> "StepInputs":
        """Buffers of ``spec``; ``tree``: a static tree's compiled lists (``specc.compiler.trees.compile_tree``,
        the manifest's ``trees`` entry), compiled here from ``spec.tree_choices`` when None.
        Raises ArtifactError when the tree's node count is not the state's verify width."""
        b, v, dev = spec.batch_size, ctx.vocab_size, ctx.device
        w = spec.width
        k = w - 1  # draft nodes (κ for a chain)
        probabilistic = spec.draft_sampling == "probabilistic" and spec.num_steps > 0
        i64 = dict(dtype=torch.int64, device=dev)
        f32 = dict(dtype=torch.float32, device=dev)
        static = None
        tree_fields: Dict[str, Any] = {}
        if spec.is_tree and spec.num_steps > 0:
            if spec.tree_choices is not None:
                if tree is None:
                    from specc.compiler.trees import compile_tree

                    tree = compile_tree(spec.tree_choices)
                if int(tree["num_nodes"]) != w:
                    raise ArtifactError(f"candidate state {spec.name}: its static tree has {tree['num_nodes']} "
                                        f"nodes but the state verifies {w}; re-run specc compile")
                static = StaticTree.from_buffers(dict(tree), dev)
            tree_fields = dict(
                parents=(static.parents if static is not None else torch.arange(k, **i64)).expand(b, k).clone(),
                node_depths=(static.depths if static is not None else torch.arange(w, **i64)).expand(b, w).clone(),
                tree_mask=(static.mask if static is not None else torch.ones(w, w, dtype=torch.bool, device=dev).tril()
                           ).expand(b, w, w).clone())
        return cls(
            input_ids=torch.zeros(b, k + 1, **i64),
            positions=torch.zeros(b, k + 1, **i64),
            cache_slots=torch.full((b, k + 1), ctx.trash_slot, **i64),
            static_tree=static,
            **tree_fields,
            draft_tokens=torch.zeros(b, k, **i64),
            num_valid=torch.zeros(b, **i64),
            num_tokens=torch.zeros(b, **i64),
            temperature=torch.zeros(b, **f32),
            top_k=torch.zeros(b, **i64),
            top_p=torch.ones(b, **f32),
            uniforms=torch.full((b, k), 0.5, **f32),
            exp_noise=torch.ones(b, v, **f32),
            confidence=torch.ones(b, k, **f32),
            draft_probs=torch.zeros(b, k, v, **f32) if probabilistic else None,
            draft_noise=torch.ones(b, k, v, **f32) if probabilistic else None,
        )

    def nbytes(self) -> int:
        """Bytes held by the static buffers (reported at load)."""
        return sum(t.numel() * t.element_size() for t in (getattr(self, n) for n in _ROW_FIELDS) if t is not None)

    def view(self, rows: int, width: Optional[int] = None) -> "StepInputs":
        """The first ``rows`` rows and, given ``width``, the first ``width`` verify columns (``width - 1``
        draft nodes; a tree's nodes are in topological order, so a prefix is a tree), sharing storage:
        an eager step over the rows in use and the widest row's verify."""
        kw: Dict[str, Any] = {}
        for name in _ROW_FIELDS:
            t = getattr(self, name)
            if t is None:
                continue
            t = t[:rows]
            if width is not None and name in _WIDTH_FIELDS:
                t = t[:, :width]
            elif width is not None and name in _DRAFT_FIELDS:
                t = t[:, :width - 1]
            elif width is not None and name == "tree_mask":
                t = t[:, :width, :width]
            kw[name] = t
        return replace(self, **kw)


@dataclass
class StepOutputs:
    """What the verify program returns for one step.

    Attributes:
        result: the verify rule's :class:`specc.kernels.VerifyOutput` (``accepted_len [B]``,
            ``output_tokens [B, W]``, ``bonus [B]``, ``accept_index [B, W]`` for trees).
        hidden: list of ``[B, W, H]``, the target's hidden states at the drafter's layers over the
            verify rows (empty when the drafter reads none).
        path: a tree's accepted path as chain-shaped rows for the drafter, ``(input_ids, positions,
            cache_slots, hidden)`` (the KV-commit stage's output), None for a chain.
        host: the step's host copy of the integers above (:class:`specc.methods.base.HostVerify`),
            set by ``specc.runtime.step.emit`` from its one device-to-host read (None before).
    """

    result: Any
    hidden: List[torch.Tensor]
    path: Any = None
    host: Any = None


Program = Callable[..., Any]


@dataclass(frozen=True)
class BoundPrograms:
    """A state's stage programs bound to its constants (:func:`select_programs`): ``draft(ctx, inp)``,
    ``verify(ctx, inp) -> (logits, hidden)``, ``accept(ctx, inp, logits) -> VerifyOutput``,
    ``commit(ctx, inp, result, hidden) -> path | None``, ``extend(ctx, inp, outputs, batch_view)``."""

    draft: Program
    verify: Program
    accept: Program
    commit: Program
    extend: Program


class _NoTimer:
    def __call__(self, name: str):
        return contextlib.nullcontext()


_NO_TIMER = _NoTimer()


class SpecRuntimeState:
    """One candidate state ready to run: spec, static step inputs, programs and the way its verify
    program runs (eager, captured on CUDA, or compiled with inductor).

    A step: :meth:`begin` (the inputs to fill) → ``draft(inp)`` → :meth:`run` (the verify program:
    verify → accept → commit) → ``extend(inp, outputs, batch_view)``.

    Args:
        spec: the state's constants. ctx: shared context. programs: its bound stage programs.
        kernels: role → the artifact's specialized kernel variant name.
        tree: a static tree's compiled buffers (the manifest's ``trees`` entry); compiled from
            ``spec.tree_choices`` when None.
    Raises:
        ArtifactError: the state uses something this runtime does not implement.
    """

    def __init__(self, spec: StateSpec, ctx: StateContext, programs: BoundPrograms,
                 kernels: Optional[Mapping[str, str]] = None, tree: Optional[Mapping[str, Any]] = None) -> None:
        spec.check_supported()
        if spec.num_steps > 0 and ctx.drafter is None:
            raise ArtifactError(f"candidate state {spec.name}: κ = {spec.num_steps} needs a drafter, "
                                f"but method {spec.method!r} built none")
        if spec.draft_sampling == "probabilistic" and spec.num_steps > 0 and not getattr(
                ctx.drafter, "supports_probabilistic", False):
            raise ArtifactError(f"candidate state {spec.name}: method {spec.method!r} cannot draw "
                                f"probabilistic drafts; set verify.draft_sampling=greedy")
        if spec.is_tree and spec.num_steps > 0 and not getattr(ctx.drafter, "supports_tree", False):
            raise ArtifactError(f"candidate state {spec.name}: method {spec.method!r} built a drafter that "
                                f"cannot draft trees; use method.topk=1 and no tree_choices")
        self.spec = spec
        self.ctx = ctx
        self.programs = programs
        self.inputs = StepInputs.allocate(spec, ctx, tree)
        self.inputs.kernels = dict(kernels or {})
        self._graph = None
        self._graph_out: Optional[StepOutputs] = None
        self._compiled: Optional[Callable[[StepInputs], StepOutputs]] = None
        self.capture_s = 0.0  # seconds its CUDA-graph capture (or inductor compile) took at load
        self.graph_breaks = 0  # where dynamo split the compiled verify program (0: one graph)
        #: bytes the CUDA-graph capture took from the device: the graph's private memory pool
        #: (``memory_reserved`` grown during capture) and the peak of the tensors allocated in it
        #: (``max_memory_allocated`` above the level before capture); 0 when not captured
        self.graph_pool_bytes = 0
        self.graph_peak_bytes = 0

    # ------------------------------------------------------------------ the step
    @property
    def static(self) -> bool:
        """Whether the verify program runs over the full static inputs (captured or compiled)."""
        return self._graph is not None or self._compiled is not None

    @property
    def greedy_rule(self) -> bool:
        """Whether the state's accept program is a greedy-rule one
        (:data:`specc.runtime.stages.GREEDY_RULE_ACCEPTS`): the greedy kernel when every row of the step
        is greedy, the standard rule when a row samples. Captured or compiled, such a state holds the
        all-greedy program and runs a step with sampled rows eagerly (:meth:`run`)."""
        from specc.runtime.stages import GREEDY_RULE_ACCEPTS

        return getattr(self.programs.accept, "__name__", "") in GREEDY_RULE_ACCEPTS

    def begin(self, rows: int) -> StepInputs:
        """The inputs of a step over rows ``0..rows-1``: eager, a view of those rows (the target forward
        then runs ragged on the CPU); captured or compiled, all B rows at the static width."""
        if self.static:
            inp = self.inputs
            inp.ragged = False
            return inp
        inp = self.inputs if rows >= self.spec.batch_size else self.inputs.view(rows)
        inp.ragged = self.ctx.device.type == "cpu"
        return inp

    def draft(self, inp: StepInputs) -> None:
        """The draft program: fills draft_tokens, num_valid, confidence (and draft_probs). Eager always:
        drafters keep host state (the n-gram lookup, a tree's expansion)."""
        self.programs.draft(self.ctx, inp)

    def program(self, inp: StepInputs, timer: Callable[[str], Any] = _NO_TIMER) -> StepOutputs:
        """The verify program, the one copy of verify → accept → commit: the target forward over every
        request's W verify rows, the verify rule, then the KV commit (a tree's accepted path moved
        into place). ``timer(stage)`` is a context manager around each stage (eager only)."""
        with timer("verify"):
            logits, hidden = self.programs.verify(self.ctx, inp)
        with timer("accept"):
            result = self.programs.accept(self.ctx, inp, logits)
        with timer("commit"):
            path = self.programs.commit(self.ctx, inp, result, hidden)
        return StepOutputs(result=result, hidden=list(hidden), path=path)

    def run(self, inp: StepInputs, timer: Callable[[str], Any] = _NO_TIMER) -> StepOutputs:
        """Run the verify program the way this state was built to: replay the captured graph, call the
        compiled function, or call :meth:`program` eagerly (``timer`` then times each stage; the
        captured and compiled programs are timed as one "verify" stage by the caller). A greedy-rule
        state (:attr:`greedy_rule`) captured or compiled for all-greedy steps runs a step with a sampled
        row (``inp.all_greedy`` False) eagerly over the same full static inputs: that step takes the
        standard rule, which the captured program does not hold."""
        if self.static and self.greedy_rule and not inp.all_greedy:
            return self.program(inp, timer)
        if self._graph is not None:
            self._graph.replay()
            return self._graph_out
        if self._compiled is not None:
            return self._compiled(inp)
        return self.program(inp, timer)

    def extend(self, inp: StepInputs, out: StepOutputs, batch_view: Any) -> None:
        """The extend program: the drafter's commit over the accepted tokens (``batch_view``: the rows
        after this step's tokens were appended)."""
        self.programs.extend(self.ctx, inp, out, batch_view)

    @property
    def captured(self) -> bool:
        return self._graph is not None

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    # ------------------------------------------------------------------ capture and compile
    def _static_inputs(self) -> StepInputs:
        """The full inputs set up so a warm-up or capture run leaves the caches' real entries untouched
        (every KV write to the trash slot) and takes the general path (no host-side branching); a
        greedy-rule state (:attr:`greedy_rule`) takes its all-greedy path, the greedy kernel."""
        b = self.inputs
        b.cache_slots.fill_(self.ctx.trash_slot)
        b.positions.copy_(torch.arange(self.spec.width, device=b.positions.device).expand_as(b.positions))
        b.use_top_k = b.use_top_p = True
        b.all_greedy, b.ragged = self.greedy_rule, False
        return b

    def capture(self) -> bool:
        """Capture the verify program as one CUDA graph (CUDA only; returns whether it captured).
        Two warm-up runs on the side stream first (PyTorch's documented recipe; the stream is
        :meth:`StateContext.capture_stream`, shared by every state, and the capture runs on it too). The
        warm-up's freed blocks go back to the device before the capture, so :attr:`graph_pool_bytes`
        (reserved memory grown during capture, bytes) is this graph's own private pool."""
        if not (self.ctx.use_cuda_graphs and self.ctx.device.type == "cuda" and torch.cuda.is_available()):
            return False
        import time

        t0 = time.perf_counter()
        b = self._static_inputs()
        stream = self.ctx.capture_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.program(b)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(self.ctx.device)
        torch.cuda.empty_cache()
        reserved0 = torch.cuda.memory_reserved(self.ctx.device)
        allocated0 = torch.cuda.memory_allocated(self.ctx.device)
        torch.cuda.reset_peak_memory_stats(self.ctx.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = self.program(b)
        torch.cuda.synchronize(self.ctx.device)
        self.graph_pool_bytes = int(torch.cuda.memory_reserved(self.ctx.device) - reserved0)
        self.graph_peak_bytes = int(torch.cuda.max_memory_allocated(self.ctx.device) - allocated0)
        self._graph, self._graph_out = graph, out
        self.capture_s = time.perf_counter() - t0
        return True

    def compile(self) -> bool:
        """Compile the verify program with ``torch.compile`` (inductor, the state's static shapes, no
        dynamic dimensions) when ``ctx.compile_backend`` is ``inductor`` and the state was not captured;
        one warm-up call compiles it here, at load (its seconds in :attr:`capture_s`). Returns whether
        it compiled. The compiled function is the same :meth:`program`; outputs equal eager's
        (``tests/runtime/test_step_program.py``)."""
        if self.ctx.compile_backend != "inductor" or self._graph is not None:
            return False
        import time

        from specc.runtime.compile import compile_program

        t0 = time.perf_counter()
        b = self._static_inputs()
        self._compiled, self.graph_breaks = compile_program(self, b)
        self.capture_s = time.perf_counter() - t0
        return True


def select_programs(spec: StateSpec, synthetic_rates: Optional[Sequence[float]] = None) -> BoundPrograms:
    """The stage programs of a state, from the one table (:func:`specc.compiler.programs.state_programs`),
    bound to their constants. Raises ArtifactError for a state this runtime cannot run."""
    from specc.compiler import programs
    from specc.runtime import stages

    try:
        table = programs.state_programs(spec, synthetic_rates)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None
    return BoundPrograms(**{stage: _bind(getattr(stages, call.fn), call.args) for stage, call in table.items()})


def _bind(fn: Callable, args: Tuple[Any, ...]) -> Program:
    def program(ctx, inp, *rest):
        return fn(ctx, inp, *rest, *args)
    program.__name__ = fn.__name__
    program.__doc__ = fn.__doc__
    return program


def bind_programs(calls: Sequence[Tuple[str, str, Tuple[Any, ...]]], where: str) -> BoundPrograms:
    """The stage programs an execution plan lists for a state (``specc.ir.StateIR.programs``:
    ``(stage, fn, args)`` for each of draft, verify, accept, commit, extend), bound to their
    constants. Raises ArtifactError naming the state when a stage is missing or repeated, or a
    program is not one of :mod:`specc.runtime.stages`."""
    from specc.runtime import stages

    bound: Dict[str, Program] = {}
    for stage, fn, args in calls:
        prog = getattr(stages, fn, None) if not fn.startswith("_") else None
        if stage not in BoundPrograms.__dataclass_fields__ or stage in bound or not callable(prog):
            raise ArtifactError(f"{where}: program {stage}={fn} is not a stage program of this runtime "
                                f"(or repeats a stage); re-run specc compile")
        bound[stage] = _bind(prog, tuple(args))
    missing = [k for k in BoundPrograms.__dataclass_fields__ if k not in bound]
    if missing:
        raise ArtifactError(f"{where}: no program for stage(s) {', '.join(missing)}; re-run specc compile")
    return BoundPrograms(**bound)


def build_state(spec: StateSpec, ctx: StateContext, synthetic_rates: Optional[Sequence[float]] = None,
                kernels: Optional[Mapping[str, str]] = None, tree: Optional[Mapping[str, Any]] = None,
                programs: Optional[Sequence[Tuple[str, str, Tuple[Any, ...]]]] = None) -> SpecRuntimeState:
    """Build a runtime state: its programs as the execution plan lists them (``programs``,
    :func:`bind_programs`; a runtime built from an artifact or IR always has them) or, for a state
    built directly from its constants, from the one table (:func:`select_programs`); its kernel
    variants (role → an artifact kernel module's name; none: the generic kernels) and its static tree
    (the manifest's compiled entry; compiled from ``spec.tree_choices`` by the same function codegen
    uses when None). Raises ArtifactError for a state this runtime cannot run."""
    spec.check_supported()
    bound = (bind_programs(programs, f"state {spec.name}") if programs
             else select_programs(spec, synthetic_rates))
    return SpecRuntimeState(spec, ctx, bound, kernels=kernels, tree=tree)
