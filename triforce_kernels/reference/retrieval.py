"""Naive PyTorch oracles of the retrieval-cache ops (docs/design.md 3.1): score, select, gather, build.

Same signatures as the public ops (minus ``backend``). Scores are computed in float32, or in float64
when an input is float64 (tests use that as the exact result). ``num_chunks`` is clamped to
``[0, C]`` exactly as the kernels clamp it (no host synchronisation is needed to validate it).
"""
import math

import torch


def score_chunks(q: torch.Tensor, chunk_keys: torch.Tensor, num_chunks: torch.Tensor) -> torch.Tensor:
    """``score[b,h,c] = sum_{j in group h} softmax_{c < n_b}(q[b,j] . chunk_keys[b,c,h] / sqrt(D))``,
    ``-inf`` for ``c >= n_b``. ``q [B, Hq, D]``, ``chunk_keys [B, C, Hkv, D]`` -> ``[B, Hkv, C]``."""
    B, Hq, D = q.shape
    C, Hkv = chunk_keys.shape[1], chunk_keys.shape[2]
    dt = torch.float64 if torch.float64 in (q.dtype, chunk_keys.dtype) else torch.float32
    n = num_chunks.to(torch.int64).clamp(0, C)
    valid = torch.arange(C, device=q.device)[None, :] < n[:, None]  # [B, C]
    qg = q.to(dt).reshape(B, Hkv, Hq // Hkv, D)  # query head j belongs to KV head j // g
    logits = torch.einsum("bhgd,bchd->bhgc", qg, chunk_keys.to(dt)) / math.sqrt(D)
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(logits, dim=-1).masked_fill(~valid[:, None, None, :], 0.0)  # n_b = 0: no NaN
    return probs.sum(dim=2).masked_fill(~valid[:, None, :], float("-inf"))


def select_chunks(scores: torch.Tensor, num_chunks: torch.Tensor, budget_chunks: int,
                  sink_chunks: int = 1, recent_chunks: int = 0) -> torch.Tensor:
    """Per (b, h): chunks ``[0, sink)`` and ``[n_b - recent, n_b)`` always, then the highest scores
    (NaN ranks as -inf; ties: lower index), ascending, ``-1`` padded: int32 ``[B, Hkv, budget]``."""
    B, H, C = scores.shape
    n = num_chunks.to(torch.int64).clamp(0, C)[:, None, None]
    c = torch.arange(C, device=scores.device)
    valid = c < n
    forced = valid & ((c < sink_chunks) | (c >= n - recent_chunks))
    group = (valid.long() + forced.long()).expand(B, H, C)  # 2: always kept, 1: by score, 0: never
    key = torch.where(scores.isnan(), float("-inf"), scores.double())
    # Rank by (group desc, score desc, index asc): two stable sorts, the primary key last.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    order = order.gather(-1, torch.sort(group.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    take = order[..., :budget_chunks]
    idx = torch.where(group.gather(-1, take) > 0, take, C).sort(dim=-1).values  # unselected sort last
    idx = torch.where(idx == C, -1, idx)
    out = torch.full((B, H, budget_chunks), -1, dtype=torch.int32, device=scores.device)
    out[..., : idx.shape[-1]] = idx.to(torch.int32)
    return out


def gather_chunks(k: torch.Tensor, v: torch.Tensor, chunk_idx: torch.Tensor, chunk_size: int,
                  out_k: torch.Tensor, out_v: torch.Tensor) -> None:
    """``out[b, i*cs + t, h] = src[b, chunk_idx[b,h,i]*cs + t, h]`` for indices in ``[0, N // cs)``;
    other slots (``-1``, or any out-of-range index) are left untouched."""
    B, N, H, D = k.shape
    S = chunk_idx.shape[-1]
    idx = chunk_idx.to(torch.int64)
    valid = (idx >= 0) & (idx < N // chunk_size)  # [B, H, S]
    if S == 0 or not bool(valid.any()):
        return
    t = torch.arange(chunk_size, device=k.device)
    pos = (torch.where(valid, idx, 0)[..., None] * chunk_size + t).reshape(B, H, S * chunk_size)
    mask = valid.repeat_interleave(chunk_size, dim=-1)  # [B, H, S*cs]
    bi = torch.arange(B, device=k.device)[:, None, None]
    hi = torch.arange(H, device=k.device)[None, :, None]
    for src, out in ((k, out_k), (v, out_v)):
        rows = src[bi, pos, hi]  # [B, H, S*cs, D]
        out[:, : S * chunk_size].transpose(1, 2)[mask] = rows[mask]  # index_put_ into out's storage


def build_retrieval_cache(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v,
                          sink_chunks: int = 1, recent_chunks: int = 0) -> torch.Tensor:
    """score -> select -> gather; returns the int32 ``[B, Hkv, budget_chunks]`` chunk indices."""
    scores = score_chunks(q, chunk_keys, num_chunks)
    chunk_idx = select_chunks(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks)
    gather_chunks(k, v, chunk_idx, chunk_size, out_k, out_v)
    return chunk_idx
