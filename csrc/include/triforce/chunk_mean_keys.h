// Chunk-mean keys (docs/design.md 3.1): out[b, c, h, :] = mean_t k[b, c*cs + t, h, :], fp32 accumulation.
// Torch-free; strides are in elements so any view of the key cache (e.g. one newly completed chunk)
// can be passed without a copy.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "triforce/common.h"

namespace triforce {

// acc[i] += x[i] for one cache position's H * D contiguous elements. bf16 widens by a shift written
// as a bit cast (common.h's memcpy form does not vectorise), so this runs at memory speed.
inline void accumulate_row(float* __restrict acc, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}
inline void accumulate_row(float* __restrict acc, const bf16* __restrict x, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x);
  for (int64_t i = 0; i < n; ++i) acc[i] += __builtin_bit_cast(float, static_cast<uint32_t>(bits[i]) << 16);
}
inline void accumulate_row(float* __restrict acc, const f16* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += to_float(x[i]);
}

template <typename T>
void chunk_mean_keys_cpu(const T* k, int64_t B, int64_t C, int64_t H, int64_t D, int64_t chunk_size,
                         int64_t stride_kb, int64_t stride_kn, int64_t stride_kh, int64_t stride_kd,
                         float* out /* contiguous [B, C, H, D] */) {
  const float inv = 1.0f / static_cast<float>(chunk_size);
  // Positions outermost: each position's H * D keys are read in memory order (one contiguous run
  // in the usual layout) instead of jumping between positions per head. Same summation order per
  // element (t = 0, 1, ...) as the reference's chunk sum.
  const bool rows_contiguous = stride_kd == 1 && stride_kh == D;
#pragma omp parallel if (worth_parallel(B * C * chunk_size * H * D * static_cast<int64_t>(sizeof(T))))
  {
    std::vector<float> acc(H * D);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t c = 0; c < C; ++c) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t t = 0; t < chunk_size; ++t) {
          const T* pos = k + b * stride_kb + (c * chunk_size + t) * stride_kn;
          if (rows_contiguous) {
            accumulate_row(acc.data(), pos, H * D);
          } else {
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) acc[h * D + d] += to_float(pos[h * stride_kh + d * stride_kd]);
          }
        }
        float* o = out + (b * C + c) * H * D;
        for (int64_t i = 0; i < H * D; ++i) o[i] = acc[i] * inv;
      }
    }
  }
}

}  // namespace triforce
