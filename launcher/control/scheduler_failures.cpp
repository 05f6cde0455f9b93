// Scheduler: process exits, deadlines (boundary and set-up), a participant's death and the
// training state lost (docs/control-protocol.md#failures-during-a-resize).
#include "control/scheduler.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/text_block.hpp"

namespace gpurun::control {

void Scheduler::on_setup_done(int64_t generation, int gpu) {
  if (generation != generation_) return;
  setup_pending_.erase(gpu);
  // A member's resize record comes when it is past the set-up: the handoff done and the
  // checksums compared, it trains. A death after every member's record is a failure in
  // training, not of the set-up (no abort key), and a joiner holds the state from here on.
  SlotInfo& s = slot(gpu);
  if (!alive_member(s)) return;
  established_.insert(gpu);
  s.holds_state = true;
  state_exists_ = true;
}

void Scheduler::on_deadline(int64_t generation, int64_t round) {
  if (round == kSetUpRound) {
    if (generation != generation_ || finished_) return;
    // Only a participant that is stopped (stalled_probe: SIGSTOP, a debugger) is given up on:
    // the others still in their set-up are waiting for it, and killing them would lose the
    // state. One that is running but hung is left to the communicators' timeout.
    std::vector<int> waiting, stopped;
    for (int gpu : setup_pending_) {
      const SlotInfo& s = slot(gpu);
      if (s.pid < 0 || s.state == SlotState::kFailed || s.state == SlotState::kExited) continue;
      waiting.push_back(gpu);
      if (stalled_probe && stalled_probe(s.pid)) stopped.push_back(gpu);
    }
    if (stopped.empty()) {
      if (!waiting.empty())
        say(fmt::format(
            "the set-up of generation {} is not finished after {} ms ([boundary] "
            "setup_deadline_s): gpus [{}] are still in it and none of them is stopped; waiting "
            "(a hung collective ends at the communicators' timeout, GPURUN_COMM_TIMEOUT_MS)",
            generation, config_.setup_deadline.count(), join_ids(waiting, ", ")));
      setup_pending_.clear();
      return;
    }
    for (int gpu : stopped) {
      SlotInfo& s = slot(gpu);
      setup_pending_.erase(gpu);
      if (s.holds_state) {
        if (!snapshot_current() && !holder_alive(/*besides=*/gpu)) {
          say(fmt::format(
              "{} (pid {}) is stopped in the set-up of generation {} but holds the only copy "
              "of the training state: not killed (SIGCONT it to go on; killing it loses the "
              "state)",
              slot_name(gpu), s.pid, generation));
          continue;
        }
      }
      set_state(s, SlotState::kFailed,
                fmt::format("stopped in the set-up of generation {} for more than {} ms",
                            generation, config_.setup_deadline.count()));
      say(fmt::format(
          "{} (pid {}) is stopped and did not finish the set-up of generation {} within {} "
          "ms ([boundary] setup_deadline_s): killing it, the others go on without it",
          slot_name(gpu), s.pid, generation, config_.setup_deadline.count()));
      deadline_kills_.push_back(
          fmt::format("{} (pid {}, stopped in the set-up of generation {} for more than {} "
                      "ms, [boundary] setup_deadline_s)",
                      slot_name(gpu), s.pid, generation, config_.setup_deadline.count()));
      Effect e;
      e.kind = Effect::Kind::kKill;
      e.gpu = gpu;
      effects_.push_back(std::move(e));
    }
    return;
  }
  if (generation != generation_ || round != round_ || !deadline_armed_) return;
  deadline_waited_ += deadline_armed_for_;
  // A late rank that is running is doing the program's own work between boundaries (rank-0
  // validation, a checkpoint): it is waited for, as DDP would, and said again every
  // deadline_s. Only a stopped one (stalled_probe: SIGSTOP, a debugger) is declared stalled
  // and killed, and the round is decided without it. A pid that cannot be probed (none known,
  // no probe): waited for.
  std::vector<int> running;
  for (int gpu : active_) {
    SlotInfo& s = slot(gpu);
    if (!alive_member(s) || reports_.count(s.rank)) continue;
    if (s.pid < 0 || !stalled_probe || !stalled_probe(s.pid)) {
      running.push_back(gpu);
      continue;
    }
    // deadline_waited_: how long this round has waited (every expiry), not only deadline_s
    set_state(s, SlotState::kFailed,
              fmt::format("stopped and stalled past the boundary deadline of {} ms (generation "
                          "{}, round {}, {} of {} ranks reported, {} ms waited)",
                          config_.boundary_deadline.count(), generation, round, reports_.size(),
                          active_.size(), deadline_waited_.count()));
    say(fmt::format(
        "{} (rank {}, pid {}) did not reach boundary round {} of generation {} within {} ms "
        "and is stopped (SIGSTOP or a debugger): killing it and deciding without it",
        slot_name(gpu), s.rank, s.pid, round, generation, deadline_waited_.count()));
    deadline_kills_.push_back(
        fmt::format("{} (rank {} of generation {}, pid {}, stopped at "
                    "boundary round {} after {} ms)",
                    slot_name(gpu), s.rank, generation, s.pid, round, deadline_waited_.count()));
    Effect e;
    e.kind = Effect::Kind::kKill;
    e.gpu = gpu;
    effects_.push_back(std::move(e));
  }
  if (!running.empty()) {
    say(late_line(running));
    arm_boundary_deadline(std::max(config_.boundary_deadline, kLateRepeatFloor));
  }
  if (!finished_) try_decide();
  check_all_gone();
}

void Scheduler::arm_boundary_deadline(std::chrono::milliseconds after) {
  deadline_armed_for_ = after;
  Effect e;
  e.kind = Effect::Kind::kArmDeadline;
  e.generation = generation_;
  e.round = round_;
  e.deadline = after;
  effects_.push_back(std::move(e));
}

namespace {
// Seconds as a config would write them: 2, 0.5, 1.25.
std::string seconds_text(std::chrono::milliseconds ms) {
  return fmt::format("{:g}", static_cast<double>(ms.count()) / 1000.0);
}
}  // namespace

std::string Scheduler::late_line(const std::vector<int>& gpus) const {
  std::string who;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const SlotInfo& s = slots_.at(gpus[i]);
    who += fmt::format("{}{} (rank {}, pid {})",
                       i == 0                 ? ""
                       : i + 1 == gpus.size() ? " and "
                                              : ", ",
                       slot_name(s.gpu), s.rank, s.pid >= 0 ? std::to_string(s.pid) : "unknown");
  }
  const bool one = gpus.size() == 1;
  std::string where;
  if (!reports_.empty()) {
    const Report& r = reports_.begin()->second;
    where = fmt::format("; the others wait at the boundary {}", boundary_text(r.epoch, r.step));
  }
  return fmt::format(
      "{} {} not reached boundary round {} of generation {} after {:.1f} s ([boundary] "
      "deadline_s = {}; {} of {} ranks reported{}): {} running the program's own code (not "
      "stopped); waiting for {}, as DDP would",
      who, one ? "has" : "have", round_, generation_,
      static_cast<double>(deadline_waited_.count()) / 1000.0,
      seconds_text(config_.boundary_deadline), reports_.size(), active_.size(), where,
      one ? "it is" : "they are", one ? "it" : "them");
}

