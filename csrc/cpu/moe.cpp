// moe_experts: a mixture of experts' MLP on the CPU for the rows of x, given each row's chosen experts and their
// weights (the router's work stays in Python: triforce/models/llama.py, SparseMoE). Bitwise what SparseMoE's
// modules compute expert by expert: each expert's rows through rowwise_linear (gate and up as one projection),
// plus its bias if it has one, act(gate) * up (glu.h; GPT-OSS's clamped SwiGLU too), rowwise_linear (down), plus
// its bias, then each row's sum, from zero and in the element type, of round(output * weight) in increasing expert
// order.
//
// Why: run expert by expert from Python, a sparse layer was a loop of ~8 tensor ops per expert hit, and each
// expert's product was a separate kernel call that opened its own parallel region only above 4 MiB of work
// (common.h, parallel_min_bytes: a sleeping worker's wake-up costs ~70 us): a Qwen3-30B-A3B expert's down
// projection (2048 x 768 in bfloat16, 3 MiB) ran on one core, and the bfloat16 layer read its experts at about
// 0.4 of the copy bandwidth on this project's 2-core VM. Here every expert's weight blocks are one parallel loop
// (one region for the gate-up products, one for the down products), claimed in pieces by the threads.
//
// Bitwise contract: a row's product is rowwise_linear's row (linear.h: each output's arithmetic is fixed whatever
// the row count, the row's place among them and the thread that computes it), act(gate) * up is silu_mul's /
// gelu_tanh_mul's row (glu.h), and the weighted sum rounds each product and each add to the element type as
// ATen's `y * w` (float32 weights: the product in float32, then rounded), `.to(dtype)` and `index_put_(...,
// accumulate=True)` do. So a verification pass still computes the bits of one-token steps, and the op gives
// the module loop's bits (tests/test_moe.py).
#include "triforce/linear.h"  // first: its <immintrin.h> before ATen's (triforce/common.h says why)
#include "triforce/glu.h"
#include "triforce/team.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../ops.h"
#include "dispatch.h"

namespace {

// The (row, slot) pairs that chose one expert, packed: rows [row0, row0 + rows) of the packed buffers.
struct Group {
  int64_t expert, row0, rows, inter;  // inter: the expert's width I (gate-up: 2I outputs, down: I inputs)
  int64_t h_off, a_off;               // element offsets of its rows in the gate-up and activation buffers
};

// A piece of one group's product: weight blocks [b0, b1) against its packed rows [m0, m0 + rows).
struct Piece {
  int64_t g, m0, rows, b0, b1;
};

// Every group's product (products[g], into out[g]) in one parallel loop: each group's rows in chunks of kRowChunk
// (linear.h), each chunk's weight blocks in pieces of at least 16 blocks and ~256 KiB of work (a piece's blocks are
// read once, in order: the prefetches stay ahead within it), claimed one at a time by the threads. The work counted
// as the row-wise ops count it (parallel_min_bytes). A product over K = 0 is left to the caller (zeros).
void run_products(const std::vector<RowwiseProduct>& products, const std::vector<void*>& out) {
  using triforce::linear::kRowChunk;
  std::vector<Piece> pieces;
  int64_t work = 0;
  for (int64_t g = 0; g < static_cast<int64_t>(products.size()); ++g) {
    const RowwiseProduct& p = products[g];
    if (p.K == 0 || p.N == 0) continue;
    for (int64_t m0 = 0; m0 < p.M; m0 += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, p.M - m0);
      const int64_t block_work = p.nr * p.K * std::max(p.w_bytes, rows);
      const int64_t per = std::max<int64_t>(16, ((int64_t(256) << 10) + block_work - 1) / block_work);
      for (int64_t b = 0; b < p.nb; b += per) pieces.push_back({g, m0, rows, b, std::min(p.nb, b + per)});
      work += p.nb * block_work;
    }
  }
  triforce::parallel_items(triforce::worth_parallel_here(work), static_cast<int64_t>(pieces.size()),
                           [&](int, int64_t i) {
                             const Piece& c = pieces[i];
                             products[c.g].blocks(out[c.g], c.m0, c.rows, c.b0, c.b1);
                           });
}

// row[i] += bias[i] for i < n, each sum rounded to T (the module's `y.add_(bias)`); nothing without a bias
template <typename T>
void add_bias(T* row, const T* bias, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < n; ++i)
    row[i] = triforce::from_float<T>(triforce::to_float(row[i]) + triforce::to_float(bias[i]));
}

