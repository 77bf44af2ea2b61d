"""process_logits against independent per-row computations, and the statistical guarantee of
standard rejection sampling: the emitted tokens follow the target distribution p."""

import pytest
import torch

from specc.kernels import draw_randomness, process_logits, rejection_verify

# ---------------------------------------------------------------- process_logits


def top_p_oracle(probs_row, top_p):
    """Keep the most probable tokens, in order, until their mass reaches top_p (Holtzman et al.)."""
    order = sorted(range(len(probs_row)), key=lambda i: -float(probs_row[i]))
    keep, mass = [], 0.0
    for i in order:
        if mass >= top_p:
            break
        keep.append(i)
        mass += float(probs_row[i])
    out = torch.zeros_like(probs_row)
    out[keep] = probs_row[keep]
    return out / out.sum()


def test_temperature_top_k_top_p_per_request():
    gen = torch.Generator().manual_seed(0)
    batch, n_pos, vocab = 4, 3, 50
    logits = 3 * torch.randn(batch, n_pos, vocab, generator=gen)
    temperature = torch.tensor([1.0, 0.5, 2.0, 0.7])
    top_k = torch.tensor([0, 5, 0, 20])
    top_p = torch.tensor([1.0, 1.0, 0.8, 0.9])
    probs = process_logits(logits, temperature, top_k, top_p)
    assert probs.shape == (batch, n_pos, vocab) and probs.dtype == torch.float32
    for b in range(batch):
        for n in range(n_pos):
            row = logits[b, n].double() / float(temperature[b])
            k = int(top_k[b])
            if k:
                kth = row.topk(k).values[-1]
                row = row.masked_fill(row < kth, float("-inf"))
            want = torch.softmax(row, -1)
            if float(top_p[b]) < 1:
                want = top_p_oracle(want, float(top_p[b]))
            torch.testing.assert_close(probs[b, n].double(), want, rtol=1e-5, atol=1e-6)
            assert int((probs[b, n] > 0).sum()) == int((want > 0).sum())
    assert int((probs[1] > 0).sum(-1).max()) == 5


