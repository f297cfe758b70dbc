// Verification attention on the CPU (docs/design.md 3.2): T new queries over a long KV cache, causal or
// tree mask on the last T keys. Torch-free; the CPU engines' hot loop.
//
// Each query's keys, in rank order (the prefix, then the new tokens it sees), are cut into parts at fixed
// multiples of kPartKeys; each part is an online softmax in fp32 from a fresh state, and the parts are
// folded left to right. Tiles sit at multiples of KT ranks: below the prefix rounded down to KT a tile
// serves all R = T * g query rows of the GQA group (flash-decoding); the rest is walked query by query
// over exactly the keys each sees. With one score order and one tile-sum tree per dtype at every R
// (tile_path), a row's result depends only on the keys it sees: a pass of T tokens gives each row the
// bits of the one-token step at its position (verify_attention_cpu; docs/attention.md "Independent of
// T"). Only positions in [0, min(L, N)) are ever read, whatever L.
//
// One tile (attend_range): scores (scores_keys | scores_lanes | scores_dot_avx512 | scores_tile) ->
// softmax_update_rows (or the lanes softmax) -> pv_tile. Each step is a small function; where
// an AVX-512 version exists it sits next to the portable one (built with -march=native on an AVX-512 CPU).
// bf16 caches on a CPU with AVX512_BF16 take the bf16 dot product twice: the scores (scores_dot_avx512 on
// the raw bf16 queries against the keys in place, at any number of rows) and P V (pv_tile_dpbf16: the
// weights rounded to bf16, two keys per instruction, fp32 accumulators); on a CPU with AMX-BF16 they take
// the tiles instead (attend_range_amx: S^T = K Q^T and P V as tile products, 16 rows a block).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "triforce/common.h"  // <immintrin.h> with F16C or AVX-512
#include "triforce/softcap.h"
#include "triforce/team.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(TRIFORCE_AMX_TILES) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define TRIFORCE_VA_AMX 1
#endif

namespace triforce {
namespace va {

constexpr int64_t KT = 32;  // keys per tile: a [D, 32] fp32 K tile is 16 KB at D = 128 (L1-resident)
constexpr int64_t RB = 4;   // query rows per register block in the QK^T loop (4 rows share each K load)
constexpr int64_t kSmallR = 8;  // up to this many fp32 query rows: keys in lanes (scores_keys), no K tile
// Keys per head and turn when an item walks all KV heads (one tile: turns start at tile boundaries, so
// the chunk never changes which keys a tile holds, nor a bit of the result). The next turn's rows are
// prefetched during this one, so the first turn of an item is read cold: at 128 keys that was 13% of a
// 1000-key SmolLM2 layer. 2026-11-27, min of 4 alternating rounds (2-core AMD EPYC VM), 30 streamed
// layers of 9/3 heads, D = 64, T = 1, one thread: fp32 N = 1000 3.78 -> 2.74 ms, T = 5 6.97 -> 5.90 ms,
// N = 6000 21.96 -> 20.77 ms; bf16 N = 6000 8.16 -> 7.84 ms; two threads N = 6000 11.85 -> 10.91 ms,
// N = 3000, T = 5 12.61 -> 11.58 ms; 32/8 heads, D = 128, N = 32K (min of 3): fp32 30.8 -> 28.6 ms,
// bf16 14.2 -> 12.9 ms, bf16 T = 16 81.8 -> 76.1 ms, two threads bf16 7.44 -> 7.05 ms, fp32 equal.
constexpr int64_t kHeadChunk = KT;
static_assert(kHeadChunk % KT == 0, "head turns must start at tile boundaries");
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x <= 0 (scores minus a running max): common.h's exp_f32, on one float or on 16 lanes
// (exactly 0 below -87.3 and for -inf). A row's running-max rescaling takes the 16-lane form on every
// AVX-512 path (exp16), so it has the same bits on the row-major paths and on the rows-in-lanes path.
#if defined(__AVX512F__)
inline __m512 exp_nonpos(__m512 x) { return exp_f32(x); }
#endif
inline float exp_nonpos(float x) { return exp_f32(x); }

// out[i] = exp_nonpos(x[i]) for 16 values: one 16-lane exp on AVX-512.
inline void exp16(const float* x, float* out) {
#if defined(__AVX512F__)
  _mm512_storeu_ps(out, exp_nonpos(_mm512_loadu_ps(x)));
#else
  for (int i = 0; i < 16; ++i) out[i] = exp_nonpos(x[i]);
#endif
}

template <typename T>
inline void load_row(const T* src, float* dst, int64_t D) {
  for (int64_t d = 0; d < D; ++d) dst[d] = to_float(src[d]);
}
inline void load_row(const bf16* src, float* dst, int64_t D) {  // bf16 -> fp32 is a 16-bit shift
  for (int64_t d = 0; d < D; ++d) {
    const uint32_t u = static_cast<uint32_t>(src[d].bits) << 16;
    std::memcpy(dst + d, &u, 4);
  }
}
#if defined(__F16C__)
inline void load_row(const f16* src, float* dst, int64_t D) {  // hardware conversion, 8 at a time
  int64_t d = 0;
  for (; d + 8 <= D; d += 8)
    _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + d))));
  for (; d < D; ++d) dst[d] = to_float(src[d]);
}
#endif

// Query rows padded to whole 16-lane vectors: the rows-in-lanes path keeps row r in lane r % 16.
inline int64_t padded_rows(int64_t R) { return (R + 15) / 16 * 16; }

struct Scratch {
  // K tile [D][KT] (transposed) or [KT][D], V tile [KT][D], scores [R][KT] (or [KT][RP] with the rows in
  // lanes), q [R][D], one K row [D]. The tiles' path (attend_range_amx): 16 rows' acc [16][D], P [16][KT]
  // in bf16, V in key pairs [KT / 2][D][2] bf16, and 16 keys [16][D] bf16 of a partial group, zero-padded.
  std::vector<float> kt, vt, s, q, row;
  std::vector<float> acc16;
  std::vector<uint16_t> pb, vb, kpad;
  Scratch(int64_t R, int64_t D, bool tiles = false)
      : kt(D * KT), vt(KT * D), s(padded_rows(R) * KT), q(R * D), row(D), acc16(tiles ? 16 * D : 0),
        pb(tiles ? 16 * KT : 0), vb(tiles ? KT * D : 0), kpad(tiles ? 16 * D : 0) {}
};

// ---- one tile of n <= KT keys: load K/V, scores, mask, online-softmax update, P V ---------------------

// Prefetch the K/V rows [p, p + n) (the next tile, inside [start, end): never beyond L) into L2. A tile
// is 2 x KT x D elements (256 lines for fp32 D = 64): prefetched into L1 (prefetcht0) most of them were
// dropped (L1 has few miss buffers) and a SmolLM2 decode-step layer (T = 1, 1000 keys, 3 KV heads, one
// core, cold cache) took 198 us; into L2, 150 us (bf16: 105 -> 61 us; T = 5: 339 -> 287 us).
template <typename T>
inline void prefetch_rows(const T* k, int64_t skn, const T* v, int64_t svn, int64_t p, int64_t n, int64_t D) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t off = 0; off < D * static_cast<int64_t>(sizeof(T)); off += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(k + (p + j) * skn) + off, 0, 2);
      __builtin_prefetch(reinterpret_cast<const char*>(v + (p + j) * svn) + off, 0, 2);
    }
}

// Spread prefetch of whole cache rows (every KV head of a key) into L2, for an item that walks all KV
// heads chunk by chunk: while it computes one chunk, head after head, the next chunk's rows are
// requested a share per step() (two steps per tile: before its scores and before its P V), so what it
// reads from memory is one sequential stream of whole rows, requested at about the rate it is consumed.
// The spreading matters: the same requests issued once per tile (at its start) gained a third as much
// (SmolLM2 layer, 3000 keys, T = 1, one core: 381 us per head with per-head prefetch, 352 us with whole
// rows once per tile, 258 us twice per tile; three times per tile measured 306 us).
struct RowPrefetch {
  const char* k = nullptr;  // the current row (K and V), rows skn_bytes / svn_bytes apart
  const char* v = nullptr;
  int64_t skn_bytes = 0, svn_bytes = 0, row_bytes = 0;  // row_bytes: the span of one key's heads
  int64_t rows = 0, off = 0, per_step = 0;              // rows left, next byte offset in the row, lines per step()
  void reset(const char* k_, int64_t skn_b, const char* v_, int64_t svn_b, int64_t row_b, int64_t rows_,
             int64_t steps) {
    k = k_, v = v_, skn_bytes = skn_b, svn_bytes = svn_b, row_bytes = row_b, rows = rows_, off = 0;
    const int64_t lines = rows * ((row_bytes + 63) / 64);
    per_step = steps > 0 ? (lines + steps - 1) / steps : lines;
  }
  void step() {
    for (int64_t e = 0; e < per_step && rows > 0; ++e) {
      __builtin_prefetch(k + off, 0, 2);
      __builtin_prefetch(v + off, 0, 2);
      if ((off += 64) >= row_bytes) off = 0, k += skn_bytes, v += svn_bytes, --rows;
    }
  }
};

// Keys of P V per RowPrefetch step on the few-rows path (kKeys; steps_per_tile).
constexpr int64_t kPvKeysPerStep = 8;
// On the dot-product paths (kDotBf16, kDot) from kDotSpreadMinR rows on: rows of each 16-key group of the
// scores per RowPrefetch step, and one step per block of P V rows (steps_per_tile).
constexpr int64_t kDotRowsPerStep = 3;
constexpr int64_t kDotSpreadMinR = 6;

// K transposed, kt [D][KT] with columns n..KT-1 zero (so the QK^T blocks always run over KT keys), and
// V row-major, vt [n][D]. row: D floats of scratch for one converted K row (fp32 K rows are read in
// place).
template <typename T>
inline void load_tile_transposed(const T* k, int64_t skn, const T* v, int64_t svn, int64_t p0, int64_t n,
                                 int64_t D, float* kt, float* vt, float* row) {
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = row;
    if constexpr (std::is_same_v<T, float>)
      kr = k + (p0 + j) * skn;
    else
      load_row(k + (p0 + j) * skn, row, D);
    for (int64_t d = 0; d < D; ++d) kt[d * KT + j] = kr[d];
    load_row(v + (p0 + j) * svn, vt + j * D, D);
  }
  for (int64_t j = n; j < KT; ++j)
    for (int64_t d = 0; d < D; ++d) kt[d * KT + j] = 0.f;
}

