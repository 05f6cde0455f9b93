// Scheduler: boundaries, decisions, generations and keys. Warm joiners and standbys:
// scheduler_warm.cpp; process exits, deadlines and lost state: scheduler_failures.cpp.
#include "control/scheduler.hpp"

#include <algorithm>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"

namespace gpurun::control {

namespace {

/// Where a generation's state comes from, for the console: the decision's state_source in words.
std::string state_from(const Decision& d) {
  return describe(d.state_source);
}

}  // namespace

Scheduler::Scheduler(std::vector<int> slots, Config config, std::optional<std::vector<int>> launch)
    : slot_ids_(std::move(slots)), config_(std::move(config)) {
  std::sort(slot_ids_.begin(), slot_ids_.end());
  for (int gpu : slot_ids_) slots_[gpu].gpu = gpu;
  launch_ = launch ? std::move(*launch) : slot_ids_;
  std::sort(launch_.begin(), launch_.end());
  launch_ = ids_intersect(launch_, slot_ids_);
}

void Scheduler::add_slots(const std::vector<int>& ids) {
  for (int gpu : ids) {
    if (slots_.count(gpu)) continue;
    slots_[gpu].gpu = gpu;
    slot_ids_.insert(std::upper_bound(slot_ids_.begin(), slot_ids_.end(), gpu), gpu);
  }
}

void Scheduler::withdraw_slots(const std::vector<int>& ids) {
  for (int gpu : ids)
    if (auto it = slots_.find(gpu); it != slots_.end()) it->second.withdrawn = true;
  warm_up();
}

std::vector<Effect> Scheduler::take_effects() {
  std::vector<Effect> out;
  out.swap(effects_);
  return out;
}

void Scheduler::say(std::string text) {
  Effect e;
  e.kind = Effect::Kind::kSay;
  e.value = std::move(text);
  effects_.push_back(std::move(e));
}

SlotInfo& Scheduler::slot(int gpu) {
  auto it = slots_.find(gpu);
  GPURUN_CHECK(it != slots_.end(), "unknown slot {}", gpu);
  return it->second;
}

void Scheduler::set_state(SlotInfo& s, SlotState to, const std::string& reason) {
  const SlotState from = s.state;
  s.state = transition(from, to);
  s.reason = reason;
  Effect e;
  e.kind = Effect::Kind::kEvent;
  e.key = "worker_state";
  e.fields.add("gpu", s.gpu)
      .add("from", to_string(from))
      .add("to", to_string(to))
      .add("generation", s.generation)
      .add("rank", s.rank)
      .add("pid", s.pid)
      .add("reason", reason);
  effects_.push_back(std::move(e));
}

std::vector<int> Scheduler::desired() const {
  if (!config_.active_gpus) return launch_;
  return ids_intersect(*config_.active_gpus, slot_ids_);
}

std::vector<int> Scheduler::effective_desired() const {
  std::vector<int> out;
  for (int gpu : desired()) {
    const SlotState st = slots_.at(gpu).state;
    if (st != SlotState::kFailed && st != SlotState::kExited) out.push_back(gpu);
  }
  return out;
}

bool Scheduler::member(const SlotInfo& s) const {
  return std::binary_search(active_.begin(), active_.end(), s.gpu);
}

bool Scheduler::alive_member(const SlotInfo& s) const {
  return member(s) && (s.state == SlotState::kActive || s.state == SlotState::kStarting ||
                       s.state == SlotState::kRejoining);
}

Decision Scheduler::base_decision() const {
  Decision d;
  d.park_mode = config_.park_mode;
  d.every_steps = config_.boundary.every_epoch ? 0 : config_.boundary.every_steps;
  d.global_batch = config_.global_batch.value_or(0);
  return d;
}

void Scheduler::write_decision(std::string key, const Decision& d) {
  Effect e;
  e.kind = Effect::Kind::kWriteKey;
  e.key = std::move(key);
  e.decision = d;
  effects_.push_back(std::move(e));
}

void Scheduler::publish(const Decision& d, const std::string& decision_key) {
  if (!decision_key.empty()) write_decision(decision_key, d);
  const bool new_generation =
      d.kind != Decision::Kind::kContinue && d.kind != Decision::Kind::kSnapshot;
  if (new_generation) {
    established_.clear();
    setup_pending_.clear();
    if (d.kind == Decision::Kind::kResize) {
      // Every participant must finish the set-up within the set-up deadline: a stopped or hung
      // one is killed then, so the others give up on it at once (the abort key, on its exit)
      // instead of after the communicators' timeout and a boundary deadline.
      setup_pending_.insert(d.active.begin(), d.active.end());
      if (d.state_source.is_peer()) setup_pending_.insert(d.state_source.gpu);
      Effect e;
      e.kind = Effect::Kind::kArmDeadline;
      e.generation = d.generation;
      e.round = kSetUpRound;
      e.deadline = config_.setup_deadline;
      effects_.push_back(std::move(e));
    }
    source_gpu_ = d.state_source.is_peer() ? d.state_source.gpu : -1;
    source_snapshot_ = d.state_source.is_snapshot();
    write_decision(keys::start(d.generation), d);
    Effect g;
    g.kind = Effect::Kind::kWriteKey;
    g.key = std::string(keys::kGeneration);
    g.value = std::to_string(d.generation);
    effects_.push_back(std::move(g));
    generation_keys_[d.generation] = static_cast<int>(d.active.size());
  }
  last_decision_ = d;
  decision_event(d);
  if (new_generation)
    say(
        fmt::format("generation {}: active [{}] (joiners [{}], leavers [{}], failed [{}], state "
                    "from {})",
                    d.generation, join_ids(d.active, ", "), join_ids(d.joiners, ", "),
                    join_ids(d.leavers, ", "), join_ids(d.failed, ", "), state_from(d)));
}

void Scheduler::start_attempt(int attempt) {
  pause_refused_.clear();
  refused_at_.reset();
  snapshot_round_ = false;
  snapshot_boundary_.reset();
  reports_.clear();
  deadline_armed_ = false;
  finished_ = false;
  exit_published_ = false;
  exit_reason_.clear();  // a later exit wake of this attempt says its own reason, or none
  finisher_.clear();
  disagreement_.clear();
  // A new attempt: no process of the previous one is left to read its keys.
  for (const DecidedRound& r : decided_) {
    delete_key(keys::decision(r.generation, r.round));
    for (int rank : r.ranks) delete_key(keys::report(r.generation, r.round, rank));
  }
  decided_.clear();
  for (auto& [gpu, s] : slots_) {
    if (s.park_generation >= 0) {
      delete_key(keys::parked(gpu, s.park_generation));
      delete_key(keys::wake(gpu, s.park_generation));
    }
    drop_warm_keys(s);
  }
  const int64_t prev = generation_;
  generation_ = generation_ < 0 ? 0 : generation_ + 1;
  round_ = 0;
  for (auto& [gpu, s] : slots_) {  // a new attempt: every process is gone
    s = SlotInfo{};
    s.gpu = gpu;
  }
  active_ = desired();
  Decision d = base_decision();
  d.kind = Decision::Kind::kStart;
  d.generation = generation_;
  d.prev_generation = prev;
  d.active = active_;
  d.joiners = active_;
  d.state_source = StateSource::none();
  if (last_boundary_) std::tie(d.epoch, d.step) = *last_boundary_;
  publish(d, "");
  collect_keys();  // the previous attempt's generations
  (void)attempt;
  for (int gpu : active_) {
    SlotInfo& s = slot(gpu);
    s.state = SlotState::kStarting;  // reset, not a transition (new attempt)
    s.holds_state = true;            // a fresh start: rank 0's initial state is broadcast
    s.generation = generation_;
    s.rank = d.rank_of(gpu);
    spawn_effect(gpu, generation_, d);
  }
}

void Scheduler::config_loaded(Config config, const std::string& path) {
  const bool to_release =
      config.park_mode == ParkMode::kRelease && config_.park_mode == ParkMode::kHold;
  config_ = std::move(config);
  last_config_error_.clear();
  Effect e;
  e.kind = Effect::Kind::kEvent;
  e.key = "config_loaded";
  e.fields.add("path", path);
  if (config_.active_gpus)
    e.fields.add_raw("active_gpus", ids_json(*config_.active_gpus));
  else
    e.fields.add("active_gpus", "all");
  e.fields.add("park_mode", to_string(config_.park_mode))
      .add("every_steps", config_.boundary.every_epoch ? 0 : config_.boundary.every_steps)
      .add("warnings", config_.warnings);
  effects_.push_back(std::move(e));
  for (const auto& w : config_.warnings) say("warning: " + w);
  if (finished_) return;
  if (to_release) wake_all_parked_to_exit("park mode is now release");
  // A named slot that failed in this attempt stays out: say so, never drop it silently.
  const std::vector<int> out = ids_minus(desired(), effective_desired());
  if (!out.empty() && generation_ >= 0) {
    std::string which;
    for (int gpu : out)
      which +=
          fmt::format("{}{} ({})", which.empty() ? "" : ", ", slot_name(gpu), slot(gpu).reason);
    const bool paused = active_.empty() && effective_desired().empty();
    say(
        fmt::format("the config names [{}], but {} failed in this attempt: a failed slot is not "
                    "started again before a restart{}",
                    join_ids(out, ", "), which,
                    paused ? "; the job stays paused (name another slot to resume)" : ""));
  }
  warm_up();
  if (generation_ >= 0 && active_.empty()) resume();
}

void Scheduler::config_rejected(const std::string& path, const std::string& error) {
  last_config_error_ = error;
  Effect e;
  e.kind = Effect::Kind::kEvent;
  e.key = "config_rejected";
  e.fields.add("path", path).add("error", error);
  effects_.push_back(std::move(e));
  say(fmt::format("config rejected, the last good config stays in force: {}", error));
}

void Scheduler::on(const keys::WorkerWrite& write) {
  std::visit(
      [this](const auto& w) {
        using T = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<T, keys::Joined>) {
          on_joined(w.generation, w.rank, w.pid);
        } else if constexpr (std::is_same_v<T, keys::Reported>) {
          on_report(w.report);
        } else if constexpr (std::is_same_v<T, keys::Parked>) {
          on_parked(w.gpu, w.park_generation);
        } else if constexpr (std::is_same_v<T, keys::Ready>) {
          on_ready(w.gpu, w.warm);
        } else if constexpr (std::is_same_v<T, keys::ProgramError>) {
          on_program_error(w.gpu, w.pid, w.text);
        } else {
          static_assert(std::is_same_v<T, keys::Timing>);
          delete_key(keys::timing(w.generation, w.gpu));  // read once: the store keeps none
          on_setup_done(w.generation, w.gpu);             // its set-up deadline is off
        }
      },
      write);
}

