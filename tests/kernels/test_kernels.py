"""Each Triton verify kernel equals its torch reference (under TRITON_INTERPRET=1 on the CPU, compiled
on CUDA), and both equal an independent per-request Python loop of the rule, edge cases included."""


import torch

from tests.triton_support import DEVICE, IN_PROCESS, fresh_process_test, needs_triton  # noqa: E402,F401  (before triton)

import pytest  # noqa: E402

from specc.errors import SpeccError  # noqa: E402
from specc.kernels import draw_randomness, greedy_verify, process_logits, rejection_verify, resolve_backend  # noqa: E402



test_in_fresh_process = fresh_process_test(__file__, 600)


# ---------------------------------------------------------------- independent oracles (plain loops)

def greedy_oracle(drafts, argmax, num_valid):
    """Per request: walk the drafts while they equal the target argmax."""
    accepted, bonus, out = [], [], []
    for b in range(drafts.shape[0]):
        k = drafts.shape[1]
        a = 0
        while a < k and a < int(num_valid[b]) and int(drafts[b, a]) == int(argmax[b, a]):
            a += 1
        accepted.append(a)
        bonus.append(int(argmax[b, a]))
        out.append([int(argmax[b, j]) if j <= a else -1 for j in range(k + 1)])
    return accepted, bonus, out


def rejection_oracle(drafts, p, q, u, noise, num_valid):
    """Per request, in float64: accept while u < p(x)/q(x); resample from the residual or p."""
    p, u, noise = p.double(), u.double(), noise.double()
    q = None if q is None else q.double()
    vocab = p.shape[-1]
    accepted, bonus = [], []
    for b in range(drafts.shape[0]):
        k = drafts.shape[1]
        a, rejected_tok = 0, None
        while a < k and a < int(num_valid[b]):
            x = int(drafts[b, a])
            if not 0 <= x < vocab:
                break
            qx = 1.0 if q is None else float(q[b, a, x])
            ratio = float("inf") if qx == 0 else float(p[b, a, x]) / qx
            if float(u[b, a]) < min(1.0, ratio):
                a += 1
            else:
                rejected_tok = x
                break
        w = p[b, a].clone()
        if rejected_tok is not None:
            if q is None:
                r = w.clone()
                r[rejected_tok] = 0
            else:
                r = (w - q[b, a]).clamp(min=0)
            if r.max() > 0:
                w = r / r.sum()
        accepted.append(a)
        bonus.append(int((w / noise[b]).argmax()))
    return accepted, bonus


def make_drafts(argmax, num_steps, match_upto, vocab, gen):
    """Drafts equal to the target argmax for the first match_upto[b] positions, then a different token."""
    batch = argmax.shape[0]
    drafts = torch.randint(0, vocab, (batch, num_steps), generator=gen)
    for b in range(batch):
        for i in range(num_steps):
            if i < match_upto[b]:
                drafts[b, i] = argmax[b, i]
            elif drafts[b, i] == argmax[b, i]:
                drafts[b, i] = (argmax[b, i] + 1) % vocab
    return drafts


def assert_same(a, b):
    for name, x, y in zip(("accepted_len", "output_tokens", "bonus"), a, b):
        assert x.dtype == y.dtype, name
        assert torch.equal(x.cpu(), y.cpu()), f"{name}: {x} != {y}"


# ---------------------------------------------------------------- greedy

GREEDY_CASES = [(1, 0, 64), (2, 1, 100), (3, 3, 257), (4, 5, 512), (4, 4, 1500)]


@needs_triton
@pytest.mark.parametrize("batch,num_steps,vocab", GREEDY_CASES)
def test_greedy_triton_equals_torch_and_oracle(batch, num_steps, vocab):
    gen = torch.Generator().manual_seed(batch * 100 + num_steps * 10 + vocab)
    logits = torch.randn(batch, num_steps + 1, vocab, generator=gen)
    argmax = logits.argmax(-1)
    match_upto = torch.randint(0, num_steps + 1, (batch,), generator=gen)
    if batch > 1:
        match_upto[0] = num_steps  # one request all accepted
        match_upto[1] = 0  # one none accepted
    drafts = make_drafts(argmax, num_steps, match_upto, vocab, gen)
    num_valid = torch.randint(0, num_steps + 1, (batch,), generator=gen, dtype=torch.int32)
    if batch > 2:
        num_valid[2] = num_steps
    if num_steps > 1 and batch > 3:
        drafts[3, 1] = -1  # placeholder: never accepted
    for nv in (None, num_valid):
        want_acc, want_bonus, want_out = greedy_oracle(drafts, argmax, torch.full((batch,), num_steps) if nv is None else nv)
        ref = greedy_verify(drafts, logits, nv, backend="torch")
        assert ref.accepted_len.tolist() == want_acc
        assert ref.bonus.tolist() == want_bonus
        assert ref.output_tokens.tolist() == want_out
        d, lg, am = drafts.to(DEVICE), logits.to(DEVICE), argmax.to(DEVICE)
        nvd = None if nv is None else nv.to(DEVICE)
        assert_same(greedy_verify(d, lg, nvd, backend="triton"), ref)
        assert_same(greedy_verify(d, am, nvd, backend="triton"), ref)


