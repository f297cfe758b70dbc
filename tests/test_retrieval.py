"""Retrieval-cache ops (docs/design.md 3.1): score_chunks, select_chunks, gather_chunks, build_retrieval_cache.

Every backend against the reference; the reference's selection against a brute-force Python oracle.
"""
import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels.reference import retrieval as ref
from triforce_kernels.reference.chunk_mean_keys import chunk_mean_keys as ref_chunk_mean_keys

from .helpers import DTYPES, assert_close_measured, backend_device, backends, poison_

HEADS = [(1, 1), (4, 1), (8, 2), (9, 3)]  # (Hq, Hkv): MHA, MQA, GQA 4, SmolLM2's GQA 3


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of a float tensor (so NaN poison compares equal and -0.0 != 0.0)."""
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def _oracle_select(scores, num_chunks, budget, sink, recent):
    """Brute force, one row at a time in plain Python: the selection rule as written in docs/design.md 3.1."""
    B, H, C = scores.shape
    out = torch.full((B, H, budget), -1, dtype=torch.int32)
    for b in range(B):
        n = min(max(int(num_chunks[b]), 0), C)
        for h in range(H):
            if n <= budget:
                chosen = list(range(n))
            else:
                forced = set(range(sink)) | set(range(n - recent, n))
                s = [float("-inf") if math.isnan(x) else x for x in scores[b, h].tolist()]
                middle = sorted((c for c in range(n) if c not in forced), key=lambda c: (-s[c], c))
                chosen = sorted(forced | set(middle[: budget - len(forced)]))
            out[b, h, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return out


def _random_scores(g, B, H, C, levels):
    """Scores quantised to ``levels`` values (many exact ties), with some NaN and -inf."""
    s = torch.randint(0, levels, (B, H, C), generator=g).float() / levels
    special = torch.rand(B, H, C, generator=g)
    s[special < 0.05] = float("nan")
    s[(special >= 0.05) & (special < 0.1)] = float("-inf")
    return s


# ---------------------------------------------------------------------------------------- select


@given(B=st.integers(1, 3), H=st.integers(1, 3), C=st.integers(0, 40), budget=st.integers(1, 20),
       sink=st.integers(0, 4), recent=st.integers(0, 4), levels=st.sampled_from([2, 5, 1000]),
       seed=st.integers(0, 2**31 - 1))
def test_reference_select_matches_oracle(B, H, C, budget, sink, recent, levels, seed):
    if budget <= sink + recent:
        budget = sink + recent + 1
    g = torch.Generator().manual_seed(seed)
    scores = _random_scores(g, B, H, C, levels)
    num_chunks = torch.randint(-2, C + 3, (B,), generator=g, dtype=torch.int32)
    got = ref.select_chunks(scores, num_chunks, budget, sink, recent)
    assert torch.equal(got, _oracle_select(scores, num_chunks, budget, sink, recent))


@pytest.mark.parametrize("backend", backends("select_chunks"))
@given(B=st.integers(1, 3), H=st.integers(1, 4), C=st.integers(0, 70), budget=st.integers(1, 24),
       sink=st.integers(0, 3), recent=st.integers(0, 3), levels=st.sampled_from([2, 7, 10**6]),
       seed=st.integers(0, 2**31 - 1))
@example(B=1, H=1, C=0, budget=4, sink=1, recent=0, levels=7, seed=0)  # no chunks at all
@example(B=2, H=2, C=5, budget=9, sink=1, recent=1, levels=7, seed=1)  # budget > number of chunks
@example(B=2, H=3, C=40, budget=6, sink=3, recent=2, levels=2, seed=2)  # massive ties
def test_select_matches_reference(backend, B, H, C, budget, sink, recent, levels, seed):
    if budget <= sink + recent:
        budget = sink + recent + 1
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(seed)
    scores = _random_scores(g, B, H, C, levels)
    num_chunks = torch.randint(-2, C + 3, (B,), generator=g, dtype=torch.int32)  # clamped to [0, C]
    num_chunks[0] = min(C, sink)  # fewer chunks than sinks
    out = tk.select_chunks(scores.to(dev), num_chunks.to(dev), budget, sink, recent, backend=backend)
    assert out.shape == (B, H, budget) and out.dtype == torch.int32 and out.device == dev
    assert torch.equal(out.cpu(), ref.select_chunks(scores, num_chunks, budget, sink, recent))


@pytest.mark.parametrize("backend", backends("select_chunks"))
@pytest.mark.parametrize("levels", [3, 50, 10**6])
def test_select_long_rows(backend, levels):
    """Rows longer than the kernels' blocks (Triton: 4096 keys per step), ties spread over blocks."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(levels)
    scores = _random_scores(g, 2, 2, 9000, levels)
    num_chunks = torch.tensor([9000, 8191], dtype=torch.int32)
    out = tk.select_chunks(scores.to(dev), num_chunks.to(dev), 700, 4, 16, backend=backend)
    assert torch.equal(out.cpu(), ref.select_chunks(scores, num_chunks, 700, 4, 16))


