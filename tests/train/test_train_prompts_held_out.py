"""The drafters' training prompts share no text with the shipped evaluation set (specc/data/prompts.jsonl),
so tools/bench_eagle.py and tools/eagle_transfer.py on the shipped set are held-out measurements.

Every committed prompt file of every data recipe (conf/train/data/*.yaml -> <prompt_dir>/*.jsonl.gz:
round 1, round 2 and the teacher-forcing set with its reference answers) is checked, and every corpus a
recipe names must occur in them, so a new source cannot slip in unchecked."""
import gzip
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NGRAM = 8  # words: longer than any stock phrase two independent prompts would share


def _ngrams(text: str):
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {" ".join(words[i: i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def _shipped():
    out = {}
    for line in (ROOT / "specc" / "data" / "prompts.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            msgs = row.get("messages") or [{"content": row.get("prompt", "")}]
            for g in _ngrams(" ".join(m["content"] for m in msgs)):
                out.setdefault(g, row["id"])
    return out


def _recipes():
    from specc.train.recipe import load_data_recipe
    return [load_data_recipe(str(p)) for p in sorted((ROOT / "conf" / "train" / "data").glob("*.yaml"))]


@pytest.mark.parametrize("recipe", _recipes(), ids=lambda r: r.name)
def test_training_prompts_share_no_text_with_the_shipped_set(recipe):
    files = sorted((ROOT / recipe.prompt_dir).glob("*.jsonl.gz"))
    assert files, f"{recipe.prompt_dir}/*.jsonl.gz missing: run `specc train prompts {recipe.name}`"
    shipped = _shipped()
    shared, sources, n = [], set(), 0
    for f in files:
        with gzip.open(f, "rt") as fh:
            for line in fh:
                row = json.loads(line)
                n += 1
                sources |= set(row.get("source", "").replace("target+", "").split("+"))
                text = " ".join(m["content"] for m in row["messages"]) + " " + row.get("reference", "")
                hits = sorted(g for g in _ngrams(text) if g in shipped)
                if hits:
                    shared.append((f.name, row["id"], hits[0], shipped[hits[0]]))
    assert n > 0
    assert not shared, f"training prompts sharing {NGRAM}-word spans with the shipped set: {shared[:5]}"
    missing = set(recipe.corpora) - sources
    assert not missing, f"corpora {sorted(missing)} of {recipe.name} occur in no committed prompt file"
