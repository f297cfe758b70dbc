// The gated MLPs' elementwise step, act(gate) * up, with one arithmetic for every element: SwiGLU's SiLU
// (Llama, Mistral, Qwen), GeGLU's GELU in its tanh form (Gemma) and the exact GELU (GPT-NeoX's ungated MLP, as
// act(x) * 1). Torch-free.
//
// Why not ATen's SiLU / GELU: their CPU kernels take a tensor's elements through a vectorised loop (Sleef's
// exp / tanh) in pieces of 32 (float32) or 64 (16-bit) and the pieces' remainders through a scalar loop
// (libm's), which rounds differently; the pieces are cut from the tensor flattened and split among the
// threads. So a row's elements may round one way in a pass of 5 rows and another way alone, by the width (an
// MLP 80 wide: 95 of 200 rows differed) and by the thread count (Qwen2.5's 4864 on 3 threads: 5 of 186; on
// 7: 11), which breaks the promise that a verification pass computes the bits of one-token steps
// (docs/engines.md, "Exact in the algorithm, and in floating point"). Here each row is its own loop, and
// every element of it, the last ones included, goes through the same instructions: 16 lanes at a time with
// masked loads and stores where AVX-512 is compiled in, else the scalar form, which gives the same bits lane
// for lane in the same build (csrc/tests/test_glu.cpp checks it).
//
// Both activations are x / (1 + e^t): SiLU(x) = x / (1 + e^-x), PyTorch's formula; GELU's tanh form
// 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), is the same value as x / (1 + e^(-2u)) (1 + tanh(u)
// = 2 / (1 + e^(-2u))), which has no cancellation where tanh(u) is near -1. e^t comes from common.h's
// reduction and polynomial (~1 ulp, as Sleef's), t clamped to [kExpMin, 88.75]: below kExpMin e^t < 2^-126
// leaves 1 + e^t = 1, and above ln(FLT_MAX) = 88.72 e^t is inf (x / inf = -0, as PyTorch's SiLU of x < -88.7
// and GELU of x < -10). NaN propagates through the division, +inf gives +inf and -inf NaN, as PyTorch's.
//
// The exact GELU, x * Phi(x) (Phi the standard normal's distribution function; PyTorch's x / 2 (1 + erf(x /
// sqrt 2))), with a = |x|: Phi = Q (x < 0) or 1 - Q, Q = e^(-a^2/2) R(3 / (3 + a)) the upper tail (1/2 at 0), so
// the negative side has no cancellation (PyTorch's 1 + erf(x / sqrt 2) is 0 in float from x = -5.9 on; here GELU
// is the tail's value down to x = -13.2, then -0). R is fitted by scripts/fit_gelu_erf.py (within 5.6 ulp of the
// exact value in its float32 model; test_glu.cpp measures 5 for the kernel); e^(-a^2/2) takes a^2 as hi + lo (fma) so
// that its rounding does not scale the exponent's error by a^2. a >= 13.25 (inf too) gives Q = 0: GELU(+inf) =
// inf, GELU(-inf) = -inf * 0 = NaN (PyTorch's scalar loop's values; its vectorised one gives NaN for +inf).
//
// Rounding as the modules' act(gate) * up: the activation in float32 rounded to the element type, times up in
// float32, rounded to the element type (bfloat16 and float16 to nearest even).
//
// GPT-OSS's experts' clamped SwiGLU (Act::kSwigluClamped, with alpha and limit: SwigluClamp) is one more:
// (clamp(up, -limit, limit) + 1) * (g * sigmoid(g * alpha)), g = min(gate, limit), each step rounded to the
// element type as transformers' ops in that type round it (the clamps against the limit rounded to it, as ATen's
// clamp converts its bound; NaN passes both clamps; sigmoid(z) = 1 / (1 + e^-z) through the same e^t, NaN for
// NaN), so a row's bits are its own here too where ATen's sigmoid would not give them.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.h"