std::optional<BoundaryWait> Scheduler::boundary_wait() const {
  if (!deadline_armed_ || deadline_waited_.count() == 0) return std::nullopt;
  BoundaryWait w;
  for (int gpu : active_) {
    const SlotInfo& s = slots_.at(gpu);
    if (alive_member(s) && !reports_.count(s.rank)) w.late.push_back(LateRank{gpu, s.rank, s.pid});
  }
  if (w.late.empty()) return std::nullopt;
  w.generation = generation_;
  w.round = round_;
  if (!reports_.empty())
    w.boundary = std::make_pair(reports_.begin()->second.epoch, reports_.begin()->second.step);
  w.waited = deadline_waited_;
  w.deadline = config_.boundary_deadline;
  w.first_report_ms = first_report_ms_;
  w.reported = reports_.size();
  w.of = active_.size();
  return w;
}

std::string Scheduler::final_line(int exit_code) const {
  if (deadline_kills_.empty()) return "";
  const size_t n = deadline_kills_.size();
  std::string list;
  for (size_t i = 0; i < n; ++i) list += (i ? "; " : "") + deadline_kills_[i];
  return fmt::format(
      "finished (exit {}); note: {} rank{} {} killed at a deadline ([boundary] deadline_s or "
      "setup_deadline_s; the job went on without {}): {}",
      exit_code, n, n == 1 ? "" : "s", n == 1 ? "was" : "were", n == 1 ? "it" : "them", list);
}

