import torch
import triton
import triton.language as tl

from .._backend import register


@triton.jit
def _chunk_mean_keys_kernel(
    k_ptr, out_ptr, chunk_size, C, H, D,
    stride_kb, stride_kn, stride_kh, stride_kd,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (chunk, batch) covering all heads: reads chunk_size * H * D keys once,
    # writes H * D fp32 means (1/chunk_size of the bytes read).
    c = tl.program_id(0)
    b = tl.program_id(1)
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    mask = (offs_h < H) & (offs_d < D)
    base = k_ptr + b.to(tl.int64) * stride_kb + (c * chunk_size).to(tl.int64) * stride_kn
    ptrs = base + offs_h * stride_kh + offs_d * stride_kd
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    for t in range(0, chunk_size):
        acc += tl.load(ptrs + t * stride_kn, mask=mask, other=0.0).to(tl.float32)
    out = out_ptr + ((b.to(tl.int64) * C + c) * H + offs_h) * D + offs_d
    tl.store(out, acc / chunk_size, mask=mask)


@register("chunk_mean_keys", "triton")
def chunk_mean_keys(k: torch.Tensor, chunk_size: int) -> torch.Tensor:
    B, N, H, D = k.shape
    C = N // chunk_size
    out = torch.empty((B, C, H, D), device=k.device, dtype=torch.float32)
    if out.numel() == 0:
        return out
    _chunk_mean_keys_kernel[(C, B)](
        k, out, chunk_size, C, H, D, *k.stride(),
        BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D),
    )
    return out
