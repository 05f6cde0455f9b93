// gpurun::control progress file — the workers' cheap step-progress signal for the supervisor
// (the power-limit profiler measures throughput with it; docs/energy.md#progress).
// One file of kSlotBytes per slot, created by the supervisor (GPURUN_PROGRESS_FILE), mapped
// shared by both sides: a worker's step costs two relaxed atomic stores, no system call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace gpurun::control {

/// What one slot last published.
struct Progress {
  uint64_t steps = 0;    ///< optimizer steps since the start of training (global_step)
  uint64_t time_ns = 0;  ///< Unix time (CLOCK_REALTIME, ns) when that step ended; 0 = none yet
};

/// The worker side. Not thread-safe (one training thread calls step()).
class ProgressWriter {
 public:
  /// Maps $GPURUN_PROGRESS_FILE's line of the node-local slot $GPURUN_LOCAL_SLOT (else
  /// $GPURUN_SLOT). nullptr when the file or both slot variables are unset or
  /// the file cannot be mapped (progress is optional: training never fails for it).
  static std::unique_ptr<ProgressWriter> from_env();
  ProgressWriter(const std::string& path, int slot);  ///< throws gpurun::Error naming the path
  ~ProgressWriter();
  ProgressWriter(const ProgressWriter&) = delete;
  ProgressWriter& operator=(const ProgressWriter&) = delete;

  /// Publishes that optimizer step `global_step` ended now. Never blocks.
  void step(uint64_t global_step);

 private:
  void* map_ = nullptr;
  std::atomic<uint64_t>* line_ = nullptr;
};

/// The supervisor side: creates the file for `slots` slots (zeroed) and reads it from any
/// thread. Removes the file when destroyed.
class ProgressFile {
 public:
  /// Throws gpurun::Error naming the path when it cannot be created or mapped.
  ProgressFile(std::string path, int slots);
  ~ProgressFile();
  ProgressFile(const ProgressFile&) = delete;
  ProgressFile& operator=(const ProgressFile&) = delete;

  const std::string& path() const { return path_; }
  /// What slot `slot` last published (zeros before its first step). Thread-safe.
  Progress read(int slot) const;
  /// Zeroes slot `slot` (a new attempt starts from scratch).
  void reset(int slot);

 private:
  std::string path_;
  int slots_ = 0;
  void* map_ = nullptr;
};

/// Bytes per slot: one cache line, so ranks never share one.
inline constexpr std::size_t kProgressSlotBytes = 64;

}  // namespace gpurun::control
