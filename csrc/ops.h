// Declarations of the launchers registered in torch_bindings.cpp. One section per op family; the
// same name serves CPU (csrc/cpu) and CUDA (csrc/cuda) through the dispatcher, so CUDA launchers are
// declared as <name>_cuda.
#pragma once
#include <ATen/ATen.h>

// ---- retrieval cache (DESIGN 3.1) -------------------------------------------------------------
at::Tensor chunk_mean_keys(const at::Tensor& k, int64_t chunk_size);

// ---- verification attention (DESIGN 3.2) -------------------------------------------------------

// ---- accept / reject sampling (DESIGN 3.3) -----------------------------------------------------
std::tuple<at::Tensor, at::Tensor> chain_speculative_sample(const at::Tensor& draft_tokens,
                                                            const std::optional<at::Tensor>& draft_probs,
                                                            const at::Tensor& target_probs, const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor> chain_greedy_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_speculative_sample(const at::Tensor& tree_tokens,
                                                                       const at::Tensor& parents,
                                                                       const std::optional<at::Tensor>& draft_probs,
                                                                       const at::Tensor& target_probs,
                                                                       const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_greedy_verify(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                                                  const at::Tensor& target_logits);
#ifdef TRIFORCE_WITH_CUDA
std::tuple<at::Tensor, at::Tensor> chain_speculative_sample_cuda(const at::Tensor& draft_tokens,
                                                                 const std::optional<at::Tensor>& draft_probs,
                                                                 const at::Tensor& target_probs, const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor> chain_greedy_verify_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_speculative_sample_cuda(const at::Tensor& tree_tokens,
                                                                            const at::Tensor& parents,
                                                                            const std::optional<at::Tensor>& draft_probs,
                                                                            const at::Tensor& target_probs,
                                                                            const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_greedy_verify_cuda(const at::Tensor& tree_tokens,
                                                                       const at::Tensor& parents,
                                                                       const at::Tensor& target_logits);
#endif
