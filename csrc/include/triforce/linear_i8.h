// rowwise_linear_i8 on the CPU: out = x @ w^T with GGUF weight blocks and x rounded to int8 blocks, the
// products summed as integers: llama.cpp's class of arithmetic (it dots Q4_1 with Q8_1 and Q8_0 with Q8_0
// blocks of x), here with its own exact definition (below), bitwise the same on every path and for every
// row count. Twelve packed forms hold GGUF's types exactly (triforce/models/quant.py maps them):
//   Q4_1    4-bit codes, w = d * code + m per 32 weights: GGUF Q4_1 (float16 d, m), Q4_0 (m = -8 d), Q4_K
//           (float32 d = d * sc, m = -dmin * mn of each 32-weight sub-block, both exact in float32);
//   Q5_1    5-bit codes, w = d * code + m per 32: GGUF Q5_1 (float16 d, m), Q5_0 (m = -16 d), Q5_K (as Q4_K);
//   Q8_0    int8 codes, w = d * code per 32: GGUF Q8_0 (and Q4_0 / Q5_0 with codes q - 8 / q - 16 where -8 d /
//           -16 d would overflow float16), float16 d;
//   Q8_0_16 int8 codes, w = d * code per 16: GGUF Q6_K as code = q - 32, float32 d = d * sc (exact) (and Q3_K
//           with code in -4..3, float32 d * (sc - 32), where its smaller form Q3_16 is not used);
//   IQ4_NL  4-bit indices into kIq4Values (GGUF's non-linear 16-value grid), w = d * kIq4Values[index] per 32:
//           GGUF IQ4_NL (float16 d), IQ4_XS (float32 d * (ls - 32) of each 32-weight sub-block, exact);
//   Q6_16   6-bit codes u, w = d * (u - 32) per 16: GGUF Q6_K at its own 6 bits (Q8_0_16's arithmetic);
//   Q4_1_16 4-bit codes, w = d * code + m per 16 weights;
//   Q2_16   2-bit codes, w = d * code + m per 16 weights (Q4_1_16's arithmetic): GGUF Q2_K (float32 d * sc and
//           -(dmin * mn) of each 16-weight sub-block, exact);
//   Q3_16   3-bit codes u, w = d * (u - 4) per 16 (Q8_0_16's arithmetic): GGUF Q3_K at its own 3 bits (u = its
//           code + 4, float32 d * (sc - 32) of each 16-weight sub-block, exact);
//   MXFP4   4-bit indices into kMxfp4Values (FP4 E2M1's 16 values, doubled: integers), w = d * kMxfp4Values[index]
//           per 32 with d = 2^(e - 128) from the block's E8M0 exponent byte e (the value's half, as ggml's
//           e8m0_to_fp32_half): GGUF MXFP4 (gpt-oss's experts), OpenAI's MXFP4 checkpoints; IQ4_NL's arithmetic;
//   GRID    4-bit indices into the tensor's own grid of 16 int8 values (stored with the codes), w = d * grid[index]
//           per 32: weights of at most 16 integer values times a block scale (GGUF IQ2_XXS, IQ3_XXS, IQ3_S,
//           IQ1_S); IQ4_NL's arithmetic;
//   GRID_16 the same with a scale per 16 (GGUF IQ2_XS, IQ2_S, IQ1_M); Q8_0_16's arithmetic.
// Torch-free; csrc/cpu/linear.cpp wraps it for ATen, triforce/models/quant.py (Int8DotLinear, gguf_i8_blocks,
// gguf_copy(..., activations="int8")) holds the PyTorch reference and the packing.
//
// Why: a float32 product on dequantised 4-bit weights (rowwise_linear_q4_1) spends its time dequantising
// at one row (0.40 of the copy bandwidth on a Zen 4 core) and on fp32 multiply-adds from four rows on, so
// a pass that verifies several tokens costs several decode steps. One vpdpbusd multiplies 64 byte pairs
// and sums them in fp32-free int32 lanes: 4x the multiply-adds of an fp32 FMA, and the 4-bit codes need
// an AND and a shift, not a float conversion.
//
// The arithmetic, per output (m, n), for the K / 32 blocks b of 32 weights, in increasing b:
//   x block: amax = max |x[m, 32b + i]|, dx = amax / 127 (float32),
//            q_i = round_half_even(x_i / dx) clamped to [-127, 127] (all 0 when dx is 0; a division, not a
//            product with 1 / dx, which overflows for a subnormal dx), dx NaN when the block holds inf or NaN,
//            sx = sum_i q_i (int), sm = dx * float(sx)
//   Q4_1:    isum = sum_i code_i * q_i (exact int32), term = (d * dx) * float(isum) + m * sm
//   Q5_1:    as Q4_1
//   Q8_0:    isum = sum_i w_i * q_i (exact int32),    term = (d * dx) * float(isum)
//   IQ4_NL:  as Q8_0, w_i = kIq4Values[index_i]
//   MXFP4:   as Q8_0, w_i = kMxfp4Values[index_i], d = 2^(e - 128)
//   GRID:    as Q8_0, w_i = grid[index_i]; GRID_16: as Q8_0_16, w_i = grid[index_i]
//   Q6_16:   as Q8_0_16, w_i = u_i - 32 (the sums of u_i * q_i corrected by -32 * the half's sum of q)
//   Q3_16:   as Q8_0_16, w_i = u_i - 4 (likewise corrected by -4 * the half's sum of q)
//   Q4_1_16, Q2_16: isum_h = sum_{i in half h} code_i * q_i, sx_h = the half's sum of q_i,
//            term = (d_0 * dx) * float(isum_0) + (d_1 * dx) * float(isum_1) + m_0 * (dx * float(sx_0))
//                   + m_1 * (dx * float(sx_1)), added left to right
//   Q8_0_16: isum_h = sum_{i in half h} w_i * q_i (the -128 shift corrected per half),
//            term = (d_0 * dx) * float(isum_0) + (d_1 * dx) * float(isum_1)
//            (d_h: the scale of weights 16h .. 16h + 15 of the block)
//   acc = acc + term (acc starts at 0.0f), each operation rounded to float32 on its own (no FMA).
// Every float operation is per output and in a fixed order, the integer sums are exact: the result of
// (m, n) depends on x[m] and w[n] only, whatever M, the thread count or the path (AMX tiles, AVX-512 VNNI or
// the portable loop). A block of x holding inf or NaN makes the outputs NaN (dx * 0).
//
// Packed layout (for 16 output rows n = 16g .. 16g + 15, "a group"; N % 16 == 0, K % 32 == 0):
//   codes [N / 16, K / 32 * CB] uint8, per block b of group g CB bytes, in 64-byte vectors t, byte
//         4j + i of vector t holding row 16g + j:
//           Q4_1 (CB 256, t < 4): the low nibble code k = 4t + i, the high nibble code k = 16 + 4t + i;
//           Q5_1 (CB 320): Q4_1's 256 bytes of the codes' low four bits, then 8 little-endian 64-bit masks v,
//                          bit 4j + i of mask v the fifth bit of code k = 4v + i of row 16g + j;
//           Q8_0 (CB 512, t < 8): w[k = 4t + i] + 128 (int8 weights shifted to unsigned for vpdpbusd,
//                                 isum corrected by -128 * sx, exactly);
//           Q8_0_16: as Q8_0;
//           IQ4_NL (CB 256): Q4_1's nibbles, each an index; the kernel looks the index up (vpshufb) in the
//                            table shifted to unsigned, kIq4Values + 128, and corrects isum by -128 * sx as Q8_0;
//           MXFP4 (CB 256): IQ4_NL's, with kMxfp4Values;
//           GRID, GRID_16 (CB 256): IQ4_NL's, and after each group's K / 32 blocks its grid's 16 values + 128
//                           (the same in every group: a row of codes is K / 32 * 256 + 16 bytes);
//           Q6_16 (CB 384): Q5_1's 320 bytes for the codes' low five bits, then 8 masks of their sixth bits
//                           (as the fifth's);
//           Q4_1_16 (CB 256): Q4_1's;
//           Q2_16 (CB 128): 2 vectors u; bits 2s, 2s + 1 of byte 4j + i of vector u: code k = 4 (2s + u) + i;
//           Q3_16 (CB 192): Q2_16's 128 bytes for the codes' low two bits, then 8 masks of their third bits (as
//                           Q5_1's fifth);
//   scales [N / 16, K / 32 * SB] float16 or float32 (one dtype per tensor), per block: Q4_1, Q5_1 (SB 32) d
//          of the 16 rows then m of the 16 rows; Q8_0, IQ4_NL and GRID (SB 16) d of the 16 rows; Q8_0_16 (SB 32)
//          d_0 of the 16 rows then d_1 of the 16 rows (Q6_16, Q3_16 and GRID_16 as Q8_0_16); Q4_1_16 and Q2_16
//          (SB 64) d_0, d_1, m_0, m_1 of the 16 rows. Or, for K % 256 == 0, uint8 [N / 16, K / 256 * SUPER]: per
//          super-block of 8 blocks float16 bases and int8 multipliers (SuperScale, below; SUPER = 320 for Q4_1 and
//          Q5_1, 288 for Q8_0_16, Q6_16 and Q3_16, 160 for Q8_0 and IQ4_NL, 576 for Q4_1_16 and Q2_16; not the grid
//          forms). MXFP4: uint8 [N / 16, K / 32 * 16], per block the E8M0 exponent bytes e of the 16 rows
//          (E8M0Scale, below; any K % 32 == 0).
// Lane j of one vpdpbusd holds row j: four consecutive k of it against the same four bytes of x
// (broadcast), so a group's 16 outputs stay in one register and need no horizontal sums.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "triforce/common.h"

