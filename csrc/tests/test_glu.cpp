// Torch-free unit test of act(gate) * up (csrc/include/triforce/glu.h, ctest), for SiLU, GELU's tanh form and the
// exact GELU:
// the AVX-512 form gives the scalar form's bits for every float tried (a sweep of bit patterns, the clamp's
// edges, inf, NaN) and, per element type, for every row length 0-70 (the masked last lanes), nothing written
// past a row; the activations within a few ulp of the exact value; the special values; each step rounded to
// the element type; in place (out = gate) the same.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "check.h"
#include "triforce/glu.h"

using namespace triforce;

namespace {

const float inf = std::numeric_limits<float>::infinity(), qnan = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) { return __builtin_bit_cast(uint32_t, f); }
float from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// ulps between two finite floats (the ordered integer map)
int64_t ulps(float a, float b) {
  const auto key = [](float f) {
    const int64_t u = bits(f) & 0x7fffffffu;
    return (bits(f) >> 31) ? -u : u;
  };
  return std::llabs(key(a) - key(b));
}

long double exact(Act a, float x) {  // x / (1 + e^t) in long double
  const long double xl = x;
  if (a == Act::kSilu) return xl / (1.0L + std::exp(-xl));
  const long double u = std::sqrt(2.0L / 3.14159265358979323846L) * (xl + 0.044715L * xl * xl * xl);
  return xl / (1.0L + std::exp(-2.0L * u));
}

template <typename S>
S make(float v) { return from_float<S>(v); }

template <typename S>
bool same_bits(const std::vector<S>& a, const std::vector<S>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(S)) == 0);
}

// GPT-OSS's clamped SwiGLU of one element, op by op as transformers' ops in the element type S compute it, the
// sigmoid through the activations' x / (1 + e^t): S(S(clamp(up, -l, l) + 1) * S(g * S(sigmoid(S(g * alpha))))),
// g = min(gate, l), l the limit rounded to S
template <typename S>
float swiglu_definition(float gate, float up, SwigluClamp c) {
  const float l = to_float(from_float<S>(c.limit));
  const float g = std::isnan(gate) ? gate : std::min(gate, l);
  const float u = std::isnan(up) ? up : std::min(std::max(up, -l), l);
  const float z = to_float(from_float<S>(g * c.alpha));
  const float sig = std::isnan(z) ? z : to_float(from_float<S>(div_one_plus_exp(1.f, -z)));
  const float a = to_float(from_float<S>(g * sig)), b = to_float(from_float<S>(u + 1.f));
  return to_float(from_float<S>(b * a));
}

// every row length 0-70, values over the whole range of the activation's behaviour (and a NaN, infs): the row
// function against the scalar one, out of place and in place, and each element against its definition
template <Act A, typename S>
int rows_check(std::mt19937& rng, SwigluClamp c = {}) {
  int bad = 0;
  std::normal_distribution<float> normal(0.f, 6.f);
  const float specials[] = {0.f, -0.f, 1e-30f, -1e-30f, 87.f, -87.5f, 88.7f, -88.7f, 89.f, -89.f, 200.f, -200.f,
                            inf, -inf, qnan};
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<S> gate(n), up(n), out, ref(n);
    for (int64_t i = 0; i < n; ++i) {
      gate[i] = make<S>(i % 7 == 3 ? specials[(i / 7 + n) % 15] : normal(rng));
      up[i] = make<S>(i % 5 == 2 ? specials[(i / 5 + 2 * n) % 15] : normal(rng));
    }
    std::vector<S> guarded(n + 16, make<S>(-7.f));  // nothing written past the row's end
    glu_row<A>(gate.data(), up.data(), guarded.data(), n, c);
    for (int64_t i = n; i < n + 16; ++i) bad += to_float(guarded[i]) != -7.f;
    out.assign(guarded.begin(), guarded.begin() + n);
    glu_row_scalar<A>(gate.data(), up.data(), ref.data(), n, c);
    bad += !same_bits(out, ref);
    for (int64_t i = 0; i < n; ++i) {  // the definition, element by element
      float want;
      if constexpr (A == Act::kSwigluClamped) {
        want = swiglu_definition<S>(to_float(gate[i]), to_float(up[i]), c);
      } else {
        const float act = to_float(from_float<S>(act_f32<A>(to_float(gate[i]))));
        want = to_float(from_float<S>(act * to_float(up[i])));
      }
      const float got = to_float(out[i]);
      bad += !(bits(want) == bits(got) || (std::isnan(want) && std::isnan(got)));
    }
    std::vector<S> inplace = gate;
    glu_row<A>(inplace.data(), up.data(), inplace.data(), n, c);
    bad += !same_bits(inplace, ref);
  }
  return bad;
}

