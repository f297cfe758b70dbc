"""Benchmark harness (docs/design.md 6): medians with spread, bytes and GB/s, fraction of the measured
copy bandwidth, baseline side by side; rows appended to a CSV with device, versions, date, commit.
An op whose arithmetic can outweigh its bytes (attention over many query rows, a many-row linear)
also records its useful FLOPs and the compute ceiling measured in the same run (a matmul in the
op's dtype, ``compute_peak``): the row then says which ceiling binds and how close the op is to it
(``bound_frac`` = the larger of bytes / copy bandwidth and FLOPs / peak, over the measured time).

    from bench.harness import measure, copy_bandwidth, compute_peak, record
    bw = copy_bandwidth(device)                       # bytes/s, measured in this run
    peak = compute_peak(device, torch.bfloat16)       # FLOP/s of a matmul, measured in this run
    t = measure(lambda: op(x))                        # {"median_s", "p10_s", "p90_s", "reps"}
    base = measure(lambda: reference(x))
    record(family="attention", op="verify_attention", backend="cpu", shape="B=1,N=32768,T=16",
           dtype="bfloat16", bytes_moved=nbytes, timing=t, bandwidth=bw, flops=nflops, peak=peak,
           baseline="reference", baseline_timing=base)

CSV path: $TRIFORCE_BENCH_CSV or bench/results.csv.
"""
from __future__ import annotations

