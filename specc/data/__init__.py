"""The shipped prompt set, ``prompts.jsonl`` (read it with :func:`specc.runtime.prompts.read_prompts`).

``prompts.jsonl`` holds 60 prompts written for this project, 10 in each of Spec-Bench's six categories
(Xia et al. 2024, ACL Findings, arXiv:2401.07851; hemingkx/Spec-Bench): multi_turn (a ``messages`` chat list with earlier turns), translation,
summarization (the source article is inside the prompt), qa, math_reasoning and rag (a context
passage plus a question). Summarization and rag prompts carry their source text so prompt lookup
(n-gram drafting) has something to copy. One JSON object per line: ``{"id", "category", "prompt"}``
or ``{"id", "category", "messages"}``.
"""
from pathlib import Path

__all__ = ["CATEGORIES", "PROMPTS_FILE"]

PROMPTS_FILE = Path(__file__).with_name("prompts.jsonl")
CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
