// gpurun::rt::RuntimeEnv — the worker environment gpurun (or torchrun) sets, parsed once by
// Runtime::from_env() (table: docs/worker-runtime.md#environment). Tests build one by hand
// (detail::make_runtime). Internal header.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpurun/store/client.hpp"

namespace gpurun::rt {

struct RuntimeEnv {
  bool cuda = false;  ///< GPURUN_DEVICE=cuda (else cpu)
  /// GPURUN_SLOT, else LOCAL_RANK: the job slot id (its keys, gpu_id(); node k's local slot i
  /// is k*1000+i).
  int slot = 0;
  /// GPURUN_LOCAL_SLOT, else `slot`: the slot on this node, with cuda the device index
  /// (cuda:<local_slot>).
  int local_slot = 0;
  /// GPURUN_STORE_ADDR/PORT, else MASTER_ADDR/MASTER_PORT (127.0.0.1:29500).
  store::ClientOptions store;
  int64_t restart_count = 0;  ///< TORCHELASTIC_RESTART_COUNT (static jobs' comm prefix)
  /// RANK / WORLD_SIZE: the world of a static (non-elastic) job; an elastic job takes its
  /// world from the generation's decision instead.
  int rank = 0;
  int world = 1;
  /// GPURUN_COMM_TIMEOUT_MS: overrides RuntimeOptions::comm_timeout when set.
  std::optional<std::chrono::milliseconds> comm_timeout;
  /// GPURUN_SNAPSHOT_PATH, else $GPURUN_RUN_DIR/state.snapshot, else
  /// /tmp/gpurun-state-<pid>.snapshot.
  std::string snapshot_path;
  /// GPURUN_SNAPSHOT_FALLBACK_PATH: where the pause snapshot goes when the primary path has
  /// no room (the run directory); empty: none.
  std::string snapshot_fallback_path;
  /// GPURUN_SNAPSHOT_PREPARE: from_env() sets it unless the variable is 0 (default on); a
  /// hand-built environment (tests) leaves it off.
  bool prepare_snapshot = false;
  bool reserve_ahead =
      true;  ///< GPURUN_RESERVE_AHEAD ("0": off): StateRegistry::read_snapshot's reserve_ahead
  std::string trace_dir;  ///< GPURUN_TRACE_DIR (RuntimeOptions::trace_dir wins)
  /// GPURUN_PREEMPT_DIR: gpurun's requests (`stop`) and this process's answer
  /// (`runtime.<pgid>`); empty when gpurun did not set it (docs/cli.md#preemption).
  std::string preempt_dir;
  int preempt_signal = 0;  ///< GPURUN_PREEMPT_SIGNAL: the warning signal's number (0: none)

  /// Reads the variables. Throws gpurun::Error naming the variable when one is malformed.
  static RuntimeEnv from_env();
};

/// Sets each (name, value) in this process's environment (::setenv) where it differs from the
/// value there now: an elastic worker's RANK, WORLD_SIZE, … of the generation it trains in
/// (control::generation_env; docs/cli.md#in-elastic-mode---config). Not thread-safe against
/// getenv on other threads (POSIX): the runtime calls it at a generation's start, on the
/// training thread, between the set-up's collectives and the program's next step. Throws
/// gpurun::Error naming the variable when setenv fails.
void export_env(const std::vector<std::pair<std::string, std::string>>& vars);

}  // namespace gpurun::rt