#if defined(__AVX512F__)
// Scores for D % 16 == 0 with d in lanes: per row and 16 keys, 16 independent accumulators over D (one
// q load feeds 16 FMAs), then one hsum16. In a partial group, keys n..15 repeat key n - 1 (never a row
// past the tile, which may lie past L); mask_pad overwrites their scores with -inf.
//
// Q = bf16 (bfloat16 caches with D % 64 == 0 on AVX512_BF16: bf16_scores) uses the bf16 dot-product
// instruction instead: the queries stay in bfloat16 (unscaled: as the op received them), each vdpbf16ps
// multiplies 32 query and key elements exactly and adds the pairs' sums into 16 fp32 lanes (twice the
// elements per instruction of widening to fp32 first; denormal bf16 inputs count as zero), and `scale`
// multiplies the reduced score. Q = float: q is already scaled. Either way a score does not depend on R.
// rows: a share of the next chunk's rows every kDotRowsPerStep rows of each 16-key group (steps_per_tile).
template <typename Q, typename E>
inline void scores_dot_avx512(const Q* q, int64_t R, int64_t D, const E* kt, int64_t ks, int64_t n, float* s,
                              float scale = 1.f, RowPrefetch* rows = nullptr) {
  constexpr bool dp = std::is_same_v<Q, bf16>;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const E* kj[16];
    for (int j = 0; j < 16; ++j) kj[j] = kt + std::min<int64_t>(j0 + j, n - 1) * ks;
    for (int64_t r = 0; r < R; ++r) {
      if (rows && r % kDotRowsPerStep == 0) rows->step();
      const Q* qr = q + r * D;
      __m512 acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
      if constexpr (dp) {
#if defined(__AVX512BF16__)
        static_assert(std::is_same_v<E, bf16>, "bf16 queries score bf16 keys");
        for (int64_t d = 0; d < D; d += 32) {
          const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + d);
          for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], qv, (__m512bh)_mm512_loadu_si512(kj[j] + d));
        }
#endif
      } else {
        for (int64_t d = 0; d < D; d += 16) {
          const __m512 qv = _mm512_loadu_ps(qr + d);
          for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qv, load16(kj[j] + d), acc[j]);
        }
      }
      const __m512 sum = hsum16_avx512(acc);
      _mm512_storeu_ps(s + r * KT + j0, dp ? _mm512_mul_ps(sum, _mm512_set1_ps(scale)) : sum);
    }
  }
}
#endif

// a * b + c, fused where the CPU has FMA (whatever the compiler's contraction setting).
inline float madd(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// What a tile's scaled scores become before the softmax: the soft cap (Gemma 2's; 0: none), then ALiBi's bias
// (slope null: none): row r adds slope[r] * (rank - qlast[r]) to the score of the key at `rank`, qlast[r] being
// the last rank its query sees (the bias is -slope x the positions it sees after the key: 0 for its own). The
// bias is one multiply-add of the score (madd), computed alike on every path, so a row keeps the bits it has
// in any pass. A call's keys [start, end) sit at ranks rank0 + start .. (the walk's calls start at 0 over a
// query's copied keys).
struct ScoreMods {
  float softcap = 0.f;
  const float* slope = nullptr;    // per row of the call: its head's slope
  const int64_t* qlast = nullptr;  // per row of the call: its query's last rank
  int64_t rank0 = 0;
  ScoreMods rows_from(int64_t r0) const {  // the same for rows r0.. of the call
    ScoreMods m = *this;
    if (slope) m.slope += r0, m.qlast += r0;
    return m;
  }
};

// The mods on s[r * ld + j] for rows r < R and keys j < n at ranks rank .. rank + n - 1.
inline void apply_mods_rows(float* s, int64_t ld, int64_t R, int64_t n, int64_t rank, const ScoreMods& mods) {
  for (int64_t r = 0; r < R; ++r) {
    float* sr = s + r * ld;
    if (mods.softcap > 0.f) softcap_inplace(sr, n, mods.softcap);
    if (mods.slope) {
      const float slope = mods.slope[r];
      const int64_t d0 = rank - mods.qlast[r];
      for (int64_t j = 0; j < n; ++j) sr[j] = madd(slope, static_cast<float>(d0 + j), sr[j]);
    }
  }
}

// The same on the rows-in-lanes layout: row r of key j at st[j * RP + r].
inline void apply_mods_lanes(float* st, int64_t RP, int64_t R, int64_t n, int64_t rank, const ScoreMods& mods) {
  if (mods.softcap > 0.f) softcap_inplace(st, n * RP, mods.softcap);  // (elementwise: the layout does not matter)
  if (mods.slope)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t r = 0; r < R; ++r)
        st[j * RP + r] = madd(mods.slope[r], static_cast<float>(rank + j - mods.qlast[r]), st[j * RP + r]);
}

// s[i][j] = q_i . K[:, j] for ROWS query rows and all KT keys of the transposed tile, vectorised over
// the keys. Each score is one multiply-add chain over d = 0 .. D-1 (madd: the order of the other fp32
// paths, so that a score does not depend on which path or row block computed it).
template <int64_t ROWS>
inline void scores_rows(const float* q, int64_t D, const float* kt, float* s) {
  float acc[ROWS][KT] = {};  // ROWS x KT fixed by the template: 512 bytes for ROWS = RB = 4
  for (int64_t d = 0; d < D; ++d) {
    const float* kd = kt + d * KT;
    for (int64_t i = 0; i < ROWS; ++i) {
      const float qv = q[i * D + d];
      for (int64_t j = 0; j < KT; ++j) acc[i][j] = madd(qv, kd[j], acc[i][j]);
    }
  }
  std::memcpy(s, acc, sizeof(acc));  // the ROWS score rows are contiguous, KT apart
}

#if defined(__AVX512F__)
// The same for 8 rows: 8 rows x 32 keys = 16 zmm accumulators; 2 K loads + 8 broadcasts feed 16 FMAs
// per dim.
inline void scores_8rows_avx512(const float* q, int64_t D, const float* kt, float* s) {
  static_assert(KT == 32, "two zmm per score row");
  __m512 a0[8], a1[8];
  for (int i = 0; i < 8; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * KT), k1 = _mm512_loadu_ps(kt + d * KT + 16);
    for (int i = 0; i < 8; ++i) {
      const __m512 qb = _mm512_set1_ps(q[i * D + d]);
      a0[i] = _mm512_fmadd_ps(qb, k0, a0[i]);
      a1[i] = _mm512_fmadd_ps(qb, k1, a1[i]);
    }
  }
  for (int i = 0; i < 8; ++i) {
    _mm512_storeu_ps(s + i * KT, a0[i]);
    _mm512_storeu_ps(s + i * KT + 16, a1[i]);
  }
}
#endif

#if defined(__AVX512F__)
// x[i] (key i's 16 elements d0 .. d0+15) -> x[d] (lane i = key i's element d0 + d): a 16 x 16 transpose.
inline void transpose16_avx512(__m512* x) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    x[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    x[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    x[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    x[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(x[i], x[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(x[i], x[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(x[i + 8], x[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(x[i + 8], x[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    x[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    x[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Few fp32 rows (R <= kSmallR, D % 16 == 0): s[r][j] = q_r . k_j for j < n with the keys in lanes, so that
// each score is one multiply-add chain over d = 0 .. D-1, the order of the rows-in-lanes and transposed-
// tile paths (a dot product with d in lanes would sum 16 partial chains instead, and a decode step would
// then round differently from a verification pass). Keys are read in place, 16 x 16 elements at a time,
// and transposed in registers. In a partial group keys n..15 repeat key n - 1; their scores are masked.
template <int ROWS>
inline void scores_keys_avx512(const float* q, int64_t D, const float* k, int64_t ks, int64_t n, float* s,
                               RowPrefetch* rows) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    if (rows) rows->step();  // a share of the next chunk's rows per group (steps_per_tile)
    const float* kj[16];
    for (int j = 0; j < 16; ++j) kj[j] = k + std::min<int64_t>(j0 + j, n - 1) * ks;
    __m512 acc[ROWS];
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      __m512 x[16];
      for (int j = 0; j < 16; ++j) x[j] = _mm512_loadu_ps(kj[j] + d0);
      transpose16_avx512(x);
      for (int d = 0; d < 16; ++d)
        for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * D + d0 + d]), x[d], acc[r]);
    }
    for (int r = 0; r < ROWS; ++r) _mm512_storeu_ps(s + r * KT + j0, acc[r]);
  }
}

inline void scores_keys(const float* q, int64_t R, int64_t D, const float* k, int64_t ks, int64_t n, float* s,
                        RowPrefetch* rows) {
  static_assert(kSmallR == 8, "one case per row count");
  switch (R) {
    case 1: scores_keys_avx512<1>(q, D, k, ks, n, s, rows); break;
    case 2: scores_keys_avx512<2>(q, D, k, ks, n, s, rows); break;
    case 3: scores_keys_avx512<3>(q, D, k, ks, n, s, rows); break;
    case 4: scores_keys_avx512<4>(q, D, k, ks, n, s, rows); break;
    case 5: scores_keys_avx512<5>(q, D, k, ks, n, s, rows); break;
    case 6: scores_keys_avx512<6>(q, D, k, ks, n, s, rows); break;
    case 7: scores_keys_avx512<7>(q, D, k, ks, n, s, rows); break;
    default: scores_keys_avx512<8>(q, D, k, ks, n, s, rows); break;
  }
}
#endif

// S = Q K^T for all R rows over the transposed tile: blocks of 8 rows (AVX-512), then RB, then 1.
inline void scores_tile(const float* q, int64_t R, int64_t D, const float* kt, float* s) {
  int64_t r0 = 0;
#if defined(__AVX512F__)
  for (; r0 + 8 <= R; r0 += 8) scores_8rows_avx512(q + r0 * D, D, kt, s + r0 * KT);
#endif
  for (; r0 + RB <= R; r0 += RB) scores_rows<RB>(q + r0 * D, D, kt, s + r0 * KT);
  for (; r0 < R; ++r0) scores_rows<1>(q + r0 * D, D, kt, s + r0 * KT);
}

// -inf for the scores of one row that are not keys (j >= n). Every key a tile holds is visible to every
// row it scores: the caller walks each query's own keys (verify_attention_cpu), so nothing is masked.
inline void mask_pad(float* sr, int64_t n) {
  for (int64_t j = n; j < KT; ++j) sr[j] = kNegInf;
}

// The sum of a tile's KT = 32 weights in one fixed tree: slot i + slot i + 16, then halves (i + 8, i + 4,
// i + 2, i + 1). Every path sums a row's tile this way (the rows-in-lanes path lane by lane), so the sum
// does not depend on the path; absent keys are zeros, which add nothing.
inline float sum32_tree(const float* p) {
  float a[16];
  for (int i = 0; i < 16; ++i) a[i] = p[i] + p[i + 16];
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = a[i] + a[i + w];
  return a[0];
}

// Largest of a row's KT scores.
inline float row_max(const float* sr) {
#if defined(__AVX512F__)
  static_assert(KT == 32, "two zmm per score row");
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_loadu_ps(sr), _mm512_loadu_ps(sr + 16)));
#else
  float mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < KT; ++j) mx = std::max(mx, sr[j]);
  return mx;
#endif
}

// sr[j] = e^(sr[j] - m) for a row's KT scores (0 for the pads, j >= n); returns their sum.
inline float exp_row(float* sr, float m) {
#if defined(__AVX512F__)
  const __m512 mb = _mm512_set1_ps(m);
  const __m512 p0 = exp_nonpos(_mm512_sub_ps(_mm512_loadu_ps(sr), mb));
  const __m512 p1 = exp_nonpos(_mm512_sub_ps(_mm512_loadu_ps(sr + 16), mb));
  _mm512_storeu_ps(sr, p0);
  _mm512_storeu_ps(sr + 16, p1);
  // sum32_tree in registers: i + i+16, then i + i+8, i + i+4, i + i+2, i + i+1
  const __m512 a16 = _mm512_add_ps(p0, p1);
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a16), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a16), 1)));
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
  return _mm_cvtss_f32(_mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1)));
