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
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .llama import ROWWISE_MAX_ROWS, Llama, _rowwise_available

__all__ = ["GROUP", "quantize_q8", "dequantize_q8", "Q8Linear", "int8_copy"]

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


def dequantize_q8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``[N, K]``: ``scales[n, k // 32] * q[n, k]`` (what the kernel multiplies by)."""
    K = q.shape[1]
    return q.float() * scales.repeat_interleave(GROUP, 1)[:, :K]


_Q8_KERNEL = None


def _q8_kernel_available() -> bool:
    """The extension has ``rowwise_linear_q8`` (and the model's streaming kernels are not switched off)."""
    global _Q8_KERNEL
    if _Q8_KERNEL is None:
        _Q8_KERNEL = _rowwise_available() and hasattr(torch.ops.triforce_C, "rowwise_linear_q8")
    return _Q8_KERNEL


class Q8Linear(nn.Module):
    """A linear layer with int8 weights (``qweight`` ``[out, in]``) and float32 ``scales`` ``[out, ceil(in /
    32)]`` (buffers), optional float32 ``bias``. Input and output float32 (other float dtypes are
    computed in float32 and cast back)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError("Q8Linear: qweight must be a 2-D int8 tensor")
        if scales.shape != (qweight.shape[0], -(-qweight.shape[1] // GROUP)) or scales.dtype != torch.float32:
            raise ValueError(f"Q8Linear: scales must be float32 [{qweight.shape[0]}, "
                             f"{-(-qweight.shape[1] // GROUP)}], got {scales.dtype} {list(scales.shape)}")
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
        dtype = x.dtype
        xf = x.float()
        rows = xf.numel() // max(1, xf.shape[-1])
        if (xf.device.type == "cpu" and 0 < rows <= ROWWISE_MAX_ROWS
                and not (torch.is_grad_enabled() and xf.requires_grad) and _q8_kernel_available()):
            y = torch.ops.triforce_C.rowwise_linear_q8(xf.reshape(-1, xf.shape[-1]), self.qweight, self.scales)
            y = y.view(*xf.shape[:-1], -1)
        else:
            y = F.linear(xf, self.weight.to(xf.device))
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)

    def fused_projection(self, dtype: torch.dtype):
        """``(qweight, scales, bias)`` for the fused decoder layer (float32 inputs on the kernel's path),
        else ``None`` (see ``triforce.models.llama.DecoderLayer.fused_arguments``)."""
        if dtype != torch.float32 or not _q8_kernel_available():
            return None
        buffers = self._buffers
        return buffers["qweight"], buffers["scales"], self._parameters.get("bias")  # None: a plain attribute

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, group={GROUP}"


_INT8_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def int8_copy(model):
    """A copy of ``model`` (a float32 :class:`~triforce.models.Llama`) whose linear layers, the LM head
    included, are :class:`Q8Linear` (see the module docstring). Made once per model and kept while the
    model lives; use it as ``draft=`` of ``speculative`` or ``triforce``."""
    if not isinstance(model, Llama):
        raise TypeError(f"int8_copy: expected a triforce.models.Llama, got {type(model).__name__}")
    if model.dtype != torch.float32:
        raise ValueError(f"int8_copy: expected a float32 model, got {model.dtype}")
    if model not in _INT8_COPIES:
        with torch.no_grad():
            lm_head = Q8Linear.from_linear(model.lm_head)  # before the copy: a tied head is quantised once
            clone = copy.copy(model)  # shallow: the module dicts below are replaced, not shared
            clone._modules = dict(model._modules)
            clone.lm_head = lm_head
            clone.model = copy.copy(model.model)
            clone.model._modules = dict(model.model._modules)
            layers = nn.ModuleList()
            for layer in model.model.layers:
                new = copy.copy(layer)
                new._modules = dict(layer._modules)
                for part in ("self_attn", "mlp"):
                    sub = copy.copy(getattr(layer, part))
                    sub._modules = {name: Q8Linear.from_linear(m) if isinstance(m, nn.Linear) else m
                                    for name, m in getattr(layer, part)._modules.items()}
                    new._modules[part] = sub
                layers.append(new)
            clone.model._modules["layers"] = layers
            clone._parameters = dict(model._parameters)
            clone._buffers = dict(model._buffers)
        _INT8_COPIES[model] = clone
    return _INT8_COPIES[model]
