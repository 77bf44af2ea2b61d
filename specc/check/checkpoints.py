"""Profile-independent checkpoint rules: every engine needs the checkpoints it is given to load.

:data:`PROFILE` (``checkpoint``) is run by :func:`specc.check.check` for every engine, after the
engine's own table, and reported as ``checkpoint.<id>``: a local ``target.path`` / ``draft.path``
must be a loadable checkpoint, and a plan's ``vocab_size`` must agree with its ``config.json``.
The checkpoints are read by :func:`specc.models.checkpoints.read_checkpoint` (torch-free).
"""
from __future__ import annotations

from specc import methods
from specc.errors import PlanError
from specc.models.checkpoints import cfg_get, read_checkpoint
from specc.check.base import Profile, Rule, get




def _ck(p, key):
    fmt = get(p, key.rsplit(".", 1)[0] + ".format") or "hf"
    return read_checkpoint(key, get(p, key), fmt)


def _uses_draft(p) -> bool:
    """Whether the plan's method reads ``draft.path`` (a draft checkpoint, or MTP layers shipped
    apart from the target); an unknown method (refused by the schema) reads none."""
    if p.draft is None or not p.draft.path:
        return False
    try:
        m = methods.get(p.method.name)
    except PlanError:
        return False
    return m.needs_draft_checkpoint or m.target_ships_draft


def _bad(p, key) -> bool:
    ck = _ck(p, key)
    return ck is not None and bool(ck.problems)


def _why(p, key) -> str:
    ck = _ck(p, key)
    return "; ".join(ck.problems) if ck else ""


def _vocab_mismatch(p, key) -> bool:
    ck = _ck(p, key)
    sect = p.target if key == "target.path" else p.draft
    v = cfg_get(ck.config, "vocab_size") if ck else None
    return isinstance(v, int) and sect is not None and isinstance(sect.vocab_size, int) and sect.vocab_size != v


def _cfg_vocab(p, key):
    ck = _ck(p, key)
    return cfg_get(ck.config, "vocab_size") if ck else None


def _target_dims(p):
    """``(vocab_size, hidden_size)`` of the plan's target checkpoint: its ``config.json``, or a GGUF's
    header (:func:`specc.predict.sizing.gguf_config`); None where the checkpoint is not readable here."""
    ck = _ck(p, "target.path")
    if ck is None:
        return None
    cfg = ck.config
    if cfg is None and ck.fmt == "gguf" and ck.local is not None:
        from specc.predict.sizing import gguf_config

        cfg = gguf_config(str(ck.local))
    if not cfg:
        return None
    return cfg_get(cfg, "vocab_size"), cfg_get(cfg, "hidden_size")


def draft_target_mismatch(p):
    """Why the draft checkpoint was trained for another target, or None: its ``vocab_size`` differs
    from the target's (a drafter proposes token ids of its own vocabulary), or, for methods that read
    the target's hidden states (the method row's ``target_hidden`` is not ``none``), its
    ``target_hidden_size`` (else ``hidden_size``) differs from the target's ``hidden_size``. Both
    checkpoints must be readable here (a ``config.json``; the target's may be a GGUF header)."""
    if not _uses_draft(p):
        return None
    ck = _ck(p, "draft.path")
    dims = _target_dims(p)
    if ck is None or not ck.config or dims is None:
        return None
    tv, th = dims
    dv = cfg_get(ck.config, "vocab_size")
    if isinstance(dv, int) and isinstance(tv, int) and dv != tv:
        return f"vocab size: the drafter's is {dv}, the target's {tv}"
    try:
        reads_hidden = methods.get(p.method.name).target_hidden != "none"
    except PlanError:
        return None
    dh = cfg_get(ck.config, "target_hidden_size", "hidden_size")
    if reads_hidden and isinstance(dh, int) and isinstance(th, int) and dh != th:
        return f"hidden size: the drafter reads target hidden states of size {dh}, the target's is {th}"
    return None


SRC = "specc/check/checkpoints.py"
R = Rule
RULES = (
    R("CK-TARGET", "error", ("target.path",), lambda p: _bad(p, "target.path"),
      "target.path={p.target.path} is not a loadable checkpoint: {why}", SRC,
      message_args=lambda p: {"why": _why(p, "target.path")}),
    R("CK-DRAFT", "error", ("draft.path",), lambda p: _uses_draft(p) and _bad(p, "draft.path"),
      "draft.path={p.draft.path} is not a loadable checkpoint: {why}", SRC,
      message_args=lambda p: {"why": _why(p, "draft.path")}),
    R("CK-TARGET-VOCAB", "error", ("target.vocab_size", "target.path"),
      lambda p: _vocab_mismatch(p, "target.path"),
      "target.vocab_size={p.target.vocab_size} but {p.target.path}/config.json says vocab_size={v}; fix "
      "target.vocab_size (or drop it: the checkpoint decides)", SRC,
      message_args=lambda p: {"v": _cfg_vocab(p, "target.path")}),
    R("CK-DRAFT-VOCAB", "error", ("draft.vocab_size", "draft.path"),
      lambda p: _uses_draft(p) and _vocab_mismatch(p, "draft.path"),
      "draft.vocab_size={p.draft.vocab_size} but {p.draft.path}/config.json says vocab_size={v}; fix "
      "draft.vocab_size (or drop it: the checkpoint decides)", SRC,
      message_args=lambda p: {"v": _cfg_vocab(p, "draft.path")}),
    R("CK-DRAFT-TARGET", "error", ("draft.path", "target.path"),
      lambda p: draft_target_mismatch(p) is not None,
      "draft.path={p.draft.path} was trained for another target than target.path={p.target.path} ({why}); "
      "use a method that needs no trained drafter (method=ngram or method=suffix) or a drafter trained for "
      "this target", SRC, message_args=lambda p: {"why": draft_target_mismatch(p)}),
)

def _version() -> str:
    from specc import __version__

    return f"specc=={__version__}"


PROFILE = Profile(name="checkpoint", version=_version(), root="", rules=RULES)
