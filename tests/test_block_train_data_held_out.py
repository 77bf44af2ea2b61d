"""The block drafters' training text — the prompt file and the teacher-forcing passages of
conf/train_block/data_smollm2.yaml (data/train_prompts_block.jsonl, data/train_passages_block.jsonl.gz)
— shares no 8-word span with the shipped evaluation prompts, and every source the data card names
occurs in it."""
import gzip
import json

from test_train_prompts_held_out import ROOT, _ngrams, _shipped


def _rows(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_block_training_text_shares_no_span_with_the_shipped_set():
    shipped = _shipped()
    files = [ROOT / "data" / "train_prompts_block.jsonl", ROOT / "data" / "train_passages_block.jsonl.gz"]
    shared, sources, n = [], set(), 0
    for f in files:
        for row in _rows(f):
            n += 1
            sources.add(row["source"])
            hits = sorted(g for g in _ngrams(" ".join(m["content"] for m in row["messages"])) if g in shipped)
            if hits:
                shared.append((f.name, row["id"], hits[0], shipped[hits[0]]))
    assert n > 1000
    assert not shared, shared[:5]
    from specc.blocktrain.corpora import SOURCES

    assert sources == set(SOURCES), sources
