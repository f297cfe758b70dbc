"""tk.verify_attention with ALiBi (``alibi_slopes``: query head h adds ``-slope[h] * d`` to the score of a key it sees,
d = the positions it sees after that key; BLOOM's, MPT's and Falcon-RW's positions): the reference against its
statement (a dense float64 attention with the bias ``slope * (k_pos - q_pos)``, as BLOOM and MPT write it, over the
committed cache of each node), every backend against the float64 reference (with a window, a soft cap, left padding,
causal / tree / arbitrary masks, split prefixes, per-row slopes), a pass with the bits of its one-token steps (cpu,
triton), zero slopes bitwise no bias, bad slopes, the custom op's registration."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce.models.config import alibi_slopes
from triforce_kernels._backend import implementation
from triforce_kernels.reference.verify_attention import verify_attention as reference

from .helpers import DTYPES, backend_device, backends
from .test_tree_mask import random_parents
from .test_verify_attention import _committed, assert_rows_are_their_steps, check_against_reference, make_inputs
from .test_verify_attention_window import WINDOWS


def bloom_slopes(heads: int) -> torch.Tensor:
    """ALiBi's geometric slopes for ``heads`` heads, as BLOOM builds them (the model layer's)."""
    return torch.tensor(alibi_slopes("bloom", heads), dtype=torch.float32)


def draw_slopes(data, B, Hq, dev):
    """ALiBi's slopes for Hq heads, or random ones (negative and zero included), shared or per row."""
    kind = data.draw(st.sampled_from(["alibi", "random", "per_row"]), label="slopes")
    if kind == "alibi":
        return bloom_slopes(Hq).to(dev)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="slope_seed"))
    shape = (B, Hq) if kind == "per_row" else (Hq,)
    return ((torch.rand(shape, generator=g) - 0.25) * 2).to(dev)


def dense_alibi(q, k, v, L, slopes, parents=None):
    """float64 attention of row b's queries over its cache with the bias ``slope * (k_pos - q_pos)`` written out
    (BLOOM's and MPT's form, softmax-shifted), a tree node over its committed cache (its ancestors moved to
    consecutive positions: ``_committed``) at its committed position."""
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    out = torch.zeros(B, T, Hq, D, dtype=torch.float64)
    parents = torch.arange(-1, T - 1).expand(B, T) if parents is None else parents
    for b in range(B):
        for t in range(T):
            kb, vb, Lb = _committed(k, v, L, T, parents, b, t)
            n = int(Lb)
            qpos = n - 1
            kk = kb[0, :n].double().repeat_interleave(Hq // Hkv, dim=1)  # [n, Hq, D]
            vv = vb[0, :n].double().repeat_interleave(Hq // Hkv, dim=1)
            s = torch.einsum("hd,nhd->hn", q[b, t].double(), kk) / math.sqrt(D)
            sl = (slopes[b] if slopes.ndim == 2 else slopes).double()
            s = s + sl[:, None] * (torch.arange(n) - qpos).double()[None, :]
            out[b, t] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), vv)
    return out


