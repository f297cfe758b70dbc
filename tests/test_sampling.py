"""Accept / reject samplers (docs/design.md 3.3): every backend == the reference for the same uniforms,
exact degenerate cases, robustness (NaN / zero rows, bad ids, bad uniforms), greedy verification,
determinism and row independence. Distributional tests are in test_sampling_stats.py."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels.reference import sampling as ref

from .helpers import DTYPES, backend_device, backends

ALL = lambda op: backends(op, include_reference=True)  # noqa: E731


def _probs(g, *shape, temperature=1.0, sparse=False):
    x = torch.randn(*shape, generator=g) / temperature
    if sparse:  # exact zeros, as top-k / top-p leave them
        x = x.masked_fill(torch.rand(*shape, generator=g) < 0.5, float("-inf"))
        x[..., 0] = x[..., 0].nan_to_num(neginf=0.0)
    return torch.softmax(x, -1)


def _random_tree(g, T):
    parents = torch.tensor([-1] + [int(torch.randint(0, t, (1,), generator=g)) for t in range(1, T)])
    return parents


def _chain(backend, d, q, p, u):
    dev = backend_device(backend)
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    tokens, num = tk.chain_speculative_sample(to(d), to(q), to(p), to(u), backend=backend)
    assert tokens.dtype == torch.int64 and num.dtype == torch.int32
    return tokens.cpu(), num.cpu()


def _tree(backend, tt, par, q, p, u):
    dev = backend_device(backend)
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    path, tokens, num = tk.tree_speculative_sample(to(tt), to(par), to(q), to(p), to(u), backend=backend)
    assert path.dtype == torch.int32 and tokens.dtype == torch.int64 and num.dtype == torch.int32
    return path.cpu(), tokens.cpu(), num.cpu()


def _check_chain_structure(tokens, num, V):
    B, n1 = tokens.shape
    for b in range(B):
        k = int(num[b])
        assert 0 <= k < n1
        assert ((tokens[b, : k + 1] >= 0) & (tokens[b, : k + 1] < V)).all()
        assert (tokens[b, k + 1:] == -1).all()


# ------------------------------------------------------------------ every backend == reference

@pytest.mark.parametrize("backend", backends("chain_speculative_sample"))
@given(B=st.integers(1, 3), n=st.integers(0, 5), V=st.sampled_from([1, 2, 3, 7, 33, 300]),
       deterministic=st.booleans(), temperature=st.sampled_from([0.3, 1.0, 3.0]), sparse=st.booleans(),
       corrupt=st.sampled_from(["none", "nan_row", "zero_row", "bad_ids", "bad_uniforms", "copy_draft"]),
       seed=st.integers(0, 2**31 - 1))
@example(B=2, n=3, V=1, deterministic=False, temperature=1.0, sparse=False, corrupt="none", seed=0)
@example(B=2, n=4, V=7, deterministic=True, temperature=1.0, sparse=True, corrupt="bad_ids", seed=1)
@example(B=3, n=2, V=33, deterministic=False, temperature=0.3, sparse=True, corrupt="nan_row", seed=2)
def test_chain_matches_reference(backend, B, n, V, deterministic, temperature, sparse, corrupt, seed):
    g = torch.Generator().manual_seed(seed)
    p = _probs(g, B, n + 1, V, temperature=temperature, sparse=sparse)
    q = None if deterministic else _probs(g, B, n, V, temperature=temperature, sparse=sparse)
    d = torch.randint(0, V, (B, n), generator=g)
    u = torch.rand(B, n + 1, 2, generator=g)
    if corrupt == "nan_row":
        p[0, -1] = float("nan")
        if q is not None and n:
            q[0, 0, 0] = float("nan")
    elif corrupt == "zero_row":
        p[-1, 0] = 0.0
    elif corrupt == "bad_ids" and n:
        d[0, 0] = V
        d[-1, -1] = -1 - int(d[-1, -1])
    elif corrupt == "bad_uniforms":
        u[0, 0, 1] = float("nan")
        u[-1, -1] = torch.tensor([1.0, 5.0])
        u[0, -1, 0] = -0.5
    elif corrupt == "copy_draft" and q is not None:
        p[:, :n] = q  # identical draft and target: always accepted ...
        if n:  # ... provided each draft token was drawn from q (sparse q: randint may pick q(x) = 0)
            d = torch.multinomial(q.reshape(B * n, V), 1, generator=g).reshape(B, n)
    want = ref.chain_speculative_sample(d, q, p, u)
    got = _chain(backend, d, q, p, u)
    _check_chain_structure(*got, V)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if corrupt == "copy_draft" and q is not None:
        assert (got[1] == n).all()


@pytest.mark.parametrize("backend", backends("tree_speculative_sample"))
@given(B=st.integers(1, 3), T=st.integers(1, 8), V=st.sampled_from([1, 2, 3, 5, 40]), deterministic=st.booleans(),
       sparse=st.booleans(), corrupt=st.sampled_from(["none", "nan_row", "bad_ids", "bad_parents", "copy_draft"]),
       seed=st.integers(0, 2**31 - 1))
@example(B=1, T=6, V=3, deterministic=False, sparse=False, corrupt="none", seed=3)
@example(B=2, T=7, V=2, deterministic=True, sparse=False, corrupt="none", seed=4)
def test_tree_matches_reference(backend, B, T, V, deterministic, sparse, corrupt, seed):
    g = torch.Generator().manual_seed(seed)
    par = torch.stack([_random_tree(g, T) for _ in range(B)])
    p = _probs(g, B, T, V, sparse=sparse)
    q = None if deterministic else _probs(g, B, T, V, sparse=sparse)
    tt = torch.randint(0, V, (B, T), generator=g)  # small V: duplicate siblings are common
    u = torch.rand(B, T, 2, generator=g)
    if corrupt == "nan_row":
        p[0, 0] = float("nan")
    elif corrupt == "bad_ids" and T > 1:
        tt[0, 1] = V + 3
        tt[-1, -1] = -2
    elif corrupt == "bad_parents" and T > 2:
        par[0, 2] = 2  # self-parent: unreachable
        par[-1, -1] = T + 5
    elif corrupt == "copy_draft" and q is not None:
        p = q.clone()
    want = ref.tree_speculative_sample(tt, par, q, p, u)
    got = _tree(backend, tt, par, q, p, u)
    for a, b_ in zip(got, want):
        assert torch.equal(a, b_), (a, b_)
    path, tokens, num = got
    for b in range(B):
        k = int(num[b])
        assert ((tokens[b, : k + 1] >= 0) & (tokens[b, : k + 1] < V)).all() and (tokens[b, k + 1:] == -1).all()
        assert path[b, 0] == 0 and (path[b, k + 1:] == -1).all()
        for j in range(1, k + 1):  # the path follows parent links and emits the nodes' tokens
            assert par[b, path[b, j]] == path[b, j - 1] and tokens[b, j - 1] == tt[b, path[b, j]]


@pytest.mark.parametrize("backend", ALL("tree_speculative_sample"))
def test_tree_on_a_chain_equals_chain(backend):
    """A chain-shaped tree is the chain sampler, with uniforms re-indexed by node."""
    g = torch.Generator().manual_seed(7)
    B, n, V = 16, 4, 6
    p = _probs(g, B, n + 1, V)
    q = _probs(g, B, n + 1, V)
    d = torch.randint(0, V, (B, n), generator=g)
    u = torch.rand(B, n + 1, 2, generator=g)
    for det in (False, True):
        qq = None if det else q
        want = ref.chain_speculative_sample(d, None if det else q[:, :n], p, u)
        ut = torch.stack([torch.cat([u[:, :1, 0], u[:, :n, 0]], 1), u[:, :, 1]], -1)
        par = torch.arange(-1, n)[None].expand(B, n + 1)
        tt = torch.cat([torch.zeros(B, 1, dtype=torch.long), d], 1)
        path, tokens, num = _tree(backend, tt, par, qq, p, ut)
        assert torch.equal(tokens, want[0]) and torch.equal(num, want[1])


# ------------------------------------------------------------------ exact cases

def _onehot(idx, V):
    return torch.nn.functional.one_hot(torch.as_tensor(idx), V).float()


@pytest.mark.parametrize("backend", ALL("chain_speculative_sample"))
@pytest.mark.parametrize("V", [1, 2, 8193, 151936])
def test_chain_exact_cases(backend, V):
    n = 3
    g = torch.Generator().manual_seed(V)
    x = torch.randint(0, V, (n + 1,), generator=g)
    u = torch.rand(1, n + 1, 2, generator=g)
    # one-hot target equal to the drafts: all accepted + bonus = target's token
    p = _onehot(x, V)[None]
    for q in (None, _probs(g, 1, n, V)):
        tokens, num = _chain(backend, x[None, :n], q, p, u)
        assert num.tolist() == [n] and tokens[0].tolist() == x.tolist()
    if V >= 2:
        for j in range(n):  # rejection at position j: the target's token is emitted there
            d = x[:n].clone()[None]
            d[0, j] = (x[j] + 1) % V
            for q in (None, _probs(g, 1, n, V)):
                tokens, num = _chain(backend, d, q, p, u)
                assert num.tolist() == [j] and tokens[0].tolist() == x[: j + 1].tolist() + [-1] * (n - j)
    # zero target probability: never accepted, even with coin 0 and q(x) = 0 too
    p = _probs(g, 1, n + 1, V)
    d = torch.full((1, n), V - 1)
    p[0, 0, V - 1] = 0.0
    u0 = torch.zeros(1, n + 1, 2)
    for q in (None, torch.zeros(1, n, V), _probs(g, 1, n, V)):
        tokens, num = _chain(backend, d, q, p, u0)
        assert num.tolist() == [0] and 0 <= tokens[0, 0] < V
        if V > 1:
            assert tokens[0, 0] != V - 1
    # zero draft probability with positive target probability: accepted (q(x) = 0 < p(x))
    p = _probs(g, 1, n + 1, V)
    q = _probs(g, 1, n, V)
    q[0, :, V - 1] = 0.0
    tokens, num = _chain(backend, d, q, p, torch.full((1, n + 1, 2), 0.999))
    assert num.tolist() == [n]
    # out-of-range ids: rejected, and a valid token is emitted instead
    for bad in (-1, V, 2**40, -(2**40)):
        tokens, num = _chain(backend, torch.full((1, n), bad), None, p, u)
        assert num.tolist() == [0] and 0 <= tokens[0, 0] < V and (tokens[0, 1:] == -1).all()
    # n = 0: bonus only
    tokens, num = _chain(backend, torch.zeros(1, 0, dtype=torch.long), None, p[:, :1], u[:, :1])
    assert num.tolist() == [0] and tokens.shape == (1, 1)
    assert tokens[0, 0] == ref.sample_weights(ref.clean_probs(p[:, 0]), ref.clean_probs(p[:, 0]), u[:, 0, 1])[0]
    # NaN and all-zero rows, garbage uniforms: still valid ids
    for fill in (float("nan"), 0.0, float("inf"), -1.0):
        pp = torch.full((2, n + 1, V), fill)
        uu = torch.tensor([0.5, float("nan")]).repeat(2, n + 1, 1)
        uu[1] = 1.0
        tokens, num = _chain(backend, torch.zeros(2, n, dtype=torch.long), torch.full((2, n, V), fill), pp, uu)
        _check_chain_structure(tokens, num, V)


@pytest.mark.parametrize("backend", ALL("chain_speculative_sample"))
def test_chain_residual_exact(backend):
    """The residual max(p - q, 0) (not p) is sampled on rejection: here it is a single token."""
    V = 5
    p = torch.tensor([[[0.5, 0.5, 0.0, 0.0, 0.0], [0.2] * 5]])
    q = torch.tensor([[[0.9, 0.1, 0.0, 0.0, 0.0]]])
    for u_r in (0.0, 0.3, 0.999):
        u = torch.tensor([[[0.99, u_r], [0.0, 0.0]]])  # accept 0 iff 0.99 * 0.9 < 0.5: no
        tokens, num = _chain(backend, torch.tensor([[0]]), q, p, u)
        assert num.tolist() == [0] and tokens.tolist() == [[1, -1]]  # residual = (0, 0.4, 0, 0, 0)
    # deterministic draft: p without the rejected token
    tokens, num = _chain(backend, torch.tensor([[1]]), None, p, torch.tensor([[[0.6, 0.2], [0.0, 0.0]]]))
    assert num.tolist() == [0] and tokens.tolist() == [[0, -1]]
    # inverse CDF boundary: smallest y with cum(y) > u * total
    p = torch.tensor([[[0.25, 0.25, 0.25, 0.25]]])
    for u_r, want in ((0.0, 0), (0.25, 1), (0.2499, 0), (0.5, 2), (0.75, 3), (0.99, 3)):
        tokens, _ = _chain(backend, torch.zeros(1, 0, dtype=torch.long), None, p, torch.tensor([[[0.0, u_r]]]))
        assert tokens.tolist() == [[want]], (u_r, tokens)


@pytest.mark.parametrize("backend", ALL("tree_speculative_sample"))
def test_tree_exact_cases(backend):
    V = 4
    # root with children 1 (tok 2), 2 (tok 1); child 1 has child 3 (tok 3)
    par = torch.tensor([[-1, 0, 0, 1]])
    tt = torch.tensor([[0, 2, 1, 3]])
    p = torch.stack([_onehot(1, V), _onehot(0, V), _onehot(0, V), _onehot(2, V)])[None]
    u = torch.zeros(1, 4, 2)
    for q in (None, torch.full((1, 4, V), 0.25)):
        path, tokens, num = _tree(backend, tt, par, q, p, u)  # child 1 (token 2) rejected, child 2 accepted
        assert path.tolist() == [[0, 2, -1, -1]] and tokens.tolist() == [[1, 0, -1, -1]] and num.tolist() == [1]
    p = torch.stack([_onehot(2, V), _onehot(3, V), _onehot(0, V), _onehot(1, V)])[None]
    path, tokens, num = _tree(backend, tt, par, None, p, u)  # down to the leaf, then its bonus
    assert path.tolist() == [[0, 1, 3, -1]] and tokens.tolist() == [[2, 3, 1, -1]] and num.tolist() == [2]
    # duplicate deterministic siblings: the second copy of a rejected token is rejected too
    par = torch.tensor([[-1, 0, 0, 0]])
    tt = torch.tensor([[0, 1, 1, 2]])
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0]] * 4])
    u = torch.tensor([[[0.0, 0.0], [0.7, 0.0], [0.0, 0.0], [0.9, 0.0]]])
    path, tokens, num = _tree(backend, tt, par, None, p, u)  # 1 rejected (0.7 >= 0.5); 2: 0.9 * 0.5 < 0.5
    assert path.tolist() == [[0, 3, -1, -1]] and tokens.tolist() == [[2, 1, -1, -1]]
    # T = 1: the root alone -> bonus
    path, tokens, num = _tree(backend, tt[:, :1], par[:, :1], None, p[:, :1], torch.full((1, 1, 2), 0.6))
    assert path.tolist() == [[0]] and tokens.tolist() == [[2]] and num.tolist() == [0]


@pytest.mark.parametrize("backend", ALL("tree_speculative_sample"))
def test_tree_wide_star_remembers_every_rejected_token(backend):
    """A root with T - 1 deterministic children, all rejected: the residual must exclude the token of the
    *last* one, rejected after T - 2 others. The CUDA kernel once kept the rejected tokens in shared
    memory (8 bytes each, capped at 6144 nodes, and failing to launch just below that with cub's temp
    storage); T = 6500 passes that. The Triton interpreter walks a star in O(T^2) interpreted steps, so
    it runs the same tree at T = 64 (on a GPU, Triton runs the full size)."""
    dev = backend_device(backend)
    T = 64 if (backend == "triton" and dev.type == "cpu") else 6500
    V = 8
    par = torch.zeros(1, T, dtype=torch.long)
    par[0, 0] = -1
    tt = torch.tensor([0, 1, 2, 3, 4, 6])[torch.arange(T) % 6][None].clone()  # tokens with p = 0: rejected
    tt[0, -1] = 5  # p = 0.5: rejected by its coin, 0.9 * W (1) >= 0.5
    p = torch.zeros(1, T, V)
    p[0, :, 5] = p[0, :, 7] = 0.5
    u = torch.zeros(1, T, 2)
    u[0, -1, 0] = 0.9
    u[0, 0, 1] = 0.1  # residual {7: 0.5}: 7; had 5 been forgotten, {5, 7} with u = 0.1 gives 5
    path, tokens, num = _tree(backend, tt.to(dev), par.to(dev), None, p.to(dev), u.to(dev))
    assert num.tolist() == [0] and tokens[0, :2].tolist() == [7, -1] and path[0, :2].tolist() == [0, -1]


# ------------------------------------------------------------------ greedy

@pytest.mark.parametrize("backend", ALL("chain_greedy_verify"))
@given(B=st.integers(1, 3), n=st.integers(0, 5), V=st.sampled_from([1, 2, 5, 300]), dtype=st.sampled_from(DTYPES),
       ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_chain_greedy(backend, B, n, V, dtype, ties, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, n + 1, V, generator=g)
    if ties:
        logits = logits.round()  # many exact ties
        logits[0, 0, V // 2] = float("nan")
    logits = logits.to(dtype)
    am = ref.argmax_lowest(logits)
    d = torch.where(torch.rand(B, n, generator=g) < 0.8, am[:, :n], torch.randint(-1, V + 1, (B, n), generator=g))
    dev = backend_device(backend)
    tokens, num = tk.chain_greedy_verify(d.to(dev).int(), logits.to(dev), backend=backend)
    want = ref.chain_greedy_verify(d, logits)
    assert torch.equal(tokens.cpu(), want[0]) and torch.equal(num.cpu(), want[1])
    for b in range(B):  # independent check of the rule
        k = 0
        while k < n and d[b, k] == am[b, k]:
            k += 1
        assert num[b] == k and tokens[b, k] == am[b, k]


def test_argmax_ties_lowest():
    x = torch.tensor([[1.0, 3.0, 3.0, float("nan"), 3.0], [float("nan")] * 5, [-float("inf")] * 5])
    assert ref.argmax_lowest(x).tolist() == [1, 0, 0]


@pytest.mark.parametrize("backend", ALL("tree_greedy_verify"))
@given(B=st.integers(1, 3), T=st.integers(1, 9), V=st.sampled_from([1, 2, 3, 50]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_tree_greedy(backend, B, T, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    par = torch.stack([_random_tree(g, T) for _ in range(B)])
    logits = torch.randn(B, T, V, generator=g).round().to(dtype)
    tt = torch.randint(0, V, (B, T), generator=g)
    dev = backend_device(backend)
    got = tk.tree_greedy_verify(tt.to(dev), par.to(dev), logits.to(dev), backend=backend)
    want = ref.tree_greedy_verify(tt, par, logits)
    for a, b_ in zip(got, want):
        assert torch.equal(a.cpu(), b_)


@pytest.mark.parametrize("backend", ALL("tree_greedy_verify"))
def test_tree_greedy_hand_made(backend):
    #        0
    #      / | \
    #     1  2  3        tokens 5, 7, 7 (2 and 3 duplicate: the lower index wins)
    #     |  |
    #     4  5           tokens 1, 2
    par = torch.tensor([[-1, 0, 0, 0, 1, 2]])
    tt = torch.tensor([[9, 5, 7, 7, 1, 2]])
    V = 10
    logits = torch.zeros(1, 6, V)
    logits[0, 0, 7] = 1.0   # root -> 7: node 2 (not 3)
    logits[0, 2, 2] = 1.0   # node 2 -> 2: node 5
    logits[0, 5, [4, 8]] = 1.0  # tie: bonus 4
    dev = backend_device(backend)
    path, tokens, num = tk.tree_greedy_verify(tt.to(dev), par.to(dev), logits.to(dev), backend=backend)
    assert path.tolist() == [[0, 2, 5, -1, -1, -1]] and tokens.tolist() == [[7, 2, 4, -1, -1, -1]]
    assert num.tolist() == [2]


# ------------------------------------------------------------------ determinism, row independence

@pytest.mark.parametrize("backend", ALL("chain_speculative_sample"))
def test_determinism_and_row_independence(backend):
    g = torch.Generator().manual_seed(11)
    B, n, V = 6, 3, 50
    p, q = _probs(g, B, n + 1, V), _probs(g, B, n, V)
    d = torch.randint(0, V, (B, n), generator=g)
    dev = backend_device(backend)
    run = lambda seed: tk.chain_speculative_sample(  # noqa: E731
        d.to(dev), q.to(dev), p.to(dev), generator=torch.Generator(dev).manual_seed(seed), backend=backend)
    a, b = run(5), run(5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    u = torch.rand(B, n + 1, 2, generator=g)
    full = _chain(backend, d, q, p, u)
    for rows in ([3], [5, 0], [2, 4, 1]):
        part = _chain(backend, d[rows], q[rows], p[rows], u[rows])
        assert torch.equal(part[0], full[0][rows]) and torch.equal(part[1], full[1][rows])
    tt = torch.randint(0, V, (B, 5), generator=g)
    par = torch.tensor([-1, 0, 0, 1, 1]).expand(B, 5)
    pt, qt, ut = _probs(g, B, 5, V), _probs(g, B, 5, V), torch.rand(B, 5, 2, generator=g)
    full = _tree(backend, tt, par, qt, pt, ut)
    part = _tree(backend, tt[[4, 1]], par[[4, 1]], qt[[4, 1]], pt[[4, 1]], ut[[4, 1]])
    assert all(torch.equal(x, y[[4, 1]]) for x, y in zip(part, full))


# ------------------------------------------------------------------ bad inputs

@pytest.mark.parametrize("bad, err, match", [
    (dict(draft_tokens=torch.zeros(2, 3)), TypeError, "draft_tokens must have dtype"),
    (dict(draft_tokens=torch.zeros(6, dtype=torch.long)), ValueError, "draft_tokens must have 2 dimensions"),
    (dict(target_probs=torch.rand(2, 3, 5)), ValueError, "target_probs must have shape"),
    (dict(target_probs=torch.rand(2, 4, 5).double()), TypeError, "target_probs must have dtype"),
    (dict(draft_probs=torch.rand(2, 3, 6)), ValueError, "draft_probs must have shape"),
    (dict(uniforms=torch.rand(2, 3, 2)), ValueError, "uniforms must have shape"),
    (dict(uniforms=torch.rand(2, 4, 2).half()), TypeError, "uniforms must have dtype"),
    (dict(generator=1), TypeError, "generator must be a torch.Generator"),
    (dict(target_probs=[0.5]), TypeError, "target_probs must be a torch.Tensor"),
])
def test_chain_bad_inputs(bad, err, match):
    args = dict(draft_tokens=torch.zeros(2, 3, dtype=torch.long), draft_probs=torch.rand(2, 3, 5),
                target_probs=torch.rand(2, 4, 5), uniforms=None, generator=None) | bad
    with pytest.raises(err, match=match):
        tk.chain_speculative_sample(**args)


@pytest.mark.parametrize("fn, args, err, match", [
    ("tree_speculative_sample", dict(parents=torch.zeros(2, 3, dtype=torch.long)), ValueError, "parents must have shape"),
    ("tree_speculative_sample", dict(parents=torch.zeros(2, 4)), TypeError, "parents must have dtype"),
    ("tree_speculative_sample", dict(tree_tokens=torch.zeros(2, 0, dtype=torch.long)), ValueError, "T >= 1"),
    ("tree_speculative_sample", dict(target_probs=torch.rand(2, 4, 0)), ValueError, "V >= 1"),
    ("tree_greedy_verify", dict(target_logits=torch.rand(2, 3, 5)), ValueError, "target_logits must have shape"),
    ("tree_greedy_verify", dict(target_logits=torch.zeros(2, 4, 5, dtype=torch.long)), TypeError, "target_logits must have dtype"),
    ("chain_greedy_verify", dict(target_logits=torch.rand(2, 5)), ValueError, "target_logits must have 3 dimensions"),
    ("chain_greedy_verify", dict(target_logits=torch.rand(2, 4, 0)), ValueError, "V >= 1"),
    ("tree_greedy_verify", dict(target_logits=torch.rand(2, 4, 0)), ValueError, "V >= 1"),
])
def test_tree_and_greedy_bad_inputs(fn, args, err, match):
    base = dict(tree_tokens=torch.zeros(2, 4, dtype=torch.long), parents=torch.zeros(2, 4, dtype=torch.long),
                draft_probs=None, target_probs=torch.rand(2, 4, 5), target_logits=torch.rand(2, 4, 5),
                draft_tokens=torch.zeros(2, 3, dtype=torch.long))
    base |= args
    f = getattr(tk, fn)
    names = f.__code__.co_varnames[: f.__code__.co_argcount]
    with pytest.raises(err, match=match):
        f(**{k: v for k, v in base.items() if k in names})


@pytest.mark.parametrize("backend", ALL("chain_speculative_sample"))
def test_custom_ops_opcheck(backend):
    """Schemas and fake implementations of the four sampler ops, on every backend's device."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(0)
    p, q, u = _probs(g, 2, 4, 9), _probs(g, 2, 3, 9), torch.rand(2, 4, 2, generator=g)
    d = torch.randint(0, 9, (2, 3), generator=g)
    p, q, u, d = (t.to(dev) for t in (p, q, u, d))
    tt, par = torch.cat([d[:, :1], d], 1), torch.tensor([[-1, 0, 0, 1]] * 2, device=dev)
    from triforce_kernels.chain_sample import _chain_greedy_op, _chain_sample_op
    from triforce_kernels.tree_sample import _tree_greedy_op, _tree_sample_op
    torch.library.opcheck(_chain_sample_op, (d, q, p, u, backend))
    torch.library.opcheck(_tree_sample_op, (tt, par, None, p, u, backend))
    torch.library.opcheck(_chain_greedy_op, (d, p, backend))
    torch.library.opcheck(_tree_greedy_op, (tt, par, p, backend))