#else
  for (int64_t j = 0; j < KT; ++j) sr[j] = exp_nonpos(sr[j] - m);
  return sum32_tree(sr);
#endif
}

// Online-softmax update of R query rows by their tile of n keys' scores s [R][KT] (j >= n padded here):
// per row the running max m and sum l, the accumulator acc [D] rescaled by e^(m_old - m_new); s becomes
// the weights e^(s - m_new). The rescale factors of 16 rows come from one 16-lane exp; l is updated by
// one fused multiply-add (l * alpha + sum), as on the rows-in-lanes path.
inline void softmax_update_rows(float* s, int64_t n, int64_t R, float* m, float* l, float* acc, int64_t D) {
  for (int64_t r0 = 0; r0 < R; r0 += 16) {
    const int64_t rn = std::min<int64_t>(16, R - r0);
    // alignas(64), stated: GCC's vectoriser otherwise over-aligns diff late (its zero-fill is one aligned
    // 64-byte store), after AddressSanitizer has placed the frame on its fake stack (32-byte aligned under
    // detect_stack_use_after_return=1), and the store faults there. Declared, the frame stays off it.
    alignas(64) float m_new[16], diff[16] = {}, alpha[16];
    for (int64_t i = 0; i < rn; ++i) {
      float* sr = s + (r0 + i) * KT;
      mask_pad(sr, n);
      m_new[i] = std::max(m[r0 + i], row_max(sr));
      diff[i] = m_new[i] == kNegInf ? 0.f : m[r0 + i] - m_new[i];
    }
    exp16(diff, alpha);
    for (int64_t i = 0; i < rn; ++i) {
      float* sr = s + (r0 + i) * KT;
      if (m_new[i] == kNegInf) {  // nothing visible yet for this row: it adds nothing
        for (int64_t j = 0; j < KT; ++j) sr[j] = 0.f;
        continue;
      }
      l[r0 + i] = madd(l[r0 + i], alpha[i], exp_row(sr, m_new[i]));
      m[r0 + i] = m_new[i];
      if (alpha[i] != 1.f)
        for (int64_t d = 0; d < D; ++d) acc[(r0 + i) * D + d] *= alpha[i];
    }
  }
}

// acc [D] += sum_j p[j] V[j] over the tile's n keys for one row, in 64-dim blocks that stay in
// registers across the keys: one load + store of acc per tile instead of one per key.
inline void pv_row(const float* p, int64_t n, int64_t D, const float* vt, int64_t vs, float* acc) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    float a[64];  // one 64-dim block (the loop bound): 256 bytes
    std::memcpy(a, acc + d0, sizeof(a));
    for (int64_t j = 0; j < n; ++j) {
      const float pj = p[j];
      const float* vj = vt + j * vs + d0;
      for (int64_t d = 0; d < 64; ++d) a[d] += pj * vj[d];
    }
    std::memcpy(acc + d0, a, sizeof(a));
  }
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vj = vt + j * vs;
    for (int64_t d = d0; d < D; ++d) acc[d] += pj * vj[d];
  }
}

#if defined(__AVX512F__)
// The same for ROWS <= 4 rows (D % 64 == 0): ROWS x 64 dims in up to 16 zmm accumulators; 4 V loads +
// ROWS broadcasts feed 4 * ROWS FMAs per key. Weight of row i, key j: s[i * KT + j], or s[j * rp + i]
// when LANES (the rows-in-lanes layout; rp = 16 * vectors). The layout is a template parameter so that
// the row-major path keeps its constant offsets (a runtime stride there cost ~1.5% at T = 1).
// rows (row-major only): a share of the next chunk's rows every kPvKeysPerStep keys (steps_per_tile).
template <int ROWS, typename E, bool LANES = false>
inline void pv_rows_avx512(const float* s, int64_t rp, int64_t n, int64_t D, const E* vt, int64_t vs, float* acc,
                           RowPrefetch* rows = nullptr) {
  const int64_t srs = LANES ? 1 : KT, sks = LANES ? rp : 1;
  static_assert(ROWS >= 1 && ROWS <= 4, "16 accumulators at most");
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    __m512 a[ROWS][4];
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 4; ++c) a[i][c] = _mm512_loadu_ps(acc + i * D + d0 + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (!LANES)
        if (rows && j % kPvKeysPerStep == 0) rows->step();
      const E* vj = vt + j * vs + d0;
      const __m512 v0 = load16(vj), v1 = load16(vj + 16), v2 = load16(vj + 32), v3 = load16(vj + 48);
      for (int i = 0; i < ROWS; ++i) {
        const __m512 pb = _mm512_set1_ps(s[i * srs + j * sks]);
        a[i][0] = _mm512_fmadd_ps(pb, v0, a[i][0]);
        a[i][1] = _mm512_fmadd_ps(pb, v1, a[i][1]);
        a[i][2] = _mm512_fmadd_ps(pb, v2, a[i][2]);
        a[i][3] = _mm512_fmadd_ps(pb, v3, a[i][3]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc + i * D + d0 + 16 * c, a[i][c]);
  }
}
#endif

// The P V register blocks over R rows: f(std::integral_constant<int, ROWS>, first row) for blocks of 4
// rows, then once for the last 1-3 rows together.
template <typename F>
inline void row_blocks(int64_t R, F&& f) {
  int64_t r0 = 0;
  for (; r0 + 4 <= R; r0 += 4) f(std::integral_constant<int, 4>{}, r0);
  switch (R - r0) {
    case 3: f(std::integral_constant<int, 3>{}, r0); break;
    case 2: f(std::integral_constant<int, 2>{}, r0); break;
    case 1: f(std::integral_constant<int, 1>{}, r0); break;
    default: break;
  }
}

// acc [R][D] += P [R][n] V [n][D] (value j at vt + j * vs, fp32 or, on the AVX-512 path, the cache's
// bf16/fp16): blocks of 4 rows, then the last 1-3 rows together (AVX-512, D % 64 == 0); otherwise row
// by row (fp32 only: attend_range converts other types into a tile first). P [r][j] at s[r * KT + j], or
// at s[j * RP + r] when rp = RP (the rows-in-lanes layout, AVX-512 only). prefetch: the row-major
// path's share of the next chunk's rows, stepped during the first block of rows (steps_per_tile).
template <typename E>
inline void pv_tile(const float* s, int64_t R, int64_t n, int64_t D, const E* vt, int64_t vs, float* acc,
                    int64_t rp = 0, RowPrefetch* prefetch = nullptr) {
  int64_t r0 = 0;
#if defined(__AVX512F__)
  if (D % 64 == 0) {
    auto blocks = [&](auto lanes) {
      constexpr bool L = decltype(lanes)::value;
      const int64_t srs = L ? 1 : KT;
      row_blocks(R, [&](auto rows, int64_t r) {
        pv_rows_avx512<decltype(rows)::value, E, L>(s + r * srs, rp, n, D, vt, vs, acc + r * D,
                                                    r == 0 ? prefetch : nullptr);
      });
    };
    if (rp)
      blocks(std::true_type{});
    else
      blocks(std::false_type{});
    return;
  }
#endif
  if constexpr (std::is_same_v<E, float>) {
    for (; r0 < R; ++r0) pv_row(s + r0 * KT, n, D, vt, vs, acc + r0 * D);
  } else {  // not reached (see above); correct all the same
    for (; r0 < R; ++r0)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) acc[r0 * D + d] += s[r0 * KT + j] * to_float(vt[j * vs + d]);
  }
}

#if defined(__AVX512BF16__)
// bf16 values on the bf16 dot-product path (kDotBf16): acc [R][D] += P V with P rounded to bf16 (round to
// nearest even, as flash-attention's P V matmul takes it) and each vdpbf16ps multiplying two keys at once:
// lane i of an operand holds (V[j][d], V[j + 1][d]) for one dim d, the other holds (P[r][j], P[r][j + 1])
// in every lane, so one instruction adds two exact products into 16 fp32 dims. Against widening V to fp32
// (pv_rows_avx512: per key and 64 dims 4 conversions, 4 shifts and 4 * ROWS multiply-adds), a pair of keys
// costs 4 loads, 4 interleaves and 4 * ROWS dot products per 64 dims: half the arithmetic per key.
// The interleave (vpunpck{l,h}wd) works within 128-bit lanes, so the accumulators hold a 64-dim block in
// a fixed permutation (pv_pair_load / pv_pair_store convert at the tile's start and end). An odd last key
// pairs with zeros: a row past the tile is never read. Every row of every pass on this path takes the
// same instructions in the same order (a key pair per step, 2j and 2j + 1 always paired), so a row's
// result still depends only on the keys it sees.
//
// Natural dims d0 .. d0 + 31 <-> the two accumulators of a 32-dim half: lo lane 4q + m = dim 8q + m,
// hi lane 4q + m = dim 8q + 4 + m (q = 0..3, m = 0..3).
inline void pv_pair_load(const float* src, __m512& lo, __m512& hi) {
  const __m512i ilo = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
  const __m512i ihi = _mm512_set_epi32(31, 30, 29, 28, 23, 22, 21, 20, 15, 14, 13, 12, 7, 6, 5, 4);
  const __m512 n0 = _mm512_loadu_ps(src), n1 = _mm512_loadu_ps(src + 16);
  lo = _mm512_permutex2var_ps(n0, ilo, n1);
  hi = _mm512_permutex2var_ps(n0, ihi, n1);
}
inline void pv_pair_store(float* dst, __m512 lo, __m512 hi) {
  const __m512i i0 = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i i1 = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  _mm512_storeu_ps(dst, _mm512_permutex2var_ps(lo, i0, hi));
  _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(lo, i1, hi));
}

