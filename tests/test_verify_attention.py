"""tk.verify_attention: every backend against the float64 reference, the tree oracle, masking edge
cases, NaN-poisoned cache tails, clamping of bad lengths, and bad inputs."""
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels._backend import implementation
from triforce_kernels.reference.verify_attention import _verify_attention as reference

from .helpers import DTYPES, assert_close_measured, backend_device, backends
from .test_tree_mask import random_parents

PREFIXES = [0, 1, 15, 16, 17]


def make_inputs(B, T, Hq, Hkv, D, prefixes, slack, dtype, seed, device, mask_kind="causal"):
    """Caches of ``N = max(prefix) + T + slack`` positions; everything at positions >= L is NaN."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([p + T for p in prefixes], dtype=torch.int32)
    N = int(lengths.max()) + slack
    q = torch.randn(B, T, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, N, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, N, Hkv, D, generator=g).to(dtype)
    beyond = torch.arange(N)[None, :] >= lengths[:, None].long()
    k[beyond] = float("nan")
    v[beyond] = float("nan")
    if mask_kind == "causal":
        mask = None
    elif mask_kind == "tree":
        mask = tk.tree_attention_mask(random_parents(B, T, seed))
    else:  # arbitrary bits: rows may see nothing of the new tokens
        mask = torch.rand(B, T, T, generator=g) < 0.4
    to = lambda x: None if x is None else x.to(device)
    return to(q), to(k), to(v), to(lengths), to(mask)


def check_against_reference(out, lse, q, k, v, lengths, mask, scale=None, window=None, softcap=None,
                            cache_leftpad=None, alibi_slopes=None):
    """out: flash-attn rule (<= 2x the error of PyTorch in q's precision, vs float64); lse: the same
    rule against PyTorch in float32 (every backend accumulates in float32); -inf exactly where the
    float64 reference has -inf. ``window``: a sliding window's keys (None: every key); ``softcap``: the scores'
    soft cap (None: none); ``cache_leftpad``: each row's first position (None: 0); ``alibi_slopes``: ALiBi's
    slopes (None: none)."""
    cpu = lambda x: None if x is None else x.cpu()
    q, k, v, lengths, mask, out, lse = map(cpu, (q, k, v, lengths, mask, out, lse))
    assert not torch.isnan(out).any(), "NaN in output (a position >= L leaked, or an unwritten element)"
    kw = dict(window=window, softcap=softcap, cache_leftpad=cpu(cache_leftpad), alibi_slopes=cpu(alibi_slopes))
    exact, exact_lse = reference(q.double(), k.double(), v.double(), lengths, mask, scale, **kw)
    same, _ = reference(q, k, v, lengths, mask, scale, compute_dtype=q.dtype, **kw)
    _, lse32 = reference(q, k, v, lengths, mask, scale, compute_dtype=torch.float32, **kw)
    floor = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}[q.dtype]  # ~1 ulp of |out| <= 4
    assert_close_measured(out, exact, same, factor=2.0, floor=floor)
    dead = torch.isinf(exact_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), dead), "lse must be -inf exactly for rows that see nothing"
    assert torch.all(out.permute(0, 2, 1, 3)[dead] == 0), "rows that see nothing must be 0"
    live = ~dead
    assert_close_measured(lse[live], exact_lse[live], lse32[live], factor=2.0, floor=1e-5, name="lse")


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(max_examples=10)
@given(B=st.integers(1, 3), Hkv=st.sampled_from([1, 2]), g=st.sampled_from([1, 2, 3, 4, 8]),
       D=st.sampled_from([16, 64, 128]), data=st.data(), slack=st.integers(0, 5), dtype=st.sampled_from(DTYPES),
       mask_kind=st.sampled_from(["causal", "tree", "random"]), seed=st.integers(0, 2**31 - 1))
def test_matches_reference(backend, B, Hkv, g, D, data, slack, dtype, mask_kind, seed):
    interpreted = backend == "triton" and not torch.cuda.is_available()
    T = data.draw(st.integers(1, 20 if interpreted else 64), label="T")
    prefixes = data.draw(st.lists(st.sampled_from(PREFIXES + [40, 70]), min_size=B, max_size=B), label="prefixes")
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, prefixes, slack, dtype, seed, dev, mask_kind)
    out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend=backend)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (B, g * Hkv, T) and lse.dtype == torch.float32
    check_against_reference(out, lse, q, k, v, L, mask)


@pytest.mark.parametrize("backend", [p for p in backends("verify_attention") if p.id in ("cpu", "cuda")])
@given(B=st.integers(1, 3), Hkv=st.sampled_from([1, 2]), g=st.sampled_from([1, 2, 3, 4, 8]),
       D=st.sampled_from([8, 16, 24, 64, 72, 128]), T=st.integers(1, 64),
       prefixes=st.lists(st.sampled_from(PREFIXES + [31, 32, 33, 40, 70, 200]), min_size=3, max_size=3),
       slack=st.integers(0, 5), dtype=st.sampled_from(DTYPES), mask_kind=st.sampled_from(["causal", "tree", "random"]),
       num_splits=st.sampled_from([0, 0, 1, 2, 3, 7, 64]), strided=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_splits_and_views_match_reference(backend, B, Hkv, g, D, T, prefixes, slack, dtype, mask_kind, num_splits,
                                          strided, seed):
    """The compiled kernels over random prefix splits (more splits than keys included), head dims that
    are and are not multiples of the vector width, and batch/length-sliced cache views whose memory
    outside the view is NaN. Not limited to a few examples, so the fuzz profile covers it in full."""
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, prefixes[:B], slack, dtype, seed, dev, mask_kind)
    kv, vv = k, v
    if strided:
        N = k.shape[1]
        big_k = torch.full((2 * B, N + 7, Hkv, D), float("nan"), dtype=dtype, device=dev)
        big_v = big_k.clone()
        big_k[::2, :N], big_v[::2, :N] = k, v
        kv, vv = big_k[::2, :N], big_v[::2, :N]
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if num_splits == 0:  # the public op (validation, automatic split count)
        out, lse = tk.verify_attention(q, kv, vv, L, mask, return_lse=True, backend=backend)
    else:
        impl = implementation("verify_attention", backend)
        out, lse = impl(q, kv, vv, L, mask, 1.0 / math.sqrt(D), num_splits=num_splits)
    check_against_reference(out, lse, q, k, v, L, mask)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@pytest.mark.parametrize("T, prefixes, mask_kind", [
    (1, [0, 1, 15, 16, 17], "causal"), (16, [17, 0], "tree"), (64, [1], "causal"), (64, [15], "tree"),
    (33, [16, 5], "random"),
    (100, [5, 40], "random"), (130, [3], "tree"),  # > 64 new tokens: a Triton tail of 2-4 tiles
])
def test_prefix_lengths_and_wide_trees(backend, T, prefixes, mask_kind):
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(len(prefixes), T, 4, 2, 64, prefixes, 3, torch.bfloat16, T, dev, mask_kind)
    out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend=backend)
    check_against_reference(out, lse, q, k, v, L, mask)


@pytest.mark.parametrize("backend", backends("verify_attention"))
def test_wide_tree_with_lengths_below_T(backend):
    """T > 64 with cache lengths L < T, which GPU callers may pass (not checked there, see below): the
    first T - L new tokens are not in the cache (negative positions), so the Triton kernel's ancestor
    lists leave them out and its tree ranks start at 0. Called below the public op, whose CPU check
    would raise first."""
    dev = backend_device(backend)
    q, k, v, _, mask = make_inputs(3, 100, 4, 2, 64, [0, 0, 0], 0, torch.float32, 5, dev, "random")
    L = torch.tensor([30, 99, 71], dtype=torch.int32, device=dev)
    out, lse = implementation("verify_attention", backend)(q, k, v, L, mask, 64 ** -0.5)
    check_against_reference(out, lse, q, k, v, L, mask)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_prefix_ragged(backend, dtype):
    """Long prefixes (several splits / tiles), ragged lengths, GQA 4, non-default scale."""
    long = 700 if backend != "triton" or torch.cuda.is_available() else 333
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 7, 8, 2, 128, [long, long // 3 + 1], 9, dtype, 11, dev, "tree")
    out, lse = tk.verify_attention(q, k, v, L, mask, softmax_scale=0.3, return_lse=True, backend=backend)
    check_against_reference(out, lse, q, k, v, L, mask, scale=0.3)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
def test_forced_prefix_splits(backend, num_splits):
    """Split-K + log-sum-exp merge with more splits than keys, empty splits and ragged prefixes."""
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(3, 4, 4, 2, 32, [150, 0, 17], 5, torch.float16, num_splits, dev, "tree")
    out, lse = implementation("verify_attention", backend)(q, k, v, L, mask, 0.2, num_splits=num_splits)
    check_against_reference(out, lse, q, k, v, L, mask, scale=0.2)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_heads_walked_together(backend, num_splits):
    """Caches whose rows are >= 2 KB apart (here fp32, Hkv = 8, D = 64): the CPU kernel walks all KV heads
    of a (batch, split) together in chunks of 32 keys; prefixes span several chunks, one ends inside one."""
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 16, 8, 64, [300, 129], 2, torch.float32, 7 + num_splits, dev, "tree")
    out, lse = implementation("verify_attention", backend)(q, k, v, L, mask, 0.125, num_splits=num_splits)
    check_against_reference(out, lse, q, k, v, L, mask, scale=0.125)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@pytest.mark.parametrize("T, Hq, Hkv, D", [
    (3, 9, 3, 64),   # 9 query rows per KV head (SmolLM2 verifying a 3-token tree): one vector of 16, 7 padded
    (9, 9, 3, 64),   # 27 rows: two vectors
    (5, 8, 1, 128),  # 40 rows: three vectors, D = 128
    (8, 16, 2, 64),  # 64 rows: four full vectors
])
@pytest.mark.parametrize("mask_kind", ["causal", "tree", "random"])
def test_verification_widths_fp32(backend, T, Hq, Hkv, D, mask_kind):
    """fp32 caches with 9-64 query rows per KV head: the CPU kernel's rows-in-lanes path on AVX-512 builds
    (the dot path elsewhere); prefixes of several tiles and key blocks, one empty, walked by 1 and 3 splits."""
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, T, Hq, Hkv, D, [141, 0], 4, torch.float32, T * Hq + D, dev, mask_kind)
    for num_splits in (1, 3):
        out, lse = implementation("verify_attention", backend)(q, k, v, L, mask, 0.125, num_splits=num_splits)
        check_against_reference(out, lse, q, k, v, L, mask, scale=0.125)


@pytest.mark.parametrize("backend", backends("verify_attention"))
def test_tree_oracle(backend):
    """Each tree node's output equals plain causal attention over the prefix plus its root-to-node path."""
    dev = backend_device(backend)
    B, T, Hq, Hkv, D, prefix = 2, 12, 4, 2, 32, 19
    parents = random_parents(B, T, 5)
    mask = tk.tree_attention_mask(parents).to(dev)
    q, k, v, L, _ = make_inputs(B, T, Hq, Hkv, D, [prefix] * B, 0, torch.float32, 5, dev)
    out = tk.verify_attention(q, k, v, L, mask, backend=backend).cpu()
    q, k, v = q.cpu().double(), k.cpu().double(), v.cpu().double()
    for b in range(B):
        for t in range(T):
            path = [s for s in range(T) if mask[b, t, s]]  # ancestors-or-self in topological order
            keep = list(range(prefix)) + [prefix + s for s in path]
            oracle, _ = reference(q[b:b + 1, path], k[b:b + 1, keep], v[b:b + 1, keep],
                                  torch.tensor([len(keep)], dtype=torch.int32))
            torch.testing.assert_close(out[b, t].double(), oracle[0, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_trusted_entry_equals_the_public_op(backend, monkeypatch):
    """The model layer's unchecked entry (verify_attention_trusted: same backend choice, the CPU kernel
    called directly) returns exactly what tk.verify_attention returns, causal and tree."""
    from triforce_kernels.verify_attention import verify_attention_trusted

    monkeypatch.setenv("TRIFORCE_BACKEND", backend)
    dev = backend_device(backend)
    for kind in ("causal", "tree"):
        q, k, v, L, mask = make_inputs(2, 5, 9, 3, 64, [0, 40], 3, torch.float32, 4, dev, kind)
        want = tk.verify_attention(q, k, v, L, mask, backend=backend)
        torch.testing.assert_close(verify_attention_trusted(q, k, v, L, mask), want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_causal_tree_equals_causal(backend):
    dev = backend_device(backend)
    T = 9
    q, k, v, L, _ = make_inputs(3, T, 6, 3, 64, [0, 16, 17], 2, torch.float16, 2, dev)
    chain = tk.tree_attention_mask(torch.arange(-1, T - 1).view(1, T).expand(3, T)).to(dev)
    a, la = tk.verify_attention(q, k, v, L, return_lse=True, backend=backend)
    b, lb = tk.verify_attention(q, k, v, L, chain, return_lse=True, backend=backend)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(la, lb, rtol=0, atol=0)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_fully_masked_rows(backend):
    dev = backend_device(backend)
    q, k, v, L, _ = make_inputs(2, 4, 2, 1, 16, [0, 3], 0, torch.float32, 3, dev)
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[:, 2] = False  # row 2 sees no new token: nothing at all in batch 0, the prefix in batch 1
    mask = mask.to(dev)
    out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend=backend)
    out, lse = out.cpu(), lse.cpu()
    assert torch.all(out[0, 2] == 0) and torch.all(lse[0, :, 2] == -math.inf)
    assert torch.isfinite(lse[1, :, 2]).all() and torch.isfinite(out).all()
    check_against_reference(out, lse, q, k, v, L, mask)


@pytest.mark.parametrize("backend", backends("verify_attention"))
def test_strided_cache_views(backend):
    """A batch slice and a length slice of larger caches: memory beyond each view is NaN, and must not
    be read."""
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(4, 5, 4, 2, 64, [20, 3, 9, 30], 0, torch.bfloat16, 8, dev, "tree")
    N = k.shape[1]
    big_k = torch.full((8, N + 13, 2, 64), float("nan"), dtype=k.dtype, device=dev)
    big_v = big_k.clone()
    big_k[::2, :N], big_v[::2, :N] = k, v
    kv, vv = big_k[::2, :N], big_v[::2, :N]
    assert not kv.is_contiguous()
    out, lse = tk.verify_attention(q[:, :, :], kv, vv, L, mask, return_lse=True, backend=backend)
    check_against_reference(out, lse, q, k, v, L, mask)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous q
    torch.testing.assert_close(tk.verify_attention(qt, kv, vv, L, mask, backend=backend), out, rtol=0, atol=0)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")  # the NaN keys, on purpose
@settings(max_examples=6)
@given(B=st.integers(1, 2), T=st.integers(1, 9), g=st.sampled_from([1, 3]), D=st.sampled_from([16, 32]),
       prefix=st.integers(0, 20), dtype=st.sampled_from(DTYPES), mask_kind=st.sampled_from(["causal", "tree", "random"]),
       poison=st.sampled_from([math.nan, math.inf, -math.inf]), frac=st.sampled_from([0.02, 0.3, 1.0]),
       in_prefix=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_unseen_values_never_reach_the_output(backend, B, T, g, D, prefix, dtype, mask_kind, poison, frac,
                                              in_prefix, seed):
    """inf/NaN values at positions a query may not see (the other branches of a tree, later tokens of a
    chain: a rejected draft token whose values overflowed) leave its output as it was, bit for bit
    modulo summation order; a query that sees one gets a non-finite output for that head, at least in
    that value's column (the C++ kernel and the reference: that column; the Triton kernel's tail: the
    row). Keys at positions no query sees may hold anything too."""
    from triforce_kernels.reference.verify_attention import visibility

    dev = backend_device(backend)
    Hkv = 2
    q, k, v, L, mask = make_inputs(B, T, Hkv * g, Hkv, D, [prefix + b for b in range(B)], 2, dtype, seed, dev,
                                   mask_kind)
    N = k.shape[1]
    vis = visibility(L.cpu(), T, N, None if mask is None else mask.cpu())  # [B, T, N]
    pos = torch.arange(N)[None, :]
    Lb = L.cpu().long()[:, None]
    where = (pos >= Lb - T) & (pos < Lb) if not in_prefix else pos < Lb  # the tail, or everything read
    gen = torch.Generator().manual_seed(seed)
    hit = where[:, :, None, None] & (torch.rand(B, N, Hkv, D, generator=gen) < frac)
    v2 = v.cpu().clone()
    v2[hit] = poison
    k2 = k.cpu().clone()
    k2[~vis.any(1)] = poison  # keys that no query sees
    out0 = tk.verify_attention(q, k, v, L, mask, backend=backend).cpu()
    out, lse = tk.verify_attention(q, k2.to(dev), v2.to(dev), L, mask, return_lse=True, backend=backend)
    out = out.cpu()
    seen = torch.einsum("btn,bnkd->btkd", vis.double(), hit.double()) > 0  # [B, T, Hkv, D]
    seen = seen[:, :, :, None, :].expand(B, T, Hkv, g, D).reshape(B, T, Hkv * g, D)
    row = seen.any(-1, keepdim=True).expand_as(seen)  # the query sees some inf/NaN value of that head
    assert not torch.isfinite(out[seen]).any(), "a query that sees an inf/NaN value must not get a finite output"
    assert torch.isfinite(out[~row]).all(), "an inf/NaN value leaked into a query that cannot see it"
    exact, _ = reference(q.double().cpu(), k2.double(), v2.double(), L.cpu(), None if mask is None else mask.cpu())
    assert torch.equal(torch.isnan(exact), seen)  # the reference: exactly those columns
    check_against_reference(out0, lse, q, k, v, L, mask)  # the clean run as ever; lse unchanged by the poison
    torch.testing.assert_close(torch.where(row, 0, out), torch.where(row, 0, out0),
                               **({"rtol": 0, "atol": 0} if backend == "reference" else {}))


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_out_of_range_lengths_are_clamped(backend):
    """What GPU callers get for bad lengths (not checked there, to avoid a sync): only positions in
    [0, min(L, N)) are read, as the reference's visibility defines. Called below the public op, whose
    CPU check would raise first."""
    dev = backend_device(backend)
    B, T, N = 4, 3, 10
    g = torch.Generator().manual_seed(0)
    big_k = torch.full((B, N + 8, 1, 16), float("nan"))
    big_v = big_k.clone()
    big_k[:, :N] = torch.randn(B, N, 1, 16, generator=g)
    big_v[:, :N] = torch.randn(B, N, 1, 16, generator=g)
    k, v = big_k.to(dev)[:, :N], big_v.to(dev)[:, :N]
    q = torch.randn(B, T, 2, 16, generator=g).to(dev)
    L = torch.tensor([-5, 1, 15, 2**31 - 1], dtype=torch.int32, device=dev)
    impl = implementation("verify_attention", backend)
    out, lse = impl(q, k, v, L, None, 0.25)
    exact, exact_lse = reference(q.double().cpu(), k.double().cpu(), v.double().cpu(), L.cpu(), None, 0.25)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.cpu().double(), exact_lse, rtol=1e-5, atol=1e-5)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == -math.inf)


def test_default_backend_and_return_lse_flag():
    q, k, v, L, _ = make_inputs(1, 2, 2, 1, 16, [5], 0, torch.float32, 0, "cpu")
    out = tk.verify_attention(q, k, v, L)
    assert isinstance(out, torch.Tensor)
    out2, lse = tk.verify_attention(q, k, v, L, return_lse=True)
    torch.testing.assert_close(out, out2, rtol=0, atol=0)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_opcheck(backend):
    from triforce_kernels.verify_attention import _verify_attention_op

    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 3, 4, 2, 16, [5, 0], 1, torch.float32, 0, dev, "tree")
    k, v = k.nan_to_num(), v.nan_to_num()  # opcheck compares outputs with NaN-unaware checks
    torch.library.opcheck(_verify_attention_op, (q, k, v, L, mask, 0.25, backend),
                          test_utils=("test_schema", "test_faketensor"))


def _good(**kw):
    q, k, v, L, _ = make_inputs(2, 3, 4, 2, 16, [5, 0], 1, torch.float32, 0, "cpu")
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=L) | kw


