// gpurun::energy::EnergyAnswers — node 0's answers to the program's energy questions
// (rt.energy(), rt.energy_window(name), rt.stop_reason's detail; docs/energy.md#from-the-program,
// docs/control-protocol.md#energy-questions). A worker writes a question under
// keys::energy_ask; gpurun reads and deletes it and writes the answer under keys::energy_answer,
// at once (energy, stop) or, for a window's end, once the monitor has read every GPU past the
// window's edges, so a window's joules are interpolated between two readings as the monitor's
// own windows are (never extrapolated). Workers read no NVML: the monitor owns it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "energy/early_stop.hpp"
#include "gpurun/clock.hpp"
#include "gpurun/control/energy_question.hpp"
#include "gpurun/control/keys.hpp"
#include "gpurun/store/store.hpp"
#include "supervisor/event_log.hpp"

namespace gpurun::energy {

class EnergyMonitor;

/// What the answers read of the energy monitor (the io thread's view); monitor_reader() in
/// gpurun, a fake in tests.
class EnergyReader {
 public:
  virtual ~EnergyReader() = default;
  /// Each monitored slot's continuous energy counter at Unix time `t_s`, J (only differences
  /// mean anything); nullopt until every GPU has been read at or after t_s.
  virtual std::optional<std::map<int, double>> counters_at(double t_s) const = 0;
  /// The slots charged now (the job's GPUs on this node), ascending.
  virtual std::vector<int> active() const = 0;
  /// Per slot: joules of the job so far and of the current epoch so far (EnergyMonitor::status).
  virtual std::map<int, std::pair<double, double>> job_and_epoch_j() const = 0;
  /// The finished epochs' records (the `energy_epoch` events) and the early-stop threshold.
  virtual const std::vector<EpochRecord>& epochs() const = 0;
  virtual std::optional<double> threshold_j() const = 0;
};

/// The reader of a running monitor (it must outlive the reader).
std::unique_ptr<EnergyReader> monitor_reader(const EnergyMonitor& monitor);

struct AnswerOptions {
  /// How often a window edge not yet covered by a reading is looked at again (the monitor's
  /// period).
  std::chrono::milliseconds retry{100};
  /// A window edge still not covered after this is answered with an error (the monitor
  /// stopped reading: the job is ending).
  std::chrono::milliseconds give_up{std::chrono::seconds(10)};
  /// Open windows per worker process; a begin beyond it is refused at its end.
  std::size_t max_open = 64;
  double job_start_s = 0;  ///< Unix s the job started (rt.energy()'s `seconds`)
};

/// Io thread only (the store observer's posts, the clock's timers). `store` (node 0's, in
/// process), `clock` and `events` must outlive it.
class EnergyAnswers {
 public:
  /// `stop_fields`: the stop answer's fields beside "v" (one JSON object's members, e.g.
  /// `"reason":"early_stop","text":…`), from the job (the early-stop sentence, the signal).
  EnergyAnswers(store::Store& store, gpurun::Clock& clock, supervisor::EventLog& events,
                std::function<std::string()> stop_fields, AnswerOptions options = {});
  ~EnergyAnswers();
  EnergyAnswers(const EnergyAnswers&) = delete;
  EnergyAnswers& operator=(const EnergyAnswers&) = delete;

  /// The monitor to read (nullptr: none, every question is answered {"v":1,"off":why}).
  void set_reader(std::unique_ptr<EnergyReader> reader, std::string off_why = {});
  /// A write under gpurun/: true when `key` is an energy question (read, deleted, answered or
  /// held until readings cover it), false for any other key.
  bool on_key(const std::string& key);

  /// A restart attempt begins (its processes are new, the store's keys reset): the open
  /// windows and the ends waiting for a reading are dropped, unanswered.
  void restart();

  /// Windows whose end waits for a reading (tests).
  std::size_t pending() const { return pending_.size(); }

 private:
  struct Open {  // a window begun and not yet ended
    double t0_s = 0;
    std::optional<std::map<int, double>> at_t0;  // counters at t0, once covered
  };
  using WindowId = std::tuple<int, int64_t, std::string>;  // (slot, pid, name)
  struct Pending {                                         // an end waiting for readings
    control::keys::EnergyAsk ask;
    control::EnergyQuestion q;
    Clock::TimePoint since;
  };
  void answer(const control::keys::EnergyAsk& ask, const std::string& json);
  std::string energy_json() const;
  /// True when answered (or refused); false while a reading is missing.
  bool try_end(const Pending& p);
  void retry();

  store::Store& store_;
  gpurun::Clock& clock_;
  supervisor::EventLog& events_;
  std::function<std::string()> stop_fields_;
  AnswerOptions opt_;
  std::unique_ptr<EnergyReader> reader_;
  std::string off_why_;
  std::map<WindowId, Open> open_;
  std::vector<Pending> pending_;
  Clock::Timer timer_;
};

}  // namespace gpurun::energy
