#include "testing/in_memory_control.hpp"

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "runtime/runtime_seams.hpp"

namespace gpurun::testing {

using control::Decision;
using control::Effect;
namespace keys = control::keys;

// ---- InMemorySupervisor ---------------------------------------------------------------------

InMemorySupervisor::InMemorySupervisor(Options options, Spawner spawner)
    : opt_(std::move(options)), spawner_(std::move(spawner)), scheduler_(opt_.slots, opt_.config) {}

void InMemorySupervisor::start() {
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_.start_attempt(0);
  run_effects();
}

void InMemorySupervisor::load_config(control::Config config) {
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_.config_loaded(std::move(config), "in-memory config.toml");
  run_effects();
}

void InMemorySupervisor::load_config_at(int64_t epoch, int64_t step, control::Config config) {
  std::lock_guard<std::mutex> lock(mu_);
  script_.push_back({{epoch, step}, std::move(config)});
}

void InMemorySupervisor::apply_scripted(int64_t epoch, int64_t step) {
  for (auto it = script_.begin(); it != script_.end(); ++it) {
    if (it->first != std::make_pair(epoch, step)) continue;
    scheduler_.config_loaded(std::move(it->second), "in-memory config.toml");
    script_.erase(it);
    return;
  }
}

void InMemorySupervisor::process_exited(int gpu, bool clean, const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_.on_process_exit(gpu, clean, how, /*can_restart=*/false);
  run_effects();
}

void InMemorySupervisor::joined(int64_t generation, int rank, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_[keys::joined(generation, rank)] = std::to_string(pid);
  scheduler_.on_joined(generation, rank, pid);
  run_effects();
}

void InMemorySupervisor::report(const control::Report& r) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_[keys::report(r.generation, r.round, r.rank)] = r.to_json();
  apply_scripted(r.epoch, r.step);
  scheduler_.on_report(r);
  run_effects();
}

void InMemorySupervisor::parked(int gpu, int64_t park_generation, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_[keys::parked(gpu, park_generation)] = std::to_string(pid);
  scheduler_.on_parked(gpu, park_generation);
  run_effects();
}

void InMemorySupervisor::ready(int gpu, int64_t warm, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  kv_[keys::ready(gpu, warm)] = std::to_string(pid);
  scheduler_.on_ready(gpu, warm);
  run_effects();
  // Ended (killed) before it was ready: a thread cannot be killed, it is told to exit instead.
  const control::SlotInfo& s = scheduler_.slots().at(gpu);
  const std::string admit = keys::admit(gpu, warm);
  if ((s.state != control::SlotState::kWarming || s.warm_id != warm) && !kv_.count(admit)) {
    Decision x;
    x.kind = Decision::Kind::kExit;
    kv_[admit] = x.to_json();
    cv_.notify_all();
  }
}

std::string InMemorySupervisor::wait_get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, opt_.wait_timeout, [&] { return kv_.count(key) != 0; }))
    throw StoreTimeout(fmt::format("in-memory store: key '{}' did not appear within {} ms", key,
                                   opt_.wait_timeout.count()));
  return kv_.at(key);
}

bool InMemorySupervisor::wait_for(const std::function<bool(const control::Scheduler&)>& pred,
                                  std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return pred(scheduler_); });
}

void InMemorySupervisor::inspect(const std::function<void(const control::Scheduler&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  f(scheduler_);
}

std::vector<Decision> InMemorySupervisor::decisions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decisions_;
}

std::vector<std::string> InMemorySupervisor::ignored_effects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ignored_;
}

void InMemorySupervisor::run_effects() {
  // As ElasticController::run_effects: effects may produce more (spawn -> on_spawned).
  for (std::vector<Effect> batch = scheduler_.take_effects(); !batch.empty();
       batch = scheduler_.take_effects()) {
    for (Effect& e : batch) {
      switch (e.kind) {
        case Effect::Kind::kWriteKey:
          if (!e.value.empty() && e.value.front() == '{') {
            try {
              decisions_.push_back(Decision::from_json(e.value));
            } catch (const control::ProtocolError&) {
            }
          }
          kv_[e.key] = e.value;
          break;
        case Effect::Kind::kDeleteKey:
          kv_.erase(e.key);
          break;
        case Effect::Kind::kSpawn: {
          const int pid = next_pid_++;
          spawner_(e.gpu, e.generation, e.warm, pid);
          scheduler_.on_spawned(e.gpu, pid);
          break;
        }
        case Effect::Kind::kKill: {
          ignored_.push_back(fmt::format("kill {}", e.gpu));
          const std::string ready = fmt::format("gpurun/slot/{}/ready/", e.gpu);
          for (auto it = kv_.lower_bound(ready);
               it != kv_.end() && it->first.compare(0, ready.size(), ready) == 0; ++it) {
            const std::string admit =
                keys::admit(e.gpu, std::stoll(it->first.substr(ready.size())));
            Decision x;
            x.kind = Decision::Kind::kExit;
            if (!kv_.count(admit)) kv_[admit] = x.to_json();
          }
          break;
        }
        case Effect::Kind::kArmDeadline:
          ignored_.push_back(fmt::format("deadline {}/{}", e.generation, e.round));
          break;
        case Effect::Kind::kEvent:
        case Effect::Kind::kSay:
          break;
      }
    }
  }
  cv_.notify_all();
}

// ---- InMemoryControl ------------------------------------------------------------------------

