"""The runtime loader's default dtype: a checkpoint runs in its own bytes on the CPU when nothing chose."""
import json

import pytest
import torch
from safetensors.torch import save_file

from specc.kernels import qgemm
from specc.runtime.loader import choose_settings, default_dtype, half_checkpoint_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _hf_dir(root, stored, says=None):
    """A directory with a config.json (``torch_dtype: says``, absent when None) and 2-D tensors
    stored in ``stored`` (plus a 1-D fp32 norm, which does not count)."""
    root.mkdir()
    cfg = {"model_type": "llama"} if says is None else {"model_type": "llama", "torch_dtype": says}
    (root / "config.json").write_text(json.dumps(cfg))
    save_file({"model.embed_tokens.weight": torch.ones(64, 32, dtype=DTYPES[stored]),
               "model.layers.0.mlp.up_proj.weight": torch.ones(48, 32, dtype=DTYPES[stored]),
               "model.norm.weight": torch.ones(32)}, str(root / "model.safetensors"))
    return str(root)


@pytest.mark.parametrize("stored, expected", [("float16", "native"), ("bfloat16", "native"),
                                              ("float32", "float32")])
def test_a_half_checkpoint_runs_native_on_the_cpu_by_default(tmp_path, stored, expected):
    if not qgemm.available():
        pytest.skip(f"the C kernels do not build here: {qgemm.status()}")
    path = _hf_dir(tmp_path / "ckpt", stored, says=stored)
    dtype, why = default_dtype({"path": path, "format": "hf"}, CPU)
    assert dtype == expected
    assert (f"own {stored} weights" in why) == (expected == "native")
    assert default_dtype({"path": path, "format": "hf"}, CUDA)[0] == "float32"


def test_the_tensors_decide_not_the_config(tmp_path):
    assert half_checkpoint_dtype(_hf_dir(tmp_path / "says_f16", "float32", says="float16")) is None
    assert half_checkpoint_dtype(_hf_dir(tmp_path / "says_nothing", "bfloat16")) == "bfloat16"
    mixed = tmp_path / "mixed"
    _hf_dir(mixed, "float16")
    save_file({"model.embed_tokens.weight": torch.ones(64, 32, dtype=torch.float16),
               "model.layers.0.mlp.up_proj.weight": torch.ones(200, 32)}, str(mixed / "model.safetensors"))
    assert half_checkpoint_dtype(str(mixed)) is None  # fp32 holds most elements


def test_what_is_not_a_readable_checkpoint_is_left_to_the_loader(tmp_path):
    (tmp_path / "no_weights").mkdir()
    assert half_checkpoint_dtype(str(tmp_path / "no_weights")) is None
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    assert half_checkpoint_dtype(str(tmp_path / "corrupt")) is None
    assert half_checkpoint_dtype(str(tmp_path / "missing")) is None
    assert default_dtype({"path": "x.gguf"}, CPU)[0] == "native"


def test_without_the_c_kernels_a_half_checkpoint_runs_widened(tmp_path, monkeypatch):
    """The torch fallback would widen every weight on every product: float32 is the faster default."""
    from specc.methods.draft_model.drafter import draft_dtype

    path = _hf_dir(tmp_path / "ckpt", "float16")
    monkeypatch.setattr(qgemm, "available", lambda: False)
    dtype, why = default_dtype({"path": path, "format": "hf"}, CPU)
    assert dtype == "float32" and "unavailable here" in why
    native_target = torch.nn.Module()
    native_target.parts = []  # what runs_native looks for: a QuantLinear's parts
    assert draft_dtype(native_target, "cpu") == "float32"


def test_an_explicit_dtype_or_a_measured_choice_wins_over_the_default(tmp_path):
    path = _hf_dir(tmp_path / "ckpt", "float16")
    want = "native" if qgemm.available() else "float32"
    assert choose_settings({"target": {"path": path, "format": "hf"}}, CPU)[0] == want
    assert choose_settings({"target": {"path": path, "format": "hf", "dtype": "float32"}}, CPU)[0] == "float32"
    measured = {"target": {"path": path, "format": "hf"},
                "schedule": {"cost_table": {"choice": {"dtype": "float32"}}}}
    dtype, _, why = choose_settings(measured, CPU)
    assert dtype == "float32" and "device profile measured it fastest" in why


@pytest.mark.skipif(not qgemm.available() or len(qgemm.supported()) < 2, reason="needs two qgemm variants")
def test_load_models_sets_the_profiled_variant_before_the_target_loads(monkeypatch):
    """The int8 variants pack the weights at load, so the profile's variant must be in place when the
    target loads: load_models sets it first."""
    import specc.models
    from specc.runtime.loader import load_models

    monkeypatch.delenv("SPECC_QGEMM_VARIANT", raising=False)
    before = qgemm.variant()
    other = next(v for v in qgemm.supported() if v != before)
    seen = []

    class Loaded(Exception):
        pass

    def fake_load_target(*args, **kwargs):
        seen.append((kwargs.get("dtype"), qgemm.variant()))
        raise Loaded

    monkeypatch.setattr(specc.models, "load_target", fake_load_target)
    spec = {"target": {"path": "model.gguf", "format": "gguf", "dtype": "auto", "max_model_len": 64},
            "dtype": "auto", "device": "cpu", "method": {"name": "ngram"},
            "schedule": {"cost_table": {"choice": {"dtype": "native", "compile_backend": "eager",
                                                   "qgemm_variant": other}}}}
    try:
        with pytest.raises(Loaded):
            load_models(spec, "cpu")
    finally:
        qgemm.set_variant(before)
    assert seen == [("native", other)]


@pytest.mark.skipif(not qgemm.available(), reason=f"qgemm unavailable: {qgemm.status()}")
def test_a_spec_names_its_kernel_variant_through_its_cost_table(monkeypatch):
    """specc profile loads each variant through load_models by naming it in the spec's cost table; the
    rest of the spec's table stays as it was."""
    from specc.runtime.loader import kernel_variant, with_kernel_variant

    monkeypatch.delenv("SPECC_QGEMM_VARIANT", raising=False)
    spec = {"dtype": "native", "schedule": {"kind": "static", "cost_table": {"verify_ms": {"1": 9.0}}}}
    for v in qgemm.supported():
        named = with_kernel_variant(spec, v)
        assert kernel_variant(named)[0] == v
        assert named["schedule"]["cost_table"]["verify_ms"] == {"1": 9.0} and named["schedule"]["kind"] == "static"
    assert "choice" not in spec["schedule"]["cost_table"]  # the spec given is not changed