namespace triforce {

constexpr float kSiluExpMax = 88.75f;  // e^t is inf beyond ln(FLT_MAX) = 88.7228; k = 128 here
constexpr float kGeluKappa = 0.044715f;
constexpr float kGeluMinusTwoBeta = -1.5957691216057308f;  // -2 sqrt(2 / pi)

// x / (1 + e^t)
inline float div_one_plus_exp(float x, float t) {
  t = t > kExpMin ? (t < kSiluExpMax ? t : kSiluExpMax) : kExpMin;  // NaN -> kExpMin; x / ... is NaN
  const float k = std::nearbyint(t * kExpLog2e);  // the product rounded first (no FMA), to nearest even
  const float p = exp_reduced(t, k);
  // p * 2^k in two exact scalings (2^128 is no float): one rounding, as AVX-512's scalef
  const int32_t ki = static_cast<int32_t>(k), k1 = ki / 2, k2 = ki - k1;
  const float e = p * __builtin_bit_cast(float, static_cast<uint32_t>(k1 + 127) << 23) *
                  __builtin_bit_cast(float, static_cast<uint32_t>(k2 + 127) << 23);
  return x / (1.f + e);
}

enum class Act { kSilu, kGeluTanh, kSwigluClamped, kGelu };

// The exact GELU's fit (scripts/fit_gelu_erf.py prints it): the tail's R(t), highest power first
constexpr float kGeluTop = 13.25f, kGeluTailC = 3.f;
constexpr float kGeluTail[12] = {0.0182230584f, -0.112874605f, 0.28164804f,    -0.339921743f,
                                 0.186044842f,  -0.0740252212f, 0.071181111f,  0.0853860751f,
                                 0.11834693f,   0.133016557f,   0.132974654f,  2.98919417e-07f};

// c[0] x^(N-1) + ... + c[N-1] by Horner's rule, one fma a step (the same bits on a float and on 16 lanes)
template <int N>
inline float horner(const float (&c)[N], float x) {
  float p = c[0];
  for (int i = 1; i < N; ++i) p = std::fma(p, x, c[i]);
  return p;
}

// x * Phi(x) (see the top of the file): the same steps as the AVX-512 form below, one for one
inline float gelu_f32(float x) {
  const float a = std::fabs(x);
  const float ac = a < kGeluTop ? a : kGeluTop;  // (inf and NaN: the tail's value unused below)
  const float hi = ac * ac, lo = std::fma(ac, ac, -hi);
  const float e = exp_f32(-0.5f * hi);
  const float r = horner(kGeluTail, kGeluTailC / (kGeluTailC + ac));
  const float q = a < kGeluTop ? std::fma(e, -0.5f * lo, e) * r : 0.f;
  return x * (x < 0.f ? q : 1.f - q);
}

// Act::kSwigluClamped's constants (unused by the others)
struct SwigluClamp {
  float alpha = 0.f, limit = 0.f;
};

// v rounded to the element type S, as float32 (exact)
template <typename S>
inline float round_to(float v) {
  return to_float(from_float<S>(v));
}

// GPT-OSS's clamped SwiGLU of one element, every step but the last rounded to S (the caller rounds the result);
// lim: the limit rounded to S
template <typename S>
inline float swiglu_clamped_f32(float gate, float up, float alpha, float lim) {
  const float g = lim < gate ? lim : gate;  // NaN stays (ATen's min(a, bound))
  const float u = lim < up ? lim : (up < -lim ? -lim : up);
  const float z = round_to<S>(g * alpha);
  const float s = z != z ? z : round_to<S>(div_one_plus_exp(1.f, -z));
  return round_to<S>(u + 1.f) * round_to<S>(g * s);
}

template <Act A>
inline float act_f32(float x) {
  if constexpr (A == Act::kSilu) {
    return div_one_plus_exp(x, -x);
  } else if constexpr (A == Act::kGelu) {
    return gelu_f32(x);
  } else {
    const float x3 = x * x * x;
    return div_one_plus_exp(x, kGeluMinusTwoBeta * std::fma(kGeluKappa, x3, x));
  }
}

#if defined(__AVX512F__)
inline __m512 div_one_plus_exp(__m512 x, __m512 t) {
  t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kSiluExpMax));
  const __m512 k = _mm512_roundscale_ps(t * kExpLog2e, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 e = _mm512_scalef_ps(exp_reduced(t, k), k);
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

template <int N>
inline __m512 horner(const float (&c)[N], __m512 x) {
  __m512 p = _mm512_set1_ps(c[0]);
  for (int i = 1; i < N; ++i) p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(c[i]));
  return p;
}

inline __m512 gelu_f32(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f), top = _mm512_set1_ps(kGeluTop);
  const __m512 a = _mm512_abs_ps(x);
  const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __mmask16 below_top = _mm512_cmp_ps_mask(a, top, _CMP_LT_OQ);
  const __m512 ac = _mm512_mask_mov_ps(top, below_top, a);
  const __m512 hi = _mm512_mul_ps(ac, ac), lo = _mm512_fmsub_ps(ac, ac, hi);
  const __m512 e = exp_f32(_mm512_mul_ps(_mm512_set1_ps(-0.5f), hi));
  const __m512 tc = _mm512_set1_ps(kGeluTailC);
  const __m512 r = horner(kGeluTail, _mm512_div_ps(tc, _mm512_add_ps(tc, ac)));
  const __m512 q = _mm512_maskz_mov_ps(
      below_top, _mm512_mul_ps(_mm512_fmadd_ps(e, _mm512_mul_ps(_mm512_set1_ps(-0.5f), lo), e), r));
  return _mm512_mul_ps(x, _mm512_mask_mov_ps(_mm512_sub_ps(one, q), neg, q));
}

