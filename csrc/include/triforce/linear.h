// rowwise_linear on the CPU: out = x @ w^T, built for a few rows of x (the model layer's decode and
// verification steps) and used at any row count by every forward that extends a KV cache, for its row
// independence (below).
// Torch-free; csrc/cpu/linear.cpp wraps it for ATen.
//
// Why: MKL's sgemm packs the weight panel for every M >= 2, so a 2..16-row product costs 1.5-2x a
// 1-row product although it reads the same weights; speculative verification (T tokens in one pass)
// only pays when the extra rows are nearly free. Here each block of NR weight rows is read from memory
// once and serves every row of x: on AVX-512, MR x-rows x NR w-rows of zmm accumulators per step of
// 16 (fp32) or 32 (bf16) elements, then transpose-and-add reductions (hsum16_avx512) of 16 at a time.
// x and w are float32, or both bfloat16, or both float16 (products accumulated in fp32, the result
// rounded once).
//
// Bitwise row independence (the contract the model layer relies on): every output element (m, n) is
// computed by the same instructions whatever M is, wherever row m falls in its group of MR and however
// the weight rows are split among threads: its accumulator is lane l += x[m, k] * w[n, k] over
// k = l (mod 16) in increasing k (bf16 with AVX512_BF16: pairs k = 2l, 2l + 1 (mod 32) per dpbf16),
// and hsum16_avx512 reduces each of its 16 slots by the same tree, whichever slot. So row m of a
// many-row product is bitwise the 1-row product of x[m]: a verification pass of any size computes
// exactly the projections an autoregressive step computes for the same token. At many rows, against
// torch's GEMM (which keeps outputs in lanes and needs no horizontal reduction), float32 is within +-10%
// from 256 rows on and bfloat16 0.7-0.9x (docs/model.md, "Every row count").
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#include <cmath>
#include <limits>

#include "triforce/common.h"

namespace triforce {
namespace linear {

// Block shape, measured on Zen 4 (one core, SmolLM2's 1536 x 576 MLP matrices, best of 5): 6 weight
// rows x 4 x-rows = 24 zmm accumulators. 4 x 4 re-read x from L2 for every 4 weight rows and reached
// ~35 fp32 GFLOP/s at M >= 8; 6 x 4 halves the x traffic per weight byte and reached ~57, and ~92 (the
// core's FMA rate) once each weight vector was loaded once per step instead of once per x row (REGW
// below; bf16 dpbf16 reaches about twice that in MACs).
#if defined(__AVX512F__)
constexpr int64_t NR = 6;  // weight rows per block (one contiguous span of NR * K elements)
#else
constexpr int64_t NR = 4;  // portable path: one 4-row dot loop, as the previous kernel (4 + 2 measured slower on AVX2)
#endif
constexpr int64_t MR = 4;  // x rows per register block
// The op (csrc/cpu/linear.cpp) runs x in chunks of this many rows, each against every weight block. A
// block's pass re-reads the chunk's rows of x; all of x would fall out of the caches at prefill sizes
// (SmolLM2 float32, 2 threads, AMD EPYC: 0.45x torch's GEMM at 8192 rows unchunked, 0.87-1.15x in chunks
// of 128-512). Up to 256 rows, one chunk: the weights are read once. Chunking never changes a bit.
constexpr int64_t kRowChunk = 256;
// Software prefetch (to L2) of the block this many blocks ahead: without it the NR interleaved row
// streams of a block read at ~14 GB/s on one core, against ~24 GB/s for one sequential stream (the
// hardware prefetcher tracks them poorly); with it M = 1 reads at ~25 GB/s.
constexpr int64_t kPrefetchBlocksF32 = 1;
constexpr int64_t kPrefetchBlocksBF16 = 2;

template <typename O>
inline void store_out(O* o, float v) { *o = from_float<O>(v); }

// Portable path (no AVX-512, e.g. an AVX2 CPU): per input row, the block's weight rows 4 at a time
// (then one by one) with 8-lane GCC/Clang vector accumulators: lane l sums k = l (mod 8) in increasing
// k, the K % 8 tail enters as a zero-padded vector, then a fixed reduction tree. Not `omp simd`: its
// reduction order is the compiler's choice and may differ between two inlined copies of the same loop
// (measured: a few outputs 1 ulp apart between an M-row and a 1-row call in an AVX2 build), while the
// model layer needs row m bitwise equal to the 1-row product.
using v8f = float __attribute__((vector_size(32)));

using v8u16 = uint16_t __attribute__((vector_size(16)));
using v8u32 = uint32_t __attribute__((vector_size(32)));

// (v8f is passed by reference: by value it would change the ABI of these functions in a build
// without AVX, which GCC warns about.)
inline void load8(const float* p, v8f& v) { std::memcpy(&v, p, sizeof(v)); }
inline void load8(const bf16* p, v8f& v) {  // bf16 -> fp32: the 16 bits shifted up
  v8u16 h;
  std::memcpy(&h, p, sizeof(h));
  const v8u32 u = __builtin_convertvector(h, v8u32) << 16;
  std::memcpy(&v, &u, sizeof(v));
}
inline void load8(const f16* p, v8f& v) {  // fp16 -> fp32, exact
  float f[8];
  for (int i = 0; i < 8; ++i) f[i] = to_float(p[i]);
  std::memcpy(&v, f, sizeof(v));
}
template <typename T>
inline void load8_tail(const T* p, int64_t n, v8f& v) {  // n < 8 elements, the rest 0
  float f[8] = {};
  for (int64_t i = 0; i < n; ++i) f[i] = to_float(p[i]);
  std::memcpy(&v, f, sizeof(v));
}
inline float hsum8(const v8f& v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

template <int J, typename T, typename O>
inline void dots_portable(const T* xr, int64_t K, const T* w, O* out) {
  v8f a[J];
  for (int j = 0; j < J; ++j) a[j] = v8f{};
  int64_t k = 0;
  v8f xv, wv;
  for (; k + 8 <= K; k += 8) {
    load8(xr + k, xv);
    for (int j = 0; j < J; ++j) {
      load8(w + j * K + k, wv);
      a[j] += xv * wv;
    }
  }
  if (k < K) {
    load8_tail(xr + k, K - k, xv);
    for (int j = 0; j < J; ++j) {
      load8_tail(w + j * K + k, K - k, wv);
      a[j] += xv * wv;
    }
  }
  for (int j = 0; j < J; ++j) store_out(out + j, hsum8(a[j]));
}

template <typename T, typename O>
inline void block_portable(const T* x, int64_t M, int64_t K, const T* w, int64_t nr, O* out, int64_t ldo) {
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * K;
    O* o = out + m * ldo;
    int64_t j = 0;
    for (; j + 4 <= nr; j += 4) dots_portable<4>(xr, K, w + j * K, o + j);
    for (; j < nr; ++j) dots_portable<1>(xr, K, w + j * K, o + j);
  }
}

#if defined(__AVX512F__)
// One step of k for ROWS rows of x against the block's NR weight rows wr[j]: fp32, 16 elements (mask:
// the tail's valid lanes; the missing lanes add 0 * 0). Full steps load unmasked (a masked load in the
// main loop measured up to 2x slower).
inline __m512 load16_f32(const float* p, __mmask16 mk) {
  return mk == __mmask16(0xffff) ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mk, p);
}

// acc[m][j] += x[m, k:k+16] * wv[j] for ROWS rows of x: the fp32 arithmetic of every weight format whose
// step yields fp32 weight vectors (float32 loaded, int8 dequantised).
template <int ROWS>
inline void fma_rows_avx512(const float* x, int64_t K, int64_t k, __mmask16 mk, const __m512* wv, __m512* acc) {
  for (int m = 0; m < ROWS; ++m) {
    const __m512 xv = load16_f32(x + m * K + k, mk);
    for (int j = 0; j < NR; ++j) acc[m * NR + j] = _mm512_fmadd_ps(xv, wv[j], acc[m * NR + j]);
  }
}

// REGW: each weight vector is loaded once into a register (the empty asm hides where its value came
// from, so the compiler cannot fold the load back into the multiply-adds). Without it GCC 12 folds the
// load into every row's multiply-add: ROWS loads per weight vector instead of one, 28 loads per 24
// multiply-adds at ROWS = 4, and the load ports bind (~50 fp32 GFLOP/s on a Zen 4 core, against ~92 with
// REGW and the weights in L2). With one group of x rows the product is memory-bound and the folded form
// measured faster (M = 3: 9.3 against 11.8 ms over 64 streamed SmolLM2 MLP matrices), so REGW is for
// products of more than MR rows (rowwise_linear_blocks). Both forms do the same multiply-adds in the
// same order: bitwise the same result.
template <int ROWS, bool REGW = false>
inline void step_avx512(const float* x, int64_t K, const float* const* wr, int64_t k, __mmask16 mk,
                        __m512* acc) {
  __m512 wv[NR];
  for (int j = 0; j < NR; ++j) {
    wv[j] = load16_f32(wr[j] + k, mk);
    if constexpr (REGW) asm("" : "+v"(wv[j]));
  }
  fma_rows_avx512<ROWS>(x, K, k, mk, wv, acc);
}

// bf16, 32 elements. With AVX512_BF16 one dpbf16 per 32 elements (fp32 accumulation of exact bf16
// products); without it the pairs are widened to fp32 (two FMAs per 32 elements).
// 32 elements of a 16-bit type (bf16 or f16) in one zmm, the masked-off ones 0.
template <typename T>
inline __m512i load32_16bit(const T* p, __mmask32 mk) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  return mk == ~__mmask32(0) ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(mk, p);
}

