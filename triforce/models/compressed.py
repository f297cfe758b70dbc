"""compressed-tensors checkpoints (``quantization_config`` ``{"quant_method": "compressed-tensors", ...}``: what
llm-compressor writes and vLLM reads; Red Hat's / Neural Magic's FP8, INT8, W4A16 and NVFP4 models, Kimi K2
Thinking's INT4 experts) read as the float model they dequantise to.

Each quantised module's ``weight`` (float8 or int8 codes), or ``weight_packed`` (int32 words of 1- to 8-bit
integers, or uint8 bytes of two FP4 codes), becomes ``(code - zero point) * scale`` in float32, rounded once to the
model's dtype: the scale one per tensor, row (``channel``), group of columns of a row (``group``,
``tensor_group``), or block (``block``), as the module's config group says; NVFP4's FP8 group scales divided by the
tensor's ``weight_global_scale`` first, as compressed-tensors computes them. The activations' quantisation (input
scales, the KV cache's) belongs to a quantised matmul: the dequantised model, which this is (as transformers'
``CompressedTensorsConfig(dequantize=True)``), has none, and their tensors are dropped.
"""

import math
import re
import sys
from dataclasses import dataclass

import torch

__all__ = ["Scheme", "compressed_config", "schemes", "unpack_int32", "dequantize_compressed", "CompressedWeights"]

METHOD = "compressed-tensors"
_PACKED_FORMATS = {"pack-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized"}
_FORMATS = {"float-quantized", "int-quantized", "naive-quantized", "dense"} | _PACKED_FORMATS
_STRATEGIES = {"tensor", "channel", "group", "tensor_group", "block"}
# a compressed-tensors config's keys that only describe the checkpoint (or the activations, not read here)
_LABELS = {"quant_method", "format", "config_groups", "ignore", "quantization_status", "global_compression_ratio",
           "version", "kv_cache_scheme", "sparsity_config", "transform_config", "moe_sparsity_config", "provider",
           "dequantize", "run_compressed", "use_optimized_inference"}
_ARGS = {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic", "actorder",
         "observer", "observer_kwargs", "scale_dtype", "zp_dtype"}
# tensors of a quantised module besides its codes: read with them
_PARTS = ("weight_scale", "weight_zero_point", "weight_shape", "weight_global_scale", "weight_g_idx")
# the activations' and the KV cache's quantisation parameters: not part of the dequantised model
_DROPPED = ("input_scale", "input_zero_point", "input_global_scale", "output_scale", "output_zero_point",
            "k_scale", "v_scale", "q_scale", "k_zero_point", "v_zero_point")


@dataclass(frozen=True)
class Scheme:
    """How one config group's weights are stored: ``kind`` int or float, ``bits``, ``strategy`` (tensor, channel,
    group, tensor_group, block), ``group`` columns (group strategies), ``block`` (rows, columns), ``symmetric``
    (else a zero point), ``format`` (the compressor: float-quantized, int-quantized, naive-quantized,
    pack-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized or dense), ``g_idx`` (activation-ordered groups:
    each column's group in ``weight_g_idx``), ``targets`` (module names, ``re:`` patterns, or class names)."""
    kind: str
    bits: int
    strategy: str
    group: int | None
    block: tuple | None
    symmetric: bool
    format: str
    g_idx: bool
    targets: tuple
    name: str

    @property
    def packed(self) -> bool:
        return self.format in _PACKED_FORMATS

    def grid(self, rows: int, cols: int) -> tuple:
        """(rows, columns) of the weight that one scale covers."""
        if self.strategy == "tensor":
            return rows, cols
        if self.strategy == "channel":
            return 1, cols
        if self.strategy == "block":
            return self.block
        return 1, self.group


def _bad(msg: str):
    raise ValueError(f"compressed-tensors quantization_config: {msg}")


