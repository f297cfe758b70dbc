// Accept / reject sampling kernels for CUDA (docs/design.md 3.3), torch-free. One thread block per
// batch row walks the chain / tree exactly like the CPU walk in sampling.h (the scalar rules --
// cleaning, accept test, fallbacks -- are the shared TF_HD functions there); every pass over the
// vocabulary is a block-wide reduction or scan, so one launch per call and no host synchronisation.
//
// Bytes: a chain row reads p[x_i], q[x_i] (two floats) per accepted draft, then one or two passes
// over the rejected position's p and q rows (total, then the scan up to the sampled token): at most
// ~4 * V * 4 bytes per row, vs (2n + 1) * V * 4 bytes for reading both probability tensors once.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "triforce/sampling.h"

namespace triforce {
namespace sampling {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// Residual with the product and the difference rounded separately (no FMA), as on the CPU.
__device__ __forceinline__ double residual_rn(double p, double c, double q) {
  return positive(__dsub_rn(p, __dmul_rn(c, q)));
}

struct MinOp {
  __device__ __forceinline__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};
struct ArgMax {
  float v;
  int64_t i;
};
struct ArgMaxOp {  // larger value wins, ties -> lower index (NaN was mapped to -inf)
  __device__ __forceinline__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
  }
};

template <int BLOCK>
struct Block {
  using SumD = cub::BlockReduce<double, BLOCK>;
  using ScanD = cub::BlockScan<double, BLOCK>;
  using MinI = cub::BlockReduce<int64_t, BLOCK>;
  using Arg = cub::BlockReduce<ArgMax, BLOCK>;
  union Temp {
    typename SumD::TempStorage sum;
    typename ScanD::TempStorage scan;
    typename MinI::TempStorage mini;
    typename Arg::TempStorage arg;
  };
  Temp& temp;
  double& bcast_d;
  int64_t& bcast_i;

  __device__ double sum(double v) {
    double s = SumD(temp.sum).Sum(v);
    if (threadIdx.x == 0) bcast_d = s;
    __syncthreads();
    s = bcast_d;
    __syncthreads();
    return s;
  }
  __device__ int64_t min(int64_t v) {
    int64_t s = MinI(temp.mini).Reduce(v, MinOp());
    if (threadIdx.x == 0) bcast_i = s;
    __syncthreads();
    s = bcast_i;
    __syncthreads();
    return s;
  }
  __device__ int64_t max(int64_t v) { return -min(-v); }

  // Sum of w(y) over the vocabulary.
  template <class W>
  __device__ double total(const W& w, int64_t V) {
    double local = 0.0;
    for (int64_t y = threadIdx.x; y < V; y += BLOCK) local += w(y);
    return sum(local);
  }

  // Inverse CDF: smallest y with cum(y) > u * total, -1 if total == 0 (sampling.h: inverse_cdf).
  template <class W>
  __device__ int64_t inverse_cdf(const W& w, int64_t V, float u) {
    const double tot = total(w, V);
    if (!(tot > 0.0)) return -1;
    const double thr = static_cast<double>(u) * tot;
    double carry = 0.0;
    int64_t last = -1;
    for (int64_t base = 0; base < V; base += BLOCK) {
      const int64_t y = base + threadIdx.x;
      const double wy = y < V ? w(y) : 0.0;
      double incl, tile;
      ScanD(temp.scan).InclusiveSum(wy, incl, tile);
      __syncthreads();
      const bool hit = wy > 0.0 && carry + incl > thr;
      const int64_t first = min(hit ? y : INT64_MAX);
      if (first != INT64_MAX) return first;
      const int64_t tile_last = max(wy > 0.0 ? y : -1);
      last = tile_last > last ? tile_last : last;
      carry += tile;
    }
    return last;
  }

  template <class W, class P>
  __device__ int64_t sample(const W& w, const P& p, int64_t V, float u) {
    int64_t y = inverse_cdf(w, V, u);
    if (y >= 0) return y;
    y = inverse_cdf(p, V, u);
    return y >= 0 ? y : uniform_fallback(u, V);
  }