template <int ROWS>
inline void pv_rows_dpbf16(const float* s, int64_t n, int64_t D, const bf16* vt, int64_t vs, float* acc) {
  static_assert(ROWS >= 1 && ROWS <= 4, "16 accumulators at most");
  static_assert(KT == 32, "one conversion of a row's weights");
  alignas(64) uint32_t pp[ROWS][KT / 2];  // row r's weights as bf16 pairs (P[2i], P[2i + 1])
  for (int i = 0; i < ROWS; ++i)
    _mm512_store_si512(pp[i], (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + i * KT + 16),
                                                            _mm512_loadu_ps(s + i * KT)));
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    __m512 a[ROWS][4];  // per row: dims d0..d0+31 (lo, hi), d0+32..d0+63 (lo, hi)
    for (int i = 0; i < ROWS; ++i) {
      pv_pair_load(acc + i * D + d0, a[i][0], a[i][1]);
      pv_pair_load(acc + i * D + d0 + 32, a[i][2], a[i][3]);
    }
    for (int64_t j = 0; j < n; j += 2) {
      const bf16* v0 = vt + j * vs + d0;
      const __m512i x0 = _mm512_loadu_si512(v0), x1 = _mm512_loadu_si512(v0 + 32);
      const bool pair = j + 1 < n;
      const __m512i y0 = pair ? _mm512_loadu_si512(v0 + vs) : zero;
      const __m512i y1 = pair ? _mm512_loadu_si512(v0 + vs + 32) : zero;
      const __m512bh w0 = (__m512bh)_mm512_unpacklo_epi16(x0, y0), w1 = (__m512bh)_mm512_unpackhi_epi16(x0, y0);
      const __m512bh w2 = (__m512bh)_mm512_unpacklo_epi16(x1, y1), w3 = (__m512bh)_mm512_unpackhi_epi16(x1, y1);
      for (int i = 0; i < ROWS; ++i) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[i][j / 2]));
        a[i][0] = _mm512_dpbf16_ps(a[i][0], w0, p);
        a[i][1] = _mm512_dpbf16_ps(a[i][1], w1, p);
        a[i][2] = _mm512_dpbf16_ps(a[i][2], w2, p);
        a[i][3] = _mm512_dpbf16_ps(a[i][3], w3, p);
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      pv_pair_store(acc + i * D + d0, a[i][0], a[i][1]);
      pv_pair_store(acc + i * D + d0 + 32, a[i][2], a[i][3]);
    }
  }
}

// pv_rows_dpbf16 over R rows: blocks of 4, then the last 1-3 together (D % 64 == 0). prefetch: a share of
// the next chunk's rows before each block (steps_per_tile).
inline void pv_tile_dpbf16(const float* s, int64_t R, int64_t n, int64_t D, const bf16* vt, int64_t vs,
                           float* acc, RowPrefetch* prefetch = nullptr) {
  row_blocks(R, [&](auto rows, int64_t r) {
    if (prefetch) prefetch->step();
    pv_rows_dpbf16<decltype(rows)::value>(s + r * KT, n, D, vt, vs, acc + r * D);
  });
}
#endif

// ---- rows in lanes: verification widths (R = T * g of kLanesMinR..kLanesMaxR rows), fp32 keys -----------
//
// Lane r % 16 of vector r / 16 holds query row r, so the score of key j for all rows is NV vectors
// st[j][0 .. RP) (RP = 16 * NV): each multiply-add broadcasts one key element (an embedded-broadcast
// operand, read in place from the cache row) against NV vectors of the transposed queries qt [D][RP].
// No horizontal sum anywhere: the online softmax runs down the keys, all rows at once, and P V
// broadcasts st[j][r]. The dot path instead scores 16 keys per row with 16 FMA chains, then reduces
// them with 30 shuffles on the same port as half the FMAs, and runs the softmax row by row.
// Padded lanes (r >= R) compute on zero queries and are never stored into m, l or acc.
constexpr int64_t kLanesMinR = 9;
constexpr int64_t kLanesMaxR = 64;
// Keys per register block: KB x NV accumulators + NV query vectors within the 32 zmm registers, and
// the KB key-row pointers within the general registers. 16 keys for one vector of rows fitted the zmm
// registers but not the pointers: inlined into the OpenMP region, GCC 12 parked them in xmm registers
// and moved one back per multiply-add (vmovq), ~45 instructions per 16 FMAs. 8 keys out of line
// (scores_lanes_avx512 is noinline) leave a loop of one load and 8 FMAs with memory broadcasts. One
// step's attention over SmolLM2's 30 float32 caches, one AMD EPYC core (alternating builds, min of 8):
// T = 3 at 6000 tokens 35.4-39.5 -> 29.5-34.3 ms, T = 5 40.9-43.3 -> 32.5-36.9, batch 4 x 3000 T = 3
// 75.0-81.9 -> 59.2-65.8. Bitwise the same scores (each key's own accumulators, d in the same order).
constexpr int lanes_kb(int64_t NV) { return NV == 1 ? 8 : NV == 2 ? 8 : NV == 3 ? 6 : 4; }

// Vectors of 16 rows on the rows-in-lanes path for R query rows of a T cache (AVX-512, fp32 caches,
// D % 64 == 0 for P V), or 0 where another path serves them.
template <typename T>
inline int64_t lanes_vectors(int64_t R, int64_t D) {
#if defined(__AVX512F__)
  return std::is_same_v<T, float> && R >= kLanesMinR && R <= kLanesMaxR && D % 64 == 0 ? (R + 15) / 16 : 0;
#else
  (void)R, (void)D;
  return 0;
#endif
}

// The R query rows q [R][D] transposed into qt [D][16 * nv], zero in the padded lanes.
inline void transpose_rows(const float* q, int64_t R, int64_t D, int64_t nv, float* qt) {
  const int64_t rp = 16 * nv;
  for (int64_t d = 0; d < D; ++d)
    for (int64_t r = 0; r < rp; ++r) qt[d * rp + r] = r < R ? q[r * D + d] : 0.f;
}

#if defined(__AVX512F__)

// st[j * RP + r] = q_r . k_j for j < n: KB keys x NV row vectors of accumulators per pass over D. In a
// partial block, keys n..KB-1 repeat key n - 1 (never a row past the tile) and are not stored.
template <int NV, int KB>
__attribute__((noinline)) void scores_lanes_avx512(const float* qt, int64_t D, const float* k, int64_t ks, int64_t n,
                                                   float* st, RowPrefetch* rows) {
  constexpr int64_t RP = 16 * NV;
  for (int64_t j0 = 0; j0 < n; j0 += KB) {
    if (rows) rows->step();  // a share of the next chunk's rows per block (steps_per_tile)
    const float* kj[KB];
    for (int j = 0; j < KB; ++j) kj[j] = k + std::min<int64_t>(j0 + j, n - 1) * ks;
    __m512 acc[KB][NV];
    for (int j = 0; j < KB; ++j)
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      __m512 qv[NV];
      for (int v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(qt + d * RP + 16 * v);
      for (int j = 0; j < KB; ++j) {
        const __m512 kb = _mm512_set1_ps(kj[j][d]);
        for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_fmadd_ps(qv[v], kb, acc[j][v]);
      }
    }
    const int64_t m = std::min<int64_t>(KB, n - j0);
    for (int64_t j = 0; j < m; ++j)
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(st + (j0 + j) * RP + 16 * v, acc[j][v]);
  }
}

// Online-softmax update of all R rows by a tile of n keys' scores st: per lane the running max m
// and sum l, st becomes the weights e^(s - m_new), and each acc row [D] is rescaled by e^(m_old - m_new).
// A row that has seen nothing keeps m = -inf (its weights are e^-inf = 0: no -inf - -inf anywhere).
template <int NV>
inline void softmax_lanes_avx512(float* st, int64_t n, int64_t R, float* m, float* l, float* acc, int64_t D) {
  constexpr int64_t RP = 16 * NV;
  alignas(64) float alpha[RP];
  const __m512 ninf = _mm512_set1_ps(kNegInf), zero = _mm512_setzero_ps();
  for (int v = 0; v < NV; ++v) {
    const int64_t r0 = 16 * v, live_rows = std::min<int64_t>(16, R - r0);
    const __mmask16 live = static_cast<__mmask16>((1u << live_rows) - 1);
    const __m512 m_old = _mm512_mask_loadu_ps(ninf, live, m + r0);
    __m512 mx = ninf;
    for (int64_t j = 0; j < n; ++j) mx = _mm512_max_ps(mx, _mm512_loadu_ps(st + j * RP + r0));
    const __m512 m_new = _mm512_max_ps(m_old, mx);
    const __m512 m_sub = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, ninf, _CMP_EQ_OQ), zero);
    __m512 tree[16];  // per lane, the sum of the tile's weights in sum32_tree's order (absent keys add nothing)
    for (int64_t j = 0; j < n; ++j) {
      const __m512 p = exp_nonpos(_mm512_sub_ps(_mm512_loadu_ps(st + j * RP + r0), m_sub));
      _mm512_storeu_ps(st + j * RP + r0, p);
      tree[j & 15] = j < 16 ? p : _mm512_add_ps(tree[j - 16], p);
    }
    for (int64_t j = n; j < 16; ++j) tree[j] = zero;
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) tree[i] = _mm512_add_ps(tree[i], tree[i + w]);
    const __m512 sum = tree[0];
    const __m512 a = exp_nonpos(_mm512_sub_ps(m_old, m_sub));
    _mm512_mask_storeu_ps(l + r0, live, _mm512_fmadd_ps(_mm512_mask_loadu_ps(zero, live, l + r0), a, sum));
    _mm512_mask_storeu_ps(m + r0, live, m_new);
    _mm512_store_ps(alpha + r0, a);
  }
  for (int64_t r = 0; r < R; ++r)
    if (alpha[r] != 1.f)
      for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= alpha[r];
}

// One tile on the rows-in-lanes path: scores (KB keys per pass, by NV), the online softmax, P V.
template <int NV, typename E>
inline void tile_lanes_avx512(const float* qt, int64_t R, int64_t D, const float* k, int64_t ks, const E* v,
                              int64_t vs, int64_t n, float* m, float* l, float* acc, float* st, RowPrefetch* rows,
                              const ScoreMods& mods, int64_t rank) {
  constexpr int64_t RP = 16 * NV;
  constexpr int KB = lanes_kb(NV);
  scores_lanes_avx512<NV, KB>(qt, D, k, ks, n, st, rows);
  apply_mods_lanes(st, RP, R, n, rank, mods);
  if (rows) rows->step();
  softmax_lanes_avx512<NV>(st, n, R, m, l, acc, D);
  pv_tile(st, R, n, D, v, vs, acc, RP);
}
#endif

// Words of one 16-row block of the tiles' packed queries (amx_pack_queries): D / 32 B tiles of 16 x 16 dwords.
inline int64_t amx_block_words(int64_t D) { return 16 * D; }

