"""Triton backend of ``tk.verify_attention``: split-K at fixed key ranks, then a log-sum-exp merge.

A row's result depends only on the keys it sees, never on T, the prefix length or the batch, so row t of a
pass of T tokens is bitwise the one-token step at its position (docs/attention.md, "Independent of T"), and
a row gives the same bits in any batch:

- Ranks. A query takes its keys in rank order: the prefix, then the new tokens it sees in index order.
  Causal: rank = position. Tree: the new tokens a row sees take ranks L-T, L-T+1, ..., the positions they
  get once committed (``_ancestor_lists``).
- Parts. The ranks are cut into parts of ``_part_keys`` (a power of two, a multiple of the tile; it
  depends on the cache's N, Hkv and the GPU, never on T, L or the batch size). Each part runs its online
  softmax from a fresh state; the merge combines the parts' states by log-sum-exp, in one fixed order.
- Tiles of BLOCK_N ranks start at multiples of BLOCK_N. Below the prefix rounded down to BLOCK_N
  (``Pf``) every row sees every key of a tile: the prefix launch (``TAIL=False``, grid (row block, part,
  b * Hkv)) reads each tile once for the block's rows, with no mask. From ``Pf`` on, the tail launch
  (``TAIL=True``, grid (row block, b * Hkv)) continues the states the prefix launch stored: one load per
  tile for a causal pass; for a tree, one gathered load per query token of the block, each updating
  only that token's rows (the others' update is exact: +0, x1).
- One arithmetic. Both launches run every tile through ``_tile_update``; floating-point contraction is
  off, so the select that masks the tail's scores cannot change how the rest is rounded. Row blocks
  are BLOCK_R rows whatever T (``_block_r``), so every tile is the same dot.

The tail is also the only place of inf/NaN masking: a query multiplies the values it may not see by
0, and 0 * NaN would leak them, so the new tokens' inf/NaN values count as 0 there and a query that
sees one gets NaN in its row for that head. The prefix, which every query sees, is read as it is.
"""
import torch
import triton
import triton.language as tl

from .._backend import _interpreting, register
from . import _target
from ..verify_attention import check_cache_rows

# Under the interpreter tl.dot is numpy's matmul, and a BLAS may round a row by its place in the block (OpenBLAS's
# Haswell / Zen kernels do: on an AMD EPYC Zen 5 VM 10 of 16 rows of a [16, 32] x [32, 32] product differ from the
# same row computed first), which would make a pass's rows differ from its steps' there: the interpreter sums each
# row's products itself instead (_dot). A GPU's dot computes a row alone.
_ROWWISE_DOTS = tl.constexpr(_interpreting())
# The interpreter's float32 -> bfloat16 cast truncates (Triton 3.9; even with fp_downcast_rounding="rtne"), where a
# GPU's rounds to nearest even: an output one ulp off the GPU's and PyTorch's. Under it the output is rounded
# explicitly (_downcast).
_ROUND_BF16 = tl.constexpr(_interpreting())


@triton.jit
def _downcast(x, ty: tl.constexpr):
    """``x.to(ty)`` of float32 ``x``, to nearest even in bfloat16 under the interpreter too (``_ROUND_BF16``): the bits'
    rounding added below the kept half, so that the truncation keeps the nearest value (NaNs kept)."""
    if _ROUND_BF16:
        if ty == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            up = (bits + 0x7FFF + ((bits >> 16) & 1)).to(tl.float32, bitcast=True)
            x = tl.where(x != x, x, up)
    return x.to(ty)


@triton.jit
def _dot(a, b):
    """``a [M, K] @ b [K, N]`` in float32 (16-bit operands' products are exact there), as ``tl.dot`` with IEEE
    precision; under the interpreter each row summed over K alone (``_ROWWISE_DOTS``)."""
    if _ROWWISE_DOTS:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], 1)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _softcap(s, cap):
    """``cap * tanh(s / cap)`` (Gemma 2), as the CPU kernel computes it (csrc/include/triforce/softcap.h): tanh's
    odd Taylor polynomial to t^13 below |t| = 0.3, ``(1 - e) / (1 + e)`` with ``e = exp(-2|t|)`` above."""
    t = s / cap
    a = tl.abs(t)
    u = t * t
    p = -1382.0 / 155925 + u * (21844.0 / 6081075)
    p = 62.0 / 2835 + u * p
    p = -17.0 / 315 + u * p
    p = 2.0 / 15 + u * p
    p = -1.0 / 3 + u * p
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    th = tl.where(a < 0.3, t + t * (u * p), tl.where(t < 0, -big, big))
    return th * cap


