"""Refresh the generated blocks of the benchmark pages under ``docs/results/`` from their records.

A page is hand-written Markdown (what the benchmark measures, how to read it, what it found) with
generated blocks between two comment lines::

    <!-- render: header bench_mtp.json -->
    ... replaced by this tool ...
    <!-- /render -->

``header REC`` prints the record's file, the command that wrote it and the CPU it names; the other
block kinds (``RENDERERS`` below) turn one record (``docs/results/data/REC``, the JSON a benchmark
script under ``tools/`` writes with its ``--out`` / ``--json`` option; a REC with a ``/`` is a path
from the repository root, e.g. a shipped cost table) into a table, its numbers exactly as recorded.
Nothing is re-timed here.

Usage::

    python tools/render_results.py            # rewrite every page whose blocks changed
    python tools/render_results.py --check    # exit 1, naming the pages, if any page is stale

Raises ``SystemExit`` with the page and the block when a block names an unknown kind or a record that
does not exist, or a ``<!-- render: ... -->`` line has no closing ``<!-- /render -->``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
DATA = RESULTS / "data"

BLOCK = re.compile(r"(<!-- render: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /render -->)", re.S)


def _rel(name: str) -> str:
    """A record's path from the repository root: a bare name lives in ``docs/results/data/``."""
    return name if "/" in name else f"docs/results/data/{name}"


def _load(name: str) -> dict:
    path = ROOT / _rel(name)
    if not path.is_file():
        raise SystemExit(f"render_results: record {_rel(name)} does not exist; "
                         f"run the benchmark that writes it or fix the block's record name")
    return json.loads(path.read_text())


def _x(v: float | None, nd: int = 2) -> str:
    return "–" if v is None else f"{v:.{nd}f}×"


def _f(v: float | None, nd: int = 1) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def _rates(rs: list) -> str:
    return ", ".join(f"{r:.3f}" for r in rs) if rs else "–"


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _cpu(rec: dict) -> str:
    cpu = rec.get("cpu")
    if cpu is None:
        return "not named in the record (see the CPU line at the top of this page)"
    if isinstance(cpu, str):
        cap = rec.get("torch_capability")
        return f"{cpu}" + (f", torch CPU capability {cap}" if cap else "")
    parts = [cpu.get("model", "?")]
    for key, label in (("hypervisor", "hypervisor"), ("cpus", "CPUs"), ("quantized_kernels", "quantized kernels"),
                       ("torch_cpu_capability", "torch CPU capability"),
                       ("capability", "torch CPU capability"), ("amx", "AMX"), ("threads", "threads")):
        if key in cpu:
            parts.append(f"{label} {cpu[key]}")
    return ", ".join(str(p) for p in parts)


def header(rec_name: str) -> str:
    rec = _load(rec_name)
    cmd = rec.get("command")
    rel = _rel(rec_name)
    link = f"data/{rec_name}" if "/" not in rec_name else f"../../{rec_name}"
    lines = [f"- record: [`{rel}`]({link})"]
    if cmd:
        moved = " (run before the records moved to `docs/results/data/`)" if re.search(
            r"docs/(?!results/)", cmd) else ""
        lines.append(f"- command (as recorded): `{cmd}`{moved}")
    if rec.get("env"):
        lines.append("- environment: " + ", ".join(f"`{k}={v}`" for k, v in rec["env"].items()))
    lines.append(f"- CPU: {_cpu(rec)}")
    if rec.get("time"):
        lines.append(f"- recorded: {rec['time']}")
    return "\n".join(lines)


def llamacpp(rec_name: str) -> str:
    return _load(rec_name)["table"].rstrip("\n")


def tune(rec_name: str) -> str:
    rec = _load(rec_name)
    head = ["C", "plain tok/s (rounds' range)", "best configuration", "its tok/s",
            "tuned plan tok/s (steps per κ)", "tuned / best", "≥ 0.95", "tuned / best, median of rounds"]
    return _table(head, rec["table"])