void Scheduler::on_joined(int64_t generation, int rank, int pid) {
  if (generation != generation_ || rank < 0 || rank >= static_cast<int>(active_.size())) return;
  SlotInfo& s = slot(active_[static_cast<size_t>(rank)]);
  if (s.state != SlotState::kStarting && s.state != SlotState::kRejoining) return;
  if (s.pid < 0) s.pid = pid;
  state_exists_ = true;
  established_.insert(s.gpu);
  set_state(s, SlotState::kActive,
            fmt::format("joined generation {} as rank {}", generation, rank));
  drop_warm_keys(s);        // a warm joiner: its ready and admit keys are read
  if (s.woken_from >= 0) {  // its park and wake keys are read
    delete_key(keys::parked(s.gpu, s.woken_from));
    delete_key(keys::wake(s.gpu, s.woken_from));
    s.woken_from = -1;
  }
  moved_on(s.gpu);
}

void Scheduler::on_report(const Report& r) {
  if (r.generation != generation_ || r.round != round_ || r.rank < 0 ||
      r.rank >= static_cast<int>(active_.size()) || active_[static_cast<size_t>(r.rank)] != r.gpu) {
    say(
        fmt::format("ignoring a stale or foreign boundary report ({}, rank {}, generation {}, "
                    "round {}; current generation {}, round {})",
                    slot_name(r.gpu), r.rank, r.generation, r.round, generation_, round_));
    return;
  }
  SlotInfo& s = slot(r.gpu);
  // A joiner whose set-up was abandoned reports without the state: it stays REJOINING and is
  // never taken as a state source.
  setup_pending_.erase(s.gpu);  // alive, past its set-up (done, or given up on and reported)
  const bool stateless = !r.has_state && !s.holds_state;
  if (stateless && s.state == SlotState::kRejoining && ++s.failed_joins >= kMaxFailedJoins) {
    set_state(s, SlotState::kFailed,
              fmt::format("its set-up failed in {} generations in a row", s.failed_joins));
    say(
        fmt::format("{} (pid {}) could not join in {} generations in a row (the last: "
                    "generation {}): killing it, the job goes on without it",
                    slot_name(s.gpu), s.pid, s.failed_joins, generation_));
    if (s.pid >= 0) {
      Effect e;
      e.kind = Effect::Kind::kKill;
      e.gpu = s.gpu;
      effects_.push_back(std::move(e));
    }
    if (!finished_) try_decide();
    return;
  }
  if (!stateless && (s.state == SlotState::kStarting || s.state == SlotState::kRejoining)) {
    state_exists_ = true;
    set_state(s, SlotState::kActive, "reported before joining");
  }
  if (s.state != SlotState::kActive && !stateless) return;  // e.g. declared FAILED (stalled)
  if (r.has_state) {                                        // past its handoff
    s.holds_state = true;
    s.failed_joins = 0;
  }
  established_.insert(s.gpu);
  if (!r.snapshot.empty()) pause_snapshot_outcome(r);
  s.last_boundary = {r.epoch, r.step};
  last_boundary_ = s.last_boundary;
  reports_[r.rank] = r;
  moved_on(s.gpu);  // it read every earlier decision
  if (!deadline_armed_) {
    deadline_armed_ = true;
    deadline_waited_ = std::chrono::milliseconds{0};
    first_report_ms_ = r.time_ms;
    arm_boundary_deadline(config_.boundary_deadline);
  }
  if (finished_) {
    publish_exit();
    check_disagreement();
    return;
  }
  try_decide();
}