@pytest.mark.parametrize("bad, err, match", [
    (dict(tree_mask=torch.ones(2, 3, 4, dtype=torch.bool)), ValueError, "tree_mask must have shape \\[2, 3, 3\\]"),
    (dict(tree_mask=torch.ones(2, 3, 3)), TypeError, "tree_mask must have dtype bool"),
    (dict(cache_seqlens=torch.tensor([5, 2], dtype=torch.int32)), ValueError, "cache_seqlens must be in \\[T, N\\]"),
    (dict(cache_seqlens=torch.tensor([5, 10], dtype=torch.int32)), ValueError, "cache_seqlens must be in \\[T, N\\]"),
    (dict(cache_seqlens=torch.tensor([5, 3])), TypeError, "cache_seqlens must have dtype int32"),
    (dict(cache_seqlens=torch.tensor([5], dtype=torch.int32)), ValueError, "cache_seqlens must have shape \\[2\\]"),
    (dict(q=torch.randn(2, 3, 3, 16)), ValueError, "must be a multiple of the number of KV heads"),
    (dict(q=torch.randn(2, 3, 4, 8)), ValueError, "k_cache must have shape \\[2, \\*, \\*, 8\\]"),
    (dict(q=torch.randn(2, 0, 4, 16)), ValueError, "at least one query token"),
    (dict(q=torch.randn(2, 3, 4, 16, dtype=torch.float16)), TypeError, "k_cache must have dtype float16"),
    (dict(q=torch.randint(0, 2, (2, 3, 4, 16))), TypeError, "q must have dtype"),
    (dict(v_cache=torch.randn(2, 7, 2, 16)), ValueError, "v_cache must have shape"),
    (dict(k_cache=torch.randn(2, 9, 16)), ValueError, "k_cache must have 4 dimensions"),
    (dict(softmax_scale="0.1"), TypeError, "softmax_scale must be a float"),
    (dict(softmax_scale=math.inf), ValueError, "softmax_scale must be finite"),
    (dict(return_lse=1), TypeError, "return_lse must be a bool"),
    (dict(q=None), TypeError, "q must be a torch.Tensor"),
])
def test_bad_inputs(bad, err, match):
    with pytest.raises(err, match=match):
        tk.verify_attention(**_good(**bad))


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
@pytest.mark.parametrize("name", ["k_cache", "v_cache"])
def test_strided_last_dim_raises(backend, name):
    """A cache is read in place, never copied (a whole-cache copy per call would cost more than the
    attention): a strided last dim raises on every backend, in the public op and in the launchers."""
    dev = backend_device(backend)
    good = {key: val.to(dev) for key, val in _good().items()}
    cache = good[name]
    wide = torch.zeros(cache.shape[:-1] + (2 * cache.shape[-1],), dtype=cache.dtype, device=dev)
    wide[..., ::2] = cache
    good[name] = wide[..., ::2]
    assert good[name].stride(-1) == 2
    with pytest.raises(ValueError, match=f"{name} must have a contiguous last dimension"):
        tk.verify_attention(**good, backend=backend)
    if backend in ("cpu", "triton"):  # below the public op: the launchers check too instead of copying
        impl = implementation("verify_attention", backend)
        with pytest.raises((ValueError, RuntimeError), match="contiguous last dimension"):
            impl(good["q"], good["k_cache"], good["v_cache"], good["cache_seqlens"], None, 0.25)


