#include "gpurun/snapshot/snapshot_file.hpp"

#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "gpurun/error.hpp"

namespace gpurun::snapshot {
namespace {

// The commit word of the mapped header, stored with release order: every byte written before
// (header, manifest; the tensors' device copies are complete before commit() runs) is visible
// to any process that sees the word.
void store_commit(uint8_t* header, uint64_t value) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(header + SnapshotHeader::kCommitAt))
      .store(value, std::memory_order_release);
}

uint64_t sequence_of(const uint8_t* data, size_t bytes) {
  if (bytes < SnapshotHeader::kBytes ||
      std::memcmp(data, SnapshotHeader::kMagic, sizeof SnapshotHeader::kMagic) != 0)
    return 0;
  uint64_t sequence = 0;
  std::memcpy(&sequence, data + SnapshotHeader::kSequenceAt, sizeof sequence);
  return sequence;
}

HostPinner& host_pinner() {
  static HostPinner pinner;
  return pinner;
}

}  // namespace

void set_host_pinner(HostPinner pinner) {
  host_pinner() = std::move(pinner);
}

std::optional<SnapshotFile> SnapshotFile::create(const std::string& path, uint64_t file_bytes,
                                                 bool replace) {
  static std::atomic<uint64_t> counter{0};
  const std::string temp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  MappedFile file = MappedFile::create(temp, file_bytes);
  try {
    SnapshotHeader empty;  // no snapshot yet: sequence 0, not committed
    empty.file_bytes = file_bytes;
    empty.encode(file.data());
    if (!file.move_to(path, replace)) {
      ::unlink(temp.c_str());
      return std::nullopt;
    }
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  return SnapshotFile(std::move(file));
}

SnapshotFile SnapshotFile::open(const std::string& path) {
  if (::access(path.c_str(), W_OK) == 0) return SnapshotFile(MappedFile::open_read_write(path));
  return SnapshotFile(MappedFile::open_read_only(path));
}

SnapshotFile& SnapshotFile::operator=(SnapshotFile&& other) noexcept {
  if (this != &other) {
    pin_ = std::move(other.pin_);  // unpins ours while still mapped
    file_ = std::move(other.file_);
    locked_ = std::exchange(other.locked_, false);
  }
  return *this;
}

double SnapshotFile::unpin() noexcept {
  if (!pinned()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  pin_.reset();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double SnapshotFile::pin() {
  if (pinned() || data() == nullptr) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (host_pinner()) pin_ = host_pinner()(data(), size(), /*read_only=*/!writable());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string SnapshotFile::lock_in_memory() {
  if (locked_ || data() == nullptr) return {};
  if (::mlock(data(), size()) != 0)
    return fmt::format("mlock of {} bytes of '{}' failed: {}", size(), path(),
                       std::strerror(errno));
  locked_ = true;
  return {};
}

void SnapshotFile::begin(SnapshotHeader header, std::string_view manifest) {
  GPURUN_CHECK(writable(), "writing a snapshot into the read-only mapping of '{}'", file_.path());
  GPURUN_CHECK(
      header.data_end <= size() && header.data_offset >= SnapshotHeader::kBytes + manifest.size(),
      "snapshot of {} bytes in '{}' of {} bytes", header.data_end, file_.path(), size());
  uint8_t* d = data();
  header.sequence = sequence_of(d, size()) + 1;
  store_commit(d, 0);
  file_.sync_range(0, SnapshotHeader::kBytes);  // the old snapshot is void before it changes
  header.file_bytes = size();
  header.manifest_hash = snapshot_hash(manifest);
  header.writer_pid = static_cast<uint64_t>(::getpid());
  header.payload_bytes = header.data_end - SnapshotHeader::kBytes;
  header.payload_checksum = 0;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  header.written_unix_ns =
      static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(now.tv_nsec);
  header.committed = false;
  header.encode(d);
  std::memcpy(d + SnapshotHeader::kBytes, manifest.data(), manifest.size());
  const size_t manifest_end = SnapshotHeader::kBytes + manifest.size();
  std::memset(d + manifest_end, 0, header.data_offset - manifest_end);
  pending_ = header;
}

SnapshotHeader SnapshotFile::commit(uint64_t payload_checksum) {
  GPURUN_CHECK(pending_.sequence != 0, "commit() of '{}' without begin()", file_.path());
  SnapshotHeader header = std::exchange(pending_, SnapshotHeader{});
  header.payload_checksum = payload_checksum;
  header.committed = false;  // the commit word is set last, below
  header.encode(data());
  file_.sync();
  store_commit(data(), SnapshotHeader::kCommitted);
  file_.sync_range(0, SnapshotHeader::kBytes);
  // Read back: the file at the path is this one, and its header is a committed snapshot.
  if (!file_.is_at(file_.path())) {
    throw StateError(fmt::format(
        "state snapshot '{}': the file was removed, replaced or resized while snapshot #{} was "
        "being written",
        file_.path(), header.sequence));
  }
  const SnapshotHeader back = SnapshotHeader::decode(data(), size(), file_.path());
  if (back.payload_checksum != payload_checksum || back.sequence != header.sequence) {
    throw StateError(fmt::format(
        "state snapshot '{}': read back snapshot #{} with payload checksum 0x{:016x}, wrote "
        "snapshot #{} with 0x{:016x} (another writer?)",
        file_.path(), back.sequence, back.payload_checksum, header.sequence, payload_checksum));
  }
  return back;
}

}  // namespace gpurun::snapshot
