#include "state/pin_chunks.hpp"

#include <algorithm>
#include <cstdint>

#include "gpurun/check.hpp"

namespace gpurun::rt {

std::vector<std::vector<compat::HostCopy>> split_at_chunks(
    const std::vector<compat::HostCopy>& copies, const uint8_t* base, size_t chunk) {
  std::vector<std::vector<compat::HostCopy>> groups;
  if (chunk == 0) {
    if (!copies.empty()) groups.push_back(copies);
    return groups;
  }
  size_t group_of_last = SIZE_MAX, end_of_last = 0;
  const auto add = [&](compat::HostCopy c, size_t begin) {
    const size_t k = begin / chunk;
    if (k != group_of_last) {
      groups.emplace_back();
      group_of_last = k;
    }
    groups.back().push_back(std::move(c));
  };
  for (const compat::HostCopy& c : copies) {
    GPURUN_CHECK(c.tensor.is_contiguous(), "snapshot copy of a non-contiguous {}-dim tensor",
                 c.tensor.dim());
    const size_t begin = static_cast<size_t>(c.host - base);
    const size_t bytes = c.tensor.nbytes();
    GPURUN_CHECK(begin >= end_of_last, "snapshot copies out of address order (byte {} after {})",
                 begin, end_of_last);
    end_of_last = begin + bytes;
    if (bytes == 0) continue;
    if (begin / chunk == (begin + bytes - 1) / chunk) {
      add(c, begin);
      continue;
    }
    const at::Tensor flat = c.tensor.view(-1).view(at::kByte);
    for (size_t at = begin; at < begin + bytes;) {
      const size_t n = std::min(begin + bytes, (at / chunk + 1) * chunk) - at;
      add({flat.narrow(0, static_cast<int64_t>(at - begin), static_cast<int64_t>(n)),
           c.host + (at - begin)},
          at);
      at += n;
    }
  }
  return groups;
}

size_t group_end(const std::vector<compat::HostCopy>& group, const uint8_t* base) {
  if (group.empty()) return 0;
  const compat::HostCopy& last = group.back();
  return static_cast<size_t>(last.host - base) + last.tensor.nbytes();
}

}  // namespace gpurun::rt