  template <class T>
  __device__ int64_t argmax(const T* x, int64_t V) {
    ArgMax best{-INFINITY, 0};
    for (int64_t y = threadIdx.x; y < V; y += BLOCK) {
      const float v = to_f(x[y]);
      if (v > best.v) best = ArgMax{v, y};  // strided: the first of equal values in this thread
    }
    best = Arg(temp.arg).Reduce(best, ArgMaxOp());
    if (threadIdx.x == 0) bcast_i = best.i;
    __syncthreads();
    const int64_t r = bcast_i;
    __syncthreads();
    return r;
  }
};

#define TRIFORCE_BLOCK_SETUP(BLOCK)                         \
  __shared__ typename Block<BLOCK>::Temp temp_storage;      \
  __shared__ double bcast_d;                                \
  __shared__ int64_t bcast_i;                               \
  Block<BLOCK> blk{temp_storage, bcast_d, bcast_i};

// grid = B, block = BLOCK. draft [B, n], q [B, n, V] or null, p [B, n+1, V], u [B, n+1, 2] (contiguous).
template <int BLOCK, class Index>
__global__ void chain_speculative_sample_kernel(const Index* __restrict__ draft, const float* __restrict__ q,
                                                const float* __restrict__ p, const float* __restrict__ u, int64_t n,
                                                int64_t V, int64_t* __restrict__ tokens, int32_t* __restrict__ num) {
  TRIFORCE_BLOCK_SETUP(BLOCK)
  const int64_t b = blockIdx.x;
  draft += b * n;
  p += b * (n + 1) * V;
  u += b * (n + 1) * 2;
  if (q) q += b * n * V;
  tokens += b * (n + 1);
  for (int64_t i = threadIdx.x; i <= n; i += BLOCK) tokens[i] = -1;
  __syncthreads();
  for (int64_t i = 0; i < n; ++i) {
    const float* pi = p + i * V;
    const float* qi = q ? q + i * V : nullptr;
    const int64_t x = static_cast<int64_t>(draft[i]);
    const bool ok = in_vocab(x, V);
    if (ok && accept(clean_uniform(u[2 * i]), qi ? clean_prob(qi[x]) : 1.0, 1.0, clean_prob(pi[x]))) {
      if (threadIdx.x == 0) tokens[i] = x;
      continue;
    }
    const float ur = clean_uniform(u[2 * i + 1]);
    auto pw = [&](int64_t y) { return clean_prob(pi[y]); };
    int64_t y;
    if (qi) {
      y = blk.sample([&](int64_t z) { return residual_rn(clean_prob(pi[z]), 1.0, clean_prob(qi[z])); }, pw, V, ur);
    } else {
      y = blk.sample([&](int64_t z) { return (ok && z == x) ? 0.0 : clean_prob(pi[z]); }, pw, V, ur);
    }
    if (threadIdx.x == 0) { tokens[i] = y; num[b] = static_cast<int32_t>(i); }
    return;
  }
  const float* pn = p + n * V;
  auto pw = [&](int64_t y) { return clean_prob(pn[y]); };
  const int64_t y = blk.sample(pw, pw, V, clean_uniform(u[2 * n + 1]));
  if (threadIdx.x == 0) { tokens[n] = y; num[b] = static_cast<int32_t>(n); }
}

// grid = B, block = BLOCK. removed: [B, T] int64 scratch in global memory (the tokens rejected at the
// current node, at most T - 1): in shared memory it capped T at ~6K nodes (48 KB with cub's temp storage,
// a launch failure just below 6144); the list is short in practice and read through L1.
template <int BLOCK, class Index, class Parent>
__global__ void tree_speculative_sample_kernel(const Index* __restrict__ tree_tokens, const Parent* __restrict__ parents,
                                               const float* __restrict__ q, const float* __restrict__ p,
                                               const float* __restrict__ u, int64_t T, int64_t V,
                                               int32_t* __restrict__ path, int64_t* __restrict__ tokens,
                                               int32_t* __restrict__ num, int64_t* __restrict__ removed) {
  TRIFORCE_BLOCK_SETUP(BLOCK)
  const int64_t b = blockIdx.x;
  removed += b * T;
  tree_tokens += b * T;
  parents += b * T;
  p += b * T * V;
  u += b * T * 2;
  if (q) q += b * T * V;
  path += b * T;
  tokens += b * T;
  for (int64_t t = threadIdx.x; t < T; t += BLOCK) { path[t] = -1; tokens[t] = -1; }
  __syncthreads();
  int64_t cur = 0, depth = 0;
  if (threadIdx.x == 0) path[0] = 0;
  for (;;) {
    const float* pc = p + cur * V;
    const float* qc = q ? q + cur * V : nullptr;
    double c = 0.0, W = 1.0;
    int64_t n_removed = 0;
    auto w = [&](int64_t y) {
      if (qc) return residual_rn(clean_prob(pc[y]), c, clean_prob(qc[y]));
      for (int64_t r = 0; r < n_removed; ++r)
        if (removed[r] == y) return 0.0;
      return clean_prob(pc[y]);
    };
    int64_t next = -1;
    for (int64_t ch = cur + 1; ch < T; ++ch) {
      if (static_cast<int64_t>(parents[ch]) != cur) continue;
      const int64_t x = static_cast<int64_t>(tree_tokens[ch]);
      const bool ok = in_vocab(x, V);
      if (ok && accept(clean_uniform(u[2 * ch]), qc ? clean_prob(qc[x]) : 1.0, W, w(x))) {
        next = ch;
        break;
      }
      if (qc) {
        c = c + W;
        W = blk.total(w, V);
      } else if (ok) {
        W = positive(W - w(x));
        __syncthreads();
        if (threadIdx.x == 0) removed[n_removed] = x;
        __syncthreads();
        ++n_removed;
      }
    }
    if (next < 0) {
      const int64_t y = blk.sample(w, [&](int64_t z) { return clean_prob(pc[z]); }, V, clean_uniform(u[2 * cur + 1]));
      if (threadIdx.x == 0) { tokens[depth] = y; num[b] = static_cast<int32_t>(depth); }
      return;
    }
    if (threadIdx.x == 0) tokens[depth] = static_cast<int64_t>(tree_tokens[next]);
    cur = next;
    ++depth;
    if (threadIdx.x == 0) path[depth] = static_cast<int32_t>(cur);
  }
}

// grid = B, block = BLOCK. logits [B, n+1, V].
template <int BLOCK, class Index, class T>
__global__ void chain_greedy_verify_kernel(const Index* __restrict__ draft, const T* __restrict__ logits, int64_t n,
                                           int64_t V, int64_t* __restrict__ tokens, int32_t* __restrict__ num) {
  TRIFORCE_BLOCK_SETUP(BLOCK)
  const int64_t b = blockIdx.x;
  draft += b * n;
  logits += b * (n + 1) * V;
  tokens += b * (n + 1);
  for (int64_t i = threadIdx.x; i <= n; i += BLOCK) tokens[i] = -1;
  __syncthreads();
  for (int64_t i = 0;; ++i) {
    const int64_t g = blk.argmax(logits + i * V, V);
    if (threadIdx.x == 0) tokens[i] = g;
    if (i == n || static_cast<int64_t>(draft[i]) != g) {
      if (threadIdx.x == 0) num[b] = static_cast<int32_t>(i);
      return;
    }
  }
}

template <int BLOCK, class Index, class Parent, class T>
__global__ void tree_greedy_verify_kernel(const Index* __restrict__ tree_tokens, const Parent* __restrict__ parents,
                                          const T* __restrict__ logits, int64_t Tn, int64_t V,
                                          int32_t* __restrict__ path, int64_t* __restrict__ tokens,
                                          int32_t* __restrict__ num) {
  TRIFORCE_BLOCK_SETUP(BLOCK)
  const int64_t b = blockIdx.x;
  tree_tokens += b * Tn;
  parents += b * Tn;
  logits += b * Tn * V;
  path += b * Tn;
  tokens += b * Tn;
  for (int64_t t = threadIdx.x; t < Tn; t += BLOCK) { path[t] = -1; tokens[t] = -1; }
  __syncthreads();
  int64_t cur = 0, depth = 0;
  if (threadIdx.x == 0) path[0] = 0;
  for (;;) {
    const int64_t g = blk.argmax(logits + cur * V, V);
    if (threadIdx.x == 0) tokens[depth] = g;
    int64_t next = -1;
    for (int64_t ch = cur + 1; ch < Tn; ++ch)
      if (static_cast<int64_t>(parents[ch]) == cur && static_cast<int64_t>(tree_tokens[ch]) == g) { next = ch; break; }
    if (next < 0) {
      if (threadIdx.x == 0) num[b] = static_cast<int32_t>(depth);
      return;
    }
    cur = next;
    ++depth;
    if (threadIdx.x == 0) path[depth] = static_cast<int32_t>(cur);
  }
}

#undef TRIFORCE_BLOCK_SETUP

}  // namespace sampling
}  // namespace triforce
