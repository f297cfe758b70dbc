"""tk.verify_attention with a sliding window (``window=W``): each query sees the last W of the keys it
would see. Every backend against the float64 reference, the reference against a direct statement of
sliding-window attention, a pass against its one-token steps (bitwise, cpu and triton), values outside a
window never read, bad windows, and the custom op's registration."""
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels._backend import implementation
from triforce_kernels.reference.verify_attention import visibility

from .helpers import DTYPES, backend_device, backends
from .test_tree_mask import random_parents
from .test_verify_attention import (assert_one_thread_gives_the_bits, assert_rows_are_their_steps,
                                    check_against_reference, make_inputs)

WINDOWS = [1, 2, 3, 5, 16, 31, 32, 33, 64, 100, 513, 2**31 - 1]


def _to(dev):
    return lambda x: None if x is None else x.to(dev)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(B=st.integers(1, 3), Hkv=st.sampled_from([1, 2]), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       data=st.data(), slack=st.integers(0, 3), dtype=st.sampled_from(DTYPES),
       mask_kind=st.sampled_from(["causal", "tree", "random"]), window=st.sampled_from(WINDOWS),
       num_splits=st.sampled_from([None, None, 1, 3]), seed=st.integers(0, 2**31 - 1))
@example(B=1, Hkv=1, g=3, D=64, data=None, slack=0, dtype=torch.float32, mask_kind="causal", window=4, num_splits=None,
         seed=0).via("the window shorter than the pass")
def test_matches_reference(backend, B, Hkv, g, D, data, slack, dtype, mask_kind, window, num_splits, seed):
    interpreted = backend == "triton" and not torch.cuda.is_available()
    if data is None:
        T, prefixes = 9, [40] * B
    else:
        T = data.draw(st.integers(1, 12 if interpreted else 40), label="T")
        prefixes = data.draw(st.lists(st.sampled_from([0, 1, 17, 31, 33, 70, 130] + ([] if interpreted else [600])),
                                      min_size=B, max_size=B), label="prefixes")
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, prefixes, slack, dtype, seed, dev, mask_kind)
    if num_splits is None:  # the public op
        out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, backend=backend)
    else:
        impl = implementation("verify_attention", backend)
        out, lse = impl(q, k, v, L, mask, 1.0 / math.sqrt(D), num_splits=num_splits, window=window)
    check_against_reference(out, lse, q, k, v, L, mask, window=window)


