"""Mamba(-1)'s selective scan (``triforce.models.cache.selective_scan``: the extension's ``triforce_C::selective_scan_``
where built, csrc/cpu/selective.cpp, else PyTorch's ops) against the recurrence in float64, and the bits every path
of the model layer relies on: a T-token call is T one-token calls, one thread is two, a replay leaves a readout's
state, tokens past a row's count leave its state."""
import pytest
import torch

from triforce.models.cache import _cache_op, selective_scan

# (b, T, D, N): N = 16 as Mamba's (on AVX-512 the vector path, a group of 16 channels and one of 8), N not a multiple
# of 16 (the per-channel path), two vectors of dims over blocks of channels (32, then 8)
SHAPES = [(2, 5, 24, 16), (1, 3, 70, 8), (3, 1, 16, 33), (2, 4, 40, 32)]


def _inputs(b, T, D, N, seed):
    g = torch.Generator().manual_seed(seed)
    x, B, C = (torch.randn(shape, generator=g) for shape in ((b, T, D), (b, T, N), (b, T, N)))
    dt = torch.rand(b, T, D, generator=g) * 0.5
    A = -torch.exp(torch.randn(D, N, generator=g))
    return torch.randn(b, D, N, generator=g), x, dt, A, B, C


@pytest.mark.parametrize("shape", SHAPES)
def test_selective_scan_is_the_recurrence(shape):
    """Against the recurrence in float64; a T-token call bitwise T one-token calls and the same with one thread; a
    replay (no C) leaves the readout call's state; tokens past a row's count leave its state (still read out)."""
    b, T, D, N = shape
    state, x, dt, A, B, C = _inputs(*shape, seed=sum(shape))
    s64, want = state.double(), []
    for t in range(T):
        dtt = dt[:, t, :, None].double()
        s64 = s64 * torch.exp(dtt * A.double()) + (dtt * B[:, t, None, :].double()) * x[:, t, :, None].double()
        want.append((s64 * C[:, t, None, :].double()).sum(-1))
    got_state = state.clone()
    y = selective_scan(got_state, x, dt, A, B, C)
    assert y.shape == (b, T, D) and y.dtype == torch.float32
    assert torch.allclose(y.double(), torch.stack(want, 1), atol=1e-4, rtol=1e-4)
    assert torch.allclose(got_state.double(), s64, atol=1e-4, rtol=1e-4)
    steps, one = state.clone(), []
    for t in range(T):
        one.append(selective_scan(steps, x[:, t:t + 1], dt[:, t:t + 1], A, B[:, t:t + 1], C[:, t:t + 1]))
    assert torch.equal(torch.cat(one, 1), y) and torch.equal(steps, got_state)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = state.clone()
        assert torch.equal(selective_scan(single, x, dt, A, B, C), y) and torch.equal(single, got_state)
        torch.set_num_threads(2)
        double = state.clone()
        assert torch.equal(selective_scan(double, x, dt, A, B, C), y) and torch.equal(double, got_state)
    finally:
        torch.set_num_threads(threads)
    replay = state.clone()
    assert selective_scan(replay, x, dt, A, B, None) is None
    assert torch.equal(replay, got_state)
    for dtype in (torch.int64, torch.int32):
        counts = (torch.arange(b) % (T + 1)).to(dtype)
        part, replayed = state.clone(), state.clone()
        y_part = selective_scan(part, x, dt, A, B, C, counts)
        selective_scan(replayed, x, dt, A, B, None, counts)
        assert torch.equal(replayed, part)
        for i in range(b):
            ref = state[i:i + 1].clone()
            k = int(counts[i])
            y_ref = selective_scan(ref, x[i:i + 1, :k], dt[i:i + 1, :k], A, B[i:i + 1, :k], C[i:i + 1, :k])
            assert torch.equal(part[i:i + 1], ref)
            assert torch.equal(y_part[i:i + 1, :k], y_ref)
            for t in range(k, T):  # (past the count: the state as it is, read out)
                assert torch.equal(y_part[i, t], selective_scan(ref.clone(), x[i:i + 1, t:t + 1], dt[i:i + 1, t:t + 1],
                                                                A, B[i:i + 1, t:t + 1], C[i:i + 1, t:t + 1],
                                                                torch.zeros(1, dtype=dtype))[0, 0])


def test_selective_scan_takes_strided_inputs():
    """Views (as the caches' replay splits its ring, and a step's tokens) give the contiguous inputs' bits."""
    b, T, D, N = 2, 4, 40, 16
    state, x, dt, A, B, C = _inputs(b, T, D, N, seed=7)
    ring = torch.cat([x, dt, B], -1)
    xs, dts, Bs = ring.split([D, D, N], dim=-1)
    a, bb = state.clone(), state.clone()
    assert torch.equal(selective_scan(a, xs, dts, A, Bs, C), selective_scan(bb, x, dt, A, B, C))
    assert torch.equal(a, bb)


def test_selective_scan_op_refuses_bad_inputs():
    """The extension's op (where built) names what is wrong."""
    op = _cache_op("selective_scan_", "TRIFORCE_SELECTIVE_SCAN")
    if op is None:
        pytest.skip("no extension (or TRIFORCE_SELECTIVE_SCAN=0)")
    state, x, dt, A, B, C = _inputs(2, 3, 8, 4, seed=1)
    with pytest.raises(RuntimeError, match="state must be"):
        op(state[0], x, dt, A, B, C, None)
    with pytest.raises(RuntimeError, match="x must be"):
        op(state, x[:, :, :4].contiguous(), dt, A, B, C, None)
    with pytest.raises(RuntimeError, match="dt must be"):
        op(state, x, dt[:, :2].contiguous(), A, B, C, None)
    with pytest.raises(RuntimeError, match="A must be"):
        op(state, x, dt, A.t().contiguous(), B, C, None)
    with pytest.raises(RuntimeError, match="B must be"):
        op(state, x, dt, A, B[:, :2].contiguous(), C, None)
    with pytest.raises(RuntimeError, match="C must be"):
        op(state, x, dt, A, B, C[:1].contiguous(), None)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        op(state, x.double(), dt, A, B, C, None)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        op(state, x.transpose(1, 2).contiguous().transpose(1, 2), dt, A, B, C, None)
    with pytest.raises(RuntimeError, match="counts must be"):
        op(state, x, dt, A, B, C, torch.zeros(3, dtype=torch.int64))
    empty = state.clone()
    assert op(empty, x[:, :0], dt[:, :0], A, B[:, :0], C[:, :0], None).shape == (2, 0, 8)
    assert torch.equal(empty, state)
