// Mamba-2's state space model over a step's tokens on the CPU (contract in csrc/ops.h, "caches"): each state row read
// once, updated and read out for every token while it is in cache, however many tokens the step has.
#include <ATen/ATen.h>
#include <omp.h>

#include "../ops.h"
#include "scan.h"
#include "triforce/common.h"

namespace {

constexpr int kLanes = 16;  // the readout's accumulators: lane n % 16 sums its dims in order, the lanes in order

// One state row s[N] through the tokens t < count of its (b, h, p): s = s * decay + (dt * B) * x, y = s . C + D x.
void scan_row(float* s, int64_t N, int64_t T, int64_t count, const float* x, int64_t x_step, const float* B,
              const float* C, int64_t bc_step, const float* dt, const float* decay, int64_t h_step, float d, float* y,
              int64_t y_step) {
  for (int64_t t = 0; t < T; ++t) {
    const float xv = x[t * x_step];
    const float* b = B + t * bc_step;
    const float* c = C + t * bc_step;
    if (t < count) {
      const float dtv = dt[t * h_step], dcy = decay[t * h_step];
      for (int64_t n = 0; n < N; ++n) {
        const float dtb = dtv * b[n];
        const float kept = s[n] * dcy;
        s[n] = kept + dtb * xv;
      }
    }
    float acc[kLanes] = {0.f};
    int64_t n = 0;
    for (; n + kLanes <= N; n += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const float prod = s[n + l] * c[n + l];
        acc[l] += prod;
      }
    }
    for (int l = 0; n < N; ++n, ++l) {
      const float prod = s[n] * c[n];
      acc[l] += prod;
    }
    float sum = 0.f;
    for (int l = 0; l < kLanes; ++l) sum += acc[l];
    const float skip = d * xv;
    y[t * y_step] = sum + skip;
  }
}

}  // namespace

at::Tensor ssm_scan_(at::Tensor& state, const at::Tensor& x, const at::Tensor& B, const at::Tensor& C,
                     const at::Tensor& dt, const at::Tensor& decay, const at::Tensor& D,
                     const std::optional<at::Tensor>& counts) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&state, &x, &B, &C, &dt, &decay, &D}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "ssm_scan_: state, x, B, C, dt, decay and D must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(state.dim() == 4, "ssm_scan_: state must be [b, H, P, N], got ", state.sizes());
  const int64_t b = state.size(0), H = state.size(1), P = state.size(2), N = state.size(3);
  TORCH_CHECK(x.dim() == 4 && x.size(0) == b && x.size(2) == H && x.size(3) == P,
              "ssm_scan_: x must be [b, T, H, P] = [", b, ", T, ", H, ", ", P, "], got ", x.sizes());
  const int64_t T = x.size(1);
  TORCH_CHECK(B.dim() == 4 && B.sizes() == C.sizes() && B.size(0) == b && B.size(1) == T && B.size(3) == N &&
                  B.size(2) >= 1 && H % B.size(2) == 0,
              "ssm_scan_: B and C must be [b, T, G, N] with G dividing H = ", H, ", got ", B.sizes(), " and ",
              C.sizes());
  const int64_t G = B.size(2);
  const std::vector<int64_t> per_head{b, T, H};
  TORCH_CHECK(dt.sizes() == at::IntArrayRef(per_head) && decay.sizes() == dt.sizes(),
              "ssm_scan_: dt and decay must be [b, T, H] = ", at::IntArrayRef(per_head), ", got ", dt.sizes(), " and ",
              decay.sizes());
  TORCH_CHECK(D.dim() == 1 && D.size(0) == H, "ssm_scan_: D must be [H = ", H, "], got ", D.sizes());
  const std::vector<int64_t> count = triforce::row_counts(counts, b, T, "ssm_scan_");
  auto y = at::empty({b, T, H, P}, x.options());
  if (y.numel() == 0 || state.numel() == 0) return y;
  float* sp = state.data_ptr<float>();
  const float *xp = x.const_data_ptr<float>(), *bp = B.const_data_ptr<float>(), *cp = C.const_data_ptr<float>();
  const float *dtp = dt.const_data_ptr<float>(), *dcp = decay.const_data_ptr<float>(), *dp = D.const_data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t rep = H / G, heads = b * H;
  // (each (row, head) block's state rows by one thread, in order: the result never depends on the threads)
  const bool parallel = triforce::worth_parallel(state.numel() * 4 * 2 + x.numel() * 4 * 2);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t i = bh / H, h = bh % H, g = h / rep;
    for (int64_t p = 0; p < P; ++p) {
      scan_row(sp + (bh * P + p) * N, N, T, count[i], xp + (i * T * H + h) * P + p, H * P,
               bp + (i * T * G + g) * N, cp + (i * T * G + g) * N, G * N, dtp + i * T * H + h, dcp + i * T * H + h,
               H, dp[h], yp + (i * T * H + h) * P + p, H * P);
    }
  }
  return y;
}
