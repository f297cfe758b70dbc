// Accept / reject sampling (docs/design.md 3.3), torch-free. The scalar rules (cleaning, the accept test,
// the fallbacks) are TF_HD so the CUDA kernels in sampling.cuh use the very same code; the per-row
// walks below are the CPU versions (sequential over V; rows in parallel with OpenMP).
//
// Numerics (identical in every backend, see triforce_kernels/reference/sampling.py): probabilities
// cleaned to [0, 1] (NaN -> 0), uniforms clamped into [0, 1 - 2^-24] (NaN -> 0), accept test and sums
// in double (a float*float product is exact there), inverse CDF = smallest y with cum(y) > u * total.
#pragma once
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define TF_HD __host__ __device__ __forceinline__
#else
#define TF_HD inline
#endif

// The residual max(p - c q, 0) must round the product and the difference separately, like the
// PyTorch reference (no fused multiply-add), or backends could differ in the last bit.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace triforce {
namespace sampling {

constexpr float kMaxUniform = 0.99999994f;  // 1 - 2^-24, the largest float below 1

TF_HD float clean_uniform(float u) { return u >= 0.f ? (u < kMaxUniform ? u : kMaxUniform) : 0.f; }
TF_HD double clean_prob(float p) { return p > 0.f ? static_cast<double>(p < 1.f ? p : 1.f) : 0.0; }
TF_HD double positive(double v) { return v > 0.0 ? v : 0.0; }
// Residual weight of the SpecInfer recursion after rejections: max(p - c q, 0).
TF_HD double residual(double p, double c, double q) { return positive(p - c * q); }
// Accept test u * q(x) * W < r(x): W normalises the residual r (W = 1 and r = p before a rejection).
TF_HD bool accept(float u, double qx, double W, double rx) { return static_cast<double>(u) * qx * W < rx; }
// Last resort for a row whose weights are all zero or NaN: a valid id anyway.
TF_HD int64_t uniform_fallback(float u, int64_t V) {
  int64_t y = static_cast<int64_t>(static_cast<double>(u) * static_cast<double>(V));
  return y < V ? y : V - 1;
}
TF_HD bool in_vocab(int64_t x, int64_t V) { return x >= 0 && x < V; }

// ---------------------------------------------------------------------------------------- CPU

// Inverse CDF over weights w(y) >= 0: smallest y with cum(y) > u * total; -1 when total == 0.
template <class W>
int64_t inverse_cdf(const W& w, int64_t V, float u) {
  double total = 0.0;
  for (int64_t y = 0; y < V; ++y) total += w(y);
  if (!(total > 0.0)) return -1;
  const double thr = static_cast<double>(u) * total;
  double cum = 0.0;
  int64_t last = -1;
  for (int64_t y = 0; y < V; ++y) {
    const double wy = w(y);
    if (wy > 0.0) {
      cum += wy;
      last = y;
      if (cum > thr) return y;
    }
  }
  return last;  // only if rounding left no cumulative value above the threshold
}

// Residual sample with the fallbacks: residual w, else target p, else floor(u * V).
template <class W>
int64_t sample_residual(const W& w, const float* p, int64_t V, float u) {
  int64_t y = inverse_cdf(w, V, u);
  if (y >= 0) return y;
  y = inverse_cdf([&](int64_t i) { return clean_prob(p[i]); }, V, u);
  return y >= 0 ? y : uniform_fallback(u, V);
}

// One row of the chain sampler. draft [n], q [n, V] or null, p [n+1, V], u [n+1, 2];
// writes tokens [n+1] (-1 padded) and returns the number of accepted drafts.
template <class Index>
int32_t chain_sample_row(const Index* draft, const float* q, const float* p, const float* u, int64_t n,
                         int64_t V, int64_t* tokens) {
  for (int64_t i = 0; i <= n; ++i) tokens[i] = -1;
  for (int64_t i = 0; i < n; ++i) {
    const float* pi = p + i * V;
    const float* qi = q ? q + i * V : nullptr;
    const int64_t x = static_cast<int64_t>(draft[i]);
    const bool ok = in_vocab(x, V);
    if (ok && accept(clean_uniform(u[2 * i]), qi ? clean_prob(qi[x]) : 1.0, 1.0, clean_prob(pi[x]))) {
      tokens[i] = x;
      continue;
    }
    const float ur = clean_uniform(u[2 * i + 1]);
    if (qi) {
      tokens[i] = sample_residual([&](int64_t y) { return residual(clean_prob(pi[y]), 1.0, clean_prob(qi[y])); },
                                  pi, V, ur);
    } else {
      tokens[i] = sample_residual([&](int64_t y) { return (ok && y == x) ? 0.0 : clean_prob(pi[y]); }, pi, V, ur);
    }
    return static_cast<int32_t>(i);
  }
  const float* pn = p + n * V;
  tokens[n] = sample_residual([&](int64_t y) { return clean_prob(pn[y]); }, pn, V, clean_uniform(u[2 * n + 1]));
  return static_cast<int32_t>(n);
}

// One row of the tree sampler (SpecInfer recursive rejection; see reference/sampling.py).
// tokens_in [T], parents [T], q [T, V] or null, p [T, V], u [T, 2]; writes path [T], tokens [T].
template <class Index, class Parent>
int32_t tree_sample_row(const Index* tree_tokens, const Parent* parents, const float* q, const float* p,
                        const float* u, int64_t T, int64_t V, int32_t* path, int64_t* tokens) {
  for (int64_t t = 0; t < T; ++t) { path[t] = -1; tokens[t] = -1; }
  std::vector<int64_t> removed;  // deterministic children: tokens rejected at the current node
  int64_t cur = 0, depth = 0;
  path[0] = 0;
  for (;;) {
    const float* pc = p + cur * V;
    const float* qc = q ? q + cur * V : nullptr;
    double c = 0.0, W = 1.0;
    removed.clear();
    auto is_removed = [&](int64_t y) {
      for (int64_t r : removed) if (r == y) return true;
      return false;
    };
    auto w = [&](int64_t y) {
      if (qc) return residual(clean_prob(pc[y]), c, clean_prob(qc[y]));
      return is_removed(y) ? 0.0 : clean_prob(pc[y]);
    };
    int64_t next = -1;
    for (int64_t ch = cur + 1; ch < T; ++ch) {
      if (static_cast<int64_t>(parents[ch]) != cur) continue;
      const int64_t x = static_cast<int64_t>(tree_tokens[ch]);
      const bool ok = in_vocab(x, V);
      if (ok && accept(clean_uniform(u[2 * ch]), qc ? clean_prob(qc[x]) : 1.0, W, w(x))) {
        next = ch;
        break;
      }
      if (qc) {
        c = c + W;
        double s = 0.0;
        for (int64_t y = 0; y < V; ++y) s += w(y);
        W = s;
      } else if (ok) {
        W = positive(W - w(x));
        removed.push_back(x);
      }
    }
    if (next < 0) {
      tokens[depth] = sample_residual(w, pc, V, clean_uniform(u[2 * cur + 1]));
      return static_cast<int32_t>(depth);
    }
    tokens[depth] = static_cast<int64_t>(tree_tokens[next]);
    cur = next;
    path[++depth] = static_cast<int32_t>(cur);
  }
}

// argmax with ties to the lowest index; NaN counts as -inf; all NaN / -inf -> 0.
template <class T, class ToFloat>
int64_t argmax_row(const T* x, int64_t V, const ToFloat& to_f) {
  int64_t best = 0;
  float bv = -__builtin_huge_valf();
  for (int64_t y = 0; y < V; ++y) {
    const float v = to_f(x[y]);
    if (v > bv) { bv = v; best = y; }
  }
  return best;
}

template <class Index>
int32_t chain_greedy_row(const Index* draft, const int64_t* argmax, int64_t n, int64_t* tokens) {
  int64_t i = 0;
  while (i < n && static_cast<int64_t>(draft[i]) == argmax[i]) { tokens[i] = argmax[i]; ++i; }
  tokens[i] = argmax[i];
  for (int64_t j = i + 1; j <= n; ++j) tokens[j] = -1;
  return static_cast<int32_t>(i);
}

template <class Index, class Parent>
int32_t tree_greedy_row(const Index* tree_tokens, const Parent* parents, const int64_t* argmax, int64_t T,
                        int32_t* path, int64_t* tokens) {
  for (int64_t t = 0; t < T; ++t) { path[t] = -1; tokens[t] = -1; }
  int64_t cur = 0, depth = 0;
  path[0] = 0;
  for (;;) {
    const int64_t g = argmax[cur];
    tokens[depth] = g;
    int64_t next = -1;
    for (int64_t ch = cur + 1; ch < T; ++ch)
      if (static_cast<int64_t>(parents[ch]) == cur && static_cast<int64_t>(tree_tokens[ch]) == g) { next = ch; break; }
    if (next < 0) return static_cast<int32_t>(depth);
    cur = next;
    path[++depth] = static_cast<int32_t>(cur);
  }
}

}  // namespace sampling
}  // namespace triforce

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC pop_options
#endif
