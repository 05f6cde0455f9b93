#include "testing/in_memory_control.hpp"

#include <algorithm>
#include <variant>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "runtime/runtime_seams.hpp"

namespace gpurun::testing {

using control::Decision;
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

void InMemorySupervisor::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  store_.set(key, value);
  const std::optional<keys::WorkerWrite> write = keys::parse_worker_write(key, value);
  if (write) {
    // A scripted edit is in force before the boundary it names is decided.
    if (const auto* r = std::get_if<keys::Reported>(&*write))
      apply_scripted(r->report.epoch, r->report.step);
    scheduler_.on(*write);
  }
  run_effects();
  if (const auto* ready = write ? std::get_if<keys::Ready>(&*write) : nullptr)
    ready_locked(ready->gpu, ready->warm);
}

void InMemorySupervisor::ready_locked(int gpu, int64_t warm) {
  // Ended (killed) before it was ready: a thread cannot be killed, it is told to exit instead.
  const control::SlotInfo& s = scheduler_.slots().at(gpu);
  const std::string admit = keys::admit(gpu, warm);
  if ((s.state != control::SlotState::kWarming || s.warm_id != warm) && !store_.try_get(admit)) {
    Decision x;
    x.kind = Decision::Kind::kExit;
    store_.set(admit, x.to_json());
  }
}

std::optional<std::string> InMemorySupervisor::try_get(const std::string& key) {
  return store_.try_get(key);
}

std::string InMemorySupervisor::wait_get(const std::string& key) {
  return store_.get(key, opt_.wait_timeout);
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
  // The real effects loop (control::run_effects) over this fake's sink: keys in store_, a spawn
  // starts a rank; kills are recorded only, deadlines run on opt_.clock. A local class: it sees
  // the members.
  struct Sink final : control::EffectSink {
    InMemorySupervisor& sup;
    explicit Sink(InMemorySupervisor& s) : sup(s) {}
    void write_key(const std::string& key, const std::string& value,
                   const Decision* decision) override {
      if (decision) sup.decisions_.push_back(*decision);
      sup.store_.set(key, value);
    }
    void delete_key(const std::string& key) override { sup.store_.remove(key); }
    void abandon_keys(const std::string&) override {}  // no rendezvous here waits on the keys
    int spawn(int gpu, int64_t generation, int64_t warm, bool standby, const Decision&) override {
      const int pid = sup.next_pid_++;
      sup.spawner_(gpu, generation, warm, standby, pid);
      return pid;
    }
    void kill(int gpu) override {
      sup.ignored_.push_back(fmt::format("kill {}", gpu));
      // A warm joiner of that slot waiting for its admission, or a standby waiting for its go,
      // is told to exit.
      std::vector<std::string> admits;
      for (const auto& [key, value] : sup.store_.snapshot()) {
        std::optional<keys::WorkerWrite> w;
        try {
          w = keys::parse_worker_write(key, value);
        } catch (const control::ProtocolError&) {  // a bad report: refused when written
        }
        if (const auto* r = w ? std::get_if<keys::Ready>(&*w) : nullptr; r && r->gpu == gpu)
          admits.push_back(keys::admit(gpu, r->warm));
      }
      if (const int64_t id = sup.scheduler_.slots().at(gpu).warm_id; id >= 0)
        admits.push_back(keys::go(gpu, id));
      for (const std::string& admit : admits) {
        Decision x;
        x.kind = Decision::Kind::kExit;
        if (!sup.store_.try_get(admit)) sup.store_.set(admit, x.to_json());
      }
    }
    void arm_deadline(int64_t generation, int64_t round, std::chrono::milliseconds after) override {
      if (!sup.opt_.clock) {
        sup.ignored_.push_back(fmt::format("deadline {}/{}", generation, round));
        return;
      }
      // As ElasticController::arm_deadline: a re-armed (generation, round) replaces the last.
      const auto id = std::make_pair(generation, round);
      InMemorySupervisor* self = &sup;
      sup.deadlines_[id] = sup.opt_.clock->schedule_after(after, [self, id] {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->scheduler_.on_deadline(id.first, id.second);
        self->run_effects();
      });
    }
    void event(const std::string&, const JsonObject&) override {}
    void say(const std::string&) override {}
  } sink(*this);
  control::run_effects(scheduler_, sink);
  cv_.notify_all();  // wait_for: the scheduler changed
}

// ---- ThreadJob --------------------------------------------------------------------------------

ThreadJob::ThreadJob(Options options, Train train)
    : opt_(std::move(options)),
      train_(std::move(train)),
      sup_({.slots = opt_.slots,
            .config = opt_.config,
            .wait_timeout = opt_.wait_timeout,
            .clock = opt_.clock},
           [this](int gpu, int64_t generation, int64_t warm, bool standby, int pid) {
             spawn(gpu, generation, warm, standby, pid);
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

void ThreadJob::spawn(int gpu, int64_t generation, int64_t warm, bool standby, int pid) {
  std::lock_guard<std::mutex> lock(mu_);
  ++running_;
  threads_.emplace_back([this, gpu, generation, warm, standby, pid] {
    run_rank(gpu, generation, warm, standby, pid);
  });
}

namespace {
struct StandbyExited {};  // a thread cannot exit its process: the standby's exit unwinds it
}  // namespace

void ThreadJob::run_rank(int gpu, int64_t generation, int64_t warm, bool standby, int pid) {
  Exit x;
  x.gpu = gpu;
  x.pid = pid;
  x.join_generation = generation;
  try {
    detail::RuntimeSeams s;
    s.options = opt_.runtime;
    s.env.slot = gpu;
    s.env.snapshot_path = opt_.snapshot_path;
    control::SessionOptions so;
    so.engine = {gpu, generation < 0 ? 0 : generation, warm, pid, standby};
    s.standby_exit = [] { throw StandbyExited{}; };
    s.warm_up = opt_.warm_up;
    s.warm_up_waited = opt_.warm_up_waited;
    if (gpu == opt_.export_env_slot) s.export_env = &rt::export_env;
    s.control = std::make_unique<control::WorkerSession>(std::move(so),
                                                         std::make_unique<InMemoryStore>(sup_));
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
  } catch (const StandbyExited&) {
    x.clean = true;
    x.state = WorkerState::kExited;
    x.left = true;
    x.how = "exit 0 (a standby told to exit)";
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
    // No rank runs. The job is over unless the scheduler holds it open (paused): then until
    // a rank is spawned (a resume) or it lets the job end. Both change only in the
    // supervisor's run_effects, which wakes wait_for; running_ is read under both locks (the
    // supervisor's first, as spawn() takes them).
    bool over = false;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(std::max(
        deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration{}));
    const bool changed = sup_.wait_for(
        [&](const control::Scheduler& s) {
          std::lock_guard<std::mutex> lock(mu_);
          over = running_ == 0 && !s.holds_job_open();
          return over || running_ > 0;
        },
        left);
    if (over) return true;
    if (!changed) return false;
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
