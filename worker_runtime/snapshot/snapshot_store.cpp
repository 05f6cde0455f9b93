#include "gpurun/snapshot/snapshot_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpurun/check.hpp"
#include "gpurun/error.hpp"

namespace gpurun::snapshot {

std::vector<std::string> SnapshotPaths::list() const {
  std::vector<std::string> out;
  if (!primary.empty()) out.push_back(primary);
  if (!fallback.empty() && fallback != primary) out.push_back(fallback);
  return out;
}

SnapshotLayout::SnapshotLayout(std::string manifest_text, std::vector<uint64_t> sizes, bool device)
    : manifest(std::move(manifest_text)), tensor_bytes(std::move(sizes)), on_device(device) {
  header = SnapshotHeader::plan(manifest.size(), tensor_bytes, offsets);
  for (uint64_t n : tensor_bytes) total_bytes += n;
}

namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Size of the file `path`, or nullopt when there is none (or it is not a regular file).
std::optional<uint64_t> file_size_at(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

// The first of `paths` that names a regular file (paths.end() when none does).
std::vector<std::string>::const_iterator first_existing(const std::vector<std::string>& paths) {
  return std::find_if(paths.begin(), paths.end(),
                      [](const std::string& p) { return file_size_at(p).has_value(); });
}

// Whether the kept mapping `f` can take a snapshot of `end` bytes with a manifest of
// `manifest_bytes` at `path`: it is still the file there, writable, and it fits.
bool still_fits(const SnapshotFile& f, const std::string& path, uint64_t end,
                uint64_t manifest_bytes) {
  return f.is_at(path) && f.writable() && snapshot_fits(f.size(), end, manifest_bytes);
}

// The existing file at `path` mapped, when it is a writable regular file that fits such a
// snapshot; else nullopt.
std::optional<SnapshotFile> open_if_fits(const std::string& path, uint64_t end,
                                         uint64_t manifest_bytes) {
  const auto size = file_size_at(path);
  if (!size || !snapshot_fits(*size, end, manifest_bytes) || ::access(path.c_str(), W_OK) != 0)
    return std::nullopt;
  return SnapshotFile::open(path);
}

// The kept mapping of `path` if it still fits a snapshot of `layout`, else the existing file
// at `path` if it fits, else a new file replacing it.
SnapshotFile& snapshot_for_write(std::optional<SnapshotFile>& kept, const std::string& path,
                                 const SnapshotLayout& layout, SnapshotStats& st) {
  const uint64_t end = layout.header.data_end, manifest_bytes = layout.manifest.size();
  if (kept && !still_fits(*kept, path, end, manifest_bytes)) kept.reset();
  if (kept) return *kept;
  const auto t0 = SteadyClock::now();
  kept = open_if_fits(path, end, manifest_bytes);
  if (kept) {
    st.mapped = true;
  } else {
    kept = SnapshotFile::create(path, snapshot_file_bytes(end, manifest_bytes), /*replace=*/true);
    st.created = true;
  }
  st.setup_seconds = seconds_since(t0);
  return *kept;
}

// Zeroes the padding between the tensors of `layout` (the manifest's padding: begin()), then
// runs `fill` while the payload's chunks are hashed behind it (payload_digest with a
// frontier that `fill` may advance), and returns the payload checksum.
uint64_t fill_and_hash(SnapshotFile& file, const SnapshotLayout& layout, const PayloadFill& fill,
                       SnapshotStats& st) {
  uint8_t* const base = file.data();
  const uint8_t* const payload = base + SnapshotHeader::kBytes;
  const uint64_t payload_bytes = layout.header.data_end - SnapshotHeader::kBytes;
  uint64_t at = layout.header.data_offset;
  for (size_t i = 0; i < layout.offsets.size(); ++i) {
    std::memset(base + at, 0, layout.offsets[i] - at);
    at = layout.offsets[i] + layout.tensor_bytes[i];
  }
  const auto t_copy = SteadyClock::now();
  PayloadFrontier written;
  written.advance(layout.offsets.empty() ? payload_bytes
                                         : layout.offsets.front() - SnapshotHeader::kBytes);
  uint64_t digest = 0;
  std::optional<std::thread> hasher;
  try {
    hasher.emplace([&] {
      digest = payload_digest(payload, payload_bytes, written);
      st.checksum_seconds = seconds_since(t_copy);
    });
  } catch (const std::system_error&) {  // no thread: hash after the copies, on this one
  }
  try {
    fill(base, layout, written);
  } catch (...) {
    written.abandon();
    if (hasher) hasher->join();
    throw;
  }
  st.copy_seconds = seconds_since(t_copy);
  written.advance(payload_bytes);
  if (hasher) {
    hasher->join();
  } else {
    digest = payload_digest(payload, payload_bytes);
    st.checksum_seconds = seconds_since(t_copy);
  }
  return digest;
}

// One attempt: the snapshot of `layout` into the file at `path`. On any exception the file at
// `path` is removed (its old snapshot was voided by begin(), or it is stale: the state is in
// memory) and `kept` is dropped; the exception propagates.
void write_at(std::optional<SnapshotFile>& kept, const std::string& path,
              const SnapshotLayout& layout, const PayloadFill& fill, SnapshotStats& st) {
  try {
    SnapshotFile& file = snapshot_for_write(kept, path, layout, st);
    if (layout.on_device) st.pin_seconds = file.pin();
    file.begin(layout.header, layout.manifest);
    file.commit(fill_and_hash(file, layout, fill, st));
    st.file_bytes = static_cast<int64_t>(file.size());
    st.pinned = file.pinned();
  } catch (...) {
    kept.reset();
    ::unlink(path.c_str());
    throw;
  }
}

// Removes the file at every path of `paths` but `keep`. A file that cannot be removed is left
// (ENOENT is the normal case); it was voided before (void_others), so no reader takes it.
void remove_others(const std::vector<std::string>& paths, const std::string& keep) noexcept {
  for (const std::string& p : paths)
    if (p != keep) ::unlink(p.c_str());
}

// Voids the snapshot in the file at every path of `paths` but `keep`: clears its commit word
// (pwrite + fdatasync), so that a snapshot from an earlier pause there can never be resumed
// from once this one has begun (the current state is in memory), while the file itself stays
// for reuse (a prepared file fits). A file that cannot be voided is removed.
void void_others(const std::vector<std::string>& paths, const std::string& keep) noexcept {
  for (const std::string& p : paths) {
    if (p == keep) continue;
    // O_NONBLOCK: a FIFO there (nobody reading) fails at once (ENXIO) and is removed, instead
    // of blocking the pause for good; only a regular file is voided.
    const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      if (errno != ENOENT) ::unlink(p.c_str());
      continue;
    }
    struct stat st {};
    const uint64_t zero = 0;
    const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                    static_cast<uint64_t>(st.st_size) >= SnapshotHeader::kBytes &&
                    ::pwrite(fd, &zero, sizeof zero, SnapshotHeader::kCommitAt) == sizeof zero &&
                    ::fdatasync(fd) == 0;
    ::close(fd);
    if (!ok) ::unlink(p.c_str());
  }
}

std::string numbered(const std::vector<std::string>& attempts) {
  std::string out;
  for (size_t i = 0; i < attempts.size(); ++i)
    out += fmt::format("{}({}) {}", i == 0 ? "" : "; ", i + 1, attempts[i]);
  return out;
}

}  // namespace