def test_top_p_keeps_at_least_the_most_probable_token():
    logits = torch.tensor([[[10.0, 0.0, 0.0, 0.0]]])
    probs = process_logits(logits, torch.ones(1), None, torch.tensor([0.01]))
    assert probs[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_temperature_zero_rows_are_one_hot_argmax():
    logits = torch.tensor([[[0.1, 2.0, 2.0, -1.0]], [[0.1, 2.0, 3.0, -1.0]]])
    probs = process_logits(logits, torch.tensor([0.0, 1.0]), torch.tensor([0, 2]), torch.tensor([0.5, 1.0]))
    assert probs[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0]  # first index on ties
    assert probs[1, 0, 0] == 0 and probs[1, 0, 3] == 0 and probs[1, 0, 2] > probs[1, 0, 1] > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=torch.tensor([-1.0, 1.0])), "temperature must be >= 0"),
        (dict(temperature=torch.ones(3)), r"temperature must have shape \[B\]"),
        (dict(top_p=torch.tensor([0.0, 1.0])), r"top_p must lie in \(0, 1\]"),
        (dict(top_k=torch.tensor([-1, 1])), "top_k must be >= 0"),
    ],
)
def test_bad_parameters_are_named(kwargs, match):
    args = dict(temperature=torch.ones(2), top_k=None, top_p=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        process_logits(torch.zeros(2, 1, 4), **args)


# ---------------------------------------------------------------- distribution of the emitted tokens

VOCAB = 12
SAMPLES = 400_000
CHUNK = 200_000


def total_variation(counts, probs):
    emp = counts.double() / counts.sum()
    return 0.5 * float((emp - probs.double()).abs().sum())


def sample_rows(probs, gen):
    """probs [N, V] -> [N] int64, one categorical draw per row (inverse CDF; faster than multinomial)."""
    cdf = probs.cumsum(-1)  # [N, V]
    u = torch.rand(probs.shape[0], 1, generator=gen) * cdf[:, -1:]
    return (cdf <= u).sum(-1).clamp(max=probs.shape[1] - 1)


class TwoStepWorld:
    """A tiny 'language model': fixed target logits for position 0, for position 1 given token 0, for
    position 2 given tokens 0 and 1; a draft with its own (different) tables. p and q are the tables
    after the same process_logits."""

    def __init__(self, temperature, top_p, seed):
        g = torch.Generator().manual_seed(seed)
        v = VOCAB
        t0, t1, t2 = (torch.randn(1, n, v, generator=g) for n in (1, v, v * v))
        d0, d1 = t0 + torch.randn(1, 1, v, generator=g), t1 + torch.randn(1, v, v, generator=g)

        def proc(x):
            return process_logits(x, torch.tensor([temperature]), None, torch.tensor([top_p]))[0]

        self.p0, self.p1, self.p2 = proc(t0)[0], proc(t1), proc(t2).view(v, v, v)  # [V], [V, V], [V, V, V]
        self.q0, self.q1 = proc(d0)[0], proc(d1)  # [V], [V, V]
        self.q0_logits, self.q1_logits = d0[0, 0], d1[0]

    def step(self, n, one_hot, gen, always_accept=False):
        """One speculative step with κ = 2 for n independent requests; returns the first two emitted
        tokens [n], [n] (the second from the next plain step when only the bonus was emitted)."""
        v = VOCAB
        if one_hot:  # greedy drafts: deterministic argmax of the draft logits
            x0 = torch.full((n,), int(self.q0_logits.argmax()))
            x1 = self.q1_logits.argmax(-1)[x0]
            q = None
        else:
            x0 = sample_rows(self.q0.expand(n, v), gen)
            x1 = sample_rows(self.q1[x0], gen)
            q = torch.stack([self.q0.expand(n, v), self.q1[x0]], dim=1)  # [n, 2, V]
        drafts = torch.stack([x0, x1], dim=1)  # [n, 2]
        p = torch.stack([self.p0.expand(n, v), self.p1[x0], self.p2[x0, x1]], dim=1)  # [n, 3, V]
        u, noise = draw_randomness(n, 2, v, generator=gen)
        if always_accept:
            u = torch.zeros_like(u)
        out = rejection_verify(drafts, p, q, u, noise, backend="torch")
        first = out.output_tokens[:, 0]
        second = torch.where(out.accepted_len >= 1, out.output_tokens[:, 1], sample_rows(self.p1[first], gen))
        return first, second


def emitted_counts(world, one_hot, seed, always_accept=False, samples=SAMPLES):
    gen = torch.Generator().manual_seed(seed)
    joint = torch.zeros(VOCAB * VOCAB, dtype=torch.int64)
    for _ in range(samples // CHUNK):
        first, second = world.step(CHUNK, one_hot, gen, always_accept)
        joint += torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB)
    return joint.view(VOCAB, VOCAB)  # [first, second]


@pytest.mark.parametrize("one_hot", [True, False], ids=["one_hot_q", "probabilistic_q"])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_rejection_sampling_follows_the_target(temperature, one_hot):
    torch.set_num_threads(1)
    world = TwoStepWorld(temperature, top_p=0.9, seed=int(temperature * 10) + one_hot)
    joint = emitted_counts(world, one_hot, seed=1)
    target_joint = world.p0[:, None] * world.p1  # [V, V], p(first) p(second | first)
    assert total_variation(joint.sum(1), world.p0) < 0.01
    assert total_variation(joint.sum(0), target_joint.sum(0)) < 0.01
    likely = (world.p0 >= 0.2).nonzero().view(-1).tolist()  # second token conditioned on likely firsts
    assert likely, world.p0
    for c in likely:
        assert joint[c].sum() > 60_000
        assert total_variation(joint[c], world.p1[c]) < 0.01
    assert total_variation(joint.view(-1), target_joint.view(-1)) < 0.02  # 144 cells: more sampling noise


def test_distribution_check_detects_a_wrong_rule():
    """Negative control: accepting every draft (u = 0) emits the draft's distribution, which this
    world keeps far from the target, so the same check must fail."""
    torch.set_num_threads(1)
    world = TwoStepWorld(1.0, top_p=0.9, seed=11)
    joint = emitted_counts(world, one_hot=False, seed=2, always_accept=True, samples=CHUNK)
    assert total_variation(joint.sum(1), world.p0) > 0.05
