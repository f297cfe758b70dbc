"""The GPU kernels' promise of no host synchronisation, checked on a GPU (skipped without one).

The contract (docs/design.md): the fused retrieval build, the verification attention and the samplers
never read a device value on the host and have fixed output shapes, so a decode step built from them can
be captured in a CUDA graph. Per op and GPU backend (triton, cuda):

* ``torch.cuda.set_sync_debug_mode("error")``: any synchronising call (a ``.item()``, ``nonzero``, a copy
  to the host) inside the op raises;
* the op captured once in a CUDA graph on static buffers, then replayed after new inputs are copied
  into them: the replay must equal an eager call on those inputs, bit for bit (the same kernels run, and
  none of them accumulates with atomics). A launcher that baked an input's value into the launch
  (a grid sized from a length, a host-side branch) would replay the first inputs' plan and fail.

On a machine without a GPU, ``tests/test_fake_cuda.py`` and ``triforce_kernels.triton.aot`` check the same
launch path without running it.
"""
from __future__ import annotations

import os

import pytest
import torch

import triforce_kernels as tk
from triforce_kernels._backend import backend_status, op_backends

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = torch.device("cuda")


def gpu_backends(op: str) -> list:
    """The backends of ``op`` that run on CUDA tensors (the reference is PyTorch code, not ours to graph)."""
    out = []
    for b in op_backends(op):
        if b in ("reference", "cpu"):
            continue
        ok, why = backend_status(b, DEV) if torch.cuda.is_available() else (False, "no CUDA")
        out.append(pytest.param(b, marks=() if ok else pytest.mark.skip(reason=f"{b}: {why}")))
    return out


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_sync_free_and_graph_replay(fn, make_inputs):
    """``fn(*inputs)`` -> tensor(s). ``make_inputs(seed)`` -> a list of CUDA tensors of fixed shapes
    (outputs written in place, such as the retrieval cache's buffers, are inputs too)."""
    first, second = make_inputs(0), make_inputs(1)
    static = [x.clone() for x in first]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (Triton compiles, lazy loads) outside the capture
        for _ in range(2):
            fn(*[x.clone() for x in static])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*[x.clone() for x in static])
    finally:
        torch.cuda.set_sync_debug_mode(0)

    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        # compute-sanitizer runs (scripts/gpu_check.sh) turn the caching allocator off, and a capture
        # cannot allocate without it (cudaErrorStreamCaptureUnsupported): the sync check above still ran
        pytest.skip("CUDA-graph capture needs PyTorch's caching allocator (PYTORCH_NO_CUDA_MEMORY_CACHING=1)")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _as_tuple(fn(*static))
    wants = []
    for inputs in (second, first, second):
        for s, x in zip(static, inputs):
            s.copy_(x)
        graph.replay()
        want = _as_tuple(fn(*[x.clone() for x in inputs]))
        torch.cuda.synchronize()
        assert len(captured) == len(want)
        for got, exp in zip(captured, want):
            torch.testing.assert_close(got, exp, rtol=0, atol=0, equal_nan=True)
        wants.append(want)
    # the two input sets give different results, so the replays recomputed (not a constant of the capture)
    assert any(not torch.equal(a, b) for a, b in zip(wants[0], wants[1]))
    return captured


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sampler_tensors(g: torch.Generator, B: int, drafts: int, rows: int, V: int):
    """Peaked draft and target distributions (q [B, drafts, V], p [B, rows, V]), uniforms, target logits."""
    q = torch.softmax(4 * torch.randn(B, drafts, V, generator=g), -1)
    p = torch.softmax(4 * torch.randn(B, rows, V, generator=g), -1)
    return q, p, torch.rand(B, rows, 2, generator=g), torch.randn(B, rows, V, generator=g)