template <int ROWS, bool REGW = false>  // REGW: never true here (bf16 keeps the folded form: measured faster)
inline void step_avx512(const bf16* x, int64_t K, const bf16* const* wr, int64_t k, __mmask32 mk,
                        __m512* acc) {
  __m512i wv[NR];
  for (int j = 0; j < NR; ++j) wv[j] = load32_16bit(wr[j] + k, mk);
  for (int m = 0; m < ROWS; ++m) {
    const __m512i xv = load32_16bit(x + m * K + k, mk);
#if defined(__AVX512BF16__)
    for (int j = 0; j < NR; ++j)
      acc[m * NR + j] = _mm512_dpbf16_ps(acc[m * NR + j], (__m512bh)xv, (__m512bh)wv[j]);
#else
    // element 2l -> low half of 32-bit lane l, 2l + 1 -> high half: the same pairing as dpbf16
    const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
    const __m512 xlo = _mm512_castsi512_ps(_mm512_slli_epi32(xv, 16));
    const __m512 xhi = _mm512_castsi512_ps(_mm512_and_si512(xv, hi));
    for (int j = 0; j < NR; ++j) {
      const __m512 wlo = _mm512_castsi512_ps(_mm512_slli_epi32(wv[j], 16));
      const __m512 whi = _mm512_castsi512_ps(_mm512_and_si512(wv[j], hi));
      acc[m * NR + j] = _mm512_fmadd_ps(xhi, whi, _mm512_fmadd_ps(xlo, wlo, acc[m * NR + j]));
    }
#endif
  }
}

