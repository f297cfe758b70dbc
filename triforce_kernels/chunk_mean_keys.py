"""``tk.chunk_mean_keys``: fp32 mean of each complete chunk of the key cache (docs/design.md 3.1).

Files:
    reference  triforce_kernels/reference/chunk_mean_keys.py
    triton     triforce_kernels/triton/chunk_mean_keys.py
    cpu        csrc/include/triforce/chunk_mean_keys.h (kernel), csrc/cpu/chunk_mean_keys.cpp (launcher)
    tests      tests/test_chunk_mean_keys.py, csrc/tests/test_chunk_mean_keys.cpp
    benchmark  bench/bench_chunk_mean_keys.py
"""
import torch

from ._backend import custom_op, eager_call, implementation, register, register_lazy, resolve
from ._validate import check_float_tensor, check_int
from .reference.chunk_mean_keys import chunk_mean_keys as _reference

register("chunk_mean_keys", "reference")(_reference)
register_lazy("chunk_mean_keys", "triton", "triforce_kernels.triton.chunk_mean_keys")


@register("chunk_mean_keys", "cpu")
def _cpu(k, chunk_size):
    return torch.ops.triforce_C.chunk_mean_keys(k, chunk_size)


@custom_op("triforce::chunk_mean_keys")
def _chunk_mean_keys_op(k: torch.Tensor, chunk_size: int, backend: str) -> torch.Tensor:
    return implementation("chunk_mean_keys", backend)(k, chunk_size)


@_chunk_mean_keys_op.register_fake
def _(k, chunk_size, backend):
    B, N, H, D = k.shape
    return k.new_empty((B, N // chunk_size, H, D), dtype=torch.float32)


def chunk_mean_keys(k: torch.Tensor, chunk_size: int, *, backend: str | None = None) -> torch.Tensor:
    """Mean key of every complete chunk of ``chunk_size`` consecutive positions.

    ``out[b, c, h, :] = mean(k[b, c*chunk_size : (c+1)*chunk_size, h, :])``, accumulated in float32.
    A partial trailing chunk (``N % chunk_size`` positions) is not included.

    Incremental use: the op accepts any strided view, so the mean of one newly completed chunk is
    ``chunk_mean_keys(k[:, start:start + chunk_size], chunk_size)`` -- no other chunk is read.

    Args:
        k: keys ``[B, N, Hkv, D]`` (after RoPE), float32 / float16 / bfloat16, any strides.
        chunk_size: positions per chunk, ``>= 1``.
        backend: ``"reference" | "triton" | "cpu" | None`` (automatic; see ``triforce_kernels._backend``).

    Returns:
        float32 ``[B, N // chunk_size, Hkv, D]``, contiguous.

    Example:
        >>> means = tk.chunk_mean_keys(k_cache[:, :seq_len], 8)   # [B, seq_len // 8, Hkv, D]
    """
    check_float_tensor("k", k, ndim=4)
    check_int("chunk_size", chunk_size, min_value=1)
    return eager_call(_chunk_mean_keys_op, k, chunk_size, resolve("chunk_mean_keys", backend, k.device))
