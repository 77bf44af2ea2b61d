"""Training prompts in Spec-Bench's six categories, built from the corpora of :mod:`specc.train.corpora`.

Categories and what each is made of (every prompt carries its ``category`` and ``source``):

* ``multi_turn``: real chat turns from ``chitchat`` (user / assistant / user), and round-2 prompts
  (:func:`follow_up_prompts`) that put the target's own answer to a round-1 prompt in the assistant
  turn and ask a follow-up.
* ``translation``: single sentences to translate, German/French/Spanish/Italian -> English
  (``trans_de_en``, ``debian_handbook``, ``fortunes_*``) and English -> German/French/Spanish
  (English sides of ``trans_de_en`` and ``debian_handbook``, ``wordnet`` examples, ``chitchat``).
* ``summarization``: "summarize" instructions over a source text of 80..350 words (handbook sections,
  Python documentation, LibreOffice help pages, chitchat conversations).
* ``qa``: questions without context: real chat questions (``chitchat``), the Python FAQ's questions,
  and questions about common words (``wordnet``).
* ``math_reasoning``: word problems drawn by reasoning-gym's GSM-style generators.
* ``rag``: answering from a given text: the Python FAQ (question + its answer as the text), handbook
  and LibreOffice passages and chat transcripts with questions about them.

The instruction wordings are our own. The shipped evaluation prompts (``specc/data/prompts.jsonl``)
are never read here; ``tests/train/test_train_prompts_held_out.py`` checks that no committed training
prompt shares an 8-word span with them.

Teacher forcing (:func:`reference_pairs`): prompts of the same categories whose answer is real text
(the English side of a translation pair, a GSM worked solution, a Python FAQ answer, a real chat
reply), for prefill-only data.
"""
from __future__ import annotations

import random
import re
from typing import Callable, Dict, List, Optional, Sequence

from specc.train import corpora as C

CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")

