"""Weights in the checkpoint's own codes (specc.models.qweights) and their kernels (specc.kernels.qgemm).

Every supported GGML type is read from random blocks and compared with gguf-py's own dequantizer
(exact); each kernel variant this CPU runs is compared with an fp32 product over the dequantized
weight and checked row-invariant (a k-row product gives each row the bits of the one-row product),
which is what keeps speculative greedy output equal to plain greedy output.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

from specc.errors import CheckpointError  # noqa: E402
from specc.kernels import qgemm  # noqa: E402
from specc.models.qweights import SUPPORTED, QuantLinear, QuantWeight  # noqa: E402

# bytes per block and the offsets of fp16 scale fields (set to finite values) per type
LAYOUT = {"Q4_0": (18, 32, [0]), "Q4_1": (20, 32, [0, 2]), "Q8_0": (34, 32, [0]),
          "Q4_K": (144, 256, [0, 2]), "Q6_K": (210, 256, [208])}


def random_blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random raw GGUF blocks ``[rows, bytes per row]`` uint8 with finite fp16 scales."""
    size, block, scale_at = LAYOUT[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for off in scale_at:
        vals = (rng.standard_normal((rows, cols // block)) * 0.01).astype(np.float16)
        raw[..., off:off + 2] = vals.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(SUPPORTED))
def test_codes_equal_gguf_dequantize(type_name):
    raw = random_blocks(type_name, 24, 512)
    qw = QuantWeight.from_gguf("blk.0.ffn_up.weight", type_name, raw, (24, 512))
    ref = dequantize(raw, getattr(gguf.GGMLQuantizationType, type_name)).reshape(24, 512)
    assert qw.kind == SUPPORTED[type_name]
    assert torch.equal(qw.dequantize(), torch.from_numpy(ref.astype(np.float32)))
    ids = torch.tensor([[3, 0], [23, 3]])
    assert torch.equal(qw.rows(ids), qw.dequantize()[ids])


def test_unsupported_type_names_type_tensor_and_supported():
    with pytest.raises(CheckpointError) as err:
        QuantWeight.from_gguf("blk.3.attn_v.weight", "Q5_K", np.zeros((4, 176), np.uint8), (4, 256))
    msg = str(err.value)
    assert "blk.3.attn_v.weight" in msg and "Q5_K" in msg and "Q4_1" in msg and "dtype: float32" in msg


def test_rows_not_whole_blocks_refused():
    with pytest.raises(CheckpointError, match="whole blocks of 256"):
        QuantWeight.from_gguf("w", "Q4_K", np.zeros((2, 144), np.uint8), (2, 300))


needs_kernels = pytest.mark.skipif(not qgemm.available(), reason=f"qgemm unavailable: {qgemm.status()}")


@needs_kernels
@pytest.mark.parametrize("variant", qgemm.supported())
@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_0", "Q4_K", "Q8_0", "Q6_K"])
def test_kernel_matches_fp32_and_is_row_invariant(variant, type_name):
    """Every row count (1 .. 40: all register tiles, whole row chunks and their edges) and thread count
    gives each row the bits of the one-row product. N = 205: 13 groups of 16 outputs, the last one
    partial, so the VNNI walk runs its multi-stream tiles (one to six rows: several groups side by
    side, the partial one among them) and its one-group tail."""
    before = qgemm.variant()
    qgemm.set_variant(variant)
    try:
        N, K = 205, 512  # N not a multiple of the 4-output tile: the one-output tail runs too
        qw = QuantWeight.from_gguf("w", type_name, random_blocks(type_name, N, K, seed=1), (N, K))
        x = torch.randn(40, K, generator=torch.Generator().manual_seed(0))
        ref = x.double() @ qw.dequantize().double().T
        full = qw.matmul(x)
        assert full.shape == (40, N) and full.dtype == torch.float32
        # fp32 activations: the fp32 product up to summation order; the packed variants' q4 / Q8_0 products quantize
        # the activations per 32-block to int8 (as llama.cpp does): ~0.5 % of the largest output here
        tol = 2e-2 if variant in qgemm.PACKED_VARIANTS and qgemm.packable(qw.kind, qw.group) else 1e-5
        assert torch.allclose(full.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
        one = torch.cat([qw.matmul(x[i:i + 1]) for i in range(40)])
        assert torch.equal(full, one), "a 40-row product must give each row the one-row bits"
        for r in (2, 3, 5, 6, 7, 8, 9, 13, 16, 17):
            assert torch.equal(qw.matmul(x[:r]), one[:r]), r
        qgemm.set_threads(2)
        try:
            assert torch.equal(qw.matmul(x), full), "results must not depend on the thread count"
            assert torch.equal(qw.matmul(x[:3]), one[:3])
        finally:
            qgemm.set_threads(1)
    finally:
        qgemm.set_variant(before)


def test_quant_linear_fuses_parts_and_keeps_the_forward_quantized():
    a = QuantWeight.from_gguf("q", "Q4_1", random_blocks("Q4_1", 8, 64, seed=3), (8, 64))
    b = QuantWeight.from_gguf("k", "Q4_0", random_blocks("Q4_0", 4, 64, seed=4), (4, 64))
    c = QuantWeight.from_gguf("v", "Q8_0", random_blocks("Q8_0", 4, 64, seed=5), (4, 64))
    lin = QuantLinear([a, b, c], bias=torch.arange(16, dtype=torch.float32))
    assert [p.kind for p in lin.parts] == ["q4", "q8"]  # q4 neighbours stacked into one call
    assert lin.weight.shape == (16, 64)
    x = torch.randn(3, 2, 64)
    with torch.inference_mode():
        y = lin(x)
    ref = x @ lin.weight.T + torch.arange(16, dtype=torch.float32)
    tol = 3e-2 * ref.abs().max().item() if qgemm.available() and qgemm.packs() else 1e-4
    assert y.shape == (3, 2, 16) and torch.allclose(y, ref, atol=tol)


@needs_kernels
def test_rms_norm_kernel_matches_torch():
    x = torch.randn(5, 576)
    w = torch.rand(576)
    ref = torch.nn.functional.rms_norm(x, (576,), w, 1e-5)
    out = qgemm.rms_norm(x, w, 1e-5)
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.equal(qgemm.rms_norm(x[2:3], w, 1e-5), out[2:3])


def test_variant_env_refuses_unknown(monkeypatch):
    assert "portable" in qgemm.VARIANTS
    with pytest.raises(ValueError, match="not runnable here"):
        qgemm.set_variant("neon")


@needs_kernels
@pytest.mark.parametrize("variant", qgemm.PACKED_VARIANTS)
def test_vnni_packing_round_trips_and_drops_the_plain_layout(variant):
    if variant not in qgemm.supported():
        pytest.skip(f"this CPU does not run {variant}")
    before = qgemm.variant()
    qgemm.set_variant(variant)
    try:
        for type_name, f16 in (("Q4_1", 1), ("Q4_K", 0), ("Q8_0", 1)):  # Q4_K's d * scale products need fp32
            qw = QuantWeight.from_gguf("w", type_name, random_blocks(type_name, 37, 256, seed=7), (37, 256))
            want = qw.dequantize()
            qw.matmul(torch.randn(2, 256))
            assert qw._qs is None and qw.packed()[1] == f16
            assert torch.equal(qw.dequantize(), want)
            ids = torch.tensor([[36, 0], [5, 17]])
            assert torch.equal(qw.rows(ids), want[ids])
    finally:
        qgemm.set_variant(before)


@needs_kernels
@pytest.mark.skipif(not set(qgemm.PACKED_VARIANTS) <= set(qgemm.supported() if qgemm.available() else ()),
                    reason="needs a CPU that runs both avx512vnni and avx2int8")
@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_0", "Q4_K", "Q8_0"])
def test_avx2_int8_tiles_give_the_vnni_bits(type_name):
    """The AVX2 int8 tiles (vpmaddubsw / vpmaddwd) form the integer dots vpdpbusd forms and then the same
    float operations: every row count and stream walk gives the VNNI variant's bits, the one-stream walk
    too (13 groups of 16 outputs, the last partial; Q4_K's scales are packed as fp32, the others' as fp16)."""
    before = qgemm.variant()
    try:
        qgemm.set_variant("avx512vnni")
        N, K = 205, 512
        qw = QuantWeight.from_gguf("w", type_name, random_blocks(type_name, N, K, seed=2), (N, K))
        x = torch.randn(11, K, generator=torch.Generator().manual_seed(3))
        x[0, :32] = 0.0  # a block of zeros: its scale is 0
        want = [qw.matmul(x[:r]) for r in range(1, 12)]
        qgemm.set_variant("avx2int8")
        for streams in (4, 1):
            qgemm.set_streams(streams)
            for r in range(1, 12):
                assert torch.equal(qw.matmul(x[:r]), want[r - 1]), (streams, r)
    finally:
        qgemm.set_streams(4)
        qgemm.set_variant(before)


@needs_kernels
@pytest.mark.parametrize("head_dim", [8, 64])  # 8: the generic C attention; 64: the AVX-512 one where it runs
def test_c_attention_is_row_and_slot_invariant(head_dim):
    """A query's output depends on the keys it attends and their order only: not on how many queries run
    with it nor on masked slots between its keys (a tree verify's ancestors sit among masked siblings)."""
    torch.manual_seed(0)
    nh, nkv, D, smax = 6, 2, head_dim, 40
    width = (nh + 2 * nkv) * D
    keys = torch.randn(12, width)  # 12 tokens' q/k/v rows
    cos, sin = torch.rand(1, 12, D), torch.rand(1, 12, D) - 0.5
    neg = torch.finfo(torch.float32).min

    def run(slots, mask_rows, n_query, fill=0.0):
        kc = torch.full((1, nkv, smax, D), fill)
        vc = torch.full((1, nkv, smax, D), fill)
        sl = torch.tensor([slots])
        out = qgemm.attention(keys[None, :len(slots)], cos[:, :len(slots)], sin[:, :len(slots)], kc, vc,
                              torch.tensor([0]), sl, mask_rows, nh, D ** -0.5)
        return out[0, :n_query] if n_query else out[0]

    S = 30
    # contiguous: token i at slot i, attends to slots 0..i
    causal = torch.full((1, 12, S), neg)
    for i in range(12):
        causal[0, i, : i + 1] = 0
    ref = run(list(range(12)), causal, 0)
    qgemm.set_threads(2)  # queries split over threads
    try:
        assert torch.equal(run(list(range(12)), causal, 0), ref)
    finally:
        qgemm.set_threads(1)
    one_by_one = torch.cat([run(list(range(i + 1)), causal[:, : i + 1], 0)[i:i + 1] for i in range(12)])
    assert torch.equal(ref, one_by_one)
    # the same tokens at spread slots 0, 2, 4, ... with the slots between masked
    spread = torch.full((1, 12, S), neg)
    for i in range(12):
        spread[0, i, [2 * j for j in range(i + 1)]] = 0
    assert torch.equal(run([2 * i for i in range(12)], spread, 0), ref)
    # a query does not read the slots after its last visible one (a short row in a batch attending up to
    # its longest): NaN there, which any read would spread, leaves every output as it was
    assert torch.equal(run(list(range(12)), causal, 0, fill=float("nan")), ref)
    # a query that sees no slot (a padding position of a ragged batch) gets zeros without reading the
    # cache; the others keep their bits
    hidden = causal.clone()
    hidden[0, 5] = neg
    out = run(list(range(12)), hidden, 0, fill=float("nan"))
    assert torch.equal(out[5], torch.zeros_like(out[5]))
    assert torch.equal(out[:5], ref[:5]) and torch.equal(out[6:], ref[6:])


@needs_kernels
@pytest.mark.parametrize("variant", qgemm.supported())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_kernel_is_the_fp32_product_and_row_invariant(variant, dtype):
    """fp16 / bf16 weights in their own bytes: each value widened exactly, so the product is the fp32
    product of the same values up to summation order, and every row count and thread count gives each
    row the one-row bits. Subnormal, signed-zero and extreme fp16 values widen exactly too."""
    before = qgemm.variant()
    qgemm.set_variant(variant)
    try:
        N, K = 70, 512
        w = (torch.randn(N, K, generator=torch.Generator().manual_seed(1)) * 0.05).to(dtype)
        if dtype == torch.float16:
            w[0, :6] = torch.tensor([6e-8, -6e-8, 1e-5, -0.0, 65504.0, -65504.0]).half()
        qw = QuantWeight.from_half("w", w)
        assert qw.kind == ("f16" if dtype == torch.float16 else "bf16") and qw.shape == (N, K)
        assert torch.equal(qw.dequantize(), w.float()) and torch.equal(qw.rows(torch.tensor([3, 0])), w.float()[[3, 0]])
        x = torch.randn(40, K, generator=torch.Generator().manual_seed(0))
        ref = x.double() @ w.double().T
        full = qw.matmul(x)
        assert torch.allclose(full.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        one = torch.cat([qw.matmul(x[i:i + 1]) for i in range(40)])
        assert torch.equal(full, one), "a 40-row product must give each row the one-row bits"
        for r in (2, 3, 5, 8, 9, 17):
            assert torch.equal(qw.matmul(x[:r]), one[:r]), r
        qgemm.set_threads(2)
        try:
            assert torch.equal(qw.matmul(x), full), "results must not depend on the thread count"
        finally:
            qgemm.set_threads(1)
    finally:
        qgemm.set_variant(before)


def test_half_weights_refuse_other_shapes():
    with pytest.raises(CheckpointError, match="not a multiple of 16"):
        QuantWeight.from_half("w", torch.zeros(4, 24, dtype=torch.float16))
    with pytest.raises(CheckpointError, match="float16 / bfloat16"):
        QuantWeight.from_half("w", torch.zeros(4, 32))
    if qgemm.available():
        w, x = torch.zeros(8, 32, dtype=torch.float16), torch.zeros(2, 32)
        for out in (torch.empty(2, 2), torch.empty(2, 8, dtype=torch.float64), torch.empty(8, 2).T):
            with pytest.raises(ValueError, match="out must be a contiguous CPU fp32 \\[2, 8\\]"):
                qgemm.h16_matmul(x, w, out=out)
        buf = torch.full((2, 8), 7.0)
        assert qgemm.h16_matmul(x, w, out=buf) is buf and not buf.any()


def test_a_16_bit_weight_the_kernel_cannot_take_is_widened_and_said(tmp_path):
    """A hidden size that is not a multiple of 16: the weights whose rows have that length load as
    fp32 (same values), the rest stay 16-bit, and the load line counts the widened ones."""
    from safetensors.torch import save_file

    from specc.models import load_target
    from specc.models.llama import weights_report
    from specc.runtime.testing import reference_greedy, tiny_llama
    from tests.runtime.test_runtime_artifact import _write_checkpoint

    torch.set_num_threads(1)
    d = tmp_path / "ckpt"
    _write_checkpoint(tiny_llama(seed=4, vocab_size=64, hidden_size=40, num_layers=1), d)
    state = load_target(d, "hf")[0].hf_state_dict()
    save_file({k: (v.half() if v.dim() == 2 else v).contiguous() for k, v in state.items()},
              str(d / "model.safetensors"))
    nat, _ = load_target(d, "hf", dtype="native")
    ref, _ = load_target(d, "hf", dtype="float32")
    assert set(nat.widened) == {k for k, v in state.items() if v.dim() == 2 and v.shape[1] % 16}
    assert "model.layers.0.mlp.down_proj.weight" not in nat.widened  # rows of 80: kept 16-bit
    assert f"{len(nat.widened)} 16-bit tensor(s) widened to fp32" in weights_report(nat)
    assert reference_greedy(nat, [5, 9, 3], 6) == reference_greedy(ref, [5, 9, 3], 6)


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0", "F16", "BF16"])
def test_decoder_stack_equals_layer_by_layer(type_name):
    """The one-call decoder stack gives the per-layer C path's bits: a decode row, a ragged verify (packed
    tokens), a tree mask with masked slots between attended ones, and the hidden states asked for."""
    from specc.runtime.testing import quantized_copy, tiny_llama

    head = type_name if type_name in ("F16", "BF16") else "Q8_0"
    model = quantized_copy(tiny_llama(seed=2, hidden_size=64, num_layers=3), type_name=type_name, head_type=head)
    assert model.c_layers

    def run(stack: bool, *args, **kw):
        model.c_stack = stack
        model.setup_cache(2, 48)
        with torch.inference_mode():
            model(torch.tensor([[3, 9, 4, 7, 1, 2], [5, 6, 2, 8, 8, 3]]), torch.arange(6).repeat(2, 1))  # prefill
            return model(*args, **kw)

    ids, pos = torch.tensor([[11, 12, 13], [21, 22, 23]]), torch.tensor([[6, 7, 8], [6, 7, 7]])
    tree = torch.zeros(2, 3, 9, dtype=torch.bool)
    tree[:, :, :6] = True
    tree[:, 0, 6] = tree[:, 1, 7] = tree[:, 2, 8] = True  # three siblings: each sees the prefix and itself
    tree[0, 2, 6] = True  # and one a masked-between ancestor
    cases = [((ids[:, :1], pos[:, :1]), {}),
             ((ids, pos), {"num_tokens": torch.tensor([3, 1]), "hidden_layers": (0, 2)}),
             ((ids, pos), {"attn_mask": tree, "cache_slots": torch.tensor([[6, 7, 8]] * 2), "hidden_layers": (1, 3)})]
    for args, kw in cases:
        lb, hb = run(False, *args, **kw)
        for threads in (1, 2):  # the stack's products and attention split over threads: the same bits
            qgemm.set_threads(threads)
            try:
                la, ha = run(True, *args, **kw)
            finally:
                qgemm.set_threads(1)
            assert torch.equal(la, lb)
            assert all(torch.equal(a, b) for a, b in zip(ha, hb)) and len(ha) == len(kw.get("hidden_layers", ()))
    from specc.models.llama import layer_program

    assert model._c_stack() is not None and layer_program(model) == "in one C call per forward"
    model.c_stack = False
    assert layer_program(model) == "one C layer at a time"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hf_checkpoint_in_16_bits_runs_in_its_own_bytes(tmp_path, dtype):
    """A safetensors checkpoint of fp16 / bf16 weights with ``dtype: native`` keeps them in their bytes,
    runs the C layers, and computes the fp32 model of the same values up to summation order (greedy
    continuations equal)."""
    from safetensors.torch import save_file

    from specc.methods.draft_model.drafter import draft_dtype
    from specc.models import load_target
    from specc.models.llama import runs_native, weights_report
    from specc.runtime.testing import reference_greedy, tiny_llama
    from tests.runtime.test_runtime_artifact import _write_checkpoint

    torch.set_num_threads(1)
    d = tmp_path / "ckpt"
    _write_checkpoint(tiny_llama(seed=3, vocab_size=64, num_layers=2), d)
    state = load_target(d, "hf")[0].hf_state_dict()
    save_file({k: (v.to(dtype) if v.dim() == 2 else v).contiguous() for k, v in state.items()},
              str(d / "model.safetensors"))
    ref, _ = load_target(d, "hf", dtype="float32")
    nat, tok = load_target(d, "hf", dtype="native")
    assert tok is not None and runs_native(nat) and not runs_native(ref) and nat.c_layers
    name = "F16" if dtype == torch.float16 else "BF16"
    assert f"checkpoint's own codes ({name};" in weights_report(nat)
    held = sum(m.nbytes for m in nat.modules() if hasattr(m, "parts"))
    assert held == sum(v.numel() * 2 for k, v in state.items() if v.dim() == 2 and k != "lm_head.weight")
    for prompt in ([5, 9, 3], [7] * 6):
        assert reference_greedy(nat, prompt, 8) == reference_greedy(ref, prompt, 8)
    nat.setup_cache(1, 32)
    ref.setup_cache(1, 32)
    with torch.inference_mode():
        ids, pos = torch.tensor([[5, 9, 3, 7]]), torch.arange(4)[None]
        a, b = nat(ids, pos), ref(ids, pos)
    a, b = (a[0] if isinstance(a, tuple) else a), (b[0] if isinstance(b, tuple) else b)
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)
    assert draft_dtype(nat, "cpu") == "native" and draft_dtype(ref, "cpu") == "float32"
    assert draft_dtype(nat, "cuda:0") == "float32"


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the subprocesses' PYTHONPATH

_ISA_PROBE = """
import torch
from specc.kernels import qgemm
from specc.models.qweights import QuantWeight
from tests.models.test_qweights import random_blocks
qw = QuantWeight.from_gguf("w", "Q4_1", random_blocks("Q4_1", 48, 256, seed=5), (48, 256))
y = qw.matmul(torch.randn(3, 256, generator=torch.Generator().manual_seed(6)))
print(",".join(qgemm.supported()), qgemm.variant(), bool(torch.isfinite(y).all()))
"""


@needs_kernels
def test_an_isa_ceiling_keeps_the_process_on_another_cpus_paths():
    """``SPECC_QGEMM_ISA=avx2`` leaves only the variants an AVX2-only CPU runs (so this CPU measures its
    paths: the int8 products on AVX2 tiles, the generic attention); a name it does not know is refused
    naming the variable and the choices."""
    env = dict(os.environ, SPECC_QGEMM_ISA="avx2", PYTHONPATH=REPO)
    env.pop("SPECC_QGEMM_VARIANT", None)
    out = subprocess.run([sys.executable, "-c", _ISA_PROBE], env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    runs, chosen, finite = out.stdout.split()
    allowed = {"portable", "avx2", "avx2int8"}
    assert set(runs.split(",")) == allowed & set(qgemm.supported())
    assert chosen == ("avx2int8" if "avx2int8" in qgemm.supported() else runs.split(",")[-1]) and finite == "True"
    env["SPECC_QGEMM_ISA"] = "avx9"
    bad = subprocess.run([sys.executable, "-c", _ISA_PROBE], env=env, capture_output=True, text=True, cwd=REPO)
    assert bad.returncode != 0 and "SPECC_QGEMM_ISA='avx9': choose one of avx2, portable" in bad.stderr


@needs_kernels
@pytest.mark.parametrize("setting, says", [
    ({"SPECC_QGEMM_ISA": "avx9"}, "SPECC_QGEMM_ISA='avx9': choose one of avx2, portable"),
    ({"SPECC_QGEMM_VARIANT": "neon"}, "SPECC_QGEMM_VARIANT='neon': choose one of"),
    ({"SPECC_QGEMM_ISA": "portable", "SPECC_QGEMM_VARIANT": "avx2"},
     "SPECC_QGEMM_VARIANT=avx2: SPECC_QGEMM_ISA=portable leaves only portable"),
])
def test_a_kernel_setting_the_process_cannot_take_is_refused_without_a_traceback(setting, says):
    """A bad ``$SPECC_QGEMM_ISA`` / ``$SPECC_QGEMM_VARIANT`` is the user's input: ``specc run`` prints
    ``specc run: error: ...`` naming the variable and exits 2, as for any other bad input; a variant the
    ISA ceiling leaves out is refused naming the ceiling, not the CPU."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    env.pop("SPECC_QGEMM_ISA", None)
    env.pop("SPECC_QGEMM_VARIANT", None)
    env.update(setting)
    out = subprocess.run([sys.executable, "-m", "specc.cli", "run", "smollm2_ngram", "--prompt", "Hi",
                          "--max-new-tokens", "1", "--no-progress"], env=env, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "specc run: error: " + says in out.stderr and "Traceback" not in out.stderr