// out[t] = sum over t's pairs p, in increasing expert order, of round(y[p] * weight[p]), each add rounded to T;
// y[p] first plus its expert's down bias (bias[expert], or nullptr), in place.
template <typename T, typename W>
TRIFORCE_NO_FP_CONTRACT void weighted_sum(T* y, const W* weight, const int64_t* pair_row, const int64_t* order,
                                          const int64_t* expert, const T* const* bias, int64_t k, int64_t H, T* out,
                                          int64_t t) {
  T* o = out + t * H;
  for (int64_t h = 0; h < H; ++h) o[h] = triforce::from_float<T>(0.f);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = order[t * k + j];  // the pair t * k + slot, in the order its experts are summed
    const float w = triforce::to_float(weight[p]);
    T* yr = y + pair_row[p] * H;
    add_bias(yr, bias[expert[p]], H);
    for (int64_t h = 0; h < H; ++h) {
      const float product = triforce::to_float(triforce::from_float<T>(triforce::to_float(yr[h]) * w));
      o[h] = triforce::from_float<T>(triforce::to_float(o[h]) + product);
    }
  }
}

// An expert's projection: its weight, for int8 formats its scales, and its bias (of the outputs' dtype) if any.
struct Projection {
  at::Tensor w;
  std::optional<at::Tensor> scales, bias;
  bool i8() const { return w.scalar_type() == at::kByte && scales.has_value(); }
};

