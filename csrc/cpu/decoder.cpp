// The model layer's decoder layer on the CPU in two calls: everything before the KV cache
// (decoder_attn_in) and everything after it (decoder_attn_out_mlp). triforce/models/llama.py's
// DecoderLayer takes this path for the forwards the few-row linear kernel serves (a decode or
// verification step: at most ROWWISE_MAX_ROWS rows); the cache's attend stays in Python between them.
//
// Why: a SmolLM2-135M decode step on one core spends ~10 ms of its ~40 in ~1,800 dispatched tensor ops
// (60 per layer) and the Python around them, not in its kernels. Here a layer costs two dispatches.
//
// Bitwise contract: each call computes exactly what the Python modules compute (RMSNorm, Linear on its
// rowwise path, RoPE, SwiGLU MLP, residual adds), with the same rowwise_linear / rowwise_linear_q8
// kernels, so the outputs are bitwise those of the composite path (tests/test_decoder.py checks it), and
// the row independence of the few-row kernels carries over. The reductions whose order is ATen's own
// (the norms' sums of squares) and SiLU (ATen's vectorised exp) run as ATen ops; every elementwise step
// around them (the squares, the mean's division, + eps, 1 / sqrt, the scalings, the residual adds,
// SiLU(gate) * up, RoPE) is a plain loop that rounds each operation exactly as ATen's kernel does: IEEE
// float arithmetic, bfloat16 results rounded to nearest even.
//
// Why the loops: an ATen elementwise op costs microseconds on a 576-element row, much of it in code
// (TensorIterator) that the layer's weight stream evicts from the caches between two calls; a SmolLM2
// layer ran ~20 of them per step, now 3 (docs/model.md, "Fused decoder layer on CPU").
//
// Files: csrc/cpu/decoder.cpp, tests/test_decoder.py, bench/bench_decoder.py; docs/model.md ("Fused
// decoder layer on CPU").
#include <ATen/ATen.h>

#include <cmath>

#include "../ops.h"

namespace {

// x [M, K] -> [M, N]: Linear's rowwise path (w float32/bfloat16 like x) or Q8Linear's (w int8 with
// float32 scales, x float32); the bias added in place, as both modules do.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& scales,
                   const std::optional<at::Tensor>& bias) {
  at::Tensor y = scales.has_value() ? rowwise_linear_q8(x, w, *scales) : rowwise_linear(x, w);
  if (bias.has_value()) y.add_(*bias);
  return y;
}

// The elementwise loops round each operation on its own, as ATen's kernels do: no contraction of a
// product and a sum into an FMA, which would round once instead of twice.
#if defined(__GNUC__) && !defined(__clang__)
#define TRIFORCE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else  // clang contracts only within one expression (-ffp-contract=on), and the products are statements
#define TRIFORCE_NO_FP_CONTRACT
#endif

// The loops take float32 and bfloat16 tensors (the fused path's dtypes; c10::BFloat16 arithmetic is float
// arithmetic rounded to nearest even); anything else runs the ATen composite.
bool native_dtype(const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; }

template <typename S>
inline float fl(S v) { return static_cast<float>(v); }

template <typename S>
TRIFORCE_NO_FP_CONTRACT void squares(const S* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = fl(x[i]) * fl(x[i]);
}

// Rows of RMSNorm given each row's sum of squares ss[m]: w * S(x * (1 / sqrt(ss / H + float(eps)))), the
// mean's division, the scalar add, ATen's rsqrt (1 / sqrt, both correctly rounded), the product rounded
// to S and the weight's product in S.
template <typename S>
TRIFORCE_NO_FP_CONTRACT void rms_norm_rows(const S* x, const S* w, const float* ss, float eps, S* out, int64_t M,
                                           int64_t H) {
  const float n = static_cast<float>(H);
  for (int64_t m = 0; m < M; ++m) {
    const float r = 1.f / std::sqrt(ss[m] / n + eps);
    const S* xr = x + m * H;
    S* o = out + m * H;
    for (int64_t i = 0; i < H; ++i) o[i] = S(fl(w[i]) * fl(S(fl(xr[i]) * r)));
  }
}

