// rowwise_linear: out = x @ w^T for a few rows of x, float32, bfloat16 or float16 (x and w alike). The kernel and
// why it exists: csrc/include/triforce/linear.h. Row m of the result is bitwise the 1-row product of
// x[m] whatever M and the thread count.
#include "triforce/linear.h"  // first: its <immintrin.h> before ATen's (triforce/common.h says why)
#include "triforce/linear_i8.h"
#include "triforce/team.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>

#include "../ops.h"
#include "dispatch.h"

namespace {

// blocks(m0, rows, b0, b1): weight blocks [b0, b1) against rows [m0, m0 + rows) of x, for every chunk
// of at most kRowChunk rows (linear.h), each chunk split over the threads by weight blocks. At least
// 16 blocks per thread, and enough that a thread's share is worth a region
// (triforce::parallel_min_bytes: a block streams NR rows of w_bytes-byte weights and does `rows`
// multiply-adds per weight); fewer blocks run inline. Inside a forward's team (triforce/team.h) the
// blocks go to the team instead, in pieces of at least 8 blocks, from Team::kMinBytes of work on.
// nb blocks of nr weight rows each (w_bytes bytes a weight).
template <typename F>
void over_row_chunks_of(int64_t M, int64_t K, int64_t nb, int64_t nr, int64_t w_bytes, F&& blocks) {
  using namespace triforce::linear;
  for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, M - m0);
    const int64_t block_work = nr * K * std::max(w_bytes, rows);
    auto range = [&](int64_t b0, int64_t b1) { blocks(m0, rows, b0, b1); };
    if (triforce::Team::current() != nullptr) {
      triforce::parallel_ranges(triforce::worth_parallel_here(nb * block_work), nb, 8, range);
      continue;
    }
    const int64_t grain = std::max<int64_t>(16, (triforce::parallel_min_bytes() + block_work - 1) / block_work);
    at::parallel_for(0, nb, grain, range);
  }
}

// x and w of one float type (float32, bfloat16, float16), on the CPU: rowwise_linear's and rowwise_linear_heads'
void check_float_operands(const char* op, const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == w.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
                   x.scalar_type() == at::kHalf),
              op, ": float32, bfloat16 or float16 only (x and w alike), got ", x.scalar_type(), " and ",
              w.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), op, ": CPU tensors only");
}

// The product of float32 x [M, K] against N weight rows of codes q (Code elements) with float32 scales, both
// checked by the caller: kernel(x, rows, K, q, scales, N, out, b0, b1) runs weight blocks [b0, b1)
// (rowwise_linear_q8_blocks, rowwise_linear_fp8_blocks).
template <typename Code, typename Kernel>
RowwiseProduct scaled_product(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales, Kernel kernel) {
  using namespace triforce::linear;
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  RowwiseProduct p{M, K, N, rowwise_linear_num_blocks(N), NR, 1, x.options(),
                   {x.contiguous(), q.contiguous(), scales.contiguous()}, {}};
  const float* X = p.keep[0].const_data_ptr<float>();
  const Code* Q = reinterpret_cast<const Code*>(p.keep[1].const_data_ptr());
  const float* S = p.keep[2].const_data_ptr<float>();
  p.blocks = [X, Q, S, K, N, kernel](void* out, int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
    kernel(X + m0 * K, rows, K, Q, S, N, static_cast<float*>(out) + m0 * N, b0, b1);
  };
  return p;
}

}  // namespace

at::Tensor run_product(const RowwiseProduct& p) {
  at::Tensor out = at::empty({p.M, p.N}, p.out_options);
  if (p.M == 0 || p.N == 0) return out;
  if (p.K == 0) return out.zero_();
  void* O = out.data_ptr();
  over_row_chunks_of(p.M, p.K, p.nb, p.nr, p.w_bytes,
                     [&](int64_t m0, int64_t rows, int64_t b0, int64_t b1) { p.blocks(O, m0, rows, b0, b1); });
  return out;
}