def concurrency(rec_name: str) -> str:
    rec = _load(rec_name)
    cs = [str(c) for c in rec["concurrency"]]
    rows = [["–", "plain"] + [_f(rec["plain"][c]["decode_tok_s"]) for c in cs]]
    for drafter, scheds in rec["drafters"].items():
        label = "synthetic " + drafter[3:] if drafter.startswith("syn") else drafter
        for sched, by_c in scheds.items():
            if sched == "auto":          # the derived bucket table, not a run
                continue
            rows.append([label, sched.replace("static k=", "static κ = ")] + [
                f"{_f(by_c[c]['decode_tok_s'])} ({_x(by_c[c]['speedup'])})" for c in cs])
    return _table(["drafter", "schedule"] + [f"C = {c}" for c in cs], rows)


def concurrency_suffix(rec_name: str) -> str:
    rec = _load(rec_name)
    cs = [str(c) for c in rec["concurrency"]]
    head = ["schedule"]
    for c in cs:
        head += [f"C = {c} tok/s", "× plain", "τ", "drafts verified per request per step"]
    rows = [["plain"] + sum(([_f(rec["plain"][c]["decode_tok_s"]), "1.00", "1.00", "0"] for c in cs), [])]
    for sched, by_c in rec["drafters"]["suffix"].items():
        rows.append([f"`{sched}`"] + sum(([_f(by_c[c]["decode_tok_s"]), _f(by_c[c]["speedup"], 2),
                                           _f(by_c[c]["tau"], 2), _f(by_c[c]["drafts_per_req"], 2)]
                                          for c in cs), []))
    return _table(head, rows)


def mtp(rec_name: str) -> str:
    rows = [[r["method"], r["kappa"], f"{r['tau']:.2f}", _rates(r["acceptance_per_pos"]),
             f"{r['decode_tokens_per_s']:.2f}", f"{r['speedup']:.2f}", _f(r["draft_ms_per_step"]),
             _f(r["extend_ms_per_step"]), _f(r["step_ms"]),
             f"{r['draft_passes_per_step']:g} / {r['extend_passes_per_step']:g}",
             f"{r['draft_kv_mib']:.1f} MiB", "yes" if r["exact"] else "NO"]
            for r in _load(rec_name)["rows"]]
    return _table(["method", "κ", "τ", "acceptance per position", "decode tok/s", "× plain",
                   "draft ms/step", "extend ms/step", "step ms", "draft / extend passes per step",
                   "draft KV", "output == plain"], rows)


def block(rec_name: str) -> str:
    rows = [[r["method"], r["gamma"], f"{r['tau']:.2f}", _rates(r["acceptance_per_pos"]),
             f"{r['draft_share']:.2f}", f"{r['c']:.3f}", f"{r['tokens_per_s']:.2f}", f"{r['speedup']:.2f}",
             "yes" if r["exact"] else "NO"]
            for r in _load(rec_name)["rows"]]
    return _table(["method", "γ", "τ", "acceptance per position", "draft share", "c", "tok/s", "× plain",
                   "output == plain"], rows)


def tree(rec_name: str) -> str:
    rec = _load(rec_name)
    by_name = {r["name"]: r for r in rec["rows"]}

    def shape(name: str) -> str:
        m = re.search(r"κ=(\d+) topk=(\d+)", name)
        return f"κ {m.group(1)}, topk {m.group(2)}" if m else name

    tvc = [[t["width"], f"{t['chain_tau']:.2f}", shape(t["tree"]), f"{t['tree_tau']:.2f}", f"{t['ratio']:.2f}",
            f"{t['chain_tps']:.1f}", f"{t['tree_tps']:.1f}", f"{by_name[t['tree']]['speedup']:.2f}"]
           for t in rec["tree_vs_chain"]]
    out = _table(["W (verify width)", "EAGLE-3 chain τ", "best EAGLE-3 tree", "tree τ", "τ ratio", "chain tok/s",
                  "tree tok/s", "× plain (tree)"], tvc)
    rows = [[r["name"], r["width"], f"{r['tau']:.3f}", _rates(r["acceptance_by_depth"]),
             f"{r['tokens_per_s']:.2f}", f"{r['speedup']:.3f}", _f(r["verify_ms"], 2),
             "yes" if r["exact"] else "NO"] for r in rec["rows"]]
    return out + "\n\nEvery configuration of the run:\n\n" + _table(
        ["configuration", "W", "τ", "acceptance by depth", "tok/s", "× plain", "verify ms", "output == plain"], rows)