@settings(deadline=None)
@given(T=st.integers(1, 8), N=st.integers(8, 40), window=st.integers(1, 45), tree=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_reference_window_is_sliding_window_attention(T, N, window, tree, seed):
    """The reference's window, against its statement: a causal query at position p sees positions
    p - W + 1 .. p (``q_pos - k_pos < W``, transformers' sliding-window mask); a tree node sees the same
    keys as the one-token step at its depth over its committed path."""
    L = torch.tensor([N], dtype=torch.int32)
    if not tree:
        vis = visibility(L, T, N, None, window)[0]
        p = torch.arange(N - T, N)[:, None]
        n = torch.arange(N)[None, :]
        assert torch.equal(vis, (n <= p) & (p - n < window))
        return
    parents = random_parents(1, T, seed)
    vis = visibility(L, T, N, tk.tree_attention_mask(parents), window)[0]
    depth = tk.tree_depths(parents)[0]
    for t in range(T):
        path = [t]
        while parents[0, path[-1]] >= 0:
            path.append(int(parents[0, path[-1]]))
        p = N - T + int(depth[t])  # its position once committed
        keys = [n for n in range(N - T) if p - n < window]
        keys += [N - T + s for s in path[::-1] if int(depth[t]) - int(depth[s]) < window]
        assert vis[t].nonzero().flatten().tolist() == sorted(keys)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(T=st.integers(1, 10), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       prefix=st.sampled_from([5, 31, 32, 100, 520, 1100]), window=st.sampled_from([1, 3, 8, 33, 64, 300, 600]),
       dtype=st.sampled_from(DTYPES), tree=st.booleans(), interleaved=st.booleans(), seed=st.integers(0, 2**31 - 1))
@example(T=5, g=3, D=64, prefix=1100, window=600, dtype=torch.float32, tree=False, interleaved=True, seed=0)
@example(T=9, g=3, D=64, prefix=520, window=3, dtype=torch.bfloat16, tree=True, interleaved=True, seed=1)
def test_a_pass_gives_the_bits_of_one_token_steps(backend, T, g, D, prefix, window, dtype, tree, interleaved, seed):
    """Row t of a windowed pass is bitwise the windowed one-token step at its position over the cache with
    t's path committed: the window's start is a rank, the same in both (cpu; triton in the interpreter and
    on a GPU), so speculative decoding keeps a sliding-window model's autoregressive bits."""
    interpreted = backend == "triton" and not torch.cuda.is_available()
    if interpreted:
        prefix = min(prefix, 140)
    dev = backend_device(backend)
    B, Hkv = 2, 2
    q, k, v, L, _ = make_inputs(B, T, Hkv * g, Hkv, D, [prefix + 3 * b for b in range(B)], 2, dtype, seed,
                                torch.device("cpu"))
    if not interleaved:
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
    parents = random_parents(B, T, seed) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    to = _to(dev)
    out, lse = tk.verify_attention(to(q), to(k), to(v), to(L), to(mask), return_lse=True, window=window,
                                   backend=backend)
    if backend == "cpu":
        assert_one_thread_gives_the_bits(q, k, v, L, mask, out, lse, window=window)
    assert_rows_are_their_steps(q, k, v, L, parents, out, lse, backend, to, window=window)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("mask_kind", ["causal", "tree"])
@pytest.mark.parametrize("window", [1, 4, 40])
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_keys_outside_the_window_never_reach_the_output(backend, poison, mask_kind, window):
    """inf/NaN keys and values at prefix positions before a query's window (some inside a tile that
    other rows' windows reach) never change its output: every row as with finite values there."""
    dev = backend_device(backend)
    B, T = 2, 6
    q, k, v, L, mask = make_inputs(B, T, 4, 2, 16, [70, 45], 2, torch.float32, window, dev, mask_kind)
    want, want_lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, backend=backend)
    vis = visibility(L.cpu(), T, k.shape[1], None if mask is None else mask.cpu(), window)  # [B, T, N]
    unseen = ~vis.any(1)  # [B, N]: positions no query of the row sees
    unseen &= torch.arange(k.shape[1])[None, :] < (L.cpu()[:, None] - T)  # in the prefix
    assert unseen.sum() > 0
    k2, v2 = k.clone(), v.clone()
    k2[unseen.to(dev)] = poison
    v2[unseen.to(dev)] = poison
    out, lse = tk.verify_attention(q, k2, v2, L, mask, return_lse=True, window=window, backend=backend)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    # one query's window starts after another's: a poisoned value the first sees makes only its row NaN
    if window == 4 and mask_kind == "causal":
        v3 = v.clone()
        p = int(L[0]) - T - 2  # seen by queries 0 and 1 (their windows end at L - T and L - T + 1) only
        v3[0, p] = poison
        out3 = tk.verify_attention(q, k, v3, L, mask, window=window, backend=backend)
        bad = ~torch.isfinite(out3[0]).all(-1).all(-1)  # [T]
        assert bad.tolist() == [True, True, False, False, False, False]
        assert torch.equal(out3[1], want[1]) and torch.equal(out3[0, 2:], want[0, 2:])


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_a_window_at_least_the_cache_changes_nothing(backend):
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 5, 4, 2, 16, [33, 8], 2, torch.float32, 3, dev, "tree")
    want = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend=backend)
    for window in (k.shape[1], 10 ** 6):
        got = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, backend=backend)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_trusted_entry_and_opcheck(backend, monkeypatch):
    """The model layer's entry (verify_attention_trusted) gives the public op's bits with a window; the
    custom op with its window argument passes opcheck."""
    from triforce_kernels.verify_attention import _verify_attention_op, verify_attention_trusted

    monkeypatch.setenv("TRIFORCE_BACKEND", backend)
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 6, 2, 16, [40, 9], 1, torch.float32, 5, dev, "tree")
    for m in (None, mask):
        want = tk.verify_attention(q, k, v, L, m, window=7, backend=backend)
        torch.testing.assert_close(verify_attention_trusted(q, k, v, L, m, 7), want, rtol=0, atol=0)
    torch.library.opcheck(_verify_attention_op, (q, k, v, L, mask, 0.25, backend, 7),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("window, err, match", [
    (0, ValueError, "window must be in"), (-3, ValueError, "window must be in"),
    (2**31, ValueError, "window must be in"),
    (True, TypeError, "window must be a positive int"), (2.0, TypeError, "window must be a positive int"),
])
def test_bad_windows(window, err, match):
    q, k, v, L, _ = make_inputs(1, 2, 2, 1, 16, [4], 0, torch.float32, 0, torch.device("cpu"))
    with pytest.raises(err, match=match):
        tk.verify_attention(q, k, v, L, window=window)


def test_compiled_graph_with_a_window():
    """``torch.compile(fullgraph=True)`` over the public op with a window: the same result as eager."""
    q, k, v, L, mask = make_inputs(1, 3, 4, 2, 16, [20], 0, torch.float32, 2, torch.device("cpu"), "tree")
    f = lambda q, k, v, L, m: tk.verify_attention(q, k, v, L, m, window=5)
    want = f(q, k, v, L, mask)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(q, k, v, L, mask)
    assert torch.equal(got, want)