#if defined(TRIFORCE_VA_AMX)
// ---- the AMX tiles (Intel Sapphire Rapids and later) for bf16 caches: any number of rows --------------
//
// On this project's Intel Xeon VM one 512-bit vdpbf16ps issues every ~2.3 cycles (14 bf16 products a
// cycle), so a verification pass over a bf16 cache was bound by its arithmetic: a 5-token SmolLM2 pass cost
// as much as on a float32 cache (docs/attention.md, "bf16 caches on the AMX tiles"). A tile product
// (tdpbf16ps) multiplies 16 x 32 by 32 x 16 bf16 into 16 x 16 fp32 sums. Per tile of KT = 32 keys and up to
// 16 query rows:
// - scores, transposed: S^T [key][row] = K Q^T. The keys are the A tile, 16 rows of 32 dims read straight
//   from the cache (its row stride; a partial group of keys is copied into zero rows first, so no key past
//   the tile is read), Q^T is the B tile, packed once per item in dword pairs (amx_pack_queries); D / 32
//   products per 16 keys. The score of (row, key) is one fixed tile arithmetic on that key's and that row's
//   elements only: the same bits whatever R is and whatever else the tile holds. S^T is transposed in
//   registers and the online softmax runs row by row (softmax_update_rows; the rows-in-lanes softmax, one
//   16-lane exp per key whatever R is, made the decode step slower than vdpbf16ps);
// - P V: P [16 rows][KT] rounded to bf16 (round to nearest even, as the vdpbf16ps path rounds it) is the A
//   tile, V in key pairs ([KT / 2][D][2], interleaved per tile) the B tile, 16 dims of the rows' acc the C
//   tile: D / 16 products per tile.
// Every row of every call takes the same sequence of tile products (16-row blocks, tiles at multiples of KT
// ranks), so a pass of T tokens still gives each row the one-token step's bits. The bits differ from the
// vdpbf16ps path's (another instruction's rounding), so a process takes one path for all its calls: the
// tiles when the CPU has AMX-BF16 and Linux grants the tile data, unless TRIFORCE_AMX=0 (read once).

// Whether this process runs bf16 caches on the tiles: AMX-BF16, and the tiles granted (amx_tiles_granted).
inline bool amx_enabled() {
  static const bool on = __builtin_cpu_supports("amx-bf16") && amx_tiles_granted();
  return on;
}

// The tiles' configuration for the span of one work item (TileScope in verify_attention_cpu), released at
// its end: tiles 0 (C), 1 (A) and 2 (B), each 16 rows of 64 bytes.
inline void amx_configure() {
  TileConfig c;
  for (int t = 0; t < 3; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  amx_load_config(c);
}

// Q^T for rows [0, R) of q [R][D] (bf16) in blocks of 16 rows: block b, chunk c (32 dims), pair i, row r ->
// qa[b * 16D + c * 512 + i * 32 + 2r + {0, 1}] = q[16b + r][32c + 2i + {0, 1}]; zero for rows past R.
inline void amx_pack_queries(const bf16* q, int64_t R, int64_t D, uint16_t* qa) {
  const int64_t nb = (R + 15) / 16;
  std::fill(qa, qa + nb * amx_block_words(D), uint16_t(0));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d)
      qa[r / 16 * amx_block_words(D) + d / 32 * 512 + (d % 32) / 2 * 32 + 2 * (r % 16) + d % 2] = q[r * D + d].bits;
}

// One 16-row block over keys [start, end) (all visible to every row): R <= 16 live rows, qa its packed
// queries; m, l, acc its rows' state. start is a multiple of KT in the caller's ranks.
inline void attend_range_amx(const uint16_t* qa, int64_t R, int64_t D, const bf16* k, int64_t skn, const bf16* v,
                             int64_t svn, int64_t start, int64_t end, float* m, float* l, float* acc, Scratch& sc,
                             RowPrefetch* rows, float scale, const ScoreMods& mods) {
  float* st = sc.kt.data();  // S^T [KT][16], as the tiles store it
  float* sr = sc.s.data();   // S [R][KT]
  float* a16 = sc.acc16.data();
  uint16_t* pb = sc.pb.data();
  uint16_t* vb = sc.vb.data();
  uint16_t* kp = sc.kpad.data();
  std::copy_n(acc, R * D, a16);
  std::fill(a16 + R * D, a16 + 16 * D, 0.f);
  const __m512 sc16 = _mm512_set1_ps(scale);
  alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                  8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i ilo = _mm512_load_si512(lo_idx), ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
  for (int64_t p0 = start; p0 < end; p0 += KT) {
    const int64_t n = std::min(KT, end - p0);
    const bf16* kt = k + p0 * skn;
    const bf16* vt = v + p0 * svn;
    if (rows)
      rows->step();
    else
      prefetch_rows(k, skn, v, svn, p0 + n, std::min(KT, end - p0 - n), D);
    // S^T = K Q^T, 16 keys at a time
    for (int64_t h = 0; h < KT; h += 16) {
      if (h >= n) {
        std::fill(st + h * 16, st + (h + 16) * 16, 0.f);
        continue;
      }
      const uint16_t* base = reinterpret_cast<const uint16_t*>(kt + h * skn);
      int64_t stride = skn * 2;
      if (h + 16 > n) {  // a partial group: its keys into zero rows
        std::fill(kp, kp + 16 * D, uint16_t(0));
        for (int64_t j = h; j < n; ++j)
          std::memcpy(kp + (j - h) * D, kt + j * skn, D * 2);
        base = kp, stride = D * 2;
      }
      _tile_zero(0);
      for (int64_t c = 0; c < D / 32; ++c) {
        _tile_loadd(1, base + c * 32, stride);
        _tile_loadd(2, qa + c * 512, 64);
        _tile_dpbf16ps(0, 1, 2);
      }
      _tile_stored(0, st + h * 16, 64);
      if (rows) rows->step();
    }
    // S [R][KT] (scaled): the two 16 x 16 halves of S^T transposed; then the online softmax row by row (its
    // pads j >= n), and P [R rows][KT] rounded to bf16 (rows past R stay zero)
    __m512 x[16], y[16];
    for (int j = 0; j < 16; ++j) x[j] = _mm512_loadu_ps(st + j * 16), y[j] = _mm512_loadu_ps(st + (16 + j) * 16);
    transpose16_avx512(x);
    transpose16_avx512(y);
    for (int64_t r = 0; r < R; ++r) {
      _mm512_storeu_ps(sr + r * KT, _mm512_mul_ps(x[r], sc16));
      _mm512_storeu_ps(sr + r * KT + 16, _mm512_mul_ps(y[r], sc16));
    }
    apply_mods_rows(sr, KT, R, n, mods.rank0 + p0, mods);
    softmax_update_rows(sr, n, R, m, l, a16, D);
    for (int64_t r = 0; r < R; ++r)
      _mm512_storeu_si512(pb + r * KT, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(sr + r * KT + 16),
                                                                    _mm512_loadu_ps(sr + r * KT)));
    // V in key pairs: row i = (V[2i][d], V[2i + 1][d]) for d = 0 .. D-1; zero past n
    for (int64_t i = 0; i < KT / 2; ++i) {
      const int64_t j = 2 * i;
      for (int64_t c = 0; c < D; c += 32) {
        const __m512i z = _mm512_setzero_si512();
        const __m512i xv = j < n ? _mm512_loadu_si512(vt + j * svn + c) : z;
        const __m512i yv = j + 1 < n ? _mm512_loadu_si512(vt + (j + 1) * svn + c) : z;
        _mm512_storeu_si512(vb + i * 2 * D + 2 * c, _mm512_permutex2var_epi16(xv, ilo, yv));
        _mm512_storeu_si512(vb + i * 2 * D + 2 * c + 32, _mm512_permutex2var_epi16(xv, ihi, yv));
      }
    }
    if (rows) rows->step();
    // acc += P V, 16 dims at a time
    _tile_loadd(1, pb, KT * 2);
    for (int64_t c = 0; c < D; c += 16) {
      _tile_loadd(0, a16 + c, D * 4);
      _tile_loadd(2, vb + 2 * c, D * 4);
      _tile_dpbf16ps(0, 1, 2);
      _tile_stored(0, a16 + c, D * 4);
    }
  }
  std::copy_n(a16, R * D, acc);
}
#endif

// How a tile's scores are computed, chosen by the cache's type, D, the build and, for fp32, the row
// count; every choice gives a row the same bits whatever R is (so a verification pass of T tokens and T
// one-token steps agree, docs/attention.md "Independent of T"):
// - fp32 (AVX-512, D % 16 == 0): each score one multiply-add chain over d, keys in lanes (kKeys, R <= 8),
//   rows in lanes (the caller's qt: 9..64 rows, D % 64 == 0) or the transposed tile (more rows);
// - bf16 on AVX512_BF16, D % 64 == 0: the bf16 dot product (kDotBf16) at any R;
// - other bf16 / fp16 on AVX-512 with D % 64 == 0: the fp32 dot product, d in lanes (kDot), at any R;
// - otherwise the transposed tile (kTile) at any R.
// Each softmax sums a tile in sum32_tree's order and P V is one multiply-add chain per row over the keys.
enum class TilePath { kKeys, kDotBf16, kDot, kTile };

template <typename T>
constexpr TilePath tile_path(int64_t R, int64_t D, bool qb) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) return R <= kSmallR && D % 16 == 0 ? TilePath::kKeys : TilePath::kTile;
  if (qb) return TilePath::kDotBf16;
  return D % 64 == 0 ? TilePath::kDot : TilePath::kTile;
#else
  (void)R, (void)D, (void)qb;
  return TilePath::kTile;
#endif
}

// Whether a tile on the dot-product paths spreads its prefetch over its rows (steps_per_tile).
inline bool dot_spread(TilePath path, int64_t R) {
  return (path == TilePath::kDotBf16 || path == TilePath::kDot) && R >= kDotSpreadMinR;
}