@pytest.mark.skipif(torch.cuda.is_available() or not tk.backend_status("triton", "cpu")[0],
                    reason="runs the GPU launch plan in the Triton interpreter (on a GPU it is the plan anyway)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter's bf16 dot is wrong
@pytest.mark.parametrize("mask_kind", ["causal", "tree"])
def test_triton_gpu_launch_plan_in_the_interpreter(dtype, mask_kind):
    """The Triton kernels with the launch plan an H100 gets -- 64-key tiles and parts of 512 keys for
    132 SMs (8 parts here, the interpreter's own plan uses 3) -- executed by the interpreter: the GPU
    plan's semantics, checked without a GPU. Ragged lengths, one row with an empty prefix, GQA 4."""
    from triforce_kernels.triton import _target
    from triforce_kernels.triton.verify_attention import _block_n, _part_keys

    B, T, Hkv, g, D = 2, 5, 2, 4, 64
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, [4091, 0], 0, dtype, 7, torch.device("cpu"), mask_kind)
    with _target.plan_for(132):
        assert _block_n(D, _target.interpreting()) == 64
        assert _part_keys(Hkv, k.shape[1], 64, q.device) == 512 and k.shape[1] // 512 == 8
        out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend="triton")
    check_against_reference(out, lse, q, k, v, L, mask)


