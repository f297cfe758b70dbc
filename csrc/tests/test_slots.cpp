// Torch-free unit test of shift_slots_cpu (triforce/slots.h): every shift of every window of a small buffer, in
// both directions, against a copy through a second buffer; the bytes outside each moved window and the rows
// with shift 0 unchanged. Under scripts/sanitize.sh, AddressSanitizer checks that no memmove leaves the buffer.
#include <cstdint>
#include <cstdio>
#include <cstring>
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
  if (failures == 0) std::printf("test_slots: ok (%d cases)\n", cases);
  return failures == 0 ? 0 : 1;
}
