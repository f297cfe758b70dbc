"""``tk.build_retrieval_cache``: score -> select -> gather with no host synchronisation (docs/design.md 3.1).

Files:
    reference  triforce_kernels/reference/retrieval.py
    triton     triforce_kernels/triton/retrieval.py
    cpu        csrc/include/triforce/retrieval.h (kernels), csrc/cpu/retrieval.cpp (launchers)
    tests      tests/test_retrieval.py, csrc/tests/test_retrieval.cpp
    benchmark  bench/bench_retrieval.py
"""
import torch

from ._backend import implementation, register, register_lazy, resolve
from ._validate import check_tensor
from .gather_chunks import check_gather_inputs
from .reference.retrieval import build_retrieval_cache as _reference
from .score_chunks import check_score_inputs
from .select_chunks import check_budget

register("build_retrieval_cache", "reference")(_reference)
register_lazy("build_retrieval_cache", "triton", "triforce_kernels.triton.retrieval")


@register("build_retrieval_cache", "cpu")
def _cpu(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v, sink_chunks, recent_chunks):
    return torch.ops.triforce_C.build_retrieval_cache(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks,
                                                      out_k, out_v, sink_chunks, recent_chunks)


@torch.library.custom_op("triforce::build_retrieval_cache", mutates_args=("out_k", "out_v"))
def _build_retrieval_cache_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_keys: torch.Tensor,
                              num_chunks: torch.Tensor, chunk_size: int, budget_chunks: int, out_k: torch.Tensor,
                              out_v: torch.Tensor, sink_chunks: int, recent_chunks: int,
                              backend: str) -> torch.Tensor:
    return implementation("build_retrieval_cache", backend)(
        q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v, sink_chunks, recent_chunks)


@_build_retrieval_cache_op.register_fake
def _(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v, sink_chunks, recent_chunks, backend):
    return q.new_empty((q.shape[0], chunk_keys.shape[2], budget_chunks), dtype=torch.int32)


def build_retrieval_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_keys: torch.Tensor,
                          num_chunks: torch.Tensor, chunk_size: int, budget_chunks: int, out_k: torch.Tensor,
                          out_v: torch.Tensor, sink_chunks: int = 1, recent_chunks: int = 0, *,
                          backend: str | None = None) -> torch.Tensor:
    """(Re)build a TriForce retrieval cache: score the chunks, pick ``budget_chunks`` per KV head, gather.

    Equal to::

        scores = tk.score_chunks(q, chunk_keys, num_chunks)
        chunk_idx = tk.select_chunks(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks)
        tk.gather_chunks(k, v, chunk_idx, chunk_size, out_k, out_v)
        return chunk_idx

    but without any host synchronisation and with fixed output shapes, so it can be captured in a
    CUDA graph (the ``cpu`` backend fuses the three steps per ``(b, h)``). Slot ``i`` of head ``h``
    holds tokens ``chunk_idx[b,h,i]*cs .. +cs-1`` of that head; slots with index ``-1`` (fewer valid
    chunks than the budget) keep their previous contents: mask them with ``chunk_idx >= 0``.

    Args:
        q: the query that steers retrieval ``[B, Hq, D]``, any float dtype.
        k, v: the full cache ``[B, N, Hkv, D]``, float32/float16/bfloat16, any strides.
        chunk_keys: float32 ``[B, C, Hkv, D]`` chunk-mean keys of ``k`` with ``C <= N // chunk_size``
            (so every selectable chunk lies inside ``k``).
        num_chunks: int32 ``[B]``, valid chunks per sequence (clamped to ``[0, C]`` on the device).
        chunk_size: positions per chunk, ``>= 1``.
        budget_chunks: chunks per head, ``> sink_chunks + recent_chunks``.
        out_k, out_v: contiguous ``[B, M, Hkv, D]`` of ``k``'s dtype, ``M >= budget_chunks * chunk_size``
            (the model layer's ``[B, budget + tail, Hkv, D]`` buffers), written in place.
        sink_chunks, recent_chunks: chunks always kept at the start / end of the valid range.
        backend: ``"reference" | "triton" | "cpu" | None`` (automatic).

    Returns:
        int32 ``[B, Hkv, budget_chunks]`` chunk indices, ascending, ``-1`` padded.

    Example:
        >>> idx = tk.build_retrieval_cache(last_q, k_cache, v_cache, means, n_chunks, 8, 512, rk, rv)
    """
    check_score_inputs(q, chunk_keys, num_chunks)
    check_budget(budget_chunks, sink_chunks, recent_chunks)
    check_gather_inputs(k, v, chunk_size, out_k, out_v, budget_chunks)
    B, N, H, D = k.shape
    check_tensor("k", k, device=q.device)
    check_tensor("chunk_keys", chunk_keys, shape=(B, None, H, D))
    if chunk_keys.shape[1] > N // chunk_size:
        raise ValueError(f"chunk_keys has {chunk_keys.shape[1]} chunks but k holds only N // chunk_size = "
                         f"{N // chunk_size} complete chunks")
    return _build_retrieval_cache_op(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v,
                                     sink_chunks, recent_chunks, resolve("build_retrieval_cache", backend, q.device))