@needs_triton
def test_greedy_edge_cases_all_none_empty():
    vocab = 64
    logits = torch.randn(3, 4, vocab, generator=torch.Generator().manual_seed(1))
    argmax = logits.argmax(-1)
    drafts = argmax[:, :3].clone()
    drafts[1, 0] = (drafts[1, 0] + 5) % vocab
    num_valid = torch.tensor([3, 3, 2], dtype=torch.int32)
    for backend in ("torch", "triton"):
        out = greedy_verify(drafts.to(DEVICE), logits.to(DEVICE), num_valid.to(DEVICE), backend=backend)
        assert out.accepted_len.tolist() == [3, 0, 2]  # all, none, clipped by num_valid
        assert out.bonus.tolist() == [int(argmax[0, 3]), int(argmax[1, 0]), int(argmax[2, 2])]
        assert out.output_tokens[0].tolist() == argmax[0].tolist()
        assert out.output_tokens[1].tolist() == [int(argmax[1, 0]), -1, -1, -1]
        # κ = 0: plain decode, the bonus is the argmax.
        empty = greedy_verify(drafts[:, :0].to(DEVICE), logits[:, :1].to(DEVICE), backend=backend)
        assert empty.accepted_len.tolist() == [0, 0, 0]
        assert empty.output_tokens.view(-1).tolist() == argmax[:, 0].tolist()


@needs_triton
def test_greedy_ties_take_the_first_index():
    logits = torch.zeros(1, 2, 2000)
    logits[0, 0, [5, 1030, 1999]] = 3.0  # a tie across two Triton vocab blocks
    logits[0, 1, [1500, 1700]] = 2.0
    drafts = torch.tensor([[5]])
    for backend in ("torch", "triton"):
        out = greedy_verify(drafts.to(DEVICE), logits.to(DEVICE), backend=backend)
        assert out.accepted_len.tolist() == [1] and out.bonus.tolist() == [1500]


# ---------------------------------------------------------------- standard rejection sampling

REJECTION_CASES = [(1, 0, 64), (2, 1, 64), (3, 3, 200), (4, 5, 512), (2, 2, 1100)]


def random_distributions(batch, num_steps, vocab, gen, temperature=1.0, top_p=1.0, top_k=0):
    t_logits = 2 * torch.randn(batch, num_steps + 1, vocab, generator=gen)
    d_logits = t_logits[:, :num_steps] + torch.randn(batch, num_steps, vocab, generator=gen)
    temp = torch.full((batch,), temperature)
    tp, tk = torch.full((batch,), top_p), torch.full((batch,), top_k, dtype=torch.int64)
    return process_logits(t_logits, temp, tk, tp), process_logits(d_logits, temp, tk, tp)


@needs_triton
@pytest.mark.parametrize("one_hot", [True, False])
@pytest.mark.parametrize("batch,num_steps,vocab", REJECTION_CASES)
def test_rejection_triton_equals_torch_and_oracle(batch, num_steps, vocab, one_hot):
    gen = torch.Generator().manual_seed(7 * batch + 11 * num_steps + vocab + one_hot)
    p, q = random_distributions(batch, num_steps, vocab, gen, top_p=0.9)
    if one_hot:
        drafts, q = q.argmax(-1), None  # greedy drafts
    else:
        drafts = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, num_steps)
    u, noise = draw_randomness(batch, num_steps, vocab, generator=gen)
    num_valid = torch.randint(0, num_steps + 1, (batch,), generator=gen, dtype=torch.int32)
    if batch > 1 and num_steps > 0:
        num_valid[0] = num_steps
        drafts[-1, -1] = -1  # placeholder
    for nv in (None, num_valid):
        nv_full = torch.full((batch,), num_steps) if nv is None else nv
        want_acc, want_bonus = rejection_oracle(drafts, p, q, u, noise, nv_full)
        ref = rejection_verify(drafts, p, q, u, noise, nv, backend="torch")
        assert ref.accepted_len.tolist() == want_acc
        assert ref.bonus.tolist() == want_bonus
        for b in range(batch):
            a = want_acc[b]
            assert ref.output_tokens[b].tolist() == drafts[b, :a].tolist() + [want_bonus[b]] + [-1] * (num_steps - a)
        dev = [t.to(DEVICE) if t is not None else None for t in (drafts, p, q, u, noise, nv)]
        assert_same(rejection_verify(*dev, backend="triton"), ref)