namespace {
/// A member ended after the program's own error: the job fails. A multi-line error (a
/// DataLoader worker's traceback) keeps its lines, each under the slot's prefix, bounded (40
/// lines, 4 KiB, the real error last).
std::string program_error_text(int gpu, int rank, int64_t generation, int pid,
                               const std::string& how, const std::string& program_error) {
  const bool lines = program_error.find('\n') != std::string::npos;
  std::string text = fmt::format(
      "{} (rank {} of generation {}, pid {}) ended with {} after the program's own "
      "error{}; the job fails (gpurun.elastic(drop_on_error=True) / "
      "Runtime(drop_on_error=True) would go on without the rank)",
      slot_name(gpu), rank, generation, pid, how, lines ? " (below)" : ": " + program_error);
  if (lines) {
    text += "\n" + text_block(program_error, fmt::format("gpurun:   {} | ", slot_name(gpu)));
    text.pop_back();  // say() ends the last line
  }
  return text;
}

/// Whether a program's error is a KeyboardInterrupt (its process got SIGINT).
bool interrupted(const std::string& program_error) {
  return program_error.rfind("KeyboardInterrupt", 0) == 0;
}

/// The end of the line said after a rank's exit the job absorbs: whether it goes on, or only
/// the leaving state source (`source_gpu`) still holds the training state.
std::string goes_on_tail(bool state_held, int source_gpu) {
  return state_held ? std::string("; the job goes on without it")
                    : fmt::format(
                          "; only the leaving state source ({}) still holds the "
                          "training state",
                          slot_name(source_gpu));
}
}  // namespace

