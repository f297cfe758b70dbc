// CPU launchers of the retrieval-cache kernels (csrc/include/triforce/retrieval.h). The Python ops
// validate first; these checks guard direct torch.ops.triforce_C.* calls. Read-only inputs whose
// last dim is strided are made contiguous (a copy of an input, never of an output).
#include "triforce/retrieval.h"

#include "dispatch.h"
#include "../ops.h"

namespace {

at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

template <typename T> triforce::Cache4<const T> cache4(const at::Tensor& t) {
  return {tf_ptr<T>(t), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

void check_scores_args(const at::Tensor& q, const at::Tensor& chunk_keys, const at::Tensor& num_chunks) {
  TORCH_CHECK(q.device().is_cpu() && chunk_keys.device().is_cpu() && num_chunks.device().is_cpu(),
              "score_chunks: q, chunk_keys and num_chunks must be CPU tensors");
  TORCH_CHECK(q.dim() == 3, "score_chunks: q must be [B, Hq, D]");
  TORCH_CHECK(chunk_keys.dim() == 4 && chunk_keys.scalar_type() == at::kFloat,
              "score_chunks: chunk_keys must be float32 [B, C, Hkv, D]");
  TORCH_CHECK(chunk_keys.size(0) == q.size(0) && chunk_keys.size(3) == q.size(2),
              "score_chunks: chunk_keys must be [B, C, Hkv, D] with q's B and D");
  TORCH_CHECK(chunk_keys.size(2) > 0 && q.size(1) % chunk_keys.size(2) == 0,
              "score_chunks: q's heads must be a multiple of chunk_keys' KV heads");
  TORCH_CHECK(num_chunks.scalar_type() == at::kInt && num_chunks.dim() == 1 && num_chunks.size(0) == q.size(0),
              "score_chunks: num_chunks must be int32 [B]");
}

void check_gather_args(const at::Tensor& k, const at::Tensor& v, int64_t chunk_size, const at::Tensor& out_k,
                       const at::Tensor& out_v, int64_t slots) {
  TORCH_CHECK(k.device().is_cpu() && v.device().is_cpu() && out_k.device().is_cpu() && out_v.device().is_cpu(),
              "gather_chunks: k, v, out_k and out_v must be CPU tensors");
  TORCH_CHECK(k.dim() == 4 && v.sizes() == k.sizes(), "gather_chunks: k and v must be [B, N, Hkv, D]");
  TORCH_CHECK(chunk_size > 0, "gather_chunks: chunk_size must be positive");
  TORCH_CHECK(v.scalar_type() == k.scalar_type() && out_k.scalar_type() == k.scalar_type() &&
                  out_v.scalar_type() == k.scalar_type(),
              "gather_chunks: k, v, out_k and out_v must share one dtype");
  TORCH_CHECK(out_k.dim() == 4 && out_v.sizes() == out_k.sizes() && out_k.size(0) == k.size(0) &&
                  out_k.size(2) == k.size(2) && out_k.size(3) == k.size(3) && out_k.size(1) >= slots * chunk_size,
              "gather_chunks: out_k/out_v must be [B, M >= slots * chunk_size, Hkv, D]");
  TORCH_CHECK(out_k.is_contiguous() && out_v.is_contiguous(), "gather_chunks: out_k and out_v must be contiguous");
}

}  // namespace

at::Tensor score_chunks(const at::Tensor& q_in, const at::Tensor& chunk_keys_in, const at::Tensor& num_chunks_in) {
  check_scores_args(q_in, chunk_keys_in, num_chunks_in);
  const auto q = rows_contiguous(q_in), ck = rows_contiguous(chunk_keys_in), n = num_chunks_in.contiguous();
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), C = ck.size(1), Hkv = ck.size(2);
  auto out = at::empty({B, Hkv, C}, q.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  TRIFORCE_DISPATCH_FLOAT(q.scalar_type(), "score_chunks", [&] {
    triforce::score_chunks_cpu(tf_ptr<scalar_t>(q), q.stride(0), q.stride(1), B, Hq, Hkv, D, cache4<float>(ck), C,
                               n.const_data_ptr<int32_t>(), out.data_ptr<float>());
  });
  return out;
}

at::Tensor select_chunks(const at::Tensor& scores_in, const at::Tensor& num_chunks_in, int64_t budget_chunks,
                         int64_t sink_chunks, int64_t recent_chunks) {
  TORCH_CHECK(scores_in.device().is_cpu() && num_chunks_in.device().is_cpu(), "select_chunks: CPU tensors expected");
  TORCH_CHECK(scores_in.dim() == 3 && scores_in.scalar_type() == at::kFloat, "select_chunks: scores must be float32 [B, Hkv, C]");
  TORCH_CHECK(num_chunks_in.scalar_type() == at::kInt && num_chunks_in.dim() == 1 &&
                  num_chunks_in.size(0) == scores_in.size(0),
              "select_chunks: num_chunks must be int32 [B]");
  TORCH_CHECK(sink_chunks >= 0 && recent_chunks >= 0 && budget_chunks > sink_chunks + recent_chunks,
              "select_chunks: need budget_chunks > sink_chunks + recent_chunks >= 0");
  const auto scores = scores_in.contiguous(), n = num_chunks_in.contiguous();
  const int64_t B = scores.size(0), H = scores.size(1), C = scores.size(2);
  auto out = at::empty({B, H, budget_chunks}, scores.options().dtype(at::kInt));
  if (out.numel() == 0) return out;
  triforce::select_chunks_cpu(scores.const_data_ptr<float>(), n.const_data_ptr<int32_t>(), B, H, C, budget_chunks,
                              sink_chunks, recent_chunks, out.data_ptr<int32_t>());
  return out;
}

void gather_chunks(const at::Tensor& k, const at::Tensor& v, const at::Tensor& chunk_idx_in, int64_t chunk_size,
                   at::Tensor& out_k, at::Tensor& out_v) {
  TORCH_CHECK(chunk_idx_in.device().is_cpu() && chunk_idx_in.scalar_type() == at::kInt && chunk_idx_in.dim() == 3,
              "gather_chunks: chunk_idx must be an int32 CPU tensor [B, Hkv, S]");
  check_gather_args(k, v, chunk_size, out_k, out_v, chunk_idx_in.size(2));
  TORCH_CHECK(chunk_idx_in.size(0) == k.size(0) && chunk_idx_in.size(1) == k.size(2),
              "gather_chunks: chunk_idx must be [B, Hkv, S]");
  const auto idx = chunk_idx_in.contiguous();
  const int64_t B = k.size(0), N = k.size(1), H = k.size(2), D = k.size(3), S = idx.size(2);
  if (B * H * S * D == 0) return;
  TRIFORCE_DISPATCH_FLOAT(k.scalar_type(), "gather_chunks", [&] {
    triforce::gather_chunks_cpu(cache4<scalar_t>(k), cache4<scalar_t>(v), B, N, H, D, idx.const_data_ptr<int32_t>(),
                                S, chunk_size, tf_mut_ptr<scalar_t>(out_k), tf_mut_ptr<scalar_t>(out_v), out_k.size(1));
  });
}

at::Tensor build_retrieval_cache(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& chunk_keys_in, const at::Tensor& num_chunks_in, int64_t chunk_size,
                                 int64_t budget_chunks, at::Tensor& out_k, at::Tensor& out_v, int64_t sink_chunks,
                                 int64_t recent_chunks) {
  check_scores_args(q_in, chunk_keys_in, num_chunks_in);
  check_gather_args(k, v, chunk_size, out_k, out_v, budget_chunks);
  TORCH_CHECK(sink_chunks >= 0 && recent_chunks >= 0 && budget_chunks > sink_chunks + recent_chunks,
              "build_retrieval_cache: need budget_chunks > sink_chunks + recent_chunks >= 0");
  TORCH_CHECK(chunk_keys_in.size(0) == k.size(0) && chunk_keys_in.size(2) == k.size(2) &&
                  chunk_keys_in.size(3) == k.size(3) && chunk_keys_in.size(1) <= k.size(1) / chunk_size,
              "build_retrieval_cache: chunk_keys must be [B, C <= N // chunk_size, Hkv, D] for k [B, N, Hkv, D]");
  const auto q = rows_contiguous(q_in), ck = rows_contiguous(chunk_keys_in), n = num_chunks_in.contiguous();
  const int64_t B = k.size(0), N = k.size(1), Hkv = k.size(2), D = k.size(3), C = ck.size(1), Hq = q.size(1);
  auto chunk_idx = at::empty({B, Hkv, budget_chunks}, q.options().dtype(at::kInt));
  if (chunk_idx.numel() == 0) return chunk_idx;
  TRIFORCE_DISPATCH_FLOAT(q.scalar_type(), "build_retrieval_cache", [&] {
    using q_t = scalar_t;
    TRIFORCE_DISPATCH_FLOAT(k.scalar_type(), "build_retrieval_cache", [&] {
      triforce::build_retrieval_cache_cpu(tf_ptr<q_t>(q), q.stride(0), q.stride(1), Hq, cache4<scalar_t>(k),
                                          cache4<scalar_t>(v), B, N, Hkv, D, cache4<float>(ck), C,
                                          n.const_data_ptr<int32_t>(), chunk_size, budget_chunks, sink_chunks,
                                          recent_chunks, tf_mut_ptr<scalar_t>(out_k), tf_mut_ptr<scalar_t>(out_v),
                                          out_k.size(1), chunk_idx.data_ptr<int32_t>());
    });
  });
  return chunk_idx;
}