def _scheme(name: str, group, top_format: str) -> Scheme | None:
    """The :class:`Scheme` of config group ``name`` (None: it quantises no weights); raises naming what this
    does not read."""
    if not isinstance(group, dict) or not set(group) <= {"targets", "weights", "input_activations",
                                                         "output_activations", "format"}:
        _bad(f"config group {name!r} must be a dict of targets, weights, input_activations, output_activations "
             f"and format, got {group!r}")
    targets = group.get("targets")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        _bad(f"config group {name!r}: targets must be a list of module names, 're:' patterns or class names, "
             f"got {targets!r}")
    for key in ("input_activations", "output_activations"):  # (an activation's rounding: not in the model)
        if group.get(key) is not None and not isinstance(group[key], dict):
            _bad(f"config group {name!r}: {key} must be null or a dict, got {group[key]!r}")
    fmt = group.get("format") or top_format
    w = group.get("weights")
    if w is None:
        return None
    if not isinstance(w, dict) or not set(w) <= _ARGS:
        _bad(f"config group {name!r}: weights must be a dict of {sorted(_ARGS)}, got {w!r}")
    kind, bits = w.get("type", "int"), w.get("num_bits", 8)
    kind = kind.lower() if isinstance(kind, str) else kind
    strategy, size, block = w.get("strategy"), w.get("group_size"), w.get("block_structure")
    strategy = strategy.lower() if isinstance(strategy, str) else strategy
    if strategy is None:  # (QuantizationArgs' inference)
        strategy = "tensor" if size is None else "channel" if size == -1 else "group"
    symmetric, actorder = w.get("symmetric", True), w.get("actorder")
    where = f"config group {name!r}'s weights"
    if isinstance(block, str):  # ("128x128", an older spelling)
        block = [int(b) for b in block.split("x")] if re.fullmatch(r"\d+x\d+", block) else block
    if fmt not in _FORMATS:
        _bad(f"{where}: format {fmt!r} is not read (read: {sorted(_FORMATS)}; sparse and other formats are not)")
    if strategy not in _STRATEGIES:
        _bad(f"{where}: strategy {strategy!r} is not read (read: {sorted(_STRATEGIES)})")
    if strategy in ("group", "tensor_group") and not (isinstance(size, int) and size > 0):
        _bad(f"{where}: strategy {strategy} needs a group_size > 0, got {size!r}")
    if strategy == "block" and not (isinstance(block, list) and len(block) == 2
                                    and all(isinstance(b, int) and b > 0 for b in block)):
        _bad(f"{where}: strategy block needs a block_structure [rows, columns], got {block!r}")
    if w.get("dynamic", False) not in (False, None):
        _bad(f"{where}: dynamic {w['dynamic']!r}: a weight quantised on the fly is not stored quantised")
    if actorder not in (None, False, "weight", "static", "group", "dynamic"):
        _bad(f"{where}: actorder {actorder!r} is not read")
    if not isinstance(symmetric, bool):
        _bad(f"{where}: symmetric must be true or false, got {symmetric!r}")
    ok = {"float-quantized": kind == "float" and bits == 8,
          "int-quantized": kind == "int" and bits == 8,
          "naive-quantized": bits == 8 and kind in ("int", "float"),
          "pack-quantized": kind == "int" and isinstance(bits, int) and 1 <= bits <= 8,
          "nvfp4-pack-quantized": kind == "float" and bits == 4 and strategy == "tensor_group",
          "mxfp4-pack-quantized": kind == "float" and bits == 4 and strategy == "group" and size == 32,
          "dense": True}[fmt]
    if not ok:
        _bad(f"{where}: type {kind!r} num_bits {bits!r} strategy {strategy!r} is not what format {fmt!r} stores "
             "(float-quantized: float 8; int-quantized: int 8; naive-quantized: 8 bits; pack-quantized: int 1-8; "
             "nvfp4-pack-quantized: float 4, tensor_group; mxfp4-pack-quantized: float 4, group 32)")
    if kind == "float" and not symmetric:
        _bad(f"{where}: asymmetric float weights are not read")
    if strategy == "tensor_group" and fmt != "nvfp4-pack-quantized":
        _bad(f"{where}: strategy tensor_group is NVFP4's (format nvfp4-pack-quantized), not {fmt!r}'s")
    g_idx = actorder in ("group", "dynamic") and strategy == "group"
    return Scheme(kind, bits, strategy, size if strategy in ("group", "tensor_group") else None,
                  tuple(block) if strategy == "block" else None, symmetric, fmt, g_idx, tuple(targets), name)


