#include "triforce/verify_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "dispatch.h"
#include "../ops.h"

std::tuple<at::Tensor, at::Tensor> verify_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                    const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                    const std::optional<at::Tensor>& tree_mask, double softmax_scale,
                                                    int64_t num_splits, int64_t window, double softcap,
                                                    const std::optional<at::Tensor>& cache_leftpad,
                                                    const std::optional<at::Tensor>& alibi_slopes) {
  return verify_attention_ragged(q, k_cache, v_cache, cache_seqlens, tree_mask, softmax_scale, num_splits,
                                 std::nullopt, window, softcap, cache_leftpad, alibi_slopes);
}

std::tuple<at::Tensor, at::Tensor> verify_attention_ragged(const at::Tensor& q, const at::Tensor& k_cache,
                                                           const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                           const std::optional<at::Tensor>& tree_mask,
                                                           double softmax_scale, int64_t num_splits,
                                                           const std::optional<at::Tensor>& query_lens,
                                                           int64_t window, double softcap,
                                                           const std::optional<at::Tensor>& cache_leftpad,
                                                           const std::optional<at::Tensor>& alibi_slopes) {
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu() &&
                  cache_seqlens.device().is_cpu(),
              "verify_attention: all tensors must be on the CPU");
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4,
              "verify_attention: q must be [B, T, Hq, D] and the caches [B, N, Hkv, D]");
  const int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t N = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(0) == B && k_cache.size(3) == D && v_cache.sizes() == k_cache.sizes(),
              "verify_attention: k_cache and v_cache must be [B, N, Hkv, D] matching q");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "verify_attention: Hq must be a multiple of Hkv");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "verify_attention: q, k_cache and v_cache must have the same dtype");
  TORCH_CHECK((D == 1 || k_cache.stride(3) == 1) && (D == 1 || v_cache.stride(3) == 1),
              "verify_attention: k_cache and v_cache must have a contiguous last dimension (read in place, never copied)");
  TORCH_CHECK(cache_seqlens.scalar_type() == at::kInt && cache_seqlens.dim() == 1 && cache_seqlens.size(0) == B,
              "verify_attention: cache_seqlens must be int32 [B]");
  TORCH_CHECK(num_splits >= 0 && num_splits <= triforce::kMaxSplits, "verify_attention: num_splits must be in [0, ",
              triforce::kMaxSplits, "]");
  TORCH_CHECK(window >= 0, "verify_attention: window must be >= 0 (0: no sliding window), got ", window);
  TORCH_CHECK(softcap >= 0 && std::isfinite(softcap), "verify_attention: softcap must be finite and >= 0 (0: none), got ",
              softcap);
  at::Tensor mask;
  if (tree_mask.has_value()) {
    TORCH_CHECK(tree_mask->scalar_type() == at::kBool && tree_mask->dim() == 3 && tree_mask->size(0) == B &&
                    tree_mask->size(1) == T && tree_mask->size(2) == T,
                "verify_attention: tree_mask must be bool [B, T, T]");
    TORCH_CHECK(tree_mask->device().is_cpu(), "verify_attention: tree_mask must be on the CPU");
    mask = tree_mask->contiguous();
  }
  if (query_lens.has_value())
    TORCH_CHECK(query_lens->scalar_type() == at::kInt && query_lens->dim() == 1 && query_lens->size(0) == B &&
                    query_lens->is_contiguous() && query_lens->device().is_cpu(),
                "verify_attention: query_lens must be contiguous int32 [B] on the CPU");
  at::Tensor leftpad;
  if (cache_leftpad.has_value()) {
    TORCH_CHECK(cache_leftpad->scalar_type() == at::kInt && cache_leftpad->dim() == 1 && cache_leftpad->size(0) == B &&
                    cache_leftpad->device().is_cpu(),
                "verify_attention: cache_leftpad must be int32 [B] on the CPU");
    leftpad = cache_leftpad->contiguous();
  }
  at::Tensor slopes;
  if (alibi_slopes.has_value()) {
    TORCH_CHECK(alibi_slopes->scalar_type() == at::kFloat && alibi_slopes->device().is_cpu() &&
                    ((alibi_slopes->dim() == 1 && alibi_slopes->size(0) == Hq) ||
                     (alibi_slopes->dim() == 2 && alibi_slopes->size(0) == B && alibi_slopes->size(1) == Hq)),
                "verify_attention: alibi_slopes must be float32 [Hq] or [B, Hq] on the CPU");
    slopes = alibi_slopes->dim() == 1 ? alibi_slopes->contiguous().unsqueeze(0) : alibi_slopes->contiguous();
  }
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor lens = cache_seqlens.contiguous();
  auto out = at::empty({B, T, Hq, D}, q.options());
  auto lse = at::empty({B, Hq, T}, q.options().dtype(at::kFloat));
  if (out.numel() == 0) return {out, lse};
  TRIFORCE_DISPATCH_FLOAT(q.scalar_type(), "verify_attention", [&] {
    triforce::verify_attention_cpu(tf_ptr<scalar_t>(qc), qc.stride(0), qc.stride(1), qc.stride(2),
                                   tf_ptr<scalar_t>(k_cache), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                   tf_ptr<scalar_t>(v_cache), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                                   lens.const_data_ptr<int32_t>(), mask.defined() ? mask.const_data_ptr<bool>() : nullptr,
                                   static_cast<float>(softmax_scale), B, T, Hq, Hkv, D, N, num_splits,
                                   tf_mut_ptr<scalar_t>(out), lse.data_ptr<float>(),
                                   query_lens.has_value() ? query_lens->const_data_ptr<int32_t>() : nullptr, window,
                                   static_cast<float>(softcap),
                                   leftpad.defined() ? leftpad.const_data_ptr<int32_t>() : nullptr,
                                   slopes.defined() ? slopes.const_data_ptr<float>() : nullptr,
                                   slopes.defined() && slopes.size(0) > 1 ? Hq : 0);
  });
  return {out, lse};
}

at::Tensor softcap(const at::Tensor& x, double cap) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "softcap: x must be a float32 CPU tensor");
  TORCH_CHECK(cap > 0 && std::isfinite(cap), "softcap: cap must be finite and > 0, got ", cap);
  at::Tensor out = x.contiguous().clone();
  float* p = out.data_ptr<float>();
  const int64_t n = out.numel();
  const float c = static_cast<float>(cap);
  // chunks of whole 16-element vectors (the split never changes an element's instructions)
  at::parallel_for(0, (n + 15) / 16, 4096, [&](int64_t lo, int64_t hi) {
    triforce::softcap_inplace(p + lo * 16, std::min(hi * 16, n) - lo * 16, c);
  });
  return out;
}