void Scheduler::on_parked(int gpu, int64_t park_generation) {
  auto it = slots_.find(gpu);
  if (it == slots_.end()) return;
  SlotInfo& s = it->second;
  if (s.state == SlotState::kOffloading && s.park_generation == park_generation) {
    set_state(s, SlotState::kParked, "parked (hold mode)");
    moved_on(gpu);  // it read the decision that made it leave
  }
}

void Scheduler::on_program_error(int gpu, int64_t pid, const std::string& text) {
  auto it = slots_.find(gpu);
  if (it == slots_.end() || it->second.pid != pid) return;
  // Its lines are bounded when said (text_block); the worker sends at most ~4000 characters.
  it->second.program_error = text.size() <= 16384 ? text : text.substr(text.size() - 16384);
}

void Scheduler::on_spawned(int gpu, int pid) {
  slot(gpu).pid = pid;
  slot(gpu).failed_joins = 0;
}

std::string Scheduler::wake_all_parked_to_exit(const std::string& why, bool say_it) {
  std::string ended, told;  // one line names them all (none a line of its own)
  for (auto& [gpu, s] : slots_)
    if (s.state == SlotState::kWarming || s.state == SlotState::kStandby) {
      const std::string what =
          fmt::format("{} {} (pid {})", s.state == SlotState::kStandby ? "standby" : "warming",
                      slot_name(gpu), s.pid);
      const bool has_process = s.pid >= 0;
      cancel_warming(s, why, /*quiet=*/true);
      if (has_process) ended += (ended.empty() ? "" : ", ") + what;
    }
  for (auto& [gpu, s] : slots_) {
    // (a standby or warm joiner just cancelled above is being ended, and named there)
    if ((s.state != SlotState::kParked && s.state != SlotState::kOffloading) || s.pid < 0 ||
        s.park_generation < 0 || s.will_exit || s.cancelled)
      continue;
    s.will_exit = true;
    Decision d;
    d.kind = Decision::Kind::kExit;
    d.generation = generation_;
    d.reason = exit_reason_;
    write_decision(keys::wake(gpu, s.park_generation), d);
    told += fmt::format("{}parked {} (pid {})", told.empty() ? "" : ", ", slot_name(gpu), s.pid);
  }
  std::string line = ended.empty() ? std::string() : "ending " + ended;
  if (!told.empty()) line += (line.empty() ? "telling " : "; telling ") + told + " to exit";
  if (say_it && !line.empty()) say(line + ": " + why);
  return line;
}

