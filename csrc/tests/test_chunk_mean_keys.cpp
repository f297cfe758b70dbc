// Torch-free unit test of the chunk-mean kernel and the fp16/bf16 conversions (ctest).
#include <cmath>
#include <cstdio>
#include <vector>

#include "check.h"
#include "triforce/chunk_mean_keys.h"

using namespace triforce;


int main() {
  // conversions round-trip exactly representable values
  for (float v : {0.f, 1.f, -2.5f, 65504.f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT(to_float(from_float<f16>(v)) == v);
  }
  for (float v : {0.f, 1.f, -2.5f, 3.0e38f}) EXPECT(to_float(from_float<bf16>(v)) == to_float(bf16{from_float<bf16>(v).bits}));
  EXPECT(to_float(from_float<bf16>(1.0f + 1.0f / 256)) == 1.0f);  // ties to even
  EXPECT(std::isinf(to_float(from_float<f16>(1e6f))));
  EXPECT(std::isnan(to_float(from_float<f16>(NAN))));

  // B=2, N=7 (one partial chunk dropped), H=3, D=5, chunk 3, non-contiguous stride on d
  const int64_t B = 2, N = 7, H = 3, D = 5, cs = 3, C = N / cs;
  std::vector<float> k(B * N * H * D * 2);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<float> out(B * C * H * D, NAN);
  chunk_mean_keys_cpu(k.data(), B, C, H, D, cs, N * H * D * 2, H * D * 2, D * 2, 2, out.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          double s = 0;
          for (int64_t t = 0; t < cs; ++t) s += k[((b * N + c * cs + t) * H + h) * D * 2 + d * 2];
          EXPECT(std::fabs(out[((b * C + c) * H + h) * D + d] - s / cs) < 1e-6);
        }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
