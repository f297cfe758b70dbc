// Soft-capping of attention scores (Gemma 2): cap * tanh(x / cap), elementwise. Torch-free.
//
// tanh(t): below |t| = 0.3 its odd Taylor polynomial to t^13 (the next term is under 1e-10 of t there),
// above (1 - e) / (1 + e) with e = e^(-2|t|) and the sign of t put back (1 - e >= 0.45 there: no cancellation).
// Within 4 ulp of the exact cap * tanh(x / cap). Every element of a build goes through the same instructions: the AVX-512 form, 16 lanes with a masked
// tail, where the build has AVX-512, else the scalar form. So a capped score depends on that score alone, and
// the verification attention's rows stay independent of the pass they are in (docs/attention.md).
#pragma once
#include <cmath>
#include <cstdint>

#include "triforce/common.h"  // exp_f32

namespace triforce {

constexpr float kTanhSmall = 0.3f;
// tanh t = t + c3 t^3 + c5 t^5 + ... + c13 t^13 + O(t^15)
constexpr float kTanhC3 = -1.f / 3, kTanhC5 = 2.f / 15, kTanhC7 = -17.f / 315, kTanhC9 = 62.f / 2835,
                kTanhC11 = -1382.f / 155925, kTanhC13 = 21844.f / 6081075;

#if defined(__AVX512F__)
inline __m512 softcap16(__m512 x, __m512 cap) {
  const __m512 t = _mm512_div_ps(x, cap);
  const __m512 sign = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(t), _mm512_set1_epi32(INT32_MIN)));
  const __m512 a = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(t), _mm512_castps_si512(sign)));
  const __m512 u = _mm512_mul_ps(t, t);
  __m512 p = _mm512_set1_ps(kTanhC13);
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(kTanhC11));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(kTanhC9));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(kTanhC7));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(kTanhC5));
  p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(kTanhC3));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, u), t, t);
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = exp_f32(_mm512_mul_ps(a, _mm512_set1_ps(-2.f)));
  const __m512 big = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(_mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e))), _mm512_castps_si512(sign)));
  const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(kTanhSmall), _CMP_LT_OQ);
  return _mm512_mul_ps(_mm512_mask_mov_ps(big, is_small, small), cap);
}
#else
inline float softcap_scalar(float x, float cap) {
  const float t = x / cap, a = std::fabs(t), u = t * t;
  if (a < kTanhSmall) {
    float p = std::fma(kTanhC13, u, kTanhC11);
    p = std::fma(p, u, kTanhC9);
    p = std::fma(p, u, kTanhC7);
    p = std::fma(p, u, kTanhC5);
    p = std::fma(p, u, kTanhC3);
    return std::fma(p * u, t, t) * cap;
  }
  const float e = exp_f32(a * -2.f);
  return std::copysign((1.f - e) / (1.f + e), t) * cap;
}
#endif

// s[i] = cap * tanh(s[i] / cap) for i < n.
inline void softcap_inplace(float* s, int64_t n, float cap) {
#if defined(__AVX512F__)
  const __m512 c = _mm512_set1_ps(cap);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, softcap16(_mm512_loadu_ps(s + i), c));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(s + i, m, softcap16(_mm512_maskz_loadu_ps(m, s + i), c));
  }
#else
  for (int64_t i = 0; i < n; ++i) s[i] = softcap_scalar(s[i], cap);
#endif
}

}  // namespace triforce