void Scheduler::try_decide() {
  if (finished_ || reports_.empty()) return;
  for (int gpu : active_) {
    const SlotInfo& s = slot(gpu);
    if (alive_member(s) && !reports_.count(s.rank)) return;
  }
  if (!stop_pending_.empty()) {
    finished_ = true;
    exit_reason_ = "stop";
    stop_reason_ = std::exchange(stop_pending_, std::string());
    const Report& r = reports_.begin()->second;
    say(fmt::format("stopping the job at the boundary {}: {}", boundary_text(r.epoch, r.step),
                    stop_reason_));
    wake_all_parked_to_exit("the job was stopped");
    publish_exit();
    return;
  }
  // The re-report after a `snapshot` decision is the same boundary: no second window.
  if (on_boundary && !std::exchange(snapshot_round_, false)) {
    BoundaryInfo b;
    b.generation = generation_;
    b.round = round_;
    b.epoch = reports_.begin()->second.epoch;
    b.step = reports_.begin()->second.step;
    b.active = active_;
    for (const auto& [rank, r] : reports_) b.time_ms = std::max(b.time_ms, r.time_ms);
    if (std::optional<std::string> why = on_boundary(b)) {
      finished_ = true;
      exit_reason_ = "early_stop";
      stop_reason_ = *why;
      say(fmt::format("stopping the job at the boundary {}: {}", boundary_text(b.epoch, b.step),
                      *why));
      wake_all_parked_to_exit("the job was stopped");
      publish_exit();
      return;
    }
  }
  decide();
}

