"""Benchmark tk.verify_attention (docs/design.md 6): time, GB/s (bytes = K/V up to L read once + q + out),
fraction of measured copy bandwidth, GFLOP/s (FLOPs = 4 x D per query head and visible key: Q K^T and
P V, masked keys not counted) and the fraction of a matmul's peak in the same dtype (both ceilings
measured in the same run), and the baselines side by side: the PyTorch reference and
PyTorch SDPA with an explicit boolean mask; on a GPU, FlashInfer's append attention (causal, and the tree
as its custom mask) where the ``flashinfer`` package imports, and flash-attn's flash_attn_with_kvcache
(causal only) where it is installed. Each kind's baseline ("vs") is the fastest of these that computes it.

    TRIFORCE_BENCH_CSV=/tmp/bench.csv python -m bench.bench_verify_attention            # CPU: B=1, N=32K subset
    python -m bench.bench_verify_attention --device cuda                                 # the full shape grid (all on GPU)
    python -m bench.bench_verify_attention --model-shapes                                # the CPU engines' fp32 shapes
    python -m bench.bench_verify_attention --window 4096                                 # a sliding window
    python -m bench.bench_verify_attention --softcap 50                                  # Gemma 2's capped scores
    python -m bench.bench_verify_attention --leftpad 16384                               # every row from a start
    python -m bench.bench_verify_attention --alibi                                       # BLOOM's ALiBi slopes

With ``--window W`` every row runs ``window=W`` (each query sees its last W keys): bytes = the K/V a pass reads
(W + T - 1 positions); the baselines are SDPA with the windowed mask, flash-attn's ``window_size=(W - 1, 0)``
on a GPU, and ``nowindow``: our kernel without a window over a cache of just those W + T - 1 positions (the
same bytes: what the window should cost). With ``--softcap C`` every row of ours caps its scores (``C tanh(s /
C)``, Gemma 2's) and ``nocap`` is the same call without the cap, side by side: what the cap costs. With
``--leftpad S`` every row starts at position S (``cache_leftpad``): bytes = the positions read, the baselines
SDPA with that mask and ``cut``: our kernel over a cache of just those positions (what the start should cost).
With ``--alibi`` every row of ours adds ALiBi's bias (BLOOM's slopes for Hq heads); the baselines are SDPA with the
bias as a float mask (``sdpa_bias``: [B, Hq, T, N] floats, as transformers' BLOOM builds it) and ``noalibi``, the same
call without the bias (with ``--softcap`` too: without either): what the bias costs.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import triforce_kernels as tk
from bench.flashinfer_baselines import append_attention
from bench.harness import compute_peak, copy_bandwidth, measure, record
from triforce_kernels._backend import implementation
from triforce_kernels.reference.verify_attention import visibility


def _inputs(B, N, Hq, Hkv, D, T, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, T, Hq, D, generator=g).to(dtype).to(device)
    k = torch.randn(B, N, Hkv, D, generator=g).to(dtype).to(device)
    v = torch.randn(B, N, Hkv, D, generator=g).to(dtype).to(device)
    lens = torch.full((B,), N, dtype=torch.int32, device=device)
    parents = torch.tensor([-1] + [(t - 1) // 2 for t in range(1, T)]).expand(B, T)  # binary tree
    return q, k, v, lens, tk.tree_attention_mask(parents).to(device)


def _sdpa(q, k, v, vis):
    # Explicit mask [B, 1, T, N]; GQA through enable_gqa (no K/V copy). The mask is built once per step.
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=vis[:, None], enable_gqa=True).transpose(1, 2)


# The CPU engines' own shapes (float32 caches): SmolLM2-135M (9 query / 3 KV heads of 64) at the demo's
# batch x context, Qwen2.5-Coder-1.5B (12 / 2 heads of 128) at bench/bench_pair.py's; T = 1 (a decode
# step), 5 and 9 (verifying gamma 4 / 8 drafts).
MODEL_SHAPES = [(8, 6144, 9, 3, 64), (2, 4096, 12, 2, 128), (1, 16384, 12, 2, 128)]


def run(device: str, full: bool, backends: list[str], quick: bool = False, model_shapes: bool = False,
        only: tuple = (None, None, None), window: int | None = None, softcap: float | None = None,
        leftpad: int | None = None, alibi: bool = False) -> None:
    dev = torch.device(device)
    bw = copy_bandwidth(dev)
    cpu = dev.type == "cpu"
    reps = dict(warmup=1, reps=10 if model_shapes else 3, min_time_s=0.0) if cpu else {}
    if model_shapes:
        grid = [(B, N, Hq, Hkv, D, torch.float32, T) for B, N, Hq, Hkv, D in MODEL_SHAPES for T in (1, 5, 9)]
    else:
        Bs, Ns = ((1, 8), (32768, 131072)) if full else ((1,), (32768,))
        Ts = (1, 16) if quick else (1, 7, 16, 64)
        Bs, Ns, Ts = (o or d for o, d in zip(only, (Bs, Ns, Ts)))
        grid = [(B, N, 32, 8, 128, torch.bfloat16, T) for B in Bs for N in Ns for T in Ts]
    try:
        from flash_attn import flash_attn_with_kvcache  # optional, GPU only
    except ImportError:
        flash_attn_with_kvcache = None
    for B, N, Hq, Hkv, D, dtype, T in grid:
        dname = str(dtype).replace("torch.", "")
        q, k, v, lens, tree = _inputs(B, N, Hq, Hkv, D, T, dtype, dev)
        lp = None if leftpad is None else torch.full_like(lens, leftpad)
        seen = N - (leftpad or 0) if window is None else min(N - (leftpad or 0), window + T - 1)  # positions read
        nbytes = 2 * B * seen * Hkv * D * k.element_size() + 2 * q.numel() * q.element_size()
        shape = (f"B={B},N={N},Hq={Hq},Hkv={Hkv},D={D},T={T}" + ("" if window is None else f",W={window}")
                 + ("" if leftpad is None else f",S={leftpad}"))
        win = ("" if window is None else f", window {window}") + ("" if leftpad is None else f", from {leftpad}")
        capped = ("" if softcap is None else f", softcap {softcap}") + (", alibi" if alibi else "")  # (ours only)
        slopes = _bloom_slopes(Hq).to(dev) if alibi else None
        vis = visibility(lens, T, N, None, window, lp)
        peak = compute_peak(dev, dtype)
        flops = {kind: 4 * D * Hq * int(visibility(lens, T, N, mask, window, lp).sum()) for kind, mask in
                 (("causal", None), ("tree", tree))}  # useful multiply-adds x 2: Q K^T and P V per visible key
        sdpa_t = measure(lambda: _sdpa(q, k, v, vis), device=dev, **reps)
        record(family="attention", op="verify_attention", backend="sdpa", shape=shape, dtype=dname,
               bytes_moved=nbytes, timing=sdpa_t, bandwidth=bw, device=dev, extra="explicit mask, causal" + win,
               flops=flops["causal"], peak=peak)
        base, base_name = sdpa_t, "sdpa"
        if alibi:  # the bias written out as a float mask (its bytes not counted: ours never builds it)
            bias = _alibi_mask(vis, slopes, T, N, q.dtype)
            sdpa_b = measure(lambda: F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias,
                enable_gqa=True).transpose(1, 2), device=dev, **reps)
            record(family="attention", op="verify_attention", backend="sdpa_bias", shape=shape, dtype=dname,
                   bytes_moved=nbytes, timing=sdpa_b, bandwidth=bw, device=dev,
                   extra="ALiBi as a float mask [B, Hq, T, N], causal" + win, flops=flops["causal"], peak=peak)
            base, base_name = sdpa_b, "sdpa_bias"
            del bias
        if flash_attn_with_kvcache is not None and not cpu and leftpad is None:
            fa_window = (-1, -1) if window is None else (window - 1, 0)
            fa = measure(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True,
                                                         window_size=fa_window), device=dev)
            record(family="attention", op="verify_attention", backend="flash_attn", shape=shape,
                   dtype=dname, bytes_moved=nbytes, timing=fa, bandwidth=bw, device=dev, extra="causal" + win,
                   flops=flops["causal"], peak=peak)
            if fa["median_s"] < base["median_s"]:
                base, base_name = fa, "flash_attn"
        if cpu and B * N <= 32768:
            ref = measure(lambda: tk.verify_attention(q, k, v, lens, backend="reference", window=window,
                                                      cache_leftpad=lp), device=dev, **reps)
            record(family="attention", op="verify_attention", backend="reference", shape=shape,
                   dtype=dname, bytes_moved=nbytes, timing=ref, bandwidth=bw, device=dev, extra="causal" + win,
                   flops=flops["causal"], peak=peak)
            if ref["median_s"] < base["median_s"]:
                base, base_name = ref, "reference"
        bases = {"causal": (base, base_name), "tree": (base, base_name)}
        if (window is not None or leftpad) and seen < N:  # the same bytes in a cache of those positions alone: what
            kw, vw, lw = k[:, N - seen:], v[:, N - seen:], torch.full_like(lens, seen)  # the window / start should cost
            for kind, mask in (("causal", None), ("tree", tree)):
                t = measure(lambda: tk.verify_attention(q, kw, vw, lw, mask, backend=backends[0]), device=dev,
                            **reps)
                record(family="attention", op="verify_attention", backend="nowindow" if window else "cut",
                       shape=f"{shape},{kind}", dtype=dname, bytes_moved=nbytes, timing=t, bandwidth=bw, device=dev,
                       extra=f"{kind}, {backends[0]} over a cache of the {seen} positions the pass reads",
                       flops=flops[kind], peak=peak)
        for kind, mask in (() if cpu or window is not None or leftpad else (("causal", None), ("tree", tree))):
            fi = _flashinfer(q, k, v, lens, mask, kind, shape, dev)
            if fi is None:
                continue
            record(family="attention", op="verify_attention", backend="flashinfer", shape=f"{shape},{kind}",
                   dtype=dname, bytes_moved=nbytes, timing=fi, bandwidth=bw, device=dev, extra=f"{kind}, fa2",
                   flops=flops[kind], peak=peak)
            if fi["median_s"] < base["median_s"]:
                bases[kind] = (fi, "flashinfer")
        for be in backends:
            for kind, mask in (("causal", None), ("tree", tree)):
                if softcap is not None or alibi:  # the same call without the cap and the bias, just before
                    t = measure(lambda: tk.verify_attention(q, k, v, lens, mask, backend=be, window=window,
                                                            cache_leftpad=lp), device=dev, **reps)
                    plain = "noalibi" if softcap is None else "nocap" if not alibi else "nocap_noalibi"
                    record(family="attention", op="verify_attention", backend=plain, shape=f"{shape},{kind}",
                           dtype=dname, bytes_moved=nbytes, timing=t, bandwidth=bw, device=dev,
                           extra=f"{kind}, {be} without{capped[1:]}", flops=flops[kind], peak=peak)
                t = measure(lambda: tk.verify_attention(q, k, v, lens, mask, backend=be, window=window,
                                                        softcap=softcap, cache_leftpad=lp, alibi_slopes=slopes),
                            device=dev, **reps)
                record(family="attention", op="verify_attention", backend=be, shape=f"{shape},{kind}", dtype=dname,
                       bytes_moved=nbytes, timing=t, bandwidth=bw, device=dev, baseline=bases[kind][1],
                       baseline_timing=bases[kind][0], extra=kind + win + capped, flops=flops[kind], peak=peak)
                if be == "triton" and not cpu and window is None and leftpad is None:  # the other T-independent
                    # row block, side by side
                    rows16 = implementation("verify_attention", "triton")
                    t = measure(lambda: rows16(q, k, v, lens, mask, D ** -0.5, block_rows=16), device=dev)
                    record(family="attention", op="verify_attention", backend="triton_rows16",
                           shape=f"{shape},{kind}", dtype=dname, bytes_moved=nbytes, timing=t, bandwidth=bw,
                           device=dev, baseline=bases[kind][1], baseline_timing=bases[kind][0],
                           extra=f"{kind}, 16-row blocks", flops=flops[kind], peak=peak)
        del q, k, v, vis


def _bloom_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slopes for ``heads`` heads, as BLOOM builds them (float32)."""
    from triforce.models.config import alibi_slopes

    return torch.tensor(alibi_slopes("bloom", heads), dtype=torch.float32)


