"""The shipped prompt set (the demo's and the benchmark's default input) and the prompt reader."""

import json

import pytest

from specc.data import CATEGORIES, PROMPTS_FILE
from specc.errors import PromptError
from specc.runtime.prompts import read_prompts


def test_shipped_prompt_set_covers_spec_bench_categories():
    records = read_prompts(PROMPTS_FILE)
    assert 50 <= len(records) <= 80
    counts = {c: sum(r.category == c for r in records) for c in CATEGORIES}
    assert all(8 <= n <= 12 for n in counts.values()), counts
    assert {r.category for r in records} == set(CATEGORIES)
    for r in records:
        if r.category == "multi_turn":
            roles = [m["role"] for m in r.messages]
            assert roles[:2] == ["user", "assistant"] and roles[-1] == "user", r.id  # earlier turns
        else:
            assert r.prompt is not None, r.id
    for r in records:
        if r.category == "summarization":
            source = r.prompt.split("\n\n", 1)[1]
            assert 150 <= len(source.split()) <= 300, r.id
        if r.category == "rag":
            assert "Text:" in r.prompt and "Question:" in r.prompt, r.id


def test_shipped_prompts_stay_short():
    """Well inside SmolLM2's 2048-token context: the longest prompt is 298 tokens after the chat
    template (measured once with the GGUF's tokenizer, which takes ~30 s to load, so not per run);
    2,000 characters is a bound that keeps that true (English runs about 4 characters per token)."""
    for r in read_prompts(PROMPTS_FILE):
        text = r.prompt if r.prompt is not None else "".join(m["content"] for m in r.messages)
        assert 10 < len(text) < 2000, r.id


@pytest.mark.parametrize(
    "line, match",
    [
        ("not json", r"bad\.jsonl:2: not valid JSON"),
        ('{"id": "a", "category": "qa"}', "exactly one of 'prompt'"),
        ('{"id": "a", "category": "qa", "prompt": "x", "messages": []}', "exactly one of 'prompt'"),
        ('{"id": "", "category": "qa", "prompt": "x"}', "field 'id'"),
        ('{"id": "c", "category": "qa", "prompt": ""}', "non-empty string"),
        ('{"id": "b", "category": "qa", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', "last message"),
        ('{"id": "b", "category": "qa", "messages": [{"role": "bot", "content": "hi"}]}', r"messages\[0\]"),
        ('{"id": "a", "category": "qa", "prompt": "again"}', "duplicate id 'a'"),
    ],
)
def test_bad_prompt_files_name_line_and_field(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "fine"}) + "\n" + line + "\n")
    with pytest.raises(PromptError, match=match):
        read_prompts(path)


def test_missing_file():
    with pytest.raises(PromptError, match="prompts file /nonexistent/prompts.jsonl: no such file"):
        read_prompts("/nonexistent/prompts.jsonl")