#if defined(__AVX512F__)
// the vector form against the scalar one, lane for lane: every 61st bit pattern (both signs, NaN and inf
// included) and the clamp's edges
template <Act A>
int64_t lanes_differ() {
  int64_t differ = 0;
  alignas(64) float x[16], got[16];
  const auto check = [&] {
    _mm512_store_ps(got, act_f32<A>(_mm512_load_ps(x)));
    for (int j = 0; j < 16; ++j) differ += bits(got[j]) != bits(act_f32<A>(x[j]));
  };
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 61 * 16) {
    for (int j = 0; j < 16; ++j) x[j] = from_bits(static_cast<uint32_t>(b + 61 * j));
    check();
  }
  for (float edge : {kExpMin, kSiluExpMax, 88.7228f, -88.7228f, 88.72284f, -88.72284f, 87.33654f, -87.33654f,
                     -9.8f, -10.f, -10.2f, 9.8f, kGeluTop, -kGeluTop, 13.217f, -13.217f, 0.f, -0.f}) {
    for (int j = 0; j < 16; ++j) x[j] = std::nextafter(edge, j < 8 ? -inf : inf) + (j % 8) * 1e-5f;
    check();
  }
  return differ;
}

// the clamped SwiGLU's vector form against its scalar one, lane for lane, in float32 and rounded to S: gate over
// every 61st bit pattern, up over another sweep, the limit's and the sigmoid's edges
template <typename S>
int64_t swiglu_lanes_differ(SwigluClamp c) {
  int64_t differ = 0;
  alignas(64) float g[16], u[16], got[16];
  const __m512 alpha = _mm512_set1_ps(c.alpha), lim = _mm512_set1_ps(round_to<S>(c.limit));
  const auto check = [&] {
    _mm512_store_ps(got, round_to<S>(swiglu_clamped_f32<S>(_mm512_load_ps(g), _mm512_load_ps(u), alpha, lim)));
    for (int j = 0; j < 16; ++j) {  // (where both factors of the last product are NaN, either's NaN may come out:
      // the compiler orders the scalar form's product as it likes)
      const float want = round_to<S>(swiglu_clamped_f32<S>(g[j], u[j], c.alpha, round_to<S>(c.limit)));
      differ += bits(got[j]) != bits(want) && !(std::isnan(want) && std::isnan(got[j]));
    }
  };
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 61 * 16 * 7) {
    for (int j = 0; j < 16; ++j) {
      g[j] = round_to<S>(from_bits(static_cast<uint32_t>(b + 61 * 7 * j)));
      u[j] = round_to<S>(from_bits(static_cast<uint32_t>(b * 2654435761u + 977 * j)));
    }
    check();
  }
  for (float edge : {c.limit, -c.limit, kExpMin / c.alpha, kSiluExpMax / c.alpha, -kExpMin / c.alpha,
                     -kSiluExpMax / c.alpha, 0.f, -1.f}) {
    for (int j = 0; j < 16; ++j) {
      g[j] = round_to<S>(std::nextafter(edge, j < 8 ? -inf : inf) + (j % 8) * 1e-5f);
      u[j] = round_to<S>(std::nextafter(edge, j < 8 ? inf : -inf) - (j % 8) * 1e-5f);
    }
    check();
  }
  return differ;
}
#endif

}  // namespace

