"""`specc profile`: the cost table it measures (on a tiny model here) is a table the cost model reads,
with every profiled size, and the command refuses an unusable --out before loading anything."""
import json

import pytest
import torch

from specc.predict import cost
from specc.cli import main as cli_main
from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.runtime.profile import FORMAT, cost_table, profile_costs, token_grid
from specc.runtime.testing import perturbed_copy, tiny_llama


def qgemm_available() -> bool:
    from specc.kernels import qgemm

    return qgemm.available()


def test_token_grid_covers_every_small_size_and_the_top():
    g = token_grid(100)
    assert g[:64] == list(range(1, 65)) and g[-1] == 100 and g == sorted(set(g))
    assert token_grid(5) == [1, 2, 3, 4, 5]


def test_profile_of_a_tiny_model_loads_as_a_cost_table(tmp_path):
    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=1, max_model_len=64)
    drafter = DraftModelDrafter(perturbed_copy(target, noise=0.02), 64)
    measured = profile_costs(target, drafter, max_batch=4, max_width=3, context=16, repeats=2)
    assert sorted(int(n) for n in measured["verify_ms"]) == list(range(1, 13))
    assert sorted(int(b) for b in measured["draft_ms"]) == [1, 2, 3, 4]
    for n, v in measured["verify_ms"].items():
        assert v == pytest.approx(measured["forward_ms"][n] + measured["accept_ms"][n], abs=1e-3) and v > 0
    table = cost_table(measured, device=torch.device("cpu"), plan="tiny", method="draft_model", context=16,
                       repeats=2, threads=1)
    assert table["format"] == FORMAT and table["versions"]["torch"] == torch.__version__
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    loaded = cost.load_cost_table(str(path))
    assert loaded.step_ms(12) >= loaded.step_ms(1) > 0 and loaded.draft_pass_ms(4) is not None


def test_state_shapes_interleaved_without_a_prefill():
    """specc tune's spot check: every (B, W) shape timed round-robin over an unfilled cache, a median
    per shape; the rounds are reported; a shape past the cache is refused."""
    from specc.runtime.profile import time_state_shapes

    torch.set_num_threads(1)
    target = tiny_llama(seed=0, vocab_size=64, num_layers=1, max_model_len=64)
    rounds, calls = [], []
    forward = target.forward
    target.forward = lambda ids, *a, **k: (calls.append(tuple(ids.shape)), forward(ids, *a, **k))[1]
    ms = time_state_shapes(target, [(1, 1), (1, 3), (4, 2)], context=16, repeats=3, fill=False, interleave=True,
                           on_progress=rounds.append)
    assert set(ms) == {"1x1", "1x3", "4x2"} and all(v > 0 for v in ms.values())
    assert rounds == [f"round {r} of 3" for r in range(4)]  # one warm-up round, three timed
    assert calls[:3] == [(1, 1), (1, 3), (4, 2)] and (4, 16) not in calls  # no history prefill
    runs = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]  # the shapes' runs, in order
    assert runs == [(1, 1), (1, 3), (4, 2)] * 4  # round-robin, each timed call after its own shape
    assert len(calls) > 12  # the timed calls come after untimed ones of the same shape (steady_rounds)
    calls.clear()
    time_state_shapes(target, [(1, 1), (1, 3)], context=16, repeats=2)
    assert calls == [(1, 16), (1, 1), (1, 1), (1, 1), (1, 3), (1, 3), (1, 3)]  # filled, then back to back
    with pytest.raises(ValueError, match="max_model_len"):
        time_state_shapes(target, [(1, 8)], context=60, repeats=1, fill=False, interleave=True)
    # a ragged verify: the first n rows at W tokens, the others at one (num_tokens)
    seen = []
    target.forward = lambda ids, *a, **k: (seen.append(k.get("num_tokens")), forward(ids, *a, **k))[1]
    ms = time_state_shapes(target, [(4, 3, 1), (4, 1)], context=16, repeats=1, fill=False, interleave=True)
    assert set(ms) == {"4x3r1", "4x1"}
    assert seen[0].tolist() == [3, 1, 1, 1] and seen[1] is None
    with pytest.raises(ValueError, match="ragged"):
        time_state_shapes(target, [(4, 3, 1)], context=16, repeats=1, compiled=True)


def test_steady_rounds_times_each_size_after_its_own_warm_calls():
    """The profiler times the runtime's steady state: every timed call at a size comes right after
    untimed calls of that size worth ``warm_ms`` (not right after a heavier size, which on a CPU made
    the small sizes' table overstate the runtime's step), sizes round-robin, one untimed round first."""
    from specc.runtime.profile import steady_rounds

    now = [0.0]
    log = []  # (key, timed?) per call

    def clock():
        return now[0]

    def call(key, ms):
        def fn():
            log.append(key)
            now[0] += ms / 1e3
        return fn

    rounds = []
    times = steady_rounds([("small", call("small", 2.0)), ("big", call("big", 50.0))], 3, warm_ms=10.0,
                          clock=clock, on_round=rounds.append)
    assert rounds == [0, 1, 2, 3]
    assert {k: [round(t, 6) for t in v] for k, v in times.items()} == {"small": [2.0] * 3, "big": [50.0] * 3}
    assert log[:2] == ["small", "big"]  # the untimed round: each size once
    # each timed round: 5 untimed small calls (10 ms) + the timed one, then 1 untimed big call + the timed one
    assert log[2:] == (["small"] * 6 + ["big"] * 2) * 3