// fp16, 32 elements (one zmm of fp16): elements 0-15 and 16-31 widened to fp32 (exactly) and multiplied in
// fp32, lane l accumulating elements l and l + 16 of each step; each fp16 product is exact in fp32.
template <int ROWS, bool REGW = false>  // REGW: never true here (as bf16)
inline void step_avx512(const f16* x, int64_t K, const f16* const* wr, int64_t k, __mmask32 mk, __m512* acc) {
  auto lo = [](__m512i v) { return _mm512_cvtph_ps(_mm512_castsi512_si256(v)); };      // elements 0-15
  auto hi = [](__m512i v) { return _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1)); };  // elements 16-31
  __m512 wlo[NR], whi[NR];
  for (int j = 0; j < NR; ++j) {
    const __m512i wv = load32_16bit(wr[j] + k, mk);
    wlo[j] = lo(wv);
    whi[j] = hi(wv);
  }
  for (int m = 0; m < ROWS; ++m) {
    const __m512i xv = load32_16bit(x + m * K + k, mk);
    const __m512 xlo = lo(xv), xhi = hi(xv);
    for (int j = 0; j < NR; ++j)
      acc[m * NR + j] = _mm512_fmadd_ps(xhi, whi[j], _mm512_fmadd_ps(xlo, wlo[j], acc[m * NR + j]));
  }
}

// ROWS (1..MR) rows of x against nr (1..NR) weight rows w[j * K ...]; missing weight rows repeat row 0
// (read, never stored) so the loop has no branches. Prefetch of the block ahead, spread over the block's
// `period` x-row groups: group `phase` prefetches the lines of every period-th step of k (all of them
// when one group covers x). Issued by the first group alone, the prefetches of a block came in one burst
// and the memory idled while the other groups computed: with REGW, M = 8 over 64 streamed SmolLM2 MLP
// matrices took 17.3 ms with the burst and 13.6 ms spread (memory alone: ~10.5 ms, one core).
// Accumulators of a block: ROWS x NR used, padded to whole groups of 16 for the reduction.
template <int ROWS>
constexpr int block_acc_count() { return ((ROWS * NR + 15) / 16) * 16; }

// Reduce each accumulator (hsum16_avx512, 16 at a time) and store the block's ROWS x nr outputs.
template <int ROWS, typename O>
inline void reduce_store_avx512(const __m512* acc, int64_t nr, O* out, int64_t ldo) {
  constexpr int NA = block_acc_count<ROWS>();
  alignas(64) float s[NA];
  for (int i = 0; i < NA; i += 16) _mm512_store_ps(s + i, hsum16_avx512(acc + i));
  for (int m = 0; m < ROWS; ++m)
    for (int64_t j = 0; j < nr; ++j) store_out(out + m * ldo + j, s[m * NR + j]);
}

// f(std::integral_constant<int, rows>) for rows in 1..MR.
template <typename F>
inline void with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

template <int ROWS, bool REGW, typename T, typename O>
inline void block_avx512(const T* x, int64_t K, const T* w, int64_t nr, O* out, int64_t ldo, int64_t phase,
                         int64_t period) {
  constexpr bool f32 = std::is_same<T, float>::value;
  constexpr int64_t E = f32 ? 16 : 32;  // elements per step: one zmm of T
  using Mask = typename std::conditional<f32, __mmask16, __mmask32>::type;
  const int64_t ahead = (f32 ? kPrefetchBlocksF32 : kPrefetchBlocksBF16) * NR * K;
  const T* wr[NR];
  for (int64_t j = 0; j < NR; ++j) wr[j] = w + (j < nr ? j : 0) * K;
  __m512 acc[block_acc_count<ROWS>()];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  int64_t k = 0, due = phase;  // due: steps until this group's next prefetch
  for (; k + E <= K; k += E) {
    if (due == 0) {
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr[j] + k + ahead), _MM_HINT_T1);
      due = period;
    }
    --due;
    step_avx512<ROWS, REGW>(x, K, wr, k, static_cast<Mask>(~Mask(0)), acc);
  }
  if (k < K) step_avx512<ROWS, REGW>(x, K, wr, k, static_cast<Mask>((uint64_t(1) << (K - k)) - 1u), acc);
  reduce_store_avx512<ROWS>(acc, nr, out, ldo);
}

// The REGW block out of line: inlined into its caller, the 24 accumulators, 6 weight vectors and the
// row of x no longer fit the 32 registers beside the caller's values and GCC 12 spilled them (1.5x
// slower than the folded form); compiled alone its loop holds them all, with no stack traffic.
template <int ROWS, typename T, typename O>
__attribute__((noinline)) void block_avx512_regw(const T* x, int64_t K, const T* w, int64_t nr, O* out,
                                                 int64_t ldo, int64_t phase, int64_t period) {
  block_avx512<ROWS, true>(x, K, w, nr, out, ldo, phase, period);
}

// M = 1: one row of x against 16 consecutive weight rows, 16 accumulators (one per weight row), one
// hsum16 for 16 outputs. block_avx512<1> reduces a block of NR = 6 rows with the same hsum16 over 16
// accumulators, 10 of them zero: with one row of x that epilogue is about a third of a bf16 block's work.
// Every output keeps its lanes, their order and the reduction tree, so the result is bitwise
// block_avx512<1>'s (and row m of an M-row product still equals it). The next 16 rows are prefetched
// into L2, a line of each row per 64 bytes. Measured on one core (64 SmolLM2 1536 x 576 matrices
// streamed, alternating builds): bf16 6.0 -> 4.8 ms, fp32 10.5 -> 9.6 ms. Measured, not understood: GCC
// 12 keeps part of `unroll` out of line here (the step's multiply-adds then update acc in memory), and a
// variant with the step fully inlined (plain loops, `#pragma GCC unroll`, accumulators in registers)
// was slower than the block path in the same A/B (bf16 0.86x, fp32 0.94x), as was either layout for
// int8 weights (int8 keeps the block path). Any inlining keeps the result bitwise the same.
template <int J, typename F>
inline void unroll(F&& f) {
  if constexpr (J > 0) {
    unroll<J - 1>(f);
    f(std::integral_constant<int, J - 1>{});
  }
}

