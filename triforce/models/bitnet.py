"""BitNet b1.58's linear layers (``quantization_config`` quant_method ``"bitnet"``): ternary weights, int8 activations.

A ``bitnet`` checkpoint quantised as transformers' BitNet integration reads it holds each decoder layer's projection as
one of (:func:`bitnet_config` says which; the embeddings and the head stay float):

- ``linear_class`` ``"bitlinear"`` (microsoft/bitnet-b1.58-2B-4T): ``weight`` uint8 ``[out / 4, in]``, four ternary
  weights a byte (:func:`unpack_ternary`: row ``i`` of block ``j`` in bits ``2j, 2j + 1`` of row ``i``, stored
  ``w + 1``) and ``weight_scale`` ``[1]``; the input quantised per token to int8 in the model's dtype,
  ``q = round(x * s)`` with ``s = 127 / max|x|`` (the maximum clamped at 1e-5), and
  ``y = (q @ W^T) / (weight_scale * s)``. Every product is an integer and every sum of them exact (in float32, up to
  2^24: 132k inputs), so ``q @ W^T`` is one rounding of the exact integer in any order, as transformers' ``F.linear``
  gives it.
- ``"autobitlinear"`` ``"offline"``: ternary ``weight`` in the model's dtype (or packed as above, unpacked on loading)
  and ``weight_scale``: ``y = linear(fake_quant(x), W) * weight_scale``, ``fake_quant(x)`` the int8 rounding in float32
  divided back (``round(x * s).clamp(-128, 127) / s``, rounded to the dtype); ``"online"``: the float ``weight``
  rounded to ternary at each forward (``round(w / mean|w|).clamp(-1, 1) * mean|w|`` in float32, the mean clamped at
  1e-5), no ``weight_scale``.

Each output row depends on its input row only (:func:`triforce.models.llama.linear`'s row-wise kernels on the CPU), so
a verification pass computes what its one-token steps compute. On the CPU a packed layer's integer sums run as
integers on its 2-bit weights (``triforce_C::ternary_linear``: AVX-512 VNNI, a quarter of int8's bytes, an eighth of
bfloat16's), bitwise the float product."""
from __future__ import annotations

import functools
import os

import torch
from torch import nn

VALUES_PER_BYTE = 4  # ternary weights a packed byte
_KINDS = {"bitlinear": ("offline",), "autobitlinear": ("offline", "online")}
_KEYS = {"quant_method", "linear_class", "quantization_mode", "use_rms_norm", "rms_norm_eps", "modules_to_not_convert"}


def bitnet_config(v) -> bool:
    """Whether ``quantization_config`` ``v`` is BitNet's as read here: ``linear_class`` ``"bitlinear"`` (offline) or
    ``"autobitlinear"`` (offline or online), no RMSNorm inside the linear layers (``use_rms_norm`` false), the
    decoder layers' projections all converted (``modules_to_not_convert`` null or naming the head only)."""
    if not (isinstance(v, dict) and v.get("quant_method") == "bitnet" and set(v) <= _KEYS):
        return False
    kind, mode = v.get("linear_class", "bitlinear"), v.get("quantization_mode", "offline")
    skip = v.get("modules_to_not_convert")
    return mode in _KINDS.get(kind, ()) and not v.get("use_rms_norm", False) and (
        skip is None or isinstance(skip, list) and set(skip) <= {"lm_head"})


