// The model layer's decoder layer on the CPU in two calls: everything before the KV cache
// (decoder_attn_in) and everything after it (decoder_attn_out_mlp); and all the layers of a forward in
// one call (decoder_layers). triforce/models/llama.py's
// DecoderLayer takes this path for the forwards the few-row linear kernel serves (a decode or
// verification step: at most ROWWISE_MAX_ROWS rows), with the cache's attend in Python between the two
// calls, or all layers in decoder_layers where the cache allows it.
//
// Why: a SmolLM2-135M decode step on one core spends ~10 ms of its ~40 in ~1,800 dispatched tensor ops
// (60 per layer) and the Python around them, not in its kernels. Here a layer costs two dispatches.
//
// decoder_layers runs a forward's layers one after another in one call, each layer's two calls with
// the cache's side in between, for the caches whose attend is only "write the step's rows, then
// verify_attention over the buffers" (full, retrieval, and a StreamingLLM cache's small steps; a full
// cache's last queries too): the same functions in the same order, so the same bits. Why: the two calls
// per layer from Python, with the cache's index_put writes and the attention's dispatch between them,
// still cost ~70-90 us a layer on one core (~2 ms of a ~12 ms SmolLM2 decode step); in one call ~30 is
// left (the Python that gathers the arguments, and the calls' own allocations and ATen sums).
//
// Bitwise contract: each call computes exactly what the Python modules compute (RMSNorm, Linear on its
// rowwise path, RoPE, SwiGLU MLP, residual adds), with the same rowwise_linear / rowwise_linear_q8
// kernels, so the outputs are bitwise those of the composite path (tests/test_decoder.py checks it), and
// the row independence of the few-row kernels carries over. The reductions whose order is ATen's own
// (the norms' sums of squares) run as ATen ops; SiLU(gate) * up is the model layer's own op on the CPU
// (silu_mul, csrc/include/triforce/glu.h), which the MLP module calls too; every other elementwise step
// (the squares, the mean's division, + eps, 1 / sqrt, the scalings, the residual adds, RoPE) is a plain
// loop that rounds each operation exactly as ATen's kernel does: IEEE float arithmetic, bfloat16 results
// rounded to nearest even.
//
// Why the loops: an ATen elementwise op costs microseconds on a 576-element row, much of it in code
// (TensorIterator) that the layer's weight stream evicts from the caches between two calls; a SmolLM2
// layer ran ~20 of them per step, now 3 (docs/model.md, "Fused decoder layer on CPU").
//
// Files: csrc/cpu/decoder.cpp, tests/test_decoder.py, bench/bench_decoder.py; docs/model.md ("Fused
// decoder layer on CPU", "One native call per forward").
#include "triforce/team.h"  // first: its <immintrin.h> before ATen's (triforce/common.h says why)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "../ops.h"
#include "dispatch.h"
#include "triforce/glu.h"

namespace {

// x [M, K] -> [M, N]: Linear's rowwise path (w float32/bfloat16 like x), Q8Linear's (w int8 with float32
// scales, x float32), Q4Linear's (w uint8: GGUF Q4_1 blocks, no scales, x float32) or Int8DotLinear's (w
// uint8 codes with float16 or float32 scales: x rounded to int8 blocks, integer dot products); the bias added in place,
// as the modules do.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& scales,
                   const std::optional<at::Tensor>& bias) {
  at::Tensor y = run_product(product_of(x, nullptr, 0, w, scales));
  if (bias.has_value()) y.add_(*bias);
  return y;
}

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

// The kinds of norm a layer's norms are (one for all of a decoder_layers call's norms, its layers' q/k norms too):
// RMSNorm (rms_norm), torch's LayerNorm, Gemma's RMSNorm (the weight an offset from 1) and GPT-OSS's / OLMo 2's
// (the weight applied in float32): weighted_rms_norm; Cohere's LayerNorm (cohere_norm).
enum class Norm { kRms, kLayer, kGemma, kFloat32, kCohere };

// Rows of Gemma's RMSNorm (kGemma) or OLMo 2's (kFloat32) given each row's sum of squares: S((x * (1 / sqrt(ss / H +
// float(eps)))) * (1 + w)) or S(w * (x * ...)), every step in float32, rounded to S once at the end.
template <typename S, Norm kind>
TRIFORCE_NO_FP_CONTRACT void weighted_rms_norm_rows(const S* x, const S* w, const float* ss, float eps, S* out,
                                                    int64_t M, int64_t H) {
  const float n = static_cast<float>(H);
  for (int64_t m = 0; m < M; ++m) {
    const float r = 1.f / std::sqrt(ss[m] / n + eps);
    const S* xr = x + m * H;
    S* o = out + m * H;
    for (int64_t i = 0; i < H; ++i) {
      const float xn = fl(xr[i]) * r;
      o[i] = S(kind == Norm::kGemma ? xn * (1.f + fl(w[i])) : fl(w[i]) * xn);
    }
  }
}

// RMSNorm's rows of x (kRms, kGemma or kFloat32), contiguous, with w of x's dtype
template <typename S, Norm kind = Norm::kRms>
at::Tensor rms_norm_loops(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t H = x.size(-1);
  at::Tensor sq = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  squares(x.const_data_ptr<S>(), sq.data_ptr<float>(), x.numel());
  // mean(-1, keepdim=True)'s sum: ATen's reduction order, [..., 1] contiguous
  const at::Tensor ss = at::sum(sq, {-1}, /*keepdim=*/true);
  at::Tensor out = at::empty_like(x);
  if constexpr (kind == Norm::kRms)
    rms_norm_rows(x.const_data_ptr<S>(), w.const_data_ptr<S>(), ss.const_data_ptr<float>(), static_cast<float>(eps),
                  out.data_ptr<S>(), x.numel() / H, H);
  else
    weighted_rms_norm_rows<S, kind>(x.const_data_ptr<S>(), w.const_data_ptr<S>(), ss.const_data_ptr<float>(),
                                    static_cast<float>(eps), out.data_ptr<S>(), x.numel() / H, H);
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

// Gemma's RMSNorm (kGemma) as triforce.models.llama.GemmaRMSNorm computes it, (x_f32 * rsqrt(mean(x_f32^2) + eps)) *
// (1 + w_f32), or Float32RMSNorm's (kFloat32), w_f32 * (x_f32 * rsqrt(...)), rounded to x's dtype.
template <Norm kind>
at::Tensor weighted_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!(native_dtype(x) && w.scalar_type() == x.scalar_type() && w.dim() == 1 && w.size(0) == x.size(-1) &&
        x.size(-1) > 0)) {
    at::Tensor xf = x.to(at::kFloat);
    xf = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
    return (kind == Norm::kGemma ? xf * (w.to(at::kFloat) + 1.0) : w.to(at::kFloat) * xf).to(x.scalar_type());
  }
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  return x.scalar_type() == at::kFloat ? rms_norm_loops<float, kind>(xc, wc, eps)
                                       : rms_norm_loops<at::BFloat16, kind>(xc, wc, eps);
}

// Cohere's LayerNorm as triforce.models.llama.LayerNorm computes it, by the same ATen ops: no bias, in float32 (the
// row's mean subtracted, its variance about the mean), the weight applied in float32 (its q/k norms' weight [heads,
// head_dim], one row per head), rounded to x's dtype.
at::Tensor cohere_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  xf = xf - xf.mean({-1}, /*keepdim=*/true);
  xf = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return (w.to(at::kFloat) * xf).to(x.scalar_type());
}

// A layer's norm: RMSNorm (rms_norm), Gemma's or Float32RMSNorm's (weighted_rms_norm), Cohere's (cohere_norm), or
// torch's LayerNorm with the weight and the bias (none: DBRX's NoBiasLayerNorm), ATen's own op, as the modules call it
// (BiasLayerNorm: F.layer_norm; each row alone); with an empty weight OLMo's weightless one, computed in float32 and
// rounded to x's dtype as its module (BareLayerNorm).
at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, double eps, Norm kind) {
  if (kind == Norm::kRms) return rms_norm(x, w, eps);
  if (kind == Norm::kCohere) return cohere_norm(x, w, eps);
  if (kind == Norm::kGemma) return weighted_rms_norm<Norm::kGemma>(x, w, eps);
  if (kind == Norm::kFloat32) return weighted_rms_norm<Norm::kFloat32>(x, w, eps);
  if (w.numel() == 0) return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps).to(x.scalar_type());
  return at::layer_norm(x, {x.size(-1)}, w, b, eps);
}

