"""The method registry: every fact about a draft method that the rest of specc asks, one row each.

One :class:`Method` row per ``method.name``. Lowering, stage graphs, the cost model, the engine
profiles' rules (``specc``, ``sglang``, ``vllm``), the exporters, the training tool's drafter kinds,
codegen and the runtime's drafter construction read the row's facts instead of comparing method
names, so a new method is one package: ``specc/methods/<name>/`` holding its row (``__init__``),
its drafter, its model and loader and its training recipe (SGLang keeps the same facts on its
``SpeculativeAlgorithm`` enum: ``has_draft_kv``, ``carries_draft_hidden_states``, ``create_worker``;
``sglang/srt/speculative/spec_info.py:174-178``). Where an engine's own code branches on its
algorithm or method string, the rules compare that engine's name, read from the row
(``sglang_algorithm``, ``vllm_method``), never ``method.name``.

Rows register through the ``specc.methods`` entry-point group (``name = "module:attr"`` naming a
row); the built-ins are declared in ``pyproject.toml`` the same way (each row in its own package,
``specc.methods.ngram:NGRAM``...), and :data:`BUILTIN_REFS` keeps them available when the installed
metadata is stale. The row types are :mod:`specc.methods.facts`. :data:`METHODS` reads the entry points on first use.

Torch-free and import-free (only :mod:`specc.errors`; a plugin row's module is imported when the
registry is first read): ``specc check`` and ``specc explain`` read it.
"""
from __future__ import annotations

import importlib
import warnings
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, List, Optional, Tuple

from specc.errors import PlanError

from specc.methods.facts import (BLOCK_RUNTIME, CHAIN_RUNTIME, DRAFT_SHAPES, HIDDEN_KINDS,  # noqa: F401
                                 PARALLEL_CAPABLE_RUNTIME, SCHEDULES, SEED_KINDS, TREE_RUNTIME,
                                 VERIFY_RULES, Method, RuntimeSupport)

#: The built-in rows, in table order (the registry lists them first): ``module:attr`` of each, the
#: same references pyproject.toml declares under ``[project.entry-points."specc.methods"]``; read
#: here too so that stale package metadata (an editable install not re-run) loses none of them.
BUILTIN_REFS: Tuple[str, ...] = ("specc.methods.none:NONE", "specc.methods.ngram:NGRAM", "specc.methods.suffix:SUFFIX", "specc.methods.draft_model:DRAFT_MODEL", "specc.methods.eagle:EAGLE", "specc.methods.eagle:EAGLE3", "specc.methods.mtp:MTP", "specc.methods.multi_layer_eagle:MULTI_LAYER_EAGLE", "specc.methods.frozen_kv_mtp:FROZEN_KV_MTP", "specc.methods.medusa:MEDUSA", "specc.methods.dflash:DFLASH", "specc.methods.dflash:DSPARK", "specc.methods.custom:CUSTOM")


def builtin() -> Tuple[Method, ...]:
    """The built-in rows, imported from their packages on first use (each package's
    ``__init__`` is torch-free)."""
    out = []
    for ref in BUILTIN_REFS:
        mod, _, attr = ref.partition(":")
        out.append(getattr(importlib.import_module(mod), attr))
    return tuple(out)


def __getattr__(name: str) -> Any:
    # BUILTIN and the rows by their constant names (methods.EAGLE, ...), resolved on first use
    if name == "BUILTIN":
        return builtin()
    for ref in BUILTIN_REFS:
        if ref.endswith(":" + name):
            mod, _, attr = ref.partition(":")
            return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



#: Entry-point group through which a method registers: ``name = "module:attr"`` naming a
#: :class:`Method` row whose ``name`` is the entry point's name (the built-ins declare theirs in
#: pyproject.toml the same way).
METHOD_ENTRY_POINT_GROUP = "specc.methods"


