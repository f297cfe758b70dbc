"""``triforce.models.Llama``: a compact Llama (GQA, RoPE incl. Llama-3 scaling, RMSNorm, SwiGLU, tied or
untied head) whose attention over a KV cache goes through ``tk.verify_attention``. Its relatives run on
the same code through the config's switches (``LlamaConfig.model_type``): Mistral, Qwen2/2.5 (q/k/v
biases), Qwen3 (q/k RMSNorm), and biases where Llama's config asks for them.

Module and parameter names mirror Hugging Face's ``LlamaForCausalLM`` (``model.layers.0.self_attn.q_proj
.weight``, ``...q_proj.bias``, ``...self_attn.q_norm.weight``, ``lm_head.weight``), so HF state dicts of
every family load as they are.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _nn_module

from triforce_kernels._backend import backend_status, resolve

from . import cache as _cache
from . import graphs as _graphs
from .cache import RetrievalCache, Step, TokenTree, _KVCache
from .config import LlamaConfig
from .rope import apply_rope, rope_attention_scale, rope_cos_sin, rope_inv_freq, rope_local_inv_freq, rows_inv_freq

__all__ = ["Llama"]


# CPU float32/bfloat16/float16 linears run the row-independent streaming kernel at every row count, so
# a verification pass of any size computes each row's projections with the bits of a one-token step
# (docs/model.md, "Every row count"). Two places stop at this many rows: DecoderLayer's fused path, and
# the linears of a prefill or of a forward without a cache (their rows are never compared with a
# step's, and above this torch's GEMM is the faster: bfloat16 1.15-1.5x the kernel's speed at 256-4096
# rows on 2 AMD EPYC threads, float32 within 7%). Below it the kernel is the faster one: on one AMD EPYC
# core float32 1.05-1.42x torch's GEMM over SmolLM2's MLP matrices and 1.26-1.75x over its LM head at
# 16-128 rows (docs/model.md, "Many rows").
ROWWISE_MAX_ROWS = 128
_ROWWISE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # Linear's streaming kernel
_FUSED_DTYPES = (torch.float32, torch.bfloat16)  # DecoderLayer's fused path (csrc/cpu/decoder.cpp)


def _rowwise_available() -> bool:
    """The extension has the kernel and ``TRIFORCE_ROWWISE_LINEAR`` is not ``0`` (an A/B switch)."""
    global _ROWWISE
    if _ROWWISE is None:
        if os.environ.get("TRIFORCE_ROWWISE_LINEAR", "1") == "0":
            _ROWWISE = False
            return _ROWWISE
        try:
            from triforce_kernels._backend import _extension

            _extension()
            _ROWWISE = hasattr(torch.ops.triforce_C, "rowwise_linear")
        except Exception:  # no extension built: torch's linear everywhere
            _ROWWISE = False
        if _ROWWISE:
            _register_fakes()
    return _ROWWISE


_FAKES = False


def _register_fakes() -> None:
    """Shapes of the model layer's native calls for torch.compile / torch.export (fake tensors), so a
    compiled CPU forward traces them instead of breaking its graph at each one. Once per process."""
    global _FAKES
    if _FAKES:
        return
    _FAKES = True
    ops = torch.ops.triforce_C

    def rows(x, w):
        return x.new_empty(x.shape[0], w.shape[0])

    def attn_in(h, norm_w, eps, w, scales, bias, q_norm_w, k_norm_w, qk_eps, cos, sin, head_dim):
        B, T = h.shape[0], h.shape[1]
        q, k, v = (h.new_empty(B, T, p.shape[0] // head_dim, head_dim) for p in w)
        return q, k, torch.empty_like(k), v

    def attn_out_mlp(h, attn, norm_w, eps, w, scales, bias):
        return torch.empty_like(h)

    torch.library.register_fake("triforce_C::rowwise_linear")(rows)
    if hasattr(ops, "rowwise_linear_heads"):
        torch.library.register_fake("triforce_C::rowwise_linear_heads")(
            lambda x, w: x.new_empty(x.shape[0], x.shape[1], w.shape[1]))
    if hasattr(ops, "rowwise_linear_q8"):
        torch.library.register_fake("triforce_C::rowwise_linear_q8")(lambda x, q, scales: rows(x, q))
    if hasattr(ops, "rowwise_linear_fp8"):
        torch.library.register_fake("triforce_C::rowwise_linear_fp8")(lambda x, q, scales: rows(x, q))
    if hasattr(ops, "rowwise_linear_q4_1"):
        torch.library.register_fake("triforce_C::rowwise_linear_q4_1")(rows)
    for name in ("silu_mul", "gelu_tanh_mul", "gelu_mul"):
        if hasattr(ops, name):
            torch.library.register_fake(f"triforce_C::{name}")(
                lambda gate, up: torch.empty_like(gate, memory_format=torch.contiguous_format))
            torch.library.register_autograd(f"triforce_C::{name}", _glu_backward(name), setup_context=_glu_setup)
    if hasattr(ops, "swiglu_clamped_mul"):
        torch.library.register_fake("triforce_C::swiglu_clamped_mul")(
            lambda gate, up, alpha, limit: torch.empty_like(gate, memory_format=torch.contiguous_format))
        torch.library.register_autograd("triforce_C::swiglu_clamped_mul", _clamped_swiglu_backward,
                                        setup_context=_clamped_swiglu_setup)
    if hasattr(ops, "moe_experts"):
        torch.library.register_fake("triforce_C::moe_experts")(lambda x, *args: torch.empty_like(x))
    if hasattr(ops, "softcap"):
        torch.library.register_fake("triforce_C::softcap")(lambda x, cap: torch.empty_like(x))
    if hasattr(ops, "decoder_attn_in"):
        torch.library.register_fake("triforce_C::decoder_attn_in")(attn_in)
        torch.library.register_fake("triforce_C::decoder_attn_out_mlp")(attn_out_mlp)
    if hasattr(ops, "decoder_attn_out"):
        torch.library.register_fake("triforce_C::decoder_attn_out")(
            lambda h, attn, norm_w, eps, w, scales, bias: (torch.empty_like(h), torch.empty_like(h)))


_ROWWISE = None


# The gated MLP's activations in PyTorch ops, by LlamaConfig.activation: the modules' path off the CPU (and
# without the extension), and the values the native ops' gradients are taken at.
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu,
               "relu2": lambda x: torch.square(F.relu(x)),  # (relu2: Arcee's ungated MLP; exact, so row by row)
               "relu": F.relu}  # (GPT-2's by its key; exact too)


def _glu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _glu_backward(name: str):
    """The gradients of ``triforce_C::silu_mul`` / ``gelu_tanh_mul`` / ``gelu_mul`` (act(gate) * up) through
    ATen's own derivatives, so that the MLP gives the same forward bits with autograd on as off."""
    activation = name.removesuffix("_mul")

    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        d_gate = (torch.ops.aten.silu_backward(grad * up, gate) if activation == "silu" else
                  torch.ops.aten.gelu_backward(grad * up, gate, approximate="tanh" if activation == "gelu_tanh"
                                               else "none"))
        return d_gate, grad * ACTIVATIONS[activation](gate)
    return backward


def _clamped_swiglu_setup(ctx, inputs, output):
    gate, up, ctx.alpha, ctx.limit = inputs
    ctx.save_for_backward(gate, up)


def _clamped_swiglu_backward(ctx, grad):
    """The gradients of ``triforce_C::swiglu_clamped_mul`` as autograd takes them through PyTorch's ops
    (:func:`_clamped_swiglu_ops`), so that the experts give the same forward bits with autograd on as off."""
    gate, up = ctx.saved_tensors
    with torch.enable_grad():
        gate, up = gate.detach().requires_grad_(), up.detach().requires_grad_()
        d_gate, d_up = torch.autograd.grad(_clamped_swiglu_ops(gate, up, ctx.alpha, ctx.limit), (gate, up), grad)
    return d_gate, d_up, None, None


def _fused_available() -> bool:
    """The extension has the fused decoder layer (csrc/cpu/decoder.cpp), the rowwise kernels it runs are
    on, and ``TRIFORCE_FUSED_LAYER`` is not ``0`` (an A/B switch: ``0`` runs the modules one by one)."""
    global _FUSED
    if _FUSED is None:
        _FUSED = (os.environ.get("TRIFORCE_FUSED_LAYER", "1") != "0" and _rowwise_available()
                  and hasattr(torch.ops.triforce_C, "decoder_attn_out_mlp"))
    return _FUSED


_FUSED = None


_BULK = threading.local()  # .active: inside Llama.prefill or a forward without a cache, on this thread

# The decoder layer's elementwise work (the norms with a residual add, RoPE, SiLU * up) in 5 Triton kernels
# and one add instead of 30 PyTorch ops a layer (triforce_kernels/triton/layer_ops.py), where the modules
# run one by one on a GPU. Tests set _ELEMENTWISE_ON_CPU to take that path in the interpreter.
_ELEMENTWISE_ON_CPU = False
_ELEMENTWISE = None


def _elementwise_kernels(x: torch.Tensor) -> bool:
    """Whether the layer's elementwise work on ``x`` goes through the Triton kernels: on a GPU where Triton
    runs (or the tests' interpreter), without autograd or ``torch.compile``, ``TRIFORCE_FUSED_ELEMENTWISE``
    not ``0``."""
    global _ELEMENTWISE
    if not (x.device.type == "cuda" or (_ELEMENTWISE_ON_CPU and x.device.type == "cpu")):
        return False
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if _ELEMENTWISE is None:
        _ELEMENTWISE = (os.environ.get("TRIFORCE_FUSED_ELEMENTWISE", "1") != "0"
                        and backend_status("triton", x.device)[0])
    return _ELEMENTWISE


@contextlib.contextmanager
def _bulk_linears():
    """Within it, :class:`Linear` hands products of more than ``ROWWISE_MAX_ROWS`` rows to torch's GEMM:
    forwards whose rows are never compared with a one-token step's (a prefill's chunks, a forward
    without a cache). A quantised layer's dequantised weight is made once within it (:func:`bulk_weight`)."""
    before = getattr(_BULK, "active", False)
    _BULK.active = True
    if not before:
        _BULK.weights = {}
    try:
        yield
    finally:
        _BULK.active = before
        if not before:
            _BULK.weights = {}


BULK_WEIGHT_BYTES = 1 << 30  # what bulk_weight keeps at most within one prefill


def bulk_weight(module: nn.Module, make):
    """``make()`` (a quantised layer's dequantised weight, for ``F.linear``), made once per module within
    the outermost :func:`_bulk_linears` (a prefill's chunks reuse it) while the weights kept there stay
    under ``BULK_WEIGHT_BYTES`` (SmolLM2's float32 layers: 538 MB), else made on each call."""
    cache = getattr(_BULK, "weights", None) if getattr(_BULK, "active", False) else None
    if cache is None:
        return make()
    w = cache.get(module)
    if w is None:
        w = make()
        if sum(t.nbytes for t in cache.values()) + w.nbytes <= BULK_WEIGHT_BYTES:
            cache[module] = w
    return w


def _rowwise_rows(x: torch.Tensor) -> bool:
    """Whether a product with ``x`` (on the CPU, rows of ``x.shape[-1]``) takes a rowwise kernel by its
    rows: always, except more than ``ROWWISE_MAX_ROWS`` rows within :func:`_bulk_linears`. The rule of
    :class:`Linear` and of the quantised linears (triforce/models/quant.py), so that a model on GGUF blocks
    takes the kernel exactly where its float32 twin does."""
    return (x.device.type == "cpu" and x.numel() > 0
            and (x.numel() <= ROWWISE_MAX_ROWS * x.shape[-1] or not getattr(_BULK, "active", False)))


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``, through ``triforce_C::rowwise_linear`` where :class:`Linear` takes it (each row's bits
    its own, whatever the row count)."""
    if (x.dtype in _ROWWISE_DTYPES and w.dtype == x.dtype and _rowwise_rows(x)
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                                  or (b is not None and b.requires_grad)))
            and _rowwise_available()):
        y = torch.ops.triforce_C.rowwise_linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)
        return y if b is None else y.add_(b)
    return F.linear(x, w, b)


def derived(owner: nn.Module, slot: str, weight: torch.Tensor, make) -> torch.Tensor:
    """``make()`` (a tensor derived from ``weight``: a transposed or float32 copy) made contiguous once and kept in
    ``owner.<slot>`` until ``weight`` changes (another tensor, dtype, device or in-place version); under autograd
    with ``weight`` requiring grad, ``make()`` itself (its gradient flows); made again at every call for an inference
    tensor (no version counter)."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return make()
    try:
        version = weight._version
    except RuntimeError:
        version = None
    key = (weight.data_ptr(), version, weight.dtype, weight.device, tuple(weight.shape))
    kept = owner.__dict__.get(slot)
    if kept is None or kept[0] != key or version is None:
        with torch.no_grad():
            kept = (key, make().contiguous())
        owner.__dict__[slot] = kept
    return kept[1]


def per_head_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x`` ``[..., H, K]`` times each head's own ``w[h]`` ``[M, K]`` -> ``[..., H, M]``: where :func:`linear` takes
    the row-wise kernel (a row's bits its own), every head in one call, ``triforce_C::rowwise_linear_heads`` (each
    head bitwise :func:`linear` on it), or head by head without that op; else one ``einsum``."""
    rows = x[..., 0, :]
    if x.device.type == "cpu" and _rowwise_available() and x.dtype in _ROWWISE_DTYPES and w.dtype == x.dtype \
            and _rowwise_rows(rows) and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        if hasattr(torch.ops.triforce_C, "rowwise_linear_heads"):
            lead = x.shape[:-2]
            heads_first = x.reshape(-1, *x.shape[-2:]).transpose(0, 1).contiguous()
            y = torch.ops.triforce_C.rowwise_linear_heads(heads_first, w.contiguous())
            return y.transpose(0, 1).reshape(*lead, *y.shape[::2])
        return torch.stack([linear(x[..., h, :].contiguous(), w[h]) for h in range(x.shape[-2])], dim=-2)
    return torch.einsum("...hk,hmk->...hm", x, w)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict keys) whose CPU forward in float32, bfloat16 or
    float16 (input and weight alike), without autograd, runs ``triforce_C::rowwise_linear``
    (csrc/include/triforce/linear.h) at every row count: the weights are streamed once per 256 rows, so
    verifying a few tokens costs little more than one token, and each row's result is bitwise the 1-row
    result (a verification pass of any size computes the same projections as an autoregressive step).
    In :meth:`Llama.prefill` and in a forward without a cache, products of more than ``ROWWISE_MAX_ROWS``
    rows go to ``F.linear`` (faster there); so does everything else."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)

    def fused_projection(self, dtype: torch.dtype):
        """``(weight, None, bias)`` for the fused decoder layer when its rowwise path serves inputs of
        ``dtype``, else ``None`` (see :meth:`DecoderLayer.fused_arguments`)."""
        params = self._parameters  # not self.weight: nn.Module.__getattr__ is slow on a per-layer path
        w = params["weight"]
        return (w, None, params["bias"]) if w.dtype == dtype else None


class Router(Linear):
    """A router :class:`Linear` with DeepSeek-V3's ``e_score_correction_bias`` (``[experts]``, added to the scores
    for the choice only; none without ``correction_bias``), kept in float32 whatever the model's dtype, as
    transformers keeps it (``_keep_in_fp32_modules_strict``): ``.to(torch.bfloat16)`` moves it, never rounds it; with
    ``float32_weight`` (ERNIE 4.5's router, Hunyuan's) its weight too."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, float32_weight: bool = False,
                 correction_bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        if correction_bias:  # (Hunyuan's router has none: a float32 weight alone)
            self.register_buffer("e_score_correction_bias", torch.zeros(out_features, dtype=torch.float32))
        self.float32_weight = float32_weight

    def _apply(self, fn, recurse=True):
        kept = {k: v for k, v in self._buffers.items() if k == "e_score_correction_bias"}
        if self.float32_weight:  # (its data: _apply converts a parameter in place)
            kept["weight"] = self._parameters["weight"].data
        out = super()._apply(fn, recurse)
        for name, old in kept.items():
            table = self._buffers if name in self._buffers else self._parameters
            moved = table[name]
            if old is not None and moved is not None and moved.dtype != torch.float32:
                new = old.detach().to(device=moved.device)
                table[name] = new if table is self._buffers else nn.Parameter(new, requires_grad=moved.requires_grad)
        return out


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        if self._kernel_ok(x):
            return _layer_ops().rms_norm(x, self.weight, self.eps)[1]
        if _native_norm(x, self.weight):  # (the CPU's: one call instead of seven ATen ops, the same bits)
            return torch.ops.triforce_C.rms_norm(x, self.weight, self.eps)
        # fp32 statistics whatever the model dtype (as HF), weight applied in the model dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def _kernel_ok(self, x) -> bool:
        """This norm of ``x`` may run as ``layer_ops.rms_norm`` (:func:`_elementwise_kernels`): a contiguous
        row no wider than it takes, in the weight's dtype."""
        w = self.weight
        return (_elementwise_kernels(x) and x.dtype == w.dtype and x.is_contiguous() and w.is_contiguous()
                and w.shape == x.shape[-1:] and 0 < x.shape[-1] <= _layer_ops().MAX_HIDDEN and not _hooked(self))


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: the weight ``w`` is stored as an offset from 1 (zeros: the identity scaling) and
    applied as ``1 + w`` in float32 before the result is rounded to the input's dtype (Llama's applies ``w`` in
    the model's dtype after rounding). Row by row, like :class:`RMSNorm`; no Triton path, and on the CPU fused only in
    the native layer stack (``decoder_layers``' ``norm_kind="gemma"``: the same bits)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class Float32RMSNorm(RMSNorm):
    """GPT-OSS's RMSNorm: the weight applied in float32 to the float32 normalised row, then the result rounded to
    the input's dtype (transformers keeps these weights in float32; Llama's rounds the row first). Row by row; no
    Triton path; on the CPU fused only in the native layer stack (``decoder_layers``' ``norm_kind="float32"``)."""

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


class LayerNorm(RMSNorm):
    """Cohere 2's norm: LayerNorm without a bias, in float32 (the row's mean subtracted, its variance about the
    mean), the weight applied in float32, the result rounded to the input's dtype. Row by row; on the CPU fused only in
    the native layer stack (``decoder_layers``' ``norm_kind="cohere"``, by the same ATen ops). Cohere's
    and StableLM 2 12B's per-head q / k norms too (a weight ``[heads, head_dim]``, each head's row normalised over
    ``head_dim``: StableLM's torch LayerNorm computes in float32 and rounds once as well)."""

    def forward(self, x):
        xf = x.float()
        xf = xf - xf.mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


class BiasLayerNorm(RMSNorm):
    """StarCoder 2's, StableLM's and Phi-2's norm: torch's LayerNorm with a weight and a bias (``nn.LayerNorm``, in
    the input's dtype, its statistics in float32 as ATen computes them), the same op as transformers'. ATen's kernel
    normalises each row alone. No fused or Triton path."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class NoBiasLayerNorm(RMSNorm):
    """DBRX's norm: torch's LayerNorm with a weight and no bias (``nn.LayerNorm(bias=False)``, in the input's dtype, its
    statistics in float32 as ATen computes them), the same op as transformers'."""

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, self.eps)