@pytest.mark.skipif(torch.cuda.is_available() or not tk.backend_status("triton", "cpu")[0],
                    reason="runs a GPU launch plan in the Triton interpreter (on a GPU it is the plan anyway)")
@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
def test_triton_gpu_plan_rows_keep_their_bits_in_any_batch(tree):
    """A row's output and lse are bitwise the same alone and in a batch of 4, under the launch plan of a GPU
    with 8 SMs (small enough that the parts of a 4100-key cache would differ between 1 and 4 rows had
    they followed the batch size: 512 against 2048 keys). GPU run 5: MagicDec's greedy output on the
    H200 changed once finished rows left the batch (TRIFORCE_COMPACT_ROWS=1), the parts being B's."""
    from triforce_kernels.triton import _target

    B, T, Hkv, g, D = 4, 3, 1, 2, 64
    q, k, v, L, mask = make_inputs(B, T, g * Hkv, Hkv, D, [4100, 2500, 4090, 700], 3, torch.float16, 5,
                                   torch.device("cpu"), "tree" if tree else "causal")
    impl = implementation("verify_attention", "triton")
    with _target.plan_for(8):
        out, lse = impl(q, k, v, L, mask, 0.125)
        for b in (0, 2):
            one = slice(b, b + 1)
            o1, l1 = impl(q[one], k[one], v[one], L[one], None if mask is None else mask[one], 0.125)
            assert torch.equal(o1[0], out[b]) and torch.equal(l1[0], lse[b]), f"row {b} alone differs"
    check_against_reference(out, lse, q, k, v, L, mask, 0.125)