class MethodRegistry(MutableMapping):
    """``method.name`` -> :class:`Method`: the built-in rows, then every row of the ``specc.methods``
    entry points (sorted by name), read on first use (nothing reads package metadata at import).

    The built-in rows come from :data:`BUILTIN` whatever the installed metadata says, so stale
    metadata (an editable install from before the entry-point table) loses nothing. An entry point
    that cannot be loaded, names no :class:`Method`, has a row named differently, or takes a
    built-in's name with another row is skipped with a warning, and :func:`get` lists it when its
    name is asked for. Mutable so a test can add a row (``monkeypatch.setitem``); :meth:`reload`
    reads the entry points again (after ``sys.path`` changes).
    """

    def __init__(self) -> None:
        self._rows: Optional[Dict[str, Method]] = None
        self.problems: Dict[str, str] = {}

    def _table(self) -> Dict[str, Method]:
        if self._rows is None:
            self._rows, self.problems = _discover()
            for name, why in self.problems.items():
                warnings.warn(f"{METHOD_ENTRY_POINT_GROUP} entry point {name!r} skipped: {why}", stacklevel=3)
        return self._rows

    def reload(self) -> None:
        """Forget the table; the next lookup reads the entry points again."""
        self._rows = None
        self.problems = {}

    def __getitem__(self, name: str) -> Method:
        return self._table()[name]

    def __setitem__(self, name: str, row: Method) -> None:
        if not isinstance(row, Method) or row.name != name:
            raise PlanError(f"method registry: {name!r} must map to a Method row named {name!r}")
        self._table()[name] = row

    def __delitem__(self, name: str) -> None:
        del self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __repr__(self) -> str:
        return f"MethodRegistry({list(self._table())})"


def _discover() -> Tuple[Dict[str, Method], Dict[str, str]]:
    """The rows of :data:`BUILTIN` and of the ``specc.methods`` entry points, and why each skipped
    entry point was skipped (by entry-point name)."""
    from importlib.metadata import entry_points

    rows: Dict[str, Method] = {m.name: m for m in builtin()}
    problems: Dict[str, str] = {}
    try:
        eps = list(entry_points(group=METHOD_ENTRY_POINT_GROUP))
    except Exception as exc:  # unreadable metadata of some installed distribution
        return rows, {"*": f"the entry points cannot be read ({type(exc).__name__}: {exc})"}
    extra: Dict[str, Method] = {}
    for ep in sorted(eps, key=lambda e: e.name):
        try:
            row = ep.load()
        except Exception as exc:  # an import error inside the plugin, or a missing attribute
            problems[ep.name] = f"{ep.value!r} cannot be loaded ({type(exc).__name__}: {exc})"
            continue
        if ep.name in rows:
            if row != rows[ep.name]:
                problems[ep.name] = f"{ep.value!r} takes the built-in method name {ep.name!r} (reserved)"
        elif not isinstance(row, Method):
            problems[ep.name] = f"{ep.value!r} is a {type(row).__name__}, not a specc.methods.Method row"
        elif row.name != ep.name:
            problems[ep.name] = f"{ep.value!r} is the row of method {row.name!r}; name the entry point {row.name!r}"
        elif ep.name in extra and extra[ep.name] != row:
            problems[ep.name] = f"{ep.value!r}: two distributions register method {ep.name!r}"
        else:
            extra[ep.name] = row
    rows.update(extra)
    return rows, problems


METHODS = MethodRegistry()


def get(name: str) -> Method:
    """The row of ``method.name`` ``name``.

    Raises:
        PlanError: no such method, naming the known methods (and why an entry point of that name was
            skipped, if one was).
    """
    try:
        return METHODS[name]
    except KeyError:
        pass
    why = METHODS.problems.get(name)
    hint = (f" (its {METHOD_ENTRY_POINT_GROUP!r} entry point was skipped: {why})" if why else
            f"; a third-party method registers a Method row through the {METHOD_ENTRY_POINT_GROUP!r} entry-point group")
    raise PlanError(f"method.name: unknown method {name!r}; known: {', '.join(METHODS)}{hint}") from None


def method_names() -> Tuple[str, ...]:
    """Every registered method name: the built-ins in table order, then registered ones by name."""
    return tuple(METHODS)


def for_engine_name(engine: str, engine_name: str) -> Tuple[str, ...]:
    """The methods ``engine`` (``sglang`` / ``vllm``) runs under ``engine_name`` (its algorithm or
    method value), in registry order: the inverse of :attr:`Method.engine_names`."""
    return tuple(n for n, m in METHODS.items() if m.engine_names.get(engine) == engine_name)


