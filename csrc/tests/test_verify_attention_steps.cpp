// Torch-free unit test of the CPU verification attention's independence of T (docs/attention.md,
// "Independent of T"): row t of a pass of T tokens must be bitwise the one-token step at its position,
// over the cache as it is once t's path is committed (causal: the same cache; tree: t's ancestors moved
// to consecutive positions). fp32, bf16 and fp16; D 16, 64 and 128 (the keys-in-lanes, rows-in-lanes,
// transposed-tile and dot paths); GQA 1, 3 and 12; prefixes across the 32-key tiles and the 512-key
// parts; causal and random trees; interleaved and head-major caches; two sequences of different lengths;
// the parts folded across waves (one part per wave); windows, soft caps and ALiBi. And a ragged pass (query_lens: each row's first queries
// only) against the whole one.
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "check.h"
// Hold one part's partial states at a time (4 KB), so that the fold also runs across waves; the Python
// tests run the library's own budget (64 MB: one wave at these sizes).
#define TRIFORCE_VA_PARTIAL_BYTES 4096
#include "triforce/verify_attention.h"

using namespace triforce;

template <typename T>
void check(int64_t Hkv, int64_t g, int64_t D, int64_t Tq, int64_t prefix, bool tree, bool interleaved, unsigned seed,
           int64_t window = 0, float softcap = 0.f, bool alibi = false) {
  const int64_t B = 2, Hq = Hkv * g, N = prefix + Tq + 8;
  std::vector<float> slopes(Hq);  // ALiBi: one slope per query head (a key's bias follows its distance in ranks)
  for (int64_t h = 0; h < Hq; ++h) slopes[h] = 0.5f / static_cast<float>(h + 1);
  const float* sl = alibi ? slopes.data() : nullptr;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<T> q(B * Tq * Hq * D), k(B * N * Hkv * D), v(B * N * Hkv * D);
  for (auto& x : q) x = from_float<T>(nd(rng));
  for (auto& x : k) x = from_float<T>(nd(rng));
  for (auto& x : v) x = from_float<T>(nd(rng));
  const int64_t skb = N * Hkv * D, skn = interleaved ? Hkv * D : D, skh = interleaved ? D : N * D;
  std::vector<int> parent(Tq);
  for (int64_t t = 0; t < Tq; ++t) parent[t] = t == 0 ? -1 : tree ? static_cast<int>(rng() % t) : static_cast<int>(t) - 1;
  std::vector<char> mask(B * Tq * Tq, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tq; ++t)
      for (int s = static_cast<int>(t); s >= 0; s = parent[s]) mask[(b * Tq + t) * Tq + s] = 1;
  const int32_t L[B] = {static_cast<int32_t>(prefix + Tq), static_cast<int32_t>(prefix / 2 + Tq)};
  std::vector<T> out(B * Tq * Hq * D);
  std::vector<float> lse(B * Hq * Tq);
  verify_attention_cpu<T>(q.data(), Tq * Hq * D, Hq * D, D, k.data(), skb, skn, skh, v.data(), skb, skn, skh, L,
                          tree ? reinterpret_cast<const bool*>(mask.data()) : nullptr, 0.125f, B, Tq, Hq, Hkv, D, N, 0,
                          out.data(), lse.data(), nullptr, window, softcap, nullptr, sl);
  // A ragged pass (query_lens): the first queries of each row, bitwise those of the whole pass; 0 and -inf after
  {
    const int32_t lens[B] = {static_cast<int32_t>(Tq), static_cast<int32_t>((Tq + 1) / 2)};
    std::vector<T> rout(out.size());
    std::vector<float> rlse(lse.size());
    verify_attention_cpu<T>(q.data(), Tq * Hq * D, Hq * D, D, k.data(), skb, skn, skh, v.data(), skb, skn, skh, L,
                            tree ? reinterpret_cast<const bool*>(mask.data()) : nullptr, 0.125f, B, Tq, Hq, Hkv, D, N,
                            0, rout.data(), rlse.data(), lens, window, softcap, nullptr, sl);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tq; ++t)
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t o = ((b * Tq + t) * Hq + h) * D, l = (b * Hq + h) * Tq + t;
          if (t < lens[b]) {
            EXPECT(std::memcmp(rout.data() + o, out.data() + o, D * sizeof(T)) == 0);
            EXPECT(std::memcmp(&rlse[l], &lse[l], sizeof(float)) == 0);
          } else {
            for (int64_t d = 0; d < D; ++d) EXPECT(to_float(rout[o + d]) == 0.f);
            EXPECT(rlse[l] == -std::numeric_limits<float>::infinity());
          }
        }
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t new0 = L[b] - Tq;
      std::vector<int> path;  // root .. t
      for (int s = static_cast<int>(t); s >= 0; s = parent[s]) path.insert(path.begin(), s);
      std::vector<T> k1(k.begin() + b * skb, k.begin() + (b + 1) * skb), v1(v.begin() + b * skb, v.begin() + (b + 1) * skb);
      for (size_t i = 0; i < path.size(); ++i)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t d = 0; d < D; ++d) {
            k1[(new0 + i) * skn + h * skh + d] = k[b * skb + (new0 + path[i]) * skn + h * skh + d];
            v1[(new0 + i) * skn + h * skh + d] = v[b * skb + (new0 + path[i]) * skn + h * skh + d];
          }
      const int32_t L1 = static_cast<int32_t>(new0 + path.size());
      std::vector<T> o1(Hq * D);
      std::vector<float> l1(Hq);
      verify_attention_cpu<T>(q.data() + (b * Tq + t) * Hq * D, Hq * D, Hq * D, D, k1.data(), skb, skn, skh, v1.data(),
                              skb, skn, skh, &L1, nullptr, 0.125f, 1, 1, Hq, Hkv, D, N, 0, o1.data(), l1.data(),
                              nullptr, window, softcap, nullptr, sl);
      EXPECT(std::memcmp(o1.data(), out.data() + (b * Tq + t) * Hq * D, Hq * D * sizeof(T)) == 0);
      for (int64_t h = 0; h < Hq; ++h) EXPECT(std::memcmp(&l1[h], &lse[(b * Hq + h) * Tq + t], sizeof(float)) == 0);
    }
}

