"""Benchmark of tk.chunk_mean_keys (docs/design.md 6): a whole-cache recompute per backend vs the
PyTorch reference, with bytes, GB/s and the fraction of measured copy bandwidth. (The model layer only
ever computes newly completed chunks; the whole cache is the prefill case.)

Bytes = the complete chunks of K read once (B * C * chunk_size * Hkv * D * itemsize) + the fp32 means
written (B * C * Hkv * D * 4).

    python -m bench.bench_chunk_mean_keys [--quick]   # TRIFORCE_BENCH_CSV=/tmp/x.csv to keep the repo clean
"""
import argparse

import torch

import triforce_kernels as tk
from triforce_kernels._backend import available_backends

from .harness import copy_bandwidth, measure, record

# The rows keep the family and shape strings they had in bench_retrieval (where this benchmark used
# to live, sharing its shapes), so that bench/results.csv compares them with the earlier runs.
FAMILY = "retrieval"


def bench_shape(device, B, N, Hq, Hkv, D, budget, chunk_size, dtype, backends):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B, N, Hkv, D, generator=g, dtype=torch.float32).to(dtype).to(device)
    C = N // chunk_size
    nbytes = B * C * chunk_size * Hkv * D * k.element_size() + B * C * Hkv * D * 4
    shape = f"B={B},N={N},Hq={Hq},Hkv={Hkv},D={D},budget={budget},chunk={chunk_size}"
    bw = copy_bandwidth(device)
    dt = str(dtype).replace("torch.", "")
    base = measure(lambda: tk.chunk_mean_keys(k, chunk_size, backend="reference"), device=device)
    record(family=FAMILY, op="chunk_mean_keys", backend="reference", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=base, bandwidth=bw, device=device)
    for b in backends:
        t = measure(lambda: tk.chunk_mean_keys(k, chunk_size, backend=b), device=device)
        record(family=FAMILY, op="chunk_mean_keys", backend=b, shape=shape, dtype=dt, bytes_moved=nbytes, timing=t,
               bandwidth=bw, device=device, baseline="reference", baseline_timing=base)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shape only")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (torch and the OpenMP kernels); 0 = default")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Triton on CPU is the interpreter (never benchmarked); on a GPU: triton and cuda where built.
    backends = [b for b in available_backends("chunk_mean_keys", device) if b != "reference"]
    if device.type == "cpu":
        backends = [b for b in backends if b != "triton"]
    # Hq and budget do not affect this op; they stay in the shape string (see FAMILY above).
    shapes = [dict(B=1, N=16384, Hq=32, Hkv=8, D=128, budget=1024, chunk_size=8)]
    if not a.quick:
        shapes.append(dict(B=1, N=131072, Hq=32, Hkv=8, D=128, budget=4096, chunk_size=8))
    for s in shapes:
        bench_shape(device, dtype=torch.bfloat16, backends=backends, **s)


if __name__ == "__main__":
    main()
