// gpurun::snapshot::SnapshotHeader — the on-disk layout of a state snapshot
// (snapshot_store.hpp: written by both runtimes). (worker_runtime/snapshot: no torch, shared by the
// C++ runtime and libgpurun_worker.so.)
//
//   offset 0     header, 128 bytes, native byte order (little-endian on supported hosts):
//                    0 magic "GPURUNSS" (8 bytes)   8 version u32 (=4)   12 header size u32 (=128)
//                   16 manifest_bytes u64          24 tensor_count u64
//                   32 data_offset u64             40 data_end u64 (end of the last tensor)
//                   48 file_bytes u64 (the file's size: data_end plus spare room)
//                   56 manifest_hash u64 (FNV-1a of the manifest bytes)
//                   64 writer_pid u64              72 sequence u64 (1 for the file's first
//                                                     snapshot)
//                   80 payload_bytes u64 (= data_end - 128: manifest, padding and tensors)
//                   88 payload_checksum u64 (of the payload, file bytes [128, data_end):
//                      payload_digest() — XXH64, seed 0, of the XXH64s (seed 0) of its
//                      64 MiB chunks, little-endian u64s in order; xxh64.hpp)
//                   96 written_unix_ns u64 (CLOCK_REALTIME when the writer began it: of two
//                      snapshot files of one run, the newer one wins)
//                  104 header_checksum u64 (XXH64, seed 0, of header bytes [0, 104))
//                  112 device_reserved_bytes u64: a hint, not covered by any checksum — the
//                      bytes the writer's CUDA caching allocator held in its large pool (blocks
//                      over 1 MiB) when it began the snapshot (state, gradients, activations'
//                      cache); 0 when
//                      unknown (CPU state, a writer that does not say, files of before
//                      2026-12-05). A reader may reserve as much ahead of its first step.
//                  120 commit u64: kCommitted once every byte above and below is in place,
//                      0 while a snapshot is being written (or when none was written yet)
//   offset 128   manifest (StateRegistry::manifest(): UTF-8 JSON), manifest_bytes bytes
//   data_offset  tensor bytes in canonical order (StateRegistry::tensors()), each tensor's
//                first byte at a multiple of 64; zero padding between tensors
//   data_end     spare room up to file_bytes (a file is reused by later snapshots whose
//                manifest or tensors are a little larger or smaller: see snapshot_fits); not
//                covered by any checksum
//
// Version history: 2 had no payload_bytes, payload_checksum, written_unix_ns or
// header_checksum (bytes 80..119 zero); 3's payload_checksum was one XXH64 stream over the
// payload (one core: ~0.1 s per GB, 0.75 s for ViT-H's state); 4 hashes 64 MiB chunks in
// parallel. Another version is refused (decode: "format version 3").
//
// Writing in place (SnapshotFile): the commit word is cleared first, then header, manifest and
// tensors are written, then the payload checksum, then the commit word is set. A writer that
// dies in between leaves a file that decode() refuses ("incomplete"), never a mix of two
// snapshots taken for one; a byte changed after the commit (a bad disk, a stray write) makes
// check_payload() refuse it ("payload checksum ... (file corrupt)").
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace gpurun::snapshot {

struct SnapshotHeader {
  static constexpr char kMagic[8] = {'G', 'P', 'U', 'R', 'U', 'N', 'S', 'S'};
  static constexpr uint32_t kVersion = 4;
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
  uint64_t payload_bytes = 0;     ///< data_end - kBytes
  uint64_t payload_checksum = 0;  ///< payload_digest() of file bytes [kBytes, data_end)
  uint64_t written_unix_ns = 0;   ///< CLOCK_REALTIME (ns since 1970) when writing began
  /// The writer's device memory held by its caching allocator (bytes; 0: unknown). A hint for
  /// the reader (StateRegistry::read_snapshot reserves as much ahead of the first step),
  /// outside the header checksum: never trusted beyond the free memory of the reader's device.
  uint64_t device_reserved_bytes = 0;
  bool committed = false;

  /// The header of a snapshot with this manifest size and these tensor sizes (bytes, canonical
  /// order); fills `offsets` with each tensor's file offset. file_bytes = data_end (the caller
  /// sets the real file size, which may be larger).
  static SnapshotHeader plan(uint64_t manifest_bytes, const std::vector<uint64_t>& tensor_bytes,
                             std::vector<uint64_t>& offsets);

  /// Writes the 128 header bytes to `out`, commit word included (kCommitted if `committed`),
  /// header_checksum computed here over bytes [0, 104). payload_bytes is written as given.
  void encode(uint8_t* out) const;

  /// Reads and validates the header of the file `path` of `file_bytes` bytes mapped at
  /// `data`: size, magic, version (another version is refused, naming both), header size,
  /// then the commit word (a snapshot whose writer stopped before committing it is refused,
  /// naming the writer's pid), the header checksum, file_bytes equal to the file's size
  /// ("truncated: 1048576 of 2097152 bytes", or trailing bytes), manifest and data within the
  /// file, data_offset aligned right after the manifest, payload_bytes = data_end - 128, and
  /// the manifest's hash. Reads only the header and the manifest (not the tensors: see
  /// check_payload). Throws StateError naming the path and what is wrong.
  static SnapshotHeader decode(const uint8_t* data, size_t file_bytes, const std::string& path);

  /// Reads the 128 header bytes of the file `path` (no mapping) and, when the commit word
  /// says it holds a snapshot, its data_end and manifest_bytes (the sizes a mapping must fit;
  /// nothing else is checked: read_snapshot decodes and verifies). False for no file, a short
  /// one, an I/O error or no committed snapshot. Never throws.
  static bool peek_sizes(const std::string& path, uint64_t& data_end,
                         uint64_t& manifest_bytes) noexcept;

  /// Verifies the payload of the decoded snapshot mapped at `data` (the file `path`):
  /// payload_digest() of bytes [kBytes, data_end) against payload_checksum. Blocks for one
  /// read pass over the payload (about 0.1 s per GB per core, on up to 16 cores). Throws StateError
  /// "state snapshot '<path>': payload checksum 0x... != header 0x... (file corrupt)" on a
  /// mismatch.
  void check_payload(const uint8_t* data, const std::string& path) const;
};

/// Bytes per chunk of payload_digest().
inline constexpr uint64_t kPayloadChunkBytes = uint64_t{64} << 20;

/// The payload checksum (format 4): `bytes` bytes at `data` cut into kPayloadChunkBytes chunks
/// (the last one shorter; none for 0 bytes), each hashed with XXH64 (seed 0) — on up to
/// min(16, hardware threads, chunks) threads — then XXH64 (seed 0) of the chunk digests as
/// little-endian u64s in chunk order. A tree of depth two, so that the chunks hash in
/// parallel: a 7.5 GB state in ~0.1 s on 8 cores instead of ~0.6 s on one. Blocks; never
/// throws (a thread that cannot be started: its chunks are hashed on the calling thread).
uint64_t payload_digest(const uint8_t* data, uint64_t bytes) noexcept;

/// How much of a payload that another thread writes in order is final, for the
/// payload_digest() overload below: the snapshot write hashes each 64 MiB chunk as soon as the
/// device copies have landed past it, instead of one pass after all of them. Thread-safe.
class PayloadFrontier {
 public:
  /// Bytes [0, `bytes`) of the payload are final. A value below an earlier one is ignored.
  void advance(uint64_t bytes) noexcept;
  /// The writer failed: every wait returns false at once (the digest is then meaningless).
  void abandon() noexcept;
  /// Blocks until advance(>= `bytes`) (true) or abandon() (false).
  bool wait_for(uint64_t bytes) const noexcept;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  uint64_t final_ = 0;
  bool abandoned_ = false;
};

/// payload_digest() of a payload still being written: each chunk is hashed once `written`
/// has advanced past its end (chunks are taken in order, so the hash threads follow the
/// writer). Same value as the overload above once the payload is complete. Blocks until every
/// chunk is hashed or `written` is abandoned (then returns an unspecified value). Never throws.
uint64_t payload_digest(const uint8_t* data, uint64_t bytes,
                        const PayloadFrontier& written) noexcept;

/// `n` rounded up to a multiple of SnapshotHeader::kAlignment.
constexpr uint64_t snapshot_align(uint64_t n) {
  return (n + SnapshotHeader::kAlignment - 1) / SnapshotHeader::kAlignment *
         SnapshotHeader::kAlignment;
}

/// FNV-1a, 64-bit (Fowler, Noll, Vo; offset basis 0xcbf29ce484222325, prime 0x100000001b3)
/// of `bytes`. Used for metadata (dtype names, manifests), not for tensor data.
uint64_t fnv1a64(std::string_view bytes);

/// fnv1a64 of `bytes`: the manifest hash of the header.
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

}  // namespace gpurun::snapshot