LANG = {"de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "en": "English"}

TRANSLATE_ASKS = [
    "Translate {s} to {t}: {x}", "Translate {s} to {t}: {x}", "Translate {s} to {t}: {x}",
    "Translate this {s} sentence into {t}: {x}", "Please translate from {s} into {t}:\n\n{x}",
    "How do you say this in {t}? {x}", "{s} to {t}: {x}", "Can you translate this into {t}?\n{x}",
    "Translate into {t}: \"{x}\"",
]

SUMMARY_ASKS = [
    "Summarize this text in three sentences.\n\n{d}", "Write a short summary of the following passage.\n\n{d}",
    "Summarize the text below in two sentences.\n\n{d}", "Give me a brief summary of this:\n\n{d}",
    "Sum up the following text in three sentences.\n\n{d}", "What is this passage about? Summarize it briefly.\n\n{d}",
    "Please summarize:\n\n{d}", "Write a three-sentence summary of the text below.\n\n{d}",
    "Summarize the following in one paragraph.\n\n{d}",
]
CONVERSATION_SUMMARY_ASKS = [
    "Summarize this conversation in three sentences.\n\n{d}", "What did these two people talk about? Summarize briefly.\n\n{d}",
    "Write a short summary of the chat below.\n\n{d}",
]

RAG_ASKS = [
    "Use only the text below to answer the question.\n\nText:\n{d}\n\nQuestion: {q}",
    "Read the text and answer the question that follows.\n\nText:\n{d}\n\nQuestion: {q}",
    "Based on the passage below, answer the question.\n\nPassage:\n{d}\n\nQuestion: {q}",
    "Context:\n{d}\n\nAnswer this question from the context above: {q}",
    "Here is a text.\n\n{d}\n\nQuestion: {q}\nAnswer from the text only.",
]
RAG_QUESTIONS = [
    "What does the text say about {k}?", "According to the text, what is {k}?", "How does the text describe {k}?",
    "Why does the text mention {k}?", "What is the main point of the text?", "What should the reader do, according to the text?",
    "Which two facts does the text give about {k}?", "What is {k} used for, according to the passage?",
    "Does the text say anything about {k}? Explain.",
]
CHAT_RAG_QUESTIONS = [
    "What are the two people talking about?", "What does the second person say about themselves?",
    "What plans or interests are mentioned in the conversation?", "How does the first person feel, according to the chat?",
    "What question does the first person ask, and what is the answer?",
]

QA_WORD_ASKS = [
    "What is {a} {w}?", "What is {a} {w} used for?", "Explain what {a} {w} is in two sentences.",
    "Why is {a} {w} important?", "Can you describe {a} {w}?", "What does the word \"{w}\" mean?",
    "Give me two facts about {w}.", "How would you explain {w} to a child?",
]
MATH_SUFFIXES = ["Explain your steps.", "Explain your steps.", "Show your working.", "Think step by step.",
                 "Show how you got the answer.", ""]
FOLLOW_UPS = [
    "Can you make that shorter?", "Thanks! Can you give me an example?", "Now explain it to a six-year-old.",
    "What is the most important point?", "Can you put that in a list?", "Why is that?",
    "Can you say more about the first point?", "Now write it more formally.", "What should I do first?",
    "Is there anything I should avoid?", "Summarize your answer in one sentence.", "Thanks. What else should I know?",
    "Tell me two more facts about it.", "Can you rewrite that for a teenager?", "Great, can you add a short title?",
    "That helps. How long would that take?", "Can you give me three more ideas?", "Now translate your answer into French.",
]
TASK_ASKS = [
    "Write a short poem about {a} {w}.", "Give me three tips for choosing {a} {w}.", "Write a two-sentence story about {a} {w}.",
    "Suggest a name for a shop that sells {ws}.", "Write an email to a friend about {a} {w} you saw.",
    "What are the pros and cons of {ws}?", "Write a one-paragraph description of {a} {w}.", "Tell me a fun fact about {ws}.",
    "List four things people do with {ws}.", "Write a short product description for {a} {w}.",
]


_QUESTION = re.compile(r"(What|How|Why|Who|Where|When|Which|Do|Does|Did|Is|Are|Can|Could|Would|Should|Have|Has)\b")


def _article(w: str) -> str:
    return "an" if w[:1] in "aeiou" else "a"


def _plural(w: str) -> str:
    if w.endswith(("s", "x", "ch", "sh")):
        return w + "es"
    if w.endswith("y") and w[-2:-1] not in "aeiou":
        return w[:-1] + "ies"
    return w + "s"


def _user(text: str) -> List[dict]:
    return [{"role": "user", "content": text}]


class Builder:
    """Seeded prompt maker over a corpus cache; readers are loaded lazily and kept.

    ``make(category, n)`` returns ``n`` prompt rows ``{"id", "category", "source", "messages"}``
    (distinct texts), drawing sources round-robin with the weights of :data:`MIX`."""

    def __init__(self, cache, seed: int):
        self.cache = cache
        self.rng = random.Random(seed)
        self._memo: Dict[str, object] = {}

    def _get(self, key: str, fn: Callable):
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    # ---------------------------------------------------------------- corpora views
    def chat(self):
        return self._get("chat", lambda: C.chitchat_conversations(self.cache))

    def chat_questions(self):
        def make():
            qs = [t for c in self.chat() for t in c if _QUESTION.match(t) and t.endswith("?") and 5 <= C.words(t) <= 30
                  and "http" not in t and len(C.sentences(t)) == 1]
            return sorted(set(qs))
        return self._get("chat_q", make)

    def nouns(self):
        return self._get("nouns", lambda: C.wordnet_common(self.cache, "noun", 1))

    def handbook(self, lang):
        return self._get(f"hb_{lang}", lambda: C.handbook_paragraphs(self.cache, lang))

    def sentences_of(self, texts: Sequence[str], lo=6, hi=35) -> List[str]:
        out = []
        for t in texts:
            out += [s for s in C.sentences(t) if lo <= C.words(s) <= hi and not re.search(r"[<>{}|=#$]|\w\.\w+/", s)]
        return out

    def translation_pool(self, lang: str) -> List[tuple]:
        """``[(source_name, sentence)]`` in ``lang``."""
        def make():
            pool = []
            if lang == "de":
                pool += [("trans_de_en", d) for d, _ in C.trans_de_en_pairs(self.cache)]
            if lang in ("de", "fr", "es", "it"):
                pool += [("debian_handbook", s) for s in self.sentences_of([x for _, _, x in self.handbook(lang)])]
            if lang in ("de", "es", "it"):
                pool += [(f"fortunes_{lang}", f) for f in C.fortunes(self.cache, lang) if 6 <= C.words(f) <= 35]
            if lang == "en":
                pool += [("trans_de_en", e) for _, e in C.trans_de_en_pairs(self.cache) if "/" not in e]
                pool += [("debian_handbook", s) for s in self.sentences_of([e for _, e, _ in self.handbook("en")])]
                pool += [("wordnet", x[0].upper() + x[1:] + ".") for _, _, _, ex in C.wordnet_entries(self.cache)
                         for x in ex if 7 <= C.words(x) <= 30]
                pool += [("chitchat", t) for c in self.chat() for t in c
                         if 8 <= C.words(t) <= 30 and t[-1:] in ".!?" and "http" not in t]
            return pool
        return self._get(f"tr_{lang}", make)

    def documents(self) -> Dict[str, List[tuple]]:
        """``{source: [(source, text)]}`` of 80..350 words: runs of consecutive paragraphs of one page
        (handbook, Python documentation) or a whole LibreOffice help page."""
        def make():
            docs = []
            for src, items in (("debian_handbook", [(p, e) for p, e, _ in self.handbook("en")]),
                               ("python_doc", C.python_doc_paragraphs(self.cache))):
                cur, page = [], None
                for pg, text in items:
                    if pg != page or C.words(" ".join(cur)) >= 220:
                        if 80 <= C.words(" ".join(cur)) <= 350:
                            docs.append((src, "\n\n".join(cur)))
                        cur, page = [], pg
                    cur.append(text)
                if 80 <= C.words(" ".join(cur)) <= 350:
                    docs.append((src, "\n\n".join(cur)))
            lo = [("libreoffice_help_en", t) for _, t in C.libreoffice_paragraphs(self.cache) if 80 <= C.words(t) <= 350]
            return {"debian_handbook": [d for d in docs if d[0] == "debian_handbook"],
                    "python_doc": [d for d in docs if d[0] == "python_doc"], "libreoffice_help_en": lo}
        return self._get("docs", make)

    def document(self) -> tuple:
        """One ``(source, text)`` document: handbook 45 %, Python documentation 30 %, LibreOffice 25 %."""
        docs = self.documents()
        src = self.rng.choices(["debian_handbook", "python_doc", "libreoffice_help_en"], weights=[45, 30, 25])[0]
        return self.rng.choice(docs[src])

    def transcripts(self, lo=60, hi=300) -> List[str]:
        def make():
            out = []
            for c in self.chat():
                lines, n = [], 0
                for i, t in enumerate(c):
                    lines.append(f"{'A' if i % 2 == 0 else 'B'}: {t}")
                    n += C.words(t)
                    if n >= lo:
                        break
                if lo <= n <= hi:
                    out.append("\n".join(lines))
            return out
        return self._get(f"transcripts_{lo}_{hi}", make)

    # ---------------------------------------------------------------- categories
    def make(self, category: str, n: int) -> List[dict]:
        fn = getattr(self, f"_{category}")
        rows, seen = [], set()
        tries = 0
        while len(rows) < n and tries < 20 * n + 100:
            tries += 1
            source, messages = fn()
            key = "\n".join(m["content"] for m in messages)
            if key in seen:
                continue
            seen.add(key)
            rows.append({"id": f"{category}-{len(rows):05d}", "category": category, "source": source,
                         "messages": messages})
        return rows

    def _multi_turn(self):
        r = self.rng
        while True:
            c = r.choice(self.chat())
            if len(c) < 3:
                continue
            i = r.randrange(0, len(c) - 2)
            a, b, q = c[i], c[i + 1], c[i + 2]
            if all(3 <= C.words(t) <= 60 for t in (a, b, q)) and "http" not in a + b + q:
                msgs = [{"role": "user", "content": a}, {"role": "assistant", "content": b},
                        {"role": "user", "content": q}]
                return "chitchat", msgs

    def _translation(self):
        r = self.rng
        x = r.random()
        if x < 0.65:
            s = r.choices(["de", "fr", "es", "it"], weights=[0.45, 0.2, 0.2, 0.15])[0]
            t = "en"
        else:
            s, t = "en", r.choice(["de", "fr", "es"])
        src, sent = r.choice(self.translation_pool(s))
        return src, _user(r.choice(TRANSLATE_ASKS).format(s=LANG[s], t=LANG[t], x=sent))

    def _summarization(self):
        r = self.rng
        if r.random() < 0.2:
            return "chitchat", _user(r.choice(CONVERSATION_SUMMARY_ASKS).format(d=r.choice(self.transcripts(100, 320))))
        src, doc = self.document()
        return src, _user(r.choice(SUMMARY_ASKS).format(d=doc))

    def _qa(self):
        r = self.rng
        x = r.random()
        if x < 0.45:
            return "chitchat", _user(r.choice(self.chat_questions()))
        if x < 0.55:
            return "python_doc", _user(r.choice(self._get("faq", lambda: C.python_faq(self.cache)))[0])
        w = r.choice(self.nouns())[0]
        return "wordnet", _user(r.choice(QA_WORD_ASKS).format(a=_article(w), w=w))

    def _math_reasoning(self):
        r = self.rng
        gens = self._get("gsm", lambda: C.gsm_generators(self.cache))
        task = r.choice(list(gens))
        ex = gens[task](random.Random(r.randrange(1 << 30)), 1.0)
        suffix = r.choice(MATH_SUFFIXES)
        return "reasoning_gym", _user((ex["question"].strip() + " " + suffix).strip())

    def _rag(self):
        r = self.rng
        x = r.random()
        faq = self._get("faq", lambda: C.python_faq(self.cache))
        if x < 0.1:
            q, a = r.choice(faq)
            return "python_doc", _user(r.choice(RAG_ASKS).format(d=a, q=q))
        if x < 0.3:
            return "chitchat", _user(r.choice(RAG_ASKS).format(d=r.choice(self.transcripts(60, 220)),
                                                               q=r.choice(CHAT_RAG_QUESTIONS)))
        src, doc = self.document()
        kws = _keywords(doc)
        q = r.choice(RAG_QUESTIONS)
        if "{k}" in q and not kws:
            q = "What is the main point of the text?"
        return src, _user(r.choice(RAG_ASKS).format(d=doc, q=q.format(k=r.choice(kws) if kws else "")))

    def tasks(self, n: int) -> List[dict]:
        """``n`` short task requests about common nouns (the first turns of round-2 multi-turn prompts)."""
        rows = []
        for i in range(n):
            w = self.rng.choice(self.nouns())[0]
            text = self.rng.choice(TASK_ASKS).format(a=_article(w), w=w, ws=_plural(w))
            rows.append({"id": f"task-{i:05d}", "category": "task", "source": "wordnet", "messages": _user(text)})
        return rows


_STOP = set("the a an and or of to in on for with by is are was were be it this that these those as at from "
            "you your can will not if when which what how also there their its into may more than other".split())


def _keywords(text: str) -> List[str]:
    """Candidate topics of a passage: its most repeated content words (5+ letters), case kept as
    first seen; at most six."""
    counts: Dict[str, int] = {}
    first: Dict[str, str] = {}
    for t in re.findall(r"[A-Za-z][A-Za-z\-]{4,}", text):
        k = t.lower()
        if k in _STOP:
            continue
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, t)
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    return [first[k] if first[k][1:].islower() and not first[k][0].isupper() else first[k] for k in ranked[:6]]


