// gpurun::control::ResizeTimeline — where a resize's time goes: gpurun's own moments (config
// seen, decision written, joiner spawned) joined with every participant's phase timestamps
// (the `gpurun/gen/<G>/timing/<gpu>` records the worker runtime writes when its part is done)
// into one `resize` event per generation. Reference: docs/control-protocol.md#resize-timings.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpurun/control/decision.hpp"
#include "gpurun/json_writer.hpp"

namespace gpurun::control {

/// Milliseconds on the host's monotonic clock (std::chrono::steady_clock, CLOCK_MONOTONIC on
/// Linux: one clock for every process of the host, never stepped). The clock base of the
/// workers' records too; another node's records are shifted by its clock offset (on_record).
double monotonic_ms();

/// Not thread-safe: the supervisor's io thread.
class ResizeTimeline {
 public:
  using Clock = std::function<double()>;
  explicit ResizeTimeline(Clock now = monotonic_ms) : now_(std::move(now)) {}

  /// A config was loaded (it may change the active set): the resize it causes, if any, is
  /// timed from here ("detect"). A later config before that resize's decision moves it.
  void config_seen();
  /// gpurun wrote decision `d`: a `snapshot` decision (a pause's first phase) is noted for the
  /// pause that follows; a `resize` starts the timeline of generation d.generation (a second
  /// write for the same generation, the start record after the boundary decision, is ignored).
  /// Other kinds are ignored. A generation still open (records missing) is closed first.
  void decision_written(const Decision& d);
  /// Process `pid` was spawned for `gpu`: a joiner of the open generation, or (a warm
  /// joiner, spawned when the config changed) of the next resize that names the slot.
  void spawned(int gpu, int pid);
  /// A participant's record: the value of gpurun/gen/<generation>/timing/<gpu>. A bad record
  /// or one of no open generation is dropped; returns false then (the caller warns).
  /// `clock_offset_ms` is added to its marks: another node's process reads its own host's
  /// monotonic clock (NodeHub::clock_offset_ms); 0 on this host.
  bool on_record(int64_t generation, int gpu, std::string_view json, double clock_offset_ms = 0);
  /// Process `pid` of `gpu` ended: a participant that has not sent its record will not
  /// (unless another process was spawned for the slot since: that one is awaited).
  void slot_gone(int gpu, int pid);
  /// Closes every open generation (missing records listed).
  void flush();

  /// The `resize` events completed since the last call, in order (fields only).
  std::vector<JsonObject> take_ready();
  /// The last `resize` event's fields as a JSON object text; empty before the first.
  const std::string& last() const { return last_; }

  /// One line per event for `gpurun status`: "generation 3 grow [0, 1] -> [0, 1, 2]: ..."
  /// and one per rank. `event` is last()'s text (or status.json's `last_resize`).
  static std::vector<std::string> describe(std::string_view event_json);

 private:
  struct Record {
    std::string role;
    int64_t pid = -1;
    int64_t bytes = 0;
    std::vector<std::pair<std::string, double>> marks;  ///< monotonic ms, in time order
  };
  struct Open {
    Decision decision;
    std::optional<double> detect, snapshot_decision;
    double decided = 0;
    std::map<int, double> spawned;
    std::map<int, int> spawned_pid;
    std::set<int> expected;
    std::set<int> gone;  ///< expected, process ended without a record
    std::map<int, Record> records;
  };
  void close(int64_t generation);
  void close_complete();

  Clock now_;
  std::optional<double> detect_;             ///< config seen, not yet used by a resize
  std::optional<double> snapshot_decision_;  ///< a pause's snapshot decision, not yet used
  std::map<int, std::pair<double, int>> early_spawns_;  ///< gpu -> (time, pid), no resize yet
  std::map<int64_t, Open> open_;
  int64_t last_generation_ = -1;  ///< the newest generation timed
  std::vector<JsonObject> ready_;
  std::string last_;
};

}  // namespace gpurun::control
