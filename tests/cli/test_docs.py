"""README.md, docs/**/*.md and the READMEs of generated/ and specc/: every repository path they name exists, the README stays short and
keeps the test command CI runs, its command table matches the CLI, and every benchmark page under
docs/results/ equals what tools/render_results.py renders from the committed records."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ([ROOT / "README.md", ROOT / "generated" / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
        + sorted((ROOT / "specc").rglob("README.md")))

#: first components of the paths the documents name from the repository root
TOP = ("specc/", "docs/", "tools/", "tests/", "conf/", "generated/", "examples/", "scripts/", "templates/",
       ".ci/", "data/")

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"\b(?:python3?|bash)\s+((?:tools|scripts|examples)/[\w./-]+)")
PLACEHOLDER = re.compile(r"[<>*{}$…~]|\.\.\.")


def _render_module():
    spec = importlib.util.spec_from_file_location("render_results", ROOT / "tools" / "render_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def named_paths(text: str) -> set[str]:
    """Repository paths a Markdown text names: a code span that is exactly a path from the root
    (``specc/predict/cost.py``, ``docs/results/data/x.json``; spans with placeholders such as ``<hash>`` or
    globs are skipped), and a script a ``python`` / ``bash`` command line runs, in code spans and
    fenced blocks alike."""
    found = set()
    for span in SPAN.findall(FENCE.sub("", text)):
        s = span.strip()
        if " " not in s and s.startswith(TOP) and not PLACEHOLDER.search(s):
            found.add(s.split("::")[0].split(":")[0].rstrip(".,;"))
    for code in FENCE.findall(text) + SPAN.findall(text):
        found.update(m.rstrip(".,;") for m in SCRIPT.findall(code) if not PLACEHOLDER.search(m))
    return found


def linked_paths(doc: Path, text: str) -> set[str]:
    """Relative link targets of ``doc`` (web and in-page links skipped), as paths from the root."""
    out = set()
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        out.add(str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    text = doc.read_text()
    missing = sorted(p for p in named_paths(text) | linked_paths(doc, text)
                     if not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_named_python_name_resolves():
    """``specc.io.compose_yaml_bounded`` or ``python -m specc.methods.draft_model.shallow`` in a document names a
    module or an attribute that exists (code moves must carry the documents along)."""
    bad = {}
    for doc in DOCS:
        text = doc.read_text()
        names = set(re.findall(r"`(specc(?:\.[A-Za-z_]\w*)+)`", text))
        names |= set(re.findall(r"python -m (specc(?:\.[a-z_]\w*)+)", text))
        missing = sorted(n for n in names if not _resolves(n))
        if missing:
            bad[str(doc.relative_to(ROOT))] = missing
    assert not bad, f"names that resolve to no module or attribute: {bad}"
    assert not _resolves("specc.no_such_module") and not _resolves("specc.io.no_such_function")


def test_path_finder_finds_what_it_should():
    text = ("See `specc/predict/cost.py`, `generated/<plan>-<hash>/`, `docs/nope.json`.\n"
            "```bash\nOMP_NUM_THREADS=1 python tools/bench_mtp.py --json x.json\n```\n"
            "[a page](docs/results/tune.md) [web](https://example.com) [anchor](#results)\n")
    assert named_paths(text) == {"specc/predict/cost.py", "docs/nope.json", "tools/bench_mtp.py"}
    assert linked_paths(ROOT / "README.md", text) == {"docs/results/tune.md"}


def test_readme_is_short_and_keeps_the_test_command():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; keep it at 400 or fewer"
    # CI (.ci/run) runs "the README's test command"
    assert "bash tools/test" in lines
    assert "exec bash tools/test" in (ROOT / ".ci" / "run").read_text()


def test_readme_commands_table_matches_the_cli():
    from specc.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Commands"):text.index("## Results")]
    listed = set(re.findall(r"^\| `specc (\w+)", table, re.M))
    assert listed == set(sub.choices), (listed ^ set(sub.choices))


def test_readme_links_every_results_page():
    text = (ROOT / "README.md").read_text()
    results = text[text.index("## Results"):]
    pages = {p.name for p in (ROOT / "docs" / "results").glob("*.md")}
    linked = set(re.findall(r"\(docs/results/([\w.]+\.md)\)", results))
    assert linked == pages, (pages - linked, linked - pages)


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "results").glob("*.md")), ids=lambda p: p.name)
def test_results_page_equals_its_rendering(page):
    text = page.read_text()
    assert _render_module().render_page(text, page.name) == text, (
        f"{page.relative_to(ROOT)} differs from its records; run python tools/render_results.py")


def test_renderer_restores_an_edited_number_and_refuses_bad_blocks():
    render = _render_module()
    page = (ROOT / "docs" / "results" / "mtp.md").read_text()
    rows = json.loads((ROOT / "docs" / "results" / "data" / "bench_mtp.json").read_text())["rows"]
    plain = f"| plain | 0 | 1.00 | – | {rows[0]['decode_tokens_per_s']:.2f} |"
    assert plain in page
    at = page.index("<!-- render: mtp")
    edited = page[:at] + page[at:].replace(plain, "| plain | 0 | 1.00 | – | 99.99 |")
    assert edited != page
    assert render.render_page(edited) == page
    with pytest.raises(SystemExit, match="unknown block kind"):
        render.render_page("<!-- render: nope bench_mtp.json -->\n<!-- /render -->\n")
    with pytest.raises(SystemExit, match="does not exist"):
        render.render_page("<!-- render: header no_such_record.json -->\n<!-- /render -->\n")
    with pytest.raises(SystemExit, match="close every block"):
        render.render_page("<!-- render: header bench_mtp.json -->\nno end\n")


def test_a_benchmark_record_written_under_docs_results_refreshes_its_page(tmp_path, monkeypatch):
    """The benchmark scripts call ``refresh_after_write`` after writing their record: a record in
    ``docs/results/data/`` re-renders the pages; a record written anywhere else touches nothing."""
    render = _render_module()
    data = tmp_path / "docs" / "results" / "data"
    data.mkdir(parents=True)
    rec = json.loads((ROOT / "docs" / "results" / "data" / "bench_mtp.json").read_text())
    rec["rows"][0]["decode_tokens_per_s"] = 12.34
    (data / "bench_mtp.json").write_text(json.dumps(rec))
    page = tmp_path / "docs" / "results" / "mtp.md"
    page.write_text((ROOT / "docs" / "results" / "mtp.md").read_text())
    monkeypatch.setattr(render, "ROOT", tmp_path)
    monkeypatch.setattr(render, "RESULTS", tmp_path / "docs" / "results")
    monkeypatch.setattr(render, "DATA", data)
    assert render.refresh_after_write(tmp_path / "elsewhere.json") == []
    assert "| plain | 0 | 1.00 | – | 12.34 |" not in page.read_text()
    assert render.refresh_after_write(data / "bench_mtp.json") == ["docs/results/mtp.md"]
    assert "| plain | 0 | 1.00 | – | 12.34 |" in page.read_text()
    assert render.refresh_after_write(data / "bench_mtp.json") == []


@pytest.mark.parametrize("script", ["bench_backends", "bench_block", "bench_concurrency", "bench_llamacpp",
                                    "bench_mtp", "bench_serve", "bench_story", "bench_suffix", "bench_suffix_bound",
                                    "bench_tree", "bench_tune", "readme_walk"])
def test_benchmark_scripts_refresh_their_pages_and_name_the_record_folder(script):
    text = (ROOT / "tools" / f"{script}.py").read_text()
    assert '["refresh_after_write"]' in text
    assert "docs/results/" in text and not re.search(r"docs/(?!results/)\w", text)


def test_readme_quickstart_is_one_walkable_story():
    """``tools/readme_walk.py`` runs the Quickstart as written: its commands parse, the plan tune writes is
    the one explain, check and serve take, and the client asks for the served plan by name."""
    spec = importlib.util.spec_from_file_location("readme_walk", ROOT / "tools" / "readme_walk.py")
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    commands, client = walk.quickstart((ROOT / "README.md").read_text())
    assert all(c.startswith("specc ") and "\\" not in c and "#" not in c for c in commands), commands
    tune = next(c for c in commands if c.startswith("specc tune "))
    plan = re.search(r"--out (\S+)\.yaml", tune).group(1)
    serve = next(c for c in commands if c.startswith("specc serve "))
    assert f"specc explain {plan}.yaml" in commands and f"specc serve {plan}.yaml" in serve
    assert f"--file {plan}.launch.sh" in next(c for c in commands if c.startswith("specc check "))
    assert f'model="{plan}"' in client and f"127.0.0.1:{walk.port_of(serve)}/v1" in client


def test_readme_links_every_guide():
    text = (ROOT / "README.md").read_text()
    guides = {p.name for p in (ROOT / "docs" / "guide").glob("*.md")}
    linked = set(re.findall(r"\(docs/guide/([\w.]+\.md)\)", text))
    assert guides <= linked, guides - linked
