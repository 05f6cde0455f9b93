// gpurun::control::Config — the declarative control file (config.toml): what the
// user wants the job to look like. Reference with every key and error text:
// docs/config.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "control/park_mode.hpp"

namespace gpurun::control {

/// Where resize decisions may take effect (`[boundary] every`).
struct BoundarySpec {
  /// true: at the end of every epoch (`every = "epoch"`).
  bool every_epoch = true;
  /// > 0 when `every = N`: every N optimizer steps (every_epoch is then false); 0 otherwise.
  int64_t every_steps = 0;

  friend bool operator==(const BoundarySpec&, const BoundarySpec&) = default;
};

/// One parsed and validated config.toml. Defaults = an empty file.
struct Config {
  /// GPU ids to train on, sorted ascending and unique. nullopt (key absent) = the launch set
  /// (the first --nproc slots); empty (`active_gpus = []`) = pause: every worker parked, state
  /// kept in host memory.
  std::optional<std::vector<int>> active_gpus;
  /// `[park] mode`; default release.
  ParkMode park_mode = ParkMode::kRelease;
  /// `[boundary] every`; default every epoch.
  BoundarySpec boundary;
  /// `[batch] global`: samples per optimizer step summed over the active GPUs, kept constant
  /// across resizes by gradient accumulation. nullopt = not managed.
  std::optional<int64_t> global_batch;
  /// `[boundary] deadline_s` (seconds in the file, default 300): a worker that has not
  /// reported at a boundary by then is declared stalled. Fractions round up to whole ms.
  std::chrono::milliseconds boundary_deadline{std::chrono::seconds(300)};
  /// Non-fatal findings in document order, e.g.
  /// "config.toml:7:1: unknown key 'actve_gpus' (ignored); did you mean 'active_gpus'?".
  std::vector<std::string> warnings;

  friend bool operator==(const Config&, const Config&) = default;
};

/// A config file that cannot take effect. what() lists every problem found, one per line, in
/// document order: "<source>:<line>:<col>: <key>: <problem>; allowed: <values>".
class ConfigError : public gpurun::Error {
 public:
  using Error::Error;
};

/// One line describing the effective settings (for the console and the event log), e.g.
/// "active_gpus=[0, 1] park=release boundary=epoch deadline_s=300 batch.global=none".
std::string describe(const Config& config);

/// Parses and validates config.toml text. Pure: no I/O, any thread.
/// `source` names the file in messages (e.g. its path). `valid_gpu_ids` = the ids a user may
/// name in active_gpus: the GPU ids of this node as gpurun sees them (after
/// CUDA_VISIBLE_DEVICES), or the slot ids 0..n-1 with --device cpu.
/// Throws ConfigError listing every problem (syntax errors: toml++'s message and position).
Config parse_config(std::string_view text, const std::string& source,
                    const std::vector<int>& valid_gpu_ids);

/// Reads `path` (following symlinks; at most kMaxConfigBytes) and parses it as parse_config
/// does, naming the path in messages. Blocks on file I/O. Throws ConfigError, also when the
/// file is missing, unreadable, not a regular file or too large:
/// "<path>: cannot read the config file: <reason>".
Config load_config(const std::filesystem::path& path, const std::vector<int>& valid_gpu_ids);

/// Largest config file load_config reads, in bytes.
inline constexpr std::size_t kMaxConfigBytes = 1 << 20;

}  // namespace gpurun::control