def test_profile_refuses_an_unwritable_out_before_loading(tmp_path, capsys):
    rc = cli_main(["profile", "smollm2_ngram", "--out", str(tmp_path / "no_such_dir" / "t.json")])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------ the measured choice of dtype and backend
SETTINGS = {  # a CPU without bf16 speed: bf16 slower at one token, flatter over 16
    "float32/eager": {"forward_ms": {"1": 30.0, "5": 34.0, "16": 80.0}, "state_ms": {"1x1": 30.0, "1x5": 34.0}},
    "bfloat16/eager": {"forward_ms": {"1": 60.0, "5": 60.0, "16": 62.0}, "state_ms": {"1x1": 60.0, "1x5": 60.0}},
    "bfloat16/inductor": {"state_ms": {"1x1": 50.0, "1x5": 52.0}},
}
CPU = {"model": "test CPU", "capability": "AVX512", "onednn_isa": "Intel AVX-512 with bfloat16 support",
       "onednn_bf16_kernel": "matmul:brg_matmul:avx512_core_bf16", "amx": False, "threads": 1}


def test_choice_says_why_bf16_was_not_chosen():
    from specc.runtime.profile import choose

    c = choose(SETTINGS, CPU)
    assert (c["dtype"], c["compile_backend"]) == ("float32", "eager")
    assert "bfloat16 not chosen: 1.59x float32's time" in c["why"]  # best bf16 (51 ms) over fp32 (32 ms)
    assert "bfloat16/eager 1.03x at 16" in c["why"] and "float32/eager 2.67x at 16" in c["why"]
    assert "avx512_core_bf16 (no AMX" in c["why"]


def test_choice_says_why_bf16_was_chosen():
    from specc.runtime.profile import choose

    fast = dict(SETTINGS, **{"bfloat16/eager": {"state_ms": {"1x1": 12.0, "1x5": 13.0}}})
    c = choose(fast, dict(CPU, amx=True, onednn_bf16_kernel="matmul:brg_matmul:avx10_1_512_amx"))
    assert (c["dtype"], c["compile_backend"]) == ("bfloat16", "eager")
    assert "bfloat16 chosen: 2.56x faster than float32" in c["why"] and "(AMX;" in c["why"]


def test_half_precision_inductor_is_never_chosen():
    """Inductor's bf16 CPU kernels are not row-invariant (speculative greedy differed from plain greedy in
    tools/bench_backends.py), so even the fastest such setting is ranked but not chosen."""
    from specc.runtime.profile import choose

    fast = dict(SETTINGS, **{"bfloat16/inductor": {"state_ms": {"1x1": 1.0, "1x5": 1.0}}})
    c = choose(fast, CPU)
    assert c["compile_backend"] != "inductor" or c["dtype"] == "float32"
    assert "bfloat16/inductor not eligible" in c["why"]


def _table_file(tmp_path, choice):
    table = {"format": FORMAT, "device": "cpu", "verify_ms": {"1": 30.0, "5": 34.0}, "settings": SETTINGS,
             "choice": choice, "cpu": CPU}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(table))
    return path


def test_a_profile_with_compiled_settings_loads(tmp_path):
    """A compiled setting is timed at the state shapes only (``state_ms``): its one-request shapes
    stand for its forward by token count."""
    from specc.runtime.profile import choose

    loaded = cost.load_cost_table(str(_table_file(tmp_path, choose(SETTINGS, CPU))))
    assert loaded.choice == {"dtype": "float32", "compile_backend": "eager"}
    assert loaded.settings["bfloat16/inductor"] == {1: 50.0, 5: 52.0}
    assert "bfloat16 not chosen" in loaded.choice_why


def test_runtime_auto_settings_read_the_profile():
    from specc.runtime.loader import choose_settings

    cpu = torch.device("cpu")
    spec = {"target": {"dtype": "auto"}, "dtype": "auto", "compile_backend": "auto",
            "schedule": {"cost_table": {"choice": {"dtype": "bfloat16", "compile_backend": "inductor"}}}}
    dtype, backend, why = choose_settings(spec, cpu)
    assert (dtype, backend) == ("bfloat16", "inductor") and "measured it fastest" in why
    assert choose_settings(dict(spec, schedule={}), cpu)[:2] == ("float32", "eager")  # no profile: nothing assumed
    assert choose_settings(dict(spec, dtype="float32", compile_backend="eager"), cpu)[:2] == ("float32", "eager")
    assert choose_settings(spec, torch.device("cuda"))[1] == "eager"  # CUDA captures graphs instead


