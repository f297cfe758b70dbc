// Retrieval-cache kernels (docs/design.md 3.1): chunk scores, top-k chunk selection, chunk gather, and the
// fused build. Torch-free CPU code; every op is an OpenMP loop over the (b, h) rows of row functions,
// and the fused build runs score -> select -> gather per row while the row's data is in cache.
//
// Bounds: num_chunks is clamped to [0, C]; a chunk index outside [0, N / chunk_size) is skipped by
// the gather (treated as -1), so no input can make these kernels read or write out of bounds.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "triforce/common.h"

namespace triforce {

// Dot product, vectorised: `omp simd reduction` lets the compiler keep one partial sum per SIMD
// lane (a blocked sum, like BLAS's) without -ffast-math for the whole file. With plain scalar code
// this loop ran at ~0.5 GFMA/s and the scoring was compute-bound instead of memory-bound.
inline float dot_f32(const float* __restrict a, const float* __restrict b, int64_t D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// Strided view of a [B, N, H, D] tensor.
template <typename T>
struct Cache4 {
  T* ptr;
  int64_t stride_b, stride_n, stride_h, stride_d;
};

inline int64_t clamp_chunks(int32_t n, int64_t C) { return std::min<int64_t>(std::max<int32_t>(n, 0), C); }

// Phase 1 of the scoring, chunks [c0, c1) of batch row b, all heads at once:
// logits[j, c] = qf[j] . chunk_keys[b, c, j / G] / sqrt(D). Walking c outermost reads chunk_keys in
// memory order (Hkv * D contiguous floats per chunk). Per (b, h) instead, consecutive rows are
// Hkv * D * 4 = 4 KiB apart -- a new page each, which the prefetchers do not follow: that order was
// latency-bound: 22 ms vs 8.8 ms of CPU time on one thread for the bench shape (C = 16K, Hq = 32).
inline void logits_block(const float* qf /* [Hq, D] */, int64_t Hq, int64_t G, int64_t D, const float* keys,
                         int64_t stride_kc, int64_t stride_kh, int64_t c0, int64_t c1, int64_t C,
                         float* logits /* [Hq, C] */) {
  const float sqrt_d = static_cast<float>(std::sqrt(static_cast<double>(D)));
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t j = 0; j < Hq; ++j)
      logits[j * C + c] = dot_f32(qf + j * D, keys + c * stride_kc + (j / G) * stride_kh, D) / sqrt_d;
}

// Phase 2, one (b, h) row: out[c] = sum over the G heads of the group of softmax_c(logits) for c < n,
// -inf beyond. `logits` holds the group's G rows (row stride C); overwritten with exp(logit - max).
inline void softmax_sum_row(float* logits, int64_t G, int64_t n, int64_t C, float* out) {
  for (int64_t c = 0; c < C; ++c) out[c] = c < n ? 0.f : -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < G; ++j) {
    float* ej = logits + j * C;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < n; ++c) m = ej[c] > m ? ej[c] : m;
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) ej[c] = exp_f32(ej[c] - m);
    double s = 0.0;  // fp64 sum of n <= C terms: the softmax denominator adds no error of its own
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; ++c) s += ej[c];
    const float sf = static_cast<float>(s);
    for (int64_t c = 0; c < n; ++c) out[c] += ej[c] / sf;
  }
}

// One (b, h) row of the selection (see select_chunks in docs/design.md 3.1): out[0, budget).
// Requires budget > sink + recent. work: reused buffer of (score, index) pairs.
inline void select_row(const float* s, int64_t n, int64_t budget, int64_t sink, int64_t recent, int32_t* out,
                       std::vector<std::pair<float, int32_t>>& work) {
  if (n <= budget) {  // everything valid fits
    for (int64_t i = 0; i < budget; ++i) out[i] = i < n ? static_cast<int32_t>(i) : -1;
    return;
  }
  // n > budget > sink + recent: the forced ranges [0, sink) and [n - recent, n) are disjoint and the
  // middle [sink, n - recent) has more candidates than the k free slots.
  const int64_t k = budget - sink - recent;
  work.clear();
  for (int64_t c = sink; c < n - recent; ++c) {
    const float x = s[c];
    work.emplace_back(std::isnan(x) ? -std::numeric_limits<float>::infinity() : x, static_cast<int32_t>(c));
  }
  // A strict total order (score desc, index asc), so partial selection picks exactly the k best: O(C).
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::nth_element(work.begin(), work.begin() + k, work.end(), better);
  std::sort(work.begin(), work.begin() + k,
            [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) { return a.second < b.second; });
  int32_t* o = out;
  for (int64_t c = 0; c < sink; ++c) *o++ = static_cast<int32_t>(c);
  for (int64_t i = 0; i < k; ++i) *o++ = work[i].second;
  for (int64_t c = n - recent; c < n; ++c) *o++ = static_cast<int32_t>(c);
}

