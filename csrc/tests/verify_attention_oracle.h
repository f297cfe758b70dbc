// The double-precision oracle shared by the torch-free verification-attention tests: every output row
// and log-sum-exp of verify_attention_cpu against a direct loop over the visible keys.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"

// q: [B, T, Hq, D] contiguous; k, v: the caches, element (b, n, h, d) at at(b, n, h, d); new-token row t
// of sequence b sees the new token s (s <= t, positions L - T + s) when visible(b, t, s), and every
// prefix key; out: [B, T, Hq, D], lse: [B, Hq, T]. A row that sees nothing must be zero with lse -inf.
// window > 0: a row sees only the last `window` of those keys (a sliding window). softcap > 0: each scaled
// score s becomes softcap * tanh(s / softcap).
template <typename At, typename Visible>
void expect_matches_oracle(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                           At at, Visible visible, const int32_t* lens, int64_t B, int64_t T, int64_t Hq,
                           int64_t Hkv, int64_t D, float scale, const std::vector<float>& out,
                           const std::vector<float>& lse, int64_t window = 0, float softcap = 0.f) {
  const int64_t g = Hq / Hkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const int64_t h = hq / g, L = lens[b], new0 = L - T;
        std::vector<double> w(L, 0.0);
        std::vector<bool> vis(L);
        double mx = -INFINITY;
        for (int64_t n = 0; n < L; ++n) vis[n] = n < new0 || visible(b, t, n - new0);
        for (int64_t n = L - 1, later = 0; n >= 0; --n)
          if (vis[n] && window > 0 && ++later > window) vis[n] = false;
        for (int64_t n = 0; n < L; ++n) {
          if (!vis[n]) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += double(q[((b * T + t) * Hq + hq) * D + d]) * k[at(b, n, h, d)];
          w[n] = s * scale;
          if (softcap > 0) w[n] = softcap * std::tanh(w[n] / softcap);
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
            if (vis[n]) ref += std::exp(w[n] - mx) / sum * v[at(b, n, h, d)];
          EXPECT(std::fabs(o[d] - ref) < 1e-5);
        }
      }
}