bool Scheduler::on_process_exit(int gpu, bool clean, const std::string& how, bool can_restart) {
  SlotInfo& s = slot(gpu);
  const int pid = s.pid;
  s.pid = -1;
  if (s.will_exit && s.park_generation >= 0 && s.state == SlotState::kParked) {
    delete_key(keys::parked(gpu, s.park_generation));  // a held process told to exit
    delete_key(keys::wake(gpu, s.park_generation));
  }
  s.will_exit = false;
  moved_on(gpu);
  const std::string program_error = std::exchange(s.program_error, {});
  if (pid >= 0) delete_key(keys::program_error(gpu, pid));
  bool absorbed = true;
  std::string goes_on;  // said last, unless the job ends because of this exit
  switch (s.state) {
    case SlotState::kStarting:
      // Never spoke the protocol: exactly the non-elastic behaviour.
      set_state(s, clean ? SlotState::kExited : SlotState::kFailed, how);
      if (clean) begin_finish(s, how);
      absorbed = false;
      break;
    case SlotState::kActive:
      if (clean) {
        set_state(s, SlotState::kExited, "finished: " + how);
        begin_finish(s, how);
        absorbed = false;
      } else if (!program_error.empty() && !(s.withdrawn && interrupted(program_error))) {
        // The program's own exception is the job's failure, as under torchrun (a crash or a
        // kill is a lost rank, gone on without): the supervisor stops the job (or restarts it).
        // A KeyboardInterrupt of a leaving node's rank (Ctrl-C twice there) is that node's
        // stop, not the program's error: a lost rank.
        set_state(s, SlotState::kFailed, how);
        say(program_error_text(gpu, s.rank, generation_, pid, how, program_error));
        absorbed = false;
      } else {
        set_state(s, SlotState::kFailed, how);
        absorbed = !can_restart;
        if (absorbed)
          goes_on = fmt::format("{} (rank {} of generation {}, pid {}) ended with {}",
                                slot_name(gpu), s.rank, generation_, pid, how);
      }
      break;
    case SlotState::kRejoining:
      set_state(s, clean ? SlotState::kExited : SlotState::kFailed, "joiner ended: " + how);
      if (clean) begin_finish(s, how);
      absorbed = clean ? false : !can_restart;
      if (!clean && absorbed)
        goes_on = fmt::format("{} (joining generation {}, pid {}) ended with {}", slot_name(gpu),
                              generation_, pid, how);
      break;
    case SlotState::kOffloading:
      if (clean) {
        set_state(s, SlotState::kParked, "released: " + how);
        s.released = true;
      } else if (gpu == source_gpu_ && s.holds_state) {
        // A leaving state source before its handoff completed: participant_died decides.
        set_state(s, SlotState::kFailed, "died while offloading: " + how);
      } else {
        // Its state was not needed any more (the pause snapshot or the members hold it): its
        // death loses nothing, and the slot can be named again (spawned anew).
        drop_park_keys(s);
        set_state(s, SlotState::kParked, "ended while leaving (nothing was lost): " + how);
        say(fmt::format(
            "leaving {} (pid {}) ended with {} while it left: nothing is lost ({}); the slot "
            "is parked and a config that names it again starts it anew",
            slot_name(gpu), pid, how, held_by()));
      }
      break;
    case SlotState::kWarming:
      // Not a participant of anything: nobody waits for it, nothing is lost — unless the job
      // is paused and this was the last slot that could resume it (FAILED slots stay out).
      set_state(s, SlotState::kFailed, "warm joiner ended before it was admitted: " + how);
      if (active_.empty() && generation_ >= 0 && !finished_ &&
          std::all_of(slots_.begin(), slots_.end(),
                      [](const auto& kv) { return kv.second.state == SlotState::kFailed; })) {
        lose_state(fmt::format(
            "warming {} (pid {}) ended with {} before it joined, and every slot has failed: no "
            "slot "
            "is left to resume the paused job on (a failed slot is not started again in this "
            "attempt)",
            slot_name(gpu), pid, how));
        break;
      }
      say(fmt::format(
          "warming {} (pid {}) ended with {} before it joined: dropped, the job goes on "
          "without it (it stays out of this attempt)",
          slot_name(gpu), pid, how));
      break;
    case SlotState::kStandby:
      // Nobody waits for it and it holds nothing: the slot is parked as before, without one.
      set_state(s, SlotState::kParked, "standby ended: " + how);
      s.no_standby = true;
      say(fmt::format(
          "standby {} (pid {}) ended with {}: the slot is parked without one (a config that "
          "names it starts it anew; no standby is started for it again in this attempt)",
          slot_name(gpu), pid, how));
      break;
    case SlotState::kParked:
      if (s.cancelled) {
        s.cancelled = false;  // a warm joiner ended because it was no longer wanted
      } else if (!clean && (snapshot_current() || holder_alive(gpu))) {
        // Hold mode: its host copy was not the only one (the pause snapshot or the members hold
        // the state): the slot is parked without a process and a config that names it again
        // starts it anew, as after a release-mode leaver.
        drop_park_keys(s);
        say(fmt::format(
            "parked {} (pid {}) ended with {}: nothing is lost ({}); a config that names it "
            "again starts it anew",
            slot_name(gpu), pid, how, held_by()));
      } else if (!clean) {
        set_state(s, SlotState::kFailed, "died while parked: " + how);
        say(fmt::format(
            "parked {} (pid {}) ended with {}: it stays out of this attempt (a config that "
            "names it again does not bring it back)",
            slot_name(gpu), pid, how));
      }
      break;
    case SlotState::kExited:
    case SlotState::kFailed:
      break;
  }
  const bool was_source = gpu == source_gpu_;
  s.holds_state = false;  // its process is gone
  drop_warm_keys(s);
  if (!absorbed) return false;
  if (!clean && s.state == SlotState::kFailed) {
    participant_died(s, pid, how);
  } else if (was_source && aborted_.count(generation_) && !finished_ && !holder_alive() &&
             !snapshot_current() && state_exists_) {
    // The leaving source gave up its handoff (its joiner died) and left: nobody has the state.
    lose_state(
        fmt::format("{} (the state source of generation {}, pid {}) left before its "
                    "handoff completed ({})",
                    slot_name(gpu), generation_, pid, how));
  }
  try_decide();
  check_all_gone();
  warm_up();  // a slot wanted again whose previous process just ended
  if (holds_job_open()) resume();
  if (!goes_on.empty() && !finished_) {
    bool member_holds = false;
    for (int m : active_)
      member_holds = member_holds || (alive_member(slot(m)) && slot(m).holds_state);
    say(goes_on + goes_on_tail(member_holds || snapshot_current() || !state_exists_, source_gpu_));
  }
  return true;
}

