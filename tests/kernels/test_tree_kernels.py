"""The tree kernels: each Triton kernel equals its torch reference (under TRITON_INTERPRET=1 on the CPU,
compiled on CUDA), both equal an independent per-request Python walk of the rule, degenerate trees
included (a chain, a star, a single node), and on a chain the tree rules equal the chain rules.
Exactness of tree rejection sampling for the target distribution: a brute-force computation of the
emitted token's distribution per node shape (the runtime-level TV test is in test_tree_distribution)."""


import torch

from tests.triton_support import DEVICE, IN_PROCESS, fresh_process_test, needs_triton  # noqa: E402,F401  (before triton)

import pytest  # noqa: E402

from specc.kernels import draw_randomness, greedy_verify, process_logits, rejection_verify  # noqa: E402
from specc.kernels.tree import (TreeMaskMode, bitpack_dtype, tree_attention_mask, tree_depths,  # noqa: E402
                                tree_greedy_verify, tree_rejection_verify)



test_in_fresh_process = fresh_process_test(__file__, 900)


# ---------------------------------------------------------------- trees

def chain(n):
    return list(range(n))


def star(n):
    return [0] * n


def random_tree(n, gen):
    return [int(torch.randint(0, j + 1, (1,), generator=gen)) for j in range(n)]


