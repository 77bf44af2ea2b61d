"""Self-distillation data on disk and in memory: shards of sequences with target features and labels.

A **shard** is ``<name>.safetensors`` plus ``<name>.json`` written atomically (temporary file, then
rename), so a stopped run leaves only whole shards and can resume. Tensors of a shard of ``n``
sequences with lengths ``T_i`` (positions with a label), ``P = sum T_i``:

* ``tokens`` int32 ``[P + n]``: sequence ``i`` is ``T_i + 1`` tokens (prompt, answer, and the token
  after the last labelled position);
* ``labels`` int32 ``[P]``: the target's argmax at each position (what it emits next), ``-1`` where
  not computed (prompt positions before the last one);
* ``offsets`` int64 ``[n + 1]``: sequence ``i`` holds positions ``offsets[i]:offsets[i+1]`` of
  ``labels`` and the features (and ``offsets[i] + i`` onwards of ``tokens``);
* ``prompt_len`` int64 ``[n]``; ``h<layer>`` fp16 ``[P, H]``: target hidden states, ``layer < L`` the
  output of decoder layer ``layer``, ``layer == L`` the final-norm output (``specc.models.llama``).

The JSON sidecar holds per-sequence ``ids``, ``categories``, ``sources``, ``finished`` (answer ended
with EOS), the ``kind`` (``distill``: the target's own greedy answers; ``teacher``: real text, prefill
only), the layers, the target, timings and the command that made it.
"""
from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

import torch


