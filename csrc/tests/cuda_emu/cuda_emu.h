// The CUDA execution model on a CPU, enough to *run* the torch-free sampling kernels
// (csrc/include/triforce/sampling.cuh) on a machine without a GPU, and compare them with the CPU walks:
//
// * one std::thread per CUDA thread of a block; blocks run one after another;
// * __syncthreads() is a std::barrier; a thread that returns drops out of it (as an exited CUDA thread
//   no longer holds a barrier up);
// * __shared__ variables are function statics: one per kernel instantiation, shared by the block;
// * cub's BlockReduce / BlockScan (cub/block/*.cuh here) keep the contract cub documents: a reduction's
//   result is valid in thread 0 only, and temp storage may be reused only after a __syncthreads.
//
// Built with -fsanitize=thread, a missing __syncthreads between two uses of shared memory is a data
// race that ThreadSanitizer reports (compute-sanitizer's racecheck, approximated on a CPU). What this
// cannot show: warp-level behaviour, memory coalescing, anything about speed, and the real cub's
// summation order (sums may differ from the GPU's in the last bits, as they do between backends).
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct tf_emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local tf_emu_dim3 threadIdx;
inline tf_emu_dim3 blockIdx;  // one block at a time
inline tf_emu_dim3 blockDim;
inline std::barrier<>* tf_emu_barrier = nullptr;

inline void __syncthreads() { tf_emu_barrier->arrive_and_wait(); }
// Round-to-nearest double ops, never fused (the target is built with -ffp-contract=off).
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }

namespace tf_emu {

// kernel() once per thread of each of `grid` blocks of `block` threads.
template <class F>
void launch(unsigned grid, unsigned block, const F& kernel) {
  blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx.x = b;
    std::barrier<> bar(static_cast<std::ptrdiff_t>(block));
    tf_emu_barrier = &bar;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned t = 0; t < block; ++t)
      threads.emplace_back([&bar, &kernel, t] {
        threadIdx.x = t;
        kernel();
        bar.arrive_and_drop();
      });
    for (auto& th : threads) th.join();
  }
  tf_emu_barrier = nullptr;
}

}  // namespace tf_emu