bool kept_fits(const SnapshotFile& kept, const std::vector<std::string>& paths, uint64_t data_end,
               uint64_t manifest_bytes) {
  return std::any_of(paths.begin(), paths.end(), [&](const std::string& p) {
    return still_fits(kept, p, data_end, manifest_bytes);
  });
}

std::string write_snapshot(std::optional<SnapshotFile>& kept, const SnapshotPaths& paths,
                           const SnapshotLayout& layout, const PayloadFill& fill,
                           SnapshotStats& out) {
  const auto t0 = SteadyClock::now();
  const std::vector<std::string> all = paths.list();
  GPURUN_CHECK(!all.empty(), "write_snapshot() without a path");
  const uint64_t end = layout.header.data_end, manifest_bytes = layout.manifest.size();

  // The kept file first where it still fits (an in-place write needs no new space), then the
  // paths in order.
  std::vector<std::string> order;
  if (kept) {
    for (const std::string& p : all)
      if (still_fits(*kept, p, end, manifest_bytes)) order.push_back(p);
  }
  for (const std::string& p : all)
    if (std::find(order.begin(), order.end(), p) == order.end()) order.push_back(p);

  std::vector<std::string> failed;
  for (const std::string& path : order) {
    SnapshotStats st;
    st.tensor_bytes = static_cast<int64_t>(layout.total_bytes);
    void_others(all, path);  // from here on only `path` can hold a valid snapshot
    try {
      write_at(kept, path, layout, fill, st);
    } catch (const Error& e) {  // this path cannot hold it (full, unwritable, I/O, read-back)
      failed.push_back(fmt::format("'{}': {}", path, e.what()));
      continue;
    }
    remove_others(all, path);
    st.path = path;
    st.failed_attempts = std::move(failed);
    st.total_seconds = seconds_since(t0);
    out = st;
    return path;
  }
  remove_others(all, "");
  throw StateError(fmt::format(
      "cannot write the state snapshot ({} tensor bytes, a file of {} bytes): every path "
      "failed: {}; no snapshot file remains and the training state is unchanged (still in "
      "memory)",
      layout.total_bytes, snapshot_file_bytes(end, manifest_bytes), numbered(failed)));
}

