#include "triforce/chunk_mean_keys.h"

#include "dispatch.h"
#include "../ops.h"

at::Tensor chunk_mean_keys(const at::Tensor& k, int64_t chunk_size) {
  TORCH_CHECK(k.device().is_cpu(), "chunk_mean_keys: k must be a CPU tensor");
  TORCH_CHECK(k.dim() == 4, "chunk_mean_keys: k must be [B, N, Hkv, D]");
  TORCH_CHECK(chunk_size > 0, "chunk_mean_keys: chunk_size must be positive");
  const int64_t B = k.size(0), C = k.size(1) / chunk_size, H = k.size(2), D = k.size(3);
  auto out = at::empty({B, C, H, D}, k.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  TRIFORCE_DISPATCH_FLOAT(k.scalar_type(), "chunk_mean_keys", [&] {
    triforce::chunk_mean_keys_cpu(tf_ptr<scalar_t>(k), B, C, H, D, chunk_size, k.stride(0), k.stride(1),
                                  k.stride(2), k.stride(3), out.data_ptr<float>());
  });
  return out;
}
