// Torch-free unit test of the CPU verification-attention kernel (ctest): fp32 inputs against a naive
// double-precision loop, causal and tree masks, GQA, splits, a fully masked row, NaN beyond L, and
// the fast exp.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "triforce/verify_attention.h"

using namespace triforce;

static int failures = 0;
#define EXPECT(cond)                                                                        \
  do {                                                                                      \
    if (!(cond)) { std::printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #cond); ++failures; } \
  } while (0)

int main() {
  for (float x : {0.f, -1e-3f, -0.5f, -1.f, -10.f, -50.f, -86.f})
    EXPECT(std::fabs(va::exp_nonpos(x) - std::exp(x)) <= 4e-7f * std::exp(x));
  EXPECT(va::exp_nonpos(-std::numeric_limits<float>::infinity()) == 0.f);
  EXPECT(va::exp_nonpos(-100.f) == 0.f);

  const int64_t B = 2, T = 5, Hq = 4, Hkv = 2, D = 40, N = 90, g = Hq / Hkv;
  const int32_t lens[B] = {83, 5};  // prefix 78 (several tiles and splits), and prefix 0
  std::vector<float> q(B * T * Hq * D), k(B * N * Hkv * D), v(B * N * Hkv * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.71f * i);
  for (size_t i = 0; i < k.size(); ++i) { k[i] = std::cos(0.37f * i); v[i] = std::sin(0.13f * i + 1); }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = lens[b]; n < N; ++n)
      for (int64_t x = 0; x < Hkv * D; ++x) k[(b * N + n) * Hkv * D + x] = v[(b * N + n) * Hkv * D + x] = NAN;
  // tree: parents -1 0 0 1 2 ; row 4 of batch 1 masked entirely (sees nothing: prefix is empty)
  bool mask[B * T * T] = {};
  const int parents[T] = {-1, 0, 0, 1, 2};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int s = static_cast<int>(t); s >= 0; s = parents[s]) mask[(b * T + t) * T + s] = true;
  for (int64_t s = 0; s < T; ++s) mask[(1 * T + 4) * T + s] = false;
  const float scale = 0.3f;
  for (int use_mask = 0; use_mask < 2; ++use_mask) {
    for (int64_t splits : {1, 3, 64}) {
      std::vector<float> out(B * T * Hq * D, NAN), lse(B * Hq * T, NAN);
      verify_attention_cpu(q.data(), T * Hq * D, Hq * D, D, k.data(), N * Hkv * D, Hkv * D, D, v.data(),
                           N * Hkv * D, Hkv * D, D, lens, use_mask ? mask : nullptr, scale, B, T, Hq, Hkv, D, N,
                           splits, out.data(), lse.data());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t hq = 0; hq < Hq; ++hq) {
            const int64_t h = hq / g, L = lens[b], new0 = L - T;
            std::vector<double> w(L, 0.0);
            double mx = -INFINITY;
            std::vector<bool> vis(L);
            for (int64_t n = 0; n < L; ++n) {
              const int64_t si = n - new0;
              vis[n] = n < new0 || (use_mask ? mask[(b * T + t) * T + si] : si <= t);
              if (!vis[n]) continue;
              double s = 0;
              for (int64_t d = 0; d < D; ++d) s += double(q[((b * T + t) * Hq + hq) * D + d]) * k[((b * N + n) * Hkv + h) * D + d];
              w[n] = s * scale;
              mx = std::max(mx, w[n]);
            }
            double sum = 0;
            for (int64_t n = 0; n < L; ++n) sum += vis[n] ? std::exp(w[n] - mx) : 0.0;
            const float* o = out.data() + ((b * T + t) * Hq + hq) * D;
            const float l = lse[(b * Hq + hq) * T + t];
            if (sum == 0) {
              EXPECT(std::isinf(l) && l < 0);
              for (int64_t d = 0; d < D; ++d) EXPECT(o[d] == 0.f);
              continue;
            }
            EXPECT(std::fabs(l - (mx + std::log(sum))) < 1e-4);
            for (int64_t d = 0; d < D; ++d) {
              double ref = 0;
              for (int64_t n = 0; n < L; ++n)
                if (vis[n]) ref += std::exp(w[n] - mx) / sum * v[((b * N + n) * Hkv + h) * D + d];
              EXPECT(std::fabs(o[d] - ref) < 1e-5);
            }
          }
      EXPECT(!(use_mask == 0) || std::isfinite(lse[(1 * Hq + 0) * T + 4]));
    }
  }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
