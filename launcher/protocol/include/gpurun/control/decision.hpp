// gpurun::control::Decision and Report — the values of the control protocol's
// store keys (their names: gpurun/control/keys.hpp). Encoding:
// docs/control-protocol.md#decision-encoding.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpurun/control/park_mode.hpp"
#include "gpurun/error.hpp"

namespace gpurun::control {

/// A value under gpurun/ that does not parse (message names the field and quotes the text).
class ProtocolError : public Error {
 public:
  using Error::Error;
};

/// Where the state of a generation comes from (the decision's `state_source`).
/// On the wire it stays two integers (docs/control-protocol.md#decision-encoding):
/// `state_source` = the rank in prev_generation (>= 0), -1 for the host snapshot, -2 for none;
/// `state_source_gpu` = that rank's slot, -1 otherwise. Only the codec knows those numbers.
struct StateSource {
  enum class Kind {
    kNone,      ///< a fresh start: rank 0's initial state is broadcast
    kPeer,      ///< a rank of prev_generation hands its state to the joiners
    kSnapshot,  ///< the pause snapshot (host memory or the run dir) is loaded
  };
  Kind kind = Kind::kNone;
  int rank = -1;  ///< rank in prev_generation; -1 unless kind == kPeer
  int gpu = -1;   ///< slot of that rank; -1 unless kind == kPeer

  static StateSource none() { return {}; }
  static StateSource snapshot() { return {Kind::kSnapshot, -1, -1}; }
  /// Throws InvariantError when rank or gpu is negative.
  static StateSource peer(int rank, int gpu);

  bool is_none() const { return kind == Kind::kNone; }
  bool is_peer() const { return kind == Kind::kPeer; }
  bool is_snapshot() const { return kind == Kind::kSnapshot; }

  /// The wire's `state_source` integer (rank, -1 or -2).
  int wire_code() const;
  /// Inverse of wire_code() + gpu. Throws ProtocolError for a code below -2, or a peer
  /// rank whose gpu is negative (`what` names the decision in the message).
  static StateSource from_wire(int64_t code, int64_t gpu, std::string_view what);

  friend bool operator==(const StateSource&, const StateSource&) = default;
};

/// "gpu 3", "the pause snapshot" or "a fresh start" (console and trace wording).
std::string describe(const StateSource& s);

/// What a decision tells every worker. See docs/control-protocol.md for each field.
struct Decision {
  /// kSnapshot: a pause is wanted; the state source (state_source, a peer) writes the pause
  /// snapshot now and every rank reports again at the same boundary (the next round); the
  /// report says whether the snapshot is complete and verified. Only then is the pause decided.
  enum class Kind { kStart, kContinue, kResize, kExit, kSnapshot };

  Kind kind = Kind::kContinue;
  int64_t generation = 0;        ///< generation in force after this decision
  int64_t prev_generation = -1;  ///< generation whose boundary this answers (-1: start)
  int64_t round = -1;            ///< round of prev_generation answered (-1: not at a boundary)
  int64_t epoch = -1;            ///< boundary it applies at (-1: none)
  int64_t step = -1;
  std::vector<int> active;   ///< sorted slot ids; rank = index
  std::vector<int> joiners;  ///< sorted
  std::vector<int> leavers;  ///< sorted
  std::vector<int> failed;   ///< sorted
  StateSource state_source;  ///< where this generation's state comes from
  ParkMode park_mode = ParkMode::kRelease;
  int64_t every_steps = 0;   ///< 0 = every epoch
  int64_t global_batch = 0;  ///< 0 = unset
  /// gpurun received the preemption-warning signal (docs/cli.md#preemption): every rank sees
  /// Runtime::checkpoint_requested() from this boundary on. On the wire only when true.
  bool checkpoint = false;
  /// kResize only: members that stay (sorted slots of `active`, never joiners) whose state is
  /// a step behind the state source's: a peer died inside an all-reduce that completed on the
  /// source and failed on them. They receive the source's state, as joiners do, before the
  /// checksum (docs/worker-runtime.md#failures). On the wire only when not empty.
  std::vector<int> behind;
  /// kExit only: why the job ends, a short code (docs/control-protocol.md#decision-encoding):
  /// "stop" (gpurun was asked to stop: SIGTERM/SIGINT, or the preemption signal with
  /// --requeue), "early_stop" (the energy monitor's cost threshold), "finished" (a rank ended its
  /// program cleanly), "state_lost" (no copy of the training state is left), "failed" (every
  /// member failed). Empty = unknown (absent on the wire; a parked worker told to exit because
  /// the park mode became release gets none).
  std::string reason;

