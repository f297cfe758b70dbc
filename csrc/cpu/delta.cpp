// The gated DeltaNet recurrence over a step's tokens on the CPU (contract in csrc/ops.h, "caches"): each head's state
// read once, updated and read out for every token while it is in cache, however many tokens the step has.
#include <ATen/ATen.h>
#include <omp.h>

#include <type_traits>

#include "../ops.h"
#include "scan.h"
#include "triforce/common.h"

namespace {

// Value columns per tile: a head's state columns are independent, so a tile's (K x 64 floats) goes through all the
// tokens while it is in cache, its sums in registers (8 AVX vectors; 64 ran ~10% faster than 32 or 128 here).
constexpr int kTile = 64;

// One tile of value columns [v0, v0 + w) of a head's state S [K, V] (s pointing at column v0, rows V apart) through
// one token: when update, s = s * decay, mem = s^T k (k in order), delta = (v - mem) beta, s += k delta^T; then when
// q, out = s^T q (k in order). The decay of state row kk is decay[0], one per head (gated DeltaNet's), or decay[kk]
// with PerChannel, one per key channel (Kimi's KDA). Width is a compile-time kTile (registers) or the last tile's
// runtime width: one body, each column's arithmetic the same instructions in either.
template <bool PerChannel, typename Width>
inline void token_tile(float* __restrict s, int64_t K, int64_t V, Width w, bool update, const float* __restrict k,
                       const float* __restrict v, float beta, const float* __restrict decay,
                       const float* __restrict q, float* __restrict out) {
  // (a compile-time stride: the per-head path's decay one register for the whole tile, as a scalar argument was)
  constexpr int64_t dstride = PerChannel ? 1 : 0;
  float delta[kTile];
  if (update) {
    float mem[kTile] = {0.f};
    for (int64_t kk = 0; kk < K; ++kk) {
      const float kv = k[kk], dk = decay[kk * dstride];
      const float* row = s + kk * V;
      for (int l = 0; l < w; ++l) {
        const float kept = row[l] * dk;
        mem[l] = triforce::madd(kept, kv, mem[l]);
      }
    }
    for (int l = 0; l < w; ++l) delta[l] = (v[l] - mem[l]) * beta;
  }
  if (q == nullptr) {  // a replay: the update only
    if (!update) return;
    for (int64_t kk = 0; kk < K; ++kk) {
      const float kv = k[kk], dk = decay[kk * dstride];
      float* row = s + kk * V;
      for (int l = 0; l < w; ++l) {
        const float kept = row[l] * dk;
        row[l] = triforce::madd(kv, delta[l], kept);
      }
    }
    return;
  }
  float acc[kTile] = {0.f};
  if (update) {
    for (int64_t kk = 0; kk < K; ++kk) {
      const float kv = k[kk], qv = q[kk], dk = decay[kk * dstride];
      float* row = s + kk * V;
      for (int l = 0; l < w; ++l) {
        const float kept = row[l] * dk;
        const float now = triforce::madd(kv, delta[l], kept);
        row[l] = now;
        acc[l] = triforce::madd(now, qv, acc[l]);
      }
    }
  } else {  // a token past the row's count: its readout of the state as it is
    for (int64_t kk = 0; kk < K; ++kk) {
      const float qv = q[kk];
      const float* row = s + kk * V;
      for (int l = 0; l < w; ++l) acc[l] = triforce::madd(row[l], qv, acc[l]);
    }
  }
  for (int l = 0; l < w; ++l) out[l] = acc[l];
}

}  // namespace