def runtime_methods() -> Tuple[str, ...]:
    """Names of the methods specc's runtime runs, in table order."""
    return tuple(n for n, m in METHODS.items() if m.runtime is not None)


def is_parallel(name: str, parallel_drafting: bool) -> bool:
    """True when one draft pass emits the whole block: always for DFlash, DSpark and Medusa; for
    parallel-capable methods when ``method.parallel_drafting`` is set (PARD, P-EAGLE)."""
    m = get(name)
    return m.always_parallel or (bool(parallel_drafting) and m.parallel_capable)


def state_kind(num_steps: int, topk: int, parallel: bool, tree_choices: Any) -> str:
    """``plain`` (κ = 0), ``tree`` (topk > 1 or a static tree), ``parallel`` or ``chain``."""
    if num_steps == 0:
        return "plain"
    if tree_choices is not None or topk > 1:
        return "tree"
    return "parallel" if parallel else "chain"


def proposal_passes(name: str, num_steps: int, topk: int = 1, parallel: bool = False,
                    tree_choices: Any = None) -> int:
    """Draft forward passes of the draft stage in one step (each pass costs c target-steps),
    counted at a common iteration boundary (the extend pass is :func:`extend_passes`):

    * lookups, plain decoding: 0; block drafters (DFlash, DSpark) and Medusa's heads: 1;
    * a chain or tree (one pass per level, SGLang sglang/srt/speculative/eagle_worker_v2.py:742-919; a static
    tree is κ levels deep): κ,
      or κ − 1 when the extend pass drafts the first token (``draft_from_extend``: EAGLE, EAGLE-3,
      MTP, multi-layer EAGLE);
    * a parallel block (PARD, P-EAGLE): 1, or none for P-EAGLE at κ = 1 (draft 1 comes from the extend).
    """
    m = get(name)
    if num_steps == 0 or not m.drafts or m.lookup:
        return 0
    if m.draft_shape in ("block", "heads"):
        return 1
    if parallel:
        return 1 if (num_steps > 1 or not m.draft_from_extend) else 0
    return int(num_steps) - (1 if m.draft_from_extend else 0)


def extend_passes(name: str) -> int:
    """Draft-extend passes per step: 1 when the method's extend stage runs a draft forward over the
    accepted tokens (``Method.extend_forward``; at κ = 0 too, as SGLang runs draft-extend at steps = 0,
    sglang/srt/speculative/eagle_worker_v2.py:1490-1494), else 0 (frozen-KV MTP: "no forward"; the draft model's
    catch-up is its next
    first proposal pass)."""
    return 1 if get(name).extend_forward else 0


def build_drafter(name: str, spec: Dict[str, Any], target: Any, tokenizer: Any, device: Any,
                  max_seq_len: Optional[int]) -> Any:
    """The runtime drafter of method ``name`` (None for plain decoding), through the factory the
    method's :class:`RuntimeSupport` names.

    Args:
        spec: the artifact's runtime section (``manifest.json`` ``"runtime"``: ``draft``, ``method``).
        target, tokenizer: the loaded target model and its tokenizer. device: torch device.
        max_seq_len: the runtime's cache length per row.
    Raises:
        PlanError: a method specc's runtime does not run. Factories raise PlanError / CheckpointError.
    """
    m = get(name)
    if m.runtime is None:
        raise PlanError(f"method.name={name!r} is not run by the specc runtime (it runs "
                        f"{', '.join(runtime_methods())}); export the plan to an engine that supports it "
                        f"(`specc export`)")
    if not m.runtime.drafter:
        return None
    factory = resolve_factory(m.runtime.drafter)
    return factory(spec, target, tokenizer, device, max_seq_len)


def resolve_factory(ref: str) -> Callable[..., Any]:
    """Import ``"module:function"``. Raises PlanError when the module or attribute is missing."""
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise PlanError(f"drafter factory {ref!r} cannot be imported ({exc})") from None