RowwiseProduct float_product(const at::Tensor& x, const at::Tensor& w) {
  using namespace triforce::linear;
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "rowwise_linear: x [M, K] and w [N, K] must be 2-D, got ",
              x.sizes(), " and ", w.sizes());
  check_float_operands("rowwise_linear", x, w);
  TORCH_CHECK(x.size(1) == w.size(1), "rowwise_linear: x has ", x.size(1), " columns, w ", w.size(1));
  RowwiseProduct p{x.size(0), x.size(1), w.size(0), rowwise_linear_num_blocks(w.size(0)), NR, x.element_size(),
                   x.options(), {x.contiguous(), w.contiguous()}, {}};
  TRIFORCE_DISPATCH_FLOAT(x.scalar_type(), "rowwise_linear", [&] {
    const scalar_t* X = tf_ptr<scalar_t>(p.keep[0]);
    const scalar_t* W = tf_ptr<scalar_t>(p.keep[1]);
    const int64_t K = p.K, N = p.N;
    p.blocks = [X, W, K, N](void* out, int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
      rowwise_linear_blocks<scalar_t, scalar_t>(X + m0 * K, rows, K, W, N, static_cast<scalar_t*>(out) + m0 * N, b0,
                                                b1);
    };
  });
  return p;
}

at::Tensor rowwise_linear(const at::Tensor& x, const at::Tensor& w) { return run_product(float_product(x, w)); }

// out[h] = x[h] @ w[h]^T for every head h (DeepSeek's latent attention: each head's own W_UK^T and W_UV): one product
// over the heads' weight blocks together (a block never straddles two heads), so the threads share all of them; each
// head's rows are rowwise_linear_blocks' on its own matrix, bitwise rowwise_linear(x[h], w[h]).
at::Tensor rowwise_linear_heads(const at::Tensor& x, const at::Tensor& w) {
  using namespace triforce::linear;
  TORCH_CHECK(x.dim() == 3 && w.dim() == 3, "rowwise_linear_heads: x [H, M, K] and w [H, N, K] must be 3-D, got ",
              x.sizes(), " and ", w.sizes());
  check_float_operands("rowwise_linear_heads", x, w);
  TORCH_CHECK(x.size(0) == w.size(0) && x.size(2) == w.size(2), "rowwise_linear_heads: x ", x.sizes(), " and w ",
              w.sizes(), " must have the same heads and columns");
  const int64_t H = x.size(0), M = x.size(1), K = x.size(2), N = w.size(1);
  const int64_t per_head = rowwise_linear_num_blocks(N);
  // (out [M, H * N] as run_product allocates it holds [H, M, N]: viewed so below)
  RowwiseProduct p{M, K, H * N, H * per_head, NR, x.element_size(), x.options(), {x.contiguous(), w.contiguous()},
                   {}};
  TRIFORCE_DISPATCH_FLOAT(x.scalar_type(), "rowwise_linear_heads", [&] {
    const scalar_t* X = tf_ptr<scalar_t>(p.keep[0]);
    const scalar_t* W = tf_ptr<scalar_t>(p.keep[1]);
    p.blocks = [X, W, H, M, K, N, per_head](void* out, int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
      for (int64_t h = b0 / per_head; h < H && h * per_head < b1; ++h) {
        const int64_t first = h * per_head;
        const int64_t lo = std::max(b0, first) - first, hi = std::min(b1, first + per_head) - first;
        rowwise_linear_blocks<scalar_t, scalar_t>(X + (h * M + m0) * K, rows, K, W + h * N * K, N,
                                                  static_cast<scalar_t*>(out) + (h * M + m0) * N, lo, hi);
      }
    };
  });
  return run_product(p).view({H, M, N});
}

