// gpurun::control::DcgmJobFiles — the per-GPU job files DCGM exporter reads
// (--hpc-job-mapping-dir, DCGM_HPC_JOB_MAPPING_DIR): one file per GPU, named by its NVML
// index, holding the job id, so DCGM exporter's series of the GPUs the job holds carry
// `hpc_job="<run id>"`. gpurun keeps them current as its GPUs join, park, are lent or yielded.
// Reference: docs/metrics.md#dcgm-exporter.
#pragma once

#include <set>
#include <string>

namespace gpurun::control {

/// Not thread-safe (the io thread). Never throws after construction: a file it cannot write
/// or remove is reported through update()'s return value (one sentence), and tried again at
/// the next update.
class DcgmJobFiles {
 public:
  /// Creates `dir` when missing; throws gpurun::Error naming it when it cannot, or when it is
  /// not a directory. `job` is each file's content (one line).
  DcgmJobFiles(std::string dir, std::string job);
  /// Removes every file it wrote that still holds its job id.
  ~DcgmJobFiles();
  DcgmJobFiles(const DcgmJobFiles&) = delete;
  DcgmJobFiles& operator=(const DcgmJobFiles&) = delete;

  /// The GPUs (file names: NVML indices, "3" or "2.0" for a MIG instance) the job holds now:
  /// a file is written (temp file and rename, so a reader never sees half of one) for each one
  /// new since the last call, and the file of each one no longer held is removed unless
  /// another job's id replaced it meanwhile. Returns "" or a sentence naming the failed path.
  std::string update(const std::set<std::string>& gpus);
  const std::set<std::string>& written() const { return written_; }

 private:
  std::string remove(const std::string& gpu);

  std::string dir_;
  std::string job_;
  std::set<std::string> written_;
};

}  // namespace gpurun::control