void Scheduler::bring_in(SlotInfo& s, const Decision& d) {
  s.generation = d.generation;
  s.rank = d.rank_of(s.gpu);
  const std::string why = fmt::format("joins generation {} as rank {}", d.generation, s.rank);
  s.holds_state = false;                 // until it reports in d.generation, after the handoff
  if (s.state == SlotState::kWarming) {  // ready and waiting: only the set-up is left
    set_state(s, SlotState::kRejoining, why + " (warm: ready before this decision)");
    s.warm_ready = false;
    write_decision(keys::admit(s.gpu, s.warm_id), d);
    return;
  }
  if (s.pid >= 0 && (s.state == SlotState::kRejoining || s.state == SlotState::kActive)) {
    // A joiner whose previous join was abandoned: it reported and reads this decision itself.
    s.reason = why + " (again, after an abandoned join)";
    s.park_generation = -1;
    return;
  }
  if (s.pid < 0) {
    set_state(s, SlotState::kRejoining, why + " (spawned)");
    spawn_effect(s.gpu, d.generation, d);
  } else {
    const bool held = (s.state == SlotState::kParked || s.state == SlotState::kOffloading) &&
                      s.park_generation >= 0 && !s.will_exit;
    GPURUN_CHECK(held, "joiner {} in state {} (pid {})", slot_name(s.gpu), to_string(s.state),
                 s.pid);
    // A held process (or one still offloading: it reads the wake key when it parks).
    set_state(s, SlotState::kRejoining, why + " (woken)");
    write_decision(keys::wake(s.gpu, s.park_generation), d);
    s.woken_from = s.park_generation;
  }
  s.park_generation = -1;
}