def build_round1(cache, counts: Dict[str, int], seed: int, tasks: int = 0) -> List[dict]:
    """Round-1 prompts: ``counts[category]`` prompts per category (+ ``tasks`` task requests for the
    round-2 follow-ups), seeded; ids are unique within the list. Raises ``KeyError`` for an unknown
    category."""
    rows = []
    for cat in counts:
        if cat not in CATEGORIES:
            raise KeyError(f"unknown prompt category {cat!r}; known: {', '.join(CATEGORIES)}")
    for i, cat in enumerate(counts):
        rows += Builder(cache, seed * 1000 + i).make(cat, int(counts[cat]))
    if tasks:
        rows += Builder(cache, seed * 1000 + 99).tasks(tasks)
    return rows


def follow_up_prompts(answered: Sequence[dict], n: int, seed: int) -> List[dict]:
    """Round-2 ``multi_turn`` prompts: a round-1 prompt, the target's own answer as the assistant turn
    (``answered = [{"id", "messages", "answer", "finished"}]``, answers of 8..200 words), then a
    follow-up request. At most ``n`` prompts, seeded."""
    rng = random.Random(seed)
    pool = [a for a in answered if 8 <= C.words(a["answer"]) <= 200 and len(a["messages"]) == 1]
    rng.shuffle(pool)
    out = []
    for a in pool[:n]:
        answer = a["answer"].strip()
        if not a.get("finished", True):  # cut by max_new: end the turn at the last full sentence
            sents = C.sentences(answer)
            answer = " ".join(sents[:-1]) if len(sents) > 1 else answer
        msgs = list(a["messages"]) + [{"role": "assistant", "content": answer},
                                      {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
        out.append({"id": f"multi_turn-r2-{len(out):05d}", "category": "multi_turn", "source": f"target+{a['source']}",
                    "from": a["id"], "messages": msgs})
    return out


def reference_pairs(cache, n: int, seed: int) -> List[dict]:
    """``n`` prompts with a real-text answer (``"reference"``) for teacher forcing, spread over
    translation (German -> English, Ding and handbook pairs), math (GSM worked solutions), QA and
    RAG (Python FAQ answers), chat replies (chitchat) and word meanings (WordNet)."""
    rng = random.Random(seed)
    b = Builder(cache, seed)
    pairs_de = C.trans_de_en_pairs(cache)
    hb = {lang: [(e, x) for _, e, x in b.handbook(lang) if 6 <= C.words(e) <= 60] for lang in ("de", "fr", "es", "it")}
    faq = C.python_faq(cache)
    gens = C.gsm_generators(cache)
    chat = b.chat()
    out = []
    while len(out) < n:
        x = rng.random()
        if x < 0.3:
            lang = rng.choice(["de", "de", "fr", "es", "it"])
            if lang == "de" and rng.random() < 0.6:
                src, (xx, ref) = "trans_de_en", rng.choice(pairs_de)
            else:
                src, (ref, xx) = "debian_handbook", rng.choice(hb[lang])
            cat, msgs = "translation", _user(rng.choice(TRANSLATE_ASKS).format(s=LANG[lang], t="English", x=xx))
        elif x < 0.5:
            ex = gens[rng.choice(list(gens))](random.Random(rng.randrange(1 << 30)), 1.0)
            if "answer_cot" not in ex:
                continue
            cot = re.sub(r"\n?#### .*$", "", ex["answer_cot"].strip())
            ref = cot + f"\nThe answer is {ex['answer']}."
            src, cat = "reasoning_gym", "math_reasoning"
            msgs = _user((ex["question"].strip() + " " + rng.choice(MATH_SUFFIXES)).strip())
        elif x < 0.6:
            q, ref = rng.choice(faq)
            src = "python_doc"
            if rng.random() < 0.5:
                cat, msgs = "qa", _user(q)
            else:
                cat, msgs = "rag", _user(rng.choice(RAG_ASKS).format(d=ref, q=q))
        elif x < 0.85:
            c = rng.choice(chat)
            if len(c) < 2:
                continue
            i = rng.randrange(0, len(c) - 1)
            if not (3 <= C.words(c[i]) <= 60 and 3 <= C.words(c[i + 1]) <= 80):
                continue
            src, cat, msgs, ref = "chitchat", "multi_turn", _user(c[i]), c[i + 1]
        else:
            w, d, ex = rng.choice(b.nouns())
            ref = f"{_article(w).capitalize()} {w} is {d}." + (f" For example: \"{ex[0]}\"." if ex else "")
            src, cat, msgs = "wordnet", "qa", _user(f"What is {_article(w)} {w}?")
        out.append({"id": f"ref-{len(out):05d}", "category": cat, "source": src, "messages": msgs, "reference": ref})
    return out
