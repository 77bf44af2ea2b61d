#!/usr/bin/env python
"""Plain decoding and the shipped presets, side by side, under every way this CPU can run the step.

Settings (dtype / compile backend of the target's verify program): ``fp32-eager``, ``fp32-inductor``,
and ``bf16-eager`` / ``bf16-inductor`` where the CPU has bf16 units — decided by what oneDNN reports
(its ISA line and the kernel a bf16 matmul dispatches to, :func:`specc.device.cpu_facts`), with a
measured bf16/fp32 GEMM rate printed beside it; never assumed. Presets: ``conf/plan/smollm2_*.yaml``
whose engine is ``specc``, each through its committed artifact under ``generated/`` (hashes verified);
``smollm2_plain`` is plain decoding, the baseline of every speedup.

For each setting the target is loaded once at that dtype (half precision row-invariant, as the runtime
runs it) and shared by every preset's runtime; each runtime holds the artifact's states of one batch
bucket (batch 1: bucket 1; batch 8: bucket 8, every step padded to it), with its verify programs
compiled at build time under ``inductor`` (compile seconds reported). Every runtime uses the same cache
length (``--max-model-len``, default: the longest prompt + new tokens + slack, rounded up to 64 slots),
which the compiled programs attend over in full.

Prompts: the first ``--per-category`` shipped prompts of each category
(:func:`specc.runtime.prompts.shipped_per_category`), greedy, ``--max-new-tokens`` each. Interleaved:
each prompt (at batch 1) or batch of prompts (at batch 8) runs through every configuration in turn, round
after round, so load from other jobs falls on all alike; rates are medians over rounds.

Columns: decode tok/s (prefill and the first token excluded: :func:`specc.runtime.metrics.decode_tokens_per_s`)
and its ratio to plain decoding under the same setting and batch, twice: per second of this process's
CPU time (``time.process_time``; every matmul library runs one thread, so this is what the work cost on
a machine shared with other jobs) and per wall-clock second; whether the outputs equal plain greedy's
under the same setting (speculative greedy must equal plain greedy at the same dtype); τ; and per
setting, the verify program's CPU milliseconds by the target tokens it ran (``SpecMetrics.verify_by_tokens``:
verify forward + accept + commit, one step), the CPU's ISA, compile seconds.

    OMP_NUM_THREADS=1 python tools/bench_backends.py --presets smollm2_ngram smollm2_draft_model \\
        --settings fp32-eager bf16-eager --batches 1 8 --per-category 1 --max-new-tokens 32 --rounds 2

The committed record is ``docs/results/data/bench_backends.json`` (--json writes it);
``python tools/render_results.py`` then
refreshes its page, ``docs/results/backends.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = {"fp32-eager": ("float32", "eager"), "fp32-inductor": ("float32", "inductor"),
            "bf16-eager": ("bfloat16", "eager"), "bf16-inductor": ("bfloat16", "inductor")}
PLAIN = "smollm2_plain"
# SmolLM2-135M's GEMMs at a 16-token verify and a 1-token step: [M, K] @ [K, N]
GEMMS_16 = [(16, 576, 960), (16, 576, 576), (16, 576, 3072), (16, 1536, 576)]
GEMMS_1 = [(1, k, n) for _, k, n in GEMMS_16]


def shipped_presets() -> List[str]:
    """``conf/plan/smollm2_*.yaml`` whose ``engine`` is ``specc``, plain first."""
    import yaml

    names = []
    for f in sorted((ROOT / "conf" / "plan").glob("smollm2_*.yaml")):
        if (yaml.safe_load(f.read_text()) or {}).get("engine", "specc") == "specc":
            names.append(f.stem)
    return sorted(names, key=lambda n: (n != PLAIN, n))


def artifact_dir(preset: str) -> Path:
    """The committed artifact of a preset (``generated/<preset>-<hash>``). Exits naming the fix
    when there is none or several."""
    found = [p for p in (ROOT / "generated").glob(f"{preset}-*") if p.is_dir() and re.fullmatch(
        rf"{re.escape(preset)}-[0-9a-f]+", p.name)]
    if len(found) != 1:
        sys.exit(f"bench_backends: {len(found)} artifacts for {preset} under generated/; recompile it: "
                 f"python -m specc.cli compile conf/plan/{preset}.yaml (generated/README.md)")
    return found[0]


def gemm_gflops(shapes: List[Tuple[int, int, int]], dtype: str, repeats: int = 20) -> float:
    """GFLOP/s of one pass over ``shapes`` (``[M, K] @ [K, N]``) in ``dtype``, by this process's CPU
    time (the median of ``repeats`` passes after a warm-up; one thread), so other jobs do not count."""
    import torch

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    mats = [(torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)) for m, k, n in shapes]
    flops = sum(2.0 * m * k * n for m, k, n in shapes)
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            c0 = time.process_time()
            for a, b in mats:
                a @ b
            if i:
                times.append(time.process_time() - c0)
    return flops / max(statistics.median(times), 1e-9) / 1e9


def bf16_units(facts: Dict[str, Any]) -> bool:
    """Whether oneDNN runs bf16 matmuls on bf16 hardware here: its bf16 kernel or ISA line names
    bf16 or AMX (``avx512_core_bf16``, ``avx10_1_512_amx``, ...); emulating CPUs report neither."""
    text = f"{facts.get('onednn_bf16_kernel', '')} {facts.get('onednn_isa', '')}"
    return bool(re.search(r"bf16|bfloat16|amx", text, re.I))


@dataclass
class Config:
    """One (setting, preset, batch) runtime and what its runs measured."""

    setting: str
    preset: str
    batch: int
    runtime: Any = None
    error: str = ""
    compile_s: float = 0.0
    graph_breaks: int = 0
    num_states: int = 0
    rounds: Dict[int, Dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    verify: Dict[int, Dict[int, List[float]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(
        lambda: [0, 0.0, 0.0])))
    outputs: Dict[str, List[int]] = field(default_factory=dict)
    mismatched: List[str] = field(default_factory=list)

    @property
    def key(self) -> Tuple[str, str, int]:
        return self.setting, self.preset, self.batch


def build(cfg: Config, target, tokenizer, bucket_of, max_model_len: int) -> None:
    """The runtime of ``cfg`` (its preset's states at the batch's bucket, its setting's backend);
    an error is recorded on ``cfg`` instead of raised."""
    from specc import methods
    from specc.runtime.artifact import load_artifact
    from specc.runtime.loader import artifact_runtime, runtime_spec

    dtype, backend = SETTINGS[cfg.setting]
    try:
        art = load_artifact(artifact_dir(cfg.preset))
        spec = runtime_spec(art)
        bucket = bucket_of(art, cfg.batch)
        if bucket is None:
            cfg.error = f"no bucket >= {cfg.batch}"
            return
        drafter = methods.build_drafter(spec["method"]["name"], spec, target, tokenizer, target.norm.weight.device,
                                        max_seq_len=max_model_len)
        rt = artifact_runtime(art, target, tokenizer, drafter, target.norm.weight.device, compile_backend=backend,
                              max_model_len=max_model_len, buckets=[bucket])
    except Exception as exc:  # one preset failing must not end the run; the table says why
        cfg.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return
    cfg.runtime = rt
    cfg.compile_s = sum(s.capture_s for s in rt.states)
    cfg.num_states = len(rt.states)
    cfg.graph_breaks = sum(s.graph_breaks for s in rt.states)


def run_unit(cfg: Config, rnd: int, unit: List[Tuple[str, List[int]]], max_new: int) -> None:
    """Decode ``unit`` (prompt id, token ids) with ``cfg``'s runtime at its batch size, adding the
    round's tokens, requests, wall and prefill seconds, steps and emitted tokens, and the verify
    program's times by tokens."""
    from specc.runtime.request import Request, SamplingParams

    rt = cfg.runtime
    reqs = [Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=max_new), request_id=pid)
            for pid, ids in unit]
    rt.metrics = rt.new_metrics()
    t0, c0 = time.perf_counter(), time.process_time()
    outs = rt.generate(reqs, batch_size=cfg.batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    m = rt.metrics
    r = cfg.rounds[rnd]
    r["tokens"] += sum(len(o.token_ids) for o in outs)
    r["requests"] += len(outs)
    r["wall_s"] += wall
    r["cpu_s"] += cpu
    r["prefill_s"] += m.stage_time_s.get("prefill", 0.0)
    r["prefill_cpu_s"] += m.stage_cpu_s.get("prefill", 0.0)
    r["steps"] += m.num_steps
    r["emitted"] += m.num_emitted
    for n, (c, s, cs) in m.verify_by_tokens.items():
        slot = cfg.verify[rnd][n]
        slot[0] += c
        slot[1] += s
        slot[2] += cs
    for (pid, _), o in zip(unit, outs):
        cfg.outputs.setdefault(f"{pid}@{rnd}", list(o.token_ids))


def decode_rate(r: Dict[str, float], clock: str = "cpu") -> float:
    """Decode tokens per second of a round (prefill and the first token excluded), by this process's
    CPU time (``cpu``: what the work cost, whatever other jobs took) or by wall time (``wall``)."""
    from specc.runtime.metrics import decode_tokens_per_s

    if clock == "cpu":
        return decode_tokens_per_s(int(r["tokens"]), int(r["requests"]), r["cpu_s"], r["prefill_cpu_s"])
    return decode_tokens_per_s(int(r["tokens"]), int(r["requests"]), r["wall_s"], r["prefill_s"])


def median_rate(cfg: Config, clock: str = "cpu") -> float:
    rates = [decode_rate(r, clock) for r in cfg.rounds.values() if r["requests"]]
    return statistics.median(rates) if rates else float("nan")


def tau(cfg: Config) -> float:
    steps = sum(r["steps"] for r in cfg.rounds.values())
    return sum(r["emitted"] for r in cfg.rounds.values()) / steps if steps else float("nan")


def verify_ms(cfgs: List[Config], clock: str = "cpu") -> Dict[int, Tuple[float, int]]:
    """Verify-program ms (CPU or wall) by tokens over ``cfgs``: per round the mean over that round's
    steps (all configurations pooled), then the median over rounds; with the number of steps."""
    per_round: Dict[int, Dict[int, List[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for cfg in cfgs:
        for rnd, by_n in cfg.verify.items():
            for n, (c, s, cs) in by_n.items():
                per_round[n][rnd][0] += c
                per_round[n][rnd][1] += cs if clock == "cpu" else s
    out = {}
    for n, rounds in sorted(per_round.items()):
        means = [s / c * 1e3 for c, s in rounds.values() if c]
        out[n] = (statistics.median(means), sum(c for c, _ in rounds.values()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=None, metavar="NAME",
                    help=f"presets to run (default: every shipped specc preset); {PLAIN} is always added")
    ap.add_argument("--settings", nargs="+", default=None, choices=sorted(SETTINGS),
                    help="settings to run (default: fp32-eager, fp32-inductor, and bf16-eager, bf16-inductor "
                         "where oneDNN reports bf16 units)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8], metavar="B")
    ap.add_argument("--per-category", type=int, default=1, metavar="N", help="shipped prompts per category")
    ap.add_argument("--categories", nargs="+", default=None, metavar="C", help="only these categories")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=None, metavar="N",
                    help="cache slots per request for every runtime (default: longest prompt + new tokens + 48, "
                         "rounded up to 64)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, metavar="FILE", help="also write every number as JSON")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from specc import device as DV
    from specc.models import load_target
    from specc.runtime.artifact import load_artifact
    from specc.runtime.loader import runtime_spec
    from specc.runtime.prompts import read_prompts, shipped_per_category, shipped_prompts_path

    t_start = time.perf_counter()
    facts = DV.cpu_facts(args.threads)
    has_bf16 = bf16_units(facts)
    rate16 = {d: gemm_gflops(GEMMS_16, d) for d in ("float32", "bfloat16")}
    rate1 = {d: gemm_gflops(GEMMS_1, d) for d in ("float32", "bfloat16")}
    settings = args.settings or (list(SETTINGS) if has_bf16 else ["fp32-eager", "fp32-inductor"])
    presets = list(dict.fromkeys([PLAIN] + (args.presets or shipped_presets())))
    batches = sorted(set(args.batches))

    plain_art = load_artifact(artifact_dir(PLAIN))
    tgt = runtime_spec(plain_art)["target"]
    _, tok = load_target(tgt["path"], tgt.get("format") or "auto", dtype="float32", max_model_len=64)
    prompts = shipped_per_category(tok, args.per_category)
    if args.categories:
        cat = {r.id: r.category for r in read_prompts(shipped_prompts_path())}
        prompts = [(pid, ids) for pid, ids in prompts if cat.get(pid) in args.categories]
    if not prompts:
        sys.exit("bench_backends: no prompts left after --categories")
    max_len = args.max_model_len or -(-(max(len(ids) for _, ids in prompts) + args.max_new_tokens + 48) // 64) * 64

    def bucket_of(art, b):
        sizes = sorted({int(e["parameters"]["batch_size"]) for e in art.states})
        return next((s for s in sizes if s >= b), None)

    print(f"CPU: {DV.describe(facts)}", flush=True)
    print(f"torch {torch.__version__}, capability {facts['capability']}; bf16 units: "
          f"{'yes' if has_bf16 else 'no'} (oneDNN bf16 kernel {facts['onednn_bf16_kernel'] or 'unknown'}); "
          f"torch matmul GFLOP/s by CPU time, fp32 / bf16: 16 rows {rate16['float32']:.1f} / {rate16['bfloat16']:.1f}, "
          f"1 row {rate1['float32']:.1f} / {rate1['bfloat16']:.1f}", flush=True)
    print(f"{len(prompts)} prompt(s), {args.max_new_tokens} new tokens, cache {max_len} slots, "
          f"{args.rounds} round(s); settings {', '.join(settings)}; presets {', '.join(presets)}; "
          f"batches {batches}; load average {os.getloadavg()[0]:.1f}", flush=True)

    configs: List[Config] = []
    for setting in settings:
        dtype, _ = SETTINGS[setting]
        target, tokenizer = load_target(tgt["path"], tgt.get("format") or "auto", dtype=dtype, max_model_len=max_len)
        target.setup_cache(max(batches), max_len)  # every runtime shares this cache: allocated once
        for preset in presets:
            for b in batches:
                cfg = Config(setting, preset, b)
                t0 = time.perf_counter()
                build(cfg, target, tokenizer, bucket_of, max_len)
                print(f"built {setting:13s} {preset:22s} b{b}: "
                      + (cfg.error or cfg.runtime.load_report()) + f" [{time.perf_counter() - t0:.0f}s]",
                      file=sys.stderr, flush=True)
                configs.append(cfg)
    live = [c for c in configs if c.runtime is not None]
    units = {b: ([[p] for p in prompts] if b == 1 else [prompts[i:i + b] for i in range(0, len(prompts), b)])
             for b in batches}
    for rnd in range(args.rounds):
        for b in batches:
            for unit in units[b]:
                for cfg in live:
                    if cfg.batch != b or cfg.runtime is None:
                        continue
                    try:
                        run_unit(cfg, rnd, unit, args.max_new_tokens)
                    except Exception as exc:
                        cfg.error, cfg.runtime = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", None
        print(f"round {rnd + 1}/{args.rounds} done [{time.perf_counter() - t_start:.0f}s]", file=sys.stderr, flush=True)

    by_key = {c.key: c for c in configs}
    for c in configs:  # speculative greedy == plain greedy under the same setting and batch
        base = by_key.get((c.setting, PLAIN, c.batch))
        if base is not None and c.outputs and base.outputs:
            c.mismatched = sorted({k.split("@")[0] for k, v in c.outputs.items() if base.outputs.get(k, v) != v})
    print_tables(configs, settings, presets, batches, facts)
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(configs, settings, facts, rate16, rate1, args, max_len),
                                              indent=1) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.json)
    return 0


def cell(c: Optional[Config], base: Optional[Config], clock: str) -> str:
    if c is None:
        return "–"
    if c.error or not c.rounds:
        return f"({c.error or 'not run'})"
    r = median_rate(c, clock)
    b = median_rate(base, clock) if base is not None and base.rounds else float("nan")
    mark = "" if c.preset == PLAIN else (" ✓" if not c.mismatched else f" ✗{len(c.mismatched)}")
    ratio = f" ({r / b:.2f}×)" if c.preset != PLAIN and b == b and b > 0 else ""
    return f"{r:.1f}{ratio}{mark}"


def print_matrix(configs: List[Config], settings, presets, batches, clock: str) -> None:
    by_key = {c.key: c for c in configs}
    what = "per CPU-second of this process" if clock == "cpu" else "per wall-clock second"
    print(f"\ndecode tok {what} (× plain under the same setting and batch; ✓ outputs equal plain greedy's "
          f"under that setting, ✗n: n prompts differ); τ under the first setting")
    print("| preset | batch | τ | " + " | ".join(settings) + " |")
    print("|---|---|---|" + "---|" * len(settings))
    for p in presets:
        for b in batches:
            first = next((by_key[(s, p, b)] for s in settings if (s, p, b) in by_key and by_key[(s, p, b)].rounds), None)
            t = f"{tau(first):.2f}" if first is not None else "–"
            cells = [cell(by_key.get((s, p, b)), by_key.get((s, PLAIN, b)), clock) for s in settings]
            print(f"| {p} | {b} | {t} | " + " | ".join(cells) + " |")


def print_tables(configs: List[Config], settings, presets, batches, facts) -> None:
    by_key = {c.key: c for c in configs}
    print_matrix(configs, settings, presets, batches, "cpu")
    print_matrix(configs, settings, presets, batches, "wall")
    counts = sorted({n for c in configs for by in c.verify.values() for n in by})
    shown = [n for n in counts if n in (1, 2, 3, 4, 5, 8, 16, 24, 32, 40, 64)] or counts[:10]
    isa = f"{facts['capability']}, {(facts['onednn_bf16_kernel'] or '?').split(':')[-1]}"
    print("\nverify program CPU ms by the target tokens it ran (verify forward + accept + commit; per round the "
          "mean over every configuration's steps, median over rounds); plain decoding at batch 1 by CPU time")
    print("| setting | ISA | plain b1 tok/s (× fp32-eager) | " + " | ".join(f"{n} tok" for n in shown)
          + " | compile s (states) |")
    print("|---|---|---|" + "---|" * len(shown) + "---|")
    ref = by_key.get(("fp32-eager", PLAIN, 1))
    for s in settings:
        vm = verify_ms([c for c in configs if c.setting == s and c.rounds])
        p1 = by_key.get((s, PLAIN, 1))
        rate = median_rate(p1) if p1 is not None and p1.rounds else float("nan")
        rel = f" ({rate / median_rate(ref):.2f}×)" if ref is not None and ref.rounds and rate == rate else ""
        comp = [c for c in configs if c.setting == s and c.compile_s]
        ctime, nstates = sum(c.compile_s for c in comp), sum(c.num_states for c in comp)
        cols = [f"{vm[n][0]:.1f}" if n in vm else "–" for n in shown]
        print(f"| {s} | {isa} | {rate:.1f}{rel} | " + " | ".join(cols)
              + (f" | {ctime:.0f} ({nstates}) |" if ctime else " | – |"))
    for c in configs:
        if c.mismatched:
            print(f"outputs differ from plain greedy: {c.setting} {c.preset} b{c.batch}: {', '.join(c.mismatched)}")
    for c in configs:
        if c.error:
            print(f"not run: {c.setting} {c.preset} b{c.batch}: {c.error}")


def as_json(configs: List[Config], settings, facts, rate16, rate1, args, max_len) -> Dict[str, Any]:
    return {"cpu": facts, "gemm_gflops": {"16_rows": rate16, "1_row": rate1}, "settings": settings,
            "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "cache_slots": max_len,
            "configs": [{"setting": c.setting, "preset": c.preset, "batch": c.batch, "error": c.error,
                         "compile_s": round(c.compile_s, 2), "graph_breaks": c.graph_breaks,
                         "decode_tok_per_cpu_s": [round(decode_rate(r), 3) for r in c.rounds.values() if r["requests"]],
                         "decode_tok_s": [round(decode_rate(r, "wall"), 3) for r in c.rounds.values() if r["requests"]],
                         "tau": round(tau(c), 4) if c.rounds else None, "mismatched": c.mismatched,
                         "verify_cpu_ms_by_tokens": {str(n): round(ms, 3) for n, (ms, _) in verify_ms([c]).items()},
                         "verify_ms_by_tokens": {str(n): round(ms, 3) for n, (ms, _) in verify_ms([c], "wall").items()}}
                        for c in configs]}


if __name__ == "__main__":
    raise SystemExit(main())
