"""Compose a plan from YAML with Hydra's compose API and type it against the schema.

``load_plan(source, overrides)`` is the only way a plan enters specc. ``source`` is a YAML file
anywhere on disk or the name of a preset in ``conf/plan/``. The file may have a ``defaults:`` list
naming options of the config groups in ``conf/`` (``target/``, ``draft/``, ``method/``, ``verify/``,
``schedule/``, ``deploy/``, ``runtime/``) or of groups next to the file. Overrides are Hydra-style:
``group=option`` (and ``+group=option``, ``~group``) select config-group options; ``key=value``
(dotted plan keys, e.g. ``method.num_steps=5``) set one value after composition.

Composition follows Hydra's structured-config practice (hydra.cc/docs/tutorials/structured_config,
"Config Store" and "Schema" pages): the schema dataclasses are registered in the ConfigStore
(``plan_schema``; a plan may name it first in ``defaults``), the compose API is used as a context
manager with ``version_base="1.3"``, and the composed tree is merged onto the schema so every
default is filled in. Line numbers for messages come from re-reading each composed file with
PyYAML's node API, in Hydra's merge order.

Input is bounded before Hydra sees it (:func:`specc.io.compose_yaml_bounded`): nesting depth, nodes
after alias expansion and the length of every value, in the plan, every config-group file it
composes and every override. Composition is confined to the config search path (``conf/`` and the
plan's folder): a ``defaults`` entry or ``group=option`` override whose group or option climbs out
(``..``, an absolute path, a link leading elsewhere) is refused, and so is a ``hydra:`` section
(which could extend the search path). Interpolations may refer to other plan keys
(``${method.num_steps}``); resolver calls (``${oc.env:HOME}``, ``${oc.decode:...}``, Hydra's
``${now:...}``) are refused, because they read the environment, files or the clock while the plan
composes: the allow-list :data:`ALLOWED_RESOLVERS` is empty.

Nothing here imports torch. Every user mistake raises :class:`specc.errors.PlanError` listing all
problems found at once, each as ``file:line: key: what is wrong; the fix``.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import shlex
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from specc.errors import PlanError
from specc.io import (PLAN_LIMIT, YAML_MAX_DEPTH, YAML_MAX_SCALAR, compose_yaml_bounded, path_problem,
                      read_bounded)
from specc.plan import schema as S

#: (file, line) where a dotted plan key was written; line 0 means "not a file" (a command-line override).
Source = Tuple[str, int]

YAML_SUFFIXES = (".yaml", ".yml")
OVERRIDE_FILE = "<override>"
#: OmegaConf / Hydra resolvers a plan or recipe may call: none (see the module docstring).
ALLOWED_RESOLVERS: Tuple[str, ...] = ()
#: What a plan name may consist of: POSIX's portable filename character set (letters, digits, ``.``,
#: ``_``, ``-``; IEEE Std 1003.1, Base Definitions 3.282), not starting with ``.`` or ``-``.
_PORTABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
#: Group and option names in a defaults list or override: path components of the same set.
_CONFIG_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
#: Plan keys that name files (their text must be a path this machine accepts); list entries of
#: ``method.suffix.corpora`` and the paths of ``deploy.lora.adapters`` (``name=path``) too.
PATH_KEYS = ("target.path", "draft.path", "schedule.cost_table", "schedule.acceptance")
#: Record keys whose relative paths, written in a plan file, resolve against that file's folder
#: (``specc tune`` writes ``S.yaml`` beside ``S.acceptance.json`` and ``S.cost_table.json``).
RECORD_KEYS = ("schedule.cost_table", "schedule.acceptance")


def conf_dir() -> Path:
    """The directory holding the config groups and presets: ``$SPECC_CONF_DIR`` if set, else the
    repository's ``conf/`` next to the ``specc`` package."""
    env = os.environ.get("SPECC_CONF_DIR")
    if env:
        return Path(env).resolve()
    return (Path(__file__).resolve().parent.parent.parent / "conf").resolve()


def list_presets() -> List[str]:
    """Names of the plan presets (``conf/plan/<name>.yaml``), sorted."""
    d = conf_dir() / "plan"
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


@dataclass
class LoadedPlan:
    """A composed, typed plan and where each of its keys was written.

    ``sources`` maps dotted keys (``method.num_steps``; bucket entries ``schedule.buckets.8``) to
    ``(file, line)`` of the last file or override that set them; keys that kept their schema default
    are absent. ``overrides`` are the override strings applied, in order.
    """

    plan: S.Plan
    path: Path
    sources: Dict[str, Source] = field(default_factory=dict)
    overrides: Tuple[str, ...] = ()

    def where(self, key: str) -> Optional[Source]:
        """``(file, line)`` for ``key`` or its closest written ancestor (``method.ngram.min`` falls
        back to ``method.ngram``, then ``method``); None if neither was written."""
        parts = key.split(".")
        while parts:
            src = self.sources.get(".".join(parts))
            if src is not None:
                return src
            parts.pop()
        return None


# --------------------------------------------------------------------------------------------
# Locating the source


