"""tk.verify_attention with left padding (``cache_leftpad``): row b's prefix starts at ``cache_leftpad[b]``.
Every backend against the float64 reference (with and without a sliding window, causal, tree and arbitrary
masks, split prefixes), the reference against its statement (the row's cache cut at its start), a pass against
its one-token steps (bitwise), keys below the start never read, bad values, and the custom op's registration."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels._backend import implementation
from triforce_kernels.reference.verify_attention import visibility

from .helpers import DTYPES, backend_device, backends
from .test_tree_mask import random_parents
from .test_verify_attention import _committed, assert_one_thread_gives_the_bits, check_against_reference, make_inputs
from .test_verify_attention_window import WINDOWS, _to


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(B=st.integers(1, 3), Hkv=st.sampled_from([1, 2]), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       data=st.data(), slack=st.integers(0, 3), dtype=st.sampled_from(DTYPES),
       mask_kind=st.sampled_from(["causal", "tree", "random"]), window=st.sampled_from([None, None] + WINDOWS),
       num_splits=st.sampled_from([None, None, 1, 3]), softcap=st.sampled_from([None, None, 30.0]),
       seed=st.integers(0, 2**31 - 1))
def test_matches_reference(backend, B, Hkv, g, D, data, slack, dtype, mask_kind, window, num_splits, softcap, seed):
    """With a window and Gemma 2's soft cap too (a windowed soft-capped model's StreamingLLM cache)."""
    interpreted = backend == "triton" and not torch.cuda.is_available()
    T = data.draw(st.integers(1, 12 if interpreted else 40), label="T")
    prefixes = data.draw(st.lists(st.sampled_from([0, 1, 17, 31, 33, 70, 130] + ([] if interpreted else [600])),
                                  min_size=B, max_size=B), label="prefixes")
    # each row's start anywhere in its prefix: at a tile's edge, inside one, at its end
    starts = [data.draw(st.one_of(st.sampled_from(sorted({0, p // 2, p})), st.integers(0, p)), label="start")
              for p in prefixes]
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, prefixes, slack, dtype, seed, dev, mask_kind)
    lp = torch.tensor(starts, dtype=torch.int32, device=dev)
    if num_splits is None:  # the public op
        out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, cache_leftpad=lp,
                                       softcap=softcap, backend=backend)
    else:
        impl = implementation("verify_attention", backend)
        out, lse = impl(q, k, v, L, mask, 1.0 / math.sqrt(D), num_splits=num_splits, window=window, cache_leftpad=lp,
                        softcap=softcap)
    check_against_reference(out, lse, q, k, v, L, mask, window=window, softcap=softcap, cache_leftpad=lp)


@settings(deadline=None)
@given(T=st.integers(1, 8), prefix=st.integers(0, 40), data=st.data(), window=st.one_of(st.none(), st.integers(1, 45)),
       tree=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_reference_leftpad_is_the_cache_cut_at_its_start(T, prefix, data, window, tree, seed):
    """The reference's statement: with a start s, a row sees what the cache cut at s (positions s .. L-1,
    length L - s) shows, at the same positions, window included; nothing below s."""
    s = data.draw(st.integers(0, prefix), label="start")
    N = prefix + T
    L = torch.tensor([N], dtype=torch.int32)
    mask = tk.tree_attention_mask(random_parents(1, T, seed)) if tree else None
    vis = visibility(L, T, N, mask, window, torch.tensor([s], dtype=torch.int32))[0]
    cut = visibility(L - s, T, N - s, mask, window)[0]
    assert not vis[:, :s].any()
    assert torch.equal(vis[:, s:], cut)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(T=st.integers(1, 10), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       prefix=st.sampled_from([5, 31, 32, 100, 520, 1100]), window=st.sampled_from([None, 1, 3, 8, 33, 300]),
       dtype=st.sampled_from(DTYPES), tree=st.booleans(), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_a_pass_gives_the_bits_of_one_token_steps(backend, T, g, D, prefix, window, dtype, tree, data, seed):
    """Row t of a left-padded pass is bitwise the one-token step at its position with the same start, over the
    cache with t's path committed (cpu; triton in the interpreter and on a GPU)."""
    if backend == "triton" and not torch.cuda.is_available():  # (the interpreter: a few seconds a call)
        prefix, T = min(prefix, 140), min(T, 5)
    dev = backend_device(backend)
    B, Hkv = 2, 2
    prefixes = [prefix + 3 * b for b in range(B)]
    q, k, v, L, _ = make_inputs(B, T, Hkv * g, Hkv, D, prefixes, 2, dtype, seed, torch.device("cpu"))
    lp = torch.tensor([data.draw(st.integers(0, p), label="start") for p in prefixes], dtype=torch.int32)
    parents = random_parents(B, T, seed) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    to = _to(dev)
    out, lse = tk.verify_attention(to(q), to(k), to(v), to(L), to(mask), return_lse=True, window=window,
                                   cache_leftpad=to(lp), backend=backend)
    if backend == "cpu":
        assert_one_thread_gives_the_bits(q, k, v, L, mask, out, lse, window=window, cache_leftpad=lp)
    for b in range(B):
        for t in range(T):
            kb, vb, Lb = _committed(k, v, L, T, parents, b, t)
            o1, l1 = tk.verify_attention(to(q[b:b + 1, t:t + 1]), to(kb), to(vb), to(Lb), return_lse=True,
                                         window=window, cache_leftpad=to(lp[b:b + 1]), backend=backend)
            assert torch.equal(o1[0, 0], out[b, t]), f"row {t} of batch {b} differs from its one-token step"
            assert torch.equal(l1[0, :, 0], lse[b, :, t])


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("mask_kind", ["causal", "tree"])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_keys_below_the_start_never_reach_the_output(backend, poison, mask_kind, window):
    """inf/NaN keys and values below a row's start (some inside a tile the row reads from its start on) never
    change its output; a start of 0 is no start, bitwise; a start moves the output."""
    dev = backend_device(backend)
    B, T = 3, 5
    q, k, v, L, mask = make_inputs(B, T, 4, 2, 16, [40, 25, 9], 2, torch.float32, 7, dev, mask_kind)
    lp = torch.tensor([21, 13, 0], dtype=torch.int32, device=dev)
    want = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, cache_leftpad=lp, backend=backend)
    k2, v2 = k.clone(), v.clone()
    for b, s in enumerate(lp.tolist()):
        k2[b, :s] = poison
        v2[b, :s] = poison
    got = tk.verify_attention(q, k2, v2, L, mask, return_lse=True, window=window, cache_leftpad=lp, backend=backend)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    plain = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, backend=backend)
    zero = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window,
                               cache_leftpad=torch.zeros_like(lp), backend=backend)
    assert torch.equal(zero[0], plain[0]) and torch.equal(zero[1], plain[1])
    assert torch.equal(want[0][2], plain[0][2])  # row 2 starts at 0
    if window is None:  # (a window of 6 starts past both starts: nothing to move)
        assert not torch.equal(want[0][0], plain[0][0]) and not torch.equal(want[0][1], plain[0][1])


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_a_start_at_the_prefix_end_leaves_the_new_tokens(backend):
    """A start at L - T hides the whole prefix: each query sees its new tokens only (as with an empty prefix)."""
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 4, 2, 16, [30, 12], 0, torch.float32, 3, dev, "tree")
    lp = (L - 4).to(torch.int32)
    got = tk.verify_attention(q, k, v, L, mask, return_lse=True, cache_leftpad=lp, backend=backend)
    for b in range(2):
        s = int(lp[b])
        one = tk.verify_attention(q[b:b + 1], k[b:b + 1, s:], v[b:b + 1, s:], L[b:b + 1] - s, mask[b:b + 1],
                                  return_lse=True, backend=backend)
        torch.testing.assert_close(got[0][b:b + 1], one[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[1][b:b + 1], one[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("leftpad, err, match", [
    ([-1], ValueError, r"cache_leftpad must be in \[0, cache_seqlens - T\]"),
    ([5], ValueError, r"cache_leftpad must be in \[0, cache_seqlens - T\]"),  # L - T = 4
    ([1, 1], ValueError, "cache_leftpad"),
    ("int64", TypeError, "cache_leftpad"),
])
def test_bad_leftpads(leftpad, err, match):
    q, k, v, L, _ = make_inputs(1, 2, 2, 1, 16, [4], 0, torch.float32, 0, torch.device("cpu"))
    lp = torch.tensor([1], dtype=torch.int64) if leftpad == "int64" else torch.tensor(leftpad, dtype=torch.int32)
    with pytest.raises((err, ValueError), match=match):
        tk.verify_attention(q, k, v, L, cache_leftpad=lp)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_trusted_entry_and_opcheck(backend, monkeypatch):
    """The model layer's entry (verify_attention_trusted) gives the public op's bits with a start; the custom op
    with its cache_leftpad argument passes opcheck; ``torch.compile(fullgraph=True)`` gives eager's result."""
    from triforce_kernels.verify_attention import _verify_attention_op, verify_attention_trusted

    monkeypatch.setenv("TRIFORCE_BACKEND", backend)
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 6, 2, 16, [40, 9], 1, torch.float32, 5, dev, "tree")
    lp = torch.tensor([11, 3], dtype=torch.int32, device=dev)
    for m in (None, mask):
        for w in (None, 7):
            want = tk.verify_attention(q, k, v, L, m, window=w, cache_leftpad=lp, backend=backend)
            got = verify_attention_trusted(q, k, v, L, m, w or 0, cache_leftpad=lp)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.library.opcheck(_verify_attention_op, (q, k, v, L, mask, 0.25, backend, 7, 0.0, lp),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    f = lambda q, k, v, L, m, lp: tk.verify_attention(q, k, v, L, m, window=5, cache_leftpad=lp, backend=backend)
    want = f(q, k, v, L, mask, lp)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(q, k, v, L, mask, lp)
    assert torch.equal(got, want)
