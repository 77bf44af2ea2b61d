"""tools/bench_llamacpp.py, the pure parts only: argument validation, the summary (rates, ratios,
exactness), the markdown table, the CPU record and the llama.cpp build flags. Nothing is built, no
worker starts, no model loads."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_llamacpp", ROOT / "tools" / "bench_llamacpp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--limit", "-1"], ["--new-tokens", "x"],
                                  ["--threads", "0"], ["--threads", "100000"], ["--threads", ","],
                                  ["--pld", "0"], ["--presets", "no_such_preset"], ["--bogus"]])
def test_usage_errors_exit_2(bench, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_defaults_and_smoke(bench):
    a = bench.parse_args([])
    assert (a.rounds, a.limit, a.new_tokens, a.pld) == (3, 12, 128, [4, 10])
    assert a.threads and a.threads[0] == 1
    s = bench.parse_args(["--smoke"])
    assert (s.rounds, s.limit, s.new_tokens, s.threads) == (1, 2, 8, [1])
    s = bench.parse_args(["--smoke", "--new-tokens", "16", "--threads", "1,1"])
    assert (s.new_tokens, s.threads) == (16, [1])


def _rows(tokens, total=1.0, prefill=0.2, steps=None):
    return [{"tokens": list(t), "total_s": total, "prefill_s": prefill, "steps": steps or len(t) - 1,
             "emitted": len(t) - 1} for t in tokens]


def test_decode_rate_excludes_prefill_and_first_token(bench):
    # 2 requests x 9 tokens: 16 decode tokens over 2 x (1.0 - 0.2) s
    assert bench.decode_rate(_rows([range(9), range(9)])) == pytest.approx(10.0)


def test_summary_ratios_and_exactness(bench):
    a, b = [1, 2, 3, 4, 5], [1, 2, 9, 9, 9]
    results = {
        "llamacpp/plain@T1": [_rows([a, a], total=1.0), _rows([a, a], total=0.6)],
        "llamacpp/pld4@T1": [_rows([a, a], total=0.7), _rows([a, a], total=0.7)],
        "specc/plain@T1": [_rows([a, b], total=1.8), _rows([a, b], total=1.8)],
        "specc/smollm2_ngram@T1": [_rows([a, b], total=0.6, steps=2), _rows([a, b], total=1.0, steps=2)],
        "specc/smollm2_suffix@T1": [_rows([a, a], total=0.6), _rows([a, b], total=0.6)],
    }
    rows = {r["config"]: r for r in bench.summarize(results)}
    lp, pld, sp, ng, sx = (rows[k] for k in results)
    assert lp["best"] == pytest.approx(8 / 0.8) and lp["median"] == pytest.approx((8 / 1.6 + 8 / 0.8) / 2)
    assert pld["median"] == pytest.approx(8 / 1.0)
    assert lp["vs_llamacpp_plain"] == pytest.approx(1.0)
    assert pld["vs_llamacpp_plain"] == pytest.approx(8.0 / lp["median"])
    assert ng["llamacpp_best"] == "llamacpp/pld4@T1"  # median 8.0 > plain 7.5
    assert ng["median"] == pytest.approx((8 / 0.8 + 8 / 1.6) / 2)
    assert ng["vs_llamacpp_best"] == pytest.approx(ng["median"] / max(lp["median"], pld["median"]))
    assert ng["tau"] == pytest.approx(16 / 8)
    assert sp["exact"] is None and ng["exact"] is True and sx["exact"] is False
    assert sx["same_as_own_plain"] == "1/2" and ng["same_as_llamacpp_plain"] == "1/2"
    assert pld["exact"] is True and pld["same_as_llamacpp_plain"] == "2/2"
    table = bench.format_markdown(bench.summarize(results))
    lines = table.splitlines()
    assert lines[0].startswith("| T | engine | config |") and len(lines) == 2 + len(results)
    assert "NO (1/2)" in table and "| yes |" in table


def test_config_order_rotates(bench):
    cfgs = ["a", "b", "c"]
    assert [bench.config_order(cfgs, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


LSCPU = """Architecture:                            x86_64
CPU(s):                                  2
Vendor ID:                               GenuineIntel
Model name:                              Intel(R) Xeon(R) Processor
Hypervisor vendor:                       KVM
Flags:                                   fpu sse avx2 avx512f avx512_vnni amx_tile amx_int8
"""


def test_cpu_record(bench):
    info = bench.parse_cpu_info(LSCPU, "")
    assert info["model"] == "Intel(R) Xeon(R) Processor" and info["cpus"] == 2 and info["hypervisor"] == "KVM"
    assert info["flags"] == {"avx2": True, "avx512f": True, "avx512_vnni": True, "amx_int8": True}
    amd = bench.parse_cpu_info("", "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: sse avx2 fma\n"
                                   "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: sse avx2 fma\n")
    assert amd["model"] == "AMD EPYC 7B13" and amd["cpus"] == 2
    assert amd["flags"] == {"avx2": True, "avx512f": False, "avx512_vnni": False, "amx_int8": False}


def test_build_config(bench, tmp_path):
    gcc = bench.llamacpp_build_config(tmp_path, machine="x86_64", compiler="gcc 12.2.0")
    assert gcc["CMAKE_ARGS"] == "-DGGML_NATIVE=ON" and gcc["package"] == "llama-cpp-python==0.3.36"
    assert gcc["CFLAGS"] == gcc["CXXFLAGS"] == f"-include {tmp_path / 'ggml_amx_gcc_fix.h'}"
    assert "__AMX_TILE__" in bench.AMX_FIX_HEADER and len(gcc["fix_header_sha256"]) == 64
    clang = bench.llamacpp_build_config(tmp_path, machine="x86_64", compiler="clang 16.0.0")
    assert clang["CFLAGS"] == "" and clang["CMAKE_ARGS"] == "-DGGML_NATIVE=ON"
    arm = bench.llamacpp_build_config(tmp_path, machine="aarch64", compiler="gcc 12.2.0")
    assert arm["CFLAGS"] == ""
    # --isa avx2: no native flags, AVX2 on, every AVX-512 / AMX path off; a stamp of its own (the native
    # venv's stamp has no "isa", so it is not rebuilt by this option's existence)
    avx2 = bench.llamacpp_build_config(tmp_path, machine="x86_64", compiler="gcc 12.2.0", isa="avx2")
    flags = dict(f[2:].split("=") for f in avx2["CMAKE_ARGS"].split())
    assert flags["GGML_NATIVE"] == "OFF" and flags["GGML_AVX2"] == flags["GGML_FMA"] == flags["GGML_F16C"] == "ON"
    assert all(v == "OFF" for k, v in flags.items() if "AVX512" in k or "AMX" in k) and avx2["isa"] == "avx2"
    assert "isa" not in gcc and avx2 != gcc
