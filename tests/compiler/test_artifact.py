"""specc.runtime.artifact.load_artifact: verify every hash before importing anything; refuse
missing, extra, changed and truncated files with a message naming the file and the fix."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import pytest

import specc
from specc.compiler import codegen
from specc.errors import ArtifactError
from specc.runtime.artifact import load_artifact
from tests.test_codegen_support import compile_preset, resolved_preset


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("artifact")
    return compile_preset("smollm2_ngram", tmp / "out").path


@pytest.fixture
def artifact(compiled, tmp_path):
    """A fresh copy of the compiled artifact that a test may damage."""
    dest = tmp_path / compiled.name
    shutil.copytree(compiled, dest)
    return dest


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_loads_states_kernels_and_nothing_else(artifact):
    """The manifest is the one source: states are its entries (parameters of the resolved plan's
    lowering), kernels the only generated code; no state modules, no graph.json unless asked."""
    from specc.predict.analyze import lower_plan

    art = load_artifact(artifact)
    manifest = _manifest(artifact)
    assert art.manifest == manifest
    low = lower_plan(resolved_preset("smollm2_ngram"))
    assert [e["name"] for e in art.states] == [s.name for s in low.states]
    assert [e["parameters"]["num_steps"] for e in art.states] == [s.num_steps for s in low.states]
    assert set(art.kernels) == {k["name"] for k in manifest["kernels"]}
    assert sorted(p for p in manifest["files"]) == ["kernels/greedy_verify_w5_v49152.py",
                                                         "kernels/rejection_verify_w5_qonehot_v49152.py", "plan.yaml",
                                                         "predictions.json", "report.md"]
    # the greedy rule's kernel, and the rejection rule's for a step with a sampled row, both at W and V
    assert [dict(e["kernels"]) for e in art.states][0] == {"verify": "greedy_verify_w5_v49152",
                                                           "verify_sampled_rows": "rejection_verify_w5_qonehot_v49152"}
    assert not (artifact / "states").exists() and not (artifact / "graph.json").exists()
    for name, module in art.kernels.items():
        assert module.NAME == name
        assert module.__file__ == str(artifact / "kernels" / f"{name}.py")
        assert sys.modules[module.__name__] is module
    # Loaded from verified bytes: no bytecode cache was written into the artifact.
    assert not list(artifact.rglob("__pycache__"))


def test_the_runtime_never_parses_plan_yaml(artifact, monkeypatch):
    """plan.yaml is hashed (a changed byte is refused) but never read as YAML at load."""
    import yaml

    def no_yaml(*a, **k):
        raise AssertionError("the loader parsed YAML")

    monkeypatch.setattr(yaml, "safe_load", no_yaml)
    monkeypatch.setattr(yaml, "load", no_yaml)
    assert load_artifact(artifact).states


def test_two_loads_get_distinct_modules(artifact):
    a, b = load_artifact(artifact), load_artifact(artifact)
    for name in a.kernels:
        assert a.kernels[name] is not b.kernels[name]
        assert a.kernels[name].__name__ != b.kernels[name].__name__


def test_kernel_variant_matches_kernel_library(artifact):
    """A generated kernel module computes exactly what specc.kernels does, and refuses the wrong width."""
    import torch

    from specc.kernels import greedy_verify

    art = load_artifact(artifact)
    name = "greedy_verify_w5_v49152"
    mod = art.kernels[name]
    k, v = mod.NUM_STEPS, mod.VOCAB_SIZE
    g = torch.Generator().manual_seed(0)
    target = torch.randn(3, k + 1, v, generator=g)
    drafts = target.argmax(-1)[:, :k].clone()
    drafts[1, 1] = (drafts[1, 1] + 1) % v  # request 1 rejects at position 1
    got = mod.verify(drafts, target, backend="torch")
    want = greedy_verify(drafts, target, backend="torch")
    assert torch.equal(got.accepted_len, want.accepted_len)
    assert torch.equal(got.output_tokens, want.output_tokens)
    assert got.accepted_len.tolist() == [k, 1, k]
    # a narrower (ragged) step: the same result as the library at that width
    got = mod.verify(drafts[:, :2], target[:, :3], backend="torch")
    assert torch.equal(got.output_tokens, greedy_verify(drafts[:, :2], target[:, :3], backend="torch").output_tokens)
    with pytest.raises(ValueError, match=name):
        mod.verify(drafts[:, :-1], target, backend="torch")  # positions do not match the drafts
    with pytest.raises(ValueError, match="vocabulary of 49152"):
        mod.verify(drafts, target[:, :, :50], backend="torch")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_kernel_variant_runs_the_triton_kernel(artifact):
    """The generated module drives the Triton kernel (interpreted on CPU: tests/conftest.py sets
    TRITON_INTERPRET=1) and agrees with the torch reference."""
    import torch

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU needs TRITON_INTERPRET=1 before triton is imported")
    art = load_artifact(artifact)
    mod = art.kernels["greedy_verify_w5_v49152"]
    g = torch.Generator().manual_seed(1)
    target = torch.randn(2, mod.NUM_DRAFT_TOKENS, mod.VOCAB_SIZE, generator=g)
    drafts = target.argmax(-1)[:, : mod.NUM_STEPS].clone()
    drafts[0, 0] = (drafts[0, 0] + 3) % mod.VOCAB_SIZE  # request 0 rejects at once, request 1 accepts all
    tri = mod.verify(drafts, target, backend="triton")
    ref = mod.verify(drafts, target, backend="torch")
    assert tri.accepted_len.tolist() == ref.accepted_len.tolist() == [0, mod.NUM_STEPS]
    assert torch.equal(tri.output_tokens, ref.output_tokens)


def test_tampered_kernel_module_is_refused_before_import(artifact, tmp_path):
    marker = tmp_path / "imported"
    kernel = sorted((artifact / "kernels").glob("*.py"))[0]
    kernel.write_text(kernel.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ArtifactError) as exc:
        load_artifact(artifact)
    msg = str(exc.value)
    assert f"kernels/{kernel.name}" in msg and "changed" in msg and "specc compile" in msg
    assert not marker.exists(), "the tampered module was executed before its hash was checked"


def test_tampered_kernel_with_rehashed_entry_is_refused(artifact, tmp_path):
    """Editing a kernel module and its sha256 in `files` is caught by the name hash, before import."""
    import hashlib

    marker = tmp_path / "imported"
    kernel = sorted((artifact / "kernels").glob("*.py"))[0]
    kernel.write_text(kernel.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    rel = f"kernels/{kernel.name}"
    _edit_manifest(artifact, lambda m: m["files"].update({rel: "sha256:" + hashlib.sha256(kernel.read_bytes()).hexdigest()}))
    with pytest.raises(ArtifactError, match="edited after compile"):
        load_artifact(artifact)
    assert not marker.exists()


def test_one_byte_change_is_refused(artifact):
    kernel = sorted((artifact / "kernels").glob("*.py"))[0]
    data = bytearray(kernel.read_bytes())
    data[len(data) // 2] ^= 0x01
    kernel.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"kernels/{kernel.name}"):
        load_artifact(artifact)


def test_missing_file_is_refused(artifact):
    victim = sorted((artifact / "kernels").glob("*.py"))[-1]
    victim.unlink()
    with pytest.raises(ArtifactError, match=f"kernels/{victim.name} is missing.*specc compile"):
        load_artifact(artifact)


def test_truncated_file_is_refused(artifact):
    (artifact / "plan.yaml").write_bytes((artifact / "plan.yaml").read_bytes()[:20])
    with pytest.raises(ArtifactError, match="plan.yaml was changed or truncated"):
        load_artifact(artifact)


def test_truncated_manifest_is_refused(artifact):
    text = (artifact / "manifest.json").read_text()
    (artifact / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(ArtifactError, match="manifest.json is not valid JSON.*specc compile"):
        load_artifact(artifact)


def test_missing_manifest_is_refused(artifact):
    (artifact / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        load_artifact(artifact)


def test_extra_file_is_refused_and_not_run(artifact, tmp_path):
    marker = tmp_path / "imported"
    (artifact / "kernels" / "b99_extra.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(ArtifactError, match="kernels/b99_extra.py is not listed"):
        load_artifact(artifact)
    assert not marker.exists()


def test_rehashed_file_without_plan_hash_is_refused(artifact):
    """Editing plan.yaml and its hash in `files` (but not `plan_hash`) is still caught."""
    import hashlib

    plan_yaml = artifact / "plan.yaml"
    plan_yaml.write_text(plan_yaml.read_text().replace("num_steps: 4", "num_steps: 9"))
    manifest = _manifest(artifact)
    manifest["files"]["plan.yaml"] = "sha256:" + hashlib.sha256(plan_yaml.read_bytes()).hexdigest()
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="plan_hash"):
        load_artifact(artifact)


def test_other_specc_version_is_refused(artifact):
    manifest = _manifest(artifact)
    manifest["specc_version"] = "0.0.0-old"
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"compiled by specc 0.0.0-old, this is specc {specc.__version__}"):
        load_artifact(artifact)


def test_unsafe_manifest_path_is_refused(artifact):
    manifest = _manifest(artifact)
    manifest["files"]["../outside.py"] = "sha256:" + "0" * 64
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="bad file entry"):
        load_artifact(artifact)


def test_not_a_directory(tmp_path):
    with pytest.raises(ArtifactError, match="nope does not exist"):
        load_artifact(tmp_path / "nope")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ArtifactError, match="afile is not a directory"):
        load_artifact(tmp_path / "afile")


def test_read_tree_matches_what_compile_wrote(compiled):
    manifest = _manifest(compiled)
    assert set(codegen.read_tree(compiled)) == set(manifest["files"]) | {"manifest.json"}


def _edit_manifest(artifact, edit):
    manifest = _manifest(artifact)
    edit(manifest)
    (artifact / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize("edit", [
    lambda m: m["states"][0]["parameters"].update(batch_size=64),
    lambda m: m["states"][0]["parameters"].update(num_steps=9),
    lambda m: m["states"][1]["parameters"].update(verify_rule="standard"),
    lambda m: m["states"][0]["parameters"].pop("topk"),
    lambda m: m["states"][0]["kernels"].update(verify="greedy_verify_w9"),
    lambda m: m["kernels"][0]["constants"].update(NUM_DRAFT_TOKENS=9),
    lambda m: m["kernels"][0].update(family="rejection_verify"),
    lambda m: m["runtime"]["method"].update(num_steps=2),
    lambda m: m["runtime"].update(dtype="bfloat16"),
    lambda m: m.update(plan_name="smollm2_eagle"),
    lambda m: m.update(name="smollm2_ngram-000000000000"),
    lambda m: m["states"][0]["constants"].update(K=9),
    lambda m: m["states"][0]["programs"][0].update(fn="draft_none"),
    lambda m: m["runtime"]["target"].update(format="hf"),
    lambda m: m["states"].pop(),
])
def test_edited_manifest_content_is_refused_before_import(artifact, monkeypatch, edit):
    """Any edit of a fact in manifest.json no longer hashes to the artifact's name: refused before
    any module runs."""
    import specc.runtime.artifact as art_mod

    def no_exec(*a, **k):
        raise AssertionError("a module was executed before the manifest was checked")

    _edit_manifest(artifact, edit)
    monkeypatch.setattr(art_mod, "_exec_module", no_exec)
    with pytest.raises(ArtifactError) as exc:
        load_artifact(artifact)
    msg = str(exc.value)
    assert "manifest.json" in msg and "specc compile" in msg, msg


def test_reformatted_manifest_still_loads(artifact):
    """Only content is checked: re-serialising the same manifest (other indentation) is fine."""
    _edit_manifest(artifact, lambda m: None)
    assert len(load_artifact(artifact).states) == len(_manifest(artifact)["states"])