RowwiseProduct q8_product(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales) {
  using namespace triforce::linear;
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && scales.dim() == 2,
              "rowwise_linear_q8: x [M, K], q [N, K] and scales [N, ceil(K / 32)] must be 2-D, got ", x.sizes(), ", ",
              q.sizes(), " and ", scales.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat,
              "rowwise_linear_q8: x float32, q int8 and scales float32, got ", x.scalar_type(), ", ",
              q.scalar_type(), " and ", scales.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu() && scales.device().is_cpu(),
              "rowwise_linear_q8: CPU tensors only");
  const int64_t K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.size(1) == K, "rowwise_linear_q8: x has ", K, " columns, q ", q.size(1));
  // one scale per 32 weights of a row, or per 16 (NVFP4's groups); where the two counts agree (K <= 16) the same
  const bool per16 = scales.size(1) == q8_groups(K, 16) && scales.size(1) != q8_groups(K);
  TORCH_CHECK(scales.size(0) == N && (scales.size(1) == q8_groups(K) || per16), "rowwise_linear_q8: scales must be [",
              N, ", ", q8_groups(K), "] (one per 32 weights of a row) or [", N, ", ", q8_groups(K, 16),
              "] (one per 16), got ", scales.sizes());
  if (per16) return scaled_product<int8_t>(x, q, scales, rowwise_linear_q8_blocks<16>);
  return scaled_product<int8_t>(x, q, scales, rowwise_linear_q8_blocks<kQ8Group>);
}

at::Tensor rowwise_linear_q8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales) {
  return run_product(q8_product(x, q, scales));
}

RowwiseProduct fp8_product(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales) {
  using namespace triforce::linear;
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && scales.dim() == 2,
              "rowwise_linear_fp8: x [M, K], q [N, K padded to 64] and scales [N, ceil(K / 64)] must be 2-D, got ",
              x.sizes(), ", ", q.sizes(), " and ", scales.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kFloat8_e4m3fn && scales.scalar_type() == at::kFloat,
              "rowwise_linear_fp8: x float32, q float8_e4m3fn (packed codes: quant.pack_fp8) and scales float32, got ",
              x.scalar_type(), ", ", q.scalar_type(), " and ", scales.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu() && scales.device().is_cpu(),
              "rowwise_linear_fp8: CPU tensors only");
  const int64_t K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.size(1) == fp8_row_bytes(K), "rowwise_linear_fp8: x has ", K, " columns, so q's rows must be ",
              fp8_row_bytes(K), " codes (K padded to a multiple of 64: quant.pack_fp8), got ", q.size(1));
  TORCH_CHECK(scales.size(0) == N && scales.size(1) == fp8_chunks(K), "rowwise_linear_fp8: scales must be [", N, ", ",
              fp8_chunks(K), "] (one per 64 weights of a row), got ", scales.sizes());
  return scaled_product<uint8_t>(x, q, scales, rowwise_linear_fp8_blocks);
}

at::Tensor rowwise_linear_fp8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales) {
  return run_product(fp8_product(x, q, scales));
}

RowwiseProduct q4_1_product(const at::Tensor& x, const at::Tensor& w) {
  using namespace triforce::linear;
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "rowwise_linear_q4_1: x [M, K] and w [N, K / 32 * 24] must be 2-D, got ",
              x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kByte,
              "rowwise_linear_q4_1: x float32 and w uint8 (Q4_1 blocks), got ", x.scalar_type(), " and ",
              w.scalar_type());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rowwise_linear_q4_1: CPU tensors only");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % kQ4Block == 0, "rowwise_linear_q4_1: x has ", K, " columns, not a multiple of the block's 32");
  TORCH_CHECK(w.size(1) == q4_1_row_bytes(K), "rowwise_linear_q4_1: x has ", K, " columns, so w needs ",
              q4_1_row_bytes(K), " bytes a row (24 per 32 weights), got ", w.size(1));
  RowwiseProduct p{M, K, N, rowwise_linear_num_blocks(N), NR, 1, x.options(), {x.contiguous(), w.contiguous()}, {}};
  const float* X = p.keep[0].const_data_ptr<float>();
  const uint8_t* W = p.keep[1].const_data_ptr<uint8_t>();
  p.blocks = [X, W, K, N](void* out, int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
    rowwise_linear_q4_1_blocks(X + m0 * K, rows, K, W, N, static_cast<float*>(out) + m0 * N, b0, b1);
  };
  return p;
}