class LayerNorm1P(BiasLayerNorm):
    """Nemotron's norm: :class:`BiasLayerNorm` with the weight stored as an offset from 1 (zeros: the identity
    scaling) and applied as ``1 + w`` in the weight's dtype, as transformers' NemotronLayerNorm1P."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight + 1.0, self.bias, self.eps)


class BareLayerNorm(nn.Module):
    """OLMo's norm: LayerNorm with no weight and no bias, computed in float32 and rounded to the input's dtype (as
    transformers' OlmoLayerNorm). No parameters; row by row; no fused path."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x):
        return F.layer_norm(x.float(), (self.dim,), None, None, self.eps).to(x.dtype)


def make_norm(config: LlamaConfig, dim: int, eps: float) -> nn.Module:
    """The family's norm over ``dim``: :class:`GemmaRMSNorm` where ``config.gemma_norm``, :class:`Float32RMSNorm`
    where ``config.float32_norm``, :class:`LayerNorm` where ``config.layer_norm``, :class:`BiasLayerNorm`,
    :class:`LayerNorm1P` or :class:`BareLayerNorm` by ``config.torch_layer_norm``, else :class:`RMSNorm`."""
    kind = (GemmaRMSNorm if config.gemma_norm else Float32RMSNorm if config.float32_norm
            else LayerNorm if config.layer_norm else {"plain": BiasLayerNorm, "1p": LayerNorm1P, "bare": BareLayerNorm,
                                                      "nobias": NoBiasLayerNorm}.get(config.torch_layer_norm, RMSNorm))
    return kind(dim, eps)


def _layer_ops():
    from triforce_kernels.triton import layer_ops
    return layer_ops


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(x / cap)`` (Gemma 2's soft-capping). Float32 on the CPU goes through ``triforce_C::softcap``,
    each element by the same instructions wherever it lies: ATen's tanh, like its SiLU, rounds a tensor's last
    elements by other code, so a verification pass's logits could differ from a step's in the last bits."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and not (torch.is_grad_enabled() and x.requires_grad) \
            and _rowwise_available() and hasattr(torch.ops.triforce_C, "softcap"):
        return torch.ops.triforce_C.softcap(x, cap)
    return torch.tanh(x / cap) * cap


def _rope(x, cos, sin):
    """``apply_rope``, through ``layer_ops.rope`` where the elementwise kernels run (same bits)."""
    if _elementwise_kernels(x) and x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous() \
            and cos.dtype == sin.dtype == x.dtype and cos.shape == sin.shape == x.shape[:2] + (1, x.shape[3]) \
            and x.shape[3] % 2 == 0:
        return _layer_ops().rope(x, cos, sin)
    return apply_rope(x, cos, sin)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv = config.layer_heads(layer), config.layer_kv_heads(layer)
        self.head_dim = config.head_dim
        # MiMo-V2-Flash: values (and the heads' output) narrower than the keys, padded with zeros to head_dim for the
        # attention (so its output's last dims are zeros, dropped), and scaled (value_scale, in the dtype), or None
        self.v_dim, self.v_scale = config.value_head_dim, config.value_scale
        h, qkv_bias = config.hidden_size, config.qkv_bias
        self.q_proj = Linear(h, self.n_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(h, self.n_kv * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(h, self.n_kv * self.v_dim, bias=qkv_bias)
        self.o_proj = Linear(self.n_heads * self.v_dim, h, bias=config.layer_out_bias(layer))
        self.window = config.layer_windows[layer]  # a sliding window (0: none), here for the cache-free forward
        self.scale = config.attention_scale  # (the caches apply the same, from the config)
        self.softcap = config.attn_softcap  # Gemma 2's cap on the scores, or None
        self.alibi = config.alibi_slopes  # ALiBi's slope per query head (BLOOM, MPT, Falcon-RW), or None
        self.temperature = config.query_temperature  # Ministral 3's (beta, original), or None
        # Qwen3, Gemma 3: per-head RMSNorm of queries and keys, before RoPE; OLMoE: over each token's whole query
        # and key projections (qk_norm_full), before the heads are split
        self.full_qk_norm = config.qk_norm_full
        if config.qk_norm and config.qk_norm_heads:  # Cohere's, StableLM's: LayerNorms (no bias) of their own per
            # head, [heads, head_dim]
            self.q_norm = LayerNorm((self.n_heads, self.head_dim), config.rms_norm_eps)
            self.k_norm = LayerNorm((self.n_kv, self.head_dim), config.rms_norm_eps)
        elif config.qk_norm:
            wide = self.full_qk_norm
            self.q_norm = make_norm(config, self.head_dim * (self.n_heads if wide else 1), config.rms_norm_eps)
            self.k_norm = make_norm(config, self.head_dim * (self.n_kv if wide else 1), config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        # Hunyuan: the q/k norms after RoPE, computed so that RoPE commutes with them (config.qk_norm_after_rope)
        self.after_rope = config.qk_norm_after_rope
        # Llama 4: q and k L2-normalised after RoPE on its RoPE layers (the norm's eps, or None), its NoPE layers'
        # query temperature ((attn_scale, floor_scale), or None) and its chunked layers' chunk (0: none)
        self.l2_eps = config.rms_norm_eps if config.l2_qk_norm[layer] else None
        temperature = config.nope_temperature
        self.nope_temperature = None if config.rope_layers[layer] else temperature
        self.chunk = config.layer_chunks[layer]
        self.clip = config.clip_qkv  # OLMoE's clamp of q and k (after their norms) and v, or None
        # Cohere 2, ERNIE 4.5: RoPE computed in float32 and rounded once, as transformers rotates (config.rope_float32)
        self.rope_f32 = bool(config.rope_float32)
        # GPT-OSS: a learned logit per query head in each softmax's denominator (attention sinks), or None
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if config.layer_sinks(layer) else None
        self.float32_sinks = config.float32_sinks  # (Flint's: kept in float32 whatever the model's dtype)
        # AFMoE: the heads' output times the sigmoid of a projection of the layer's input, before o_proj, or None
        self.gate_proj = Linear(h, self.n_heads * self.head_dim, bias=config.attn_gate_bias) \
            if config.attn_output_gate else None
        # Laguna: the heads' output times the softplus of g_proj of the layer's input (one gate per head, or per dim)
        self.softplus_gate = config.softplus_gate
        # BitNet: an RMSNorm on the heads' output before o_proj
        if config.sub_norms:
            self.attn_sub_norm = make_norm(config, self.n_heads * self.head_dim, config.rms_norm_eps)
        if self.softplus_gate is not None:
            self.g_proj = Linear(h, self.n_heads * (1 if self.softplus_gate == "head" else self.head_dim), bias=False)
        # LFM3: the heads' output times the sigmoid of g_proj of the layer's input, one gate per head
        self.sigmoid_head_gate = config.sigmoid_head_gate
        if self.sigmoid_head_gate:
            self.g_proj = Linear(h, self.n_heads, bias=False)

    def _apply(self, fn, recurse=True):
        # Flint's sinks: float32 whatever the model's dtype, as transformers keeps them (_keep_in_fp32_modules_strict):
        # .to(torch.bfloat16) moves them, never rounds them (the attention reads them as float32 either way)
        sinks = self._parameters.get("sinks") if self.__dict__.get("float32_sinks") else None
        kept = None if sinks is None else sinks.data
        out = super()._apply(fn, recurse)
        moved = self._parameters.get("sinks")
        if kept is not None and moved is not None and moved.dtype != torch.float32 and not moved.is_meta:
            self._parameters["sinks"] = nn.Parameter(kept.detach().to(device=moved.device),
                                                     requires_grad=moved.requires_grad)
        return out

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        B, T, _ = x.shape
        q, k, k_raw, v = self.project(x, cos, sin)
        if self.temperature is not None or self.nope_temperature is not None:
            positions = step.positions if step is not None else torch.arange(T, device=x.device).expand(B, T)
            q = self.temper(q, positions) if self.temperature is not None else self.temper_nope(q, positions)
        if self.v_dim != self.head_dim:  # (MiMo-V2-Flash's values: padded to the keys' width, the output cut back)
            out = self.attend(q, k, F.pad(v, (0, self.head_dim - self.v_dim)), k_raw, cache, step)[..., :self.v_dim]
            return self.output(out.reshape(B, T, self.n_heads * self.v_dim), x)
        out = self.attend(q, k, v, k_raw, cache, step)
        return self.output(out.reshape(B, T, self.n_heads * self.head_dim), x)

    def output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``o_proj`` of the heads' output ``out`` ``[..., heads * head_dim]``, gated where the family gates it
        (AFMoE: ``out * sigmoid(gate_proj(x))`` of the layer's input ``x``, as transformers computes it in the dtype;
        the sigmoid value by value, :func:`_row_sigmoid`)."""
        if self.gate_proj is not None:
            out = out * _row_sigmoid(self.gate_proj(x))
        if self.softplus_gate is not None:  # (Laguna's: the softplus in float32, rounded to the dtype; value by value)
            gate = _lanewise(F.softplus, self.g_proj(x).float()).to(out.dtype)
            if self.softplus_gate == "head":
                gate = gate.repeat_interleave(self.head_dim, dim=-1)
            out = out * gate
        if self.__dict__.get("sigmoid_head_gate"):  # (LFM3's: the sigmoid in the dtype, value by value)
            out = out * _row_sigmoid(self.g_proj(x)).repeat_interleave(self.head_dim, dim=-1)
        sub = self._modules.get("attn_sub_norm")  # (BitNet's)
        return self.o_proj(out if sub is None else sub(out))

    def project(self, x, cos, sin):
        """``(q, k, k_raw, v)`` ``[B, T, H, D]`` of the layer's input ``x``: the projections, the q/k norms where
        the family has them, and RoPE (``k_raw``: the keys before it)."""
        B, T, _ = x.shape
        q, k_raw, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.after_rope:
            return self._norms_after_rope(q, k_raw, v, cos, sin)
        if self.l2_eps is not None:
            return self._l2_after_rope(q, k_raw, v, cos, sin)
        if self.full_qk_norm:
            q, k_raw = self.q_norm(q), self.k_norm(k_raw)
        q, k_raw = q.view(B, T, self.n_heads, self.head_dim), k_raw.view(B, T, self.n_kv, self.head_dim)
        if self.q_norm is not None and not self.full_qk_norm:
            q, k_raw = self.q_norm(q), self.k_norm(k_raw)
        v = v.view(B, T, self.n_kv, self.v_dim)
        if self.v_scale is not None:  # (MiMo-V2-Flash's, in the dtype as transformers scales them)
            v = v * self.v_scale
        if self.clip is not None:
            q, k_raw, v = (t.clamp(-self.clip, self.clip) for t in (q, k_raw, v))
        return self._rotate(q, cos, sin), self._rotate(k_raw, cos, sin), k_raw, v

    def _rotate(self, x, cos, sin):
        """RoPE of ``x`` ``[B, T, H, D]``: in float32, rounded once, where the family rotates so (``rope_f32``)."""
        if self.rope_f32 and x.dtype != torch.float32:
            return apply_rope(x.float(), cos.float(), sin.float()).to(x.dtype)
        return _rope(x, cos, sin)

    def _l2_after_rope(self, q, k, v, cos, sin):
        """Llama 4's ``(q, k, k_raw, v)`` on a layer with q/k L2 norms: transformers computes ``l2(rope(q))`` and
        ``l2(rope(k))``. RoPE keeps a head's RMS, so the key is computed as ``rope(l2(k))`` (``k_raw`` the unit-RMS
        key before RoPE, which a cache re-rotates as any family's; the rounding differs from transformers' in the last
        bits), the query as transformers does."""
        B, T, _ = q.shape
        q, k, v = (t.view(B, T, -1, self.head_dim) for t in (q, k, v))
        k_raw = _l2_norm(k, self.l2_eps)
        return _l2_norm(self._rotate(q, cos, sin), self.l2_eps), self._rotate(k_raw, cos, sin), k_raw, v

    def _norms_after_rope(self, q, k, v, cos, sin):
        """Hunyuan's ``(q, k, k_raw, v)``: transformers computes ``q_norm(rope(q))`` and ``k_norm(rope(k))``. RoPE keeps
        each head's RMS, so ``k_norm(rope(k)) = w_k * rope(k / rms(k))``, and a score ``q . (w_k * k)`` is ``(w_k * q)
        . k``: the cached key is ``rope(k / rms(k))`` (``k_raw``: the unit-RMS key before RoPE, which a cache
        re-rotates as any family's) and the query ``w_k * q_norm(rope(q))``. The same scores; the roundings differ
        from transformers' in the last bits."""
        B, T, _ = q.shape
        q, k, v = (t.view(B, T, -1, self.head_dim) for t in (q, k, v))
        kf = k.float()  # (RMSNorm's statistics, weight 1)
        k_raw = (kf * torch.rsqrt(kf.pow(2).mean(-1, keepdim=True) + self.k_norm.eps)).to(k.dtype)
        q = self.q_norm(_rope(q, cos, sin)) * self.k_norm.weight
        return q, _rope(k_raw, cos, sin), k_raw, v

    def temper(self, q, positions):
        """Ministral 3's query temperature (``config.query_temperature``): the RoPE'd queries ``[B, T, H, D]`` of
        int ``positions`` ``[B, T]`` times ``1 + beta * ln(1 + floor(position / original))``, computed in float32
        and rounded to the queries' dtype, as transformers computes it (1 below ``original``)."""
        return q * self.temper_scale(positions, q.dtype)[:, :, None, None]

    def temper_scale(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """:meth:`temper`'s scale of each token, ``[B, T]`` in ``dtype`` (the native layer stack's ``query_scale``)."""
        beta, original = self.temperature
        return (1 + beta * torch.log(1 + torch.floor(positions / original))).to(dtype)

    def temper_nope(self, q, positions):
        """Llama 4's query temperature on its NoPE layers (``config.nope_temperature``): the queries ``[B, T, H, D]``
        of int ``positions`` ``[B, T]`` times ``1 + attn_scale * ln(1 + floor((position + 1) / floor_scale))``, the
        factor and the product in float32, rounded once, as transformers computes them (1 below ``floor_scale - 1``;
        the logarithm value by value, :func:`_lanewise`, so a pass keeps the bits of its steps)."""
        attn_scale, floor_scale = self.nope_temperature
        scale = _lanewise(torch.log1p, torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
        return (q * scale[:, :, None, None]).to(q.dtype)

    def attend(self, q, k, v, k_raw, cache: _KVCache | None, step: Step | None, index=None) -> torch.Tensor:
        """Attention of the RoPE'd ``q``, ``k`` and ``v`` ``[B, T, H, D]``: causal among themselves without a
        cache, else written to ``cache`` and attended over it -> ``[B, T, Hq, D]``; ``index``: DeepSeek-V3.2's
        indexer's ``(q, k, w)`` (:class:`Indexer`), for a full cache that holds its keys."""
        if cache is None:
            T = q.shape[1]
            mask = None
            if self.window and self.window < T or self.chunk and self.chunk < T:
                i = torch.arange(T, device=q.device)
                d = i[:, None] - i[None, :]
                mask = d >= 0
                if self.window:  # a sliding window: query i sees keys i - W + 1 .. i
                    mask &= d < self.window
                if self.chunk:  # Llama 4's chunks: query i sees the keys of its own chunk of positions
                    mask &= (i[:, None] // self.chunk) == (i[None, :] // self.chunk)
            if self.softcap is not None or self.sinks is not None or self.alibi is not None:  # not SDPA's: the
                return _spelled_out_attention(q, k, v, self.scale, mask, self.softcap, self.sinks,  # scores spelled
                                              self.alibi)  # out
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                                  enable_gqa=self.n_heads != self.n_kv).transpose(1, 2)
        kv = cache.dtype
        sinks = {} if self.sinks is None else {"sinks": self.sinks}  # (a cache's attend takes them where they are)
        if index is not None:  # (DeepSeek-V3.2's indexer: its keys in the cache's dtype; GLM-5's "shared")
            sinks["index"] = index if isinstance(index, str) or index[1].dtype == kv else (
                index[0], index[1].to(kv), index[2])
        if q.dtype != kv:  # a cache in another dtype (Llama.kv_dtype): attention runs in the cache's dtype
            out = cache.attend(self.layer, q.to(kv), k.to(kv), v.to(kv), step,
                               k_raw=None if k_raw is None else k_raw.to(kv), **sinks)
            return out.to(q.dtype)
        return cache.attend(self.layer, q, k, v, step, k_raw=k_raw, **sinks)


class ShortConv(nn.Module):
    """LFM2's gated short convolution, a layer's mixer in place of attention (``config.conv_layers``): ``in_proj`` of
    the input into thirds ``b``, ``c`` and ``u``; a causal depthwise convolution (``conv``, ``nn.Conv1d``'s weight
    ``[hidden, 1, K]``, ``K = config.conv_kernel``) of ``b * u`` over each token's last ``K`` inputs (its ancestors
    along a tree); ``out_proj(c * conv)``. A cache keeps each row's last inputs (:meth:`~triforce.models.cache.
    _KVCache.convolve`); without one the tokens before the first are zeros, as transformers' Lfm2ShortConv."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        self.layer = layer
        h, bias = config.hidden_size, config.conv_bias
        self.kernel = config.conv_kernel
        self.in_proj = Linear(h, 3 * h, bias=bias)
        self.conv = nn.Conv1d(h, h, self.kernel, groups=h, bias=bias, padding=self.kernel - 1)  # (its weights only)
        self.out_proj = Linear(h, h, bias=bias)

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        b, c, u = self.in_proj(x).chunk(3, dim=-1)
        return self.out_proj(c * _causal_conv(b * u, self.conv, self.layer, cache, step))


def _causal_conv(x: torch.Tensor, conv: nn.Conv1d, layer: int, cache: _KVCache | None, step: Step | None):
    """The causal depthwise convolution ``conv`` (its weight ``[C, 1, K]`` and bias) of ``x`` ``[B, T, C]`` over each
    token's last ``K`` inputs: a cache's ring (:meth:`~triforce.models.cache._KVCache.convolve`), else zeros before the
    first token (:func:`~triforce.models.cache.short_conv`)."""
    if cache is None:
        return _cache.short_conv(_cache.conv_windows(x, conv.weight.shape[-1]), conv.weight, conv.bias)
    return cache.convolve(layer, x, step, conv.weight, conv.bias)


class Mamba2Mixer(nn.Module):
    """A Mamba-2 layer (``config.mamba``: Granite 4.0's), a layer's mixer in place of attention, as transformers'
    GraniteMoeHybridMambaLayer computes it (:class:`~triforce.models.config.Mamba`): ``in_proj`` into the gate ``z``,
    ``xBC`` and ``dt``; the causal depthwise convolution of ``xBC`` (a cache's ring: :meth:`~triforce.models.cache.
    _KVCache.convolve`), SiLU; the state space model over the tokens (:meth:`~triforce.models.cache._KVCache.scan`:
    float32, token by token; without a cache from a zero state), ``dt = softplus(dt + dt_bias)``, ``A = -exp(A_log)``;
    its output rounded to the dtype, times ``silu(z)`` and normalised per group (RMS, float32), times ``norm.weight``;
    ``out_proj``. Every elementwise function value by value (:func:`_lanewise`), so a pass keeps the bits of its
    steps."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        m = self.spec = config.mamba
        self.layer, h = layer, config.hidden_size
        self.in_proj = Linear(h, m.inner + m.conv_dim + m.heads, bias=m.proj_bias)
        self.conv1d = nn.Conv1d(m.conv_dim, m.conv_dim, m.kernel, groups=m.conv_dim, bias=m.conv_bias,
                                padding=m.kernel - 1)  # (its weights only)
        self.dt_bias = nn.Parameter(torch.ones(m.heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, m.heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(m.heads))
        if m.norm != "none":  # (Falcon-H1's without mamba_rms_norm: none)
            self.norm = nn.Module()
            self.norm.weight = nn.Parameter(torch.ones(m.inner))
        self.eps = config.rms_norm_eps
        self.out_proj = Linear(m.inner, h, bias=m.proj_bias if m.out_bias is None else m.out_bias)

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        m = self.spec
        b, T, _ = x.shape
        z, xbc, dt = self.in_proj(x).split([m.inner, m.conv_dim, m.heads], dim=-1)
        conv = _causal_conv(xbc, self.conv1d, self.layer, cache, step)
        xs, B, C = _lanewise(F.silu, conv).split([m.inner, m.groups * m.state, m.groups * m.state], dim=-1)
        dt = _lanewise(F.softplus, dt.float() + self.dt_bias.float())
        if m.dt_min > 0:  # (Nemotron-H's floor, everywhere: transformers clamps in its chunked form only)
            dt = dt.clamp(min=m.dt_min)
        decay = _lanewise(torch.exp, dt * -torch.exp(self.A_log.float()))
        xs = xs.float().view(b, T, m.heads, m.head_dim)
        B, C = (t.float().view(b, T, m.groups, m.state) for t in (B, C))
        D = self.D.float()
        if cache is not None:
            y = cache.scan(self.layer, xs, B, C, dt, decay, D, step)
        else:  # (from a zero state, as a cache's chain)
            y = _cache.ssm_scan(xs.new_zeros(b, m.heads, m.head_dim, m.state), xs, B, C, dt, decay, D)
        y = y.reshape(b, T, m.inner).to(x.dtype).float()
        gate = _lanewise(F.silu, z.float())
        if m.norm == "none":  # (Falcon-H1's without its norm)
            return self.out_proj((y * gate).to(x.dtype))
        if m.norm == "gate_first":
            y = y * gate
        groups = y.view(b, T, m.groups, -1)
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        if m.norm == "norm_first":  # (Falcon-H1's mamba_norm_before_gate: the weight, then the gate, in float32)
            return self.out_proj((self.norm.weight * groups.view(b, T, m.inner) * gate).to(x.dtype))
        return self.out_proj(self.norm.weight * groups.view(b, T, m.inner).to(x.dtype))


class Mamba1Mixer(nn.Module):
    """A Mamba(-1) layer (``config.mamba1``: MambaForCausalLM's), as transformers' MambaMixer computes it
    (:class:`~triforce.models.config.Mamba1`): ``in_proj`` into x and the gate z; the causal depthwise convolution of x
    (a cache's ring), SiLU; ``x_proj`` into the time step's low rank, B and C; ``dt = softplus(dt_proj.weight dt_low +
    dt_proj.bias)`` (the product in the dtype, the bias added in float32); the selective scan over the tokens
    (:meth:`~triforce.models.cache._KVCache.selective`: float32, token by token; without a cache from a zero state),
    ``A = -exp(A_log)``; its readout rounded to the dtype plus ``D x``, times ``silu(z)``; ``out_proj``. Every
    elementwise function value by value (:func:`_lanewise`), so a pass keeps the bits of its steps."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        m = self.spec = config.mamba1
        self.layer, h = layer, config.hidden_size
        self.in_proj = Linear(h, 2 * m.inner, bias=m.proj_bias)
        self.conv1d = nn.Conv1d(m.inner, m.inner, m.kernel, groups=m.inner, bias=m.conv_bias,
                                padding=m.kernel - 1)  # (its weights only)
        self.x_proj = Linear(m.inner, m.dt_rank + 2 * m.state, bias=False)
        self.dt_proj = Linear(m.dt_rank, m.inner, bias=True)
        A = torch.arange(1, m.state + 1, dtype=torch.float32).expand(m.inner, -1)
        self.A_log = nn.Parameter(torch.log(A).contiguous())
        self.D = nn.Parameter(torch.ones(m.inner))
        self.out_proj = Linear(m.inner, h, bias=m.proj_bias)
        if m.bcdt_weights:  # (Jamba's RMSNorms on dt's low rank, B and C)
            self.dt_layernorm = make_norm(config, m.dt_rank, m.bcdt_eps)
            self.b_layernorm = make_norm(config, m.state, m.bcdt_eps)
            self.c_layernorm = make_norm(config, m.state, m.bcdt_eps)

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        m = self.spec
        b, T, _ = x.shape
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xs = _lanewise(F.silu, _causal_conv(xs.contiguous(), self.conv1d, self.layer, cache, step))
        dt_low, B, C = self.x_proj(xs).split([m.dt_rank, m.state, m.state], dim=-1)
        if m.bcdt_weights:
            dt_low, B, C = self.dt_layernorm(dt_low), self.b_layernorm(B), self.c_layernorm(C)
        elif m.bcdt_eps is not None:  # (Falcon Mamba's weightless RMSNorms: Llama 4's L2 norm's arithmetic)
            dt_low, B, C = (_l2_norm(t, m.bcdt_eps) for t in (dt_low, B, C))
        dt = linear(dt_low.contiguous(), self.dt_proj.weight)
        dt = _lanewise(F.softplus, dt.float() + self.dt_proj.bias.float())
        A = -torch.exp(self.A_log.float())
        xf, Bf, Cf = xs.float(), B.float(), C.float()
        if cache is not None:
            y = cache.selective(self.layer, xf, dt, A, Bf, Cf, step)
        else:  # (from a zero state, as a cache's chain)
            y = _cache.selective_scan(xf.new_zeros(b, m.inner, m.state), xf, dt, A, Bf, Cf)
        y = y.to(x.dtype) + xs * self.D.to(x.dtype)
        return self.out_proj((y * _lanewise(F.silu, z)).to(x.dtype))


class GatedDeltaNet(nn.Module):
    """A gated DeltaNet layer (``config.delta``: Qwen3-Next's and Qwen3.5's ``linear_attention`` layers), a layer's
    mixer in place of attention, as transformers' Qwen3_5GatedDeltaNet computes it (:class:`~triforce.models.config.
    DeltaNet`): ``in_proj_qkv`` (Qwen3-Next's fused ``in_proj_qkvz`` / ``in_proj_ba`` are split into these on loading),
    the causal depthwise convolution of ``qkv`` (a cache's ring: :meth:`~triforce.models.cache._KVCache.convolve`),
    SiLU; q and k L2-normalised in float32 (eps 1e-6), q divided by ``sqrt(k_dim)``; ``beta = sigmoid(b)`` (in the
    dtype), ``g = -exp(A_log) softplus(a + dt_bias)`` (float32); the delta rule over the tokens (:meth:`~triforce.
    models.cache._KVCache.delta_rule`: float32, token by token; without a cache from a zero state); its output rounded
    to the dtype, RMS-normalised per head (float32), times ``norm.weight`` in the dtype and ``silu(z)`` in float32;
    ``out_proj``. Every elementwise function value by value (:func:`_lanewise`), so a pass keeps the bits of its
    steps."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        d = self.spec = config.delta
        self.layer, h = layer, config.hidden_size
        self.key_dim, self.value_dim = d.k_heads * d.k_dim, d.v_heads * d.v_dim
        self.in_proj_qkv = Linear(h, d.conv_dim, bias=False)
        self.in_proj_z = Linear(h, self.value_dim, bias=False)
        self.in_proj_b = Linear(h, d.v_heads, bias=False)
        self.in_proj_a = Linear(h, d.v_heads, bias=False)
        self.conv1d = nn.Conv1d(d.conv_dim, d.conv_dim, d.kernel, groups=d.conv_dim, bias=False,
                                padding=d.kernel - 1)  # (its weights only)
        self.dt_bias = nn.Parameter(torch.ones(d.v_heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d.v_heads + 1, dtype=torch.float32)))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(d.v_dim))
        self.eps = config.rms_norm_eps if d.norm_eps is None else d.norm_eps
        self.out_proj = Linear(self.value_dim, h, bias=False)

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        d = self.spec
        b, T, _ = x.shape
        qkv = self.in_proj_qkv(x)
        conv = _causal_conv(qkv, self.conv1d, self.layer, cache, step)
        q, k, v = _lanewise(F.silu, conv).float().split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (_unit(t.view(b, T, d.k_heads, d.k_dim)) for t in (q, k))
        q = q / d.k_dim ** 0.5
        v = v.view(b, T, d.v_heads, d.v_dim)
        beta = _lanewise(torch.sigmoid, self.in_proj_b(x))
        beta = (beta if d.beta_scale == 1 else beta * d.beta_scale).float()  # (OLMo Hybrid's 2, in the dtype)
        g = -torch.exp(self.A_log.float()) * _lanewise(F.softplus, self.in_proj_a(x).float() + self.dt_bias.float())
        y = _delta_rule(self.layer, d, q, k, v, beta, _lanewise(torch.exp, g), cache, step).to(x.dtype).float()
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        z = _lanewise(F.silu, self.in_proj_z(x).float()).view(b, T, d.v_heads, d.v_dim)
        return self.out_proj(((self.norm.weight * y) * z).to(x.dtype).reshape(b, T, self.value_dim))


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention (KDA: ``config.delta`` with ``channel_decay``, Kimi Linear's ``linear_attention`` layers),
    as transformers' KimiLinearDeltaAttention computes it: ``q_proj``, ``k_proj``, ``v_proj`` (``heads x head_dim``
    each), the causal depthwise convolution of the three joined (``conv1d``, no bias: a cache's ring), SiLU; q and k
    L2-normalised in float32 (eps 1e-6), q times ``head_dim ** -0.5``; ``beta = sigmoid(b_proj(x))`` (in the dtype); a
    decay per key channel ``exp(g)``, ``g = -exp(A_log) softplus(f_b_proj(f_a_proj(x)) + dt_bias)`` (float32: the
    ``forget_gate``); the delta rule over the tokens (:meth:`~triforce.models.cache._KVCache.delta_rule`, each state row
    decayed by its channel's); its output rounded to the dtype, RMS-normalised per head in float32 times ``o_norm``'s
    weight and the sigmoid of ``g_b_proj(g_a_proj(x))``; ``o_proj``. Every elementwise function value by value
    (:func:`_lanewise`), so a pass keeps the bits of its steps."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        d = self.spec = config.delta
        self.layer, h, H, D = layer, config.hidden_size, d.v_heads, d.k_dim
        width = H * D
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(self, name, Linear(h, width, bias=False))
        self.conv1d = nn.Conv1d(3 * width, 3 * width, d.kernel, groups=3 * width, bias=False,
                                padding=d.kernel - 1)  # (its weights only)
        self.forget_gate = nn.Module()
        self.forget_gate.f_a_proj = Linear(h, D, bias=False)
        self.forget_gate.f_b_proj = Linear(D, width, bias=False)
        self.forget_gate.dt_bias = nn.Parameter(torch.zeros(width))
        self.forget_gate.A_log = nn.Parameter(torch.zeros(1, 1, H, 1))
        self.b_proj = Linear(h, H, bias=False)
        self.g_a_proj = Linear(h, D, bias=False)
        self.g_b_proj = Linear(D, width, bias=False)
        self.o_norm = nn.Module()
        self.o_norm.weight = nn.Parameter(torch.ones(D))
        self.eps = config.rms_norm_eps
        self.o_proj = Linear(width, h, bias=False)

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        d, fg = self.spec, self.forget_gate
        b, T, _ = x.shape
        H, D = d.v_heads, d.k_dim
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)
        conv = _causal_conv(qkv, self.conv1d, self.layer, cache, step)
        q, k, v = (t.view(b, T, H, D) for t in _lanewise(F.silu, conv).float().chunk(3, dim=-1))
        q, k = _unit(q), _unit(k)
        q = q * D ** -0.5
        beta = _lanewise(torch.sigmoid, self.b_proj(x)).float()
        f = fg.f_b_proj(fg.f_a_proj(x)).float() + fg.dt_bias.float()
        g = -torch.exp(fg.A_log.float()) * _lanewise(F.softplus, f.view(b, T, H, D))
        y = _delta_rule(self.layer, d, q, k, v, beta, _lanewise(torch.exp, g), cache, step).to(x.dtype).float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm.weight.float()
        gate = _lanewise(torch.sigmoid, self.g_b_proj(self.g_a_proj(x)).float()).view(b, T, H, D)
        return self.o_proj((y * gate).to(x.dtype).reshape(b, T, H * D))


def _delta_rule(layer: int, spec, q, k, v, beta, decay, cache: _KVCache | None, step: Step | None) -> torch.Tensor:
    """A DeltaNet layer's (gated DeltaNet's, KDA's) delta rule over the step's tokens: through the cache's state
    (:meth:`~triforce.models.cache._KVCache.delta_rule`), or without a cache from a zero state, as a cache's chain."""
    if cache is not None:
        return cache.delta_rule(layer, q, k, v, beta, decay, step)
    return _cache.delta_scan(v.new_zeros((v.shape[0],) + spec.state_shape), q, k, v, beta, decay)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Gated DeltaNet's L2 norm of float32 ``x`` over its last dim: ``x * rsqrt(sum(x^2) + 1e-6)`` (FLA's, as
    transformers' l2norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama 4's L2 norm of ``x`` over its last dim: ``x * rsqrt(mean(x^2) + eps)`` in float32, rounded to the dtype
    (an RMSNorm without a weight, as transformers' Llama4TextL2Norm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _spelled_out_attention(q, k, v, scale: float, mask, cap: float | None = None, sinks=None,
                           alibi=None) -> torch.Tensor:
    """Causal attention of ``q`` ``[B, T, Hq, D]`` over ``k``, ``v`` ``[B, T, Hkv, D]`` (``mask``: the visible keys
    ``[T, T]``, or None: causal), the softmax in float32: with soft-capped scores (``cap``), as transformers' eager
    Gemma 2, with a sink logit per head in each softmax (``sinks`` ``[Hq]``, dropped after it), as its GPT-OSS, and
    with ALiBi (``alibi``: a slope per query head; a key ``d`` positions before its query scores ``-slope * d`` more,
    in float32), as ``verify_attention``'s ``alibi_slopes``."""
    T, g = q.shape[1], q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if cap is not None:
        s = torch.tanh(s / cap) * cap
    if alibi is not None:
        d = torch.arange(T, device=q.device)
        slopes = torch.tensor(alibi, dtype=torch.float32, device=q.device)[:, None, None]
        s = s.float() - slopes * (d[:, None] - d[None, :]).clamp(min=0)
    if mask is None:
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        s = torch.cat([s.float(), sinks.float()[:, None, None].expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, dim=-1, dtype=torch.float32)[..., :T].to(q.dtype)
    return torch.einsum("bhts,bshd->bthd", p, v)


class MixtureOfAttention(Attention):
    """JetMoE's mixture of attention heads (``config.attention_experts``: ``(experts, top_k)``): a router (one logit per
    expert, ``router``) chooses each token's top k experts, their softmax (float32, rounded to the dtype) its weights;
    chosen expert ``e`` (rank r) projects the token's queries, ``n_kv`` heads (``q_experts[e]``), which attend to the
    shared keys and values (``k_proj``, ``v_proj``: KV head h serves each rank's head h); its output projection
    (``o_experts[e]``) takes that rank's heads back, times its weight; the outputs summed from zero in increasing expert
    order, plus ``o_bias``, in the dtype, as transformers' JetMoeMoA computes them. The cache holds ``n_kv`` heads and
    sees ``top_k * n_kv`` query heads, ordered so that its query head ``j`` reads KV head ``j // top_k`` (rank
    ``j % top_k``). Each expert's rows go through :func:`linear` (row-wise on the CPU), so a verification pass computes
    the bits of one-token steps."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__(config, layer)
        del self.q_proj, self.o_proj  # (the experts' own)
        count, self.top_k = config.attention_experts
        width, h = self.n_kv * self.head_dim, config.hidden_size
        self.router = Linear(h, count, bias=False)
        self.q_experts = nn.ModuleList(Linear(h, width, bias=False) for _ in range(count))
        self.o_experts = nn.ModuleList(Linear(width, h, bias=False) for _ in range(count))
        self.o_bias = nn.Parameter(torch.zeros(h))

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        B, T, H = x.shape
        k, heads, D = self.top_k, self.n_kv, self.head_dim
        rows = x.reshape(-1, H)
        w, index = torch.topk(self.router(rows).float(), k, dim=-1)
        w = torch.softmax(w, dim=-1).to(x.dtype)
        chosen = [(e, *torch.nonzero(index == e, as_tuple=True)) for e in torch.unique(index).tolist()]
        q = rows.new_empty(rows.shape[0], k, heads * D)
        for e, r, j in chosen:
            q[r, j] = self.q_experts[e](rows[r])
        # (heads as the cache's GQA reads them: j = h * k + rank)
        q = q.view(B, T, k, heads, D).transpose(2, 3).reshape(B, T, heads * k, D)
        k_raw, v = self.k_proj(x).view(B, T, heads, D), self.v_proj(x).view(B, T, heads, D)
        out = self.attend(self._rotate(q, cos, sin), self._rotate(k_raw, cos, sin), v, k_raw, cache, step)
        out = out.view(-1, heads, k, D).transpose(1, 2).reshape(-1, k, heads * D)
        y = torch.zeros_like(rows)
        for e, r, j in chosen:
            y.index_add_(0, r, self.o_experts[e](out[r, j]) * w[r, j, None])
        return (y + self.o_bias).view(B, T, H)


class LatentAttention(Attention):
    """DeepSeek's multi-head latent attention (``config.mla``: :class:`~triforce.models.config.MLA`), absorbed: the
    cache holds each token's ``[k_pe, c]`` once (one KV head of ``kv_lora_rank + qk_rope_head_dim``, the RoPE pairs at
    ``MLA.slots``), the values are those keys, and each head's query is ``[q_pe, W_UK^T q_nope]``; each head's output
    is ``W_UV`` times the latent part of its attention output, then ``o_proj``. The same scores and outputs as
    transformers' DeepSeek, which expands the latent into per-head keys and values (another order of the same sums:
    equal within rounding). Parameters under transformers' names (``q_proj`` or ``q_a_proj``, ``q_a_layernorm``,
    ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``); each checkpoint row of a
    RoPE'd dim in half-split order (loading.py reorders DeepSeek's adjacent pairs). Every product goes row by row
    (:func:`linear`, :func:`per_head_linear`), so a verification pass computes the bits of one-token steps."""

    def __init__(self, config: LlamaConfig, layer: int):
        nn.Module.__init__(self)
        mla = config.mla
        self.layer, self.mla = layer, mla
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, 1, config.head_dim
        h, H = config.hidden_size, self.n_heads
        if mla.q_lora_rank is None:
            self.q_proj = Linear(h, H * mla.qk_head_dim, bias=False)
        else:
            self.q_a_proj = Linear(h, mla.q_lora_rank, bias=False)
            self.q_a_layernorm = make_norm(config, mla.q_lora_rank, 1e-6)  # (DeepSeek's: its RMSNorm's default eps)
            self.q_b_proj = Linear(mla.q_lora_rank, H * mla.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(h, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = make_norm(config, mla.kv_lora_rank, 1e-6)
        self.kv_b_proj = Linear(mla.kv_lora_rank, H * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.o_proj = Linear(H * mla.v_head_dim, h, bias=False)
        self.window, self.scale, self.softcap, self.temperature = 0, config.attention_scale, None, None
        self.chunk, self.l2_eps, self.nope_temperature = 0, None, None  # (Llama 4's: none here)
        self.alibi = None  # (no ALiBi in DeepSeek's latent attention)
        self.sinks = None
        self.rope_f32 = bool(config.rope_float32)
        self._slots = {}  # device -> (the latent's dims in a cached key, where each cached dim is in [k_pe, c])
        self._uk = self._uv = None  # (kv_b_proj's weight's identity, W_UK^T / W_UV per head): derived's
        self.dsa = config.dsa is not None  # DeepSeek-V3.2's sparse attention (GLM-5's too)
        self.topk = config.dsa.topk if self.dsa else 0
        self.shares_choice = self.dsa and config.dsa.shared[layer]  # (GLM-5: the previous full layer's keys)
        if self.dsa and not self.shares_choice:
            self.indexer = Indexer(config)

    def slots(self, device: torch.device) -> tuple:
        """``(latent dims, layout, RoPE'd dims)`` on ``device`` (not buffers: a model built on the meta device has
        them too)."""
        got = self._slots.get(device)
        if got is None:
            rope, latent = self.mla.slots()
            got = self._slots[device] = (latent.to(device), torch.argsort(torch.cat([rope, latent])).to(device),
                                         rope.to(device))
        return got

    def forward(self, x, cos, sin, cache: _KVCache | None, step: Step | None):
        B, T, _ = x.shape
        q, k, k_raw, v, q_latent = self._project(x, cos, sin)
        if self.dsa:  # DeepSeek-V3.2: each query's keys chosen by the indexer
            out = self._indexed(x, q_latent, q, k, k_raw, cos, sin, cache, step)
        else:
            out = self.attend(q, k, v, k_raw, cache, step)  # [B, T, H, head_dim]: each head's weighted sum of [k_pe, c]
        m = self.mla
        latent = out.index_select(-1, self.slots(out.device)[0])
        return self.o_proj(per_head_linear(latent, self.w_uv()).reshape(B, T, self.n_heads * m.v_head_dim))

    def _kv_b(self) -> torch.Tensor:
        """``kv_b_proj``'s weight per head, ``[H, qk_nope_head_dim + v_head_dim, kv_lora_rank]``."""
        return self.kv_b_proj.weight.view(self.n_heads, -1, self.mla.kv_lora_rank)

    def w_uk_t(self) -> torch.Tensor:
        """``[H, kv_lora_rank, qk_nope_head_dim]``: each head's ``W_UK`` (``kv_b_proj``'s key rows) transposed,
        contiguous (the rows :func:`per_head_linear` streams), made once per weight (:func:`derived`: a third of
        ``kv_b_proj``, 4 MB a layer of DeepSeek-V2-Lite in float32, copied at every step otherwise)."""
        nope = self.mla.qk_nope_head_dim
        return derived(self, "_uk", self.kv_b_proj.weight, lambda: self._kv_b()[:, :nope].transpose(1, 2))

    def w_uv(self) -> torch.Tensor:
        """``[H, v_head_dim, kv_lora_rank]``: each head's ``W_UV`` (``kv_b_proj``'s value rows), contiguous, made once
        per weight as :meth:`w_uk_t` (the heads' slices of ``kv_b_proj`` are not one contiguous tensor)."""
        nope = self.mla.qk_nope_head_dim
        return derived(self, "_uv", self.kv_b_proj.weight, lambda: self._kv_b()[:, nope:])

    def _indexed(self, x, q_latent, q, k, k_raw, cos, sin, cache: _KVCache | None, step: Step | None):
        """DeepSeek-V3.2's sparse attention (``config.dsa``): the indexer's queries, keys and head weights of ``x``
        (:class:`Indexer`); without a cache each query attends to its ``topk`` best keys among the forward's
        (:func:`~triforce.models.cache.indexed_attention`); a full cache holds the indexer's keys and chooses over
        every key a query sees (``FullCache.attend``); a draft's cache without them (StreamingLLM, retrieval)
        attends to every key it holds (a draft's approximation, as those caches are). GLM-5's shared layers
        (``index`` ``"shared"``) attend to the keys the previous full layer chose in the same forward."""
        T, topk = x.shape[1], self.topk
        if cache is None and T <= topk or cache is not None and getattr(cache, "index_k", None) is None:
            return self.attend(q, k, k, k_raw, cache, step)  # (every key: the indexer is not run)
        if self.shares_choice:
            index = "shared"
        else:
            rope = self.slots(x.device)[2]
            index = self.indexer(x, q_latent, cos.index_select(-1, rope), sin.index_select(-1, rope))
        if cache is None:
            if self.shares_choice:  # (Llama runs such forwards through a full cache, which keeps the choice)
                raise RuntimeError("a layer sharing the previous layer's choice of keys needs a cache to find it")
            prefix = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
            return _cache.indexed_attention(q, k, index[1], index[0], index[2], prefix, None, topk, T, self.scale,
                                            0.0)[0]
        return self.attend(q, k, k, k_raw, cache, step, index=index)

    def project(self, x, cos, sin):
        """``(q, k, k_raw, v)``: the absorbed queries ``[B, T, H, head_dim]``, the cached keys ``[B, T, 1,
        head_dim]`` RoPE'd and before RoPE, and the values (the keys)."""
        return self._project(x, cos, sin)[:4]

    def _project(self, x, cos, sin):
        """:meth:`project`'s, and the queries' low-rank latent ``q_a_layernorm(q_a_proj(x))`` (None without)."""
        B, T, _ = x.shape
        m, H = self.mla, self.n_heads
        if m.q_lora_rank is None:
            q, q_latent = self.q_proj(x), None
        else:
            q_latent = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_latent)
        q = q.view(B, T, H, m.qk_head_dim)
        q_nope, q_pe = q[..., :m.qk_nope_head_dim], q[..., m.qk_nope_head_dim:]
        kv = self.kv_a_proj_with_mqa(x)
        q_lat = per_head_linear(q_nope, self.w_uk_t())  # W_UK^T q_nope: [B, T, H, R]
        layout = self.slots(x.device)[1]
        norm = self._modules["kv_a_layernorm"]
        if _fused_path(x) and type(norm) is RMSNorm and not _hooked(norm) and kv.dtype == q.dtype == q_lat.dtype \
                and hasattr(torch.ops.triforce_C, "mla_qk"):  # (the rest below in one native call, same bits)
            q, k, k_raw = torch.ops.triforce_C.mla_qk(q, q_lat, kv, norm.weight, norm.eps, cos, sin, layout,
                                                      self.rope_f32)
            return q, k, k_raw, k, q_latent
        c, k_pe = norm(kv[..., :m.kv_lora_rank]), kv[..., m.kv_lora_rank:]
        q = torch.cat([q_pe, q_lat], -1).index_select(-1, layout)
        k_raw = torch.cat([k_pe, c], -1).index_select(-1, layout)[:, :, None]
        if self.rope_f32 and q.dtype != torch.float32:  # (DeepSeek-V2: its complex product in float32, rounded once)
            cf, sf = cos.float(), sin.float()
            k = apply_rope(k_raw.float(), cf, sf).to(q.dtype)
            return apply_rope(q.float(), cf, sf).to(q.dtype), k, k_raw, k, q_latent
        k = _rope(k_raw, cos, sin)
        return _rope(q, cos, sin), k, k_raw, k, q_latent


class Indexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer (``config.dsa``: :class:`~triforce.models.config.DSA`), under transformers'
    names: ``wq_b`` (the queries' low-rank latent to ``n_heads`` queries of ``head_dim``), ``wk`` (the layer's input
    to one key), ``k_norm`` (a LayerNorm with a bias, eps 1e-6), ``weights_proj`` (each head's weight).
    Called with the latent attention's input, its query latent and the RoPE tables of its ``qk_rope_head_dim``
    RoPE'd dims; gives ``(q [B, T, n_heads, head_dim], k [B, T, head_dim], w [B, T, n_heads] float32)``: the queries
    and the key RoPE'd on their first ``qk_rope_head_dim`` dims (half-split pairs), ``w`` in ``weights_proj``'s
    dtype, then float32 over ``sqrt(n_heads)``. Scores, choice and attention:
    :func:`~triforce.models.cache.indexed_attention`."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        d, m = config.dsa, config.mla
        self.n_heads, self.head_dim, self.topk, self.rope_dim = d.n_heads, d.head_dim, d.topk, m.qk_rope_head_dim
        self.wq_b = Linear(m.q_lora_rank, d.n_heads * d.head_dim, bias=False)
        self.wk = Linear(config.hidden_size, d.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(d.head_dim, eps=1e-6)
        self.weights_proj = Linear(config.hidden_size, d.n_heads, bias=False)

    def forward(self, x, q_latent, cos, sin):
        B, T, _ = x.shape
        r = self.rope_dim
        q = self.wq_b(q_latent).view(B, T, self.n_heads, self.head_dim)
        k = self.k_norm(self.wk(x))[:, :, None]
        q = torch.cat([_rope(q[..., :r].contiguous(), cos, sin), q[..., r:]], -1)
        k = torch.cat([_rope(k[..., :r].contiguous(), cos, sin), k[..., r:]], -1)[:, :, 0]
        w = self.weights_proj.weight  # (float32 in a float16 model loaded from a checkpoint, as transformers keeps it)
        return q, k, self.weights_proj(x.to(w.dtype)).float() * self.n_heads ** -0.5


class MLP(nn.Module):
    """The gated MLP: ``down(act(gate(x)) * up(x))``, ``act`` SiLU (SwiGLU) or GELU's tanh form (Gemma's
    GeGLU): ``config.activation``."""

    def __init__(self, config: LlamaConfig, intermediate_size: int | None = None):
        super().__init__()
        _add_projections(self, config, intermediate_size, gated=True)
        if config.sub_norms:  # BitNet's RMSNorm on the gated product before down_proj
            i = config.intermediate_size if intermediate_size is None else intermediate_size
            self.ffn_sub_norm = make_norm(config, i, config.rms_norm_eps)

    def forward(self, x):
        y = _gated(self.activation, self.gate_proj(x), self.up_proj(x))
        sub = self._modules.get("ffn_sub_norm")
        return self.down_proj(y if sub is None else sub(y))


def _add_projections(mlp: nn.Module, config: LlamaConfig, intermediate_size: int | None, gated: bool) -> None:
    """``mlp``'s ``gate_proj`` (where ``gated``), ``up_proj`` and ``down_proj`` (of ``intermediate_size``, by default
    the config's; biases by ``mlp_bias``) and its activation."""
    h, bias = config.hidden_size, config.mlp_bias
    i = config.intermediate_size if intermediate_size is None else intermediate_size
    if gated:
        mlp.gate_proj = Linear(h, i, bias=bias)
    mlp.up_proj = Linear(h, i, bias=bias)
    mlp.down_proj = Linear(i, h, bias=bias)
    mlp.activation = config.activation


class FeedForward(nn.Module):
    """The ungated MLP: ``down(act(up(x)))`` (``config.gated_mlp`` false): StarCoder 2's and Phi-2's GELU in its
    tanh form (their checkpoints' ``c_fc`` / ``c_proj`` and ``fc1`` / ``fc2``, renamed on loading), GPT-NeoX's exact
    GELU (``dense_h_to_4h`` / ``dense_4h_to_h``), Arcee's and Nemotron's ReLU squared, Apertus's xIELU (its learned
    numbers in ``act_fn``: :class:`XIELU`). The activation takes each row alone (:func:`_activated`)."""

    def __init__(self, config: LlamaConfig, intermediate_size: int | None = None):
        super().__init__()
        _add_projections(self, config, intermediate_size, gated=False)
        if self.activation == "xielu":
            self.act_fn = XIELU()

    def forward(self, x):
        u = self.up_proj(x)
        return self.down_proj(self.act_fn(u) if self.activation == "xielu" else _activated(self.activation, u))


def _xielu_numbers(act: "XIELU") -> tuple:
    """``[alpha_p, alpha_n, beta, eps]`` of an :class:`XIELU` as its forward computes them (the native layer stack's
    ``xielu``)."""
    return F.softplus(act.alpha_p), act.beta + F.softplus(act.alpha_n), act.beta, act.eps


class XIELU(nn.Module):
    """Apertus's xIELU: ``alpha_p * x * x + beta * x`` for ``x > 0``, else ``(expm1(min(x, eps)) - x) * alpha_n +
    beta * x``, with ``alpha_p = softplus(a_p)`` and ``alpha_n = beta + softplus(a_n)`` of its learned ``alpha_p`` /
    ``alpha_n`` (``[1]`` each) and its ``beta`` and ``eps`` (scalars), in the dtype of the model, op by op as
    transformers' XIELUActivation computes it (its Python form); ``expm1`` value by value (:func:`_lanewise`), so each
    row's bits are its own. The defaults are transformers' (0.8, 0.8, 0.5, -1e-6)."""

    def __init__(self, alpha_p: float = 0.8, alpha_n: float = 0.8, beta: float = 0.5, eps: float = -1e-6):
        super().__init__()
        self.alpha_p = nn.Parameter(torch.log(torch.expm1(torch.tensor(alpha_p))).unsqueeze(0))
        self.alpha_n = nn.Parameter(torch.log(torch.expm1(torch.tensor(alpha_n - beta))).unsqueeze(0))
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("eps", torch.tensor(eps))

    def forward(self, x):
        alpha_p, alpha_n, _, _ = _xielu_numbers(self)
        negative = (_lanewise(torch.expm1, torch.min(x, self.eps)) - x) * alpha_n + self.beta * x
        return torch.where(x > 0, alpha_p * x * x + self.beta * x, negative)


def _activated(activation: str, x: torch.Tensor) -> torch.Tensor:
    """``act(x)``, each row alone: ReLU and ReLU squared are exact; GELU (the tanh form, the exact one) on the CPU
    through the native ``gelu_tanh_mul`` / ``gelu_mul`` times ones (ATen's rounds a row's elements by where they fall in
    the tensor: :func:`_native_glu`; the product by 1 is exact)."""
    if activation in ("relu2", "relu"):
        return ACTIVATIONS[activation](x)
    if _native_glu(x, x):
        return _gated(activation, x, torch.ones_like(x))
    return ACTIVATIONS[activation](x)


def _gated(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up``: the GPU's Triton kernel (SiLU), the CPU's native op, else PyTorch's."""
    if activation == "silu" and _elementwise_kernels(gate) and gate.is_contiguous() and up.is_contiguous() \
            and gate.dtype == up.dtype and gate.shape == up.shape:
        return _layer_ops().silu_mul(gate, up)
    if activation in _NATIVE_GLUS and _native_glu(gate, up):
        return getattr(torch.ops.triforce_C, f"{activation}_mul")(gate, up)
    return ACTIVATIONS[activation](gate) * up  # (BitNet's ReLU squared: exact elementwise ops, each row its own)


_NATIVE_GLUS = ("silu", "gelu_tanh", "gelu")  # the gated activations of triforce_C's *_mul ops


class Expert(nn.Module):
    """One expert of a :class:`SparseMoE`: :class:`MLP`'s gated MLP with its gate and up projections as one
    ``gate_up_proj`` (rows ``[gate; up]``: one weight stream and one kernel call instead of two, as a token
    visits each of its experts on its own; the checkpoints' separate projections are joined on loading and split
    on saving, triforce/models/loading.py)."""

    def __init__(self, config: LlamaConfig, intermediate_size: int):
        super().__init__()
        bias = config.experts is not None and config.experts.biases  # GPT-OSS's
        self.gate_up_proj = Linear(config.hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, config.hidden_size, bias=bias)
        self.activation = config.activation
        self.swiglu_clamp = config.swiglu_clamp  # GPT-OSS's (alpha, limit), or None

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.activation == "swiglu_clamped":
            return self.down_proj(_clamped_swiglu(gate.contiguous(), up.contiguous(), *self.swiglu_clamp))
        return self.down_proj(_gated(self.activation, gate.contiguous(), up.contiguous()))


class UngatedExpert(nn.Module):
    """One expert of a :class:`SparseMoE` whose experts are ungated MLPs (Nemotron 3's: ``config.experts.gated``
    false): ``down_proj(act(up_proj(x)))``, the family's activation (ReLU squared). Runs one by one (the native
    mixture call is for gated experts)."""

    def __init__(self, config: LlamaConfig, intermediate_size: int, width: int | None = None):
        super().__init__()
        width = width or config.hidden_size  # (Nemotron 3 Super's: the mixture's latent width)
        self.up_proj = Linear(width, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, width, bias=False)
        self.activation = config.activation

    def forward(self, x):
        return self.down_proj(_activated(self.activation, self.up_proj(x)))


def _clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's experts' activation, as transformers computes it op by op in the dtype: ``g = min(gate, limit)``,
    ``(clamp(up, -limit, limit) + 1) * (g * sigmoid(g * alpha))``. On the CPU ``triforce_C::swiglu_clamped_mul``
    (csrc/include/triforce/glu.h: every element by one arithmetic, each step rounded as those ops round it, the
    sigmoid through the SiLU's e^t; ``moe_experts`` runs the same), where :func:`_native_glu` holds; elsewhere
    PyTorch's ops (:func:`_clamped_swiglu_ops`)."""
    if _native_glu(gate, up) and hasattr(torch.ops.triforce_C, "swiglu_clamped_mul"):
        return torch.ops.triforce_C.swiglu_clamped_mul(gate, up, alpha, limit)
    return _clamped_swiglu_ops(gate, up, alpha, limit)


def _clamped_swiglu_ops(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """:func:`_clamped_swiglu` in PyTorch's ops; the sigmoid value by value (:func:`_row_sigmoid`), so that a row's
    bits stay its own."""
    g = gate.clamp(max=limit)
    u = up.clamp(-limit, limit)
    return (u + 1) * (g * _row_sigmoid(g * alpha))


class SparseMoE(nn.Module):
    """A mixture of experts' MLP (``config.experts``: Mixtral's, Qwen3-MoE's, GraniteMoE's): a router ``gate`` (one
    logit per expert) and ``experts`` (gated MLPs, :class:`Expert`). Each token takes the ``top_k`` experts of the
    softmax of its router logits (in float32), weighted by their probabilities (renormalised to sum 1 where the
    family does, kept in float32 (Mixtral) or rounded to the dtype (Qwen3-MoE); GraniteMoE and GPT-OSS: the softmax
    of its top k logits, rounded to the dtype; GPT-OSS's router and experts have biases and its experts a clamped
    SwiGLU); its output is the sum, from zero and in the dtype, of each chosen expert's output
    times its weight (rounded to the dtype), in increasing expert order, as transformers sums them. Every step of
    that reads the token's own row only (on the CPU the router and the experts take the row-wise kernels, and the
    renormalising sum adds the k weights left to right), so a verification pass computes the bits of one-token steps.
    On the CPU every chosen expert runs in one native call, ``triforce_C::moe_experts`` (csrc/cpu/moe.cpp,
    biases and GPT-OSS's activation included; :meth:`_native_weights` says where), bitwise
    :meth:`_experts_one_by_one`. Which experts run is read on the host:
    on a GPU a sparse layer synchronises per expert hit (the engines' CUDA graphs decline such a model:
    triforce/models/graphs.py)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        spec = config.experts
        # (DeepSeek-V3's router also holds its correction bias, in float32)
        self.gate = (Router(config.hidden_size, spec.count, bias=spec.biases, float32_weight=spec.float32_router,
                            correction_bias=spec.correction_bias)
                     if spec.correction_bias or spec.float32_router
                     else Linear(config.hidden_size, spec.count, bias=spec.biases))
        kind = Expert if spec.gated else UngatedExpert  # (Nemotron 3's: ungated)
        latent = spec.latent_size  # (Nemotron 3 Super's: the routed experts on a projection of the token)
        self.experts = nn.ModuleList((kind(config, spec.intermediate_size, latent) if latent
                                      else kind(config, spec.intermediate_size)) for _ in range(spec.count))
        if latent:
            self.fc1_latent_proj = Linear(config.hidden_size, latent, bias=config.mlp_bias)
            self.fc2_latent_proj = Linear(latent, config.hidden_size, bias=config.mlp_bias)
        self.top_k, self.renormalize, self.float32_weights = spec.top_k, spec.renormalize, spec.float32_weights
        self.softmax_of_top_k = spec.softmax_of_top_k
        self.scaled_inputs = spec.scaled_inputs  # (Llama 4's: the chosen experts' inputs scaled by their weights)
        self.top_k_sigmoid = spec.scoring == "top_k_sigmoid"
        self.activation = config.activation
        self.deepseek = spec.grouped_router  # DeepSeek's routers (_deepseek_route; GLM-4.5's is V3's)
        self.sparsemixer = spec.jitter_eps if spec.scoring == "sparsemixer" else None  # PhiMoE's (_sparsemixer)
        if self.deepseek:
            self.scale, self.sigmoid, self.groups, self.group_top2, self.eps = (
                spec.scale, spec.scoring == "sigmoid", spec.groups, spec.group_top2, spec.renormalize_eps)
            self.logits_in_dtype, self.bias_on_logits = spec.logits_in_dtype, spec.bias_on_logits
            self.scores_in_dtype = spec.scores_in_dtype  # (LFM2-MoE's)
            self.softcap = spec.logit_softcap  # (Laguna's; 0: none)
        if spec.shared_intermediate_size:  # every token's expert (Qwen2-MoE: times the sigmoid of its own gate)
            self.shared_expert = (MLP if spec.gated else FeedForward)(config, spec.shared_intermediate_size)
            if spec.shared_gated:
                self.shared_expert_gate = Linear(config.hidden_size, 1, bias=False)
        self.shared_average = spec.shared_average  # (Cohere 2 MoE's: the routed and shared outputs averaged)
        if spec.output_bias:  # JetMoE's bias on the mixture's output
            self.bias = nn.Parameter(torch.zeros(config.hidden_size))
        if config.moe_output_norm:  # A.X-K1's norm on the mixture's output
            self.post_mlp_layernorm = make_norm(config, config.hidden_size, config.rms_norm_eps)

    def route(self, x: torch.Tensor) -> tuple:
        """``(weights [N, k], expert indices int64 [N, k])`` of the rows of ``x`` ``[N, H]``."""
        if self.deepseek:
            return self._deepseek_route(x)
        if self.sparsemixer is not None:  # (PhiMoE: the logits in the model's dtype, as transformers computes them)
            return _sparsemixer(self.gate(x), self.sparsemixer)
        # (Hunyuan's float32 router: the rows made float32, as transformers computes its logits; the module dict read
        # directly, nn.Module.__getattr__ being slow on a per-layer path)
        params = self.gate._parameters
        gate, bias = params.get("weight"), params.get("bias")
        logits = (linear(x.float(), gate, None if bias is None else bias.float())
                  if gate is not None and gate.dtype == torch.float32 != x.dtype else self.gate(x).float())
        if self.top_k_sigmoid:  # Llama 4's: the top k logits (computed in the dtype), their sigmoid in the dtype
            w, index = torch.topk(logits, self.top_k, dim=-1)
            return _row_sigmoid(w).to(x.dtype), index
        if self.softmax_of_top_k:  # GraniteMoE's order: the top k logits, then their softmax
            w, index = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(w, dim=-1).to(x.dtype), index
        w, index = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        if self.renormalize:
            total = w[:, 0].clone()
            for j in range(1, self.top_k):  # left to right, row by row (a reduction's order may follow N)
                total += w[:, j]
            w = w / total[:, None]
        return (w if self.float32_weights else w.to(x.dtype)), index

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """float32 ``[N, experts]`` logits of DeepSeek's routers for the rows ``x`` ``[N, H]``: the rows and the
        router's weight made float32, as transformers computes them (DeepSeek's), or in the model's dtype, then made
        float32 (``logits_in_dtype``: MiniMax-M2's, AFMoE's)."""
        if self.logits_in_dtype:
            return self.gate(x).float()
        gate = self.gate.weight  # (float32, as transformers computes the logits; a 16-bit router's copy made once)
        if gate.dtype != torch.float32:
            gate = derived(self, "_gate32", gate, gate.float)
        return linear(x.float(), gate)

    def _deepseek_route(self, x: torch.Tensor) -> tuple:
        """DeepSeek's routers, as transformers computes them: the logits in float32 (the rows and the router's weight
        made float32), their softmax (V2) or sigmoid (V3); the experts chosen by those scores (V3: plus the
        correction bias), within the ``topk_group`` best of ``n_group`` groups where ``groups`` (a group's rank: its
        best score, V3 its best two summed; the other groups' scores masked: 0, V3 -inf); each chosen expert's score,
        renormalised (V3's ``norm_topk_prob``: over their sum plus 1e-20), times ``routed_scaling_factor`` (Kolibri-1:
        the correction bias added to the logits for the choice, ``bias_on_logits``); float32
        weights (ERNIE 4.5's: its softmax and correction bias choosing, renormalised, rounded to the dtype; MiniMax-M2's
        logits in the model's dtype)."""
        if self.scores_in_dtype:
            return self._dtype_route(x)
        logits = self.router_logits(x)
        if self.softcap > 0:
            logits = _lanewise(torch.tanh, logits / self.softcap) * self.softcap  # (value by value)
        scores = _row_sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
        bias = self.gate._buffers.get("e_score_correction_bias")
        choice = scores if bias is None else (logits if self.bias_on_logits else scores) + bias
        if self.groups is not None:
            n_group, top_groups = self.groups
            grouped = choice.view(choice.shape[0], n_group, -1)
            rank = grouped.topk(2, dim=-1)[0].sum(-1) if self.group_top2 else grouped.amax(-1)
            keep = torch.zeros_like(rank, dtype=torch.bool).scatter_(1, rank.topk(top_groups, dim=-1)[1], True)
            masked = float("-inf") if self.group_top2 else 0.0
            choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), masked)
        index = torch.topk(choice, self.top_k, dim=-1)[1]
        w = scores.gather(1, index)
        if self.renormalize:
            total = w[:, 0].clone()
            for j in range(1, self.top_k):  # left to right, row by row (as route's)
                total += w[:, j]
            w = w / (total[:, None] + self.eps)
        w = w * self.scale
        return (w if self.float32_weights else w.to(x.dtype)), index

    def _dtype_route(self, x: torch.Tensor) -> tuple:
        """LFM2-MoE's router, as transformers computes it: the logits and their sigmoid in the model's dtype (value by
        value), the top k of the sigmoid plus the float32 correction bias (``expert_bias``) chosen, their sigmoids
        renormalised over their sum (in float32, left to right, rounded once, as torch sums a 16-bit row of k) plus
        ``renormalize_eps`` and times the scale, in the dtype."""
        scores = _row_sigmoid(self.gate(x))
        bias = self.gate._buffers.get("e_score_correction_bias")
        index = torch.topk(scores if bias is None else scores.float() + bias, self.top_k, dim=-1)[1]
        w = scores.gather(1, index)
        if self.renormalize:
            total = w[:, 0].to(torch.float32, copy=True)
            for j in range(1, self.top_k):  # left to right, row by row (as route's)
                total += w[:, j].float()
            w = w / (total.to(w.dtype)[:, None] + self.eps)
        return w * self.scale, index

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        w, index = self.route(rows)
        if self.scaled_inputs:  # (Llama 4: expert(x * w), one chosen expert of each row at a time, added in order)
            out = None
            for j in range(self.top_k):
                scaled, ones = rows * w[:, j, None], torch.ones_like(w[:, j:j + 1])
                y = self._experts(scaled, ones, index[:, j:j + 1])
                out = y if out is None else out + y
        elif "fc1_latent_proj" in self._modules:  # (Nemotron 3 Super's: in and out of the latent width)
            out = self.fc2_latent_proj(self._experts(self.fc1_latent_proj(rows), w, index))
        else:
            out = self._experts(rows, w, index)
        if "bias" in self._parameters:  # (JetMoE's, in the dtype)
            out = out + self._parameters["bias"]
        if "shared_expert" in self._modules:
            shared = self.shared_expert(rows)
            if "shared_expert_gate" in self._modules:
                shared = _row_sigmoid(self.shared_expert_gate(rows)) * shared
            out = (out + shared) / 2 if self.shared_average else out + shared
        if "post_mlp_layernorm" in self._modules:
            out = self._modules["post_mlp_layernorm"](out)
        return out.view(x.shape)

    def _experts(self, rows: torch.Tensor, w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The sum over each row's chosen experts ``index`` ``[N, k]`` of their outputs times ``w`` ``[N, k]``: in one
        native call where :meth:`_native_weights` allows, else one expert at a time (the same bits)."""
        native = self._native_weights(rows, index)
        if native is None:
            return self._experts_one_by_one(rows, w, index)
        weights, biases, clamp = native
        return torch.ops.triforce_C.moe_experts(rows, index, w, *weights, self.activation, *biases, **clamp)

    def _native_weights(self, rows: torch.Tensor, index: torch.Tensor):
        """``((gate_up, gate_up_scales, down, down_scales), (gate_up_bias, down_bias), clamp)``: lists of one entry per
        expert (None for one no row chose; the scales of int8 formats; the bias lists None where no chosen expert has
        one) and the chosen experts' clamped SwiGLU's constants as keywords (GPT-OSS's; else empty) for
        ``triforce_C::moe_experts`` (csrc/cpu/moe.cpp: every chosen expert in one call, its weight blocks in one
        parallel loop), or ``None`` where the experts run one by one: where their projections would not all take
        the row-wise kernels (another device or dtype, autograd, a prefill's bulk products where an expert has more
        than ``ROWWISE_MAX_ROWS`` rows), a chosen expert is not a plain :class:`Expert` whose projections offer the
        fused layer's arguments (``fused_projection``: float :class:`Linear` s of the rows' dtype, or the quantised
        linears of triforce/models/quant.py on float32 rows; biases of the rows' dtype), or has forward hooks, or
        the chosen experts' clamps differ, under ``torch.compile``, or without the op. The same bits either way."""
        if not (rows.device.type == "cpu" and rows.dtype in _ROWWISE_DTYPES and rows.numel() > 0
                and not torch.compiler.is_compiling() and _rowwise_available()
                and self.activation in ("silu", "gelu_tanh", "swiglu_clamped")
                and hasattr(torch.ops.triforce_C, "moe_experts")
                and hasattr(torch.ops.triforce_C, "swiglu_clamped_mul")):  # (the op with biases and the clamp)
            return None
        if not _rowwise_rows(rows) and int(torch.bincount(index.flatten()).max()) > ROWWISE_MAX_ROWS:
            return None  # a prefill's bulk products: an expert of more rows takes torch's GEMM (Linear's rule)
        grad = torch.is_grad_enabled()
        if grad and rows.requires_grad:
            return None
        E = len(self.experts)
        lists = tuple([None] * E for _ in range(6))  # gate_up, its scales, down, its scales, the two biases
        clamps = set()
        for e in torch.unique(index).tolist():
            expert = self.experts[e]
            if type(expert) is not Expert or _hooked(expert):
                return None
            clamps.add(expert.swiglu_clamp if expert.activation == "swiglu_clamped" else None)
            for j, proj in enumerate((expert.gate_up_proj, expert.down_proj)):
                projection = getattr(proj, "fused_projection", None)
                args = None if projection is None or _hooked(proj) else projection(rows.dtype)
                if args is None or (grad and any(a is not None and a.requires_grad for a in (args[0], args[2]))):
                    return None
                if args[2] is not None and args[2].dtype != rows.dtype:
                    return None
                lists[2 * j][e], lists[2 * j + 1][e], lists[4 + j][e] = args
        if len(clamps) > 1:
            return None
        clamp = clamps.pop()
        biases = tuple(b if any(t is not None for t in b) else None for b in lists[4:])
        return lists[:4], biases, {} if clamp is None else {"swiglu_alpha": clamp[0], "swiglu_limit": clamp[1]}

    def _experts_one_by_one(self, rows: torch.Tensor, w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(rows)
        hit = torch.zeros(len(self.experts), dtype=torch.bool, device=rows.device).index_fill_(0, index.flatten(), True)
        for e in hit.nonzero().flatten().tolist():  # (a host sync on a GPU)
            token, slot = torch.where(index == e)
            y = self.experts[e](rows[token])
            # one add per row (a row takes an expert once); not index_add_, whose CPU kernel opens a parallel
            # region per call (~50 us each where the OpenMP threads sleep between regions, OMP_WAIT_POLICY=PASSIVE)
            out.index_put_((token,), (y * w[token, slot, None]).to(out.dtype), accumulate=True)
        return out


_SIGMOID_LANES, _SIGMOID_SLICE = 64, 16384


def _sparsemixer(scores: torch.Tensor, eps: float) -> tuple:
    """PhiMoE's SparseMixer at inference, op by op as transformers computes it in the logits' dtype: ``(weights
    [N, 2], expert indices [N, 2])`` of the router's logits ``scores`` ``[N, experts]``. The first expert is the best;
    its weight is the softmax, at it, of the logits that are within ``2 * eps`` of the best relatively (``(best - s) /
    max(|s|, best)``; the others masked to -inf). The second is the best of the rest, weighted likewise among the rest
    (the same relative test against it, the first one masked). Ties take ``max``'s index, as transformers'."""
    best, first = scores.max(dim=-1, keepdim=True)
    far = ((best - scores) / scores.abs().clamp(min=best)) > 2 * eps
    w1 = torch.softmax(scores.masked_fill(far, float("-inf")), dim=-1).gather(-1, first)
    rest = torch.scatter(scores, -1, first, float("-inf"))
    best2, second = rest.max(dim=-1, keepdim=True)
    far2 = ((best2 - scores) / scores.abs().clamp(min=best2)) > 2 * eps
    w2 = torch.softmax(rest.masked_fill(far2, float("-inf")), dim=-1).gather(-1, second)
    return torch.cat((w1, w2), dim=-1), torch.cat((first, second), dim=-1)


def _row_sigmoid(z: torch.Tensor) -> torch.Tensor:
    """``sigmoid(z)`` with each value's bits its own, whatever the tensor's shape and the value's place in it
    (:func:`_lanewise`)."""
    return _lanewise(torch.sigmoid, z)


def _lanewise(fn, z: torch.Tensor) -> torch.Tensor:
    """``fn(z)`` of an ATen elementwise ``fn`` (sigmoid, expm1, softplus, tanh) with each value's bits its own, whatever
    the tensor's shape and the value's place in it. ATen's CPU kernels compute an element in their vector loop (two
    vectors a step) or in their scalar tail by where it falls in the tensor, and split large tensors among threads at
    any element, so one value's bits may depend on its neighbours' count (as its SiLU's: csrc/include/triforce/glu.h): a
    verification pass's rows would not be its steps'. Here the values run flat, padded to a multiple of
    ``_SIGMOID_LANES`` (64: whole two-vector steps in every dtype), in slices of ``_SIGMOID_SLICE`` (a multiple of it,
    below ATen's grain: one thread), so every value takes the vector loop, whose lanes are independent."""
    if z.device.type != "cpu" or z.numel() == 0:
        return fn(z)
    flat = z.reshape(-1)
    n = flat.numel()
    flat = F.pad(flat, (0, -n % _SIGMOID_LANES))
    out = torch.cat([fn(flat[i:i + _SIGMOID_SLICE]) for i in range(0, flat.numel(), _SIGMOID_SLICE)])
    return out[:n].view(z.shape)


def _native_norm(x: torch.Tensor, w: torch.Tensor) -> bool:
    """:class:`RMSNorm` on the CPU goes through ``triforce_C::rms_norm`` (csrc/cpu/decoder.cpp: the fused layer's
    norm, bitwise the ATen ops below it): float32 or bfloat16 rows and weight of one dtype, without autograd or
    ``torch.compile``, the extension on (``TRIFORCE_ROWWISE_LINEAR`` not ``0``)."""
    return (x.device.type == "cpu" and x.dtype in _FUSED_DTYPES and w.dtype == x.dtype and x.dim() >= 1
            and w.dim() == 1 and w.shape[0] == x.shape[-1] and x.shape[-1] > 0 and w.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            and not torch.compiler.is_compiling() and _rowwise_available()
            and hasattr(torch.ops.triforce_C, "rms_norm"))


def _native_glu(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """act(gate) * up on the CPU goes through ``triforce_C::silu_mul`` / ``gelu_tanh_mul`` / ``gelu_mul`` (the
    fused layer's, same bits): ATen's SiLU and GELU round a row's elements by where they fall in the flattened tensor
    and the threads' shares of it, so their rows are not independent (csrc/include/triforce/glu.h). With autograd too
    (the ops' gradients are ATen's: :func:`_glu_backward`); PyTorch's ops where the extension is off
    (``TRIFORCE_ROWWISE_LINEAR=0``)."""
    return (gate.device.type == "cpu" and gate.dtype in _ROWWISE_DTYPES and up.dtype == gate.dtype
            and up.shape == gate.shape and _rowwise_available() and hasattr(torch.ops.triforce_C, "gelu_mul"))


class MixerLayer(nn.Module):
    """A layer of one block after one norm, ``h + block(norm(h))``: Mamba-2's (``model_type`` ``"mamba2"``: a
    :class:`Mamba2Mixer`) and Nemotron-H's (``config.block_types``: a Mamba-2 mixer, an :class:`Attention` or an
    ungated MLP, :class:`FeedForward`, as ``mlp``); the norm reads the stream in the weights' dtype, and where
    ``residual_in_fp32`` the stream is kept in float32, as transformers' Mamba2Block / NemotronHBlock compute it. The
    native layer stack does not run it (:func:`_native_layers`)."""

    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        kind = config.block_types[layer] if config.block_types else "linear_attention"
        if kind == "mlp":
            self.mlp = (MLP if config.gated_mlp else FeedForward)(config, config.intermediate_size)
        elif kind == "moe":  # (Nemotron 3's mixture blocks)
            self.mlp = SparseMoE(config)
        elif config.mamba1 is not None:  # (Mamba(-1)'s every layer)
            self.self_attn = Mamba1Mixer(config, layer)
        else:
            self.self_attn = (Mamba2Mixer if kind == "linear_attention" else Attention)(config, layer)
        self.input_layernorm = make_norm(config, config.hidden_size, config.rms_norm_eps)
        self.float32_residual = bool(config.extra.get("residual_in_fp32", True))

    def forward(self, h, cos, sin, cache, step):
        norm = self.input_layernorm
        x = norm(h.to(norm.weight.dtype))
        block = self._modules.get("self_attn")
        out = self._modules["mlp"](x) if block is None else block(x, cos, sin, cache, step)
        return (h.float() if self.float32_residual else h) + out


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        parallel = config.parallel_mamba  # (Falcon-H1's: attention and a Mamba-2 mixer, ``mamba``, side by side)
        mamba = config.mamba is not None and config.mamba.layers[layer] and not parallel
        delta = config.delta is not None and config.delta.layers[layer]
        mamba1 = config.mamba1 is not None and config.mamba1.layers[layer]  # (Jamba's)
        if parallel:
            self.mamba = Mamba2Mixer(config, layer)
        kda = delta and config.delta.channel_decay  # (Kimi's)
        self.self_attn = (Mamba2Mixer if mamba else KimiDeltaAttention if kda else GatedDeltaNet if delta
                          else Mamba1Mixer if mamba1
                          else ShortConv if config.conv_layers[layer] and not parallel
                          else LatentAttention if config.mla is not None
                          else MixtureOfAttention if config.attention_experts is not None else Attention)(config, layer)
        experts = config.experts
        width = config.dense_intermediate_size  # (Granite 4.0's shared MLP's; intermediate_size elsewhere)
        self.mlp = (SparseMoE(config) if experts is not None and experts.layers[layer]
                    else MLP(config, width) if config.gated_mlp else FeedForward(config, width))
        # OLMo 2 / 3 (post_norms): no norm before the attention (the identity here), none before the MLP; OLMo Hybrid's
        # DeltaNet layers are pre-norm ones
        post = config.post_norms and not delta
        # ModernBERT decoder: no norm before its first layer's attention (the embeddings' norm is just before it;
        # bare_input: the native stack's calls start after such a layer, _stack_runs)
        self.bare_input = layer == 0 and not config.first_attention_norm
        eps = config.layer_rms_eps  # (rms_norm_eps; JetMoE's layers' own)
        self.input_layernorm = nn.Identity() if post or self.bare_input else make_norm(config, config.hidden_size, eps)
        # Cohere 2: the MLP on input_layernorm's output too, no second norm; GPT-NeoX: on its own norm of h
        self.parallel = config.parallel_block
        if not self.parallel or config.parallel_norms:
            self.post_attention_layernorm = make_norm(config, config.hidden_size, eps)
        if config.sandwich_norms:  # Gemma 3: post_attention_layernorm is on the attention's output
            self.pre_feedforward_layernorm = make_norm(config, config.hidden_size, config.rms_norm_eps)
        if config.sandwich_norms or post:
            self.post_feedforward_layernorm = make_norm(config, config.hidden_size, config.rms_norm_eps)
        self.sandwich = config.sandwich_norms
        self.post_norms = post
        self.norm_after = config.norm_after_residual  # opt-350m's: each norm after its block's residual add
        self.residual_multiplier = config.residual_multiplier  # Granite's (1.0 elsewhere)

    def residual(self, h, a):
        """The stream after the attention output ``a`` and the MLP: ``h + a``, then ``+ mlp(norm(h))``; with
        sandwich norms (Gemma 3) ``h + norm(a)``, then ``+ norm(mlp(norm(h)))``; in parallel (Cohere 2) ``h + a +
        mlp(norm(h))`` with the attention's own norm (GPT-NeoX: with the MLP's, ``post_attention_layernorm``); with
        post norms (OLMo 2 / 3) ``h + norm(a)``, then ``+ norm(mlp(h))``; Granite's blocks' outputs times its residual
        multiplier before each add; with norms after the residual adds (opt-350m) ``norm(h + a)``, then ``norm'(h +
        mlp(h))``."""
        if self.norm_after:
            h = self.input_layernorm(h + a)
            return self.post_attention_layernorm(h + self.mlp(h))
        if self.sandwich and self.residual_multiplier != 1:  # (HyperCLOVA X's Peri-LN under Granite's multiplier)
            m = self.residual_multiplier
            h = h + self.post_attention_layernorm(a) * m
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))) * m
        if self.sandwich:
            h = h + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        if self.parallel:  # (the norm computed again: the same row, the same bits as the attention's input)
            return h + a + self.mlp(self._modules.get("post_attention_layernorm", self.input_layernorm)(h))
        if self.post_norms:
            h = h + self.post_attention_layernorm(a)
            return h + self.post_feedforward_layernorm(self.mlp(h))
        m = self.residual_multiplier
        if m != 1:
            h = h + a * m
            return h + self.mlp(self.post_attention_layernorm(h)) * m
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, h, cos, sin, cache, step):
        fused = self._fused_layer_arguments(h.dtype) if _fused_path(h) else None
        kind = None if fused is None else fused[3]
        if kind == _PLAIN_LAYER or kind == _MOE_LAYER:  # native calls around the cache, bitwise the modules' result
            att, args_in, args_out = fused[:3]
            q, k, k_raw, v = torch.ops.triforce_C.decoder_attn_in(h, *args_in, cos, sin, att.head_dim)
            out = att.attend(q, k, v, k_raw, cache, step)
            if kind == _PLAIN_LAYER:
                return torch.ops.triforce_C.decoder_attn_out_mlp(h, out, *args_out)
            h, x = torch.ops.triforce_C.decoder_attn_out(h, out, *args_out)  # (a mixture: its MLP in Python)
            return h + self.mlp(x)
        x = h if self.norm_after else self.input_layernorm(h)
        a = self.self_attn(x, cos, sin, cache, step)
        mixer = self._modules.get("mamba")  # (Falcon-H1's, beside the attention on the same input)
        if mixer is not None:
            a = mixer(x, cos, sin, cache, step) + a
        norm = self._modules.get("post_attention_layernorm")  # (Cohere 2's parallel block has none)
        if type(norm) is RMSNorm and not self.parallel and not self.sandwich and not self.post_norms \
                and not self.norm_after \
                and self.residual_multiplier == 1 \
                and norm._kernel_ok(h) and a.shape == h.shape \
                and a.dtype == h.dtype and a.is_contiguous():  # the residual add and the norm after it in one kernel
            h, x = _layer_ops().rms_norm(h, norm.weight, norm.eps, a)
            return h + self.mlp(x)
        return self.residual(h, a)

    def fused_arguments(self, h):
        """``(attention module, arguments of decoder_attn_in after h, arguments of decoder_attn_out_mlp
        after h and the attention output)`` for the fused CPU path (csrc/cpu/decoder.cpp), or ``None``
        where the modules run one by one: off the CPU, other dtypes, more rows than the rowwise kernels
        take (``ROWWISE_MAX_ROWS``), with autograd on, or with a module the fused path does not know
        (the norms must be :class:`RMSNorm`; each projection must offer ``fused_projection``:
        :class:`Linear` and ``Q8Linear`` do). Runs per layer and forward, so it reads the module dicts
        directly (``nn.Module.__getattr__`` costs ~25 us a layer here). The two calls take RMSNorm and Llama's
        SwiGLU MLP only: a layer of LayerNorms or an ungated MLP runs fused in the native stack alone
        (:func:`_native_layers`)."""
        fused = self._fused_layer_arguments(h.dtype) if _fused_path(h) else None
        return None if fused is None or fused[3] != _PLAIN_LAYER else fused[:3]

    def _fused_layer_arguments(self, dtype: torch.dtype):
        """:meth:`fused_arguments` past the checks of the input ``h`` (:func:`_fused_path`) -> ``(attention module,
        args_in, args_out, kind, extra, gate)``, or None. ``kind`` (one for all of a native stack call's layers):
        ``(norm_in's bias, norm_out's bias, norms, mlp, parallel, norm_after, clip, sandwich, post_norms, qk_full,
        multiplier, rope_f32, temperature, after_rope, sinks, qk_kind, gate_kind)``, :data:`_PLAIN_LAYER` for RMSNorms
        and Llama's gated SwiGLU in sequence (the per-layer fused calls' layer):

        - ``norms``: ``"llama"`` (:class:`RMSNorm`), torch's LayerNorm ``"layer"`` (the two biases then a bias or None
          each), ``"gemma"`` (:class:`GemmaRMSNorm`), ``"float32"`` (:class:`Float32RMSNorm`), ``"cohere"`` (Cohere's
          :class:`LayerNorm`);
        - ``mlp`` as decoder_layers names it: ``"silu"``, Gemma's GeGLU ``"gelu_tanh_glu"``, an ungated MLP by its
          activation, ``"gelu_tanh"``, ``"gelu"``, ``"relu"``, ``"relu2"`` or ``"xielu"`` (its gate's projection slot an
          empty placeholder); ``"moe"``, a :class:`SparseMoE` (:data:`_MOE_LAYER`: ``args_out`` then o_proj's alone;
          not the stack's);
        - ``parallel``: ``h + attn(norm(h)) + mlp(norm'(h))``, ``norm_out`` its MLP's norm: its own (GPT-NeoX's) or
          the attention's (Phi-2's, Falcon 7b's);
        - ``norm_after``: each norm after its block's residual add, opt-350m's and GPT-1's ``norm_in(h + attn(h))``
          then ``norm_out(h + mlp(h))``;
        - ``clip``: OLMo's and MPT's clamp of q, k and v, ``clip_qkv``, or None;
        - ``sandwich``: Gemma 2 / 3's and GLM-4's four norms (``extra``: the two around the MLP, ``((weight, eps),
          (weight, eps))``; ``()`` otherwise);
        - ``post_norms``: norms after the blocks and none before, OLMo 2 / 3's and EXAONE 4's (``norm_in`` and
          ``norm_out`` then the norms after the attention and after the MLP);
        - ``qk_full``: q/k norms over whole projections (OLMo 2's);
        - ``multiplier``: Granite's residual multiplier, 1.0 elsewhere;
        - ``rope_f32``: RoPE in float32 (Cohere's, GPT-J's, ERNIE 4.5's);
        - ``temperature``: Ministral 3's query temperature ``(beta, original)``, or None;
        - ``after_rope``: the q/k norms after RoPE (Hunyuan's, NanoChat's order);
        - ``sinks``: attention sinks (GPT-OSS's, Granite SWA's, Flint's);
        - ``qk_kind``: the q/k norms' kind where it is not the layers' default one (:data:`_QK_KINDS`), or None;
        - ``gate_kind``: the gate on the heads' output before o_proj (decoder_layers' ``attn_gate_kind``: AFMoE's
          ``"sigmoid"``, Laguna's ``"softplus_head"`` / ``"softplus_dim"``), or None; ``gate`` its projection's
          ``(weight, scales, bias)``, or None."""
        mods = self._modules
        parallel = bool(self.__dict__.get("parallel"))  # (the MLP's norm: its own, GPT-NeoX's, else the attention's)
        if "post_attention_layernorm" not in mods and not parallel:
            return None
        post_norms = bool(self.__dict__.get("post_norms"))  # (the stack's post_norms: no norm before either block)
        att, mlp, norm_in = mods["self_attn"], mods["mlp"], mods["input_layernorm"]
        norm_out = mods.get("post_attention_layernorm", norm_in)
        if "mamba" in mods:
            return None  # Falcon-H1's Mamba mixer beside the attention: the modules
        if post_norms:
            norm_in, norm_out = norm_out, mods["post_feedforward_layernorm"]
        if type(att) is not Attention:
            return None  # DeepSeek's latent attention: not the fused layer's
        d = att.__dict__
        if d.get("l2_eps") is not None or d.get("nope_temperature") is not None or d.get("chunk"):
            return None  # Llama 4's q/k L2 norms, NoPE temperature and chunks: the modules'
        if d.get("v_dim", att.head_dim) != att.head_dim or d.get("v_scale") is not None:
            return None  # MiMo-V2-Flash's narrower, scaled values: the modules'
        if "attn_sub_norm" in att._modules or "ffn_sub_norm" in mlp._modules:
            return None  # BitNet's norms inside the blocks: the modules'
        a, m = att._modules, mlp._modules
        q_norm, k_norm = a.get("q_norm"), a.get("k_norm")  # Qwen3's; absent from _modules when None
        after_rope = bool(att.__dict__.get("after_rope"))  # (Hunyuan's, NanoChat's q/k norms after RoPE)
        if after_rope and (att.__dict__.get("full_qk_norm") or att.__dict__.get("clip") is not None
                           or att.__dict__.get("rope_f32")):
            return None
        # AFMoE's and Laguna's gates on the heads' output (decoder_layers' attn_gate_kind), with their projection
        gate_mod, gate_kind = a.get("gate_proj"), "sigmoid"
        if att.__dict__.get("sigmoid_head_gate"):
            return None  # LFM3's gate per head: the modules'
        if gate_mod is None:
            gate_mod, gate_kind = a.get("g_proj"), f"softplus_{att.__dict__.get('softplus_gate')}"
        gate_kind = None if gate_mod is None else gate_kind
        # (StarCoder 2's, GPT-2's, DBRX's; Nemotron's LayerNorm1P, its weight + 1 passed as the one F.layer_norm takes;
        # OLMo's weightless one, an empty weight: _norm_weight)
        norm_after = bool(self.__dict__.get("norm_after"))  # (opt-350m's, GPT-1's: the stack's norm_after)
        sandwich = bool(self.__dict__.get("sandwich"))  # (Gemma 2 / 3's, GLM-4's: the stack's sandwich)
        norms = (norm_in, norm_out, mods["pre_feedforward_layernorm"], mods["post_feedforward_layernorm"]) \
            if sandwich else (norm_in, norm_out)
        kinds = {_NORM_KINDS.get(type(n)) for n in norms}
        norm_kind = kinds.pop() if len(kinds) == 1 else None
        multiplier = self.__dict__.get("residual_multiplier", 1.0)  # (Granite's, HyperCLOVA X's)
        if (norm_after and parallel) or norm_kind is None \
                or ((sandwich or post_norms) and (norm_kind == "layer" or parallel or norm_after)) \
                or (multiplier != 1 and (parallel or norm_after or post_norms)) \
                or (q_norm is not None and not (type(q_norm) is type(k_norm) and type(q_norm) in _QK_KINDS)):
            return None
        # the q/k norms' kind where it is not the layers' (decoder_layers' qk_norm_kind; None: RMSNorms of theirs)
        qk_kind = None if q_norm is None or type(q_norm) is _QK_NORMS[norm_kind] else _QK_KINDS[type(q_norm)]
        act = mlp.__dict__.get("activation", "silu")
        if type(mlp) is SparseMoE:  # (the per-layer calls' attention, the mixture in Python: _MOE_LAYER)
            mlp_name = "moe"
        elif type(mlp) is MLP and act in _GATED_NATIVE:
            mlp_name = _GATED_NATIVE[act]
        elif type(mlp) is FeedForward and (act in _UNGATED_NATIVE or act == "xielu" and type(m["act_fn"]) is XIELU):
            mlp_name = act
        else:
            return None  # the fused layer's: SwiGLU, GeGLU, or an ungated MLP of those activations
        if q_norm is not None and q_norm.eps != k_norm.eps:  # the native call takes one eps for both
            return None
        projections = []
        out_group = (a["o_proj"],) if mlp_name == "moe" else (a["o_proj"], m.get("gate_proj"), m["up_proj"],
                                                               m["down_proj"])
        for group in ((a["q_proj"], a["k_proj"], a["v_proj"]), out_group):
            found = []
            for mod in group:
                if mod is None:  # (an ungated MLP's gate: a placeholder, not read)
                    found.append((_placeholder(dtype), None, None))
                    continue
                get = getattr(type(mod), "fused_projection", None)
                p = get(mod, dtype) if get is not None else None
                if p is None:
                    return None
                found.append(p)
            projections.append(tuple(zip(*found)))  # (weights, scales, biases)
        gate = None
        if gate_mod is not None:
            get = getattr(type(gate_mod), "fused_projection", None)
            gate = get(gate_mod, dtype) if get is not None else None
            if gate is None:
                return None
        qk = (None, None, 0.0) if q_norm is None else (q_norm._parameters["weight"], k_norm._parameters["weight"],
                                                       q_norm.eps)
        args_in = (_norm_weight(norm_in), norm_in.eps, *projections[0], *qk)
        args_out = (_norm_weight(norm_out), norm_out.eps, *projections[1])
        clip = att.__dict__.get("clip")  # (OLMo's, MPT's clamp of q, k and v: the stack's clip_qkv)
        biases = (norm_in._parameters.get("bias"), norm_out._parameters.get("bias")) if norm_kind == "layer" \
            else (None, None)
        kind = (*biases, norm_kind, mlp_name, parallel, norm_after, clip, sandwich, post_norms,
                bool(att.__dict__.get("full_qk_norm")), float(multiplier), bool(att.__dict__.get("rope_f32")),
                att.__dict__.get("temperature"), after_rope, att._parameters.get("sinks") is not None, qk_kind,
                gate_kind)
        extra = tuple((n._parameters["weight"], n.eps) for n in norms[2:])
        return att, args_in, args_out, kind, extra, gate


_LAYER_NORMS = (BiasLayerNorm, NoBiasLayerNorm, LayerNorm1P, BareLayerNorm)  # torch's LayerNorm (F.layer_norm), as
# decoder_layers calls it


def _norm_weight(norm: nn.Module) -> torch.Tensor:
    """The weight a norm's op takes: its parameter, LayerNorm1P's ``weight + 1`` (computed as its forward computes
    it, in the weight's dtype: the same tensor, the same bits), or for OLMo's weightless BareLayerNorm an empty
    tensor (decoder_layers then computes it as its module: in float32, rounded)."""
    if type(norm) is BareLayerNorm:
        return _placeholder(torch.float32)
    w = norm._parameters["weight"]
    return w + 1.0 if type(norm) is LayerNorm1P else w
_PLAIN_LAYER = (None, None, "llama", "silu", False, False, None, False, False, False, 1.0, False, None, False, False,
                None, None)
# (RMSNorms, Llama's SwiGLU, in sequence, each norm before its block, no clamp, q/k norms per head before RoPE, no
# multiplier, RoPE in the dtype, no query temperature, no sinks: the per-layer fused calls' layer)
_MOE_LAYER = (*_PLAIN_LAYER[:3], "moe", *_PLAIN_LAYER[4:])  # the plain layer with a mixture of experts for its MLP:
# decoder_attn_in, the cache, decoder_attn_out, then the mixture in Python (DecoderLayer.forward)
_NORM_KINDS = {RMSNorm: "llama", GemmaRMSNorm: "gemma", Float32RMSNorm: "float32", LayerNorm: "cohere",
               **{t: "layer" for t in _LAYER_NORMS}}  # decoder_layers' norms (norm_kind's names, or torch's LayerNorms)
_QK_NORMS = {"llama": RMSNorm, "layer": RMSNorm, "gemma": GemmaRMSNorm, "float32": Float32RMSNorm,
             "cohere": LayerNorm}  # the q/k norms of a layer of each kind that decoder_layers runs by default
_QK_KINDS = {RMSNorm: "llama", GemmaRMSNorm: "gemma", Float32RMSNorm: "float32", LayerNorm: "cohere",
             BiasLayerNorm: "layer"}  # decoder_layers' qk_norm_kind of each q/k norm (StableLM 2 12B's Cohere-like
# per-head LayerNorms, Persimmon's torch LayerNorms with biases)
_GATED_NATIVE = {"silu": "silu", "gelu_tanh": "gelu_tanh_glu", "gelu": "gelu_glu"}  # the gated MLPs decoder_layers
# runs, by its names
_UNGATED_NATIVE = ("gelu_tanh", "gelu", "relu", "relu2")  # the ungated MLPs decoder_layers runs


@functools.cache
def _placeholder(dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of ``dtype``: an ungated MLP's gate projection slot in decoder_layers (never read), one per
    dtype rather than one per layer and forward."""
    return torch.empty(0, dtype=dtype)


def _fused_path(h: torch.Tensor) -> bool:
    """Whether a layer's input ``h`` may take the fused CPU path (:meth:`DecoderLayer.fused_arguments`)."""
    return (h.device.type == "cpu" and h.dtype in _FUSED_DTYPES and 0 < h.shape[0] * h.shape[1] <= ROWWISE_MAX_ROWS
            and not torch.is_grad_enabled() and _fused_available())


def _packs_rows(device: torch.device) -> bool:
    """Whether a ragged step (``Llama.forward(..., widths=...)``) on ``device`` computes its real tokens packed:
    on the CPU (elsewhere finding them would be a host sync, and the padding is computed)."""
    return device.type == "cpu"


def _hooked(module: nn.Module) -> bool:
    """Whether calling ``module`` would run forward hooks (its own or global ones)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or _nn_module._global_forward_hooks
                or _nn_module._global_forward_pre_hooks)


def _native_layers(layers, lo: int, hi: int, h, cos, sin, cache: _KVCache, step: Step, rows=None, ropes=None):
    """``h`` after ``layers[lo:hi]`` of a cached forward in one native call, ``triforce_C::decoder_layers``
    (csrc/cpu/decoder.cpp): each layer's two fused calls with the cache's side in between (its rows written,
    ``verify_attention`` over its buffers), bitwise what the layers called one by one give; besides RMSNorm and
    SwiGLU, torch's LayerNorms, the ungated MLPs of :data:`_UNGATED_NATIVE`, parallel blocks and norms after the
    residual adds (opt-350m's, GPT-1's; one kind for all the call's layers:
    :meth:`DecoderLayer._fused_layer_arguments`), Gemma's norms, GeGLU and sandwich norms, at the cache's attention
    scale and soft cap, with its ALiBi slopes (BLOOM's, MPT's, Falcon-RW's), each layer's RoPE tables: ``ropes[i]``
    for layer ``i`` (``Llama.rope_tables``: Gemma 3's two, SmolLM3's NoPE layers' identity), by default ``(cos,
    sin)`` for all. ``None`` where
    that path does not apply: a layer off the fused path (see :meth:`DecoderLayer.fused_arguments`) or with
    forward hooks, a cache whose ``attend`` is more than write-and-attend (``_KVCache._native_buffers``),
    another backend chosen for ``verify_attention``, the switch ``TRIFORCE_DECODER_LAYERS=0``, or
    ``torch.compile`` (which traces the per-layer calls). Why: a SmolLM2 layer cost ~70 us of Python and
    dispatch around its kernels on one core, ~2 ms of a ~12 ms decode step (docs/model.md). ``rows`` (int64 ``[N]``,
    increasing indices ``b * T + t``): a ragged step's real tokens, which the call computes packed, returning
    their stream ``[1, N, H]`` (the padding's keys and values are written as zeros)."""
    if not (hi > lo and _fused_path(h) and _native_stack_available()) or torch.compiler.is_compiling():
        return None
    buffers = cache._native_buffers(step)
    if buffers is None or resolve("verify_attention", None, h.device) != "cpu" \
            or (step.leftpad and len(step.leftpad) > 1):  # (decoder_layers: one leftpad for all windows)
        return None
    k, v, k_raw, last_query = buffers
    norms, eps, w, scales, bias, qk_norms, qk_eps, norm_bias, gates = [], [], [], [], [], [], [], [], []
    head_dim = kind = None
    mlps = set()
    for i in range(lo, hi):
        layer = layers[i]
        if type(layer) is not DecoderLayer or _hooked(layer):
            return None
        fused = layer._fused_layer_arguments(h.dtype)
        if fused is None:
            return None
        layer_kind = fused[3]
        # (one kind of norm and layout for the call's layers, one MLP kind; a mixture of experts only as the last
        # layer of a call, its norms before the residual adds: the call stops before it, which runs in Python)
        moe = layer_kind[3] == "moe"
        if kind not in (None, layer_kind[2:3] + layer_kind[4:]) or (moe and (i != hi - 1 or layer_kind[5])):
            return None
        att, (n_in, e_in, w_in, s_in, b_in, qn, kn, qe), (n_out, e_out, w_out, s_out, b_out), _, extra, gate = fused
        kind = layer_kind[2:3] + layer_kind[4:]
        if moe:  # (gate, up and down: placeholders, not read)
            w_out, s_out, b_out = w_out + (_placeholder(h.dtype),) * 3, s_out + (None,) * 3, b_out + (None,) * 3
        else:
            mlps.add(layer_kind[3])
        if len(mlps) > 1:
            return None
        norm_bias += layer_kind[:2]
        if type(att).attend is not Attention.attend or head_dim not in (None, att.head_dim):
            return None
        head_dim = att.head_dim
        norms += (n_in, n_out, *(n for n, _ in extra))
        eps += (e_in, e_out, *(e for _, e in extra))
        w += w_in + w_out
        scales += s_in + s_out
        bias += b_in + b_out
        qk_norms += (qn, kn)
        qk_eps.append(qe)
        gates += gate or ()
    record = bool(last_query)
    qi = step.query_index if record else None
    norm_kind, parallel, norm_after, clip, sandwich, post_norms, qk_full, multiplier, rope_f32, temperature, \
        after_rope, sinks, qk_kind, gate_kind = kind
    mlp = mlps.pop() if mlps else "silu"  # (a call of one mixture's layer: no MLP of the stack's runs)
    moe = type(layers[hi - 1]._modules.get("mlp")) is SparseMoE
    extra = {} if qk_kind is None else {"qk_norm_kind": qk_kind}
    if qk_kind == "layer":  # (Persimmon's: each q / k norm's bias)
        extra["qk_norm_bias"] = [norm._parameters.get("bias") for i in range(lo, hi)
                                 for norm in (layers[i].self_attn.q_norm, layers[i].self_attn.k_norm)]
    if gate_kind is not None:  # (AFMoE's, Laguna's: each layer's gate projection, weight, scales, bias)
        extra["attn_gate"], extra["attn_gate_kind"] = gates, gate_kind
    if sinks:  # (GPT-OSS's, each layer's own)
        extra["sinks"] = [layers[i].self_attn._parameters["sinks"] for i in range(lo, hi)]
    if mlp == "xielu":  # (Apertus's: each layer's numbers as XIELU.forward computes them)
        extra["xielu"] = [t for i in range(lo, hi) for t in _xielu_numbers(layers[i].mlp._modules["act_fn"])]
    ropes = [(cos, sin)] * len(layers) if ropes is None else ropes
    tables = list({id(r): r for r in ropes[lo:hi]}.values())  # (the distinct tables, in their first layer's order)
    cos, sin = tables[0]
    out = torch.ops.triforce_C.decoder_layers(
        h, cos, sin, head_dim, norms, eps, w, scales, bias, qk_norms, qk_eps, k[lo:hi], v[lo:hi], k_raw[lo:hi],
        last_query[lo:hi], step.slots.contiguous(), step.seqlens, step.tree_mask,
        None if qi is None else qi.long().contiguous(), None if qi is None else step.query_valid.contiguous(), rows,
        list(cache.windows[lo:hi]) if any(cache.windows[lo:hi]) else None,
        next(iter(step.leftpad.values())) if step.leftpad else None, norm_bias if norm_kind == "layer" else None, mlp,
        cache.scale, parallel, **({"norm_after": True} if norm_after else {}),
        **({} if cache.alibi is None else {"alibi_slopes": cache.alibi}),
        **({} if clip is None else {"clip_qkv": float(clip)}), **({"sandwich": True} if sandwich else {}),
        **({"norm_kind": norm_kind} if norm_kind in ("gemma", "float32", "cohere") else {}),
        **({"post_norms": True} if post_norms else {}), **({"qk_norm_full": True} if qk_full else {}),
        **({"residual_multiplier": multiplier} if multiplier != 1 else {}),
        **({"rope_float32": True} if rope_f32 else {}), **({"qk_norm_after_rope": True} if after_rope else {}),
        **extra,
        **({} if temperature is None else {"query_scale": layers[lo].self_attn.temper_scale(step.positions, h.dtype)}),
        **({"softcap": float(cache.softcap)} if cache.softcap else {}),
        **({} if len(tables) == 1 else {"ropes": [t for pair in tables[1:] for t in pair],
                                        "rope_of": [next(j for j, t in enumerate(tables) if t is r)
                                                    for r in ropes[lo:hi]]}),
        **({"mixture_last": True} if moe else {}))
    if not moe:
        return out
    h, x = out.unbind(0)  # (the last layer's mixture, as DecoderLayer.residual runs it)
    mods = layers[hi - 1]._modules
    y = mods["mlp"](x)
    if sandwich or post_norms:  # (Kolibri's, FlexOlmo's norm of the mixture's output)
        y = mods["post_feedforward_layernorm"](y)
    return h + (y if multiplier == 1 else y * multiplier)


def _stack_runs(layers, lo: int, hi: int) -> list:
    """``layers[lo:hi]`` as the runs the native stack takes in one call each: cut after each mixture of experts (a call
    stops before the last layer's mixture, which runs in Python: ``decoder_layers``' ``mixture_last``) and after a
    layer without a norm before its attention (``bare_input``: ModernBERT decoder's first, which the stack does not
    run, so that the others take it); each of LFM2's convolution layers a run of its own (which the stack declines: it
    runs in Python, the attention layers between them in the stack)."""
    cuts = [i + 1 for i in range(lo, hi - 1) if type(layers[i]._modules.get("mlp")) is SparseMoE
            or layers[i].__dict__.get("bare_input")]  # (ModernBERT decoder's first layer: on the modules)
    # LFM2's convolution layers, which the stack does not run: each alone, so that the attention layers between them
    # run in the stack
    convs = [i for i in range(lo, hi) if type(layers[i]._modules.get("self_attn")) in (ShortConv, Mamba2Mixer,
                                                                                          GatedDeltaNet, Mamba1Mixer,
                                                                                          KimiDeltaAttention)
             or "mamba" in layers[i]._modules]  # (Falcon-H1's: a Mamba mixer beside the attention)
    edges = sorted({lo, *cuts, *convs, *(i + 1 for i in convs if i + 1 < hi), hi})
    return list(zip(edges, edges[1:]))


_STACK = None


def _native_stack_available() -> bool:
    """The fused decoder layer is on (:func:`_fused_available`), the extension has ``decoder_layers``, and
    ``TRIFORCE_DECODER_LAYERS`` is not ``0`` (an A/B switch: ``0`` makes the two fused calls per layer
    from Python, with the cache's ``attend`` between them)."""
    global _STACK
    if not _fused_available():
        return False
    if _STACK is None:
        _STACK = (os.environ.get("TRIFORCE_DECODER_LAYERS", "1") != "0"
                  and hasattr(torch.ops.triforce_C, "decoder_layers"))
    return _STACK


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, init: bool = True):
        super().__init__()
        # init=False: nn.Embedding is given its (empty) weight instead of drawing one (see Llama's _empty).
        e = config.embed_dim  # (hidden_size but for opt-350m's narrower embeddings, projected in and out)
        weight = None if init else torch.empty(config.vocab_size, e)
        self.embed_tokens = nn.Embedding(config.vocab_size, e, _weight=weight)
        if e != config.hidden_size:
            self.project_in = Linear(e, config.hidden_size, bias=False)
            self.project_out = Linear(config.hidden_size, e, bias=False)
        if config.position_offset is not None:  # GPT-2's learned absolute positions (wpe)
            rows = config.max_position_embeddings + config.position_offset
            self.embed_positions = nn.Embedding(rows, config.hidden_size, _weight=None if init else torch.empty(
                rows, config.hidden_size))
        if config.embed_layernorm:  # (BLOOM's word_embeddings_layernorm)
            self.embed_layernorm = make_norm(config, config.hidden_size, config.rms_norm_eps)
        layer = MixerLayer if config.model_type in ("mamba2", "nemotron_h", "mamba", "falcon_mamba") else DecoderLayer
        self.layers = nn.ModuleList(layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = make_norm(config, config.hidden_size, config.rms_norm_eps) if config.final_norm else nn.Identity()
        if config.head_transform:  # ModernBERT decoder's prediction head before the logits: norm(act(dense(z)))
            self.head_dense = Linear(config.hidden_size, config.hidden_size, bias=config.head_transform_bias)
            self.head_norm = make_norm(config, config.hidden_size, config.rms_norm_eps)


class Llama(nn.Module):
    """Llama decoder with a language-model head.

    ``Llama(config)`` initialises weights randomly from torch's RNG (normal, std
    ``config.initializer_range``; norms 1). Use :meth:`from_pretrained` for real weights.

    Calls (see docs/model_interface.md):

    - ``model(input_ids)``: ``[B, T]`` int64 -> float32 logits ``[B, T, V]``, plain causal forward.
    - ``model.prefill(prompts, cache)``: ``[B, P]`` tensor or list of 1-D tensors (ragged), processed in
      chunks; float32 logits ``[B, V]`` at each prompt's last token; ``cache.lengths[b] = len(prompts[b])``.
    - ``model(input_ids, cache=cache)``: appends row b's T tokens after ``cache.lengths[b]``, causal among
      them -> ``[B, T, V]``; ``cache.lengths += T``.
    - ``model(input_ids, cache=cache, widths=w)``: a ragged step: row b's real tokens are ``input_ids[b, :w[b]]``
      (the rest padding): ``cache.lengths += w``, and the logits at the padding are 0. On the CPU's native
      layer stack the real tokens run packed (:func:`_native_layers`): a pass costs its real tokens.
    - ``model(input_ids, cache=cache, tree_parents=parents)``: token tree (``parents[:, 0] = -1``); token t
      sees the prefix and its ancestors-or-self; RoPE position = cache position of token 0 + depth.
      ``parents`` is checked per forward (a host sync on a GPU); a :class:`~triforce.models.TokenTree`
      carries its mask and depths, built once (``TokenTree.static``: checked on the host).
    - ``model.layer_skip(k)``: a draft made of the first k layers (weights shared).
    """

    def __init__(self, config: LlamaConfig, *, _empty: bool = False):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        # _empty=True (for loaders, which assign every weight with load_state_dict(sd, assign=True) and then
        # set inv_freq = rope_inv_freq(config, device)): parameters and inv_freq are meta tensors and nothing
        # is drawn. Not `with torch.device("meta"): Llama(config)`: there nn.Embedding's normal_ and RoPE's
        # division run through torch._refs, whose first call imports torch._dynamo (~2 s on 2 busy
        # cores, up to ~11 s on busier ones) to compute nothing; nn.Linear's init has a native meta kernel.
        with torch.device("meta") if _empty else contextlib.nullcontext():
            self.model = LlamaModel(config, init=not _empty)
            self.lm_head = Linear(config.embed_dim, config.vocab_size, bias=config.head_bias)
            if config.bitnet is not None:  # (BitNet's ternary projections, with int8 activations)
                from .bitnet import use_bit_linears

                use_bit_linears(self, config.bitnet)
            inv_freq = torch.empty(config.head_dim // 2) if _empty else rope_inv_freq(config)
            local = None if all(config.rope_layers) else (
                torch.empty(config.head_dim // 2) if _empty else rope_local_inv_freq(config))
            long = None if config.rope_long_from is None else (
                torch.empty(config.head_dim // 2) if _empty else rope_inv_freq(config, long=True))
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # Gemma 3's sliding layers' RoPE, SmolLM3's NoPE layers' zeros (None: every layer takes inv_freq)
        self.register_buffer("inv_freq_local", local, persistent=False)
        # LongRoPE's long factors' frequencies (inv_freq: its short ones); None for every other RoPE
        self.register_buffer("inv_freq_long", long, persistent=False)
        if not self.inv_freq.is_meta:  # also `with torch.device("meta"): Llama(config)`
            self._init_weights()

    def _init_weights(self):
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, Attention) and m.sinks is not None:  # (as transformers' GPT-OSS)
                nn.init.normal_(m.sinks, mean=0.0, std=std)
        if self.config.sinusoidal_positions:  # (XGLM's fixed table, not drawn)
            from .config import sinusoidal_table
            with torch.no_grad():
                self.model.embed_positions.weight.copy_(sinusoidal_table(self.config))

    # a cached forward on CUDA is replayed from a CUDA graph per (cache, shape): triforce/models/graphs.py
    cuda_graphs = True
    _kv_dtype = None  # see kv_dtype: None keeps the caches in the model's dtype

    def _apply(self, fn, recurse=True):
        # .to(torch.bfloat16) / .half() cast every floating buffer: the RoPE frequencies stay float32 (as
        # from_pretrained(dtype=...) and transformers keep them; bfloat16 would round them by up to 0.4%)
        out = super()._apply(fn, recurse)
        _graphs.drop(self)  # the captured weights' addresses may have changed
        if not self.inv_freq.is_meta and self.inv_freq.dtype != torch.float32:
            self.inv_freq = rope_inv_freq(self.config, self.inv_freq.device)
        local = self.__dict__["_buffers"].get("inv_freq_local")
        if local is not None and not local.is_meta and local.dtype != torch.float32:
            self.inv_freq_local = rope_local_inv_freq(self.config, local.device)
        long = self.__dict__["_buffers"].get("inv_freq_long")
        if long is not None and not long.is_meta and long.dtype != torch.float32:
            self.inv_freq_long = rope_inv_freq(self.config, long.device, long=True)
        return out

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype | None = None,
                    rows_long: torch.Tensor | None = None) -> list:
        """``(cos, sin)`` ``[B, T, 1, head_dim]`` per layer for int ``positions`` ``[B, T]``: one pair shared by
        every layer, except Gemma 3's, whose sliding layers take their own RoPE (``inv_freq_local``), and SmolLM3's,
        whose NoPE layers take cos 1 and sin 0. LongRoPE:
        row ``b`` takes the long factors where the bool ``rows_long[b]`` is set (a cache's ``rope_long``; a Python
        bool: every row); without it, where the row's last position is at or past ``config.rope_long_from``
        (transformers' rule for one forward, per row)."""
        dtype = dtype or self.dtype
        if self.config.rope_float32 == "tables":  # (ERNIE 4.5: Attention.project rotates in float32 and rounds)
            dtype = torch.float32
        inv_freq = self.inv_freq
        if self.inv_freq_long is not None:
            if rows_long is None:
                rows_long = positions.amax(1) >= self.config.rope_long_from
            if isinstance(rows_long, bool):
                inv_freq = self.inv_freq_long if rows_long else inv_freq
            else:
                inv_freq = rows_inv_freq(inv_freq, self.inv_freq_long, rows_long)
        main = rope_cos_sin(inv_freq, positions, dtype, self.rope_scale)
        n = len(self.model.layers)
        if self.inv_freq_local is None:
            return [main] * n
        local = rope_cos_sin(self.inv_freq_local, positions, dtype)
        return [main if r else local for r in self.config.rope_layers]  # (Gemma 3's sliding, SmolLM3's NoPE)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The input embeddings of ``input_ids`` at int ``positions`` (both ``[B, T]``; by default each row's ``0 ..
        T - 1``, a plain forward's; the residual stream's start):
        ``embed_tokens`` times ``config.rounded_embed_factor`` (Gemma's sqrt(hidden_size), MiniCPM3's ``scale_emb``,
        BioGPT's sqrt(hidden_size)), the factor rounded to the dtype first as transformers does; plus GPT-2's learned
        ``embed_positions`` (``config.position_offset``; a position past the context reads the last row: only a
        speculative tail's tokens, never emitted, have one, see ``FullCache``'s ``speculative_slack``); normed by the
        final norm where ``config.embed_norm`` (NanoChat), by ``embed_layernorm`` where the model has one (BLOOM)."""
        h = self.model.embed_tokens(input_ids)
        f = self.config.rounded_embed_factor  # (Gemma's sqrt(hidden_size), MiniCPM3's scale_emb, BioGPT's)
        if f is not None:
            h = h * float(torch.tensor(f).to(h.dtype))
        project_in = self.model._modules.get("project_in")  # (opt-350m's: its embeddings narrower than the layers)
        if project_in is not None:
            h = project_in(h)
        offset = self.config.position_offset
        if offset is not None:  # (no host sync: the clamp instead of a check)
            if positions is None:
                positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
            last = self.config.max_position_embeddings - 1
            h = h + self.model.embed_positions(positions.clamp(0, last) + offset)
        if self.config.embed_norm:  # (NanoChat's: the final norm, weightless, on the embeddings too)
            h = self.model.norm(h)
        norm = self.model._modules.get("embed_layernorm")  # (BLOOM's own norm of the embeddings)
        if norm is not None:
            h = norm(h)
        m = self.config.embedding_multiplier  # Granite's
        return h if m == 1 else h * m

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of the KV caches the engines make for this model: the model's own dtype unless set
        (``model.kv_dtype = torch.bfloat16``; ``None`` resets it). A cache in another dtype stores each
        layer's keys and values rounded to it, and the attention over it runs in it: the queries are rounded
        to the cache's dtype, ``tk.verify_attention`` runs on them and the cache (float32 accumulation), and
        its output is cast back to the model's dtype. A 16-bit cache halves a float32 model's KV bytes
        (docs/model.md, "KV cache dtype"). Any cache works with any model dtype; this only picks the one
        the engines allocate. Copies of the model (``int8_copy``, ``gguf_copy``, ``layer_skip``) keep the
        value it has when they are made."""
        return self._kv_dtype or self.dtype

    @kv_dtype.setter
    def kv_dtype(self, dtype) -> None:
        if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"kv_dtype must be torch.float32, torch.float16, torch.bfloat16 or None, got {dtype!r}")
        self._kv_dtype = dtype

    @property
    def rope_scale(self) -> float:
        """The factor on RoPE's cos and sin (YaRN's attention factor; 1.0 otherwise)."""
        return rope_attention_scale(self.config)

    # ---- forward
    def _hidden(self, input_ids, cache=None, tree_parents=None, counts=None, query_index=None, query_valid=None,
                tap=None, graph: bool = True, rows=None):
        """The residual stream after the layers, ``[B, T, H]``; with ``rows`` (a ragged step's real tokens, flat
        indices into ``[B, T]``; ``counts`` their count per row) the stream of those rows, ``[1, N, H]``."""
        B, T = input_ids.shape
        dsa = self.config.dsa
        if cache is None and dsa is not None and any(dsa.shared) and T > dsa.topk:
            # GLM-5's shared layers read the previous layer's choice of keys, which a full cache keeps for them
            cache = _cache.FullCache(self.config, B, T, input_ids.device, self.kv_dtype, speculative_slack=T)
            graph = False
        if cache is None:
            return self._layers(input_ids, torch.arange(T, device=input_ids.device).expand(B, T))[0]
        step = cache.begin(T, tree_parents, counts, query_index, query_valid)
        if rows is not None:  # packed where the native stack runs the layers, else computed whole and packed
            h, step = self._layers(input_ids, step.positions, cache, step, rows=rows)
            cache.end(step)
            return h
        if graph and _graphs.enabled(self, cache, input_ids, tap):
            # the graphs go with their model and cache: their body must keep neither alive
            h = _graphs.run(self, cache, input_ids, step,
                            lambda ids, st, m=weakref.ref(self), c=weakref.ref(cache): m()._layers(
                                ids, st.positions, c(), st)[0])
        else:
            h, step = self._layers(input_ids, step.positions, cache, step, tree_parents, tap)
        cache.end(step)
        return h

    def _layers(self, input_ids, positions, cache=None, step=None, tree_parents=None, tap=None, rows=None):
        """The embedding and every decoder layer (``tap``'s extra tokens joining at its layer) -> (the
        residual stream, the step: a tap's wider one once its tokens joined); a cached forward's body,
        between ``cache.begin`` and ``cache.end``. ``rows`` (without a tap): a ragged step's real tokens; the
        stream returned is theirs, ``[1, N, H]`` (the native stack computes them packed; the layers one by one
        compute every token, then the real ones are taken)."""
        rows_long = None if cache is None else cache.rope_long
        ropes = self.rope_tables(positions, rows_long=rows_long)
        h = self.embed(input_ids, positions)
        layers = self.model.layers
        bounds = (0, len(layers)) if tap is None else (0, tap.layer, len(layers))
        for lo, hi in zip(bounds, bounds[1:]):
            if tap is not None and lo == tap.layer:
                extra = tap(h, tree_parents.parents if isinstance(tree_parents, TokenTree) else tree_parents)
                if extra is not None:  # extra tokens join the tree here: a wider step from this layer on
                    extra_h, parents = extra
                    h = torch.cat([h, extra_h.to(h.dtype)], 1)
                    step = cache.begin(h.shape[1], parents)
                    ropes = self.rope_tables(step.positions, rows_long=rows_long)
            if rows is not None:  # (a ragged step: one call or none, its stream packed)
                native = None if cache is None else _native_layers(layers, lo, hi, h, *ropes[lo], cache, step, rows,
                                                                   ropes)
                if native is None:
                    for i in range(lo, hi):
                        h = layers[i](h, *ropes[i], cache, step)
                    native = h.flatten(0, 1)[rows][None]
                h = native
                continue
            for a, b in _stack_runs(layers, lo, hi) if cache is not None else ((lo, hi),):
                native = None if cache is None else _native_layers(layers, a, b, h, *ropes[a], cache, step,
                                                                   ropes=ropes)
                if native is not None:
                    h = native
                    continue
                for i in range(a, b):
                    h = layers[i](h, *ropes[i], cache, step)
        return h, step

    def _logits(self, h):
        return self._head(self._final_norm(h))

    def _final_norm(self, h):
        """The final norm of the residual stream ``h``, in the model's dtype (Mamba-2's stream may be float32:
        ``residual_in_fp32``; its norm computes on it, the head reads it rounded, as transformers')."""
        z = self.model.norm(h)
        return z if z.dtype == self.dtype else z.to(self.dtype)

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 ``logits`` after Gemma 2's soft-capping (``config.final_softcap``; others: as they are)."""
        cap = self.config.final_softcap
        return logits if cap is None else softcap(logits, cap)

    def forward(self, input_ids: torch.Tensor, cache: _KVCache | None = None,
                tree_parents: torch.Tensor | TokenTree | None = None, widths: torch.Tensor | None = None
                ) -> torch.Tensor:
        """float32 logits ``[B, T, V]`` for ``input_ids`` ``[B, T]`` (see the class docstring). ``widths``: int
        ``[B]`` in ``[1, T]`` (with a cache, for a chain or a tree): row ``b``'s tokens past ``widths[b]`` are
        padding; the cache keeps ``widths[b]`` tokens of row ``b`` and the logits at the padding are 0. Every real
        token's logits are those of the same forward without padding (each row of a step is computed on its own;
        a tree's nodes come in topological order, so no real node descends from padding)."""
        self._check_forward(input_ids, cache, tree_parents, widths)
        if cache is None:
            with _bulk_linears():
                return self._logits(self._hidden(input_ids))
        with torch.no_grad():  # cache writes must never join an autograd graph (memory would grow)
            if widths is None:
                return self._logits(self._hidden(input_ids, cache, tree_parents))
            return self._ragged(input_ids, cache, widths, tree_parents)

    def _ragged(self, input_ids, cache, widths, tree_parents=None) -> torch.Tensor:
        """:meth:`forward` of a ragged step. On the CPU the real tokens run packed (``[1, N]`` through the
        native layer stack where it applies, and always through the final norm and the LM head); on other
        devices (finding the rows would be a host sync) the padding is computed and its logits zeroed."""
        B, T = input_ids.shape
        real = torch.arange(T, device=input_ids.device) < widths[:, None]  # [B, T]
        counts = widths.to(torch.int32)
        if not _packs_rows(input_ids.device):
            logits = self._logits(self._hidden(input_ids, cache, tree_parents, counts=counts))
            return logits.masked_fill_(~real[..., None], 0.0)
        rows = real.flatten().nonzero()[:, 0]
        if rows.numel() == B * T:  # nothing to skip
            return self._logits(self._hidden(input_ids, cache, tree_parents, counts=counts))
        packed = self._logits(self._hidden(input_ids, cache, tree_parents, counts=counts, rows=rows))[0]  # [N, V]
        return packed.new_zeros(B * T, packed.shape[-1]).index_copy_(0, rows, packed).view(B, T, -1)

    @torch.no_grad()
    def forward_hidden(self, input_ids: torch.Tensor, cache: _KVCache,
                       tree_parents: torch.Tensor | TokenTree | None = None, tap=None) -> torch.Tensor:
        """Like ``model(input_ids, cache=cache, tree_parents=...)`` but returns the LM head's input: the
        final-normed hidden states ``[B, T', H]`` in the model's dtype (``model.head(z)`` gives the
        logits). Draft heads read them (docs/heads.md).

        ``tap``: an object with ``tap.layer`` (``1 <= layer < num_hidden_layers``) called as
        ``tap(h, parents)`` with ``h`` ``[B, T, H]``, the residual stream entering decoder layer ``layer``,
        and the forward's ``parents`` tensor (``None`` for a chain). It returns ``None`` (it only reads
        ``h``) or ``(extra_h [B, E, H], parents [B, T+E])``: ``E`` extra tokens that enter the stream at
        that layer (their keys and values exist only in the layers from ``layer`` on), attached to the
        tree ``parents`` (nodes ``< T`` unchanged; ``T' = T+E``; a tensor, checked, or a
        :class:`~triforce.models.TokenTree`).
        The cache grows by ``T'``; the caller rolls the extra tokens back (``commit_path`` / ``rollback``).
        A :class:`~triforce.models.cache.StreamingCache` takes no tap (it may compact between layers'
        steps)."""
        from .cache import StreamingCache

        self._check_forward(input_ids, cache, tree_parents)
        if cache is None:
            raise ValueError("forward_hidden needs a cache")
        if tap is not None:
            n = self.config.num_hidden_layers
            if isinstance(cache, StreamingCache):
                raise TypeError("forward_hidden: a tap needs a FullCache or RetrievalCache, not a StreamingCache")
            if isinstance(tap.layer, bool) or not isinstance(tap.layer, int) or not 1 <= tap.layer < n:
                raise ValueError(f"tap.layer must be an int in [1, {n - 1}], got {tap.layer!r}")
        return self._final_norm(self._hidden(input_ids, cache, tree_parents, tap=tap))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        """float32 logits from final-normed hidden states ``z`` (the output of :meth:`forward_hidden`); Granite's
        divided by its ``logits_scaling`` (in the model's dtype, as transformers), Cohere 2's times its ``logit_scale``
        (likewise), Gemma 2's soft-capped; MiniCPM3's ``z`` divided by ``config.head_divisor`` first."""
        return self._head(z)

    def _head(self, z: torch.Tensor) -> torch.Tensor:  # (head's body: the forward's own, not replaced with head)
        project_out = self.model._modules.get("project_out")  # (opt-350m's: back to the embeddings' width)
        if project_out is not None:
            z = project_out(z)
        dense = self.model._modules.get("head_dense")  # (ModernBERT decoder's prediction head)
        if dense is not None:
            z = self.model._modules["head_norm"](_activated(self.config.head_transform, dense(z)))
        d = self.config.head_divisor  # (MiniCPM3's, before the head)
        logits = self.lm_head(z if d == 1 else z / d)
        scaling, scale = self.config.logits_scaling, self.config.logit_scale
        if scale != 1:  # Cohere 2's factor (Granite's: a divisor)
            logits = logits * scale
        return self._capped((logits if scaling == 1 else logits / scaling).float())

    def _check_forward(self, input_ids, cache, tree_parents, widths=None) -> None:
        self._check_ids("input_ids", input_ids)
        if widths is not None:
            B, T = input_ids.shape
            if cache is None:
                raise ValueError("widths: a ragged step appended to a cache (with cache=)")
            if not isinstance(widths, torch.Tensor) or widths.shape != (B,) or widths.dtype not in (torch.int32,
                                                                                                   torch.int64):
                raise ValueError(f"widths must be an int32/int64 tensor of shape [{B}] (one width per row)")
            if widths.device != input_ids.device:
                raise ValueError(f"widths is on {widths.device} but input_ids is on {input_ids.device}")
            # checked where reading it is no host sync
            if widths.device.type == "cpu" and B and not bool(((widths >= 1) & (widths <= T)).all()):
                raise ValueError(f"widths must be in [1, T={T}], got {widths.tolist()}")
        if cache is not None:
            self._check_cache(cache, input_ids.shape[0])
        if tree_parents is not None:
            if cache is None:
                raise ValueError("tree_parents needs a cache (the tree is appended after the cached prefix)")
            parents = tree_parents.parents if isinstance(tree_parents, TokenTree) else tree_parents
            if not isinstance(parents, torch.Tensor) or parents.shape != input_ids.shape \
                    or parents.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"tree_parents must be an int tensor of shape {list(input_ids.shape)} (like "
                                 f"input_ids) or a TokenTree of that shape")
            if parents.device != input_ids.device:
                raise ValueError(f"tree_parents is on {parents.device} but input_ids is on {input_ids.device}")
        elif cache is None and input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"input_ids has {input_ids.shape[1]} tokens, more than the model's context "
                             f"({self.config.max_position_embeddings})")

    @torch.no_grad()
    def prefill(self, prompts, cache: _KVCache, chunk_size: int = 256) -> torch.Tensor:
        """Run the prompts into an empty ``cache`` in chunks of ``chunk_size`` tokens (so attention scratch
        stays ``O(chunk_size x context)``) and return float32 logits ``[B, V]`` at each prompt's last token.

        ``prompts``: ``[B, P]`` int tensor, or a list of B non-empty 1-D int tensors / lists of different
        lengths (rows are padded internally; padding is never attended to and not counted in
        ``cache.lengths``). The cache is reset first.
        """
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        ids, lens = self._pad_prompts(prompts)
        self._check_cache(cache, ids.shape[0])
        # A FullCache's max_len is at most the model's context; a StreamingCache takes any length (its RoPE
        # positions are StreamingLLM positions within the cache).
        cap, ctx = getattr(cache, "max_len", None), self.config.max_position_embeddings
        longest = int(lens.max())
        if cap is not None and longest > ctx:
            raise ValueError(f"a prompt has {longest} tokens, more than the model's context ({ctx})")
        if cap is not None and longest > cap:
            raise ValueError(f"a prompt has {longest} tokens, more than the cache's max_len ({cap})")
        if isinstance(cache, RetrievalCache):
            raise TypeError("a RetrievalCache is built from a prefilled FullCache, not prefilled itself")
        cache.reset()
        B, P = ids.shape
        lens_dev = lens.to(self.device)
        last = torch.zeros(B, self.config.hidden_size, device=self.device, dtype=self.dtype)
        with _bulk_linears():
            for s in range(0, P, chunk_size):
                chunk = ids[:, s: s + chunk_size]
                T = chunk.shape[1]
                qi = lens_dev - 1 - s
                valid = (qi >= 0) & (qi < T)
                qi = qi.clamp(0, T - 1)
                counts = (lens_dev - s).clamp(0, T).to(torch.int32)
                h = self._hidden(chunk, cache, counts=counts, query_index=qi, query_valid=valid, graph=False)
                last = torch.where(valid[:, None], h[torch.arange(B, device=self.device), qi], last)
        return self._logits(last)

    # ---- validation
    def _check_ids(self, name, ids):
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be int64 (or int32), got {ids.dtype}")
        if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise ValueError(f"{name} must have shape [B, T] with B, T >= 1, got {list(ids.shape)}")
        if ids.device != self.device:
            raise ValueError(f"{name} is on {ids.device} but the model is on {self.device}")
        # the range where reading it is free (the CPU; on a GPU the embedding asserts)
        if _cache.check_values(ids):
            V = self.config.vocab_size
            if bool(((ids < 0) | (ids >= V)).any()):
                bad = ids[(ids < 0) | (ids >= V)]
                raise ValueError(f"{name} holds token ids outside [0, vocab_size={V}): {bad[:5].tolist()}")

    def _check_cache(self, cache, B):
        if not isinstance(cache, _KVCache):
            raise TypeError(f"cache must be a FullCache, StreamingCache or RetrievalCache, got {type(cache).__name__}")
        if cache.batch_size != B:
            raise ValueError(f"batch of {B} sequences but the cache was built for batch_size={cache.batch_size}")
        if cache.device != self.device:
            raise ValueError(f"cache is on {cache.device}, the model on {self.device}")
        c = cache.config
        if (c.num_hidden_layers, c.kv_heads_per_layer, c.head_dim) != (
                self.config.num_hidden_layers, self.config.kv_heads_per_layer, self.config.head_dim):
            raise ValueError("cache was built for a different model config (layers / KV heads / head_dim)")

    def _pad_prompts(self, prompts):
        V = self.config.vocab_size
        if isinstance(prompts, torch.Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"prompts must be [B, P] or a list of 1-D sequences, got shape {list(prompts.shape)}")
            rows = list(prompts)
        elif isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
            rows = [torch.as_tensor(p) for p in prompts]
        else:
            raise TypeError(f"prompts must be a [B, P] tensor or a list of 1-D sequences, got {type(prompts).__name__}")
        if not rows:
            raise ValueError("prompts is empty (no sequences)")
        for i, r in enumerate(rows):
            if r.dim() != 1:
                raise ValueError(f"prompts[{i}] must be 1-D, got shape {list(r.shape)}")
            if r.numel() == 0:
                raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
            if r.dtype not in (torch.int64, torch.int32):
                raise TypeError(f"prompts[{i}] must hold integer token ids, got {r.dtype}")
        lens = torch.tensor([r.numel() for r in rows], dtype=torch.int64)
        ids = torch.zeros(len(rows), int(lens.max()), dtype=torch.int64)
        for i, r in enumerate(rows):
            ids[i, : r.numel()] = r.cpu()
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= V:
            raise ValueError(f"prompts hold token ids outside [0, vocab_size={V})")
        return ids.to(self.device), lens

    # ---- drafts, loading
    def layer_skip(self, k: int) -> "Llama":
        """A draft that runs the first ``k`` layers, then the final norm and head; weights are shared."""
        n = self.config.num_hidden_layers
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
            raise ValueError(f"k must be an int in [1, {n}], got {k!r}")
        draft = Llama.__new__(Llama)
        nn.Module.__init__(draft)
        extra = dict(self.config.extra)
        # per-layer lists (attention kinds, NoPE layers, GLM-4.7-Flash's dense / sparse MLPs, Granite SWA's RoPE
        # bases): the first k
        for key in ("layer_types", "no_rope_layers", "mlp_layer_types", "layer_rope_theta",
                    "num_attention_heads_per_layer", "layers_block_type"):
            if isinstance(extra.get(key), list):
                extra[key] = extra[key][:k]
        for key in ("mlp_only_layers", "full_attn_idxs", "attn_layer_indices"):  # (layer indices: Qwen3-MoE's dense
            if isinstance(extra.get(key), list):  # layers, LFM2's and Bamba's attention layers)
                extra[key] = [i for i in extra[key] if i < k]
        for key in ("num_dense_layers",):  # (a count of leading layers: AFMoE's, LFM2-MoE's dense ones)
            if isinstance(extra.get(key), int) and extra[key] > k:
                extra[key] = k
        if self.config.model_type == "gpt_neo":  # (its attention kinds, as [[kinds, repeats]]: the first k)
            from .config import _gpt_neo_layers
            kinds = _gpt_neo_layers(self.config)[:k]
            extra["attention_types"], extra["attention_layers"] = [[kinds, 1]], kinds
        draft.config = self.config.replace(num_hidden_layers=k, extra=extra)
        draft.model = LlamaModel.__new__(LlamaModel)
        nn.Module.__init__(draft.model)
        draft.model.embed_tokens = self.model.embed_tokens
        for name in ("embed_positions", "project_in", "project_out", "embed_layernorm", "head_dense", "head_norm"):
            # (GPT-2's learned positions, opt-350m's projections, BLOOM's norm of the embeddings, ModernBERT
            # decoder's prediction head)
            if name in self.model._modules:
                setattr(draft.model, name, self.model._modules[name])
        draft.model.layers = nn.ModuleList(self.model.layers[:k])
        draft.model.norm = self.model.norm
        draft.lm_head = self.lm_head
        draft.register_buffer("inv_freq", self.inv_freq, persistent=False)
        draft.register_buffer("inv_freq_local", self.inv_freq_local, persistent=False)
        draft.register_buffer("inv_freq_long", self.inv_freq_long, persistent=False)
        draft._kv_dtype = self._kv_dtype
        return draft

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device=None, dtype=None, cache_dir=None) -> "Llama":
        """Load a Hugging Face directory (``config.json`` + ``*.safetensors``) or a GGUF file (dequantised
        with the ``gguf`` package; the converted weights are cached under ``cache_dir``, default
        ``~/.cache/triforce``, so the next load is fast; ``cache_dir=False`` disables caching)."""
        from .loading import load_pretrained
        return load_pretrained(path, device=device, dtype=dtype, cache_dir=cache_dir)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` + ``model.safetensors`` (Hugging Face layout)."""
        from .loading import save_pretrained
        save_pretrained(self, directory)