def serve(rec_name: str) -> str:
    rows = [[r["concurrency"], r["requests"], r["completed"], r["disconnected"], r["wrong"], r["failed"],
             f"{r['ended_in_metrics']} ({r['aborted_in_metrics']})", f"{r['requests_per_s']:.2f}",
             f"{r['output_tokens_per_s']:.2f}", f"{r['ttft_p50_s']:.1f} / {r['ttft_p99_s']:.1f} s",
             f"{r['tpot_p50_s']:.2f} / {r['tpot_p99_s']:.2f} s",
             ", ".join(str(m) for m in r["rss_mb"]) + " MB"]
            for r in _load(rec_name)["rows"]]
    return _table(["clients", "requests", "completed", "disconnected", "wrong", "failed",
                   "ended in /metrics (aborted)", "req/s", "output tok/s", "TTFT p50 / p99",
                   "TPOT p50 / p99", "server RSS"], rows)


SUFFIX_PHASES = {"first": "the 12 prompts, first time", "repeat": "the same prompts again",
                 "para": "paraphrased follow-ups"}


def suffix(rec_name: str) -> str:
    rec = _load(rec_name)

    def cell(r: dict, plain: float) -> str:
        return f"{r['decode_tok_s'] / plain:.2f}×, τ {r['tau']:.2f}"

    rows = []
    for phase, res in rec["phases"].items():
        plain = res["plain"]["decode_tok_s"]
        rows.append([SUFFIX_PHASES.get(phase, phase), f"{plain:.2f} tok/s",
                     cell(res["ngram"], plain), cell(res["suffix_chain"], plain), cell(res["suffix_tree"], plain)])
    c = rec["corpus"]
    plain = c["plain"]["decode_tok_s"]
    rows.append(["RAG + summarization, corpus = the prompts' source texts instead of the answers",
                 f"{plain:.2f} tok/s", cell(c["ngram"], plain),
                 f"{cell(c['suffix'], plain)} (answers corpus); {cell(c['suffix+corpus'], plain)} (source texts)", "–"])
    out = _table(["phase", "plain", "n-gram (preset)", "suffix, chain",
                  f"suffix, tree (topk {rec['args']['tree_topk']}, {rec['args']['tree_width']} nodes)"], rows)
    goals = [[g["what"], f"{g['value']:.3f}", g["goal"], "yes" if g["met"] else "**no**"]
             for g in rec["goals"]]
    return out + "\n\nGoals as recorded:\n\n" + _table(["goal", "value", "wanted", "met"], goals)


BOUND_NAMES = {"ngram": "n-gram preset", "suffix": "suffix preset", "suffix κ=4": "suffix, κ = 4",
               "suffix min_token_prob 0.3": "suffix, `min_token_prob` 0.3",
               "suffix max_spec_factor 2": "suffix, `max_spec_factor` 2",
               "suffix calibrated + budget": "suffix, calibrated + budget", "suffix local": "suffix, local tree only",
               "oracle": "oracle over local, global, n-gram"}


def suffix_bound(rec_name: str) -> str:
    rec = _load(rec_name)
    rows = [[f"{int(tokens):,}", BOUND_NAMES.get(name, name), f"{r['tau']:.2f}", f"{r['drafted_per_step']:.2f}",
             f"{r['vs_ngram_priced']:.2f}×", f"{r['vs_ngram_flat_verify']:.2f}×"]
            for tokens, res in rec["results"].items() for name, r in res.items()]
    return (f"Priced by {rec['priced_by']}.\n\n"
            + _table(["corpus tokens", "configuration", "τ", "drafted/step", "÷ n-gram, verify measured",
                      "÷ n-gram, flat verify"], rows))


def sweep_summary(rec_name: str) -> str:
    """The summary lines of ``tools/hostile_sweep.py``'s text output: its header and totals (lines
    starting with ``#``) and the ``specc serve`` cases, as a code block."""
    path = ROOT / _rel(rec_name)
    if not path.is_file():
        raise SystemExit(f"render_results: record {_rel(rec_name)} does not exist")
    keep = [ln for ln in path.read_text().splitlines()
            if ln.startswith(("# ", "serve: ")) or (ln.startswith("serve/") and " -> " in ln)]
    return "```\n" + "\n".join(keep) + "\n```"