at::Tensor rowwise_linear_q4_1(const at::Tensor& x, const at::Tensor& w) { return run_product(q4_1_product(x, w)); }

I8Rows quantize_i8_rows(const at::Tensor& x) {
  namespace li = triforce::linear_i8;
  TORCH_CHECK(x.dim() == 2, "rowwise_linear_i8: x must be [M, K], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "rowwise_linear_i8: x float32, got ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), "rowwise_linear_i8: CPU tensors only");
  const int64_t M = x.size(0), K = x.size(1), G = K / li::kBlock;
  TORCH_CHECK(K % li::kBlock == 0, "rowwise_linear_i8: x has ", K, " columns, not a multiple of the block's 32");
  const at::Tensor xc = x.contiguous();
  // one buffer: q [M, K] int8, then dx, sm [M, G] float32 and sx, sx0 [M, G] int32 (4-byte aligned: K % 32 == 0)
  I8Rows r{at::empty({M * K + 16 * M * G}, xc.options().dtype(at::kByte)), M, K};
  li::quantize_rows(xc.const_data_ptr<float>(), M, K, r.q(), r.dx(), r.sm(), r.sx(), r.sx0());
  return r;
}

RowwiseProduct i8_product(const I8Rows& x, int64_t r0, int64_t M, const at::Tensor& codes, const at::Tensor& scales) {
  namespace li = triforce::linear_i8;
  using li::Format;
  TORCH_CHECK(codes.dim() == 2 && scales.dim() == 2,
              "rowwise_linear_i8: x [M, K], codes [N / 16, K / 32 * 128, 192, 256, 320, 384 or 512 (or a grid form's "
              "K / 32 * 256 + 16)] and scales [N / 16, K / 32 * 64, 32 or 16] (or uint8 super-block scales, or MXFP4's "
              "uint8 exponents) must be 2-D, "
              "got [", x.M, ", ", x.K, "], ", codes.sizes(), " and ", scales.sizes());
  const int64_t K = x.K, NG = codes.size(0), G = K / li::kBlock;
  // MXFP4: uint8 E8M0 exponents, one a block and row (no super-block form has 16 bytes a block)
  const bool mxfp4 = scales.scalar_type() == at::kByte && codes.size(1) == G * li::code_bytes<Format::MXFP4>() &&
                     scales.size(1) == G * li::scale_count<Format::MXFP4>();
  const bool super = scales.scalar_type() == at::kByte && !mxfp4;  // float16 bases, int8 multipliers per 256 inputs
  TORCH_CHECK(codes.scalar_type() == at::kByte &&
                  (scales.scalar_type() == at::kHalf || scales.scalar_type() == at::kFloat ||
                   scales.scalar_type() == at::kByte),
              "rowwise_linear_i8: x float32, codes uint8 and scales float16, float32 or uint8 (super-block scales, "
              "MXFP4's exponents), "
              "got float32, ", codes.scalar_type(), " and ", scales.scalar_type());
  TORCH_CHECK(codes.device().is_cpu() && scales.device().is_cpu(), "rowwise_linear_i8: CPU tensors only");
  TORCH_CHECK(r0 >= 0 && M >= 0 && r0 + M <= x.M, "rowwise_linear_i8: rows [", r0, ", ", r0 + M, ") of ", x.M);
  TORCH_CHECK(scales.size(0) == NG, "rowwise_linear_i8: codes has ", NG, " groups of 16 rows, scales ", scales.size(0));
  TORCH_CHECK(!super || K % (li::kBlock * li::kSuperBlocks) == 0, "rowwise_linear_i8: super-block scales (uint8) "
              "need a multiple of 256 columns, x has ", K);
  auto scale_elems = [&](auto f) {  // a group's scales (super-block scales: bytes) for form f
    constexpr Format F = decltype(f)::value;
    return super ? li::GroupScales<F, li::SuperScale>::elems(G) : G * li::scale_count<F>();
  };
  auto is = [&](auto f) {
    constexpr Format F = decltype(f)::value;
    return codes.size(1) == li::group_code_bytes<F>(G) && scales.size(1) == scale_elems(f);
  };
  using Q4_1 = std::integral_constant<Format, Format::Q4_1>;
  using Q5_1 = std::integral_constant<Format, Format::Q5_1>;
  using Q8_0 = std::integral_constant<Format, Format::Q8_0>;
  using Q8_0_16 = std::integral_constant<Format, Format::Q8_0_16>;
  using IQ4_NL = std::integral_constant<Format, Format::IQ4_NL>;
  using Q6_16 = std::integral_constant<Format, Format::Q6_16>;
  using Q4_1_16 = std::integral_constant<Format, Format::Q4_1_16>;
  using Q2_16 = std::integral_constant<Format, Format::Q2_16>;
  using Q3_16 = std::integral_constant<Format, Format::Q3_16>;
  using GRID = std::integral_constant<Format, Format::GRID>;
  using GRID_16 = std::integral_constant<Format, Format::GRID_16>;
  const bool q4 = is(Q4_1{}), q5 = is(Q5_1{}), q8 = is(Q8_0{}), q8_16 = is(Q8_0_16{}), iq4 = is(IQ4_NL{}) && !mxfp4,
             q6 = is(Q6_16{}), q4_16 = is(Q4_1_16{}), q2_16 = is(Q2_16{}), q3_16 = is(Q3_16{}),
             grid = !super && is(GRID{}), grid_16 = !super && is(GRID_16{});
  auto sizes = [&](auto f, const char* name) {  // "codes and scales (name)" of form f at this K
    constexpr Format F = decltype(f)::value;
    return std::to_string(G * li::code_bytes<F>()) + " and " + std::to_string(scale_elems(f)) + " (" + name + ")";
  };
  TORCH_CHECK(mxfp4 || q4 || q5 || q8 || q8_16 || iq4 || q6 || q4_16 || q2_16 || q3_16 || grid || grid_16,
              "rowwise_linear_i8: for ", K,
              " columns a group's codes and ", super ? "scale bytes" : "scales", " are ", sizes(Q4_1{}, "Q4_1"), ", ",
              sizes(Q5_1{}, "Q5_1"), ", ", sizes(Q8_0{}, "Q8_0"), ", ", sizes(Q8_0_16{}, "Q8_0_16"), ", ",
              sizes(IQ4_NL{}, "IQ4_NL"), ", ", sizes(Q6_16{}, "Q6_16"), ", ", sizes(Q4_1_16{}, "Q4_1_16"), ", ",
              sizes(Q2_16{}, "Q2_16"), " or ", sizes(Q3_16{}, "Q3_16"), " (or MXFP4's ",
              G * li::code_bytes<Format::MXFP4>(), " and ", G * li::scale_count<Format::MXFP4>(),
              " uint8 exponents; a grid form's ", li::group_code_bytes<Format::GRID>(G), " and ",
              G * li::scale_count<Format::GRID>(), " or ", G * li::scale_count<Format::GRID_16>(),
              " float16 or float32 scales), got ", codes.size(1), " and ", scales.size(1));
  const int64_t N = NG * li::kGroup;
  RowwiseProduct p{M, K, N, NG, li::kGroup, 1, codes.options().dtype(at::kFloat),
                   {x.buf, codes.contiguous(), scales.contiguous()}, {}};
  const at::Tensor &cc = p.keep[1], &sc = p.keep[2];
  // rows r0 + m of x: its codes and its blocks' scales and sums
  const int8_t* Q = x.q() + r0 * K;
  const float *D = x.dx() + r0 * G, *S = x.sm() + r0 * G;
  const int32_t *SX = x.sx() + r0 * G, *SX0 = x.sx0() + r0 * G;
  const uint8_t* C = cc.const_data_ptr<uint8_t>();
  auto run = [&](auto f, const auto* H) {
    constexpr Format F = decltype(f)::value;
    p.blocks = [=](void* out, int64_t m0, int64_t rows, int64_t g0, int64_t g1) {
      li::groups<F>(Q + m0 * K, D + m0 * G, S + m0 * G, SX + m0 * G, SX0 + m0 * G, rows, K, C, H, N,
                    static_cast<float*>(out) + m0 * N, g0, g1);
    };
  };
  auto with_scales = [&](auto f) {
    if (sc.scalar_type() == at::kHalf)
      run(f, reinterpret_cast<const uint16_t*>(sc.const_data_ptr<at::Half>()));
    else if (super)
      run(f, reinterpret_cast<const li::SuperScale*>(sc.const_data_ptr<uint8_t>()));
    else
      run(f, sc.const_data_ptr<float>());
  };
  auto with_float_scales = [&](auto f) {  // the grid forms: float16 or float32 scales only
    if (sc.scalar_type() == at::kHalf)
      run(f, reinterpret_cast<const uint16_t*>(sc.const_data_ptr<at::Half>()));
    else
      run(f, sc.const_data_ptr<float>());
  };
  if (mxfp4)
    run(std::integral_constant<Format, Format::MXFP4>{},
        reinterpret_cast<const li::E8M0Scale*>(sc.const_data_ptr<uint8_t>()));
  else if (grid)
    with_float_scales(GRID{});
  else if (grid_16)
    with_float_scales(GRID_16{});
  else if (q4)
    with_scales(Q4_1{});
  else if (q5)
    with_scales(Q5_1{});
  else if (q8)
    with_scales(Q8_0{});
  else if (q8_16)
    with_scales(Q8_0_16{});
  else if (iq4)
    with_scales(IQ4_NL{});
  else if (q6)
    with_scales(Q6_16{});
  else if (q4_16)
    with_scales(Q4_1_16{});
  else if (q2_16)
    with_scales(Q2_16{});
  else
    with_scales(Q3_16{});
  return p;
}