namespace triforce {
namespace linear_i8 {

constexpr int64_t kBlock = 32;  // weights per block (x and w alike)
constexpr int64_t kGroup = 16;  // output rows per group (one zmm of fp32 lanes)
constexpr int64_t kRows = 4;    // x rows per register block

enum class Format { Q4_1, Q5_1, Q8_0, Q8_0_16, IQ4_NL, Q6_16, Q4_1_16, Q2_16, Q3_16, MXFP4, GRID, GRID_16 };

// GGUF's IQ4_NL grid (ggml's kvalues_iq4nl): the weight of index i is d * kIq4Values[i].
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// FP4 E2M1's values doubled (ggml's kvalues_mxfp4): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, times 2.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
struct GridTable {
  uint8_t v[16];
};
constexpr GridTable grid_unsigned(const int8_t (&values)[16]) {  // values + 128: the unsigned operand of vpdpbusd
  GridTable t{};
  for (int i = 0; i < 16; ++i) t.v[i] = static_cast<uint8_t>(values[i] + 128);
  return t;
}
inline constexpr GridTable kIq4Unsigned = grid_unsigned(kIq4Values), kMxfp4Unsigned = grid_unsigned(kMxfp4Values);

// GRID, GRID_16: the table is the tensor's own, 16 bytes (values + 128) after each group's codes
template <Format F>
constexpr bool runtime_grid() { return F == Format::GRID || F == Format::GRID_16; }
template <Format F>
constexpr bool grid() {  // 4-bit indices into a table
  return F == Format::IQ4_NL || F == Format::MXFP4 || runtime_grid<F>();
}
template <Format F>
constexpr const GridTable& grid_table() { return F == Format::MXFP4 ? kMxfp4Unsigned : kIq4Unsigned; }

template <Format F>
constexpr bool nibbles() {  // Q4_1's layout (and then fifth / sixth bits)
  return F == Format::Q4_1 || F == Format::Q5_1 || grid<F>() || F == Format::Q6_16 || F == Format::Q4_1_16;
}
template <Format F>
constexpr bool fifth_bits() { return F == Format::Q5_1 || F == Format::Q6_16; }
template <Format F>
constexpr bool with_min() {  // codes 0..31 and a minimum m
  return F == Format::Q4_1 || F == Format::Q5_1 || F == Format::Q4_1_16 || F == Format::Q2_16;
}
template <Format F>
constexpr bool halves() {  // a scale (and minimum) per 16 weights
  return F == Format::Q8_0_16 || F == Format::Q6_16 || F == Format::Q4_1_16 || F == Format::Q2_16 ||
         F == Format::Q3_16 || F == Format::GRID_16;
}
template <Format F>
constexpr bool two_bits() { return F == Format::Q2_16 || F == Format::Q3_16; }  // Q2_16's layout (and third bits)
template <Format F>
constexpr int32_t code_offset() {  // w = stored code - offset (no minimum)
  return F == Format::Q6_16 ? 32 : F == Format::Q3_16 ? 4 : 128;
}
template <Format F>
constexpr int64_t code_bytes() {  // per block
  return F == Format::Q6_16   ? 384
         : F == Format::Q5_1  ? 320
         : nibbles<F>()       ? 256
         : F == Format::Q3_16 ? 192
         : F == Format::Q2_16 ? 128
                              : 512;
}
// A group's codes: G blocks of code_bytes<F>(), then (GRID, GRID_16) its table of 16 bytes.
template <Format F>
constexpr int64_t group_code_bytes(int64_t G) { return G * code_bytes<F>() + (runtime_grid<F>() ? 16 : 0); }
// The table of a grid form (the values + 128) for the group whose codes start at c (G blocks).
template <Format F>
inline const uint8_t* grid_of(const uint8_t* c, int64_t G) {
  if constexpr (runtime_grid<F>())
    return c + G * code_bytes<F>();
  else
    return grid_table<F>().v;
}
template <Format F>
constexpr int64_t scale_count() {  // per block of a group: 16 per set (d; d_1; m; m_1), in that order
  return with_min<F>() && halves<F>() ? 64 : with_min<F>() || halves<F>() ? 32 : 16;
}
// The set of 16 scales of a block holding the minimum of half h (with_min), or d of half h (h = 0 or 1).
template <Format F>
constexpr int scale_set_m(int h) { return halves<F>() ? 2 + h : 1; }
template <Format F>
constexpr int scale_set_d(int h) { return h; }

// A scale as float32: S = uint16_t holds float16 bits, S = float is itself.
inline float scale_value(uint16_t h) { return to_float(f16{h}); }
inline float scale_value(float v) { return v; }

// The scales' third form, S = SuperScale (one byte each): per super-block of kSuperBlocks blocks (256
// weights, the K-quants' and IQ4_XS's), NB x 16 float16 bases (NB = 2 with a minimum: d's then m's, else 1)
// and then the super-block's 8 blocks' scale_count<F>() int8 multipliers, in the plain layout's order. A
// scale is base * multiplier, a float16 value times an int8, exact in float32: bitwise the float32 scale
// it stands for (the K-quants' d * sc, -(dmin * mn), d * (sc - 32), IQ4_XS's d * (ls - 32)), from 0.04-0.08
// bytes a weight instead of 0.125-0.25.
struct SuperScale {
  uint8_t byte;
};
constexpr int64_t kSuperBlocks = 8;
template <Format F>
constexpr int64_t super_bases() { return with_min<F>() ? 2 : 1; }
template <Format F>
constexpr int64_t super_bytes() { return 32 * super_bases<F>() + kSuperBlocks * scale_count<F>(); }

// One group's scales, read per block b, set k (scale_set_d / scale_set_m: d, then m, or Q8_0_16's d_0, d_1, or
// Q4_1_16's d_0, d_1, m_0, m_1) and lane j. elems(G): a group's scales in units of S.
template <Format F, typename S>
struct GroupScales {
  const S* s;
  static int64_t elems(int64_t G) { return G * scale_count<F>(); }
  float at(int64_t b, int k, int j) const { return scale_value(s[b * scale_count<F>() + 16 * k + j]); }
};
template <Format F>
struct GroupScales<F, SuperScale> {
  const SuperScale* s;
  static int64_t elems(int64_t G) { return G / kSuperBlocks * super_bytes<F>(); }
  const uint8_t* super(int64_t b) const { return &s[b / kSuperBlocks * super_bytes<F>()].byte; }
  const uint8_t* base(int64_t b, int64_t k) const { return super(b) + 32 * k; }
  const uint8_t* mult(int64_t b) const { return super(b) + 32 * super_bases<F>() + b % kSuperBlocks * scale_count<F>(); }
  float value(const uint8_t* base16, const uint8_t* mult8, int j) const {
    uint16_t h;
    std::memcpy(&h, base16 + 2 * j, 2);
    return scale_value(h) * static_cast<float>(static_cast<int8_t>(mult8[j]));
  }
  // set k's base: the m's (the second) for the sets of minimums, else the d's
  static int base_of(int k) { return with_min<F>() && k >= scale_count<F>() / 32 ? 1 : 0; }
  float at(int64_t b, int k, int j) const { return value(base(b, base_of(k)), mult(b) + 16 * k, j); }
};

// MXFP4's scales (one byte each): the E8M0 exponent e of each block and row, d = 2^(e - 128), exact in float32
// for every e (ggml's e8m0_to_fp32_half: e = 0 and 1 the subnormals 2^-128 and 2^-127).
struct E8M0Scale {
  uint8_t byte;
};
inline float e8m0_half(uint8_t e) {
  return __builtin_bit_cast(float, e < 2 ? uint32_t(0x00200000) << e : static_cast<uint32_t>(e - 1) << 23);
}
template <Format F>
struct GroupScales<F, E8M0Scale> {
  const E8M0Scale* s;
  static int64_t elems(int64_t G) { return G * scale_count<F>(); }
  float at(int64_t b, int k, int j) const { return e8m0_half(s[b * scale_count<F>() + 16 * k + j].byte); }
};

// x rounded to int8 blocks: q [M, K] int8, dx [M, K / 32] and sm [M, K / 32] float32, sx [M, K / 32] int32
// (above), sx0 [M, K / 32] int32: the sum of the block's first 16 q_i (Q8_0_16's first half).
// quantize_block rounds one block of a row: with AVX-512 where compiled, the scalar loop's operations on 16
// lanes (the division and the rounding are IEEE's, in the current rounding mode, so the bits are the scalar
// loop's); quantize_block_portable is the scalar loop. quantize_rows rounds every block of x
// (quantize_rows<true>: with the scalar loop).
inline void quantize_block_portable(const float* xb, int8_t* qb, float& dx, float& sm, int32_t& sxs, int32_t& sx0s) {
  float amax = 0.f;
  bool finite = true;
  for (int i = 0; i < kBlock; ++i) {
    finite = finite && std::isfinite(xb[i]);
    amax = std::max(amax, std::fabs(xb[i]));
  }
  const float d = amax / 127.f;
  int sx = 0, sx0 = 0;
  if (finite && d > 0.f) {
    for (int i = 0; i < kBlock; ++i) {
      const float v = std::nearbyint(xb[i] / d);  // the default rounding mode: to nearest, ties to even
      const int qi = static_cast<int>(std::min(127.f, std::max(-127.f, v)));
      qb[i] = static_cast<int8_t>(qi);
      sx += qi;
      if (i == kBlock / 2 - 1) sx0 = sx;
    }
  } else {
    std::memset(qb, 0, kBlock);
  }
  // inf or NaN in the block: dx NaN, so every term of the block (and the outputs) is NaN
  dx = finite ? d : std::numeric_limits<float>::quiet_NaN();
  sm = dx * static_cast<float>(sx);
  sxs = sx;
  sx0s = sx0;
}

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__)
inline void quantize_block(const float* xb, int8_t* qb, float& dx, float& sm, int32_t& sxs, int32_t& sx0s) {
  const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
  // inf or NaN (quiet or signalling), either half
  const __mmask16 bad = _mm512_fpclass_ps_mask(x0, 0x99) | _mm512_fpclass_ps_mask(x1, 0x99);
  if (bad != 0) {  // rare: the scalar loop (dx NaN, codes 0)
    quantize_block_portable(xb, qb, dx, sm, sxs, sx0s);
    return;
  }
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  const float d = amax / 127.f;
  int32_t sx = 0, sx0 = 0;
  if (d > 0.f) {
    const __m512 dv = _mm512_set1_ps(d), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
    auto codes = [&](__m512 x) {  // rounded in the current mode, as nearbyint; then clamped, as the scalar loop
      const __m512 v = _mm512_roundscale_ps(_mm512_div_ps(x, dv), _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
      return _mm512_cvttps_epi32(_mm512_min_ps(hi, _mm512_max_ps(lo, v)));
    };
    const __m512i q0 = codes(x0), q1 = codes(x1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(q1));
    sx0 = _mm512_reduce_add_epi32(q0);
    sx = sx0 + _mm512_reduce_add_epi32(q1);
  } else {
    std::memset(qb, 0, kBlock);
  }
  dx = d;
  sm = d * static_cast<float>(sx);
  sxs = sx;
  sx0s = sx0;
}
#else
inline void quantize_block(const float* xb, int8_t* qb, float& dx, float& sm, int32_t& sxs, int32_t& sx0s) {
  quantize_block_portable(xb, qb, dx, sm, sxs, sx0s);
}
#endif

template <bool Portable = false>
inline void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* dx, float* sm, int32_t* sxs,
                          int32_t* sx0s) {
  const int64_t G = K / kBlock;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < G; ++b) {
      const int64_t i = r * G + b;
      if constexpr (Portable)
        quantize_block_portable(x + r * K + b * kBlock, q + r * K + b * kBlock, dx[i], sm[i], sxs[i], sx0s[i]);
      else
        quantize_block(x + r * K + b * kBlock, q + r * K + b * kBlock, dx[i], sm[i], sxs[i], sx0s[i]);
    }
}