template <typename T, typename O>
inline void row16_avx512(const T* x, int64_t K, const T* w, O* out) {
  constexpr bool f32 = std::is_same<T, float>::value;
  constexpr int64_t E = f32 ? 16 : 32;  // elements per step: one zmm of T
  using Mask = typename std::conditional<f32, __mmask16, __mmask32>::type;
  __m512 acc[16];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  auto step = [&](int64_t k, Mask mk) {
    if constexpr (f32) {
      const __m512 xv = load16_f32(x + k, mk);
      unroll<16>([&](auto j) { acc[j] = _mm512_fmadd_ps(xv, load16_f32(w + j * K + k, mk), acc[j]); });
    } else {
#if defined(__AVX512BF16__)
      const __m512i xv = load32_16bit(x + k, mk);
      unroll<16>([&](auto j) {
        acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)xv, (__m512bh)load32_16bit(w + j * K + k, mk));
      });
#endif
    }
  };
  int64_t k = 0;
  for (; k + E <= K; k += E) {
    for (int j = 0; j < 16; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + (16 + j) * K + k), _MM_HINT_T1);
    step(k, static_cast<Mask>(~Mask(0)));
  }
  if (k < K) step(k, static_cast<Mask>((uint64_t(1) << (K - k)) - 1u));
  alignas(64) float sum[16];
  _mm512_store_ps(sum, hsum16_avx512(acc));
  for (int j = 0; j < 16; ++j) store_out(out + j, sum[j]);
}

// Whether a 1-row product of T takes row16_avx512 (bf16 only with the dot-product instruction: its
// widening fallback keeps the block path).
template <typename T>
constexpr bool row16_applies() {
#if defined(__AVX512BF16__)
  return std::is_same<T, float>::value || std::is_same<T, bf16>::value;
#else
  return std::is_same<T, float>::value;
#endif
}

// regw: the fp32 REGW form (callers pass it for products of more than MR rows; bf16 ignores it).
template <typename T, typename O>
inline void block_rows(const T* x, int64_t rows, int64_t K, const T* w, int64_t nr, O* out, int64_t ldo,
                       int64_t phase, int64_t period, bool regw) {
  with_rows(rows, [&](auto rows_c) {
    constexpr int R = decltype(rows_c)::value;
    if constexpr (std::is_same<T, float>::value)
      if (regw) return block_avx512_regw<R>(x, K, w, nr, out, ldo, phase, period);
    block_avx512<R, false>(x, K, w, nr, out, ldo, phase, period);
  });
}
#endif

// Weight blocks [b0, b1) (block b = rows 4b .. 4b + 3 of w, the last one partial): every x row against
// each block while the block is in L1. x [M, K], w [N, K], out [M, N], all contiguous. T: float, bf16 or
// f16 (x and w alike); O: the output element type (float, or bf16/f16 rounded to nearest even).
template <typename T, typename O>
inline void rowwise_linear_blocks(const T* x, int64_t M, int64_t K, const T* w, int64_t N, O* out, int64_t b0,
                                  int64_t b1) {
#if defined(__AVX512F__)
  if constexpr (row16_applies<T>())
    if (M == 1) {  // the blocks' rows, 16 at a time, then the rest in blocks of NR
      int64_t n = b0 * NR;
      const int64_t n1 = std::min<int64_t>(N, b1 * NR);
      for (; n + 16 <= n1; n += 16) row16_avx512<T, O>(x, K, w + n * K, out + n);
      for (; n < n1; n += NR) block_rows(x, 1, K, w + n * K, std::min<int64_t>(NR, n1 - n), out + n, N, 0, 1, false);
      return;
    }
#endif
  const int64_t groups = (M + MR - 1) / MR;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
    for (int64_t m = 0; m < M; m += MR) {
      const int64_t rows = std::min<int64_t>(MR, M - m);
#if defined(__AVX512F__)
      block_rows(x + m * K, rows, K, w + n * K, nr, out + m * N + n, N, m / MR, groups, groups > 1);
#else
      block_portable(x + m * K, rows, K, w + n * K, nr, out + m * N + n, N);
#endif
    }
  }
}

inline int64_t rowwise_linear_num_blocks(int64_t N) { return (N + NR - 1) / NR; }

// ---- weight-only int8 (a draft model's format; triforce/models/quant.py): w[n, k] = s[n, k / 32] *
// q[n, k], q int8, s float32 per group of kQ8Group consecutive k of a row (or, G = 16, per 16: NVFP4's groups, their
// codes doubled as int8). x and out are float32. Each
// weight is dequantised exactly (float(q) * s, one rounding) and then enters the same per-lane fp32
// accumulation and reduction tree as the float32 kernel, so row m of an M-row product is still bitwise
// the 1-row product of x[m]. A 1-row product reads 1.125 bytes per weight instead of 4 (float32) or 2
// (bfloat16).
constexpr int64_t kQ8Group = 32;
constexpr int64_t kPrefetchBlocksQ8 = 4;

inline int64_t q8_groups(int64_t K, int64_t G = kQ8Group) { return (K + G - 1) / G; }

#if defined(__AVX512F__)
inline __m512 dequant16(const int8_t* q, float s, __mmask16 mk) {
  const __m128i b = mk == __mmask16(0xffff) ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(q))
                                            : _mm_maskz_loadu_epi8(mk, q);
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(s));
}

template <int ROWS, int64_t GROUP>
inline void step_q8_avx512(const float* x, int64_t K, const int8_t* const* qr, const float* const* sr, int64_t k,
                           __mmask16 mk, __m512* acc) {
  __m512 wv[NR];
  for (int j = 0; j < NR; ++j) wv[j] = dequant16(qr[j] + k, sr[j][k / GROUP], mk);
  fma_rows_avx512<ROWS>(x, K, k, mk, wv, acc);
}

