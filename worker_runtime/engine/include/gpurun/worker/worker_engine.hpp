// gpurun::control::WorkerEngine — the worker's side of the control protocol
// (docs/control-protocol.md) as one pure state machine: no I/O, no torch, no clock. Events in
// (the process opened, the program is ready, a boundary, the outcome of each action), ordered
// actions out (store SETs and WAIT+GETs; make a group, broadcast or receive the state, verify
// checksums, write or read the pause snapshot, release, park, train, exit). It owns the worker
// state table (gpurun/worker/worker_state.hpp), every boundary rule (rounds, generations, the
// snapshot round, the re-report loops after a failed set-up or collective, the leaving
// source's hand-off failure), the key grammar (gpurun/control/decision.hpp keys::), the
// decision/report codec and the resize timing marks (docs/control-protocol.md#resize-timings).
//
// Executors: the C++ runtime (worker_runtime/src/runtime/runtime*.cpp, LibTorch) and the Python
// package (worker_runtime/python/gpurun, torch.distributed) through the C interface
// (worker_runtime/capi/gpurun_worker.h); WorkerSession (worker_session.hpp) runs the store
// actions for both. docs/architecture.md#worker-engine draws it.
//
// Contract of on(): it returns actions in the order to run them. Every action but the last is
// fire-and-forget. The last one may need an outcome (Action::needs_outcome()): the caller runs
// it and passes its result as the next event (kValue for kWaitGet; kDone or kFailed for the
// torch actions). Otherwise the engine waits for the program: kReady, kBoundary or
// kCollectiveFailed. An event that does not fit the engine's phase throws InvariantError
// (a bug of the executor); a bad value from the store throws ProtocolError. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpurun/control/decision.hpp"
#include "gpurun/control/keys.hpp"
#include "gpurun/worker/worker_state.hpp"

