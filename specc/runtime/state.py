"""Runtime states: one per candidate state, each with its static buffers and its five programs.

A :class:`SpecRuntimeState` bundles every buffer sized by its constants (bucket B, κ, verify width
W = ``num_draft_tokens``: κ + 1 for a chain, the tree's node count for a tree; vocabulary V) and the
state's programs (draft, verify, accept, commit, extend), so switching states is a pointer swap
(SGLang's ``SpecRuntimeState``, DESIGN.md "Swap states atomically"). A static tree's buffers (parents,
depths, mask, ranks) are compiled once (the generated module's ``TREE``) and never rewritten. The
programs come from the generated module ``states/<name>.py`` (``build(ctx)``; contract in
``specc/runtime/README.md``) or, without an artifact, from :func:`build_state`; both take them from
the one table of programs a state runs (:func:`specc.programs.state_programs`).

On CUDA, verify + accept + commit are captured as one CUDA graph at load (static inputs: ``input_ids``,
``positions``, ``cache_slots``, ``draft_tokens``, ``num_valid``, the sampling-parameter rows and the
randomness buffers); the host fills those buffers and replays. On the CPU they run eagerly on a view
of the buffers trimmed to the rows in use and the step's widest verify, and the target forward runs
ragged: each request's verify costs its own number of tokens (``num_tokens``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from specc.drafters.base import StaticTree
from specc.errors import ArtifactError


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
        """KV slots per row past ``max_model_len`` this state needs (:func:`specc.trees.cache_slack`)."""
        from specc.trees import cache_slack

        return cache_slack(self.num_steps, self.topk, self.width, static=self.tree_choices is not None)

    @property
    def key(self) -> Tuple[int, int]:
        """``(batch bucket, κ)``: how schedules name the state."""
        return self.batch_size, self.num_steps

    def check_supported(self) -> None:
        """Raise ArtifactError naming the field when this runtime cannot run the state
        (:func:`specc.programs.unsupported_reason`)."""
        from specc.programs import unsupported_reason

        reason = unsupported_reason(self)
        if reason:
            raise ArtifactError(reason)


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
    use_cuda_graphs: bool = False
    kernel_modules: Dict[str, Any] = field(default_factory=dict)

    @property
    def trash_slot(self) -> int:
        return self.max_seq_len - 1


_ROW_FIELDS = ("input_ids", "positions", "cache_slots", "draft_tokens", "num_valid", "num_tokens",
               "temperature", "top_k", "top_p", "uniforms", "exp_noise", "confidence", "draft_probs",
               "draft_noise", "parents", "node_depths", "tree_mask")
_WIDTH_FIELDS = ("input_ids", "positions", "cache_slots", "node_depths")  # [B, W]
_DRAFT_FIELDS = ("draft_tokens", "uniforms", "confidence", "draft_probs", "draft_noise", "parents")  # [B, N, ...]


@dataclass
class StateBuffers:
    """Static buffers of one state (B = bucket, W = verify width, N = W - 1 draft nodes: κ for a chain;
    V = vocabulary), allocated once.

    Inputs (filled by the runtime before each step):
        input_ids ``[B, W]`` int64 (pending token, then drafts), positions ``[B, W]`` int64 (a tree:
        root position + node depth), cache_slots ``[B, W]`` int64 (root position + node index),
        draft_tokens ``[B, N]`` int64 (-1: not proposed), num_valid ``[B]`` int64 (drafts verified per
        row, a prefix), num_tokens ``[B]`` int64 (verify tokens per row: num_valid + 1, 0 for rows
        without a live request), confidence ``[B, N]`` fp32 (the drafter's per-position estimate),
        draft_probs ``[B, N, V]`` fp32 (probabilistic drafts only; a tree: q per parent node),
        temperature ``[B]`` fp32, top_k ``[B]`` int64, top_p ``[B]`` fp32, uniforms ``[B, N]`` fp32,
        exp_noise ``[B, V]`` fp32, draft_noise ``[B, N, V]`` fp32 (probabilistic drafts only).
    Tree states only (None for chains): parents ``[B, N]`` int64 (parent node of node j + 1),
        node_depths ``[B, W]`` int64, tree_mask ``[B, W, W]`` bool (the tree-only verify mask,
        SGLang's ``QLEN_ONLY``), static_tree (a static tree's compiled buffers, constant).
    Set per step: ``batch`` (the BatchView), ``use_top_k``/``use_top_p`` (eager mode: skip the sort
        when no row filters), ``all_greedy`` (eager mode: every live row has temperature 0),
        ``ragged`` (eager mode: the target forward skips padding tokens), ``kernels`` (role →
        the artifact's kernel variant name).
    Outputs (written by the programs): logits ``[B, W, V]`` fp32, hidden (list of ``[B, W, H]``),
        result (``specc.kernels.VerifyOutput``), path (tree states, set by the KV-commit stage:
        the accepted path as chain-shaped rows for the drafter, ``(input_ids, positions,
        cache_slots, hidden)``).
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
    use_top_k: bool = True
    use_top_p: bool = True
    all_greedy: bool = False
    ragged: bool = False
    kernels: Mapping[str, str] = field(default_factory=dict)
    logits: Optional[torch.Tensor] = None
    hidden: List[torch.Tensor] = field(default_factory=list)
    result: Any = None
    path: Any = None

    @classmethod
    def allocate(cls, spec: StateSpec, ctx: StateContext, tree: Optional[Mapping[str, Any]] = None,
                 ) -> "StateBuffers":
        """Buffers of ``spec``; ``tree``: a static tree's compiled lists (``specc.trees.compile_tree``,
        the generated module's ``TREE``), compiled here from ``spec.tree_choices`` when None."""
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
                    from specc.trees import compile_tree

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

    def view(self, rows: Optional[int] = None, width: Optional[int] = None) -> "StateBuffers":
        """The first ``rows`` rows and ``width`` verify columns (``width - 1`` draft positions),
        sharing storage; outputs are reset. Eager mode only (a captured program keeps its shapes)."""
        kw: Dict[str, Any] = {}
        for name in _ROW_FIELDS:
            t = getattr(self, name)
            if t is None:
                continue
            if rows is not None:
                t = t[:rows]
            if width is not None and name in _WIDTH_FIELDS:
                t = t[:, :width]
            elif width is not None and name in _DRAFT_FIELDS:
                t = t[:, :width - 1]
            elif width is not None and name == "tree_mask":
                t = t[:, :width, :width]
            kw[name] = t
        return replace(self, logits=None, hidden=[], result=None, path=None, **kw)


Program = Callable[[StateContext, StateBuffers], Any]


def _commit_none(ctx: StateContext, bufs: StateBuffers) -> None:
    """A chain's KV is already in place by position (the default commit program)."""


@dataclass(frozen=True)
class StatePrograms:
    """The stage programs of a state (each ``fn(ctx, bufs)``): draft, verify, accept, extend and the
    KV commit between accept and extend (default: nothing to move, as for every chain, so modules
    generated before trees still build)."""

    draft: Program
    verify: Program
    accept: Program
    extend: Program
    commit: Program = _commit_none


class SpecRuntimeState:
    """One candidate state ready to run: spec, buffers, programs and (on CUDA) the captured graph.

    A step runs ``begin(rows)`` → ``draft()`` → [``trim(width)``] → ``verify_accept()`` (verify,
    accept, KV commit) → ``extend()``; the stages of one step work on ``self.cur``, the buffers
    (eager: a view of them) of that step.

    Args:
        spec: the state's constants. ctx: shared context. programs: its stage programs.
        kernels: role → the artifact's specialized kernel variant (``KERNELS`` of the generated module).
        tree: a static tree's compiled buffers (the generated module's ``TREE``); compiled from
            ``spec.tree_choices`` when None.
    Raises:
        ArtifactError: the state uses something this runtime does not implement.
    """

    def __init__(self, spec: StateSpec, ctx: StateContext, programs: StatePrograms,
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
        self.bufs = StateBuffers.allocate(spec, ctx, tree)
        self.bufs.kernels = dict(kernels or {})
        self._graph = None
        self.capture_s = 0.0  # seconds its CUDA-graph capture took at load (0 when not captured)
        self.cur = self.bufs

    # ------------------------------------------------------------------ stages
    def begin(self, rows: int) -> StateBuffers:
        """Start a step over rows ``0..rows-1`` (eager: a view of those rows; captured: all B)."""
        self.cur = self.bufs if self._graph is not None or rows >= self.spec.batch_size else self.bufs.view(rows)
        self.cur.ragged = self._graph is None
        return self.cur

    def draft(self) -> None:
        """Run the draft program (fills draft_tokens, num_valid, confidence, draft_probs). Eager
        always: the n-gram lookup is host work; model drafters are cheap to launch relative to verify."""
        self.programs.draft(self.ctx, self.cur)

    def trim(self, width: int) -> int:
        """Eager mode only: verify just the first ``width`` columns of every row this step (``width``
        = the most drafts any row verifies + 1; rows past a request's valid drafts are never
        accepted, and the ragged forward already skips each row's padding). Captured states keep
        their static width. Returns the width used."""
        width = max(1, min(int(width), self.spec.width))
        if self._graph is not None or width == self.cur.input_ids.shape[1]:
            return self.cur.input_ids.shape[1]
        batch, ragged = self.cur.batch, self.cur.ragged
        self.cur = self.cur.view(width=width)
        self.cur.batch, self.cur.ragged = batch, ragged
        return width

    def verify_accept(self) -> Any:
        """Target forward over ``[B, W]``, the verify rule, then the KV commit; returns the VerifyOutput."""
        if self._graph is not None:
            self._graph.replay()
            return self.bufs.result
        self.programs.verify(self.ctx, self.cur)
        self.programs.accept(self.ctx, self.cur)
        self.programs.commit(self.ctx, self.cur)
        return self.cur.result

    def extend(self) -> None:
        """Run the extend program (the drafter's commit over the accepted tokens)."""
        self.programs.extend(self.ctx, self.cur)
        self.cur = self.bufs

    @property
    def captured(self) -> bool:
        return self._graph is not None

    # ------------------------------------------------------------------ CUDA graphs
    def capture(self) -> bool:
        """Capture verify + accept + commit as one CUDA graph (CUDA only; returns whether it captured).

        Warm-up runs on a side stream first (PyTorch's documented recipe), with every row pointing
        its KV writes at the trash slot so capture leaves the caches' real entries untouched.
        """
        if not (self.ctx.use_cuda_graphs and self.ctx.device.type == "cuda" and torch.cuda.is_available()):
            return False
        import time

        t0 = time.perf_counter()
        b = self.bufs
        b.cache_slots.fill_(self.ctx.trash_slot)
        b.positions.copy_(torch.arange(self.spec.width, device=b.positions.device).expand_as(b.positions))
        b.use_top_k = b.use_top_p = True  # graphs take the general path (no host-side branching)
        b.all_greedy = b.ragged = False
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.programs.verify(self.ctx, b)
                self.programs.accept(self.ctx, b)
                self.programs.commit(self.ctx, b)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.programs.verify(self.ctx, b)
            self.programs.accept(self.ctx, b)
            self.programs.commit(self.ctx, b)
        torch.cuda.synchronize(self.ctx.device)
        self._graph = graph
        self.capture_s = time.perf_counter() - t0
        return True


def select_programs(spec: StateSpec, synthetic_rates: Optional[Sequence[float]] = None) -> StatePrograms:
    """The stage programs of a state, from the one table (:func:`specc.programs.state_programs`) —
    the same calls a generated module renders. Raises ArtifactError for a state this runtime cannot
    run."""
    from specc import programs
    from specc.runtime import stages

    try:
        table = programs.state_programs(spec, synthetic_rates)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None
    calls = {stage: _bind(getattr(stages, call.fn), call.args) for stage, call in table.items()}
    return StatePrograms(**calls)


def _bind(fn: Callable, args: Tuple[Any, ...]) -> Program:
    def program(ctx, bufs):
        return fn(ctx, bufs, *args)
    return program


def build_state(spec: StateSpec, ctx: StateContext, synthetic_rates: Optional[Sequence[float]] = None,
                kernels: Optional[Mapping[str, str]] = None, tree: Optional[Mapping[str, Any]] = None,
                ) -> SpecRuntimeState:
    """Build a runtime state: its programs from the one table (:func:`select_programs`), its kernel
    variants (role → an artifact kernel module's name; none: the generic kernels) and its static tree
    (the manifest's compiled entry; compiled from ``spec.tree_choices`` by the same function codegen
    uses when None). Raises ArtifactError for a state this runtime cannot run."""
    spec.check_supported()
    return SpecRuntimeState(spec, ctx, select_programs(spec, synthetic_rates), kernels=kernels, tree=tree)