// One (b, h) row of the gather: chunk idx[i] of `src` (rows of D elements, `stride_n` apart, element
// stride `stride_d`) to slot i of `dst` (rows `dst_stride_n` apart, contiguous D). Indices outside
// [0, num_complete) are skipped.
template <typename T>
void gather_row(const T* src, int64_t stride_n, int64_t stride_d, const int32_t* idx, int64_t S,
                int64_t num_complete, int64_t chunk_size, int64_t D, T* dst, int64_t dst_stride_n) {
  for (int64_t i = 0; i < S; ++i) {
    const int64_t c = idx[i];
    if (c < 0 || c >= num_complete) continue;
    for (int64_t t = 0; t < chunk_size; ++t) {
      const T* from = src + (c * chunk_size + t) * stride_n;
      T* to = dst + (i * chunk_size + t) * dst_stride_n;
      if (stride_d == 1) {
        std::memcpy(to, from, D * sizeof(T));
      } else {
        for (int64_t d = 0; d < D; ++d) to[d] = from[d * stride_d];
      }
    }
  }
}


constexpr int64_t kChunkBlock = 64;  // chunks per phase-1 task: 64 * Hkv * D * 4 = 256 KiB of keys at Hkv 8, D 128

// The queries in fp32, [B, Hq, D] contiguous (converted once: B * Hq * D elements).
template <typename T>
std::vector<float> queries_f32(const T* q, int64_t stride_qb, int64_t stride_qh, int64_t B, int64_t Hq, int64_t D) {
  std::vector<float> qf(B * Hq * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Hq; ++j)
      for (int64_t d = 0; d < D; ++d) qf[(b * Hq + j) * D + d] = to_float(q[b * stride_qb + j * stride_qh + d]);
  return qf;
}

// Phase 1 for all batch rows, inside an enclosing `omp parallel`: tasks are (b, block of 64 chunks).
inline void logits_all(const float* qf, int64_t B, int64_t Hq, int64_t G, int64_t D, const float* ck,
                       int64_t stride_cb, int64_t stride_cc, int64_t stride_ch, int64_t C, const int32_t* num_chunks,
                       float* logits /* [B, Hq, C] */) {
  const int64_t nblocks = (C + kChunkBlock - 1) / kChunkBlock;
#pragma omp for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t n = clamp_chunks(num_chunks[b], C), c0 = blk * kChunkBlock;
      const int64_t c1 = std::min(c0 + kChunkBlock, n);
      if (c0 < c1)
        logits_block(qf + b * Hq * D, Hq, G, D, ck + b * stride_cb, stride_cc, stride_ch, c0, c1, C,
                     logits + b * Hq * C);
    }
  }
}

// q [B, Hq, D] (D contiguous), chunk_keys [B, C, Hkv, D] (D contiguous), num_chunks [B] ->
// out contiguous [B, Hkv, C].
template <typename T>
void score_chunks_cpu(const T* q, int64_t stride_qb, int64_t stride_qh, int64_t B, int64_t Hq, int64_t Hkv,
                      int64_t D, Cache4<const float> ck, int64_t C, const int32_t* num_chunks, float* out) {
  const int64_t G = Hq / Hkv;
  const std::vector<float> qf = queries_f32(q, stride_qb, stride_qh, B, Hq, D);
  std::unique_ptr<float[]> logits(new float[B * Hq * C]);  // uninitialised: only c < n is written and read
#pragma omp parallel if (worth_parallel(B * C * Hkv * D * 4))
  {
    logits_all(qf.data(), B, Hq, G, D, ck.ptr, ck.stride_b, ck.stride_n, ck.stride_h, C, num_chunks, logits.get());
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hkv; ++h)
        softmax_sum_row(logits.get() + (b * Hq + h * G) * C, G, clamp_chunks(num_chunks[b], C), C,
                        out + (b * Hkv + h) * C);
  }
}

