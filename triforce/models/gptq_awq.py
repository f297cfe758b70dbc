"""GPTQ and AWQ checkpoints (``quantization_config`` ``{"quant_method": "gptq", ...}`` as AutoGPTQ, GPTQModel and
optimum write it; ``{"quant_method": "awq", ...}`` as AutoAWQ writes it, GEMM layout): each quantised linear layer's
packed integer weights, zero points and scales dequantised on loading to the layer's ``weight``.

A layer ``P`` is quantised where the checkpoint holds ``P.qweight``; the others' weights are read as they are (the
configs' lists of modules left in float only say which). The weight is what the formats' reference code computes
(auto_gptq's ``QuantLinear`` on PyTorch, AutoAWQ's ``dequantize_gemm``): ``(q - z) * s`` in the scales' dtype (float16
in their checkpoints: the exact product rounded once), then the model's dtype. Checked bit for bit against those
libraries' own packing and dequantisation (tests/test_gptq_awq.py, scripts/gptq_awq_fixtures.py).

- **GPTQ** (``bits`` 2, 4 or 8): ``qweight`` int32 ``[in * bits / 32, out]``, each word ``32 / bits`` input rows of
  one column, the first in the low bits; ``qzeros`` int32 ``[groups, out * bits / 32]``, packed along the output the
  same way; ``scales`` ``[groups, out]``; ``g_idx`` int32 ``[in]``, each input row's group (act-order checkpoints,
  ``desc_act``, permute them; without the tensor, row ``i``'s group is ``i // group_size``). The "gptq" (v1)
  checkpoint format stores each zero minus 1: the zero is the stored value plus 1 (as auto_gptq, exllama and vLLM
  read it: a stored ``2^bits - 1`` is a zero of ``2^bits``); "gptq_v2" stores it as it is.
- **AWQ** (``bits`` 4, ``version`` "gemm", ``zero_point`` true): ``qweight`` int32 ``[in, out / 8]`` and ``qzeros``
  ``[in / group_size, out / 8]``, each word 8 output columns in AWQ's order (column
  ``8 j + [0, 2, 4, 6, 1, 3, 5, 7][k]`` in bits ``4 k``); ``scales`` ``[in / group_size, out]``.
"""
from __future__ import annotations

from pathlib import Path

import torch

# quantization_config keys: what is read, and the labels that never change a weight (how the checkpoint was made,
# which runtime kernels to use, which modules were left in float: the tensors say which are quantised)
_GPTQ_READ = {"quant_method", "bits", "group_size", "desc_act", "sym", "checkpoint_format", "format"}
_GPTQ_LABELS = {
    "damp_percent", "damp_auto_increment", "true_sequential", "static_groups", "model_name_or_path",
    "model_file_base_name", "use_exllama", "exllama_config", "max_input_length", "cache_block_outputs", "dataset",
    "tokenizer", "batch_size", "pad_token_id", "use_cuda_fp16", "module_name_preceding_first_block",
    "block_name_to_quantize", "modules_in_block_to_quantize", "backend", "meta", "quantizer", "lm_head", "mse",
    "modules_to_not_convert", "disable_exllama", "use_marlin", "pack_dtype", "dynamic", "is_marlin_format", "v2",
    "v2_alpha", "act_group_aware", "hyb_act", "adapter", "rotation", "offload_to_disk", "offload_to_disk_path",
    "pack_impl", "fail_safe", "device", "sym_asym", "model_seqlen"}
_AWQ_READ = {"quant_method", "bits", "group_size", "zero_point", "version"}
_AWQ_LABELS = {"modules_to_not_convert", "backend", "do_fuse", "fuse_max_seq_len", "modules_to_fuse",
               "exllama_config", "quant_type"}
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output column of each nibble of a word (its k-th: bits 4 k)
_PARTS = (".qweight", ".qzeros", ".scales", ".g_idx")


