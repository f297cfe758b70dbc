"""Weight loading: Hugging Face directories (config.json + safetensors) and GGUF files.

GGUF tensors are dequantised to float32 with the ``gguf`` package. llama.cpp's converter permutes the
rows of ``attn_q`` / ``attn_k`` so that RoPE rotates interleaved pairs (x0, x1), (x2, x3), ...; our
RoPE (like HF's) rotates the half-split pairs (x_i, x_{i + D/2}), so we apply the inverse permutation,
exactly as ``transformers``' GGUF loader does.

The conversion cache: a converted GGUF is a Hugging Face directory ``gguf-<sha256>-v<reader version>``
under ``~/.cache/triforce`` (``$XDG_CACHE_HOME/triforce``, ``$TRIFORCE_CACHE_DIR`` or ``cache_dir``), so
the second load skips the dequantisation. The key is the file's content (sha256 of all its bytes,
computed once per file and remembered under ``sha256/`` keyed by path, size, mtime, ctime and inode, so
later loads only ``stat`` it) plus the reader version: copies of the same GGUF in several virtualenvs
share one entry. The cache is bounded: after each write the least recently used entries are removed
until the total is under ``$TRIFORCE_CACHE_MAX_GB`` (default 4; the entry in use is always kept).
Files are written into a temporary directory and moved in one by one (``os.replace``), the file that
marks an entry complete last, so readers never see a partial file and the weights and the tokenizer
(:func:`triforce.models.hub.load_tokenizer`) can be written into the same entry in either order.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from .compressed import CompressedWeights, compressed_config
from .gptq_awq import GptqAwqWeights, gptq_awq_config
from .config import (_COHERES, _DELTA_FAMILIES, _HUNYUANS, FAMILIES, WRAPPERS, LlamaConfig, _is_int, falcon_layout,
                     fp8_config, mllama_cross_layers, sinusoidal_table)

_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def default_cache_dir() -> Path:
    if os.environ.get("TRIFORCE_CACHE_DIR"):
        return Path(os.environ["TRIFORCE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triforce"


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def load_pretrained(path, device=None, dtype=None, cache_dir=None):
    """See :meth:`triforce.models.Llama.from_pretrained`."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no model at {str(path)!r} (expected a Hugging Face directory or a .gguf file)")
    if path.is_dir():
        return _load_hf_dir(path, device, dtype)
    if _is_gguf(path):
        if cache_dir is False:
            config, sd = read_gguf(path)
            return _build(config, sd, device, dtype)
        max_cache_bytes()  # a bad setting raises before any work, not after the conversion is written
        cached = gguf_cache_path(path, cache_dir)
        if (cached / "model.safetensors").exists():
            touch_cache_entry(cached)
            try:
                return _build(*_read_hf_dir(cached), device, dtype)
            except (ValueError, OSError) as e:  # a damaged entry (disk, an edit): the GGUF is still here
                warnings.warn(f"the cached conversion {str(cached)!r} of {path.name} is unreadable ({e}); "
                              "converting the GGUF again")
                shutil.rmtree(cached, ignore_errors=True)
        config, sd = read_gguf(path)
        try:
            _write_hf_dir(cached, config, sd)
        except OSError as e:  # a read-only or full cache only costs the conversion next time
            warnings.warn(f"cannot cache the converted {path.name} in {str(cached.parent)!r}: {e}")
            return _build(config, sd, device, dtype)
        evict_cache(cached)
        return _load_hf_dir(cached, device, dtype)
    raise ValueError(f"{str(path)!r} is neither a directory nor a GGUF file")


# Part of the cache key: bump it when read_gguf's output changes, so that no conversion by an older reader
# is reused (2: metadata that read_gguf used to ignore, e.g. a yarn rope.scaling.type, now raises).
_GGUF_CACHE_VERSION = 2
_ENTRY = re.compile(r"gguf-[0-9a-f]{32}-v\d+")
# Entries of the earlier path+mtime key (<stem>-<16 hex>), still evicted like the others.
_OLD_ENTRY = re.compile(r".+-[0-9a-f]{16}")
_ENTRY_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_meta.json"}
_MAX_HASH_MEMOS = 256
_STALE_TMP_S = 3600  # a temporary directory this old belongs to a killed writer (a write takes seconds)


def cache_root(cache_dir=None) -> Path:
    return Path(cache_dir or default_cache_dir())


def gguf_cache_path(path: Path, cache_dir=None) -> Path:
    """The cache entry (a directory, maybe not written yet) for the GGUF file ``path``."""
    root = cache_root(cache_dir)
    return root / f"gguf-{file_sha256(Path(path), root)[:32]}-v{_GGUF_CACHE_VERSION}"


def file_sha256(path: Path, root: Path) -> str:
    """sha256 of the file's bytes, hashed once (~1 GB/s: 0.1 s for SmolLM2's 98 MB, seconds for a 7B
    GGUF) and remembered in ``root/sha256/`` under the path, size, mtime, ctime and inode: any write to
    the file changes its ctime, so a changed file is hashed again."""
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}|{st.st_dev}"
    memo = root / "sha256" / hashlib.sha256(ident.encode()).hexdigest()[:32]
    try:
        digest = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", digest):
            return digest
    except OSError:
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.tmp{os.getpid()}")
        tmp.write_text(digest)
        os.replace(tmp, memo)
        memos = sorted(memo.parent.iterdir(), key=_mtime)
        for old in memos[: max(0, len(memos) - _MAX_HASH_MEMOS)]:
            old.unlink(missing_ok=True)
    except OSError:  # a read-only cache only costs the hashing next time
        pass
    return digest


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def touch_cache_entry(entry: Path) -> None:
    """Mark ``entry`` used now (its mtime orders the least-recently-used eviction)."""
    try:
        os.utime(entry)
    except OSError:
        pass


def max_cache_bytes() -> int:
    """``$TRIFORCE_CACHE_MAX_GB`` in bytes (default 4 GB; ``inf``: no limit)."""
    raw = os.environ.get("TRIFORCE_CACHE_MAX_GB", "4")
    try:
        gb = float(raw)
    except ValueError:
        gb = -1.0
    if not gb >= 0:
        raise ValueError(f"TRIFORCE_CACHE_MAX_GB must be a number of GB >= 0 (or inf), got {raw!r}")
    return sys.maxsize if gb * 1e9 >= sys.maxsize else int(gb * 1e9)


def evict_cache(keep: Path) -> None:
    """Remove the least recently used entries beside ``keep`` until all entries together take at most
    ``$TRIFORCE_CACHE_MAX_GB``; ``keep`` (the entry just written or used) stays whatever its size, and
    so does anything in the cache folder that is not an entry. Temporary directories of killed writers
    (older than an hour) go too."""
    limit, root = max_cache_bytes(), keep.parent
    entries, total = [], 0
    try:
        children = list(root.iterdir())
    except OSError:
        return
    for d in children:
        base, tmp, _ = d.name.partition(".tmp")
        if d.is_symlink() or not d.is_dir() or not (_ENTRY.fullmatch(base) or _OLD_ENTRY.fullmatch(base)):
            continue  # not ours
        try:
            files = {f.name: f.stat().st_size for f in d.iterdir()}
        except OSError:
            continue
        if not _ENTRY.fullmatch(base) and not files.keys() <= _ENTRY_FILES:
            continue  # <something>-<16 hex> that the older cache did not write
        if tmp:
            if time.time() - _mtime(d) > _STALE_TMP_S:
                shutil.rmtree(d, ignore_errors=True)
            continue
        size = sum(files.values())
        total += size
        if d != keep:
            entries.append((_mtime(d), size, d))
    for _, size, d in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        shutil.rmtree(d, ignore_errors=True)
        total -= size