// RowPrefetch steps per tile (of the item's walk over all KV heads): one before the tile, one per key
// block of the scores, one before P V on the rows-in-lanes path (nv > 0). On the few-rows path (keys:
// TilePath::kKeys, fp32 R <= 8, the decode step's path) one before the tile, one per 16-key group of the
// scores, one before P V and one per kPvKeysPerStep keys of P V (D % 64 == 0: its AVX-512 blocks, per 64
// dims); on the others one before the scores and one before P V.
// On the lanes path the finer spread measured 1.07-1.39x faster than two steps per tile (SmolLM2 layer,
// T = 3-9, 30 caches cycled, one core); steps inside P V, or none after the scores, 0.86-0.93x; no
// software prefetch at all, 0.77-1.03x. On the few-rows path, 8 steps per tile instead of 2 (a burst of
// 128 prefetched lines each at D = 64, Hkv = 3, fp32): 1.10x (SmolLM2's 30 caches cycled, T = 1, one AMD
// EPYC core, median of 5 alternating rounds: B = 4 x 3000 1.52 -> 1.38 ms a layer, B = 1 x 6000 0.74 ->
// 0.67 ms; docs/attention.md, "The decode step's prefetch in eight steps a tile"); 18 steps (also
// per 16 dims of the scores, every 4 keys of P V) gained nothing more; prefetching 2 or 3 chunks ahead
// instead of one, nothing; prefetcht0 or prefetchnta instead of prefetcht1, 0.5x. Without any software
// prefetch this walk reads at 5-6 GB/s: this VM's hardware prefetchers do not follow it. The same spread
// on the bf16 dot-product path (bursts of 64 lines there): 0.95-0.96x at T = 1 and 5. On the dot-product
// paths from kDotSpreadMinR rows on (a verification pass of bf16 / fp16 caches; the decode step keeps two
// steps) one step per kDotRowsPerStep rows of each 16-key group of the scores and, on kDotBf16, one per block
// of P V rows. A pass's tile takes R / 3 times a step's arithmetic, and two bursts of requests left the memory
// idle through most of it. Measured 2026-11-29 (Intel Xeon VM, the previous header and this one alternating,
// median of 4-6 rounds, caches cycled; bitwise the same results): SmolLM2's 30 bf16 caches at 1 x 6000, one
// thread, T = 2-5 1.12-1.30x (T = 3 33.9 -> 28.8 ms), two threads 1.06-1.24x; B = 4 x 3000 1.11-1.20x; fp16
// (kDot, the scores only) 1.10-1.17x; 32/8 heads of 128 at 32K, T = 2-4, 1.21-1.34x. From 4 rows on (a
// decode step of 4 query heads per KV head) it measured within the noise, so the step keeps two.
inline int64_t steps_per_tile(int64_t nv, TilePath path, int64_t D, int64_t R) {
  if (nv) return 2 + KT / lanes_kb(nv);
  if (path == TilePath::kKeys)
    return 2 + (KT + 15) / 16 + (D % 64 == 0 ? D / 64 * ((KT + kPvKeysPerStep - 1) / kPvKeysPerStep) : 0);
  if (dot_spread(path, R))
    return 2 + (KT + 15) / 16 * ((R + kDotRowsPerStep - 1) / kDotRowsPerStep) +
           (path == TilePath::kDotBf16 ? R / 4 + (R % 4 != 0) : 0);
  return 2;
}

// Online softmax over keys [start, end) for all R rows, every key visible to every row; updates m, l (per
// row) and acc [R][D]. start is a multiple of KT in the caller's key ranks (tiles sit at the same ranks in
// every call). qb, scale: the R query rows unscaled in the cache's type, when they are scored with the bf16
// dot product (bf16 caches, D % 64 == 0, AVX512_BF16: bf16_scores), else null.
// qt: the scaled rows transposed (transpose_rows) when lanes_vectors<T>(R, D) > 0 and qb is null: the
// rows-in-lanes path; else null.
template <typename T>
void attend_range(const float* q, int64_t R, int64_t D, const T* k, int64_t skn, const T* v, int64_t svn,
                  int64_t start, int64_t end, float* m, float* l, float* acc, Scratch& sc,
                  RowPrefetch* rows = nullptr, const T* qb = nullptr, float scale = 1.f,
                  const float* qt = nullptr, const uint16_t* qa = nullptr, const ScoreMods& mods = {}) {
#if defined(TRIFORCE_VA_AMX)
  if constexpr (std::is_same_v<T, bf16>)
    if (qa) {  // the tiles (use_tiles): blocks of 16 rows
      for (int64_t r0 = 0; r0 < R; r0 += 16)
        attend_range_amx(qa + r0 / 16 * amx_block_words(D), std::min<int64_t>(16, R - r0), D, k, skn, v, svn,
                         start, end, m + r0, l + r0, acc + r0 * D, sc, rows, scale, mods.rows_from(r0));
      return;
    }
#endif
  float* kt = sc.kt.data();
  float* vt = sc.vt.data();
  float* s = sc.s.data();
  const TilePath path = tile_path<T>(R, D, qb != nullptr);
  for (int64_t p0 = start; p0 < end; p0 += KT) {
    const int64_t n = std::min(KT, end - p0);
    if (rows)
      rows->step();  // this tile's first share of the next chunk's whole rows (the item walks all heads)
    else
      prefetch_rows(k, skn, v, svn, p0 + n, std::min(KT, end - p0 - n), D);  // the next tile, while this one runs
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>)
      if (qt) {
        auto tile = [&](auto nvc) {
          tile_lanes_avx512<decltype(nvc)::value>(qt, R, D, k + p0 * skn, skn, v + p0 * svn, svn, n, m, l, acc, s,
                                                  rows, mods, mods.rank0 + p0);
        };
        switch (lanes_vectors<T>(R, D)) {
          case 1: tile(std::integral_constant<int, 1>{}); break;
          case 2: tile(std::integral_constant<int, 2>{}); break;
          case 3: tile(std::integral_constant<int, 3>{}); break;
          default: tile(std::integral_constant<int, 4>{}); break;
        }
        continue;
      }
#endif
    // Pads and online softmax; softmax_pv then adds P V from the value rows vr (vs apart).
    auto softmax = [&] {
      if (rows) rows->step();  // the second half of this tile's share, between the scores and P V
      apply_mods_rows(s, KT, R, n, mods.rank0 + p0, mods);
      softmax_update_rows(s, n, R, m, l, acc, D);
    };
    auto softmax_pv = [&](const auto* vr, int64_t vs) {
      softmax();
      pv_tile(s, R, n, D, vr, vs, acc);
    };
    switch (path) {
#if defined(__AVX512F__)
      case TilePath::kKeys:
        if constexpr (std::is_same_v<T, float>) {
          scores_keys(q, R, D, k + p0 * skn, skn, n, s, rows);
          softmax();
          pv_tile(s, R, n, D, v + p0 * svn, svn, acc, 0, rows);
        }
        break;
      case TilePath::kDotBf16:
#if defined(__AVX512BF16__)
        if constexpr (std::is_same_v<T, bf16>) {
          RowPrefetch* spread = dot_spread(path, R) ? rows : nullptr;
          scores_dot_avx512(qb, R, D, k + p0 * skn, skn, n, s, scale, spread);
          softmax();
          pv_tile_dpbf16(s, R, n, D, v + p0 * svn, svn, acc, spread);
        }
#endif
        break;
      case TilePath::kDot:  // bf16/fp16 rows read in place, converted 16 at a time in registers
        scores_dot_avx512(q, R, D, k + p0 * skn, skn, n, s, 1.f, dot_spread(path, R) ? rows : nullptr);
        softmax_pv(v + p0 * svn, svn);
        break;
#endif
      default:
        // V still goes to the contiguous tile: the P V blocks read it once per 4 rows, R / 4 times
        load_tile_transposed(k, skn, v, svn, p0, n, D, kt, vt, sc.row.data());
        scores_tile(q, R, D, kt, s);
        softmax_pv(vt, D);
    }
  }
}

// The tiles configured while it lives (on = use_tiles), released after: one per work item.
struct TileScope {
  bool on;
  explicit TileScope(bool on_) : on(on_) {
#if defined(TRIFORCE_VA_AMX)
    if (on) amx_configure();
#endif
  }
  ~TileScope() {
#if defined(TRIFORCE_VA_AMX)
    if (on) _tile_release();
#endif
  }
};

// Whether attend_range runs bf16 caches on the AMX tiles (attend_range_amx; then it also needs the raw
// queries packed: amx_pack_queries).
template <typename T>
inline bool use_tiles(int64_t D) {
#if defined(TRIFORCE_VA_AMX)
  return std::is_same_v<T, bf16> && D % 64 == 0 && amx_enabled();
#else
  (void)D;
  return false;
#endif
}

// Whether attend_range scores bf16 caches with the bf16 dot product (then it needs the raw queries).
template <typename T>
constexpr bool bf16_scores(int64_t D) {
#if defined(__AVX512BF16__)
  return std::is_same_v<T, bf16> && D % 64 == 0;  // the dot path's P V reads bf16 values in place for D % 64 == 0
#else
  (void)D;
  return false;
#endif
}

}  // namespace va

// Most parts the launcher's num_splits may ask for (tests and benchmarks force a count; 0, the library's
// own calls, cuts at fixed ranks instead: kPartKeys).
constexpr int64_t kMaxSplits = 64;

// Keys per part when num_splits is 0: the keys a query sees, in rank order, are cut at multiples of
// kPartKeys, whatever T and L are. Each part is an item's online softmax from a fresh state; the parts are
// then folded left to right. So a query's output depends only on its own keys: a verification pass of T
// tokens gives each row the bits of the one-token step at its position. 512 keys: below that, the
// partials cost more than the parallelism gains.
constexpr int64_t kPartKeys = 512;

// Partial states held at once (bytes): parts beyond this many are computed and folded in waves. A test
// may define TRIFORCE_VA_PARTIAL_BYTES small to run every part in a wave of its own.
#ifndef TRIFORCE_VA_PARTIAL_BYTES
#define TRIFORCE_VA_PARTIAL_BYTES (int64_t(64) << 20)
#endif
constexpr int64_t kPartialBytes = TRIFORCE_VA_PARTIAL_BYTES;

// Whether an item walks all KV heads together: when the heads of one key are interleaved in memory
// (head stride below row stride, for K and V, as in the [B, N, Hkv, D] caches). The item then reads
// whole rows, one chunk of keys after another (RowPrefetch requests the next chunk's rows while it
// computes this one), instead of one head's slice of every row per pass: a strided stream that the
// hardware prefetchers follow badly (a new page every row or two at Hkv = 8, D = 128 fp32) and whose
// neighbouring lines are fetched and dropped. Measured on one core, cold caches, fp32, against walking
// head by head with the next tile prefetched: Hkv = 3, D = 64 (SmolLM2), T = 1: 1.38x at 1000 keys,
// 1.48x at 3000, 1.41x at B = 4 x 3000; T = 5: 1.23x; Hkv = 2 (Qwen2.5-0.5B) at 8192 keys: 1.37x;
// Hkv = 8, D = 128 (already walked together before, with per-head prefetch): equal at T = 1, 1.1x at T = 4.
inline bool verify_attention_groups_heads(int64_t Hkv, int64_t skn, int64_t skh, int64_t svn, int64_t svh) {
  return Hkv > 1 && skh < skn && svh < svn;
}

