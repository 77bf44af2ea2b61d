"""The EAGLE heads' training prompts (data/train_prompts*.jsonl) share no text with the shipped evaluation
set (specc/data/prompts.jsonl): tools/bench_eagle.py on the shipped set is a held-out measurement."""
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
NGRAM = 8  # words: longer than any stock phrase two independent prompts would share


def _texts(path: pathlib.Path):
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            msgs = row.get("messages") or [{"content": row.get("prompt", "")}]
            yield row["id"], " ".join(m["content"] for m in msgs)


def _ngrams(text: str):
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {" ".join(words[i: i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def test_training_prompts_share_no_text_with_the_shipped_set():
    train_files = sorted((ROOT / "data").glob("train_prompts*.jsonl"))
    assert train_files, "data/train_prompts*.jsonl missing"
    shipped = {}
    for pid, text in _texts(ROOT / "specc" / "data" / "prompts.jsonl"):
        for g in _ngrams(text):
            shipped.setdefault(g, pid)
    shared = []
    for f in train_files:
        for pid, text in _texts(f):
            hits = {g: shipped[g] for g in _ngrams(text) if g in shipped}
            if hits:
                shared.append((f.name, pid, sorted(hits.items())[:2]))
    assert not shared, f"training prompts sharing {NGRAM}-word spans with the shipped set: {shared[:5]}"
