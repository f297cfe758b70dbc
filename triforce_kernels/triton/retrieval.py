"""Triton kernels of the retrieval-cache ops (docs/design.md 3.1): score, select, gather, and the build that
chains them on the device (no host synchronisation, fixed shapes: capturable in a CUDA graph).

Bytes (bench shape N = 128K, chunk 8, Hkv = 8, D = 128, Hq = 32): the chunk keys are read once
(C * Hkv * D * 4 = 64 MiB); the logits round-trip (Hq * C * 4 = 2 MiB) is the price of a split
softmax that spreads a row over many programs; the gather moves budget * Hkv * D * 2 bytes per K/V.
"""
import torch
import triton
import triton.language as tl

from .._backend import register


@triton.jit
def _score_logits_kernel(
    q_ptr, ck_ptr, n_ptr, logit_ptr, stat_m_ptr, stat_s_ptr,
    Hkv, G, C, D, NSPLIT, sqrt_d,
    stride_qb, stride_qh, stride_qd, stride_cb, stride_cc, stride_ch, stride_cd,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Program (b*Hkv + h, split): logits of the G query heads of KV head h against BLOCK_C chunk keys
    # (each key read once, for all G heads), plus this split's max and sum of exp per query head.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // Hkv
    h = pid % Hkv
    n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 0), C)
    offs_g = tl.arange(0, BLOCK_G)
    offs_c = split * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    j = h * G + offs_g  # query heads of the group
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + j[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=(offs_g[:, None] < G) & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    c_ok = offs_c < n
    keys = tl.load(ck_ptr + b.to(tl.int64) * stride_cb + offs_c[None, :].to(tl.int64) * stride_cc + h * stride_ch
                   + offs_d[:, None] * stride_cd, mask=c_ok[None, :] & (offs_d[:, None] < D), other=0.0)
    logits = tl.dot(q, keys, input_precision="ieee") / sqrt_d  # [BLOCK_G, BLOCK_C], fp32 (no tf32)
    logits = tl.where(c_ok[None, :], logits, float("-inf"))
    m = tl.max(logits, axis=1)
    m_safe = tl.where(m > float("-inf"), m, 0.0)  # an all-invalid split: no (-inf) - (-inf) = NaN
    s = tl.sum(tl.where(c_ok[None, :], tl.exp(logits - m_safe[:, None]), 0.0), axis=1)
    row = b.to(tl.int64) * Hkv * G + j  # [BLOCK_G] rows of [B, Hq, ...]
    g_ok = offs_g < G
    tl.store(logit_ptr + row[:, None] * C + offs_c[None, :], logits, mask=g_ok[:, None] & (offs_c[None, :] < C))
    tl.store(stat_m_ptr + row * NSPLIT + split, m, mask=g_ok)
    tl.store(stat_s_ptr + row * NSPLIT + split, s, mask=g_ok)


@triton.jit
def _score_combine_kernel(
    logit_ptr, stat_m_ptr, stat_s_ptr, n_ptr, out_ptr, Hkv, G, C, NSPLIT,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # Program (b*Hkv + h, split): combine the per-split softmax statistics of the G heads, then
    # out[c] = sum_j exp(logit_jc - max_j) / sum_j for this split's chunks (-inf beyond n).
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // Hkv
    h = pid % Hkv
    n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 0), C)
    offs_g = tl.arange(0, BLOCK_G)
    g_ok = offs_g < G
    row = b.to(tl.int64) * Hkv * G + h * G + offs_g
    # Each loop's result has exactly one use after the loop: Triton 3.6's thread-locality pass asserts
    # on a reduction loop whose result is used twice (at BLOCK_G = 8; found by compile-check).
    m_acc = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    for s0 in range(0, NSPLIT, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ms = tl.load(stat_m_ptr + row[:, None] * NSPLIT + offs_s[None, :],
                     mask=g_ok[:, None] & (offs_s[None, :] < NSPLIT), other=float("-inf"))
        m_acc = tl.maximum(m_acc, tl.max(ms, axis=1))
    # n = 0 / padding heads: -inf becomes the lowest finite float (exp(-inf - m) stays 0, never NaN)
    m_all = tl.maximum(m_acc, -3.4028234663852886e38)
    s_acc = tl.zeros((BLOCK_G,), tl.float32)
    for s0 in range(0, NSPLIT, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        ok = g_ok[:, None] & (offs_s[None, :] < NSPLIT)
        ms = tl.load(stat_m_ptr + row[:, None] * NSPLIT + offs_s[None, :], mask=ok, other=float("-inf"))
        ss = tl.load(stat_s_ptr + row[:, None] * NSPLIT + offs_s[None, :], mask=ok, other=0.0)
        s_acc += tl.sum(ss * tl.exp(ms - m_all[:, None]), axis=1)  # exp(-inf) = 0 for empty splits
    offs_c = split * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < n
    logits = tl.load(logit_ptr + row[:, None] * C + offs_c[None, :], mask=g_ok[:, None] & c_ok[None, :],
                     other=float("-inf"))
    # a live head's sum is >= 1 (its largest split contributes exp(0) * (>= 1)); padding heads and
    # n = 0 have 0 and are masked below: 1 avoids 0 / 0
    s_all = tl.maximum(s_acc, 1.0)
    p = tl.where(g_ok[:, None] & c_ok[None, :], tl.exp(logits - m_all[:, None]) / s_all[:, None], 0.0)
    score = tl.where(c_ok, tl.sum(p, axis=0), float("-inf"))
    tl.store(out_ptr + (b.to(tl.int64) * Hkv + h) * C + offs_c, score, mask=offs_c < C)


@triton.jit
def _chunk_order_key(s_ptr, offs, n, sink, recent):
    # Monotone int64 key in [0, 2^32) of each score: NaN ranks as -inf, -0.0 equals +0.0, forced
    # chunks (sinks, recent) get the top key 2^32 - 1, which no score reaches once NaN is gone.
    x = tl.load(s_ptr + offs, mask=offs < n, other=0.0)
    x = tl.where(x != x, float("-inf"), x)
    x = tl.where(x == 0.0, 0.0, x)
    i = x.to(tl.int32, bitcast=True)
    key = tl.where(i >= 0, i, ~(i & 0x7FFFFFFF)).to(tl.int64) + 2147483648
    forced = (offs < sink) | (offs >= n - recent)
    return tl.where(forced, 4294967295, key)


@triton.jit
def _select_kernel(s_ptr, n_ptr, out_ptr, H, C, budget, sink, recent, BLOCK_C: tl.constexpr):
    # Program per (b, h) row. k = min(budget, n) chunks are kept: the k largest keys (ties: lower
    # index). A radix select finds the k-th largest key T one byte at a time, most significant first:
    # 4 histogram passes over the row (which stays in L1/L2) instead of a 32-step bitwise search; then
    # one ascending pass emits keys > T and the first `need` keys == T at positions given by a running
    # prefix sum, so the output is sorted without a sort.
    pid = tl.program_id(0)
    b = pid // H
    n = tl.minimum(tl.maximum(tl.load(n_ptr + b), 0), C)
    k = tl.minimum(budget, n)
    row = s_ptr + pid.to(tl.int64) * C
    bins = tl.arange(0, 256)
    prefix = tl.zeros((), tl.int64)  # the bytes of T found so far
    need = k  # keys still to take among those matching the prefix (invariant: 1 <= need <= #matching, or k = 0)
    all_ones = tl.full((), 4294967295, tl.int64)
    for p in range(4):
        shift = 24 - 8 * p
        high = (all_ones >> (shift + 8)) << (shift + 8)  # mask of the bytes already decided
        hist = tl.zeros((256,), tl.int32)
        for c0 in range(0, n, BLOCK_C):
            offs = c0 + tl.arange(0, BLOCK_C)
            key = _chunk_order_key(row, offs, n, sink, recent)
            match = (offs < n) & ((key & high) == prefix)
            hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
        at_or_above = tl.cumsum(hist, axis=0, reverse=True)  # [d] = #matching keys with this byte >= d
        digit = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
        prefix = prefix | (digit.to(tl.int64) << shift)
    thresh = prefix
    ties_left = need
    written = tl.zeros((), tl.int32)
    ties_seen = tl.zeros((), tl.int32)
    out_row = out_ptr + pid.to(tl.int64) * budget
    for c0 in range(0, n, BLOCK_C):
        offs = c0 + tl.arange(0, BLOCK_C)
        key = _chunk_order_key(row, offs, n, sink, recent)
        valid = offs < n
        tie = valid & (key == thresh)
        tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), axis=0) - 1
        sel = valid & ((key > thresh) | (tie & (tie_rank < ties_left)))
        pos = written + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(out_row + pos, offs, mask=sel)
        written += tl.sum(sel.to(tl.int32), axis=0)
        ties_seen += tl.sum(tie.to(tl.int32), axis=0)
    for p0 in range(0, budget, BLOCK_C):
        offs = p0 + tl.arange(0, BLOCK_C)
        tl.store(out_row + offs, tl.full((BLOCK_C,), -1, tl.int32), mask=(offs >= k) & (offs < budget))


