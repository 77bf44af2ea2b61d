"""The candidates ``specc tune`` measures: one per drafter configuration that fits the target.

By default every shipped plan preset (``conf/plan/*.yaml``) that targets the ``specc`` engine, drafts
(a method other than ``none``), is run by specc's runtime (its row of :mod:`specc.methods` has
``runtime``) and verifies greedily or by rejection sampling is a candidate; presets that only
change the schedule of the same drafter (``smollm2_adaptive``, ``smollm2_budget``, …) collapse into
one candidate, keyed like acceptance records (:func:`specc.predict.acceptance.proposal_key`). So a new
method — one drafter module, one row of the method table, one preset naming its drafter — is
measured without a change here. ``--plans`` replaces the presets with the user's own plans.

Torch-free.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specc import methods
from specc.errors import PlanError, SpeccError

DEFAULT_TARGET = "smollm2_135m"
#: κ measured for chains and lookups at least (a block drafter keeps its trained block γ)
DEFAULT_MAX_STEPS = 4


class TuneError(SpeccError):
    """Bad input to ``specc tune`` (the message names the option)."""


@dataclass(frozen=True)
class Candidate:
    """One drafter configuration: ``plan`` (resolved for the ``specc`` engine, static schedule, κ =
    ``measure_steps``), its ``shape`` (``chain``, ``parallel`` or ``tree``) and the κ values the
    predictions cover (``kappas``: 1..measure_steps for chains and blocks, the tree's own κ for a
    tree). ``name`` is the preset (or plan file) it came from; ``also`` the presets merged into it."""

    name: str
    source: str
    plan: object
    shape: str
    measure_steps: int
    kappas: Tuple[int, ...]
    also: Tuple[str, ...] = ()

    @property
    def method(self) -> str:
        return self.plan.method.name

    @property
    def label(self) -> str:
        """Short name for tables: the preset name."""
        return self.name

    def variant(self, num_steps: int, *, kind: str = "static", buckets: Optional[Dict[int, int]] = None,
                capture: Optional[Sequence[int]] = None, name: Optional[str] = None):
        """This drafter at κ = ``num_steps`` (or a ``batch_buckets`` schedule with ``buckets``: batch
        size → κ), with ``capture`` batch sizes; resolved for the ``specc`` engine.

        Raises: TuneError when the runtime's rules refuse the variant (naming the rule)."""
        from specc.plan.schema import BucketConfig, ScheduleConfig
        from specc.check import resolve

        plan = self.plan
        m = plan.method
        top = max([num_steps] + list((buckets or {}).values()))
        changes = {"num_steps": top}
        if self.shape != "tree":
            changes["num_draft_tokens"] = None
            if m.block_size is not None:
                changes["block_size"] = top
        schedule = ScheduleConfig(kind=kind, capture_batch_sizes=list(capture) if capture else None,
                                  buckets={b: BucketConfig([k]) for b, k in (buckets or {}).items()})
        max_batch = max(capture) if capture else plan.runtime.max_batch_size
        p = dataclasses.replace(plan, name=name or plan.name, method=dataclasses.replace(m, **changes),
                                schedule=schedule,
                                runtime=dataclasses.replace(plan.runtime, max_batch_size=int(max_batch)))
        resolved, violations = resolve(p, "specc")
        errors = [v for v in violations if v.severity == "error"]
        if errors:
            raise TuneError(f"{self.name} at κ={num_steps}: the specc runtime refuses it: "
                            + "; ".join(f"[{v.rule}] {v.message}" for v in errors))
        return resolved


def target_path(target: str) -> Tuple[str, str]:
    """``(name, target.path)`` of ``--target``: a ``conf/target/<name>.yaml`` option or a model path.

    Raises: TuneError naming ``--target`` and the options when it is neither."""
    name, conf = target_conf(target)
    return name, str(conf.get("path"))


