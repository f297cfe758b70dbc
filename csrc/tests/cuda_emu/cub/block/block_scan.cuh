// cub::BlockScan for the CPU emulation (cuda_emu.h): InclusiveSum with the block aggregate, valid in
// every thread; the temp storage may be reused only after a __syncthreads, as with cub.
#pragma once
#include "../../cuda_emu.h"

namespace cub {

template <class T, int BLOCK>
class BlockScan {
 public:
  struct TempStorage {
    T v[BLOCK];
  };
  explicit BlockScan(TempStorage& s) : s_(s) {}

  void InclusiveSum(T x, T& inclusive, T& aggregate) {
    s_.v[threadIdx.x] = x;
    __syncthreads();
    T run{}, all{};
    for (int i = 0; i < BLOCK; ++i) {
      if (i <= static_cast<int>(threadIdx.x)) run = run + s_.v[i];
      all = all + s_.v[i];
    }
    inclusive = run;
    aggregate = all;
  }

 private:
  TempStorage& s_;
};

}  // namespace cub
