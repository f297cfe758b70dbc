// moe_experts: a mixture of experts' MLP on the CPU for the rows of x, given each row's chosen experts and their
// weights (the router's work stays in Python: triforce/models/llama.py, SparseMoE). Bitwise what SparseMoE's
// modules compute expert by expert: each expert's rows through rowwise_linear (gate and up as one projection),
// act(gate) * up (glu.h), rowwise_linear (down), then each row's sum, from zero and in the element type, of
// round(output * weight) in increasing expert order.
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

#if defined(__GNUC__) && !defined(__clang__)
#define TRIFORCE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define TRIFORCE_NO_FP_CONTRACT
#endif

// The (row, slot) pairs that chose one expert, packed: rows [row0, row0 + rows) of the packed buffers.
struct Group {
  int64_t expert, row0, rows, inter;  // inter: the expert's width I (gate_up [2I, H], down [H, I])
  int64_t h_off, a_off;               // element offsets of its rows in the gate-up and activation buffers
};

// A piece of one product: weight blocks [b0, b1) of group g against its packed rows [m0, m0 + rows).
struct Piece {
  int64_t g, m0, rows, b0, b1;
};

// Pieces of every group's product x_g [rows_g, K_g] @ w_g^T ([N_g, K_g]): each group's rows in chunks of
// kRowChunk (linear.h), each chunk's weight blocks in pieces of at least 16 blocks and ~256 KiB of work (a
// piece's blocks are read once, in order: the prefetches stay ahead within it). work: the bytes counted, as
// rowwise_linear counts them (parallel_min_bytes).
template <typename KN>
std::vector<Piece> pieces_of(const std::vector<Group>& groups, KN&& k_n, int64_t w_bytes, int64_t& work) {
  using namespace triforce::linear;
  std::vector<Piece> out;
  work = 0;
  for (int64_t g = 0; g < static_cast<int64_t>(groups.size()); ++g) {
    const auto [K, N] = k_n(groups[g]);
    if (K == 0 || N == 0) continue;  // (the caller zero-fills a product over K = 0)
    const int64_t nb = rowwise_linear_num_blocks(N);
    for (int64_t m0 = 0; m0 < groups[g].rows; m0 += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, groups[g].rows - m0);
      const int64_t block_work = NR * K * std::max(w_bytes, rows);
      const int64_t per = std::max<int64_t>(16, ((int64_t(256) << 10) + block_work - 1) / block_work);
      for (int64_t b = 0; b < nb; b += per) out.push_back({g, m0, rows, b, std::min(nb, b + per)});
      work += nb * block_work;
    }
  }
  return out;
}

// Every group's product in one parallel loop over the pieces.
template <typename Body>
void run_pieces(const std::vector<Piece>& pieces, int64_t work, Body&& body) {
  triforce::parallel_items(triforce::worth_parallel_here(work), static_cast<int64_t>(pieces.size()),
                           [&](int, int64_t i) { body(pieces[i]); });
}

// out[t] = sum over t's pairs p, in increasing expert order, of round(y[p] * weight[p]), each add rounded to T.
template <typename T, typename W>
TRIFORCE_NO_FP_CONTRACT void weighted_sum(const T* y, const W* weight, const int64_t* pair_row,
                                          const int64_t* order, int64_t k, int64_t H, T* out, int64_t t) {
  T* o = out + t * H;
  for (int64_t h = 0; h < H; ++h) o[h] = triforce::from_float<T>(0.f);
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = order[t * k + j];  // the pair t * k + slot, in the order its experts are summed
    const float w = triforce::to_float(weight[p]);
    const T* yr = y + pair_row[p] * H;
    for (int64_t h = 0; h < H; ++h) {
      const float product = triforce::to_float(triforce::from_float<T>(triforce::to_float(yr[h]) * w));
      o[h] = triforce::from_float<T>(triforce::to_float(o[h]) + product);
    }
  }
}

