// Torch-free unit test of the scalar helpers (ctest): exp_f32 against std::exp, its special values
// (NaN in -> NaN out, without undefined behaviour on the way: run under scripts/sanitize.sh), and
// exact fp16 / bf16 round trips.
#include <cmath>
#include <cstdio>
#include <limits>

#include "check.h"
#include "triforce/common.h"

using namespace triforce;

int main() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // ~1 ulp over the range where the result is a normal float
  float worst = 0.f;
  for (float x = -87.f; x <= 88.f; x += 0.01f) {
    const double want = std::exp(static_cast<double>(x));
    const float rel = static_cast<float>(std::fabs(exp_f32(x) - want) / want);
    worst = rel > worst ? rel : worst;
  }
  EXPECT(worst < 3e-7f);
  EXPECT(exp_f32(0.f) == 1.f);
  EXPECT(exp_f32(-inf) == 0.f);
  EXPECT(exp_f32(-100.f) == 0.f);
  EXPECT(exp_f32(-1e30f) == 0.f);
  // NaN propagates (the exponent clamp used to convert NaN to int: undefined behaviour).
  EXPECT(std::isnan(exp_f32(nan)));
  EXPECT(std::isnan(exp_f32(-nan)));
  // fp16 / bf16: every non-NaN bit pattern survives a round trip through float.
  int bad = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const f16 h{static_cast<uint16_t>(b)};
    const bf16 z{static_cast<uint16_t>(b)};
    if (!std::isnan(to_float(h)) && from_float<f16>(to_float(h)).bits != b) ++bad;
    if (!std::isnan(to_float(z)) && from_float<bf16>(to_float(z)).bits != b) ++bad;
    if (std::isnan(to_float(h)) != std::isnan(to_float(from_float<f16>(to_float(h))))) ++bad;
    if (std::isnan(to_float(z)) != std::isnan(to_float(from_float<bf16>(to_float(z))))) ++bad;
  }
  EXPECT(bad == 0);
  if (failures == 0) std::printf("test_common: ok\n");
  return failures == 0 ? 0 : 1;
}
