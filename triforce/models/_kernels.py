"""TEMPORARY shim: the kernel ops this model layer needs, taken from ``triforce_kernels`` when they have
landed there, else naive stand-ins with the DESIGN.md 3.1/3.2 signatures. To be deleted once
branches issue3 (build_retrieval_cache) and issue4 (verify_attention, tree helpers) are merged.
"""
import math

import torch

import triforce_kernels as tk


def _verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask=None, softmax_scale=None, return_lse=False):
    B, T, Hq, D = q.shape
    N, Hkv = k_cache.shape[1], k_cache.shape[2]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    k = k_cache.float().repeat_interleave(g, dim=2)
    v = v_cache.float().repeat_interleave(g, dim=2)
    s = torch.einsum("bthd,bnhd->bhtn", q.float(), k) * scale
    L = cache_seqlens.long()[:, None, None]
    pos = torch.arange(N, device=q.device)[None, None, :]
    t = torch.arange(T, device=q.device)[None, :, None]
    start = L - T
    allowed = pos < start
    if tree_mask is None:
        new_ok = (pos >= start) & (pos - start <= t) & (pos < L)
    else:
        rel = (pos - start).clamp(0, T - 1).expand(B, T, N)
        new_ok = (pos >= start) & (pos < L) & torch.gather(tree_mask, 2, rel)
    allowed = (allowed | new_ok)[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhtn,bnhd->bthd", p, v).to(q.dtype)
    return (out, lse) if return_lse else out


def _tree_attention_mask(parents):
    B, T = parents.shape
    mask = torch.eye(T, dtype=torch.bool, device=parents.device).expand(B, T, T).clone()
    for t in range(1, T):
        p = parents[:, t]
        mask[:, t] |= torch.where((p >= 0)[:, None], mask[torch.arange(B), p.clamp(min=0)], False)
    return mask


def _tree_depths(parents):
    B, T = parents.shape
    d = torch.zeros(B, T, dtype=torch.int32, device=parents.device)
    for t in range(1, T):
        p = parents[:, t].clamp(min=0).long()
        d[:, t] = torch.where(parents[:, t] >= 0, d[torch.arange(B), p] + 1, 0)
    return d


def _build_retrieval_cache(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v,
                           sink_chunks=1, recent_chunks=0):
    B, Hq, D = q.shape
    C, Hkv = chunk_keys.shape[1], chunk_keys.shape[2]
    g = Hq // Hkv
    s = torch.einsum("bhgd,bchd->bhgc", q.float().view(B, Hkv, g, D), chunk_keys.float()) / math.sqrt(D)
    c = torch.arange(C, device=q.device)
    valid = c[None, :] < num_chunks.long()[:, None]  # [B, C]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf")).softmax(-1).nan_to_num(0.0).sum(2)  # [B,Hkv,C]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    nc = num_chunks.long()[:, None, None]
    keep = (c[None, None, :] < sink_chunks) | ((c[None, None, :] >= nc - recent_chunks) & valid[:, None, :])
    s = torch.where(keep, torch.full_like(s, float("inf")), s)
    # ties -> lower index: stable sort on -score
    order = torch.sort(-s, dim=-1, stable=True).indices[..., :budget_chunks]
    sel_valid = torch.gather(valid[:, None, :].expand(B, Hkv, C), 2, order)
    idx = torch.where(sel_valid, order, torch.full_like(order, C + 1)).sort(-1).values
    idx = torch.where(idx > C, -1, idx).to(torch.int32)
    t = torch.arange(chunk_size, device=q.device)
    for i in range(budget_chunks):
        ci = idx[:, :, i].long()  # [B, Hkv]
        src = (ci.clamp(min=0)[:, None, :] * chunk_size + t[None, :, None])  # [B, cs, Hkv]
        ok = (ci >= 0)[:, None, :, None]
        gk = torch.gather(k, 1, src[..., None].expand(-1, -1, -1, D))
        gv = torch.gather(v, 1, src[..., None].expand(-1, -1, -1, D))
        sl = slice(i * chunk_size, (i + 1) * chunk_size)
        out_k[:, sl] = torch.where(ok, gk, out_k[:, sl])
        out_v[:, sl] = torch.where(ok, gv, out_v[:, sl])
    return idx


verify_attention = getattr(tk, "verify_attention", _verify_attention)
tree_attention_mask = getattr(tk, "tree_attention_mask", _tree_attention_mask)
tree_depths = getattr(tk, "tree_depths", _tree_depths)
build_retrieval_cache = getattr(tk, "build_retrieval_cache", _build_retrieval_cache)
chunk_mean_keys = tk.chunk_mean_keys
