// Torch-free unit test of the per-row sampling walks (ctest): exact cases of docs/design.md 3.3.
#include <cmath>
#include <cstdio>
#include <vector>

#include "check.h"
#include "triforce/sampling.h"

using namespace triforce::sampling;


int main() {
  const int64_t V = 4;
  // scalar rules
  EXPECT(clean_uniform(NAN) == 0.f && clean_uniform(1.f) == kMaxUniform && clean_uniform(-1.f) == 0.f);
  EXPECT(clean_prob(NAN) == 0.0 && clean_prob(-0.5f) == 0.0 && clean_prob(INFINITY) == 1.0);
  EXPECT(!accept(0.f, 1.0, 1.0, 0.0));  // zero target probability: never accepted, even with u = 0
  EXPECT(accept(0.999f, 0.0, 1.0, 1e-30));
  EXPECT(uniform_fallback(kMaxUniform, 7) == 6);
  {  // chain, one-hot target = drafts: all accepted + bonus
    std::vector<int64_t> d = {1, 2};
    std::vector<float> p(3 * V, 0.f), u(6, 0.5f);
    p[0 * V + 1] = p[1 * V + 2] = p[2 * V + 3] = 1.f;
    std::vector<int64_t> tok(3);
    EXPECT(chain_sample_row(d.data(), nullptr, p.data(), u.data(), 2, V, tok.data()) == 2);
    EXPECT(tok[0] == 1 && tok[1] == 2 && tok[2] == 3);
    d[1] = 0;  // rejection at position 1 -> the target's token, then -1
    EXPECT(chain_sample_row(d.data(), nullptr, p.data(), u.data(), 2, V, tok.data()) == 1);
    EXPECT(tok[0] == 1 && tok[1] == 2 && tok[2] == -1);
    d[0] = 99;  // out of range: rejected unread
    EXPECT(chain_sample_row(d.data(), nullptr, p.data(), u.data(), 2, V, tok.data()) == 0);
    EXPECT(tok[0] == 1 && tok[1] == -1);
  }
  {  // residual max(p - q, 0) on rejection, not p
    std::vector<int64_t> d = {0};
    std::vector<float> p = {0.5f, 0.5f, 0.f, 0.f, 0.25f, 0.25f, 0.25f, 0.25f}, q = {0.9f, 0.1f, 0.f, 0.f};
    std::vector<float> u = {0.99f, 0.0f, 0.f, 0.f};
    std::vector<int64_t> tok(2);
    EXPECT(chain_sample_row(d.data(), q.data(), p.data(), u.data(), 1, V, tok.data()) == 0 && tok[0] == 1);
    // NaN rows: still a valid id
    std::vector<float> pn(8, NAN);
    EXPECT(chain_sample_row(d.data(), q.data(), pn.data(), u.data(), 1, V, tok.data()) == 0);
    EXPECT(tok[0] >= 0 && tok[0] < V);
  }
  {  // tree: root children 1 (tok 2), 2 (tok 1); node 1 has child 3 (tok 3)
    std::vector<int64_t> tt = {0, 2, 1, 3}, par = {-1, 0, 0, 1};
    std::vector<float> p(4 * V, 0.f), u(8, 0.f);
    p[0 * V + 1] = p[1 * V + 0] = p[2 * V + 0] = p[3 * V + 2] = 1.f;
    std::vector<int32_t> path(4);
    std::vector<int64_t> tok(4);
    EXPECT(tree_sample_row(tt.data(), par.data(), nullptr, p.data(), u.data(), 4, V, path.data(), tok.data()) == 1);
    EXPECT(path[0] == 0 && path[1] == 2 && path[2] == -1 && tok[0] == 1 && tok[1] == 0 && tok[2] == -1);
    std::vector<float> q(4 * V, 0.25f);
    EXPECT(tree_sample_row(tt.data(), par.data(), q.data(), p.data(), u.data(), 4, V, path.data(), tok.data()) == 1);
    EXPECT(path[1] == 2 && tok[0] == 1 && tok[1] == 0);
    // greedy
    std::vector<int64_t> g = {2, 3, 0, 1};
    EXPECT(tree_greedy_row(tt.data(), par.data(), g.data(), 4, path.data(), tok.data()) == 2);
    EXPECT(path[1] == 1 && path[2] == 3 && tok[0] == 2 && tok[1] == 3 && tok[2] == 1 && tok[3] == -1);
  }
  {  // argmax: ties -> lowest, NaN ignored
    std::vector<float> x = {1.f, 3.f, NAN, 3.f};
    EXPECT(argmax_row(x.data(), 4, [](float v) { return v; }) == 1);
  }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