@triton.jit
def _tile_update(q, k, v, vis, m_i, l_i, acc, scale, cap, mods, rank, LOWP_DOT: tl.constexpr, SOFTCAP: tl.constexpr,
                 ALIBI: tl.constexpr):
    """One tile of the online softmax for a block of rows; the same code on every path. ``mods`` (ALIBI): the
    rows' slopes and their queries' last ranks; ``rank``: the tile's keys' ranks. ALiBi adds
    ``slope * (rank - last)`` to a score after the cap (a rounded product, then a rounded sum: no contraction)."""
    if LOWP_DOT:  # fp16/bf16 operands, fp32 accumulation (products of 16-bit floats are exact)
        s = tl.dot(q, tl.trans(k)) if not _ROWWISE_DOTS else _dot(q, tl.trans(k))
    else:  # fp32 inputs, and bf16 under the interpreter (its bf16 dot is wrong)
        s = _dot(q, tl.trans(k.to(tl.float32)))
    s = s * scale
    if SOFTCAP:
        s = _softcap(s, cap)
    if ALIBI:
        slope, last = mods
        s = s + slope[:, None] * (rank[None, :] - last[:, None]).to(tl.float32)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if LOWP_DOT:
        acc = acc * alpha[:, None] + (tl.dot(p.to(v.dtype), v) if not _ROWWISE_DOTS else _dot(p.to(v.dtype), v))
    else:
        acc = acc * alpha[:, None] + _dot(p, v.to(tl.float32))
    return m_new, l_i, acc


@triton.jit
def _tail_tile_update(q, k_base, v_base, pos, rank, lane_ok, is_new, rows_see, offs_d, d_ok, stride_kn, stride_vn,
                      m_i, l_i, acc, seen_bad, scale, cap, mods, LOWP_DOT: tl.constexpr, SOFTCAP: tl.constexpr,
                      ALIBI: tl.constexpr):
    """A tail tile: keys at ``pos`` (lanes ``lane_ok``; ranks ``rank``), seen by the rows ``rows_see`` ([R, 1] or
    [R, N]). A query multiplies the values it may not see by 0, and 0 * NaN would leak them: the new
    tokens' inf/NaN values count as 0, and ``seen_bad`` flags a row that sees one."""
    ld = lane_ok[:, None] & d_ok[None, :]
    k = tl.load(k_base + pos[:, None].to(tl.int64) * stride_kn + offs_d[None, :], mask=ld, other=0.0)
    v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vn + offs_d[None, :], mask=ld, other=0.0)
    vf = v.to(tl.float32)  # (the interpreter compares bf16 values as their bits)
    bad = ((vf != vf) | (tl.abs(vf) == float("inf"))) & is_new[:, None]
    v = tl.where(bad, tl.zeros_like(v), v)
    vis = rows_see & lane_ok[None, :]
    key_bad = tl.max(bad.to(tl.int32), 1)
    seen_bad = tl.maximum(seen_bad, tl.max(tl.where(vis, key_bad[None, :], 0), 1))
    m_i, l_i, acc = _tile_update(q, k, v, vis, m_i, l_i, acc, scale, cap, mods, rank, LOWP_DOT, SOFTCAP, ALIBI)
    return m_i, l_i, acc, seen_bad


@triton.jit
def _prefix_tile(q, k_base, v_base, pos, end, row_ok, offs_d, d_ok, stride_kn, stride_vn, m_i, l_i, acc, scale,
                 cap, mods, LOWP_DOT: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """A prefix tile (keys ``pos`` below ``end``) that every row of the block sees whole: no masking."""
    ld = (pos < end)[:, None] & d_ok[None, :]
    k = tl.load(k_base + pos[:, None].to(tl.int64) * stride_kn + offs_d[None, :], mask=ld, other=0.0)
    v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vn + offs_d[None, :], mask=ld, other=0.0)
    vis = row_ok[:, None] & (pos < end)[None, :]
    return _tile_update(q, k, v, vis, m_i, l_i, acc, scale, cap, mods, pos, LOWP_DOT, SOFTCAP, ALIBI)