OpenedSnapshot open_snapshot(std::optional<SnapshotFile>& kept, const SnapshotPaths& paths,
                             SnapshotStats& st) {
  const std::vector<std::string> all = paths.list();
  GPURUN_CHECK(!all.empty(), "read_snapshot() without a path");

  // Which path: the one with a file; of several, the newest snapshot.
  std::string path = all.front();
  if (all.size() > 1) {
    std::vector<std::string> present, missing;
    for (const std::string& p : all) {
      struct stat sb {};
      if (::stat(p.c_str(), &sb) == 0) {
        present.push_back(p);
      } else {
        missing.push_back(fmt::format("'{}': {}", p, std::strerror(errno)));
      }
    }
    if (present.empty()) {
      throw StateError(
          fmt::format("no state snapshot to resume from at any path: {}", numbered(missing)));
    }
    path = present.front();
    if (present.size() > 1) {
      uint64_t newest = 0;
      std::vector<std::string> bad;
      for (const std::string& p : present) {
        try {
          const SnapshotFile f = SnapshotFile::open(p);
          const SnapshotHeader h = SnapshotHeader::decode(f.data(), f.size(), p);
          if (h.written_unix_ns > newest) newest = h.written_unix_ns, path = p;
        } catch (const Error& e) {
          bad.push_back(e.what());
        }
      }
      if (!bad.empty()) {
        throw StateError(fmt::format(
            "state snapshot files at {} paths ('{}'), not all of them valid, so which one holds "
            "the paused state is unknown: {}",
            present.size(), fmt::join(present, "', '"), numbered(bad)));
      }
    }
  }

  if (kept && !kept->is_at(path)) kept.reset();
  if (!kept) {
    const auto t_open = SteadyClock::now();
    kept = SnapshotFile::open(path);
    st.mapped = true;
    st.setup_seconds = seconds_since(t_open);
  }
  OpenedSnapshot out;
  out.path = path;
  out.header = SnapshotHeader::decode(kept->data(), kept->size(), path);
  out.manifest.assign(reinterpret_cast<const char*>(kept->data()) + SnapshotHeader::kBytes,
                      out.header.manifest_bytes);
  return out;
}