void Scheduler::participant_died(const SlotInfo& s, int pid, const std::string& how) {
  if (finished_ || generation_ < 0) return;
  const bool is_member = member(s);
  if (!is_member && s.gpu != source_gpu_) return;  // a parked or leaving slot: no one waits on it
  // Everyone of the generation that has not shown it is past the set-up may be blocked in it
  // (a rendezvous, the handoff) waiting for this process: the abort key ends those waits.
  bool pending = !established_.count(s.gpu);
  for (int gpu : active_)
    pending = pending || (alive_member(slot(gpu)) && !established_.count(gpu));
  const std::string who = is_member ? fmt::format("{} (rank {} of generation {}, pid {})",
                                                  slot_name(s.gpu), s.rank, generation_, pid)
                                    : fmt::format("{} (the state source of generation {}, pid {})",
                                                  slot_name(s.gpu), generation_, pid);
  if (pending && aborted_.insert(generation_).second) {
    Effect e;
    e.kind = Effect::Kind::kWriteKey;
    e.key = keys::abort(generation_);
    e.value = fmt::format("{} ended with {}", who, how);
    effects_.push_back(std::move(e));
    // A rendezvous that is not the engine's (torch's init_process_group, gloo's full mesh)
    // may be waiting under the generation's comm keys for the dead rank's address: its wait
    // ends now, not at its timeout.
    Effect ab;
    ab.kind = Effect::Kind::kAbandonKeys;
    ab.key = keys::comm(generation_, "");
    effects_.push_back(std::move(ab));
    Effect ev;
    ev.kind = Effect::Kind::kEvent;
    ev.key = "generation_abandoned";
    ev.fields.add("generation", generation_).add("gpu", s.gpu).add("pid", pid).add("how", how);
    effects_.push_back(std::move(ev));
    say(fmt::format(
        "{} ended with {} before generation {} was set up: the others stop waiting for it "
        "and report again",
        who, how, generation_));
  }
  // Who still holds the training state: every ACTIVE member (continuing ranks, and joiners
  // that completed the handoff), and a leaving state source until it is gone.
  if (holder_alive()) return;
  if (snapshot_current()) return;  // the joiners load the pause snapshot again
  if (!state_exists_) return;
  lose_state(
      fmt::format("{} ended with {}: it was the last process holding the training state (no pause "
                  "snapshot of this position exists)",
                  who, how));
}

void Scheduler::pause_snapshot_outcome(const Report& r) {
  if (r.snapshot == "ok") {
    snapshot_boundary_ = std::make_pair(r.epoch, r.step);
    snapshot_slot_ = r.gpu;
    snapshot_generation_ = r.generation;
    ++snapshot_serial_;
    if (!pause_refused_.empty()) say("the pause snapshot was written this time: pausing");
    pause_refused_.clear();
    return;
  }
  refused_at_ = std::make_pair(r.epoch, r.step);
  const bool said = !pause_refused_.empty();  // said once; tried again at each boundary
  pause_refused_ = r.snapshot;
  if (said) return;
  Effect ev;
  ev.kind = Effect::Kind::kEvent;
  ev.key = "pause_refused";
  ev.fields.add("gpu", r.gpu).add("generation", r.generation).add("error", r.snapshot);
  effects_.push_back(std::move(ev));
  say(
      fmt::format("the pause is refused and training goes on with [{}]: {} could not write "
                  "the pause snapshot: {} (tried again at every boundary while the config asks for "
                  "the pause: make room)",
                  join_ids(active_, ", "), slot_name(r.gpu), r.snapshot));
}

