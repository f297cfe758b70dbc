"""``tk.select_chunks``: top-k chunks per KV head with sink and recent chunks kept (docs/design.md 3.1).

Files:
    reference  triforce_kernels/reference/retrieval.py
    triton     triforce_kernels/triton/retrieval.py
    cpu        csrc/include/triforce/retrieval.h (kernels), csrc/cpu/retrieval.cpp (launchers)
    tests      tests/test_retrieval.py, csrc/tests/test_retrieval.cpp
    benchmark  bench/bench_retrieval.py
"""
import torch

from ._backend import custom_op, eager_call, implementation, register, register_lazy, resolve
from ._validate import check_int, check_tensor
from .reference.retrieval import select_chunks as _reference

register("select_chunks", "reference")(_reference)
register_lazy("select_chunks", "triton", "triforce_kernels.triton.retrieval")


@register("select_chunks", "cpu")
def _cpu(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks):
    return torch.ops.triforce_C.select_chunks(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks)


@custom_op("triforce::select_chunks")
def _select_chunks_op(scores: torch.Tensor, num_chunks: torch.Tensor, budget_chunks: int, sink_chunks: int,
                      recent_chunks: int, backend: str) -> torch.Tensor:
    return implementation("select_chunks", backend)(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks)


@_select_chunks_op.register_fake
def _(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks, backend):
    return scores.new_empty((scores.shape[0], scores.shape[1], budget_chunks), dtype=torch.int32)


def check_budget(budget_chunks, sink_chunks, recent_chunks) -> None:
    """Shared with build_retrieval_cache."""
    check_int("budget_chunks", budget_chunks, min_value=1)
    check_int("sink_chunks", sink_chunks, min_value=0)
    check_int("recent_chunks", recent_chunks, min_value=0)
    if budget_chunks <= sink_chunks + recent_chunks:
        raise ValueError(f"budget_chunks ({budget_chunks}) must be > sink_chunks + recent_chunks "
                         f"({sink_chunks} + {recent_chunks}): no room left for chunks chosen by score")


def select_chunks(scores: torch.Tensor, num_chunks: torch.Tensor, budget_chunks: int, sink_chunks: int = 1,
                  recent_chunks: int = 0, *, backend: str | None = None) -> torch.Tensor:
    """Chunks to keep in the retrieval cache, per KV head: sinks, recent chunks, then the best scores.

    Per ``(b, h)``, with ``n = clamp(num_chunks[b], 0, C)`` valid chunks:

    * ``n <= budget_chunks``: every valid chunk ``0 .. n-1``, then ``-1`` padding;
    * otherwise exactly ``budget_chunks`` chunks: ``[0, sink_chunks)``, ``[n - recent_chunks, n)``, and
      the ``budget_chunks - sink_chunks - recent_chunks`` highest-scoring chunks in between (ties:
      the lower index wins; NaN ranks as ``-inf``).

    Chunks ``c >= n`` are never selected. Output rows are ascending (the gathered cache keeps token
    order), e.g. ``n = 10, budget = 4, sink = 1, recent = 1``, best middle scores at 3, 6::

        [0, 3, 6, 9]            and for n = 2:   [0, 1, -1, -1]

    Args:
        scores: float32 ``[B, Hkv, C]`` (``tk.score_chunks``).
        num_chunks: int32 ``[B]``, valid chunks per sequence (clamped to ``[0, C]``).
        budget_chunks: chunks per head in the retrieval cache, ``> sink_chunks + recent_chunks``.
        sink_chunks: leading chunks always kept (attention sinks), ``>= 0``.
        recent_chunks: trailing valid chunks always kept, ``>= 0``.
        backend: ``"reference" | "triton" | "cpu" | None`` (automatic).

    Returns:
        int32 ``[B, Hkv, budget_chunks]``, ascending then ``-1`` padded.

    Example:
        >>> idx = tk.select_chunks(scores, num_chunks, budget_chunks=4096 // 8, sink_chunks=1)
    """
    check_tensor("scores", scores, ndim=3, dtypes=(torch.float32,))
    check_tensor("num_chunks", num_chunks, ndim=1, dtypes=(torch.int32,), device=scores.device,
                 shape=(scores.shape[0],))
    check_budget(budget_chunks, sink_chunks, recent_chunks)
    return eager_call(_select_chunks_op, scores, num_chunks, budget_chunks, sink_chunks, recent_chunks,
                             resolve("select_chunks", backend, scores.device))