// A float32 value the compiler may not fold into an FMA with the operation that uses it.
#if defined(__x86_64__) || defined(__i386__)
#define TRIFORCE_OPAQUE_FLOAT(v) asm("" : "+x"(v))
#else
#define TRIFORCE_OPAQUE_FLOAT(v) asm("" : "+m"(v))
#endif

// Portable path: the same integer sums and float operations, one output at a time.
template <Format F, typename S>
inline void group_portable(const int8_t* q, const float* dx, const float* sm, const int32_t* sxs, const int32_t* sx0s,
                           int64_t rows, int64_t K, const uint8_t* codes, const S* scales, float* out, int64_t ldo) {
  const int64_t G = K / kBlock;
  const GroupScales<F, S> sc{scales};
  const uint8_t* table = grid_of<F>(codes, G);  // (grid forms)
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < kGroup; ++j) {
      float acc = 0.f;
      for (int64_t b = 0; b < G; ++b) {
        const uint8_t* c = codes + b * code_bytes<F>();
        const int8_t* qb = q + r * K + b * kBlock;
        int32_t isum = 0, isum0 = 0;
        for (int k = 0; k < kBlock; ++k) {
          if (k == kBlock / 2) isum0 = isum;
          int w;
          if constexpr (nibbles<F>()) {
            const int t = (k & 15) >> 2, i = k & 3;
            const uint8_t byte = c[64 * t + 4 * j + i];
            w = k < 16 ? (byte & 15) : (byte >> 4);
            if constexpr (grid<F>()) w = table[w];
            if constexpr (fifth_bits<F>()) {  // bit 4j + i of mask v = k / 4
              const int bit = 4 * j + i;
              w |= ((c[256 + 8 * (k >> 2) + bit / 8] >> (bit % 8)) & 1) << 4;
              if constexpr (F == Format::Q6_16) w |= ((c[320 + 8 * (k >> 2) + bit / 8] >> (bit % 8)) & 1) << 5;
            }
          } else if constexpr (two_bits<F>()) {  // bits 2s.. of byte 4j + i of vector u: code 4 (2s + u) + i
            const int v = k >> 2;
            w = (c[64 * (v & 1) + 4 * j + (k & 3)] >> (2 * (v >> 1))) & 3;
            if constexpr (F == Format::Q3_16) {  // the third bit: bit 4j + i of mask v
              const int bit = 4 * j + (k & 3);
              w |= ((c[128 + 8 * v + bit / 8] >> (bit % 8)) & 1) << 2;
            }
          } else {
            w = int(c[64 * (k >> 2) + 4 * j + (k & 3)]);
          }
          isum += w * qb[k];
        }
        const int64_t i = r * G + b;
        if constexpr (!with_min<F>()) isum -= code_offset<F>() * sxs[i];
        if constexpr (halves<F>()) {
          if constexpr (!with_min<F>()) isum0 -= code_offset<F>() * sx0s[i];
          isum -= isum0;  // the second half's sum
        }
        float sd = sc.at(b, scale_set_d<F>(0), j) * dx[i];
        float t1 = sd * static_cast<float>(halves<F>() ? isum0 : isum);
        TRIFORCE_OPAQUE_FLOAT(t1);
        if constexpr (halves<F>()) {
          float sd1 = sc.at(b, scale_set_d<F>(1), j) * dx[i];
          TRIFORCE_OPAQUE_FLOAT(sd1);
          float t2 = sd1 * static_cast<float>(isum);
          TRIFORCE_OPAQUE_FLOAT(t2);
          t1 = t1 + t2;
          TRIFORCE_OPAQUE_FLOAT(t1);
        }
        if constexpr (with_min<F>() && halves<F>()) {  // Q4_1_16, Q2_16: m_h * (dx * sx_h), the halves in order
          for (int h = 0; h < 2; ++h) {
            float smh = dx[i] * static_cast<float>(h == 0 ? sx0s[i] : sxs[i] - sx0s[i]);
            TRIFORCE_OPAQUE_FLOAT(smh);
            float t2 = sc.at(b, scale_set_m<F>(h), j) * smh;
            TRIFORCE_OPAQUE_FLOAT(t2);
            t1 = t1 + t2;
            TRIFORCE_OPAQUE_FLOAT(t1);
          }
        } else if constexpr (with_min<F>()) {
          float t2 = sc.at(b, scale_set_m<F>(0), j) * sm[i];
          TRIFORCE_OPAQUE_FLOAT(t2);
          t1 = t1 + t2;
          TRIFORCE_OPAQUE_FLOAT(t1);
        }
        acc = acc + t1;
      }
      out[r * ldo + j] = acc;
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kVnni = true;

// 16 scales as float32 lanes.
inline __m512 load_scales(const uint16_t* s) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
}
inline __m512 load_scales(const float* s) { return _mm512_loadu_ps(s); }

