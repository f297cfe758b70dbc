"""Distributional tests of the samplers: the emitted tokens follow the target distribution.

Chi-square goodness of fit at 2e5 trials with fixed seeds (deterministic: not flaky), threshold
p > 1e-4. A sampler that draws from p instead of the residual max(p - q, 0) on rejection (the
TriForce reference's middle-level bug) fails the same test (checked below), as does accepting with
the wrong probability. Run on the vectorised backends (reference for the chain, cpu for both; the
hypothesis tests show every backend returns the reference's tokens for the same uniforms)."""
import pytest
import torch
from scipy import stats

import triforce_kernels as tk
from triforce_kernels.reference import sampling as ref

from .helpers import backends

N = 200_000
P_MIN = 1e-4


def _dist(g, V, conc=1.0):
    return torch.distributions.Dirichlet(torch.full((V,), conc)).sample()  # uses the global RNG


def _chi2(samples, p, V):
    obs = torch.bincount(samples, minlength=V).double()
    exp = p.double() * len(samples)
    keep = exp > 0
    assert obs[~keep].sum() == 0, "a token with zero target probability was emitted"
    return stats.chisquare(obs[keep].numpy(), exp[keep].numpy() * obs.sum().item() / exp[keep].sum().item()).pvalue


def _vectorised(op):
    return [b for b in ("reference", "cpu") if any(b == x.values[0] for x in backends(op, include_reference=True)
                                                     if not x.marks)]


@pytest.mark.parametrize("backend", _vectorised("chain_speculative_sample"))
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("deterministic", [False, True])
def test_chain_first_token_and_acceptance(backend, n, deterministic):
    torch.manual_seed(100 + n)
    V = 6
    p1 = torch.stack([_dist(None, V) for _ in range(n + 1)])  # target rows
    q1 = torch.stack([_dist(None, V) for _ in range(n)])      # draft rows, p != q
    g = torch.Generator().manual_seed(n)
    if deterministic:
        d = torch.full((N, n), int(q1[0].argmax()))  # a deterministic draft
        q = None
    else:
        d = torch.stack([torch.multinomial(q1[i], N, replacement=True, generator=g) for i in range(n)], 1)
        q = q1[None].expand(N, n, V)
    p = p1[None].expand(N, n + 1, V)
    tokens, num = tk.chain_speculative_sample(d, q, p, generator=g, backend=backend)
    assert _chi2(tokens[:, 0], p1[0], V) > P_MIN
    # acceptance rate of position 0: sum_x min(p, q) (deterministic draft: p(x0))
    rate = (num >= 1).double().mean().item()
    want = p1[0, d[0, 0]].item() if deterministic else torch.minimum(p1[0], q1[0]).sum().item()
    assert abs(rate - want) < 5 * (want * (1 - want) / N) ** 0.5 + 1e-9
    # second token given the first was accepted: distributed as p_1
    if n >= 2:
        sel = num >= 1
        assert _chi2(tokens[sel, 1], p1[1], V) > P_MIN


def _wrong_chain(d, q, p, u):
    """The bug the test must catch: on rejection, sample p (not the residual)."""
    p0, q0 = p[:, 0].double(), q[:, 0].double()
    x = d[:, 0]
    acc = u[:, 0, 0].double() * q0.gather(1, x[:, None])[:, 0] < p0.gather(1, x[:, None])[:, 0]
    y = ref.sample_weights(p0, p0, u[:, 0, 1])
    return torch.where(acc, x, y)


def test_chi_square_catches_sampling_p_on_rejection():
    torch.manual_seed(5)
    V, n = 6, 1
    p1, q1 = _dist(None, V)[None], _dist(None, V)[None]
    g = torch.Generator().manual_seed(9)
    d = torch.multinomial(q1[0], N, replacement=True, generator=g)[:, None]
    u = torch.rand(N, n + 1, 2, generator=g)
    wrong = _wrong_chain(d, q1[None].expand(N, 1, V), p1[None].expand(N, 1, V), u)
    assert _chi2(wrong, p1[0], V) < P_MIN
    right = ref.chain_speculative_sample(d, q1[None].expand(N, 1, V), torch.cat([p1, p1])[None].expand(N, 2, V), u)[0]
    assert _chi2(right[:, 0], p1[0], V) > P_MIN


@pytest.mark.parametrize("backend", ["cpu"] if "cpu" in _vectorised("tree_speculative_sample") else [])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("deterministic", [False, True])
def test_tree_distribution(backend, k, deterministic):
    """Root with k children (i.i.d. from q: duplicates happen; or fixed tokens incl. a duplicate),
    each with one child: the first emitted token ~ p_root, the second ~ p_child(first)."""
    torch.manual_seed(200 + k + 10 * deterministic)
    V = 5
    T = 1 + 2 * k
    parents = torch.tensor([-1] + [0] * k + list(range(1, k + 1)))
    p_root, q_root = _dist(None, V), _dist(None, V, conc=0.5)
    p_next = torch.stack([_dist(None, V) for _ in range(V)])  # target after token x
    q_next = torch.stack([_dist(None, V) for _ in range(V)])
    g = torch.Generator().manual_seed(k)
    if deterministic:
        first = torch.tensor(([int(q_root.argmax())] * 2 + list(range(V)))[:k]).expand(N, k)  # a duplicate
    else:
        first = torch.multinomial(q_root, N * k, replacement=True, generator=g).view(N, k)
    second = torch.stack([torch.multinomial(q_next[first[:, i]], 1, generator=g)[:, 0] for i in range(k)], 1)
    tt = torch.cat([torch.zeros(N, 1, dtype=torch.long), first, second], 1)
    tp = torch.cat([p_root.expand(N, 1, V), p_next[first], p_next[second]], 1)
    dp = None if deterministic else torch.cat([q_root.expand(N, 1, V), q_next[first], q_next[second]], 1)
    if deterministic:  # deterministic grandchildren too
        tt[:, k + 1:] = q_next[first].argmax(-1)
    path, tokens, num = tk.tree_speculative_sample(tt, parents.expand(N, T), dp, tp, generator=g, backend=backend)
    assert _chi2(tokens[:, 0], p_root, V) > P_MIN
    for x in range(V):  # second token given the first
        sel = (tokens[:, 0] == x) & (num >= 1)
        if sel.sum() > 2000:
            assert _chi2(tokens[sel, 1], p_next[x], V) > P_MIN
    if not deterministic:  # acceptance at the root: 1 - prod of rejection probabilities
        r, acc = p_root.double(), 0.0
        q = q_root.double()
        for _ in range(k):  # P(accept one of the k children) through the residual recursion
            a = torch.minimum(r, q).sum()
            acc += (1 - acc) * a.item()
            r = (r - q).clamp(min=0)
            r = r / r.sum() if r.sum() > 0 else r
        rate = (num >= 1).double().mean().item()
        assert abs(rate - acc) < 5 * (acc * (1 - acc) / N) ** 0.5 + 1e-9