# ----------------------------------------------------------------------------------------- score


def _assert_scores_close(out, q, chunk_keys, num_chunks):
    exact = ref.score_chunks(q.double(), chunk_keys.double(), num_chunks)
    same = ref.score_chunks(q, chunk_keys, num_chunks)  # PyTorch in float32
    inf = exact.isinf()
    assert torch.equal(out.isinf(), inf) and bool((out[inf] < 0).all()), "invalid chunks must score -inf"
    # fp32 softmax error scales with the score: floor of a few fp32 ulps of the largest score (<= g).
    assert_close_measured(out[~inf], exact[~inf], same[~inf], factor=2.0, floor=1e-6, name="scores")


@pytest.mark.parametrize("backend", backends("score_chunks"))
@given(B=st.integers(1, 3), C=st.integers(0, 70), heads=st.sampled_from(HEADS), D=st.sampled_from([64, 128]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
@example(B=1, C=0, heads=(4, 1), D=64, dtype=torch.float32, seed=0)  # no chunks
@example(B=2, C=1, heads=(9, 3), D=64, dtype=torch.bfloat16, seed=1)
def test_score_matches_reference(backend, B, C, heads, D, dtype, seed):
    Hq, Hkv = heads
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, D, generator=g) * 2).to(dtype)
    chunk_keys = torch.randn(B, C, Hkv, D, generator=g)
    num_chunks = torch.randint(-1, C + 2, (B,), generator=g, dtype=torch.int32)
    out = tk.score_chunks(q.to(dev), chunk_keys.to(dev), num_chunks.to(dev), backend=backend)
    assert out.shape == (B, Hkv, C) and out.dtype == torch.float32 and out.is_contiguous()
    _assert_scores_close(out.cpu(), q, chunk_keys, num_chunks)


@pytest.mark.parametrize("backend", backends("score_chunks"))
def test_score_strided_chunk_keys_and_sums(backend):
    """A view of a larger chunk-key buffer; each query head's probabilities sum to 1."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(3)
    buf = torch.randn(2, 3, 40, 64, generator=g).transpose(1, 2)  # [2, 40, 3, 64], non-contiguous
    q = torch.randn(2, 9, 64, generator=g)
    num_chunks = torch.tensor([17, 40], dtype=torch.int32)
    out = tk.score_chunks(q.to(dev), buf.to(dev), num_chunks.to(dev), backend=backend).cpu()
    _assert_scores_close(out, q, buf, num_chunks)
    torch.testing.assert_close(out.nan_to_num(neginf=0).sum(-1), torch.full((2, 3), 3.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", backends("score_chunks"))
def test_score_long_rows(backend):
    """More chunks than one split of the Triton softmax (64) times its statistics block (64)."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 64, generator=g).to(torch.bfloat16)
    chunk_keys = torch.randn(2, 5000, 2, 64, generator=g)
    num_chunks = torch.tensor([5000, 4097], dtype=torch.int32)
    out = tk.score_chunks(q.to(dev), chunk_keys.to(dev), num_chunks.to(dev), backend=backend)
    _assert_scores_close(out.cpu(), q, chunk_keys, num_chunks)


