"""Weight-only int8 copies of a model: a cheaper *draft* for speculative decoding on CPU.

``int8_copy(model)`` returns a :class:`~triforce.models.Llama` whose linear layers (the LM head too)
hold ``int8`` weights with one float32 scale per 32 consecutive weights of a row (symmetric, round to
nearest: ``w ~ scale * q``, ``scale = max|w| / 127`` over the group); embeddings and norms stay as
they are, and activations stay float32. At batch 1 a draft step streams its weights once, so bytes
are its cost: 1.125 bytes per weight against 4 (the float32 target) and 2 (the default bfloat16 draft
copy). On CPU, few-row products run ``triforce_C::rowwise_linear_q8`` (``csrc/include/triforce/
linear.h``: each weight dequantised exactly, then the float32 kernel's accumulation, so row ``m`` of a
many-row product is bitwise the 1-row product); anything else (prefill chunks, other devices, autograd)
multiplies by the dequantised weight with ``F.linear``.

A draft never changes what is generated (the target verifies every token); its weights only set the
acceptance rate. docs/model.md ("Int8 draft copy") has the measurements.
"""
from __future__ import annotations

import copy
import json
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .llama import Llama, _rowwise_available, _rowwise_rows, bulk_weight

__all__ = ["GROUP", "quantize_q8", "dequantize_q8", "Q8Linear", "int8_copy", "Q4_1_BLOCK_BYTES", "quantize_q4_1",
           "dequantize_q4_1", "Q4Linear", "gguf_copy", "pack_i8", "unpack_i8", "quantize_activations_i8",
           "rowwise_linear_i8_reference", "Int8DotLinear", "I8_FORMATS", "IQ4_NL_VALUES", "MXFP4_VALUES",
           "pack_mxfp4", "e8m0_half", "GGUF_I8_TYPES",
           "gguf_i8_blocks", "gguf_i8_pack", "load_gguf_int8", "load_mxfp4_int8", "is_mxfp4_checkpoint",
           "Fp8Linear", "load_fp8", "is_fp8_checkpoint", "pack_fp8", "unpack_fp8", "fp8_chunk_scales"]

GROUP = 32  # weights per scale (csrc kQ8Group)