def _problem(q: dict) -> str | None:
    """Why ``quantization_config`` ``q`` (a GPTQ or AWQ one) is not read here, or None."""
    method = q.get("quant_method")
    read, labels = (_GPTQ_READ, _GPTQ_LABELS) if method == "gptq" else (_AWQ_READ, _AWQ_LABELS)
    unknown = sorted(set(q) - read - labels)
    if unknown:
        return f"key {unknown[0]!r} is not understood"
    group = q.get("group_size", 128)
    if not (isinstance(group, int) and not isinstance(group, bool) and (group > 0 or group == -1 and method == "gptq")):
        return f"group_size = {group!r} (a positive int{', or -1' if method == 'gptq' else ''})"
    if method == "gptq":
        if q.get("bits") not in (2, 4, 8):
            return f"bits = {q.get('bits')!r} (2, 4 or 8 read here; 3's packing across words is not)"
        fmt = q.get("checkpoint_format", q.get("format", "gptq"))
        if fmt not in ("gptq", "gptq_v2"):
            return f"checkpoint_format = {fmt!r} (its tensors are laid out for another kernel: 'gptq' or 'gptq_v2')"
        for key in ("desc_act", "sym"):
            if q.get(key, False) not in (True, False):
                return f"{key} = {q[key]!r} (a bool)"
        if q.get("is_marlin_format") or q.get("dynamic") or q.get("pack_dtype", "int32") not in ("int32",
                                                                                                  "torch.int32"):
            bad = next(k for k in ("is_marlin_format", "dynamic", "pack_dtype")
                       if q.get(k) and not (k == "pack_dtype" and q[k] in ("int32", "torch.int32")))
            return f"{bad} = {q[bad]!r} (Marlin's layout, per-module settings and other packing words are not read)"
        return None
    if q.get("bits", 4) != 4:
        return f"bits = {q.get('bits')!r} (AWQ's GEMM layout: 4)"
    if str(q.get("version", "gemm")).lower() != "gemm":
        return f"version = {q.get('version')!r} (the GEMM layout is read; GEMV's and the others' are not)"
    if q.get("zero_point", True) is not True:
        return f"zero_point = {q.get('zero_point')!r} (with zero points)"
    return None


def gptq_awq_config(q) -> bool:
    """Whether ``quantization_config`` ``q`` is a GPTQ or AWQ one read here (:func:`check_config` says why not)."""
    return isinstance(q, dict) and q.get("quant_method") in ("gptq", "awq") and _problem(q) is None


def check_config(q) -> None:
    """Raise ``ValueError`` naming what of a GPTQ / AWQ ``quantization_config`` is not read."""
    if isinstance(q, dict) and q.get("quant_method") in ("gptq", "awq") and (why := _problem(q)) is not None:
        raise ValueError(f"quantization_config ({q['quant_method']}): {why}")


