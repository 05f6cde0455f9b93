// gpurun::control::WorkerSession — the worker engine (worker_engine.hpp) with its store I/O:
// it runs the engine's store actions (SET, WAIT+GET) itself, prints its log lines, stamps
// events with the host's clocks, and hands the executor only the torch actions. One per
// worker process; used by the C++ runtime directly and by the Python package through the C
// interface (worker_runtime/capi/gpurun_worker.h). Blocking; not thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/control/energy_question.hpp"
#include "gpurun/store/client.hpp"
#include "gpurun/store/store.hpp"
#include "gpurun/worker/sever_watch.hpp"
#include "gpurun/worker/worker_engine.hpp"

namespace gpurun::control {

struct SessionOptions {
  EngineOptions engine;
  int64_t restart_count = 0;  ///< TORCHELASTIC_RESTART_COUNT: slot data is per attempt
  /// GPURUN_PREEMPT_DIR: a kExit that is not a leave says `stop` when <dir>/stop exists.
  std::string preempt_dir;
  /// Where kLog lines go (one line each, without the newline); default: stderr with the prefix
  /// "gpurun worker (slot N): ".
  std::function<void(const std::string&)> log;
  /// Called with every value the session read for the engine (key, value): tests' record of
  /// the decisions a worker read. May be empty.
  std::function<void(const std::string&, const std::string&)> on_value;
};

class WorkerSession {
 public:
  /// nullptr unless GPURUN_ELASTIC=1 (gpurun runs with --config). Otherwise connects to the
  /// supervisor's store (GPURUN_STORE_ADDR/PORT) as slot GPURUN_SLOT of GPURUN_JOIN_GENERATION
  /// or warm joiner GPURUN_WARM, and starts this process's SeverWatch (sever_watch.hpp: a
  /// thread and a store connection of its own; it ends at once in a job of one node). Throws
  /// ProtocolError for a missing/bad variable, StoreError when the store cannot be reached.
  static std::unique_ptr<WorkerSession> from_env(SessionOptions extra = {});
  /// The store options from GPURUN_STORE_ADDR/GPURUN_STORE_PORT (ProtocolError when unset).
  static store::ClientOptions store_options_from_env();

  /// Over `store`: real, a store::ClientStore to gpurun's store (from_env); tests,
  /// tests/testing's InMemoryStore. A decision is read with get(key, kNoTimeout):
  /// gpurun, not the worker, enforces the protocol's deadlines.
  WorkerSession(SessionOptions options, std::unique_ptr<store::Store> store);

  /// Feeds `e` to the engine (stamping mono_ms/unix_ms when 0), runs every store action it
  /// returns (feeding the values back), prints the log lines, and returns the other actions in
  /// order; the last may need an outcome (the next call's event). Throws what the engine and
  /// the store throw (ProtocolError, StoreError, InvariantError).
  std::vector<EngineAction> on(EngineEvent e);

  const WorkerEngine& engine() const { return engine_; }
  store::Store& store() { return *store_; }

  /// Before a torch.distributed rendezvous: writes `rank`'s arrival under `prefix` and waits
  /// until every rank of `size` arrived, polling every 20 ms; throws CommAbandoned (a
  /// ProtocolError naming gpurun's reason) when `abort_key` appears, and ProtocolError after
  /// `timeout`. Liveness through the store: a dead peer never arrives, gpurun writes the abort.
  void wait_arrivals(const std::string& prefix, int rank, int size, const std::string& abort_key,
                     std::chrono::milliseconds timeout);
  /// This slot's small data (e.g. RNG streams) that outlives its process in this attempt.
  void put_slot_data(const std::string& name, const std::string& bytes);
  std::optional<std::string> get_slot_data(const std::string& name);

  /// Asks node 0's gpurun an energy question (docs/control-protocol.md#energy-questions):
  /// writes it under keys::energy_ask (this slot, this pid, the next number); a kBegin returns
  /// "" at once, any other waits up to `timeout` for gpurun's answer (JSON), reads and deletes
  /// it (control::ask_energy). Throws StoreTimeout when no answer came in time, StoreError
  /// when the store is gone.
  std::string energy_ask(const EnergyQuestion& q, std::chrono::milliseconds timeout);

  /// The host's monotonic clock (CLOCK_MONOTONIC) in ms: every resize timing's clock.
  static double mono_ms();

 private:
  SessionOptions opt_;
  std::unique_ptr<store::Store> store_;
  WorkerEngine engine_;
  /// The engine's generation after the last on() (-1: none yet): what the SeverWatch reads.
  std::atomic<int64_t> generation_{-1};
  std::unique_ptr<SeverWatch> sever_;  // from_env only; last: it reads generation_
};

/// gpurun abandoned a generation's set-up (its abort key appeared).
class CommAbandoned : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

}  // namespace gpurun::control
