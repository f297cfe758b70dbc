// Launchers of the StreamingLLM cache's slot shift and sink rotation (csrc/include/triforce/slots.h; contracts in
// csrc/ops.h).
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

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

void rope_into_(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(out.device().is_cpu() && x.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(),
              "rope_into_: CPU tensors expected");
  TORCH_CHECK(x.dim() == 5 && out.sizes() == x.sizes(),
              "rope_into_: x and out must be [G, B, n, H, D] of one shape, got ", x.sizes(), " and ", out.sizes());
  const int64_t G = x.size(0), B = x.size(1), n = x.size(2), H = x.size(3), D = x.size(4);
  TORCH_CHECK(D % 2 == 0, "rope_into_: D must be even, got ", D);
  TORCH_CHECK(out.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "rope_into_: out, x, cos and sin must be float32");
  const std::vector<int64_t> table{B, n, 1, D};
  TORCH_CHECK(cos.sizes() == at::IntArrayRef(table) && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                  sin.is_contiguous(),
              "rope_into_: cos and sin must be contiguous [B, n, 1, D] = ", at::IntArrayRef(table), ", got ",
              cos.sizes(), " and ", sin.sizes());
  TORCH_CHECK(D == 0 || (x.stride(4) == 1 && out.stride(4) == 1),
              "rope_into_: x and out need a contiguous last dimension");
  if (x.numel() == 0) return;
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, "rope_into_: out has elements that share memory");
  const auto overlap = at::get_overlap_status(out, x);  // (TooHard for strided views of one buffer: not checked)
  TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
              "rope_into_: out must not overlap x");
  const int64_t so[4] = {out.stride(0), out.stride(1), out.stride(2), out.stride(3)};
  const int64_t sx[4] = {x.stride(0), x.stride(1), x.stride(2), x.stride(3)};
  triforce::rope_rows_cpu(out.data_ptr<float>(), so, x.const_data_ptr<float>(), sx, cos.const_data_ptr<float>(),
                          sin.const_data_ptr<float>(), G, B, n, H, D);
}
