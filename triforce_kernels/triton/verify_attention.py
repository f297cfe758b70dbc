"""Triton backend of ``tk.verify_attention``: flash-decoding split-K over the prefix + masked tail,
then a log-sum-exp merge.

Grid of the split kernel: (part, b * Hkv + h, row block). Parts 0..S-1 split the unmasked prefix
[0, L-T) of row b evenly (ragged lengths need no host sync: each program reads L itself); part S is
the tail [L-T, L), the only place the causal / tree mask is applied and inf/NaN values are masked,
launched on its own (``TAIL=True``, a grid of one part) so that the prefix's kernel carries none of
that code (registers, shared memory: the compile check's report). Each program serves a block of
up to 64 query rows (t, j) of one GQA group from every K/V tile it loads, so for T * g <= 64 each
key is read from memory once for all T queries and all g query heads.
"""
import torch
import triton
import triton.language as tl

from .._backend import register
from . import _target
from ..verify_attention import check_cache_rows


@triton.jit
def _verify_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr,
    scale, T, G, R, Hkv, N, S, D, W,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    HAS_MASK: tl.constexpr, LOWP_DOT: tl.constexpr, TAIL: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # TAIL=False: grid axis 0 is the prefix part 0..S-1, every position visible to every row. TAIL=True
    # (its own launch, one part): part S, the tail [L-T, L), the only place of the causal / tree mask
    # and of the inf/NaN values' masking, so that none of it costs the prefix's loop anything.
    # mask_ptr (HAS_MASK): tree_mask packed as int64 words [B, T, W], bit si % 64 of word si // 64 of row
    # (b, t) = tree_mask[b, t, si] (_pack_mask_kernel); BLOCK_N <= 64.
    if TAIL:
        part = S
    else:
        part = tl.program_id(0)
    bh = tl.program_id(1)
    rb = tl.program_id(2)
    b = bh // Hkv
    h = bh % Hkv
    # Clamp so that nothing outside [0, min(L, N)) is read, whatever cache_seqlens holds (no host check).
    L = tl.load(seqlens_ptr + b)
    Lc = tl.minimum(tl.maximum(L, 0), N)
    new0 = L - T
    prefix = tl.minimum(tl.maximum(new0, 0), Lc)
    if TAIL:
        start = prefix
        end = Lc
    else:
        chunk = tl.cdiv(prefix, S)
        start = tl.minimum(prefix, part * chunk)
        end = tl.minimum(prefix, part * chunk + chunk)

    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    t = rows // G
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + t[:, None] * stride_qt + (h * G + rows % G)[:, None] * stride_qh
                + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if not LOWP_DOT:
        q = q.to(tl.float32)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh

    m_i = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    seen_bad = tl.zeros((BLOCK_R,), tl.int32)  # TAIL: the row sees an inf/NaN value
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_ok = pos < end
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + pos[:, None].to(tl.int64) * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        if LOWP_DOT:  # fp16/bf16 operands, fp32 accumulation (products of 16-bit floats are exact)
            s = tl.dot(q, tl.trans(k)) * scale
        else:  # fp32 inputs, and bf16 under the interpreter (its bf16 dot is wrong)
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        vis = row_ok[:, None] & pos_ok[None, :]
        if TAIL:
            # New token si = pos - new0 is visible to query t iff tree_mask[b, t, si] (si <= t).
            si = pos - new0
            if HAS_MASK:
                # Row t's bits of tree_mask, packed 64 to a word: this block's <= 64 positions fall in
                # words w0 and w0 + 1. Per-row (1-D) loads broadcast over the keys, as the causal test
                # is, so both variants reduce in the same register layout and give bitwise equal
                # results for equal masks (a 2-D byte load gave the tree variant its own layout and its
                # own summation order).
                si_c = tl.maximum(si, 0)
                w0 = tl.maximum(n0 - new0, 0) // 64
                row_bits = mask_ptr + (b.to(tl.int64) * T + t) * W
                zero = rows * 0  # scalar conditions as row vectors: the interpreter's load masks must be tensors
                word0 = tl.load(row_bits + w0, mask=row_ok & (zero + w0 < W), other=0)
                word1 = tl.load(row_bits + w0 + 1, mask=row_ok & (zero + w0 + 1 < W), other=0)
                word = tl.where((si_c // 64 == w0)[None, :], word0[:, None], word1[:, None])
                tail_ok = ((word >> (si_c % 64).to(tl.int64)[None, :]) & 1) != 0
            else:
                tail_ok = si[None, :] <= t[:, None]
            vis = vis & tail_ok
            # A query multiplies the values it may not see by 0, and 0 * NaN would leak them: the tail's
            # inf/NaN values count as 0, and a query that sees one gets NaN in its row (after the loop).
            vf = v.to(tl.float32)  # (the interpreter compares bf16 values as their bits)
            bad = (vf != vf) | (tl.abs(vf) == float("inf"))
            v = tl.where(bad, tl.zeros_like(v), v)
            key_bad = tl.max(bad.to(tl.int32), 1)  # [BLOCK_N]
            seen_bad = tl.maximum(seen_bad, tl.max(tl.where(vis, key_bad[None, :], 0), 1))
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if LOWP_DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m_i = m_new

    if TAIL:
        acc = tl.where(seen_bad[:, None] > 0, float("nan"), acc)
    idx = (bh * (S + 1) + part) * R + rows
    tl.store(m_ptr + idx, m_i, mask=row_ok)
    tl.store(l_ptr + idx, l_i, mask=row_ok)
    tl.store(acc_ptr + idx.to(tl.int64)[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _pack_mask_kernel(mask_ptr, bits_ptr, T, W):
    # One program per (row b * T + t, word w): bits_ptr[row, w] = sum_i mask[row, 64 w + i] << i.
    row = tl.program_id(0).to(tl.int64)
    w = tl.program_id(1)
    i = tl.arange(0, 64)
    j = w * 64 + i
    m = tl.load(mask_ptr + row * T + j, mask=j < T, other=0)
    bits = tl.where(m != 0, tl.full((64,), 1, tl.int64) << i.to(tl.int64), 0)
    tl.store(bits_ptr + row * W + w, tl.sum(bits, 0))  # distinct powers of two: the sum is their OR


@triton.jit
def _verify_attention_merge_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, lse_ptr, T, G, R, Hkv, S, D,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (b, h, row): combine the S + 1 partials by log-sum-exp.
    pid = tl.program_id(0)
    bh = pid // R
    r = pid % R
    b = bh // Hkv
    hq = (bh % Hkv) * G + r % G
    t = r // G
    Hq = Hkv * G
    parts = tl.arange(0, BLOCK_P)
    p_ok = parts < S + 1
    idx = (bh * (S + 1) + parts) * R + r
    m = tl.load(m_ptr + idx, mask=p_ok, other=float("-inf"))
    l = tl.load(l_ptr + idx, mask=p_ok, other=0.0)
    M = tl.max(m, 0)
    M_safe = tl.where(M == float("-inf"), 0.0, M)
    w = tl.exp(m - M_safe)  # 0 for empty parts
    total = tl.sum(w * l, 0)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.load(acc_ptr + idx.to(tl.int64)[:, None] * D + offs_d[None, :], mask=p_ok[:, None] & (offs_d < D)[None, :],
                  other=0.0)
    o = tl.sum(acc * w[:, None], 0)
    dead = M == float("-inf")
    o = tl.where(dead, 0.0, o / tl.where(dead, 1.0, total))
    lse = tl.where(dead, float("-inf"), M_safe + tl.log(tl.where(dead, 1.0, total)))
    tl.store(out_ptr + ((b.to(tl.int64) * T + t) * Hq + hq) * D + offs_d, o.to(out_ptr.dtype.element_ty),
             mask=offs_d < D)
    tl.store(lse_ptr + (b * Hq + hq) * T + t, lse)


def _num_splits(B, Hkv, row_blocks, N, device):
    sms = _target.sm_count(device)
    if sms is not None:  # ~2 waves of programs over the SMs, each split >= 512 keys
        want = triton.cdiv(2 * sms, B * Hkv * row_blocks)
        return max(1, min(want, N // 512, 64))
    return max(1, min(3, N // 128))  # interpreter: exercise the merge, keep it small


@register("verify_attention", "triton")
def verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, num_splits=None):
    B, T, Hq, D = q.shape
    N, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    R = T * G
    if q.stride(-1) != 1:
        q = q.contiguous()
    check_cache_rows("k_cache", k_cache)  # read in place (the kernel assumes unit stride over D): never copied
    check_cache_rows("v_cache", v_cache)
    out = torch.empty((B, T, Hq, D), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, Hq, T), device=q.device, dtype=torch.float32)
    if out.numel() == 0:
        return out, lse
    interpret = _target.interpreting()
    BLOCK_R = min(64, max(16, triton.next_power_of_2(R)))
    BLOCK_N = 32 if interpret else (64 if D <= 128 else 32)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    row_blocks = triton.cdiv(R, BLOCK_R)
    S = num_splits or _num_splits(B, Hkv, row_blocks, N, q.device)
    parts = S + 1
    m = torch.empty((B * Hkv * parts * R,), device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty((B * Hkv * parts * R, D), device=q.device, dtype=torch.float32)
    W = triton.cdiv(T, 64)
    if tree_mask is not None:  # packed to bits (bool loads as uint8: the interpreter rejects bool pointers)
        mask = torch.empty((B, T, W), device=q.device, dtype=torch.int64)
        _pack_mask_kernel[(B * T, W)](tree_mask.contiguous().view(torch.uint8), mask, T, W)
    else:  # causal: any pointer, never read
        mask = cache_seqlens
    # 16-bit operands straight into tl.dot (P cast to V's dtype, as flash-attn does). The interpreter's
    # bf16 dot is wrong, so there bf16 runs the fp32 path; fp16 takes the GPU path, which tests it.
    lowp = q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and not interpret)
    for tail, grid in ((False, (S, B * Hkv, row_blocks)), (True, (1, B * Hkv, row_blocks))):
        _verify_attention_split_kernel[grid](
            q, k_cache, v_cache, cache_seqlens, mask, m, l, acc,
            softmax_scale, T, G, R, Hkv, N, S, D, W,
            q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            HAS_MASK=tree_mask is not None, LOWP_DOT=lowp, TAIL=tail, BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N,
            BLOCK_D=BLOCK_D, num_warps=4,
        )
    _verify_attention_merge_kernel[(B * Hkv * R,)](
        m, l, acc, out, lse, T, G, R, Hkv, S, D,
        BLOCK_P=max(2, triton.next_power_of_2(parts)), BLOCK_D=BLOCK_D,
    )
    return out, lse
