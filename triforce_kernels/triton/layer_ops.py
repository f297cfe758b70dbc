"""The decoder layer's elementwise work on a GPU in 6 launches instead of 30: RMSNorm (with the residual
add before it), RoPE of the queries and of the keys, and SiLU(gate) * up.

A decode step of a small model on a GPU is bound by its kernel count, not its bytes: run 4 (docs/gpu.md)
measured a SmolLM2-135M step on a 264-token cache at 3.3 ms (batch 32), against a memory-bound floor of
0.1 ms. Written op by op in PyTorch, a layer runs 40 ops besides views (counted with torch.profiler on
the module-by-module path): 7 projections, the cache write (2) and the attention, and 30 elementwise
ops: each RMSNorm 8 (cast, square, mean, add, rsqrt, multiply, cast, weight), each RoPE 5 (negate,
concatenate, two products, sum), SiLU and its product 2, the two residual adds. With these kernels the
30 are 6: the first norm, the residual add with the second norm, RoPE of q and of k, SiLU * up, and the
last residual add (PyTorch's); each reads its inputs once.

The roundings are PyTorch's. A PyTorch op on 16-bit tensors computes in float32 and rounds its result
to the tensor's dtype; these kernels round where it does: the residual sum, each RoPE product and their
sum, SiLU's result and its product, the normalised row before the weight. So the residual sum and
``rope`` give PyTorch's bits exactly, ``rms_norm`` differs only by the order of the sum of squares
inside a row (the mean), ``silu_mul`` only where the exp differs: on a GPU it takes CUDA's ``expf`` and an
IEEE division, as PyTorch's CUDA SiLU does (libdevice's ``expf`` flushes subnormal intermediates, which
cannot change ``1 + e^-x``), in the interpreter numpy's. Floating-point contraction is off
(``enable_fp_fusion=False``) so float32 rounds as PyTorch does too. Every row is computed alone: a row's
result does not depend on the number of rows (a verification pass and a one-token step give it the
same bits).

Not public ops: helpers of the model layer (``triforce/models/llama.py``), checked against the PyTorch
expressions by ``tests/test_layer_ops.py`` (in the interpreter on a CPU) and in a model by
``tests/test_model.py::test_the_elementwise_kernels_in_a_model``.
"""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._target import interpreting

MAX_HIDDEN = 16384  # widest row rms_norm takes in one block (wider: the caller's PyTorch path)


@triton.jit
def _rms_norm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, N, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    # one program per row of N: h = x + d (rounded, stored), y = w * (h * rsqrt(mean(h^2) + eps) rounded)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=m, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * N + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(h_ptr + row * N + offs, x, mask=m)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt_rn(tl.sum(xf * xf, 0) / N + eps)
    normed = (xf * r).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + offs, (w * normed).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, D, HALF, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # one program per token (b, t): every head of x [.., H, D]; out = x * cos + rotate_half(x) * sin, with
    # rotate_half(x)[d] = -x[d + D/2] below D/2 and x[d - D/2] above; cos, sin [.., D] per token
    tok = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < H) & (d < D)
    base = x_ptr + tok * H * D + h * D
    x = tl.load(base + d, mask=m, other=0.0).to(tl.float32)
    lower = d < HALF
    partner = tl.load(base + tl.where(lower, d + HALF, d - HALF), mask=m, other=0.0).to(tl.float32)
    rot = tl.where(lower, -partner, partner)
    c = tl.load(cos_ptr + tok * D + d, mask=d < D, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + tok * D + d, mask=d < D, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    a = (x * c).to(ty).to(tl.float32)
    b = (rot * s).to(ty).to(tl.float32)
    tl.store(out_ptr + tok * H * D + h * D + d, (a + b).to(ty), mask=m)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr, PRECISE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    g = tl.load(g_ptr + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=m, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    if PRECISE:
        # PyTorch's CUDA SiLU: x / (1 + expf(-x)) with CUDA's expf and an IEEE division. Triton's own
        # tl.exp (ex2.approx of x * log2 e) and '/' (div.full) are each some float32 units off, and
        # x * e^x for a very negative x carries exp's whole error: rounding x * log2 e alone puts it up to
        # 28 units off at x = -24 (emulated in numpy); GPU run 5's test failed on it
        act = tl.math.div_rn(g, 1.0 + libdevice.exp(-g))
    else:  # the interpreter: numpy's exp and division, which have no libdevice there
        act = g / (1.0 + tl.exp(-g))
    act = act.to(ty).to(tl.float32)
    tl.store(out_ptr + offs, (act * u).to(ty), mask=m)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None):
    """``weight * (h * rsqrt(mean(h^2, -1) + eps))`` over the last dimension, ``h = x`` or ``x + delta``
    (rounded to ``x``'s dtype first, as ``x + delta`` is) -> ``(h, normed)``; ``h`` is ``x`` itself when
    ``delta`` is None. ``x``, ``delta`` contiguous, of one dtype; ``weight`` ``[N]`` of that dtype."""
    N = x.shape[-1]
    h = x if delta is None else torch.empty_like(x)
    y = torch.empty_like(x)
    rows = _rows(x)
    if rows:
        _rms_norm_kernel[(rows,)](x, x if delta is None else delta, weight, h, y, N, float(eps),
                                  HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(N),
                                  num_warps=4 if N <= 2048 else 8, enable_fp_fusion=False)
    return h, y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (``triforce.models.rope.apply_rope``) for a contiguous ``x``
    ``[B, T, H, D]`` and ``cos``, ``sin`` ``[B, T, 1, D]`` contiguous, in ``x``'s dtype."""
    B, T, H, D = x.shape
    out = torch.empty_like(x)
    if out.numel():
        _rope_kernel[(B * T,)](x, cos, sin, out, H, D, D // 2, BLOCK_H=triton.next_power_of_2(H),
                               BLOCK_D=triton.next_power_of_2(D), enable_fp_fusion=False)
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` for contiguous ``gate``, ``up`` of one shape and dtype."""
    out = torch.empty_like(gate)
    n = out.numel()
    if n:
        BLOCK = 1024
        _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](gate, up, out, n, BLOCK=BLOCK, PRECISE=not interpreting(),
                                                   enable_fp_fusion=False)
    return out
