#!/usr/bin/env python
"""`specc serve` measured from outside, over loopback, with the official `openai` client.

``--check``: for each artifact (default: the shipped n-gram, draft-model and EAGLE-3 plans), run
``specc run ARTIFACT --json`` on the shipped prompts, start ``specc serve ARTIFACT`` as a process, ask
every shipped prompt through the chat API streamed and not (``--check-concurrency`` at a time), and
print how many texts equal ``specc run``'s.

``--load ARTIFACT``: a bounded load test at each ``--concurrency`` C (``--requests`` per level, at most
C in flight): a mix of streamed and one-shot requests, greedy and seeded-sampled (when the plan's
verify rule samples), LoRA adapters and the base model, and clients that disconnect after their first
chunk. A reference pass first sends each distinct request alone (greedy base-model references are
also checked against ``specc run``); then every completed request must equal its reference, every
request must end exactly once (``/metrics``' request counters move by exactly the number sent; the
aborted ones are at most the disconnected ones), and nothing may fail. Prints requests/s, output
tokens/s and TTFT / TPOT p50 / p99 per C. ``--soak N``: N more requests at ``--soak-concurrency``,
sampling the server's resident memory (``/proc/PID/status`` VmRSS) every ``N/10`` requests.
``--hostile M`` mixes M hostile requests into the soak, at random places: bodies over the server's
``--max-request-bytes`` (declared and chunked: 413), prompts of megabytes under it (text and chat:
400 ``context_length_exceeded``), lone UTF-16 surrogates, mistyped fields, 100k-deep JSON, empty
bodies and unknown paths. Each must get its status with OpenAI's error object, the ordinary requests
must still all be exact and end once, and the server's memory after the soak must be within 10 % of
its level before it.

    OMP_NUM_THREADS=1 python tools/bench_serve.py --check
    OMP_NUM_THREADS=1 python tools/bench_serve.py --load generated/smollm2_serve-<hash> \\
        --concurrency 1 16 64 --soak 1000 --hostile 200

The committed record is ``docs/results/data/bench_serve_load.json`` (--out writes it);
``python tools/render_results.py`` then
refreshes its page, ``docs/results/serve.md``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import runpy
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHECK_PRESETS = ("smollm2_ngram", "smollm2_draft_model", "smollm2_eagle3")


def artifact(preset: str) -> Path:
    found = sorted((ROOT / "generated").glob(f"{preset}-*"))
    if len(found) != 1:
        raise SystemExit(f"no single generated/{preset}-* artifact: {found}")
    return found[0]


class Server:
    """``specc serve`` as a child process on a free 127.0.0.1 port (stopped with SIGINT)."""

    def __init__(self, art: Path, extra: List[str] = ()) -> None:
        from specc.serve.server import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.proc = subprocess.Popen([sys.executable, "-m", "specc.cli", "serve", str(art), "--port", str(self.port),
                                      "--log-level", "warning", *extra], env=env)

    def __enter__(self) -> "Server":
        import httpx

        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"specc serve exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.time() - t0 > 600:
                raise SystemExit("specc serve did not start within 600 s")
            time.sleep(0.5)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def models(self) -> List[str]:
        import httpx

        return [m["id"] for m in httpx.get(self.url + "/v1/models").json()["data"]]

    def metrics(self) -> str:
        import httpx

        return httpx.get(self.url + "/metrics", timeout=30).text

    def idle(self, timeout: float = 120.0) -> None:
        """Wait until no request is running or waiting (cancellations of gone clients included)."""
        import httpx

        t0 = time.time()
        while time.time() - t0 < timeout:
            h = httpx.get(self.url + "/health", timeout=30).json()
            if h["running"] == 0 and h["waiting"] == 0:
                time.sleep(0.3)  # the engine thread delivers the last events
                return
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(
                f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def specc_run(art: Path, max_new: int, prompts_file: Optional[Path] = None) -> Dict[str, str]:
    """``specc run ART --json``: text by prompt id."""
    cmd = [sys.executable, "-m", "specc.cli", "run", str(art), "--json", "--no-progress", "--max-new-tokens",
           str(max_new)]
    if prompts_file is not None:
        cmd += ["--prompts", str(prompts_file)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout
    texts = {}
    for line in out.splitlines():
        obj = json.loads(line)
        if "id" in obj:
            texts[obj["id"]] = obj["text"]
    return texts


# ------------------------------------------------------------------------------------------ --check
async def _ask_all(url: str, model: str, records, max_new: int, stream: bool, concurrency: int) -> Dict[str, str]:
    import openai

    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    sem = asyncio.Semaphore(concurrency)

    async def one(rec):
        msgs = rec.messages or [{"role": "user", "content": rec.prompt}]
        async with sem:
            if stream:
                s = await c.chat.completions.create(model=model, messages=msgs, max_tokens=max_new, temperature=0,
                                                    stream=True)
                return rec.id, "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])
            r = await c.chat.completions.create(model=model, messages=msgs, max_tokens=max_new, temperature=0)
            return rec.id, r.choices[0].message.content

    try:
        return dict(await asyncio.gather(*(one(r) for r in records)))
    finally:
        await c.close()


def check(args) -> int:
    from specc.runtime.prompts import read_prompts, shipped_prompts_path

    records = read_prompts(shipped_prompts_path())
    ok = True
    for preset in args.presets:
        art = artifact(preset)
        t0 = time.time()
        ref = specc_run(art, args.max_new_tokens)
        with Server(art, ["--max-waiting", "512"]) as srv:
            model = srv.models()[0]
            got = {s: asyncio.run(_ask_all(srv.url, model, records, args.max_new_tokens, s, args.check_concurrency))
                   for s in (False, True)}
        for s in (False, True):
            same = sum(got[s][r.id] == ref[r.id] for r in records)
            ok &= same == len(records)
            print(f"{preset}: {'streamed' if s else 'one-shot'} chat == specc run for {same}/{len(records)} shipped "
                  f"prompts (max_tokens {args.max_new_tokens}, {args.check_concurrency} at a time)", flush=True)
            for r in records:
                if got[s][r.id] != ref[r.id]:
                    print(f"  differs: {r.id}: {got[s][r.id][:80]!r} vs {ref[r.id][:80]!r}")
        print(f"{preset}: {time.time() - t0:.0f} s", flush=True)
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------ --load
def make_jobs(n: int, records, adapters: List[str], sampled_ok: bool, max_new: int, seed: int,
              disconnect: float, seed_pool: int = 4) -> List[dict]:
    """``n`` requests over ``records``; sampled ones draw their seed from ``seed_pool`` values (so the
    reference pass has a bounded number of distinct requests)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        rec = records[rng.randrange(len(records))]
        jobs.append({"prompt": rec.prompt, "id": rec.id, "stream": rng.random() < 0.5,
                     "sampled": sampled_ok and rng.random() < 0.3, "seed": 1 + rng.randrange(seed_pool),
                     "adapter": rng.choice([None] + adapters) if adapters else None,
                     "disconnect": rng.random() < disconnect, "max_tokens": max_new})
    return jobs