@needs_triton
@pytest.mark.parametrize("one_hot", [True, False])
def test_rejection_all_accepted_none_accepted_kappa_zero(one_hot):
    gen = torch.Generator().manual_seed(3)
    batch, num_steps, vocab = 4, 3, 96
    p, q = random_distributions(batch, num_steps, vocab, gen)
    u, noise = draw_randomness(batch, num_steps, vocab, generator=gen)
    if one_hot:
        drafts, q_in = q.argmax(-1), None
    else:
        drafts, q_in = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, num_steps), q
    p_acc = p.clone()
    # Request 0: p(x) = 1 at every draft -> all accepted; bonus from p at position K.
    # Request 1: p(x) = 0 at the first draft -> none accepted; bonus from the residual.
    for i in range(num_steps):
        p_acc[0, i] = 0
        p_acc[0, i, drafts[0, i]] = 1
    p_acc[1, 0, drafts[1, 0]] = 0
    p_acc[1, 0] /= p_acc[1, 0].sum()
    for backend in ("torch", "triton"):
        dev = [t.to(DEVICE) if t is not None else None for t in (drafts, p_acc, q_in, u, noise)]
        out = rejection_verify(*dev, backend=backend)
        assert out.accepted_len[0] == num_steps
        assert out.bonus[0] == int((p_acc[0, num_steps] / noise[0]).argmax())
        assert out.accepted_len[1] == 0
        assert out.bonus[1] != drafts[1, 0] and p_acc[1, 0, out.bonus[1]] > 0
        # κ = 0: the bonus is a draw from p itself.
        k0 = rejection_verify(drafts[:, :0].to(DEVICE), p[:, :1].to(DEVICE), None if one_hot else q[:, :0].to(DEVICE),
                              u[:, :0].to(DEVICE), noise.to(DEVICE), backend=backend)
        assert k0.accepted_len.tolist() == [0] * batch
        assert k0.bonus.tolist() == (p[:, 0] / noise).argmax(-1).tolist()


@needs_triton
def test_rejection_empty_residual_falls_back_to_p():
    """p = q/2 (deliberately unnormalized): max(p - q, 0) is zero everywhere; a rejected draft then
    draws the bonus from p, which is what the measure-zero argument in rejection_verify allows."""
    gen = torch.Generator().manual_seed(5)
    batch, vocab = 3, 80
    _, q = random_distributions(batch, 2, vocab, gen)
    p = torch.cat([q / 2, q[:, :1]], dim=1)  # [B, 3, V]
    drafts = q.argmax(-1)
    u = torch.full((batch, 2), 0.9)  # u * q(x) >= q(x) / 2 -> rejected at position 0
    _, noise = draw_randomness(batch, 2, vocab, generator=gen)
    for backend in ("torch", "triton"):
        out = rejection_verify(drafts.to(DEVICE), p.to(DEVICE), q.to(DEVICE), u.to(DEVICE), noise.to(DEVICE), backend=backend)
        assert out.accepted_len.tolist() == [0] * batch
        assert out.bonus.tolist() == (p[:, 0] / noise).argmax(-1).tolist()


@needs_triton
def test_rejection_with_temperature_zero_is_greedy():
    gen = torch.Generator().manual_seed(9)
    batch, num_steps, vocab = 4, 4, 128
    logits = torch.randn(batch, num_steps + 1, vocab, generator=gen)
    argmax = logits.argmax(-1)
    drafts = make_drafts(argmax, num_steps, [4, 0, 2, 3], vocab, gen)
    p = process_logits(logits, torch.zeros(batch))  # one-hot argmax
    q = process_logits(torch.randn(batch, num_steps, vocab, generator=gen), torch.ones(batch))
    u, noise = draw_randomness(batch, num_steps, vocab, generator=gen)
    want = greedy_verify(drafts, logits, backend="torch")
    for backend in ("torch", "triton"):
        for q_in in (None, q):
            dev = [t.to(DEVICE) if t is not None else None for t in (drafts, p, q_in, u, noise)]
            assert_same(rejection_verify(*dev, backend=backend), want)


# ---------------------------------------------------------------- dispatch and input errors

def test_backend_choice_and_errors(monkeypatch):
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("cuda", torch.device("cpu"))
    drafts = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"target argmax must be \[B, K\+1\]"):
        greedy_verify(drafts, torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"target must be logits \[B, K\+1, V\] float or argmax"):
        greedy_verify(drafts, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="draft_tokens must be"):
        greedy_verify(drafts.int(), torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="num_valid must have shape"):
        greedy_verify(drafts, torch.zeros(2, 4, dtype=torch.int64), torch.zeros(3, dtype=torch.int32))
    p = torch.full((2, 4, 8), 1 / 8)
    u, noise = draw_randomness(2, 3, 8)
    with pytest.raises(ValueError, match="draft_probs must be None"):
        rejection_verify(drafts, p, torch.full((2, 3, 9), 1 / 9), u, noise)
    with pytest.raises(ValueError, match="exp_noise must be"):
        rejection_verify(drafts, p, None, u, noise[:, :4])
    if DEVICE == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(SpeccError, match="TRITON_INTERPRET=1"):
            greedy_verify(drafts, torch.zeros(2, 4, dtype=torch.int64), backend="triton")
