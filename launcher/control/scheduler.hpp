// gpurun::control::Scheduler — the supervisor's boundary logic, pure (no I/O,
// no clock): desired config + reports + process exits in, effects out.
// Protocol: docs/control-protocol.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "control/config.hpp"
#include "control/decision_rule.hpp"
#include "control/effects.hpp"
#include "control/slot_state.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/control/keys.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/json_writer.hpp"

namespace gpurun::control {

/// Everything known about one slot.
struct SlotInfo {
  int gpu = 0;
  SlotState state = SlotState::kParked;
  int64_t generation = -1;       ///< generation it last joined or was assigned to
  int rank = -1;                 ///< rank in `generation` while a member, else -1
  int pid = -1;                  ///< live process, -1 when none
  int64_t park_generation = -1;  ///< hold mode: its wake key's generation
  int64_t woken_from = -1;       ///< hold mode: park generation it was woken from (keys to drop)
  bool will_exit = false;        ///< its process is expected to exit 0 (release / exit wake)
  std::optional<std::pair<int64_t, int64_t>> last_boundary;  ///< (epoch, step) last reported
  std::string reason;                                        ///< why it is FAILED / last change
  /// Its process has the current training state: every member of a fresh start, a continuing
  /// member, a joiner once it reported in its generation (after the handoff). Not a joiner
  /// that only joined (read its start record) — that is before the handoff.
  bool holds_state = false;
  /// A joiner's set-ups abandoned in a row (it reported without the state each time); reset
  /// when it holds the state or a new process starts for the slot.
  int failed_joins = 0;
  /// Warm joiner (WARMING, or REJOINING after its admission until it joined): its id, -1 when
  /// none. Its ready/admit keys are deleted when it joined or its process ended.
  int64_t warm_id = -1;
  bool warm_ready = false;      ///< WARMING: it wrote its ready key (waits for its admission)
  bool warm_late_said = false;  ///< WARMING: a boundary went by without it (said once)
  bool floor_kept_said =
      false;               ///< a member kept past its leave for `[policy] min_gpus` (said once)
  bool cancelled = false;  ///< PARKED: a warm joiner killed because it is no longer wanted
  /// Its last process left in release mode and exited 0: the slot may get a standby.
  bool released = false;
  /// A standby of this slot ended on its own: none is started again in this attempt.
  bool no_standby = false;
  /// The program's own error its live process said it dies of (keys::program_error): its
  /// exit then fails the job (as under torchrun) instead of being gone on without.
  std::string program_error;
  /// Its node is leaving or was lost (withdraw_slots): nothing is started for it again.
  bool withdrawn = false;
};

/// A boundary round that every live member has reported, about to be decided.
struct BoundaryInfo {
  int64_t generation = 0;
  int64_t round = 0;
  int64_t epoch = 0;        ///< as reported: step 0 = the end of epoch `epoch`
  int64_t step = 0;         ///< > 0: a `[boundary] every = N` boundary inside the epoch
  std::vector<int> active;  ///< the generation's active set (the ranks that trained)
  int64_t time_ms = 0;      ///< latest report's Unix time (ms); 0 when no report gave one
};

/// A member that has not reached the open boundary round after `[boundary] deadline_s` and is
/// running (not stopped): it runs the program's own code (validation, a checkpoint) and is
/// waited for, as DDP would (docs/config.md#boundary).
struct LateRank {
  int gpu = 0;
  int rank = -1;
  int pid = -1;  ///< -1: unknown
};

/// The open boundary round while it waits past its deadline for running ranks.
struct BoundaryWait {
  int64_t generation = 0;
  int64_t round = 0;
  std::optional<std::pair<int64_t, int64_t>> boundary;  ///< (epoch, step) the others reported
  /// Since the round's first report, as counted by the deadline timer (the deadline, then
  /// every repeat): a lower bound between two expiries.
  std::chrono::milliseconds waited{0};
  std::chrono::milliseconds deadline{0};  ///< `[boundary] deadline_s`
  /// The round's first report's time (Unix ms, Report::time_ms); 0 when it gave none.
  int64_t first_report_ms = 0;
  size_t reported = 0;  ///< ranks that reported
  size_t of = 0;        ///< the generation's active ranks
  std::vector<LateRank> late;
};

/// Boundary decisions for one node's slots. Not thread-safe; the controller calls it from
/// the supervisor's io thread. Every state change goes through transition() and produces a
/// `worker_state` event effect.
class Scheduler {
 public:
  /// `slots`: every slot id a config may name (with --device cuda every visible GPU, with
  /// --device cpu 0..nproc-1). `config`: the initial good config. `launch`: the set used
  /// while `active_gpus` is absent (the first --nproc slots); nullopt = every slot.
  Scheduler(std::vector<int> slots, Config config,
            std::optional<std::vector<int>> launch = std::nullopt);