namespace gpurun::control {

/// Who this worker is (from its GPURUN_* environment, gpurun/env_names.hpp).
struct EngineOptions {
  int slot = 0;                 ///< GPURUN_SLOT
  int64_t join_generation = 0;  ///< GPURUN_JOIN_GENERATION (ignored for a warm joiner)
  int64_t warm = -1;            ///< GPURUN_WARM: a warm joiner's id, -1: none
  int pid = 0;                  ///< this process's pid (written to joined/ready/parked keys)
  /// GPURUN_STANDBY=1 (with `warm`): a standby; until gpurun's go key it must not touch its
  /// device (the executor sends kDevice before its first device use and waits there).
  bool standby = false;
};

struct EngineEvent {
  enum class Kind {
    kOpen,      ///< the process starts (Runtime creation): a non-warm worker reads its start record
    kReady,     ///< the program is ready (its first epochs()/steps()): the generation is set up
    kBoundary,  ///< a boundary at (epoch, step): report and wait for the decision
    kValue,     ///< the value of the last kWaitGet (`text`)
    kDone,      ///< the last action succeeded: `bytes` moved; a snapshot write's outcome in
                ///< `text` ("ok" or the error sentence: the pause is then refused)
    kFailed,    ///< the last action failed because a peer died or gpurun abandoned the
                ///< generation (a comm error, `text`); (epoch, step): the program's position
                ///< (a holder reports it as kCollectiveFailed does)
    kCollectiveFailed,  ///< a collective of training failed (peer died) at (epoch, step);
                        ///< reported as a boundary is: step 0 of epoch E as (E - 1, 0)
    kDevice,            ///< the program needs its device now (before any CUDA call): a standby
                        ///< waits for its go key here; for any other worker a no-op. Any
                        ///< phase; once per process is enough.
    kProgramError,      ///< the program's own exception (`text`) is about to end this
                        ///< process: gpurun fails the job on its exit (as torchrun would),
                        ///< rather than going on without the rank. Any phase before the end.
  };
  Kind kind = Kind::kOpen;
  double mono_ms = 0;   ///< the host's monotonic clock (CLOCK_MONOTONIC) in ms: timing marks
  int64_t unix_ms = 0;  ///< wall clock, Unix ms: a report's time_ms (the energy windows)
  int64_t epoch = -1;
  int64_t step = -1;
  int64_t bytes = 0;
  std::string text;
};

struct EngineAction {
  enum class Kind {
    // --- store (WorkerSession runs them) ---
    kSet,      ///< SET key = value
    kWaitGet,  ///< WAIT key (no deadline: gpurun enforces the boundary deadline), GET it
    // --- the executor's ---
    kLog,             ///< one line for stderr (`text`, without the worker prefix)
    kState,           ///< the worker state changed: from → to (`text`: why); for traces/tests
    kMakeGroup,       ///< set up a communicator: `prefix` (its store keys), `abort_key` (stop
                      ///< waiting when it appears), `group` (slots; rank = index), `rank`,
                      ///< `purpose` ("train": the generation's, kept; "handoff": dropped after)
    kDropGroup,       ///< end the current communicator (`abort`: after a failure, do not wait)
    kBroadcastState,  ///< broadcast the state from `root` (rank in the group); `receive`: this
                      ///< rank takes it (a rank holding the current state only takes part)
    kVerifyState,     ///< all-gather the state checksum; mismatch with `root`'s: throw
                      ///< StateError (`text` names when: "after the handoff"/"after the boundary")
    kWriteSnapshot,   ///< write the pause snapshot (outcome: kDone, text "ok" or the error)
    kReadSnapshot,    ///< load the pause snapshot; its state must be at (epoch, step) (-1: any):
                      ///< another position is refused (StateError naming both)
    kRelease,         ///< release mode: free every device allocation of the state
    kPark,            ///< hold mode: free the GPU (host copy kept), then the engine parks
    kTrain,           ///< train on: `decision` in force (rank, world, every_steps, global_batch,
                      ///< checkpoint); `jumped`: a rejoin at the state's position, not this loop's
    kExit,            ///< the loops end: `left` true when this rank left the job before its end
  };
  Kind kind = Kind::kLog;
  std::string key, value;  ///< kSet, kWaitGet
  std::string text;        ///< kLog, kState (why), kVerifyState (when), kExit (reason)
  WorkerState from = WorkerState::kActive, to = WorkerState::kActive;  ///< kState
  std::string prefix, abort_key, purpose;                              ///< kMakeGroup
  std::vector<int> group;                                              ///< kMakeGroup
  int rank = -1;                  ///< kMakeGroup: rank in `group`; kTrain: rank in the generation
  int root = 0;                   ///< kBroadcastState, kVerifyState
  bool receive = false;           ///< kBroadcastState
  bool abort = false;             ///< kDropGroup
  int64_t epoch = -1, step = -1;  ///< kReadSnapshot: the position the snapshot's state holds
  Decision decision;              ///< kTrain
  bool jumped = false;            ///< kTrain
  bool left = false;              ///< kExit
  /// kExit (not left): gpurun asked for a stop (preemption: its stop file exists, written
  /// before the exit decision; docs/cli.md#preemption). Set by WorkerSession, not the engine.
  bool stop = false;
  bool best_effort = false;  ///< kSet: a failure loses only this value (a timing record)
  /// kTrain: member/joiner/source; kRelease/kPark: leaver/source-leaver (the traces' wording)
  std::string role;
  /// kTrain: the torchrun variables of this slot in the generation in force
  /// (generation_env(decision, slot): RANK, WORLD_SIZE, LOCAL_RANK, …): the executor sets them
  /// in its process environment, so that what the program reads is the current generation's.
  std::vector<EnvVar> env;
  /// kExit: the exit decision's reason code (Decision::reason: "stop", "early_stop",
  /// "finished", …); empty when unknown or when this rank left on its own (release mode).
  std::string reason;

  /// True for kWaitGet, kMakeGroup, kBroadcastState, kVerifyState, kWriteSnapshot,
  /// kReadSnapshot, kRelease, kPark: the caller answers with kValue/kDone/kFailed.
  bool needs_outcome() const;
  friend bool operator==(const EngineAction&, const EngineAction&) = default;
};

std::string_view to_string(EngineEvent::Kind k);
std::string_view to_string(EngineAction::Kind k);

/// One JSON object per event/action (docs/control-protocol.md#worker-engine): the C
/// interface's wire form and the table tests' cases. from_json throws ProtocolError naming
/// the field.
std::string to_json(const EngineEvent& e);
std::string to_json(const EngineAction& a);
/// A list of actions as one JSON array.
std::string to_json(const std::vector<EngineAction>& actions);
EngineEvent event_from_json(std::string_view text);
EngineOptions options_from_json(std::string_view text);

class WorkerEngine {
 public:
  explicit WorkerEngine(EngineOptions options);

  /// Feeds one event; returns the actions it causes, in order (see the contract above).
  std::vector<EngineAction> on(const EngineEvent& e);