DecisionInput Scheduler::decision_input() const {
  DecisionInput in;
  in.generation = generation_;
  in.round = round_;
  in.active = active_;
  in.desired = effective_desired();
  in.slots = &slots_;
  in.reports = reports_;
  in.min_gpus = config_.policy.min_gpus;
  in.snapshot_current = snapshot_current();
  in.refused_at = refused_at_;
  in.snapshot_boundary = snapshot_boundary_;
  in.checkpoint = checkpoint_pending_;
  in.base = base_decision();
  return in;
}

std::optional<DecisionOutcome> Scheduler::would_decide() const {
  if (finished_ || !stop_pending_.empty()) return std::nullopt;
  DecisionInput in = decision_input();
  const Report* ref = reports_.empty() ? nullptr : &reports_.begin()->second;
  for (const auto& entry : reports_)
    if (entry.second.has_state) {
      ref = &entry.second;
      break;
    }
  std::pair<int64_t, int64_t> pos = last_boundary_.value_or(std::make_pair(int64_t{0}, int64_t{0}));
  if (ref != nullptr) pos = {ref->epoch, ref->step};
  bool live = false;
  for (int gpu : active_) {
    const SlotInfo& s = slots_.at(gpu);
    if (!alive_member(s)) continue;
    live = true;
    if (in.reports.count(s.rank)) continue;
    Report r;
    r.rank = s.rank;
    r.gpu = gpu;
    r.generation = generation_;
    r.round = round_;
    std::tie(r.epoch, r.step) = pos;
    r.has_state = s.holds_state;
    in.reports.emplace(s.rank, r);
  }
  if (!live) return std::nullopt;
  if (reports_.empty() && !snapshot_round_) {
    // The next round reports a boundary not reached yet: no refusal or snapshot is about it.
    in.refused_at.reset();
    in.snapshot_boundary.reset();
  } else if (snapshot_round_ && in.refused_at != pos) {
    in.snapshot_boundary = pos;  // the pause snapshot being written: as if written (the pause)
  }
  return compute_decision(in);
}

void Scheduler::decide() {
  const DecisionOutcome out = compute_decision(decision_input());
  for (const DecisionReason& r : out.reasons) {  // each said once per slot
    SlotInfo& s = slot(r.gpu);
    bool& said =
        r.kind == DecisionReason::Kind::kWarmNotReady ? s.warm_late_said : s.floor_kept_said;
    if (!std::exchange(said, true)) say(r.text);
  }
  for (int gpu : ids_minus(active_, out.next)) slot(gpu).floor_kept_said = false;
  if (!out.decision) {
    lose_state(out.state_lost);
    return;
  }
  const Decision& d = *out.decision;
  const std::string key = keys::decision(generation_, round_);
  remember_round();
  reports_.clear();
  deadline_armed_ = false;
  if (d.kind == Decision::Kind::kSnapshot) {
    // First the snapshot, while every rank still holds the state; the pause comes after.
    publish(d, key);
    if (pause_refused_.empty())
      say(fmt::format("pausing: {} writes the pause snapshot first (generation {}, {})",
                      slot_name(d.state_source.gpu), generation_, boundary_text(d.epoch, d.step)));
    ++round_;
    snapshot_round_ = true;
    collect_keys();
    return;
  }
  checkpoint_pending_ = false;  // the decision carries it
  if (d.kind == Decision::Kind::kContinue) {
    publish(d, key);
    ++round_;
    collect_keys();
    return;
  }
  publish(d, key);

  generation_ = d.generation;
  round_ = 0;
  active_ = d.active;
  for (int gpu : d.leavers) {
    SlotInfo& s = slot(gpu);
    s.park_generation = d.generation;
    s.will_exit = d.park_mode == ParkMode::kRelease;
    set_state(
        s, SlotState::kOffloading,
        fmt::format("leaves at generation {} ({} mode)", d.generation, to_string(d.park_mode)));
    s.rank = -1;
    s.generation = d.generation;
  }
  for (int gpu : ids_intersect(out.survivors, d.active)) {
    SlotInfo& s = slot(gpu);
    s.generation = d.generation;
    s.rank = d.rank_of(gpu);
  }
  for (int gpu : d.joiners) admit(slot(gpu), d);
  collect_keys();
}

