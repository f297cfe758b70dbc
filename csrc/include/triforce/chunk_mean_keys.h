// Chunk-mean keys (DESIGN.md 3.1): out[b, c, h, :] = mean_t k[b, c*cs + t, h, :], fp32 accumulation.
// Torch-free; strides are in elements so any view of the key cache (e.g. one newly completed chunk)
// can be passed without a copy.
#pragma once
#include <cstdint>
#include <vector>

#include "triforce/common.h"

namespace triforce {

template <typename T>
void chunk_mean_keys_cpu(const T* k, int64_t B, int64_t C, int64_t H, int64_t D, int64_t chunk_size,
                         int64_t stride_kb, int64_t stride_kn, int64_t stride_kh, int64_t stride_kd,
                         float* out /* contiguous [B, C, H, D] */) {
  const float inv = 1.0f / static_cast<float>(chunk_size);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t c = 0; c < C; ++c) {
      std::vector<float> acc(D);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
        for (int64_t t = 0; t < chunk_size; ++t) {
          const T* row = k + b * stride_kb + (c * chunk_size + t) * stride_kn + h * stride_kh;
          for (int64_t d = 0; d < D; ++d) acc[d] += to_float(row[d * stride_kd]);
        }
        float* o = out + ((b * C + c) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;
      }
    }
  }
}

}  // namespace triforce
