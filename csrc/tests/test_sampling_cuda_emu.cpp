// The CUDA sampling kernels (csrc/include/triforce/sampling.cuh), *run* on a CPU through the emulation
// in csrc/tests/cuda_emu (one thread per CUDA thread, barriers, cub's contract), against the CPU walks
// of sampling.h on random rows: sparse, NaN-corrupted and out-of-range inputs, V below / at / above the
// block size, deep chains, bushy trees and a wide star. Built twice by CMake: plain, and with
// -fsanitize=thread, where a missing __syncthreads between two uses of shared memory is a reported race.
//
//   TRIFORCE_EMU_CASES=N   random cases per kernel (default 60; the ThreadSanitizer build uses fewer)
#include "cuda_emu.h"
// (the emulation must come first: it defines __global__, __shared__, ... for the kernels' header)
#include "triforce/sampling.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "check.h"

using namespace triforce::sampling;

namespace {

std::mt19937_64 rng(20261124);

double uniform01() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }
int64_t randint(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }

// A probability row: random, optionally sparse (exact zeros), optionally corrupted (NaN, negative, > 1).
void prob_row(float* p, int64_t V, bool sparse, bool corrupt) {
  double s = 0.0;
  std::vector<double> w(V);
  for (int64_t y = 0; y < V; ++y) {
    w[y] = (sparse && uniform01() < 0.6) ? 0.0 : -std::log(uniform01() + 1e-300);
    s += w[y];
  }
  for (int64_t y = 0; y < V; ++y) p[y] = s > 0 ? static_cast<float>(w[y] / s) : 0.f;
  if (corrupt) {
    const int64_t k = randint(0, V - 1);
    const double r = uniform01();
    p[k] = r < 0.4 ? NAN : (r < 0.7 ? -0.25f : 1.5f);
  }
}

float coin(bool edges) {
  if (edges) {
    const double r = uniform01();
    if (r < 0.1) return 0.f;
    if (r < 0.2) return 1.f;
    if (r < 0.25) return NAN;
  }
  return static_cast<float>(uniform01());
}

struct Case {
  int64_t B, n, V;
  bool with_q, sparse, corrupt, edges;
};

Case random_case(int64_t max_n) {
  static const int64_t vocab[] = {1, 2, 7, 31, 64, 65, 200, 257, 1000};
  Case c;
  c.B = randint(1, 3);
  c.n = randint(0, max_n);
  c.V = vocab[randint(0, 8)];
  c.with_q = uniform01() < 0.5;
  c.sparse = uniform01() < 0.4;
  c.corrupt = uniform01() < 0.2;
  c.edges = uniform01() < 0.3;
  return c;
}

template <int BLOCK>
void chain_case(const Case& c) {
  const int64_t B = c.B, n = c.n, V = c.V;
  std::vector<int64_t> draft(B * n);
  std::vector<float> q(B * n * V), p(B * (n + 1) * V), u(B * (n + 1) * 2);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i <= n; ++i) prob_row(p.data() + ((b * (n + 1) + i) * V), V, c.sparse, c.corrupt);
    for (int64_t i = 0; i < n; ++i) {
      prob_row(q.data() + ((b * n + i) * V), V, c.sparse, false);
      // mostly the target's likely tokens (long accepted runs), some out of range
      const double r = uniform01();
      draft[b * n + i] = r < 0.05 ? (r < 0.025 ? -1 : V + 3)
                                  : (r < 0.7 ? argmax_row(p.data() + ((b * (n + 1) + i) * V), V, [](float x) { return x; })
                                             : randint(0, V - 1));
    }
  }
  for (auto& x : u) x = coin(c.edges);
  const float* qp = c.with_q ? q.data() : nullptr;
  std::vector<int64_t> tok(B * (n + 1), -7), want(B * (n + 1));
  std::vector<int32_t> num(B, -7);
  tf_emu::launch(B, BLOCK, [&] {
    chain_speculative_sample_kernel<BLOCK, int64_t>(draft.data(), qp, p.data(), u.data(), n, V, tok.data(), num.data());
  });
  for (int64_t b = 0; b < B; ++b) {
    const int32_t k = chain_sample_row(draft.data() + (b * n), qp ? qp + b * n * V : nullptr, p.data() + (b * (n + 1) * V),
                                       u.data() + (b * (n + 1) * 2), n, V, want.data() + (b * (n + 1)));
    EXPECT(num[b] == k);
    for (int64_t i = 0; i <= n; ++i) EXPECT(tok[b * (n + 1) + i] == want[b * (n + 1) + i]);
  }
}

