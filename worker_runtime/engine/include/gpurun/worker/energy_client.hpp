// gpurun::control::EnergyClient — energy from a C++ program's side (docs/worker-runtime.md#energy):
// the job's and the epoch's joules per GPU, named windows in Zeus' shape (begin_window /
// end_window) and the detail of a stop, asked of node 0's gpurun through the job's store
// (docs/control-protocol.md#energy-questions). The supervisor owns NVML and the energy
// monitor; the process reads no GPU counter. No torch. Blocking; not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpurun/control/energy_question.hpp"
#include "gpurun/store/store.hpp"

namespace gpurun::control {

/// One energy window (Zeus' Measurement): seconds, joules per GPU slot (the job's GPUs of node
/// 0 charged at its end) and their sum.
struct EnergyMeasurement {
  std::string name;
  double seconds = 0;                  ///< s
  std::map<int, double> gpu_energy_j;  ///< slot → J
  double total_energy_j() const;       ///< J
};

/// A finished epoch: its `energy_epoch` event's main fields (the numbers are the event's).
struct EnergyEpoch {
  int64_t epoch = -1;
  double seconds = 0, energy_j = 0, cost = 0;  ///< s, J, J (Zeus' cost)
  std::map<int, double> gpu_energy_j;          ///< slot → J
};

/// EnergyClient::energy(): the monitor's figures when asked.
struct EnergyReading {
  double seconds = 0;                        ///< since the job started, s
  int64_t epoch = 0;                         ///< the epoch being trained
  std::map<int, double> gpu_energy_j;        ///< slot → J charged to the job so far
  std::map<int, double> epoch_gpu_energy_j;  ///< slot → J of the current epoch so far
  double total_energy_j = 0, epoch_energy_j = 0;
  std::vector<EnergyEpoch> epochs;  ///< every finished epoch
};

/// Why the job stopped, as gpurun tells it (EnergyClient::stop_detail()).
struct StopDetail {
  std::string reason;  ///< "early_stop" or "stop"
  std::string text;    ///< gpurun's sentence
  std::string cause;   ///< "stop": "signal" or "preemption"
  std::string signal;  ///< "stop": "SIGTERM", …
  std::optional<double> predicted_cost_j, cost_so_far_j, threshold_j;  ///< "early_stop", J
};

/// Writes `q` under keys::energy_ask(slot, this pid, n) (n: a per-process counter) and, except
/// for kBegin, returns gpurun's answer (JSON) read within `timeout` and deleted; "" for kBegin.
/// Throws StoreTimeout / StoreError. The one place a worker asks (WorkerSession, EnergyClient).
std::string ask_energy(store::Store& store, int slot, const EnergyQuestion& q,
                       std::chrono::milliseconds timeout);

class EnergyClient {
 public:
  /// nullptr unless GPURUN_ELASTIC=1 (gpurun --config: node 0's gpurun answers); connects to
  /// the store (GPURUN_STORE_ADDR/PORT) as slot GPURUN_SLOT. Throws ProtocolError for a bad
  /// variable, StoreError when the store cannot be reached.
  static std::unique_ptr<EnergyClient> from_env();
  /// `timeout`: how long a question waits for its answer.
  EnergyClient(std::unique_ptr<store::Store> store, int slot,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// The job's energy so far; nullopt when gpurun has no energy monitor (off_reason() says
  /// why). Throws gpurun::Error naming why when gpurun cannot answer (StoreTimeout: none
  /// within the timeout).
  std::optional<EnergyReading> energy(int rank = -1);
  /// Zeus' begin_window: `name` (1 to 128 bytes) begins now (Unix time). Sync the device first
  /// (torch::cuda::synchronize()) for the work queued so far to count. Does not wait. Throws
  /// UsageError when `name` is already open on this client.
  void begin_window(const std::string& name, int rank = -1);
  /// Zeus' end_window: blocks until gpurun's monitor read every GPU after now (one period);
  /// nullopt when there is no monitor. Throws UsageError when `name` is not open, gpurun::Error
  /// with gpurun's reason when it cannot measure the window.
  std::optional<EnergyMeasurement> end_window(const std::string& name, int rank = -1);
  /// After the job's exit decision: gpurun's detail of an early stop or a stop signal;
  /// nullopt when it has none (the job finished, or another reason).
  std::optional<StopDetail> stop_detail();
  /// Why energy() / end_window() returned nullopt; "" until then.
  const std::string& off_reason() const { return off_; }

 private:
  std::string ask(const EnergyQuestion& q);

  std::unique_ptr<store::Store> store_;
  int slot_;
  std::chrono::milliseconds timeout_;
  std::vector<std::string> open_;
  std::string off_;
};

}  // namespace gpurun::control
