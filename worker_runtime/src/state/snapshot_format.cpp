#include "state/snapshot_format.hpp"

#include <cstring>

#include "state/state_registry.hpp"

namespace gpurun::rt {
namespace {

template <class T>
void put(uint8_t* out, size_t at, T v) {
  std::memcpy(out + at, &v, sizeof v);
}

template <class T>
T get(const uint8_t* in, size_t at) {
  T v;
  std::memcpy(&v, in + at, sizeof v);
  return v;
}

// Field offsets of the header.
constexpr size_t kVersionAt = 8, kHeaderSizeAt = 12, kManifestAt = 16, kCountAt = 24, kDataAt = 32,
                 kTotalAt = 40;

}  // namespace

SnapshotHeader SnapshotHeader::plan(uint64_t manifest_bytes,
                                    const std::vector<uint64_t>& tensor_bytes,
                                    std::vector<uint64_t>& offsets) {
  SnapshotHeader h;
  h.manifest_bytes = manifest_bytes;
  h.tensor_count = tensor_bytes.size();
  h.data_offset = snapshot_align(kBytes + manifest_bytes);
  offsets.clear();
  uint64_t end = h.data_offset;
  for (uint64_t n : tensor_bytes) {
    const uint64_t at = snapshot_align(end);
    offsets.push_back(at);
    end = at + n;
  }
  h.total_bytes = end;
  return h;
}

void SnapshotHeader::encode(uint8_t* out) const {
  std::memset(out, 0, kBytes);
  std::memcpy(out, kMagic, sizeof kMagic);
  put<uint32_t>(out, kVersionAt, kVersion);
  put<uint32_t>(out, kHeaderSizeAt, static_cast<uint32_t>(kBytes));
  put<uint64_t>(out, kManifestAt, manifest_bytes);
  put<uint64_t>(out, kCountAt, tensor_count);
  put<uint64_t>(out, kDataAt, data_offset);
  put<uint64_t>(out, kTotalAt, total_bytes);
}

SnapshotHeader SnapshotHeader::decode(const uint8_t* data, size_t file_bytes,
                                      const std::string& path) {
  if (file_bytes < kBytes) {
    throw StateError(
        fmt::format("state snapshot '{}' is truncated: {} bytes, shorter than its {}-byte header",
                    path, file_bytes, kBytes));
  }
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    throw StateError(
        fmt::format("'{}' is not a gpurun state snapshot (wrong magic: its first 8 bytes are not "
                    "\"GPURUNSS\")",
                    path));
  }
  const auto version = get<uint32_t>(data, kVersionAt);
  const auto header_size = get<uint32_t>(data, kHeaderSizeAt);
  if (version != kVersion || header_size != kBytes) {
    throw StateError(fmt::format(
        "state snapshot '{}' has format version {} (header {} bytes); this gpurun reads version "
        "{} ({} bytes)",
        path, version, header_size, kVersion, kBytes));
  }
  SnapshotHeader h;
  h.manifest_bytes = get<uint64_t>(data, kManifestAt);
  h.tensor_count = get<uint64_t>(data, kCountAt);
  h.data_offset = get<uint64_t>(data, kDataAt);
  h.total_bytes = get<uint64_t>(data, kTotalAt);
  if (h.total_bytes != file_bytes) {
    throw StateError(fmt::format(
        "state snapshot '{}' has {} bytes but its header says {} ({}): the file was {} or "
        "overwritten while being read",
        path, file_bytes, h.total_bytes,
        file_bytes < h.total_bytes ? "truncated" : "trailing bytes",
        file_bytes < h.total_bytes ? "truncated" : "appended to"));
  }
  if (h.manifest_bytes > file_bytes - kBytes ||
      h.data_offset != snapshot_align(kBytes + h.manifest_bytes) || h.data_offset > file_bytes) {
    throw StateError(fmt::format(
        "state snapshot '{}' is corrupt: manifest of {} bytes and data offset {} do not fit a "
        "file of {} bytes",
        path, h.manifest_bytes, h.data_offset, file_bytes));
  }
  return h;
}

}  // namespace gpurun::rt
