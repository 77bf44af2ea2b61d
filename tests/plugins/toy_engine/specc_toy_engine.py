"""A third engine, ``toyserve``, as a package outside specc would declare it (test only).

It knows one release, ``toyserve==1.0``, whose rule table has two rules: it runs only n-gram
drafting (an error otherwise) and caps κ at 4 (a fallback that sets ``method.num_steps``). Its
exporter writes a ``toyserve`` launch line and its importer reads one back (``specc import
toyserve -- toyserve --model M --lookahead 3``: flag table in ``toyserve_flags/``). Registered through the ``specc.engines`` entry point of
the ``*.dist-info`` beside this file, with no edit anywhere in specc.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specc.check.base import Profile, Rule
from specc.errors import PlanError

CAP = 4


def _kappa(p):
    return p.method.num_steps


PROFILE = Profile(name="toyserve", version="toyserve==1.0", root="toyserve/", rules=(
    Rule("T1", "error", ("method.name",), lambda p: p.method.name != "ngram",
         "toyserve drafts with n-gram lookup only; set method=ngram", "spec.py:1"),
    Rule("T2", "fallback", ("method.num_steps",), lambda p: isinstance(_kappa(p), int) and _kappa(p) > CAP,
         "toyserve caps method.num_steps at {new[method.num_steps]}", "spec.py:2",
         sets=lambda p: {"method.num_steps": CAP}),
))


def rule_tables():
    return (PROFILE,)


@dataclass
class ToyLaunch:
    model: str
    num_steps: int

    def command(self) -> str:
        return f"toyserve --model {self.model} --lookahead {self.num_steps}"


def export(plan):
    if plan.method.name != "ngram":
        raise PlanError(f"toyserve has no equivalent of method.name={plan.method.name}")
    return ToyLaunch(model=str(plan.target.path), num_steps=min(int(plan.method.num_steps or CAP), CAP))


#: a toyserve launch command starts with the word ``toyserve``
LAUNCHERS = (("toyserve",),)
#: the flag tables (``<version>.json``) beside this module
FLAGS_DIR = Path(__file__).resolve().parent / "toyserve_flags"


def to_plan(values, env, out, base_dir=None, config_only=False):
    """``--model`` -> target.path, ``--lookahead`` -> method.num_steps; toyserve always drafts by n-gram.
    Every other flag given is listed as having no plan key."""
    from specc.importer.base import as_count, put

    if "model" in values:
        put(out.plan, "target.path", values["model"])
    put(out.plan, "method.name", "ngram")
    if "lookahead" in values:
        put(out.plan, "method.num_steps", as_count(values, "lookahead", out, 1, "toyserve looks ahead at least once"))
    for dest in sorted(set(values) - {"model", "lookahead"}):
        out.unmapped.append(out.spell(dest, values))