InMemoryControl::InMemoryControl(InMemorySupervisor& sup, int gpu, int64_t join_generation, int pid,
                                 int64_t warm)
    : sup_(sup), gpu_(gpu), pid_(pid), generation_(join_generation), warm_(warm) {}

std::optional<Decision> InMemoryControl::wait_admission() {
  if (warm_ < 0) throw control::ProtocolError(fmt::format("slot {} is not a warm joiner", gpu_));
  sup_.ready(gpu_, warm_, pid_);
  return take_join_decision(sup_.wait_get(keys::admit(gpu_, warm_)));
}

std::optional<Decision> InMemoryControl::take_join_decision(const std::string& json) {
  Decision d = Decision::from_json(json);
  if (d.kind == Decision::Kind::kExit) return std::nullopt;
  current_ = d;
  generation_ = d.generation;
  round_ = 0;
  write_joined();
  return d;
}

void InMemoryControl::write_joined() {
  const int r = current_.rank_of(gpu_);
  if (r < 0)
    throw control::ProtocolError(
        fmt::format("slot {} is not a member of generation {}", gpu_, generation_));
  sup_.joined(generation_, r, pid_);
}

const Decision& InMemoryControl::join() {
  current_ = Decision::from_json(sup_.wait_get(keys::start(generation_)));
  round_ = 0;
  write_joined();
  return current_;
}

Decision InMemoryControl::report_and_wait(int64_t epoch, int64_t step, bool has_state,
                                          std::string snapshot) {
  control::Report r;
  r.rank = current_.rank_of(gpu_);
  r.gpu = gpu_;
  r.generation = generation_;
  r.round = round_;
  r.epoch = epoch;
  r.step = step;
  r.pid = pid_;
  r.has_state = has_state;
  r.snapshot = std::move(snapshot);
  if (r.rank < 0)
    throw control::ProtocolError(
        fmt::format("slot {} reports but is not a member of generation {}", gpu_, generation_));
  sup_.report(r);
  Decision d = Decision::from_json(sup_.wait_get(keys::decision(generation_, round_)));
  current_ = d;
  if (d.kind == Decision::Kind::kContinue || d.kind == Decision::Kind::kSnapshot) {
    ++round_;
  } else if (d.kind == Decision::Kind::kResize) {
    if (d.is_leaver(gpu_)) park_generation_ = d.generation;
    generation_ = d.generation;
    round_ = 0;
  }
  return d;
}

std::optional<Decision> InMemoryControl::park_and_wait() {
  if (park_generation_ < 0)
    throw control::ProtocolError(fmt::format("slot {} parks without having left", gpu_));
  sup_.parked(gpu_, park_generation_, pid_);
  const std::string json = sup_.wait_get(keys::wake(gpu_, park_generation_));
  park_generation_ = -1;
  return take_join_decision(json);
}

// ---- ThreadJob --------------------------------------------------------------------------------

ThreadJob::ThreadJob(Options options, Train train)
    : opt_(std::move(options)),
      train_(std::move(train)),
      sup_({.slots = opt_.slots, .config = opt_.config, .wait_timeout = opt_.wait_timeout},
           [this](int gpu, int64_t generation, int64_t warm, int pid) {
             spawn(gpu, generation, warm, pid);
           }) {}

ThreadJob::~ThreadJob() {
  std::vector<std::thread> threads;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    if (threads.empty()) break;
    for (std::thread& t : threads) t.join();
    threads.clear();
  }
}

void ThreadJob::spawn(int gpu, int64_t generation, int64_t warm, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  ++running_;
  threads_.emplace_back(
      [this, gpu, generation, warm, pid] { run_rank(gpu, generation, warm, pid); });
}

void ThreadJob::run_rank(int gpu, int64_t generation, int64_t warm, int pid) {
  Exit x;
  x.gpu = gpu;
  x.pid = pid;
  x.join_generation = generation;
  try {
    detail::RuntimeSeams s;
    s.options = opt_.runtime;
    s.env.slot = gpu;
    s.env.snapshot_path = opt_.snapshot_path;
    s.control = std::make_unique<InMemoryControl>(sup_, gpu, generation, pid, warm);
    s.make_comm = comms_.factory(gpu);
    s.on_state = [this, gpu, pid](WorkerState from, WorkerState to, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu_);
      changes_[gpu].push_back({pid, from, to, why});
    };
    std::unique_ptr<Runtime> rt = detail::make_runtime(std::move(s));
    train_(*rt);
    x.state = rt->state();
    x.left = rt->left();
    x.clean = true;
    x.how = "exit 0";
  } catch (const std::exception& e) {
    x.how = e.what();
  }
  const bool clean = x.clean;
  const std::string how = x.how;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exits_.push_back(std::move(x));
  }
  sup_.process_exited(gpu, clean, how);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
  cv_.notify_all();
}

bool ThreadJob::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_until(lock, deadline, [&] { return running_ == 0; })) return false;
    }
    bool open = false;
    sup_.inspect([&](const control::Scheduler& s) { open = s.holds_job_open(); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_ == 0 && !open) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::vector<ThreadJob::Exit> ThreadJob::exits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exits_;
}

std::vector<ThreadJob::StateChange> ThreadJob::state_changes(int gpu) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = changes_.find(gpu);
  return it == changes_.end() ? std::vector<StateChange>{} : it->second;
}

}  // namespace gpurun::testing
