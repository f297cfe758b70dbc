// The recurrent layers' scans (ssm.cpp, delta.cpp, selective.cpp): each row's count of real tokens.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace triforce {

// counts (an int32 / int64 [b] CPU tensor, checked; none: every row T) clamped into [0, T], one per row
inline std::vector<int64_t> row_counts(const std::optional<at::Tensor>& counts, int64_t b, int64_t T,
                                       const char* op) {
  std::vector<int64_t> count(static_cast<size_t>(b), T);
  if (!counts.has_value()) return count;
  TORCH_CHECK(counts->device().is_cpu() && counts->dim() == 1 && counts->size(0) == b &&
                  (counts->scalar_type() == at::kLong || counts->scalar_type() == at::kInt),
              op, ": counts must be an int32 / int64 [b] CPU tensor");
  const auto c = counts->to(at::kLong).contiguous();
  const int64_t* cv = c.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) count[static_cast<size_t>(i)] = std::min<int64_t>(std::max<int64_t>(cv[i], 0), T);
  return count;
}

}  // namespace triforce