int main() {
  unsigned seed = 1;
  int cases = 0;
  for (int64_t D : {16, 64, 128})
    for (int64_t g : {1, 3, 12})
      for (int64_t T : {1, 3, 9, 20})
        for (int64_t prefix : {0, 33, 511, 530})
          for (int tree = 0; tree < 2; ++tree)
            for (int interleaved = 0; interleaved < 2; ++interleaved) {
              check<float>(2, g, D, T, prefix, tree, interleaved, seed++);
              check<bf16>(2, g, D, T, prefix, tree, interleaved, seed++);
              check<f16>(2, g, D, T, prefix, tree, interleaved, seed++);
              cases += 3;
            }
  // Sliding windows: a window start inside a tile, on a tile boundary, in an earlier part than the new
  // tokens, and shorter than the pass (the window then also hides new tokens).
  for (int64_t window : {1, 5, 32, 45, 300, 600})
    for (int64_t T : {1, 4, 9})
      for (int64_t prefix : {40, 530, 1100})
        for (int tree = 0; tree < 2; ++tree) {
          check<float>(2, 3, 64, T, prefix, tree, true, seed++, window);
          check<bf16>(2, 3, 64, T, prefix, tree, true, seed++, window);
          check<float>(3, 1, 16, T, prefix, tree, false, seed++, window);
          cases += 3;
        }
  // Soft-capped scores (every path: keys-in-lanes and transposed tiles at D 16, rows-in-lanes at 9+ fp32 rows,
  // the bf16 dot product or tiles at D 64), with and without a window.
  for (float cap : {0.5f, 20.f})
    for (int64_t window : {0, 40})
      for (int64_t T : {1, 5, 12})
        for (int tree = 0; tree < 2; ++tree) {
          check<float>(2, 3, 64, T, 530, tree, true, seed++, window, cap);
          check<bf16>(2, 3, 64, T, 530, tree, true, seed++, window, cap);
          check<f16>(2, 4, 16, T, 70, tree, false, seed++, window, cap);
          cases += 3;
        }
  // ALiBi (every path, as the cap's cases), with a window and a cap too.
  for (int64_t window : {0, 40})
    for (int64_t T : {1, 5, 12})
      for (int tree = 0; tree < 2; ++tree) {
        check<float>(2, 3, 64, T, 530, tree, true, seed++, window, 0.f, true);
        check<bf16>(2, 3, 64, T, 530, tree, true, seed++, window, window ? 20.f : 0.f, true);
        check<f16>(2, 4, 16, T, 70, tree, false, seed++, window, 0.f, true);
        check<float>(2, 12, 64, T, 33, tree, false, seed++, window, 0.f, true);  // 12+ rows in lanes
        cases += 4;
      }
  if (failures) return 1;
  std::printf("test_verify_attention_steps: ok (%d cases)\n", cases);
  return 0;
}