// a + b (the residual adds), rounding as ATen's add (commutative bitwise). Where the loop applies the result is
// written over a: callers pass a tensor of their own that nothing else holds.
template <typename S>
TRIFORCE_NO_FP_CONTRACT void add_rows(S* a, const S* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = S(fl(a[i]) + fl(b[i]));
}

at::Tensor residual_add(at::Tensor a, const at::Tensor& b) {
  if (!(native_dtype(a) && b.scalar_type() == a.scalar_type() && a.is_contiguous() && b.sizes() == a.sizes()))
    return a + b;  // the ATen op (dtype promotion, broadcasting)
  const at::Tensor bc = b.contiguous();
  if (a.scalar_type() == at::kFloat)
    add_rows(a.data_ptr<float>(), bc.const_data_ptr<float>(), a.numel());
  else
    add_rows(a.data_ptr<at::BFloat16>(), bc.const_data_ptr<at::BFloat16>(), a.numel());
  return a;
}

// act(gate) * up into out (which may be gate), gate, up and out contiguous of one shape and dtype: one glu_row
// per row (csrc/include/triforce/glu.h: every element the same instructions, so a row's bits do not depend on
// the other rows or the threads), the rows split among the threads. Compute-bound: an element costs ~0.6 ns
// (float32) to ~1.1 ns (bfloat16) on one core of this project's VM, what streaming ~32 bytes takes, so that is
// the work it counts (parallel_min_bytes); the exact GELU (a division, e^x and a degree-11 polynomial) about four
// times that.
template <triforce::Act A>
void glu_into(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out, triforce::SwigluClamp c = {}) {
  const int64_t W = gate.dim() == 0 ? 1 : gate.size(-1);
  if (gate.numel() == 0) return;
  const int64_t rows = gate.numel() / W, row_work = (A == triforce::Act::kGelu ? 128 : 32) * W;
  TRIFORCE_DISPATCH_FLOAT(gate.scalar_type(), "glu", [&] {
    const scalar_t* g = tf_ptr<scalar_t>(gate);
    const scalar_t* u = tf_ptr<scalar_t>(up);
    scalar_t* o = tf_mut_ptr<scalar_t>(out);
    const int64_t grain = std::max<int64_t>(1, triforce::Team::kMinBytes / row_work);
    triforce::parallel_ranges(triforce::worth_parallel_here(rows * row_work), rows, grain,
                              [&](int64_t lo, int64_t hi) {
                                for (int64_t r = lo; r < hi; ++r)
                                  triforce::glu_row<A>(g + r * W, u + r * W, o + r * W, W, c);
                              });
  });
}

template <triforce::Act A>
at::Tensor glu_op(const char* name, const at::Tensor& gate, const at::Tensor& up, triforce::SwigluClamp c = {}) {
  TORCH_CHECK(gate.sizes() == up.sizes(), name, ": gate and up must have one shape, got ", gate.sizes(), " and ",
              up.sizes());
  TORCH_CHECK(gate.scalar_type() == up.scalar_type(), name, ": gate and up must have one dtype, got ",
              gate.scalar_type(), " and ", up.scalar_type());
  TORCH_CHECK(gate.device().is_cpu() && up.device().is_cpu(), name, ": CPU tensors only");
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty_like(g, at::MemoryFormat::Contiguous);
  glu_into<A>(g, u, out, c);
  return out;
}

// The MLP of a layer: Llama's gated SwiGLU, down(SiLU(gate(x)) * up(x)), Gemma's GeGLU (GELU's tanh form for SiLU),
// or an ungated down(act(up(x)))
// (triforce.models.llama.FeedForward): GELU's tanh form and the exact GELU as the module's _activated computes them
// on the CPU (the native act(x) * 1: the product by one is exact), ReLU and ReLU squared as its ATen ops.
enum class Mlp { kSwiGlu, kGeGluTanh, kGeGlu, kGeluTanh, kGelu, kRelu, kRelu2, kXielu };

// A layer's MLP: its kind, and for xIELU (Apertus's) its four numbers [alpha_p, alpha_n, beta, eps] as the module
// computes them (XIELU.forward: the softplus of its parameters, as 1-element tensors of its dtype)
struct MlpSpec {
  Mlp kind;
  const at::Tensor* xielu;
  MlpSpec(Mlp k = Mlp::kSwiGlu, const at::Tensor* x = nullptr) : kind(k), xielu(x) {}  // NOLINT: implicit from Mlp
};

Mlp mlp_kind(const std::string& name) {
  if (name == "silu") return Mlp::kSwiGlu;
  if (name == "gelu_tanh_glu") return Mlp::kGeGluTanh;
  if (name == "gelu_glu") return Mlp::kGeGlu;
  if (name == "gelu_tanh") return Mlp::kGeluTanh;
  if (name == "gelu") return Mlp::kGelu;
  if (name == "relu") return Mlp::kRelu;
  if (name == "relu2") return Mlp::kRelu2;
  if (name == "xielu") return Mlp::kXielu;
  TORCH_CHECK(false, "decoder_layers: mlp must be 'silu', 'gelu_tanh_glu' or 'gelu_glu' (gated), or 'gelu_tanh', "
              "'gelu', 'relu', 'relu2', 'xielu' (ungated), got '", name, "'");
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

void check_projections(const char* name, size_t w, size_t scales, size_t bias, size_t n) {
  TORCH_CHECK(w == n && scales == n && bias == n, name, ": expected ", n,
              " projections (weights, scales and biases alike), got ", w, ", ", scales, " and ", bias);
}

// One layer's projections: weights, scales and biases of projection i at w[i], scales[i], bias[i].
// many({i, j, ...}, x): projections i, j, ... of the same x, which is rounded to int8 blocks once where
// they all take integer dot products (Int8DotLinear's weights: uint8 codes with scales); the same bits as
// one call each.
struct Projections {
  const at::Tensor* w;
  const std::optional<at::Tensor>* scales;
  const std::optional<at::Tensor>* bias;
  at::Tensor operator()(int i, const at::Tensor& x) const { return project(x, w[i], scales[i], bias[i]); }
  template <size_t n>
  std::array<at::Tensor, n> many(const std::array<int, n>& ids, const at::Tensor& x) const {
    std::array<at::Tensor, n> out;
    const bool i8 = x.scalar_type() == at::kFloat && x.dim() == 2 && std::all_of(ids.begin(), ids.end(), [&](int i) {
      return w[i].scalar_type() == at::kByte && scales[i].has_value();
    });
    if (!i8) {
      for (size_t j = 0; j < n; ++j) out[j] = (*this)(ids[j], x);
      return out;
    }
    const I8Rows xq = quantize_i8_rows(x);
    for (size_t j = 0; j < n; ++j) {
      const int i = ids[j];
      out[j] = rowwise_linear_i8_rows(xq, w[i], *scales[i]);
      if (bias[i].has_value()) out[j].add_(*bias[i]);
    }
    return out;
  }
};

// A layer's q/k norms: their kind (none: RMSNorms of the layers' kind, Llama's RMSNorm for LayerNorm layers), over
// each token's whole projections (OLMo 2's) or each head, after RoPE (Hunyuan's order), their biases (torch's
// LayerNorm: Persimmon's)
struct QkNorms {
  std::optional<Norm> kind;
  bool full = false, after_rope = false;
  std::optional<at::Tensor> q_bias, k_bias;
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attn_in(
    const at::Tensor& h, const at::Tensor& norm_w, double eps, const Projections& p,
    const std::optional<at::Tensor>& q_norm_w, const std::optional<at::Tensor>& k_norm_w, double qk_eps,
    const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim, const std::optional<at::Tensor>& norm_b = {},
    Norm kind = Norm::kRms, bool bare = false, double clip = 0.0, const QkNorms& qkn = {}, bool rope_f32 = false,
    at::Tensor* normed = nullptr) {
  const bool qk_full = qkn.full, qk_after_rope = qkn.after_rope;
  TORCH_CHECK(h.dim() == 3, "decoder_attn_in: h must be [B, T, H], got ", h.sizes());
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0, "decoder_attn_in: head_dim must be even and positive, got ",
              head_dim);
  TORCH_CHECK(q_norm_w.has_value() == k_norm_w.has_value(), "decoder_attn_in: q_norm_w and k_norm_w go together");
  const int64_t B = h.size(0), T = h.size(1);
  // (bare: the attention on h itself, no norm before it: opt-350m's norm after the residual add, attn_out_mlp_after;
  // OLMo 2's norm after the attention, attn_out_mlp_normed)
  const at::Tensor x = (bare ? h : norm(h, norm_w, norm_b, eps, kind)).reshape({B * T, h.size(2)});
  if (normed != nullptr) *normed = x;  // (the attention's input [B * T, H]: an output gate's, decoder_layers)
  auto [qp, kp, vp] = p.many<3>({0, 1, 2}, x);
  // the q/k norms (QkNorms): each query and key head before RoPE (Qwen3's, Gemma 3's), or where qk_full each token's
  // whole projections (OLMo 2's)
  const Norm qk = qkn.kind.value_or(kind == Norm::kLayer ? Norm::kRms : kind);
  if (q_norm_w.has_value() && qk_after_rope) {  // Hunyuan's, NanoChat's order: Attention._norms_after_rope's ops
    const at::Tensor q = qp.view({B, T, -1, head_dim}), k = kp.view({B, T, -1, head_dim});
    const at::Tensor kf = k.to(at::kFloat);  // (the key's RMSNorm statistics, weight 1: the unit-RMS key)
    const at::Tensor k_raw = (kf * at::rsqrt(kf.pow(2).mean({-1}, /*keepdim=*/true) + qk_eps)).to(k.scalar_type());
    return {norm(rope(q, cos, sin), *q_norm_w, qkn.q_bias, qk_eps, qk) * *k_norm_w, rope(k_raw, cos, sin), k_raw,
            vp.view({B, T, -1, head_dim})};
  }
  if (q_norm_w.has_value() && qk_full) {
    qp = norm(qp, *q_norm_w, qkn.q_bias, qk_eps, qk);
    kp = norm(kp, *k_norm_w, qkn.k_bias, qk_eps, qk);
  }
  at::Tensor q = qp.view({B, T, -1, head_dim});
  at::Tensor k_raw = kp.view({B, T, -1, head_dim});
  if (q_norm_w.has_value() && !qk_full) {
    q = norm(q, *q_norm_w, qkn.q_bias, qk_eps, qk);
    k_raw = norm(k_raw, *k_norm_w, qkn.k_bias, qk_eps, qk);
  }
  at::Tensor v = vp.view({B, T, -1, head_dim});
  if (clip > 0) {  // OLMo's / MPT's clamp of q, k and v (clip_qkv), after the q/k norms, before RoPE: ATen's clamp
    q = q.clamp(-clip, clip);
    k_raw = k_raw.clamp(-clip, clip);
    v = v.clamp(-clip, clip);
  }
  if (rope_f32 && q.scalar_type() != at::kFloat) {  // (Cohere's, GPT-J's, ERNIE 4.5's: in float32, rounded once)
    const at::Tensor cf = cos.to(at::kFloat), sf = sin.to(at::kFloat);
    return {rope(q.to(at::kFloat), cf, sf).to(q.scalar_type()), rope(k_raw.to(at::kFloat), cf, sf).to(q.scalar_type()),
            k_raw, v};
  }
  return {rope(q, cos, sin), rope(k_raw, cos, sin), k_raw, v};
}

// fn of z's values with each value's bits its own, as triforce.models.llama._lanewise computes it: flat, zero-padded
// to a multiple of 64 (whole vector steps), in slices of 16384 (one thread each), ATen's fn on each
template <typename F>
at::Tensor lanewise(F&& fn, const at::Tensor& z) {
  constexpr int64_t kLanes = 64, kSlice = 16384;  // (_SIGMOID_LANES, _SIGMOID_SLICE)
  const int64_t n = z.numel();
  if (!z.device().is_cpu() || n == 0) return fn(z);
  const at::Tensor flat = at::constant_pad_nd(z.reshape(-1), {0, (kLanes - n % kLanes) % kLanes});
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < flat.numel(); i += kSlice) parts.push_back(fn(flat.slice(0, i, i + kSlice)));
  return at::cat(parts).slice(0, 0, n).view(z.sizes());
}

