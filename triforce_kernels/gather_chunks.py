"""``tk.gather_chunks``: copy the selected KV chunks into the fixed-size retrieval cache (docs/design.md 3.1).

Files:
    reference  triforce_kernels/reference/retrieval.py
    triton     triforce_kernels/triton/retrieval.py
    cpu        csrc/include/triforce/retrieval.h (kernels), csrc/cpu/retrieval.cpp (launchers)
    tests      tests/test_retrieval.py, csrc/tests/test_retrieval.cpp
    benchmark  bench/bench_retrieval.py
"""
import torch

from ._backend import implementation, register, register_lazy, resolve
from ._validate import check_float_tensor, check_int, check_tensor
from .reference.retrieval import gather_chunks as _reference

register("gather_chunks", "reference")(_reference)
register_lazy("gather_chunks", "triton", "triforce_kernels.triton.retrieval")


@register("gather_chunks", "cpu")
def _cpu(k, v, chunk_idx, chunk_size, out_k, out_v):
    torch.ops.triforce_C.gather_chunks(k, v, chunk_idx, chunk_size, out_k, out_v)


@torch.library.custom_op("triforce::gather_chunks", mutates_args=("out_k", "out_v"))
def _gather_chunks_op(k: torch.Tensor, v: torch.Tensor, chunk_idx: torch.Tensor, chunk_size: int,
                      out_k: torch.Tensor, out_v: torch.Tensor, backend: str) -> None:
    implementation("gather_chunks", backend)(k, v, chunk_idx, chunk_size, out_k, out_v)


@_gather_chunks_op.register_fake
def _(k, v, chunk_idx, chunk_size, out_k, out_v, backend):
    return None


def check_gather_inputs(k, v, chunk_size, out_k, out_v, slots: int) -> None:
    """Shared with build_retrieval_cache; ``slots`` = chunks per head that will be written."""
    check_float_tensor("k", k, ndim=4)
    dev = k.device
    B, N, H, D = k.shape
    check_tensor("v", v, ndim=4, dtypes=(k.dtype,), device=dev, shape=(B, N, H, D))
    check_int("chunk_size", chunk_size, min_value=1)
    for name, out in (("out_k", out_k), ("out_v", out_v)):
        check_tensor(name, out, ndim=4, dtypes=(k.dtype,), device=dev, shape=(B, None, H, D), contiguous=True)
        if out.shape[1] < slots * chunk_size:
            raise ValueError(f"{name} must have at least {slots} x {chunk_size} = {slots * chunk_size} positions "
                             f"(dim 1), got {out.shape[1]}")
    if out_v.shape != out_k.shape:
        raise ValueError(f"out_v must have the shape of out_k {list(out_k.shape)}, got {list(out_v.shape)}")


def gather_chunks(k: torch.Tensor, v: torch.Tensor, chunk_idx: torch.Tensor, chunk_size: int,
                  out_k: torch.Tensor, out_v: torch.Tensor, *, backend: str | None = None) -> None:
    """Copy chunk ``chunk_idx[b, h, i]`` of KV head ``h`` into slot ``i`` of the output, in place.

    ``out_k[b, i*cs + t, h, :] = k[b, chunk_idx[b, h, i]*cs + t, h, :]`` for ``t < cs`` (same for v),
    bit-exact. Each KV head holds its own chunks. A slot whose index is ``-1`` -- or any index outside
    ``[0, N // chunk_size)``, which the kernels treat as ``-1`` instead of syncing to validate it -- is
    left untouched, so nothing is ever read or written out of bounds. Positions of ``out_k`` beyond
    ``S * chunk_size`` (e.g. a tail of recent tokens) are never written.

    Args:
        k, v: the full cache ``[B, N, Hkv, D]``, float32/float16/bfloat16, any strides (a
            ``[:, :seq_len]`` view of a larger buffer is fine).
        chunk_idx: int32 ``[B, Hkv, S]`` (``tk.select_chunks``).
        chunk_size: positions per chunk, ``>= 1``.
        out_k, out_v: contiguous ``[B, M, Hkv, D]`` of ``k``'s dtype with ``M >= S * chunk_size``,
            written in place (never copied: a non-contiguous buffer raises).
        backend: ``"reference" | "triton" | "cpu" | None`` (automatic).

    Example:
        >>> tk.gather_chunks(k_cache[:, :L], v_cache[:, :L], idx, 8, retr_k, retr_v)
    """
    check_float_tensor("k", k, ndim=4)
    check_tensor("chunk_idx", chunk_idx, ndim=3, dtypes=(torch.int32,), device=k.device,
                 shape=(k.shape[0], k.shape[2], None))
    check_gather_inputs(k, v, chunk_size, out_k, out_v, chunk_idx.shape[2])
    _gather_chunks_op(k, v, chunk_idx, chunk_size, out_k, out_v, resolve("gather_chunks", backend, k.device))
