"""Element offsets past 2**31: a per-layer view of one large KV buffer (the model layer's caches keep every
layer in one tensor) has a batch stride that no int32 holds on a big GPU (B=8, N=128K, 8 KV heads,
D=128 is already 2**30 elements per layer). A kernel that forms ``b * stride_b`` in 32 bits reads the
wrong row, or outside the buffer. Each op runs here on views with 3 batch rows whose stride fits in
int32 but whose third row starts past element 2**31 (so only the product overflows), of a buffer that is
only allocated, never filled (its untouched pages cost no memory), and must equal its own result on
compact copies of the same rows.
"""
import math

import pytest
import torch

import triforce_kernels as tk

from .helpers import backend_device, backends

B = 3
STRIDE = 2**30 + 2048  # elements between batch rows: an int32, but row 2 starts at 2**31 + 4096


@pytest.fixture(scope="module")
def buffer():
    """float32 storage of 2 * STRIDE + 2**20 elements (8 GiB of address space, ~12 MiB ever written)."""
    try:
        return torch.empty((B - 1) * STRIDE + 2**20, dtype=torch.float32)
    except RuntimeError as e:  # an allocator that commits memory eagerly
        pytest.skip(f"cannot reserve 8 GiB of address space here: {e}")


def _rows(buffer, dev, shape, seed):
    """A [B, *shape] view with batch stride STRIDE, filled with random values, and a compact copy. On a
    GPU, a CUDA buffer of the same size, allocated per call."""
    assert math.prod(shape) <= 2**20
    if dev.type != "cpu":
        buffer = torch.empty((B - 1) * STRIDE + 2**20, dtype=torch.float32, device=dev)
    strides = (STRIDE, *(math.prod(shape[i + 1:]) for i in range(len(shape))))  # rows contiguous
    view = buffer.as_strided((B, *shape), strides)
    g = torch.Generator().manual_seed(seed)
    view.copy_(torch.randn(B, *shape, generator=g).to(dev))
    return view, view.contiguous()


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_verify_attention(buffer, backend):
    dev = backend_device(backend)
    T, Hq, Hkv, N, D = 3, 4, 2, 40, 16
    k, k_c = _rows(buffer, dev, (N, Hkv, D), 0)
    v_src = torch.randn(B, N, Hkv, D, generator=torch.Generator().manual_seed(1)).to(dev)
    q = torch.randn(B, T, Hq, D, generator=torch.Generator().manual_seed(2)).to(dev)
    lens = torch.tensor([N, 17, 29], dtype=torch.int32, device=dev)
    mask = tk.tree_attention_mask(torch.tensor([[-1, 0, 0], [-1, 0, 1], [-1, 0, 0]], device=dev))
    for m in (None, mask):
        out = tk.verify_attention(q, k, v_src, lens, m, backend=backend)
        want = tk.verify_attention(q, k_c, v_src, lens, m, backend=backend)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        # v through the strided buffer too (k compact)
        out = tk.verify_attention(q, k_c, k, lens, m, backend=backend)
        want = tk.verify_attention(q, k_c, k_c, lens, m, backend=backend)
        torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", backends("build_retrieval_cache", include_reference=True))
def test_retrieval_ops(buffer, backend):
    dev = backend_device(backend)
    N, Hq, Hkv, D, cs, budget = 48, 4, 2, 16, 4, 5
    k, k_c = _rows(buffer, dev, (N, Hkv, D), 3)
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(4)).to(dev)
    n = torch.tensor([N // cs, 9, 11], dtype=torch.int32, device=dev)
    means = tk.chunk_mean_keys(k, cs, backend=backend)
    torch.testing.assert_close(means, tk.chunk_mean_keys(k_c, cs, backend=backend), rtol=0, atol=0)
    idx = tk.select_chunks(tk.score_chunks(q, means, n, backend=backend), n, budget, 1, 1, backend=backend)
    got = [torch.zeros(B, budget * cs, Hkv, D, device=dev) for _ in range(2)]
    want = [torch.zeros_like(got[0]) for _ in range(2)]
    tk.gather_chunks(k, k, idx, cs, *got, backend=backend)
    tk.gather_chunks(k_c, k_c, idx, cs, *want, backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    fidx = tk.build_retrieval_cache(q, k, k, means, n, cs, budget, *got, 1, 1, backend=backend)
    widx = tk.build_retrieval_cache(q, k_c, k_c, means, n, cs, budget, *want, 1, 1, backend=backend)
    assert torch.equal(fidx, widx) and torch.equal(fidx, idx)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", backends("chain_speculative_sample", include_reference=True))
def test_samplers(buffer, backend):
    """Target probabilities (and logits) as a view whose third row starts past 2**31."""
    dev = backend_device(backend)
    n, V = 3, 64
    p, p_c = _rows(buffer, dev, (n + 1, V), 5)
    p.copy_(torch.softmax(p_c, -1))
    p_c = p.contiguous()
    g = torch.Generator().manual_seed(6)
    draft = torch.randint(0, V, (B, n), generator=g).to(dev)
    q = torch.softmax(torch.randn(B, n, V, generator=g), -1).to(dev)
    u = torch.rand(B, n + 1, 2, generator=g).to(dev)
    for got, want in (
        (tk.chain_speculative_sample(draft, q, p, u, backend=backend),
         tk.chain_speculative_sample(draft, q, p_c, u, backend=backend)),
        (tk.chain_greedy_verify(draft, p, backend=backend), tk.chain_greedy_verify(draft, p_c, backend=backend)),
    ):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 1], [-1, 0, 1, 2]], device=dev)
    tokens = torch.cat([draft[:, :1], draft], 1)
    for got, want in (
        (tk.tree_speculative_sample(tokens, parents, None, p, u, backend=backend),
         tk.tree_speculative_sample(tokens, parents, None, p_c, u, backend=backend)),
        (tk.tree_greedy_verify(tokens, parents, p, backend=backend),
         tk.tree_greedy_verify(tokens, parents, p_c, backend=backend)),
    ):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
