// gpurun::rt::SnapshotHeader — the on-disk layout of a state snapshot
// (StateRegistry::write_snapshot / read_snapshot). Internal header.
//
//   offset 0     header, 64 bytes, native byte order (little-endian on supported hosts):
//                  magic "GPURUNSS" (8 bytes), version u32 (=1), header size u32 (=64),
//                  manifest_bytes u64, tensor_count u64, data_offset u64, total_bytes u64,
//                  16 bytes zero
//   offset 64    manifest (StateRegistry::manifest(): UTF-8 JSON), manifest_bytes bytes
//   data_offset  tensor bytes in canonical order (StateRegistry::tensors()), each tensor's
//                first byte at a multiple of 64; zero padding between tensors;
//                total_bytes = the end of the last tensor (or data_offset if none) = file size
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpurun::rt {

struct SnapshotHeader {
  static constexpr char kMagic[8] = {'G', 'P', 'U', 'R', 'U', 'N', 'S', 'S'};
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kBytes = 64;      ///< header size
  static constexpr size_t kAlignment = 64;  ///< of the data section and of every tensor

  uint64_t manifest_bytes = 0;
  uint64_t tensor_count = 0;
  uint64_t data_offset = 0;
  uint64_t total_bytes = 0;

  /// The header of a snapshot with this manifest size and these tensor sizes (bytes, canonical
  /// order); fills `offsets` with each tensor's file offset.
  static SnapshotHeader plan(uint64_t manifest_bytes, const std::vector<uint64_t>& tensor_bytes,
                             std::vector<uint64_t>& offsets);

  /// Writes the 64 header bytes to `out`.
  void encode(uint8_t* out) const;

  /// Reads and validates the header of the file `path` of `file_bytes` bytes mapped at
  /// `data`: magic, version, header size, manifest within the file, data_offset aligned
  /// and after the manifest, total_bytes == file_bytes. Throws StateError naming the path and
  /// what is wrong (a truncated file says how many bytes it has and how many it needs).
  static SnapshotHeader decode(const uint8_t* data, size_t file_bytes, const std::string& path);
};

/// `n` rounded up to a multiple of SnapshotHeader::kAlignment.
constexpr uint64_t snapshot_align(uint64_t n) {
  return (n + SnapshotHeader::kAlignment - 1) / SnapshotHeader::kAlignment *
         SnapshotHeader::kAlignment;
}

}  // namespace gpurun::rt
