// Torch-free unit test of triforce/slots.h. shift_slots_cpu: every shift of every window of a small buffer, in
// both directions, against a copy through a second buffer; the bytes outside each moved window and the rows
// with shift 0 unchanged. rope_rows_cpu: strided rows against each product and sum rounded by itself (volatile:
// no FMA), nothing written outside its rows. Under scripts/sanitize.sh, AddressSanitizer checks that neither
// leaves its buffers.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "triforce/slots.h"

using namespace triforce;

int main() {
  const int64_t N = 2, B = 3, S = 9, slot = 5;  // bytes per slot: odd, so no alignment is assumed
  std::vector<char> buf(N * B * S * slot), want(buf.size()), before(buf.size());
  for (size_t i = 0; i < buf.size(); ++i) before[i] = static_cast<char>(i * 7 + 3);
  int cases = 0;
  for (int64_t lo = 0; lo <= S; ++lo) {
    for (int64_t hi = lo; hi <= S; ++hi) {
      for (int64_t e = -lo; e <= S - hi; ++e) {
        const int64_t shift[3] = {e, 0, lo - e >= 0 && hi - e <= S ? -e : 0};  // row 1 stays; row 2 the other way
        buf = before;
        want = before;
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t b = 0; b < B; ++b) {
            const int64_t row = (n * B + b) * S * slot;
            for (int64_t s = lo; s < hi; ++s) {
              std::memcpy(&want[row + s * slot], &before[row + (s + shift[b]) * slot], slot);
            }
          }
        }
        shift_slots_cpu(buf.data(), N, B, S, slot, shift, lo, hi);
        EXPECT(buf == want);
        ++cases;
      }
    }
  }
  EXPECT(cases > 100);

  // rope_rows_cpu on views of one buffer [2, G, B, S, H, D]: x = slots [1, 1 + n) of the second half, out =
  // slots [2, 2 + n) of the first
  const int64_t G = 2, Bn = 3, n = 4, S2 = 7, H = 2, D = 6, half = D / 2;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> kv(2 * G * Bn * S2 * H * D), cs(Bn * n * D), sn(Bn * n * D);
  for (auto& v : kv) v = normal(rng);
  for (auto& v : cs) v = normal(rng);
  for (auto& v : sn) v = normal(rng);
  const std::vector<float> kv0 = kv;
  const int64_t st[4] = {Bn * S2 * H * D, S2 * H * D, H * D, D};  // strides of g, b, slot, h
  const int64_t half_buf = G * Bn * S2 * H * D;
  const float* x = kv0.data() + half_buf + 1 * H * D;
  rope_rows_cpu(kv.data() + 2 * H * D, st, kv.data() + half_buf + 1 * H * D, st, cs.data(), sn.data(), G, Bn, n, H,
                D);
  int wrong = 0, outside = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t b = 0; b < Bn; ++b) {
      for (int64_t slot = 0; slot < S2; ++slot) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t at = g * st[0] + b * st[1] + slot * st[2] + h * st[3];
          const bool inside = slot >= 2 && slot < 2 + n;
          for (int64_t d = 0; d < D; ++d) {
            if (!inside) {
              outside += kv[at + d] != kv0[at + d];
              continue;
            }
            const int64_t t = slot - 2, e = d % half;
            const float* xr = x + g * st[0] + b * st[1] + t * st[2] + h * st[3];
            const float* c = cs.data() + (b * n + t) * D;
            const float* s = sn.data() + (b * n + t) * D;
            volatile float p = (d < half ? xr[e] : xr[e + half]) * c[d];
            volatile float q = (d < half ? xr[e + half] : xr[e]) * s[d];
            const float want = d < half ? p - q : p + q;
            wrong += std::memcmp(&kv[at + d], &want, 4) != 0;
          }
        }
      }
    }
  }
  for (int64_t i = half_buf; i < 2 * half_buf; ++i) outside += kv[i] != kv0[i];  // x itself untouched
  EXPECT(wrong == 0);
  EXPECT(outside == 0);
  if (failures == 0) std::printf("test_slots: ok (%d cases)\n", cases);
  return failures == 0 ? 0 : 1;
}