template <int ROWS, int64_t GROUP>
inline void block_q8_avx512(const float* x, int64_t K, const int8_t* q, const float* s, int64_t nr, float* out,
                            int64_t ldo, bool pf) {
  const int64_t G = q8_groups(K, GROUP), ahead = kPrefetchBlocksQ8 * NR * K;
  const int8_t* qr[NR];
  const float* sr[NR];
  for (int64_t j = 0; j < NR; ++j) {
    qr[j] = q + (j < nr ? j : 0) * K;
    sr[j] = s + (j < nr ? j : 0) * G;
  }
  __m512 acc[block_acc_count<ROWS>()];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (pf && k % 64 == 0)  // one 64-byte line of each row per 4 steps
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(qr[j] + k + ahead), _MM_HINT_T1);
    step_q8_avx512<ROWS, GROUP>(x, K, qr, sr, k, __mmask16(0xffff), acc);
  }
  if (k < K) step_q8_avx512<ROWS, GROUP>(x, K, qr, sr, k, static_cast<__mmask16>((1u << (K - k)) - 1u), acc);
  reduce_store_avx512<ROWS>(acc, nr, out, ldo);
}

#endif

// Weight blocks [b0, b1) of NR rows, as rowwise_linear_blocks. x [M, K], q [N, K], s [N, q8_groups(K, GROUP)],
// out [M, N], all contiguous. GROUP: 32 (kQ8Group) or 16 (a divisor of the 16 weights of a step).
template <int64_t GROUP = kQ8Group>
inline void rowwise_linear_q8_blocks(const float* x, int64_t M, int64_t K, const int8_t* q, const float* s,
                                     int64_t N, float* out, int64_t b0, int64_t b1) {
  static_assert(GROUP % 16 == 0, "a step's 16 weights share one scale");
  const int64_t G = q8_groups(K, GROUP);
#if defined(__AVX512F__)
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
    for (int64_t m = 0; m < M; m += MR) {
      with_rows(std::min<int64_t>(MR, M - m), [&](auto rows_c) {
        block_q8_avx512<decltype(rows_c)::value, GROUP>(x + m * K, K, q + n * K, s + n * G, nr, out + m * N + n, N,
                                                        m == 0);
      });
    }
  }
#else
  // portable: the block's weights dequantised (float(q) * s, one rounding) into a buffer, then the float32
  // kernel's portable loop on it: bitwise rowwise_linear on the dequantised weight, as the AVX-512 path
  std::vector<float> buf(static_cast<size_t>(NR * K));
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
    for (int64_t j = 0; j < nr; ++j)
      for (int64_t k = 0; k < K; ++k)
        buf[j * K + k] = static_cast<float>(q[(n + j) * K + k]) * s[(n + j) * G + k / GROUP];
    for (int64_t m = 0; m < M; m += MR)
      block_portable(x + m * K, std::min<int64_t>(MR, M - m), K, buf.data(), nr, out + m * N + n, N);
  }
#endif
}

// ---- FP8 (an FP8 checkpoint run on its own weights; triforce/models/quant.py, Fp8Linear): w[n, k] =
// e4m3fn(q[n, k]) * s[n, k / 64], s float32 per chunk of 64 consecutive k of a row (the checkpoint's block scales
// repeated for each row of a block and each chunk of its columns: its blocks' widths are multiples of 64, or one
// block a row). The codes are stored packed (quant.pack_fp8): each row padded with zero codes to a whole number of
// chunks of 64, and within a chunk code 16t + 4L + j at byte 16L + 4t + j (t, L, j < 4), the order in which two byte-table lookups and two
// rounds of unpacking turn 64 codes into four float32 vectors of 16 consecutive weights (fp8_decode64). x and out
// are float32. Each weight is its code's exact value (a bfloat16 from the tables: every e4m3fn value is one; 0x7f
// / 0xff NaN) times its scale in one float32 rounding (what torch's q.float() * s computes:
// loading.dequantize_fp8), and then enters the float32 kernel's lanes, steps of 16 and reduction tree: bitwise
// rowwise_linear of x with the dequantised float32 weight on every path (the paths that decode into a buffer run
// the float32 kernel itself on it). 1 byte per weight (plus 4 / bc for the scales) against 4.
constexpr int64_t kFp8Chunk = 64;
constexpr int64_t kPrefetchBlocksFp8 = 4;

inline int64_t fp8_chunks(int64_t K) { return (K + kFp8Chunk - 1) / kFp8Chunk; }
inline int64_t fp8_row_bytes(int64_t K) { return (K + kFp8Chunk - 1) / kFp8Chunk * kFp8Chunk; }
// The byte of a packed row that holds code k.
inline int64_t fp8_packed_index(int64_t k) {
  const int64_t c = k % kFp8Chunk;
  return k - c + 16 * ((c % 16) / 4) + 4 * (c / 16) + c % 4;
}

inline float fp8_e4m3fn_to_float(uint8_t b) {
  const uint32_t mag = b & 0x7Fu;
  float f;
  if (mag == 0x7Fu) {
    f = std::numeric_limits<float>::quiet_NaN();
  } else if (mag >= 8u) {  // normal: 2^(e - 7) * (1 + m / 8), the exponent field rebased by 120
    const uint32_t bits = (mag << 20) + (120u << 23);
    std::memcpy(&f, &bits, sizeof(f));
  } else {
    f = static_cast<float>(mag) * 0x1p-9f;  // subnormal: m * 2^-9 (exact)
  }
  return (b & 0x80u) ? -f : f;
}

// Every code's value, 256 floats (the portable and buffer paths' decode).
inline const float* fp8_values() {
  static const auto table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b) t[b] = fp8_e4m3fn_to_float(static_cast<uint8_t>(b));
    return t;
  }();
  return table.data();
}