// q: [B, T, Hq, D] with strides (sqb, sqt, sqh, 1); k/v: [B, N, Hkv, D] with strides (s*b, s*n, s*h, 1);
// cache_seqlens int32 [B]; tree_mask bool [B, T, T] contiguous or null (causal); out contiguous
// [B, T, Hq, D]; lse contiguous float [B, Hq, T]. num_splits: 0 cuts each query's keys at multiples of
// kPartKeys ranks (the result is independent of T); 1..kMaxSplits cuts the longest prefix into that many
// parts instead (tests and benchmarks). query_lens (int32 [B], or null: every row's Tq): row b computes its
// first query_lens[b] queries only (clamped to [0, Tq]; a ragged step's real tokens: its others are padding),
// each bitwise as with every query computed; the others' out is 0 and lse -inf.
//
// A query's keys, in rank order: the prefix [0, P) (P = L - T), then the new tokens it sees, in index
// order; so rank = position in the cache for a causal query, and for a tree node its ancestors take ranks
// P, P + 1, ... as they will once its path is committed. Work item = (b, run of consecutive parts),
// walking all KV heads in chunks of kHeadChunk keys when the heads of a key are interleaved in memory
// (verify_attention_groups_heads), else (b, KV head h, run). In each part, an item reads the prefix keys
// below P rounded down to KT once, in tiles of KT, for all R = T * g query rows of the GQA group
// (flash-decoding: T = 1, g = 4 reads each key once for 4 rows); the rest (up to 31 prefix keys and the
// new tokens) it walks query by query, each over exactly the keys that query sees: in place when they are
// consecutive in the cache (causal), else from a copy of those rows (tree). So no tile holds a key that a
// row of it may not see, and a value it may not see is never read (an inf/NaN there cannot reach the
// output). Only positions in [0, min(L, N)) are ever read, whatever L.
template <typename T>
void verify_attention_cpu(const T* q, int64_t sqb, int64_t sqt, int64_t sqh, const T* k, int64_t skb,
                          int64_t skn, int64_t skh, const T* v, int64_t svb, int64_t svn, int64_t svh,
                          const int32_t* cache_seqlens, const bool* tree_mask, float scale, int64_t B,
                          int64_t Tq, int64_t Hq, int64_t Hkv, int64_t D, int64_t N, int64_t num_splits,
                          T* out, float* lse, const int32_t* query_lens = nullptr, int64_t window = 0,
                          float softcap = 0.f, const int32_t* cache_leftpad = nullptr,
                          const float* alibi_slopes = nullptr, int64_t alibi_stride_b = 0) {
  const int64_t g = Hq / Hkv, R = Tq * g;
  auto rows_of = [&](int64_t b) {  // the query rows row b computes
    return query_lens ? std::clamp<int64_t>(query_lens[b], 0, Tq) * g : R;
  };
  auto clamp_len = [&](int64_t b) { return std::min<int64_t>(std::max<int64_t>(cache_seqlens[b], 0), N); };
  auto prefix_of = [&](int64_t b) {
    return std::min<int64_t>(std::max<int64_t>(cache_seqlens[b] - Tq, 0), clamp_len(b));
  };
  // row b's first rank: its left padding, clamped to [0, prefix]
  auto start_of = [&](int64_t b) {
    return cache_leftpad ? std::clamp<int64_t>(cache_leftpad[b], 0, prefix_of(b)) : int64_t{0};
  };
  // A sliding window keeps a query's last `window` ranks from the row's start (0: none); every query sees at
  // least its prefix's ranks, so none sees a rank below max(start, prefix - window): the parts below the lowest
  // such rank hold nothing.
  int64_t max_len = 0, max_prefix = 0, keys = 0, first_rank = std::numeric_limits<int64_t>::max();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t Lc = clamp_len(b), prefix_b = prefix_of(b), start_b = start_of(b);
    max_len = std::max(max_len, Lc);
    max_prefix = std::max(max_prefix, prefix_b);
    keys += window > 0 ? std::min<int64_t>(Lc - start_b, window + Tq) : Lc - start_b;
    first_rank = std::min<int64_t>(first_rank, std::max<int64_t>(window > 0 ? prefix_b - window : 0, start_b));
  }
  int64_t Z = kPartKeys;
  if (num_splits > 0) {  // forced: the longest prefix in that many parts (of whole tiles)
    const int64_t S = std::min(num_splits, kMaxSplits);
    Z = std::max<int64_t>(va::KT, ((max_prefix + S - 1) / S + va::KT - 1) / va::KT * va::KT);
  }
  const int64_t parts = std::max<int64_t>(1, (max_len + Z - 1) / Z);
  const int64_t first_part = std::min(parts - 1, first_rank / Z);
  // Heads interleaved in a cache row (the [B, N, Hkv, D] layout): one item walks all KV heads over the
  // same keys, kHeadChunk keys at a time, so what it reads in a chunk is one contiguous block instead of
  // one row per page per head (verify_attention_groups_heads).
  const bool grouped = verify_attention_groups_heads(Hkv, skn, skh, svn, svh);
  const int64_t HG = grouped ? Hkv : 1;  // KV heads per item
  const int64_t rows_all = B * Hkv * R;  // (b, h, r) rows of the fold
  const int64_t wave =
      std::max<int64_t>(1, std::min<int64_t>(parts - first_part, kPartialBytes / (rows_all * (D + 2) * 4)));
  // The fold's state per (b, h, r) and the wave's partials per (b, h, part, r): running max m, sum l,
  // unnormalised acc [D], all fp32.
  std::vector<float> fm(rows_all, va::kNegInf), fl(rows_all, 0.f), facc(rows_all * D, 0.f);
  // Uninitialised: every item writes the slots of its own parts before anything reads them.
  std::unique_ptr<float[]> pm(new float[rows_all * wave]), pl(new float[rows_all * wave]);
  std::unique_ptr<float[]> pacc(new float[rows_all * wave * D]);
  // Parallel only if the keys read (and, from a few query rows per KV head on, the multiply-adds) are
  // worth a worker's wake-up (parallel_min_bytes), or a hand-off inside a forward's team (team.h); else the
  // calling thread runs every item.
  const bool par = worth_parallel_here(keys * Hkv * D * std::max<int64_t>(2 * sizeof(T), 2 * R));
  const bool raw = va::bf16_scores<T>(D);
  const bool tiles = va::use_tiles<T>(D);  // (implies raw)
  const int64_t tile_words = tiles ? va::amx_block_words(D) : 0;  // per 16-row block of packed queries
  // Items: runs of consecutive parts (enough for 2 per thread), each walked by one thread as one stream of
  // keys (the prefetch runs on across its parts), each part from a fresh softmax state.
  const int64_t units = B * (Hkv / HG);
  const int threads = parallel_threads(par);
  const int64_t want_runs = std::max<int64_t>(1, (2 * threads + units - 1) / units);
  // the rows-in-lanes path's vectors: per item by its rows; lanes_cap, the most any item takes (its scratch)
  int64_t lanes_cap = va::lanes_vectors<T>(R, D);
  if (query_lens)
    for (int64_t b = 0; b < B; ++b) lanes_cap = std::max(lanes_cap, va::lanes_vectors<T>(rows_of(b), D));
  const int64_t lanes_g = va::lanes_vectors<T>(g, D);
  struct ItemScratch {  // one thread's, made at its first item
    va::Scratch sc;
    std::vector<float> qall;  // the scaled fp32 queries of the item's heads
    std::vector<T> qraw;      // and unscaled in the cache's type (va::bf16_scores)
    std::vector<float> qt;    // the R rows transposed for the rows-in-lanes path
    std::vector<float> qtg;   // one query's g rows transposed
    std::vector<int64_t> pos;  // one query's new-token positions
    std::vector<int64_t> seen, lo;  // each query's ranks: [lo[t], seen[t])
    std::vector<float> slope;       // ALiBi: each row's slope, per head of the item ([HG][R])
    std::vector<int64_t> qlast;     // and its query's last rank ([R])
    std::vector<T> kc, vc;     // one query's keys and values when not consecutive
    std::vector<uint16_t> qa, qag;  // the tiles' packed queries: the R rows of each head, one query's g rows
    ItemScratch(int64_t R, int64_t D, int64_t HG, bool raw, int64_t lanes_nv, int64_t lanes_g, int64_t tile_words)
        : sc(R, D, tile_words > 0), qall(HG * R * D), qraw(raw ? HG * R * D : 0), qt(HG * D * 16 * lanes_nv),
          qtg(D * 16 * lanes_g), qa(HG * ((R + 15) / 16) * tile_words), qag((R + 15) / 16 * tile_words) {}
  };
  std::vector<std::unique_ptr<ItemScratch>> scratch(threads);
  for (int64_t w0 = first_part; w0 < parts; w0 += wave) {
    const int64_t nw = std::min(wave, parts - w0);
    const int64_t runs = std::min(nw, want_runs);
    const int64_t items = units * runs;
    parallel_items(par, items, [&](int tid, int64_t it) {
        std::unique_ptr<ItemScratch>& mine = scratch[tid];
        if (!mine) mine = std::make_unique<ItemScratch>(R, D, HG, raw, lanes_cap, lanes_g, tile_words);
        const va::TileScope tile_scope(tiles);
        va::Scratch& sc = mine->sc;
        std::vector<float>& qall = mine->qall;
        std::vector<T>& qraw = mine->qraw;
        std::vector<float>& qt = mine->qt;
        std::vector<float>& qtg = mine->qtg;
        std::vector<int64_t>& pos = mine->pos;
        std::vector<T>& kc = mine->kc;
        std::vector<T>& vc = mine->vc;
        const int64_t b = it / ((Hkv / HG) * runs), h0 = (it / runs) % (Hkv / HG) * HG, run = it % runs;
        const int64_t Rb = rows_of(b), Tb = Rb / g;  // this row's query rows (R but for a ragged step's)
        const int64_t lanes_nv = va::lanes_vectors<T>(Rb, D);
        const int64_t part_lo = w0 + run * nw / runs, part_hi = w0 + (run + 1) * nw / runs;
        // Clamp so that nothing outside [0, min(L, N)) is read even for out-of-range lengths.
        const int64_t L = cache_seqlens[b], Lc = clamp_len(b);
        const int64_t new0 = L - Tq;  // position of new token 0 (may be < 0 for bad L)
        const int64_t prefix = std::min<int64_t>(std::max<int64_t>(new0, 0), Lc);
        // query t's new-token positions, in index order (its ranks from prefix on)
        auto new_positions = [&](int64_t t) {
          const bool* vis = tree_mask ? tree_mask + (b * Tq + t) * Tq : nullptr;
          pos.clear();
          for (int64_t si = 0; si < Tq; ++si) {
            const int64_t p = new0 + si;
            if ((vis ? vis[si] : si <= t) && p >= prefix && p < Lc) pos.push_back(p);
          }
        };
        // Each query's ranks [lo[t], seen[t]): its last `window` from the row's start (all from there without
        // one). Tiles every row sees whole: [tiles_begin, tiles_end), the lowest rank all rows see rounded up to
        // KT, up to the prefix rounded down to KT.
        std::vector<int64_t>& seen = mine->seen;
        std::vector<int64_t>& lo = mine->lo;
        const int64_t start = start_of(b);
        seen.assign(Tb, prefix);
        lo.assign(Tb, start);
        int64_t lo_max = start;
        for (int64_t t = 0; t < Tb; ++t) {
          if (window > 0 || alibi_slopes) {
            new_positions(t);
            seen[t] += static_cast<int64_t>(pos.size());
          }
          if (window > 0) lo[t] = std::max<int64_t>(seen[t] - window, start);
          lo_max = std::max(lo_max, lo[t]);
        }
        va::ScoreMods mods{softcap};
        if (alibi_slopes) {
          std::vector<float>& sl = mine->slope;
          std::vector<int64_t>& ql = mine->qlast;
          sl.resize(HG * R);
          ql.resize(R);
          for (int64_t r = 0; r < Rb; ++r) {
            ql[r] = seen[r / g] - 1;
            for (int64_t hh = 0; hh < HG; ++hh) sl[hh * R + r] = alibi_slopes[b * alibi_stride_b + (h0 + hh) * g + r % g];
          }
          mods.slope = sl.data(), mods.qlast = ql.data();
        }
        // the mods of head h0 + hh's rows r0.., keys at ranks rank0 + ...
        auto mods_of = [&](int64_t hh, int64_t r0, int64_t rank0) {
          va::ScoreMods m = mods.rows_from(r0);
          if (m.slope) m.slope += hh * R;
          m.rank0 = rank0;
          return m;
        };
        const int64_t tiles_begin = (lo_max + va::KT - 1) / va::KT * va::KT;
        const int64_t tiles_end = std::max(tiles_begin, prefix / va::KT * va::KT);
        const int64_t run_shared_end = std::min({part_hi * Z, Lc, tiles_end});
        const int64_t qa_head = (R + 15) / 16 * tile_words;  // the tiles' packed words per head
        for (int64_t hh = 0; hh < HG; ++hh) {
          float* q32 = qall.data() + hh * R * D;
          for (int64_t t = 0; t < Tb; ++t)
            for (int64_t j = 0; j < g; ++j) {
              float* dst = q32 + (t * g + j) * D;
              const T* src = q + b * sqb + t * sqt + ((h0 + hh) * g + j) * sqh;
              va::load_row(src, dst, D);
              for (int64_t d = 0; d < D; ++d) dst[d] *= scale;
              if (raw) std::copy(src, src + D, qraw.data() + (hh * R + t * g + j) * D);
            }
          if (lanes_nv) va::transpose_rows(q32, Rb, D, lanes_nv, qt.data() + hh * D * 16 * lanes_cap);
#if defined(TRIFORCE_VA_AMX)
          if constexpr (std::is_same_v<T, bf16>)
            if (tiles) va::amx_pack_queries(qraw.data() + hh * R * D, Rb, D, mine->qa.data() + hh * qa_head);
#endif
        }
        va::RowPrefetch rows;
        const int64_t row_bytes = (std::max(skh, svh) * (Hkv - 1) + D) * int64_t(sizeof(T));  // one key's heads
        const int64_t steps_per_tile =
            tiles ? 4 * ((Rb + 15) / 16) : va::steps_per_tile(lanes_nv, va::tile_path<T>(Rb, D, raw), D, Rb);
        for (int64_t part = part_lo; part < part_hi; ++part) {
          auto state = [&](int64_t hh, int64_t r0) {  // (m, l, acc) of rows r0.. of head h0 + hh in this part
            const int64_t base = ((b * Hkv + h0 + hh) * nw + (part - w0)) * R + r0;
            return std::make_tuple(pm.get() + base, pl.get() + base, pacc.get() + base * D);
          };
          for (int64_t hh = 0; hh < HG; ++hh) {  // an empty partial unless a key below sets it
            auto [m, l, acc] = state(hh, 0);
            std::fill(m, m + R, va::kNegInf);
            std::fill(l, l + R, 0.f);
            std::fill(acc, acc + R * D, 0.f);
          }
          const int64_t a = part * Z, e = std::min((part + 1) * Z, Lc);
          if (a >= e || Rb == 0) continue;
          // Query t walks its ranks [max(a, x), min(e, y, its last)) alone, over exactly the keys it sees, in
          // tiles at multiples of KT (a rank that is not one starts a short tile up to the next): in place
          // when the keys are consecutive in the cache, else from a copy of their rows.
          auto walk = [&](int64_t t, int64_t x, int64_t y) {
            new_positions(t);
            x = std::max(a, x);
            y = std::min({e, y, prefix + static_cast<int64_t>(pos.size())});
            auto at = [&](int64_t r) { return r < prefix ? r : pos[r - prefix]; };  // rank -> position
            for (int64_t r0 = x, r1; r0 < y; r0 = r1) {
              r1 = r0 % va::KT ? std::min(y, (r0 / va::KT + 1) * va::KT) : y;
              const int64_t n = r1 - r0;
              const bool in_place = at(r1 - 1) - at(r0) == n - 1;  // consecutive (ranks are increasing)
              if (!in_place) {  // copy the rows this query sees, all HG heads of each
                kc.resize(n * HG * D);
                vc.resize(n * HG * D);
                for (int64_t i = 0; i < n; ++i)
                  for (int64_t hh = 0; hh < HG; ++hh) {
                    const int64_t p = at(r0 + i);
                    std::copy_n(k + b * skb + p * skn + (h0 + hh) * skh, D, kc.data() + (i * HG + hh) * D);
                    std::copy_n(v + b * svb + p * svn + (h0 + hh) * svh, D, vc.data() + (i * HG + hh) * D);
                  }
              }
              for (int64_t hh = 0; hh < HG; ++hh) {
                const float* qg = qall.data() + (hh * R + t * g) * D;
                if (lanes_g) va::transpose_rows(qg, g, D, lanes_g, qtg.data());
#if defined(TRIFORCE_VA_AMX)
                if constexpr (std::is_same_v<T, bf16>)
                  if (tiles) va::amx_pack_queries(qraw.data() + (hh * R + t * g) * D, g, D, mine->qag.data());
#endif
                auto [m, l, acc] = state(hh, t * g);
                const T* kp = in_place ? k + b * skb + at(r0) * skn + (h0 + hh) * skh : kc.data() + hh * D;
                const T* vp = in_place ? v + b * svb + at(r0) * svn + (h0 + hh) * svh : vc.data() + hh * D;
                va::attend_range(qg, g, D, kp, in_place ? skn : HG * D, vp, in_place ? svn : HG * D, 0, n, m, l,
                                 acc, sc, nullptr, raw ? qraw.data() + (hh * R + t * g) * D : nullptr, scale,
                                 lanes_g ? qtg.data() : nullptr, tiles ? mine->qag.data() : nullptr,
                                 mods_of(hh, t * g, r0));
              }
            }
          };
          // In rank order, for every row: its ranks below the shared tiles (a window's start), the shared
          // tiles [shared_begin, shared_end), then the rest (up to KT - 1 prefix keys and the new tokens).
          const int64_t shared_begin = std::max(a, tiles_begin), shared_end = std::min(e, tiles_end);
          if (shared_begin >= shared_end) {  // no shared tile in this part: every row alone
            for (int64_t t = 0; t < Tb; ++t) walk(t, lo[t], e);
            continue;
          }
          if (shared_begin > a)
            for (int64_t t = 0; t < Tb; ++t) walk(t, lo[t], shared_begin);
          // The shared tiles: all R rows. The online softmax state of each (b, h, part) lives in pm/pl/pacc, so
          // the range may be walked in chunks, head by head within each chunk.
          const int64_t step = grouped ? va::kHeadChunk : shared_end - shared_begin;
          for (int64_t c0 = shared_begin; c0 < shared_end; c0 += step) {
            const int64_t c1 = std::min(shared_end, c0 + step);
            if (grouped)  // the next chunk's rows (in this part or the run's next), spread over this chunk's tiles
              rows.reset(reinterpret_cast<const char*>(k + b * skb + c1 * skn), skn * int64_t(sizeof(T)),
                         reinterpret_cast<const char*>(v + b * svb + c1 * svn), svn * int64_t(sizeof(T)), row_bytes,
                         std::max<int64_t>(0, std::min(run_shared_end, c1 + step) - c1),
                         steps_per_tile * HG * ((c1 - c0 + va::KT - 1) / va::KT));
            for (int64_t hh = 0; hh < HG; ++hh) {
              auto [m, l, acc] = state(hh, 0);
              va::attend_range(qall.data() + hh * R * D, Rb, D, k + b * skb + (h0 + hh) * skh, skn,
                               v + b * svb + (h0 + hh) * svh, svn, c0, c1, m, l, acc, sc, grouped ? &rows : nullptr,
                               raw ? qraw.data() + hh * R * D : nullptr, scale,
                               lanes_nv ? qt.data() + hh * D * 16 * lanes_cap : nullptr,
                               tiles ? mine->qa.data() + hh * qa_head : nullptr, mods_of(hh, 0, 0));
            }
          }
          if (shared_end < e)
            for (int64_t t = 0; t < Tb; ++t) walk(t, shared_end, e);
        }
    });
    // Fold the wave's parts into the state, left to right: for each row, the same sequence of operations
    // on the same partials, whoever computed them. After the last wave: out = acc / l, lse = m + log l.
    const bool last = w0 + nw == parts;
    parallel_ranges(par, rows_all, 16, [&](int64_t row0, int64_t row1) {
      for (int64_t row = row0; row < row1; ++row) {
        const int64_t bh = row / R, r = row % R;
        float& m = fm[row];
        float& l = fl[row];
        float* acc = facc.data() + row * D;
        for (int64_t s = 0; s < nw; ++s) {
          const int64_t p = (bh * nw + s) * R + r;
          const float mp = pm[p];
          if (mp == va::kNegInf) continue;  // the part holds none of this row's keys
          const float* ap = pacc.get() + p * D;
          if (m == va::kNegInf) {
            m = mp, l = pl[p];
            std::copy_n(ap, D, acc);
            continue;
          }
          const float M = std::max(m, mp), wa = std::exp(m - M), wp = std::exp(mp - M);
          l = l * wa + pl[p] * wp;
          for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * wa + ap[d] * wp;
          m = M;
        }
        if (!last) continue;
        const int64_t b = bh / Hkv, h = bh % Hkv, t = r / g, hq = h * g + r % g;
        T* o = out + ((b * Tq + t) * Hq + hq) * D;
        float* ls = lse + (b * Hq + hq) * Tq + t;
        if (m == va::kNegInf) {  // the row sees nothing
          for (int64_t d = 0; d < D; ++d) o[d] = from_float<T>(0.f);
          *ls = va::kNegInf;
          continue;
        }
        const float inv = 1.f / l;
        for (int64_t d = 0; d < D; ++d) o[d] = from_float<T>(acc[d] * inv);
        *ls = m + std::log(l);
      }
    });
  }
}

}  // namespace triforce