  /// Slots of a node that joined the job (job slot ids, control/node_messages.hpp): PARKED with
  /// no process, ids a config may name from now on. Ids already known are ignored.
  void add_slots(const std::vector<int>& ids);
  /// Slots of a node that is leaving the job or was lost: no standby or warm joiner is started
  /// for them again, and a standby of theirs is ended (their process effects would go to a node
  /// that is going).
  void withdraw_slots(const std::vector<int>& ids);

  /// Starts generation 0 (first attempt) or a new generation after a whole-set restart:
  /// every slot is reset, members of the desired set are spawned (STARTING).
  void start_attempt(int attempt);

  /// A new good config: becomes the desired plan. Applied at the next boundary, or at once
  /// when the job is paused (resume).
  void config_loaded(Config config, const std::string& path);
  /// A rejected config: recorded (last_config_error) and logged; nothing else changes.
  void config_rejected(const std::string& path, const std::string& error);

  /// A worker's write to the store (keys::parse_worker_write): the one router of them, to the
  /// handlers below. A Timing record's key is deleted (read once) and that participant's
  /// set-up is done (on_setup_done); the record itself is the caller's (ResizeTimeline).
  void on(const keys::WorkerWrite& write);

  /// `gpurun/gen/<g>/joined/<rank>` was written with `pid`.
  void on_joined(int64_t generation, int rank, int pid);
  /// A boundary report (already parsed). Stale or foreign reports are ignored (kSay effect).
  void on_report(const Report& report);
  /// `gpurun/slot/<gpu>/parked/<p>` was written (hold mode).
  void on_parked(int gpu, int64_t park_generation);
  /// `gpurun/slot/<gpu>/ready/<w>` was written: the warm joiner `w` of `gpu` is ready (built,
  /// loaded, waiting): the next boundary decision admits it (at once while paused).
  void on_ready(int gpu, int64_t warm);
  /// `gpurun/slot/<gpu>/error/<pid>` was written: that process dies of the program's own error
  /// `text` (docs/control-protocol.md#keys); ignored for another pid than the slot's.
  void on_program_error(int gpu, int64_t pid, const std::string& text);
  /// The deadline armed for (generation, round) expired; round kSetUpRound: the set-up
  /// deadline of `generation` (`[boundary] setup_deadline_s`, armed when a resize is decided).
  void on_deadline(int64_t generation, int64_t round);
  static constexpr int64_t kSetUpRound = -1;
  /// A joiner whose set-up was abandoned this many times in a row is given up (FAILED, its
  /// process killed): without the bound a set-up that fails at once every time is decided
  /// again and again at the machine's speed.
  static constexpr int kMaxFailedJoins = 5;
  /// Whether process `pid` is stopped (its /proc state T: SIGSTOP, ptrace), for the set-up
  /// deadline: only a stopped participant is killed there. Empty: none is (the controller sets
  /// the real probe; tests a fake).
  std::function<bool(int pid)> stalled_probe;
  /// How often a boundary round past its deadline says again who it waits for: every
  /// `[boundary] deadline_s`, but not more often than this (a deadline of a few ms would
  /// otherwise print lines at the machine's speed).
  static constexpr std::chrono::milliseconds kLateRepeatFloor{1000};
  /// The open round while it waits past its deadline for running (not stopped) ranks: who,
  /// for how long, k of n reported (gpurun status). nullopt before the round's deadline
  /// expired, or when every live member reported.
  std::optional<BoundaryWait> boundary_wait() const;
  /// Ranks killed at a boundary deadline in this job (stopped: SIGSTOP, a debugger), one
  /// phrase each: "gpu 1 (rank 1 of generation 2, pid 1234)".
  const std::vector<std::string>& deadline_kills() const { return deadline_kills_; }
  /// The job's final console line (without "gpurun: ") when a rank was killed at a boundary
  /// deadline: "finished (exit 0); note: 1 rank was killed at a boundary deadline: gpu 1 …";
  /// empty when none was (a job that lost a rank never ends quietly).
  std::string final_line(int exit_code) const;
  /// `gpurun/gen/<g>/timing/<gpu>` was written: that participant finished its part of the
  /// resize into `generation` (its set-up is done).
  void on_setup_done(int64_t generation, int gpu);
  /// A process was started for `gpu` (after a kSpawn effect, or by the supervisor).
  void on_spawned(int gpu, int pid);
  /// A slot's process ended. `clean` = exit code 0. `can_restart` = the supervisor would
  /// restart the whole set for this failure. Returns true when the exit is absorbed by
  /// elastic mode (a parked leaver, or a failure that only removes the slot); false when
  /// the supervisor must treat it as before (success, or failure -> teardown/restart).
  /// A member's exit 0 means it finished training: the job is finishing, and every report
  /// of the open round (now or later) is answered with an `exit` decision.
  bool on_process_exit(int gpu, bool clean, const std::string& how, bool can_restart);