std::string Scheduler::held_by() const {
  if (!active_.empty())
    return fmt::format("the members [{}] hold the training state", join_ids(active_, ", "));
  return fmt::format(
      "the pause snapshot holds the training state{}",
      snapshot_boundary_
          ? " (" + boundary_text(snapshot_boundary_->first, snapshot_boundary_->second) + ")"
          : std::string());
}

bool Scheduler::holder_alive(int besides) const {
  for (int gpu : active_) {
    const SlotInfo& m = slots_.at(gpu);
    if (gpu != besides && alive_member(m) && m.holds_state) return true;
  }
  if (source_gpu_ >= 0 && source_gpu_ != besides) {
    const SlotInfo& src = slots_.at(source_gpu_);
    if (src.pid >= 0 && src.holds_state && src.state == SlotState::kOffloading) return true;
  }
  return false;
}

bool Scheduler::snapshot_current() const {
  return state_exists_ && snapshot_boundary_ && last_boundary_ == snapshot_boundary_;
}

bool Scheduler::snapshot_unreachable(const std::string& where) {
  if (!holds_job_open() || !snapshot_current() || holder_alive()) return false;
  lose_state(
      fmt::format("the job is paused and its only pause snapshot ({}, serial {}, written by "
                  "{} in generation {}) {}",
                  boundary_text(snapshot_boundary_->first, snapshot_boundary_->second),
                  snapshot_serial_, slot_name(snapshot_slot_), snapshot_generation_, where));
  return true;
}

void Scheduler::lose_state(const std::string& why) {
  if (finished_) return;
  finished_ = true;
  exit_reason_ = "state_lost";
  state_lost_ = "the training state is lost: " + why;
  Effect ev;
  ev.kind = Effect::Kind::kEvent;
  ev.key = "state_lost";
  ev.fields.add("generation", generation_).add("reason", why);
  effects_.push_back(std::move(ev));
  say(state_lost_ + "; stopping the job (it cannot go on without restarting from scratch)");
  wake_all_parked_to_exit("the training state is lost");
  // A member without the state (a joiner in its set-up) has nothing to save, and it may be
  // blocked where only its communicator timeout would end it (Gloo's connect to the dead
  // source, GPURUN_COMM_TIMEOUT_MS): end it now rather than keep the job up that long.
  for (auto& [gpu, s] : slots_)
    if (s.pid >= 0 && alive_member(s) && !s.holds_state) {
      say(
          fmt::format("ending {} (pid {}): it holds no training state (it was joining "
                      "generation {})",
                      slot_name(gpu), s.pid, generation_));
      Effect e;
      e.kind = Effect::Kind::kKill;
      e.gpu = gpu;
      effects_.push_back(std::move(e));
    }
  if (!reports_.empty()) publish_exit();
}

void Scheduler::check_all_gone() {
  if (finished_ || active_.empty()) return;
  for (int gpu : active_)
    if (alive_member(slot(gpu))) return;
  // A leaving state source may still be handing on (or giving up): it decides (on its exit).
  if (holder_alive()) return;
  // Every member of the generation died: nothing can carry on.
  if (source_snapshot_ && state_exists_) {
    lose_state(
        fmt::format("no member of generation {} could take it from the pause snapshot "
                    "(their errors are above)",
                    generation_));
    return;
  }
  finished_ = true;
  exit_reason_ = "failed";
  say(fmt::format("every member of generation {} failed; ending the job", generation_));
  wake_all_parked_to_exit("every active worker failed");
}

}  // namespace gpurun::control