def _alibi_mask(vis, slopes, T, N, dtype):
    """[B, Hq, T, N] in ``dtype``: ``slope * (k_pos - q_pos)`` where a causal query sees a key, -inf elsewhere."""
    B = vis.shape[0]
    dist = (torch.arange(N, device=vis.device)[None, :] - (N - T + torch.arange(T, device=vis.device))[:, None])
    bias = slopes.view(1, -1, 1, 1) * dist.to(torch.float32)[None, None]
    return bias.masked_fill(~vis[:, None], float("-inf")).to(dtype).expand(B, -1, -1, -1)


def _flashinfer(q, k, v, lens, mask, kind, shape, dev):
    """FlashInfer's append attention at this shape, timed, once its output has matched ours; else None."""
    B, T, Hq, D = q.shape
    N = k.shape[1]
    try:
        run = append_attention(q, k, v, None if mask is None else visibility(lens, T, N, mask), causal=mask is None)
        if run is None:
            return None
        ours = tk.verify_attention(q, k, v, lens, mask).float()
        err = (run().view(B, T, Hq, D).float() - ours).abs().max().item()
        if not err <= 0.02 * ours.abs().max().item():  # beyond bf16 rounding: another semantics, not a timing
            print(f"flashinfer append attention at {shape},{kind}: max |difference| {err:.3g}; not recorded")
            return None
        return measure(run, device=dev)
    except Exception as e:  # a baseline that fails must not stop the run
        print(f"flashinfer append attention failed at {shape},{kind}: {type(e).__name__}: {e}")
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--full", action="store_true", help="the full shape grid (B=1/8, N=32K/128K); default B=1, N=32K")
    ap.add_argument("--backends", default=None, help="comma list; default: cpu on CPU, triton on CUDA")
    ap.add_argument("--quick", action="store_true", help="T in {1, 16} only")
    ap.add_argument("--model-shapes", action="store_true",
                    help="the CPU engines' float32 shapes (SmolLM2-135M, Qwen2.5-Coder-1.5B) instead of the grid")
    ints = lambda text: tuple(int(x) for x in text.split(","))
    ap.add_argument("--batch", type=ints, default=None, help="only these batch sizes (comma list) of the grid")
    ap.add_argument("--context", type=ints, default=None, help="only these cache lengths N (comma list)")
    ap.add_argument("--widths", type=ints, default=None, help="only these query counts T (comma list)")
    ap.add_argument("--window", type=int, default=None, help="a sliding window of this many keys on every row")
    ap.add_argument("--softcap", type=float, default=None, help="soft-cap every score at this value (Gemma 2)")
    ap.add_argument("--leftpad", type=int, default=None, help="every row starts at this position (cache_leftpad)")
    ap.add_argument("--alibi", action="store_true", help="ALiBi's bias on every row (BLOOM's slopes)")
    a = ap.parse_args()
    backends = a.backends.split(",") if a.backends else (["cpu"] if a.device == "cpu" else ["triton"])
    run(a.device, a.full or a.device == "cuda", backends, a.quick, a.model_shapes, (a.batch, a.context, a.widths),
        a.window, a.softcap, a.leftpad, a.alibi)


if __name__ == "__main__":
    main()