def locate(source: str) -> Path:
    """Map ``source`` (a YAML path or a preset name) to an existing file.

    Raises PlanError for a missing file or an unknown preset (with close matches)."""
    src = str(source)
    p = Path(src).expanduser()
    looks_like_path = src.endswith(YAML_SUFFIXES) or os.sep in src or "/" in src
    if p.is_file():
        return p.resolve()
    if looks_like_path or p.exists():
        if p.is_dir():
            raise PlanError(f"{src}: is a directory; pass a plan file (.yaml) or use "
                            f"`specc check {shlex.quote(src)}`")
        if p.exists():  # a FIFO, device or socket: refused by the bounded read, with its kind
            _read_text(p)
        raise PlanError(f"{src}: no such plan file")
    preset = conf_dir() / "plan" / f"{src}.yaml"
    if preset.is_file():
        return preset
    names = list_presets()
    close = difflib.get_close_matches(src, names, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise PlanError(f"unknown preset {src!r}{hint} (presets: {', '.join(names) or 'none'}; "
                    f"or pass a path to a .yaml file)")


# --------------------------------------------------------------------------------------------
# YAML with line numbers


def _read_text(path: Path) -> str:
    """The text of a plan or config-group file: a regular file of at most
    :data:`specc.io.PLAN_LIMIT` bytes (:func:`specc.io.read_bounded`). Raises PlanError."""
    return str(read_bounded(path, PLAN_LIMIT, "plan file", error=PlanError))


def _read_yaml_nodes(path: Path):
    """Parse ``path`` into a PyYAML node tree, read with :func:`_read_text` and with aliases
    expanding to at most :data:`specc.io.YAML_MAX_NODES` nodes. Raises PlanError naming the file
    and line of a syntax error, or the limit exceeded."""
    text = _read_text(path)
    try:
        return compose_yaml_bounded(text, _display(path), error=PlanError), text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{_display(path)}:{mark.line + 1}:{mark.column + 1}" if mark else _display(path)
        problem = getattr(exc, "problem", None) or str(exc)
        ctx = getattr(exc, "context", None)
        raise PlanError(f"{where}: invalid YAML: {problem}" + (f" ({ctx})" if ctx else "")) from None


def _package_header(text: str) -> Optional[str]:
    """The ``# @package <pkg>`` header directive of a Hydra config file, if any."""
    for line in text.splitlines()[:5]:
        s = line.strip()
        if s.startswith("# @package"):
            return s[len("# @package"):].strip()
    return None


def _record_lines(node, prefix: str, file: str, out: Dict[str, Source]) -> None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = str(k.value)
            if not prefix and key in ("defaults", "hydra"):
                continue
            dotted = f"{prefix}.{key}" if prefix else key
            out[dotted] = (file, k.start_mark.line + 1)
            _record_lines(v, dotted, file, out)


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


# --------------------------------------------------------------------------------------------
# Overrides


def _parse_overrides(overrides: Sequence[str], groups: set) -> Tuple[List[str], list]:
    """Split overrides into Hydra group selections and plan key assignments."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    group_ovs: List[str] = []
    key_ovs = []
    for text in overrides:
        _check_override_bounds(text)
        try:
            (ov,) = parser.parse_overrides([text])
        except (HydraException, ValueError) as exc:
            msg = str(exc).splitlines()[0]
            raise PlanError(f"override {text!r}: cannot parse ({msg}); write group=option or key=value") from None
        key = ov.key_or_group
        if not key.strip(".+~") or key.startswith(".") or key.endswith(".") or ".." in key:
            what = "no key before" if not key.strip(".+~") else "bad key before"
            raise PlanError(f"override {text!r}: malformed override: {what} "
                            f"'='; write key=value (e.g. method.num_steps=3) or group=option (e.g. method=eagle3)")
        if key in groups and "." not in key and "@" not in text.split("=")[0]:
            group_ovs.append(text)
        elif ov.is_delete() or (ov.is_add() and key in groups):
            group_ovs.append(text)
        else:
            try:
                value = ov.value()
            except Exception as exc:  # noqa: BLE001 - parser errors are user input
                raise PlanError(f"override {text!r}: bad value ({exc})") from None
            if ov.is_sweep_override():
                raise PlanError(f"override {text!r}: sweeps are not plans; give one value")
            key_ovs.append((text, key.lstrip("+"), _plain(value)))
    return group_ovs, key_ovs


def _check_override_bounds(text: str) -> None:
    """Refuse an override the Hydra parser (recursive) or OmegaConf should not see: a value longer
    than :data:`specc.io.YAML_MAX_SCALAR` characters, a dotted key or bracketed value nesting more than
    :data:`specc.io.YAML_MAX_DEPTH` levels, or a resolver call (:func:`refuse_resolvers`). Raises
    PlanError naming the override."""
    shown = text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"
    key, _, value = text.partition("=")
    if len(value) > YAML_MAX_SCALAR or len(key) > YAML_MAX_SCALAR:
        raise PlanError(f"override {shown!r}: {max(len(key), len(value)):,} characters, over the "
                        f"{YAML_MAX_SCALAR:,} a plan value may have (PATH_MAX); shorten it")
    if key.count(".") + 1 > YAML_MAX_DEPTH:
        raise PlanError(f"override {shown!r}: the key nests {key.count('.') + 1} levels, more than the "
                        f"{YAML_MAX_DEPTH} a plan may nest; no plan key is that deep")
    depth = deepest = 0
    for ch in value:
        if ch in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]})":
            depth -= 1
    if deepest > YAML_MAX_DEPTH:
        raise PlanError(f"override {shown!r}: the value nests {deepest} brackets deep, more than the "
                        f"{YAML_MAX_DEPTH} levels a plan may nest; flatten it")
    bad = resolver_calls(value)
    if bad:
        raise PlanError(f"override {shown!r}: {_resolver_message(bad)}")


def resolver_calls(text: str) -> List[str]:
    """Names of the OmegaConf resolvers ``text`` calls (``${oc.env:HOME}`` -> ``["oc.env"]``) that
    :data:`ALLOWED_RESOLVERS` does not list, found with OmegaConf's own grammar; an interpolation too
    deep or malformed to parse counts as ``"?"`` (OmegaConf would fail on it anyway)."""
    if "${" not in text:
        return []
    import antlr4
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as G

    try:
        tree = grammar_parser.parse(text)
    except (GrammarParseError, RecursionError):
        return ["?"]
    names: List[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, G.InterpolationResolverContext):
            names.append(node.resolverName().getText())
        stack.extend(c for c in (node.getChild(i) for i in range(node.getChildCount()))
                     if isinstance(c, antlr4.ParserRuleContext))
    return [n for n in names if n not in ALLOWED_RESOLVERS]


def _resolver_message(names: Sequence[str]) -> str:
    if names == ["?"]:
        return "an interpolation that cannot be parsed (or nests too deeply); write the value itself"
    return (f"calls the resolver{'s' if len(names) > 1 else ''} {', '.join(sorted(set(names)))}; plans and "
            f"recipes may not call resolvers (they read the environment, files or the clock while the config "
            f"composes); write the value itself (references to other keys, ${{method.num_steps}}, are allowed)")


def refuse_resolvers(node, where: str, error=PlanError) -> None:
    """Raise ``error`` at the first scalar of the PyYAML node graph ``node`` (keys included) that
    calls a resolver (:func:`resolver_calls`), naming ``where``, its line and the resolver."""
    seen: set = set()
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.ScalarNode):
            bad = resolver_calls(str(n.value))
            if bad:
                raise error(f"{where}:{n.start_mark.line + 1}: {str(n.value)[:80]!r} {_resolver_message(bad)}")
        elif isinstance(n, yaml.MappingNode):
            stack.extend(x for kv in n.value for x in kv)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def _plain(value):
    """Hydra parser values -> plain Python (lists/dicts of scalars)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _groups(dirs: Sequence[Path]) -> set:
    """Config-group names under ``dirs``: top-level folders (``deploy``) and their sub-groups
    (``deploy/parallel``), which a ``group=option`` override may select."""
    out = set()
    for d in dirs:
        if d.is_dir():
            for p in d.iterdir():
                if p.is_dir() and not p.name.startswith((".", "_")):
                    out.add(p.name)
                    out.update(f"{p.name}/{q.name}" for q in p.iterdir()
                               if q.is_dir() and not q.name.startswith((".", "_")))
    return out


# --------------------------------------------------------------------------------------------
# Schema walking: unknown keys, choices and ranges


def _field_types(cls) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _strip_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _unknown_keys(data: Any, cls, prefix: str, out: List[Tuple[str, str]]) -> None:
    """Collect (dotted_key, message) for keys of ``data`` that the schema class ``cls`` lacks."""
    if not isinstance(data, dict):
        return
    types = _field_types(cls)
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in types:
            close = difflib.get_close_matches(str(key), list(types), n=1, cutoff=0.6)
            hint = f"; did you mean '{(prefix + '.') if prefix else ''}{close[0]}'?" if close else ""
            known = ", ".join(types)
            out.append((dotted, f"unknown key{hint} (known keys{' of ' + prefix if prefix else ''}: {known})"))
            continue
        tp = _strip_optional(types[key])
        if dataclasses.is_dataclass(tp):
            _unknown_keys(value, tp, dotted, out)
        elif typing.get_origin(tp) in (dict, Dict) and isinstance(value, dict):
            vt = _strip_optional(typing.get_args(tp)[1])
            if dataclasses.is_dataclass(vt):
                for k2, v2 in value.items():
                    _unknown_keys(v2, vt, f"{dotted}.{k2}", out)


class _Choices(dict):
    """The allowed-values table; ``method.name``, unless set explicitly, reads the method registry
    when asked (:data:`specc.plan.schema.METHOD_NAMES`), never at import."""

    def __missing__(self, key: str) -> Tuple[str, ...]:
        if key == "method.name":
            return S.METHOD_NAMES
        if key == "engine":
            return S.ENGINES
        raise KeyError(key)


#: Allowed values of enumerated string keys (schema constants); ``CHOICES["method.name"]`` is the
#: method registry's names (:class:`_Choices`).
CHOICES: Dict[str, Tuple[str, ...]] = _Choices({
    "target.format": S.MODEL_FORMATS,
    "target.dtype": S.DTYPES,
    "draft.format": S.MODEL_FORMATS,
    "method.markov.kind": S.MARKOV_KINDS,
    "verify.rule": S.VERIFY_RULES,
    "verify.draft_sampling": S.DRAFT_SAMPLING,
    "schedule.kind": S.SCHEDULE_KINDS,
    "schedule.ragged_verify": S.RAGGED_VERIFY,
    "deploy.disagg.role": S.DISAGG_ROLES,
    "deploy.structured_output.backend": S.STRUCTURED_OUTPUT_BACKENDS,
    "runtime.device": S.DEVICES,
    "runtime.dtype": S.DTYPES,
    "runtime.kernel_backend": S.KERNEL_BACKENDS,
    "runtime.compile_backend": S.COMPILE_BACKENDS,
})

# Upper bounds that no engine's real configuration comes near, so an absurd value (a typo of
# ``num_steps: 1000000``) is refused at load, before lowering builds a state or a stage graph per
# value. For scale: SGLang's largest shipped κ is DFlash's block of 16 (κ = 15) and its adaptive
# default tops at 7; EAGLE trees verify tens of tokens; vLLM and SGLang capture CUDA graphs for
# batches up to a few hundred or thousand requests.
MAX_NUM_STEPS = 64  # κ
MAX_TOPK = 64
MAX_VERIFY_WIDTH = 1024  # num_draft_tokens
MAX_BATCH = 65536  # captured batch sizes, bucket keys, max_batch_size, max_running_requests
MAX_LIST = 512  # entries of capture_batch_sizes, buckets, tree_choices, candidate lists
MAX_MODEL_LEN = 1 << 24
MAX_NGRAM = 1024
MAX_SUFFIX_DEPTH = 4096  # suffix trees' depth (vLLM sets no upper bound; its default is 24)
MAX_PARALLEL = 4096  # tp / dp / pp / LoRAs per batch
# Candidate states (captured batch sizes × the κ candidates each routes to): each is lowered,
# graphed, predicted and compiled to its own program. SGLang's adaptive default gives 21.
MAX_STATES = 512

#: Inclusive numeric ranges; None = unbounded. Values outside are meaningless for any engine.
RANGES: Dict[str, Tuple[Optional[float], Optional[float]]] = {
    "target.max_model_len": (1, MAX_MODEL_LEN),
    "target.vocab_size": (1, 1 << 24),
    "draft.max_model_len": (1, MAX_MODEL_LEN),
    "draft.vocab_size": (1, 1 << 24),
    "method.num_steps": (0, MAX_NUM_STEPS),
    "method.topk": (1, MAX_TOPK),
    "method.num_draft_tokens": (1, MAX_VERIFY_WIDTH),
    "method.block_size": (1, MAX_NUM_STEPS),
    "method.ngram.min": (1, MAX_NGRAM),
    "method.ngram.max": (1, MAX_NGRAM),
    "method.markov.rank": (0, 1 << 16),
    "method.suffix.max_tree_depth": (1, MAX_SUFFIX_DEPTH),
    "method.suffix.max_cached_requests": (0, 1 << 31),
    "method.suffix.max_spec_factor": (0, None),
    "method.suffix.min_token_prob": (0, 1),
    "method.suffix.max_corpus_tokens": (0, 1 << 31),
    "verify.synthetic.acceptance_length": (1, MAX_NUM_STEPS + 1),
    "verify.accept_threshold.single": (0, 1),
    "verify.accept_threshold.acc": (0, 1),
    "schedule.ema_alpha": (0, 1),
    "schedule.warmup_batches": (0, None),
    "schedule.update_interval": (1, None),
    "deploy.lora.max_loras_per_batch": (1, MAX_PARALLEL),
    "deploy.parallel.tp": (1, MAX_PARALLEL),
    "deploy.parallel.dp": (1, MAX_PARALLEL),
    "deploy.parallel.pp": (1, MAX_PARALLEL),
    "deploy.parallel.draft_tp": (1, MAX_PARALLEL),
    "deploy.parallel.draft_pp": (1, MAX_PARALLEL),
    "deploy.parallel.draft_dp": (1, MAX_PARALLEL),
    "deploy.cuda_graph_max_bs": (1, MAX_BATCH),
    "deploy.page_size": (1, 1 << 20),
    "deploy.max_running_requests": (1, MAX_BATCH),
    "runtime.max_batch_size": (1, MAX_BATCH),
}


def get_key(plan: S.Plan, dotted: str) -> Any:
    """The value at a dotted key of a plan (dataclasses and dicts); None if a parent is None or absent."""
    obj: Any = plan
    for part in dotted.split("."):
        if obj is None:
            return None
        if isinstance(obj, dict):
            obj = obj.get(int(part) if part.isdigit() and int(part) in obj else part)
        else:
            obj = getattr(obj, part, None)
    return obj


def name_problem(name: Any) -> Optional[str]:
    """Why ``name`` cannot be a plan name (it names files and directories), or None: longer than
    :data:`specc.plan.schema.MAX_NAME_LEN`, or characters outside POSIX's portable filename set."""
    if not isinstance(name, str) or not name:
        return "a plan needs a name (letters, digits, _ . -), e.g. name: my_plan"
    if len(name) > S.MAX_NAME_LEN:
        return (f"{len(name):,} characters, over the {S.MAX_NAME_LEN} a plan name may have (it names the "
                f"artifact's directory); shorten it")
    if not _PORTABLE_NAME.match(name):
        return (f"{name[:60]!r} is not safe as a file name: use letters, digits, _ . - (POSIX's portable "
                f"filename characters), not starting with . or -")
    return None


def _path_errors(plan: S.Plan) -> List[Tuple[str, str]]:
    """(key, message) for each path of the plan that this machine cannot take as a path
    (:func:`specc.io.path_problem`)."""
    texts = [(key, get_key(plan, key)) for key in PATH_KEYS]
    texts += [("method.suffix.corpora", c) for c in plan.method.suffix.corpora or []]
    texts += [("deploy.lora.adapters", a.partition("=")[2] or a) for a in plan.deploy.lora.adapters or []]
    errs = []
    for key, text in texts:
        problem = path_problem(text) if isinstance(text, str) and text else None
        if problem:
            errs.append((key, f"the path {problem}; give a shorter path"))
    return errs


def _resolve_records(plan: S.Plan, path: Path, sources: Dict[str, Source]) -> List[Tuple[str, str]]:
    """Make the relative record paths (:data:`RECORD_KEYS`) a plan file wrote absolute against that
    file's folder (in place; an override's path stays relative to the working directory, a
    ``schedule.cost_table`` not beside the plan is kept as written: found in the working directory,
    or an engine's own table on the machine that launches), and return ``(key, message)`` for a
    ``schedule.acceptance`` that names no regular file."""
    errs: List[Tuple[str, str]] = []
    for key in RECORD_KEYS:
        section, _, leaf = key.partition(".")
        text = getattr(getattr(plan, section), leaf)
        if not isinstance(text, str) or not text or text.startswith("pkg://") or os.path.isabs(text):
            continue
        src = sources.get(key)
        if src is None or src[0].startswith(OVERRIDE_FILE):
            continue
        base = Path(src[0]).parent if src[0] else path.parent
        near = (base / text).resolve()
        if key == "schedule.cost_table" and not near.exists():
            continue  # a table named relative to the working directory, or one on the engine's machine
            # (SGLang's SPS table): kept as written
        setattr(getattr(plan, section), leaf, str(near))
    rec = plan.schedule.acceptance
    if isinstance(rec, str) and rec and not rec.startswith("pkg://") and not Path(rec).is_file():
        errs.append(("schedule.acceptance", f"no acceptance record at {rec} (a relative path is read from the plan "
                                            f"file's folder); point it at the record `specc tune` wrote beside the "
                                            f"plan (S.acceptance.json), or remove the key"))
    return errs


def _unknown_method_hint(name: str) -> str:
    """How a method outside the registry gets in: why its entry point was skipped, if one was, else
    that third-party methods register through the ``specc.methods`` entry points."""
    from specc import methods

    why = methods.METHODS.problems.get(name)
    if why:
        return f" (its {methods.METHOD_ENTRY_POINT_GROUP!r} entry point was skipped: {why})"
    return (f" (a third-party method registers a Method row through the {methods.METHOD_ENTRY_POINT_GROUP!r} "
            f"entry points; install its package)")


def _range_errors(plan: S.Plan) -> List[Tuple[str, str]]:
    errs: List[Tuple[str, str]] = []
    problem = name_problem(plan.name)
    if problem:
        errs.append(("name", problem))
    errs += _path_errors(plan)
    for key, allowed in [("method.name", CHOICES["method.name"]),
                         *((k, v) for k, v in CHOICES.items() if k != "method.name")]:
        v = get_key(plan, key)
        if v is not None and v not in allowed:
            close = difflib.get_close_matches(str(v), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            if key == "method.name" and not close:
                hint = _unknown_method_hint(str(v))
            errs.append((key, f"{v!r} is not one of {', '.join(allowed)}{hint}"))
    for key, (lo, hi) in RANGES.items():
        v = get_key(plan, key)
        if v is None:
            continue
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        if isinstance(v, float) and not math.isfinite(v):
            errs.append((key, f"{v} is not a finite number; must be {rng}"))
        elif (lo is not None and v < lo) or (hi is not None and v > hi):
            errs.append((key, f"{v} is out of range; must be {rng}"))
    rates = plan.verify.synthetic.acceptance_rates
    if rates is not None and any(not (0.0 <= r <= 1.0) for r in rates):
        errs.append(("verify.synthetic.acceptance_rates", f"{_short(rates)}: every rate must be in [0, 1]"))
    if rates is not None and len(rates) > MAX_NUM_STEPS:
        errs.append(("verify.synthetic.acceptance_rates",
                     f"{len(rates)} rates: at most one per draft position, {MAX_NUM_STEPS} in all"))
    buckets = plan.schedule.buckets or {}
    if len(buckets) > MAX_LIST:
        errs.append(("schedule.buckets", f"{len(buckets)} buckets: at most {MAX_LIST}"))
    for bs, bucket in list(buckets.items())[:MAX_LIST]:
        if not 1 <= bs <= MAX_BATCH:
            errs.append((f"schedule.buckets.{bs}", f"batch size {bs} must be in [1, {MAX_BATCH}]"))
        for x in bucket.up_hysteresis, bucket.down_hysteresis, bucket.ceiling_coeff:
            if x is not None and not math.isfinite(x):
                errs.append((f"schedule.buckets.{bs}", f"{x}: hysteresis and ceiling must be finite numbers"))
                break
        if any(not 0 <= c <= MAX_NUM_STEPS for c in bucket.candidates) or len(bucket.candidates) > MAX_LIST:
            errs.append((f"schedule.buckets.{bs}.candidates",
                         f"{_short(bucket.candidates)}: κ candidates must be in [0, {MAX_NUM_STEPS}]"))
    frac = plan.deploy.memory_fraction
    if frac is not None and not (math.isfinite(frac) and 0.0 < frac <= 1.0):
        errs.append(("deploy.memory_fraction", f"{frac} is out of range; must be in (0, 1]: the share of GPU "
                                               f"memory the engine takes (e.g. 0.85)"))
    parser = plan.deploy.reasoning_parser
    if parser is not None:
        from specc.engines import names as engine_names

        known = engine_names.all_reasoning_parsers()
        if parser not in known:
            errs.append(("deploy.reasoning_parser",
                         f"{parser!r} is not a reasoning parser of any engine profile"
                         f"{engine_names.did_you_mean(parser, known)} (`specc check --engine sglang|vllm` "
                         f"lists that engine's own names)"))
    for key in ("schedule.capture_batch_sizes", "deploy.cuda_graph_batch_sizes"):
        v = get_key(plan, key)
        if v is not None and any(not 1 <= x <= MAX_BATCH for x in v):
            errs.append((key, f"{_short(v)}: batch sizes must be in [1, {MAX_BATCH}]"))
        elif v is not None and len(v) > MAX_LIST:
            errs.append((key, f"{len(v)} batch sizes: at most {MAX_LIST}"))
    if not errs:
        n_states = _state_count_bound(plan)
        if n_states > MAX_STATES:
            errs.append(("schedule", f"{n_states} candidate states (captured batch sizes × the κ candidates "
                                     f"of the bucket each routes to); at most {MAX_STATES}: capture fewer "
                                     f"batch sizes (schedule.capture_batch_sizes, runtime.max_batch_size) "
                                     f"or list fewer κ per bucket"))
    corpora = plan.method.suffix.corpora or []
    if len(corpora) > MAX_LIST:
        errs.append(("method.suffix.corpora", f"{len(corpora)} corpora: at most {MAX_LIST}"))
    tc = plan.method.tree_choices
    if tc is not None and any(any(c < 0 for c in path) for path in tc):
        errs.append(("method.tree_choices", "child indices must be >= 0"))
    elif tc is not None and (len(tc) > MAX_VERIFY_WIDTH - 1 or any(len(p) > MAX_NUM_STEPS or max(p, default=0) >= MAX_TOPK
                                                             for p in tc)):
        errs.append(("method.tree_choices", f"{len(tc)} paths: at most {MAX_VERIFY_WIDTH - 1} paths (the verify "
                                            f"width), each at most {MAX_NUM_STEPS} deep with ranks < {MAX_TOPK}"))
    return errs


def _state_count_bound(plan: S.Plan) -> int:
    """How many candidate states lowering makes at most, counted without lowering: one per
    (captured batch size, κ candidate of the bucket it routes to) — the rule of
    :func:`specc.compiler.lower.lower_report`; 4 per size for SGLang's default adaptive table, 3 for
    ``auto`` (κ at α − 0.1, α, α + 0.1), 1 otherwise."""
    import bisect

    s = plan.schedule
    if s.capture_batch_sizes:
        n_sizes = len(set(s.capture_batch_sizes))
        sizes = sorted(set(s.capture_batch_sizes))
    else:
        top = int(plan.runtime.max_batch_size)
        sizes = sorted({1 << i for i in range(top.bit_length()) if 1 << i <= top} | {top})
        n_sizes = len(sizes)
    from specc import methods

    row = methods.METHODS.get(plan.method.name)
    if row is not None and not row.drafts:  # plain decoding: no κ candidates to count
        return 1
    if s.kind in ("adaptive", "batch_buckets") and s.buckets:
        keys = sorted(s.buckets)
        total = 0
        for b in sizes:
            i = max(bisect.bisect_right(keys, b) - 1, 0)
            total += max(1, len(set(s.buckets[keys[i]].candidates)))
        return total
    per = {"adaptive": 4, "auto": 3}.get(s.kind, 1)
    return n_sizes * per


def _short(values, n: int = 8) -> str:
    """A list for a message, cut after ``n`` entries."""
    values = list(values)
    if len(values) <= n:
        return str(values)
    return "[" + ", ".join(map(str, values[:n])) + f", ... ({len(values)} in all)]"


# --------------------------------------------------------------------------------------------
# Files Hydra will read: checked (bounded read, bounded alias expansion) before it reads them


def _defaults_entries(node) -> List[Tuple[str, str]]:
    """(group, option) pairs of a config's ``defaults:`` list from its node tree (scalar options
    only; ``_self_``, bare names and lists are skipped). ``group`` keeps a leading ``/``."""
    out: List[Tuple[str, str]] = []
    if not isinstance(node, yaml.MappingNode):
        return out
    for k, v in node.value:
        if getattr(k, "value", None) != "defaults" or not isinstance(v, yaml.SequenceNode):
            continue
        for item in v.value:
            if not isinstance(item, yaml.MappingNode) or len(item.value) != 1:
                continue
            gk, gv = item.value[0]
            if not isinstance(gk, yaml.ScalarNode) or not isinstance(gv, yaml.ScalarNode):
                continue
            group = str(gk.value).strip()
            for word in ("override ", "optional "):
                if group.startswith(word):
                    group = group[len(word):].strip()
            group = group.split("@", 1)[0]
            if group and gv.value not in (None, "", "null"):
                out.append((group, str(gv.value)))
    return out


def _check_config_node(node, where: str) -> None:
    """What a plan or config-group file may not hold, whatever Hydra would make of it: a top-level
    ``hydra:`` section (it could extend the config search path) or a resolver call
    (:func:`refuse_resolvers`). Raises PlanError naming the file and line."""
    if isinstance(node, yaml.MappingNode):
        for k, _ in node.value:
            if getattr(k, "value", None) == "hydra":
                raise PlanError(f"{where}:{k.start_mark.line + 1}: a `hydra:` section configures Hydra itself (its "
                                f"search path, its output), not the plan; remove it")
    refuse_resolvers(node, where)


def _confined(dirs: Sequence[Path], full: str, option: str, what: str) -> Optional[Path]:
    """The file ``<dir>/<full>/<option>.yaml`` of the first of ``dirs`` that has it, or None; each
    component of ``full`` and ``option`` must be a plain name (:data:`_CONFIG_PART`: no ``..``, no
    absolute path) and the file, links resolved, must lie inside its directory. Raises PlanError
    naming ``what`` (the defaults entry or override) otherwise."""
    parts = [p for p in full.split("/") if p] + [option]
    bad = next((p for p in parts if not _CONFIG_PART.match(p)), None)
    if bad is not None:
        raise PlanError(f"{what}: {bad!r} is not a config-group or option name (letters, digits, _ . -); plans "
                        f"compose only from the config search path (conf/ and the plan's folder), so `..` and "
                        f"absolute paths are refused")
    for base in dirs:
        f = base / full / f"{option}.yaml"
        if os.path.lexists(f):
            real, root = os.path.realpath(f), os.path.realpath(base)
            if os.path.commonpath([real, root]) != root:
                raise PlanError(f"{what}: {f} leads to {real}, outside {base}; plans compose only from the "
                                f"config search path (conf/ and the plan's folder)")
            return f
    return None


def _check_included_files(path: Path, root, group_ovs: Sequence[str], limit: int = 256) -> None:
    """Read the plan's own node tree and every config-group file its defaults list (followed
    recursively) and the ``group=option`` overrides select, as Hydra will, but checked first: each
    file must be a regular file under :data:`specc.io.PLAN_LIMIT` within the bounds of
    :func:`specc.io.compose_yaml_bounded` (a FIFO or device named ``method/x.yaml`` next to a plan
    would otherwise hang Hydra, an alias bomb expand for minutes, deep nesting end in a
    ``RecursionError``), found inside the config search path (:func:`_confined`), and free of what
    :func:`_check_config_node` refuses. Raises PlanError."""
    dirs = [path.parent, conf_dir()]
    _check_config_node(root, _display(path))
    todo: List[Tuple[str, str, str, str]] = [("", g, o, f"{_display(path)}: defaults entry {g}: {o}")
                                             for g, o in _defaults_entries(root)]
    for text in group_ovs:
        key, sep, option = text.partition("=")
        key = key.lstrip("+~").split("@", 1)[0]
        if sep and key and option:
            todo.append(("", "/" + key.lstrip("/"), option, f"override {text!r}"))
    seen: set = set()
    while todo and len(seen) < limit:
        parent, group, option, what = todo.pop()
        full = group.lstrip("/") if group.startswith("/") or not parent else f"{parent}/{group}"
        if (full, option) in seen:
            continue
        seen.add((full, option))
        f = _confined(dirs, full, option, what)
        if f is not None:
            node, _ = _read_yaml_nodes(f)
            _check_config_node(node, _display(f))
            todo.extend((full, g, o, f"{_display(f)}: defaults entry {g}: {o}") for g, o in _defaults_entries(node))


# --------------------------------------------------------------------------------------------
# Composition


def _compose(path: Path, group_ovs: List[str]):
    """Hydra compose of ``path`` with ``conf_dir()`` on the search path. Returns (cfg, files in
    merge order as (file, package))."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    S.register_configs()
    cdir = conf_dir()
    plan_dir = path.parent
    hydra_ovs = list(group_ovs)
    if plan_dir != cdir:
        hydra_ovs.append(f"hydra.searchpath=[file://{cdir}]")
    GlobalHydra.instance().clear()
    with warnings.catch_warnings(), initialize_config_dir(config_dir=str(plan_dir), version_base="1.3"):
        warnings.simplefilter("ignore")  # e.g. "Defaults list is missing `_self_`": not the user's problem
        cfg = compose(config_name=path.stem, overrides=hydra_ovs, return_hydra_config=True)
    from omegaconf import open_dict

    choices = dict(cfg.hydra.runtime.choices) if "hydra" in cfg else {}
    with open_dict(cfg):
        cfg.pop("hydra", None)
    files = _merge_order(path, choices, [plan_dir, cdir])
    return cfg, files


def _merge_order(path: Path, choices: Dict[str, Any], dirs: Sequence[Path]) -> List[Tuple[Path, str]]:
    """The composed files as (file, package) in Hydra's merge order: the primary's ``defaults`` list
    as written (each entry with the option Hydra finally chose, so a ``group=option`` override is
    honoured), the primary itself at ``_self_`` (Hydra 1.1+ default: last), then groups added by
    ``+group=option`` overrides, which Hydra appends after the list. Later files win, so a sub-group
    (``/deploy/parallel: tp4``) listed after its parent group (``/deploy: single``) wins for the keys
    both set, as in Hydra."""
    def entry(group: str, option: Any) -> Optional[Tuple[Path, str]]:
        if option is None or group.startswith("hydra/") or group == "hydra":
            return None
        grp, _, pkg = str(group).partition("@")
        for base in dirs:
            f = base / grp / f"{option}.yaml"
            if f.is_file():
                return f, pkg or grp.replace("/", ".")
        return None

    try:
        data = yaml.safe_load(_read_text(path)) or {}
        defaults = data.get("defaults") or [] if isinstance(data, dict) else []
    except yaml.YAMLError:
        defaults = []
    order: List[Optional[str]] = []  # group keys as Hydra reports them in `choices`; None = _self_
    for d in defaults if isinstance(defaults, list) else []:
        if d == "_self_":
            order.append(None)
        elif isinstance(d, dict) and len(d) == 1:
            key = str(next(iter(d))).strip()
            for word in ("override ", "optional "):
                if key.startswith(word):
                    key = key[len(word):].strip()
            order.append(key.lstrip("/"))
    if None not in order:
        order.append(None)
    listed = {g for g in order if g is not None}
    order += [g for g in choices if g not in listed]  # `+group=option` overrides: appended
    out: List[Tuple[Path, str]] = []
    for group in order:
        if group is None:
            out.append((path, ""))
            continue
        found = entry(group, choices.get(group))
        if found is not None and found not in out:
            out.append(found)
    return out


def _hydra_error(exc: Exception, path: Path) -> PlanError:
    import re

    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(exc).__name__
    m = re.search(r"full_key: ([\w.]+)", text)
    if m:
        # A typed merge failed inside Hydra (the plan lists plan_schema in its defaults): say which key.
        key = m.group(1)
        node, _ = _read_yaml_nodes(path)
        where: Dict[str, Source] = {}
        _record_lines(node, "", _display(path), where)
        src = where.get(key)
        loc = f"{src[0]}:{src[1]}" if src else _display(path)
        unknown: List[Tuple[str, str]] = []
        parent, _, leaf = key.rpartition(".")
        if "not in" in text:
            _unknown_keys(_nest(key, None), S.Plan, "", unknown)
        if unknown:
            return PlanError(f"plan {_display(path)} has 1 problem:\n  {loc}: {unknown[0][0]}: {unknown[0][1]}")
        body = [ln.strip() for ln in lines if "raised while composing" not in ln and ":" not in ln.split()[0]]
        detail = body[0] if body else first
        return PlanError(f"plan {_display(path)} has 1 problem:\n  {loc}: {key}: wrong type or value: {detail}")
    if "Could not find" in first or "Could not load" in first:
        # "Could not find 'method/eagel3'" + available options
        import re

        msg = first.strip()
        opts_lines = []
        for ln in lines[1:]:
            if ln.startswith("Config search path"):
                break
            if "Available" not in ln and ln.strip() != "schema":
                opts_lines.append(ln.strip())
        m = re.search(r"'([\w/]+)/([^'/]+)'", first)
        plan_keys = set(_field_types(S.Plan))
        known_groups = sorted((_groups([conf_dir()]) & plan_keys) | _groups([path.parent]) - {"plan"})
        if m and m.group(1) not in known_groups and not (path.parent / m.group(1)).is_dir():
            group = m.group(1)
            close = difflib.get_close_matches(group, known_groups, n=1)
            hint = f"; did you mean /{close[0]}?" if close else ""
            loc = _display(path)
            try:
                for i, ln in enumerate(_read_text(path).splitlines(), 1):
                    if re.search(rf"(^|[\s/+~\[]){re.escape(group)}\s*[:=]", ln):
                        loc += f":{i}"
                        break
            except PlanError:
                pass
            return PlanError(f"{loc}: unknown config group {group!r} in the defaults list{hint} "
                             f"(groups: {', '.join(known_groups)})")
        if opts_lines:
            msg += f" (options: {', '.join(opts_lines)})"

        if m:
            group, opt = m.group(1), m.group(2)
            opts = [p.stem for base in (path.parent, conf_dir()) for p in (base / group).glob("*.yaml")]
            close = difflib.get_close_matches(opt, opts, n=1)
            if close:
                msg += f"; did you mean {group}={close[0]}?"
        return PlanError(f"{_display(path)}: {msg}")
    return PlanError(f"{_display(path)}: cannot compose plan: {' '.join(ln.strip() for ln in lines[:4])}")


def load_plan(source: str, overrides: Sequence[str] = ()) -> LoadedPlan:
    """Compose, type and range-check a plan.

    Args:
        source: path to a YAML plan file, or a preset name (``conf/plan/<name>.yaml``).
        overrides: Hydra-style overrides, ``group=option`` or ``dotted.key=value``.

    Returns:
        LoadedPlan with the typed ``Plan`` (every schema default filled in), the file path and
        ``sources`` (dotted key -> (file, line)).

    Raises:
        PlanError: missing file, unknown preset, invalid YAML (with its line), unknown group option,
            unknown key (with "did you mean"), wrong type, or out-of-range value. All problems of the
            plan are listed in one error.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = locate(source)
    root, _ = _read_yaml_nodes(path)
    if root is None:
        raise PlanError(f"{_display(path)}: empty plan file; write at least a defaults list and a name "
                        f"(see conf/plan/smollm2_ngram.yaml), or pass a preset name")
    if not isinstance(root, yaml.MappingNode):
        raise PlanError(f"{_display(path)}:{root.start_mark.line + 1}: a plan must be a YAML mapping "
                        f"(key: value lines), not a {root.tag.rsplit(':', 1)[-1]}")
    group_ovs, key_ovs = _parse_overrides(overrides, _groups([path.parent, conf_dir()]))
    _check_included_files(path, root, group_ovs)

    from hydra.errors import HydraException

    try:
        cfg, files = _compose(path, group_ovs)
    except PlanError:
        raise
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, OSError, ValueError) as exc:
        # A broken YAML in a group file: find it and report its line.
        for f in sorted(conf_dir().rglob("*.yaml")) + [path]:
            try:
                yaml.compose(_read_text(f), Loader=yaml.SafeLoader)
            except yaml.YAMLError:
                _read_yaml_nodes(f)  # raises with file:line
            except PlanError:
                pass
        raise _hydra_error(exc, path) from None

    # Where each key was written (later files win, as in Hydra's merge order).
    sources: Dict[str, Source] = {}
    for f, package in files:
        node, text = _read_yaml_nodes(f)
        header = _package_header(text)
        pkg = package if header is None else ("" if header == "_global_" else header)
        if pkg.startswith("_global_"):
            pkg = pkg[len("_global_"):].lstrip(".")
        _record_lines(node, pkg, _display(f), sources)

    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise PlanError(f"{_display(path)}: cannot resolve interpolation: {exc}".splitlines()[0]) from None
    data.pop("hydra", None)

    problems: List[Tuple[str, str]] = []
    _group_scalars(data, problems)
    _unknown_keys(data, S.Plan, "", problems)
    for text, key, value in key_ovs:
        tree: Dict[str, Any] = {}
        cur = tree
        parts = key.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
        ov_problems: List[Tuple[str, str]] = []
        _unknown_keys(tree, S.Plan, "", ov_problems)
        for k, _ in ov_problems:  # the override is the place to fix, not the plan line of its parent
            sources[k] = (f"{OVERRIDE_FILE} {text}", 0)
        problems += ov_problems

    typed = _typed(_drop_unknown(data, S.Plan), problems)
    _warn_repeated(key_ovs)
    for text, key, value in key_ovs:
        if any(k == key or key.startswith(k + ".") for k, _ in problems):
            continue
        try:
            if any(part.isdigit() for part in key.split(".")):
                raise AssertionError("int-keyed dict: merge a nested dict instead")
            OmegaConf.update(typed, key, value, merge=True)
        except (OmegaConfBaseException, AssertionError):
            try:
                typed = OmegaConf.merge(typed, _nest(key, value))
            except OmegaConfBaseException as exc:
                sources[key] = (f"{OVERRIDE_FILE} {text}", 0)
                problems.append((key, _type_msg(exc)))
                continue
        sources[key] = (f"{OVERRIDE_FILE} {text}", 0)
        for k in list(sources):
            if k.startswith(key + "."):
                del sources[k]

    plan = None
    if typed is not None:
        try:
            plan = OmegaConf.to_object(typed)
        except OmegaConfBaseException as exc:
            problems.append((_err_key(exc, ""), _type_msg(exc)))
    if plan is not None:
        problems += _range_errors(plan)
        problems += _resolve_records(plan, path, sources)

    if problems:
        loaded = LoadedPlan(plan=plan, path=path, sources=sources)  # type: ignore[arg-type]
        lines = []
        for key, msg in problems:
            src = loaded.where(key)
            loc = (f"{src[0]}:{src[1]}" if src[1] else src[0]) if src else _display(path)
            lines.append(f"  {loc}: {key}: {msg}")
        n = len(problems)
        raise PlanError(f"plan {_display(path)} has {n} problem{'s' if n > 1 else ''}:\n" + "\n".join(lines))
    return LoadedPlan(plan=plan, path=path, sources=sources, overrides=tuple(overrides))


def _group_scalars(data: Dict[str, Any], problems: List[Tuple[str, str]]) -> None:
    """Report (and drop from ``data``) sections written as a scalar, e.g. ``method: ngram`` in the plan
    body: the user meant to pick a config-group option, which the defaults list does."""
    types = _field_types(S.Plan)
    for key in list(data):
        tp = _strip_optional(types.get(key, object))
        value = data[key]
        if dataclasses.is_dataclass(tp) and value is not None and not isinstance(value, dict):
            alt = f" or set `{key}.name`" if "name" in _field_types(tp) else ""
            problems.append((key, f"{value!r} is not a {key} section; to select a config group option use "
                                  f"`defaults: [/{key}: {value}]`{alt}, or write {key}: as a mapping of its keys"))
            del data[key]


def _warn_repeated(key_ovs) -> None:
    """Print a warning to stderr for each plan key set by more than one ``key=value`` override with
    different values (the last one wins, as in Hydra)."""
    import sys

    seen: Dict[str, List[str]] = {}
    values: Dict[str, List[Any]] = {}
    for text, key, value in key_ovs:
        seen.setdefault(key, []).append(text)
        values.setdefault(key, []).append(value)
    for key, texts in seen.items():
        if len(texts) > 1 and any(v != values[key][-1] for v in values[key]):
            print(f"specc: warning: {key} is overridden {len(texts)} times ({', '.join(texts)}); the last one "
                  f"({texts[-1]}) wins", file=sys.stderr)


def _nest(key: str, value: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    cur = out
    parts = [int(p) if p.isdigit() else p for p in key.split(".")]  # bucket keys are ints
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def _drop_unknown(data: Any, cls) -> Any:
    """``data`` without the keys the schema lacks (they are reported separately)."""
    if not isinstance(data, dict):
        return data
    types = _field_types(cls)
    out = {}
    for k, v in data.items():
        if k not in types:
            continue
        tp = _strip_optional(types[k])
        out[k] = _drop_unknown(v, tp) if dataclasses.is_dataclass(tp) else v
    return out


def _leaves(data: Any, cls, prefix: str):
    """(dotted_key, value) for each schema leaf written in ``data`` (dict/list fields are leaves)."""
    types = _field_types(cls)
    for k, v in data.items():
        dotted = f"{prefix}.{k}" if prefix else str(k)
        tp = _strip_optional(types[k])
        if dataclasses.is_dataclass(tp) and isinstance(v, dict) and v:
            yield from _leaves(v, tp, dotted)
        else:
            yield dotted, v


def _typed(data: Dict[str, Any], problems: List[Tuple[str, str]]):
    """Merge ``data`` onto the schema. On a type error, merge leaf by leaf to report every bad key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = OmegaConf.structured(S.Plan)
    try:
        return OmegaConf.merge(base, data)
    except OmegaConfBaseException:
        pass
    typed = base
    for key, value in _leaves(data, S.Plan, ""):
        try:
            typed = OmegaConf.merge(typed, _nest(key, value))
        except OmegaConfBaseException as exc:
            problems.append((_err_key(exc, key), _type_msg(exc)))
    return typed


def _err_key(exc, fallback: str) -> str:
    key = getattr(exc, "full_key", None)
    return str(key) if key else fallback


def _type_msg(exc) -> str:
    msg = getattr(exc, "msg", None) or str(exc)
    msg = msg.splitlines()[0].strip()
    if "is not a ListConfig, list or tuple" in msg:  # OmegaConf's words for a scalar given to a list field
        return "wrong type: expected a list (e.g. [[0], [1], [0, 0]] for method.tree_choices, [1, 3] for candidates)"
    if "is not a DictConfig" in msg or "is not a subclass of" in msg:
        return f"wrong type: expected a mapping of keys ({msg})"
    typ = getattr(exc, "ref_type", None)
    return f"wrong type: {msg}" if "convert" in msg or "Invalid type" in msg or typ else msg


def _construct(cls, data: Dict[str, Any]):
    """Dataclass ``cls`` from nested dicts, recursively, without type coercion."""
    types = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        tp = _strip_optional(types[key])
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            value = _construct(tp, value)
        elif typing.get_origin(tp) in (dict, Dict) and isinstance(value, dict):
            vt = _strip_optional(typing.get_args(tp)[1])
            if dataclasses.is_dataclass(vt):
                value = {k: _construct(vt, v) if isinstance(v, dict) else v for k, v in value.items()}
        kwargs[key] = value
    return cls(**kwargs)


def plan_from_dict(data: Dict[str, Any], validate: bool = True) -> S.Plan:
    """Build a typed Plan from nested dicts (tests, generated plans); schema defaults fill the rest.

    With ``validate`` (default) values are type-checked and converted by OmegaConf against the
    schema; without it the dataclasses are built directly (fast; values used as given).
    Raises PlanError for unknown keys or wrong types (no range checks: ``check`` must cope)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    problems: List[Tuple[str, str]] = []
    _unknown_keys(data, S.Plan, "", problems)
    if problems:
        raise PlanError("; ".join(f"{k}: {m}" for k, m in problems))
    if not validate:
        return _construct(S.Plan, data)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(S.Plan), data))
    except OmegaConfBaseException as exc:
        raise PlanError(f"{_err_key(exc, '')}: {_type_msg(exc)}") from None