def _random_parents(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    """A random tree per row: node t > 0 hangs under a node in [0, t)."""
    parents = torch.full((B, T), -1, dtype=torch.int64)
    for t in range(1, T):
        parents[:, t] = torch.randint(0, t, (B,), generator=g)
    return parents


@pytest.mark.parametrize("backend", gpu_backends("build_retrieval_cache"))
def test_build_retrieval_cache(backend):
    B, N, Hq, Hkv, D, cs, budget = 3, 1024, 8, 2, 64, 8, 24

    def make(seed):
        g = _gen(seed)
        k, v = (torch.randn(B, N, Hkv, D, generator=g, dtype=torch.float16) for _ in range(2))
        q = torch.randn(B, Hq, D, generator=g, dtype=torch.float16)
        means = tk.chunk_mean_keys(k, cs, backend="reference")
        # ragged rows, one with fewer chunks than the budget (-1 slots keep the buffer's contents)
        n = torch.tensor([N // cs, 7 + seed, 50 + 3 * seed], dtype=torch.int32)
        out_k, out_v = (torch.randn(B, budget * cs, Hkv, D, generator=g, dtype=torch.float16) for _ in range(2))
        return [t.to(DEV) for t in (q, k, v, means, n, out_k, out_v)]

    def fn(q, k, v, means, n, out_k, out_v):
        idx = tk.build_retrieval_cache(q, k, v, means, n, cs, budget, out_k, out_v, 1, 2, backend=backend)
        return idx, out_k, out_v
    idx = check_sync_free_and_graph_replay(fn, make)[0]
    assert (idx[1] >= 0).sum() == Hkv * 8  # the second inputs' row 1: 8 chunks (read from the replay)


@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
@pytest.mark.parametrize("backend", gpu_backends("verify_attention"))
def test_verify_attention(backend, tree):
    B, T, Hq, Hkv, N, D = 3, 6, 8, 2, 700, 64

    def make(seed):
        g = _gen(seed)
        q = torch.randn(B, T, Hq, D, generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn(B, N, Hkv, D, generator=g, dtype=torch.bfloat16) for _ in range(2))
        lens = torch.tensor([N, T + seed, 300 - 50 * seed], dtype=torch.int32)
        mask = tk.tree_attention_mask(_random_parents(g, B, T))
        return [t.to(DEV) for t in (q, k, v, lens, mask)]

    def fn(q, k, v, lens, mask):
        return tk.verify_attention(q, k, v, lens, mask if tree else None, return_lse=True, backend=backend)
    check_sync_free_and_graph_replay(fn, make)


@pytest.mark.parametrize("backend", gpu_backends("chain_speculative_sample"))
def test_chain_samplers(backend):
    B, n, V = 4, 5, 32000

    def make(seed):
        g = _gen(seed)
        draft = torch.randint(0, V, (B, n), generator=g)
        q, p, u, logits = _sampler_tensors(g, B, n, n + 1, V)
        draft[0] = p[0, :n].argmax(-1)  # a row that accepts
        return [t.to(DEV) for t in (draft, q, p, u, logits)]

    def fn(draft, q, p, u, logits):
        return (*tk.chain_speculative_sample(draft, q, p, u, backend=backend),
                *tk.chain_speculative_sample(draft, None, p, u, backend=backend),
                *tk.chain_greedy_verify(draft, logits, backend=backend))
    check_sync_free_and_graph_replay(fn, make)


@pytest.mark.parametrize("backend", gpu_backends("tree_speculative_sample"))
def test_tree_samplers(backend):
    B, T, V = 2, 16, 131072

    def make(seed):
        g = _gen(seed)
        parents = _random_parents(g, B, T)
        tokens = torch.randint(0, V, (B, T), generator=g)
        q, p, u, logits = _sampler_tensors(g, B, T, T, V)
        return [t.to(DEV) for t in (tokens, parents, q, p, u, logits)]

    def fn(tokens, parents, q, p, u, logits):
        return (*tk.tree_speculative_sample(tokens, parents, q, p, u, backend=backend),
                *tk.tree_speculative_sample(tokens, parents, None, p, u, backend=backend),
                *tk.tree_greedy_verify(tokens, parents, logits, backend=backend))
    check_sync_free_and_graph_replay(fn, make)


@pytest.mark.parametrize("backend", gpu_backends("chunk_mean_keys"))
def test_chunk_mean_keys(backend):
    def make(seed):
        return [torch.randn(2, 512, 4, 128, generator=_gen(seed), dtype=torch.bfloat16).to(DEV)]
    check_sync_free_and_graph_replay(lambda k: tk.chunk_mean_keys(k, 16, backend=backend), make)


def test_sync_debug_mode_catches_a_sync():
    """The check above can fail: a ``.item()`` under the same mode raises."""
    x = torch.ones(3, device=DEV)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            x.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode(0)