// Block b's 16 scales of set k as float32 lanes (SuperScale: the bases times the widened multipliers, exact).
template <Format F, typename S>
inline __m512 scales16(const GroupScales<F, S>& sc, int64_t b, int k) {
  if constexpr (std::is_same_v<S, SuperScale>) {
    const __m512 base = load_scales(reinterpret_cast<const uint16_t*>(sc.base(b, GroupScales<F, S>::base_of(k))));
    const __m128i m8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc.mult(b) + 16 * k));
    return _mm512_mul_ps(base, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(m8)));
  } else if constexpr (std::is_same_v<S, E8M0Scale>) {  // e8m0_half of 16 bytes
    const auto* bytes = reinterpret_cast<const __m128i*>(sc.s + b * scale_count<F>() + 16 * k);
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes));
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(normal, small, subnormal));
  } else {
    return load_scales(sc.s + b * scale_count<F>() + 16 * k);
  }
}

// One block's codes of a group as 8 vectors of bytes: w[v] meets x bytes 4v .. 4v + 3 of the block (byte 4j + i:
// code 4v + i of row j), as vpdpbusd's unsigned operand (Q8_0, Q8_0_16: the stored bytes; IQ4_NL, MXFP4, GRID,
// GRID_16: the grid + 128, from table; the nibble forms: their codes).
template <Format F>
inline void decode_block(const uint8_t* c, __m512i w[8], const uint8_t* table = grid_table<F>().v) {
  if constexpr (nibbles<F>()) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (int t = 0; t < 4; ++t) {
      const __m512i raw = _mm512_loadu_si512(c + 64 * t);
      w[t] = _mm512_and_si512(raw, nib);
      w[4 + t] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    }
    if constexpr (grid<F>()) {  // the grid + 128 in each 128-bit lane (vpshufb looks up within lanes)
      const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
      for (int v = 0; v < 8; ++v) w[v] = _mm512_shuffle_epi8(t, w[v]);
    }
    if constexpr (fifth_bits<F>()) {  // the fifth bits: 16 where mask v has a bit (Q6_16: sixth bits, 32)
      for (int v = 0; v < 8; ++v) {
        uint64_t mk;
        std::memcpy(&mk, c + 256 + 8 * v, 8);
        w[v] = _mm512_or_si512(w[v], _mm512_maskz_set1_epi8(static_cast<__mmask64>(mk), 16));
        if constexpr (F == Format::Q6_16) {
          std::memcpy(&mk, c + 320 + 8 * v, 8);
          w[v] = _mm512_or_si512(w[v], _mm512_maskz_set1_epi8(static_cast<__mmask64>(mk), 32));
        }
      }
    }
  } else if constexpr (two_bits<F>()) {  // vector v: field v / 2 of raw vector v % 2
    const __m512i two = _mm512_set1_epi8(3);
    const __m512i raw[2] = {_mm512_loadu_si512(c), _mm512_loadu_si512(c + 64)};
    for (int v = 0; v < 8; ++v)
      w[v] = _mm512_and_si512(v < 2 ? raw[v] : _mm512_srli_epi16(raw[v & 1], 2 * (v >> 1)), two);
    if constexpr (F == Format::Q3_16) {  // the third bits: 4 where mask v has a bit
      for (int v = 0; v < 8; ++v) {
        uint64_t mk;
        std::memcpy(&mk, c + 128 + 8 * v, 8);
        w[v] = _mm512_or_si512(w[v], _mm512_maskz_set1_epi8(static_cast<__mmask64>(mk), 4));
      }
    }
  } else {
    for (int t = 0; t < 8; ++t) w[t] = _mm512_loadu_si512(c + 64 * t);
  }
}