def _ancestor_lists_oracle(mask, L, N):
    """Row (b, t): the s with mask[b, t, s] and 0 <= L - T + s < min(L, N), ascending, then -1."""
    B, T, _ = mask.shape
    want = torch.full((B, T, T), -1, dtype=torch.int32)
    for b in range(B):
        new0, end = int(L[b]) - T, min(N, max(int(L[b]), 0))
        for t in range(T):
            seen = [s for s in range(T) if mask[b, t, s] and 0 <= new0 + s < end]
            want[b, t, :len(seen)] = torch.tensor(seen, dtype=torch.int32)
    return want


@pytest.mark.parametrize("backend", [p for p in backends("verify_attention") if p.id == "triton"])
@settings(max_examples=10, deadline=None)
@given(T=st.integers(1, 70), block=st.sampled_from([None, 16]), density=st.sampled_from([0.0, 0.4, 1.0]),
       slack=st.integers(-5, 5), seed=st.integers(0, 2**31 - 1))
@example(T=40, block=16, density=0.4, slack=3, seed=0)  # several steps of a mask row
@example(T=1, block=None, density=1.0, slack=0, seed=1)
def test_triton_ancestor_lists(backend, T, block, density, slack, seed):
    """The tree tail's per-token key lists against a Python oracle: row (b, t) lists the new tokens t
    sees, at positions in [0, min(L, N)), in index order, then -1. Lengths in range, below T (slack
    < 0), past N and 2^31 - 1; arbitrary masks; mask rows read in several steps (block=16)."""
    from triforce_kernels.triton.verify_attention import _ancestor_lists

    dev = backend_device(backend)
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(4, T, T, generator=g) < density
    N = T + 8
    L = torch.tensor([T + 3 + slack, max(T + slack, 0), N + 2, 2**31 - 1], dtype=torch.int32)
    got = _ancestor_lists(mask.to(dev), L.to(dev), N, block=block)
    assert torch.equal(got.cpu(), _ancestor_lists_oracle(mask, L, N))


