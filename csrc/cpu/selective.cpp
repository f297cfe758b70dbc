// Mamba(-1)'s selective state space model over a step's tokens on the CPU (contract in csrc/ops.h, "caches"): each
// channel's state row read once, updated and read out for every token while it is in cache, however many tokens the
// step has.
// (common.h first: it includes <immintrin.h> with GCC 12's false -Wmaybe-uninitialized of AVX-512 intrinsics off)
#include "triforce/common.h"

#include <ATen/ATen.h>
#include <omp.h>

#include <type_traits>

#include "../ops.h"
#include "scan.h"

namespace {

constexpr int kLanes = 16;      // the readout's accumulators: lane n % 16 sums its dims in order, then a fixed tree
constexpr int64_t kBlock = 32;  // channels per (row, block): one thread's, 32 state rows (2 KiB at N = 16)

// The readout's 16 lanes summed in the order hsum16_avx512 (csrc/include/triforce/common.h) sums them on the AVX-512
// path, one order either way: per quad of lanes (l0 + l2) + (l1 + l3), then the quads (q0 + q1) + (q2 + q3).
inline float lane_sum(const float* acc) {
  float q[4];
  for (int k = 0; k < 4; ++k) q[k] = (acc[4 * k] + acc[4 * k + 2]) + (acc[4 * k + 1] + acc[4 * k + 3]);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

// One channel's state row s[N] (A's row a[N]) through the tokens t < T of its row: for t < count
// s = s * exp(dt a) + (dt B) x; then, with C, y = s . C (a token past the count reads the state as it is). x, dt and
// y step `step` floats a token, B and C N. Width is a compile-time kLanes (N = 16, Mamba's: the row in registers,
// ~15% faster) or the runtime N: one body, each state element's arithmetic the same instructions in either. (Every
// N without AVX-512, else N not a multiple of 16.)
template <typename Width>
inline void scan_channel(float* __restrict s, const float* __restrict a, Width N, int64_t T, int64_t count,
                         const float* __restrict x, const float* __restrict dt, int64_t step,
                         const float* __restrict B, const float* __restrict C, float* __restrict y) {
  for (int64_t t = 0; t < T; ++t) {
    if (t < count) {
      const float dtv = dt[t * step], xv = x[t * step];
      const float* b = B + t * N;
      for (int64_t n = 0; n < N; ++n) {
        const float decay = triforce::exp_f32(dtv * a[n]);
        const float kept = s[n] * decay;
        const float dtb = dtv * b[n];
        s[n] = triforce::madd(dtb, xv, kept);
      }
    }
    if (C == nullptr) continue;  // a replay: the update only
    const float* c = C + t * N;
    float acc[kLanes] = {0.f};
    int64_t n = 0;
    for (; n + kLanes <= N; n += kLanes) {
      for (int l = 0; l < kLanes; ++l) acc[l] = triforce::madd(s[n + l], c[n + l], acc[l]);
    }
    for (int l = 0; n < N; ++n, ++l) acc[l] = triforce::madd(s[n], c[n], acc[l]);
    y[t * step] = lane_sum(acc);
  }
}

#if defined(__AVX512F__)
// scan_channel for the channels [d, d + w) (w <= 16) of a row, N a multiple of 16, on 16 lanes: per channel and token
// its state row in vectors of 16 dims (exp_f32's AVX-512 form), the readout's lanes of all w channels summed at once
// (hsum16_avx512: no chain of dependent adds per channel; 2.4x scan_channel's speed at N = 16) and stored as y's w
// consecutive values. s: the first channel's state row (rows N apart), a: its A row; x, dt and y step `step` floats
// a token, B and C N.
inline void scan_group16(float* s, const float* a, int64_t N, int w, int64_t T, int64_t count, const float* x,
                         const float* dt, int64_t step, const float* B, const float* C, float* y) {
  const __mmask16 lanes = static_cast<__mmask16>((1u << w) - 1u);
  for (int64_t t = 0; t < T; ++t) {
    const bool update = t < count;
    const float* b = B + t * N;
    const float* c = C == nullptr ? nullptr : C + t * N;
    __m512 acc[16];
    for (int ch = 0; ch < w; ++ch) {
      float* sc = s + ch * N;
      const float* ac = a + ch * N;
      const __m512 dtv = _mm512_set1_ps(dt[t * step + ch]), xv = _mm512_set1_ps(x[t * step + ch]);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t n = 0; n < N; n += 16) {
        __m512 sv = _mm512_loadu_ps(sc + n);
        if (update) {
          const __m512 decay = triforce::exp_f32(_mm512_mul_ps(dtv, _mm512_loadu_ps(ac + n)));
          const __m512 kept = _mm512_mul_ps(sv, decay);
          const __m512 dtb = _mm512_mul_ps(dtv, _mm512_loadu_ps(b + n));
          sv = _mm512_fmadd_ps(dtb, xv, kept);
          _mm512_storeu_ps(sc + n, sv);
        }
        if (c != nullptr) sum = _mm512_fmadd_ps(sv, _mm512_loadu_ps(c + n), sum);
      }
      acc[ch] = sum;
    }
    if (c == nullptr) continue;
    for (int ch = w; ch < 16; ++ch) acc[ch] = _mm512_setzero_ps();
    _mm512_mask_storeu_ps(y + t * step, lanes, triforce::hsum16_avx512(acc));
  }
}
#endif

}  // namespace

