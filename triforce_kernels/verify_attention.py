"""``tk.verify_attention``: attention of T new (draft) tokens over a long KV cache with a causal or
tree mask on the new tokens (docs/design.md 3.2).

Files:
    reference  triforce_kernels/reference/verify_attention.py
    triton     triforce_kernels/triton/verify_attention.py
    cpu        csrc/include/triforce/verify_attention.h (kernel), csrc/include/triforce/softcap.h (the scores'
               soft cap), csrc/cpu/verify_attention.cpp (launcher)
    tests      tests/test_verify_attention.py, tests/test_verify_attention_window.py,
               tests/test_verify_attention_softcap.py, tests/test_verify_attention_leftpad.py,
               csrc/tests/test_verify_attention.cpp
    benchmark  bench/bench_verify_attention.py
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ._backend import custom_op, eager_call, implementation, register, register_lazy, resolve
from ._validate import check_float_tensor, check_tensor
from .reference.verify_attention import _verify_attention as _reference

register("verify_attention", "reference")(_reference)
register_lazy("verify_attention", "triton", "triforce_kernels.triton.verify_attention")


@register("verify_attention", "cpu")
def _cpu(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, num_splits=0, window=None, softcap=None,
         cache_leftpad=None, alibi_slopes=None):
    return torch.ops.triforce_C.verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale,
                                                 num_splits, window or 0, softcap or 0.0, cache_leftpad, alibi_slopes)


def check_cache_rows(name: str, cache: torch.Tensor) -> None:
    """Every backend reads a cache in place, in rows of D contiguous elements (any B/N/H strides). It is
    never copied: a copy of a long cache on every call (every layer, every step) would cost more than
    the attention itself, so a strided last dim raises instead."""
    if cache.shape[-1] > 1 and cache.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1, got {cache.stride(-1)}): "
                         "it is read in place, never copied; allocate the cache with contiguous rows of D "
                         "elements (strides over B, N and H may be anything)")


@custom_op("triforce::verify_attention")
def _verify_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cache_seqlens: torch.Tensor, tree_mask: Optional[torch.Tensor], softmax_scale: float,
                         backend: str, window: int = 0, softcap: float = 0.0,
                         cache_leftpad: Optional[torch.Tensor] = None,
                         alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    _check_values_on_cpu(cache_seqlens, q.shape[1], k_cache.shape[1], cache_leftpad, alibi_slopes)
    return implementation("verify_attention", backend)(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale,
                                                       window=window or None, softcap=softcap or None,
                                                       cache_leftpad=cache_leftpad, alibi_slopes=alibi_slopes)


def _check_values_on_cpu(cache_seqlens: torch.Tensor, T: int, N: int, cache_leftpad=None, alibi_slopes=None) -> None:
    """``T <= cache_seqlens <= N``, ``0 <= cache_leftpad <= cache_seqlens - T`` and finite ``alibi_slopes``, checked
    only on CPU tensors, where reading them costs nothing (a GPU check would be a host synchronisation; the kernels
    clamp there instead). It runs inside the custom op, on real tensors, so it holds under ``torch.compile`` too: in the
    wrapper, the read would break a ``fullgraph=True`` graph."""
    if cache_seqlens.device.type == "cpu" and cache_seqlens.numel():
        lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
        if lo < T or hi > N:
            raise ValueError(f"cache_seqlens must be in [T, N] = [{T}, {N}] (lengths include the T new tokens), "
                             f"got values in [{lo}, {hi}]")
        if cache_leftpad is not None:
            bad = (cache_leftpad < 0) | (cache_leftpad > cache_seqlens - T)
            if bool(bad.any()):
                b = int(bad.nonzero()[0, 0])
                raise ValueError(f"cache_leftpad must be in [0, cache_seqlens - T] (where a row's prefix starts), "
                                 f"got {int(cache_leftpad[b])} for row {b} (cache_seqlens {int(cache_seqlens[b])}, "
                                 f"T = {T})")
    if alibi_slopes is not None and alibi_slopes.device.type == "cpu" and not bool(alibi_slopes.isfinite().all()):
        raise ValueError("alibi_slopes must be finite (each head's slope)")


@_verify_attention_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, backend, window=0, softcap=0.0,
      cache_leftpad=None, alibi_slopes=None):
    B, T, Hq, D = q.shape
    return q.new_empty((B, T, Hq, D)), q.new_empty((B, Hq, T), dtype=torch.float32)


def verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                     tree_mask: torch.Tensor | None = None, softmax_scale: float | None = None,
                     return_lse: bool = False, *, window: int | None = None, softcap: float | None = None,
                     cache_leftpad: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                     backend: str | None = None):
    """Attention of ``T`` new tokens over a KV cache that already holds them at its end.

    With ``L = cache_seqlens[b]`` the new tokens' keys/values sit at positions ``L-T .. L-1``. Query
    ``t`` attends to every prefix position ``< L-T`` and to new position ``L-T+s`` iff
    ``tree_mask[b, t, s]`` (``tree_mask=None``: iff ``s <= t``, causal, bottom-right aligned as in
    ``flash_attn_with_kvcache``). Positions ``>= L`` are never read. For ``T = 4``, ``L = 7``::

        position   0 1 2 | 3 4 5 6 | 7 ...        causal           tree (parents -1 0 0 1)
        query 0    x x x | x . . . | never read   x . . .          x . . .
        query 1    x x x | x x . . |              x x . .          x x . .
        query 2    x x x | x x x . |              x x x .          x . x .
        query 3    x x x | x x x x |              x x x x          x x . x

    A query that sees no position (a tree row of all False with an empty prefix) yields output 0 and
    ``lse = -inf``. Scores and the softmax are accumulated in float32 whatever the input dtype.

    ``window=W`` (a sliding window, as Mistral's, Gemma's or Qwen's ``sliding_window``): a query sees only
    the last W of the positions above, taken in order (the prefix, then the new tokens it sees; a tree
    node's ancestors count at the positions they take once committed). A causal query at position p then
    sees ``p - W + 1 .. p`` (``q_pos - k_pos < W``; flash-attn's ``window_size=(W - 1, 0)``). For ``T = 4,
    L = 7, W = 3``, causal: query 0 sees 1 2 3, query 3 sees 4 5 6. Positions outside a query's window
    never affect it, inf and NaN included.

    ``cache_leftpad`` (flash-attn's name in ``flash_attn_with_kvcache``): row ``b``'s prefix starts at
    ``cache_leftpad[b]`` instead of 0: no query of the row sees a position below it (left padding; a
    StreamingLLM cache's sinks that a sliding window no longer reaches), and a window counts the positions
    from there. For ``T = 4, L = 7``, ``cache_leftpad = 2``, causal: query 0 sees 2 3, query 3 sees 2 3 4 5 6.

    ``softcap=c`` (Gemma 2's attention soft-capping): every scaled score s becomes ``c * tanh(s / c)`` before
    the softmax.

    ``alibi_slopes`` (ALiBi: BLOOM's, MPT's, Falcon-RW's positions; flash-attn's name): query head h of row b
    adds ``-alibi_slopes[b, h] * d`` to the score of a key it sees, after the soft cap, where d is the number
    of positions the query sees after that key: ``q_pos - k_pos`` for a causal query (0 for its own key), in
    committed positions for a tree node; left padding and a window's start do not change it. For ``T = 4,
    L = 7``, causal, query 1 (position 4) adds ``-slope * (4, 3, 2, 1, 0)`` over positions 0 .. 4.

    Args:
        q: ``[B, T, Hq, D]`` float32/float16/bfloat16 (after RoPE), any strides.
        k_cache, v_cache: ``[B, N, Hkv, D]`` ("NHD"), same dtype as ``q``; any strides over B, N and
            H (e.g. a slice of a larger batch), but a contiguous last dim (``stride(-1) == 1``): the
            caches are read in place and never copied, so a strided last dim raises ``ValueError``.
            ``Hq`` must be a multiple of ``Hkv`` (GQA: query head ``j`` reads KV head ``j // (Hq // Hkv)``).
        cache_seqlens: int32 ``[B]``, ``T <= cache_seqlens[b] <= N`` (valid lengths including the T new
            tokens; ragged across the batch). Checked (raising ``ValueError``) only when it is a CPU
            tensor, where that costs nothing; a GPU check would be a host synchronisation, so there the
            kernels clamp instead: only positions in ``[0, min(L, N))`` are ever read.
        tree_mask: bool ``[B, T, T]`` or None (causal). ``tk.tree_attention_mask(parents)`` builds it.
        softmax_scale: score scale, default ``1 / sqrt(D)``.
        return_lse: also return the natural-log log-sum-exp of the scaled scores.
        window: a positive int (a sliding window of that many keys), or None (every key).
        softcap: a positive number (soft-capping of the scores), or None.
        cache_leftpad: int32 ``[B]``, ``0 <= cache_leftpad[b] <= cache_seqlens[b] - T`` (the first position each
            row's queries see), or None (0). Checked like ``cache_seqlens``: on a CPU tensor only (a GPU check
            would be a host synchronisation: the kernels clamp it to ``[0, cache_seqlens - T]`` there).
        alibi_slopes: float32 ``[Hq]`` (every row) or ``[B, Hq]``, or None (no ALiBi). Finiteness is checked on a
            CPU tensor only (as the lengths; a non-finite slope on a GPU gives non-finite rows).
        backend: ``"reference" | "triton" | "cpu" | None`` (automatic; see ``triforce_kernels._backend``).

    Returns:
        ``out`` ``[B, T, Hq, D]`` in ``q``'s dtype, and with ``return_lse`` also ``lse`` float32
        ``[B, Hq, T]``.

    Example:
        >>> k_cache[b, L:L + T], v_cache[b, L:L + T] = k_new, v_new      # append first
        >>> out = tk.verify_attention(q, k_cache, v_cache, lengths + T,
        ...                           tree_mask=tk.tree_attention_mask(parents))
    """
    check_float_tensor("q", q, ndim=4)
    dev = q.device
    B, T, Hq, D = q.shape
    if T < 1:
        raise ValueError(f"q must hold at least one query token (T >= 1), got shape {list(q.shape)}")
    check_tensor("k_cache", k_cache, ndim=4, dtypes=(q.dtype,), device=dev, shape=(B, None, None, D))
    N, Hkv = k_cache.shape[1], k_cache.shape[2]
    check_tensor("v_cache", v_cache, ndim=4, dtypes=(q.dtype,), device=dev, shape=(B, N, Hkv, D))
    check_cache_rows("k_cache", k_cache)
    check_cache_rows("v_cache", v_cache)
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"the number of query heads (q.shape[2] = {Hq}) must be a multiple of the number of "
                         f"KV heads (k_cache.shape[2] = {Hkv})")
    check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,), device=dev, shape=(B,))
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask, ndim=3, dtypes=(torch.bool,), device=dev, shape=(B, T, T))
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(D)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    elif not math.isfinite(softmax_scale):
        raise ValueError("softmax_scale must be finite")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    window = check_window(window)
    softcap = check_softcap(softcap)
    if cache_leftpad is not None:
        check_tensor("cache_leftpad", cache_leftpad, ndim=1, dtypes=(torch.int32,), device=dev, shape=(B,))
    alibi_slopes = check_alibi_slopes(alibi_slopes, B, Hq, dev)
    out, lse = eager_call(_verify_attention_op, q, k_cache, v_cache, cache_seqlens, tree_mask, float(softmax_scale),
                          resolve("verify_attention", backend, dev), window, softcap, cache_leftpad, alibi_slopes)
    return (out, lse) if return_lse else out


def check_window(window) -> int:
    """``window`` as the ops take it: a positive int, or 0 for None (no sliding window)."""
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be a positive int or None, got {type(window).__name__}")
    if not 1 <= window < 2 ** 31:
        raise ValueError(f"window must be in [1, 2^31) (the keys a query sees, its own included), got {window}")
    return window


def check_alibi_slopes(alibi_slopes, B: int, Hq: int, device) -> torch.Tensor | None:
    """``alibi_slopes`` as the ops take it: None, or float32 ``[Hq]`` / ``[B, Hq]`` on ``device`` with a unit last
    stride (a ``[B, Hq]`` view with another last stride is made contiguous: Hq floats)."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a float32 tensor or None, got {type(alibi_slopes).__name__}")
    if alibi_slopes.ndim == 1:
        check_tensor("alibi_slopes", alibi_slopes, ndim=1, dtypes=(torch.float32,), device=device, shape=(Hq,))
    else:
        check_tensor("alibi_slopes", alibi_slopes, ndim=2, dtypes=(torch.float32,), device=device, shape=(B, Hq))
    return alibi_slopes if alibi_slopes.stride(-1) == 1 or Hq == 1 else alibi_slopes.contiguous()


def check_softcap(softcap) -> float:
    """``softcap`` as the ops take it: a positive finite float, or 0.0 for None (no soft-capping)."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a positive number or None, got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be a finite number > 0 (the scores' cap), got {softcap}")
    return float(softcap)


def verify_attention_trusted(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             cache_seqlens: torch.Tensor, tree_mask: torch.Tensor | None = None,
                             window: int = 0, scale: float | None = None, softcap: float = 0.0,
                             return_lse: bool = False, cache_leftpad: torch.Tensor | None = None,
                             alibi_slopes: torch.Tensor | None = None):
    """``verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, scale, return_lse, window=window or None,
    softcap=softcap or None, cache_leftpad=cache_leftpad, alibi_slopes=alibi_slopes)`` without the argument checks,
    for callers that build every argument themselves (the model layer's caches: ``triforce/models/cache.py``).
    The same backend choice and the same kernels; the CPU kernel is called directly outside
    ``torch.compile`` (the custom op's Python dispatch and the checks cost ~40 us per call, ~40% of a
    SmolLM2 decode layer's attention at 1000 tokens of context). Invalid arguments are not diagnosed here
    (except the custom op's CPU length check, on the paths that go through the op); every kernel still
    clamps lengths to ``[0, N]`` (never reads outside the cache)."""
    backend = resolve("verify_attention", None, q.device)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if backend == "cpu" and not torch.compiler.is_compiling():
        out = torch.ops.triforce_C.verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, scale, 0,
                                                    window, softcap, cache_leftpad, alibi_slopes)
    else:
        out = eager_call(_verify_attention_op, q, k_cache, v_cache, cache_seqlens, tree_mask, scale, backend, window,
                         softcap, cache_leftpad, alibi_slopes)
    return tuple(out) if return_lse else out[0]
