#include "gpurun/worker/worker_engine.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpurun/check.hpp"

namespace gpurun::control {

namespace {

using A = EngineAction::Kind;
using E = EngineEvent::Kind;

int index_of(const std::vector<int>& v, int x) {
  auto it = std::find(v.begin(), v.end(), x);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

EngineAction make(A kind) {
  EngineAction a;
  a.kind = kind;
  return a;
}

/// The boundary a program's position (the epoch in progress, its steps done) is at, in the
/// form boundary reports use: step 0 of epoch e is the end of epoch e - 1, (e - 1, 0). A rank
/// whose collective failed and one that reached the boundary then report the same position the
/// same way, so gpurun can tell which survivor is ahead (docs/worker-runtime.md#failures).
std::pair<int64_t, int64_t> boundary_of(int64_t epoch, int64_t step) {
  return step <= 0 ? std::make_pair(epoch - 1, int64_t{0}) : std::make_pair(epoch, step);
}

}  // namespace

bool EngineAction::needs_outcome() const {
  switch (kind) {
    case A::kWaitGet:
    case A::kMakeGroup:
    case A::kBroadcastState:
    case A::kVerifyState:
    case A::kWriteSnapshot:
    case A::kReadSnapshot:
    case A::kRelease:
    case A::kPark:
      return true;
    default:
      return false;
  }
}

WorkerEngine::WorkerEngine(EngineOptions options) : opt_(std::move(options)) {}

bool WorkerEngine::joining() const {
  if (warm()) return true;
  const StateSource& s = current_.state_source;
  return s.is_snapshot() || (s.is_peer() ? s.gpu != opt_.slot : rank() != 0);
}

// ---- small emitters --------------------------------------------------------------------

void WorkerEngine::set_state(WorkerState to, const std::string& why) {
  const WorkerState from = state_;
  state_ = worker_transition(from, to, why);
  EngineAction a = make(A::kState);
  a.from = from;
  a.to = to;
  a.text = why;
  emit(std::move(a));
}

void WorkerEngine::log(std::string text) {
  EngineAction a = make(A::kLog);
  a.text = std::move(text);
  emit(std::move(a));
}

void WorkerEngine::set(std::string key, std::string value) {
  EngineAction a = make(A::kSet);
  a.key = std::move(key);
  a.value = std::move(value);
  emit(std::move(a));
}

void WorkerEngine::wait_get(std::string key, Phase phase) {
  EngineAction a = make(A::kWaitGet);
  a.key = std::move(key);
  emit(std::move(a));
  phase_ = phase;
}

// ---- the one entry -----------------------------------------------------------------------

std::vector<EngineAction> WorkerEngine::on(const EngineEvent& e) {
  out_.clear();
  const double now = e.mono_ms;
  switch (e.kind) {
    case E::kOpen:
      if (phase_ != Phase::kNew) unexpected(e);
      if (warm()) {
        phase_ = Phase::kOpened;  // in no generation until admitted
      } else {
        generation_ = opt_.join_generation;
        wait_get(keys::start(generation_), Phase::kStartRecord);
      }
      break;

    case E::kDevice:
      // A standby's device stays untouched until gpurun says go (keys::go); anyone else, or a
      // standby asked twice, goes on at once.
      if (standby() && phase_ == Phase::kOpened) {
        wait_get(keys::go(opt_.slot, opt_.warm), Phase::kGo);
      } else if (phase_ != Phase::kGo) {
        gone_ = true;
      }
      break;

    case E::kReady:
      if (phase_ != Phase::kOpened || standby()) unexpected(e);
      if (warm()) {
        set(keys::ready(opt_.slot, opt_.warm), std::to_string(opt_.pid));
        wait_get(keys::admit(opt_.slot, opt_.warm), Phase::kAdmission);
      } else {
        begin_set_up(current_, /*have_state=*/current_.state_source.is_none(), now);
      }
      break;

    case E::kBoundary:
      if (phase_ != Phase::kTraining) unexpected(e);
      report(e.epoch, e.step, /*has_state=*/true, {}, e.unix_ms);
      break;

    case E::kCollectiveFailed:
      if (phase_ != Phase::kTraining) unexpected(e);
      log(fmt::format("{}; reporting to the supervisor to go on without the failed rank", e.text));
      emit([] {
        EngineAction a = make(A::kDropGroup);
        a.abort = true;
        return a;
      }());
      group_open_ = false;
      {
        const auto [epoch, step] = boundary_of(e.epoch, e.step);
        report(epoch, step, /*has_state=*/true, {}, e.unix_ms);
      }
      break;

    case E::kProgramError:
      // Not a protocol step: one SET that gpurun reads before this process's exit.
      set(keys::program_error(opt_.slot, opt_.pid), e.text.empty() ? "error" : e.text);
      break;

    case E::kValue:
      on_value(e, now);
      break;

    case E::kDone:
      on_done(e, now);
      break;

    case E::kFailed:
      // Only a set-up's collective can fail so: a snapshot write's failure is its kDone text.
      if (phase_ != Phase::kSetUp) unexpected(e);
      set_up_failed(e);
      break;
  }
  return std::move(out_);
}

void WorkerEngine::unexpected(const EngineEvent& e) const {
  throw InvariantError(fmt::format("worker engine (slot {}): event '{}' in phase {} (state {})",
                                   opt_.slot, to_string(e.kind), static_cast<int>(phase_),
                                   to_string(state_)));
}

void WorkerEngine::on_value(const EngineEvent& e, double now) {
  switch (phase_) {
    case Phase::kStartRecord:
      seen_ms_ = now;  // a spawned joiner sees its generation's decision here
      adopt(Decision::from_json(e.text));
      has_generation_ = true;
      joined();
      phase_ = Phase::kOpened;
      break;
    case Phase::kGo: {
      if (e.text != "go") {
        const Decision exit = Decision::from_json(e.text);
        if (exit.kind != Decision::Kind::kExit)
          throw ProtocolError(
              fmt::format("slot {}: go key '{}' holds neither \"go\" nor an exit decision",
                          opt_.slot, keys::go(opt_.slot, opt_.warm)));
        set_state(WorkerState::kExited, "a standby told to exit before it was needed");
        finish("a standby told to exit before it was needed", /*left=*/true, exit.reason);
        break;
      }
      gone_ = true;
      phase_ = Phase::kOpened;
      log("standby: a config names this slot; setting up the device");
      break;
    }
    case Phase::kAdmission: {
      seen_ms_ = now;
      std::string why;
      std::optional<Decision> d = take_join(e.text, why);
      if (!d) {
        set_state(WorkerState::kExited, "a warm joiner told to exit before it was admitted");
        finish("a warm joiner told to exit before it was admitted", /*left=*/true, why);
        break;
      }
      begin_set_up(*d, /*have_state=*/false, now);
      break;
    }
    case Phase::kDecision:
      on_decision(e.text, now);
      break;
    case Phase::kWake: {
      seen_ms_ = now;
      park_generation_ = -1;
      std::string why;
      std::optional<Decision> d = take_join(e.text, why);
      if (!d) {
        set_state(WorkerState::kExited, "told to exit while parked");
        finish("hold mode: told to exit while parked", /*left=*/true, why);
        break;
      }
      set_state(WorkerState::kRejoining, "woken for generation " + std::to_string(d->generation));
      jumped_ = true;  // its position is the state's, not where it parked
      begin_set_up(*d, /*have_state=*/false, now);
      break;
    }
    default:
      unexpected(e);
  }
}

void WorkerEngine::on_done(const EngineEvent& e, double now) {
  switch (phase_) {
    case Phase::kSetUp: {
      GPURUN_CHECK(su_ && su_->next > 0, "worker engine: kDone without a set-up step");
      const PlanStep& done = su_->plan[su_->next - 1];
      if (e.bytes > 0) timing_bytes_ = e.bytes;
      if (!done.mark.empty()) {
        const bool had_comm = std::any_of(marks_.begin(), marks_.end(),
                                          [](const auto& m) { return m.first == "comm"; });
        mark(done.mark == "comm" && had_comm ? "train_comm" : done.mark, now);
      }
      if (done.action.kind == A::kMakeGroup) group_open_ = true;
      run_plan(now);
      break;
    }
    case Phase::kSnapshotWrite:
      snapshot_end_ms_ = now;
      report(report_epoch_, report_step_, /*has_state=*/true,
             e.text.empty() ? std::string("ok") : e.text, e.unix_ms);
      break;
    case Phase::kLeaving:
      parked(now);
      break;
    default:
      unexpected(e);
  }
}

// ---- generations ---------------------------------------------------------------------------

void WorkerEngine::adopt(const Decision& d) {
  current_ = d;
}

void WorkerEngine::joined() {
  const int r = current_.rank_of(opt_.slot);
  if (r < 0)
    throw ProtocolError(fmt::format("slot {} is not a member of generation {} (active [{}])",
                                    opt_.slot, generation_, join_ids(current_.active)));
  set(keys::joined(generation_, r), std::to_string(opt_.pid));
}

std::optional<Decision> WorkerEngine::take_join(const std::string& json, std::string& exit_reason) {
  Decision d = Decision::from_json(json);
  if (d.kind == Decision::Kind::kExit) {
    exit_reason = d.reason;
    return std::nullopt;
  }
  adopt(d);
  has_generation_ = true;
  generation_ = d.generation;
  round_ = 0;
  joined();
  return d;
}

void WorkerEngine::report(int64_t epoch, int64_t step, bool has_state, std::string snapshot,
                          int64_t unix_ms) {
  Report r;
  r.rank = rank();
  r.gpu = opt_.slot;
  r.generation = generation_;
  r.round = round_;
  r.epoch = epoch;
  r.step = step;
  r.pid = opt_.pid;
  r.time_ms = unix_ms;
  r.has_state = has_state;
  r.snapshot = std::move(snapshot);
  if (r.rank < 0)
    throw ProtocolError(
        fmt::format("slot {} reports at a boundary but is not a member of generation {}", opt_.slot,
                    generation_));
  report_epoch_ = epoch;
  report_step_ = step;
  report_has_state_ = has_state;
  set(keys::report(generation_, round_, r.rank), r.to_json());
  wait_get(keys::decision(generation_, round_), Phase::kDecision);
}

void WorkerEngine::on_decision(const std::string& json, double now) {
  Decision d = Decision::from_json(json);
  using K = Decision::Kind;
  if (!report_has_state_) {  // a joiner whose set-up was abandoned reported without the state
    switch (d.kind) {
      case K::kSnapshot:  // a pause of the others: not its part; it reports again
        ++round_;
        report(report_epoch_, report_step_, /*has_state=*/false, {}, 0);
        return;
      case K::kExit:
        set_state(WorkerState::kExited, "told to exit after a failed join");
        finish("told to exit after a failed join", /*left=*/true, d.reason);
        return;
      case K::kResize:
        break;
      default:
        throw ProtocolError(fmt::format(
            "slot {} reported without state and got a '{}' decision (expected resize or exit)",
            opt_.slot, to_string(d.kind)));
    }
  }
  switch (d.kind) {
    case K::kContinue: {
      ++round_;
      adopt(d);
      EngineAction a = make(A::kTrain);
      a.decision = d;
      a.rank = rank();
      a.role = role_.empty() ? "member" : role_;
      a.env = generation_env(d, opt_.slot);
      emit(std::move(a));
      phase_ = Phase::kTraining;
      return;
    }
    case K::kSnapshot:
      ++round_;
      adopt(d);
      if (d.state_source.is_peer() && d.state_source.gpu == opt_.slot) {
        snapshot_begin_ms_ = now;
        snapshot_end_ms_ = 0;
        emit(make(A::kWriteSnapshot));
        phase_ = Phase::kSnapshotWrite;
      } else {
        report(report_epoch_, report_step_, /*has_state=*/true, {}, 0);
      }
      return;
    case K::kExit:
      finish("the job is finishing", /*left=*/false, d.reason);
      return;
    case K::kResize: {
      seen_ms_ = now;
      if (d.is_leaver(opt_.slot)) park_generation_ = d.generation;
      const bool have_state = report_has_state_;
      adopt(d);
      generation_ = d.generation;
      round_ = 0;
      begin_set_up(d, have_state, now);
      return;
    }
    case K::kStart:
      break;
  }
  throw ProtocolError(fmt::format("slot {}: unexpected decision kind '{}' at a boundary", opt_.slot,
                                  to_string(d.kind)));
}

/// enter(): the set-up of the generation `d` created, from this slot's point of view. A
/// handoff group (active ∪ {source}) when a peer hands the state to joiners (or to members a step
/// behind it); the pause snapshot's read when the generation resumes a pause; then a member makes
/// the generation's communicator (unless the handoff group is it), broadcasts rank 0's state at a
/// fresh start, verifies the checksum (unless the handoff did) and trains; a non-member leaves.
void WorkerEngine::begin_set_up(const Decision& d, bool have_state, double now) {
  SetUp su;
  su.d = d;
  su.have_state = have_state;
  su.member = d.is_member(opt_.slot);
  const int src = d.state_source.is_peer() ? d.state_source.gpu : -1;
  role_ = !su.member ? "leaver" : (have_state ? "member" : "joiner");
  if (opt_.slot == src) role_ = su.member ? "source" : "source-leaver";

  // Resize timings: only a `resize` makes a record (a launch or a restart is no resize).
  timing_generation_ = -1;
  marks_.clear();
  timing_bytes_ = 0;
  const double seen = std::exchange(seen_ms_, 0.0);
  if (d.kind == Decision::Kind::kResize) {
    timing_generation_ = d.generation;
    if (snapshot_end_ms_ > 0) {
      mark("snapshot_begin", snapshot_begin_ms_);
      mark("snapshot_end", snapshot_end_ms_);
    }
    if (seen > 0) mark("seen", seen);
    mark("ready", now);
  }
  snapshot_begin_ms_ = snapshot_end_ms_ = 0;

  if (group_open_) {  // the old generation's communicator ends here
    emit(make(A::kDropGroup));
    group_open_ = false;
  }
  const auto make_group = [&](const std::vector<int>& group, const std::string& purpose) {
    EngineAction a = make(A::kMakeGroup);
    a.prefix = keys::comm(d.generation, purpose);
    a.abort_key = keys::abort(d.generation);
    a.group = group;
    a.rank = index_of(group, opt_.slot);
    a.purpose = purpose;
    return PlanStep{std::move(a), "comm"};
  };
  bool verified = false, have_train_group = false;
  if (!d.active.empty()) {
    // Joiners, and members a step behind the source (docs/worker-runtime.md#failures),
    // receive the state; the others take part.
    if (src >= 0 && (!d.joiners.empty() || !d.behind.empty())) {
      std::vector<int> group = d.active;
      if (!has_id(group, src)) group.insert(std::upper_bound(group.begin(), group.end(), src), src);
      if (has_id(group, opt_.slot)) {
        const bool same = group == d.active;
        su.plan.push_back(make_group(group, same ? "train" : "handoff"));
        const int root = index_of(group, src);
        EngineAction b = make(A::kBroadcastState);
        b.root = root;
        b.receive = !have_state || has_id(d.behind, opt_.slot);
        su.plan.push_back({std::move(b), "state"});
        EngineAction v = make(A::kVerifyState);
        v.root = root;
        v.text = "after the handoff";
        su.plan.push_back({std::move(v), "checksum"});
        verified = true;
        if (same) {
          have_train_group = true;
        } else {
          su.plan.push_back({make(A::kDropGroup), ""});
        }
      }
    } else if (d.state_source.is_snapshot() && su.member) {
      // The position the snapshot's state must hold (a stale file copied over it would roll
      // training back): the resume names the last boundary before the pause, (e, 0) at an
      // epoch's end — the state is then at epoch e + 1, step 0 — or (e, k) at step k.
      EngineAction r = make(A::kReadSnapshot);
      r.epoch = d.epoch < 0 ? -1 : (d.step == 0 ? d.epoch + 1 : d.epoch);
      r.step = d.epoch < 0 ? -1 : d.step;
      su.plan.push_back({std::move(r), "state"});
    }
  }
  if (su.member) {
    if (!have_train_group) su.plan.push_back(make_group(d.active, "train"));
    if (d.state_source.is_none()) {  // a fresh start: rank 0's initial state
      EngineAction b = make(A::kBroadcastState);
      b.root = 0;
      b.receive = d.rank_of(opt_.slot) != 0;
      su.plan.push_back({std::move(b), "state"});
    }
    if (!verified) {
      EngineAction v = make(A::kVerifyState);
      v.root = std::max(0, index_of(d.active, src));
      v.text = "after the boundary";
      su.plan.push_back({std::move(v), "checksum"});
    }
  }
  su_ = std::move(su);
  phase_ = Phase::kSetUp;
  run_plan(now);
}

/// Emits the set-up's next steps up to the first that needs an outcome; at the plan's end the
/// member trains, the non-member leaves.
void WorkerEngine::run_plan(double now) {
  while (su_->next < su_->plan.size()) {
    const EngineAction& a = su_->plan[su_->next++].action;
    emit(a);
    if (a.kind == A::kDropGroup) group_open_ = false;
    if (a.needs_outcome()) return;
  }
  if (su_->member) {
    train(now);
  } else {
    leave(now);
  }
}

void WorkerEngine::train(double now) {
  const Decision d = su_->d;
  su_.reset();
  if (state_ != WorkerState::kActive)
    set_state(WorkerState::kActive, "joined generation " + std::to_string(d.generation));
  mark("resumed", now);
  publish_timing();
  EngineAction a = make(A::kTrain);
  a.decision = d;
  a.rank = rank();
  a.role = role_;
  a.jumped = std::exchange(jumped_, false);
  a.env = generation_env(d, opt_.slot);
  emit(std::move(a));
  phase_ = Phase::kTraining;
}

void WorkerEngine::set_up_failed(const EngineEvent& e) {
  SetUp su = std::move(*su_);
  su_.reset();
  emit([] {
    EngineAction a = make(A::kDropGroup);
    a.abort = true;
    return a;
  }());
  group_open_ = false;
  const int64_t g = su.d.generation;
  if (su.have_state || state_ == WorkerState::kActive) {  // a holder
    if (!su.member) {
      // A leaving state source whose handoff failed (its joiner died): it cannot hand the
      // state on; it leaves as decided and gpurun, seeing no holder left, says the state is
      // lost (docs/control-protocol.md#failures-during-a-resize).
      log(fmt::format("handing the state to generation {} failed: {}; leaving as decided", g,
                      e.text));
      timing_generation_ = -1;
      su_ = std::move(su);
      leave(e.mono_ms);
      return;
    }
    // It holds the state: it reports again in the new generation; gpurun decides without the
    // failed rank.
    timing_generation_ = -1;
    log(fmt::format("{}; reporting to the supervisor to go on without the failed rank", e.text));
    const auto [epoch, step] = boundary_of(e.epoch, e.step);
    report(epoch, step, /*has_state=*/true, {}, e.unix_ms);
    return;
  }
  // A joiner without the state holds nothing to lose: it reports without it and follows
  // gpurun's next decision (join again, leave, or exit), as often as it takes.
  timing_generation_ = -1;
  log(fmt::format(
      "joining generation {} failed: {}; this rank holds no state yet: reporting to gpurun and "
      "waiting for its next decision",
      g, e.text));
  report(su.d.epoch, su.d.step, /*has_state=*/false, {}, e.unix_ms);
}

/// OFFLOADING → release: free the state, EXITED, the loops end (the process ends normally) |
/// hold: free GPU memory, PARKED, wait for the wake.
void WorkerEngine::leave(double /*now*/) {
  const Decision d = su_ ? su_->d : current_;
  su_.reset();
  set_state(WorkerState::kOffloading, "left in generation " + std::to_string(d.generation));
  if (group_open_) {
    emit(make(A::kDropGroup));
    group_open_ = false;
  }
  current_.park_mode = d.park_mode;  // the decision's mode, not the one it started with
  EngineAction a = make(d.park_mode == ParkMode::kRelease ? A::kRelease : A::kPark);
  a.role = role_;
  emit(std::move(a));
  phase_ = Phase::kLeaving;
}

void WorkerEngine::parked(double now) {
  mark("left", now);
  publish_timing();
  if (current_.park_mode == ParkMode::kRelease) {
    set_state(WorkerState::kExited,
              "release mode: left in generation " + std::to_string(generation_));
    finish("release mode: a leaver's loop ends", /*left=*/true);
    return;
  }
  set_state(WorkerState::kParked, "hold mode");
  GPURUN_CHECK(park_generation_ >= 0, "slot {} parks without having left", opt_.slot);
  set(keys::parked(opt_.slot, park_generation_), std::to_string(opt_.pid));
  wait_get(keys::wake(opt_.slot, park_generation_), Phase::kWake);
}

void WorkerEngine::finish(std::string text, bool left, std::string reason) {
  EngineAction a = make(A::kExit);
  a.text = std::move(text);
  a.left = left;
  a.reason = std::move(reason);
  emit(std::move(a));
  phase_ = Phase::kDone;
}

// ---- resize timings ------------------------------------------------------------------------

void WorkerEngine::mark(const std::string& name, double t) {
  if (timing_generation_ >= 0) marks_.emplace_back(name, t);
}

void WorkerEngine::publish_timing() {
  if (timing_generation_ < 0) return;
  std::string out = fmt::format(
      R"({{"v":1,"gpu":{},"pid":{},"role":"{}","bytes":{},"clock":"monotonic","marks":{{)",
      opt_.slot, opt_.pid, role_, timing_bytes_);
  for (size_t i = 0; i < marks_.size(); ++i)
    out += fmt::format(R"({}"{}":{:.3f})", i == 0 ? "" : ",", marks_[i].first, marks_[i].second);
  out += "}}";
  EngineAction a = make(A::kSet);
  a.key = keys::timing(timing_generation_, opt_.slot);
  a.value = std::move(out);
  a.best_effort = true;
  emit(std::move(a));
  timing_generation_ = -1;
  marks_.clear();
}

}  // namespace gpurun::control