def write_shard(path: pathlib.Path, records: Sequence[dict], layers: Sequence[int], meta: dict) -> None:
    """Write ``records`` (dicts with ``tokens [T+1]``, ``labels [T]``, ``prompt_len``, ``feats
    {layer: [T, H]}``, ``id``, ``category``, ``source``, ``finished``) as one shard at ``path``
    (without suffix), atomically."""
    from safetensors.torch import save_file

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = [int(r["labels"].shape[0]) for r in records]
    offsets = torch.zeros(len(records) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    tensors = {
        "tokens": torch.cat([r["tokens"].to(torch.int32).cpu() for r in records]),
        "labels": torch.cat([r["labels"].to(torch.int32).cpu() for r in records]),
        "offsets": offsets,
        "prompt_len": torch.tensor([int(r["prompt_len"]) for r in records], dtype=torch.int64),
    }
    for layer in layers:
        tensors[f"h{layer}"] = torch.cat([r["feats"][layer].to(torch.float16).cpu() for r in records]).contiguous()
    side = dict(meta)
    side.update({"ids": [r["id"] for r in records], "categories": [r.get("category", "") for r in records],
                 "sources": [r.get("source", "") for r in records],
                 "finished": [bool(r.get("finished", True)) for r in records],
                 "positions": int(offsets[-1]), "layers": list(layers),
                 "answer_tokens": int(sum(n - r["prompt_len"] + 1 for n, r in zip(lengths, records)))})
    tmp = path.with_name(path.name + ".tmp.safetensors")
    save_file(tensors, str(tmp))
    tmp_json = path.with_name(path.name + ".tmp.json")
    tmp_json.write_text(json.dumps(side) + "\n")
    os.replace(tmp, path.with_suffix(".safetensors"))
    os.replace(tmp_json, path.with_suffix(".json"))


def shard_paths(directory: pathlib.Path) -> List[pathlib.Path]:
    """The complete shards under ``directory`` (paths without suffix), sorted."""
    d = pathlib.Path(directory)
    return sorted(p.with_suffix("") for p in d.glob("*.json")
                  if not p.name.endswith(".tmp.json") and p.with_suffix(".safetensors").is_file())


def shard_meta(path: pathlib.Path) -> dict:
    return json.loads(pathlib.Path(path).with_suffix(".json").read_text())


def done_ids(directory: pathlib.Path) -> set:
    """Prompt ids already in a complete shard of ``directory`` (to resume a stopped run)."""
    return {i for p in shard_paths(directory) for i in shard_meta(p)["ids"]}


@dataclass
class SeqSet:
    """Sequences of one or more shards in memory, only the feature layers asked for.

    ``tokens`` int64 ``[P + n]``, ``labels`` int64 ``[P]``, ``offsets`` int64 ``[n + 1]``,
    ``prompt_len`` int64 ``[n]``, ``feats {layer: fp16 [P, H]}``, ``meta``: per sequence ``{id,
    category, source, kind, finished}``; ``parts``: the shards' sidecars (without the per-sequence lists).
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    prompt_len: torch.Tensor
    feats: Dict[int, torch.Tensor]
    meta: List[dict]
    parts: List[dict] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])

    def length(self, i: int) -> int:
        """Labelled positions ``T_i`` of sequence ``i``."""
        return int(self.offsets[i + 1] - self.offsets[i])

    def seq(self, i: int, start: int = 0):
        """Sequence ``i`` from position ``start``: ``tokens [T-start+1]``, ``labels [T-start]``,
        ``feats {layer: [T-start, H]}`` (views)."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return (self.tokens[a + i + start: b + i + 1], self.labels[a + start: b],
                {k: v[a + start: b] for k, v in self.feats.items()})

    def answer_positions(self) -> int:
        return int(sum(self.length(i) - int(self.prompt_len[i]) + 1 for i in range(len(self))))

    def subset(self, idx: Sequence[int]) -> "SeqSet":
        """A new set of sequences ``idx`` (copies)."""
        idx = list(idx)
        lengths = [self.length(i) for i in idx]
        offsets = torch.zeros(len(idx) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        toks, labs = [], []
        feats = {k: [] for k in self.feats}
        for i in idx:
            t, lab, f = self.seq(i)
            toks.append(t)
            labs.append(lab)
            for k in feats:
                feats[k].append(f[k])
        return SeqSet(torch.cat(toks) if toks else self.tokens[:0], torch.cat(labs) if labs else self.labels[:0],
                      offsets, self.prompt_len[idx].clone(),
                      {k: (torch.cat(v) if v else self.feats[k][:0]) for k, v in feats.items()},
                      [self.meta[i] for i in idx], self.parts)


def load(paths: Iterable[pathlib.Path], layers: Sequence[int], kinds: Optional[Sequence[str]] = None,
         limit_positions: Optional[int] = None, context: Optional[int] = None) -> SeqSet:
    """Concatenate shards (reading only ``h<layer>`` for ``layers``; shards of another ``kind`` than
    ``kinds`` are skipped). ``context``: keep only the last ``context`` prompt positions of each
    sequence (the attention context a drafter is trained with; saves memory). Raises ``ValueError``
    naming the shard that lacks a layer."""
    from safetensors import safe_open

    toks, labs, offs, plen, meta, parts = [], [], [], [], [], []
    feats: Dict[int, list] = {int(k): [] for k in layers}
    base = 0
    for p in paths:
        side = shard_meta(p)
        if kinds is not None and side.get("kind") not in kinds:
            continue
        missing = [k for k in layers if k not in side["layers"]]
        if missing:
            raise ValueError(f"{p}.safetensors has no hidden states of layer(s) {missing} (it holds {side['layers']}); "
                             f"re-run `specc train distill` with a recipe whose kinds read them")
        with safe_open(str(p.with_suffix(".safetensors")), framework="pt") as f:
            o = f.get_tensor("offsets")
            t, lab, pl = f.get_tensor("tokens").long(), f.get_tensor("labels").long(), f.get_tensor("prompt_len")
            fs = {k: f.get_tensor(f"h{k}") for k in feats}
        if context is not None:
            o, t, lab, pl, fs = _cut_context(o, t, lab, pl, fs, int(context))
        toks.append(t)
        labs.append(lab)
        offs.append(o[:-1] + base)
        plen.append(pl)
        for k in feats:
            feats[k].append(fs[k])
        base += int(o[-1])
        n = len(side["ids"])
        meta += [{"id": side["ids"][j], "category": side["categories"][j], "source": side["sources"][j],
                  "finished": side["finished"][j], "kind": side.get("kind", "distill")} for j in range(n)]
        parts.append({k: v for k, v in side.items() if k not in ("ids", "categories", "sources", "finished")}
                     | {"shard": p.name, "sequences": n})
        if limit_positions and base >= limit_positions:
            break
    if not toks:
        raise ValueError("no data shards to load (run `specc train distill` first)")
    offsets = torch.cat(offs + [torch.tensor([base])])
    return SeqSet(torch.cat(toks), torch.cat(labs), offsets, torch.cat(plen),
                  {k: torch.cat(v) for k, v in feats.items()}, meta, parts)


def _cut_context(offsets, tokens, labels, prompt_len, feats, context: int):
    """Drop all but the last ``context`` prompt positions of every sequence of one shard."""
    n = prompt_len.shape[0]
    starts = (prompt_len - context).clamp(min=0)
    keep_pos, keep_tok, new_len = [], [], []
    for i in range(n):
        a, b = int(offsets[i]), int(offsets[i + 1])
        s = int(starts[i])
        keep_pos.append(torch.arange(a + s, b))
        keep_tok.append(torch.arange(a + i + s, b + i + 1))
        new_len.append(b - a - s)
    pos, tok = torch.cat(keep_pos), torch.cat(keep_tok)
    o = torch.zeros(n + 1, dtype=torch.int64)
    o[1:] = torch.cumsum(torch.tensor(new_len, dtype=torch.int64), 0)
    return o, tokens[tok], labels[pos], prompt_len - starts, {k: v[pos] for k, v in feats.items()}