  WorkerState state() const { return state_; }
  int slot() const { return opt_.slot; }
  bool warm() const { return opt_.warm >= 0; }
  /// A standby that has not been told to go yet: its device must stay untouched.
  bool standby() const { return opt_.standby && !gone_; }
  int64_t generation() const { return generation_; }
  int64_t round() const { return round_; }
  /// Rank in the current generation, -1 when not a member (left, or a warm joiner not yet
  /// admitted).
  int rank() const { return current_.rank_of(opt_.slot); }
  int world_size() const { return static_cast<int>(current_.active.size()); }
  /// The last decision read (start record, boundary decision, wake or admission).
  const Decision& current() const { return current_; }
  /// True once a start record or admission was read (current() is a generation's).
  bool has_generation() const { return has_generation_; }
  /// True when the state this process tracks is overwritten before its first step, so its
  /// model needs no random initialisation: a warm joiner, a joiner of a running job (its
  /// start record's state comes from a peer or the pause snapshot), or a rank other than 0
  /// at a fresh start (rank 0's initial state is broadcast). Known after kOpen.
  bool joining() const;
  /// True when the loops end: the job is finishing, or this rank left.
  bool finished() const { return phase_ == Phase::kDone; }

 private:
  enum class Phase {
    kNew,            // waiting for kOpen
    kStartRecord,    // WaitGet start
    kOpened,         // start record read (or a warm joiner): waiting for kReady
    kGo,             // standby: WaitGet go (after kDevice)
    kAdmission,      // warm: WaitGet admit
    kSetUp,          // running a generation's set-up actions
    kTraining,       // waiting for a boundary or a collective failure
    kDecision,       // WaitGet a round's decision
    kSnapshotWrite,  // the state source writes the pause snapshot
    kLeaving,        // kRelease/kPark outstanding
    kWake,           // hold mode: WaitGet wake
    kDone,           // the loops end
  };
  std::vector<EngineAction> out_;
  void emit(EngineAction a) { out_.push_back(std::move(a)); }
  void set_state(WorkerState to, const std::string& why);
  void log(std::string text);
  void set(std::string key, std::string value);
  void wait_get(std::string key, Phase phase);

  /// Throws InvariantError: event `e` cannot come in this phase.
  [[noreturn]] void unexpected(const EngineEvent& e) const;
  /// on() for kValue: the value a wait_get asked for, by phase.
  void on_value(const EngineEvent& e, double now);
  /// on() for kDone: a set-up step, a snapshot write or the leaving offload has finished.
  void on_done(const EngineEvent& e, double now);
  void report(int64_t epoch, int64_t step, bool has_state, std::string snapshot, int64_t unix_ms);
  void on_decision(const std::string& json, double now);
  void adopt(const Decision& d);
  void joined();
  /// The decision a warm joiner's admit or a parked worker's wake key holds; nullopt for an
  /// exit decision (its reason code in `exit_reason`).
  std::optional<Decision> take_join(const std::string& json, std::string& exit_reason);

  void begin_set_up(const Decision& d, bool have_state, double now);
  void run_plan(double now);
  void set_up_failed(const EngineEvent& e);
  void leave(double now);
  void parked(double now);
  void train(double now);
  void finish(std::string text, bool left, std::string reason = {});

  void mark(const std::string& name, double t);
  void publish_timing();

  EngineOptions opt_;
  bool gone_ = false;  // a standby told to go (or any worker once kDevice was answered)
  Phase phase_ = Phase::kNew;
  WorkerState state_ = WorkerState::kRejoining;
  bool has_generation_ = false;
  int64_t generation_ = -1;
  int64_t round_ = 0;
  int64_t park_generation_ = -1;
  Decision current_;
  // The open round: what this rank reported (a snapshot round re-reports it).
  int64_t report_epoch_ = -1, report_step_ = -1;
  bool report_has_state_ = true;

  // The set-up in progress (enter()): its actions, run one at a time; the mark each one's
  // kDone sets; then it trains (member) or leaves.
  struct PlanStep {
    EngineAction action;
    std::string mark;
  };
  struct SetUp {
    Decision d;
    bool have_state = false;
    bool member = false;
    std::vector<PlanStep> plan;
    size_t next = 0;
  };
  std::optional<SetUp> su_;
  std::string role_;         // member/joiner/source/leaver/source-leaver of the last set-up
  bool group_open_ = false;  // the executor holds a communicator
  bool jumped_ = false;      // a hold-mode rejoin: kTrain says so

  // Resize timings: marks of the resize into timing_generation_ (only `resize` decisions).
  double seen_ms_ = 0;
  double snapshot_begin_ms_ = 0, snapshot_end_ms_ = 0;
  int64_t timing_generation_ = -1;
  std::vector<std::pair<std::string, double>> marks_;
  int64_t timing_bytes_ = 0;
};

}  // namespace gpurun::control
