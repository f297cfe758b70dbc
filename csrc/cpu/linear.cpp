// rowwise_linear: out = x @ w^T for a few rows of x (the model layer's decode and verification steps
// on CPU). Why: MKL's sgemm packs the weight panel for every M >= 2, so a 2..16-row product costs
// 1.5-2x a 1-row product although it reads the same weights; speculative verification (T tokens in
// one pass) only pays when the extra rows are nearly free. This kernel streams each block of 4 weight
// rows once and dots it with every row of x (held in L1), with 4 independent accumulators per x row.
//
// Every output element (m, n) is computed by the same code whatever M is and however the range is
// split among threads (blocks are aligned to 4 rows of w), so row m of the result is bitwise the
// same as the 1-row product of x[m]: a verification pass's linear layers give exactly the values an
// autoregressive step computes for the same token.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../ops.h"

namespace {

void dot_block(const float* x, int64_t M, int64_t K, const float* w, int64_t rows, int64_t n, int64_t N, float* out) {
  if (rows == 4) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int64_t k = 0; k < K; ++k) {
        const float xv = xr[k];
        a0 += xv * w0[k];
        a1 += xv * w1[k];
        a2 += xv * w2[k];
        a3 += xv * w3[k];
      }
      float* o = out + m * N + n;
      o[0] = a0;
      o[1] = a1;
      o[2] = a2;
      o[3] = a3;
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {  // the last, partial block (N % 4 rows)
    const float* wr = w + r * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      float a = 0.f;
#pragma omp simd reduction(+ : a)
      for (int64_t k = 0; k < K; ++k) a += xr[k] * wr[k];
      out[m * N + n + r] = a;
    }
  }
}

}  // namespace

at::Tensor rowwise_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "rowwise_linear: x [M, K] and w [N, K] must be 2-D, got ",
              x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "rowwise_linear: float32 only, got ", x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rowwise_linear: CPU tensors only");
  TORCH_CHECK(x.size(1) == w.size(1), "rowwise_linear: x has ", x.size(1), " columns, w ", w.size(1));
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
  at::Tensor out = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  const float* X = xc.data_ptr<float>();
  const float* W = wc.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const int64_t blocks = (N + 3) / 4;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = 4 * b;
      dot_block(X, M, K, W + n * K, std::min<int64_t>(4, N - n), n, N, O);
    }
  });
  return out;
}