# ------------------------------------------------------------------ logits_to_probs

def _naive_probs(row, temperature, top_k, top_p):
    """Per-token definition in float64: top-k keeps logits >= the k-th largest; top-p keeps x iff the
    mass of strictly more probable tokens is < top_p."""
    x = row.double()
    x = torch.where(x.isnan(), float("-inf"), x)  # NaN counts as -inf
    if top_k is not None:
        kth = sorted(x.tolist(), reverse=True)[min(top_k, len(x)) - 1]
        x = torch.where(x >= kth, x, torch.tensor(float("-inf"), dtype=x.dtype))
    if (x == float("inf")).any():  # the limit: the +inf logits share the mass
        p = (x == float("inf")).double()
        p = p / p.sum()
    else:  # float64: float32 logits over the tested temperatures do not overflow here
        p = torch.softmax(x / temperature, -1)
    if top_p is not None:
        keep = torch.tensor([p[p > p[i]].sum() < top_p for i in range(len(p))])
        p = torch.where(keep, p, torch.zeros_like(p))
        p = p / p.sum()
    return p


@given(V=st.integers(1, 40), temperature=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
       top_k=st.sampled_from([None, 1, 3, 50]), top_p=st.sampled_from([None, 0.3, 0.9, 1.0]),
       dtype=st.sampled_from(DTYPES), ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_logits_to_probs(V, temperature, top_k, top_p, dtype, ties, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, V, generator=g) * 3
    if ties:
        logits = logits.round()
    logits = logits.to(dtype)
    out = tk.logits_to_probs(logits, temperature, top_k, top_p)
    assert out.dtype == torch.float32 and out.shape == logits.shape
    for r in range(3):
        if temperature == 0:
            want = torch.nn.functional.one_hot(ref.argmax_lowest(logits[r]), V).double()
        else:
            want = _naive_probs(logits[r].float(), temperature, top_k, top_p)
        torch.testing.assert_close(out[r].double(), want, rtol=1e-5, atol=1e-6)


SPECIAL = [float("nan"), float("inf"), float("-inf"), 3e38, -3e38, 1e30, 0.0, 1.0, -2.5, 7.0]


@given(V=st.integers(1, 12), temperature=st.sampled_from([1e-30, 1e-6, 0.7, 1.0, 1e30]),
       top_k=st.sampled_from([None, 1, 2, 5]), top_p=st.sampled_from([None, 0.5, 1.0]),
       dtype=st.sampled_from(DTYPES), data=st.data())
def test_logits_to_probs_special_values(V, temperature, top_k, top_p, dtype, data):
    """NaN counts as -inf, +inf logits share the mass, and no finite logit or positive temperature
    overflows into NaN: the result is the float64 definition. A row with nothing above -inf is NaN."""
    rows = data.draw(st.lists(st.lists(st.sampled_from(SPECIAL), min_size=V, max_size=V), min_size=1, max_size=3),
                     label="rows")
    logits = torch.tensor(rows, dtype=torch.float32).to(dtype)
    out = tk.logits_to_probs(logits, temperature, top_k, top_p)
    for r in range(len(rows)):
        x = logits[r].float()
        if not (x > float("-inf")).any():  # NaN compares false
            assert out[r].isnan().all()
            continue
        want = _naive_probs(x, temperature, top_k, top_p)
        torch.testing.assert_close(out[r].double(), want, rtol=1e-5, atol=1e-6)


def test_logits_to_probs_special_values_exact_cases():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[inf, 0.0, 1.0, inf, -inf, nan],          # two +inf: half each
                      [nan, 0.0, 1.0, 2.0, nan, 5.0],           # NaN weighs 0, the rest is a softmax
                      [3e38, -3e38, 0.0, 0.0, 0.0, 0.0],        # x / 0.7 would overflow
                      [nan, -inf, nan, -inf, -inf, -inf]])      # nothing above -inf
    out = tk.logits_to_probs(x, 0.7)
    assert out[0].tolist() == [0.5, 0.0, 0.0, 0.5, 0.0, 0.0]
    want = torch.softmax(torch.tensor([0.0, 1.0, 2.0, 5.0]) / 0.7, -1)
    torch.testing.assert_close(out[1, [1, 2, 3, 5]], want)
    assert out[1, [0, 4]].tolist() == [0.0, 0.0]
    assert out[2].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert out[3].isnan().all()
    # a tiny temperature is greedy, not NaN; top-k never keeps a NaN
    torch.testing.assert_close(tk.logits_to_probs(x[1:3], 1e-30), tk.logits_to_probs(x[1:3], 0.0))
    assert tk.logits_to_probs(x[1:2], 1.0, top_k=1).tolist() == [[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]


def test_logits_to_probs_bad_inputs():
    x = torch.randn(2, 5)
    for kw, err in ((dict(temperature=-1.0), ValueError), (dict(temperature=float("inf")), ValueError),
                    (dict(temperature=float("nan")), ValueError), (dict(top_k=0), ValueError),
                    (dict(top_p=0.0), ValueError), (dict(top_p=1.5), ValueError), (dict(top_k=2.0), TypeError), (dict(temperature="1"), TypeError)):
        with pytest.raises(err):
            tk.logits_to_probs(x, **kw)
    with pytest.raises(TypeError, match="logits must have dtype"):
        tk.logits_to_probs(torch.zeros(2, 5, dtype=torch.long))