def job_key(j: dict) -> tuple:
    return (j["prompt"], j["adapter"], j["sampled"], j["seed"] if j["sampled"] else 0, j["max_tokens"])


#: the hostile requests of ``--hostile``: kind -> (path, expected status, expected error code or None)
HOSTILE = {
    "oversized": ("/v1/completions", 413, "request_too_large"),
    "oversized_chunked": ("/v1/chat/completions", 413, "request_too_large"),
    "huge_prompt": ("/v1/completions", 400, "context_length_exceeded"),
    "huge_chat": ("/v1/chat/completions", 400, "context_length_exceeded"),
    "surrogate": ("/v1/chat/completions", 400, "invalid_unicode"),
    "mistyped": ("/v1/completions", 400, None),
    "deep_json": ("/v1/completions", 400, "invalid_json"),
    "empty": ("/v1/chat/completions", 400, "empty_body"),
    "unknown_path": ("/v1/nothing", 404, "not_found"),
}
LIMIT = 4 << 20  # specc serve's default --max-request-bytes


def make_hostile(n: int, seed: int) -> List[dict]:
    rng = random.Random(seed)
    return [{"hostile": rng.choice(sorted(HOSTILE))} for _ in range(n)]


async def send_hostile(http, url: str, model: str, kind: str) -> dict:
    """Send one hostile request; ``status`` is ``refused`` when it got the expected status and an
    OpenAI error object (``{"error": {"message", "type", "param", "code"}}``), else ``wrong refusal``."""
    path, want, code = HOSTILE[kind]
    big = "word " * ((LIMIT - (512 << 10)) // 5)  # under the limit by half a MiB
    headers = {"content-type": "application/json"}
    if kind == "oversized":
        kw = dict(json={"model": model, "prompt": big + "x" * (1 << 20)})
    elif kind == "oversized_chunked":
        async def chunks():
            for _ in range(LIMIT // (64 << 10) + 8):
                yield b"x" * (64 << 10)
        kw = dict(content=chunks(), headers=headers)
    elif kind == "huge_prompt":
        kw = dict(json={"model": model, "prompt": big, "max_tokens": 4})
    elif kind == "huge_chat":
        kw = dict(json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": big}]})
    elif kind == "surrogate":
        kw = dict(content=('{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800"}]}' % model).encode(),
                  headers=headers)
    elif kind == "mistyped":
        kw = dict(json={"model": model, "prompt": "hi", "max_tokens": "4"})
    elif kind == "deep_json":
        kw = dict(content=b"[" * 100_000 + b"]" * 100_000, headers=headers)
    elif kind == "empty":
        kw = dict(content=b"", headers=headers)
    else:
        kw = dict(json={"model": model})
    try:
        r = await http.post(url + path, **kw)
        err = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
    except Exception as exc:  # noqa: BLE001 - a reset connection is a wrong refusal too
        return {"status": "wrong refusal", "kind": kind, "error": f"{type(exc).__name__}: {exc}"[:200]}
    ok = (r.status_code == want and isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
          and (code is None or err.get("code") == code))
    return {"status": "refused" if ok else "wrong refusal", "kind": kind, "http": r.status_code,
            "error": None if ok else r.text[:200]}


async def run_jobs(url: str, base: str, jobs: List[dict], concurrency: int) -> List[dict]:
    import httpx
    import openai

    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    http = httpx.AsyncClient(timeout=600)
    sem = asyncio.Semaphore(concurrency)

    async def one(j):
        if j.get("hostile"):
            async with sem:
                return await send_hostile(http, url, base, j["hostile"])
        kw = dict(temperature=0.8, seed=j["seed"], extra_body={"top_k": 50}) if j["sampled"] else dict(temperature=0)
        msgs = [{"role": "user", "content": j["prompt"]}]
        model = j["adapter"] or base
        async with sem:
            t0 = time.perf_counter()
            first, n = None, 0
            try:
                if j["disconnect"]:
                    s = await c.chat.completions.create(model=model, messages=msgs, max_tokens=j["max_tokens"] * 4,
                                                        stream=True, **kw)
                    async for _ in s:
                        break
                    await s.close()
                    return {"status": "disconnected"}
                if j["stream"]:
                    s = await c.chat.completions.create(model=model, messages=msgs, max_tokens=j["max_tokens"],
                                                        stream=True, stream_options={"include_usage": True}, **kw)
                    parts = []
                    async for ch in s:
                        if ch.choices and ch.choices[0].delta.content:
                            first = first or time.perf_counter()
                            parts.append(ch.choices[0].delta.content)
                        if ch.usage is not None:
                            n = ch.usage.completion_tokens
                    text = "".join(parts)
                else:
                    r = await c.chat.completions.create(model=model, messages=msgs, max_tokens=j["max_tokens"], **kw)
                    text, n = r.choices[0].message.content, r.usage.completion_tokens
                    first = time.perf_counter()  # one-shot: the first token arrives with the last
            except openai.APIStatusError as exc:
                return {"status": f"http {exc.status_code}", "error": str(exc)[:200]}
            t1 = time.perf_counter()
            return {"status": "done", "text": text, "tokens": n, "ttft": (first or t1) - t0,
                    "tpot": (t1 - first) / (n - 1) if first and n > 1 and j["stream"] else None, "e2e": t1 - t0}

    try:
        return await asyncio.gather(*(one(j) for j in jobs))
    finally:
        await c.close()
        await http.aclose()


def pct(xs: List[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def load(args) -> int:
    from specc.runtime.prompts import read_prompts, select, shipped_prompts_path

    art = Path(args.load)
    records = select([r for r in read_prompts(shipped_prompts_path()) if r.prompt is not None], args.prompts)
    manifest = json.loads((art / "manifest.json").read_text())
    rules = {s["parameters"]["verify_rule"] for s in manifest["states"]}
    sampled_ok = "greedy" not in rules
    ok = True
    with Server(art, ["--max-waiting", str(max(args.concurrency) * 2 + 64)]) as srv:
        models = srv.models()
        base, adapters = models[0], models[1:]
        print(f"serving {art.name}: model {base}, adapters {adapters or 'none'}, verify {sorted(rules)}; "
              f"RSS {srv.rss_mb():.0f} MB", flush=True)
        levels = {c: make_jobs(args.requests if c > 1 else max(4, args.requests // 4), records, adapters, sampled_ok,
                               args.max_new_tokens, 1000 + c, args.disconnect) for c in args.concurrency}
        soak = make_jobs(args.soak, records[:args.soak_prompts], adapters, sampled_ok, args.soak_max_new_tokens, 7,
                         args.disconnect) if args.soak else []
        if soak and args.hostile:
            rng = random.Random(11)
            for h in make_hostile(args.hostile, 13):
                soak.insert(rng.randrange(len(soak) + 1), h)
        distinct = {}
        for j in [j for js in levels.values() for j in js] + soak:
            if not j.get("hostile") and not j["disconnect"]:
                distinct.setdefault(job_key(j), dict(j, stream=False))
        t0 = time.time()
        ref_list = list(distinct.values())
        refs = asyncio.run(run_jobs(srv.url, base, ref_list, 1 if args.strict_reference else 4))
        ref = {job_key(j): r["text"] for j, r in zip(ref_list, refs) if r["status"] == "done"}
        if len(ref) != len(ref_list):
            print("reference pass failed for some requests:", [r for r in refs if r["status"] != "done"][:3])
            return 1
        print(f"reference pass: {len(ref_list)} distinct requests alone ({time.time() - t0:.0f} s)", flush=True)
        # greedy base-model references against specc run (the CLI, a separate process)
        greedy_base = {j["id"]: ref[job_key(j)] for j in ref_list if j["adapter"] is None and not j["sampled"]
                       and j["max_tokens"] == args.max_new_tokens}
        ids = sorted(greedy_base)
        if ids:
            tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_serve_{os.getpid()}.jsonl"
            by_id = {r.id: r for r in records}
            tmp.write_text("".join(json.dumps({"id": i, "prompt": by_id[i].prompt}) + "\n" for i in ids))
            run = specc_run(art, args.max_new_tokens, tmp)
            same = sum(run[i] == greedy_base[i] for i in ids)
            print(f"greedy base-model references == specc run: {same}/{len(ids)}", flush=True)
            ok &= same == len(ids)
            tmp.unlink()
        rows = []
        for c, jobs in list(levels.items()) + ([("soak", soak)] if soak else []):
            srv.idle()
            before = srv.metrics()
            conc = args.soak_concurrency if c == "soak" else c
            rss = [srv.rss_mb()]
            t0 = time.perf_counter()
            if c == "soak":
                res = []
                step = max(1, len(jobs) // 10)
                for k in range(0, len(jobs), step):
                    res += asyncio.run(run_jobs(srv.url, base, jobs[k:k + step], conc))
                    rss.append(srv.rss_mb())
            else:
                res = asyncio.run(run_jobs(srv.url, base, jobs, conc))
            wall = time.perf_counter() - t0
            srv.idle()
            after = srv.metrics()
            if c == "soak":
                rss.append(srv.rss_mb())
            done = [(j, r) for j, r in zip(jobs, res) if r["status"] == "done"]
            gone = [r for r in res if r["status"] == "disconnected"]
            refused = [r for r in res if r["status"] == "refused"]
            failed = [r for r in res if r["status"] not in ("done", "disconnected", "refused")]
            wrong = [j for j, r in done if r["text"] != ref[job_key(j)]]
            hostile = [j for j in jobs if j.get("hostile")]
            too_large = metric(after, "specc:requests_rejected_total", reason="too_large") - metric(
                before, "specc:requests_rejected_total", reason="too_large")
            ended = metric(after, "specc:request_success_total") - metric(before, "specc:request_success_total")
            aborted = metric(after, "specc:request_success_total", finished_reason="abort") - metric(
                before, "specc:request_success_total", finished_reason="abort")
            gen = metric(after, "specc:request_generation_tokens_total") - metric(
                before, "specc:request_generation_tokens_total")
            out_tokens = sum(r["tokens"] for _, r in done)
            good = not failed and not wrong and ended == len(jobs) - len(hostile) and aborted <= len(gone) \
                and gen >= out_tokens
            memory_ok = None
            if hostile:
                want_413 = sum(HOSTILE[j["hostile"]][1] == 413 for j in hostile)
                memory_ok = rss[-1] <= 1.10 * rss[0]
                good &= len(refused) == len(hostile) and too_large == want_413 and memory_ok
            ok &= good
            ttft = [r["ttft"] for _, r in done if j_stream(r)]
            tpot = [r["tpot"] for _, r in done if r.get("tpot") is not None]
            row = {"concurrency": c, "requests": len(jobs), "completed": len(done), "disconnected": len(gone),
                   "failed": len(failed), "wrong": len(wrong), "ended_in_metrics": int(ended),
                   "aborted_in_metrics": int(aborted), "wall_s": round(wall, 2),
                   "requests_per_s": round(len(jobs) / wall, 3), "output_tokens_per_s": round(out_tokens / wall, 2),
                   "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p99_s": round(pct(ttft, 0.99), 3),
                   "tpot_p50_s": round(pct(tpot, 0.5), 4), "tpot_p99_s": round(pct(tpot, 0.99), 4),
                   "rss_mb": [round(x) for x in rss], "ok": good}
            if hostile:
                row.update(hostile=len(hostile), refused_as_expected=len(refused), too_large_in_metrics=int(too_large),
                           rss_before_mb=round(rss[0]), rss_after_mb=round(rss[-1]), rss_peak_mb=round(max(rss)),
                           memory_within_10_percent=memory_ok)
            rows.append(row)
            print(f"C={c}: {len(jobs)} requests ({len(done)} completed, {len(gone)} disconnected, {len(failed)} failed, "
                  f"{len(wrong)} wrong); metrics: {int(ended)} ended ({int(aborted)} aborted); "
                  f"{row['requests_per_s']} req/s, {row['output_tokens_per_s']} output tok/s; "
                  f"TTFT p50 {row['ttft_p50_s']} s p99 {row['ttft_p99_s']} s; "
                  f"TPOT p50 {row['tpot_p50_s']} s p99 {row['tpot_p99_s']} s; RSS MB {row['rss_mb']}"
                  f"{'' if good else '  <-- FAILED'}", flush=True)
            if hostile:
                print(f"  hostile: {len(hostile)} mixed in, {len(refused)} refused as expected (status and OpenAI "
                      f"error object), {int(too_large)} counted too_large in /metrics; RSS before {rss[0]:.0f} MB, "
                      f"peak {max(rss):.0f} MB, after {rss[-1]:.0f} MB "
                      f"({'within' if memory_ok else 'NOT within'} 10 % of before)", flush=True)
            for r in failed[:3]:
                print("   ", r)
        m = srv.metrics()
        for name in [base] + adapters:
            acc = metric(m, "specc:spec_decode_num_accepted_tokens_total", model_name=name)
            drafts = metric(m, "specc:spec_decode_num_draft_tokens_total", model_name=name)
            steps = metric(m, "specc:spec_decode_num_steps_total", model_name=name)
            emitted = metric(m, "specc:spec_decode_num_emitted_tokens_total", model_name=name)
            if steps:
                print(f"model {name}: acceptance {acc / max(drafts, 1):.3f}, tau {emitted / steps:.3f} "
                      f"({int(steps)} request-steps)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"artifact": art.name, "rows": rows}, indent=1) + "\n")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    print("load test:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def j_stream(r: dict) -> bool:
    return r.get("tpot") is not None or r.get("ttft") is not None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="openai client vs specc run on the shipped prompts")
    ap.add_argument("--presets", nargs="+", default=list(CHECK_PRESETS))
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--check-concurrency", type=int, default=8)
    ap.add_argument("--load", metavar="ARTIFACT", help="bounded load test against this artifact")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=64, help="requests per concurrency level (C=1: a quarter)")
    ap.add_argument("--prompts", type=int, default=None, help="draw requests from N shipped prompts (round-robin "
                    "over categories; default all)")
    ap.add_argument("--disconnect", type=float, default=0.1, help="fraction of clients that leave after one chunk")
    ap.add_argument("--soak", type=int, default=0, help="requests of the memory soak (0: none)")
    ap.add_argument("--soak-concurrency", type=int, default=16)
    ap.add_argument("--soak-max-new-tokens", type=int, default=8)
    ap.add_argument("--soak-prompts", type=int, default=8, help="the soak cycles over the first N of those prompts")
    ap.add_argument("--hostile", type=int, default=0, help="hostile requests mixed into the soak (oversized, "
                    "malformed, lone surrogates, deep JSON, ...); each must be refused with its status")
    ap.add_argument("--strict-reference", action="store_true", help="reference pass one request at a time")
    ap.add_argument("--out", default=None, help="write the load rows as JSON")
    args = ap.parse_args(argv)
    if not args.check and not args.load:
        ap.error("give --check and/or --load ARTIFACT")
    rc = 0
    if args.check:
        rc |= check(args)
    if args.load:
        rc |= load(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
