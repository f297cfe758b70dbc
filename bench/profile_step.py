"""Where a decode step's time goes: one cached forward under ``torch.profiler``, its kernels by time.

    python -m bench.profile_step --device cuda --model smollm2-135m --batch 32 256 --context 264 4000
    python -m bench.profile_step --device cuda --model llama3-8b --batch 1 --context 4224 --tokens 3
    python -m bench.profile_step --device cuda --model smollm2-135m --batch 256 --context 256 --streaming
    python -m bench.profile_step --model tiny --batch 2 --context 64            # a smoke run on a CPU

A model of the named shape (bench/bench_levels.py's ``SHAPES``) with random weights, a full cache of
``--context`` random tokens, ``--tokens`` tokens per row (1: an autoregressive step), rolled back after
each call (``bench.harness.forward_step``); ``--streaming``: a full StreamingLLM cache instead, which
every step evicts from (MagicDec's draft step). On a GPU the step replays from its CUDA graph as the
engines' do (``--eager``: ``TRIFORCE_CUDA_GRAPHS=0``). Per shape it prints the step's wall time (CUDA events),
the summed time of its device kernels and their count, the memory-bound floor (weights + KV read
over the copy bandwidth measured in the run), and the top kernels (CPU ops on a CPU) by self time.
A wall time far above the kernels' sum is host-bound (launches, Python); kernels far above the floor
are slow kernels. ``--trace DIR`` writes a Chrome trace per shape.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.bench_levels import SHAPES, build  # noqa: E402
from bench.harness import copy_bandwidth, forward_step, measure  # noqa: E402
from triforce.demo import kv_bytes_per_token, weight_bytes  # noqa: E402
from triforce.models.hub import device_of  # noqa: E402


def streaming_step(model, batch: int, context: int, tokens: int):
    """A forward of ``tokens`` per row on a full StreamingLLM cache of ``context`` tokens (16 sinks): every
    call evicts (MagicDec's draft step)."""
    from triforce.models import StreamingCache
    dev = model.device
    cache = StreamingCache(model.config, batch, 16, context - 16, max_step=max(tokens, 6), device=dev,
                           dtype=model.dtype)
    with torch.no_grad():
        model.prefill(torch.randint(0, model.config.vocab_size, (batch, context + 8), device=dev), cache)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=dev)
    return lambda: model(ids, cache=cache)


def profile_shape(model, batch: int, context: int, tokens: int, top: int, reps: int, trace: str | None,
                  streaming: bool = False) -> dict:
    dev = model.device
    step = (streaming_step if streaming else forward_step)(model, batch, context, tokens)
    with torch.no_grad():
        wall = measure(step, device=dev, warmup=3, reps=reps)["median_s"]
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(reps):
                step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
    on_gpu = dev.type == "cuda"
    kernels = [e for e in prof.events() if on_gpu and e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_s = sum(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
                   for e in kernels) / 1e6 / reps if on_gpu else None
    floor = (weight_bytes(model) + batch * context * kv_bytes_per_token(model)) / copy_bandwidth(dev)
    sort = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    print(f"\nbatch {batch} x {context} tokens{' (StreamingLLM cache)' if streaming else ''}, {tokens} per row: "
          f"step {wall * 1e3:.3f} ms"
          + (f", kernels {kernel_s * 1e3:.3f} ms in {len(kernels) / reps:.0f} launches" if on_gpu else "")
          + f", memory-bound floor {floor * 1e3:.3f} ms")
    print(prof.key_averages().table(sort_by=sort, row_limit=top, max_name_column_width=60))
    if trace:
        os.makedirs(trace, exist_ok=True)
        prof.export_chrome_trace(os.path.join(trace, f"step_B{batch}_N{context}_T{tokens}"
                                              f"{'_streaming' if streaming else ''}.json"))
    return {"batch": batch, "context": context, "tokens": tokens, "streaming": streaming, "wall_ms": wall * 1e3,
            "kernel_ms": None if kernel_s is None else kernel_s * 1e3,
            "launches": len(kernels) / reps if on_gpu else None, "floor_ms": floor * 1e3}


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--batch", type=int, nargs="+", default=[32])
    ap.add_argument("--context", type=int, nargs="+", default=[4000])
    ap.add_argument("--tokens", type=int, default=1, help="tokens per row (1: an autoregressive step)")
    ap.add_argument("--device", default="auto", help="auto (the GPU when there is one), cpu, cuda or cuda:N")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (TRIFORCE_CUDA_GRAPHS=0)")
    ap.add_argument("--streaming", action="store_true",
                    help="on a full StreamingLLM cache of --context tokens (every step evicts: MagicDec's draft)")
    ap.add_argument("--top", type=int, default=20, help="kernels (ops) listed per shape")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--trace", default=None, help="write a Chrome trace per shape into this directory")
    a = ap.parse_args(argv)
    if a.eager:
        os.environ["TRIFORCE_CUDA_GRAPHS"] = "0"
    dev = device_of(a.device)
    torch.manual_seed(0)
    model = build(a.model, None, max(a.context) + max(a.tokens, 6) + 8, dev, getattr(torch, a.dtype))
    return [profile_shape(model, B, N, a.tokens, a.top, a.reps, a.trace, a.streaming)
            for B in a.batch for N in a.context]


if __name__ == "__main__":
    main()