// The nr rows' weights, decoded into w [nr, K] (natural order): code value * scale, one float32 rounding each.
inline void fp8_decode_rows_scalar(const uint8_t* q, const float* s, int64_t K, int64_t nr, float* w) {
  const float* values = fp8_values();
  const int64_t C = fp8_chunks(K), Kp = fp8_row_bytes(K);
  for (int64_t j = 0; j < nr; ++j)
    for (int64_t k = 0; k < K; ++k)
      w[j * K + k] = values[q[j * Kp + fp8_packed_index(k)]] * s[j * C + k / kFp8Chunk];
}

#if defined(__AVX512F__) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
// The two byte tables of the 128 magnitudes' bfloat16 bits (high and low bytes), each as two 64-byte halves.
struct Fp8Tables {
  __m512i hi0, hi1, lo0, lo1;
};

inline const Fp8Tables& fp8_tables() {
  static const Fp8Tables t = [] {
    alignas(64) uint8_t hi[128], lo[128];
    for (int m = 0; m < 128; ++m) {
      const float f = fp8_e4m3fn_to_float(static_cast<uint8_t>(m));
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      hi[m] = static_cast<uint8_t>(bits >> 24);
      lo[m] = static_cast<uint8_t>(bits >> 16);
    }
    return Fp8Tables{_mm512_load_si512(hi), _mm512_load_si512(hi + 64), _mm512_load_si512(lo),
                     _mm512_load_si512(lo + 64)};
  }();
  return t;
}

// 64 packed codes -> f[t] = the values of codes 16t .. 16t + 15 (float32, exact): the magnitudes' bfloat16 bytes
// by table (vpermi2b), the sign into the high byte, then bytes to words and words to float32's high halves
// (unpack), whose 128-bit lanes the packed order makes consecutive.
inline void fp8_decode64(const uint8_t* q, const Fp8Tables& tb, __m512 f[4]) {
  const __m512i c = _mm512_loadu_si512(q);
  const __m512i lo = _mm512_permutex2var_epi8(tb.lo0, c, tb.lo1);
  const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(tb.hi0, c, tb.hi1), c,
                                               _mm512_set1_epi8(char(0x80)), 0xF8);  // hi | (c & 0x80)
  const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi), z = _mm512_setzero_si512();
  f[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w0));
  f[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w0));
  f[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w1));
  f[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w1));
}

// ROWS (1 .. MR) rows of x against the block's NR weight rows, decoded in registers a chunk of 64 at a time: for each
// weight row its four vectors times the chunk's scale, then every x row's multiply-adds into that row's
// accumulators, k increasing (the accumulators' order is the float32 kernel's).
template <int ROWS>
inline void block_fp8_avx512(const float* x, int64_t K, const uint8_t* q, const float* s, int64_t nr, float* out,
                             int64_t ldo) {
  const Fp8Tables& tb = fp8_tables();
  const int64_t G = fp8_chunks(K), Kp = fp8_row_bytes(K), ahead = kPrefetchBlocksFp8 * NR * Kp;
  const uint8_t* qr[NR];
  const float* sr[NR];
  for (int64_t j = 0; j < NR; ++j) {
    qr[j] = q + (j < nr ? j : 0) * Kp;
    sr[j] = s + (j < nr ? j : 0) * G;
  }
  __m512 acc[block_acc_count<ROWS>()];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += kFp8Chunk) {
    const int64_t steps = std::min<int64_t>(4, (K - k0 + 15) / 16);
    constexpr int XR = ROWS <= 2 ? ROWS : 1;  // x rows held in registers across the chunk (more: read at each use)
    __m512 xv[XR][4];
    __mmask16 mk[4];
    for (int t = 0; t < 4; ++t) {
      const int64_t k = k0 + 16 * t, left = K - k;
      mk[t] = left >= 16 ? __mmask16(0xffff) : left > 0 ? static_cast<__mmask16>((1u << left) - 1u) : __mmask16(0);
      if constexpr (ROWS <= 2)
        for (int m = 0; m < ROWS; ++m) xv[m][t] = t < steps ? load16_f32(x + m * K + k, mk[t]) : _mm512_setzero_ps();
    }
    for (int j = 0; j < NR; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(qr[j] + k0 + ahead), _MM_HINT_T1);
      __m512 f[4];
      fp8_decode64(qr[j] + k0, tb, f);
      const __m512 sv = _mm512_set1_ps(sr[j][k0 / kFp8Chunk]);
      for (int t = 0; t < steps; ++t) {
        const __m512 w = _mm512_maskz_mul_ps(mk[t], f[t], sv);
        for (int m = 0; m < ROWS; ++m) {
          const __m512 xm = ROWS <= 2 ? xv[m < XR ? m : 0][t] : load16_f32(x + m * K + k0 + 16 * t, mk[t]);
          acc[m * NR + j] = _mm512_fmadd_ps(xm, w, acc[m * NR + j]);
        }
      }
    }
  }
  reduce_store_avx512<ROWS>(acc, nr, out, ldo);
}

// The block's nr rows decoded into w [nr, K] (natural order), a chunk of 64 at a time.
inline void fp8_decode_rows(const uint8_t* q, const float* s, int64_t K, int64_t nr, float* w) {
  const Fp8Tables& tb = fp8_tables();
  const int64_t C = fp8_chunks(K), Kp = fp8_row_bytes(K);
  for (int64_t j = 0; j < nr; ++j)
    for (int64_t k0 = 0; k0 < K; k0 += kFp8Chunk) {
      __m512 f[4];
      fp8_decode64(q + j * Kp + k0, tb, f);
      const __m512 sv = _mm512_set1_ps(s[j * C + k0 / kFp8Chunk]);
      for (int64_t t = 0; t < 4 && k0 + 16 * t < K; ++t) {
        const int64_t k = k0 + 16 * t, left = K - k;
        const __mmask16 mk = left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
        _mm512_mask_storeu_ps(w + j * K + k, mk, _mm512_mul_ps(f[t], sv));
      }
    }
}
#define TRIFORCE_FP8_TABLES 1
#endif

