"""Retrieval-cache benchmark (docs/design.md 6): build_retrieval_cache (and its parts) per backend vs the PyTorch
reference, with bytes, GB/s and the fraction of measured copy bandwidth.

Bytes of build_retrieval_cache = chunk keys read once (C * Hkv * D * 4, fp32) + the gathered K and V
read and written (2 tensors x 2 directions x budget * Hkv * D * itemsize). The query (Hq * D) and the
indices are negligible.

    python -m bench.bench_retrieval [--quick]        # TRIFORCE_BENCH_CSV=/tmp/x.csv to keep the repo clean
"""
import argparse

import torch

import triforce_kernels as tk
from triforce_kernels._backend import available_backends

from .flashinfer_baselines import top_k
from .harness import copy_bandwidth, measure, record

FAMILY = "retrieval"


def bench_shape(device, B, N, Hq, Hkv, D, budget, chunk_size, dtype, backends):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B, N, Hkv, D, generator=g, dtype=torch.float32).to(dtype).to(device)
    v = torch.randn(B, N, Hkv, D, generator=g, dtype=torch.float32).to(dtype).to(device)
    q = torch.randn(B, Hq, D, generator=g, dtype=torch.float32).to(dtype).to(device)
    chunk_keys = tk.chunk_mean_keys(k, chunk_size)
    C = chunk_keys.shape[1]
    num_chunks = torch.full((B,), C, dtype=torch.int32, device=device)
    budget_chunks = budget // chunk_size
    out_k = torch.zeros(B, budget, Hkv, D, dtype=dtype, device=device)
    out_v = torch.zeros_like(out_k)
    isz = k.element_size()
    shape = f"B={B},N={N},Hq={Hq},Hkv={Hkv},D={D},budget={budget},chunk={chunk_size}"
    bw = copy_bandwidth(device)

    def build(backend):
        return lambda: tk.build_retrieval_cache(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k,
                                                out_v, 1, 0, backend=backend)

    scores = tk.score_chunks(q, chunk_keys, num_chunks, backend="reference")
    idx = tk.select_chunks(scores, num_chunks, budget_chunks, backend="reference")
    ops = {  # chunk_mean_keys, which makes chunk_keys, has its own benchmark: bench_chunk_mean_keys.py
        "build_retrieval_cache": (build, B * C * Hkv * D * 4 + 4 * B * budget * Hkv * D * isz),
        "score_chunks": (lambda b: lambda: tk.score_chunks(q, chunk_keys, num_chunks, backend=b),
                         B * C * Hkv * D * 4 + B * Hkv * C * 4),
        "select_chunks": (lambda b: lambda: tk.select_chunks(scores, num_chunks, budget_chunks, backend=b),
                          B * Hkv * C * 4 + B * Hkv * budget_chunks * 4),
        "gather_chunks": (lambda b: lambda: tk.gather_chunks(k, v, idx, chunk_size, out_k, out_v, backend=b),
                          4 * B * budget * Hkv * D * isz),
    }
    dname = str(dtype).replace("torch.", "")
    for op, (make, nbytes) in ops.items():
        base = measure(make("reference"), device=device)
        record(family=FAMILY, op=op, backend="reference", shape=shape, dtype=dname,
               bytes_moved=nbytes, timing=base, bandwidth=bw, device=device)
        for b in backends:
            t = measure(make(b), device=device)
            record(family=FAMILY, op=op, backend=b, shape=shape, dtype=dname,
                   bytes_moved=nbytes, timing=t, bandwidth=bw, device=device, baseline="reference",
                   baseline_timing=base)
    # the selection's plain top-k baselines: the budget's chunks over every chunk of every (row, KV head),
    # without the sink / recent / length rules (so a lower bound on what select_chunks must do)
    flat = scores.reshape(B * Hkv, C)
    plain = {"torch.topk": lambda: torch.topk(flat, budget_chunks, sorted=False)}
    fi = top_k() if device.type == "cuda" else None
    if fi is not None:
        plain["flashinfer"] = lambda: fi(flat, budget_chunks)
    for name, fn in plain.items():
        record(family=FAMILY, op="select_chunks", backend=name, shape=shape, dtype=dname,
               bytes_moved=ops["select_chunks"][1], timing=measure(fn, device=device), bandwidth=bw, device=device,
               extra="plain top-k of the budget over every chunk: no sink / recent / length rules")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shape only")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (torch and the OpenMP kernels); 0 = default")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Triton on CPU is the interpreter (never benchmarked); on a GPU: triton and cuda where built.
    backends = [b for b in available_backends("build_retrieval_cache", device) if b != "reference"]
    if device.type == "cpu":
        backends = [b for b in backends if b != "triton"]
    shapes = [dict(B=1, N=16384, Hq=32, Hkv=8, D=128, budget=1024, chunk_size=8)]
    if not a.quick:
        # the large shape: Llama-3-8B-like heads, 128K context, 4096-token budget, chunk 8
        shapes.append(dict(B=1, N=131072, Hq=32, Hkv=8, D=128, budget=4096, chunk_size=8))
    for s in shapes:
        bench_shape(device, dtype=torch.bfloat16, backends=backends, **s)


if __name__ == "__main__":
    main()
