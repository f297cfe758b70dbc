"""Every op on CUDA tensors, without a GPU: under FakeTensorMode, tensors on ``cuda`` carry shapes,
dtypes and devices but no data, so the public wrapper (validation, backend choice) and the custom op's
fake implementation run as they would on a GPU, and any read of a device value -- a host
synchronisation, which the contract rules out for these ops (docs/design.md 3) -- raises
``DataDependentOutputException``. The outputs' shapes, dtypes and devices are checked against the
contract. (The tree helpers are the documented exception: they read ``parents`` once.)"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import triforce_kernels as tk

CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield


def _e(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device=CUDA)


def _check(t, shape, dtype):
    assert t.device == CUDA and tuple(t.shape) == tuple(shape) and t.dtype == dtype, (t.device, t.shape, t.dtype)


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_verify_attention(fake, tree, dtype):
    B, T, Hq, Hkv, N, D = 2, 5, 8, 2, 4096, 128
    mask = torch.ones(B, T, T, dtype=torch.bool, device=CUDA) if tree else None
    lens = torch.full((B,), N, dtype=torch.int32, device=CUDA)
    out, lse = tk.verify_attention(_e(B, T, Hq, D, dtype=dtype), _e(B, N, Hkv, D, dtype=dtype),
                                   _e(B, N, Hkv, D, dtype=dtype), lens, mask, return_lse=True)
    _check(out, (B, T, Hq, D), dtype)
    _check(lse, (B, Hq, T), torch.float32)


def test_retrieval_ops(fake):
    B, N, Hq, Hkv, D, cs, budget = 2, 4096, 8, 2, 64, 8, 64
    C = N // cs
    k, v = _e(B, N, Hkv, D), _e(B, N, Hkv, D)
    means = tk.chunk_mean_keys(k, cs)
    _check(means, (B, C, Hkv, D), torch.float32)
    n = torch.full((B,), C, dtype=torch.int32, device=CUDA)
    q = _e(B, Hq, D)
    scores = tk.score_chunks(q, means, n)
    _check(scores, (B, Hkv, C), torch.float32)
    idx = tk.select_chunks(scores, n, budget, 1, 2)
    _check(idx, (B, Hkv, budget), torch.int32)
    out_k, out_v = _e(B, budget * cs, Hkv, D), _e(B, budget * cs, Hkv, D)
    tk.gather_chunks(k, v, idx, cs, out_k, out_v)
    idx2 = tk.build_retrieval_cache(q, k, v, means, n, cs, budget, out_k, out_v, 1, 2)
    _check(idx2, (B, Hkv, budget), torch.int32)


@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("uniforms", [False, True])
def test_samplers(fake, with_q, uniforms):
    B, n, V = 3, 4, 32000
    f = torch.float32
    toks = torch.empty(B, n, dtype=torch.int64, device=CUDA)
    u = _e(B, n + 1, 2, dtype=f) if uniforms else None
    out, num = tk.chain_speculative_sample(toks, _e(B, n, V, dtype=f) if with_q else None, _e(B, n + 1, V, dtype=f), u)
    _check(out, (B, n + 1), torch.int64)
    _check(num, (B,), torch.int32)
    T = n + 1
    tree_toks = torch.empty(B, T, dtype=torch.int64, device=CUDA)
    parents = torch.empty(B, T, dtype=torch.int64, device=CUDA)
    u = _e(B, T, 2, dtype=f) if uniforms else None
    path, out, num = tk.tree_speculative_sample(tree_toks, parents, _e(B, T, V, dtype=f) if with_q else None,
                                                _e(B, T, V, dtype=f), u)
    _check(path, (B, T), torch.int32)
    _check(out, (B, T), torch.int64)
    _check(num, (B,), torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_verify_and_logits_to_probs(fake, dtype):
    B, n, V = 3, 4, 32000
    out, num = tk.chain_greedy_verify(torch.empty(B, n, dtype=torch.int64, device=CUDA), _e(B, n + 1, V, dtype=dtype))
    _check(out, (B, n + 1), torch.int64)
    path, out, num = tk.tree_greedy_verify(torch.empty(B, n + 1, dtype=torch.int64, device=CUDA),
                                           torch.empty(B, n + 1, dtype=torch.int64, device=CUDA),
                                           _e(B, n + 1, V, dtype=dtype))
    _check(path, (B, n + 1), torch.int32)
    for kw in (dict(temperature=0.0), dict(temperature=0.7, top_k=50, top_p=0.9)):
        _check(tk.logits_to_probs(_e(B, V, dtype=dtype), **kw), (B, V), torch.float32)
