// CUDA launchers of the accept / reject samplers: checks, a device guard, one kernel launch per call
// (triforce/sampling.cuh), a launch check. No host synchronisation: capturable in a CUDA graph.
#include <ATen/ATen.h>

#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)  // a CUDA build of torch: the real thing
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define TF_DEVICE_GUARD(t) const c10::cuda::CUDAGuard tf_device_guard((t).device())
#define TF_STREAM() c10::cuda::getCurrentCUDAStream().stream()
#define TF_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
#else  // compile check against a CPU-only torch's headers (tests/test_build.py), which lack c10/cuda
#define TF_DEVICE_GUARD(t) TORCH_CHECK(cudaSetDevice((t).get_device()) == cudaSuccess, "cudaSetDevice failed")
#define TF_STREAM() cudaStream_t{nullptr}
#define TF_LAUNCH_CHECK()                                                   \
  do {                                                                       \
    const cudaError_t tf_err = cudaGetLastError();                           \
    TORCH_CHECK(tf_err == cudaSuccess, "CUDA error: ", cudaGetErrorString(tf_err)); \
  } while (0)
#endif

#include "triforce/sampling.cuh"

#include "../ops.h"
#include "../sampling_checks.h"

namespace {
using namespace triforce::sampling;
using namespace triforce_launch;
constexpr int kBlock = 256;

void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "triforce sampling: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.device() == like.device(), "triforce sampling: ", name, " is on another device");
}

// Runs fn with `index_t` bound to int32_t / int64_t.
template <class F>
void dispatch_index(at::ScalarType t, const char* name, F&& fn) {
  if (t == at::kLong) return fn(int64_t{});
  TORCH_CHECK(t == at::kInt, "triforce sampling: ", name, " must be int32 or int64");
  return fn(int32_t{});
}

