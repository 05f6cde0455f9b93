// gpurun::testing — the control seam's fake and a threads-as-ranks job:
//   InMemorySupervisor  the decision side: the real control::Scheduler (pure: reports, joins,
//                       exits in; effects out) over the one in-memory store fake,
//                       store::testing::MemoryStore, which holds every key and wakes every
//                       wait; spawn effects start a rank, kill effects are recorded only,
//                       deadline effects run on a gpurun::FakeClock the test advances
//                       (recorded only without one).
//   InMemoryStore       one rank's store::Store over it: the rank runs the real worker
//                       engine (control::WorkerSession); its SETs reach the scheduler as the
//                       real store's observer hook reaches ElasticController (no key grammar
//                       or protocol rule of its own).
//   ThreadJob           a job whose ranks are threads: each runs `train(Runtime&)` on a
//                       Runtime made by detail::make_runtime with these fakes and
//                       InProcessComms; a thread that returns is a process exiting 0, one
//                       that throws is a process that died.
// Test-only (target gpurun_worker_runtime_testing). Everything here is thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "control/scheduler.hpp"
#include "gpurun/clock.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/error.hpp"
#include "gpurun/runtime.hpp"
#include "gpurun/store/store.hpp"
#include "gpurun/worker/worker_session.hpp"
#include "testing/fake_communicator.hpp"
#include "testing/memory_store.hpp"

namespace gpurun::testing {

class InMemorySupervisor {
 public:
  struct Options {
    std::vector<int> slots{0, 1};
    control::Config config;  ///< the initial config.toml
    /// Longest WAIT of a rank on a key: past it wait_get throws StoreTimeout (a stuck test
    /// fails instead of hanging).
    std::chrono::milliseconds wait_timeout{std::chrono::seconds(20)};
    /// Runs the scheduler's boundary and set-up deadlines (kArmDeadline: on_deadline, then its
    /// effects) on the thread that advances it; must outlive the supervisor. nullptr: they
    /// are recorded in ignored_effects() only.
    gpurun::Clock* clock = nullptr;
  };
  /// Starts a rank on `gpu` that joins `generation`, as process `pid` (`warm` >= 0: a warm
  /// joiner with that id, generation -1). Called with the supervisor's lock held: it must not
  /// call back into the supervisor on this thread.
  using Spawner =
      std::function<void(int gpu, int64_t generation, int64_t warm, bool standby, int pid)>;

  InMemorySupervisor(Options options, Spawner spawner);

  /// Generation 0: spawns the initial set.
  void start();
  /// config.toml was edited: takes effect at the next boundary (at once while paused).
  void load_config(control::Config config);
  /// A scripted edit: applied just before the first report at boundary (epoch, step) is
  /// handled, so that boundary's decision follows it (epoch end: step 0).
  void load_config_at(int64_t epoch, int64_t step, control::Config config);
  /// A rank's process ended (clean: exit 0).
  void process_exited(int gpu, bool clean, const std::string& how);

  // --- the worker side (InMemoryStore) -----------------------------------------------------
  /// A worker's SET: stored in the MemoryStore, and handed to the scheduler as
  /// ElasticController::on_key does.
  void set(const std::string& key, const std::string& value);
  /// The value of `key`, nullopt when absent.
  std::optional<std::string> try_get(const std::string& key);
  /// Blocks until `key` exists, returns its value. Throws StoreTimeout after wait_timeout.
  std::string wait_get(const std::string& key);

  // --- observation (tests) ------------------------------------------------------------------
  /// Waits until pred(scheduler) holds (re-checked at every change). False on timeout.
  bool wait_for(const std::function<bool(const control::Scheduler&)>& pred,
                std::chrono::milliseconds timeout);
  /// Runs f(scheduler) under the lock.
  void inspect(const std::function<void(const control::Scheduler&)>& f) const;
  /// Every decision written (start records, boundary decisions, wakes), in order.
  std::vector<control::Decision> decisions() const;
  /// Effects the fake does not carry out (kKill; kArmDeadline without Options::clock), as
  /// "kill <gpu>", "deadline <generation>/<round>". A kill of
  /// a slot whose warm joiner waits for its admission answers it with `exit` (a thread cannot
  /// be killed: it ends as promptly).
  std::vector<std::string> ignored_effects() const;

 private:
  void run_effects();  // with mu_ held
  void ready_locked(int gpu, int64_t warm);
  void apply_scripted(int64_t epoch, int64_t step);

