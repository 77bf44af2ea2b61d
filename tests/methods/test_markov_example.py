"""A worked Markov-chain example of why DSpark adds a Markov head, run through our DSpark code.

The target is a first-order Markov chain over V = 64 tokens whose rows put 0.45 on each of two
"common continuations" (the example's matrix, rebuilt with its random seed). A parallel draft that knows only
each position's marginal picks incompatible tokens; DSpark's Markov head, given the chain's
transitions, restores the dependency. The example gives 0.62 expected accepted drafts per step
without transitions and 0.81 with them (K = 6, averaged over the last token); both are reproduced
by `specc.methods.dflash.model.markov_walk` with a vanilla `MarkovHead` whose low-rank factors hold the
transition matrix (rank r = V: ``w1[a] = log P[a]``, ``w2 = I``).
"""
import torch

from specc.methods.dflash.model import MarkovHead, markov_walk

V, K = 64, 6


def seed_chain() -> torch.Tensor:
    torch.manual_seed(0)
    P = torch.full((V, V), 0.1 / (V - 2))
    for a in range(V):
        b, c = torch.randperm(V)[:2]
        P[a, b], P[a, c] = 0.45, 0.45
    return P


def expected_accept(P, drafts, last):
    """Σ_i P(the first i drafts are the path the target samples) (the example's ``expected_accept``)."""
    total = torch.zeros(drafts.shape[0], dtype=torch.float64)
    p = torch.ones_like(total)
    prev = last
    for i in range(drafts.shape[1]):
        p = p * P[prev, drafts[:, i]].double()
        total += p
        prev = drafts[:, i]
    return float(total.mean())


def test_markov_head_restores_the_chain():
    P = seed_chain()
    last = torch.arange(V)  # every last token, as the example averages over them
    # the parallel backbone's base logits: position i sees only the marginal i + 1 steps ahead
    marg, dist = [], torch.eye(V)
    for _ in range(K):
        dist = dist @ P
        marg.append(dist.log())
    base = torch.stack(marg, dim=1)  # [V, K, V]
    argmax = lambda z, j: z.argmax(-1)  # noqa: E731
    drafts, _, _ = markov_walk(base, None, last, None, argmax)
    without = expected_accept(P, drafts, last)

    head = MarkovHead("vanilla", rank=V, vocab_size=V, hidden_size=8)
    with torch.no_grad():
        head.w1.weight.copy_(P.log())          # w1[prev] = log P[prev, :]
        head.w2.weight.copy_(torch.eye(V))     # r = V: w2 is the identity
    # with the transition head the backbone only has to place the first token (its later positions
    # are left uninformative: the head carries the dependency)
    base_markov = torch.zeros(V, K, V)
    base_markov[:, 0] = marg[0]
    drafts_m, logits, prevs = markov_walk(base_markov, None, last, head, argmax)
    with_markov = expected_accept(P, drafts_m, last)

    assert round(without, 2) == 0.62, without
    assert round(with_markov, 2) == 0.81, with_markov
    # the corrected logits really are base + the transition bias of the previous token
    assert torch.allclose(logits[1], base_markov[:, 1] + P.log()[prevs[1]])
    # and the head alone (no backbone) is the example's left-to-right argmax of P
    prev, chain = last, []
    for _ in range(K):
        prev = P[prev].argmax(-1)
        chain.append(prev)
    assert torch.equal(drafts_m, torch.stack(chain, 1))
