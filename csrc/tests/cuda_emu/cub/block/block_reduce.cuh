// cub::BlockReduce for the CPU emulation (cuda_emu.h), with cub's documented contract: the result is
// valid in thread 0 only (the others get a value-initialised T here), and the temp storage may be
// reused only after a __syncthreads (thread 0 reads it after this call returns to the others).
#pragma once
#include "../../cuda_emu.h"

namespace cub {

template <class T, int BLOCK>
class BlockReduce {
 public:
  struct TempStorage {
    T v[BLOCK];
  };
  explicit BlockReduce(TempStorage& s) : s_(s) {}

  template <class Op>
  T Reduce(T x, Op op) {
    s_.v[threadIdx.x] = x;
    __syncthreads();
    if (threadIdx.x != 0) return T{};
    T r = s_.v[0];
    for (int i = 1; i < BLOCK; ++i) r = op(r, s_.v[i]);
    return r;
  }
  T Sum(T x) {
    return Reduce(x, [](const T& a, const T& b) { return a + b; });
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