def unpack_ternary(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[4 * R, ...]`` ternary weights in ``dtype`` of uint8 ``packed`` ``[R, ...]``: weight row ``j * R + i`` is bits
    ``2j, 2j + 1`` of byte row ``i``, minus 1 (transformers' pack_weights layout)."""
    parts = [((packed >> (2 * j)) & 3) for j in range(VALUES_PER_BYTE)]
    return torch.cat(parts).to(dtype) - 1


def pack_ternary(w: torch.Tensor) -> torch.Tensor:
    """:func:`unpack_ternary`'s inverse: uint8 ``[R, ...]`` of ternary ``w`` ``[4 * R, ...]`` (values -1, 0, 1)."""
    if w.shape[0] % VALUES_PER_BYTE:
        raise ValueError(f"ternary weights of {w.shape[0]} rows do not pack four rows a byte")
    codes = (w.round().clamp(-1, 1) + 1).to(torch.uint8).chunk(VALUES_PER_BYTE)
    out = torch.zeros_like(codes[0])
    for j, c in enumerate(codes):
        out |= c << (2 * j)
    return out


class BitLinear(nn.Module):
    """One BitNet projection (module docstring): ``kind`` ``"bitlinear"``, ``"autobitlinear-offline"`` or
    ``"autobitlinear-online"``; ``weight`` as its checkpoint holds it (packed uint8, or float), ``weight_scale`` where
    the kind has one, ``bias`` (float) or None."""

    def __init__(self, in_features: int, out_features: int, bias: bool, kind: str, dtype=None):
        super().__init__()
        if kind == "bitlinear" and out_features % VALUES_PER_BYTE:
            raise ValueError(f"BitLinear: {out_features} outputs do not pack four a byte")
        self.in_features, self.out_features, self.kind = in_features, out_features, kind
        dtype = dtype or torch.get_default_dtype()
        if kind == "bitlinear":
            self.register_buffer("weight", torch.zeros(out_features // VALUES_PER_BYTE, in_features, dtype=torch.uint8))
        else:
            self.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=dtype), requires_grad=False)
        if kind != "autobitlinear-online":
            self.register_buffer("weight_scale", torch.ones(1, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype), requires_grad=False) if bias else None
        self._ternary = None  # (the packed weight, its unpacked copy in a dtype): made once per weight and dtype

    def ternary(self, dtype: torch.dtype) -> torch.Tensor:
        """The packed weight's ternary values ``[out, in]`` in ``dtype``, unpacked once (kept with the weight)."""
        got = self._ternary
        if got is None or got[0] is not self.weight or got[1].dtype != dtype or got[1].device != self.weight.device:
            got = self._ternary = (self.weight, unpack_ternary(self.weight, dtype))
        return got[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .llama import linear

        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.kind == "bitlinear":  # (transformers' BitLinear: the quantisation in the input's dtype)
            dtype = self.weight_scale.dtype
            s = 127 / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
            q = (x * s).round().clamp(-128, 127).to(torch.int8)
            if _integer_path(q, self.in_features):  # (the exact sums as integers: the same bits, 2-bit weights read)
                flat = torch.ops.triforce_C.ternary_linear(q.reshape(-1, self.in_features), self.weight)
                y = flat.view(*q.shape[:-1], self.out_features).to(torch.float32).to(dtype)
            else:
                y = linear(q.to(dtype), self.ternary(dtype))
            y = y / (self.weight_scale * s)
            return y if bias is None else y + bias
        xf = x.float()  # (AutoBitLinear's ActQuant: in float32, divided back, rounded once)
        s = 127 / xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
        xq = ((xf * s).round().clamp(-128, 127) / s).to(x.dtype)
        w = self.weight
        if self.kind == "autobitlinear-online":  # (its WeightQuant: the master weight rounded at each forward)
            wf = w.float()
            scale = 1.0 / wf.abs().mean().clamp(min=1e-5)
            w = ((wf * scale).round().clamp(-1, 1) / scale).to(w.dtype)
        y = linear(xq, w.to(x.dtype), bias)
        return y if self.kind == "autobitlinear-online" else y * self.weight_scale


def _integer_path(q: torch.Tensor, in_features: int) -> bool:
    """Whether a packed BitLinear's product runs as integers (``triforce_C::ternary_linear``, csrc/cpu/linear.cpp): on
    the CPU with the extension, outside ``torch.compile`` and autograd, where every sum fits float32 exactly (fewer than
    2^24 / 128 inputs: then the float product's one rounding of the exact sum is the integer's, bitwise);
    ``TRIFORCE_TERNARY_LINEAR=0`` turns it off."""
    return (q.device.type == "cpu" and in_features * 128 < 2 ** 24 and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and os.environ.get("TRIFORCE_TERNARY_LINEAR", "1") != "0"
            and _has_op())


@functools.cache
def _has_op() -> bool:
    """The extension is built and has ``ternary_linear`` (read once: an op lookup costs microseconds a layer)."""
    from .llama import _rowwise_available

    return _rowwise_available() and hasattr(torch.ops.triforce_C, "ternary_linear")


_PROJECTIONS = (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj", "down_proj")))


def use_bit_linears(model, q: dict) -> None:
    """``model``'s decoder-layer projections replaced by :class:`BitLinear` s of ``quantization_config`` ``q``'s kind
    (on the device and in the dtype of the ones they replace; their weights are then loaded)."""
    kind = q.get("linear_class", "bitlinear")
    if kind == "autobitlinear":
        kind += "-" + q.get("quantization_mode", "offline")
    for layer in model.model.layers:
        for owner, names in _PROJECTIONS:
            parent = getattr(layer, owner)
            for name in names:
                old = getattr(parent, name)
                with torch.device(old.weight.device):
                    new = BitLinear(old.in_features, old.out_features, old.bias is not None, kind, old.weight.dtype)
                setattr(parent, name, new)
