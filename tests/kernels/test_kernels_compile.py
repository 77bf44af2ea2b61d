"""The Triton verify kernels compile for a real GPU target (sm_90, through ptxas) even on a machine
without one: the interpreter accepts code that the compiler rejects (e.g. a variable whose type
differs between the branches of an `if`), so this is the CPU-side guard for the CUDA path."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# Not imported here: importing triton in the test process before TRITON_INTERPRET is set would stop
# the interpreter-based kernel tests from working in the same process.
TRITON_SPEC = importlib.util.find_spec("triton")

SCRIPT = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from specc.kernels import verify_triton

    greedy, rejection = verify_triton._kernels()
    target = GPUTarget("cuda", 90, 32)
    common = {"acc_ptr": "*i32", "out_ptr": "*i64", "bonus_ptr": "*i64", "K": "i32", "V": "i32", "BLOCK": "constexpr"}
    for from_logits in (True, False):
        sig = {"draft_ptr": "*i64", "target_ptr": "*fp32" if from_logits else "*i64", "nvalid_ptr": "*i32",
               **common, "FROM_LOGITS": "constexpr"}
        k = triton.compile(ASTSource(greedy, sig, {"FROM_LOGITS": from_logits, "BLOCK": 1024}), target=target,
                           options={"enable_fp_fusion": False})
        assert "cubin" in k.asm, k.asm.keys()
    for has_q in (True, False):
        sig = {"draft_ptr": "*i64", "target_ptr": "*fp32", "dprob_ptr": "*fp32", "unif_ptr": "*fp32",
               "noise_ptr": "*fp32", "nvalid_ptr": "*i32", **common, "HAS_DRAFT_PROBS": "constexpr"}
        k = triton.compile(ASTSource(rejection, sig, {"HAS_DRAFT_PROBS": has_q, "BLOCK": 1024}), target=target,
                           options={"enable_fp_fusion": False})
        assert "cubin" in k.asm, k.asm.keys()
        assert "div.rn.f32" in k.asm["ptx"]
    print("compiled")
    """
)


def test_verify_kernels_compile_for_sm90(tmp_path):
    if TRITON_SPEC is None:
        pytest.skip("triton is not installed")
    nvidia_bin = os.path.join(TRITON_SPEC.submodule_search_locations[0], "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(nvidia_bin):
        pytest.skip("triton's NVIDIA backend (ptxas) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    env["TRITON_DEFAULT_FP_FUSION"] = "0"
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-4000:]
