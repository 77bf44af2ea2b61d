"""The block drafters' teacher-forcing passages (data/train_passages*.jsonl.gz) share no 8-word span
with the shipped evaluation prompts either (their prompt file is covered by
tests/test_train_prompts_held_out.py, which reads every data/train_prompts*.jsonl)."""
import gzip
import json

from test_train_prompts_held_out import ROOT, _ngrams, _texts


def test_passages_share_no_text_with_the_shipped_set():
    files = sorted((ROOT / "data").glob("train_passages*.jsonl.gz"))
    assert files, "data/train_passages*.jsonl.gz missing"
    shipped = {g for _, text in _texts(ROOT / "specc" / "data" / "prompts.jsonl") for g in _ngrams(text)}
    shared = []
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                if _ngrams(" ".join(m["content"] for m in row["messages"])) & shipped:
                    shared.append((f.name, row["id"]))
    assert not shared, shared[:5]
