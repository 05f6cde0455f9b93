// gpurun::control::keys — the control protocol's key grammar, one place: every key name
// gpurun and its workers format (docs/control-protocol.md#keys), and the one parser of the
// keys a worker writes (parse_worker_write), whose typed result the supervisor's router takes
// (Scheduler::on). No other code spells or parses a key of the protocol (tests/control's
// key_grammar_test greps for it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "gpurun/control/decision.hpp"

namespace gpurun::control::keys {

inline constexpr std::string_view kPrefix = "gpurun/";
inline constexpr std::string_view kGenPrefix = "gpurun/gen/";
std::string start(int64_t generation);
std::string joined(int64_t generation, int rank);
std::string report(int64_t generation, int64_t round, int rank);
std::string decision(int64_t generation, int64_t round);
/// Written by gpurun when a participant of `generation` died before the generation was
/// established; value: the reason. Communicators of that generation stop waiting on it.
std::string abort(int64_t generation);
std::string parked(int gpu, int64_t park_generation);
std::string wake(int gpu, int64_t park_generation);
/// Written once by each participant (member or leaver) of a resize into generation
/// `generation` when its part is done: its phase timestamps (docs/control-protocol.md#resize-
/// timings). gpurun reads and deletes it.
std::string timing(int64_t generation, int gpu);
/// A warm joiner (spawned with GPURUN_WARM=<w> before any decision names it): its pid, written
/// once it is ready (model built, data loaded: its first epochs()/steps() call).
std::string ready(int gpu, int64_t warm);
/// gpurun's answer to a warm joiner: the decision that created the generation it joins, or
/// {"v":1,"kind":"exit",...} when it is not needed after all.
std::string admit(int gpu, int64_t warm);
/// gpurun's word to a standby (a warm joiner spawned with GPURUN_STANDBY=1 after a release-mode
/// leaver of its slot exited, before any config wants the slot): "go" once a config names the
/// slot (it then sets up its device and gets ready as any warm joiner), or
/// {"v":1,"kind":"exit",...}. The standby reads it when its program first needs the device.
std::string go(int gpu, int64_t warm);
/// The program's own error (its text), written by the worker of `gpu` with pid `pid` just
/// before that error ends it: gpurun fails the job on its exit instead of going on without it.
std::string program_error(int gpu, int64_t pid);
/// The store prefix of generation g's communicator for `purpose` ("train": the generation's
/// own; "handoff": the state source's group with the joiners): the executor's rendezvous keys
/// (Gloo's, NCCL's unique id, torch.distributed's PrefixStore) live under it.
std::string comm(int64_t generation, std::string_view purpose);
/// The store prefix of a static job's (no elastic control) communicator in restart attempt
/// `restart`: "gpurun/static/<restart>/comm/train".
std::string static_comm(int64_t restart);
/// Under a communicator's prefix: `rank` reached its set-up (WorkerSession::wait_arrivals).
std::string arrived(std::string_view comm_prefix, int rank);
/// A slot's own small data that outlives its process within one restart attempt (the Python
/// package's per-slot RNG streams): WorkerSession::put_slot_data.
std::string slot_data(int64_t restart, int gpu, std::string_view name);
inline constexpr std::string_view kGeneration = "gpurun/generation";

// ---- the program's energy questions (docs/control-protocol.md#energy-questions) -----------

/// The n-th energy question (n = 0, 1, …) of the worker of slot `gpu` with pid `pid`: a
/// control::EnergyQuestion's JSON (gpurun/control/energy_question.hpp). Node 0's gpurun reads
/// and deletes it; it answers (all but `begin`) under energy_answer.
std::string energy_ask(int gpu, int64_t pid, int64_t n);
/// gpurun's answer to that question (JSON, docs/control-protocol.md#energy-questions); the
/// worker reads and deletes it.
std::string energy_answer(int gpu, int64_t pid, int64_t n);
/// An energy question's key, typed.
struct EnergyAsk {
  int gpu = -1;
  int64_t pid = -1;
  int64_t n = -1;
  friend bool operator==(const EnergyAsk&, const EnergyAsk&) = default;
};
/// nullopt for any key that is not an energy question (answers included).
std::optional<EnergyAsk> parse_energy_ask(std::string_view key);

// ---- one elastic job over several nodes (gpurun/control/node_messages.hpp) --------------------

/// Node 0 (elastic mode) writes its run id here at its start: a gpurun joining as another node
/// finds an elastic job (and which) by it.
std::string node_job();
/// The counter (store ADD) a joining node takes its node id from: 1, 2, … (never reused).
std::string node_next();
/// Node k's NodeJoin record, written once when it joins.
std::string node_join(int node);
/// Node 0's answer to node k's join, written once: "admitted", or "refused: <why>" (beyond
/// --nnodes MAX). The joining node waits for it before it says that it joined.
std::string node_answer(int node);
/// The local slots node k offers now, "0,1" (control::join_ids); "" = none (it is leaving).
/// Node k rewrites it when its config changes; node 0 reads the latest value.
std::string node_offer(int node);
/// Node k is leaving the job (its gpurun got SIGTERM or SIGINT): value = the signal. Its
/// slots leave at the next boundary; once none has a process node 0 sends it `release`.
std::string node_leave(int node);
/// Node 0's n-th NodeCommand to node k (n = 0, 1, …).
std::string node_command(int node, int64_t n);
/// Node k's n-th NodeEvent to node 0 (n = 0, 1, …).
std::string node_event(int node, int64_t n);
/// Node k's heartbeat: a counter its gpurun advances every heartbeat_interval(--node-timeout)
/// (gpurun/control/heartbeat.hpp); node 0 gives node k up when it has not changed for
/// --node-timeout (a cut link, a stopped or hung host: its store connection stays open).
std::string node_beat(int node);
/// The n-th severed address of the job (n = 0, 1, …), written by node 0 when it gave up a node
/// whose address no live node shares: every worker of that generation (or an earlier one) shuts
/// down its TCP connections to that address (worker_runtime/engine: SeverWatch), which fails a
/// collective blocked on the lost node's workers at once (a cut link delivers no reset). Value:
/// sever_value(); parse_sever() reads it.
std::string sever(int64_t n);
/// A severed address: "<generation> <ip>".
struct Sever {
  int64_t generation = -1;
  std::string address;  ///< an IPv4 or IPv6 address, as inet_pton reads it
  friend bool operator==(const Sever&, const Sever&) = default;
};
std::string sever_value(const Sever& s);
/// nullopt when `value` is not sever_value()'s form.
std::optional<Sever> parse_sever(std::string_view value);
/// Node k's liveness key (store::kLivePrefix, bound to its gpurun's store connection) and the
/// key the store writes when that connection closed (store::kLostPrefix).
std::string node_live(int node);
std::string node_lost(int node);

/// A write under gpurun/ that node 0's node hub handles, typed.
struct NodeWrite {
  enum class Kind { kJoin, kOffer, kLeave, kEvent, kLost, kBeat };
  Kind kind = Kind::kJoin;
  int node = -1;
  int64_t n = -1;  ///< kEvent: its sequence number
  friend bool operator==(const NodeWrite&, const NodeWrite&) = default;
};
/// nullopt for any key that is not a node's join, offer, leave, event, lost or heartbeat key (node
/// ids >= 1).
std::optional<NodeWrite> parse_node_write(std::string_view key);

// ---- what a worker writes, typed ------------------------------------------------------------

/// gpurun/gen/<g>/joined/<rank> = its pid (decimal; -1 when the value is not a number).
struct Joined {
  int64_t generation = -1;
  int rank = -1;
  int pid = -1;
  friend bool operator==(const Joined&, const Joined&) = default;
};
/// gpurun/gen/<g>/round/<n>/report/<rank> = a Report naming the same generation, round, rank.
struct Reported {
  Report report;
  friend bool operator==(const Reported&, const Reported&) = default;
};
/// gpurun/slot/<gpu>/parked/<p>: the hold-mode leaver of `gpu` parked, waits on its wake key.
struct Parked {
  int gpu = -1;
  int64_t park_generation = -1;
  friend bool operator==(const Parked&, const Parked&) = default;
};
/// gpurun/slot/<gpu>/ready/<w>: the warm joiner `w` of `gpu` is ready (value: its pid).
struct Ready {
  int gpu = -1;
  int64_t warm = -1;
  friend bool operator==(const Ready&, const Ready&) = default;
};
/// gpurun/slot/<gpu>/error/<pid> = the program's own error text that ends that process.
struct ProgramError {
  int gpu = -1;
  int64_t pid = -1;
  std::string text;
  friend bool operator==(const ProgramError&, const ProgramError&) = default;
};
/// gpurun/gen/<g>/timing/<gpu> = a participant's resize timing record (ResizeTimeline's JSON):
/// its part of the resize into `generation` is done. Read once: gpurun deletes the key.
struct Timing {
  int64_t generation = -1;
  int gpu = -1;
  std::string record;
  friend bool operator==(const Timing&, const Timing&) = default;
};
using WorkerWrite = std::variant<Joined, Reported, Parked, Ready, ProgramError, Timing>;

/// The worker's write of `key` = `value`, typed; nullopt for any other key (gpurun's own
/// writes, communicator keys, keys of no meaning to gpurun). Throws ProtocolError for a report
/// whose value does not parse or names another generation, round or rank than its key (the
/// message names the key). Numbers in gpurun/gen/ keys are non-negative decimals; a key with
/// anything after its last number is another key.
std::optional<WorkerWrite> parse_worker_write(std::string_view key, std::string_view value);

/// The key a worker writes for `w` (the inverse of parse_worker_write's key part).
std::string key_of(const WorkerWrite& w);

}  // namespace gpurun::control::keys