// Apertus's xIELU of x with its numbers a = [alpha_p, alpha_n, beta, eps] (MlpSpec), op by op as XIELU.forward
at::Tensor xielu(const at::Tensor& x, const at::Tensor* a) {
  const at::Tensor negative =
      (lanewise([](const at::Tensor& t) { return at::expm1(t); }, at::minimum(x, a[3])) - x) * a[1] + a[2] * x;
  return at::where(x > 0, a[0] * x * x + a[2] * x, negative);
}

// The MLP of a layer (projections 1-3 of p) on x [N, H] -> down's output [N, H], a fresh tensor: act(gate) * up
// written over gate, or act(up) over up (an ungated MLP: the gate's projection is not read)
at::Tensor mlp_out(const at::Tensor& x, const Projections& p, const MlpSpec& spec) {
  at::Tensor act;
  const Mlp mlp = spec.kind;
  if (mlp == Mlp::kSwiGlu || mlp == Mlp::kGeGluTanh || mlp == Mlp::kGeGlu) {
    auto [gate, up] = p.many<2>({1, 2}, x);
    if (mlp == Mlp::kSwiGlu)
      glu_into<triforce::Act::kSilu>(gate, up, gate);
    else if (mlp == Mlp::kGeGluTanh)
      glu_into<triforce::Act::kGeluTanh>(gate, up, gate);
    else
      glu_into<triforce::Act::kGelu>(gate, up, gate);
    act = gate;
  } else {  // (projection 1, the gate, is not read)
    act = p(2, x);
    if (mlp == Mlp::kGeluTanh)
      glu_into<triforce::Act::kGeluTanh>(act, at::ones_like(act), act);
    else if (mlp == Mlp::kGelu)
      glu_into<triforce::Act::kGelu>(act, at::ones_like(act), act);
    else if (mlp == Mlp::kXielu)
      act = xielu(act, spec.xielu);
    else
      act = mlp == Mlp::kRelu ? at::relu(act) : at::square(at::relu(act));
  }
  return p(3, act);
}

// t * m in place (t a fresh tensor of the caller's), as ATen multiplies a tensor by a Python float: m rounded to
// float32, each product rounded to t's dtype (Granite's residual multiplier); t itself where m is 1
TRIFORCE_NO_FP_CONTRACT at::Tensor scaled(at::Tensor t, double m) {
  if (m == 1.0) return t;
  if (!(native_dtype(t) && t.is_contiguous())) return t * m;
  const float mf = static_cast<float>(m);
  if (t.scalar_type() == at::kFloat) {
    float* x = t.data_ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) x[i] = x[i] * mf;
  } else {
    at::BFloat16* x = t.data_ptr<at::BFloat16>();
    for (int64_t i = 0; i < t.numel(); ++i) x[i] = at::BFloat16(fl(x[i]) * mf);
  }
  return t;
}

at::Tensor attn_out_mlp(const at::Tensor& h, const at::Tensor& attn, const at::Tensor& norm_w, double eps,
                        const Projections& p, const std::optional<at::Tensor>& norm_b = {}, Norm kind = Norm::kRms,
                        const MlpSpec& mlp = Mlp::kSwiGlu, bool parallel = false, double multiplier = 1.0) {
  TORCH_CHECK(h.dim() == 3 && attn.dim() == 4 && attn.size(0) == h.size(0) && attn.size(1) == h.size(1),
              "decoder_attn_out_mlp: h must be [B, T, H] and attn [B, T, Hq, D], got ", h.sizes(), " and ",
              attn.sizes());
  const int64_t B = h.size(0), T = h.size(1), H = h.size(2);
  // project's results are fresh tensors of this call; the residual adds and the activations are written
  // over them: h2 = o + h in o, SiLU(gate) * up in gate (act(up) in up), down + h2 in down. parallel (GPT-NeoX's,
  // Phi-2's, Falcon's block): the MLP on the norm of h itself, h + attn + mlp(norm(h)), the sum in that order.
  // multiplier (Granite's; sequential only): each block's output times it before its residual add
  const at::Tensor o = p(0, attn.reshape({B * T, -1})).view({B, T, -1});
  const at::Tensor h2 = residual_add(scaled(o, multiplier), h);  // (over o: h stays the layer's input)
  const at::Tensor x = norm(parallel ? h : h2, norm_w, norm_b, eps, kind).reshape({B * T, H});
  return residual_add(scaled(mlp_out(x, p, mlp).view({B, T, -1}), multiplier), h2);
}

