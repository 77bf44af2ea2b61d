#!/usr/bin/env python
"""Record what an engine's own code says about specc's deployment test plans.

    python tools/engine_verdicts.py sglang 0.5.23 --source /path/to/unpacked/sglang/wheel
    python tools/engine_verdicts.py vllm 0.33.0 --source /path/to/unpacked/vllm/wheel

For every case of ``tests/fixtures/engine_verdicts/cases.json`` (a base plan plus overrides) this
exports the plan with specc's own exporter, points the model paths at local ``config.json`` files
written from ``specc/data/model_shapes.json`` (no weights: argument resolution reads configs only),
and hands the command to the engine exactly as its launcher does:

* SGLang: ``argparse`` + ``ServerArgs.add_cli_args``, ``ServerArgs.from_cli_args``,
  ``resolve_once()`` (the resolution pipeline, ``sglang/srt/arg_groups/pipeline.py``) and
  ``check_server_args()`` (``arg_groups/validation_hook.py``). SGLang sizes its defaults from the GPU
  memory; ``get_device_memory_capacity`` is answered with the case's hardware profile
  (``memory_bytes`` in MiB), so a CPU stands in for that GPU.
* vLLM: ``FlexibleArgumentParser`` + ``make_arg_parser``, ``validate_parsed_serve_args``,
  ``EngineArgs.from_cli_args`` and ``create_engine_config()``. vLLM picks its platform itself: on a
  CPU it is the CPU platform (Model Runner V1, no CUDA graphs), which the output records.

It writes ``tests/fixtures/engine_verdicts/<engine>-<version>.json``: per case the command, the
verdict (``ok`` or ``error`` with the exception's type and first line) and the resolved values of
the deployment keys. ``tests/check/test_engine_verdicts.py`` compares ``specc check`` with it. Engine
packages are not dependencies of specc: run this with a scratch environment that has what the
engine's argument modules import. Modules they import at module level but never call while
resolving arguments can be stubbed with ``--stub NAME`` (each stub is recorded in the output).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import shlex
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = REPO / "tests" / "fixtures" / "engine_verdicts" / "cases.json"
sys.path.insert(0, str(REPO))

#: model_type per architecture, for the configs written from specc/data/model_shapes.json
MODEL_TYPE = {"LlamaForCausalLM": "llama", "LlamaForCausalLMEagle3": "llama", "LlamaForCausalLMEagle": "llama",
              "Qwen3ForCausalLM": "qwen3"}


# ------------------------------------------------------------------------------------------------
# Stubs for modules imported at module level and never called during argument resolution


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubObject(f"{self.__name__}.{name}")


class _StubObject:
    def __init__(self, name):
        self._name = name

    def __call__(self, *a, **k):
        return _StubObject(self._name + "()")

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StubObject(f"{self._name}.{name}")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = tuple(roots)

    def find_spec(self, fullname, path, target=None):
        if any(fullname == r or fullname.startswith(r + ".") for r in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


# ------------------------------------------------------------------------------------------------
# Plans and local configs


def build_plan(case: dict, bases: dict):
    """The case's plan dict (its base with the dotted overrides applied)."""
    import copy

    data = copy.deepcopy(bases[case["base"]])
    for dotted, value in case.get("set", {}).items():
        cur = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            cur = cur.setdefault(part, {})
        cur[parts[-1]] = value
    return data


def local_config(hub_id: str, root: Path) -> str:
    """A directory holding a ``config.json`` for ``hub_id`` written from the shipped shape facts."""
    shapes = json.loads((REPO / "specc" / "data" / "model_shapes.json").read_text())
    entry = {k: v for k, v in shapes[hub_id].items() if k != "source"}
    arch = entry["architectures"][0]
    entry.update(model_type=MODEL_TYPE.get(arch, "llama"), max_position_embeddings=131072, rms_norm_eps=1e-5,
                 rope_theta=500000.0, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2, hidden_act="silu")
    d = root / hub_id.replace("/", "__")
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(entry))
    return str(d)


def launch(plan, engine: str, root: Path):
    """(argv, env) the specc exporter gives for ``plan``, with model paths made local."""
    from specc.export import export
    from specc.plan.load import plan_from_dict

    p = plan_from_dict(plan, validate=False)
    out = export(p, engine)
    paths = {x: local_config(x, root) for x in (p.target.path, p.draft.path if p.draft else None) if x}
    if engine == "sglang":
        argv = [paths.get(a, a) for a in out.args]
        return argv, dict(out.env)
    argv = ["--model", paths[p.target.path], *out.args]
    if out.speculative_config is not None:
        sc = dict(out.speculative_config)
        if sc.get("model") in paths:
            sc["model"] = paths[sc["model"]]
        argv += ["--speculative-config", json.dumps(sc)]
    return argv, {}


# ------------------------------------------------------------------------------------------------
# The engines


def _first_line(exc: BaseException) -> str:
    """The exception's type and message: its first line, and for a pydantic ValidationError the line
    that says what is wrong (``Value error, ...`` / ``Input should be ...``)."""
    text = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    head = text[0] if text else ""
    detail = [ln for ln in text[1:] if ln.startswith(("Value error", "Input should", "Assertion"))]
    if detail:
        head += " " + detail[0].split(" [type=")[0]
    return f"{type(exc).__name__}: {head}"[:500]