template <typename S>
at::Tensor rms_norm_loops(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t H = x.size(-1);
  at::Tensor sq = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  squares(x.const_data_ptr<S>(), sq.data_ptr<float>(), x.numel());
  // mean(-1, keepdim=True)'s sum: ATen's reduction order, [..., 1] contiguous
  const at::Tensor ss = at::sum(sq, {-1}, /*keepdim=*/true);
  at::Tensor out = at::empty_like(x);
  rms_norm_rows(x.const_data_ptr<S>(), w.const_data_ptr<S>(), ss.const_data_ptr<float>(), static_cast<float>(eps),
                out.data_ptr<S>(), x.numel() / H, H);
  return out;
}

// RMSNorm as triforce.models.llama.RMSNorm: fp32 statistics, weight applied in the input dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!(native_dtype(x) && w.scalar_type() == x.scalar_type() && w.dim() == 1 && w.size(0) == x.size(-1) &&
        x.size(-1) > 0)) {
    at::Tensor xf = x.to(at::kFloat);  // no copy for float32 (x.float())
    xf = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
    return w * xf.to(x.scalar_type());
  }
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  return x.scalar_type() == at::kFloat ? rms_norm_loops<float>(xc, wc, eps) : rms_norm_loops<at::BFloat16>(xc, wc, eps);
}

// a + b or a * b, rounding as ATen's add / mul (each commutative bitwise). Where the loop applies the
// result is written over a: callers pass a tensor of their own that nothing else holds.
template <bool MUL, typename S>
TRIFORCE_NO_FP_CONTRACT void combine_rows(S* a, const S* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = S(MUL ? fl(a[i]) * fl(b[i]) : fl(a[i]) + fl(b[i]));
}

template <bool MUL>
at::Tensor combine(at::Tensor a, const at::Tensor& b) {
  if (!(native_dtype(a) && b.scalar_type() == a.scalar_type() && a.is_contiguous() && b.sizes() == a.sizes()))
    return MUL ? a * b : a + b;  // the ATen op (dtype promotion, broadcasting)
  const at::Tensor bc = b.contiguous();
  if (a.scalar_type() == at::kFloat)
    combine_rows<MUL>(a.data_ptr<float>(), bc.const_data_ptr<float>(), a.numel());
  else
    combine_rows<MUL>(a.data_ptr<at::BFloat16>(), bc.const_data_ptr<at::BFloat16>(), a.numel());
  return a;
}

// RoPE in one loop, elementwise exactly as ATen evaluates the composite below: each product and the sum
// rounded to the element type.
template <typename S>
TRIFORCE_NO_FP_CONTRACT void rope_rows(const S* x, const S* cos, const S* sin, S* out, int64_t rows, int64_t heads,
                                       int64_t D) {
  const int64_t half = D / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const S* c = cos + r * D;
    const S* s = sin + r * D;
    for (int64_t h = 0; h < heads; ++h) {
      const S* xi = x + (r * heads + h) * D;
      S* o = out + (r * heads + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        const S rotated = d < half ? S(-xi[d + half]) : xi[d - half];
        const S a = xi[d] * c[d];
        const S b = rotated * s[d];
        o[d] = a + b;
      }
    }
  }
}

// triforce.models.rope.apply_rope: x * cos + rotate_half(x) * sin, x [B, T, H, D], cos/sin [B, T, 1, D].
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t D = x.size(-1);
  const bool loop = x.dim() == 4 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                    cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
                    cos.sizes() == sin.sizes() && cos.dim() == 4 && cos.size(0) == x.size(0) &&
                    cos.size(1) == x.size(1) && cos.size(2) == 1 && cos.size(3) == D;
  if (!loop) {  // any other layout or dtype: the composite itself
    const int64_t half = D / 2;
    const at::Tensor rotated = at::cat({at::neg(x.slice(-1, half)), x.slice(-1, 0, half)}, -1);
    return x * cos + rotated * sin;
  }
  const at::Tensor xc = x.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t rows = x.size(0) * x.size(1), heads = x.size(2);
  if (x.scalar_type() == at::kFloat)
    rope_rows(xc.const_data_ptr<float>(), cc.const_data_ptr<float>(), sc.const_data_ptr<float>(),
              out.data_ptr<float>(), rows, heads, D);
  else
    rope_rows(xc.const_data_ptr<at::BFloat16>(), cc.const_data_ptr<at::BFloat16>(),
              sc.const_data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, heads, D);
  return out;
}