at::Tensor rowwise_linear_i8_rows(const I8Rows& x, const at::Tensor& codes, const at::Tensor& scales) {
  return run_product(i8_product(x, 0, x.M, codes, scales));
}

RowwiseProduct product_of(const at::Tensor& x, const I8Rows* xq, int64_t r0, const at::Tensor& w,
                          const std::optional<at::Tensor>& scales) {
  if (w.scalar_type() == at::kFloat8_e4m3fn && scales.has_value()) return fp8_product(x, w, *scales);
  if (w.scalar_type() == at::kByte && scales.has_value()) {
    if (xq != nullptr) return i8_product(*xq, r0, x.size(0), w, *scales);
    const I8Rows own = quantize_i8_rows(x);  // (its buffer stays in the product's keep)
    return i8_product(own, 0, own.M, w, *scales);
  }
  if (w.scalar_type() == at::kByte) return q4_1_product(x, w);
  return scales.has_value() ? q8_product(x, w, *scales) : float_product(x, w);
}

bool rowwise_linear_i8_tiles(std::optional<bool> enable) {
  namespace li = triforce::linear_i8;
  if (enable.has_value()) li::amx_int8_allowed().store(*enable);
#if defined(TRIFORCE_I8_AMX)
  return li::amx_int8_allowed().load() && li::amx_int8_enabled();
#else
  return false;
#endif
}

