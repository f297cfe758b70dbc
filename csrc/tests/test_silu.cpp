// Torch-free unit test of SiLU(gate) * up (csrc/include/triforce/silu.h, ctest): the AVX-512 form gives the
// scalar form's bits for every float tried (a sweep of bit patterns, the clamp's edges, inf, NaN) and, per
// element type, for every row length 0-70 (the masked last lanes); SiLU within 2 ulp of the exact value; the
// rounding of each step to the element type; in place (out = gate) the same.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "check.h"
#include "triforce/silu.h"

using namespace triforce;

namespace {

uint32_t bits(float f) { return __builtin_bit_cast(uint32_t, f); }
float from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// ulps between two finite floats of the same sign region (the ordered integer map)
int64_t ulps(float a, float b) {
  const auto key = [](float f) {
    const int64_t u = bits(f) & 0x7fffffffu;
    return (bits(f) >> 31) ? -u : u;
  };
  return std::llabs(key(a) - key(b));
}

#if defined(__AVX512F__)
void silu16(const float* x, float* out) { _mm512_storeu_ps(out, silu_f32(_mm512_loadu_ps(x))); }
#endif

template <typename S>
S make(float v) { return from_float<S>(v); }

template <typename S>
bool same_bits(const std::vector<S>& a, const std::vector<S>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(S)) == 0);
}

// every row length 0-70, values over the whole range of SiLU's behaviour (and a NaN, an inf): the row
// function against the scalar one, out of place and in place, and each element against its definition
template <typename S>
int rows_check(std::mt19937& rng) {
  int bad = 0;
  std::normal_distribution<float> normal(0.f, 6.f);
  const float specials[] = {0.f, -0.f, 1e-30f, -1e-30f, 87.f, -87.5f, 88.7f, -88.7f, 89.f, -89.f, 200.f, -200.f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<S> gate(n), up(n), out(n), ref(n);
    for (int64_t i = 0; i < n; ++i) {
      gate[i] = make<S>(i % 7 == 3 ? specials[(i / 7 + n) % 15] : normal(rng));
      up[i] = make<S>(normal(rng));
    }
    std::vector<S> guarded(n + 16, make<S>(-7.f));  // nothing written past the row's end
    silu_mul_row(gate.data(), up.data(), guarded.data(), n);
    for (int64_t i = n; i < n + 16; ++i) bad += to_float(guarded[i]) != -7.f;
    out.assign(guarded.begin(), guarded.begin() + n);
    silu_mul_row_scalar(gate.data(), up.data(), ref.data(), n);
    bad += !same_bits(out, ref);
    for (int64_t i = 0; i < n; ++i) {  // the definition, element by element
      const float want = to_float(from_float<S>(to_float(from_float<S>(silu_f32(to_float(gate[i])))) *
                                                to_float(up[i])));
      const float got = to_float(out[i]);
      bad += !(bits(want) == bits(got) || (std::isnan(want) && std::isnan(got)));
    }
    std::vector<S> inplace = gate;
    silu_mul_row(inplace.data(), up.data(), inplace.data(), n);
    bad += !same_bits(inplace, ref);
  }
  return bad;
}

}  // namespace

int main() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // SiLU within 2 ulp of x / (1 + e^-x) in long double wherever e^-x is a float and the result a normal one;
  // below -88.72, e^-x is inf in float and SiLU -0, as PyTorch's
  int64_t worst = 0, not_zero = 0;
  for (float x = -100.f; x <= 100.f; x += 0.003f) {
    if (x < -88.7229f) {
      not_zero += !(silu_f32(x) == 0.f && std::signbit(silu_f32(x)));
      continue;
    }
    const long double want = x / (1.0L + std::exp(-static_cast<long double>(x)));
    const int64_t u = ulps(silu_f32(x), static_cast<float>(want));
    worst = u > worst ? u : worst;
  }
  std::printf("SiLU: at most %lld ulp from the exact value\n", static_cast<long long>(worst));
  EXPECT(worst <= 2);
  EXPECT(not_zero == 0);
  // special values, as PyTorch's x / (1 + exp(-x))
  EXPECT(silu_f32(0.f) == 0.f);
  EXPECT(silu_f32(inf) == inf);
  EXPECT(std::isnan(silu_f32(-inf)));
  EXPECT(std::isnan(silu_f32(nan)));
  EXPECT(silu_f32(-100.f) == 0.f && std::signbit(silu_f32(-100.f)));
  EXPECT(silu_f32(100.f) == 100.f);
  EXPECT(silu_f32(1e30f) == 1e30f);
  EXPECT(silu_f32(-88.5f) < 0.f);  // e^88.5 is finite: -88.5 / 2.7e38, not -0
#if defined(__AVX512F__)
  // the vector form, lane for lane, over a sweep of every 61st bit pattern (both signs, NaN and inf included)
  int64_t differ = 0;
  std::vector<float> x(16), got(16);
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 61 * 16) {
    for (int j = 0; j < 16; ++j) x[j] = from_bits(static_cast<uint32_t>(b + 61 * j));
    silu16(x.data(), got.data());
    for (int j = 0; j < 16; ++j) differ += bits(got[j]) != bits(silu_f32(x[j]));
  }
  for (float edge : {kExpMin, kSiluExpMax, 88.7228f, -88.7228f, 88.72284f, -88.72284f, 87.33654f, -87.33654f}) {
    for (int j = 0; j < 16; ++j) x[j] = std::nextafter(edge, j < 8 ? -inf : inf) + (j % 8) * 1e-5f;
    silu16(x.data(), got.data());
    for (int j = 0; j < 16; ++j) differ += bits(got[j]) != bits(silu_f32(x[j]));
  }
  std::printf("AVX-512 against scalar: %lld lanes differ\n", static_cast<long long>(differ));
  EXPECT(differ == 0);
#endif
  std::mt19937 rng(7);
  EXPECT(rows_check<float>(rng) == 0);
  EXPECT(rows_check<bf16>(rng) == 0);
  EXPECT(rows_check<f16>(rng) == 0);
  if (failures == 0) std::printf("test_silu: ok\n");
  return failures == 0 ? 0 : 1;
}