template <triforce::Act A, typename T>
at::Tensor run(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weight,
               const std::vector<Projection>& gate_up, const std::vector<Projection>& down, triforce::SwigluClamp c) {
  const int64_t N = x.size(0), H = x.size(1), k = index.size(1), E = static_cast<int64_t>(gate_up.size());
  const int64_t P = N * k;
  const int64_t* idx = index.const_data_ptr<int64_t>();
  // The pairs by expert (stable: rows increasing, then slots), as torch.where(index == e) lists them.
  std::vector<int64_t> count(E + 1, 0);
  for (int64_t p = 0; p < P; ++p) ++count[idx[p] + 1];
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
  std::vector<int64_t> pair_row(P), fill(count.begin(), count.end() - 1);
  for (int64_t p = 0; p < P; ++p) pair_row[p] = fill[idx[p]]++;
  // Each row's pairs in increasing expert order (then slot): the order of the module loop's adds.
  std::vector<int64_t> order(P);
  for (int64_t t = 0; t < N; ++t) {
    int64_t* o = order.data() + t * k;
    for (int64_t j = 0; j < k; ++j) o[j] = t * k + j;
    std::stable_sort(o, o + k, [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  }
  // The packed rows of x (pair order), then each chosen expert's gate-up product (checked: its outputs even).
  at::Tensor xs = at::empty({P, H}, x.options());
  const T* X = tf_ptr<T>(x);
  T* XS = tf_mut_ptr<T>(xs);
  for (int64_t p = 0; p < P; ++p) std::copy(X + (p / k) * H, X + (p / k + 1) * H, XS + pair_row[p] * H);
  const bool any_i8_up = std::any_of(gate_up.begin(), gate_up.end(), [](const Projection& g) { return g.i8(); });
  const std::optional<I8Rows> xq = any_i8_up ? std::optional<I8Rows>(quantize_i8_rows(xs)) : std::nullopt;
  std::vector<Group> groups;
  std::vector<RowwiseProduct> ups;
  int64_t h_elems = 0, a_elems = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = count[e + 1] - count[e];
    if (rows == 0) continue;
    const Projection& g = gate_up[e];
    ups.push_back(product_of(xs.narrow(0, count[e], rows), g.i8() ? &*xq : nullptr, count[e], g.w, g.scales));
    const int64_t n = ups.back().N;
    TORCH_CHECK(n % 2 == 0, "moe_experts: expert ", e, "'s gate_up weight has ", n, " rows, not 2I (gate; up)");
    groups.push_back({e, count[e], rows, n / 2, h_elems, a_elems});
    h_elems += rows * n;
    a_elems += rows * (n / 2);
  }
  const at::TensorOptions out_options = ups.empty() ? x.options() : ups.front().out_options;
  for (const RowwiseProduct& p : ups)
    TORCH_CHECK(p.out_options.dtype() == x.dtype(), "moe_experts: the experts' products must be ", x.scalar_type(),
                " like x (int8 formats: float32 x)");
  at::Tensor hs = at::empty({h_elems}, out_options), as = at::empty({a_elems}, out_options);
  T* HS = tf_mut_ptr<T>(hs);
  T* AS = tf_mut_ptr<T>(as);
  std::vector<void*> outs;
  for (const Group& g : groups) outs.push_back(HS + g.h_off);
  run_products(ups, outs);
  // Each chosen expert's biases (gate-up: added before the activation; down: by the weighted sum), or nullptr
  std::vector<const T*> up_bias(E, nullptr), down_bias(E, nullptr);
  for (const Group& g : groups) {
    for (auto [proj, bias, n] : {std::tuple(&gate_up[g.expert], &up_bias[g.expert], 2 * g.inter),
                                 std::tuple(&down[g.expert], &down_bias[g.expert], H)}) {
      if (!proj->bias.has_value()) continue;
      TORCH_CHECK(proj->bias->scalar_type() == x.scalar_type() && proj->bias->dim() == 1 && proj->bias->size(0) == n
                      && proj->bias->is_contiguous(),
                  "moe_experts: expert ", g.expert, "'s biases must be contiguous ", x.scalar_type(), " [", n,
                  "] like its outputs, got ", proj->bias->scalar_type(), " ", proj->bias->sizes());
      *bias = tf_ptr<T>(*proj->bias);
    }
  }
  // act(gate) * up, row by row (gate: the first I of a gate-up row, up: the rest)
  std::vector<std::pair<int64_t, int64_t>> rows_of;  // (group, row within it) of each packed row
  rows_of.reserve(P);
  for (int64_t g = 0; g < static_cast<int64_t>(groups.size()); ++g)
    for (int64_t r = 0; r < groups[g].rows; ++r) rows_of.emplace_back(g, r);
  const int64_t glu_work = 32 * a_elems;  // as glu_into counts it (decoder.cpp)
  triforce::parallel_ranges(triforce::worth_parallel_here(glu_work), P, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const Group& g = groups[rows_of[i].first];
      T* h = HS + g.h_off + rows_of[i].second * 2 * g.inter;
      add_bias(h, up_bias[g.expert], 2 * g.inter);
      triforce::glu_row<A>(h, h + g.inter, AS + g.a_off + rows_of[i].second * g.inter, g.inter, c);
    }
  });
  // Each expert's down product of its activations (int8 formats: the activations rounded once, all rows)
  const bool any_i8_down = std::any_of(groups.begin(), groups.end(), [&](const Group& g) { return down[g.expert].i8(); });
  std::optional<I8Rows> aq;
  std::vector<at::Tensor> a_rows;
  for (const Group& g : groups) a_rows.push_back(as.narrow(0, g.a_off, g.rows * g.inter).view({g.rows, g.inter}));
  if (any_i8_down) {
    TORCH_CHECK(std::all_of(groups.begin(), groups.end(), [&](const Group& g) { return g.inter == groups[0].inter; }),
                "moe_experts: int8 down weights need one expert width");
    aq = quantize_i8_rows(as.view({P, groups[0].inter}));
  }
  std::vector<RowwiseProduct> downs;
  at::Tensor ys = at::empty({P, H}, out_options);
  T* YS = tf_mut_ptr<T>(ys);
  outs.clear();
  bool zero_width = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    const Projection& d = down[g.expert];
    downs.push_back(product_of(a_rows[i], d.i8() ? &*aq : nullptr, g.row0, d.w, d.scales));
    TORCH_CHECK(downs.back().N == H, "moe_experts: expert ", g.expert, "'s down weight has ", downs.back().N,
                " outputs, x ", H);
    TORCH_CHECK(downs.back().out_options.dtype() == x.dtype(), "moe_experts: the experts' products must be ",
                x.scalar_type(), " like x (int8 formats: float32 x)");
    zero_width = zero_width || g.inter == 0;
    outs.push_back(YS + g.row0 * H);
  }
  if (zero_width) ys.zero_();  // (a product over no inputs is 0)
  run_products(downs, outs);
  at::Tensor out = at::empty({N, H}, x.options());
  T* O = tf_mut_ptr<T>(out);
  const int64_t grain = std::max<int64_t>(1, triforce::Team::kMinBytes / std::max<int64_t>(1, 2 * k * H));
  triforce::parallel_ranges(triforce::worth_parallel_here(P * H * 2), N, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      if (weight.scalar_type() == at::kFloat)
        weighted_sum(YS, weight.const_data_ptr<float>(), pair_row.data(), order.data(), idx, down_bias.data(), k, H,
                     O, t);
      else
        weighted_sum(YS, tf_ptr<T>(weight), pair_row.data(), order.data(), idx, down_bias.data(), k, H, O, t);
    }
  });
  return out;
}

}  // namespace

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weight,
                       const OptionalTensorList& gate_up_list, const OptionalTensorList& gate_up_scales_list,
                       const OptionalTensorList& down_list, const OptionalTensorList& down_scales_list,
                       const std::string& activation, const std::optional<OptionalTensorList>& gate_up_bias_list,
                       const std::optional<OptionalTensorList>& down_bias_list, double swiglu_alpha,
                       double swiglu_limit) {
  TORCH_CHECK(x.dim() == 2, "moe_experts: x must be [N, H], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              "moe_experts: x must be float32, bfloat16 or float16, got ", x.scalar_type());
  TORCH_CHECK(index.dim() == 2 && index.size(0) == x.size(0) && index.scalar_type() == at::kLong,
              "moe_experts: index must be int64 [N, k] with N = ", x.size(0), ", got ", index.scalar_type(), " ",
              index.sizes());
  TORCH_CHECK(weight.sizes() == index.sizes(), "moe_experts: weight must be ", index.sizes(), " like index, got ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == x.scalar_type(),
              "moe_experts: weight must be float32 or x's dtype ", x.scalar_type(), ", got ", weight.scalar_type());
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh" || activation == "swiglu_clamped",
              "moe_experts: activation must be 'silu', 'gelu_tanh' or 'swiglu_clamped', got '", activation, "'");
  if (activation == "swiglu_clamped") check_swiglu_clamp("moe_experts", swiglu_alpha, swiglu_limit);
  const triforce::SwigluClamp clamp{static_cast<float>(swiglu_alpha), static_cast<float>(swiglu_limit)};
  const std::vector<std::optional<at::Tensor>> gu = gate_up_list.vec(), gus = gate_up_scales_list.vec(),
                                               dn = down_list.vec(), dns = down_scales_list.vec();
  TORCH_CHECK(gu.size() == dn.size() && gus.size() == gu.size() && dns.size() == gu.size(), "moe_experts: ",
              gu.size(), " gate_up weights, ", gus.size(), " gate_up scales, ", dn.size(), " down weights and ",
              dns.size(), " down scales (one per expert each)");
  const auto biases = [&](const std::optional<OptionalTensorList>& list, const char* name) {
    std::vector<std::optional<at::Tensor>> b = list.has_value() ? list->vec() : decltype(b)(gu.size());
    TORCH_CHECK(b.size() == gu.size(), "moe_experts: ", b.size(), " ", name, " biases for ", gu.size(), " experts");
    return b;
  };
  const std::vector<std::optional<at::Tensor>> gub = biases(gate_up_bias_list, "gate_up"),
                                               dnb = biases(down_bias_list, "down");
  TORCH_CHECK(x.device().is_cpu() && index.device().is_cpu() && weight.device().is_cpu(),
              "moe_experts: CPU tensors only");
  const int64_t E = static_cast<int64_t>(gu.size());
  const at::Tensor xc = x.contiguous(), ic = index.contiguous(), wc = weight.contiguous();
  std::vector<bool> used(E, false);
  const int64_t* idx = ic.const_data_ptr<int64_t>();
  for (int64_t p = 0; p < ic.numel(); ++p) {
    TORCH_CHECK(idx[p] >= 0 && idx[p] < E, "moe_experts: index holds ", idx[p], ", outside the ", E, " experts");
    used[idx[p]] = true;
  }
  std::vector<Projection> gate_up(E), down(E);
  for (int64_t e = 0; e < E; ++e) {
    if (!used[e]) continue;
    TORCH_CHECK(gu[e].has_value() && dn[e].has_value(), "moe_experts: expert ", e,
                " is chosen but its gate_up or down weight is None");
    gate_up[e] = {*gu[e], gus[e], gub[e]};
    down[e] = {*dn[e], dns[e], dnb[e]};
  }
  if (xc.size(0) == 0 || ic.size(1) == 0 || xc.size(1) == 0) return at::zeros_like(xc);
  return TRIFORCE_DISPATCH_FLOAT(xc.scalar_type(), "moe_experts", [&] {
    if (activation == "silu") return run<triforce::Act::kSilu, scalar_t>(xc, ic, wc, gate_up, down, clamp);
    if (activation == "gelu_tanh") return run<triforce::Act::kGeluTanh, scalar_t>(xc, ic, wc, gate_up, down, clamp);
    return run<triforce::Act::kSwigluClamped, scalar_t>(xc, ic, wc, gate_up, down, clamp);
  });
}