// x is checked (and rounded) by quantize_i8_rows, codes and scales by rowwise_linear_i8_rows.
at::Tensor rowwise_linear_i8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales) {
  return rowwise_linear_i8_rows(quantize_i8_rows(x), codes, scales);
}

// ---- BitNet b1.58's ternary projection (triforce/models/bitnet.py): out[m, j * R + i] = sum_k w * q[m, k], w =
// ((packed[i, k] >> 2j) & 3) - 1 (transformers' packing: four output rows a byte, the stored value w + 1), summed
// as integers: sum_k code * q - sum_k q, each exact in int32 (|q| <= 128, codes <= 2). On AVX-512 VNNI one vpdpbusd
// multiplies 64 unsigned codes by 64 signed q and sums them in fours, so a byte row of weights, loaded once, serves
// four output rows and up to four input rows; elsewhere the same sums in a loop. Exact either way: the bits do not
// depend on the path, the row count or the threads.
namespace {

constexpr int64_t kTernaryBlock = 4;  // byte rows (16 output rows) a weight block

void ternary_blocks(const int8_t* Q, const int32_t* qsum, int64_t rows, int64_t K, const uint8_t* P, int64_t R,
                    int32_t* out, int64_t N, int64_t b0, int64_t b1) {
  const int64_t i0 = b0 * kTernaryBlock, i1 = std::min(R, b1 * kTernaryBlock);
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const __m512i three = _mm512_set1_epi8(3);
  for (int64_t i = i0; i < i1; ++i) {
    const uint8_t* row = P + i * K;
    for (int64_t m0 = 0; m0 < rows; m0 += 4) {
      const int64_t mr = std::min<int64_t>(4, rows - m0);
      __m512i acc[4][4];
      for (int mm = 0; mm < 4; ++mm)
        for (int j = 0; j < 4; ++j) acc[mm][j] = _mm512_setzero_si512();
      for (int64_t k = 0; k < K; k += 64) {
        const __mmask64 mask = K - k >= 64 ? ~__mmask64(0) : ((__mmask64(1) << (K - k)) - 1);
        const __m512i b = _mm512_maskz_loadu_epi8(mask, row + k);
        __m512i w[4];
        for (int j = 0; j < 4; ++j) w[j] = _mm512_and_si512(_mm512_srli_epi16(b, 2 * j), three);
        for (int mm = 0; mm < mr; ++mm) {
          const __m512i x = _mm512_maskz_loadu_epi8(mask, Q + (m0 + mm) * K + k);
          for (int j = 0; j < 4; ++j) acc[mm][j] = _mm512_dpbusd_epi32(acc[mm][j], w[j], x);
        }
      }
      for (int mm = 0; mm < mr; ++mm)
        for (int j = 0; j < 4; ++j)
          out[(m0 + mm) * N + j * R + i] = _mm512_reduce_add_epi32(acc[mm][j]) - qsum[m0 + mm];
    }
  }
#else
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t m = 0; m < rows; ++m)
      for (int j = 0; j < 4; ++j) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; ++k) s += int32_t((P[i * K + k] >> (2 * j)) & 3) * Q[m * K + k];
        out[m * N + j * R + i] = s - qsum[m];
      }
