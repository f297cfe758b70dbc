"""Naive PyTorch oracle of ``tk.verify_attention`` (docs/design.md 3.2)."""
from __future__ import annotations

import math

import torch


def visibility(cache_seqlens: torch.Tensor, T: int, N: int, tree_mask: torch.Tensor | None,
               window: int | None = None, cache_leftpad: torch.Tensor | None = None) -> torch.Tensor:
    """bool ``[B, T, N]``: may query ``t`` of row ``b`` attend to cache position ``n``?

    With ``L = cache_seqlens[b]``: ``n < L`` and (``n < L - T`` (prefix) or ``tree_mask[b, t, n - (L - T)]``;
    causal ``n - (L - T) <= t`` when ``tree_mask`` is None). Positions outside ``[0, min(L, N))`` are never
    visible, which also defines the result for out-of-range lengths (the GPU kernels clamp).

    ``window`` (a sliding window of W keys): a query keeps only the last W of the positions it would see
    without it. Its positions in order are its ranks (the prefix, then the new tokens it sees: for a tree
    node its ancestors, at the positions they take once committed), so this is ``q_pos - k_pos < W`` in
    those terms: a causal query at position p sees p - W + 1 .. p.

    ``cache_leftpad`` (int32 ``[B]``): row ``b``'s prefix starts at ``cache_leftpad[b]`` (clamped to ``[0, L - T]``):
    no query sees a position below it, and a window counts the positions from there."""
    B = cache_seqlens.shape[0]
    dev = cache_seqlens.device
    L = cache_seqlens.long().view(B, 1, 1)
    pos = torch.arange(N, device=dev).view(1, 1, N)
    rel = pos - (L - T)  # index into the T new tokens (negative: prefix)
    if tree_mask is None:
        new_ok = rel <= torch.arange(T, device=dev).view(1, T, 1)
    else:
        new_ok = tree_mask.to(dev).gather(2, rel.clamp(0, max(T - 1, 0)).expand(B, T, N))
    vis = (pos < L) & ((rel < 0) | new_ok)
    if cache_leftpad is not None:
        prefix = (L - T).clamp(min=0).clamp(max=N)
        start = torch.minimum(cache_leftpad.to(dev).long().view(B, 1, 1).clamp(min=0), prefix)
        vis = vis & (pos >= start)
    if window is not None:
        later = vis.flip(-1).long().cumsum(-1).flip(-1)  # the positions it sees at n or after
        vis = vis & (later <= window)
    return vis


def alibi_distances(vis: torch.Tensor) -> torch.Tensor:
    """int64 ``[B, T, N]``: for each position a query sees, how many positions it sees after it (its distance in
    the query's ranks: ``q_pos - k_pos`` for a causal query, in committed positions for a tree node); 0 where
    it does not see the position."""
    later = vis.flip(-1).long().cumsum(-1).flip(-1)  # the positions it sees at n or after
    return torch.where(vis, later - 1, torch.zeros((), dtype=torch.long, device=vis.device))


def _verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask=None, softmax_scale=None,
                      compute_dtype=None, window=None, softcap=None, cache_leftpad=None, alibi_slopes=None):
    """``(out, lse)`` computed in ``compute_dtype`` (default: float64 for float64 inputs, else float32).

    The same computation in a low precision (``compute_dtype=torch.bfloat16``) is the "PyTorch in the
    kernel's precision" baseline of the tests' tolerance rule."""
    B, T, Hq, D = q.shape
    N, Hkv = k_cache.shape[1], k_cache.shape[2]
    g = Hq // Hkv
    if compute_dtype is None:
        compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    vis = visibility(cache_seqlens.to(q.device), T, N, tree_mask, window, cache_leftpad)  # [B, T, N]
    in_range = vis.any(dim=1)  # [B, N]: positions some query reads (all < L)
    qc = q.to(compute_dtype).reshape(B, T, Hkv, g, D)
    kc = k_cache.to(compute_dtype).masked_fill(~in_range[:, :, None, None], 0)  # NaN beyond L never leaks
    vc = v_cache.to(compute_dtype).masked_fill(~in_range[:, :, None, None], 0)
    scores = torch.einsum("btkgd,bnkd->bkgtn", qc, kc) * scale
    if softcap:  # Gemma 2's soft-capping of the scaled scores
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:  # ALiBi: -slope x the key's distance from the query, after the cap
        slopes = alibi_slopes.to(q.device, compute_dtype).expand(B, Hq).reshape(B, Hkv, g, 1, 1)
        scores = scores - slopes * alibi_distances(vis)[:, None, None].to(compute_dtype)
    scores = scores.masked_fill(~vis[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores.to(torch.float32 if compute_dtype != torch.float64 else compute_dtype), dim=-1)
    finite = torch.isfinite(lse)[..., None]
    if compute_dtype in (torch.float16, torch.bfloat16):
        p = torch.softmax(scores, dim=-1)  # in that precision, like flash-attn's attention_ref(upcast=False)
    else:
        p = torch.exp(scores - lse[..., None].to(compute_dtype))
    p = torch.where(finite & vis[:, None, None], p, torch.zeros((), dtype=p.dtype))
    # A value a query cannot see never reaches its output, inf and NaN included (0 * NaN would be NaN);
    # a non-finite value a query sees makes its output NaN in that column.
    # (no data-dependent branch: the reference stays free of host synchronisation on a GPU)
    bad = ~torch.isfinite(vc)
    seen = torch.einsum("btn,bnkd->btkd", vis.to(compute_dtype), bad.to(compute_dtype)) > 0
    out = torch.einsum("bkgtn,bnkd->btkgd", p, vc.masked_fill(bad, 0))
    out = out.masked_fill(seen[:, :, :, None], float("nan")).reshape(B, T, Hq, D)
    lse = lse.reshape(B, Hq, T).to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    return out.to(q.dtype), lse


def verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask=None, softmax_scale=None, return_lse=False,
                     window=None, softcap=None, cache_leftpad=None, alibi_slopes=None):
    """Reference ``tk.verify_attention``: dense masked attention over the whole cache, float32
    (float64 for float64 inputs)."""
    out, lse = _verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, window=window,
                                 softcap=softcap, cache_leftpad=cache_leftpad, alibi_slopes=alibi_slopes)
    return (out, lse) if return_lse else out
