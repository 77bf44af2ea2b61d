"""The registry of drafter kinds the training tool can train: one adapter per kind.

The training loop (:mod:`specc.train.fit`) knows nothing about any architecture. A drafter kind is
one subclass of :class:`DrafterKind` registered with :func:`register`, plus one recipe file under
``conf/train/``; the kind says which target layers the data must record, how to build and
initialise its model from the target, how a batch is collated and scored (loss and per-draft-step
top-1 agreement), and how its checkpoint is written and read in its published layout.

Kinds registered today: ``eagle`` and ``eagle3`` (:mod:`specc.train.eagle`), ``medusa``
(:mod:`specc.train.medusa`). A kind added later (a DFlash / DSpark block drafter, a PARD draft
model) implements the same methods:
``layers`` (e.g. the target layers a DFlash draft conditions on; none for PARD), ``build``,
``collate`` + ``loss`` (its own objective: Medusa's per-head cross-entropy, a parallel drafter's
block loss), ``save`` / ``load`` in its published layout, and optionally ``coverage_report``.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from specc.errors import SpeccError


class DrafterKind:
    """Adapter protocol of one drafter kind (subclass it and decorate with :func:`register`).

    Attributes: ``name`` (the recipe's ``kind``), ``title`` (for documents), ``options`` (a dict of
    the kind's own recipe options with their defaults; a recipe key not listed here is an error).
    """

    name: str = ""
    title: str = ""
    options: Dict[str, object] = {}

    def layers(self, target_config, options: dict) -> Tuple[int, ...]:
        """Target layer outputs (``0..L-1``, pre-norm) this kind reads; the distillation data must
        hold them."""
        raise NotImplementedError

    def unroll_steps(self, options: dict) -> int:
        """Draft steps scored per position (agreement is reported for each)."""
        return 1

    def build(self, target, options: dict, data, idx: Sequence[int]) -> Tuple[torch.nn.Module, dict]:
        """A freshly initialised model for ``target`` and a dict of facts for the card (e.g. the draft
        vocabulary's coverage of the training sequences ``idx`` of ``data``, a
        :class:`specc.train.data.SeqSet`)."""
        raise NotImplementedError

    def collate(self, model, data, idx: Sequence[int], options: dict, device) -> dict:
        """The batch of sequences ``idx`` of ``data`` as tensors on ``device``."""
        raise NotImplementedError

    def loss(self, model, batch: dict, options: dict, train: bool) -> Tuple[torch.Tensor, List[float], List[int]]:
        """``(scalar loss, top-1 hits per draft step, counted positions per draft step)``."""
        raise NotImplementedError

    def save(self, model, directory, target) -> None:
        """Write the checkpoint in the kind's published layout."""
        raise NotImplementedError

    def load(self, directory, target) -> torch.nn.Module:
        """Read a checkpoint written by :meth:`save` (or published by others in the same layout)."""
        raise NotImplementedError

    def check_options(self, options: dict, source: str) -> dict:
        """``options`` with defaults filled in; ``SpeccError`` naming an unknown key."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise SpeccError(f"{source}: unknown option(s) {unknown} for drafter kind {self.name!r}; "
                             f"known: {sorted(self.options)}")
        out = dict(self.options)
        out.update(options)
        return out


KINDS: Dict[str, DrafterKind] = {}


def register(cls):
    """Class decorator: register one instance of a :class:`DrafterKind` subclass under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}.name is empty")
    KINDS[cls.name] = cls()
    return cls


def get(name: str) -> DrafterKind:
    """The registered kind ``name``; ``SpeccError`` listing the known kinds otherwise."""
    _load_builtin()
    if name not in KINDS:
        raise SpeccError(f"unknown drafter kind {name!r}; registered kinds: {', '.join(sorted(KINDS))}")
    return KINDS[name]


def _load_builtin() -> None:
    import specc.train.eagle  # noqa: F401  (registers eagle, eagle3)
    import specc.train.block  # noqa: F401  (registers dflash, dspark, pard)
    import specc.train.medusa  # noqa: F401  (registers medusa)