def quantize_q8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` ``[N, K]`` float -> (``q`` int8 ``[N, K]``, ``scales`` float32 ``[N, ceil(K / 32)]``) with
    ``w[n, k] ~ scales[n, k // 32] * q[n, k]``, ``|q| <= 127``. An all-zero group gets scale 1 (q = 0)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_q8: w must be a 2-D float tensor, got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("quantize_q8: w has inf or NaN values")
    N, K = w.shape
    G = -(-K // GROUP)
    wp = F.pad(w.detach().float(), (0, G * GROUP - K)).view(N, G, GROUP)
    scales = wp.abs().amax(-1) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(wp / scales[..., None]).clamp_(-127, 127).to(torch.int8).view(N, G * GROUP)[:, :K]
    return q.contiguous(), scales.contiguous()


def q8_group(K: int, scales: torch.Tensor) -> int | None:
    """The weights per scale of int8 weights of ``K`` columns with ``scales`` ``[N, groups]``: 32 (``GROUP``), or
    16 (NVFP4's groups) where the scales say so; None for neither."""
    if scales.dim() == 2 and scales.shape[1] == -(-K // GROUP):
        return GROUP
    return 16 if scales.dim() == 2 and scales.shape[1] == -(-K // 16) else None


def dequantize_q8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``[N, K]``: ``scales[n, k // group] * q[n, k]`` (what the kernel multiplies by; group 32, or 16)."""
    K = q.shape[1]
    return q.float() * scales.repeat_interleave(q8_group(K, scales), 1)[:, :K]


_KERNELS: dict = {}


def _kernel_available(name: str) -> bool:
    """The extension has ``triforce_C::name`` (and the model's streaming kernels are not switched off)."""
    if name not in _KERNELS:
        _KERNELS[name] = _rowwise_available() and hasattr(torch.ops.triforce_C, name)
    return _KERNELS[name]


def _q8_kernel_available() -> bool:
    return _kernel_available("rowwise_linear_q8")


def _q4_kernel_available() -> bool:
    return _kernel_available("rowwise_linear_q4_1")


class _FixedDtypeScales(nn.Module):
    """A quantised layer whose ``scales`` buffer keeps ``_scales_dtype`` through a dtype cast (``.to(torch.bfloat16)``,
    ``.half()``: a half-precision copy of a model holding the layer casts every floating buffer): the scales
    stay what the kernel reads, on the device the cast left them on."""

    _scales_dtype: torch.dtype

    def _apply(self, fn, recurse=True):
        scales = self._buffers["scales"]
        out = super()._apply(fn, recurse)
        if self._buffers["scales"].dtype != self._scales_dtype:
            self._buffers["scales"] = scales.to(self._buffers["scales"].device)
        return out


class Q8Linear(_FixedDtypeScales):
    """A linear layer with int8 weights (``qweight`` ``[out, in]``) and float32 ``scales`` ``[out, ceil(in /
    32)]``, or ``[out, ceil(in / 16)]`` (a scale per 16 weights: NVFP4's groups) (buffers), optional float32
    ``bias``. Input and output float32 (other float dtypes are computed in float32 and cast back)."""

    _scales_dtype = torch.float32

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError("Q8Linear: qweight must be a 2-D int8 tensor")
        N, K = qweight.shape
        if scales.shape[:1] != (N,) or q8_group(K, scales) is None or scales.dtype != torch.float32:
            raise ValueError(f"Q8Linear: scales must be float32 [{N}, {-(-K // GROUP)}] (one per 32 weights) or "
                             f"[{N}, {-(-K // 16)}] (one per 16), got {scales.dtype} {list(scales.shape)}")
        self.group = q8_group(K, scales)
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Q8Linear":
        q, s = quantize_q8(lin.weight)
        return cls(q, s, lin.bias)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight (float32, computed on each access)."""
        return dequantize_q8(self.qweight, self.scales)

    def forward(self, x):
        return _quantised_forward(self, x, _q8_kernel_available,
                                  lambda x2: torch.ops.triforce_C.rowwise_linear_q8(x2, self.qweight, self.scales))

    def fused_projection(self, dtype: torch.dtype):
        """``(qweight, scales, bias)`` for the fused decoder layer (float32 inputs on the kernel's path),
        else ``None`` (see ``triforce.models.llama.DecoderLayer.fused_arguments``)."""
        if dtype != torch.float32 or not _q8_kernel_available():
            return None
        buffers = self._buffers
        return buffers["qweight"], buffers["scales"], self._parameters.get("bias")  # None: a plain attribute

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, group={self.group}"


def _quantised_forward(mod, x, available, kernel):
    """A quantised linear layer's forward, computed in float32 (other float inputs are cast there and the
    result back) as :class:`~triforce.models.llama.Linear` computes a float32 layer: ``kernel`` (the
    rowwise kernel on the layer's blocks, bitwise the float32 kernel on the dequantised weight) wherever
    Linear takes its kernel (``_rowwise_rows``), the bias added after it; elsewhere ``F.linear`` on the
    dequantised weight with the bias, as Linear's fallback."""
    dtype, b = x.dtype, mod.bias
    xf = x.float()
    if _rowwise_rows(xf) and not (torch.is_grad_enabled() and xf.requires_grad) and available():
        y = kernel(xf.reshape(-1, xf.shape[-1])).view(*xf.shape[:-1], -1)
        if b is not None:
            y = y.add_(b.float())
    else:
        w = bulk_weight(mod, lambda: mod.weight.to(xf.device))  # a prefill dequantises once, not per chunk
        y = F.linear(xf, w, None if b is None else b.float())
    return y.to(dtype)


# ---- Q4_1 weights (a model run from its GGUF file's own Q4_1 tensors)

Q4_1_BLOCK = 32  # weights per block
Q4_1_BLOCK_BYTES = 24  # [d float32][m float32][16 bytes of 4-bit codes]


def quantize_q4_1(w: torch.Tensor) -> torch.Tensor:
    """``w`` ``[N, K]`` float (``K % 32 == 0``) -> uint8 ``[N, K / 32 * 24]``: Q4_1 blocks of 32 weights,
    ``w ~ d * q + m`` with ``m`` the block's minimum and ``d = (max - min) / 15``, both rounded to float16 as
    GGUF stores them, and ``q`` in 0..15, round to nearest. A block is ``d`` and ``m`` as float32 (exact
    widenings of the float16 values) then 16 code bytes, byte ``i`` holding weight ``i`` in its low nibble
    and weight ``i + 16`` in its high nibble (llama.cpp's order)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point() or w.shape[1] % Q4_1_BLOCK:
        raise ValueError(f"quantize_q4_1: w must be a 2-D float tensor with a multiple of {Q4_1_BLOCK} columns, got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    N, K = w.shape
    wb = w.detach().float().reshape(N, K // Q4_1_BLOCK, Q4_1_BLOCK)
    lo, hi = wb.amin(-1), wb.amax(-1)
    d16, m16 = ((hi - lo) / 15).half(), lo.half()
    if not bool(torch.isfinite(d16).all() and torch.isfinite(m16).all()):
        raise ValueError("quantize_q4_1: w has inf or NaN values, or blocks too wide for float16 scales")
    q = torch.round((wb - m16.float()[..., None]) / torch.where(d16 > 0, d16.float(), 1)[..., None])
    return _q4_1_blocks(d16, m16, q.clamp_(0, 15).to(torch.uint8))


def _q4_1_blocks(d16: torch.Tensor, m16: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Blocks from float16 ``d``, ``m`` ``[N, G]`` and codes ``q`` uint8 ``[N, G, 32]`` (0..15)."""
    return _pack_q4_1(d16, m16, q[..., :16] | (q[..., 16:] << 4))


def _pack_q4_1(d16: torch.Tensor, m16: torch.Tensor, code_bytes: torch.Tensor) -> torch.Tensor:
    """Blocks from float16 ``d``, ``m`` ``[N, G]`` and the 16 code bytes of each block ``[N, G, 16]``."""
    N, G = d16.shape
    scales = torch.stack([d16.float(), m16.float()], -1).view(torch.uint8)  # [N, G, 8]: exact widenings
    return torch.cat([scales, code_bytes], -1).reshape(N, G * Q4_1_BLOCK_BYTES)


def gguf_q4_1_blocks(raw: torch.Tensor) -> torch.Tensor:
    """GGUF's Q4_1 tensor data (uint8 ``[N, K / 32 * 20]``: ``[d fp16][m fp16][16 code bytes]`` per block) in
    :class:`Q4Linear`'s layout (the same codes, ``d`` and ``m`` widened to float32)."""
    b = raw.reshape(raw.shape[0], -1, 20)
    half = lambda lo: b[..., lo:lo + 2].contiguous().view(torch.float16)[..., 0]  # noqa: E731
    return _pack_q4_1(half(0), half(2), b[..., 4:])


def dequantize_q4_1(blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """float32 ``[N, in_features]`` from Q4_1 blocks, exactly as gguf's ``dequantize`` computes it: float32
    ``d * q`` (exact) ``+ m``, rounded once."""
    N = blocks.shape[0]
    b = blocks.reshape(N, in_features // Q4_1_BLOCK, Q4_1_BLOCK_BYTES)
    dm = b[..., :8].contiguous().view(torch.float32)  # [N, G, 2]
    codes = b[..., 8:]
    q = torch.cat([codes & 15, codes >> 4], -1).float()
    return (q * dm[..., 0:1] + dm[..., 1:2]).reshape(N, in_features)


class Q4Linear(nn.Module):
    """A linear layer on Q4_1 blocks (``blocks`` uint8 ``[out, in / 32 * 24]``, a buffer; see
    :func:`quantize_q4_1`), optional float32 ``bias``. It computes what a float32 ``Linear`` holding the
    dequantised weight computes, bitwise, on the CPU: ``triforce_C::rowwise_linear_q4_1``
    (csrc/include/triforce/linear.h) dequantises each weight in registers as gguf does and runs the float32
    kernel's arithmetic, wherever Linear takes that kernel; elsewhere (a prefill's chunks, other devices,
    autograd) ``F.linear`` on the dequantised weight. Inputs of other float dtypes are computed in float32
    and the result cast back."""

    def __init__(self, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        if in_features <= 0 or in_features % Q4_1_BLOCK:
            raise ValueError(f"Q4Linear: in_features must be a positive multiple of {Q4_1_BLOCK}, got {in_features}")
        row = in_features // Q4_1_BLOCK * Q4_1_BLOCK_BYTES
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != row:
            raise ValueError(f"Q4Linear: blocks must be uint8 [out, {row}] for {in_features} inputs, got "
                             f"{blocks.dtype} {list(blocks.shape)}")
        dm = blocks.reshape(blocks.shape[0], -1, Q4_1_BLOCK_BYTES)[..., :8].contiguous().view(torch.float32)
        if not torch.equal(dm.half().float(), dm):  # d * q exact in float32, as the kernel's FMA needs
            raise ValueError("Q4Linear: each block's d and m must be float16 values widened to float32, as GGUF "
                             "stores them (quantize_q4_1 and gguf_q4_1_blocks make such blocks)")
        self.in_features, self.out_features = in_features, blocks.shape[0]
        self.register_buffer("blocks", blocks.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Q4Linear":
        """Quantised with :func:`quantize_q4_1` (lossy: a draft, unless ``lin`` holds Q4_1 values already)."""
        return cls(quantize_q4_1(lin.weight), lin.in_features, lin.bias)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight (float32, computed on each access)."""
        return dequantize_q4_1(self.blocks, self.in_features)

    def forward(self, x):
        return _quantised_forward(self, x, _q4_kernel_available,
                                  lambda x2: torch.ops.triforce_C.rowwise_linear_q4_1(x2, self.blocks))

    def fused_projection(self, dtype: torch.dtype):
        """``(blocks, None, bias)`` for the fused decoder layer (float32 inputs on the kernel's path), else
        ``None`` (see ``triforce.models.llama.DecoderLayer.fused_arguments``)."""
        if dtype != torch.float32 or not _q4_kernel_available():
            return None
        return self._buffers["blocks"], None, self._parameters.get("bias")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q4_1"


def _q8_0_linear(blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None) -> Q8Linear:
    """A :class:`Q8Linear` holding GGUF Q8_0 blocks (``[d fp16][32 int8]`` per 32 weights): its scales are
    the blocks' ``d`` in float32 (exact), so it dequantises to gguf's ``q * d``."""
    N = blocks.shape[0]
    b = blocks.reshape(N, in_features // GROUP, 2 + GROUP)
    scales = b[..., 0:2].contiguous().view(torch.float16).float()[..., 0]
    q = b[..., 2:].contiguous().view(torch.int8).reshape(N, in_features)
    return Q8Linear(q, scales.contiguous(), bias)


# ---- integer dot products: x rounded to int8 blocks against GGUF weight blocks (llama.cpp's class of
# arithmetic; csrc/include/triforce/linear_i8.h defines it exactly and holds the packed layout)

I8_GROUP = 16  # output rows per packed group


def _check_i8_shapes(w_shape):
    N, K = w_shape
    if N % I8_GROUP or K % GROUP or N == 0 or K == 0:
        raise ValueError(f"int8 dot products: a weight [{N}, {K}] needs out_features a positive multiple of "
                         f"{I8_GROUP} and in_features a positive multiple of {GROUP}")


I8_FORMATS = ("Q4_1", "Q5_1", "Q8_0", "Q8_0_16", "IQ4_NL", "Q6_16", "Q4_1_16", "Q2_16",  # packed forms (linear_i8.h)
              "Q3_16", "GRID", "GRID_16", "MXFP4")
_I8_CODE_BYTES = {"Q4_1": 256, "Q5_1": 320, "Q8_0": 512, "Q8_0_16": 512, "IQ4_NL": 256,  # per block of 32 inputs
                  "Q6_16": 384, "Q4_1_16": 256, "Q2_16": 128, "Q3_16": 192, "MXFP4": 256,  # and group of 16 rows
                  "GRID": 256, "GRID_16": 256}
_I8_SCALES = {"Q4_1": 32, "Q5_1": 32, "Q8_0": 16, "Q8_0_16": 32, "IQ4_NL": 16, "Q6_16": 32,  # per block and group
              "Q4_1_16": 64, "Q2_16": 64, "Q3_16": 32, "MXFP4": 16, "GRID": 16, "GRID_16": 32}
_I8_WITH_MIN = ("Q4_1", "Q5_1", "Q4_1_16", "Q2_16")  # w = d * q + m
_I8_HALVES = ("Q8_0_16", "Q6_16", "Q4_1_16", "Q2_16", "Q3_16", "GRID_16")  # a scale (and minimum) per 16 weights
_I8_GRIDS = ("GRID", "GRID_16")  # 4-bit indices into the tensor's own 16 values, stored after each group's codes


def _group_code_bytes(fmt: str, G: int) -> int:
    """Bytes of a group's codes for G blocks: the blocks', then a grid form's 16 table bytes."""
    return G * _I8_CODE_BYTES[fmt] + (16 if fmt in _I8_GRIDS else 0)
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # GGUF IQ4_NL's grid
# FP4 E2M1's 16 values doubled (integers; ggml's kvalues_mxfp4): MXFP4's weight of index i is 2^(e - 128) * value
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
SUPER_BLOCK = 256  # inputs per super-block of the uint8 (super-block) scales


def _super_bases(fmt: str) -> int:
    """float16 bases per row and super-block: d and m for the forms with a minimum, else d."""
    return 2 if fmt in _I8_WITH_MIN else 1


def _super_bytes(fmt: str) -> int:
    """Bytes of a group's scales per super-block (linear_i8.h, SuperScale): the bases, then 8 blocks' multipliers."""
    return 32 * _super_bases(fmt) + 8 * _I8_SCALES[fmt]


def pack_i8(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None,
            scales_dtype: torch.dtype = torch.float16, *, base: torch.Tensor | None = None, three_bits: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed ``(codes, scales)`` of ``rowwise_linear_i8`` from a weight's blocks, ``w = d * q (+ m)``:
    Q4_1 (``q`` uint8 codes 0..15 ``[N, K]``, ``d`` and ``m`` ``[N, K / 32]``; codes up to 31 make it Q5_1;
    ``d`` and ``m`` ``[N, K / 16]``, a scale and a minimum per 16 weights, Q4_1_16, or with codes 0..3 only Q2_16:
    2-bit codes, GGUF Q2_K's),
    Q8_0 (``q`` int8 ``[N, K]``,
    ``d`` ``[N, K / 32]``, ``m`` None), Q8_0_16 (``q`` int8, ``d`` ``[N, K / 16]``: one scale per 16
    weights; with codes in -4..3 only, Q3_16: 3-bit codes ``q + 4``, GGUF Q3_K's), IQ4_NL (``q`` uint8 indices
    0..15 into :data:`IQ4_NL_VALUES`, ``d`` ``[N, K / 32]``,
    ``m`` None: ``w = d * IQ4_NL_VALUES[q]``, GGUF IQ4_NL's and IQ4_XS's) or Q6_16 (``q`` uint8 codes 0..63,
    ``d`` ``[N, K / 16]``, ``m`` None: ``w = d * (q - 32)``, GGUF Q6_K's at their own 6 bits) or, with
    ``scales_dtype=torch.uint8``, MXFP4 (``q`` uint8 indices 0..15 into :data:`MXFP4_VALUES`, ``d`` uint8 ``[N, K /
    32]`` the blocks' E8M0 exponents: :func:`pack_mxfp4`). ``scales_dtype``: float16 (``d`` and
    ``m`` must hold float16 values, as GGUF's Q4_0..Q8_0 blocks store them) or float32 (any float32 values:
    the K-quants' ``d * sc``). ``N % 16 == 0``, ``K % 32 == 0``.

    ``base``: super-block scales (uint8 ``scales``, for ``K % 256 == 0``). ``base`` holds float16 values ``[N, K /
    256, 2]`` (d's and m's bases) when ``m`` is given, else ``[N, K / 256, 1]``; ``d`` and ``m`` are then integer
    multipliers in -128..127 (same shapes as above), and the scales they stand for are ``base[..., 0] * d`` and
    ``base[..., 1] * m`` over each super-block (Q8_0_16's second halves take d's base too): a float16 value times
    an int8, exact in float32. ``scales_dtype`` is then not used.

    int8 codes of at most 16 distinct values (and not Q3_16's) take a grid form, 4-bit indices into the sorted
    values (their table stored with the codes): GRID with a scale per 32 weights, GRID_16 per 16 (float16 or
    float32 scales; not with ``base``): half the bytes of Q8_0's, the same weights (GGUF's IQ1-IQ3 types, whose
    values are a few grid points times a sign).

    ``three_bits=False`` keeps int8 codes at Q8_0's or Q8_0_16's byte a weight, neither Q3_16 nor a grid form (the
    same weights and results: what GGUF Q3_K ran on before Q3_16, for comparisons)."""
    _check_i8_shapes(tuple(q.shape))
    N, K = q.shape
    NG, G = N // I8_GROUP, K // GROUP
    if scales_dtype == torch.uint8 and base is None and m is None:  # MXFP4: d the E8M0 exponents
        return pack_mxfp4(q, d)
    if base is not None:
        scales_dtype = torch.float32  # the checks below take the multipliers as they come; packed as uint8 after
    if scales_dtype not in (torch.float16, torch.float32):
        raise ValueError(f"pack_i8: scales_dtype must be torch.float16 or torch.float32, got {scales_dtype}")
    if m is not None or q.dtype == torch.uint8:
        if m is not None and (q.dtype != torch.uint8 or int(q.max()) > 31):
            raise ValueError("pack_i8: Q4_1 / Q5_1 codes must be uint8 in 0..31")
        six = m is None and d.dim() == 2 and d.shape == (N, 2 * G)  # Q6_16: a scale per 16 weights
        sixteen_min = m is not None and d.dim() == 2 and d.shape == (N, 2 * G)  # Q4_1_16: and a minimum
        if sixteen_min and (int(q.max()) > 15 or m.shape != d.shape):
            raise ValueError(f"pack_i8: Q4_1_16 (a scale and a minimum per 16 weights) takes codes in 0..15 and d "
                             f"and m both [{N}, {2 * G}], got codes up to {int(q.max())} and m {list(m.shape)}")
        if m is None and int(q.max()) > (63 if six else 15):
            raise ValueError("pack_i8: uint8 codes without m are IQ4_NL indices in 0..15, or Q6_16 codes in 0..63 "
                             "(with a scale per 16 weights)")
        if sixteen_min and int(q.max()) <= 3:  # Q2_16
            codes = _two_bit_codes(q, NG, G)
        else:
            codes = _nibble_codes(q & 15, NG, G)
        # Q5_1 (codes above 15) and Q6_16: the fifth bits (and Q6_16's sixth), mask v bit 4j + i = code k = 4v + i
        # of row j
        for bit in ([4, 5] if six else [4] if m is not None and int(q.max()) > 15 else []):
            codes = torch.cat([codes, _bit_masks(q, bit, NG, G)], -1)
        halves = ([d[:, 0::2], d[:, 1::2]] if six else [d] if m is None else
                  [d[:, 0::2], d[:, 1::2], m[:, 0::2], m[:, 1::2]] if sixteen_min else [d, m])
    else:
        if q.dtype != torch.int8:
            raise ValueError("pack_i8: Q8_0 / Q8_0_16 codes must be int8")
        sixteen = d.dim() == 2 and d.shape == (N, 2 * G)
        byte = (q.to(torch.int16) + 128).to(torch.uint8)  # the codes as vpdpbusd's unsigned operand
        present = torch.bincount(byte.reshape(-1).long(), minlength=256) > 0 if three_bits and base is None else None
        if three_bits and sixteen and int(q.min()) >= -4 and int(q.max()) <= 3:  # Q3_16: u = q + 4 at 3 bits
            u = (q.to(torch.int16) + 4).to(torch.uint8)
            codes = torch.cat([_two_bit_codes(u & 3, NG, G), _bit_masks(u, 2, NG, G)], -1)
        elif present is not None and int(present.sum()) <= 16:  # GRID / GRID_16: indices, the table after each group
            table = present.nonzero()[:, 0]  # the values + 128, in increasing order
            index = torch.cumsum(present, 0).sub_(1).to(torch.uint8)[byte.long()]
            table = torch.cat([table, table[-1:].expand(16 - table.numel())]).to(torch.uint8)
            codes = torch.cat([_nibble_codes(index, NG, G).reshape(NG, -1), table.expand(NG, 16)], 1)
        else:
            codes = byte.reshape(NG, I8_GROUP, G, 8, 4).permute(0, 2, 3, 1, 4)
        halves = [d[:, 0::2], d[:, 1::2]] if sixteen else [d]
    for h in halves:
        if h.shape != (N, G):
            raise ValueError(f"pack_i8: scales must be [{N}, {G}] (or [{N}, {2 * G}] per 16 weights), got "
                             f"{list(d.shape)}" + ("" if m is None else f" and {list(m.shape)}"))
        if scales_dtype == torch.float16 and not torch.equal(h.float().half().float(), h.float()):
            raise ValueError("pack_i8: float16 scales must be float16 values (as GGUF stores them); pass "
                             "scales_dtype=torch.float32 for others")
        if base is None and scales_dtype == torch.float32 and h.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"pack_i8: float32 scales must come as float32 (or float16), got {h.dtype}")
    if base is not None:
        return codes.reshape(NG, -1).contiguous(), _super_scales(halves, base, N, K, m is not None)
    scales = torch.stack([h.to(scales_dtype).reshape(NG, I8_GROUP, G).transpose(1, 2) for h in halves], 2)
    return codes.reshape(NG, -1).contiguous(), scales.reshape(NG, -1).contiguous()


def pack_mxfp4(q: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rowwise_linear_i8``'s packed MXFP4 ``(codes, scales)``: ``q`` uint8 ``[N, K]`` indices 0..15 into
    :data:`MXFP4_VALUES`, ``e`` uint8 ``[N, K / 32]`` each block's E8M0 exponent; the weight is
    ``e8m0_half(e) * MXFP4_VALUES[q]`` (:func:`e8m0_half`: ``2^(e - 128)``, OpenAI's and GGUF's MXFP4 value exactly).
    The codes are IQ4_NL's nibbles, the scales the exponent bytes ``[N / 16, K / 32 * 16]`` (per block the group's
    16 rows). ``N % 16 == 0``, ``K % 32 == 0``."""
    _check_i8_shapes(tuple(q.shape))
    N, K = q.shape
    NG, G = N // I8_GROUP, K // GROUP
    if q.dtype != torch.uint8 or int(q.max()) > 15 or e.dtype != torch.uint8 or e.shape != (N, G):
        raise ValueError(f"pack_mxfp4: q must be uint8 indices 0..15 [{N}, {K}] and e uint8 exponents [{N}, {G}], got "
                         f"{q.dtype} {list(q.shape)} and {e.dtype} {list(e.shape)}")
    codes = _nibble_codes(q, NG, G).reshape(NG, -1)
    return codes.contiguous(), e.reshape(NG, I8_GROUP, G).transpose(1, 2).reshape(NG, -1).contiguous()


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """float32 ``2^(e - 128)`` of uint8 E8M0 exponents ``e`` (ggml's e8m0_to_fp32_half: ``e`` 0 and 1 the
    subnormals 2^-128 and 2^-127), exact."""
    e = e.to(torch.int32)
    return torch.where(e < 2, 0x00200000 << e, (e - 1) << 23).view(torch.float32)


def _nibble_codes(q: torch.Tensor, NG: int, G: int) -> torch.Tensor:
    """4-bit codes ``q`` (uint8 ``[N, K]``, 0..15) packed ``[NG, G, 256]`` (Q4_1's layout, IQ4_NL's and MXFP4's
    indices alike): byte 4j + i of vector t holds code k = 4t + i of row j in its low nibble, code 16 + k in its
    high one."""
    c = q.reshape(NG, I8_GROUP, G, 2, 4, 4).permute(0, 2, 4, 1, 5, 3)  # [NG, G, t, j, i, nibble]
    return (c[..., 0] | (c[..., 1] << 4)).reshape(NG, G, 256)


def _two_bit_codes(q: torch.Tensor, NG: int, G: int) -> torch.Tensor:
    """Q2_16's (and Q3_16's low) 2-bit codes ``q`` (uint8 ``[N, K]``, 0..3) packed ``[NG, G, 128]``: bits 2s, 2s + 1
    of byte 4j + i of vector u hold code k = 4 (2s + u) + i of row j."""
    c = q.reshape(NG, I8_GROUP, G, 4, 2, 4).permute(0, 2, 4, 1, 5, 3)  # [NG, G, u, j, i, s]
    return (c << (2 * torch.arange(4, dtype=torch.uint8))).sum(-1, dtype=torch.uint8).reshape(NG, G, 128)


def _bit_masks(q: torch.Tensor, bit: int, NG: int, G: int) -> torch.Tensor:
    """Bit ``bit`` of the codes ``q`` (uint8 ``[N, K]``) as 8 little-endian 64-bit masks per block ``[NG, G, 64]``:
    bit 4j + i of mask v is code k = 4v + i of row j (Q5_1's fifth, Q6_16's fifth and sixth, Q3_16's third)."""
    bits = ((q >> bit) & 1).reshape(NG, I8_GROUP, G, 8, 4).permute(0, 2, 3, 1, 4).reshape(NG, G, 8, 8, 8)
    return (bits << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8).reshape(NG, G, 64)


def _unpack_masks(cb: torch.Tensor, offset: int, NG: int, G: int, K: int) -> torch.Tensor:
    """:func:`_bit_masks`' inverse: the bits of the 64 mask bytes at ``offset`` of each block as int64 ``[N, K]``."""
    masks = cb[..., offset: offset + 64].reshape(NG, G, 8, 8, 1).long()  # [NG, G, v, byte, bit]
    bits = ((masks >> torch.arange(8)) & 1).reshape(NG, G, 8, I8_GROUP, 4)  # bit 4j + i of mask v
    return bits.permute(0, 3, 1, 2, 4).reshape(NG * I8_GROUP, K)


def _super_scales(halves, base: torch.Tensor, N: int, K: int, with_min: bool) -> torch.Tensor:
    """pack_i8's uint8 super-block scales: per group of 16 rows and super-block, the float16 bases (16 per base,
    the group's rows) and then the 8 blocks' multipliers in the float scales' order."""
    NG, G, S, NB = N // I8_GROUP, K // GROUP, K // SUPER_BLOCK, 2 if with_min else 1
    if K % SUPER_BLOCK:
        raise ValueError(f"pack_i8: super-block scales need in_features a multiple of {SUPER_BLOCK}, got {K}")
    if base.shape != (N, S, NB) or not base.is_floating_point() or \
            not torch.equal(base.float().half().float(), base.float()):
        raise ValueError(f"pack_i8: base must hold float16 values [{N}, {S}, {NB}], got {base.dtype} "
                         f"{list(base.shape)}")
    for h in halves:
        if h.is_floating_point() and not torch.equal(h, h.round()) or int(h.min()) < -128 or int(h.max()) > 127:
            raise ValueError("pack_i8: with base, d and m are integer multipliers in -128..127")
    mult = torch.stack([h.to(torch.int8).reshape(NG, I8_GROUP, G).transpose(1, 2) for h in halves], 2)
    mult = mult.reshape(NG, S, -1).view(torch.uint8)  # [NG, S, 8 blocks x scales per block]
    b16 = base.half().reshape(NG, I8_GROUP, S, NB).permute(0, 2, 3, 1).contiguous().view(torch.uint8)
    return torch.cat([b16.reshape(NG, S, 32 * NB), mult], -1).reshape(NG, -1).contiguous()


def unpack_i8(codes: torch.Tensor, scales: torch.Tensor, in_features: int):
    """``(format, q, d, m)`` from packed blocks: ``q`` int64 ``[N, K]`` (Q4_1 / Q5_1 / Q4_1_16 / Q2_16 codes
    0..15 / 0..31 / 0..15 / 0..3, or the int8 values of Q8_0 / Q8_0_16 / IQ4_NL / Q6_16 / Q3_16 / GRID / GRID_16:
    for IQ4_NL and the grid forms the grid's values, not the indices, for Q6_16 and Q3_16 the codes minus 32 and 4),
    ``d`` float32 ``[N, K / 32]`` (``[N, K / 16]`` for the forms with a scale per 16 weights: Q8_0_16, Q6_16,
    Q4_1_16, Q2_16, Q3_16, GRID_16) and ``m``
    float32 of ``d``'s shape (None
    but for Q4_1, Q5_1, Q4_1_16 and Q2_16). MXFP4 (uint8 exponents as scales): ``q`` :data:`MXFP4_VALUES`' values,
    ``d`` their :func:`e8m0_half`."""
    NG, K = codes.shape[0], in_features
    G = K // GROUP
    # MXFP4: uint8 exponents, one a block and row (no super-block form has 16 bytes a block)
    mx = (scales.dtype == torch.uint8 and K > 0 and K % GROUP == 0 and scales.dim() == 2
          and codes.shape[1] == G * _I8_CODE_BYTES["MXFP4"] and scales.shape[1] == G * _I8_SCALES["MXFP4"])
    sup = scales.dtype == torch.uint8 and not mx
    ok = K > 0 and K % (SUPER_BLOCK if sup else GROUP) == 0 and scales.dim() == 2
    fmt = "MXFP4" if mx else next((f for f in I8_FORMATS[:-1] if codes.shape[1] == _group_code_bytes(f, G) and (
        scales.shape[1] == (K // SUPER_BLOCK * _super_bytes(f) if sup else G * _I8_SCALES[f]))
        and not (sup and f in _I8_GRIDS)), None) if ok else None
    if fmt is None or scales.shape[0] != NG or scales.dtype not in (torch.float16, torch.float32, torch.uint8):
        raise ValueError(f"unpack_i8: codes {list(codes.shape)} and scales {list(scales.shape)} {scales.dtype} are "
                         f"not packed blocks of {K} inputs")
    if sup:  # the float32 scales they stand for, in the plain layout
        S, NB = K // SUPER_BLOCK, _super_bases(fmt)
        sb = scales.reshape(NG, S, -1)
        b = sb[..., :32 * NB].contiguous().view(torch.float16).float().reshape(NG, S, NB, 1, 1, I8_GROUP)
        mult = sb[..., 32 * NB:].contiguous().view(torch.int8).float().reshape(NG, S, 8, -1, I8_GROUP)
        sets = mult.shape[3]  # of 16 scales per block: a set of minimums takes the second base (m's)
        pick = [1 if fmt in _I8_WITH_MIN and k >= sets // 2 else 0 for k in range(sets)]
        base = b[:, :, pick].reshape(NG, S, 1, sets, I8_GROUP)
        scales = (base * mult).reshape(NG, -1)
    if fmt in ("Q2_16", "Q3_16"):
        cb = codes.reshape(NG, G, -1)
        c = cb[..., :128].reshape(NG, G, 2, I8_GROUP, 4, 1).long() >> (2 * torch.arange(4))  # [NG, G, u, j, i, s]
        q = (c & 3).permute(0, 3, 1, 5, 2, 4).reshape(NG * I8_GROUP, K)
        if fmt == "Q3_16":
            q = (q | (_unpack_masks(cb, 128, NG, G, K) << 2)) - 4
    elif fmt in ("Q4_1", "Q5_1", "IQ4_NL", "Q6_16", "Q4_1_16", "MXFP4", "GRID", "GRID_16"):
        cb = codes[:, :G * _I8_CODE_BYTES[fmt]].reshape(NG, G, -1)
        c = cb[..., :256].reshape(NG, G, 4, I8_GROUP, 4).long()
        q = torch.stack([c & 15, c >> 4], -1).permute(0, 3, 1, 5, 2, 4).reshape(NG * I8_GROUP, K)
        for i, bit in enumerate([4, 5] if fmt == "Q6_16" else [4] if fmt == "Q5_1" else []):
            q = q | (_unpack_masks(cb, 256 + 64 * i, NG, G, K) << bit)
        if fmt in ("IQ4_NL", "MXFP4"):  # indices into the grid
            q = torch.tensor(IQ4_NL_VALUES if fmt == "IQ4_NL" else MXFP4_VALUES, dtype=torch.int64)[q]
        if fmt in _I8_GRIDS:  # indices into each group's own table (its values + 128)
            table = codes[:, G * _I8_CODE_BYTES[fmt]:].long() - 128  # [NG, 16]
            q = torch.gather(table.repeat_interleave(I8_GROUP, 0), 1, q)
        if fmt == "Q6_16":
            q = q - 32
    else:
        q = (codes.reshape(NG, G, 8, I8_GROUP, 4).long() - 128).permute(0, 3, 1, 2, 4).reshape(NG * I8_GROUP, K)
    if mx:  # the exponent bytes as the scales they stand for
        scales = e8m0_half(scales)
    h = scales.reshape(NG, G, -1, I8_GROUP).float().permute(2, 0, 3, 1).reshape(-1, NG * I8_GROUP, G)
    if fmt in _I8_HALVES:
        d16 = torch.stack([h[0], h[1]], -1).reshape(NG * I8_GROUP, 2 * G)
        return fmt, q, d16, (torch.stack([h[2], h[3]], -1).reshape(NG * I8_GROUP, 2 * G) if fmt in _I8_WITH_MIN
                             else None)
    return fmt, q, h[0], (h[1] if fmt in _I8_WITH_MIN else None)


# GGUF block types the integer dot products take, in which packed form (linear_i8.h), with the bytes of a
# block of BLOCK weights: each maps exactly (the dequantised weight is gguf's, bitwise).
GGUF_I8_TYPES = {"Q4_1": ("Q4_1", 32, 20), "Q8_0": ("Q8_0", 32, 34), "Q4_0": ("Q4_1", 32, 18),
                 "Q5_0": ("Q5_1", 32, 22), "Q4_K": ("Q4_1", 256, 144), "Q6_K": ("Q6_16", 256, 210),
                 "Q3_K": ("Q3_16", 256, 110), "Q5_1": ("Q5_1", 32, 24), "Q5_K": ("Q5_1", 256, 176),
                 "IQ4_NL": ("IQ4_NL", 32, 18), "IQ4_XS": ("IQ4_NL", 256, 136), "Q2_K": ("Q2_16", 256, 84),
                 "MXFP4": ("MXFP4", 32, 17), "IQ2_XXS": ("GRID", 256, 66), "IQ2_XS": ("GRID_16", 256, 74),
                 "IQ2_S": ("GRID_16", 256, 82), "IQ3_XXS": ("GRID", 256, 98), "IQ3_S": ("GRID", 256, 110),
                 "IQ1_S": ("GRID", 256, 50), "IQ1_M": ("GRID_16", 256, 56), "TQ1_0": ("Q2_16", 256, 54),
                 "TQ2_0": ("Q2_16", 256, 66)}
# Of those, the types whose codes are read from gguf's dequantised weight and their blocks' scales (the grids of
# the IQ1-IQ3 types and TQ1_0's base-3 digits stay gguf's own code): _gridded_parts.
_GRIDDED = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")


def _with_minimum(q: torch.Tensor, d: torch.Tensor, offset: int):
    """``d * (q - offset)`` blocks (Q4_0, Q5_0: ``q`` uint8 codes, ``d`` float16 values) as ``d * q + m`` with
    ``m = -offset * d``, a float16 value too (a power of two times ``d``) unless it overflows: then as int8
    codes ``q - offset`` (Q8_0's form). Either is gguf's weight exactly."""
    m = -offset * d
    if bool(torch.isfinite(m.half()).all()):
        return q, d, m, torch.float16
    return (q.to(torch.int16) - offset).to(torch.int8), d, None, torch.float16


def gguf_i8_blocks(kind: str, raw: torch.Tensor, in_features: int):
    """GGUF tensor data of type ``kind`` (uint8 ``[N, bytes per row]``, as stored) -> ``(q, d, m,
    scales_dtype)`` for :func:`pack_i8`, such that the weight :func:`pack_i8` reads them as (``d * q (+ m)``;
    ``d * (q - 32)`` for Q6_K's uint8 codes, ``d * IQ4_NL_VALUES[q]`` for the IQ4 indices) is gguf's dequantised
    weight bitwise:

    - Q4_1 (``d * q + m``, float16 scales) and Q8_0 (``d * q``) as they are;
    - Q4_0 and Q5_0 (``d * (q - 8)``, ``d * (q - 16)``) as Q4_1 and Q5_1 with ``m = -8 d`` and ``-16 d``
      (``d * q + m`` is the exact ``d * (q - 8)``), or as Q8_0 with codes ``q - 8``, ``q - 16`` should ``m``
      overflow float16;
    - Q5_1 (``d * q + m``, float16) as Q5_1;
    - Q4_K and Q5_K as Q4_1 and Q5_1 with float32 ``d * sc`` and ``-(dmin * mn)`` per 32 weights (exact
      products of a float16 and a 6-bit integer);
    - Q6_K as Q6_16 with its 6-bit ``q`` (``w = d * sc * (q - 32)``) and float32 ``d * sc`` per 16 weights; Q3_K as
      Q3_16 (its int8 codes in -4..3, which :func:`pack_i8` stores at 3 bits) and float32 ``d * (sc - 32)`` per 16
      weights;
    - IQ4_NL (float16 ``d``) and IQ4_XS (float32 ``d * (ls - 32)`` per 32 weights, exact: at most 17
      significant bits, times a grid value of at most 7) as IQ4_NL, ``q`` the indices;
    - Q2_K as Q2_16 with its 2-bit codes, float32 ``d * sc`` and ``-(dmin * mn)`` per 16 weights (exact products
      of a float16 and a 4-bit integer);
    - MXFP4 (gpt-oss's experts) as MXFP4: ``q`` the indices into :data:`MXFP4_VALUES`, ``d`` the blocks' E8M0
      exponents (uint8, ``scales_dtype`` uint8: for :func:`pack_mxfp4`; the weight is ``e8m0_half(d) *
      MXFP4_VALUES[q]``);
    - the low-bit types, each weight its block's float32 scale times a small integer (:func:`_gridded_parts`):
      int8 codes of at most 16 values, which :func:`pack_i8` packs as a grid form (4-bit indices into the
      tensor's own values): IQ2_XXS and IQ3_XXS (the grid value times its sign; ``d * (0.5 + ls) * 0.25`` and
      ``* 0.5`` per 32 weights), IQ3_S (``d * (1 + 2 ls)`` per 32) and IQ1_S (codes ``8 * (grid + delta)``,
      ``d * (2 s + 1) / 8`` per 32) as GRID; IQ2_XS and IQ2_S (per 16) and IQ1_M (as IQ1_S, per 16) as GRID_16;
      TQ1_0 and TQ2_0 as Q2_16 (ternary ``t`` in 0..2, ``d * t - d``; TQ2_0's 2-bit field may hold 3), with
      super-block scales (bases ``d`` and ``-d``, multipliers 1).

    :func:`gguf_i8_pack` packs the same blocks, the K-quants' and IQ4_XS's scales factored (a smaller form)."""
    q, d, m, scales_dtype, base = _gguf_i8_parts(kind, raw, in_features)
    if base is not None:  # the float32 scales: each base times its multipliers, exact
        per = d.shape[1] // base.shape[1]
        d = base[..., :1].float().repeat_interleave(per, 1).reshape(d.shape) * d.float()
        if m is not None:
            m = base[..., 1:].float().repeat_interleave(per, 1).reshape(m.shape) * m.float()
    return q, d, m, scales_dtype


def gguf_i8_pack(kind: str, raw: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rowwise_linear_i8``'s ``(codes, scales)`` for GGUF tensor data of type ``kind`` (as
    :func:`gguf_i8_blocks`, the same weights bitwise), in its smallest exact form: the K-quants (Q2_K..Q6_K),
    IQ4_XS and the TQ types with super-block scales (uint8: per 256 inputs a float16 ``d`` (and ``-dmin``) per row
    and the sub-blocks' integer multipliers: 0.04-0.08 bytes a weight instead of float32 scales' 0.125-0.25), the
    32-weight types with their float16 scales."""
    q, d, m, scales_dtype, base = _gguf_i8_parts(kind, raw, in_features)
    return pack_i8(q, d, m, scales_dtype, base=base)


def _gguf_i8_parts(kind: str, raw: torch.Tensor, in_features: int):
    """``(q, d, m, scales_dtype, base)``: gguf_i8_blocks' blocks, with for the super-block types (Q2_K..Q6_K,
    IQ4_XS, TQ1_0, TQ2_0) ``base`` the float16 ``[N, K / 256, 1 or 2]`` (``d``, and ``-dmin``) and ``d`` / ``m``
    their int64 multipliers (``sc``, ``mn``, ``sc - 32``, ``ls - 32``); else ``base`` None."""
    if kind not in GGUF_I8_TYPES:
        raise ValueError(f"gguf_i8_blocks: {kind} is not one of {', '.join(GGUF_I8_TYPES)}")
    _, block, nbytes = GGUF_I8_TYPES[kind]
    N = raw.shape[0]
    if in_features % block or raw.dtype != torch.uint8 or raw.shape != (N, in_features // block * nbytes):
        raise ValueError(f"gguf_i8_blocks: {kind} data for {in_features} inputs must be uint8 "
                         f"[N, {in_features // block * nbytes}], got {raw.dtype} {list(raw.shape)}")
    b = raw.reshape(N, -1, nbytes)
    nb = b.shape[1]

    def f16(lo):  # float16 bytes [lo, lo + 2) of each block as float32 [N, nb]
        return b[..., lo:lo + 2].contiguous().view(torch.float16)[..., 0].float()

    def nibbles(x):  # bytes [..., n] -> [..., 2, n]: low nibbles, then high
        return torch.stack([x & 15, x >> 4], -2)

    if kind == "Q8_0":
        return b[..., 2:].contiguous().view(torch.int8).reshape(N, in_features), f16(0), None, torch.float16, None
    if kind == "Q4_1":
        return nibbles(b[..., 4:]).reshape(N, in_features), f16(0), f16(2), torch.float16, None
    if kind == "Q4_0":
        q, d = nibbles(b[..., 2:]).reshape(N, in_features), f16(0)
        return *_with_minimum(q, d, 8), None
    if kind in ("Q5_0", "Q5_1"):
        lo = 2 if kind == "Q5_0" else 4  # after d (and m)
        qh = b[..., lo:lo + 4].contiguous().view(torch.int32)  # [N, nb, 1]: bit i is weight i's fifth bit
        high = (qh >> torch.arange(32, dtype=torch.int32)) & 1  # [N, nb, 32]
        q = nibbles(b[..., lo + 4:]).reshape(N, nb, 32).to(torch.int16) | (high.to(torch.int16) << 4)
        if kind == "Q5_1":
            return q.to(torch.uint8).reshape(N, in_features), f16(0), f16(2), torch.float16, None
        return *_with_minimum(q.to(torch.uint8).reshape(N, in_features), f16(0), 16), None
    if kind in ("Q4_K", "Q5_K"):
        d, dmin, sc12 = f16(0), f16(2), b[..., 4:16].long().reshape(N, nb, 3, 4)
        lo, mid, top = sc12[..., 0, :], sc12[..., 1, :], sc12[..., 2, :]  # sub-blocks 0-3 / 4-7 in 6 bits
        sc = torch.cat([lo & 63, (top & 15) | ((lo >> 2) & 48)], -1)  # [N, nb, 8]
        mn = torch.cat([mid & 63, (top >> 4) | ((mid >> 2) & 48)], -1)
        if kind == "Q4_K":
            q = nibbles(b[..., 16:].reshape(N, nb, 4, 32))  # [N, nb, 4, 2, 32]: 64 weights per 32 bytes
        else:  # qh [32]: bit s of byte l is weight 32s + l's fifth bit; qs [128] as Q4_K's
            high = (b[..., 16:48].reshape(N, nb, 1, 32) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1
            q = nibbles(b[..., 48:].reshape(N, nb, 4, 32)).reshape(N, nb, 8, 32) | (high << 4)
        return (q.reshape(N, in_features), sc.reshape(N, -1), mn.reshape(N, -1), torch.float32,
                torch.stack([d, -dmin], -1))
    if kind in _GRIDDED:
        return _gridded_parts(kind, raw, b, f16(0) if kind not in ("IQ1_M", "TQ1_0", "TQ2_0") else None)
    if kind == "MXFP4":  # e (E8M0), qs [16]: the low nibbles are weights 0-15, the high ones 16-31
        return nibbles(b[..., 1:]).reshape(N, in_features), b[..., 0].contiguous(), None, torch.uint8, None
    if kind == "IQ4_NL":  # d float16, qs [16]: the low nibbles are weights 0-15, the high ones 16-31
        return nibbles(b[..., 2:]).reshape(N, in_features), f16(0), None, torch.float16, None
    if kind == "IQ4_XS":  # d float16, scales_h uint16, scales_l [4], qs [128] per 256 weights (8 sub-blocks of 32)
        lo = torch.stack([b[..., 4:8] & 15, b[..., 4:8] >> 4], -1).reshape(N, nb, 8).long()
        hi = (b[..., 2:4].contiguous().view(torch.int16).long() >> torch.arange(0, 16, 2)) & 3  # [N, nb, 8]
        ls = (lo | (hi << 4)) - 32
        q = nibbles(b[..., 8:].reshape(N, nb, 8, 16))  # [N, nb, 8, 2, 16]
        return q.reshape(N, in_features), ls.reshape(N, -1), None, torch.float32, f16(0)[..., None]
    if kind == "Q2_K":  # scales [16] (4-bit sc | 4-bit mn << 4), qs [64], d, dmin float16 per 256 weights
        sc16, qs = b[..., :16].long(), b[..., 16:80]
        # weight 128n + 32j + l (l < 32) is bits 2j..2j+1 of qs[32n + l]; sub-block s (16 weights) uses sc16[s]
        q = (qs.reshape(N, nb, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3
        return (q.reshape(N, in_features), (sc16 & 15).reshape(N, -1), (sc16 >> 4).reshape(N, -1), torch.float32,
                torch.stack([f16(80), -f16(82)], -1))
    if kind == "Q3_K":  # hmask [32], qs [64], 6-bit scales [12], d float16 per 256 weights
        hmask, qs, sc12 = b[..., :32], b[..., 32:96], b[..., 96:108]
        low = ((qs.reshape(N, nb, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3)
        high = (hmask.reshape(N, nb, 1, 32) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1
        q = low.reshape(N, nb, 256).to(torch.int16) - 4 * (1 - high.reshape(N, nb, 256).to(torch.int16))
        lo = torch.stack([sc12[..., :8] & 15, sc12[..., :8] >> 4], -2).reshape(N, nb, 16)
        hi = ((sc12[..., 8:12].reshape(N, nb, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1))
              & 3).reshape(N, nb, 16)
        sc = (lo | (hi << 4)).long() - 32
        return q.to(torch.int8).reshape(N, in_features), sc.reshape(N, -1), None, torch.float32, f16(108)[..., None]
    # Q6_K: ql [128], qh [64], scales int8 [16], d float16 per 256 weights (gguf's order of the 6-bit codes)
    ql, qh = b[..., :128], b[..., 128:192]
    sc = b[..., 192:208].contiguous().view(torch.int8).long()
    low = nibbles(ql.reshape(N, nb, 2, 64)).reshape(N, nb, 8, 32)
    high = ((qh.reshape(N, nb, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3)
    q = low | (high.reshape(N, nb, 8, 32) << 4)  # 0..63: w = d * sc * (q - 32)
    return q.reshape(N, in_features), sc.reshape(N, -1), None, torch.float32, f16(208)[..., None]


def _gridded_parts(kind: str, raw: torch.Tensor, b: torch.Tensor, d: torch.Tensor | None):
    """:func:`_gguf_i8_parts` for the :data:`_GRIDDED` types: each block's scales from its bytes ``b`` (``[N, K /
    256, bytes]``; ``d`` its float16 ``d`` as float32 where stored first), computed in float32 as gguf computes
    them (each product exact), and the codes from gguf's dequantised weight: ``w / scale`` (TQ's ``(w - m) /
    d``), integers by construction, checked (``d * q (+ m)`` must give back ``w``: a block whose scale is not
    finite raises). The IQ types' int8 codes take at most 16 values, so :func:`pack_i8` packs them as a grid form."""
    import gguf

    N, nb, _ = b.shape
    w = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), getattr(gguf.GGMLQuantizationType, kind)))
    w = w.float().reshape(N, -1)

    def nibbles(x):  # [N, nb, n] bytes -> [N, nb, 2n]: byte i's low nibble, then its high one
        return torch.stack([x & 15, x >> 4], -1).reshape(N, nb, -1).float()

    def top_nibbles(lo, n):  # the top nibble of n little-endian uint32 words from byte lo (stride 4, or 8: pairs)
        stride = 8 if kind == "IQ2_XXS" else 4
        return (b[..., lo + stride - 1:lo + stride * n:stride] >> 4).float()

    def u16(lo, n):  # n little-endian uint16 from byte lo, as int64
        return b[..., lo:lo + 2 * n].contiguous().view(torch.int16).long() & 0xFFFF

    if kind in ("TQ1_0", "TQ2_0"):  # w = d * (t - 1), d float16 per 256 (last): Q2_16, d * t + (-d) (TQ2_0's
        # 2-bit t may be 3, which gguf reads as 2 d)
        lo = GGUF_I8_TYPES[kind][2] - 2
        d = b[..., lo:lo + 2].contiguous().view(torch.float16)[..., 0]
        q = _exact_codes(kind, w, d.float(), -d.float(), 0, 3)
        ones = torch.ones(N, nb * 16, dtype=torch.int64)
        return q.to(torch.uint8), ones, ones, torch.float32, torch.stack([d, -d], -1)
    if kind == "IQ1_M":  # d's float16 bits in the top nibbles of the 4 scale words; 3-bit s per 16 weights
        sc = u16(48, 4)
        bits = (sc[..., 0] >> 12) | ((sc[..., 1] >> 8) & 0xF0) | ((sc[..., 2] >> 4) & 0xF00) | (sc[..., 3] & 0xF000)
        d = bits.to(torch.int16).view(torch.float16).float()
        s = ((sc[..., :, None] >> torch.tensor([0, 3, 6, 9])) & 7).reshape(N, nb, 16).float()
        scale = (d[..., None] * (2 * s + 1)) * 0.125  # codes 8 (grid + delta): -9, -7, -1, 1, 7, 9
    elif kind in ("IQ2_XXS", "IQ3_XXS"):  # a 4-bit ls in each 32 weights' scale word: d * (0.5 + ls) * 0.25 (0.5)
        ls = top_nibbles(2, 8) if kind == "IQ2_XXS" else top_nibbles(66, 8)
        scale = d[..., None] * (0.5 + ls) * (0.25 if kind == "IQ2_XXS" else 0.5)
    elif kind in ("IQ2_XS", "IQ2_S"):  # 4-bit ls per 16 weights
        ls = nibbles(b[..., 66:74] if kind == "IQ2_XS" else b[..., 74:82])
        scale = d[..., None] * (0.5 + ls) * 0.25
    elif kind == "IQ3_S":  # db = d * (1 + 2 ls) per 32; grid values odd 1..15, signed
        scale = d[..., None] * (1 + 2 * nibbles(b[..., 106:110]))
    else:  # IQ1_S: dl = d * (2 ((qh >> 12) & 7) + 1) per 32 (qh uint16); codes 8 (grid + delta), delta ±1/8
        scale = (d[..., None] * (2 * ((u16(34, 8) >> 12) & 7) + 1).float()) * 0.125
    scale = scale.reshape(N, -1)  # int8 codes (the grid value times its sign): a grid form
    q = _exact_codes(kind, w, scale, None, -127, 127)
    return q.to(torch.int8), scale, None, torch.float32, None


def _exact_codes(kind: str, w: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, lo: int, hi: int):
    """Integer codes ``q`` (``[N, K]``) in ``lo..hi`` with ``d * q (+ m) == w`` for float32 weights ``w`` ``[N, K]``
    and a ``d`` (and ``m``) ``[N, K / n]`` per block of ``n`` consecutive weights of a row, or ``ValueError``."""
    N = w.shape[0]
    w = w.reshape(N, d.shape[1], -1)
    d, m = d[..., None], None if m is None else m[..., None]
    t = w if m is None else w - m
    q = torch.where(d != 0, t / torch.where(d != 0, d, 1), 0).round_().clamp_(lo, hi).nan_to_num_(0)
    zero = (d == 0).expand_as(q)  # a zero scale: any code gives w = 0; one the tensor already has (no new value)
    if bool(zero.any()) and not bool(zero.all()):
        q = torch.where(zero, q[~zero][0], q)
    back = d * q if m is None else d * q + m
    q = q.reshape(N, -1)
    if not torch.equal(back, w):
        raise ValueError(f"gguf_i8_blocks: a {kind} block's weights are not its scale times integer codes in "
                         f"{lo}..{hi} (a scale that is not finite?)")
    return q


def quantize_activations_i8(x: torch.Tensor):
    """x float32 ``[M, K]`` rounded to int8 blocks of 32: ``(q`` int64 ``[M, K / 32, 32]``, ``dx``, ``sx``
    float32 ``[M, K / 32])`` as linear_i8.h defines them (``dx`` NaN for a block with inf or NaN)."""
    M, K = x.shape
    xb = x.float().reshape(M, K // GROUP, GROUP)
    finite = torch.isfinite(xb).all(-1)
    d = xb.abs().amax(-1) / 127
    ok = finite & (d > 0)
    safe = torch.where(ok, d, 1)[..., None]
    q = torch.where(ok[..., None], torch.round(torch.where(ok[..., None], xb, 0) / safe).clamp(-127, 127), 0)
    dx = torch.where(finite, d, float("nan"))
    return q.long(), dx, q.sum(-1)


def rowwise_linear_i8_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``triforce_C::rowwise_linear_i8`` in PyTorch, bitwise: float32 ``[M, N]`` (see linear_i8.h)."""
    M, K = x.shape
    fmt, w, d, m = unpack_i8(codes, scales, K)
    N, G = w.shape[0], K // GROUP
    q, dx, sx = quantize_activations_i8(x)
    sm = dx * sx
    acc = torch.zeros(M, N)
    if fmt in _I8_HALVES:  # each half of a block on its own: (d_0 dx) isum_0 + (d_1 dx) isum_1 (+ m_h (dx sx_h))
        isum = torch.einsum("mghi,nghi->ghmn", q.reshape(M, G, 2, 16), w.reshape(N, G, 2, 16)).float()
        smh = dx[..., None] * q.reshape(M, G, 2, 16).sum(-1).float()  # [M, G, 2]: dx * sx_h
        for b in range(G):
            t = (d[None, :, 2 * b] * dx[:, b, None]) * isum[b, 0]
            t = t + (d[None, :, 2 * b + 1] * dx[:, b, None]) * isum[b, 1]
            if m is not None:
                t = t + m[None, :, 2 * b] * smh[:, b, 0, None]
                t = t + m[None, :, 2 * b + 1] * smh[:, b, 1, None]
            acc = acc + t
        return acc
    isum = torch.einsum("mgi,ngi->gmn", q, w.reshape(N, G, GROUP)).float()  # exact: |isum| < 2^24
    for b in range(G):
        t = (d[None, :, b] * dx[:, b, None]) * isum[b]
        if m is not None:
            t = t + m[None, :, b] * sm[:, b, None]
        acc = acc + t
    return acc


def _i8_kernel_available() -> bool:
    return _kernel_available("rowwise_linear_i8")


class Int8DotLinear(_FixedDtypeScales):
    """A linear layer on GGUF weight blocks (:data:`GGUF_I8_TYPES`, mapped by :func:`gguf_i8_blocks`)
    that rounds its input to int8 blocks of 32 and sums the products as integers (llama.cpp's class of
    arithmetic; the exact definition in csrc/include/triforce/linear_i8.h): ``codes`` uint8 and ``scales``
    float16 or float32 buffers in ``rowwise_linear_i8``'s packed layout (:func:`pack_i8`), optional float32
    ``bias``. Not bitwise a float32
    ``Linear`` (the input is rounded), but one arithmetic everywhere: the kernel on the CPU at every row count,
    and :func:`rowwise_linear_i8_reference` (bitwise the kernel) where the kernel is missing or the input is
    elsewhere. Each output row depends on its input row only, so a verification pass of any size computes
    what an autoregressive step computes. Inputs of other float dtypes are computed in float32 and cast back;
    the rounding has no gradient (no autograd through it)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        if codes.dtype != torch.uint8 or scales.dtype not in (torch.float16, torch.float32, torch.uint8) \
                or codes.dim() != 2 or scales.dim() != 2:
            raise ValueError("Int8DotLinear: codes must be 2-D uint8 and scales 2-D float16, float32 or uint8 "
                             "(super-block scales; pack_i8 makes them)")
        self._scales_dtype = scales.dtype  # the blocks' d and m, not a weight in the model's dtype
        self.format = unpack_i8(codes[:1], scales[:1], in_features)[0]  # checks the shapes
        self.in_features, self.out_features = in_features, codes.shape[0] * I8_GROUP
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    @classmethod
    def from_q4(cls, mod: "Q4Linear") -> "Int8DotLinear":
        """The same Q4_1 blocks as ``mod`` (a :class:`Q4Linear`), packed for integer dot products."""
        N, K = mod.out_features, mod.in_features
        b = mod.blocks.reshape(N, K // Q4_1_BLOCK, Q4_1_BLOCK_BYTES)
        dm = b[..., :8].contiguous().view(torch.float32)
        c = b[..., 8:]
        q = torch.cat([c & 15, c >> 4], -1).reshape(N, K)
        return cls(*pack_i8(q, dm[..., 0], dm[..., 1]), K, mod.bias)

    @classmethod
    def from_q8(cls, mod: "Q8Linear") -> "Int8DotLinear":
        """The same Q8_0 values as ``mod`` (a :class:`Q8Linear` whose scales are float16 values)."""
        return cls(*pack_i8(mod.qweight, mod.scales), mod.in_features, mod.bias)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight (float32, computed on each access): gguf's ``d * q + m`` or ``d * q``."""
        _, q, d, m = unpack_i8(self.codes, self.scales, self.in_features)
        qf = q.float().reshape(self.out_features, d.shape[1], -1)
        w = qf * d[..., None] if m is None else qf * d[..., None] + m[..., None]
        return w.reshape(self.out_features, self.in_features)

    def forward(self, x):
        dtype, b = x.dtype, self.bias
        x2 = x.float().reshape(-1, x.shape[-1]).detach()
        if x2.device.type == "cpu" and _i8_kernel_available():
            y = torch.ops.triforce_C.rowwise_linear_i8(x2, self.codes, self.scales)
        else:
            y = rowwise_linear_i8_reference(x2.cpu(), self.codes.cpu(), self.scales.cpu()).to(x2.device)
        y = y.view(*x.shape[:-1], -1)
        if b is not None:
            y = y.add_(b.float())
        return y.to(dtype)

    def fused_projection(self, dtype: torch.dtype):
        """``(codes, scales, bias)`` for the fused decoder layer (float32 inputs, the kernel present), else
        ``None`` (see ``triforce.models.llama.DecoderLayer.fused_arguments``)."""
        if dtype != torch.float32 or not _i8_kernel_available():
            return None
        return self._buffers["codes"], self._buffers["scales"], self._parameters.get("bias")

    def extra_repr(self) -> str:
        scales = str(self.scales.dtype).removeprefix("torch.")
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.format} ({scales} "
                f"scales) x int8 blocks")


def _copy_with_linears(model, replace):
    """A shallow copy of ``model`` sharing everything (embedding, norms, buffers) but its linear layers:
    ``replace(name, module)`` gives each layer's module in the copy (``name`` as in ``named_modules``;
    the LM head's is ``"lm_head"``)."""
    with torch.no_grad():
        lm_head = replace("lm_head", model.lm_head)  # before the copy: a tied head is replaced once
        clone = copy.copy(model)  # shallow: the module dicts below are replaced, not shared
        clone._modules = dict(model._modules)
        clone.lm_head = lm_head
        clone.model = copy.copy(model.model)
        clone.model._modules = dict(model.model._modules)
        layers = nn.ModuleList()
        for i, layer in enumerate(model.model.layers):
            new = copy.copy(layer)
            new._modules = dict(layer._modules)
            for part in ("self_attn", "mamba", "mlp"):
                if part in layer._modules:  # (Mamba-2's layers have no MLP; Falcon-H1's a mixer beside the attention)
                    new._modules[part] = _replace_linears(layer._modules[part], f"model.layers.{i}.{part}", replace)
            layers.append(new)
        clone.model._modules["layers"] = layers
        clone._parameters = dict(model._parameters)
        clone._buffers = dict(model._buffers)
    return clone


def _with_buffers(new: nn.Module, old: nn.Module) -> nn.Module:
    """``new`` (a linear layer's replacement) holding ``old``'s buffers too (DeepSeek-V3's router's correction
    bias), shared."""
    for key, b in old._buffers.items():
        if key not in new._buffers and b is not None:
            new.register_buffer(key, b)
    return new


def _replace_linears(module: nn.Module, name: str, replace) -> nn.Module:
    """A shallow copy of ``module`` (named ``name``) whose ``nn.Linear`` s, at any depth (a mixture of experts'
    ``experts.{e}.gate_up_proj``), are ``replace(their name, them)``; the other modules stay shared."""
    sub = copy.copy(module)
    sub._modules = {
        n: _with_buffers(replace(f"{name}.{n}", m), m) if isinstance(m, nn.Linear)
        else _replace_linears(m, f"{name}.{n}", replace) if m is not None and m._modules else m
        for n, m in module._modules.items()}
    return sub


ACTIVATIONS = ("float32", "int8")


def gguf_copy(model, path, activations: str = "float32") -> Llama:
    """A copy of ``model`` (a float32 :class:`~triforce.models.Llama` on the CPU, loaded from the GGUF file
    ``path``) whose linear layers run on the file's own blocks: Q4_1 tensors as :class:`Q4Linear`, Q8_0
    tensors as :class:`Q8Linear` (the tied LM head on the embedding's blocks); layers of other types stay
    float32. It computes bitwise what ``model`` computes on the CPU and reads 0.625 (Q4_1) or 1.0625 (Q8_0)
    bytes per weight instead of 4. Each replaced layer's dequantised weight is compared with the model's
    float32 weight, bitwise: a model whose weights are not that file's raises ``ValueError``.

    ``activations="int8"``: those layers (where ``out_features % 16 == 0``), and those on Q4_0, Q5_0, Q5_1, Q2_K,
    Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4 and the IQ1-IQ3 and TQ types' tensors (:data:`GGUF_I8_TYPES`: the
    Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS and low-bit mixes), become
    :class:`Int8DotLinear` instead: the input rounded to int8 blocks, integer dot products (llama.cpp's class
    of arithmetic). Not bitwise ``model`` (the inputs are rounded), but one deterministic arithmetic whose rows
    are independent, so every engine still emits exactly this copy's autoregressive output; 2.5-3.3x faster
    products on a Zen 4 core (docs/model.md, "Integer dot products")."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"gguf_copy: activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    from .loading import read_gguf_blocks

    if not isinstance(model, Llama):
        raise TypeError(f"gguf_copy: expected a triforce.models.Llama, got {type(model).__name__}")
    if model.dtype != torch.float32 or model.device.type != "cpu":
        raise ValueError(f"gguf_copy: expected a float32 model on the CPU, got {model.dtype} on {model.device}")
    blocks = read_gguf_blocks(path, tuple(GGUF_I8_TYPES) if activations == "int8" else ("Q4_1", "Q8_0"))
    return _copy_with_linears(model, _gguf_layers(blocks, activations, path, model.config.tie_word_embeddings))


def _gguf_layers(blocks: dict, activations: str, path, tied: bool):
    """``replace(name, module)`` for :func:`_copy_with_linears`: a linear layer whose weight is among the file's
    ``blocks`` (a tied LM head: the embedding's) on those blocks (see :func:`gguf_copy`), checked bitwise
    against the module's weight unless that weight was never loaded (a meta tensor: :func:`load_gguf_int8`)."""
    if tied:
        blocks = {**blocks, "lm_head.weight": blocks.get("model.embed_tokens.weight")}

    def replace(name, mod):
        found = blocks.get(f"{name}.weight")
        if found is None or type(mod.weight) is not nn.Parameter:
            return mod
        kind, b = found
        if activations == "int8" and mod.out_features % I8_GROUP == 0:
            new = Int8DotLinear(*gguf_i8_pack(kind, b, mod.in_features), mod.in_features, mod.bias)
        elif kind in ("Q4_1", "Q8_0"):
            new = (Q4Linear(gguf_q4_1_blocks(b), mod.in_features, mod.bias) if kind == "Q4_1"
                   else _q8_0_linear(b, mod.in_features, mod.bias))
        else:  # another type, on a layer the packed groups of 16 rows do not fit: float32, as loaded
            return mod
        w = None if mod.weight.is_meta else new.weight  # (dequantised on each access: once here)
        if w is not None and (w.shape != mod.weight.shape or not torch.equal(w, mod.weight)):
            raise ValueError(f"gguf_copy: {name}'s weight is not the dequantised {kind} tensor of {str(path)!r} "
                             f"(a model loaded from another file, or changed since)")
        return new

    return replace


def load_gguf_int8(path) -> Llama:
    """The model of the GGUF file ``path`` on its own blocks with int8 activations, bitwise what
    ``gguf_copy(Llama.from_pretrained(path), path, activations="int8")`` computes, built without a float32 copy
    of the layers it packs: those tensors are never dequantised (the rest, the embedding table included, is
    float32 as :meth:`Llama.from_pretrained` loads it; nothing is written to the conversion cache; a mixture of
    experts' stacked experts too, expert by expert). A
    Qwen2.5-Coder-1.5B Q4_K_M file: 33 s and a 4.3 GB peak resident size (the mapped file beside the packed
    layers and the float32 embedding) against 90 s and 9.2 GB through the float32 model."""
    from .loading import _build, fused_parts, open_gguf, read_gguf, read_gguf_blocks

    reader = open_gguf(Path(path))
    blocks = read_gguf_blocks(path, tuple(GGUF_I8_TYPES), reader)

    def packed(key, kind, shape):  # a linear layer's weight that replace() below builds from its blocks
        parts = fused_parts(key)  # (Phi-3's fused tensors: packed when every part is)
        if parts is not None:
            return all(p in blocks and blocks[p][1].shape[0] % I8_GROUP == 0 for p in parts)
        if key.endswith("_exps"):  # a mixture's stacked experts [E, rows, in]: packed when every expert is
            stem, proj = key.rsplit(".", 1)
            name = "down_proj" if proj == "down_exps" else "gate_up_proj"
            parts = [blocks.get(f"{stem}.experts.{e}.{name}.weight") for e in range(shape[0])]
            return all(p is not None and p[1].shape[0] % I8_GROUP == 0 for p in parts)
        linear = key == "lm_head.weight" or (key.startswith("model.layers.") and key.endswith("_proj.weight"))
        return linear and key in blocks and len(shape) == 2 and shape[0] % I8_GROUP == 0

    config, sd = read_gguf(Path(path), skip=packed, reader=reader)
    skipped = {k for k in blocks if k not in sd}
    model = _build(config, sd, "cpu", torch.float32, missing_ok=skipped)
    out = _copy_with_linears(model, _gguf_layers(blocks, "int8", path, config.tie_word_embeddings))
    if any(p.is_meta for p in out.parameters()):
        raise ValueError(f"load_gguf_int8: some weights of {str(path)!r} were neither loaded nor packed")
    return out


def is_mxfp4_checkpoint(path) -> bool:
    """Whether ``path`` is a Hugging Face directory whose ``config.json`` says its experts are MXFP4 blocks
    (``quantization_config`` ``{"quant_method": "mxfp4"}``: OpenAI's GPT-OSS checkpoints)."""
    cfg = Path(path) / "config.json"
    try:
        q = json.loads(cfg.read_text()).get("quantization_config") if cfg.is_file() else None
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(q, dict) and q.get("quant_method") == "mxfp4"


def load_mxfp4_int8(path) -> Llama:
    """An MXFP4 checkpoint directory's model (OpenAI's GPT-OSS: each layer's experts as ``*_blocks`` / ``*_scales``,
    :func:`is_mxfp4_checkpoint`) with its experts on their own blocks and int8 activations: each expert's
    projections an :class:`Int8DotLinear` of the MXFP4 form (17 bytes per 32 weights, as in the file; weight
    ``2^(s - 127) * FP4[code]``, what :func:`~triforce.models.loading.dequantize_mxfp4` computes, bitwise), its bias
    the checkpoint's, never dequantised; the rest float32 as :meth:`Llama.from_pretrained` loads it. The gate and
    up rows, interleaved in the checkpoint, become ``gate_up_proj``'s ``[gate; up]``; each block's codes (byte
    ``j``: weights ``2j`` and ``2j + 1``) are repacked as the kernel's nibbles. gpt-oss-20b: ~10 GB of experts
    instead of ~38 GB dequantised to bfloat16."""
    from .loading import _GPT_OSS_EXPERTS, _build, _read_hf_dir, gate_up_rows, mxfp4_codes

    path = Path(path)
    if not is_mxfp4_checkpoint(path):
        raise ValueError(f"load_mxfp4_int8: {str(path)!r} is not a checkpoint directory with quantization_config "
                         "mxfp4")
    config, sd = _read_hf_dir(path)
    blocks = {}
    for name in list(sd):
        m = _GPT_OSS_EXPERTS.fullmatch(name)
        if m is not None and m[3] in ("_blocks", "_scales"):
            blocks.setdefault((m[1], m[2]), {})[m[3]] = sd.pop(name)
    E = config.experts.count if config.experts is not None else 0
    missing = {f"{stem}.{e}.{proj}.weight" for stem, proj in blocks for e in range(E)}
    model = _build(config, sd, "cpu", torch.float32, missing_ok=missing)
    for stem, proj in list(blocks):  # each stacked tensor freed once packed (the peak: the checkpoint's blocks once)
        parts = blocks.pop((stem, proj))
        b, s = parts.get("_blocks"), parts.get("_scales")
        if b is None or s is None or b.dtype != torch.uint8 or s.dtype != torch.uint8 or b.dim() != 4 \
                or b.shape[-1] != 16 or s.shape != b.shape[:-1] or b.shape[0] != E or b.shape[1] % I8_GROUP:
            raise ValueError(f"load_mxfp4_int8: {stem}.{proj}_blocks and _scales must be uint8 [{E}, rows (a multiple "
                             f"of {I8_GROUP}), K / 32, 16] and [{E}, rows, K / 32], got "
                             f"{None if b is None else (b.dtype, list(b.shape))} and "
                             f"{None if s is None else (s.dtype, list(s.shape))}")
        rows, K = b.shape[1], b.shape[2] * GROUP
        experts = model.get_submodule(stem)
        for e in range(E):
            q, ex = mxfp4_codes(b[e]).reshape(rows, K), s[e]
            if proj == "gate_up_proj":  # interleaved rows -> [gate; up]
                q, ex = gate_up_rows(q), gate_up_rows(ex)
            old = getattr(experts[e], proj)
            setattr(experts[e], proj, Int8DotLinear(*pack_mxfp4(q.contiguous(), ex.contiguous()), K, old.bias))
        del parts, b, s
    if any(p.is_meta for p in model.parameters()):
        raise ValueError(f"load_mxfp4_int8: some weights of {str(path)!r} were neither loaded nor packed")
    return model


_INT8_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# ---- FP8 weights (an FP8 checkpoint run on its own float8 weights)

def _fp8_kernel_available() -> bool:
    return _kernel_available("rowwise_linear_fp8")


FP8_CHUNK = 64  # codes a chunk of a packed row (csrc linear.h kFp8Chunk)


def pack_fp8(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn ``q`` ``[N, K]`` as ``rowwise_linear_fp8`` reads it: float8_e4m3fn ``[N, K padded to a multiple
    of 64]`` (zero codes after K), within each chunk of 64 code ``16t + 4L + j`` at ``16L + 4t + j`` (``t, L, j < 4``:
    the order in which the kernel's table lookups and unpacking yield 16 consecutive weights a vector)."""
    if q.dtype != torch.float8_e4m3fn or q.dim() != 2:
        raise ValueError(f"pack_fp8: expected a 2-D float8_e4m3fn tensor, got {q.dtype} {list(q.shape)}")
    N, K = q.shape
    Kp = -(-K // FP8_CHUNK) * FP8_CHUNK
    out = torch.zeros(N, Kp, dtype=torch.uint8)
    out[:, :K] = q.view(torch.uint8)
    return out.view(N, Kp // 64, 4, 4, 4).transpose(2, 3).reshape(N, Kp).view(torch.float8_e4m3fn)


def unpack_fp8(packed: torch.Tensor, K: int) -> torch.Tensor:
    """:func:`pack_fp8`'s inverse: float8_e4m3fn ``[N, K]``."""
    N, Kp = packed.shape
    return packed.view(torch.uint8).view(N, Kp // 64, 4, 4, 4).transpose(2, 3).reshape(N, Kp)[:, :K].contiguous(
    ).view(torch.float8_e4m3fn)


def fp8_chunk_scales(row_scales: torch.Tensor, block_cols: int, K: int) -> torch.Tensor:
    """float32 ``[N, ceil(K / 64)]``: each chunk of 64 columns' scale, from ``row_scales`` ``[N, ceil(K /
    block_cols)]`` (``block_cols`` a multiple of 64, or at least K: a chunk never spans two blocks)."""
    if not (block_cols % FP8_CHUNK == 0 or block_cols >= K):
        raise ValueError(f"fp8_chunk_scales: block_cols must be a multiple of {FP8_CHUNK} or at least {K}, got "
                         f"{block_cols}")
    return row_scales[:, torch.arange(0, K, FP8_CHUNK) // block_cols].float().contiguous()


class Fp8Linear(_FixedDtypeScales):
    """A linear layer of an FP8 checkpoint on its own weights: float8_e4m3fn ``qweight`` ``[out, in]``, held packed
    (``codes``: :func:`pack_fp8`), and its scales ``[out, ceil(in / block_cols)]`` (the checkpoint's block scales
    repeated for each row of a block: weight ``[n, k]`` is ``qweight[n, k] * scales[n, k // block_cols]``, one float32
    rounding, what :func:`~triforce.models.loading.dequantize_fp8` computes), held per chunk of 64 columns (``scales``
    ``[out, ceil(in / 64)]`` float32: ``block_cols`` a multiple of 64 or at least ``in``), optional float32 ``bias``.
    Input and output float32 (other float dtypes are computed in float32 and cast back). Few-row products run
    ``triforce_C::rowwise_linear_fp8``, bitwise ``rowwise_linear`` on the dequantised float32 weight; anything
    else multiplies by that weight with ``F.linear``, as :class:`~triforce.models.llama.Linear` does: the layer
    computes bitwise what the float32 model loaded from the checkpoint computes, from about a byte a weight (rows
    padded to 64 codes, and 4 / 64 for the scales) instead of 4."""

    _scales_dtype = torch.float32

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, block_cols: int, bias: torch.Tensor | None = None):
        super().__init__()
        if qweight.dtype != torch.float8_e4m3fn or qweight.dim() != 2:
            raise ValueError(f"Fp8Linear: qweight must be a 2-D float8_e4m3fn tensor, got {qweight.dtype} "
                             f"{list(qweight.shape)}")
        N, K = qweight.shape
        if not (isinstance(block_cols, int) and block_cols >= 1 and (block_cols % FP8_CHUNK == 0 or block_cols >= K)):
            raise ValueError(f"Fp8Linear: block_cols must be a multiple of {FP8_CHUNK} or at least in_features ({K}), "
                             f"got {block_cols!r}")
        if scales.shape != (N, -(-K // block_cols)) or scales.dtype != torch.float32:
            raise ValueError(f"Fp8Linear: scales must be float32 [{N}, {-(-K // block_cols)}], got {scales.dtype} "
                             f"{list(scales.shape)}")
        self.in_features, self.out_features = K, N
        self.register_buffer("codes", pack_fp8(qweight))
        self.register_buffer("scales", fp8_chunk_scales(scales, block_cols, K))
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    def _apply(self, fn, recurse=True):
        codes = self._buffers["codes"]  # (a dtype cast of the model keeps the float8 codes, as the scales)
        out = super()._apply(fn, recurse)
        if self._buffers["codes"].dtype != codes.dtype:
            self._buffers["codes"] = codes.to(self._buffers["codes"].device)
        return out

    @property
    def qweight(self) -> torch.Tensor:
        """The float8_e4m3fn weight codes ``[out, in]`` (unpacked on each access)."""
        return unpack_fp8(self.codes, self.in_features)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight (float32, computed on each access)."""
        K = self.in_features
        return self.qweight.float() * self.scales.repeat_interleave(FP8_CHUNK, 1)[:, :K]

    def forward(self, x):
        return _quantised_forward(self, x, _fp8_kernel_available, lambda x2: torch.ops.triforce_C.rowwise_linear_fp8(
            x2, self.codes, self.scales))

    def fused_projection(self, dtype: torch.dtype):
        """``(codes, scales, bias)`` for the fused decoder layer and ``moe_experts`` (float32 inputs on the kernel's
        path: their products take these by the codes' dtype), else ``None`` (see
        ``triforce.models.llama.DecoderLayer.fused_arguments``)."""
        if dtype != torch.float32 or not _fp8_kernel_available():
            return None
        return self._buffers["codes"], self._buffers["scales"], self._parameters.get("bias")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8_e4m3fn, chunk={FP8_CHUNK}"


def is_fp8_checkpoint(path) -> bool:
    """Whether ``path`` is a Hugging Face directory whose ``config.json`` (or its image + text wrapper's) says its
    weights are FP8 (``quantization_config`` of quant_method ``fp8``: :func:`triforce.models.config.fp8_config`)."""
    from .config import fp8_config

    cfg = Path(path) / "config.json"
    try:
        d = json.loads(cfg.read_text()) if cfg.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and fp8_config(d.get("quantization_config"))


def load_fp8(path) -> Llama:
    """An FP8 checkpoint directory's model (:func:`is_fp8_checkpoint`) with its linear layers on their own float8
    weights (:class:`Fp8Linear`: each float8_e4m3fn weight with its block or tensor scales, the blocks' columns
    whole chunks of 64), float32 activations: bitwise what ``Llama.from_pretrained(path)`` (float32, every weight
    dequantised) computes, from 1 byte a weight. The weights' names and rows go through the same mapping as the
    float model's (fused projections split, experts' gate and up rows joined, RoPE rows reordered), their scales
    repeated per row beside them (UE8M0 exponents as their float32 powers of two); float8 weights of another kind
    (an embedding, e5m2, column blocks not of 64) and everything else load as the float32 model's."""
    from .loading import _read_hf_dir, fp8_scales

    path = Path(path)
    if not is_fp8_checkpoint(path):
        raise ValueError(f"load_fp8: {str(path)!r} is not a checkpoint directory with an fp8 quantization_config")
    kept = {}
    config, sd = _read_hf_dir(path, torch.float32, kept=kept)
    own = {}
    for name, (q, scale, block) in kept.items():
        N, K = q.shape
        s, cols = fp8_scales(scale, name), K if block is None or scale.numel() == 1 else block[1]
        rows = s.reshape(1, 1).expand(N, 1) if s.numel() == 1 else s.repeat_interleave(block[0], 0)[:N]
        own[name] = q, fp8_chunk_scales(rows, cols, K), None
    return _on_own_weights(path, config, sd, own, "load_fp8")


def q4_1_of(codes: torch.Tensor, scales: torch.Tensor, zero: torch.Tensor | None = None) -> torch.Tensor | None:
    """:class:`Q4Linear`'s Q4_1 blocks of the weight ``codes * scales`` (int8 ``codes`` ``[N, K]``, float32
    ``scales`` ``[N, K / 32]``), the codes those of ``bits <= 4`` minus their ``zero`` points (``[N, K / 32]``,
    or None: none): ``d = scale``, ``m = (-8 - zero) * scale`` and the code ``codes + zero + 8`` in 0..15, so that
    ``d * code + m`` (the kernel's FMA) is the exact product; None unless ``K`` is a multiple of 32, every such
    code in 0..15, and every ``d`` and ``m`` a float16 value (GGUF's blocks widen float16 scales; bfloat16 scales
    of float16's range are)."""
    N, K = codes.shape
    if K % Q4_1_BLOCK or codes.dtype != torch.int8 or scales.shape != (N, K // Q4_1_BLOCK):
        return None
    z = torch.zeros_like(scales, dtype=torch.float64) if zero is None else zero.double()
    d, m = scales.double(), (-8 - z) * scales.double()
    if not (torch.equal(d.half().double(), d) and torch.equal(m.half().double(), m)):
        return None
    q = codes.reshape(N, K // Q4_1_BLOCK, Q4_1_BLOCK).to(torch.int16) + z.to(torch.int16)[..., None] + 8
    if q.numel() and (q.min() < 0 or q.max() > 15):
        return None
    return _q4_1_blocks(d.half(), m.half(), q.to(torch.uint8))


def is_compressed_checkpoint(path) -> bool:
    """Whether ``path`` is a Hugging Face directory whose ``config.json`` (or its image + text wrapper's) has a
    compressed-tensors ``quantization_config`` this reads (:mod:`triforce.models.compressed`)."""
    from .compressed import compressed_config

    cfg = Path(path) / "config.json"
    try:
        d = json.loads(cfg.read_text()) if cfg.is_file() else None
    except (OSError, ValueError):
        return False
    q = d.get("quantization_config") if isinstance(d, dict) else None
    if q is None and isinstance(d, dict) and isinstance(d.get("text_config"), dict):
        q = d["text_config"].get("quantization_config")
    return compressed_config(q)


def load_compressed(path) -> Llama:
    """A compressed-tensors checkpoint directory's model (:func:`is_compressed_checkpoint`) with its linear layers
    on their own codes, float32 activations: FP8 weights on :class:`Fp8Linear` (column blocks whole chunks of 64),
    integer weights of up to 8 bits (7 with zero points, subtracted from the codes) and FP4 ones (codes twice the
    FP4 values, scales halved) on :class:`Q8Linear`'s int8 codes and float32 scales per 32 columns (column blocks
    whole groups of 32; NVFP4's per 16), those of up to 4 bits on :class:`Q4Linear`'s Q4_1 blocks where each scale
    (and zero point times it) is a float16 value (as bfloat16 scales of a normal float16 magnitude are): bitwise
    what ``Llama.from_pretrained(path)`` (float32, every weight dequantised) computes, from about a byte a weight
    (3/4 of one on 4-bit blocks). Activation-ordered groups, stacked weights and everything else load as the
    float32 model's."""
    from .loading import _read_hf_dir

    path = Path(path)
    if not is_compressed_checkpoint(path):
        raise ValueError(f"load_compressed: {str(path)!r} is not a checkpoint directory with a compressed-tensors "
                         "quantization_config")
    kept = {}
    config, sd = _read_hf_dir(path, torch.float32, kept=kept)
    return _on_own_weights(path, config, sd, kept, "load_compressed")


def _on_own_weights(path: Path, config, sd: dict, own: dict, who: str) -> Llama:
    """The model of ``config`` holding float weights ``sd`` and, on their own codes, ``own``: checkpoint name ->
    (float8_e4m3fn codes ``[N, K]``, float32 scales per row and chunk of 64 columns, None: :class:`Fp8Linear`; or
    int8 codes, float32 scales and zero points (or None) per 32 columns: :class:`Q4Linear` where its blocks hold
    them (:func:`q4_1_of`), else :class:`Q8Linear`, the codes minus their zero points). Names and rows go through
    the float model's mapping (``loading.model_names``), so that joined weights (an expert's gate and up) are one
    kind; a weight that is not a linear layer's (an embedding's) is dequantised."""
    from .loading import _build, model_names

    codes = model_names(config, {n: q for n, (q, _, _) in own.items()})
    scales = model_names(config, {n: s for n, (_, s, _) in own.items()})
    zeros = model_names(config, {n: z for n, (_, _, z) in own.items() if z is not None})
    shell = Llama(config, _empty=True)
    linears = {f"{n}.weight" for n, m in shell.named_modules() if isinstance(m, nn.Linear)}

    def layer(name: str, bias=None) -> nn.Module:
        q, s = codes.pop(name), scales.pop(name).contiguous()
        if q.dtype == torch.float8_e4m3fn:
            return Fp8Linear(q, s, FP8_CHUNK, bias)
        blocks = q4_1_of(q, s, zeros.pop(name, None))
        if blocks is not None:
            return Q4Linear(blocks, q.shape[1], bias)
        return Q8Linear(q.contiguous(), s, bias)

    for name in [n for n in codes if n not in linears]:  # (an embedding's, say: dequantised)
        sd[name] = layer(name).weight
    model = _build(config, sd, "cpu", torch.float32, missing_ok=set(codes))

    def replace(name, mod):
        return layer(f"{name}.weight", mod.bias) if f"{name}.weight" in codes else mod

    out = _copy_with_linears(model, replace)
    if any(p.is_meta for p in out.parameters()):
        raise ValueError(f"{who}: some weights of {str(path)!r} were neither loaded nor kept on their codes")
    return out


def int8_copy(model):
    """A copy of ``model`` (a float32 :class:`~triforce.models.Llama`) whose linear layers, the LM head
    included, are :class:`Q8Linear` (see the module docstring). Made once per model and kept while the
    model lives; use it as ``draft=`` of ``speculative`` or ``triforce``."""
    if not isinstance(model, Llama):
        raise TypeError(f"int8_copy: expected a triforce.models.Llama, got {type(model).__name__}")
    if model.dtype != torch.float32:
        raise ValueError(f"int8_copy: expected a float32 model, got {model.dtype}")
    if model not in _INT8_COPIES:
        _INT8_COPIES[model] = _copy_with_linears(model, lambda name, m: Q8Linear.from_linear(m))
    return _INT8_COPIES[model]