def publish(directory: Path, write, last: str) -> None:
    """``write(tmp)`` fills a temporary sibling directory; its files are then moved into ``directory``
    (created if needed) one by one with ``os.replace``, ``last`` last. Each file appears whole, files
    already in ``directory`` that ``write`` did not write stay, and ``last`` can mark the set complete."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".tmp", dir=directory.parent))
    try:
        write(tmp)
        directory.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == last):
            os.replace(f, directory / f.name)
        touch_cache_entry(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- Hugging Face layout
def _load_hf_dir(directory: Path, device, dtype):
    return _build(*_read_hf_dir(directory, dtype), device, dtype)


def _read_hf_dir(directory: Path, dtype=None, kept: dict | None = None):
    """-> (config, state dict) of a Hugging Face directory (errors name what is missing or unreadable); quantised
    weights (FP8: :func:`dequantize_fp8`; compressed-tensors': :mod:`.compressed`) dequantised to ``dtype``
    (default float32) as each file is read, except, with ``kept`` (a dict, filled), those a CPU kernel runs on
    their own codes: an FP8 checkpoint's 2-D float8_e4m3fn weights whose column blocks ``rowwise_linear_fp8``
    takes, as ``name -> (weight, its scales, (block rows, block columns))``; a compressed-tensors checkpoint's
    as ``name -> (codes, scales and zero points per row and chunk)`` (``CompressedWeights._own``)."""
    cfg = directory / "config.json"
    if not cfg.exists():
        raise FileNotFoundError(f"{str(directory)!r} has no config.json (not a Hugging Face model directory)")
    try:
        raw = json.loads(cfg.read_text())
        config = LlamaConfig.from_dict(raw)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(cfg)!r} is not a valid Llama config: {e}") from None
    rename = _language_model_name if raw.get("model_type") in WRAPPERS else None
    qwen3_vl_moe = raw.get("model_type") == "qwen3_vl_moe"
    if raw.get("model_type") == "mllama":  # (its self-attention layers renumbered, the cross-attention ones dropped)
        rename = _mllama_names(config, raw.get("text_config") or {})
    q = config.extra.get("quantization_config")
    sd, origin = {}, {}
    fp8 = (CompressedWeights(q, dtype or torch.float32, kept) if compressed_config(q)
           else _Fp8Weights(config, dtype or torch.float32, kept))
    packed = GptqAwqWeights(q, dtype or torch.float32) if gptq_awq_config(q) else None
    split = FAMILIES[config.model_type].fused_projections
    files = _weight_files(directory)
    for f in files:
        part = fp8.dequantize(_read_weights(f, rename))
        if packed is not None:  # (its layers dequantised once every file is read: finish)
            part = packed.take(part)
        if qwen3_vl_moe:
            part = _qwen3_vl_moe_experts(config, part)
        if raw.get("model_type") == "mllama":
            part = _mllama_embeddings(config, part)
        if split:  # one file's at a time: its fused tensors freed as they are split
            part = _split_projections(config, part)
        for k in part:
            if k in origin:
                raise ValueError(f"weight {k} is in both {origin[k].name!r} and {f.name!r} in {str(directory)!r}: "
                                 "which one is the model's is ambiguous; remove the other file")
            origin[k] = f
        sd.update(part)
    fp8.check_done(directory, sd)
    if packed is not None:
        part = packed.finish(directory)
        if qwen3_vl_moe:
            part = _qwen3_vl_moe_experts(config, part)
        for k in part:  # (fused projections are split in _build, as any)
            if k in sd:
                raise ValueError(f"weight {k} in {str(directory)!r} is both quantised ({k[:-len('weight')]}qweight) "
                                 "and in float: which one is the model's is ambiguous")
        sd.update(part)
    return config, sd


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_SCALE_INV = "_scale_inv"  # FP8 checkpoints: weight X's scales are X_scale_inv (a multiplier, despite the name)
_ACTIVATION_SCALE = ".activation_scale"  # (static activations: their FP8 rounding belongs to an FP8 matmul)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block=None, dtype=torch.float32,
                   name: str = "weight") -> torch.Tensor:
    """``dtype`` ``q * scale`` of an FP8 weight ``q`` (float8 ``[..., R, C]``) and its ``*_scale_inv``
    ``scale``: one per tensor (a single element), or one per ``block = (b0, b1)`` block of the last two dims
    (``[..., ceil(R / b0), ceil(C / b1)]``; weight ``[r, c]`` takes ``scale[r // b0, c // b1]``, a partial last
    block its own, as DeepSeek's ``weight_dequant`` has it; a single scale serves the whole tensor); each product
    in float32, rounded once to ``dtype``, as transformers' ``Fp8Dequantize`` (which refuses partial blocks)
    computes it. ``scale``: float32, 16-bit, or UE8M0 exponents (uint8 ``e`` or float8_e8m0fnu: ``2 ** (e - 127)``)."""
    if q.dtype not in _FLOAT8 or q.dim() < 2:
        raise ValueError(f"FP8 weight {name} must be float8 (e4m3fn or e5m2) with at least 2 dims, got {q.dtype} "
                         f"{list(q.shape)}")
    s = fp8_scales(scale, name)
    R, C = q.shape[-2:]
    if s.numel() == 1:  # one per tensor (or one block's, the same)
        return (q.float() * s.reshape(())).to(dtype)
    check_fp8_grid(q, s, block, name)
    out = torch.empty(q.shape, dtype=dtype)
    step = block[0] * max(1, (1 << 22) // max(1, block[0] * C))  # rows a chunk: ~4M float32 products at a time
    for r in range(0, R, step):
        rows = q[..., r:r + step, :].float()
        part = s[..., r // block[0]:-(-(r + rows.shape[-2]) // block[0]), :]
        part = part.repeat_interleave(block[0], -2)[..., :rows.shape[-2], :].repeat_interleave(block[1], -1)
        out[..., r:r + step, :] = rows * part[..., :C]
    return out


def fp8_scales(scale: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """float32 values of an FP8 weight's scales: float32 or 16-bit ones, or UE8M0 exponents (uint8 ``e`` or
    float8_e8m0fnu: ``2 ** (e - 127)``)."""
    if scale.dtype == torch.uint8:
        return (scale.float() - 127).exp2()
    if scale.is_floating_point():
        return scale.float()
    raise ValueError(f"{name}{_SCALE_INV} must be floating point or uint8 (UE8M0 exponents), got {scale.dtype}")


def check_fp8_grid(q: torch.Tensor, scale: torch.Tensor, block, name: str = "weight") -> None:
    """Raises unless ``scale`` is one scale, or one per ``block`` of FP8 weight ``q``'s last two dims."""
    if scale.numel() == 1:
        return
    R, C = q.shape[-2:]
    grid = None if block is None else (*q.shape[:-2], -(-R // block[0]), -(-C // block[1]))
    if grid is None or tuple(scale.shape) != grid:
        raise ValueError(f"{name}{_SCALE_INV} has shape {list(scale.shape)}: FP8 weight {name} {list(q.shape)} takes "
                         + ("one scale (quantization_config weight_block_size null)" if block is None else
                            f"one per {block[0]} x {block[1]} block, {list(grid)}"))


class _Fp8Weights:
    """A checkpoint's FP8 weights (``quantization_config`` fp8: config.fp8_config) dequantised file by file: each
    float8 tensor once its ``*_scale_inv`` is read too (the two may lie in different shards); static
    activations' ``*.activation_scale`` dropped. Without an fp8 quantization_config a float8 tensor or a scale
    raises: its block size is not known (and a float8 weight read without its scale is silently wrong)."""

    def __init__(self, config: LlamaConfig, dtype, kept: dict | None = None):
        q = config.extra.get("quantization_config")
        self.on = fp8_config(q)
        block = q.get("weight_block_size", (128, 128)) if self.on else None  # (FineGrainedFP8Config's default)
        self.block = None if block is None else tuple(block)
        self.static = self.on and q.get("activation_scheme", "dynamic") == "static"
        self.dtype, self.pending, self.kept = dtype, {}, kept

    def _keeps(self, q: torch.Tensor, scale: torch.Tensor) -> bool:
        """Whether ``q`` and its scales go to ``kept`` as they are: a 2-D e4m3fn weight with float scales (or UE8M0
        exponents: float32 powers of two) whose column blocks are whole chunks of rowwise_linear_fp8's 64 (or one
        block a row, a scale per tensor)."""
        if self.kept is None or q.dtype != torch.float8_e4m3fn or q.dim() != 2 or not (
                scale.is_floating_point() or scale.dtype == torch.uint8):
            return False
        if self.block is None:  # (one scale a tensor: its columns one block)
            return scale.numel() == 1
        return self.block[1] % 64 == 0 or self.block[1] >= q.shape[1]

    def dequantize(self, part: dict) -> dict:
        for name in list(part):
            t = part[name]
            if t.dtype in _FLOAT8 or name.endswith(_SCALE_INV):
                self.pending[name] = part.pop(name)
            elif self.static and name.endswith(_ACTIVATION_SCALE):
                del part[name]
        if self.pending and not self.on:
            name = next(iter(self.pending))
            raise ValueError(f"weight {name} is FP8 ({self.pending[name].dtype}) but config.json has no "
                             "quantization_config of quant_method 'fp8' saying its blocks")
        for name in [k for k in self.pending if not k.endswith(_SCALE_INV)]:
            if name + _SCALE_INV in self.pending:
                q, scale = self.pending.pop(name), self.pending.pop(name + _SCALE_INV)
                if self._keeps(q, scale):
                    check_fp8_grid(q, scale, self.block, name)
                    self.kept[name] = (q, scale, self.block)
                else:
                    part[name] = dequantize_fp8(q, scale, self.block, self.dtype, name)
        return part

    def check_done(self, directory: Path, sd: dict) -> None:
        """Raises naming a float8 weight or scales left without the other (``sd``: the weights read)."""
        for name, t in self.pending.items():
            weight = name[:-len(_SCALE_INV)]
            raise ValueError(f"{name} in {str(directory)!r} has no "
                             + (f"{name}{_SCALE_INV} beside it (the scales of FP8 weight {name}, {t.dtype})"
                                if not name.endswith(_SCALE_INV) else f"float8 weight {weight} beside it"
                                + (f" ({weight} is {sd[weight].dtype})" if weight in sd else "")))


# Phi-3's and GLM-4's fused projections (config.Family.fused_projections): rows [q; k; v] of qkv_proj, [gate; up] of
# gate_up_proj; GPT-NeoX's query_key_value (weight and bias): per head, rows [q_h; k_h; v_h] (_NEOX_QKV: interleaved)
_QKV = tuple(f".self_attn.{p}_proj.weight" for p in "qkv")
_FUSED = ((".self_attn.qkv_proj.weight", _QKV),
          (".mlp.gate_up_proj.weight", (".mlp.gate_proj.weight", ".mlp.up_proj.weight")),
          (".attention.query_key_value.weight", _QKV),
          (".attention.query_key_value.bias", tuple(p.replace(".weight", ".bias") for p in _QKV)),
          (".mlp.gate_up_proj.bias", (".mlp.gate_proj.bias", ".mlp.up_proj.bias")))  # (ModernBERT decoder's Wi's)
_NEOX_QKV = (".attention.query_key_value.weight", ".attention.query_key_value.bias")
_PERSIMMON_QKV = (".self_attn.query_key_value.", ".attention.query_key_value.")  # (Persimmon's name of GPT-NeoX's)
_MODERNBERT_WI = (".mlp.Wi.", ".mlp.gate_up_proj.")  # (ModernBERT decoder's MLP: rows [input; gate], act(input) * gate)
# ModernBERT decoder's checkpoint names -> the model's, in the order they are replaced (its head's dense and norm
# before decoder, its q/k/v after Wo), and the model's -> its (lm_head first: its prediction head is lm_head.*)
_MODERNBERT_NAMES = (("model.embeddings.tok_embeddings.", "model.embed_tokens."),
                     ("model.embeddings.norm.", "model.embed_layernorm."), ("model.final_norm.", "model.norm."),
                     (".attn_norm.", ".input_layernorm."), (".mlp_norm.", ".post_attention_layernorm."),
                     (".attn.Wo.", ".self_attn.o_proj."), (".attn.", ".self_attn."), (".mlp.Wo.", ".mlp.down_proj."),
                     ("lm_head.dense.", "model.head_dense."), ("lm_head.norm.", "model.head_norm."),
                     ("decoder.", "lm_head."))
_MODERNBERT_BACK = (("lm_head.", "decoder."), *((new, old) for old, new in _MODERNBERT_NAMES[:-1]
                                                if old != ".attn."), (".self_attn.", ".attn."))


def _fused_match(key: str):
    """``(fused suffix, part suffixes)`` of :data:`_FUSED` that ``key`` ends with, or None."""
    return next(((fused, parts) for fused, parts in _FUSED if key.endswith(fused)), None)


def neox_qkv_split(t: torch.Tensor, heads: int) -> list:
    """GPT-NeoX's ``query_key_value`` rows (``[heads * 3 * D, ...]``, per head ``[q_h; k_h; v_h]``) as the q, k and v
    projections' (each ``[heads * D, ...]``, copies)."""
    per = t.reshape(heads, 3, -1, *t.shape[1:])
    return [per[:, i].reshape(-1, *t.shape[1:]).clone() for i in range(3)]


def neox_qkv_join(parts, heads: int) -> torch.Tensor:
    """The inverse of :func:`neox_qkv_split`: q, k and v rows (``[heads * D, ...]`` each) interleaved per head."""
    q = parts[0]
    return torch.stack([p.reshape(heads, -1, *q.shape[1:]) for p in parts], 1).reshape(-1, *q.shape[1:])


def fused_parts(key: str) -> list | None:
    """The model's parameter names a checkpoint's fused tensor ``key`` splits into (Phi-3's), or None."""
    match = _fused_match(key)
    return None if match is None else [key[: -len(match[0])] + part for part in match[1]]


def _fused_rows(config: LlamaConfig, fused: str) -> tuple:
    D = config.head_dim
    if fused in (_FUSED[0][0], *_NEOX_QKV):
        return (config.num_attention_heads * D, config.num_key_value_heads * D, config.num_key_value_heads * D)
    return (config.intermediate_size,) * 2


def _split_projections(config: LlamaConfig, sd: dict) -> dict:
    """A Phi-3 checkpoint's fused projections as the separate ones of the model (each a row range, copied out:
    the parts must not share the fused tensor's storage, which saving and ``assign`` loading dislike); the
    names of separate ones pass as they are. Consumes ``sd`` (each fused tensor is dropped from it once split,
    so that a checkpoint read file by file never holds a fused tensor and its parts for long)."""
    out = {}
    for name in list(sd):
        t, match = sd.pop(name), _fused_match(name)
        if match is None:
            out[name] = t
            continue
        rows = _fused_rows(config, match[0])
        if t.dim() != (1 if match[0].endswith(".bias") else 2) or t.shape[0] != sum(rows):
            raise ValueError(f"weight {name} has shape {list(t.shape)}: the config implies {sum(rows)} rows "
                             f"({' + '.join(map(str, rows))})")
        pieces = (neox_qkv_split(t, config.num_attention_heads) if match[0] in _NEOX_QKV
                  else [piece.clone() for piece in t.split(rows)])
        out.update(zip(fused_parts(name), pieces))
    return out


def _join_projections(config: LlamaConfig, sd: dict) -> dict:
    """The inverse of :func:`_split_projections`, for saving a Phi-3 or GLM-4 model as its checkpoints hold it (the
    family's ``fused_projections``)."""
    out = dict(sd)
    joined = [(fused, parts) for fused, parts in _FUSED
              if fused.rsplit(".", 2)[-2] in FAMILIES[config.model_type].fused_projections]
    for name in list(sd):
        for fused, parts in joined:
            if name.endswith(parts[0]):
                stem = name[: -len(parts[0])]
                pieces = [out.pop(stem + part) for part in parts]
                out[stem + fused] = (neox_qkv_join(pieces, config.num_attention_heads) if fused in _NEOX_QKV
                                     else torch.cat(pieces))
    return out


# A mixture of experts' weights (LlamaConfig.experts): checkpoints name them as Qwen3-MoE's do, mlp.gate.weight and
# mlp.experts.{e}.{gate,up,down}_proj.weight, or as Mixtral's, block_sparse_moe.gate.weight and
# block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down); transformers 5's modules hold each layer's experts as
# two 3D tensors, mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I] (it saves the per-expert
# names). The model's experts hold gate and up as one mlp.experts.{e}.gate_up_proj.weight (rows [gate; up]).
_MIXTRAL_PROJECTIONS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_FROM_MIXTRAL = re.compile(r"(.*\.)block_sparse_moe\.(gate|experts\.\d+\.(w[123]))\.weight")
_TO_MIXTRAL = re.compile(r"(.*\.)mlp\.(gate|experts\.\d+\.(gate_proj|up_proj|down_proj))\.weight")
_STACKED_EXPERTS = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|up_proj|down_proj)")  # (up_proj: Nemotron 3's)
_EXPERT_PROJECTION = re.compile(r"(.*\.mlp\.experts\.\d+\.)(gate_proj|up_proj|gate_up_proj)\.weight")
# GraniteMoE's checkpoints: block_sparse_moe.router.layer.weight (the router), block_sparse_moe.input_linear.weight
# [E, 2I, H] (each expert's [gate; up]) and block_sparse_moe.output_linear.weight [E, H, I]; in transformers 5's
# modules block_sparse_moe.router.weight and block_sparse_moe.experts.gate_up_proj / down_proj. GraniteMoeShared's
# shared expert: shared_mlp.input_linear.weight [2S, H] ([gate; up]) and shared_mlp.output_linear.weight [H, S]
_GRANITE_MOE = {"router.layer.weight": "gate.weight", "router.weight": "gate.weight",
                "input_linear.weight": "experts.gate_up_proj", "output_linear.weight": "experts.down_proj",
                "experts.gate_up_proj": "experts.gate_up_proj", "experts.down_proj": "experts.down_proj"}
_GRANITE_MOE_NAME = re.compile(r"(.*\.)block_sparse_moe\.(.*)")
_GRANITE_SHARED = re.compile(r"(.*\.)shared_mlp\.(input|output)_linear\.weight")
_SHARED_EXPERT = re.compile(r"(.*\.)mlp\.shared_expert\.(gate|up|down)_proj\.weight")
_STACKED_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)\.weight")


def _granite_moe_names(sd: dict, inverse: bool = False, modules: bool = False) -> dict:
    """A GraniteMoE checkpoint's weights under the names :func:`_expert_names` reads (its stacked experts as
    transformers 5's), or with ``inverse`` the model's (per expert) back under the checkpoint's names, stacked; with
    ``modules`` under transformers 5's module names (Granite SWA's checkpoints: transformers converts none of its
    names, so they are the modules')."""
    out, stacks = {}, {}
    for name, t in sd.items():
        if not inverse:
            if (m := _GRANITE_SHARED.fullmatch(name)) is not None:  # the shared expert as the model's MLP
                parts = zip(("gate", "up"), t.chunk(2)) if m[2] == "input" else (("down", t),)
                out.update({f"{m[1]}mlp.shared_expert.{p}_proj.weight": w.clone() for p, w in parts})
                continue
            m = _GRANITE_MOE_NAME.fullmatch(name)
            out[f"{m[1]}mlp.{_GRANITE_MOE[m[2]]}" if m and m[2] in _GRANITE_MOE else name] = t
        elif (m := _STACKED_EXPERT.fullmatch(name)) is not None:
            stacks.setdefault((m[1], m[3]), {})[int(m[2])] = t
        elif (m := _SHARED_EXPERT.fullmatch(name)) is not None:
            if m[2] == "down":
                out[f"{m[1]}shared_mlp.output_linear.weight"] = t
            elif m[2] == "gate" and f"{m[1]}mlp.shared_expert.up_proj.weight" in sd:
                up = sd[f"{m[1]}mlp.shared_expert.up_proj.weight"]
                out[f"{m[1]}shared_mlp.input_linear.weight"] = torch.cat([t, up])
            elif f"{m[1]}mlp.shared_expert.gate_proj.weight" not in sd:
                out[name] = t  # a half without the other: reported as unexpected
        else:
            router = ".block_sparse_moe.router.weight" if modules else ".block_sparse_moe.router.layer.weight"
            out[re.sub(r"\.mlp\.gate\.weight$", router, name)] = t
    for (stem, kind), parts in stacks.items():
        linear = f"experts.{kind}" if modules else "input_linear.weight" if kind == "gate_up_proj" \
            else "output_linear.weight"
        out[f"{stem[:-len('mlp.experts')]}block_sparse_moe.{linear}"] = torch.stack(
            [parts[e] for e in range(len(parts))])
    return out


# GPT-OSS's checkpoints: mlp.router.weight / bias (the router), and each layer's experts stacked as transformers'
# GptOssExperts holds them: mlp.experts.gate_up_proj [E, H, 2I] (x @ W; the gate's and the up's columns interleaved,
# gate first), gate_up_proj_bias [E, 2I] (interleaved too), down_proj [E, I, H], down_proj_bias [E, H]; OpenAI's
# files hold the two weights in MXFP4 instead (quantization_config "mxfp4"): *_blocks [E, rows, K / 32, 16] (two
# 4-bit codes a byte, the low nibble first, each an index into _FP4_VALUES) and *_scales [E, rows, K / 32] (a
# power of two per 32 weights, 2 ** (s - 127)), rows the outputs: dequantised here exactly, as transformers does.
_GPT_OSS_EXPERTS = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?")
_GPT_OSS_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)\.(weight|bias)")
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bfloat16 ``[..., rows, 32 * G]`` of MXFP4 ``blocks`` uint8 ``[..., rows, G, 16]`` and ``scales`` uint8
    ``[..., rows, G]``: weight ``2j`` of a block is the code in its byte ``j``'s low nibble, ``2j + 1`` the high
    one's, each ``_FP4_VALUES[code] * 2 ** (scale - 127)``: transformers' float32 ``ldexp`` values, every one of
    which bfloat16 holds exactly (at most 2 significant bits, float32's exponent range and inf beyond it; its
    subnormals reach 2 ** -133), in half the memory."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape \
            or blocks.shape[-1] != 16:
        raise ValueError(f"MXFP4 blocks must be uint8 [..., G, 16] and scales uint8 [..., G] alike, got "
                         f"{blocks.dtype} {list(blocks.shape)} and {scales.dtype} {list(scales.shape)}")
    lut = torch.tensor(_FP4_VALUES, dtype=torch.bfloat16)
    codes = mxfp4_codes(blocks).long()
    # times 2 ** (s - 127) as two powers of two of at most 2 ** 64 (bfloat16 bits), each product exact (or inf)
    e = scales.short() - 127
    halves = [((h + 127) << 7).view(torch.bfloat16)[..., None] for h in (e // 2, e - e // 2)]
    return (lut[codes] * halves[0] * halves[1]).flatten(-2)


def mxfp4_codes(blocks: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes of MXFP4 ``blocks`` (uint8 ``[..., G, 16]``, OpenAI's layout) as uint8 ``[..., G, 32]``:
    weight ``2j`` of a block in byte ``j``'s low nibble, ``2j + 1`` in its high one."""
    return torch.stack([blocks & 0x0F, blocks >> 4], -1).flatten(-2)


def gate_up_rows(t: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's interleaved gate and up rows (gate first) of ``t`` as ``[gate; up]``."""
    return torch.cat([t[0::2], t[1::2]])


def _gpt_oss_names(sd: dict, inverse: bool = False) -> dict:
    """A GPT-OSS checkpoint's weights (above) under the model's names (the router as ``mlp.gate``, each expert's
    ``gate_up_proj`` rows [gate; up], as :func:`_expert_names` gives every family's; MXFP4 weights dequantised one
    stacked tensor at a time, so that loading holds the experts once, in bfloat16), or with ``inverse`` the model's
    back under transformers' names, stacked, unquantised."""
    out, stacks = {}, {}
    if inverse:
        for name, t in sd.items():
            if (m := _GPT_OSS_EXPERT.fullmatch(name)) is not None:
                stacks.setdefault((m[1], m[3], m[4]), {})[int(m[2])] = t
            else:
                out[re.sub(r"\.mlp\.gate\.(weight|bias)$", r".mlp.router.\1", name)] = t
        for (stem, kind, what), parts in stacks.items():
            ts = [parts[e] for e in range(len(parts))]
            if kind == "gate_up_proj":  # [gate; up] rows -> interleaved
                ts = [torch.stack(t.chunk(2), 1).flatten(0, 1) for t in ts]
            out[f"{stem}.{kind}{'_bias' if what == 'bias' else ''}"] = torch.stack(
                [t.T if what == "weight" else t for t in ts]).contiguous()
        return out
    for name, t in sd.items():
        m = _GPT_OSS_EXPERTS.fullmatch(name)
        if m is None:
            out[re.sub(r"\.mlp\.router\.(weight|bias)$", r".mlp.gate.\1", name)] = t
            continue
        if m[3] == "_scales":
            continue  # (read with its blocks)
        if m[3] == "_blocks":
            scales = sd.get(f"{m[1]}.{m[2]}_scales")
            if scales is None:
                raise ValueError(f"weight {name} (MXFP4 blocks) has no {m[1]}.{m[2]}_scales beside it")
            t = dequantize_mxfp4(t, scales)  # [E, rows (outputs), K]
        elif t.dim() == 3 and not m[3]:
            t = t.transpose(1, 2)  # [E, K, rows] (x @ W) -> [E, rows, K]
        elif t.dim() != 2 or not m[3]:
            out[name] = t  # reported as unexpected
            continue
        for e, w in enumerate(t):  # each expert its own tensor, the stacked one dropped after
            if m[2] == "gate_up_proj":  # interleaved -> [gate; up]
                w = gate_up_rows(w)
            out[f"{m[1]}.{e}.{m[2]}.{'bias' if m[3] == '_bias' else 'weight'}"] = w.contiguous()
    return out


def _mixtral_name(name: str, inverse: bool = False) -> str:
    """A Mixtral checkpoint's weight ``name`` as Qwen3-MoE's checkpoints name it (or back with ``inverse``)."""
    m = (_TO_MIXTRAL if inverse else _FROM_MIXTRAL).fullmatch(name)
    if m is None:
        return name
    names = {v: k for k, v in _MIXTRAL_PROJECTIONS.items()} if inverse else _MIXTRAL_PROJECTIONS
    kind = m[2] if m[3] is None else m[2][: -len(m[3])] + names[m[3]]
    return f"{m[1]}{'block_sparse_moe' if inverse else 'mlp'}.{kind}.weight"


_DEEPSEEK_SHARED = (".mlp.shared_experts.", ".mlp.shared_expert.")  # DeepSeek's name of the shared expert, ours
_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")


def _deepseek_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """DeepSeek's checkpoint names as the model's (its ``shared_experts`` our ``shared_expert``), or back with
    ``inverse``; the multi-token prediction layers DeepSeek-V3's checkpoints hold after the model's
    (``num_nextn_predict_layers``: ``model.layers.{n}...``, not part of the forward) dropped, as transformers drops
    them."""
    theirs, ours = _DEEPSEEK_SHARED[::-1] if inverse else _DEEPSEEK_SHARED
    n = config.num_hidden_layers
    extra = config.extra.get("num_nextn_predict_layers", config.extra.get("num_mtp_layers", 0)) or 0
    ernie, minimax = config.model_type == "ernie4_5_moe", config.model_type == "minimax_m2"
    exaone, mimo = config.model_type == "exaone_moe", config.model_type == "mimo_v2_flash"
    out = {}
    for name, t in sd.items():
        m = _LAYER_INDEX.match(name)
        if not inverse and m is not None and n <= int(m[1]) < n + extra:
            continue
        if not inverse and (ernie and name.startswith(_ERNIE_MTP) or exaone and name.startswith("mtp.")
                            or mimo and name.startswith("model.mtp.")):
            continue  # (ERNIE 4.5's, EXAONE MoE's and MiMo-V2-Flash's multi-token prediction weights)
        if ernie and name.endswith(_ERNIE_BIAS[inverse:]):  # (its [1, experts] moe_statics: one group)
            name = _LAYER_INDEX.match(name)[0] + (_ERNIE_BIAS[0] if inverse else _ERNIE_BIAS[2])[1:]
            t = t[None] if inverse else t.reshape(-1)
        if minimax and name.endswith(_MINIMAX_BIAS[inverse:]):
            name = _LAYER_INDEX.match(name)[0] + (_MINIMAX_BIAS[0] if inverse else _MINIMAX_BIAS[2])[1:]
        if exaone and name.endswith(_EXAONE_BIAS[inverse:]):
            name = _LAYER_INDEX.match(name)[0] + _EXAONE_BIAS[0 if inverse else 1][1:]
        out[name.replace(theirs, ours)] = t
    return out


# MiniMax-M2's correction biases: its checkpoints', transformers' in memory, the model's
_MINIMAX_BIAS = (".block_sparse_moe.e_score_correction_bias", ".mlp.e_score_correction_bias",
                 ".mlp.gate.e_score_correction_bias")


# EXAONE MoE's correction biases: its checkpoints' (beside the router, as transformers renames them), the model's
_EXAONE_BIAS = (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")


# ERNIE 4.5's correction biases: its checkpoints', transformers' in memory, the model's; its multi-token prediction
# weights (not part of the forward: dropped, as transformers drops them)
_ERNIE_BIAS = (".mlp.moe_statics.e_score_correction_bias", ".mlp.gate.moe_statics.e_score_correction_bias",
               ".mlp.gate.e_score_correction_bias")
_ERNIE_MTP = ("model.mtp_", "mtp_")


def _order_mla_rope(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """DeepSeek's RoPE'd rows in the model's order: its checkpoints pair adjacent dims (``2i``, ``2i + 1``) of each
    head's ``qk_rope_head_dim`` query rows (``q_proj`` / ``q_b_proj``: each head's ``qk_nope_head_dim`` rows, then
    those) and of the shared key's (``kv_a_proj_with_mqa``'s rows after the latent's); the model's RoPE pairs ``j``
    and ``j + r/2`` (the same values: transformers' DeepSeek-V3 computes them so). ``sd`` itself where the checkpoint
    has half-split pairs (V3's ``rope_interleave`` false); back with ``inverse``."""
    m, d = config.mla, config.dsa
    if not m.rope_interleaved:
        return sd
    r, nope, R = m.qk_rope_head_dim, m.qk_nope_head_dim, m.kv_lora_rank
    pairs = torch.tensor([*range(0, r, 2), *range(1, r, 2)])
    if inverse:
        pairs = torch.argsort(pairs)
    q_rows, kv_rows = torch.cat([torch.arange(nope), nope + pairs]), torch.cat([torch.arange(R), R + pairs])
    # GLM-5's indexer: its queries' and key's first qk_rope_head_dim dims too (their k_norm's entries with them)
    index_rows = None if d is None or not d.rope_interleaved else torch.cat([pairs, torch.arange(r, d.head_dim)])
    out = dict(sd)
    for name, t in sd.items():
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_b_proj.weight")):
            out[name] = t.reshape(-1, m.qk_head_dim, t.shape[-1])[:, q_rows.to(t.device)].reshape(t.shape)
        elif name.endswith("self_attn.kv_a_proj_with_mqa.weight"):
            out[name] = t[kv_rows.to(t.device)]
        elif index_rows is not None and name.endswith("self_attn.indexer.wq_b.weight"):
            out[name] = t.reshape(-1, d.head_dim, t.shape[-1])[:, index_rows.to(t.device)].reshape(t.shape)
        elif index_rows is not None and name.endswith(("self_attn.indexer.wk.weight", "self_attn.indexer.k_norm.weight",
                                                       "self_attn.indexer.k_norm.bias")):
            out[name] = t[index_rows.to(t.device)]
    return out


# Llama 4's and Aria's checkpoints (transformers' Llama4ForCausalLM, AriaTextForCausalLM): each layer's experts stacked
# as x @ W, experts.gate_up_proj [E, H, 2I] (gate's columns, then up's) and experts.down_proj [E, I, H], its router
# router.weight, under the MLP's own name (Llama 4's feed_forward, its shared expert shared_expert and its dense layers'
# gate_proj / up_proj / down_proj; Aria's mlp, its shared experts as one MLP shared_experts, its stacks
# experts.fc1.weight and experts.fc2.weight in its checkpoints, transformers' in-memory names read too)
_TRANSPOSED_EXPERTS = {"llama4_text": ("feed_forward", "shared_expert", ("gate_up_proj", "down_proj")),
                       "aria_text": ("mlp", "shared_experts", ("fc1.weight", "fc2.weight"))}
_TRANSPOSED_STACK = re.compile(r"(.*\.)mlp\.experts\.(gate_up_proj|down_proj|fc1\.weight|fc2\.weight)")
_STACK_KIND = {"fc1.weight": "gate_up_proj", "fc2.weight": "down_proj"}
_TRANSPOSED_EXPERT = re.compile(r"(.*\.)mlp\.experts\.(\d+)\.(gate_up_proj|down_proj)\.weight")


def _transposed_expert_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """Llama 4's or Aria's checkpoint weights (above) under the model's names (mlp.*, the router as mlp.gate, the
    shared expert as mlp.shared_expert, each expert's projections its own, ``gate_up_proj`` rows [gate; up]), or with
    ``inverse`` the model's back under the checkpoint's, stacked."""
    block, shared, stacked = _TRANSPOSED_EXPERTS[config.model_type]
    theirs, ours = (f".{block}.", f".{block}.{shared}."), (".mlp.", ".mlp.shared_expert.")
    out, stacks = {}, {}
    for name, t in sd.items():
        if inverse:
            if (m := _TRANSPOSED_EXPERT.fullmatch(name)) is not None:
                stacks.setdefault((m[1], m[3]), {})[int(m[2])] = t
                continue
            name = re.sub(r"\.mlp\.gate\.weight$", ".mlp.router.weight", name)
            out[name.replace(ours[1], theirs[1]).replace(ours[0], theirs[0])] = t
            continue
        name = name.replace(theirs[1], ours[1]).replace(theirs[0], ours[0])
        if (m := _TRANSPOSED_STACK.fullmatch(name)) is not None and t.dim() == 3:
            kind = _STACK_KIND.get(m[2], m[2])
            out.update({f"{m[1]}mlp.experts.{e}.{kind}.weight": w.T.contiguous() for e, w in enumerate(t)})
        else:
            out[re.sub(r"\.mlp\.router\.weight$", ".mlp.gate.weight", name)] = t
    for (stem, kind), parts in stacks.items():
        if sorted(parts) != list(range(len(parts))):
            raise ValueError(f"{stem}mlp.experts: the model's experts are {sorted(parts)}, not 0..{len(parts) - 1}")
        name = stacked[0] if kind == "gate_up_proj" else stacked[1]
        out[f"{stem}{block}.experts.{name}"] = torch.stack([parts[e].T for e in range(len(parts))]).contiguous()
    return out


def _expert_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """``sd`` with a mixture of experts' weights as the model holds them (above), or with ``inverse`` as its
    checkpoints do (the family's names, gate and up apart); ``sd`` itself for a dense model (but Llama 4's, whose MLPs
    its checkpoints name feed_forward: MobileLLM-R1's)."""
    if config.experts is None and config.model_type != "llama4_text":
        return sd
    if config.model_type == "gpt_oss":
        return _gpt_oss_names(sd, inverse)
    if config.model_type in _TRANSPOSED_EXPERTS:
        return _transposed_expert_names(config, sd, inverse)
    mixtral = config.model_type in ("mixtral", "minimax_m2", "phimoe")  # (Mixtral's names: block_sparse_moe, w1 / w3 /
    # w2)
    granite = config.model_type in ("granitemoe", "granitemoeshared", "granitemoe_swa", "granitemoehybrid", "jetmoe")
    # (DeepSeek's names; GLM-4.5's are the same; Flint's router is DeepSeek's path but its names Qwen2-MoE's)
    deepseek = config.experts.grouped_router and config.model_type not in ("flint", "laguna")
    if deepseek and not inverse:
        sd = _deepseek_names(config, sd)
    out = {}
    if inverse and granite:
        return _granite_moe_names(sd, inverse=True, modules=config.model_type == "granitemoe_swa")
    if granite:
        sd = _granite_moe_names(sd)
    if inverse:
        for name, t in sd.items():
            m = _EXPERT_PROJECTION.fullmatch(name)
            m = m if m is not None and m[2] == "gate_up_proj" else None
            parts = zip((f"{m[1]}gate_proj.weight", f"{m[1]}up_proj.weight"), t.chunk(2)) if m else ((name, t),)
            out.update({_mixtral_name(part, inverse=True) if mixtral else part: w.clone() if m else w
                        for part, w in parts})
        return _deepseek_names(config, out, inverse=True) if deepseek else out
    for name, t in sd.items():
        name = _mixtral_name(name) if mixtral else name
        if (m := _STACKED_EXPERTS.fullmatch(name)) is not None and t.dim() == 3:
            out.update({f"{m[1]}.{e}.{m[2]}.weight": w.clone() for e, w in enumerate(t)})
        else:
            out[name] = t
    joined = {}
    for name, t in out.items():
        m = _EXPERT_PROJECTION.fullmatch(name)
        if m is None or m[2] == "gate_up_proj":
            joined[name] = t
        elif m[2] == "gate_proj" and f"{m[1]}up_proj.weight" in out:
            joined[f"{m[1]}gate_up_proj.weight"] = torch.cat([t, out[f"{m[1]}up_proj.weight"]])
        elif m[2] == "gate_proj" or f"{m[1]}gate_proj.weight" not in out:
            joined[name] = t  # a half without the other: reported as unexpected
    return joined


# GLM-4's names of Gemma 3's four norms (the model's: config.sandwich_norms): its post_attention_layernorm is the norm
# before the MLP
_GLM4_NORMS = {"post_self_attn_layernorm": "post_attention_layernorm",
               "post_attention_layernorm": "pre_feedforward_layernorm",
               "post_mlp_layernorm": "post_feedforward_layernorm"}
# Kolibri-1's checkpoints: GLM-4's four norms under names of their own (post_attn_norm after the attention,
# post_ffn_norm after the MLP; transformers' modules GLM-4's names, read too), its router's correction bias as
# moe.router.expert_bias; saved as its checkpoints hold them
_KOLIBRI_NORMS = {**_GLM4_NORMS, "post_attn_norm": "post_attention_layernorm",
                  "post_ffn_norm": "post_feedforward_layernorm"}
_KOLIBRI_NORMS_BACK = {"post_attention_layernorm": "post_attn_norm",
                       "pre_feedforward_layernorm": "post_attention_layernorm",
                       "post_feedforward_layernorm": "post_ffn_norm"}
_KOLIBRI_BIAS = (".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias")
# HyperCLOVA X's Peri-LN norms (use_post_norm): post_norm1 after the attention, post_norm2 after the MLP, its
# post_attention_layernorm the norm before the MLP
_HYPERCLOVAX_NORMS = {"post_norm1": "post_attention_layernorm", "post_attention_layernorm": "pre_feedforward_layernorm",
                      "post_norm2": "post_feedforward_layernorm"}
_LAYER_NORM_NAME = re.compile(r"(model\.layers\.\d+\.)(\w+)(\.weight)")


# Hunyuan's names (its checkpoints' and transformers'): the q / k norms, the router, the shared expert -> the model's
_HUNYUAN_NAMES = {".self_attn.query_layernorm.": ".self_attn.q_norm.",
                  ".self_attn.key_layernorm.": ".self_attn.k_norm.", ".mlp.gate.wg.": ".mlp.gate.",
                  ".mlp.shared_mlp.": ".mlp.shared_expert."}


def _renamed(sd: dict, pairs) -> dict:
    """``sd`` with each ``(old, new)`` of ``pairs`` replaced in every name."""
    out = {}
    for name, t in sd.items():
        for old, new in pairs:
            name = name.replace(old, new)
        out[name] = t
    return out


# family -> its checkpoints' names of the model's modules (Hunyuan's; StarCoder 2's ungated MLP: c_fc, c_proj;
# VaultGemma's norm before the MLP; GPT-NeoX's every name but its norms', its query_key_value split first: _FUSED)
_FAMILY_NAMES = {**dict.fromkeys(_HUNYUANS, _HUNYUAN_NAMES),
                 "gpt_neox": {"gpt_neox.embed_in.": "model.embed_tokens.", "gpt_neox.layers.": "model.layers.",
                              "gpt_neox.final_layer_norm.": "model.norm.", "embed_out.": "lm_head.",
                              ".attention.dense.": ".self_attn.o_proj.", ".mlp.dense_h_to_4h.": ".mlp.up_proj.",
                              ".mlp.dense_4h_to_h.": ".mlp.down_proj."},
                 # GPT-NeoX Japanese: GPT-NeoX's names under gpt_neox_japanese.*, its last layer's output bias
                 # dense_bias (before o_proj's pair: saving renames the bias first)
                 "gpt_neox_japanese": {
                     "gpt_neox_japanese.embed_in.": "model.embed_tokens.",
                     "gpt_neox_japanese.layers.": "model.layers.",
                     "gpt_neox_japanese.final_layer_norm.": "model.norm.", "embed_out.": "lm_head.",
                     ".attention.dense_bias": ".self_attn.o_proj.bias", ".attention.dense.": ".self_attn.o_proj.",
                     ".mlp.dense_h_to_4h.": ".mlp.up_proj.", ".mlp.dense_4h_to_h.": ".mlp.down_proj."},
                 "starcoder2": {".mlp.c_fc.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."},
                 # VaultGemma: Gemma 2's norm before the MLP, its only one there (Llama's post_attention_layernorm)
                 "vaultgemma": {".pre_feedforward_layernorm.": ".post_attention_layernorm."},
                 "nanochat": {".mlp.fc1.": ".mlp.up_proj.", ".mlp.fc2.": ".mlp.down_proj."},
                 # Cohere 2 MoE: its shared experts' name
                 "cohere2_moe": {".mlp.shared_experts.": ".mlp.shared_expert."},
                 # BioGPT: OPT's layer names under biogpt.*, its final norm layer_norm, its head output_projection
                 "biogpt": {"biogpt.layer_norm.": "model.norm.", "biogpt.layers.": "model.layers.",
                            "biogpt.embed_tokens.": "model.embed_tokens.",
                            "biogpt.embed_positions.": "model.embed_positions.", "output_projection.": "lm_head.",
                            ".self_attn_layer_norm.": ".input_layernorm.",
                            ".final_layer_norm.": ".post_attention_layernorm.",
                            ".self_attn.out_proj.": ".self_attn.o_proj.", ".fc1.": ".mlp.up_proj.",
                            ".fc2.": ".mlp.down_proj."},
                 # XGLM: OPT's layer names under model.*, its final norm layer_norm (its positions: _norm_names)
                 "xglm": {"model.layer_norm.": "model.norm.", ".self_attn_layer_norm.": ".input_layernorm.",
                          ".final_layer_norm.": ".post_attention_layernorm.",
                          ".self_attn.out_proj.": ".self_attn.o_proj.", ".fc1.": ".mlp.up_proj.",
                          ".fc2.": ".mlp.down_proj."},
                 # OPT: its decoder's names (the final norm's before the layers' norm of the same name)
                 "opt": {"model.decoder.final_layer_norm.": "model.norm.", "model.decoder.layers.": "model.layers.",
                         "model.decoder.embed_tokens.": "model.embed_tokens.",
                         "model.decoder.embed_positions.": "model.embed_positions.",
                         "model.decoder.project_in.": "model.project_in.",  # (opt-350m's)
                         "model.decoder.project_out.": "model.project_out.",
                         ".self_attn_layer_norm.": ".input_layernorm.",
                         ".final_layer_norm.": ".post_attention_layernorm.",
                         ".self_attn.out_proj.": ".self_attn.o_proj.", ".fc1.": ".mlp.up_proj.",
                         ".fc2.": ".mlp.down_proj."},
                 # GPT-Neo: GPT-2's names, its attention's under attn.attention
                 "gpt_neo": {"transformer.wte.": "model.embed_tokens.", "transformer.wpe.": "model.embed_positions.",
                             "transformer.h.": "model.layers.", "transformer.ln_f.": "model.norm.",
                             ".ln_1.": ".input_layernorm.", ".ln_2.": ".post_attention_layernorm.",
                             ".attn.attention.out_proj.": ".self_attn.o_proj.", ".attn.attention.": ".self_attn.",
                             ".mlp.c_fc.": ".mlp.up_proj.", ".mlp.c_proj.": ".mlp.down_proj."},
                 "gptj": {"transformer.wte.": "model.embed_tokens.", "transformer.h.": "model.layers.",
                          "transformer.ln_f.": "model.norm.", ".ln_1.": ".input_layernorm.",
                          ".attn.q_proj.": ".self_attn.q_proj.", ".attn.k_proj.": ".self_attn.k_proj.",
                          ".attn.v_proj.": ".self_attn.v_proj.", ".attn.out_proj.": ".self_attn.o_proj.",
                          ".mlp.fc_in.": ".mlp.up_proj.", ".mlp.fc_out.": ".mlp.down_proj."},
                 "persimmon": {".self_attn.dense.": ".self_attn.o_proj.", ".mlp.dense_h_to_4h.": ".mlp.up_proj.",
                               ".mlp.dense_4h_to_h.": ".mlp.down_proj.", "model.final_layernorm.": "model.norm.",
                               ".self_attn.q_layernorm.": ".self_attn.q_norm.",
                               ".self_attn.k_layernorm.": ".self_attn.k_norm."},
                 # Flint: its checkpoints' name of the attention sinks
                 "flint": {".self_attn.softmax_offset": ".self_attn.sinks"},
                 # MiMo-V2-Flash: its checkpoints' name of the sliding layers' attention sinks
                 "mimo_v2_flash": {".self_attn.attention_sink_bias": ".self_attn.sinks"},
                 # PhiMoE: transformers 5's name of its router (its checkpoints': Mixtral's block_sparse_moe.gate)
                 "phimoe": {".mlp.router.weight": ".mlp.gate.weight"},
                 "apertus": {".attention_layernorm.": ".input_layernorm.",
                             ".feedforward_layernorm.": ".post_attention_layernorm."},
                 # AFMoE: Gemma 3's norms around the MLP, its router and correction bias (the bias first: back, the
                 # router's rule would take its name)
                 "afmoe": {".pre_mlp_layernorm.": ".pre_feedforward_layernorm.",
                           ".post_mlp_layernorm.": ".post_feedforward_layernorm.",
                           ".mlp.expert_bias": ".mlp.gate.e_score_correction_bias", ".mlp.router.gate.": ".mlp.gate."},
                 "phi": {".self_attn.dense.": ".self_attn.o_proj.", ".mlp.fc1.": ".mlp.up_proj.",
                         ".mlp.fc2.": ".mlp.down_proj.", "model.final_layernorm.": "model.norm.",
                         ".self_attn.q_layernorm.": ".self_attn.q_norm.",
                         ".self_attn.k_layernorm.": ".self_attn.k_norm."}}
# StableLM 2 12B's per-head q / k LayerNorms: self_attn.{q,k}_layernorm.norms.{h}.weight, one [head_dim] per head; the
# model's self_attn.{q,k}_norm.weight, [heads, head_dim] (llama.cpp's converter stacks them so too)
_STABLELM_HEAD_NORM = re.compile(r"(.*\.self_attn\.)([qk])_layernorm\.norms\.(\d+)\.weight")
_STABLELM_STACKED_NORM = re.compile(r"(.*\.self_attn\.)([qk])_norm\.weight")


def _stablelm_head_norms(sd: dict, inverse: bool = False) -> dict:
    """``sd`` with a StableLM checkpoint's per-head q / k norms stacked as the model's (or, with ``inverse``, the
    model's split back); ``sd`` itself where it has none."""
    out, stacks = {}, {}
    for name, t in sd.items():
        if inverse and (m := _STABLELM_STACKED_NORM.fullmatch(name)) is not None:
            out.update({f"{m[1]}{m[2]}_layernorm.norms.{h}.weight": row.clone() for h, row in enumerate(t)})
        elif not inverse and (m := _STABLELM_HEAD_NORM.fullmatch(name)) is not None:
            stacks.setdefault(f"{m[1]}{m[2]}_norm.weight", {})[int(m[3])] = t
        else:
            out[name] = t
    for name, rows in stacks.items():
        if sorted(rows) != list(range(len(rows))):
            raise ValueError(f"{name}: the checkpoint's per-head norms are heads {sorted(rows)}, not "
                             f"0..{len(rows) - 1}")
        out[name] = torch.stack([rows[h] for h in range(len(rows))])
    return out


_DENSE_MLP = re.compile(r"(.*\.)mlp\.(gate|up|down)_proj\.weight")


# Mamba-2's checkpoint names (backbone.*) -> the model's, as regular expressions (its layers' norm and its mixer's own
# are both .norm.: told apart by where they are)
# (Nemotron-H's: the same under model.*, as transformers 5 names them)
_MAMBA2_NAMES = ((r"^(?:backbone|model)\.embeddings\.", "model.embed_tokens."),
                 (r"^(?:backbone|model)\.norm_f\.", "model.norm."),
                 (r"^(?:backbone|model)\.layers\.(\d+)\.norm\.", r"model.layers.\1.input_layernorm."),
                 (r"^(?:backbone|model)\.layers\.(\d+)\.mixer\.", r"model.layers.\1.self_attn."))
_MAMBA2_BACK = ((r"^model\.embed_tokens\.", "PREFIX.embeddings."), (r"^model\.norm\.", "PREFIX.norm_f."),
                (r"^model\.layers\.(\d+)\.input_layernorm\.", r"PREFIX.layers.\1.norm."),
                (r"^model\.layers\.(\d+)\.self_attn\.", r"PREFIX.layers.\1.mixer."))
_BAMBA_PAIRS = (("model.final_layernorm.", "model.norm."), (".pre_ff_layernorm.", ".post_attention_layernorm."),
                (".feed_forward.", ".mlp."))
_JAMBA_PAIRS = (*_BAMBA_PAIRS, (".mlp.router.", ".mlp.gate."))


_KIMI_FORGET = re.compile(r"(.*\.self_attn\.)(f_a_proj\.weight|f_b_proj\.weight|dt_bias|A_log)$")
_KIMI_CONV = re.compile(r"(.*\.self_attn\.)([qkv])_conv1d\.weight$")
_KIMI_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(w[123]|gate_proj|up_proj|down_proj)\.weight$")


def _kimi_names(sd: dict, inverse: bool = False) -> dict:
    """Kimi Linear's checkpoints as the model's names, or back with ``inverse`` as transformers' modules hold them.
    Read: transformers' own layout, or moonshotai's (as transformers converts it): the forget gate's ``f_a_proj``,
    ``f_b_proj``, ``dt_bias``, ``A_log`` under ``self_attn`` (the model's ``self_attn.forget_gate``), the
    convolutions ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` (joined as ``conv1d``), the mixture under
    ``block_sparse_moe`` with each expert's ``w1`` / ``w3`` / ``w2`` (gate, up, down). Written: the experts stacked as
    transformers' ``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows first) and ``down_proj`` ``[E, H, I]``, which
    it reads as they are."""
    out, convs, stacks = {}, {}, {}
    for name, t in sd.items():
        if inverse:
            m = _KIMI_EXPERT.fullmatch(name)
            if m is not None:
                stacks.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = t
            else:
                out[name] = t
            continue
        name = name.replace(".block_sparse_moe.", ".mlp.")
        if (m := _KIMI_FORGET.fullmatch(name)) is not None:
            name = f"{m[1]}forget_gate.{m[2]}"
        elif (m := _KIMI_CONV.fullmatch(name)) is not None:
            convs.setdefault(m[1], {})[m[2]] = t
            continue
        elif (m := _KIMI_EXPERT.fullmatch(name)) is not None and m[3] in _MIXTRAL_PROJECTIONS:
            name = f"{m[1]}.{m[2]}.{_MIXTRAL_PROJECTIONS[m[3]]}.weight"
        out[name] = t
    for stem, parts in convs.items():
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(f"Kimi Linear checkpoint: {stem} has the convolutions of {sorted(parts)} only (q, k and v "
                             "go together)")
        out[f"{stem}conv1d.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    for stem, experts in stacks.items():
        order = [experts[e] for e in range(len(experts))]
        out[f"{stem}.gate_up_proj"] = torch.stack([torch.cat([x["gate_proj"], x["up_proj"]]) for x in order])
        out[f"{stem}.down_proj"] = torch.stack([x["down_proj"] for x in order])
    return out


def _falcon_h1_multipliers(config: LlamaConfig) -> dict:
    """Falcon-H1's muP multipliers that fold into its weights: ``{module: (weight factor or rows, bias factor or
    rows)}`` per layer's module under the model's names (``self_attn.k_proj``, ``mamba.in_proj``, ``mlp.gate_proj``,
    ...; a factor a float, rows a float64 tensor of one factor per output row): the attention's input
    (attention_in_multiplier: q / k / v's weights), its keys (key_multiplier: k's weight and bias) and output
    (attention_out_multiplier: o_proj), the Mamba mixer's input (ssm_in_multiplier: in_proj's weight) and output
    (ssm_out_multiplier: out_proj), in_proj's rows of z, x, B, C and dt (ssm_multipliers, transformers' mup_vector),
    the MLP's gate (mlp_multipliers[0], before its activation) and output (mlp_multipliers[1]). The embeddings' and the
    logits' multipliers are the model's own (LlamaConfig.embedding_multiplier, logit_scale)."""
    x, m = config.extra, config.mamba
    get = lambda key: float(x.get(key, 1.0))  # noqa: E731
    attn_in, key, ssm_in = get("attention_in_multiplier"), get("key_multiplier"), get("ssm_in_multiplier")
    gate, down = x.get("mlp_multipliers") or (1.0, 1.0)
    z, xs, B, C, dt = x.get("ssm_multipliers") or (1.0,) * 5
    gs = m.groups * m.state
    rows = torch.cat([torch.full((n,), float(f), dtype=torch.float64)
                      for n, f in ((m.inner, z), (m.inner, xs), (gs, B), (gs, C), (m.heads, dt))])
    out = get("attention_out_multiplier")
    return {"self_attn.q_proj": (attn_in, 1.0), "self_attn.k_proj": (attn_in * key, key),
            "self_attn.v_proj": (attn_in, 1.0), "self_attn.o_proj": (out, out),
            "mamba.in_proj": (rows * ssm_in, rows), "mamba.out_proj": (get("ssm_out_multiplier"),) * 2,
            "mlp.gate_proj": (float(gate), float(gate)), "mlp.down_proj": (float(down), float(down))}


def _falcon_h1_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """Falcon-H1's checkpoint names and weights as the model's, or back with ``inverse``: Bamba's names (its Mamba
    mixer ``mamba`` kept: the layer's own, beside ``self_attn``), the multipliers of :func:`_falcon_h1_multipliers`
    folded into the weights they scale (in float64, rounded once to the weight's dtype; divided out on saving). A
    quantised weight cannot take them: refused where its factor is not 1."""
    if inverse:
        sd = dict(sd)
    else:
        sd = _renamed(sd, _BAMBA_PAIRS)
    layer_names = {}
    for name in sd:
        m = _LAYER_INDEX.match(name)
        if m is not None:
            layer_names.setdefault(m[1], []).append(name)
    for module, factors in _falcon_h1_multipliers(config).items():
        for i, names in layer_names.items():
            prefix = f"model.layers.{i}.{module}."
            for part, f in zip(("weight", "bias"), factors):
                if f == 1.0 if isinstance(f, float) else bool((f == 1).all()):
                    continue
                t = sd.get(prefix + part)
                if t is None and part == "weight" and any(n.startswith(prefix) for n in names):
                    raise ValueError(f"Falcon-H1: no {prefix}weight but its quantised form: its muP multipliers fold "
                                     "into float weights only")
                if t is None:
                    continue
                if not t.is_floating_point() or t.element_size() < 2:
                    raise ValueError(f"Falcon-H1: {prefix}{part} is {t.dtype}: its muP multipliers fold into float "
                                     "weights only")
                f = f if isinstance(f, float) else f.view(-1, *([1] * (t.dim() - 1)))
                sd[prefix + part] = ((t.double() / f) if inverse else (t.double() * f)).to(t.dtype)
    return _renamed(sd, [(b, a) for a, b in reversed(_BAMBA_PAIRS)]) if inverse else sd


# Jamba's Mamba(-1) layers' weights under the model's self_attn (triforce.models.llama.Mamba1Mixer), back to mamba
_MAMBA1_OURS = re.compile(r"(.*)\.self_attn\.(in_proj\.|conv1d\.|x_proj\.|dt_proj\.|A_log$|D$|out_proj\.|dt_layernorm\."
                          r"|b_layernorm\.|c_layernorm\.)")
# Granite 4.0's Mamba layers' weights under the model's self_attn (triforce.models.llama.Mamba2Mixer), back to mamba
_MAMBA_OURS = re.compile(r"(.*)\.self_attn\.(in_proj\.|conv1d\.|dt_bias$|A_log$|D$|norm\.weight$|out_proj\.)")


# Qwen3.5's (Qwen3-Next's) gated DeltaNet layers' weights under the model's self_attn (triforce.models.llama.
# GatedDeltaNet), back to linear_attn
_DELTA_OURS = re.compile(r"(.*)\.self_attn\.(in_proj_(?:qkv|z|b|a)\.|conv1d\.|dt_bias$|A_log$|norm\.weight$"
                         r"|out_proj\.)")


def _delta_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """Qwen3.5's checkpoint names and layout as the model's, or back with ``inverse``: its gated DeltaNet layers'
    ``linear_attn`` as ``self_attn``; its attention's ``q_proj``, each head's query rows then its gate's rows, split
    into ``q_proj`` and ``gate_proj`` (and joined); its multi-token prediction layers (``mtp.*``, not part of the
    forward) dropped, as transformers drops them."""
    H, D = config.num_attention_heads, config.head_dim
    if config.model_type == "olmo_hybrid" and not inverse:
        sd = _olmo_hybrid_projections(config, _renamed(sd, _OLMO_HYBRID_NORMS))
    out = {}
    for name, t in sd.items():
        if inverse:
            out[_DELTA_OURS.sub(r"\1.linear_attn.\2", name)] = t
        elif not name.startswith("mtp."):
            out[name.replace(".linear_attn.", ".self_attn.")] = t
    if config.model_type == "qwen3_next":
        out = _qwen3_next_projections(config, out, inverse)
    if config.model_type == "olmo_hybrid" and inverse:
        return _renamed(_olmo_hybrid_projections(config, out, inverse), [(b, a) for a, b in _OLMO_HYBRID_NORMS])
    for name in [k for k in out if k.endswith((".self_attn.q_proj.weight", ".self_attn.q_proj.bias"))]:
        gate = name.replace(".q_proj.", ".gate_proj.")
        if inverse and gate in out:
            q, g = out[name], out.pop(gate)
            out[name] = torch.cat([q.reshape(H, D, *q.shape[1:]), g.reshape(H, D, *g.shape[1:])], 1).reshape(
                2 * H * D, *q.shape[1:])
        elif not inverse and out[name].shape[0] == 2 * H * D:
            both = out[name].reshape(H, 2 * D, *out[name].shape[1:])
            out[name], out[gate] = (both[:, i * D:(i + 1) * D].reshape(H * D, *both.shape[2:]) for i in (0, 1))
    return out


# OLMo Hybrid's checkpoints' norm names (its DeltaNet layers' before the mixer and the MLP; its attention layers' after
# the attention: the second) and the model's
_OLMO_HYBRID_NORMS = ((".attention_layer_norm.", ".input_layernorm."),
                      (".feedforward_layer_norm.", ".post_attention_layernorm."))
# OLMo Hybrid's DeltaNet names (its linear_attn's) and Qwen3.5's (the model's), q / k / v joined as in_proj_qkv (and
# their convolutions, q_conv1d / k_conv1d / v_conv1d, as conv1d)
_OLMO_HYBRID_DELTA = (("g_proj.", "in_proj_z."), ("a_proj.", "in_proj_a."), ("b_proj.", "in_proj_b."),
                      ("o_proj.", "out_proj."), ("o_norm.", "norm."))


def _olmo_hybrid_projections(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """OLMo Hybrid's DeltaNet projections (under ``linear_attn``: ``q_proj``, ``k_proj``, ``v_proj``, ``g_proj``,
    ``a_proj``, ``b_proj``, ``o_proj``, ``o_norm``; its checkpoints' convolutions ``q_conv1d``, ``k_conv1d``,
    ``v_conv1d``) as Qwen3.5's (``in_proj_qkv``, the three joined, ``in_proj_z``, ``in_proj_a``, ``in_proj_b``,
    ``out_proj``, ``norm``; ``conv1d``, the three joined), or back with ``inverse`` (the convolution split by the
    key, key and value widths: transformers 5.23 writes its three thirds, which it joins back; so do we)."""
    d = config.delta
    widths = [d.k_heads * d.k_dim] * 2 + [d.v_heads * d.v_dim]
    out = {}
    for name, t in sd.items():
        if ".linear_attn." not in name:
            out[name] = t
            continue
        base, part = name.split(".linear_attn.")
        for joined, parts in (("in_proj_qkv.", ("q_proj.", "k_proj.", "v_proj.")),
                              ("conv1d.", ("q_conv1d.", "k_conv1d.", "v_conv1d."))):
            if inverse and part.startswith(joined):
                for each, rows in zip(parts, t.split(widths)):
                    out[f"{base}.linear_attn.{each}{part[len(joined):]}"] = rows
                break
            if not inverse and part.startswith(parts):
                rest = part[part.index(".") + 1:]
                three = [sd.get(f"{base}.linear_attn.{each}{rest}") for each in parts]
                if any(p is None for p in three):
                    out[name] = t  # (one without the others: reported as unexpected)
                elif part.startswith(parts[0]):
                    out[f"{base}.linear_attn.{joined}{rest}"] = torch.cat(three)
                break
        else:
            out[f"{base}.linear_attn.{_olmo_hybrid_part(part, inverse)}"] = t
    return out


def _olmo_hybrid_part(part: str, inverse: bool) -> str:
    """One of OLMo Hybrid's DeltaNet names after ``linear_attn.`` as the model's (or back)."""
    for theirs, ours in _OLMO_HYBRID_DELTA:
        a, b = (ours, theirs) if inverse else (theirs, ours)
        if part.startswith(a):
            return b + part[len(a):]
    return part


def _qwen3_next_projections(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """Qwen3-Next's fused DeltaNet projections as Qwen3.5's (the model's), or back with ``inverse``: ``in_proj_qkvz``
    holds per key head its query rows, its key rows, then the value rows and the gate rows of the ``r = v_heads /
    k_heads`` value heads it serves; ``in_proj_ba`` per key head its r b rows, then its r a rows. The model's
    ``in_proj_qkv`` holds every query row, every key row, every value row; ``in_proj_z``, ``in_proj_b`` and
    ``in_proj_a`` theirs, value head by value head."""
    d = config.delta
    if d is None:
        return sd
    Hk, K, r, V = d.k_heads, d.k_dim, d.v_heads // d.k_heads, d.v_dim
    out = dict(sd)
    suffix = ".linear_attn.in_proj_qkv.weight" if inverse else ".self_attn.in_proj_qkvz.weight"
    for name in [k for k in sd if k.endswith(suffix)]:
        base = name.rsplit(".in_proj_", 1)[0]
        if inverse:
            qkv, z = out.pop(f"{base}.in_proj_qkv.weight"), out.pop(f"{base}.in_proj_z.weight")
            b, a = out.pop(f"{base}.in_proj_b.weight"), out.pop(f"{base}.in_proj_a.weight")
            q, k, v = qkv.split([Hk * K, Hk * K, Hk * r * V])
            parts = [t.reshape(Hk, -1, t.shape[-1]) for t in (q, k, v, z)]
            out[f"{base}.in_proj_qkvz.weight"] = torch.cat(parts, 1).reshape(-1, qkv.shape[-1])
            out[f"{base}.in_proj_ba.weight"] = torch.cat([b.reshape(Hk, r, -1), a.reshape(Hk, r, -1)], 1).reshape(
                -1, b.shape[-1])
            continue
        qkvz = out.pop(name).reshape(Hk, 2 * K + 2 * r * V, -1)
        q, k, v, z = (t.reshape(-1, qkvz.shape[-1]) for t in qkvz.split([K, K, r * V, r * V], dim=1))
        out[f"{base}.in_proj_qkv.weight"] = torch.cat([q, k, v])
        out[f"{base}.in_proj_z.weight"] = z
    for name in [] if inverse else [k for k in sd if k.endswith(".self_attn.in_proj_ba.weight")]:
        ba = out.pop(name).reshape(Hk, 2 * r, -1)
        base = name.rsplit(".in_proj_", 1)[0]
        out[f"{base}.in_proj_b.weight"], out[f"{base}.in_proj_a.weight"] = (
            t.reshape(-1, ba.shape[-1]) for t in ba.split([r, r], dim=1))
    return out


def _granite_dense_names(sd: dict, inverse: bool = False) -> dict:
    """Granite 4.0's dense checkpoints (granitemoehybrid without experts): its MLP, ``shared_mlp.input_linear`` (the
    gate's rows, then the up's) and ``output_linear``, as the model's ``mlp.gate_proj`` / ``up_proj`` / ``down_proj``,
    or with ``inverse`` back (a half without the other is left as it is: reported as unexpected)."""
    out = {}
    for name, t in sd.items():
        if not inverse and (m := _GRANITE_SHARED.fullmatch(name)) is not None:
            parts = zip(("gate", "up"), t.chunk(2)) if m[2] == "input" else (("down", t),)
            out.update({f"{m[1]}mlp.{p}_proj.weight": w.clone() for p, w in parts})
        elif inverse and (m := _DENSE_MLP.fullmatch(name)) is not None:
            if m[2] == "down":
                out[f"{m[1]}shared_mlp.output_linear.weight"] = t
            elif m[2] == "gate" and f"{m[1]}mlp.up_proj.weight" in sd:
                out[f"{m[1]}shared_mlp.input_linear.weight"] = torch.cat([t, sd[f"{m[1]}mlp.up_proj.weight"]])
            elif f"{m[1]}mlp.gate_proj.weight" not in sd:
                out[name] = t
        else:
            out[name] = t
    return out


# Falcon's checkpoint names (transformer.*) -> the model's; its query_key_value split by falcon_qkv_split
_FALCON_NAMES = (("transformer.word_embeddings.", "model.embed_tokens."), ("transformer.h.", "model.layers."),
                 ("transformer.ln_f.", "model.norm."), (".self_attention.dense.", ".self_attn.o_proj."),
                 (".mlp.dense_h_to_4h.", ".mlp.up_proj."), (".mlp.dense_4h_to_h.", ".mlp.down_proj."))
_FALCON_NORMS = ((".ln_attn.", ".input_layernorm."), (".ln_mlp.", ".post_attention_layernorm."))
# family -> (its checkpoints' names -> the model's, its one q / k / v tensor as self_attn.qkv_proj (split by
# falcon_qkv_split); the prefixes of its unprefixed checkpoints' names)
_QKV_NAMES = {
    "falcon": (_FALCON_NAMES + ((".self_attention.query_key_value.", ".self_attn.qkv_proj."),), ()),
    # BLOOM: Falcon's names, its embeddings' norm; bigscience's checkpoints unprefixed (BloomModel's names)
    "bloom": (_FALCON_NAMES + (("transformer.word_embeddings_layernorm.", "model.embed_layernorm."),
                               (".self_attention.query_key_value.", ".self_attn.qkv_proj.")),
              ("word_embeddings.", "word_embeddings_layernorm.", "h.", "ln_f.")),
    "mpt": ((("transformer.wte.", "model.embed_tokens."), ("transformer.blocks.", "model.layers."),
             ("transformer.norm_f.", "model.norm."), (".norm_1.", ".input_layernorm."),
             (".norm_2.", ".post_attention_layernorm."), (".attn.Wqkv.", ".self_attn.qkv_proj."),
             (".attn.out_proj.", ".self_attn.o_proj."), (".ffn.", ".mlp.")), ()),
}


def _qkv_layout(config: LlamaConfig) -> tuple:
    """``(layout, KV heads)`` of the family's one q / k / v tensor: Falcon's by its keys
    (:func:`~triforce.models.config.falcon_layout`), BLOOM's per head (GPT-NeoX's), MPT's ``[q; k; v]`` of every
    head (``"multi_query"``'s rows with as many KV heads as query heads)."""
    if config.model_type == "bloom":
        return "per_head", config.num_attention_heads
    if config.model_type == "mpt":
        return "multi_query", config.num_key_value_heads
    layout, kv, _, _ = falcon_layout(config.extra, config.num_attention_heads)
    return layout, kv


def falcon_qkv_split(config: LlamaConfig, t: torch.Tensor) -> list:
    """Falcon's ``query_key_value`` rows (weight or bias; BLOOM's too, MPT's ``Wqkv``) as the q, k and v projections'
    (copies), by its layout (:func:`_qkv_layout`): per KV group its queries, its key and its value (the new
    architecture); every query, then the keys, then the values (multi-query: one key, one value; MPT's: every head's);
    per head q, k, v (GPT-NeoX's)."""
    layout, kv = _qkv_layout(config)
    D, heads = config.head_dim, config.num_attention_heads
    if layout == "per_head":
        return neox_qkv_split(t, heads)
    if layout == "multi_query":
        return [p.clone() for p in t.split((heads * D, kv * D, kv * D))]
    per = t.reshape(kv, heads // kv + 2, D, *t.shape[1:])
    return [p.reshape(-1, *t.shape[1:]).clone() for p in (per[:, :-2], per[:, -2], per[:, -1])]


def falcon_qkv_join(config: LlamaConfig, parts) -> torch.Tensor:
    """The inverse of :func:`falcon_qkv_split`."""
    layout, kv = _qkv_layout(config)
    D, heads = config.head_dim, config.num_attention_heads
    if layout == "per_head":
        return neox_qkv_join(parts, heads)
    if layout == "multi_query":
        return torch.cat(parts)
    q, k, v = parts
    rest = q.shape[1:]
    return torch.cat([q.reshape(kv, heads // kv, D, *rest), k.reshape(kv, 1, D, *rest), v.reshape(kv, 1, D, *rest)],
                     1).reshape(-1, *rest)


_CODEGEN_MP = 4  # CodeGen's qkv_proj: this many model-parallel blocks, each its heads' [q; v; k]
_CODEGEN_QKV = re.compile(r"(.*\.)self_attn\.qkv_proj\.weight")


def _codegen_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """A CodeGen checkpoint's weights under the model's names (GPT-J's, its ``qkv_proj`` split: rows of 4 blocks,
    each ``[q; v; k]`` of its quarter of the heads), or with ``inverse`` back (joined)."""
    pairs = list(_FAMILY_NAMES["gptj"].items()) + [(".attn.qkv_proj.", ".self_attn.qkv_proj.")]
    out = {}
    if not inverse:
        for name, t in _renamed(sd, pairs).items():
            if (m := _CODEGEN_QKV.fullmatch(name)) is not None:
                q, v, k = t.reshape(_CODEGEN_MP, 3, -1, t.shape[-1]).unbind(1)
                out.update({f"{m[1]}self_attn.{p}_proj.weight": w.reshape(-1, t.shape[-1]).clone()
                            for p, w in zip("qkv", (q, k, v))})
            else:
                out[name] = t
        return out
    def join(q, k, v):  # (4 blocks of [q; v; k])
        blocks = [w.reshape(_CODEGEN_MP, -1, w.shape[-1]) for w in (q, v, k)]
        return torch.stack(blocks, 1).reshape(-1, q.shape[-1])

    return _renamed(_qkv_joined(sd, join, "weight"), [(new, old) for old, new in pairs])


def _qkv_joined(sd: dict, join, kinds: str) -> dict:
    """``sd`` with each layer's ``self_attn.{q,k,v}_proj.{kind}`` (``kind`` of ``kinds``, a regex alternative) as one
    ``self_attn.qkv_proj.{kind}``, ``join(q, k, v)``; a projection without the other two kept as it is (reported as
    unexpected)."""
    out = {}
    for name, t in sd.items():
        m = re.fullmatch(rf"(.*\.)self_attn\.([qkv])_proj\.({kinds})", name)
        if m is None:
            out[name] = t
            continue
        parts = [f"{m[1]}self_attn.{p}_proj.{m[3]}" for p in "qkv"]
        if not all(part in sd for part in parts):
            out[name] = t
        elif m[2] == "q":
            out[f"{m[1]}self_attn.qkv_proj.{m[3]}"] = join(*(sd[part] for part in parts))
    return out


# GPT-2's and GPT-BigCode's checkpoints' names -> the model's (c_attn: q, k and v as one, split below); GPT-2's Conv1D
# weights ([in, out])
_GPT2_NAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.wpe.", "model.embed_positions."),
               ("transformer.h.", "model.layers."), ("transformer.ln_f.", "model.norm."),
               (".ln_1.", ".input_layernorm."), (".ln_2.", ".post_attention_layernorm."),
               (".attn.c_attn.", ".self_attn.qkv_proj."), (".attn.c_proj.", ".self_attn.o_proj."),
               (".mlp.c_fc.", ".mlp.up_proj."), (".mlp.c_proj.", ".mlp.down_proj."))
_GPT2_CONV1D = re.compile(r".*\.(self_attn\.(qkv|o)_proj|mlp\.(up|down)_proj)\.weight")
_GPT2_UNPREFIXED = ("wte.", "wpe.", "h.", "ln_f.")  # (gpt2's own checkpoints: GPT2Model's names, no transformer.)
# GPT-1's: GPT-2's layer names, its embeddings' own, no final norm (OpenAIGPTModel's unprefixed too)
_OPENAI_NAMES = (("transformer.tokens_embed.", "model.embed_tokens."),
                 ("transformer.positions_embed.", "model.embed_positions."), *_GPT2_NAMES[2:3],
                 *_GPT2_NAMES[4:])
_OPENAI_UNPREFIXED = ("tokens_embed.", "positions_embed.", "h.")


def _gpt2_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """A GPT-2, GPT-1 or GPT-BigCode checkpoint's weights under the model's names (unprefixed ones, as gpt2's own,
    read as under ``transformer.``; GPT-2's and GPT-1's Conv1D weights transposed; ``c_attn`` split into q, k and v,
    rows and bias: GPT-2's, GPT-1's and GPT-BigCode's multi-query ``[q; k; v]``, GPT-BigCode's multi-head per head),
    or with ``inverse`` back
    (transformers' names and layout)."""
    conv1d = config.model_type in ("gpt2", "openai-gpt")  # (GPT-BigCode's are nn.Linear's)
    names, unprefixed = (_OPENAI_NAMES, _OPENAI_UNPREFIXED) if config.model_type == "openai-gpt" else (
        _GPT2_NAMES, _GPT2_UNPREFIXED)
    H, KV, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_head = config.model_type == "gpt_bigcode" and KV == H > 1
    out = {}
    if not inverse:
        sd = {(f"transformer.{k}" if k.startswith(unprefixed) else k): t for k, t in sd.items()}
        for name, t in _renamed(sd, names).items():
            if conv1d and _GPT2_CONV1D.fullmatch(name):
                t = t.t().contiguous()
            if (m := re.fullmatch(r"(.*\.)self_attn\.qkv_proj\.(weight|bias)", name)) is not None:
                if t.shape[0] != (H + 2 * KV) * D:
                    raise ValueError(f"{name} has {t.shape[0]} rows: {H} query and 2 x {KV} key / value heads of "
                                     f"{D} expected")
                parts = t.unflatten(0, (H, 3, D)).unbind(1) if per_head else t.split((H * D, KV * D, KV * D))
                out.update({f"{m[1]}self_attn.{p}_proj.{m[2]}": w.reshape(-1, *t.shape[1:]).clone()
                            for p, w in zip("qkv", parts)})
            else:
                out[name] = t
        return out

    def join(q, k, v):  # (GPT-BigCode's multi-head layout: per head [q_h; k_h; v_h]; else [q; k; v])
        return torch.stack([w.unflatten(0, (H, D)) for w in (q, k, v)], 1).flatten(0, 2) if per_head else \
            torch.cat([q, k, v])

    out = _qkv_joined(sd, join, "weight|bias")
    if conv1d:
        out = {name: t.t().contiguous() if _GPT2_CONV1D.fullmatch(name) else t for name, t in out.items()}
    return _renamed(out, [(new, old) for old, new in names])


def _falcon_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """A Falcon, BLOOM or MPT checkpoint's weights under the model's names (:data:`_QKV_NAMES`: its one q / k / v
    tensor split by :func:`falcon_qkv_split`; Falcon's parallel block's two norms, ln_attn and ln_mlp, as the model's
    two; BLOOM's unprefixed names, as bigscience's own, read as under ``transformer.``), or with ``inverse`` back (a
    projection missing from a q / k / v triple is left as it is: reported as unexpected)."""
    pairs, unprefixed = _QKV_NAMES[config.model_type]
    pairs += _FALCON_NORMS if config.model_type == "falcon" and config.parallel_norms else ()
    out = {}
    if not inverse:
        sd = {(f"transformer.{k}" if k.startswith(unprefixed) else k): t for k, t in sd.items()}
        for name, t in _renamed(sd, pairs).items():
            if (m := re.fullmatch(r"(.*\.)self_attn\.qkv_proj\.(weight|bias)", name)) is not None:
                q, k, v = falcon_qkv_split(config, t)
                out.update({f"{m[1]}self_attn.{p}_proj.{m[2]}": w for p, w in zip("qkv", (q, k, v))})
            else:
                out[name] = t
        return out
    out = _qkv_joined(sd, lambda *parts: falcon_qkv_join(config, parts), "weight|bias")
    return _renamed(out, [(new, old) for old, new in pairs])


# DBRX's checkpoint names (transformer.*) -> the model's; its Wqkv split, its stacked experts (w1 gate, v1 up, w2 down
# as [experts * width, hidden]: each expert's down projection transposed) per expert
_DBRX_NAMES = (("transformer.wte.", "model.embed_tokens."), ("transformer.norm_f.", "model.norm."),
               ("transformer.blocks.", "model.layers."), (".norm_attn_norm.norm_1.", ".input_layernorm."),
               (".norm_attn_norm.norm_2.", ".post_attention_layernorm."),
               (".norm_attn_norm.attn.out_proj.", ".self_attn.o_proj."), (".ffn.router.layer.", ".mlp.gate."))
_DBRX_QKV = re.compile(r"(.*\.)norm_attn_norm\.attn\.Wqkv\.weight")
_DBRX_EXPERTS = re.compile(r"(.*\.)ffn\.experts\.mlp\.(w1|v1|w2)")
_DBRX_OWN_EXPERT = re.compile(r"(.*\.)mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def _dbrx_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """A DBRX checkpoint's weights under the model's names (its Wqkv split into q, k and v; its stacked experts one by
    one as Mixtral's are read), or with ``inverse`` back."""
    D, kv, E = config.head_dim, config.num_key_value_heads, config.experts.count
    rows = (config.num_attention_heads * D, kv * D, kv * D)
    if not inverse:
        out = {}
        for name, t in _renamed(sd, _DBRX_NAMES).items():
            if (m := _DBRX_QKV.fullmatch(name)) is not None:
                out.update({f"{m[1]}self_attn.{p}_proj.weight": w.clone() for p, w in zip("qkv", t.split(rows))})
            elif (m := _DBRX_EXPERTS.fullmatch(name)) is not None:
                kind = {"w1": "gate", "v1": "up", "w2": "down"}[m[2]]
                for e, w in enumerate(t.reshape(E, -1, t.shape[-1])):
                    out[f"{m[1]}mlp.experts.{e}.{kind}_proj.weight"] = (w.t() if kind == "down" else w).contiguous()
            else:
                out[name] = t
        return out
    out, stacks = {}, {}
    for name, t in sd.items():
        if (m := _DBRX_OWN_EXPERT.fullmatch(name)) is not None:
            stacks.setdefault((m[1], m[3]), {})[int(m[2])] = t.t() if m[3] == "down" else t
        elif re.fullmatch(r".*\.self_attn\.[qkv]_proj\.weight", name):
            stem = name.rsplit(".self_attn.", 1)[0]
            if name.endswith("q_proj.weight") and all(f"{stem}.self_attn.{p}_proj.weight" in sd for p in "kv"):
                out[f"{stem}.norm_attn_norm.attn.Wqkv.weight"] = torch.cat(
                    [sd[f"{stem}.self_attn.{p}_proj.weight"] for p in "qkv"])
            elif not all(f"{stem}.self_attn.{p}_proj.weight" in sd for p in "qkv"):
                out[name] = t
        else:
            out[name] = t
    for (stem, kind), parts in stacks.items():
        w = {"gate": "w1", "up": "v1", "down": "w2"}[kind]
        out[f"{stem}ffn.experts.mlp.{w}"] = torch.cat([parts[e] for e in range(len(parts))]).contiguous()
    return _renamed(out, [(new, old) for old, new in _DBRX_NAMES])


def _weightless_norm_shapes(config: LlamaConfig) -> dict:
    """NanoChat's norms (none has a weight in its checkpoints): the model's norm weights' names and shapes."""
    h, d = config.hidden_size, config.head_dim
    names = {"model.norm.weight": h}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        names.update({p + "input_layernorm.weight": h, p + "post_attention_layernorm.weight": h,
                      p + "self_attn.q_norm.weight": d, p + "self_attn.k_norm.weight": d})
    return names


def _weightless_norms(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """``sd`` with a weight of ones for each of a NanoChat checkpoint's weightless norms (``w * x`` is ``x``: exact), in
    the embeddings' dtype; with ``inverse``, the model's dropped, which must be all ones (a norm weight of other values
    has no place in such a checkpoint: raises naming it)."""
    shapes = _weightless_norm_shapes(config)
    if inverse:
        for name in shapes:
            if name in sd and not bool((sd[name] == 1).all()):
                raise ValueError(f"{name}: a {config.model_type} checkpoint's norms have no weight, but this model's "
                                 "is not all ones: it cannot be saved in that layout")
        return {k: v for k, v in sd.items() if k not in shapes}
    if there := [k for k in shapes if k in sd]:
        raise ValueError(f"a {config.model_type} checkpoint's norms have no weight, but it holds {there[0]}")
    ref = sd.get("model.embed_tokens.weight")
    dtype = torch.float32 if ref is None else ref.dtype
    return {**sd, **{k: torch.ones(n, dtype=dtype) for k, n in shapes.items()}}


_AXK1_NORM = re.compile(r"(model\.layers\.(\d+)\.)(mlp\.)?post_mlp_layernorm\.weight")


def _axk1_norms(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """A.X-K1's checkpoints hold each sparse MLP's output norm as its layer's ``post_mlp_layernorm`` (transformers'
    module and the model's: ``mlp.post_mlp_layernorm``), or back with ``inverse``. A dense layer's, which transformers'
    model has no module for (it ignores the weight on loading), is dropped likewise."""
    sparse, out = config.experts.layers, {}
    for name, t in sd.items():
        m = _AXK1_NORM.fullmatch(name)
        if m is None or int(m[2]) >= len(sparse):
            out[name] = t
        elif inverse:
            out[f"{m[1]}post_mlp_layernorm.weight"] = t
        elif sparse[int(m[2])]:
            out[f"{m[1]}mlp.post_mlp_layernorm.weight"] = t
    return out


# Hunyuan V3's checkpoints: its router (mlp.router.gate), correction bias (mlp.expert_bias; transformers' module:
# mlp.e_score_correction_bias) and shared experts (mlp.shared_mlp) -> DeepSeek's names (then _deepseek_names: the
# model's)
_HY_V3_NAMES = ((".mlp.router.gate.weight", ".mlp.gate.weight"),
                (".mlp.expert_bias", ".mlp.gate.e_score_correction_bias"),
                (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"),
                (".mlp.shared_mlp.", ".mlp.shared_experts."))


# JetMoE's checkpoint names: its attention's (self_attention: kv_proj, k's rows then v's; its experts' query and output
# projections stacked, [E, heads * head_dim, H] and [E, H, heads * head_dim], their router and bias) and its MLP's
# mixture (GraniteMoE's names without block_sparse_moe: _expert_names reads them as GraniteMoE's)
_JETMOE_ATTENTION = re.compile(r"(.*\.)self_attention\.(kv_proj\.weight|experts\.(input_linear\.weight|"
                               r"output_linear\.weight|router\.layer\.weight|bias))")
_JETMOE_MLP = re.compile(r"(.*\.)(mlp|block_sparse_moe)\.(input_linear\.weight|output_linear\.weight|"
                         r"router\.layer\.weight)")
_JETMOE_OURS = re.compile(r"(.*\.)self_attn\.(k_proj\.weight|v_proj\.weight|q_experts\.(\d+)\.weight|"
                          r"o_experts\.(\d+)\.weight|router\.weight|o_bias)")


def _jetmoe_names(sd: dict, inverse: bool = False) -> dict:
    """A JetMoE checkpoint's weights under the model's names (:class:`~triforce.models.llama.MixtureOfAttention`'s
    ``k_proj`` / ``v_proj``, ``q_experts.{e}`` / ``o_experts.{e}``, ``router``, ``o_bias``; its MLP's under GraniteMoE's
    checkpoint names), or with ``inverse`` back (the experts stacked, ``kv_proj`` joined)."""
    out, stacks = {}, {}
    for name, t in sd.items():
        if not inverse and (m := _JETMOE_ATTENTION.fullmatch(name)) is not None:
            stem, part = f"{m[1]}self_attn.", m[2]
            if part == "kv_proj.weight":
                out[f"{stem}k_proj.weight"], out[f"{stem}v_proj.weight"] = (w.clone() for w in t.chunk(2))
            elif part in ("experts.input_linear.weight", "experts.output_linear.weight"):
                kind = "q" if part == "experts.input_linear.weight" else "o"
                out.update({f"{stem}{kind}_experts.{e}.weight": w.clone() for e, w in enumerate(t)})
            else:
                out[stem + ("router.weight" if part == "experts.router.layer.weight" else "o_bias")] = t
        elif (m := _JETMOE_MLP.fullmatch(name)) is not None:
            out[f"{m[1]}{'mlp' if inverse else 'block_sparse_moe'}.{m[3]}"] = t
        elif inverse and (m := _JETMOE_OURS.fullmatch(name)) is not None:
            stem, part = f"{m[1]}self_attention.", m[2]
            if part in ("k_proj.weight", "v_proj.weight"):
                stacks.setdefault((stem, "kv"), {})[part[0]] = t
            elif m[3] is not None or m[4] is not None:
                stacks.setdefault((stem, "q" if m[3] is not None else "o"), {})[int(m[3] or m[4])] = t
            else:
                out[stem + ("experts.router.layer.weight" if part == "router.weight" else "experts.bias")] = t
        else:
            out[name] = t
    for (stem, kind), parts in stacks.items():
        if kind == "kv":
            out[f"{stem}kv_proj.weight"] = torch.cat([parts["k"], parts["v"]])
        else:
            linear = "input_linear" if kind == "q" else "output_linear"
            out[f"{stem}experts.{linear}.weight"] = torch.stack([parts[e] for e in range(len(parts))])
    return out


# LFM2's checkpoint names -> the model's, in this order (saving: the pairs reversed, in the reverse order, so that its
# attention's out_proj, the model's o_proj, goes back before the convolutions' out_proj takes that name)
# (LFM2-MoE's: its mixtures under feed_forward too, their router gate, expert_bias the router's correction bias, its
# hub checkpoints' experts one by one of w1 / w3 / w2)
# LFM3's: LFM2's but its attention's own (Qwen3's q_norm / k_norm / o_proj) and, with its sandwich norms, Gemma 3's
_LFM3_PAIRS = (("model.embedding_norm.", "model.norm."), (".operator_norm.", ".input_layernorm."),
               (".ffn_norm.", ".post_attention_layernorm."), (".feed_forward.w1.", ".mlp.gate_proj."),
               (".feed_forward.w3.", ".mlp.up_proj."), (".feed_forward.w2.", ".mlp.down_proj."),
               (".conv.in_proj.", ".self_attn.in_proj."),
               (".conv.conv.", ".self_attn.conv."), (".conv.out_proj.", ".self_attn.out_proj."),
               (".self_attn.gate_proj.", ".self_attn.g_proj."))  # (its checkpoints' name of the heads' gate)
_LFM3_PAIRS_SANDWICH = (("model.embedding_norm.", "model.norm."), (".operator_norm.", ".input_layernorm."),
                        (".post_operator_norm.", ".post_attention_layernorm."),
                        (".post_ffn_norm.", ".post_feedforward_layernorm."),
                        (".ffn_norm.", ".pre_feedforward_layernorm."), *_LFM3_PAIRS[3:])
_LFM2_PAIRS = (("model.embedding_norm.", "model.norm."), (".operator_norm.", ".input_layernorm."),
               (".ffn_norm.", ".post_attention_layernorm."), (".feed_forward.", ".mlp."),
               (".mlp.expert_bias", ".mlp.gate.e_score_correction_bias"), (".w1.", ".gate_proj."),
               (".w3.", ".up_proj."), (".w2.", ".down_proj."),
               (".self_attn.out_proj.", ".self_attn.o_proj."), (".self_attn.q_layernorm.", ".self_attn.q_norm."),
               (".self_attn.k_layernorm.", ".self_attn.k_norm."), (".conv.in_proj.", ".self_attn.in_proj."),
               (".conv.conv.", ".self_attn.conv."), (".conv.out_proj.", ".self_attn.out_proj."))


def _hy_v3_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """Hunyuan V3's checkpoint names as DeepSeek's (:data:`_HY_V3_NAMES`), its multi-token prediction layer (the
    layers past the model's) dropped as transformers drops it; or back with ``inverse``."""
    if inverse:
        return _renamed(sd, [(ours, theirs) for theirs, ours in _HY_V3_NAMES
                             if theirs != ".mlp.e_score_correction_bias"])
    n = config.num_hidden_layers
    kept = {k: t for k, t in sd.items() if (m := _LAYER_INDEX.match(k)) is None or int(m[1]) < n}
    return _renamed(kept, _HY_V3_NAMES)


def _norm_names(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """``sd`` with a GLM-4 checkpoint's norms (a Hunyuan checkpoint's q / k norms, router and shared expert; a
    StarCoder 2 checkpoint's MLP; StableLM's per-head q / k norms) under the model's names, or back with ``inverse``;
    ``sd`` itself for every other family."""
    if config.model_type == "stablelm":
        return _stablelm_head_norms(sd, inverse)
    if config.model_type == "axk1":
        return _axk1_norms(config, sd, inverse)
    if config.model_type == "codegen":
        return _codegen_names(config, sd, inverse)
    if config.model_type in ("gpt2", "gpt_bigcode", "openai-gpt"):
        return _gpt2_names(config, sd, inverse)
    if config.model_type == "xglm":  # (its sinusoidal positions: computed on loading, never saved)
        pairs = list(_FAMILY_NAMES["xglm"].items())
        sd = {k: t for k, t in sd.items() if not k.startswith("model.embed_positions.")}
        if inverse:
            return _renamed(sd, [(new, old) for old, new in pairs])
        return {**_renamed(sd, pairs), "model.embed_positions.weight": sinusoidal_table(config)}
    if config.model_type == "opt" and not inverse:  # (facebook's own checkpoints: OPTModel's names, no model.)
        sd = {(f"model.{k}" if k.startswith("decoder.") else k): t for k, t in sd.items()}
    if config.model_type == "hy_v3":
        return _hy_v3_names(config, sd, inverse)
    if config.model_type == "laguna":  # (its correction bias under its experts; transformers' shared_experts read too)
        pairs = [(".mlp.experts.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")]
        return _renamed(sd, [(b, a) for a, b in pairs] if inverse else pairs + [(".mlp.shared_experts.",
                                                                                ".mlp.shared_expert.")])
    if config.model_type == "mellum" and not inverse:  # (its prediction head: skipped, as transformers skips it)
        return {k: t for k, t in sd.items() if not k.startswith("mtp.")}
    if config.model_type in _QKV_NAMES:
        return _falcon_names(config, sd, inverse)
    if config.model_type == "dbrx":
        return _dbrx_names(config, sd, inverse)
    if config.model_type == "jetmoe":
        return _jetmoe_names(sd, inverse)
    if config.model_type in _DELTA_FAMILIES:
        return _delta_names(config, sd, inverse)
    if config.model_type in ("lfm2", "lfm2_moe"):
        return _renamed(sd, [(b, a) for a, b in reversed(_LFM2_PAIRS)] if inverse else _LFM2_PAIRS)
    if config.model_type == "lfm3":  # (LFM2's names; its attention Qwen3's; its sandwich norms Gemma 3's)
        pairs = _LFM3_PAIRS_SANDWICH if config.sandwich_norms else _LFM3_PAIRS
        return _renamed(sd, [(b, a) for a, b in reversed(pairs)] if inverse else pairs)
    if config.model_type in ("granitemoehybrid", "bamba") and config.mamba is not None:  # (its Mamba layers' module:
        sd = {(_MAMBA_OURS.sub(r"\1.mamba.\2", k) if inverse else k.replace(".mamba.", ".self_attn.")): t  # mamba)
              for k, t in sd.items()}
    if config.model_type in ("mamba2", "nemotron_h", "mamba", "falcon_mamba"):
        # (backbone.*: its embeddings, layers' norm and mixer, final norm_f; Nemotron-H's model.*, its MLP and mixture
        # blocks' mixer our mlp)
        prefix = "model" if config.model_type == "nemotron_h" else "backbone"
        table = [(a, b.replace("PREFIX", prefix)) for a, b in _MAMBA2_BACK] if inverse else _MAMBA2_NAMES
        mlps = {i for i, t in enumerate(config.block_types) if t in ("mlp", "moe")}
        out = {}
        for name, t in sd.items():
            m = _LAYER_INDEX.match(name)
            if inverse and m is not None and int(m[1]) in mlps:
                name = name.replace(".mlp.", ".self_attn.")
            for pattern, repl in table:
                name = re.sub(pattern, repl, name)
            m = _LAYER_INDEX.match(name)
            if not inverse and m is not None and int(m[1]) in mlps:
                name = name.replace(".self_attn.", ".mlp.")
            out[name] = t
        return out
    if config.model_type == "falcon_h1":  # (Bamba's names; its multipliers folded into the weights)
        return _falcon_h1_names(config, sd, inverse)
    if config.model_type == "kimi_linear":  # (moonshotai's names read; transformers' stacked experts written)
        return _kimi_names(sd, inverse)
    if config.model_type == "bamba":  # (its MLP feed_forward after pre_ff_layernorm; its final norm final_layernorm)
        return _renamed(sd, [(b, a) for a, b in reversed(_BAMBA_PAIRS)] if inverse else _BAMBA_PAIRS)
    if config.model_type == "jamba":  # (Bamba's names; its Mamba layers' module mamba, its mixture's router router)
        if inverse:
            sd = {_MAMBA1_OURS.sub(r"\1.mamba.\2", k): t for k, t in sd.items()}
            return _renamed(sd, [(b, a) for a, b in reversed(_JAMBA_PAIRS)])
        return _renamed({k.replace(".mamba.", ".self_attn."): t for k, t in sd.items()}, _JAMBA_PAIRS)
    if config.model_type == "granitemoehybrid" and config.experts is None:  # (its MLP's names; its mixture's:
        return _granite_dense_names(sd, inverse)  # _expert_names, GraniteMoeShared's)
    if config.model_type == "modernbert-decoder":
        return _renamed(sd, _MODERNBERT_BACK if inverse else _MODERNBERT_NAMES)
    if config.model_type in _FAMILY_NAMES:
        sd = _renamed(sd, [(v, k) if inverse else (k, v) for k, v in _FAMILY_NAMES[config.model_type].items()])
        return _weightless_norms(config, sd, inverse) if FAMILIES[config.model_type].weightless_norms else sd
    if config.model_type == "hyperclovax" and config.sandwich_norms:
        table = _HYPERCLOVAX_NORMS
    elif config.model_type == "glm4":
        table = _GLM4_NORMS
    elif config.model_type == "kolibri1":  # (its tables one per direction: two names of each norm are read)
        theirs, ours = _KOLIBRI_BIAS
        sd = _renamed(sd, [(ours, theirs) if inverse else (theirs, ours)])
        return _layer_norms_renamed(sd, _KOLIBRI_NORMS_BACK if inverse else _KOLIBRI_NORMS)
    else:
        return sd
    return _layer_norms_renamed(sd, {v: k for k, v in table.items()} if inverse else table)


def _layer_norms_renamed(sd: dict, table: dict) -> dict:
    """``sd`` with each layer's norm named a key of ``table`` renamed to its value."""
    out = {}
    for name, t in sd.items():
        m = _LAYER_NORM_NAME.fullmatch(name)
        out[m[1] + table[m[2]] + m[3] if m and m[2] in table else name] = t
    return out


def rotary_order(config: LlamaConfig) -> torch.Tensor | None:
    """Partial RoPE: int64 ``[head_dim]``, the checkpoint's dim of each of the model's q / k head dims, or None
    when RoPE rotates the whole head. A checkpoint rotates its dims ``i`` and ``i + r/2`` together (``i < r/2``;
    GLM-4's, ``config.rope_interleaved``: ``2i`` and ``2i + 1``, so its order is never None),
    ``r = config.rotary_dim``) and leaves ``r .. head_dim - 1`` as they are; the model's RoPE pairs ``j`` and
    ``j + head_dim/2``. So the model's dims ``j`` and ``j + head_dim/2`` hold the checkpoint's ``j`` and
    ``j + r/2`` for ``j < r/2``, and the unrotated dims, half in each half, after: the same scores (a dot
    product in another order), and the unrotated pairs take angle 0 (:func:`triforce.models.rope.rope_inv_freq`).
    NanoChat's RoPE turns the other way (``config`` family's ``rope_reversed``): its halves swapped."""
    D, r = config.head_dim, config.rotary_dim
    h, rest = r // 2, (D - r) // 2
    if FAMILIES[config.model_type].rope_reversed:  # (NanoChat: RoPE by -angle on (i, i + D/2) is RoPE by +angle on
        if r != D:  # (i + D/2, i): its halves swapped)
            raise ValueError(f"model_type {config.model_type!r} turns the whole head (rotary_dim {r} != {D})")
        return torch.tensor([*range(h, D), *range(h)])
    if config.rope_interleaved:  # (GLM-4: its pairs are dims 2i and 2i + 1)
        return torch.tensor([*range(0, r, 2), *range(r, r + rest), *range(1, r, 2), *range(r + rest, D)])
    if r == D:
        return None
    first = [*range(h), *range(r, r + rest)]
    return torch.tensor(first + [*range(h, r), *range(r + rest, D)])


def _order_rotary_dims(config: LlamaConfig, sd: dict, inverse: bool = False) -> dict:
    """``sd`` with each q / k head's dims (projection rows and biases, q / k norm weights) in the model's order
    (:func:`rotary_order`), or back in the checkpoint's with ``inverse``; ``sd`` itself without partial RoPE."""
    if config.mla is not None:
        return _order_mla_rope(config, sd, inverse)
    order = rotary_order(config)
    if order is None:
        return sd
    if inverse:
        order = torch.argsort(order)
    D = config.head_dim
    out = dict(sd)
    for name, t in sd.items():
        m = _LAYER_INDEX.match(name)  # (Laguna: its sliding layers' RoPE turns the whole head: their dims as they are)
        if config.model_type == "laguna" and m is not None and int(m[1]) < len(config.rope_layers) \
                and not config.rope_layers[int(m[1])]:
            continue
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_proj.bias",
                          "self_attn.k_proj.bias")):
            out[name] = t.reshape(-1, D, *t.shape[1:])[:, order.to(t.device)].reshape(t.shape)
        elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight", "self_attn.q_norm.bias",
                            "self_attn.k_norm.bias")):
            # [head_dim]; Cohere's [heads, head_dim]; MiniMax-M2's over the whole projection, [heads * head_dim]; Phi's
            # LayerNorm's bias
            out[name] = t.reshape(-1, D)[:, order.to(t.device)].reshape(t.shape)
    return out


_SINGLE, _INDEX = "model.safetensors", "model.safetensors.index.json"
_PT_SINGLE, _PT_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def _weight_files(directory: Path) -> list:
    """The files that hold the model, as transformers picks them: ``model.safetensors``, else the shards named
    by ``model.safetensors.index.json``'s ``weight_map``; without those, PyTorch's ``pytorch_model.bin``, else
    the shards of ``pytorch_model.bin.index.json`` (older checkpoints, e.g. JackFram/llama-68m, the TriForce
    paper's draft). Other ``*.safetensors`` beside them (e.g. Mistral's ``consolidated.safetensors``, the
    same weights under other names) are not read. A directory with none of these reads every
    ``*.safetensors`` file in it."""
    for single, index in ((_SINGLE, _INDEX), (_PT_SINGLE, _PT_INDEX)):
        if (directory / single).is_file():
            return [directory / single]
        files = _index_shards(directory, directory / index)
        if files:
            return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{str(directory)!r} has no weights (model.safetensors, its index, "
                                "pytorch_model.bin, its index or any *.safetensors)")
    return files


def _index_shards(directory: Path, index: Path) -> list:
    """The shard files that ``index`` (a transformers ``*.index.json``) names, each once; none without it."""
    if not index.is_file():
        return []
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(index)!r} is not a weight index (a JSON object with a 'weight_map' "
                         f"of weight name -> file): {e!r}") from None
    files = []
    for name in names:
        f = directory / name if isinstance(name, str) else None
        if f is None or Path(name).name != name or not f.is_file():
            raise FileNotFoundError(f"{str(index)!r} names the shard {name!r}, which is not a file in "
                                    f"{str(directory)!r}")
        files.append(f)
    return files


# An image + text wrapper's (config.WRAPPERS) language model under the names of the text model: transformers
# 4.x's and Google's layout (language_model.model.*, language_model.lm_head.*), transformers 5's in memory
# (model.language_model.*); its image side is not read. transformers 5.23's save_pretrained of Kimi K2.5 names the
# language model's layers language_model.model.blocks.* (its vision tower's renaming, undone over them too), which
# it reads back as layers: so here.
_LANGUAGE_MODEL_PREFIXES = (("thinker.model.language_model.", "model."), ("thinker.model.", "model."),
                            ("thinker.lm_head.", "lm_head."),  # (Qwen's omni models: their thinker's)
                            ("language_model.model.blocks.", "model.layers."), ("language_model.model.", "model."),
                            ("language_model.lm_head.", "lm_head."), ("model.language_model.", "model."),
                            ("model.text_model.", "model."),  # (Idefics3's and SmolVLM's)
                            ("text_model.model.", "model."), ("text_model.lm_head.", "lm_head."))  # (Emu3's files)
_IMAGE_PREFIXES = ("vision_tower.", "multi_modal_projector.", "mm_projector.", "visual.", "image_newline",
                   "model.vision_tower.", "model.multi_modal_projector.", "model.mm_projector.", "model.visual.",
                   "model.image_newline", "model.vision_model.", "model.connector.", "vision_model.", "audio_tower.",
                   "model.audio_tower.", "mlp1.", "thinker.visual.", "thinker.audio_tower.", "thinker.model.visual.",
                   "thinker.model.audio_tower.", "talker.", "token2wav.", "code2wav.", "vision_embed_tokens.",
                   "model.vision_embed_tokens.",  # (the last two: Fuyu's patch embedding)
                   "vqmodel.", "model.vqmodel.")  # (Emu3's VQ-VAE)


_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.*)")


def _mllama_names(config: LlamaConfig, text: dict):
    """Llama 3.2 Vision's weight names -> its language model's without the cross-attention layers (``text``: its
    text_config): the wrapper's names as any wrapper's, each self-attention layer renumbered among them (the layers a
    text-only forward runs), a cross-attention layer's tensors (``None``) not read. Its embeddings' 8 image-token rows
    past the vocabulary are cut by :func:`_mllama_embeddings`."""
    cross = mllama_cross_layers(text)

    def rename(name: str) -> str | None:
        new = _language_model_name(name)
        m = _LAYER_NAME.fullmatch(new) if new is not None else None
        if m is None:
            return new
        i = int(m[1])
        return None if i in cross else f"model.layers.{i - sum(c < i for c in cross)}.{m[2]}"
    return rename


def _mllama_embeddings(config: LlamaConfig, sd: dict) -> dict:
    """Llama 3.2 Vision's embeddings (``vocab_size + 8`` rows: the image tokens' past the vocabulary, which a text
    forward never looks up) cut to the vocabulary."""
    e = sd.get("model.embed_tokens.weight")
    if e is not None:
        if e.shape[0] != config.vocab_size + 8:
            raise ValueError(f"Llama 3.2 Vision's model.embed_tokens.weight has {e.shape[0]} rows: vocab_size + 8 "
                             f"({config.vocab_size + 8}) expected")
        sd["model.embed_tokens.weight"] = e[:config.vocab_size].clone()
    return sd


def _qwen3_vl_moe_experts(config: LlamaConfig, sd: dict) -> dict:
    """A Qwen3-VL-MoE checkpoint's weights with each layer's stacked experts as transformers 5's modules hold them
    (:func:`_expert_names` reads that layout: ``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj``
    ``[E, H, I]``). Qwen's files hold each as its transpose (``[E, H, 2I]``, ``x @ W``, the gate's columns first;
    ``[E, I, H]``), transformers 5's ``save_pretrained`` as the modules: as transformers' conversion mapping reads
    them, a tensor of the module's shape is taken as it is (so a square one, ``H == 2I`` or ``H == I``, too), any
    other transposed."""
    h, i = config.hidden_size, config.experts.intermediate_size if config.experts else 0
    shapes = {"gate_up_proj": (2 * i, h), "down_proj": (h, i)}
    return {name: t.transpose(1, 2) if t.dim() == 3 and (m := _STACKED_EXPERTS.fullmatch(name)) is not None
            and tuple(t.shape[1:]) != shapes[m[2]] else t for name, t in sd.items()}


def _language_model_name(name: str) -> str | None:
    """A wrapper checkpoint's weight ``name`` as its language model names it; ``None`` for the image side's."""
    if name.startswith(_IMAGE_PREFIXES):
        return None
    for old, new in _LANGUAGE_MODEL_PREFIXES:
        if name.startswith(old):
            return new + name[len(old):]
    return name  # (lm_head.weight of transformers 5; anything else is reported as unexpected)


def _read_weights(f: Path, rename=None) -> dict:
    """The tensors of one weight file: safetensors, or a PyTorch checkpoint read with ``weights_only=True``
    (tensors and plain containers only: a pickle that would build any other object, and so could run code,
    raises instead), memory-mapped where its format allows. ``rename``: name -> the name to keep it under, or
    ``None`` to leave it out (a safetensors file's are then never read)."""
    if f.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        try:
            if rename is None:
                return load_file(f)
            with safe_open(f, "pt") as file:
                return {new: file.get_tensor(name) for name in file.keys()
                        if (new := rename(name)) is not None}
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"cannot read {str(f)!r} (corrupt or not safetensors): {e}") from None
    try:
        try:
            sd = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:  # the legacy (pre-zip) format cannot be memory-mapped
            if "mmap" not in str(e):
                raise
            sd = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle, zipfile and torch raise many kinds; all mean "unreadable"
        raise ValueError(f"cannot read {str(f)!r} as a PyTorch checkpoint of tensors only (corrupt, or it holds "
                         f"objects other than tensors): {type(e).__name__}: {e}") from None
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise ValueError(f"{str(f)!r} is not a state dict (a dict of weight name -> tensor)")
    if rename is not None:
        sd = {new: v for k, v in sd.items() if (new := rename(k)) is not None}
    return sd


_FLOAT32_WEIGHTS = (".e_score_correction_bias",)  # weights kept in float32 whatever the model's dtype
_NEOX_BUFFERS = (".attention.bias", ".attention.masked_bias", ".attn.bias", ".attn.masked_bias")  # (GPT-J's, GPT-2's,
# GPT-Neo's too)


def model_names(config: LlamaConfig, sd: dict, keep_head: bool = False) -> dict:
    """A checkpoint's weights ``sd`` under the model's names and in its layout: fused projections split, the
    family's norm and expert names, partial RoPE's and DeepSeek's rows reordered, gate and up rows joined; a tied
    head's weight dropped. Row operations only (the per-row scales of an FP8 checkpoint's weights follow their
    weights through it: quant.load_fp8); ``keep_head``: a tied head's weight kept too."""
    if config.model_type in ("gpt_neox", "gptj", "codegen", "gpt2", "gpt_neo",
                             "openai-gpt", "gpt_neox_japanese"):  # (old checkpoints' attention
        sd = {k: v for k, v in sd.items() if not k.endswith(_NEOX_BUFFERS)}  # buffers: a causal mask, its fill;
        # transformers drops or ignores them)
    if config.model_type == "persimmon":  # (its query_key_value is GPT-NeoX's, under its attention's name)
        sd = _renamed(sd, [_PERSIMMON_QKV])
    if config.model_type == "modernbert-decoder":  # (its Wi, [gate; up]: split as GLM-4's gate_up_proj)
        sd = _renamed(sd, [_MODERNBERT_WI])
    sd = _split_projections(config, dict(sd)) if FAMILIES[config.model_type].fused_projections else dict(sd)
    sd = _expert_names(config, _order_rotary_dims(config, _norm_names(config, sd)))
    if config.tie_word_embeddings and not keep_head:
        sd.pop("lm_head.weight", None)
    return sd


def _untie_a_head_of_its_own(config: LlamaConfig, sd: dict) -> LlamaConfig:
    """``config``, untied where it ties the head to the embeddings but the weights ``sd`` (the model's names) hold a
    head of other values: as transformers 5 loads such a checkpoint (``PreTrainedModel.tie_weights``: the config is
    wrong about the checkpoint, whose head is kept; it warns, and so does this). A head equal to the embeddings (a
    PyTorch ``.bin`` file holds both, one storage) leaves the model tied."""
    head, embed = sd.get("lm_head.weight"), sd.get("model.embed_tokens.weight")
    if not config.tie_word_embeddings or head is None or embed is None or (
            head.shape == embed.shape and torch.equal(head, embed.to(head.dtype))):
        return config
    warnings.warn("the config ties the head to the embeddings (tie_word_embeddings), but the checkpoint holds "
                  "lm_head.weight of other values: loaded untied, with the checkpoint's head, as transformers 5 loads "
                  "it", stacklevel=3)
    return dataclasses.replace(config, tie_word_embeddings=False)


def _build(config: LlamaConfig, sd: dict, device, dtype, missing_ok=frozenset()):
    """The model of ``config`` holding ``sd``; parameters named in ``missing_ok`` may be absent and stay on the
    meta device (a caller that replaces their modules: ``triforce.models.quant.load_gguf_int8``)."""
    from .llama import Llama

    sd = model_names(config, sd, keep_head=True)
    if config.bitnet is not None and config.bitnet.get("linear_class") == "autobitlinear":  # (its weights ternary in
        from .bitnet import unpack_ternary  # the dtype, or packed as bitlinear's: unpacked, as transformers does)

        sd = {k: unpack_ternary(v, torch.float32) if v.dtype == torch.uint8 and k.endswith("_proj.weight") else v
              for k, v in sd.items()}
    config = _untie_a_head_of_its_own(config, sd)
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    model = Llama(config, _empty=True)  # meta tensors, nothing drawn: every weight is assigned below
    expected = {k for k in model.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - sd.keys() - set(missing_ok)), sorted(sd.keys() - expected)
    unexpected = [k for k in unexpected if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weights do not match the config: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    dtype = dtype or torch.float32
    for name, p in model.state_dict(keep_vars=True).items():
        if name in sd and tuple(sd[name].shape) != tuple(p.shape):
            raise ValueError(f"weight {name} has shape {list(sd[name].shape)}, the config implies {list(p.shape)}")
    # (a router's correction bias stays float32, as transformers keeps it: llama.Router; ERNIE 4.5's router weight)
    kept = _FLOAT32_WEIGHTS + ((".mlp.gate.weight",) if config.experts is not None and config.experts.float32_router
                               else ())
    if config.dsa is not None and dtype == torch.float16:  # (transformers' _keep_in_fp32_modules: in float16 only)
        kept += (".self_attn.indexer.weights_proj.weight",)
    if config.float32_sinks:  # (Flint's attention sinks: llama.Attention keeps them so too)
        kept += (".self_attn.sinks",)
    packed = config.bitnet is not None  # (BitNet's packed ternary weights stay uint8: triforce/models/bitnet.py)
    sd = {k: v.to(device=dev, dtype=v.dtype if packed and v.dtype == torch.uint8
                  else torch.float32 if k.endswith(kept) else dtype)
          for k, v in sd.items() if k in expected}
    model.load_state_dict(sd, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    from .rope import rope_inv_freq, rope_local_inv_freq
    model.inv_freq = rope_inv_freq(config, dev)
    model.inv_freq_local = rope_local_inv_freq(config, dev)
    model.inv_freq_long = None if config.rope_long_from is None else rope_inv_freq(config, dev, long=True)
    return model.eval()


def save_pretrained(model, directory) -> None:
    config, sd = model.config, model.state_dict()
    if config.tie_word_embeddings:  # (the embeddings' tensor again; not in a tied checkpoint)
        sd.pop("lm_head.weight", None)
    # the checkpoint's layout: q / k dims in its order (partial RoPE), Phi-3's projections fused
    sd = _expert_names(config, _order_rotary_dims(config, sd, inverse=True), inverse=True)
    sd = _norm_names(config, sd, inverse=True)
    if FAMILIES[config.model_type].fused_projections:
        sd = _join_projections(config, sd)
    if config.model_type == "persimmon":
        sd = _renamed(sd, [_PERSIMMON_QKV[::-1]])
    if config.model_type == "modernbert-decoder":
        sd = _renamed(sd, [_MODERNBERT_WI[::-1]])
    _write_hf_dir(Path(directory), config, sd)


def _write_hf_dir(directory: Path, config: LlamaConfig, sd: dict) -> None:
    """config.json + model.safetensors (last: a cache entry with it is complete), see :func:`publish`;
    other files in ``directory`` (a tokenizer) stay. ``sd``: in the checkpoint's layout (as :func:`read_gguf`
    gives it; :func:`_build` makes the model's)."""
    from safetensors.torch import save_file

    def write(tmp: Path):
        tensors = {k: v.detach().contiguous().cpu() for k, v in sd.items()
                   if not (config.tie_word_embeddings and k == "lm_head.weight")}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    publish(directory, write, last="model.safetensors")


# ---- GGUF
def open_gguf(path: Path):
    """The file's metadata and tensors (:class:`~triforce.models.gguf_file.GGUFFile`: as ``gguf.GGUFReader`` reads
    them, faster)."""
    from .gguf_file import GGUFFile

    try:
        reader = GGUFFile(str(path))
    except Exception as e:  # the readers raise ValueError/struct.error/IndexError on garbage
        raise ValueError(f"cannot read GGUF file {str(path)!r} (corrupt or truncated): "
                         f"{type(e).__name__}: {e}") from None
    return reader


def gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute`` (interleaved RoPE pairs -> half-split pairs), per head."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# GGUF architecture -> (model_type, whether llama.cpp's converter permuted attn_q / attn_k). llama.cpp
# runs llama-arch RoPE on interleaved pairs (hence the permutation; Mistral converts as llama), qwen2 /
# qwen3 / gemma on half-split pairs (NEOX), stored as in the Hugging Face checkpoint. llama.cpp's converter
# stores Gemma's RMSNorm weights as 1 + w (the factor they apply), which read_gguf turns back into w.
# gemma2 / gemma3: Gemma 2 and Gemma 3's language model, as llama.cpp runs them (_gguf_gemma). phi3: Phi-3 /
# Phi-3.5 / Phi-4(-mini), NEOX RoPE, its fused attn_qkv and ffn_up (gate and up) tensors split on loading, as
# llama.cpp runs it (_gguf_partial_rope, _gguf_longrope; its sliding window is ignored, as llama.cpp does).
# smollm3: SmolLM3, converted as llama (permuted q / k), every 4th layer without RoPE (llama.cpp's fixed
# n_no_rope_layer_step, SmolLM3Config's default no_rope_layer_interval).
# granite: IBM Granite 3.x dense, converted as llama (permuted q / k), with its four multipliers (_GGUF_GRANITE).
# mistral3: what llama.cpp's converter now writes for Mistral3ForConditionalGeneration (Mistral Small 3.1 / 3.2:
# llama's tensors, permuted q / k, no window), run as llama; with attention.temperature_scale it is Ministral 3
# (Ministral3ForCausalLM: the same tensors, YaRN and the query temperature; _gguf_ministral3).
# gpt-oss: GPT-OSS as llama.cpp runs it (NEOX RoPE, so not permuted): its attention sinks (attn_sinks), the norm
# before the MLP named post_attention_norm, the router's and the experts' biases, the experts in MXFP4 blocks (the
# gguf package dequantises them) or any other type, gate and up apart or as one ffn_gate_up_exps (gate first), the
# window attention.sliding_window on every other layer from the first (llama.cpp's fixed pattern), the clamped
# SwiGLU's alpha 1.702 and limit 7.0 (fixed there too), YaRN with its ramp ends rounded outwards (llama.cpp's).
# olmo2: OLMo 2 (NEOX RoPE, so not permuted; post_attention_norm and post_ffw_norm after the blocks, no norm before
# them) and, with attention.sliding_window, OLMo 3: llama.cpp slides three of every four layers (a fixed pattern; the
# converter's sliding_window_pattern must say the same) and runs them on plain RoPE at the file's base, its scaling
# on the others only (read_gguf).
# glm4: GLM-4 (Glm4ForCausalLM) as llama.cpp's converter writes it: its q / k rows as the checkpoint holds them (RoPE on
# adjacent pairs, which llama.cpp runs as "normal" RoPE; _build reorders them as a checkpoint's: rotary_order), the
# rotated dims rope.dimension_count (_gguf_partial_rope), Gemma's tensor names for its four norms, gate and up as one
# ffn_up (gate first).
# seed_oss: Seed-OSS (NEOX RoPE, so not permuted; the norm before the MLP named post_attention_norm; q/k/v biases,
# o's where the file has them).
# exaone4: EXAONE 4 as llama.cpp runs it (NEOX RoPE, so not permuted; OLMo 2's tensor names): a window only in a
# 64-layer file (EXAONE-4.0-32B: attention.sliding_window, default 4096, on three of every four layers, llama.cpp's
# fixed pattern), its sliding layers alone with RoPE; every other file full attention with RoPE on every layer.
# ernie4_5: ERNIE 4.5 as llama.cpp's converter writes it: Llama's tensor names (no biases: llama.cpp has none), q / k
# rows as the checkpoint holds them (RoPE on consecutive pairs; _build reorders them: rotary_order). ernie4_5-moe: the
# same with its mixtures (_gguf_ernie_moe), the router's correction bias as exp_probs_b.
# command-r: Cohere (Command R, Aya) as llama.cpp runs it: cohere2's layer with RoPE on every layer and no window.
# gptneox: GPT-NeoX / Pythia (NEOX RoPE, not permuted): its attn_qkv rows [q; k; v] re-interleaved per head as its
# checkpoints hold them (_gguf_neox_qkv), use_parallel_residual read, the MLP's biases always.
# olmo: OLMo 1 as llama.cpp's converter writes it (llama's permuted q / k rows, no norm tensors: its LayerNorms have
# no weights; attention.clamp_kqv its clip_qkv).
# cohere2: Cohere 2 (Command R7B) as llama.cpp runs it: LayerNorm (attention.layer_norm_epsilon), the parallel block
# (attn_norm only), q / k rows as the checkpoint holds them (RoPE on consecutive pairs), the window on three of every
# four layers (llama.cpp's fixed pattern) which alone take RoPE, logit_scale a factor on the logits.
GGUF_ARCHITECTURES = {"llama": ("llama", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False),
                      "gemma": ("gemma", False), "gemma2": ("gemma2", False), "gemma3": ("gemma3_text", False),
                      "phi3": ("phi3", False), "smollm3": ("smollm3", True), "mistral3": ("llama", True),
                      "granite": ("granite", True), "qwen3moe": ("qwen3_moe", False),
                      "granitemoe": ("granitemoe", True), "qwen2moe": ("qwen2_moe", False),
                      "olmoe": ("olmoe", False), "gpt-oss": ("gpt_oss", False), "olmo2": ("olmo2", False),
                      "glm4": ("glm4", False), "cohere2": ("cohere2", False), "seed_oss": ("seed_oss", False),
                      "ernie4_5": ("ernie4_5", False), "exaone4": ("exaone4", False), "command-r": ("cohere", False),
                      "deepseek2": ("deepseek_v2", False), "glm4moe": ("glm4_moe", False), "dots1": ("dots1", False),
                      "ernie4_5-moe": ("ernie4_5_moe", False), "minimax-m2": ("minimax_m2", False),
                      "deepseek32": ("deepseek_v32", False), "glm-dsa": ("glm_moe_dsa", False),
                      "exaone-moe": ("exaone_moe", False), "hunyuan-dense": ("hunyuan_v1_dense", False),
                      "hunyuan-moe": ("hunyuan_v1_moe", False), "starcoder2": ("starcoder2", False),
                      "arcee": ("arcee", True), "nemotron": ("nemotron", False), "phi2": ("phi", False),
                      "stablelm": ("stablelm", False), "gptneox": ("gpt_neox", False), "olmo": ("olmo", True),
                      "qwen2vl": ("qwen2", False), "qwen3vl": ("qwen3", False), "qwen3vlmoe": ("qwen3_moe", False),
                      "jais2": ("jais2", False), "falcon": ("falcon", False), "apertus": ("apertus", False),
                      "minicpm3": ("minicpm3", False), "dbrx": ("dbrx", False), "gpt2": ("gpt2", False),
                      "starcoder": ("gpt_bigcode", False), "bloom": ("bloom", False), "mpt": ("mpt", False),
                      "llama4": ("llama4_text", False), "lfm2": ("lfm2", False), "lfm2moe": ("lfm2_moe", False),
                      # Granite 4.0's hybrids (granite-4.0-h-*: Mamba-2 and attention layers; q / k permuted as llama's)
                      "granitehybrid": ("granitemoehybrid", True),
                      # Mamba-2 itself (mamba2-*, Mamba-Codestral): no attention, no MLP
                      "mamba2": ("mamba2", False),
                      # Mamba (mamba-*-hf) and, with ssm.dt_b_c_rms, Falcon Mamba: no attention, no MLP
                      "mamba": ("mamba", False),
                      # Qwen3-Next, Qwen3.5 (dense and MoE): gated DeltaNet and gated attention layers (_gguf_delta)
                      "qwen3next": ("qwen3_next", False), "qwen35": ("qwen3_5_text", False),
                      "qwen35moe": ("qwen3_5_moe_text", False),
                      # Nemotron-H (Nemotron-H, Nemotron Nano 2): Mamba-2, attention and MLP blocks (_gguf_nemotron_h;
                      # q / k permuted as llama's, though no RoPE turns them)
                      "nemotron_h": ("nemotron_h", True),
                      # Nemotron 3 (Nemotron 3 Nano): its mixture blocks where nemotron_h's MLP blocks are
                      "nemotron_h_moe": ("nemotron_h", True),
                      # Jamba: Mamba(-1) layers (0 KV heads) beside attention layers without RoPE, mixtures where a
                      # layer has a router (_gguf_jamba)
                      "jamba": ("jamba", False),
                      # Kimi Linear: KDA layers (0 KV heads) beside deepseek2's latent attention without RoPE
                      # (_gguf_kimi_linear)
                      "kimi-linear": ("kimi_linear", False),
                      # Falcon-H1: attention and Mamba-2 side by side in every layer (_gguf_falcon_h1; its muP
                      # multipliers folded into the tensors by the converter; q / k in the checkpoint's order)
                      "falcon-h1": ("falcon_h1", False),
                      # files of models transformers runs only by their own code, which llama.cpp runs as llama:
                      # InternLM2 / 2.5 and XVERSE (their converters split InternLM2's wqkv and permute q / k as
                      # llama's), EXAONE 3 / 3.5 (q / k in the checkpoint's order: RoPE on halves)
                      "internlm2": ("llama", True), "xverse": ("llama", True), "exaone": ("llama", False),
                      # ChatGLM2 / 3 and GLM-4 of 2024 in THUDM's own layout (glm-4-9b-chat): GLM-4 of 2024's layer
                      "chatglm": ("glm", False),
                      # Qwen (1) in its own layout (Qwen-1.8B / 7B / 14B / 72B and their chat models): Qwen2's layer
                      "qwen": ("qwen2", False),
                      # MiniCPM (1 / 2: MiniCPM-1B, MiniCPM-2B and their fine-tunes): llama's tensors (permuted q / k)
                      # with Granite's three multipliers (its scale_emb, scale_depth / sqrt(layers), hidden /
                      # dim_model_base: the file's embedding_scale, residual_scale, logit_scale, each required)
                      "minicpm": ("granite", True)}
# mixtures of experts: llama with experts is Mixtral (llama.cpp's name for it); qwen3moe and granitemoe must have them
_GGUF_MOE = {"llama": "mixtral", "qwen3moe": "qwen3_moe", "granitemoe": "granitemoe", "qwen2moe": "qwen2_moe",
             "olmoe": "olmoe", "gpt-oss": "gpt_oss", "qwen3vlmoe": "qwen3_moe", "dbrx": "dbrx"}
# granite's multipliers: GGUF key -> GraniteConfig key (llama.cpp's defaults where absent: 1.0; attention 0, i.e.
# head_dim ** -0.5)
_GGUF_GRANITE_TYPES = ("granite", "granitemoe", "granitemoeshared",  # the model types of granite / granitemoe /
                       "granitemoehybrid")  # granitehybrid files
_GGUF_GRANITE = {"embedding_scale": "embedding_multiplier", "attention.scale": "attention_multiplier",
                 "residual_scale": "residual_multiplier", "logit_scale": "logits_scaling"}
# tensors that are not weights: read into the config (rope_freqs: llama3 RoPE; rope_factors_*: LongRoPE)
_GGUF_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")

# the keys of DeepSeek's mixtures (_gguf_grouped_mixture) and deepseek2's latent attention (_gguf_deepseek2), read in
# those architectures' files only (any other file raises on them); nextn_predict_layers: the multi-token prediction
# layers read_gguf skips
_GGUF_GROUPED_KEYS = ("leading_dense_block_count", "expert_shared_count", "expert_weights_scale", "expert_weights_norm",
                      "expert_gating_func", "expert_group_count", "expert_group_used_count")
_GGUF_LATENT_KEYS = (*_GGUF_GROUPED_KEYS, "nextn_predict_layers", "attention.key_length", "attention.value_length",
                     "rope.scaling.yarn_log_multiplier", "attention.q_lora_rank", "attention.kv_lora_rank",
                     "attention.key_length_mla", "attention.value_length_mla")
_GGUF_SSM_KEYS = ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size", "ssm.time_step_rank")
_GGUF_DELTA_KEYS = (*_GGUF_SSM_KEYS, "full_attention_interval", "attention.recurrent_layers", "attention.value_length")
# deepseek32 (DeepSeek-V3.2) and glm-dsa (GLM-5): deepseek2's with DeepSeek's sparse attention (_gguf_dsa)
_GGUF_DSA = ("deepseek32", "glm-dsa")
_GGUF_INDEXER_KEYS = ("attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k")
_GGUF_ARCH_KEYS = {
    "deepseek2": _GGUF_LATENT_KEYS, "deepseek32": (*_GGUF_LATENT_KEYS, *_GGUF_INDEXER_KEYS),
    "glm-dsa": (*_GGUF_LATENT_KEYS, *_GGUF_INDEXER_KEYS, "attention.indexer.types"),
    "glm4moe": (*_GGUF_GROUPED_KEYS, "nextn_predict_layers"), "dots1": _GGUF_GROUPED_KEYS,
    "ernie4_5-moe": ("leading_dense_block_count", "expert_shared_count", "interleave_moe_layer_step"),
    "minimax-m2": ("expert_gating_func",),
    "exaone-moe": (*_GGUF_GROUPED_KEYS, "nextn_predict_layers", "attention.sliding_window",
                   "attention.sliding_window_pattern", "rope.freq_base_swa"),
    "hunyuan-moe": ("expert_shared_count",), "olmo": ("attention.clamp_kqv",), "dbrx": ("attention.clamp_kqv",),
    "llama4": ("interleave_moe_layer_step", "attention.sliding_window", "attention.sliding_window_pattern",
               "rope.freq_base_swa"),  # (_gguf_llama4)
    "mpt": ("attention.clamp_kqv", "attention.max_alibi_bias"),  # (_gguf_mpt)
    "lfm2": ("shortconv.l_cache",),  # (_gguf_lfm2)
    "lfm2moe": ("shortconv.l_cache", "expert_gating_func", "leading_dense_block_count"),  # (_gguf_lfm2)
    **dict.fromkeys(("granitehybrid", "mamba2", "nemotron_h", "falcon-h1"), _GGUF_SSM_KEYS),  # (_gguf_mamba)
    "mamba": ("ssm.conv_kernel", "ssm.state_size", "ssm.inner_size", "ssm.time_step_rank",
              "ssm.dt_b_c_rms"),  # (_gguf_mamba1)
    "jamba": ("ssm.conv_kernel", "ssm.state_size", "ssm.inner_size", "ssm.time_step_rank"),  # (_gguf_jamba)
    "kimi-linear": (*_GGUF_LATENT_KEYS, "ssm.conv_kernel", "kda.head_dim",
                    "rope.dimension_count"),  # (_gguf_kimi_linear)
    "nemotron_h_moe": (*_GGUF_SSM_KEYS, "expert_shared_count", "expert_weights_norm", "expert_weights_scale",
                       "expert_group_count", "expert_group_used_count", "expert_gating_func",
                       "moe_latent_size"),  # (_gguf_nemotron_h)
    "minicpm3": ("attention.key_length", "attention.value_length", "attention.q_lora_rank", "attention.kv_lora_rank"),
    # Qwen's image + text models' language models: their M-RoPE sections (_gguf_mrope), the image side's deepstack
    # layers (image embeddings added to the first layers' input: never on text)
    "qwen2vl": ("rope.dimension_sections",), "qwen3vl": ("rope.dimension_sections", "n_deepstack_layers"),
    "qwen3vlmoe": ("rope.dimension_sections", "n_deepstack_layers"),
    # gated DeltaNet (_gguf_delta); Qwen3.5's M-RoPE sections (text: its RoPE) and multi-token prediction layers
    "qwen3next": _GGUF_DELTA_KEYS,
    **dict.fromkeys(("qwen35", "qwen35moe"), (*_GGUF_DELTA_KEYS, "rope.dimension_sections", "nextn_predict_layers"))}
# the architectures whose files may append multi-token prediction layers
_GGUF_MTP = ("deepseek2", "glm4moe", *_GGUF_DSA, "exaone-moe", "qwen35", "qwen35moe")
# <arch>.* GGUF metadata: what read_gguf reads, what never changes the logits, and what is supported at
# one value only (key -> (harmless(value, config), the value we implement)). Any other <arch>.* key raises.
_GGUF_READ = frozenset({
    "vocab_size", "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",  # (cohere2's LayerNorm)
    "rope.freq_base", "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
    "rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    # qwen3moe / qwen2moe: the experts' width; qwen2moe: its shared expert's (_gguf_experts)
    "expert_feed_forward_length", "expert_shared_feed_forward_length",
})
_GGUF_METADATA = frozenset({
    "tensor_data_layout",  # how the converter read the checkpoint; the stored q/k layout is the same
})
_GGUF_HARMLESS_ONLY_AT = {
    "attention.value_length": (lambda v, c: v == c.head_dim, "attention.key_length (one head_dim)"),
    "rope.dimension_count": (lambda v, c: v == c.rotary_dim or c.model_type == "nemotron_h",
                             "head_dim (RoPE on the whole head; phi3: the rotated dims, partial RoPE)"),
    # llama.cpp multiplies RoPE's cos and sin by it; phi3 LongRoPE: its attention factor, read
    "rope.scaling.attn_factor": (lambda v, c: v == 1 or (c.rope_type == "longrope"
                                                         and v == c.rope_scaling.get("attention_factor")),
                                 "1.0 (phi3 with LongRoPE factors: any)"),
    "rope.scaling.yarn_ext_factor": (lambda v, c: c.rope_type == "yarn" and v == 1, "1.0 with yarn scaling"),
    # Ministral 3's (_gguf_ministral3: read in a mistral3 file)
    "attention.temperature_scale": (lambda v, c: c.model_type == "ministral3", "absent (a mistral3 file's: read)"),
    "rope.scaling.yarn_log_multiplier": (lambda v, c: c.model_type == "ministral3",
                                         "absent (a mistral3 file with attention.temperature_scale: read)"),
    # the converter's copy of a YaRN checkpoint's attention_factor: transformers scales cos and sin by it, llama.cpp
    # reads it for grok only and scales by 1 + 0.1 ln factor: one model where the two agree
    "rope.scaling.yarn_attn_factor": (
        lambda v, c: c.rope_type == "yarn" and math.isclose(v, 1 + 0.1 * math.log(c.rope_scaling["factor"]),
                                                             rel_tol=1e-6),
        "1 + 0.1 ln(rope.scaling.factor) with yarn scaling (the magnitude both transformers and llama.cpp apply)"),
    "attention.causal": (lambda v, c: v is True, "true"),
    # phi3: llama.cpp reads it and then runs the model without a window ("Phi SWA is currently disabled"), as here
    "attention.sliding_window": (lambda v, c: c.model_type in ("gemma2", "gemma3_text", "phi3", "gpt_oss", "olmo3",
                                                               "cohere2", "exaone4")
                                 or v == 0 or v >= c.max_position_embeddings,
                                 "0 or >= context_length (no sliding-window attention; gemma2 / gemma3 / gpt-oss / "
                                 "cohere2 / olmo2 (OLMo 3): its window)"),
    # olmo2 (OLMo 3), exaone4: llama.cpp's fixed pattern, every 4th layer full (exaone4: in a 64-layer file; none in
    # another)
    "attention.sliding_window_pattern": (
        lambda v, c: c.model_type in ("olmo3", "exaone4") and tuple(v) == c.sliding_layers,
        "olmo2 with attention.sliding_window, a 64-layer exaone4: three of every four layers sliding, the 4th, 8th, "
        "... full; another exaone4: none (the patterns llama.cpp applies; read_gguf)"),
    # read by _gguf_gemma for gemma2
    **{key: (lambda v, c: c.model_type == "gemma2", "absent (Gemma 2's only)")
       for key in ("attn_logit_softcapping", "final_logit_softcapping")},
    "use_parallel_residual": (lambda v, c: v is False or c.model_type in ("stablelm", "gpt_neox")
                              and v == c.parallel_block,
                              "false (stablelm: the layers' own, no ffn_norm where true; gptneox: read)"),
    # the original YaRN code's flag for its dynamic variant, which static yarn ignores; llama.cpp's granite and
    # granitemoe run without RoPE where it is false
    "rope.scaling.finetuned": (lambda v, c: v is True or c.model_type not in _GGUF_GRANITE_TYPES
                               or c.model_type == "granitemoehybrid",
                               "any (granite, granitemoe: true, RoPE on; granitehybrid: read)"),
    # read by _gguf_experts (llama with experts: Mixtral; qwen3moe, granitemoe)
    "expert_count": (lambda v, c: v == (c.experts.count if c.experts else 0), "0 (dense MLP; MoE: read)"),
    "expert_used_count": (lambda v, c: v == (c.experts.top_k if c.experts else 0), "0 (dense MLP; MoE: read)"),
    # granite: read into its config (_GGUF_GRANITE); elsewhere only llama.cpp's defaults (attention.scale 0:
    # head_dim ** -0.5; the others 1)
    **{key: (lambda v, c, key=key: v == 1 or c.model_type in _GGUF_GRANITE_TYPES
             or (key == "logit_scale" and c.model_type in ("cohere", "cohere2")),
             "1.0 (granite, command-r and cohere2's logit_scale: any, read)")
       for key in ("logit_scale", "embedding_scale", "residual_scale")},
    "attention.scale": (lambda v, c: v == 0 or c.model_type in _GGUF_GRANITE_TYPES,
                        "0 (head_dim ** -0.5; granite: any, read)"),
}


def _gguf_rope_scaling(reader, arch: str, path: Path, context: int):
    """``rope_scaling`` as llama.cpp reads it: a missing ``rope.scaling.type`` means linear, the factor is
    ``rope.scaling.factor`` (or the older ``rope.scale_linear``; 0 or missing: none); ``none`` turns it
    off. ``yarn``: that factor over ``rope.scaling.original_context_length`` (default: ``context``, the
    file's context length, as llama.cpp), with ``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow`` (default
    32 / 1); llama.cpp's ramp ends are rounded outwards, transformers' ``truncate``. ``longrope``: None here
    (the file's rope_factors tensors say it: :func:`_gguf_longrope`). Others raise."""
    kind = gguf_field(reader, f"{arch}.rope.scaling.type")
    factor = gguf_field(reader, f"{arch}.rope.scaling.factor", gguf_field(reader, f"{arch}.rope.scale_linear"))
    factor = float(factor) if factor is not None else 0.0
    if kind == "yarn":
        if not factor > 1:
            raise ValueError(f"GGUF file {str(path)!r} has yarn RoPE scaling with {arch}.rope.scaling.factor = "
                             f"{factor}; yarn needs a factor > 1")
        rs = {"rope_type": "yarn", "factor": factor,
              "original_max_position_embeddings": int(gguf_field(reader, f"{arch}.rope.scaling.original_context_length",
                                                                 context))}
        for key, name in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            value = gguf_field(reader, f"{arch}.rope.scaling.{name}")
            if value is not None:
                rs[key] = float(value)
        return rs
    if kind == "longrope" and arch == "phi3":
        return None
    if kind not in (None, "linear", "none"):
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.rope.scaling.type = {kind!r}; only linear and yarn "
                         "RoPE scaling are supported (and LongRoPE in a phi3 file)")
    if kind == "none":
        if factor not in (0.0, 1.0):
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.rope.scaling.type = 'none' but "
                             f"{arch}.rope.scaling.factor = {factor}; the two contradict each other")
        return None
    return None if factor in (0.0, 1.0) else {"rope_type": "linear", "factor": factor}


# llama3 RoPE settings tried against a GGUF's rope_freqs tensor (llama.cpp's converter bakes Llama 3.1 /
# 3.2's rope_scaling into it and keeps no other trace): (low_freq_factor, high_freq_factor,
# original_max_position_embeddings); the factor is the tensor's largest entry.
_LLAMA3_CANDIDATES = [(lo, hi, ctx) for ctx in (8192, 4096, 2048, 16384, 32768, 131072)  # ((1, 1): Llama 4 Scout's)
                      for lo, hi in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0), (1.0, 8.0), (1.0, 1.0))]


def _rope_from_freq_factors(config: LlamaConfig, factors: torch.Tensor, path: Path) -> dict:
    """The ``llama3`` ``rope_scaling`` whose frequencies equal ``inv_freq / factors`` (the rope_freqs
    tensor, as llama.cpp applies it), or ValueError when no llama3 setting reproduces them."""
    from .rope import rope_inv_freq

    factors = factors.double().flatten()
    if factors.numel() != config.head_dim // 2 or not bool((factors >= 1).all()):
        raise ValueError(f"GGUF file {str(path)!r}: rope_freqs has {factors.numel()} entries (expected "
                         f"{config.head_dim // 2}, each >= 1); it is not Llama-3.1-style frequency scaling")
    want = rope_inv_freq(config.replace(rope_scaling=None)).double() / factors
    factor = float(factors.max())
    for lo, hi, ctx in _LLAMA3_CANDIDATES:
        rs = {"rope_type": "llama3", "factor": factor, "low_freq_factor": lo, "high_freq_factor": hi,
              "original_max_position_embeddings": ctx}
        got = rope_inv_freq(config.replace(rope_scaling=rs)).double()
        if torch.allclose(got, want, rtol=1e-5, atol=0):
            return rs
    raise ValueError(f"GGUF file {str(path)!r} has rope_freqs (frequency factors up to {factor}) that no llama3 "
                     "RoPE setting reproduces; load the Hugging Face checkpoint instead")


def _gguf_longrope(reader, arch: str, path: Path, tensors: dict, rope_scaling) -> dict:
    """A phi3 file's LongRoPE, as llama.cpp runs it: the per-pair factors of its ``rope_factors_short`` /
    ``rope_factors_long`` tensors (both, float), over ``rope.scaling.original_context_length`` (required), with
    ``rope.scaling.attn_factor`` on cos and sin (1.0 when absent, llama.cpp's default)."""
    import gguf

    if arch not in ("phi3", "minicpm3"):
        raise ValueError(f"GGUF file {str(path)!r} has LongRoPE factor tensors in a {arch!r} file; they are read "
                         "for architectures 'phi3' and 'minicpm3' only")
    have = [name for name in _GGUF_ROPE_TENSORS[1:] if name in tensors]
    if len(have) != 2 or rope_scaling is not None or "rope_freqs.weight" in tensors:
        raise ValueError(f"GGUF file {str(path)!r} has {', '.join(have)}: LongRoPE needs both rope_factors_long and "
                         "rope_factors_short, and no other RoPE scaling")
    original = gguf_field(reader, f"{arch}.rope.scaling.original_context_length")
    if original is None and arch == "minicpm3":  # (its converter writes none: llama.cpp takes the trained context)
        original = gguf_field(reader, f"{arch}.context_length")
    if original is None:
        raise ValueError(f"GGUF file {str(path)!r} has LongRoPE factors but no {arch}.rope.scaling.original_context_"
                         "length (the length past which the long factors apply)")
    factors = {name: gguf.quants.dequantize(tensors[name].data, tensors[name].tensor_type).reshape(-1).tolist()
               for name in have}
    return {"rope_type": "longrope", "short_factor": factors["rope_factors_short.weight"],
            "long_factor": factors["rope_factors_long.weight"], "original_max_position_embeddings": int(original),
            "attention_factor": float(gguf_field(reader, f"{arch}.rope.scaling.attn_factor", 1.0))}


def _gguf_ministral3(reader, arch: str, path: Path, rope_scaling) -> dict:
    """Ministral 3 (a ``mistral3`` file with ``attention.temperature_scale``, as llama.cpp's converter writes it and
    llama.cpp runs it): its YaRN ``rope_scaling`` with the query temperature's beta (``llama_4_scaling_beta``, over
    the original context) and, where the file has ``rope.scaling.yarn_log_multiplier`` (the converter's copy of
    ``mscale_all_dim``; 0 is none, as llama.cpp reads it), YaRN's magnitude as llama.cpp computes it from it:
    ``mscale`` 1 (the converter does not write it; llama.cpp takes 1) over ``mscale_all_dim``."""
    if (rope_scaling or {}).get("rope_type") != "yarn":
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.attention.temperature_scale (Ministral 3's query "
                         "temperature) without yarn RoPE scaling, which it is defined over")
    rs = {**rope_scaling, "llama_4_scaling_beta": float(gguf_field(reader, f"{arch}.attention.temperature_scale"))}
    log_mul = float(gguf_field(reader, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    if log_mul:
        rs.update(mscale=1.0, mscale_all_dim=log_mul)
    return rs


def _gguf_granite(reader, arch: str, head_dim: int, path: Path) -> dict:
    """A granite or minicpm file's ``extra``: its multipliers as GraniteConfig names them (llama.cpp's defaults where
    absent: 1.0, and head_dim ** -0.5 for an attention scale of 0; a minicpm file's three scales required: files older
    than its converter's keys ran on llama.cpp's built-in MiniCPM numbers, which are not read here)."""
    out = {}
    for key in ("embedding_scale", "residual_scale", "logit_scale") if arch == "minicpm" else ():
        _gguf_need(reader, arch, path, key)
    for key, name in _GGUF_GRANITE.items():
        v = float(gguf_field(reader, f"{arch}.{key}", 0.0 if key == "attention.scale" else 1.0))
        out[name] = 1.0 / math.sqrt(head_dim) if key == "attention.scale" and v == 0 else v
    return out


def _gguf_partial_rope(reader, arch: str, path: Path, head_dim: int) -> dict:
    """A phi3, glm4, glm4moe or chatglm file's ``extra``: ``partial_rotary_factor`` where ``rope.dimension_count`` is
    less than the head (Phi-4-mini: 96 of 128; GLM-4, GLM-4.5, ChatGLM: half), and a GLM file's whole-head 1.0 (its
    family's default is 0.5)."""
    rotated = int(gguf_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rotated == head_dim:  # (GLM's, Nemotron's and Phi-2's families default to half, StableLM's to a quarter)
        return {"partial_rotary_factor": 1.0} if arch in ("glm4", "glm4moe", "nemotron", "phi2", "stablelm",
                                                           "gptneox", "chatglm") else {}
    factor = rotated / head_dim
    if int(head_dim * factor) != rotated:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.rope.dimension_count = {rotated} of head_dim {head_dim} is "
                         "no partial_rotary_factor transformers would read back")
    return {"partial_rotary_factor": factor}


def _check_gguf_keys(reader, config: LlamaConfig, arch: str, path: Path) -> None:
    for full in reader.fields:
        if not full.startswith(f"{arch}."):
            continue  # general.* (provenance), tokenizer.* (the tokenizer), GGUF.* (the container)
        key = full[len(arch) + 1:]
        if key in _GGUF_READ or key in _GGUF_METADATA or key in _GGUF_ARCH_KEYS.get(arch, ()):
            continue
        value = gguf_field(reader, full)
        if key in _GGUF_HARMLESS_ONLY_AT:
            harmless, supported = _GGUF_HARMLESS_ONLY_AT[key]
            if not harmless(value, config):
                raise ValueError(f"GGUF file {str(path)!r} has {full} = {value!r}; triforce.models.Llama "
                                 f"implements only {supported} and would compute different logits")
            continue
        raise ValueError(f"GGUF file {str(path)!r} has metadata {full}, which triforce.models.Llama does not "
                         f"understand and which could change the model's math; use a plain {arch} GGUF")


_GGUF_LAYER_TENSORS = {**{f"{k}.weight": f"{v}.weight" for k, v in _GGUF_NAMES.items()},
                       **{f"{k}.bias": f"{_GGUF_NAMES[k]}.bias" for k in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                          "ffn_gate", "ffn_up", "ffn_down")},
                       "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
                       # a mixture of experts' router and its experts' stacked projections (read_gguf splits them)
                       "ffn_gate_inp.weight": "mlp.gate.weight", **{f"ffn_{k}_exps.weight": f"mlp.{k}_exps"
                                                                    for k in ("gate", "up", "down")},
                       # qwen2moe's shared expert and its gate (one logit: a 1-D tensor in the file)
                       "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
                       **{f"ffn_{k}_shexp.weight": f"mlp.shared_expert.{k}_proj.weight"
                          for k in ("gate", "up", "down")}}
# gemma2 / gemma3's sandwich norms: ffn_norm is the norm before the MLP, the others after the attention and the MLP
_GGUF_SANDWICH_TENSORS = {**_GGUF_LAYER_TENSORS, "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                          "post_attention_norm.weight": "post_attention_layernorm.weight",
                          "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
# gpt-oss: its sinks, the norm before the MLP as post_attention_norm, the router's bias, the experts' biases (and
# gate and up as one ffn_gate_up_exps where the converter fused them: gate first)
_GGUF_GPT_OSS_TENSORS = {**{k: v for k, v in _GGUF_LAYER_TENSORS.items() if k != "ffn_norm.weight"},
                         "post_attention_norm.weight": "post_attention_layernorm.weight",
                         "attn_sinks.weight": "self_attn.sinks", "ffn_gate_inp.bias": "mlp.gate.bias",
                         "ffn_gate_up_exps.weight": "mlp.gate_up_exps",
                         **{f"ffn_{k}_exps.bias": f"mlp.{k}_exps_bias" for k in ("gate", "up", "down", "gate_up")}}
# olmo2 (OLMo 2 / 3): its norms after the attention and the MLP, none before
_GGUF_OLMO2_TENSORS = {**{k: v for k, v in _GGUF_LAYER_TENSORS.items() if k not in ("attn_norm.weight",
                                                                                    "ffn_norm.weight")},
                       "post_attention_norm.weight": "post_attention_layernorm.weight",
                       "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
# glm4: the four norms under gemma's names in the file, GLM's in its checkpoints (read_gguf gives a checkpoint's
# names: _build renames them); gate and up as one ffn_up (gate first)
_GGUF_GLM4_TENSORS = {**_GGUF_LAYER_TENSORS, "ffn_norm.weight": "post_attention_layernorm.weight",
                      "post_attention_norm.weight": "post_self_attn_layernorm.weight",
                      "post_ffw_norm.weight": "post_mlp_layernorm.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
# seed_oss: the norm before the MLP as post_attention_norm (the gguf package's name for the checkpoint's)
_GGUF_SEED_OSS_TENSORS = {**{k: v for k, v in _GGUF_LAYER_TENSORS.items() if k != "ffn_norm.weight"},
                          "post_attention_norm.weight": "post_attention_layernorm.weight"}
# phi3: q, k, v as one attn_qkv and the gate and up projections as one ffn_up (gate first), as its checkpoints
# hold them (_build splits them)
_GGUF_PHI3_TENSORS = {**_GGUF_LAYER_TENSORS, "attn_qkv.weight": "self_attn.qkv_proj.weight",
                      "ffn_up.weight": "mlp.gate_up_proj.weight"}
# deepseek2: the latent attention's projections and norms (its kv_b_proj whole in older files, else per head as
# attn_k_b (transposed) and attn_v_b: read_gguf joins them), the router's correction bias
_GGUF_DEEPSEEK2_TENSORS = {**_GGUF_LAYER_TENSORS, "attn_q_a.weight": "self_attn.q_a_proj.weight",
                           "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
                           "attn_q_b.weight": "self_attn.q_b_proj.weight",
                           "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
                           "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
                           "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
                           "attn_k_b.weight": "self_attn.k_b_proj", "attn_v_b.weight": "self_attn.v_b_proj",
                           "exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}
# deepseek32, glm-dsa: deepseek2's and the indexer's (its query and key projections, its key's LayerNorm, its head
# weights)
_GGUF_DSA_TENSORS = {**_GGUF_DEEPSEEK2_TENSORS, "indexer.attn_q_b.weight": "self_attn.indexer.wq_b.weight",
                     "indexer.attn_k.weight": "self_attn.indexer.wk.weight",
                     "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",
                     "indexer.k_norm.bias": "self_attn.indexer.k_norm.bias",
                     "indexer.proj.weight": "self_attn.indexer.weights_proj.weight"}
# glm4moe: the norm before the MLP as post_attention_norm; dots1: Llama's names; both with DeepSeek-V3's router bias
_GGUF_GLM4MOE_TENSORS = {**{k: v for k, v in _GGUF_LAYER_TENSORS.items() if k != "ffn_norm.weight"},
                         "post_attention_norm.weight": "post_attention_layernorm.weight",
                         "exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}
# (ernie4_5-moe's and minimax-m2's too)
_GGUF_DOTS1_TENSORS = {**_GGUF_LAYER_TENSORS, "exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}
# the LayerNorms' biases (nemotron, starcoder2, phi2, stablelm; the ungated MLP as ffn_up / ffn_down). The model's names
# here, as for every architecture; read_gguf gives the family's checkpoint names where they differ (_FAMILY_NAMES)
_GGUF_LAYER_NORM_TENSORS = {**_GGUF_LAYER_TENSORS, "attn_norm.bias": "input_layernorm.bias",
                            "ffn_norm.bias": "post_attention_layernorm.bias"}
# gptneox: q, k, v as one attn_qkv, rows [q; k; v] (llama.cpp's converter undoes the checkpoint's per-head interleave;
# read_gguf interleaves them again), with its bias
_GGUF_NEOX_TENSORS = {**_GGUF_LAYER_NORM_TENSORS, "attn_qkv.weight": "self_attn.qkv_proj.weight",
                      "attn_qkv.bias": "self_attn.qkv_proj.bias"}
# falcon: q, k, v as one attn_qkv, rows [q; k; v] (llama.cpp's converter regroups the checkpoint's; read_gguf splits
# them), attn_norm the MLP's norm (and the attention's, but where the file has attn_norm_2: the 40b / 180b layers' two)
_GGUF_FALCON_TENSORS = {**_GGUF_LAYER_NORM_TENSORS, "attn_qkv.weight": "self_attn.qkv_proj.weight",
                        "attn_qkv.bias": "self_attn.qkv_proj.bias", "attn_norm_2.weight": "attn_norm_2.weight",
                        "attn_norm_2.bias": "attn_norm_2.bias"}
# dbrx: q, k, v as one attn_qkv (rows [q; k; v], as its checkpoints hold them), the norm before the MLP as
# attn_output_norm, no ffn_norm
_GGUF_DBRX_TENSORS = {**{k: v for k, v in _GGUF_LAYER_TENSORS.items() if k != "ffn_norm.weight"},
                      "attn_qkv.weight": "self_attn.qkv_proj.weight",
                      "attn_output_norm.weight": "post_attention_layernorm.weight"}
# chatglm (read as glm): q, k, v as one attn_qkv (rows [q; k; v], biased), the gate and up projections as one ffn_up
# (gate first), Llama's two norms
_GGUF_CHATGLM_TENSORS = {**_GGUF_LAYER_TENSORS, "attn_qkv.weight": "self_attn.qkv_proj.weight",
                         "attn_qkv.bias": "self_attn.qkv_proj.bias", "ffn_up.weight": "mlp.gate_up_proj.weight"}
# qwen (Qwen 1, read as qwen2): q, k, v as one attn_qkv (rows [q; k; v], biased); its feed_forward_length twice the
# MLP's width (QWenConfig's intermediate_size, halved by its model: read_gguf halves it)
_GGUF_QWEN_TENSORS = {**_GGUF_LAYER_TENSORS, "attn_qkv.weight": "self_attn.qkv_proj.weight",
                      "attn_qkv.bias": "self_attn.qkv_proj.bias"}
# gpt2, starcoder (GPT-BigCode): q, k, v as one attn_qkv, rows [q; k; v] (llama.cpp's converter transposes GPT-2's
# Conv1D weights: every weight in nn.Linear's layout), biased, on LayerNorms with biases; the learned positions are
# position_embd (_state_key)
_GGUF_GPT2_TENSORS = {**_GGUF_NEOX_TENSORS}
# bloom, mpt: q, k, v as one attn_qkv, rows [q; k; v] (llama.cpp's converter regroups BLOOM's per-head
# query_key_value so; MPT's Wqkv is so already), biased where the file has biases (BLOOM's), on LayerNorms; BLOOM's
# embeddings' LayerNorm token_embd_norm (_state_key)
_GGUF_ALIBI_TENSORS = {**_GGUF_NEOX_TENSORS}
# lfm2: llama's layer tensors (attn_output its attention's out_proj, attn_norm / ffn_norm its operator_norm / ffn_norm)
# and its convolution layers' (token_embd_norm, its final norm: _state_key)
_GGUF_LFM2_TENSORS = {**_GGUF_LAYER_TENSORS, **{f"shortconv.{k}.weight": f"self_attn.{k}.weight"
                                                for k in ("conv", "in_proj", "out_proj")}}
# granitehybrid: granitemoe's (a dense one's MLP llama's ffn_*), its Mamba-2 layers' ssm_* (read_gguf reshapes them)
_GGUF_GRANITE_HYBRID_TENSORS = {**_GGUF_LAYER_TENSORS, **{f"ssm_{k}.{b}": f"self_attn.{v}.{b}" for k, v in (
    ("in", "in_proj"), ("conv1d", "conv1d"), ("out", "out_proj")) for b in ("weight", "bias")},
    "ssm_dt.bias": "self_attn.dt_bias", "ssm_a": "self_attn.A_log", "ssm_d": "self_attn.D",
    "ssm_norm.weight": "self_attn.norm.weight"}
# falcon-h1: llama's layer tensors and, beside the attention, its Mamba-2 mixer's (granitehybrid's ssm_*) under mamba
_GGUF_FALCON_H1_TENSORS = {**_GGUF_LAYER_TENSORS, **{k: v.replace("self_attn.", "mamba.") for k, v in
                                                     _GGUF_GRANITE_HYBRID_TENSORS.items() if k.startswith("ssm_")}}
# qwen3next / qwen35 / qwen35moe: the norm after the attention is the one before the MLP (post_attention_norm); the
# DeltaNet layers' tensors (Qwen3.5's projections; qwen3next's b and a rows as one ssm_ba, its older files' q, k, v
# and z as one ssm_in: read_gguf splits them); the attention's attn_q holds its gate rows, as the checkpoint's q_proj
_GGUF_DELTA_TENSORS = {**{k: v for k, v in _GGUF_LAYER_TENSORS.items() if k != "ffn_norm.weight"},
                       "post_attention_norm.weight": "post_attention_layernorm.weight",
                       "attn_qkv.weight": "self_attn.in_proj_qkv.weight",
                       "attn_gate.weight": "self_attn.in_proj_z.weight",
                       "ssm_beta.weight": "self_attn.in_proj_b.weight",
                       "ssm_alpha.weight": "self_attn.in_proj_a.weight",
                       "ssm_ba.weight": "self_attn.in_proj_ba.weight",
                       "ssm_in.weight": "self_attn.in_proj_qkvz.weight",
                       "ssm_conv1d.weight": "self_attn.conv1d.weight", "ssm_dt.bias": "self_attn.dt_bias",
                       "ssm_a": "self_attn.A_log", "ssm_norm.weight": "self_attn.norm.weight",
                       "ssm_out.weight": "self_attn.out_proj.weight"}
# mamba: each layer's norm (attn_norm) and its Mamba(-1) mixer's tensors
_GGUF_MAMBA1_TENSORS = {"attn_norm.weight": "input_layernorm.weight", **{
    f"ssm_{k}.{b}": f"self_attn.{v}.{b}" for k, v in (("in", "in_proj"), ("conv1d", "conv1d"), ("x", "x_proj"),
                                                      ("dt", "dt_proj"), ("out", "out_proj"))
    for b in ("weight", "bias")}, "ssm_a": "self_attn.A_log", "ssm_d": "self_attn.D"}
# jamba: llama's layer tensors (ffn_norm its pre_ff_layernorm, ffn_gate_inp its router) and its Mamba(-1) layers', with
# their RMSNorms on dt's low rank, B and C
_GGUF_JAMBA_TENSORS = {**_GGUF_LAYER_TENSORS, **_GGUF_MAMBA1_TENSORS,
                       **{f"ssm_{k}_norm.weight": f"self_attn.{k}_layernorm.weight" for k in ("dt", "b", "c")}}
# kimi-linear: deepseek2's (its latent attention, mixtures) and its KDA layers' (the forget gate's under the model's
# names; the three convolutions as moonshotai's layout has them: loading._kimi_names joins them)
_GGUF_KIMI_TENSORS = {**_GGUF_DEEPSEEK2_TENSORS, **{f"ssm_conv1d_{p}.weight": f"self_attn.{p}_conv1d.weight"
                                                    for p in "qkv"},
                      **{f"ssm_{k}": f"self_attn.forget_gate.{v}" for k, v in (
                          ("f_a.weight", "f_a_proj.weight"), ("f_b.weight", "f_b_proj.weight"), ("a", "A_log"),
                          ("dt.bias", "dt_bias"))},
                      "ssm_beta.weight": "self_attn.b_proj.weight", "ssm_g_a.weight": "self_attn.g_a_proj.weight",
                      "ssm_g_b.weight": "self_attn.g_b_proj.weight", "ssm_norm.weight": "self_attn.o_norm.weight"}
# lfm2moe: lfm2's, its mixtures' router's expert bias as exp_probs_b
_GGUF_LFM2MOE_TENSORS = {**_GGUF_LFM2_TENSORS, "exp_probs_b.bias": "mlp.gate.e_score_correction_bias"}
# architecture -> its layers' tensor names (the others: _GGUF_LAYER_TENSORS)
_GGUF_TABLES = {"gemma2": _GGUF_SANDWICH_TENSORS, "gemma3": _GGUF_SANDWICH_TENSORS, "phi3": _GGUF_PHI3_TENSORS,
                "gpt-oss": _GGUF_GPT_OSS_TENSORS, "olmo2": _GGUF_OLMO2_TENSORS, "exaone4": _GGUF_OLMO2_TENSORS,
                "glm4": _GGUF_GLM4_TENSORS, "seed_oss": _GGUF_SEED_OSS_TENSORS, "deepseek2": _GGUF_DEEPSEEK2_TENSORS,
                "glm4moe": _GGUF_GLM4MOE_TENSORS, "dots1": _GGUF_DOTS1_TENSORS, "ernie4_5-moe": _GGUF_DOTS1_TENSORS,
                "minimax-m2": _GGUF_DOTS1_TENSORS, **dict.fromkeys(_GGUF_DSA, _GGUF_DSA_TENSORS),
                "exaone-moe": _GGUF_DOTS1_TENSORS, "minicpm3": _GGUF_DEEPSEEK2_TENSORS,
                **dict.fromkeys(("starcoder2", "nemotron", "phi2", "stablelm", "jais2"), _GGUF_LAYER_NORM_TENSORS),
                "gptneox": _GGUF_NEOX_TENSORS, "falcon": _GGUF_FALCON_TENSORS, "dbrx": _GGUF_DBRX_TENSORS,
                **dict.fromkeys(("gpt2", "starcoder"), _GGUF_GPT2_TENSORS), "chatglm": _GGUF_CHATGLM_TENSORS,
                "qwen": _GGUF_QWEN_TENSORS, "bloom": _GGUF_ALIBI_TENSORS, "mpt": _GGUF_ALIBI_TENSORS,
                "lfm2": _GGUF_LFM2_TENSORS, "lfm2moe": _GGUF_LFM2MOE_TENSORS,
                **dict.fromkeys(("granitehybrid", "mamba2", "nemotron_h"), _GGUF_GRANITE_HYBRID_TENSORS),
                "mamba": _GGUF_MAMBA1_TENSORS, "falcon-h1": _GGUF_FALCON_H1_TENSORS, "jamba": _GGUF_JAMBA_TENSORS,
                "kimi-linear": _GGUF_KIMI_TENSORS,
                "nemotron_h_moe": {**_GGUF_GRANITE_HYBRID_TENSORS,
                                   "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
                                   # (Nemotron 3 Super's latent projections, in and out of the experts' width)
                                   "ffn_latent_down.weight": "mlp.fc1_latent_proj.weight",
                                   "ffn_latent_up.weight": "mlp.fc2_latent_proj.weight"},
                **dict.fromkeys(("qwen3next", "qwen35", "qwen35moe"), _GGUF_DELTA_TENSORS)}


def _gguf_gemma(reader, arch: str, hidden: int, n_head: int, head_dim: int, layers: int) -> dict:
    """The ``extra`` keys of a gemma2 / gemma3 GGUF's config, as llama.cpp runs the file (llama-model.cpp):
    its ``attention.sliding_window`` (default 4096) on every other layer (gemma2) or 5 of every 6 (gemma3), the
    scores scaled by ``head_dim ** -0.5``, or ``(hidden / heads) ** -0.5`` for the 27B models (46 / 62 layers:
    their ``query_pre_attn_scalar``, 144 / 168), gemma3's sliding layers' RoPE base 10000 (all fixed there,
    not in the file), and gemma2's ``attn_logit_softcapping`` / ``final_logit_softcapping`` (default 50 / 30)."""
    window = gguf_field(reader, f"{arch}.attention.sliding_window", 4096)
    big = {"gemma2": 46, "gemma3": 62}[arch]
    extra = {"sliding_window": None if window == 0 else int(window),
             "query_pre_attn_scalar": hidden // n_head if layers == big else head_dim}
    if arch == "gemma3":
        return {**extra, "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0}
    return {**extra, **{key: float(gguf_field(reader, f"{arch}.{key}", default))
                        for key, default in (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0))}}


def read_gguf(path: Path, skip=None, reader=None):
    """(LlamaConfig, float32 HF-named state dict) from a GGUF file of an architecture in
    :data:`GGUF_ARCHITECTURES`. Tensors of any type the ``gguf`` package dequantises (F32/F16/BF16,
    Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, the K-quants Q2_K..Q6_K, ...) load through ``gguf.quants.dequantize``.
    ``skip(key, type name, shape)``: True leaves that tensor out (not dequantised; ``shape`` as the model's
    ``[out, in]``). ``reader``: the file already opened with :func:`open_gguf` (parsing its metadata takes
    seconds for a large vocabulary)."""
    import gguf

    reader = reader if reader is not None else open_gguf(path)
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF file {str(path)!r} has architecture {arch!r}; supported: "
                         f"{', '.join(repr(a) for a in GGUF_ARCHITECTURES)}")
    model_type, permuted = GGUF_ARCHITECTURES[arch]
    experts = gguf_field(reader, f"{arch}.expert_count", 0) or 0
    if arch in _GGUF_MOE and (experts or arch != "llama"):
        model_type = _GGUF_MOE[arch]
    if model_type == "granitemoe" and int(gguf_field(reader, f"{arch}.expert_shared_feed_forward_length", 0) or 0):
        model_type = "granitemoeshared"  # (llama.cpp's granitemoe with a shared expert, ffn_*_shexp)

    def need(key):
        v = gguf_field(reader, f"{arch}.{key}")
        if v is None:
            raise ValueError(f"GGUF file {str(path)!r} lacks metadata {arch}.{key}")
        return v

    tensors = {t.name: t for t in reader.tensors}
    hidden = int(need("embedding_length"))
    if arch in ("mamba2", "mamba"):  # (no attention: the model's placeholders, one head of the hidden width)
        n_head = n_kv = 1
    else:
        n_head = int(need("attention.head_count"))
        n_kv = _gguf_kv_heads(reader, arch, path, n_head)
    if "token_embd.weight" not in tensors:
        raise ValueError(f"GGUF file {str(path)!r} has no token_embd.weight")
    vocab = int(gguf_field(reader, f"{arch}.vocab_size", 0)) or int(tensors["token_embd.weight"].shape[1])
    head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", 0) or 0) or hidden // n_head
    tok = lambda k: gguf_field(reader, f"tokenizer.ggml.{k}")  # noqa: E731
    # Qwen2: q/k/v biases always; llama / qwen3: biases on q/k/v/o if the file has them (attention_bias)
    attention_bias = model_type not in ("qwen2", "qwen2_moe", "stablelm") and (
        "blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors)
    rope_scaling = _gguf_rope_scaling(reader, arch, path, int(need("context_length")))
    if any(name in tensors for name in _GGUF_ROPE_TENSORS[1:]):
        rope_scaling = _gguf_longrope(reader, arch, path, tensors, rope_scaling)
    elif gguf_field(reader, f"{arch}.rope.scaling.type") == "longrope":
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.rope.scaling.type = 'longrope' but no rope_factors "
                         "tensors")
    extra = (_gguf_gemma(reader, arch, hidden, n_head, head_dim, int(need("block_count")))
             if arch in ("gemma2", "gemma3") else _gguf_partial_rope(reader, arch, path, head_dim)
             if arch in ("phi3", "glm4", "glm4moe", "minimax-m2", "nemotron", "phi2", "stablelm", "gptneox",
                         "chatglm")
             else _gguf_granite(reader, arch, head_dim, path) if arch in ("granite", "granitemoe", "minicpm",
                                                                          "granitehybrid")
             else {})
    n_ff = need("feed_forward_length")
    if arch in ("nemotron_h", "nemotron_h_moe"):  # (a width per layer, 0 where no MLP: the layers' kinds)
        extra.update(_gguf_nemotron_h(reader, arch, path, int(need("block_count")), hidden, tensors, n_ff))
        n_ff = max(int(x) for x in (n_ff if isinstance(n_ff, (list, tuple)) else [n_ff]))
    n_ff = int(n_ff)
    if arch == "qwen":  # (QWenConfig's intermediate_size, which llama.cpp's converter writes: twice the MLP's width)
        if n_ff % 2:
            raise ValueError(f"GGUF file {str(path)!r}: qwen.feed_forward_length = {n_ff} is odd (Qwen's MLP is half "
                             "of it)")
        n_ff //= 2
    if model_type in (*_GGUF_MOE.values(), "granitemoeshared"):
        extra.update(_gguf_experts(reader, arch, path, model_type, n_ff))
    mtp = _gguf_mtp(reader, arch)  # (layers after the model's, skipped)
    if arch in ("deepseek2", *_GGUF_DSA, "kimi-linear"):  # (its latent KV head: one of kv_lora_rank +
        dense_type, rope_scaling, mla = _gguf_deepseek2(reader, arch, path, rope_scaling)  # qk_rope_head_dim)
        extra.update(mla)
        n_kv, head_dim = 1, mla["kv_lora_rank"] + mla["qk_rope_head_dim"]
        if arch == "kimi-linear":  # (no RoPE: no pairs to order)
            extra.pop("rope_interleave", None)
            extra.update(_gguf_kimi_linear(reader, arch, path, int(need("block_count")), tensors, dense_type))
        elif arch in _GGUF_DSA:
            extra.update(_gguf_dsa(reader, arch, path, dense_type, int(need("block_count")) - mtp,
                                   int(need("context_length"))))
        else:
            model_type = dense_type
    if arch == "minicpm3":  # (its latent KV head: one of kv_lora_rank + qk_rope_head_dim)
        extra.update(_gguf_minicpm3(reader, arch, path, hidden // n_head))
        n_kv, head_dim = 1, extra["kv_lora_rank"] + extra["qk_rope_head_dim"]
    if arch == "ernie4_5-moe":
        extra.update(_gguf_ernie_moe(reader, arch, path))
    if arch == "exaone-moe":
        extra.update(_gguf_exaone_moe(reader, arch, path, int(need("block_count")) - mtp))
    if arch == "hunyuan-moe":
        extra.update(_gguf_hunyuan_moe(reader, arch, path, n_ff))
    if arch == "llama4":  # (the experts' and the shared expert's width the model's intermediate_size)
        extra.update(_gguf_llama4(reader, arch, path, int(need("block_count")), n_ff))
        n_ff = _gguf_need(reader, arch, path, "expert_feed_forward_length")
    if arch == "minimax-m2":  # (every layer sparse; the experts' width the model's intermediate_size)
        extra.update(_gguf_minimax_m2(reader, arch, path))
        n_ff = _gguf_need(reader, arch, path, "expert_feed_forward_length")
    if arch in ("glm4moe", "dots1"):  # DeepSeek-V3's mixture on GLM's / Qwen3's attention
        extra.update(_gguf_grouped_mixture(reader, arch, path)[1])
        if arch == "glm4moe":  # (its q / k norms where the file has them: llama.cpp applies them so)
            extra["use_qk_norm"] = "blk.0.attn_q_norm.weight" in tensors
        else:  # (llama.cpp's dots1 slides no window)
            extra["sliding_window"] = None
    if model_type == "gpt_oss":  # its experts' width; its window (llama.cpp: every other layer from the first)
        n_ff = int(gguf_field(reader, f"{arch}.expert_feed_forward_length", 0) or 0) or n_ff
        window = int(gguf_field(reader, f"{arch}.attention.sliding_window", 0) or 0)
        extra["sliding_window"] = window or None
    if arch == "exaone4":  # llama.cpp's: a window (pattern 4) only in a 64-layer file; else none, RoPE on every layer
        sliding = int(need("block_count")) == 64
        extra.update(sliding_window=int(gguf_field(reader, f"{arch}.attention.sliding_window", 4096)) if sliding
                     else None, sliding_window_pattern=4)
    if arch == "seed_oss":  # (its o bias by its own key)
        extra["attention_out_bias"] = "blk.0.attn_output.bias" in tensors
    if arch == "cohere2":  # its window (required), llama.cpp's fixed pattern
        extra.update(sliding_window=int(need("attention.sliding_window")), sliding_window_pattern=4)
    if model_type in _COHERES:  # its logit scale (a factor)
        extra["logit_scale"] = float(need("logit_scale"))
    if arch == "command-r":  # Command R+'s per-head q / k norms where the file has them (llama.cpp applies them so)
        extra["use_qk_norm"] = "blk.0.attn_q_norm.weight" in tensors
    if arch == "olmo2" and int(gguf_field(reader, f"{arch}.attention.sliding_window", 0) or 0) > 0:
        model_type = "olmo3"  # (llama.cpp's olmo2 with a window: OLMo 3's layers)
        extra["sliding_window"] = int(gguf_field(reader, f"{arch}.attention.sliding_window"))
    if model_type == "qwen2_moe":  # (its q/k/v biases by its qkv_bias key: llama.cpp reads them where present)
        extra["qkv_bias"] = "blk.0.attn_q.bias" in tensors
    if model_type == "stablelm":  # (its q/k/v biases where present; parallel where the layers have no ffn_norm, as
        extra["use_qkv_bias"] = "blk.0.attn_q.bias" in tensors  # llama.cpp decides; its per-head q / k norms where
        extra["use_parallel_residual"] = "blk.0.ffn_norm.weight" not in tensors  # present)
        extra["qk_layernorm"] = "blk.0.attn_q_norm.weight" in tensors
    if arch == "gptneox":  # (llama.cpp requires the key)
        extra["use_parallel_residual"] = bool(need("use_parallel_residual"))
    if arch == "dbrx" and gguf_field(reader, f"{arch}.attention.clamp_kqv") is not None:  # (its clip_qkv)
        extra["clip_qkv"] = float(gguf_field(reader, f"{arch}.attention.clamp_kqv"))
    if arch == "mpt":  # (its clip_qkv; its slopes, checked)
        extra.update(_gguf_mpt(reader, path, n_head))
    if arch == "olmo" and gguf_field(reader, f"{arch}.attention.clamp_kqv") is not None:  # (its clip_qkv)
        extra["clip_qkv"] = float(gguf_field(reader, f"{arch}.attention.clamp_kqv"))
    if arch == "olmo" and not math.isclose(float(need("attention.layer_norm_epsilon")), 1e-5, rel_tol=1e-6):
        # (OLMo's, fixed: the converter's, a float32 in the file)
        raise ValueError(f"GGUF file {str(path)!r}: olmo.attention.layer_norm_epsilon = "
                         f"{need('attention.layer_norm_epsilon')}; OLMo's LayerNorm eps is 1e-5")
    if arch in ("qwen2vl", "qwen3vl", "qwen3vlmoe"):
        extra.update(_gguf_mrope(reader, arch, path, head_dim))
    if arch == "falcon":  # (llama.cpp runs every falcon file as the new architecture's parallel block: its KV heads,
        # one norm, or two where the layers have attn_norm_2; q / k / v contiguous in the file)
        extra.update(new_decoder_architecture=True, num_kv_heads=n_kv, bias=attention_bias,
                     num_ln_in_parallel_attn=2 if "blk.0.attn_norm_2.weight" in tensors else 1)
    if arch in ("lfm2", "lfm2moe"):
        extra.update(_gguf_lfm2(reader, arch, path, int(need("block_count"))))
    if arch == "granitehybrid":
        extra.update(_gguf_granite_hybrid(reader, arch, path, int(need("block_count")), hidden, tensors, n_ff))
    if arch == "falcon-h1":
        extra.update(_gguf_falcon_h1(reader, arch, path, hidden, tensors))
    if arch == "jamba":
        extra.update(_gguf_jamba(reader, arch, path, int(need("block_count")), hidden, tensors))
    if arch == "mamba2":  # (its MLP's width: none, the placeholder 1; its residual stream in float32, as llama.cpp's)
        extra.update(_gguf_mamba(reader, arch, path, hidden, tensors), residual_in_fp32=True)
        n_ff = 1
    if arch == "mamba":  # (its MLP's width: none, the placeholder 1; its residual stream in float32, as llama.cpp's)
        dt_b_c = _gguf_mamba1(reader, arch, path, hidden, tensors, extra)
        model_type = "falcon_mamba" if dt_b_c else "mamba"
        n_ff = 1
    if arch in ("qwen3next", "qwen35", "qwen35moe"):
        extra.update(_gguf_delta(reader, arch, path, int(need("block_count")) - mtp, head_dim, n_ff))
    if arch == "mistral3" and gguf_field(reader, f"{arch}.attention.temperature_scale", 0):
        model_type, rope_scaling = "ministral3", _gguf_ministral3(reader, arch, path, rope_scaling)
    config = LlamaConfig(
        model_type=model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=n_ff,
        num_hidden_layers=int(need("block_count")) - mtp, num_attention_heads=n_head, num_key_value_heads=n_kv,
        head_dim=head_dim, max_position_embeddings=int(need("context_length")),
        rope_theta=float(gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)),  # llama.cpp's default too
        rope_scaling=rope_scaling, rms_norm_eps=float(need(
            "attention.layer_norm_epsilon" if model_type in (*_COHERES, "starcoder2", "nemotron", "phi", "stablelm",
                                                             "gpt_neox", "olmo", "jais2", "falcon", "dbrx",
                                                             "gpt2", "gpt_bigcode", "bloom", "mpt")
            else "attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in tensors, attention_bias=attention_bias,
        # (MLP biases where the family's config reads them and the file has them: llama.cpp's llama reads them too)
        # (GPT-NeoX's always: llama.cpp requires them)
        mlp_bias=model_type in ("gpt_neox", "bloom") or ("mlp_bias" in FAMILIES[model_type].reads and (
            "blk.0.ffn_up.bias" in tensors
            or arch in ("nemotron_h", "nemotron_h_moe")
            and any(n.endswith(("ffn_up.bias", "ffn_up_shexp.bias")) for n in tensors))),  # (its MLP layers')
        bos_token_id=tok("bos_token_id"), eos_token_id=tok("eos_token_id"), pad_token_id=tok("padding_token_id"),
        extra=extra)
    _check_gguf_keys(reader, config, arch, path)

    sd, stacked, latent = {}, {}, {}
    for name, t in tensors.items():
        if name in _GGUF_ROPE_TENSORS[1:] or (mtp and _gguf_layer(name) >= config.num_hidden_layers):
            continue  # (read into the config above; a multi-token prediction layer)
        if skip is not None and name != "rope_freqs.weight":
            key, _ = _state_key(name, path, arch, permuted, n_head, n_kv)
            if skip(key, t.tensor_type.name, tuple(int(n) for n in reversed(t.shape))):
                continue
        try:
            w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        except Exception as e:
            raise ValueError(f"cannot dequantise tensor {name} ({t.tensor_type.name}) of {str(path)!r}: {e}") from None
        if name == "rope_freqs.weight":
            if config.rope_scaling is not None:
                raise ValueError(f"GGUF file {str(path)!r} has both rope_freqs and {arch}.rope.scaling metadata")
            config = config.replace(rope_scaling=_rope_from_freq_factors(config, w, path))
            continue
        key, heads = _state_key(name, path, arch, permuted, n_head, n_kv)
        if (config.gemma_norm or config.torch_layer_norm == "1p") and key.endswith("norm.weight") and not (
                config.delta is not None and key.endswith("self_attn.norm.weight")):  # (DeltaNet's gated norm: w)
            w = w - 1  # stored as the factor 1 + w; GemmaRMSNorm (LayerNorm1P) adds the 1 back (exact for factors in
            # [0.5, 2^24))
        if key.endswith(("_exps", "_exps_bias")):
            stacked[key] = w
            continue
        if key.endswith(("self_attn.k_b_proj", "self_attn.v_b_proj")):
            latent[key] = w
            continue
        if key.endswith("shared_expert_gate.weight") and w.dim() == 1:
            w = w[None]  # (llama.cpp's {n_embd}: the gate's one row)
        if key.endswith("e_score_correction_bias"):
            w = w.reshape(-1)  # (ernie4_5-moe's converter keeps the checkpoint's [1, experts])
        if key.endswith(("self_attn.conv.weight", "self_attn.conv1d.weight", "mamba.conv1d.weight")):
            w = w[:, None]  # (LFM2's, Mamba's convolution: the converter's [channels, taps], nn.Conv1d's [.., 1, ..])
        if model_type == "kimi_linear" and key.endswith(("_conv1d.weight", "forget_gate.A_log")):  # (KDA's, as its
            # converter wrote them: each convolution [1, channels, 1, taps], A as -exp(A_log) [1, heads])
            w = w.reshape(-1, 1, w.shape[-1]) if key.endswith("_conv1d.weight") else torch.log(-w).reshape(1, 1, -1, 1)
        elif key.endswith("self_attn.A_log") and model_type in ("mamba", "falcon_mamba", "jamba"):
            w = torch.log(-w)  # (Mamba(-1)'s A [inner, state], as its converter wrote it: -exp(A_log))
        elif key.endswith(("self_attn.A_log", "self_attn.D", "self_attn.norm.weight", "mamba.A_log", "mamba.D",
                           "mamba.norm.weight")):  # (Mamba's, as its converter wrote them: A [H, 1] as -exp(A_log),
            w = w.reshape(-1)  # D [H, 1], the norm [groups, inner / groups]; Falcon-H1's under mamba)
            w = torch.log(-w) if key.endswith("A_log") else w
        sd[key] = w if heads is None else _unpermute(w, heads)
    if arch in ("deepseek2", *_GGUF_DSA, "kimi-linear"):
        sd = _gguf_latent_weights(config, sd, latent, path)
    if config.experts is not None and config.experts.correction_bias:  # (llama.cpp's exp_probs_b is optional)
        for i, sparse in enumerate(config.experts.layers):
            key = f"model.layers.{i}.mlp.gate.e_score_correction_bias"
            if sparse and f"blk.{i}.exp_probs_b.bias" not in tensors:
                sd[key] = torch.zeros(config.experts.count)
    if arch == "gptneox":  # (its checkpoints' query_key_value: interleaved per head)
        sd = _gguf_neox_qkv(config, sd)
    if arch == "falcon":
        sd = _gguf_falcon(config, sd)
    if arch in ("dbrx", "gpt2", "starcoder", "chatglm", "qwen", "bloom", "mpt"):  # (their attn_qkv's rows: q, k, v)
        sd = _gguf_split_qkv(config, sd)
    if config.delta is not None:  # (qwen3next's fused rows split; qwen35's value heads back in the checkpoint's order)
        sd = _gguf_delta_rows(config, sd, arch)
    if arch == "apertus":  # (its xIELU numbers: per layer in the file's metadata)
        sd.update(_gguf_xielu(reader, path, config.num_hidden_layers))
    if model_type in _FAMILY_NAMES or model_type in ("stablelm", "gpt2", "gpt_bigcode", "lfm2", "lfm2_moe",
                                                     "granitemoehybrid", "mamba2", "nemotron_h", "mamba",
                                                     "falcon_mamba", "falcon_h1", "jamba", "kimi_linear",
                                                     *_DELTA_FAMILIES):
        sd = _norm_names(config, sd, inverse=True)  # (the family's checkpoint names where they differ from the model's)
    return config, _gguf_expert_weights(config, sd, stacked, path, partial=skip is not None)


_XIELU_KEYS = ("alpha_p", "alpha_n", "beta", "eps")


def _gguf_xielu(reader, path: Path, layers: int) -> dict:
    """An apertus file's xIELU numbers as each layer's ``mlp.act_fn`` tensors (:class:`~triforce.models.llama.XIELU`):
    ``xielu.alpha_p`` / ``alpha_n`` / ``beta`` / ``eps``, one per layer as llama.cpp's converter writes them (the
    checkpoint's learned ``alpha_p`` / ``alpha_n`` as they are: the softplus is the model's), or one number for every
    layer (llama.cpp broadcasts it)."""
    out = {}
    for key in _XIELU_KEYS:
        v = gguf_field(reader, f"xielu.{key}")
        if v is None:
            raise ValueError(f"GGUF file {str(path)!r} (apertus) lacks metadata xielu.{key}: its MLP's xIELU numbers")
        values = [float(x) for x in v] if isinstance(v, (list, tuple)) else [float(v)] * layers
        if len(values) != layers:
            raise ValueError(f"GGUF file {str(path)!r} has {len(values)} xielu.{key} values for {layers} layers")
        for i, x in enumerate(values):
            t = torch.tensor(x)
            out[f"model.layers.{i}.mlp.act_fn.{key}"] = t[None] if key in ("alpha_p", "alpha_n") else t
    return out


def _gguf_split_qkv(config: LlamaConfig, sd: dict) -> dict:
    """``sd`` with a file's attn_qkv (read as ``self_attn.qkv_proj``; rows [q; k; v], contiguous) as q, k and v."""
    out = {}
    rows = (config.num_attention_heads * config.head_dim, *(config.num_key_value_heads * config.head_dim,) * 2)
    for name, t in sd.items():
        if name.endswith((".self_attn.qkv_proj.weight", ".self_attn.qkv_proj.bias")):
            stem, kind = name.rsplit(".self_attn.qkv_proj.", 1)
            out.update({f"{stem}.self_attn.{p}_proj.{kind}": w.clone() for p, w in zip("qkv", t.split(rows))})
        else:
            out[name] = t
    return out


def _gguf_mpt(reader, path: Path, n_head: int) -> dict:
    """An mpt file's ``extra``: ``attention.clamp_kqv`` as its ``clip_qkv``. llama.cpp runs its ALiBi with BLOOM's
    slopes at ``attention.max_alibi_bias`` (``2 ** (-b k / p)``, p the largest power of 2 <= heads, the odd powers
    of ``2 ** (-b / 2p)`` for the other heads), which are MPT's (``1 / 2 ** (k b / p)``) where the head count is a
    power of 2; another head count, or another bias than 8 (MptModel's, whatever its config says), raises."""
    bias = gguf_field(reader, "mpt.attention.max_alibi_bias", 8.0)
    if not math.isclose(float(bias), 8.0):
        raise ValueError(f"GGUF file {str(path)!r} has mpt.attention.max_alibi_bias = {bias}; MPT's ALiBi is at 8")
    if n_head & (n_head - 1):
        raise ValueError(f"GGUF file {str(path)!r} has mpt.attention.head_count = {n_head}, no power of 2: llama.cpp "
                         "runs it with BLOOM's ALiBi slopes, MPT's checkpoints with their own (they differ there)")
    clamp = gguf_field(reader, "mpt.attention.clamp_kqv")
    return {} if clamp is None else {"clip_qkv": float(clamp)}


def _gguf_falcon(config: LlamaConfig, sd: dict) -> dict:
    """A falcon file's tensors under the model's names: attn_qkv's rows ([q; k; v], contiguous) as q, k and v; with
    attn_norm_2 (the attention's norm in the 40b / 180b layers) the file's attn_norm is the MLP's norm."""
    out = {}
    for name, t in _gguf_split_qkv(config, sd).items():
        if ".attn_norm_2." in name:
            out[name.replace(".attn_norm_2.", ".input_layernorm.")] = t
        elif ".input_layernorm." in name and name.replace(".input_layernorm.", ".attn_norm_2.") in sd:
            out[name.replace(".input_layernorm.", ".post_attention_layernorm.")] = t
        else:
            out[name] = t
    return out


def _gguf_neox_qkv(config: LlamaConfig, sd: dict) -> dict:
    """A gptneox file's attn_qkv weights and biases (rows [q; k; v]) as its checkpoints' query_key_value (per head
    [q_h; k_h; v_h]: :func:`neox_qkv_join`), under the model's layer names."""
    out = {}
    for name, t in sd.items():
        if name.endswith((".self_attn.qkv_proj.weight", ".self_attn.qkv_proj.bias")):
            stem, kind = name.rsplit(".self_attn.qkv_proj.", 1)
            name, t = f"{stem}.attention.query_key_value.{kind}", neox_qkv_join(
                t.split(_fused_rows(config, _NEOX_QKV[0])), config.num_attention_heads)
        out[name] = t
    return out


def _gguf_hunyuan_moe(reader, arch: str, path: Path, n_ff: int) -> dict:
    """A hunyuan-moe file's mixture, as llama.cpp runs it (every layer sparse, the softmax's top k renormalised, one
    shared expert added) and as transformers' Hunyuan MoE computes it: its experts and its shared expert
    (``expert_feed_forward_length``, ``expert_shared_feed_forward_length``) of ``feed_forward_length``, one shared
    expert (``expert_shared_count``); other widths raise."""
    count, used = _gguf_expert_counts(reader, arch, path)
    for key in ("expert_feed_forward_length", "expert_shared_feed_forward_length"):
        width = int(gguf_field(reader, f"{arch}.{key}", n_ff) or 0)
        if width != n_ff:
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.{key} = {width}, not feed_forward_length ({n_ff}): "
                             "Hunyuan's mixture (transformers') has its experts and its shared expert of that width")
    shared = gguf_field(reader, f"{arch}.expert_shared_count", 1)
    if shared != 1:
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.expert_shared_count = {shared!r}; Hunyuan's mixture "
                         "has one shared expert")
    return {"num_experts": count, "moe_topk": used}


def _gguf_expert_counts(reader, arch: str, path: Path) -> tuple[int, int]:
    """A mixture's ``(expert_count, expert_used_count)`` (raises unless 1 <= used <= count)."""
    count, used = (int(gguf_field(reader, f"{arch}.{k}", 0) or 0) for k in ("expert_count", "expert_used_count"))
    if count < 1 or not 1 <= used <= count:
        raise ValueError(f"GGUF file {str(path)!r} of architecture {arch!r} needs {arch}.expert_count >= 1 and "
                         f"{arch}.expert_used_count in [1, expert_count], got {count} and {used} (a file without "
                         "experts is not supported)")
    return count, used


def _gguf_ernie_moe(reader, arch: str, path: Path) -> dict:
    """The ``extra`` keys of an ernie4_5-moe file (ERNIE 4.5's mixtures, as llama.cpp's converter writes the checkpoint
    and llama.cpp runs the file): ``expert_count`` experts of ``expert_feed_forward_length``, ``expert_used_count`` a
    token, ``expert_shared_count`` shared experts of that width; sparse from ``leading_dense_block_count`` on, every
    ``interleave_moe_layer_step``-th layer, to the last (llama.cpp's rule: the file has no end index); the softmax
    router choosing by its probabilities plus ``exp_probs_b`` (zeros where absent), renormalised (read_gguf)."""
    def get(key):
        return int(gguf_field(reader, f"{arch}.{key}", 0) or 0)

    (count, used), step = _gguf_expert_counts(reader, arch, path), get("interleave_moe_layer_step")
    if step < 1:
        raise ValueError(f"GGUF file {str(path)!r} needs {arch}.interleave_moe_layer_step >= 1, got {step}")
    return {"moe_num_experts": count, "moe_k": used, "moe_layer_interval": step,
            "moe_intermediate_size": _gguf_need(reader, arch, path, "expert_feed_forward_length"),
            "moe_num_shared_experts": get("expert_shared_count"),
            "moe_layer_start_index": get("leading_dense_block_count")}


_LLAMA4_CHUNK = 8192  # llama.cpp's llama4: its chunks, and its temperature's floor (hardcoded: no key carries them)
_LLAMA4_TEMPERATURE = 0.1
_LLAMA4_NO_ROPE_STEP = 4


def _gguf_kv_heads(reader, arch: str, path: Path, n_head: int) -> int:
    """``attention.head_count_kv`` (default ``n_head``); lfm2's / lfm2moe's may be a list, one per layer, 0 on their
    convolution layers (:func:`_gguf_lfm2`): the attention layers' count then, one for all."""
    v = gguf_field(reader, f"{arch}.attention.head_count_kv", n_head)
    if not isinstance(v, (list, tuple)):
        return int(v)
    heads = {int(x) for x in v} - {0}
    if arch not in ("lfm2", "lfm2moe", "granitehybrid", "nemotron_h", "nemotron_h_moe", "jamba", "kimi-linear") \
            or len(heads) != 1:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.attention.head_count_kv = {list(v)!r}; a count per layer is "
                         "read in lfm2 / lfm2moe files only, one count for every attention layer (0 on the others)")
    return heads.pop()


def _gguf_lfm2(reader, arch: str, path: Path, layers: int) -> dict:
    """The ``extra`` keys of an lfm2 / lfm2moe GGUF's config, as llama.cpp runs the file (src/models/lfm2.cpp): a layer
    with 0 KV heads in ``attention.head_count_kv`` a convolution of ``shortconv.l_cache`` taps (unbiased: llama.cpp
    reads no bias), the others attention; ``feed_forward_length`` the (dense) MLP's width (lfm2: the converter's
    adjusted one). lfm2moe: ``expert_count`` experts of ``expert_feed_forward_length``, ``expert_used_count`` a token,
    from layer ``leading_dense_block_count`` on, chosen by their sigmoid (``expert_gating_func`` 2) plus
    ``exp_probs_b`` (zeros where absent), renormalised, unscaled (llama.cpp's ``build_moe_ffn`` with ``norm_w`` and
    no scale: Lfm2MoeConfig's ``norm_topk_prob`` true and ``routed_scaling_factor`` 1)."""
    v = gguf_field(reader, f"{arch}.attention.head_count_kv", 1)
    kv = list(v) if isinstance(v, (list, tuple)) else [v] * layers
    if len(kv) != layers:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.attention.head_count_kv has {len(kv)} entries for "
                         f"{layers} layers")
    out = {"layer_types": ["conv" if int(x) == 0 else "full_attention" for x in kv],
           "conv_L_cache": _gguf_need(reader, arch, path, "shortconv.l_cache"), "conv_bias": False}
    if arch == "lfm2":
        return {**out, "block_auto_adjust_ff_dim": False}
    gating = int(gguf_field(reader, f"{arch}.expert_gating_func", 0) or 0)
    if gating != 2:
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.expert_gating_func = {gating}; supported: 2 (sigmoid, "
                         "LFM2-MoE's router)")
    count, used = _gguf_expert_counts(reader, arch, path)
    return {**out, "num_experts": count, "num_experts_per_tok": used,
            "moe_intermediate_size": _gguf_need(reader, arch, path, "expert_feed_forward_length"),
            "num_dense_layers": _gguf_need(reader, arch, path, "leading_dense_block_count"), "use_expert_bias": True,
            "norm_topk_prob": True, "routed_scaling_factor": 1.0}


def _gguf_granite_hybrid(reader, arch: str, path: Path, layers: int, hidden: int, tensors: dict, n_ff: int) -> dict:
    """The ``extra`` keys of a granitehybrid GGUF's config (Granite 4.0's hybrids as llama.cpp's converter writes them:
    GraniteHybridModel), as GraniteMoeHybridConfig names them: a layer with 0 KV heads in ``attention.head_count_kv``
    a Mamba-2 layer of ``ssm.time_step_rank`` heads, ``ssm.state_size``, ``ssm.group_count``, ``ssm.conv_kernel`` taps
    and ``ssm.inner_size`` channels, biased where the file's tensors are; RoPE where ``rope.scaling.finetuned`` is true
    (the converter's sign of it: Bamba's, an all-attention file's), else none; ``expert_count`` experts beside the
    shared MLP of ``expert_shared_feed_forward_length`` (else ``feed_forward_length``), or none (dense); granite's
    multipliers (:func:`_gguf_granite`)."""
    v = gguf_field(reader, f"{arch}.attention.head_count_kv", 1)
    kv = list(v) if isinstance(v, (list, tuple)) else [v] * layers
    if len(kv) != layers:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.attention.head_count_kv has {len(kv)} entries for "
                         f"{layers} layers")
    count = int(gguf_field(reader, f"{arch}.expert_count", 0) or 0)
    used = int(gguf_field(reader, f"{arch}.expert_used_count", 0) or 0)
    shared = int(gguf_field(reader, f"{arch}.expert_shared_feed_forward_length", 0) or 0) or n_ff
    return {"layer_types": ["mamba" if int(x) == 0 else "attention" for x in kv], **_gguf_mamba(
                reader, arch, path, hidden, tensors),
            "position_embedding_type": "rope" if gguf_field(reader, f"{arch}.rope.scaling.finetuned") else "nope",
            "num_local_experts": count, "num_experts_per_tok": used, "shared_intermediate_size": shared}


def _gguf_mamba1(reader, arch: str, path: Path, hidden: int, tensors: dict, extra: dict) -> bool:
    """A mamba file's Mamba(-1) settings into ``extra`` (as llama.cpp's converter, MambaModel, writes them and llama.cpp
    runs the file): ``ssm.inner_size`` (expand x hidden), ``ssm.state_size``, ``ssm.conv_kernel`` taps,
    ``ssm.time_step_rank``; biases where the tensors are; the residual stream in float32. -> ``ssm.dt_b_c_rms``:
    Falcon Mamba's weightless RMSNorms on dt's low rank, B and C, whose eps llama.cpp takes from the layers' norm's
    (``attention.layer_norm_rms_epsilon``; FalconMambaConfig's own ``mixer_rms_eps`` is not in the file)."""
    need = lambda key: _gguf_need(reader, arch, path, key)  # noqa: E731
    inner = need("ssm.inner_size")
    if inner % hidden:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.ssm.inner_size = {inner} must be a multiple of the "
                         f"embedding length ({hidden})")
    dt_b_c = bool(gguf_field(reader, f"{arch}.ssm.dt_b_c_rms", False))
    extra.update(mamba_expand=inner // hidden, mamba_d_state=need("ssm.state_size"), mamba_d_conv=need(
        "ssm.conv_kernel"), mamba_dt_rank=need("ssm.time_step_rank"), residual_in_fp32=True,
                 mamba_conv_bias=any(n.endswith("ssm_conv1d.bias") for n in tensors),
                 mamba_proj_bias=any(n.endswith("ssm_in.bias") for n in tensors))
    if dt_b_c:
        extra["mixer_rms_eps"] = float(gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
    return dt_b_c


def _gguf_nemotron_h(reader, arch: str, path: Path, layers: int, hidden: int, tensors: dict, n_ff) -> dict:
    """A nemotron_h file's ``extra`` (Nemotron-H as llama.cpp's converter writes it, NemotronHModel, and llama.cpp runs
    it): each layer's block by its ``attention.head_count_kv`` and ``feed_forward_length`` entries (both 0: Mamba-2;
    KV heads: attention; a width: the MLP, one width for all), the Mamba-2 settings (:func:`_gguf_mamba`; the inner
    width the heads', not a multiple of the embedding's). The file has no
    ``time_step_min``: its NemotronHConfig default (0.001), which the model clamps dt at as transformers' prefill does
    (llama.cpp clamps nothing; the two differ only where dt falls below it). Nemotron 3's mixture blocks are another
    architecture (nemotron_h_moe): every MLP block a mixture there, of ``expert_count`` ungated experts of
    ``expert_feed_forward_length``, ``expert_used_count`` a token, a shared expert of
    ``expert_shared_feed_forward_length``, chosen by the sigmoid (``expert_gating_func`` 2) plus ``exp_probs_b``
    within ``expert_group_used_count`` of ``expert_group_count`` groups, renormalised where ``expert_weights_norm``,
    times ``expert_weights_scale``."""
    lists = []
    for key in ("attention.head_count_kv", "feed_forward_length"):
        v = n_ff if key == "feed_forward_length" else gguf_field(reader, f"{arch}.{key}", 0)
        v = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * layers
        if len(v) != layers:
            raise ValueError(f"GGUF file {str(path)!r}: {arch}.{key} has {len(v)} entries for {layers} layers")
        lists.append(v)
    kv, ff = lists
    if len({x for x in ff if x}) > 1 or any(k and f for k, f in zip(kv, ff)):
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.feed_forward_length = {ff} with head_count_kv = {kv}: one "
                         "MLP width, on layers without attention")
    moe = arch == "nemotron_h_moe"  # (every MLP block a mixture: llama.cpp's rule)
    types = ["full_attention" if k else ("moe" if moe else "mlp") if f else "linear_attention" for k, f in zip(kv, ff)]
    extra = {"layers_block_type": types, **_gguf_mamba(reader, arch, path, hidden, tensors, any_width=True)}
    if moe:
        gating = int(gguf_field(reader, f"{arch}.expert_gating_func", 2) or 2)
        if gating != 2:
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.expert_gating_func = {gating}; supported: 2 "
                             "(sigmoid, Nemotron 3's router)")
        count, used = _gguf_expert_counts(reader, arch, path)
        get = lambda key, default: gguf_field(reader, f"{arch}.{key}", default)  # noqa: E731
        extra.update(n_routed_experts=count, num_experts_per_tok=used,
                     moe_intermediate_size=int(get("expert_feed_forward_length", 0) or max(ff)),
                     moe_shared_expert_intermediate_size=_gguf_need(reader, arch, path,
                                                                    "expert_shared_feed_forward_length"),
                     norm_topk_prob=bool(get("expert_weights_norm", True)),
                     routed_scaling_factor=float(get("expert_weights_scale", 1.0) or 1.0),
                     n_group=int(get("expert_group_count", 1) or 1), topk_group=int(get("expert_group_used_count", 1)
                                                                                      or 1))
        latent = get("moe_latent_size", None)  # (Nemotron 3 Super's latent mixture: ffn_latent_down / _up)
        if latent:
            extra["moe_latent_size"] = int(latent)
    return extra


def _gguf_kimi_linear(reader, arch: str, path: Path, layers: int, tensors: dict, dense_type: str) -> dict:
    """A kimi-linear file's ``extra`` beside deepseek2's (:func:`_gguf_deepseek2`; Kimi Linear as llama.cpp's
    converter, KimiLinearModel, writes it and llama.cpp runs it): a layer with 0 KV heads in
    ``attention.head_count_kv`` a KDA layer (its heads ``ssm_beta``'s rows, each of ``kda.head_dim``, the
    convolution's ``ssm.conv_kernel`` taps), the others the latent attention without RoPE (llama.cpp rotates nothing
    there, whatever ``rope.dimension_count`` and ``rope.freq_base`` say); the mixture DeepSeek-V3's (sigmoid:
    ``expert_gating_func`` 2, else raises), always renormalised and in one group, as llama.cpp's graph runs it."""
    if dense_type != "deepseek_v3":
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.expert_gating_func must be 2 (sigmoid, Kimi Linear's "
                         "router)")
    v = gguf_field(reader, f"{arch}.attention.head_count_kv", 1)
    kv = list(v) if isinstance(v, (list, tuple)) else [v] * layers
    if len(kv) != layers:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.attention.head_count_kv has {len(kv)} entries for "
                         f"{layers} layers")
    types = ["full_attention" if int(h) else "linear_attention" for h in kv]
    first = next((i for i, t in enumerate(types) if t == "linear_attention"), None)
    heads = 1 if first is None else int(tensors[f"blk.{first}.ssm_beta.weight"].shape[-1])
    return {"layer_types": types, "linear_num_heads": heads,
            "linear_head_dim": _gguf_need(reader, arch, path, "kda.head_dim"),
            "linear_conv_kernel_dim": _gguf_need(reader, arch, path, "ssm.conv_kernel"), "norm_topk_prob": True,
            "n_group": None, "topk_group": None}


def _gguf_period(layers: list, n: int, what: str, path: Path) -> tuple:
    """``(period, offset)`` with ``i % period == offset`` exactly on the layer indices ``layers`` (of ``n``), as
    JambaConfig places its attention layers and mixtures; a set no period and offset give raises."""
    if not layers:
        return n + 1, n  # (none: an offset past every layer)
    period = layers[1] - layers[0] if len(layers) > 1 else n
    offset = layers[0]
    if offset >= period or [i for i in range(n) if i % period == offset] != layers:
        raise ValueError(f"GGUF file {str(path)!r}: its {what} on layers {layers} are not every n-th layer from one "
                         "offset, which Jamba's config can say")
    return period, offset


def _gguf_jamba(reader, arch: str, path: Path, layers: int, hidden: int, tensors: dict) -> dict:
    """A jamba file's ``extra`` (Jamba as llama.cpp's converter, JambaModel, writes it and llama.cpp runs it): a layer
    with 0 KV heads in ``attention.head_count_kv`` a Mamba(-1) layer, the others attention (read as JambaConfig's
    ``attn_layer_period`` / ``attn_layer_offset``); a layer with a router (``ffn_gate_inp``) a mixture of
    ``expert_count`` experts, ``expert_used_count`` a token (its ``expert_layer_period`` / ``expert_layer_offset``),
    the others dense; the Mamba settings of ``ssm.*`` (the inner width a multiple of the hidden one), biases where the
    tensors are."""
    need = lambda key: _gguf_need(reader, arch, path, key)  # noqa: E731
    v = gguf_field(reader, f"{arch}.attention.head_count_kv", 1)
    kv = list(v) if isinstance(v, (list, tuple)) else [v] * layers
    if len(kv) != layers:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.attention.head_count_kv has {len(kv)} entries for "
                         f"{layers} layers")
    attention = [i for i, h in enumerate(kv) if int(h)]
    moe = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in tensors]
    inner = need("ssm.inner_size")
    if inner % hidden:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.ssm.inner_size = {inner} must be a multiple of the "
                         f"embedding length ({hidden})")
    (ap, ao), (ep, eo) = _gguf_period(attention, layers, "attention layers", path), _gguf_period(
        moe, layers, "mixtures", path)
    count = int(gguf_field(reader, f"{arch}.expert_count", 0) or 0)
    return {"attn_layer_period": ap, "attn_layer_offset": ao, "expert_layer_period": ep, "expert_layer_offset": eo,
            "num_experts": count if moe else 1,
            "num_experts_per_tok": int(gguf_field(reader, f"{arch}.expert_used_count", 0) or 0) if moe else 1,
            "mamba_expand": inner // hidden, "mamba_d_state": need("ssm.state_size"),
            "mamba_d_conv": need("ssm.conv_kernel"), "mamba_dt_rank": need("ssm.time_step_rank"),
            "mamba_conv_bias": any(n.endswith("ssm_conv1d.bias") for n in tensors),
            "mamba_proj_bias": any(n.endswith("ssm_in.bias") for n in tensors)}


def _gguf_falcon_h1(reader, arch: str, path: Path, hidden: int, tensors: dict) -> dict:
    """A falcon-h1 file's ``extra`` (Falcon-H1 as llama.cpp's converter, FalconH1Model, writes it and llama.cpp runs
    it): the Mamba-2 mixer of ``ssm.*`` (its width ``ssm.inner_size``, any) beside every layer's attention; its gated
    norm where the file has ``ssm_norm`` (normalising after the gate, as llama.cpp computes it), else none. The file
    carries no multiplier: the converter folded each into the tensor it scales, the embeddings' into token_embd and the
    logits' into output (a tied file's head is token_embd, the embeddings' multiplier in it, as llama.cpp runs it)."""
    mamba = _gguf_mamba(reader, arch, path, hidden, tensors, any_width=True)
    return {**mamba, "mamba_d_ssm": mamba["mamba_n_heads"] * mamba["mamba_d_head"],
            "mamba_rms_norm": any(n.endswith("ssm_norm.weight") for n in tensors), "mamba_norm_before_gate": False,
            "projectors_bias": any(n.endswith("ssm_out.bias") for n in tensors)}


def _gguf_mamba(reader, arch: str, path: Path, hidden: int, tensors: dict, any_width: bool = False) -> dict:
    """A granitehybrid, mamba2, nemotron_h or falcon-h1 file's Mamba-2 settings (``ssm.*``: ``time_step_rank`` heads,
    ``inner_size`` channels, ``state_size``, ``group_count``, ``conv_kernel``; biases where the tensors are) under the
    hybrids' config names (``any_width``: an inner width not a multiple of the hidden one, Nemotron-H's, its heads',
    Falcon-H1's, mamba_d_ssm)."""
    heads, inner = (_gguf_need(reader, arch, path, f"ssm.{k}") for k in ("time_step_rank", "inner_size"))
    if (inner % hidden and not any_width) or inner % heads:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.ssm.inner_size = {inner} must be a multiple of the "
                         f"embedding length ({hidden}) and of ssm.time_step_rank ({heads})")
    return {"mamba_n_heads": heads, "mamba_d_head": inner // heads, "mamba_expand": max(inner // hidden, 1),
            **{f"mamba_{k}": _gguf_need(reader, arch, path, f"ssm.{g}")
               for k, g in (("d_state", "state_size"), ("n_groups", "group_count"), ("d_conv", "conv_kernel"))},
            "mamba_conv_bias": any(n.endswith("ssm_conv1d.bias") for n in tensors),
            "mamba_proj_bias": any(n.endswith("ssm_in.bias") for n in tensors)}


def _gguf_llama4(reader, arch: str, path: Path, layers: int, n_ff: int) -> dict:
    """The ``extra`` keys of a llama4 file (Llama 4 Scout / Maverick, as llama.cpp's converter writes the checkpoint and
    llama.cpp runs the file, which carries few of its settings and fixes the others): ``expert_count`` experts (0
    raises, as llama.cpp refuses it) of ``expert_feed_forward_length``, ``expert_used_count`` a token, on every
    ``interleave_moe_layer_step``-th layer beside a shared expert of that width, the other layers' MLP of
    ``feed_forward_length``; every fourth layer NoPE (its query temperature: floor 8192, scale 0.1), the RoPE layers'
    q / k L2-normalised unless the file has 128 experts (Maverick's), chunks of 8192 positions on the chunked layers of
    ``attention.sliding_window_pattern`` (every n-th layer full; 4 where absent). A ``attention.sliding_window`` of 0
    (llama.cpp: no chunks, its no-RoPE step the layer count) reads so: no chunk, the last layer NoPE, no temperature.
    A ``rope.freq_base_swa`` other than ``rope.freq_base`` raises (one RoPE here)."""
    count, used = _gguf_expert_counts(reader, arch, path)
    step = _gguf_need(reader, arch, path, "interleave_moe_layer_step")
    base, swa = (gguf_field(reader, f"{arch}.{k}") for k in ("rope.freq_base", "rope.freq_base_swa"))
    if swa is not None and swa != (10000.0 if base is None else base):
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.rope.freq_base_swa = {swa}, not rope.freq_base: its "
                         "chunked layers' RoPE base of their own is not read here")
    extra = {"num_local_experts": count, "num_experts_per_tok": used, "interleave_moe_layer_step": step,
             "intermediate_size_mlp": n_ff, "use_qk_norm": count != 128, "floor_scale": _LLAMA4_CHUNK,
             "attn_scale": _LLAMA4_TEMPERATURE}
    window = gguf_field(reader, f"{arch}.attention.sliding_window")
    if window is not None and int(window) == 0:
        return {**extra, "layer_types": ["full_attention"] * layers, "attn_temperature_tuning": False,
                "no_rope_layers": [int((i + 1) % layers != 0) for i in range(layers)]}
    pattern = gguf_field(reader, f"{arch}.attention.sliding_window_pattern", _LLAMA4_NO_ROPE_STEP)
    if isinstance(pattern, list):  # (one bool per layer: chunked where true)
        if len(pattern) != layers:
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.attention.sliding_window_pattern of {len(pattern)} "
                             f"entries for {layers} layers")
        chunked = [bool(p) for p in pattern]
    else:  # (llama.cpp's set_swa_pattern: the last of every n full; 0: every layer chunked)
        period = int(pattern)
        chunked = [period == 0 or i % period < period - 1 for i in range(layers)]
    return {**extra, "attention_chunk_size": _LLAMA4_CHUNK, "attn_temperature_tuning": True,
            "layer_types": ["chunked_attention" if c else "full_attention" for c in chunked],
            "no_rope_layers": [int((i + 1) % _LLAMA4_NO_ROPE_STEP != 0) for i in range(layers)]}


def _gguf_minimax_m2(reader, arch: str, path: Path) -> dict:
    """The ``extra`` keys of a minimax-m2 file (MiniMax-M2 as llama.cpp's converter writes the checkpoint and llama.cpp
    runs the file): ``expert_count`` experts of ``expert_feed_forward_length`` (the model's intermediate_size),
    ``expert_used_count`` a token, on every layer, chosen by the sigmoid (``expert_gating_func`` 2, the only one its
    checkpoints have) plus ``exp_probs_b``, renormalised; RoPE on ``rope.dimension_count`` of each head
    (:func:`_gguf_partial_rope`), the q / k norms over the whole projections."""
    gating = int(gguf_field(reader, f"{arch}.expert_gating_func", 0) or 0)
    if gating != 2:
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.expert_gating_func = {gating}; supported: 2 (sigmoid, "
                         "MiniMax-M2's router)")
    count, used = _gguf_expert_counts(reader, arch, path)
    return {"num_local_experts": count, "num_experts_per_tok": used}


def _gguf_exaone_moe(reader, arch: str, path: Path, layers: int) -> dict:
    """The ``extra`` keys of an exaone-moe file (K-EXAONE, as llama.cpp's converter writes the checkpoint and llama.cpp
    runs it): DeepSeek-V3's mixture (:func:`_gguf_grouped_mixture`, under EXAONE's keys ``num_experts`` /
    ``num_shared_experts``; ``expert_shared_feed_forward_length`` must be their product's width), the window
    ``attention.sliding_window`` on the sliding layers of ``attention.sliding_window_pattern`` (a bool per layer, or
    every n-th layer full; absent: 4), which alone take RoPE (at ``rope.freq_base``: a ``rope.freq_base_swa`` of
    another value raises)."""
    _, extra = _gguf_grouped_mixture(reader, arch, path)
    extra["num_experts"], extra["num_shared_experts"] = extra.pop("n_routed_experts"), extra.pop("n_shared_experts")
    width = extra["moe_intermediate_size"] * extra["num_shared_experts"]
    shared = gguf_field(reader, f"{arch}.expert_shared_feed_forward_length")
    if shared is not None and width and int(shared) != width:
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.expert_shared_feed_forward_length = {shared}; its "
                         f"{extra['num_shared_experts']} shared experts of {extra['moe_intermediate_size']} are "
                         f"{width} wide")
    base, swa = (gguf_field(reader, f"{arch}.{k}") for k in ("rope.freq_base", "rope.freq_base_swa"))
    if swa is not None and swa != (10000.0 if base is None else base):
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.rope.freq_base_swa = {swa}, not rope.freq_base: EXAONE's "
                         "sliding layers take the model's RoPE")
    pattern = gguf_field(reader, f"{arch}.attention.sliding_window_pattern", 4)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.attention.sliding_window_pattern of {len(pattern)} "
                             f"entries for {layers} layers")
        extra["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        extra["sliding_window_pattern"] = int(pattern)
    extra["sliding_window"] = _gguf_need(reader, arch, path, "attention.sliding_window")
    return extra


def _gguf_delta(reader, arch: str, path: Path, layers: int, head_dim: int, n_ff: int) -> dict:
    """A qwen3next / qwen35 / qwen35moe file's ``extra`` (the DeltaNet layers' settings, the layer types, RoPE's share
    of each head, the mixture's), as llama.cpp runs it: ``ssm.group_count`` key heads and ``ssm.time_step_rank`` value
    heads, the keys ``ssm.state_size`` wide, the values ``ssm.inner_size`` / value heads (llama.cpp runs only files
    where the two are one width; its converter writes each), ``ssm.conv_kernel`` taps; every
    ``full_attention_interval``-th (4) layer attention, or those ``attention.recurrent_layers`` (a bool per layer)
    does not name; ``rope.dimension_count`` of ``attention.key_length``
    RoPE'd; qwen3next's and qwen35moe's experts of ``expert_feed_forward_length``, a shared expert of
    ``expert_shared_feed_forward_length``, always renormalised (llama.cpp's)."""
    need = lambda key: _gguf_need(reader, arch, path, key)  # noqa: E731
    k_heads, v_heads, width, inner = (need(k) for k in ("ssm.group_count", "ssm.time_step_rank", "ssm.state_size",
                                                        "ssm.inner_size"))
    if inner % v_heads or v_heads % k_heads:
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.ssm.inner_size = {inner} must be a multiple of "
                         f"ssm.time_step_rank ({v_heads}), and ssm.group_count ({k_heads}) divide the latter")
    recurrent = gguf_field(reader, f"{arch}.attention.recurrent_layers")
    if recurrent is not None:
        if len(recurrent) < layers:
            raise ValueError(f"GGUF file {str(path)!r}: {arch}.attention.recurrent_layers has {len(recurrent)} values "
                             f"for {layers} layers")
        types = ["linear_attention" if r else "full_attention" for r in list(recurrent)[:layers]]
    else:
        every = int(gguf_field(reader, f"{arch}.full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    extra = {"layer_types": types, "linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads,
             "linear_key_head_dim": width, "linear_value_head_dim": inner // v_heads, "linear_conv_kernel_dim":
             need("ssm.conv_kernel"), **_gguf_partial_rope(reader, arch, path, head_dim)}
    extra.setdefault("partial_rotary_factor", 1.0)
    if arch != "qwen35":
        count, used = _gguf_expert_counts(reader, arch, path)
        extra.update(num_experts=count, num_experts_per_tok=used, norm_topk_prob=True,
                     moe_intermediate_size=need("expert_feed_forward_length"),
                     shared_expert_intermediate_size=need("expert_shared_feed_forward_length"))
    return extra


def _gguf_delta_rows(config: LlamaConfig, sd: dict, arch: str, blocks: dict | None = None) -> dict:
    """A DeltaNet file's tensors (read under the model's names) in the checkpoint's layout: qwen3next's ``ssm_ba``
    (per key head its b rows, then its a rows) and its older files' ``ssm_in`` (the checkpoint's ``in_proj_qkvz``)
    split into the model's projections (:func:`_qwen3_next_projections`); qwen35's value heads, which its converter
    tiles where key heads serve several (value head ``j`` of key head ``g`` at ``j * k_heads + g``, as ggml
    broadcasts), put back in the checkpoint's grouped order (``g * r + j``) in every tensor indexed by them.
    ``blocks``: ``sd`` holds quantised rows (:func:`read_gguf_blocks`; key -> type name), whose columns move only as
    whole blocks: ``ssm_out``'s value heads then must each be whole blocks (else ``ValueError``)."""
    d = config.delta
    if arch == "qwen3next":
        return _qwen3_next_projections(config, sd)
    r = d.v_heads // d.k_heads
    if arch not in ("qwen35", "qwen35moe") or r == 1:
        return sd
    grouped = torch.arange(d.v_heads).reshape(r, d.k_heads).t().reshape(-1)  # (grouped head -> its tiled index)
    out = {}
    for name, t in sd.items():
        part = name.rsplit(".self_attn.", 1)[-1]
        if part in ("in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
            t = t.reshape(d.v_heads, -1, *t.shape[1:])[grouped].reshape(t.shape)
        elif part in ("in_proj_qkv.weight", "conv1d.weight"):
            qk, v = t.split([2 * d.k_heads * d.k_dim, d.v_heads * d.v_dim])
            t = torch.cat([qk, v.reshape(d.v_heads, d.v_dim, *v.shape[1:])[grouped].reshape(v.shape)])
        elif part == "out_proj.weight":
            if blocks is not None:  # (a row of blocks: a head's columns are whole blocks, or they cannot move)
                import gguf

                size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[blocks[name]]][0]
                if d.v_dim % size:
                    raise ValueError(f"{name}: its value heads ({d.v_dim} columns) are not whole {blocks[name]} "
                                     f"blocks of {size}, so qwen35's tiled heads cannot be put back in their order "
                                     "in the blocks (load the file in float: Llama.from_pretrained)")
            t = t.reshape(t.shape[0], d.v_heads, -1)[:, grouped].reshape(t.shape)
        out[name] = t
    return out


def _gguf_mtp(reader, arch: str) -> int:
    """How many multi-token prediction layers a file appends after the model's (``nextn_predict_layers``: GLM-4.5's
    glm4moe and GLM-4.7-Flash's deepseek2 files), which the model skips as llama.cpp's forward does."""
    return int(gguf_field(reader, f"{arch}.nextn_predict_layers", 0) or 0) if arch in _GGUF_MTP else 0


def _gguf_layer(name: str) -> int:
    """The layer a GGUF tensor belongs to (``blk.{i}.``), -1 for the others."""
    return int(name.split(".", 2)[1]) if name.startswith("blk.") else -1


def _gguf_need(reader, arch: str, path: Path, key: str) -> int:
    v = gguf_field(reader, f"{arch}.{key}")
    if v is None:
        raise ValueError(f"GGUF file {str(path)!r} lacks metadata {arch}.{key} (a {arch} file's)")
    return int(v)


def _gguf_grouped_mixture(reader, arch: str, path: Path, softmax: bool = False):
    """(sigmoid router, ``extra`` keys) of DeepSeek's mixture in a deepseek2 / glm4moe / dots1 file, as llama.cpp
    runs it: ``expert_gating_func`` 2 (sigmoid) is DeepSeek-V3's router (its correction bias ``exp_probs_b``, groups
    ``expert_group_count`` / ``expert_group_used_count`` where given, renormalised by ``expert_weights_norm``); with
    ``softmax`` (deepseek2) 1 or absent is DeepSeek-V2's softmax: greedy, or with ``expert_group_count`` > 1 V2's
    ``group_limited_greedy`` within ``expert_group_used_count`` groups ranked by their best expert, as the checkpoint's
    code ranks them (llama.cpp ranks them by their best two summed, V3's way: docs/model.md); renormalised softmax
    weights (``expert_weights_norm``) raise, as DeepSeek-V2's ``norm_topk_prob`` does in the config;
    ``expert_weights_scale`` (absent: 1), ``expert_shared_count`` shared experts (absent: none) and ``expert_count``
    experts of ``expert_feed_forward_length``, ``expert_used_count`` a token, dense layers before
    ``leading_dense_block_count``."""
    def get(key, default=None):
        return gguf_field(reader, f"{arch}.{key}", default)

    gating = int(get("expert_gating_func", 0) or 0)
    if gating not in ((0, 1, 2) if softmax else (2,)):
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.expert_gating_func = {gating}; supported: "
                         + ("1 (softmax, DeepSeek-V2's router) and 2 (sigmoid, DeepSeek-V3's)" if softmax
                            else "2 (sigmoid, DeepSeek-V3's router)"))
    v3 = gating == 2
    count, used = _gguf_expert_counts(reader, arch, path)
    groups, top_groups = (int(get(k, 0) or 0) for k in ("expert_group_count", "expert_group_used_count"))
    norm = bool(get("expert_weights_norm", False))
    if not v3 and norm:
        raise ValueError(f"GGUF file {str(path)!r}: a softmax router (DeepSeek-V2's) with {arch}.expert_weights_norm "
                         "= true: transformers' DeepSeek-V2 never renormalises its weights; not supported")
    extra = {"n_routed_experts": count, "num_experts_per_tok": used,
             "moe_intermediate_size": _gguf_need(reader, arch, path, "expert_feed_forward_length"),
             "n_shared_experts": int(get("expert_shared_count", 0) or 0),
             "first_k_dense_replace": int(get("leading_dense_block_count", 0) or 0),
             "routed_scaling_factor": float(get("expert_weights_scale", 0.0) or 1.0)}
    if v3:
        extra.update(norm_topk_prob=norm, n_group=groups or None, topk_group=(top_groups or None) if groups else None)
    elif groups > 1:  # (V2's groups: a missing used count raises in the config, naming topk_group)
        extra.update(topk_method="group_limited_greedy", norm_topk_prob=False, n_group=groups,
                     topk_group=top_groups or None)
    else:
        extra.update(topk_method="greedy", norm_topk_prob=False)
    return v3, extra


def _gguf_deepseek2(reader, arch: str, path: Path, rope_scaling):
    """(model type, rope_scaling, ``extra`` keys) of a deepseek2 GGUF file (llama.cpp's name for DeepSeek-V2 / V2.5 /
    V3 / R1 and Kimi K2: latent attention and DeepSeek's mixtures), as llama.cpp's converter writes them and llama.cpp
    runs the file. The latent attention's sizes: ``attention.kv_lora_rank``, ``attention.q_lora_rank`` (absent: one
    query projection), ``rope.dimension_count`` (the RoPE'd dims), the per-head query / key and value dims
    ``attention.key_length_mla`` / ``value_length_mla`` (files before them: ``attention.key_length`` /
    ``value_length``, which later files give as the latent head's, ``kv_lora_rank + rope`` / ``kv_lora_rank``). The
    mixture: :func:`_gguf_grouped_mixture` (sigmoid: ``deepseek_v3``; softmax: ``deepseek_v2``). RoPE on adjacent
    pairs (llama.cpp's normal RoPE: the checkpoint's rows as they are). YaRN: llama.cpp scales the scores by ``(1 +
    rope.scaling.yarn_log_multiplier * ln factor) ** 2`` and leaves cos and sin unscaled, DeepSeek's ``mscale`` equal
    to ``mscale_all_dim`` (``yarn_log_multiplier / 0.1``; the published checkpoints' own)."""
    def need(key):
        return _gguf_need(reader, arch, path, key)

    rank, rope = need("attention.kv_lora_rank"), need("rope.dimension_count")
    if gguf_field(reader, f"{arch}.attention.key_length_mla") is not None:
        qk, v = need("attention.key_length_mla"), need("attention.value_length_mla")
        latent = (need("attention.key_length"), gguf_field(reader, f"{arch}.attention.value_length", rank))
        # (kimi-linear's converter writes no value_length: the latent's, kv_lora_rank)
        if latent != (rank + rope, rank):
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.attention.key_length / value_length = {latent}; with "
                             f"the _mla lengths they are the latent head's, kv_lora_rank + rope.dimension_count and "
                             f"kv_lora_rank = ({rank + rope}, {rank})")
    else:
        qk, v = need("attention.key_length"), need("attention.value_length")
    if qk <= rope:
        raise ValueError(f"GGUF file {str(path)!r}: the query / key head of {qk} dims must hold more than its "
                         f"{rope} RoPE'd ones")
    v3, extra = _gguf_grouped_mixture(reader, arch, path, softmax=True)
    q_rank = gguf_field(reader, f"{arch}.attention.q_lora_rank")
    extra.update(kv_lora_rank=rank, q_lora_rank=int(q_rank) if q_rank else None, qk_nope_head_dim=qk - rope,
                 qk_rope_head_dim=rope, v_head_dim=v, **({"rope_interleave": True} if v3 else {}))
    log_mul = float(gguf_field(reader, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    if rope_scaling is not None and rope_scaling["rope_type"] == "yarn":
        if not log_mul > 0:
            raise ValueError(f"GGUF file {str(path)!r} has yarn RoPE scaling without "
                             f"{arch}.rope.scaling.yarn_log_multiplier > 0 (DeepSeek's mscale_all_dim / 10)")
        rope_scaling = {**rope_scaling, "mscale": log_mul / 0.1, "mscale_all_dim": log_mul / 0.1}
    elif log_mul:
        raise ValueError(f"GGUF file {str(path)!r} has {arch}.rope.scaling.yarn_log_multiplier = {log_mul} without "
                         "yarn RoPE scaling")
    return ("deepseek_v3" if v3 else "deepseek_v2"), rope_scaling, extra


def _gguf_minicpm3(reader, arch: str, path: Path, per_head: int) -> dict:
    """The ``extra`` keys of a minicpm3 file as llama.cpp's converter writes it and llama.cpp runs it: DeepSeek-V2's
    latent attention's sizes (``attention.kv_lora_rank``, ``attention.q_lora_rank`` where the queries have a low
    rank, ``attention.key_length`` the query / key head, ``rope.dimension_count`` its RoPE'd dims, the value head
    ``attention.value_length`` or hidden / heads), RoPE on half-split pairs, and MiniCPM3's three numbers, which
    llama.cpp fixes at MiniCPM3-4B's (scale_emb 12, scale_depth 1.4, dim_model_base 256; the file has no key for
    them)."""
    def need(key):
        return int(_gguf_need(reader, arch, path, key))

    rank, rope, qk = need("attention.kv_lora_rank"), need("rope.dimension_count"), need("attention.key_length")
    if qk <= rope:
        raise ValueError(f"GGUF file {str(path)!r}: the query / key head of {qk} dims must hold more than its "
                         f"{rope} RoPE'd ones")
    q_rank = gguf_field(reader, f"{arch}.attention.q_lora_rank")
    return {"kv_lora_rank": rank, "q_lora_rank": int(q_rank) if q_rank else None, "qk_nope_head_dim": qk - rope,
            "qk_rope_head_dim": rope, "v_head_dim": int(gguf_field(reader, f"{arch}.attention.value_length", 0) or 0)
            or per_head, "scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 256}


def _gguf_dsa(reader, arch: str, path: Path, dense_type: str, layers: int, context: int) -> dict:
    """The ``extra`` keys of DeepSeek's sparse attention in a deepseek32 (DeepSeek-V3.2) or glm-dsa (GLM-5) file, as
    llama.cpp's converter writes them: ``attention.indexer.head_count`` / ``key_length`` / ``top_k``; glm-dsa's
    ``attention.indexer.types`` (per layer, true where the layer has its own indexer), which llama.cpp takes, where
    a file lacks it, as every layer's below a 1M context and GLM-5.2's published pattern from 1M on (its first two
    layers and every fourth from the third: so here too). Their mixture must be DeepSeek-V3's (sigmoid)."""
    if dense_type != "deepseek_v3":
        raise ValueError(f"GGUF file {str(path)!r} of architecture {arch!r} has a softmax router "
                         f"({arch}.expert_gating_func); DeepSeek's sparse attention comes with V3's sigmoid router")
    extra = {key: _gguf_need(reader, arch, path, f"attention.indexer.{name}") for key, name in (
        ("index_n_heads", "head_count"), ("index_head_dim", "key_length"), ("index_topk", "top_k"))}
    if arch == "glm-dsa":
        full = gguf_field(reader, f"{arch}.attention.indexer.types")
        if full is None:
            full = [context < 1048576 or i < 2 or (i < 78 and (i - 2) % 4 == 0) for i in range(layers)]
        elif not isinstance(full, list) or len(full) != layers:
            raise ValueError(f"GGUF file {str(path)!r} has {arch}.attention.indexer.types = {full!r}; it needs one "
                             f"bool per layer ({layers})")
        extra["indexer_types"] = ["full" if f else "shared" for f in full]
    return extra


def _gguf_latent_weights(config: LlamaConfig, sd: dict, latent: dict, path: Path) -> dict:
    """``sd`` with each layer's ``kv_b_proj`` ``[heads * (qk_nope + v), kv_lora_rank]`` (each head's key rows, then its
    value rows) joined from the file's ``attn_k_b`` ``[heads, kv_lora_rank, qk_nope]`` (transposed by the converter)
    and ``attn_v_b`` ``[heads, v, kv_lora_rank]``, where it holds them so."""
    m, H = config.mla, config.num_attention_heads
    for i in range(config.num_hidden_layers):
        stem = f"model.layers.{i}.self_attn"
        k, v = latent.pop(f"{stem}.k_b_proj", None), latent.pop(f"{stem}.v_b_proj", None)
        if k is None and v is None:
            continue
        if (k is None or v is None or k.shape != (H, m.kv_lora_rank, m.qk_nope_head_dim)
                or v.shape != (H, m.v_head_dim, m.kv_lora_rank) or f"{stem}.kv_b_proj.weight" in sd):
            raise ValueError(f"GGUF file {str(path)!r}: layer {i} needs attn_k_b [{H}, {m.kv_lora_rank}, "
                             f"{m.qk_nope_head_dim}] and attn_v_b [{H}, {m.v_head_dim}, {m.kv_lora_rank}] (or one "
                             f"attn_kv_b), got {None if k is None else tuple(k.shape)} and "
                             f"{None if v is None else tuple(v.shape)}")
        sd[f"{stem}.kv_b_proj.weight"] = torch.cat([k.transpose(1, 2), v], dim=1).reshape(-1, m.kv_lora_rank)
    return sd


def _expert_blocks(stacked: dict) -> dict:
    """A mixture of experts' blocks (``stacked``: ``model.layers.{i}.mlp.{gate,up,down}_exps`` -> (type name,
    the file's ``[E, rows, bytes]``)) under the model's names, per expert: ``experts.{e}.gate_up_proj`` the gate's
    rows then the up's (both of one type, else left out: those experts stay float32; a gpt-oss file's fused
    ``gate_up_exps``: its rows, gate first), ``experts.{e}.down_proj``."""
    out = {}
    for key, (kind, data) in stacked.items():
        stem, proj = key.rsplit(".", 1)
        with warnings.catch_warnings():  # read-only views of the mapped file (gate_up: copies)
            warnings.simplefilter("ignore", UserWarning)
            blocks = torch.from_numpy(data).view(torch.uint8)
        if proj in ("down_exps", "gate_up_exps"):
            name = "down_proj" if proj == "down_exps" else "gate_up_proj"
            out.update({f"{stem}.experts.{e}.{name}.weight": (kind, b) for e, b in enumerate(blocks)})
        elif proj == "gate_exps" and stacked.get(f"{stem}.up_exps", (None,))[0] == kind:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                up = torch.from_numpy(stacked[f"{stem}.up_exps"][1]).view(torch.uint8)
            out.update({f"{stem}.experts.{e}.gate_up_proj.weight": (kind, torch.cat([g, u]))
                        for e, (g, u) in enumerate(zip(blocks, up))})
    return out


def _gguf_mrope(reader, arch: str, path: Path, head_dim: int) -> dict:
    """The ``extra`` of a qwen2vl / qwen3vl / qwen3vlmoe file's M-RoPE as llama.cpp runs it on text. Its
    ``rope.dimension_sections`` (four ints: the temporal, height, width and a fourth part of each head's
    RoPE pairs) give each pair a position stream: in order (qwen2vl's M-RoPE: pair ``i`` in part ``i mod (sum of
    the sections)``), or interleaved (qwen3vl's: ``s = i mod sum``; height where ``s mod 3 == 1`` and ``s < 3 h``,
    width where ``s mod 3 == 2`` and ``s < 3 w``, temporal where ``s mod 3 == 0`` and ``s < 3 t``, else the fourth).
    A text token's first three positions are its position and its fourth is 0: the pairs on the fourth stream are
    never turned (``rope_still_pairs``; none in Qwen2-VL's and Qwen2.5-VL's files, two of 64 in Qwen3-VL's, where
    transformers turns every pair by the token's position)."""
    sections = gguf_field(reader, f"{arch}.rope.dimension_sections")
    if sections is None:  # (llama.cpp requires it)
        raise ValueError(f"GGUF file {str(path)!r} lacks metadata {arch}.rope.dimension_sections")
    sections = list(sections) if isinstance(sections, (list, tuple)) else [sections]
    if not (len(sections) == 4 and all(_is_int(x) and x >= 0 for x in sections) and sum(sections) > 0):
        raise ValueError(f"GGUF file {str(path)!r}: {arch}.rope.dimension_sections = {sections!r} must be four ints "
                         ">= 0, not all 0 (as llama.cpp reads it)")
    t, h, w, _ = sections
    pairs = int(gguf_field(reader, f"{arch}.rope.dimension_count", head_dim)) // 2
    still = []
    for i in range(pairs):
        s = i % sum(sections)
        if arch == "qwen2vl":
            fourth = s >= t + h + w
        else:
            fourth = not (s % 3 == 1 and s < 3 * h or s % 3 == 2 and s < 3 * w or s % 3 == 0 and s < 3 * t)
        if fourth:
            still.append(i)
    return {"rope_still_pairs": still} if still else {}


def _gguf_experts(reader, arch: str, path: Path, model_type: str, n_ff: int) -> dict:
    """A mixture of experts' ``extra`` keys from a GGUF file, as llama.cpp runs it: ``expert_count`` experts,
    ``expert_used_count`` per token, renormalised (llama.cpp's ``norm_w``, on for these architectures), every layer
    sparse; qwen3moe's and qwen2moe's experts of width ``expert_feed_forward_length`` (else ``feed_forward_length``
    over the experts per token); qwen2moe: not renormalised (llama.cpp's ``norm_w`` off), and a shared expert of
    width ``expert_shared_feed_forward_length`` (else ``feed_forward_length``); olmoe: not renormalised, its experts
    of width ``feed_forward_length``."""
    count, used = _gguf_expert_counts(reader, arch, path)
    if model_type == "granitemoeshared":
        return {"num_local_experts": count, "num_experts_per_tok": used, "shared_intermediate_size": int(
            gguf_field(reader, f"{arch}.expert_shared_feed_forward_length"))}
    if model_type == "olmoe":  # its experts of width feed_forward_length, not renormalised (llama.cpp's norm_w off)
        return {"num_experts": count, "num_experts_per_tok": used, "norm_topk_prob": False}
    if model_type not in ("qwen3_moe", "qwen2_moe"):
        return {"num_local_experts": count, "num_experts_per_tok": used}
    width = int(gguf_field(reader, f"{arch}.expert_feed_forward_length", 0) or 0) or n_ff // used
    out = {"num_experts": count, "num_experts_per_tok": used, "moe_intermediate_size": width,
           "norm_topk_prob": model_type == "qwen3_moe"}
    if model_type == "qwen2_moe":
        out["shared_expert_intermediate_size"] = int(
            gguf_field(reader, f"{arch}.expert_shared_feed_forward_length", 0) or 0) or n_ff
    return out


def _gguf_expert_weights(config: LlamaConfig, sd: dict, stacked: dict, path: Path, partial: bool = False) -> dict:
    """``sd`` with the experts of each layer (``stacked``: ``model.layers.{i}.mlp.{gate,up,down}_exps`` ->
    ``[E, out, in]``, llama.cpp's ``ffn_*_exps``) added under the family's checkpoint names, written in that layout
    straight away (one copy; :func:`_build` joins each expert's gate and up); ``partial``: some were skipped
    (:func:`read_gguf`'s ``skip``), and their experts are left out."""
    if not stacked and (partial or config.experts is None):
        return sd
    spec = config.experts
    if spec is None:
        raise ValueError(f"GGUF file {str(path)!r} holds experts' tensors (ffn_*_exps) but no "
                         "<arch>.expert_count")
    out = _expert_names(config, sd, inverse=True)  # the routers (and a shared expert) under the family's names
    if config.model_type == "gpt_oss":
        return _gguf_gpt_oss_experts(config, out, stacked, path, partial)
    for i in range(config.num_hidden_layers):
        parts = [stacked.pop(f"model.layers.{i}.mlp.{k}_exps", None) for k in ("gate", "up", "down")]
        if not spec.layers[i] and parts == [None] * 3:
            continue  # (a dense layer: DeepSeek's first ones)
        if not spec.gated:  # (Nemotron 3's ungated experts: up and down, one by one under its mixer's names)
            for proj, t in (("up_proj", parts[1]), ("down_proj", parts[2])):
                if (t is None and not partial) or (t is not None and (t.dim() != 3 or t.shape[0] != spec.count)):
                    raise ValueError(f"GGUF file {str(path)!r}: layer {i} lacks ffn_up_exps / ffn_down_exps of "
                                     f"{spec.count} experts each")
                for e in range(spec.count if t is not None else 0):
                    out[f"model.layers.{i}.mixer.experts.{e}.{proj}.weight"] = t[e].clone()
            continue
        if any((p is None and not partial) or (p is not None and (p.dim() != 3 or p.shape[0] != spec.count))
               for p in parts):
            raise ValueError(f"GGUF file {str(path)!r}: layer {i} lacks ffn_gate_exps / ffn_up_exps / ffn_down_exps "
                             f"of {spec.count} experts each")
        gate, up, down = parts
        if config.model_type in _TRANSPOSED_EXPERTS:  # (Llama 4's: stacked as x @ W, [E, H, 2I] and [E, I, H])
            block, _, (gate_up, down_name) = _TRANSPOSED_EXPERTS[config.model_type]
            stem = f"model.layers.{i}.{block}.experts"
            if gate is not None and up is not None:
                out[f"{stem}.{gate_up}"] = torch.cat([gate, up], dim=1).transpose(1, 2).contiguous()
            if down is not None:
                out[f"{stem}.{down_name}"] = down.transpose(1, 2).contiguous()
            continue
        if config.model_type in _GGUF_GRANITE_TYPES[1:]:  # stacked in its checkpoints: [E, 2I, H] (gate; up), [E, H, I]
            stem = f"model.layers.{i}.block_sparse_moe"
            if gate is not None and up is not None:
                out[f"{stem}.input_linear.weight"] = torch.cat([gate, up], dim=1)
            if down is not None:
                out[f"{stem}.output_linear.weight"] = down
            continue
        for proj, t in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
            for e in range(spec.count if t is not None else 0):  # (each its own copy: saved apart)
                name = f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"
                if config.model_type == "lfm2_moe":  # (its hub checkpoints' names: feed_forward, w1 / w3 / w2)
                    name = _renamed({name: None}, [(b, a) for a, b in reversed(_LFM2_PAIRS)]).popitem()[0]
                mixtral = config.model_type in ("mixtral", "minimax_m2")
                out[_mixtral_name(name, inverse=True) if mixtral else name] = t[e].clone()
    if stacked:
        raise ValueError(f"unexpected GGUF tensors {sorted(stacked)[:3]} in {str(path)!r}")
    return out


def _gguf_gpt_oss_experts(config: LlamaConfig, out: dict, stacked: dict, path: Path, partial: bool) -> dict:
    """A gpt-oss file's experts (``stacked``: ``model.layers.{i}.mlp.{gate,up,down,gate_up}_exps`` and their
    ``_bias``: ``[E, out, in]`` and ``[E, out]``, gate and up apart or as one, gate first) added to ``out`` under
    transformers' stacked names (:func:`_gpt_oss_names`)."""
    spec, experts = config.experts, {}
    for i in range(config.num_hidden_layers):
        stem = f"model.layers.{i}.mlp"
        for what in ("", "_bias"):
            gate, up = (stacked.pop(f"{stem}.{k}_exps{what}", None) for k in ("gate", "up"))
            both = stacked.pop(f"{stem}.gate_up_exps{what}", None)
            if both is not None and gate is None and up is None:
                gate, up = both.chunk(2, dim=1)
            down = stacked.pop(f"{stem}.down_exps{what}", None)
            kind = "weight" if what == "" else "bias"
            for proj, t in (("gate_up_proj", None if gate is None or up is None else torch.cat([gate, up], 1)),
                            ("down_proj", down)):
                if t is None and partial and what == "":
                    continue  # (skipped by read_gguf's caller)
                if t is None or t.shape[0] != spec.count:
                    raise ValueError(f"GGUF file {str(path)!r}: layer {i} lacks its experts' {proj} {kind} "
                                     f"(ffn_gate_exps and ffn_up_exps or ffn_gate_up_exps, ffn_down_exps: .weight and "
                                     f".bias, {spec.count} experts each)")
                experts.update({f"{stem}.experts.{e}.{proj}.{kind}": t[e] for e in range(spec.count)})
    if stacked:
        raise ValueError(f"unexpected GGUF tensors {sorted(stacked)[:3]} in {str(path)!r}")
    return {**out, **_gpt_oss_names(experts, inverse=True)}


def _state_key(name: str, path: Path, arch: str, permuted: bool, n_head: int, n_kv: int):
    """(HF state-dict key, the head count to un-permute its rows by or ``None``) of GGUF tensor ``name``."""
    if name == "token_embd.weight":
        return "model.embed_tokens.weight", None
    if name == "token_embd_norm.weight" and arch in ("lfm2", "lfm2moe"):  # (LFM2's final norm: embedding_norm)
        return "model.norm.weight", None
    if name in ("token_embd_norm.weight", "token_embd_norm.bias"):  # (BLOOM's LayerNorm on the embeddings)
        return f"model.embed_layernorm.{name.split('.')[1]}", None
    if name == "position_embd.weight":  # (gpt2's, starcoder's learned positions)
        return "model.embed_positions.weight", None
    if name in ("output_norm.weight", "output_norm.bias"):  # (StarCoder 2's LayerNorm has a bias)
        return f"model.norm.{name.split('.')[1]}", None
    if name in ("output.weight", "output.bias"):  # (Phi-2's head has a bias)
        return f"lm_head.{name.split('.')[1]}", None
    if name.startswith("blk."):
        _, i, kind = name.split(".", 2)
        table = _GGUF_TABLES.get(arch, _GGUF_LAYER_TENSORS)
        if kind not in table:
            raise ValueError(f"unexpected GGUF tensor {name} in {str(path)!r} (triforce.models.Llama has no "
                             f"such parameter for architecture {arch!r})")
        heads = (n_head if kind.startswith("attn_q.") else n_kv if kind.startswith("attn_k.") else None) \
            if permuted else None
        return f"model.layers.{int(i)}.{table[kind]}", heads
    raise ValueError(f"unexpected GGUF tensor {name}")


def read_gguf_blocks(path: Path, types=("Q4_1", "Q8_0"), reader=None) -> dict:
    """``{HF state-dict key: (type name, uint8 [rows, bytes per row])}``: the file's 2-D tensors of the
    quantisation ``types`` as stored (GGUF blocks, each row its own run of blocks), rows in the model's
    order (``attn_q`` / ``attn_k`` un-permuted as :func:`read_gguf` does). Row ``n`` dequantises to row
    ``n`` of :func:`read_gguf`'s float32 tensor. ``reader``: as for :func:`read_gguf`. The blocks are read-only
    views of the file's memory map (permuted rows excepted): read them, never write to them. phi3, glm4: the fused
    tensors' rows split into the model's projections; q / k rows in the model's order with partial RoPE (a file's
    rope.dimension_count below its heads') or RoPE on adjacent pairs (phi3, glm4, glm4moe, minimax-m2, cohere2,
    deepseek2's latent attention: :func:`rotary_order`), as the model's weights are (copies, those)."""
    reader = reader if reader is not None else open_gguf(path)
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF file {str(path)!r} has architecture {arch!r}; supported: "
                         f"{', '.join(repr(a) for a in GGUF_ARCHITECTURES)}")
    permuted = GGUF_ARCHITECTURES[arch][1]
    n_head = int(gguf_field(reader, f"{arch}.attention.head_count")) or 1  # (mamba2's 0: no attention)
    n_kv = _gguf_kv_heads(reader, arch, path, n_head)
    out, stacked = {}, {}
    mtp = _gguf_mtp(reader, arch)
    layers = int(gguf_field(reader, f"{arch}.block_count", 0) or 0) - mtp
    for t in reader.tensors:
        kind = t.tensor_type.name
        if mtp and _gguf_layer(t.name) >= layers:
            continue  # (a multi-token prediction layer: read_gguf skips it)
        if kind in types and len(t.shape) == 3 and t.name.endswith("_exps.weight"):
            stacked[_state_key(t.name, path, arch, permuted, n_head, n_kv)[0]] = (kind, t.data)
            continue
        if kind not in types or len(t.shape) != 2 or t.name in _GGUF_ROPE_TENSORS or "norm." in t.name:
            continue  # (a norm's weight is no matmul's, even 2-D and in blocks: StableLM's per-head q / k norms)
        key, heads = _state_key(t.name, path, arch, permuted, n_head, n_kv)
        with warnings.catch_warnings():  # a read-only view of the mapped file, no copy: nothing writes to it
            warnings.simplefilter("ignore", UserWarning)
            blocks = torch.from_numpy(t.data).view(torch.uint8)
        out[key] = (kind, blocks if heads is None else _unpermute(blocks, heads).contiguous())
    out.update(_expert_blocks(stacked))
    family = FAMILIES[GGUF_ARCHITECTURES[arch][0]]
    # (fused rows split; rows reordered: RoPE on adjacent pairs, partial RoPE (fewer RoPE'd dims than a key's: GLM-4.5,
    # MiniMax-M2, the latent attention's RoPE'd rows))
    head = int(gguf_field(reader, f"{arch}.attention.key_length", 0) or 0) or int(
        gguf_field(reader, f"{arch}.embedding_length")) // n_head
    delta = GGUF_ARCHITECTURES[arch][0] in _DELTA_FAMILIES
    if delta or family.fused_projections or family.rope_interleaved or int(
            gguf_field(reader, f"{arch}.rope.dimension_count", head) or head) < head:
        config, _ = read_gguf(path, skip=lambda *_: True, reader=reader)  # the metadata only
        kinds = {}
        for key, (kind, _) in out.items():  # each part of a fused tensor keeps its type
            kinds.update(dict.fromkeys(fused_parts(key) or [key], kind))
        rows = {k: b for k, (_, b) in out.items()}
        if delta:  # (the DeltaNet files' rows as read_gguf's: split, reordered; the attention's gate rows apart)
            rows = _delta_names(config, _gguf_delta_rows(config, rows, arch, kinds))
            for key in rows:
                kinds.setdefault(key, kinds.get(key.replace(".gate_proj.", ".q_proj."))
                                 or kinds.get(re.sub(r"in_proj_(qkv|z)\.", "in_proj_qkvz.", key))
                                 or kinds.get(re.sub(r"in_proj_[ab]\.", "in_proj_ba.", key)))
        rows = _order_rotary_dims(config, _split_projections(config, rows))
        out = {key: (kinds[key], b) for key, b in rows.items()}
    return out
