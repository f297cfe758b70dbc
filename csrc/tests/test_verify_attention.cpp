// Torch-free unit test of the CPU verification-attention kernel (ctest): fp32 inputs against a naive
// double-precision loop, causal and tree masks, GQA, splits, a fully masked row, NaN beyond L, and
// the fast exp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "check.h"
#include "triforce/verify_attention.h"
#include "verify_attention_oracle.h"

using namespace triforce;


int main() {
  for (float x : {0.f, -1e-3f, -0.5f, -1.f, -10.f, -50.f, -86.f})
    EXPECT(std::fabs(va::exp_nonpos(x) - std::exp(x)) <= 4e-7f * std::exp(x));
  EXPECT(va::exp_nonpos(-std::numeric_limits<float>::infinity()) == 0.f);
  EXPECT(va::exp_nonpos(-100.f) == 0.f);

  const int64_t B = 2, T = 5, Hq = 4, Hkv = 2, D = 40, N = 90;
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
      expect_matches_oracle(
          q, k, v, [&](int64_t b, int64_t n, int64_t h, int64_t d) { return ((b * N + n) * Hkv + h) * D + d; },
          [&](int64_t b, int64_t t, int64_t s) { return use_mask ? mask[(b * T + t) * T + s] : s <= t; }, lens, B, T,
          Hq, Hkv, D, scale, out, lse);
      EXPECT(!(use_mask == 0) || std::isfinite(lse[(1 * Hq + 0) * T + 4]));
    }
  }
  // Sliding windows (each row's last W keys), causal and tree, with splits; the keys below every row's
  // window hold NaN, which must never be read.
  for (int64_t window : {1, 2, 3, 7, 40, 77, 200}) {
    std::vector<float> kw = k, vw = v;
    const int64_t below = std::max<int64_t>(lens[0] - T - window, 0);  // no row of sequence 0 sees these
    for (int64_t n = 0; n < below; ++n)
      for (int64_t x = 0; x < Hkv * D; ++x) kw[n * Hkv * D + x] = vw[n * Hkv * D + x] = NAN;
    for (int use_mask = 0; use_mask < 2; ++use_mask)
      for (int64_t splits : {0, 1, 3}) {
        std::vector<float> out(B * T * Hq * D, NAN), lse(B * Hq * T, NAN);
        verify_attention_cpu(q.data(), T * Hq * D, Hq * D, D, kw.data(), N * Hkv * D, Hkv * D, D, vw.data(),
                             N * Hkv * D, Hkv * D, D, lens, use_mask ? mask : nullptr, scale, B, T, Hq, Hkv, D, N,
                             splits, out.data(), lse.data(), nullptr, window);
        expect_matches_oracle(
            q, kw, vw, [&](int64_t b, int64_t n, int64_t h, int64_t d) { return ((b * N + n) * Hkv + h) * D + d; },
            [&](int64_t b, int64_t t, int64_t s) { return use_mask ? mask[(b * T + t) * T + s] : s <= t; }, lens, B,
            T, Hq, Hkv, D, scale, out, lse, window);
      }
  }
  // Soft-capped scores (Gemma 2's cap * tanh(s / cap)), with and without a window, every split; a cap of 1
  // bends every score, one of 50 only the large ones.
  for (float cap : {1.f, 3.f, 50.f})
    for (int64_t window : {0, 9})
      for (int use_mask = 0; use_mask < 2; ++use_mask)
        for (int64_t splits : {0, 3}) {
          std::vector<float> out(B * T * Hq * D, NAN), lse(B * Hq * T, NAN);
          std::vector<float> qs = q;
          for (auto& x : qs) x *= 8.f;  // scores up to ~ +-40 * 0.3 * 8: past every cap's knee
          verify_attention_cpu(qs.data(), T * Hq * D, Hq * D, D, k.data(), N * Hkv * D, Hkv * D, D, v.data(),
                               N * Hkv * D, Hkv * D, D, lens, use_mask ? mask : nullptr, scale, B, T, Hq, Hkv, D, N,
                               splits, out.data(), lse.data(), nullptr, window, cap);
          expect_matches_oracle(
              qs, k, v, [&](int64_t b, int64_t n, int64_t h, int64_t d) { return ((b * N + n) * Hkv + h) * D + d; },
              [&](int64_t b, int64_t t, int64_t s) { return use_mask ? mask[(b * T + t) * T + s] : s <= t; }, lens, B,
              T, Hq, Hkv, D, scale, out, lse, window, cap);
        }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
