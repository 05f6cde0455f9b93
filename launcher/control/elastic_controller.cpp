// ElasticController: its construction, processes' and nodes' events, config reloads, the
// store's keys, the scheduler's effects and status.json. Its policies (the set the job trains
// on): elastic_controller_policy.cpp; the pause snapshot across nodes:
// elastic_controller_snapshot.cpp.
#include "control/elastic_controller.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <boost/asio/post.hpp>
#include <chrono>
#include <thread>

#include "control/status.hpp"
#include "supervisor/asio_clock.hpp"

namespace gpurun::control {

namespace asio = boost::asio;

namespace {

// /proc/<pid>/stat's state is 'T' (stopped by a signal) or 't' (tracing stop).
bool stopped_now(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  return line[close + 2] == 'T' || line[close + 2] == 't';
}

// Stopped in four readings 50 ms apart: a sampling profiler (py-spy pauses its target for each
// sample, ~1 ms) is not a stop; SIGSTOP or a debugger's prompt is. Blocks at most 150 ms, and
// only when the first reading says stopped (a deadline's expiry with a late rank).
bool process_stopped(int pid) {
  for (int i = 0; i < 4; ++i) {
    if (!stopped_now(pid)) return false;
    if (i < 3) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

}  // namespace
using supervisor::ExitStatus;
using supervisor::StreamId;

ElasticController::ElasticController(asio::io_context& io, store::Backend& backend,
                                     supervisor::Supervisor& supervisor,
                                     supervisor::EventLog& events, supervisor::Console& console,
                                     Config initial, ElasticOptions options)
    : io_(io),
      backend_(backend),
      supervisor_(supervisor),
      events_(events),
      console_(console),
      opt_(std::move(options)),
      declared_(initial),
      scheduler_(opt_.slots, initial, opt_.launch),
      status_writer_(
          io, opt_.run_dir, [this] { return render_current_status(); },
          [this](const std::string& error) {
            console_.write(StreamId::kStderr, "gpurun: warning: " + error + "\n");
          },
          StatusWriter::kMinInterval, opt_.clock),
      own_clock_(opt_.clock ? nullptr : std::make_unique<supervisor::AsioClock>(io)),
      clock_(opt_.clock ? *opt_.clock : *own_clock_) {
  scheduler_.config_loaded(std::move(initial), opt_.config_path.string());
  if (opt_.nodes) {
    NodeHubOptions nodes = *opt_.nodes;
    nodes.generation = [this] { return scheduler_.generation(); };
    hub_ = std::make_unique<NodeHub>(backend_, std::move(nodes), &monotonic_ms);
    if (opt_.nodes->node_timeout.count() > 0) check_node_heartbeats();
  }
  if (hub_)
    scheduler_.resume_gate = [this](const std::vector<int>& target) {
      return snapshot_on_nodes(target);
    };
  // Another node's process is not in this /proc: it is never taken for stopped here.
  scheduler_.stalled_probe = [this](int pid) {
    return !(hub_ && hub_->remote_pid(pid)) && process_stopped(pid);
  };
  backend_.set_write_observer(std::string(keys::kPrefix),
                              [this, alive = std::weak_ptr<int>(alive_)](const std::string& k) {
                                // Inside a store operation: handle it on a fresh stack.
                                asio::post(io_, [this, alive, k] {
                                  if (!alive.expired()) on_key(k);
                                });
                              });
  WatcherOptions watcher = opt_.watcher;
  if (!watcher.clock) watcher.clock = &clock_;
  watcher_ = std::make_unique<ConfigWatcher>(io_, opt_.config_path, watcher, [this] { reload(); });
  if (!opt_.run_dir.empty())
    leases_ = std::make_unique<LeaseKeeper>(
        io_, opt_.run_dir, watcher,
        [this](const std::vector<LeaseKeeper::Change>& c) { on_leases(c); },
        [this](const std::string& error) {
          console_.write(StreamId::kStderr,
                         fmt::format("gpurun: warning: {}; the leases in force before stay, "
                                     "training goes on\n",
                                     error));
        });
  run_effects();
}

ElasticController::~ElasticController() {
  backend_.set_write_observer({}, {});
}

void ElasticController::set_energy_hooks(EnergyHooks hooks) {
  energy_ = std::move(hooks);
  if (!energy_.boundary) return;
  scheduler_.on_boundary = [this](const BoundaryInfo& b) -> std::optional<std::string> {
    in_boundary_ = true;
    std::optional<std::string> why = energy_.boundary(b);
    in_boundary_ = false;
    // A policy changed by the boundary's epoch (scale = "auto") takes effect at this boundary:
    // the scheduler's config is in place before its decision; the caller runs the effects.
    if (std::exchange(policy_pending_, false) && !why) apply_policy(/*effects=*/false);
    return why;
  };
}

void ElasticController::on_attempt_start(int attempt) {
  deadlines_.clear();
  scheduler_.start_attempt(attempt);
  run_effects();
}

bool ElasticController::on_worker_exit(int local_rank, ExitStatus status, bool can_restart) {
  return process_exited(local_rank, status.success(), status.describe(), can_restart);
}

bool ElasticController::process_exited(int gpu, bool success, const std::string& how,
                                       bool can_restart) {
  if (auto s = scheduler_.slots().find(gpu); s != scheduler_.slots().end())
    timeline_.slot_gone(gpu, s->second.pid);
  const bool was_finished = scheduler_.finished();
  const bool absorbed = scheduler_.on_process_exit(gpu, success, how, can_restart);
  // A failure once the job is finishing (a member finished training) is nothing the others
  // go on without: what it did after its loop (saving, evaluating) is lost, so the job fails.
  // The end of a process the scheduler does not count as failed is none: a warm joiner that
  // was never admitted, ended (SIGKILL) because the job is finishing, stays PARKED.
  const auto slot = scheduler_.slots().find(gpu);
  const bool failed = slot != scheduler_.slots().end() && slot->second.state == SlotState::kFailed;
  if (was_finished && !success && failed && failed_while_finishing_.empty())
    failed_while_finishing_ =
        fmt::format("{} ended with {} after the job finished training", slot_name(gpu), how);
  if (!was_finished && scheduler_.finished() && success && scheduler_.stop_reason().empty() &&
      energy_.training_finished) {
    // The last epoch ended with this exit: the one after the last end-of-epoch boundary, or
    // the epoch of the last step boundary.
    const auto& b = scheduler_.last_boundary();
    energy_.training_finished(!b ? 0 : b->second == 0 ? b->first + 1 : b->first);
  }
  run_effects();
  return absorbed;
}

void ElasticController::on_nodes(const NodeHub::Changes& ch) {
  for (const std::string& line : ch.lines)
    console_.write(StreamId::kStderr, "gpurun: " + line + "\n");
  if (!ch.new_slots.empty()) scheduler_.add_slots(ch.new_slots);
  if (!ch.withdrawn.empty()) scheduler_.withdraw_slots(ch.withdrawn);
  for (const auto& [slot, pid] : ch.started) {
    scheduler_.on_spawned(slot, pid);
    timeline_.spawned(slot, pid);
  }
  for (const NodeHub::Exit& e : ch.exits) {
    const bool absorbed = process_exited(e.slot, e.clean, e.how, /*can_restart=*/false);
    // Another node's failure elastic mode does not absorb (the program's own error): the job
    // fails, as for a local one.
    if (!absorbed && !e.clean)
      supervisor_.stop_for_peer(fmt::format("{} ended with {}", slot_name(e.slot), e.how));
  }
  for (const auto& [node, e] : ch.fetched) snapshot_copied(node, e);
  if (ch.offers_changed && !scheduler_.finished()) apply_policy();
  run_effects();
  // The end of another node's last process, or a new one, changes holds_job_open().
  supervisor_.controller_changed();
}

void ElasticController::check_node_heartbeats() {
  const NodeHub::Changes ch = hub_->check_heartbeats();
  if (ch.any()) on_nodes(ch);
  heartbeat_timer_ = clock_.schedule_after(heartbeat_interval(opt_.nodes->node_timeout),
                                           [this, alive = std::weak_ptr<int>(alive_)] {
                                             if (!alive.expired()) check_node_heartbeats();
                                           });
}

std::string ElasticController::failure_summary() const {
  if (!scheduler_.state_lost().empty()) return scheduler_.state_lost();
  if (!failed_while_finishing_.empty()) return failed_while_finishing_;
  return SlotController::failure_summary();
}

bool ElasticController::succeeded() const {
  if (!scheduler_.state_lost().empty()) return false;  // stopped: nothing can go on
  if (!failed_while_finishing_.empty()) return false;
  for (const auto& [gpu, s] : scheduler_.slots())
    if (s.state == SlotState::kExited) return true;
  return false;
}

void ElasticController::on_checkpoint_request() {
  scheduler_.request_checkpoint();
}

bool ElasticController::on_stop_request(const std::string& why) {
  const bool ok = scheduler_.request_stop(why);
  run_effects();
  return ok;
}

void ElasticController::on_reload_request() {
  console_.write(StreamId::kStderr, "gpurun: received SIGHUP: reloading the config\n");
  sighup_pending_ = true;  // the next reload answers it, whatever it finds
  if (watcher_) watcher_->request_reload();
}

void ElasticController::reload() {
  const bool sighup = std::exchange(sighup_pending_, false);
  const std::string why = sighup ? "SIGHUP" : "the file changed";
  try {
    Config c = load_config(opt_.config_path, opt_.slots);
    // Nothing new (e.g. a touch), unless it fixes a rejected file. A SIGHUP is always
    // answered: the user asked what is in force.
    if (c == declared_ && scheduler_.last_config_error().empty()) {
      if (sighup) {
        const std::string in_force = describe(declared_);
        console_.write(StreamId::kStderr,
                       fmt::format("gpurun: config unchanged ({}): {}\n", why, in_force));
        events_.emit("config_unchanged", supervisor::JsonObject()
                                             .add("path", opt_.config_path.string())
                                             .add("trigger", why)
                                             .add("config", in_force));
      }
      return;
    }
    console_.write(StreamId::kStderr,
                   fmt::format("gpurun: config reloaded ({}): {}\n", why, describe(c)));
    if (c.notify != declared_.notify)
      console_.write(StreamId::kStderr,
                     "gpurun: note: [notify] changed: the notify command in use stays until the "
                     "next run\n");
    if (c.energy != declared_.energy)
      console_.write(StreamId::kStderr,
                     "gpurun: note: [energy] changed: the energy monitor keeps the settings it "
                     "started with; the change takes effect at the next run\n");
    timeline_.config_seen();
    declared_ = c;
    Config effective = effective_config(c);
    if (effective.active_gpus != c.active_gpus)
      console_.write(StreamId::kStderr,
                     fmt::format("gpurun: leases in force: the job trains on [{}]\n",
                                 join_ids(*effective.active_gpus, ", ")));
    scheduler_.config_loaded(std::move(effective), opt_.config_path.string());
  } catch (const ConfigError& e) {
    scheduler_.config_rejected(opt_.config_path.string(), e.what());
    run_effects();  // the rejection is said first
    console_.write(StreamId::kStderr,
                   fmt::format("gpurun: the config in force: {}\n", describe(scheduler_.config())));
    return;
  }
  run_effects();
}

void ElasticController::on_key(const std::string& key) {
  if (hub_)
    if (const std::optional<NodeHub::Changes> ch = hub_->on_key(key)) {
      if (ch->any()) on_nodes(*ch);
      return;
    }
  if (energy_.store_write && energy_.store_write(key)) return;
  std::optional<keys::WorkerWrite> write;
  try {
    write = keys::parse_worker_write(key, backend_.get(key));
  } catch (const ProtocolError& e) {
    console_.write(StreamId::kStderr, fmt::format("gpurun: warning: ignoring a bad boundary "
                                                  "report: {}\n",
                                                  e.what()));
    run_effects();
    return;
  }
  if (!write) return;  // our own writes, and keys we do not know
  const auto* timing = std::get_if<keys::Timing>(&*write);
  if (timing)
    timeline_.on_record(timing->generation, timing->gpu, timing->record,
                        hub_ ? hub_->clock_offset_ms(slot_node(timing->gpu)) : 0.0);
  scheduler_.on(*write);
  if (timing) {
    emit_resize_events();
    write_status();
  }
  run_effects();
}

void ElasticController::follow_generation() {
  if (console_active_ == scheduler_.active()) return;
  console_active_ = scheduler_.active();
  supervisor_.set_generation(console_active_);
  // The other nodes' workers are named the same way (their console prefixes, status.json).
  if (hub_) hub_->generation(scheduler_.generation(), *console_active_);
}

void ElasticController::run_effects() {
  lose_unreachable_snapshot();  // a node lost with the paused job's only snapshot
  control::run_effects(scheduler_, *this);
  follow_generation();
  emit_resize_events();
  if (energy_.active_changed && scheduler_.active() != energy_active_) {
    energy_active_ = scheduler_.active();
    energy_.active_changed(energy_active_);
  }
  // Timers of rounds already decided are no longer needed (the current generation's set-up
  // deadline is, until it expires: on_deadline ignores it once every participant is done).
  for (auto it = deadlines_.begin(); it != deadlines_.end();) {
    const bool current =
        it->first.first == scheduler_.generation() &&
        (it->first.second == scheduler_.round() || it->first.second == Scheduler::kSetUpRound);
    it = current ? std::next(it) : deadlines_.erase(it);
  }
  if (hub_)  // a leaving node none of whose slots has a process left may go
    hub_->release_idle(
        [this](int slot) {
          const auto s = scheduler_.slots().find(slot);
          return s != scheduler_.slots().end() && s->second.pid >= 0;
        },
        [this](int node) { return keep_for_snapshot(node); });
  write_status();
}

void ElasticController::begin_batch() {
  follow_generation();  // a joiner spawned by this batch starts with its generation's prefixes
}

void ElasticController::write_key(const std::string& key, const std::string& value,
                                  const Decision* decision) {
  backend_.set(key, value);
  // Resize timings (docs/control-protocol.md#resize-timings): the first write of a decision
  // (its decision or start key) starts its timeline; later ones (wakes, admissions) are
  // ignored there.
  if (decision) timeline_.decision_written(*decision);
}

void ElasticController::delete_key(const std::string& key) {
  backend_.delete_key(key);
}

void ElasticController::abandon_keys(const std::string& prefix) {
  backend_.abandon_prefix(prefix);
}

int ElasticController::spawn(int gpu, int64_t generation, int64_t warm, bool standby,
                             const Decision& decision) {
  if (hub_ && NodeHub::remote(gpu))  // another node's slot: its gpurun starts it
    return hub_->spawn(gpu, generation, warm, standby, decision);
  const int pid = supervisor_.spawn_elastic(decision, {.slot = gpu,
                                                       .generation = generation,
                                                       .warm = warm,
                                                       .standby = standby,
                                                       .config_path = opt_.config_path.string()});
  if (pid > 0) timeline_.spawned(gpu, pid);
  return pid;
}

void ElasticController::kill(int gpu) {
  if (hub_ && NodeHub::remote(gpu)) return hub_->kill(gpu);
  supervisor_.kill_slot(gpu);
}

void ElasticController::arm_deadline(int64_t generation, int64_t round,
                                     std::chrono::milliseconds after) {
  const auto id = std::make_pair(generation, round);
  deadlines_[id] = clock_.schedule_after(after, [this, id, alive = std::weak_ptr<int>(alive_)] {
    if (alive.expired()) return;
    scheduler_.on_deadline(id.first, id.second);
    run_effects();
  });
}

void ElasticController::event(const std::string& name, const JsonObject& fields) {
  events_.emit(name, fields);
}

void ElasticController::say(const std::string& line) {
  console_.write(StreamId::kStderr, "gpurun: " + line + "\n");
}

void ElasticController::emit_resize_events() {
  for (const JsonObject& e : timeline_.take_ready()) events_.emit("resize", e);
}

void ElasticController::write_status() {
  status_writer_.publish();
}

std::string ElasticController::render_current_status() const {
  StatusSnapshot snap;
  snap.run_id = opt_.run_id;
  snap.run_dir = opt_.run_dir;
  snap.config_path = opt_.config_path.string();
  snap.supervisor_pid = static_cast<int>(::getpid());
  snap.physical_gpus = opt_.physical_gpus;
  snap.energy = opt_.energy_status;
  snap.last_resize = timeline_.last();
  snap.policy = policy_status();
  if (hub_) snap.nodes = hub_->status_json();
  return render_status(scheduler_, snap);
}

}  // namespace gpurun::control
