"""Token shards: the committed form of self-distillation data (prompt and answer token ids only).

A drafter fit computes the target's features **online** from these shards (SpecForge's online mode:
the target's forward runs inside the training loop), so the data that grows across runs is a few
MB of token ids, never GB of hidden states.

A shard is ``<name>.npz`` plus ``<name>.json``, both written atomically (temporary file, then
rename), so an interrupted run leaves only whole shards and resumes after them. Arrays of a shard
of ``n`` sequences:

* ``tokens`` ``[sum len_i]`` uint16 (int32 when the vocabulary needs it): sequence ``i`` is its
  prompt (the chat template applied) followed by the target's greedy answer;
* ``offsets`` int64 ``[n + 1]``: sequence ``i`` is ``tokens[offsets[i]:offsets[i+1]]``;
* ``prompt_len`` int32 ``[n]``.

The sidecar holds per-sequence ``ids``, ``categories``, ``sources``, ``finished`` (the answer ended
with an end-of-turn id) and the run's facts: ``kind`` (``distill``: the target's own greedy answer,
so every answer token is the target's argmax after the tokens before it; ``teacher``: a real-text
answer, whose labels a fit takes from the target online), the target, dtype, CPU, timings and the
command.
"""
from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np


def write(path: pathlib.Path, records: Sequence[dict], meta: dict) -> None:
    """Write ``records`` (``{"id", "category", "source", "prompt" [P] ints, "answer" [A] ints,
    "finished"}``) as one shard at ``path`` (no suffix), atomically. Raises ``ValueError`` for an
    empty record list or a negative token id."""
    if not records:
        raise ValueError("a shard needs at least one record")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    seqs = [list(r["prompt"]) + list(r["answer"]) for r in records]
    hi = max(max(s) for s in seqs if s)
    if min(min(s) for s in seqs if s) < 0:
        raise ValueError("token ids must be >= 0")
    dt = np.uint16 if hi <= np.iinfo(np.uint16).max else np.int32
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    arrays = {"tokens": np.concatenate([np.asarray(s, dtype=dt) for s in seqs]), "offsets": offsets,
              "prompt_len": np.asarray([len(r["prompt"]) for r in records], dtype=np.int32)}
    side = dict(meta)
    side.update({"ids": [r["id"] for r in records], "categories": [r.get("category", "") for r in records],
                 "sources": [r.get("source", "") for r in records],
                 "finished": [bool(r.get("finished", True)) for r in records],
                 "sequences": len(records), "tokens": int(offsets[-1]),
                 "answer_tokens": int(sum(len(r["answer"]) for r in records))})
    tmp = path.with_name(path.name + ".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)
    tmp_json = path.with_name(path.name + ".tmp.json")
    tmp_json.write_text(json.dumps(side, ensure_ascii=False) + "\n")
    os.replace(tmp, path.with_suffix(".npz"))
    os.replace(tmp_json, path.with_suffix(".json"))


def paths(directory: pathlib.Path) -> List[pathlib.Path]:
    """The complete shards under ``directory`` (paths without suffix), sorted by name."""
    d = pathlib.Path(directory)
    return sorted(p.with_suffix("") for p in d.glob("*.json")
                  if not p.name.endswith(".tmp.json") and p.with_suffix(".npz").is_file())


def meta(path: pathlib.Path) -> dict:
    """A shard's sidecar."""
    return json.loads(pathlib.Path(path).with_suffix(".json").read_text())


def done_ids(directory: pathlib.Path) -> set:
    """Prompt ids already in a complete shard of ``directory`` (to resume a stopped run)."""
    return {i for p in paths(directory) for i in meta(p)["ids"]}


@dataclass
class TokenSet:
    """Sequences of token shards in memory.

    ``seqs``: per sequence an int64 numpy array (prompt + answer); ``prompt_len``: per sequence;
    ``meta``: per sequence ``{id, category, source, finished, kind, shard}``; ``parts``: the shards'
    sidecars without the per-sequence lists."""

    seqs: List[np.ndarray]
    prompt_len: List[int]
    meta: List[dict]
    parts: List[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    def answer_tokens(self, idx: Optional[Iterable[int]] = None) -> int:
        """Answer tokens of the sequences ``idx`` (default all)."""
        idx = range(len(self)) if idx is None else idx
        return int(sum(len(self.seqs[i]) - self.prompt_len[i] for i in idx))

    def subset(self, idx: Sequence[int]) -> "TokenSet":
        idx = list(idx)
        return TokenSet([self.seqs[i] for i in idx], [self.prompt_len[i] for i in idx],
                        [self.meta[i] for i in idx], self.parts)

    def counts(self) -> Dict[str, Dict[str, int]]:
        """``{category: {"sequences", "answer_tokens"}}``."""
        out: Dict[str, Dict[str, int]] = {}
        for s, p, m in zip(self.seqs, self.prompt_len, self.meta):
            c = out.setdefault(m["category"], {"sequences": 0, "answer_tokens": 0})
            c["sequences"] += 1
            c["answer_tokens"] += len(s) - p
        return dict(sorted(out.items()))


def load(directories: Iterable[pathlib.Path], kinds: Optional[Sequence[str]] = None) -> TokenSet:
    """Every complete shard under ``directories`` (shards of a ``kind`` not in ``kinds`` skipped).
    Raises ``ValueError`` when there is none, naming the directories."""
    seqs, plen, metas, parts = [], [], [], []
    dirs = [pathlib.Path(d) for d in directories]
    for d in dirs:
        for p in paths(d):
            side = meta(p)
            if kinds is not None and side.get("kind") not in kinds:
                continue
            with np.load(p.with_suffix(".npz"), allow_pickle=False) as z:
                tok, off, pl = z["tokens"].astype(np.int64), z["offsets"], z["prompt_len"]
            for j in range(len(pl)):
                seqs.append(tok[off[j]: off[j + 1]])
                plen.append(int(pl[j]))
                metas.append({"id": side["ids"][j], "category": side["categories"][j], "source": side["sources"][j],
                              "finished": side["finished"][j], "kind": side.get("kind", "distill"), "shard": p.name})
            parts.append({k: v for k, v in side.items() if k not in ("ids", "categories", "sources", "finished")}
                         | {"shard": p.name, "dir": d.name})
    if not seqs:
        raise ValueError(f"no token shards under {', '.join(str(d) for d in dirs)} (run `specc train distill` first)")
    return TokenSet(seqs, plen, metas, parts)
