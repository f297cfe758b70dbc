"""tk.chunk_mean_keys: every backend against the reference (the pattern every op test follows)."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels.reference.chunk_mean_keys import chunk_mean_keys as reference

from .helpers import DTYPES, assert_close_measured, backend_device, backends


@pytest.mark.parametrize("backend", backends("chunk_mean_keys"))
@given(B=st.integers(1, 3), N=st.integers(0, 70), H=st.sampled_from([1, 3, 8]), D=st.sampled_from([8, 64, 128]),
       chunk_size=st.integers(1, 16), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
@example(B=1, N=7, H=1, D=64, chunk_size=8, dtype=torch.float32, seed=0)  # N < one chunk
@example(B=2, N=17, H=3, D=64, chunk_size=8, dtype=torch.bfloat16, seed=1)  # partial trailing chunk
def test_matches_reference(backend, B, N, H, D, chunk_size, dtype, seed):
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, N, H, D, generator=g).to(dtype).to(dev)
    out = tk.chunk_mean_keys(k, chunk_size, backend=backend)
    assert out.shape == (B, N // chunk_size, H, D) and out.dtype == torch.float32
    # fp32 accumulation of the same inputs: only the summation order differs from the reference.
    exact = reference(k.double().cpu(), chunk_size)
    assert_close_measured(out.cpu(), exact, reference(k.cpu(), chunk_size), factor=2.0, floor=1e-6)


@pytest.mark.parametrize("backend", backends("chunk_mean_keys"))
def test_strided_view_one_chunk(backend):
    """Incremental maintenance: the mean of one newly completed chunk from a view of the cache."""
    dev = backend_device(backend)
    cache = torch.randn(2, 64, 3, 16, device=dev)
    full = tk.chunk_mean_keys(cache, 8, backend=backend)
    one = tk.chunk_mean_keys(cache[:, 40:48], 8, backend=backend)
    torch.testing.assert_close(one[:, 0], full[:, 5], rtol=0, atol=0)
    nhd_view = torch.randn(2, 3, 64, 16, device=dev).transpose(1, 2)  # non-contiguous layout
    torch.testing.assert_close(tk.chunk_mean_keys(nhd_view, 8, backend=backend),
                               reference(nhd_view.cpu(), 8).to(dev), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad, err, match", [
    (dict(k=torch.randn(16, 2, 8)), ValueError, "k must have 4 dimensions"),
    (dict(k=torch.randint(0, 3, (1, 16, 2, 8))), TypeError, "k must have dtype"),
    (dict(chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (dict(chunk_size=2.0), TypeError, "chunk_size must be an int"),
    (dict(k=[1.0]), TypeError, "k must be a torch.Tensor"),
])
def test_bad_inputs(bad, err, match):
    args = dict(k=torch.randn(1, 16, 2, 8), chunk_size=8) | bad
    with pytest.raises(err, match=match):
        tk.chunk_mean_keys(**args)