def _unpack(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 ``words`` unpacked along ``dim``: each word's ``32 / bits`` values, the first from the low bits, in
    place of the word (int16)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    w = words.unsqueeze(dim + 1) >> shifts.view([-1 if i == dim + 1 else 1 for i in range(words.dim() + 1)])
    w = (w & (2 ** bits - 1)).to(torch.int16)
    return w.flatten(dim, dim + 1)


def dequantize_gptq(qweight, qzeros, scales, g_idx, bits: int, v2: bool = False, name: str = "weight"):
    """A GPTQ layer's weight ``[out, in]`` in ``scales``' dtype (module docstring); ``g_idx`` None: groups in order."""
    pack = 32 // bits
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32 or qweight.dim() != 2 or qzeros.dim() != 2:
        raise ValueError(f"GPTQ {name}: qweight and qzeros must be 2-D int32, got {qweight.dtype} "
                         f"{list(qweight.shape)} and {qzeros.dtype} {list(qzeros.shape)}")
    n_in, n_out = qweight.shape[0] * pack, qweight.shape[1]
    groups = scales.shape[0] if scales.dim() == 2 else -1
    if scales.shape != (groups, n_out) or qzeros.shape != (groups, n_out // pack) or n_out % pack:
        raise ValueError(f"GPTQ {name}: qweight {list(qweight.shape)} ({bits} bits: {n_in} inputs, {n_out} outputs) "
                         f"needs scales [groups, {n_out}] and qzeros [groups, {n_out // pack}], got "
                         f"{list(scales.shape)} and {list(qzeros.shape)}")
    if g_idx is None:
        g_idx = torch.arange(n_in) // -(-n_in // groups)
    if g_idx.shape != (n_in,) or g_idx.is_floating_point() or (g_idx.numel() and not (
            0 <= int(g_idx.min()) and int(g_idx.max()) < groups)):
        raise ValueError(f"GPTQ {name}: g_idx must be {n_in} ints in [0, {groups}), got {g_idx.dtype} "
                         f"{list(g_idx.shape)}")
    q = _unpack(qweight, bits, 0)  # [in, out]
    z = _unpack(qzeros, bits, 1) + (0 if v2 else 1)  # [groups, out]
    g = g_idx.long()
    w = (q - z[g]).float() * scales[g].float()  # exact: a small int times a 16-bit float
    return w.to(scales.dtype).t()


def dequantize_awq(qweight, qzeros, scales, group_size: int, name: str = "weight"):
    """An AWQ layer's weight ``[out, in]`` in ``scales``' dtype (module docstring)."""
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32 or qweight.dim() != 2 or qzeros.dim() != 2:
        raise ValueError(f"AWQ {name}: qweight and qzeros must be 2-D int32, got {qweight.dtype} "
                         f"{list(qweight.shape)} and {qzeros.dtype} {list(qzeros.shape)}")
    n_in, n_out = qweight.shape[0], qweight.shape[1] * 8
    groups = -(-n_in // group_size)
    if scales.shape != (groups, n_out) or qzeros.shape != (groups, n_out // 8):
        raise ValueError(f"AWQ {name}: qweight {list(qweight.shape)} ({n_in} inputs, {n_out} outputs, groups of "
                         f"{group_size}) needs scales [{groups}, {n_out}] and qzeros [{groups}, {n_out // 8}], got "
                         f"{list(scales.shape)} and {list(qzeros.shape)}")
    order = torch.tensor(_AWQ_ORDER).argsort()  # column 8 j + c is nibble order.argsort()[c] of word j

    def columns(words):
        v = _unpack(words, 4, 1).view(words.shape[0], -1, 8)
        return v[:, :, order].flatten(1)

    g = torch.arange(n_in) // group_size
    w = (columns(qweight) - columns(qzeros)[g]).float() * scales[g].float()
    return w.to(scales.dtype).t()


class GptqAwqWeights:
    """A GPTQ / AWQ checkpoint's quantised layers, collected file by file (a layer's tensors may lie in different
    shards) and dequantised once all are read (:meth:`finish`)."""

    def __init__(self, q: dict, dtype):
        check_config(q)
        self.q, self.dtype, self.pending = q, dtype, {}

    def take(self, part: dict) -> dict:
        """``part`` (one file's tensors) without the quantised layers' packed tensors, which are kept."""
        for name in [n for n in part if n.endswith(_PARTS)]:
            self.pending[name] = part.pop(name)
        return part

    def finish(self, directory: Path) -> dict:
        """The quantised layers' weights (``P.weight``, the model's dtype); a packed tensor left without its layer's
        others raises naming it."""
        out = {}
        for prefix in sorted(n[:-len(".qweight")] for n in self.pending if n.endswith(".qweight")):
            t = {p: self.pending.pop(prefix + p, None) for p in _PARTS}
            missing = [p for p in _PARTS[1:3] if t[p] is None]
            if missing:
                raise ValueError(f"{prefix}.qweight in {str(directory)!r} has no {prefix}{missing[0]} beside it")
            if self.q["quant_method"] == "gptq":
                if t[".g_idx"] is None and self.q.get("desc_act"):  # (act-order: the groups are not in order)
                    raise ValueError(f"{prefix}.qweight in {str(directory)!r} has no {prefix}.g_idx beside it "
                                     "(desc_act: its input rows' groups)")
                v2 = self.q.get("checkpoint_format", self.q.get("format", "gptq")) == "gptq_v2"
                w = dequantize_gptq(t[".qweight"], t[".qzeros"], t[".scales"], t[".g_idx"], self.q["bits"], v2,
                                    prefix)
            else:
                if t[".g_idx"] is not None:
                    raise ValueError(f"{prefix}.g_idx in {str(directory)!r}: AWQ layers have none")
                w = dequantize_awq(t[".qweight"], t[".qzeros"], t[".scales"], self.q["group_size"], prefix)
            out[prefix + ".weight"] = w.to(self.dtype)
        if self.pending:
            name = next(iter(self.pending))
            raise ValueError(f"{name} in {str(directory)!r} has no {name.rsplit('.', 1)[0]}.qweight beside it")
        return out