@triton.jit
def _verify_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, seqlens_ptr, anc_ptr, cnt_ptr, lp_ptr, slopes_ptr, m_ptr, l_ptr, acc_ptr,
    scale, cap, T, G, R, Hkv, N, NP, PS, D, W, stride_sb,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    HAS_MASK: tl.constexpr, TREE: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_LEFTPAD: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, LOWP_DOT: tl.constexpr,
    TAIL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # State of (b, h, part, row) at (bh * NP + part) * R + row of m_ptr / l_ptr, rows of D in acc_ptr.
    # anc_ptr (HAS_MASK): int32 [B, T, T], row (b, t) = the new tokens t sees, in index order, then -1;
    # cnt_ptr (TREE and HAS_WINDOW or ALIBI): int32 [B, T], how many. lp_ptr (HAS_LEFTPAD): int32 [B], each row's
    # first rank. slopes_ptr (ALIBI): float32, query head hq of row b's slope at b * stride_sb + hq.
    rb = tl.program_id(0)
    if TAIL:
        bh = tl.program_id(1)
    else:
        part = tl.program_id(1)
        bh = tl.program_id(2)
    b = bh // Hkv
    h = bh % Hkv
    # Clamp so that nothing outside [0, min(L, N)) is read, whatever cache_seqlens holds (no host check).
    L = tl.load(seqlens_ptr + b)
    Lc = tl.minimum(tl.maximum(L, 0), N)
    new0 = L - T
    P = tl.minimum(tl.maximum(new0, 0), Lc)  # ranks below P: the prefix, rank = position, seen by all
    Pf = P // BLOCK_N * BLOCK_N  # below Pf: whole tiles of prefix

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
    state = bh * NP * R + rows  # + part * R
    # A sliding window of W ranks: row r sees the ranks [lo, seen) (seen: all it would see without one),
    # from the row's left padding on (its first rank, clamped to [0, P]). lo_min / lo_max: over the block's rows.
    if HAS_LEFTPAD:
        first = tl.minimum(tl.maximum(tl.load(lp_ptr + b), 0), P)
    else:
        first = 0
    if HAS_WINDOW or ALIBI:
        if TREE:
            seen = P + tl.load(cnt_ptr + b * T + t, mask=row_ok, other=0)
        else:
            seen = tl.minimum(tl.maximum(new0 + t + 1, P), Lc)
    else:
        seen = rows * 0
    # ALiBi: each row's slope and its query's last rank (its distance to a key: last - rank)
    if ALIBI:
        mods = (tl.load(slopes_ptr + b * stride_sb + h * G + rows % G, mask=row_ok, other=0.0), seen - 1)
    else:
        mods = (scale, seen)  # (unused)
    if HAS_WINDOW:
        lo = tl.maximum(seen - W, first)
        lo_min = tl.min(tl.where(row_ok, lo, N), 0)
        lo_max = tl.max(tl.where(row_ok, lo, 0), 0)
    elif HAS_LEFTPAD:
        lo = rows * 0 + first
        lo_min = first
        lo_max = first
    else:
        lo = rows * 0
        lo_min = 0
        lo_max = 0

    if not TAIL:
        m_i = tl.full((BLOCK_R,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_R,), tl.float32)
        acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
        start = part * PS
        end = tl.minimum(start + PS, Pf)
        seen_bad = tl.zeros((BLOCK_R,), tl.int32)
        # Tiles below every row's window hold nothing for the block (each would be an exact no-op): skipped.
        # The tiles where a row's window starts (n0 < lo_max: a few) are masked as in the tail, in a loop of
        # their own, so that the loop over the whole tiles after them has no branch (a branch in it keeps
        # Triton from pipelining its loads: one stage of shared memory instead of three, measured with
        # compile-check on sm_90a).
        lo_tile = tl.maximum(start, lo_min // BLOCK_N * BLOCK_N)
        whole = tl.maximum(start, tl.cdiv(lo_max, BLOCK_N) * BLOCK_N)
        if HAS_WINDOW or HAS_LEFTPAD:
            for n0 in range(lo_tile, tl.minimum(whole, end), BLOCK_N):
                pos = n0 + tl.arange(0, BLOCK_N)
                m_i, l_i, acc, seen_bad = _tail_tile_update(
                    q, k_base, v_base, pos, pos, pos < end, pos >= 0, row_ok[:, None] & (pos[None, :] >= lo[:, None]),
                    offs_d, d_ok, stride_kn, stride_vn, m_i, l_i, acc, seen_bad, scale, cap, mods, LOWP_DOT, SOFTCAP,
                    ALIBI)
        for n0 in range(whole, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            m_i, l_i, acc = _prefix_tile(q, k_base, v_base, pos, end, row_ok, offs_d, d_ok, stride_kn, stride_vn,
                                         m_i, l_i, acc, scale, cap, mods, LOWP_DOT, SOFTCAP, ALIBI)
        if HAS_WINDOW or HAS_LEFTPAD:
            acc = tl.where(seen_bad[:, None] > 0, float("nan"), acc)
        idx = state + part * R
        tl.store(m_ptr + idx, m_i, mask=row_ok)
        tl.store(l_ptr + idx, l_i, mask=row_ok)
        tl.store(acc_ptr + idx.to(tl.int64)[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
    else:
        # Ranks [Pf, hi): the rest of the prefix and the new tokens. Every key of rank >= Lc is unseen
        # (causal: rank = position; tree: rank <= position), so no part past the cache's N is touched.
        if HAS_MASK:
            hi = tl.minimum(P + T, Lc)
        else:
            hi = Lc
        t_lo = (rb * BLOCK_R) // G
        t_hi = (tl.minimum(rb * BLOCK_R + BLOCK_R, R) - 1) // G
        zero = rows * 0  # scalar conditions as row vectors: the interpreter's load masks must be tensors
        for part in range(Pf // PS, tl.cdiv(hi, PS)):
            idx = state + part * R
            m_i = tl.load(m_ptr + idx, mask=row_ok, other=float("-inf"))
            l_i = tl.load(l_ptr + idx, mask=row_ok, other=0.0)
            acc = tl.load(acc_ptr + idx.to(tl.int64)[:, None] * D + offs_d[None, :],
                          mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            seen_bad = tl.zeros((BLOCK_R,), tl.int32)  # the row sees an inf/NaN value of a new token
            for n0 in range(tl.maximum(Pf, part * PS), tl.minimum(hi, part * PS + PS), BLOCK_N):
                rank = n0 + tl.arange(0, BLOCK_N)
                is_new = rank >= P
                if HAS_MASK:
                    # One gathered load per query token tt of the block: the keys of rank >= P are tt's
                    # own. Only tt's rows are updated; for the others every key is masked, an exact no-op
                    # (as is a tile in which tt sees nothing: skipped).
                    i = rank - P
                    for tt in range(t_lo, t_hi + 1):
                        sel = tl.load(anc_ptr + (b.to(tl.int64) * T + tt) * T + i, mask=is_new & (i < T), other=-1)
                        pos = tl.where(is_new, new0 + sel, rank)
                        lane_ok = tl.where(is_new, sel >= 0, rank < Lc) & (pos >= 0) & (pos < Lc)
                        if tl.max(lane_ok.to(tl.int32), 0) > 0:
                            m_i, l_i, acc, seen_bad = _tail_tile_update(
                                q, k_base, v_base, pos, rank, lane_ok, is_new | (rank < lo_max),
                                (row_ok & (t == zero + tt))[:, None] & (rank[None, :] >= lo[:, None]),
                                offs_d, d_ok, stride_kn, stride_vn, m_i, l_i, acc, seen_bad, scale, cap, mods,
                                LOWP_DOT, SOFTCAP, ALIBI)
                else:  # rank = position; new token rank - new0 is seen by query t iff rank - new0 <= t
                    rows_see = row_ok[:, None] & ((rank - new0)[None, :] <= t[:, None]) & (rank[None, :] >= lo[:, None])
                    is_new = is_new | (rank < lo_max)  # and a window hides some prefix key of the tile
                    m_i, l_i, acc, seen_bad = _tail_tile_update(
                        q, k_base, v_base, rank, rank, rank < Lc, is_new, rows_see, offs_d, d_ok, stride_kn,
                        stride_vn, m_i, l_i, acc, seen_bad, scale, cap, mods, LOWP_DOT, SOFTCAP, ALIBI)
            acc = tl.where(seen_bad[:, None] > 0, float("nan"), acc)
            tl.store(m_ptr + idx, m_i, mask=row_ok)
            tl.store(l_ptr + idx, l_i, mask=row_ok)
            tl.store(acc_ptr + idx.to(tl.int64)[:, None] * D + offs_d[None, :], acc,
                     mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _verify_attention_merge_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, lse_ptr, T, G, R, Hkv, NP, D,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (b, h, row): combine the NP parts' states by log-sum-exp.
    pid = tl.program_id(0)
    bh = pid // R
    r = pid % R
    b = bh // Hkv
    hq = (bh % Hkv) * G + r % G
    t = r // G
    Hq = Hkv * G
    parts = tl.arange(0, BLOCK_P)
    p_ok = parts < NP
    idx = (bh * NP + parts) * R + r
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
    tl.store(out_ptr + ((b.to(tl.int64) * T + t) * Hq + hq) * D + offs_d, _downcast(o, out_ptr.dtype.element_ty),
             mask=offs_d < D)
    tl.store(lse_ptr + (b * Hq + hq) * T + t, lse)


MAX_PARTS = 64  # the merge holds every part's state of a row in one program


def _block_r(G, lowp, interpret):
    """Query rows per program: never a function of T, so that every tile is the same dot at every T.
    16-bit on a GPU: 64 rows (16 tokens of a GQA group of 4 read each tile once; a one-token step pads
    its G rows to 64, as flash-decoding kernels pad to the MMA's shape). fp32 and the interpreter: the
    group rounded up to 16 (fp32 ieee dots of 64 rows would not fit the registers)."""
    if lowp and not interpret:
        return 64
    return min(64, max(16, triton.next_power_of_2(G)))


def _block_n(D, interpret):
    return 32 if interpret else (64 if D <= 128 else 32)


def _part_keys(Hkv, N, block_n, device, num_splits=None):
    """Keys per part, a multiple of the tile. It follows the cache's N, Hkv and the GPU, never T or L
    (which would change a row's bits with T) nor the batch size (which would change them when rows leave
    the batch: GPU run 5 found MagicDec's output changed with TRIFORCE_COMPACT_ROWS=1 while the parts
    followed B), and is a power of two, so that caches of nearly the same capacity (an autoregressive
    run's and a speculative one's) usually get the same parts (unless N / the wanted part count crosses a
    power of two between them). GPU: about 2 waves of prefix programs over the SMs for one row with a full
    cache (more rows: more waves), >= 512 keys a part. At most MAX_PARTS parts.
    ``num_splits`` (tests, benchmarks): about that many parts over N instead."""
    N = max(N, 1)
    if num_splits:
        keys = triton.cdiv(triton.cdiv(N, num_splits), block_n) * block_n
    else:
        sms = _target.sm_count(device)
        want = triton.cdiv(2 * sms, Hkv) if sms is not None else 3  # interpreter: a few parts
        keys = triton.next_power_of_2(triton.cdiv(N, want))
        if sms is not None:
            keys = max(keys, 512)
    return max(keys, block_n, triton.next_power_of_2(triton.cdiv(N, MAX_PARTS)))


@triton.jit
def _ancestor_list_kernel(mask_ptr, seqlens_ptr, anc_ptr, cnt_ptr, T, N, BLOCK: tl.constexpr):
    # One program per row (b, t): anc[b, t, :] = the new tokens s that t sees (mask[b, t, s], at a
    # position L - T + s in [0, min(L, N))) in index order, then -1; cnt[b, t] = how many. Each seen s is
    # stored at its rank among them (a running count plus an inclusive scan), and the lanes past the count
    # get -1: two disjoint sets of addresses.
    row = tl.program_id(0)
    b = row // T
    L = tl.load(seqlens_ptr + b)
    Lc = tl.minimum(tl.maximum(L, 0), N)
    new0 = L - T
    base = anc_ptr + row.to(tl.int64) * T
    count = tl.sum(tl.zeros((BLOCK,), tl.int32), 0)
    for s0 in range(0, T, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        pos = new0 + s
        m = tl.load(mask_ptr + row.to(tl.int64) * T + s, mask=s < T, other=0)
        seen = (m != 0) & (pos >= 0) & (pos < Lc)
        rank = count + tl.cumsum(seen.to(tl.int32), 0) - 1
        tl.store(base + rank, s, mask=seen)
        count += tl.sum(seen.to(tl.int32), 0)
    for i0 in range(0, T, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        tl.store(base + i, tl.full((BLOCK,), -1, tl.int32), mask=(i >= count) & (i < T))
    tl.store(cnt_ptr + row, count)


def _ancestor_lists(tree_mask, cache_seqlens, N, block=None, with_counts=False):
    """int32 [B, T, T]: row (b, t) lists the new tokens s that t sees (tree_mask[b, t, s], at a position
    in [0, min(L, N))) in index order, then -1; ``with_counts``: also int32 [B, T], how many. The i-th of
    them has rank L - T + i: the position it takes once t's path is committed. One launch, no host
    synchronisation. ``block``: the mask's elements per step (tests force several steps)."""
    B, T, _ = tree_mask.shape
    anc = torch.empty((B, T, T), device=tree_mask.device, dtype=torch.int32)
    cnt = torch.empty((B, T), device=tree_mask.device, dtype=torch.int32)
    # bool loads as uint8: the interpreter rejects bool pointers
    _ancestor_list_kernel[(B * T,)](tree_mask.contiguous().view(torch.uint8), cache_seqlens, anc, cnt, T, N,
                                    BLOCK=block or min(1024, max(16, triton.next_power_of_2(T))))
    return (anc, cnt) if with_counts else anc


@register("verify_attention", "triton")
def verify_attention(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, num_splits=None,
                     block_rows=None, window=None, softcap=None, cache_leftpad=None, alibi_slopes=None):
    """The launcher; ``num_splits`` and ``block_rows`` (a power of two, 16-128: query rows per program
    instead of ``_block_r``'s) are for tests and benchmarks. Any fixed ``block_rows`` keeps the rows
    independent of T; two calls compare bitwise only with the same one. ``window``: a sliding window's
    keys, or None; ``softcap``: the scores' soft cap, or None; ``cache_leftpad``: int32 [B], each row's first
    position, or None; ``alibi_slopes``: float32 [Hq] or [B, Hq] with a unit last stride, or None."""
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
    # 16-bit operands straight into tl.dot (P cast to V's dtype, as flash-attn does). The interpreter's
    # bf16 dot is wrong, so there bf16 runs the fp32 path; fp16 takes the GPU path, which tests it.
    lowp = q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and not interpret)
    if block_rows is not None and (block_rows not in (16, 32, 64, 128)):
        raise ValueError(f"block_rows must be 16, 32, 64 or 128, got {block_rows}")
    BLOCK_R = block_rows or _block_r(G, lowp, interpret)
    BLOCK_N = _block_n(D, interpret)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    row_blocks = triton.cdiv(R, BLOCK_R)
    PS = _part_keys(Hkv, N, BLOCK_N, q.device, num_splits)
    NP = max(1, triton.cdiv(N, PS))
    m = torch.empty((B * Hkv * NP * R,), device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty((B * Hkv * NP * R, D), device=q.device, dtype=torch.float32)
    # causal: any pointer, never read
    anc, cnt = (_ancestor_lists(tree_mask, cache_seqlens, N, with_counts=True) if tree_mask is not None
                else (cache_seqlens, cache_seqlens))
    # Row blocks vary fastest in the grid: the blocks of one part run together and share its tiles in L2.
    for tail, grid in ((False, (row_blocks, NP, B * Hkv)), (True, (row_blocks, B * Hkv))):
        _verify_attention_split_kernel[grid](
            q, k_cache, v_cache, cache_seqlens, anc, cnt, cache_seqlens if cache_leftpad is None else cache_leftpad,
            lse if alibi_slopes is None else alibi_slopes, m, l, acc,
            softmax_scale, float(softcap or 1.0), T, G, R, Hkv, N, NP, PS, D, window or 0,
            alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.ndim == 2 else 0,
            q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            HAS_MASK=tail and tree_mask is not None, TREE=tree_mask is not None, HAS_WINDOW=bool(window),
            HAS_LEFTPAD=cache_leftpad is not None, SOFTCAP=bool(softcap), ALIBI=alibi_slopes is not None,
            LOWP_DOT=lowp, TAIL=tail, BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N,
            BLOCK_D=BLOCK_D, num_warps=4, enable_fp_fusion=False,
        )
    _verify_attention_merge_kernel[(B * Hkv * R,)](
        m, l, acc, out, lse, T, G, R, Hkv, NP, D,
        BLOCK_P=max(2, triton.next_power_of_2(NP)), BLOCK_D=BLOCK_D, enable_fp_fusion=False,
    )
    return out, lse