void check_projections(const char* name, const std::vector<at::Tensor>& w,
                       const std::vector<std::optional<at::Tensor>>& scales,
                       const std::vector<std::optional<at::Tensor>>& bias, size_t n) {
  TORCH_CHECK(w.size() == n && scales.size() == n && bias.size() == n, name, ": expected ", n,
              " projections (weights, scales and biases alike), got ", w.size(), ", ", scales.size(), " and ",
              bias.size());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> decoder_attn_in(
    const at::Tensor& h, const at::Tensor& norm_w, double eps, at::TensorList w,
    const OptionalTensorList& scales_list, const OptionalTensorList& bias_list, const std::optional<at::Tensor>& q_norm_w,
    const std::optional<at::Tensor>& k_norm_w, double qk_eps, const at::Tensor& cos, const at::Tensor& sin,
    int64_t head_dim) {
  const std::vector<at::Tensor> ws = w.vec();
  const std::vector<std::optional<at::Tensor>> scales = scales_list.vec(), bias = bias_list.vec();
  check_projections("decoder_attn_in", ws, scales, bias, 3);
  TORCH_CHECK(h.dim() == 3, "decoder_attn_in: h must be [B, T, H], got ", h.sizes());
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "decoder_attn_in: head_dim must be even and positive, got ",
              head_dim);
  TORCH_CHECK(q_norm_w.has_value() == k_norm_w.has_value(), "decoder_attn_in: q_norm_w and k_norm_w go together");
  const int64_t B = h.size(0), T = h.size(1);
  const at::Tensor x = rms_norm(h, norm_w, eps).reshape({B * T, h.size(2)});
  at::Tensor q = project(x, ws[0], scales[0], bias[0]).view({B, T, -1, head_dim});
  at::Tensor k_raw = project(x, ws[1], scales[1], bias[1]).view({B, T, -1, head_dim});
  if (q_norm_w.has_value()) {  // Qwen3: per-head RMSNorm of queries and keys, before RoPE
    q = rms_norm(q, *q_norm_w, qk_eps);
    k_raw = rms_norm(k_raw, *k_norm_w, qk_eps);
  }
  const at::Tensor v = project(x, ws[2], scales[2], bias[2]).view({B, T, -1, head_dim});
  return {rope(q, cos, sin), rope(k_raw, cos, sin), k_raw, v};
}

at::Tensor decoder_attn_out_mlp(const at::Tensor& h, const at::Tensor& attn, const at::Tensor& norm_w, double eps,
                                at::TensorList w, const OptionalTensorList& scales_list,
                                const OptionalTensorList& bias_list) {
  const std::vector<at::Tensor> ws = w.vec();
  const std::vector<std::optional<at::Tensor>> scales = scales_list.vec(), bias = bias_list.vec();
  check_projections("decoder_attn_out_mlp", ws, scales, bias, 4);
  TORCH_CHECK(h.dim() == 3 && attn.dim() == 4 && attn.size(0) == h.size(0) && attn.size(1) == h.size(1),
              "decoder_attn_out_mlp: h must be [B, T, H] and attn [B, T, Hq, D], got ", h.sizes(), " and ",
              attn.sizes());
  const int64_t B = h.size(0), T = h.size(1), H = h.size(2);
  // project's results are fresh tensors of this call; the residual adds and SiLU(gate) * up are written
  // over them: h2 = o + h in o, SiLU(gate) * up in gate, down + h2 in down.
  const at::Tensor o = project(attn.reshape({B * T, -1}), ws[0], scales[0], bias[0]).view({B, T, -1});
  const at::Tensor h2 = combine<false>(o, h);
  const at::Tensor x = rms_norm(h2, norm_w, eps).reshape({B * T, H});
  at::Tensor gate = project(x, ws[1], scales[1], bias[1]);
  const at::Tensor up = project(x, ws[2], scales[2], bias[2]);
  const at::Tensor down = project(combine<true>(at::silu_(gate), up), ws[3], scales[3], bias[3]);
  return combine<false>(down.view({B, T, -1}), h2);
}