template <Act A>
inline __m512 act_f32(__m512 x) {
  if constexpr (A == Act::kSilu) {
    return div_one_plus_exp(x, _mm512_sub_ps(_mm512_setzero_ps(), x));
  } else if constexpr (A == Act::kGelu) {
    return gelu_f32(x);
  } else {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 inner = _mm512_fmadd_ps(_mm512_set1_ps(kGeluKappa), x3, x);
    return div_one_plus_exp(x, _mm512_mul_ps(_mm512_set1_ps(kGeluMinusTwoBeta), inner));
  }
}

// n <= 16 elements as float32, and float32 rounded to 16 bits as from_float does (nearest even; NaN quiet,
// bfloat16 keeping the payload's top bits, float16 as the sign and 0x7e00).
inline __m512 load_n(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 widen(const bf16*, __m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 widen(const f16*, __m256i h) { return _mm512_cvtph_ps(h); }
template <typename S>
inline __m512 load_n(const S* p, __mmask16 m) { return widen(p, _mm256_maskz_loadu_epi16(m, p)); }

inline __m256i narrow(const bf16*, __m512 v) {
  const __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
  const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40))));
}
inline __m256i narrow(const f16*, __m512 v) {
  const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m256i sign = _mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0x8000)));
  return _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
}

inline void store_n(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
template <typename S>
inline void store_n(S* p, __mmask16 m, __m512 v) { _mm256_mask_storeu_epi16(p, m, narrow(p, v)); }

// v rounded to the element type S, as float32 (exact)
template <typename S>
inline __m512 round_to(__m512 v) {
  if constexpr (std::is_same_v<S, float>) {
    return v;
  } else {
    return widen(static_cast<const S*>(nullptr), narrow(static_cast<const S*>(nullptr), v));
  }
}

// The clamped SwiGLU of 16 elements (swiglu_clamped_f32's steps lane for lane)
template <typename S>
inline __m512 swiglu_clamped_f32(__m512 gate, __m512 up, __m512 alpha, __m512 lim) {
  const __m512 g = _mm512_min_ps(lim, gate);  // lim < gate ? lim : gate
  const __m512 u = _mm512_min_ps(lim, _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), lim), up));
  const __m512 z = round_to<S>(_mm512_mul_ps(g, alpha));
  __m512 s = round_to<S>(div_one_plus_exp(_mm512_set1_ps(1.f), _mm512_sub_ps(_mm512_setzero_ps(), z)));
  s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q), z);
  return _mm512_mul_ps(round_to<S>(_mm512_add_ps(u, _mm512_set1_ps(1.f))), round_to<S>(_mm512_mul_ps(g, s)));
}
#endif

// out[i] = S(float(S(act(gate[i]))) * float(up[i])) for i < n, one element at a time (Act::kSwigluClamped:
// S(swiglu_clamped_f32(gate[i], up[i]))); out may be gate.
template <Act A, typename S>
inline void glu_row_scalar(const S* gate, const S* up, S* out, int64_t n, SwigluClamp c = {}) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (A == Act::kSwigluClamped) {
      const float lim = round_to<S>(c.limit);
      out[i] = from_float<S>(swiglu_clamped_f32<S>(to_float(gate[i]), to_float(up[i]), c.alpha, lim));
    } else {
      const float a = to_float(from_float<S>(act_f32<A>(to_float(gate[i]))));
      out[i] = from_float<S>(a * to_float(up[i]));
    }
  }
}

// The same, 16 elements at a time where AVX-512 is compiled in (the same bits: test_glu.cpp).
template <Act A, typename S>
inline void glu_row(const S* gate, const S* up, S* out, int64_t n, SwigluClamp c = {}) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    if constexpr (A == Act::kSwigluClamped) {  // (the constants hoisted out of the loop by the compiler)
      const __m512 alpha = _mm512_set1_ps(c.alpha), lim = _mm512_set1_ps(round_to<S>(c.limit));
      store_n(out + i, m, swiglu_clamped_f32<S>(load_n(gate + i, m), load_n(up + i, m), alpha, lim));
    } else {
      const __m512 a = round_to<S>(act_f32<A>(load_n(gate + i, m)));
      store_n(out + i, m, _mm512_mul_ps(a, load_n(up + i, m)));
    }
  }
#else
  glu_row_scalar<A>(gate, up, out, n, c);
#endif
}

}  // namespace triforce