def test_triton_part_keys_follow_neither_T_nor_L():
    """The Triton parts are cut at fixed ranks: their size depends on the cache's N, Hkv and the GPU
    only (a size that followed T or the prefix length would change a row's bits with T; one that followed
    the batch size, a row's bits when rows leave the batch). Powers of two, multiples of the tile, >= 512
    keys on a GPU, at most MAX_PARTS parts."""
    from triforce_kernels.triton import _target
    from triforce_kernels.triton.verify_attention import MAX_PARTS, _part_keys

    cpu = torch.device("cpu")
    with _target.plan_for(132):
        for Hkv, N in [(8, 131072), (8, 32768), (3, 4096), (1, 10 ** 6), (2, 100)]:
            keys = _part_keys(Hkv, N, 64, cpu)
            assert keys % 64 == 0 and keys >= 512 and -(-N // keys) <= MAX_PARTS
        assert _part_keys(8, 131072, 64, cpu) == 4096  # 32 parts: 256 programs at T = 1
        assert _part_keys(8, 100000, 64, cpu) == 4096  # a power of two: nearby capacities share it
    assert _part_keys(1, 1000, 32, cpu, num_splits=64) == 32  # forced: about that many parts, tile-sized
    assert _part_keys(1, 10, 32, cpu) == 32


def _committed(k, v, L, T, parents, b, t):
    """Row b of the caches as they are once node t's path is accepted: its ancestors (and itself) at
    positions L-T, L-T+1, ...; returns (k, v, length) for a one-token step at node t."""
    new0 = int(L[b]) - T
    path = [t]
    while parents[b, path[-1]] >= 0:
        path.append(int(parents[b, path[-1]]))
    path = path[::-1]
    kb, vb = k[b:b + 1].clone(), v[b:b + 1].clone()
    idx = torch.tensor([new0 + s for s in path])
    kb[0, new0:new0 + len(path)], vb[0, new0:new0 + len(path)] = k[b, idx], v[b, idx]
    return kb, vb, torch.tensor([new0 + len(path)], dtype=torch.int32)


@settings(max_examples=10)
@given(B=st.integers(1, 2), T=st.integers(1, 20), g=st.sampled_from([1, 3, 4, 12]), D=st.sampled_from([16, 64, 128]),
       prefix=st.sampled_from([0, 7, 31, 32, 200, 511, 512, 600, 1100]), dtype=st.sampled_from(DTYPES),
       tree=st.booleans(), interleaved=st.booleans(), seed=st.integers(0, 2**31 - 1))
@example(B=1, T=5, g=3, D=64, prefix=600, dtype=torch.float32, tree=False, interleaved=True, seed=0)  # SmolLM2
@example(B=1, T=9, g=3, D=64, prefix=1100, dtype=torch.float32, tree=True, interleaved=True, seed=1)
@example(B=2, T=16, g=4, D=128, prefix=511, dtype=torch.bfloat16, tree=True, interleaved=False, seed=2)
@example(B=1, T=20, g=4, D=64, prefix=512, dtype=torch.float16, tree=False, interleaved=True, seed=3)  # R = 80
def test_a_pass_gives_the_bits_of_one_token_steps(B, T, g, D, prefix, dtype, tree, interleaved, seed):
    """CPU backend: row t of a pass of T tokens is bitwise the output (and lse) of the one-token step at
    its position, over the cache as it is once t's path is committed (causal: the same cache; tree: t's
    ancestors moved to consecutive positions). So speculative and tree decoding on the CPU compute each
    accepted token's attention exactly as autoregressive decoding does."""
    Hkv = 2
    q, k, v, L, _ = make_inputs(B, T, Hkv * g, Hkv, D, [prefix + 3 * b for b in range(B)], 2, dtype, seed,
                                torch.device("cpu"))
    if not interleaved:  # [B, Hkv, N, D] storage viewed as [B, N, Hkv, D]
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
    parents = random_parents(B, T, seed) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend="cpu")
    assert_one_thread_gives_the_bits(q, k, v, L, mask, out, lse)
    assert_rows_are_their_steps(q, k, v, L, parents, out, lse, "cpu")


