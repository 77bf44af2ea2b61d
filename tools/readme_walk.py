#!/usr/bin/env python
"""Follow the README's Quickstart from a fresh clone, as a new user would, and time every step.

1. ``git clone`` of this repository's committed HEAD (``--source``) into a new folder;
2. ``bash tools/install`` there (the README's Install section);
3. every command of the Quickstart's ``bash`` block, in order, from the clone's root with its
   ``.venv/bin`` first on ``PATH`` and an empty specc cache (``SPECC_CACHE_DIR`` in the folder, so the
   first load converts the GGUF as on a new machine); ``specc serve`` starts in the background and,
   once ``/v1/models`` answers, the Quickstart's ``python`` block (the official ``openai`` client) runs
   against it, then the server is stopped with SIGINT;
4. prints each step's wall time and exit code, the client's answer and the total against the goal
   (under 15 minutes from the clone to the client's answer and a checked launch command). The record
   names the clone's folder ``$WALK_DIR`` and the cloned repository ``$REPO``.

    python tools/readme_walk.py --out docs/results/data/readme_walk.json
    python tools/render_results.py     # refresh docs/results/story.md from the record

Every figure is a timing: run it on a quiet machine. The walk reads the README of the clone, so it
tests what is committed; a command that fails stops the walk (exit 1) with its output's tail.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Wall-clock goal of the walk, in minutes (clone to the client's answer).
GOAL_MIN = 15.0
#: Seconds the walk waits for ``specc serve`` to answer ``/v1/models``.
SERVE_READY_S = 300


def quickstart(readme: str) -> tuple[list[str], str]:
    """The Quickstart's shell commands (``\\``-continued lines joined, comments dropped) and its first
    ``python`` block. Raises SystemExit when the section or either block is missing."""
    at = readme.find("## Quickstart")
    if at < 0:
        raise SystemExit("readme_walk: the README has no '## Quickstart' section")
    section = readme[at:readme.find("\n## ", at + 1)]
    bash = re.search(r"```bash\n(.*?)```", section, re.S)
    py = re.search(r"```python\n(.*?)```", section, re.S)
    if not bash or not py:
        raise SystemExit("readme_walk: the Quickstart needs a ```bash block of commands and a ```python client block")
    commands, cur = [], ""
    for line in bash.group(1).splitlines():
        text = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not text.strip():
            continue
        cur += text.strip()[:-1].rstrip() + " " if text.endswith("\\") else text.strip()
        if not text.endswith("\\"):
            commands.append(cur.strip())
            cur = ""
    return commands, py.group(1)


def run_step(name: str, cmd: str, cwd: Path, env: dict, steps: list, timeout: float = 1800) -> str:
    """Run ``cmd`` with bash, time it, append the step; its output. Exits 1 when it fails."""
    print(f"$ {cmd}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    secs = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    steps.append({"step": name, "command": cmd, "seconds": round(secs, 1), "rc": proc.returncode,
                  "tail": out[-600:]})
    print(f"  ({secs:.0f} s, exit {proc.returncode})", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit(1)
    return out


def portable(step: dict, names: dict) -> dict:
    """``step`` with this machine's paths in its command and output tail replaced by the names a reader
    can follow (``names``: path -> placeholder, e.g. the walk's folder -> ``$WALK_DIR``), so the
    committed record names no folder of the machine it ran on."""
    out = dict(step)
    for key in ("command", "tail"):
        for path, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
            out[key] = out[key].replace(path, name)
    return out


def port_of(cmd: str) -> int:
    m = re.search(r"--port\s+(\d+)", cmd)
    return int(m.group(1)) if m else 8000


def serve_and_ask(cmd: str, client: str, cwd: Path, env: dict, steps: list) -> str:
    """Start ``cmd`` (``specc serve …``), wait for ``/v1/models``, run the client block; the answer."""
    port = port_of(cmd)
    print(f"$ {cmd} &", file=sys.stderr, flush=True)
    log = open(cwd / "serve.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"readme_walk: the server exited ({proc.returncode}): "
                                 f"{(cwd / 'serve.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if time.perf_counter() - t0 > SERVE_READY_S:
                    raise SystemExit(f"readme_walk: the server did not answer within {SERVE_READY_S} s")
                time.sleep(0.5)
        steps.append({"step": "serve ready", "command": cmd, "seconds": round(time.perf_counter() - t0, 1), "rc": 0,
                      "tail": (cwd / "serve.log").read_text()[-600:]})
        print(f"  (ready after {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        (cwd / "client.py").write_text(client)
        return run_step("openai client", f"{cwd / '.venv' / 'bin' / 'python'} client.py", cwd, env, steps)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=str(ROOT), help="repository to clone (default: this one)")
    ap.add_argument("--dir", default=None, help="folder for the clone (default: a new one under /tmp)")
    ap.add_argument("--out", default=None, help="write the record as JSON here")
    args = ap.parse_args()
    from specc.device import cpu_name

    folder = Path(args.dir or tempfile.mkdtemp(prefix="readme_walk-"))
    clone = folder / "specc"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["SPECC_CACHE_DIR"] = str(folder / "cache")
    steps: list = []
    t_start = time.perf_counter()
    run_step("clone", f"git clone -q {args.source} {clone}", folder, env, steps)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True,
                          text=True).stdout.strip()
    run_step("install", "bash tools/install", clone, env, steps)
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    commands, client = quickstart((clone / "README.md").read_text())
    answer = ""
    for i, cmd in enumerate(commands, 1):
        if cmd.startswith("specc serve"):
            answer = serve_and_ask(cmd, client, clone, env, steps).strip()
        else:
            run_step(f"quickstart {i}: {cmd.split()[1] if cmd.startswith('specc ') else cmd.split()[0]}", cmd,
                     clone, env, steps)
    total = time.perf_counter() - t_start
    steps = [portable(step, {str(folder): "$WALK_DIR", str(args.source): "$REPO"}) for step in steps]
    record = {"command": "python tools/readme_walk.py " + " ".join(sys.argv[1:]), "commit": head, "cpu": cpu_name(),
              "env": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset")},
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": steps, "answer": answer,
              "total_seconds": round(total, 1), "goal_minutes": GOAL_MIN, "met": total < GOAL_MIN * 60 and bool(answer)}
    print(f"README walk of commit {head} on {record['cpu']}:")
    for s in steps:
        print(f"  {s['seconds']:7.1f} s  exit {s['rc']}  {s['step']}")
    print(f"the client's answer: {answer!r}")
    print(f"total {total / 60:.1f} min (goal: under {GOAL_MIN:.0f} min): {'met' if record['met'] else 'NOT met'}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
        # a record under docs/results/data/ refreshes the pages rendered from it
        runpy.run_path(str(Path(__file__).with_name("render_results.py")))["refresh_after_write"](args.out)
    return 0 if record["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