// A group's G blocks of codes c decoded to bytes (decode_block's 8 vectors plus shift, 512 bytes a block) into
// out, prefetching the next group's codes (next; nullptr: none).
template <Format F>
inline void decode_group(const uint8_t* c, int64_t G, const uint8_t* next, uint8_t shift, uint8_t* out) {
  constexpr int T = (code_bytes<F>() + 63) / 64;  // 64-byte code lines per block
  const __m512i sh = _mm512_set1_epi8(static_cast<char>(shift));
  const uint8_t* table = grid_of<F>(c, G);
  for (int64_t b = 0; b < G; ++b) {
    if (next != nullptr)
      for (int t = 0; t < T; ++t)
        _mm_prefetch(reinterpret_cast<const char*>(next + b * code_bytes<F>() + 64 * t), _MM_HINT_T1);
    __m512i w[8];
    decode_block<F>(c + b * code_bytes<F>(), w, table);
    for (int v = 0; v < 8; ++v) _mm512_storeu_si512(out + b * 512 + 64 * v, _mm512_add_epi8(w[v], sh));
  }
}

// Block b's term of one row of x for the group's 16 outputs (lanes), from the block's raw integer sums: i0 the
// whole block's (halves: the first half's) and i1 the second half's (halves only); the codes' offset is
// corrected here (exact), then the float arithmetic of the header, each operation on its own (no FMA).
// d: the block's first set of d's (scale_set_d(0)); dx, sm, sx0, sx: the row's values for the block.
template <Format F, typename S>
inline __m512 block_term(const GroupScales<F, S>& sc, int64_t b, __m512 d, __m512i i0, __m512i i1, float dx,
                         float sm, int32_t sx0, int32_t sx) {
  if constexpr (halves<F>()) {  // the halves' sums apart
    const int32_t sx1 = sx - sx0;  // the codes' offset, exact
    if constexpr (!with_min<F>()) {
      i0 = _mm512_sub_epi32(i0, _mm512_set1_epi32(code_offset<F>() * sx0));
      i1 = _mm512_sub_epi32(i1, _mm512_set1_epi32(code_offset<F>() * sx1));
    }
    const __m512 dxv = _mm512_set1_ps(dx);
    __m512 t1 = _mm512_mul_ps(_mm512_mul_ps(d, dxv), _mm512_cvtepi32_ps(i0));
    asm("" : "+v"(t1));
    __m512 sd1 = _mm512_mul_ps(scales16(sc, b, scale_set_d<F>(1)), dxv);
    asm("" : "+v"(sd1));
    __m512 t2 = _mm512_mul_ps(sd1, _mm512_cvtepi32_ps(i1));
    asm("" : "+v"(t2));
    t1 = _mm512_add_ps(t1, t2);
    asm("" : "+v"(t1));
    if constexpr (with_min<F>()) {  // Q4_1_16, Q2_16: m_h * (dx * sx_h), the halves in order
      for (int h = 0; h < 2; ++h) {
        float smh = dx * static_cast<float>(h == 0 ? sx0 : sx1);
        TRIFORCE_OPAQUE_FLOAT(smh);
        __m512 t3 = _mm512_mul_ps(scales16(sc, b, scale_set_m<F>(h)), _mm512_set1_ps(smh));
        asm("" : "+v"(t3));
        t1 = _mm512_add_ps(t1, t3);
        asm("" : "+v"(t1));
      }
    }
    return t1;
  } else {
    if constexpr (!with_min<F>()) {  // Q8_0, IQ4_NL, MXFP4: the +128 of the codes, -128 * sx, exact
      i0 = _mm512_sub_epi32(i0, _mm512_set1_epi32(code_offset<F>() * sx));
    }
    __m512 t1 = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(i0));
    asm("" : "+v"(t1));
    if constexpr (with_min<F>()) {
      const __m512 m = scales16(sc, b, scale_set_m<F>(0));
      __m512 t2 = _mm512_mul_ps(m, _mm512_set1_ps(sm));
      asm("" : "+v"(t2));
      t1 = _mm512_add_ps(t1, t2);
      asm("" : "+v"(t1));
    }
    return t1;
  }
}