def test_cpu_dtype_rule_reads_the_profile(tmp_path):
    """S-CPU-DTYPE warns about an explicit bf16 on the CPU unless the device profile measured bf16
    fastest, and then says why the profile chose otherwise."""
    from specc.plan.load import plan_from_dict
    from specc.check import check
    from specc.runtime.profile import choose

    from tests.rule_cases import S_NG, build

    def warned(table):
        data = build(S_NG, {"runtime.device": "cpu", "runtime.dtype": "bfloat16"},
                     {"schedule.cost_table": str(table)} if table else {})
        return [v for v in check(plan_from_dict(data, validate=False), "specc") if v.rule == "specc.S-CPU-DTYPE"]

    assert "no device profile measured it" in warned(None)[0].message
    slow = warned(_table_file(tmp_path, choose(SETTINGS, CPU)))
    assert len(slow) == 1 and "measured float32 faster" in slow[0].message and "bfloat16 not chosen" in slow[0].message
    (tmp_path / "fast").mkdir()
    fast = dict(SETTINGS, **{"bfloat16/eager": {"forward_ms": {"1": 10.0}, "state_ms": {"1x1": 10.0, "1x5": 11.0}}})
    assert warned(_table_file(tmp_path / "fast", choose(fast, CPU))) == []


def test_kernel_variant_choice_ranks_and_loads(tmp_path):
    """The profile's kernel-variant choice is the lowest mean over the state shapes; a table carrying it
    loads (and one naming no variant of the kernels is refused naming the field and the variants); explain's origin line names it."""
    from specc.commands.explain import _cost_table_origin
    from specc.errors import PlanError
    from specc.runtime.profile import choose, choose_variant

    block = choose_variant({"avx2": {"1x1": 14.0, "1x5": 20.0}, "avx512vnni": {"1x1": 9.0, "1x5": 16.0},
                            "avx2int8": {"1x1": 9.5, "1x5": 16.5}})
    assert block["chosen"] == "avx512vnni"
    assert block["why"].index("avx512vnni") < block["why"].index("avx2int8") < block["why"].index("avx2 ")
    with pytest.raises(ValueError, match="no variant"):
        choose_variant({})
    choice = dict(choose(SETTINGS, CPU), qgemm_variant="avx512vnni")
    path = _table_file(tmp_path, choice)
    data = json.loads(path.read_text())
    data["qgemm"] = {"state_ms": {}, **block}
    path.write_text(json.dumps(data))
    loaded = cost.load_cost_table(str(path))
    assert loaded.choice["qgemm_variant"] == "avx512vnni"
    line = _cost_table_origin(str(path))
    assert "quantized kernels avx512vnni chosen" in line and "avx2int8 13.0 ms" in line
    for bad in ("avx 512", "avx1024"):  # malformed, and well-formed but no variant of the kernels
        data["choice"]["qgemm_variant"] = bad
        path.write_text(json.dumps(data))
        with pytest.raises(PlanError, match=f"qgemm_variant '{bad}' is not a CPU kernel variant; use one of portable"):
            cost.load_cost_table(str(path))


@pytest.mark.skipif(not qgemm_available(), reason="qgemm unavailable")
def test_runtime_takes_the_profiled_kernel_variant(monkeypatch):
    """A native target runs the variant the device profile chose when this CPU runs it; an unknown one, or
    SPECC_QGEMM_VARIANT, leaves the process's variant alone, and the reason says which."""
    from specc.kernels import qgemm
    from specc.runtime.loader import kernel_variant

    monkeypatch.delenv("SPECC_QGEMM_VARIANT", raising=False)
    spec = {"schedule": {"cost_table": {"choice": {"dtype": "native", "compile_backend": "eager",
                                                   "qgemm_variant": qgemm.supported()[0]}}}}
    assert kernel_variant(spec) == (qgemm.supported()[0], f"qgemm variant {qgemm.supported()[0]} "
                                                          "(the device profile measured it fastest)")
    spec["schedule"]["cost_table"]["choice"]["qgemm_variant"] = "neon"
    variant, why = kernel_variant(spec)
    assert variant == qgemm.default_variant() and "chose neon, which this CPU does not run" in why
    # no profile: this CPU's default, whatever an earlier load set
    qgemm.set_variant(qgemm.supported()[0])
    try:
        assert kernel_variant({"schedule": {}}) == (qgemm.default_variant(), f"qgemm variant "
                                                    f"{qgemm.default_variant()} (no device profile: the default for this CPU)")
    finally:
        qgemm.set_variant(qgemm.default_variant())
    monkeypatch.setenv("SPECC_QGEMM_VARIANT", qgemm.variant())
    spec["schedule"]["cost_table"]["choice"]["qgemm_variant"] = qgemm.supported()[0]
    assert kernel_variant(spec) == (None, f"qgemm variant {qgemm.variant()} (SPECC_QGEMM_VARIANT)")


def test_qgemm_variants_for_a_non_native_profile_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    import specc.runtime.loader as loader

    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loader, "load_models", no_load)
    out = tmp_path / "t.json"
    rc = cli_main(["profile", "smollm2_ngram", "--out", str(out), "--dtypes", "float32", "--qgemm-variants", "avx2"])
    err = capsys.readouterr().err
    assert rc != 0 and "--qgemm-variants avx2" in err and "native dtype only" in err and not out.exists()
