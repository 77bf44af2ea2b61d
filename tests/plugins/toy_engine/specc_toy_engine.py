"""A third engine, ``toyserve``, as a package outside specc would declare it (test only).

It knows one release, ``toyserve==1.0``, whose rule table has two rules: it runs only n-gram
drafting (an error otherwise) and caps κ at 4 (a fallback that sets ``method.num_steps``). Its
exporter writes a ``toyserve`` launch line. Registered through the ``specc.engines`` entry point of
the ``*.dist-info`` beside this file, with no edit anywhere in specc.
"""
from __future__ import annotations

from dataclasses import dataclass

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