@pytest.mark.parametrize("backend", [p for p in backends("score_chunks") if p.id in ("cpu", "cuda")])
def test_score_non_finite_inputs(backend):
    """NaN / inf in queries or chunk keys give NaN exactly where the reference has it, and nothing else
    changes. (The exponential's range clamp once converted NaN to int: undefined behaviour that
    scripts/sanitize.sh reports.)"""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 16, generator=g)
    chunk_keys = torch.randn(3, 6, 2, 16, generator=g)
    q[0, 1, 3] = float("nan")  # one query head of KV group 0 in batch 0
    chunk_keys[1, 2, 0, 5] = float("nan")  # one chunk of KV head 0 in batch 1
    q[2, 0, 0] = float("inf")
    q[2, 2] = float("-inf")
    num_chunks = torch.tensor([6, 5, 6], dtype=torch.int32)
    out = tk.score_chunks(q.to(dev), chunk_keys.to(dev), num_chunks.to(dev), backend=backend).cpu()
    want = ref.score_chunks(q.double(), chunk_keys.double(), num_chunks)
    assert out[0, 0].isnan().all() and out[1, 0, :5].isnan().all() and out[2].isnan().all()
    assert torch.isfinite(out[0, 1]).all() and torch.isfinite(out[1, 1, :5]).all()
    torch.testing.assert_close(out.double(), want, equal_nan=True)


# ---------------------------------------------------------------------------------------- gather


@pytest.mark.parametrize("backend", backends("gather_chunks"))
@given(B=st.integers(1, 3), N=st.integers(0, 70), H=st.integers(1, 3), D=st.sampled_from([8, 64, 128]),
       chunk_size=st.integers(1, 9), S=st.integers(0, 9), extra=st.integers(0, 5), dtype=st.sampled_from(DTYPES),
       strided=st.booleans(), seed=st.integers(0, 2**31 - 1))
@example(B=1, N=5, H=1, D=64, chunk_size=8, S=3, extra=0, dtype=torch.float32, strided=False, seed=0)  # N < chunk
def test_gather_matches_reference(backend, B, N, H, D, chunk_size, S, extra, dtype, strided, seed):
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(seed)
    Nc = N // chunk_size
    if strided:  # [:, :N] view of a bigger cache with a head-major layout
        k = torch.randn(B, H, N + 7, D, generator=g).to(dtype).transpose(1, 2)[:, :N]
        v = torch.randn(B, H, N + 7, D, generator=g).to(dtype).transpose(1, 2)[:, :N]
    else:
        k = torch.randn(B, N, H, D, generator=g).to(dtype)
        v = torch.randn(B, N, H, D, generator=g).to(dtype)
    # valid indices, -1, and out-of-range ones (which must be skipped, never read)
    chunk_idx = torch.randint(-3, Nc + 3, (B, H, S), generator=g, dtype=torch.int32)
    chunk_idx[chunk_idx == Nc + 2] = 2**31 - 1
    M = S * chunk_size + extra
    out_k, out_v = poison_(torch.empty(B, M, H, D, dtype=dtype)), poison_(torch.empty(B, M, H, D, dtype=dtype))
    exp_k, exp_v = out_k.clone(), out_v.clone()
    ref.gather_chunks(k, v, chunk_idx, chunk_size, exp_k, exp_v)
    got_k, got_v = out_k.to(dev), out_v.to(dev)
    tk.gather_chunks(k.to(dev), v.to(dev), chunk_idx.to(dev), chunk_size, got_k, got_v, backend=backend)
    assert torch.equal(_int_view(got_k.cpu()), _int_view(exp_k)) and torch.equal(_int_view(got_v.cpu()), _int_view(exp_v))