template <triforce::Act A, typename T>
at::Tensor run(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weight,
               const std::vector<at::Tensor>& gate_up, const std::vector<at::Tensor>& down) {
  using namespace triforce::linear;
  const int64_t N = x.size(0), H = x.size(1), k = index.size(1), E = static_cast<int64_t>(gate_up.size());
  const int64_t* idx = index.const_data_ptr<int64_t>();
  // The pairs by expert (stable: rows increasing, then slots), as torch.where(index == e) lists them.
  std::vector<int64_t> count(E + 1, 0);
  for (int64_t p = 0; p < N * k; ++p) ++count[idx[p] + 1];
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
  std::vector<int64_t> pair_row(N * k), fill(count.begin(), count.end() - 1);
  for (int64_t p = 0; p < N * k; ++p) pair_row[p] = fill[idx[p]]++;
  // Each row's pairs in increasing expert order (then slot): the order of the module loop's adds.
  std::vector<int64_t> order(N * k);
  for (int64_t t = 0; t < N; ++t) {
    int64_t* o = order.data() + t * k;
    for (int64_t j = 0; j < k; ++j) o[j] = t * k + j;
    std::stable_sort(o, o + k, [&](int64_t a, int64_t b) { return idx[a] < idx[b]; });
  }
  std::vector<Group> groups;
  int64_t h_elems = 0, a_elems = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = count[e + 1] - count[e];
    if (rows == 0) continue;
    const int64_t inter = down[e].size(1);
    groups.push_back({e, count[e], rows, inter, h_elems, a_elems});
    h_elems += rows * 2 * inter;
    a_elems += rows * inter;
  }
  // The packed rows of x (pair order), the gate-up products, act(gate) * up, the down products.
  at::Tensor xs = at::empty({N * k, H}, x.options());
  at::Tensor hs = at::empty({h_elems}, x.options()), as = at::empty({a_elems}, x.options());
  const bool empty_expert = std::any_of(groups.begin(), groups.end(), [](const Group& g) { return g.inter == 0; });
  at::Tensor ys = empty_expert ? at::zeros({N * k, H}, x.options()) : at::empty({N * k, H}, x.options());
  const T* X = tf_ptr<T>(x);
  T* XS = tf_mut_ptr<T>(xs);
  T* HS = tf_mut_ptr<T>(hs);
  T* AS = tf_mut_ptr<T>(as);
  T* YS = tf_mut_ptr<T>(ys);
  for (int64_t p = 0; p < N * k; ++p) std::copy(X + (p / k) * H, X + (p / k + 1) * H, XS + pair_row[p] * H);

  int64_t work = 0;
  const auto up_pieces = pieces_of(groups, [&](const Group& g) { return std::pair<int64_t, int64_t>(H, 2 * g.inter); },
                                   sizeof(T), work);
  run_pieces(up_pieces, work, [&](const Piece& c) {
    const Group& g = groups[c.g];
    const int64_t n = 2 * g.inter;
    rowwise_linear_blocks<T, T>(XS + (g.row0 + c.m0) * H, c.rows, H, tf_ptr<T>(gate_up[g.expert]), n,
                                HS + g.h_off + c.m0 * n, c.b0, c.b1);
  });
  // act(gate) * up, row by row (gate: the first I of a gate-up row, up: the rest)
  std::vector<std::pair<int64_t, int64_t>> rows_of;  // (group, row within it) of each packed row
  rows_of.reserve(N * k);
  for (int64_t g = 0; g < static_cast<int64_t>(groups.size()); ++g)
    for (int64_t r = 0; r < groups[g].rows; ++r) rows_of.emplace_back(g, r);
  const int64_t glu_work = 32 * a_elems;  // as glu_into counts it (decoder.cpp)
  triforce::parallel_ranges(triforce::worth_parallel_here(glu_work), N * k, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const Group& g = groups[rows_of[i].first];
      const T* h = HS + g.h_off + rows_of[i].second * 2 * g.inter;
      triforce::glu_row<A>(h, h + g.inter, AS + g.a_off + rows_of[i].second * g.inter, g.inter);
    }
  });
  const auto down_pieces = pieces_of(groups, [&](const Group& g) { return std::pair<int64_t, int64_t>(g.inter, H); },
                                     sizeof(T), work);
  run_pieces(down_pieces, work, [&](const Piece& c) {
    const Group& g = groups[c.g];
    rowwise_linear_blocks<T, T>(AS + g.a_off + c.m0 * g.inter, c.rows, g.inter, tf_ptr<T>(down[g.expert]), H,
                                YS + (g.row0 + c.m0) * H, c.b0, c.b1);
  });
  at::Tensor out = at::empty({N, H}, x.options());
  T* O = tf_mut_ptr<T>(out);
  const int64_t grain = std::max<int64_t>(1, triforce::Team::kMinBytes / std::max<int64_t>(1, 2 * k * H));
  triforce::parallel_ranges(triforce::worth_parallel_here(N * k * H * 2), N, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      if (weight.scalar_type() == at::kFloat)
        weighted_sum(YS, weight.const_data_ptr<float>(), pair_row.data(), order.data(), k, H, O, t);
      else
        weighted_sum(YS, tf_ptr<T>(weight), pair_row.data(), order.data(), k, H, O, t);
    }
  });
  return out;
}

}  // namespace

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weight,
                       const OptionalTensorList& gate_up_list, const OptionalTensorList& down_list,
                       const std::string& activation) {
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
  TORCH_CHECK(activation == "silu" || activation == "gelu_tanh",
              "moe_experts: activation must be 'silu' or 'gelu_tanh', got '", activation, "'");
  const std::vector<std::optional<at::Tensor>> gu = gate_up_list.vec(), dn = down_list.vec();
  TORCH_CHECK(gu.size() == dn.size(), "moe_experts: ", gu.size(), " gate_up weights but ", dn.size(), " down weights");
  TORCH_CHECK(x.device().is_cpu() && index.device().is_cpu() && weight.device().is_cpu(),
              "moe_experts: CPU tensors only");
  const int64_t E = static_cast<int64_t>(gu.size()), H = x.size(1);
  const at::Tensor xc = x.contiguous(), ic = index.contiguous(), wc = weight.contiguous();
  std::vector<bool> used(E, false);
  const int64_t* idx = ic.const_data_ptr<int64_t>();
  for (int64_t p = 0; p < ic.numel(); ++p) {
    TORCH_CHECK(idx[p] >= 0 && idx[p] < E, "moe_experts: index holds ", idx[p], ", outside the ", E, " experts");
    used[idx[p]] = true;
  }
  std::vector<at::Tensor> gate_up(E), down(E);
  for (int64_t e = 0; e < E; ++e) {
    if (!used[e]) continue;
    TORCH_CHECK(gu[e].has_value() && dn[e].has_value(), "moe_experts: expert ", e,
                " is chosen but its gate_up or down weight is None");
    const at::Tensor& a = *gu[e];
    const at::Tensor& b = *dn[e];
    TORCH_CHECK(a.scalar_type() == x.scalar_type() && b.scalar_type() == x.scalar_type(), "moe_experts: expert ", e,
                "'s weights must be ", x.scalar_type(), " like x, got ", a.scalar_type(), " and ", b.scalar_type());
    TORCH_CHECK(a.device().is_cpu() && b.device().is_cpu(), "moe_experts: CPU tensors only");
    TORCH_CHECK(b.dim() == 2 && b.size(0) == H, "moe_experts: expert ", e, "'s down weight must be [", H,
                ", I], got ", b.sizes());
    TORCH_CHECK(a.dim() == 2 && a.size(0) == 2 * b.size(1) && a.size(1) == H, "moe_experts: expert ", e,
                "'s gate_up weight must be [2 * ", b.size(1), ", ", H, "], got ", a.sizes());
    gate_up[e] = a.contiguous();
    down[e] = b.contiguous();
  }
  if (xc.size(0) == 0 || ic.size(1) == 0 || H == 0) return at::zeros_like(xc);
  return TRIFORCE_DISPATCH_FLOAT(xc.scalar_type(), "moe_experts", [&] {
    return activation == "silu" ? run<triforce::Act::kSilu, scalar_t>(xc, ic, wc, gate_up, down)
                                : run<triforce::Act::kGeluTanh, scalar_t>(xc, ic, wc, gate_up, down);
  });
}