at::Tensor selective_scan_(at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                           const at::Tensor& B, const std::optional<at::Tensor>& C,
                           const std::optional<at::Tensor>& counts) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&state, &x, &dt, &A, &B}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                "selective_scan_: state, x, dt, A, B and C must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(state.dim() == 3, "selective_scan_: state must be [b, D, N], got ", state.sizes());
  const int64_t b = state.size(0), D = state.size(1), N = state.size(2);
  TORCH_CHECK(x.dim() == 3 && x.size(0) == b && x.size(2) == D,
              "selective_scan_: x must be [b, T, D] = [", b, ", T, ", D, "], got ", x.sizes());
  const int64_t T = x.size(1);
  TORCH_CHECK(dt.sizes() == x.sizes(), "selective_scan_: dt must be x's shape ", x.sizes(), ", got ", dt.sizes());
  TORCH_CHECK(A.dim() == 2 && A.size(0) == D && A.size(1) == N,
              "selective_scan_: A must be [D, N] = [", D, ", ", N, "], got ", A.sizes());
  const std::vector<int64_t> per_token{b, T, N};
  TORCH_CHECK(B.sizes() == at::IntArrayRef(per_token),
              "selective_scan_: B must be [b, T, N] = ", at::IntArrayRef(per_token), ", got ", B.sizes());
  if (C.has_value()) {
    TORCH_CHECK(C->device().is_cpu() && C->scalar_type() == at::kFloat && C->is_contiguous(),
                "selective_scan_: state, x, dt, A, B and C must be contiguous float32 CPU tensors");
    TORCH_CHECK(C->sizes() == B.sizes(), "selective_scan_: C must be B's shape ", B.sizes(), ", got ", C->sizes());
  }
  const std::vector<int64_t> count = triforce::row_counts(counts, b, T, "selective_scan_");
  auto y = C.has_value() ? at::empty({b, T, D}, x.options()) : at::empty({0}, x.options());
  if (T == 0 || b * D == 0) return y;
  if (N == 0) {  // no state: nothing to advance, every readout an empty sum
    if (C.has_value()) y.zero_();
    return y;
  }
  float* sp = state.data_ptr<float>();
  const float *xp = x.const_data_ptr<float>(), *dtp = dt.const_data_ptr<float>(), *ap = A.const_data_ptr<float>();
  const float *bp = B.const_data_ptr<float>(), *cp = C.has_value() ? C->const_data_ptr<float>() : nullptr;
  float* yp = C.has_value() ? y.data_ptr<float>() : nullptr;
  const int64_t per_row = (D + kBlock - 1) / kBlock, blocks = b * per_row;
  // (each (row, channel block) by one thread, each channel's state row through every token in order: the result never
  // depends on the threads or on T; the work: the state streamed in and out, ~16 multiply-adds per state element and
  // token, most of them its decay's exp)
  const bool parallel = triforce::worth_parallel(state.numel() * 4 * 2 + state.numel() * T * 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t i = blk / per_row, d0 = (blk % per_row) * kBlock, d1 = std::min<int64_t>(d0 + kBlock, D);
    const int64_t cnt = count[static_cast<size_t>(i)];
    const float* bi = bp + i * T * N;
    const float* ci = cp == nullptr ? nullptr : cp + i * T * N;
#if defined(__AVX512F__)
    if (N % 16 == 0) {
      for (int64_t d = d0; d < d1; d += 16) {
        const int w = static_cast<int>(std::min<int64_t>(16, d1 - d));
        scan_group16(sp + (i * D + d) * N, ap + d * N, N, w, T, cnt, xp + i * T * D + d, dtp + i * T * D + d, D, bi,
                     ci, yp == nullptr ? nullptr : yp + i * T * D + d);
      }
      continue;
    }
#endif
    for (int64_t d = d0; d < d1; ++d) {
      float* s = sp + (i * D + d) * N;
      const float* a = ap + d * N;
      const float *xd = xp + i * T * D + d, *dtd = dtp + i * T * D + d;
      float* yd = yp == nullptr ? nullptr : yp + i * T * D + d;
      if (N == kLanes) {
        scan_channel(s, a, std::integral_constant<int64_t, kLanes>{}, T, cnt, xd, dtd, D, bi, ci, yd);
      } else {
        scan_channel(s, a, N, T, cnt, xd, dtd, D, bi, ci, yd);
      }
    }
  }
  return y;
}