int main() {
  // SiLU within 2 ulp of x / (1 + e^-x) wherever e^-x is a float and the result a normal one; below -88.72,
  // e^-x is inf in float and SiLU -0, as PyTorch's
  int64_t worst = 0, not_zero = 0;
  for (float x = -100.f; x <= 100.f; x += 0.003f) {
    const float got = act_f32<Act::kSilu>(x);
    if (x < -88.7229f) {
      not_zero += !(got == 0.f && std::signbit(got));
      continue;
    }
    const int64_t u = ulps(got, static_cast<float>(exact(Act::kSilu, x)));
    worst = u > worst ? u : worst;
  }
  std::printf("SiLU: at most %lld ulp from the exact value\n", static_cast<long long>(worst));
  EXPECT(worst <= 2);
  EXPECT(not_zero == 0);
  // GELU (tanh form): within 12 ulp where |x| <= 3 (e^t's argument t carries the roundings of x^3 and of the
  // constants' products, a few ulp of |t| <= 7 there), and everywhere within 2^-22 |x| (about 2 ulp of x)
  int64_t worst_near = 0;
  double worst_far = 0;
  for (float x = -30.f; x <= 30.f; x += 0.0007f) {
    const float got = act_f32<Act::kGeluTanh>(x);
    const long double want = exact(Act::kGeluTanh, x);
    if (std::fabs(x) <= 3.f && std::fabs(static_cast<double>(want)) > 1e-30) {
      const int64_t u = ulps(got, static_cast<float>(want));
      worst_near = u > worst_near ? u : worst_near;
    }
    const double far = static_cast<double>(std::fabs(got - want) / std::fabs(x));
    worst_far = far > worst_far ? far : worst_far;
  }
  std::printf("GELU: at most %lld ulp where |x| <= 3, |error| / |x| at most %.3g\n",
              static_cast<long long>(worst_near), worst_far);
  EXPECT(worst_near <= 12);
  EXPECT(worst_far <= std::ldexp(1.0, -22));
  // the exact GELU: within 6 ulp of x erfc(-x / sqrt 2) / 2 wherever that is a normal float (x >= -13.1; 5.6 in
  // scripts/fit_gelu_erf.py's float32 model of it, 5 measured here); -0 from the tail's end on
  int64_t worst_erf = 0, erf_not_zero = 0;
  for (float x = -14.f; x <= 30.f; x += 0.0009f) {
    const float got = act_f32<Act::kGelu>(x);
    if (x <= -kGeluTop) {
      erf_not_zero += !(got == 0.f && std::signbit(got));
      continue;
    }
    const long double xl = x, want = xl * std::erfc(-xl / std::sqrt(2.0L)) / 2;
    if (std::fabs(static_cast<double>(want)) < 1e-37) continue;  // (subnormal results: no ulp measure)
    const int64_t u = ulps(got, static_cast<float>(want));
    worst_erf = u > worst_erf ? u : worst_erf;
  }
  std::printf("exact GELU: at most %lld ulp from the exact value\n", static_cast<long long>(worst_erf));
  EXPECT(worst_erf <= 6);
  EXPECT(erf_not_zero == 0);
  EXPECT(act_f32<Act::kGelu>(0.f) == 0.f && !std::signbit(act_f32<Act::kGelu>(0.f)));
  EXPECT(act_f32<Act::kGelu>(inf) == inf);
  EXPECT(std::isnan(act_f32<Act::kGelu>(-inf)));  // -inf * 0, as PyTorch's
  EXPECT(std::isnan(act_f32<Act::kGelu>(qnan)));
  EXPECT(act_f32<Act::kGelu>(20.f) == 20.f && act_f32<Act::kGelu>(1e30f) == 1e30f);
  EXPECT(act_f32<Act::kGelu>(-8.f) < 0.f);  // the tail: -8 * 6.2e-16, where PyTorch's 1 + erf is 0
  // special values as PyTorch's: SiLU's x / (1 + exp(-x)); GELU -0 far below 0, x far above
  EXPECT(act_f32<Act::kSilu>(0.f) == 0.f);
  EXPECT(act_f32<Act::kSilu>(inf) == inf);
  EXPECT(std::isnan(act_f32<Act::kSilu>(-inf)));
  EXPECT(std::isnan(act_f32<Act::kSilu>(qnan)));
  EXPECT(act_f32<Act::kSilu>(-100.f) == 0.f && std::signbit(act_f32<Act::kSilu>(-100.f)));
  EXPECT(act_f32<Act::kSilu>(100.f) == 100.f);
  EXPECT(act_f32<Act::kSilu>(1e30f) == 1e30f);
  EXPECT(act_f32<Act::kSilu>(-88.5f) < 0.f);  // e^88.5 is finite: -88.5 / 2.7e38, not -0
  EXPECT(act_f32<Act::kGeluTanh>(0.f) == 0.f);
  EXPECT(act_f32<Act::kGeluTanh>(inf) == inf);
  EXPECT(std::isnan(act_f32<Act::kGeluTanh>(-inf)));  // -inf / inf, as PyTorch's -inf * 0
  EXPECT(std::isnan(act_f32<Act::kGeluTanh>(qnan)));
  EXPECT(act_f32<Act::kGeluTanh>(-20.f) == 0.f && std::signbit(act_f32<Act::kGeluTanh>(-20.f)));
  EXPECT(act_f32<Act::kGeluTanh>(20.f) == 20.f);
  EXPECT(act_f32<Act::kGeluTanh>(1e30f) == 1e30f);
  // the clamped SwiGLU's sigmoid 1 / (1 + e^-z) within 2 ulp of the exact value where it is a normal float, 0
  // below (e^-z inf in float) and 1 above; its special values as transformers' ops give them
  int64_t worst_sigmoid = 0;
  for (float z = -90.f; z <= 30.f; z += 0.0013f) {
    const float got = div_one_plus_exp(1.f, -z);
    if (z < -88.7229f) {
      worst_sigmoid = got == 0.f ? worst_sigmoid : 1000;
      continue;
    }
    const int64_t u = ulps(got, static_cast<float>(1.0L / (1.0L + std::exp(-static_cast<long double>(z)))));
    worst_sigmoid = u > worst_sigmoid ? u : worst_sigmoid;
  }
  std::printf("sigmoid: at most %lld ulp from the exact value\n", static_cast<long long>(worst_sigmoid));
  EXPECT(worst_sigmoid <= 2);
  const SwigluClamp gpt_oss{1.702f, 7.f};
  const auto swiglu = [&](float g, float u) { return swiglu_clamped_f32<float>(g, u, gpt_oss.alpha, gpt_oss.limit); };
  EXPECT(swiglu(0.f, 5.f) == 0.f);
  EXPECT(swiglu(100.f, 100.f) == 8.f * (7.f * div_one_plus_exp(1.f, -(7.f * 1.702f))));  // both clamped at 7
  EXPECT(swiglu(inf, -inf) == -6.f * swiglu(inf, 0.f));                                    // up clamped at -7
  EXPECT(std::isnan(swiglu(-inf, 1.f)));  // -inf * sigmoid(-inf) = -inf * 0, as transformers' ops
  EXPECT(std::isnan(swiglu(qnan, 1.f)) && std::isnan(swiglu(1.f, qnan)) && std::isnan(swiglu(qnan, 0.f)));
  EXPECT(swiglu(-100.f, 1.f) == 0.f && std::signbit(swiglu(-100.f, 1.f)));  // -100 * sigmoid(-170.2) = -0
  EXPECT(swiglu(3.f, -1.f) == 0.f);                                          // up + 1 = 0
#if defined(__AVX512F__)
  const int64_t differ = lanes_differ<Act::kSilu>() + lanes_differ<Act::kGeluTanh>() + lanes_differ<Act::kGelu>();
  std::printf("AVX-512 against scalar: %lld lanes differ\n", static_cast<long long>(differ));
  EXPECT(differ == 0);
  int64_t swiglu_differ = 0;
  for (SwigluClamp c : {gpt_oss, SwigluClamp{0.5f, 0.3f}, SwigluClamp{3.f, 1e4f}}) {
    swiglu_differ += swiglu_lanes_differ<float>(c) + swiglu_lanes_differ<bf16>(c) + swiglu_lanes_differ<f16>(c);
  }
  std::printf("AVX-512 against scalar, clamped SwiGLU: %lld lanes differ\n", static_cast<long long>(swiglu_differ));
  EXPECT(swiglu_differ == 0);
#else
  std::printf("AVX-512 against scalar: not compiled in (no -march=native), not compared\n");
#endif
  std::mt19937 rng(7);
  EXPECT((rows_check<Act::kSilu, float>(rng)) == 0);
  EXPECT((rows_check<Act::kSilu, bf16>(rng)) == 0);
  EXPECT((rows_check<Act::kSilu, f16>(rng)) == 0);
  EXPECT((rows_check<Act::kGeluTanh, float>(rng)) == 0);
  EXPECT((rows_check<Act::kGeluTanh, bf16>(rng)) == 0);
  EXPECT((rows_check<Act::kGeluTanh, f16>(rng)) == 0);
  EXPECT((rows_check<Act::kGelu, float>(rng)) == 0);
  EXPECT((rows_check<Act::kGelu, bf16>(rng)) == 0);
  EXPECT((rows_check<Act::kGelu, f16>(rng)) == 0);
  for (SwigluClamp c : {gpt_oss, SwigluClamp{0.5f, 0.3f}}) {  // (0.3 rounds to 16 bits otherwise than in float32)
    EXPECT((rows_check<Act::kSwigluClamped, float>(rng, c)) == 0);
    EXPECT((rows_check<Act::kSwigluClamped, bf16>(rng, c)) == 0);
    EXPECT((rows_check<Act::kSwigluClamped, f16>(rng, c)) == 0);
  }
  if (failures == 0) std::printf("test_glu: ok\n");
  return failures == 0 ? 0 : 1;
}