import csv
import datetime
import os
import platform
import statistics
import subprocess
import time
from typing import Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ["date", "commit", "device", "torch", "triton", "family", "op", "backend", "shape", "dtype",
          "median_us", "p10_us", "p90_us", "bytes", "gbps", "copy_gbps", "roofline_frac",
          "baseline", "baseline_us", "speedup", "extra", "flops", "gflops", "peak_gflops", "compute_frac",
          "bound_frac"]


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {cpu} x{torch.get_num_threads()} threads"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], *, device: torch.device | str = "cpu", warmup: int = 3,
            reps: int = 20, min_time_s: float = 0.2, max_reps: int = 1000, flush_l2: bool = True) -> dict:
    """Median and 10/90th percentiles of ``fn()``'s wall time. On CUDA: CUDA events per call and the
    L2 cache flushed (a 256 MB write) before each call, so every call reads its inputs from HBM."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    if device.type == "cuda":
        flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if flush_l2 else None
        start_total = time.perf_counter()
        while len(times) < reps or (time.perf_counter() - start_total < min_time_s and len(times) < max_reps):
            if flush is not None:
                flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
    else:
        start_total = time.perf_counter()
        while len(times) < reps or (time.perf_counter() - start_total < min_time_s and len(times) < max_reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return _summary(times)


def _summary(times: list[float]) -> dict:
    """Median and 10/90th percentiles of wall times (``measure``'s result format)."""
    times = sorted(times)
    q = lambda p: times[min(len(times) - 1, int(p * len(times)))]
    return {"median_s": statistics.median(times), "p10_s": q(0.1), "p90_s": q(0.9), "reps": len(times)}


def measure_alternating(fns: dict[str, Callable[[], object]], *, warmup: int = 3, reps: int = 20) -> dict[str, dict]:
    """CPU: ``measure`` for several variants of one computation, run in turns (a, b, a, b, ...) so that a
    drift of the machine's speed during the run (a shared VM's) reaches every variant alike.
    -> ``{name: timing}`` in ``measure``'s format."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: _summary(ts) for name, ts in times.items()}


_BW: dict[str, float] = {}
_PEAK: dict[tuple, float] = {}


def forward_step(model, batch: int, length: int, T: int) -> Callable[[], object]:
    """One cached forward of ``T`` tokens per row over a full cache that holds ``length`` tokens (random
    keys and values: the attention reads them all the same), rolled back after each call so that every
    call sees the same cache. On the model's device and in its dtype."""
    from triforce.models.cache import FullCache
    dev = model.device
    cache = FullCache(model.config, batch, length + T, device=dev, dtype=model.dtype)
    for layer in range(cache.num_layers):
        cache.k[layer].normal_()
        cache.v[layer].normal_()
    base = torch.full((batch,), length, dtype=torch.int32, device=dev)
    cache.lengths.copy_(base)
    if cache.recurrent is not None:  # (its recurrent layers' states taken as at that length: zeros, like its keys
        # random)
        cache.ssm_at.copy_(base)
    ids = torch.randint(0, model.config.vocab_size, (batch, T), device=dev)

    def step():
        model(ids, cache=cache)
        cache.rollback(base)
        cache.tighten_bound(length)  # the lengths are known: no capacity check reads them
    return step


def forward_time(model, batch: int, length: int, T: int, **measure_kw) -> dict:
    """``measure`` (``measure_kw``) of ``forward_step(model, batch, length, T)``."""
    return measure(forward_step(model, batch, length, T), device=model.device, **measure_kw)


def last_level_cache_bytes() -> int:
    """The size of this CPU's largest cache in bytes (sysfs; 32 MiB where it cannot be read)."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=32 * 2**20)


def streamed(items: list, item_bytes: int, copy: Callable[[object], object]) -> Callable[[], list]:
    """``next_set()``: ``items`` and copies of them (``copy(item)``), enough sets that they hold at least twice
    the last-level cache, given in turn, so that a benchmark call over one set reads it from memory however
    large that cache is (a 300 MB L3 holds 64 MLP-sized matrices of any format)."""
    total = max(1, len(items) * item_bytes)
    sets = [items] + [[copy(x) for x in items] for _ in range(-(-2 * last_level_cache_bytes() // total) - 1)]
    state = {"i": 0}

    def next_set() -> list:
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]

    return next_set


def copy_bandwidth(device: torch.device | str = "cpu", nbytes: int = 512 * 2**20) -> float:
    """Measured copy bandwidth in bytes/s (read + write bytes of a large ``copy_``), once per run."""
    device = torch.device(device)
    key = str(device)
    if key not in _BW:
        if device.type == "cpu":
            nbytes = min(nbytes, 256 * 2**20)
        src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
        dst = torch.empty_like(src)
        t = measure(lambda: dst.copy_(src), device=device, warmup=3, reps=10, flush_l2=False)
        _BW[key] = 2 * nbytes / t["median_s"]
    return _BW[key]


def compute_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """Measured FLOP/s of a square ``torch.mm`` in ``dtype`` (CPU: 1024, with the current thread count;
    CUDA: 8192), once per run: the compute ceiling that a tuned matmul reaches on this device, the
    counterpart of ``copy_bandwidth`` for ops whose multiply-adds can outweigh their bytes."""
    device = torch.device(device)
    key = (str(device), str(dtype), torch.get_num_threads() if device.type == "cpu" else 0)
    if key not in _PEAK:
        n = 1024 if device.type == "cpu" else 8192
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=g).to(dtype).to(device) for _ in range(2))
        t = measure(lambda: torch.mm(a, b), device=device, warmup=2, reps=5, min_time_s=0.0, flush_l2=False)
        _PEAK[key] = 2 * n ** 3 / t["median_s"]
    return _PEAK[key]


def _versions() -> tuple[str, str]:
    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = ""
    return torch.__version__, tv


def _commit() -> str:
    """$TRIFORCE_COMMIT if set (a copied checkout whose .git is not the code's), else git's HEAD, with
    "+dirty" when tracked files differ from it (the numbers are then of code no commit holds)."""
    if os.environ.get("TRIFORCE_COMMIT"):
        return os.environ["TRIFORCE_COMMIT"]
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        dirty = git("status", "--porcelain", "--untracked-files=no").strip()
        return git("rev-parse", "--short", "HEAD").strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return ""


def record(*, family: str, op: str, backend: str, shape: str, dtype: str, timing: dict,
           bytes_moved: int | None = None, bandwidth: float | None = None, device: torch.device | str = "cpu",
           baseline: str = "", baseline_timing: dict | None = None, extra: str = "",
           flops: float | None = None, peak: float | None = None, csv_path: str | None = None) -> dict:
    """Append one result row to the CSV and print it. ``bandwidth`` is copy_bandwidth(device); ``flops``
    the op's useful floating-point operations (a multiply-add counts 2) and ``peak`` compute_peak(device,
    dtype), for ops whose arithmetic can outweigh their bytes."""
    tv, trv = _versions()
    med = timing["median_s"]
    gbps = bytes_moved / med / 1e9 if bytes_moved else None
    # time at each ceiling; bound_frac: the binding (larger) one over the measured time
    floors = [x for x in ((bytes_moved / bandwidth) if bytes_moved and bandwidth else None,
                          (flops / peak) if flops and peak else None) if x is not None]
    row = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _commit(),
        "device": device_name(device), "torch": tv, "triton": trv, "family": family, "op": op,
        "backend": backend, "shape": shape, "dtype": dtype,
        "median_us": f"{med * 1e6:.2f}", "p10_us": f"{timing['p10_s'] * 1e6:.2f}",
        "p90_us": f"{timing['p90_s'] * 1e6:.2f}", "bytes": bytes_moved or "",
        "gbps": f"{gbps:.2f}" if gbps else "", "copy_gbps": f"{bandwidth / 1e9:.2f}" if bandwidth else "",
        "roofline_frac": f"{gbps * 1e9 / bandwidth:.3f}" if gbps and bandwidth else "",
        "baseline": baseline,
        "baseline_us": f"{baseline_timing['median_s'] * 1e6:.2f}" if baseline_timing else "",
        "speedup": f"{baseline_timing['median_s'] / med:.2f}" if baseline_timing else "",
        "extra": extra,
        "flops": f"{flops:.0f}" if flops else "", "gflops": f"{flops / med / 1e9:.2f}" if flops else "",
        "peak_gflops": f"{peak / 1e9:.2f}" if peak else "",
        "compute_frac": f"{flops / med / peak:.3f}" if flops and peak else "",
        "bound_frac": f"{max(floors) / med:.3f}" if floors else "",
    }
    path = csv_path or os.environ.get("TRIFORCE_BENCH_CSV") or os.path.join(ROOT, "bench", "results.csv")
    new = not os.path.exists(path)
    if not new:
        _upgrade_header(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerow(row)
    comp = f"  {row['gflops']} GFLOP/s  peak {row['compute_frac']}" if flops else ""
    print(f"{op:<24} {backend:<9} {shape:<40} {dtype:<9} {row['median_us']:>10} us  "
          f"{row['gbps'] or '-':>8} GB/s  roof {row['roofline_frac'] or '-':>6}{comp}  "
          f"vs {baseline or '-'} x{row['speedup'] or '-'}", flush=True)
    return row


def _upgrade_header(path: str) -> None:
    """A CSV written before columns were added to FIELDS (at its end) gets the current header; its old
    rows keep their fields and read the new columns as empty."""
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if header is None or header == FIELDS:
        return
    if header != FIELDS[: len(header)]:
        raise ValueError(f"{path}: its columns {header} are not a prefix of bench.harness.FIELDS; write to a new "
                         f"file (TRIFORCE_BENCH_CSV)")
    with open(path, newline="") as f:
        text = f.read()
    with open(path, "w", newline="") as f:
        csv.writer(f).writerow(FIELDS)
        f.write(text[text.index("\n") + 1:])