// Weight blocks [b0, b1) of NR rows, as rowwise_linear_blocks. x [M, K], q [N, fp8_row_bytes(K)] (packed e4m3fn
// codes), s [N, fp8_chunks(K)], out [M, N], all contiguous. With the byte tables (AVX-512
// VBMI) one or two rows of x decode the weights in registers (a decode step; the draft's); more rows decode each
// block of weight rows once into a buffer and run the float32 kernel on it (the same bits: that kernel on the same
// values), as every row count does elsewhere.
inline void rowwise_linear_fp8_blocks(const float* x, int64_t M, int64_t K, const uint8_t* q, const float* s,
                                      int64_t N, float* out, int64_t b0, int64_t b1) {
  const int64_t G = fp8_chunks(K), Kp = fp8_row_bytes(K);
#if defined(TRIFORCE_FP8_TABLES)
  if (M <= MR) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
      with_rows(M, [&](auto rows_c) {
        block_fp8_avx512<decltype(rows_c)::value>(x, K, q + n * Kp, s + n * G, nr, out + n, N);
      });
    }
    return;
  }
#endif
  std::vector<float> w(static_cast<size_t>(NR * K));  // the block's rows, decoded
  const int64_t groups = (M + MR - 1) / MR;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
#if defined(TRIFORCE_FP8_TABLES)
    // the codes of the block kPrefetchBlocksFp8 ahead, one line of each 64 (the decode below reads this block's)
    const int64_t ahead = std::min<int64_t>(N, n + kPrefetchBlocksFp8 * NR);
    for (int64_t r = ahead; r < std::min<int64_t>(N, ahead + NR); ++r)
      for (int64_t c = 0; c < Kp; c += kFp8Chunk) _mm_prefetch(reinterpret_cast<const char*>(q + r * Kp + c), _MM_HINT_T1);
    fp8_decode_rows(q + n * Kp, s + n * G, K, nr, w.data());
#else
    fp8_decode_rows_scalar(q + n * Kp, s + n * G, K, nr, w.data());
#endif
    for (int64_t m = 0; m < M; m += MR) {
      const int64_t rows = std::min<int64_t>(MR, M - m);
#if defined(__AVX512F__)
      // (w is the buffer, in L1: the kernel's prefetches, which stream the next block's weights, are off: its
      // phase is past its last step)
      block_rows(x + m * K, rows, K, w.data(), nr, out + m * N + n, N, K / 16 + 1, groups, groups > 1);
#else
      (void)groups;
      block_portable(x + m * K, rows, K, w.data(), nr, out + m * N + n, N);
#endif
    }
  }
}

// ---- Q4_1 (a model run from its GGUF file's Q4_1 weights; triforce/models/quant.py, Q4Linear): a row of K
// weights (K % 32 == 0) is K / 32 blocks of 24 bytes, [d float32][m float32][16 bytes of codes], weight i of a
// block d * q_i + m with q_i the low nibble of code byte i (i < 16) or the high nibble of byte i - 16: GGUF's
// Q4_1 block with its float16 d and m widened to float32 (exact), so that a block's scales are two
// broadcast loads. Each weight is dequantised in registers exactly as gguf's dequantize computes it and
// then enters the float32 kernel's lanes, steps of 16 and reduction tree, so the product is bitwise
// rowwise_linear of x with the dequantised float32 weight (and row m of an M-row product is the 1-row
// product of x[m]). 0.75 bytes per weight against 4 for float32.
constexpr int64_t kQ4Block = 32;       // weights per block
constexpr int64_t kQ4BlockBytes = 24;  // bytes per block
constexpr int64_t kPrefetchBlocksQ4 = 4;

inline int64_t q4_1_row_bytes(int64_t K) { return K / kQ4Block * kQ4BlockBytes; }

inline void q4_1_block_scales(const uint8_t* blk, float& d, float& m) {
  std::memcpy(&d, blk, 4);
  std::memcpy(&m, blk + 4, 4);
}

#if defined(__AVX512F__)
// The block's two steps of 16 weights (0-15, 16-31), dequantised exactly. The block's 16 possible weights
// d * q + m (q = 0..15) are one FMA: d * q (an 11-bit significand times 4 bits) is exact, so fma rounds
// d * q + m once, as gguf's float32 (d * q) + m. Each weight is then picked from them by its code
// (vpermps reads the low 4 bits of each lane: the low nibble as loaded, the high one after a shift).
inline void dequant_q4_1_block(const uint8_t* blk, __m512& lo, __m512& hi) {
  float d, m;
  q4_1_block_scales(blk, d, m);
  const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 table = _mm512_fmadd_ps(codes, _mm512_set1_ps(d), _mm512_set1_ps(m));
  const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8)));
  lo = _mm512_permutexvar_ps(raw, table);
  hi = _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table);
}

