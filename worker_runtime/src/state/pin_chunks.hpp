// Copies between tensors and one page-locked mapping that is locked in chunks
// (snapshot::SnapshotFile::begin_chunked_pin): cut so that none spans two registrations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compat/torch_compat.hpp"

namespace gpurun::rt {

/// `copies` (host ranges inside one mapping that starts at `base`, in increasing address
/// order) cut at every multiple of `chunk` bytes from `base` and grouped by the chunk their
/// host bytes lie in: group k covers [k·chunk, (k+1)·chunk), empty groups left out, order
/// kept. A cut copy is a narrow() of its tensor's flat byte view (the tensor is contiguous), so
/// the groups move the same bytes as `copies`. chunk 0: one group, uncut. Never copies data.
/// Throws gpurun::InvariantError for a non-contiguous tensor or copies out of address order.
std::vector<std::vector<compat::HostCopy>> split_at_chunks(
    const std::vector<compat::HostCopy>& copies, const uint8_t* base, size_t chunk);

/// The end (bytes from `base`) of the host range of the last copy of `group`.
size_t group_end(const std::vector<compat::HostCopy>& group, const uint8_t* base);

}  // namespace gpurun::rt