PreparedSnapshot make_prepared_snapshot(const SnapshotPreparation& plan) {
  const auto t0 = SteadyClock::now();
  PreparedSnapshot out;
  SnapshotStats& st = out.stats;
  const uint64_t end = plan.data_end, manifest_bytes = plan.manifest_bytes;
  std::optional<SnapshotFile> file;
  try {
    const auto existing = first_existing(plan.paths);
    if (existing != plan.paths.end()) {
      // An existing file (maybe a snapshot to resume from): used only if it fits, never replaced.
      file = open_if_fits(*existing, end, manifest_bytes);
      st.mapped = file.has_value();
      out.existing_unfit = !file;
      if (!file)
        out.error =
            fmt::format("the file '{}' exists and does not fit the state (a file of {} bytes)",
                        *existing, plan.file_bytes);
    } else {
      std::vector<std::string> failed;
      for (const std::string& p : plan.paths) {
        try {
          file = SnapshotFile::create(p, plan.file_bytes, /*replace=*/false);  // nullopt: another
          st.created = file.has_value();                                       // rank was first
          if (!file) {
            file = open_if_fits(p, end, manifest_bytes);
            st.mapped = file.has_value();
          }
          break;
        } catch (const Error& e) {
          failed.push_back(fmt::format("'{}': {}", p, e.what()));
        }
      }
      if (failed.size() == plan.paths.size())
        out.error = fmt::format(
            "cannot prepare the state snapshot (a file of {} bytes): every path failed: {}",
            plan.file_bytes, numbered(failed));
      st.failed_attempts = std::move(failed);
    }
  } catch (const Error& e) {
    out.error = e.what();
    file.reset();
  }
  st.setup_seconds = seconds_since(t0);
  if (file) {
    if (plan.on_device) st.pin_seconds = file->pin();
    if (plan.lock_host_memory) {
      const auto t_lock = SteadyClock::now();
      out.lock_error = file->lock_in_memory();
      st.pin_seconds = seconds_since(t_lock);
    }
    st.file_bytes = static_cast<int64_t>(file->size());
    st.pinned = file->pinned();
    st.locked = file->locked();
    st.path = file->path();
    out.file = std::make_shared<SnapshotFile>(std::move(*file));
  }
  st.total_seconds = seconds_since(t0);
  return out;
}

PreparedSnapshot finish_prepared_snapshot(PreparedSnapshot mapped,
                                          const SnapshotPreparation& plan) {
  const auto t0 = SteadyClock::now();
  const auto existing = first_existing(plan.paths);
  if (!mapped.file || existing == plan.paths.end() || !mapped.file->is_at(*existing))
    return make_prepared_snapshot(plan);
  SnapshotStats& st = mapped.stats;
  st.setup_seconds = 0;
  st.pin_seconds = plan.on_device ? mapped.file->pin() : 0;
  st.pinned = mapped.file->pinned();
  st.total_seconds = seconds_since(t0);
  return mapped;
}

DeviceReservePlan plan_device_reserve(uint64_t hint, uint64_t reserved_now, uint64_t free_now,
                                      const DeviceAllocatorEnv& env) {
  DeviceReservePlan p;
  if (hint <= reserved_now) return p;
  const auto says = [](const char* v, std::string_view what) {
    return v != nullptr && std::string_view(v).find(what) != std::string_view::npos;
  };
  // Any value: torch up to 2.6 turns caching off for any value ("0" and "" too), and before
  // ~2.5 raw_alloc cached regardless, so a segment reserved then would stay unusable.
  if (env.no_caching != nullptr) {
    p.note = "PYTORCH_NO_CUDA_MEMORY_CACHING is set: the allocator caches nothing";
    return p;
  }
  for (const char* conf : {env.alloc_conf, env.cuda_alloc_conf}) {
    if (says(conf, "max_split_size_mb")) {
      p.note =
          "the allocator's settings name max_split_size_mb: one large segment would not "
          "be split";
      return p;
    }
    if (says(conf, "roundup_power2_divisions")) {  // rounds the request past the cap
      p.note =
          "the allocator's settings name roundup_power2_divisions: the request would be "
          "rounded up past the free memory's cap";
      return p;
    }
    if (says(conf, "cudaMallocAsync")) {
      p.note = "the allocator's backend is cudaMallocAsync: it keeps no segments to reserve";
      return p;
    }
  }
  const uint64_t missing = hint - reserved_now;
  const uint64_t cap = free_now > kDeviceReserveMargin ? free_now - kDeviceReserveMargin : 0;
  p.bytes = std::min(missing, cap);
  if (p.bytes < kDeviceReserveSmallest) p.bytes = 0;
  if (p.bytes < missing && missing >= kDeviceReserveSmallest)
    p.note = fmt::format("{} bytes free on the device: {} of the {} missing reserved", free_now,
                         p.bytes, missing);
  return p;
}

DeviceAllocatorEnv DeviceAllocatorEnv::from_environment() {
  return {std::getenv("PYTORCH_ALLOC_CONF"), std::getenv("PYTORCH_CUDA_ALLOC_CONF"),
          std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING")};
}

}  // namespace gpurun::snapshot
