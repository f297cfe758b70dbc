"""Benchmark of the recurrent layers' CPU kernels (docs/model.md, "Mamba-2", "Gated DeltaNet", the ``mamba`` row): a
step's state update and readout, ``cache.ssm_scan`` (``triforce_C::ssm_scan_``), ``cache.delta_scan``
(``triforce_C::delta_scan_``) and ``cache.selective_scan`` (``triforce_C::selective_scan_``), against the same functions
on PyTorch's ops (their fallback, token by token), side by side in one run.

Shapes: a Granite 4.0 H layer's Mamba-2 state (48 heads of 64 x 128, one group) and Qwen3.5's DeltaNet states
(0.8B: 16 key and 16 value heads of 128 x 128; 27B: 16 key and 48 value heads), Kimi Linear's KDA state (32 heads of
128 x 128, a decay per key channel), Mamba(-1)'s (mamba-2.8b: 5120 channels of 16), batch 1 and 4, T = 1 (a decode step)
and T = 5 (a verification pass). Each call takes the next of ``--states`` states (64 MB and more in all), so that its
state comes from memory, as a model's many layers' do. Bytes = the state read and written once + the step's inputs
read and outputs written (float32).

    python -m bench.bench_recurrent [--quick] [--layer kimi-linear]   # TRIFORCE_BENCH_CSV=/tmp/x.csv: repo clean
"""
import argparse
import itertools

import torch

import triforce.models.cache as cache_module

from .harness import copy_bandwidth, measure_alternating, record

FAMILY = "model"


def ssm_case(B, T, H, P, N, G, count, g):
    """(states, inputs, call(state)) of a Mamba-2 layer's step."""
    states = [torch.randn(B, H, P, N, generator=g) for _ in range(count)]
    x = torch.randn(B, T, H, P, generator=g)
    Bm, C = (torch.randn(B, T, G, N, generator=g) for _ in range(2))
    dt = torch.rand(B, T, H, generator=g) * 0.1
    decay = torch.exp(-dt)
    inputs = (x, Bm, C, dt, decay, torch.randn(H, generator=g))
    return states, inputs, lambda s: cache_module.ssm_scan(s, *inputs)


def delta_case(B, T, Hk, Hv, K, V, count, g, channel=False):
    """(states, inputs, call(state)) of a gated DeltaNet layer's step (``channel``: a decay per key channel, KDA's)."""
    states = [torch.randn(B, Hv, K, V, generator=g) for _ in range(count)]
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, Hk, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, Hv, V, generator=g)
    beta = torch.rand(B, T, Hv, generator=g)
    decay = torch.exp(-torch.rand((B, T, Hv, K) if channel else (B, T, Hv), generator=g) * 0.1)
    inputs = (q, k, v, beta, decay)
    return states, inputs, lambda s: cache_module.delta_scan(s, *inputs)


def kda_case(B, T, H, D, count, g):
    """(states, inputs, call(state)) of a Kimi Delta Attention layer's step: as many key as value heads, a decay per key
    channel."""
    return delta_case(B, T, H, H, D, D, count, g, channel=True)


def selective_case(B, T, D, N, count, g):
    """(states, inputs, call(state)) of a Mamba(-1) layer's step."""
    states = [torch.randn(B, D, N, generator=g) for _ in range(count)]
    x = torch.randn(B, T, D, generator=g)
    dt = torch.rand(B, T, D, generator=g) * 0.1
    A = -torch.rand(D, N, generator=g) - 0.5
    Bm, C = (torch.randn(B, T, N, generator=g) for _ in range(2))
    inputs = (x, dt, A, Bm, C)
    return states, inputs, lambda s: cache_module.selective_scan(s, *inputs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--states", type=int, default=24, help="states taken in turns (each call's from memory)")
    p.add_argument("--layer", action="append", help="only these layers (by name, e.g. kimi-linear); default all")
    a = p.parse_args()
    bw = copy_bandwidth("cpu")
    g = torch.Generator().manual_seed(0)
    cases = [("ssm_scan", "granite-4.0-h", (48, 64, 128, 1), ssm_case),
             ("delta_scan", "qwen3.5-0.8b", (16, 16, 128, 128), delta_case),
             ("delta_scan", "qwen3.5-27b", (16, 48, 128, 128), delta_case),
             ("delta_scan", "kimi-linear", (32, 128), kda_case),
             ("selective_scan", "mamba-2.8b", (5120, 16), selective_case)]
    cases = [c for c in cases if not a.layer or c[1] in a.layer]
    for (op, name, dims, make), B, T in itertools.product(cases, (1, 4), (1, 5)):
        states, inputs, call = make(B, T, *dims, a.states, g)
        turn = itertools.cycle(states)
        nbytes = 2 * states[0].numel() * 4 + sum(t.numel() * 4 for t in inputs) + inputs[0].numel() * 4

        def ours():
            call(next(turn))

        def pytorch():  # (the same function without the extension: its token-by-token fallback)
            kept = cache_module._cache_op
            cache_module._cache_op = lambda *_: None
            try:
                call(next(turn))
            finally:
                cache_module._cache_op = kept

        t = measure_alternating({"ours": ours, "pytorch": pytorch}, reps=10 if a.quick else 40)
        shape = f"layer={name},B={B},T={T}"
        record(family=FAMILY, op=op, backend="cpu", shape=shape, dtype="float32", bytes_moved=nbytes,
               timing=t["ours"], bandwidth=bw, baseline="pytorch-ops", baseline_timing=t["pytorch"])


if __name__ == "__main__":
    main()