def story(rec_name: str) -> str:
    """``tools/bench_story.py``: per concurrency, explain's prediction against bench's measurement."""
    rec = _load(rec_name)
    rows = [[r["concurrency"], _x(r["predicted_speedup"], 3), _x(r["measured_speedup"], 3),
             "–" if r["error"] is None else f"{r['error']:+.1%}",
             ", ".join(f"{x:.3f}" for x in r["measured_rounds"]), _x(r["tune_measured_speedup"], 3),
             f"{r['plain_decode_tok_s']:.1f} / {r['decode_tok_s']:.1f}", "yes" if r["exact"] else "**no**"]
            for r in rec["rows"]]
    tune_s = rec.get("tune_seconds")
    lead = (f"tune took {tune_s / 60:.1f} min; " if tune_s else "") + f"the whole run {rec['seconds'] / 60:.1f} min.\n\n"
    return lead + _table(["C", "explain predicted", "bench measured (median)", "error", "bench rounds",
                          "tune measured", "plain / plan decode tok/s", "greedy exact"], rows)


def walk(rec_name: str) -> str:
    """``tools/readme_walk.py``: each step's wall time, the client's answer and the total."""
    rec = _load(rec_name)
    rows = [[s["step"], f"`{s['command']}`" if len(s["command"]) < 90 else f"`{s['command'][:87]}…`",
             f"{s['seconds']:.1f}", s["rc"]] for s in rec["steps"]]
    return (_table(["step", "command", "seconds", "exit"], rows)
            + f"\n\nCommit {rec['commit']}; total **{rec['total_seconds'] / 60:.1f} min** (goal: under "
            f"{rec['goal_minutes']:.0f} min): {'met' if rec['met'] else '**not met**'}. The client's answer: "
            f"{json.dumps(rec['answer'], ensure_ascii=False)}")


RENDERERS = {"story": story, "walk": walk, "sweep_summary": sweep_summary, "header": header, "llamacpp": llamacpp, "tune": tune, "concurrency": concurrency,
             "concurrency_suffix": concurrency_suffix, "mtp": mtp, "block": block, "tree": tree,
             "serve": serve, "suffix": suffix, "suffix_bound": suffix_bound}


def render_page(text: str, page: str = "<page>") -> str:
    """The page ``text`` with every generated block replaced by its renderer's output."""
    opens = text.count("<!-- render: ")
    blocks = list(BLOCK.finditer(text))
    if len(blocks) != opens:
        raise SystemExit(f"render_results: {page}: {opens} '<!-- render: ...' lines but {len(blocks)} "
                         f"closed by '<!-- /render -->'; close every block")

    def sub(m: re.Match) -> str:
        kind, *args = m.group("spec").split()
        if kind not in RENDERERS:
            raise SystemExit(f"render_results: {page}: unknown block kind {kind!r}; "
                             f"known: {', '.join(sorted(RENDERERS))}")
        return m.group(1) + RENDERERS[kind](*args) + "\n" + m.group(4)

    return BLOCK.sub(sub, text)


def refresh_after_write(record: str | Path) -> list[str]:
    """Called by a benchmark script after it wrote ``record``: when the record lives in
    ``docs/results/data/``, re-render every page (returns the pages rewritten, and prints them);
    a record written anywhere else changes nothing and returns ``[]``."""
    path = Path(record).resolve()
    if path.parent != DATA.resolve():
        return []
    rewritten = []
    for page in pages():
        old = page.read_text()
        new = render_page(old, str(page.relative_to(ROOT)))
        if new != old:
            page.write_text(new)
            rewritten.append(str(page.relative_to(ROOT)))
    if rewritten:
        print("render_results: rewrote " + ", ".join(rewritten))
    return rewritten


def pages() -> list[Path]:
    return sorted(RESULTS.glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is stale")
    args = ap.parse_args(argv)
    stale = []
    for path in pages():
        old = path.read_text()
        new = render_page(old, str(path.relative_to(ROOT)))
        if new != old:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if stale:
        verb = "stale" if args.check else "rewritten"
        print(f"{verb}: " + ", ".join(stale))
        return 1 if args.check else 0
    print("every page is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
