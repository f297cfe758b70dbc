// CPU launchers of the accept / reject samplers: validation, then one OpenMP task per row of the
// torch-free per-row walks in triforce/sampling.h.
#include "triforce/sampling.h"

#include "dispatch.h"
#include "../ops.h"
#include "../sampling_checks.h"

namespace {
using namespace triforce::sampling;
using namespace triforce_launch;

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "triforce sampling: ", name, " must be a CPU tensor");
}

template <class T>
void argmax_rows_impl(const T* base, int64_t R, int64_t V, int64_t* out) {
#pragma omp parallel for schedule(static) if (triforce::worth_parallel(R * V * int64_t(sizeof(T))))
  for (int64_t r = 0; r < R; ++r) out[r] = argmax_row(base + r * V, V, [](T v) { return triforce::to_float(v); });
}

// argmax of every [V] row of logits [R, V] (ties -> lowest index, NaN as -inf) -> int64 [R].
std::vector<int64_t> argmax_rows(const at::Tensor& logits) {
  const int64_t V = logits.size(-1), R = logits.numel() / V;
  std::vector<int64_t> out(R);
  auto x = logits.contiguous();
  TRIFORCE_DISPATCH_FLOAT(x.scalar_type(), "greedy_verify",
                          [&] { argmax_rows_impl(tf_ptr<scalar_t>(x), R, V, out.data()); });
  return out;
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> chain_speculative_sample(const at::Tensor& draft_tokens,
                                                            const std::optional<at::Tensor>& draft_probs,
                                                            const at::Tensor& target_probs,
                                                            const at::Tensor& uniforms) {
  check_cpu(draft_tokens, "draft_tokens");
  check_cpu(target_probs, "target_probs");
  check_cpu(uniforms, "uniforms");
  const SamplerDims dm = check_chain("chain_speculative_sample", draft_tokens, target_probs, true);
  check_draft_and_uniforms("chain_speculative_sample", draft_probs, uniforms, dm, dm.R, dm.R + 1);
  const int64_t B = dm.B, n = dm.R, V = dm.V;
  at::Tensor q;
  if (draft_probs.has_value()) {
    check_cpu(*draft_probs, "draft_probs");
    q = draft_probs->contiguous();
  }
  auto d = draft_tokens.to(at::kLong).contiguous();
  auto p = target_probs.contiguous();
  auto u = uniforms.contiguous();
  auto tokens = at::empty({B, n + 1}, d.options());
  auto num = at::empty({B}, d.options().dtype(at::kInt));
  const int64_t* dp = d.data_ptr<int64_t>();
  const float* qp = q.defined() ? q.data_ptr<float>() : nullptr;
  const float* pp = p.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  int32_t* np = num.data_ptr<int32_t>();
#pragma omp parallel for schedule(dynamic, 1) if (triforce::worth_parallel(B * (2 * n + 1) * V * 4))
  for (int64_t b = 0; b < B; ++b)
    np[b] = chain_sample_row(dp + b * n, qp ? qp + b * n * V : nullptr, pp + b * (n + 1) * V, up + b * (n + 1) * 2,
                             n, V, tp + b * (n + 1));
  return {tokens, num};
}

std::tuple<at::Tensor, at::Tensor> chain_greedy_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits) {
  check_cpu(draft_tokens, "draft_tokens");
  check_cpu(target_logits, "target_logits");
  const SamplerDims dm = check_chain("chain_greedy_verify", draft_tokens, target_logits, false);
  const int64_t B = dm.B, n = dm.R;
  auto d = draft_tokens.to(at::kLong).contiguous();
  auto g = argmax_rows(target_logits);
  auto tokens = at::empty({B, n + 1}, d.options());
  auto num = at::empty({B}, d.options().dtype(at::kInt));
  const int64_t* dp = d.data_ptr<int64_t>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  int32_t* np = num.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) np[b] = chain_greedy_row(dp + b * n, g.data() + b * (n + 1), n, tp + b * (n + 1));
  return {tokens, num};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_speculative_sample(const at::Tensor& tree_tokens,
                                                                       const at::Tensor& parents,
                                                                       const std::optional<at::Tensor>& draft_probs,
                                                                       const at::Tensor& target_probs,
                                                                       const at::Tensor& uniforms) {
  check_cpu(tree_tokens, "tree_tokens");
  check_cpu(parents, "parents");
  check_cpu(target_probs, "target_probs");
  check_cpu(uniforms, "uniforms");
  const SamplerDims dm = check_tree("tree_speculative_sample", tree_tokens, parents, target_probs, true);
  check_draft_and_uniforms("tree_speculative_sample", draft_probs, uniforms, dm, dm.R, dm.R);
  const int64_t B = dm.B, T = dm.R, V = dm.V;
  at::Tensor q;
  if (draft_probs.has_value()) {
    check_cpu(*draft_probs, "draft_probs");
    q = draft_probs->contiguous();
  }
  auto tt = tree_tokens.to(at::kLong).contiguous();
  auto pa = parents.to(at::kLong).contiguous();
  auto p = target_probs.contiguous();
  auto u = uniforms.contiguous();
  auto path = at::empty({B, T}, tt.options().dtype(at::kInt));
  auto tokens = at::empty({B, T}, tt.options());
  auto num = at::empty({B}, tt.options().dtype(at::kInt));
  const int64_t* ttp = tt.data_ptr<int64_t>();
  const int64_t* pap = pa.data_ptr<int64_t>();
  const float* qp = q.defined() ? q.data_ptr<float>() : nullptr;
  const float* pp = p.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  int32_t* pathp = path.data_ptr<int32_t>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  int32_t* np = num.data_ptr<int32_t>();
#pragma omp parallel for schedule(dynamic, 1) if (triforce::worth_parallel(B * 2 * T * V * 4))
  for (int64_t b = 0; b < B; ++b)
    np[b] = tree_sample_row(ttp + b * T, pap + b * T, qp ? qp + b * T * V : nullptr, pp + b * T * V, up + b * T * 2, T,
                            V, pathp + b * T, tp + b * T);
  return {path, tokens, num};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_greedy_verify(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                                                  const at::Tensor& target_logits) {
  check_cpu(tree_tokens, "tree_tokens");
  check_cpu(parents, "parents");
  check_cpu(target_logits, "target_logits");
  const SamplerDims dm = check_tree("tree_greedy_verify", tree_tokens, parents, target_logits, false);
  const int64_t B = dm.B, T = dm.R;
  auto tt = tree_tokens.to(at::kLong).contiguous();
  auto pa = parents.to(at::kLong).contiguous();
  auto g = argmax_rows(target_logits);
  auto path = at::empty({B, T}, tt.options().dtype(at::kInt));
  auto tokens = at::empty({B, T}, tt.options());
  auto num = at::empty({B}, tt.options().dtype(at::kInt));
  for (int64_t b = 0; b < B; ++b)
    num.data_ptr<int32_t>()[b] = tree_greedy_row(tt.data_ptr<int64_t>() + b * T, pa.data_ptr<int64_t>() + b * T,
                                                 g.data() + b * T, T, path.data_ptr<int32_t>() + b * T,
                                                 tokens.data_ptr<int64_t>() + b * T);
  return {path, tokens, num};
}