@triton.jit
def _gather_kernel(
    k_ptr, v_ptr, idx_ptr, out_k_ptr, out_v_ptr, H, S, M, D, chunk_size, num_complete,
    stride_kb, stride_kn, stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Program (b*H + h, slot i): copy chunk_size x D keys and values of one chunk (bit-exact). An index
    # outside [0, N // chunk_size) -- -1 padding or garbage -- copies nothing: no out-of-bounds access.
    pid = tl.program_id(0)
    i = tl.program_id(1)
    b = pid // H
    h = pid % H
    offs_t = tl.arange(0, BLOCK_T)[:, None]
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    # the index broadcast to the tile (the interpreter rejects scalar-bool & tensor-bool masks)
    c = tl.load(idx_ptr + pid.to(tl.int64) * S + i).to(tl.int64) + tl.zeros((BLOCK_T, 1), tl.int64)
    ok = (c >= 0) & (c < num_complete)
    c = tl.where(ok, c, 0)
    mask = ok & (offs_t < chunk_size) & (offs_d < D)
    pos = c * chunk_size + offs_t
    dst = ((b.to(tl.int64) * M + i * chunk_size + offs_t) * H + h) * D + offs_d
    kv = tl.load(k_ptr + b.to(tl.int64) * stride_kb + pos * stride_kn + h * stride_kh + offs_d * stride_kd, mask=mask)
    tl.store(out_k_ptr + dst, kv, mask=mask)
    vv = tl.load(v_ptr + b.to(tl.int64) * stride_vb + pos * stride_vn + h * stride_vh + offs_d * stride_vd, mask=mask)
    tl.store(out_v_ptr + dst, vv, mask=mask)


@register("score_chunks", "triton")
def score_chunks(q, chunk_keys, num_chunks):
    B, Hq, D = q.shape
    C, Hkv = chunk_keys.shape[1], chunk_keys.shape[2]
    G = Hq // Hkv
    out = torch.empty((B, Hkv, C), device=q.device, dtype=torch.float32)
    if out.numel() == 0:
        return out
    BLOCK_C = 64
    nsplit = triton.cdiv(C, BLOCK_C)
    logits = torch.empty((B, Hq, C), device=q.device, dtype=torch.float32)
    stat_m = torch.empty((B, Hq, nsplit), device=q.device, dtype=torch.float32)
    stat_s = torch.empty_like(stat_m)
    BLOCK_G = max(16, triton.next_power_of_2(G))  # tl.dot needs M >= 16
    BLOCK_D = max(16, triton.next_power_of_2(D))
    grid = (B * Hkv, nsplit)
    _score_logits_kernel[grid](
        q, chunk_keys, num_chunks, logits, stat_m, stat_s, Hkv, G, C, D, nsplit, float(D) ** 0.5,
        *q.stride(), *chunk_keys.stride(), BLOCK_G=BLOCK_G, BLOCK_C=BLOCK_C, BLOCK_D=BLOCK_D,
    )
    # The combine step re-reads every split's statistics per program (G * nsplit * 8 bytes): with
    # 1024 chunks per program that is 1/16 of what 64-chunk programs would read (64 MiB of L2 traffic
    # at the bench shape, as much as the chunk keys themselves).
    BLOCK_CC = 1024
    _score_combine_kernel[(B * Hkv, triton.cdiv(C, BLOCK_CC))](
        logits, stat_m, stat_s, num_chunks, out, Hkv, G, C, nsplit,
        BLOCK_G=triton.next_power_of_2(G), BLOCK_C=BLOCK_CC, BLOCK_S=64, num_warps=8,
    )
    return out


@register("select_chunks", "triton")
def select_chunks(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks):
    B, H, C = scores.shape
    out = torch.empty((B, H, budget_chunks), device=scores.device, dtype=torch.int32)
    if out.numel() == 0:
        return out
    scores = scores.contiguous()
    # Large blocks: each loop step is one L2 round trip, so 4096 keys per step keeps a 16K-chunk row
    # at 4 steps per pass.
    BLOCK_C = max(256, min(4096, triton.next_power_of_2(C)))
    _select_kernel[(B * H,)](scores, num_chunks, out, H, C, budget_chunks, sink_chunks, recent_chunks,
                             BLOCK_C=BLOCK_C, num_warps=8)
    return out


@register("gather_chunks", "triton")
def gather_chunks(k, v, chunk_idx, chunk_size, out_k, out_v):
    B, N, H, D = k.shape
    S = chunk_idx.shape[2]
    if B * H * S * D == 0 or N // chunk_size == 0:
        return
    chunk_idx = chunk_idx.contiguous()
    _gather_kernel[(B * H, S)](
        k, v, chunk_idx, out_k, out_v, H, S, out_k.shape[1], D, chunk_size, N // chunk_size,
        *k.stride(), *v.stride(), BLOCK_T=triton.next_power_of_2(chunk_size), BLOCK_D=triton.next_power_of_2(D),
    )


@register("build_retrieval_cache", "triton")
def build_retrieval_cache(q, k, v, chunk_keys, num_chunks, chunk_size, budget_chunks, out_k, out_v,
                          sink_chunks, recent_chunks):
    # Three launches, all on the device: nothing waits on the host, every shape is fixed.
    scores = score_chunks(q, chunk_keys, num_chunks)
    chunk_idx = select_chunks(scores, num_chunks, budget_chunks, sink_chunks, recent_chunks)
    gather_chunks(k, v, chunk_idx, chunk_size, out_k, out_v)
    return chunk_idx