// scores contiguous [B, H, C] -> out contiguous [B, H, budget].
inline void select_chunks_cpu(const float* scores, const int32_t* num_chunks, int64_t B, int64_t H, int64_t C,
                              int64_t budget, int64_t sink, int64_t recent, int32_t* out) {
#pragma omp parallel if (worth_parallel(B * H * C * 4))
  {
    std::vector<std::pair<float, int32_t>> work;
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        select_row(scores + (b * H + h) * C, clamp_chunks(num_chunks[b], C), budget, sink, recent,
                   out + (b * H + h) * budget, work);
  }
}

// k, v [B, N, H, D] any strides; chunk_idx contiguous [B, H, S]; out_k, out_v contiguous [B, M, H, D].
template <typename T>
void gather_chunks_cpu(Cache4<const T> k, Cache4<const T> v, int64_t B, int64_t N, int64_t H, int64_t D,
                       const int32_t* chunk_idx, int64_t S, int64_t chunk_size, T* out_k, T* out_v, int64_t M) {
  const int64_t Nc = N / chunk_size;
#pragma omp parallel for collapse(2) schedule(dynamic) if (worth_parallel(B * H * S * chunk_size * D * 2 * int64_t(sizeof(T))))
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int32_t* idx = chunk_idx + (b * H + h) * S;
      const int64_t dst = (b * M * H + h) * D;
      gather_row(k.ptr + b * k.stride_b + h * k.stride_h, k.stride_n, k.stride_d, idx, S, Nc, chunk_size, D,
                 out_k + dst, H * D);
      gather_row(v.ptr + b * v.stride_b + h * v.stride_h, v.stride_n, v.stride_d, idx, S, Nc, chunk_size, D,
                 out_v + dst, H * D);
    }
  }
}

// Fused: phase 1 of the scoring over (b, chunk blocks), then per (b, h) row softmax-sum -> select
// -> gather while the row's scores stay in the thread's buffer. Writes chunk_idx contiguous
// [B, Hkv, budget]; equal to the three ops above.
template <typename Q, typename T>
void build_retrieval_cache_cpu(const Q* q, int64_t stride_qb, int64_t stride_qh, int64_t Hq,
                               Cache4<const T> k, Cache4<const T> v, int64_t B, int64_t N, int64_t Hkv, int64_t D,
                               Cache4<const float> ck, int64_t C, const int32_t* num_chunks, int64_t chunk_size,
                               int64_t budget, int64_t sink, int64_t recent, T* out_k, T* out_v, int64_t M,
                               int32_t* chunk_idx) {
  const int64_t G = Hq / Hkv, Nc = N / chunk_size;
  const std::vector<float> qf = queries_f32(q, stride_qb, stride_qh, B, Hq, D);
  std::unique_ptr<float[]> logits(new float[B * Hq * C]);  // uninitialised: only c < n is written and read
  const int64_t work = B * Hkv * (C * D * 4 + budget * chunk_size * D * 2 * static_cast<int64_t>(sizeof(T)));
#pragma omp parallel if (worth_parallel(work))
  {
    logits_all(qf.data(), B, Hq, G, D, ck.ptr, ck.stride_b, ck.stride_n, ck.stride_h, C, num_chunks, logits.get());
    std::vector<float> scores(C);
    std::vector<std::pair<float, int32_t>> cand;
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t n = clamp_chunks(num_chunks[b], C);
        softmax_sum_row(logits.get() + (b * Hq + h * G) * C, G, n, C, scores.data());
        int32_t* idx = chunk_idx + (b * Hkv + h) * budget;
        select_row(scores.data(), n, budget, sink, recent, idx, cand);
        const int64_t dst = (b * M * Hkv + h) * D;
        gather_row(k.ptr + b * k.stride_b + h * k.stride_h, k.stride_n, k.stride_d, idx, budget, Nc, chunk_size, D,
                   out_k + dst, Hkv * D);
        gather_row(v.ptr + b * v.stride_b + h * v.stride_h, v.stride_n, v.stride_d, idx, budget, Nc, chunk_size, D,
                   out_v + dst, Hkv * D);
      }
    }
  }
}

}  // namespace triforce