# ------------------------------------------------------------------------------------ drafter plugins
#: The drafter protocol the runtime calls (``specc/methods/base.py``): methods with the number of
#: positional arguments each is called with (``self`` excluded), and attributes with their types.
#: A plugin class must answer all of it; :func:`check_drafter_protocol` says what it lacks (SGLang
#: refuses a plugin missing its duck-typed methods at registration, spec_registry.py:199-231, N8).
DRAFTER_METHODS: Dict[str, Tuple[int, str]] = {
    "from_spec": (5, "from_spec(spec, target, tokenizer, device, max_seq_len) (a classmethod building the drafter)"),
    "setup": (3, "setup(max_batch_size, max_seq_len, device)"),
    "prefill": (2, "prefill(batch, chunk)"),
    "propose": (3, "propose(batch, num_steps, sampling)"),
    "commit": (2, "commit(batch, step)"),
}
DRAFTER_ATTRIBUTES: Dict[str, type] = {"name": str, "hidden_layers": tuple, "supports_probabilistic": bool,
                                       "capturable": bool, "prefill_row_index": bool}
#: entry-point group of drafter plugin classes (``method.plugin: NAME``); method rows register in
#: :data:`METHOD_ENTRY_POINT_GROUP`
ENTRY_POINT_GROUP = "specc.drafters"
_PLUGINS: Dict[str, Any] = {}


def reserved_names() -> Tuple[str, ...]:
    """Names a plugin may not take: the builtin methods (SGLang N6, spec_registry.py:246-250)."""
    return tuple(METHODS)