// parents: a random tree in topological order; shape 0 = random, 1 = chain, 2 = star.
void random_parents(int64_t* par, int64_t T, int shape) {
  par[0] = -1;
  for (int64_t t = 1; t < T; ++t) par[t] = shape == 1 ? t - 1 : (shape == 2 ? 0 : randint(0, t - 1));
}

template <int BLOCK>
void tree_case(const Case& c, int shape) {
  const int64_t B = c.B, T = c.n + 1, V = c.V;
  std::vector<int64_t> tt(B * T), par(B * T);
  std::vector<float> q(B * T * V), p(B * T * V), u(B * T * 2);
  for (int64_t b = 0; b < B; ++b) {
    random_parents(par.data() + (b * T), T, shape);
    for (int64_t t = 0; t < T; ++t) {
      prob_row(p.data() + ((b * T + t) * V), V, c.sparse, c.corrupt);
      prob_row(q.data() + ((b * T + t) * V), V, c.sparse, false);
    }
    for (int64_t t = 0; t < T; ++t) {
      const int64_t parent = t ? par[b * T + t] : 0;
      const double r = uniform01();
      tt[b * T + t] = r < 0.05 ? V + 1
                               : (r < 0.5 ? argmax_row(p.data() + ((b * T + parent) * V), V, [](float x) { return x; })
                                          : randint(0, V - 1));
    }
  }
  for (auto& x : u) x = coin(c.edges);
  const float* qp = c.with_q ? q.data() : nullptr;
  std::vector<int32_t> path(B * T, -7), want_path(B * T), num(B, -7);
  std::vector<int64_t> tok(B * T, -7), want(B * T), removed(B * T);
  tf_emu::launch(B, BLOCK, [&] {
    tree_speculative_sample_kernel<BLOCK, int64_t, int64_t>(tt.data(), par.data(), qp, p.data(), u.data(), T, V,
                                                           path.data(), tok.data(), num.data(), removed.data());
  });
  for (int64_t b = 0; b < B; ++b) {
    const int32_t k = tree_sample_row(tt.data() + (b * T), par.data() + (b * T), qp ? qp + b * T * V : nullptr, p.data() + (b * T * V),
                                      u.data() + (b * T * 2), T, V, want_path.data() + (b * T), want.data() + (b * T));
    EXPECT(num[b] == k);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT(tok[b * T + t] == want[b * T + t]);
      EXPECT(path[b * T + t] == want_path[b * T + t]);
    }
  }
}

template <class L>
float to_float(L x) {
  if constexpr (std::is_same_v<L, float>) return x;
  else if constexpr (std::is_same_v<L, __half>) return __half2float(x);
  else return __bfloat162float(x);
}

// Logits of type L with many exact ties (a few distinct values), NaN and -inf.
template <class L>
void logit_row(L* x, int64_t V) {
  for (int64_t y = 0; y < V; ++y) {
    const double r = uniform01();
    const float f = r < 0.05 ? NAN : (r < 0.1 ? -INFINITY : static_cast<float>(randint(-3, 3)));
    if constexpr (std::is_same_v<L, float>) {
      x[y] = f;
    } else if constexpr (std::is_same_v<L, __half>) {
      const _Float16 h = static_cast<_Float16>(f);
      std::memcpy(&x[y].bits, &h, 2);
    } else {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x[y].bits = static_cast<uint16_t>(u >> 16);  // small integers, inf and NaN are exact in bf16
    }
  }
}

