"""Builders for the training-pipeline tests (no tests here): a miniature corpus cache in the layouts
the real packages unpack to, and a byte-level tokenizer with a toy chat template."""
from __future__ import annotations

import json
import pathlib
import textwrap

WORDS = ("the river town opened a new library where people borrow tools and books every week while "
         "volunteers repair bicycles and teach children to read and cook simple meals together").split()


def prose(n_words: int, seed: int) -> str:
    """Deterministic English-like prose of ``n_words`` words in sentences of eight words."""
    out = []
    for i in range(n_words):
        w = WORDS[(i * 7 + seed * 3) % len(WORDS)]
        out.append(w.capitalize() if i % 8 == 0 else w)
        if i % 8 == 7:
            out[-1] += "."
    return " ".join(out).rstrip(".") + "."


def write(root: pathlib.Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def fake_corpora(cache: pathlib.Path) -> pathlib.Path:
    """A corpus cache (``specc train corpora`` layout) with a few items per reader; returns ``cache``."""
    u = cache / "unpacked"
    convs = {f"c{i}": {"messages": [[{"text": t, "sender": s}] for t, s in zip(
        [f"Hello, how are you doing today friend {i}?", "I am fine, I just came back from the market.",
         "What did you buy at the market this morning?", "Some apples, bread and a little cheese for lunch.",
         "Do you like to cook dinner at home with your family?"] * 5, "ab" * 13)]} for i in range(6)}
    write(u, "chitchat/chitchat_dataset/dataset.json", json.dumps(convs))
    write(u, "reasoning_gym/reasoning_gym/utils.py", "def format_number(x):\n    return str(x)\n")
    gen = textwrap.dedent('''
        from reasoning_gym.utils import format_number
        def generate_{n}(rng, difficulty=1.0):
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            return {{"question": f"Ann has {{a}} boxes with {{b}} pens each. How many pens does she have?",
                     "answer": format_number(a * b), "answer_cot": f"{{a}} * {{b}} = {{a * b}}\\n#### {{a * b}}"}}
        ''')
    write(u, "reasoning_gym/reasoning_gym/arithmetic/gsm_symbolic/generators_00_49.py", gen.format(n=0))
    write(u, "reasoning_gym/reasoning_gym/arithmetic/gsm_symbolic/generators_50_99.py", gen.format(n=50))
    write(u, "reasoning_gym/reasoning_gym/arithmetic/gsm_symbolic/gsm_symbolic.py", "tasks_ok = [\n    0,\n    50,\n]\n")
    hb = "debian_handbook/usr/share/doc/debian-handbook/html"
    en = [prose(40, i) for i in range(8)]
    for lang in ("en-US", "de-DE", "fr-FR", "es-ES", "it-IT"):
        paras = [p if (lang == "en-US" or i == 0) else f"{lang} Satz Nummer {i} ist hier. " + p for i, p in enumerate(en)]
        write(u, f"{hb}/{lang}/sect.demo.html", "".join(f'<div class="para">\n{p}\n</div>' for p in paras))
    write(u, "trans_de_en/usr/share/trans/de-en",
          "# Ding\nDer Zug ist heute sehr spät angekommen. :: The train arrived very late today.\n"
          "Haus {n} | Wir gehen morgen zusammen ins Kino. :: house | We are going to the cinema together tomorrow.\n")
    for lang in ("de", "es", "it"):
        write(u, f"fortunes_{lang}/usr/share/games/fortunes/{lang}/demo.u8",
              "\n%\n".join(f"{lang} kurze Geschichte Nummer {i} mit einigen Worten hier." for i in range(4)) + "\n%\n")
    py = "python_doc/usr/share/doc/python3.11/html"
    write(u, f"{py}/faq/general.html", "".join(
        f"<h3>Why is item {i} useful?</h3><p>{prose(30, i)}</p>" for i in range(3)))
    for part in ("tutorial", "howto"):
        write(u, f"{py}/{part}/demo.html", "".join(f"<p>{prose(45, i + 3)}</p>" for i in range(6)))
    wn = "wordnet/usr/share/wordnet"
    nouns = ["library", "bicycle", "kettle", "garden"]
    write(u, f"{wn}/data.noun", "  license header\n" + "".join(
        f'{i:08d} 06 n 01 {w} 0 000 | a thing called {w}; "the {w} was near the river today"  \n'
        for i, w in enumerate(nouns)))
    write(u, f"{wn}/index.noun", "  license header\n" + "".join(f"{w} n 1 0 1 3 {i:08d}  \n" for i, w in enumerate(nouns)))
    for pos in ("verb", "adj", "adv"):
        write(u, f"{wn}/data.{pos}", f'00000001 00 {pos[0]} 01 go 0 000 | move; "we go to the old market every morning"  \n')
    lo = "libreoffice_help_en/usr/share/libreoffice/help/en-US/text/shared"
    for i in range(3):
        write(u, f"{lo}/page{i}.html", f"<p>LibreOffice Help</p><p>{prose(90, i)}</p>"
                                      f"<p>This page is: /text/shared/page{i}.xhp Title is: Page {i}</p>")
    return cache


class TinyTokenizer:
    """Bytes -> ids ``2..V-1`` (at most ``cap`` per text), a toy chat template, EOS id 1."""

    def __init__(self, vocab: int, cap: int = 24):
        self.vocab, self.cap = vocab, cap
        self.eos_token_ids = [1]

    def encode(self, text: str):
        return [2 + b % (self.vocab - 2) for b in text.encode()[: self.cap]]

    def decode(self, ids, skip_special_tokens: bool = False):
        return " ".join(f"w{int(i)}" for i in ids if not (skip_special_tokens and int(i) == 1))

    def apply_chat_template(self, messages, add_generation_prompt: bool = True):
        ids = []
        for m in messages:
            ids += [0] + self.encode(m["content"]) + [1]
        return ids + ([0] if add_generation_prompt else [])