  /// Whether the job must stay up with no process running (paused, waiting for a resume).
  bool holds_job_open() const;
  /// Whether the job is finishing: a member finished training (exit 0), or every member
  /// failed.
  bool finished() const { return finished_; }

  /// Called once per boundary round when every live member has reported, before the round is
  /// decided (the energy monitor closes its window here). A returned sentence stops the job at
  /// this boundary: the round is answered with `exit` (workers leave their epochs() loop
  /// normally), parked workers are told to exit, and stop_reason() keeps the sentence.
  std::function<std::optional<std::string>(const BoundaryInfo&)> on_boundary;
  /// The preemption warning (docs/cli.md#preemption): the next `continue` or `resize` decision
  /// carries `checkpoint: true` (every rank sees it at that boundary).
  void request_checkpoint() { checkpoint_pending_ = true; }
  /// What the next boundary would decide now (compute_decision over the current state), with
  /// the reasons; nothing is published, said or changed. The open round's reports stand for
  /// themselves, a member that has not reported yet (or every member, between rounds) as if it
  /// reported at the last boundary; a pause snapshot being written counts as written. nullopt when
  /// no boundary decision can come: the job is finished or stopping, or no live member trains (no
  /// generation yet, paused).
  std::optional<DecisionOutcome> would_decide() const;
  /// SIGTERM: the next complete boundary round is answered with `exit` (parked workers are told
  /// to exit), as for on_boundary's stop; stop_reason() keeps `why`. Returns false when no
  /// boundary will come (finished, or paused with no member).
  bool request_stop(const std::string& why);
  /// Why the job was stopped through on_boundary or request_stop; empty when it was not.
  const std::string& stop_reason() const { return stop_reason_; }
  /// Set when a member finished training (exited 0) while other members reached a boundary to
  /// go on: the ranks' programs disagree on how long to train (e.g. another --epochs on one
  /// node). The sentence names both sides; empty otherwise.
  const std::string& disagreement() const { return disagreement_; }
  /// Set when every process that held the training state died before handing it on and no
  /// pause snapshot of the current position exists: the job stops (non-zero exit status)
  /// with this sentence; empty otherwise.
  const std::string& state_lost() const { return state_lost_; }
  /// Why the pause the config asks for is refused (its snapshot could not be written; tried
  /// again at every boundary); empty when no pause is refused.
  const std::string& pause_refused() const { return pause_refused_; }
  /// The last boundary any member reported (epoch, step); nullopt before the first.
  const std::optional<std::pair<int64_t, int64_t>>& last_boundary() const { return last_boundary_; }

  /// Several nodes (docs/cli.md#elastic-nodes): whether a resume onto `target` may be decided
  /// now — every node of `target` has the pause snapshot (snapshot_node() wrote it; the others
  /// need a copy). False: the resume waits; call try_resume() once it may go. Empty: always.
  std::function<bool(const std::vector<int>& target)> resume_gate;
  /// Paused: resumes if the config wants a set and every one of it is ready (warm joiners, the
  /// resume gate); otherwise nothing.
  void try_resume() {
    if (holds_job_open()) resume();
  }
  /// The node whose slot wrote the last verified pause snapshot (control::slot_node), -1 when
  /// none was written; snapshot_serial() counts them (a new one makes every copy stale).
  int snapshot_node() const { return snapshot_slot_ < 0 ? -1 : slot_node(snapshot_slot_); }
  int64_t snapshot_serial() const { return snapshot_serial_; }
  /// Several nodes: no copy of the pause snapshot can be read again (`where`: on which lost
  /// node it was and why it cannot come back, from "is on …"). While the job is paused and that
  /// snapshot is the only holder of the training state (no process holds it), the state is lost
  /// now, as state_lost() says; returns whether it was. Otherwise nothing.
  bool snapshot_unreachable(const std::string& where);

