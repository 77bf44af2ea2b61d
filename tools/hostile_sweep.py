#!/usr/bin/env python
"""Every ``specc`` command fed hostile input, measured from outside: one child process per case.

For each case the sweep prints the exit code, the time to the refusal (wall clock of the child,
interpreter start included), the child's peak resident memory (``wait4``'s ``ru_maxrss``), whether
stderr holds a Python traceback, and what the case left behind in its own scratch folder. A refusal
meets the goal when it exits 2 (a usage error), prints no traceback, takes under 2 s and 500 MB and
leaves nothing half-written; cases that must be accepted (a renamed artifact is identified by its
content) are marked as such and must exit 0.

Inputs per command (``check``, ``explain``, ``compile``, ``export``, ``profile``, ``run``, ``bench``,
``generate``, ``tune``, ``import``, ``serve``, ``train``): malformed files (invalid YAML, binary,
a list where a mapping belongs), oversized ones (a 2 MiB plan, a 5,000-character plan name, a
100,000-character value), deep nesting (block mappings, flow lists, dotted override keys and
bracketed override values, JSON), YAML alias bombs, wrong paths (missing, a directory, a FIFO,
``/dev/zero``, an unwritable output under ``/proc``, a ``defaults:`` entry climbing out of ``conf/``,
``${oc.env:HOME}``), wrong URLs (``file://``, no host, ``ftp://``), and numbers no machine can
honour (batch sizes, token counts, buffers larger than this machine's memory).

The server cases start ``specc serve`` on a tiny artifact and, while one client streams, open
connections that send their headers or body slowly, or nothing at all: each must be closed within
the server's timeout and the streaming client must not notice (the largest gap between its chunks
is reported). The shutdown case sends SIGTERM with a stream that would run far longer than the
shutdown deadline in flight: the stream must end with a final error event and the process exit
within the deadline plus a margin.

Every child runs with ``OMP_NUM_THREADS=1`` and at most 6 GiB of address space (so a runaway
allocation fails instead of taking the machine), with a per-case timeout.

    OMP_NUM_THREADS=1 python tools/hostile_sweep.py > docs/results/data/hostile_sweep.txt
    python tools/hostile_sweep.py --only train      # cases whose name contains "train"
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL_SECONDS = 2.0
GOAL_RSS_MB = 500.0
ADDRESS_SPACE = 6 << 30
CASE_TIMEOUT = 60.0
V = 64  # the tiny models' vocabulary


@dataclass
class Case:
    """One command line. ``expect``: the exit code that meets the goal (2: refused as a usage error;
    0: accepted). ``stdin``: bytes fed to it. ``outputs``: paths (in the case folder) that must not
    exist afterwards (an output a refusal must not have started)."""

    name: str
    argv: List[str]
    expect: int = 2
    stdin: Optional[bytes] = None
    env: dict = field(default_factory=dict)
    timeout: float = CASE_TIMEOUT
    words: Sequence[str] = ()  # each must appear in stderr (the message names the option / field)


@dataclass
class Result:
    case: Case
    code: Optional[int]
    seconds: float
    rss_mb: float
    traceback: bool
    left: List[str]
    stderr: str

    @property
    def ok(self) -> bool:
        if self.code != self.case.expect or self.traceback or self.left:
            return False
        if any(w not in self.stderr for w in self.case.words):
            return False
        return self.case.expect != 2 or (self.seconds < GOAL_SECONDS and self.rss_mb < GOAL_RSS_MB)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_case(case: Case, scratch: Path) -> Result:
    """Run ``case`` in its own folder under ``scratch``; peak RSS from ``wait4``."""
    folder = scratch / re.sub(r"[^A-Za-z0-9_.-]", "_", case.name)
    folder.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               SPECC_CACHE_DIR=str(scratch / "cache"), SPECC_TRAIN_CACHE=str(scratch / "train_cache"), **case.env)
    argv = [sys.executable, "-m", "specc.cli", *case.argv]
    stdin = subprocess.PIPE if case.stdin is not None else subprocess.DEVNULL
    errf = open(folder.parent / f"{folder.name}.stderr", "w+b")
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=stdin, stdout=subprocess.DEVNULL, stderr=errf,
                            preexec_fn=_limit)
    if case.stdin is not None:
        threading.Thread(target=_feed, args=(proc, case.stdin), daemon=True).start()
    code, rss = None, 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            rss = usage.ru_maxrss / 1024.0
            break
        if time.perf_counter() - t0 > case.timeout:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            rss = usage.ru_maxrss / 1024.0
            break
        time.sleep(0.01)
    seconds = time.perf_counter() - t0
    proc.returncode = code if code is not None else -9  # reaped here; keep Popen from waiting again
    errf.seek(0)
    stderr = errf.read().decode("utf-8", "replace")
    errf.close()
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    return Result(case, code, seconds, rss, "Traceback (most recent call last)" in stderr, left, stderr)


def _feed(proc, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


# ------------------------------------------------------------------------------------------- inputs
def deep_block_yaml(levels: int, name: str = "deep") -> str:
    lines = [f"name: {name}", "method:"]
    lines += ["  " * (i + 1) + f"k{i}:" for i in range(levels)]
    return "\n".join(lines) + " 1\n"


def alias_bomb_yaml(head: str, levels: int = 10, width: int = 9) -> str:
    lines = [head, "a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def write_inputs(d: Path) -> dict:
    """The hostile files, and a tiny checkpoint + artifact. Returns their paths by name."""
    p = {}

    def put(name: str, text, mode: str = "w") -> Path:
        f = d / name
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            f.write_bytes(text)
        else:
            f.write_text(text)
        p[name] = f
        return f

    ngram = "defaults:\n  - /target: smollm2_135m\n  - /method: ngram\n  - _self_\n"
    put("invalid.yaml", "name: x\nmethod: [unclosed\n")
    put("binary.yaml", os.urandom(4096))
    put("list.yaml", "- a\n- b\n")
    put("big.yaml", "name: big\n# " + "x" * (2 << 20) + "\n")
    put("longname.yaml", ngram + "name: " + "n" * 5000 + "\n")
    put("longvalue.yaml", ngram + "name: longvalue\ntarget:\n  path: /" + "a" * 100_000 + "\n")
    put("unsafe_name.yaml", ngram + 'name: "../../etc/passwd"\n')
    put("deep_block.yaml", deep_block_yaml(100))
    put("deep_flow.yaml", "name: deep\nmethod:\n  suffix:\n    corpora: " + "[" * 10_000 + "]" * 10_000 + "\n")
    put("bomb.yaml", alias_bomb_yaml("name: bomb"))
    put("escape.yaml", "defaults:\n  - /target: ../../..\n  - _self_\nname: escape\n")
    put("escape_group.yaml", "defaults:\n  - /../../etc: passwd\n  - _self_\nname: escape\n")
    put("evil/x.yaml", "path: /etc\nformat: hf\n")
    rel = os.path.relpath(d / "evil" / "x", ROOT / "conf" / "target")
    put("escape_real.yaml", f"defaults:\n  - /target: {rel}\n  - _self_\nname: escape\n")
    put("env.yaml", ngram + "name: envplan\ntarget:\n  path: ${oc.env:HOME}\n")
    put("hydra.yaml", ngram + "name: hydraplan\nhydra:\n  searchpath: [file:///etc]\n")
    os.mkfifo(d / "fifo.yaml")
    p["fifo.yaml"] = d / "fifo.yaml"
    deep_json = "[" * 100_000 + "]" * 100_000
    put("deep.json", deep_json)
    put("deep.jsonl", '{"prompt": ' + deep_json + "}\n")
    put("bomb_k8s.yaml", alias_bomb_yaml("kind: Pod"))
    put("recipe_bomb.yaml", alias_bomb_yaml("name: bomb\nkind: eagle3\ndata: smollm2_specbench\nout: x"))
    put("recipe_deep.yaml", "name: deep\nkind: eagle3\ndata: smollm2_specbench\nout: x\noptions:\n"
        + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(100)) + "  " * 101 + "v: 1\n")
    put("recipe_env.yaml", "name: env\nkind: eagle3\ndata: smollm2_specbench\nout: ${oc.env:HOME}\n")
    put("recipe_proc_out.yaml", "name: procout\nkind: eagle3\ndata: smollm2_specbench\nout: /proc/specc_out\n")
    put("data_bigbatch.yaml", _with_field(ROOT / "conf/train/data/smollm2_specbench.yaml", "gen_batch", "100000"))
    put("prompts.txt", "w2 w3 w4\nw5 w6 w7\n")
    (d / "adir").mkdir()
    p["adir"] = d / "adir"
    # built in a child process: this one stays small, so the children it forks start small (a
    # forked child's peak RSS counts the parent's pages it ran on before exec)
    made = subprocess.run([sys.executable, __file__, "--setup-artifact", str(d)], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), check=True).stdout
    p.update({k: Path(v) for k, v in json.loads(made.splitlines()[-1]).items()})
    return p


def _with_field(path: Path, key: str, value: str) -> str:
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(f"{key}:")]
    return "\n".join(lines + [f"{key}: {value}"]) + "\n"


def tiny_artifact(d: Path) -> dict:
    """A tiny HF checkpoint (the runtime tests' writer) and its n-gram artifact, plus a renamed copy."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_runtime_artifact import _write_checkpoint  # the tests' tiny checkpoint writer

    from specc.compiler import build
    from specc.plan.load import load_plan
    from specc.runtime.testing import tiny_llama

    torch.set_num_threads(1)
    ckpt = d / "ckpt"
    _write_checkpoint(tiny_llama(seed=0, vocab_size=V), ckpt / "target")
    overrides = [f"target.path={ckpt / 'target'}", "target.format=hf", f"target.vocab_size={V}",
                 "target.max_model_len=128"]
    art = build.compile_plan(load_plan("smollm2_ngram", overrides).plan, d / "arts").path
    renamed = d / "arts" / "renamed_by_hand"
    shutil.copytree(art, renamed)
    plan = d / "tiny_plan.yaml"
    plan.write_text("defaults:\n  - /method: ngram\n  - _self_\nname: tiny\ntarget:\n"
                    f"  path: {ckpt / 'target'}\n  format: hf\n  vocab_size: {V}\n  max_model_len: 128\n")
    return {"ckpt": ckpt / "target", "art": art, "renamed": renamed, "tiny_plan": plan}


# -------------------------------------------------------------------------------------------- cases
def cli_cases(p: dict) -> List[Case]:
    """Every command x the hostile inputs of :func:`write_inputs`."""
    cases: List[Case] = []
    add = lambda name, *argv, **kw: cases.append(Case(name, [str(a) for a in argv], **kw))  # noqa: E731
    plan_inputs = {
        "missing": "/nonexistent/plan.yaml", "directory": p["adir"], "fifo": p["fifo.yaml"], "dev_zero": "/dev/zero",
        "invalid_yaml": p["invalid.yaml"], "binary": p["binary.yaml"], "list_top": p["list.yaml"],
        "oversized_2MiB": p["big.yaml"], "name_5000_chars": p["longname.yaml"], "value_100k_chars": p["longvalue.yaml"],
        "unsafe_name": p["unsafe_name.yaml"], "deep_block_100": p["deep_block.yaml"],
        "deep_flow_10000": p["deep_flow.yaml"], "alias_bomb": p["bomb.yaml"], "defaults_escape_option": p["escape.yaml"],
        "defaults_escape_group": p["escape_group.yaml"], "defaults_escape_to_a_file": p["escape_real.yaml"],
        "resolver_oc_env": p["env.yaml"],
        "hydra_searchpath": p["hydra.yaml"],
    }
    deep_key = "method." + ".".join(["a"] * 100) + "=1"
    override_inputs = {
        "override_deep_key_100": deep_key,
        "override_deep_value_100": "method.tree_choices=" + "[" * 100 + "]" * 100,
        "override_deep_value_10000": "method.tree_choices=" + "[" * 10_000 + "]" * 10_000,
        "override_long_value": "target.path=/" + "a" * 100_000,
        "override_resolver": "target.path=${oc.env:HOME}",
        "override_group_escape": "target=../../..",
        "override_name_5000": "name=" + "n" * 5000,
    }
    for cmd in ("check", "explain", "compile", "export"):
        extra = ["--engine", "sglang"] if cmd == "export" else []
        for kind, src in plan_inputs.items():
            add(f"{cmd}/{kind}", cmd, src, *extra)
        for kind, ov in override_inputs.items():
            add(f"{cmd}/{kind}", cmd, "smollm2_ngram", ov, *extra)
    for kind in ("missing", "deep_block_100", "alias_bomb", "name_5000_chars", "resolver_oc_env"):
        add(f"profile/{kind}", "profile", plan_inputs[kind], "--out", "t.json")
        add(f"run/plan_{kind}", "run", plan_inputs[kind], "--prompt", "w2 w3")
        add(f"bench/plan_{kind}", "bench", plan_inputs[kind])
        add(f"tune/plan_{kind}", "tune", p["prompts.txt"], "--plans", plan_inputs[kind], "--out", "t.yaml")
    # outputs that cannot be written
    add("compile/out_proc", "compile", "smollm2_ngram", "--out", "/proc/specc_out")
    add("compile/out_is_file", "compile", "smollm2_ngram", "--out", p["prompts.txt"])
    add("profile/out_proc", "profile", "smollm2_ngram", "--out", "/proc/specc_out/t.json")
    add("explain/plot_proc", "explain", "smollm2_ngram", "--plot", "/proc/specc_out/x.png")
    add("explain/graphs_proc", "explain", "smollm2_ngram", "--graphs", "/proc/specc_out")
    add("tune/out_proc", "tune", p["prompts.txt"], "--out", "/proc/specc_out/t.yaml")
    add("import/out_proc", "import", "vllm", "-o", "/proc/specc_out/p.yaml", "--", "vllm", "serve", "m")
    # other inputs
    add("explain/acceptance_missing", "explain", "smollm2_ngram", "--acceptance", "/nonexistent.json")
    add("explain/acceptance_deep_json", "explain", "smollm2_ngram", "--acceptance", p["deep.json"])
    add("explain/acceptance_dev_zero", "explain", "smollm2_ngram", "--acceptance", "/dev/zero")
    add("explain/alpha_nan", "explain", "smollm2_ngram", "--alpha", "nan")
    add("explain/c_inf", "explain", "smollm2_ngram", "--c", "inf")
    add("explain/hardware_escape", "explain", "smollm2_ngram", "--hardware", "../../etc/passwd")
    add("tune/cost_table_deep_json", "tune", p["prompts.txt"], "--cost-table", p["deep.json"], "--out", "t.yaml")
    add("tune/prompts_deep_jsonl", "tune", p["deep.jsonl"], "--out", "t.yaml")
    add("tune/prompts_dev_zero", "tune", "/dev/zero", "--out", "t.yaml")
    add("tune/budget_nan", "tune", p["prompts.txt"], "--budget-min", "nan", "--out", "t.yaml")
    add("tune/measure_batch_huge", "tune", p["prompts.txt"], "--measure-batch", "1000000000", "--out", "t.yaml")
    add("tune/max_steps_huge", "tune", p["prompts.txt"], "--max-steps", "1000000000", "--out", "t.yaml")
    add("tune/max_new_tokens_huge", "tune", p["prompts.txt"], "--max-new-tokens", "1000000000000", "--out", "t.yaml")
    add("tune/threads_huge", "tune", p["prompts.txt"], "--threads", "100000", "--out", "t.yaml")
    add("tune/confirm_top_huge", "tune", p["prompts.txt"], "--confirm-top", "1000000000", "--out", "t.yaml")
    add("import/spec_config_deep_json", "import", "vllm", "--speculative-config", "[" * 10000 + "]" * 10000,
        "--model", "m")
    add("import/file_alias_bomb", "import", "sglang", "--file", p["bomb_k8s.yaml"])
    add("import/file_missing", "import", "sglang", "--file", "/nonexistent/launch.sh")
    add("import/file_dev_zero", "import", "sglang", "--file", "/dev/zero")
    add("check/sglang_args_file_bomb", "check", "--sglang-args", "--file", p["bomb_k8s.yaml"])
    add("check/sglang_args_file_fifo", "check", "--sglang-args", "--file", p["fifo.yaml"])
    # artifacts and prompts
    art, renamed = p["art"], p["renamed"]
    add("run/artifact_missing", "run", "/nonexistent/artifact-0123")
    add("run/artifact_renamed_accepted", "run", renamed, "--prompt", "w2 w3 w4", "--max-new-tokens", "4",
        expect=0, timeout=120, words=[f"artifact {art.name}"])  # reported under its content's name
    add("run/prompts_dev_zero", "run", art, "--prompts", "/dev/zero")
    add("run/prompts_fifo", "run", art, "--prompts", p["fifo.yaml"])
    add("run/prompts_deep_jsonl", "run", art, "--prompts", p["deep.jsonl"])
    add("run/prompts_missing", "run", art, "--prompts", "/nonexistent.jsonl")
    add("run/stdin_deep_jsonl", "run", art, stdin=p["deep.jsonl"].read_bytes())
    add("run/max_new_tokens_huge_accepted", "run", art, "--prompt", "w2", "--max-new-tokens", "1000000000000",
        expect=0)  # a cap: decoding stops at max_model_len (finish_reason length)
    add("run/batch_size_huge", "run", art, "--batch-size", "1000000000")
    add("run/limit_huge_accepted", "run", art, "--prompt", "w2", "--limit", "1000000000000000000000",
        "--max-new-tokens", "4", expect=0)  # "the first N prompts": all of them
    add("run/seed_huge", "run", art, "--seed", str(10 ** 30))
    add("run/threads_huge", "run", art, "--threads", "100000")
    add("run/stop_long_accepted", "run", art, "--prompt", "w2", "--stop", "s" * 100_000, "--max-new-tokens", "4",
        expect=0)  # a stop string that never matches costs a comparison per step
    add("bench/concurrency_huge", "bench", art, "--concurrency", "1000000000")
    add("bench/requests_per_slot_huge", "bench", art, "--concurrency", "4", "--requests-per-slot", "1000000000")
    add("bench/max_new_tokens_huge_accepted", "bench", art, "--prompts", p["prompts.txt"], "--limit", "1",
        "--max-new-tokens", "1000000000000",
        expect=0, timeout=120)
    add("bench/prompts_dev_zero", "bench", art, "--prompts", "/dev/zero")
    add("generate/max_model_len_huge", "generate", "--path", p["ckpt"], "--format", "hf",
        "--max-model-len", "1000000000000", "--prompt", "w2")
    add("generate/max_new_tokens_huge_accepted", "generate", "--path", p["ckpt"], "--format", "hf",
        "--max-model-len", "64", "--max-new-tokens", "1000000000000", "--prompt", "w2", "--no-chat", expect=0)
    add("generate/path_missing", "generate", "--path", "/nonexistent/ckpt", "--prompt", "w2")
    add("generate/path_dev_zero", "generate", "--path", "/dev/zero", "--prompt", "w2")
    add("generate/target_escape", "generate", "--target", "../../etc/passwd", "--prompt", "w2")
    add("profile/context_huge", "profile", p["tiny_plan"], "--out", "t.json", "--context", "1000000000000")
    add("profile/repeats_huge", "profile", p["tiny_plan"], "--out", "t.json", "--repeats", "1000000000000")
    add("profile/max_tokens_huge", "profile", p["tiny_plan"], "--out", "t.json", "--max-tokens", "1000000000000")
    add("profile/dtypes_bad", "profile", p["tiny_plan"], "--out", "t.json", "--dtypes", "x" * 10000)
    # serve: refused at startup, before the model loads
    for url in ("file:///etc/passwd", "http://", "ftp://127.0.0.1/x", "127.0.0.1:8001", "http://[::1", "javascript:x"):
        add(f"serve/prefill_url {url}", "serve", art, "--role", "decode", "--prefill-url", url)
    add("serve/decode_without_url", "serve", art, "--role", "decode")
    add("serve/host_bogus", "serve", art, "--host", "no.such.host.invalid")
    add("serve/port_in_use", "serve", art, "--port", str(p["busy_port"]))
    add("serve/max_waiting_huge", "serve", art, "--max-waiting", "1000000000000")
    add("serve/max_request_bytes_huge", "serve", art, "--max-request-bytes", "1000GiB")
    add("serve/batch_size_huge", "serve", art, "--batch-size", "1000000000")
    add("serve/artifact_dev_zero", "serve", "/dev/zero")
    add("serve/seed_negative", "serve", art, "--seed", "-1")
    add("serve/threads_huge", "serve", art, "--threads", "100000")
    # train
    add("train/distill_gen_batch_100000", "train", "distill", "smollm2_specbench", "--gen-batch", "100000",
        "--part", "round1", "--limit", "1")
    add("train/distill_recipe_gen_batch_100000", "train", "distill", p["data_bigbatch.yaml"], "--part", "round1",
        "--limit", "1")
    add("train/distill_shard_of_bad", "train", "distill", "smollm2_specbench", "--shard-of", "3/2")
    add("train/distill_shard_of_garbage", "train", "distill", "smollm2_specbench", "--shard-of", "x" * 1000)
    add("train/corpora_cache_dir_proc", "train", "corpora", "smollm2_specbench", "--cache-dir", "/proc/specc_cache")
    add("train/fit_init_from_missing", "train", "fit", "smollm2_135m_eagle3", "--init-from", "/nonexistent")
    add("train/fit_init_from_dev_zero", "train", "fit", "smollm2_135m_eagle3", "--init-from", "/dev/zero")
    add("train/fit_out_proc", "train", "fit", "smollm2_135m_eagle3", "--out", "/proc/specc_out")
    add("train/fit_recipe_out_proc", "train", "fit", p["recipe_proc_out.yaml"])
    add("train/fit_recipe_alias_bomb", "train", "fit", p["recipe_bomb.yaml"])
    add("train/fit_recipe_deep", "train", "fit", p["recipe_deep.yaml"])
    add("train/fit_recipe_resolver", "train", "fit", p["recipe_env.yaml"])
    add("train/fit_recipe_missing", "train", "fit", "/nonexistent/recipe.yaml")
    add("train/fit_recipe_fifo", "train", "fit", p["fifo.yaml"])
    add("train/fit_threads_huge", "train", "fit", "smollm2_135m_eagle3", "--threads", "100000")
    add("train/fit_time_budget_inf", "train", "fit", "smollm2_135m_eagle3", "--time-budget-min", "inf")
    add("train/vocab_out_proc", "train", "vocab", "smollm2_135m_eagle3", "--out", "/proc/specc_out")
    add("train/render_out_missing", "train", "render", "smollm2_135m_eagle3", "--out", "/nonexistent/head")
    add("train/prompts_recipe_bomb", "train", "prompts", p["recipe_bomb.yaml"])
    return cases


# ------------------------------------------------------------------------------------------ server
class ServeProc:
    """``specc serve`` on a free port as a child process."""

    def __init__(self, art: Path, extra: Sequence[str], scratch: Path) -> None:
        self.port = free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        self.log = open(scratch / f"serve-{self.port}.log", "w+b")
        self.proc = subprocess.Popen([sys.executable, "-m", "specc.cli", "serve", str(art), "--port", str(self.port),
                                      "--log-level", "warning", *extra], cwd=scratch, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_limit)
        t0 = time.time()
        while time.time() - t0 < 120:
            if self.proc.poll() is not None:
                raise RuntimeError(f"specc serve ended at startup: {self.output()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("specc serve did not start")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream_gaps(port: int, max_tokens: int, out: dict) -> None:
    """A streamed completion; records the largest gap between chunks, the chunk count and the last
    event (``out``)."""
    import http.client

    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = json.dumps({"model": out.get("model", "tiny"), "prompt": "Once upon a time", "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out["status"] = resp.status
    last, gap, n, events = time.perf_counter(), 0.0, 0, []
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            now = time.perf_counter()
            gap, last, n = max(gap, now - last), now, n + 1
            events.append(line[6:].strip().decode())
    out.update(max_gap=gap, chunks=n, last=events[-2:] if events else [], seconds=time.perf_counter() - t0)
    conn.close()


def slow_client(s: socket.socket, payload: bytes, interval: float, limit_s: float) -> dict:
    """Send ``payload`` over ``s`` a byte every ``interval`` s; how long until the server closed the
    connection (``closed_after``; None if it stayed open ``limit_s``), its status line (``answer``)
    and all it sent (``raw``)."""
    s.settimeout(0.05)
    t0 = time.perf_counter()
    answer, i = b"", 0
    while time.perf_counter() - t0 < limit_s:
        if i < len(payload):
            try:
                s.sendall(payload[i:i + 1])
            except OSError:
                break
            i += 1
        try:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        except socket.timeout:
            pass
        except OSError:
            break
        time.sleep(interval)
    closed = time.perf_counter() - t0
    s.close()
    return {"closed_after": closed if closed < limit_s else None, "answer": answer.split(b"\r\n", 1)[0].decode(),
            "raw": answer}


def server_cases(p: dict, scratch: Path, flags: List[str], timeout_s: float) -> List[str]:
    """Slow clients beside a streaming one, then SIGTERM with a long stream in flight. Returns the
    report lines."""
    lines = []
    shipped = sorted((ROOT / "generated").glob("smollm2_ngram-*"))
    art = shipped[0] if shipped else p["art"]  # SmolLM2 decodes slowly enough for a stream to outlive the deadlines
    lines.append(f"serve: {art.name}, flags {' '.join(flags) or '(none: this specc has no such options)'}")
    srv = ServeProc(art, flags, scratch)
    model = json.loads((art / "manifest.json").read_text())["plan_name"]
    try:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        clients = {
            "idle connection (sends nothing)": (b"", 0.1),
            "slow headers (a byte every 0.5 s)": (head + b"Content-Length: 10\r\n\r\n{}", 0.5),
            "slow body (headers, then a byte every 0.5 s)": None,
        }
        for name, spec in clients.items():
            out = {"model": model}
            t = threading.Thread(target=stream_gaps, args=(srv.port, 100, out))
            t.start()
            s = socket.create_connection(("127.0.0.1", srv.port))
            if spec is None:  # the headers at once, the body slowly
                s.sendall(head + b"Content-Length: 1000\r\n\r\n")
                spec = (b"{" + b" " * 998 + b"}", 0.5)
            res = slow_client(s, spec[0], spec[1], 3 * timeout_s + 10)
            t.join(300)
            ok = res["closed_after"] is not None and res["closed_after"] < timeout_s + 3 and out.get("status") == 200
            lines.append(f"serve/{name}: closed after {_fmt(res['closed_after'])} s (timeout {timeout_s:g} s), "
                         f"answer {res['answer'] or '-'!r}; the other client's stream: status {out.get('status')}, "
                         f"{out.get('chunks')} chunks, largest gap {out.get('max_gap', 0):.2f} s "
                         f"-> {'ok' if ok else 'FAILS'}")
        # shutdown with a long stream in flight
        out = {"model": model}
        t = threading.Thread(target=stream_gaps, args=(srv.port, 1900, out))
        t.start()
        time.sleep(1.0)
        t0 = time.perf_counter()
        srv.proc.send_signal(signal.SIGTERM)
        try:
            code = srv.proc.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        took = time.perf_counter() - t0
        t.join(60)
        last = " ".join(out.get("last", []))
        ended_with_error = "server_shutdown" in last or "shutting down" in last
        lines.append(f"serve/SIGTERM with a stream in flight: exit {code} after {took:.1f} s (deadline "
                     f"{p['shutdown_s']:g} s); the stream's last events: {last[:200]!r} -> "
                     f"{'ok' if code is not None and took < p['shutdown_s'] + 5 and ended_with_error else 'FAILS'}")
    finally:
        srv.stop()
    return lines


def _fmt(x) -> str:
    return "never" if x is None else f"{x:.1f}"


# --------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="only cases whose name contains this text")
    ap.add_argument("--no-server", action="store_true", help="skip the server cases")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    ap.add_argument("--setup-artifact", default=None, metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.setup_artifact:
        print(json.dumps({k: str(v) for k, v in tiny_artifact(Path(args.setup_artifact)).items()}))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="specc-hostile-"))
    t_all = time.perf_counter()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        inputs = write_inputs(scratch / "inputs")
        inputs["busy_port"] = busy.getsockname()[1]
        cases = [c for c in cli_cases(inputs) if args.only is None or args.only in c.name]
        print(f"# specc hostile sweep: {len(cases)} command cases; CPU (lscpu) {_cpu()}; {os.cpu_count()} CPUs; "
              f"{_mem_gib():.1f} GiB of memory available; python {platform.python_version()}")
        print(f"# goal per refusal: exit 2, no traceback, < {GOAL_SECONDS:g} s, < {GOAL_RSS_MB:g} MB peak RSS, "
              f"nothing left in the case folder")
        print(f"{'case':58} {'exit':>4} {'want':>4} {'s':>6} {'MB':>6}  verdict")
        results = []
        for case in cases:
            r = run_case(case, scratch / "cases")
            results.append(r)
            verdict = "ok" if r.ok else "FAILS: " + _why(r)
            print(f"{case.name[:58]:58} {str(r.code):>4} {case.expect:>4} {r.seconds:6.2f} {r.rss_mb:6.0f}  {verdict}",
                  flush=True)
        refusals = [r for r in results if r.case.expect == 2]
        failing = [r for r in results if not r.ok]
        print(f"# {len(results)} cases, {len(failing)} failing the goal; worst refusal time "
              f"{max((r.seconds for r in refusals), default=0):.2f} s, worst peak RSS "
              f"{max((r.rss_mb for r in refusals), default=0):.0f} MB")
        if not args.no_server and (args.only is None or "serve" in args.only):
            help_text = subprocess.run([sys.executable, "-m", "specc.cli", "serve", "--help"], capture_output=True,
                                       text=True, cwd=ROOT).stdout
            flags, timeout_s = [], 0.0
            inputs["shutdown_s"] = 30.0
            if "--header-timeout" in help_text:
                flags = ["--header-timeout", "2", "--body-timeout", "2", "--shutdown-timeout", "3"]
                timeout_s, inputs["shutdown_s"] = 2.0, 3.0
            else:
                timeout_s = float("inf")
            for line in server_cases(inputs, scratch, flags, timeout_s if timeout_s != float("inf") else 10.0):
                print(line, flush=True)
        print(f"# sweep took {time.perf_counter() - t_all:.0f} s")
    finally:
        busy.close()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"# scratch kept in {scratch}")
    return 0


def _mem_gib() -> float:
    from specc.device import available_memory

    return available_memory() / (1 << 30)


def _why(r: Result) -> str:
    parts = []
    if r.code != r.case.expect:
        parts.append(f"exit {r.code}")
    if r.traceback:
        last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-1:]
        parts.append(f"traceback ({last[0][:90] if last else ''})")
    if r.case.expect == 2 and r.seconds >= GOAL_SECONDS:
        parts.append(f"{r.seconds:.1f} s")
    if r.case.expect == 2 and r.rss_mb >= GOAL_RSS_MB:
        parts.append(f"{r.rss_mb:.0f} MB")
    if r.left:
        parts.append(f"left {', '.join(r.left[:3])}")
    missing = [w for w in r.case.words if w not in r.stderr]
    if missing:
        parts.append(f"message lacks {missing}")
    if r.code not in (r.case.expect,) and not r.traceback:
        tail = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-1:]
        if tail:
            parts.append(tail[0][:100])
    return "; ".join(parts)


def _cpu() -> str:
    """The CPU as ``lscpu`` names it (model name, family, model, hypervisor), else ``/proc/cpuinfo``."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    keys = ("Model name", "CPU family", "Model", "Hypervisor vendor")
    facts = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    found = [f"{k} {facts[k].strip()}" for k in keys if k in facts]
    if found:
        return ", ".join(found)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
