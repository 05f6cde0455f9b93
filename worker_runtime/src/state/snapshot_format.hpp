// gpurun::rt::SnapshotHeader — the on-disk layout of a state snapshot
// (StateRegistry::write_snapshot / read_snapshot). Internal header.
//
//   offset 0     header, 128 bytes, native byte order (little-endian on supported hosts):
//                    0 magic "GPURUNSS" (8 bytes)   8 version u32 (=2)   12 header size u32 (=128)
//                   16 manifest_bytes u64          24 tensor_count u64
//                   32 data_offset u64             40 data_end u64 (end of the last tensor)
//                   48 file_bytes u64 (the file's size: data_end plus spare room)
//                   56 manifest_hash u64 (FNV-1a of the manifest bytes)
//                   64 writer_pid u64              72 sequence u64 (1 for the file's first
//                   snapshot) 80 zero (40 bytes)
//                  120 commit u64: kCommitted once every byte above and below is in place,
//                      0 while a snapshot is being written (or when none was written yet)
//   offset 128   manifest (StateRegistry::manifest(): UTF-8 JSON), manifest_bytes bytes
//   data_offset  tensor bytes in canonical order (StateRegistry::tensors()), each tensor's
//                first byte at a multiple of 64; zero padding between tensors
//   data_end     spare room up to file_bytes (a file is reused by later snapshots whose
//                manifest or tensors are a little larger or smaller: see snapshot_fits)
//
// Writing in place (SnapshotFile): the commit word is cleared first, then header, manifest and
// tensors are written, then the commit word is set. A writer that dies in between leaves a file
// that decode() refuses ("incomplete"), never a mix of two snapshots taken for one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpurun::rt {

struct SnapshotHeader {
  static constexpr char kMagic[8] = {'G', 'P', 'U', 'R', 'U', 'N', 'S', 'S'};
  static constexpr uint32_t kVersion = 2;
  static constexpr size_t kBytes = 128;      ///< header size
  static constexpr size_t kAlignment = 64;   ///< of the data section and of every tensor
  static constexpr size_t kSequenceAt = 72;  ///< offset of the sequence number
  static constexpr size_t kCommitAt = 120;   ///< offset of the commit word
  static constexpr uint64_t kCommitted = 0x4d4d4f434e55524eULL;  ///< "NRUNCOMM", little-endian

  uint64_t manifest_bytes = 0;
  uint64_t tensor_count = 0;
  uint64_t data_offset = 0;
  uint64_t data_end = 0;
  uint64_t file_bytes = 0;
  uint64_t manifest_hash = 0;
  uint64_t writer_pid = 0;
  uint64_t sequence = 0;
  bool committed = false;

  /// The header of a snapshot with this manifest size and these tensor sizes (bytes, canonical
  /// order); fills `offsets` with each tensor's file offset. file_bytes = data_end (the caller
  /// sets the real file size, which may be larger).
  static SnapshotHeader plan(uint64_t manifest_bytes, const std::vector<uint64_t>& tensor_bytes,
                             std::vector<uint64_t>& offsets);

  /// Writes the 128 header bytes to `out`, commit word included (kCommitted if `committed`).
  void encode(uint8_t* out) const;

  /// Reads and validates the header of the file `path` of `file_bytes` bytes mapped at
  /// `data`: size, magic, version, header size, then the commit word (a snapshot whose writer
  /// stopped before committing it is refused, naming the writer's pid), file_bytes equal to
  /// the file's size (truncated or appended to otherwise), manifest and data within the file,
  /// data_offset aligned right after the manifest, and the manifest's hash. Throws StateError
  /// naming the path and what is wrong.
  static SnapshotHeader decode(const uint8_t* data, size_t file_bytes, const std::string& path);
};

/// `n` rounded up to a multiple of SnapshotHeader::kAlignment.
constexpr uint64_t snapshot_align(uint64_t n) {
  return (n + SnapshotHeader::kAlignment - 1) / SnapshotHeader::kAlignment *
         SnapshotHeader::kAlignment;
}

/// FNV-1a (64-bit) of `bytes`: the manifest hash of the header.
uint64_t snapshot_hash(std::string_view bytes);

/// Spare room given to a new snapshot file whose manifest has `manifest_bytes` bytes: room for
/// later manifests that grow (step counts, scalars, extension bytes), 64 KiB plus the
/// manifest's own size, in whole 4 KiB pages.
uint64_t snapshot_spare_bytes(uint64_t manifest_bytes);

/// Size of a new snapshot file for a snapshot ending at `data_end` with a manifest of
/// `manifest_bytes` bytes: data_end plus the spare room, in whole 4 KiB pages.
uint64_t snapshot_file_bytes(uint64_t data_end, uint64_t manifest_bytes);

/// Whether an existing file of `file_bytes` is reused for a snapshot ending at `data_end`
/// (else a new file replaces it): it must hold the snapshot and waste at most twice the spare
/// room a new file would get (so a much smaller state does not keep a large file pinned).
bool snapshot_fits(uint64_t file_bytes, uint64_t data_end, uint64_t manifest_bytes);

}  // namespace gpurun::rt
