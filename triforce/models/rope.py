"""Rotary position embedding (half-split layout, as Hugging Face Llama), incl. Llama-3 scaling.

Shared by the model (queries and keys of each forward) and the StreamingLLM cache (which re-positions
its window keys to their new slots after an eviction).
"""
from __future__ import annotations

import math

import torch

from .config import LlamaConfig


def rope_inv_freq(config: LlamaConfig, device=None) -> torch.Tensor:
    """float32 ``[head_dim // 2]`` inverse frequencies, after ``config.rope_scaling``."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    kind = config.rope_type
    if kind == "linear":
        inv_freq = inv_freq / config.rope_scaling["factor"]
    elif kind == "llama3":
        # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, a smooth blend between.
        rs = config.rope_scaling
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_ctx / lo, old_ctx / hi
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos, sin ``[B, T, 1, head_dim]`` in ``dtype`` for int ``positions`` ``[B, T]`` (fp32 angles)."""
    freqs = positions.float()[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` ``[B, T, H, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
