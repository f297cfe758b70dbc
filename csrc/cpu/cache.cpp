// Launcher of the caches' in-place slot shift (csrc/include/triforce/slots.h; contract in csrc/ops.h).
#include <ATen/ATen.h>

#include "../ops.h"
#include "triforce/slots.h"

void shift_slots_(at::Tensor& buf, const at::Tensor& shift_in, int64_t lo, int64_t hi) {
  TORCH_CHECK(buf.device().is_cpu() && shift_in.device().is_cpu(), "shift_slots_: buf and shift must be CPU tensors");
  TORCH_CHECK(buf.dim() == 4 && buf.is_contiguous(), "shift_slots_: buf must be a contiguous [N, B, S, R] tensor, got ",
              buf.sizes(), buf.is_contiguous() ? "" : " (not contiguous)");
  const int64_t N = buf.size(0), B = buf.size(1), S = buf.size(2);
  TORCH_CHECK(shift_in.scalar_type() == at::kLong && shift_in.dim() == 1 && shift_in.size(0) == B,
              "shift_slots_: shift must be int64 [B] with B = ", B, ", got ", shift_in.scalar_type(), " ",
              shift_in.sizes());
  TORCH_CHECK(0 <= lo && lo <= hi && hi <= S, "shift_slots_: need 0 <= lo <= hi <= S = ", S, ", got lo ", lo, ", hi ",
              hi);
  const auto shift = shift_in.contiguous();
  const int64_t* sh = shift.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lo + sh[b] >= 0 && hi + sh[b] <= S, "shift_slots_: row ", b, "'s shift ", sh[b],
                " reads slots [", lo + sh[b], ", ", hi + sh[b], ") outside [0, ", S, ")");
  }
  if (buf.numel() == 0) return;
  triforce::shift_slots_cpu(static_cast<char*>(buf.data_ptr()), N, B, S, buf.size(3) * buf.element_size(), sh, lo,
                            hi);
}
