// What a StreamingLLM cache does to its slots at an eviction (triforce/models/cache.py, StreamingCache): a row's
// window shifted in place where it must stay in position order (_sort_kept), and the sinks' keys rotated again
// from their un-rotated copies at their new positions (_rotate). Torch-free.
#pragma once
#include <cstdint>
#include <cstring>

#include "common.h"

namespace triforce {

// buf holds N x B rows of S slots of slot_bytes each (contiguous: [N, B, S, slot_bytes]). For every n and
// every b with shift[b] != 0: slots [lo, hi) of row (n, b) take what slots [lo + shift[b], hi + shift[b])
// held, in one memmove (the ranges overlap: the window moves down by what it evicts). Slots outside
// [lo, hi) keep their bytes. The caller checks 0 <= lo <= hi, lo + shift[b] >= 0 and hi + shift[b] <= S.
// One memmove per (n, b), spread over the threads when worth it (common.h, worth_parallel): a row's bytes are
// moved, never computed, so the result does not depend on the threads.
inline void shift_slots_cpu(char* buf, int64_t N, int64_t B, int64_t S, int64_t slot_bytes, const int64_t* shift,
                            int64_t lo, int64_t hi) {
  int64_t rows = 0;
  for (int64_t b = 0; b < B; ++b) rows += shift[b] != 0;
  const int64_t span = (hi - lo) * slot_bytes;
  if (rows == 0 || span == 0) return;
  const int64_t items = N * B;
#pragma omp parallel for schedule(static) if (worth_parallel(2 * span * rows * N))
  for (int64_t i = 0; i < items; ++i) {
    const int64_t b = i % B;
    if (shift[b] == 0) continue;
    char* row = buf + i * S * slot_bytes;
    std::memmove(row + lo * slot_bytes, row + (lo + shift[b]) * slot_bytes, static_cast<size_t>(span));
  }
}

// out[g, b, t, h, :] = x[g, b, t, h, :] rotated by cos[b, t, :] and sin[b, t, :] in float32 (D = 2 * half, cos / sin
// contiguous [B, n, D]), as triforce/models/rope.py's apply_rope computes it: x1 * c1 - x2 * s1 and
// x2 * c2 + x1 * s2 (x1, x2: the halves), each product and each sum rounded by itself, never contracted into an
// FMA: the same bits, but for the sign of a NaN. x and out: strides in elements of the first four dimensions (the
// last one is contiguous); they must not overlap. One pass over x and out instead of apply_rope's six.
TRIFORCE_NO_FP_CONTRACT inline void rope_rows_cpu(float* out, const int64_t* so, const float* x, const int64_t* sx,
                                                  const float* cos, const float* sin, int64_t G, int64_t B, int64_t n,
                                                  int64_t H, int64_t D) {
  const int64_t half = D / 2, rows = G * B * n * H;
#pragma omp parallel for schedule(static) if (worth_parallel(3 * rows * D * static_cast<int64_t>(sizeof(float))))
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t h = i % H, t = (i / H) % n, b = (i / (H * n)) % B, g = i / (H * n * B);
    const float* xr = x + g * sx[0] + b * sx[1] + t * sx[2] + h * sx[3];
    float* o = out + g * so[0] + b * so[1] + t * so[2] + h * so[3];
    const float* c = cos + (b * n + t) * D;
    const float* s = sin + (b * n + t) * D;
    for (int64_t d = 0; d < half; ++d) {
      const float x1 = xr[d], x2 = xr[d + half];
      const float p1 = x1 * c[d], q1 = x2 * s[d], p2 = x2 * c[d + half], q2 = x1 * s[d + half];
      o[d] = p1 - q1;
      o[d + half] = p2 + q2;
    }
  }
}

}  // namespace triforce