#endif
}

}  // namespace

at::Tensor ternary_linear(const at::Tensor& q, const at::Tensor& packed) {
  TORCH_CHECK(q.dim() == 2 && packed.dim() == 2, "ternary_linear: q [M, K] and packed [N / 4, K] must be 2-D, got ",
              q.sizes(), " and ", packed.sizes());
  TORCH_CHECK(q.scalar_type() == at::kChar && packed.scalar_type() == at::kByte,
              "ternary_linear: q int8 and packed uint8, got ", q.scalar_type(), " and ", packed.scalar_type());
  TORCH_CHECK(q.device().is_cpu() && packed.device().is_cpu(), "ternary_linear: CPU tensors only");
  TORCH_CHECK(q.size(1) == packed.size(1), "ternary_linear: q has ", q.size(1), " columns, packed ", packed.size(1));
  const int64_t M = q.size(0), K = q.size(1), R = packed.size(0), N = 4 * R;
  const at::Tensor qc = q.contiguous(), pc = packed.contiguous();
  const int8_t* Q = qc.const_data_ptr<int8_t>();
  std::vector<int32_t> qsum(M, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) qsum[m] += Q[m * K + k];
  RowwiseProduct p{M, K, N, (R + kTernaryBlock - 1) / kTernaryBlock, 4 * kTernaryBlock, 1,
                   qc.options().dtype(at::kInt), {qc, pc}, {}};
  const uint8_t* P = pc.const_data_ptr<uint8_t>();
  const int32_t* S = qsum.data();
  p.blocks = [Q, S, K, P, R, N](void* out, int64_t m0, int64_t rows, int64_t b0, int64_t b1) {
    ternary_blocks(Q + m0 * K, S + m0, rows, K, P, R, static_cast<int32_t*>(out) + m0 * N, N, b0, b1);
  };
  return run_product(p);
}