void Scheduler::admit(SlotInfo& s, const Decision& d) {
  GPURUN_CHECK(joinable_now(s),
               "joiner {} of generation {} is not joinable (state {}, pid {}, exiting {})",
               slot_name(s.gpu), d.generation, to_string(s.state), s.pid, s.will_exit);
  bring_in(s, d);
}

void Scheduler::resume() {
  const std::vector<int> target = effective_desired();
  if (target.empty()) return;
  // Nobody trains, but the new generation's members would wait for each other inside its
  // set-up: it is made once every slot of it is ready (warm joiners that reported ready, held
  // processes), so only the set-up and the snapshot load are left after the decision.
  for (int gpu : target)
    if (!joinable_now(slot(gpu))) return;
  // Several nodes: the joiners load the snapshot on their own node; a copy may be on its way.
  if (state_exists_ && resume_gate && !resume_gate(target)) return;
  Decision d = base_decision();
  d.kind = Decision::Kind::kResize;
  d.prev_generation = generation_;
  d.generation = generation_ + 1;
  d.round = -1;
  if (last_boundary_) std::tie(d.epoch, d.step) = *last_boundary_;
  d.active = target;
  d.joiners = target;
  d.state_source = state_exists_ ? StateSource::snapshot() : StateSource::none();
  publish(d, "");
  generation_ = d.generation;
  round_ = 0;
  active_ = target;
  reports_.clear();
  deadline_armed_ = false;
  for (int gpu : target) admit(slot(gpu), d);
  collect_keys();
}

bool Scheduler::request_stop(const std::string& why) {
  if (finished_ || holds_job_open()) return false;
  stop_pending_ = why;
  try_decide();  // a round already complete (never left undecided today) is answered now
  return true;
}

void Scheduler::begin_finish(const SlotInfo& s, const std::string& how) {
  if (finished_) return;
  finished_ = true;
  exit_reason_ = "finished";
  finisher_ = fmt::format("{} (rank {})", slot_name(s.gpu), s.rank);
  // One line says it, with the processes waiting outside the job that end with it.
  const std::string waiting = wake_all_parked_to_exit("training finished", /*say_it=*/false);
  say(fmt::format(
      "{} (rank {}) finished training ({}): the job is finishing; workers at "
      "boundary round {} of generation {} are told to exit{}",
      slot_name(s.gpu), s.rank, how, round_, generation_, waiting.empty() ? "" : "; " + waiting));
  if (!reports_.empty()) publish_exit();
  check_disagreement();
}

void Scheduler::check_disagreement() {
  // One program ends training where another reaches a boundary to go on: with the same
  // program every rank passes the same boundaries, and none follows the last one.
  if (exit_reason_ != "finished" || reports_.empty() || !disagreement_.empty()) return;
  std::string others;
  for (const auto& [rank, r] : reports_)
    others += fmt::format("{}{} (rank {})", others.empty() ? "" : ", ", slot_name(r.gpu), rank);
  const Report& r = reports_.begin()->second;
  disagreement_ = fmt::format(
      "the ranks' programs disagree on how long to train: {} finished training where {} "
      "reached the boundary {} to go on (their program has more epochs or steps: compare the "
      "program's arguments, e.g. --epochs, on every node); the job ended at the first "
      "program's end, not at the others'",
      finisher_, others, boundary_text(r.epoch, r.step));
  say(disagreement_);
}