// opt-350m's and GPT-1's layer after its attention, each norm after its block's residual add: h2 = norm_in(h + o),
// then norm_out(h2 + mlp(h2)), as the modules compute it (DecoderLayer.residual)
at::Tensor attn_out_mlp_after(const at::Tensor& h, const at::Tensor& attn, const at::Tensor& in_w, double in_eps,
                              const std::optional<at::Tensor>& in_b, const at::Tensor& out_w, double out_eps,
                              const std::optional<at::Tensor>& out_b, const Projections& p, Norm kind,
                              const MlpSpec& mlp) {
  const int64_t B = h.size(0), T = h.size(1), H = h.size(2);
  const at::Tensor o = p(0, attn.reshape({B * T, -1})).view({B, T, -1});
  const at::Tensor h2 = norm(residual_add(o, h), in_w, in_b, in_eps, kind);
  const at::Tensor down = mlp_out(h2.reshape({B * T, H}), p, mlp);
  return norm(residual_add(down.view({B, T, -1}), h2), out_w, out_b, out_eps, kind);
}

// A layer with norms after its blocks, as DecoderLayer.residual computes it: sandwich norms (Gemma 2 / 3's,
// GLM-4's; HyperCLOVA X's with a multiplier), h2 = h + norm_a(o) * m, then h2 + norm_c(mlp(norm_b(h2))) * m, the
// norms w[0..2] (post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm); or where !pre
// (OLMo 2's, EXAONE 4's: no norm before either block) h2 = h + norm_a(o), then h2 + norm_c(mlp(h2)), the norms w[0]
// and w[1]
at::Tensor attn_out_mlp_normed(const at::Tensor& h, const at::Tensor& attn, const at::Tensor* w, const double* eps,
                               const Projections& p, Norm kind, const MlpSpec& mlp, bool pre, double multiplier) {
  const int64_t B = h.size(0), T = h.size(1), H = h.size(2);
  const at::Tensor o = p(0, attn.reshape({B * T, -1})).view({B, T, -1});
  const at::Tensor h2 = residual_add(scaled(norm(o, w[0], {}, eps[0], kind), multiplier), h);
  const at::Tensor x = (pre ? norm(h2, w[1], {}, eps[1], kind) : h2).reshape({B * T, H});
  const int c = pre ? 2 : 1;
  return residual_add(scaled(norm(mlp_out(x, p, mlp).view({B, T, -1}), w[c], {}, eps[c], kind), multiplier), h2);
}


// ---- the KV cache's side of a layer (decoder_layers): what the model layer's caches do in Python
// (triforce/models/cache.py), for the caches whose attend is "write, then attend over the buffers".

// dst[i, j] = src[i, j] for an [H, D] block of es-byte elements (strides in elements).
void copy_block(char* dst, int64_t ds0, int64_t ds1, const char* src, int64_t ss0, int64_t ss1, int64_t H, int64_t D,
                int64_t es) {
  for (int64_t i = 0; i < H; ++i) {
    char* o = dst + i * ds0 * es;
    const char* x = src + i * ss0 * es;
    if (ds1 == 1 && ss1 == 1) {
      std::memcpy(o, x, D * es);
    } else {
      for (int64_t j = 0; j < D; ++j) std::memcpy(o + j * ds1 * es, x + j * ss1 * es, es);
    }
  }
}

// Copies the rows of x [B, T, H, D] into cache [B, N, H, D] at slots [B, T] (any strides; the dtype of
// both the same): cache[b, slots[b, t]] = x[b, t], as `cache[batch_index, slots] = x` does in Python.
// The slots were checked to be in [0, N) (decoder_layers, once for every layer).
void write_rows(const at::Tensor& cache, const at::Tensor& x, const at::Tensor& slots) {
  TORCH_CHECK(cache.dim() == 4 && x.dim() == 4 && cache.size(0) == x.size(0) && cache.size(2) == x.size(2) &&
                  cache.size(3) == x.size(3) && cache.scalar_type() == x.scalar_type(),
              "decoder_layers: a cache buffer ", cache.sizes(), " ", cache.scalar_type(), " cannot take rows ",
              x.sizes(), " ", x.scalar_type());
  const int64_t B = x.size(0), T = x.size(1), es = x.element_size();
  const int64_t* s = slots.const_data_ptr<int64_t>();
  char* dst = static_cast<char*>(cache.data_ptr());
  const char* src = static_cast<const char*>(x.const_data_ptr());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = s[b * T + t];
      copy_block(dst + (b * cache.stride(0) + slot * cache.stride(1)) * es, cache.stride(2), cache.stride(3),
                 src + (b * x.stride(0) + t * x.stride(1)) * es, x.stride(2), x.stride(3), x.size(2), x.size(3), es);
    }
  }
}

// A full cache's last_query [B, Hq, D] of this layer: q[b, 0], or q[b, query_index[b]] where
// query_valid[b] (other rows keep theirs), as FullCache.attend does. query_index was checked to be in
// [-T, T) (decoder_layers, once for every layer); a negative index counts from the end, as in Python.
void record_query(const at::Tensor& last_query, const at::Tensor& q, const std::optional<at::Tensor>& query_index,
                  const std::optional<at::Tensor>& query_valid) {
  const int64_t B = q.size(0), T = q.size(1), es = q.element_size();
  TORCH_CHECK(last_query.dim() == 3 && last_query.size(0) == B && last_query.size(1) == q.size(2) &&
                  last_query.size(2) == q.size(3) && last_query.scalar_type() == q.scalar_type(),
              "decoder_layers: last_query must be [B, Hq, D] in q's dtype, got ", last_query.sizes());
  char* dst = static_cast<char*>(last_query.data_ptr());
  const char* src = static_cast<const char*>(q.const_data_ptr());
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    if (query_index.has_value()) {
      if (!query_valid->const_data_ptr<bool>()[b]) continue;
      t = query_index->const_data_ptr<int64_t>()[b];
      if (t < 0) t += T;
    }
    copy_block(dst + b * last_query.stride(0) * es, last_query.stride(1), last_query.stride(2),
               src + (b * q.stride(0) + t * q.stride(1)) * es, q.stride(2), q.stride(3), q.size(2), q.size(3), es);
  }
}

// Forwards left to run without a team after a stalled one (triforce/team.h: a busy machine), and how many
// the next stall leaves: 1 after a forward whose team did not stall, doubling with each stall up to 64.
std::atomic<int> forwards_without_team{0}, forwards_after_stall{1};
constexpr int kMostForwardsAfterStall = 64;
// A forward streaming less (weights and the keys and values its attention reads) runs without a team: it
// takes ~0.1 ms on one core, about what forming the team costs (the region's start and end).
constexpr int64_t kTeamMinForwardBytes = int64_t(2) << 20;
// forward_team_stats: forwards run with a team, those of them that stalled, indices the workers ran.
std::atomic<int64_t> team_forwards{0}, team_stalls{0}, team_worker_indices{0};

// f() on the calling thread, with the other threads of torch's intra-op count serving its kernels' parallel
// loops as a team (triforce/team.h: one OpenMP region for the whole forward instead of a wake-up per
// kernel). Not with one thread, inside another parallel region, for a forward that streams less than
// kTeamMinForwardBytes (forming the team costs more than it can save; forward_bytes() is asked only past
// the cheaper checks), for some forwards after one whose team stalled (forwards_after_stall), or with
// TRIFORCE_FORWARD_TEAM=0 (read at every call): then the kernels open their own regions as before. Test
// hooks: TRIFORCE_FORWARD_TEAM=serial forms the team stalled (the kernels' loops run inside the region on the
// calling thread alone), =workers forms it at every forward and has its workers run every index. The result
// is the same bits either way.
template <typename Bytes, typename F>
at::Tensor with_team(Bytes&& forward_bytes, F&& f) {
  const char* env = std::getenv("TRIFORCE_FORWARD_TEAM");
  const int nt = at::get_num_threads();
  if (nt <= 1 || at::in_parallel_region() || (env != nullptr && std::strcmp(env, "0") == 0)) return f();
  using Mode = triforce::Team::Mode;
  const Mode mode = env == nullptr                      ? Mode::kAdaptive
                    : std::strcmp(env, "serial") == 0 ? Mode::kSerial
                    : std::strcmp(env, "workers") == 0 ? Mode::kWorkers
                                                      : Mode::kAdaptive;
  if (mode == Mode::kAdaptive && forward_bytes() < kTeamMinForwardBytes) return f();
  if (mode == Mode::kAdaptive && forwards_without_team.load(std::memory_order_relaxed) > 0) {
    forwards_without_team.fetch_sub(1, std::memory_order_relaxed);
    return f();
  }
#if defined(_OPENMP)
  triforce::Team team(nt, mode);
  at::Tensor out;
  std::exception_ptr err;
#pragma omp parallel num_threads(nt)
  {
    if (omp_get_thread_num() == 0) {  // the calling thread
      {
        triforce::TeamScope scope(&team);
        team.joined(omp_get_num_threads() - 1);
        try {
          out = f();
        } catch (...) {
          err = std::current_exception();
        }
      }
      team.stop();
    } else {
      team.serve(omp_get_thread_num());
    }
  }
  team_forwards.fetch_add(1, std::memory_order_relaxed);
  team_worker_indices.fetch_add(team.worker_indices(), std::memory_order_relaxed);
  if (team.stalled() && mode == Mode::kAdaptive) {
    team_stalls.fetch_add(1, std::memory_order_relaxed);
    const int skip = forwards_after_stall.load(std::memory_order_relaxed);
    forwards_without_team.store(skip, std::memory_order_relaxed);
    forwards_after_stall.store(std::min(2 * skip, kMostForwardsAfterStall), std::memory_order_relaxed);
  } else if (mode == Mode::kAdaptive) {
    forwards_after_stall.store(1, std::memory_order_relaxed);
  }
  if (err) std::rethrow_exception(err);
  return out;
#else
  return f();
#endif
}

}  // namespace