@settings(deadline=None)
@given(B=st.integers(1, 2), T=st.integers(1, 7), g=st.sampled_from([1, 3]), prefix=st.integers(0, 30),
       tree=st.booleans(), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_reference_is_the_bias_written_out(B, T, g, prefix, tree, data, seed):
    """The reference's statement: BLOOM's bias over the committed cache of each query (a causal query's cache
    as it is; a tree node's with its ancestors at the positions they take once committed)."""
    q, k, v, L, _ = make_inputs(B, T, 2 * g, 2, 16, [prefix] * B, 0, torch.float64, seed, torch.device("cpu"))
    parents = random_parents(B, T, seed) if tree else None
    mask = tk.tree_attention_mask(parents) if tree else None
    slopes = draw_slopes(data, B, 2 * g, torch.device("cpu"))
    got = reference(q, k, v, L, mask, alibi_slopes=slopes)
    torch.testing.assert_close(got, dense_alibi(q, k, v, L, slopes, parents).to(got.dtype), rtol=1e-10, atol=1e-10)


def test_reference_bias_does_not_move_with_left_padding():
    """A row's distances count the positions it sees: left padding cuts keys off, the rest keep their bias (the
    padded row equals the unpadded cache cut at its start)."""
    q, k, v, L, mask = make_inputs(1, 3, 4, 2, 16, [20], 0, torch.float64, 3, torch.device("cpu"), "tree")
    slopes = bloom_slopes(4).double().float()
    padded = reference(q, k, v, L, mask, cache_leftpad=torch.tensor([7], dtype=torch.int32), alibi_slopes=slopes)
    cut = reference(q, k[:, 7:], v[:, 7:], L - 7, mask, alibi_slopes=slopes)
    torch.testing.assert_close(padded, cut, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(B=st.integers(1, 3), Hkv=st.sampled_from([1, 2]), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       data=st.data(), slack=st.integers(0, 3), dtype=st.sampled_from(DTYPES),
       mask_kind=st.sampled_from(["causal", "tree", "random"]), window=st.sampled_from([None, None] + WINDOWS),
       num_splits=st.sampled_from([None, None, 1, 3]), softcap=st.sampled_from([None, None, 30.0]),
       leftpad=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_matches_reference(backend, B, Hkv, g, D, data, slack, dtype, mask_kind, window, num_splits, softcap, leftpad,
                           seed):
    interpreted = backend == "triton" and not torch.cuda.is_available()
    T = data.draw(st.integers(1, 12 if interpreted else 40), label="T")
    prefixes = data.draw(st.lists(st.sampled_from([0, 1, 17, 31, 33, 70, 130] + ([] if interpreted else [600])),
                                  min_size=B, max_size=B), label="prefixes")
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, prefixes, slack, dtype, seed, dev, mask_kind)
    lp = (torch.tensor([data.draw(st.integers(0, p), label="start") for p in prefixes], dtype=torch.int32, device=dev)
          if leftpad else None)
    slopes = draw_slopes(data, B, g * Hkv, dev)
    kw = dict(window=window, softcap=softcap, cache_leftpad=lp, alibi_slopes=slopes)
    if num_splits is None:  # the public op
        out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend=backend, **kw)
    else:
        impl = implementation("verify_attention", backend)
        out, lse = impl(q, k, v, L, mask, 1.0 / math.sqrt(D), num_splits=num_splits, **kw)
    check_against_reference(out, lse, q, k, v, L, mask, **kw)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(T=st.integers(1, 9), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       prefix=st.sampled_from([5, 33, 130, 600]), window=st.sampled_from([None, 6]),
       softcap=st.sampled_from([None, 20.0]), dtype=st.sampled_from(DTYPES), tree=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_a_pass_gives_the_bits_of_one_token_steps(backend, T, g, D, prefix, window, softcap, dtype, tree, seed):
    """Row t of a pass is bitwise the one-token step at its committed position over the committed cache: a
    key's bias follows its distance in the query's ranks, the same in both."""
    if backend == "triton" and not torch.cuda.is_available():
        prefix = min(prefix, 130)
    dev = backend_device(backend)
    B, Hkv = 2, 2
    q, k, v, L, _ = make_inputs(B, T, Hkv * g, Hkv, D, [prefix + 3 * b for b in range(B)], 2, dtype, seed,
                                torch.device("cpu"))
    parents = random_parents(B, T, seed) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    slopes = bloom_slopes(Hkv * g).to(dev)
    to = lambda x: None if x is None else x.to(dev)  # noqa: E731
    kw = dict(window=window, softcap=softcap, alibi_slopes=slopes)
    out, lse = tk.verify_attention(to(q), to(k), to(v), to(L), to(mask), return_lse=True, backend=backend, **kw)
    assert_rows_are_their_steps(q, k, v, L, parents, out, lse, backend, to, **kw)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_zero_slopes_are_no_bias_and_slopes_move_the_output(backend):
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 4, 2, 16, [40, 9], 1, torch.float32, 1, dev, "tree")
    plain, plain_lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend=backend)
    zero, zero_lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, alibi_slopes=torch.zeros(4, device=dev),
                                         backend=backend)
    assert torch.equal(zero, plain) and torch.equal(zero_lse, plain_lse)
    biased = tk.verify_attention(q, k, v, L, mask, alibi_slopes=bloom_slopes(4).to(dev), backend=backend)
    assert (biased - plain).abs().max() > 0.05
    # a steep slope leaves a query its own key alone (the root of the tree: its nearest)
    steep = tk.verify_attention(q, k, v, L, mask, alibi_slopes=torch.full((4,), 50.0, device=dev), backend=backend)
    own = v[torch.arange(2), L.long() - 4].repeat_interleave(2, dim=1)  # the root's value, per query head
    torch.testing.assert_close(steep[:, 0], own, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_trusted_entry_and_opcheck(backend, monkeypatch):
    from triforce_kernels.verify_attention import _verify_attention_op, verify_attention_trusted

    monkeypatch.setenv("TRIFORCE_BACKEND", backend)
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 6, 2, 16, [40, 9], 1, torch.float32, 5, dev, "tree")
    slopes = bloom_slopes(6).to(dev)
    want = tk.verify_attention(q, k, v, L, mask, window=7, softcap=3.0, alibi_slopes=slopes, backend=backend)
    got = verify_attention_trusted(q, k, v, L, mask, 7, None, 3.0, alibi_slopes=slopes)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    per_row = torch.stack([slopes, slopes.flip(0)])
    torch.library.opcheck(_verify_attention_op, (q, k, v, L, mask, 0.25, backend, 7, 3.0, None, per_row),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("slopes, err, match", [
    (torch.ones(3), ValueError, r"shape \[4\]"),
    (torch.ones(2, 3), ValueError, r"shape \[1, 4\]"),
    (torch.ones(1, 1, 4), ValueError, "dimensions"),
    (torch.ones(4, dtype=torch.float64), TypeError, "dtype"),
    (torch.tensor([1.0, math.nan, 0.0, 0.0]), ValueError, "finite"),
    (torch.tensor([1.0, 0.0, -math.inf, 0.0]), ValueError, "finite"),
    ([0.5] * 4, TypeError, "tensor"),
])
def test_bad_slopes(slopes, err, match):
    q, k, v, L, _ = make_inputs(1, 2, 4, 2, 16, [4], 0, torch.float32, 0, torch.device("cpu"))
    with pytest.raises(err, match=match):
        tk.verify_attention(q, k, v, L, alibi_slopes=slopes)