void Scheduler::publish_exit() {
  if (exit_published_) return;
  exit_published_ = true;
  Decision d;
  d.kind = Decision::Kind::kExit;
  d.generation = generation_;
  d.prev_generation = generation_;
  d.round = round_;
  const Report& first = reports_.begin()->second;
  d.epoch = first.epoch;
  d.step = first.step;
  d.active = active_;
  d.reason = exit_reason_;
  write_decision(keys::decision(generation_, round_), d);
  last_decision_ = d;
  decision_event(d);  // an exit decision has no joiners, leavers, failed or source
}

void Scheduler::decision_event(const Decision& d) {
  Effect ev;
  ev.kind = Effect::Kind::kEvent;
  ev.key = "decision";
  ev.fields.add("generation", d.generation)
      .add("prev_generation", d.prev_generation)
      .add("round", d.round)
      .add("kind", to_string(d.kind))
      .add_raw("active", ids_json(d.active))
      .add_raw("joiners", ids_json(d.joiners))
      .add_raw("leavers", ids_json(d.leavers))
      .add_raw("failed", ids_json(d.failed))
      .add("state_source", d.state_source.wire_code())
      .add("epoch", d.epoch)
      .add("step", d.step);
  effects_.push_back(std::move(ev));
}

void Scheduler::spawn_effect(int gpu, int64_t generation, const Decision& d) {
  Effect e;
  e.kind = Effect::Kind::kSpawn;
  e.gpu = gpu;
  e.generation = generation;
  e.decision = d;
  effects_.push_back(std::move(e));
}

void Scheduler::delete_key(std::string key) {
  Effect e;
  e.kind = Effect::Kind::kDeleteKey;
  e.key = std::move(key);
  effects_.push_back(std::move(e));
}

void Scheduler::remember_round() {
  DecidedRound r;
  r.generation = generation_;
  r.round = round_;
  for (const auto& [rank, report] : reports_) {
    r.ranks.push_back(rank);
    r.unread.push_back(report.gpu);
  }
  std::sort(r.unread.begin(), r.unread.end());
  decided_.push_back(std::move(r));
}

void Scheduler::moved_on(int gpu) {
  for (DecidedRound& r : decided_) {
    auto it = std::lower_bound(r.unread.begin(), r.unread.end(), gpu);
    if (it != r.unread.end() && *it == gpu) r.unread.erase(it);
  }
  collect_keys();
}

void Scheduler::collect_keys() {
  // Rounds every reporter is past: nobody reads their reports or decision again.
  for (auto it = decided_.begin(); it != decided_.end();) {
    if (!it->unread.empty()) {
      ++it;
      continue;
    }
    delete_key(keys::decision(it->generation, it->round));
    for (int rank : it->ranks) delete_key(keys::report(it->generation, it->round, rank));
    it = decided_.erase(it);
  }
  // Generations left behind whose rounds are all collected: their joiners have all joined
  // (a later generation exists only after a decided round, or it had no members), so the
  // start record and the joined keys are not read again.
  for (auto it = generation_keys_.begin(); it != generation_keys_.end();) {
    const int64_t g = it->first;
    const bool pending = std::any_of(decided_.begin(), decided_.end(),
                                     [g](const DecidedRound& r) { return r.generation == g; });
    if (g >= generation_ || pending) {
      ++it;
      continue;
    }
    delete_key(keys::start(g));
    for (int rank = 0; rank < it->second; ++rank) delete_key(keys::joined(g, rank));
    if (aborted_.erase(g)) delete_key(keys::abort(g));
    it = generation_keys_.erase(it);
  }
}

bool Scheduler::holds_job_open() const {
  return !finished_ && generation_ >= 0 && active_.empty();
}

}  // namespace gpurun::control
