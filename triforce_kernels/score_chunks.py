"""``tk.score_chunks``: per-KV-head chunk scores from the chunk-mean keys (docs/design.md 3.1).

Files:
    reference  triforce_kernels/reference/retrieval.py
    triton     triforce_kernels/triton/retrieval.py
    cpu        csrc/include/triforce/retrieval.h (kernels), csrc/cpu/retrieval.cpp (launchers)
    tests      tests/test_retrieval.py, csrc/tests/test_retrieval.cpp
    benchmark  bench/bench_retrieval.py
"""
import torch

from ._backend import custom_op, eager_call, implementation, register, register_lazy, resolve
from ._validate import check_float_tensor, check_tensor
from .reference.retrieval import score_chunks as _reference

register("score_chunks", "reference")(_reference)
register_lazy("score_chunks", "triton", "triforce_kernels.triton.retrieval")


@register("score_chunks", "cpu")
def _cpu(q, chunk_keys, num_chunks):
    return torch.ops.triforce_C.score_chunks(q, chunk_keys, num_chunks)


@custom_op("triforce::score_chunks")
def _score_chunks_op(q: torch.Tensor, chunk_keys: torch.Tensor, num_chunks: torch.Tensor,
                     backend: str) -> torch.Tensor:
    return implementation("score_chunks", backend)(q, chunk_keys, num_chunks)


@_score_chunks_op.register_fake
def _(q, chunk_keys, num_chunks, backend):
    return q.new_empty((q.shape[0], chunk_keys.shape[2], chunk_keys.shape[1]), dtype=torch.float32)


def check_score_inputs(q, chunk_keys, num_chunks) -> None:
    """Shared with build_retrieval_cache: shapes, dtypes, devices of the scoring inputs."""
    check_float_tensor("q", q, ndim=3)
    dev = q.device
    check_tensor("chunk_keys", chunk_keys, ndim=4, dtypes=(torch.float32,), device=dev)
    B, Hq, D = q.shape
    Hkv = chunk_keys.shape[2]
    check_tensor("chunk_keys", chunk_keys, shape=(B, None, None, D))
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q has {Hq} heads, which is not a multiple of chunk_keys' {Hkv} KV heads "
                         "(GQA needs Hq = g * Hkv with g >= 1)")
    check_tensor("num_chunks", num_chunks, ndim=1, dtypes=(torch.int32,), device=dev, shape=(B,))


def score_chunks(q: torch.Tensor, chunk_keys: torch.Tensor, num_chunks: torch.Tensor, *,
                 backend: str | None = None) -> torch.Tensor:
    """How much each KV head's queries attend to each chunk, judged by the chunk-mean keys.

    For KV head ``h`` with query heads ``j`` in its group (``j // g == h``, ``g = Hq // Hkv``)::

        score[b, h, c] = sum_j softmax_{c' < n_b}(q[b, j] . chunk_keys[b, c', h] / sqrt(D))[c]
        score[b, h, c] = -inf                                  for c >= n_b

    with ``n_b = clamp(num_chunks[b], 0, C)``. Each query head's softmax sums to 1 over the valid
    chunks, so each counts equally; for MHA (g = 1) the order of the scores is exactly TriForce's
    raw-dot-product order. A batch row with ``n_b = 0`` scores ``-inf`` everywhere.

    Args:
        q: queries ``[B, Hq, D]`` (one token per sequence, after RoPE), float32/float16/bfloat16.
        chunk_keys: float32 ``[B, C, Hkv, D]`` chunk-mean keys (``tk.chunk_mean_keys``); ``C`` may be
            the capacity of a buffer of which only the first ``num_chunks[b]`` chunks are filled.
        num_chunks: int32 ``[B]``, valid chunks per sequence (clamped to ``[0, C]``; never read
            to the host).
        backend: ``"reference" | "triton" | "cpu" | None`` (automatic).

    Returns:
        float32 ``[B, Hkv, C]``, contiguous.

    Example:
        >>> scores = tk.score_chunks(q[:, -1], tk.chunk_mean_keys(k, 8), num_chunks)
    """
    check_score_inputs(q, chunk_keys, num_chunks)
    return eager_call(_score_chunks_op, q, chunk_keys, num_chunks, resolve("score_chunks", backend, q.device))