template <int ROWS>
inline void block_q4_1_avx512(const float* x, int64_t K, const uint8_t* w, int64_t nr, float* out, int64_t ldo) {
  const int64_t rb = q4_1_row_bytes(K), ahead = kPrefetchBlocksQ4 * NR * rb;
  const uint8_t* wr[NR];
  for (int64_t j = 0; j < NR; ++j) wr[j] = w + (j < nr ? j : 0) * rb;
  __m512 acc[block_acc_count<ROWS>()];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  const __mmask16 all = 0xffff;
  for (int64_t k = 0, off = 0; k < K; k += kQ4Block, off += kQ4BlockBytes) {
    if (off % 64 < kQ4BlockBytes)  // a 64-byte line of each row as the blocks cross into it
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr[j] + off + ahead), _MM_HINT_T1);
    __m512 lo[NR], hi[NR];
    for (int j = 0; j < NR; ++j) dequant_q4_1_block(wr[j] + off, lo[j], hi[j]);
    fma_rows_avx512<ROWS>(x, K, k, all, lo, acc);
    fma_rows_avx512<ROWS>(x, K, k + 16, all, hi, acc);
  }
  reduce_store_avx512<ROWS>(acc, nr, out, ldo);
}
// M = 1: 16 weight rows against the one row of x, 16 accumulators (one per weight row) and one hsum16, as
// row16_avx512 does for float32 (bitwise the block path: the same lanes, steps and tree). The next 16
// rows' lines are prefetched into L2 as the blocks cross them. Measured on one core (64 SmolLM2 1536 x 576
// matrices streamed): 4.60 -> 4.16 ms against the block path.
inline void row16_q4_1_avx512(const float* x, int64_t K, const uint8_t* w, float* out) {
  const int64_t rb = q4_1_row_bytes(K);
  __m512 acc[16];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (int64_t k = 0, off = 0; k < K; k += kQ4Block, off += kQ4BlockBytes) {
    if (off % 64 < kQ4BlockBytes)
      for (int j = 0; j < 16; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + (16 + j) * rb + off), _MM_HINT_T1);
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
    for (int j = 0; j < 16; ++j) {
      __m512 lo, hi;
      dequant_q4_1_block(w + j * rb + off, lo, hi);
      acc[j] = _mm512_fmadd_ps(x1, hi, _mm512_fmadd_ps(x0, lo, acc[j]));
    }
  }
  alignas(64) float sum[16];
  _mm512_store_ps(sum, hsum16_avx512(acc));
  for (int j = 0; j < 16; ++j) out[j] = sum[j];
}
#endif

// The rows' weights dequantised to float32, w [rows, K] (the reference arithmetic of the kernel above).
inline void dequant_q4_1_rows(const uint8_t* blocks, int64_t rows, int64_t K, float* w) {
  const int64_t rb = q4_1_row_bytes(K);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < K / kQ4Block; ++b) {
      const uint8_t* blk = blocks + r * rb + b * kQ4BlockBytes;
      float d, m;
      q4_1_block_scales(blk, d, m);
      float* o = w + r * K + b * kQ4Block;
      for (int i = 0; i < 16; ++i) {
        o[i] = std::fma(static_cast<float>(blk[8 + i] & 0x0f), d, m);
        o[i + 16] = std::fma(static_cast<float>(blk[8 + i] >> 4), d, m);
      }
    }
}

#if defined(__AVX512F__)
// nr rows of blocks dequantised into w [nr, K] (the values block_q4_1_avx512 computes in registers), the
// next NR rows' lines prefetched into L2 meanwhile.
inline void dequant_q4_1_rows_avx512(const uint8_t* blocks, int64_t nr, int64_t K, float* w) {
  const int64_t rb = q4_1_row_bytes(K);
  for (int64_t r = 0; r < nr; ++r) {
    const uint8_t* row = blocks + r * rb;
    for (int64_t off = 0; off < rb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(row + NR * rb + off), _MM_HINT_T1);
    for (int64_t b = 0; b < K / kQ4Block; ++b) {
      __m512 lo, hi;
      dequant_q4_1_block(row + b * kQ4BlockBytes, lo, hi);
      _mm512_storeu_ps(w + r * K + b * kQ4Block, lo);
      _mm512_storeu_ps(w + r * K + b * kQ4Block + 16, hi);
    }
  }
}
#endif

// Weight blocks [b0, b1) of NR rows, as rowwise_linear_blocks. x [M, K] float32 (K % 32 == 0), w [N,
// q4_1_row_bytes(K)] bytes, out [M, N] float32, all contiguous. Up to MR rows of x (a decode step, a short
// verification pass) each block's weights are dequantised in registers for the one group of rows; from
// MR + 1 rows on a block is dequantised once into a buffer (NR rows of float32, in L1/L2) and every group
// of rows runs the float32 kernel on it, as the portable path always does. Either way the arithmetic is
// the float32 kernel's on the dequantised weight: bitwise rowwise_linear_blocks<float>.
inline void rowwise_linear_q4_1_blocks(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* out,
                                       int64_t b0, int64_t b1) {
  const int64_t rb = q4_1_row_bytes(K);
#if defined(__AVX512F__)
  if (M == 1) {  // the blocks' rows, 16 at a time, then the rest in blocks of NR
    int64_t n = b0 * NR;
    const int64_t n1 = std::min<int64_t>(N, b1 * NR);
    for (; n + 16 <= n1; n += 16) row16_q4_1_avx512(x, K, w + n * rb, out + n);
    for (; n < n1; n += NR)
      block_q4_1_avx512<1>(x, K, w + n * rb, std::min<int64_t>(NR, n1 - n), out + n, N);
    return;
  }
  if (M <= MR) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
      with_rows(M, [&](auto rows_c) {
        block_q4_1_avx512<decltype(rows_c)::value>(x, K, w + n * rb, nr, out + n, N);
      });
    }
    return;
  }
#endif
  std::vector<float> buf(static_cast<size_t>(NR * K));
  const int64_t groups = (M + MR - 1) / MR;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b * NR, nr = std::min<int64_t>(NR, N - n);
#if defined(__AVX512F__)
    dequant_q4_1_rows_avx512(w + n * rb, nr, K, buf.data());
    for (int64_t m = 0; m < M; m += MR)
      block_rows(x + m * K, std::min<int64_t>(MR, M - m), K, buf.data(), nr, out + m * N + n, N, m / MR, groups,
                 groups > 1);
#else
    dequant_q4_1_rows(w + n * rb, nr, K, buf.data());
    for (int64_t m = 0; m < M; m += MR)
      block_portable(x + m * K, std::min<int64_t>(MR, M - m), K, buf.data(), nr, out + m * N + n, N);
#endif
  }
}

}  // namespace linear
}  // namespace triforce