template <class F>
void dispatch_logits(at::ScalarType t, F&& fn) {
  switch (t) {
    case at::kFloat: return fn(float{});
    case at::kHalf: return fn(__half{});
    case at::kBFloat16: return fn(__nv_bfloat16{});
    default: TORCH_CHECK(false, "triforce sampling: target_logits must be float32/float16/bfloat16");
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> chain_speculative_sample_cuda(const at::Tensor& draft_tokens,
                                                                 const std::optional<at::Tensor>& draft_probs,
                                                                 const at::Tensor& target_probs, const at::Tensor& uniforms) {
  check_cuda(draft_tokens, "draft_tokens", target_probs);
  check_cuda(target_probs, "target_probs", target_probs);
  check_cuda(uniforms, "uniforms", target_probs);
  TF_DEVICE_GUARD(target_probs);
  const SamplerDims dm = check_chain("chain_speculative_sample", draft_tokens, target_probs, true);
  check_draft_and_uniforms("chain_speculative_sample", draft_probs, uniforms, dm, dm.R, dm.R + 1);
  const int64_t B = dm.B, n = dm.R, V = dm.V;
  at::Tensor q;
  if (draft_probs.has_value()) {
    check_cuda(*draft_probs, "draft_probs", target_probs);
    q = draft_probs->contiguous();
  }
  auto d = draft_tokens.contiguous();
  auto p = target_probs.contiguous();
  auto u = uniforms.contiguous();
  auto tokens = at::empty({B, n + 1}, d.options().dtype(at::kLong));
  auto num = at::empty({B}, d.options().dtype(at::kInt));
  if (B == 0) return {tokens, num};
  cudaStream_t stream = TF_STREAM();
  dispatch_index(d.scalar_type(), "draft_tokens", [&](auto idx) {
    using index_t = decltype(idx);
    chain_speculative_sample_kernel<kBlock, index_t><<<B, kBlock, 0, stream>>>(
        d.data_ptr<index_t>(), q.defined() ? q.data_ptr<float>() : nullptr, p.data_ptr<float>(), u.data_ptr<float>(),
        n, V, tokens.data_ptr<int64_t>(), num.data_ptr<int32_t>());
  });
  TF_LAUNCH_CHECK();
  return {tokens, num};
}

std::tuple<at::Tensor, at::Tensor> chain_greedy_verify_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits) {
  check_cuda(draft_tokens, "draft_tokens", target_logits);
  check_cuda(target_logits, "target_logits", target_logits);
  TF_DEVICE_GUARD(target_logits);
  const SamplerDims dm = check_chain("chain_greedy_verify", draft_tokens, target_logits, false);
  const int64_t B = dm.B, n = dm.R, V = dm.V;
  auto d = draft_tokens.contiguous();
  auto x = target_logits.contiguous();
  auto tokens = at::empty({B, n + 1}, d.options().dtype(at::kLong));
  auto num = at::empty({B}, d.options().dtype(at::kInt));
  if (B == 0) return {tokens, num};
  cudaStream_t stream = TF_STREAM();
  dispatch_index(d.scalar_type(), "draft_tokens", [&](auto idx) {
    using index_t = decltype(idx);
    dispatch_logits(x.scalar_type(), [&](auto val) {
      using scalar_t = decltype(val);
      chain_greedy_verify_kernel<kBlock, index_t, scalar_t><<<B, kBlock, 0, stream>>>(
          d.data_ptr<index_t>(), reinterpret_cast<const scalar_t*>(x.const_data_ptr()), n, V,
          tokens.data_ptr<int64_t>(), num.data_ptr<int32_t>());
    });
  });
  TF_LAUNCH_CHECK();
  return {tokens, num};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_speculative_sample_cuda(const at::Tensor& tree_tokens,
                                                                            const at::Tensor& parents,
                                                                            const std::optional<at::Tensor>& draft_probs,
                                                                            const at::Tensor& target_probs,
                                                                            const at::Tensor& uniforms) {
  check_cuda(tree_tokens, "tree_tokens", target_probs);
  check_cuda(parents, "parents", target_probs);
  check_cuda(target_probs, "target_probs", target_probs);
  check_cuda(uniforms, "uniforms", target_probs);
  TF_DEVICE_GUARD(target_probs);
  const SamplerDims dm = check_tree("tree_speculative_sample", tree_tokens, parents, target_probs, true);
  check_draft_and_uniforms("tree_speculative_sample", draft_probs, uniforms, dm, dm.R, dm.R);
  const int64_t B = dm.B, T = dm.R, V = dm.V;
  at::Tensor q;
  if (draft_probs.has_value()) {
    check_cuda(*draft_probs, "draft_probs", target_probs);
    q = draft_probs->contiguous();
  }
  auto tt = tree_tokens.contiguous();
  auto pa = parents.contiguous();
  auto p = target_probs.contiguous();
  auto u = uniforms.contiguous();
  auto path = at::empty({B, T}, tt.options().dtype(at::kInt));
  auto tokens = at::empty({B, T}, tt.options().dtype(at::kLong));
  auto num = at::empty({B}, tt.options().dtype(at::kInt));
  if (B == 0) return {path, tokens, num};
  auto removed = at::empty({B, T}, tt.options().dtype(at::kLong));  // scratch, see the kernel
  cudaStream_t stream = TF_STREAM();
  dispatch_index(tt.scalar_type(), "tree_tokens", [&](auto idx) {
    using index_t = decltype(idx);
    dispatch_index(pa.scalar_type(), "parents", [&](auto par) {
      using parent_t = decltype(par);
      tree_speculative_sample_kernel<kBlock, index_t, parent_t><<<B, kBlock, 0, stream>>>(
          tt.data_ptr<index_t>(), pa.data_ptr<parent_t>(), q.defined() ? q.data_ptr<float>() : nullptr,
          p.data_ptr<float>(), u.data_ptr<float>(), T, V, path.data_ptr<int32_t>(), tokens.data_ptr<int64_t>(),
          num.data_ptr<int32_t>(), removed.data_ptr<int64_t>());
    });
  });
  TF_LAUNCH_CHECK();
  return {path, tokens, num};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_greedy_verify_cuda(const at::Tensor& tree_tokens,
                                                                       const at::Tensor& parents,
                                                                       const at::Tensor& target_logits) {
  check_cuda(tree_tokens, "tree_tokens", target_logits);
  check_cuda(parents, "parents", target_logits);
  check_cuda(target_logits, "target_logits", target_logits);
  TF_DEVICE_GUARD(target_logits);
  const SamplerDims dm = check_tree("tree_greedy_verify", tree_tokens, parents, target_logits, false);
  const int64_t B = dm.B, T = dm.R, V = dm.V;
  auto tt = tree_tokens.contiguous();
  auto pa = parents.contiguous();
  auto x = target_logits.contiguous();
  auto path = at::empty({B, T}, tt.options().dtype(at::kInt));
  auto tokens = at::empty({B, T}, tt.options().dtype(at::kLong));
  auto num = at::empty({B}, tt.options().dtype(at::kInt));
  if (B == 0) return {path, tokens, num};
  cudaStream_t stream = TF_STREAM();
  dispatch_index(tt.scalar_type(), "tree_tokens", [&](auto idx) {
    using index_t = decltype(idx);
    dispatch_index(pa.scalar_type(), "parents", [&](auto par) {
      using parent_t = decltype(par);
      dispatch_logits(x.scalar_type(), [&](auto val) {
        using scalar_t = decltype(val);
        tree_greedy_verify_kernel<kBlock, index_t, parent_t, scalar_t><<<B, kBlock, 0, stream>>>(
            tt.data_ptr<index_t>(), pa.data_ptr<parent_t>(), reinterpret_cast<const scalar_t*>(x.const_data_ptr()), T,
            V, path.data_ptr<int32_t>(), tokens.data_ptr<int64_t>(), num.data_ptr<int32_t>());
      });
    });
  });
  TF_LAUNCH_CHECK();
  return {path, tokens, num};
}