def target_conf(target: str) -> Tuple[str, Dict[str, Any]]:
    """``(name, the target section)`` of ``--target``: a ``conf/target/<name>.yaml`` option's keys, or
    for a model path (a Hugging Face directory or a ``.gguf`` file, checked by
    :func:`specc.models.target.read_target_arg`) its ``path``, ``format``, ``vocab_size`` and
    ``max_model_len`` (:func:`specc.models.target.target_overrides`); a path that is a shipped target's
    file keeps that target's own section.

    Raises: TuneError naming ``--target``: a hub id (specc downloads nothing), a path that is not a
    checkpoint, neither an option nor a path (with the options)."""
    import yaml

    from specc.models.target import canonical_path, looks_like_hub_id, read_target_arg
    from specc.plan.load import conf_dir

    options = sorted(p.stem for p in (conf_dir() / "target").glob("*.yaml"))
    f = conf_dir() / "target" / f"{target}.yaml"
    if f.is_file():
        data = yaml.safe_load(f.read_text()) or {}
        return target, data if isinstance(data, dict) else {}
    if target.startswith("pkg://"):
        return Path(target).stem, {"path": target}
    if looks_like_hub_id(target) or Path(target).expanduser().exists():
        try:
            t = read_target_arg(target)
        except SpeccError as exc:
            raise TuneError(str(exc)) from None
        path = canonical_path(t.path)
        for option in options:  # the shipped target's own section (its limits and vocabulary)
            data = yaml.safe_load((conf_dir() / "target" / f"{option}.yaml").read_text()) or {}
            if isinstance(data, dict) and data.get("path") == path:
                return option, data
        from specc.models.target import DEFAULT_CONTEXT

        return Path(t.path).stem, {"path": path, "format": t.fmt, "vocab_size": t.vocab_size,
                                   "max_model_len": min(t.context or DEFAULT_CONTEXT, DEFAULT_CONTEXT)}
    close = difflib.get_close_matches(target, options, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise TuneError(f"--target {target!r}: no such target option (conf/target/: {', '.join(options)}) or model "
                    f"path{hint}")


def conf_dir_has(target: str) -> bool:
    """Whether ``target`` names a ``conf/target/<name>.yaml`` option."""
    from specc.plan.load import conf_dir

    return (conf_dir() / "target" / f"{target}.yaml").is_file()


def retargeted(plan, conf: Dict[str, Any]):
    """``plan`` with its target section replaced by ``conf`` (``--target``'s: path, format, vocab_size,
    max_model_len); the target dtype stays the plan's."""
    from specc.plan.schema import TargetConfig

    return dataclasses.replace(plan, target=TargetConfig(
        path=str(conf["path"]), format=str(conf.get("format") or "hf"), dtype=plan.target.dtype,
        max_model_len=conf.get("max_model_len"), vocab_size=conf.get("vocab_size"), architecture=None))


def _misfit(plan) -> Optional[str]:
    """Why the plan's drafter does not fit its target (trained for another one), or None."""
    from specc.check.checkpoints import draft_target_mismatch

    why = draft_target_mismatch(plan)
    return f"its drafter {plan.draft.path} was trained for another target ({why})" if why else None


def _shape(plan) -> str:
    m = plan.method
    return methods.state_kind(int(m.num_steps or 1), int(m.topk or 1),
                              methods.is_parallel(m.name, m.parallel_drafting), m.tree_choices)


def _why_not(plan) -> Optional[str]:
    """Why a loaded plan cannot be a tune candidate, or None."""
    info = methods.get(plan.method.name)
    if not info.drafts:
        return "plain decoding drafts nothing (it is the baseline tune always runs)"
    if info.runtime is None:
        return f"specc's runtime does not run method {plan.method.name} (export it to an engine instead)"
    if plan.verify.rule not in ("greedy", "standard", "block"):
        return f"verify.rule={plan.verify.rule} is not the target's distribution"
    if plan.deploy.lora.adapters:
        return "it serves LoRA adapters (the tuned plan would drop them)"
    if plan.deploy.disagg.role != "none":
        return "it is a disaggregation role"
    return None


def _candidate(name: str, source: str, loaded_plan, max_steps: int) -> Candidate:
    from specc.plan.schema import ScheduleConfig, VerifyConfig
    from specc.check import resolve

    plan = dataclasses.replace(loaded_plan, engine="specc", verify=VerifyConfig(rule="greedy"),
                               schedule=ScheduleConfig(kind="static"))
    resolved, violations = resolve(plan, "specc")
    errors = [v for v in violations if v.severity == "error"]
    if errors:
        raise TuneError(f"{name}: the specc runtime refuses it: " + "; ".join(f"[{v.rule}] {v.message}" for v in errors))
    shape = _shape(resolved)
    k = int(resolved.method.num_steps or 1)
    if shape == "tree":
        kappas: Tuple[int, ...] = (k,)
        measure = k
    else:
        measure = k if resolved.method.block_size is not None else max(k, max_steps)
        kappas = tuple(range(1, measure + 1))
    c = Candidate(name=name, source=source, plan=resolved, shape=shape, measure_steps=measure, kappas=kappas)
    # measure at the largest κ the runtime accepts (a multi-layer head has one module per step: specc.S-ML-MODULES)
    while measure > k:
        try:
            return dataclasses.replace(c, plan=c.variant(measure), measure_steps=measure,
                                       kappas=tuple(range(1, measure + 1)))
        except TuneError:
            measure -= 1
    return dataclasses.replace(c, measure_steps=k, kappas=kappas[:k])  # a tree's kappas are (k,) already


def identity(plan) -> str:
    """Candidates that propose the same drafts share this key (target, draft, proposal key)."""
    from specc.predict.acceptance import proposal_key

    draft = plan.draft.path if plan.draft is not None else None
    return json.dumps([plan.target.path, draft, proposal_key(plan)], sort_keys=True)


def discover(target: str = DEFAULT_TARGET, method_names: Optional[Sequence[str]] = None,
             plan_sources: Optional[Sequence[str]] = None, engine: str = "specc",
             max_steps: int = DEFAULT_MAX_STEPS) -> Tuple[List[Candidate], List[str]]:
    """The candidates for ``target`` (see the module docstring) and notes on the presets left out.

    Args:
        target: ``--target`` (:func:`target_path`). method_names: ``--methods`` (None: all).
        plan_sources: ``--plans`` (plan files or preset names; None: the shipped presets).
        engine: ``--engine``: ``sglang`` / ``vllm`` keep the drafters that engine's rules accept.
        max_steps: κ measured for chains and lookups at least.
    Raises:
        TuneError: naming ``--target``, ``--methods``, ``--plans`` or ``--engine``: an unknown method,
            a method with no drafter for the target (or that the runtime or the engine does not
            run), a plan that does not load or is for another target, no candidate at all.
    """
    from specc.models.target import same_model
    from specc.plan.load import list_presets, load_plan

    tname, tconf = target_conf(target)
    tpath = str(tconf.get("path"))
    notes: List[str] = []
    misfits: Dict[str, str] = {}  # method -> why its drafter does not fit --target
    # a model of the user's (not a conf/target option): the default target's presets run on it instead
    retarget = None if (conf_dir_has(target) or same_model(tpath, target_path(DEFAULT_TARGET)[1])) else tconf
    if method_names:
        for m in method_names:
            if m not in methods.METHODS:
                close = difflib.get_close_matches(m, list(methods.METHODS), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise TuneError(f"--methods {m!r}: unknown method{hint} (known: {', '.join(methods.METHODS)})")
    found: Dict[str, Candidate] = {}
    if plan_sources:
        for src in plan_sources:
            try:
                loaded = load_plan(src)
            except PlanError as exc:
                raise TuneError(f"--plans {src}: {exc}") from None
            plan = loaded.plan
            if not same_model(plan.target.path, tpath):
                raise TuneError(f"--plans {src}: targets {plan.target.path}, not --target {tname} ({tpath}); pass "
                                f"--target for that model or a plan for this one")
            why = _why_not(plan)
            if why:
                raise TuneError(f"--plans {src}: not a tune candidate: {why}")
            cand = _candidate(Path(str(loaded.path)).stem, str(loaded.path), plan, max_steps)
            found.setdefault(identity(cand.plan), cand)
    else:
        loaded_presets = []
        for name in list_presets():
            try:
                loaded_presets.append((name, load_plan(name)))
            except PlanError as exc:
                notes.append(f"{name}: does not load ({str(exc).splitlines()[0]})")
        # a static-schedule preset names the candidate its schedule variants merge into
        loaded_presets.sort(key=lambda nl: (nl[1].plan.schedule.kind != "static", nl[0]))
        for name, loaded in loaded_presets:
            plan = loaded.plan
            if retarget is not None and plan.engine == "specc" and same_model(plan.target.path,
                                                                                target_path(DEFAULT_TARGET)[1]):
                plan = retargeted(plan, retarget)
            if plan.engine != "specc" or plan.target.path != tpath:
                continue
            why = _why_not(plan)
            misfit = None if why else _misfit(plan)
            if misfit:
                misfits.setdefault(plan.method.name, f"{name}: {misfit}")
            if why or misfit:
                notes.append(f"{name}: {why or misfit}")
                continue
            try:
                cand = _candidate(name, str(loaded.path), plan, max_steps)
            except TuneError as exc:
                notes.append(str(exc))
                continue
            key = identity(cand.plan)
            if key in found:
                found[key] = dataclasses.replace(found[key], also=found[key].also + (name,))
            else:
                found[key] = cand
    cands = list(found.values())
    if method_names:
        wanted = set(method_names)
        for m in method_names:
            if not any(c.method == m for c in cands):
                info = methods.get(m)
                if info.runtime is None:
                    why = f"specc's runtime does not run it, so it cannot be measured here (export it with `specc export`)"
                elif not info.drafts:
                    why = "it drafts nothing (plain decoding is always the baseline)"
                elif m in misfits:
                    why = misfits[m]
                else:
                    have = sorted({c.method for c in cands}) or ["none"]
                    why = (f"no shipped drafter or preset uses it with this target (methods with one: "
                           f"{', '.join(have)}); name a plan for it with --plans")
                raise TuneError(f"--methods {m}: does not fit --target {tname}: {why}")
        cands = [c for c in cands if c.method in wanted]
    if engine in ("sglang", "vllm"):
        from specc.check import check

        kept = []
        for c in cands:
            errs = [v for v in check(dataclasses.replace(c.plan, engine=engine), engine)
                    if v.severity == "error" and not v.rule.startswith("checkpoint.")]
            if errs:
                notes.append(f"{c.name}: {engine} refuses it ([{errs[0].rule}] {errs[0].message})")
                if method_names and c.method in method_names and not any(
                        k.method == c.method for k in cands if k is not c):
                    raise TuneError(f"--methods {c.method} with --engine {engine}: {engine} refuses it "
                                    f"([{errs[0].rule}] {errs[0].message})")
            else:
                kept.append(c)
        cands = kept
    if not cands:
        raise TuneError(f"--target {tname}: no drafter fits it (no specc preset in conf/plan/ drafts for "
                        f"{tpath}{'; ' + '; '.join(misfits.values()) if misfits else ''}); name plans with --plans")
    return cands, notes