template <int BLOCK, class L>
void greedy_case(const Case& c, int shape) {
  const int64_t B = c.B, n = c.n, T = n + 1, V = c.V;
  std::vector<L> x(B * T * V);
  std::vector<int64_t> draft(B * n), tt(B * T), par(B * T), am(B * T);
  for (int64_t b = 0; b < B; ++b) {
    random_parents(par.data() + (b * T), T, shape);
    for (int64_t t = 0; t < T; ++t) {
      logit_row(x.data() + ((b * T + t) * V), V);
      am[b * T + t] = argmax_row(x.data() + ((b * T + t) * V), V, [](L v) { return to_float(v); });
    }
    for (int64_t i = 0; i < n; ++i) draft[b * n + i] = uniform01() < 0.8 ? am[b * T + i] : randint(0, V - 1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t parent = t ? par[b * T + t] : 0;
      tt[b * T + t] = uniform01() < 0.6 ? am[b * T + parent] : randint(0, V - 1);
    }
  }
  std::vector<int64_t> tok(B * T, -7), want(B * T);
  std::vector<int32_t> num(B, -7);
  tf_emu::launch(B, BLOCK, [&] {
    chain_greedy_verify_kernel<BLOCK, int64_t, L>(draft.data(), x.data(), n, V, tok.data(), num.data());
  });
  for (int64_t b = 0; b < B; ++b) {
    EXPECT(num[b] == chain_greedy_row(draft.data() + (b * n), am.data() + (b * T), n, want.data() + (b * T)));
    for (int64_t i = 0; i < T; ++i) EXPECT(tok[b * T + i] == want[b * T + i]);
  }
  std::vector<int32_t> path(B * T, -7), want_path(B * T);
  std::fill(tok.begin(), tok.end(), -7);
  tf_emu::launch(B, BLOCK, [&] {
    tree_greedy_verify_kernel<BLOCK, int64_t, int64_t, L>(tt.data(), par.data(), x.data(), T, V, path.data(),
                                                         tok.data(), num.data());
  });
  for (int64_t b = 0; b < B; ++b) {
    EXPECT(num[b] == tree_greedy_row(tt.data() + (b * T), par.data() + (b * T), am.data() + (b * T), T, want_path.data() + (b * T), want.data() + (b * T)));
    for (int64_t t = 0; t < T; ++t) EXPECT(tok[b * T + t] == want[b * T + t] && path[b * T + t] == want_path[b * T + t]);
  }
}

// A root whose T - 1 deterministic children are all rejected: the residual must exclude every one of
// their tokens, the last one included (the rejected-token list outgrows any small buffer).
template <int BLOCK>
void wide_star() {
  const int64_t T = 700, V = 8;
  std::vector<int64_t> tt(T), par(T, 0);
  par[0] = -1;
  const int64_t zero_p[] = {0, 1, 2, 3, 4, 6};  // tokens the target gives probability 0
  for (int64_t t = 0; t < T; ++t) tt[t] = zero_p[t % 6];
  tt[T - 1] = 5;
  std::vector<float> p(T * V, 0.f), u(T * 2, 0.f);
  for (int64_t t = 0; t < T; ++t) p[t * V + 5] = p[t * V + 7] = 0.5f;
  u[2 * (T - 1)] = 0.9f;
  u[1] = 0.1f;
  std::vector<int32_t> path(T), num(1);
  std::vector<int64_t> tok(T), removed(T);
  tf_emu::launch(1, BLOCK, [&] {
    tree_speculative_sample_kernel<BLOCK, int64_t, int64_t>(tt.data(), par.data(), nullptr, p.data(), u.data(), T, V,
                                                           path.data(), tok.data(), num.data(), removed.data());
  });
  EXPECT(num[0] == 0 && tok[0] == 7 && tok[1] == -1 && path[0] == 0 && path[1] == -1);
}

}  // namespace

int main() {
  const char* env = std::getenv("TRIFORCE_EMU_CASES");
  const int cases = env ? std::atoi(env) : 60;
  for (int i = 0; i < cases; ++i) {
    const Case c = random_case(i % 4 == 0 ? 24 : 6);
    chain_case<64>(c);
    tree_case<64>(c, i % 3);
    greedy_case<64, float>(c, i % 3);
    if (i % 2) greedy_case<32, __half>(c, 0);
    else greedy_case<32, __nv_bfloat16>(c, 2);
    if (i % 10 == 0) {  // the production block size (csrc/cuda/sampling.cu: kBlock)
      chain_case<256>(c);
      tree_case<256>(c, 0);
    }
  }
  wide_star<64>();
  std::printf("%s: %d random cases per kernel, %d failures\n", failures ? "FAIL" : "ok", cases, failures);
  return failures ? 1 : 0;
}