  Options opt_;
  Spawner spawner_;
  mutable std::mutex mu_;              // the scheduler and the lists below; taken before store_'s
  std::condition_variable cv_;         // the scheduler changed (wait_for)
  store::testing::MemoryStore store_;  // every key: the workers' writes and the effects' keys
  control::Scheduler scheduler_;
  std::vector<std::pair<std::pair<int64_t, int64_t>, control::Config>> script_;
  std::vector<control::Decision> decisions_;
  std::vector<std::string> ignored_;
  std::map<std::pair<int64_t, int64_t>, gpurun::Clock::Timer> deadlines_;  // on opt_.clock
  int next_pid_ = 1000000;  // fake pids: never a real process
};

/// One rank's store::Store: its SETs go to the supervisor (set: stored, then routed), its reads
/// to the supervisor's MemoryStore (try_get, wait_get);
/// the supervisor's wait_timeout, not the caller's timeout, bounds every get/wait (StoreTimeout: a
/// stuck test fails instead of hanging). The worker protocol needs nothing more: compare_set, add
/// and remove throw StoreError.
class InMemoryStore final : public store::Store {
 public:
  explicit InMemoryStore(InMemorySupervisor& sup) : sup_(sup) {}
  void set(const std::string& key, const std::string& value) override { sup_.set(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds) override {
    return sup_.wait_get(key);
  }
  std::optional<std::string> try_get(const std::string& key) override { return sup_.try_get(key); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    for (const auto& k : keys) sup_.wait_get(k);
  }
  std::string compare_set(const std::string& key, const std::string&, const std::string&) override {
    throw not_worker_protocol("compare_set", key);
  }
  int64_t add(const std::string& key, int64_t) override { throw not_worker_protocol("add", key); }
  bool remove(const std::string& key) override { throw not_worker_protocol("remove", key); }

 private:
  static StoreError not_worker_protocol(const char* op, const std::string& key) {
    return StoreError("in-memory supervisor store: " + std::string(op) + " on '" + key +
                      "' is not part of the worker protocol");
  }
  InMemorySupervisor& sup_;
};

class ThreadJob {
 public:
  struct Options {
    std::vector<int> slots{0, 1};
    control::Config config;
    std::string snapshot_path;  ///< the pause snapshot (one file per job)
    RuntimeOptions runtime;     ///< comm_timeout also bounds every fake collective
    std::chrono::milliseconds wait_timeout{std::chrono::seconds(20)};
    /// InMemorySupervisor::Options::clock: the deadlines' clock (nullptr: recorded only).
    gpurun::Clock* clock = nullptr;
    /// RuntimeSeams::warm_up of every rank's process (empty: the real one, CUDA only).
    std::function<void(const at::Device&)> warm_up;
    /// RuntimeSeams::warm_up_waited of every rank's process (empty: none).
    std::function<void()> warm_up_waited;
    /// The slot whose processes set the generation's RANK, WORLD_SIZE, … in the (one, shared)
    /// process environment as a real worker does (RuntimeSeams::export_env); -1: none. Only
    /// one slot may: the ranks are threads of one process.
    int export_env_slot = -1;
  };
  using Train = std::function<void(Runtime& rt)>;

  /// What became of one rank's process.
  struct Exit {
    int gpu = -1;
    int pid = -1;
    int64_t join_generation = -1;              ///< -1: a warm joiner
    bool clean = false;                        ///< returned from train (exit 0)
    std::string how;                           ///< "exit 0", or the exception's text
    WorkerState state = WorkerState::kActive;  ///< Runtime::state() at the end
    bool left = false;                         ///< Runtime::left() at the end
  };
  struct StateChange {
    int pid;
    WorkerState from, to;
    std::string why;
  };

  ThreadJob(Options options, Train train);
  ~ThreadJob();  // joins every rank's thread
  ThreadJob(const ThreadJob&) = delete;
  ThreadJob& operator=(const ThreadJob&) = delete;

  void start() { sup_.start(); }
  InMemorySupervisor& supervisor() { return sup_; }
  InProcessComms& comms() { return comms_; }
  /// Waits until every rank's thread has ended and the job is not held open (paused).
  bool wait(std::chrono::milliseconds timeout);
  std::vector<Exit> exits() const;
  /// State changes of the processes of `gpu`, in order.
  std::vector<StateChange> state_changes(int gpu) const;

 private:
  void spawn(int gpu, int64_t generation, int64_t warm, bool standby,
             int pid);  // supervisor lock held
  void run_rank(int gpu, int64_t generation, int64_t warm, bool standby, int pid);

  Options opt_;
  Train train_;
  InProcessComms comms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  int running_ = 0;
  std::vector<Exit> exits_;
  std::map<int, std::vector<StateChange>> changes_;
  InMemorySupervisor sup_;  // last: its spawner uses the members above
};

}  // namespace gpurun::testing