  /// Takes the effects produced so far (run_effects in control/effects.hpp carries them out).
  std::vector<Effect> take_effects();

  // --- read access for status and tests ------------------------------------------
  int64_t generation() const { return generation_; }
  int64_t round() const { return round_; }
  const std::vector<int>& active() const { return active_; }
  /// Desired set (config; the launch set when absent), without removing FAILED slots.
  std::vector<int> desired() const;
  /// What the next decision aims for: desired() minus FAILED slots (docs/control-protocol.md).
  std::vector<int> effective_desired() const;
  const Config& config() const { return config_; }
  const std::map<int, SlotInfo>& slots() const { return slots_; }
  const std::string& last_config_error() const { return last_config_error_; }
  /// The last decision published, as its JSON (status.json); empty before the first.
  std::string last_decision() const { return last_decision_ ? last_decision_->to_json() : ""; }

 private:
  SlotInfo& slot(int gpu);
  void set_state(SlotInfo& s, SlotState to, const std::string& reason);
  bool member(const SlotInfo& s) const;
  /// Who holds the training state now, for messages: the members, or the pause snapshot
  /// (with its boundary).
  std::string held_by() const;
  bool alive_member(const SlotInfo& s) const;
  void try_decide();
  /// The open round's facts for compute_decision (control/decision_rule.hpp).
  DecisionInput decision_input() const;
  /// compute_decision over the open round, carried out: its console lines, keys and slots.
  void decide();
  void resume();
  // Warm joiners: spawns one for every wanted slot that has no process (docs/control-protocol.md
  // #warm-joiners), ends those no longer wanted (or every one when the job is finishing).
  // Standbys ([park] standby, docs/control-protocol.md#standby): started for released slots
  // no config wants, told to go (WARMING) once one does, ended when the job finishes.
  void warm_up();
  void spawn_warm(SlotInfo& s, const std::vector<int>& want, bool standby);
  void cancel_warming(SlotInfo& s, const std::string& why, bool quiet = false);
  void drop_warm_keys(SlotInfo& s);
  /// A parked slot's process is gone: its parked and wake keys go (nobody will read them).
  void drop_park_keys(SlotInfo& s);
  void bring_in(SlotInfo& s, const Decision& d);
  // The `decision` event for the event log.
  void decision_event(const Decision& d);
  // Asks the supervisor to start a process on `gpu` that joins `generation` by reading
  // `d` (the decision that created it).
  void spawn_effect(int gpu, int64_t generation, const Decision& d);
  // A joiner of `d`. Only a slot joinable_now() can be one: a slot whose previous process is
  // still exiting is never named by a decision (it would be a member with no process, and
  // the members' loss would read as the training state's), it joins once warm.
  void admit(SlotInfo& s, const Decision& d);
  // Writes `d` under `decision_key` (none when empty) and, for a new generation, its start
  // record; the decision event; the console line.
  void publish(const Decision& d, const std::string& decision_key);
  // A kWriteKey effect whose value is `d` (encoded where the effects are run).
  void write_decision(std::string key, const Decision& d);
  void begin_finish(const SlotInfo& s, const std::string& how);
  // After a member finished training: reports of the open round mean that the others go on.
  void check_disagreement();
  void publish_exit();
  void remember_round();
  void moved_on(int gpu);
  void collect_keys();
  void delete_key(std::string key);
  /// Ends every warm joiner and standby and tells every parked process to exit; says one line
  /// naming them ("ending warming node 1 gpu 0 (pid 7); telling parked gpu 2 (pid 8) to exit:
  /// WHY") unless `say_it` is false, and returns it without the reason ("" when none).
  std::string wake_all_parked_to_exit(const std::string& why, bool say_it = true);
  void check_all_gone();
  // A participant of the current generation died: tell everyone still in its set-up to stop
  // waiting (the abort key), and stop the job when nobody holds the state any more.
  void participant_died(const SlotInfo& s, int pid, const std::string& how);
  // Whether the pause snapshot holds the state of the current position.
  bool snapshot_current() const;
  // The state source's report after a `snapshot` decision: verified, or the pause is refused.
  void pause_snapshot_outcome(const Report& r);
  void lose_state(const std::string& why);
  // Whether a live process still holds the state (a member, or the leaving state source).
  bool holder_alive(int besides = -1) const;  // `besides`: a slot not to count
  Decision base_decision() const;
  void say(std::string text);
  /// Arms the open round's boundary deadline timer (kArmDeadline) to expire after `after`.
  void arm_boundary_deadline(std::chrono::milliseconds after);
  /// The console line naming the running ranks a round past its deadline waits for.
  std::string late_line(const std::vector<int>& gpus) const;