std::vector<int64_t> forward_team_stats() {
  return {team_forwards.load(), team_stalls.load(), team_worker_indices.load()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> decoder_attn_in(
    const at::Tensor& h, const at::Tensor& norm_w, double eps, at::TensorList w,
    const OptionalTensorList& scales_list, const OptionalTensorList& bias_list, const std::optional<at::Tensor>& q_norm_w,
    const std::optional<at::Tensor>& k_norm_w, double qk_eps, const at::Tensor& cos, const at::Tensor& sin,
    int64_t head_dim) {
  const std::vector<std::optional<at::Tensor>> scales = scales_list.vec(), bias = bias_list.vec();
  check_projections("decoder_attn_in", w.size(), scales.size(), bias.size(), 3);
  return attn_in(h, norm_w, eps, {w.data(), scales.data(), bias.data()}, q_norm_w, k_norm_w, qk_eps, cos, sin,
                 head_dim);
}

at::Tensor decoder_attn_out_mlp(const at::Tensor& h, const at::Tensor& attn, const at::Tensor& norm_w, double eps,
                                at::TensorList w, const OptionalTensorList& scales_list,
                                const OptionalTensorList& bias_list) {
  const std::vector<std::optional<at::Tensor>> scales = scales_list.vec(), bias = bias_list.vec();
  check_projections("decoder_attn_out_mlp", w.size(), scales.size(), bias.size(), 4);
  return attn_out_mlp(h, attn, norm_w, eps, {w.data(), scales.data(), bias.data()});
}

std::tuple<at::Tensor, at::Tensor> decoder_attn_out(const at::Tensor& h, const at::Tensor& attn,
                                                    const at::Tensor& norm_w, double eps, at::TensorList w,
                                                    const OptionalTensorList& scales_list,
                                                    const OptionalTensorList& bias_list) {
  const std::vector<std::optional<at::Tensor>> scales = scales_list.vec(), bias = bias_list.vec();
  check_projections("decoder_attn_out", w.size(), scales.size(), bias.size(), 1);
  TORCH_CHECK(h.dim() == 3 && attn.dim() == 4 && attn.size(0) == h.size(0) && attn.size(1) == h.size(1),
              "decoder_attn_out: h must be [B, T, H] and attn [B, T, Hq, D], got ", h.sizes(), " and ", attn.sizes());
  const Projections p{w.data(), scales.data(), bias.data()};
  const int64_t B = h.size(0), T = h.size(1);
  const at::Tensor h2 = residual_add(p(0, attn.reshape({B * T, -1})).view({B, T, -1}), h);
  return {h2, rms_norm(h2, norm_w, eps)};
}

// DeepSeek's latent attention between its products (triforce.models.llama.LatentAttention.project): c the RMSNorm of
// kv's first R dims, the queries [q_pe, q_lat] and the keys [k_pe, c] gathered by layout, RoPE on both (in float32,
// rounded once, where rope_f32 and the tensors are 16-bit). Bitwise the module's ATen ops, as attn_in is.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_qk(const at::Tensor& q, const at::Tensor& q_lat,
                                                      const at::Tensor& kv, const at::Tensor& norm_w, double eps,
                                                      const at::Tensor& cos, const at::Tensor& sin,
                                                      const at::Tensor& layout, bool rope_f32) {
  TORCH_CHECK(q.device().is_cpu() && q_lat.device().is_cpu() && kv.device().is_cpu() && layout.device().is_cpu(),
              "mla_qk: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && q_lat.dim() == 4 && kv.dim() == 3, "mla_qk: q and q_lat must be [B, T, H, *] and kv "
              "[B, T, R + r], got ", q.sizes(), ", ", q_lat.sizes(), " and ", kv.sizes());
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), R = q_lat.size(3), D = kv.size(2), r = D - R;
  TORCH_CHECK(q_lat.size(0) == B && q_lat.size(1) == T && q_lat.size(2) == H && kv.size(0) == B && kv.size(1) == T &&
                  r > 0 && r % 2 == 0 && R % 2 == 0 && q.size(3) > r,
              "mla_qk: q [B, T, H, nope + r], q_lat [B, T, H, R] and kv [B, T, R + r] (R, r even) disagree: ",
              q.sizes(), ", ", q_lat.sizes(), " and ", kv.sizes());
  TORCH_CHECK(q.scalar_type() == q_lat.scalar_type() && kv.scalar_type() == q.scalar_type(),
              "mla_qk: q, q_lat and kv must have one dtype");
  TORCH_CHECK(layout.scalar_type() == at::kLong && layout.dim() == 1 && layout.size(0) == D,
              "mla_qk: layout must be int64 [R + r] = [", D, "], got ", layout.scalar_type(), " ", layout.sizes());
  const at::Tensor lay = layout.contiguous();
  const int64_t* src = lay.const_data_ptr<int64_t>();
  for (int64_t d = 0; d < D; ++d)
    TORCH_CHECK(0 <= src[d] && src[d] < D, "mla_qk: layout[", d, "] = ", src[d], " is outside [0, ", D, ")");
  const int64_t nope = q.size(3) - r;
  const at::Tensor c = rms_norm(kv.slice(-1, 0, R), norm_w, eps).contiguous();
  const at::Tensor qc = q.contiguous(), lc = q_lat.contiguous(), kc = kv.contiguous();
  at::Tensor q_asm = at::empty({B, T, H, D}, q.options()), k_raw = at::empty({B, T, 1, D}, q.options());
  const int64_t es = q.element_size(), rows = B * T;
  const char* qp = static_cast<const char*>(qc.const_data_ptr());
  const char* lp = static_cast<const char*>(lc.const_data_ptr());
  const char* kp = static_cast<const char*>(kc.const_data_ptr());
  const char* cp = static_cast<const char*>(c.const_data_ptr());
  char* qo = static_cast<char*>(q_asm.data_ptr());
  char* ko = static_cast<char*>(k_raw.data_ptr());
  // dim d of a key or query head is [pe, latent]'s dim src[d]: the layout as runs of consecutive dims of one part
  // (DeepSeek's: four), each one memcpy
  struct Run {
    int64_t d, from, n;
    bool pe;
  };
  std::vector<Run> runs;
  for (int64_t d = 0; d < D; ++d) {
    const bool pe = src[d] < r;
    const int64_t from = pe ? src[d] : src[d] - r;
    if (!runs.empty() && runs.back().pe == pe && runs.back().from + runs.back().n == from &&
        runs.back().d + runs.back().n == d)
      ++runs.back().n;
    else
      runs.push_back({d, from, 1, pe});
  }
  const int64_t qw = nope + r;
  const auto gather = [&](char* o, const char* pe, const char* lat) {
    for (const Run& run : runs) std::memcpy(o + run.d * es, (run.pe ? pe : lat) + run.from * es, run.n * es);
  };
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t h = 0; h < H; ++h)
      gather(qo + (m * H + h) * D * es, qp + ((m * H + h) * qw + nope) * es, lp + (m * H + h) * R * es);
    gather(ko + m * D * es, kp + (m * D + R) * es, cp + m * R * es);
  }
  if (rope_f32 && q.scalar_type() != at::kFloat) {  // (DeepSeek-V2's complex product in float32, rounded once)
    const at::Tensor cf = cos.to(at::kFloat), sf = sin.to(at::kFloat);
    return {rope(q_asm.to(at::kFloat), cf, sf).to(q.scalar_type()),
            rope(k_raw.to(at::kFloat), cf, sf).to(q.scalar_type()), k_raw};
  }
  return {rope(q_asm, cos, sin), rope(k_raw, cos, sin), k_raw};
}