// ROWS (1..kRows) rows of x against one group (16 output rows), all K.
template <Format F, int ROWS, typename S>
inline void group_vnni(const int8_t* q, const float* dx, const float* sm, const int32_t* sxs, const int32_t* sx0s,
                       int64_t K, const uint8_t* codes, const S* scales, float* out, int64_t ldo,
                       const uint8_t* prefetch) {
  const int64_t G = K / kBlock;
  constexpr int T = (code_bytes<F>() + 63) / 64;  // 64-byte code lines per block
  const GroupScales<F, S> sc{scales};
  const uint8_t* table = grid_of<F>(codes, G);
  __m512 acc[ROWS];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (int64_t b = 0; b < G; ++b) {
    const uint8_t* c = codes + b * code_bytes<F>();
    if (prefetch != nullptr)
      for (int t = 0; t < T; ++t) _mm_prefetch(reinterpret_cast<const char*>(prefetch + b * code_bytes<F>() + 64 * t), _MM_HINT_T1);
    __m512i w[8];
    decode_block<F>(c, w, table);
    const __m512 d = scales16(sc, b, scale_set_d<F>(0));
    for (int r = 0; r < ROWS; ++r) {
      const int8_t* qb = q + r * K + b * kBlock;
      auto x4 = [&](int v) {
        int32_t word;
        std::memcpy(&word, qb + 4 * v, 4);
        return _mm512_set1_epi32(word);
      };
      __m512i i0, i1;
      if constexpr (halves<F>()) {  // x bytes 0..15, then 16..31
        i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], x4(0));
        i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], x4(4));
        for (int v = 1; v < 4; ++v) {
          i0 = _mm512_dpbusd_epi32(i0, w[v], x4(v));
          i1 = _mm512_dpbusd_epi32(i1, w[4 + v], x4(4 + v));
        }
      } else {  // two chains, then their sum
        i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], x4(0));
        i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x4(1));
        for (int v = 2; v < 8; v += 2) {
          i0 = _mm512_dpbusd_epi32(i0, w[v], x4(v));
          i1 = _mm512_dpbusd_epi32(i1, w[v + 1], x4(v + 1));
        }
        i0 = _mm512_add_epi32(i0, i1);
      }
      const int64_t i = r * G + b;
      acc[r] = _mm512_add_ps(acc[r], block_term(sc, b, d, i0, i1, dx[i], sm[i], sx0s[i], sxs[i]));
    }
  }
  for (int r = 0; r < ROWS; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}
#else
constexpr bool kVnni = false;
#endif

// Whether groups() may take the AMX tiles where it can (below): a switch for benchmarks and tests, which compare
// the paths in one process (triforce_C::rowwise_linear_i8_tiles). The bits are the same either way.
inline std::atomic<bool>& amx_int8_allowed() {
  static std::atomic<bool> on{true};
  return on;
}

#if defined(TRIFORCE_AMX_TILES) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512VNNI__) && \
    defined(__AVX512BW__)
#define TRIFORCE_I8_AMX 1
// ---- the AMX tiles (Intel Sapphire Rapids and later): the integer sums of many rows at once ------------
//
// One tdpbsud multiplies a 16 x 32 tile of x's int8 codes (16 rows of one block; signed) by the block's 32 x 16
// weight codes (unsigned: the bytes vpdpbusd takes, in its layout, which is the B tile's: 4 consecutive k of
// one output row per dword) into 16 x 16 exact int32 sums: 8192 multiply-adds, 128 vpdpbusd's worth. The
// sums are stored and each row's block term is the VNNI path's (block_term, the same operations in the same
// order), so the outputs are bitwise the other paths'; only the integer sums come from another instruction,
// and they are exact. Forms with halves take two tile products per block (x bytes 0..15 against code rows
// 0..3, 16..31 against 4..7). A block's tile work costs about the same for 1 row of x as for 16 (and the
// float terms stay per row), so the tiles pay from kAmxMinRows rows of x on (the VNNI path below that).

// Whether this process can run rowwise_linear_i8 on the tiles: AMX-INT8, and the tiles granted
// (amx_tiles_granted).
inline bool amx_int8_enabled() {
  static const bool on = __builtin_cpu_supports("amx-int8") && amx_tiles_granted();
  return on;
}
// From this many rows of x on. Intel Xeon VM, 576 x 1536 Q4_1 weights, the paths in turns in one process
// (rowwise_linear_i8_tiles), two threads: 16 rows tie VNNI (the tiles' fixed cost per block: ~25 ns whatever
// the rows; the codes' expansion to bytes), 32 / 64 / 256 rows 1.06-1.18x / 1.05-1.20x / 1.14-1.29x faster
// (the VM's speed moved 2x between runs); below 16 the tiles lose.
constexpr int64_t kAmxMinRows = 32;

// The tiles for form F: without halves tiles 0 and 3 hold C (16 x 16 int32), 1 and 4 A (16 rows x 32 bytes),
// 2 and 5 B (8 rows x 64 bytes), two sets for consecutive blocks; with halves tiles 0, 1 C (the halves' sums),
// 2, 3 A (16 rows x 16 bytes: x bytes 0..15, 16..31) and 4, 5 B (4 rows x 64 bytes: code rows 0..3, 4..7).
// R (1..16): the rows of x per block of rows (A's and C's rows).
template <Format F>
inline TileConfig amx_i8_config(int R) {
  constexpr bool h = halves<F>();
  constexpr int c_tiles[2] = {0, h ? 1 : 3}, a_tiles[2] = {h ? 2 : 1, h ? 3 : 4}, b_tiles[2] = {h ? 4 : 2, 5};
  TileConfig c;
  for (int i = 0; i < 2; ++i) {
    c.rows[c_tiles[i]] = R, c.colsb[c_tiles[i]] = 64;
    c.rows[a_tiles[i]] = R, c.colsb[a_tiles[i]] = h ? 16 : 32;
    c.rows[b_tiles[i]] = h ? 4 : 8, c.colsb[b_tiles[i]] = 64;
  }
  return c;
}