def schemes(q: dict) -> list:
    """The weight :class:`Scheme` of each config group of compressed-tensors ``quantization_config`` ``q``;
    raises naming what this does not read."""
    unknown = set(q) - _LABELS
    if unknown:
        _bad(f"keys {sorted(unknown)} are not understood (they could change the model's weights)")
    top = q.get("format")
    if top is not None and top not in _FORMATS | {"mixed-precision"}:
        _bad(f"format {top!r} is not read (read: {sorted(_FORMATS | {'mixed-precision'})})")
    status = q.get("quantization_status", "compressed")
    if status != "compressed":
        _bad(f"quantization_status {status!r}: only 'compressed' checkpoints are read (an earlier status stores "
             "float weights that compressed-tensors quantises in its forward)")
    sparse = q.get("sparsity_config")
    if sparse and (not isinstance(sparse, dict) or sparse.get("format", "dense") != "dense"):
        _bad(f"sparsity_config {sparse!r}: sparse weights are not read")
    for key in ("transform_config", "moe_sparsity_config"):
        if q.get(key):
            _bad(f"{key} {q[key]!r} is not read (it changes the weights or which experts run)")
    kv = q.get("kv_cache_scheme")
    if kv is not None and not isinstance(kv, dict):
        _bad(f"kv_cache_scheme must be null or a dict, got {kv!r}")
    ignore = q.get("ignore", [])
    if ignore is not None and not (isinstance(ignore, list) and all(isinstance(i, str) for i in ignore)):
        _bad(f"ignore must be a list of module names or 're:' patterns, got {ignore!r}")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        _bad(f"config_groups must be a non-empty dict, got {groups!r}")
    if top == "mixed-precision" and any(not (isinstance(g, dict) and g.get("format")) for g in groups.values()):
        _bad("format mixed-precision: every config group must name its format")
    return [s for name, g in groups.items() if (s := _scheme(name, g, top or "dense")) is not None]


def compressed_config(v) -> bool:
    """Whether ``quantization_config`` ``v`` is a compressed-tensors one this reads (raises naming what it does
    not read when ``v`` is compressed-tensors' but unread)."""
    if not (isinstance(v, dict) and v.get("quant_method") == METHOD):
        return False
    schemes(v)
    return True