def _arity_problem(fn: Any, n: int, skip: int = 0) -> Optional[str]:
    """Why ``fn`` cannot be called with ``n`` positional arguments after its first ``skip`` ones
    (``self`` of a plain function on a class), or None when it can."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins without a signature: trust them
    params = list(sig.parameters.values())
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][skip:]
    required = [p for p in pos if p.default is p.empty]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None if len(required) <= n else f"needs {len(required)} positional arguments"
    if len(required) > n or len(pos) < n:
        if len(required) != len(pos):
            return f"takes {len(required)} to {len(pos)} positional arguments"
        return f"takes {len(pos)} positional argument{'s' if len(pos) != 1 else ''}"
    return None


def check_drafter_protocol(obj: Any) -> List[str]:
    """What a drafter class (or instance) lacks of the protocol the runtime calls: each missing or
    wrongly shaped method (:data:`DRAFTER_METHODS`, arity checked on the bound method) and each
    missing or mistyped attribute (:data:`DRAFTER_ATTRIBUTES`). Empty when it answers all of it."""
    import inspect

    problems: List[str] = []
    for name, (n, shape) in DRAFTER_METHODS.items():
        fn = getattr(obj, name, None)
        if fn is None or not callable(fn):
            problems.append(f"method {shape} is missing")
            continue
        unbound = isinstance(obj, type) and inspect.isfunction(fn) and not isinstance(
            inspect.getattr_static(obj, name, None), staticmethod)
        why = _arity_problem(fn, n, skip=1 if unbound else 0)  # a plain function on the class: skip self
        if why:
            problems.append(f"method {shape} {why}")
        if getattr(fn, "__isabstractmethod__", False):
            problems.append(f"method {shape} is abstract (not implemented)")
    for name, typ in DRAFTER_ATTRIBUTES.items():
        if not hasattr(obj, name):
            problems.append(f"attribute {name} ({typ.__name__}) is missing")
            continue
        value = getattr(obj, name)
        if isinstance(value, property) or callable(value) and not isinstance(value, (str, tuple, bool)):
            continue  # a property on the class: checked on the instance
        if typ is tuple and isinstance(value, list):
            continue
        if not isinstance(value, typ):
            problems.append(f"attribute {name} must be a {typ.__name__}, got {type(value).__name__}")
    return problems


def register_plugin(name: str, cls: Any) -> Any:
    """Register a drafter plugin class under ``name`` (then ``method.plugin: NAME`` finds it).

    Raises:
        PlanError: ``name`` is a builtin method name (reserved), already registered to another class,
            or the class misses part of the drafter protocol (listing every missing piece).
    """
    if name in reserved_names():
        raise PlanError(f"drafter plugin name {name!r} is reserved for the builtin method; pick another name")
    if name in _PLUGINS and _PLUGINS[name] is not cls:
        raise PlanError(f"drafter plugin {name!r} is already registered ({_qualname(_PLUGINS[name])})")
    _check_plugin_class(cls, name)
    _PLUGINS[name] = cls
    return cls


def _qualname(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', cls)}"


def _check_plugin_class(cls: Any, ref: str) -> None:
    if not isinstance(cls, type):
        raise PlanError(f"method.plugin {ref!r} names {type(cls).__name__} {cls!r}, not a class")
    missing = check_drafter_protocol(cls)
    if missing:
        raise PlanError(f"method.plugin {ref!r} ({_qualname(cls)}) does not implement the drafter protocol "
                        f"(specc/methods/base.py): " + "; ".join(missing))
    plugin_name = getattr(cls, "name", None)
    if plugin_name in reserved_names():
        raise PlanError(f"method.plugin {ref!r} ({_qualname(cls)}) calls itself {plugin_name!r}, a builtin method's "
                        f"name; builtin names are reserved (set the class attribute name to your own)")


def resolve_plugin(ref: str) -> Any:
    """The drafter class ``method.plugin`` names, checked against the protocol.

    ``ref`` is ``package.module:Class``, ``package.module.Class`` (vLLM's ``custom_class`` style), a
    name registered with :func:`register_plugin`, or the name of a Python entry point in the
    ``specc.drafters`` group.

    Raises:
        PlanError: an empty or reserved name, an import that fails, no such entry point, or a class
            missing part of the protocol.
    """
    ref = (ref or "").strip()
    if not ref:
        raise PlanError("method.name=custom needs method.plugin: 'package.module:Class' or the name of a "
                        f"'{ENTRY_POINT_GROUP}' entry point")
    if ref in reserved_names():
        raise PlanError(f"method.plugin {ref!r} is a builtin method's name (reserved); use method.name={ref}")
    if ":" in ref or "." in ref:
        module, _, attr = ref.partition(":") if ":" in ref else ref.rpartition(".")
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except Exception as exc:  # an import error inside the plugin, or a missing attribute
            raise PlanError(f"method.plugin {ref!r} cannot be imported ({type(exc).__name__}: {exc}); check the "
                            f"module is installed and the class name") from None
        _check_plugin_class(obj, ref)
        return obj
    if ref in _PLUGINS:
        return _PLUGINS[ref]
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ref]
    if not found:
        known = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} | set(_PLUGINS))
        raise PlanError(f"method.plugin {ref!r}: no drafter plugin of that name (registered or entry points in "
                        f"group {ENTRY_POINT_GROUP!r}: {', '.join(known) or 'none'}); or give package.module:Class")
    try:
        cls = found[0].load()
    except Exception as exc:
        raise PlanError(f"method.plugin {ref!r}: entry point {found[0].value!r} cannot be loaded "
                        f"({type(exc).__name__}: {exc})") from None
    _check_plugin_class(cls, ref)
    return cls


def build_plugin_drafter(spec: Dict[str, Any], target: Any, tokenizer: Any, device: Any,
                         max_seq_len: Optional[int]) -> Any:
    """Runtime factory of ``method.name: custom``: resolves ``spec["method"]["plugin"]``
    (:func:`resolve_plugin`) and builds the drafter with ``Class.from_spec(spec, target, tokenizer,
    device, max_seq_len)``, then checks the instance answers the protocol too.

    Raises:
        PlanError: see :func:`resolve_plugin`, or an instance missing part of the protocol.
    """
    ref = (spec.get("method") or {}).get("plugin") or ""
    cls = resolve_plugin(ref)
    drafter = cls.from_spec(spec, target, tokenizer, device, max_seq_len)
    missing = [p for p in check_drafter_protocol(drafter) if not p.startswith("method from_spec")]
    if missing:
        raise PlanError(f"method.plugin {ref!r}: the drafter {_qualname(cls)}.from_spec built does not implement the "
                        f"drafter protocol: " + "; ".join(missing))
    return drafter
