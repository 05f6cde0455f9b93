#include "gpurun/snapshot/format.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "gpurun/snapshot/xxh64.hpp"

namespace gpurun::snapshot {
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
                 kDataEndAt = 40, kFileAt = 48, kHashAt = 56, kPidAt = 64, kPayloadBytesAt = 80,
                 kPayloadSumAt = 88, kWrittenAt = 96, kHeaderSumAt = 104, kReservedAt = 112;

uint64_t header_checksum(const uint8_t* header) {
  return Xxh64::of(header, kHeaderSumAt);
}

constexpr uint64_t kPage = 4096;

constexpr uint64_t round_up_page(uint64_t n) {
  return (n + kPage - 1) / kPage * kPage;
}

}  // namespace

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t snapshot_hash(std::string_view bytes) {
  return fnv1a64(bytes);
}

uint64_t snapshot_spare_bytes(uint64_t manifest_bytes) {
  return round_up_page((uint64_t{64} << 10) + manifest_bytes);
}

uint64_t snapshot_file_bytes(uint64_t data_end, uint64_t manifest_bytes) {
  return round_up_page(data_end + snapshot_spare_bytes(manifest_bytes));
}

bool snapshot_fits(uint64_t file_bytes, uint64_t data_end, uint64_t manifest_bytes) {
  return data_end <= file_bytes &&
         file_bytes <= round_up_page(data_end + 2 * snapshot_spare_bytes(manifest_bytes));
}

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
  h.data_end = end;
  h.file_bytes = end;
  h.payload_bytes = end - kBytes;
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
  put<uint64_t>(out, kDataEndAt, data_end);
  put<uint64_t>(out, kFileAt, file_bytes);
  put<uint64_t>(out, kHashAt, manifest_hash);
  put<uint64_t>(out, kPidAt, writer_pid);
  put<uint64_t>(out, kSequenceAt, sequence);
  put<uint64_t>(out, kPayloadBytesAt, payload_bytes);
  put<uint64_t>(out, kPayloadSumAt, payload_checksum);
  put<uint64_t>(out, kWrittenAt, written_unix_ns);
  put<uint64_t>(out, kHeaderSumAt, header_checksum(out));
  put<uint64_t>(out, kReservedAt, device_reserved_bytes);
  put<uint64_t>(out, kCommitAt, committed ? kCommitted : 0);
}

namespace {

// payload_digest() of both overloads: `written` null for a complete payload.
uint64_t digest_chunks(const uint8_t* data, uint64_t bytes,
                       const PayloadFrontier* written) noexcept {
  const uint64_t chunks = (bytes + kPayloadChunkBytes - 1) / kPayloadChunkBytes;
  std::vector<uint64_t> digests(chunks);
  std::atomic<uint64_t> next{0};
  const auto work = [&] {
    for (uint64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const uint64_t at = c * kPayloadChunkBytes;
      const uint64_t n = std::min(kPayloadChunkBytes, bytes - at);
      if (written != nullptr && !written->wait_for(at + n)) return;
      digests[c] = Xxh64::of(data + at, n);
    }
  };
  const uint64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t threads = std::min<uint64_t>({16, hw, chunks});
  std::vector<std::thread> pool;
  for (uint64_t i = 1; i < threads; ++i) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads: the calling thread takes the rest
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  Xxh64 top;
  for (uint64_t d : digests) {
    uint8_t le[8];
    for (int b = 0; b < 8; ++b) le[b] = static_cast<uint8_t>(d >> (8 * b));
    top.update(le, sizeof le);
  }
  return top.digest();
}

}  // namespace

uint64_t payload_digest(const uint8_t* data, uint64_t bytes) noexcept {
  return digest_chunks(data, bytes, nullptr);
}

uint64_t payload_digest(const uint8_t* data, uint64_t bytes,
                        const PayloadFrontier& written) noexcept {
  return digest_chunks(data, bytes, &written);
}

void PayloadFrontier::advance(uint64_t bytes) noexcept {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (bytes <= final_) return;
    final_ = bytes;
  }
  cv_.notify_all();
}

void PayloadFrontier::abandon() noexcept {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    abandoned_ = true;
  }
  cv_.notify_all();
}

bool PayloadFrontier::wait_for(uint64_t bytes) const noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return abandoned_ || final_ >= bytes; });
  return !abandoned_;
}

bool SnapshotHeader::peek_sizes(const std::string& path, uint64_t& data_end,
                                uint64_t& manifest_bytes) noexcept {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: no hang
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return ::close(fd), false;
  uint8_t h[kBytes];
  const bool whole = ::pread(fd, h, kBytes, 0) == static_cast<ssize_t>(kBytes);
  ::close(fd);
  if (!whole || std::memcmp(h, kMagic, sizeof kMagic) != 0 ||
      get<uint64_t>(h, kCommitAt) != kCommitted)
    return false;
  data_end = get<uint64_t>(h, kDataEndAt);
  manifest_bytes = get<uint64_t>(h, kManifestAt);
  return true;
}

