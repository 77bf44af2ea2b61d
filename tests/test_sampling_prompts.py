"""The shipped prompt set (the demo's and the benchmark's default input) and its reader."""

import json

import pytest

from specc.data import CATEGORIES, PROMPTS_FILE, load_prompt_set
from specc.errors import PromptError


def test_shipped_prompt_set_covers_spec_bench_categories():
    records = load_prompt_set()
    assert 50 <= len(records) <= 80
    counts = {c: sum(r["category"] == c for r in records) for c in CATEGORIES}
    assert all(8 <= n <= 12 for n in counts.values()), counts
    assert {r["category"] for r in records} == set(CATEGORIES)
    for r in records:
        if r["category"] == "multi_turn":
            roles = [m["role"] for m in r["messages"]]
            assert roles[:2] == ["user", "assistant"] and roles[-1] == "user", r["id"]  # earlier turns
        else:
            assert "prompt" in r, r["id"]
    for r in load_prompt_set(categories=["summarization"]):
        source = r["prompt"].split("\n\n", 1)[1]
        assert 150 <= len(source.split()) <= 300, r["id"]
    for r in load_prompt_set(categories=["rag"]):
        assert "Text:" in r["prompt"] and "Question:" in r["prompt"], r["id"]


def test_shipped_prompts_stay_short():
    """Well inside SmolLM2's 2048-token context: the longest prompt is 298 tokens after the chat
    template (measured once with the GGUF's tokenizer, which takes ~30 s to load, so not per run);
    2,000 characters is a bound that keeps that true (English runs about 4 characters per token)."""
    for r in load_prompt_set():
        text = r["prompt"] if "prompt" in r else "".join(m["content"] for m in r["messages"])
        assert 10 < len(text) < 2000, r["id"]


@pytest.mark.parametrize(
    "line, match",
    [
        ("not json", r"bad\.jsonl:2: not valid JSON"),
        ('{"id": "a", "category": "qa"}', "exactly one of 'prompt'"),
        ('{"id": "a", "category": "qa", "prompt": "x", "messages": []}', "exactly one of 'prompt'"),
        ('{"id": "", "category": "qa", "prompt": "x"}', "field 'id'"),
        ('{"id": "b", "category": "qa", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', "last message"),
        ('{"id": "b", "category": "qa", "messages": [{"role": "bot", "content": "hi"}]}', r"messages\[0\]"),
        ('{"id": "a", "category": "qa", "prompt": "again"}', "duplicate id 'a'"),
    ],
)
def test_bad_prompt_files_name_line_and_field(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(PromptError, match=match):
        load_prompt_set(path)


def test_missing_file_and_unknown_category():
    with pytest.raises(PromptError, match="cannot read prompt file"):
        load_prompt_set("/nonexistent/prompts.jsonl")
    with pytest.raises(PromptError, match="unknown prompt categories"):
        load_prompt_set(PROMPTS_FILE, categories=["poetry"])
