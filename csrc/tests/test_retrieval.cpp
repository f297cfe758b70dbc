// Torch-free unit test of the retrieval kernels (ctest): scores sum to g per head, selection rule
// with ties / NaN / sinks / recent / padding, gather skips out-of-range indices, fused == composed.
#include <cmath>
#include <cstdio>
#include <vector>

#include "check.h"
#include "triforce/retrieval.h"

using namespace triforce;


int main() {
  // ---- select: ties go to the lower index, NaN ranks last, ascending output, -1 padding
  {
    const float nan = NAN;
    std::vector<float> s = {9, 0.5f, 0.7f, nan, 0.7f, 0.5f, 0.9f, 0.1f, 3, 3};  // one row, C = 10
    std::vector<int32_t> out(5);
    std::vector<std::pair<float, int32_t>> work;
    select_row(s.data(), 10, 5, 1, 1, out.data(), work);  // forced 0, 9; best of 1..8: 8, 6, 2 (ties 4)
    EXPECT(out[0] == 0 && out[1] == 2 && out[2] == 6 && out[3] == 8 && out[4] == 9);
  }
  {
    std::vector<float> s = {0, 0, 0, 0, 0, 0};
    std::vector<int32_t> out(4);
    std::vector<std::pair<float, int32_t>> work;
    select_row(s.data(), 6, 4, 0, 1, out.data(), work);  // all tied: lowest indices, plus recent 5
    EXPECT(out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] == 5);
    select_row(s.data(), 3, 4, 2, 1, out.data(), work);  // fewer chunks than the budget
    EXPECT(out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] == -1);
    select_row(s.data(), 0, 4, 2, 1, out.data(), work);
    EXPECT(out[0] == -1 && out[3] == -1);
  }
  {  // -0 ties +0 (lowest indices win), NaN is -inf, and a threshold at -inf still breaks ties by index
    const float nan = NAN, inf = INFINITY;
    std::vector<float> s = {1, -0.f, 0.f, -inf, 0.f, nan, 5, 0.f};
    std::vector<int32_t> out(4);
    std::vector<std::pair<float, int32_t>> work;
    select_row(s.data(), 8, 4, 0, 0, out.data(), work);  // 6 (5), 0 (1), then the zeros 1, 2 of 1, 2, 4, 7
    EXPECT(out[0] == 0 && out[1] == 1 && out[2] == 2 && out[3] == 6);
    std::vector<float> t = {nan, nan, nan, 2, -inf};
    std::vector<int32_t> two(2);
    select_row(t.data(), 5, 2, 0, 0, two.data(), work);  // 3, then the lowest of the -inf ties: 0
    EXPECT(two[0] == 0 && two[1] == 3);
  }
  // ---- score: each of the g = 3 query heads' softmax sums to 1; invalid chunks -inf
  const int64_t B = 2, Hq = 6, Hkv = 2, D = 20, C = 7, cs = 3, N = 23, S = 4;  // N: partial trailing chunk
  std::vector<float> q(B * Hq * D), ck(B * C * Hkv * D), k(B * N * Hkv * D), v(B * N * Hkv * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < ck.size(); ++i) ck[i] = std::cos(0.3f * static_cast<float>(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i), v[i] = -static_cast<float>(i);
  const int32_t num_chunks[B] = {7, 3};
  const Cache4<const float> ckv{ck.data(), C * Hkv * D, Hkv * D, D, 1};
  std::vector<float> scores(B * Hkv * C);
  score_chunks_cpu(q.data(), Hq * D, D, B, Hq, Hkv, D, ckv, C, num_chunks, scores.data());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      double sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const float x = scores[(b * Hkv + h) * C + c];
        if (c < num_chunks[b]) sum += x; else EXPECT(std::isinf(x) && x < 0);
      }
      EXPECT(std::fabs(sum - 3.0) < 1e-5);
    }
  // ---- gather: out-of-range indices (7 = N / cs, -5, huge) are skipped; fused == composed
  std::vector<int32_t> idx = {0, 7, 2, -1, 1, 6, -5, 2147483647, 5, 4, 3, 1, 0, 1, 2, -1};  // [B, Hkv, S]
  const int64_t M = S * cs + 1;
  std::vector<float> ok(B * M * Hkv * D, 42.f), ov(B * M * Hkv * D, 42.f);
  const Cache4<const float> kc{k.data(), N * Hkv * D, Hkv * D, D, 1}, vc{v.data(), N * Hkv * D, Hkv * D, D, 1};
  gather_chunks_cpu(kc, vc, B, N, Hkv, D, idx.data(), S, cs, ok.data(), ov.data(), M);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t t = 0; t < cs; ++t)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t c = idx[(b * Hkv + h) * S + i], o = ((b * M + i * cs + t) * Hkv + h) * D + d;
            const float want = (c >= 0 && c < N / cs) ? k[((b * N + c * cs + t) * Hkv + h) * D + d] : 42.f;
            EXPECT(ok[o] == want && ov[o] == ((c >= 0 && c < N / cs) ? -want : 42.f));
          }
  std::vector<int32_t> sel(B * Hkv * S), fused(B * Hkv * S);
  select_chunks_cpu(scores.data(), num_chunks, B, Hkv, C, S, 1, 1, sel.data());
  std::vector<float> ok2(ok.size(), 42.f), ov2(ov.size(), 42.f), ok3(ok.size(), 42.f), ov3(ov.size(), 42.f);
  gather_chunks_cpu(kc, vc, B, N, Hkv, D, sel.data(), S, cs, ok2.data(), ov2.data(), M);
  build_retrieval_cache_cpu(q.data(), Hq * D, D, Hq, kc, vc, B, N, Hkv, D, ckv, C, num_chunks, cs, S, 1, 1,
                            ok3.data(), ov3.data(), M, fused.data());
  EXPECT(sel == fused && ok2 == ok3 && ov2 == ov3);
  EXPECT(fused[(1 * Hkv) * S + 3] == -1 && fused[(1 * Hkv) * S + 2] == 2);  // b = 1: 3 chunks < budget 4
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