void SnapshotHeader::check_payload(const uint8_t* data, const std::string& path) const {
  const uint64_t actual = payload_digest(data + kBytes, data_end - kBytes);
  if (actual != payload_checksum) {
    throw StateError(fmt::format(
        "state snapshot '{}': payload checksum 0x{:016x} != header 0x{:016x} (file corrupt: "
        "some of its {} bytes from offset {} changed after snapshot #{} was written by pid "
        "{}); the state in it cannot be resumed from",
        path, actual, payload_checksum, data_end - kBytes, kBytes, sequence, writer_pid));
  }
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
        "state snapshot '{}' has format version {} (header {} bytes); this gpurun reads only "
        "version {} ({} bytes): it was written by {} gpurun and cannot be resumed from here; "
        "resume with the gpurun that paused the job, or start again from a checkpoint",
        path, version, header_size, kVersion, kBytes, version < kVersion ? "an older" : "a newer"));
  }
  SnapshotHeader h;
  h.manifest_bytes = get<uint64_t>(data, kManifestAt);
  h.tensor_count = get<uint64_t>(data, kCountAt);
  h.data_offset = get<uint64_t>(data, kDataAt);
  h.data_end = get<uint64_t>(data, kDataEndAt);
  h.file_bytes = get<uint64_t>(data, kFileAt);
  h.manifest_hash = get<uint64_t>(data, kHashAt);
  h.writer_pid = get<uint64_t>(data, kPidAt);
  h.sequence = get<uint64_t>(data, kSequenceAt);
  h.payload_bytes = get<uint64_t>(data, kPayloadBytesAt);
  h.payload_checksum = get<uint64_t>(data, kPayloadSumAt);
  h.written_unix_ns = get<uint64_t>(data, kWrittenAt);
  h.device_reserved_bytes = get<uint64_t>(data, kReservedAt);
  h.committed = get<uint64_t>(data, kCommitAt) == kCommitted;
  if (!h.committed) {
    if (h.sequence == 0) {
      throw StateError(
          fmt::format("state snapshot '{}' holds no snapshot yet: the file was prepared but no "
                      "state was ever written to it",
                      path));
    }
    throw StateError(fmt::format(
        "state snapshot '{}' is incomplete: its writer (pid {}) stopped before committing "
        "snapshot #{} (interrupted pause); the state in it cannot be resumed from",
        path, h.writer_pid, h.sequence));
  }
  if (const uint64_t actual = header_checksum(data), recorded = get<uint64_t>(data, kHeaderSumAt);
      actual != recorded) {
    throw StateError(fmt::format(
        "state snapshot '{}': header checksum 0x{:016x} != recorded 0x{:016x} (file corrupt: "
        "its first {} bytes changed after they were written)",
        path, actual, recorded, kHeaderSumAt));
  }
  if (h.file_bytes != file_bytes) {
    if (file_bytes < h.file_bytes) {
      throw StateError(fmt::format(
          "state snapshot '{}' is truncated: {} of {} bytes (the file was cut short after "
          "snapshot #{} was written)",
          path, file_bytes, h.file_bytes, h.sequence));
    }
    throw StateError(fmt::format(
        "state snapshot '{}' has {} bytes but its header says {} (trailing bytes: the file was "
        "appended to or replaced while being read)",
        path, file_bytes, h.file_bytes));
  }
  if (h.manifest_bytes > file_bytes - kBytes ||
      h.data_offset != snapshot_align(kBytes + h.manifest_bytes) || h.data_offset > h.data_end ||
      h.data_end > file_bytes || h.payload_bytes != h.data_end - kBytes) {
    throw StateError(fmt::format(
        "state snapshot '{}' is corrupt: manifest of {} bytes, data from {} to {}, payload of {} "
        "bytes do not fit a file of {} bytes",
        path, h.manifest_bytes, h.data_offset, h.data_end, h.payload_bytes, file_bytes));
  }
  const std::string_view manifest(reinterpret_cast<const char*>(data) + kBytes, h.manifest_bytes);
  if (const uint64_t actual = snapshot_hash(manifest); actual != h.manifest_hash) {
    throw StateError(fmt::format(
        "state snapshot '{}' is corrupt: its manifest ({} bytes) hashes to {:016x}, its header "
        "says {:016x}",
        path, h.manifest_bytes, actual, h.manifest_hash));
  }
  return h;
}

}  // namespace gpurun::snapshot