// One block's integer sums for the configured R rows of x (a, row stride K) against its B bytes (bt, 512 bytes)
// into sums (rows of 16 int32; halves: the first half's 256 int32, then the second's), on tile set SET (0 or 1;
// halves: 0).
template <Format F, int SET>
inline void block_sums_amx(const int8_t* a, int64_t K, const uint8_t* bt, int32_t* sums) {
  if constexpr (halves<F>()) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, a, K);
    _tile_loadd(4, bt, 64);
    _tile_dpbsud(0, 2, 4);
    _tile_loadd(3, a + 16, K);
    _tile_loadd(5, bt + 256, 64);
    _tile_dpbsud(1, 3, 5);
    _tile_stored(0, sums, 64);
    _tile_stored(1, sums + 256, 64);
  } else {
    if constexpr (SET == 0) {  // (the tile intrinsics take literal tile numbers)
      _tile_zero(0);
      _tile_loadd(1, a, K);
      _tile_loadd(2, bt, 64);
      _tile_dpbsud(0, 1, 2);
      _tile_stored(0, sums, 64);
    } else {
      _tile_zero(3);
      _tile_loadd(4, a, K);
      _tile_loadd(5, bt, 64);
      _tile_dpbsud(3, 4, 5);
      _tile_stored(3, sums, 64);
    }
  }
}

// ROWS (1..16) rows of x against one group, all K, on the tiles (configured: amx_i8_config<F>(R), R >= ROWS).
// q holds R rows (row stride K; those past ROWS are read, not used); bt: the group's B bytes, 512 per block;
// sums: 1024 int32.
template <Format F, int ROWS, typename S>
inline void group_amx(const int8_t* q, const float* dx, const float* sm, const int32_t* sxs, const int32_t* sx0s,
                      int64_t K, const uint8_t* bt, const S* scales, float* out, int64_t ldo, int32_t* sums) {
  const int64_t G = K / kBlock;
  const GroupScales<F, S> sc{scales};
  __m512 acc[ROWS];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  // block b's sums go to sums + (b & 1) * 512 (and, without halves, its tiles are set b & 1); block b + 1's tile
  // products are issued before block b's terms, so they overlap
  auto tiles = [&](int64_t b) {
    if (halves<F>() || (b & 1) == 0)
      block_sums_amx<F, 0>(q + b * kBlock, K, bt + b * 512, sums + (b & 1) * 512);
    else
      block_sums_amx<F, 1>(q + b * kBlock, K, bt + b * 512, sums + (b & 1) * 512);
  };
  tiles(0);
  for (int64_t b = 0; b < G; ++b) {
    if (b + 1 < G) tiles(b + 1);
    const int32_t* s = sums + (b & 1) * 512;
    const __m512 d = scales16(sc, b, scale_set_d<F>(0));
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const __m512i i0 = _mm512_loadu_si512(s + 16 * r);
      const __m512i i1 = halves<F>() ? _mm512_loadu_si512(s + 256 + 16 * r) : _mm512_setzero_si512();
      const int64_t i = r * G + b;
      acc[r] = _mm512_add_ps(acc[r], block_term(sc, b, d, i0, i1, dx[i], sm[i], sx0s[i], sxs[i]));
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    _mm512_storeu_ps(out + r * ldo, acc[r]);
  }
}

// groups() on the tiles: groups [g0, g1) against M rows of x.
template <Format F, typename S>
inline void groups_amx(const int8_t* q, const float* dx, const float* sm, const int32_t* sxs, const int32_t* sx0s,
                       int64_t M, int64_t K, const uint8_t* codes, const S* scales, int64_t N, float* out, int64_t g0,
                       int64_t g1) {
  const int64_t G = K / kBlock, cb = group_code_bytes<F>(G), sb = GroupScales<F, S>::elems(G);
  constexpr bool plain = F == Format::Q8_0 || F == Format::Q8_0_16;  // the stored codes are the B bytes
  constexpr int T = (code_bytes<F>() + 63) / 64;  // 64-byte code lines per block
  std::vector<uint8_t> bytes(plain ? 0 : G * 512);
  std::vector<float> expanded(std::is_same_v<S, SuperScale> ? G * scale_count<F>() : 0);
  // blocks of R rows: the fewest blocks of at most 16 rows, their rows as even as can be; a last block of fewer
  // rows is read from a copy padded with zero rows to R
  const int64_t blocks = (M + kGroup - 1) / kGroup, R = (M + blocks - 1) / blocks, full = M / R * R;
  std::vector<int8_t> tail(M > full ? R * K : 0, int8_t(0));
  if (M > full) std::memcpy(tail.data(), q + full * K, (M - full) * K);
  alignas(64) int32_t sums[1024];
  const TileConfig cfg = amx_i8_config<F>(static_cast<int>(R));
  amx_load_config(cfg);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* c = codes + g * cb;
    const uint8_t* bt = c;
    if constexpr (!plain) {  // the B bytes of every block, once per group (prefetching the next group's codes)
      decode_group<F>(c, G, g + 1 < g1 ? c + cb : nullptr, 0, bytes.data());
      bt = bytes.data();
    } else if (g + 1 < g1) {
      for (int64_t b = 0; b < G * T; ++b) _mm_prefetch(reinterpret_cast<const char*>(c + cb + 64 * b), _MM_HINT_T1);
    }
    auto row_blocks = [&](const auto* ss) {
      for (int64_t m = 0; m < M; m += R) {
        const int8_t* qm = m < full ? q + m * K : tail.data();
        const float *dm = dx + m * G, *smm = sm + m * G;
        const int32_t *sxm = sxs + m * G, *sx0m = sx0s + m * G;
        float* o = out + m * N + g * kGroup;
        switch (std::min(R, M - m)) {  // the rows' accumulators in registers
#define TRIFORCE_I8_AMX_ROWS(ROWS) \
  case ROWS: group_amx<F, ROWS>(qm, dm, smm, sxm, sx0m, K, bt, ss, o, N, sums); break;
          TRIFORCE_I8_AMX_ROWS(1) TRIFORCE_I8_AMX_ROWS(2) TRIFORCE_I8_AMX_ROWS(3) TRIFORCE_I8_AMX_ROWS(4)
          TRIFORCE_I8_AMX_ROWS(5) TRIFORCE_I8_AMX_ROWS(6) TRIFORCE_I8_AMX_ROWS(7) TRIFORCE_I8_AMX_ROWS(8)
          TRIFORCE_I8_AMX_ROWS(9) TRIFORCE_I8_AMX_ROWS(10) TRIFORCE_I8_AMX_ROWS(11) TRIFORCE_I8_AMX_ROWS(12)
          TRIFORCE_I8_AMX_ROWS(13) TRIFORCE_I8_AMX_ROWS(14) TRIFORCE_I8_AMX_ROWS(15) TRIFORCE_I8_AMX_ROWS(16)
#undef TRIFORCE_I8_AMX_ROWS
        }
      }
    };
    const S* s = scales + g * sb;
    if constexpr (std::is_same_v<S, SuperScale>) {  // the scales as float32 once per group (the same values)
      const GroupScales<F, S> sc{s};
      constexpr int64_t SC = scale_count<F>();
      for (int64_t b = 0; b < G; ++b)
        for (int k = 0; k < SC / 16; ++k) _mm512_storeu_ps(expanded.data() + b * SC + 16 * k, scales16(sc, b, k));
      row_blocks(static_cast<const float*>(expanded.data()));
    } else {
      row_blocks(s);
    }
  }
  _tile_release();
}
#endif

