"""The runtime loader's default dtype: a checkpoint runs in its own bytes on the CPU when nothing chose."""
import json

import pytest
import torch

from specc.runtime.loader import choose_settings, default_dtype, half_checkpoint_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _hf_dir(root, torch_dtype):
    root.mkdir()
    cfg = {"model_type": "llama"} if torch_dtype is None else {"model_type": "llama", "torch_dtype": torch_dtype}
    (root / "config.json").write_text(json.dumps(cfg))
    return str(root)


@pytest.mark.parametrize("stored, expected", [("float16", "native"), ("bfloat16", "native"),
                                              ("float32", "float32"), (None, "float32")])
def test_a_half_checkpoint_runs_native_on_the_cpu_by_default(tmp_path, stored, expected):
    path = _hf_dir(tmp_path / "ckpt", stored)
    dtype, why = default_dtype({"path": path, "format": "hf"}, CPU)
    assert dtype == expected
    assert (f"own {stored} weights" in why) == (expected == "native")
    assert default_dtype({"path": path, "format": "hf"}, CUDA)[0] == "float32"


def test_the_half_default_reads_the_config_and_nothing_else(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert half_checkpoint_dtype(str(tmp_path / "broken")) is None
    assert half_checkpoint_dtype(str(tmp_path / "missing")) is None
    (tmp_path / "dtype_key").mkdir()
    (tmp_path / "dtype_key" / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert half_checkpoint_dtype(str(tmp_path / "dtype_key")) == "bfloat16"
    assert default_dtype({"path": "x.gguf"}, CPU)[0] == "native"


def test_an_explicit_dtype_or_a_measured_choice_wins_over_the_default(tmp_path):
    path = _hf_dir(tmp_path / "ckpt", "float16")
    assert choose_settings({"target": {"path": path, "format": "hf"}}, CPU)[0] == "native"
    assert choose_settings({"target": {"path": path, "format": "hf", "dtype": "float32"}}, CPU)[0] == "float32"
    measured = {"target": {"path": path, "format": "hf"},
                "schedule": {"cost_table": {"choice": {"dtype": "float32"}}}}
    dtype, _, why = choose_settings(measured, CPU)
    assert dtype == "float32" and "device profile measured it fastest" in why