def binary(n):
    return [j // 2 for j in range(n)]  # node j+1's parent (j+1-1)//2 ... a heap


SHAPES = {"chain": chain, "star": star, "heap": binary}


def batch_of(shapes, n):
    return torch.tensor([f(n) for f in shapes], dtype=torch.int64)


def ancestors(parents_row, i):
    """Set of ancestor-or-self nodes of node i (root numbering) by walking parents."""
    out = {i}
    while i:
        i = parents_row[i - 1]
        out.add(i)
    return out


def children(parents_row, node, n_valid):
    return [j + 1 for j in range(len(parents_row)) if parents_row[j] == node and j < n_valid]


# ---------------------------------------------------------------- oracles (plain per-request loops)

def greedy_walk(tokens, parents, argmax, n_valid, vocab):
    cur, path = 0, [0]
    while True:
        a = int(argmax[cur])
        nxt = next((c for c in children(parents, cur, n_valid) if 0 <= tokens[c - 1] < vocab
                    and tokens[c - 1] == a), None)
        if nxt is None:
            return path, a
        cur = nxt
        path.append(cur)


def rejection_walk(tokens, parents, p, q, u, noise, n_valid):
    """float64 recursive rejection over siblings (one-hot q when q is None)."""
    p, noise = p.double(), noise.double()
    vocab = p.shape[-1]
    cur, path = 0, [0]
    while True:
        r = p[cur].clone()
        qq = None if q is None or cur >= q.shape[0] else q[cur].double().clone()
        used = False
        moved = False
        for c in children(parents, cur, n_valid):
            x = tokens[c - 1]
            if not 0 <= x < vocab:
                continue
            pn = r / r.sum() if r.sum() > 0 else r
            if qq is None:
                accept = float(u[c - 1]) < float(pn[x])
            else:
                qn = qq / qq.sum() if qq.sum() > 0 else qq
                accept = float(u[c - 1]) * float(qn[x]) < float(pn[x])
            if accept:
                cur, moved = c, True
                path.append(c)
                break
            used = True
            if qq is None:
                r[x] = 0.0
            else:
                r = (pn - qn).clamp(min=0)
                qq[x] = 0.0
        if not moved:
            w = r if used and r.max() > 0 else p[cur]
            return path, int((w / noise).argmax())


def outputs_of(path, bonus, tokens, width):
    out = [tokens[n - 1] for n in path[1:]] + [bonus]
    return out + [-1] * (width - len(out)), path + [-1] * (width - len(path))


def assert_same(a, b):
    for name in ("accepted_len", "output_tokens", "bonus", "accept_index"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        assert torch.equal(x.cpu(), y.cpu()), f"{name}: {x} != {y}"


# ---------------------------------------------------------------- the mask

@needs_triton
@pytest.mark.parametrize("n", [0, 1, 3, 7, 15, 31])
def test_mask_three_packings_equal_reference_and_walk(n):
    gen = torch.Generator().manual_seed(n)
    rows = [chain(n), star(n), random_tree(n, gen), binary(n)]
    parents = torch.tensor(rows, dtype=torch.int64).view(4, n)
    prefix = torch.tensor([0, 3, 130, 7])
    w = n + 1
    want = torch.zeros(4, w, w, dtype=torch.bool)
    for b, row in enumerate(rows):
        for i in range(w):
            for j in ancestors(row, i):
                want[b, i, j] = True
    for backend in ("torch", "triton"):
        par = parents.to(DEVICE)
        q = tree_attention_mask(par, TreeMaskMode.QLEN_ONLY, backend=backend).cpu()
        assert q.dtype == torch.bool and torch.equal(q, want), backend
        full = tree_attention_mask(par, TreeMaskMode.FULL_MASK, prefix.to(DEVICE), backend=backend).cpu()
        assert full.dtype == torch.bool and full.numel() == int((w * (prefix + w)).sum())
        off = 0
        for b in range(4):
            blk = full[off: off + w * (int(prefix[b]) + w)].view(w, int(prefix[b]) + w)
            assert blk[:, : int(prefix[b])].all() and torch.equal(blk[:, int(prefix[b]):], want[b])
            off += blk.numel()
        if w <= 32:
            bits = tree_attention_mask(par, TreeMaskMode.QLEN_ONLY_BITPACKING, backend=backend).cpu()
            assert bits.dtype == bitpack_dtype(w) and bits.shape == (4, w)
            words = bits.to(torch.int64)
            unpacked = ((words.unsqueeze(-1) >> torch.arange(w)) & 1).bool()
            assert torch.equal(unpacked, want), backend
    depths = tree_depths(parents)
    assert depths[0].tolist() == list(range(w)) and depths[1].tolist() == [0] + [1] * n


def test_bitpack_word_types_follow_sglang():
    assert [bitpack_dtype(w) for w in (1, 8, 9, 16, 17, 32)] == [torch.uint8, torch.uint8, torch.uint16, torch.uint16,
                                                                torch.uint32, torch.uint32]
    with pytest.raises(ValueError, match="32"):
        bitpack_dtype(33)


def test_bad_parents_are_refused():
    with pytest.raises(ValueError, match=r"\[0, j\]"):
        tree_attention_mask(torch.tensor([[0, 2]]), backend="torch")
    with pytest.raises(ValueError, match="FULL_MASK needs prefix_lens"):
        tree_attention_mask(torch.tensor([[0, 0]]), TreeMaskMode.FULL_MASK, backend="torch")
    with pytest.raises(ValueError, match="int64"):
        tree_greedy_verify(torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 2, dtype=torch.int32),
                           torch.zeros(1, 3, 4), backend="torch")


# ---------------------------------------------------------------- greedy

def _greedy_case(n, vocab, seed):
    """4 requests: a chain, a star, a random tree, a heap; drafts matching the target's argmax at
    their parent about half the time (more often on the chain), so walks of every length happen."""
    gen = torch.Generator().manual_seed(seed)
    rows = [chain(n), star(n), random_tree(n, gen), binary(n)]
    parents = torch.tensor(rows, dtype=torch.int64).view(4, n)
    logits = torch.randn(4, n + 1, vocab, generator=gen)
    argmax = logits.argmax(-1)
    tokens = torch.randint(0, vocab, (4, n), generator=gen)
    for b in range(4):
        for j in range(n):
            if torch.rand(1, generator=gen) < (0.8 if b == 0 else 0.45):
                tokens[b, j] = argmax[b, rows[b][j]]
    if n > 2:
        tokens[2, 1] = -1  # a node that was not proposed
    return rows, parents, logits, argmax, tokens


@needs_triton
@pytest.mark.parametrize("n,vocab", [(0, 40), (1, 40), (4, 100), (9, 300), (16, 1500)])
def test_tree_greedy_triton_equals_torch_and_walk(n, vocab):
    rows, parents, logits, argmax, tokens = _greedy_case(n, vocab, seed=n * 7 + 1)
    num_valid = torch.tensor([n, n, max(0, n - 2), n // 2])
    for nv in (None, num_valid):
        ref = tree_greedy_verify(tokens, parents, logits, nv, backend="torch")
        for b in range(4):
            path, bonus = greedy_walk(tokens[b].tolist(), rows[b], argmax[b], n if nv is None else int(nv[b]), vocab)
            out, idx = outputs_of(path, bonus, tokens[b].tolist(), n + 1)
            assert ref.accept_index[b].tolist() == idx and ref.output_tokens[b].tolist() == out
            assert int(ref.accepted_len[b]) == len(path) - 1 and int(ref.bonus[b]) == bonus
        dev = [t.to(DEVICE) for t in (tokens, parents, logits, argmax)]
        nvd = None if nv is None else nv.to(DEVICE)
        assert_same(tree_greedy_verify(dev[0], dev[1], dev[2], nvd, backend="triton"), ref)
        assert_same(tree_greedy_verify(dev[0], dev[1], dev[3], nvd, backend="triton"), ref)
        assert_same(tree_greedy_verify(dev[0], dev[1], dev[3], nvd, max_depth=n, backend="torch"), ref)


def test_tree_greedy_on_a_chain_is_the_chain_rule():
    gen = torch.Generator().manual_seed(3)
    for k in (0, 1, 4, 7):
        logits = torch.randn(5, k + 1, 50, generator=gen)
        drafts = logits.argmax(-1)[:, :k].clone()
        drafts[torch.rand(5, k, generator=gen) < 0.3] = 1
        nv = torch.randint(0, k + 1, (5,), generator=gen)
        want = greedy_verify(drafts, logits, nv, backend="torch")
        got = tree_greedy_verify(drafts, torch.arange(k).expand(5, k).contiguous(), logits, nv, backend="torch")
        assert_same(got, want)


# ---------------------------------------------------------------- rejection sampling

def _rejection_case(n, vocab, seed, shapes=("chain", "star", "random", "heap")):
    gen = torch.Generator().manual_seed(seed)
    fns = {"chain": chain, "star": star, "heap": binary, "random": lambda m: random_tree(m, gen)}
    rows = [fns[s](n) for s in shapes]
    b = len(rows)
    parents = torch.tensor(rows, dtype=torch.int64).view(b, n)
    temp = torch.tensor([1.0, 0.7, 1.3, 0.0])[:b]
    p = process_logits(torch.randn(b, n + 1, vocab, generator=gen) * 2, temp, None, torch.full((b,), 0.95))
    q = process_logits(torch.randn(b, max(n, 1), vocab, generator=gen) * 2, temp, None, None)[:, :n].contiguous()
    # draft tokens: draws from q at the parent (duplicates among siblings allowed), some from p
    tokens = torch.zeros(b, n, dtype=torch.int64)
    for r in range(b):
        for j in range(n):
            src = p[r, rows[r][j]] if j % 3 == 0 else q[r, rows[r][j]]
            tokens[r, j] = torch.multinomial(src, 1, generator=gen)[0]
    u, noise = draw_randomness(b, n, vocab, generator=gen)
    return rows, parents, p, q, u, noise, tokens


@needs_triton
@pytest.mark.parametrize("n,vocab", [(0, 30), (1, 30), (3, 64), (8, 200), (12, 1300)])
@pytest.mark.parametrize("one_hot", [True, False])
def test_tree_rejection_triton_equals_torch_and_walk(n, vocab, one_hot):
    for seed in range(3):
        rows, parents, p, q, u, noise, tokens = _rejection_case(n, vocab, seed * 31 + n)
        qq = None if one_hot else q
        num_valid = torch.tensor([n, max(0, n - 1), n, n // 2])
        for nv in (None, num_valid):
            ref = tree_rejection_verify(tokens, parents, p, qq, u, noise, nv, backend="torch")
            for b in range(4):
                path, bonus = rejection_walk(tokens[b].tolist(), rows[b], p[b], None if one_hot else q[b], u[b],
                                             noise[b], n if nv is None else int(nv[b]))
                out, idx = outputs_of(path, bonus, tokens[b].tolist(), n + 1)
                assert ref.accept_index[b].tolist() == idx, (seed, b)
                assert ref.output_tokens[b].tolist() == out, (seed, b)
            dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
            got = tree_rejection_verify(dev(tokens), dev(parents), dev(p), dev(qq), dev(u), dev(noise), dev(nv),
                                        backend="triton")
            assert_same(got, ref)


def test_tree_rejection_on_a_chain_is_the_chain_rule():
    gen = torch.Generator().manual_seed(5)
    for k, one_hot in ((0, True), (1, False), (3, True), (5, False)):
        b, vocab = 6, 40
        p = process_logits(torch.randn(b, k + 1, vocab, generator=gen) * 2, torch.ones(b), None, None)
        q = process_logits(torch.randn(b, k, vocab, generator=gen) * 2, torch.ones(b), None, None) if k else None
        drafts = torch.randint(0, vocab, (b, k), generator=gen)
        if k:
            drafts = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(b, k)
        u, noise = draw_randomness(b, k, vocab, generator=gen)
        qq = None if one_hot else q
        want = rejection_verify(drafts, p, qq, u, noise, backend="torch")
        got = tree_rejection_verify(drafts, torch.arange(k).expand(b, k).contiguous(), p, qq, u, noise, backend="torch")
        assert_same(got, want)


def test_tree_rejection_temperature_zero_is_greedy():
    rows, parents, p, q, u, noise, tokens = _rejection_case(6, 50, 9)
    logits = torch.randn(4, 7, 50)
    p0 = process_logits(logits, torch.zeros(4), None, None)  # one-hot target
    tokens[:, 0] = logits.argmax(-1)[:, 0]
    got = tree_rejection_verify(tokens, parents, p0, None, u, noise, backend="torch")
    want = tree_greedy_verify(tokens, parents, logits, backend="torch")
    assert torch.equal(got.output_tokens, want.output_tokens)


@pytest.mark.parametrize("one_hot", [True, False])
@pytest.mark.parametrize("siblings", [1, 2, 4])
def test_first_emitted_token_follows_p_exactly(one_hot, siblings):
    """Brute force over the randomness: at the root with ``siblings`` children (greedy top-k drafts,
    or draws without replacement from q), the emitted token's distribution is p (TV < 0.006 with
    400k draws), while the shortcut 'accept each sibling with p(x), residual p without the tried
    siblings' is measurably off (TV > 0.03)."""
    from specc.runtime.testing import shortcut_tree_rejection

    gen = torch.Generator().manual_seed(11 + siblings)
    vocab, n_draws = 8, 400_000
    logits = torch.randn(vocab, generator=gen) * 1.2
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + 0.5 * torch.randn(vocab, generator=gen), -1)  # a draft close to the target
    parents = torch.zeros(n_draws, siblings, dtype=torch.int64)
    if one_hot:
        tokens = torch.argsort(q, descending=True)[:siblings].expand(n_draws, siblings).contiguous()
    else:
        e = torch.empty(n_draws, vocab).exponential_(generator=gen)
        tokens = torch.argsort(q.view(1, vocab) / e, dim=1, descending=True)[:, :siblings].contiguous()
    tp = p.view(1, 1, vocab).expand(n_draws, siblings + 1, vocab).contiguous()
    dq = None if one_hot else q.view(1, 1, vocab).expand(n_draws, siblings, vocab).contiguous()
    u, noise = draw_randomness(n_draws, siblings, vocab, generator=gen)

    def tv(res):
        emp = torch.bincount(res.output_tokens[:, 0], minlength=vocab).double() / n_draws
        return 0.5 * float((emp - p.double()).abs().sum())

    assert tv(tree_rejection_verify(tokens, parents, tp, dq, u, noise, backend="torch")) < 0.006
    if siblings > 1:
        assert tv(shortcut_tree_rejection(tokens, parents, tp, dq, u, noise)) > 0.03
