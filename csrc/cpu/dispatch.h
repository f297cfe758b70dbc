// Launcher helpers: map an ATen float dtype to the torch-free scalar type of csrc/include.
#pragma once
#include <ATen/ATen.h>

#include "triforce/common.h"

template <typename T> struct TorchFree { using type = T; };
template <> struct TorchFree<at::Half> { using type = triforce::f16; };
template <> struct TorchFree<at::BFloat16> { using type = triforce::bf16; };

// Runs __VA_ARGS__ with `scalar_t` bound to float / triforce::f16 / triforce::bf16.
#define TRIFORCE_DISPATCH_FLOAT(DTYPE, NAME, ...)                                        \
  [&] {                                                                                    \
    switch (DTYPE) {                                                                       \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }                  \
      case at::kHalf: { using scalar_t = triforce::f16; return __VA_ARGS__(); }           \
      case at::kBFloat16: { using scalar_t = triforce::bf16; return __VA_ARGS__(); }      \
      default: TORCH_CHECK(false, NAME ": unsupported dtype ", DTYPE, " (expected float32/float16/bfloat16)"); \
    }                                                                                      \
  }()

template <typename T> inline const T* tf_ptr(const at::Tensor& t) {
  return reinterpret_cast<const T*>(t.const_data_ptr());
}
template <typename T> inline T* tf_mut_ptr(at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }
