// Shape / dtype checks shared by the CPU (csrc/cpu/sampling.cpp) and CUDA (csrc/cuda/sampling.cu)
// sampling launchers; the device checks stay with each backend. (The public Python ops validate
// first; these guard direct torch.ops.triforce_C calls.)
#pragma once
#include <ATen/ATen.h>

#include <optional>

namespace triforce_launch {

struct SamplerDims {
  int64_t B, R, V;  // R: drafts n (chain) or tree nodes T (tree)
};

inline void check_rows(const at::Tensor& t, const char* op, const char* name, int64_t B, int64_t R, int64_t V,
                       bool float32, const char* shape) {
  TORCH_CHECK(t.dim() == 3 && t.size(0) == B && t.size(1) == R && (V < 0 || t.size(2) == V) && t.size(2) >= 1 &&
                  (!float32 || t.scalar_type() == at::kFloat),
              op, ": ", name, " must be ", float32 ? "float32 " : "", shape);
}

// draft_tokens [B, n] and target (probs: float32; logits: any float) [B, n+1, V].
inline SamplerDims check_chain(const char* op, const at::Tensor& draft_tokens, const at::Tensor& target, bool probs) {
  TORCH_CHECK(draft_tokens.dim() == 2, op, ": draft_tokens must be [B, n]");
  const int64_t B = draft_tokens.size(0), n = draft_tokens.size(1);
  check_rows(target, op, probs ? "target_probs" : "target_logits", B, n + 1, -1, probs, "[B, n+1, V]");
  return {B, n, target.size(2)};
}

// tree_tokens and parents [B, T], T >= 1, and target [B, T, V].
inline SamplerDims check_tree(const char* op, const at::Tensor& tree_tokens, const at::Tensor& parents,
                              const at::Tensor& target, bool probs) {
  TORCH_CHECK(tree_tokens.dim() == 2 && tree_tokens.size(1) >= 1, op, ": tree_tokens must be [B, T], T >= 1");
  TORCH_CHECK(parents.sizes() == tree_tokens.sizes(), op, ": parents must be [B, T] like tree_tokens");
  const int64_t B = tree_tokens.size(0), T = tree_tokens.size(1);
  check_rows(target, op, probs ? "target_probs" : "target_logits", B, T, -1, probs, "[B, T, V]");
  return {B, T, target.size(2)};
}

// The speculative samplers' optional draft_probs float32 [B, draft_rows, V] and uniforms float32
// [B, uniform_rows, 2] (chain: n and n+1 rows; tree: T and T).
inline void check_draft_and_uniforms(const char* op, const std::optional<at::Tensor>& draft_probs,
                                     const at::Tensor& uniforms, SamplerDims d, int64_t draft_rows,
                                     int64_t uniform_rows) {
  if (draft_probs.has_value())
    check_rows(*draft_probs, op, "draft_probs", d.B, draft_rows, d.V, true, "[B, rows, V] (V as target_probs)");
  TORCH_CHECK(uniforms.dim() == 3 && uniforms.size(0) == d.B && uniforms.size(1) == uniform_rows &&
                  uniforms.size(2) == 2 && uniforms.scalar_type() == at::kFloat,
              op, ": uniforms must be float32 [B, ", uniform_rows, ", 2]");
}

}  // namespace triforce_launch