def _matches(name: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target


def _is_class(target: str) -> bool:  # ("Linear", "Embedding", "LlamaAttention": a module class, not a name)
    return not target.startswith("re:") and "." not in target and target[:1].isupper()


def scheme_of(all_schemes: list, module: str) -> Scheme:
    """The scheme of quantised ``module`` (a checkpoint name without ``.weight``): the only one, or the one config
    group whose targets name it (by name or ``re:`` pattern), else the one that targets module classes ("Linear":
    each quantised tensor is a linear layer's, or an embedding's)."""
    if len(all_schemes) == 1:  # (its targets may name the modules as an image + text wrapper does)
        return all_schemes[0]
    named = [s for s in all_schemes if any(_matches(module, t) for t in s.targets)]
    if not named:
        named = [s for s in all_schemes if any(_is_class(t) for t in s.targets)]
    if len(named) != 1:
        _bad(f"module {module} is stored quantised, and " + (
            f"config groups {[s.name for s in named]} all target it: which one stored it is ambiguous" if named
            else "no config group targets it"))
    return named[0]


def unpack_int32(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """int8 ``[..., cols]`` of the ``bits``-bit integers (1-8) packed in int32 ``packed`` ``[..., words]``:
    compressed-tensors' dense packing, each row a little-endian bit stream (value ``i`` at bits ``i * bits`` up,
    crossing into the next word where it must), stored plus ``2 ** (bits - 1)``."""
    if packed.dtype != torch.int32 or not 1 <= bits <= 8:
        raise ValueError(f"packed weights must be int32 words of 1- to 8-bit values, got {packed.dtype}, {bits}")
    words, lead = packed.shape[-1], packed.shape[:-1]
    if words != -(-cols * bits // 32):
        raise ValueError(f"{cols} values of {bits} bits take {-(-cols * bits // 32)} int32 words a row, "
                         f"got {words}")
    if bits in (2, 4, 8) and sys.byteorder == "little":  # (whole values a byte: the bytes' bit fields in order)
        b = packed.contiguous().view(torch.uint8)
        if bits == 8:
            v = (b ^ 0x80).view(torch.int8)  # (b - 128)
        else:
            per, mask = 8 // bits, (1 << bits) - 1
            parts = [b & mask] + [(b >> (bits * i)) & mask for i in range(1, per - 1)] + [b >> (bits * (per - 1))]
            v = torch.stack(parts, -1).view(torch.int8) - (1 << (bits - 1))
        return v.reshape(*lead, -1)[..., :cols]
    flat, out = packed.reshape(math.prod(lead), words), torch.empty(math.prod(lead), cols, dtype=torch.int8)
    start = torch.arange(cols) * bits
    word, shift, mask = start // 32, start % 32, (1 << bits) - 1
    step = max(1, (1 << 20) // max(1, cols))  # rows a chunk: ~1M values at a time
    for r in range(0, flat.shape[0], step):
        w = flat[r:r + step].long() & 0xFFFFFFFF
        w = torch.cat([w, w.new_zeros(w.shape[0], 1)], 1)  # (the last value's bits never cross past it)
        v = (((w[:, word + 1] << 32) | w[:, word]) >> shift) & mask
        out[r:r + step] = v - (1 << (bits - 1))
    return out.reshape(*lead, cols)


_FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def fp4_values(packed: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """``dtype`` ``[..., 2 * bytes]`` of FP4 (e2m1) codes packed two a byte (uint8 ``[..., bytes]``): value ``2j``
    in byte ``j``'s low nibble, ``2j + 1`` in its high one."""
    lut, byte = torch.tensor(_FP4, dtype=dtype), torch.arange(256)
    pairs = torch.stack([lut[byte & 15], lut[byte >> 4]], 1)  # byte -> (its low nibble's value, its high one's)
    return pairs[packed.long()].flatten(-2)


def _scales(scale: torch.Tensor, name: str) -> torch.Tensor:
    if scale.dtype == torch.uint8:  # (UE8M0 exponents: MXFP4)
        return (scale.float() - 127).exp2()
    if not scale.is_floating_point():
        raise ValueError(f"{name}.weight_scale must be floating point (or uint8 exponents), got {scale.dtype}")
    return scale.float()


def _checked_grid(lead: tuple, R: int, C: int, s: torch.Tensor, zero, grid: tuple, g_idx, name: str,
                  stored: tuple) -> tuple:
    """``(scales, zero points or None, grid)`` of a weight ``[*lead, R, C]`` shaped ``[*lead, rows, columns]``
    (one per tensor or a row's ``[..., R]`` widened), the grid a single scale's ``(R, C)``; raises unless they
    are one per ``grid`` block (or, with ``g_idx``, cover its groups)."""

    def shaped(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == 1:  # (one per tensor)
            return t.reshape([1] * (len(lead) + 2)).expand(*lead, 1, 1)
        return t.unsqueeze(-1) if t.dim() == len(lead) + 1 else t

    s = shaped(s)
    z = None if zero is None else shaped(zero).float()
    if s.shape[-2:] == (1, 1):
        grid = (R, C)
    want = (-(-R // grid[0]), -(-C // grid[1]) if g_idx is None else int(g_idx.max()) + 1 if C else 0)
    if s.dim() != len(lead) + 2 or s.shape[:-2] != lead or s.shape[-2] != want[0] or (
            s.shape[-1] != want[1] if g_idx is None else s.shape[-1] < want[1] or g_idx.shape != (C,)):
        raise ValueError(f"{name}.weight_scale has shape {list(stored)}: weight {name} {[*lead, R, C]} "
                         f"takes one scale per {grid[0]} x {grid[1]} block, {[*lead, *want]}"
                         + ("" if g_idx is None else f" (its weight_g_idx {list(g_idx.shape)}: {C} groups)"))
    if z is not None and z.shape != s.shape:
        raise ValueError(f"{name}.weight_zero_point has shape {list(zero.shape)}, its scales {list(s.shape)}")
    return s, z, grid


def dequantize_compressed(codes: torch.Tensor, scale: torch.Tensor, grid: tuple, dtype=torch.float32,
                          zero: torch.Tensor | None = None, g_idx: torch.Tensor | None = None,
                          name: str = "weight", decode=None, cols: int | None = None) -> torch.Tensor:
    """``dtype`` ``(codes - zero) * scale`` of a weight's ``codes`` (``[..., R, C]``, any dtype whose values
    float32 holds) and its ``scale`` (float32, 16-bit, float8, or UE8M0 exponents), each in float32, rounded
    once: ``scale[..., r // grid[0], c // grid[1]]`` for weight ``[r, c]`` (a partial last block its own; a
    single scale the whole tensor's; a row's scales ``[..., R]`` or ``[..., R, 1]``), or with ``g_idx`` (int
    ``[C]``) ``scale[..., r // grid[0], g_idx[c]]``. ``zero``: the zero points (integers), one per scale or one
    in all. ``decode(rows, dtype)``: the values ``[..., rows, cols]`` in ``dtype`` of rows of ``codes`` stored
    packed (``codes`` ``[..., R, words]``), decoded a few rows at a time."""
    R = codes.shape[-2]
    C = codes.shape[-1] if cols is None else cols
    decode = decode or (lambda rows, to: rows.to(to))
    lead = codes.shape[:-2]
    s, z, grid = _checked_grid(lead, R, C, _scales(scale, name), zero, grid, g_idx, name, scale.shape)
    # 16-bit scales into that dtype: the products computed in it (torch rounds a 16-bit product of float32's
    # once: the same bits, every operand exact there, the codes of at most 8 significant bits), in half the bytes
    work = dtype if dtype in (torch.bfloat16, torch.float16) and scale.dtype == dtype else torch.float32
    s, z = s.to(work), None if z is None else z.to(work)
    if g_idx is not None:  # (each column's group looked up: the scales and zero points widened to a column each)
        s, z, grid = s[..., g_idx.long()], None if z is None else z[..., g_idx.long()], (grid[0], 1)
    G, g = s.shape[-1], grid[1]
    out = torch.empty(*lead, R, C, dtype=dtype)
    step = grid[0] * max(1, (1 << 22) // max(1, grid[0] * C))  # rows a chunk: ~4M float32 products at a time
    for r in range(0, R, step):
        rows = decode(codes[..., r:r + step, :], work)
        n = rows.shape[-2]
        if G * g != C:  # (a partial last block of columns: padded, then cut)
            rows = torch.nn.functional.pad(rows, (0, G * g - C))
        rows = rows.view(*lead, n, G, g)
        blocks = slice(r // grid[0], -(-(r + n) // grid[0]))
        sr = s[..., blocks, :].repeat_interleave(grid[0], -2)[..., :n, :, None] if grid[0] > 1 \
            else s[..., r:r + n, :, None]
        if z is not None:
            zr = z[..., blocks, :].repeat_interleave(grid[0], -2)[..., :n, :, None] if grid[0] > 1 \
                else z[..., r:r + n, :, None]
            rows = rows - zr
        out[..., r:r + step, :] = (rows * sr).view(*lead, n, G * g)[..., :C]
    return out


class CompressedWeights:
    """A compressed-tensors checkpoint's quantised weights dequantised file by file (the interface of
    loading's FP8 reader): each module's codes once every tensor its scheme stores is read (they may lie in
    different shards); the activations' and KV cache's parameters dropped."""

    def __init__(self, q: dict, dtype, kept: dict | None = None):
        self.schemes, self.dtype, self.pending, self.kept = schemes(q), dtype, {}, kept

    @staticmethod
    def _split(name: str):
        """(module, part) of a quantised tensor's name, or None for any other tensor."""
        module, _, part = name.rpartition(".")
        return (module, part) if part in ("weight", "weight_packed") + _PARTS else None

    def dequantize(self, part: dict) -> dict:
        for name in list(part):
            split = self._split(name)
            if name.rpartition(".")[2] in _DROPPED:
                del part[name]
            elif split is not None and split[1] in _PARTS[1:] and self._unread(*split):
                del part[name]
            elif split is not None and (split[1] != "weight" or not part[name].is_floating_point()
                                        or part[name].dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):
                self.pending.setdefault(split[0], {})[split[1]] = part.pop(name)
        for module in list(self.pending):
            got = self.pending[module]
            if "weight" not in got and "weight_packed" not in got:
                continue
            s = scheme_of(self.schemes, module)
            need = self._needs(s, got, module)
            if need <= set(got):
                t = self.pending.pop(module)
                own = None if self.kept is None else self._own(s, t, module)
                if own is not None:
                    self.kept[module + ".weight"] = own
                else:
                    part[module + ".weight"] = self._dequantize(s, t, module)
        return part

    def _unread(self, module: str, part: str) -> bool:
        """Whether ``part`` of ``module`` is not its scheme's (dropped, wherever it lies: a symmetric weight's
        zero points, a trivial ``weight_g_idx`` of an older export without activation order, ...)."""
        s = scheme_of(self.schemes, module)
        return {"weight_zero_point": s.symmetric, "weight_shape": s.format != "pack-quantized",
                "weight_global_scale": s.format != "nvfp4-pack-quantized", "weight_g_idx": not s.g_idx}[part]

    def _own(self, s: Scheme, t: dict, module: str):
        """``(codes, scales, zero points)`` of a 2-D weight that a CPU kernel runs on its own codes, bitwise the
        dequantised float32 weight: FP8 (float8_e4m3fn codes, float32 scales per chunk of 64 columns:
        ``Fp8Linear``; column blocks whole chunks; no zero points), or integers of at most 8 bits (7 with zero
        points: the codes minus their zero points still int8) and FP4 (int8 codes twice the FP4 values, half
        the scales: the same products): int8 codes with float32 scales and zero points (None: none) per 32
        columns, NVFP4's per 16 (``Q8Linear``, or ``Q4Linear``'s blocks: ``quant.q4_1_of``; column blocks whole
        groups); None for the rest (activation-ordered groups, stacked weights: dequantised)."""
        if s.g_idx or (not s.symmetric and s.bits > 7):
            return None
        codes, scale, zero, _, decode, cols, grid = self._parts(s, t, module)
        N, K = codes.shape[-2], codes.shape[-1] if cols is None else cols
        fp8 = s.kind == "float" and s.bits == 8
        chunk = 64 if fp8 else 16 if s.format == "nvfp4-pack-quantized" else 32
        if codes.dim() != 2 or not (grid[1] % chunk == 0 or grid[1] >= K):
            return None
        if fp8:
            _checked_grid((), N, K, scale, None, grid, None, module, scale.shape)
        else:  # (code - zero) * 1 in float32: exact integers, the scales' and zero points' shapes checked
            unit = decode if s.kind == "int" else (lambda rows, to: decode(rows, to) * 2)
            codes = dequantize_compressed(codes, torch.ones(scale.shape), grid, torch.float32, zero, None, module,
                                          unit, cols).to(torch.int8)
        if s.format == "mxfp4-pack-quantized":
            scale = (scale.float() - 128).exp2()  # (halved: the codes doubled)
        elif s.format == "nvfp4-pack-quantized":  # (its float32 scale, over the global one, halved: exact unless
            scale, whole = scale / 2, scale  # it underflows)
            if not torch.equal(scale * 2, whole):
                return None
        else:
            scale = _scales(scale, module)
        s2 = scale.reshape(1, 1) if scale.numel() == 1 else scale.reshape(scale.shape[0], -1)
        rb, cb = (N, K) if s2.shape == (1, 1) else grid
        def per_chunk(t: torch.Tensor) -> torch.Tensor:  # [N, ceil(K / chunk)]: each row's chunks' values
            return t.repeat_interleave(rb, 0)[:N][:, torch.arange(0, K, chunk) // cb].contiguous()

        z = None if zero is None else per_chunk(_checked_grid((), N, K, s2, zero, grid, None, module, scale.shape)[1])
        return codes, per_chunk(s2), z

    def _needs(self, s: Scheme, got: dict, module: str) -> set:
        code = "weight_packed" if "weight_packed" in got else "weight"
        need = {code, "weight_scale"}
        if s.format == "dense":
            _bad(f"module {module} is stored quantised ({code} {got[code].dtype}) but its config group "
                 f"{s.name!r} has format dense")
        if s.packed != (code == "weight_packed"):
            _bad(f"module {module} stores {code} ({got[code].dtype}) but its config group {s.name!r} has "
                 f"format {s.format!r}")
        if s.format == "pack-quantized":
            need.add("weight_shape")
        if s.format == "nvfp4-pack-quantized":
            need.add("weight_global_scale")
        if not s.symmetric:
            need.add("weight_zero_point")
        if s.g_idx:
            need.add("weight_g_idx")
        return need

    def _dequantize(self, s: Scheme, t: dict, module: str) -> torch.Tensor:
        codes, scale, zero, g_idx, decode, cols, grid = self._parts(s, t, module)
        return dequantize_compressed(codes, scale, grid, self.dtype, zero, g_idx, module, decode, cols)

    def _parts(self, s: Scheme, t: dict, module: str) -> tuple:
        """``(codes, scale, zero, g_idx, decode, cols, grid)``: :func:`dequantize_compressed`'s arguments for a
        quantised module's tensors ``t``, checked against its scheme ``s``."""
        name = module + ".weight"
        scale, zero, g_idx = t["weight_scale"], t.get("weight_zero_point"), t.get("weight_g_idx")
        decode, cols = None, None
        if s.format == "pack-quantized":
            shape, codes = t["weight_shape"].tolist(), t["weight_packed"]
            if len(shape) < 2 or shape[:-1] != list(codes.shape[:-1]):
                _bad(f"{module}.weight_shape {shape} is not the shape of {module}.weight_packed "
                     f"{list(codes.shape)} unpacked")
            cols = shape[-1]
            decode = lambda rows, to: unpack_int32(rows, s.bits, cols).to(to)  # noqa: E731
            if zero is not None and zero.dtype == torch.int32 and s.strategy in ("group", "channel"):
                # (asymmetric group / channel zero points: packed along the rows)
                zero = unpack_int32(zero.transpose(-1, -2).contiguous(), s.bits, shape[-2]).transpose(-1, -2)
        elif s.packed:  # FP4: NVFP4 (FP8 group scales / the tensor's global scale) or MXFP4 (UE8M0 exponents)
            codes = t["weight_packed"]
            if codes.dtype != torch.uint8:
                _bad(f"{module}.weight_packed must be uint8 (two FP4 codes a byte), got {codes.dtype}")
            decode, cols = fp4_values, 2 * codes.shape[-1]
            if s.format == "nvfp4-pack-quantized":
                scale = scale.float() / t["weight_global_scale"].float()
        else:
            codes = t["weight"]
            want = (torch.float8_e4m3fn,) if s.kind == "float" else (torch.int8,)
            if codes.dtype not in want:
                _bad(f"{name} is {codes.dtype}, but its config group {s.name!r} stores {s.kind} {s.bits}-bit "
                     f"weights as {want[0]}")
        if codes.dim() < 2:
            _bad(f"{name} has shape {list(codes.shape)}: a quantised weight has at least 2 dims")
        if zero is not None and (zero.is_floating_point() or zero.dtype == torch.bool):
            _bad(f"{module}.weight_zero_point must be integers, got {zero.dtype}")
        grid = s.grid(codes.shape[-2], codes.shape[-1] if cols is None else cols)
        return codes, scale, zero, g_idx, decode or (lambda rows, to: rows.to(to)), cols, grid

    def check_done(self, directory, sd: dict) -> None:
        """Raises naming a quantised module whose tensors are not all in the checkpoint."""
        for module, got in self.pending.items():
            code = next((c for c in ("weight_packed", "weight") if c in got), None)
            weight = sd.get(module + ".weight")
            if code is None and weight is not None and weight.is_floating_point() \
                    and scheme_of(self.schemes, module).format == "dense":
                continue  # (a dense module's scales: its weight is stored float)
            if code is None:
                raise ValueError(f"{module} in {str(directory)!r} has {sorted(got)} but no quantised weight "
                                 f"({module}.weight or .weight_packed)"
                                 + (f": {module}.weight is {sd[module + '.weight'].dtype}"
                                    if module + ".weight" in sd else ""))
            missing = self._needs(scheme_of(self.schemes, module), got, module) - set(got)
            raise ValueError(f"quantised weight {module}.{code} in {str(directory)!r} has no "
                             f"{', '.join(f'{module}.{m}' for m in sorted(missing))} beside it")