// Where the codes of a form with an offset (IQ4_NL, MXFP4, Q6_16, Q3_16) are expanded for several register blocks of
// rows: the byte form computing the same integer sums (the grids + 128 are Q8_0's bytes; Q6_16's u + 96,
// that is (u - 32) + 128, and Q3_16's u + 124, (u - 4) + 128, Q8_0_16's), and the shift added to the codes.
template <Format F>
constexpr Format byte_form() {
  return grid<F>() ? (halves<F>() ? Format::Q8_0_16 : Format::Q8_0)
         : F == Format::Q6_16 || F == Format::Q3_16 ? Format::Q8_0_16
                                                     : F;
}
template <Format F>
constexpr uint8_t byte_shift() { return F == Format::Q6_16 || F == Format::Q3_16 ? 128 - code_offset<F>() : 0; }

// Groups [g0, g1) of 16 output rows against x's M rows (already quantised: q, dx, sm as quantize_rows
// writes them); out [M, N] float32. While a group's first rows are computed, the next group's codes are
// prefetched into L2 (the groups are consecutive in memory, one stream). With super-block scales and more
// rows than one register block, a group's scales are first expanded to float32 (the same values), so that
// each register block of rows reads them as plain scales, and IQ4_NL's, Q6_16's and Q3_16's codes are expanded to their
// byte form (byte_form), which saves every register block after the first its lookups or bit masks. Intel Xeon
// VM, one core, 64 matrices of 576 x 1536 read from memory, against the same codes with float32 scales
// (alternating, min of 7): Q4_K's form 1.23-1.29x at 1 row, 1.10-1.17x at 4; 8-32 rows 0.95-1.12x (without the
// expansion, each register block converting the scales itself: 0.95x at 32 rows); Q6_K's 1.15x / 1.12x;
// IQ4_XS's 1.14x / 1.08x.
template <Format F, typename S>
inline void groups(const int8_t* q, const float* dx, const float* sm, const int32_t* sxs, const int32_t* sx0s, int64_t M,
                   int64_t K, const uint8_t* codes, const S* scales, int64_t N, float* out, int64_t g0, int64_t g1) {
#if defined(TRIFORCE_I8_AMX)
  if (M >= kAmxMinRows && amx_int8_allowed().load(std::memory_order_relaxed) && amx_int8_enabled()) {
    groups_amx<F>(q, dx, sm, sxs, sx0s, M, K, codes, scales, N, out, g0, g1);
    return;
  }
#endif
  const int64_t G = K / kBlock, cb = group_code_bytes<F>(G), sb = GroupScales<F, S>::elems(G);
  std::vector<float> expanded;
  std::vector<uint8_t> bytes;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* c = codes + g * cb;
    // the row blocks against codes cc of form E with scales ss; the first prefetches the next group's codes
    // unless the codes were expanded (E != F: the expansion prefetches them, at F's stride)
    auto row_blocks = [&](auto form, const uint8_t* cc, const auto* ss) {
      constexpr Format E = decltype(form)::value;
      for (int64_t m = 0; m < M; m += kRows) {
        const int64_t rows = std::min(kRows, M - m);
        float* o = out + m * N + g * kGroup;
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
        const uint8_t* pf = E == F && m == 0 && g + 1 < g1 ? c + cb : nullptr;
        const int8_t* qm = q + m * K;
        const float *dm = dx + m * G, *smm = sm + m * G;
        const int32_t *sxm = sxs + m * G, *sx0m = sx0s + m * G;
        switch (rows) {
          case 1: group_vnni<E, 1>(qm, dm, smm, sxm, sx0m, K, cc, ss, o, N, pf); break;
          case 2: group_vnni<E, 2>(qm, dm, smm, sxm, sx0m, K, cc, ss, o, N, pf); break;
          case 3: group_vnni<E, 3>(qm, dm, smm, sxm, sx0m, K, cc, ss, o, N, pf); break;
          default: group_vnni<E, 4>(qm, dm, smm, sxm, sx0m, K, cc, ss, o, N, pf); break;
        }
#else
        group_portable<E>(q + m * K, dx + m * G, sm + m * G, sxs + m * G, sx0s + m * G, rows, K, cc, ss, o, N);
#endif
      }
    };
    using FormF = std::integral_constant<Format, F>;
    const S* s = scales + g * sb;
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (M > kRows) {  // several register blocks of rows: expand what each would decode again, once per group
      auto with_codes = [&](const auto* ss) {
        constexpr Format E = byte_form<F>();
        if constexpr (E != F) {
          bytes.resize(G * code_bytes<E>());  // (512 bytes a block: the byte forms')
          decode_group<F>(c, G, g + 1 < g1 ? c + cb : nullptr, byte_shift<F>(), bytes.data());
          row_blocks(std::integral_constant<Format, E>{}, bytes.data(), ss);
        } else {
          row_blocks(FormF{}, c, ss);
        }
      };
      if constexpr (std::is_same_v<S, SuperScale>) {
        const GroupScales<F, S> sc{s};
        constexpr int64_t SC = scale_count<F>();
        expanded.resize(G * SC);
        for (int64_t b = 0; b < G; ++b) {
          for (int k = 0; k < SC / 16; ++k) _mm512_storeu_ps(expanded.data() + b * SC + 16 * k, scales16(sc, b, k));
        }
        with_codes(static_cast<const float*>(expanded.data()));
      } else {
        with_codes(s);
      }
      continue;
    }
#endif
    row_blocks(FormF{}, c, s);
  }
}

}  // namespace linear_i8
}  // namespace triforce
