"""Rotary position embedding (half-split layout, as Hugging Face Llama), incl. linear, Llama-3, YaRN and
LongRoPE scaling.

Shared by the model (queries and keys of each forward) and the StreamingLLM cache (which re-positions
its window keys to their new slots after an eviction).
"""
from __future__ import annotations

import math

import torch

from .config import LlamaConfig


def rope_inv_freq(config: LlamaConfig, device=None, long: bool = False) -> torch.Tensor:
    """float32 ``[head_dim // 2]`` inverse frequencies, after ``config.rope_scaling``. LongRoPE has two sets, each
    pair's frequency divided by its factor: ``short_factor``'s, and with ``long`` ``long_factor``'s (which apply
    to a sequence is the caller's: docs/model.md, "LongRoPE"); ``long`` is ignored by every other RoPE."""
    dim = config.rotary_dim
    kind = config.rope_type
    if kind == "longrope":  # (as transformers: 1 / (factor * base ** (2i / dim)))
        factors = torch.tensor(config.rope_scaling["long_factor" if long else "short_factor"], dtype=torch.float32,
                               device=device)
        return _still_pairs(config, 1.0 / (factors * config.rope_theta ** (
            torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim)))
    base = config.rope_theta
    if kind == "proportional":  # (Gemma 4's, LFM3's: the whole head's pairs, the first partial_rotary_factor of them
        # turning at base ** (-2i / head_dim), the others not: zeros, cos 1 and sin 0; as transformers computes it)
        f = config.extra.get("partial_rotary_factor", 1.0)
        turning = int(f * config.head_dim // 2)
        inv_freq = 1.0 / (base ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64, device=device).float()
                                   / config.head_dim))
        inv_freq = torch.cat([inv_freq, torch.zeros(config.head_dim // 2 - turning, device=device)])
        return inv_freq / config.rope_scaling.get("factor", 1.0)
    if kind == "dynamic" and "alpha" in config.rope_scaling:  # Hunyuan's NTK alpha: the base stretched once (as
        alpha = config.rope_scaling["alpha"]  # transformers computes it, in Python)
        base = base * alpha ** (config.head_dim / (config.head_dim - 2))
    elif kind == "dynamic":  # transformers' dynamic NTK RoPE, at a length within the context: the base its start
        # computes for the context's length M, in Python as it does (base times 1 unless factor * M / M rounds away from
        # factor); it grows the base only past M, where no cache here reaches (docs/model.md, "Dynamic RoPE")
        factor, m = config.rope_scaling["factor"], config.max_position_embeddings
        base = base * ((factor * m / m) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
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
        # (low_freq_factor == high_freq_factor, Llama 4 Scout's: no band to blend, its 0 / 0 never chosen, as
        # transformers computes it; a pair exactly at the one wavelength would be: raised below)
        inv_freq = torch.where(is_medium, smoothed, scaled)
        if not bool(torch.isfinite(inv_freq).all()):
            raise ValueError(f"rope_scaling {rs!r}: a pair's frequency lies on the blend's empty band (0 / 0); "
                             "transformers would compute NaN for it")
    elif kind == "yarn":
        inv_freq = _yarn_inv_freq(config, device)
    return _still_pairs(config, inv_freq)


def _still_pairs(config: LlamaConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """Partial RoPE (``config.rotary_dim < head_dim``): the rotated pairs' frequencies, then a 0 for each pair of
    the dims RoPE leaves as they are (angle 0: cos 1 and sin 0, which leave a value exactly as it is). The loader
    orders each head's q and k dims so that those pairs are the ones (docs/model.md, "Partial RoPE"). A 0 too for
    the pairs ``config.extra["rope_still_pairs"]`` names (llama.cpp's M-RoPE on text: docs/model.md)."""
    still = config.head_dim // 2 - inv_freq.numel()
    if config.extra.get("rope_still_pairs"):
        inv_freq = inv_freq.clone()
        inv_freq[config.extra["rope_still_pairs"]] = 0.0
    return inv_freq if still == 0 else torch.cat([inv_freq, inv_freq.new_zeros(still)])


def rope_local_inv_freq(config: LlamaConfig, device=None) -> torch.Tensor | None:
    """float32 ``[head_dim // 2]`` inverse frequencies of the layers that do not take the model's RoPE
    (``config.rope_layers``): Gemma 3's sliding-window layers (plain RoPE with ``config.local_rope_theta``),
    SmolLM3's NoPE layers (zeros: cos 1 and sin 0, so ``x * 1 + y * 0`` leaves every query and key as it is);
    None where every layer takes the model's."""
    if all(config.rope_layers):
        return None
    theta = config.local_rope_theta
    dim = config.local_rotary_dim
    if theta is None:  # NoPE
        return torch.zeros(config.head_dim // 2, device=device)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    return inv_freq if dim == config.head_dim else _still_pairs(config, inv_freq)


def _yarn_inv_freq(config: LlamaConfig, device=None) -> torch.Tensor:
    """YaRN (Peng et al., 2023), as transformers computes it: the pairs that turn fewer than ``beta_slow``
    times over the original context are interpolated (divided by ``factor``), those that turn more than
    ``beta_fast`` times keep their frequency, and a linear ramp over the pair index blends the ones between
    (its ends rounded outwards with ``truncate``)."""
    rs, dim, base = config.rope_scaling, config.rotary_dim, config.rope_theta
    factor, ctx = rs["factor"], rs["original_max_position_embeddings"]
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def pair_of(turns):  # the (fractional) pair index whose wavelength fits `turns` times into ctx
        return dim * math.log(ctx / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_of(beta_fast), pair_of(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, device=device).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(device)
    keep = 1 - ramp  # 1: the pair keeps its frequency (extrapolation), 0: interpolated
    return interpolation * (1 - keep) + extrapolation * keep


def rope_attention_scale(config: LlamaConfig) -> float:
    """The factor on cos and sin (so ``factor**2`` on every attention score): YaRN's ``attention_factor``,
    by default ``0.1 ln(factor) + 1`` (with ``mscale`` and ``mscale_all_dim``: the ratio of that formula at
    the two); LongRoPE's, by default ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` with
    ``factor`` (default: ``max_position_embeddings / original_max_position_embeddings``; 1.0 where it is at
    most 1), on both factor sets; 1.0 for every other RoPE."""
    if config.rope_type not in ("yarn", "longrope"):
        return 1.0
    rs = config.rope_scaling
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    if config.rope_type == "longrope":
        ctx = rs["original_max_position_embeddings"]
        factor = rs.get("factor") or config.max_position_embeddings / ctx
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(ctx))

    def m(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    factor = rs["factor"]
    if rs.get("mscale") and rs.get("mscale_all_dim"):
        return float(m(factor, rs["mscale"]) / m(factor, rs["mscale_all_dim"]))
    return float(m(factor))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    """cos, sin ``[B, T, 1, head_dim]`` in ``dtype`` for int ``positions`` ``[B, T]`` (fp32 angles), each times
    ``scale`` (:func:`rope_attention_scale`) in fp32 before the rounding to ``dtype``, but for the pairs of
    frequency 0 (the dims partial RoPE leaves as they are: cos 1 and sin 0, unscaled, as transformers passes
    them). ``inv_freq``: ``[head_dim // 2]``, or ``[B, head_dim // 2]`` per row (:func:`rows_inv_freq`)."""
    per_row = inv_freq.dim() == 2
    freqs = positions.float()[..., None] * (inv_freq[:, None, :] if per_row else inv_freq)  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    if scale == 1.0:
        return emb.cos().to(dtype), emb.sin().to(dtype)
    # (the scale as a float32 tensor: the same products as by the Python float)
    factor = torch.where(inv_freq == 0, 1.0, scale).to(torch.float32)
    factor = torch.cat((factor, factor), dim=-1)
    factor = factor[:, None, None, :] if per_row else factor
    return (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)


def rows_inv_freq(short: torch.Tensor, long: torch.Tensor | None, rows_long: torch.Tensor | None) -> torch.Tensor:
    """LongRoPE's frequencies per row, ``[B, head_dim // 2]``: ``long`` where the bool ``rows_long`` ``[B]`` is
    set, else ``short``; ``short`` itself (shared by every row) when there is no long set or no per-row choice."""
    if long is None or rows_long is None:
        return short
    return torch.where(rows_long[:, None], long, short)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` ``[B, T, H, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