  /// Rank of `gpu` in `active`, -1 when it is not a member.
  int rank_of(int gpu) const;
  bool is_member(int gpu) const { return rank_of(gpu) >= 0; }
  bool is_leaver(int gpu) const;

  /// The canonical one-line JSON (field order fixed, no spaces): equal decisions give
  /// equal bytes.
  std::string to_json() const;
  /// Parses to_json()'s output. Throws ProtocolError naming the missing/bad field.
  static Decision from_json(std::string_view text);

  friend bool operator==(const Decision&, const Decision&) = default;
};

std::string_view to_string(Decision::Kind kind);

/// What a worker writes at a boundary.
struct Report {
  int rank = 0;
  int gpu = 0;
  int64_t generation = 0;
  int64_t round = 0;
  int64_t epoch = 0;
  int64_t step = 0;
  int pid = 0;
  /// When the worker reached the boundary: Unix time in milliseconds (the worker's
  /// system_clock); 0 = not given. The energy monitor ends a window there.
  int64_t time_ms = 0;
  /// False: this rank joined the generation but holds no training state (its set-up was
  /// abandoned before the handoff reached it); gpurun never takes it as a state source.
  /// On the wire only when false ("has_state":false); absent = true.
  bool has_state = true;
  /// After a `snapshot` decision, the state source's outcome: "ok" (written and verified) or
  /// the error sentence; empty otherwise (and absent on the wire).
  std::string snapshot;

  std::string to_json() const;
  /// Throws ProtocolError.
  static Report from_json(std::string_view text);
  friend bool operator==(const Report&, const Report&) = default;
};

/// A boundary as gpurun's console lines name it, epochs counted from 1 as training programs
/// print them (the Fashion-MNIST example's "epoch 1/3"): (4, 0), the end of the fifth epoch,
/// is "after epoch 5"; (4, 120) is "in epoch 5 after step 120"; an epoch < 0 is "before the
/// first epoch". Event-log and status.json fields stay as reported (from 0).
std::string boundary_text(int64_t epoch, int64_t step);
/// The same words for a position training resumes at (a snapshot's, the runtime's epoch and
/// step in it): (E, 0) is the start of epoch E, "after epoch E" ("before the first epoch" for
/// E = 0); (E, S) "in epoch E+1 after step S".
std::string position_text(int64_t epoch, int64_t step);

/// One variable of a worker's environment: (name, value).
using EnvVar = std::pair<std::string, std::string>;

/// The torchrun variables that describe slot `slot`'s place in the generation `d` created
/// (docs/cli.md#worker-environment), in this order: RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE. rank = the
/// slot's index in `d.active`, world = |active|. A slot's node is slot_node(slot)
/// (gpurun/control/node_messages.hpp): GROUP_RANK is the index of its node among the distinct
/// nodes of `d.active` (in their order there), GROUP_WORLD_SIZE their count; LOCAL_RANK is the
/// slot's index among the active slots of its node, LOCAL_WORLD_SIZE their count; ROLE_* equal
/// RANK and WORLD_SIZE. One node (every one-node job): LOCAL_* equal RANK and WORLD_SIZE,
/// GROUP_RANK is 0 and GROUP_WORLD_SIZE 1. The one rule for
/// both sides: the supervisor's spawn environment of a joiner and the runtimes' update of
/// their process environment at every generation (the worker engine's kTrain action). Empty
/// when `slot` is not a member of `d`.
std::vector<EnvVar> generation_env(const Decision& d, int slot);

/// "0,1,3" (environment form of an active set) and back. parse throws ProtocolError.
std::string join_ids(const std::vector<int>& ids, std::string_view sep = ",");
std::vector<int> parse_ids(std::string_view text);
/// "[0,1,3]": an id list as a JSON array (event fields, status.json).
std::string ids_json(const std::vector<int>& ids);
/// Whether `x` is one of `ids` (any order).
bool has_id(const std::vector<int>& ids, int x);

}  // namespace gpurun::control