at::Tensor delta_scan_(at::Tensor& state, const std::optional<at::Tensor>& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& beta, const at::Tensor& decay,
                       const std::optional<at::Tensor>& counts) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&state, &k, &v, &beta, &decay}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "delta_scan_: state, q, k, v, beta and decay must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(state.dim() == 4, "delta_scan_: state must be [b, Hv, K, V], got ", state.sizes());
  const int64_t b = state.size(0), Hv = state.size(1), K = state.size(2), V = state.size(3);
  TORCH_CHECK(v.dim() == 4 && v.size(0) == b && v.size(2) == Hv && v.size(3) == V,
              "delta_scan_: v must be [b, T, Hv, V] = [", b, ", T, ", Hv, ", ", V, "], got ", v.sizes());
  const int64_t T = v.size(1);
  TORCH_CHECK(k.dim() == 4 && k.size(0) == b && k.size(1) == T && k.size(3) == K && k.size(2) >= 1 &&
                  Hv % k.size(2) == 0,
              "delta_scan_: k must be [b, T, Hk, K] = [", b, ", ", T, ", Hk, ", K, "] with Hk dividing Hv = ", Hv,
              ", got ", k.sizes());
  const int64_t Hk = k.size(2);
  if (q.has_value()) {
    TORCH_CHECK(q->device().is_cpu() && q->scalar_type() == at::kFloat && q->is_contiguous(),
                "delta_scan_: state, q, k, v, beta and decay must be contiguous float32 CPU tensors");
    TORCH_CHECK(q->sizes() == k.sizes(), "delta_scan_: q must be k's shape ", k.sizes(), ", got ", q->sizes());
  }
  const std::vector<int64_t> per_head{b, T, Hv}, per_channel{b, T, Hv, K};
  TORCH_CHECK(beta.sizes() == at::IntArrayRef(per_head) &&
                  (decay.sizes() == beta.sizes() || decay.sizes() == at::IntArrayRef(per_channel)),
              "delta_scan_: beta must be [b, T, Hv] = ", at::IntArrayRef(per_head),
              " and decay that or [b, T, Hv, K] = ", at::IntArrayRef(per_channel), ", got ", beta.sizes(), " and ",
              decay.sizes());
  const int64_t dstride = decay.dim() == 4 ? 1 : 0;  // (a decay per key channel: Kimi's KDA)
  const std::vector<int64_t> count = triforce::row_counts(counts, b, T, "delta_scan_");
  auto y = q.has_value() ? at::empty({b, T, Hv, V}, v.options()) : at::empty({0}, v.options());
  if (T == 0 || b * Hv * V == 0) return y;
  float* sp = state.data_ptr<float>();
  const float *kp = k.const_data_ptr<float>(), *vp = v.const_data_ptr<float>();
  const float *qp = q.has_value() ? q->const_data_ptr<float>() : nullptr;
  const float *bp = beta.const_data_ptr<float>(), *dcp = decay.const_data_ptr<float>();
  float* yp = q.has_value() ? y.data_ptr<float>() : nullptr;
  const int64_t rep = Hv / Hk, heads = b * Hv;
  // (each (row, head) block's state by one thread, a tile of its columns through every token in order: the result
  // never depends on the threads or on T; the work: the state streamed in and out, ~3 multiply-adds per state
  // element and token)
  const bool parallel = triforce::worth_parallel(state.numel() * 4 * 2 + state.numel() * T * 3);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t i = bh / Hv, h = bh % Hv, hk = h / rep;
    float* s = sp + bh * K * V;
    for (int64_t v0 = 0; v0 < V; v0 += kTile) {
      const int64_t w = std::min<int64_t>(kTile, V - v0);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t tok = i * T + t;  // (i, t)
        const float* kt = kp + (tok * Hk + hk) * K;
        const float* qt = qp == nullptr ? nullptr : qp + (tok * Hk + hk) * K;
        const float* vt = vp + (tok * Hv + h) * V + v0;
        float* out = yp == nullptr ? nullptr : yp + (tok * Hv + h) * V + v0;
        const bool update = t < count[i];
        const float bt = bp[tok * Hv + h];
        const float* dc = dcp + (tok * Hv + h) * (dstride ? K : 1);
        if (dstride == 0 && w == kTile) {
          token_tile<false>(s + v0, K, V, std::integral_constant<int, kTile>{}, update, kt, vt, bt, dc, qt, out);
        } else if (dstride == 0) {
          token_tile<false>(s + v0, K, V, static_cast<int>(w), update, kt, vt, bt, dc, qt, out);
        } else if (w == kTile) {
          token_tile<true>(s + v0, K, V, std::integral_constant<int, kTile>{}, update, kt, vt, bt, dc, qt, out);
        } else {
          token_tile<true>(s + v0, K, V, static_cast<int>(w), update, kt, vt, bt, dc, qt, out);
        }
      }
    }
  }
  return y;
}
