// Torch-free unit test of the CPU verification attention's rows-in-lanes path (fp32 caches, D % 64 == 0,
// 9..64 query rows per KV head on an AVX-512 build; the other paths elsewhere): every width from one to
// four vectors of 16 rows, partial vectors (padded lanes) and partial tiles and key blocks, causal and
// tree masks, a row that sees nothing, heads interleaved in a row (walked together) and not, several
// splits, NaN beyond each length; against a double-precision loop.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "check.h"
#include "triforce/verify_attention.h"
#include "verify_attention_oracle.h"

using namespace triforce;

// One configuration: B sequences (lengths lens), T new tokens, Hq / Hkv heads of D; tree mask from
// parents (or causal); row t_blind of batch 1 sees nothing when blind. interleaved: [B, N, Hkv, D]
// caches (heads in a row), else [B, Hkv, N, D] viewed as [B, N, Hkv, D].
static void check(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool use_mask, bool blind, bool interleaved,
                  int64_t splits) {
  const int64_t B = 2, N = 150;
  const int32_t lens[B] = {141, static_cast<int32_t>(T)};  // a long prefix (tiles, key blocks, splits) and none
  std::vector<float> q(B * T * Hq * D), k(B * N * Hkv * D), v(B * N * Hkv * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.71f * i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.37f * i), v[i] = std::sin(0.13f * i + 1);
  // element (b, n, h, d) of the cache
  const int64_t skb = N * Hkv * D, skn = interleaved ? Hkv * D : D, skh = interleaved ? D : N * D;
  auto at = [&](int64_t b, int64_t n, int64_t h, int64_t d) { return b * skb + n * skn + h * skh + d; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = lens[b]; n < N; ++n)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) k[at(b, n, h, d)] = v[at(b, n, h, d)] = NAN;
  std::vector<char> mask(B * T * T, 0);  // parents: t -> (t - 1) / 2 (a binary tree)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = t; s >= 0; s = s ? (s - 1) / 2 : -1) mask[(b * T + t) * T + s] = 1;
  const int64_t t_blind = T - 1;
  if (blind)
    for (int64_t s = 0; s < T; ++s) mask[(1 * T + t_blind) * T + s] = 0;
  std::vector<bool> vis_mask(mask.begin(), mask.end());
  bool* mask_ptr = reinterpret_cast<bool*>(mask.data());
  const float scale = 0.125f;
  std::vector<float> out(B * T * Hq * D, NAN), lse(B * Hq * T, NAN);
  verify_attention_cpu(q.data(), T * Hq * D, Hq * D, D, k.data(), skb, skn, skh, v.data(), skb, skn, skh, lens,
                       use_mask ? mask_ptr : nullptr, scale, B, T, Hq, Hkv, D, N, splits, out.data(), lse.data());
  expect_matches_oracle(
      q, k, v, at, [&](int64_t b, int64_t t, int64_t s) { return use_mask ? vis_mask[(b * T + t) * T + s] : s <= t; },
      lens, B, T, Hq, Hkv, D, scale, out, lse);
  // the blind row is the only one that sees nothing: batch 1 has no prefix
  EXPECT(!(use_mask && blind) || std::isinf(lse[(1 * Hq + 0) * T + t_blind]));
}

int main() {
  // (T, Hq, Hkv, D): R = T * Hq / Hkv rows per KV head
  const int64_t shapes[][4] = {
      {3, 9, 3, 64},    // R = 9: one vector, 7 padded lanes (SmolLM2, a 3-token tree)
      {4, 8, 2, 64},    // R = 16: one full vector
      {9, 9, 3, 64},    // R = 27: two vectors
      {5, 8, 1, 128},   // R = 40: three vectors, D = 128
      {8, 16, 2, 64},   // R = 64: four full vectors
      {2, 12, 2, 128},  // R = 12 (Qwen2.5-1.5B heads)
  };
  for (const auto& s : shapes)
    for (int use_mask = 0; use_mask < 2; ++use_mask)
      for (int interleaved = 0; interleaved < 2; ++interleaved)
        for (int64_t splits : {1, 3}) check(s[0], s[1], s[2], s[3], use_mask, use_mask, interleaved, splits);
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