def assert_one_thread_gives_the_bits(q, k, v, L, mask, out, lse, **kw):
    """The cpu backend on one thread gives ``out`` and ``lse`` bitwise: the split into work items follows the
    thread count, the bits must not. ``kw``: more arguments of the call (``window``, ``softcap``)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tk.verify_attention(q, k, v, L, mask, return_lse=True, backend="cpu", **kw)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], out) and torch.equal(one[1], lse)


def assert_rows_are_their_steps(q, k, v, L, parents, out, lse, backend, to=lambda x: x, **kw):
    """Each row of a pass (``out``, ``lse`` over new tokens with ``parents``) is bitwise its one-token step
    over the keys of its committed path; ``to``: moves the step's inputs to the pass's device."""
    B, T = q.shape[:2]
    for b in range(B):
        for t in range(T):
            kb, vb, Lb = _committed(k, v, L, T, parents, b, t)
            o1, l1 = tk.verify_attention(to(q[b:b + 1, t:t + 1]), to(kb), to(vb), to(Lb), return_lse=True,
                                         backend=backend, **kw)
            assert torch.equal(o1[0, 0], out[b, t]), f"row {t} of batch {b} differs from its one-token step"
            assert torch.equal(l1[0, :, 0], lse[b, :, t])


@pytest.mark.parametrize("backend", [p for p in backends("verify_attention") if p.id == "triton"])
@settings(max_examples=6, deadline=None)
@given(T=st.integers(1, 12), g=st.sampled_from([1, 3, 4, 6]), D=st.sampled_from([16, 64]),
       prefix=st.sampled_from([0, 7, 31, 32, 63, 100, 150]), dtype=st.sampled_from(DTYPES),
       tree=st.booleans(), num_splits=st.sampled_from([None, 2, 5]), seed=st.integers(0, 2**31 - 1))
@example(T=9, g=3, D=64, prefix=90, dtype=torch.float32, tree=True, num_splits=5, seed=1)  # the tail crosses a part
@example(T=12, g=6, D=16, prefix=25, dtype=torch.float16, tree=False, num_splits=None, seed=2)  # 72 rows: 5 blocks
@example(T=5, g=4, D=64, prefix=63, dtype=torch.bfloat16, tree=True, num_splits=2, seed=3)
def test_triton_pass_gives_the_bits_of_one_token_steps(backend, T, g, D, prefix, dtype, tree, num_splits, seed):
    """Triton backend: row t of a pass of T tokens is bitwise the output (and lse) of the one-token step
    at its position, over the cache as it is once t's path is committed, for every part size (parts
    cut at fixed ranks; a tail that crosses a part boundary continues that part's state). In the
    interpreter this checks the construction; on a GPU, that both launches round every tile alike."""
    dev = backend_device(backend)
    B, Hkv = 2, 2
    q, k, v, L, _ = make_inputs(B, T, Hkv * g, Hkv, D, [prefix + 3 * b for b in range(B)], 2, dtype, seed,
                                torch.device("cpu"))
    parents = random_parents(B, T, seed) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    impl = implementation("verify_attention", "triton")
    to = lambda x: None if x is None else x.to(dev)
    scale = 1.0 / math.sqrt(D)
    out, lse = impl(to(q), to(k), to(v), to(L), to(mask), scale, num_splits=num_splits)
    for b in range(B):
        for t in range(T):
            kb, vb, Lb = _committed(k, v, L, T, parents, b, t)
            o1, l1 = impl(to(q[b:b + 1, t:t + 1]), to(kb), to(vb), to(Lb), None, scale, num_splits=num_splits)
            assert torch.equal(o1[0, 0], out[b, t]), f"row {t} of batch {b} differs from its one-token step"
            assert torch.equal(l1[0, :, 0], lse[b, :, t])


@pytest.mark.skipif(torch.cuda.is_available() or not tk.backend_status("triton", "cpu")[0],
                    reason="runs the GPU launch plan in the Triton interpreter (on a GPU it is the plan anyway)")
@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
@pytest.mark.parametrize("block_rows", [None, 16], ids=["plan", "rows16"])
def test_triton_gpu_plan_pass_gives_the_bits_of_one_token_steps(tree, block_rows):
    """The same property under the launch plan an H100 gets (64-row blocks, 64-key tiles, parts of 512
    keys), executed by the interpreter in float16 (the GPU's 16-bit dot path): a prefix of 508 keys,
    so the tail of 7 tokens crosses the part boundary at rank 512 and continues into the next part.
    Also with 16-row blocks (the benchmark's other T-independent choice): the pass's 28 rows take two."""
    from triforce_kernels.triton import _target

    B, T, Hkv, g, D = 1, 7, 2, 4, 64
    q, k, v, L, _ = make_inputs(B, T, g * Hkv, Hkv, D, [508], 3, torch.float16, 11, torch.device("cpu"))
    parents = random_parents(B, T, 11) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    impl = implementation("verify_attention", "triton")
    with _target.plan_for(132):
        out, lse = impl(q, k, v, L, mask, 0.125, block_rows=block_rows)
        for t in range(T):
            kb, vb, Lb = _committed(k, v, L, T, parents, 0, t)
            o1, l1 = impl(q[:, t:t + 1], kb, vb, Lb, None, 0.125, block_rows=block_rows)
            assert torch.equal(o1[0, 0], out[0, t]) and torch.equal(l1[0, :, 0], lse[0, :, t]), f"row {t}"
    check_against_reference(out, lse, q, k, v, L, mask, 0.125)
