// A KV cache's slots shifted within each row, in place: what a StreamingLLM cache whose window must stay in
// position order does at an eviction (triforce/models/cache.py, StreamingCache._sort_kept). Torch-free.
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

}  // namespace triforce
