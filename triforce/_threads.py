"""CPU threads: one deliberate count for torch's intra-op pool and the C++ extension's OpenMP loops, and
OpenMP threads that sleep instead of spinning between parallel regions.

Both knobs matter on a shared machine. A 1-token decode forward of SmolLM2-135M at 2K context on 2
cores that other processes keep busy (load ~5): 917 ms with 2 spinning threads, 94 ms with 1 thread,
94 ms with 2 passive threads (docs/development.md, "CPU threads"). A spinning OpenMP worker burns its
core for a while after every parallel region (hundreds per forward), competing with the main thread
and with the other processes; a worker that the scheduler preempts stalls the region's barrier.

- ``OMP_WAIT_POLICY``: set to ``PASSIVE`` (unless already set) when ``triforce`` is imported. The
  OpenMP runtime reads it once, when torch loads it, so it only takes effect when ``triforce`` is
  imported before ``torch`` (``python -m triforce``, scripts/*.sh, which export it) or when it is in the
  environment.
- ``TRIFORCE_NUM_THREADS``: torch's intra-op thread count, applied once when ``triforce`` is imported
  (``torch.set_num_threads``; call it again afterwards to override). Unset: torch's own choice (the
  physical cores, or ``OMP_NUM_THREADS``) capped at the CPUs this process may run on
  (``os.sched_getaffinity``: a ``taskset`` or a container's cpuset), which torch ignores.

The extension's ``#pragma omp parallel`` loops use the same count: torch's wheel ships libgomp and the
extension's ``libgomp.so.1`` resolves to that copy, already loaded by torch, so there is one OpenMP
runtime, and ``torch.set_num_threads`` sets ``omp_set_num_threads`` for it. (A torch built with another
OpenMP runtime, e.g. Intel's libiomp5, leaves the extension on a second runtime that reads
``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` from the environment: set both.)
"""
from __future__ import annotations

import os


def set_wait_policy() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` unless set; effective only before torch is first imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def num_threads(torch_default: int) -> int:
    """The intra-op thread count: ``$TRIFORCE_NUM_THREADS``, else ``torch_default`` capped at
    :func:`available_cpus`. Raises ValueError for a value that is not a positive integer."""
    raw = os.environ.get("TRIFORCE_NUM_THREADS", "").strip()
    if not raw:
        return max(1, min(torch_default, available_cpus()))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"TRIFORCE_NUM_THREADS must be a positive integer, got {raw!r}")
    return n


def apply() -> int:
    """Set torch's intra-op threads to :func:`num_threads` (see the module docstring); returns it."""
    import torch

    n = num_threads(torch.get_num_threads())
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


__all__ = ["set_wait_policy", "available_cpus", "num_threads", "apply"]
