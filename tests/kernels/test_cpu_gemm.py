"""The skinny fp32 GEMM (specc/kernels/skinny_gemm.c via specc.kernels.cpu_gemm) against float64 numpy."""
import numpy as np
import pytest
import torch

from specc.kernels import cpu_gemm

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason=f"skinny GEMM unavailable: {cpu_gemm.status()}")


@pytest.fixture
def threads():
    before = cpu_gemm.get_threads()
    yield
    cpu_gemm.set_threads(before)


@pytest.mark.parametrize("R", [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 17])
@pytest.mark.parametrize("K,O", [(576, 960), (37, 5), (8, 64), (9, 129), (1536, 67)])
def test_matches_float64_reference(R, K, O):
    """Every row count (6-row register blocks and their remainders), K with and without an 8-wide tail,
    O with odd and block-boundary tails."""
    rng = np.random.default_rng(R * 1000 + K + O)
    x = rng.standard_normal((R, K), dtype=np.float32)
    w = rng.standard_normal((O, K), dtype=np.float32)
    y = cpu_gemm.skinny_matmul(x, w)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert y.shape == (R, O) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.sqrt(K) * np.abs(ref).max() / 10)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_rows_are_batch_and_thread_invariant(n_threads, threads):
    """A row's outputs are bit-identical whatever the other rows and the thread count: the verify
    forward over κ+1 tokens gives the logits a one-token forward gives."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, 200), dtype=np.float32)
    w = rng.standard_normal((1000, 200), dtype=np.float32)
    cpu_gemm.set_threads(1)
    alone = [cpu_gemm.skinny_matmul(x[i:i + 1].copy(), w)[0] for i in range(9)]
    cpu_gemm.set_threads(n_threads)
    together = cpu_gemm.skinny_matmul(x, w)
    for i in range(9):
        assert np.array_equal(together[i], alone[i])


def test_writes_into_out_and_checks_inputs():
    x = np.ones((2, 16), dtype=np.float32)
    w = np.ones((3, 16), dtype=np.float32)
    out = np.zeros((2, 3), dtype=np.float32)
    assert cpu_gemm.skinny_matmul(x, w, out=out) is out
    assert np.all(out == 16)
    with pytest.raises(ValueError, match="fp32"):
        cpu_gemm.skinny_matmul(x.astype(np.float64), w)
    with pytest.raises(ValueError, match="fp32"):
        cpu_gemm.skinny_matmul(x, np.ones((3, 15), dtype=np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        cpu_gemm.skinny_matmul(x, np.ones((16, 3), dtype=np.float32).T)
    with pytest.raises(ValueError, match="out must be"):
        cpu_gemm.skinny_matmul(x, w, out=np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match=">= 1"):
        cpu_gemm.set_threads(0)
    with pytest.raises(ValueError, match="overlap"):
        buf = np.zeros((2, 16), dtype=np.float32)
        cpu_gemm.skinny_matmul(buf, np.ones((16, 16), dtype=np.float32), out=buf)
    empty = cpu_gemm.skinny_matmul(np.zeros((2, 0), np.float32), np.zeros((3, 0), np.float32))
    assert empty.shape == (2, 3) and np.all(empty == 0)  # K = 0: numpy's answer, zeros


def test_llama_linear_uses_it_for_verify_rows():
    """``Linear`` (CPU fast path) sends 2..16 rows through the skinny GEMM and agrees with F.linear."""
    from specc.models.llama import Linear

    torch.manual_seed(0)
    lin = Linear(48, 100, bias=True)
    torch.nn.init.normal_(lin.weight)
    torch.nn.init.normal_(lin.bias)
    w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    lin.use_cpu_fast()
    assert lin._w_np is not None and lin._w_np.shape == (100, 48)
    for rows in (1, 2, 5, 16, 17):
        x = torch.randn(rows, 48)
        with torch.inference_mode():
            torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-5)


def test_linear_follows_in_place_weight_updates():
    """The skinny path's [out, in] copy is refreshed when the weight changes in place after
    ``use_cpu_fast()`` (load_state_dict, copy_), so 1 and 2..16 rows agree with the new weight."""
    from specc.models.llama import Linear

    lin = Linear(32, 40)
    torch.nn.init.normal_(lin.weight)
    lin.use_cpu_fast()
    new = torch.randn(40, 32)
    lin.load_state_dict({"weight": new})
    for rows in (1, 2, 5):
        x = torch.randn(rows, 32)
        with torch.inference_mode():
            torch.testing.assert_close(lin(x), x @ new.t(), atol=1e-4, rtol=1e-5)


def test_eagle_head_matmuls_follow_in_place_weight_updates():
    from specc.methods.eagle.model import _lin

    from specc.methods.eagle.model import _cache_weights

    lin = torch.nn.Linear(32, 40, bias=False)
    _cache_weights(lin)
    with torch.no_grad():
        lin.weight.mul_(2.0)
    for rows in (1, 5, 20):
        x = torch.randn(rows, 32)
        with torch.inference_mode():
            torch.testing.assert_close(_lin(lin, x), x @ lin.weight.detach().t(), atol=1e-4, rtol=1e-5)


def test_configure_cpu_threads_keeps_the_count_across_calls():
    """A second call without a count (every ``use_cpu_fast()`` makes one) keeps the first call's count."""
    from specc.models import llama

    before = (llama._cpu_threads, torch.get_num_threads(), cpu_gemm.get_threads())
    try:
        llama.configure_cpu_threads(2)
        llama.configure_cpu_threads()
        assert cpu_gemm.get_threads() == 2 and torch.get_num_threads() == 1
    finally:
        llama._cpu_threads = before[0]
        torch.set_num_threads(before[1])
        cpu_gemm.set_threads(before[2])


def test_disabled_by_environment(monkeypatch):
    """``SPECC_SKINNY_GEMM=0`` turns the kernel off (callers keep numpy) with the reason in status()."""
    monkeypatch.setattr(cpu_gemm, "_status", None)
    monkeypatch.setattr(cpu_gemm, "_lib", None)
    monkeypatch.setenv("SPECC_SKINNY_GEMM", "0")
    assert not cpu_gemm.available()
    assert "SPECC_SKINNY_GEMM=0" in cpu_gemm.status()
    with pytest.raises(RuntimeError, match="unavailable"):
        cpu_gemm.skinny_matmul(np.ones((1, 8), np.float32), np.ones((2, 8), np.float32))


def test_build_failure_is_reported_not_raised(monkeypatch, tmp_path):
    """A broken compiler leaves the kernel unavailable with the compiler named in status()."""
    monkeypatch.setattr(cpu_gemm, "_status", None)
    monkeypatch.setattr(cpu_gemm, "_lib", None)
    monkeypatch.setenv("SPECC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert not cpu_gemm.available()
    assert "no-such-cc" in cpu_gemm.status()
    assert not list(tmp_path.rglob("*.so"))
