"""The registry of drafter kinds the training tool can train: one adapter per kind.

The training loop (:mod:`specc.train.fit`) knows nothing about any architecture. A drafter kind is
one subclass of :class:`DrafterKind` registered with :func:`register`, plus one recipe file under
``conf/train/``; the kind says which target layers the data must record, how to build and
initialise its model from the target, how a batch is collated and scored (loss and per-draft-step
top-1 agreement), and how its checkpoint is written and read in its published layout.

Built-in kinds (:func:`builtin`, from the method registry's ``Method.train_kinds``): ``eagle`` and ``eagle3`` (:mod:`specc.methods.eagle.recipe`), ``medusa``
(:mod:`specc.methods.medusa.recipe`), the block drafters ``dflash``, ``dspark`` and ``pard``
(:mod:`specc.methods.dflash.recipe`), and the MTP family ``mtp``, ``multi_layer_eagle`` and ``frozen_kv_mtp``
(:mod:`specc.methods.mtp.recipe`). Each implements ``layers`` (the target layers it reads; none for PARD),
``build``, ``collate`` + ``loss`` (its own objective), ``save`` / ``load`` in its published layout,
and optionally ``finish`` (work after the last step on held-out data, e.g. DSpark's confidence
calibration).
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

    def finish(self, model, target, held_out, options: dict) -> dict:
        """Work after the last training step on held-out data (``held_out``: a
        :class:`specc.train.data.SeqSet` with features); returns facts for the card. Default: none."""
        return {}

    def load(self, directory, target) -> torch.nn.Module:
        """Read a checkpoint written by :meth:`save` (or published by others in the same layout)."""
        raise NotImplementedError

    def warm_start(self, model, target, options: dict, sample) -> dict:
        """Initialise a freshly built ``model`` from another trained drafter when the options name one
        (``sample``: a :class:`specc.train.data.SeqSet` with features, for scale estimates, or None).
        Returns facts for the card. Default: nothing to do, ``{}``."""
        return {}

    def check_options(self, options: dict, source: str) -> dict:
        """``options`` with defaults filled in; ``SpeccError`` naming an unknown key."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise SpeccError(f"{source}: unknown option(s) {unknown} for drafter kind {self.name!r}; "
                             f"known: {sorted(self.options)}")
        out = dict(self.options)
        out.update(options)
        return out


def builtin() -> Dict[str, str]:
    """The registered kinds: name -> ``"module:Class"``, read from the method registry
    (:attr:`specc.methods.Method.train_kinds`; a method registered through the ``specc.methods`` entry
    points brings its kinds) when asked. Imported lazily (importlib), so this module imports none of
    the kinds' modules and they import only the protocol above: no import cycle."""
    from specc import methods

    return {kind: ref for m in methods.METHODS.values() for kind, ref in m.train_kinds}


def __getattr__(name):
    if name == "BUILTIN":  # the table as a module attribute, read when asked
        return builtin()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


KINDS: Dict[str, DrafterKind] = {}  # instances, by name (built-ins on first use, others by register)


def register(cls):
    """Register one instance of a :class:`DrafterKind` subclass under ``cls.name`` (a class
    decorator, for kinds no method row declares, e.g. a test's toy kind)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}.name is empty")
    KINDS[cls.name] = cls()
    return cls


def names() -> List[str]:
    """Every known kind name (built-in and registered), sorted."""
    return sorted(set(builtin()) | set(KINDS))


def get(name: str) -> DrafterKind:
    """The kind ``name`` (a built-in is imported on first use); ``SpeccError`` listing the known
    kinds otherwise."""
    import importlib

    table = builtin() if name not in KINDS else {}
    if name in table:
        module, cls = table[name].split(":")
        KINDS[name] = getattr(importlib.import_module(module), cls)()
    if name not in KINDS:
        raise SpeccError(f"unknown drafter kind {name!r}; registered kinds: {', '.join(names())}")
    return KINDS[name]
