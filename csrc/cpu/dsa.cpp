// index_scores: DeepSeek-V3.2's lightning indexer scores (triforce.models.cache.indexed_attention) in one pass over the
// index keys: out[m, s] = sum_h w[m, h] * relu(scale * (q[m, h] . k[s])), float32, the heads summed in order. Each
// output's arithmetic is fixed whatever M, n and the threads (one fused multiply-add chain over the key's dims, then
// the heads in order), so a query's scores are its own row's bits in every pass: the property the model's
// verification passes rely on (a pass gives its one-token steps' bits).
//
// The keys go in blocks of kKeys, transposed into a float32 [D][kKeys] tile (a 16-bit cache's keys converted there:
// no float32 copy of the cache), zero-padded past n (the padding's lanes are computed and dropped: a key's lane
// arithmetic does not depend on its neighbours). Per query, kHeads heads at a time, each lane's dot product is one
// chain of fused multiply-adds over d = 0 .. D-1; kHeads x kKeys / 16 independent chains keep the FMA units busy
// (-march=native: AVX-512; the loops are plain C++ that the compiler vectorises, and any other target computes the
// same bits from std::fma).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops.h"
#include "dispatch.h"
#include "triforce/common.h"

namespace {

constexpr int64_t kKeys = 32;  // keys a tile
constexpr int64_t kHeads = 4;  // heads a pass over the tile

// Tile of keys [s0, s0 + kKeys) (those past n zero), transposed: tile[d * kKeys + l] = k[s0 + l, d].
template <typename K>
void load_tile(const K* k, int64_t n, int64_t D, int64_t s0, float* tile) {
  const int64_t valid = std::min(kKeys, n - s0);
  for (int64_t l = 0; l < kKeys; ++l) {
    if (l < valid) {
      const K* row = k + (s0 + l) * D;
      for (int64_t d = 0; d < D; ++d) tile[d * kKeys + l] = triforce::to_float(row[d]);
    } else {
      for (int64_t d = 0; d < D; ++d) tile[d * kKeys + l] = 0.0f;
    }
  }
}

// One query's scores against a tile: out[l] for the tile's valid lanes.
TRIFORCE_NO_FP_CONTRACT void score_tile(const float* q, const float* w, int64_t H, int64_t D, float scale,
                                        const float* tile, float* out, int64_t valid) {
  float total[kKeys];
  for (int64_t l = 0; l < kKeys; ++l) total[l] = 0.0f;
  for (int64_t h0 = 0; h0 < H; h0 += kHeads) {
    const int64_t hs = std::min(kHeads, H - h0);
    float acc[kHeads][kKeys];
    for (int64_t j = 0; j < kHeads; ++j)
      for (int64_t l = 0; l < kKeys; ++l) acc[j][l] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float* kt = tile + d * kKeys;
      for (int64_t j = 0; j < kHeads; ++j) {
        const float qv = j < hs ? q[(h0 + j) * D + d] : 0.0f;
        for (int64_t l = 0; l < kKeys; ++l) acc[j][l] = std::fma(qv, kt[l], acc[j][l]);
      }
    }
    for (int64_t j = 0; j < hs; ++j) {  // (the heads in order: relu(scale * dot) * w, then the sum)
      const float wh = w[h0 + j];
      for (int64_t l = 0; l < kKeys; ++l) {
        const float s = acc[j][l] * scale;
        const float r = s > 0.0f ? s : 0.0f;
        total[l] = total[l] + r * wh;
      }
    }
  }
  for (int64_t l = 0; l < valid; ++l) out[l] = total[l];
}

template <typename K>
void index_scores_loops(const float* q, const K* k, const float* w, int64_t M, int64_t H, int64_t D, int64_t n,
                        float scale, float* out) {
  const int64_t tiles = (n + kKeys - 1) / kKeys;
  const int64_t work = M * H * D * kKeys;  // multiply-adds a tile
  const int64_t grain = std::max<int64_t>(1, triforce::parallel_min_bytes() / std::max<int64_t>(1, work));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> tile(static_cast<size_t>(D * kKeys));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s0 = t * kKeys;
      load_tile(k, n, D, s0, tile.data());
      const int64_t valid = std::min(kKeys, n - s0);
      for (int64_t m = 0; m < M; ++m)
        score_tile(q + m * H * D, w + m * H, H, D, scale, tile.data(), out + m * n + s0, valid);
    }
  });
}

}  // namespace

at::Tensor index_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, double scale) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && w.device().is_cpu(), "index_scores: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 2 && w.dim() == 2, "index_scores: q [M, H, D], k [n, D] and w [M, H], got ",
              q.sizes(), ", ", k.sizes(), " and ", w.sizes());
  const int64_t M = q.size(0), H = q.size(1), D = q.size(2), n = k.size(0);
  TORCH_CHECK(k.size(1) == D && w.size(0) == M && w.size(1) == H, "index_scores: q [M, H, D], k [n, D] and w [M, H]"
              " must agree, got ", q.sizes(), ", ", k.sizes(), " and ", w.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "index_scores: q and w must be float32, got ", q.scalar_type(), " and ", w.scalar_type());
  at::Tensor out = at::empty({M, n}, q.options());
  if (M == 0 || n == 0) return out;
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), wc = w.contiguous();
  const float s = static_cast<float>(scale);
  TRIFORCE_DISPATCH_FLOAT(kc.scalar_type(), "index_scores", [&] {
    index_scores_loops<scalar_t>(qc.const_data_ptr<float>(), tf_ptr<scalar_t>(kc), wc.const_data_ptr<float>(), M, H,
                                 D, n, s, out.data_ptr<float>());
  });
  return out;
}