def sglang_verdict(argv, env, hardware):
    import sglang.srt.arg_groups.memory_hook as memory_hook
    from sglang.srt.server_args import ServerArgs

    from specc.predict import cost

    mem = cost.load_hardware_profile(hardware).memory_bytes if hardware else None
    memory_hook.get_device_memory_capacity = lambda device=None: (mem / (1 << 20)) if mem else None

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # argparse would print usage and exit 2
            raise ValueError(f"argparse: {message}")

    old = dict(os.environ)
    os.environ.update(env)
    try:
        parser = Parser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        args = parser.parse_args(["--device", "cuda", "--skip-tokenizer-init", *argv])
        sa = ServerArgs.from_cli_args(args)
        sa.resolve_once()
        sa.check_server_args()
        d = sa.resolved_dict()
    except BaseException as exc:  # noqa: BLE001 - any refusal is the verdict
        return {"verdict": "error", "error": _first_line(exc)}
    finally:
        os.environ.clear()
        os.environ.update(old)
    decode = (d.get("cuda_graph_config") or {}).get("decode") or {}
    return {"verdict": "ok", "resolved": {
        "deploy.structured_output.backend": d.get("grammar_backend"),
        "deploy.reasoning_parser": d.get("reasoning_parser"),
        "deploy.memory_fraction": d.get("mem_fraction_static"),
        "deploy.cuda_graph_max_bs": decode.get("max_bs"),
        "deploy.max_running_requests": d.get("max_running_requests"),
        "deploy.prefix_caching": (bool(d.get("disaggregation_decode_enable_radix_cache"))
                                  if d.get("disaggregation_mode") == "decode" else not d.get("disable_radix_cache")),
        "deploy.overlap_scheduler": not d.get("disable_overlap_schedule"),
        "deploy.parallel.tp": d.get("tp_size"), "deploy.parallel.pp": d.get("pp_size")}}


def vllm_verdict(argv, env):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    old = dict(os.environ)
    os.environ.update(env)
    try:
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                args = parser.parse_args([*argv, "--skip-tokenizer-init"])
            except SystemExit:
                lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
                tail = [ln for ln in lines if "error:" in ln] + lines[-3:]
                raise ValueError("argparse: " + " ".join(dict.fromkeys(tail))) from None
        validate_parsed_serve_args(args)
        cfg = EngineArgs.from_cli_args(args).create_engine_config()
    except BaseException as exc:  # noqa: BLE001 - any refusal is the verdict
        return {"verdict": "error", "error": _first_line(exc)}
    finally:
        os.environ.clear()
        os.environ.update(old)
    sc = cfg.speculative_config
    return {"verdict": "ok", "resolved": {
        "deploy.structured_output.backend": cfg.structured_outputs_config.backend,
        "deploy.reasoning_parser": cfg.structured_outputs_config.reasoning_parser or None,
        "deploy.memory_fraction": cfg.cache_config.gpu_memory_utilization,
        "deploy.prefix_caching": cfg.cache_config.enable_prefix_caching,
        "deploy.parallel.tp": cfg.parallel_config.tensor_parallel_size,
        "deploy.parallel.pp": cfg.parallel_config.pipeline_parallel_size,
        "deploy.parallel.draft_tp": sc.draft_tensor_parallel_size if sc is not None else None}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", choices=("sglang", "vllm"))
    ap.add_argument("version")
    ap.add_argument("--source", required=True, help="directory holding the unpacked engine package")
    ap.add_argument("--stub", action="append", default=[], help="module to stub (repeatable)")
    ap.add_argument("--only", action="append", default=[], help="run only these case ids")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.source).resolve()))
    if args.stub:
        sys.meta_path.insert(0, _StubFinder(args.stub))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.engine == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    spec = json.loads(CASES.read_text())
    out_cases = []
    with tempfile.TemporaryDirectory(prefix="specc-verdicts-") as tmp:
        root = Path(tmp)
        for case in spec["cases"]:
            if not case["id"].startswith("sgl_" if args.engine == "sglang" else "vllm_"):
                continue
            if args.only and case["id"] not in args.only:
                continue
            plan = build_plan(case, spec["bases"])
            argv, env = launch(plan, args.engine, root)
            env = {**env, **case.get("env", {})}
            verdict = (sglang_verdict(argv, env, case.get("hardware")) if args.engine == "sglang"
                       else vllm_verdict(argv, env))
            shown = [a.replace(tmp, "<configs>") for a in argv]
            out_cases.append({"id": case["id"], "command": " ".join(shlex.quote(a) for a in shown), "env": env,
                              "hardware": case.get("hardware"), **verdict})
            print(f"{case['id']}: {verdict['verdict']} {verdict.get('error', '')}", file=sys.stderr)
    platform = "cpu (the engine's CPU platform)" if args.engine == "vllm" else "cpu, GPU memory from the case's hardware profile"
    data = {"engine": args.engine, "version": args.version,
            "generated_by": "tools/engine_verdicts.py from the engine's own argument resolution",
            "platform": platform, "stubs": list(args.stub), "cases": out_cases}
    out = CASES.parent / f"{args.engine}-{args.version}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out} ({len(out_cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