  /// A decided round whose keys (reports, decision) still exist: deleted once every
  /// reporter showed it read the decision (docs/control-protocol.md#key-lifetime).
  struct DecidedRound {
    int64_t generation = 0;
    int64_t round = 0;
    std::vector<int> ranks;   ///< report keys written
    std::vector<int> unread;  ///< gpus that reported and may still read the decision (sorted)
  };

  std::vector<int> slot_ids_;
  std::vector<int> launch_;
  std::map<int, SlotInfo> slots_;
  Config config_;
  int64_t generation_ = -1;  ///< -1 before the first attempt
  int64_t round_ = 0;
  std::vector<int> active_;
  std::map<int, Report> reports_;  ///< rank -> report of the open round
  bool deadline_armed_ = false;
  std::chrono::milliseconds deadline_armed_for_{0};  ///< the armed timer's duration
  std::chrono::milliseconds deadline_waited_{0};     ///< expired timers' durations, this round
  int64_t first_report_ms_ = 0;                      ///< the open round's first report's time_ms
  std::vector<std::string> deadline_kills_;          ///< deadline_kills()
  bool finished_ = false;
  bool exit_published_ = false;  ///< the open round was answered with `exit`
  /// The exit decision's reason code (Decision::reason: "stop", "early_stop", "finished",
  /// "state_lost", "failed"); empty = unknown.
  std::string exit_reason_;
  std::vector<DecidedRound> decided_;
  std::map<int64_t, int> generation_keys_;  ///< generation -> |active|: start/joined keys exist
  bool state_exists_ = false;               ///< some worker ever joined (state to keep)
  std::optional<std::pair<int64_t, int64_t>> last_boundary_;
  std::string last_config_error_;
  std::optional<Decision> last_decision_;
  std::string stop_reason_;
  std::string stop_pending_;         ///< request_stop's reason until a round is complete
  bool checkpoint_pending_ = false;  ///< request_checkpoint() until a decision carries it
  std::string state_lost_;
  std::string finisher_;       ///< "gpu 1 (rank 1)": the member whose exit 0 finished the job
  std::string disagreement_;   ///< disagreement()
  std::string pause_refused_;  ///< why the last pause's snapshot failed ("" once one succeeds)
  /// Boundary at which the pause snapshot failed: training goes on from it; the next boundary
  /// tries again.
  std::optional<std::pair<int64_t, int64_t>> refused_at_;
  bool snapshot_round_ = false;  ///< the open round re-reports a boundary after `snapshot`
  std::set<int> established_;    ///< gpus that joined or reported in generation_ since its decision
  /// The open resize's participants whose set-up is not done yet (no timing record, no report
  /// in generation_): killed when its set-up deadline expires.
  std::set<int> setup_pending_;
  std::set<int64_t> aborted_;     ///< generations whose abort key was written
  int source_gpu_ = -1;           ///< slot of the current generation's state source (a peer), -1
  bool source_snapshot_ = false;  ///< the current generation's state comes from the snapshot
  /// Boundary (epoch, step) at which the pause snapshot was taken; nullopt when none.
  std::optional<std::pair<int64_t, int64_t>> snapshot_boundary_;
  int snapshot_slot_ = -1;            ///< the slot that wrote the last verified pause snapshot
  int64_t snapshot_serial_ = 0;       ///< verified pause snapshots written so far
  int64_t snapshot_generation_ = -1;  ///< the generation that wrote the last one
  std::vector<Effect> effects_;
  int64_t next_warm_ = 0;  ///< the next warm joiner's id (unique for the Scheduler's life)
};

}  // namespace gpurun::control
