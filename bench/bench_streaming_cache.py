"""The StreamingLLM cache's cost per forward, against a full cache holding the same tokens (no eviction).

A decode step of SmolLM2 on a ``StreamingCache`` (sink + window, full, so every forward evicts) is timed
against the same step on a ``FullCache`` holding ``sink + window`` tokens: the difference is what eviction
costs. Also the cache's own per-forward bookkeeping (``begin`` + ``end``, no model) on both. Rows in
bench/results.csv (family ``streaming``); docs/model.md (``StreamingCache``).

    python -m bench.bench_streaming_cache [--batch 1 4] [--dtype float32 bfloat16] [--threads 1]
"""
from __future__ import annotations

import argparse
import json

import torch

import triforce
from triforce.engines.drafters import half_precision_copy
from triforce.models import FullCache, StreamingCache

from .harness import measure, record


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--sink", type=int, default=16)
    ap.add_argument("--window", type=int, default=240)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1; 0 = leave as is)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    target, _ = triforce.models.smollm2_135m()
    models = {"float32": target, "bfloat16": half_precision_copy(target)}
    keep = a.sink + a.window
    for dtype in a.dtype:
        model = models[dtype]
        for B in a.batch:
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(0, 1000, (B, keep + 50), generator=g)
            ids = torch.randint(0, 1000, (B, 1), generator=g)
            stream = StreamingCache(model.config, B, a.sink, a.window, max_step=6, dtype=model.dtype)
            model.prefill(prompt, stream)  # longer than sink + window: every later forward evicts one token
            full = FullCache(model.config, B, keep + 8, dtype=model.dtype)
            model.prefill(prompt[:, :keep], full)

            def full_step():
                model(ids, cache=full)
                full.rollback(full.lengths - 1)  # stays at sink + window tokens

            def full_bookkeeping():
                full.end(full.begin(1))
                full.rollback(full.lengths - 1)

            def stream_bookkeeping():
                stream.end(stream.begin(1))

            shape = f"model=smollm2-135m,B={B},sink={a.sink},window={a.window},T=1"
            extra = json.dumps({"threads": torch.get_num_threads()})
            for op, fn, base in (("streaming_step", lambda: model(ids, cache=stream), full_step),
                                 ("streaming_begin_end", stream_bookkeeping, full_bookkeeping)):
                t = measure(fn, warmup=3, reps=20)
                tb = measure(base, warmup=3, reps=20)
                record(family="streaming", op=op, backend="auto", shape=shape, dtype=dtype, timing=t,
                       baseline="full cache, same tokens", baseline_timing=tb, extra=extra)


if __name__ == "__main__":
    main()
