// Torch-free instantiation of the sampling kernels so that CMake compiles them for sm_90 (compile
// check only: no GPU is needed, nothing runs).
#include "triforce/sampling.cuh"

namespace triforce {
namespace sampling {
template __global__ void chain_speculative_sample_kernel<256, int64_t>(const int64_t*, const float*, const float*,
                                                                       const float*, int64_t, int64_t, int64_t*, int32_t*);
template __global__ void chain_speculative_sample_kernel<256, int32_t>(const int32_t*, const float*, const float*,
                                                                       const float*, int64_t, int64_t, int64_t*, int32_t*);
template __global__ void tree_speculative_sample_kernel<256, int64_t, int64_t>(const int64_t*, const int64_t*,
                                                                               const float*, const float*, const float*,
                                                                               int64_t, int64_t, int32_t*, int64_t*,
                                                                               int32_t*, int64_t*);
template __global__ void chain_greedy_verify_kernel<256, int64_t, __nv_bfloat16>(const int64_t*, const __nv_bfloat16*,
                                                                                 int64_t, int64_t, int64_t*, int32_t*);
template __global__ void chain_greedy_verify_kernel<256, int32_t, float>(const int32_t*, const float*, int64_t, int64_t,
                                                                         int64_t*, int32_t*);
template __global__ void tree_greedy_verify_kernel<256, int64_t, int32_t, __half>(const int64_t*, const int32_t*,
                                                                                  const __half*, int64_t, int64_t,
                                                                                  int32_t*, int64_t*, int32_t*);
}  // namespace sampling
}  // namespace triforce
