// gpurun::control metrics — the job's Prometheus text (exposition format 0.0.4) for `/metrics`:
// per GPU slot energy, power, limit, state and rank; the job's generation, world size,
// resizes (counts, durations, phases), step count and rate, Zeus' cost and early stop. Label
// names join with DCGM exporter's (`gpu`, `UUID`, `modelName`, `Hostname`). Pure text from
// plain data: the composition root (launcher/app/job_metrics.cpp) gathers a MetricsSnapshot on
// the io thread at each scrape. Reference: docs/metrics.md.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "control/status.hpp"

namespace gpurun::control {

/// One GPU as DCGM exporter labels it (from the energy monitor's NVML).
struct GpuLabels {
  int index = -1;     ///< NVML device index, DCGM exporter's `gpu`; -1: unknown (no label)
  std::string uuid;   ///< "GPU-…", `UUID`
  std::string model;  ///< NVML's name, e.g. "NVIDIA H200", `modelName`
};

/// The workers' step progress (docs/energy.md#progress-file).
struct StepProgress {
  uint64_t steps = 0;  ///< the highest global step any slot published
  double rate = 0;     ///< steps per second (StepRate)
};

/// Everything one scrape shows; gathered on the io thread.
struct MetricsSnapshot {
  std::string job;       ///< the run id (label `job`)
  std::string hostname;  ///< this node's host name (label `Hostname` of its GPUs)
  RunStatus run;         ///< slots, generation, active set (a plain run: StatusSpawner's)
  /// Processes of the job now: the active set's size (elastic), the world size (plain run).
  int world_size = 0;
  std::optional<EnergyStatus> energy;  ///< nullopt: no energy monitor
  std::map<int, GpuLabels> gpus;       ///< slot -> its GPU (this node's monitored GPUs)
  std::vector<int> lent;               ///< slots lent now (`gpurun lend`)
  std::vector<int> yielded;            ///< slots given up to another user's process
  std::optional<StepProgress> steps;   ///< nullopt: no progress file (a plain run)
};

/// A slot's state as /metrics names it: SlotState in lower case, except a slot without a
/// process of the job (parked, standby) that is lent ("lent"), yielded ("yielded") or out
/// because the config pauses the job ("paused").
std::string metrics_slot_state(const SlotStatus& slot, const MetricsSnapshot& snap);
/// Every value metrics_slot_state() can return, in the order /metrics lists them.
const std::vector<std::string>& metrics_slot_states();

/// The `resize` events' counters and duration histogram (docs/control-protocol.md#resize-
/// timings), fed from the event log. Io thread; never throws (a record it cannot read is
/// skipped and counted in bad_records()).
class ResizeMetrics {
 public:
  /// Upper bounds of the duration histogram's buckets, seconds (+Inf is implied).
  static const std::vector<double>& buckets();
  /// Kinds a `resize` event can have, listed at 0 before the first.
  static const std::vector<std::string>& kinds();

  /// One event log record (EventLog's observer): a `resize` event is counted, others ignored.
  void on_event(std::string_view event, const std::string& record);

  struct Kind {
    uint64_t count = 0;
    double sum_s = 0;                    ///< Σ total_ms / 1000
    std::vector<uint64_t> bucket_count;  ///< cumulative, one per buckets()
  };
  const std::map<std::string, Kind>& by_kind() const { return kinds_; }
  /// Σ phases_ms / 1000 over every resize, per mark (decision, spawned, ready, comm, …).
  const std::map<std::string, double>& phase_seconds() const { return phases_; }
  uint64_t bad_records() const { return bad_; }

 private:
  std::map<std::string, Kind> kinds_;
  std::map<std::string, double> phases_;
  uint64_t bad_ = 0;
};

/// Steps per second from successive progress readings: the steps published over the last
/// `window_s` seconds of the readings' own step times; 0 once no step was published for
/// window_s (a pause, the end). Io thread.
class StepRate {
 public:
  explicit StepRate(double window_s = 10) : window_s_(window_s) {}
  /// The highest step and its end time (Unix ns, 0: none yet); `now_ns` the reading's time.
  double observe(uint64_t steps, uint64_t time_ns, uint64_t now_ns);

 private:
  double window_s_;
  std::deque<std::pair<uint64_t, uint64_t>> points_;  ///< (time_ns, steps), step times rising
};

/// The Prometheus text of `snap` and `resizes`: `# HELP`/`# TYPE` once per metric, then its
/// samples; label values escaped (\\, \", \n). docs/metrics.md lists every metric.
std::string render_metrics(const MetricsSnapshot& snap, const ResizeMetrics& resizes);

/// The Content-Type of render_metrics()'s text.
inline constexpr std::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace gpurun::control
