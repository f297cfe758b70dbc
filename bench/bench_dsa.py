"""Benchmark of DeepSeek-V3.2's sparse attention (DSA: triforce.models.cache.indexed_attention) at a decode step and a
verification pass over a long context, against the dense attention over every cached key (``verify_attention``
over the whole latent cache: DeepSeek-V3's layer, and what the model computes while no query sees more than
``index_topk`` keys).

Shape: DeepSeek-V3.2's attention after its projections: 128 query heads over one latent KV head of 576 (the
absorbed latent attention: the values are the keys), an indexer of 64 heads of 128, each query attending to its
2048 best keys; batch 1; contexts 4K, 16K and 32K (``--quick``: 4K); T = 1 (a decode step) and 4 (verifying 3
drafts); float32 and bfloat16; random inputs. First checked: with the top-k at the context the op is the dense
attention, bitwise. Bytes: the indexer's keys (128 values a token) and the chosen latents (2048 x 576) for DSA,
every latent for the dense; FLOPs: the indexer's scores (2 x 64 x 128 a key), and the attention's (4 x 576 a head
and key it reads). Beside them, the indexer's scores alone: ``triforce_C::index_scores`` against the ATen path
(``index_scores`` rows; float32 peak: the scores are float32 multiply-adds whatever the keys' dtype).

    python -m bench.bench_dsa [--quick]
"""
from __future__ import annotations

import argparse

import torch

from .harness import compute_peak, copy_bandwidth, measure_alternating, record

HEADS, LATENT, INDEX_HEADS, INDEX_DIM, TOPK = 128, 576, 64, 128, 2048


def _inputs(N: int, T: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, T, HEADS, LATENT, generator=g).to(dtype)
    k = torch.randn(1, N, 1, LATENT, generator=g).to(dtype)
    index_q = torch.randn(1, T, INDEX_HEADS, INDEX_DIM, generator=g).to(dtype)
    index_k = torch.randn(1, N, INDEX_DIM, generator=g).to(dtype)
    weights = torch.randn(1, T, INDEX_HEADS, generator=g) * INDEX_HEADS ** -0.5
    return q, k, index_q, index_k, weights


def _calls(N: int, T: int, dtype: torch.dtype, topk: int = TOPK):
    from triforce.models.cache import indexed_attention
    from triforce_kernels.verify_attention import verify_attention_trusted

    q, k, index_q, index_k, weights = _inputs(N, T, dtype)
    scale, prefix = (192 ** -0.5), torch.tensor([N - T])
    seqlens = torch.tensor([N], dtype=torch.int32)

    def dsa():
        return indexed_attention(q, k, index_k, index_q, weights, prefix, None, topk, N, scale, 0.0)[0]

    def dense():
        return verify_attention_trusted(q, k, k, seqlens, None, 0, scale, 0.0)
    return dsa, dense


def check() -> None:
    """With the top-k at the context every key is chosen: a step's output is the dense attention's, bitwise."""
    for dtype in (torch.float32, torch.bfloat16):
        dsa, dense = _calls(2048, 1, dtype, topk=2048)
        assert torch.equal(dsa(), dense()), dtype


def bench(N: int, T: int, dtype: torch.dtype, reps: int) -> None:
    dsa, dense = _calls(N, T, dtype)
    es = torch.finfo(dtype).bits // 8
    K = min(TOPK, N)
    dense_bytes = N * LATENT * es
    dsa_bytes = N * INDEX_DIM * es + T * K * LATENT * es  # (each query's chosen latents, gathered)
    dense_flops = 4 * HEADS * LATENT * T * N
    dsa_flops = T * (2 * INDEX_HEADS * INDEX_DIM * N + 2 * INDEX_HEADS * N + 4 * HEADS * LATENT * K)
    t = measure_alternating({"dense": dense, "dsa": dsa}, reps=reps, warmup=1)
    bw, peak, dt = copy_bandwidth("cpu"), compute_peak("cpu", dtype), str(dtype).replace("torch.", "")
    shape = f"model=deepseek-v3.2-attention,B=1,N={N},T={T},topk={TOPK}"
    record(family="model", op="dsa_attention", backend="dense", shape=shape, dtype=dt, bytes_moved=dense_bytes,
           timing=t["dense"], bandwidth=bw, device="cpu", flops=dense_flops, peak=peak)
    record(family="model", op="dsa_attention", backend="cpu", shape=shape, dtype=dt, bytes_moved=dsa_bytes,
           timing=t["dsa"], bandwidth=bw, device="cpu", baseline="dense", baseline_timing=t["dense"],
           flops=dsa_flops, peak=peak)


def bench_scores(N: int, T: int, dtype: torch.dtype, reps: int) -> None:
    """The indexer's scores alone: ``triforce_C::index_scores`` against the ATen path (``linear`` over blocks of
    keys made float32, then ReLU, the head weights and their sum), the same scores within rounding."""
    from triforce.models import cache

    _, _, index_q, index_k, weights = _inputs(N, T, dtype)
    q, keys, scale = index_q.float(), index_k, INDEX_DIM ** -0.5
    native = cache._cache_op("index_scores", "TRIFORCE_INDEX_SCORES")  # (loads the extension)
    if native is None:
        raise SystemExit("bench_dsa: the extension's index_scores is not built (or TRIFORCE_INDEX_SCORES=0)")

    def ours():
        return torch.stack([native(q[b], keys[b], weights[b], scale) for b in range(q.shape[0])])

    def aten():
        saved = cache._CACHE_OPS.get("index_scores")
        cache._CACHE_OPS["index_scores"] = None  # (the path without the extension)
        try:
            return cache._index_scores(keys, q, weights, scale)
        finally:
            cache._CACHE_OPS["index_scores"] = saved
    a, b = ours(), aten()
    assert (a - b).abs().max().item() <= 1e-4 * b.abs().max().item()
    es = torch.finfo(dtype).bits // 8
    t = measure_alternating({"aten": aten, "cpu": ours}, reps=reps, warmup=1)
    bw, peak, dt = copy_bandwidth("cpu"), compute_peak("cpu", torch.float32), str(dtype).replace("torch.", "")
    shape = f"model=deepseek-v3.2-indexer,B=1,N={N},T={T}"
    nbytes, flops = N * INDEX_DIM * es, 2 * T * INDEX_HEADS * INDEX_DIM * N
    record(family="model", op="index_scores", backend="aten", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["aten"], bandwidth=bw, device="cpu", flops=flops, peak=peak)
    record(family="model", op="index_scores", backend="cpu", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["cpu"], bandwidth=bw, device="cpu", baseline="aten", baseline_timing=t["aten"], flops=flops,
           peak=peak)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="context 4K only, fewer repetitions")
    args = p.parse_args(argv)
    check()
    for dtype in (torch.float32, torch.bfloat16):
        for N in (4096,) if args.quick else (4096, 16384, 32768):
            for T in (1, 4):
                bench(N, T, dtype, reps=3 if args.quick else 5)
                bench_scores(N, T, dtype, reps=3 if args.quick else 5)


if __name__ == "__main__":
    main()