at::Tensor rms_norm_op(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rms_norm: CPU tensors only");
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1),
              "rms_norm: w must be [H] for x [..., H], got ", w.sizes(), " and ", x.sizes());
  return rms_norm(x, w, eps);
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  return glu_op<triforce::Act::kSilu>("silu_mul", gate, up);
}

at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up) {
  return glu_op<triforce::Act::kGeluTanh>("gelu_tanh_mul", gate, up);
}

at::Tensor gelu_mul(const at::Tensor& gate, const at::Tensor& up) {
  return glu_op<triforce::Act::kGelu>("gelu_mul", gate, up);
}

void check_swiglu_clamp(const char* name, double alpha, double limit) {
  TORCH_CHECK(std::isfinite(alpha) && std::isfinite(limit) && limit > 0, name,
              ": alpha must be finite and limit finite and > 0, got ", alpha, " and ", limit);
}

at::Tensor swiglu_clamped_mul(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit) {
  check_swiglu_clamp("swiglu_clamped_mul", alpha, limit);
  return glu_op<triforce::Act::kSwigluClamped>("swiglu_clamped_mul", gate, up,
                                               {static_cast<float>(alpha), static_cast<float>(limit)});
}

at::Tensor decoder_layers(const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                          at::TensorList norm_w, at::ArrayRef<double> eps, at::TensorList w,
                          const OptionalTensorList& scales_list, const OptionalTensorList& bias_list,
                          const OptionalTensorList& qk_norm_list, at::ArrayRef<double> qk_eps,
                          at::TensorList k_cache, at::TensorList v_cache, at::TensorList k_raw_cache,
                          at::TensorList last_query, const at::Tensor& slots, const at::Tensor& cache_seqlens,
                          const std::optional<at::Tensor>& tree_mask, const std::optional<at::Tensor>& query_index,
                          const std::optional<at::Tensor>& query_valid, const std::optional<at::Tensor>& rows,
                          at::OptionalIntArrayRef windows, const std::optional<at::Tensor>& window_leftpad,
                          const std::optional<OptionalTensorList>& norm_bias_list, const std::string& mlp_name,
                          std::optional<double> attention_scale, bool parallel, bool norm_after,
                          const std::optional<at::Tensor>& alibi_slopes, double clip_qkv, bool sandwich,
                          const std::string& norm_name, double softcap, std::optional<at::TensorList> ropes,
                          at::OptionalIntArrayRef rope_of, bool post_norms, bool qk_norm_full,
                          double residual_multiplier, bool rope_float32, const std::optional<at::Tensor>& query_scale,
                          bool qk_norm_after_rope, std::optional<at::TensorList> sinks,
                          std::optional<at::TensorList> xielu, const std::string& qk_norm_name,
                          const std::optional<OptionalTensorList>& qk_norm_bias_list, bool mixture_last,
                          const std::optional<OptionalTensorList>& attn_gate_list, const std::string& attn_gate_kind) {
  const size_t L = k_cache.size();
  TORCH_CHECK(!(parallel && norm_after), "decoder_layers: parallel and norm_after are two layouts, not one");
  TORCH_CHECK(int(parallel) + int(norm_after) + int(sandwich) + int(post_norms) <= 1 || !(sandwich || post_norms),
              "decoder_layers: sandwich and post_norms are layouts of their own, not with parallel, norm_after or "
              "each other");
  TORCH_CHECK(!mixture_last || !norm_after,
              "decoder_layers: mixture_last takes a layer whose norms come before its blocks' adds (not norm_after)");
  TORCH_CHECK(std::isfinite(residual_multiplier) && (residual_multiplier == 1.0 || !(parallel || norm_after ||
                                                                                      post_norms)),
              "decoder_layers: residual_multiplier must be finite, and 1 with parallel, norm_after or post_norms "
              "(their layers have none), got ", residual_multiplier);
  const Mlp mlp = mlp_kind(mlp_name);
  TORCH_CHECK((mlp == Mlp::kXielu) == xielu.has_value() && (!xielu.has_value() || xielu->size() == 4 * L),
              "decoder_layers: mlp 'xielu' takes xielu, its four numbers [alpha_p, alpha_n, beta, eps] a layer (",
              4 * L, "), and no other mlp does; got ", xielu.has_value() ? xielu->size() : 0);
  TORCH_CHECK(!sinks.has_value() || sinks->size() == L, "decoder_layers: expected one sinks tensor a layer (", L,
              "), got ", sinks.has_value() ? sinks->size() : 0);
  // the heads' output gated before o_proj by a projection of the attention's input: AFMoE's sigmoid of it, Laguna's
  // softplus (in float32, rounded) per head or per dim; attn_gate: [weight, scales, bias] a layer
  TORCH_CHECK(attn_gate_kind.empty() || attn_gate_kind == "sigmoid" || attn_gate_kind == "softplus_head" ||
                  attn_gate_kind == "softplus_dim",
              "decoder_layers: attn_gate_kind must be '', 'sigmoid', 'softplus_head' or 'softplus_dim', got '",
              attn_gate_kind, "'");
  TORCH_CHECK(attn_gate_list.has_value() == !attn_gate_kind.empty() &&
                  (!attn_gate_list.has_value() || attn_gate_list->size() == 3 * L),
              "decoder_layers: attn_gate (weight, scales, bias a layer: ", 3 * L, ") goes with attn_gate_kind; got ",
              attn_gate_list.has_value() ? attn_gate_list->size() : 0, " with '", attn_gate_kind, "'");
  std::vector<at::Tensor> gate_w;
  std::vector<std::optional<at::Tensor>> gate_s, gate_b;
  for (size_t i = 0; attn_gate_list.has_value() && i < L; ++i) {
    const std::optional<at::Tensor> gw = attn_gate_list->get(3 * i);
    TORCH_CHECK(gw.has_value(), "decoder_layers: attn_gate's layer ", i, " has no weight");
    gate_w.push_back(*gw);
    gate_s.push_back(attn_gate_list->get(3 * i + 1));
    gate_b.push_back(attn_gate_list->get(3 * i + 2));
  }
  // torch's LayerNorms (their biases given, one per norm: none for a norm without), else norms of norm_kind's kind:
  // Llama's RMSNorm, Gemma's (1 + w in float32), Float32RMSNorm's (w in float32), Cohere's LayerNorm (no bias)
  const bool layer_norm = norm_bias_list.has_value();
  TORCH_CHECK(norm_name == "llama" || norm_name == "gemma" || norm_name == "float32" || norm_name == "cohere",
              "decoder_layers: norm_kind must be 'llama', 'gemma', 'float32' or 'cohere', got '", norm_name, "'");
  TORCH_CHECK(!(layer_norm && (norm_name != "llama" || sandwich || post_norms)),
              "decoder_layers: norm_kind's norms, sandwich norms and post_norms take no norm_bias");
  const Norm kind = layer_norm                ? Norm::kLayer
                    : norm_name == "gemma"   ? Norm::kGemma
                    : norm_name == "float32" ? Norm::kFloat32
                    : norm_name == "cohere"  ? Norm::kCohere
                                             : Norm::kRms;
  TORCH_CHECK(!qk_norm_after_rope || !(qk_norm_full || clip_qkv > 0 || rope_float32),
              "decoder_layers: qk_norm_after_rope (Hunyuan's order) goes with neither qk_norm_full, clip_qkv nor "
              "rope_float32");
  // the q/k norms' kind where it is not the layers' ("": RMSNorms of the layers' kind), and their biases (torch's
  // LayerNorm, "layer": two a layer, each a bias or none)
  TORCH_CHECK(qk_norm_name.empty() || qk_norm_name == "llama" || qk_norm_name == "gemma" || qk_norm_name == "float32" ||
                  qk_norm_name == "cohere" || qk_norm_name == "layer",
              "decoder_layers: qk_norm_kind must be '', 'llama', 'gemma', 'float32', 'cohere' or 'layer', got '",
              qk_norm_name, "'");
  const std::optional<Norm> qk_kind = qk_norm_name.empty()          ? std::nullopt
                                      : qk_norm_name == "llama"   ? std::optional<Norm>(Norm::kRms)
                                      : qk_norm_name == "gemma"   ? std::optional<Norm>(Norm::kGemma)
                                      : qk_norm_name == "float32" ? std::optional<Norm>(Norm::kFloat32)
                                      : qk_norm_name == "cohere"  ? std::optional<Norm>(Norm::kCohere)
                                                                  : std::optional<Norm>(Norm::kLayer);
  TORCH_CHECK(!qk_norm_bias_list.has_value() || qk_kind == Norm::kLayer,
              "decoder_layers: qk_norm_bias goes with qk_norm_kind 'layer' (torch's LayerNorm)");
  const std::vector<std::optional<at::Tensor>> qk_norm_bias =
      qk_norm_bias_list.has_value() ? qk_norm_bias_list->vec() : std::vector<std::optional<at::Tensor>>(2 * L);
  TORCH_CHECK(qk_norm_bias.size() == 2 * L, "decoder_layers: for ", L, " layers expected 2 q/k norm biases (or none), "
              "got ", qk_norm_bias.size());
  TORCH_CHECK(!query_scale.has_value() || (query_scale->dim() == 2 && query_scale->size(0) == h.size(0) &&
                                           query_scale->size(1) == h.size(1) &&
                                           query_scale->scalar_type() == h.scalar_type()),
              "decoder_layers: query_scale must be [B, T] in h's dtype, got ",
              query_scale.has_value() ? query_scale->sizes() : at::IntArrayRef{});
  const size_t per_layer = sandwich ? 4 : 2;  // norms a layer: its two, or sandwich's four
  const std::vector<std::optional<at::Tensor>> norm_bias =
      layer_norm ? norm_bias_list->vec() : std::vector<std::optional<at::Tensor>>(2 * L);
  TORCH_CHECK(norm_bias.size() == 2 * L, "decoder_layers: for ", L, " layers expected 2 norm biases (or none), got ",
              norm_bias.size());
  TORCH_CHECK(softcap >= 0 && std::isfinite(softcap), "decoder_layers: softcap must be finite and >= 0 (0: none), "
              "got ", softcap);
  // each layer's RoPE tables: (cos, sin), or with rope_of the pair rope_of[l] of [(cos, sin), ropes' pairs...]
  const size_t n_ropes = 1 + (ropes.has_value() ? ropes->size() / 2 : 0);
  TORCH_CHECK(ropes.has_value() == rope_of.has_value() && (!ropes.has_value() || ropes->size() % 2 == 0),
              "decoder_layers: ropes (pairs of cos and sin) and rope_of (one index a layer) go together");
  TORCH_CHECK(!rope_of.has_value() || rope_of->size() == L, "decoder_layers: expected one rope_of a layer (", L,
              "), got ", rope_of.has_value() ? rope_of->size() : 0);
  if (rope_of.has_value())
    for (const int64_t r : *rope_of)
      TORCH_CHECK(r >= 0 && r < static_cast<int64_t>(n_ropes), "decoder_layers: rope_of ", r, " is not one of the ",
                  n_ropes, " RoPE tables");
  TORCH_CHECK(!windows.has_value() || windows->size() == L, "decoder_layers: expected one window per layer (", L,
              "), got ", windows.has_value() ? windows->size() : 0);
  const std::vector<std::optional<at::Tensor>> scales = scales_list.vec(), bias = bias_list.vec(),
                                               qk_norm = qk_norm_list.vec();
  check_projections("decoder_layers", w.size(), scales.size(), bias.size(), 7 * L);
  TORCH_CHECK(norm_w.size() == per_layer * L && eps.size() == per_layer * L && qk_norm.size() == 2 * L &&
                  qk_eps.size() == L &&
                  v_cache.size() == L && (k_raw_cache.empty() || k_raw_cache.size() == L) &&
                  (last_query.empty() || last_query.size() == L),
              "decoder_layers: for ", L, " layers expected ", per_layer, " norms, ", per_layer, " eps, 2 q/k norms, "
              "1 q/k eps, one buffer of each "
              "cache kind per layer; got ", norm_w.size(), ", ", eps.size(), ", ", qk_norm.size(), ", ", qk_eps.size(),
              ", ", v_cache.size(), " v, ", k_raw_cache.size(), " k_raw, ", last_query.size(), " last_query");
  TORCH_CHECK(h.dim() == 3 && slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.size(0) == h.size(0) &&
                  slots.size(1) == h.size(1) && slots.is_contiguous(),
              "decoder_layers: slots must be contiguous int64 [B, T] for h [B, T, H], got ", slots.sizes());
  TORCH_CHECK(query_index.has_value() == query_valid.has_value() && (!query_index.has_value() || !last_query.empty()),
              "decoder_layers: query_index and query_valid go together, with last_query");
  if (query_index.has_value()) {
    TORCH_CHECK(query_index->scalar_type() == at::kLong && query_index->dim() == 1 &&
                    query_index->size(0) == h.size(0) && query_index->is_contiguous() &&
                    query_valid->scalar_type() == at::kBool && query_valid->dim() == 1 &&
                    query_valid->size(0) == h.size(0) && query_valid->is_contiguous(),
                "decoder_layers: query_index must be contiguous int64 [B] and query_valid bool [B]");
    const int64_t T = h.size(1);  // every row's index is checked, as Python's q[rows, query_index] does
    for (int64_t b = 0; b < h.size(0); ++b) {
      const int64_t t = query_index->const_data_ptr<int64_t>()[b];
      TORCH_CHECK(t >= -T && t < T, "decoder_layers: query_index ", t, " of row ", b, " is outside the step's ", T,
                  " tokens");
    }
  }
  const int64_t B = h.size(0), T = h.size(1);
  // A ragged step's real tokens: rows are each row's first ones, b * T + t for t < its width, increasing; the
  // attention computes those queries only (query_lens, the widths).
  std::optional<at::Tensor> query_lens;
  if (rows.has_value()) {
    TORCH_CHECK(rows->scalar_type() == at::kLong && rows->dim() == 1 && rows->is_contiguous() && rows->numel() > 0,
                "decoder_layers: rows must be a non-empty contiguous int64 [N], got ", rows->sizes(), " ",
                rows->scalar_type());
    query_lens = at::zeros({B}, slots.options().dtype(at::kInt));
    int32_t* ql = query_lens->data_ptr<int32_t>();
    const int64_t* r = rows->const_data_ptr<int64_t>();
    for (int64_t i = 0; i < rows->numel(); ++i) {
      TORCH_CHECK(r[i] >= 0 && r[i] < B * T && (i == 0 || r[i] > r[i - 1]) && r[i] % T == ql[r[i] / T],
                  "decoder_layers: rows must increase within [0, B * T = ", B * T, ") and be each row's first "
                  "tokens; row ", i, " is ", r[i]);
      ++ql[r[i] / T];
    }
  }
  // every buffer takes the same slots: checked once, before any write
  const int64_t* s = slots.const_data_ptr<int64_t>();
  const auto [lo, hi] = std::minmax_element(s, s + slots.numel());
  for (const at::TensorList& buffers : {k_cache, v_cache, k_raw_cache}) {
    for (const at::Tensor& buf : buffers) {
      TORCH_CHECK(buf.dim() == 4, "decoder_layers: the cache buffers must be [B, N, Hkv, D], got ", buf.sizes());
      TORCH_CHECK(slots.numel() == 0 || (*lo >= 0 && *hi < buf.size(1)), "decoder_layers: slots in [", *lo, ", ",
                  *hi, "] are outside a cache buffer of ", buf.size(1), " slots");
    }
  }
  // the model layer's attention scale: the caller's (GPT-Neo's 1), else computed as Python computes it
  // (1.0 / math.sqrt(D))
  const double scale = attention_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "decoder_layers: attention_scale must be finite and > 0, got ", scale);
  // (checked before any row is written; its length, one per query head, by verify_attention)
  TORCH_CHECK(!alibi_slopes.has_value() || (alibi_slopes->scalar_type() == at::kFloat &&
                                            alibi_slopes->device().is_cpu() && alibi_slopes->dim() == 1),
              "decoder_layers: alibi_slopes must be float32 [Hq] on the CPU");
  TORCH_CHECK(clip_qkv >= 0 && std::isfinite(clip_qkv), "decoder_layers: clip_qkv must be finite and >= 0 (0: none), "
              "got ", clip_qkv);
  // what the forward streams: its weights, and each row's visible keys and values in every layer
  auto forward_bytes = [&] {
    int64_t bytes = 0;
    for (const at::Tensor& t : w) bytes += static_cast<int64_t>(t.nbytes());
    if (L > 0 && cache_seqlens.scalar_type() == at::kInt) {
      const at::Tensor lens = cache_seqlens.contiguous();
      const int64_t row = k_cache[0].size(2) * k_cache[0].size(3) * k_cache[0].element_size();
      for (int64_t b = 0; b < lens.numel(); ++b) {
        const int64_t n = std::clamp<int64_t>(lens.const_data_ptr<int32_t>()[b], 0, k_cache[0].size(1));
        bytes += 2 * n * row * static_cast<int64_t>(L);
      }
    }
    return bytes;
  };
  // A ragged step (rows): the stream, cos and sin packed to the real rows [1, N, ...]; the attention's inputs
  // unpacked into [B, T, ...] buffers whose padding stays zero (each layer overwrites the real rows only), its
  // output packed again.
  auto pack = [&](const at::Tensor& t) {
    return rows.has_value() ? t.flatten(0, 1).index_select(0, *rows).unsqueeze(0) : t;
  };
  std::vector<at::Tensor> spread(4);  // q, k, k_raw, v in [B, T, heads, D]
  auto unpack = [&](at::Tensor& t, size_t i) {
    if (!rows.has_value()) return;
    at::Tensor& buf = spread[i];
    if (!buf.defined() || buf.scalar_type() != t.scalar_type() || buf.size(2) != t.size(2))
      buf = at::zeros({B, T, t.size(2), t.size(3)}, t.options());
    buf.view({B * T, t.size(2), t.size(3)}).index_copy_(0, *rows, t[0]);
    t = buf;
  };
  return with_team(forward_bytes, [&] {
    at::Tensor x = pack(h);
    std::vector<at::Tensor> tables{pack(cos), pack(sin)};  // (cos, sin) of each RoPE, packed
    const at::Tensor scale_rows = query_scale.has_value() ? pack(*query_scale) : at::Tensor();  // [B, T] or [1, N]
    if (ropes.has_value())
      for (const at::Tensor& t : *ropes) tables.push_back(pack(t));
    for (size_t l = 0; l < L; ++l) {
      const size_t r = rope_of.has_value() ? static_cast<size_t>((*rope_of)[l]) : 0;
      const size_t n = per_layer * l;  // the layer's first norm
      at::Tensor attn_input;  // (an output gate's input)
      auto [q, k, k_raw, v] = attn_in(x, norm_w[n], eps[n], {&w[7 * l], &scales[7 * l], &bias[7 * l]},
                                      qk_norm[2 * l], qk_norm[2 * l + 1], qk_eps[l], tables[2 * r], tables[2 * r + 1],
                                      head_dim, norm_bias[2 * l], kind, norm_after || post_norms, clip_qkv,
                                      {qk_kind, qk_norm_full, qk_norm_after_rope, qk_norm_bias[2 * l],
                                       qk_norm_bias[2 * l + 1]},
                                      rope_float32, gate_w.empty() ? nullptr : &attn_input);
      // Ministral 3's query temperature: the RoPE'd queries times each token's scale, as Attention.temper
      if (query_scale.has_value()) q = q * scale_rows.unsqueeze(-1).unsqueeze(-1);
      // a cache in another dtype (Llama.kv_dtype): its rows and the attention in its dtype, as
      // Attention.attend rounds them in Python (Tensor.to: round to nearest even)
      const at::ScalarType kv = k_cache[l].scalar_type();
      if (q.scalar_type() != kv) {
        q = q.to(kv), k = k.to(kv), v = v.to(kv);
        if (!k_raw_cache.empty()) k_raw = k_raw.to(kv);
      }
      unpack(q, 0), unpack(k, 1), unpack(v, 3);
      if (!k_raw_cache.empty()) unpack(k_raw, 2);
      if (!last_query.empty()) record_query(last_query[l], q, query_index, query_valid);
      if (!k_raw_cache.empty()) write_rows(k_raw_cache[l], k_raw, slots);
      write_rows(k_cache[l], k, slots);
      write_rows(v_cache[l], v, slots);
      const int64_t window = windows.has_value() ? (*windows)[l] : 0;
      auto [o, lse] = verify_attention_ragged(q, k_cache[l], v_cache[l], cache_seqlens, tree_mask, scale, 0,
                                              query_lens, window, softcap, window ? window_leftpad : std::nullopt,
                                              alibi_slopes);
      if (sinks.has_value()) {  // GPT-OSS's sinks, as the caches' attention applies them: o * sigmoid(lse - sink)
        const at::Tensor z = lse - (*sinks)[l].to(at::kFloat).unsqueeze(-1);  // [B, Hq, T]
        const at::Tensor factor = lanewise([](const at::Tensor& t) { return at::sigmoid(t); }, z).transpose(1, 2);
        o = (o.to(at::kFloat) * factor.unsqueeze(-1)).to(o.scalar_type());
      }
      at::Tensor attn = pack(o.to(x.scalar_type()));
      if (!gate_w.empty()) {  // Attention.output's gate, op by op: AFMoE's out * sigmoid(g), Laguna's out * softplus(g)
        const at::Tensor g = Projections{&gate_w[l], &gate_s[l], &gate_b[l]}(0, attn_input);  // [N, Hq * D or Hq]
        const int64_t N = attn_input.size(0);
        const at::Tensor heads = attn.reshape({N, -1});
        at::Tensor gated;
        if (attn_gate_kind == "sigmoid") {
          gated = heads * lanewise([](const at::Tensor& t) { return at::sigmoid(t); }, g);
        } else {
          const at::Tensor gate =
              lanewise([](const at::Tensor& t) { return at::softplus(t); }, g.to(at::kFloat)).to(heads.scalar_type());
          gated = attn_gate_kind == "softplus_dim"
                      ? heads * gate
                      : (heads.view({N, g.size(1), -1}) * gate.unsqueeze(-1)).reshape({N, -1});
        }
        attn = gated.view(attn.sizes());
      }
      const Projections out{&w[7 * l + 3], &scales[7 * l + 3], &bias[7 * l + 3]};
      if (mixture_last && l + 1 == L) {  // (its mixture of experts runs in Python: h2 and the mixture's input)
        const int64_t N = x.size(0) * x.size(1);
        at::Tensor o_h = out(0, attn.reshape({N, -1})).view({x.size(0), x.size(1), -1});
        if (sandwich || post_norms)  // (the norm after the attention: sandwich's second, post_norms' first)
          o_h = norm(o_h, norm_w[n + int(sandwich)], {}, eps[n + int(sandwich)], kind);
        const at::Tensor h2 = residual_add(scaled(o_h, residual_multiplier), x);
        // the mixture's input: the norm of h2 (in sequence; sandwich's third norm), of the layer's input (parallel),
        // or h2 itself (post_norms); the caller adds the mixture (and post_feedforward_layernorm's norm of it) to h2
        const at::Tensor& normed = parallel ? x : h2;
        const at::Tensor m = post_norms ? h2
                             : sandwich ? norm(h2, norm_w[n + 2], {}, eps[n + 2], kind)
                                        : norm(normed, norm_w[n + 1], norm_bias[2 * l + 1], eps[n + 1], kind);
        return at::stack({h2, m});
      }
      const MlpSpec spec(mlp, xielu.has_value() ? &(*xielu)[4 * l] : nullptr);
      // (post_norms' two norms: post_attention, post_feedforward; the attention ran on x itself)
      x = sandwich     ? attn_out_mlp_normed(x, attn, &norm_w[n + 1], &eps[n + 1], out, kind, spec, true,
                                             residual_multiplier)
          : post_norms ? attn_out_mlp_normed(x, attn, &norm_w[n], &eps[n], out, kind, spec, false, 1.0)
          : norm_after ? attn_out_mlp_after(x, attn, norm_w[n], eps[n], norm_bias[2 * l], norm_w[n + 1], eps[n + 1],
                                            norm_bias[2 * l + 1], out, kind, spec)
                       : attn_out_mlp(x, attn, norm_w[n + 1], eps[n + 1], out, norm_bias[2 * l + 1], kind, spec,
                                      parallel, residual_multiplier);
    }
    return x;
  });
}
