"""Benchmark of the chain and tree speculative samplers (docs/design.md 6): B x n x V grid, backend vs the
reference, bytes = reading target_probs [B, n+1, V] and draft_probs [B, n, V] once (float32; tree:
[B, T, V] each, T = 15-node binary tree); the roofline fraction says how close one call comes to
that one read at copy bandwidth (above 1 when rows after a rejection are never read). On a GPU, also
FlashInfer's published chain shapes (B=16, n=5, V=32000; B=32, n=8, V=128256) and, where the
``flashinfer`` package imports, its ``chain_speculative_sampling`` beside ours (it draws its own uniforms).

    TRIFORCE_BENCH_CSV=/tmp/bench.csv python -m bench.bench_sampling [--quick]
"""
import argparse

import torch

import triforce_kernels as tk
from bench.flashinfer_baselines import chain_sampler
from bench.harness import copy_bandwidth, measure, record
from triforce_kernels._backend import available_backends


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small grid (CI smoke run)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    Bs, ns, Vs = ((1, 8), (4,), (32000,)) if args.quick else ((1, 8, 64), (4, 8), (32000, 128256))
    # the Triton interpreter (CPU) is a correctness tool, not a contender: benchmark triton on GPUs only
    backends = [b for b in available_backends("chain_speculative_sample", dev)
                if b != "reference" and not (b == "triton" and dev.type == "cpu")]
    bw = copy_bandwidth(dev)
    g = torch.Generator(dev).manual_seed(0)
    grid = [(V, n, B) for V in Vs for n in ns for B in Bs]
    if dev.type == "cuda" and not args.quick:  # FlashInfer's published shapes of its chain sampler
        grid += [(32000, 5, 16), (128256, 8, 32)]
    flashinfer_chain = chain_sampler()
    for V, n, B in grid:
        p = torch.softmax(torch.randn(B, n + 1, V, device=dev, generator=g), -1)
        q = torch.softmax(torch.randn(B, n, V, device=dev, generator=g), -1)
        d = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, n)
        u = torch.rand(B, n + 1, 2, device=dev, generator=g)
        nbytes = (p.numel() + q.numel()) * 4
        base = measure(lambda: tk.chain_speculative_sample(d, q, p, u, backend="reference"), device=dev,
                       reps=5, min_time_s=0.05)
        shape = f"B={B},n={n},V={V}"
        record(family="sampling", op="chain_speculative_sample", backend="reference", shape=shape,
               dtype="float32", bytes_moved=nbytes, timing=base, bandwidth=bw, device=dev)
        for b in backends:
            t = measure(lambda: tk.chain_speculative_sample(d, q, p, u, backend=b), device=dev,
                        reps=10, min_time_s=0.05)
            acc = tk.chain_speculative_sample(d, q, p, u, backend=b)[1].float().mean().item()
            record(family="sampling", op="chain_speculative_sample", backend=b, shape=shape, dtype="float32",
                   bytes_moved=nbytes, timing=t, bandwidth=bw, device=dev, baseline="reference",
                   baseline_timing=base, extra=f"mean_accepted={acc:.2f}")
        if flashinfer_chain is not None:
            d32 = d.to(torch.int32)
            try:
                t = measure(lambda: flashinfer_chain(q, d32, p), device=dev, reps=10, min_time_s=0.05)
            except Exception as e:  # a baseline that fails must not stop the run
                print(f"flashinfer chain_speculative_sampling failed at {shape}: {type(e).__name__}: {e}")
            else:
                record(family="sampling", op="chain_speculative_sample", backend="flashinfer", shape=shape,
                       dtype="float32", bytes_moved=nbytes, timing=t, bandwidth=bw, device=dev,
                       baseline="reference", baseline_timing=base, extra="own uniforms (generator), not the caller's")
    tree_sample(dev, Bs, Vs, backends, bw, g)


def tree_sample(dev, Bs, Vs, backends, bw, g, T=15):
    """Complete binary tree of T nodes; each node's children drawn i.i.d. from its draft distribution."""
    parents = torch.tensor([-1] + [(t - 1) // 2 for t in range(1, T)], device=dev)
    for V in Vs:
        for B in Bs:
            p = torch.softmax(torch.randn(B, T, V, device=dev, generator=g), -1)
            q = torch.softmax(torch.randn(B, T, V, device=dev, generator=g), -1)
            par = parents.expand(B, T).contiguous()
            drawn = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, T)
            tt = torch.where(par >= 0, drawn.gather(1, par.clamp(min=0)), drawn)  # child ~ q[parent]
            u = torch.rand(B, T, 2, device=dev, generator=g)
            nbytes = (p.numel() + q.numel()) * 4
            shape = f"B={B},T={T},V={V}"
            base = measure(lambda: tk.tree_speculative_sample(tt, par, q, p, u, backend="reference"), device=dev,
                           reps=5, min_time_s=0.05)
            record(family="sampling", op="tree_speculative_sample", backend="reference", shape=shape,
                   dtype="float32", bytes_moved=nbytes, timing=base, bandwidth=bw, device=dev)
            for b in backends:
                t = measure(lambda: tk.tree_speculative_sample(tt, par, q, p, u, backend=b), device=dev,
                            reps=10, min_time_s=0.05)
                acc = tk.tree_speculative_sample(tt, par, q, p, u, backend=b)[2].float().mean().item()
                record(family="sampling", op="tree_speculative_sample", backend=b, shape=shape, dtype="float32",
                       bytes_moved=nbytes, timing=t, bandwidth=bw, device=dev, baseline="reference",
                       baseline_timing=base, extra=f"mean_accepted={acc:.2f}")


if __name__ == "__main__":
    main()
