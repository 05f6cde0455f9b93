// gpurun::control::WorkerControl — the worker's side of the control protocol
// (docs/control-protocol.md): join a generation, report at a boundary and wait
// for the decision, park in hold mode. Used by the worker runtime and the tests'
// fake workers. Blocking; one instance per worker process; not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gpurun/control/decision.hpp"
#include "gpurun/store/client.hpp"

namespace gpurun::control {

/// Where the worker is and how long it waits.
struct WorkerControlOptions {
  store::ClientOptions store;   ///< GPURUN_STORE_ADDR / GPURUN_STORE_PORT
  int gpu = 0;                  ///< GPURUN_SLOT: this worker's slot id
  int64_t join_generation = 0;  ///< GPURUN_JOIN_GENERATION
  /// GPURUN_WARM: a warm joiner's id (-1: none). It joins no generation at start: it calls
  /// wait_admission() once it is ready.
  int64_t warm = -1;
  /// One store WAIT lasts at most this long; waits are repeated until the key appears
  /// (the supervisor enforces the boundary deadline, not the worker).
  std::chrono::milliseconds wait_chunk{std::chrono::seconds(30)};
};

class WorkerControl {
 public:
  /// nullptr unless GPURUN_ELASTIC=1 (gpurun runs with --config). Otherwise connects to the
  /// supervisor's store. Throws ProtocolError for a missing/bad GPURUN_* variable,
  /// StoreError when the store cannot be reached.
  static std::unique_ptr<WorkerControl> from_env();

  explicit WorkerControl(WorkerControlOptions options);

  /// GETs gpurun/gen/<join_generation>/start (blocks until it exists), SETs
  /// gpurun/gen/<g>/joined/<rank> = pid. Returns the decision that created the generation
  /// (state_source says where the state comes from). Throws ProtocolError when this slot
  /// is not a member of that generation.
  const Decision& join();

  /// A warm joiner (options.warm >= 0), once it is ready to train (model built, data loaded):
  /// SETs gpurun/slot/<gpu>/ready/<w> = pid, then blocks (no deadline) on
  /// gpurun/slot/<gpu>/admit/<w>. Returns the decision of the generation to join (joined key
  /// written, as join() does), or nullopt when gpurun says exit (not needed after all).
  std::optional<Decision> wait_admission();
  bool warm() const { return opt_.warm >= 0; }

  /// At a boundary: SETs the report for (generation, round), blocks until the decision,
  /// returns it. After a `resize` this object follows it: generation(), rank(),
  /// world_size() are the new generation's (when this slot stays a member). Kind `exit`:
  /// the job is finishing (another member finished training); the caller stops training
  /// and exits 0; this object is then unusable. Throws StoreError on a broken connection,
  /// ProtocolError on a bad decision. `has_state` false: this rank holds no training state
  /// (a joiner whose set-up was abandoned); gpurun decides without taking it as a source.
  /// `snapshot`: after a `snapshot` decision, the state source's outcome ("ok" or the error).
  /// A `snapshot` decision, like `continue`, moves to the next round of the generation.
  Decision report_and_wait(int64_t epoch, int64_t step, bool has_state = true,
                           std::string snapshot = {});

  /// Hold mode, after the caller freed its GPU state: SETs gpurun/slot/<gpu>/parked/<G>,
  /// then blocks (no deadline) on the wake key. Returns the decision of the generation to
  /// join (already joined: joined key written), or nullopt when told to exit.
  std::optional<Decision> park_and_wait();

  /// SETs gpurun/gen/<generation>/timing/<gpu> = `json` (this rank's phase timestamps of the
  /// resize into `generation`, docs/control-protocol.md#resize-timings). One store round trip;
  /// throws StoreError on a broken connection.
  void publish_timing(int64_t generation, const std::string& json);

  int gpu() const { return opt_.gpu; }
  int64_t generation() const { return generation_; }
  int64_t round() const { return round_; }
  /// Rank in the current generation, -1 after leaving.
  int rank() const { return current_.rank_of(opt_.gpu); }
  int world_size() const { return static_cast<int>(current_.active.size()); }
  /// The last decision read (start record, boundary decision or wake).
  const Decision& current() const { return current_; }
  /// The raw bytes of the last decision read (for byte-equality checks).
  const std::string& current_json() const { return current_json_; }
  store::Client& client() { return *client_; }

 private:
  /// A wake or admission record: nullopt for `exit`, else this slot's generation from now on.
  std::optional<Decision> take_join_decision(const std::string& json);
  std::string wait_get(const std::string& key);
  void joined();

  WorkerControlOptions opt_;
  std::unique_ptr<store::Client> client_;
  int64_t generation_ = -1;
  int64_t round_ = 0;
  int64_t park_generation_ = -1;
  Decision current_;
  std::string current_json_;
};

}  // namespace gpurun::control
