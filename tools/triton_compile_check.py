#!/usr/bin/env python
"""Compile every Triton kernel of specc for a CUDA target on a machine without a GPU.

The kernel tests run the kernels under Triton's interpreter on the CPU, which executes them as numpy
code and accepts programs the compiler refuses (a variable that starts as int64 and is reassigned an
int32 loop index inside an ``if`` compiles under the interpreter and fails ``ast_to_ttir`` on a GPU).
This check runs the compiler itself (``triton.compile`` on an ``ASTSource``, every stage to the
cubin where the NVIDIA backend's ``ptxas`` is installed) for each kernel and each constexpr variant
the wrappers launch (the per-state sizes ``K``, ``N``, ``STEPS`` and the vocabulary ``V`` are constexprs: one representative value
each, plus ``K = 0`` for the greedy chain), with the argument types the wrappers pass (pointers by tensor dtype, integer
scalars as i32, or i64 where a wrapper passes a value past 2**31).

    python tools/triton_compile_check.py              # sm_90 (Hopper); exit 1 when a kernel fails
    python tools/triton_compile_check.py --arch 80 90 # also sm_80 (Ampere)

Exit status: 0 all compiled, 1 a kernel failed to compile (its error printed), 2 Triton or its NVIDIA
backend is missing here.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the jitted functions must be compiler functions, not interpreted
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

I64, I32, I8, F32 = "*i64", "*i32", "*i8", "*fp32"


def variants():
    """(name, kernel, signature, constexprs) for every kernel and variant the wrappers launch: the
    pointer types follow the tensors of ``specc/kernels/{verify,block_verify,tree}_triton.py``."""
    from specc.kernels import block_verify_triton, tree_triton, verify_triton
    from specc.kernels.tree import TreeMaskMode

    v_greedy, v_rejection = verify_triton._kernels()
    block = block_verify_triton._kernel()
    t_mask, t_greedy, t_rejection = tree_triton._kernels()
    bv, bm = verify_triton.BLOCK_V, tree_triton.BLOCK_MASK
    chain_out = {"nvalid_ptr": I32, "acc_ptr": I32, "out_ptr": I64, "bonus_ptr": I64}
    v = 49152  # the vocabulary is a constexpr too: SmolLM2's
    sampled = {"draft_ptr": I64, "target_ptr": F32, "dprob_ptr": F32, "unif_ptr": F32, "noise_ptr": F32, **chain_out}
    for logits in (True, False):
        yield (f"verify greedy FROM_LOGITS={logits}", v_greedy,
               {"draft_ptr": I64, "target_ptr": F32 if logits else I64, **chain_out},
               {"V": v if logits else 1, "K": 4, "FROM_LOGITS": logits, "BLOCK": bv})
    yield "verify greedy K=0", v_greedy, {"draft_ptr": I64, "target_ptr": F32, **chain_out}, \
        {"V": v, "K": 0, "FROM_LOGITS": True, "BLOCK": bv}
    for has_q in (True, False):
        yield (f"verify rejection HAS_DRAFT_PROBS={has_q}", v_rejection, sampled,
               {"V": v, "K": 4, "HAS_DRAFT_PROBS": has_q, "BLOCK": bv})
        yield (f"block verify HAS_DRAFT_PROBS={has_q}", block, sampled,
               {"V": v, "K": 4, "HAS_DRAFT_PROBS": has_q, "BLOCK": bv})
    for mode in TreeMaskMode:
        out = I64 if mode == TreeMaskMode.QLEN_ONLY_BITPACKING else I8
        yield (f"tree mask MODE={mode.name}", t_mask,
               {"parents_ptr": I64, "prefix_ptr": I64, "offset_ptr": I64, "out_ptr": out},
               {"N": 7, "MODE": int(mode), "BLOCK": bm})
    tree_out = {"acc_ptr": I64, "path_ptr": I64, "bonus_ptr": I64}
    for logits in (True, False):
        yield (f"tree greedy FROM_LOGITS={logits}", t_greedy,
               {"draft_ptr": I64, "parents_ptr": I64, "target_ptr": F32 if logits else I64, "nvalid_ptr": I32,
                **tree_out},
               {"V": v if logits else 2 ** 62, "N": 7, "STEPS": 3, "FROM_LOGITS": logits, "BLOCK": 1024})
    for has_q in (True, False):
        yield (f"tree rejection HAS_DRAFT_PROBS={has_q}", t_rejection,
               {"draft_ptr": I64, "parents_ptr": I64, "target_ptr": F32, "dprob_ptr": F32, "unif_ptr": F32,
                "noise_ptr": F32, "nvalid_ptr": I32, "resid_ptr": F32, "qw_ptr": F32, **tree_out},
               {"V": v, "N": 7, "HAS_DRAFT_PROBS": has_q, "BLOCK": bv})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[90], help="CUDA compute capabilities (90 = sm_90)")
    args = ap.parse_args()
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        print(f"triton_compile_check: Triton is not installed ({exc})", file=sys.stderr)
        return 2
    if "nvidia" not in getattr(triton.backends, "backends", {"nvidia": None}):
        print("triton_compile_check: this Triton has no NVIDIA backend", file=sys.stderr)
        return 2
    failed = 0
    for arch in args.arch:
        for name, fn, signature, constexprs in variants():
            params = [p.name for p in fn.params]
            sig = {p: ("constexpr" if p in constexprs else signature[p]) for p in params}
            t0 = time.perf_counter()
            try:
                compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                                          target=GPUTarget("cuda", arch, 32))
                stages = ",".join(k for k in ("ttir", "ttgir", "ptx", "cubin") if k in compiled.asm)
                print(f"sm_{arch}  {name:40s} ok ({stages}; {time.perf_counter() - t0:.1f} s)")
            except Exception as exc:  # the compiler's own error: print it whole, go on with the rest
                failed += 1
                print(f"sm_{arch}  {name:40s} FAILED\n{type(exc).__name__}: {exc}\n")
    print(f"{failed} kernel variant(s) failed to compile" if failed else "every kernel variant compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