def test_reference_gather_definition():
    """The vectorised reference against the formula, element by element."""
    g = torch.Generator().manual_seed(5)
    B, N, H, D, cs, S = 2, 29, 3, 4, 4, 5
    k, v = torch.randn(B, N, H, D, generator=g), torch.randn(B, N, H, D, generator=g)
    idx = torch.randint(-1, N // cs + 1, (B, H, S), generator=g, dtype=torch.int32)
    out_k, out_v = torch.zeros(B, S * cs + 2, H, D), torch.zeros(B, S * cs + 2, H, D)
    ref.gather_chunks(k, v, idx, cs, out_k, out_v)
    for b in range(B):
        for h in range(H):
            for i in range(S):
                c = int(idx[b, h, i])
                for t in range(cs):
                    want_k = k[b, c * cs + t, h] if 0 <= c < N // cs else torch.zeros(D)
                    want_v = v[b, c * cs + t, h] if 0 <= c < N // cs else torch.zeros(D)
                    assert torch.equal(out_k[b, i * cs + t, h], want_k) and torch.equal(out_v[b, i * cs + t, h], want_v)
    assert not out_k[:, S * cs:].any() and not out_v[:, S * cs:].any()


# ----------------------------------------------------------------------------------------- build


def _model_like_inputs(g, B, N, heads, D, chunk_size, dtype, C=None):
    Hq, Hkv = heads
    k = torch.randn(B, N, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, N, Hkv, D, generator=g).to(dtype)
    q = (torch.randn(B, Hq, D, generator=g) * 3).to(dtype)
    chunk_keys = ref_chunk_mean_keys(k, chunk_size)[:, :C]
    C = chunk_keys.shape[1]
    num_chunks = torch.randint(0, C + 1, (B,), generator=g, dtype=torch.int32)
    num_chunks[-1] = C
    return q, k, v, chunk_keys, num_chunks


@pytest.mark.parametrize("backend", backends("build_retrieval_cache"))
@given(B=st.integers(1, 2), N=st.integers(0, 120), heads=st.sampled_from(HEADS), D=st.sampled_from([64, 128]),
       chunk_size=st.sampled_from([1, 3, 8]), budget=st.integers(2, 12), sink=st.integers(0, 1),
       recent=st.integers(0, 1), tail=st.integers(0, 3), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
@example(B=1, N=5, heads=(4, 1), D=64, chunk_size=8, budget=4, sink=1, recent=0, tail=0, dtype=torch.float32,
         seed=0)  # N < one chunk: nothing to select
@example(B=2, N=43, heads=(9, 3), D=64, chunk_size=8, budget=8, sink=1, recent=1, tail=2, dtype=torch.bfloat16,
         seed=1)  # budget > number of chunks, partial trailing chunk
def test_build_matches_ops_and_reference(backend, B, N, heads, D, chunk_size, budget, sink, recent, tail, dtype, seed):
    if budget <= sink + recent:
        budget = sink + recent + 1
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(seed)
    q, k, v, chunk_keys, num_chunks = _model_like_inputs(g, B, N, heads, D, chunk_size, dtype)
    Hkv = heads[1]
    M = budget * chunk_size + tail
    out_k = poison_(torch.empty(B, M, Hkv, D, dtype=dtype, device=dev))
    out_v = poison_(torch.empty(B, M, Hkv, D, dtype=dtype, device=dev))
    args = [t.to(dev) for t in (q, k, v, chunk_keys, num_chunks)]
    idx = tk.build_retrieval_cache(*args[:5], chunk_size, budget, out_k, out_v, sink, recent, backend=backend)
    assert idx.shape == (B, Hkv, budget) and idx.dtype == torch.int32

    # == the three ops of the same backend, exactly
    scores = tk.score_chunks(args[0], args[3], args[4], backend=backend)
    want_idx = tk.select_chunks(scores, args[4], budget, sink, recent, backend=backend)
    assert torch.equal(idx, want_idx)
    exp_k, exp_v = poison_(torch.empty_like(out_k)), poison_(torch.empty_like(out_v))
    tk.gather_chunks(args[1], args[2], want_idx, chunk_size, exp_k, exp_v, backend=backend)
    assert torch.equal(_int_view(out_k), _int_view(exp_k)) and torch.equal(_int_view(out_v), _int_view(exp_v))

    # == the reference's indices on every row whose selection is decided by a clear score gap
    _assert_scores_close(scores.cpu(), q, chunk_keys, num_chunks)
    exact = ref.score_chunks(q.double(), chunk_keys.double(), num_chunks)
    eps = 4 * torch.cat([(scores.cpu().double() - exact).nan_to_num(0.0).abs().flatten(), torch.zeros(1)]).max().item() + 1e-6
    ref_idx = ref.select_chunks(exact.float(), num_chunks, budget, sink, recent)
    C = chunk_keys.shape[1]
    for b in range(B):
        n = min(int(num_chunks[b]), C)
        keep = budget - min(sink, n) - recent
        for h in range(Hkv):
            middle = exact[b, h, sink: max(n - recent, sink)].sort(descending=True).values
            if n > budget and middle[keep - 1] - middle[keep] <= eps:
                continue  # a near-tie at the cut: either choice is right within rounding
            assert torch.equal(idx[b, h].cpu(), ref_idx[b, h]), (b, h)


@pytest.mark.parametrize("backend", backends("build_retrieval_cache", include_reference=True))
@pytest.mark.parametrize("heads", HEADS)
def test_attention_over_gathered_cache_equals_masked_full_attention(backend, heads):
    """The point of the cache: attending over the gathered buffer (valid slots) is attention over the
    full cache restricted to the selected chunks' tokens, per KV head."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(11)
    B, N, D, cs, budget = 2, 77, 64, 4, 6
    Hq, Hkv = heads
    q, k, v, chunk_keys, num_chunks = _model_like_inputs(g, B, N, heads, D, cs, torch.float32)
    num_chunks[0] = 4  # fewer chunks than the budget: -1 slots
    out_k = poison_(torch.empty(B, budget * cs + 3, Hkv, D, device=dev))
    out_v = poison_(torch.empty(B, budget * cs + 3, Hkv, D, device=dev))
    idx = tk.build_retrieval_cache(q.to(dev), k.to(dev), v.to(dev), chunk_keys.to(dev), num_chunks.to(dev), cs,
                                   budget, out_k, out_v, 1, 1, backend=backend).cpu()
    out_k, out_v = out_k.cpu().double(), out_v.cpu().double()
    g_ = Hq // Hkv
    for b in range(B):
        for j in range(Hq):
            h = j // g_
            slot_ok = (idx[b, h] >= 0).repeat_interleave(cs)
            kk, vv = out_k[b, : budget * cs, h][slot_ok], out_v[b, : budget * cs, h][slot_ok]
            gathered = torch.softmax(kk @ q[b, j].double() / math.sqrt(D), 0) @ vv
            token_ok = torch.zeros(N, dtype=torch.bool)
            for c in idx[b, h][idx[b, h] >= 0].tolist():
                token_ok[c * cs:(c + 1) * cs] = True
            logits = (k[b, :, h].double() @ q[b, j].double() / math.sqrt(D)).masked_fill(~token_ok, float("-inf"))
            full = torch.softmax(logits, 0) @ v[b, :, h].double()
            torch.testing.assert_close(gathered, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", backends("build_retrieval_cache", include_reference=True))
def test_build_sink_recent_and_budget_edges(backend):
    """Sinks and recent chunks always kept; n < sink; budget larger than the chunk count."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(2)
    B, N, D, cs = 4, 96, 64, 8
    q, k, v, chunk_keys, _ = _model_like_inputs(g, B, N, (8, 2), D, cs, torch.float16)
    num_chunks = torch.tensor([12, 1, 0, 7], dtype=torch.int32)
    out_k = torch.zeros(B, 6 * cs, 2, D, dtype=torch.float16, device=dev)
    out_v = torch.zeros_like(out_k)
    idx = tk.build_retrieval_cache(q.to(dev), k.to(dev), v.to(dev), chunk_keys.to(dev), num_chunks.to(dev), cs, 6,
                                   out_k, out_v, sink_chunks=2, recent_chunks=2, backend=backend).cpu()
    for h in range(2):
        row = idx[0, h].tolist()
        assert row[:2] == [0, 1] and row[-2:] == [10, 11] and row == sorted(row) and len(set(row)) == 6
        assert idx[1, h].tolist() == [0, -1, -1, -1, -1, -1]
        assert idx[2, h].tolist() == [-1] * 6
        row = idx[3, h].tolist()  # 7 chunks > budget 6: all but one of the middle chunks 2, 3, 4
        assert row[:2] == [0, 1] and row[-2:] == [5, 6] and row == sorted(row) and len(set(row)) == 6
    assert not out_k[2].any() and not out_v[1, cs:].any()


# ------------------------------------------------------------------------------------ bad inputs


def _good():
    B, N, Hq, Hkv, D, cs = 1, 32, 4, 2, 8, 4
    return dict(q=torch.randn(B, Hq, D), k=torch.randn(B, N, Hkv, D), v=torch.randn(B, N, Hkv, D),
                chunk_keys=torch.randn(B, N // cs, Hkv, D), num_chunks=torch.tensor([8], dtype=torch.int32),
                chunk_size=cs, budget_chunks=4, out_k=torch.empty(B, 16, Hkv, D), out_v=torch.empty(B, 16, Hkv, D))


@pytest.mark.parametrize("bad, err, match", [
    (dict(q=torch.randn(4, 8)), ValueError, "q must have 3 dimensions"),
    (dict(q=torch.randn(1, 3, 8)), ValueError, "multiple of chunk_keys"),
    (dict(q=torch.randn(1, 4, 16)), ValueError, "chunk_keys must have shape"),
    (dict(q=torch.randint(0, 2, (1, 4, 8))), TypeError, "q must have dtype"),
    (dict(chunk_keys=torch.randn(1, 8, 2, 8, dtype=torch.float16)), TypeError, "chunk_keys must have dtype"),
    (dict(num_chunks=torch.tensor([8])), TypeError, "num_chunks must have dtype"),
    (dict(num_chunks=torch.tensor([8, 8], dtype=torch.int32)), ValueError, "num_chunks must have shape"),
    (dict(chunk_keys=None), TypeError, "chunk_keys must be a torch.Tensor"),
])
def test_score_bad_inputs(bad, err, match):
    a = _good() | bad
    with pytest.raises(err, match=match):
        tk.score_chunks(a["q"], a["chunk_keys"], a["num_chunks"])


@pytest.mark.parametrize("bad, err, match", [
    (dict(scores=torch.randn(2, 8)), ValueError, "scores must have 3 dimensions"),
    (dict(scores=torch.randn(1, 2, 8, dtype=torch.float64)), TypeError, "scores must have dtype"),
    (dict(budget_chunks=2, sink_chunks=1, recent_chunks=1), ValueError, "budget_chunks .* must be > sink_chunks"),
    (dict(budget_chunks=0, sink_chunks=0), ValueError, "budget_chunks must be >= 1"),
    (dict(sink_chunks=-1), ValueError, "sink_chunks must be >= 0"),
    (dict(recent_chunks=1.0), TypeError, "recent_chunks must be an int"),
    (dict(num_chunks=torch.tensor([3], dtype=torch.int64)), TypeError, "num_chunks must have dtype"),
])
def test_select_bad_inputs(bad, err, match):
    a = dict(scores=torch.randn(1, 2, 8), num_chunks=torch.tensor([8], dtype=torch.int32), budget_chunks=4,
             sink_chunks=1, recent_chunks=0) | bad
    with pytest.raises(err, match=match):
        tk.select_chunks(**a)


@pytest.mark.parametrize("bad, err, match", [
    (dict(k=torch.randn(32, 2, 8)), ValueError, "k must have 4 dimensions"),
    (dict(v=torch.randn(1, 32, 2, 8, dtype=torch.float16)), TypeError, "v must have dtype"),
    (dict(v=torch.randn(1, 31, 2, 8)), ValueError, "v must have shape"),
    (dict(chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (dict(chunk_idx=torch.zeros(1, 2, 4, dtype=torch.int64)), TypeError, "chunk_idx must have dtype"),
    (dict(chunk_idx=torch.zeros(1, 3, 4, dtype=torch.int32)), ValueError, "chunk_idx must have shape"),
    (dict(out_k=torch.empty(1, 15, 2, 8)), ValueError, "out_k must have at least 4 x 4 = 16 positions"),
    (dict(out_k=torch.empty(1, 2, 16, 8).transpose(1, 2)), ValueError, "out_k must be contiguous"),
    (dict(out_v=torch.empty(1, 17, 2, 8)), ValueError, "out_v must have the shape of out_k"),
    (dict(out_v=torch.empty(1, 16, 2, 8, dtype=torch.bfloat16)), TypeError, "out_v must have dtype"),
    (dict(out_k=torch.empty(1, 16, 1, 8)), ValueError, "out_k must have shape"),
])
def test_gather_bad_inputs(bad, err, match):
    a = _good() | dict(chunk_idx=torch.zeros(1, 2, 4, dtype=torch.int32)) | bad
    with pytest.raises(err, match=match):
        tk.gather_chunks(a["k"], a["v"], a["chunk_idx"], a["chunk_size"], a["out_k"], a["out_v"])


@pytest.mark.parametrize("bad, err, match", [
    (dict(budget_chunks=1), ValueError, "budget_chunks .* must be > sink_chunks"),
    (dict(chunk_size=-1), ValueError, "chunk_size must be >= 1"),
    (dict(out_k=torch.empty(1, 12, 2, 8), out_v=torch.empty(1, 12, 2, 8)), ValueError, "at least 4 x 4"),
    (dict(out_v=torch.empty(1, 2, 16, 8).transpose(1, 2)), ValueError, "out_v must be contiguous"),
    (dict(chunk_keys=torch.randn(1, 9, 2, 8)), ValueError, "chunk_keys has 9 chunks but k holds only"),
    (dict(chunk_keys=torch.randn(1, 8, 1, 8)), ValueError, "chunk_keys must have shape"),
    (dict(q=torch.randn(1, 4, 8, dtype=torch.float64)), TypeError, "q must have dtype"),
    (dict(k=torch.randn(1, 32, 2, 4), v=torch.randn(1, 32, 2, 4)), ValueError, "out_k must have shape"),
    (dict(q=torch.randn(2, 4, 8)), ValueError, "chunk_keys must have shape"),
])
def test_build_bad_inputs(bad, err, match):
    a = _good() | bad
    with pytest.raises(err, match=match):
        tk.build_retrieval_cache(**a)


def test_build_device_mismatch():
    a = _good()
    with pytest.raises(ValueError, match="chunk_keys is on cpu but the other inputs are on meta"):
        tk.build_retrieval_cache(**(a | dict(q=a["q"].to("meta"))))
    with pytest.raises(ValueError, match="out_v is on meta but the other inputs are on cpu"):
        tk.build_retrieval_cache(**(a | dict(out_v=a["out_v"].to("meta"))))


@pytest.mark.parametrize("backend", backends("build_retrieval_cache", include_reference=True))
def test_custom_ops_opcheck(backend):
    """Schemas, mutation annotations and fake implementations (torch.compile / CUDA graphs)."""
    dev = backend_device(backend)
    a = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t) for n, t in _good().items()}
    scores = tk.score_chunks(a["q"], a["chunk_keys"], a["num_chunks"], backend=backend)
    idx = tk.select_chunks(scores, a["num_chunks"], 4, 1, 0, backend=backend)
    ops = torch.ops.triforce
    torch.library.opcheck(ops.score_chunks.default, (a["q"], a["chunk_keys"], a["num_chunks"], backend))
    torch.library.opcheck(ops.select_chunks.default, (scores, a["num_chunks"], 4, 1, 0, backend))
    torch.library.opcheck(ops.gather_chunks.default, (a["k"], a["v"], idx, 4, a["out_k"], a["out_v"], backend))
    torch.library.opcheck(ops.build_retrieval_cache.default,
                          (a["q"], a["k"], a["v"], a["chunk_keys"], a["num_chunks"], 4, 4, a["out_k"], a["out_v"], 1, 0,
                           backend))
